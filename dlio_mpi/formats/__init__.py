"""Dataset file formats: one module per format, registered by the `dataset.format` name.

A format knows two things: how to write one file of samples (header bytes from Python, payload
streamed by the C core) and where each sample's bytes sit in such a file (a `FileLayout`), either
computed from the generation parameters or probed from an existing file's header.
"""

from __future__ import annotations

from .base import FileLayout, Format, SampleSpec, StoredArray
from .indexed_binary import IndexedBinaryFormat, MmapIndexedBinaryFormat
from .npy import NpyFormat
from .npz import NpzFormat
from .synthetic import SyntheticFormat
from .tfrecord import TFRecordFormat

_REGISTRY: dict[str, Format] = {
    fmt.name: fmt for fmt in (NpyFormat(), NpzFormat(), IndexedBinaryFormat(),
                              MmapIndexedBinaryFormat(), SyntheticFormat(), TFRecordFormat())
}


def implemented_formats() -> list[str]:
    """Names of the formats this version can generate and read."""
    return sorted(_REGISTRY)


def get_format(name: str) -> Format:
    """The format registered under `name`; KeyError if it is not implemented."""
    return _REGISTRY[name]


__all__ = ["FileLayout", "Format", "SampleSpec", "StoredArray", "get_format",
           "implemented_formats"]
