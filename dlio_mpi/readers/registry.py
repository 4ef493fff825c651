"""Every reader backend's spec (spec.py's protocol) and own options, one beside the other, and
REGISTRY: one spec per backend key (backend_key), as IOR's aiori table.

The key is the configuration value that chooses the backend: reader.staging (read_once,
replicated), else reader.data_loader with reader.engine framework (the real loader), else the
format's library where the C engine cannot read the files at their offsets (h5py), else
reader.file_access (multi; shared and collective: MPI-IO). Adding a backend: its module
(readers/<name>.py), its spec and options here, and its REGISTRY entry."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import ClassVar

from ..data.dataset import decoded_item
from ..errors import install_hint
from ..formats import Format, get_format
from ..units import size_text
from .base import ReaderBackend, ReaderOptions, batches_in_flight
from .spec import (
    ALIASES,
    FRAMEWORK_ONLY,
    NATIVE_ONLY,
    ReaderSpec,
    cache_refusal,
    common_options,
    keep_data_note,
    loader_cost_refusal,
    native_engine_notes,
    not_run_tail,
    pattern_note,
    unset_keys_note,
)


# ------------------------------------------------------------------ the native C engine
@dataclass(frozen=True, kw_only=True)
class NativeOptions(ReaderOptions):
    """The native C engine's own options (readers/native.py)."""

    fd_cache_size: int = 256
    close_at_epoch_end: bool = True  # reader.access: loader (else lean: descriptors cached)
    # the native C engine standing for the loader reader.data_loader names: a torch
    # DataLoader's worker processes each make whole batches, workers x prefetch_factor in
    # flight (batches_in_flight); tf.data's threads share each batch, prefetch_size in flight
    whole_batches: bool = False
    in_flight: int | None = None  # batches read ahead of the step's; None: prefetch_size
    startup_ns: int = 0  # reader.startup_time: the first epoch's reads begin this late


@dataclass(frozen=True)
class NativeSpec(ReaderSpec):
    """reader.file_access multi (posix): the C engine's threads, prefetch ring and pread."""

    def options(self, cfg, rank: int) -> NativeOptions:
        rd = cfg.reader
        return NativeOptions(**common_options(cfg, rank), fd_cache_size=rd.fd_cache_size,
                             close_at_epoch_end=rd.access == "loader",
                             whole_batches=rd.data_loader == "pytorch",
                             in_flight=self.batches_in_flight(rd),
                             startup_ns=round(rd.startup_time * 1e9))

    def loader_note(self, cfg, library_read: str) -> str:
        return pattern_note(cfg, "the native C engine")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return native_engine_notes(cfg) + keep_data_note(
            cfg.reader, "every read lands in one small buffer per reader thread (no ring of "
                        "batches)")

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        rd = cfg.reader
        if rd.cache is not None:
            return (f"engine native: the native C engine (threads, prefetch ring, pread) with "
                    f"the access pattern of DLIO's {rd.data_loader} reader, through a "
                    f"node-local cache in {rd.cache.folder} (policy {rd.cache.policy})")
        return (f"engine native: the native C engine (threads, prefetch ring, pread), "
                f"reader.file_access {rd.file_access}, with the access pattern of DLIO's "
                f"{rd.data_loader} reader")


# ------------------------------------------------------------------ MPI-IO
@dataclass(frozen=True, kw_only=True)
class MpiioOptions(ReaderOptions):
    """The MPI-IO backends' own options (readers/mpiio.py)."""

    fd_cache_size: int = 256
    close_at_epoch_end: bool = True  # reader.access: loader (else lean: files kept open)
    mpiio_hints: tuple[tuple[str, str], ...] = ()  # MPI-IO info hints, given at every open


