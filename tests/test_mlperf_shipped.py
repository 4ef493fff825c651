"""MLPerf Storage's workload files, shipped unchanged as `mlperf/NAME`
(configs/workload/mlperf/, each checked against the source and SHA-256 its README records):
the bare names keep meaning DLIO 2.0.0's files, each MLPerf file that needs nothing dlio-mpi
lacks runs scaled down by overrides on 2 ranks, and the others are refused with one message
naming what is missing."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_shipped_workloads_run import BATCH, FILES, RANKS, RECORD, SAMPLES, SMALL_MODEL, _scaled

from dlio_mpi.config import list_workloads, load_config
from dlio_mpi.config.loader import workload_dir
from helpers import error_of, run_cli

pytestmark = pytest.mark.timeout(300)

SOURCE = Path(__file__).resolve().parents[1] / "configs" / "workload" / "mlperf"
RELEASED = Path(__file__).parent / "data" / "dlio_2_0_0"
# Run scaled down on 2 ranks, as shipped but for the overrides of _scaled (the parquet ones
# with their dataset.parquet columns, row groups and read flags)
RUNNABLE = ["unet3d_b200", "unet3d_h100", "retinanet_b200", "retinanet_h100",
            "retinanet_mi355", "retinanet_datagen", "flux_b200", "flux_mi355", "flux_datagen",
            "dlrm_b200", "dlrm_mi355", "dlrm_datagen", "dlrm_parquet_h100",
            "dlrm_parquet_datagen", "parquet_selective_read_example"]
OBJECT_STORAGE = ["llama3_8b_checkpoint"]  # storage.storage_type s3
OBJECT_STORAGE_REFUSAL = ("storage.storage_type: 's3' is object storage, which is not "
                          "implemented yet in dlio-mpi; accepted: local_fs, parallel_fs, "
                          "direct_fs")


def _record() -> list[tuple[str, str, str, int]]:
    """(name, commit, urlsafe-base64 SHA-256, bytes) of every line of the README's record."""
    text = (SOURCE / "README.md").read_text()
    rows = re.findall(r"^configs/dlio/workload/(\w+)\.yaml@([0-9a-f]{40}),sha256=([\w-]+),"
                      r"(\d+)$", text, re.M)
    return [(name, commit, digest, int(size)) for name, commit, digest, size in rows]


def test_the_copies_are_mlperf_s_bytes_as_recorded():
    record = _record()
    names = sorted(name for name, *_ in record)
    assert names == sorted(p.stem for p in SOURCE.glob("*.yaml"))
    assert names == sorted(RUNNABLE + OBJECT_STORAGE)
    installed = workload_dir().joinpath("mlperf")
    for name, _, digest, size in record:
        data = (SOURCE / f"{name}.yaml").read_bytes()
        assert len(data) == size, name
        assert base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() \
            == digest, name
        assert installed.joinpath(f"{name}.yaml").read_bytes() == data, name  # installed too


def test_bare_names_keep_dlio_2_0_0_s_files_and_mlperf_s_are_namespaced():
    assert load_config("unet3d_h100") == load_config(str(RELEASED / "unet3d_h100.yaml"))
    dlio, mlperf = load_config("unet3d_h100"), load_config("mlperf/unet3d_h100")
    assert dlio.workflow.checkpoint and not mlperf.workflow.checkpoint  # MLPerf's differs
    assert (mlperf.model.type, mlperf.dataset.num_files_train) == ("cnn", 168)
    assert load_config("workload=mlperf/unet3d_b200").dataset.num_files_train == 7200
    assert error_of("mlperf/unet3d_h10").startswith(
        "unknown workload 'mlperf/unet3d_h10'; did you mean 'mlperf/unet3d_h100'? (shipped: ")


