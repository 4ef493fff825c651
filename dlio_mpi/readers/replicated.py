"""reader.staging: replicated: every rank reads every file of the split once, whole, into its
own memory before the first epoch, then serves its batches from there: no exchange, no file
opened while training. What ML-on-HPC I/O studies saw PyTorch jobs do (Horovod MNIST on GPFS,
32 processes on 8 nodes: each read the whole shared file, then trained from memory): the file
system sees ranks x dataset bytes at start-up and nothing after.

- Staging: when the backend opens (before the first epoch), timed from a barrier to a barrier
  (readers/staging.py, as read_once's): each rank opens every file once and reads it whole
  (reads of 64 MiB, O_DIRECT with reader.odirect). describe()["staging"]: files, opens and
  bytes read from the file system (all ranks: ranks x dataset bytes), seconds, GiB/s, memory
  per rank and per node.
- reader.keep_data: false reads every file the same way into one reused buffer (the start-up
  storm without the memory, at any scale); its batches are then served with no bytes.
- A step's batch: its samples copied from the rank's copy into a batch buffer, in batch order;
  the batch is ready when the copy is done. The step's bytes are the bytes copied (none from
  storage); each request's latency its step's copy time."""

from __future__ import annotations

import os

import numpy as np

from .. import _core
from ..data.catalog import SplitFiles
from ..sampling.requests import ReadPlan
from .base import BatchStats, ReaderBackend, ReaderOptions
from .read_once import VERIFY_ENV
from .staging import (
    CHUNK,
    anonymous_memory,
    padded,
    rank_nodes,
    read_whole,
    sample_places,
    staging_record,
    timed_staging,
    verify_samples,
)


class ReplicatedReader(ReaderBackend):
    """A ReaderBackend serving a split from a copy of it in every rank's memory (collective
    construction: the staging's barriers)."""

    def __init__(self, files: SplitFiles, options: ReaderOptions, comm) -> None:
        from mpi4py import MPI

        self.MPI, self.comm, self.files = MPI, comm, files
        self.keep = self.delivers_samples = options.keep_data
        self.odirect = options.odirect
        self.verify = bool(os.environ.get(VERIFY_ENV)) and self.keep
        self.layout = files.layouts.take(np.arange(files.count, dtype=np.int64))
        self.sizes = self.layout.size.astype(np.int64)
        places = padded(self.sizes)
        self.base = np.cumsum(places) - places  # each file's place in the rank's copy
        # reader.keep_data false: one buffer every read lands in (a chunk, or the largest file)
        held = int(places.sum()) if self.keep else min(CHUNK, int(places.max(initial=0)))
        self._map, self.memory = anonymous_memory(held)
        self.staging = self._stage(comm, rank_nodes(comm, MPI), held)
        self.lat_ns = np.zeros(0, dtype=np.int64)
        self.request_trace = None  # output.trace: step spans only
        self._plan: ReadPlan | None = None
        self._step = 0
        self.served = {"bytes": 0, "seconds": 0.0, "steps": 0}

    def _stage(self, comm, node: np.ndarray, held: int) -> dict:
        """Read every file of the split into this rank's copy (or the one buffer), once;
        timed from a barrier to a barrier."""
        def reading() -> int:
            return sum(read_whole(self.files.path(f), int(self.sizes[f]), self._map,
                                  int(self.base[f]) if self.keep else None, self.odirect)
                       for f in range(self.files.count))

        read, seconds = timed_staging(comm, reading)
        record = staging_record(comm, self.MPI, node, self.files.count, self.files.count,
                                read, seconds, held)
        record["copies"] = comm.Get_size()  # every rank read the whole split
        record["dataset_bytes"] = int(self.sizes.sum())
        record["kept"] = self.keep
        return record

    # ------------------------------------------------------------------ an epoch
    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Before the clock: where each step's samples sit in the rank's copy."""
        steps = plan.steps
        batch = len(plan.sample_ids) // max(steps, 1)
        ids = np.asarray(plan.sample_ids[:steps * batch], dtype=np.int64).reshape(steps, batch)
        self._ids = ids
        where, length = sample_places(self.layout, self.base,
                                      self.files.split.samples_per_file, ids)
        self._where = np.ascontiguousarray(where, dtype=np.int64)  # rows for _core.gather
        self._length = np.ascontiguousarray(length, dtype=np.int64)
        most = int(self._length.sum(axis=1).max(initial=0)) if self.keep else 0
        self.batch = np.empty(most, dtype=np.uint8)  # the batch buffer (what a consumer takes)
        self._plan = plan

    def start_epoch(self, plan: ReadPlan) -> None:
        if self._plan is not plan:
            self.prepare_epoch(plan)
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)
        self._step = 0

    def next_batch(self) -> BatchStats | None:
        """Step `self._step`'s batch: its samples copied from the rank's copy (keep_data), or
        no bytes (keep_data false)."""
        s, plan = self._step, self._plan
        if plan is None or s >= plan.steps:
            return None
        began = _core.now_ns()
        got = _core.gather(self.batch, self.memory, self._where[s], self._length[s]) \
            if self.keep else 0
        ready = _core.now_ns()
        self.lat_ns[plan.batch_start[s]:plan.batch_start[s + 1]] = ready - began
        self._step += 1
        served = self.served
        served["bytes"] += got
        served["seconds"] += (ready - began) / 1e9
        served["steps"] += 1
        if self.verify:
            verify_samples(self.files, self.layout, self._ids[s], self.batch[:got],
                           "replicated")
        return BatchStats(ready, got, 0)

    def end_epoch(self) -> None:
        self._plan = None

    def abandon_epoch(self) -> None:
        self._plan = None

    def counters(self) -> dict[str, int]:
        # no file is opened, read or closed while training: the bytes come from memory
        return {"opens": 0, "closes": 0, "stats": 0, "bytes_read": self.served["bytes"],
                "read_ops": 0}

    def describe(self) -> dict:
        comm, MPI, served = self.comm, self.MPI, self.served
        seconds = comm.allreduce(served["seconds"], op=MPI.MAX)
        how = ("each rank's batches copied from its own copy of the split (no exchange)"
               if self.keep else "no bytes: reader.keep_data false kept no copy, the steps "
                                 "run without data")
        return {"backend": "replicated", "file_access": "multi", "staging": self.staging,
                "serving": {"how": how, "bytes": int(comm.allreduce(served["bytes"])),
                            "seconds": round(seconds, 6), "steps": served["steps"],
                            "seconds_per_step": round(seconds / served["steps"], 9)
                            if served["steps"] else 0.0}}

    def close(self) -> None:
        self.memory = None
        self.batch = None
        self._map.close()
