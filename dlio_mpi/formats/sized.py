"""What the formats whose file sizes depend on their content share (jpeg, png, csv): layouts
from file sizes alone, probing a file's size and first bytes, writing through a Python file
object.

Such a format sets `sizes_recorded = True`: generation records each file's size (see
data/recorded_sizes.py), reading takes the layouts from those sizes, and its `layout(spec)` is only
an estimate for the plan (dataset and epoch bytes before any file exists). Each load reads the
whole file, as DLIO's readers of these formats do (`whole_file_only`): reader.read_mode sample
is refused for them."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..storage import Handle, Storage
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray, opened

HEAD_BYTES = 64  # first bytes read to tell a file's kind


def size_columns(sizes: np.ndarray, samples: int, whole_file_sample: bool) -> np.ndarray:
    """Layout columns (size, data_offset, sample_step, sample_span, sample_bytes) of files of
    `sizes` bytes holding `samples` samples: the sample the whole file (an image, one a
    file), or the file cut in `samples` equal rows (csv: DLIO writes identical rows)."""
    size = np.asarray(sizes, dtype=np.int64)
    zero = np.zeros_like(size)
    if whole_file_sample:
        return np.stack([size, zero, size, size, size], axis=1)
    row = size // max(samples, 1)
    return np.stack([size, zero, row, row, row], axis=1)


@dataclass(frozen=True)
class StoredWhole(StoredArray):
    """A file read whole (image, text table) holding an array of `shape`: its samples are the
    whole file (`whole_file_sample`), or rows of it."""

    whole_file_sample: bool = False

    def as_samples(self, samples: int, preferred: str) -> SampleSpec:
        if self.whole_file_sample:
            return SampleSpec(tuple(self.shape), self.dtype, samples, "first_axis")
        if self.shape[0] != samples:
            raise ValueError(f"holds {self.shape[0]} rows where dataset.num_samples_per_file="
                             f"{samples}")
        return SampleSpec(tuple(self.shape[1:]), self.dtype, samples, "first_axis")

    def layout(self, spec: SampleSpec) -> FileLayout:
        cols = size_columns(np.array([self.size]), spec.samples, self.whole_file_sample)[0]
        return FileLayout(*(int(c) for c in cols))


class SizedFormat(Format):
    """Base of the formats whose sizes are recorded: what is common to their protocol."""

    name = ""
    written_whole = "each file is encoded whole"
    extension = ""
    sizes_recorded = True
    whole_file_only = True
    whole_file_sample = True  # every sample of a file is all of it (images)
    loads_whole_array = True

    def check_dataset(self, ds) -> None:
        if ds.record_element_type != "uint8":
            raise ConfigError(f"dataset.record_element_type: {ds.format} stores uint8 only "
                              f"(DLIO's generator draws uint8 values), got "
                              f"{ds.record_element_type!r}")
        if ds.compression != "none":
            raise ConfigError(f"dataset.compression: {ds.compression} with dataset.format "
                              f"{ds.format} is not implemented yet (DLIO's {ds.format} "
                              "generator writes uncompressed files: its csv compression never "
                              "acts from YAML); expected none")

    def estimated_sizes(self, sample_bytes: np.ndarray, samples: int) -> np.ndarray:
        """Rough sizes of files of samples of `sample_bytes` (int64 array) bytes."""
        raise NotImplementedError

    def layout_columns(self, sample_bytes: np.ndarray, samples: int) -> np.ndarray:
        """Estimated layouts of many files at once (dataset.ComputedLayouts): the plan's byte
        counts before any file exists, never the reads."""
        n = np.asarray(sample_bytes, dtype=np.int64)
        return size_columns(self.estimated_sizes(n, samples), samples, self.whole_file_sample)

    def layout(self, spec: SampleSpec) -> FileLayout:
        """An estimate (see layout_columns)."""
        cols = self.layout_columns(np.array([spec.sample_bytes]), spec.samples)[0]
        return FileLayout(*(int(c) for c in cols))

    def size_columns(self, sizes: np.ndarray, samples: int) -> np.ndarray:
        """Layout columns of files of these (recorded or probed) sizes."""
        return size_columns(sizes, samples, self.whole_file_sample)

    def check_head(self, head: bytes) -> str:
        """Why a file starting with `head` is not of this format ('' when it is)."""
        raise NotImplementedError

    def probe_record(self, path: str) -> int:
        return self.probe_size(path)

    def probe_size(self, path: str) -> int:
        """The size of the file at `path`, after checking its first bytes are this format's
        (ValueError naming it otherwise): what every file of foreign data costs."""
        with opened(path) as (fs, handle):
            size = fs.handle_size(handle)
            why = self.check_head(fs.read_at(handle, HEAD_BYTES, 0))
        if why:
            raise ValueError(f"{path} is not a {self.name} file: {why}")
        return size

    def write_bytes(self, path: str, staged: StagedWrites, render) -> int:
        """Write `render(file object)`'s output as the file at `path` through `staged` (its
        write calls timed as the storage's, the rendering not)."""
        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            with _TimedWrites(fs, handle, staged) as raw, io.BufferedWriter(raw, 1 << 20) as fp:
                render(fp)

        return staged.write(path, fill)


class _TimedWrites(io.RawIOBase):
    """A handle's writes (not closed here), each timed into staged.storage_ns."""

    def __init__(self, fs: Storage, handle: Handle, staged: StagedWrites) -> None:
        super().__init__()
        self.fs, self.handle, self.staged = fs, handle, staged

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self.staged.timed(self.fs.append, self.handle, data)


def payload_values(seed: int, count: int) -> np.ndarray:
    """`count` pseudo-random uint8 values in [0, 255) from the file's seed (DLIO draws
    np.random.randint(255)): the same seed, the same file."""
    return np.random.default_rng(seed).integers(0, 255, size=count, dtype=np.uint8)
