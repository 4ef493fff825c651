"""The checkpoint phase: every rank saves its share of a checkpoint (checkpoint/sizing.py)
through the writer the configuration names, and loads it back with the page cache defeated;
each save and load is timed from a common start and becomes a CheckpointRecord.

Writers (one protocol, one registry, as the reader backends): `file_per_rank` (the C core,
each rank its own files, DeepSpeed's names), `shared` (one file, the ranks' shares back to
back, collective MPI-IO) and `pt_save` (a real torch.save per file). Rank 0 keeps the
checkpoint folder's manifest (checkpoint/folder.py): which checkpoints are dlio-mpi's and
complete.

Restores defeat the page cache: O_DIRECT (checkpoint.odirect), else posix_fadvise(DONTNEED)
of the files before they are read (clean pages go: checkpoint.fsync leaves none dirty); with
checkpoint.recovery_rank_shift rank r reads the share of rank (r + ranks per node) mod P, as
DLIO intends (its key never takes effect there), so that on real nodes no rank reads what its
own node wrote."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, replace
from typing import Callable

from .. import _core, progress
from ..errors import JobError, Stopped, UserError, check_all, on_root
from ..storage import storage_for
from ..storage.counters import process_field
from ..storage.filesystems import apply_striping
from .async_write import AsyncSaver
from .drain import Drainer
from .file_per_rank import FilePerRank
from .folder import CheckpointFolder, check_checkpoint_space, in_the_way_of
from .results import CheckpointRecord, gather_async, gather_record
from .schedule import Schedule
from .shared_file import NAME as SHARED_NAME
from .shared_file import SharedFile
from .sizing import CheckpointLayout
from .writer import AsyncFile, CheckpointWriter, IoStats, close_async_files, remove_async_files


@dataclass(frozen=True)
class WriterContext:
    """What a writer is opened with."""

    comm: object
    folder: str
    tag: str
    odirect: bool
    fsync: bool
    hints: dict[str, str]
    sizes: list[int]  # every rank's bytes per checkpoint
    content: object = None  # checkpoint.content's section (content.py; None: fresh bytes)
    layout: object = None  # the checkpoint's sizing (sizing.CheckpointLayout, dcp's DcpLayout)


def _file_per_rank(ctx: WriterContext) -> CheckpointWriter:
    return FilePerRank(ctx.folder, ctx.tag, ctx.odirect, ctx.fsync, content=ctx.content)


def _shared(ctx: WriterContext) -> CheckpointWriter:
    return SharedFile(ctx.comm, ctx.folder, ctx.tag, ctx.fsync, ctx.hints, ctx.sizes,
                      odirect=ctx.odirect, content=ctx.content)


def _pt_save(ctx: WriterContext) -> CheckpointWriter:
    from .torch_save import TorchSave  # imports torch

    return TorchSave(ctx.folder, ctx.tag, ctx.fsync, ctx.content)


def _dcp(ctx: WriterContext) -> CheckpointWriter:
    from .dcp_writer import DcpWriter

    return DcpWriter(ctx.comm, ctx.folder, ctx.tag, ctx.fsync, ctx.layout, ctx.content)


WRITERS: dict[str, Callable[[WriterContext], CheckpointWriter]] = {
    "file_per_rank": _file_per_rank, "shared": _shared, "pt_save": _pt_save, "dcp": _dcp}


@dataclass
class PendingSave:
    """An asynchronous save whose write is under way, on this rank's clock."""

    index: int
    checkpoint_id: str
    names: list[str]
    files: list[AsyncFile]
    start_ns: int       # the snapshot's start, after the barrier
    stall_ns: int       # the step loop's stall: the wait for the previous write, the snapshot
    snapshot_ns: int
    waited_ns: int      # of the stall, waiting for the previous save's write
    snapshot_bytes: int


def writer_name(ck) -> str:
    """The writer of checkpoint section `ck`: pt_save, else its layout."""
    return "pt_save" if ck.checkpoint_mechanism == "pt_save" else ck.layout


def checkpoint_number(checkpoint_id: str) -> int:
    """The number its bytes are seeded with: a function of its id only, so that a restore
    in a later run checks them too."""
    return zlib.crc32(checkpoint_id.encode())


def restore_methods(ck) -> list[str]:
    """How restores defeat the page cache, in the order they act."""
    methods = []
    if ck.recovery_rank_shift:
        methods.append("recovery_rank_shift")
    methods.append("odirect" if ck.odirect else "drop_page_cache")
    return methods


