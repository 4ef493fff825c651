"""reader.cache under mpiexec -n 2 and -n 3: the first epoch fills the node's cache (hit ratio
0) and later ones hit it (1) when it has room; without room `none` keeps what it filled first
and `lru` evicts; emulated nodes keep a cache each; the copies are byte-identical while they
exist and removed at the end; what is in the way and not ours is refused and left."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.sampling.requests import EpochRequests
from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(300)
RANKS = [2, 3]


def _args(tmp, **values) -> list[str]:
    base = dict(dataset__num_files_train=24, dataset__record_length_bytes=30000,
                reader__batch_size=1, train__epochs=3, train__computation_time=0.001,
                reader__cache__folder=str(tmp / "cache"))
    base.update(values)
    return workload_overrides(tmp, **base)


def _cache(tmp) -> list[dict]:
    stats = json.loads((tmp / "out" / "per_epoch_stats.json").read_text())
    return [stats[k]["cache"] for k in sorted(stats, key=int)]


@pytest.mark.parametrize("ranks", RANKS)
def test_first_epoch_fills_and_later_epochs_hit(tmp_path, ranks):
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=ranks)
    assert res.returncode == 0, res.stderr
    first, *later = _cache(tmp_path)
    assert first["hit_ratio"] == 0.0 and first["hits"] == 0
    # every file the job read was copied once (one node), and its reads served by the copy
    assert first["files_filled"] == 24 and first["fill_bytes"] > 0
    assert first["fill_bytes"] == sum(os.path.getsize(p) for p in
                                      (tmp_path / "data" / "train").iterdir())
    assert first["requests_from_cache"] > 0
    for epoch in later:
        assert epoch["hit_ratio"] == 1.0 and epoch["files_filled"] == 0
        assert epoch["bytes_from_pfs"] == 0 and epoch["bytes_from_cache"] > 0
        assert epoch["fallbacks"] == 0 and epoch["evictions"] == 0
    described = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert described["dlio_mpi"]["readers"]["cache"]["policy"] == "none"
    assert not (tmp_path / "cache").exists()  # the copies, and the folder the run made


@pytest.mark.parametrize("ranks", RANKS)
def test_without_room_none_keeps_its_first_copies_and_lru_evicts(tmp_path, ranks):
    size = os.path.getsize
    run = run_cli(["generate", "demo", *_args(tmp_path)], ranks=ranks)
    assert run.returncode == 0, run.stderr
    files = sorted((tmp_path / "data" / "train").iterdir())
    capacity = sum(size(p) for p in files[:10])  # room for about 10 of the 24 files
    ratios = {}
    for policy in ("none", "lru"):
        res = run_cli(["run", "demo", *_args(
            tmp_path, reader__cache__capacity_bytes=capacity, reader__cache__policy=policy,
            output__folder=tmp_path / "out")], ranks=ranks)
        assert res.returncode == 0, res.stderr
        epochs = _cache(tmp_path)
        assert epochs[0]["hit_ratio"] == 0.0
        one = size(files[0])
        if policy == "none":  # filled while there was room, then the PFS
            assert epochs[0]["files_filled"] == capacity // one < 24
            assert all(e["files_filled"] == 0 and e["evictions"] == 0 for e in epochs[1:])
            assert all(0 < e["hit_ratio"] < 1 for e in epochs[1:])
        else:  # room made by evicting the least recently used copies: never over capacity
            for e in epochs:
                assert e["files_filled"] > 0 and e["evictions"] > 0
            filled = sum(e["files_filled"] for e in epochs)
            evicted = sum(e["evictions"] for e in epochs)
            assert (filled - evicted) * one <= capacity
        assert all(e["fallbacks"] == 0 for e in epochs)
        ratios[policy] = [e["hit_ratio"] for e in epochs]
        (tmp_path / "out").rename(tmp_path / f"out-{policy}")
    assert ratios["none"] != ratios["lru"]


@pytest.mark.parametrize("ranks", RANKS)
def test_emulated_nodes_keep_a_cache_each(tmp_path, ranks):
    # no shuffling: each rank reads the same files every epoch, from its own node's cache
    res = run_cli(["run", "demo", *_args(tmp_path, reader__file_shuffle="off",
                                         reader__sample_shuffle="off")], ranks, timeout=240,
                  env={"DLIO_MPI_RANKS_PER_NODE": "1"})
    assert res.returncode == 0, res.stderr
    first, *later = _cache(tmp_path)
    # each node filled what its rank read: the files together, once each
    assert first["files_filled"] == 24
    assert all(e["hit_ratio"] == 1.0 for e in later)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dlio_mpi"]["readers"]["cache"]["node_folder"].endswith("/node0")
    assert not (tmp_path / "cache").exists()  # node<k> folders removed with the copies


def test_a_file_in_the_way_is_refused_and_left(tmp_path):
    run = run_cli(["generate", "demo", *_args(tmp_path)], ranks=2)
    assert run.returncode == 0, run.stderr
    mine = tmp_path / "cache" / "train" / "img_07_of_24.npz"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"the user's")
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2)
    assert res.returncode == 2, res.stderr
    assert f"{mine} exists and is not dlio-mpi's" in res.stderr
    assert mine.read_bytes() == b"the user's"


def test_a_crashed_runs_copies_and_fill_temporaries_are_removed(tmp_path):
    """What a killed run left (its manifest, a copy, a fill's temporary under its tag) is
    ours: the next run starts from an empty cache; a file of the user's beside them stays."""
    run = run_cli(["generate", "demo", *_args(tmp_path)], ranks=2)
    assert run.returncode == 0, run.stderr
    train = tmp_path / "cache" / "train"
    train.mkdir(parents=True)
    copy, temporary = train / "img_05_of_24.npz", train / "img_06_of_24.npz.dlio_mpi-abc123.tmp"
    copy.write_bytes(b"an old copy")
    temporary.write_bytes(b"half a copy")
    (train / "notes.txt").write_text("mine")
    (tmp_path / "cache" / "dlio_mpi_cache.json").write_text(json.dumps(
        {"tool": "dlio-mpi", "kind": "dlio-mpi cache tier", "tag": "abc123",
         "files": ["train/img_05_of_24.npz", "train/img_06_of_24.npz"]}))
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2)
    assert res.returncode == 0, res.stderr
    assert _cache(tmp_path)[0]["hit_ratio"] == 0.0  # the old copy was not served
    assert sorted(os.listdir(train)) == ["notes.txt"]
    assert (train / "notes.txt").read_text() == "mine"


