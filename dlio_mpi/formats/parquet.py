"""Parquet files (dataset.format: parquet), written and laid out through pyarrow.

With dataset.parquet.columns (MLPerf Storage's workload files), a file holds those columns,
each of the type MLPerf's DLIO fork gives it (a scalar, or a fixed-size list of `size`
values), one row per sample, written PLAIN without dictionary or statistics, so that, as for
the one column below, where each column chunk lies is computed without I/O (Geometry.parts).
Training reads the chunks of the columns marked read, as pyarrow's read_row_group(g,
columns=...) reads them: chunks closer than HOLE_LIMIT are read as one (_coalesce).

Without columns, a file holds one required column `data` of fixed_size_binary(sample
bytes), one row per sample, in row groups of dataset.parquet.row_group_size rows (the last
group holds the rest), written with PLAIN encoding, no dictionary, no statistics and no
compression. Why fixed_size_binary: Parquet stores it as FIXED_LEN_BYTE_ARRAY, whose PLAIN
values are the bytes themselves, back to back, with no length prefix (binary would put 4
bytes before each) and, the column being required, no definition levels; a list<uint8>
column would store every byte as a 4-byte INT32 value with repetition levels. So a sample
is one contiguous run of its bytes, and the samples of a data page follow each other.

What pyarrow puts where depends, without compression, only on (sample bytes, rows, row group
size) and on pyarrow's version (its footer names it): geometry() writes a zero-filled table
of that geometry through the same writer settings into a sink that only counts bytes, and
reads the row groups' column chunks (offset, size) and the footer's length from what the
writer reports (cached per geometry; no file is touched). write() writes the real file row
group by row group (the payload of group g is bytes [g*G*n, ...) of the file's seed stream,
so sample i holds bytes [i*n, (i+1)*n) of it) and refuses a file whose metadata differs from
the computed geometry. Data pages are cut at about 1 MiB (pyarrow's data_page_size, checked
every write_batch_size rows, which is set so that a batch is about that size: pyarrow's
default 1024 rows would make pages of 1024 samples, over 2 GiB for large samples).

How readers read (strace of pyarrow 26): pq.ParquetFile(path) opens the file, fstats it twice
and reads its tail, min(size, 64 KiB) (FOOTER_READ), then, when the footer (metadata + 8
bytes) is longer, the whole metadata [size - 8 - M, size - 8); read_row_group(g) then reads
group g's column chunk with one pread. pq.read_table(path) opens the file for the footer as
above and closes it, opens it again (two fstats) and reads every column chunk, adjacent
chunks coalesced into reads of at most 32 MiB (Arrow's range_size_limit; a chunk over that
is one read of its own), and closes it.

Compressed files (dataset.compression: pyarrow's snappy, gzip, lz4 or zstd codecs, at their
default levels) have extents that depend on their content, and files of different sample sizes
(dataset.record_length_bytes_stdev) would need a layout computed per file, which costs what
writing it does. Such files are recorded instead (`recorded`): write_recorded() writes the file
and returns its row of the split's record (data/recorded_sizes.py): [size, sample bytes, footer
metadata length, the row groups' offsets, their lengths], read from what the writer reports
and the file's last 8 bytes; recorded_units() turns the record into per-file read units, and
probe_record() reads the same row from a file another tool wrote."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _core
from ..errors import ConfigError
from ..storage import Handle, Storage
from .base import (
    FileLayout,
    Format,
    SampleSpec,
    StagedWrites,
    StoredRows,
    UnitExtents,
    opened,
)
from .loader import WholeFileReads

MAGIC = b"PAR1"
FOOTER_READ = 64 << 10          # what pyarrow reads of a file's tail first
COALESCE_LIMIT = 32 << 20       # Arrow's range_size_limit for read_table's pre-buffering
HOLE_LIMIT = 8 << 10            # Arrow's hole_size_limit: chunks this close are read as one
PAGE_BYTES = 1 << 20            # pyarrow's data_page_size
MAX_GROUP_BYTES = 1 << 30       # one row group is made in memory when written
MAX_SAMPLE_BYTES = 2**31 - 2**20  # fixed_size_binary widths and page sizes are int32
SIMULATE_BYTES = 256 << 20      # zero rows handed to the layout's writer at once
ROW_GROUP_DEFAULT = 1024        # MLPerf's DLIO fork's default row group length (rows)
COMPRESSIONS = ("none", "snappy", "gzip", "lz4", "zstd")  # pyarrow's codec names
HEAD = 3  # record columns before the row groups' offsets: size, sample bytes, metadata
COLUMN = "data"


@dataclass(frozen=True)
class Geometry:
    """Where a file's bytes go: row group g's column chunk is [offset[g], offset[g] +
    length[g]), holding rows [g*group_rows, ...); the footer (metadata, its length, PAR1)
    ends the file."""

    size: int
    group_rows: int
    offset: tuple[int, ...]
    length: tuple[int, ...]
    metadata: int            # M: bytes of the footer's thrift metadata
    # per row group, its column chunks' (offset, length) in the schema's order
    parts: tuple[tuple[tuple[int, int], ...], ...] = ()

    def footer_reads(self) -> list[tuple[int, int]]:
        """(offset, length) of pyarrow's reads of the footer at open."""
        tail = min(self.size, FOOTER_READ)
        reads = [(self.size - tail, tail)]
        if self.metadata + 8 > tail:
            reads.append((self.size - 8 - self.metadata, self.metadata))
        return reads


