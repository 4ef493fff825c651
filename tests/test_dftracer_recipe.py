"""The DFTracer recipe of docs/clusters.md: under DFTracer's preload library (pydftracer, the
tracer the DLIO benchmark uses) a dlio-mpi run leaves one .pfw trace per rank in which every
read request of the C core is a `pread` event of a dataset file, as DLIO users' tools expect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from helpers import mpiexec, workload_overrides

dftracer = pytest.importorskip("dftracer", reason="pydftracer is installed on x86_64 only")


def _events(path) -> list[dict]:
    with open(path, encoding="utf-8") as fp:
        lines = [line.strip() for line in fp]
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_run_under_dftracer_traces_every_read(tmp_path):
    preload = os.path.join(dftracer.__path__[0], "lib", "libdftracer_preload.so")
    assert os.path.isfile(preload)
    data, traces = tmp_path / "data", tmp_path / "dft"
    # one reader thread: pydftracer 1.0.2 (DFTracer 3.0.0) corrupted its heap in about 1 run in
    # 5 with two threads reading at once (our C core is ASan-clean on the same run)
    overrides = workload_overrides(tmp_path, reader__read_threads=1)
    generate = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "generate",
                "demo", *overrides]
    assert subprocess.run(generate, capture_output=True, timeout=120).returncode == 0
    env = {"LD_PRELOAD": preload, "DFTRACER_ENABLE": "1", "DFTRACER_INIT": "PRELOAD",
           "DFTRACER_DATA_DIR": str(data), "DFTRACER_LOG_FILE": str(traces / "trace"),
           "DFTRACER_INC_METADATA": "1"}
    traces.mkdir()
    cmd = [mpiexec(), "-n", "2", "env", *(f"{k}={v}" for k, v in env.items()),
           sys.executable, "-P", "-m", "dlio_mpi", "run", "demo", *overrides,
           "workflow.generate_data=false"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    files = sorted(traces.glob("trace-*.pfw"))
    assert len(files) == 2  # one per rank
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reads = [e for f in files for e in _events(f) if e["name"] == "pread"]
    assert len(reads) == summary["metric"]["train_read_ops"]
    for e in reads:
        args = e["args"]
        assert args["fname"].startswith(str(data / "train"))
        # (0: the read at the end of a file that the modelled loader makes, as numpy does)
        assert 0 <= int(args["ret"]) <= int(args["count"])
    # each rank's reads, in its own file, from its own process
    assert all(len(Counter(e["pid"] for e in _events(f) if e["name"] == "pread")) == 1
               for f in files)
    assert len({e["pid"] for e in reads}) == 2
    assert sum(int(e["args"]["ret"]) for e in reads) == sum(
        e["bytes_transferred"] for e in json.loads(
            (tmp_path / "out" / "per_epoch_stats.json").read_text()).values())
