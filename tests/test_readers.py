"""The reader-backend seam: a second backend plugged into the registry runs the same epochs
through the Python step loop (readers.python_steps), and the step loop, metrics and summary
work unchanged: the same samples per rank, the same bytes, AU from real compute time. Runs
in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.readers import BatchStats, ReaderBackend
from helpers import run_in_process, workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


class PreadReader(ReaderBackend):
    """A minimal real backend: each batch read with os.pread on the calling thread when the
    step asks for it (no prefetch), descriptors kept open. What it does not override is the
    protocol's default (readers/base.py): no work before an epoch, the Python step loop."""

    def __init__(self, files, options, comm=None) -> None:
        self.files = files
        self.fds: dict[int, int] = {}
        self.lat_ns = np.zeros(0, dtype=np.int64)
        self.request_trace = None  # no per-request trace (output.trace: step spans only)
        self.totals = {"opens": 0, "closes": 0, "stats": 0, "bytes_read": 0, "read_ops": 0}

    def start_epoch(self, plan) -> None:
        self.plan, self.batch = plan, 0
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)

    def next_batch(self) -> BatchStats | None:
        plan, b = self.plan, self.batch
        if b >= plan.steps:
            return None
        self.batch += 1
        got = 0
        for r in range(int(plan.batch_start[b]), int(plan.batch_start[b + 1])):
            start = _core.now_ns()
            data = os.pread(self._fd(int(plan.file_idx[r])), int(plan.length[r]),
                            int(plan.offset[r]))
            self.lat_ns[r] = _core.now_ns() - start
            got += len(data)
        ops = int(plan.batch_start[b + 1] - plan.batch_start[b])
        self.totals["bytes_read"] += got
        self.totals["read_ops"] += ops
        return BatchStats(_core.now_ns(), got, ops)

    def _fd(self, index: int) -> int:
        if index not in self.fds:
            self.fds[index] = os.open(self.files.path(index), os.O_RDONLY)
            self.totals["opens"] += 1
        return self.fds[index]

    def counters(self) -> dict[str, int]:
        return dict(self.totals)

    def describe(self) -> dict:
        return {"backend": "test-pread"}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _run(tmp, **values):
    from dlio_mpi.config import load_config

    return run_in_process(load_config("demo", workload_overrides(tmp, **values)))


def test_a_second_backend_runs_the_same_epochs_through_the_same_loop(shared_tmp, monkeypatch):
    from mpi4py import MPI

    import dlio_mpi.readers

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common = dict(dataset__format="npy", dataset__num_files_train=6 * size,
                  dataset__num_samples_per_file=2, reader__read_mode="sample",
                  reader__access="lean", reader__batch_size=2, reader__sample_shuffle="seed",
                  train__epochs=2, train__computation_time=0.01, output__access_log="true")
    _, native = _run(shared_tmp, output__folder=shared_tmp / "native",
                     workflow__generate_data="true", **common)
    monkeypatch.setitem(dlio_mpi.readers.REGISTRY, "multi",
                        dlio_mpi.readers.ReaderSpec("test_readers", "PreadReader"))
    _, ours = _run(shared_tmp, output__folder=shared_tmp / "pread",
                   workflow__generate_data="false", **common)
    for epoch in (1, 2):  # the same samples on every rank: sharding knows no backend
        name = f"access_log/epoch{epoch}_rank{rank}.npy"
        assert np.array_equal(np.load(shared_tmp / "native" / name),
                              np.load(shared_tmp / "pread" / name))
    m, n = ours["metric"], native["metric"]
    assert m["train_bytes_read"] == n["train_bytes_read"] > 0
    assert m["train_bytes_transferred"] == n["train_bytes_transferred"]
    assert m["train_read_ops"] == m["train_requests"] == n["train_requests"]
    steps = json.loads((shared_tmp / "pread" / "per_epoch_stats.json").read_text())["1"]["steps"]
    assert steps == 6 * size * 2 // size // 2
    # real compute time: the compute split is the planned time, and AU is planned compute
    # over the span (this backend reads each batch only when asked: no prefetch, so its
    # reads are in every step's wait; 10 ms steps of 2 small cached samples)
    assert 50 < min(m["train_au_percentage"]) <= 100
    compute = m["train_compute_seconds_per_rank"]["median"]
    assert 2 * steps * 0.01 <= compute < 2 * steps * 0.01 * 1.2
