"""One epoch of steps, as data-parallel training runs it: wait for the batch, compute (a precise
wait to an absolute deadline), then synchronise with the other ranks.

The synchronisation stands for the gradient allreduce. The loop itself runs in C
(csrc/dio_steps.c); each step records six clock stamps, and everything reported about time (AU,
the wait/compute/sync split, storage stalls, the emulator's own overhead) is derived from them."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np

from . import _core, progress
from .metrics.epoch_trace import BYTES, OPS, SYNCED, EpochTrace
from .metrics.intervals import EpochIntervals, IntervalStats
from .mpi.pacing import Pacing, StepSync
from .readers import ReaderBackend
from .sampling.requests import ReadPlan
from .tiers.cache import epoch_cache


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
        # the following threads start before the clock: a thread's start can wait for a core
        if intervals is not None:
            followed = intervals.epoch(name, epoch, records, plan, per_step, planned)
        shown.watch(lambda: int(np.count_nonzero(records[:, SYNCED])),
                    lambda: int(records[:, BYTES].sum()))
        comm.Barrier()  # all ranks open the block together ...
        block_start = start = _core.now_ns()
        reader.start_epoch(plan)  # ... and read nothing ahead outside it (in step 0's wait)
        if followed is not None:
            followed.begin(block_start, reader.lat_ns)
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
    except BaseException as exc:
        _end_failed(comm, barrier_, followed, exc)
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
        payload_bytes=int(plan.batch_payload[:done].sum()) if reader.delivers_samples else 0,
        opens=after["opens"] - before["opens"], closes=after["closes"] - before["closes"],
        stats=after["stats"] - before["stats"], requests=requests,
        lat_ns=reader.lat_ns[:requests].copy(), sample_ids=plan.sample_ids[:done * per_step],
        synchronised=barrier, pauses=pauses,
        request_trace=reader.request_trace.head(requests) if reader.request_trace else None,
        cache=epoch_cache(before, after, plan, requests)
        if reader.cache_attached else None, **_loader_costs(before, after))


def _end_failed(comm, sync: StepSync | None, followed: EpochIntervals | None,
                exc: BaseException) -> NoReturn:
    """The epoch failed on this rank with `exc`. Where the step's allreduce told every rank
    (the C step loop joins it with its failed batch: StepSync.failed), all of them are here
    and raise one JobError with the failing ranks' messages, which ends the job with exit
    status 2 and MPI_Finalize; else `exc` goes on as it is (one rank's own failure aborts
    the job)."""
    if sync is None or not sync.failed:
        if followed is not None:
            followed.abandon()
        raise exc
    from .errors import agreed_failure

    if followed is not None:  # every rank ends its interval thread: none is left in MPI
        followed.finish(_core.now_ns())
    mine = None if isinstance(exc, OSError) and exc.errno == errno.ECONNABORTED else exc
    raise agreed_failure(comm, mine) from exc


def _ns(seconds) -> np.ndarray:
    """Seconds (an array) as int64 nanoseconds."""
    return np.round(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)


def _loader_costs(before: dict, after: dict) -> dict:
    """The loader's modelled costs the reader spent between two counters() (EpochTrace's
    fields; 0 for backends that spend none)."""
    return {name: after.get(name, 0) - before.get(name, 0)
            for name in ("preprocess_cpu_ns", "preprocess_wall_ns", "loader_startup_ns")}
