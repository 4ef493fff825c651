"""SIGTERM ends the job promptly in every phase that waits (issue 30): a compute step, a paced
snapshot, the results written after thousands of epochs, reader.staging's reads,
storage.stage_in's copy, a synchronous save, a drain, the run's end waiting for an
asynchronous save's write, and a restore. Each is a real `mpiexec -n 2` (and `-n 3`) job whose
phase lasts several times the bound; its slow storage is a throttled file system
(helpers.throttled_fs), fast enough that the one call a stop waits for (64 MiB a rank for
checkpoints, 8 MiB here for the dataset's reads) takes well under the bound. After the
signal the job exits with 143 within STOP_BOUND seconds, one message saying it stopped, its
results written and marked incomplete, and nothing left behind: no temporary, no lock, no
checkpoint listed incomplete. (The latency itself, median of 5 per phase, is measured by
scripts/bench/stop_latency.py.) Each test removes its data when it ends: the suite runs on
machines with little room."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import mpiexec
from helpers import (
    ended_after,
    rank_pids,
    run_cli,
    started_until,
    throttled_fs,
    workload_overrides,
)

pytestmark = pytest.mark.timeout(300)

MiB = 2**20
STOP_BOUND = 5.0  # seconds from SIGTERM to exit: 2 s targeted, slack for a loaded host
SHARE = 192 * MiB  # a rank's share of a checkpoint: 3 calls of 64 MiB


@pytest.fixture(autouse=True)
def _room(tmp_path):
    """The test's data removed when it ends (the suite's machines have little room)."""
    yield
    for entry in tmp_path.iterdir():
        if entry.is_dir() and not entry.is_mount():
            shutil.rmtree(entry, ignore_errors=True)


def _checkpointing(folder: Path, out: Path, **values) -> list[str]:
    """A checkpoint-only run: one save of SHARE bytes a rank (ZeRO 3 of a flat model)."""
    settings = {"workflow.train": "false", "workflow.generate_data": "false",
                "workflow.checkpoint": "true", "model.parallelism.zero_stage": 3,
                "model.model_size_bytes": SHARE, "checkpoint.num_checkpoints_write": 1,
                "checkpoint.num_checkpoints_read": 0,
                "checkpoint.time_between_checkpoints": 0.1,
                "checkpoint.checkpoint_folder": folder / "ck",
                "dataset.data_folder": out.parent / "data", "output.folder": out, **values}
    return [f"{k}={v}" for k, v in settings.items()]


def _logged(out: Path, text: str):
    def ready() -> bool:
        try:
            return text in (out / "dlio.log").read_text()
        except OSError:
            return False
    return ready


def _writing(folder: Path):
    """Ready once a temporary of ours is being written under `folder`."""
    return lambda: any(p.name.endswith(".tmp") for p in folder.rglob("*"))


def _stop_when(cmd: list[str], ready, delay: float) -> tuple[float, str]:
    """Start `cmd`, SIGTERM its ranks `delay` s after `ready()`; (seconds from the signal to
    the job's end, its stderr)."""
    job = started_until(cmd, ready, timeout=120)
    time.sleep(delay)
    assert job.poll() is None, job.communicate()
    sent = []

    def stop() -> None:
        for pid in rank_pids("dlio_mpi"):
            os.kill(pid, signal.SIGTERM)
        sent.append(time.monotonic())

    _, stderr = ended_after(job, stop, timeout=60)
    took = time.monotonic() - sent[0]
    assert job.returncode == 128 + signal.SIGTERM, (job.returncode, stderr)
    return took, stderr


def _assert_clean_stop(tmp_path: Path, out: Path, took: float, stderr: str) -> dict:
    errors = [line for line in stderr.splitlines() if line.startswith("dlio-mpi: error")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], stderr
    assert took < STOP_BOUND, f"{took:.2f} s from SIGTERM to the end"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dlio_mpi"]["complete"] is False
    assert summary["dlio_mpi"]["stopped_by"] == "SIGTERM"
    left = [str(p) for p in tmp_path.rglob("*") if p.name.endswith(".tmp")
            or p.name == "dlio_mpi.lock"]
    assert left == []
    for manifest in tmp_path.rglob("dlio_mpi_checkpoints.json"):
        listed = json.loads(manifest.read_text())["checkpoints"]
        assert all(entry["complete"] for entry in listed.values()), (manifest, listed)
    return summary


def _cmd(prefix: list[str], args: list[str], ranks: int = 2) -> list[str]:
    return [*prefix, mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", "run",
            "demo", *args]


def test_a_compute_step_ends_at_the_signal(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              train__computation_time=60)
    took, err = _stop_when(_cmd([], over), _logged(tmp_path / "out", "workload "), 3)
    _assert_clean_stop(tmp_path, tmp_path / "out", took, err)


def test_the_results_of_thousands_of_epochs_are_written_promptly(tmp_path):
    """After a stop the results are written in time linear in the epochs, with a small
    constant: thousands of short epochs (2 steps, no compute) do not delay the end."""
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__num_files_train=4, reader__batch_size=1,
                              train__epochs=100000, output__stats_interval=0)
    took, err = _stop_when(_cmd([], over), _logged(tmp_path / "out", "workload "), 8)
    summary = _assert_clean_stop(tmp_path, tmp_path / "out", took, err)
    assert summary["epochs"] > 1000
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    assert len(stats) == summary["epochs"]


