"""HDF5 files as DLIO writes them (dataset.format: hdf5), through h5py.

DLIO's layout (its hdf5 generator and reader after 2.0.0, which added dataset.hdf5.*; 2.0.0
itself writes one dataset named `records`, which probe() reads too): a file holds
`num_dset_per_record` (k) datasets records_0 .. records_<k-1>, each of shape (samples, *dims)
in the record element type, all holding the same bytes, and `labels`, one int64 zero per
sample. With dataset.record_dims, dims are the record's with the first divided by k, dropped
when that leaves 1; the square dims drawn from record_length_bytes are kept as they are. The
reader takes sample i as records_j[i] for every j. Chunks (dataset.hdf5.chunk_dims, else
h5py's own guess when compression or a max shape needs chunks), gzip at
dataset.compression_level or lzf, and the max shape (samples, *dataset.hdf5.max_shape) go to
h5py as DLIO passes them; files are created with libver='latest', as DLIO creates them.

Where every byte goes is decided before any I/O: layout() is arithmetic (h5py is only asked,
in memory, for the chunk shape it would guess when chunks are needed and none are given):
- HDF5 reserves a metadata block [0, M) when it creates the file (meta_block_size) and puts
  every later allocation at the end of the file, in order, as long as the metadata fits in
  that block. M is sized from the file's datasets and chunk index entries (2048, HDF5's
  default and what DLIO's one-dataset files have, when that holds them).
- Contiguous datasets are allocated when created (H5D_ALLOC_TIME_EARLY, never filled):
  records_j's P bytes at M + j*P, then the labels; the payload is then written at those
  offsets by the C core. Sample i of records_0 is the extent [M + i*b, M + (i+1)*b).
- Chunked datasets are allocated chunk by chunk as written: the labels first, at M, then
  every chunk, in C order of the chunk grid (records_0 .. records_<k-1> of one chunk after
  the other), by H5Dwrite_chunk, each S bytes: the chunk as is uncompressed; with lzf stored
  as is with the filter marked skipped, as h5py's lzf filter stores a chunk it cannot shrink
  (random bytes never shrink); with gzip a zlib stream of stored deflate blocks of 16384
  bytes: how zlib frames incompressible input at any level (its size within a few bytes per
  MiB of zlib's, whose rare short matches merge blocks), inflated as any gzip chunk is.
write() compares what h5py reports (dataset offsets, every chunk's offset and size) and the
file's size with layout() and refuses a file that differs.

The C engine reads contiguous records_0 samples, and chunked ones when a chunk is exactly one
sample (then chunk i is sample i), at their file offsets. Other files (chunks of other shapes,
compression, a max shape, num_dset_per_record > 1) are read through h5py as DLIO's HDF5Reader
reads them (readers/h5py_reader.py); library_read_reason says which property of the file
needs it."""

from __future__ import annotations

import itertools
import math
import os
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _core
from ..errors import ConfigError
from ..storage import Handle
from ..storage.ownership import temporary_name
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray, opened

LABEL_BYTES = 8             # DLIO's labels: [0] * samples, which h5py stores as int64
META_BLOCK = 2048           # HDF5's default meta_block_size
GZIP_BLOCK = 16384          # zlib's stored blocks on incompressible input (memLevel 8)
MAX_CHUNK_BYTES = 2**32 - 1  # HDF5's limit on one chunk
MAX_SLAB_BYTES = 1 << 30    # samples of one row of chunks, made at once when writing
SLAB_BYTES = 8 << 20        # samples made at once when their rows of chunks are smaller
COMPRESSIONS = ("none", "gzip", "lzf")


