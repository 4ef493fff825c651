"""hdf5 files the C engine cannot read at their samples' file offsets (chunks of several
samples, gzip, lzf, a max shape, num_dset_per_record 2) are read through h5py as DLIO's
HDF5Reader reads them (readers/h5py_reader.py), with reader.engine native picking it; the
framework loaders (torch DataLoader, tf.data) read hdf5 through h5py too.

Serial: the backend on files dlio-mpi writes, each batch holding the planned ids in order and
exactly the rows h5py reads for them; what describe() and the plan say (h5py, and which
property of the file); contiguous files still go to the C engine; MPI-IO, read_mode file and
O_DIRECT refused with such files; preprocess_time, drop_page_cache and the I/O watchdog.
Under mpiexec (-n 2, -n 3, in-process): each rank reads its shard's ids, the rows h5py gives,
and the framework pytorch engine reads the same ids as the h5py reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from dlio_mpi.config import load_config
from dlio_mpi.errors import UserError
from helpers import access_logs, resident_pages, run_in_process, workload_overrides

pytestmark = pytest.mark.timeout(300)

SIDE = 16  # records of SIDE x SIDE uint8
# (overrides, words of the reason: the property of the file that needs h5py)
LIBRARY_READ = [
    ({"dataset__hdf5__chunk_dims": "[4,16,16]"},
     "stored in chunks of [4, 16, 16] (dataset.hdf5.chunk_dims), not of one sample"),
    ({"dataset__compression": "gzip", "dataset__hdf5__chunk_dims": "[2,8,16]"},
     "compressed (dataset.compression gzip)"),
    ({"dataset__compression": "lzf"}, "compressed (dataset.compression lzf)"),
    ({"dataset__record_dims": "[2,16,8]", "dataset__hdf5__num_dset_per_record": 2},
     "each sample is split over 2 datasets (dataset.hdf5.num_dset_per_record 2)"),
    ({"dataset__hdf5__max_shape": "[32,32]"}, "resizable (dataset.hdf5.max_shape [32, 32])"),
]


def _config(tmp: Path, **values):
    values = {"dataset__format": "hdf5", "dataset__record_length_bytes": SIDE * SIDE,
              "dataset__num_samples_per_file": 4, "dataset__num_files_train": 6, **values}
    return load_config("demo", workload_overrides(tmp, **values))


def _write_dataset(cfg):
    """The train split written as dlio-mpi generates it (each file its own seed); its
    SplitFiles as the run finds generated data."""
    from dlio_mpi.data.catalog import SplitFiles
    from dlio_mpi.data.dataset import describe_dataset
    from dlio_mpi.formats.base import StagedWrites

    split = describe_dataset(cfg)["train"]
    staged = StagedWrites("test")
    for f in range(split.num_files):
        os.makedirs(os.path.dirname(split.path(f)), exist_ok=True)
        split.format.write(split.path(f), split.spec(f), 1000 + f, staged)
    staged.commit()
    return SplitFiles(split, split.expected_layouts(), "manifest", split.sample_layout)


def _rows(files, sample_id: int) -> bytes:
    """Sample `sample_id` as plain h5py reads it: row i of every records_<k>, in order."""
    file, within = divmod(sample_id, files.split.samples_per_file)
    with h5py.File(files.path(file), "r") as f:
        names = sorted((k for k in f if k.startswith("records_")), key=lambda k: int(k[8:]))
        return b"".join(f[name][within].tobytes() for name in names)


def _plan(cfg, files, ids: np.ndarray, batch: int, delays: np.ndarray | None = None):
    from dlio_mpi.readers import resolve_read_mode
    from dlio_mpi.sampling.requests import AccessPolicy, plan_reads

    return plan_reads(ids, len(ids) // batch, batch, files.split.samples_per_file,
                      files.layouts, resolve_read_mode(cfg), AccessPolicy(cfg.reader.access),
                      delays)


def _reader(cfg, files):
    from dlio_mpi.readers import open_reader

    return open_reader(cfg, files)


def _epoch(reader, plan) -> tuple[list[np.ndarray], list[list[bytes]], list]:
    """One epoch through an h5py backend: each batch's ids, samples' bytes, BatchStats."""
    reader.prepare_epoch(plan)
    reader.start_epoch(plan)
    ids, samples, stats = [], [], []
    while (got := reader.next_batch()) is not None:
        ids.append(reader.ids.copy())
        samples.append([np.asarray(s).tobytes() for s in reader.batch])
        stats.append(got)
    reader.end_epoch()
    return ids, samples, stats


@pytest.mark.parametrize("extra,why", LIBRARY_READ)
@pytest.mark.parametrize("read_type", ["on_demand", "memory"])
def test_each_batch_holds_the_planned_rows_h5py_reads(tmp_path, extra, why, read_type):
    cfg = _config(tmp_path, reader__read_threads=2, reader__prefetch_size=2,
                  reader__batch_size=3, reader__read_type=read_type, **extra)
    files = _write_dataset(cfg)
    reader = _reader(cfg, files)
    try:
        described = reader.describe()
        assert described["backend"] == "h5py" and why in described["why"], described
        for epoch in (1, 2):
            ids = np.random.default_rng(epoch).permutation(24)[:21]
            plan = _plan(cfg, files, ids, 3)
            before = reader.counters()
            got_ids, got, stats = _epoch(reader, plan)
            after = reader.counters()
            assert np.array_equal(np.concatenate(got_ids), ids)  # the plan's ids, in order
            flat = [sample for batch in got for sample in batch]
            assert flat == [_rows(files, int(i)) for i in ids]
            assert len(flat[0]) == SIDE * SIDE
            opens = after["opens"] - before["opens"]
            if read_type == "on_demand":
                assert opens == len(ids)  # a file opened for every sample
            else:  # each file kept by the threads that read it, for the epoch
                distinct = len(np.unique(ids // 4))
                assert distinct <= opens <= 2 * distinct
            assert after["closes"] - before["closes"] == opens
            if read_type == "on_demand":  # each open reads the file's metadata at least
                assert all(s.bytes_read > 0 and s.read_ops > 0 for s in stats)
            else:  # a batch may come from the chunk cache of files kept open
                assert all(s.bytes_read >= 0 for s in stats) and stats[0].bytes_read > 0
            assert after["bytes"] - before["bytes"] == sum(s.bytes_read for s in stats)
            assert len(reader.lat_ns) == len(ids) and (reader.lat_ns > 0).all()
    finally:
        reader.close()


def test_bytes_read_are_the_chunks_hdf5_reads(tmp_path):
    """One thread, files of 4 samples in chunks of 4: a sample read on_demand is the file's
    metadata plus its whole chunk (4 samples' bytes), never less."""
    cfg = _config(tmp_path, reader__read_threads=1, reader__batch_size=2,
                  dataset__hdf5__chunk_dims="[4,16,16]")
    files = _write_dataset(cfg)
    reader = _reader(cfg, files)
    try:
        _, _, stats = _epoch(reader, _plan(cfg, files, np.arange(8), 2))
    finally:
        reader.close()
    for s in stats:
        assert 2 * 4 * SIDE * SIDE <= s.bytes_read < 2 * (4 * SIDE * SIDE + 16384)


@pytest.mark.parametrize("extra", [{}, {"dataset__hdf5__chunk_dims": "[1,16,16]"}])
def test_contiguous_and_one_sample_chunks_stay_with_the_c_engine(tmp_path, extra):
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan
    from dlio_mpi.readers.native import NativeReader

    cfg = _config(tmp_path, **extra)
    plan = derive_plan(cfg, 2)
    assert plan.library_read == ""
    assert "engine native: the native C engine" in describe_plan(plan, cfg)
    reader = _reader(cfg, _write_dataset(cfg))
    try:
        assert isinstance(reader, NativeReader)
        assert reader.describe() == {"backend": "native", "file_access": "multi"}
    finally:
        reader.close()


@pytest.mark.parametrize("extra,why", LIBRARY_READ)
def test_the_plan_says_h5py_reads_and_why(tmp_path, extra, why):
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan

    cfg = _config(tmp_path, reader__read_threads=3, **extra)
    plan = derive_plan(cfg, 2)
    assert why in plan.library_read
    lines = describe_plan(plan, cfg).splitlines()
    reader = [line for line in lines if line.startswith("reader ")]
    assert len(reader) == 1 and "engine native: h5py in 3 reader thread(s), not the C engine, " \
        f"because {plan.library_read}" in reader[0], reader
    note = [n for n in plan.notes if n.startswith("reader.data_loader=")]
    assert len(note) == 1 and "hdf5 files read through h5py, not by the C engine" in note[0]
    assert "opened and closed for every sample (reader.read_type on_demand)" in note[0]
    assert not any(tmp_path.iterdir())  # decided before any I/O


@pytest.mark.parametrize("extra,key,accepted", [
    ({"reader__file_access": "shared"}, "reader.file_access: shared reads samples at their "
     "file offsets through MPI-IO", "accepted: reader.file_access multi (or posix), which "
     "reads them through h5py"),
    ({"reader__file_access": "collective"}, "reader.file_access: collective",
     "accepted: reader.file_access multi (or posix), which reads them through h5py"),
    ({"reader__file_access": "mpio"}, "reader.file_access: mpio", "through h5py"),
    ({"reader__read_mode": "file"}, "reader.read_mode: file does not apply to these hdf5 "
     "files", "expected auto (or sample)"),
    ({"reader__odirect": "true"}, "reader.odirect: true does not combine with these hdf5 "
     "files", "keeps the page cache from serving the reads)"),
])
def test_what_the_h5py_reader_cannot_do_is_refused_before_io(tmp_path, extra, key, accepted):
    from dlio_mpi.plan.derive import derive_plan

    cfg = _config(tmp_path, dataset__hdf5__chunk_dims="[2,16,16]", **extra)
    with pytest.raises(UserError) as info:
        derive_plan(cfg, 2)
    message = str(info.value)
    assert message.startswith(key) and message.endswith(accepted), message
    assert "stored in chunks of [2, 16, 16]" in message and "\n" not in message
    assert not any(tmp_path.iterdir())


def test_sample_delays_from_the_plan():
    from dlio_mpi.readers.h5py_reader import sample_delays
    from dlio_mpi.sampling.requests import ReadPlan

    z = np.zeros(0, dtype=np.int64)
    one = ReadPlan(np.arange(4), np.array([0, 2, 4]), z, z, z, z, z, z,
                   np.array([1, 2, 3, 4]))
    assert sample_delays(one).tolist() == [1, 2, 3, 4]
    fewer = ReadPlan(np.arange(4), np.array([0, 1, 3]), z, z, z, z, z, z,
                     np.array([10, 4, 6]))  # one load for batch 0, two for batch 1
    assert sample_delays(fewer).tolist() == [5, 5, 5, 5]
    assert sample_delays(ReadPlan(np.arange(4), np.array([0, 4]), z, z, z, z, z, z)) is None


def test_preprocess_time_is_slept_per_sample_in_the_reader_threads(tmp_path):
    cfg = _config(tmp_path, reader__read_threads=1, reader__batch_size=4,
                  dataset__compression="gzip")
    files = _write_dataset(cfg)
    reader = _reader(cfg, files)
    try:
        ids = np.arange(8)
        plan = _plan(cfg, files, ids, 4, np.full(8, 50_000_000, dtype=np.int64))
        start = time.monotonic()
        _epoch(reader, plan)
        assert time.monotonic() - start >= 8 * 0.05  # one thread sleeps every sample's 50 ms
        assert (reader.lat_ns < 50_000_000).all()  # the sleeps are not the reads' latency
    finally:
        reader.close()


def test_drop_page_cache_drops_the_files_before_the_epoch(tmp_path):
    cfg = _config(tmp_path, reader__drop_page_cache="true", dataset__compression="lzf")
    files = _write_dataset(cfg)
    paths = [files.path(f) for f in range(2)]
    for path in paths:
        Path(path).read_bytes()
    assert all(resident_pages(p) > 0 for p in paths)
    reader = _reader(cfg, files)
    try:
        plan = _plan(cfg, files, np.arange(8), 2)
        reader.prepare_epoch(plan)
        assert [resident_pages(p) for p in paths] == [0, 0]
        reader.start_epoch(plan)
        while reader.next_batch() is not None:
            pass
        reader.end_epoch()
    finally:
        reader.close()


def _stuck_epoch(tmp: Path, abort: bool) -> None:
    """An epoch whose first file is a FIFO: HDF5's open of it blocks (holding the GIL, as
    h5py does) until another process opens it for writing and closes it, 2 s later."""
    cfg = _config(tmp, reader__io_watchdog_seconds=0.3,
                  reader__io_watchdog_abort=str(abort).lower(), reader__read_threads=1,
                  dataset__hdf5__chunk_dims="[2,16,16]", reader__batch_size=2)
    files = _write_dataset(cfg)
    stuck = files.path(0)
    os.replace(stuck, stuck + ".moved")
    os.mkfifo(stuck)
    releaser = subprocess.Popen(["timeout", "5", "sh", "-c", 'sleep 2; exec 3>"$0"', stuck],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = _reader(cfg, files)
    try:
        reader.start_epoch(_plan(cfg, files, np.arange(4), 2))
        with pytest.raises(RuntimeError, match="the h5py reader failed"):
            reader.next_batch()  # no HDF5 file behind the FIFO
    finally:
        releaser.wait(10)
        reader.close()


def test_the_watchdog_reports_a_read_that_does_not_return(tmp_path, capfd):
    start = time.monotonic()
    _stuck_epoch(tmp_path, abort=False)
    assert time.monotonic() - start >= 2
    err = capfd.readouterr().err
    assert err.count("Timeout (0:00:00.300000)!") == 1, err  # once, on stderr, in C
    assert "in _read_batch" in err and "h5py" in err  # the stuck thread's stack


def test_the_watchdog_with_abort_ends_the_process(tmp_path):
    code = ("import sys; from pathlib import Path\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_hdf5_h5py_reader import _stuck_epoch\n"
            f"_stuck_epoch(Path({str(tmp_path)!r}), abort=True)\n"
            "print('not ended')\n")
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "not ended" not in res.stdout, (res.stdout, res.stderr)
    assert "Timeout (0:00:00.300000)!" in res.stderr and "in _read_batch" in res.stderr


def test_framework_pytorch_reads_the_rows_h5py_reads(tmp_path):
    from dlio_mpi.readers.torch_loader import TorchLoaderReader

    cfg = _config(tmp_path, reader__engine="framework", reader__read_threads=1,
                  reader__batch_size=2, dataset__hdf5__chunk_dims="[4,16,16]",
                  dataset__record_length_bytes=SIDE * SIDE)
    files = _write_dataset(cfg)
    reader = _reader(cfg, files)
    try:
        assert isinstance(reader, TorchLoaderReader)
        ids = np.random.default_rng(3).permutation(24)[:10]
        plan = _plan(cfg, files, ids, 2)
        reader.prepare_epoch(plan)
        reader.start_epoch(plan)
        items = []
        while reader.next_batch() is not None:
            items += [item.numpy().tobytes() for item in reader.batch]
        reader.end_epoch()
        assert items == [_rows(files, int(i)) for i in ids]
        assert reader.counters()["opens"] == 10
        assert "h5py.File(path, 'r')" in reader.describe()["reads"]
    finally:
        reader.close()


def test_framework_tensorflow_reads_the_rows_h5py_reads(tmp_path):
    from dlio_mpi.readers.tf_loader import TfGeneratorReader

    cfg = _config(tmp_path, reader__engine="framework", reader__data_loader="tensorflow",
                  framework="tensorflow", reader__read_threads=2, reader__batch_size=2,
                  dataset__compression="gzip", dataset__record_dims="[2,16,8]",
                  dataset__hdf5__num_dset_per_record=2)
    files = _write_dataset(cfg)
    reader = _reader(cfg, files)
    try:
        assert isinstance(reader, TfGeneratorReader)
        ids = np.random.default_rng(4).permutation(24)[:12]
        plan = _plan(cfg, files, ids, 2)
        reader.prepare_epoch(plan)
        reader.start_epoch(plan)
        got, items = [], []
        while reader.next_batch() is not None:
            got += reader.ids.tolist()
            items += [item.tobytes() for item in reader.batch.numpy()]
        reader.end_epoch()
        assert got == ids.tolist()
        assert items == [_rows(files, int(i)) for i in ids]
        assert reader.counters()["opens"] == len(np.unique(ids // 4))  # once per file
    finally:
        reader.close()


# -- under mpiexec ---------------------------------------------------------------------------

def _run(tmp: Path, **values):
    return run_in_process(_config(tmp, **values))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("extra,why", LIBRARY_READ[:4])
def test_each_rank_reads_its_shard_through_h5py(shared_tmp, extra, why):
    from mpi4py import MPI

    from dlio_mpi.data.catalog import locate_split

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common = dict(dataset__num_files_train=3 * size, reader__read_threads=2,
                  reader__batch_size=2, reader__sample_shuffle="seed",
                  reader__file_shuffle="seed", output__access_log="true", train__epochs=2,
                  **extra)
    contiguous = {k: v for k, v in common.items() if k not in extra}
    root = shared_tmp / "h5"
    _, native = _run(root / "contiguous", workflow__generate_data="true", **contiguous)
    cfg, summary = _run(root / "library", workflow__generate_data="true", **common)
    described = summary["dlio_mpi"]["readers"]["train"]
    assert described["backend"] == "h5py" and why in described["why"], described
    assert native["dlio_mpi"]["readers"]["train"]["backend"] == "native"
    logs = access_logs(root / "library" / "out", (1, 2), size)
    # the same shards as the C engine's reads of contiguous files (the plan decides)
    assert all(np.array_equal(a, b) for a, b in zip(
        logs, access_logs(root / "contiguous" / "out", (1, 2), size), strict=True))
    for epoch in range(2):
        ids = np.concatenate(logs[epoch * size:(epoch + 1) * size])
        assert len(ids) == len(np.unique(ids)) == 12 * size  # disjoint shards, all read
    metric = summary["metric"]
    assert metric["train_bytes_read"] > 0 and metric["train_file_opens"] == 2 * 12 * size
    # this rank's epoch-1 ids, read again through the backend: the rows h5py gives
    files = locate_split(comm, cfg, summary_split(cfg))
    reader = _reader(cfg, files)
    try:
        mine = logs[rank]
        _, got, _ = _epoch(reader, _plan(cfg, files, mine, 2))
    finally:
        reader.close()
    assert [s for batch in got for s in batch] == [_rows(files, int(i)) for i in mine]


def summary_split(cfg):
    from dlio_mpi.data.dataset import describe_dataset

    return describe_dataset(cfg)["train"]


@pytest.mark.mpi(min_size=2)
def test_framework_pytorch_reads_the_ids_the_h5py_reader_reads(shared_tmp):
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    common = dict(dataset__num_files_train=3 * size, reader__read_threads=1,
                  reader__batch_size=2, reader__sample_shuffle="seed",
                  reader__file_shuffle="seed", output__access_log="true", train__epochs=2,
                  dataset__hdf5__chunk_dims="[4,16,16]")
    root = shared_tmp / "fw"
    _, native = _run(root, workflow__generate_data="true", output__folder=root / "native",
                     **common)
    _, framework = _run(root, workflow__generate_data="false", reader__engine="framework",
                        output__folder=root / "framework", **common)
    assert native["dlio_mpi"]["readers"]["train"]["backend"] == "h5py"
    assert framework["dlio_mpi"]["readers"]["train"]["backend"] == "framework"
    for a, b in zip(access_logs(root / "native", (1, 2), size),
                    access_logs(root / "framework", (1, 2), size), strict=True):
        assert len(a) > 0 and np.array_equal(a, b)
    m, n = framework["metric"], native["metric"]
    assert m["train_file_opens"] == n["train_file_opens"] == 2 * 12 * size


def test_two_ranks_train_on_chunked_gzip_files_dlio_wrote(tmp_path):
    """Files plain h5py wrote under DLIO's names, in gzip chunks of 2 samples and in 2
    datasets: probed, and read through h5py when the configuration says so."""
    from helpers import run_cli

    folder = tmp_path / "data" / "train"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(5)
    for i in range(8):
        records = rng.integers(0, 255, (4, 16, 8), dtype=np.uint8)
        with h5py.File(folder / f"img_{i}_of_8.hdf5", "w") as f:
            for j in range(2):
                f.create_dataset(f"records_{j}", data=records, chunks=(2, 16, 8),
                                 compression="gzip")
            f.create_dataset("labels", data=[0] * 4)
    over = workload_overrides(tmp_path, dataset__format="hdf5", dataset__num_samples_per_file=4,
                              dataset__record_dims="[2,16,8]", dataset__compression="gzip",
                              dataset__hdf5__num_dset_per_record=2,
                              dataset__hdf5__chunk_dims="[2,16,8]",
                              dataset__record_length_bytes=256, output__access_log="true",
                              workflow__generate_data="false")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    assert "engine native: h5py in" in res.stdout, res.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dlio_mpi"]["readers"]["train"]["backend"] == "h5py"
    logs = access_logs(tmp_path / "out", (1, 2), 2)
    assert sorted(np.concatenate(logs[:2]).tolist()) == list(range(32))
    assert summary["metric"]["train_bytes_read"] > 0
    contiguous = workload_overrides(tmp_path, dataset__format="hdf5",
                                    dataset__num_samples_per_file=4,
                                    dataset__record_dims="[2,16,8]",
                                    dataset__record_length_bytes=256,
                                    workflow__generate_data="false")
    refused = run_cli(["run", "demo", *contiguous])
    assert refused.returncode == 2 and "holds 2 record datasets" in refused.stderr, \
        refused.stderr
