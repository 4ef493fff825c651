"""Per-rank result files in DLIO's layout, which MLPerf Storage's submission checker asks for
by name (its `.*output\\.json` and `.*per_epoch_stats\\.json` patterns, submission_checker/
constants.py) beside summary.json and per_epoch_stats.json:

- `RANK_output.json`: the released DLIO's (utils/statscounter.py save_data: each rank its own
  `self.output`): the rank's host (`host_memory_GB`, `host_cpu_count`, `host_processor_name`,
  `potential_caching` 0/1, `hostname`) and per epoch ("1", "2", ...) its `au` and
  `throughput` per block (`block1`; `eval` for evaluation), as DLIO computes them per rank
  (AU %, samples/s). DLIO's per-step lists (`load`, `proc`, `compute`) and its /proc dumps
  (`host_cpuinfo`, `host_meminfo`) are not written: dlio-mpi keeps no per-step timings past
  the epoch (their sums are in per_epoch_stats.json's per_rank).
- `RANK_per_epoch_stats.json`: MLPerf's DLIO fork's (same file, save_data), where every rank
  keeps its own per-epoch stats: per epoch the rank's `start`, `end`, `duration`, its `eval`
  and each `save_ckpt<k>` / `load_ckpt<k>` with the rank's own `duration` and `throughput`
  (the checkpoint's size in GB = 2^30 B over the rank's own seconds, as the fork divides).

Rank 0 writes them all from the figures it gathered (the ranks' epoch records, the
checkpoint records with each rank's time), so they are listed in the results manifest with
the other results and replaced with them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .names import iso_time

GB = 2**30
BLOCK = "block1"  # dlio-mpi's epoch is one block of DLIO's (checkpoints pause it, not split)


def output_name(rank: int) -> str:
    return f"{rank}_output.json"


def epoch_stats_name(rank: int) -> str:
    return f"{rank}_per_epoch_stats.json"


def rank_files(hosts: Sequence[Any], per_host_gb: float, train_epochs: Sequence[Any],
               eval_epochs: Sequence[Any], checkpoints: Iterable[tuple[Any, Any]],
               wall_offset_ns: int) -> list[tuple[dict, dict]]:
    """Every rank's RANK_output.json and RANK_per_epoch_stats.json, `hosts[rank]` its host (a
    topology HostInfo); `per_host_gb`: summary.json's data_size_per_host_GB; the epochs:
    EpochSummary lists (one record a rank), read once for all ranks and both files;
    `checkpoints`: (due or None, record) pairs as the run keeps them (checkpoint-only records
    under epoch 1, by their index)."""
    outputs = [_host_fields(host, per_host_gb) for host in hosts]
    stats: list[dict] = [{} for _ in hosts]
    for summary in train_epochs:
        key = str(summary.epoch)
        for record in summary.records:
            span = _span(record.start, record.end)
            # the fork's epoch start and end (start_epoch, end_epoch) in RANK_output.json too
            outputs[record.rank][key] = {"au": {BLOCK: record.au_percentage},
                                         "throughput": {BLOCK: record.samples_per_second},
                                         "start": span["start"], "end": span["end"]}
            stats[record.rank][key] = span
    for summary in eval_epochs:
        key = str(summary.epoch)
        for record in summary.records:
            entry = outputs[record.rank].setdefault(key, {"au": {}, "throughput": {}})
            entry["au"]["eval"] = record.au_percentage
            entry["throughput"]["eval"] = record.samples_per_second
            stats[record.rank].setdefault(key, {})["eval"] = _span(record.start, record.end)
    for due, record in checkpoints:
        epoch, number = (due.epoch, due.block) if due is not None else (1, record.index)
        start = (record.start_ns + wall_offset_ns) / 1e9  # every rank starts after a barrier
        for rank, mine in enumerate(stats):
            own = record.rank_seconds[rank] if rank < len(record.rank_seconds) \
                else record.seconds
            mine.setdefault(str(epoch), {})[f"{record.kind}_ckpt{number}"] = {
                **_span(start, start + own), "duration": own,
                "throughput": record.bytes / GB / own if own > 0 else 0.0}
    for out, host in zip(outputs, hosts):
        out["hostname"] = host.hostname
    return list(zip(outputs, stats))


def _host_fields(host: Any, per_host_gb: float) -> dict:
    memory_gb = host.memory_bytes / GB
    return {"host_memory_GB": memory_gb, "host_cpu_count": host.cpu_count,
            "host_processor_name": host.processor,
            # DLIO: 1 when the data a host reads fits in its memory
            "potential_caching": 1 if per_host_gb <= memory_gb else 0}


def _span(start: float, end: float) -> dict:
    return {"start": _iso(start), "end": _iso(end), "duration": end - start}


def _iso(seconds: float) -> str:
    return iso_time(seconds)
