"""A batch system's time limit (SIGTERM) or a user's Ctrl-C (SIGINT) stops the job at the next
step on every rank, with the results so far written and marked incomplete, and a non-zero exit
(128 + the signal's number); a second signal ends it at once. On 2 MPI ranks, as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import mpiexec
from helpers import (
    ended_after,
    rank_pids,
    signal_one_rank_when,
    started_until,
    workload_overrides,
)

pytestmark = pytest.mark.timeout(180)

EPOCHS, STEPS = 6, 16


def start_run(tmp_path: Path, step_seconds: float = 0.03, **values
              ) -> tuple[subprocess.Popen, Path]:
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__num_files_train=2 * 2 * STEPS,
                              train__computation_time=step_seconds, train__epochs=EPOCHS,
                              **values)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "run", "demo", *over]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return job, tmp_path / "out"


def logged(out: Path, text: str) -> bool:
    try:
        return text in (out / "dlio.log").read_text()
    except OSError:
        return False


def in_epoch_2(out: Path) -> bool:
    return logged(out, "train epoch 1")


def wait_until(ready, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.02)


def assert_stopped(job: subprocess.Popen, out: Path, sig: int) -> dict:
    stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 128 + sig, (job.returncode, stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("dlio-mpi: error")]
    assert len(errors) == 1 and f"stopped by {signal.Signals(sig).name}" in errors[0], stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dlio_mpi"]["complete"] is False
    assert summary["dlio_mpi"]["stopped_by"] == signal.Signals(sig).name
    assert 1 <= len(summary["metric"]["train_au_percentage"]) < EPOCHS
    assert json.loads((out / "dlio_mpi_results.json").read_text())["state"] == "incomplete"
    assert not [p for p in out.rglob("*") if ".dlio_mpi-" in p.name]
    return summary


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_rank_with_the_results_so_far(tmp_path, sig):
    job, out = start_run(tmp_path)
    wait_until(lambda: in_epoch_2(out), job)
    job.send_signal(sig)  # mpiexec forwards it to every rank, as srun does
    assert_stopped(job, out, sig)


def test_a_signal_to_one_rank_stops_all_of_them_after_the_same_step(tmp_path):
    job, out = start_run(tmp_path)
    signal_one_rank_when(job, str(out), lambda: in_epoch_2(out), signal.SIGTERM)
    summary = assert_stopped(job, out, signal.SIGTERM)
    stats = json.loads((out / "per_epoch_stats.json").read_text())
    # the epoch it stopped in is there when AU could count a step of it, and shorter
    last = stats[str(len(summary["metric"]["train_au_percentage"]))]
    assert 1 <= last["steps"] <= STEPS


def test_read_once_stops_after_the_same_step_with_its_exchanges_ahead(tmp_path):
    """reader.staging read_once: the exchange threads, up to prefetch_size steps ahead, end at
    the same exchange on every rank, so the stop cannot leave one waiting alone."""
    job, out = start_run(tmp_path, reader__staging="read_once", reader__prefetch_size=3)
    signal_one_rank_when(job, str(out), lambda: in_epoch_2(out), signal.SIGTERM)
    assert_stopped(job, out, signal.SIGTERM)


def test_a_rank_dying_in_the_read_once_exchange_ends_the_job(tmp_path):
    """A rank killed between exchanges (reader.staging read_once): the others, in or on their
    way to the next Alltoallv, do not wait for it; the job ends within seconds."""
    job, out = start_run(tmp_path, reader__staging="read_once")
    signal_one_rank_when(job, str(out), lambda: in_epoch_2(out), signal.SIGKILL)
    began = time.monotonic()
    job.communicate(timeout=60)
    assert job.returncode != 0
    assert time.monotonic() - began < 30
    summary = out / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["dlio_mpi"]["complete"] \
        is False


def test_a_second_signal_ends_the_job_at_once(tmp_path):
    # the first stop would wait for the batch (20 s of preprocessing a sample; a compute wait
    # would end at the first signal)
    job, out = start_run(tmp_path, reader__preprocess_time=20)
    wait_until(lambda: logged(out, "generated"), job)
    time.sleep(1)
    start = time.monotonic()
    for _ in range(2):
        for pid in rank_pids(str(out)):
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
    job.communicate(timeout=60)
    assert job.returncode != 0 and time.monotonic() - start < 10
    assert not (out / "summary.json").exists()


def test_a_signal_during_evaluation_stops_it_at_the_next_step(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              workflow__evaluation="true", dataset__num_files_eval=64,
                              reader__batch_size_eval=1, evaluation__eval_time=0.5,
                              train__epochs=3)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "run", "demo", *over]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "out"
    wait_until(lambda: in_epoch_2(out), job)  # epoch 1's evaluation runs 16 s
    time.sleep(0.5)
    start = time.monotonic()
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=60)
    assert time.monotonic() - start < 5 and job.returncode == 128 + signal.SIGTERM
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dlio_mpi"]["stopped_by"] == "SIGTERM"
    assert len(summary["metric"]["train_au_percentage"]) == 1


def test_a_signal_during_a_long_compute_step_stops_every_rank_within_a_second(tmp_path):
    """A compute step of a minute: SIGTERM cuts the compute wait short on every rank (it
    looks for a stop every 0.1 s), so the job stops at that step in about a second."""
    job, out = start_run(tmp_path, step_seconds=60)
    # the first step's compute has begun once the plan is logged and the ranks have started
    wait_until(lambda: logged(out, "per epoch"), job)
    time.sleep(3)
    signalled = time.monotonic()
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=30)
    assert time.monotonic() - signalled < 5, stderr  # not the minute of the step
    assert job.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dlio_mpi"]["complete"] is False
    assert summary["dlio_mpi"]["stopped_by"] == "SIGTERM"


def _mpi_loaded(marker: str, ranks: int) -> bool:
    """Have all `ranks` ranks mapped the MPI library? (mpi4py loads it just before MPI_Init,
    after dlio-mpi records signals and before it loads the configuration.)"""
    pids = rank_pids(marker)
    if len(pids) < ranks:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fp:
                if "libmpi" not in fp.read():
                    return False
        except OSError:
            return False
    return True


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("to", ["launcher", "one rank"])
def test_a_signal_during_start_up_stops_every_rank_with_one_line(tmp_path, ranks, to):
    """SIGINT before the run's own stop handling (MPI_Init, the configuration loading): every
    rank ends together with 130 and one line, no traceback, nothing written. It was a
    KeyboardInterrupt per rank and an MPI_Abort."""
    from dlio_mpi.config.loader import workload_dir

    workload = tmp_path / "slow.yaml"  # 4 MB of comments: a second or more to parse
    workload.write_text(workload_dir().joinpath("demo.yaml").read_text()
                        + ("# " + "x" * 78 + "\n") * 50_000)
    over = workload_overrides(tmp_path, workflow__generate_data="true")
    marker = str(tmp_path / "out")
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", "run",
           str(workload), *over]
    job = started_until(cmd, lambda: _mpi_loaded(marker, ranks))

    def interrupt() -> None:
        if to == "launcher":  # mpiexec forwards it to every rank, as a user's Ctrl-C
            job.send_signal(signal.SIGINT)
        else:
            os.kill(max(rank_pids(marker)), signal.SIGINT)

    _, stderr = ended_after(job, interrupt)
    assert job.returncode == 128 + signal.SIGINT, stderr
    ours = [line for line in stderr.splitlines() if line.startswith("dlio-mpi")]
    assert ours == ["dlio-mpi: stopped by SIGINT during start-up"], stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "Abort" not in stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()
