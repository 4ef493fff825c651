"""How long a job takes to end after SIGTERM in each phase that waits (issue 30's target: under
2 s, the median of 5 on the development VM), beside the floor: an MPI job of two Python ranks
that only wait, SIGTERMed the same way (MPI_Finalize and the launcher's own teardown).

    python scripts/bench/stop_latency.py --work DIR [--rounds 5] [PHASE ...]

Phases: compute, snapshot (paced), results (after many short epochs), and, with root (a slow
file system: scripts/slow_pfs.sh at 64 MiB/s, so one 64 MiB call of each of the 2 ranks takes
about 2 s), staging (reader.staging replicated), stage_in, save, drain, write (the run's end
waiting for an asynchronous save's write), restore. Each job runs on 2 ranks; SIGTERM goes to
both ranks a few seconds into the phase; the time is from the signal to mpiexec's exit. Prints
one line per phase: the median, the range, and the median over the floor's."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLOW_PFS = ROOT / "scripts" / "slow_pfs.sh"
MiB = 2**20
SHARE = 384 * MiB  # a rank's checkpoint share: 12 s at 64 MiB/s
SLOW = ("staging", "stage_in", "save", "drain", "write", "restore")
PHASES = ("compute", "snapshot", "results", *SLOW)


def dlio(*args: str) -> list[str]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    return [str(mpiexec), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", *args]


def checkpointing(work: Path, folder: Path, **values) -> list[str]:
    settings = {"workflow.train": "false", "workflow.generate_data": "false",
                "workflow.checkpoint": "true", "model.parallelism.zero_stage": 3,
                "model.model_size_bytes": SHARE, "checkpoint.num_checkpoints_write": 1,
                "checkpoint.num_checkpoints_read": 0, "checkpoint.time_between_checkpoints": 0.1,
                "checkpoint.checkpoint_folder": folder / "ck",
                "dataset.data_folder": work / "data", "output.folder": work / "out", **values}
    return ["run", "demo", *(f"{k}={v}" for k, v in settings.items())]


def case(phase: str, work: Path, slow: Path | None) -> tuple[list[str], str, float]:
    """(the dlio-mpi arguments, the log line after which the phase runs, seconds to wait)."""
    data = [f"dataset.data_folder={work / ('data-' + phase)}", f"output.folder={work / 'out'}",
            "dataset.record_length_bytes_stdev=0", "output.progress_interval=0"]
    if phase == "compute":
        return ["run", "demo", *data, "train.computation_time=60"], "workload ", 2
    if phase == "snapshot":
        return checkpointing(work, work, **{"checkpoint.async_write": "true",
                                            "checkpoint.snapshot_bytes_per_second": 10 * MiB}
                             ), "workload ", 2
    if phase == "results":  # 2 steps an epoch, no compute: thousands of epochs
        return ["run", "demo", *data, "dataset.num_files_train=4", "reader.batch_size=1",
                "train.computation_time=0", "train.epochs=100000", "output.stats_interval=0",
                "dataset.record_length_bytes=4096"], "workload ", 10
    slow_data = [f"dataset.data_folder={slow / 'data'}", *data[1:],
                 "workflow.generate_data=false", "dataset.num_files_train=48",
                 f"dataset.record_length_bytes={8 * MiB}"]
    if phase == "staging":
        return ["run", "demo", *slow_data, "reader.staging=replicated", "reader.odirect=true"
                ], "workload ", 3
    if phase == "stage_in":
        return ["run", "demo", *slow_data, f"storage.stage_in={{to: {work / 'bb'}, odirect: "
                "true}"], "workload ", 3
    if phase == "save":
        return checkpointing(work, slow, **{"checkpoint.odirect": "true"}), "workload ", 4
    if phase == "drain":
        return checkpointing(work, work, **{"checkpoint.drain": f"{{to: {slow / 'pfs'}, "
                                            "odirect: true}"}), " saved: ", 4
    if phase == "write":
        return checkpointing(work, slow, **{"checkpoint.odirect": "true",
                                            "checkpoint.async_write": "true"}), "workload ", 4
    return checkpointing(work, work, **{  # restore: from the slow tier, once drained there
        "checkpoint.drain": f"{{to: {slow / 'pfs'}, odirect: true, restore_from: pfs}}",
        "checkpoint.num_checkpoints_read": 1, "checkpoint.odirect": "true"}), " drained: ", 2


def ranks_with(marker: bytes) -> list[int]:
    """The pids of the Python ranks whose command line holds `marker` (not mpiexec's)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmd and b"mpiexec" not in cmd and b"python" in cmd:
                pids.append(int(entry))
    return pids


def stop_seconds(cmd: list[str], log: Path, marker: str, wait: float) -> float:
    """Start `cmd`, SIGTERM its ranks `wait` s after `marker` is in `log`; seconds to its end."""
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while not (log.exists() and marker in log.read_text(errors="replace")):
        if job.poll() is not None or time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            raise SystemExit(f"{' '.join(cmd)} ended first:\n{job.communicate()[1]}")
        time.sleep(0.02)
    time.sleep(wait)
    for pid in ranks_with(b"dlio_mpi"):
        os.kill(pid, signal.SIGTERM)
    sent = time.monotonic()
    _, err = job.communicate(timeout=120)
    took = time.monotonic() - sent
    if job.returncode != 128 + signal.SIGTERM:
        raise SystemExit(f"exit {job.returncode}, not 143:\n{err}")
    return took


def floor_seconds(work: Path) -> float:
    """Two Python ranks that import mpi4py and wait, SIGTERMed: the launcher's teardown."""
    ready = work / "floor-ready"
    ready.unlink(missing_ok=True)
    code = ("import pathlib, signal; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
            "signal.signal(signal.SIGTERM, lambda *a: None); "
            f"pathlib.Path('{ready}').touch(); signal.pause(); MPI.Finalize()  # floor")
    job = subprocess.Popen([str(Path(sys.executable).parent / "mpiexec"), "-n", "2",
                            sys.executable, "-c", code], start_new_session=True)
    while not ready.exists():
        time.sleep(0.01)
    time.sleep(0.5)
    for pid in ranks_with(b"# floor"):
        os.kill(pid, signal.SIGTERM)
    sent = time.monotonic()
    job.wait(timeout=60)
    return time.monotonic() - sent


def prepare(phase: str, work: Path, slow: Path | None) -> None:
    """Fresh folders; the slow tier's dataset for the phases reading it."""
    for name in ("out", "ck", "bb"):
        shutil.rmtree(work / name, ignore_errors=True)
    if slow is not None:
        for name in ("ck", "pfs"):
            shutil.rmtree(slow / name, ignore_errors=True)
    if phase in ("staging", "stage_in") and not (slow / "data").exists():
        subprocess.run(dlio("generate", "demo", f"dataset.data_folder={slow / 'data'}",
                            "dataset.num_files_train=48", f"dataset.record_length_bytes={8 * MiB}",
                            "dataset.record_length_bytes_stdev=0",
                            "output.progress_interval=0"), check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("phases", nargs="*", default=list(PHASES))
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    slow = None
    if any(p in SLOW for p in args.phases):
        if os.geteuid() != 0:
            raise SystemExit("the slow phases need root (scripts/slow_pfs.sh)")
        slow = work / "slow"
        subprocess.run(["bash", str(SLOW_PFS), "up", "--mount", str(slow), "--size", "3G",
                        "--read-mibps", "64", "--write-mibps", "64", "--image",
                        str(work / "slow.img")], check=True)
    try:
        floors = [floor_seconds(work) for _ in range(args.rounds)]
        base = statistics.median(floors)
        print(f"floor    median {base:.3f} s  range {min(floors):.3f}-{max(floors):.3f} s")
        for phase in args.phases:
            took = []
            for _ in range(args.rounds):
                prepare(phase, work, slow)
                dlio_args, marker, wait = case(phase, work, slow)
                cmd = dlio(*dlio_args)
                if phase in SLOW:
                    cmd = ["bash", str(SLOW_PFS), "run", "--", *cmd]
                took.append(stop_seconds(cmd, work / "out" / "dlio.log", marker, wait))
            median = statistics.median(took)
            print(f"{phase:8s} median {median:.3f} s  range {min(took):.3f}-{max(took):.3f} s"
                  f"  {median / base:.1f}x the floor", flush=True)
    finally:
        if slow is not None:
            subprocess.run(["bash", str(SLOW_PFS), "down"], check=False)
            (work / "slow.img").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
