"""checkpoint.drain under mpiexec -n 2 and -n 3, in-process: every checkpoint, once complete on
the fast tier, is copied to drain.to byte for byte (both layouts, with and without O_DIRECT,
synchronous and asynchronous saves), listed complete there, and restored from there with
restore_from: pfs; drain.keep leaves the fast tier the checkpoints it says; what is in
drain.to's way and not ours is refused before any I/O."""

from __future__ import annotations

import json
import os

import pytest

from helpers import file_digests

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

MiB = 2**20
IDS = ["global_epoch1_step1", "global_epoch1_step2", "global_epoch1_step3"]


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _run(folder, drain: str, reads: int = 0, **values):
    """A checkpoint-only run: 3 saves of a few MiB (ZeRO 3: every rank writes a share of a
    length that is no multiple of a page), drained to folder/pfs, then `reads` restores."""
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {"workflow.train": "false", "workflow.generate_data": "false",
                "workflow.checkpoint": "true", "model.model_size_bytes": 3 * MiB + 12345,
                "model.parallelism.zero_stage": 3,
                "checkpoint.checkpoint_folder": str(folder / "fast"),
                "checkpoint.drain": f"{{to: {folder / 'pfs'}, {drain}}}",
                "output.folder": str(folder / "out"), "checkpoint.num_checkpoints_write": 3,
                "checkpoint.num_checkpoints_read": reads,
                "checkpoint.time_between_checkpoints": 0.1, **values}
    cfg = load_config("demo", [f"{k}={v}" for k, v in settings.items()])
    return run(_comm(), cfg)


def _complete(folder) -> dict[str, bool]:
    body = json.loads((folder / "dlio_mpi_checkpoints.json").read_text())
    return {cid: entry["complete"] for cid, entry in body["checkpoints"].items()}


@pytest.mark.parametrize(("layout", "odirect", "asynchronous"), [
    ("file_per_rank", False, False), ("file_per_rank", True, True),
    ("shared", False, True), ("shared", True, False)])
def test_every_checkpoint_is_drained_byte_for_byte(shared_tmp, layout, odirect, asynchronous):
    comm = _comm()
    summary = _run(shared_tmp, f"odirect: {str(odirect).lower()}",
                   **{"checkpoint.layout": layout,
                      "checkpoint.async_write": str(asynchronous).lower()})
    comm.Barrier()
    fast, pfs = file_digests(shared_tmp / "fast"), file_digests(shared_tmp / "pfs")
    assert fast and pfs == fast  # keep: all
    assert {f.split(os.sep)[0] for f in pfs} == set(IDS)
    assert _complete(shared_tmp / "pfs") == dict.fromkeys(IDS, True)
    assert _complete(shared_tmp / "fast") == dict.fromkeys(IDS, True)
    records = summary["dlio_mpi"]["checkpoint"]["records"]
    saves = {r["checkpoint_id"]: r for r in records if r["kind"] == "save"}
    drains = {r["checkpoint_id"]: r for r in records if r["kind"] == "drain"}
    assert sorted(drains) == IDS
    for cid, drain in drains.items():
        if layout == "shared":  # the whole file, with the gaps between aligned shares
            size = os.path.getsize(shared_tmp / "fast" / cid / "shared_model_optim_states.pt")
            assert drain["bytes"] == size >= saves[cid]["bytes"]
        else:
            assert drain["bytes"] == saves[cid]["bytes"]  # every rank's files, once
        assert drain["drain"]["complete"] and drain["drain"]["to"].endswith(cid)
        # durable after the save's own time and the copy's
        assert drain["drain"]["durable_seconds"] >= drain["duration_seconds"]
        assert drain["syncs"] == comm.size  # each rank syncs its copy
    described = summary["dlio_mpi"]["checkpoint"]["drain"]
    assert described["drained"] == 3 and described["GiB_per_second_mean"] > 0


@pytest.mark.parametrize(("keep", "left", "layout", "asynchronous"), [
    ("last", IDS[-1:], "file_per_rank", False), ("none", [], "file_per_rank", True),
    ("last", IDS[-1:], "shared", False),
    ("none", [], "shared", True)])  # crashed at the restore (issue 30, finding 2)
def test_keep_leaves_the_fast_tier_what_it_says_and_restores_read_the_drained(
        shared_tmp, keep, left, layout, asynchronous):
    comm = _comm()
    summary = _run(shared_tmp, f"keep: {keep}, restore_from: pfs", reads=2,
                   **{"checkpoint.layout": layout,
                      "checkpoint.async_write": str(asynchronous).lower()})
    comm.Barrier()
    assert sorted(e for e in os.listdir(shared_tmp / "fast") if e.startswith("global")) == left
    assert sorted(_complete(shared_tmp / "fast")) == left
    assert _complete(shared_tmp / "pfs") == dict.fromkeys(IDS, True)
    loads = [r for r in summary["dlio_mpi"]["checkpoint"]["records"] if r["kind"] == "load"]
    assert [r["checkpoint_id"] for r in loads] == IDS[:2]  # read, and checked, from pfs
    assert all(r["bytes"] > 0 for r in loads)


