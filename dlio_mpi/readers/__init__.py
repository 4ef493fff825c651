"""The reader backends (the C engine, MPI-IO, h5py, the real torch and tf loaders) in a
registry, as IOR's aiori and fio's ioengines, behind one protocol (base.py).

The step loop, metrics and summary use only the ReaderBackend protocol. One REGISTRY holds
the backends by the configuration value that chooses them (backend_key): `reader.file_access`
with reader.engine native, `reader.data_loader` with framework (the real loader), the
format's library where the C engine cannot read its files, `reader.staging` (read_once,
replicated). Each
entry carries its own limits (refuse, IOR's check_params); engine_refusal asks the chosen one.
Backends are imported when opened, so that one's dependencies (torch) cost the others nothing
(tensorflow is imported only by readers/tf_loader.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec

from ..data.catalog import SplitFiles
from ..errors import install_hint
from ..formats import get_format
from .base import (
    BatchStats,
    IoWatchdog,
    ReaderBackend,
    ReaderOptions,
    batches_in_flight,
    python_steps,
)

ALIASES = {"posix": "multi", "mpio": "shared"}  # DLIO's names for reader.file_access values


@dataclass(frozen=True)
class Backend:
    """A reader backend in the registry (IOR's aiori, fio's ioengines): where its class lives
    (imported only when opened: torch costs the others nothing) and its own limits (IOR's
    check_params): refuse(cfg, library_reason) says why it cannot read this configuration
    (one line naming the keys and what is accepted), or None."""

    module: str
    cls: str
    refuse: Callable[[object, str], str | None] = lambda cfg, library_reason: None


# reader.engine framework: data_loader -> the backend and what it reads. A combination not
# listed here is refused before any I/O (engine_refusal).
FRAMEWORK_LOADERS = {
    "pytorch": {"backend": ("dlio_mpi.readers.torch_loader", "TorchLoaderReader"),
                "loader": "torch.utils.data.DataLoader", "module": "torch",
                "formats": ("npy", "npz", "indexed_binary", "hdf5", "jpeg", "png", "csv",
                            "parquet"),
                "file_access": ("multi",),
                # what its Dataset does per sample (DLIO's pytorch readers)
                "reads": {"npy": "np.load(path) of the whole file for every sample",
                          "npz": "np.load(path)['x'] of the whole file for every sample",
                          "indexed_binary": "open, seek and readinto of each sample's extent "
                                            "(the index files read once per worker)",
                          "hdf5": "h5py.File(path, 'r') and row i of every records_<k> for "
                                  "every sample",
                          **{fmt: f"np.asarray(PIL.Image.open(path)) of the whole {fmt} file "
                                  "for every sample (the image is the sample)"
                             for fmt in ("jpeg", "png")},
                          "csv": "pandas.read_csv(path) of the whole file for every sample, "
                                 "then its row",
                          "parquet": "pq.read_table(path) of the whole file for every "
                                     "sample"}},
    "tensorflow": {"backend": ("dlio_mpi.readers.tf_loader", "open_tf_data"),
                   "loader": "tf.data pipeline", "module": "tensorflow",
                   "formats": ("tfrecord", "npy", "npz", "hdf5", "jpeg", "png", "csv",
                               "parquet"),
                   "file_access": ("multi",),
                   # what its TFRecordDataset does (DLIO's tensorflow reader)
                   "reads": {"tfrecord": "each planned file streamed whole by "
                                         "tf.data.TFRecordDataset, its records parsed in "
                                         "batches with tf.io.parse_example",
                            "npy": "np.load(path) of the whole file in a tf.data generator per "
                                   "reader thread, once for the file's samples of the epoch",
                            "npz": "np.load(path)['x'] of the whole file in a tf.data "
                                   "generator per reader thread, once for the file's samples "
                                   "of the epoch",
                            "hdf5": "h5py.File(path, 'r') and row i of every records_<k> in a "
                                    "tf.data generator per reader thread, the file kept open "
                                    "for its samples of the epoch",
                            **{fmt: f"np.asarray(PIL.Image.open(path)) of the whole {fmt} file "
                                    "in a tf.data generator per reader thread, once for the "
                                    "file's samples of the epoch (the image is each sample)"
                               for fmt in ("jpeg", "png")},
                            "csv": "pandas.read_csv(path) of the whole file in a tf.data "
                                   "generator per reader thread, once for the file's samples "
                                   "of the epoch, then each sample's row",
                            "parquet": "pq.read_table(path) of the whole file in a tf.data "
                                       "generator per reader thread, once for the file's "
                                       "samples of the epoch"}},
}


def torch_prefetch_factor(prefetch_size: int, workers: int) -> int | None:
    """DLIO's prefetch_factor for the torch DataLoader: about prefetch_size batches in flight
    over all workers (ceil(prefetch_size / workers)), 2 (the DataLoader's default) when
    prefetch_size is 0; None without workers (the DataLoader refuses one then)."""
    if workers == 0:
        return None
    return batches_in_flight("pytorch", prefetch_size, workers) // workers


def engine_refusal(cfg, library_reason: str = "") -> str | None:
    """Why the run's reader backend cannot read with this configuration (one line naming the
    keys and what is accepted), or None when it can: the loader's modelled costs, then the
    chosen backend's own limits (REGISTRY). `library_reason`: why the format's library reads
    the files instead of the C engine (Format.library_read_reason)."""
    modelled = loader_cost_refusal(cfg, library_reason)
    if modelled:
        return modelled
    rd, fmt = cfg.reader, cfg.dataset.format
    key = backend_key(rd.engine, rd.data_loader, rd.file_access,
                      get_format(fmt).library if library_reason else None, rd.staging)
    backend = REGISTRY.get(key)
    if backend is not None:
        return backend.refuse(cfg, library_reason)
    if rd.engine == "framework":  # a loader not registered: said in the framework's order
        return _framework_limits(cfg, library_reason)
    return f"dataset.format: {fmt}: {library_reason}; reading such files is not implemented yet"


def loader_cost_refusal(cfg, library_reason: str = "") -> str | None:
    """Why the loader's modelled costs the native C engine spends (reader.preprocess_cpu_time,
    reader.startup_time) cannot be spent by the run's backend, or None."""
    rd = cfg.reader
    keys = [name for name, given in (("reader.preprocess_cpu_time",
                                      rd.preprocess_cpu_time.mean > 0),
                                     ("reader.startup_time", rd.startup_time > 0)) if given]
    access = ALIASES.get(rd.file_access, rd.file_access)
    why = [what for what, bad in ((f"reader.engine {rd.engine}", rd.engine != "native"),
                                  (f"reader.file_access {rd.file_access}", access != "multi"),
                                  (f"reader.staging {rd.staging}", rd.staging != "none"),
                                  ("a format its library reads", bool(library_reason))) if bad]
    if not keys or not why:
        return None
    return (f"{' and '.join(keys)}: not implemented yet with {', '.join(why)}; the native C "
            "engine spends them (reader.engine: native, reader.file_access: multi)")