@dataclass(frozen=True)
class MpiioSpec(ReaderSpec):
    """reader.file_access shared (mpio): independent MPI-IO reads; collective: one collective
    read per file and step."""

    collective: bool = False
    takes_mpiio_hints: ClassVar[bool] = True

    def options(self, cfg, rank: int) -> MpiioOptions:
        rd = cfg.reader
        return MpiioOptions(**common_options(cfg, rank), fd_cache_size=rd.fd_cache_size,
                            close_at_epoch_end=rd.access == "loader",
                            mpiio_hints=rd.mpiio_hints)

    def refuse(self, cfg, library_reason: str) -> str | None:
        return cache_refusal(cfg, library_reason)

    def format_refusal(self, cfg, fmt: Format) -> str | None:
        access = cfg.reader.file_access
        if fmt.reads_nothing:
            return (f"reader.file_access: {access} reads with MPI-IO, but dataset.format "
                    "synthetic reads nothing; expected multi")
        if fmt.reads_by_mmap:
            return (f"reader.file_access: {access} reads with MPI-IO, but dataset.format "
                    f"{cfg.dataset.format} is read through a memory mapping; expected multi "
                    "(or dataset.format indexed_binary)")
        return None

    def loader_note(self, cfg, library_read: str) -> str:
        return pattern_note(cfg, f"MPI-IO (reader.file_access={cfg.reader.file_access})")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return self._mpiio_notes(cfg.reader) + native_engine_notes(cfg) + keep_data_note(
            cfg.reader, "every MPI-IO read lands in one reused batch buffer (no ring of "
                        "reader.prefetch_size + 1)")

    def _mpiio_notes(self, rd) -> list[str]:
        """What the MPI-IO backends make of the native engine's settings."""
        if self.collective:
            notes = [f"reader.read_threads={rd.read_threads}: no effect with "
                     "reader.file_access=collective, whose reader thread makes one collective "
                     "read per file and step",
                     f"reader.fd_cache_size={rd.fd_cache_size}: no effect with "
                     "reader.file_access=collective, which keeps every file it read open (until "
                     "the epoch's end with reader.access: loader)"]
        else:
            notes = [f"reader.read_threads={rd.read_threads}: reader.file_access="
                     f"{rd.file_access} reads on one thread per rank, one blocking MPI-IO read "
                     "per request"]
        from ..mpi.library import is_open_mpi

        if is_open_mpi():
            notes.append(f"reader.prefetch_size={rd.prefetch_size}: under Open MPI the MPI-IO "
                         "backends read each batch when the step asks for it, on the step "
                         "loop's thread (its MPI-IO layer is not thread-safe): no read ahead, "
                         "no watchdog")
        if rd.odirect:
            notes.append("reader.odirect: true asks MPI-IO for O_DIRECT with the direct_read "
                         "hint, which ROMIO honours on some file systems only; summary.json "
                         "says whether it was reported back (dlio_mpi.readers)")
        return notes

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        rd = cfg.reader
        reads = "MPI-IO collective reads" if self.collective else "MPI-IO independent reads"
        return (f"engine native: {reads}, reader.file_access {rd.file_access}, with the access "
                f"pattern of DLIO's {rd.data_loader} reader")


# ------------------------------------------------------------------ the format's library
@dataclass(frozen=True, kw_only=True)
class H5pyOptions(ReaderOptions):
    """The h5py backend's own options (readers/h5py_reader.py)."""

    read_type: str = "on_demand"  # DLIO's: files opened per sample, or kept open (memory)


