"""dataset.format hdf5: files written through h5py as DLIO writes them (records_<j>, labels,
chunks, gzip/lzf), laid out where layout() says without I/O, probed when another tool wrote
them, read natively by the C engine when contiguous (or in one-sample chunks), through
h5py otherwise (tests/test_hdf5_h5py_reader.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.config import load_config
from dlio_mpi.errors import UserError
from dlio_mpi.formats import SampleSpec, format_for, get_format
from dlio_mpi.formats import hdf5 as hdf5_module
from dlio_mpi.formats.base import StagedWrites
from dlio_mpi.formats.hdf5 import Hdf5Format, Hdf5Options
from dlio_mpi.plan.derive import derive_plan
from helpers import run_cli, workload_overrides, write_one

SEED = 1234


def _write(tmp_path: Path, fmt: Hdf5Format, spec: SampleSpec, name: str = "f.hdf5") -> Path:
    return write_one(tmp_path / name, fmt, spec, SEED)


def _stream(shape: tuple[int, ...], dtype: str) -> bytes:
    """The seed's payload stream as an array of `shape` (what each records_j holds)."""
    out = np.empty(shape, dtype=dtype)
    _core.fill_random(out, SEED, 0)
    return out.tobytes()


# (options, record dims, dtype, samples, each records_j's shape as DLIO makes it)
WRITTEN = [
    (Hdf5Options(), (64, 64), "|u1", 4, (4, 64, 64)),
    (Hdf5Options(), (3,), "<f4", 1, (1, 3)),
    (Hdf5Options(split_dims=True), (1, 5, 6), "<i8", 3, (3, 5, 6)),   # a leading 1 dropped
    (Hdf5Options(datasets=3, split_dims=True), (3, 10, 10), "|u1", 5, (5, 10, 10)),
    (Hdf5Options(datasets=2, split_dims=True), (4, 7), "<f8", 300, (300, 2, 7)),
    (Hdf5Options(datasets=9, split_dims=True), (9, 5), "|u1", 3, (3, 5)),
    (Hdf5Options(chunk_dims=(1, 30, 30)), (30, 30), "|u1", 10, (10, 30, 30)),
    (Hdf5Options(chunk_dims=(3, 7, 5)), (30, 30), "<i2", 10, (10, 30, 30)),
    (Hdf5Options(compression="gzip", level=9, chunk_dims=(1, 50, 50)), (100, 100), "|u1", 16,
     (16, 100, 100)),
    (Hdf5Options(compression="gzip", level=1), (70, 300), "<f4", 5, (5, 70, 300)),
    (Hdf5Options(compression="lzf"), (100, 100), "<f4", 7, (7, 100, 100)),
    (Hdf5Options(max_shape=(200, 300), compression="gzip"), (100, 100), "|u1", 4,
     (4, 100, 100)),
    (Hdf5Options(chunk_dims=(1, 8)), (8,), "|u1", 5000, (5000, 8)),
    (Hdf5Options(compression="gzip", chunk_dims=(1, 8), datasets=2, split_dims=True), (16,),
     "|u1", 3000, (3000, 8)),
]


@pytest.mark.parametrize("opt,dims,dtype,samples,shape", WRITTEN)
def test_files_read_back_through_h5py_as_dlio_has_them(tmp_path, opt, dims, dtype, samples,
                                                       shape):
    path = _write(tmp_path, Hdf5Format(opt), SampleSpec(dims, dtype, samples))
    want = _stream(shape, dtype)
    with h5py.File(path, "r") as f:
        assert sorted(f) == sorted([f"records_{j}" for j in range(opt.datasets)] + ["labels"])
        for j in range(opt.datasets):  # DLIO writes the same records into each dataset
            dset = f[f"records_{j}"]
            assert dset.shape == shape and dset.dtype == np.dtype(dtype)
            assert dset[()].tobytes() == want
            if opt.chunk_dims:
                assert dset.chunks == opt.chunk_dims
            if opt.max_shape:
                assert dset.maxshape == (samples, *opt.max_shape)
            assert dset.compression == (None if opt.compression == "none" else opt.compression)
            if opt.compression == "gzip":
                assert dset.compression_opts == opt.level
            if opt.compression == "none" and not opt.chunked:
                assert dset.chunks is None  # contiguous
        labels = f["labels"][()]
        assert labels.dtype == np.int64 and labels.shape == (samples,) and not labels.any()


def test_gzip_chunks_are_zlib_streams_of_stored_blocks_zlib_can_read(tmp_path):
    import zlib

    path = _write(tmp_path, Hdf5Format(Hdf5Options(compression="gzip", level=6,
                                                   chunk_dims=(1, 200, 200))),
                  SampleSpec((200, 200), "|u1", 2))
    with h5py.File(path, "r") as f:
        dset = f["records_0"]
        offset, mask, where, size = dset.id.get_chunk_info(1)
        assert mask == 0 and size == hdf5_module.zlib_stored_size(40000) == 40000 + 6 + 5 * 3
    raw = path.read_bytes()[where:where + size]
    assert raw[:2] == b"\x78\x9c"  # the header zlib writes at level 6
    assert zlib.decompress(raw) == _stream((2, 200, 200), "|u1")[40000:]


