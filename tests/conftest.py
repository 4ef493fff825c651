"""Shared test fixtures. Under mpiexec every rank gets its own pytest base temp folder (so the
ranks do not race on pytest's numbered folders); MPI tests share rank 0's folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RANK = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")


def pytest_configure(config):
    if RANK is not None and not config.option.basetemp:
        parent = Path(f"/tmp/dlio-mpi-tests-{os.getuid()}")
        parent.mkdir(exist_ok=True)
        config.option.basetemp = str(parent / f"rank{RANK}")


@pytest.fixture
def shared_tmp(tmp_path) -> Path:
    """A folder all ranks of COMM_WORLD see (rank 0's tmp_path)."""
    from mpi4py import MPI

    return Path(MPI.COMM_WORLD.bcast(str(tmp_path), root=0))


def mpiexec() -> str:
    """The mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"