# A file's columns as (name, dtype, size) (dataset.parquet.columns without the read flags);
# () is dlio-mpi's one fixed_size_binary column `data`.
Columns = tuple


def _writer_options(sample_bytes: int, compression: str = "none", cols: Columns = ()) -> dict:
    """Without a dictionary every value is PLAIN (the one `data` column named so), so where
    pyarrow puts each chunk does not depend on the values."""
    return dict(compression=compression, use_dictionary=False, write_statistics=False,
                **({} if cols else {"column_encoding": {COLUMN: "PLAIN"}}),
                data_page_size=PAGE_BYTES,
                write_batch_size=max(1, min(1024, PAGE_BYTES // max(sample_bytes, 1))))


def _arrow_type(dtype: str, size: int):
    """MLPerf's fork's column type: the scalar, or a fixed-size list of `size` of them."""
    import pyarrow as pa

    scalar = pa.bool_() if dtype == "bool" else pa.from_numpy_dtype(np.dtype(dtype))
    return scalar if size == 1 else pa.list_(scalar, size)


def _schema(sample_bytes: int, cols: Columns = ()):
    import pyarrow as pa

    if cols:  # nullable fields, as the fork's pa.field(name, type)
        return pa.schema([pa.field(name, _arrow_type(dtype, size)) for name, dtype, size in cols])
    return pa.schema([pa.field(COLUMN, pa.binary(sample_bytes), nullable=False)])


def _column_array(raw: np.ndarray, dtype: str, size: int):
    """A column over the bytes `raw` (no copy but bool's, which Arrow packs in bits)."""
    import pyarrow as pa

    values = pa.array((raw & 1).view(np.bool_) if dtype == "bool" else raw.view(dtype))
    return values if size == 1 else pa.FixedSizeListArray.from_arrays(values, size)


def _table(buffer, rows: int, sample_bytes: int, cols: Columns = ()):
    """A table of `rows` rows over `buffer`'s rows*sample_bytes bytes: one column, or each
    column in turn taking its rows' bytes (column-major, as parquet stores them)."""
    import pyarrow as pa

    if cols:
        raw, arrays, start = np.frombuffer(buffer, dtype=np.uint8), [], 0
        for _, dtype, size in cols:
            end = start + rows * size * np.dtype(dtype).itemsize
            arrays.append(_column_array(raw[start:end], dtype, size))
            start = end
        return pa.Table.from_arrays(arrays, schema=_schema(sample_bytes, cols))
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(sample_bytes), rows,
                                                  [None, pa.py_buffer(buffer)])
    return pa.Table.from_arrays([column], schema=_schema(sample_bytes))


class _CountingSink:
    """A writable file that keeps nothing but its length and last bytes, and hands the bytes
    on to `target` when given (the footer's length is in the last 8)."""

    closed = False

    def __init__(self, target=None) -> None:
        self.pos = 0
        self.tail = b""
        self.target = target

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self.target is not None:
            self.target.write(view)
        self.pos += view.nbytes
        self.tail = (self.tail + bytes(view[-8:]))[-8:]
        return view.nbytes

    def tell(self) -> int:
        return self.pos

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    def close(self) -> None:
        self.closed = True


def _chunks(metadata) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes, rows) of every row group, from `metadata`: where its first column
    chunk starts and its chunks' bytes together."""
    offsets, sizes, rows = [], [], []
    for g, parts in enumerate(_parts(metadata)):
        offsets.append(parts[0][0])
        sizes.append(sum(length for _, length in parts))
        rows.append(int(metadata.row_group(g).num_rows))
    return tuple(offsets), tuple(sizes), tuple(rows)


def _parts(metadata) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per row group, its column chunks' (offset, length): from the dictionary page where
    there is one (files of other writers), else the first data page."""
    groups = []
    for g in range(metadata.num_row_groups):
        group, chunks = metadata.row_group(g), []
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
            chunks.append((int(start if start is not None else chunk.data_page_offset),
                           int(chunk.total_compressed_size)))
        groups.append(tuple(chunks))
    return tuple(groups)


def check_geometry(sample_bytes: int, rows: int, group_rows: int) -> None:
    """ConfigError for files pyarrow cannot write or dlio-mpi cannot make in memory."""
    if sample_bytes > MAX_SAMPLE_BYTES:
        raise ConfigError(f"dataset.format: parquet samples of {sample_bytes} bytes are not "
                          f"implemented yet in dlio-mpi (fixed_size_binary widths are int32); "
                          f"accepted: at most {MAX_SAMPLE_BYTES} bytes")
    group_bytes = min(group_rows, rows) * sample_bytes
    if group_bytes > MAX_GROUP_BYTES:
        raise ConfigError(f"dataset.parquet.row_group_size: {group_rows} rows of {sample_bytes}"
                          f" bytes make row groups of {group_bytes} bytes; more than "
                          f"{MAX_GROUP_BYTES} (a group is made in memory) is not implemented "
                          f"yet in dlio-mpi; accepted: at most "
                          f"{max(1, MAX_GROUP_BYTES // sample_bytes)} rows")


# geometry()'s results by its arguments: learning one writes the whole file's bytes through
# pyarrow (3 s for dlrm_b200's files of 4 Mi rows), so rank 0 learns them and hands them on
# (ParquetFormat.learned_layouts)
_GEOMETRIES: dict[tuple, Geometry] = {}


def geometry(sample_bytes: int, rows: int, group_rows: int, cols: Columns = ()) -> Geometry:
    """The layout pyarrow gives a file of `rows` samples of `sample_bytes` (in columns
    `cols`) in groups of `group_rows` (see the module)."""
    key = (sample_bytes, rows, group_rows, cols)
    if key not in _GEOMETRIES:
        if len(_GEOMETRIES) >= 256:  # bounded, as an lru_cache: the oldest goes
            del _GEOMETRIES[next(iter(_GEOMETRIES))]
        _GEOMETRIES[key] = _learn_geometry(*key)
    return _GEOMETRIES[key]


def _learn_geometry(sample_bytes: int, rows: int, group_rows: int, cols: Columns) -> Geometry:
    """geometry(), learned by writing a zero-filled file into a counting sink."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_geometry(sample_bytes, rows, group_rows)
    group_rows = min(group_rows, rows)
    per_call = group_rows * max(1, SIMULATE_BYTES // (group_rows * sample_bytes))
    zeros = np.zeros(min(per_call, rows) * sample_bytes, dtype=np.uint8)
    table = _table(zeros, min(per_call, rows), sample_bytes, cols)
    sink = _CountingSink()
    writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), _schema(sample_bytes, cols),
                              **_writer_options(sample_bytes, "none", cols))
    for start in range(0, rows, per_call):
        writer.write_table(table.slice(0, min(per_call, rows - start)),
                           row_group_size=group_rows)
    writer.close()
    offsets, sizes, counts = _chunks(writer.writer.metadata)
    metadata = int.from_bytes(sink.tail[:4], "little")
    geo = Geometry(sink.pos, group_rows, offsets, sizes, metadata,
                   _parts(writer.writer.metadata))
    expected_counts = [group_rows] * (rows // group_rows) + ([rows % group_rows]
                                                             if rows % group_rows else [])
    if list(counts) != expected_counts or sink.tail[4:] != MAGIC or (
            offsets[-1] + sizes[-1] + metadata + 8 != sink.pos):
        raise RuntimeError(f"pyarrow {pa.__version__} wrote parquet files of "
                           f"{sample_bytes}-byte samples otherwise than dlio-mpi expects "
                           f"(row groups of {list(counts)} rows, {sink.pos} bytes)")
    return geo


