"""Shared test fixtures. Under mpiexec every rank gets its own pytest base temp folder (so the
ranks do not race on pytest's numbered folders), inside one folder per job; MPI tests share
rank 0's folder."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

RANK = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")


def pytest_configure(config):
    if RANK is not None and not config.option.basetemp:
        # One folder per mpiexec job (the ranks of a node share their launcher, the parent
        # process): pytest empties its base temp at start, so two suites running at once
        # must not share one. Folders of jobs whose launcher is gone are removed.
        root = Path(f"/tmp/dlio-mpi-tests-{os.getuid()}")
        root.mkdir(exist_ok=True)
        launcher = os.getppid()
        for old in root.glob("job*"):
            pid = old.name[3:]
            if pid.isdigit() and int(pid) != launcher and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(old, ignore_errors=True)
        job = root / f"job{launcher}"
        job.mkdir(exist_ok=True)
        config.option.basetemp = str(job / f"rank{RANK}")


@pytest.fixture
def small_fs(tmp_path):
    """A 24 MiB tmpfs mounted for the test (needs root: skipped elsewhere)."""
    from helpers import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "small", "size=24m") as mount:
        yield mount


@pytest.fixture
def shared_tmp(tmp_path) -> Path:
    """A folder all ranks of COMM_WORLD see (rank 0's tmp_path)."""
    from mpi4py import MPI

    return Path(MPI.COMM_WORLD.bcast(str(tmp_path), root=0))


def mpiexec() -> str:
    """The mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"
