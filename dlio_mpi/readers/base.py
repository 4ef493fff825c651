"""The reader-backend seam: what the step loop, the metrics and the summary know of whatever
reads the batches (the native C engine, MPI-IO, the framework loaders, later caching tiers).

A backend is opened once per phase with the split's files and the run's options (hints and
settings are given here, once), then per epoch: `prepare_epoch(plan)` outside the clock,
`start_epoch(plan)` inside it, `run_steps(...)` for the epoch's steps (or fewer, when the ranks
agreed to stop), then `end_epoch()` or `abandon_epoch()`. `counters()` are totals since open;
`lat_ns` the per-request latencies of the current epoch; `describe()` what went into
summary.json. A backend may run threads or worker processes of its own.

Backends whose batches arrive through `next_batch()` get the step loop from `python_steps`: the
native engine runs the same loop in C (no Python between a compute deadline and the next)."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from .. import _core
from ..metrics.epoch_trace import RequestTrace
from ..sampling.requests import ReadPlan
from ..storage import storage_for


@dataclass(frozen=True)
class IoWatchdog:
    """What a backend does about an open or read stuck in the kernel (a dead NFS or Lustre
    server): report it after `seconds` (0: never) on stderr, naming `rank` and the file, and
    with `abort` end the job (the wait for the batch raises)."""

    seconds: float = 60.0
    abort: bool = False
    rank: int | None = None


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """The options every backend takes, from the reader section, built keyword by keyword by
    the backend's spec (spec.py); a backend with options of its own takes a subclass
    declared beside its spec (registry.py: NativeOptions, MpiioOptions, ...)."""

    read_threads: int = 1
    prefetch_size: int = 2
    odirect: bool = False
    drop_page_cache: bool = False
    keep_data: bool = True
    watchdog: IoWatchdog = IoWatchdog()
    trace: bool = False  # output.trace: record each request's start and reader thread


def batches_in_flight(data_loader: str, prefetch_size: int, workers: int) -> int:
    """Batches the loader `data_loader` reads ahead of the one the step holds: a torch
    DataLoader's workers x prefetch_factor (DLIO's ceil(prefetch_size / workers), 2 when
    prefetch_size is 0; none without workers, where the batch is read when asked for);
    prefetch_size for tf.data's prefetch."""
    if data_loader != "pytorch":
        return prefetch_size
    if workers == 0:
        return 0
    return workers * (-(-prefetch_size // workers) if prefetch_size > 0 else 2)


def as_item(sample: np.ndarray, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The sample's bytes as the loader's item of `shape` and `dtype` (zero-padded or cut, as
    DLIO hands a decoded sample of a fixed shape whatever was read); the bytes as they are
    when `shape` is ()."""
    flat = np.ascontiguousarray(sample).reshape(-1).view(np.uint8)
    if not flat.flags.writeable:  # Pillow's decoded images: torch takes writable arrays
        flat = flat.copy()
    if not shape:
        return flat
    want = math.prod(shape) * np.dtype(dtype).itemsize
    if len(flat) < want:
        flat = np.concatenate((flat, np.zeros(want - len(flat), dtype=np.uint8)))
    return flat[:want].view(dtype).reshape(shape)


@dataclass(frozen=True)
class BatchStats:
    """One batch as `next_batch()` hands it over: when it was complete (monotonic ns), the
    bytes storage returned for it and the read calls it took."""

    ready_ns: int
    bytes_read: int
    read_ops: int


class BatchWaitWatch:
    """The I/O watchdog of backends that wait for whole batches from code they cannot look
    into (the framework loaders): once one wait has lasted watchdog.seconds, one line on
    stderr naming the rank, the loader and the batch's first files; the wait goes on (ending
    the job at the limit is the loader's: the torch DataLoader's timeout)."""

    def __init__(self, watchdog: IoWatchdog, loader: str) -> None:
        self.watchdog, self.loader = watchdog, loader
        self._timer: threading.Timer | None = None

    def start(self, step: int, paths: list[str]) -> None:
        limit = self.watchdog.seconds
        if limit <= 0:
            return
        who = "" if self.watchdog.rank is None else f"rank {self.watchdog.rank}: "
        files = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        line = (f"dlio-mpi: {who}watchdog: the {self.loader} has waited {limit:g} s for batch "
                f"{step} (reading {files}) (reader.io_watchdog_seconds={limit:g})\n").encode()
        self._timer = threading.Timer(limit, os.write, (2, line))
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def batch_paths(plan: ReadPlan, step: int, path_of) -> list[str]:
    """The distinct files step `step` of `plan` reads, in order."""
    files = plan.file_idx[plan.batch_start[step]:plan.batch_start[step + 1]]
    return [path_of(int(f)) for f in dict.fromkeys(files.tolist())]


def drop_cached_pages(paths: Iterable[str]) -> None:
    """The storage's drop_cached_file of each file (POSIX: posix_fadvise DONTNEED, opened as
    the native engine opens data files: a FIFO or folder in place is refused, never blocks),
    so that the page cache cannot serve its next reads. Here, beside the protocol and away
    from any MPI import: the framework loaders' worker processes import their backend's
    module."""
    for path in paths:
        storage_for(path).drop_cached_file(path)


class ReaderBackend:
    """What the step loop, the metrics and the summary know of a reader backend (see the
    module): every hook declared here with its default; a backend overrides what it does."""

    lat_ns: np.ndarray  # per request of the current epoch
    # per request of the current epoch with output.trace, where the backend knows it
    request_trace: RequestTrace | None = None
    cache_attached: bool = False  # reader.cache: attach_cache gave it the tier's copies
    staging: dict | None = None   # reader.staging: what the backend staged when opened
    # False: the batches carry no sample bytes (reader.staging replicated with
    # reader.keep_data false kept none), so the epoch's delivered bytes are none
    delivers_samples: bool = True

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Work before the epoch's clock starts (buffers, dropping pages)."""
        return None

    def start_epoch(self, plan: ReadPlan) -> None:
        """Inside the clock: the epoch's requests handed over, reading begins."""
        raise NotImplementedError

    def run_steps(self, pacer: _core.Pacer, sync, compute_ns: np.ndarray,
                  start_ns: int, out: np.ndarray,
                  host_cpu_ns: np.ndarray | None = None,
                  host_wait_ns: np.ndarray | None = None) -> np.ndarray:
        """The epoch's steps (python_steps over next_batch unless the backend has its own
        loop); the rows of `out` for the steps run."""
        return python_steps(self, pacer, sync, compute_ns, start_ns, out, host_cpu_ns,
                            host_wait_ns)

    def next_batch(self) -> BatchStats | None:
        """Wait for the next batch; None at the end of the epoch."""
        raise NotImplementedError

    def attach_cache(self, tier, name: str, files) -> None:
        """reader.cache: read and fill the tier's copies of these files (the native engine
        only: the configuration refuses the cache with any other backend)."""
        raise NotImplementedError(f"{type(self).__name__} reads no cache tier")

    def end_epoch(self) -> None:
        """After the last batch (closing what a loader closes)."""
        return None

    def abandon_epoch(self) -> None:
        """Stop an epoch before its last batch: reads in flight end."""
        return None

    def counters(self) -> dict[str, int]:
        """Totals since open (bytes, reads, opens, ...)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What goes into summary.json about the backend."""
        raise NotImplementedError

    def close(self) -> None:
        return None


def python_steps(backend: ReaderBackend, pacer: _core.Pacer, sync, compute_ns: np.ndarray,
                 start_ns: int, out: np.ndarray,
                 host_cpu_ns: np.ndarray | None = None,
                 host_wait_ns: np.ndarray | None = None) -> np.ndarray:
    """The step loop for backends without one of their own: for each step take the next
    batch, do its host work (host_cpu_ns of CPU time, _core.burn_cpu_ns, then host_wait_ns
    slept; None: none), wait its compute time with `pacer`, synchronise with `sync` (a
    StepSync or None); fills the (steps, 8) int64 records `out` (zeros) row by row, as the C
    loop does, and returns the rows of the steps run (fewer when the ranks agreed to stop)."""
    start = start_ns
    cpus, waits = (repeat(0) if ns is None else np.asarray(ns, dtype=np.int64).tolist()
                   for ns in (host_cpu_ns, host_wait_ns))
    for i, (compute, cpu, wait) in enumerate(zip(np.asarray(compute_ns, dtype=np.int64)
                                                 .tolist(), cpus, waits)):
        batch = backend.next_batch()
        if batch is None:
            raise RuntimeError(f"the reader has {i} batches, the plan {len(compute_ns)}")
        got = began = _core.now_ns()
        if cpu > 0:  # taking the batch: not compute
            began = _core.burn_cpu_ns(cpu)
        if wait > 0:
            began = _core.sleep_until_ns(began + wait)
        deadline = began + compute
        computed = pacer.wait_until(deadline) if compute > 0 else began
        stop = sync.synchronise() if sync is not None else 0
        synced = _core.now_ns()
        out[i] = (start, batch.ready_ns, got, deadline, computed, synced, batch.bytes_read,
                  batch.read_ops)
        start = synced
        if stop:
            return out[:i + 1]
    return out