def test_backends_it_cannot_serve_are_refused_before_any_io(tmp_path):
    res = run_cli(["run", "demo", *_args(tmp_path, reader__file_access="shared")], ranks=2)
    assert res.returncode == 2 and "reader.cache" in res.stderr, res.stderr
    assert "not implemented yet" in res.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "cache").exists()


def test_a_cache_folder_a_live_job_holds_is_refused_until_it_ends(tmp_path):
    """Two jobs given one cache folder: the second is refused before any I/O, naming the
    folder and the job holding it (here this test process, as a live job's node leader);
    nothing of the first job's is touched. Once the first job ends, the folder is free."""
    import socket

    from dlio_mpi.storage import storage_for

    cache = tmp_path / "cache"
    (cache / "train").mkdir(parents=True)
    theirs = cache / "train" / "img_05_of_24.npz"
    theirs.write_bytes(b"the first job's copy")
    manifest = cache / "dlio_mpi_cache.json"
    manifest.write_text(json.dumps({"tool": "dlio-mpi", "kind": "dlio-mpi cache tier",
                                    "tag": "abc123", "files": ["train/img_05_of_24.npz"]}))
    lock = storage_for(str(cache)).claim(str(cache), "cache tier")
    lock.acquire()
    try:
        res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2)
        assert res.returncode == 2, res.stderr
        holder = f"{cache} is in use by another dlio-mpi job (cache tier on " \
                 f"{socket.gethostname()}, pid {os.getpid()}, since "
        assert res.stderr.count(holder) == 1, res.stderr
        assert theirs.read_bytes() == b"the first job's copy"
        assert "abc123" in manifest.read_text()
        assert not (tmp_path / "data").exists()  # refused before the dataset was generated
    finally:
        lock.release()
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2)
    assert res.returncode == 0, res.stderr
    assert _cache(tmp_path)[1]["hit_ratio"] == 1.0
    assert sorted(os.listdir(cache)) == []  # its copies, the earlier ones and its lock gone