@lru_cache(maxsize=64)
def _units(sample_bytes: int, rows: int, group_rows: int, cols: Columns = (),
           read: tuple[int, ...] = ()) -> UnitExtents:
    """Row groups as read units; with columns, each read as pyarrow's read_row_group(g,
    columns=...) reads it: the chunks of the columns `read` (indices), one read each."""
    geo = geometry(sample_bytes, rows, group_rows, cols)
    footer = np.array(geo.footer_reads(), dtype=np.int64).reshape(-1, 2)
    arrays = [np.array(geo.offset, dtype=np.int64), np.array(geo.length, dtype=np.int64),
              footer[:, 0].copy(), footer[:, 1].copy()]
    payload = sample_bytes
    if cols:
        chosen = list(read or range(len(cols)))
        reads = [_coalesce([group[i] for i in chosen]) for group in geo.parts]
        parts = np.zeros((len(reads), max(map(len, reads)), 2), dtype=np.int64)
        for g, group in enumerate(reads):  # groups of fewer reads end in reads of 0 bytes
            parts[g, :len(group)] = group
        arrays += [parts[..., 0].copy(), parts[..., 1].copy()]
        payload = _read_bytes(cols, read)
    for array in arrays:  # cached: shared by every plan
        array.setflags(write=False)
    return UnitExtents(geo.group_rows, payload, *arrays)


