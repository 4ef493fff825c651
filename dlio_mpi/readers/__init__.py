"""The reader backends (the C engine, MPI-IO, h5py, staging, the real torch and tf loaders), one
spec each in a registry, as IOR's aiori and fio's ioengines, behind one protocol (base.py).

The step loop, metrics and summary use only the ReaderBackend protocol (base.py). What the
plan and the run ask of a backend before and around opening it is its spec (spec.py's
ReaderSpec: refusal, read mode, options, plan notes and text, memory held); registry.py holds
one spec per configuration value that chooses a backend (backend_key) and reader_spec picks the
run's. Backends are imported when opened, so that one's dependencies (torch) cost the others
nothing (tensorflow is imported only by readers/tf_loader.py)."""

from __future__ import annotations

from ..data.catalog import SplitFiles
from .base import (
    BatchStats,
    IoWatchdog,
    ReaderBackend,
    ReaderOptions,
    batches_in_flight,
    python_steps,
)
from .registry import (
    FRAMEWORK_LOADERS,
    REGISTRY,
    H5pyOptions,
    MpiioOptions,
    NativeOptions,
    TfOptions,
    TorchOptions,
    access_spec,
    backend_key,
    engine_refusal,
    reader_spec,
    torch_prefetch_factor,
)
from .spec import ALIASES, ReaderSpec, loader_cost_refusal, resolve_read_mode


def files_spec(cfg, files: SplitFiles) -> ReaderSpec:
    """The spec of the backend reading one split's `files`: with reader.engine native, files
    the C engine cannot read at their file offsets go to the format's library's."""
    split = files.split
    return reader_spec(cfg, split.format.library_read_reason(split.spec(0)))


def open_reader(cfg, files: SplitFiles, comm=None, spec: ReaderSpec | None = None
                ) -> ReaderBackend:
    """Open the run's backend (`spec`, default files_spec's) on one split's files with its
    options for this rank (collectively on `comm` for backends that read together). KeyError
    for a combination engine_refusal refuses."""
    spec = spec or files_spec(cfg, files)
    rank = comm.Get_rank() if comm is not None else 0
    return spec.open(files, spec.options(cfg, rank), comm)


__all__ = ["ALIASES", "FRAMEWORK_LOADERS", "REGISTRY", "BatchStats", "H5pyOptions", "IoWatchdog",
           "MpiioOptions", "NativeOptions", "ReaderBackend", "ReaderOptions", "ReaderSpec",
           "TfOptions", "TorchOptions", "access_spec", "backend_key", "batches_in_flight",
           "engine_refusal", "files_spec", "loader_cost_refusal", "open_reader", "python_steps",
           "reader_spec", "resolve_read_mode", "torch_prefetch_factor"]
