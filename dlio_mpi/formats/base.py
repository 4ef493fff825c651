"""What every format module provides: the shape of a sample, a file's byte layout, and the
small protocol a format implements."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..storage import Handle, Storage, storage_for
from ..storage.ownership import temporary_name


@dataclass(frozen=True)
class SampleSpec:
    """What one file holds: `samples` samples of `shape` elements of `dtype`.

    `layout` is where the sample index sits in array formats: "first_axis" (one sample is one
    contiguous extent, as real datasets store them) or "last_axis" (DLIO's npy/npz layout)."""

    shape: tuple[int, ...]
    dtype: str
    samples: int
    layout: str = "first_axis"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def sample_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def array_shape(self) -> tuple[int, ...]:
        """Shape of the whole per-file array as stored."""
        if self.layout == "last_axis":
            return (*self.shape, self.samples)
        return (self.samples, *self.shape)


@dataclass(frozen=True)
class FileLayout:
    """Where samples sit in one file: sample i occupies
    [data_offset + i*sample_step, data_offset + i*sample_step + sample_span).

    For a first-axis layout step == span == sample_bytes; for a last-axis layout the sample is
    strided, step is one element and span the extent that covers all its elements."""

    size: int          # file size in bytes
    data_offset: int   # byte offset of sample 0
    sample_step: int   # distance between the first bytes of consecutive samples
    sample_span: int   # bytes covering one sample
    sample_bytes: int  # payload bytes of one sample

    @staticmethod
    def for_array(spec: SampleSpec, data_offset: int, size: int) -> FileLayout:
        """Layout of `spec`'s array stored contiguously (C order) from `data_offset`."""
        if spec.layout == "last_axis" and spec.samples > 1:
            elements = math.prod(spec.shape)
            step = spec.itemsize
            span = ((elements - 1) * spec.samples + 1) * spec.itemsize
        else:
            step = span = spec.sample_bytes
        return FileLayout(size, data_offset, step, span, spec.sample_bytes)


@dataclass(frozen=True)
class UnitExtents:
    """The read units of files whose samples do not sit at affine offsets (parquet's row
    groups): unit k holds samples [k*per_unit, (k+1)*per_unit) (the last unit the rest)
    and spans [offset[k], offset[k] + length[k]); a loader opening the file first reads
    (open_offset[j], open_length[j]) (its footer reads).

    Files alike share one set of 1-D arrays. Files laid out each its own way (recorded at
    generation: compressed, or of different sample sizes) have one row per file of the split:
    offset and length (files, units), open_offset and open_length (files, reads; a read of
    length 0 is none, after the real ones), sample_bytes (files,): what a sample delivers
    when its unit is read (parquet: the bytes of the columns read).

    A unit read in several pieces (the selected column chunks of a parquet row group, one
    read each, as pyarrow reads them) has part_offset and part_length: (units, parts) for
    files alike, (files, units, parts) per file; without them a unit is one read."""

    per_unit: int
    sample_bytes: int | np.ndarray
    offset: np.ndarray
    length: np.ndarray
    open_offset: np.ndarray
    open_length: np.ndarray
    part_offset: np.ndarray | None = None
    part_length: np.ndarray | None = None

    def pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """(offset, length) of the reads of each unit, a last axis of parts."""
        if self.part_offset is None:
            return self.offset[..., None], self.length[..., None]
        return self.part_offset, self.part_length

    @property
    def per_file(self) -> bool:
        return self.offset.ndim == 2

    @property
    def count(self) -> int:
        """Units in a file."""
        return self.offset.shape[-1]

    def rows(self, samples: int) -> np.ndarray:
        """Samples in each unit of a file of `samples` samples."""
        first = np.arange(self.count, dtype=np.int64) * self.per_unit
        return np.minimum(self.per_unit, samples - first)

    def of(self, files: np.ndarray) -> UnitExtents:
        """The extents of `files` (file indices), one row each."""
        files = np.asarray(files, dtype=np.int64)
        parted = self.part_offset is not None
        if self.per_file:
            return UnitExtents(self.per_unit, self.sample_bytes[files], self.offset[files],
                               self.length[files], self.open_offset[files],
                               self.open_length[files],
                               *((self.part_offset[files], self.part_length[files]) if parted
                                 else ()))
        n = len(files)
        return UnitExtents(self.per_unit, np.full(n, self.sample_bytes, dtype=np.int64),
                           *(np.broadcast_to(a, (n, *a.shape)) for a in
                             (self.offset, self.length, self.open_offset, self.open_length,
                              *((self.part_offset, self.part_length) if parted else ()))))

    def total(self, files: int) -> int:
        """Bytes of every unit and open read of `files` files (all of the split's when per
        file), as exact Python ints."""
        read = int(self.pieces()[1].sum()) + int(self.open_length.sum())
        return read if self.per_file else read * files


@dataclass(frozen=True)
class StoredArray:
    """What a file's header says it holds: an array of `shape` and `dtype` whose bytes start
    at data_offset (indexed formats: (samples, sample_bytes) of uint8)."""

    size: int
    data_offset: int
    shape: tuple[int, ...]
    dtype: str

    def as_samples(self, samples: int, preferred: str) -> SampleSpec:
        """The stored array read as `samples` samples: on the first axis or on the last one,
        whichever holds that many (`preferred` when both do); ValueError when neither does."""
        shape = self.shape
        first = len(shape) > 0 and shape[0] == samples
        last = len(shape) > 0 and shape[-1] == samples
        if first and (not last or preferred == "first_axis"):
            return SampleSpec(tuple(shape[1:]), self.dtype, samples, "first_axis")
        if last:
            return SampleSpec(tuple(shape[:-1]), self.dtype, samples, "last_axis")
        raise ValueError(f"holds an array of shape {shape}, which has no axis of "
                         f"dataset.num_samples_per_file={samples} samples")

    def layout(self, spec: SampleSpec) -> FileLayout:
        return FileLayout.for_array(spec, self.data_offset, self.size)


@dataclass(frozen=True)
class StoredRows(StoredArray):
    """A file of equal rows, one sample each, as (rows, sample bytes) of uint8, `row_step`
    bytes apart (0: back to back): parquet's rows, TFRecord's records (`unit` names them)."""

    row_step: int = 0
    unit: str = "rows"

    def as_samples(self, samples: int, preferred: str) -> SampleSpec:
        if self.shape[0] != samples:
            raise ValueError(f"holds {self.shape[0]} {self.unit} where "
                             f"dataset.num_samples_per_file={samples}")
        return SampleSpec(tuple(self.shape[1:]), self.dtype, samples, "first_axis")

    def layout(self, spec: SampleSpec) -> FileLayout:
        return FileLayout(self.size, self.data_offset, self.row_step or spec.sample_bytes,
                          spec.sample_bytes, spec.sample_bytes)


class Format:
    """One dataset format: the whole contract a format module implements, every hook and
    capability declared here with its default, as fio's ioengine ops table is (a hook left
    None means "not supported"). A format overrides what it does differently; the rest of
    dlio-mpi asks the format, never its name."""

    name: str = ""
    extension: str = ""

    # ---- capabilities
    # why a file cannot be written as a header plus a payload stream in parts (collective
    # generation; payload_extent None); "" when it can
    written_whole: str = ""
    # file sizes depend on the content: generation records them (data/recorded_sizes.py) and
    # reading takes its layouts from them (formats/sized.py)
    sizes_recorded: bool = False
    # the columns of each file's row in that record when it is more than the size (parquet's
    # row groups); None: one size per file
    record_width: int | None = None
    whole_file_only: bool = False    # the native engine reads its files only whole
    whole_file_sample: bool = False  # every sample of a file is all of it (images)
    reads_by_mmap: bool = False      # its loader maps the file and reads samples from memory
    reads_nothing: bool = False      # synthetic data: batches without any read
    streams_files: bool = False      # its loader streams files in reader.transfer_size reads
    # samples found through index side files and read by extent (DLIO's indexed_binary
    # reader), not loaded whole
    indexed: bool = False
    # load_whole returns the whole file's array in memory (hdf5's returns the open file, its
    # rows read when indexed)
    loads_whole_array: bool = False
    codecs: tuple[str, ...] = ("none",)  # the dataset.compression values it writes
    # the module DLIO's reader loads its files with, where numpy's own calls do not
    library: str = ""
    # DLIO's readers read each sample's extent (index files, h5py rows), not whole files:
    # reader.read_mode auto is sample
    dlio_reads_samples: bool = False

    # ---- optional hooks (None: not supported)
    # (sample_bytes int64 array, samples) -> (n, 5) layout columns of many files at once,
    # for formats whose layout is computed from the sample size (dataset.ComputedLayouts)
    layout_columns = None
    # (spec) -> UnitExtents: the read units of files whose samples are not at affine offsets
    unit_extents = None
    # (records of the split's files) -> UnitExtents from what generation recorded
    recorded_units = None

    def configure(self, dataset) -> Format:
        """This format for the `dataset` section (its own keys); ConfigError for values it
        cannot take."""
        return self

    def check_dataset(self, ds) -> None:
        """The format's own limits on the `dataset` section, checked when the configuration
        loads (ConfigError naming the key); configure() checks what needs its options."""
        return None

    def manifest_params(self, ds) -> dict:
        """What, beyond the common generation parameters, makes this format's files differ
        (recorded in the dataset's manifest: a change means regenerating them)."""
        return {}

    def native_read_note(self, cfg, read_mode: str) -> str:
        """How the native engine reads these files where that is the format's own (the plan
        notes it), or '' (the access pattern of DLIO's reader, noted by the plan)."""
        return ""

    def layout(self, spec: SampleSpec) -> FileLayout:
        """Byte layout of a file this format writes for `spec` (no I/O)."""
        raise NotImplementedError

    def learned_layouts(self) -> dict:
        """What layout() learned at a cost so far (parquet's layouts, learned by writing
        probe tables), for rank 0 to hand to the other ranks (adopt_layouts); {} if nothing."""
        return {}

    def adopt_layouts(self, learned: dict) -> None:
        """Take what another rank's learned_layouts() returned, so as not to learn it again."""

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        """Write one file (and its side files) with pseudo-random payload from `seed` through
        `staged`, which completes them on commit; return the data file's size."""
        raise NotImplementedError

    def payload_extent(self, spec: SampleSpec) -> tuple[bytes, int] | None:
        """The data file as a header followed by the first n bytes of the payload stream of
        its seed, (header, n), as `write` writes it, so that ranks can write the payload in
        parts (collectively); None when the file cannot be written so (written_whole says
        why)."""
        return None

    def write_side_files(self, path: str, spec: SampleSpec, staged: StagedWrites) -> None:
        """Write the data file's side files through `staged` (before the data file)."""
        return None

    def side_files(self, path: str) -> list[str]:
        """Other files that belong to the data file at `path` (index files)."""
        return []

    def probe(self, path: str) -> StoredArray:
        """What an existing file holds, read from its header (for data we did not generate);
        ValueError if it cannot be read by extent."""
        raise ValueError(f"{path}: files of format {self.name} cannot be probed")

    def probe_record(self, path: str):
        """What generation records of the file at `path` (sizes_recorded), read from it: its
        size (its first bytes checked) or its row; ValueError when it is not such a file."""
        raise ValueError(f"{path}: format {self.name} records nothing of its files")

    def loader_facts(self, path: str):
        """What the loader's read model needs to know beyond layouts, read from one file of
        the dataset (rank 0, before training), or None."""
        return None

    def loader_model(self, facts, itemsize: int, samples: int):
        """The real loader's reads of whole files (a callable (Layouts, st_blksize) ->
        WholeFileReads), or None for one read per file."""
        return None

    def read_refusal(self, spec: SampleSpec) -> str:
        """Why files like `spec` cannot be read by the native engine yet ('' when they can):
        a run that trains on them is refused before any I/O."""
        return ""

    def library_read_reason(self, spec: SampleSpec) -> str:
        """Why the C engine cannot read files like `spec` at their samples' file offsets, so
        that reader.engine native reads them through the format's library
        (its library's backend in readers.REGISTRY); '' when the C engine reads them."""
        return ""

    def load_whole(self, path: str):
        """The whole file's array, loaded as DLIO's reader of this format loads it, through
        the format's real library (the framework loaders' whole-file reads). Samples are on
        its first or last axis, as the catalog found them (SplitFiles.sample_layout), or the
        array is the sample (whole_file_sample). ValueError where DLIO's reader does not
        load whole files."""
        raise ValueError(f"no whole-file load for format {self.name}")

    def release(self, loaded) -> None:
        """Let go of what load_whole returned once its samples are taken (hdf5: the file
        h5py opened); nothing for an array."""
        return None

    def library_sample(self, array: np.ndarray, within: int, last_axis: bool) -> np.ndarray:
        """Sample `within` of a file load_whole loaded: the whole array where every sample is
        the file (DLIO's image reader returns the image for every sample of its file), else
        the index on the samples' axis."""
        if self.whole_file_sample:
            return array
        return array[..., within] if last_axis else array[within]


class StagedWrites:
    """Files written under temporary names and completed together: commit() flushes them to
    storage with one sync_all (syncfs: one journal commit for many small files, where an
    fsync each costs one per file) and only then renames each to its final name, in the
    order written (a data file's side files before it). Temporaries are created exclusively
    under the job's tag (storage.ownership.temporary_name) and renames never replace a file:
    a crash leaves only tagged temporaries, which the next generation removes, and a final
    name never exposes data that is not on disk. `storage`: the storage of the folder
    written (None: that of the first path written)."""

    def __init__(self, tag: str, storage: Storage | None = None) -> None:
        self.tag = tag
        self.storage = storage
        self.pending: list[tuple[str, str]] = []
        self.bytes = 0
        self.storage_ns = 0  # in the storage's calls made here: open, close, syncfs, rename

    def storage_of(self, path: str) -> Storage:
        """The storage the files are written to (taken from `path` when none was given)."""
        if self.storage is None:
            self.storage = storage_for(path)
        return self.storage

    def timed(self, call, *args):
        """call(*args), its time the storage's (a call to the file system)."""
        from .. import _core

        began = _core.now_ns()
        try:
            return call(*args)
        finally:
            self.storage_ns += _core.now_ns() - began

    def write(self, path: str, fill) -> int:
        """Create `path`'s temporary, let `fill(handle)` write it (a handle of storage_of(path),
        passed back to its operations); return its size."""
        fs = self.storage_of(path)
        tmp = temporary_name(path, self.tag)
        handle = self.timed(fs.create_exclusive, tmp)
        try:
            fill(handle)
            size = fs.handle_size(handle)
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = tmp  # os.write's errors (ENOSPC) name no file: the message will
            fs.close(handle)
            fs.remove_quietly([tmp])
            raise
        self.timed(fs.close, handle)
        self.pending.append((tmp, path))
        self.bytes += size
        return size

    def adopt(self, tmp: str, path: str, size: int) -> None:
        """A temporary of this job created elsewhere (MPI-IO, collectively, with
        MODE_EXCL), to be completed, or removed, with the others."""
        self.pending.append((tmp, path))
        self.bytes += size

    def commit(self) -> None:
        if not self.pending:
            return
        fs = self.storage_of(self.pending[0][0])
        self.timed(fs.sync_all, self.pending[0][0])
        while self.pending:
            tmp, path = self.pending[0]
            self.timed(fs.rename_noreplace, tmp, path)
            self.pending.pop(0)
        self.bytes = 0

    def discard(self) -> None:
        """Remove the temporaries not committed yet (after a failure)."""
        if self.pending:
            self.storage_of(self.pending[0][0]).remove_quietly(tmp for tmp, _ in self.pending)
        self.pending.clear()
        self.bytes = 0


@contextmanager
def opened(path: str) -> Iterator[tuple[Storage, Handle]]:
    """The file at `path` opened for a probe of ours, as the engine opens it (a FIFO or folder
    in its place refused in the engine's words): its storage and handle, closed after."""
    fs = storage_for(path)
    handle = fs.open_as_engine(path)
    try:
        yield fs, handle
    finally:
        fs.close(handle)