@dataclass(frozen=True)
class ParquetOptions:
    """dataset.parquet.* and dataset.compression as they shape a file."""

    row_group_size: int = ROW_GROUP_DEFAULT  # rows a row group holds as written (group_rows)
    compression: str = "none"
    recorded: bool = False  # extents recorded at generation (compressed, or sizes vary)
    samples: int = 1        # dataset.num_samples_per_file (the recorded row groups' count)
    cols: Columns = ()      # dataset.parquet.columns as (name, dtype, size)
    read: tuple[int, ...] = ()  # the columns training reads (indices; () all)

    @property
    def groups(self) -> int:
        return -(-self.samples // max(1, min(self.row_group_size, self.samples)))


class ParquetFormat(Format):
    """dataset.format: parquet"""

    name = "parquet"
    codecs = COMPRESSIONS
    written_whole = "pyarrow writes page headers between the samples and a footer after them"
    extension = "parquet"
    loads_whole_array = True

    def __init__(self, options: ParquetOptions = ParquetOptions()) -> None:
        self.options = options
        # recorded files: generation records each file's row (see the module)
        self.sizes_recorded = options.recorded
        self.record_width = (HEAD + 2 * options.groups * max(len(options.cols), 1)
                             if options.recorded else None)

    def native_read_note(self, cfg, read_mode: str) -> str:
        options = self.configure(cfg.dataset).options
        per_file = cfg.dataset.num_samples_per_file
        rows, cols, read = min(options.row_group_size, per_file), options.cols, options.read
        chunks = (f", each its {len(read or cols)} of {len(cols)} column chunks of the "
                  "columns read (dataset.parquet.columns[*].read), chunks less than 8 KiB "
                  "apart read as one" if cols else "")
        return (f"the native C engine reads parquet by row group "
                f"({rows} rows: {-(-per_file // rows)} in each file of "
                f"{per_file} samples{chunks}), as pq.ParquetFile(path).read_row_group"
                f"{'(g, columns=...)' if cols else ''} does (the file's footer when it is "
                "first opened in the epoch, then each row group holding planned samples once, "
                "its other samples from memory; MLPerf Storage's parquet readers), where "
                "DLIO's parquet reader loads whole files with pq.read_table (reader.read_mode "
                f"file or file_once)")

    def manifest_params(self, ds) -> dict:
        """pyarrow's version is in the footer, whose length it sets."""
        from importlib.metadata import version

        pq_ds = ds.parquet
        return {"parquet": {"row_group_size": pq_ds.row_group_size,
                            "generation_batch_size": pq_ds.generation_batch_size,
                            "columns": [[c.name, c.dtype, c.size] for c in pq_ds.columns],
                            "compression": ds.compression, "pyarrow": version("pyarrow")}}

    def configure(self, dataset) -> ParquetFormat:
        """This format for the `dataset` section (dataset.parquet.row_group_size,
        dataset.compression); ConfigError for what dlio-mpi does not do yet."""
        columns = dataset.parquet.columns
        options = ParquetOptions(_group_rows(dataset), dataset.compression,
                                 dataset.compression != "none"
                                 or dataset.record_length_bytes_stdev > 0,
                                 dataset.num_samples_per_file,
                                 tuple((c.name, c.dtype, c.size) for c in columns),
                                 tuple(i for i, c in enumerate(columns) if c.read))
        if options.compression not in COMPRESSIONS:
            raise ConfigError(f"dataset.compression: {options.compression!r} is not "
                              "implemented yet in dlio-mpi for parquet (pyarrow has no such "
                              f"codec); accepted: {', '.join(COMPRESSIONS)}")
        if dataset.sample_layout != "first_axis":
            raise ConfigError(f"dataset.sample_layout: {dataset.sample_layout!r} does not apply "
                              "to parquet, whose rows are the samples; accepted: first_axis")
        return ParquetFormat(options)

    def _geometry(self, spec: SampleSpec) -> Geometry:
        return geometry(spec.sample_bytes, spec.samples, self.options.row_group_size,
                        self.options.cols)

    def learned_layouts(self) -> dict:
        return dict(_GEOMETRIES)

    def adopt_layouts(self, learned: dict) -> None:
        _GEOMETRIES.update(learned)

    def layout(self, spec: SampleSpec) -> FileLayout:
        """The file's size and where its first row group starts; samples are not at affine
        offsets (page headers sit between them): unit_extents gives the row groups, which
        readers read. Recorded files: the uncompressed file's, an estimate for the plan."""
        geo = self._geometry(spec)
        return FileLayout(geo.size, geo.offset[0], spec.sample_bytes, spec.sample_bytes,
                          spec.sample_bytes)

    def unit_extents(self, spec: SampleSpec) -> UnitExtents:
        """The row groups, the read units of files like `spec`, and pyarrow's footer reads."""
        return _units(spec.sample_bytes, spec.samples, self.options.row_group_size,
                      self.options.cols, self.options.read)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        if self.options.recorded:
            return int(self.write_recorded(path, spec, seed, staged)[0])
        geo = self._geometry(spec)
        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            found = _write_groups(fs, handle, spec, seed, geo.group_rows, cols=self.options.cols)
            found["size"] = fs.handle_size(handle)
            _check_placement(path, geo, found)

        return staged.write(path, fill)

    def write_recorded(self, path: str, spec: SampleSpec, seed: int,
                       staged: StagedWrites) -> np.ndarray:
        """Write the file (recorded files) and return its row of the record (the module)."""
        check_geometry(spec.sample_bytes, spec.samples, self.options.row_group_size)
        row = []
        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            found = _write_groups(fs, handle, spec, seed, self.options.row_group_size,
                                  self.options.compression, self.options.cols)
            size = fs.handle_size(handle)
            try:
                row.extend(self._column_row(found["metadata"], size, found["tail"],
                                            spec.sample_bytes) if self.options.cols else
                           self._record(path, size, spec.sample_bytes, found["rows"],
                                        found["tail"], found["offset"], found["length"]))
            except ValueError as exc:
                import pyarrow as pa

                raise RuntimeError(f"pyarrow {pa.__version__} did not lay the file out as "
                                   f"dlio-mpi reads parquet files: {exc}; the file is not "
                                   "kept") from None

        staged.write(path, fill)
        return np.array(row, dtype=np.int64)

    def _record(self, path: str, size: int, sample_bytes: int, rows, tail: bytes, offsets,
                lengths) -> list[int]:
        """A file's record row, after checking it is laid out as recorded files are (one
        column's chunks back to back, in row groups of row_group_size rows, then the footer);
        ValueError saying why not."""
        metadata = int.from_bytes(tail[:4], "little")
        group = min(self.options.row_group_size, self.options.samples)
        want = [min(group, self.options.samples - g) for g in
                range(0, self.options.samples, group)]
        if list(rows) != want:
            raise ValueError(f"holds row groups of {list(rows)[:8]} rows where dlio-mpi reads "
                             f"row groups of dataset.parquet.row_group_size={group} rows of "
                             f"dataset.num_samples_per_file={self.options.samples}")
        ends = [o + n for o, n in zip(offsets, lengths)]
        if tail[4:] != MAGIC or offsets[0] != len(MAGIC) or list(offsets[1:]) != ends[:-1] \
                or ends[-1] + metadata + 8 != size:
            raise ValueError(f"{path}: its column chunks and footer are not laid out back to "
                             "back (one column 'data', no dictionary page), as dlio-mpi reads "
                             "parquet files by row group")
        return [size, sample_bytes, metadata, *offsets, *lengths]

    def size_columns(self, records: np.ndarray, samples: int) -> np.ndarray:
        """Layout columns of recorded files (their rows): size, first row group, sample bytes
        as step, span and bytes (the samples are read by unit: recorded_units)."""
        n = records[:, 1]
        return np.stack([records[:, 0], records[:, HEAD], n, n, n], axis=1)

    def recorded_units(self, records: np.ndarray) -> UnitExtents:
        """Each recorded file's row groups and footer reads (UnitExtents per file)."""
        size, metadata, groups = records[:, 0], records[:, 2], self.options.groups
        tail = np.minimum(size, FOOTER_READ)
        more = metadata + 8 > tail
        open_offset = np.stack([size - tail, np.where(more, size - 8 - metadata, 0)], axis=1)
        open_length = np.stack([tail, np.where(more, metadata, 0)], axis=1)
        rows = min(self.options.row_group_size, self.options.samples)
        if self.options.cols:
            return self._recorded_column_units(records, rows, open_offset, open_length)
        return UnitExtents(rows, records[:, 1], records[:, HEAD:HEAD + groups],
                           records[:, HEAD + groups:], open_offset, open_length)

    def _recorded_column_units(self, records: np.ndarray, rows: int, open_offset: np.ndarray,
                               open_length: np.ndarray) -> UnitExtents:
        """Files with columns laid out each its own way (another tool's: dictionary pages):
        each row group read as read_row_group(g, columns=...) reads it, from the record's
        column chunks (rows of the record: [size, width, metadata, offsets, lengths], the
        chunks group by group)."""
        cols, groups = self.options.cols, self.options.groups
        chunks = groups * len(cols)
        shape = (len(records), groups, len(cols))
        offsets = records[:, HEAD:HEAD + chunks].reshape(shape)
        lengths = records[:, HEAD + chunks:HEAD + 2 * chunks].reshape(shape)
        chosen = list(self.options.read or range(len(cols)))
        reads = [[_coalesce(list(zip(offsets[f, g, chosen].tolist(),
                                     lengths[f, g, chosen].tolist())))
                  for g in range(groups)] for f in range(len(records))]
        parts = np.zeros((*shape[:2], max(len(r) for file in reads for r in file), 2),
                         dtype=np.int64)
        for f, file in enumerate(reads):
            for g, group in enumerate(file):
                parts[f, g, :len(group)] = group
        payload = np.full(len(records), _read_bytes(cols, self.options.read), dtype=np.int64)
        return UnitExtents(rows, payload, offsets[:, :, 0], lengths.sum(axis=2), open_offset,
                           open_length, parts[..., 0], parts[..., 1])

    def _metadata(self, path: str):
        """(size, pyarrow's metadata, last 8 bytes) of the parquet file at `path`, when it holds
        one fixed_size_binary column `data`; ValueError otherwise."""
        size, meta, tail = _read_footer(path)
        schema = meta.schema
        column = schema.column(0) if meta.num_columns else None
        if (meta.num_columns != 1 or column.name != COLUMN
                or column.physical_type != "FIXED_LEN_BYTE_ARRAY"):
            raise ValueError("does not hold one fixed_size_binary column 'data' (one sample a "
                             "row), the parquet layout dlio-mpi reads natively; reading other "
                             "parquet layouts is not implemented yet")
        if not meta.num_row_groups:
            raise ValueError("holds no row groups")
        return size, meta, tail

    def load_whole(self, path: str) -> np.ndarray:
        """DLIO's parquet reader: pq.read_table, one sample a row (with columns, of the
        columns read alone, as pq.read_table(path, columns=...); a row's values as bytes)."""
        import pyarrow.parquet as pq

        cols = self.options.cols
        if cols:
            names = [cols[i][0] for i in (self.options.read or range(len(cols)))]
            return _row_bytes(pq.read_table(path, columns=names))

        column = pq.read_table(path).column("data").combine_chunks()
        width = column.type.byte_width
        values = np.frombuffer(column.buffers()[1], dtype=np.uint8,
                               count=len(column) * width, offset=column.offset * width)
        return values.reshape(len(column), width)

    def probe_record(self, path: str) -> np.ndarray:
        """The record row (see the module) of a parquet file another tool wrote, read from
        its metadata; ValueError when it is not laid out as dlio-mpi reads them."""
        if self.options.cols:
            return self._column_record(path)
        size, meta, tail = self._metadata(path)
        offsets, lengths, rows = _chunks(meta)
        if sum(rows) != self.options.samples:
            raise ValueError(f"holds {sum(rows)} rows where dataset.num_samples_per_file="
                             f"{self.options.samples}")
        return np.array(self._record(path, size, int(meta.schema.column(0).length), rows,
                                     tail, offsets, lengths), dtype=np.int64)

    def matches(self, row: np.ndarray, units: UnitExtents) -> bool:
        """Whether a file's record row is the computed layout `units` (files alike)."""
        if self.options.cols:
            geo = geometry(int(row[1]), self.options.samples, self.options.row_group_size,
                           self.options.cols)
            parts = np.array(geo.parts, dtype=np.int64).reshape(-1, 2)
            return row[HEAD:].tolist() == [*parts[:, 0].tolist(), *parts[:, 1].tolist()]
        return (row[HEAD:HEAD + units.count].tolist() == units.offset.tolist()
                and row[HEAD + units.count:].tolist() == units.length.tolist())

    def probe(self, path: str) -> StoredRows:
        """A parquet file another tool wrote: one fixed_size_binary column `data` in row groups
        of dataset.parquet.row_group_size rows, its column chunks back to back (uncompressed
        unless dataset.compression says otherwise), else ValueError saying why. Laid out
        otherwise than computed, the catalog reads every file's record (probe_record)."""
        if self.options.cols:
            return self._probe_columns(path)
        if self.options.recorded:
            row = self.probe_record(path)
            return StoredRows(int(row[0]), int(row[HEAD]),
                                 (self.options.samples, int(row[1])), "|u1")
        size, meta, _ = self._metadata(path)
        column = meta.schema.column(0)
        chunk = meta.row_group(0).column(0)
        if chunk.compression != "UNCOMPRESSED":
            raise ValueError(f"is compressed ({chunk.compression}) where dataset.compression is "
                             "none")
        rows, width = int(meta.num_rows), int(column.length)
        want = geometry(width, rows, self.options.row_group_size)
        offsets, sizes, _ = _chunks(meta)
        if (size, offsets, sizes) != (want.size, want.offset, want.length):
            self.probe_record(path)  # ValueError unless its own layout can be read
        return StoredRows(size, offsets[0], (rows, width), "|u1")

    def _columns_metadata(self, path: str):
        """(size, pyarrow's metadata, last 8 bytes, row bytes) of a file that holds the
        columns of dataset.parquet.columns (names, types and sizes, in order); ValueError
        otherwise."""
        cols = self.options.cols
        size, meta, tail = _read_footer(path)
        width = sum(n * np.dtype(dtype).itemsize for _, dtype, n in cols)
        if not meta.schema.to_arrow_schema().equals(_schema(width, cols)):
            raise ValueError("does not hold the columns of dataset.parquet.columns (their "
                             "names, types and sizes, in that order)")
        return size, meta, tail, width

    def _column_record(self, path: str) -> np.ndarray:
        """The record row of a file with columns: [size, row bytes, footer metadata length,
        its column chunks' offsets, their lengths] (group by group); ValueError when its
        rows or row groups are not those configured."""
        size, meta, tail, width = self._columns_metadata(path)
        return np.array(self._column_row(meta, size, tail, width), dtype=np.int64)

    def _column_row(self, meta, size: int, tail: bytes, width: int) -> list[int]:
        """The record row of a file with columns whose metadata, size and last 8 bytes these
        are (see _column_record)."""
        group, rows = min(self.options.row_group_size, self.options.samples), meta.num_rows
        want = [min(group, self.options.samples - g) for g in range(0, self.options.samples,
                                                                     group)]
        got = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if rows != self.options.samples or got != want:
            raise ValueError(f"holds {rows} rows in row groups of {got[:8]} rows where "
                             f"dlio-mpi reads row groups of {group} rows of "
                             f"dataset.num_samples_per_file={self.options.samples}")
        parts = np.array(_parts(meta), dtype=np.int64).reshape(-1, 2)
        return [size, width, int.from_bytes(tail[:4], "little"), *parts[:, 0].tolist(),
                *parts[:, 1].tolist()]

    def _probe_columns(self, path: str) -> StoredRows:
        """A file of dataset.parquet.columns another tool wrote (its layout, if not the
        computed one, read from every file's record: probe_record), else ValueError."""
        row = self._column_record(path)
        return StoredRows(int(row[0]), int(row[HEAD]), (self.options.samples, int(row[1])),
                          "|u1")

    def loader_model(self, facts, itemsize: int, samples: int) -> ReadTables:
        return ReadTables(self.options.row_group_size, samples, self.options.cols,
                          self.options.read)


def _write_groups(fs: Storage, handle: Handle, spec: SampleSpec, seed: int, group_rows: int,
                  compression: str = "none", cols: Columns = ()) -> dict:
    """Write the file through pyarrow onto `handle` (a file object of its own on it), one row
    group at a time; return where its column chunks went."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, rows = spec.sample_bytes, spec.samples
    group_rows = min(group_rows, rows)
    buffer = np.empty(group_rows * n, dtype=np.uint8)
    with fs.file_object(handle, "wb") as raw:
        sink = _CountingSink(raw)
        writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), _schema(n, cols),
                                  **_writer_options(n, compression, cols))
        for start in range(0, rows, group_rows):
            count = min(group_rows, rows - start)
            part = buffer[:count * n]
            _core.fill_random(part, seed, start * n)
            writer.write_table(_table(part, count, n, cols), row_group_size=group_rows)
        writer.close()
        raw.flush()
    offsets, sizes, rows = _chunks(writer.writer.metadata)
    return {"offset": offsets, "length": sizes, "rows": rows, "tail": sink.tail,
            "metadata": writer.writer.metadata}


def _read_bytes(cols: Columns, read: tuple[int, ...]) -> int:
    """What a sample delivers when read: its read columns' values (summary.json's
    train_bytes_read)."""
    return sum(cols[i][2] * np.dtype(cols[i][1]).itemsize for i in read or range(len(cols)))


def _row_bytes(table) -> np.ndarray:
    """A table's rows as uint8 rows: each column's values of the row side by side."""
    import pyarrow as pa

    parts = []
    for column in table.itercolumns():
        chunk = column.combine_chunks()
        values = chunk.flatten() if pa.types.is_fixed_size_list(chunk.type) else chunk
        array = np.ascontiguousarray(values.to_numpy(zero_copy_only=False))
        parts.append(array.reshape(table.num_rows, -1).view(np.uint8))
    return np.hstack(parts)


def _coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The reads Arrow makes of these (offset, length) ranges, in file order: a range
    starting within HOLE_LIMIT bytes of the previous read's end joins it while the read
    stays within COALESCE_LIMIT bytes (its ReadRangeCache, which read_row_group(g,
    columns=...) uses: the hole between is read too)."""
    reads: list[tuple[int, int]] = []
    for offset, length in sorted(ranges):
        if reads and offset - sum(reads[-1]) <= HOLE_LIMIT \
                and offset + length - reads[-1][0] <= COALESCE_LIMIT:
            reads[-1] = (reads[-1][0], offset + length - reads[-1][0])
        else:
            reads.append((offset, length))
    return reads


