"""dataset.format parquet: files written through pyarrow (one fixed_size_binary column `data`,
a row a sample, row groups of dataset.parquet.row_group_size rows), laid out where the
computed geometry says without I/O, read by row group (the read unit) by the native engine,
whole by read_mode file and by the framework loaders, through pyarrow."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_loader_fidelity import _calls, _strace

from conftest import mpiexec
from dlio_mpi import _core
from dlio_mpi.config import load_config
from dlio_mpi.data.dataset import describe_dataset
from dlio_mpi.data.generate import file_seed
from dlio_mpi.errors import UserError
from dlio_mpi.formats import SampleSpec, format_for, get_format
from dlio_mpi.formats import parquet as parquet_module
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.parquet import ParquetFormat, ParquetOptions, geometry
from dlio_mpi.plan.derive import derive_plan
from dlio_mpi.sampling.requests import AccessPolicy, plan_reads
from helpers import access_logs, run_cli, workload_overrides, write_one

SEED = 4321


def _write(tmp_path: Path, fmt: ParquetFormat, spec: SampleSpec, name: str = "f.parquet",
           seed: int = SEED) -> Path:
    return write_one(tmp_path / name, fmt, spec, seed)


def _stream(nbytes: int, seed: int = SEED) -> bytes:
    out = np.empty(nbytes, dtype=np.uint8)
    _core.fill_random(out, seed, 0)
    return out.tobytes()


def _metadata_extents(path: Path) -> tuple[list[tuple[int, int]], list[int]]:
    meta = pq.ParquetFile(path).metadata
    chunks = [meta.row_group(g).column(0) for g in range(meta.num_row_groups)]
    return ([(c.data_page_offset, c.total_compressed_size) for c in chunks],
            [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])


# (sample bytes, rows, row group size): groups dividing the rows or not, one row, one group,
# samples whose lengths take 1, 2, 3 and 4 varint bytes in the page headers, pages cut
GEOMETRIES = [(100, 10, 4), (100, 12, 4), (1, 1, 1), (4096, 7, 1048576), (127, 3, 2),
              (128, 300, 7), (16384, 65, 64), (2**21 + 3, 3, 2), (300, 5000, 1000),
              (40000, 100, 30)]


@pytest.mark.parametrize("n,rows,group", GEOMETRIES)
def test_pyarrow_reads_the_rows_we_wrote_where_the_layout_says(tmp_path, n, rows, group):
    fmt = ParquetFormat(ParquetOptions(row_group_size=group))
    spec = SampleSpec((n,), "|u1", rows)
    path = _write(tmp_path, fmt, spec)
    table = pq.read_table(path)
    assert table.num_rows == rows and table.column_names == ["data"]
    assert str(table.schema.field("data").type) == f"fixed_size_binary[{n}]"
    stream = _stream(n * rows)
    samples = table.column("data").to_pylist()
    assert all(samples[i] == stream[i * n:(i + 1) * n] for i in range(rows))
    extents, counts = _metadata_extents(path)
    assert counts == [group] * (rows // group) + ([rows % group] if rows % group else []) \
        if group < rows else counts == [rows]
    units = fmt.unit_extents(spec)
    assert list(zip(units.offset.tolist(), units.length.tolist())) == extents
    assert units.per_unit == min(group, rows) and units.rows(rows).tolist() == counts
    lay = fmt.layout(spec)
    assert lay.size == os.path.getsize(path) and lay.data_offset == extents[0][0] == 4
    data = path.read_bytes()
    meta_len = int.from_bytes(data[-8:-4], "little")
    assert data[-4:] == data[:4] == b"PAR1" and geometry(n, rows, group).metadata == meta_len
    # each group's samples are in its column chunk, in order
    for g, (offset, length) in enumerate(extents):
        chunk = data[offset:offset + length]
        first = g * units.per_unit
        assert stream[first * n:(first + 1) * n] in chunk
        assert stream[(first + counts[g] - 1) * n:(first + counts[g]) * n] in chunk
    array = get_format("parquet").load_whole(str(path))
    assert array.shape == (rows, n) and array.tobytes() == stream


def test_footer_reads_are_the_tail_then_the_whole_metadata_when_longer():
    small = geometry(100, 10, 4)
    assert small.footer_reads() == [(0, small.size)]  # a file under 64 KiB: read whole
    big = geometry(100, 300000, 100)  # 3000 groups: a footer over 64 KiB
    tail = parquet_module.FOOTER_READ
    assert big.metadata + 8 > tail
    assert big.footer_reads() == [(big.size - tail, tail),
                                  (big.size - 8 - big.metadata, big.metadata)]


def test_layout_touches_no_file_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    learned = []
    original = parquet_module._learn_geometry
    monkeypatch.setattr(parquet_module, "_learn_geometry",
                        lambda *key: learned.append(key) or original(*key))
    fmt = ParquetFormat(ParquetOptions(row_group_size=3))
    spec = SampleSpec((50, 51), "|u1", 10)  # a geometry no other test learns
    first = fmt.layout(spec)
    assert fmt.layout(spec) == first and not any(tmp_path.iterdir())
    assert learned == [(50 * 51, 10, 3, ())]  # learned once, then taken from the cache


def test_write_refuses_a_file_pyarrow_laid_out_otherwise(tmp_path, monkeypatch):
    fmt = ParquetFormat(ParquetOptions(row_group_size=4))
    spec = SampleSpec((100,), "|u1", 10)
    geo = geometry(100, 10, 4)
    wrong = parquet_module.Geometry(geo.size, geo.group_rows, (4, 426, 846), geo.length,
                                    geo.metadata)
    monkeypatch.setattr(fmt, "_geometry", lambda spec: wrong)
    staged = StagedWrites("test")
    with pytest.raises(RuntimeError, match="did not lay the file out as dlio-mpi computed"):
        fmt.write(str(tmp_path / "f.parquet"), spec, SEED, staged)
    staged.discard()
    assert not any(tmp_path.iterdir())


def test_probe_takes_our_layout_and_refuses_others(tmp_path):
    import pyarrow as pa

    fmt = ParquetFormat(ParquetOptions(row_group_size=4))
    spec = SampleSpec((100,), "|u1", 10)
    path = _write(tmp_path, fmt, spec)
    stored = fmt.probe(str(path))
    assert stored.shape == (10, 100) and stored.layout(stored.as_samples(10, "first_axis")) \
        == fmt.layout(spec)
    with pytest.raises(ValueError, match="row_group_size=5"):
        ParquetFormat(ParquetOptions(row_group_size=5, samples=10)).probe(str(path))
    listed = tmp_path / "list.parquet"  # DLIO's own writer: a list column, compressed
    pq.write_table(pa.table({"data": [[1, 2, 3]] * 4}), listed)
    with pytest.raises(ValueError, match="one fixed_size_binary column 'data'"):
        fmt.probe(str(listed))
    snappy = tmp_path / "snappy.parquet"
    pq.write_table(pq.read_table(path), snappy, compression="snappy")
    with pytest.raises(ValueError, match="compressed"):
        fmt.probe(str(snappy))


def _cfg(tmp_path, *extra, **values):
    over = workload_overrides(tmp_path, dataset__format="parquet", **values)
    return load_config("demo", [*over, *extra])


def test_codecs_pyarrow_lacks_and_other_sample_layouts_are_refused_naming_the_key(tmp_path):
    for values, key in (({"dataset__compression": "lzf"}, "dataset.compression: 'lzf' is "
                         "not implemented yet in dlio-mpi for parquet"),
                        ({"dataset__sample_layout": "last_axis"}, "dataset.sample_layout")):
        with pytest.raises(UserError, match=key):
            derive_plan(_cfg(tmp_path, **values), 2, generating=True)
    assert not any(tmp_path.iterdir())
    with pytest.raises(UserError, match="dataset.parquet.row_group_size: 1048576 rows"):
        derive_plan(_cfg(tmp_path, dataset__record_length_bytes=1048576,
                         dataset__parquet__row_group_size=1048576,
                         dataset__num_samples_per_file=2000), 2, generating=True)
    for codec in ("snappy", "lz4", "zstd"):  # pyarrow's codecs: parquet's alone
        with pytest.raises(UserError, match=f"dataset.compression: '{codec}' is not accepted"):
            load_config("demo", [f"dataset.compression={codec}"])
    plan = derive_plan(_cfg(tmp_path, dataset__compression="zstd",
                            dataset__record_length_bytes_stdev=100), 2, generating=True)
    assert any("records each file's row groups and footer" in n for n in plan.notes)


def test_parquet_keys_act_for_parquet_and_are_noted_for_other_formats(tmp_path):
    plan = derive_plan(_cfg(tmp_path, "dataset.parquet.row_group_size=3",
                            "dataset.num_samples_per_file=8"), 2)
    assert not [n for n in plan.notes if "no effect" in n], plan.notes
    assert plan.read_mode == "sample"
    assert "reads parquet by row group (3 rows: 3 in each file of 8 samples)" in plan.notes[0]
    npy = load_config("demo", [*workload_overrides(tmp_path, dataset__format="npy"),
                               "dataset.parquet.row_group_size=3"])
    notes = [n for n in derive_plan(npy, 2).notes if "no effect" in n]
    assert notes == ["dataset.parquet.row_group_size=3: accepted, has no effect in dlio-mpi "
                     "because dataset.format is not parquet (they shape parquet files only)"]


def _split(tmp_path, group: int, samples: int):
    cfg = _cfg(tmp_path, f"dataset.parquet.row_group_size={group}",
               f"dataset.num_samples_per_file={samples}")
    return cfg, describe_dataset(cfg)["train"]


def test_sample_mode_reads_each_needed_row_group_once_after_the_footer(tmp_path):
    cfg, split = _split(tmp_path, 3, 10)  # groups of 3, 3, 3, 1 rows
    layouts = split.expected_layouts()
    units = layouts.units()
    footer = geometry(4096, 10, 3).footer_reads()
    ids = np.array([0, 1, 9, 4, 12, 2, 5, 13, 3, 40, 41, 42], dtype=np.int64)
    plan = plan_reads(ids, 3, 4, 10, layouts, "sample", AccessPolicy("loader"))
    # step 0: file 0's footer, groups 0, 3, 1; step 1: file 1's footer, groups 0 and 1 (2
    # and 5 are in file 0's groups read already); step 2: 3 too, file 4's footer and group 0
    g = list(zip(units.offset.tolist(), units.length.tolist()))
    want = [(0, *footer[0]), (0, *g[0]), (0, *g[3]), (0, *g[1]),
            (1, *footer[0]), (1, *g[0]), (1, *g[1]),
            (4, *footer[0]), (4, *g[0])]
    got = list(zip(plan.file_idx.tolist(), plan.offset.tolist(), plan.length.tolist()))
    assert got == want
    assert plan.batch_start.tolist() == [0, 4, 7, 9]
    assert (plan.flags[[0, 4, 7]] == _core.REQ_FSTAT).all() and plan.flags.sum() == 3 * 4
    n = 4096
    assert plan.batch_payload.tolist() == [(3 + 1 + 3) * n, (3 + 3) * n, 3 * n]
    lean = plan_reads(ids, 3, 4, 10, layouts, "sample", AccessPolicy("lean"))
    assert lean.length.tolist() == [g[0][1], g[3][1], g[1][1], g[0][1], g[1][1], g[0][1]]
    assert not lean.flags.any()
    delays = np.arange(1, 13, dtype=np.int64)
    timed = plan_reads(ids, 3, 4, 10, layouts, "sample", AccessPolicy("lean"), delays)
    # each group's read carries its samples' delays (group 0 of file 0: ids 0, 1, 2)
    assert timed.delay_ns.tolist() == [1 + 2 + 6, 3, 4 + 7 + 9, 5, 8, 10 + 11 + 12]


def test_file_mode_is_read_table_of_the_whole_file(tmp_path):
    cfg, split = _split(tmp_path, 3, 10)
    layouts = split.expected_layouts()
    fmt = split.format
    policy = AccessPolicy("loader", format_reads=fmt.loader_model(None, 1, 10))
    ids = np.array([0, 1, 12, 13], dtype=np.int64)
    plan = plan_reads(ids, 2, 2, 10, layouts, "file", policy)
    geo = geometry(4096, 10, 3)
    end = geo.offset[-1] + geo.length[-1]
    one = [(*geo.footer_reads()[0],), (4, end - 4)]  # all chunks in one coalesced read
    assert list(zip(plan.offset.tolist(), plan.length.tolist())) == one * 4
    open_close = _core.REQ_OPEN | _core.REQ_FSTAT | _core.REQ_CLOSE
    assert plan.flags.tolist() == [open_close] * 8
    assert plan.batch_payload.tolist() == [2 * 10 * 4096] * 2
    big = geometry(300000, 400, 30)  # 9 MB groups: reads of 3 groups (32 MiB at most)
    reads = parquet_module.ReadTables(30, 400).reads_of(300000)
    assert reads[1].tolist()[1:] == [3 * big.length[0]] * 4 + [big.length[-1] + big.length[0]]


def test_planned_bytes_of_an_epoch_count_groups_and_footers(tmp_path):
    cfg = _cfg(tmp_path, "dataset.parquet.row_group_size=3", "dataset.num_samples_per_file=10")
    plan = derive_plan(cfg, 2)
    geo = geometry(4096, 10, 3)
    per_file = sum(geo.length) + sum(length for _, length in geo.footer_reads())
    assert plan.bytes_per_epoch == per_file * 8 * plan.samples_per_rank * 2 // 80


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("mode", ["file_once", "file"])
def test_two_ranks_generate_and_train_reading_whole_files(tmp_path, mode):
    over = workload_overrides(tmp_path, dataset__format="parquet",
                              dataset__num_samples_per_file=4, reader__read_mode=mode,
                              dataset__parquet__row_group_size=3, output__access_log="true")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    metric = _summary(tmp_path / "out")["metric"]
    geo = geometry(4096, 4, 3)
    per_file = sum(length for _, length in geo.footer_reads()) + sum(geo.length)
    # file_once: every rank loads each file its samples are in once an epoch; file: once
    # for every sample (pq.read_table, DLIO's reader on_demand)
    logs = access_logs(tmp_path / "out", [1, 2], 2)
    loads = sum(len(np.unique(ids // 4)) if mode == "file_once" else len(ids) for ids in logs)
    assert metric["train_bytes_transferred"] == metric["train_bytes_requested"] \
        == loads * per_file
    assert metric["train_bytes_read"] == loads * 4 * 4096
    assert metric["train_requests"] == loads * 2  # the footer's access, the chunks'
    files = sorted((tmp_path / "data" / "train").iterdir())
    assert [p.name for p in files] == [f"img_{i}_of_8.parquet" for i in range(8)]
    table = pq.read_table(files[5])
    assert table.column("data")[2].as_py() == _stream(4 * 4096, file_seed("train", 5))[
        2 * 4096:3 * 4096]
    mtimes = [p.stat().st_mtime_ns for p in files]
    again = run_cli(["generate", "demo", *over])  # every file looked at: all as computed
    assert again.returncode == 0 and "0 files" in again.stdout and "8 already complete" \
        in again.stdout, again.stdout + again.stderr
    assert [p.stat().st_mtime_ns for p in files] == mtimes


def _ids_by_engine(tmp_path: Path, base: dict) -> tuple[dict[str, list], dict]:
    """The demo workload run with `base` by the native and the framework engine: each run's
    sample ids per rank (access logs, epoch 1), after checking it read parquet with it; and
    the framework run's summary."""
    ids = {}
    for engine in ("native", "framework"):
        out = tmp_path / engine
        over = workload_overrides(tmp_path, **base, reader__engine=engine,
                                  output__folder=str(out))
        res = run_cli(["run", "demo", *over], timeout=300)
        assert res.returncode == 0, res.stderr
        ids[engine] = access_logs(str(out), [1], 2)
        summary = _summary(out)
        assert summary["dlio_mpi"]["format"] == "parquet"
        assert summary["dlio_mpi"]["readers"]["train"]["backend"] == engine
    return ids, summary


