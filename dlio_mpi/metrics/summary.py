"""From per-rank epoch traces to the job's results: each rank condenses its trace to an
`EpochRecord`; rank 0 gathers them and builds summary.json and per_epoch_stats.json.

Fields named as DLIO's mean what they mean in the released DLIO 2.0.0 package (same formula,
units, type). What DLIO does not report has names of its own: bytes storage really returned,
read latency, where the time went (storage stalls, waiting for slower ranks) and the emulator's
own overhead per step (sleep overshoot, barrier wake-up past the last rank's arrival, loop time),
kept apart from storage."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, fields

import numpy as np

from ..results import jsonfile
from ..results.names import iso_time
from . import latency
from .au import block_metrics
from .epoch_trace import COMPUTED, SYNCED, EpochTrace

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
    au_without_barrier_percentage: float
    samples_per_second: float           # DLIO 2.0.0: steps * batch / block time
    au_span_samples_per_second: float   # measured steps * batch / AU's denominator
    au_span_seconds: float
    au_span_bytes_transferred: int             # bytes returned for the measured steps' batches
    wait_seconds: float
    compute_seconds: float
    sync_seconds: float
    host_seconds: float                 # taking the batches (reader.step_cpu_time, step_wait_time)
    preprocess_cpu_seconds: float       # reader threads' reader.preprocess_cpu_time ...
    preprocess_wall_seconds: float      # ... and the wall time it took (shared cores: more)
    loader_startup_seconds: float       # reader.startup_time, spent in this epoch
    checkpoint_pause_seconds: float     # checkpoints between the epoch's blocks (not in block)
    storage_stall_seconds: float        # waiting for batches that were not complete yet
    sync_imbalance_seconds: float       # in the barrier, until the last rank arrived
    overshoot_us_per_step: float        # compute wait returning past its deadline
    sync_wakeup_us_per_step: float      # barrier returning past the last rank's arrival
    loop_us_per_step: float             # from batch complete (or step start) to compute start
    bytes_requested: int
    bytes_read: int                     # sample bytes delivered
    bytes_transferred: int              # everything storage returned (headers, alignment...)
    read_ops: int
    requests: int
    opens: int
    closes: int
    stats: int
    latency_hist: np.ndarray
    cache: dict | None = None           # reader.cache: this rank's figures (cache_tier)

    @property
    def overhead_us_per_step(self) -> float:
        return self.overshoot_us_per_step + self.sync_wakeup_us_per_step + self.loop_us_per_step


def _mean_us(values: np.ndarray) -> float:
    return float(np.mean(values)) / 1e3 if len(values) else 0.0


def condense(trace: EpochTrace, last_arrival: np.ndarray | None, rank: int, batch_size: int,
             bytes_requested: int, exclude_start: int, exclude_end: int,
             clock_offset_ns: int) -> EpochRecord:
    """This rank's metrics for one epoch. `last_arrival` is the latest arrival at each step's
    barrier over all ranks (this rank's clock), None without barriers; clock_offset_ns maps the
    monotonic clock to wall time."""
    sync = trace.sync_ns
    # a step's host work (reader.step_cpu_time, step_wait_time) is neither wait nor compute;
    # AU's excluded steps leave it out with them, as a real job's wait for its batch holds it
    block = block_metrics((trace.wait_ns + trace.host_ns) / 1e9, trace.compute_ns / 1e9,
                          trace.planned_compute_ns / 1e9, sync / 1e9, trace.block_seconds,
                          batch_size, exclude_start, exclude_end)
    if last_arrival is None:
        wakeup = imbalance = np.zeros(trace.steps, dtype=np.int64)
    else:
        wakeup = np.maximum(trace.column(SYNCED) - last_arrival, 0)
        imbalance = sync - wakeup
    measured = slice(block.first, block.last + 1)
    return EpochRecord(
        epoch=trace.epoch, rank=rank, steps=trace.steps,
        start=(trace.block_start_ns + clock_offset_ns) / 1e9,
        end=(trace.block_end_ns + clock_offset_ns) / 1e9,
        block_seconds=trace.block_seconds, au_percentage=block.au_percentage,
        au_without_barrier_percentage=block.au_without_barrier_percentage,
        samples_per_second=block.samples_per_second,
        au_span_samples_per_second=block.au_span_samples_per_second,
        au_span_seconds=block.measured_seconds,
        au_span_bytes_transferred=int(trace.step_bytes[measured].sum()),
        wait_seconds=float(trace.wait_ns.sum()) / 1e9,
        compute_seconds=float(trace.compute_ns.sum()) / 1e9,
        sync_seconds=float(sync.sum()) / 1e9,
        host_seconds=float(trace.host_ns.sum()) / 1e9,
        preprocess_cpu_seconds=trace.preprocess_cpu_ns / 1e9,
        preprocess_wall_seconds=trace.preprocess_wall_ns / 1e9,
        loader_startup_seconds=trace.loader_startup_ns / 1e9,
        checkpoint_pause_seconds=trace.pause_ns / 1e9,
        storage_stall_seconds=float(trace.stall_ns.sum()) / 1e9,
        sync_imbalance_seconds=float(imbalance.sum()) / 1e9,
        overshoot_us_per_step=_mean_us(trace.overshoot_ns[trace.planned_compute_ns > 0]),
        sync_wakeup_us_per_step=_mean_us(wakeup) if trace.synchronised else 0.0,
        loop_us_per_step=_mean_us(trace.loop_ns),
        bytes_requested=bytes_requested, bytes_read=trace.payload_bytes,
        bytes_transferred=int(trace.step_bytes.sum()),
        read_ops=int(trace.step_read_ops.sum()), requests=trace.requests,
        opens=trace.opens, closes=trace.closes, stats=trace.stats,
        latency_hist=latency.histogram(trace.lat_ns), cache=trace.cache)


def last_arrivals(comm, trace: EpochTrace, clock_offset_ns: int) -> np.ndarray | None:
    """Collectively: each step's latest barrier arrival over all ranks, on this rank's clock
    (clock_offset_ns: this rank's monotonic clock minus the reference clock)."""
    if not trace.synchronised:
        return None
    from mpi4py import MPI

    mine = trace.column(COMPUTED) - clock_offset_ns
    latest = np.empty_like(mine)
    comm.Allreduce(np.ascontiguousarray(mine), latest, op=MPI.MAX)
    return latest + clock_offset_ns


def _spread(values) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


# what EpochSummary means (the first three) or sums over the ranks
_OVER_RANKS = ("au_percentage", "au_without_barrier_percentage", "overhead_us_per_step",
               "samples_per_second", "au_span_samples_per_second")


@dataclass(frozen=True)
class EpochSummary:
    """All ranks' view of one epoch. `record_length` is DLIO's record length in bytes (for its
    MB/s, which is samples/s x record length). Its figures are computed once (the epoch's line,
    its entry in per_epoch_stats.json, the table and the phase's metrics all read them)."""

    epoch: int
    records: list[EpochRecord]
    record_length: float

    @functools.cached_property
    def _over_ranks(self) -> list[float]:
        # _OVER_RANKS' sums over the ranks in one numpy call: each C-contiguous row is
        # reduced as np.sum and np.mean reduce it alone, to the bit
        rows = np.array([[getattr(r, name) for r in self.records] for name in _OVER_RANKS],
                        dtype=np.float64)
        return np.add.reduce(rows, axis=1).tolist()

    @property
    def au_percentage(self) -> float:  # mean over ranks (DLIO)
        return self._over_ranks[0] / len(self.records)

    @property
    def au_without_barrier_percentage(self) -> float:
        return self._over_ranks[1] / len(self.records)

    @property
    def overhead_us_per_step(self) -> float:
        return self._over_ranks[2] / len(self.records)

    @property
    def samples_per_second(self) -> float:  # sum over ranks (DLIO)
        return self._over_ranks[3]

    @property
    def au_span_samples_per_second(self) -> float:
        return self._over_ranks[4]

    @property
    def dlio_mb_per_second(self) -> float:  # DLIO: samples/s x record length / 2^20
        return self.samples_per_second * self.record_length / MIB

    @functools.cached_property
    def transfer_mib_per_second(self) -> float:
        """Bytes storage returned for the measured steps' batches over AU's span, all ranks."""
        return float(sum(r.au_span_bytes_transferred / r.au_span_seconds
                         for r in self.records if r.au_span_seconds > 0)) / MIB

    @functools.cached_property
    def epoch_transfer_mib_per_second(self) -> float:
        """Bytes storage returned in the whole epoch (step 0's batch, read-ahead, files loaded
        once included) over the epoch's duration, all ranks: beside the figure over AU's span,
        which is 0 where the measured steps' batches read nothing (a file loaded at step 0)."""
        seconds = self.seconds
        return float(sum(r.bytes_transferred for r in self.records)) / MIB / seconds \
            if seconds > 0 else 0.0

    @functools.cached_property
    def seconds(self) -> float:  # slowest rank's block
        return max(r.block_seconds for r in self.records)

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.records)

    @functools.cached_property
    def _hist(self) -> np.ndarray:
        return functools.reduce(np.add, [r.latency_hist for r in self.records])

    def latency_hist(self) -> np.ndarray:
        """The ranks' read latencies merged (not to be changed: it is kept)."""
        return self._hist

    @functools.cached_property
    def read_latency_ms(self) -> tuple[float, float]:
        """p50 and p99."""
        p50, p99 = latency.percentiles_ns(self._hist, (50, 99))
        return p50 / 1e6, p99 / 1e6

    def json_text(self) -> str:
        """to_json() encoded, once (run_phase_epoch asks for it as the epoch ends: a stopped
        run then only writes it out)."""
        return self._json_text

    @functools.cached_property
    def _json_text(self) -> str:
        return jsonfile.encode(self.to_json())

    def to_json(self) -> dict:
        """The epoch's entry in per_epoch_stats.json."""
        records = self.records
        p50, p99 = self.read_latency_ms
        return {
            "start": iso_time(min(r.start for r in records)),
            "end": iso_time(max(r.end for r in records)),
            "duration": round(self.seconds, 6),
            "steps": records[0].steps,
            "checkpoint_pause_seconds": max(r.checkpoint_pause_seconds for r in records),
            "au_percentage": self.au_percentage,
            "au_without_barrier_percentage": self.au_without_barrier_percentage,
            "throughput_samples_per_second": self.samples_per_second,
            "au_span_throughput_samples_per_second": self.au_span_samples_per_second,
            "io_MB_per_second": self.dlio_mb_per_second,
            "transfer_MiB_per_second": self.transfer_mib_per_second,
            "epoch_transfer_MiB_per_second": self.epoch_transfer_mib_per_second,
            "bytes_read": self.bytes_read,
            "metadata_bytes_read": sum(r.bytes_transferred - r.bytes_read for r in records),
            "bytes_transferred": sum(r.bytes_transferred for r in records),
            "bytes_requested": sum(r.bytes_requested for r in records),
            "read_ops": sum(r.read_ops for r in records),
            "requests": sum(r.requests for r in records),
            "file_opens": sum(r.opens for r in records),
            "file_closes": sum(r.closes for r in records),
            "file_stats": sum(r.stats for r in records),
            "read_latency_p50_ms": p50,
            "read_latency_p99_ms": p99,
            "emulator_overhead_us_per_step": self.overhead_us_per_step,
            **({"cache": combine_cache([r.cache for r in records])}
               if all(r.cache for r in records) else {}),
            "per_rank": [_rank_json(r) for r in records],
        }


# a rank's fields in per_epoch_stats.json's per_rank, in EpochRecord's order (its cache last,
# where it has one), read with one attrgetter: dataclasses.asdict, which deep-copies every
# field (the latency histogram too), took 0.2 ms an epoch on 2 ranks
_RANK_FIELDS = tuple(f.name for f in fields(EpochRecord)
                     if f.name not in ("epoch", "latency_hist", "cache"))
_rank_values = operator.attrgetter(*_RANK_FIELDS)
# ... and with the overhead, the columns phase_metrics sums and averages per rank
_PHASE_FIELDS = (*_RANK_FIELDS, "overhead_us_per_step")
_phase_values = operator.attrgetter(*_PHASE_FIELDS)


def _rank_json(record: EpochRecord) -> dict:
    entry = dict(zip(_RANK_FIELDS, _rank_values(record)))
    if record.cache:
        entry["cache"] = dict(record.cache)
    return entry


def per_epoch_stats(train: list[EpochSummary], evals: list[EpochSummary],
                    extra: dict[int, dict] | None = None) -> dict[str, jsonfile.Encoded]:
    """per_epoch_stats.json's epochs (by number, as strings), each training epoch's entry as
    encoded when it ended, with its evaluation's under `eval` and `extra`'s members for the
    epoch (the checkpoints'), as dict.update adds them; an epoch with only `extra`'s after."""
    texts = {str(e.epoch): e.json_text() for e in train}
    added: dict[str, dict] = {epoch: {} for epoch in texts}
    for e in evals:
        added.setdefault(str(e.epoch), {})["eval"] = jsonfile.Encoded(e.json_text())
    for epoch, members in (extra or {}).items():
        added.setdefault(str(epoch), {}).update(members)
    return {epoch: jsonfile.with_members(texts.get(epoch, "{}"), members)
            for epoch, members in added.items()}


def phase_metrics(phase: str, epochs: list[EpochSummary], au_target: float) -> dict:
    """The `<phase>_*` metrics (phase "train" or "eval") over a phase's epochs: DLIO's fields
    first, then ours."""
    if not epochs:
        return {}
    au = [e.au_percentage for e in epochs]
    thr = [e.samples_per_second for e in epochs]
    record_length = epochs[0].record_length
    ranks = _rank_columns(epochs)

    def per_rank_sum(field: str) -> dict:
        return _spread([sum(mine[field]) for mine in ranks])

    def per_rank_mean(field: str) -> dict:
        return _spread([np.mean(mine[field]) for mine in ranks])

    def total(field: str) -> int:
        return int(sum(sum(mine[field]) for mine in ranks))

    hist = np.zeros_like(epochs[0].latency_hist())
    for e in epochs:
        hist += e.latency_hist()
    no_barrier = [e.au_without_barrier_percentage for e in epochs]
    span_thr = [e.au_span_samples_per_second for e in epochs]
    read_rate = [e.transfer_mib_per_second for e in epochs]
    epoch_rate = [e.epoch_transfer_mib_per_second for e in epochs]
    return {
        # DLIO 2.0.0's fields, its formulas
        f"{phase}_au_percentage": au,
        f"{phase}_au_mean_percentage": float(np.mean(au)),
        f"{phase}_au_stdev_percentage": float(np.std(au)),
        f"{phase}_au_meet_expectation": "success" if np.mean(au) >= 100 * au_target else "fail",
        f"{phase}_throughput_samples_per_second": thr,
        f"{phase}_throughput_mean_samples_per_second": float(np.mean(thr)),
        f"{phase}_throughput_stdev_samples_per_second": float(np.std(thr)),
        f"{phase}_io_mean_MB_per_second": float(np.mean(thr)) * record_length / MIB,
        f"{phase}_io_stdev_MB_per_second": float(np.std(thr)) * record_length / MIB,
        # ours
        f"{phase}_au_without_barrier_percentage": no_barrier,
        f"{phase}_au_without_barrier_mean_percentage": float(np.mean(no_barrier)),
        f"{phase}_au_span_throughput_samples_per_second": span_thr,
        f"{phase}_au_span_throughput_mean_samples_per_second": float(np.mean(span_thr)),
        f"{phase}_transfer_MiB_per_second": read_rate,
        f"{phase}_transfer_mean_MiB_per_second": float(np.mean(read_rate)),
        f"{phase}_epoch_transfer_MiB_per_second": epoch_rate,
        f"{phase}_epoch_transfer_mean_MiB_per_second": float(np.mean(epoch_rate)),
        f"{phase}_bytes_read": total("bytes_read"),
        f"{phase}_metadata_bytes_read": total("bytes_transferred") - total("bytes_read"),
        f"{phase}_bytes_transferred": total("bytes_transferred"),
        f"{phase}_bytes_requested": total("bytes_requested"),
        f"{phase}_read_ops": total("read_ops"),
        f"{phase}_requests": total("requests"),
        f"{phase}_file_opens": total("opens"),
        f"{phase}_file_closes": total("closes"),
        f"{phase}_file_stats": total("stats"),
        f"{phase}_file_opens_per_rank": per_rank_sum("opens"),
        f"{phase}_read_ops_per_rank": per_rank_sum("read_ops"),
        f"{phase}_read_latency_p50_ms": latency.percentile_ns(hist, 50) / 1e6,
        f"{phase}_read_latency_p99_ms": latency.percentile_ns(hist, 99) / 1e6,
        f"{phase}_wait_seconds_per_rank": per_rank_sum("wait_seconds"),
        f"{phase}_compute_seconds_per_rank": per_rank_sum("compute_seconds"),
        f"{phase}_sync_seconds_per_rank": per_rank_sum("sync_seconds"),
        # the loader's modelled costs (reader.step_*_time, preprocess_cpu_time, startup_time)
        f"{phase}_host_seconds_per_rank": per_rank_sum("host_seconds"),
        f"{phase}_preprocess_cpu_seconds_per_rank": per_rank_sum("preprocess_cpu_seconds"),
        f"{phase}_preprocess_wall_seconds_per_rank": per_rank_sum("preprocess_wall_seconds"),
        f"{phase}_loader_startup_seconds_per_rank": per_rank_sum("loader_startup_seconds"),
        f"{phase}_storage_stall_seconds_per_rank": per_rank_sum("storage_stall_seconds"),
        f"{phase}_sync_imbalance_seconds_per_rank": per_rank_sum("sync_imbalance_seconds"),
        f"{phase}_bytes_read_per_rank": per_rank_sum("bytes_read"),
        f"{phase}_au_percentage_per_rank": per_rank_mean("au_percentage"),
        f"{phase}_emulator_overhead_us_per_step": {
            "sleep_overshoot": per_rank_mean("overshoot_us_per_step"),
            "sync_wakeup": per_rank_mean("sync_wakeup_us_per_step"),
            "loop": per_rank_mean("loop_us_per_step"),
            "total": per_rank_mean("overhead_us_per_step"),
        },
    }


def _rank_columns(epochs: list[EpochSummary]) -> list[dict[str, tuple]]:
    """Each rank's figures, a column each over its epochs in order, read in one pass (sums
    over the ranks' records field by field took 0.15 s at 5,800 epochs of 2 ranks)."""
    rows: dict[int, list[tuple]] = {}
    for e in epochs:
        for r in e.records:
            rows.setdefault(r.rank, []).append(_phase_values(r))
    return [dict(zip(_PHASE_FIELDS, zip(*rows[rank]))) for rank in sorted(rows)]


def node_bandwidth(epochs: list[EpochSummary], node_of_rank: list[int],
                   hostnames: list[str]) -> list[dict]:
    """Per node (ours, dlio_mpi.bandwidth_per_node): the bytes storage returned to its ranks
    over the epochs and their rate over the epochs' time (each epoch's slowest rank's block,
    the same time for every node, so that nodes compare)."""
    seconds = float(sum(e.seconds for e in epochs))
    per_node = [0] * len(hostnames)
    for e in epochs:
        for r in e.records:
            per_node[node_of_rank[r.rank]] += r.bytes_transferred
    rows = []
    for node, host in enumerate(hostnames):
        ranks = [r for r, n in enumerate(node_of_rank) if n == node]
        nbytes = int(per_node[node])
        rows.append({"node": node, "hostname": host, "ranks": ranks,
                     "bytes_transferred": nbytes, "seconds": seconds,
                     "MiB_per_second": nbytes / MIB / seconds if seconds > 0 else 0.0})
    return rows


def build_summary(train: list[EpochSummary], evals: list[EpochSummary], cfg,
                  header: dict) -> dict:
    """summary.json's content (rank 0)."""
    metric = {**phase_metrics("train", train, cfg.metric.au),
              **phase_metrics("eval", evals, cfg.metric.au)}
    return {**header, "epochs": len(train), "metric": metric}


TABLE_EPOCHS = 40  # a phase's epochs in the table at most: its first and last halves


def _rows(phase: str, epochs: list[EpochSummary], host: bool) -> list[str]:
    """The phase's rows; a phase of more than TABLE_EPOCHS epochs shows its first and last
    TABLE_EPOCHS / 2 and a line naming those left out (thousands of rows cost seconds on a
    terminal, after a stop too)."""
    half = TABLE_EPOCHS // 2
    left_out = epochs[half:-half] if len(epochs) > TABLE_EPOCHS else []
    rows = []
    for k, e in enumerate(epochs[:half] + epochs[-half:] if left_out else epochs):
        if left_out and k == half:
            rows.append(f"{phase:>5}   ... {len(left_out):,} epochs left out here "
                        f"({left_out[0].epoch:,} to {left_out[-1].epoch:,}): "
                        "per_epoch_stats.json holds every epoch")
        hosted = f"{max(r.host_seconds for r in e.records):>8.3f} " if host else ""
        p50, p99 = e.read_latency_ms
        rows.append(
            f"{phase:>5} {e.epoch:>5} {e.au_percentage:>7.2f} "
            f"{e.au_without_barrier_percentage:>7.2f} {e.samples_per_second:>11.1f} "
            f"{e.transfer_mib_per_second:>9.1f} {max(r.wait_seconds for r in e.records):>8.3f} "
            f"{hosted}{max(r.compute_seconds for r in e.records):>9.3f} "
            f"{max(r.sync_seconds for r in e.records):>8.3f} "
            f"{e.overhead_us_per_step:>8.1f} {p50:>8.3f} {p99:>8.3f}")
    return rows


def _checkpoint_split(summary: dict, kind: str) -> str:
    """The table's verdict on a kind of checkpoint phase: the emulator's largest share."""
    split = ((summary.get("dlio_mpi") or {}).get("checkpoint") or {}).get(
        "time_split", {}).get(kind)
    if not split:
        return ""
    verdict = ("LIMITED BY THE EMULATOR" if split["limited_by"] == "emulator"
               else "limited by the storage")
    return f"; the emulator's share {100 * split['emulator_share_max']:.1f} % at most: {verdict}"


def format_table(train: list[EpochSummary], evals: list[EpochSummary], summary: dict) -> str:
    """The short table rank 0 prints (a `host s` column where reader.step_cpu_time or
    step_wait_time acts)."""
    host = any(r.host_seconds > 0 for e in [*train, *evals] for r in e.records)
    rows = [f"{'phase':>5} {'epoch':>5} {'AU %':>7} {'AU-sync':>7} {'samples/s':>11} "
            f"{'MiB/s':>9} {'wait s':>8} {'  host s ' if host else ''}{'compute s':>9} "
            f"{'sync s':>8} {'ovh us':>8} {'p50 ms':>8} {'p99 ms':>8}",
            *_rows("train", train, host), *_rows("eval", evals, host)] if train or evals else []
    m = summary["metric"]
    for phase in ("train", "eval"):
        if f"{phase}_au_mean_percentage" not in m:
            continue
        rows.append(
            f"{phase} AU {m[f'{phase}_au_mean_percentage']:.2f} % (stdev "
            f"{m[f'{phase}_au_stdev_percentage']:.2f}) -> {m[f'{phase}_au_meet_expectation']}; "
            f"{m[f'{phase}_throughput_mean_samples_per_second']:.1f} samples/s; "
            f"{m[f'{phase}_transfer_mean_MiB_per_second']:.1f} MiB/s read "
            f"({m[f'{phase}_bytes_transferred'] / MIB:.1f} MiB in {m[f'{phase}_read_ops']} "
            f"reads, {m[f'{phase}_file_opens']} opens)")
    for kind in ("save", "load"):
        if f"{kind}_checkpoint_io_mean_GB_per_second" in m:
            rows.append(
                f"checkpoint {kind}: {m[f'{kind}_checkpoint_io_mean_GB_per_second']:.3f} GiB/s "
                f"mean (stdev {m[f'{kind}_checkpoint_io_stdev_GB_per_second']:.3f}), "
                f"{m[f'{kind}_checkpoint_duration_mean_seconds']:.3f} s mean per checkpoint of "
                f"{m['checkpoint_size_GB']:.3f} GiB (duration: the slowest rank's)"
                + _checkpoint_split(summary, kind))
    if train or evals:
        rows.append("(AU-sync: AU without the per-step barrier; MiB/s: bytes storage returned "
                    "over AU's span; wait/compute/sync: slowest rank's total"
                    + ("; host: taking the batches, reader.step_*_time" if host else "")
                    + "; ovh: the emulator's own time per step)")
    return "\n".join(rows)


def combine_cache(records: list[dict]) -> dict:
    """The node's or job's cache-tier figures of an epoch (summary.json), from the ranks'
    (tiers/cache.py: epoch_cache)."""
    total = {k: sum(r[k] for r in records) for k in records[0]}
    reads = total["requests"]
    # the *_after_fallback figures: requests planned to read a copy that found it gone and
    # read the data folder's file instead (fallbacks: the opens that found it gone)
    return {"hit_ratio": round(total["hits"] / reads, 6) if reads else 0.0,
            "requests": reads, "hits": total["hits"],
            "planned_hits_from_pfs": total["cache_hit_fallbacks"],
            "requests_from_cache": total["cache_reads"],
            "requests_from_pfs_after_fallback": total["cache_fallback_reads"],
            "bytes_from_cache": total["bytes_from_cache"],
            "bytes_from_pfs": total["bytes_from_pfs"],
            "bytes_from_pfs_after_fallback": total["cache_fallback_bytes"],
            "files_filled": total["cache_fills"], "fill_bytes": total["cache_fill_bytes"],
            "fill_seconds": round(total["cache_fill_ns"] / 1e9, 6),
            "fills_out_of_room": total["cache_fill_failures"],
            "evictions": total["cache_evictions"], "fallbacks": total["cache_fallbacks"]}
