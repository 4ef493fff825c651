"""A checkpoint that runs out of room mid-file (ENOSPC on a small tmpfs, filled by someone
else between two checkpoints) ends the job promptly with an error naming the file, and
leaves nothing that looks complete; a run whose checkpoints could not fit is refused before
any I/O."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import mpiexec
from helpers import ended_after, rank_pids, started_until

MiB = 1 << 20
SHARE = 4 * MiB  # per rank and checkpoint


def _settings(tmp_path, folder, *extra: str, writes: int = 2) -> list[str]:
    """llama_7b made a flat 4 MiB model (ZeRO 1: each rank writes model_states-<rank>)."""
    return ["model.type=null", "model.num_layers=-1", f"model.model_size_bytes={SHARE}",
            f"checkpoint.checkpoint_folder={folder}", f"output.folder={tmp_path / 'out'}",
            f"checkpoint.num_checkpoints_write={writes}", "checkpoint.num_checkpoints_read=0",
            *extra]


def _dlio_mpi(ranks: int, *args: str) -> list[str]:
    return [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", *args]


def _command(tmp_path, folder, *extra: str, writes: int = 2) -> list[str]:
    return _dlio_mpi(2, "run", "llama_7b", *_settings(tmp_path, folder, *extra, writes=writes))


def _complete(folder) -> dict:
    try:
        with open(folder / "dlio_mpi_checkpoints.json") as fp:
            return {cid: c["complete"] for cid, c in json.load(fp)["checkpoints"].items()}
    except (OSError, ValueError):
        return {}


def _fill_all_but_2_mib(fs) -> None:
    """Someone else's file takes all but 2 MiB of the room left on `fs`."""
    st = os.statvfs(fs)
    with open(fs / "someone_elses_file", "wb") as fp:
        fp.write(b"\0" * (st.f_bavail * st.f_frsize - 2 * MiB))


def _first_written(folder, asynchronous: bool) -> bool:
    """Is the first checkpoint written? Listed complete; or, asynchronous, its files whole
    under their temporary names (the next save lists it, 3 s later)."""
    if not asynchronous:
        return _complete(folder).get("global_epoch1_step1") is True
    try:
        with os.scandir(folder / "global_epoch1_step1") as entries:
            return sum(e.stat().st_size for e in entries) == 2 * SHARE
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("asynchronous", [False, True])
def test_running_out_of_room_mid_checkpoint_ends_the_job_and_names_the_file(tmp_path, small_fs,
                                                                            asynchronous):
    """With checkpoint.async_write the second save's background write runs out of room; the
    run's end waits for it and fails the same way."""
    folder = small_fs / "ck"
    job = started_until(_command(tmp_path, folder, "checkpoint.time_between_checkpoints=3",
                                 f"checkpoint.async_write={str(asynchronous).lower()}"),
                        lambda: _first_written(folder, asynchronous))
    started = time.monotonic()
    out, err = ended_after(job, lambda: _fill_all_but_2_mib(small_fs))  # the room counted on
    assert job.returncode == 2, (out, err)
    assert time.monotonic() - started < 30  # the time between checkpoints, then the failure
    second = folder / "global_epoch1_step2"
    assert "No space left on device" in err and str(second) in err, err
    assert err.count("dlio-mpi: error") == 1, err
    # the failed save is removed whole (it used to stay, a partial folder listed incomplete)
    assert not second.exists()
    assert _complete(folder) == {"global_epoch1_step1": True}
    assert sorted(os.listdir(folder)) == ["dlio_mpi_checkpoints.json", "global_epoch1_step1"]
    assert sorted(os.listdir(folder / "global_epoch1_step1")) == [
        "model_states-0.pt", "model_states-1.pt"]
    assert (small_fs / "someone_elses_file").exists()
    summary = tmp_path / "out" / "summary.json"
    assert not summary.exists()  # no results that look complete


