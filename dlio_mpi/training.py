"""One epoch of steps, as data-parallel training runs it: wait for the batch, compute (a precise
wait to an absolute deadline), then synchronise with the other ranks as the gradient allreduce
would. The loop itself runs in C (csrc/dio_steps.c); each step records six clock stamps, and
everything reported about time (AU, the wait/compute/sync split, storage stalls, the emulator's
own overhead) is derived from them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import _core, progress
from .metrics.intervals import IntervalStats
from .mpi.pacing import Pacing, StepSync
from .readers import ReaderBackend
from .readers.base import BYTES, COMPUTED, DEADLINE, GOT, OPS, READY, START, SYNCED, RequestTrace
from .sampling.requests import ReadPlan
from .tiers.cache import epoch_cache

# Columns of EpochTrace.stamps (monotonic ns): the first six of the step records
# (readers.base), re-exported for the metrics.
__all__ = ["COMPUTED", "DEADLINE", "GOT", "READY", "START", "SYNCED", "EpochTrace", "run_epoch"]


@dataclass
class EpochTrace:
    """What one rank measured in one epoch.

    Per step (a row of `stamps`): START when it began waiting for its batch (the previous
    step's end), READY when the engine had the batch complete, GOT when the loop held it (its
    host work, reader.step_cpu_time and step_wait_time, then the compute, start), DEADLINE
    when the planned compute ends (it started at DEADLINE - planned), COMPUTED when the
    compute wait returned (the arrival at the synchronisation), SYNCED when the
    synchronisation returned."""

    epoch: int
    block_start_ns: int
    block_end_ns: int
    stamps: np.ndarray         # (steps, 6) int64
    planned_compute_ns: np.ndarray
    step_bytes: np.ndarray     # bytes storage returned for each step's batch
    step_read_ops: np.ndarray  # read calls for each step's batch
    payload_bytes: int         # sample bytes the batches delivered (headers etc. excluded)
    opens: int                 # file opens, closes and fstats of the epoch
    closes: int
    stats: int
    requests: int
    lat_ns: np.ndarray         # per request
    sample_ids: np.ndarray     # what this rank consumed, in order
    synchronised: bool         # a per-step barrier ran (training) or not (evaluation)
    # checkpoints that ended a block inside the epoch: (after step, start ns, end ns)
    pauses: list[tuple[int, int, int]] = field(default_factory=list)
    # per request, with output.trace and a backend that records it (readers.base)
    request_trace: RequestTrace | None = None
    # reader.cache: this rank's cache figures of the epoch (cache_tier.epoch_cache)
    cache: dict | None = None
    # the loader's modelled costs the reader spent (the native engine's): the CPU time of
    # reader.preprocess_cpu_time, the wall time it took, reader.startup_time's wait
    preprocess_cpu_ns: int = 0
    preprocess_wall_ns: int = 0
    loader_startup_ns: int = 0

    @property
    def steps(self) -> int:
        return len(self.stamps)

    @property
    def pause_ns(self) -> int:
        """Time in checkpoints between the epoch's blocks of steps."""
        return sum(end - start for _, start, end in self.pauses)

    @property
    def block_seconds(self) -> float:
        """The epoch's blocks of steps together: from the first step's start to the last
        step's end, less the checkpoints between blocks (DLIO times each block apart)."""
        return (self.block_end_ns - self.block_start_ns - self.pause_ns) / 1e9

    def column(self, name: int) -> np.ndarray:
        return self.stamps[:, name]

    @property
    def wait_ns(self) -> np.ndarray:
        return self.column(GOT) - self.column(START)

    @property
    def host_ns(self) -> np.ndarray:
        """The training process's work taking each batch (reader.step_*_time): from the
        batch in hand to the compute's start."""
        return self.column(DEADLINE) - self.planned_compute_ns - self.column(GOT)

    @property
    def compute_ns(self) -> np.ndarray:
        return self.column(COMPUTED) - (self.column(DEADLINE) - self.planned_compute_ns)

    @property
    def sync_ns(self) -> np.ndarray:
        return self.column(SYNCED) - self.column(COMPUTED)

    @property
    def stall_ns(self) -> np.ndarray:
        """Time the step waited for storage: from its start until its batch was complete."""
        return np.maximum(self.column(READY) - self.column(START), 0)

    @property
    def loop_ns(self) -> np.ndarray:
        """The emulator's own time between the batch being there and the compute starting."""
        return self.column(GOT) - np.maximum(self.column(READY), self.column(START))

    @property
    def overshoot_ns(self) -> np.ndarray:
        """How late the compute wait returned past its deadline."""
        return np.maximum(self.column(COMPUTED) - self.column(DEADLINE), 0)


