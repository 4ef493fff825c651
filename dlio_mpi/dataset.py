"""The dataset a workload describes: DLIO's file naming and folder layout, the shape of each
file's samples (drawn so that sizes never depend on the rank count), and the byte layout table
the planner turns samples into extents with."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .formats import FileLayout, Format, SampleSpec, get_format

SPLITS = ("train", "valid")
SHAPE_SEED = 10  # DLIO seeds its global NumPy RNG with 10 before drawing file shapes
_EXACT_FROM = 2**32 - 2**20  # payloads from here on may need ZIP64 records: no shortcut


def file_relpath(split: str, index: int, count: int, subfolders: int, prefix: str,
                 extension: str) -> str:
    """DLIO's name of file `index` of `count`: <split>/[<sub>/]<prefix>_<i>_of_<N>.<ext>, the
    index zero-padded to the digits of N, the subfolder (index mod S, only when S > 1) to the
    digits of S."""
    name = f"{prefix}_{index:0{len(str(count))}d}_of_{count}.{extension}"
    if subfolders > 1:
        return os.path.join(split, f"{index % subfolders:0{len(str(subfolders))}d}", name)
    return os.path.join(split, name)


@dataclass(frozen=True)
class LayoutTable:
    """Byte layouts of all files of a split, one array entry per file (see FileLayout)."""

    size: np.ndarray
    data_offset: np.ndarray
    sample_step: np.ndarray
    sample_span: np.ndarray
    sample_bytes: np.ndarray

    @staticmethod
    def from_layouts(layouts: list[FileLayout]) -> LayoutTable:
        cols = np.array([[lay.size, lay.data_offset, lay.sample_step, lay.sample_span,
                          lay.sample_bytes] for lay in layouts], dtype=np.int64).reshape(-1, 5)
        return LayoutTable(*(np.ascontiguousarray(cols[:, k]) for k in range(5)))

    def to_array(self) -> np.ndarray:
        return np.stack([self.size, self.data_offset, self.sample_step, self.sample_span,
                         self.sample_bytes], axis=1)

    @staticmethod
    def from_array(cols: np.ndarray) -> LayoutTable:
        return LayoutTable(*(np.ascontiguousarray(cols[:, k]) for k in range(5)))


@dataclass(frozen=True)
class DatasetSplit:
    """One split (train or valid): its files, their absolute paths and per-file sample specs."""

    name: str
    root: str                  # data folder (storage_root applied)
    relpaths: tuple[str, ...]  # file paths relative to root
    shapes: np.ndarray         # (files, ndim) sample shape of each file
    dtype: str
    samples_per_file: int
    sample_layout: str
    format: Format

    @property
    def num_files(self) -> int:
        return len(self.relpaths)

    @property
    def num_samples(self) -> int:
        return self.num_files * self.samples_per_file

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.relpaths[index])

    def paths(self) -> list[str]:
        return [os.path.join(self.root, rel) for rel in self.relpaths]

    def spec(self, index: int) -> SampleSpec:
        return SampleSpec(tuple(int(d) for d in self.shapes[index]), self.dtype,
                          self.samples_per_file, self.sample_layout)

    def expected_layouts(self) -> LayoutTable:
        """Layouts of the files as this tool generates them (no I/O), vectorised: a format's
        headers only change length with the number of digits of the shape's dims (and with
        ZIP64 past 4 GiB), so one exact `format.layout` call per such class of files gives
        the header size of all of them; files near or past 4 GiB are computed one by one."""
        if self.num_files == 0:
            return LayoutTable.from_layouts([])
        shapes = np.asarray(self.shapes, dtype=np.int64)
        itemsize = np.dtype(self.dtype).itemsize
        elements = shapes.prod(axis=1)
        sample_bytes = elements * itemsize
        payload = sample_bytes * self.samples_per_file
        exact = payload >= _EXACT_FROM
        digits = np.floor(np.log10(np.maximum(shapes, 1))).astype(np.int64) + 1
        keys = np.concatenate([digits, exact[:, None].astype(np.int64)], axis=1)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        size = np.empty(self.num_files, dtype=np.int64)
        offset = np.empty(self.num_files, dtype=np.int64)
        strided = np.zeros(self.num_files, dtype=bool)
        for cls, rep in enumerate(first):
            members = inverse == cls
            layout = self.format.layout(self.spec(int(rep)))
            offset[members] = layout.data_offset
            size[members] = layout.size - payload[rep] + payload[members]
            strided[members] = layout.sample_step != layout.sample_bytes
        step = np.where(strided, itemsize, sample_bytes)
        span = np.where(strided, ((elements - 1) * self.samples_per_file + 1) * itemsize,
                        sample_bytes)
        table = LayoutTable(size, offset, step, span, sample_bytes)
        for index in np.flatnonzero(exact):  # ZIP64 and friends: no shortcut
            lay = self.format.layout(self.spec(int(index)))
            table.size[index], table.data_offset[index] = lay.size, lay.data_offset
            table.sample_step[index], table.sample_span[index] = lay.sample_step, lay.sample_span
            table.sample_bytes[index] = lay.sample_bytes
        return table


def sample_shapes(dataset, total_files: int) -> np.ndarray:
    """Per-file sample shapes for `total_files` files (train first, then valid), as DLIO draws
    them: record_dims if given, else a square side int(sqrt(L)) with, when a stdev is set, two
    Normal(side, stdev/2/sqrt(L)) draws per file from a RNG seeded to 10, truncated and >= 1."""
    if dataset.record_dims:
        return np.tile(np.asarray(dataset.record_dims, dtype=np.int64), (total_files, 1))
    length = float(dataset.record_length_bytes)
    side = int(math.sqrt(length))
    if dataset.record_length_bytes_stdev > 0:
        stdev = dataset.record_length_bytes_stdev / 2 / math.sqrt(length)
        draws = np.random.RandomState(SHAPE_SEED).normal(side, stdev, 2 * total_files)
        return np.maximum(draws.astype(np.int64), 1).reshape(total_files, 2)
    return np.full((total_files, 2), max(side, 1), dtype=np.int64)


def describe_dataset(cfg) -> dict[str, DatasetSplit]:
    """The train and valid splits of the workload `cfg` (pure computation, no I/O)."""
    ds = cfg.dataset
    fmt = get_format(ds.format)
    root = os.path.join(cfg.storage.storage_root, ds.data_folder)
    counts = {"train": ds.num_files_train, "valid": ds.num_files_eval}
    subfolders = {"train": ds.num_subfolders_train, "valid": ds.num_subfolders_eval}
    shapes = sample_shapes(ds, counts["train"] + counts["valid"])
    splits, start = {}, 0
    for split in SPLITS:
        count = counts[split]
        rel = tuple(file_relpath(split, i, count, subfolders[split], ds.file_prefix,
                                 fmt.extension) for i in range(count))
        splits[split] = DatasetSplit(split, root, rel, shapes[start:start + count],
                                     np.dtype(ds.record_element_type).str,
                                     ds.num_samples_per_file, ds.sample_layout, fmt)
        start += count
    return splits


def dlio_record_length(dataset) -> float:
    """DLIO's record length in bytes, the factor of its MB/s figures: record_dims' product
    times the element size when dims are given, else dataset.record_length_bytes."""
    if dataset.record_dims:
        return float(math.prod(dataset.record_dims) * np.dtype(dataset.record_element_type)
                     .itemsize)
    return float(dataset.record_length_bytes)
