"""Dataset file formats: one module per format, registered by the `dataset.format` name.

A format knows two things: how to write one file of samples (header bytes from Python, payload
streamed by the C core) and where each sample's bytes sit in such a file (a `FileLayout`), either
computed from the generation parameters or probed from an existing file's header. Formats whose
sizes depend on the content (jpeg, png, csv: formats/sized.py) have their sizes recorded at
generation (recorded_sizes.py) or probed, and their layouts follow from the sizes; parquet
files whose row groups depend on the content (compressed) or differ by file (varying sample
sizes) have a row per file recorded the same way (record_width, write_recorded, probe_record).
"""

from __future__ import annotations

from .base import FileLayout, Format, SampleSpec, StoredArray, UnitExtents
from .csv_table import CsvFormat
from .hdf5 import Hdf5Format
from .images import ImageFormat
from .indexed_binary import IndexedBinaryFormat, MmapIndexedBinaryFormat
from .npy import NpyFormat
from .npz import NpzFormat
from .parquet import ParquetFormat
from .synthetic import SyntheticFormat
from .tfrecord import TFRecordFormat

_REGISTRY: dict[str, Format] = {
    fmt.name: fmt for fmt in (NpyFormat(), NpzFormat(), IndexedBinaryFormat(),
                              MmapIndexedBinaryFormat(), SyntheticFormat(), TFRecordFormat(),
                              Hdf5Format(), ImageFormat("jpeg"), ImageFormat("png"), CsvFormat(),
                              ParquetFormat())
}


def implemented_formats() -> list[str]:
    """Names of the formats this version can generate and read."""
    return sorted(_REGISTRY)


def get_format(name: str) -> Format:
    """The format registered under `name`; KeyError if it is not implemented."""
    return _REGISTRY[name]


def format_for(dataset) -> Format:
    """The format of the `dataset` section, configured by its format's own keys (hdf5:
    dataset.hdf5.*, dataset.compression; parquet: dataset.parquet.*); ConfigError for values
    it cannot take."""
    fmt = get_format(dataset.format)
    configure = getattr(fmt, "configure", None)
    return configure(dataset) if configure is not None else fmt


def sizes_recorded(fmt: Format) -> bool:
    """Whether `fmt`'s file sizes depend on the content, so that generation records them and
    reading takes its layouts from them (formats/sized.py)."""
    return getattr(fmt, "sizes_recorded", False)


def record_width(fmt: Format) -> int | None:
    """The columns of each file's row in the record of a format that records more than the
    size (parquet's row groups: recorded_sizes.py), else None (one size per file)."""
    return getattr(fmt, "record_width", None)


def probe_record(fmt: Format, path: str):
    """What generation records of the file at `path`, read from it: its size (its first bytes
    checked), or its row (formats with probe_record); ValueError when it is not one."""
    probe = getattr(fmt, "probe_record", None)
    return probe(path) if probe is not None else fmt.probe_size(path)


def read_refusal(fmt: Format, spec: SampleSpec) -> str:
    """Why files of `fmt` like `spec` cannot be read by the native engine yet ('' when they
    can): a run that trains on them is refused before any I/O."""
    refusal = getattr(fmt, "read_refusal", None)
    return refusal(spec) if refusal is not None else ""


def library_read_reason(fmt: Format, spec: SampleSpec) -> str:
    """Why the C engine cannot read files of `fmt` like `spec` at their samples' file offsets,
    so that reader.engine native reads them through the format's library
    (readers.LIBRARY_BACKENDS); '' when the C engine reads them."""
    reason = getattr(fmt, "library_read_reason", None)
    return reason(spec) if reason is not None else ""


__all__ = ["FileLayout", "Format", "SampleSpec", "StoredArray", "UnitExtents", "format_for",
           "get_format", "implemented_formats", "library_read_reason", "probe_record",
           "read_refusal", "record_width",
           "sizes_recorded"]
