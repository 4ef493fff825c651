"""checkpoint.drain: each checkpoint, once complete in checkpoint_folder (the fast tier: a
burst buffer, node-local NVMe), copied in the background to drain.to (the parallel file
system), as DataWarp's stage-out, Lustre's HSM/PCC or an asynchronous checkpoint's second
level do; training goes on meanwhile.

- Who copies what: each rank its own part of the checkpoint (file_per_rank and pt_save: its
  files, whole; shared: the one file, created by rank 0, cut at the page boundaries below
  the ranks' shares: each rank its share's range, give or take a page), in a
  thread of its own through the storage's copier (the C core's, stage-in's: one aligned buffer
  of drain.buffer_bytes, read and write calls of that size, O_DIRECT on both sides with
  drain.odirect), each copy fsynced (checkpoint.fsync) and renamed to its final name only
  when every rank's part is in. Drains queue in the order the checkpoints completed.
- Ownership: drain.to is claimed as checkpoint_folder is (its lock file for the run, its
  manifest of the checkpoints drained into it, exclusive temporaries, in-the-way checks and
  room for every save checked before any I/O).
- Completion is collective: at each save, evaluation and the run's end the ranks agree on
  the drains every rank has finished (Drainer.poll), list them complete and apply drain.keep
  to the fast tier's copies (all: kept; last: the previously drained ones removed; none:
  this one removed), only ever a checkpoint fully drained. The run ends when every drain is
  (Drainer.finish_all: the wait reported).
- A drain cut short (a stop signal, between two calls; out of room; a rank failing) leaves
  the fast tier's copy; its copy on drain.to, temporaries and listing, is removed as a failed
  save's is, so nothing there looks complete and a rerun is not blocked. A failure ends the
  job with the agreed error; a stop ends the drain and the run as the stop does."""

from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass, field

from .. import _core
from ..errors import JobError, StopRequested, check_all, describe, on_root
from ..storage import Handle, Storage, storage_for
from ..storage.ownership import temporary_name
from .folder import CheckpointFolder, check_checkpoint_space, in_the_way_of
from .results import CheckpointRecord, gather_record
from .sizing import RankShard

PAGE = 4096  # a shared file's parts start at multiples of this (O_DIRECT's alignment)


@dataclass
class Piece:
    """Bytes [offset, offset + length) of `src` into the same offsets of `tmp` (length None:
    the whole file), renamed to `final` by this rank (`own`) or by rank 0 (a shared file).
    `src_tmp`: where an asynchronous save's file is until its save completes (read from
    there if it is still there, else from `src`)."""

    src: str
    tmp: str
    final: str
    offset: int = 0
    length: int | None = None
    own: bool = True
    src_tmp: str = ""


@dataclass
class DrainJob:
    """One checkpoint's drain on this rank (this rank's clock)."""

    index: int
    checkpoint_id: str
    names: list[str]
    pieces: list[Piece]
    save_start_ns: int
    after: object = None  # what the copy waits for: an asynchronous save's write (complete())
    start_ns: int = 0
    end_ns: int = 0
    bytes: int = 0
    syncs: int = 0
    sync_ns: int = 0
    outcome: str = ""  # "" under way, "ok", "stopped", "skipped" (its save failed), or an error
    error: BaseException | None = field(default=None, repr=False)