def _group_rows(dataset) -> int:
    """Rows of each row group as MLPerf's fork writes them: each write_table call of
    generation_batch_size rows (0: row_group_size) starts groups of row_group_size rows;
    ConfigError where the groups would differ in length (a batch not a multiple)."""
    group, rows = dataset.parquet.row_group_size, dataset.num_samples_per_file
    batch = dataset.parquet.generation_batch_size or group
    if batch >= rows or batch % group == 0:
        return group
    if batch < group:
        return batch
    raise ConfigError(f"dataset.parquet.generation_batch_size: {batch} rows a batch cut row "
                      f"groups of {group} rows unevenly ({group} and {batch % group}), which is "
                      f"not implemented yet in dlio-mpi; accepted: at most {group}, a multiple "
                      f"of {group}, or at least {rows} (dataset.num_samples_per_file)")


def _check_placement(path: str, geo: Geometry, found: dict) -> None:
    """Refuse a file pyarrow laid out otherwise than `geo` says (RuntimeError)."""
    want = {"size": geo.size, "offset": geo.offset, "length": geo.length}
    for key, value in want.items():
        if found[key] != value:
            import pyarrow as pa

            text = repr(found[key])
            raise RuntimeError(
                f"{path}: pyarrow {pa.__version__} did not lay the file out as dlio-mpi "
                f"computed ({key}: {text[:100]}, expected {repr(value)[:100]}); the file is "
                "not kept, since its row groups could not be read where planned")


