"""The h5py backend (reader.engine native, reader.file_access multi): hdf5 files whose samples
the C engine cannot read at their file offsets (chunks other than one sample each,
compression, a max shape, num_dset_per_record > 1: formats.hdf5's library_read_reason) are
read through h5py, as DLIO's HDF5Reader reads them.

What runs, per rank and epoch: max(reader.read_threads, 1) Python threads take the plan's
batches in order, each thread a whole batch, at most max(reader.prefetch_size, 1) batches
ahead of the step that consumes them; batches are handed over in the plan's order, holding
the plan's samples in the plan's order. A sample is read as DLIO's HDF5Reader reads it:
h5py.File(path, 'r') (reader.read_type on_demand: opened and closed for every sample; memory:
kept open by the thread until the epoch ends), then row i of every records_<k>
(formats.hdf5.Rows; HDF5 reads the chunks holding the row, decompressing them, through its
chunk cache). reader.preprocess_time is slept after each sample, in its thread.

Measured: each batch's bytes and read calls are the /proc/thread-self/io deltas (rchar,
syscr) of the thread that read it, over the batch: what HDF5's reads returned, from storage or
the page cache, metadata at each open included (without /proc io: the plan's bytes and
requests). Opens and closes: the h5py.File calls. Stats: not counted. lat_ns: per sample, its
open (when it opens), read and close, the preprocessing sleep excluded.

output.trace: a span per sample (the plan's request for it), from its start with its
latency, on the track of the thread t that read it; its bytes are the sample's own
/proc/thread-self/io delta (rchar from just before its open to just after its close: what its
HDF5 reads returned, the open's metadata included; the plan's bytes for it without /proc io).
The per-sample probes are chained so that the batch's figures stay exact.

h5py serialises every HDF5 call under one lock, so the threads overlap their waits and the
steps, not their reads (DLIO's pytorch workers are processes; describe() says so). h5py also
keeps the GIL while HDF5 waits in the kernel: during a stuck open or read no Python thread of
the rank runs, so the I/O watchdog is CPython's faulthandler timer, a C thread (_Watchdog):
after reader.io_watchdog_seconds without a sample read ending while one is in flight it
prints "Timeout" and every thread's stack (the stuck read's frames) on stderr; with
reader.io_watchdog_abort it then ends the rank's process (exit status 1; the launcher ends
the job), since nothing in Python could."""

from __future__ import annotations

import faulthandler
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from ..data.catalog import SplitFiles
from ..formats.hdf5 import Rows
from ..sampling.requests import ReadPlan
from ..storage.counters import IoChain, forget_thread_io
from .base import (
    BatchStats,
    ReaderBackend,
    RequestTrace,
    drop_cached_pages,
)
from .registry import H5pyOptions

if TYPE_CHECKING:
    pass


