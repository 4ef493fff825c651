"""output.trace: one Chrome trace-event file per rank (`trace_rank<R>.json.gz`, the JSON object
format: {"traceEvents": [...], "displayTimeUnit": "ms"}, gzip) that Perfetto and
chrome://tracing open. Process = rank; one track for the step loop (each step's wait, compute
and barrier, evaluation steps, checkpoints, generation) and one per reader thread (a span per
read request, with its file, offset, length, bytes and latency) where the backend records
requests (the native C engine). Times are microseconds since the run's start on rank 0's clock
(each rank's monotonic clock less topology.clock_offset_ns), so the ranks line up.

Nothing is formatted during an epoch: the epoch's arrays are kept (a few int64 per request) and
the file is written once, at the end of the run."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from . import _core
from .planner import ReadPlan
from .training import COMPUTED, GOT, START, SYNCED, EpochTrace

STEPS_TID = 1  # the step loop's track; reader threads' tracks follow


def trace_name(rank: int) -> str:
    return f"trace_rank{rank}.json.gz"


class RankTrace:
    """One rank's trace, collected over the run and written by `write`."""

    def __init__(self, rank: int, origin0_ns: int, clock_offset_ns: int = 0) -> None:
        """`origin0_ns`: the run's start on rank 0's monotonic clock; `clock_offset_ns`: this
        rank's monotonic clock minus rank 0's."""
        self.rank, self.origin0_ns = rank, origin0_ns
        self.origin_ns = origin0_ns + clock_offset_ns  # the same instant on this rank's clock
        self._spans: list[tuple[str, str, int, int, dict | None]] = []
        self._epochs: list[tuple[str, int, _Requests, EpochTrace, Callable[[int], str]]] = []
        self._tracks: dict[tuple[str, int], int] = {}

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
        self._spans.append((name, cat, start_ns - origin, end_ns - origin, args))

    def epoch(self, phase: str, epoch: int, plan: ReadPlan, trace: EpochTrace,
              path_of: Callable[[int], str]) -> None:
        """Keep an epoch's steps (and requests, when recorded) for the file."""
        n = len(trace.request_trace.start_ns) if trace.request_trace is not None else 0
        requests = _Requests(plan.batch_start, plan.file_idx[:n], plan.offset[:n],
                             plan.length[:n])
        self._epochs.append((phase, epoch, requests, trace, path_of))

    # ------------------------------------------------------------------ writing
    def write(self, fp) -> None:
        """Write the trace (gzip'd JSON) into the binary file `fp`."""
        with gzip.GzipFile(fileobj=fp, mode="wb", compresslevel=1) as gz, \
                io.TextIOWrapper(gz, encoding="utf-8") as out:
            out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            out.write(self._meta("process_name", 0, {"name": f"rank {self.rank}"}))
            out.write(",\n" + self._meta("process_sort_index", 0, {"sort_index": self.rank}))
            out.write(",\n" + self._meta("thread_name", STEPS_TID, {"name": "steps"}))
            for phase, epoch, plan, trace, path_of in self._epochs:
                self._write_steps(out, phase, epoch, trace)
                if trace.request_trace is not None:
                    self._write_requests(out, phase, epoch, plan, trace, path_of)
            for name, cat, start, end, args in self._spans:
                out.write(",\n" + self._event(name, cat, STEPS_TID, start, end, args))
            out.write("\n]}\n")

    def _meta(self, name: str, tid: int, args: dict) -> str:
        return json.dumps({"name": name, "ph": "M", "pid": self.rank, "tid": tid,
                           "args": args})

    def _event(self, name: str, cat: str, tid: int, start_ns: int, end_ns: int,
               args: dict | None) -> str:
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                 "ts": _us(start_ns), "dur": _us(max(end_ns - start_ns, 0))}
        if args:
            event["args"] = args
        return json.dumps(event)

    def _write_steps(self, out, phase: str, epoch: int, trace: EpochTrace) -> None:
        o = self.origin_ns
        out.write(",\n" + self._event(f"{phase} epoch {epoch}", "epoch", STEPS_TID,
                                      trace.block_start_ns - o, trace.block_end_ns - o,
                                      {"epoch": epoch, "steps": trace.steps}))
        prefix = "" if phase == "train" else f"{phase} "
        kinds = [("wait", START, GOT), ("compute", GOT, COMPUTED)]
        if trace.synchronised:
            kinds.append(("barrier", COMPUTED, SYNCED))
        stamps = trace.stamps - o
        for step, row in enumerate(stamps.tolist(), start=1):
            args = {"epoch": epoch, "step": step}
            for kind, begin, end in kinds:
                out.write(",\n" + self._event(prefix + kind, phase, STEPS_TID, row[begin],
                                              row[end], args))

    def _track(self, phase: str, thread: int, out) -> int:
        key = (phase, thread)
        tid = self._tracks.get(key)
        if tid is None:
            tid = self._tracks[key] = STEPS_TID + 1 + len(self._tracks)
            who = "step thread" if thread < 0 else f"thread {thread}"
            out.write(",\n" + self._meta("thread_name", tid, {"name": f"{phase} reader {who}"}))
        return tid

    def _write_requests(self, out, phase: str, epoch: int, plan: _Requests, trace: EpochTrace,
                        path_of: Callable[[int], str]) -> None:
        rt = trace.request_trace
        n = len(rt.start_ns)
        tids = {t: self._track(phase, t, out) for t in np.unique(rt.thread).tolist()}
        files = np.unique(plan.file_idx).tolist()
        paths = dict(zip(files, (json.dumps(path_of(f)) for f in files)))
        lat = trace.lat_ns[:n]
        head = f',\n{{"name": "read", "cat": "{phase} read", "ph": "X", "pid": {self.rank}, '
        columns = zip((np.round((rt.start_ns - self.origin_ns) / 1e3, 3)).tolist(),
                      np.round(lat / 1e3, 3).tolist(), lat.tolist(), rt.thread.tolist(),
                      rt.nread.tolist(), plan.file_idx.tolist(), plan.offset.tolist(),
                      plan.length.tolist(),
                      np.searchsorted(plan.batch_start, np.arange(n), side="right").tolist())
        # formatted by hand, a chunk at a time: json.dumps per request would be the slow part
        chunk: list[str] = []
        for ts, dur, ns, thread, nread, file, offset, length, step in columns:
            chunk.append(f'{head}"tid": {tids[thread]}, "ts": {ts}, "dur": {dur}, "args": '
                         f'{{"file": {paths[file]}, "offset": {offset}, "length": {length}, '
                         f'"bytes": {nread}, "latency_ns": {ns}, "epoch": {epoch}, '
                         f'"step": {step}}}}}')
            if len(chunk) == 4096:
                out.write("".join(chunk))
                chunk.clear()
        out.write("".join(chunk))


class _Requests(NamedTuple):
    """What the trace needs of an epoch's plan (the rest of it is not kept)."""

    batch_start: np.ndarray
    file_idx: np.ndarray
    offset: np.ndarray
    length: np.ndarray


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)
