"""Reader backends in a registry (as IOR's aiori and fio's ioengines): the step loop, metrics
and summary use only the ReaderBackend protocol (base.py). reader.engine picks the family:
native backends by `reader.file_access`, framework backends (the real loader) by
`reader.data_loader`. Backends are imported when opened, so that one's dependencies (torch)
cost the others nothing (tensorflow is imported only by readers/tf_loader.py)."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

from ..catalog import SplitFiles
from .base import BatchStats, IoWatchdog, ReaderBackend, ReaderOptions, python_steps

# reader.engine native: file_access value -> (module, class)
BACKENDS = {
    "multi": ("dlio_mpi.readers.native", "NativeReader"),
    "shared": ("dlio_mpi.readers.mpiio", "SharedReader"),
    "collective": ("dlio_mpi.readers.mpiio", "CollectiveReader"),
}
ALIASES = {"posix": "multi", "mpio": "shared"}  # DLIO's names for the same access


# Libraries a format's whole-file load needs beyond the loader's own (library_load)
FORMAT_MODULES = {"csv": "pandas", "jpeg": "PIL", "png": "PIL"}

# reader.engine framework: data_loader -> the backend and what it reads. A combination not
# listed here is refused before any I/O (engine_refusal).
FRAMEWORK_LOADERS = {
    "pytorch": {"backend": ("dlio_mpi.readers.torch_loader", "TorchLoaderReader"),
                "loader": "torch.utils.data.DataLoader", "module": "torch",
                "formats": ("npy", "npz", "indexed_binary", "jpeg", "png", "csv", "parquet"),
                "file_access": ("multi",),
                # what its Dataset does per sample (DLIO's pytorch readers)
                "reads": {"npy": "np.load(path) of the whole file for every sample",
                          "npz": "np.load(path)['x'] of the whole file for every sample",
                          "indexed_binary": "open, seek and readinto of each sample's extent "
                                            "(the index files read once per worker)",
                          **{fmt: f"np.asarray(PIL.Image.open(path)) of the whole {fmt} file "
                                  "for every sample (the image is the sample)"
                             for fmt in ("jpeg", "png")},
                          "csv": "pandas.read_csv(path) of the whole file for every sample, "
                                 "then its row",
                          "parquet": "pq.read_table(path) of the whole file for every "
                                     "sample"}},
    "tensorflow": {"backend": ("dlio_mpi.readers.tf_loader", "open_tf_data"),
                   "loader": "tf.data pipeline", "module": "tensorflow",
                   "formats": ("tfrecord", "npy", "npz", "jpeg", "png", "csv", "parquet"),
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
    return -(-prefetch_size // workers) if prefetch_size > 0 else 2


def engine_refusal(cfg) -> str | None:
    """Why the run's reader.engine cannot read with this configuration (one line naming the
    keys and what is accepted), or None when it can."""
    rd = cfg.reader
    if rd.engine != "framework":
        return None
    access = ALIASES.get(rd.file_access, rd.file_access)
    if access != "multi":
        return (f"reader.engine: framework reads through the loader's own file calls in each "
                f"rank's worker processes, so reader.file_access must be multi (or posix), got "
                f"{rd.file_access}; expected multi, or reader.engine native for MPI-IO reads")
    loader = FRAMEWORK_LOADERS.get(rd.data_loader)
    if loader is None:
        return (f"reader.engine: framework with reader.data_loader {rd.data_loader} is not "
                f"implemented yet; accepted: reader.data_loader "
                f"{', '.join(FRAMEWORK_LOADERS)}, or reader.engine native (its access pattern "
                "without the real loader)")
    fmt = cfg.dataset.format
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
                f"pip install 'dlio-mpi[{loader['module']}]', or use reader.engine native")
    module = FORMAT_MODULES.get(fmt)
    if module is not None and find_spec(module) is None:
        return (f"reader.engine: framework reads dataset.format {fmt} through {module}, as "
                f"DLIO's {fmt} reader does, but {module} is not installed; install it with "
                f"pip install 'dlio-mpi[{loader['module']}]' (or pip install {module}), or use "
                "reader.engine native")
    return None


def backend_of(engine: str, data_loader: str, file_access: str) -> tuple[str, str]:
    """(module, class) of the backend reading for (reader.engine, reader.data_loader,
    reader.file_access); KeyError for a combination engine_refusal refuses."""
    access = ALIASES.get(file_access, file_access)
    if engine == "framework":
        loader = FRAMEWORK_LOADERS[data_loader]
        if access not in loader["file_access"]:
            raise KeyError((engine, data_loader, file_access))
        return loader["backend"]
    return BACKENDS[access]


def open_reader(file_access: str, files: SplitFiles, options: ReaderOptions,
                comm=None) -> ReaderBackend:
    """Open the backend for `file_access` (with options.engine and options.data_loader) on
    one split's files (collectively on `comm` for backends that read together)."""
    module, name = backend_of(options.engine, options.data_loader, file_access)
    return getattr(import_module(module), name)(files, options, comm)


__all__ = ["BACKENDS", "FRAMEWORK_LOADERS", "BatchStats", "IoWatchdog", "ReaderBackend",
           "ReaderOptions", "backend_of", "engine_refusal", "open_reader", "python_steps",
           "torch_prefetch_factor"]
