"""The plan's notes: what the configured reader does per sample (as DLIO's loaders do), which
settings have no effect with the chosen engine, and what a format, checkpoint or MPI-IO setting
means for the run. Notes inform; they never refuse."""

from __future__ import annotations

from ..config import keys_set, support_notes
from ..formats import Format, get_format, implemented_formats
from ..readers import (
    FRAMEWORK_LOADERS,
    torch_prefetch_factor,
)
from .units import number_text

# What DLIO's pytorch and tensorflow readers do per read mode, for the plan's loader note
_PATTERNS = {"file": "the whole file loaded for every sample",
             "file_once": "each file loaded once, whole, for all its samples",
             "sample": "a read of each sample's extent"}


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


def loader_note(cfg, library_read: str = "") -> str:
    """What reader.data_loader changes in the run, as a plan note: the access pattern the
    native engine emulates, or the real loader reader.engine framework runs. `library_read`:
    why the format's library reads instead of the C engine (RunPlan.library_read)."""
    loader, fmt = cfg.reader.data_loader, cfg.dataset.format
    if cfg.reader.engine == "framework":
        return _framework_note(cfg)
    real = {"pytorch": "torch DataLoader", "tensorflow": "tf.data pipeline"}[loader]
    tail = f"the real {real} is not run (reader.engine: framework runs it)"
    if library_read:
        threads = max(cfg.reader.read_threads, 1)
        kept = ("kept open per thread for the epoch (reader.read_type memory)"
                if cfg.reader.read_type == "memory" else
                "opened and closed for every sample (reader.read_type on_demand)")
        return (f"reader.data_loader={loader}: {fmt} files read through h5py, not by the C "
                f"engine, because {library_read}: {threads} reader thread(s) each read whole "
                f"batches as DLIO's HDF5Reader reads samples (h5py.File(path, 'r') {kept}, "
                f"row i of every records_<k>), prefetch {cfg.reader.prefetch_size} batch(es); "
                f"{tail}")
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
    engine = ("the native C engine" if cfg.reader.file_access in ("multi", "posix")
              else f"MPI-IO (reader.file_access={cfg.reader.file_access})")
    return (f"reader.data_loader={loader}: {engine} reads {fmt} with the access "
            f"pattern of DLIO's {loader} reader ({_PATTERNS[mine]}; {alike}); {tail}")


def _framework_note(cfg) -> str:
    """The real loader reader.engine framework runs (a combination engine_refusal accepts)."""
    rd = cfg.reader
    loader = FRAMEWORK_LOADERS[rd.data_loader]
    if rd.data_loader == "tensorflow":
        return _tf_data_note(cfg)
    workers = rd.read_threads
    how = (f"{workers} worker process(es) started by {rd.multiprocessing_context} (persistent), "
           f"prefetch_factor {torch_prefetch_factor(rd.prefetch_size, workers)}"
           if workers else "no worker process (reader.read_threads=0: read in the rank)")
    memory = (", each file once per worker and epoch (reader.read_type memory)"
              if rd.read_type == "memory" and not get_format(cfg.dataset.format).indexed
              else "")
    return (f"reader.engine=framework: each rank runs a real {loader['loader']} ({how}, "
            f"pin_memory {'true' if rd.pin_memory else 'false'} (torch pins only where it "
            f"finds an accelerator), batches of "
            f"{rd.batch_size}) over the samples the native engine would read, in the same "
            f"order; its Dataset reads {cfg.dataset.format} as DLIO's {rd.data_loader} reader "
            f"does: {loader['reads'][cfg.dataset.format]}{memory}")


def _tf_data_note(cfg) -> str:
    """The tf.data pipeline reader.engine framework runs with reader.data_loader tensorflow
    (readers/tf_loader.py)."""
    rd = cfg.reader
    if not get_format(cfg.dataset.format).streams_files:
        threads = max(rd.read_threads, 1)
        return (f"reader.engine=framework: each rank runs a real tf.data pipeline ({threads} "
                f"generator(s) interleaved, as DLIO's reader threads, prefetch "
                f"{rd.prefetch_size}, batches of {rd.batch_size}) over the samples the native "
                f"engine would read, in the same order; "
                f"{FRAMEWORK_LOADERS['tensorflow']['reads'][cfg.dataset.format]}")
    reads = rd.read_threads if rd.read_threads > 0 else None
    order = ("in the same order" if reads in (None, 1) and rd.sample_shuffle == "off"
             else f"the same samples each epoch, in the order the TFRecordDataset streams "
                  f"them ({reads} files interleaved, not the plan's order)"
             if reads not in (None, 1) else
             "the same samples each epoch, in file order (not the plan's shuffled order)")
    return (f"reader.engine=framework: each rank runs a real tf.data pipeline "
            f"(TFRecordDataset buffer_size {rd.transfer_size}, num_parallel_reads {reads}; "
            f"batches of {rd.batch_size} parsed by a map with num_parallel_calls "
            f"{rd.computation_threads}; prefetch {rd.prefetch_size}) over the files and "
            f"samples the native engine would read, {order}; "
            f"{FRAMEWORK_LOADERS['tensorflow']['reads'][cfg.dataset.format]}")

