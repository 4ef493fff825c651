"""The rank an MPI launcher gave this process, read from its environment before MPI starts
(the command line is parsed first, and `datasize` runs without MPI at all)."""

from __future__ import annotations

import os

RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                  "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as the MPI launcher set it in the environment (0 when unknown)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0
