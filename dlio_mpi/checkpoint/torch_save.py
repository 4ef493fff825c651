"""checkpoint.checkpoint_mechanism: pt_save: every rank writes its own files of each
checkpoint, as DeepSpeed names them, in <checkpoint_folder>/<checkpoint id>/, with a real
torch.save of a state dict per file, and reads them back with torch.load (framework fidelity:
the container, the pickling and the call pattern of the DLIO benchmark's PyTorch
checkpointing, not just the bytes).

As DLIO does, a rank's tensors are allocated once (at its first save, or by `allocate` before
it) and kept for the whole run: a rank holds its whole checkpoint share in memory throughout
the run, and a load holds one file's tensors besides while it checks them (`memory_needed`).
A file's state dict is uint8 tensors "t0", "t1", ... of at most 1 GiB each, totalling the
file's payload bytes; their bytes are the checkpoint stream of shard_seed(checkpoint, rank,
file) (_core.ckpt_fill, what file_per_rank writes), made again in place before each save (as
training changes the weights; DLIO writes the same tensors every time, which deduplicating
storage would store once; the making is the emulator's time, reported apart), so that a
restore checks them without having kept them (the first 64 bytes of every 4 KiB, every 64th
4 KiB whole).

A file is written under a temporary name of this job's (created with O_EXCL), flushed, synced
when checkpoint.fsync, and renamed to its final name only when whole, never over an existing
file: a save a fault interrupts leaves no file that looks complete. torch is imported by this
module only (checkpoint/checkpointer.py imports it when pt_save is chosen)."""

from __future__ import annotations

import errno
import os

import torch

from .. import _core
from ..errors import raise_if_stopped
from ..storage import storage_for
from ..storage.ownership import temporary_name
from .content import core_content
from .file_per_rank import shard_seed
from .sizing import RankShard
from .writer import WHOLE_EVERY, CheckpointWriter, IoStats

BLOCK = 64 << 20  # bytes per check unit
TENSOR = 1 << 30  # bytes per tensor at most (a whole number of blocks)


def memory_needed(bytes_per_rank: int, local_ranks: int) -> int:
    """Bytes this writer holds on a node of `local_ranks` ranks writing `bytes_per_rank` each,
    at most: each rank's tensors (its share, kept all run) plus, while a load checks them,
    one file's loaded tensors (a file is at most the share)."""
    return 2 * bytes_per_rank * local_ranks


def _tensor_sizes(nbytes: int) -> list[int]:
    """The bytes of each tensor of a file of `nbytes` payload bytes."""
    return [min(TENSOR, nbytes - start) for start in range(0, nbytes, TENSOR)]


def _keys(nbytes: int) -> list[str]:
    return [f"t{j}" for j in range(len(_tensor_sizes(nbytes)))]


