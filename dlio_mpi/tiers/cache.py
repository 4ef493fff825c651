"""reader.cache: a node-local caching tier shared by the ranks of a node, as Lustre PCC or
BeeGFS OnDemand cache files on local SSD.

- Granularity: whole files. The first rank of a node to read a file that is not in the cache
  copies it whole into the cache (the C engine, DIO_REQ_FILL: before that request, on its
  reader thread, so a batch waits for it as a read waits for PCC's attach) and reads it from
  there; later reads of a cached file hit the cache (DIO_REQ_CACHED). Another rank of the node
  reading a file in the epoch in which it is filled reads it from the PFS (the node's first
  reader fills it, once).
- Decisions are planned, per epoch, identically on every rank of the node from the node's
  plans (one allgather on the node communicator per epoch, before the epoch's clock): the
  node's reads in step order (rank order within a step) meet the cache's state, its
  `capacity_bytes` (default: the folder's free space when the run starts; more is refused)
  and its policy: `none` fills while there is room and then reads from the PFS; `lru` makes
  room by evicting the least recently used copies (the C engine removes them before the
  filling request), never one that a rank of the node uses within its batches read ahead + 2
  steps (its readers may run that far ahead: `prefetch_size`, or a torch DataLoader's batches
  in flight, readers.batches_in_flight). A copy found gone anyway is read from the PFS
  instead, and counted; so is a fill that runs out of room (ENOSPC, EDQUOT: counted, and
  warned of by rank 0).
- The cache folder: `folder`, or `folder/node<k>` on emulated nodes (which share one host's
  storage); on real nodes a folder the nodes share is refused. One job at a time: the node
  leader claims it (the storage's claim) till the run ends, as another job's fills and
  evictions would make this job's planned hits miss. Its copies are ours by
  `dlio_mpi_cache.json`; a run starts with the cache empty (removing our earlier copies,
  refusing anything else in the way) and removes its copies when it ends.
- Reported per epoch (per_epoch_stats.json `cache`): the hit ratio (requests of files the
  cache held when the epoch began that their copy served, over all requests), the requests
  the cache served (hits and the reads of the copies filled), bytes from each tier, files
  filled, their bytes and time, evictions, fallbacks (opens of copies found gone) and the
  requests and bytes read from the PFS so: the C engine counts where each request's bytes
  came from (DIO_REQ_HIT marks the planned hits)."""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..errors import UserError, check_all, on_root
from ..sampling.requests import ReadPlan
from ..storage import missing_folders, read_own_json, remove_empty_folders, storage_for
from ..storage.filesystems import nearest_existing
from ..storage.node_local import check_node_local, node_root
from ..storage.ownership import is_temporary_of, temporary_name

CACHE_MANIFEST = "dlio_mpi_cache.json"
KIND = "dlio-mpi cache tier"
COUNTERS = ("cache_reads", "cache_fills", "cache_fill_bytes", "cache_fill_ns",
            "cache_evictions", "cache_fallbacks", "cache_fallback_reads",
            "cache_fallback_bytes", "cache_hit_fallbacks", "cache_fill_failures")
# test hook: before each epoch the node leader removes this many of the copies the cache
# holds (the lowest file numbers), as something outside the job would; the plan counts on them
VANISH_ENV = "DLIO_MPI_TEST_CACHE_VANISH"


@dataclass
class _Split:
    """The node's cached copies of one split's files: file -> its recency (a tick), and a
    heap of (recency, file) whose stale entries (the recency changed since) are skipped."""

    sizes: np.ndarray
    resident: dict[int, int] = field(default_factory=dict)
    heap: list[tuple[int, int]] = field(default_factory=list)
    # entries set aside while their copy is in use: (the step it may be evicted from,
    # recency, file); back into the heap from that step on, and when the epoch ends
    parked: list[tuple[int, int, int]] = field(default_factory=list)

    def touch(self, f: int, recency: int) -> None:
        self.resident[f] = recency
        heapq.heappush(self.heap, (recency, f))


