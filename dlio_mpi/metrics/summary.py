"""From per-rank epoch traces to the job's results: each rank condenses its trace to an
`EpochRecord`; rank 0 gathers them and builds summary.json (DLIO field names where the meaning
is the same, plus what DLIO does not report) and per_epoch_stats.json."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from ..training import EpochTrace
from . import latency
from .au import block_metrics

MIB = 2**20


@dataclass
class EpochRecord:
    """One rank's epoch, condensed (small enough to gather)."""

    epoch: int
    rank: int
    steps: int
    start: float            # wall clock, seconds since the epoch
    end: float
    block_seconds: float
    au_percentage: float
    samples_per_second: float
    wait_seconds: float
    compute_seconds: float
    sync_seconds: float
    compute_overshoot_ms: float  # mean of slept minus planned compute time per step
    bytes_requested: int
    bytes_read: int
    read_ops: int
    requests: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_hist: np.ndarray


def condense(trace: EpochTrace, rank: int, batch_size: int, exclude_start: int,
             exclude_end: int, clock_offset_ns: int) -> EpochRecord:
    """Compute this rank's metrics for one epoch; clock_offset_ns maps monotonic to wall."""
    block = block_metrics(trace.wait_ns / 1e9, trace.compute_ns / 1e9, trace.block_seconds,
                          batch_size, exclude_start, exclude_end)
    lat = trace.lat_ns
    p50, p99 = (np.percentile(lat, [50, 99]) / 1e6) if len(lat) else (0.0, 0.0)
    return EpochRecord(
        epoch=trace.epoch, rank=rank, steps=trace.steps,
        start=(trace.block_start_ns + clock_offset_ns) / 1e9,
        end=(trace.block_end_ns + clock_offset_ns) / 1e9,
        block_seconds=trace.block_seconds, au_percentage=block.au_percentage,
        samples_per_second=block.samples_per_second,
        wait_seconds=float(trace.wait_ns.sum()) / 1e9,
        compute_seconds=float(trace.compute_ns.sum()) / 1e9,
        sync_seconds=float(trace.sync_ns.sum()) / 1e9,
        compute_overshoot_ms=float(np.mean(trace.compute_ns - trace.planned_compute_ns)) / 1e6
        if trace.steps else 0.0,
        bytes_requested=trace.bytes_requested, bytes_read=trace.bytes_read,
        read_ops=trace.read_ops, requests=trace.requests, latency_p50_ms=float(p50),
        latency_p99_ms=float(p99), latency_hist=latency.histogram(lat))


def _spread(values) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) + \
        f".{int(seconds % 1 * 1e6):06d}"


@dataclass(frozen=True)
class EpochSummary:
    """All ranks' view of one epoch."""

    epoch: int
    records: list[EpochRecord]

    @property
    def au_percentage(self) -> float:  # mean over ranks (DLIO)
        return float(np.mean([r.au_percentage for r in self.records]))

    @property
    def samples_per_second(self) -> float:  # sum over ranks (DLIO)
        return float(np.sum([r.samples_per_second for r in self.records]))

    @property
    def seconds(self) -> float:  # slowest rank's block
        return max(r.block_seconds for r in self.records)

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.records)

    @property
    def mib_per_second(self) -> float:  # bytes actually read over the epoch's wall time
        return self.bytes_read / MIB / self.seconds if self.seconds > 0 else 0.0

    def latency_hist(self) -> np.ndarray:
        return np.sum([r.latency_hist for r in self.records], axis=0)

    def to_json(self) -> dict:
        hist = self.latency_hist()
        return {
            "start": _iso(min(r.start for r in self.records)),
            "end": _iso(max(r.end for r in self.records)),
            "duration": round(self.seconds, 6),
            "steps": self.records[0].steps,
            "au_percentage": self.au_percentage,
            "throughput_samples_per_second": self.samples_per_second,
            "io_MB_per_second": self.mib_per_second,
            "bytes_read": self.bytes_read,
            "bytes_requested": sum(r.bytes_requested for r in self.records),
            "read_ops": sum(r.read_ops for r in self.records),
            "requests": sum(r.requests for r in self.records),
            "read_latency_p50_ms": latency.percentile_ns(hist, 50) / 1e6,
            "read_latency_p99_ms": latency.percentile_ns(hist, 99) / 1e6,
            "per_rank": [
                {k: v for k, v in asdict(r).items() if k not in ("latency_hist", "epoch")}
                for r in self.records],
        }


