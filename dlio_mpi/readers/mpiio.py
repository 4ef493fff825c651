"""The MPI-IO backends (reader.file_access: shared, collective), through mpi4py.

- shared: independent reads, one `Read_at` per request. Files are opened on MPI.COMM_SELF
  when first read and kept in a least-recently-used cache of reader.fd_cache_size handles:
  independent reads need no communicator, a dataset of one file per sample would otherwise
  cost a collective open per file, and each rank opens just what it reads, as the POSIX engine
  does, so the two compare on the read path alone.
- collective: per step, each file that any rank reads in that batch gets one `Iread_at_all`
  from every rank, in file order, through a file view covering all of the rank's requests in
  that file (zero-length where it has none), so differing request counts never deadlock. The
  files of each batch are agreed before the epoch's clock starts.

Prefetch: a reader thread per backend reads up to `prefetch_size` batches ahead into a ring of
prefetch_size + 1 batch buffers, while the step loop synchronises on the main thread (MPICH
has one lock for the whole library, which the reader's calls hold while they run):
- independent reads are blocking Read_at calls. Measured with 2 ranks against ROMIO's
  nonblocking Iread_at (glibc's POSIX aio threads, polled with Test between naps): 16 MiB
  samples 1,250 against 880-1,050 samples/s at computation 0 (the POSIX engine: 1,250-1,350),
  AU 87-95 % against 79-87 % at 2 ms of compute; 2.5 KB samples 740-800 k against 275-360 k
  samples/s. The lock held during a read did not show in the step loop's figures.
- a collective read is Iread_at_all, then Wait. ROMIO's nonblocking collective is a
  generalized request whose phases (read a collective buffer, exchange it) advance only inside
  Test or Wait: polled between naps it crawled (16 MiB samples at 30 MB/s); Wait runs phase
  after phase and lets go of the lock between them, where a blocking Read_at_all holds it for
  the whole call (measured with 2 ranks, 16 MiB samples, 50 ms compute: AU 97.6 % against
  83 %; computation 0: 214 against 143 samples/s).
A request's latency is its read call's time (for a collective read, the call's time, given to
each of its requests). With output.trace each request also records when its call was posted,
the thread that made it (0: the reader thread; -1: the step loop's own, inline reads) and the
bytes it returned; a collective call's requests share the call's start and latency, each with
the bytes of its own extent.

The watchdog (reader.io_watchdog_seconds) watches the read the thread has in flight from the
step loop's wait for a batch, as the native engine's does: reported once on stderr, or with
reader.io_watchdog_abort the wait fails at the limit. Opens are not watched (a collective open
happens on the main thread). drop_page_cache: before each epoch, posix_fadvise(DONTNEED) on
the files the plan reads, as the native engine does."""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _core
from ..data.catalog import SplitFiles
from ..errors import UserError
from ..mpi.library import (
    file_hints,
    honoured_hints,
    is_open_mpi,
    mpi_library,
    mpiio_implementation,
)
from ..mpi.mpiio import info_of, open_file
from ..sampling.requests import ReadPlan
from ..storage.counters import process_io
from .base import (
    BatchStats,
    IoWatchdog,
    ReaderBackend,
    RequestTrace,
    drop_cached_pages,
)
from .registry import MpiioOptions

COLLECTIVE_FILE_LIMIT = 1024  # files opened on the communicator by `collective`
NO_WATCHDOG = IoWatchdog(0)


@dataclass(frozen=True)
class MpiioBatch(BatchStats):
    """A batch with its bytes: request i of the batch at data[offsets[i]:] (None without
    reader.keep_data). Valid until the next next_batch()."""

    data: np.ndarray | None = None
    offsets: np.ndarray | None = None


def _rchar() -> int | None:
    """rchar of /proc/self/io: the bytes every read() of this process returned (None where
    the kernel does not say)."""
    got = process_io()
    return None if got is None else got[0]


HUGE_PAGE = 2 << 20


