"""checkpoint.layout: dcp: a torch Distributed Checkpoint save and restore, as
torch.distributed.checkpoint.save / load with FileSystemWriter and FileSystemReader do them
(docs/dcp_facts.md), without torch.

A save: the ranks' plans gathered to rank 0 and sent back (DCP's reduce_scatter("plan")),
every rank writing its `__{rank}_{i}.distcp` files (checkpoint.dcp.thread_count of them), each
item a torch.save archive at the place dcp_plan gives it; the results gathered to rank 0
(all_reduce("write")), which alone writes `.metadata` (built once before the first save:
dcp_metadata.MetadataTemplate), then its bytes broadcast to every rank. A file's bytes are the
checkpoint stream of (checkpoint, rank, file) at the file's offsets, the items' framing (every
byte of each archive around its payload, the crc32 fields 0) laid over it, written in large
calls; an asynchronous save's snapshot holds the same bytes.

Files appear under their final names only when whole: each .distcp file under a temporary of
this job's, synced (checkpoint.fsync: DCP's sync_files), renamed; `.metadata` under a temporary
written by rank 0 only after every rank reported its files, synced as torch syncs it (before
its last frame is written: torch's order), renamed: the commit. A failure on any rank is agreed
by all (no .metadata is written). A restore reads what DCP's load reads: the whole .metadata on
every rank, then the items its shards occupy (dcp_plan.restore_reads), checking the framing
and the payloads."""

from __future__ import annotations

import bisect
import os

import numpy as np

from .. import _core
from ..errors import check_all, on_root, raise_if_stopped
from ..storage import Handle, storage_for
from ..storage.ownership import temporary_name
from .content import core_content
from .dcp_layout import METADATA, DcpLayout, dcp_seed
from .dcp_plan import PlannedFile, local_save_plan, restore_reads
from .sizing import RankShard
from .writer import (
    WHOLE_EVERY,
    AsyncFile,
    CheckpointWriter,
    IoStats,
    OwnFilesAsync,
    write_whole,
)

CHUNK = 64 << 20  # bytes per write or read call
METADATA_FRAME = 64 << 10  # the pickle's frames: torch's fsync comes before the last one


def framing(planned: PlannedFile) -> list[tuple[int, bytes]]:
    """(offset, bytes) of every byte of a file that is not a payload: each item's archive
    before and after its payload (crc32 fields 0), in file order."""
    out = []
    for item in planned.items:
        out.append((item.offset, item.archive.prefix()))
        out.append((item.payload_offset + item.payload_length, item.archive.suffix(0)))
    return out


def pieces_in(at: int, end: int, pieces: list[tuple[int, bytes]], starts: list[int]):
    """The parts of the framing pieces in the file's bytes [at, end): (lo, hi, the piece's
    bytes there as uint8)."""
    i = max(bisect.bisect_right(starts, at) - 1, 0)
    while i < len(pieces) and pieces[i][0] < end:
        start, data = pieces[i]
        lo, hi = max(start, at), min(start + len(data), end)
        if lo < hi:
            yield lo, hi, np.frombuffer(data, np.uint8, hi - lo, lo - start)
        i += 1


def overlay(view: np.ndarray, at: int, pieces: list[tuple[int, bytes]], starts: list[int]
            ) -> None:
    """Lay the pieces that fall in [at, at + len(view)) of the file over `view`."""
    for lo, hi, data in pieces_in(at, at + len(view), pieces, starts):
        view[lo - at:hi - at] = data


def _file_number(name: str) -> tuple[int, int]:
    """(rank, index) of `__{rank}_{index}.distcp`."""
    rank, index = name[2:].split(".")[0].split("_")
    return int(rank), int(index)


