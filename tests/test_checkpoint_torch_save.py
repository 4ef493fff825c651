"""checkpoint/torch_save.py (pt_save): a rank's checkpoint files written with a real torch.save
whole under their final (DeepSpeed) names, never over an existing file, from tensors allocated
once per run; read back with torch.load and checked; a fault mid-file leaves no file that looks
complete. Files live under the work tree."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import dlio_mpi.checkpoint.torch_save as module  # noqa: E402 (it imports torch)
from dlio_mpi.checkpoint.sizing import RankShard  # noqa: E402
from dlio_mpi.checkpoint.torch_save import TorchSave, memory_needed  # noqa: E402
from dlio_mpi.errors import UserError  # noqa: E402
from helpers import ckpt_stream  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
ROOT = Path(__file__).resolve().parents[1] / ".pytest_tmp"
CID = "global_epoch1_step1"
FILES = (("zero_pp_rank_0_mp_rank_0_model_states.pt", 3 * MiB + 7),
         ("zero_pp_rank_0_mp_rank_0_optim_states.pt", 5 * MiB))
SHARD = RankShard(0, FILES)


@pytest.fixture
def folder():
    path = ROOT / f"ckpt-{uuid.uuid4().hex[:8]}"
    (path / CID).mkdir(parents=True)
    (path / "global_epoch2_step2").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def small_blocks(monkeypatch):
    """64 KiB blocks and 1 MiB tensors: several tensors per file and a 64th block checked
    whole, at test sizes."""
    monkeypatch.setattr(module, "BLOCK", 64 * KiB)
    monkeypatch.setattr(module, "TENSOR", MiB)


def listing(folder: Path, cid: str = CID) -> list[str]:
    return sorted(os.listdir(folder / cid))


@pytest.mark.parametrize("blocks", ["default", "small"])
def test_files_are_written_whole_loadable_by_torch_and_read_back(folder, blocks, request):
    if blocks == "small":
        request.getfixturevalue("small_blocks")
    writer = TorchSave(str(folder), "t1", fsync=True)
    saved = writer.save(1, CID, SHARD)
    assert (saved.bytes, saved.files, saved.calls) == (SHARD.nbytes, 2, 2)
    assert listing(folder) == sorted(SHARD.names)  # no temporary left
    for index, (name, nbytes) in enumerate(FILES):
        path = folder / CID / name
        overhead = path.stat().st_size - nbytes
        assert 0 < overhead < 16 * KiB  # the payload plus torch.save's container
        state = torch.load(path, weights_only=True)  # plain torch reads it
        sizes = module._tensor_sizes(nbytes)
        assert list(state) == [f"t{j}" for j in range(len(sizes))]
        assert [t.numel() for t in state.values()] == sizes
        assert all(t.dtype == torch.uint8 for t in state.values())
        held = writer.state(SHARD, index, 1)
        assert all(torch.equal(state[k], held[k]) for k in state)
    if blocks == "small":
        assert len(module._tensor_sizes(FILES[1][1])) == 5  # 1 MiB tensors
    loaded = writer.load(1, CID, SHARD, drop_cache=True)
    assert (loaded.bytes, loaded.files, loaded.calls) == (SHARD.nbytes, 2, 2)
    expected = 0
    for _, nbytes in FILES:  # every granule's first 64 bytes, every 64th granule whole
        for at in range(0, nbytes, 4096):
            n = min(4096, nbytes - at)
            expected += n if at // 4096 % 64 == 0 else min(n, 64)
    assert loaded.verified == expected
    # another reader of the same files (a rank restoring this rank's share) checks them too
    assert TorchSave(str(folder), "t2", False).load(1, CID, SHARD).verified == expected


def test_the_same_tensors_hold_each_checkpoints_own_bytes(folder, monkeypatch):
    """Allocated once (as DLIO), refilled in place before each save: no two checkpoints'
    files hold the same bytes (DLIO's would, and deduplicating storage would store them once),
    and the refill is counted as the emulator's time."""
    writer = TorchSave(str(folder), "t", fsync=False)
    saved = writer.save(1, CID, SHARD)
    first = [writer.state(SHARD, i, 1) for i in range(len(FILES))]
    pointers = [[t.data_ptr() for t in state.values()] for state in first]
    allocations = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty",
                        lambda *a, **k: allocations.append(a) or real_empty(*a, **k))
    again = writer.save(2, "global_epoch2_step2", SHARD)
    assert allocations == []  # no second allocation
    assert saved.emulator_ns > 0 and again.emulator_ns > 0
    second = [writer.state(SHARD, i, 2) for i in range(len(FILES))]
    assert all(a is b for a, b in zip(first, second))
    assert [[t.data_ptr() for t in state.values()] for state in second] == pointers
    for index, (name, _) in enumerate(FILES):
        one = torch.load(folder / CID / name, weights_only=True)
        two = torch.load(folder / "global_epoch2_step2" / name, weights_only=True)
        assert not any(torch.equal(one[k], two[k]) for k in one)
        assert bytes(one["t0"][:4096].numpy()) == ckpt_stream(
            module.shard_seed(1, 0, index), 0, 4096)
    assert writer.load(2, "global_epoch2_step2", SHARD).bytes == SHARD.nbytes
    assert writer.load(1, CID, SHARD).bytes == SHARD.nbytes  # each checked with its own


