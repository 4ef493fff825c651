"""output.trace: one Chrome trace-event file per rank (`trace_rank<R>.json.gz`, the JSON object
format: {"traceEvents": [...], "displayTimeUnit": "ms"}, gzip) that Perfetto and
chrome://tracing open. Process = rank; one track for the step loop (each step's wait, compute
and barrier, evaluation steps, checkpoints, generation) and one per reader thread (a span per
read request, with its file, offset, length, bytes and latency) where the backend records
requests (the native C engine, the MPI-IO backends, h5py, the torch DataLoader where a sample
is one request: readers/*). Times are microseconds since the run's start on rank 0's clock
(each rank's monotonic clock less topology.clock_offset_ns), so the ranks line up.

Nothing is formatted during an epoch: after each epoch its events are formatted (the read
requests' in C, csrc/dio_trace.c) and gzip-compressed into memory (~20 bytes per request), and
the file is written once, at the end of the run, so the trace puts no writes on the storage
under test while it is measured. The time this takes, between epochs, is the emulator's own
and is reported apart (summary.json dlio_mpi.trace)."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable

import numpy as np

from .. import _core
from ..sampling.requests import ReadPlan
from .epoch_trace import COMPUTED, GOT, START, SYNCED, EpochTrace

STEPS_TID = 1  # the step loop's track; reader threads' tracks follow


def trace_name(rank: int) -> str:
    return f"trace_rank{rank}.json.gz"


class RankTrace:
    """One rank's trace: events compressed as they come, written by `write`."""

    def __init__(self, rank: int, origin0_ns: int, clock_offset_ns: int = 0) -> None:
        """`origin0_ns`: the run's start on rank 0's monotonic clock; `clock_offset_ns`: this
        rank's monotonic clock minus rank 0's."""
        self.rank, self.origin0_ns = rank, origin0_ns
        self.origin_ns = origin0_ns + clock_offset_ns  # the same instant on this rank's clock
        self._tracks: dict[tuple[str, int], int] = {}
        self._gzip, self.compressor = _gzip_stream()
        self._compressed: list[bytes] = []
        self.events = self.requests = 0
        self.seconds = 0.0  # formatting, compressing and writing: the emulator's own time
        self._add('{"displayTimeUnit":"ms","traceEvents":[\n'
                  + self._meta("process_name", 0, {"name": f"rank {self.rank}"}))
        self._add(",\n" + self._meta("process_sort_index", 0, {"sort_index": self.rank}))
        self._add(",\n" + self._meta("thread_name", STEPS_TID, {"name": "steps"}))

    @staticmethod
    def start(comm, clock_offset_ns: int) -> RankTrace:
        """Collectively: a trace whose time 0 is now on rank 0."""
        origin = comm.bcast(_core.now_ns() if comm.Get_rank() == 0 else None, root=0)
        return RankTrace(comm.Get_rank(), origin, clock_offset_ns)

    def span(self, name: str, cat: str, start_ns: int, end_ns: int, args: dict | None = None,
             rank0_clock: bool = False) -> None:
        """A span on the steps track; times on this rank's monotonic clock (or rank 0's:
        checkpoint records)."""
        origin = self.origin0_ns if rank0_clock else self.origin_ns
        with self._timed():
            self._add(",\n" + self._event(name, cat, STEPS_TID, start_ns - origin,
                                          end_ns - origin, args))

    def epoch(self, phase: str, epoch: int, plan: ReadPlan, trace: EpochTrace,
              path_of: Callable[[int], str]) -> None:
        """Add an epoch's steps (and requests, when recorded)."""
        with self._timed():
            self._add_steps(phase, epoch, trace)
            if trace.request_trace is not None:
                self._add_requests(phase, epoch, plan, trace, path_of)

    def stats(self) -> dict:
        """What the trace holds and cost (after `write`: all of it)."""
        return {"events": self.events, "requests": self.requests,
                "bytes": sum(len(c) for c in self._compressed),
                "seconds": round(self.seconds, 6), "compressor": self.compressor}

    # ------------------------------------------------------------------ writing
    def write(self, fp) -> None:
        """Write the trace (gzip'd JSON) into the binary file `fp`."""
        with self._timed():
            self._compressed.append(self._gzip.compress(b"\n]}\n"))
            self._compressed.append(self._gzip.flush())
            fp.writelines(self._compressed)

    def _timed(self):
        return _Stopwatch(self)

    def _add(self, text: str | bytes | bytearray) -> None:
        data = text.encode() if isinstance(text, str) else text
        out = self._gzip.compress(data)
        if out:
            self._compressed.append(out)

    def _meta(self, name: str, tid: int, args: dict) -> str:
        return json.dumps({"name": name, "ph": "M", "pid": self.rank, "tid": tid,
                           "args": args}, separators=(",", ":"))

    def _event(self, name: str, cat: str, tid: int, start_ns: int, end_ns: int,
               args: dict | None) -> str:
        self.events += 1
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                 "ts": _us(start_ns), "dur": _us(max(end_ns - start_ns, 0))}
        if args:
            event["args"] = args
        return json.dumps(event, separators=(",", ":"))

    def _add_steps(self, phase: str, epoch: int, trace: EpochTrace) -> None:
        o = self.origin_ns
        self._add(",\n" + self._event(f"{phase} epoch {epoch}", "epoch", STEPS_TID,
                                      trace.block_start_ns - o, trace.block_end_ns - o,
                                      {"epoch": epoch, "steps": trace.steps}))
        prefix = "" if phase == "train" else f"{phase} "
        kinds = [("wait", START, GOT), ("compute", GOT, COMPUTED)]
        if trace.synchronised:
            kinds.append(("barrier", COMPUTED, SYNCED))
        stamps = trace.stamps - o
        chunk: list[str] = []
        for kind, begin, end in kinds:
            head = (f',\n{{"name":"{prefix}{kind}","cat":"{phase}","ph":"X",'
                    f'"pid":{self.rank},"tid":{STEPS_TID},"ts":')
            starts, ends = stamps[:, begin], stamps[:, end]
            for step, (ts, dur) in enumerate(zip(_us_text(starts), _us_text(
                    np.maximum(ends - starts, 0))), start=1):
                chunk.append(f'{head}{ts},"dur":{dur},"args":{{"epoch":{epoch},'
                             f'"step":{step}}}}}')
                if len(chunk) == 8192:
                    self._add("".join(chunk))
                    chunk.clear()
        self._add("".join(chunk))
        self.events += len(kinds) * trace.steps

    def _track(self, phase: str, thread: int) -> int:
        key = (phase, thread)
        tid = self._tracks.get(key)
        if tid is None:
            tid = self._tracks[key] = STEPS_TID + 1 + len(self._tracks)
            who = "step thread" if thread < 0 else f"thread {thread}"
            self._add(",\n" + self._meta("thread_name", tid, {"name": f"{phase} reader {who}"}))
        return tid

    def _add_requests(self, phase: str, epoch: int, plan: ReadPlan, trace: EpochTrace,
                      path_of: Callable[[int], str]) -> None:
        rt = trace.request_trace
        n = len(rt.start_ns)
        threads, thread_index = _compact(rt.thread + 1)  # -1: the step loop's thread
        tids = np.array([self._track(phase, t - 1) for t in threads.tolist()], dtype=np.int64)
        files, file_index = _compact(plan.file_idx[:n])
        quoted = [json.dumps(path_of(f)).encode() for f in files.tolist()]
        path_off = np.zeros(len(quoted) + 1, dtype=np.int64)
        np.cumsum([len(q) for q in quoted], out=path_off[1:])
        step = np.searchsorted(plan.batch_start, np.arange(n), side="right")
        head = (f',\n{{"name":"read","cat":"{phase} read","ph":"X","pid":{self.rank},'
                '"tid":').encode()
        _core.trace_reads(
            head, tids[thread_index],
            _i64(rt.start_ns - self.origin_ns), _i64(trace.lat_ns[:n]), _i64(rt.nread),
            _i64(file_index), _i64(plan.offset[:n]), _i64(plan.length[:n]), _i64(step),
            b"".join(quoted), path_off, epoch, self._add)
        self.events += n
        self.requests += n


class _Stopwatch:
    """Adds the time of a `with` block to the trace's own time."""

    def __init__(self, trace: RankTrace) -> None:
        self.trace = trace

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.trace.seconds += time.perf_counter() - self.began


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)


def _gzip_stream():
    """A gzip stream at level 1 (wbits 31: the gzip format) and what makes it: ISA-L's deflate
    where installed (~4x zlib's speed on trace text, as small), else zlib's."""
    try:
        from isal import isal_zlib as deflate
    except ImportError:
        deflate = zlib
    return deflate.compressobj(1, deflate.DEFLATED, 31), deflate.__name__.rsplit(".", 1)[-1]


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for non-negative integers, without the sort
    where the values' range is not much larger than their count (file indices, threads)."""
    top = int(values.max()) + 1 if len(values) else 0
    if top > 16 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    present = np.zeros(top, dtype=bool)
    present[values] = True
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[values]


def _us_text(ns: np.ndarray) -> list[str]:
    """Nanoseconds as microsecond texts with three decimals (exact)."""
    return [f"{v / 1e3:.3f}" for v in ns.tolist()]


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)
