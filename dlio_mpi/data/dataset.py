"""The dataset a workload describes: DLIO's file naming and folder layout, the shape of each
file's samples (drawn so that sizes never depend on the rank count) and the byte layouts the
planner turns samples into extents with.

Everything here is computed, not listed, so that a split of 10^7 files costs a few bytes per
file at most: names come from a formula, per-file shapes are kept as int32 dims (or one row
when all files are alike), and layouts are derived from the dims for the files a batch needs."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from ..formats import FileLayout, Format, SampleSpec, UnitExtents, format_for

SPLITS = ("train", "valid")
SHAPE_SEED = 10  # DLIO seeds its global NumPy RNG with 10 before drawing file shapes
SHAPE_CHUNK = 1 << 20  # draws at a time (an even number keeps the normal stream intact)
# Payloads near 4 GiB may need some ZIP64 records and not others: computed one by one. Past
# that band every offset of the file needs them, and the header lengths are a class again.
_EXACT_FROM, _EXACT_TO = 2**32 - 2**20, 2**32 + 2**20
COLUMNS = ("size", "data_offset", "sample_step", "sample_span", "sample_bytes")
_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


@dataclass(frozen=True)
class FileNaming:
    """DLIO's names of one split's files: <root>/<split>/[<sub>/]<prefix>_<i>_of_<N>.<ext>,
    i zero-padded to the digits of N, the subfolder (i mod S, only when S > 1) to the digits
    of S."""

    root: str
    split: str
    count: int
    subfolders: int
    prefix: str
    extension: str

    def relpath(self, index: int) -> str:
        name = f"{self.prefix}_{index:0{len(str(self.count))}d}_of_{self.count}.{self.extension}"
        if self.subfolders > 1:
            sub = f"{index % self.subfolders:0{len(str(self.subfolders))}d}"
            return os.path.join(self.split, sub, name)
        return os.path.join(self.split, name)

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.relpath(index))

    def folders(self) -> list[str]:
        """The folders the files live in."""
        top = os.path.join(self.root, self.split)
        if self.subfolders > 1 and self.count:
            width = len(str(self.subfolders))
            return [os.path.join(top, f"{s:0{width}d}")
                    for s in range(min(self.subfolders, self.count))]
        return [top]

    def pattern(self) -> tuple[str, int, int, str, int, str]:
        """The naming as the C engine's file pattern: (folder, subfolders, subfolder digits,
        stem before the index, index digits, rest of the name)."""
        return (os.path.join(self.root, self.split), self.subfolders,
                len(str(self.subfolders)), f"{self.prefix}_", len(str(self.count)),
                f"_of_{self.count}.{self.extension}")


def file_relpath(split: str, index: int, count: int, subfolders: int, prefix: str,
                 extension: str) -> str:
    """DLIO's name of file `index` of `count` (see FileNaming)."""
    return FileNaming("", split, count, subfolders, prefix, extension).relpath(index)


@dataclass(frozen=True)
class Layouts:
    """Byte layouts of some files (see FileLayout), one array entry per file."""

    size: np.ndarray
    data_offset: np.ndarray
    sample_step: np.ndarray
    sample_span: np.ndarray
    sample_bytes: np.ndarray
    units: UnitExtents | None = None  # the read units of each file, when recorded per file

    @staticmethod
    def from_columns(cols: np.ndarray, units: UnitExtents | None = None) -> Layouts:
        return Layouts(*(np.ascontiguousarray(cols[:, k]) for k in range(len(COLUMNS))),
                       units=units)


