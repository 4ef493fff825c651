"""dlio-mpi: replays the I/O of deep-learning training jobs on HPC storage, one MPI rank per
emulated accelerator, and reports accelerator utilisation, throughput and the I/O pattern."""

__version__ = "0.1.0"
