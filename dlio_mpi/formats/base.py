"""What every format module provides: the shape of a sample, a file's byte layout, and the
small protocol a format implements."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SampleSpec:
    """What one file holds: `samples` samples of `shape` elements of `dtype`.

    `layout` is where the sample index sits in array formats: "first_axis" (one sample is one
    contiguous extent, as real datasets store them) or "last_axis" (DLIO's npy/npz layout)."""

    shape: tuple[int, ...]
    dtype: str
    samples: int
    layout: str = "first_axis"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def sample_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def array_shape(self) -> tuple[int, ...]:
        """Shape of the whole per-file array as stored."""
        if self.layout == "last_axis":
            return (*self.shape, self.samples)
        return (self.samples, *self.shape)


@dataclass(frozen=True)
class FileLayout:
    """Where samples sit in one file: sample i occupies
    [data_offset + i*sample_step, data_offset + i*sample_step + sample_span).

    For a first-axis layout step == span == sample_bytes; for a last-axis layout the sample is
    strided, step is one element and span the extent that covers all its elements."""

    size: int          # file size in bytes
    data_offset: int   # byte offset of sample 0
    sample_step: int   # distance between the first bytes of consecutive samples
    sample_span: int   # bytes covering one sample
    sample_bytes: int  # payload bytes of one sample

    @staticmethod
    def for_array(spec: SampleSpec, data_offset: int, size: int) -> FileLayout:
        """Layout of `spec`'s array stored contiguously (C order) from `data_offset`."""
        if spec.layout == "last_axis" and spec.samples > 1:
            elements = math.prod(spec.shape)
            step = spec.itemsize
            span = ((elements - 1) * spec.samples + 1) * spec.itemsize
        else:
            step = span = spec.sample_bytes
        return FileLayout(size, data_offset, step, span, spec.sample_bytes)


class Format(Protocol):
    """One dataset format. `write` must leave `path` complete or absent: it writes temporary
    names and renames them last (the data file after any side files)."""

    name: str
    extension: str

    def layout(self, spec: SampleSpec) -> FileLayout:
        """Byte layout of a file this format writes for `spec` (no I/O)."""
        ...

    def write(self, path: str, spec: SampleSpec, seed: int) -> int:
        """Write one complete file with pseudo-random payload from `seed`; return its size."""
        ...

    def probe(self, path: str, layout: str) -> FileLayout:
        """Layout of an existing file, read from its header (for data we did not generate);
        `layout` says which array axis indexes samples."""
        ...

    def side_files(self, path: str) -> list[str]:
        """Other files that belong to the data file at `path` (index files)."""
        ...


def tmp_name(path: str) -> str:
    """The temporary name a file is written under before the rename that completes it."""
    return path + ".tmp"


def write_atomically(path: str, fill) -> int:
    """Create `path`.tmp, let `fill(fd)` write it, flush it to storage, then rename it to
    `path`; return the size. A crash leaves only the .tmp file, which a rerun overwrites."""
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fill(fd)
        os.fsync(fd)  # the rename below must never expose a file whose data is not on disk
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return size
