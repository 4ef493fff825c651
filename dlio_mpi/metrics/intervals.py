"""output.stats_interval: the job's throughput, AU and read latency every N seconds (fio's
--status-interval), as one line of rank 0's log per interval and rows of interval_stats.json.

Intervals are common to all ranks: [origin + k*N, origin + (k+1)*N) on rank 0's clock, origin
the run's start (as output.trace's); an epoch's first and last intervals are clipped to the
epoch (and are N to 1.25 N long: see LATE). During each epoch a daemon thread on every rank
wakes once per interval, a quarter interval after its end, condenses what the step loop
recorded in it (the step records it fills in place, the reader's lat_ns) and sends it to rank
0 point to point over a communicator of its own (no collective per interval, nothing per
step). Rank 0's thread merges the ranks' intervals as they come and prints one line per
interval; at the epoch's end every rank sends its last, partial interval flagged final, and
rank 0 waits for all of them before the epoch's summary.

What an interval holds, per rank: the steps that completed in it (their SYNCED stamp inside),
their samples, bytes storage returned and read calls, the read latency of their requests
(exact sum, mergeable histogram), and the planned compute time spent inside it (each step's
[GOT, DEADLINE] clipped to the interval, so a step computing across a boundary counts in
both). The C step loop writes GOT when the compute starts; loops written in Python fill a row
at the step's end, so there a step computing across a boundary counts only its last part."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..sampling.requests import ReadPlan
from . import latency
from .epoch_trace import BYTES, DEADLINE, GOT, OPS, SYNCED

MIB = 2**20
TAG = 0x1D10
# the thread reads the rows of an interval a quarter of an interval after its end (at least
# GUARD_NS: the C loop writes a row's bytes and reads just after its SYNCED stamp); an epoch
# ending by then folds its rest into that interval, and an epoch starting less than a quarter
# before a boundary folds its start into the next: no sliver of an interval, whose rates would
# mean little, only intervals of N to 1.25 N at an epoch's edges
LATE = 0.25
GUARD_NS = 1_000_000
POLL_S = (0.002, 0.1)  # rank 0's naps while waiting for the ranks' intervals: first, longest


@dataclass
class Delta:
    """One rank's interval (small: sent to rank 0). Times on rank 0's clock."""

    rank: int
    interval: int
    start_ns: int
    end_ns: int
    steps: int = 0
    bytes: int = 0
    ops: int = 0
    compute_ns: int = 0
    lat_sum_ns: int = 0
    lat_count: int = 0
    bins: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, np.int32), np.zeros(0, np.int64)))
    final: bool = False


class EpochIntervals:
    """One epoch of one phase, followed from a daemon thread (rank 0's also gathers). The
    thread starts before the epoch's clock (starting a thread can wait for a core for
    milliseconds) and follows from `begin`."""

    def __init__(self, stats: IntervalStats, phase: str, epoch: int, records: np.ndarray,
                 plan: ReadPlan, batch: int, planned: np.ndarray | None = None) -> None:
        self.stats, self.phase, self.epoch = stats, phase, epoch
        self.records, self.batch, self.plan = records, batch, plan
        self.planned = planned  # each step's planned compute, ending at its DEADLINE
        self.offset = stats.clock_offset_ns
        self.lat_ns = self.lat_start = None
        self.start0: int | None = None  # the epoch's start on rank 0's clock, from begin()
        self._end0: int | None = None
        self._begun = threading.Event()
        self._stop = threading.Event()
        self._done = 0  # steps reported so far
        self._sends: list = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dlio-mpi-intervals",
                                        daemon=True)
        self._thread.start()

    def begin(self, start_ns: int, lat_ns: np.ndarray) -> None:
        """The epoch started at `start_ns` (this rank's clock); its reader fills `lat_ns`."""
        plan, steps = self.plan, self.plan.steps
        # where each step's requests start in lat_ns: per planned request, or (the framework
        # loaders) per sample
        if len(lat_ns) == int(plan.batch_start[-1]):
            self.lat_start = np.asarray(plan.batch_start, dtype=np.int64)
        else:
            self.lat_start = np.arange(steps + 1, dtype=np.int64) * (len(lat_ns) // max(steps, 1))
        self.lat_ns = lat_ns
        self.start0 = start_ns - self.offset
        self._begun.set()

    # ------------------------------------------------------------------ every rank
    def finish(self, end_ns: int) -> None:
        """The epoch's steps are over (at `end_ns`, this rank's clock): the last interval is
        sent, and on rank 0 every rank's is merged and shown."""
        self._end0 = end_ns - self.offset
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"interval statistics failed: {self._error}") from self._error

    def abandon(self) -> None:
        """The epoch failed: stop following it (the thread is a daemon; the job aborts)."""
        self._end0 = self._end0 or _core.now_ns() - self.offset
        self._stop.set()
        self._begun.set()

    def _run(self) -> None:
        self._begun.wait()
        if self.start0 is None:  # abandoned before it began
            return
        try:
            self._follow()
        except BaseException as exc:  # raised in finish(), on the main thread
            self._error = exc

    def _follow(self) -> None:
        stats = self.stats
        n = stats.interval_ns
        late = max(round(LATE * n), GUARD_NS)
        k = (self.start0 - stats.origin0_ns) // n
        if stats.origin0_ns + (k + 1) * n - self.start0 < LATE * n:
            k += 1
        lo = self.start0
        merge = _Merge(self, stats.size) if stats.rank == 0 else None
        while True:
            hi = stats.origin0_ns + (k + 1) * n
            stopped = self._wait(hi + self.offset + late, merge)
            if stopped:
                self._send(self._delta(k, lo, max(self._end0, lo), final=True), merge)
                break
            self._send(self._delta(k, lo, hi), merge)
            lo, k = hi, k + 1
        if merge is not None:
            merge.until_final()
        else:
            _wait_all(self._sends)

    def _wait(self, until_ns: int, merge: _Merge | None) -> bool:
        """Sleep until `until_ns` (this rank's clock) or the epoch's end (True); rank 0 takes
        in the ranks' intervals meanwhile."""
        while True:
            left = (until_ns - _core.now_ns()) / 1e9
            if left <= 0:
                return self._stop.is_set()
            if merge is not None and merge.pending():
                left = min(left, merge.nap())
            if self._stop.wait(left):
                return True
            if merge is not None:
                merge.take()

    def _send(self, delta: Delta, merge: _Merge | None) -> None:
        if merge is not None:
            merge.add(delta)
            merge.take()
            return
        self._sends = [r for r in self._sends if not r.Test()]
        self._sends.append(self.stats.comm.isend(delta, dest=0, tag=TAG))

    def _delta(self, k: int, lo0: int, hi0: int, final: bool = False) -> Delta:
        """This rank's interval k, [lo0, hi0) on rank 0's clock (to the end when final)."""
        rec = self.records
        lo, hi = lo0 + self.offset, hi0 + self.offset
        first = self._done
        filled = _filled(rec[:, SYNCED], first)
        done = filled if final else \
            first + int(np.searchsorted(rec[first:filled, SYNCED], hi, side="left"))
        # compute: the steps that may have computed inside, the one in progress included
        end = min(done + 1, len(rec))
        rows = rec[first:end]
        got, deadline = rows[:, GOT], rows[:, DEADLINE]
        # the compute starts after the step's host work (reader.step_*_time), if any
        began = got if self.planned is None else deadline - self.planned[first:end]
        known = (got > 0) & (deadline >= began)
        spans = np.clip(np.minimum(deadline, hi) - np.maximum(began, lo), 0, None)
        a, b = int(self.lat_start[first]), int(self.lat_start[done])
        lat = self.lat_ns[a:b]
        hist = latency.histogram(lat) if len(lat) else np.zeros(0, np.int64)
        nz = np.flatnonzero(hist)
        self._done = done
        return Delta(self.stats.rank, k, lo0, hi0, steps=done - first,
                     bytes=int(rec[first:done, BYTES].sum()),
                     ops=int(rec[first:done, OPS].sum()),
                     compute_ns=int(spans[known].sum()), lat_sum_ns=int(lat.sum()),
                     lat_count=len(lat), bins=(nz.astype(np.int32), hist[nz]), final=final)


def _filled(synced: np.ndarray, first: int) -> int:
    """The first row from `first` whose SYNCED stamp is not written yet (the loop fills the
    rows in order, their stamps growing): a bisection, not a scan of the epoch's rows."""
    lo, hi = first, len(synced)
    while lo < hi:
        mid = (lo + hi) // 2
        if synced[mid] != 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _Merge:
    """Rank 0: the ranks' intervals of one epoch, merged into rows as they complete."""

    def __init__(self, watch: EpochIntervals, size: int) -> None:
        self.watch, self.size = watch, size
        self.parts: dict[int, list[Delta]] = {}
        self.last = [-(2**62)] * size  # each rank's latest interval received
        self.final = [False] * size
        self._nap = POLL_S[0]

    def pending(self) -> bool:
        return bool(self.parts)

    def nap(self) -> float:
        nap, self._nap = self._nap, min(2 * self._nap, POLL_S[1])
        return nap

    def add(self, delta: Delta) -> None:
        self.parts.setdefault(delta.interval, []).append(delta)
        self.last[delta.rank] = delta.interval
        self.final[delta.rank] = delta.final
        self._nap = POLL_S[0]

    def take(self) -> None:
        """Receive what has arrived, then show the intervals complete."""
        comm = self.watch.stats.comm
        while comm.iprobe(source=_any_source(), tag=TAG):
            self.add(comm.recv(source=_any_source(), tag=TAG))
        for k in sorted(self.parts):
            if not all(f or last >= k for f, last in zip(self.final, self.last)):
                break
            self.watch.stats.row(self.watch, self.parts.pop(k))

    def until_final(self) -> None:
        """After rank 0's last interval: take the others' until every rank's last is in.
        (No rank sends the next epoch's before rank 0 is done with this one: the next epoch
        starts with a barrier.)"""
        self.take()
        while not all(self.final):
            time.sleep(self.nap())
            self.take()


def _wait_all(requests: list) -> None:
    """Wait for sends to complete without spinning a core (a blocking MPI wait may)."""
    nap = POLL_S[0]
    while requests:
        requests[:] = [r for r in requests if not r.Test()]
        if requests:
            time.sleep(nap)
            nap = min(2 * nap, POLL_S[1])


def _any_source() -> int:
    from mpi4py import MPI

    return MPI.ANY_SOURCE


class IntervalStats:
    """The run's interval statistics (output.stats_interval > 0), on every rank."""

    def __init__(self, comm, seconds: float, origin0_ns: int, clock_offset_ns: int,
                 show: Callable[[str], None] | None = None) -> None:
        """`comm`: this object's own communicator; `origin0_ns`: interval 0's start on rank
        0's clock; `show`: prints and logs a line (rank 0)."""
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.interval_ns = max(1, round(seconds * 1e9))
        self.origin0_ns, self.clock_offset_ns = origin0_ns, clock_offset_ns
        self.show = show
        self.rows: list[dict] = []  # rank 0: interval_stats.json

    @staticmethod
    def start(comm, seconds: float, clock_offset_ns: int,
              show: Callable[[str], None] | None = None) -> IntervalStats | None:
        """Collectively (once): the run's interval statistics, time 0 now on rank 0; None
        when `seconds` is 0 (off)."""
        if seconds <= 0:
            return None
        origin = comm.bcast(_core.now_ns() if comm.Get_rank() == 0 else None, root=0)
        return IntervalStats(comm.Dup(), seconds, origin, clock_offset_ns, show)

    def epoch(self, phase: str, epoch: int, records: np.ndarray, plan: ReadPlan, batch: int,
              planned: np.ndarray | None = None) -> EpochIntervals:
        """Follow an epoch whose steps fill `records` (training.run_epoch's) from its
        `begin(start_ns, lat_ns)` (this rank's clock; the reader's latencies); `planned`: each
        step's planned compute (its start: DEADLINE - planned, after any host work; None: at
        GOT)."""
        return EpochIntervals(self, phase, epoch, records, plan, batch, planned)

    def row(self, watch: EpochIntervals, parts: list[Delta]) -> None:
        """Rank 0: one interval merged over the ranks that reported it; kept and shown."""
        start = min(d.start_ns for d in parts)
        seconds = (max(d.end_ns for d in parts) - start) / 1e9
        steps = sum(d.steps for d in parts)
        nbytes = sum(d.bytes for d in parts)
        hist = np.zeros(len(latency.EDGES) - 1, dtype=np.int64)
        for d in parts:
            np.add.at(hist, d.bins[0], d.bins[1])
        count = sum(d.lat_count for d in parts)
        au = [100.0 * d.compute_ns / (d.end_ns - d.start_ns) if d.end_ns > d.start_ns else 0.0
              for d in parts]
        row = {
            "phase": watch.phase, "epoch": watch.epoch, "interval": int(parts[0].interval),
            "start_s": (start - self.origin0_ns) / 1e9, "seconds": seconds,
            "steps": steps, "samples": steps * watch.batch, "bytes": nbytes,
            "read_ops": sum(d.ops for d in parts),
            "samples_per_second": steps * watch.batch / seconds if seconds > 0 else 0.0,
            "MiB_per_second": nbytes / MIB / seconds if seconds > 0 else 0.0,
            "au_percentage": float(np.mean(au)),
            "read_latency_us": {
                "mean": sum(d.lat_sum_ns for d in parts) / count / 1e3 if count else 0.0,
                "p50": latency.percentile_ns(hist, 50) / 1e3,
                "p99": latency.percentile_ns(hist, 99) / 1e3},
            "ranks": len(parts),
        }
        self.rows.append(row)
        if self.show is not None:
            lat = row["read_latency_us"]
            end = row["start_s"] + seconds
            self.show(f"interval: {watch.phase} epoch {watch.epoch} "
                      f"[{row['start_s']:.1f}-{end:.1f} s]: "
                      f"{row['samples_per_second']:.1f} samples/s, "
                      f"{row['MiB_per_second']:.1f} MiB/s read, AU {row['au_percentage']:.1f} %, "
                      f"read latency mean {lat['mean']:.1f} us, p50 {lat['p50']:.1f} us, "
                      f"p99 {lat['p99']:.1f} us, {len(parts)}/{self.size} ranks")

    def write(self, out) -> None:
        """Rank 0: the rows into output.folder (an OutputFolder)."""
        from ..results import jsonfile
        from ..results.names import INTERVAL_STATS

        out.write(INTERVAL_STATS, lambda fp: jsonfile.dump(self.rows, fp))  # a row a line
        out.record(INTERVAL_STATS)

    def close(self) -> None:
        """Collectively, after the run's last epoch: free the communicator."""
        self.comm.Free()