class Drainer:
    """This rank's drains of the run's checkpoints (collective calls but `close`)."""

    def __init__(self, comm, opts, fast_root: str, shared_file: str | None, starts: list[int],
                 tag: str, fsync: bool, clock_offset_ns: int = 0) -> None:
        self.comm, self.opts, self.fast_root, self.tag = comm, opts, fast_root, tag
        self.root = opts.to
        self.fs = storage_for(self.root)  # drain.to's (the copies'; the sources': source_fs)
        self.source_fs = storage_for(fast_root)
        self.shared_file, self.starts = shared_file, starts  # the shared layout's file
        self.fsync, self.clock_offset_ns = fsync, clock_offset_ns
        self.folder: CheckpointFolder | None = None  # rank 0's, of drain.to
        self.lock = None  # rank 0's claim of drain.to (Storage.claim)
        self.jobs: list[DrainJob] = []      # started, not yet completed by all ranks
        self._todo: collections.deque[DrainJob] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None  # the copy engine could not be made
        self.drained: list[str] = []        # completed, in order (rank 0's keep policy)
        self.waited_ns = 0                  # finish_all's wait for the last drains

    # ----------------------------------------------------------------- before any I/O
    def check(self, schedule, checkpoint_bytes: int, check_complete) -> list[str]:
        """Rank 0, before any I/O: refuse what is in the way on drain.to and is not ours, and
        too little room there for every save; `check_complete(folder, cid)` for checkpoints
        restored from drain.to without being saved. Returns what is in the way (ours)."""
        self.folder = CheckpointFolder(self.root, self.tag, "checkpoint.drain.to")
        self.lock = self.fs.claim(self.root, "checkpoint drain")
        self.lock.check_free()  # another job's drain.to: refused before the fast tier's claim
        if self.opts.restore_from == "pfs":
            for cid in schedule.load_ids():
                if not schedule.saved(cid):
                    check_complete(self.folder, cid)
        in_the_way = in_the_way_of(self.root, schedule)
        self.folder.check_clear(in_the_way)
        check_checkpoint_space(self.folder, schedule.saves, in_the_way, checkpoint_bytes)
        return in_the_way

    def claim(self, in_the_way: list[str]) -> list[str]:
        """Rank 0, after every check: drain.to made, locked for the run and cleared of our
        earlier checkpoints in the way (returned)."""
        self.fs.make_folders(self.root)
        self.lock.acquire()
        return self.folder.clear(in_the_way)

    # ----------------------------------------------------------------- drains
    def start(self, index: int, checkpoint_id: str, shard: RankShard, names: list[str],
              save_start_ns: int, after=None, sources: list[str] = ()) -> None:
        """Collective: list checkpoint `checkpoint_id` begun on drain.to and queue this
        rank's part of its copy: at once when it is complete on the fast tier, or, for an
        asynchronous save, once `after` (its write) has ended, from its files' temporary
        names `sources` (as the pieces), where they are until the save completes."""
        on_root(self.comm, lambda: self.folder.begin(checkpoint_id, names))
        pieces = self._pieces(checkpoint_id, shard)
        for piece, source in zip(pieces, sources):
            piece.src_tmp = source
        if self.shared_file is not None:  # rank 0 creates the one copy the ranks write into
            on_root(self.comm, lambda: self.fs.close(self.fs.create_exclusive(pieces[0].tmp)))
        job = DrainJob(index, checkpoint_id, names, pieces, save_start_ns, after)
        self.jobs.append(job)
        with self._cv:
            self._todo.append(job)
            self._cv.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="dlio-mpi drain",
                                            daemon=True)
            self._thread.start()

    def _pieces(self, checkpoint_id: str, shard: RankShard) -> list[Piece]:
        def at(root: str, name: str) -> str:
            return os.path.join(root, checkpoint_id, name)

        if self.shared_file is not None:  # the file cut at page boundaries (O_DIRECT)
            final, r = at(self.root, self.shared_file), shard.rank
            start = self.starts[r] // PAGE * PAGE
            end = (self.starts[r + 1] // PAGE * PAGE if r + 1 < len(self.starts)
                   else self.starts[r] + shard.nbytes)
            return [Piece(at(self.fast_root, self.shared_file), temporary_name(final, self.tag),
                          final, start, end - start, own=False)]
        return [Piece(at(self.fast_root, name), temporary_name(at(self.root, name), self.tag),
                      at(self.root, name)) for name in shard.names]

    def _work(self) -> None:
        try:
            copier = self.fs.copier(self.opts.buffer_bytes)
        except (MemoryError, ValueError) as exc:  # each drain fails with it, told at poll
            copier, self.failure = None, exc
        while True:
            with self._cv:
                while not self._todo and not self._closing:
                    self._cv.wait()
                if not self._todo:
                    return
                job = self._todo[0]
            if job.after is not None and not job.after.complete():
                job.outcome = "skipped"  # its save failed: that failure ends the run
            elif copier is None:
                job.error, job.outcome = self.failure, f"checkpoint.drain: {self.failure}"
            else:
                self._run_job(copier, job)
            job.end_ns = _core.now_ns()
            with self._cv:
                self._todo.popleft()
                self._cv.notify_all()

    def _run_job(self, copier, job: DrainJob) -> None:
        job.start_ns = _core.now_ns()
        try:
            stopped = any(self._copy(copier, piece, job) for piece in job.pieces)
            job.outcome = "stopped" if stopped else "ok"
        except StopRequested:  # the copy engine saw the signal between two calls
            job.outcome = "stopped"
        except BaseException as exc:  # told at poll, agreed by every rank there
            job.error, job.outcome = exc, describe(exc)

    def _copy(self, copier, piece: Piece, job: DrainJob) -> bool:
        """One piece, a call of drain.buffer_bytes at a time; True when close() cut it short
        (a stop signal raises StopRequested between two calls)."""
        # direct: the copier clears it for an unaligned last piece
        fs, direct = self.fs, self.opts.odirect
        src = _open_source(self.source_fs, piece, direct)
        try:
            if piece.own:
                dst = fs.create_exclusive(piece.tmp, direct=direct)
            else:
                dst = fs.open_write(piece.tmp, direct=direct)
            try:
                end = piece.offset + (self.source_fs.handle_size(src) if piece.length is None
                                      else piece.length)
                at = piece.offset
                while at < end:
                    if self._closing:
                        return True
                    n = min(self.opts.buffer_bytes, end - at)
                    copier.copy(src, dst, at, n, piece.src, piece.tmp)
                    at += n
                    job.bytes += n
                if self.fsync:
                    started = _core.now_ns()
                    fs.sync(dst)
                    job.syncs, job.sync_ns = job.syncs + 1, job.sync_ns + _core.now_ns() - started
            finally:
                fs.close(dst)
        finally:
            self.source_fs.close(src)
        return False

    # ----------------------------------------------------------------- completion
    def poll(self) -> list[CheckpointRecord]:
        """Collective: complete the drains every rank has finished; their records."""
        with self._cv:
            finished = len(self.jobs) - len(self._todo)
        ready = min(self.comm.allgather(finished))
        done, self.jobs = self.jobs[:ready], self.jobs[ready:]
        return [self._complete(job) for job in done]

    def finish_all(self) -> list[CheckpointRecord]:
        """Collective: wait for every drain, complete them (the run's end)."""
        started = _core.now_ns()
        with self._cv:
            while self._todo and self._thread is not None and self._thread.is_alive():
                self._cv.wait(0.1)
        self.waited_ns = max(self.comm.allgather(_core.now_ns() - started))
        return self.poll()

    def _complete(self, job: DrainJob) -> CheckpointRecord:
        outcomes = self.comm.allgather(job.outcome)
        failed = [(rank, o) for rank, o in enumerate(outcomes)
                  if o not in ("ok", "stopped", "skipped")]
        if failed or "stopped" in outcomes or "skipped" in outcomes:
            self._abandon(job)
            if failed:
                raise JobError("; ".join(sorted({o for _, o in failed})))
        else:
            try:
                check_all(self.comm, lambda: [self.fs.rename_noreplace(p.tmp, p.final)
                                              for p in job.pieces if p.own])
                if self.shared_file is not None:
                    on_root(self.comm, lambda: self.fs.rename_noreplace(job.pieces[0].tmp,
                                                                        job.pieces[0].final))
                on_root(self.comm, lambda: self.folder.complete(job.checkpoint_id, job.names))
            except JobError:
                self._abandon(job)
                raise
        record = gather_record(self.comm, "drain", job.index, job.checkpoint_id, job.bytes,
                               job.start_ns, job.end_ns, job.syncs, job.sync_ns,
                               self.clock_offset_ns)
        durable = max(self.comm.allgather(job.end_ns - job.save_start_ns)) / 1e9
        drained = not ("stopped" in outcomes or "skipped" in outcomes)
        if drained and self.comm.Get_rank() == 0:
            self.drained.append(job.checkpoint_id)
        return record.with_drain({"complete": drained, "durable_seconds": durable,
                                  "to": os.path.join(self.root, job.checkpoint_id)})

    def _abandon(self, job: DrainJob) -> None:
        """No copy of `job` stays on drain.to, nor its listing (the fast tier's is kept)."""
        check_all(self.comm, lambda: self.fs.remove_quietly([p.tmp for p in job.pieces
                                                             if p.own]))
        on_root(self.comm, lambda: self.folder.abandon(job.checkpoint_id))

    def fast_copies_to_remove(self, keep: str) -> list[str]:
        """Rank 0: the fast tier's drained checkpoints drain.keep lets go of (none: every
        one drained; last: all but the last drained; all: none)."""
        if keep == "none":
            return list(self.drained)
        if keep == "last":
            return self.drained[:-1]
        return []

    def close(self) -> None:
        """This rank alone, however the run ends: drains not begun dropped, the one under
        way stopped after its current call, this rank's temporaries of drains not completed
        removed (a shared copy's by rank 0)."""
        with self._cv:
            self._closing = True
            while len(self._todo) > (1 if self._thread is not None else 0):
                self._todo.pop()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        for job in self.jobs:
            self.fs.remove_quietly([p.tmp for p in job.pieces
                                    if p.own or self.comm.Get_rank() == 0])
        self.jobs = []


def _open_source(fs: Storage, piece: Piece, direct: bool) -> Handle:
    """The fast tier's file: under its temporary name while its save is completing, then
    under its final name."""
    if piece.src_tmp:
        try:
            return fs.open_read(piece.src_tmp, direct=direct)
        except FileNotFoundError:
            pass  # renamed since
    return fs.open_read(piece.src, direct=direct)

