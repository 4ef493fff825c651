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


def test_no_thread_starts_inside_an_epochs_clock(shared_tmp, monkeypatch):
    """The progress and interval threads of an epoch start before its clock: starting a
    thread can wait milliseconds for a core (on 2 cores with a reader busy: 0.3-3 ms), which
    step 1's wait would count as the emulator's own time."""
    import threading
    import time

    from mpi4py import MPI

    from dlio_mpi import progress
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    started: list[tuple[str, float]] = []
    start = threading.Thread.start

    def recorded(thread):
        started.append((thread.name, time.time()))
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recorded)
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(progress, "_reporter", progress._reporter)  # restored after
    progress.configure(comm.Get_rank(), 0.05)  # as cli.main does: rank 0 shows progress
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=8 * comm.Get_size(), train__computation_time=0.005,
        train__epochs=3, output__stats_interval=0.05, output__progress_interval=0.05))
    run(comm, cfg)
    stats = json.loads((shared_tmp / "out" / "per_epoch_stats.json").read_text())
    mine = [next(r for r in stats[e]["per_rank"] if r["rank"] == comm.Get_rank())
            for e in ("1", "2", "3")]
    names = {name for name, _ in started}
    assert "dlio-mpi-intervals" in names, names
    assert comm.Get_rank() != 0 or "dlio-mpi-progress" in names, names
    inside = [(name, at, e["start"]) for name, at in started for e in mine
              if e["start"] <= at <= e["end"]]
    assert not inside, inside
