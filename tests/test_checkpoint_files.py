"""checkpoint/file_per_rank.py: a rank's checkpoint files written whole under their final
(DeepSpeed) names, never over an existing file, read back and checked; a fault mid-file leaves
no file that looks complete. Files live under the work tree (ext4: O_DIRECT works there)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from dlio_mpi.checkpoint.file_per_rank import FilePerRank
from dlio_mpi.checkpoint.sizing import RankShard

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1] / ".pytest_tmp"
FILES = (("zero_pp_rank_0_mp_rank_0_model_states.pt", 3 * MiB + 7),
         ("zero_pp_rank_0_mp_rank_0_optim_states.pt", 5 * MiB))


def shard(rank: int = 0) -> RankShard:
    return RankShard(rank, FILES)


@pytest.fixture
def folder():
    path = ROOT / f"ckpt-{uuid.uuid4().hex[:8]}"
    (path / "global_epoch1_step1").mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("odirect", [False, True])
def test_files_are_written_whole_synced_and_read_back(folder, odirect):
    writer = FilePerRank(str(folder), tag="t1", odirect=odirect, fsync=True, chunk=MiB)
    saved = writer.save(1, "global_epoch1_step1", shard(3))
    assert saved.bytes == sum(n for _, n in FILES) and saved.files == 2
    assert saved.syncs == 2
    names = sorted(os.listdir(folder / "global_epoch1_step1"))
    assert names == sorted(name for name, _ in FILES)  # no temporary left
    for name, nbytes in FILES:
        assert (folder / "global_epoch1_step1" / name).stat().st_size == nbytes
    loaded = writer.load(1, "global_epoch1_step1", shard(3), drop_cache=True)
    assert loaded.bytes == saved.bytes and loaded.verified > 0


def test_another_ranks_or_checkpoints_bytes_do_not_pass_the_check(folder):
    writer = FilePerRank(str(folder), "t", False, False)
    writer.save(1, "global_epoch1_step1", shard(0))
    with pytest.raises(OSError, match="do not hold the bytes written"):
        writer.load(1, "global_epoch1_step1", shard(1))
    with pytest.raises(OSError, match="do not hold the bytes written"):
        writer.load(2, "global_epoch1_step1", shard(0))


def test_an_existing_file_is_never_replaced(folder):
    theirs = folder / "global_epoch1_step1" / FILES[0][0]
    theirs.write_bytes(b"a user's file")
    from dlio_mpi.errors import UserError

    with pytest.raises(UserError, match=f"{theirs} appeared .* left as it is"):
        FilePerRank(str(folder), "t", False, True).save(1, "global_epoch1_step1", shard())
    assert theirs.read_bytes() == b"a user's file"
    assert [n for n in os.listdir(theirs.parent) if n.endswith(".tmp")] == []


def test_a_write_failing_midway_leaves_no_file_that_looks_complete(folder, monkeypatch):
    import dlio_mpi.checkpoint.file_per_rank as module

    def failing(fd, offset, nbytes, seed, *args, **options):
        os.write(fd, b"x" * 4096)  # part of the file, then the fault
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module._core, "write_shard", failing)
    with pytest.raises(OSError, match="No space"):
        FilePerRank(str(folder), "t", False, True).save(1, "global_epoch1_step1", shard())
    assert os.listdir(folder / "global_epoch1_step1") == []
