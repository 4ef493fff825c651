"""csv: the text dlio-mpi writes is exactly what pandas' to_csv(header=False, index=False)
writes for DLIO's rows (num_samples_per_file identical rows of the sample's values), and pandas
and the csv module read back the values drawn from the file's seed; generation records the
sizes and a run reads whole files of exactly those bytes; tables pandas wrote without dlio-mpi
are probed and read; a binary file under a csv name is refused by name; reader.read_mode
sample, dataset.compression and element types other than uint8 are refused."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi.config import load_config
from dlio_mpi.data.recorded_sizes import sizes_path
from dlio_mpi.errors import UserError
from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.csv_table import row_text
from dlio_mpi.formats.sized import payload_values
from dlio_mpi.plan.derive import derive_plan
from helpers import access_logs, error_of, run_cli, workload_overrides

pd = pytest.importorskip("pandas")

FMT = get_format("csv")


def write(path: Path, spec: SampleSpec, seed: int) -> int:
    staged = StagedWrites("0a1b2c")
    size = FMT.write(str(path), spec, seed, staged)
    staged.commit()
    return size


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# --------------------------------------------------------------------------- the text

@pytest.mark.parametrize("values", [[0], [254], [0, 9, 10, 99, 100, 254], list(range(255))])
def test_a_row_is_pandas_text(values):
    row = np.array(values, dtype=np.uint8)
    assert row_text(row) == pd.DataFrame(data=[row]).to_csv(header=False, index=False).encode()


@pytest.mark.parametrize("shape,samples", [((1,), 1), ((8, 8), 3), ((32, 32), 1), ((5, 7), 4)])
def test_files_are_what_pandas_to_csv_writes_and_read_back(tmp_path, shape, samples):
    path = tmp_path / "f.csv"
    size = write(path, SampleSpec(shape, "|u1", samples), 11)
    values = payload_values(11, int(np.prod(shape)))
    dlio = pd.DataFrame(data=[values] * samples).to_csv(header=False, index=False)
    assert path.read_text() == dlio and size == len(dlio) == path.stat().st_size
    table = pd.read_csv(path, header=None).to_numpy()
    assert table.shape == (samples, values.size) and (table == values).all()
    with open(path, newline="") as fp:
        rows = list(csv.reader(fp))
    assert rows == [[str(v) for v in values]] * samples
    loaded = get_format("csv").load_whole(str(path))
    assert np.array_equal(get_format("csv").library_sample(loaded, samples - 1, False), values)
    assert [p.name for p in tmp_path.iterdir()] == ["f.csv"]


def test_probe_counts_rows_and_values_and_rows_are_equal_extents(tmp_path):
    path = tmp_path / "f.csv"
    size = write(path, SampleSpec((6, 7), "|u1", 3), 2)
    stored = FMT.probe(str(path))
    assert stored.shape == (3, 42) and stored.size == size
    spec = stored.as_samples(3, "first_axis")
    assert spec.sample_bytes == 42
    lay = stored.layout(spec)
    assert (lay.size, lay.data_offset) == (size, 0)
    assert lay.sample_step == lay.sample_span == lay.sample_bytes == size // 3
    with pytest.raises(ValueError, match="holds 3 rows where dataset.num_samples_per_file=2"):
        stored.as_samples(2, "first_axis")


def test_the_same_seed_writes_the_same_file_and_the_estimate_is_near(tmp_path):
    spec = SampleSpec((64, 64), "|u1", 2)
    sizes = [write(tmp_path / f"{n}.csv", spec, seed) for n, seed in (("a", 1), ("b", 1),
                                                                      ("c", 2))]
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()
    assert abs(FMT.layout(spec).size - sizes[0]) < 0.01 * sizes[0]


def test_a_binary_file_is_no_csv(tmp_path):
    path = tmp_path / "f.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match=f"{path} is not a csv file: it holds byte 0x89"):
        FMT.probe_size(str(path))


# --------------------------------------------------------------------------- the plan

def test_read_mode_sample_compression_and_element_types_are_refused(tmp_path):
    cfg = load_config("demo", workload_overrides(tmp_path, dataset__format="csv",
                                                 reader__read_mode="sample"))
    with pytest.raises(UserError, match="DLIO's csv reader decodes whole files"):
        derive_plan(cfg, 2)
    assert error_of("demo", ["dataset.format=csv", "dataset.compression=gzip"]).startswith(
        "dataset.compression: gzip with dataset.format csv is not implemented yet")
    assert error_of("demo", ["dataset.format=csv", "dataset.record_element_type=float32"]) \
        .startswith("dataset.record_element_type: csv stores uint8 only")


# --------------------------------------------------------------------------- runs

@pytest.mark.parametrize("ranks,per_file,mode", [(2, 1, "auto"), (3, 2, "file"),
                                                (2, 3, "file_once")])
def test_generation_records_the_sizes_and_a_run_reads_exactly_those_files(tmp_path, ranks,
                                                                         per_file, mode):
    files = 12
    args = workload_overrides(tmp_path, dataset__format="csv", dataset__num_files_train=files,
                              dataset__num_samples_per_file=per_file,
                              dataset__record_length_bytes=400, workflow__generate_data="true",
                              reader__batch_size=2, output__access_log="true",
                              reader__read_mode=mode, reader__sample_shuffle="seed")
    res = run_cli(["run", "demo", *args], ranks=ranks, timeout=240)
    assert res.returncode == 0, res.stderr
    data = tmp_path / "data"
    sizes = np.load(sizes_path(str(data), "train"))
    assert sizes.tolist() == [(data / "train" / f"img_{i:02d}_of_{files}.csv").stat().st_size
                              for i in range(files)]
    metric = summary(tmp_path / "out")["metric"]
    logs = access_logs(tmp_path / "out", (1, 2), ranks)
    if mode == "file_once":  # each file once per epoch on the rank that reads its samples
        expected = sum(int(sizes[np.unique(ids // per_file)].sum()) for ids in logs)
    else:  # the whole file for every sample
        expected = sum(int(sizes[ids // per_file].sum()) for ids in logs)
    assert metric["train_bytes_transferred"] == expected  # requested: the loader's calls ask more
    assert summary(tmp_path / "out")["dlio_mpi"]["format"] == "csv"


def test_tables_pandas_wrote_are_probed_and_read(tmp_path):
    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    rng = np.random.RandomState(10)
    for i in range(8):  # as DLIO's generator writes them
        record = rng.randint(255, size=20 * 20, dtype=np.uint8)
        pd.DataFrame(data=[record] * 2).to_csv(train / f"img_{i}_of_8.csv", header=False,
                                              index=False)
    sizes = [(train / f"img_{i}_of_8.csv").stat().st_size for i in range(8)]
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format="csv", dataset__num_files_train=8,
        dataset__num_samples_per_file=2, dataset__record_length_bytes=400,
        workflow__generate_data="false", train__epochs=1)])
    assert res.returncode == 0, res.stderr
    metric = summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == 2 * sum(sizes)  # read_mode file: per sample
    assert not (tmp_path / "data" / "dlio_mpi_manifest.json").exists()
    os.unlink(train / "img_3_of_8.csv")
    (train / "img_3_of_8.csv").write_bytes(bytes(range(256)))
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, dataset__format="csv", dataset__num_files_train=8,
        dataset__num_samples_per_file=2, dataset__record_length_bytes=400,
        workflow__generate_data="false", train__epochs=1)])
    assert res.returncode == 2
    assert f"{train / 'img_3_of_8.csv'} is not a csv file" in res.stderr


def test_sized_layouts_keep_one_int64_per_file_at_ten_million_files():
    from dlio_mpi.data.dataset import SizedLayouts

    sizes = np.arange(10**7, dtype=np.int64) * 3 + 30
    table = SizedLayouts(sizes, 3, FMT)
    assert table.sizes.nbytes == 8 * 10**7  # no per-file object, no other column stored
    lay = table.take(np.array([9_999_999, 0]))
    assert lay.size.tolist() == [29_999_997 + 30, 30]
    assert lay.sample_step.tolist() == lay.sample_bytes.tolist() == [(29_999_997 + 30) // 3, 10]
    assert lay.data_offset.tolist() == [0, 0]
    assert table.total("size") == int(sizes.sum())


@pytest.mark.parametrize("fmt", ["csv", "jpeg"])
def test_reader_access_loader_issues_the_loaders_reads(tmp_path, fmt):
    """reader.access: loader: each load issues pandas' (Pillow's) read calls on the file
    (formats/libload.py), bringing exactly the file's bytes."""
    from dlio_mpi.formats.libload import csv_reads, jpeg_reads

    model = csv_reads if fmt == "csv" else jpeg_reads
    args = workload_overrides(tmp_path, dataset__format=fmt, dataset__num_files_train=8,
                              dataset__record_length_bytes=300_000,
                              workflow__generate_data="true", reader__access="loader",
                              output__access_log="true", train__epochs=1)
    res = run_cli(["run", "demo", *args])
    assert res.returncode == 0, res.stderr
    data = tmp_path / "data"
    sizes = np.load(sizes_path(str(data), "train"))
    ids = np.concatenate(access_logs(tmp_path / "out", (1,), 2))
    metric = summary(tmp_path / "out")["metric"]
    assert metric["train_bytes_transferred"] == int(sizes[ids].sum())
    calls = [model(int(sizes[i]), os.stat(data).st_blksize) for i in ids]
    assert metric["train_requests"] == sum(len(c.offset) for c in calls)
    assert metric["train_bytes_requested"] == sum(int(c.asked.sum()) for c in calls)