# native engine settings without effect when the framework loader reads, and the reverse
NATIVE_ONLY = ("reader.access", "reader.fd_cache_size", "reader.keep_data")

FRAMEWORK_ONLY = ("reader.pin_memory", "reader.multiprocessing_context")


def _engine_notes(cfg, library_read: str = "") -> list[str]:
    """Reader keys set for the other engine than the one that runs."""
    if cfg.reader.engine == "native" and library_read:
        keys = keys_set(cfg, ("reader.access", "reader.fd_cache_size") + FRAMEWORK_ONLY)
        why = (f"the h5py reader ({library_read}): reader.read_type decides how long files "
               "stay open, h5py how they are read")
    elif cfg.reader.engine == "framework" and cfg.reader.data_loader == "tensorflow":
        keys = keys_set(cfg, NATIVE_ONLY + FRAMEWORK_ONLY)
        why = ("reader.engine framework with reader.data_loader tensorflow: the tf.data "
               "pipeline reads the plan's samples with its own threads and buffers (no "
               "worker processes)")
    elif cfg.reader.engine == "framework":
        keys = keys_set(cfg, NATIVE_ONLY)
        why = ("reader.engine framework: they set how the native engine opens, keeps and "
               "watches files; the loader's Dataset reads as DLIO's reader does")
    else:
        keys = keys_set(cfg, FRAMEWORK_ONLY)
        why = ("reader.engine native, which reads with the C engine's threads into its own "
               "buffers; they set the torch DataLoader that reader.engine framework runs")
    notes = [f"{', '.join(keys)}: no effect with {why}"] if keys else []
    rd = cfg.reader
    if rd.engine == "framework" and rd.io_watchdog_abort and rd.io_watchdog_seconds > 0 and (
            rd.data_loader != "pytorch" or rd.read_threads == 0):
        notes.append("reader.io_watchdog_abort: true: a batch waited for longer than "
                     "reader.io_watchdog_seconds is reported, not ended: the "
                     + ("tf.data pipeline" if rd.data_loader != "pytorch" else
                        "torch DataLoader without workers") + " reads in this process, where "
                     "a stuck read cannot be interrupted (the DataLoader's workers can: "
                     "reader.read_threads > 0)")
    return notes


def plan_notes(cfg, library_read: str = "") -> tuple[str, ...]:
    """The settings that have no effect or act differently in dlio-mpi."""
    reads = cfg.workflow.train and cfg.dataset.format in implemented_formats()
    notes = ([loader_note(cfg, library_read)] if reads else []) + support_notes(cfg) \
        + _columns_notes(cfg) + _sized_notes(cfg)
    if reads:
        notes += (_mpiio_notes(cfg.reader) + _engine_notes(cfg, library_read)
                  + _keep_data_notes(cfg.reader, library_read))
    if cfg.storage.storage_type == "direct_fs":
        notes.append("storage.storage_type=direct_fs: the data under storage.storage_root read "
                     "with O_DIRECT (reader.odirect: true), as MLPerf's DLIO fork reads it "
                     "through s3dlio's direct:// mode; the same files as local_fs")
    return tuple(notes + _checkpoint_notes(cfg))


def _keep_data_notes(rd, library_read: str = "") -> list[str]:
    """reader.keep_data false (ours; DLIO has no such key): where the reads land instead of
    the batches. The framework engine's note (no effect) and reader.staging replicated's
    reader line say it for those."""
    if rd.keep_data or rd.engine == "framework" or rd.staging == "replicated":
        return []
    if rd.staging == "read_once":
        return ["reader.keep_data: false: no effect with reader.staging read_once, whose "
                "exchange delivers every step's samples into the batch from the ranks' copies"]
    if library_read:
        lands = "each sample h5py reads is dropped once read"
    elif rd.file_access in ("shared", "mpio", "collective"):
        lands = ("every MPI-IO read lands in one reused batch buffer (no ring of "
                 "reader.prefetch_size + 1)")
    else:
        lands = "every read lands in one small buffer per reader thread (no ring of batches)"
    return [f"reader.keep_data: false: {lands} and no batch is kept: the same system calls and "
            "bytes from storage as with true, without the batches' memory traffic"]


def _columns_notes(cfg) -> list[str]:
    """dataset.parquet.columns size the samples (config.loader.columns_decide_samples)."""
    ds = cfg.dataset
    if ds.format != "parquet" or not ds.parquet.columns:
        return []
    row = sum(column.row_bytes for column in ds.parquet.columns)
    read = [c for c in ds.parquet.columns if c.read] or list(ds.parquet.columns)
    told = ds.record_length_bytes
    length = (f"; dataset.record_length_bytes={number_text(told)} has no effect (MLPerf's "
              "DLIO fork writes the columns and ignores it)" if told != row else "")
    return [f"dataset.parquet.columns: a sample is a row of {len(ds.parquet.columns)} columns, "
            f"{row} bytes of values{length}; training reads {len(read)} of them, "
            f"{sum(c.row_bytes for c in read)} bytes a sample (only their column chunks)"]