def sample_delays(plan: ReadPlan) -> np.ndarray | None:
    """Each sample's preprocessing ns from the plan's per-request delays: one request per
    sample, as the plan has for hdf5 (read_mode sample), else each batch's delay spread
    evenly over its samples; None without delays."""
    if plan.delay_ns is None:
        return None
    ids = len(plan.sample_ids)
    if len(plan.delay_ns) == ids:
        return np.asarray(plan.delay_ns, dtype=np.int64)
    batch = ids // max(plan.steps, 1)
    step_of = np.searchsorted(plan.batch_start, np.arange(len(plan.delay_ns)), side="right") - 1
    per_batch = np.bincount(step_of, weights=plan.delay_ns, minlength=plan.steps)
    return np.repeat(per_batch.astype(np.int64) // max(batch, 1), batch)


class _Watchdog:
    """reader.io_watchdog_seconds for the h5py reads (see the module): faulthandler's timer
    armed while reads are in flight, re-armed at each read's start and end, cancelled when
    none is. One per process (faulthandler has one timer), shared by the readers."""

    lock = threading.Lock()
    inflight = 0

    def __init__(self, seconds: float, abort: bool) -> None:
        self.seconds, self.abort = seconds, abort

    def begin(self) -> None:
        if self.seconds > 0:
            with self.lock:
                _Watchdog.inflight += 1
                faulthandler.dump_traceback_later(self.seconds, exit=self.abort, file=2)

    def end(self) -> None:
        if self.seconds > 0:
            with self.lock:
                _Watchdog.inflight -= 1
                if _Watchdog.inflight:
                    faulthandler.dump_traceback_later(self.seconds, exit=self.abort, file=2)
                else:
                    faulthandler.cancel_dump_traceback_later()


@dataclass(frozen=True, slots=True)
class _Batch:
    """A batch as a thread read it: when it was complete, its /proc io deltas (-1: not
    known), the files opened, each sample's latency and (keep_data) its samples."""

    ready_ns: int
    nbytes: int
    reads: int
    opens: int
    lat: np.ndarray
    samples: list | None


class H5pyReader(ReaderBackend):
    """A ReaderBackend reading one split's planned batches through h5py (see the module)."""

    def __init__(self, files: SplitFiles, options: H5pyOptions, comm=None) -> None:
        fmt = files.split.format
        self.files, self.options = files, options
        self.reason = fmt.library_read_reason(files.split.spec(0))
        self.datasets = fmt.options.datasets
        self.samples_per_file = files.split.samples_per_file
        self.threads = max(options.read_threads, 1)
        self.depth = max(options.prefetch_size, 1)
        self.memory = options.read_type == "memory"
        self.watchdog = _Watchdog(options.watchdog.seconds, options.watchdog.abort)
        self.lat_ns = np.zeros(0, dtype=np.int64)  # per sample of the current epoch
        self.trace = options.trace
        self.request_trace: RequestTrace | None = None  # per sample (output.trace)
        self._request_trace: RequestTrace | None = None  # the next epoch's (prepare_epoch)
        self.batch: list | None = None  # the samples of the batch the step holds (keep_data)
        self.ids = np.zeros(0, dtype=np.int64)  # their ids
        self._cond = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._kept: list[dict[str, Rows]] = []  # read_type memory: files open per thread
        self._done: dict[int, _Batch] = {}
        self._plan: ReadPlan | None = None
        self._steps = np.zeros((0, 0), dtype=np.int64)
        self._delays: np.ndarray | None = None
        self._claimed = self._handed = 0
        self._stop = False
        self._error: BaseException | None = None
        self._opens = self._closes = self._bytes = self._reads = 0

    # -- the epoch --------------------------------------------------------------------------

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Before the clock: dropping the plan's files from the page cache if asked."""
        if self.options.drop_page_cache:
            drop_cached_pages(self._paths(plan))
        if self.trace:  # its pages faulted in here, not by the readers inside the clock
            self._request_trace = RequestTrace.empty(len(plan.offset))

    def _paths(self, plan: ReadPlan) -> list[str]:
        files = np.unique(plan.sample_ids // self.samples_per_file)
        return [self.files.path(int(f)) for f in files]

    def start_epoch(self, plan: ReadPlan) -> None:
        """Start the reader threads on the epoch's batches (they read ahead at once)."""
        steps = plan.steps
        batch = len(plan.sample_ids) // max(steps, 1)
        self._plan = plan
        self._steps = plan.sample_ids[:steps * batch].reshape(steps, batch)
        self._delays = sample_delays(plan)
        self.lat_ns = np.zeros(steps * batch, dtype=np.int64)
        rt, self._request_trace = self._request_trace, None
        if self.trace and (rt is None or len(rt.start_ns) != len(plan.offset)):
            rt = RequestTrace.empty(len(plan.offset))  # without prepare_epoch
        # a span per sample stands for the plan's request of it: one each (read_mode sample)
        self.request_trace = rt if self.trace and len(plan.offset) == steps * batch else None
        self._done, self._claimed, self._handed = {}, 0, 0
        self._stop, self._error = False, None
        self._kept = [{} for _ in range(self.threads)]
        self._workers = [threading.Thread(target=self._work, args=(t,), daemon=True,
                                          name=f"dlio-mpi-h5py-{t}")
                         for t in range(self.threads)]
        for worker in self._workers:
            worker.start()

    def next_batch(self) -> BatchStats | None:
        """Wait for the plan's next batch; None at the end of the epoch."""
        self.batch = None
        step = self._handed
        if step >= len(self._steps):
            return None
        with self._cond:
            while step not in self._done and self._error is None:
                self._cond.wait()
            if self._error is not None:
                error = self._error
                raise RuntimeError(f"the h5py reader failed: {error}") from error
            got = self._done.pop(step)
            self._handed += 1
            self._cond.notify_all()  # the window moved on
        batch = self._steps.shape[1]
        self.lat_ns[step * batch:(step + 1) * batch] = got.lat
        nbytes, reads = got.nbytes, got.reads
        if nbytes < 0:  # no /proc io: the plan's bytes and requests for the batch
            b = self._plan.batch_start
            nbytes = int(self._plan.expect[b[step]:b[step + 1]].sum())
            reads = int(b[step + 1] - b[step])
        self._bytes += nbytes
        self._reads += reads
        self._opens += got.opens
        if not self.memory:
            self._closes += got.opens
        self.batch, self.ids = got.samples, self._steps[step]
        return BatchStats(got.ready_ns, nbytes, reads)

    def end_epoch(self) -> None:
        """After the last batch: the threads end, the files kept open close."""
        self._finish()

    def abandon_epoch(self) -> None:
        """Stop before the epoch's last batch: the threads end after the sample they read."""
        self._finish()

    def _finish(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout=None if self._error is None else 1.0)
        self._workers = []
        for kept in self._kept:
            for rows in kept.values():
                rows.close()
                self._closes += 1
        self._kept, self._done, self.batch = [], {}, None

    # -- the reader threads -----------------------------------------------------------------

    def _claim(self) -> int | None:
        """The next step to read, once it is within the prefetch window; None when the
        epoch has no more (or stops)."""
        with self._cond:
            while (not self._stop and self._claimed < len(self._steps)
                   and self._claimed >= self._handed + self.depth):
                self._cond.wait()
            if self._stop or self._claimed >= len(self._steps):
                return None
            self._claimed += 1
            return self._claimed - 1

    def _work(self, thread: int) -> None:
        try:
            while True:
                step = self._claim()
                if step is None:
                    return
                got = self._read_batch(thread, step)
                if got is None:
                    return
                with self._cond:
                    self._done[step] = got
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the step's wait
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()
        finally:
            forget_thread_io()

    def _read_batch(self, thread: int, step: int) -> _Batch | None:
        ids = self._steps[step].tolist()
        first = step * len(ids)
        kept = self._kept[thread]
        keep = self.options.keep_data
        samples: list | None = [] if keep else None
        lat = np.zeros(len(ids), dtype=np.int64)
        opens = 0
        rt = self.request_trace
        io = IoChain()  # with output.trace: each sample's part of the batch's io too
        for k, sample_id in enumerate(ids):
            if self._stop:
                return None
            file, within = divmod(sample_id, self.samples_per_file)
            path = self.files.path(file)
            start = _core.now_ns()
            self.watchdog.begin()
            try:
                rows = kept.get(path) if self.memory else None
                if rows is None:
                    rows = Rows(path, self.datasets)
                    opens += 1
                    if self.memory:
                        kept[path] = rows
                try:
                    sample = rows[within]
                finally:
                    if not self.memory:
                        rows.close()
            finally:
                self.watchdog.end()
            lat[k] = _core.now_ns() - start
            if rt is not None:
                rt.start_ns[first + k], rt.thread[first + k] = start, thread
                got = io.part()  # without /proc io: the plan's bytes for it
                rt.nread[first + k] = got if got >= 0 else self._plan.expect[first + k]
            if keep:
                samples.append(sample)
            if self._delays is not None and self._delays[first + k] > 0:
                time.sleep(self._delays[first + k] / 1e9)
        nbytes, reads = io.end()
        return _Batch(_core.now_ns(), nbytes, reads, opens, lat, samples)

    # -- what it did ------------------------------------------------------------------------

    def counters(self) -> dict:
        return {"opens": self._opens, "closes": self._closes, "stats": 0,
                "bytes": self._bytes, "reads": self._reads}

    def describe(self) -> dict:
        import h5py

        kept = ("kept open per thread until the epoch ends (reader.read_type memory)"
                if self.memory else "opened and closed for every sample (reader.read_type "
                                    "on_demand)")
        return {"backend": "h5py", "file_access": "multi", "format": "hdf5",
                "why": f"not the C engine: {self.reason}",
                "reads": f"as DLIO's HDF5Reader: h5py.File(path, 'r') {kept}, row i of "
                         f"records_0 .. records_{self.datasets - 1} for sample i",
                "threads": self.threads, "prefetch_batches": self.depth,
                "read_type": self.options.read_type,
                "serialised": "h5py runs one HDF5 call at a time (its global lock): the "
                              "threads overlap their waits, not their reads",
                "watchdog": (f"faulthandler's timer: stacks on stderr after "
                             f"{self.watchdog.seconds:g} s without a read ending"
                             + (", then the process ends" if self.watchdog.abort else "")
                             if self.watchdog.seconds > 0 else None),
                "bytes_read_measured": self._bytes,
                "trace": "a span per sample on its thread's track, its bytes its own "
                         "/proc/thread-self/io delta" if self.trace else None,
                "counted": "bytes and read calls: /proc/thread-self/io of each reader thread "
                           "over its batch (HDF5's metadata reads at each open included); "
                           "opens and closes: the h5py.File calls; stats: not counted",
                "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version}

    def close(self) -> None:
        if self._workers:
            self._finish()
