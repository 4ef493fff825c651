"""What a run records to be reproduced (summary.json's dlio_mpi.environment and
dlio_mpi.config) and how it shows its progress (rank 0 only: lines in a log, a bar on a
terminal)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
import yaml

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(180)


def test_summary_records_software_command_line_placement_folders_and_config(tmp_path,
                                                                             monkeypatch):
    import mpi4py
    import numpy
    from mpi4py import MPI

    monkeypatch.setenv("DLIO_MPI_RANKS_PER_NODE", "1")  # two emulated nodes of one rank
    args = ["run", "demo", *workload_overrides(
        tmp_path, workflow__checkpoint="true", checkpoint__checkpoint_folder=str(tmp_path / "ck"),
        checkpoint__epochs_between_checkpoints=1, model__model_size_bytes=1 << 20)]
    res = run_cli(args)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ours = summary["dlio_mpi"]
    env = ours["environment"]
    versions = env["versions"]
    assert versions["dlio_mpi"] == ours["version"]
    assert versions["mpi4py"] == mpi4py.__version__ and versions["numpy"] == numpy.__version__
    assert versions["python"] == ".".join(str(v) for v in sys.version_info[:3])
    assert "torch" not in versions and "tensorflow" not in versions  # never imported to look
    name, version = MPI.get_vendor()
    assert env["mpi"]["name"] == name
    assert env["mpi"]["version"] == ".".join(map(str, version))
    first = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()
    assert env["mpi"]["library_version"] == first
    assert env["command_line"][1:] == args  # argv[0]: dlio_mpi's __main__
    assert env["ranks"] == 2 and sum(env["ranks_per_host"].values()) == 2
    assert [n["ranks"] for n in env["nodes"]] == [[0], [1]]
    assert [n["node"] for n in env["nodes"]] == [0, 1]
    assert {n["host"] for n in env["nodes"]} == set(env["ranks_per_host"]) == set(ours["hosts"])
    assert ours["nodes"] == 2 and ours["ranks_per_node"] == 1
    # every folder the run used, with its file system
    fs = ours["filesystems"]
    assert set(fs) == {"data_folder", "data_file", "checkpoint_folder", "output_folder"}
    assert fs["checkpoint_folder"]["path"] == str(tmp_path / "ck")
    assert all(f["type"] not in ("", "unknown") for f in fs.values())
    # the resolved configuration: every key, the overrides applied, as config.yaml holds it
    config = ours["config"]
    assert config["dataset"]["num_files_train"] == 8 and config["reader"]["batch_size"] == 2
    assert config["checkpoint"]["checkpoint_folder"] == str(tmp_path / "ck")
    assert config["output"]["folder"] == str(tmp_path / "out")
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["workload"]
    assert config == json.loads(json.dumps(written))


PROGRESS_LINE = re.compile(
    r"progress: (train|eval) epoch (\d+): (\d+)/(\d+) steps \(\d+\.\d %\), \d+\.\d steps/s, "
    r"\d\d:\d\d elapsed(, ETA \d\d:\d\d)?"
    r"(; last \d+ s: \d+\.\d steps/s, rank 0 read \d+\.\d MiB/s)?")


def _slow_epochs(tmp_path, **values) -> list[str]:
    """2 epochs of 10 steps of 0.05 s per rank on 2 ranks (40 files, batch 2)."""
    return ["run", "demo", *workload_overrides(
        tmp_path, dataset__num_files_train=40, train__computation_time=0.05, **values)]


def test_progress_is_plain_lines_on_rank_0_when_stdout_is_not_a_terminal(tmp_path):
    res = run_cli(_slow_epochs(tmp_path, output__progress_interval=0.2))
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("progress:")]
    assert lines, res.stdout
    for line in lines:
        match = PROGRESS_LINE.fullmatch(line)
        assert match, line
        assert match[1] == "train" and int(match[4]) == 10 and 0 < int(match[3]) <= 10
    # at most one line per interval: an epoch of about 0.5 s gives at most 0.5 / 0.2 + 1
    # lines, from one rank (two ranks would print each about as often)
    for epoch in ("1", "2"):
        mine = [line for line in lines if PROGRESS_LINE.fullmatch(line)[2] == epoch]
        assert len(mine) <= 3, lines
        counts = [int(PROGRESS_LINE.fullmatch(line)[3]) for line in mine]
        assert counts == sorted(set(counts)), lines  # one rank's view, growing
    assert "\r" not in res.stdout and "it/s" not in res.stdout  # no bar in a log
    assert "progress:" not in res.stderr


def test_progress_interval_0_shows_none(tmp_path):
    res = run_cli(_slow_epochs(tmp_path, output__progress_interval=0))
    assert res.returncode == 0, res.stderr
    assert "progress:" not in res.stdout and "progress:" not in res.stderr


def test_a_negative_progress_interval_is_refused(tmp_path):
    res = run_cli(_slow_epochs(tmp_path, output__progress_interval=-1), ranks=1)
    assert res.returncode == 2 and "output.progress_interval" in res.stderr, res.stderr
    assert not (tmp_path / "data").exists()


def _run_on_a_terminal(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run `python -m dlio_mpi ARGS` as a singleton MPI process (no mpiexec: its output
    would be piped) with stdout and stderr on a pseudo-terminal; its exit status and output."""
    master, slave = pty.openpty()
    job = subprocess.Popen([sys.executable, "-P", "-m", "dlio_mpi", *args], stdin=slave,
                           stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if job.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not data:
                break
            chunks.append(data)
        status = job.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if job.poll() is None:
            job.kill()
        os.close(master)
    return status, b"".join(chunks).decode(errors="replace")


def test_progress_is_a_bar_with_rate_and_eta_on_a_terminal(tmp_path):
    status, text = _run_on_a_terminal(_slow_epochs(tmp_path, train__epochs=1))
    assert status == 0, text
    # tqdm redraws the bar in place (\r): the epoch's 20 steps, its rate and ETA
    assert "\rtrain epoch 1:" in text, text
    assert re.search(r"train epoch 1: 100%\|[^|]*\| 20/20 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+ "
                     r"steps/s\]", text), text
    assert "progress:" not in text  # no plain lines on a terminal
    assert (tmp_path / "out" / "summary.json").exists()


def test_a_run_whose_measured_steps_read_nothing_reports_its_whole_epochs_bytes(tmp_path):
    """One npz file of 16 samples, loaded by each rank once an epoch at its step 0
    (read_mode file_once): AU's span holds no reads, so its MiB/s is 0, and the whole epoch's
    figure (ours) gives the bytes storage returned over the epoch's duration."""
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__num_files_train=1, dataset__num_samples_per_file=16,
                              reader__read_mode="file_once", reader__batch_size=2,
                              train__computation_time=0.01, train__epochs=2)
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    m = json.loads((out / "summary.json").read_text())["metric"]
    epochs = json.loads((out / "per_epoch_stats.json").read_text())
    assert m["train_transfer_MiB_per_second"] == [0.0, 0.0] and m["train_bytes_transferred"] > 0
    for e, rate in zip(("1", "2"), m["train_epoch_transfer_MiB_per_second"]):
        entry = epochs[e]
        assert entry["epoch_transfer_MiB_per_second"] == rate
        assert rate == pytest.approx(entry["bytes_transferred"] / 2**20 / entry["duration"],
                                     rel=1e-4) and rate > 0  # (duration: to the us)
    assert m["train_epoch_transfer_mean_MiB_per_second"] == pytest.approx(
        sum(m["train_epoch_transfer_MiB_per_second"]) / 2)