def _cache_refusal(cfg, library_reason: str) -> str | None:
    """reader.cache: the caching tier is read and filled by the native C engine alone."""
    rd = cfg.reader
    if rd.cache is None:
        return None
    return ("reader.cache: the caching tier is not implemented yet for reader.engine "
            f"{rd.engine}, reader.file_access {rd.file_access}"
            + (" and a format its library reads" if library_reason else "")
            + "; it caches for the native C engine (reader.engine: native, "
            "reader.file_access: multi)")


def _staging_limits(cfg, library_reason: str) -> str | None:
    """reader.staging (read_once, replicated) stages files whose samples sit at extents, for
    the native engine's reads."""
    rd = cfg.reader
    access = ALIASES.get(rd.file_access, rd.file_access)
    why = [what for what, bad in (
        (f"reader.engine {rd.engine}", rd.engine != "native"),
        (f"reader.file_access {rd.file_access}", access != "multi"),
        ("reader.cache", rd.cache is not None),
        ("a format its library reads", bool(library_reason)),
        (f"dataset.format {cfg.dataset.format}'s ragged read units",
         get_format(cfg.dataset.format).unit_extents is not None)) if bad]
    if not why:
        return None
    return (f"reader.staging: {rd.staging} is not implemented yet with "
            f"{', '.join(why)}; it stages files whose samples sit at extents "
            "(reader.engine: native, reader.file_access: multi, no reader.cache)")


def _library_limits(cfg, reason: str) -> str | None:
    """Files the C engine leaves to the format's library (`reason`: which property of the
    file), read by the library's backend with reader.engine native: what it can do."""
    refused = _cache_refusal(cfg, reason)
    if refused:
        return refused
    rd, fmt = cfg.reader, cfg.dataset.format
    access = ALIASES.get(rd.file_access, rd.file_access)
    library = get_format(fmt).library or fmt
    if access != "multi":
        return (f"reader.file_access: {rd.file_access} reads samples at their file offsets "
                f"through MPI-IO, but {reason}, so only {library} can read them; reading "
                f"such {fmt} files through MPI-IO is not implemented yet in dlio-mpi; "
                f"accepted: reader.file_access multi (or posix), which reads them through "
                f"{library}")
    if rd.read_mode not in ("auto", "sample"):
        return (f"reader.read_mode: {rd.read_mode} does not apply to these {fmt} files: "
                f"{reason}, so {library} reads each sample's rows as DLIO's reader does; "
                "expected auto (or sample)")
    if rd.odirect:
        return (f"reader.odirect: true does not combine with these {fmt} files: {reason}, "
                f"so {library} reads them, through the page cache; expected false "
                "(reader.drop_page_cache: true keeps the page cache from serving the reads)")
    return None