class LayoutTable:
    """Byte layouts of all files of a split, looked up for the files a batch needs."""

    count: int

    def take(self, files: np.ndarray) -> Layouts:
        """The layouts of `files` (file indices), in that order."""
        raise NotImplementedError

    def total(self, column: str) -> int:
        """The exact sum of a column over all files (Python int: no overflow)."""
        raise NotImplementedError

    def layout(self, index: int) -> FileLayout:
        lay = self.take(np.array([index], dtype=np.int64))
        return FileLayout(*(int(getattr(lay, c)[0]) for c in COLUMNS))

    ragged = False  # the files' samples are read by units (units()), not affine extents

    def units(self) -> UnitExtents | None:
        """The read units shared by every file (ragged formats: parquet's row groups), or
        None when samples sit at affine extents (or the units are not known)."""
        return None


class ListedLayouts(LayoutTable):
    """Layouts listed file by file (probed from files another tool wrote). `computed`: the
    computed layouts whose read units the files share (a ragged format's probe accepts only
    files laid out as computed)."""

    def __init__(self, cols: np.ndarray, computed: LayoutTable | None = None) -> None:
        self.cols = np.asarray(cols, dtype=np.int64).reshape(-1, len(COLUMNS))
        self.count = len(self.cols)
        self.computed = computed
        self.ragged = computed is not None and computed.ragged

    def units(self) -> UnitExtents | None:
        return self.computed.units() if self.computed is not None else None

    @staticmethod
    def from_layouts(layouts: list[FileLayout]) -> ListedLayouts:
        return ListedLayouts(np.array([[getattr(lay, c) for c in COLUMNS] for lay in layouts],
                                      dtype=np.int64))

    def take(self, files: np.ndarray) -> Layouts:
        return Layouts.from_columns(self.cols[files])

    def total(self, column: str) -> int:
        return int(self.cols[:, COLUMNS.index(column)].sum(dtype=object))


