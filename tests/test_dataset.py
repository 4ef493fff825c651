"""DLIO's file naming and the seeded per-file sample shapes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dlio_mpi.dataset import DatasetSplit, LayoutTable, file_relpath, sample_shapes
from dlio_mpi.formats import get_format


def test_names_are_padded_to_the_digits_of_the_count():
    assert file_relpath("train", 7, 168, 0, "img", "npz") == "train/img_007_of_168.npz"
    assert file_relpath("valid", 3, 8, 1, "part", "npy") == "valid/part_3_of_8.npy"


def test_subfolders_are_round_robin_and_padded():
    names = [file_relpath("train", i, 32, 16, "img", "npz") for i in (0, 15, 16, 31)]
    assert names == ["train/00/img_00_of_32.npz", "train/15/img_15_of_32.npz",
                     "train/00/img_16_of_32.npz", "train/15/img_31_of_32.npz"]


def _dataset(**kw):
    base = dict(record_dims=(), record_length_bytes=65536, record_length_bytes_stdev=0)
    return SimpleNamespace(**{**base, **kw})


def test_square_shapes_without_stdev():
    shapes = sample_shapes(_dataset(), 3)
    assert shapes.tolist() == [[256, 256]] * 3


def test_stdev_shapes_are_seeded_and_do_not_depend_on_how_many_are_asked():
    ds = _dataset(record_length_bytes=1_000_000, record_length_bytes_stdev=200_000)
    a, b = sample_shapes(ds, 10), sample_shapes(ds, 20)
    assert np.array_equal(a, b[:10])
    sizes = a.prod(axis=1)
    assert len(set(sizes.tolist())) > 1 and abs(sizes.mean() - 1e6) < 2e5


def test_record_dims_give_an_explicit_shape():
    assert sample_shapes(_dataset(record_dims=(3, 224, 224)), 2).tolist() == [[3, 224, 224]] * 2


@pytest.mark.parametrize("fmt_name", ["npy", "npz", "indexed_binary"])
@pytest.mark.parametrize("layout,samples,dtype", [("first_axis", 1, "|u1"),
                                                  ("first_axis", 3, "<f4"),
                                                  ("last_axis", 3, "|u1")])
def test_vectorised_layouts_equal_the_exact_per_file_layouts(fmt_name, layout, samples, dtype):
    rng = np.random.default_rng(1)
    shapes = np.stack([rng.integers(1, 20000, 300), rng.integers(1, 120, 300)], axis=1)
    shapes[7] = (70000, 70000)  # a payload past 4 GiB: ZIP64 records in npz
    shapes[8] = (65535, 65535)  # just under: still no shortcut near the limit
    split = DatasetSplit("train", "/nonexistent", tuple(f"f{i}" for i in range(300)), shapes,
                         dtype, samples, layout, get_format(fmt_name))
    exact = LayoutTable.from_layouts([split.format.layout(split.spec(i)) for i in range(300)])
    fast = split.expected_layouts()
    for column in ("size", "data_offset", "sample_step", "sample_span", "sample_bytes"):
        assert np.array_equal(getattr(fast, column), getattr(exact, column)), column
