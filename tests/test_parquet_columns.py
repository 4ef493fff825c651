"""dataset.parquet as MLPerf Storage's 2026 workload files write it (columns of typed values,
read_mode, row_group_size, generation_batch_size, use_s3dlio_gen), with the meanings of
MLPerf's DLIO fork: files laid out with its schema, training reading only the chunks of the
columns marked read."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_loader_fidelity import _calls, _strace

from conftest import mpiexec
from dlio_mpi.config import load_config
from dlio_mpi.errors import ConfigError, UserError
from dlio_mpi.formats import format_for
from dlio_mpi.plan.derive import derive_plan
from helpers import run_cli, workload_overrides

PREAD = re.compile(r'^pread64\(\d+<([^>]*)>, ".*"(?:\.\.\.)?, (\d+), (\d+)\)\s+=\s+\d+')
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")

# seven columns of every kind the fork writes: scalars, fixed-size lists, a bool; four read
COLUMNS = ("[{name: label, dtype: float32},"
           " {name: dense, dtype: float16, size: 13, read: false},"
           " {name: sparse, dtype: int64, size: 4}, {name: flags, dtype: bool, read: false},"
           " {name: small, dtype: uint8, size: 5},"
           " {name: pair, dtype: int16, size: 2, read: false},"
           " {name: wide, dtype: float64, size: 3}]")
ROW_BYTES = 4 + 26 + 32 + 1 + 5 + 4 + 24
READ_BYTES = 4 + 32 + 5 + 24
READ = ["label", "sparse", "small", "wide"]
ARROW = pa.schema([pa.field("label", pa.float32()),
                   pa.field("dense", pa.list_(pa.float16(), 13)),
                   pa.field("sparse", pa.list_(pa.int64(), 4)), pa.field("flags", pa.bool_()),
                   pa.field("small", pa.list_(pa.uint8(), 5)),
                   pa.field("pair", pa.list_(pa.int16(), 2)),
                   pa.field("wide", pa.list_(pa.float64(), 3))])


def _over(tmp_path, *extra: str, columns: str | None = COLUMNS, **values) -> list[str]:
    base = dict(dataset__format="parquet", dataset__num_files_train=4,
                dataset__num_samples_per_file=10, dataset__parquet__row_group_size=4,
                dataset__record_length_bytes=512, reader__batch_size=5)
    return [*workload_overrides(tmp_path, **{**base, **values}),
            *([f"dataset.parquet.columns={columns}"] if columns else []), *extra]


def test_columns_are_read_with_the_forks_defaults_and_decide_the_sample(tmp_path):
    cfg = load_config("demo", _over(tmp_path))
    columns = cfg.dataset.parquet.columns
    assert [c.name for c in columns] == ["label", "dense", "sparse", "flags", "small", "pair",
                                         "wide"]
    assert (columns[0].dtype, columns[0].size, columns[0].read) == ("float32", 1, True)
    assert [c.name for c in columns if c.read] == READ
    # the row's bytes are the sample, whatever record_length_bytes says (512 here)
    assert cfg.dataset.record_dims == (ROW_BYTES,)
    assert cfg.dataset.record_length_bytes == 512
    default = load_config("demo", workload_overrides(tmp_path, dataset__format="parquet"))
    assert default.dataset.parquet.row_group_size == 1024  # the fork's
    assert default.dataset.parquet.read_mode == "default"
    assert default.dataset.parquet.columns == ()
    notes = derive_plan(cfg, 2).notes
    assert any(f"a sample is a row of 7 columns, {ROW_BYTES} bytes of values; "
               "dataset.record_length_bytes=512 has no effect" in n and
               f"training reads 4 of them, {READ_BYTES} bytes a sample" in n for n in notes), notes
    s3dlio = derive_plan(load_config("demo", _over(tmp_path, "dataset.parquet.use_s3dlio_gen="
                                                   "true")), 2).notes
    assert any(n.startswith("dataset.parquet.use_s3dlio_gen=true: accepted, has no effect")
               for n in s3dlio), s3dlio


@pytest.mark.parametrize("override, message", [
    ("dataset.parquet.read_mode=sample", "dataset.parquet.read_mode: 'sample' is not accepted; "
                                         "expected one of: default, row_group"),
    ("dataset.parquet.columns=[{name: a, dtype: complex64}]",
     r"dataset.parquet.columns\[0\].dtype: 'complex64' is not accepted; expected one of: "
     r"float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, "
     r"bool \(string, binary, list: not implemented yet in dlio-mpi\)$"),
    ("dataset.parquet.columns=[{name: a, dtype: string}]",
     r"dataset.parquet.columns\[0\].dtype: 'string' is not implemented yet in dlio-mpi; "
     "accepted: float16"),
    ("dataset.parquet.columns=[{name: a, kind: x}]",
     r"unknown key 'dataset.parquet.columns\[0\].kind'; accepted in dataset.parquet.columns\[0\]: "
     "name, dtype, size, read"),
    ("dataset.parquet.columns=[{name: a}, {name: a}]",
     r"dataset.parquet.columns\[1\].name: 'a' is named twice"),
    ("dataset.parquet.columns=[{name: a, size: 0}]",
     r"dataset.parquet.columns\[0\].size: expected an integer >= 1"),
    ("dataset.parquet.columns=[{name: a, dtype: bool, size: 2}]",
     r"dataset.parquet.columns\[0\].size: bool columns hold one value a row"),
    ("dataset.parquet.columns=[{name: a, read: maybe}]",
     r"dataset.parquet.columns\[0\].read: expected true or false"),
    ("dataset.parquet.columns={name: a}", "dataset.parquet.columns: expected a list of columns"),
    ("dataset.parquet.generation_batch_size=6",
     "dataset.parquet.generation_batch_size: 6 rows a batch cut row groups of 4 rows unevenly"),
])
def test_values_the_fork_does_not_take_are_refused_naming_the_key(tmp_path, override, message):
    with pytest.raises(UserError, match=message):
        columns = None if override.startswith("dataset.parquet.columns") else COLUMNS
        derive_plan(load_config("demo", _over(tmp_path, override, columns=columns)), 2,
                    generating=True)
    assert not any(tmp_path.iterdir())


def test_refusals_come_before_any_io_with_exit_status_2(tmp_path):
    res = run_cli(["validate", "demo", *_over(tmp_path), "dataset.parquet.read_mode=file"],
                  ranks=1)
    assert res.returncode == 2, res.stderr
    assert "dataset.parquet.read_mode: 'file' is not accepted; expected one of: default, " \
        "row_group" in res.stderr
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="dataset.parquet.read_mode"):
        load_config("demo", _over(tmp_path, "dataset.parquet.read_mode=file"))


@needs_strace
@pytest.mark.timeout(240)
@pytest.mark.parametrize("codec", ["snappy", "zstd"])
def test_compressed_columns_are_recorded_and_their_chunks_read_as_pyarrow_does(tmp_path,
                                                                              codec):
    over = _over(tmp_path, dataset__num_samples_per_file=4000, dataset__num_files_train=2,
                 dataset__parquet__row_group_size=1000, dataset__compression=codec,
                 reader__read_threads=1, reader__batch_size=100, train__epochs=1)
    assert run_cli(["generate", "demo", *over], ranks=2).returncode == 0
    train = tmp_path / "data" / "train"
    meta = pq.ParquetFile(next(train.iterdir())).metadata
    assert meta.row_group(0).column(0).compression == codec.upper()
    logs = _strace_run(over, tmp_path / "run")
    ref = _preads(_pyarrow_row_groups(train, tmp_path / "ref"), str(train))
    # generation recorded where each chunk went: no footer read before training
    assert _preads(logs, str(train)) == ref and sum(ref.values()) > 2 * (1 + 4)


def test_generation_writes_every_column_with_its_type_in_row_groups(tmp_path):
    res = run_cli(["generate", "demo", *_over(tmp_path)], ranks=2)
    assert res.returncode == 0, res.stderr
    files = sorted((tmp_path / "data" / "train").glob("*.parquet"))
    assert len(files) == 4
    for path in files:
        pf = pq.ParquetFile(path)
        assert pf.schema_arrow.equals(ARROW), pf.schema_arrow
        meta = pf.metadata
        assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [4, 4, 2]
        table = pf.read()
        assert table.num_rows == 10
        assert len(table.column("dense")[0]) == 13
    # the samples differ from file to file
    first = [pq.read_table(p, columns=["wide"]).column(0).to_pylist() for p in files[:2]]
    assert first[0] != first[1]
    # the framework loaders' load: the read columns' values of each row, side by side
    rows = format_for(load_config("demo", _over(tmp_path)).dataset).load_whole(str(files[1]))
    assert rows.shape == (10, READ_BYTES) and rows.dtype == np.uint8
    table = pq.read_table(files[1])
    row = b"".join(np.asarray(table.column(name)[3].as_py(),
                              dtype=ARROW.field(name).type.value_type.to_pandas_dtype()
                              if name != "label" else np.float32).tobytes() for name in READ)
    assert rows[3].tobytes() == row


def test_generation_batches_shorter_than_a_row_group_cut_the_groups(tmp_path):
    # the fork hands each batch to one write_table call, which starts row groups of its own
    over = _over(tmp_path, dataset__parquet__generation_batch_size=3,
                 dataset__num_files_train=1)
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    meta = pq.ParquetFile(next((tmp_path / "data" / "train").glob("*.parquet"))).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [3, 3, 3, 1]


def _chunks(path, names: list[str]) -> list[tuple[int, int]]:
    """(offset, length) of the column chunks of the columns `names`, every row group."""
    meta = pq.ParquetFile(path).metadata
    paths = [meta.schema.column(c).path.split(".")[0] for c in range(meta.num_columns)]
    return [(meta.row_group(g).column(c).data_page_offset,
             meta.row_group(g).column(c).total_compressed_size)
            for g in range(meta.num_row_groups) for c in range(meta.num_columns)
            if paths[c] in names]


def test_training_reads_only_the_chunks_of_the_columns_read(tmp_path):
    over = _over(tmp_path, dataset__num_samples_per_file=2000, dataset__parquet__row_group_size=500,
                 reader__batch_size=100, train__epochs=1, reader__sample_shuffle="off",
                 reader__file_shuffle="off")  # each rank its own files: each group read once
    res = run_cli(["run", "demo", *over], ranks=2)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["metric"]
    samples = 4 * 2000
    # what the samples deliver: their read columns' values (MLPerf's dlrm: 160 of 761 bytes)
    assert summary["train_bytes_read"] == samples * READ_BYTES
    files = sorted((tmp_path / "data" / "train").glob("*.parquet"))
    assert all(p.stat().st_size > 64 << 10 for p in files)
    chunks = sum(n for p in files for _, n in _chunks(p, READ))
    # the bytes storage returned: those chunks, the unread chunks under Arrow's 8 KiB hole
    # between them, read with them ('flags', 500 bits; 'pair', 500 pairs stored as INT32),
    # and each file's footer once (its tail)
    holes = sum(n for p in files for _, n in _chunks(p, ["flags", "pair"]))
    assert summary["train_bytes_transferred"] == chunks + holes + len(files) * (64 << 10)
    assert summary["train_requests"] == len(files) * (1 + 4 * 2)
    every = sum(pq.ParquetFile(p).metadata.row_group(g).total_byte_size for p in files
                for g in range(pq.ParquetFile(p).metadata.num_row_groups))
    assert chunks < 0.8 * every


@needs_strace
@pytest.mark.timeout(240)
def test_column_chunk_reads_match_pyarrow_reading_the_same_columns(tmp_path):
    over = _over(tmp_path, dataset__num_samples_per_file=4000, dataset__num_files_train=2,
                 dataset__parquet__row_group_size=1000, reader__read_threads=1,
                 reader__batch_size=100, train__epochs=1)
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    train = str(tmp_path / "data" / "train")
    logs = _strace_run(over, tmp_path / "run")
    ref = _calls(_pyarrow_row_groups(train, tmp_path / "ref"), train)
    ours = _calls(logs, train)
    # the tail, then a group's chunks in 3 reads: label; sparse, flags and small; wide
    assert ref["reads"] == 2 * (1 + 4 * 3), ref
    assert ours["preads"] == pytest.approx(ref["reads"], rel=0.05), (ours, ref)
    assert ours["pread_bytes"] == pytest.approx(ref["bytes"], rel=0.05), (ours, ref)


def _fork_files(folder, files: int, rows: int, group: int) -> None:
    """Files as MLPerf's fork writes them: random values, pyarrow's defaults (dictionary
    pages, statistics), row groups of `group` rows."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)

    def column(kind):
        size = kind.list_size if pa.types.is_fixed_size_list(kind) else 1
        scalar = kind.value_type if size > 1 else kind
        values = pa.array(rng.integers(0, 100, rows * size), pa.int64()).cast(scalar)
        return pa.FixedSizeListArray.from_arrays(values, size) if size > 1 else values

    for i in range(files):
        table = pa.table([column(f.type) for f in ARROW], schema=ARROW)
        pq.write_table(table, folder / f"img_{i}_of_{files}.parquet", row_group_size=group,
                       compression=None)