def test_copies_gone_mid_run_are_counted_as_reads_of_the_data_folder(tmp_path):
    """Five copies vanish before each epoch after the first (the test hook, as something
    outside the job removing them): their planned hits read the data folder's files, and the
    hit ratio, requests and bytes per tier say so."""
    res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2,
                  env={"DLIO_MPI_TEST_CACHE_VANISH": "5"})
    assert res.returncode == 0, res.stderr
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    for key in sorted(stats, key=int):
        epoch, cache = stats[key], stats[key]["cache"]
        # every byte requested came from one tier or the other (a fill's whole file aside)
        assert cache["bytes_from_cache"] + cache["bytes_from_pfs"] - cache["fill_bytes"] \
            == epoch["bytes_requested"]
        if key == "1":
            assert cache["files_filled"] == 24 and cache["fallbacks"] == 0
            continue
        # files 0-4 (9 requests each, the whole file's worth) from the data folder
        per_file = epoch["bytes_requested"] // 24
        gone = 5 * cache["requests"] // 24
        assert cache["fallbacks"] == 5  # one open each
        assert cache["requests_from_pfs_after_fallback"] == gone
        assert cache["planned_hits_from_pfs"] == gone
        assert cache["hits"] == cache["requests_from_cache"] == cache["requests"] - gone
        assert cache["hit_ratio"] == round(19 / 24, 6)
        assert cache["bytes_from_pfs"] == cache["bytes_from_pfs_after_fallback"] \
            == 5 * per_file
        assert cache["bytes_from_cache"] == 19 * per_file
    assert not (tmp_path / "cache").exists()


def _engine_epoch(engine, files: list[int], flags: list[int], length: int) -> dict:
    """One batch reading `length` bytes of each file with its flags; the counters after."""
    n = len(files)
    engine.start_epoch(EpochRequests(
        np.array([0, n], dtype=np.int64), np.asarray(files, dtype=np.int64),
        np.zeros(n, dtype=np.int64), np.full(n, length, dtype=np.int64),
        flags=np.asarray(flags, dtype=np.uint32)))
    assert engine.next() is not None and engine.next() is None
    return engine.counters()


def test_the_engine_counts_each_read_where_its_bytes_came_from(tmp_path):
    """A copy gone: the request reads the file itself, counted as such, whether through an
    access's descriptor or one the thread keeps (also in later epochs, without a new open);
    a new fill replaces the descriptor kept on the file itself."""
    (tmp_path / "src").mkdir()
    (tmp_path / "cache").mkdir()
    src = [tmp_path / "src" / f"f{i}" for i in range(3)]
    for p in src:
        p.write_bytes(os.urandom(4096))
    copies = [tmp_path / "cache" / p.name for p in src]
    access = _core.REQ_OPEN | _core.REQ_CLOSE
    hit = _core.REQ_CACHED | _core.REQ_HIT
    fill = _core.REQ_CACHED | _core.REQ_FILL
    keys = ("cache_reads", "cache_fallbacks", "cache_fallback_reads", "cache_fallback_bytes",
            "cache_hit_fallbacks", "cache_fills")
    with _core.Engine(1, 1) as engine:
        engine.set_files([str(p) for p in src])
        engine.set_cache(".dlio_mpi-t.tmp", paths=[str(p) for p in copies])
        seen = [_engine_epoch(engine, [0, 1, 2], [fill | access, fill, fill], 1000)]
        copies[0].unlink()
        copies[1].unlink()
        engine.close_files()  # as a loader closes its files when the epoch ends
        seen.append(_engine_epoch(engine, [0, 1, 2], [hit | access, hit, hit], 1000))
        seen.append(_engine_epoch(engine, [0, 1, 2], [hit | access, hit, hit], 1000))
        seen.append(_engine_epoch(engine, [1], [fill], 1000))
    table = [tuple(c[k] for k in keys) for c in seen]
    assert table == [(3, 0, 0, 0, 0, 3),        # three fills, each read from its copy
                     (4, 2, 2, 2000, 2, 3),     # two copies gone: opened and read
                     (5, 3, 4, 4000, 4, 3),     # the kept descriptor is the file itself
                     (6, 3, 4, 4000, 4, 4)]     # filled again: its new copy read
    assert copies[1].read_bytes() == src[1].read_bytes()


