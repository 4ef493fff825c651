"""reader.engine: framework with reader.data_loader: pytorch: a real torch DataLoader per rank.

Serial: the backend on files whose bytes name their sample (so every batch shows which samples
it holds), with real worker processes; the refused combinations, each one message and exit
status 2 before any I/O; the plan's notes. Under mpiexec (-n 2, -n 3, in-process): each rank
reads exactly the sample ids the native engine reads, in the same order; summary.json names
the engine. Subprocess runs on 2 ranks with each multiprocessing context (spawned and
forkserver workers must not initialise MPI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi.config import load_config
from helpers import access_logs, reads_as_native, run_cli, run_in_process, workload_overrides

pytestmark = pytest.mark.timeout(300)

SIDE = 16  # samples of SIDE x SIDE uint8: record_length_bytes SIDE**2
FRAMEWORK = dict(reader__engine="framework", train__computation_time=0.0,
                 reader__sample_shuffle="seed", reader__file_shuffle="seed")


def _config(tmp: Path, **values):
    values = {"dataset__record_length_bytes": SIDE * SIDE, **values}
    return load_config("demo", workload_overrides(tmp, **values))


def _value(sample_id: int) -> int:
    return sample_id % 251 + 1


def _write_dataset(cfg) -> None:
    """The train split as DLIO's names and layout (samples on the last axis), each sample's
    bytes all equal to _value(its id); indexed binary with its two index files."""
    from dlio_mpi.data.dataset import describe_dataset

    split = describe_dataset(cfg)["train"]
    per = split.samples_per_file
    for f in range(split.num_files):
        path = split.path(f)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        samples = [np.full((SIDE, SIDE), _value(f * per + i), dtype=np.uint8)
                   for i in range(per)]
        if split.format.name == "indexed_binary":
            np.concatenate([s.reshape(-1) for s in samples]).tofile(path)
            np.arange(0, per * SIDE * SIDE, SIDE * SIDE, dtype=np.uint64).tofile(
                path + ".off.idx")
            np.full(per, SIDE * SIDE, dtype=np.uint64).tofile(path + ".sz.idx")
        elif split.format.name == "npz":
            np.savez(path, x=np.stack(samples, axis=-1), y=np.zeros(per, dtype=np.uint8))
        else:
            np.save(path, np.stack(samples, axis=-1))


def _files(cfg):
    """The train split's SplitFiles as the run finds DLIO's data: headers probed."""
    from dlio_mpi.data.catalog import SplitFiles, probe_file
    from dlio_mpi.data.dataset import ListedLayouts, describe_dataset

    split = describe_dataset(cfg)["train"]
    probed = [probe_file(cfg, split, i, split.path(i)) for i in range(split.num_files)]
    rel = tuple(os.path.relpath(split.path(i), split.root) for i in range(split.num_files))
    return SplitFiles(split, ListedLayouts.from_layouts([p[0] for p in probed]), "listed",
                      probed[0][1], rel)


def _plan(cfg, files, ids: np.ndarray, batch: int):
    from dlio_mpi.readers import resolve_read_mode
    from dlio_mpi.sampling.requests import AccessPolicy, plan_reads

    fmt = files.split.format
    facts = fmt.loader_facts(files.path(0))
    policy = AccessPolicy("loader", False, 4096, fmt.loader_model(
        facts, 1, files.split.samples_per_file))
    return plan_reads(ids, len(ids) // batch, batch, files.split.samples_per_file,
                      files.layouts, resolve_read_mode(cfg), policy)


def _reader(cfg, files):
    from dlio_mpi.readers import open_reader

    return open_reader(cfg, files)


def _epoch(reader, plan) -> tuple[list[np.ndarray], list]:
    """One epoch through the backend: the batches' contents and BatchStats."""
    reader.prepare_epoch(plan)
    reader.start_epoch(plan)
    contents, stats = [], []
    while (got := reader.next_batch()) is not None:
        contents.append(reader.batch.numpy().copy())
        stats.append(got)
    reader.end_epoch()
    return contents, stats


