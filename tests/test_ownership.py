"""Nothing the user owns is written, renamed or deleted: foreign files under every name dlio-mpi
writes (data, temporaries, index files, manifest, lock, results) stay as they are and the job
refuses, naming them; a killed generation or run leaves nothing that looks complete, and the
next one resumes. All on 2 MPI ranks, as a user runs them."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import mpiexec
from helpers import mounted_tmpfs, run_cli, signal_one_rank_when, workload_overrides

pytestmark = pytest.mark.timeout(180)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with a digest of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".dlio_mpi-" in p.name]


def refused(res: subprocess.CompletedProcess, *named: str) -> None:
    assert res.returncode == 2, f"rc={res.returncode}\n{res.stderr}\n{res.stdout}"
    errors = [line for line in res.stderr.splitlines() if line.startswith("dlio-mpi: error")]
    assert len(errors) == 1, res.stderr
    for what in named:
        assert what in errors[0], errors[0]


# ------------------------------------------------------------------------------- data folder


def test_a_users_tmp_file_beside_a_data_file_is_left_alone(tmp_path):
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    mine = train / "img_0_of_8.npz.tmp"
    mine.write_bytes(b"the user's own")
    res = run_cli(["generate", "demo", *workload_overrides(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert mine.read_bytes() == b"the user's own"
    assert (train / "img_0_of_8.npz").stat().st_size > 0
    assert temporaries(tmp_path / "data") == []


@pytest.mark.parametrize("name", ["img_3_of_8.indexed_binary", "img_3_of_8.indexed_binary.off.idx",
                                  "img_3_of_8.indexed_binary.sz.idx"])
def test_foreign_data_and_index_files_are_refused(tmp_path, name):
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    (train / name).write_bytes(b"foreign")
    before = snapshot(tmp_path / "data")
    res = run_cli(["generate", "demo", *workload_overrides(
        tmp_path, dataset__format="indexed_binary", dataset__num_samples_per_file=4,
        dataset__record_dims="[64]")])
    refused(res, str(train / name))
    assert snapshot(tmp_path / "data") == before


@pytest.mark.parametrize("name", ["dlio_mpi_manifest.json", "dlio_mpi.lock"])
def test_a_foreign_manifest_or_lock_is_refused(tmp_path, name):
    data = tmp_path / "data"
    data.mkdir()
    (data / name).write_text('{"mine": true}')
    res = run_cli(["generate", "demo", *workload_overrides(tmp_path)])
    refused(res, str(data / name))
    assert snapshot(data) == {name: hashlib.sha1(b'{"mine": true}').hexdigest()}


def test_a_file_changed_under_a_generated_name_is_not_overwritten(tmp_path):
    over = workload_overrides(tmp_path)
    assert run_cli(["generate", "demo", *over]).returncode == 0
    victim = tmp_path / "data" / "train" / "img_5_of_8.npz"
    victim.write_bytes(b"someone else's file")
    res = run_cli(["generate", "demo", *over])
    refused(res, str(victim))
    assert victim.read_bytes() == b"someone else's file"


def _lock(data: Path, pid: int, start: str | None) -> Path:
    import socket

    data.mkdir(parents=True, exist_ok=True)
    lock = data / "dlio_mpi.lock"
    lock.write_text(json.dumps({"tool": "dlio-mpi", "what": "generation",
                                "host": socket.gethostname(), "pid": pid, "start": start,
                                "since": "2026-01-01T00:00:00"}))
    return lock


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fp:
        return fp.read().rpartition(")")[2].split()[19]


def test_a_generation_in_progress_holds_the_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = _lock(tmp_path / "data", holder.pid, _start_time(holder.pid))
        res = run_cli(["generate", "demo", *workload_overrides(tmp_path)])
        refused(res, "in use by another dlio-mpi job", f"pid {holder.pid}", str(lock))
        assert lock.exists() and not (tmp_path / "data" / "train").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and taken over
    res = run_cli(["generate", "demo", *workload_overrides(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert "generated 8 files" in res.stdout and not lock.exists()


def test_two_generations_at_once_do_not_collide(tmp_path):
    over = workload_overrides(tmp_path, dataset__num_files_train=400)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "generate", "demo",
           *over]
    jobs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(job.wait(timeout=120), *job.communicate()) for job in jobs]
    assert any(rc == 0 for rc, _, _ in results), results
    for rc, _, err in results:
        if rc != 0:
            assert rc == 2 and "in use by another dlio-mpi job" in err, err
    assert temporaries(tmp_path / "data") == []
    res = run_cli(["generate", "demo", *over])
    assert res.returncode == 0 and "400 already complete" in res.stdout, res.stdout


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_generation_resumes_exactly(tmp_path, sig):
    over = workload_overrides(tmp_path, dataset__num_files_train=3000,
                              dataset__record_length_bytes=16384)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "generate", "demo",
           *over]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    data = tmp_path / "data"
    signal_one_rank_when(job, str(data), lambda: len(temporaries(data)) > 200, sig)
    _, err = job.communicate(timeout=60)
    if sig == signal.SIGKILL:
        assert job.returncode != 0
        assert temporaries(data), "the kill came too late to test anything"
    else:  # stopped at the next file, what it wrote committed, no temporaries left
        assert job.returncode == 128 + sig and "generation stopped by SIGTERM" in err, err
        assert temporaries(data) == []
        # the other rank wrote its 1,500 files; the stopped one kept what it had written
        assert len(list((data / "train").glob("*.npz"))) > 1500
    res = run_cli(["generate", "demo", *over], timeout=120)
    assert res.returncode == 0, res.stderr
    assert temporaries(data) == [] and not (data / "dlio_mpi.lock").exists()
    clean = tmp_path / "clean"
    res = run_cli(["generate", "demo", *workload_overrides(
        clean, dataset__num_files_train=3000, dataset__record_length_bytes=16384)], timeout=120)
    assert res.returncode == 0, res.stderr
    resumed, fresh = snapshot(data / "train"), snapshot(clean / "data" / "train")
    assert len(resumed) == 3000 and resumed == fresh


def test_too_little_space_is_refused_before_writing(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=1m") as small:
        res = run_cli(["generate", "demo", *workload_overrides(
            small, dataset__record_length_bytes=1 << 20)])
        refused(res, "dataset.data_folder", "free", "the dataset takes")  # before any I/O
        assert not list((small / "data").rglob("*.npz"))


def test_a_full_file_system_during_generation_is_reported_once_and_cleaned(tmp_path):
    # room for bytes, not for 64 files
    with mounted_tmpfs(tmp_path / "small", "size=64m,nr_inodes=40") as small:
        res = run_cli(["generate", "demo", *workload_overrides(
            small, dataset__num_files_train=64)])
        refused(res, "dataset.data_folder", "No space left on device")
        assert temporaries(small / "data") == []
        assert not (small / "data" / "dlio_mpi.lock").exists()


# ------------------------------------------------------------------------------- output folder


@pytest.mark.parametrize("name", ["summary.json", "config.yaml", "per_epoch_stats.json",
                                  "notes.txt", "dlio.log", "dlio_mpi_results.json",
                                  "0_output.json"])
def test_foreign_files_in_the_output_folder_are_refused(tmp_path, name):
    over = workload_overrides(tmp_path, workflow__generate_data="true")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("the user's")
    res = run_cli(["run", "demo", *over])
    refused(res, "output.folder", name)
    assert snapshot(out) == {name: hashlib.sha1(b"the user's").hexdigest()}
    assert not (tmp_path / "data").exists()  # refused before any I/O


@pytest.mark.parametrize("results", [True, False])
def test_a_folder_in_the_output_folder_is_named_for_what_it_is(tmp_path, results):
    """The demo writes to output/demo; a run into `output` then finds another run's results
    inside, which it must not remove, and says so (not "not made by dlio-mpi")."""
    over = workload_overrides(tmp_path, workflow__generate_data="true")
    inner = tmp_path / "out" / "demo"
    if results:
        first = [o for o in over if not o.startswith("output.folder=")]
        assert run_cli(["run", "demo", *first, f"output.folder={inner}"]).returncode == 0
    else:
        inner.mkdir(parents=True)
        (inner / "notes.txt").write_text("the user's")
    before = snapshot(inner)
    res = run_cli(["run", "demo", *over])
    what = ("the results of another dlio-mpi run, which a run never removes" if results
            else "which is not part of an earlier run's results")
    refused(res, "output.folder", f"holds the folder demo, {what}")
    assert f"output.folder={tmp_path / 'out' / 'run1'}" in res.stderr
    assert snapshot(inner) == before


def test_the_workload_file_is_never_replaced(tmp_path):
    workload = tmp_path / "config.yaml"
    workload.write_text("workload:\n  dataset:\n    format: npz\n    num_files_train: 16\n"
                        "  workflow:\n    generate_data: true\n  reader:\n    batch_size: 2\n")
    before = workload.read_bytes()
    data = tmp_path.with_name(f"{tmp_path.name}_data")  # not inside output.folder
    res = run_cli(["run", str(workload), "output.folder=.", f"dataset.data_folder={data}"],
                  cwd=tmp_path)
    refused(res, "config.yaml", "the workload file given")
    assert workload.read_bytes() == before and not (tmp_path / "summary.json").exists()


def test_results_of_ours_are_replaced_and_changed_ones_refused(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              output__access_log="true")
    assert run_cli(["run", "demo", *over]).returncode == 0
    out = tmp_path / "out"
    first = json.loads((out / "summary.json").read_text())["start"]
    time.sleep(1.1)
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "summary.json").read_text())["start"] != first
    assert json.loads((out / "dlio_mpi_results.json").read_text())["state"] == "complete"
    log = (out / "dlio.log").read_text()
    assert "train epoch 1" in log and "results in" in log
    assert temporaries(out) == []
    with open(out / "summary.json", "a") as fp:
        fp.write(" ")
    res = run_cli(["run", "demo", *over])
    refused(res, "summary.json", "changed since")


def _running_epoch_2(out: Path) -> bool:
    """Whether a run into `out` that replaced an earlier one's results is past its epoch 1."""
    try:
        state = json.loads((out / "dlio_mpi_results.json").read_text())["state"]
        return state == "running" and "train epoch 1" in (out / "dlio.log").read_text()
    except (OSError, ValueError, KeyError):
        return False