class CacheTier:
    """One run's cache tier on this rank's node (collective construction)."""

    def __init__(self, comm, opts, topo, tag: str, source_root: str) -> None:
        self.opts, self.tag, self.source_root = opts, tag, source_root
        self.comm = comm
        self.node = comm.Split(topo.node, comm.Get_rank())
        self.leader = self.node.Get_rank() == 0
        if not topo.emulated and topo.nodes > 1:
            check_node_local(comm, opts.folder, topo.node, self.leader, tag)
        self.root = node_root(opts.folder, "node", topo.node, topo.emulated)
        self.fs = storage_for(self.root)
        self.created: list[str] = []  # the node leader's: the folders it made (_open)
        self.lock = self.fs.claim(self.root, "cache tier")  # the node leader's, till close()
        # agreed by every rank: a node refused (another job holds its folder) stops them all
        self.capacity = check_all(comm, lambda: on_root(self.node, self._open))
        self.used = 0
        self.tick = 0
        self.splits: dict[str, _Split] = {}
        self.files: dict = {}  # split name -> its catalog.SplitFiles (attach)
        self.made: set[str] = set()  # folders of copies (for the removal at the end)

    @property
    def suffix(self) -> str:
        """What ends a fill's temporaries (ownership.temporary_name's form)."""
        return temporary_name("", self.tag)

    # ---------------------------------------------------------------- the folder
    def _open(self) -> int:
        """The node leader: claim the folder for this job (empty of ours), return the
        capacity. Another live job's folder is refused before anything in it is touched."""
        self.created = missing_folders(self.root)  # removed with the copies, when empty
        self.fs.make_folders(self.root)
        try:
            self.lock.acquire()
            self._remove_earlier()
            capacity = self._capacity()
            self._write_manifest([])
        except BaseException:
            self.lock.release()
            remove_empty_folders(self.created)
            raise
        return capacity

    def _capacity(self) -> int:
        """capacity_bytes, or the folder's free space (our earlier copies removed); more than
        that is refused: the fills would run out of room."""
        free = storage_for(self.root).free_bytes(self.root)
        wanted = self.opts.capacity_bytes
        if wanted is None and free is None:
            raise UserError(f"reader.cache.capacity_bytes: unset, but the storage of "
                            f"{self.root} says no bound on its room; expected a number of bytes")
        if wanted is None:
            return free
        if free is not None:
            check_capacity(wanted, free, self.root)
        return int(wanted)

    def _remove_earlier(self) -> None:
        """Remove the copies (and a crashed run's fill temporaries) an earlier run's manifest
        lists; refuse a manifest that is not ours."""
        path = os.path.join(self.root, CACHE_MANIFEST)
        earlier = read_own_json(path, f"reader.cache.folder: {path} is not dlio-mpi's")
        if earlier is None:
            return
        if earlier.get("kind") != KIND:
            raise UserError(f"reader.cache.folder: {path} is not a cache manifest of "
                            "dlio-mpi; remove it yourself or choose another folder")
        listed = [rel for rel in earlier.get("files", [])
                  if isinstance(rel, str) and not rel.startswith(("/", ".."))]
        self.fs.remove_quietly(os.path.join(self.root, rel) for rel in listed)
        if isinstance(earlier.get("tag"), str):  # a crashed run's fills in progress
            self._remove_temporaries({os.path.dirname(rel) for rel in listed}, earlier["tag"])

    def _remove_temporaries(self, folders: set[str], tag: str) -> None:
        """Remove the fill temporaries of the run that carried `tag` (ours by that tag)."""
        for folder in folders:
            path = os.path.join(self.root, folder)
            try:
                stale = [os.path.join(path, e.name) for e in self.fs.list(path)
                         if is_temporary_of(e.name, (tag,))]
            except FileNotFoundError:
                continue
            self.fs.remove_quietly(stale)

    def _write_manifest(self, files: list[str]) -> None:
        final = os.path.join(self.root, CACHE_MANIFEST)
        tmp = temporary_name(final, self.tag)
        self.fs.put(tmp, json.dumps({"tool": "dlio-mpi", "kind": KIND, "tag": self.tag,
                                     "source": self.source_root, "files": files}).encode())
        self.fs.replace_own(tmp, final)  # our own manifest (or none)

    def attach(self, name: str, files, engine) -> None:
        """Collective on the node: give `engine` the cache's copies of split `name`'s files
        (catalog.SplitFiles), make their folders and list them as ours before any copy."""
        sizes = files.layouts.take(np.arange(files.count, dtype=np.int64)).size
        self.splits[name] = _Split(np.asarray(sizes, dtype=np.int64))
        self.files[name] = files
        rel = [os.path.relpath(files.path(i), files.split.root) for i in range(files.count)] \
            if files.listed is not None or files.count <= 100_000 else None
        if rel is not None:
            engine.set_cache(self.suffix, paths=[os.path.join(self.root, r) for r in rel])
            folders = {os.path.dirname(r) for r in rel}
        else:
            naming = files.split.naming
            folder, sub, sub_digits, stem, digits, tail = naming.pattern()
            local = os.path.join(self.root, os.path.relpath(folder, files.split.root))
            engine.set_cache(self.suffix, naming.count, local, sub, sub_digits, stem, digits,
                             tail)
            folders = {os.path.relpath(f, files.split.root) for f in naming.folders()}

        def prepare() -> None:
            names = rel if rel is not None else [
                os.path.relpath(files.path(i), files.split.root) for i in range(files.count)]
            self._refuse_in_the_way(folders, names)
            for f in folders:
                self.fs.make_folders(os.path.join(self.root, f))
            self.made.update(folders)
            self._write_manifest(sorted(set(self._listed() + names)))

        check_all(self.node, lambda: prepare() if self.leader else None)

    def describe(self) -> dict:
        """For summary.json (dlio_mpi.readers.cache): this node's folder, capacity, policy."""
        return {"folder": self.opts.folder, "node_folder": self.root,
                "capacity_bytes": self.capacity, "policy": self.opts.policy,
                "granularity": "file", "fill": "whole file, before the first read, by the "
                "node's first reader in step order"}

    def _refuse_in_the_way(self, folders, names: list[str]) -> None:
        """Refuse, naming it, anything under the cache folder a copy would be named as (the
        earlier copies of ours were removed when the folder was claimed)."""
        wanted = set(names)
        for folder in folders:
            path = os.path.join(self.root, folder)
            try:
                entries = self.fs.list(path)
            except FileNotFoundError:
                continue
            for entry in entries:
                if os.path.normpath(os.path.join(folder, entry.name)) in wanted:
                    raise UserError(
                        f"reader.cache.folder: {os.path.join(path, entry.name)} exists and "
                        "is not dlio-mpi's (no cache manifest of ours lists it): it was left "
                        "as it is; remove it yourself or choose another folder")

    def _listed(self) -> list[str]:
        body = read_own_json(os.path.join(self.root, CACHE_MANIFEST), "")
        return list(body.get("files", [])) if body else []

    def release(self) -> None:
        """Let the next job have the folder (the node leader's lock; close() releases it too,
        this is for a run that ends otherwise)."""
        self.lock.release()

    def close(self) -> None:
        """Collective: remove the copies (each node's leader), the manifests, the folders."""
        self.node.Barrier()
        if self.leader:
            self.fs.remove_quietly(os.path.join(self.root, rel) for rel in self._listed())
            self.fs.remove_quietly([os.path.join(self.root, CACHE_MANIFEST)])
            self.lock.release()  # before the folders go: its file lives in the root
            for folder in sorted(self.made, key=len, reverse=True):
                parts = folder.split(os.sep)
                for k in range(len(parts), 0, -1):
                    if not self.fs.remove_folder(os.path.join(self.root, *parts[:k])):
                        break
        # the folders the run made: each node's own first, then (after every node's) the
        # ones above them the nodes may share (emulated nodes' folder/node<k>)
        for folders in (self.created[:1], self.created[1:]):
            self.comm.Barrier()
            if self.leader:
                for folder in folders:  # not if something else lives there, or another
                    self.fs.remove_folder(folder)  # leader took it

    # ---------------------------------------------------------------- an epoch's plan
    def plan_epoch(self, name: str, plan: ReadPlan, window: int) -> ReadPlan:
        """Collective on the node: `plan` with the cache's flags and evictions."""
        split = self.splits[name]
        if self.leader and os.environ.get(VANISH_ENV):  # before the allgather: none reads yet
            files = self.files[name]
            self.fs.remove_quietly(
                os.path.join(self.root, os.path.relpath(files.path(f), files.split.root))
                for f in sorted(split.resident)[:int(os.environ[VANISH_ENV])])
        step = np.searchsorted(plan.batch_start, np.arange(len(plan.file_idx)), side="right") - 1
        files, first = np.unique(plan.file_idx, return_index=True)
        last = np.zeros(len(files), dtype=np.int64)
        np.maximum.at(last, np.searchsorted(files, plan.file_idx), step)
        mine = (files.astype(np.int64), step[first].astype(np.int64), last)
        everyone = self.node.allgather(mine)
        decisions, evictions = self._simulate(split, everyone, window)
        me = self.node.Get_rank()
        flags = plan.flags.copy()
        fill, hit = decisions[me]
        index = np.searchsorted(files, plan.file_idx)
        hit_mask = np.isin(files, hit)
        fill_mask = np.isin(files, fill)
        flags[hit_mask[index] | fill_mask[index]] |= _core.REQ_CACHED
        flags[hit_mask[index]] |= _core.REQ_HIT  # for the counters: a planned hit
        fill_first = first[fill_mask]
        flags[fill_first] |= _core.REQ_FILL
        evict_at = evict_file = None
        mine_evictions = evictions.get(me, {})
        if mine_evictions:
            counts = np.zeros(len(plan.file_idx) + 1, dtype=np.int64)
            ordered = []
            for f in sorted(mine_evictions, key=lambda f: int(first[np.searchsorted(files, f)])):
                at = int(first[np.searchsorted(files, f)])
                counts[at + 1] += len(mine_evictions[f])
                ordered += mine_evictions[f]
            evict_at = np.cumsum(counts)
            evict_file = np.asarray(ordered, dtype=np.int64)
        return dataclasses.replace(plan, flags=flags, evict_at=evict_at, evict_file=evict_file)

    def _victims(self, split: _Split, size: int, busy: dict, a: int, window: int
                 ) -> tuple[list[int], int]:
        """lru: the least recently used copies to evict for `size` more bytes at step `a`,
        never one a rank of the node uses within `window` steps of now (none if even all the
        others would not make room); and, when none would, the first step at which one of
        those in use may be free."""
        while split.parked and split.parked[0][0] <= a:  # free again by now
            _, recency, g = heapq.heappop(split.parked)
            heapq.heappush(split.heap, (recency, g))
        room, victims = self.used, []
        while room + size > self.capacity and split.heap:
            recency, g = heapq.heappop(split.heap)
            if split.resident.get(g) != recency:
                continue  # stale: used again since, its newer entry is in the heap
            lo, hi = busy.get(g, (None, None))
            if lo is not None and lo - window <= a <= hi + window:
                # in use around now by a rank of the node: aside until it is not
                heapq.heappush(split.parked, (hi + window + 1, recency, g))
                continue
            victims.append((recency, g))
            room -= int(split.sizes[g])
        if room + size <= self.capacity:
            return [g for _, g in victims], -1
        for entry in victims:  # no room even so: nothing evicted
            heapq.heappush(split.heap, entry)
        return [], split.parked[0][0] if split.parked else -1

    def _simulate(self, split: _Split, everyone: list, window: int):
        """The node's decisions, the same on each of its ranks: per rank, the files it fills
        and the files it reads from the cache; per rank, per file it fills, the copies it
        evicts first."""
        busy: dict[int, tuple[int, int]] = {}  # file -> its span of steps this epoch
        events = []
        for rank, (files, first, last) in enumerate(everyone):
            for f, a, b in zip(files.tolist(), first.tolist(), last.tolist()):
                lo, hi = busy.get(f, (a, b))
                busy[f] = (min(lo, a), max(hi, b))
                events.append((a, rank, f, b))
        events.sort()
        base = self.tick
        filled: set[int] = set()
        fills: list[list[int]] = [[] for _ in everyone]
        hits: list[list[int]] = [[] for _ in everyone]
        evictions: dict[int, dict[int, list[int]]] = {}
        blocked_until = -1  # no room to be made before this step (every copy left in use)
        for a, rank, f, b in events:
            if f in split.resident and f not in filled:
                hits[rank].append(f)
                split.touch(f, max(split.resident[f], base + b))
                continue
            if f in filled:
                continue  # filled by the node's first reader this epoch: the PFS for this one
            size = int(split.sizes[f])
            victims: list[int] = []
            if (self.used + size > self.capacity and self.opts.policy == "lru"
                    and a >= blocked_until):
                victims, blocked_until = self._victims(split, size, busy, a, window)
            if self.used - sum(int(split.sizes[g]) for g in victims) + size > self.capacity:
                continue  # no room: read from the PFS
            for g in victims:
                del split.resident[g]
                self.used -= int(split.sizes[g])
            self.used += size
            split.touch(f, base + b)
            filled.add(f)
            fills[rank].append(f)
            if victims:
                evictions.setdefault(rank, {})[f] = victims
        for _, recency, g in split.parked:  # the next epoch has other spans in use
            heapq.heappush(split.heap, (recency, g))
        split.parked.clear()
        self.tick = base + 1 + max((b for _, _, _, b in events), default=0)
        if len(split.heap) > 4 * len(split.resident) + 1024:  # drop the stale entries
            split.heap = [(r, f) for f, r in split.resident.items()]
            heapq.heapify(split.heap)
        decisions = [(np.asarray(fills[r], dtype=np.int64), np.asarray(hits[r], dtype=np.int64))
                     for r in range(len(everyone))]
        return decisions, evictions