@pytest.mark.parametrize("loader", ["pytorch", "tensorflow"])
def test_framework_loaders_read_the_same_samples_as_the_native_engine(tmp_path, loader):
    base = dict(dataset__format="parquet", dataset__num_samples_per_file=4,
                dataset__parquet__row_group_size=3, output__access_log="true",
                reader__data_loader=loader, framework=loader,
                reader__sample_shuffle="seed", reader__read_threads=1, train__epochs=1)
    ids, summary = _ids_by_engine(tmp_path, base)
    assert summary["dlio_mpi"]["read_mode"] == ("file_once" if loader == "tensorflow" else "file")
    assert "pq.read_table(path)" in summary["dlio_mpi"]["readers"]["train"]["reads"]
    assert all(np.array_equal(a, b) for a, b in zip(ids["native"], ids["framework"]))
    assert sorted(np.concatenate(ids["native"]).tolist()) == list(range(32))


def test_format_is_registered_with_its_extension():
    fmt = get_format("parquet")
    assert fmt.extension == "parquet" and isinstance(fmt, ParquetFormat)
    cfg = load_config("demo", ["dataset.format=parquet", "dataset.parquet.row_group_size=7",
                               "dataset.record_length_bytes_stdev=0"])
    assert format_for(cfg.dataset).options.row_group_size == 7
    for other in ("npy", "tfrecord", "hdf5"):  # affine extents: no units, the plan unchanged
        table = describe_dataset(load_config("demo", [f"dataset.format={other}"]))["train"] \
            .expected_layouts()
        assert not table.ragged and table.units() is None


