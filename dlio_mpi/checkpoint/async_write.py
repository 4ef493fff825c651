"""checkpoint.async_write: asynchronous saves, as torch DCP's async_save and DeepSpeed's
asynchronous checkpointing stage a checkpoint in host memory and write it while training goes
on.

At a save the step loop stalls only for the snapshot: the rank's share put into a host buffer
(the C core's dio_shard_snapshot: the checkpoint stream of each file made into it, the bytes a
synchronous save writes, so that a restore checks them alike; it makes bytes faster than a
memcpy copies them), paced by checkpoint.snapshot_bytes_per_second where given (a
device-to-host copy over PCIe). A background thread then writes the snapshot through the storage's
write_buffer (the C core's dio_buffer_write: large calls, O_DIRECT and fsync as configured; the
GIL released, no MPI call in the thread). The next save, an evaluation, a restore or the run's
end waits for the write (Checkpointer.finish).

The snapshot buffer (the share's bytes, each file's part aligned to 2 MiB, advised to huge
pages) is allocated and touched once before training, outside any timing; its bytes are
reported and checked against the nodes' memory before any I/O (plan/checks.py
check_snapshot_memory)."""

from __future__ import annotations

import mmap
import threading
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..storage import storage_for
from .content import core_content
from .writer import AsyncFile, IoStats

ALIGN = 2 << 20  # each file's part of the snapshot starts at a multiple of this


def snapshot_bytes(sizes: list[int]) -> int:
    """The snapshot buffer's bytes on a rank whose files have `sizes`."""
    return sum(-(-n // ALIGN) * ALIGN for n in sizes)


@dataclass
class Written:
    """What the background writer did for one save, on this rank's clock."""

    stats: IoStats = field(default_factory=IoStats)
    start_ns: int = 0
    end_ns: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)  # set once it ended

    def complete(self) -> bool:
        """Wait for the write to end (from another thread: a drain of its files); whether it
        wrote them all."""
        self.done.wait()
        return self.error is None


class AsyncSaver:
    """This rank's snapshot buffer and background writer (one save at a time)."""

    def __init__(self, sizes: list[int], chunk: int, odirect: bool, fsync: bool,
                 bytes_per_second: float = 0.0, content=None) -> None:
        self.sizes, self.chunk, self.content = list(sizes), chunk, content
        self.odirect, self.fsync, self.rate = odirect, fsync, bytes_per_second
        self.buffer_bytes = snapshot_bytes(self.sizes)
        self._map: mmap.mmap | None = None
        self.parts: list[np.ndarray] = []
        self.allocate_seconds = 0.0
        self._thread: threading.Thread | None = None
        self._written: Written | None = None

    def allocate(self) -> None:
        """Map and touch the snapshot buffer."""
        start = _core.now_ns()
        self._map = mmap.mmap(-1, max(self.buffer_bytes, mmap.PAGESIZE))
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        whole[:] = 0  # every page touched now, not in the first snapshot
        at = 0
        for n in self.sizes:
            self.parts.append(whole[at:at + n])
            at += -(-n // ALIGN) * ALIGN
        self.allocate_seconds = (_core.now_ns() - start) / 1e9

    def snapshot(self, files: list[AsyncFile]) -> int:
        """Make the shard of `files` into the buffer (the stall); its bytes."""
        for part, f in zip(self.parts, files):
            _core.shard_snapshot(part, f.seed, self.chunk, self.rate,
                                 core_content(self.content, f.nbytes))
            if f.overlay is not None:
                f.overlay(part)
        return sum(f.nbytes for f in files)

    def start(self, files: list[AsyncFile]) -> Written:
        """Write `files` (opened) from the buffer in a thread; returns at once, with what
        will say when the write has ended."""
        written = self._written = Written(start_ns=_core.now_ns())

        def write() -> None:
            try:
                for part, f in zip(self.parts, files):
                    written.stats.add(storage_for(f.tmp).write_buffer(
                        f.fd, f.offset, part, chunk=self.chunk, odirect=self.odirect,
                        fsync=self.fsync, path=f.tmp))
            except BaseException as exc:  # told at finish, agreed by every rank there
                written.error = exc
            written.end_ns = _core.now_ns()
            written.done.set()  # a drain of these files may begin

        self._thread = threading.Thread(target=write, name="dlio-mpi checkpoint writer",
                                        daemon=True)
        self._thread.start()
        return written

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def wait(self) -> Written:
        """Wait for the write started last; what it did (its error in .error)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        written, self._written = self._written, None
        return written if written is not None else Written()

    def describe(self) -> dict:
        return {"snapshot_buffer_bytes": self.buffer_bytes,
                "allocate_seconds": round(self.allocate_seconds, 6),
                "snapshot_bytes_per_second": self.rate or None}

    def close(self) -> None:
        self.wait()
        self.parts = []
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still held: freed with it
                pass
            self._map = None