def test_a_killed_run_leaves_no_summary_that_looks_like_its_own(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              output__access_log="true", dataset__num_files_train=64,
                              train__computation_time=0.05, train__epochs=4)
    assert run_cli(["run", "demo", *over]).returncode == 0
    out = tmp_path / "out"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "run", "demo", *over]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signal_one_rank_when(job, str(out), lambda: _running_epoch_2(out), signal.SIGKILL)
    job.communicate(timeout=60)
    assert job.returncode != 0
    assert not (out / "summary.json").exists()
    assert json.loads((out / "dlio_mpi_results.json").read_text())["state"] == "running"
    res = run_cli(["run", "demo", *over])  # the killed run's log and access logs are ours
    assert res.returncode == 0, res.stderr
    assert (out / "summary.json").exists()


def test_keep_files_false_removes_only_our_dataset(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__keep_files="false")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    assert "removed the dataset" in res.stdout
    assert not (tmp_path / "data").exists()
    assert (tmp_path / "out" / "summary.json").exists()
    # data that is not ours (no manifest) is refused before any I/O
    over = workload_overrides(tmp_path, workflow__generate_data="true")
    assert run_cli(["generate", "demo", *over]).returncode == 0
    os.remove(tmp_path / "data" / "dlio_mpi_manifest.json")
    before = snapshot(tmp_path / "data")
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__keep_files="false", workflow__generate_data="false",
        output__folder=tmp_path / "out2")])
    refused(res, "dataset.keep_files")
    assert snapshot(tmp_path / "data") == before
    assert not (tmp_path / "out2").exists()  # refused before any I/O


