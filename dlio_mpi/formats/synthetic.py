"""Synthetic data (DLIO's `synthetic` format): files exist, nothing is read from them. DLIO
writes each file with its index as text and its reader hands on an in-memory sample without
opening anything; here each file is created empty (its bytes are never read) and every batch
is planned with no request at all: a compute-only baseline, whose AU and step times are the
emulator's and the MPI barrier's alone."""

from __future__ import annotations

from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray


class SyntheticFormat(Format):
    """dataset.format: synthetic"""

    name = "synthetic"
    written_whole = "it holds no payload"
    extension = "synthetic"
    reads_by_mmap = False
    reads_nothing = True

    def layout(self, spec: SampleSpec) -> FileLayout:
        return FileLayout(0, 0, 0, 0, spec.sample_bytes)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        return staged.write(path, lambda handle: None)

    def probe(self, path: str) -> StoredArray:
        raise ValueError("is a synthetic data file: nothing is read from it, so any file of "
                         "that name will do; generate the dataset with dlio-mpi to use it")
