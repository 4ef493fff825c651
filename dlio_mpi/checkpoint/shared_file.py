"""checkpoint.layout: shared: one file per checkpoint, each rank's bytes at its offset (the
ranks' shares back to back in rank order), written and read back collectively through MPI-IO
(mpi/write_rounds.py: one Write_at_all / Read_at_all per round of blocks), with the checkpoint's
MPI-IO hints given at the collective open.

The file is created collectively under a temporary name of this job's with MODE_EXCL (so that
MPI-IO striping hints act at its creation and no file in the way is ever written), synced with
File.Sync when checkpoint.fsync, and renamed by rank 0 to its final name only when every rank's
bytes are in, never over an existing file. A rank's bytes are the checkpoint shard of its
(checkpoint, rank) seed, as file_per_rank writes them, so a restore checks them the same way.

With checkpoint.odirect (ROMIO's UFS driver has no direct I/O), the file is still created
collectively through MPI-IO, but each rank writes and reads its share itself with the C core's
O_DIRECT pwrite/pread (fsync per rank), at an offset rounded up to ALIGN (so that no two ranks
share a stripe or a block: IOR's POSIX shared-file mode)."""

from __future__ import annotations

import os

import numpy as np

from .. import _core
from ..errors import check_all, on_root
from ..mpi.write_rounds import mpiio_call, open_shared, read_rounds, write_rounds
from ..storage import Handle, storage_for
from ..storage.ownership import temporary_name
from .content import core_content
from .file_per_rank import shard_seed
from .sizing import EXTENSION, RankShard
from .writer import WHOLE_EVERY, AsyncFile, CheckpointWriter, IoStats, close_async_files

CHUNK = 64 << 20  # bytes per rank and round
ALIGN = 1 << 20  # a rank's share starts at a multiple of this with O_DIRECT
NAME = f"shared_model_optim_states.{EXTENSION}"  # the one file of a checkpoint