def test_a_failed_run_says_why_in_its_log(tmp_path):
    over = workload_overrides(tmp_path, workflow__generate_data="false")
    res = run_cli(["run", "demo", *over])  # no data
    refused(res)
    out = tmp_path / "out"
    error = [line for line in res.stderr.splitlines() if line.startswith("dlio-mpi: error")]
    assert (out / "dlio.log").read_text().splitlines()[-1] == error[0]
    assert json.loads((out / "dlio_mpi_results.json").read_text())["state"] == "failed"
    assert not (out / "summary.json").exists()


def test_an_output_folder_without_room_says_why_and_is_free_for_the_next_run(small_fs):
    """Refused for room after the claim: the log and the manifest say why ('failed'), and
    the lock is released (it used to stay, the manifest saying 'running')."""
    (small_fs / "filler").write_bytes(b"\0" * (23 * 2**20 + 2**19))
    out = small_fs / "out"
    res = run_cli(["run", "demo", *workload_overrides(small_fs.parent, output__folder=out,
                                                      output__trace="true")])
    refused(res, "output.folder:", "free, but this run would write")
    error = [line for line in res.stderr.splitlines() if line.startswith("dlio-mpi: error")]
    assert (out / "dlio.log").read_text().splitlines()[-1] == error[0]
    assert json.loads((out / "dlio_mpi_results.json").read_text())["state"] == "failed"
    assert not (out / "dlio_mpi.lock").exists()


