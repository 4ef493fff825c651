"""Nothing hangs, whatever is in the data folder: real runs on 2 ranks (mpiexec), each bounded.

- Where a data file should be there is a FIFO, a directory, a truncated file or nothing; the
  data is vouched for by its manifest or not (foreign data, probed); the file is one start-up
  checks look at (an error all ranks agree on) or one only the engine opens (the rank that
  reads it says so in its step's allreduce, and the ranks agree there: no MPI_Abort, so
  MPICH's shared-memory segment is removed). Every case ends within seconds with exit status 2
  and exactly one message naming the file.
- The I/O watchdog: an open or read stuck in the kernel (made so by the engine's test hook
  DLIO_MPI_TEST_STALL, as a dead NFS or Lustre server would) is reported once by the rank
  that waits for it, while the other rank waits in the step barrier; with
  reader.io_watchdog_abort the job ends. The same for reads of the MPI-IO backends (the test
  hook stalls them too), where in a collective read the other rank waits for it and says
  so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import mpiexec
from dlio_mpi.data.catalog import spot_indices
from dlio_mpi.data.manifest import MANIFEST_NAME
from helpers import ended_after, rank_pids, started_until

pytestmark = pytest.mark.timeout(300)

FILES = 16
STARTUP = spot_indices(FILES)[2]  # a file the start-up checks look at
ENGINE = min(set(range(FILES)) - set(spot_indices(FILES)))  # one only the engine opens
BOUND = 30  # seconds any of these runs may take
RANKS = 2
# Unshuffled, rank r reads the files [r * FILES / RANKS, (r + 1) * FILES / RANKS) (sharding.py).
UNSHUFFLED = ["reader.file_shuffle=off", "reader.sample_shuffle=off"]

@dataclass
class Job:
    returncode: int
    output: str  # stdout and stderr
    seconds: float

    def lines_naming(self, name: str) -> list[str]:
        return [line for line in self.output.splitlines() if name in line]


def job_command(folder: Path, *overrides: str, ranks: int = RANKS, compute: float = 0
                ) -> list[str]:
    """`dlio-mpi run` on `ranks` ranks of the 16-file workload in folder (no generation),
    steps of `compute` seconds."""
    over = [f"dataset.data_folder={folder / 'data'}", f"output.folder={folder / 'out'}",
            f"dataset.num_files_train={FILES}", "dataset.record_length_bytes=4096",
            "dataset.record_length_bytes_stdev=0", "reader.batch_size=2",
            f"train.computation_time={compute}", "train.epochs=1",
            "workflow.generate_data=false",
            *overrides]
    return [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", "run", "demo",
            *over]


def run_job(folder: Path, *overrides: str, env: dict | None = None) -> Job:
    """job_command run; a run that outlives BOUND fails the test (and is killed)."""
    cmd = job_command(folder, *overrides)
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"no end after {BOUND} s: {' '.join(cmd)}")
    return Job(res.returncode, res.stdout + res.stderr, time.monotonic() - start)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The workload's data, generated once (with its manifest)."""
    folder = tmp_path_factory.mktemp("generated")
    cmd = [mpiexec(), "-n", str(RANKS), sys.executable, "-P", "-m", "dlio_mpi", "generate",
           "demo", f"dataset.data_folder={folder / 'data'}", f"output.folder={folder / 'out'}",
           f"dataset.num_files_train={FILES}", "dataset.record_length_bytes=4096",
           "dataset.record_length_bytes_stdev=0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return folder


@pytest.fixture
def data(generated, tmp_path) -> Path:
    """A copy of the generated data to spoil."""
    shutil.copytree(generated / "data", tmp_path / "data")
    return tmp_path


def data_file(folder: Path, index: int) -> Path:
    return folder / "data" / "train" / f"img_{index:02d}_of_{FILES}.npz"


def spoil(path: Path, fault: str) -> None:
    if fault == "truncated":
        os.truncate(path, 1000)
        return
    path.unlink()
    if fault == "fifo":
        os.mkfifo(path)
    elif fault == "directory":
        path.mkdir()


def expected_message(fault: str, path: Path, manifest: bool, at_startup: bool) -> str:
    """What the one message says about the file (a regular expression)."""
    p = re.escape(str(path))
    if fault in ("fifo", "directory"):
        return f"{p} is a {'FIFO' if fault == 'fifo' else 'directory'}, not a regular file"
    if fault == "deleted":
        if not manifest:  # the files are listed: one is missing
            return (f"found {FILES - 1} of dataset.num_files_train={FILES} files "
                    f"\\(first missing: {p}\\)")
        return f"{p} is missing" if at_startup else f"open {p}: No such file or directory"
    if not at_startup:
        return f"short read of {p} at offset 0: expected 4096 bytes, got 1000"
    if manifest:
        return f"{p} has 1000 bytes where the configuration that generated it gives"
    return f"{p} is not a zip archive np.load can read"


CASES = [(fault, manifest, at_startup, odirect)
         for fault in ("fifo", "directory", "truncated", "deleted")
         for manifest in (True, False)
         for at_startup in (True, False)
         for odirect in ((False, True) if fault == "fifo" else (False,))]


@pytest.mark.parametrize(("fault", "manifest", "at_startup", "odirect"), CASES, ids=[
    f"{f}-{'manifest' if m else 'foreign'}-{'startup' if s else 'engine'}{'-odirect' * o}"
    for f, m, s, o in CASES])
def test_a_bad_data_file_ends_the_job_with_one_message_naming_it(data, fault, manifest,
                                                                  at_startup, odirect):
    path = data_file(data, STARTUP if at_startup else ENGINE)
    spoil(path, fault)
    if not manifest:
        (data / "data" / MANIFEST_NAME).unlink()
    job = run_job(data, f"reader.odirect={str(odirect).lower()}")
    named = job.lines_naming(path.name)
    assert len(named) == 1, job.output
    assert re.search(expected_message(fault, path, manifest, at_startup), named[0]), job.output
    # agreed at start-up, or in the step's allreduce (naming the rank that read it): printed
    # by rank 0, exit 2
    assert job.returncode == 2, job.output
    assert named[0].startswith("dlio-mpi: error: "), job.output
    if not at_startup and not (fault == "deleted" and not manifest):  # shuffled: any rank
        assert re.search(r" \(on rank [01]\)$", named[0]), job.output
    assert "Abort" not in job.output
    assert job.seconds < BOUND


def _mpich_segments(marker: str) -> set[str]:
    """The MPICH shared-memory segments (/dev/shm/mpich_shm_*) the job's ranks have mapped."""
    found = set()
    for pid in rank_pids(marker):
        try:
            with open(f"/proc/{pid}/maps") as fp:
                found |= set(re.findall(r"/dev/shm/mpich_shm_\S+", fp.read()))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm: no MPICH segment")
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_failed_read_on_one_rank_ends_every_rank_with_exit_2_and_leaves_no_segment(
        data, ranks):
    """The rank whose batch fails tells the others in its step's allreduce; they agree on the
    message and exit 2 through MPI_Finalize, which removes MPICH's node segment (MPI_Abort,
    as before, left its 2 MiB in /dev/shm until reboot)."""
    index = FILES // 2 + 1  # unshuffled, the last rank's second file (start-up checks skip it)
    assert index not in spot_indices(FILES)
    spoil(data_file(data, index), "truncated")
    marker = str(data / "out")
    cmd = job_command(data, *UNSHUFFLED, ranks=ranks, compute=1)
    segments: set[str] = set()

    def mapped() -> bool:  # the job's own segments, whatever other jobs do meanwhile
        segments.update(_mpich_segments(marker))
        return len(rank_pids(marker)) == ranks and bool(segments)

    job = started_until(cmd, mapped, timeout=BOUND)
    out, err = ended_after(job, lambda: None, timeout=BOUND)
    assert job.returncode == 2, out + err
    ours = [line for line in err.splitlines() if line.startswith("dlio-mpi")]
    assert ours == [f"dlio-mpi: error: short read of {data_file(data, index)} at offset 0: "
                    "expected 4096 bytes, got 1000 (the file ends before the data planned "
                    f"from its layout) (on rank {ranks - 1})"], err
    assert "Abort" not in out + err
    assert not [name for name in segments if os.path.exists(name)], segments
    assert '"state": "failed"' in (data / "out" / "dlio_mpi_results.json").read_text()
    assert ours[0] in (data / "out" / "dlio.log").read_text()


def _rank_reading(index: int) -> int:
    return index // (FILES // RANKS)


# (stalled operation, reader.file_access): MPI-IO opens are not watched
STALLS = [("read", "multi"), ("open", "multi"), ("read", "shared"), ("read", "collective")]


@pytest.mark.parametrize(("op", "access"), STALLS)
def test_a_stuck_request_is_reported_once_by_its_rank_and_the_run_goes_on(data, op, access):
    path = data_file(data, FILES - 1)
    job = run_job(data, *UNSHUFFLED, "reader.io_watchdog_seconds=1",
                  f"reader.file_access={access}",
                  env={"DLIO_MPI_TEST_STALL": f"{op}:3:{path.name}"})
    assert job.returncode == 0, job.output
    reports = sorted(line for line in job.output.splitlines() if "watchdog" in line)
    what = "a read" if op == "read" else "an open"
    # waited 3 s: three times the limit, one report; in a collective read, every rank waits
    waiting = range(RANKS) if access == "collective" else [_rank_reading(FILES - 1)]
    assert len(reports) == len(waiting), job.output
    for rank, report in zip(waiting, reports):
        m = re.fullmatch(f"dlio-mpi: rank {rank}: watchdog: {what} of "
                         f"{re.escape(str(path))} has waited (\\d+\\.\\d) s "
                         "\\(reader.io_watchdog_seconds=1\\)", report)
        assert m and 1.0 <= float(m.group(1)) < 2.0, job.output
    assert (data / "out" / "summary.json").exists()


@pytest.mark.parametrize(("op", "access"), STALLS)
def test_a_stuck_request_with_abort_ends_the_job_promptly(data, op, access):
    path = data_file(data, FILES - 1)
    job = run_job(data, *UNSHUFFLED, "reader.io_watchdog_seconds=1",
                  "reader.io_watchdog_abort=true", f"reader.file_access={access}",
                  env={"DLIO_MPI_TEST_STALL": f"{op}:600:{path.name}"})
    assert job.returncode != 0 and job.seconds < 15, job.output  # not the 600 s of the stall
    named = job.lines_naming(path.name)
    what = "a read" if op == "read" else "an open"
    # in a collective read every rank waits: whichever reaches its limit first ends the job
    waiting = range(RANKS) if access == "collective" else [_rank_reading(FILES - 1)]
    assert 1 <= len(named) <= len(waiting), job.output
    for line in named:
        assert re.fullmatch(f"dlio-mpi: rank ({'|'.join(map(str, waiting))}): error: "
                            f"watchdog: {what} of {re.escape(str(path))} has waited 1\\.\\d s "
                            "\\(reader.io_watchdog_seconds=1; reader.io_watchdog_abort: true "
                            "ends the job\\)", line), job.output
    assert not (data / "out" / "summary.json").exists()