def _load_reads(footer: list[tuple[int, int]], offsets, lengths
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset, length, flags) of pq.read_table's load of a file whose footer reads and column
    chunks these are (see the module)."""
    reads = list(footer)
    first_chunk = len(reads)
    reads += _coalesce(list(zip(offsets, lengths)))
    flags = np.zeros(len(reads), dtype=np.uint32)
    for first, last in ((0, first_chunk - 1), (first_chunk, len(reads) - 1)):
        flags[first] |= _core.REQ_OPEN | _core.REQ_FSTAT
        flags[last] |= _core.REQ_CLOSE
    arr = np.array(reads, dtype=np.int64)
    return arr[:, 0], arr[:, 1], flags


class ReadTables:
    """pq.read_table(path) of whole files (see the module): per file two accesses, the
    footer's and the column chunks' (coalesced), each opened with two fstats. Files alike
    are computed once per sample size; recorded files (Layouts.units per file) each from
    its own row."""

    def __init__(self, group_rows: int, samples: int, cols: Columns = (),
                 read: tuple[int, ...] = ()) -> None:
        self.group_rows, self.samples, self.cols = group_rows, samples, cols
        self.read = list(read or range(len(cols)))  # read_table(path, columns=...)
        self.cache: dict = {}

    def reads_of(self, sample_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offset, length, flags) of one file's load."""
        if sample_bytes not in self.cache:
            geo = geometry(sample_bytes, self.samples, self.group_rows, self.cols)
            chunks = ([group[i] for group in geo.parts for i in self.read] if self.cols
                      else list(zip(geo.offset, geo.length)))
            self.cache[sample_bytes] = _load_reads(geo.footer_reads(), *zip(*chunks))
        return self.cache[sample_bytes]

    def __call__(self, lay, blksize: int) -> WholeFileReads:
        units = lay.units
        if units is not None and units.per_file:
            per = [_load_reads([(o, n) for o, n in zip(units.open_offset[i],
                                                       units.open_length[i]) if n > 0],
                               units.offset[i].tolist(), units.length[i].tolist())
                   for i in range(len(lay.size))]
            inverse = np.arange(len(per))
        else:
            sizes, inverse = np.unique(lay.sample_bytes, return_inverse=True)
            per = [self.reads_of(int(n)) for n in sizes]
            inverse = inverse.reshape(-1)
        counts = np.array([len(p[0]) for p in per], dtype=np.int64)[inverse]
        first = np.concatenate(([0], np.cumsum([len(p[0]) for p in per])))
        start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        take = np.repeat(first[inverse] - start[:-1], counts) + np.arange(start[-1])
        offset, length, flags = (np.concatenate([p[k] for p in per])[take] if per else
                                 np.zeros(0, dtype=np.int64 if k < 2 else np.uint32)
                                 for k in range(3))
        return WholeFileReads(start, offset, length, length,
                              np.zeros(len(counts), dtype=np.int64), flags)


def _read_footer(path: str):
    """(size, pyarrow's metadata, last 8 bytes) of the parquet file at `path`, opened as the
    engine opens (never blocking on a FIFO); ValueError when pyarrow cannot read it."""
    import pyarrow.parquet as pq

    with opened(path) as (fs, handle):
        size = fs.handle_size(handle)
        try:
            with fs.file_object(handle, "rb") as fp:
                meta = pq.ParquetFile(fp).metadata
        except Exception as exc:  # pyarrow's ArrowInvalid and friends
            raise ValueError(f"is not a parquet file pyarrow can open ({exc})") from None
        tail = fs.read_at(handle, 8, max(size - 8, 0))
    return size, meta, tail
