"""Every shipped workload runs on 2 ranks, scaled down by overrides only: its format, reader and
workflow as shipped, with few small files, one epoch, little compute; training workloads read
exactly the planned steps and bytes, checkpointing ones write their (scaled) checkpoints."""

from __future__ import annotations

import json

import pytest

from dlio_mpi.config import list_workloads, load_config
from helpers import run_cli

RANKS, FILES, SAMPLES, RECORD, BATCH = 2, 8, 4, 4096, 2
# transformer dims small enough for a few MiB per checkpoint
SMALL_MODEL = ["model.transformer.hidden_size=64", "model.transformer.ffn_hidden_size=128",
               "model.transformer.vocab_size=512", "model.transformer.num_attention_heads=8",
               "model.transformer.num_kv_heads=8"]


def _scaled(name: str, tmp) -> list[str]:
    cfg = load_config(name)
    out = [f"output.folder={tmp / 'out'}", f"dataset.data_folder={tmp / 'data'}",
           f"checkpoint.checkpoint_folder={tmp / 'ck'}"]
    if cfg.workflow.train:
        out += ["workflow.generate_data=true", f"dataset.num_files_train={FILES}",
                f"dataset.num_samples_per_file={SAMPLES}",
                f"dataset.record_length_bytes={RECORD}", "dataset.record_length_bytes_stdev=0",
                "~workload.dataset.record_dims", f"reader.batch_size={BATCH}",
                f"reader.batch_size_eval={BATCH}", "train.epochs=1",
                "train.computation_time=0.001", "train.total_training_steps=-1",
                "evaluation.eval_time=0.001",
                f"dataset.num_files_eval={FILES if cfg.workflow.evaluation else 0}"]
    if cfg.workflow.checkpoint:
        par = cfg.model.parallelism
        out += ["checkpoint.steps_between_checkpoints=-1", "checkpoint.checkpoint_after_epoch=1",
                "checkpoint.time_between_checkpoints=0", "checkpoint.num_checkpoints_write=1",
                "checkpoint.num_checkpoints_read=1"]
        if cfg.model.type == "transformer":
            out += [*SMALL_MODEL, f"model.num_layers={max(4, par.pipeline)}"]
        elif cfg.model.layer_parameters or cfg.model.optimization_groups:
            out += ["model.layer_parameters=[4096, 8192]", "model.optimization_groups=[4096]",
                    f"model.num_layers={max(4, par.pipeline)}", "model.model_size_bytes=4096"]
        else:
            out += ["model.model_size_bytes=65536"]
        if RANKS % (par.tensor * par.pipeline):
            out += ["checkpoint.mode=subset", "model.parallelism.data=1"]
    return out


# MLPerf Storage's files (mlperf/NAME): tests/test_mlperf_shipped.py
@pytest.mark.parametrize("name", [n for n in list_workloads() if "/" not in n])
def test_every_shipped_workload_runs_scaled_down_on_two_ranks(name, tmp_path):
    cfg = load_config(name)
    settings = _scaled(name, tmp_path)
    plan = run_cli(["validate", name, *settings, "--ranks", str(RANKS), "--json"], ranks=1)
    assert plan.returncode == 0, plan.stderr
    plan = json.loads(plan.stdout)
    res = run_cli(["run", name, *settings], ranks=RANKS, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    metric = summary["metric"]
    if cfg.workflow.train:
        steps = FILES * SAMPLES // RANKS // BATCH
        assert summary["dlio_mpi"]["steps_per_epoch"] == plan["train"]["steps_per_epoch"] == steps
        # at least the bytes the plan expected of one epoch (whole files where the loader
        # loads them; the loader's own re-reads, and files shared by ranks each loads, on top)
        assert metric["train_bytes_requested"] >= plan["bytes_per_epoch"] >= (
            RANKS * steps * BATCH * RECORD)
        assert metric["train_bytes_transferred"] >= metric["train_bytes_read"] >= (
            RANKS * steps * BATCH * RECORD)
        assert len(metric["train_au_percentage"]) == 1
    if cfg.workflow.checkpoint:
        records = summary["dlio_mpi"]["checkpoint"]["records"]
        assert records and records[0]["kind"] == "save" and records[0]["bytes"] > 0
        assert metric["checkpoint_size_GB"] > 0
        assert (tmp_path / "ck" / "dlio_mpi_checkpoints.json").exists()
