"""A run's results folder as the report needs it: summary.json, per_epoch_stats.json and
config.yaml, read without MPI and without matplotlib. Missing fields are None: the report
draws what the results hold."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import UserError, describe
from ..results.names import CONFIG, INTERVAL_STATS, PER_EPOCH_STATS, SUMMARY
from ..storage import storage_for

REQUIRED = (SUMMARY, PER_EPOCH_STATS)


@dataclass
class Epoch:
    """One training epoch's figures (None where the results do not hold them)."""

    epoch: int
    start: str | None
    duration: float | None
    au: float | None
    samples_per_second: float | None
    mib_per_second: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    per_rank: list[dict] = field(default_factory=list)


@dataclass
class RunResults:
    """One results folder."""

    folder: str
    workload: str
    summary: dict
    epochs: list[Epoch]
    checkpoints: list[dict]
    eval_epochs: list[Epoch] = field(default_factory=list)  # evaluation, after its epoch
    # output.stats_interval's rows (interval_stats.json), when the run wrote them
    intervals: list[dict] = field(default_factory=list)

    @property
    def title(self) -> str:
        state = self.state()
        return f"{self.workload} - {self.folder}" + (f" ({state})" if state != "complete" else "")

    @property
    def stopped_by(self) -> str | None:
        """The signal that stopped the run early (summary.json's dlio_mpi.stopped_by)."""
        name = self.summary.get("dlio_mpi", {}).get("stopped_by")
        return name if isinstance(name, str) and name else None

    def state(self) -> str:
        """"complete", or "incomplete, stopped by SIGTERM" for a run that stopped early
        (summary.json's dlio_mpi.complete false): its figures cover what it finished."""
        if self.summary.get("dlio_mpi", {}).get("complete") is not False:
            return "complete"
        signal = self.stopped_by
        return f"incomplete, stopped by {signal}" if signal else "incomplete, stopped early"

    def rank_times(self) -> dict[int, dict[str, float]]:
        """Each rank's wait, compute and barrier (sync) seconds, summed over the epochs."""
        out: dict[int, dict[str, float]] = {}
        for e in self.epochs:
            for row in e.per_rank:
                rank = row.get("rank")
                if not isinstance(rank, int):
                    continue
                mine = out.setdefault(rank, {"wait": 0.0, "compute": 0.0, "barrier": 0.0})
                for key, name in (("wait_seconds", "wait"), ("compute_seconds", "compute"),
                                  ("sync_seconds", "barrier")):
                    mine[name] += _number(row.get(key)) or 0.0
        return dict(sorted(out.items()))

    def key_metrics(self) -> dict[str, object]:
        """The figures the comparison table shows, one row per run."""
        m = self.summary.get("metric", {})
        info = self.summary.get("dlio_mpi", {})
        return {"run": self.folder, "workload": self.workload,
                "state": "complete" if self.state() == "complete" else "incomplete",
                "stopped_by": self.stopped_by,
                "ranks": self.summary.get("num_accelerators"),
                "epochs": self.summary.get("epochs"),
                "format": info.get("format"), "read_mode": info.get("read_mode"),
                "au_percentage": _number(m.get("train_au_mean_percentage")),
                "samples_per_second": _number(m.get("train_throughput_mean_samples_per_second")),
                "MiB_per_second": _number(m.get("train_transfer_mean_MiB_per_second")),
                "read_latency_p50_ms": _number(m.get("train_read_latency_p50_ms")),
                "read_latency_p99_ms": _number(m.get("train_read_latency_p99_ms")),
                "save_checkpoint_GB_per_second":
                    _number(m.get("save_checkpoint_io_mean_GB_per_second")),
                "load_checkpoint_GB_per_second":
                    _number(m.get("load_checkpoint_io_mean_GB_per_second"))}


def read_results(folder: str) -> RunResults:
    """The results in `folder`; UserError naming it when it is not a results folder, or naming
    the file when one of its files is not a regular file (a FIFO there would block a read)."""
    fs = storage_for(folder)
    if not fs.is_folder(folder):
        raise UserError(f"report: {folder} is not a folder")
    missing = [n for n in REQUIRED if not fs.exists(os.path.join(folder, n))]
    if missing:
        raise UserError(f"report: {folder} is not a dlio-mpi results folder (no "
                        f"{' or '.join(missing)}): give the output.folder of a finished run")
    summary = _json(folder, SUMMARY)
    stats = _json(folder, PER_EPOCH_STATS)
    epochs, evals = [], []
    for key, entry in stats.items():
        if not key.isdigit() or not isinstance(entry, dict):
            continue
        if "au_percentage" in entry:
            epochs.append(_epoch(int(key), entry))
        if isinstance(entry.get("eval"), dict) and "au_percentage" in entry["eval"]:
            evals.append(_epoch(int(key), entry["eval"]))
    epochs.sort(key=lambda e: e.epoch)
    evals.sort(key=lambda e: e.epoch)
    checkpoint = summary.get("dlio_mpi", {}).get("checkpoint") or {}
    records = [r for r in checkpoint.get("records", []) if isinstance(r, dict)]
    return RunResults(folder, _workload_name(folder), summary, epochs, records, evals,
                      _intervals(folder))


def _epoch(number: int, entry: dict) -> Epoch:
    """An epoch's figures from its per_epoch_stats.json entry (training's or evaluation's)."""
    rows = entry.get("per_rank")
    return Epoch(number, entry.get("start"), _number(entry.get("duration")),
                 _number(entry.get("au_percentage")),
                 _number(entry.get("throughput_samples_per_second")),
                 _number(entry.get("transfer_MiB_per_second")),
                 _number(entry.get("read_latency_p50_ms")),
                 _number(entry.get("read_latency_p99_ms")),
                 [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else [])


def _intervals(folder: str) -> list[dict]:
    """interval_stats.json's rows that hold a time and a rate (none without the file)."""
    path = os.path.join(folder, INTERVAL_STATS)
    if not storage_for(path).exists(path):
        return []
    rows = _load(path, json.load)
    return [r for r in rows if isinstance(r, dict) and _number(r.get("start_s")) is not None
            and _number(r.get("seconds")) is not None
            and _number(r.get("MiB_per_second")) is not None] if isinstance(rows, list) else []


def _load(path: str, parse):
    """`parse` of the file at `path`, opened so that a FIFO or device in its place is refused
    rather than blocking (Storage.stream); UserError naming the file when it cannot be."""
    try:
        with storage_for(path).stream(path) as fp:
            return parse(fp)
    except OSError as exc:
        what = describe(exc)  # stream's names the file, and what it is when not a regular one
        if path not in what:
            what = f"cannot read {path}: {what}"
        raise UserError(f"report: {what}; the report reads only the regular files a run "
                        "wrote: give the output.folder of a finished run") from exc
    except ValueError as exc:
        raise UserError(f"report: cannot read {path}: {exc}") from exc


def _json(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    body = _load(path, json.load)
    if not isinstance(body, dict):
        raise UserError(f"report: {path} is not a dlio-mpi results file (not a JSON object)")
    return body


def _workload_name(folder: str) -> str:
    """The workload's model name from the run's config.yaml (the folder's name without it)."""
    import yaml

    path = os.path.join(folder, CONFIG)
    if storage_for(path).exists(path):
        try:  # a FIFO or folder there is refused by name (_load); a YAML without it, skipped
            name = _load(path, yaml.safe_load)["workload"]["model"]["name"]
            if isinstance(name, str) and name:
                return name
        except (yaml.YAMLError, KeyError, TypeError):
            pass
    return os.path.basename(os.path.normpath(folder))


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