def _framework_limits(cfg, library_reason: str) -> str | None:
    """reader.engine framework: the real loader, as FRAMEWORK_LOADERS lists what it reads."""
    refused = _cache_refusal(cfg, library_reason)
    if refused:
        return refused
    rd = cfg.reader
    if ALIASES.get(rd.file_access, rd.file_access) != "multi":
        return (f"reader.engine: framework reads through the loader's own file calls in each "
                f"rank's worker processes, so reader.file_access must be multi (or posix), got "
                f"{rd.file_access}; expected multi, or reader.engine native for MPI-IO reads")
    loader = FRAMEWORK_LOADERS.get(rd.data_loader)
    if loader is None:
        return (f"reader.engine: framework with reader.data_loader {rd.data_loader} is not "
                f"implemented yet; accepted: reader.data_loader "
                f"{', '.join(FRAMEWORK_LOADERS)}, or reader.engine native (its access pattern "
                "without the real loader)")
    return _framework_reads(cfg, loader)


def _framework_reads(cfg, loader: dict) -> str | None:
    """What the framework loader `loader` reads, and what it needs installed."""
    rd, fmt = cfg.reader, cfg.dataset.format
    if fmt not in loader["formats"]:
        return (f"reader.engine: framework with reader.data_loader {rd.data_loader} reads "
                f"{', '.join(loader['formats'])}, got dataset.format {fmt}; expected one of "
                "those, or reader.engine native")
    if rd.odirect:
        return ("reader.odirect: true does not combine with reader.engine framework: the "
                f"{rd.data_loader} loader's workers read through the page cache as DLIO's "
                "reader does; expected false (reader.drop_page_cache: true keeps the page "
                "cache from serving the reads), or reader.engine native")
    if rd.read_mode != "auto":
        return (f"reader.read_mode: {rd.read_mode} does not apply with reader.engine framework, "
                f"where DLIO's {rd.data_loader} reader decides the reads (reader.read_type); "
                "expected auto, or reader.engine native")
    if find_spec(loader["module"]) is None:
        return (f"reader.engine: framework with reader.data_loader {rd.data_loader} runs "
                f"{loader['loader']}, but {loader['module']} is not installed; install it with "
                f"{install_hint(loader['module'])}, or use reader.engine native")
    module = get_format(fmt).library  # what its whole-file load needs (Format.load_whole)
    if module and find_spec(module) is None:
        return (f"reader.engine: framework reads dataset.format {fmt} through {module}, as "
                f"DLIO's {fmt} reader does, but {module} is not installed; install it with "
                f"{install_hint(module)}, or use reader.engine native")
    return None


# The reader backends, by the configuration value that chooses them (backend_key):
# reader.file_access with reader.engine native, the format's library where the C engine
# cannot read its files at their offsets, reader.data_loader with reader.engine framework,
# reader.staging read_once and replicated.
REGISTRY: dict[str, Backend] = {
    "multi": Backend("dlio_mpi.readers.native", "NativeReader"),
    "shared": Backend("dlio_mpi.readers.mpiio", "SharedReader", _cache_refusal),
    "collective": Backend("dlio_mpi.readers.mpiio", "CollectiveReader", _cache_refusal),
    "h5py": Backend("dlio_mpi.readers.h5py_reader", "H5pyReader", _library_limits),
    "read_once": Backend("dlio_mpi.readers.read_once", "ReadOnceReader", _staging_limits),
    "replicated": Backend("dlio_mpi.readers.replicated", "ReplicatedReader", _staging_limits),
    **{name: Backend(*loader["backend"], _framework_limits)
       for name, loader in FRAMEWORK_LOADERS.items()},
}


def backend_key(engine: str, data_loader: str, file_access: str,
                library: str | None = None, staging: str = "none") -> str:
    """The REGISTRY key of the backend reading for (reader.engine, reader.data_loader,
    reader.file_access); `library`: the library reading the format's files with engine
    native where the C engine cannot read them at their file offsets."""
    if staging != "none":  # reader.staging: read_once, replicated
        return staging
    if engine == "framework":
        return data_loader
    if library is not None:
        return library
    return ALIASES.get(file_access, file_access)


def open_reader(file_access: str, files: SplitFiles, options: ReaderOptions,
                comm=None) -> ReaderBackend:
    """Open the backend for `file_access` (with options.engine and options.data_loader) on
    one split's files (collectively on `comm` for backends that read together); with engine
    native, files the C engine cannot read at their file offsets go to the format's library
    backend. KeyError for a combination engine_refusal refuses."""
    fmt = files.split.format
    library = fmt.library if fmt.library_read_reason(files.split.spec(0)) else None
    backend = REGISTRY[backend_key(options.engine, options.data_loader, file_access, library,
                                   options.staging)]
    return getattr(import_module(backend.module), backend.cls)(files, options, comm)


__all__ = ["FRAMEWORK_LOADERS", "REGISTRY", "Backend", "BatchStats", "IoWatchdog",
           "ReaderBackend", "ReaderOptions", "backend_key", "batches_in_flight", "engine_refusal",
           "loader_cost_refusal", "open_reader", "python_steps", "torch_prefetch_factor"]
