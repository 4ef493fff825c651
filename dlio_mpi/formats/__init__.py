"""Dataset file formats: one module per format, registered by the `dataset.format` name.

A format knows two things: how to write one file of samples (header bytes from Python, payload
streamed by the C core) and where each sample's bytes sit in such a file (a `FileLayout`), either
computed from the generation parameters or probed from an existing file's header. Formats whose
sizes depend on the content (jpeg, png, csv: formats/sized.py) have their sizes recorded at
generation (recorded_sizes.py) or probed, and their layouts follow from the sizes.
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
           "get_format", "implemented_formats", "library_read_reason", "read_refusal",
           "sizes_recorded"]