def check_capacity(wanted: int, free: int, folder: str) -> None:
    """Refuse a capacity_bytes above the cache folder's free space: its fills would run out
    of room."""
    if wanted > free:
        raise UserError(
            f"reader.cache.capacity_bytes: {wanted} is more than the free space of the cache "
            f"folder {folder} ({free} bytes); expected at most {free}, or leave it unset to "
            "use the free space")


def capacity_warning(opts) -> str:
    """validate: why `run` would refuse the cache's capacity_bytes on the storage at hand
    ('' when it would not; the free space is the folder's file system's now, before the run
    removes any copies of an earlier run of ours there)."""
    if opts.capacity_bytes is None:
        return ""
    where = nearest_existing(opts.folder)
    free = storage_for(where).free_bytes(where)
    if free is None:
        return ""
    try:
        check_capacity(opts.capacity_bytes, free, opts.folder)
    except UserError as exc:
        return f"run would refuse: {exc}"
    return ""


def epoch_cache(before: dict, after: dict, plan: ReadPlan, requests: int) -> dict:
    """This rank's cache figures for an epoch: the engine's counter deltas, and the bytes
    requested from each tier: by the planned tier of each request, but those the engine read
    from the PFS as their copy was gone counted there (a fill's whole file comes from the
    PFS too)."""
    out = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
    flags, length = plan.flags[:requests], plan.length[:requests]
    cached = (flags & (_core.REQ_CACHED | _core.REQ_FILL)) != 0
    out["requests"] = int(np.count_nonzero(length > 0))
    # hits: requests of files the cache held when the epoch began (a filled file's requests
    # are served by its new copy, but they missed) that their copy served
    planned = int(np.count_nonzero(((flags & _core.REQ_HIT) != 0) & (length > 0)))
    out["hits"] = planned - out["cache_hit_fallbacks"]
    fell_back = out["cache_fallback_bytes"]
    out["bytes_from_cache"] = int(length[cached].sum()) - fell_back
    out["bytes_from_pfs"] = int(length[~cached].sum()) + out["cache_fill_bytes"] + fell_back
    return out


def room_warning(figures: list[dict], folder: str, phase: str, epoch: int) -> str | None:
    """The line rank 0 prints after an epoch in which fills ran out of room on any rank
    (`figures`: the ranks' epoch_cache), None if none did."""
    failed = sum(f.get("cache_fill_failures", 0) for f in figures if f)
    if not failed:
        return None
    return (f"warning: reader.cache: {failed} fill(s) of {phase} epoch {epoch} ran out of room "
            f"in {folder} (ENOSPC or EDQUOT: the file system is fuller than capacity_bytes "
            "allowed for, or rounds files up to its blocks); their files were read from the "
            "data folder instead, as their planned hits will be; a smaller "
            "reader.cache.capacity_bytes avoids it")
