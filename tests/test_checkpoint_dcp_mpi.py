"""checkpoint.layout: dcp saved and restored by `run`, in-process under mpiexec -n 2 and -n 3:
a scaled-down llama workload's checkpoints hold exactly dcp_plan's files (names and sizes,
and, where torch is importable, those of a real DCP save of the same model; torch loads ours),
`.metadata` written last, restores refusing changed bytes, asynchronous saves, and a failing
rank leaving no `.metadata` and no final-named partial file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "scripts" / "fidelity" / "dcp_reference.py"
DIMS = {"layers": 4, "hidden": 64, "ffn": 128, "vocab": 512, "heads": 8, "kv_heads": 2}
SMALL = {"model.num_layers": DIMS["layers"], "model.transformer.hidden_size": DIMS["hidden"],
         "model.transformer.ffn_hidden_size": DIMS["ffn"],
         "model.transformer.vocab_size": DIMS["vocab"],
         "model.transformer.num_attention_heads": DIMS["heads"],
         "model.transformer.num_kv_heads": DIMS["kv_heads"], "checkpoint.layout": "dcp"}
IDS = ("global_epoch1_step1", "global_epoch1_step2")


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _run(tmp, writes: int = 2, reads: int = 2, **values):
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {**SMALL, "checkpoint.checkpoint_folder": str(tmp / "ck"),
                "output.folder": str(tmp / "out"), "checkpoint.time_between_checkpoints": 0,
                "checkpoint.num_checkpoints_write": writes,
                "checkpoint.num_checkpoints_read": reads, **values}
    cfg = load_config("llama_8b_zero3", [f"{k}={v}" for k, v in settings.items()])
    return cfg, run(_comm(), cfg)


def _files(folder) -> dict[str, int]:
    return {e.name: e.stat().st_size for e in os.scandir(folder)}


def _planned(cfg, folder: Path) -> dict[str, int]:
    """dcp_plan's files of the save and the .metadata's length for this folder."""
    from dlio_mpi.checkpoint.dcp_layout import llama_model
    from dlio_mpi.checkpoint.dcp_metadata import metadata_bytes
    from dlio_mpi.checkpoint.dcp_plan import DcpSavePlan

    plan = DcpSavePlan(llama_model(cfg), _comm().Get_size(), cfg.checkpoint.dcp.thread_count)
    return {**plan.file_sizes(), ".metadata": len(metadata_bytes(plan, str(folder)))}


def _torch_save(cfg, folder: Path, threads: int, *extra: str) -> dict:
    command = [sys.executable, str(REFERENCE), "--ranks", str(_comm().Get_size()),
               "--threads", str(threads), "--out", str(folder),
               "--model-dtype", cfg.model.model_datatype,
               "--optim-dtype", cfg.model.optimizer_datatype, *extra]
    for key, value in DIMS.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_dcp_save_holds_the_planned_files_and_reads_back(shared_tmp, threads):
    comm = _comm()
    cfg, summary = _run(shared_tmp, **{"checkpoint.dcp.thread_count": threads})
    for cid in IDS:
        folder = shared_tmp / "ck" / cid
        files = _files(folder)
        assert files == _planned(cfg, folder), cid
        written = max(os.stat(folder / n).st_mtime_ns for n in files if n != ".metadata")
        assert os.stat(folder / ".metadata").st_mtime_ns >= written  # the commit comes last
    records = summary["dlio_mpi"]["checkpoint"]["records"]
    assert [r["kind"] for r in records] == ["save", "save", "load", "load"]
    sizing = summary["dlio_mpi"]["checkpoint"]["sizing"]
    distcp = {n: s for n, s in files.items() if n != ".metadata"}
    assert sizing["dcp"]["distcp_bytes"] == sum(distcp.values())
    assert sizing["dcp"]["distcp_files"] == len(distcp) == threads * comm.Get_size()
    comm.Barrier()


def test_dcp_files_equal_a_real_torch_save_and_load_in_torch(shared_tmp):
    """Names and sizes of a real DCP save (torch, gloo) of the same model at this world size;
    torch loads ours at this world size, asking for the planned ranges."""
    comm = _comm()
    cfg, _ = _run(shared_tmp, writes=1, reads=0)
    ours = shared_tmp / "ck" / IDS[0]
    outcome = None
    if comm.Get_rank() == 0:
        try:
            import torch  # noqa: F401
        except ImportError:
            outcome = "skip"
        else:
            real = _torch_save(cfg, shared_tmp / "torch", 1)
            mine = {n: s for n, s in _files(ours).items() if n != ".metadata"}
            assert real["files"] == {**mine, ".metadata": real["files"][".metadata"]}
            loaded = _torch_save(cfg, ours, 1, "--load-only", "--load-ranks",
                                 str(comm.Get_size()))
            assert sorted(loaded["load"]) == [str(r) for r in range(comm.Get_size())]
            outcome = "ok"
    if comm.bcast(outcome, root=0) == "skip":
        pytest.skip("torch is not importable: the real save is not made")


def test_a_restore_refuses_changed_bytes(shared_tmp):
    """A byte of a payload changed after the save: the restore fails on every rank, naming
    the file and the item."""
    from dlio_mpi.errors import JobError

    comm = _comm()
    _run(shared_tmp, writes=1, reads=0)
    path = shared_tmp / "ck" / IDS[0] / "__1_0.distcp"
    if comm.Get_rank() == 0:
        st = os.stat(path)
        at = st.st_size // 2 // 4096 * 4096  # a 4 KiB granule's first byte (always compared)
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    comm.Barrier()
    with pytest.raises(JobError, match="__1_0.distcp.*do not hold the bytes written"):
        _run(shared_tmp, writes=0, reads=1, **{"output.folder": str(shared_tmp / "out2")})


def test_an_asynchronous_dcp_save_writes_the_same_files(shared_tmp):
    comm = _comm()
    cfg, summary = _run(shared_tmp, **{"checkpoint.async_write": "true"})
    for cid in IDS:
        folder = shared_tmp / "ck" / cid
        assert _files(folder) == _planned(cfg, folder), cid
    records = summary["dlio_mpi"]["checkpoint"]["records"]
    assert [r["kind"] for r in records] == ["save", "save", "load", "load"]
    assert all(r.get("async") for r in records if r["kind"] == "save")
    comm.Barrier()


@pytest.mark.parametrize("async_write", ["false", "true"])
def test_a_dcp_checkpoint_drains_whole_and_restores_from_the_pfs(shared_tmp, async_write):
    """checkpoint.drain copies every rank's .distcp files and the .metadata (the commit,
    last), byte for byte; restores read the drained copies."""
    comm = _comm()
    pfs = shared_tmp / "pfs"
    cfg, summary = _run(shared_tmp, **{"checkpoint.async_write": async_write,
                                       "checkpoint.drain.to": str(pfs),
                                       "checkpoint.drain.restore_from": "pfs"})
    for cid in IDS:
        fast, drained = shared_tmp / "ck" / cid, pfs / cid
        assert _files(drained) == _files(fast) == _planned(cfg, fast), cid
        if comm.Get_rank() == 0:
            assert all((drained / n).read_bytes() == (fast / n).read_bytes()
                       for n in _files(fast)), cid
    records = summary["dlio_mpi"]["checkpoint"]["records"]
    assert [r["kind"] for r in records].count("drain") == 2
    assert all(r["drain"]["complete"] for r in records if r["kind"] == "drain")
    assert summary["dlio_mpi"]["checkpoint"]["restore"]["methods"]
    assert [r["kind"] for r in records if r["kind"] == "load"] == ["load", "load"]
    comm.Barrier()


def test_a_failing_rank_leaves_no_metadata_and_no_final_named_partial_file(shared_tmp,
                                                                           monkeypatch):
    """The storage fails rank 1's fsync: the job ends with the agreed error, no .metadata
    exists and no .distcp file is left under its final name."""
    from dlio_mpi.checkpoint import dcp_writer
    from dlio_mpi.errors import JobError

    comm = _comm()
    if comm.Get_rank() == 1:
        def failing(fd):
            raise OSError(5, "injected: the storage failed the fsync")
        monkeypatch.setattr(dcp_writer.os, "fsync", failing)
    with pytest.raises(JobError, match="injected"):
        _run(shared_tmp, writes=1, reads=0)
    monkeypatch.undo()
    comm.Barrier()
    folder = shared_tmp / "ck" / IDS[0]
    left = _files(folder) if folder.exists() else {}
    assert ".metadata" not in left and not [n for n in left if n.endswith(".distcp")], left
