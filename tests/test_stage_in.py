"""storage.stage_in under mpiexec -n 2 and -n 3: the dataset copied byte for byte to the stage
folder (once per job, or once per emulated node), each source file read once, training reading
the copy; files of several pieces copied by several ranks; what is in the way and not ours
refused and left; our earlier copy replaced; clean removes only our copy; a rank failing in
the copy ends the job."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from dlio_mpi.data.catalog import spot_indices
from helpers import mounted_tmpfs, mpiexec, run_cli, run_cli_opens, workload_overrides

pytestmark = pytest.mark.timeout(300)
RANKS = [2, 3]


def _args(tmp, **values) -> list[str]:
    base = dict(dataset__num_files_train=12, dataset__record_length_bytes=20000,
                train__epochs=2, storage__stage_in__to=str(tmp / "bb"))
    base.update(values)
    return workload_overrides(tmp, **base)


def _generate(tmp, ranks: int, **values) -> None:
    res = run_cli(["generate", "demo", *_args(tmp, **values)], ranks=ranks)
    assert res.returncode == 0, res.stderr


def _summary(tmp) -> dict:
    return json.loads((tmp / "out" / "summary.json").read_text())


def _data_files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                  for f in fs if f.endswith(".npz"))


def _identical(a, b) -> None:
    files = _data_files(a)
    assert files and files == _data_files(b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert not mismatch and not errors


@pytest.mark.parametrize("ranks", RANKS)
def test_a_job_copy_is_identical_read_once_and_read_by_training(tmp_path, ranks):
    values = dict(workflow__evaluation="true", dataset__num_files_eval=6,
                  reader__batch_size_eval=1)
    _generate(tmp_path, ranks, **values)
    res, opened = run_cli_opens(["run", "demo", *_args(tmp_path, **values)], ranks,
                                tmp_path / "strace.log")
    assert res.returncode == 0, res.stderr
    data, bb = tmp_path / "data", tmp_path / "bb"
    _identical(data, bb)
    staged = _summary(tmp_path)["dlio_mpi"]["stage_in"]
    total = sum(os.path.getsize(data / f) for f in _data_files(data))
    assert staged["files"] == 18 and staged["copies"] == 1 and staged["scope"] == "job"
    assert staged["bytes_per_copy"] == staged["bytes_read"] == staged["bytes_written"] == total
    assert staged["seconds"] > 0 and len(staged["read_seconds_per_rank"]) == ranks
    manifest = json.loads((bb / "dlio_mpi_stage.json").read_text())
    assert manifest["complete"] and manifest["source"] == str(data)
    assert "stage-in: 18 file(s)" in res.stdout
    if opened is None:
        return
    opened = [p for p in opened if p.endswith(".npz")]
    source = [p for p in opened if p.startswith(str(data))]
    copy = [p for p in opened if p.startswith(str(bb))]
    # each source file once (by the stage-in); training and evaluation read the copy
    assert sorted(source) == sorted(str(data / f) for f in _data_files(data))
    train = [p for p in copy if "/train/" in p and ".tmp" not in p]
    assert len(set(train)) == 12 and len(train) >= 12 * 2  # every file, every epoch


@pytest.mark.parametrize("ranks", RANKS)
def test_node_scope_makes_one_copy_per_emulated_node(tmp_path, ranks):
    _generate(tmp_path, ranks)
    res = run_cli(["run", "demo", *_args(tmp_path, storage__stage_in__scope="node")], ranks,
                  timeout=240, env={"DLIO_MPI_RANKS_PER_NODE": "1"})
    assert res.returncode == 0, res.stderr
    for node in range(ranks):
        _identical(tmp_path / "data", tmp_path / "bb" / f"node{node}")
    staged = _summary(tmp_path)["dlio_mpi"]["stage_in"]
    assert staged["copies"] == ranks
    assert staged["bytes_read"] == ranks * staged["bytes_per_copy"]


@pytest.mark.parametrize("ranks", RANKS)
def test_files_of_several_pieces_are_copied_by_several_ranks(tmp_path, ranks):
    # 16 KiB pieces of files of about 3 x 20 KB (npz of 3 samples): every file in pieces
    values = dict(dataset__num_samples_per_file=3, storage__stage_in__buffer_bytes=16384,
                  storage__stage_in__odirect="true")
    _generate(tmp_path, ranks, **values)
    res = run_cli(["run", "demo", *_args(tmp_path, **values)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    _identical(tmp_path / "data", tmp_path / "bb")
    assert not [f for f in os.listdir(tmp_path / "bb" / "train") if f.endswith(".tmp")]


@pytest.mark.parametrize("ranks", RANKS)
def test_what_is_not_ours_is_refused_and_left_and_clean_removes_only_ours(tmp_path, ranks):
    _generate(tmp_path, ranks)
    bb = tmp_path / "bb"
    (bb / "train").mkdir(parents=True)
    mine = bb / "train" / "img_03_of_12.npz"
    mine.write_bytes(b"the user's")
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 2, res.stderr
    assert f"{mine} exists and is not dlio-mpi's" in res.stderr
    assert mine.read_bytes() == b"the user's"
    assert not (bb / "dlio_mpi_stage.json").exists()
    mine.unlink()
    # a file of the user's named as a side file the copy brings (the dataset's manifest)
    theirs = bb / "dlio_mpi_manifest.json"
    theirs.write_text("the user's")
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 2 and f"{theirs} exists and is not dlio-mpi's" in res.stderr
    assert theirs.read_text() == "the user's"
    assert not (bb / "dlio_mpi_stage.json").exists()  # refused before anything was written
    theirs.unlink()
    notes = bb / "notes.txt"
    notes.write_text("mine")
    # twice: the second run replaces its own earlier copy; then clean removes it
    for clean in ("false", "true"):
        shutil.rmtree(tmp_path / "out")
        res = run_cli(["run", "demo", *_args(tmp_path, storage__stage_in__clean=clean)],
                      ranks=ranks)
        assert res.returncode == 0, res.stderr
    assert "removed the staged copy" in res.stdout
    assert sorted(os.listdir(bb)) == ["notes.txt"] and notes.read_text() == "mine"


def test_a_stage_folder_inside_the_data_folder_is_refused_before_any_io(tmp_path):
    res = run_cli(["run", "demo", *_args(tmp_path, storage__stage_in__to=tmp_path / "data" /
                                         "bb")], ranks=2)
    assert res.returncode == 2 and "storage.stage_in.to" in res.stderr, res.stderr
    assert f"is inside dataset.data_folder {tmp_path / 'data'}" in res.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("ranks", RANKS)
def test_a_rank_failing_in_the_copy_ends_the_job(tmp_path, ranks):
    files = 40
    _generate(tmp_path, ranks, dataset__num_files_train=files)
    victim = next(i for i in range(files) if i not in spot_indices(files))
    path = tmp_path / "data" / "train" / f"img_{victim:02d}_of_{files}.npz"
    os.truncate(path, 100)  # shorter than its recorded size: its copier's read fails
    began = time.monotonic()
    res = run_cli(["run", "demo", *_args(tmp_path, dataset__num_files_train=files)],
                  ranks=ranks)
    assert res.returncode != 0
    assert time.monotonic() - began < 60
    assert str(path) in res.stderr and "changed since its size was taken" in res.stderr
    final = tmp_path / "bb" / "train" / path.name
    assert not final.exists()  # a partial file never gets its final name
    manifest = json.loads((tmp_path / "bb" / "dlio_mpi_stage.json").read_text())
    assert manifest["complete"] is False


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (tmpfs)")
def test_odirect_to_tmpfs_is_refused_before_the_copy(tmp_path):
    _generate(tmp_path, 2)
    bb = tmp_path / "bb-link"
    shm = f"/dev/shm/dlio-mpi-test-{os.getpid()}"
    os.mkdir(shm)
    os.symlink(shm, bb)  # the stage folder on tmpfs
    try:
        res = run_cli(["run", "demo", *_args(tmp_path, storage__stage_in__to=bb,
                                             storage__stage_in__odirect="true")], ranks=2)
        assert res.returncode == 2, res.stderr
        assert "storage.stage_in.odirect: true" in res.stderr
        assert "without real direct I/O" in res.stderr
        assert not (bb / "train").exists()  # refused before the folders and the copy
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_a_stage_folder_without_room_is_refused_before_the_copy(tmp_path):
    """2.4 MB of data to a 1 MiB tmpfs: one message naming the key, the room and the need,
    exit 2, and nothing copied or left there."""
    with mounted_tmpfs(tmp_path / "small", "size=1m") as small:
        over = dict(dataset__record_length_bytes=200000, storage__stage_in__to=small / "bb")
        _generate(tmp_path, 2, **over)
        res = run_cli(["run", "demo", *_args(tmp_path, **over)], ranks=2)
        assert res.returncode == 2, res.stderr
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "storage.stage_in.to:" in errors[0]
        assert "free, but this run would write" in errors[0]
        assert list(small.rglob("*")) == []  # not even the folder


@pytest.mark.parametrize("ranks", RANKS)
def test_a_killed_jobs_temporaries_are_removed_by_the_next_stage_in(tmp_path, ranks):
    """What a job killed mid-copy leaves (its temporaries, its manifest marked incomplete)
    is removed by the next run's stage-in, which then copies everything."""
    _generate(tmp_path, ranks)
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    bb = tmp_path / "bb"
    manifest = json.loads((bb / "dlio_mpi_stage.json").read_text())
    # as the killed job left them: the manifest incomplete, a file half copied under its
    # temporary name, the manifest's own temporary
    (bb / "dlio_mpi_stage.json").write_text(json.dumps({**manifest, "complete": False}))
    victim = sorted((bb / "train").glob("*.npz"))[3]
    left = [victim.parent / f"{victim.name}.dlio_mpi-{manifest['tag']}.tmp",
            bb / f"dlio_mpi_stage.json.dlio_mpi-{manifest['tag']}.tmp"]
    victim.unlink()
    for path in left:
        path.write_bytes(b"half")
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    assert not [p for p in bb.rglob("*") if ".dlio_mpi-" in p.name]
    _identical(tmp_path / "data", bb)
    assert json.loads((bb / "dlio_mpi_stage.json").read_text())["complete"] is True


