"""End to end under strace: in loader mode (the default) a run issues, on the data files, the
system calls np.load issues for the same samples (npy and npz: opens, reads, bytes); in lean
mode it opens each file once and reads each sample in one call."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import mpiexec
from helpers import run_cli, workload_overrides

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]

CALL = re.compile(r"^(\w+)\((\d+)<([^>]*)>.*\)\s+=\s+(-?\d+)")
OPEN = re.compile(r'^openat\(AT_FDCWD(?:<[^>]*>)?, "([^"]+)", ([A-Z_|]+).*\)\s+=\s+(\d+)')


def _calls(logs, folder: str) -> dict:
    """Opens, reads (count and bytes returned) and fstats on files under `folder`, from the
    per-thread logs of `strace -ff -y`."""
    out = {"opens": 0, "reads": 0, "bytes": 0, "preads": 0, "pread_bytes": 0, "fstats": 0,
           "nonblocking_opens": 0}
    lines = [line for log in logs for line in log.read_text().splitlines()]
    for line in lines:
        m = OPEN.match(line)
        if m and m.group(1).startswith(folder) and "O_DIRECTORY" not in m.group(2):
            out["opens"] += 1
            out["nonblocking_opens"] += "O_NONBLOCK" in m.group(2)
            continue
        m = CALL.match(line)
        if not m or not m.group(3).startswith(folder):
            continue
        call, result = m.group(1), int(m.group(4))
        if call in ("read", "pread64"):
            out["reads"] += 1
            out["bytes"] += max(result, 0)
        if call == "pread64":  # the engine's reads (Python reads with read)
            out["preads"] += 1
            out["pread_bytes"] += max(result, 0)
        elif call in ("fstat", "newfstatat", "statx"):
            out["fstats"] += 1
    return out


def _strace(cmd: list[str], prefix) -> list:
    """Run cmd under strace, one log per thread (no interleaved lines); returns the logs."""
    subprocess.run(["strace", "-ff", "-qq", "-y", "-o", str(prefix),
                    "-e", "trace=openat,read,pread64,fstat,newfstatat,statx", *cmd],
                   check=True, capture_output=True, timeout=120)
    return sorted(prefix.parent.glob(prefix.name + ".*"))


@pytest.mark.parametrize("fmt", ["npy", "npz"])
def test_loader_mode_issues_the_system_calls_of_np_load(tmp_path, fmt):
    over = workload_overrides(tmp_path, dataset__format=fmt, dataset__num_files_train=8,
                              dataset__record_length_bytes=700_000, train__epochs=1,
                              reader__read_threads=2)
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    train = str(tmp_path / "data" / "train")
    logs = _strace([mpiexec(), "-n", "1", sys.executable, "-P", "-m", "dlio_mpi", "run",
                    "demo", *over, "workflow.generate_data=false"], tmp_path / "run")
    ours = _calls(logs, train)
    key = "['x']" if fmt == "npz" else ""
    script = (f"import glob, numpy as np\n"
              f"for p in sorted(glob.glob('{train}/*.{fmt}')): np.load(p){key}\n")
    ref = _calls(_strace([sys.executable, "-c", script], tmp_path / "ref"), train)
    # the engine's opens are its own (non-blocking, reads with pread); for npz, rank 0 also
    # reads one file's zip records at start-up to model them, through one more (non-blocking)
    assert ref["opens"] == 8, ref
    assert ours["nonblocking_opens"] == ref["opens"] + (fmt == "npz"), (ours, ref)
    assert ours["opens"] == ours["nonblocking_opens"], ours
    assert ours["preads"] == ref["reads"] and ours["pread_bytes"] == ref["bytes"], (ours, ref)


def test_lean_mode_opens_each_file_once_and_reads_each_sample_once(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="npy", dataset__num_files_train=8,
                              dataset__num_samples_per_file=4, reader__read_mode="sample",
                              reader__access="lean", train__epochs=2, reader__batch_size=4,
                              reader__read_threads=1)
    res = run_cli(["run", "demo", *over], ranks=1)
    assert res.returncode == 0, res.stderr
    import json

    metric = json.loads((tmp_path / "out" / "summary.json").read_text())["metric"]
    assert metric["train_file_opens"] == 8  # cached across both epochs
    assert metric["train_read_ops"] == 2 * 32
    assert metric["train_bytes_read"] == metric["train_bytes_transferred"] == 2 * 32 * 4096


def test_drop_page_cache_advises_away_each_epochs_files_before_it(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="npy", dataset__num_files_train=8,
                              reader__drop_page_cache="true", train__epochs=2)
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    prefix = tmp_path / "run"
    subprocess.run(["strace", "-ff", "-qq", "-y", "-o", str(prefix), "-e", "trace=fadvise64",
                    mpiexec(), "-n", "1", sys.executable, "-P", "-m", "dlio_mpi", "run", "demo",
                    *over, "workflow.generate_data=false"], check=True, capture_output=True,
                   timeout=120)
    calls = [line for log in prefix.parent.glob("run.*") for line in log.read_text().splitlines()
             if "POSIX_FADV_DONTNEED" in line and "/train/" in line]
    assert len(calls) == 2 * 8, calls
