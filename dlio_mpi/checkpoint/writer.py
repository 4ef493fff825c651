"""The checkpoint writers' protocol: what the checkpointer knows of a writer (file_per_rank,
shared, pt_save), every hook declared with its default, and what a save or load moved.

Asynchronous saves (checkpoint.async_write, checkpoint/async_write.py) ask a writer for the
files of a save (async_files), to open them under temporary names (open_async), and, once the
background writer has written them from the snapshot, to close them and give them their final
names (close_async, then publish_async, collective) or to remove them (discard_async)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from .. import _core
from ..storage import storage_for
from ..storage.ownership import temporary_name
from .sizing import RankShard

WHOLE_EVERY = 64  # a restore compares every so many 4 KiB granules whole (as the C core's)


@dataclass
class IoStats:
    """What one rank's save or load of one checkpoint did."""

    bytes: int = 0
    files: int = 0
    calls: int = 0
    syncs: int = 0
    sync_ns: int = 0
    verified: int = 0
    io_ns: int = 0  # in the write or read calls (the storage's)
    emulator_ns: int = 0  # waiting on bytes being made, or checking them (the emulator's)
    meta_ns: int = 0  # in the storage's other calls: open, close, rename (storage_call)

    @property
    def storage_ns(self) -> int:
        """The time in the storage's calls: writes or reads, fsync, open, close, rename."""
        return self.io_ns + self.sync_ns + self.meta_ns

    @contextmanager
    def storage_call(self) -> Iterator[None]:
        """Time a storage call made outside the C core's loops (open, close, rename, MPI-IO's
        collective open, a framework's save or load) as the storage's."""
        began = _core.now_ns()
        try:
            yield
        finally:
            self.meta_ns += _core.now_ns() - began

    def add(self, stats: dict) -> None:
        """Count one file's C-core stats (the storage's write_shard, read_shard, write_buffer)."""
        self.bytes += stats["bytes"]
        self.calls += stats["calls"]
        self.syncs += stats["syncs"]
        self.sync_ns += stats["sync_ns"]
        self.verified += stats["verified"]
        self.io_ns += stats["io_ns"]
        self.emulator_ns += stats["emulator_ns"]
        self.files += 1


@dataclass
class AsyncFile:
    """One file an asynchronous save writes from the snapshot: `nbytes` of the shard of `seed`
    at `offset` of the file, written under `tmp` (its storage's handle `fd` once opened) and
    renamed to `final` when whole. `overlay(view)`: what the writer lays over the shard's bytes
    in the snapshot (dcp's framing around each payload), if anything."""

    seed: int
    nbytes: int
    offset: int
    tmp: str
    final: str
    fd: int = field(default=-1, compare=False)
    overlay: Callable | None = field(default=None, compare=False, repr=False)


class CheckpointWriter:
    """Saves and loads one rank's share of each checkpoint."""

    collective: bool = False  # save and load are collective calls: every rank makes them

    def allocate(self, shard: RankShard) -> None:
        """Made once before the first save, outside its time (pt_save's tensors, as DLIO
        allocates them at start); nothing by default."""
        return None

    def file_names(self, shards: list[RankShard]) -> list[str]:
        """The files of one checkpoint, for every rank's `shards`."""
        raise NotImplementedError

    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        raise NotImplementedError

    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        raise NotImplementedError

    # ---- asynchronous saves (None of these: async_write is refused for the writer)
    chunk: int = 0  # the bytes of its write calls (0: the C core's 64 MiB)
    content: object = None  # checkpoint.content's section (content.py; None: fresh bytes)

    def async_files(self, checkpoint: int, checkpoint_id: str, shard: RankShard
                    ) -> list[AsyncFile]:
        """The files of `shard` (a rank's) of checkpoint number `checkpoint`, no I/O."""
        raise NotImplementedError

    def open_async(self, files: list[AsyncFile]) -> None:
        """Create and open `files` under their temporary names (collective where the writer
        is); nothing under a final name."""
        raise NotImplementedError

    def close_async(self, files: list[AsyncFile]) -> None:
        """Close the files this rank has written whole, renaming those it renames itself."""
        raise NotImplementedError

    def publish_async(self, files: list[AsyncFile]) -> None:
        """Collective, after every rank's close_async: the final names the ranks share."""
        return None

    def discard_async(self, files: list[AsyncFile]) -> None:
        """Close and remove this rank's temporaries of an abandoned save (collective where
        the writer is)."""
        raise NotImplementedError


def write_whole(final: str, tag: str, stats: IoStats, write) -> None:
    """Create `final`'s temporary of this job (exclusively), let write(handle, tmp) fill it
    (a handle of storage_for(final)), close it and rename it to `final` only when whole,
    never over a file (one there is not ours); on any failure remove the temporary. Open,
    close and rename timed as the storage's."""
    fs, tmp = storage_for(final), temporary_name(final, tag)
    with stats.storage_call():
        fd = fs.create_exclusive(tmp)
    try:
        try:
            write(fd, tmp)
        finally:
            with stats.storage_call():
                fs.close(fd)
        with stats.storage_call():
            fs.rename_noreplace(tmp, final)
    except BaseException:
        fs.remove_quietly([tmp])
        raise


class OwnFilesAsync:
    """The asynchronous hooks of a writer whose ranks each write their own files: each opened
    under its temporary name (O_EXCL), renamed by its rank when whole, removed when the save
    is abandoned (file_per_rank, dcp)."""

    def open_async(self, files: list[AsyncFile]) -> None:
        try:
            for f in files:
                f.fd = storage_for(f.tmp).create_exclusive(f.tmp)
        except BaseException:
            self.discard_async(files)
            raise

    def close_async(self, files: list[AsyncFile]) -> None:
        try:
            for f in files:
                fs = storage_for(f.tmp)
                fs.close(f.fd)
                f.fd = -1
                fs.rename_noreplace(f.tmp, f.final)  # refused if a file is there: not ours
        except BaseException:
            self.discard_async(files)
            raise

    def discard_async(self, files: list[AsyncFile]) -> None:
        close_async_files(files)
        remove_async_files(files)


def close_async_files(files: list[AsyncFile]) -> None:
    """Close those of `files` still open (their handles given back to their storage)."""
    for f in files:
        if f.fd >= 0:
            storage_for(f.tmp).close(f.fd)
            f.fd = -1


def remove_async_files(files: list[AsyncFile]) -> None:
    """Remove the temporaries of `files` that exist."""
    for f in files:
        storage_for(f.tmp).remove_quietly([f.tmp])
