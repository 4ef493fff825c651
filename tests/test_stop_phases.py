"""SIGTERM ends the job promptly in every phase that waits (issue 30): a compute step, a paced
snapshot, reader.staging's reads, a synchronous save, a restore, a drain, the run's end
waiting for an asynchronous save's write, and the results written after many epochs. Each is
a real `mpiexec -n 2` (and `-n 3`) job whose phase lasts well over the bound; its slow storage is a
throttled file system (helpers.throttled_fs: 64 MiB/s, so that one 64 MiB call of each rank
takes about 2 s). After the signal the job exits with 143 within STOP_BOUND seconds, one
message saying it stopped, its results written and marked incomplete, and nothing left
behind: no temporary, no lock, no checkpoint listed incomplete. (The latency itself, median
of 5 per phase, is measured by scripts/bench/stop_latency.py.)"""

from __future__ import annotations

import json
import os
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
THROTTLE = 64     # MiB/s
SHARE = 384 * MiB  # a rank's share of a checkpoint: 12 s of writing at THROTTLE


def _checkpointing(folder: Path, **values) -> list[str]:
    """A checkpoint-only run: one save of SHARE bytes a rank (ZeRO 3 of a flat model)."""
    settings = {"workflow.train": "false", "workflow.generate_data": "false",
                "workflow.checkpoint": "true", "model.parallelism.zero_stage": 3,
                "model.model_size_bytes": SHARE, "checkpoint.num_checkpoints_write": 1,
                "checkpoint.num_checkpoints_read": 0,
                "checkpoint.time_between_checkpoints": 0.1,
                "checkpoint.checkpoint_folder": folder / "ck", **values}
    return [f"{k}={v}" for k, v in settings.items()]


def _logged(out: Path, text: str) -> bool:
    try:
        return text in (out / "dlio.log").read_text()
    except OSError:
        return False


def _stop_after(cmd: list[str], out: Path, marker: str, delay: float) -> tuple[float, str]:
    """Start `cmd`, SIGTERM its ranks `delay` s after `marker` is in the log; (seconds from
    the signal to the job's end, its stderr)."""
    job = started_until(cmd, lambda: _logged(out, marker), timeout=120)
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
    took, err = _stop_after(_cmd([], over), tmp_path / "out", "workload ", 3)
    _assert_clean_stop(tmp_path, tmp_path / "out", took, err)


def test_the_results_of_thousands_of_epochs_are_written_promptly(tmp_path):
    """After a stop the results are written in time linear in the epochs, with a small
    constant: thousands of short epochs (2 steps, no compute) do not delay the end."""
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__num_files_train=4, reader__batch_size=1,
                              train__epochs=100000, output__stats_interval=0)
    took, err = _stop_after(_cmd([], over), tmp_path / "out", "workload ", 8)
    summary = _assert_clean_stop(tmp_path, tmp_path / "out", took, err)
    assert summary["epochs"] > 1000
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    assert len(stats) == summary["epochs"]


def test_a_paced_snapshot_ends_at_the_signal(tmp_path):
    over = _checkpointing(tmp_path, **{"checkpoint.async_write": "true",
                                       "checkpoint.snapshot_bytes_per_second": 10 * MiB,
                                       "output.folder": tmp_path / "out"})
    took, err = _stop_after(_cmd([], over), tmp_path / "out", "workload ", 3)
    summary = _assert_clean_stop(tmp_path, tmp_path / "out", took, err)
    assert summary["dlio_mpi"]["checkpoint"]["records"] == []  # the save cut short, removed


@pytest.fixture
def slow(tmp_path):
    with throttled_fs(tmp_path, THROTTLE) as (mount, prefix):
        yield mount, prefix


@pytest.mark.parametrize(("how", "ranks"), [("reader.staging", 2), ("reader.staging", 3),
                                           ("storage.stage_in", 2), ("storage.stage_in", 3)])
def test_reading_the_dataset_before_the_epochs_ends_at_the_signal(tmp_path, slow, how, ranks):
    """reader.staging's reads into memory, storage.stage_in's copy to a faster tier."""
    mount, prefix = slow
    data = workload_overrides(tmp_path, dataset__data_folder=mount / "data",
                              dataset__num_files_train=48,
                              dataset__record_length_bytes=8 * MiB)  # 384 MiB
    gen = run_cli(["generate", "demo", *data])
    assert gen.returncode == 0, gen.stderr
    over = [*data, "workflow.generate_data=false",
            *(["reader.staging=replicated", "reader.odirect=true"] if how == "reader.staging"
              else [f"storage.stage_in={{to: {tmp_path / 'bb'}, odirect: true}}"])]
    took, err = _stop_after(_cmd(prefix, over, ranks), tmp_path / "out", "workload ", 3)
    summary = _assert_clean_stop(tmp_path, tmp_path / "out", took, err)
    assert summary["epochs"] == 0


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("phase", ["save", "drain", "background write", "restore"])
def test_checkpoint_io_ends_at_the_signal(tmp_path, slow, phase, ranks):
    mount, prefix = slow
    out = tmp_path / "out"
    values = {"output.folder": out}
    marker, delay = "workload ", 4
    if phase == "save":
        values |= {"checkpoint.checkpoint_folder": mount / "ck", "checkpoint.odirect": "true"}
    elif phase == "drain":  # saved fast on the local disk, drained to the slow tier
        values |= {"checkpoint.drain": f"{{to: {mount / 'pfs'}, odirect: true}}"}
        marker = " saved: "
    elif phase == "background write":  # the run's end waits for the asynchronous write
        values |= {"checkpoint.checkpoint_folder": mount / "ck", "checkpoint.odirect": "true",
                   "checkpoint.async_write": "true"}
    else:  # saved on the local disk, read back from the slow tier
        values |= {"checkpoint.drain": f"{{to: {mount / 'pfs'}, odirect: true, "
                                       "restore_from: pfs}",
                   "checkpoint.num_checkpoints_read": 1, "checkpoint.odirect": "true"}
        marker, delay = " drained: ", 2
    took, err = _stop_after(_cmd(prefix, _checkpointing(tmp_path, **values), ranks), out,
                            marker, delay)
    summary = _assert_clean_stop(tmp_path, out, took, err)
    kinds = [r["kind"] for r in summary["dlio_mpi"]["checkpoint"]["records"]
             if r.get("drain") is None or r["drain"]["complete"]]
    assert kinds == {"save": [], "drain": ["save"], "background write": [],
                     "restore": ["save", "drain"]}[phase]
