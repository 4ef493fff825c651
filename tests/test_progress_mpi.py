"""Rank 0 alone shows progress (in-process under mpiexec -n 2 and -n 3): every rank runs the
same generation, epochs and checkpoints with progress configured, and only rank 0's stream
receives lines, each its own steps."""

from __future__ import annotations

import io

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_only_rank_0_shows_progress(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi import progress
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    files = 12 * size  # 6 steps of batch 2 per rank
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=files, train__computation_time=0.05,
        train__epochs=1, workflow__checkpoint="true",
        checkpoint__checkpoint_folder=str(shared_tmp / "ck"),
        checkpoint__epochs_between_checkpoints=1, model__model_size_bytes=1 << 20))
    stream = io.StringIO()
    progress.configure(comm.Get_rank(), 0.1, stream)
    try:
        run(comm, cfg)
    finally:
        progress.configure(comm.Get_rank(), 0.0)
    texts = comm.gather(stream.getvalue(), root=0)
    if comm.Get_rank() == 0:
        assert all(text == "" for text in texts[1:]), texts
        lines = texts[0].splitlines()
        assert lines and all(line.startswith("progress: ") for line in lines), lines
        steps = [line for line in lines if line.startswith("progress: train epoch 1: ")]
        assert steps and all("/6 steps (" in line for line in steps), lines