class ComputedLayouts(LayoutTable):
    """Layouts of the files this tool writes (or DLIO writes: same shapes, same headers),
    derived from each file's sample dims. A format's header only changes length with the
    number of digits of the dims (and with ZIP64 past 4 GiB), so one exact `format.layout`
    per class of digit counts gives every file's header; files near or past 4 GiB are computed
    one by one. A format whose sample extents are framed by varint lengths (tfrecord) gives
    every file's layout itself, from its sample bytes (`layout_columns`). `dims` has one row
    per file, or one row shared by all."""

    def __init__(self, count: int, dims: np.ndarray, dtype: str, samples_per_file: int,
                 sample_layout: str, fmt: Format) -> None:
        self.count, self.dims = count, np.asarray(dims)
        self.dtype, self.samples, self.sample_layout, self.format = (
            dtype, samples_per_file, sample_layout, fmt)
        self.itemsize = np.dtype(dtype).itemsize
        self._classes: dict[tuple, tuple[int, int, bool]] = {}
        self._totals: dict[str, int] | None = None
        self._by_sample_bytes = fmt.layout_columns
        self.ragged = fmt.unit_extents is not None

    def units(self) -> UnitExtents | None:
        if not self.ragged:
            return None
        if len(self.dims) != 1:  # such files' units are recorded (SizedLayouts), not computed
            return None
        return self.format.unit_extents(self._spec(self.dims[0]))

    def _spec(self, dims) -> SampleSpec:
        return SampleSpec(tuple(int(d) for d in dims), self.dtype, self.samples,
                          self.sample_layout)

    def _class(self, key: tuple, dims) -> tuple[int, int, bool]:
        """(header bytes before the payload, bytes after it, strided) of a digit class."""
        if key not in self._classes:
            spec = self._spec(dims)
            lay = self.format.layout(spec)
            payload = spec.sample_bytes * self.samples
            self._classes[key] = (lay.data_offset, lay.size - lay.data_offset - payload,
                                  lay.sample_step != lay.sample_bytes)
        return self._classes[key]

    def _digit_classes(self, dims: np.ndarray, elements: np.ndarray):
        """Each file's class (the digit count of each dim, and whether it is past the 4 GiB
        band): (head, tail, strided per class; each file's class index)."""
        digits = np.searchsorted(_POWERS_OF_TEN, dims, side="right")  # digits - 1 per dim
        past = elements * (self.itemsize * self.samples) >= _EXACT_TO
        digits = np.concatenate([digits, past[:, None].astype(np.int64)], axis=1)
        keys = digits @ (21 ** np.arange(digits.shape[1], dtype=np.int64))
        if len(keys) and keys.max() < 1 << 20:  # few digit classes: a lookup, not a sort
            seen = np.bincount(keys)
            classes = np.flatnonzero(seen)
            lookup = np.zeros(len(seen), dtype=np.int64)
            lookup[classes] = np.arange(len(classes))
            inverse = lookup[keys]
            first = np.zeros(len(classes), dtype=np.int64)
            first[inverse] = np.arange(len(keys))  # some member of each class: all alike
        else:
            classes, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        table = np.array([self._class(tuple(digits[i]), dims[i]) for i in first],
                         dtype=np.int64).reshape(len(classes), 3)
        return table, inverse.reshape(-1)

    def _columns(self, dims: np.ndarray, exact: bool = True) -> np.ndarray:
        """The layout columns of files with these dims (exact: files near or past 4 GiB
        computed one by one)."""
        dims = np.asarray(dims, dtype=np.int64)
        elements = dims.prod(axis=1)
        sample_bytes = elements * self.itemsize
        if self._by_sample_bytes is not None:
            return self._by_sample_bytes(sample_bytes, self.samples)
        payload = sample_bytes * self.samples
        table, inverse = self._digit_classes(dims, elements)
        head, tail, strided = table[inverse, 0], table[inverse, 1], table[inverse, 2] != 0
        step = np.where(strided, self.itemsize, sample_bytes)
        span = np.where(strided, ((elements - 1) * self.samples + 1) * self.itemsize,
                        sample_bytes)
        cols = np.stack([head + payload + tail, head, step, span, sample_bytes], axis=1)
        band = (payload >= _EXACT_FROM) & (payload < _EXACT_TO)
        for i in np.flatnonzero(band) if exact else ():  # some ZIP64 records, not others
            lay = self.format.layout(self._spec(dims[i]))
            cols[i] = [getattr(lay, c) for c in COLUMNS]
        return cols

    def _chunk_sums(self, dims: np.ndarray) -> list[int]:
        """The column sums of some files without building their columns (the same formulas
        as _columns, summed class by class)."""
        if self._by_sample_bytes is not None:
            return [int(v) for v in self._columns(dims).sum(axis=0)]
        dims = np.asarray(dims, dtype=np.int64)
        elements = dims.prod(axis=1)
        table, inverse = self._digit_classes(dims, elements)
        per_class = np.bincount(inverse, minlength=len(table))
        head = int(per_class @ table[:, 0])
        tail = int(per_class @ table[:, 1])
        strided = bool(table[:, 2].any())  # the axis and sample count decide, not the class
        n, count, item = len(elements), int(elements.sum()), self.itemsize
        span = ((count - n) * self.samples + n) * item if strided else count * item
        sums = [head + tail + count * item * self.samples, head,
                n * item if strided else count * item, span, count * item]
        payload = elements * item * self.samples
        big = np.flatnonzero((payload >= _EXACT_FROM) & (payload < _EXACT_TO))
        if len(big):  # swap the shortcut values of the ZIP64 files for the exact ones
            rough = self._columns(dims[big], exact=False)
            exact = self._columns(dims[big])
            sums = [a + int(b) for a, b in zip(sums, exact.sum(axis=0) - rough.sum(axis=0))]
        return sums

    def take(self, files: np.ndarray) -> Layouts:
        if len(self.dims) == 1:
            row = self._columns(self.dims)
            return Layouts.from_columns(np.broadcast_to(row, (len(files), len(COLUMNS))))
        return Layouts.from_columns(self._columns(self.dims[np.asarray(files)]))

    def total(self, column: str) -> int:
        if self._totals is None:  # every column in one pass, chunk by chunk (int64 sums of
            # a chunk cannot overflow; the chunks add up as Python ints)
            if len(self.dims) == 1:
                sums = [int(v) * self.count for v in self._columns(self.dims)[0]]
            else:
                sums = [0] * len(COLUMNS)
                for i in range(0, len(self.dims), SHAPE_CHUNK):
                    part = self._chunk_sums(self.dims[i:i + SHAPE_CHUNK])
                    sums = [a + b for a, b in zip(sums, part)]
            self._totals = dict(zip(COLUMNS, sums))
        return self._totals[column]