# ------------------------------------------------------------------ against strace of pyarrow

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


def _reads_under_strace(tmp_path, over: list[str], script: str) -> tuple[dict, dict]:
    """The opens, preads and fstats a 1-rank run makes on the training files, and those of
    `script` (pyarrow reading them), each under strace."""
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    train = str(tmp_path / "data" / "train")
    logs = _strace([mpiexec(), "-n", "1", sys.executable, "-P", "-m", "dlio_mpi", "run",
                    "demo", *over, "workflow.generate_data=false"], tmp_path / "run")
    ref = _strace([sys.executable, "-c", script.replace("TRAIN", train)], tmp_path / "ref")
    return _calls(logs, train), _calls(ref, train)


@needs_strace
@pytest.mark.timeout(180)
def test_row_group_reads_are_pyarrows_read_row_group(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__num_files_train=4,
                              dataset__num_samples_per_file=6, dataset__parquet__row_group_size=4,
                              dataset__record_length_bytes=40000, reader__read_threads=1,
                              train__epochs=1)
    ours, ref = _reads_under_strace(tmp_path, over, (
        "import glob, pyarrow.parquet as pq\n"
        "for p in sorted(glob.glob('TRAIN/*.parquet')):\n"
        "    f = pq.ParquetFile(p)\n"
        "    for g in range(f.metadata.num_row_groups): f.read_row_group(g)\n"))
    assert ref["opens"] == 4 and ref["preads"] == 4 * 3, ref  # the tail, two groups a file
    assert ours["opens"] == ref["opens"], (ours, ref)
    assert (ours["preads"], ours["pread_bytes"]) == (ref["preads"], ref["pread_bytes"])
    # pyarrow fstats twice a file it opens (the reference's count has glob's of the folder)
    assert ours["fstats"] == 2 * ref["opens"] and ref["fstats"] >= ours["fstats"], (ours, ref)