def batch_buffer(nbytes: int) -> np.ndarray:
    """A batch buffer as the native engine's: anonymous memory aligned to 2 MiB, advised to
    transparent huge pages (the kernel copies page-cache data into them ~15 % faster here) and
    faulted in now, before any clock starts."""
    size = max(nbytes, 1)
    area = mmap.mmap(-1, size + HUGE_PAGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)
    whole = np.frombuffer(area, dtype=np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    buffer = whole[skip:skip + size]
    buffer[::mmap.PAGESIZE] = 0  # fault in
    return buffer[:nbytes]


def stall_hook() -> tuple[float, str] | None:
    """The native engine's test hook, for MPI-IO reads: DLIO_MPI_TEST_STALL=read:<s>:<suffix>
    makes the first read of a file whose path ends with <suffix> sleep <s> seconds first, in
    flight as a read stuck on a dead server would be. (seconds, suffix), or None."""
    op, _, rest = os.environ.get("DLIO_MPI_TEST_STALL", "").partition(":")
    seconds, _, suffix = rest.partition(":")
    return (float(seconds), suffix) if op == "read" and suffix else None


def short_read(path: str, got: int, expected: int, offset: int) -> OSError:
    return OSError(errno.EIO, f"short read: {got} of {expected} bytes at offset {offset} "
                              f"of {path}", path)


class _Prefetch:
    """The reader thread of one epoch: `read(b, buffer)` for b in [0, limit), never more than
    `slots` batches ahead of the consumer."""

    def __init__(self, read, steps: int, slots: int, watchdog: IoWatchdog = NO_WATCHDOG,
                 path_of=str) -> None:
        self._read, self._cond, self.watchdog = read, threading.Condition(), watchdog
        self.path_of = path_of  # file index -> path, for the watchdog's reports
        self.in_flight: tuple[int, int] | None = None  # (since ns, file) of the read in flight
        self._reported = 0  # `since` of the last read reported
        self.limit, self.started, self.free = steps, 0, slots
        self.ready: list[BatchStats] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mpiio-prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self.started >= self.limit or self.free > 0)
                    if self.started >= self.limit:
                        return
                    self.free -= 1
                    index = self.started
                    self.started += 1
                stats = self._read(index)
                with self._cond:
                    self.ready.append(stats)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: B036 - surfaces in the consumer's next()
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def next(self, release: bool) -> BatchStats | None:
        """The next batch, releasing the previous one's buffer when `release`; raises what
        the thread raised."""
        with self._cond:
            if release:
                self.free += 1
                self._cond.notify_all()
            while not self._cond.wait_for(self._arrived, timeout=self._watch()):
                pass
            if self.error is not None:
                raise self.error
            return self.ready.pop(0) if self.ready else None

    def _arrived(self) -> bool:
        return bool(self.ready) or self.error is not None or not self._thread.is_alive()

    def _watch(self) -> float | None:
        """The watchdog, while the consumer waits: report the read in flight once it has
        waited reader.io_watchdog_seconds (once per read), or with abort, fail with it.
        Returns how long to wait before looking again (None: no watchdog)."""
        limit = self.watchdog.seconds
        if limit <= 0:
            return None
        flight = self.in_flight
        if flight is None or flight[0] == self._reported:
            return limit
        waited = (_core.now_ns() - flight[0]) / 1e9
        if waited < limit:
            return limit - waited + 0.001
        path = self.path_of(flight[1])
        what = f"a read of {path} has waited {waited:.1f} s"
        if self.watchdog.abort:
            self.error = TimeoutError(
                errno.ETIMEDOUT, f"watchdog: {what} (reader.io_watchdog_seconds={limit:g}; "
                                 "reader.io_watchdog_abort: true ends the job)", path)
            return limit
        self._reported = flight[0]
        who = "" if self.watchdog.rank is None else f"rank {self.watchdog.rank}: "
        os.write(2, f"dlio-mpi: {who}watchdog: {what} "
                    f"(reader.io_watchdog_seconds={limit:g})\n".encode())
        return limit

    def stop(self, agree=None) -> None:
        """End the epoch early: no batch is started after those already started (or after
        `agree(started)` batches, the number all ranks agreed on); the rest are discarded."""
        with self._cond:
            self.limit = self.started
        if agree is not None:
            with self._cond:
                self.limit = agree(self.started)
        with self._cond:
            self.free = self.limit  # nobody consumes any more
            self._cond.notify_all()
        self.join()

    def join(self) -> None:
        self._thread.join()