def test_a_paced_snapshot_ends_at_the_signal(tmp_path):
    out = tmp_path / "out"
    over = _checkpointing(tmp_path, out, **{"checkpoint.async_write": "true",
                                            "checkpoint.snapshot_bytes_per_second": 10 * MiB})
    took, err = _stop_when(_cmd([], over), _logged(out, "workload "), 3)
    summary = _assert_clean_stop(tmp_path, out, took, err)
    assert summary["dlio_mpi"]["checkpoint"]["records"] == []  # the save cut short, removed


@pytest.mark.parametrize(("how", "ranks"), [("reader.staging", 2), ("reader.staging", 3),
                                           ("storage.stage_in", 2), ("storage.stage_in", 3)])
def test_reading_the_dataset_before_the_epochs_ends_at_the_signal(tmp_path, how, ranks):
    """reader.staging's reads into memory, storage.stage_in's copy to a faster tier: 96 MiB
    of 8 MiB files at 16 MiB/s, read in calls of 8 MiB."""
    with throttled_fs(tmp_path, 16) as (mount, prefix):
        data = workload_overrides(tmp_path, dataset__data_folder=mount / "data",
                                  dataset__num_files_train=12,
                                  dataset__record_length_bytes=8 * MiB)
        gen = run_cli(["generate", "demo", *data])
        assert gen.returncode == 0, gen.stderr
        over = [*data, "workflow.generate_data=false",
                *(["reader.staging=replicated", "reader.odirect=true"]
                  if how == "reader.staging" else
                  [f"storage.stage_in={{to: {tmp_path / 'bb'}, odirect: true, "
                   f"buffer_bytes: {8 * MiB}}}"])]
        took, err = _stop_when(_cmd(prefix, over, ranks), _logged(tmp_path / "out", "workload "),
                               2)
        summary = _assert_clean_stop(tmp_path, tmp_path / "out", took, err)
        assert summary["epochs"] == 0


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("phase", ["save", "drain", "background write", "restore"])
def test_checkpoint_io_ends_at_the_signal(tmp_path, phase, ranks):
    """Checkpoints of SHARE a rank on a tier throttled to 128 MiB/s (a round of 64 MiB calls
    of every rank: 1-1.5 s), the signal sent once the phase is under way."""
    with throttled_fs(tmp_path, 128) as (mount, prefix):
        out = tmp_path / "out"
        values: dict = {"checkpoint.odirect": "true"}
        if phase == "save":
            values |= {"checkpoint.checkpoint_folder": mount / "ck"}
            ready = _writing(mount / "ck")
        elif phase == "drain":  # saved fast on the local disk, drained to the slow tier
            values |= {"checkpoint.drain": f"{{to: {mount / 'pfs'}, odirect: true}}"}
            ready = _writing(mount / "pfs")
        elif phase == "background write":  # the run's end waits for the asynchronous write
            values |= {"checkpoint.checkpoint_folder": mount / "ck",
                       "checkpoint.async_write": "true"}
            ready = _writing(mount / "ck")
        else:  # written to the slow tier, then read back from it
            values |= {"checkpoint.checkpoint_folder": mount / "ck",
                       "checkpoint.num_checkpoints_read": 1}
            ready = _logged(out, " saved: ")
        took, err = _stop_when(_cmd(prefix, _checkpointing(tmp_path, out, **values), ranks),
                               ready, 0.3)
        summary = _assert_clean_stop(tmp_path, out, took, err)
        kinds = [r["kind"] for r in summary["dlio_mpi"]["checkpoint"]["records"]
                 if r.get("drain") is None or r["drain"]["complete"]]
        assert kinds == {"save": [], "drain": ["save"], "background write": [],
                         "restore": ["save"]}[phase]


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_dcp_save_ends_at_the_signal(tmp_path, ranks):
    """checkpoint.layout dcp (its files written from Python in 64 MiB calls, through the page
    cache) of 124-186 MiB a rank on the throttled tier: the signal ends it between two calls
    as a stop (exit 143; before, the writer's own agreement of the stop came out of the
    checkpointer's as a failure, exit 2), no .distcp or .metadata left under a final name or
    a temporary unless the save completed."""
    dims = {"model.num_layers": 2, "model.transformer.hidden_size": 1024,
            "model.transformer.ffn_hidden_size": 2816, "model.transformer.vocab_size": 8000,
            "checkpoint.layout": "dcp", "checkpoint.num_checkpoints_write": 1,
            "checkpoint.num_checkpoints_read": 0, "checkpoint.time_between_checkpoints": 0.1}
    with throttled_fs(tmp_path, 128) as (mount, prefix):
        out = tmp_path / "out"
        args = [f"{k}={v}" for k, v in {**dims, "checkpoint.checkpoint_folder": mount / "ck",
                                        "output.folder": out}.items()]
        cmd = [*prefix, mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi",
               "run", "llama_8b_zero3", *args]
        took, err = _stop_when(cmd, _writing(mount / "ck"), 0.3)
        summary = _assert_clean_stop(tmp_path, out, took, err)
        # page-cache writes may all be in before the signal lands (the throttle acts on the
        # writeback): then the save is whole and listed complete; else nothing of it is left
        if not summary["dlio_mpi"]["checkpoint"]["records"]:
            assert not [p for p in (mount / "ck").rglob("*")
                        if p.name.endswith(".distcp") or p.name == ".metadata"]
