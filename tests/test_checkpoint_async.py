"""checkpoint.async_write under mpiexec -n 2 and -n 3, in-process: asynchronous saves write,
byte for byte, the files a synchronous save writes (both layouts, with and without O_DIRECT),
and restores read them back; the step loop stalls for the snapshot (paced by
checkpoint.snapshot_bytes_per_second where given), not for the write, which overlaps the
training that follows; every save is complete when the run ends."""

from __future__ import annotations

import json

import pytest

from helpers import file_digests

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

MiB = 2**20


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _run(folder, **values):
    """A checkpoint-only run: 3 saves of a few MiB, ZeRO 3 (every rank writes its share, of
    a length that is no multiple of a page), then 3 restores."""
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {"workflow.train": "false", "workflow.generate_data": "false",
                "workflow.checkpoint": "true", "model.model_size_bytes": 6 * MiB + 12345,
                "model.parallelism.zero_stage": 3,
                "checkpoint.checkpoint_folder": str(folder / "ck"),
                "output.folder": str(folder / "out"), "checkpoint.num_checkpoints_write": 3,
                "checkpoint.num_checkpoints_read": 3,
                "checkpoint.time_between_checkpoints": 0.3, **values}
    cfg = load_config("demo", [f"{k}={v}" for k, v in settings.items()])
    return run(_comm(), cfg)


@pytest.mark.parametrize(("layout", "odirect", "rank_sync"), [
    ("file_per_rank", False, False), ("file_per_rank", True, True), ("shared", False, True),
    ("shared", True, False)])
def test_asynchronous_saves_write_what_synchronous_saves_write(shared_tmp, layout, odirect,
                                                               rank_sync):
    comm = _comm()
    common = {"checkpoint.layout": layout, "checkpoint.odirect": str(odirect).lower(),
              "checkpoint.rank_sync": str(rank_sync).lower()}
    sync = _run(shared_tmp / "sync", **common)
    asyn = _run(shared_tmp / "async", **common, **{"checkpoint.async_write": "true"})
    comm.Barrier()
    files = file_digests(shared_tmp / "async" / "ck")
    assert files and files == file_digests(shared_tmp / "sync" / "ck")
    assert not [f for f in files if f.endswith(".tmp")]
    manifest = json.loads((shared_tmp / "async" / "ck" / "dlio_mpi_checkpoints.json").read_text())
    assert all(entry["complete"] for entry in manifest["checkpoints"].values())
    records = asyn["dlio_mpi"]["checkpoint"]["records"]
    saves = [r for r in records if r["kind"] == "save"]
    loads = [r for r in records if r["kind"] == "load"]
    assert len(saves) == len(loads) == 3  # restores checked every block's stamp
    ours = [r["bytes"] for r in sync["dlio_mpi"]["checkpoint"]["records"]]
    assert [r["bytes"] for r in records] == ours
    for save in saves:
        a = save["async"]
        assert a["snapshot_bytes"] == save["bytes"]
        assert 0 < a["snapshot_seconds"] <= a["stall_seconds"]
        # the 0.3 s between checkpoints covers a few MiB's write: the next save finds it
        # done, and it went on beside the "training"
        assert a["waited_for_previous_seconds"] < 0.3
        assert 0 < a["write_seconds"] <= save["duration_seconds"]
        assert 0 < a["overlapped_seconds"] <= a["write_seconds"]
    described = asyn["dlio_mpi"]["checkpoint"]["async_write"]
    assert described["snapshot_buffer_bytes"] >= max(r["bytes"] for r in saves) // comm.size
    assert sync["dlio_mpi"]["checkpoint"]["async_write"] is None
    assert all("async" not in r for r in sync["dlio_mpi"]["checkpoint"]["records"])


def test_training_stalls_for_the_paced_snapshot_not_for_the_write(shared_tmp):
    """The snapshot paced to 32 MiB/s: each rank's share of 4 MiB stalls training about 1/8 s
    per checkpoint; that is the epoch's checkpoint pause, the write going on beside the
    steps."""
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = _comm()
    share = 4 * MiB
    values = {"workflow.checkpoint": "true", "model.model_size_bytes": share * comm.size,
              "model.parallelism.zero_stage": 3,
              "checkpoint.checkpoint_folder": str(shared_tmp / "ck"),
              "checkpoint.steps_between_checkpoints": 3, "checkpoint.async_write": "true",
              "checkpoint.snapshot_bytes_per_second": 32 * MiB,
              "output.folder": str(shared_tmp / "out"),
              "dataset.data_folder": str(shared_tmp / "data"), "dataset.num_files_train": 24,
              "dataset.num_samples_per_file": 1,
              "reader.batch_size": 1, "train.computation_time": 0.05, "train.epochs": 1}
    cfg = load_config("demo", [f"{k}={v}" for k, v in values.items()])
    summary = run(comm, cfg)
    saves = summary["dlio_mpi"]["checkpoint"]["records"]
    assert saves and all(s["kind"] == "save" for s in saves)
    epochs = json.loads((shared_tmp / "out" / "per_epoch_stats.json").read_text())
    pause = epochs["1"]["checkpoint_pause_seconds"]
    for save in saves:
        assert save["async"]["snapshot_seconds"] >= share / (32 * MiB) * 0.95
    # the saves within the epoch pause it (one after its last step comes after its clock)
    steps = summary["dlio_mpi"]["steps_per_epoch"]
    within = [s for s in saves if int(s["checkpoint_id"].rpartition("step")[2]) < steps]
    assert len(within) >= 2
    stalls = sum(s["async"]["stall_seconds"] for s in within)
    assert stalls * 0.9 <= pause <= stalls + 0.05 * len(within)