@needs_strace
@pytest.mark.timeout(180)
def test_whole_file_reads_are_pyarrows_read_table(tmp_path):
    # 12 rows of about 3 MB in groups of 1: read_table coalesces them into reads of 32 MiB
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__num_files_train=2,
                              dataset__num_samples_per_file=12,
                              dataset__parquet__row_group_size=1,
                              dataset__record_length_bytes=3_000_000, reader__read_threads=1,
                              reader__read_mode="file_once", train__epochs=1)
    ours, ref = _reads_under_strace(tmp_path, over, (
        "import glob, pyarrow.parquet as pq\n"
        "for p in sorted(glob.glob('TRAIN/*.parquet')): pq.read_table(p)\n"))
    assert ref["opens"] == 2 * 2 and ref["preads"] == 2 * 3, ref  # footer; chunks in 2 reads
    assert ours["opens"] == ref["opens"], (ours, ref)
    assert (ours["preads"], ours["pread_bytes"]) == (ref["preads"], ref["pread_bytes"])
    assert ours["fstats"] == 2 * ref["opens"] and ref["fstats"] >= ours["fstats"], (ours, ref)


def test_manifest_records_the_row_group_size_and_pyarrows_version(tmp_path):
    import pyarrow

    from dlio_mpi.data.manifest import generation_params

    params = generation_params(_cfg(tmp_path, dataset__parquet__row_group_size=5))
    assert params["parquet"] == {"row_group_size": 5, "compression": "none",
                                 "generation_batch_size": 0, "columns": [],
                                 "pyarrow": pyarrow.__version__}
    # what shapes the files changes the parameters (a dataset made before is made again)
    batch = generation_params(_cfg(tmp_path, dataset__parquet__row_group_size=5,
                                   dataset__parquet__generation_batch_size=2))
    assert batch["parquet"]["generation_batch_size"] == 2
    typed = generation_params(_cfg(tmp_path, "dataset.parquet.columns=[{name: a, dtype: int8, "
                                   "size: 3, read: false}]"))
    assert typed["parquet"]["columns"] == [["a", "int8", 3]]
    assert "parquet" not in generation_params(load_config("demo", []))


