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

import re
from collections.abc import Iterable, Sequence
from typing import Any

from .names import iso_time

GB = 2**30
BLOCK = "block1"  # dlio-mpi's epoch is one block of DLIO's (checkpoints pause it, not split)
_PER_RANK = re.compile(r"\d+_(output|per_epoch_stats)\.json")


def output_name(rank: int) -> str:
    return f"{rank}_output.json"


def epoch_stats_name(rank: int) -> str:
    return f"{rank}_per_epoch_stats.json"


def is_per_rank_name(name: str) -> bool:
    """Whether a file name is one of these per-rank results (output.log_file may not be)."""
    return _PER_RANK.fullmatch(name) is not None


def rank_outputs(hosts: Sequence[Any], per_host_gb: float, train_epochs: Sequence[Any],
                 eval_epochs: Sequence[Any]) -> list[dict]:
    """DLIO's RANK_output.json of every rank, `hosts[rank]` its host (a topology HostInfo);
    `per_host_gb`: summary.json's data_size_per_host_GB; the epochs: EpochSummary lists (each
    with one record a rank), read once for all ranks."""
    outs = []
    for host in hosts:
        memory_gb = host.memory_bytes / GB
        outs.append({"host_memory_GB": memory_gb, "host_cpu_count": host.cpu_count,
                     "host_processor_name": host.processor,
                     # DLIO: 1 when the data a host reads fits in its memory
                     "potential_caching": 1 if per_host_gb <= memory_gb else 0})
    for key, epochs in (("train", train_epochs), ("eval", eval_epochs)):
        block = BLOCK if key == "train" else "eval"
        for summary in epochs:
            for record in summary.records:
                entry = outs[record.rank].setdefault(str(summary.epoch),
                                                     {"au": {}, "throughput": {}})
                entry["au"][block] = record.au_percentage
                entry["throughput"][block] = record.samples_per_second
                if key == "train":  # the fork's epoch start and end (start_epoch, end_epoch)
                    entry["start"], entry["end"] = _iso(record.start), _iso(record.end)
    for out, host in zip(outs, hosts):
        out["hostname"] = host.hostname
    return outs


def rank_epoch_stats(ranks: int, train_epochs: Sequence[Any], eval_epochs: Sequence[Any],
                     checkpoints: Iterable[tuple[Any, Any]], wall_offset_ns: int
                     ) -> list[dict]:
    """The fork's RANK_per_epoch_stats.json of every rank; `checkpoints`: (due or None,
    record) pairs as the run keeps them (checkpoint-only records under epoch 1, by their
    index)."""
    stats: list[dict] = [{} for _ in range(ranks)]
    for summary in train_epochs:
        for record in summary.records:
            stats[record.rank][str(summary.epoch)] = _span(record.start, record.end)
    for summary in eval_epochs:
        for record in summary.records:
            stats[record.rank].setdefault(str(summary.epoch), {})["eval"] = _span(
                record.start, record.end)
    for due, record in checkpoints:
        epoch, number = (due.epoch, due.block) if due is not None else (1, record.index)
        start = (record.start_ns + wall_offset_ns) / 1e9  # every rank starts after a barrier
        for rank, mine in enumerate(stats):
            own = record.rank_seconds[rank] if rank < len(record.rank_seconds) \
                else record.seconds
            entry = {**_span(start, start + own), "duration": own,
                     "throughput": record.bytes / GB / own if own > 0 else 0.0}
            mine.setdefault(str(epoch), {})[f"{record.kind}_ckpt{number}"] = entry
    return stats


def _span(start: float, end: float) -> dict:
    return {"start": _iso(start), "end": _iso(end), "duration": end - start}


def _iso(seconds: float) -> str:
    return iso_time(seconds)
