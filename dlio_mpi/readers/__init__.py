"""Reader backends, one per `reader.file_access` value, in a registry (as IOR's aiori and fio's
ioengines): the step loop, metrics and summary use only the ReaderBackend protocol (base.py).
Backends are imported when opened, so that one's dependencies cost the others nothing."""

from __future__ import annotations

from importlib import import_module

from ..catalog import SplitFiles
from .base import BatchStats, IoWatchdog, ReaderBackend, ReaderOptions, python_steps

# file_access value -> (module, class)
BACKENDS = {
    "multi": ("dlio_mpi.readers.native", "NativeReader"),
    "shared": ("dlio_mpi.readers.mpiio", "SharedReader"),
    "collective": ("dlio_mpi.readers.mpiio", "CollectiveReader"),
}
ALIASES = {"posix": "multi", "mpio": "shared"}  # DLIO's names for the same access


def open_reader(file_access: str, files: SplitFiles, options: ReaderOptions,
                comm=None) -> ReaderBackend:
    """Open the backend for `file_access` on one split's files (collectively on `comm` for
    backends that read together)."""
    module, name = BACKENDS[ALIASES.get(file_access, file_access)]
    return getattr(import_module(module), name)(files, options, comm)


__all__ = ["BACKENDS", "BatchStats", "IoWatchdog", "ReaderBackend", "ReaderOptions",
           "open_reader", "python_steps"]
