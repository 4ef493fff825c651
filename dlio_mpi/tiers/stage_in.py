"""storage.stage_in: before training, the dataset is copied from dataset.data_folder (the
parallel file system) to a faster tier, and the run reads the copy.

- scope `job`: one copy under `to` (a burst buffer), made by all ranks together;
  scope `node`: one copy per node under `to` (node-local storage), made by the node's ranks
  (the node communicator). With emulated nodes (DLIO_MPI_RANKS_PER_NODE), which share one
  host's storage, node k's copy goes to `to/node<k>`; on real nodes `to` must be node-local,
  checked before any copying (a probe file of each node seen by another means a shared folder).
- The files' bytes are dealt out in pieces of at most `buffer_bytes` (a file of several
  pieces is copied by several ranks at once), round-robin over the copying ranks, and copied
  by the C core (the storage's copier: pread/pwrite of `buffer_bytes`, O_DIRECT on both sides
  with `odirect`). With `drop_page_cache` each piece of the source is dropped from the page
  cache first (posix_fadvise DONTNEED), so the copy reads storage, not memory.
- Claimed: the copy's folder is locked (the storage's claim) by the copy's first rank before
  anything in it is looked at, and held till the run ends: a second job staging into it is
  refused, naming this one, instead of replacing the copy this one trains on.
- Ownership, by content: a copy is ours by the stage manifest (`dlio_mpi_stage.json`) in its
  folder, written (incomplete) before the first file and marked complete after the last,
  with each file's size and modification time as written (`dlio_mpi_stage_files.bin`); files
  are written under O_EXCL temporaries, synced (syncfs) and renamed without replacing
  anything. A later run replaces its own earlier copy where each file is still the one it
  wrote (of a copy that never completed: written since it began, of the expected size);
  anything else in the way, a file changed since included, is refused, naming it, before
  any copying. `clean: true` removes the copy after the run. A rank failing during the
  copy aborts the job at once.
- Timed from a barrier before the first byte to a barrier after the last rename: the
  `stage_in` phase of summary.json (dlio_mpi.stage_in), with the bytes read from the source
  tier and written to the staged one, and each rank's time in reads and in writes."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from .. import _core, progress
from ..data.dataset import DatasetSplit, FileNaming
from ..data.generate import check_free_space
from ..data.manifest import manifest_path, read_manifest
from ..errors import (
    StopRequested,
    UserError,
    agreed_stop,
    check_all,
    on_root,
    stopped_everywhere,
)
from ..storage import Storage, missing_folders, read_own_json, remove_empty_folders, storage_for
from ..storage.filesystems import nearest_existing
from ..storage.node_local import check_node_local, node_root
from ..storage.ownership import is_temporary_of, temporary_name

STAGE_MANIFEST = "dlio_mpi_stage.json"
STAT_FILE = "dlio_mpi_stage_files.bin"  # per file, in the manifest's order: int64 size, mtime_ns
KIND = "dlio-mpi stage-in copy"


@dataclass(frozen=True)
class StageResult:
    """What a stage-in did (the same on every rank)."""

    root: str              # the copy this rank reads (its node's, or the job's)
    to: str
    scope: str
    copies: int            # 1 (job) or the number of nodes
    files: int             # per copy
    bytes: int             # per copy
    seconds: float         # barrier to barrier
    read_seconds: list[float]   # per rank: time in pread
    write_seconds: list[float]  # per rank: time in pwrite

    def to_json(self, source: str) -> dict:
        moved = self.bytes * self.copies
        rate = moved / 2**30 / self.seconds if self.seconds > 0 else 0.0
        return {"from": source, "to": self.to, "scope": self.scope, "copies": self.copies,
                "files": self.files, "bytes_per_copy": self.bytes,
                "bytes_read": moved, "bytes_written": moved, "seconds": round(self.seconds, 6),
                # the same bytes leave the source tier and reach the staged one
                "read_GiB_per_second": round(rate, 6), "write_GiB_per_second": round(rate, 6),
                "read_seconds_per_rank": [round(s, 6) for s in self.read_seconds],
                "write_seconds_per_rank": [round(s, 6) for s in self.write_seconds]}


class StageSet:
    """The files to copy: those of the located splits (catalog.SplitFiles), numbered one
    after the other, with their sizes and paths relative to the dataset's root."""

    LISTED_MAX = 100_000  # a manifest lists the files by name up to this many, else namings

    def __init__(self, located: dict) -> None:
        self.splits = list(located.values())
        self.first = np.cumsum([0] + [f.count for f in self.splits])
        self.sizes = np.concatenate(
            [f.layouts.take(np.arange(f.count, dtype=np.int64)).size for f in self.splits]
            or [np.zeros(0, dtype=np.int64)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.first[-1])

    @property
    def bytes(self) -> int:
        return int(self.sizes.sum())

    def relpath(self, f: int) -> str:
        k = int(np.searchsorted(self.first, f, side="right")) - 1
        files = self.splits[k]
        return os.path.relpath(files.path(f - int(self.first[k])), files.split.root)

    def describe(self) -> dict:
        """What a stage manifest records to know its files again: their names, or (many
        files of DLIO's names) the namings that generate them."""
        if len(self) <= self.LISTED_MAX or any(f.listed is not None for f in self.splits):
            return {"files": [self.relpath(f) for f in range(len(self))]}
        return {"namings": [dataclasses.asdict(f.split.naming) | {"root": ""}
                            for f in self.splits]}


class EarlierCopy:
    """Our earlier copy in a stage folder, by its manifest: the names it wrote, and whether a
    file found under one of them is still the one it wrote (ownership by content, not by
    name): its size and modification time as recorded when the copy completed; for a copy
    that never completed (a killed job), a regular file of the expected size written since
    that copy began."""

    def __init__(self, root: str, body: dict) -> None:
        self.fs = storage_for(root)
        self.body = body
        tag = body.get("tag")
        self.tag = tag if isinstance(tag, str) else None
        files = body.get("files")
        self.listed = {rel: i for i, rel in enumerate(files) if isinstance(rel, str)} \
            if isinstance(files, list) else None
        started = body.get("started_ns")
        self.started_ns = started if isinstance(started, int) else None
        self.stats = self._read_stats(root) if body.get("complete") is True else None

    def _read_stats(self, root: str) -> np.ndarray | None:
        count = self.body.get("count")
        if not isinstance(count, int) or self.body.get("stat_file") != STAT_FILE:
            return None
        try:
            raw = self.fs.read_small(os.path.join(root, STAT_FILE), 16 * count + 16)
        except (OSError, ValueError):
            return None
        if raw is None or len(raw) != 16 * count:
            return None
        return np.frombuffer(raw, dtype="<i8").reshape(count, 2)

    def index(self, relpath: str) -> int | None:
        """The file's number in the earlier copy (None: the copy did not write it)."""
        if self.listed is not None:
            return self.listed.get(relpath)
        first = 0
        for naming in self.body.get("namings", []):
            try:
                names = FileNaming(**naming)
                stem = os.path.basename(relpath)
                head, tail = f"{names.prefix}_", f"_of_{names.count}.{names.extension}"
                if stem.startswith(head) and stem.endswith(tail):
                    index = int(stem[len(head):-len(tail)])
                    if 0 <= index < names.count and names.relpath(index) == relpath:
                        return first + index
                first += names.count
            except (TypeError, ValueError):
                return None
        return None

    def names(self) -> list[str]:
        """The names it wrote, where its manifest lists them."""
        return list(self.listed or ())

    def owns(self, path: str, relpath: str, size: int | None = None) -> bool:
        """Whether the file at `path` is the one this copy wrote under `relpath`, unchanged."""
        index = self.index(relpath)
        if index is None:
            return False
        st = self.fs.entry(path)
        if st is None or st.kind != "file":
            return False
        if self.stats is not None:
            return [st.size, st.mtime_ns] == self.stats[index].tolist()
        # a copy that never completed: written since it began (file times come from a coarse
        # clock, a tick behind the one that stamped the manifest)
        return (self.started_ns is not None and st.mtime_ns >= self.started_ns - 10**9
                and (size is None or st.size == size))


def rerooted(split: DatasetSplit, root: str) -> DatasetSplit:
    """The split with its files under `root` (the staged copy) instead."""
    return dataclasses.replace(split, naming=dataclasses.replace(split.naming, root=root))


def deal(sizes: np.ndarray, piece: int, copiers: int, me: int
         ) -> tuple[list[tuple[int, int, int]], list[int]]:
    """This copier's pieces (file, offset, length), in file order: each file cut in pieces of
    at most `piece` bytes, the pieces of all files dealt round-robin over `copiers`; and the
    files it creates (those whose first piece it copies)."""
    count = np.maximum(1, -(-sizes // piece))
    first = np.cumsum(count) - count  # the global number of each file's first piece
    creates = np.flatnonzero(first % copiers == me)
    mine = [(int(f), 0, int(min(piece, sizes[f]))) for f in creates]
    for f in np.flatnonzero(count > 1).tolist():  # files of several pieces: few
        size = int(sizes[f])
        mine += [(f, offset, min(piece, size - offset)) for k, offset in
                 enumerate(range(piece, size, piece), start=int(first[f]) + 1)
                 if k % copiers == me]
    mine.sort()
    return mine, creates.tolist()


class _Stage:
    """One copy: the ranks of `comm` copy `files` from `source` into `root`."""

    def __init__(self, comm, opts, files: StageSet, source: str, root: str, tag: str,
                 copies_here: int = 1) -> None:
        self.comm, self.opts, self.files = comm, opts, files
        self.copies_here = copies_here  # copies made on root's file system (emulated nodes)
        self.source, self.root, self.tag = source, root, tag
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.pieces, self.creates = deal(files.sizes, opts.buffer_bytes, self.size, self.rank)
        # files of one piece are created, written and renamed by their copier alone; a file
        # of several pieces is created before the copy (and renamed after it) by its first
        # piece's copier
        self.shared = [f for f in self.creates if self.several(f)]
        # the source's storage and the copy's (one copier moves the bytes between them: the
        # same POSIX storage today)
        self.source_fs: Storage = storage_for(source)
        self.fs: Storage = storage_for(root)
        self.copier = self.fs.copier(opts.buffer_bytes)
        self.lock = None  # fs.claim's, the copy's first rank's: held till the run ends
        self.created: list[str] = []  # the folders its claim made (removed on a refusal)
        self.started_ns: int | None = None  # when the copy's manifest was first written

    def several(self, f: int) -> bool:
        """Whether file f is copied in several pieces (possibly by several ranks)."""
        return int(self.files.sizes[f]) > self.opts.buffer_bytes

    def dst(self, f: int) -> str:
        return os.path.join(self.root, self.files.relpath(f))

    def src(self, f: int) -> str:
        return os.path.join(self.source, self.files.relpath(f))

    def folders(self) -> list[str]:
        """The folders the copy's files go to."""
        out = set()
        for files in self.files.splits:
            if files.listed is not None:
                out |= {os.path.join(self.root, os.path.dirname(p)) for p in files.listed}
            else:
                out |= set(rerooted(files.split, self.root).naming.folders())
        return sorted(out)

    # ---------------------------------------------------------------- before the clock
    def make_way(self) -> None:
        """Collective: claim the folder; refuse what is in the way and not ours (or changed
        since we wrote it); remove our earlier copy; write the manifest (incomplete); make
        the folders; create the shared files. A refusal leaves the folder as it was."""
        try:
            check_all(self.comm, lambda: self._claim() if self.rank == 0 else None)
            body = on_root(self.comm, self._earlier)
            earlier = EarlierCopy(self.root, body) if body is not None else None
            check_all(self.comm, lambda: self._clear_mine(earlier))
            check_all(self.comm, lambda: self._begin(earlier) if self.rank == 0 else None)
            check_all(self.comm, self._create_shared)
        except BaseException:
            if self.rank == 0:
                self.release()
                remove_empty_folders(self.created)
            raise

    def _claim(self) -> None:
        """The copy's first rank: the folder made and locked for this job, before anything in
        it is looked at: a second job staging into it is refused, naming this one (it would
        replace the copy this job trains on)."""
        self.created = missing_folders(self.root)
        self.fs.make_folders(self.root)
        self.lock = self.fs.claim(self.root, "stage-in")
        try:
            self.lock.acquire()
        except UserError as exc:
            self.lock = None
            remove_empty_folders(self.created)
            raise UserError(f"storage.stage_in.to: {exc}") from None

    def release(self) -> None:
        """Let the next job have the folder (the copy's first rank; at the run's end)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _clear_mine(self, earlier: EarlierCopy | None) -> None:
        """Each rank, the files it creates: an earlier job's leftovers (killed, out of space)
        removed by its tag; our earlier copy's files removed where unchanged; anything else
        under their names refused, naming it."""
        if earlier is not None and earlier.tag is not None:
            self.fs.remove_quietly(temporary_name(self.dst(f), earlier.tag)
                                   for f in self.creates)
        for f in self.creates:
            path, rel = self.dst(f), self.files.relpath(f)
            if not self.fs.exists(path):
                continue
            if earlier is None or earlier.index(rel) is None:
                raise UserError(f"storage.stage_in.to: {path} exists and is not dlio-mpi's (no "
                                "stage manifest of ours lists it): it was left as it is; "
                                "remove it yourself or choose another folder")
            if not earlier.owns(path, rel, int(self.files.sizes[f])):
                raise UserError(f"storage.stage_in.to: {path} was changed since dlio-mpi staged "
                                "it (it is not the file our stage manifest recorded): it was "
                                "left as it is; remove it yourself or choose another folder")
            self.fs.remove(path)

    def _create_shared(self) -> None:
        for f in self.shared:
            handle = self.fs.create_exclusive(temporary_name(self.dst(f), self.tag))
            try:
                self.fs.truncate(handle, int(self.files.sizes[f]))
            finally:
                self.fs.close(handle)

    def _earlier(self) -> dict | None:
        """Our earlier copy's manifest in this folder (None: no copy of ours)."""
        path = os.path.join(self.root, STAGE_MANIFEST)
        body = read_own_json(path, f"storage.stage_in.to: {path} is not dlio-mpi's")
        if body is None:
            return None
        if body.get("kind") != KIND:
            raise UserError(f"storage.stage_in.to: {path} is not a stage manifest of "
                            "dlio-mpi; remove it yourself or choose another folder")
        return body

    def _begin(self, earlier: EarlierCopy | None) -> None:
        # before anything is written: room for every copy this file system takes (our earlier
        # copy's files are gone already)
        check_free_space(nearest_existing(self.root), self.files.bytes * self.copies_here,
                         "storage.stage_in.to")
        self._remove_earlier_side_files(earlier)
        for side in [*self._side_files(), STAT_FILE]:  # what is there now is not ours
            if self.fs.exists(os.path.join(self.root, side)):
                raise UserError(f"storage.stage_in.to: {os.path.join(self.root, side)} exists "
                                "and is not dlio-mpi's (no stage manifest of ours lists it): "
                                "it was left as it is; remove it yourself or choose another "
                                "folder")
        if earlier is not None:  # our earlier copy's files this one does not replace
            now = set(self.files.describe().get("files", []))
            self.fs.remove_quietly(
                os.path.join(self.root, rel) for rel in earlier.names()
                if rel not in now and earlier.owns(os.path.join(self.root, rel), rel))
        self.started_ns = time.time_ns()
        self._write_manifest(complete=False)
        if self.opts.odirect and len(self.files):  # both tiers must do real direct I/O
            for fs, path in ((self.source_fs, self.src(0)),
                             (self.fs, os.path.join(self.root, STAGE_MANIFEST))):
                try:
                    fs.direct_alignment(path)
                except OSError:
                    raise UserError(f"storage.stage_in.odirect: true, but {path} is on a file "
                                    "system without real direct I/O (tmpfs only emulates it "
                                    "through the page cache); set storage.stage_in.odirect: "
                                    "false or stage to another folder") from None
        for folder in self.folders():
            self.fs.make_folders(folder)

    def _remove_earlier_side_files(self, earlier: EarlierCopy | None) -> None:
        """Our earlier copy's side files, record and temporaries (its manifest lists them)."""
        if earlier is None:
            return
        tag = earlier.tag
        sides = [side for side in earlier.body.get("side_files", [])
                 if isinstance(side, str) and os.sep not in side]
        if earlier.body.get("stat_file") == STAT_FILE:
            sides.append(STAT_FILE)
        for side in sides:
            path = os.path.join(self.root, side)
            self.fs.remove_quietly([path] + ([temporary_name(path, tag)] if tag else []))
        if tag is not None:
            self.fs.remove_quietly([temporary_name(os.path.join(self.root, STAGE_MANIFEST),
                                                   tag)])

    def _write_manifest(self, complete: bool) -> None:
        body = {"tool": "dlio-mpi", "kind": KIND, "tag": self.tag, "source": self.source,
                "complete": complete, "started_ns": self.started_ns, "count": len(self.files),
                "bytes": self.files.bytes, "side_files": self._side_files(),
                **({"stat_file": STAT_FILE} if complete else {}), **self.files.describe()}
        final = os.path.join(self.root, STAGE_MANIFEST)
        tmp = temporary_name(final, self.tag)
        self.fs.put(tmp, json.dumps(body).encode(), sync=True)
        self.fs.replace_own(tmp, final)  # our own manifest (read above), or none

    def _side_files(self) -> list[str]:
        """Our generation's manifest and recorded sizes beside the source's files."""
        manifest = read_manifest(self.source)
        if manifest is None:
            return []
        names = [os.path.basename(manifest_path(self.source))]
        names += [n for n in (manifest.get("sizes") or {}).values() if isinstance(n, str)]
        return [n for n in names if _is_file(self.source_fs, os.path.join(self.source, n))]

    # ---------------------------------------------------------------- on the clock
    def copy(self, shown) -> None:
        """This rank's pieces, then a syncfs, then the renames of the files it alone wrote;
        on a failure (out of space, a source file changed) the copy's temporaries, every
        rank's, are removed first, as the job then ends at once (the other ranks with it)."""
        try:
            self._copy(shown)
        except StopRequested:
            raise  # the ranks agree on it first (stage_in): another may still be renaming
        except BaseException:
            self.remove_temporaries()
            raise

    def remove_temporaries(self) -> None:
        """Every temporary of this copy (this job's tag) in the copy's folders."""
        for folder in self.folders():
            try:
                mine = [os.path.join(folder, e.name) for e in self.fs.list(folder)
                        if is_temporary_of(e.name, (self.tag,))]
            except OSError:
                continue
            self.fs.remove_quietly(mine)

    def _copy(self, shown) -> None:
        o, src_fs, fs = self.opts, self.source_fs, self.fs
        direct = bool(o.odirect)
        done = 0
        alone = []
        for f, offset, length in self.pieces:
            src_path, dst_path = self.src(f), self.dst(f)
            tmp = temporary_name(dst_path, self.tag)
            src = src_fs.open_read(src_path, direct=direct)
            try:
                if self.several(f):
                    dst = fs.open_write(tmp, direct=direct)
                else:
                    dst = fs.create_exclusive(tmp, direct=direct)
                    alone.append(f)
                try:
                    if o.drop_page_cache and length and not direct:
                        src_fs.drop_cached(src, offset, length)
                    self.copier.copy(src, dst, offset, length, src_path, tmp)
                finally:
                    fs.close(dst)
            finally:
                src_fs.close(src)
            done += length
            shown.update_to(done)
        fs.sync_all(self.root)
        for f in alone:
            fs.rename_noreplace(temporary_name(self.dst(f), self.tag), self.dst(f))

    def finish(self) -> None:
        """After every rank's copy: the shared files' renames."""
        self.comm.Barrier()  # every piece of the shared files is in (and synced)
        check_all(self.comm, lambda: [self.fs.rename_noreplace(
            temporary_name(self.dst(f), self.tag), self.dst(f)) for f in self.shared])

    def record(self) -> None:
        """Collective, after the clock: each file's size and modification time as written
        (what tells a later stage-in the file is still the one we wrote), the side files, the
        manifest marked complete."""

        def written() -> np.ndarray:
            out = np.zeros((len(self.creates), 3), dtype=np.int64)
            for k, f in enumerate(self.creates):
                st = self.fs.entry(self.dst(f))
                if st is None:  # as lstat says it
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.dst(f))
                out[k] = (f, st.size, st.mtime_ns)
            return out

        mine = check_all(self.comm, written)
        everyone = self.comm.gather(mine, root=0)

        def complete() -> None:
            table = np.zeros((len(self.files), 2), dtype="<i8")
            for part in everyone:
                table[part[:, 0]] = part[:, 1:]
            for side in self._side_files():
                with self.source_fs.stream(os.path.join(self.source, side)) as fp:
                    data = fp.read()
                _write_small(self.fs, data, os.path.join(self.root, side), self.tag)
            _write_small(self.fs, table.tobytes(), os.path.join(self.root, STAT_FILE),
                         self.tag)
            self._write_manifest(complete=True)

        check_all(self.comm, lambda: complete() if self.rank == 0 else None)

    # ---------------------------------------------------------------- after the run
    def clean(self) -> None:
        """Collective: remove this copy (each rank the files it created, rank 0 the rest)."""
        self.fs.remove_quietly(self.dst(f) for f in self.creates)
        self.comm.Barrier()
        if self.rank == 0:
            self.fs.remove_quietly(os.path.join(self.root, n)
                                   for n in [*self._side_files(), STAT_FILE, STAGE_MANIFEST])
            self.release()  # the lock file, before its folder goes
            folders = self.folders()
            for folder in [*sorted(folders, key=len, reverse=True),
                           *_parents(folders, self.root), self.root]:
                self.fs.remove_folder(folder)  # not if something else lives there


def _parents(folders: list[str], root: str) -> list[str]:
    out: set[str] = set()
    for folder in folders:
        parent = os.path.dirname(folder)
        while len(parent) > len(root):
            out.add(parent)
            parent = os.path.dirname(parent)
    return sorted(out, key=len, reverse=True)


def _is_file(fs: Storage, path: str) -> bool:
    """Whether `path` is a regular file, following a link (as os.path.isfile)."""
    try:
        fs.size(path)
    except OSError:
        return False
    return True


def _write_small(fs: Storage, data: bytes, dst: str, tag: str) -> None:
    tmp = temporary_name(dst, tag)
    fs.put(tmp, data, sync=True)
    fs.rename_noreplace(tmp, dst)  # nothing there: make_way cleared our earlier one


def stage_in(comm, opts, files: StageSet, source: str, topo, tag: str
             ) -> tuple[StageResult, _Stage]:
    """Collective: copy `files` (relative to `source`) to the stage folder per opts.scope;
    the result and the copy (for `clean`)."""
    scope = opts.scope
    node = topo.node if scope == "node" else 0
    group = comm.Split(node, comm.Get_rank())
    if scope == "node" and not topo.emulated and topo.nodes > 1:
        check_node_local(comm, opts.to, node, group.Get_rank() == 0, tag)
    root = node_root(opts.to, scope, node, topo.emulated)
    copies_here = topo.nodes if scope == "node" and topo.emulated else 1
    stage = _Stage(group, opts, files, source, root, tag, copies_here)
    stage.make_way()
    mine = sum(length for _, _, length in stage.pieces)
    comm.Barrier()
    start = _core.now_ns()
    # a rank failing in the copy aborts the job at once (cli.main), not after the others' copies
    stop = 0
    try:
        with progress.task("stage-in (rank 0's pieces)", mine, progress.BYTES) as shown:
            stage.copy(shown)
    except StopRequested as exc:  # between two calls: every rank leaves its copy, then agrees
        stop = exc.signum
    if stop := agreed_stop(comm, stop):
        stage.remove_temporaries()  # an incomplete copy: its manifest says so, a rerun redoes it
        stage.release()
        raise stopped_everywhere(stop)
    stage.finish()
    comm.Barrier()
    seconds = (_core.now_ns() - start) / 1e9
    seconds = comm.bcast(seconds, root=0)
    stage.record()
    times = comm.allgather((stage.copier.read_ns / 1e9, stage.copier.write_ns / 1e9))
    result = StageResult(root, opts.to, scope, topo.nodes if scope == "node" else 1,
                         len(files), files.bytes, seconds,
                         [t[0] for t in times], [t[1] for t in times])
    return result, stage


def clean_stage(comm, stage: _Stage) -> None:
    """Collective: remove the staged copy (storage.stage_in.clean)."""
    check_all(comm, stage.clean)