def test_what_is_in_drain_to_s_way_and_not_ours_is_refused_before_any_io(shared_tmp):
    from dlio_mpi.errors import JobError

    comm = _comm()
    if comm.rank == 0:
        os.makedirs(shared_tmp / "pfs" / IDS[1])
        (shared_tmp / "pfs" / IDS[1] / "mine").write_text("the user's")
    comm.Barrier()
    with pytest.raises(JobError, match=f"^checkpoint.drain.to: {shared_tmp / 'pfs' / IDS[1]}"):
        _run(shared_tmp, "keep: all")  # named by its own key (issue 30, finding 11)
    assert not (shared_tmp / "fast").exists()  # nothing written on either tier
    assert sorted(os.listdir(shared_tmp / "pfs")) == [IDS[1]]
    assert (shared_tmp / "pfs" / IDS[1] / "mine").read_text() == "the user's"


@pytest.mark.parametrize("layout", ["file_per_rank", "shared"])
def test_a_rank_failing_mid_drain_ends_the_job_and_nothing_drained_looks_complete(
        shared_tmp, monkeypatch, layout):
    """The last rank's copy fails half-way (an I/O error, injected): every rank ends with
    the agreed error, no temporary of the drain stays, drain.to lists no checkpoint complete,
    and the fast tier keeps its checkpoints complete."""
    import errno

    from dlio_mpi.checkpoint.drain import Drainer
    from dlio_mpi.errors import JobError

    comm = _comm()
    if comm.rank == comm.size - 1:
        def half_then_fail(self, copier, piece, job) -> bool:
            with open(piece.tmp, "ab") as fp:  # part of the bytes, as a disk failing mid-way
                fp.write(b"\0" * 4096)
            raise OSError(errno.EIO, "Input/output error (injected)", piece.tmp)

        monkeypatch.setattr(Drainer, "_copy", half_then_fail)
    with pytest.raises(JobError, match="Input/output error"):
        _run(shared_tmp, "keep: none", **{"checkpoint.layout": layout})
    comm.Barrier()
    left = [os.path.join(root, name) for root, _, names in os.walk(shared_tmp / "pfs")
            for name in names if name != "dlio_mpi.lock"]
    assert left == [str(shared_tmp / "pfs" / "dlio_mpi_checkpoints.json")]
    assert not any(_complete(shared_tmp / "pfs").values())
    assert _complete(shared_tmp / "fast") == {IDS[0]: True}  # keep none removed nothing


def test_an_asynchronous_save_drains_as_soon_as_its_write_ends(shared_tmp):
    """Each rank's drain of an asynchronous save starts once its own background write has
    ended, not at the next save (1 s later): the checkpoint is durable on drain.to well
    before it, while it is listed complete there only after the save is."""
    summary = _run(shared_tmp, "keep: all",
                   **{"checkpoint.async_write": "true",
                      "checkpoint.time_between_checkpoints": 1.0})
    drains = [r for r in summary["dlio_mpi"]["checkpoint"]["records"] if r["kind"] == "drain"]
    assert len(drains) == 3 and all(d["drain"]["complete"] for d in drains)
    assert all(d["drain"]["durable_seconds"] < 0.8 for d in drains), drains


def test_a_copy_engine_that_cannot_be_made_fails_each_drain_and_the_run_ends(shared_tmp):
    """The drain thread died of MemoryError making its copy buffer, and the run waited for
    it for ever (issue 30, finding 1): now each drain fails with the reason, agreed by every
    rank, and the wait for the drains ends. (drain.buffer_bytes is bounded at 64 MiB, so the
    buffer here is asked of the Drainer directly.)"""
    from dataclasses import replace

    from dlio_mpi import _core
    from dlio_mpi.checkpoint.drain import Drainer
    from dlio_mpi.checkpoint.folder import CheckpointFolder
    from dlio_mpi.checkpoint.sizing import RankShard
    from dlio_mpi.config import load_config
    from dlio_mpi.errors import JobError

    comm = _comm()
    cfg = load_config("demo", [f"checkpoint.drain={{to: {shared_tmp / 'pfs'}}}"])
    opts = replace(cfg.checkpoint.drain, buffer_bytes=1 << 60)
    drainer = Drainer(comm, opts, str(shared_tmp / "fast"), None, [], "t", False)
    if comm.rank == 0:  # drain.to claimed as the run's checks do
        os.makedirs(shared_tmp / "pfs")
        drainer.folder = CheckpointFolder(str(shared_tmp / "pfs"), "t", "checkpoint.drain.to")
    shard = RankShard(comm.rank, (("f", 4096),))
    drainer.start(1, IDS[0], shard, ["f"], _core.now_ns())
    with pytest.raises(JobError, match="checkpoint.drain: .*Copier"):
        drainer.finish_all()
    drainer.close()
    comm.Barrier()
    assert sorted(os.listdir(shared_tmp / "pfs")) == ["dlio_mpi_checkpoints.json"]  # abandoned
