"""DLIO's file naming and the seeded per-file sample shapes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dlio_mpi.data.dataset import (
    COLUMNS,
    ComputedLayouts,
    DatasetSplit,
    FileNaming,
    ListedLayouts,
    ShiftedLayouts,
    file_relpath,
    sample_shapes,
)
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


def test_square_shapes_without_stdev_are_one_shared_row():
    assert sample_shapes(_dataset(), 3).tolist() == [[256, 256]]


def test_stdev_shapes_are_seeded_and_do_not_depend_on_how_many_are_asked():
    ds = _dataset(record_length_bytes=1_000_000, record_length_bytes_stdev=200_000)
    a, b = sample_shapes(ds, 10), sample_shapes(ds, 20)
    assert np.array_equal(a, b[:10])
    sizes = a.prod(axis=1)
    assert len(set(sizes.tolist())) > 1 and abs(sizes.mean() - 1e6) < 2e5


def test_record_dims_give_an_explicit_shape():
    assert sample_shapes(_dataset(record_dims=(3, 224, 224)), 2).tolist() == [[3, 224, 224]]


def test_shapes_drawn_in_chunks_equal_dlios_single_draw():
    ds = _dataset(record_length_bytes=146600628, record_length_bytes_stdev=68341808)
    total = (1 << 20) // 2 + 3  # more draws than one chunk
    side, stdev = int(np.sqrt(146600628)), 68341808 / 2 / np.sqrt(146600628)
    dlio = np.random.RandomState(10).normal(side, stdev, 2 * total)
    expected = np.array([max(int(d), 1) for d in dlio]).reshape(total, 2)
    assert np.array_equal(sample_shapes(ds, total), expected)


def test_names_are_computed_and_match_the_engine_pattern():
    naming = FileNaming("/d", "train", 32, 16, "img", "npz")
    assert naming.path(17) == "/d/train/01/img_17_of_32.npz"
    assert naming.folders()[:2] == ["/d/train/00", "/d/train/01"]
    folder, subs, sub_digits, stem, digits, tail = naming.pattern()
    i = 17
    assert f"{folder}/{i % subs:0{sub_digits}d}/{stem}{i:0{digits}d}{tail}" == naming.path(i)


@pytest.mark.parametrize("fmt_name", ["npy", "npz", "indexed_binary"])
@pytest.mark.parametrize("layout,samples,dtype", [("first_axis", 1, "|u1"),
                                                  ("first_axis", 3, "<f4"),
                                                  ("last_axis", 3, "|u1")])
def test_vectorised_layouts_equal_the_exact_per_file_layouts(fmt_name, layout, samples, dtype):
    rng = np.random.default_rng(1)
    shapes = np.stack([rng.integers(1, 20000, 300), rng.integers(1, 120, 300)], axis=1)
    shapes[7] = (70000, 70000)  # a payload past 4 GiB: ZIP64 records in npz
    shapes[8] = (65535, 65535)  # just under: still no shortcut near the limit
    fmt = get_format(fmt_name)
    split = DatasetSplit("train", FileNaming("/nonexistent", "train", 300, 0, "f", "x"),
                         shapes.astype(np.int32), dtype, samples, layout, fmt)
    exact = ListedLayouts.from_layouts([fmt.layout(split.spec(i)) for i in range(300)])
    fast = split.expected_layouts()
    files = np.arange(300)
    for column in COLUMNS:
        assert np.array_equal(getattr(fast.take(files), column),
                              getattr(exact.take(files), column)), column
        assert fast.total(column) == exact.total(column)
    some = np.array([299, 7, 0, 7])
    assert np.array_equal(fast.take(some).size, exact.take(some).size)


def test_uniform_layouts_cost_nothing_per_file_and_sum_exactly():
    table = ComputedLayouts(10**7, np.array([[338, 338]]), "|u1", 100, "first_axis",
                            get_format("npz"))
    one = table.layout(12345)
    assert table.total("size") == one.size * 10**7
    assert table.total("sample_span") == 338 * 338 * 10**7
    assert np.array_equal(table.take(np.array([0, 9999999])).size, [one.size] * 2)


def test_shifted_layouts_add_a_constant_header_difference():
    base = ListedLayouts(np.array([[1000, 100, 50, 50, 50], [2000, 200, 60, 60, 60]]))
    shifted = ShiftedLayouts(base, 20, 27)
    lay = shifted.take(np.array([1, 0]))
    assert list(lay.data_offset) == [220, 120] and list(lay.size) == [2027, 1027]
    assert shifted.total("size") == 3000 + 54
