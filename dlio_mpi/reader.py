"""The native reader: one split's files behind the C engine (threads, prefetch ring, pread with
optional O_DIRECT). Python hands it a ReadPlan per epoch and waits for batches."""

from __future__ import annotations

import numpy as np

from . import _core
from .planner import ReadPlan


class NativeReader:
    """Reads planned batches of one split with the C engine."""

    def __init__(self, paths: list[str], read_threads: int, prefetch_size: int, odirect: bool,
                 fd_cache_size: int) -> None:
        align = 0
        if odirect and paths:
            _core.probe_odirect(paths[0])  # a clear error before training if refused
            align = max(_core.odirect_alignment(paths[0]))
        self._engine = _core.Engine(read_threads, prefetch_size, odirect, fd_cache_size, align)
        self._engine.set_files(paths)
        self.lat_ns = np.zeros(0, dtype=np.int64)  # per request of the current epoch

    def start_epoch(self, plan: ReadPlan) -> None:
        """Hand the engine an epoch of requests; its threads start prefetching at once."""
        nreq = len(plan.offset)
        self.lat_ns = np.zeros(nreq, dtype=np.int64)
        self._engine.start_epoch(plan.batch_start, plan.file_idx, plan.offset, plan.length,
                                 None, self.lat_ns, None)

    def next_batch(self):
        """Wait (GIL released) for the next batch; None at the end of the epoch. The slot of
        the previous batch is released, but the readers are only woken to refill it by
        resume() (or by a next_batch that has to wait): a wake-up costs a futex call and an
        inter-processor interrupt, which must not delay the hand-over of a ready batch."""
        return self._engine.next(True)

    def resume(self) -> None:
        """Let the readers refill the slot next_batch released (call once the step's clock
        has started)."""
        self._engine.wake()

    def counters(self) -> dict:
        return self._engine.counters()

    def close(self) -> None:
        self._engine.close()
