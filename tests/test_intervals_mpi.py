"""output.stats_interval in-process under mpiexec -n 2 and -n 3, with checkpoints ending blocks
of steps inside the epochs: the intervals go on through the checkpoints, their rows still add
up to every epoch's samples and bytes, and the run leaves no message unmatched (it ends)."""

from __future__ import annotations

import json

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_intervals_go_on_through_checkpoints_and_add_up(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=16 * size, train__computation_time=0.02,
        train__epochs=2, workflow__checkpoint="true",
        checkpoint__checkpoint_folder=str(shared_tmp / "ck"),
        checkpoint__steps_between_checkpoints=3, model__model_size_bytes=1 << 20,
        output__stats_interval=0.05, output__progress_interval=0))
    run(comm, cfg)
    if comm.Get_rank() != 0:
        return
    out = shared_tmp / "out"
    rows = json.loads((out / "interval_stats.json").read_text())
    stats = json.loads((out / "per_epoch_stats.json").read_text())
    for epoch in ("1", "2"):
        mine = [r for r in rows if r["epoch"] == int(epoch)]
        assert {r["phase"] for r in mine} == {"train"}
        assert sum(r["samples"] for r in mine) == stats[epoch]["steps"] * 2 * size
        assert sum(r["bytes"] for r in mine) == stats[epoch]["bytes_transferred"]
        assert len(mine) >= 2 and max(r["ranks"] for r in mine) == size
    logged = [line for line in (out / "dlio.log").read_text().splitlines()
              if line.startswith("interval: ")]
    assert len(logged) == len(rows)
