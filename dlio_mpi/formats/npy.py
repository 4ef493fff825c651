"""NumPy .npy files: a standard npy header (written by numpy's own header code, so np.load reads
our files) followed by the raw array."""

from __future__ import annotations

import io
import os

import numpy as np

from ..storage import Handle, storage_for
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray
from .loader import NpyLoads


def npy_header(spec: SampleSpec) -> bytes:
    """The exact header numpy writes for `spec`'s array (format version 1.0)."""
    buf = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(spec.dtype)),
        "fortran_order": False,
        "shape": spec.array_shape,
    }
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def parse_npy_header(fp) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """Read an npy header at fp's position: (shape, dtype, fortran_order, header length)."""
    start = fp.tell()
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    return tuple(shape), dtype, fortran, fp.tell() - start


def stored_array(fp, size: int, header_start: int) -> StoredArray:
    """The npy array whose header starts at fp's position (header_start in the file)."""
    shape, dtype, fortran, header = parse_npy_header(fp)
    if fortran:
        raise ValueError("is a Fortran-ordered array, which cannot be read by sample extent")
    return StoredArray(size, header_start + header, tuple(int(d) for d in shape), dtype.str)


class NpyFormat(Format):
    """dataset.format: npy"""

    name = "npy"
    extension = "npy"
    loads_whole_array = True

    def layout(self, spec: SampleSpec) -> FileLayout:
        header = len(npy_header(spec))
        return FileLayout.for_array(spec, header, header + spec.samples * spec.sample_bytes)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        header = npy_header(spec)

        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            fs.append(handle, header)
            fs.write_random(handle, len(header), spec.samples * spec.sample_bytes, seed,
                            chunk=0, path=path)

        return staged.write(path, fill)

    def payload_extent(self, spec: SampleSpec) -> tuple[bytes, int]:
        return npy_header(spec), spec.samples * spec.sample_bytes

    def probe(self, path: str) -> StoredArray:
        with storage_for(path).stream(path) as fp:
            size = fp.seek(0, os.SEEK_END)
            fp.seek(0)
            return stored_array(fp, size, 0)

    def loader_model(self, facts, itemsize: int, samples: int) -> NpyLoads:
        return NpyLoads()

    def load_whole(self, path: str) -> np.ndarray:
        return np.load(path)
