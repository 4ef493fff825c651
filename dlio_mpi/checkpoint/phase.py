"""Checkpoints in a run: the checkpointer opened (and its folder made ready) before any I/O,
the checkpoint-only workflow, and what goes into the results.

Checkpoint-only (workflow.train false, workflow.checkpoint true), as DLIO: for each of
num_checkpoints_write checkpoints, sleep time_between_checkpoints (the emulated training
between them; unset: 1 s, as DLIO sleeps abs(-1)), then save; then as many loads of the first
num_checkpoints_read, each after the same sleep. Writes and reads are separate phases, so
every load reads a checkpoint written a whole phase earlier."""

from __future__ import annotations

import time

import numpy as np

from .. import _core
from ..config import TimeSpec
from ..time_split import verdict_text
from .checkpointer import Checkpointer, restore_methods, restore_warnings, writer_name
from .results import GB, CheckpointRecord, summary_fields, time_split_summary
from .schedule import Due, Schedule
from .sizing import checkpoint_layout

DLIO_UNSET_SLEEP = TimeSpec("constant", (1.0,))  # DLIO's -1 default sleeps abs(-1) s
NAP_S = 0.05


def open_checkpointer(comm, cfg, plan, topo, tag: str, say) -> Checkpointer:
    """Collective, before any I/O: the checkpointer of this run, its folder ready (earlier
    checkpoints of ours in the way removed, anything else refused, room checked)."""
    layout = checkpoint_layout(cfg, comm.Get_size())
    ckpt = Checkpointer(comm, cfg, layout, tag, topo.ranks_per_node, topo.clock_offset_ns)
    schedule = Schedule.of(cfg, plan.steps_per_epoch)
    removed = ckpt.prepare(schedule)
    for key in ("note", "mismatch"):
        if ckpt.striping and ckpt.striping.get(key):
            say(f"checkpoint striping: {ckpt.striping[key]}")
    if removed:
        say(f"checkpoint: removed {len(removed)} earlier checkpoint(s) of dlio-mpi in "
            f"{cfg.checkpoint.checkpoint_folder} to make way: {', '.join(removed)}")
    ck = cfg.checkpoint
    per_node = layout.total_bytes // max(topo.nodes, 1)
    for warning in restore_warnings(ck, per_node, topo.memory_bytes // max(topo.nodes, 1),
                                    topo.nodes, bool(schedule.loads)):
        say(f"warning: {warning}")
    return ckpt


def space_warning(cfg, plan) -> str | None:
    """validate: why `run` would refuse the checkpoints for lack of room, if it would."""
    from ..errors import UserError
    from .folder import CheckpointFolder, check_checkpoint_space, in_the_way_of

    ck = cfg.checkpoint
    schedule = Schedule.of(cfg, plan.steps_per_epoch)
    held = schedule.saves if ck.drain is None or ck.drain.keep == "all" else \
        min(schedule.saves, 3)  # as Checkpointer.prepare counts them
    folders = [(ck.checkpoint_folder, held, "checkpoint.checkpoint_folder")]
    if ck.drain is not None:
        folders.append((ck.drain.to, schedule.saves, "checkpoint.drain.to"))
    try:
        for root, saves, key in folders:
            check_checkpoint_space(CheckpointFolder(root, "validate", key), saves,
                                   in_the_way_of(root, schedule),
                                   plan.checkpoint["total_bytes"])
    except (UserError, OSError) as exc:
        return f"run would refuse: {exc}"
    return None


def announce(record: CheckpointRecord) -> str:
    """One line per save or load, as rank 0 prints it."""
    verb = {"save": "saved", "load": "loaded", "drain": "drained"}[record.kind]
    sync = f", fsync {record.sync_seconds:.2f} s" if record.syncs else ""
    line = (f"checkpoint {record.checkpoint_id} {verb}: {record.bytes / GB:.3f} GiB in "
            f"{record.seconds:.3f} s = {record.GB_per_second:.3f} GiB/s (slowest rank{sync})")
    if record.drain is not None:
        d = record.drain
        line += (
            f"; durable {d['durable_seconds']:.3f} s after its save began, in {d['to']}"
            if d["complete"] else "; cut short by a stop: not drained")
    if record.time_split is not None:
        line += f"; {verdict_text(record.time_split)}"
    a = record.asynchronous
    if a is not None:
        line += (f"; asynchronously: training stalled {a['stall_seconds']:.3f} s (snapshot "
                 f"{a['snapshot_seconds']:.3f} s, waiting for the previous write "
                 f"{a['waited_for_previous_seconds']:.3f} s), the write took "
                 f"{a['write_seconds']:.3f} s, {a['overlapped_seconds']:.3f} s of it beside "
                 "training")
    return line


