"""The step loop of one epoch, as data-parallel training runs it: wait for the batch, sleep the
emulated compute time to an absolute deadline, then a barrier standing in for the gradient
allreduce. Every phase is timed separately (wait, compute, sync)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import _core
from .planner import ReadPlan
from .reader import NativeReader

SPIN_NS = 50_000     # poll the barrier flat out this long ...
NAP_SECONDS = 50e-6  # ... then nap between polls


def step_barrier(comm) -> None:
    """The per-step barrier. MPICH spins inside a blocking MPI_Barrier, which would take a core
    from this rank's reader threads while it waits for a slow peer; so poll a non-blocking
    barrier flat out for 50 us (peers usually arrive together: ~2 us) and nap between polls
    after that (a late peer's arrival is then seen within ~0.1 ms)."""
    request = comm.Ibarrier()
    deadline = _core.now_ns() + SPIN_NS
    while not request.Test():
        if _core.now_ns() > deadline:
            time.sleep(NAP_SECONDS)


@dataclass
class EpochTrace:
    """What one rank measured in one epoch (times in ns from the monotonic clock)."""

    epoch: int
    block_start_ns: int
    block_end_ns: int
    wait_ns: np.ndarray      # per step: waiting for the batch
    compute_ns: np.ndarray   # per step: emulated compute, as slept
    sync_ns: np.ndarray      # per step: in the barrier
    planned_compute_ns: np.ndarray
    bytes_requested: int
    bytes_read: int
    read_ops: int
    requests: int
    lat_ns: np.ndarray       # per request
    sample_ids: np.ndarray   # what this rank consumed, in order

    @property
    def steps(self) -> int:
        return len(self.wait_ns)

    @property
    def block_seconds(self) -> float:
        return (self.block_end_ns - self.block_start_ns) / 1e9


def run_epoch(comm, reader: NativeReader, plan: ReadPlan, compute_s: np.ndarray, epoch: int,
              barrier: bool = True) -> EpochTrace:
    """Run plan.steps steps; compute_s[i] is step i's emulated compute time in seconds."""
    steps = plan.steps
    planned = np.round(np.asarray(compute_s, dtype=np.float64) * 1e9).astype(np.int64)
    stamps = np.zeros((steps, 4), dtype=np.int64)  # before wait, got batch, computed, synced
    bytes_read = read_ops = 0
    now, sleep_until, next_batch = _core.now_ns, _core.sleep_until_ns, reader.next_batch
    comm.Barrier()  # all ranks open the block together ...
    t0 = block_start = now()
    reader.start_epoch(plan)  # ... and read nothing ahead outside it (counted in step 0's wait)
    for step in range(steps):
        batch = next_batch()
        t1 = now()
        t2 = sleep_until(t1 + int(planned[step])) if planned[step] > 0 else t1
        if barrier:
            step_barrier(comm)
        t3 = now()
        stamps[step] = (t0, t1, t2, t3)
        t0 = t3  # the next wait starts where this step ended
        bytes_read += batch.bytes_read
        read_ops += batch.read_ops
    block_end = now()
    if next_batch() is not None:
        raise RuntimeError("engine returned more batches than planned")
    return EpochTrace(
        epoch=epoch, block_start_ns=block_start, block_end_ns=block_end,
        wait_ns=stamps[:, 1] - stamps[:, 0], compute_ns=stamps[:, 2] - stamps[:, 1],
        sync_ns=stamps[:, 3] - stamps[:, 2], planned_compute_ns=planned,
        bytes_requested=plan.bytes_requested, bytes_read=bytes_read, read_ops=read_ops,
        requests=len(plan.offset), lat_ns=reader.lat_ns.copy(), sample_ids=plan.sample_ids)