class TorchSave(CheckpointWriter):
    """Saves and loads one rank's files of each checkpoint with torch.save / torch.load (a
    checkpoint.CheckpointWriter)."""

    def __init__(self, folder: str, tag: str, fsync: bool,
                 content=None) -> None:
        self.folder, self.tag, self.fsync, self.content = folder, tag, fsync, content
        self.fs = storage_for(folder)
        # (rank, file index, bytes) -> that file's state dict, allocated once per run
        self._states: dict[tuple[int, int, int], dict[str, torch.Tensor]] = {}
        self._filled: dict[tuple[int, int, int], int] = {}  # the seed each was filled with

    def path(self, checkpoint_id: str, name: str) -> str:
        return os.path.join(self.folder, checkpoint_id, name)

    def file_names(self, shards) -> list[str]:
        """The files of one checkpoint, given every rank's shard."""
        return [name for shard in shards for name in shard.names]

    # ------------------------------------------------------------------ the tensors
    def state(self, shard: RankShard, index: int, checkpoint: int = 0
              ) -> dict[str, torch.Tensor]:
        """The state dict of file `index` of `shard` holding checkpoint `checkpoint`'s bytes:
        allocated at the first call, the same tensors refilled in place at later ones."""
        nbytes = shard.files[index][1]
        key = (shard.rank, index, nbytes)
        state = self._states.get(key)
        if state is None:
            state = {name: torch.empty(size, dtype=torch.uint8)
                     for name, size in zip(_keys(nbytes), _tensor_sizes(nbytes))}
            self._states[key] = state
        seed = shard_seed(checkpoint, shard.rank, index)
        if self._filled.get(key) != seed:
            for j, tensor in enumerate(state.values()):
                _core.ckpt_fill(tensor.numpy(), seed, j * TENSOR,
                                core_content(self.content, nbytes))
            self._filled[key] = seed
        return state

    def allocate(self, shard: RankShard) -> None:
        """Allocate and fill the tensors of `shard`'s files now (a save refills them with its
        own bytes), before the first save is timed, as DLIO allocates them at start."""
        for index in range(len(shard.files)):
            self.state(shard, index)

    # ------------------------------------------------------------------ save and load
    def save(self, checkpoint: int, checkpoint_id: str, shard: RankShard) -> IoStats:
        """Write the files of `shard` (a rank's) of checkpoint `checkpoint_id` (folder made by
        the caller) with torch.save; each appears under its final name only when whole (and
        synced when fsync). The tensors are refilled with `checkpoint`'s bytes first (the
        emulator's time)."""
        stats = IoStats()
        for index, (name, nbytes) in enumerate(shard.files):
            raise_if_stopped()  # torch.save writes a file whole: a stop ends the save here
            began = _core.now_ns()
            state = self.state(shard, index, checkpoint)
            stats.emulator_ns += _core.now_ns() - began
            self._save_file(state, self.path(checkpoint_id, name), stats)
            stats.bytes += nbytes
            stats.files += 1
            stats.calls += 1
        return stats

    def _save_file(self, state: dict[str, torch.Tensor], final: str, stats: IoStats) -> None:
        """torch.save of `state` into a file object on `final`'s temporary (created
        exclusively), flushed, synced when fsync, renamed to `final` when whole, never over a
        file; on any failure the temporary removed."""
        fs, tmp = self.fs, temporary_name(final, self.tag)
        with stats.storage_call():
            fd = fs.create_exclusive(tmp)
        try:
            try:
                with fs.file_object(fd, "wb") as fp:
                    try:  # the framework's call, timed as the storage's (its pickling too)
                        with stats.storage_call():
                            torch.save(state, fp)
                            fp.flush()
                    except RuntimeError as exc:  # torch's own failures: an I/O error here
                        raise OSError(errno.EIO, f"torch.save {final}: {exc}", final) \
                            from exc
                    if self.fsync:
                        started = _core.now_ns()
                        fs.sync(fd)
                        stats.sync_ns += _core.now_ns() - started
                        stats.syncs += 1
            finally:
                fs.close(fd)  # the file object had a descriptor of its own
            with stats.storage_call():
                fs.rename_noreplace(tmp, final)  # refused if a file is there: not ours
        except BaseException:
            fs.remove_quietly([tmp])
            raise

    def load(self, checkpoint: int, checkpoint_id: str, shard: RankShard,
             drop_cache: bool = False) -> IoStats:
        """Read the files of `shard` (this rank's, or another's under recovery_rank_shift)
        back with torch.load and check them (their bytes in total, the first 64 bytes of every
        4 KiB, every 64th 4 KiB whole); `drop_cache`: advise the page cache to drop each file
        first. OSError (EIO) naming the file when one does not hold what was written."""
        stats, fs = IoStats(), self.fs
        for index, (name, nbytes) in enumerate(shard.files):
            raise_if_stopped()
            path = self.path(checkpoint_id, name)
            with stats.storage_call():  # a FIFO put in place of a file of ours is refused
                fd = fs.open_read(path)
            try:
                state = self._load_file(fs, fd, path, drop_cache, stats)
            finally:
                fs.close(fd)  # the file object had a descriptor of its own
            began = _core.now_ns()
            stats.verified += _check(state, path, nbytes, shard.rank,
                                     shard_seed(checkpoint, shard.rank, index),
                                     core_content(self.content, nbytes))
            stats.emulator_ns += _core.now_ns() - began
            del state  # the loaded tensors go before the next file is read
            stats.bytes += nbytes
            stats.files += 1
            stats.calls += 1
        return stats

    @staticmethod
    def _load_file(fs, fd, path: str, drop_cache: bool, stats: IoStats) -> dict:
        """torch.load of the file open on `fd`, through a file object of its own; a file that
        is not a torch.save file, or a damaged one, is an OSError (EIO) naming it."""
        with fs.file_object(fd, "rb") as fp:
            if drop_cache:
                with stats.storage_call():
                    fs.drop_cached(fd)
            try:  # the framework's call, timed as the storage's (its unpickling too)
                with stats.storage_call():
                    return torch.load(fp, map_location="cpu", weights_only=True)
            except OSError:
                raise
            except Exception as exc:  # not a torch.save file, or a damaged one
                raise OSError(errno.EIO, f"checkpoint {path}: torch.load cannot read it "
                              f"({type(exc).__name__}: {exc})", path) from exc


def _check(state, path: str, nbytes: int, rank: int, seed: int,
           content: tuple[int, int] | None) -> int:
    """Check a loaded state dict against what `save` wrote; returns the bytes compared."""
    keys, sizes = _keys(nbytes), _tensor_sizes(nbytes)
    if not isinstance(state, dict) or list(state) != keys or not all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            for t in state.values()):
        raise OSError(errno.EIO, f"checkpoint {path}: not the state dict written (uint8 "
                      f"tensors {', '.join(keys) or 'none'})", path)
    held = sum(t.numel() for t in state.values())
    if held != nbytes or [t.numel() for t in state.values()] != sizes:
        raise OSError(errno.EIO, f"checkpoint {path}: its tensors hold {held:,} bytes, "
                      f"expected {nbytes:,}", path)
    verified = 0
    for j, tensor in enumerate(state.values()):
        view = tensor.contiguous().numpy()
        for start in range(0, len(view), BLOCK):
            got = view[start:start + BLOCK]
            bad, compared = _core.ckpt_check(got, seed, j * TENSOR + start, content,
                                             WHOLE_EVERY)
            if bad >= 0:
                raise OSError(errno.EIO, f"checkpoint {path}: the 4 KiB at payload offset "
                              f"{j * TENSOR + start + bad} (rank {rank}) do not hold the bytes "
                              "written", path)
            verified += compared
    return verified