def _ids_of(contents: list[np.ndarray]) -> list[int]:
    """The sample each item holds (every byte of it says which), checking it is uniform."""
    out = []
    for batch in contents:
        assert batch.shape[1:] == (SIDE, SIDE)
        for item in batch:
            assert (item == item[0, 0]).all()
            out.append(int(item[0, 0]))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_preprocess_time_is_slept_per_sample_by_the_reader(tmp_path, workers):
    """Each sample's draw of reader.preprocess_time is slept after its read, where the item
    is made (this process, or a worker): an epoch takes at least the batches' sums (per
    worker, since workers read batches in parallel); latencies leave it out."""
    import dataclasses
    import time

    cfg = _config(tmp_path, dataset__format="npy", dataset__num_files_train=6,
                  reader__read_threads=workers, reader__batch_size=3, **FRAMEWORK)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        ids = np.arange(6, dtype=np.int64)
        delays = np.full(6, 40_000_000, dtype=np.int64)  # 40 ms a sample, 120 ms a batch
        plan = dataclasses.replace(_plan(cfg, files, ids, 3), sample_delay_ns=delays)
        _epoch(reader, plan)  # the workers started
        start = time.monotonic()
        contents, _ = _epoch(reader, plan)
        elapsed = time.monotonic() - start
        assert _ids_of(contents) == [_value(i) for i in range(6)]
        assert elapsed >= (0.24 if workers == 0 else 0.12)
        assert (reader.lat_ns < 40_000_000).all()
    finally:
        reader.close()


@pytest.mark.parametrize("abort", [False, True])
def test_the_watchdog_reports_a_batch_late_past_its_limit_or_ends_the_wait(tmp_path, capfd,
                                                                          abort):
    """A batch whose reads take longer than reader.io_watchdog_seconds (here: the workers'
    preprocessing, 1.5 s a sample) gets one stderr line naming the rank, the loader and the
    batch's files; with reader.io_watchdog_abort the DataLoader's timeout ends the wait."""
    import dataclasses

    cfg = _config(tmp_path, dataset__format="npy", dataset__num_files_train=4,
                  reader__read_threads=1, reader__batch_size=2,
                  reader__io_watchdog_seconds=0.5, reader__io_watchdog_abort=abort,
                  **FRAMEWORK)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        plan = _plan(cfg, files, np.arange(2, dtype=np.int64), 2)
        plan = dataclasses.replace(plan, sample_delay_ns=np.full(2, 1_500_000_000))
        if abort:
            with pytest.raises(RuntimeError, match="torch DataLoader failed.*timed out"):
                _epoch(reader, plan)
        else:
            contents, _ = _epoch(reader, plan)
            assert _ids_of(contents) == [_value(0), _value(1)]
            err = capfd.readouterr().err
            assert err.count("dlio-mpi: ") == 1
            assert "rank 0: watchdog: the torch DataLoader has waited 0.5 s for batch 0" in err
            assert files.path(0) in err and files.path(1) in err
    finally:
        reader.close()


@pytest.mark.parametrize("values,shape,dtype", [
    ({}, (SIDE, SIDE), np.uint8),  # DLIO's max_dimension: int(sqrt(record length))
    ({"dataset__record_length_bytes_resize": 64}, (8, 8), np.uint8),
    ({"reader__transformed_record_dims": [2, 4],
      "reader__transformed_record_element_type": "float32"}, (2, 4), np.float32),
])
def test_items_take_the_decoded_shape_dlio_hands_over(tmp_path, values, shape, dtype):
    cfg = _config(tmp_path, dataset__format="npy", dataset__num_files_train=6,
                  reader__read_threads=0, reader__batch_size=3, **FRAMEWORK, **values)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        ids = np.arange(6, dtype=np.int64)
        contents, _ = _epoch(reader, _plan(cfg, files, ids, 3))
        assert [batch.shape for batch in contents] == [(3, *shape)] * 2
        for batch, first in zip(contents, (0, 3), strict=True):
            assert batch.dtype == dtype
            for k, item in enumerate(batch):  # the item is the sample's leading bytes
                raw = np.ascontiguousarray(item).view(np.uint8)
                assert (raw == _value(first + k)).all()
        assert reader.describe()["item_shape"] == list(shape)
        assert reader.describe()["item_dtype"] == np.dtype(dtype).str
    finally:
        reader.close()