class SizedLayouts(LayoutTable):
    """Layouts of files whose sizes depend on their content (jpeg, png, csv), held as one
    int64 size per file (recorded at generation, or probed): the columns are derived from the
    sizes for the files taken (the format's size_columns). A format recording a row per file
    (recorded_sizes.py; parquet) derives the columns from the rows, and its read units too
    (the format's recorded_units)."""

    def __init__(self, sizes: np.ndarray, samples_per_file: int, fmt: Format) -> None:
        self.sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        self.count, self.samples, self.format = len(self.sizes), samples_per_file, fmt
        self.ragged = fmt.recorded_units is not None
        self._units: UnitExtents | None = None

    def units(self) -> UnitExtents | None:
        if self.ragged and self._units is None:
            self._units = self.format.recorded_units(self.sizes)
        return self._units

    def take(self, files: np.ndarray) -> Layouts:
        files = np.asarray(files)
        return Layouts.from_columns(self.format.size_columns(self.sizes[files], self.samples),
                                    self.units().of(files) if self.ragged else None)

    def total(self, column: str) -> int:
        # chunk by chunk: int64 sums of a chunk cannot overflow, the chunks add up as ints
        return sum(int(getattr(self.take(np.arange(i, min(i + SHAPE_CHUNK, self.count))),
                               column).sum()) for i in range(0, self.count, SHAPE_CHUNK))


class ShiftedLayouts(LayoutTable):
    """Computed layouts of files another tool wrote with the same shapes but a constant
    difference in header bytes before the payload and in file size (np.savez's ZIP64 fields
    and int64 labels, for DLIO's npz)."""

    def __init__(self, base: LayoutTable, offset_delta: int, size_delta: int) -> None:
        self.base, self.offset_delta, self.size_delta = base, offset_delta, size_delta
        self.count = base.count
        self.ragged = base.ragged

    def units(self) -> UnitExtents | None:
        return self.base.units() if self.offset_delta == self.size_delta == 0 else None

    def take(self, files: np.ndarray) -> Layouts:
        lay = self.base.take(files)
        return Layouts(lay.size + self.size_delta, lay.data_offset + self.offset_delta,
                       lay.sample_step, lay.sample_span, lay.sample_bytes)

    def total(self, column: str) -> int:
        delta = {"size": self.size_delta, "data_offset": self.offset_delta}.get(column, 0)
        return self.base.total(column) + delta * self.count


@dataclass(frozen=True)
class DatasetSplit:
    """One split (train or valid): its file naming and per-file sample dims."""

    name: str
    naming: FileNaming
    dims: np.ndarray           # (files, ndim) int32, or (1, ndim) when all files are alike
    dtype: str
    samples_per_file: int
    sample_layout: str
    format: Format

    @property
    def root(self) -> str:
        return self.naming.root

    @property
    def num_files(self) -> int:
        return self.naming.count

    @property
    def num_samples(self) -> int:
        return self.num_files * self.samples_per_file

    def path(self, index: int) -> str:
        return self.naming.path(index)

    def paths(self) -> list[str]:
        """Every file's path (O(files): for small splits and tests)."""
        return [self.naming.path(i) for i in range(self.num_files)]

    def file_dims(self, index: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.dims[0 if len(self.dims) == 1 else index])

    def spec(self, index: int) -> SampleSpec:
        return SampleSpec(self.file_dims(index), self.dtype, self.samples_per_file,
                          self.sample_layout)

    def expected_layouts(self, sample_layout: str | None = None) -> ComputedLayouts:
        """Layouts of the files as generated (no I/O), with samples on `sample_layout`'s axis
        (default: the configured one)."""
        return ComputedLayouts(self.num_files, self.dims, self.dtype, self.samples_per_file,
                               sample_layout or self.sample_layout, self.format)