def restore_warnings(ck, per_node_bytes: int, node_memory: int, nodes: int,
                     loads: bool) -> list[str]:
    """Why restores could still be served by the page cache, if they could."""
    if not loads or ck.odirect:
        return []
    warnings = []
    if not ck.fsync and per_node_bytes < node_memory:
        warnings.append(
            f"checkpoint.fsync is false: pages not yet written back cannot be dropped from "
            f"the page cache, and a checkpoint ({per_node_bytes / 2**30:.2f} GiB per node) "
            f"fits in a node's memory ({node_memory / 2**30:.2f} GiB): restores may read "
            "memory, not storage (checkpoint.fsync: true or checkpoint.odirect: true avoid it)")
    if ck.recovery_rank_shift and nodes < 2:
        warnings.append("checkpoint.recovery_rank_shift: every rank is on one node, so the "
                        "shifted reads come from the node that wrote them")
    return warnings


class Checkpointer:
    """Saves and loads this rank's share of the run's checkpoints (collective calls)."""

    def __init__(self, comm, cfg, layout: CheckpointLayout, tag: str, ranks_per_node: int,
                 clock_offset_ns: int = 0) -> None:
        ck = cfg.checkpoint
        self.comm, self.cfg, self.layout, self.tag = comm, cfg, layout, tag
        self.root = ck.checkpoint_folder
        rank, size = comm.Get_rank(), comm.Get_size()
        self.shard = layout.shard(rank)
        shift = ranks_per_node if ck.recovery_rank_shift else 0
        self.source = layout.shard((rank + shift) % size)
        self.clock_offset_ns = clock_offset_ns
        sizes = comm.allgather(self.shard.nbytes)
        self.writer_name = writer_name(ck)
        self.writer = WRITERS[self.writer_name](WriterContext(
            comm, self.root, tag, ck.odirect, ck.fsync, dict(ck.mpiio_hints), sizes,
            ck.content, layout))
        self.folder = CheckpointFolder(self.root, tag) if rank == 0 else None
        self.striping: dict | None = None  # what storage.lustre did to the folder
        self.lock = None  # rank 0's claim of the folder (Storage.claim; run.py holds it)
        self.saves = 0
        self.saver: AsyncSaver | None = None  # checkpoint.async_write's
        if ck.async_write:  # this rank's files' sizes (`sizes` stays every rank's share)
            files = [f.nbytes for f in self.writer.async_files(0, "", self.shard)]
            self.saver = AsyncSaver(files, self.writer.chunk, ck.odirect, ck.fsync,
                                    ck.snapshot_bytes_per_second, self.writer.content)
        self.pending: PendingSave | None = None
        self.drainer: Drainer | None = None  # checkpoint.drain's
        self.restorer = self.writer  # where restores read: the fast tier, or drain.to
        if ck.drain is not None:
            shared = self.writer_name == "shared"
            self.drainer = Drainer(comm, ck.drain, self.root, SHARED_NAME if shared else None,
                                   self.writer.starts if shared else [], tag, ck.fsync,
                                   clock_offset_ns)
            if ck.drain.restore_from == "pfs":
                self.restorer = WRITERS[self.writer_name](WriterContext(
                    comm, ck.drain.to, tag, ck.odirect, ck.fsync, dict(ck.mpiio_hints), sizes,
                    ck.content, layout))

    # -------------------------------------------------------------- before any I/O
    def prepare(self, schedule: Schedule) -> list[str]:
        """Collective, before any I/O of the run: make way for the checkpoints `schedule`
        saves (refusing, naming it, anything in their place that is not an unchanged
        checkpoint of ours), refuse when they would not fit the free space, check that those
        loaded without being saved are ours and complete, and give the folder storage.lustre's
        layout. Returns the earlier checkpoints removed."""

        drain = self.cfg.checkpoint.drain

        def make_way() -> list[str]:
            self.folder = CheckpointFolder(self.root, self.tag)
            if drain is None or drain.restore_from == "fast_tier":
                for cid in schedule.load_ids():
                    if not schedule.saved(cid):
                        _check_complete(self.folder, cid)
            in_the_way = in_the_way_of(self.root, schedule)
            self.folder.check_clear(in_the_way)
            # drain.keep last or none: the fast tier holds a few checkpoints at once
            held = schedule.saves if drain is None or drain.keep == "all" else \
                min(schedule.saves, 3)
            check_checkpoint_space(self.folder, held, in_the_way, self.layout.total_bytes)
            drain_way = self.drainer.check(schedule, self.layout.total_bytes,
                                           _check_complete) if self.drainer else []
            lustre = self.cfg.storage.lustre  # the folder's default layout, as the data's
            striping = apply_striping(lustre, self.root) if lustre is not None else None
            fs = storage_for(self.root)
            fs.make_folders(self.root)  # nothing written before the checks
            # one job at a time: another's checkpoints are never removed under it
            self.lock = fs.claim(self.root, "checkpoints")
            self.lock.acquire()
            removed = self.folder.clear(in_the_way)
            if self.drainer is not None:
                removed += [os.path.join(drain.to, cid) for cid in self.drainer.claim(drain_way)]
            return removed, striping

        removed, self.striping = on_root(self.comm, make_way)
        # pt_save keeps its tensors all run, as DLIO allocates them at start, and the C core
        # its block buffers: made here, outside the first save's time; async_write's snapshot
        # buffer likewise (its writes need no block buffers)
        if self.saver is None:
            check_all(self.comm, lambda: self.writer.allocate(self.shard))
        else:
            check_all(self.comm, self.saver.allocate)
        return removed


    # -------------------------------------------------------------- save and load
    def save(self, checkpoint_id: str, index: int) -> list[CheckpointRecord]:
        """Collective: save checkpoint `checkpoint_id` (the run's save number `index`);
        the records of the saves complete now: this one, or with async_write the previous
        one (whose write this save waited for; this one's write goes on in the background)."""
        if self.saver is not None:
            return self._save_async(checkpoint_id, index)
        done = self._poll_drains()
        started = _core.now_ns()
        record = self._save_now(checkpoint_id, index)
        if record is None:  # cut short by a stop: nothing to drain
            return done
        self._drain(index, checkpoint_id, started)
        return done + [record]

    def _poll_drains(self) -> list[CheckpointRecord]:
        """Collective: the drains every rank has finished, completed (after the saves they
        copy: an asynchronous save is completed first), drain.keep applied."""
        if self.drainer is None:
            return []
        done = self.drainer.poll()
        self._let_go(done)
        return done

    def _drain(self, index: int, checkpoint_id: str, started_ns: int, after=None,
               files: list[AsyncFile] = ()) -> None:
        """Collective: checkpoint.drain's copy of a checkpoint (`started_ns`: this rank's
        start of its save), once complete on the fast tier; or, asynchronous, as soon as this
        rank's write (`after`) of its `files` has ended, without waiting for the save to
        complete (its copies are listed complete on drain.to only after it)."""
        if self.drainer is not None:
            names = self.writer.file_names([self.layout.shard(r) for r in range(
                self.comm.Get_size())]) if self.comm.Get_rank() == 0 else []
            self.drainer.start(index, checkpoint_id, self.shard, names, started_ns, after,
                               [f.tmp for f in files])

    def _let_go(self, drained: list[CheckpointRecord]) -> None:
        """Collective: drain.keep applied to the fast tier once checkpoints are drained (rank
        0 removes them as clear() removes ours, a changed one left as it is, with a note)."""
        keep = self.cfg.checkpoint.drain.keep if self.drainer is not None else "all"
        complete = [r.checkpoint_id for r in drained if r.drain and r.drain["complete"]]
        if keep == "all" or not complete:
            return

        def remove() -> None:
            for old in self.drainer.fast_copies_to_remove(keep):
                self.drainer.drained.remove(old)
                try:
                    self.folder.clear([old])
                except (UserError, OSError) as exc:
                    progress.write(f"checkpoint.drain.keep: {keep}: {old} left on the fast "
                                   f"tier ({exc})")

        on_root(self.comm, remove)

    def _begin(self, checkpoint_id: str) -> list[str]:
        """Collective: list `checkpoint_id` begun in the manifest; its files' names (rank 0)."""
        shards = [self.layout.shard(r) for r in range(self.comm.Get_size())] \
            if self.comm.Get_rank() == 0 else []
        names = self.writer.file_names(shards)
        on_root(self.comm, lambda: self.folder.begin(checkpoint_id, names))
        return names

    def _save_now(self, checkpoint_id: str, index: int) -> CheckpointRecord | None:
        """Write this rank's share, list the checkpoint complete when every rank's files are
        in; None when a stop signal cut it short (its files removed, as a failed save's)."""
        names = self._begin(checkpoint_id)
        try:
            record = self._timed("save", index, checkpoint_id, lambda: self.writer.save(
                checkpoint_number(checkpoint_id), checkpoint_id, self.shard))
            on_root(self.comm, lambda: self.folder.complete(checkpoint_id, names))
        except JobError as exc:  # agreed by every rank: none writes any more
            on_root(self.comm, lambda: self.folder.abandon(checkpoint_id))
            if isinstance(exc, Stopped):
                return None
            raise
        self.saves += 1
        return record

    def _save_async(self, checkpoint_id: str, index: int) -> list[CheckpointRecord]:
        """Wait for the previous write, snapshot this rank's share, open its files and write
        them in the background (async_write.py)."""
        stall_start = _core.now_ns()
        done = self._finish_save()
        done += self._poll_drains()
        waited = _core.now_ns() - stall_start
        names = self._begin(checkpoint_id)
        files = self.writer.async_files(checkpoint_number(checkpoint_id), checkpoint_id,
                                        self.shard)
        self.comm.Barrier()
        start = _core.now_ns()

        def snapshot() -> tuple[int, int]:
            return self.saver.snapshot(files), _core.now_ns()

        try:
            nbytes, snapped = check_all(self.comm, snapshot)
            # apart: a shared file's open is collective, reached by every rank only once
            # every snapshot is agreed
            check_all(self.comm, lambda: self.writer.open_async(files))
        except JobError as exc:
            self._abandon(checkpoint_id, files)
            if isinstance(exc, Stopped):  # a paced snapshot cut short: no save
                return done
            raise
        written = self.saver.start(files)
        if not self.writer.collective:  # a rank's own files: drained once it wrote them
            self._drain(index, checkpoint_id, start, written, files)
        if self.cfg.checkpoint.rank_sync:  # DLIO's barrier after a save: here, its stall
            self.comm.Barrier()
        end = _core.now_ns()
        self.pending = PendingSave(index, checkpoint_id, names, files, start,
                                   end - stall_start, snapped - start, waited, nbytes)
        self.saves += 1
        return done

    def finish(self, final: bool = False) -> list[CheckpointRecord]:
        """Collective: the asynchronous save under way, if any, waited for and completed;
        checkpoint.drain's drains done by every rank completed (all of them waited for when
        `final`: the run's end, or restores that read drain.to). Their records."""
        done = self._finish_save()
        if self.drainer is not None and final:
            drains = self.drainer.finish_all()
            self._let_go(drains)
            return done + drains
        return done + self._poll_drains()

    def _finish_save(self) -> list[CheckpointRecord]:
        """Wait for the asynchronous save under way, if any, give its files their names and
        list it complete, then start its drain; its record ([] when none was under way)."""
        p, self.pending = self.pending, None
        if p is None:
            return []
        wait_start = _core.now_ns()
        written = self.saver.wait()
        wait_end = _core.now_ns()

        def close() -> None:
            if written.error is not None:
                raise written.error
            self.writer.close_async(p.files)

        try:
            check_all(self.comm, close)
            self.writer.publish_async(p.files)
            on_root(self.comm, lambda: self.folder.complete(p.checkpoint_id, p.names))
        except JobError as exc:
            self._abandon(p.checkpoint_id, p.files)
            if isinstance(exc, Stopped):  # its write cut short: no save
                return []
            raise
        st = written.stats
        record = gather_record(self.comm, "save", p.index, p.checkpoint_id, st.bytes,
                               p.start_ns, written.end_ns, st.syncs, st.sync_ns,
                               self.clock_offset_ns, st.storage_ns)
        overlap = max(0, min(written.end_ns, wait_start) - written.start_ns)
        figures = gather_async(self.comm, p.stall_ns, p.snapshot_ns, p.waited_ns,
                               written.end_ns - written.start_ns, overlap,
                               wait_end - wait_start, p.snapshot_bytes)
        if self.writer.collective:  # one file: a rank's part of its copy holds a page of its
            self._drain(p.index, p.checkpoint_id, p.start_ns)  # neighbour's: once all wrote
        return [replace(record, asynchronous=figures)]

    def _abandon(self, checkpoint_id: str, files: list[AsyncFile]) -> None:
        """Collective, after an agreed failure: no file of the save stays, nor its listing."""
        check_all(self.comm, lambda: self.writer.discard_async(files))
        on_root(self.comm, lambda: self.folder.abandon(checkpoint_id))

    def close(self) -> None:
        """This rank alone, however the run ends: the background write waited for, a save
        left under way (the run failed) removed, the snapshot buffer freed; drains not
        completed stopped and their temporaries removed."""
        if self.drainer is not None:
            self.drainer.close()
        if self.saver is None:
            return
        self.saver.wait()
        if self.pending is not None:
            files, self.pending = self.pending.files, None
            close_async_files(files)
            if self.comm.Get_rank() == 0 or not self.writer.collective:
                remove_async_files(files)
        self.saver.close()

    def describe_drain(self, records: list[CheckpointRecord]) -> dict | None:
        """summary.json's dlio_mpi.checkpoint.drain: where and how, the drains' bandwidth and
        time to durable (means), and the run's end's wait for the last ones."""
        if self.drainer is None:
            return None
        d = self.cfg.checkpoint.drain
        drains = [r for r in records if r.kind == "drain" and r.drain and r.drain["complete"]]
        out = {"to": d.to, "keep": d.keep, "restore_from": d.restore_from,
               "odirect": d.odirect, "buffer_bytes": d.buffer_bytes,
               "drained": len(drains),
               "final_wait_seconds": self.drainer.waited_ns / 1e9}
        if drains:
            out |= {"GiB_per_second_mean": sum(r.GB_per_second for r in drains) / len(drains),
                    "durable_seconds_mean": sum(r.drain["durable_seconds"] for r in drains)
                    / len(drains),
                    "durable_seconds_max": max(r.drain["durable_seconds"] for r in drains)}
        return out

    def describe_async(self) -> dict | None:
        return self.saver.describe() if self.saver is not None else None

    def load(self, checkpoint_id: str, index: int) -> CheckpointRecord | None:
        """Collective: read back the share this rank restores (its own, or its shifted
        neighbour's) with the page cache defeated, checking the bytes; None when a stop
        signal cut it short."""
        try:
            return self._timed("load", index, checkpoint_id, lambda: self.restorer.load(
                checkpoint_number(checkpoint_id), checkpoint_id, self.source,
                drop_cache=True))
        except Stopped:
            return None

    def _timed(self, kind: str, index: int, checkpoint_id: str,
               act: Callable[[], IoStats]) -> CheckpointRecord:
        """A barrier, this rank's part between its clock's start and end, every rank's
        outcome agreed (a failing rank ends the checkpoint on all), the record."""
        self.comm.Barrier()
        start = _core.now_ns()

        def part() -> tuple[IoStats, int]:
            # rank 0's progress: the bytes of its share moved so far, by its process's
            # /proc io counter (whichever writer, C, MPI-IO or torch, moves them)
            share = (self.shard if kind == "save" else self.source).nbytes
            field = "wchar" if kind == "save" else "rchar"
            with progress.task(f"checkpoint {kind} {index} ({checkpoint_id}), rank 0's share",
                               share, progress.BYTES) as shown:
                if shown.active:
                    before = process_field(field)
                    shown.watch(lambda: min(max(process_field(field) - before, 0), share)
                                if before >= 0 else 0)
                stats = act()
            return stats, _core.now_ns()

        stats, end = check_all(self.comm, part)
        if self.cfg.checkpoint.rank_sync:
            self.comm.Barrier()
        return gather_record(self.comm, kind, index, checkpoint_id, stats.bytes, start, end,
                             stats.syncs, stats.sync_ns, self.clock_offset_ns,
                             stats.storage_ns)


def _check_complete(folder: CheckpointFolder, cid: str) -> None:
    """Refuse a restore of `cid` from `folder` when it is not a complete checkpoint of ours."""
    listed = folder.body["checkpoints"].get(cid)
    if listed is None or not listed.get("complete"):
        raise UserError(f"checkpoint.num_checkpoints_read: {os.path.join(folder.root, cid)} "
                        "is not a complete checkpoint of an earlier dlio-mpi run; expected "
                        "num_checkpoints_read <= num_checkpoints_write, or the checkpoints "
                        "of an earlier run of this workload in that folder")