def test_a_save_failing_after_its_files_are_whole_leaves_nothing_and_a_rerun_works(tmp_path):
    """Room for the bytes but not for a file more: the ranks' files are renamed whole, then
    the manifest's update fails (ENOSPC). The save is removed whole, and the rerun with room
    is not refused (the unlisted whole files used to block it: 'not written by an earlier
    dlio-mpi run')."""
    from helpers import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "small", "size=64m,nr_inodes=6") as small:
        folder = small / "ck"
        res = subprocess.run(_command(tmp_path, folder, "checkpoint.time_between_checkpoints=0",
                                      writes=1), capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        assert "No space left on device: " + str(folder) in res.stderr, res.stderr
        assert res.stderr.count("dlio-mpi: error") == 1, res.stderr
        assert os.listdir(folder) == ["dlio_mpi_checkpoints.json"]
        assert _complete(folder) == {}
        subprocess.run(["mount", "-o", "remount,nr_inodes=1000", str(small)], check=True)
        res = subprocess.run(_command(tmp_path, folder, "checkpoint.time_between_checkpoints=0",
                                      writes=1), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert _complete(folder) == {"global_epoch1_step1": True}


def test_checkpoints_that_cannot_fit_are_refused_before_any_io(tmp_path, small_fs):
    folder = small_fs / "ck"
    res = subprocess.run(_command(tmp_path, folder, "checkpoint.time_between_checkpoints=0",
                                  writes=4),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "checkpoint.checkpoint_folder: the run's 4 checkpoint(s) take 0.03 GiB " \
           "(33,554,432 bytes)" in res.stderr, res.stderr
    assert not folder.exists()
    validate = subprocess.run(_dlio_mpi(1, "validate", "llama_7b", "--ranks", "2",
                                        *_settings(tmp_path, folder, writes=4)),
                              capture_output=True, text=True, timeout=120)
    assert validate.returncode == 0, validate.stderr
    assert "warning         run would refuse: checkpoint.checkpoint_folder: the run's 4 " \
           "checkpoint(s)" in validate.stdout, validate.stdout


@pytest.mark.parametrize("name", ["ck/sub", ""])  # a folder to be made, the tmpfs itself
@pytest.mark.parametrize("layout", ["file_per_rank", "shared"])
def test_odirect_checkpoints_on_tmpfs_are_refused_before_any_io(tmp_path, small_fs, name,
                                                                 layout):
    folder = small_fs / name if name else small_fs
    res = subprocess.run(_command(tmp_path, folder, "checkpoint.odirect=true",
                                  f"checkpoint.layout={layout}"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert errors == [f"dlio-mpi: error: checkpoint.odirect: true, but "
                      f"checkpoint.checkpoint_folder {folder} is on tmpfs"
                      f"{f' (at {small_fs})' if name else ''}, a file system without real "
                      "direct I/O (tmpfs only emulates it through the page cache); set "
                      "checkpoint.odirect: false or choose a folder on another file system"], \
        res.stderr
    assert list(small_fs.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("tier", ["to", "fast"])
def test_odirect_drains_touching_tmpfs_are_refused_before_any_io(tmp_path, small_fs, tier):
    """checkpoint.drain.odirect reads the fast tier and writes drain.to with O_DIRECT: either
    on tmpfs is refused as checkpoint.odirect is (issue 30, finding 7)."""
    fast, pfs = (tmp_path / "ck", small_fs / "pfs") if tier == "to" else \
        (small_fs / "ck", tmp_path / "pfs")
    res = subprocess.run(_command(tmp_path, fast, f"checkpoint.drain={{to: {pfs}, odirect: "
                                                  "true}"), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    key = "checkpoint.drain.to" if tier == "to" else "checkpoint.checkpoint_folder"
    assert len(errors) == 1 and errors[0].startswith(
        f"dlio-mpi: error: checkpoint.drain.odirect: true, but {key} "), res.stderr
    assert list(small_fs.iterdir()) == [] and not (tmp_path / "out").exists()
    assert not fast.exists() and not pfs.exists()


def test_odirect_staging_from_tmpfs_is_refused_before_any_io(tmp_path):
    """reader.staging reads every file with reader.odirect's O_DIRECT: a data folder on tmpfs
    is refused as the C engine's reads refuse it (issue 30, finding 7)."""
    from helpers import mounted_tmpfs, run_cli, workload_overrides

    with mounted_tmpfs(tmp_path / "shm", "size=64m") as shm:
        over = workload_overrides(tmp_path, dataset__data_folder=shm / "data")
        assert run_cli(["generate", "demo", *over]).returncode == 0
        for staging in ("replicated", "read_once"):
            res = run_cli(["run", "demo", *over, "workflow.generate_data=false",
                           f"reader.staging={staging}", "reader.odirect=true"])
            assert res.returncode == 2, res.stderr
            assert "dlio-mpi: error: reader.odirect: true, but dataset.data_folder " \
                   f"{shm / 'data'} is on tmpfs" in res.stderr, res.stderr
            assert not (tmp_path / "out").exists()


def test_two_jobs_sharing_a_checkpoint_folder_one_is_refused(tmp_path):
    """Job A holds the checkpoint folder while it runs; job B, given the same folder, is
    refused before any I/O naming the folder and A (host, pid), and A's checkpoints are
    untouched: B used to remove A's checkpoint while A wrote it."""
    folder = tmp_path / "ck"
    a = subprocess.Popen(_command(tmp_path / "a", folder, "checkpoint.time_between_checkpoints=2"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (folder / "dlio_mpi.lock").exists():  # A has claimed the folder
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()
        time.sleep(0.02)
    b = subprocess.run(_command(tmp_path / "b", folder), capture_output=True, text=True,
                       timeout=120)
    assert b.returncode == 2, b.stderr
    assert f"{folder} is in use by another dlio-mpi job (checkpoints on" in b.stderr
    assert b.stderr.count("dlio-mpi: error") == 1
    _, err = a.communicate(timeout=120)
    assert a.returncode == 0, err
    saved = _complete(folder)
    assert len(saved) == 2 and all(saved.values())  # A's two checkpoints, whole
    assert not (folder / "dlio_mpi.lock").exists()  # released when A ended
    # the next job takes the folder (A's checkpoints of ours make way)
    c = subprocess.run(_command(tmp_path / "c", folder), capture_output=True, text=True,
                       timeout=120)
    assert c.returncode == 0, c.stderr


def _drained(folder) -> dict:
    return _complete(folder)


def _bytes_in(folder) -> int:
    """The bytes of `folder`'s files (a drain's copies under their temporary names)."""
    try:
        with os.scandir(folder) as entries:
            return sum(e.stat().st_size for e in entries)
    except FileNotFoundError:
        return 0


def test_a_drain_out_of_room_ends_the_job_keeps_the_fast_tier_and_leaves_no_copy(tmp_path,
                                                                                small_fs):
    """checkpoint.drain to a small tmpfs that someone else fills after the first drain: the
    second drain runs out of room; the job ends naming the file, the fast tier keeps both
    checkpoints complete, and drain.to holds only the first, complete."""
    fast, pfs = tmp_path / "fast", small_fs / "pfs"
    job = started_until(_command(tmp_path, fast, "checkpoint.time_between_checkpoints=3",
                                 f"checkpoint.drain={{to: {pfs}, keep: all}}"),
                        # copied, 3 s before save 2
                        lambda: _bytes_in(pfs / "global_epoch1_step1") == 2 * SHARE)
    out, err = ended_after(job, lambda: _fill_all_but_2_mib(small_fs))
    assert job.returncode == 2, (out, err)
    second = pfs / "global_epoch1_step2"
    assert "No space left on device" in err and str(second) in err, err
    assert err.count("dlio-mpi: error") == 1, err
    assert _complete(fast) == {"global_epoch1_step1": True, "global_epoch1_step2": True}
    assert _drained(pfs) == {"global_epoch1_step1": True}
    assert not second.exists()  # its copy and temporaries removed
    assert sorted(os.listdir(pfs)) == ["dlio_mpi_checkpoints.json", "global_epoch1_step1"]
    assert (small_fs / "someone_elses_file").exists()


def _drain_under_way(tmp_path, fast, pfs) -> tuple[list[str], subprocess.Popen]:
    """A job saving one checkpoint of 2 x 768 MiB to `fast` and draining it to `pfs` in
    4 MiB calls, started and waited for until its drain has copied bytes: its command line
    (for a rerun) and its process (its own session, for signals)."""
    settings = [s for s in _settings(tmp_path, fast, writes=1)
                if not s.startswith("model.model_size_bytes")]
    command = _dlio_mpi(2, "run", "llama_7b", *settings, "model.model_size_bytes=805306368",
                        "checkpoint.time_between_checkpoints=0",
                        f"checkpoint.drain={{to: {pfs}, buffer_bytes: 4194304}}")
    return command, started_until(command, lambda: _bytes_in(pfs / "global_epoch1_step1"))


def test_a_stop_signal_cuts_a_drain_short_the_fast_tier_kept_and_a_rerun_works(tmp_path):
    """SIGTERM (a scheduler's time limit) during a drain of 2 x 768 MiB: the drain stops
    after its current call, the job ends as a stopped run does (128 + 15), the fast tier's
    checkpoint stays complete, drain.to holds nothing that looks complete, and the next run
    drains into it."""
    fast, pfs = tmp_path / "fast", tmp_path / "pfs"
    command, job = _drain_under_way(tmp_path, fast, pfs)
    copy = pfs / "global_epoch1_step1"
    out, err = ended_after(job, lambda: os.killpg(job.pid, signal.SIGTERM))
    assert job.returncode == 128 + signal.SIGTERM, (out, err)
    assert _complete(fast) == {"global_epoch1_step1": True}
    assert _drained(pfs) == {}
    assert not copy.exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    drains = [r for r in summary["dlio_mpi"]["checkpoint"]["records"] if r["kind"] == "drain"]
    assert [d["drain"]["complete"] for d in drains] == [False]
    res = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _drained(pfs) == {"global_epoch1_step1": True}


def test_a_drain_target_without_room_is_refused_before_any_io(tmp_path, small_fs):
    """4 checkpoints of 8 MiB do not fit drain.to's 24 MiB: refused before the fast tier or
    drain.to is written; validate says run would refuse."""
    fast, pfs = tmp_path / "fast", small_fs / "pfs"
    drain = f"checkpoint.drain={{to: {pfs}, keep: last}}"
    res = subprocess.run(_command(tmp_path, fast, "checkpoint.time_between_checkpoints=0",
                                  drain, writes=4),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "checkpoint.drain.to: the run's 4 checkpoint(s) take 0.03 GiB (33,554,432 bytes)" \
        in res.stderr, res.stderr
    assert not fast.exists() and not pfs.exists()
    validate = subprocess.run(_dlio_mpi(1, "validate", "llama_7b", "--ranks", "2", drain,
                                        *_settings(tmp_path, fast, writes=4)),
                              capture_output=True, text=True, timeout=120)
    assert validate.returncode == 0, validate.stderr
    assert "warning         run would refuse: checkpoint.drain.to: the run's 4" \
        in validate.stdout, validate.stdout


def test_a_rank_killed_mid_drain_ends_the_job_and_the_rerun_drains(tmp_path):
    """SIGKILL to one rank while the drain copies: the job ends (MPI aborts the others), the
    fast tier's checkpoint stays complete, nothing on drain.to is listed complete, and the
    next run removes what the killed one left there and drains."""
    fast, pfs = tmp_path / "fast", tmp_path / "pfs"
    command, job = _drain_under_way(tmp_path, fast, pfs)
    copy = pfs / "global_epoch1_step1"

    def kill_one_rank() -> None:
        ranks = rank_pids(str(pfs))
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGKILL)

    out, err = ended_after(job, kill_one_rank)
    assert job.returncode != 0, (out, err)
    assert _complete(fast) == {"global_epoch1_step1": True}
    assert not any(_drained(pfs).values())
    res = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _drained(pfs) == {"global_epoch1_step1": True}
    assert not [n for n in os.listdir(copy) if n.endswith(".tmp")]


def test_two_jobs_draining_into_one_folder_one_is_refused(tmp_path):
    """drain.to is claimed as the checkpoint folder is: job B, with checkpoints of its own
    but job A's drain.to, is refused before any I/O naming the folder, and A drains whole."""
    pfs = tmp_path / "pfs"
    drain = f"checkpoint.drain={{to: {pfs}}}"
    a = subprocess.Popen(_command(tmp_path / "a", tmp_path / "a-ck",
                                  "checkpoint.time_between_checkpoints=2", drain),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pfs / "dlio_mpi.lock").exists():  # A has claimed drain.to
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()
        time.sleep(0.02)
    b = subprocess.run(_command(tmp_path / "b", tmp_path / "b-ck", drain),
                       capture_output=True, text=True, timeout=120)
    assert b.returncode == 2, b.stderr
    assert f"{pfs} is in use by another dlio-mpi job (checkpoint drain on" in b.stderr
    assert not (tmp_path / "b-ck").exists()  # refused before B wrote anything
    _, err = a.communicate(timeout=120)
    assert a.returncode == 0, err
    assert _drained(pfs) == {"global_epoch1_step1": True, "global_epoch1_step2": True}
    assert not (pfs / "dlio_mpi.lock").exists()  # released when A ended
