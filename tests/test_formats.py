"""Files written by each format load with numpy, and the extents we compute are where numpy
finds each sample; layouts probed from headers equal the computed ones."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from dlio_mpi.formats import SampleSpec, get_format


def read_extent(path, layout, index) -> bytes:
    with open(path, "rb") as fp:
        fp.seek(layout.data_offset + index * layout.sample_step)
        return fp.read(layout.sample_span)


@pytest.mark.parametrize("fmt_name", ["npy", "npz"])
@pytest.mark.parametrize("shape,dtype,samples", [((3, 5), "uint8", 4), ((7,), "float32", 3),
                                                 ((2, 3, 4), "int16", 1)])
def test_array_formats_load_with_numpy_and_extents_match(tmp_path, fmt_name, shape, dtype,
                                                         samples):
    fmt = get_format(fmt_name)
    spec = SampleSpec(shape, dtype, samples)
    path = str(tmp_path / f"f.{fmt.extension}")
    size = fmt.write(path, spec, seed=7)
    layout = fmt.layout(spec)
    assert size == layout.size == (tmp_path / f"f.{fmt.extension}").stat().st_size
    loaded = np.load(path)
    array = loaded["x"] if fmt_name == "npz" else loaded
    assert array.shape == (samples, *shape) and array.dtype == np.dtype(dtype)
    for i in range(samples):
        assert read_extent(path, layout, i) == array[i].tobytes(), f"sample {i} of {path}"
    if fmt_name == "npz":
        assert list(loaded["y"]) == [0] * samples
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None  # CRCs are right
    assert fmt.probe(path, "first_axis") == layout


def test_last_axis_layout_covers_strided_samples(tmp_path):
    fmt = get_format("npy")
    spec = SampleSpec((3, 4), "uint8", 5, "last_axis")
    path = str(tmp_path / "f.npy")
    fmt.write(path, spec, seed=1)
    array = np.load(path)
    assert array.shape == (3, 4, 5)
    layout = fmt.layout(spec)
    for i in range(5):
        extent = np.frombuffer(read_extent(path, layout, i), dtype=np.uint8)
        assert np.array_equal(extent[:: 5], array[..., i].ravel())
    assert fmt.probe(path, "last_axis") == layout


def test_probe_reads_numpy_savez_files(tmp_path):
    """Data written by another tool (DLIO uses np.savez with samples on the last axis)."""
    x = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = str(tmp_path / "dlio.npz")
    np.savez(path, x=x, y=np.zeros(4))
    layout = get_format("npz").probe(path, "last_axis")
    for i in range(4):
        extent = np.frombuffer(read_extent(path, layout, i), dtype=np.uint8)
        assert np.array_equal(extent[::4], x[..., i].ravel())


def test_indexed_binary_writes_index_files(tmp_path):
    fmt = get_format("indexed_binary")
    spec = SampleSpec((10,), "uint8", 6)
    path = str(tmp_path / "f.indexed_binary")
    assert fmt.write(path, spec, seed=3) == 60
    offsets = np.fromfile(path + ".off.idx", dtype=np.uint64)
    sizes = np.fromfile(path + ".sz.idx", dtype=np.uint64)
    assert list(offsets) == [0, 10, 20, 30, 40, 50] and list(sizes) == [10] * 6
    assert fmt.probe(path, "first_axis") == fmt.layout(spec)


def test_payload_depends_only_on_seed(tmp_path):
    fmt = get_format("npy")
    spec = SampleSpec((64,), "uint8", 2)
    a, b, c = (str(tmp_path / f"{n}.npy") for n in "abc")
    fmt.write(a, spec, seed=5)
    fmt.write(b, spec, seed=5)
    fmt.write(c, spec, seed=6)
    assert np.array_equal(np.load(a), np.load(b))
    assert not np.array_equal(np.load(a), np.load(c))


def test_write_leaves_no_temporary_file(tmp_path):
    fmt = get_format("npz")
    fmt.write(str(tmp_path / "f.npz"), SampleSpec((4,), "uint8", 2), seed=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npz"]
