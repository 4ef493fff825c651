"""The native backend (reader.file_access: multi): one split's files behind the C engine
(threads, prefetch ring, pread with optional O_DIRECT), which also runs the step loop in C."""

from __future__ import annotations

import numpy as np

from .. import _core
from ..data.catalog import SplitFiles
from ..metrics.epoch_trace import RequestTrace
from ..mpi.pacing import StepSync
from ..sampling.requests import ReadPlan
from ..storage import storage_for
from .base import BatchStats, ReaderBackend
from .registry import NativeOptions


class NativeReader(ReaderBackend):
    """Reads planned batches of one split with the C engine (a ReaderBackend).

    options.close_at_epoch_end: close every descriptor when an epoch ends, as a loader closes
    the files it kept open (reader.access: loader); else descriptors stay cached across epochs
    (lean). drop_page_cache: before each epoch, posix_fadvise(DONTNEED) the files it will read,
    so that the page cache cannot serve them. keep_data: False reads every request into one
    small buffer per thread instead of the batch ring. watchdog: see IoWatchdog.
    As the loader it stands for: options.in_flight batches read ahead, each by one thread
    with options.whole_batches (a DataLoader's workers), and in the first epoch no read before
    options.startup_ns (the loader starting)."""

    def __init__(self, files: SplitFiles, options: NativeOptions, comm=None) -> None:
        align = 0
        o = options
        if o.odirect and files.count:
            first = files.path(0)
            # probed first: a clear error before training if refused
            align = max(storage_for(first).direct_alignment(first))
        who = "" if o.watchdog.rank is None else f"rank {o.watchdog.rank}"
        ahead = o.prefetch_size if o.in_flight is None else o.in_flight
        self._engine = _core.Engine(o.read_threads, ahead, o.odirect, o.fd_cache_size, align,
                                    not o.keep_data, o.watchdog.seconds, o.watchdog.abort, who,
                                    o.whole_batches)
        self._startup_ns = o.startup_ns  # spent in the first epoch only
        self._started_ns = 0  # the start-up spent so far (counters)
        files.attach(self._engine)
        self.close_at_epoch_end, self.drop_page_cache = o.close_at_epoch_end, o.drop_page_cache
        self.lat_ns = np.zeros(0, dtype=np.int64)  # per request of the current epoch
        self.trace = o.trace
        self.request_trace: RequestTrace | None = None
        self.cache_attached = False  # reader.cache (attach_cache)
        self._request_trace: RequestTrace | None = None  # the next epoch's (prepare_epoch)

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Work before the epoch's clock starts: the batch buffers, and dropping the plan's
        files from the page cache."""
        self._engine.reserve(plan)
        if self.trace:  # its pages faulted in here, not by the readers inside the clock
            self._request_trace = RequestTrace.empty(len(plan.offset))
        if self.drop_page_cache:
            self._engine.drop_cache(plan.files())

    def start_epoch(self, plan: ReadPlan) -> None:
        """Hand the engine an epoch of requests; its threads start prefetching at once."""
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)
        rt, self._request_trace = self._request_trace, None
        if self.trace and (rt is None or len(rt.start_ns) != len(plan.offset)):
            rt = RequestTrace.empty(len(plan.offset))  # without prepare_epoch
        self.request_trace = rt if self.trace else None
        not_before = _core.now_ns() + self._startup_ns if self._startup_ns else 0
        self._started_ns += self._startup_ns
        self._startup_ns = 0
        self._engine.start_epoch(plan, lat_ns=self.lat_ns, nread=rt and rt.nread,
                                 start_ns=rt and rt.start_ns, thread=rt and rt.thread,
                                 not_before_ns=not_before)

    def attach_cache(self, tier, name: str, files: SplitFiles) -> None:
        """reader.cache: the engine reads and fills the tier's copies of these files."""
        tier.attach(name, files, self._engine)
        self.cache_attached = True

    def run_steps(self, pacer: _core.Pacer, sync: StepSync | None, compute_ns: np.ndarray,
                  start_ns: int, out: np.ndarray,
                  host_cpu_ns: np.ndarray | None = None,
                  host_wait_ns: np.ndarray | None = None) -> np.ndarray:
        """Run the epoch's steps in the C loop (see _core.Engine.run_steps), which fills the
        (steps, 8) records `out` (base.START ... base.OPS) row by row; returns the rows of the
        steps run. Fewer steps than planned when the ranks agreed to stop (SIGINT, SIGTERM)."""
        cpu, wait = (None if ns is None else np.ascontiguousarray(ns, dtype=np.int64)
                     for ns in (host_cpu_ns, host_wait_ns))
        done = self._engine.run_steps(pacer, sync.native if sync is not None else None,
                                      np.ascontiguousarray(compute_ns, dtype=np.int64),
                                      start_ns, out, cpu, wait)
        return out[:done]

    def next_batch(self) -> BatchStats | None:
        """Wait (GIL released) for the next batch; None at the end of the epoch."""
        batch = self._engine.next()
        return None if batch is None else BatchStats(batch.ready_ns, batch.bytes_read,
                                                     batch.read_ops)

    def abandon_epoch(self) -> None:
        """Stop an epoch before its last batch: the reads in flight end, every file closes."""
        self._engine.close_files()

    def end_epoch(self) -> None:
        """After the last batch: close the files a loader would close."""
        if self.close_at_epoch_end:
            self._engine.close_files()

    def counters(self) -> dict:
        return {**self._engine.counters(), "loader_startup_ns": self._started_ns}

    def describe(self) -> dict:
        return {"backend": "native", "file_access": "multi"}

    def close(self) -> None:
        self._engine.close()
