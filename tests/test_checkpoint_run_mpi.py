"""Checkpoints written and restored by `run`, in-process under mpiexec -n 2 and -n 3: the
shipped llama workloads scaled down (exact file names and bytes per rank, one of them against
hand-computed sizes), the shared layout (every rank's bytes at its offset), fsync counted,
restores reading back what was written (and refusing changed bytes), step checkpoints ending
blocks of training steps, and checkpoints in the way that are not ours refused before any
I/O."""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest

from helpers import ckpt_stream, workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

# Scaled-down transformer: head 8, d_kv = 8 * kv heads
SMALL = {"model.transformer.hidden_size": 64, "model.transformer.ffn_hidden_size": 128,
         "model.transformer.vocab_size": 512, "model.transformer.num_attention_heads": 8,
         "model.transformer.num_kv_heads": 8}
LLAMAS = ["llama_7b", "llama_7b_zero3", "llama_8b_zero3", "llama_70b", "llama_70b_zero3",
          "llama_405b"]


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _checkpoint_run(tmp, workload: str, **values):
    """Run `workload` checkpoint-only, scaled down, with its checkpoints and results in tmp."""
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {"checkpoint.checkpoint_folder": str(tmp / "ck"),
                "output.folder": str(tmp / "out"), "checkpoint.time_between_checkpoints": 0,
                "checkpoint.num_checkpoints_write": 2, "checkpoint.num_checkpoints_read": 2,
                **values}
    cfg = load_config(workload, [f"{k}={v}" for k, v in settings.items()])
    return cfg, run(_comm(), cfg)


def _scaled(workload: str) -> dict:
    """Overrides shrinking a shipped llama workload to a few MiB on this job's ranks: small
    dimensions, at least `pipeline` layers, and subset mode (a share of the full job) where
    tensor x pipeline does not divide the ranks."""
    from dlio_mpi.config import load_config

    par = load_config(workload, []).model.parallelism
    values = {**SMALL, "model.num_layers": max(4, par.pipeline)}
    if _comm().Get_size() % (par.tensor * par.pipeline):
        values |= {"checkpoint.mode": "subset", "model.parallelism.data": 1}
    return values


def _files(folder) -> dict[str, int]:
    return {e.name: e.stat().st_size for e in os.scandir(folder)}


@pytest.mark.parametrize("workload", LLAMAS)
def test_a_scaled_llama_checkpoint_holds_each_ranks_files_and_reads_back(shared_tmp, workload):
    from dlio_mpi.checkpoint.sizing import checkpoint_layout

    comm = _comm()
    size = comm.Get_size()
    cfg, summary = _checkpoint_run(shared_tmp, workload, **_scaled(workload))
    layout = checkpoint_layout(cfg, size)
    expected = {name: n for r in range(size) for name, n in layout.shard(r).files}
    assert len(expected) == sum(len(layout.shard(r).files) for r in range(size))  # no clash
    for cid in ("global_epoch1_step1", "global_epoch1_step2"):
        assert _files(shared_tmp / "ck" / cid) == expected, cid
    manifest = json.loads((shared_tmp / "ck" / "dlio_mpi_checkpoints.json").read_text())
    assert all(manifest["checkpoints"][c]["complete"] for c in ("global_epoch1_step1",
                                                                "global_epoch1_step2"))
    records = summary["dlio_mpi"]["checkpoint"]["records"]
    assert [(r["kind"], r["index"]) for r in records] == [("save", 1), ("save", 2),
                                                          ("load", 1), ("load", 2)]
    assert all(r["bytes"] == layout.total_bytes == sum(expected.values()) for r in records)
    metric = summary["metric"]
    assert metric["checkpoint_size_GB"] == layout.total_bytes / 2**30
    assert metric["save_checkpoint_duration_mean_seconds"] > 0
    assert metric["load_checkpoint_io_mean_GB_per_second"] > 0
    # fsync (the default) on every file written, counted over all ranks
    assert all(r["syncs"] == len(expected) for r in records if r["kind"] == "save")


