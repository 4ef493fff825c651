"""NumPy .npy files: a standard npy header (written by numpy's own header code, so np.load reads
our files) followed by the raw array."""

from __future__ import annotations

import io
import os

import numpy as np

from .. import _core
from .base import FileLayout, SampleSpec, write_atomically


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


def spec_from_array(
    shape: tuple[int, ...], dtype: np.dtype, fortran: bool, layout: str
) -> SampleSpec:
    """Interpret a stored array as samples. Which axis indexes samples cannot be read from the
    file, so the caller says (dataset.sample_layout: DLIO writes last_axis)."""
    if fortran or len(shape) < 1:
        raise ValueError("Fortran-ordered and 0-d arrays are not supported")
    if layout == "last_axis":
        return SampleSpec(tuple(shape[:-1]), dtype.str, int(shape[-1]), "last_axis")
    return SampleSpec(tuple(shape[1:]), dtype.str, int(shape[0]), "first_axis")


class NpyFormat:
    """dataset.format: npy"""

    name = "npy"
    extension = "npy"

    def layout(self, spec: SampleSpec) -> FileLayout:
        header = len(npy_header(spec))
        return FileLayout.for_array(spec, header, header + spec.samples * spec.sample_bytes)

    def write(self, path: str, spec: SampleSpec, seed: int) -> int:
        header = npy_header(spec)

        def fill(fd: int) -> None:
            os.write(fd, header)
            _core.write_random(fd, len(header), spec.samples * spec.sample_bytes, seed, 0, path)

        return write_atomically(path, fill)

    def probe(self, path: str, layout: str) -> FileLayout:
        with open(path, "rb") as fp:
            shape, dtype, fortran, header = parse_npy_header(fp)
            size = os.fstat(fp.fileno()).st_size
        return FileLayout.for_array(spec_from_array(shape, dtype, fortran, layout), header, size)

    def side_files(self, path: str) -> list[str]:
        return []
