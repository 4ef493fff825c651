"""Read requests from a run's Chrome trace-event files (output.trace: trace_rank<R>.json or
.json.gz, {"traceEvents": [...]}, or the bare event array Chrome also accepts). A request is
a complete ("X") event whose args hold a numeric offset and length; its rank is the event's
pid (the file's rank without one), its time `ts` and latency `dur` in microseconds, as the
format defines them. Anything else in the files is skipped: a trace that cannot be parsed is
reported, not fatal."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass

import numpy as np

from ..errors import describe
from ..results.names import TRACE_NAME
from ..storage import storage_for, walk

# latency arguments with their unit, read when an event has no usable dur
LATENCY_ARGS = (("latency_us", 1.0), ("latency_ms", 1e3), ("latency_ns", 1e-3),
                ("latency", 1.0))


@dataclass
class Requests:
    """All traced requests of a run, one entry per request, times in microseconds."""

    rank: np.ndarray      # int64
    offset: np.ndarray    # int64, bytes
    length: np.ndarray    # int64, bytes
    start_us: np.ndarray  # float64, from the earliest request
    latency_us: np.ndarray  # float64
    files: int            # trace files read
    problems: list[str]   # files skipped, and why

    def __len__(self) -> int:
        return len(self.rank)


def trace_files(folder: str) -> list[tuple[int, str]]:
    """(rank, path) of the trace files under `folder`, by rank."""
    found = []
    for dirpath, _, names, _ in walk(folder):
        for name in names:
            match = TRACE_NAME.fullmatch(name)
            if match:
                found.append((int(match.group(1)), os.path.join(dirpath, name)))
    return sorted(found)


def read_requests(folder: str) -> Requests | None:
    """The requests traced under `folder`; None when it holds no trace file."""
    files = trace_files(folder)
    if not files:
        return None
    rows: list[tuple[int, int, int, float, float]] = []
    problems = []
    for rank, path in files:
        try:
            events = _events(path)
        except OSError as exc:  # stream's message names the file and what it is
            problems.append(f"{os.path.relpath(path, folder)}: {describe(exc)}")
            continue
        except (ValueError, EOFError) as exc:
            problems.append(f"{os.path.relpath(path, folder)}: {exc}")
            continue
        for event in events:
            row = _request(event, rank)
            if row is not None:
                rows.append(row)
    table = np.array(rows, dtype=np.float64).reshape(-1, 5)
    start = table[:, 3] - table[:, 3].min() if len(table) else table[:, 3]
    return Requests(table[:, 0].astype(np.int64), table[:, 1].astype(np.int64),
                    table[:, 2].astype(np.int64), start, table[:, 4], len(files), problems)


def _events(path: str) -> list:
    """The events of a trace file; OSError when it is not a regular file (a FIFO or device
    in its place is refused by Storage.stream, never waited on) or cannot be read."""
    with storage_for(path).stream(path) as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as fp:
                body = json.load(fp)
        else:
            body = json.load(raw)
    events = body.get("traceEvents") if isinstance(body, dict) else body
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    return events


def _request(event, file_rank: int) -> tuple[int, int, int, float, float] | None:
    if not isinstance(event, dict) or event.get("ph") != "X":
        return None
    args = event.get("args")
    if not isinstance(args, dict):
        return None
    offset, length, ts = _num(args.get("offset")), _num(args.get("length")), _num(event.get("ts"))
    if offset is None or length is None or ts is None:
        return None
    latency = _num(event.get("dur"))
    if latency is None or latency <= 0:
        latency = next((v * scale for key, scale in LATENCY_ARGS
                        if (v := _num(args.get(key))) is not None), 0.0)
    pid = event.get("pid")
    rank = pid if isinstance(pid, int) and not isinstance(pid, bool) else file_rank
    return rank, int(offset), int(length), ts, latency


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