def test_llama_7b_scaled_sizes_are_the_hand_computed_ones(shared_tmp):
    """h 64, V 512, F 128, 8 heads, 8 kv heads (d_kv 64), 4 layers, fp16 model, fp32 optimizer,
    ZeRO 1, TP = PP = 1: a layer is 64 + 64*(64+128) + 64*64 + 64 + 2*64*128 + 64*128 = 41,088
    elements; N = 2*512*64 + 4*41,088 + 64 = 229,952 parameters. Rank 0 (dp 0) writes the model:
    (4*41,088 + 2*32,768 + 64) * 2 = 459,904 bytes; every rank its optimizer share
    (3n + 15*64) * 4 with n = N // P."""
    comm = _comm()
    size = comm.Get_size()
    _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"))
    optimizer = {2: 1_383_552, 3: 923_640}.get(size, (3 * (229_952 // size) + 960) * 4)
    expected = {"model_0_model_states.pt": 459_904,
                **{f"zero_pp_rank_{r}_mp_rank_0_optim_states.pt": optimizer
                   for r in range(size)}}
    assert _files(shared_tmp / "ck" / "global_epoch1_step1") == expected


@pytest.mark.parametrize("odirect", [False, True])
def test_the_shared_layout_holds_every_ranks_bytes_at_its_offset(shared_tmp, odirect):
    """Collective MPI-IO writes, the shares back to back; with O_DIRECT each rank's own
    pwrites at offsets rounded up to 1 MiB."""
    from dlio_mpi.checkpoint.file_per_rank import shard_seed
    from dlio_mpi.checkpoint.shared_file import NAME
    from dlio_mpi.checkpoint.sizing import checkpoint_layout

    comm = _comm()
    size = comm.Get_size()
    cfg, summary = _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                                   **{"checkpoint.layout": "shared",
                                      "checkpoint.odirect": str(odirect).lower(),
                                      "checkpoint.mpiio_hints": "{romio_cb_write: enable}"})
    shares = [checkpoint_layout(cfg, size).shard(r).nbytes for r in range(size)]
    spans = [-(-n // 2**20) * 2**20 if odirect else n for n in shares]
    folder = shared_tmp / "ck" / "global_epoch1_step2"
    assert _files(folder) == {NAME: sum(spans[:-1]) + shares[-1]}
    data = np.fromfile(folder / NAME, dtype=np.uint8)
    number = zlib.crc32(b"global_epoch1_step2")
    for r in range(size):  # each share is one block (< 64 MiB), built independently
        start = sum(spans[:r])
        block = ckpt_stream(shard_seed(number, r, 0), 0, shares[r])
        assert data[start:start + shares[r]].tobytes() == block, r
    saves = [r for r in summary["dlio_mpi"]["checkpoint"]["records"] if r["kind"] == "save"]
    assert all(r["syncs"] == size for r in saves)  # File.Sync on every rank
    assert summary["dlio_mpi"]["checkpoint"]["mpiio_hints"] == {"romio_cb_write": "enable"}


def test_without_fsync_no_sync_is_counted_and_restores_shift_ranks(shared_tmp):
    cfg, summary = _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                                   **{"checkpoint.fsync": "false",
                                      "checkpoint.recovery_rank_shift": "true"})
    ck = summary["dlio_mpi"]["checkpoint"]
    assert all(r["syncs"] == 0 for r in ck["records"])
    assert ck["restore"]["methods"] == ["recovery_rank_shift", "drop_page_cache"]
    # one node, no fsync: the restores could come from the page cache, and it says so
    assert any("checkpoint.fsync is false" in w for w in ck["restore"]["warnings"])
    assert any("every rank is on one node" in w for w in ck["restore"]["warnings"])


def test_a_restore_of_changed_bytes_fails_naming_the_file(shared_tmp):
    from dlio_mpi.errors import JobError

    comm = _comm()
    _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                    **{"checkpoint.num_checkpoints_read": 0})
    victim = shared_tmp / "ck" / "global_epoch1_step1" / "model_0_model_states.pt"
    if comm.Get_rank() == 0:
        with open(victim, "r+b") as fp:  # a bit flipped in the first block's stamp
            fp.seek(3)
            byte = fp.read(1)
            fp.seek(3)
            fp.write(bytes([byte[0] ^ 1]))
    comm.Barrier()
    # reads only: an earlier run's complete checkpoints are read back
    with pytest.raises(JobError, match=f"{victim}: the 4 KiB at offset 0 do not hold the "
                                       "bytes written"):
        _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                        **{"checkpoint.num_checkpoints_write": 0,
                           "checkpoint.num_checkpoints_read": 1,
                           "output.folder": str(shared_tmp / "out2")})


def test_reads_of_checkpoints_that_are_not_ours_are_refused_before_any_io(shared_tmp):
    from dlio_mpi.errors import JobError

    with pytest.raises(JobError, match="global_epoch1_step1 is not a complete checkpoint of an "
                                       "earlier dlio-mpi run"):
        _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                        **{"checkpoint.num_checkpoints_write": 0,
                           "checkpoint.num_checkpoints_read": 1})
    assert not (shared_tmp / "ck").exists()


def test_a_folder_in_the_way_that_is_not_ours_is_refused_before_any_io(shared_tmp):
    from dlio_mpi.errors import JobError

    comm = _comm()
    theirs = shared_tmp / "ck" / "global_epoch1_step2" / "notes.txt"
    if comm.Get_rank() == 0:
        theirs.parent.mkdir(parents=True)
        theirs.write_text("a user's file")
    comm.Barrier()
    with pytest.raises(JobError, match="global_epoch1_step2 is not a checkpoint of an earlier "
                                       "dlio-mpi run"):
        _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"))
    assert sorted(os.listdir(shared_tmp / "ck")) == ["global_epoch1_step2"]  # nothing written
    assert theirs.read_text() == "a user's file"