def test_keep_files_false_keeps_a_file_changed_since_generation(tmp_path):
    from dlio_mpi.data.catalog import spot_indices

    over = workload_overrides(tmp_path, dataset__num_files_train=40, dataset__format="npy",
                              reader__read_mode="sample", reader__access="lean")
    assert run_cli(["generate", "demo", *over]).returncode == 0
    index = min(set(range(40)) - set(spot_indices(40)))  # one the start-up checks skip
    changed = tmp_path / "data" / "train" / f"img_{index:02d}_of_40.npy"
    with open(changed, "ab") as fp:  # still read fine by extent
        fp.write(b"someone's bytes")
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false",
                   "dataset.keep_files=false"])
    assert res.returncode == 0, res.stderr
    assert "kept 1 file(s) changed since they were generated" in res.stdout
    assert sorted(p.name for p in (tmp_path / "data").rglob("*") if p.is_file()) == [
        "dlio_mpi_manifest.json", changed.name]


def test_the_generate_command_writes_a_lost_file_again(tmp_path):
    over = workload_overrides(tmp_path)
    assert run_cli(["generate", "demo", *over]).returncode == 0
    lost = tmp_path / "data" / "train" / "img_3_of_8.npz"
    lost.unlink()
    res = run_cli(["generate", "demo", *over])  # every file looked at, not spot checks
    assert res.returncode == 0 and "generated 1 files" in res.stdout, res.stdout
    assert lost.exists()


def test_a_dangling_symlink_under_a_data_name_is_refused(tmp_path):
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    (train / "img_2_of_8.npz").symlink_to(tmp_path / "nowhere")
    res = run_cli(["generate", "demo", *workload_overrides(tmp_path)])
    refused(res, str(train / "img_2_of_8.npz"), "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_one_run_at_a_time_in_an_output_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out = tmp_path / "out"
        lock = _lock(out, holder.pid, _start_time(holder.pid))
        res = run_cli(["run", "demo", *workload_overrides(tmp_path,
                                                           workflow__generate_data="true")])
        refused(res, "in use by another dlio-mpi job", str(lock))
        assert sorted(p.name for p in out.iterdir()) == ["dlio_mpi.lock"]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("name", ["summary.json", "dlio_mpi_results.json", "a/b.log",
                                  "0_output.json", "3_per_epoch_stats.json",
                                  "trace_rank1.json.gz", "dlio.log.dlio_mpi-0a1b2c3d4e5f.tmp"])
def test_the_log_cannot_take_a_results_name(tmp_path, name):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path, output__log_file=name)])
    refused(res, "output.log_file")


def test_a_lock_held_by_an_exited_unreaped_process_is_taken_over(tmp_path):
    """An aborted job's rank stays a zombie until mpiexec reaps it: its lock is not a live
    job's, so an immediate rerun is not refused "in use"."""
    import socket

    from dlio_mpi.storage import storage_for
    from dlio_mpi.storage.ownership import LOCK_NAME

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rpartition(")")[2].split()[0] != "Z":  # exited, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start = stat.read_text().rpartition(")")[2].split()[19]
    (tmp_path / LOCK_NAME).write_text(json.dumps({
        "tool": "dlio-mpi", "what": "run", "host": socket.gethostname(), "pid": child.pid,
        "start": start, "since": "2026-11-26T12:00:00"}))
    lock = storage_for(str(tmp_path)).claim(str(tmp_path), "run")
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    child.wait()
    # a live process's lock is still refused (another's: the parent); this process's own,
    # as a folder it claimed already
    for pid, said in ((os.getppid(), "is in use by another dlio-mpi job"),
                      (os.getpid(), "is claimed twice by this job, as the run folder and")):
        (tmp_path / LOCK_NAME).write_text(json.dumps({
            "tool": "dlio-mpi", "what": "run", "host": socket.gethostname(), "pid": pid,
            "start": Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19],
            "since": "2026-11-26T12:00:00"}))
        with pytest.raises(Exception, match=said):
            storage_for(str(tmp_path)).claim(str(tmp_path), "checkpoint").acquire()