def _sized_notes(cfg) -> list[str]:
    """Formats whose sizes depend on the content: the plan's bytes are estimates."""
    from ..formats import format_for

    fmt = cfg.dataset.format
    if fmt not in implemented_formats() or not (configured := format_for(cfg.dataset)
                                                ).sizes_recorded:
        return []
    if configured.record_width:  # parquet, compressed or of varying sizes
        return [f"dataset.format={fmt} with dataset.compression={cfg.dataset.compression} and "
                f"dataset.record_length_bytes_stdev={cfg.dataset.record_length_bytes_stdev:g}: "
                "the files' row groups depend on the content or differ from file to file, so "
                "the plan's dataset and epoch bytes are estimates (the uncompressed files'); "
                "generation records each file's row groups and footer (beside its manifest) "
                "and the run reads exactly those"]
    return [f"dataset.format={fmt}: file sizes depend on the content, so the plan's dataset "
            "and epoch bytes are estimates; generation records each file's size (beside its "
            "manifest) and the run reads exactly those files whole"]


def _checkpoint_notes(cfg) -> list[str]:
    """Checkpoint keys set where they cannot act in this run."""
    ck = cfg.checkpoint
    idle: list[tuple[list[str], str]] = []
    if not cfg.workflow.checkpoint:
        idle.append((keys_set(cfg, ("checkpoint", "model.")),
                     "workflow.checkpoint is false (they size and drive checkpoints)"))
    elif cfg.workflow.train:
        idle.append((keys_set(cfg, ("checkpoint.num_checkpoints_write",
                                    "checkpoint.num_checkpoints_read",
                                    "checkpoint.time_between_checkpoints",
                                    "checkpoint.recovery_rank_shift")),
                     "they drive the checkpoint-only workflow (workflow.train false); "
                     "training writes checkpoints and restores none, as in DLIO"))
    else:
        idle.append((keys_set(cfg, ("checkpoint.steps_between_checkpoints",
                                    "checkpoint.checkpoint_after_epoch",
                                    "checkpoint.epochs_between_checkpoints")),
                     "they place checkpoints in training, and workflow.train is false"))
    if cfg.workflow.checkpoint and ck.layout != "shared":
        idle.append((keys_set(cfg, ("checkpoint.mpiio_hints",)),
                     "checkpoint.layout file_per_rank writes without MPI-IO"))
    if ck.layout != "dcp":
        idle.append((keys_set(cfg, ("checkpoint.dcp.",)),
                     f"checkpoint.layout is {ck.layout}, not dcp"))
    return [f"{', '.join(keys)}: no effect here: {why}" for keys, why in idle if keys]


def _mpiio_notes(rd) -> list[str]:
    """What the MPI-IO backends make of the native engine's settings."""
    if rd.file_access not in ("shared", "mpio", "collective"):
        return []
    if rd.file_access == "collective":
        notes = [f"reader.read_threads={rd.read_threads}: no effect with "
                 "reader.file_access=collective, whose reader thread makes one collective read "
                 "per file and step"]
    else:
        notes = [f"reader.read_threads={rd.read_threads}: reader.file_access={rd.file_access} "
                 "reads on one thread per rank, one blocking MPI-IO read per request"]
    if rd.file_access == "collective":
        notes.append(f"reader.fd_cache_size={rd.fd_cache_size}: no effect with "
                     "reader.file_access=collective, which keeps every file it read open (until "
                     "the epoch's end with reader.access: loader)")
    from ..mpi.library import is_open_mpi

    if is_open_mpi():
        notes.append(f"reader.prefetch_size={rd.prefetch_size}: under Open MPI the MPI-IO "
                     "backends read each batch when the step asks for it, on the step loop's "
                     "thread (its MPI-IO layer is not thread-safe): no read ahead, no watchdog")
    if rd.odirect:
        notes.append("reader.odirect: true asks MPI-IO for O_DIRECT with the direct_read hint, "
                     "which ROMIO honours on some file systems only; summary.json says whether "
                     "it was reported back (dlio_mpi.readers)")
    return notes


def unused_hints_note(cfg, splits, ranks: int) -> tuple[str, ...]:
    """reader.mpiio_hints set where nothing opens a file through MPI-IO: the native engine
    reads and generation (if any) deals files out."""
    if not cfg.reader.mpiio_hints or cfg.reader.file_access not in ("multi", "posix"):
        return ()
    from ..data.generate import writes_collectively

    if cfg.workflow.generate_data and splits and writes_collectively(splits, ranks):
        return ()
    return ("reader.mpiio_hints: no effect here: reader.file_access="
            f"{cfg.reader.file_access} reads with the native engine and no file is written "
            "through MPI-IO (the hints act with reader.file_access shared or collective, and "
            "in collective generation: fewer files than ranks)",)
