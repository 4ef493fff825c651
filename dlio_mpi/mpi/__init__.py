"""What dlio-mpi asks of MPI beyond mpi4py: the node topology, which MPI library ran and its
hints, collective MPI-IO write rounds, and the step loop's pacing and barrier."""