def _sleep(seconds: float) -> int:
    """Sleep, waking for a stop signal; returns it (0: none)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if _core.stop_signal():
            return _core.stop_signal()
        time.sleep(min(left, NAP_S))
    return _core.stop_signal()


def run_checkpoint_only(comm, cfg, ckpt: Checkpointer, say) -> tuple[list[CheckpointRecord], int]:
    """The checkpoint-only workflow; returns the records and the signal that stopped it
    early (0: none), agreed by every rank."""
    from mpi4py import MPI

    ck = cfg.checkpoint
    schedule = Schedule.of(cfg, 0)
    saves, loads = schedule.save_ids(), schedule.load_ids()
    spec = ck.time_between_checkpoints or DLIO_UNSET_SLEEP
    rng = np.random.default_rng([cfg.train.seed, comm.Get_rank(), 0xC4])
    sleeps = iter(spec.draw(rng, len(saves) + len(loads)).tolist())
    records: list[CheckpointRecord] = []

    def done(new: list[CheckpointRecord]) -> None:
        for record in new:
            say(announce(record))
            records.append(record)

    for kind, ids in (("save", saves), ("load", loads)):
        for index, cid in enumerate(ids, start=1):
            # with async_write the sleep (the training between checkpoints) overlaps the write
            stop = comm.allreduce(_sleep(next(sleeps)), op=MPI.MAX)
            if stop:
                done(ckpt.finish(final=True))
                return records, stop
            if kind == "save":
                done(ckpt.save(cid, index))
            elif (loaded := ckpt.load(cid, index)) is not None:  # None: cut short by a stop
                done([loaded])
        # the loads read complete checkpoints, drained (no drain beside their reads); the
        # run ends written
        done(ckpt.finish(final=True))
        stop = comm.allreduce(_core.stop_signal(), op=MPI.MAX)  # one that cut a drain short
        if stop:
            return records, stop
    return records, 0


def describe_checkpoints(cfg, ckpt: Checkpointer, records: list[CheckpointRecord],
                         topo) -> dict:
    """summary.json's dlio_mpi.checkpoint: how checkpoints were written and restored, the
    sizing, and each save and load."""
    ck = cfg.checkpoint
    layout = ckpt.layout
    return {
        "writer": writer_name(ck), "layout": ck.layout,
        "checkpoint_mechanism": ck.checkpoint_mechanism, "odirect": ck.odirect,
        "fsync": ck.fsync, "mpiio_hints": dict(ck.mpiio_hints),
        "folder": ck.checkpoint_folder, "striping": ckpt.striping,
        "restore": {"methods": restore_methods(ck) if any(r.kind == "load" for r in records)
                    else [],
                    "warnings": restore_warnings(
                        ck, layout.total_bytes // max(topo.nodes, 1),
                        topo.memory_bytes // max(topo.nodes, 1), topo.nodes,
                        any(r.kind == "load" for r in records))},
        "sizing": layout.summary(),
        "time_split": time_split_summary(records),
        "async_write": ckpt.describe_async(),
        "drain": ckpt.describe_drain(records),
        "records": [r.to_json() for r in records],
    }


def metric_fields(ckpt: Checkpointer, records: list[CheckpointRecord]) -> dict:
    """The summary's metric fields of the checkpoints (DLIO's later names)."""
    return summary_fields(records, ckpt.layout.total_bytes)


def epoch_entries(records: list[tuple[Due | None, CheckpointRecord]], wall_offset_ns: int
                  ) -> dict[int, dict]:
    """per_epoch_stats.json's save_ckpt<k> / load_ckpt<k> entries per epoch: DLIO's start,
    end, duration and throughput (GB/s, GB = 2^30 B), then ours. Checkpoint-only records
    (due None) go under epoch 1 numbered by their index."""
    from ..results.names import iso_time

    out: dict[int, dict] = {}
    for due, record in records:
        epoch, number = (due.epoch, due.block) if due is not None else (1, record.index)
        entry = {"start": iso_time((record.start_ns + wall_offset_ns) / 1e9),
                 "end": iso_time((record.end_ns + wall_offset_ns) / 1e9),
                 "duration": record.seconds, "throughput": record.GB_per_second,
                 **record.to_json()}
        out.setdefault(epoch, {})[f"{record.kind}_ckpt{number}"] = entry
    return out