@needs_strace
@pytest.mark.timeout(240)
def test_files_the_fork_wrote_are_read_by_their_own_column_chunks(tmp_path):
    train = tmp_path / "data" / "train"
    _fork_files(train, 2, 4000, 1000)
    assert pq.ParquetFile(next(train.iterdir())).metadata.row_group(0).column(0) \
        .has_dictionary_page
    over = _over(tmp_path, dataset__num_samples_per_file=4000, dataset__num_files_train=2,
                 dataset__parquet__row_group_size=1000, reader__read_threads=1,
                 reader__batch_size=100, train__epochs=1, workflow__generate_data="false")
    logs = _strace([mpiexec(), "-n", "1", sys.executable, "-P", "-m", "dlio_mpi", "run",
                    "demo", *over], tmp_path / "run")
    ref = _preads(_pyarrow_row_groups(train, tmp_path / "ref"), str(train))
    ours = _preads(logs, str(train))
    # ours are pyarrow's reads (the tail, then each group's in a few), and the footers read
    # before training to find the chunks
    assert sum(ref.values()) > 2 * (1 + 4), ref
    assert not ref - ours, ref - ours
    sizes = {str(p): p.stat().st_size for p in train.iterdir()}
    assert all(n in (64 << 10, 8) and offset + n == sizes[path]
               for path, offset, n in (ours - ref).elements()), ours - ref