class _InlineReads:
    """What _Prefetch does, without a thread: each batch is read when the step loop asks for
    it, on the step loop's thread. For MPI libraries whose MPI-IO layer must not be called
    from two threads at once (Open MPI's OMPIO: open-mpi/ompi#1765; measured here: crashes in
    mca_common_ompio_progress with reads on one thread and the step loop's allreduce on the
    other). No read ahead, and no watchdog: the thread that would watch is the one reading."""

    def __init__(self, read, steps: int, slots: int, watchdog: IoWatchdog = NO_WATCHDOG,
                 path_of=str) -> None:
        self._read, self.limit, self.started = read, steps, 0
        self.in_flight: tuple[int, int] | None = None

    def start(self) -> None:
        pass

    def next(self, release: bool) -> BatchStats | None:
        if self.started >= self.limit:
            return None
        self.started += 1
        return self._read(self.started - 1)

    def stop(self, agree=None) -> None:
        """End the epoch early; with `agree`, first read the batches other ranks started."""
        target = agree(self.started) if agree is not None else self.started
        while self.started < min(target, self.limit):
            self.next(release=True)
        self.limit = self.started

    def join(self) -> None:
        pass


class _MpiioReader(ReaderBackend):
    """What the two MPI-IO backends share: hints, the batch ring, the reader thread, counters
    and describe(). Subclasses give `file_access`, `_read_batch` and the file handles."""

    file_access = ""

    def __init__(self, files: SplitFiles, options: MpiioOptions, comm) -> None:
        self.files, self.options = files, options
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.hints = dict(options.mpiio_hints)
        if options.odirect:  # ROMIO's O_DIRECT hint; honoured by some file systems only
            self.hints.setdefault("direct_read", "true")
        self._info = info_of(self.hints)
        self.read_back: dict[str, str] | None = None  # Get_info of the first file opened
        self.totals = dict.fromkeys(("opens", "closes", "stats", "bytes_read", "read_ops"), 0)
        self.lat_ns = np.zeros(0, dtype=np.int64)
        self.trace = options.trace
        self.request_trace: RequestTrace | None = None  # per request (output.trace)
        self._request_trace: RequestTrace | None = None  # the next epoch's (prepare_epoch)
        self._ring: list[np.ndarray] = []
        self._prefetch: _Prefetch | None = None
        self._holding = False
        self._stall = stall_hook()
        self.inline = is_open_mpi()  # see _InlineReads
        self._rchar_at_open = _rchar()

    # buffers and the epoch

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Outside the clock: the batch buffers, and where each request lands in its batch's."""
        if self.options.drop_page_cache:
            drop_cached_pages(self.files.path(int(f)) for f in plan.files())
        ends = np.cumsum(plan.length)
        self.dest = ends - plan.length - np.repeat(
            np.concatenate(([0], ends))[plan.batch_start[:-1]], np.diff(plan.batch_start))
        per_batch = np.diff(np.concatenate(([0], ends))[plan.batch_start])
        need = int(per_batch.max(initial=0))
        count = self.options.prefetch_size + 1 if self.options.keep_data else 1
        if len(self._ring) != count or (self._ring and len(self._ring[0]) < need):
            self._ring = [batch_buffer(need) for _ in range(count)]
        if self.trace:  # its pages faulted in here, not by the reads inside the clock
            self._request_trace = RequestTrace.empty(len(plan.offset))

    def start_epoch(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.lat_ns = np.zeros(len(plan.offset), dtype=np.int64)
        rt, self._request_trace = self._request_trace, None
        if self.trace and (rt is None or len(rt.start_ns) != len(plan.offset)):
            rt = RequestTrace.empty(len(plan.offset))  # without prepare_epoch
        if rt is not None:
            rt.thread[:] = -1 if self.inline else 0  # the step loop's thread, or the reader
        self.request_trace = rt if self.trace else None
        self._holding = False
        reads = _InlineReads if self.inline else _Prefetch
        self._prefetch = reads(self._read_into_ring, plan.steps,
                                   self.options.prefetch_size + 1, self.options.watchdog,
                                   self.files.path)
        self._prefetch.start()  # after the assignment: its reads report through it

    def next_batch(self) -> MpiioBatch | None:
        """Wait for the next batch (its buffer is the caller's until the next call)."""
        batch = self._prefetch.next(release=self._holding)
        self._holding = batch is not None
        return batch

    def end_epoch(self) -> None:
        self._prefetch.join()

    def abandon_epoch(self) -> None:
        self._prefetch.stop()

    def _read_into_ring(self, index: int) -> MpiioBatch:
        plan = self.plan
        first, last = int(plan.batch_start[index]), int(plan.batch_start[index + 1])
        buffer = self._ring[index % len(self._ring)]
        got, calls = self._read_batch(plan, first, last, buffer)
        if plan.delay_ns is not None:  # reader.preprocess_time of the batch's samples, on the
            time.sleep(int(plan.delay_ns[first:last].sum()) / 1e9)  # thread that read them
        self.totals["bytes_read"] += got
        self.totals["read_ops"] += calls
        keep = self.options.keep_data
        return MpiioBatch(_core.now_ns(), got, calls,
                          buffer[:int(self.dest[last - 1] + plan.length[last - 1])]
                          if keep and last > first else None,
                          self.dest[first:last] if keep else None)

    def _read_batch(self, plan: ReadPlan, first: int, last: int, buffer: np.ndarray
                    ) -> tuple[int, int]:
        """Read requests [first, last) into `buffer` at self.dest; (bytes, MPI read calls)."""
        raise NotImplementedError

    def _posting(self, file: int, posted_ns: int) -> None:
        """A read of `file` is about to be made (for the watchdog and the test hook)."""
        self._prefetch.in_flight = (posted_ns, file)
        if self._stall is not None and self.files.path(file).endswith(self._stall[1]):
            seconds, self._stall = self._stall[0], None
            time.sleep(seconds)

    def _opened(self, handle: MPI.File) -> MPI.File:
        self.totals["opens"] += 1
        if self.read_back is None:
            self.read_back = file_hints(handle)
        return handle

    # results

    def counters(self) -> dict[str, int]:
        return dict(self.totals)

    def describe(self) -> dict:
        reported = (self.read_back or {}).get("direct_read")
        rchar = _rchar()
        return {
            "backend": "mpiio", "file_access": self.file_access,
            "mpi_library": mpi_library(),
            "mpiio_implementation": mpiio_implementation(self.read_back),
            "hints_requested": dict(self.hints),
            "hints_effective": self.read_back,  # None when no file was opened
            "hints_honoured": None if self.read_back is None
            else honoured_hints(dict(self.hints), self.read_back),
            # ROMIO honours direct_read on some file systems only, and then reports it
            "direct_read": {"requested": self.hints.get("direct_read") == "true",
                            "reported_by_get_info": reported},
            "prefetch_batches": 0 if self.inline else self.options.prefetch_size,
            "reads_on": "the step loop's thread (Open MPI: its MPI-IO layer is not thread-safe)"
            if self.inline else "a reader thread",
            "latency": "each read call's time on the reader thread; a collective read's "
                       "time is given to each of its requests",
            "trace": "output.trace: a span per request from its read call's posting, on the "
                     "reader thread's track (the step thread's with inline reads); a "
                     "collective call's requests share its start and latency"
            if self.trace else None,
            # what the MPI-IO layer really read for what it delivered: data sieving and
            # collective buffering read holes, and aggregators read for other ranks
            "this_rank": {
                "bytes_delivered": self.totals["bytes_read"],
                "bytes_read_by_process": None if rchar is None or self._rchar_at_open is None
                else rchar - self._rchar_at_open,
                "how": "rchar of /proc/self/io since the backend opened: every read() of "
                       "the process (the MPI-IO layer's reads, data sieving and collective "
                       "buffering included)"},
        }

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.stop()
        self._close_files()
        self._info.Free()

    def _close_files(self) -> None:
        raise NotImplementedError


class SharedReader(_MpiioReader):
    """reader.file_access: shared (DLIO's mpio): independent MPI-IO reads, one Read_at per
    request, files opened on COMM_SELF when first read, reader.fd_cache_size handles kept open
    (least recently used closed)."""

    file_access = "shared"

    def __init__(self, files: SplitFiles, options: MpiioOptions, comm=None) -> None:
        super().__init__(files, options, comm)
        self._handles: OrderedDict[int, MPI.File] = OrderedDict()

    def _handle(self, index: int) -> MPI.File:
        handle = self._handles.get(index)
        if handle is None:
            handle = open_file(MPI.COMM_SELF, self.files.path(index), self._info)
            self._handles[index] = self._opened(handle)
        self._handles.move_to_end(index)
        return handle

    def _read_batch(self, plan: ReadPlan, first: int, last: int, buffer: np.ndarray
                    ) -> tuple[int, int]:
        files = plan.file_idx[first:last].tolist()
        offsets, dest = plan.offset[first:last].tolist(), self.dest[first:last].tolist()
        expect = plan.expect[first:last].tolist()
        status, got, calls = MPI.Status(), 0, 0
        rt = self.request_trace
        for i, file in enumerate(files):
            # No read past the end of the file (a loader's read there returns what the file
            # holds; OMPIO never completes a nonblocking read past it); one that would
            # bring nothing is not made, and its latency stays 0.
            if expect[i] == 0:
                if rt is not None:  # a span of no time, where it was passed over
                    rt.start_ns[first + i] = _core.now_ns()
                continue
            handle = self._handle(file)
            posted = _core.now_ns()
            self._posting(file, posted)
            handle.Read_at(offsets[i], buffer[dest[i]:dest[i] + expect[i]], status)
            count = status.Get_count(MPI.BYTE)
            self.lat_ns[first + i] = _core.now_ns() - posted
            if rt is not None:
                rt.start_ns[first + i], rt.nread[first + i] = posted, count
            if count < expect[i]:
                raise short_read(self.files.path(file), count, expect[i], offsets[i])
            got += count
            calls += 1
        self._prefetch.in_flight = None
        while len(self._handles) > self.options.fd_cache_size:  # not while reads are pending
            self._handles.popitem(last=False)[1].Close()
            self.totals["closes"] += 1
        return got, calls

    def end_epoch(self) -> None:
        super().end_epoch()
        if self.options.close_at_epoch_end:  # reader.access: loader
            self._close_files()

    def abandon_epoch(self) -> None:
        super().abandon_epoch()
        self._close_files()

    def _close_files(self) -> None:
        for handle in self._handles.values():
            handle.Close()
            self.totals["closes"] += 1
        self._handles.clear()


class CollectiveReader(_MpiioReader):
    """reader.file_access: collective: per batch, one Iread_at_all per file read by any rank,
    from every rank, in file order. A file is opened on the communicator by the reader thread
    when a batch first reads it (every rank reaches the same opens in the same order: the
    batches' files are agreed), so that opens fall in the epoch and are counted as the
    loader's; closed at the end of every epoch with reader.access: loader, else at close."""

    file_access = "collective"

    def __init__(self, files: SplitFiles, options: MpiioOptions, comm=None) -> None:
        super().__init__(files, options, comm)
        if files.count > COLLECTIVE_FILE_LIMIT:
            raise UserError(
                f"reader.file_access: collective opens every file on the communicator, and "
                f"this dataset has {files.count} files (limit {COLLECTIVE_FILE_LIMIT}); use "
                "reader.file_access: shared (independent MPI-IO reads) for many files")
        self._handles: dict[int, MPI.File] = {}

    def _handle(self, file: int) -> MPI.File:
        handle = self._handles.get(file)
        if handle is None:
            handle = open_file(self.comm, self.files.path(file), self._info)
            self._handles[file] = self._opened(handle)
        return handle

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Also agree with the other ranks on which files each batch reads: (steps, files)
        flags OR-ed over the communicator."""
        super().prepare_epoch(plan)
        touched = np.zeros((plan.steps, self.files.count), dtype=np.uint8)
        step_of = np.repeat(np.arange(plan.steps), np.diff(plan.batch_start))
        touched[step_of, plan.file_idx] = 1
        self.comm.Allreduce(MPI.IN_PLACE, touched, op=MPI.BOR)
        self.batch_files = [np.flatnonzero(row) for row in touched]

    def end_epoch(self) -> None:
        super().end_epoch()
        if self.options.close_at_epoch_end:  # reader.access: loader
            self._close_files()

    def abandon_epoch(self) -> None:
        """Every rank must read the same batches collectively: go on to the most any rank's
        thread had started (then all have opened the same files, and close them)."""
        self._prefetch.stop(lambda started: self.comm.allreduce(started, op=MPI.MAX))
        self._close_files()

    def _read_batch(self, plan: ReadPlan, first: int, last: int, buffer: np.ndarray
                    ) -> tuple[int, int]:
        index = int(np.searchsorted(plan.batch_start, first, side="right")) - 1
        mine = np.arange(first, last)
        got = 0
        for file in self.batch_files[index].tolist():
            rows = mine[plan.file_idx[first:last] == file]
            rows = rows[np.argsort(plan.offset[rows], kind="stable")]  # a view must ascend
            got += self._read_file_collectively(file, rows, buffer)
        return got, len(self.batch_files[index])

    def _read_file_collectively(self, file: int, rows: np.ndarray, buffer: np.ndarray) -> int:
        """One Iread_at_all of `file`: this rank's `rows` (ascending offsets) through a view.
        The view covers the bytes the file holds (expect): a loader's read past EOF would be
        a short read alone, but in a view ROMIO's collective buffering gives the bytes past
        EOF to an aggregator that does not exist. Overlapping requests (a loader reading a
        header twice) are read once through a view of their union into a scratch buffer and
        copied out: a view's blocks must not overlap (OMPIO refuses them)."""
        plan, handle = self.plan, self._handle(file)
        inside = rows[plan.expect[rows] > 0]
        starts, lengths = plan.offset[inside], plan.expect[inside]
        ends = starts + lengths
        overlap = len(inside) > 1 and bool((starts[1:] < np.maximum.accumulate(ends)[:-1]).any())
        scratch = None
        if overlap:
            new = np.ones(len(inside), dtype=bool)
            new[1:] = starts[1:] >= np.maximum.accumulate(ends)[:-1]
            group = np.cumsum(new) - 1
            first = np.flatnonzero(new)
            view_starts = starts[first]
            view_lengths = np.maximum.reduceat(ends, first) - view_starts
            scratch = np.empty(int(view_lengths.sum()), dtype=np.uint8)
            at = np.concatenate(([0], np.cumsum(view_lengths)[:-1]))[group] + (
                starts - view_starts[group])
        else:
            view_starts, view_lengths = starts, lengths
        types = []
        if len(inside):
            filetype = MPI.BYTE.Create_hindexed(view_lengths.tolist(),
                                                view_starts.tolist()).Commit()
            types.append(filetype)
            handle.Set_view(0, MPI.BYTE, filetype)
            if scratch is not None:
                target = [scratch, len(scratch), MPI.BYTE]
            else:
                memtype = MPI.BYTE.Create_hindexed(lengths.tolist(),
                                                   self.dest[inside].tolist()).Commit()
                types.append(memtype)
                target = [buffer, 1, memtype]
        else:
            handle.Set_view(0, MPI.BYTE, MPI.BYTE)
            target = [buffer, 0, MPI.BYTE]
        try:
            posted = _core.now_ns()
            self._posting(file, posted)
            status = MPI.Status()
            handle.Iread_at_all(0, target).Wait(status)  # see the module docstring
            self._prefetch.in_flight = None
            count, latency = status.Get_count(MPI.BYTE), _core.now_ns() - posted
        finally:
            for datatype in types:
                datatype.Free()
        self.lat_ns[rows] = latency
        if self.request_trace is not None:  # each request: the call's start, its own bytes
            self.request_trace.start_ns[rows] = posted
            self.request_trace.nread[rows] = plan.expect[rows]  # short: raised below
        expected = int(view_lengths.sum())
        if count < expected:
            raise short_read(self.files.path(file), count, expected,
                             int(plan.offset[rows].min()))
        if scratch is not None:
            for position, destination, n in zip(at.tolist(), self.dest[inside].tolist(),
                                                 lengths.tolist()):
                buffer[destination:destination + n] = scratch[position:position + n]
        return count  # the bytes the call moved: overlapping requests' shared bytes once

    def _close_files(self) -> None:
        for file in sorted(self._handles):  # collective: in the same order on every rank
            self._handles.pop(file).Close()
            self.totals["closes"] += 1
