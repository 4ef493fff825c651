"""Turns a rank's shard of sample ids into batches of read requests (file, offset, length) that
the C engine executes without Python.

Read modes (reader.read_mode):
- sample:    the exact extent of each sample (what a careful loader reads);
- file:      the whole file for every sample, like np.load in DLIO's on_demand mode;
- file_once: the whole file the first time one of its samples is needed in the epoch, later
             samples of that file come from memory (DLIO's memory mode)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dataset import LayoutTable

READ_MODES = ("sample", "file", "file_once")


@dataclass(frozen=True)
class ReadPlan:
    """One epoch of one rank: batch b issues requests [batch_start[b], batch_start[b+1])."""

    sample_ids: np.ndarray   # ids consumed, in order (steps * batch_size)
    batch_start: np.ndarray  # (steps + 1,)
    file_idx: np.ndarray     # (requests,)
    offset: np.ndarray
    length: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.batch_start) - 1

    @property
    def bytes_requested(self) -> int:
        return int(self.length.sum())


def plan_reads(shard: np.ndarray, steps: int, batch_size: int, samples_per_file: int,
               layouts: LayoutTable, mode: str) -> ReadPlan:
    """Requests for the first steps*batch_size ids of `shard`."""
    ids = np.ascontiguousarray(shard[: steps * batch_size], dtype=np.int64)
    files = ids // samples_per_file
    batch_start = np.arange(steps + 1, dtype=np.int64) * batch_size
    if mode == "sample":
        index = ids % samples_per_file
        offset = layouts.data_offset[files] + index * layouts.sample_step[files]
        length = layouts.sample_span[files]
    elif mode == "file":
        offset = np.zeros(len(ids), dtype=np.int64)
        length = layouts.size[files]
    elif mode == "file_once":
        _, first = np.unique(files, return_index=True)
        first.sort()
        files = files[first]
        offset = np.zeros(len(first), dtype=np.int64)
        length = layouts.size[files]
        per_batch = np.bincount(first // batch_size, minlength=steps)
        batch_start = np.concatenate(([0], np.cumsum(per_batch))).astype(np.int64)
    else:
        raise ValueError(f"unknown read mode {mode!r}; expected one of {READ_MODES}")
    return ReadPlan(ids, batch_start, np.ascontiguousarray(files, dtype=np.int64),
                    np.ascontiguousarray(offset, dtype=np.int64),
                    np.ascontiguousarray(length, dtype=np.int64))
