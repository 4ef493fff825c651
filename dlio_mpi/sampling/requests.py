"""Turns a rank's shard of sample ids into batches of read requests (file, offset, length,
flags) that the C engine executes without Python.

What is read (reader.read_mode):
- sample:    the exact extent of each sample (what a careful loader reads); for formats whose
             samples sit in read units at ragged offsets (parquet's row groups: the layout
             table's units()) the unit holding the sample, once per epoch when its first
             planned sample comes (its other samples come from memory), after the loader's
             footer reads when the file is first opened in the epoch (reader.access loader);
- file:      the whole file for every sample, like np.load in DLIO's on_demand mode;
- file_once: the whole file the first time one of its samples is needed in the epoch, later
             samples of that file come from memory (DLIO's memory mode).
How files are opened (reader.access):
- loader: as the real loader does it. A whole-file load, and any read of a file holding one
          sample, is an access of its own: open, probe and read with the system calls of the
          format's loader (np.load's for npy/npz; DLIO's O_DIRECT readers: one aligned read),
          close. Files holding many samples read by extent are opened once per reader thread
          and epoch and closed when the epoch ends.
- lean:   descriptors cached across epochs and one read per request, no probing (the "file
          handle caching" optimisation of large training runs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _core
from ..data.dataset import Layouts, LayoutTable
from ..formats.base import UnitExtents
from ..formats.loader import WholeFileReads
from ..storage import storage_for

READ_MODES = ("sample", "file", "file_once")


def one_read_per_file(lay: Layouts) -> WholeFileReads:
    """A single read of each whole file (DLIO's O_DIRECT readers; formats without a model)."""
    n = len(lay.size)
    size = lay.size.astype(np.int64)
    return WholeFileReads(np.arange(n + 1, dtype=np.int64), np.zeros(n, dtype=np.int64), size,
                          size, np.zeros(n, dtype=np.int64))


@dataclass(frozen=True)
class AccessPolicy:
    """How the planner lays out accesses: reader.access, and the loader's read model."""

    access: str = "lean"
    odirect: bool = False
    blksize: int = 4096  # st_blksize of the data: buffered loaders read in units of it
    format_reads: object = None  # fmt.loader_reads(layouts, blksize) or None
    mmap: bool = False  # the format's reader maps the file: every request is an mmap read
    reads_nothing: bool = False  # synthetic data: batches without any request

    def whole_file(self, lay: Layouts) -> WholeFileReads:
        if self.odirect or self.format_reads is None:
            return one_read_per_file(lay)
        return self.format_reads(lay, self.blksize)


@dataclass(frozen=True)
class EpochRequests:
    """What the C engine takes of an epoch's plan (_core.Engine.start_epoch and reserve):
    batch b is requests [batch_start[b], batch_start[b+1]) of (file_idx, offset, length),
    with their flags, expected bytes, preprocessing and the cache tier's evictions where
    given. A ReadPlan has these fields and more."""

    batch_start: np.ndarray
    file_idx: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    flags: np.ndarray | None = None
    expect: np.ndarray | None = None
    delay_ns: np.ndarray | None = None
    cpu_ns: np.ndarray | None = None
    evict_at: np.ndarray | None = None
    evict_file: np.ndarray | None = None


@dataclass(frozen=True)
class ReadPlan:
    """One epoch of one rank: batch b issues requests [batch_start[b], batch_start[b+1])."""

    sample_ids: np.ndarray     # ids consumed, in order (steps * batch_size)
    batch_start: np.ndarray    # (steps + 1,)
    file_idx: np.ndarray       # (requests,)
    offset: np.ndarray
    length: np.ndarray
    flags: np.ndarray          # uint32 _core.REQ_* per request
    expect: np.ndarray         # bytes each request must bring (< length where it hits EOF)
    batch_payload: np.ndarray  # sample payload bytes each batch delivers (steps,)
    # ns the reader sleeps after each request (the preprocessing of the samples it completes:
    # reader.preprocess_time), or None
    delay_ns: np.ndarray | None = None
    # the same per sample, in sample_ids' order (the framework loaders sleep it per item)
    sample_delay_ns: np.ndarray | None = None
    # CPU time the reader spends after each request (reader.preprocess_cpu_time of the
    # samples it completes, as delay_ns; the native engine's dio_burn_cpu_ns), or None
    cpu_ns: np.ndarray | None = None
    # reader.cache: before request i the cache's copies of evict_file[evict_at[i]:
    # evict_at[i+1]] are removed (tiers/cache.py); None: no evictions
    evict_at: np.ndarray | None = None
    evict_file: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return len(self.batch_start) - 1

    @property
    def bytes_requested(self) -> int:
        return int(self.length.sum())

    @property
    def payload_bytes(self) -> int:
        return int(self.batch_payload.sum())

    def files(self) -> np.ndarray:
        """The distinct files this plan reads."""
        return np.unique(self.file_idx)


def loader_inputs(fmt, path: str) -> tuple[int, object]:
    """What the loader's read model needs from one data file at `path` of format `fmt`: its
    st_blksize (4096 where it cannot be read) and the format's loader facts."""
    try:
        blksize = storage_for(path).block_size(path) or 4096
    except OSError:
        blksize = 4096
    return blksize, fmt.loader_facts(path)


def access_policy(reader_cfg, split, blksize: int, facts) -> AccessPolicy:
    """The AccessPolicy a rank reads `split` with, from the reader section and what
    loader_inputs found in one of its files."""
    rd, fmt = reader_cfg, split.format
    streams = {"transfer_size": rd.transfer_size} if fmt.streams_files \
        else {}
    return AccessPolicy(rd.access, rd.odirect, blksize, fmt.loader_model(
        facts, np.dtype(split.dtype).itemsize, split.samples_per_file, **streams),
        mmap=fmt.reads_by_mmap,
        reads_nothing=fmt.reads_nothing)


def first_uses(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Loads of distinct keys (files, or a file's read units) in first-use order: the index
    of each key's first use, and for every use the load serving it."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    return first[order], position[inverse.reshape(-1)]


def _batches_of(owner_step: np.ndarray, steps: int) -> np.ndarray:
    """batch_start of requests ordered by step, `owner_step` the step of each request."""
    counts = np.bincount(owner_step, minlength=steps)
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _whole_file_accesses(files: np.ndarray, lay: Layouts, policy: AccessPolicy):
    """Requests of whole-file loads of `files` (in order): (owner load index per request,
    offset, length, expect, flags)."""
    if policy.access == "lean":
        n, size = len(files), lay.size.astype(np.int64)
        return (np.arange(n), np.zeros(n, dtype=np.int64), size, size,
                np.zeros(n, dtype=np.uint32))
    model = policy.whole_file(lay)
    counts = np.diff(model.start)
    owner = np.repeat(np.arange(len(files)), counts)
    if model.flags is not None:
        return owner, model.offset, model.length, model.expect, model.flags.astype(np.uint32)
    flags = np.zeros(len(owner), dtype=np.uint32)
    first, last = model.start[:-1], model.start[1:] - 1
    flags[first] |= _core.REQ_OPEN
    flags[last] |= _core.REQ_CLOSE
    for k in range(1, int(model.extra_fstats.max(initial=0)) + 1):  # on the 2nd, 3rd... read
        more = model.extra_fstats >= k
        flags[np.minimum(first[more] + k, last[more])] |= _core.REQ_FSTAT
    return owner, model.offset, model.length, model.expect, flags


def _after_loads(per_sample: np.ndarray | None, load_of: np.ndarray, owner: np.ndarray,
                 completes: np.ndarray, loads: int) -> np.ndarray | None:
    """Per request, a per-sample time spent after the request that completes a load: all of
    the load's samples' time there, 0 elsewhere (`load_of`: each sample's load; `owner`: each
    request's; `completes`: whether it is its load's last). None for None."""
    if per_sample is None:
        return None
    per_load = np.bincount(load_of, weights=per_sample[:len(load_of)],
                           minlength=loads).astype(np.int64)
    return np.where(completes, per_load[owner], 0).astype(np.int64)


def plan_reads(shard: np.ndarray, steps: int, batch_size: int, samples_per_file: int,
               layouts: LayoutTable, mode: str, policy: AccessPolicy = AccessPolicy(),
               sample_delay_ns: np.ndarray | None = None,
               sample_cpu_ns: np.ndarray | None = None) -> ReadPlan:
    """Requests for the first steps*batch_size ids of `shard`. `sample_delay_ns`: each
    sample's preprocessing time, slept after the request that completes it (a load serving
    several samples, with read_mode file_once: after that load, all of theirs);
    `sample_cpu_ns`: its preprocessing CPU time, spent there likewise."""
    ids = np.ascontiguousarray(shard[: steps * batch_size], dtype=np.int64)
    if policy.reads_nothing:
        none, empty = np.zeros(steps + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return ReadPlan(ids, none, empty, empty, empty, np.zeros(0, dtype=np.uint32), empty,
                        np.zeros(steps, dtype=np.int64))  # synthetic: refused with delays
    files = ids // samples_per_file
    step_of = np.arange(len(ids), dtype=np.int64) // batch_size
    load_of = np.arange(len(ids), dtype=np.int64)  # the load (or read) serving each sample
    if mode == "file_once":
        first, load_of = first_uses(files)
        files, step_of = files[first], step_of[first]
    elif mode not in ("sample", "file"):
        raise ValueError(f"unknown read mode {mode!r}; expected one of {READ_MODES}")
    elif mode == "sample" and layouts.ragged:
        units = layouts.units()
        if units is None:
            raise ValueError("these files' read units are not known (files laid out otherwise "
                             "than computed): reading them by sample is not implemented yet")
        return _unit_plan(ids, files, step_of, steps, samples_per_file, units, policy,
                          sample_delay_ns, sample_cpu_ns)
    lay = layouts.take(files)
    per_file_payload = _delivered(layouts, lay, files) * samples_per_file
    whole = mode != "sample" or (samples_per_file == 1 and policy.access == "loader")
    if whole:
        owner, offset, length, expect, flags = _whole_file_accesses(files, lay, policy)
        file_idx, req_step = files[owner], step_of[owner]
        payload = per_file_payload if mode != "sample" else lay.sample_bytes
    else:
        index = ids % samples_per_file
        offset = lay.data_offset + index * lay.sample_step
        length, file_idx, req_step = lay.sample_span, files, step_of
        expect = length
        flags = np.zeros(len(ids), dtype=np.uint32)
        payload = lay.sample_bytes
    if policy.mmap:
        flags = flags | _core.REQ_MMAP
    if whole:  # after the last request of each load
        completes = np.r_[owner[1:] != owner[:-1], True] if len(owner) else owner > 0
    else:
        owner, completes = np.arange(len(file_idx)), np.ones(len(file_idx), dtype=bool)
    delay, cpu = (_after_loads(v, load_of, owner, completes, len(files))
                  for v in (sample_delay_ns, sample_cpu_ns))
    batch_payload = np.bincount(step_of, weights=payload, minlength=steps).astype(np.int64)
    return ReadPlan(ids, _batches_of(req_step, steps),
                    np.ascontiguousarray(file_idx, dtype=np.int64),
                    np.ascontiguousarray(offset, dtype=np.int64),
                    np.ascontiguousarray(length, dtype=np.int64),
                    np.ascontiguousarray(flags, dtype=np.uint32),
                    np.ascontiguousarray(expect, dtype=np.int64), batch_payload, delay,
                    None if sample_delay_ns is None else
                    np.ascontiguousarray(sample_delay_ns[:len(ids)], dtype=np.int64), cpu)


def _delivered(layouts, lay, files: np.ndarray) -> np.ndarray:
    """What each sample of `files` delivers when its file is loaded whole: its bytes, or
    where the files have read units that say less (parquet's columns marked read), that."""
    units = layouts.units() if layouts.ragged else None
    return lay.sample_bytes if units is None else units.of(files).sample_bytes


def _unit_plan(ids: np.ndarray, files: np.ndarray, step_of: np.ndarray, steps: int,
               samples_per_file: int, units: UnitExtents, policy: AccessPolicy,
               sample_delay_ns: np.ndarray | None,
               sample_cpu_ns: np.ndarray | None = None) -> ReadPlan:
    """read_mode sample over read units (see the module): one read of each unit the epoch
    needs, in the step of its first planned sample, preceded at the file's first unit by the
    loader's footer reads (the first one fstats again: pyarrow fstats twice when it opens).
    A unit's load delivers all its samples' payload (as file_once's whole-file loads do)."""
    nunits = units.count
    unit = (ids % samples_per_file) // units.per_unit
    first, load_of = first_uses(files * nunits + unit)
    lfile, lunit, lstep = files[first], unit[first], step_of[first]
    mine = units.of(lfile)  # each load's file's extents (shared ones: the same row for all)
    # a unit's reads (parquet: its column chunks), those of 0 bytes none
    part_offset, part_length = mine.pieces()
    parts = (part_length[np.arange(len(first)), lunit] > 0).sum(axis=1)
    opens = np.zeros(len(first), dtype=bool)
    if policy.access == "loader":  # the file's footer reads before its first unit
        opens[np.unique(lfile, return_index=True)[1]] = True
    count = parts + opens * (mine.open_length > 0).sum(axis=1)
    owner = np.repeat(np.arange(len(first)), count)
    start = np.concatenate(([0], np.cumsum(count)))
    within = np.arange(start[-1]) - start[owner]
    part = within - (count[owner] - parts[owner])
    is_unit = part >= 0
    head = np.minimum(within, max(mine.open_offset.shape[1] - 1, 0))
    opened = mine.open_offset.shape[1] > 0
    piece = (owner, lunit[owner], np.maximum(part, 0))
    offset = np.where(is_unit, part_offset[piece],
                      mine.open_offset[owner, head] if opened else 0)
    length = np.where(is_unit, part_length[piece],
                      mine.open_length[owner, head] if opened else 0)
    flags = np.zeros(len(owner), dtype=np.uint32)
    flags[(within == 0) & ~is_unit] = _core.REQ_FSTAT
    if policy.mmap:
        flags |= _core.REQ_MMAP
    # after the unit's last read, all its samples' time
    delay, cpu = (_after_loads(v, load_of, owner, part == parts[owner] - 1, len(first))
                  for v in (sample_delay_ns, sample_cpu_ns))
    payload = units.rows(samples_per_file)[lunit] * mine.sample_bytes
    batch_payload = np.bincount(lstep, weights=payload, minlength=steps).astype(np.int64)
    return ReadPlan(ids, _batches_of(lstep[owner], steps),
                    np.ascontiguousarray(lfile[owner], dtype=np.int64),
                    np.ascontiguousarray(offset, dtype=np.int64),
                    np.ascontiguousarray(length, dtype=np.int64), flags,
                    np.ascontiguousarray(length, dtype=np.int64), batch_payload, delay,
                    None if sample_delay_ns is None else
                    np.ascontiguousarray(sample_delay_ns[:len(ids)], dtype=np.int64), cpu)
