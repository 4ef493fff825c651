"""The native reader: one split's files behind the C engine (threads, prefetch ring, pread with
optional O_DIRECT). Python hands it a ReadPlan per epoch and waits for batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _core
from .catalog import SplitFiles
from .config.schema import Reader
from .planner import ReadPlan


@dataclass(frozen=True)
class IoWatchdog:
    """What the engine does about an open or read stuck in the kernel (a dead NFS or Lustre
    server): report it after `seconds` (0: never) on stderr, naming `rank` and the file, and
    with `abort` end the job (the wait for the batch raises)."""

    seconds: float = 60.0
    abort: bool = False
    rank: int | None = None

    @staticmethod
    def from_config(reader_cfg: Reader, rank: int) -> IoWatchdog:
        """reader.io_watchdog_seconds and reader.io_watchdog_abort, for this rank."""
        return IoWatchdog(reader_cfg.io_watchdog_seconds, reader_cfg.io_watchdog_abort, rank)


class NativeReader:
    """Reads planned batches of one split with the C engine.

    close_at_epoch_end: close every descriptor when an epoch ends, as a loader closes the files
    it kept open (reader.access: loader); else descriptors stay cached across epochs (lean).
    drop_page_cache: before each epoch, posix_fadvise(DONTNEED) the files it will read, so
    that the page cache cannot serve them. keep_data: False reads every request into one small
    buffer per thread instead of the batch ring. watchdog: see IoWatchdog."""

    def __init__(self, files: SplitFiles, read_threads: int, prefetch_size: int, odirect: bool,
                 fd_cache_size: int, close_at_epoch_end: bool = True,
                 drop_page_cache: bool = False, keep_data: bool = True,
                 watchdog: IoWatchdog = IoWatchdog()) -> None:
        align = 0
        if odirect and files.count:
            first = files.path(0)
            _core.probe_odirect(first)  # a clear error before training if refused
            align = max(_core.odirect_alignment(first))
        who = "" if watchdog.rank is None else f"rank {watchdog.rank}"
        self._engine = _core.Engine(read_threads, prefetch_size, odirect, fd_cache_size, align,
                                    not keep_data, watchdog.seconds, watchdog.abort, who)
        files.attach(self._engine)
        self.close_at_epoch_end, self.drop_page_cache = close_at_epoch_end, drop_page_cache
        self.lat_ns = np.zeros(0, dtype=np.int64)  # per request of the current epoch

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Work before the epoch's clock starts: the batch buffers, and dropping the plan's
        files from the page cache."""
        self._engine.reserve(plan.batch_start, plan.file_idx, plan.offset, plan.length,
                             plan.flags, plan.expect)
        if self.drop_page_cache:
            self._engine.drop_cache(plan.files())

    def start_epoch(self, plan: ReadPlan) -> None:
        """Hand the engine an epoch of requests; its threads start prefetching at once."""
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)
        self._engine.start_epoch(plan.batch_start, plan.file_idx, plan.offset, plan.length,
                                 None, self.lat_ns, None, plan.flags, plan.expect)

    def run_steps(self, pacer, sync, compute_ns: np.ndarray, start_ns: int) -> np.ndarray:
        """Run the epoch's steps in the C loop (see _core.Engine.run_steps); returns the
        (steps run, 8) records: start, ready, got, deadline, computed, synced, bytes, read
        ops. Fewer steps than planned when the ranks agreed to stop (SIGINT, SIGTERM)."""
        out = np.zeros((len(compute_ns), 8), dtype=np.int64)
        done = self._engine.run_steps(pacer, sync,
                                      np.ascontiguousarray(compute_ns, dtype=np.int64),
                                      start_ns, out)
        return out[:done]

    def next_batch(self):
        """Wait (GIL released) for the next batch; None at the end of the epoch."""
        return self._engine.next()

    def abandon_epoch(self) -> None:
        """Stop an epoch before its last batch: the reads in flight end, every file closes."""
        self._engine.close_files()

    def end_epoch(self) -> None:
        """After the last batch: close the files a loader would close."""
        if self.close_at_epoch_end:
            self._engine.close_files()

    def counters(self) -> dict:
        return self._engine.counters()

    def close(self) -> None:
        self._engine.close()