def phase_metrics(phase: str, epochs: list[EpochSummary], au_target: float) -> dict:
    """The `<phase>_*` metrics (phase "train" or "eval") over a phase's epochs: DLIO's fields,
    then what DLIO does not report (bytes really transferred, latency, where time went)."""
    if not epochs:
        return {}
    au = [e.au_percentage for e in epochs]
    thr = [e.samples_per_second for e in epochs]
    mbs = [e.mib_per_second for e in epochs]
    records = [r for e in epochs for r in e.records]
    ranks = sorted({r.rank for r in records})

    def per_rank(field: str) -> dict:
        return _spread([sum(getattr(r, field) for r in records if r.rank == rank)
                        for rank in ranks])

    rank_au = [float(np.mean([r.au_percentage for r in records if r.rank == rank]))
               for rank in ranks]
    hist = np.sum([e.latency_hist() for e in epochs], axis=0)
    return {
        f"{phase}_au_percentage": au,
        f"{phase}_au_mean_percentage": float(np.mean(au)),
        f"{phase}_au_stdev_percentage": float(np.std(au)),
        f"{phase}_au_meet_expectation": "success" if np.mean(au) >= 100 * au_target else "fail",
        f"{phase}_throughput_samples_per_second": thr,
        f"{phase}_throughput_mean_samples_per_second": float(np.mean(thr)),
        f"{phase}_throughput_stdev_samples_per_second": float(np.std(thr)),
        f"{phase}_io_mean_MB_per_second": float(np.mean(mbs)),
        f"{phase}_io_stdev_MB_per_second": float(np.std(mbs)),
        f"{phase}_bytes_read": int(sum(r.bytes_read for r in records)),
        f"{phase}_bytes_requested": int(sum(r.bytes_requested for r in records)),
        f"{phase}_read_ops": int(sum(r.read_ops for r in records)),
        f"{phase}_requests": int(sum(r.requests for r in records)),
        f"{phase}_read_latency_p50_ms": latency.percentile_ns(hist, 50) / 1e6,
        f"{phase}_read_latency_p99_ms": latency.percentile_ns(hist, 99) / 1e6,
        f"{phase}_wait_seconds_per_rank": per_rank("wait_seconds"),
        f"{phase}_compute_seconds_per_rank": per_rank("compute_seconds"),
        f"{phase}_sync_seconds_per_rank": per_rank("sync_seconds"),
        f"{phase}_bytes_read_per_rank": per_rank("bytes_read"),
        f"{phase}_au_percentage_per_rank": _spread(rank_au),
    }


def build_summary(train: list[EpochSummary], evals: list[EpochSummary], cfg,
                  header: dict) -> dict:
    """summary.json's content (rank 0)."""
    metric = {**phase_metrics("train", train, cfg.metric.au),
              **phase_metrics("eval", evals, cfg.metric.au)}
    return {**header, "epochs": len(train), "metric": metric}


def _rows(phase: str, epochs: list[EpochSummary]) -> list[str]:
    rows = []
    for e in epochs:
        j = e.to_json()
        rows.append(
            f"{phase:>5} {e.epoch:>5} {e.au_percentage:>7.2f} {e.samples_per_second:>11.1f} "
            f"{e.mib_per_second:>9.1f} {max(r.wait_seconds for r in e.records):>8.3f} "
            f"{max(r.compute_seconds for r in e.records):>9.3f} "
            f"{max(r.sync_seconds for r in e.records):>8.3f} "
            f"{j['read_latency_p50_ms']:>8.3f} {j['read_latency_p99_ms']:>8.3f}")
    return rows


def format_table(train: list[EpochSummary], evals: list[EpochSummary], summary: dict) -> str:
    """The short table rank 0 prints."""
    rows = [f"{'phase':>5} {'epoch':>5} {'AU %':>7} {'samples/s':>11} {'MiB/s':>9} "
            f"{'wait s':>8} {'compute s':>9} {'sync s':>8} {'p50 ms':>8} {'p99 ms':>8}",
            *_rows("train", train), *_rows("eval", evals)]
    m = summary["metric"]
    for phase in ("train", "eval"):
        if f"{phase}_au_mean_percentage" not in m:
            continue
        rows.append(
            f"{phase} AU {m[f'{phase}_au_mean_percentage']:.2f} % (stdev "
            f"{m[f'{phase}_au_stdev_percentage']:.2f}) -> {m[f'{phase}_au_meet_expectation']}; "
            f"{m[f'{phase}_throughput_mean_samples_per_second']:.1f} samples/s; "
            f"{m[f'{phase}_io_mean_MB_per_second']:.1f} MiB/s read "
            f"({m[f'{phase}_bytes_read'] / MIB:.1f} MiB in {m[f'{phase}_read_ops']} reads)")
    rows.append("(wait/compute/sync: slowest rank's total per epoch)")
    return "\n".join(rows)