def run_epoch(comm, reader: ReaderBackend, plan: ReadPlan, compute_s: np.ndarray, epoch: int,
              pacing: Pacing, barrier: bool = True, pause_after: Sequence[int] = (),
              pause: Callable[[int], None] | None = None, name: str = "train",
              intervals: IntervalStats | None = None,
              host_s: dict[str, np.ndarray] | None = None) -> EpochTrace:
    """Run plan.steps steps; compute_s[i] is step i's emulated compute time in seconds;
    host_s: each step's host work before it, in seconds, by kind ("cpu":
    reader.step_cpu_time, "wait": reader.step_wait_time; None: none).
    After each step number s (counted from 1) in `pause_after` that is not the last, the
    block of steps ends and `pause(s)` runs (a checkpoint: collective); the next block starts
    when it returns, its first step's wait starting then. The reader keeps prefetching
    meanwhile, as a loader's workers do. `name`: the phase, for rank 0's progress;
    `intervals`: output.stats_interval's, following the records from a thread."""
    planned = _ns(compute_s)
    host = {f"host_{kind}_ns": _ns(s) for kind, s in (host_s or {}).items()}
    barrier_ = StepSync(comm, pacing.sync_spin_ns) if barrier else None
    ends = sorted({s for s in pause_after if 0 < s < plan.steps}) + [plan.steps]
    pauses: list[tuple[int, int, int]] = []
    # the step records, filled row by row by the step loop: rank 0's progress counts the
    # steps whose SYNCED stamp is there (a poll from another thread, nothing per step)
    records = np.zeros((plan.steps, 8), dtype=np.int64)
    shown = progress.task(f"{name} epoch {epoch}", plan.steps, "steps")
    reader.prepare_epoch(plan)
    before = reader.counters()
    per_step = len(plan.sample_ids) // max(plan.steps, 1)
    followed = None
    try:
        comm.Barrier()  # all ranks open the block together ...
        block_start = start = _core.now_ns()
        reader.start_epoch(plan)  # ... and read nothing ahead outside it (in step 0's wait)
        if intervals is not None:
            followed = intervals.epoch(name, epoch, records, reader.lat_ns, plan, per_step,
                                       block_start, planned)
        shown.watch(lambda: int(np.count_nonzero(records[:, SYNCED])),
                    lambda: int(records[:, BYTES].sum()))
        done = 0
        for end in ends:
            done += len(reader.run_steps(  # host work only where it acts (older backends)
                pacing.pacer, barrier_, planned[done:end], start, records[done:end],
                **{name: ns[done:end] for name, ns in host.items()}))
            if done < end or end == plan.steps:  # the ranks agreed to stop, or the last block
                break
            paused = _core.now_ns()
            pause(end)
            start = _core.now_ns()
            pauses.append((end, paused, start))
        block_end = _core.now_ns()
        table = records[:done]
    except BaseException:
        if followed is not None:
            followed.abandon()
        raise
    finally:
        shown.close()
        if barrier_ is not None:
            barrier_.close()
    if followed is not None:  # after the bar: rank 0 shows the last interval of every rank
        followed.finish(block_end)
    if done < plan.steps:  # the ranks agreed to stop: the rest of the epoch is abandoned
        reader.abandon_epoch()
    elif reader.next_batch() is not None:
        raise RuntimeError("engine returned more batches than planned")
    else:
        reader.end_epoch()
    after = reader.counters()
    requests = int(plan.batch_start[done])
    return EpochTrace(
        epoch=epoch, block_start_ns=block_start, block_end_ns=block_end,
        stamps=np.ascontiguousarray(table[:, :BYTES]), planned_compute_ns=planned[:done],
        step_bytes=table[:, BYTES].copy(), step_read_ops=table[:, OPS].copy(),
        payload_bytes=int(plan.batch_payload[:done].sum()),
        opens=after["opens"] - before["opens"], closes=after["closes"] - before["closes"],
        stats=after["stats"] - before["stats"], requests=requests,
        lat_ns=reader.lat_ns[:requests].copy(), sample_ids=plan.sample_ids[:done * per_step],
        synchronised=barrier, pauses=pauses,
        request_trace=reader.request_trace.head(requests) if reader.request_trace else None,
        cache=epoch_cache(before, after, plan, requests)
        if getattr(reader, "cache_attached", False) else None, **_loader_costs(before, after))


def _ns(seconds) -> np.ndarray:
    """Seconds (an array) as int64 nanoseconds."""
    return np.round(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)


def _loader_costs(before: dict, after: dict) -> dict:
    """The loader's modelled costs the reader spent between two counters() (EpochTrace's
    fields; 0 for backends that spend none)."""
    return {name: after.get(name, 0) - before.get(name, 0)
            for name in ("preprocess_cpu_ns", "preprocess_wall_ns", "loader_startup_ns")}