def test_fills_out_of_room_read_the_data_folder_and_are_reported(tmp_path, small_fs):
    """A cache folder fuller than the plan allows for (capacity_bytes unset: the free space,
    counted in file sizes; tmpfs rounds each 8195-byte file up to 12 KiB): the fills past its
    room fail with ENOSPC, remove their temporaries and read the data folder's file instead;
    the run goes on, says so once, and the figures count those reads where they came from."""
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    (small_fs / "filler").write_bytes(b"\0" * (free - 64 * 4096))  # 256 KiB left
    res = run_cli(["run", "demo", *_args(tmp_path, dataset__record_length_bytes=7900,
                                         reader__cache__folder=small_fs / "cache")], ranks=2)
    assert res.returncode == 0, res.stderr
    assert os.path.getsize(tmp_path / "data" / "train" / "img_00_of_24.npz") == 8195
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    first = stats["1"]["cache"]
    failed = first["fills_out_of_room"]
    assert failed > 0 and first["files_filled"] + failed == 24  # every file planned a fill
    warned = [line for line in res.stdout.splitlines() if "ran out of room" in line]
    assert len(warned) == 1, res.stdout
    assert f"{failed} fill(s) of train epoch 1 ran out of room in {small_fs / 'cache'}" \
        in warned[0]
    for key in sorted(stats, key=int):
        epoch, cache = stats[key], stats[key]["cache"]
        per_file = epoch["bytes_requested"] // 24  # each file read once an epoch, alike
        # the failed files' requests read the data folder: in the first epoch instead of
        # their new copy, later instead of their planned hit
        assert cache["bytes_from_pfs_after_fallback"] == failed * per_file
        assert cache["bytes_from_pfs"] == cache["fill_bytes"] + failed * per_file
        assert cache["bytes_from_cache"] + cache["bytes_from_pfs"] - cache["fill_bytes"] \
            == epoch["bytes_requested"]
        if key != "1":
            assert cache["fills_out_of_room"] == 0 and cache["files_filled"] == 0
            assert cache["hit_ratio"] == round((24 - failed) / 24, 6)
    assert os.listdir(small_fs) == ["filler"]  # no temporaries, the cache folder removed


def test_a_capacity_above_the_free_space_is_refused_before_any_io(tmp_path):
    res = run_cli(["run", "demo", *_args(tmp_path, reader__cache__capacity_bytes=10**18)],
                  ranks=2)
    assert res.returncode == 2, res.stderr
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    message = [line for line in res.stderr.splitlines() if "capacity_bytes" in line]
    assert len(message) == 1, res.stderr
    assert f"reader.cache.capacity_bytes: {10**18} is more than the free space of the cache " \
           f"folder {tmp_path / 'cache'}" in message[0]
    # its free space, and what it takes (within what other writers change meanwhile)
    shown = int(re.search(r"\((\d+) bytes\); expected at most (\d+),", message[0])[1])
    assert abs(shown - free) < 64 << 20
    assert "or leave it unset to use the free space" in message[0]
    assert not (tmp_path / "data").exists() and not (tmp_path / "cache").exists()


def test_validate_warns_of_a_capacity_above_the_free_space(tmp_path):
    """What run refuses, validate warns of (exit 0, no I/O): the same message."""
    res = run_cli(["validate", "demo", *_args(tmp_path, reader__cache__capacity_bytes=10**18),
                   "--json"], ranks=1)
    assert res.returncode == 0, res.stderr
    [warning] = json.loads(res.stdout)["warnings"]
    assert warning.startswith(f"run would refuse: reader.cache.capacity_bytes: {10**18} is "
                              f"more than the free space of the cache folder {tmp_path / 'cache'}")
    res = run_cli(["validate", "demo", *_args(tmp_path, reader__cache__capacity_bytes=4096),
                   "--json"], ranks=1)
    assert res.returncode == 0 and json.loads(res.stdout)["warnings"] == [], res.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "data").exists()


def test_one_node_refused_its_cache_folder_stops_every_rank(tmp_path):
    """Emulated nodes: another job holds node 1's folder only; the ranks of both nodes agree
    and exit 2 with the one message, instead of node 0 going on alone."""
    from dlio_mpi.storage import storage_for

    theirs = tmp_path / "cache" / "node1"
    theirs.mkdir(parents=True)
    lock = storage_for(str(theirs)).claim(str(theirs), "cache tier")
    lock.acquire()
    try:
        res = run_cli(["run", "demo", *_args(tmp_path)], ranks=2, timeout=60,
                      env={"DLIO_MPI_RANKS_PER_NODE": "1"})
    finally:
        lock.release()
    assert res.returncode == 2, res.stderr
    assert res.stderr.count(f"{theirs} is in use by another dlio-mpi job") == 1, res.stderr
    assert not (tmp_path / "data").exists()