@pytest.mark.parametrize("opt,dims,dtype,samples", [
    (Hdf5Options(), (64, 64), "|u1", 4),
    (Hdf5Options(), (3,), "<f4", 1),
    (Hdf5Options(), (224, 224, 3), "|u1", 3),
    (Hdf5Options(split_dims=True), (1, 5, 6), "<i8", 33),
    (Hdf5Options(chunk_dims=(1, 30, 30)), (30, 30), "<f2", 10),
    (Hdf5Options(chunk_dims=(1, 8)), (8,), "|u1", 5000),
])
def test_sample_extents_hold_what_h5py_reads_as_each_sample(tmp_path, opt, dims, dtype,
                                                              samples):
    fmt, spec = Hdf5Format(opt), SampleSpec(dims, dtype, samples)
    assert fmt.library_read_reason(spec) == ""
    lay = fmt.layout(spec)
    raw = _write(tmp_path, fmt, spec).read_bytes()
    assert lay.size == len(raw)
    with h5py.File(tmp_path / "f.hdf5", "r") as f:
        records = f["records_0"]
        for i in range(samples):
            start = lay.data_offset + i * lay.sample_step
            assert raw[start:start + lay.sample_span] == records[i].tobytes()


LAYOUT_CASES = [((64, 64), "|u1", 4), ((3,), "<f4", 1), ((100, 100), "<f8", 1000),
                ((2,) * 12, "<i2", 7), ((1000,), "|u1", 300), ((17, 3), "<f2", 256)]


@pytest.mark.parametrize("dims,dtype,samples", LAYOUT_CASES)
def test_layout_without_io_is_where_hdf5_puts_the_samples(tmp_path, dims, dtype, samples):
    fmt, spec = Hdf5Format(), SampleSpec(dims, dtype, samples)
    lay = fmt.layout(spec)
    path = _write(tmp_path, fmt, spec)
    with h5py.File(path, "r") as f:
        assert f["records_0"].id.get_offset() == lay.data_offset == 2048  # as DLIO's files
    assert os.path.getsize(path) == lay.size
    assert lay.size == 2048 + samples * spec.sample_bytes + 8 * samples  # then the labels