# ------------------------------------------ compressed files, files of varying sample sizes

RECORDED = [("snappy", 0), ("gzip", 0), ("lz4", 0), ("zstd", 0), ("none", 1000),
            ("zstd", 1000)]


def _recorded_format(codec: str, group: int, samples: int) -> ParquetFormat:
    return ParquetFormat(ParquetOptions(group, codec, True, samples))


def _metadata_row(path: Path) -> list[int]:
    """What the record should say of the file at `path`, from pyarrow and its last bytes."""
    meta = pq.ParquetFile(path).metadata
    data = path.read_bytes()
    extents, _ = _metadata_extents(path)
    return [len(data), meta.schema.column(0).length, int.from_bytes(data[-8:-4], "little"),
            *(o for o, _ in extents), *(n for _, n in extents)]


@pytest.mark.parametrize("codec", ["snappy", "gzip", "lz4", "zstd", "none"])
def test_recorded_files_are_written_with_the_codec_and_recorded_as_pyarrow_reports(tmp_path,
                                                                                   codec):
    fmt = _recorded_format(codec, 3, 10)
    spec = SampleSpec((700,), "|u1", 10)
    staged = StagedWrites("test")
    row = fmt.write_recorded(str(tmp_path / "f.parquet"), spec, SEED, staged)
    staged.commit()
    path = tmp_path / "f.parquet"
    assert len(row) == fmt.record_width == 3 + 2 * 4
    assert row.tolist() == _metadata_row(path) == fmt.probe_record(str(path)).tolist()
    meta = pq.ParquetFile(path).metadata
    assert {meta.row_group(g).column(0).compression for g in range(4)} == {
        "UNCOMPRESSED" if codec == "none" else codec.upper()}
    assert get_format("parquet").load_whole(str(path)).tobytes() == _stream(7000)
    units = fmt.recorded_units(row[None, :])
    assert units.per_file and units.per_unit == 3 and units.sample_bytes.tolist() == [700]
    assert units.open_length.tolist() == [[row[0], 0]]  # a small file: its tail is all of it
    stored = fmt.probe(str(path))
    assert stored.shape == (10, 700) and stored.size == row[0]
    with pytest.raises(ValueError, match="row groups of"):
        _recorded_format(codec, 4, 10).probe_record(str(path))


