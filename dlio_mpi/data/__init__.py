"""The dataset on disk: its files' names and layouts (dataset, catalog), what made them
(manifest, recorded sizes), and making them: generation, collective generation, pack."""
