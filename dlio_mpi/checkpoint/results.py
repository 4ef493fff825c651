"""Checkpoint results: what one save or load of a checkpoint took across the ranks, and the
summary fields of all of them.

Every rank starts a checkpoint after a barrier, at its own clock's `start_ns`, and records
when its part ended. A checkpoint's duration is the slowest rank's (the latest end less the
earliest start), its bandwidth the bytes all ranks moved over that duration: MLPerf
Storage's definition. DLIO's later source uses the same field names but divides the global
size by rank 0's own time; the released DLIO 2.0.0 has no checkpoint fields. GB = 2^30 bytes,
as DLIO counts them; stdev is the population's (numpy's std), as DLIO's summaries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..time_split import limited_by, split_of

GB = 2**30


@dataclass(frozen=True)
class CheckpointRecord:
    """One save or load of one checkpoint, over all ranks."""

    kind: str            # "save", "load" or "drain" (checkpoint.drain's copy)
    index: int           # 1, 2, ... within its kind
    checkpoint_id: str   # its folder: global_epoch<E>_step<S>
    bytes: int           # all ranks
    seconds: float       # the slowest rank's: latest end - earliest start
    rank_seconds: tuple[float, ...]  # each rank's own time
    syncs: int = 0       # fsync calls, all ranks
    sync_seconds: float = 0.0  # the slowest rank's time in them
    start_ns: int = 0    # the earliest start, on rank 0's monotonic clock
    end_ns: int = 0      # the latest end
    # checkpoint.async_write's figures of a save (results.gather_async), None when synchronous
    asynchronous: dict | None = None
    drain: dict | None = None  # a drain's (kind "drain"): complete, durable_seconds, to
    time_split: dict | None = None  # the slowest rank's storage and emulator time (split_of)

    def with_drain(self, figures: dict) -> CheckpointRecord:
        from dataclasses import replace

        return replace(self, drain=figures)

    @property
    def GB_per_second(self) -> float:  # noqa: N802 - DLIO's unit in the name
        return self.bytes / GB / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        times = np.asarray(self.rank_seconds, dtype=np.float64)
        return {"kind": self.kind, "index": self.index, "checkpoint_id": self.checkpoint_id,
                "start_ns": self.start_ns, "end_ns": self.end_ns,
                "bytes": self.bytes, "size_GB": self.bytes / GB,
                "duration_seconds": self.seconds, "throughput_GB_per_second":
                self.GB_per_second, "syncs": self.syncs, "sync_seconds": self.sync_seconds,
                "rank_seconds": {"min": float(times.min()), "median": float(np.median(times)),
                                 "max": float(times.max())} if len(times) else None,
                **({"time_split": self.time_split} if self.time_split is not None else {}),
                **({"async": self.asynchronous} if self.asynchronous is not None else {}),
                **({"drain": self.drain} if self.drain is not None else {})}


def gather_record(comm, kind: str, index: int, checkpoint_id: str, nbytes: int,
                  start_ns: int, end_ns: int, syncs: int = 0, sync_ns: int = 0,
                  clock_offset_ns: int | None = None, storage_ns: int | None = None
                  ) -> CheckpointRecord:
    """Collective: this rank's part (its bytes, its clock's start and end, after a common
    barrier) into the checkpoint's record, on every rank. Clocks are CLOCK_MONOTONIC:
    `clock_offset_ns` (this rank's clock minus rank 0's, topology.discover) puts them on one
    time line; without it, ranks on one host share a clock and across hosts the slowest
    rank's own time bounds the duration. `storage_ns`: the rank's time in the storage's calls
    (the record's time_split is the slowest rank's)."""
    offset = clock_offset_ns or 0
    parts = comm.allgather((nbytes, start_ns - offset, end_ns - offset, syncs, sync_ns,
                            storage_ns))
    own = tuple((p[2] - p[1]) / 1e9 for p in parts)
    one_line = clock_offset_ns is not None or _one_host(comm)
    span = ((max(p[2] for p in parts) - min(p[1] for p in parts)) / 1e9
            if one_line else max(own))
    slowest = max(parts, key=lambda p: p[2] - p[1])
    split = split_of(slowest[2] - slowest[1], slowest[5]) if storage_ns is not None else None
    return CheckpointRecord(kind, index, checkpoint_id, sum(p[0] for p in parts),
                            max(span, max(own)), own, sum(p[3] for p in parts),
                            max(p[4] for p in parts) / 1e9, min(p[1] for p in parts),
                            max(p[2] for p in parts), time_split=split)


def gather_async(comm, stall_ns: int, snapshot_ns: int, waited_ns: int, write_ns: int,
                 overlap_ns: int, finish_wait_ns: int, snapshot_bytes: int) -> dict:
    """Collective: an asynchronous save's figures over the ranks (summary.json's per-save
    "async"): the slowest rank's stall (its wait for the previous write, then the snapshot),
    snapshot, write and wait for the write; the least time a rank's write overlapped
    training, of the ranks that wrote any; the snapshot bytes of all ranks."""
    parts = np.array(comm.allgather((stall_ns, snapshot_ns, waited_ns, write_ns, overlap_ns,
                                     finish_wait_ns, snapshot_bytes)), dtype=np.int64)
    slowest = parts.max(axis=0) / 1e9
    snapshot_s = float(slowest[1])
    writers = parts[parts[:, 6] > 0]
    return {"stall_seconds": float(slowest[0]), "snapshot_seconds": snapshot_s,
            "waited_for_previous_seconds": float(slowest[2]),
            "write_seconds": float(slowest[3]),
            "overlapped_seconds": float(writers[:, 4].min() / 1e9) if len(writers) else 0.0,
            "waited_for_write_seconds": float(slowest[5]),
            "snapshot_bytes": int(parts[:, 6].sum()),
            "snapshot_GiB_per_second_per_rank": float(parts[:, 6].max() / GB / snapshot_s)
            if snapshot_s > 0 else 0.0}


def _one_host(comm) -> bool:
    import socket

    return len(set(comm.allgather(socket.gethostname()))) == 1


def time_split_summary(records: list[CheckpointRecord]) -> dict:
    """summary.json's dlio_mpi.checkpoint.time_split: per kind of record, the emulator's
    largest share of a phase and whether any phase was limited by the emulator."""
    out = {}
    for kind in ("save", "load"):
        splits = [r.time_split for r in records if r.kind == kind and r.time_split]
        if splits:
            share = max(s["emulator_share"] for s in splits)
            out[kind] = {"emulator_share_max": share,
                         "emulator_seconds_total": sum(s["emulator_seconds"] for s in splits),
                         "storage_seconds_total": sum(s["storage_seconds"] for s in splits),
                         "limited_by": limited_by(share)}
    return out


def summary_fields(records: list[CheckpointRecord], checkpoint_bytes: int) -> dict:
    """The summary's checkpoint fields (metric section) under DLIO's later names."""
    out: dict = {"checkpoint_size_GB": checkpoint_bytes / GB}
    for kind in ("save", "load"):
        mine = [r for r in records if r.kind == kind]
        if not mine:
            continue
        rates = np.array([r.GB_per_second for r in mine])
        durations = np.array([r.seconds for r in mine])
        out |= {f"{kind}_checkpoint_io_mean_GB_per_second": float(rates.mean()),
                f"{kind}_checkpoint_io_stdev_GB_per_second": float(rates.std()),
                f"{kind}_checkpoint_duration_mean_seconds": float(durations.mean()),
                f"{kind}_checkpoint_duration_stdev_seconds": float(durations.std())}
    return out
