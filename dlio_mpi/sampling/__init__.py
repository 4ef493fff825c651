"""Who reads what, when: each epoch's shuffled samples dealt to the ranks (sharding) and
turned into the read requests the readers make (requests)."""