def test_step_checkpoints_end_blocks_of_training_steps(shared_tmp):
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = _comm()
    size = comm.Get_size()
    steps = 24 // size // 2  # 24 files of 1 sample, batch 2
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=24, dataset__num_samples_per_file=1,
        train__computation_time=0.005, workflow__checkpoint="true",
        checkpoint__checkpoint_folder=str(shared_tmp / "ck"),
        checkpoint__steps_between_checkpoints=2, model__model_size_bytes=8 << 20,
        model__parallelism__zero_stage=1))
    summary = run(comm, cfg)
    due = [f"global_epoch{e}_step{s}" for e in (1, 2) for s in range(2, steps + 1, 2)]
    assert sorted(os.listdir(shared_tmp / "ck")) == sorted(due + ["dlio_mpi_checkpoints.json"])
    for cid in due:  # ZeRO 1, flat model: every rank writes model_states-<rank>
        assert _files(shared_tmp / "ck" / cid) == {f"model_states-{r}.pt": 8 << 20
                                                  for r in range(size)}
    stats = json.loads((shared_tmp / "out" / "per_epoch_stats.json").read_text())
    inside = len(range(2, steps, 2))  # those before the last step end a block inside
    for epoch in ("1", "2"):
        keys = [k for k in stats[epoch] if k.startswith("save_ckpt")]
        assert keys == [f"save_ckpt{b}" for b in range(1, len(range(2, steps + 1, 2)) + 1)]
        entry = stats[epoch]
        pauses = [entry[f"save_ckpt{b}"]["duration"] for b in range(1, inside + 1)]
        # the checkpoints inside the epoch are not training time: its duration leaves them
        # out (a rank's pause holds each checkpoint, from the common start to the last end)
        assert entry["checkpoint_pause_seconds"] >= max(pauses) > 0
        for r in entry["per_rank"]:  # the block time is the epoch's span less the pauses
            assert r["checkpoint_pause_seconds"] > 0
            assert r["end"] - r["start"] == pytest.approx(
                r["block_seconds"] + r["checkpoint_pause_seconds"], abs=1e-5)
    assert summary["metric"]["train_au_mean_percentage"] > 0
    assert summary["metric"]["save_checkpoint_io_mean_GB_per_second"] > 0


def test_epoch_checkpoints_follow_after_and_between(shared_tmp):
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = _comm()
    steps = 16 // comm.Get_size() // 2
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=16, dataset__num_samples_per_file=1,
        train__epochs=4, workflow__checkpoint="true",
        checkpoint__checkpoint_folder=str(shared_tmp / "ck"),
        checkpoint__checkpoint_after_epoch=2, checkpoint__epochs_between_checkpoints=2,
        model__model_size_bytes=1 << 20))
    run(comm, cfg)
    # DLIO's id: the step counter after the epoch's last step (steps + 1)
    assert sorted(os.listdir(shared_tmp / "ck")) == [
        "dlio_mpi_checkpoints.json", f"global_epoch2_step{steps + 1}",
        f"global_epoch4_step{steps + 1}"]
    # ZeRO 0, flat model, no model parallelism: only rank 0 writes
    assert _files(shared_tmp / "ck" / f"global_epoch2_step{steps + 1}") == {
        "model_states-0.pt": 1 << 20}


def test_pt_save_writes_each_file_through_torch_save_and_reads_it_back(shared_tmp):
    torch = pytest.importorskip("torch")

    from dlio_mpi.checkpoint.sizing import checkpoint_layout

    comm = _comm()
    cfg, summary = _checkpoint_run(shared_tmp, "llama_7b", **_scaled("llama_7b"),
                                   **{"checkpoint.checkpoint_mechanism": "pt_save"})
    layout = checkpoint_layout(cfg, comm.Get_size())
    expected = {name: n for r in range(comm.Get_size()) for name, n in layout.shard(r).files}
    files = _files(shared_tmp / "ck" / "global_epoch1_step1")
    assert sorted(files) == sorted(expected)
    for name, nbytes in expected.items():  # the payload plus torch.save's container
        assert nbytes < files[name] < nbytes + 64 * 1024
    if comm.Get_rank() == 0:
        state = torch.load(shared_tmp / "ck" / "global_epoch1_step1" / "model_0_model_states.pt",
                           weights_only=True)
        assert sum(t.numel() for t in state.values()) == expected["model_0_model_states.pt"]
    ck = summary["dlio_mpi"]["checkpoint"]
    assert ck["writer"] == "pt_save" and len(ck["records"]) == 4