def _strace_run(over: list[str], prefix) -> list:
    """The system calls of a one-rank training run of the data generated with `over`."""
    return _strace([mpiexec(), "-n", "1", sys.executable, "-P", "-m", "dlio_mpi", "run", "demo",
                    *over, "workflow.generate_data=false"], prefix)


def _pyarrow_row_groups(train, prefix) -> list:
    """The system calls of pyarrow reading every row group of the files under `train`, only
    the columns read (READ), as read_row_group(g, columns=...) does."""
    script = ("import glob, pyarrow.parquet as pq\n"
              f"for p in sorted(glob.glob('{train}/*.parquet')):\n"
              "    f = pq.ParquetFile(p)\n"
              "    for g in range(f.metadata.num_row_groups):\n"
              f"        f.read_row_group(g, columns={READ!r})\n")
    return _strace([sys.executable, "-c", script], prefix)


def _preads(logs, folder: str) -> Counter:
    """(path, offset, length) of every pread64 of a file under `folder`, from strace -y."""
    found = Counter()
    for line in (line for log in logs for line in log.read_text().splitlines()):
        m = PREAD.match(line)
        if m and m.group(1).startswith(folder):
            found[m.group(1), int(m.group(3)), int(m.group(2))] += 1
    return found


def test_files_of_other_columns_are_refused_naming_why(tmp_path):
    cfg = load_config("demo", _over(tmp_path, dataset__num_files_train=1))
    folder = tmp_path / "data" / "train"
    _fork_files(folder, 1, 10, 4)
    path = folder / "img_0_of_1.parquet"
    assert format_for(cfg.dataset).probe(str(path)).shape == (10, ROW_BYTES)
    pq.write_table(pq.read_table(path), path, row_group_size=3)
    with pytest.raises(ValueError, match=r"in row groups of \[3, 3, 3, 1\] rows where "
                                         "dlio-mpi reads row groups of 4 rows"):
        format_for(cfg.dataset).probe(str(path))
    pq.write_table(pq.read_table(path).drop_columns(["flags"]), path)
    with pytest.raises(ValueError, match="does not hold the columns"):
        format_for(cfg.dataset).probe(str(path))


