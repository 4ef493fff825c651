"""Indexed binary files (DLIO's indexed_binary): samples concatenated raw, with `<file>.off.idx`
and `<file>.sz.idx` holding each sample's offset and size as uint64 arrays."""

from __future__ import annotations

import numpy as np

from ..storage import storage_for
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray, opened


def _read_index(path: str) -> np.ndarray:
    with storage_for(path).stream(path) as fp:
        return np.fromfile(fp, dtype=np.uint64)


class IndexedBinaryFormat(Format):
    """dataset.format: indexed_binary"""

    name = "indexed_binary"
    extension = "indexed_binary"
    indexed = True
    dlio_reads_samples = True

    def layout(self, spec: SampleSpec) -> FileLayout:
        size = spec.samples * spec.sample_bytes
        return FileLayout(size, 0, spec.sample_bytes, spec.sample_bytes, spec.sample_bytes)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        # Index files first: the data file's rename is what marks the set complete.
        self.write_side_files(path, spec, staged)
        payload = spec.samples * spec.sample_bytes
        fs = staged.storage_of(path)
        return staged.write(
            path, lambda handle: fs.write_random(handle, 0, payload, seed, chunk=0, path=path))

    def payload_extent(self, spec: SampleSpec) -> tuple[bytes, int]:
        return b"", spec.samples * spec.sample_bytes

    def write_side_files(self, path: str, spec: SampleSpec, staged: StagedWrites) -> None:
        offsets = np.arange(spec.samples, dtype=np.uint64) * np.uint64(spec.sample_bytes)
        sizes = np.full(spec.samples, spec.sample_bytes, dtype=np.uint64)
        off_path, sz_path = self.side_files(path)
        fs = staged.storage_of(path)
        staged.write(off_path, lambda handle: fs.append(handle, offsets.tobytes()))
        staged.write(sz_path, lambda handle: fs.append(handle, sizes.tobytes()))

    def probe(self, path: str) -> StoredArray:
        off_path, sz_path = self.side_files(path)
        offsets, sizes = _read_index(off_path), _read_index(sz_path)
        if len(offsets) == 0 or len(offsets) != len(sizes):
            raise ValueError(f"has index files {off_path} and {sz_path} that disagree or are "
                             "empty")
        step = int(sizes[0])
        expected = np.arange(len(offsets), dtype=np.uint64) * np.uint64(step) + offsets[0]
        if not (np.all(sizes == sizes[0]) and np.array_equal(offsets, expected)):
            raise ValueError("has samples of unequal size or not back to back, which is not "
                             "supported yet")
        with opened(path) as (fs, handle):
            size = fs.handle_size(handle)
        return StoredArray(size, int(offsets[0]), (len(offsets), step), "|u1")

    def side_files(self, path: str) -> list[str]:
        return [path + ".off.idx", path + ".sz.idx"]


class MmapIndexedBinaryFormat(IndexedBinaryFormat):
    """dataset.format: mmap_indexed_binary: the same files (DLIO writes both with one
    generator), read as DLIO's mmap reader does: the file mapped, each sample's bytes used
    through the mapping. The native engine maps each sample's extent and copies it out
    (_core.REQ_MMAP), so that every page of the sample is faulted in through the page cache,
    as a loader consuming the sample makes it be (DLIO's reader takes a slice of the mapping
    and, since it hands on a constant batch, touches none of it)."""

    name = "mmap_indexed_binary"
    extension = "mmap_indexed_binary"
    reads_by_mmap = True