class DcpWriter(OwnFilesAsync, CheckpointWriter):
    """Saves and loads one rank's part of each DCP checkpoint (collective calls)."""

    collective = True

    def __init__(self, comm, folder: str, tag: str, fsync: bool, layout: DcpLayout,
                 content=None) -> None:
        self.comm, self.folder, self.tag, self.fsync = comm, folder, tag, fsync
        self.layout, self.plan, self.content = layout, layout.plan, content
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self.fs = storage_for(folder)
        self._framing: dict[str, tuple[list, list[int]]] = {}
        self._buffer: np.ndarray | None = None
        if self.rank == 0:  # .metadata's pickle, made once before any save (outside its time)
            self.template = layout.template

    # ---------------------------------------------------------------- what is written
    def file_names(self, shards) -> list[str]:
        return [name for shard in shards for name in shard.names]

    def _own(self) -> tuple[PlannedFile, ...]:
        return self.plan.rank_files(self.rank)

    def _pieces(self, name: str) -> tuple[list[tuple[int, bytes]], list[int]]:
        """A file's framing and where each piece starts (cached per file)."""
        if name not in self._framing:
            rank, index = _file_number(name)
            pieces = framing(self.plan.rank_files(rank)[index])
            self._framing[name] = pieces, [p[0] for p in pieces]
        return self._framing[name]

    def _content(self, name: str) -> tuple[int, int] | None:
        """checkpoint.content as the C core takes it for the file `name` (its size's)."""
        rank, index = _file_number(name)
        return core_content(self.content, self.plan.rank_files(rank)[index].size)

    def path(self, checkpoint_id: str, name: str) -> str:
        return os.path.join(self.folder, checkpoint_id, name)

    def allocate(self, shard: RankShard) -> None:
        """The block buffer of writes and restores, touched before the first save."""
        if self._buffer is None:
            largest = max([f.size for f in self._own()] + [1])
            self._buffer = np.zeros(min(CHUNK, largest), np.uint8)

    # ---------------------------------------------------------------- a save
    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        """Collective: this rank's .distcp files of checkpoint number `checkpoint` (folder
        `checkpoint_id`, made by the caller), then rank 0's .metadata once every rank's are
        in."""
        stats = IoStats()
        self._exchange_plans()
        results = check_all(self.comm, lambda: self._write_files(checkpoint, checkpoint_id,
                                                                 stats))
        self._commit(checkpoint_id, results, stats)
        return stats

    def _exchange_plans(self) -> None:
        """DCP's reduce_scatter("plan"): every rank's local plan to rank 0, each rank's global
        plan back (its items after deduplication, with their file)."""
        local = [(i.entry.fqn, i.chunk_offsets, i.chunk_sizes)
                 for i in local_save_plan(self.plan.entries, self.world, self.rank)]
        plans = self.comm.gather(local, root=0)
        back = None
        if self.rank == 0:
            back = [[(i.fqn, i.file) for f in self.plan.rank_files(r) for i in f.items]
                    for r in range(len(plans))]
        self.comm.scatter(back, root=0)

    def _write_files(self, checkpoint: int, checkpoint_id: str, stats: IoStats) -> list:
        """This rank's files, each whole under a temporary, synced, renamed; its results
        (file, offset, length of every item) as DCP's write results."""
        self.allocate(None)
        for index, planned in enumerate(self._own()):
            write_whole(self.path(checkpoint_id, planned.name), self.tag, stats,
                        lambda fd, tmp, index=index, planned=planned: self._write_file(
                            fd, dcp_seed(checkpoint, self.rank, index), planned, stats, tmp))
        return [(i.fqn, i.file, i.offset, i.length) for f in self._own() for i in f.items]

    def _write_file(self, fd: Handle, seed: int, planned: PlannedFile, stats: IoStats,
                    path: str) -> None:
        """The file's bytes in calls of CHUNK: the checkpoint stream of `seed` with the items'
        framing over it; fsync when checkpoint.fsync."""
        pieces, starts = self._pieces(planned.name)
        buf, at, size = self._buffer, 0, planned.size
        content = core_content(self.content, size)
        while at < size:
            raise_if_stopped()  # between two calls: a stop waits for one call at most
            n = min(len(buf), size - at)
            view = buf[:n]
            began = _core.now_ns()
            _core.ckpt_fill(view, seed, at, content)
            overlay(view, at, pieces, starts)
            stats.emulator_ns += _core.now_ns() - began
            began = _core.now_ns()
            self.fs.write_at(fd, view, at)
            stats.calls += 1
            stats.io_ns += _core.now_ns() - began
            at += n
        stats.bytes += size
        stats.files += 1
        if self.fsync:
            began = _core.now_ns()
            self.fs.sync(fd)
            stats.syncs += 1
            stats.sync_ns += _core.now_ns() - began

    def _commit(self, checkpoint_id: str, results: list, stats: IoStats | None) -> None:
        """Collective: every rank's results to rank 0 (DCP's all_reduce("write")), which checks
        them against the plan and writes .metadata (the commit); its bytes then sent to every
        rank, as DCP broadcasts the Metadata."""
        gathered = self.comm.gather(results, root=0)
        data = on_root(self.comm, lambda: self._write_metadata(checkpoint_id, gathered, stats))
        self.comm.bcast(data, root=0)

    def _write_metadata(self, checkpoint_id: str, gathered: list, stats: IoStats | None
                        ) -> bytes:
        expected = [[(i.fqn, i.file, i.offset, i.length) for f in self.plan.rank_files(r)
                     for i in f.items] for r in range(self.world)]
        if gathered != expected:
            bad = next(r for r in range(self.world) if gathered[r] != expected[r])
            raise OSError(5, f"checkpoint {checkpoint_id}: rank {bad}'s write results differ "
                             "from its plan")
        data = self.template.render(os.path.join(self.folder, checkpoint_id))
        stats = stats if stats is not None else IoStats()

        def write(fd: Handle, _: str) -> None:
            # torch pickles into a buffered file and fsyncs before closing it: the last
            # frame's bytes (all of a .metadata under 64 KiB) are written after the fsync
            tail = len(data) % METADATA_FRAME if len(data) >= METADATA_FRAME else len(data)
            with stats.storage_call():
                self.fs.write_at(fd, memoryview(data)[:len(data) - tail], 0)
            if self.fsync:
                began = _core.now_ns()
                self.fs.sync(fd)
                stats.syncs += 1
                stats.sync_ns += _core.now_ns() - began
            with stats.storage_call():
                self.fs.write_at(fd, memoryview(data)[len(data) - tail:], len(data) - tail)

        write_whole(self.path(checkpoint_id, METADATA), self.tag, stats, write)
        stats.bytes += len(data)
        stats.files += 1
        return data

    # ---------------------------------------------------------------- a restore
    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        """What DCP's load reads for `shard`'s rank (this rank's, or another's under
        recovery_rank_shift): the whole .metadata, then each item its chunks occupy, the
        framing compared byte for byte and the payloads checked (the first 64 bytes of every
        4 KiB, every 64th 4 KiB whole)."""
        stats = IoStats()
        self.allocate(None)
        self._read_metadata(self.path(checkpoint_id, METADATA), drop_cache, stats)
        by_file: dict[str, list] = {}
        for r in restore_reads(self.plan, self.world, shard.rank):
            by_file.setdefault(r.file, []).append(r)
        for name, reads in by_file.items():
            path = self.path(checkpoint_id, name)
            with stats.storage_call():
                fd = self.fs.open_read(path)
            try:
                if drop_cache:
                    with stats.storage_call():
                        self.fs.drop_cached(fd)
                rank, index = _file_number(name)
                seed = (dcp_seed(checkpoint, rank, index), self._content(name))
                pieces, starts = self._pieces(name)
                for r in reads:
                    self._read_item(fd, path, seed, r, pieces, starts, stats)
            finally:
                with stats.storage_call():
                    self.fs.close(fd)
            stats.files += 1
        return stats

    def _read_metadata(self, path: str, drop_cache: bool, stats: IoStats) -> None:
        """All of .metadata, as pickle.load reads it (in frames of about 64 KiB)."""
        fs = self.fs
        with stats.storage_call():
            fd = fs.open_read(path)
        try:
            if drop_cache:
                with stats.storage_call():
                    fs.drop_cached(fd)
            began, head, at = _core.now_ns(), b"", 0
            while True:
                data = fs.read_at(fd, METADATA_FRAME, at)
                stats.calls += 1
                if not data:
                    break
                head, at = head or data[:2], at + len(data)
                stats.bytes += len(data)
            stats.io_ns += _core.now_ns() - began
        finally:
            fs.close(fd)
        stats.files += 1
        if head != b"\x80\x04":
            raise OSError(5, f"checkpoint {path}: not a pickle of protocol 4", path)

    def _read_item(self, fd: Handle, path: str, seed: tuple, r, pieces, starts,
                   stats: IoStats) -> None:
        """One item whole: its framing compared, its payload checked, in calls of CHUNK."""
        buf, at, end = self._buffer, r.offset, r.offset + r.length
        payload_end = r.payload_offset + r.payload_length
        while at < end:
            raise_if_stopped()
            n = min(len(buf), end - at)
            view = buf[:n]
            began = _core.now_ns()
            got = self.fs.read_into(fd, view, at)
            stats.io_ns += _core.now_ns() - began
            stats.calls += 1
            if got != n:
                raise OSError(5, f"checkpoint {path}: {got} bytes at offset {at}, expected {n} "
                                 "(the file is shorter than its plan)", path)
            began = _core.now_ns()
            bad = self._check(view, at, seed, r.payload_offset, payload_end, pieces, starts,
                              stats)
            stats.emulator_ns += _core.now_ns() - began
            if bad >= 0:
                raise OSError(5, f"checkpoint {path}: the bytes at offset {bad} (item "
                                 f"{r.fqn}) do not hold the bytes written", path)
            stats.bytes += n
            at += n

    def _check(self, view: np.ndarray, at: int, seed: tuple, payload: int, payload_end: int,
               pieces, starts, stats: IoStats) -> int:
        """-1, or the file offset of the first byte found changed in `view` (file bytes
        [at, at + len(view))); `seed`: the file's stream seed and content."""
        lo, hi = max(at, payload), min(at + len(view), payload_end)
        if lo < hi:
            bad, compared = _core.ckpt_check(view[lo - at:hi - at], seed[0], lo, seed[1],
                                             WHOLE_EVERY)
            stats.verified += compared
            if bad >= 0:
                return lo + bad
        for lo, hi, want in pieces_in(at, at + len(view), pieces, starts):
            stats.verified += hi - lo
            differ = np.flatnonzero(view[lo - at:hi - at] != want)
            if len(differ):
                return lo + int(differ[0])
        return -1

    # ---------------------------------------------------------------- asynchronous saves
    def async_files(self, checkpoint: int, checkpoint_id: str, shard: RankShard
                    ) -> list[AsyncFile]:
        files = []
        for index, planned in enumerate(self._own()):
            final = self.path(checkpoint_id, planned.name)
            pieces, starts = self._pieces(planned.name)
            files.append(AsyncFile(dcp_seed(checkpoint, self.rank, index), planned.size, 0,
                                   temporary_name(final, self.tag), final,
                                   overlay=lambda view, p=pieces, s=starts: overlay(
                                       view, 0, p, s)))
        return files

    def publish_async(self, files: list[AsyncFile]) -> None:
        """Collective, once every rank's files are in: rank 0's .metadata (the commit)."""
        checkpoint_id = os.path.basename(os.path.dirname(files[0].final))
        results = [(i.fqn, i.file, i.offset, i.length) for f in self._own() for i in f.items]
        self._commit(checkpoint_id, results, None)