@needs_strace
@pytest.mark.timeout(240)
def test_whole_file_reads_of_columns_match_pyarrows_read_table_of_them(tmp_path):
    over = _over(tmp_path, dataset__num_samples_per_file=4000, dataset__num_files_train=2,
                 dataset__parquet__row_group_size=1000, reader__read_threads=1,
                 reader__read_mode="file_once", reader__batch_size=100, train__epochs=1)
    assert run_cli(["generate", "demo", *over], ranks=1).returncode == 0
    train = str(tmp_path / "data" / "train")
    logs = _strace_run(over, tmp_path / "run")
    script = ("import glob, pyarrow.parquet as pq\n"
              f"for p in sorted(glob.glob('{train}/*.parquet')):\n"
              f"    pq.read_table(p, columns={READ!r})\n")
    ref = _calls(_strace([sys.executable, "-c", script], tmp_path / "ref"), train)
    ours = _calls(logs, train)
    assert ours["preads"] == pytest.approx(ref["reads"], rel=0.05), (ours, ref)
    assert ours["pread_bytes"] == pytest.approx(ref["bytes"], rel=0.05), (ours, ref)
    files = sorted((tmp_path / "data" / "train").iterdir())
    unread = sum(n for p in files for _, n in _chunks(p, ["dense"]))  # far from the others
    tails = len(files) * (64 << 10)  # the footer reads, whose tails hold data too
    assert ours["pread_bytes"] - tails <= sum(p.stat().st_size for p in files) - unread