@dataclass(frozen=True)
class H5pySpec(ReaderSpec):
    """HDF5 files the C engine cannot read at their file offsets (Format.library_read_reason),
    read through h5py as DLIO's HDF5Reader reads them, with reader.engine native."""

    def options(self, cfg, rank: int) -> H5pyOptions:
        return H5pyOptions(**common_options(cfg, rank), read_type=cfg.reader.read_type)

    def refuse(self, cfg, library_reason: str) -> str | None:
        refused = cache_refusal(cfg, library_reason)
        if refused:
            return refused
        rd, fmt = cfg.reader, cfg.dataset.format
        library = get_format(fmt).library or fmt
        if ALIASES.get(rd.file_access, rd.file_access) != "multi":
            return (f"reader.file_access: {rd.file_access} reads samples at their file offsets "
                    f"through MPI-IO, but {library_reason}, so only {library} can read them; "
                    f"reading such {fmt} files through MPI-IO is not implemented yet in "
                    f"dlio-mpi; accepted: reader.file_access multi (or posix), which reads them "
                    f"through {library}")
        if rd.read_mode not in ("auto", "sample"):
            return (f"reader.read_mode: {rd.read_mode} does not apply to these {fmt} files: "
                    f"{library_reason}, so {library} reads each sample's rows as DLIO's reader "
                    "does; expected auto (or sample)")
        if rd.odirect:
            return (f"reader.odirect: true does not combine with these {fmt} files: "
                    f"{library_reason}, so {library} reads them, through the page cache; "
                    "expected false (reader.drop_page_cache: true keeps the page cache from "
                    "serving the reads)")
        return None

    def loader_note(self, cfg, library_read: str) -> str:
        rd = cfg.reader
        kept = ("kept open per thread for the epoch (reader.read_type memory)"
                if rd.read_type == "memory" else
                "opened and closed for every sample (reader.read_type on_demand)")
        return (f"reader.data_loader={rd.data_loader}: {cfg.dataset.format} files read through "
                f"h5py, not by the C engine, because {library_read}: "
                f"{max(rd.read_threads, 1)} reader thread(s) each read whole batches as DLIO's "
                f"HDF5Reader reads samples (h5py.File(path, 'r') {kept}, row i of every "
                f"records_<k>), prefetch {rd.prefetch_size} batch(es); "
                f"{not_run_tail(rd.data_loader)}")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return unset_keys_note(
            cfg, ("reader.access", "reader.fd_cache_size") + FRAMEWORK_ONLY,
            f"the h5py reader ({library_read}): reader.read_type decides how long files stay "
            "open, h5py how they are read") + keep_data_note(
            cfg.reader, "each sample h5py reads is dropped once read")

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        rd = cfg.reader
        return (f"engine native: h5py in {max(rd.read_threads, 1)} reader thread(s), not the "
                f"C engine, because {library_read}; reader.file_access {rd.file_access}, "
                f"reader.read_type {rd.read_type}")


# ------------------------------------------------------------------ reader.staging
@dataclass(frozen=True)
class StagingSpec(ReaderSpec):
    """reader.staging: the files read whole into the ranks' memory when the backend opens,
    the epochs served from there (readers/read_once.py, readers/replicated.py)."""

    staging: ClassVar[str] = ""  # its reader.staging value

    def refuse(self, cfg, library_reason: str) -> str | None:
        """It stages files whose samples sit at extents, for the native engine's reads; no
        reads per batch are left to order."""
        rd = cfg.reader
        access = ALIASES.get(rd.file_access, rd.file_access)
        why = [what for what, bad in (
            (f"reader.engine {rd.engine}", rd.engine != "native"),
            (f"reader.file_access {rd.file_access}", access != "multi"),
            ("reader.cache", rd.cache is not None),
            ("a format its library reads", bool(library_reason)),
            (f"dataset.format {cfg.dataset.format}'s ragged read units",
             get_format(cfg.dataset.format).unit_extents is not None)) if bad]
        if why:
            return (f"reader.staging: {rd.staging} is not implemented yet with "
                    f"{', '.join(why)}; it stages files whose samples sit at extents "
                    "(reader.engine: native, reader.file_access: multi, no reader.cache)")
        if rd.access_order == "sorted":
            return (f"reader.access_order: sorted with reader.staging {rd.staging} is not "
                    "implemented yet (the files are read whole before the first epoch: there "
                    "are no reads per batch to order); accepted: reader.access_order "
                    "shuffled, or reader.staging none")
        return None

    def direct_io_uses(self, cfg, data_folder: str) -> list[tuple[str, str, str]]:
        if not cfg.reader.odirect:
            return []
        stage = cfg.storage.stage_in
        return [(stage.to, "storage.stage_in.to", "reader.odirect") if stage is not None
                else (data_folder, "dataset.data_folder", "reader.odirect")]

    def loader_note(self, cfg, library_read: str) -> str:
        return pattern_note(cfg, "the native C engine")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return native_engine_notes(cfg)

    def opened_line(self, name: str, reader: ReaderBackend) -> str | None:
        staged = reader.staging  # describe()["staging"]: what it read when it opened
        if staged is None:
            return None
        return (f"staging ({name}, {self.staging}): {staged['files']} file(s), "
                f"{staged['bytes_read'] / 2**20:.1f} MiB read{self.read_how(staged)} in "
                f"{staged['seconds']:.2f} s ({staged['GiB_per_second']:.2f} GiB/s), up to "
                f"{max(staged['memory_bytes_per_node']) / 2**20:.1f} MiB of memory per node")

    def read_how(self, staged: dict) -> str:
        """How its staging read the files, for the opened line."""
        return " once"

    @staticmethod
    def dataset_files(cfg) -> tuple[int, int]:
        """(the files it stages, the bytes of one as generated)."""
        ds = cfg.dataset
        files = ds.num_files_train + (ds.num_files_eval if cfg.workflow.evaluation else 0)
        return files, ds.num_samples_per_file * ds.record_length_bytes


