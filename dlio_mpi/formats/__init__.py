"""Dataset file formats: one module per format, registered by the `dataset.format` name.

A format knows two things: how to write one file of samples (header bytes from Python, payload
streamed by the C core) and where each sample's bytes sit in such a file (a `FileLayout`), either
computed from the generation parameters or probed from an existing file's header. Formats whose
sizes depend on the content (jpeg, png, csv: formats/sized.py) have their sizes recorded at
generation (data/recorded_sizes.py) or probed, and their layouts follow from the sizes; parquet
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
    return get_format(dataset.format).configure(dataset)


def learned_layouts() -> dict[str, dict]:
    """Per format, what its layouts cost to learn so far (Format.learned_layouts)."""
    return {name: learned for name, fmt in _REGISTRY.items()
            if (learned := fmt.learned_layouts())}


def adopt_layouts(learned: dict[str, dict]) -> None:
    """Take what learned_layouts() returned on another rank."""
    for name, layouts in learned.items():
        _REGISTRY[name].adopt_layouts(layouts)


__all__ = ["FileLayout", "Format", "SampleSpec", "StoredArray", "UnitExtents", "adopt_layouts",
           "format_for", "get_format", "implemented_formats", "learned_layouts"]