class SharedFile(CheckpointWriter):
    """Saves and loads the ranks' shares of each checkpoint in one file, collectively (a
    checkpoint.CheckpointWriter). `sizes[r]`: the bytes rank r writes; rank r's share starts
    where rank r - 1's ends."""

    collective = True

    def __init__(self, comm, folder: str, tag: str, fsync: bool, hints: dict[str, str],
                 sizes: list[int], chunk: int = CHUNK, odirect: bool = False,
                 content=None) -> None:
        self.comm, self.folder, self.tag = comm, folder, tag
        self.fsync, self.hints, self.chunk, self.odirect = fsync, dict(hints), chunk, odirect
        self.content, self.fs = content, storage_for(folder)
        align = ALIGN if odirect else 1
        spans = [-(-n // align) * align for n in sizes]
        self.starts = [0, *np.cumsum(spans, dtype=np.int64).tolist()][:len(sizes)]

    def allocate(self, shard: RankShard) -> None:
        """With O_DIRECT (the C core's writes), its two block buffers allocated and touched
        before the first save."""
        if self.odirect and shard.nbytes:
            _core.shard_prepare(_core.shard_chunk(self.chunk, shard.nbytes))

    def file_names(self, shards) -> list[str]:
        return [NAME]

    def _blocks(self, checkpoint: int, shard: RankShard, act, stats: IoStats) -> list:
        """The blocks of `shard` (offset in the file, bytes, a call of act(view, seed, block,
        offset in the share) timed as the emulator's in `stats`)."""
        start, nbytes = self.starts[shard.rank], shard.nbytes
        seed, chunk = shard_seed(checkpoint, shard.rank, 0), self.chunk

        def timed(view: np.ndarray, k: int) -> None:
            began = _core.now_ns()
            try:
                act(view, seed, k, k * chunk)
            finally:
                stats.emulator_ns += _core.now_ns() - began

        return [(start + k * chunk, min(chunk, nbytes - k * chunk),
                 lambda view, k=k: timed(view, k))
                for k in range(-(-nbytes // chunk))]

    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        """Write this rank's `shard` of checkpoint number `checkpoint` into the shared file in
        the folder `checkpoint_id` (made by the caller); collective."""
        from mpi4py import MPI

        final = os.path.join(self.folder, checkpoint_id, NAME)
        tmp = self.comm.bcast(temporary_name(final, self.tag), root=0)
        stats = IoStats(files=0 if self.odirect else 1)  # IoStats.add counts the file
        content = core_content(self.content, shard.nbytes)
        blocks = self._blocks(checkpoint, shard, lambda view, seed, k, at: _core.ckpt_fill(
            view, seed, at, content), stats)
        with stats.storage_call():
            handle = open_shared(self.comm, tmp, self.hints,
                                 MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL)
        try:
            if self.odirect:
                stats.add(check_all(self.comm, lambda: self._own_handle(
                    self.fs.open_write(tmp), lambda fd: self.fs.write_shard(
                        fd, self.starts[shard.rank], shard.nbytes,
                        shard_seed(checkpoint, shard.rank, 0), chunk=self.chunk, odirect=True,
                        fsync=self.fsync, path=tmp, content=content))))
            else:
                began = _core.now_ns()
                stats.bytes = write_rounds(self.comm, handle, blocks, tmp)
                stats.io_ns += _core.now_ns() - began - stats.emulator_ns  # less the fills
                stats.calls = len(blocks)
            if self.fsync and not self.odirect:
                started = _core.now_ns()
                check_all(self.comm, lambda: mpiio_call(handle.Sync, "sync", tmp))
                stats.syncs, stats.sync_ns = 1, _core.now_ns() - started
        except BaseException:
            handle.Close()
            if self.comm.Get_rank() == 0:
                self.fs.remove_quietly([tmp])
            raise
        with stats.storage_call():
            handle.Close()

        def complete() -> None:
            try:
                with stats.storage_call():
                    self.fs.rename_noreplace(tmp, final)  # refused if a file is there: not ours
            except BaseException:
                self.fs.remove_quietly([tmp])
                raise

        on_root(self.comm, complete)
        return stats

    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        """Read `shard`'s share (this rank's, or another's under recovery_rank_shift) back
        collectively and check it (the first 64 bytes of every 4 KiB, every 64th 4 KiB whole);
        `drop_cache`: advise the page cache to drop the file first."""
        from mpi4py import MPI

        path = os.path.join(self.folder, checkpoint_id, NAME)
        stats = IoStats(files=0 if self.odirect else 1)  # IoStats.add counts the file
        content = core_content(self.content, shard.nbytes)
        if drop_cache:
            with stats.storage_call():
                check_all(self.comm, lambda: self._own_handle(self.fs.open_read(path),
                                                              self.fs.drop_cached))

        def check(view: np.ndarray, seed: int, block: int, at: int) -> None:
            bad, compared = _core.ckpt_check(view, seed, at, content, WHOLE_EVERY)
            stats.verified += compared
            if bad >= 0:
                raise OSError(5, f"checkpoint {path}: the 4 KiB at offset "
                                 f"{self.starts[shard.rank] + at + bad} (rank {shard.rank}'s "
                                 "share) do not hold the bytes written", path)

        if self.odirect:
            stats.add(check_all(self.comm, lambda: self._own_handle(
                self.fs.open_read(path, direct=True), lambda fd: self.fs.read_shard(
                    fd, self.starts[shard.rank], shard.nbytes,
                    shard_seed(checkpoint, shard.rank, 0), chunk=self.chunk, verify=1,
                    path=path, content=content))))
            return stats
        blocks = self._blocks(checkpoint, shard, check, stats)
        with stats.storage_call():
            handle = open_shared(self.comm, path, self.hints, MPI.MODE_RDONLY)
        try:
            began = _core.now_ns()
            stats.bytes = read_rounds(self.comm, handle, blocks, path)
            stats.io_ns += _core.now_ns() - began - stats.emulator_ns  # less the checks
        finally:
            with stats.storage_call():
                handle.Close()
        stats.calls = len(blocks)
        return stats

    # ---- asynchronous saves: created collectively, each rank writing its share at its
    # offset on its own descriptor (as with O_DIRECT: MPI-IO from a second thread is unsafe
    # under Open MPI), renamed by rank 0 when every rank's share is in
    def async_files(self, checkpoint: int, checkpoint_id: str, shard: RankShard
                    ) -> list[AsyncFile]:
        final = os.path.join(self.folder, checkpoint_id, NAME)
        return [AsyncFile(shard_seed(checkpoint, shard.rank, 0), shard.nbytes,
                          self.starts[shard.rank], temporary_name(final, self.tag), final)]

    def open_async(self, files: list[AsyncFile]) -> None:
        from mpi4py import MPI

        (f,) = files
        open_shared(self.comm, f.tmp, self.hints,
                    MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL).Close()
        f.fd = self.fs.open_write(f.tmp)

    def close_async(self, files: list[AsyncFile]) -> None:
        close_async_files(files)

    def publish_async(self, files: list[AsyncFile]) -> None:
        (f,) = files

        def complete() -> None:
            try:
                self.fs.rename_noreplace(f.tmp, f.final)  # refused if a file is there: not ours
            except BaseException:
                self.fs.remove_quietly([f.tmp])
                raise

        on_root(self.comm, complete)

    def discard_async(self, files: list[AsyncFile]) -> None:
        self.close_async(files)
        self.comm.Barrier()
        if self.comm.Get_rank() == 0:
            self.fs.remove_quietly([f.tmp for f in files])

    def _own_handle(self, handle: Handle, move):
        """move(handle) on this rank's own handle of the shared file, closed after."""
        try:
            return move(handle)
        finally:
            self.fs.close(handle)