def sample_shapes(dataset, total_files: int) -> np.ndarray:
    """Per-file sample dims for `total_files` files (train first, then valid), as DLIO draws
    them: record_dims if given, else a square side int(sqrt(L)) with, when a stdev is set, two
    Normal(side, stdev/2/sqrt(L)) draws per file from a RNG seeded to 10, truncated and >= 1.
    Returns one row shared by all files when they are all alike, else int32 rows (drawn in
    chunks: the legacy normal stream does not depend on how the draws are split)."""
    if dataset.record_dims:
        return np.asarray([dataset.record_dims], dtype=np.int64)
    length = float(dataset.record_length_bytes)
    side = int(math.sqrt(length))
    if dataset.record_length_bytes_stdev <= 0 or total_files == 0:
        return np.full((1, 2), max(side, 1), dtype=np.int64)
    stdev = dataset.record_length_bytes_stdev / 2 / math.sqrt(length)
    rng = np.random.RandomState(SHAPE_SEED)
    dims = np.empty(2 * total_files, dtype=np.int32)
    for start in range(0, 2 * total_files, SHAPE_CHUNK):
        draws = rng.normal(side, stdev, min(SHAPE_CHUNK, 2 * total_files - start))
        dims[start:start + len(draws)] = np.clip(draws, 1, 2**31 - 1).astype(np.int32)
    return dims.reshape(total_files, 2)


def describe_dataset(cfg) -> dict[str, DatasetSplit]:
    """The train and valid splits of the workload `cfg` (pure computation, no I/O)."""
    ds = cfg.dataset
    fmt = format_for(ds)
    root = os.path.join(cfg.storage.storage_root, ds.data_folder)
    counts = {"train": ds.num_files_train, "valid": ds.num_files_eval}
    subfolders = {"train": ds.num_subfolders_train, "valid": ds.num_subfolders_eval}
    dims = sample_shapes(ds, counts["train"] + counts["valid"])
    splits, start = {}, 0
    for split in SPLITS:
        count = counts[split]
        naming = FileNaming(root, split, count, subfolders[split], ds.file_prefix,
                            fmt.extension)
        own = dims if len(dims) == 1 else dims[start:start + count]
        splits[split] = DatasetSplit(split, naming, own, np.dtype(ds.record_element_type).str,
                                     ds.num_samples_per_file, ds.sample_layout, fmt)
        start += count
    return splits


def decoded_item(cfg) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the sample DLIO's readers hand to the loader after a read (its
    `resized_image`): reader.transformed_record_dims of reader.transformed_record_element_type
    when set, else a (d, d) uint8 image, d = int(sqrt(dataset.record_length_bytes_resize)) when
    that is set, else int(sqrt(record length)) (DLIO's max_dimension)."""
    rd = cfg.reader
    if rd.transformed_record_dims:
        return tuple(int(d) for d in rd.transformed_record_dims), \
            np.dtype(rd.transformed_record_element_type).str
    resize = cfg.dataset.record_length_bytes_resize
    side = max(int(math.sqrt(resize if resize > 0 else dlio_record_length(cfg.dataset))), 1)
    return (side, side), np.dtype(np.uint8).str


def dlio_record_length(dataset) -> float:
    """DLIO's record length in bytes, the factor of its MB/s figures: record_dims' product
    times the element size when dims are given, else dataset.record_length_bytes."""
    if dataset.record_dims:
        return float(math.prod(dataset.record_dims) * np.dtype(dataset.record_element_type)
                     .itemsize)
    return float(dataset.record_length_bytes)