@dataclass(frozen=True)
class ReadOnceSpec(StagingSpec):
    """read_once: every file read once for the job, file f into rank f mod ranks' memory,
    each step's samples delivered by one MPI_Alltoallv."""

    staging: ClassVar[str] = "read_once"

    def memory_held(self, cfg, ranks_per_node: int, nodes: int
                    ) -> tuple[str, int, str, str] | None:
        files, per_file = self.dataset_files(cfg)
        per_node = -(-files // nodes) * per_file
        return ("reader.staging", per_node,
                f"reader.staging: read_once keeps the dataset in the nodes' memory, about "
                f"{size_text(per_node)} per node ({files} files of about {size_text(per_file)} "
                f"over {nodes} node(s))", "more nodes, or reader.staging: none")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return native_engine_notes(cfg) + (
            [] if cfg.reader.keep_data else
            ["reader.keep_data: false: no effect with reader.staging read_once, whose "
             "exchange delivers every step's samples into the batch from the ranks' copies"])

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        return ("reader.staging read_once: every file read once into the ranks' memory before "
                "the first epoch (file f on rank f mod ranks), each step's samples delivered "
                "from there by one MPI_Alltoallv")


@dataclass(frozen=True)
class ReplicatedSpec(StagingSpec):
    """replicated: every rank reads every file into its own memory, its batches copied from
    there (reader.keep_data false: into one reused buffer, batches of no bytes)."""

    staging: ClassVar[str] = "replicated"

    def read_how(self, staged: dict) -> str:
        return (f" (every one of {staged['copies']} ranks reading all "
                f"{staged['dataset_bytes'] / 2**20:.1f} MiB"
                + ("" if staged["kept"] else ", keeping none") + ")")

    def memory_held(self, cfg, ranks_per_node: int, nodes: int
                    ) -> tuple[str, int, str, str] | None:
        if not cfg.reader.keep_data:  # every file read into one buffer
            return None
        files, per_file = self.dataset_files(cfg)
        per_node = ranks_per_node * files * per_file
        return ("reader.staging", per_node,
                f"reader.staging: replicated keeps a copy of the dataset in every rank's "
                f"memory, about {size_text(per_node)} per node ({ranks_per_node} rank(s) of a "
                f"node each holding {files} files of about {size_text(per_file)})",
                "fewer ranks per node, reader.keep_data: false (every file read, none kept), "
                "or reader.staging: none")

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        rd = cfg.reader
        storm = ""
        if plan is not None:
            storm = (f" ({plan.ranks} x {size_text(plan.dataset_bytes)} = "
                     f"{size_text(plan.ranks * plan.dataset_bytes)})")
        shared = ("; without reader.odirect the node's ranks after the first may find the files "
                  "in the page cache" if not rd.odirect and plan is not None
                  and plan.ranks_per_node > 1 else "")
        return ("reader.staging replicated: every rank reads every file once into its own "
                "memory before the first epoch: ranks x the dataset's bytes from the file "
                f"system at start-up{storm}, none after; " + (
                    "each step's samples copied from the rank's copy" if rd.keep_data else
                    "keeping none (reader.keep_data false: one reused buffer), so the steps "
                    "run with batches of no bytes") + shared)


# ------------------------------------------------------------------ the real loaders
# reader.engine framework: data_loader -> what its loader reads. A combination not listed here
# is refused before any I/O (the loader's spec).
FRAMEWORK_LOADERS = {
    "pytorch": {"loader": "torch.utils.data.DataLoader", "module": "torch",
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
    "tensorflow": {"loader": "tf.data pipeline", "module": "tensorflow",
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


def framework_limits(cfg, library_reason: str) -> str | None:
    """reader.engine framework: the real loader reader.data_loader names, as FRAMEWORK_LOADERS
    lists what it reads."""
    refused = cache_refusal(cfg, library_reason)
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


@dataclass(frozen=True, kw_only=True)
class LoaderOptions(ReaderOptions):
    """What the real loaders share: DLIO's read_type, and the shape and dtype of the decoded
    sample DLIO's readers hand over (dataset.decoded_item; () : the sample's bytes as they
    are)."""

    read_type: str = "on_demand"  # DLIO's: a file loaded per sample, or once (memory)
    item_shape: tuple[int, ...] = ()
    item_dtype: str = "|u1"


@dataclass(frozen=True)
class LoaderSpec(ReaderSpec):
    """reader.engine framework: the real loader reader.data_loader `name` names, run in each
    rank over the samples the native engine would read (FRAMEWORK_LOADERS: what it reads)."""

    name: str = ""

    def loader_options(self, cfg, rank: int) -> dict:
        """The options every real loader takes (LoaderOptions' own), by keyword."""
        shape, dtype = decoded_item(cfg)
        return dict(common_options(cfg, rank), read_type=cfg.reader.read_type,
                    item_shape=shape, item_dtype=dtype)

    def refuse(self, cfg, library_reason: str) -> str | None:
        refused = framework_limits(cfg, library_reason)
        if refused or cfg.reader.access_order != "sorted":
            return refused
        return ("reader.access_order: sorted with reader.engine framework is not implemented "
                "yet (the real loader orders its own reads); accepted: reader.access_order "
                "shuffled, or reader.engine native")

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        rd = cfg.reader
        return (f"engine framework: a real {FRAMEWORK_LOADERS[self.name]['loader']} per rank "
                f"(reader.data_loader {rd.data_loader}), reader.file_access {rd.file_access}")

    def watchdog_note(self, cfg, runs_in_rank: str) -> list[str]:
        """reader.io_watchdog_abort where the loader reads in the rank's process
        (`runs_in_rank`: what reads there): a stuck read is reported, not ended."""
        rd = cfg.reader
        if not (rd.io_watchdog_abort and rd.io_watchdog_seconds > 0):
            return []
        return ["reader.io_watchdog_abort: true: a batch waited for longer than "
                "reader.io_watchdog_seconds is reported, not ended: the " + runs_in_rank
                + " reads in this process, where a stuck read cannot be interrupted (the "
                "DataLoader's workers can: reader.read_threads > 0)"]


@dataclass(frozen=True, kw_only=True)
class TorchOptions(LoaderOptions):
    """The torch DataLoader's own options (readers/torch_loader.py)."""

    pin_memory: bool = True
    multiprocessing_context: str = "fork"


@dataclass(frozen=True)
class TorchSpec(LoaderSpec):
    """reader.data_loader pytorch: a torch DataLoader per rank (readers/torch_loader.py)."""

    def options(self, cfg, rank: int) -> TorchOptions:
        rd = cfg.reader
        return TorchOptions(**self.loader_options(cfg, rank), pin_memory=rd.pin_memory,
                            multiprocessing_context=rd.multiprocessing_context)

    def loader_note(self, cfg, library_read: str) -> str:
        rd, fmt = cfg.reader, cfg.dataset.format
        workers = rd.read_threads
        how = (f"{workers} worker process(es) started by {rd.multiprocessing_context} "
               f"(persistent), prefetch_factor "
               f"{torch_prefetch_factor(rd.prefetch_size, workers)}"
               if workers else "no worker process (reader.read_threads=0: read in the rank)")
        memory = (", each file once per worker and epoch (reader.read_type memory)"
                  if rd.read_type == "memory" and not get_format(fmt).indexed else "")
        loader = FRAMEWORK_LOADERS[self.name]
        return (f"reader.engine=framework: each rank runs a real {loader['loader']} ({how}, "
                f"pin_memory {'true' if rd.pin_memory else 'false'} (torch pins only where it "
                f"finds an accelerator), batches of "
                f"{rd.batch_size}) over the samples the native engine would read, in the same "
                f"order; its Dataset reads {fmt} as DLIO's {rd.data_loader} reader "
                f"does: {loader['reads'][fmt]}{memory}")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return unset_keys_note(cfg, NATIVE_ONLY, (
            "reader.engine framework: they set how the native engine opens, keeps and "
            "watches files; the loader's Dataset reads as DLIO's reader does")) + (
            self.watchdog_note(cfg, "torch DataLoader without workers")
            if cfg.reader.read_threads == 0 else [])


@dataclass(frozen=True, kw_only=True)
class TfOptions(LoaderOptions):
    """The tf.data pipeline's own options (readers/tf_loader.py): TFRecordDataset's
    buffer_size (None: TensorFlow's default) and the threads of its batch map (DLIO's
    reader.transfer_size, reader.computation_threads); the TFRecord pipeline's shuffle buffer
    (reader.shuffle_size; 0: no shuffle, as with reader.sample_shuffle off) and its seed
    (None: reader.sample_shuffle random)."""

    transfer_size: int | None = None
    computation_threads: int = 1
    shuffle_size: int = 0
    shuffle_seed: int | None = None


@dataclass(frozen=True)
class TfSpec(LoaderSpec):
    """reader.data_loader tensorflow: a tf.data pipeline per rank (readers/tf_loader.py)."""

    def options(self, cfg, rank: int) -> TfOptions:
        rd = cfg.reader
        return TfOptions(**self.loader_options(cfg, rank), transfer_size=rd.transfer_size,
                         computation_threads=rd.computation_threads,
                         shuffle_size=rd.shuffle_size if rd.sample_shuffle != "off" else 0,
                         shuffle_seed=cfg.train.seed if rd.sample_shuffle == "seed" else None)

    def loader_note(self, cfg, library_read: str) -> str:
        rd, fmt = cfg.reader, cfg.dataset.format
        reads = FRAMEWORK_LOADERS[self.name]["reads"][fmt]
        if not get_format(fmt).streams_files:
            return (f"reader.engine=framework: each rank runs a real tf.data pipeline "
                    f"({max(rd.read_threads, 1)} generator(s) interleaved, as DLIO's reader "
                    f"threads, prefetch {rd.prefetch_size}, batches of {rd.batch_size}) over "
                    f"the samples the native engine would read, in the same order; {reads}")
        parallel = rd.read_threads if rd.read_threads > 0 else None
        order = ("in the same order" if parallel in (None, 1) and rd.sample_shuffle == "off"
                 else f"the same samples each epoch, in the order the TFRecordDataset streams "
                      f"them ({parallel} files interleaved, not the plan's order)"
                 if parallel not in (None, 1) else
                 "the same samples each epoch, in file order (not the plan's shuffled order)")
        return (f"reader.engine=framework: each rank runs a real tf.data pipeline "
                f"(TFRecordDataset buffer_size {rd.transfer_size}, num_parallel_reads "
                f"{parallel}; batches of {rd.batch_size} parsed by a map with "
                f"num_parallel_calls {rd.computation_threads}; prefetch {rd.prefetch_size}) "
                f"over the files and samples the native engine would read, {order}; {reads}")

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        return unset_keys_note(cfg, NATIVE_ONLY + FRAMEWORK_ONLY, (
            "reader.engine framework with reader.data_loader tensorflow: the tf.data "
            "pipeline reads the plan's samples with its own threads and buffers (no "
            "worker processes)")) + self.watchdog_note(cfg, "tf.data pipeline")


# ------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class Unregistered(ReaderSpec):
    """What no backend reads: the configuration is refused (IOR's unknown API)."""

    def refuse(self, cfg, library_reason: str) -> str | None:
        if cfg.reader.engine == "framework":  # a loader not registered: the framework's order
            return framework_limits(cfg, library_reason)
        return (f"dataset.format: {cfg.dataset.format}: {library_reason}; reading such files "
                "is not implemented yet")

    def open(self, files, options: ReaderOptions, comm=None) -> ReaderBackend:
        raise KeyError(self.cls)


# The reader backends, by the configuration value that chooses them (backend_key).
REGISTRY: dict[str, ReaderSpec] = {
    "multi": NativeSpec("dlio_mpi.readers.native", "NativeReader"),
    "shared": MpiioSpec("dlio_mpi.readers.mpiio", "SharedReader"),
    "collective": MpiioSpec("dlio_mpi.readers.mpiio", "CollectiveReader", collective=True),
    "h5py": H5pySpec("dlio_mpi.readers.h5py_reader", "H5pyReader"),
    "read_once": ReadOnceSpec("dlio_mpi.readers.read_once", "ReadOnceReader"),
    "replicated": ReplicatedSpec("dlio_mpi.readers.replicated", "ReplicatedReader"),
    "pytorch": TorchSpec("dlio_mpi.readers.torch_loader", "TorchLoaderReader", "pytorch"),
    # its class is the factory choosing the TFRecord pipeline or the generators
    "tensorflow": TfSpec("dlio_mpi.readers.tf_loader", "open_tf_data", "tensorflow"),
}


def backend_key(engine: str, data_loader: str, file_access: str,
                library: str | None = None, staging: str = "none") -> str:
    """The REGISTRY key of the backend reading for (reader.engine, reader.data_loader,
    reader.file_access, reader.staging); `library`: the library reading the format's files
    with engine native where the C engine cannot read them at their file offsets."""
    if staging != "none":  # reader.staging: read_once, replicated
        return staging
    if engine == "framework":
        return data_loader
    if library is not None:
        return library
    return ALIASES.get(file_access, file_access)


def reader_spec(cfg, library_reason: str = "") -> ReaderSpec:
    """The spec of the backend reading with this configuration; `library_reason`: why the
    format's library reads the files instead of the C engine (Format.library_read_reason,
    RunPlan.library_read; '' where it does not). A combination no backend reads gets a spec
    refusing it."""
    rd = cfg.reader
    library = get_format(cfg.dataset.format).library if library_reason else None
    key = backend_key(rd.engine, rd.data_loader, rd.file_access, library, rd.staging)
    return REGISTRY.get(key) or Unregistered("", key)


def access_spec(cfg) -> ReaderSpec:
    """The spec of the backend reader.file_access names alone (the native engine or MPI-IO),
    whatever reads: for what the file access decides (MPI-IO's hints, the formats it reads)."""
    access = cfg.reader.file_access
    return REGISTRY[ALIASES.get(access, access)]


def engine_refusal(cfg, library_reason: str = "") -> str | None:
    """Why the run's reader backend cannot read with this configuration (one line naming the
    keys and what is accepted), or None when it can: the loader's modelled costs, then the
    chosen backend's own limits (its spec's refuse)."""
    return loader_cost_refusal(cfg, library_reason) \
        or reader_spec(cfg, library_reason).refuse(cfg, library_reason)