def test_two_jobs_staging_into_one_folder_one_is_refused(tmp_path):
    """Job A holds the stage folder while it trains on its copy; job B, given the same
    folder, is refused before any I/O naming the folder and A (host, pid), and A's copy is
    untouched: B used to delete and re-copy it under A, which then aborted."""
    _generate(tmp_path, 2)
    bb = tmp_path / "bb"
    slow = _args(tmp_path, train__epochs=8, train__computation_time=0.25)
    a = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, "-P", "-m", "dlio_mpi", "run",
                          "demo", *slow], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 60
    while not _stage_complete(bb):  # A has staged and trains on the copy
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()
        time.sleep(0.02)
    copied = {p: p.stat().st_mtime_ns for p in bb.rglob("*.npz")}
    b = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__num_files_train=12, dataset__record_length_bytes=20000,
        storage__stage_in__to=str(bb), output__folder=str(tmp_path / "out-b"))], ranks=2)
    assert b.returncode == 2, b.stderr
    assert f"storage.stage_in.to: {bb} is in use by another dlio-mpi job (stage-in on" in \
        b.stderr
    assert b.stderr.count("dlio-mpi: error") == 1
    assert {p: p.stat().st_mtime_ns for p in bb.rglob("*.npz")} == copied
    _, err = a.communicate(timeout=180)
    assert a.returncode == 0, err
    assert not (bb / "dlio_mpi.lock").exists()  # released when A ended
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2)  # the next job takes it
    assert res.returncode == 0, res.stderr