def test_allocate_fills_the_tensors_before_the_first_save(folder, monkeypatch):
    writer = TorchSave(str(folder), "t", fsync=False)
    writer.allocate(SHARD)
    held = [writer.state(SHARD, i) for i in range(len(FILES))]
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated again"))
    writer.save(1, CID, SHARD)
    assert all(writer.state(SHARD, i) is held[i] for i in range(len(FILES)))


@pytest.mark.parametrize("fsync", [False, True])
def test_syncs_are_counted(folder, fsync):
    saved = TorchSave(str(folder), "t", fsync=fsync).save(1, CID, SHARD)
    assert saved.syncs == (len(FILES) if fsync else 0)
    assert (saved.sync_ns > 0) == fsync


def test_another_ranks_or_changed_bytes_do_not_pass_the_check(folder, small_blocks):
    TorchSave(str(folder), "t", False).save(1, CID, SHARD)
    other = RankShard(1, FILES)
    with pytest.raises(OSError, match=r"the 4 KiB at payload offset 0 \(rank 1\) do not hold "
                                      "the bytes written"):
        TorchSave(str(folder), "t", False).load(1, CID, other)
    # a byte changed in the head of a granule of block 3 (of the first tensor) of the file
    path = folder / CID / FILES[0][0]
    raw = bytearray(path.read_bytes())
    head = ckpt_stream(module.shard_seed(1, 0, 0), 3 * 64 * KiB + 8192, 64)
    at = raw.index(head)
    raw[at + 5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(OSError, match=rf"checkpoint {path}: the 4 KiB at payload offset "
                                      rf"{3 * 64 * KiB + 8192} \(rank 0\) do not hold the bytes "
                                      "written") as caught:
        TorchSave(str(folder), "t", False).load(1, CID, SHARD)
    assert caught.value.errno == 5 and caught.value.filename == str(path)


def test_a_file_of_other_tensors_or_not_torchs_does_not_pass_the_check(folder):
    TorchSave(str(folder), "t", False).save(1, CID, SHARD)
    path = folder / CID / FILES[0][0]
    path.unlink()
    torch.save({"t0": torch.zeros(FILES[0][1] - 1, dtype=torch.uint8)}, path)
    with pytest.raises(OSError, match="its tensors hold 3,145,734 bytes, expected 3,145,735"):
        TorchSave(str(folder), "t", False).load(1, CID, SHARD)
    path.unlink()
    torch.save({"weights": torch.zeros(4)}, path)
    with pytest.raises(OSError, match="not the state dict written"):
        TorchSave(str(folder), "t", False).load(1, CID, SHARD)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(OSError, match=f"checkpoint {path}: torch.load cannot read it"):
        TorchSave(str(folder), "t", False).load(1, CID, SHARD)
    path.unlink()
    os.mkfifo(path)  # cannot block the open
    with pytest.raises(OSError, match="not a regular file"):
        TorchSave(str(folder), "t", False).load(1, CID, SHARD)


def test_an_existing_file_is_never_replaced(folder):
    theirs = folder / CID / FILES[0][0]
    theirs.write_bytes(b"a user's file")
    with pytest.raises(UserError, match=f"{theirs} appeared .* left as it is"):
        TorchSave(str(folder), "t", True).save(1, CID, SHARD)
    assert theirs.read_bytes() == b"a user's file"
    assert listing(folder) == [FILES[0][0]]  # no temporary left


def test_a_temporary_in_the_way_is_refused_and_left(folder):
    from dlio_mpi.storage.ownership import temporary_name

    tmp = temporary_name(str(folder / CID / FILES[0][0]), "t")
    Path(tmp).write_bytes(b"whoever's")
    with pytest.raises(UserError, match="exists and is not dlio-mpi's"):
        TorchSave(str(folder), "t", False).save(1, CID, SHARD)
    assert Path(tmp).read_bytes() == b"whoever's"


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"),
                                   RuntimeError("PytorchStreamWriter failed writing file")])
def test_a_save_failing_midway_leaves_no_file_that_looks_complete(folder, monkeypatch, fault):
    def failing(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04" + b"x" * 4096)  # part of the file, then the fault
        raise fault

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(OSError, match="No space|PytorchStreamWriter") as caught:
        TorchSave(str(folder), "t", True).save(1, CID, SHARD)
    if isinstance(fault, RuntimeError):  # torch's own failures reach the caller as OSError
        assert caught.value.errno == 5 and caught.value.filename.endswith(FILES[0][0])
    assert listing(folder) == []


def test_a_fault_on_a_later_file_leaves_the_earlier_ones_whole(folder, monkeypatch):
    real_save, calls = torch.save, []

    def second_fails(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            f.write(b"x" * 100)
            raise OSError(5, "Input/output error")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", second_fails)
    with pytest.raises(OSError, match="Input/output error"):
        TorchSave(str(folder), "t", False).save(1, CID, SHARD)
    assert listing(folder) == [FILES[0][0]]
    first = RankShard(0, FILES[:1])
    assert TorchSave(str(folder), "t", False).load(1, CID, first).bytes == FILES[0][1]


def test_file_names_and_memory():
    shards = [SHARD, RankShard(1, (("zero_pp_rank_1_mp_rank_0_optim_states.pt", 10),)),
              RankShard(2, ())]
    assert TorchSave("/nowhere", "t", False).file_names(shards) == \
        [*SHARD.names, "zero_pp_rank_1_mp_rank_0_optim_states.pt"]
    assert TorchSave.collective is False
    assert memory_needed(3 * MiB, 4) == 2 * 3 * MiB * 4