@dataclass(frozen=True)
class Hdf5Options:
    """dataset.hdf5.* and dataset.compression as they shape a file. `split_dims`: the dims
    come from dataset.record_dims, which DLIO splits over the datasets."""

    datasets: int = 1
    chunk_dims: tuple[int, ...] = ()
    max_shape: tuple[int, ...] = ()
    compression: str = "none"
    level: int = 4
    split_dims: bool = False

    @property
    def chunked(self) -> bool:
        return bool(self.chunk_dims or self.max_shape or self.compression != "none")

    def dataset_dims(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """One sample's dims in each records_j, as DLIO shapes them."""
        if not self.split_dims:
            return dims
        first = dims[0] // self.datasets
        return dims[1:] if first == 1 else (first, *dims[1:])


@dataclass(frozen=True)
class Geometry:
    """Where one file's bytes go (see the module's docstring)."""

    shape: tuple[int, ...]          # each records_j: (samples, *dims)
    dtype: str
    datasets: int
    chunks: tuple[int, ...] | None  # None: contiguous
    stored_chunk: int               # S: bytes of one stored chunk
    nchunks: int                    # chunks written per dataset
    meta_block: int                 # M

    @property
    def samples(self) -> int:
        return self.shape[0]

    @property
    def dataset_bytes(self) -> int:
        """P: one records_j's bytes."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def labels_offset(self) -> int:
        if self.chunks is None:
            return self.meta_block + self.datasets * self.dataset_bytes
        return self.meta_block

    @property
    def data_offset(self) -> int:
        """The first byte of records_0 (contiguous) or of its first chunk."""
        if self.chunks is None:
            return self.meta_block
        return self.meta_block + LABEL_BYTES * self.samples

    def dataset_offset(self, j: int) -> int:
        """Where contiguous records_j starts."""
        return self.meta_block + j * self.dataset_bytes

    def chunk_offset(self, j: int, index: int) -> int:
        """Where chunk `index` (C order of the chunk grid) of records_j starts."""
        return self.data_offset + (index * self.datasets + j) * self.stored_chunk

    @property
    def size(self) -> int:
        if self.chunks is None:
            return self.labels_offset + LABEL_BYTES * self.samples
        return self.data_offset + self.datasets * self.nchunks * self.stored_chunk


def zlib_stored_size(nbytes: int) -> int:
    """Bytes of a zlib stream of stored deflate blocks holding `nbytes`."""
    return nbytes + 6 + 5 * max(1, -(-nbytes // GZIP_BLOCK))


def zlib_stored(data, level: int) -> bytes:
    """`data` as a zlib stream (RFC 1950) of stored deflate blocks (RFC 1951) of GZIP_BLOCK
    bytes, the header's level field set as zlib sets it for `level`."""
    view = memoryview(data).cast("B")
    flevel = 0 if level < 2 else 1 if level < 6 else 2 if level == 6 else 3
    header = 0x7800 | flevel << 6
    header += 31 - header % 31
    out = bytearray(struct.pack(">H", header))
    n = len(view)
    for start in range(0, max(n, 1), GZIP_BLOCK):
        block = view[start:start + GZIP_BLOCK]
        final = 1 if start + GZIP_BLOCK >= n else 0
        out += struct.pack("<BHH", final, len(block), len(block) ^ 0xFFFF)
        out += block
    out += struct.pack(">I", zlib.adler32(view))
    return bytes(out)


def _meta_block(datasets: int, ndim: int, index_entries: int, filtered: bool) -> int:
    """M: a metadata block that holds the superblock, the root group (dense past 8 links),
    the object headers and the chunk indexes (fixed arrays: 8 bytes an entry, 20 filtered),
    with room to spare; measured needs are about half of it."""
    need = (1024 + datasets * (512 + 16 * ndim) + (4096 if datasets + 1 > 8 else 0)
            + datasets * index_entries * (24 if filtered else 12))
    return META_BLOCK if need <= META_BLOCK else -(-need // 4096) * 4096


@lru_cache(maxsize=256)
def _guess_chunks(shape: tuple[int, ...], maxshape: tuple[int, ...], dtype: str,
                  compression: str) -> tuple[int, ...]:
    """The chunk shape h5py picks when none is given, read off a dataset created in memory
    (no storage is allocated, nothing is written anywhere)."""
    import h5py

    with h5py.File(f"chunk-guess-{os.getpid()}", "w", driver="core", backing_store=False,
                   libver="latest") as f:
        dset = f.create_dataset("d", shape, dtype=np.dtype(dtype), maxshape=maxshape,
                                **_filter_kwargs(compression, 4))
        return tuple(dset.chunks)


def _filter_kwargs(compression: str, level: int) -> dict:
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": level}
    if compression == "lzf":
        return {"compression": "lzf"}
    return {}


@lru_cache(maxsize=4096)
def geometry(spec: SampleSpec, options: Hdf5Options) -> Geometry:
    """The geometry of the file `spec` describes; ConfigError for chunks or a max shape the
    datasets cannot have."""
    dims = options.dataset_dims(tuple(spec.shape))
    shape = (spec.samples, *dims)
    itemsize = spec.itemsize
    if not options.chunked:
        return Geometry(shape, spec.dtype, options.datasets, None, 0, 0,
                        _meta_block(options.datasets, len(shape), 0, False))
    maxshape = shape
    if options.max_shape:
        if len(options.max_shape) != len(dims) or any(
                m < d for m, d in zip(options.max_shape, dims)):
            raise ConfigError(f"dataset.hdf5.max_shape: {list(options.max_shape)} does not fit "
                              f"the datasets' sample dims {list(dims)}; expected {len(dims)} "
                              "dims, each at least the sample's")
        maxshape = (spec.samples, *options.max_shape)
    if options.chunk_dims:
        chunks = tuple(options.chunk_dims)
        if len(chunks) != len(shape) or any(c > m for c, m in zip(chunks, maxshape)):
            raise ConfigError(f"dataset.hdf5.chunk_dims: {list(chunks)} does not fit the "
                              f"datasets records_<j> of shape {list(shape)} (max shape "
                              f"{list(maxshape)}); expected {len(shape)} dims, each at most "
                              "the max shape's")
    else:
        chunks = _guess_chunks(shape, maxshape, spec.dtype, options.compression)
    chunk_bytes = math.prod(chunks) * itemsize
    if chunk_bytes > MAX_CHUNK_BYTES:
        raise ConfigError(f"dataset.hdf5.chunk_dims: {list(chunks)} makes chunks of "
                          f"{chunk_bytes} bytes; HDF5 takes chunks below 4 GiB")
    slab = chunks[0] * math.prod(dims) * itemsize
    if slab > MAX_SLAB_BYTES:
        raise ConfigError(f"dataset.hdf5.chunk_dims: {list(chunks)}: a row of chunks holds "
                          f"{slab} bytes of samples; more than {MAX_SLAB_BYTES} is not "
                          "implemented yet in dlio-mpi; accepted: a smaller first dim")
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    index = math.prod(-(-m // c) for m, c in zip(maxshape, chunks))
    stored = zlib_stored_size(chunk_bytes) if options.compression == "gzip" else chunk_bytes
    filtered = options.compression != "none"
    return Geometry(shape, spec.dtype, options.datasets, chunks, stored, math.prod(grid),
                    _meta_block(options.datasets, len(shape), index, filtered))


def _chunk_payloads(geo: Geometry, seed: int):
    """(chunk coordinates, chunk array) in C order of the chunk grid. The dataset's elements
    are the seed's payload stream in C order (the bytes a contiguous records_j holds); edge
    chunks are padded with zeros."""
    shape, chunks, dtype = geo.shape, geo.chunks, np.dtype(geo.dtype)
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    padded = np.zeros(chunks, dtype=dtype)
    rest = [range(0, s, c) for s, c in zip(shape[1:], chunks[1:])]
    # rows of chunks made together, a few MiB at once (the stream is made in whole blocks)
    step = chunks[0] * max(1, SLAB_BYTES // max(1, chunks[0] * row_bytes))
    for start in range(0, shape[0], step):
        slab = np.empty((min(step, shape[0] - start), *shape[1:]), dtype=dtype)
        _core.fill_random(slab, seed, start * row_bytes)
        for first, *corner in itertools.product(range(0, len(slab), chunks[0]), *rest):
            part = slab[(slice(first, first + chunks[0]),
                         *(slice(o, o + c) for o, c in zip(corner, chunks[1:])))]
            if part.shape == chunks:
                yield (start + first, *corner), np.ascontiguousarray(part)
            else:
                padded.fill(0)
                padded[tuple(slice(0, n) for n in part.shape)] = part
                yield (start + first, *corner), padded


class Hdf5Format(Format):
    """dataset.format: hdf5"""

    name = "hdf5"
    codecs = COMPRESSIONS
    library = "h5py"
    dlio_reads_samples = True
    written_whole = "h5py writes each file, the labels and chunks after the payload"
    extension = "hdf5"

    def __init__(self, options: Hdf5Options = Hdf5Options()) -> None:
        self.options = options

    def manifest_params(self, ds) -> dict:
        return {"hdf5": {"num_dset_per_record": ds.hdf5.num_dset_per_record,
                         "chunk_dims": list(ds.hdf5.chunk_dims),
                         "max_shape": list(ds.hdf5.max_shape),
                         "compression": ds.compression,
                         "compression_level": ds.compression_level}}

    def configure(self, dataset) -> Hdf5Format:
        """This format for the `dataset` section (dataset.hdf5.*, dataset.compression);
        ConfigError for what DLIO's generator cannot do or dlio-mpi does not do yet."""
        h5 = dataset.hdf5
        options = Hdf5Options(h5.num_dset_per_record, tuple(h5.chunk_dims), tuple(h5.max_shape),
                              dataset.compression, dataset.compression_level,
                              bool(dataset.record_dims))
        if options.compression not in COMPRESSIONS:
            raise ConfigError(f"dataset.compression: {options.compression!r} is not implemented "
                              f"yet in dlio-mpi for hdf5; accepted: {', '.join(COMPRESSIONS)}")
        if dataset.sample_layout != "first_axis":
            raise ConfigError(f"dataset.sample_layout: {dataset.sample_layout!r} does not apply "
                              "to hdf5, whose datasets hold samples on the first axis as DLIO's "
                              "do; accepted: first_axis")
        if options.datasets > 1 and not dataset.record_dims:
            raise ConfigError(f"dataset.hdf5.num_dset_per_record: {options.datasets} needs "
                              "dataset.record_dims (DLIO splits the record's first dim over the "
                              "datasets); accepted without record_dims: 1")
        if options.chunked and dataset.record_length_bytes_stdev > 0:
            key = ("dataset.hdf5.chunk_dims" if options.chunk_dims else "dataset.hdf5.max_shape"
                   if options.max_shape else "dataset.compression")
            raise ConfigError(f"{key}: chunked hdf5 files of varying sample sizes "
                              f"(dataset.record_length_bytes_stdev="
                              f"{dataset.record_length_bytes_stdev:g}) are not implemented yet "
                              "in dlio-mpi; accepted with chunks: record_length_bytes_stdev 0")
        return Hdf5Format(options)

    def load_whole(self, path: str) -> Rows:
        """The file opened as DLIO's HDF5Reader opens it, its records_<k> read row by row when
        indexed (close() it)."""
        return Rows(path, self.options.datasets)

    def release(self, loaded: Rows) -> None:
        loaded.close()

    def library_read_reason(self, spec: SampleSpec) -> str:
        """Why the C engine cannot read these files' samples at their file offsets, so that
        h5py reads them ('' when it can): the property of the file that needs it."""
        opt = self.options
        if opt.datasets > 1:
            return (f"each sample is split over {opt.datasets} datasets "
                    f"(dataset.hdf5.num_dset_per_record {opt.datasets})")
        if opt.compression != "none":
            return (f"the datasets are compressed (dataset.compression {opt.compression}), "
                    "in chunks")
        geo = geometry(spec, opt)
        if opt.max_shape:
            return (f"the datasets are resizable (dataset.hdf5.max_shape "
                    f"{list(opt.max_shape)}), stored in chunks of {list(geo.chunks)}")
        one_sample = (1, *geo.shape[1:])
        if geo.chunks is not None and geo.chunks != one_sample:
            return (f"the datasets are stored in chunks of {list(geo.chunks)} "
                    f"(dataset.hdf5.chunk_dims), not of one sample {list(one_sample)}")
        return ""

    def layout(self, spec: SampleSpec) -> FileLayout:
        """The file's byte layout, computed (no I/O). Samples are records_0's, on the first
        axis; with several datasets or chunks other than one sample the sample extents are
        records_0's as if it were contiguous (such files are read through h5py:
        library_read_reason)."""
        geo = geometry(spec, self.options)
        return FileLayout(geo.size, geo.data_offset, spec.sample_bytes, spec.sample_bytes,
                          spec.sample_bytes)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        geo = geometry(spec, self.options)
        tmp = temporary_name(path, staged.tag)
        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            if not fs.same_file(handle, tmp):  # h5py is given the path: still ours?
                raise RuntimeError(f"{tmp} is not the temporary dlio-mpi created")
            found = self._write_hdf5(tmp, geo, seed)
            if geo.chunks is None:
                for j in range(geo.datasets):  # DLIO writes the same records to each
                    fs.write_random(handle, geo.dataset_offset(j), geo.dataset_bytes, seed,
                                    chunk=0, path=path)
            found["size"] = fs.handle_size(handle)
            _check_placement(path, geo, found)

        return staged.write(path, fill)

    def _write_hdf5(self, tmp: str, geo: Geometry, seed: int) -> dict:
        """Create the file at `tmp` with h5py (contiguous payloads are left to the caller);
        return where HDF5 put things."""
        import h5py

        opt = self.options
        dtype = np.dtype(geo.dtype)
        found: dict = {"records": [], "chunks": []}
        with h5py.File(tmp, "w", libver="latest", meta_block_size=geo.meta_block,
                       locking=False) as f:
            dsets = []
            for j in range(geo.datasets):
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
                kwargs = {}
                if geo.chunks is None:
                    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
                else:
                    kwargs = dict(chunks=geo.chunks, **_filter_kwargs(opt.compression,
                                                                      opt.level))
                    if opt.max_shape:
                        kwargs["maxshape"] = (geo.samples, *opt.max_shape)
                dsets.append(f.create_dataset(f"records_{j}", geo.shape, dtype=dtype,
                                              dcpl=dcpl, **kwargs))
            labels = f.create_dataset("labels", data=np.zeros(geo.samples, dtype=np.int64))
            found["labels"] = labels.id.get_offset()
            if geo.chunks is None:
                found["records"] = [d.id.get_offset() for d in dsets]
                return found
            mask = 1 if opt.compression == "lzf" else 0  # lzf: the filter skipped, as h5py
            for corner, chunk in _chunk_payloads(geo, seed):
                data = zlib_stored(chunk, opt.level) if opt.compression == "gzip" else chunk
                for dset in dsets:
                    dset.id.write_direct_chunk(corner, data, mask)
            found["chunks"] = [_stored_chunks(dset, geo) for dset in dsets]
        return found

    def probe(self, path: str) -> StoredArray:
        """records_0 (or DLIO 2.0.0's `records`) of a file another tool wrote: contiguous and
        uncompressed, else ValueError saying why it is not read natively; any layout when
        this configuration's files are read through h5py (library_read_reason), then with
        num_dset_per_record datasets (the stored array: (samples, k, *row) of them all)."""
        import h5py

        with opened(path) as (fs, handle):
            size = fs.handle_size(handle)
        try:
            f = h5py.File(path, "r", locking=False)
        except OSError as exc:
            raise ValueError(f"is not an HDF5 file h5py can open ({exc})") from None
        with f:
            name = "records_0" if "records_0" in f else "records"
            dset = f.get(name)
            if not isinstance(dset, h5py.Dataset):
                raise ValueError("has no dataset records_0 (nor DLIO 2.0.0's records)")
            count = sum(1 for key in f if key.startswith("records_"))
            if self._read_by_h5py(dset):
                if count != self.options.datasets:
                    raise ValueError(f"holds {count} record datasets, but "
                                     "dataset.hdf5.num_dset_per_record is "
                                     f"{self.options.datasets}; expected the files' count")
                shape = tuple(int(d) for d in dset.shape)
                if count > 1:
                    shape = (shape[0], count, *shape[1:])
                return StoredArray(size, int(dset.id.get_offset() or 0), shape,
                                   dset.dtype.str)
            if count > 1:
                raise ValueError(f"holds {count} record datasets (DLIO's num_dset_per_record): "
                                 "samples split over several datasets are read through h5py "
                                 f"with dataset.hdf5.num_dset_per_record: {count}")
            dcpl = dset.id.get_create_plist()
            if dset.compression or dcpl.get_nfilters():
                raise ValueError(f"has {name} compressed ({dset.compression or 'filters'}), "
                                 "which is not read natively yet (h5py reads it with "
                                 "dataset.compression set as the files have it)")
            if dcpl.get_layout() != h5py.h5d.CONTIGUOUS or dcpl.get_external_count():
                kind = "in chunks" if dset.chunks else "not contiguous in the file"
                raise ValueError(f"stores {name} {kind}, which is not read natively yet (h5py "
                                 "reads it with dataset.hdf5.chunk_dims set as the files "
                                 "have it)")
            if dset.dtype.kind not in "biufc":
                raise ValueError(f"has {name} of type {dset.dtype}, not numbers")
            offset = dset.id.get_offset()
            if offset is None:
                raise ValueError(f"has no bytes of {name} written")
            return StoredArray(size, int(offset), tuple(int(d) for d in dset.shape),
                               dset.dtype.str)

    def _read_by_h5py(self, dset) -> bool:
        """Whether this configuration has files like `dset`'s read through h5py."""
        spec = SampleSpec(tuple(int(d) for d in dset.shape[1:]), dset.dtype.str,
                          int(dset.shape[0]))
        try:
            return bool(self.library_read_reason(spec))
        except ConfigError:  # chunks the file's dims cannot have: the configuration's
            return True


class Rows:
    """One file opened as DLIO's HDF5Reader opens it, h5py.File(path, 'r'); rows[i] is
    sample i read as it reads it, row i of each of records_0 .. records_<datasets-1> (HDF5
    reads the chunks holding the row, through its chunk cache), their bytes one after the
    other. Closed by close() or `with`."""

    def __init__(self, path: str, datasets: int = 1) -> None:
        import h5py

        self.file = h5py.File(path, "r")
        try:
            self.dsets = [self.file[f"records_{j}"] for j in range(datasets)]
        except KeyError:
            self.file.close()
            raise ValueError(f"{path} has no datasets records_0 .. records_{datasets - 1} "
                             "(DLIO's layout for dataset.hdf5.num_dset_per_record "
                             f"{datasets})") from None

    def __getitem__(self, index: int) -> np.ndarray:
        rows = [dset[index] for dset in self.dsets]
        if len(rows) == 1:
            return rows[0]
        return np.concatenate([row.reshape(-1).view(np.uint8) for row in rows])

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Rows:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stored_chunks(dset, geo: Geometry) -> np.ndarray:
    """(byte offset, size) of each stored chunk of `dset`, by index in C order of the chunk
    grid (rows of -1 for chunks not stored), from one walk over the chunk index."""
    grid = [-(-s // c) for s, c in zip(geo.shape, geo.chunks)]
    out = np.full((math.prod(grid), 2), -1, dtype=np.int64)

    def visit(info) -> None:
        corner = [o // c for o, c in zip(info.chunk_offset, geo.chunks)]
        out[np.ravel_multi_index(corner, grid)] = (info.byte_offset, info.size)

    dset.id.chunk_iter(visit)
    return out


def _check_placement(path: str, geo: Geometry, found: dict) -> None:
    """Refuse a file HDF5 laid out otherwise than `geo` says (RuntimeError)."""
    want: dict = {"size": geo.size, "labels": geo.labels_offset}
    if geo.chunks is None:
        want["records"] = [geo.dataset_offset(j) for j in range(geo.datasets)]
    else:
        index = np.arange(geo.nchunks, dtype=np.int64)
        want["chunks"] = [np.stack([geo.chunk_offset(j, index),
                                    np.full(geo.nchunks, geo.stored_chunk)], axis=1).tolist()
                          for j in range(geo.datasets)]
        found["chunks"] = [chunks.tolist() for chunks in found["chunks"]]
    for key, value in want.items():
        if found[key] != value:
            import h5py

            raise RuntimeError(
                f"{path}: HDF5 {h5py.version.hdf5_version} did not lay the file out as "
                f"dlio-mpi computed ({key}: {_short(found[key])}, expected {_short(value)}); "
                "the file is not kept, since its samples could not be read where planned")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 120 else text[:117] + "..."