def test_layout_imports_no_h5py_and_touches_no_file(tmp_path):
    """The plan derives the layouts of millions of files: layout() is arithmetic."""
    code = ("import sys\n"
            "from dlio_mpi.formats import SampleSpec\n"
            "from dlio_mpi.formats.hdf5 import Hdf5Format, Hdf5Options\n"
            "for opt in (Hdf5Options(), Hdf5Options(datasets=3, split_dims=True),\n"
            "            Hdf5Options(chunk_dims=(2, 3, 3), compression='gzip')):\n"
            "    print(Hdf5Format(opt).layout(SampleSpec((9, 9), '|u1', 4)).size)\n"
            "assert 'h5py' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) == 3 and not any(tmp_path.iterdir())


def test_write_refuses_a_file_hdf5_laid_out_otherwise_than_planned(tmp_path, monkeypatch):
    """With a metadata block too small for three datasets' headers, HDF5 puts metadata
    between the data: write() says so and keeps no file."""
    monkeypatch.setattr(hdf5_module, "_meta_block", lambda *args: 1024)
    hdf5_module.geometry.cache_clear()
    fmt = Hdf5Format(Hdf5Options(datasets=3, split_dims=True))
    staged = StagedWrites("test")
    try:
        with pytest.raises(RuntimeError, match="did not lay the file out as dlio-mpi computed"):
            fmt.write(str(tmp_path / "f.hdf5"), SampleSpec((3, 50), "|u1", 4), SEED, staged)
    finally:
        staged.discard()
        hdf5_module.geometry.cache_clear()
    assert not any(tmp_path.iterdir())


def _dlio_like(path: Path, records: np.ndarray, name: str = "records_0", **kwargs) -> None:
    """A file as DLIO's generator writes it, with plain h5py."""
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset(name, records.shape, dtype=records.dtype, data=records, **kwargs)
        f.create_dataset("labels", data=[0] * len(records))


@pytest.mark.parametrize("name", ["records_0", "records"])  # DLIO 2.0.0 names it records
def test_probe_reads_a_file_plain_h5py_wrote(tmp_path, name):
    records = np.random.default_rng(3).integers(0, 255, (6, 20, 30), dtype=np.uint8)
    path = tmp_path / "dlio.hdf5"
    _dlio_like(path, records, name)
    stored = get_format("hdf5").probe(str(path))
    assert stored.shape == (6, 20, 30) and stored.dtype == "|u1"
    assert stored.size == os.path.getsize(path)
    spec = stored.as_samples(6, "first_axis")
    lay = stored.layout(spec)
    raw = path.read_bytes()
    for i in range(6):
        start = lay.data_offset + i * lay.sample_step
        assert raw[start:start + lay.sample_span] == records[i].tobytes()


@pytest.mark.parametrize("kwargs,words", [
    ({"chunks": (1, 10, 10)}, "stores records_0 in chunks, which is not read natively yet"),
    ({"compression": "gzip"}, "has records_0 compressed (gzip), which is not read natively yet"),
    ({"compression": "lzf"}, "has records_0 compressed (lzf), which is not read natively yet"),
])
def test_probe_refuses_chunked_or_compressed_files_with_the_reason(tmp_path, kwargs, words):
    path = tmp_path / "dlio.hdf5"
    _dlio_like(path, np.zeros((4, 10, 10), dtype=np.uint8), **kwargs)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        get_format("hdf5").probe(str(path))


def test_probe_refuses_several_datasets_and_foreign_files(tmp_path):
    path = tmp_path / "multi.hdf5"
    with h5py.File(path, "w") as f:
        for j in range(3):
            f.create_dataset(f"records_{j}", data=np.zeros((2, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="holds 3 record datasets"):
        get_format("hdf5").probe(str(path))
    other = tmp_path / "other.hdf5"
    other.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(ValueError, match="is not an HDF5 file h5py can open"):
        get_format("hdf5").probe(str(other))
    with h5py.File(tmp_path / "empty.hdf5", "w") as f:
        f.create_dataset("labels", data=[0])
    with pytest.raises(ValueError, match="has no dataset records_0"):
        get_format("hdf5").probe(str(tmp_path / "empty.hdf5"))


def _cfg(tmp_path: Path, *extra: str):
    """8 hdf5 files of 4 samples of 64x64 bytes, changed by `extra` (key=value)."""
    values = {"dataset.format": "hdf5", "dataset.num_samples_per_file": 4}
    values.update(item.split("=", 1) for item in extra)
    return load_config("demo", workload_overrides(
        tmp_path, **{k.replace(".", "__"): v for k, v in values.items()}))


@pytest.mark.parametrize("extra,why", [
    (["dataset.compression=gzip"], "the datasets are compressed (dataset.compression gzip), "
     "in chunks"),
    (["dataset.compression=lzf"], "the datasets are compressed (dataset.compression lzf)"),
    (["dataset.hdf5.chunk_dims=[2,64,64]"], "the datasets are stored in chunks of [2, 64, 64] "
     "(dataset.hdf5.chunk_dims), not of one sample [1, 64, 64]"),
    (["dataset.hdf5.max_shape=[80,80]"], "the datasets are resizable (dataset.hdf5.max_shape "
     "[80, 80]), stored in chunks of"),
    (["dataset.record_dims=[4,32]", "dataset.hdf5.num_dset_per_record=2"],
     "each sample is split over 2 datasets (dataset.hdf5.num_dset_per_record 2)"),
])
def test_what_the_engine_cannot_read_by_extent_is_read_through_h5py(tmp_path, extra, why):
    plan = derive_plan(_cfg(tmp_path, *extra), 2)
    assert plan.library_read.startswith(why), plan.library_read
    assert plan.dataset_bytes == sum(t.total("size") for t in plan.layouts.values())
    assert not any(tmp_path.iterdir())


def test_one_sample_chunks_are_read_natively(tmp_path):
    plan = derive_plan(_cfg(tmp_path, "dataset.hdf5.chunk_dims=[1,64,64]"), 2)
    assert plan.read_mode == "sample" and plan.library_read == ""
    assert plan.layouts["train"].layout(0).sample_bytes == 4096


@pytest.mark.parametrize("extra,key", [
    (["dataset.hdf5.num_dset_per_record=2"], "dataset.hdf5.num_dset_per_record: 2 needs "
                                              "dataset.record_dims"),
    (["dataset.hdf5.chunk_dims=[1,2]", "workflow.train=false"],
     "dataset.hdf5.chunk_dims: [1, 2] does not fit"),
    (["dataset.hdf5.max_shape=[10]", "workflow.train=false"],
     "dataset.hdf5.max_shape: [10] does not fit"),
    (["dataset.compression=gzip", "dataset.record_length_bytes_stdev=100"],
     "dataset.compression: chunked hdf5 files of varying sample sizes"),
    (["dataset.sample_layout=last_axis"], "dataset.sample_layout: 'last_axis' does not apply"),
])
def test_settings_hdf5_files_cannot_have_are_one_clear_error(tmp_path, extra, key):
    with pytest.raises(UserError, match=key.replace("[", r"\[").replace("]", r"\]")):
        derive_plan(_cfg(tmp_path, *extra), 2, generating=True)


def test_hdf5_keys_act_for_hdf5_and_are_noted_for_other_formats(tmp_path):
    keys = ["dataset.compression=gzip", "dataset.compression_level=7",
            "dataset.hdf5.chunk_dims=[1,64,64]", "workflow.train=false"]
    plan = derive_plan(_cfg(tmp_path, *keys), 2)
    assert not [n for n in plan.notes if "no effect" in n], plan.notes
    npz = load_config("demo", [*workload_overrides(tmp_path), *keys])
    assert format_for(npz.dataset) is get_format("npz")
    notes = [n for n in derive_plan(npz, 2).notes if "no effect" in n]
    assert notes == [
        "dataset.compression=gzip, dataset.hdf5.chunk_dims=[1, 64, 64]: accepted, have no "
        "effect in dlio-mpi because dataset.format is not hdf5 (DLIO uses them for hdf5 files "
        "only)",
        "dataset.compression_level=7: accepted, has no effect in dlio-mpi because only gzip "
        "has a level (dataset.format hdf5, dataset.compression gzip)"]
    lzf = derive_plan(_cfg(tmp_path, "dataset.compression=lzf", "dataset.compression_level=7",
                           "workflow.train=false"), 2)
    assert [n for n in lzf.notes if "no effect" in n] == notes[1:]


def _metric(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_two_ranks_generate_and_train_on_hdf5(tmp_path):
    """8 files of 4 samples of 64x64 bytes on 2 ranks, batch 2: 8 steps a rank and epoch, each
    sample read once an epoch as its exact extent."""
    over = workload_overrides(tmp_path, dataset__format="hdf5",
                              dataset__num_samples_per_file=4, output__access_log="true")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    summary = _metric(tmp_path / "out")
    assert summary["dlio_mpi"]["steps_per_epoch"] == 8
    assert summary["dlio_mpi"]["format"] == "hdf5"
    metric = summary["metric"]
    assert metric["train_bytes_read"] == metric["train_bytes_requested"] == 2 * 32 * 4096
    assert metric["train_requests"] == 2 * 32
    for epoch in (1, 2):
        ids = np.concatenate([np.load(tmp_path / "out" / "access_log" /
                                      f"epoch{epoch}_rank{r}.npy") for r in (0, 1)])
        assert sorted(ids.tolist()) == list(range(32))
    files = sorted((tmp_path / "data" / "train").iterdir())
    assert [p.name for p in files] == [f"img_{i}_of_8.hdf5" for i in range(8)]
    with h5py.File(files[3], "r") as f:  # file 3 of train: its own seed's bytes
        assert f["records_0"].shape == (4, 64, 64) and f["labels"].shape == (4,)


def test_two_ranks_train_on_hdf5_files_dlio_wrote(tmp_path):
    """Files written by plain h5py under DLIO's names are probed and read by extent."""
    folder = tmp_path / "data" / "train"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(5)
    for i in range(8):
        _dlio_like(folder / f"img_{i}_of_8.hdf5",
                   rng.integers(0, 255, (4, 64, 64), dtype=np.uint8))
    over = workload_overrides(tmp_path, dataset__format="hdf5",
                              dataset__num_samples_per_file=4, workflow__generate_data="false")
    res = run_cli(["run", "demo", *over])
    assert res.returncode == 0, res.stderr
    metric = _metric(tmp_path / "out")["metric"]
    assert metric["train_bytes_read"] == 2 * 32 * 4096 and metric["train_requests"] == 64


def test_compressed_hdf5_is_generated_exactly_and_a_rerun_keeps_it(tmp_path):
    def over(compression: str) -> list[str]:
        return workload_overrides(tmp_path, dataset__format="hdf5",
                                  dataset__compression=compression,
                                  dataset__num_samples_per_file=4,
                                  dataset__record_length_bytes=40000)

    res = run_cli(["generate", "demo", *over("gzip")])
    assert res.returncode == 0, res.stderr
    files = sorted((tmp_path / "data" / "train").iterdir())
    assert len(files) == 8
    with h5py.File(files[0], "r") as f:
        assert f["records_0"].compression == "gzip" and f["records_0"].shape == (4, 200, 200)
    stamps = [p.stat().st_mtime_ns for p in files]
    again = run_cli(["generate", "demo", *over("gzip")])
    assert again.returncode == 0, again.stderr
    assert [p.stat().st_mtime_ns for p in files] == stamps  # complete: nothing rewritten
    other = run_cli(["generate", "demo", *over("lzf")])
    assert other.returncode == 2 and "generated with other parameters (hdf5 differ)" in \
        other.stderr, other.stderr
