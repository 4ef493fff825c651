"""reader.staging: read_once under mpiexec -n 2 and -n 3: each data file opened on the file
system once for the job, every rank still consuming exactly the samples the shuffle gives it
(the access log of a run reading the files), each delivered sample byte-identical to its
file's (the exchange's self-check, DLIO_MPI_TEST_VERIFY_EXCHANGE), the exchange's bytes
reported; refusals before any I/O; a rank failing during the staging ends the job.

reader.staging: replicated, the same way: every rank opens every file once and reads all of
its bytes (ranks x the dataset from the file system), then serves the same samples as a run
reading the files, byte-identical; its memory refusal, and reader.keep_data: false reading
everything and keeping nothing; a failing staging ends the job."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter

import numpy as np
import pytest

from dlio_mpi.data.catalog import spot_indices
from helpers import run_cli, run_cli_opens, run_cli_strace, strace_calls, workload_overrides

pytestmark = pytest.mark.timeout(300)
RANKS = [2, 3]
STAGINGS = ["read_once", "replicated"]


def _args(tmp, out: str = "out", **values) -> list[str]:
    base = dict(dataset__format="indexed_binary", dataset__num_files_train=12,
                dataset__num_samples_per_file=6, dataset__record_length_bytes=8192,
                reader__batch_size=4, train__epochs=2, train__computation_time=0.001,
                output__folder=tmp / out, output__access_log="true")
    base.update(values)
    return workload_overrides(tmp, **base)


@pytest.mark.parametrize("ranks", RANKS)
def test_files_read_once_and_every_rank_gets_its_samples(tmp_path, ranks):
    res = run_cli(["run", "demo", *_args(tmp_path, out="native")], ranks=ranks)
    assert res.returncode == 0, res.stderr
    res, opened = run_cli_opens(["run", "demo", *_args(tmp_path, reader__staging="read_once")],
                                ranks, tmp_path / "strace.log")
    assert res.returncode == 0, res.stderr
    # the same samples, rank by rank and epoch by epoch, as a run reading the files
    for epoch in (1, 2):
        for rank in range(ranks):
            name = f"access_log/epoch{epoch}_rank{rank}.npy"
            np.testing.assert_array_equal(np.load(tmp_path / "out" / name),
                                          np.load(tmp_path / "native" / name))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reader = summary["dlio_mpi"]["readers"]["train"]
    assert reader["backend"] == "read_once"
    data = tmp_path / "data" / "train"
    total = sum(p.stat().st_size for p in data.iterdir() if p.name.endswith(".indexed_binary"))
    assert reader["staging"]["opens"] == 12 and reader["staging"]["bytes_read"] >= total
    ex = reader["exchange"]
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    assert ex["bytes"] == sum(e["bytes_read"] for e in stats.values()) > 0  # the samples'
    assert ex["steps"] == 2 * summary["dlio_mpi"]["steps_per_epoch"]
    assert 0 < ex["bytes_from_other_ranks"] < ex["bytes"]
    assert ex["bytes_from_other_nodes"] == 0  # one node
    assert summary["metric"]["train_file_opens"] == 0  # training opened no file
    if opened is not None:
        data_files = [p for p in opened if p.startswith(str(data))
                      and p.endswith(".indexed_binary")]
        assert sorted(data_files) == sorted(str(p) for p in data.iterdir()
                                            if p.name.endswith(".indexed_binary"))


@pytest.mark.parametrize("ranks", RANKS)
def test_emulated_nodes_exchange_across_nodes_the_right_bytes(tmp_path, ranks):
    # the exchange's self-check: every delivered sample compared with its file's bytes
    env = {"DLIO_MPI_RANKS_PER_NODE": "1", "DLIO_MPI_TEST_VERIFY_EXCHANGE": "1"}
    res = run_cli(["run", "demo", *_args(tmp_path, reader__staging="read_once")], ranks,
                  timeout=240, env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reader = summary["dlio_mpi"]["readers"]["train"]
    ex = reader["exchange"]
    assert ex["bytes_from_other_nodes"] == ex["bytes_from_other_ranks"] > 0
    assert len(reader["staging"]["memory_bytes_per_node"]) == ranks


def test_a_dataset_beyond_the_nodes_memory_is_refused_before_any_io(tmp_path):
    res = run_cli(["run", "demo", *_args(tmp_path, reader__staging="read_once",
                                         dataset__num_files_train=400,
                                         dataset__num_samples_per_file=1,
                                         dataset__record_length_bytes=1 << 30)], ranks=2)
    assert res.returncode == 2 and "reader.staging: read_once" in res.stderr, res.stderr
    assert "memory" in res.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("staging", STAGINGS)
@pytest.mark.parametrize("override", ["reader__file_access=shared", "reader__engine=framework",
                                      "reader__access_order=sorted"])
def test_backends_it_cannot_serve_are_refused(tmp_path, staging, override):
    key, value = override.split("=")
    res = run_cli(["run", "demo", *_args(tmp_path, reader__staging=staging,
                                         **{key: value})], ranks=2)
    assert res.returncode == 2, res.stderr
    assert f"reader.staging {staging} is not implemented yet" in res.stderr \
        or f"reader.staging: {staging} is not implemented yet" in res.stderr, res.stderr
    assert not (tmp_path / "data").exists()


FILES = 40  # enough that the manifest's spot checks leave most files unlooked at


def _unchecked_file(tmp_path, ranks: int):
    """Generate the dataset; a file the spot checks of a run do not look at."""
    res = run_cli(["generate", "demo", *_args(tmp_path, dataset__num_files_train=FILES)],
                  ranks=ranks)
    assert res.returncode == 0, res.stderr
    victim = next(i for i in range(FILES) if i not in spot_indices(FILES))
    return tmp_path / "data" / "train" / f"img_{victim:02d}_of_{FILES}.indexed_binary"


def _staged_run(tmp_path, ranks: int, staging: str = "read_once"):
    """A staged run (reader.staging `staging`); it must end within a minute."""
    began = time.monotonic()
    res = run_cli(["run", "demo", *_args(tmp_path, dataset__num_files_train=FILES,
                                         reader__staging=staging)], ranks=ranks)
    assert time.monotonic() - began < 60
    return res


@pytest.mark.parametrize("staging", STAGINGS)
@pytest.mark.parametrize("ranks", RANKS)
def test_a_rank_failing_in_the_staging_ends_the_job(tmp_path, ranks, staging):
    path = _unchecked_file(tmp_path, ranks)
    os.truncate(path, 100)
    res = _staged_run(tmp_path, ranks, staging)
    assert res.returncode != 0
    assert str(path) in res.stderr and "changed since its size was taken" in res.stderr


@pytest.mark.parametrize("staging", STAGINGS)
@pytest.mark.parametrize("ranks", RANKS)
def test_a_fifo_in_place_of_a_data_file_is_named_without_blocking(tmp_path, ranks, staging):
    """A FIFO where the manifest's spot checks do not look: the staging's open neither blocks
    nor reads it ("Illegal seek"), and the job ends naming it."""
    path = _unchecked_file(tmp_path, ranks)
    path.unlink()
    os.mkfifo(path)
    res = _staged_run(tmp_path, ranks, staging)
    assert res.returncode != 0
    assert f"{path} is a FIFO, not a regular file" in res.stderr
    assert "Illegal seek" not in res.stderr


# ----------------------------------------------------------------- reader.staging: replicated
def _data_files(tmp_path) -> dict[str, int]:
    """The training files and their sizes."""
    data = tmp_path / "data" / "train"
    return {str(p): p.stat().st_size for p in data.iterdir()
            if p.name.endswith(".indexed_binary")}


def _staging_io(log: str, files: dict[str, int]) -> tuple[Counter, Counter]:
    """From a `strace -f -y -e trace=openat,preadv,preadv2` log: the opens of each (thread,
    data file) and the bytes each thread read from the data files."""
    opens, read = Counter(), Counter()
    for tid, call in strace_calls(log):
        opened = re.match(r'openat\(AT_FDCWD[^,]*, "([^"]+)"', call)
        if opened and opened.group(1) in files:
            opens[tid, opened.group(1)] += 1
        got = re.match(r"preadv2?\(\d+<([^>]+)>,.*\) = (\d+)$", call)
        if got and got.group(1) in files:
            read[tid] += int(got.group(2))
    return opens, read


@pytest.mark.parametrize("ranks", RANKS)
def test_replicated_every_rank_reads_every_file_once_and_serves_the_same_samples(tmp_path,
                                                                                 ranks):
    res = run_cli(["run", "demo", *_args(tmp_path, out="native")], ranks=ranks)
    assert res.returncode == 0, res.stderr
    res, log = run_cli_strace(["run", "demo", *_args(tmp_path, reader__staging="replicated")],
                              ranks, tmp_path / "strace.log",
                              ["-y", "-e", "trace=openat,preadv,preadv2"])
    assert res.returncode == 0, res.stderr
    assert "staging (train, replicated)" in res.stdout
    for epoch in (1, 2):  # the same samples, rank by rank and step by step
        for rank in range(ranks):
            name = f"access_log/epoch{epoch}_rank{rank}.npy"
            np.testing.assert_array_equal(np.load(tmp_path / "out" / name),
                                          np.load(tmp_path / "native" / name))
    files = _data_files(tmp_path)
    dataset = sum(files.values())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reader = summary["dlio_mpi"]["readers"]["train"]
    staged = reader["staging"]
    assert reader["backend"] == "replicated"
    assert staged["files"] == 12 and staged["opens"] == ranks * 12
    assert staged["bytes_read"] == ranks * dataset and staged["dataset_bytes"] == dataset
    assert staged["copies"] == ranks and staged["kept"] is True
    assert staged["memory_bytes_per_rank_max"] >= dataset
    assert staged["memory_bytes_per_node"] == [ranks * staged["memory_bytes_per_rank_max"]]
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    assert reader["serving"]["bytes"] == sum(e["bytes_read"] for e in stats.values()) > 0
    assert reader["serving"]["steps"] == 2 * summary["dlio_mpi"]["steps_per_epoch"]
    assert summary["metric"]["train_file_opens"] == 0  # training opened no file
    if log is not None:  # every rank opened each file once and read all of its bytes
        opens, read = _staging_io(log, files)
        assert set(opens.values()) == {1}
        readers = {tid for tid, _ in opens}
        assert len(readers) == ranks
        assert all({path for tid, path in opens if tid == r} == set(files) for r in readers)
        assert read == {r: dataset for r in readers}


@pytest.mark.parametrize("ranks", RANKS)
def test_replicated_serves_each_sample_with_its_files_bytes(tmp_path, ranks):
    # the self-check: every served sample compared with its file's bytes; one rank a node
    env = {"DLIO_MPI_RANKS_PER_NODE": "1", "DLIO_MPI_TEST_VERIFY_EXCHANGE": "1"}
    res = run_cli(["run", "demo", *_args(tmp_path, reader__staging="replicated")], ranks,
                  timeout=240, env=env)
    assert res.returncode == 0, res.stderr
    staged = json.loads((tmp_path / "out" / "summary.json").read_text()
                        )["dlio_mpi"]["readers"]["train"]["staging"]
    assert staged["memory_bytes_per_node"] == [staged["memory_bytes_per_rank_max"]] * ranks


def _half_the_memory(tmp_path, staging: str, **values) -> list[str]:
    """Overrides for a dataset of about half this host's memory (never generated here)."""
    half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    return _args(tmp_path, reader__staging=staging, dataset__num_files_train=64,
                 dataset__num_samples_per_file=1, dataset__record_length_bytes=half // 64,
                 **values)