def test_recorded_footer_reads_add_the_metadata_when_over_the_tail():
    fmt = _recorded_format("zstd", 1, 2)
    rows = np.array([[100000, 10, 70000, 4, 500, 496, 500],
                     [5000, 10, 300, 4, 2000, 2000, 2000]], dtype=np.int64)
    units = fmt.recorded_units(rows)
    tail = parquet_module.FOOTER_READ
    assert units.open_offset.tolist() == [[100000 - tail, 100000 - 8 - 70000], [0, 0]]
    assert units.open_length.tolist() == [[tail, 70000], [5000, 0]]
    assert units.total(2) == 496 + 500 + tail + 70000 + 4000 + 5000


def _record_of_run(tmp_path: Path, split: str = "train") -> np.ndarray:
    return np.load(tmp_path / "data" / f"dlio_mpi_sizes_{split}.npy")


def _unit_bytes(record: np.ndarray, ids: np.ndarray, samples: int, group: int) -> int:
    """Bytes of one rank's epoch read by row group: the footer of each file its samples are
    in, and each row group they live in once."""
    groups = (record.shape[1] - 3) // 2
    total = 0
    for f in np.unique(ids // samples):
        size, meta = record[f, 0], record[f, 2]
        tail = min(size, parquet_module.FOOTER_READ)
        total += tail + (meta if meta + 8 > tail else 0)
    for key in np.unique(ids // samples * groups + ids % samples // group):
        total += record[key // groups, 3 + groups + key % groups]
    return int(total)


@pytest.mark.parametrize("codec,stdev", RECORDED)
def test_recorded_runs_read_the_recorded_row_groups_and_regenerate_nothing(tmp_path, codec,
                                                                          stdev):
    samples, group = 5, 2
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__compression=codec,
                              dataset__record_length_bytes_stdev=stdev,
                              dataset__num_samples_per_file=samples,
                              dataset__parquet__row_group_size=group, dataset__num_files_eval=2,
                              output__access_log="true", reader__sample_shuffle="seed")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    record = _record_of_run(tmp_path)
    files = sorted((tmp_path / "data" / "train").iterdir())
    assert record.shape == (8, 3 + 2 * 3)
    assert [_metadata_row(p) for p in files] == record.tolist()
    assert [_metadata_row(p) for p in sorted((tmp_path / "data" / "valid").iterdir())] == \
        _record_of_run(tmp_path, "valid").tolist()
    if stdev:
        assert len(set(record[:, 1].tolist())) > 1  # samples of several sizes
    logs = access_logs(tmp_path / "out", [1, 2], 2)
    metric = _summary(tmp_path / "out")["metric"]
    want = sum(_unit_bytes(record, ids, samples, group) for ids in logs)
    assert metric["train_bytes_transferred"] == metric["train_bytes_requested"] == want
    manifest = json.loads((tmp_path / "data" / "dlio_mpi_manifest.json").read_text())
    assert manifest["sizes"] == {"train": "dlio_mpi_sizes_train.npy",
                                 "valid": "dlio_mpi_sizes_valid.npy"}
    assert manifest["bytes"]["train"] == int(record[:, 0].sum())
    mtimes = [p.stat().st_mtime_ns for p in files]
    again = run_cli(["generate", "demo", *over])
    assert again.returncode == 0 and "0 files" in again.stdout and "10 already complete" \
        in again.stdout, again.stdout + again.stderr
    assert [p.stat().st_mtime_ns for p in files] == mtimes
    assert _record_of_run(tmp_path).tolist() == record.tolist()


def test_recorded_whole_file_reads_are_read_table_of_each_file(tmp_path):
    samples, group = 6, 2
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__compression="gzip",
                              dataset__record_length_bytes_stdev=1000,
                              dataset__num_samples_per_file=samples,
                              dataset__parquet__row_group_size=group,
                              reader__read_mode="file_once", output__access_log="true")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    record = _record_of_run(tmp_path)
    per_file = []
    for row in record:  # the footer's read, then every chunk (under 32 MiB: one read)
        size, meta = row[0], row[2]
        tail = min(size, parquet_module.FOOTER_READ)
        per_file.append(tail + (meta if meta + 8 > tail else 0) + row[3 + 3:].sum())
    logs = access_logs(tmp_path / "out", [1, 2], 2)
    metric = _summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == sum(
        sum(per_file[f] for f in np.unique(ids // samples)) for ids in logs)
    assert metric["train_bytes_read"] == sum(
        sum(int(record[f, 1]) * samples for f in np.unique(ids // samples)) for ids in logs)


def test_data_another_tool_wrote_compressed_is_probed_file_by_file(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__compression="snappy",
                              dataset__num_samples_per_file=4,
                              dataset__parquet__row_group_size=3, output__access_log="true")
    assert run_cli(["generate", "demo", *over]).returncode == 0
    record = _record_of_run(tmp_path)
    for name in ("dlio_mpi_manifest.json", "dlio_mpi_sizes_train.npy",
                 "dlio_mpi_sizes_valid.npy"):
        (tmp_path / "data" / name).unlink()
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false"])
    assert res.returncode == 0, res.stderr
    logs = access_logs(tmp_path / "out", [1, 2], 2)
    metric = _summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == sum(_unit_bytes(record, ids, 4, 3)
                                                    for ids in logs)
    other = tmp_path / "data" / "train" / "img_3_of_8.parquet"  # row groups of 2 rows
    pq.write_table(pq.read_table(other), other, row_group_size=2, compression="snappy",
                   use_dictionary=False, write_statistics=False)
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false"])
    assert res.returncode == 2 and "img_3_of_8.parquet" in res.stderr \
        and "row_group_size=3" in res.stderr, res.stderr


def test_framework_loader_reads_the_same_samples_of_recorded_files(tmp_path):
    base = dict(dataset__format="parquet", dataset__num_samples_per_file=4,
                dataset__compression="zstd", dataset__record_length_bytes_stdev=500,
                dataset__parquet__row_group_size=3, output__access_log="true",
                reader__data_loader="pytorch", framework="pytorch",
                reader__sample_shuffle="seed", reader__read_threads=1, train__epochs=1)
    ids, _ = _ids_by_engine(tmp_path, base)
    assert all(np.array_equal(a, b) for a, b in zip(ids["native"], ids["framework"]))
    assert sorted(np.concatenate(ids["native"]).tolist()) == list(range(32))


def test_a_generation_that_lost_its_record_reads_the_files_found_and_writes_the_rest(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="parquet", dataset__compression="lz4",
                              dataset__record_length_bytes_stdev=700,
                              dataset__num_samples_per_file=3,
                              dataset__parquet__row_group_size=2)
    assert run_cli(["generate", "demo", *over]).returncode == 0
    record = _record_of_run(tmp_path)
    (tmp_path / "data" / "dlio_mpi_sizes_train.npy").unlink()  # as if it never got written
    lost = tmp_path / "data" / "train" / "img_6_of_8.parquet"
    lost.unlink()
    again = run_cli(["generate", "demo", *over])
    assert again.returncode == 0 and "1 files" in again.stdout and "7 already complete" \
        in again.stdout, again.stdout + again.stderr
    assert _record_of_run(tmp_path).tolist() == record.tolist() == [
        _metadata_row(p) for p in sorted((tmp_path / "data" / "train").iterdir())]


def test_uncompressed_data_laid_out_otherwise_is_read_by_its_own_row_groups(tmp_path):
    over = workload_overrides(tmp_path, dataset__format="parquet",
                              dataset__num_samples_per_file=4,
                              dataset__parquet__row_group_size=3, output__access_log="true")
    assert run_cli(["generate", "demo", *over]).returncode == 0
    (tmp_path / "data" / "dlio_mpi_manifest.json").unlink()
    for path in sorted((tmp_path / "data" / "train").iterdir())[::3]:  # pages of 1 row
        pq.write_table(pq.read_table(path), path, row_group_size=3, compression="none",
                       use_dictionary=False, write_statistics=False, data_page_size=1,
                       write_batch_size=1)
    files = sorted((tmp_path / "data" / "train").iterdir())
    rows = np.array([_metadata_row(p) for p in files], dtype=np.int64)
    assert len({r[0] for r in rows.tolist()}) == 2  # two layouts
    res = run_cli(["run", "demo", *over, "workflow.generate_data=false"])
    assert res.returncode == 0, res.stderr
    logs = access_logs(tmp_path / "out", [1, 2], 2)
    metric = _summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == sum(_unit_bytes(rows, ids, 4, 3)
                                                    for ids in logs)
