"""checkpoint/folder.py: the checkpoint folder's manifest says which checkpoints are ours;
only those, unchanged, are removed to make way for new ones; anything else is refused by
name and left as it is; a checkpoint is complete in the manifest only once its files are in."""

from __future__ import annotations

import json
import os

import pytest

from dlio_mpi.checkpoint.folder import MANIFEST, CheckpointFolder
from dlio_mpi.errors import UserError


def _checkpoint(root, cid: str, names: tuple[str, ...] = ("model_states-0.pt",)) -> None:
    folder = CheckpointFolder(str(root), "tag1")
    folder.begin(cid, list(names))
    for name in names:
        (root / cid / name).write_bytes(b"x" * 100)
    folder.complete(cid, list(names))


def test_a_checkpoint_is_listed_incomplete_then_complete(tmp_path):
    folder = CheckpointFolder(str(tmp_path), "tag1")
    folder.begin("global_epoch1_step1", ["a.pt"])
    body = json.loads((tmp_path / MANIFEST).read_text())
    assert body["checkpoints"]["global_epoch1_step1"]["complete"] is False
    assert body["checkpoints"]["global_epoch1_step1"]["names"] == ["a.pt"]
    assert body["temporaries"] == ["tag1"]
    (tmp_path / "global_epoch1_step1" / "a.pt").write_bytes(b"abc")
    folder.complete("global_epoch1_step1", ["a.pt"])
    body = json.loads((tmp_path / MANIFEST).read_text())
    assert body["checkpoints"]["global_epoch1_step1"] == {
        "complete": True, "files": {"a.pt": [3, os.lstat(tmp_path / "global_epoch1_step1" /
                                                          "a.pt").st_mtime_ns]}}
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_whole_files_of_a_save_killed_before_its_listing_make_way(tmp_path):
    """A save killed after its files were renamed whole, before the manifest listed them:
    files named as its files, written since it began, are ours; an older file under such a
    name, or a file of another name, is not."""
    cid = "global_epoch1_step1"
    folder = CheckpointFolder(str(tmp_path), "tag1")
    folder.begin(cid, ["model_states-0.pt", "model_states-1.pt"])
    (tmp_path / cid / "model_states-0.pt").write_bytes(b"x" * 100)
    old = tmp_path / cid / "model_states-1.pt"
    old.write_bytes(b"the user's")
    os.utime(old, ns=(0, 0))  # written long before the save began
    again = CheckpointFolder(str(tmp_path), "tag2")
    with pytest.raises(UserError, match=f"{old} was not written by an earlier dlio-mpi run"):
        again.clear([cid])
    old.unlink()
    (tmp_path / cid / "notes.txt").write_text("the user's")
    with pytest.raises(UserError, match="notes.txt was not written by an earlier dlio-mpi"):
        again.clear([cid])
    (tmp_path / cid / "notes.txt").unlink()
    assert again.clear([cid]) == [cid] and not (tmp_path / cid).exists()


def test_a_failed_save_is_abandoned_whole_unless_something_else_is_there(tmp_path):
    cid = "global_epoch1_step1"
    folder = CheckpointFolder(str(tmp_path), "tag1")
    folder.begin(cid, ["model_states-0.pt"])
    (tmp_path / cid / "model_states-0.pt").write_bytes(b"x")
    (tmp_path / cid / "model_states-1.pt.dlio_mpi-tag1.tmp").write_bytes(b"half")
    folder.abandon(cid)
    assert os.listdir(tmp_path) == [MANIFEST]
    assert json.loads((tmp_path / MANIFEST).read_text())["checkpoints"] == {}
    folder.begin(cid, ["model_states-0.pt"])
    (tmp_path / cid / "notes.txt").write_text("the user's")
    folder.abandon(cid)
    assert os.listdir(tmp_path / cid) == ["notes.txt"]  # kept, and the listing with it
    assert json.loads((tmp_path / MANIFEST).read_text())["checkpoints"][cid]["complete"] is \
        False


def test_our_unchanged_checkpoints_and_temporaries_make_way(tmp_path):
    _checkpoint(tmp_path, "global_epoch1_step1")
    (tmp_path / "global_epoch1_step1" / "b.pt.dlio_mpi-tag1.tmp").write_bytes(b"partial")
    removed = CheckpointFolder(str(tmp_path), "tag2").clear(
        ["global_epoch1_step1", "global_epoch1_step2"])
    assert removed == ["global_epoch1_step1"]
    assert sorted(os.listdir(tmp_path)) == [MANIFEST]
    assert json.loads((tmp_path / MANIFEST).read_text())["checkpoints"] == {}


@pytest.mark.parametrize("spoil", ["changed", "foreign file", "foreign folder", "symlink"])
def test_anything_else_is_refused_by_name_and_left_alone(tmp_path, spoil):
    _checkpoint(tmp_path, "global_epoch1_step1")
    target = tmp_path / "global_epoch1_step1"
    if spoil == "changed":
        (target / "model_states-0.pt").write_bytes(b"y" * 101)
    elif spoil == "foreign file":
        (target / "notes.txt").write_text("mine")
    elif spoil == "foreign folder":
        target = tmp_path / "global_epoch1_step2"
        target.mkdir()
    else:
        target = tmp_path / "global_epoch1_step2"
        target.symlink_to(tmp_path / "global_epoch1_step1")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(UserError, match=f"checkpoint.checkpoint_folder: {target}"):
        CheckpointFolder(str(tmp_path), "tag2").clear(
            ["global_epoch1_step1", "global_epoch1_step2"])
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_manifest_that_is_not_ours_is_refused(tmp_path):
    (tmp_path / MANIFEST).write_text('{"tool": "something else"}')
    with pytest.raises(UserError, match="is not dlio-mpi's"):
        CheckpointFolder(str(tmp_path), "t")