@pytest.mark.parametrize("loader", ["pytorch", "tensorflow"])
@pytest.mark.timeout(300)
def test_framework_loaders_read_the_columns_read_as_pyarrow_does(tmp_path, loader):
    pytest.importorskip("torch" if loader == "pytorch" else "tensorflow")
    runs = {}
    # DLIO's readers: pytorch's loads the file for every sample, tensorflow's once
    mode = "file" if loader == "pytorch" else "file_once"
    for engine in ("native", "framework"):
        out = tmp_path / engine
        over = _over(tmp_path, dataset__num_samples_per_file=400,
                     dataset__parquet__row_group_size=100, reader__batch_size=20,
                     reader__data_loader=loader, framework=loader, reader__engine=engine,
                     reader__read_mode=mode if engine == "native" else "auto",
                     reader__read_threads=1, train__epochs=1, output__folder=str(out))
        res = run_cli(["run", "demo", *over], timeout=300)
        assert res.returncode == 0, res.stderr
        runs[engine] = json.loads((out / "summary.json").read_text())["metric"]
    # the real loader's pq.read_table(path, columns=...) is what the engine models, loads
    # of the same files (its chunk reads run on Arrow's I/O threads, which its per-thread
    # counters do not see: test_whole_file_reads_of_columns_... compares them under strace)
    native, real = runs["native"], runs["framework"]
    # each load of a file delivers its 400 rows' read columns: tensorflow's, each of the 2
    # ranks loads each of the 4 files once; pytorch's, a load for each of the 1,600 samples
    loads = 2 * 4 if mode == "file_once" else 4 * 400
    assert native["train_bytes_read"] == loads * 400 * READ_BYTES
    assert real["train_bytes_read"] == native["train_bytes_read"]
    assert real["train_file_opens"] == native["train_file_opens"] // 2  # footer, then chunks