def test_list_workloads_shows_both():
    out = subprocess.run([sys.executable, "-P", "-m", "dlio_mpi", "list-workloads"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == list_workloads()
    assert "unet3d_h100" in out and "demo" in out
    assert [n for n in out if n.startswith("mlperf/")] == sorted(
        f"mlperf/{n}" for n in RUNNABLE + OBJECT_STORAGE)


def _files(name: str) -> tuple[int, int]:
    """(files, samples per file) of the scaled run: images hold one sample a file."""
    image = load_config(name).dataset.format in ("jpeg", "png")
    return (FILES * SAMPLES, 1) if image else (FILES, SAMPLES)


def _settings(name: str, tmp: Path) -> list[str]:
    """_scaled's overrides with _files' counts, for a data-generation workload too."""
    files, samples = _files(name)
    settings = [s for s in _scaled(name, tmp) if not s.startswith(
        ("dataset.num_files_train=", "dataset.num_samples_per_file="))]
    settings += [f"dataset.num_files_train={files}", f"dataset.num_samples_per_file={samples}"]
    cfg = load_config(name)
    if cfg.workflow.generate_data and not cfg.workflow.train:
        settings += [f"dataset.record_length_bytes={RECORD}",
                     "dataset.record_length_bytes_stdev=0"]
    return settings


@pytest.mark.parametrize("name", [f"mlperf/{n}" for n in RUNNABLE])
def test_mlperf_workloads_run_scaled_down_on_two_ranks(name, tmp_path):
    cfg = load_config(name)
    settings = _settings(name, tmp_path)
    plan = run_cli(["validate", name, *settings, "--ranks", str(RANKS), "--json"], ranks=1)
    assert plan.returncode == 0, plan.stderr
    res = run_cli(["run", name, *settings], ranks=RANKS, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    files = sorted((tmp_path / "data" / "train").iterdir())
    assert len(files) == _files(name)[0]
    assert all(f.suffix == f".{cfg.dataset.format}" for f in files)
    if cfg.workflow.train:
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        steps = FILES * SAMPLES // RANKS // BATCH
        assert summary["dlio_mpi"]["steps_per_epoch"] == steps
        # every sample read once: whole images, or at least RECORD bytes each (parquet
        # columns: the bytes of the columns read)
        columns = cfg.dataset.parquet.columns
        read = [c for c in columns if c.read] or columns
        sample = sum(c.row_bytes for c in read) if columns else RECORD
        least = sum(f.stat().st_size for f in files) if _files(name)[1] == 1 else (
            RANKS * steps * BATCH * sample)
        assert summary["metric"]["train_bytes_read"] >= least


def test_llama3_8b_checkpoint_is_refused_as_object_storage_before_any_io(tmp_path):
    res = run_cli(["run", "mlperf/llama3_8b_checkpoint", f"output.folder={tmp_path / 'out'}"],
                  ranks=RANKS, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr == f"dlio-mpi: error: {OBJECT_STORAGE_REFUSAL}\n"
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the output folder
    assert error_of("mlperf/llama3_8b_checkpoint") == OBJECT_STORAGE_REFUSAL


def test_llama3_8b_checkpoint_runs_on_a_file_system_by_overrides(tmp_path):
    name = "mlperf/llama3_8b_checkpoint"
    settings = ["storage.storage_type=local_fs", "storage.storage_root=./",
                "~workload.storage.storage_library", "~workload.storage.storage_options",
                f"output.folder={tmp_path / 'out'}",
                f"checkpoint.checkpoint_folder={tmp_path / 'ck'}",
                "checkpoint.time_between_checkpoints=0", "checkpoint.num_checkpoints_write=1",
                "checkpoint.num_checkpoints_read=1", *SMALL_MODEL, "model.num_layers=4"]
    res = run_cli(["run", name, *settings], ranks=RANKS, timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    records = json.loads((tmp_path / "out" / "summary.json").read_text())["dlio_mpi"][
        "checkpoint"]["records"]
    assert [r["kind"] for r in records] == ["save", "load"] and records[0]["bytes"] > 0
