"""reader.staging: read_once: the split's files are read from the file system exactly once
for the whole job, into the memory of the ranks (file f on rank f mod P, so a node holds its
ranks' share), and each step's batches are then served from memory: the samples a rank's batch
needs travel from the ranks holding them through one MPI_Alltoallv per step (the samples a rank
holds itself included, which MPI copies locally). The file system sees one pass; the
interconnect carries the shuffle (as the large climate training runs at NERSC did).

- Staging: when the backend opens (before the first epoch), timed from a barrier to a barrier:
  each rank reads its files whole (reads of 64 MiB, O_DIRECT with reader.odirect), one open
  each. Reported in describe()["staging"]: files, bytes read from the file system, seconds,
  GiB/s, memory per rank and per node.
- A step's batch: the epoch's sample lists of every rank are gathered before the epoch's clock
  (prepare_epoch); for each step every rank packs the samples others need from it (in their
  batch order) and the Alltoallv delivers them, on a communicator of its own, in a thread
  running up to reader.prefetch_size steps (at least one) ahead of the step loop, as a
  loader's prefetch; the batch is ready when its exchange has returned. The step's
  bytes (the step records' BYTES) are the bytes delivered, none of them from storage; each
  request's latency is its step's exchange time. describe()["exchange"]: bytes delivered,
  those from other ranks and from other nodes, seconds in the exchanges, per step.
- Samples move, not files: formats whose samples sit at extents of their files (layouts);
  ragged formats (parquet's row groups) are refused before any I/O."""

from __future__ import annotations

import os
import threading

import numpy as np

from .. import _core
from ..data.catalog import SplitFiles
from ..sampling.requests import ReadPlan
from .base import BatchStats, ReaderBackend, ReaderOptions
from .staging import (
    StagingFailed,
    anonymous_memory,
    padded,
    rank_nodes,
    read_whole,
    sample_places,
    staging_record,
    timed_staging,
    verify_samples,
)

# test hook: each delivered sample checked against a read of its file (slow; tests only)
VERIFY_ENV = "DLIO_MPI_TEST_VERIFY_EXCHANGE"
__all__ = ["ReadOnceReader", "StagingFailed"]