def _stage_complete(bb) -> bool:
    try:
        return json.loads((bb / "dlio_mpi_stage.json").read_text())["complete"] is True
    except (OSError, ValueError):
        return False


@pytest.mark.parametrize("ranks", [2])
def test_a_staged_file_changed_or_rewritten_by_the_user_is_refused_not_replaced(tmp_path,
                                                                                ranks):
    """Ownership by content: the stage manifest records each file's size and modification
    time as written; a file under a staged name that is not that file (changed since, or
    the user's own written after ours was removed) is refused, never replaced."""
    _generate(tmp_path, ranks)
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    staged = sorted((tmp_path / "bb" / "train").glob("*.npz"))
    changed, rewritten = staged[2], staged[5]
    with open(changed, "r+b") as fp:  # same size, other bytes, a newer modification time
        fp.write(b"the user's")
    rewritten.unlink()
    rewritten.write_bytes(b"the user's own file")
    kept = {p: p.read_bytes() for p in (changed, rewritten)}
    for path in (changed, rewritten):
        res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("dlio-mpi: error") == 1
        assert f"storage.stage_in.to: {path} was changed since dlio-mpi staged it" in \
            res.stderr, res.stderr
        path.rename(path.with_suffix(".mine"))  # out of the way: the next one is refused
    assert {p: p.with_suffix(".mine").read_bytes() for p in kept} == kept
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    _identical(tmp_path / "data", tmp_path / "bb")


def test_a_stage_in_out_of_room_mid_copy_leaves_no_temporary_and_a_rerun_works(tmp_path):
    """Room for the bytes (checked first) but not for the files: the copy fails with
    ENOSPC part way, naming the file; no temporary of any rank is left; once room is made
    the next run stages everything (it used to fail again on the leftovers)."""
    with mounted_tmpfs(tmp_path / "small", "size=64m,nr_inodes=30") as small:
        over = dict(dataset__num_files_train=64, storage__stage_in__to=small / "bb")
        _generate(tmp_path, 2, **over)
        res = run_cli(["run", "demo", *_args(tmp_path, **over)], ranks=2)
        assert res.returncode != 0
        assert "No space left on device: " + str(small / "bb" / "train") in res.stderr
        assert not [p for p in small.rglob("*") if ".dlio_mpi-" in p.name]
        subprocess.run(["mount", "-o", "remount,nr_inodes=1000", str(small)], check=True)
        res = run_cli(["run", "demo", *_args(tmp_path, **over)], ranks=2)
        assert res.returncode == 0, res.stderr
        _identical(tmp_path / "data", small / "bb")
