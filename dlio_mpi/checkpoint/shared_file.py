"""checkpoint.layout: shared: one file per checkpoint, each rank's bytes at its offset (the
ranks' shares back to back in rank order), written and read back collectively through MPI-IO
(mpiio_rounds.py: one Write_at_all / Read_at_all per round of blocks), with the checkpoint's
MPI-IO hints given at the collective open.

The file is created collectively under a temporary name of this job's with MODE_EXCL (so that
MPI-IO striping hints act at its creation and no file in the way is ever written), synced with
File.Sync when checkpoint.fsync, and renamed by rank 0 to its final name only when every rank's
bytes are in, never over an existing file. A rank's bytes are the checkpoint shard of its
(checkpoint, rank) seed in blocks of `chunk` bytes, as file_per_rank writes them, so a restore
checks them the same way."""

from __future__ import annotations

import os

import numpy as np

from .. import _core
from ..errors import check_all, on_root
from ..mpiio_rounds import mpiio_call, open_shared, read_rounds, write_rounds
from ..ownership import remove_quietly, rename_noreplace, temporary_name
from ..readers.mpiio import drop_cached_pages
from .file_per_rank import IoStats, shard_seed

CHUNK = 64 << 20  # bytes per rank and round


class SharedFile:
    """Saves and loads the ranks' shares of each checkpoint in one file, collectively."""

    def __init__(self, comm, folder: str, tag: str, fsync: bool, hints: dict[str, str],
                 chunk: int = CHUNK) -> None:
        self.comm, self.folder, self.tag = comm, folder, tag
        self.fsync, self.hints, self.chunk = fsync, dict(hints), chunk

    def _blocks(self, checkpoint: int, nbytes: int, act) -> tuple[list, int]:
        """This rank's blocks (offset in the file, bytes, act(view, seed, block)) and its
        offset: the shares of the ranks before it."""
        rank = self.comm.Get_rank()
        start = self.comm.exscan(nbytes) or 0  # collective; None on rank 0
        seed, chunk = shard_seed(checkpoint, rank, 0), self.chunk
        return [(start + k * chunk, min(chunk, nbytes - k * chunk),
                 lambda view, k=k: act(view, seed, k))
                for k in range(-(-nbytes // chunk))], start

    def save(self, checkpoint: int, checkpoint_id: str, name: str, nbytes: int) -> IoStats:
        """Write this rank's `nbytes` of checkpoint number `checkpoint` into the shared file
        `name` in the folder `checkpoint_id` (made by the caller); collective."""
        from mpi4py import MPI

        final = os.path.join(self.folder, checkpoint_id, name)
        tmp = self.comm.bcast(temporary_name(final, self.tag), root=0)
        blocks, _ = self._blocks(checkpoint, nbytes, _core.shard_block)
        handle = open_shared(self.comm, tmp, self.hints,
                             MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL)
        stats = IoStats(files=1)
        try:
            stats.bytes = write_rounds(self.comm, handle, blocks, tmp)
            stats.calls = len(blocks)
            if self.fsync:
                started = _core.now_ns()
                check_all(self.comm, lambda: mpiio_call(handle.Sync, "sync", tmp))
                stats.syncs, stats.sync_ns = 1, _core.now_ns() - started
        except BaseException:
            handle.Close()
            if self.comm.Get_rank() == 0:
                remove_quietly([tmp])
            raise
        handle.Close()

        def complete() -> None:
            try:
                rename_noreplace(tmp, final)  # refused if a file is there: it is not ours
            except BaseException:
                remove_quietly([tmp])
                raise

        on_root(self.comm, complete)
        return stats

    def load(self, checkpoint: int, checkpoint_id: str, name: str, nbytes: int,
             drop_cache: bool = False) -> IoStats:
        """Read this rank's share back collectively and check it (every block's stamp, every
        64th block whole); `drop_cache`: advise the page cache to drop the file first."""
        from mpi4py import MPI

        path = os.path.join(self.folder, checkpoint_id, name)
        if drop_cache:
            check_all(self.comm, lambda: drop_cached_pages([path]))

        def check(view: np.ndarray, seed: int, block: int) -> None:
            expected = np.empty(len(view) if block % 64 == 0 else min(16, len(view)),
                                dtype=np.uint8)
            _core.shard_block(expected, seed, block)
            if not np.array_equal(view[:len(expected)], expected):
                raise OSError(5, f"checkpoint {path}: block {block} of rank "
                                 f"{self.comm.Get_rank()} does not hold the bytes written", path)

        blocks, _ = self._blocks(checkpoint, nbytes, check)
        handle = open_shared(self.comm, path, self.hints, MPI.MODE_RDONLY)
        try:
            read = read_rounds(self.comm, handle, blocks, path)
        finally:
            handle.Close()
        return IoStats(bytes=read, files=1, calls=len(blocks),
                       verified=sum(n if k % 64 == 0 else min(16, n)
                                    for k, (_, n, _) in enumerate(blocks)))

