"""checkpoint.layout: file_per_rank: every rank writes its own files of each checkpoint, as
DeepSpeed names them, in <checkpoint_folder>/<checkpoint id>/, and reads them back.

A file is written by the C core (the storage's write_shard: large writes of bytes made a block
ahead by a second thread, O_DIRECT when checkpoint.odirect, fsync when checkpoint.fsync) under
a temporary name of this job's (created with O_EXCL) and renamed to its final name only when
whole (and synced), never over an existing file: a checkpoint a fault interrupted leaves
temporaries, never a file that looks complete. Its bytes are the checkpoint stream of
(checkpoint, rank, file) (fresh in every 4 KiB, unless checkpoint.content asks otherwise), so a
restore checks them without having kept them (the first 64 bytes of every 4 KiB, every 64th
block whole)."""

from __future__ import annotations

import os

from .. import _core
from ..storage import storage_for
from ..storage.ownership import temporary_name
from .content import core_content
from .sizing import RankShard
from .writer import AsyncFile, CheckpointWriter, IoStats, OwnFilesAsync, write_whole


def shard_seed(checkpoint: int, rank: int, file: int) -> int:
    """The seed of one file's bytes: a function of its identity only."""
    return (0xC4 << 56) | (checkpoint & 0xFFFF) << 40 | (rank & 0xFFFFFF) << 16 | file & 0xFFFF


class FilePerRank(OwnFilesAsync, CheckpointWriter):
    """Saves and loads one rank's files of each checkpoint (a checkpoint.CheckpointWriter)."""

    def __init__(self, folder: str, tag: str, odirect: bool, fsync: bool,
                 chunk: int = 0, content=None) -> None:
        self.folder, self.tag = folder, tag
        self.odirect, self.fsync, self.chunk, self.content = odirect, fsync, chunk, content
        self.fs = storage_for(folder)

    def path(self, checkpoint_id: str, name: str) -> str:
        return os.path.join(self.folder, checkpoint_id, name)

    def allocate(self, shard: RankShard) -> None:
        """The C core's two block buffers allocated and touched before the first save."""
        largest = max((n for _, n in shard.files), default=0)
        if largest:
            _core.shard_prepare(_core.shard_chunk(self.chunk, largest))

    def file_names(self, shards) -> list[str]:
        """The files of one checkpoint, given every rank's shard."""
        return [name for shard in shards for name in shard.names]

    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        """Write the files of `shard` (a rank's) of checkpoint number `checkpoint` (folder
        `checkpoint_id`, made by the caller); each appears under its final name only when
        whole."""
        stats = IoStats()
        for index, (name, nbytes) in enumerate(shard.files):
            final = self.path(checkpoint_id, name)
            write_whole(final, self.tag, stats, lambda fd, _, index=index, nbytes=nbytes,
                        final=final:
                        stats.add(self.fs.write_shard(
                            fd, 0, nbytes, shard_seed(checkpoint, shard.rank, index),
                            chunk=self.chunk, odirect=self.odirect, fsync=self.fsync,
                            path=final, content=core_content(self.content, nbytes))))
        return stats

    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        """Read the files of `shard` (this rank's, or another's under recovery_rank_shift)
        back and check them; with O_DIRECT when checkpoint.odirect, else (drop_cache) after
        advising the page cache to drop them."""
        stats, fs = IoStats(), self.fs
        for index, (name, nbytes) in enumerate(shard.files):
            path = self.path(checkpoint_id, name)
            with stats.storage_call():  # a FIFO put in place of a file of ours is refused
                fd = fs.open_read(path, direct=self.odirect)
            try:
                if drop_cache and not self.odirect:
                    with stats.storage_call():
                        fs.drop_cached(fd)
                stats.add(fs.read_shard(fd, 0, nbytes, shard_seed(checkpoint, shard.rank, index),
                                        chunk=self.chunk, verify=1, path=path,
                                        content=core_content(self.content, nbytes)))
            finally:
                with stats.storage_call():
                    fs.close(fd)
        return stats

    # ---- asynchronous saves: each rank its own files, renamed by it when whole
    def async_files(self, checkpoint: int, checkpoint_id: str, shard: RankShard
                    ) -> list[AsyncFile]:
        files = []
        for index, (name, nbytes) in enumerate(shard.files):
            final = self.path(checkpoint_id, name)
            files.append(AsyncFile(shard_seed(checkpoint, shard.rank, index), nbytes, 0,
                                   temporary_name(final, self.tag), final))
        return files