class ReadOnceReader(ReaderBackend):
    """A ReaderBackend serving a split from the ranks' memory (collective construction)."""

    def __init__(self, files: SplitFiles, options: ReaderOptions, comm) -> None:
        from mpi4py import MPI

        self.MPI, self.comm, self.files = MPI, comm, files
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.odirect = options.odirect
        self.verify = bool(os.environ.get(VERIFY_ENV))
        all_files = np.arange(files.count, dtype=np.int64)
        self.layout = files.layouts.take(all_files)
        self.sizes = self.layout.size.astype(np.int64)
        self.owner = all_files % self.size
        # each file's place in its owner's memory: its owner's earlier files, padded
        places = padded(self.sizes)
        self.base = np.zeros(files.count, dtype=np.int64)
        for r in range(self.size):
            mine = np.flatnonzero(self.owner == r)
            self.base[mine] = np.cumsum(places[mine]) - places[mine]
        held = int(places[self.owner == self.rank].sum())
        self._map, self.memory = anonymous_memory(held)  # page-aligned, for O_DIRECT reads
        self.node = rank_nodes(comm, MPI)
        self.staging = self._stage(held)
        self.lat_ns = np.zeros(0, dtype=np.int64)
        self.request_trace = None  # output.trace: step spans only
        self._steps: list = []
        self._step = 0
        self._plan: ReadPlan | None = None
        self.received = 0
        # the exchanges run on their own communicator, in a thread up to `depth` steps ahead
        # of the step loop (reader.prefetch_size, at least 1), as a loader's prefetch
        self.xcomm = comm.Dup()
        self.depth = max(options.prefetch_size, 1)
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.exchanged = {"bytes": 0, "bytes_from_other_ranks": 0,
                          "bytes_from_other_nodes": 0, "seconds": 0.0, "steps": 0}

    def _stage(self, held: int) -> dict:
        """Read this rank's files (file f on rank f mod P) into their places in memory,
        once; timed from a barrier to a barrier."""
        mine = np.flatnonzero(self.owner == self.rank).tolist()
        read, seconds = timed_staging(self.comm, lambda: sum(
            read_whole(self.files.path(f), int(self.sizes[f]), self._map, int(self.base[f]),
                       self.odirect) for f in mine))
        return staging_record(self.comm, self.MPI, self.node, len(self.sizes), len(mine),
                              read, seconds, held)

    # ------------------------------------------------------------------ an epoch
    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Before the clock: every rank's sample lists, and each step's exchange."""
        steps = plan.steps
        everyone = np.stack(self.comm.allgather(np.ascontiguousarray(plan.sample_ids)))
        batch = everyone.shape[1] // max(steps, 1)
        spf = self.files.split.samples_per_file
        ids = everyone[:, :steps * batch].reshape(self.size, steps, batch)
        where, length = sample_places(self.layout, self.base, spf, ids)
        owner = self.owner[ids // spf]
        self._steps = []
        for s in range(steps):
            # what I send: the samples each rank's batch s needs from me, in its batch order
            dest, pos = np.nonzero(owner[:, s, :] == self.rank)
            send_at = np.ascontiguousarray(where[dest, s, pos], dtype=np.int64)
            send_len = np.ascontiguousarray(length[dest, s, pos], dtype=np.int64)
            send_counts = np.bincount(dest, weights=send_len, minlength=self.size)
            # what I receive: my batch's samples, grouped by the rank holding them
            mine_owner = owner[self.rank, s]
            recv_counts = np.bincount(mine_owner, weights=length[self.rank, s],
                                      minlength=self.size)
            self._steps.append((send_at, send_len, send_counts.astype(np.int64),
                                recv_counts.astype(np.int64)))
        self._plan = plan
        # the samples of my batches in the order they arrive (by holding rank, then position)
        order = np.argsort(owner[self.rank], axis=1, kind="stable")
        self._arriving = np.take_along_axis(ids[self.rank], order, axis=1)

    def start_epoch(self, plan: ReadPlan) -> None:
        """Start the exchange thread on the epoch's steps (it runs up to `depth` ahead)."""
        if self._plan is not plan:
            self.prepare_epoch(plan)
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)
        self._step = 0
        self._done: list = [None] * len(self._steps)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._exchange_all, name="read-once-exchange",
                                        daemon=True)
        self._thread.start()

    def _exchange_all(self) -> None:
        """The exchanges of the epoch, in step order, at most `depth` steps ahead of the step
        loop (every rank's thread goes as far: the same collective calls on xcomm)."""
        try:
            for s in range(len(self._steps)):
                with self._cond:
                    # stopped, it still does every exchange it may have started on another
                    # rank (all below the same steps consumed + depth), so none waits alone
                    while s >= self._step + self.depth:
                        if self._stop:
                            return
                        self._cond.wait()
                result = self._exchange(s)
                with self._cond:
                    self._done[s] = result
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: B036 - handed to the step loop's thread
            with self._cond:
                self._failed = exc
                self._cond.notify_all()

    def _exchange(self, s: int) -> tuple[int, int, np.ndarray]:
        """Step s's exchange (collective on xcomm): pack, Alltoallv; (began, ready, bytes)."""
        MPI = self.MPI
        send_at, send_len, send_counts, recv_counts = self._steps[s]
        began = _core.now_ns()
        out = np.empty(int(send_counts.sum()), dtype=np.uint8)
        _core.gather(out, self.memory, send_at, send_len)
        into = np.empty(int(recv_counts.sum()), dtype=np.uint8)
        self.xcomm.Alltoallv([out, (send_counts, _displacements(send_counts)), MPI.BYTE],
                             [into, (recv_counts, _displacements(recv_counts)), MPI.BYTE])
        return began, _core.now_ns(), into

    def next_batch(self) -> BatchStats | None:
        """Step `self._step`'s batch, once the exchange thread has it."""
        s = self._step
        if s >= len(self._steps):
            return None
        with self._cond:
            while self._done[s] is None and self._failed is None:
                self._cond.wait()
            if self._failed is not None:
                raise self._failed
            began, ready, into = self._done[s]
            self._done[s] = None
            self._step += 1
            self._cond.notify_all()  # room for one more step ahead
        recv_counts = self._steps[s][3]
        plan = self._plan
        first, last = plan.batch_start[s], plan.batch_start[s + 1]
        self.lat_ns[first:last] = ready - began
        got = int(recv_counts.sum())
        self.received += got
        ex = self.exchanged
        ex["bytes"] += got
        ex["bytes_from_other_ranks"] += got - int(recv_counts[self.rank])
        ex["bytes_from_other_nodes"] += int(recv_counts[self.node != self.node[self.rank]].sum())
        ex["seconds"] += (ready - began) / 1e9
        ex["steps"] += 1
        if self.verify:
            verify_samples(self.files, self.layout, self._arriving[s], into, "read_once")
        self.batch = into  # the batch's bytes (what a consumer would take)
        return BatchStats(ready, got, 0)

    def _join(self) -> None:
        """Stop the exchange thread at the next step boundary and wait for it (every rank
        stopped after the same step, so their threads end at the same exchange)."""
        thread = getattr(self, "_thread", None)
        if thread is not None:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            thread.join()
            self._thread = None
            self._stop = False

    def end_epoch(self) -> None:
        self._join()
        self._plan = None

    def abandon_epoch(self) -> None:
        self._join()
        self._plan = None

    def counters(self) -> dict[str, int]:
        # no file is opened, read or closed while training: the bytes come from memory
        return {"opens": 0, "closes": 0, "stats": 0, "bytes_read": self.received,
                "read_ops": 0}

    def describe(self) -> dict:
        ex = dict(self.exchanged)
        totals = {k: self.comm.allreduce(v) for k, v in ex.items() if k != "steps"}
        totals["seconds"] = round(self.comm.allreduce(ex["seconds"], op=self.MPI.MAX), 6)
        totals["seconds_per_step"] = round(totals["seconds"] / ex["steps"], 9) \
            if ex["steps"] else 0.0
        totals["steps"] = ex["steps"]
        return {"backend": "read_once", "file_access": "multi", "staging": self.staging,
                "exchange": {"how": "one MPI_Alltoallv per step (samples packed in the "
                                    "receivers' batch order)", **totals}}

    def close(self) -> None:
        self._join()
        self.xcomm.Free()
        self.memory = None
        self._map.close()


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
