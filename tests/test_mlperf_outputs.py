"""A run driven as MLPerf Storage's tool drives DLIO leaves, beside our own files, every file
and field its submission checker and report generator read from a run folder. What they read
(mlcommons/storage; commits as stored when this was written):

- submission_checker/constants.py (65f6258): RUN_REQUIRED_FILES / CHECKPOINT_REQUIRED_FILES,
  regexes `.*output\\.json`, `.*per_epoch_stats\\.json`, `.*summary\\.json`, `dlio\\.log`
  (and the tool's own `*_run.stdout.log`, `*_run.stderr.log`, written after DLIO); the
  folders `dlio_config`.
- submission_checker/loader.py (65f6258): `summary.json` of each timestamp folder.
- submission_checker/checks/training_checks.py (4234cd9): summary `num_accelerators`,
  `num_hosts`, `host_memory_GB[0]`, `num_files_train`, `num_files_eval`,
  `metric.train_au_mean_percentage`, `metric.train_au_meet_expectation` ('success').
- submission_checker/checks/checkpointing_checks.py (65f6258): summary
  `metric.checkpoint_size_GB`, `host_memory_GB[0]`, `num_hosts`, `num_accelerators`.
- rules/models.py (20f5093) DLIOResultParser: summary `start`, `num_accelerators`,
  `host_memory_GB` and `host_cpu_count` (lists per host), `metric`; dlio_config/config.yaml
  `workload.workflow.{generate_data,train,checkpoint}`, `workload.model.name`;
  dlio_config/overrides.yaml a list of `KEY=VALUE` (`workload=NAME` and `++workload.K=V`).
- rules/run_checkers/training.py (b681029), rules/utils.py (4234cd9): config.yaml's
  `dataset.{num_files_train,num_samples_per_file,record_length_bytes}`,
  `reader.{batch_size,odirect}`.
- Rules.md 4.3.6 / 4.7.1: summary `metric.{save,load}_checkpoint_io_mean_GB_per_second`,
  `metric.{save,load}_checkpoint_duration_mean_seconds`, `end`.
The per-rank files follow their writers: argonne-lcf/dlio_benchmark
dlio_benchmark/utils/statscounter.py (03b5ed3) RANK_output.json, mlcommons/DLIO_local_changes
dlio_benchmark/utils/statscounter.py (53c2fd3) RANK_per_epoch_stats.json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from dlio_mpi.config.loader import workload_dir
from helpers import run_cli

pytestmark = pytest.mark.timeout(300)

REQUIRED = [r".*output\.json", r".*per_epoch_stats\.json", r".*summary\.json", r"dlio\.log"]
TRAIN = ["++workload.dataset.num_files_train=8", "++workload.dataset.data_folder=data",
         "++workload.workflow.generate_data=True", "++workload.dataset.record_length_bytes=4096",
         "++workload.dataset.record_length_bytes_stdev=0",
         "++workload.dataset.record_length_bytes_resize=0",
         "++workload.train.computation_time=0.001", "++workload.train.epochs=2",
         "++workload.reader.batch_size=2"]
CHECKPOINT = ["++workload.checkpoint.checkpoint_folder=ck",
              "++workload.checkpoint.num_checkpoints_write=2",
              "++workload.checkpoint.num_checkpoints_read=2",
              "++workload.checkpoint.time_between_checkpoints=0",
              "++workload.model.num_layers=4", "++workload.model.transformer.hidden_size=64",
              "++workload.model.transformer.ffn_hidden_size=128",
              "++workload.model.transformer.vocab_size=512",
              "++workload.model.transformer.num_attention_heads=8",
              "++workload.model.transformer.num_kv_heads=8"]
NUMBER = (int, float)


def _run(tmp: Path, workload: str, overrides: list[str], ranks: int = 2) -> Path:
    configs = tmp / "configs"
    (configs / "workload").mkdir(parents=True, exist_ok=True)
    # the workload's file in the config dir, as mlpstorage's configs hold it (a shipped file
    # runs only without --config-dir)
    shipped = workload_dir().joinpath(*(["mlperf"] if workload == "unet3d_b200" else []),
                                      f"{workload}.yaml")
    shutil.copy(shipped, configs / "workload" / f"{workload}.yaml")
    line = ["run", f"workload={workload}", "++hydra.run.dir=results/run",
            "++hydra.output_subdir=dlio_config", *overrides, f"--config-dir={configs}"]
    res = run_cli(line, ranks=ranks, cwd=tmp, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return tmp / "results" / "run"


def _check_folder(run: Path) -> dict:
    """The checker's required files and folder; summary's fields both tools read."""
    files = [p.name for p in run.iterdir() if p.is_file()]
    for pattern in REQUIRED:  # the checker's re.match over the folder's files
        assert any(re.match(pattern, f) for f in files), pattern
    assert sorted(p.name for p in (run / "dlio_config").iterdir()) == [
        "config.yaml", "hydra.yaml", "overrides.yaml"]
    summary = json.loads((run / "summary.json").read_text())
    assert isinstance(summary["start"], str) and isinstance(summary["end"], str)
    for key in ("num_accelerators", "num_hosts", "num_files_train", "num_files_eval"):
        assert isinstance(summary[key], int), key
    assert summary["num_accelerators"] == 2 and summary["num_hosts"] >= 1
    assert summary["num_accelerators"] % summary["num_hosts"] == 0
    memory, cpus = summary["host_memory_GB"], summary["host_cpu_count"]
    assert len(memory) == len(cpus) == summary["num_hosts"]
    assert all(isinstance(m, float) and m > 0 for m in memory)
    assert all(isinstance(c, int) and c > 0 for c in cpus)
    overrides = yaml.safe_load((run / "dlio_config" / "overrides.yaml").read_text())
    assert all(isinstance(o, str) and "=" in o for o in overrides)
    return summary


def _check_per_rank(run: Path, ranks: int) -> list[tuple[dict, dict]]:
    """Each rank's RANK_output.json (DLIO's host fields) and RANK_per_epoch_stats.json, all
    listed in the results manifest (replaced with the other results)."""
    listed = json.loads((run / "dlio_mpi_results.json").read_text())["files"]
    out = []
    for rank in range(ranks):
        names = (f"{rank}_output.json", f"{rank}_per_epoch_stats.json")
        assert all(name in listed for name in names)
        output, stats = (json.loads((run / name).read_text()) for name in names)
        assert isinstance(output["host_memory_GB"], float)
        assert isinstance(output["host_cpu_count"], int)
        assert isinstance(output["host_processor_name"], str)
        assert output["potential_caching"] in (0, 1)
        assert isinstance(output["hostname"], str) and output["hostname"]
        out.append((output, stats))
    assert not (run / f"{ranks}_output.json").exists()
    return out


def test_a_training_run_leaves_what_mlperf_s_checker_and_report_read(tmp_path):
    run = _run(tmp_path, "unet3d_b200", TRAIN)
    summary = _check_folder(run)
    metric = summary["metric"]
    assert isinstance(metric["train_au_mean_percentage"], float)
    assert metric["train_au_meet_expectation"] in ("success", "fail")
    config = yaml.safe_load((run / "dlio_config" / "config.yaml").read_text())["workload"]
    assert config["workflow"]["train"] is True and config["workflow"]["checkpoint"] is False
    assert isinstance(config["model"]["name"], str)
    assert config["dataset"]["num_files_train"] == 8
    assert config["dataset"]["num_samples_per_file"] == 1
    assert config["dataset"]["record_length_bytes"] == 4096
    assert config["reader"]["batch_size"] == 2 and "odirect" in config["reader"]
    for rank, (output, stats) in enumerate(_check_per_rank(run, 2)):
        for epoch in ("1", "2"):  # DLIO's per-rank AU % and samples/s of the epoch's block
            ours = json.loads((run / "per_epoch_stats.json").read_text())[epoch]["per_rank"]
            assert output[epoch]["au"]["block1"] == ours[rank]["au_percentage"]
            assert output[epoch]["throughput"]["block1"] == ours[rank]["samples_per_second"]
            assert set(stats[epoch]) == {"start", "end", "duration"}
            assert stats[epoch]["duration"] >= 0
    # a rerun on one rank replaces every listed file: rank 1's files go with the rest
    run_again = _run(tmp_path, "unet3d_b200", TRAIN, ranks=1)
    assert run_again == run and not (run / "1_output.json").exists()
    assert (run / "0_output.json").is_file() and (run / "0_per_epoch_stats.json").is_file()


def test_a_checkpoint_run_leaves_what_mlperf_s_checker_and_report_read(tmp_path):
    run = _run(tmp_path, "llama_8b_zero3", CHECKPOINT)
    summary = _check_folder(run)
    metric = summary["metric"]
    for key in ("checkpoint_size_GB", "save_checkpoint_io_mean_GB_per_second",
                "save_checkpoint_duration_mean_seconds", "load_checkpoint_io_mean_GB_per_second",
                "load_checkpoint_duration_mean_seconds"):
        assert isinstance(metric[key], float) and metric[key] > 0, key
    config = yaml.safe_load((run / "dlio_config" / "config.yaml").read_text())["workload"]
    assert config["workflow"]["checkpoint"] is True and config["workflow"]["train"] is False
    assert config["checkpoint"]["fsync"] is True  # the checker's fsync_verification
    for output, stats in _check_per_rank(run, 2):
        assert [k for k in output if k.isdigit()] == []  # no epochs: host fields alone
        # the fork's entries: each rank's own time, the whole checkpoint's GB over it
        assert sorted(stats["1"]) == ["load_ckpt1", "load_ckpt2", "save_ckpt1", "save_ckpt2"]
        for entry in stats["1"].values():
            assert set(entry) == {"start", "end", "duration", "throughput"}
            assert entry["duration"] > 0
            assert entry["throughput"] == pytest.approx(
                metric["checkpoint_size_GB"] / entry["duration"])
