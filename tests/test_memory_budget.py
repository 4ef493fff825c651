"""One memory budget (plan/memory.py, mpi/host_memory.py; issue 30): what a node can still give
the job is the smaller of MemAvailable and its memory cgroup's room (v1 and v2, every level),
and everything a rank's plan holds is counted against it once, before any I/O.

The real test runs jobs in a real memory cgroup of 300 MiB made for it (v1 and v2 where the
machine has them): replicated staging, read_once staging and an asynchronous snapshot, each
OOM-killed without a word before, are refused with one message naming the cgroup, exit 2; a
job that fits runs there."""

from __future__ import annotations

import sys

import pytest

from helpers import memory_cgroup, mpiexec, workload_overrides

MiB = 2**20


def _fake_proc(tmp_path, version: int, limit: int, usage: int, cache: int,
               available: int):
    """A /proc and a cgroup tree of one cgroup `job` (version 1 or 2) under tmp_path."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available // 1024} "
                                  "kB\n")
    job = root / "job"
    job.mkdir(parents=True)
    if version == 2:
        (proc / "self" / "mountinfo").write_text(
            f"30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
        (proc / "self" / "cgroup").write_text("0::/job\n")
        (root / "cgroup.controllers").write_text("cpu io memory pids\n")
        (job / "memory.max").write_text(f"{limit}\n")
        (job / "memory.current").write_text(f"{usage}\n")
        (job / "memory.stat").write_text(f"anon {usage - cache}\ninactive_file {cache}\n"
                                         "active_file 0\n")
        (root / "memory.current").write_text("1\n")  # the root sets no limit
    else:
        (proc / "self" / "mountinfo").write_text(
            f"31 25 0:27 / {root} rw,nosuid - cgroup cgroup rw,memory\n")
        (proc / "self" / "cgroup").write_text("5:memory:/job\n1:cpu:/\n")
        (job / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (job / "memory.usage_in_bytes").write_text(f"{usage}\n")
        (job / "memory.stat").write_text(f"cache {cache}\ntotal_inactive_file {cache}\n"
                                         "total_active_file 0\n")
        (root / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # no limit
    return str(proc)


@pytest.mark.parametrize("version", [1, 2])
def test_the_budget_is_the_cgroups_room_less_what_cannot_be_reclaimed(tmp_path, version):
    from dlio_mpi.mpi.host_memory import node_budget

    proc = _fake_proc(tmp_path, version, limit=300 * MiB, usage=100 * MiB, cache=20 * MiB,
                      available=8 << 30)
    budget = node_budget(proc)
    assert (budget.bytes, budget.kind, budget.limit, budget.in_use) == (
        220 * MiB, f"cgroup v{version}", 300 * MiB, 80 * MiB)
    assert budget.folder == str(tmp_path / "cgroup" / "job")
    # MemAvailable where it is the smaller
    proc = _fake_proc(tmp_path / "b", version, limit=300 * MiB, usage=0, cache=0,
                      available=100 * MiB)
    assert node_budget(proc).bytes == 100 * MiB and node_budget(proc).kind == "MemAvailable"


def test_a_drain_buffer_is_counted():
    from dlio_mpi.config import load_config
    from dlio_mpi.errors import UserError
    from dlio_mpi.plan.derive import derive_plan

    cfg = load_config("demo", ["workflow.checkpoint=true", "dataset.record_length_bytes_stdev=0",
                               "checkpoint.drain={to: /tmp/pfs}"])
    with pytest.raises(UserError, match="checkpoint.drain's copy buffer 128.0 MiB"):
        derive_plan(cfg, 2, ranks_per_node=2, nodes=1, memory_bytes=128 * MiB)


def _run(prefix: list[str], tmp_path, *args: str):
    import subprocess

    cmd = [*prefix, mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("version", [1, 2])
def test_jobs_past_a_memory_cgroup_are_refused_not_killed(tmp_path, version):
    data = workload_overrides(tmp_path, dataset__num_files_train=40,
                              dataset__record_length_bytes=4 * MiB)  # 160 MiB
    gen = _run([], tmp_path, "generate", "demo", *data)
    assert gen.returncode == 0, gen.stderr
    with memory_cgroup(version, 300 * MiB) as inside:
        fits = _run(inside, tmp_path, "run", "demo", *data)
        assert fits.returncode == 0, fits.stderr
        for key, extra in (("reader.staging", ["reader.staging=replicated"]),
                           ("reader.staging", ["reader.staging=read_once"]),
                           ("checkpoint.async_write", [
                               "workflow.checkpoint=true", "checkpoint.async_write=true",
                               "model.parallelism.zero_stage=3",
                               f"model.model_size_bytes={200 * MiB}",
                               f"checkpoint.checkpoint_folder={tmp_path / 'ck'}"])):
            res = _run(inside, tmp_path, "run", "demo", *data, *extra)
            errors = [line for line in res.stderr.splitlines() if "error" in line]
            assert res.returncode == 2, (extra, res.returncode, res.stderr)  # not 9: killed
            assert len(errors) == 1 and errors[0].startswith(f"dlio-mpi: error: {key}: "), \
                res.stderr
            assert f"the job's memory cgroup (v{version})" in errors[0], errors[0]