def test_replicated_copies_beyond_the_nodes_memory_are_refused_unless_kept_none(tmp_path):
    # two ranks on a node, each to hold half the node's memory: refused before any I/O
    res = run_cli(["run", "demo", *_half_the_memory(tmp_path, "replicated")], ranks=2)
    assert res.returncode == 2, res.stderr
    assert "reader.staging: replicated keeps a copy of the dataset in every rank's memory" \
        in res.stderr and "reader.keep_data: false" in res.stderr, res.stderr
    assert not (tmp_path / "data").exists()
    # one copy for the node (read_once), or none kept: accepted
    for staging, values in (("read_once", {}), ("replicated", {"reader__keep_data": "false"})):
        res = run_cli(["validate", "demo", "--ranks", "2",
                       *_half_the_memory(tmp_path, staging, **values)], ranks=1)
        assert res.returncode == 0, res.stderr
    assert "keeping none (reader.keep_data false" in res.stdout


@pytest.mark.parametrize("ranks", RANKS)
def test_replicated_without_keeping_the_data_reads_everything_into_one_buffer(tmp_path, ranks):
    res = run_cli(["run", "demo", *_args(tmp_path, reader__staging="replicated",
                                         reader__keep_data="false")], ranks=ranks)
    assert res.returncode == 0, res.stderr
    dataset = sum(_data_files(tmp_path).values())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reader = summary["dlio_mpi"]["readers"]["train"]
    staged, served = reader["staging"], reader["serving"]
    assert staged["bytes_read"] == ranks * dataset and staged["kept"] is False
    largest = max(_data_files(tmp_path).values())
    assert staged["memory_bytes_per_rank_max"] == -(-largest // 4096) * 4096 < dataset
    # the step loop ran every step, with batches of no bytes, and says so
    assert served["steps"] == 2 * summary["dlio_mpi"]["steps_per_epoch"]
    assert served["bytes"] == 0 and served["how"].startswith("no bytes")
    stats = json.loads((tmp_path / "out" / "per_epoch_stats.json").read_text())
    assert all(e["bytes_read"] == e["bytes_transferred"] == 0 for e in stats.values())
    metric = summary["metric"]
    assert metric["train_bytes_read"] == metric["train_metadata_bytes_read"] == 0
