"""Files written by each format load with numpy, and the extents we compute are where numpy
finds each sample; layouts probed from headers equal the computed ones."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from dlio_mpi.formats import SampleSpec, get_format
from dlio_mpi.formats.base import StagedWrites


def write(fmt, path, spec, seed) -> int:
    staged = StagedWrites("0a1b2c")
    size = fmt.write(path, spec, seed, staged)
    staged.commit()
    return size


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
    size = write(fmt, path, spec, 7)
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
    stored = fmt.probe(path)
    assert stored.layout(stored.as_samples(samples, "first_axis")) == layout


def test_last_axis_layout_covers_strided_samples(tmp_path):
    fmt = get_format("npy")
    spec = SampleSpec((3, 4), "uint8", 5, "last_axis")
    path = str(tmp_path / "f.npy")
    write(fmt, path, spec, 1)
    array = np.load(path)
    assert array.shape == (3, 4, 5)
    layout = fmt.layout(spec)
    for i in range(5):
        extent = np.frombuffer(read_extent(path, layout, i), dtype=np.uint8)
        assert np.array_equal(extent[:: 5], array[..., i].ravel())
    stored = fmt.probe(path)
    assert stored.as_samples(5, "first_axis").layout == "last_axis"  # detected from the header
    assert stored.layout(stored.as_samples(5, "first_axis")) == layout


def test_probe_reads_numpy_savez_files(tmp_path):
    """Data written by another tool (DLIO uses np.savez with samples on the last axis)."""
    x = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = str(tmp_path / "dlio.npz")
    np.savez(path, x=x, y=np.zeros(4))
    stored = get_format("npz").probe(path)
    layout = stored.layout(stored.as_samples(4, "first_axis"))
    for i in range(4):
        extent = np.frombuffer(read_extent(path, layout, i), dtype=np.uint8)
        assert np.array_equal(extent[::4], x[..., i].ravel())


def test_indexed_binary_writes_index_files(tmp_path):
    fmt = get_format("indexed_binary")
    spec = SampleSpec((10,), "uint8", 6)
    path = str(tmp_path / "f.indexed_binary")
    assert write(fmt, path, spec, 3) == 60
    offsets = np.fromfile(path + ".off.idx", dtype=np.uint64)
    sizes = np.fromfile(path + ".sz.idx", dtype=np.uint64)
    assert list(offsets) == [0, 10, 20, 30, 40, 50] and list(sizes) == [10] * 6
    stored = fmt.probe(path)
    assert stored.layout(stored.as_samples(6, "first_axis")) == fmt.layout(spec)


def test_payload_depends_only_on_seed(tmp_path):
    fmt = get_format("npy")
    spec = SampleSpec((64,), "uint8", 2)
    a, b, c = (str(tmp_path / f"{n}.npy") for n in "abc")
    write(fmt, a, spec, 5)
    write(fmt, b, spec, 5)
    write(fmt, c, spec, 6)
    assert np.array_equal(np.load(a), np.load(b))
    assert not np.array_equal(np.load(a), np.load(c))


def test_write_leaves_no_temporary_file(tmp_path):
    fmt = get_format("npz")
    write(fmt, str(tmp_path / "f.npz"), SampleSpec((4,), "uint8", 2), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npz"]


def test_samples_on_no_axis_are_refused():
    from dlio_mpi.formats import StoredArray

    stored = StoredArray(1000, 128, (3, 4, 5), "|u1")
    with pytest.raises(ValueError, match="no axis of dataset.num_samples_per_file=2"):
        stored.as_samples(2, "first_axis")
    assert stored.as_samples(3, "last_axis").layout == "first_axis"  # only the first fits


def test_staged_files_get_their_names_only_on_commit(tmp_path):
    fmt = get_format("indexed_binary")
    staged = StagedWrites("0a1b2c")
    path = str(tmp_path / "f.indexed_binary")
    fmt.write(path, SampleSpec((10,), "uint8", 2), 1, staged)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"f.indexed_binary{side}.dlio_mpi-0a1b2c.tmp" for side in ("", ".off.idx", ".sz.idx"))
    staged.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "f.indexed_binary", "f.indexed_binary.off.idx", "f.indexed_binary.sz.idx"]


def test_a_write_out_of_room_names_the_file_and_leaves_no_temporary(tmp_path):
    """os.write's ENOSPC names no file; the staged write's error names its temporary."""
    import errno

    from dlio_mpi.errors import describe

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as caught:
        StagedWrites("abc").write(str(tmp_path / "f.bin"), full)
    assert describe(caught.value) == \
        f"No space left on device: {tmp_path / 'f.bin'}.dlio_mpi-abc.tmp"
    assert list(tmp_path.iterdir()) == []
