"""A reader backend's spec (IOR's aiori entry, beside the backend's class): what the plan, its
checks and the run ask of a backend before and around opening it, every hook declared here.

ReaderSpec declares each hook with its default: the backend's refusal (IOR's check_params),
its read mode, its options from the configuration, its plan notes and plan text, what it holds
in memory, the folders it reads with O_DIRECT outside the C engine, the line the run says once
it is open. registry.py holds one spec per backend key; plan/ and run.py ask the chosen one
(readers.reader_spec) and compare no selector value (reader.engine, reader.data_loader,
reader.file_access, reader.staging) themselves. A spec names its backend's class by module and
name, imported only when opened: asking a spec imports no torch, tensorflow or mpi4py.

Also here, what several specs share: the read mode DLIO's readers resolve 'auto' to, the options
every backend takes, and the plan's notes on the native engine's access pattern."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import ClassVar

from ..config import keys_set
from ..data.catalog import SplitFiles
from ..formats import Format, get_format, implemented_formats
from .base import IoWatchdog, ReaderBackend, ReaderOptions, batches_in_flight

ALIASES = {"posix": "multi", "mpio": "shared"}  # DLIO's names for reader.file_access values

# What DLIO's pytorch and tensorflow readers do per read mode, for the plan's loader note
_PATTERNS = {"file": "the whole file loaded for every sample",
             "file_once": "each file loaded once, whole, for all its samples",
             "sample": "a read of each sample's extent"}

# native engine settings without effect when the framework loader reads, and the reverse
NATIVE_ONLY = ("reader.access", "reader.fd_cache_size", "reader.keep_data")
FRAMEWORK_ONLY = ("reader.pin_memory", "reader.multiprocessing_context")


def resolve_read_mode(cfg, data_loader: str | None = None) -> str:
    """reader.read_mode, with 'auto' following DLIO's reader for `data_loader` (default:
    reader.data_loader): extents for indexed formats, else the whole file per sample
    (on_demand) or once per epoch (memory). DLIO's tensorflow loader walks a file's samples
    one after the other on one thread and loads the file once for them, so with several
    samples per file it reads each file once per epoch even on_demand."""
    mode = cfg.reader.read_mode
    if mode != "auto":
        return mode
    fmt = get_format(cfg.dataset.format) if cfg.dataset.format in implemented_formats() \
        else Format()
    if fmt.dlio_reads_samples:
        return "sample"
    if fmt.unit_extents is not None and cfg.reader.engine == "native":
        return "sample"  # parquet's row groups, as MLPerf Storage's parquet readers read them
    if cfg.reader.read_type == "memory":
        return "file_once"
    loader = data_loader or cfg.reader.data_loader
    iterates_files = loader == "tensorflow" and cfg.dataset.num_samples_per_file > 1
    return "file_once" if iterates_files else "file"


def common_options(cfg, rank: int) -> dict:
    """The options every backend takes (ReaderOptions' fields), by keyword, for `rank`."""
    rd = cfg.reader
    return dict(read_threads=rd.read_threads, prefetch_size=rd.prefetch_size,
                odirect=rd.odirect, drop_page_cache=rd.drop_page_cache, keep_data=rd.keep_data,
                watchdog=IoWatchdog(rd.io_watchdog_seconds, rd.io_watchdog_abort, rank),
                trace=cfg.output.trace)


@dataclass(frozen=True)
class ReaderSpec:
    """One reader backend as the plan and the run know it (see the module): its class, by
    `module` and `cls` (a class or a factory called as cls(files, options, comm)), and every
    hook with its default; a backend's spec overrides what it does otherwise."""

    module: str
    cls: str
    # whether the backend opens files through MPI-IO, where reader.mpiio_hints act
    takes_mpiio_hints: ClassVar[bool] = False

    # ---- opening
    def options(self, cfg, rank: int) -> ReaderOptions:
        """The backend's options for `rank` from the configuration: the common ones, and
        its own (a ReaderOptions subclass) where it has any."""
        return ReaderOptions(**common_options(cfg, rank))

    def open(self, files: SplitFiles, options: ReaderOptions, comm=None) -> ReaderBackend:
        """The backend on one split's files (collectively on `comm` for backends that read
        together); its module imported now."""
        return getattr(import_module(self.module), self.cls)(files, options, comm)

    def opened_line(self, name: str, reader: ReaderBackend) -> str | None:
        """What the run says once the backend opened for phase `name` (what it read then)."""
        return None

    # ---- the checks before any I/O
    def refuse(self, cfg, library_reason: str) -> str | None:
        """Why the backend cannot read with this configuration (one line naming the keys and
        what is accepted), or None; `library_reason`: why the format's library reads the files
        (Format.library_read_reason)."""
        return None

    def format_refusal(self, cfg, fmt: Format) -> str | None:
        """Why the file access this backend stands for cannot read the format's files (asked
        of reader.file_access's backend, readers.access_spec), or None."""
        return None

    def read_mode(self, cfg) -> str:
        """How its reads take the samples: sample, file or file_once (resolve_read_mode)."""
        return resolve_read_mode(cfg)

    def batches_in_flight(self, rd) -> int:
        """Batches read ahead of the one the step holds (the loader's, readers.base)."""
        return batches_in_flight(rd.data_loader, rd.prefetch_size, rd.read_threads)

    def memory_held(self, cfg, ranks_per_node: int, nodes: int
                    ) -> tuple[str, int, str, str] | None:
        """What it keeps in a node's memory for the whole run beyond its batches (the key
        that sizes it, bytes per node, what is held, what would hold less), or None."""
        return None

    def direct_io_uses(self, cfg, data_folder: str) -> list[tuple[str, str, str]]:
        """(folder, its key, the O_DIRECT key) of the folders it reads with O_DIRECT outside
        the C engine's epochs (plan.checks.direct_io_uses)."""
        return []

    # ---- the plan's text
    def loader_note(self, cfg, library_read: str) -> str:
        """The plan's note on what reader.data_loader changes in the run ('': none)."""
        return ""

    def setting_notes(self, cfg, library_read: str) -> list[str]:
        """The plan's notes on reader settings with no effect, or another, with it."""
        return []

    def reader_text(self, cfg, library_read: str, plan=None) -> str:
        """The plan's reader line: what reads the training data (`plan`: the RunPlan)."""
        return f"{self.cls} ({self.module})"


def unset_keys_note(cfg, keys: tuple[str, ...], why: str) -> list[str]:
    """The plan's note on `keys` set in the configuration that have no effect, `why`."""
    found = keys_set(cfg, keys)
    return [f"{', '.join(found)}: no effect with {why}"] if found else []


def keep_data_note(rd, lands: str) -> list[str]:
    """reader.keep_data false (ours; DLIO has no such key): where the reads land instead of
    the batches (`lands`)."""
    if rd.keep_data:
        return []
    return [f"reader.keep_data: false: {lands} and no batch is kept: the same system calls and "
            "bytes from storage as with true, without the batches' memory traffic"]


def not_run_tail(loader: str) -> str:
    """The loader note's end with reader.engine native: the real loader is not run."""
    real = {"pytorch": "torch DataLoader", "tensorflow": "tf.data pipeline"}[loader]
    return f"the real {real} is not run (reader.engine: framework runs it)"


def pattern_note(cfg, engine: str) -> str:
    """The loader note of a backend reading with the access pattern of DLIO's
    reader.data_loader reader (`engine`: what reads, the native C engine or MPI-IO)."""
    loader, fmt = cfg.reader.data_loader, cfg.dataset.format
    tail = not_run_tail(loader)
    if cfg.reader.read_mode != "auto":
        return (f"reader.data_loader={loader}: reader.read_mode={cfg.reader.read_mode} decides "
                f"the reads, not DLIO's {loader} reader; {tail}")
    own = get_format(fmt).native_read_note(cfg, resolve_read_mode(cfg)) \
        if fmt in implemented_formats() else ""
    if own:  # a format read as no DLIO reader of it reads (parquet's row groups, tfrecord)
        return f"reader.data_loader={loader}: {own}; {tail}"
    other = "tensorflow" if loader == "pytorch" else "pytorch"
    mine, theirs = resolve_read_mode(cfg), resolve_read_mode(cfg, other)
    alike = (f"as its {other} reader does" if mine == theirs
             else f"its {other} reader: {_PATTERNS[theirs]}")
    return (f"reader.data_loader={loader}: {engine} reads {fmt} with the access "
            f"pattern of DLIO's {loader} reader ({_PATTERNS[mine]}; {alike}); {tail}")


def native_engine_notes(cfg) -> list[str]:
    """The framework loader's settings, set where the native engine reads."""
    return unset_keys_note(cfg, FRAMEWORK_ONLY, (
        "reader.engine native, which reads with the C engine's threads into its own "
        "buffers; they set the torch DataLoader that reader.engine framework runs"))


def cache_refusal(cfg, library_reason: str) -> str | None:
    """reader.cache: the caching tier is read and filled by the native C engine alone."""
    rd = cfg.reader
    if rd.cache is None:
        return None
    return ("reader.cache: the caching tier is not implemented yet for reader.engine "
            f"{rd.engine}, reader.file_access {rd.file_access}"
            + (" and a format its library reads" if library_reason else "")
            + "; it caches for the native C engine (reader.engine: native, "
            "reader.file_access: multi)")


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