@pytest.mark.parametrize("fmt,per_file,workers,context", [
    ("npz", 1, 2, "fork"),
    ("npy", 3, 2, "forkserver"),
    ("indexed_binary", 4, 1, "spawn"),
    ("npy", 2, 0, "fork"),
])
def test_each_batch_holds_the_planned_samples_in_order(tmp_path, fmt, per_file, workers,
                                                       context):
    cfg = _config(tmp_path, dataset__format=fmt, dataset__num_files_train=12,
                  dataset__num_samples_per_file=per_file, reader__read_threads=workers,
                  reader__multiprocessing_context=context, reader__batch_size=3, **FRAMEWORK)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        total = 12 * per_file
        for epoch in (1, 2):  # persistent workers: the second epoch's order reaches them
            ids = np.random.default_rng(epoch).permutation(total)[:total // 3 * 3 - 3]
            plan = _plan(cfg, files, ids, 3)
            contents, stats = _epoch(reader, plan)
            assert len(contents) == plan.steps
            assert _ids_of(contents) == [_value(int(i)) for i in ids]
            sizes = {i: os.path.getsize(files.path(i)) for i in range(12)}
            for b, got in enumerate(stats):
                mine = ids[3 * b:3 * b + 3] // per_file
                if fmt == "indexed_binary":  # each sample's extent, and first index reads
                    assert got.bytes_read >= 3 * SIDE * SIDE
                else:  # np.load of the whole file per sample, as DLIO's reader does
                    assert got.bytes_read >= sum(sizes[int(f)] for f in mine)
                    assert got.bytes_read <= sum(sizes[int(f)] for f in mine) + 64 * 1024
                assert got.read_ops >= 3
            assert len(reader.lat_ns) == len(ids) and (reader.lat_ns > 0).all()
        described = reader.describe()
        assert described["backend"] == "framework"
        assert described["workers"] == workers
        assert described["multiprocessing_context"] == (context if workers else None)
        assert described["item_shape"] == [SIDE, SIDE]
        counted = reader.counters()
        samples = 2 * (total // 3 * 3 - 3)
        if fmt == "indexed_binary":  # one open per sample, plus index files once per worker
            assert samples + 2 <= counted["opens"] <= samples + 2 * 12 * max(workers, 1)
        else:
            assert counted["opens"] == counted["closes"] == samples
    finally:
        reader.close()


def test_read_type_memory_loads_each_file_once_per_epoch_in_process(tmp_path):
    cfg = _config(tmp_path, dataset__format="npz", dataset__num_files_train=6,
                  dataset__num_samples_per_file=4, reader__read_threads=0,
                  reader__read_type="memory", reader__batch_size=4, **FRAMEWORK)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        ids = np.random.default_rng(3).permutation(24)[:20]
        for _ in (1, 2):
            contents, _ = _epoch(reader, _plan(cfg, files, ids, 4))
            assert _ids_of(contents) == [_value(int(i)) for i in ids]
        assert reader.counters()["opens"] == 2 * len(np.unique(ids // 4))
        assert "memory" in reader.describe()["reads"]
    finally:
        reader.close()


def test_a_file_lost_after_the_checks_fails_the_epoch_in_one_line_naming_it(tmp_path):
    cfg = _config(tmp_path, dataset__format="npy", dataset__num_files_train=8,
                  reader__read_threads=2, reader__batch_size=2, **FRAMEWORK)
    _write_dataset(cfg)
    files = _files(cfg)
    reader = _reader(cfg, files)
    try:
        os.unlink(files.path(5))
        with pytest.raises(RuntimeError) as info:
            _epoch(reader, _plan(cfg, files, np.arange(8), 2))
        message = str(info.value)
        assert "\n" not in message and message.startswith("the torch DataLoader failed: ")
        assert "No such file or directory" in message and files.path(5) in message
    finally:
        reader.close()


def test_the_plan_says_which_engine_reads_and_notes_the_other_engines_keys():
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.plan.render import describe_plan, plan_record

    cfg = load_config("demo", ["reader.engine=framework", "reader.read_threads=3",
                               "reader.prefetch_size=4", "reader.multiprocessing_context=spawn",
                               "reader.access=lean", "reader.fd_cache_size=8"])
    plan = derive_plan(cfg, 2)
    assert plan.notes[0].startswith(
        "reader.engine=framework: each rank runs a real torch.utils.data.DataLoader (3 worker "
        "process(es) started by spawn (persistent), prefetch_factor 2, pin_memory true")
    assert plan.notes[0].endswith("its Dataset reads npz as DLIO's pytorch reader does: "
                                  "np.load(path)['x'] of the whole file for every sample")
    assert any(n.startswith("reader.access=lean, reader.fd_cache_size=8: no effect with "
                            "reader.engine framework") for n in plan.notes)
    record = plan_record(plan, cfg)
    assert record["engine"] == "framework" and record["file_access"] == "multi"
    assert record["reader"].startswith("engine framework: a real torch.utils.data.DataLoader")
    assert f"reader          {record['reader']}" in describe_plan(plan, cfg)

    native = load_config("demo", ["reader.pin_memory=false",
                                  "reader.multiprocessing_context=forkserver"])
    notes = derive_plan(native, 2).notes
    assert notes[0].endswith("the real torch DataLoader is not run (reader.engine: framework "
                             "runs it)")
    assert any(n.startswith("reader.pin_memory=false, reader.multiprocessing_context="
                            "forkserver: no effect with reader.engine native") for n in notes)
    assert plan_record(derive_plan(native, 2), native)["reader"].startswith(
        "engine native: the native C engine")
    quiet = load_config("demo", ["reader.engine=framework", "reader.pin_memory=false"])
    assert not [n for n in derive_plan(quiet, 2).notes if "no effect" in n]


# --------------------------------------------------------------------------- runs on 2 ranks
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_each_multiprocessing_context_completes_a_two_rank_run(tmp_path, context):
    args = workload_overrides(tmp_path, workflow__generate_data="true",
                              dataset__num_files_train=16, reader__batch_size=2,
                              reader__read_threads=2, reader__engine="framework",
                              reader__multiprocessing_context=context,
                              output__access_log="true")
    res = run_cli(["run", "demo", *args], ranks=2, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "MPI" not in res.stderr, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    described = summary["dlio_mpi"]["readers"]["train"]
    assert described["multiprocessing_context"] == context and described["workers"] == 2
    read = access_logs(tmp_path / "out", (1, 2), 2)
    assert all(len(ids) == 8 for ids in read)
    assert sorted(np.concatenate(read[:2]).tolist()) == list(range(16))


# --------------------------------------------------------------------------- in-process MPI
def _run(tmp: Path, **values):
    return run_in_process(load_config("demo", workload_overrides(tmp, **values)))


@pytest.mark.mpi(min_size=2)
def test_framework_reads_the_ids_the_native_engine_reads(shared_tmp):
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    common = dict(dataset__format="npz", dataset__num_files_train=10 * size,
                  dataset__num_samples_per_file=1, reader__batch_size=2,
                  reader__read_threads=2, reader__sample_shuffle="seed",
                  reader__file_shuffle="seed", train__epochs=2, output__access_log="true",
                  workflow__evaluation="true", dataset__num_files_eval=4 * size)
    # np.load of each whole file: what the workers' reads returned is the np.load model's,
    # plus the module zipfile imports at a worker's first load (a 14 KB .pyc)
    native, framework = reads_as_native(
        _run, shared_tmp, ("epoch1", "epoch2", "eval_epoch1", "eval_epoch2"), common,
        native={}, framework={"reader__engine": "framework"})
    m, n = framework["metric"], native["metric"]
    assert m["train_file_opens"] == n["train_file_opens"] == 2 * 10 * size
    assert m["eval_file_opens"] == n["eval_file_opens"] == 2 * 4 * size
    readers = framework["dlio_mpi"]["readers"]
    assert readers["train"]["backend"] == readers["eval"]["backend"] == "framework"
    assert readers["train"]["loader"] == "torch.utils.data.DataLoader"
    assert readers["train"]["torch"].startswith("2.")
