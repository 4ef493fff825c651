"""The derived plan of a run: what will be read, by how many ranks, in how many steps, and how
that compares with the nodes' memory. Computed from the configuration alone (no storage I/O),
on every rank, before anything is touched; `dlio-mpi validate` prints it."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..config import keys_set, support_notes
from ..data.dataset import DatasetSplit, LayoutTable, describe_dataset
from ..errors import UserError
from ..formats import implemented_formats, library_read_reason, read_refusal
from ..formats.loader import TF_BUFFER
from ..mpi.topology import emulated_ranks_per_node, host_info, plan_topology
from ..readers import (
    ALIASES,
    FRAMEWORK_LOADERS,
    batches_in_flight,
    engine_refusal,
    torch_prefetch_factor,
)
from ..sampling.requests import READ_MODES
from ..sampling.sharding import steps_per_epoch
from ..storage.filesystems import setstripe_args
from ..tiers.stage_in import check_folders

MAX_FILE_BYTES = 2**62  # the C engine refuses offsets past INT64_MAX / 2 (csrc/dio_engine.c)
MAX_SAMPLES = 2**62     # sample ids are int64 everywhere
MAX_PATH_BYTES = 4095   # the C engine formats file names into 4096-byte buffers (PATH_MAX_LEN)
SHAPE_BYTES_PER_FILE = 8  # drawn sample shapes: two int32 per file, on every rank
# What DLIO's pytorch and tensorflow readers do per read mode, for the plan's loader note
_PATTERNS = {"file": "the whole file loaded for every sample",
             "file_once": "each file loaded once, whole, for all its samples",
             "sample": "a read of each sample's extent"}


@dataclass(frozen=True)
class RunPlan:
    ranks: int
    format: str
    read_mode: str
    train_files: int
    train_samples: int
    samples_per_rank: int          # per epoch, after drop_last
    steps_per_epoch: int
    eval_steps_per_epoch: int      # 0 without workflow.evaluation
    epochs: int
    dataset_bytes: int             # train + valid, as generated
    bytes_per_epoch: int           # expected bytes read per epoch, all ranks
    memory_bytes: int              # memory of all hosts of the job together
    ranks_per_node: int            # on rank 0's node (DLIO's npernode)
    nodes: int
    notes: tuple[str, ...] = ()    # what this version does differently from the config's ask
    # why the format's library (h5py) reads the training files instead of the C engine
    # (formats.library_read_reason; '' when the C engine reads them at their file offsets)
    library_read: str = ""
    # one checkpoint's sizing (checkpoint.sizing.CheckpointLayout.summary()) with
    # workflow.checkpoint, else None
    checkpoint: Mapping | None = None
    # The splits and their expected layouts, computed once here and reused by generation and
    # reading (they cost seconds at a million files).
    splits: Mapping[str, DatasetSplit] = field(default_factory=dict, repr=False, compare=False)
    layouts: Mapping[str, LayoutTable] = field(default_factory=dict, repr=False, compare=False)

    @property
    def bytes_per_node_epoch(self) -> int:
        return self.bytes_per_epoch * self.ranks_per_node // self.ranks

    @property
    def fits_in_memory(self) -> bool:
        """Could the hosts' page caches together hold the whole dataset? Then later epochs
        may be served from memory and reflect the page cache, not the storage."""
        return self.dataset_bytes <= self.memory_bytes


def resolve_read_mode(cfg, data_loader: str | None = None) -> str:
    """reader.read_mode, with 'auto' following DLIO's reader for `data_loader` (default:
    reader.data_loader): extents for indexed formats, else the whole file per sample
    (on_demand) or once per epoch (memory). DLIO's tensorflow loader walks a file's samples
    one after the other on one thread and loads the file once for them, so with several
    samples per file it reads each file once per epoch even on_demand."""
    mode = cfg.reader.read_mode
    if mode != "auto":
        return mode
    if cfg.dataset.format in ("indexed_binary", "mmap_indexed_binary", "hdf5"):
        return "sample"
    if cfg.dataset.format == "parquet" and cfg.reader.engine == "native":
        return "sample"  # row groups, as MLPerf Storage's parquet readers read them
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
    if fmt == "parquet":
        rows, per_file = cfg.dataset.parquet.row_group_size, cfg.dataset.num_samples_per_file
        return (f"reader.data_loader={loader}: the native C engine reads parquet by row group "
                f"(dataset.parquet.row_group_size={rows}: {-(-per_file // rows)} in each file of "
                f"{per_file} samples), as pq.ParquetFile(path).read_row_group does (the file's "
                "footer when it is "
                "first opened in the epoch, then each row group holding planned samples once, "
                "its other samples from memory; MLPerf Storage's parquet readers), where "
                "DLIO's parquet reader loads whole files with pq.read_table (reader.read_mode "
                f"file or file_once); {tail}")
    if fmt == "tfrecord" and resolve_read_mode(cfg) != "sample":
        buffer = cfg.reader.transfer_size or TF_BUFFER
        return (f"reader.data_loader={loader}: the native C engine reads tfrecord as DLIO's "
                "tensorflow reader's tf.data.TFRecordDataset streams it: each file of the plan "
                f"once, whole, in preads of buffer_size={buffer:,} bytes ("
                + ("reader.transfer_size" if cfg.reader.transfer_size
                   else "reader.transfer_size unset: TensorFlow's") + "), "
                f"files read by reader.read_threads threads at once; {tail}")
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
              if rd.read_type == "memory" and cfg.dataset.format != "indexed_binary" else "")
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
    if cfg.dataset.format != "tfrecord":
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


def access_order_refusal(cfg) -> str | None:
    """reader.access_order sorted reorders the plan's reads per batch: refused where no
    planned read per batch goes to storage in the plan's order (the framework loaders read as
    their own samplers and workers decide; read_once reads every file before the epochs)."""
    if cfg.reader.access_order != "sorted":
        return None
    if cfg.reader.engine == "framework":
        return ("reader.access_order: sorted with reader.engine framework is not implemented "
                "yet (the real loader orders its own reads); accepted: reader.access_order "
                "shuffled, or reader.engine native")
    if cfg.reader.staging == "read_once":
        return ("reader.access_order: sorted with reader.staging read_once is not implemented "
                "yet (the files are read once, whole, before the first epoch: there are no "
                "reads per batch to order); accepted: reader.access_order shuffled, or "
                "reader.staging none")
    return None


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


def _epoch_bytes(split: DatasetSplit, layouts: LayoutTable, mode: str, samples_read: int) -> int:
    """Expected bytes read per epoch when `samples_read` samples of `split` are consumed
    (exact integer arithmetic: products of sizes and counts overflow int64 at scale)."""
    if split.num_samples == 0:
        return 0
    units = layouts.units() if mode == "sample" else None
    if units is not None:  # every row group once, and the footer reads at each open
        return units.total(split.num_files) * samples_read // split.num_samples
    if mode == "sample":
        per_split = layouts.total("sample_span") * split.samples_per_file
    elif mode == "file":
        per_split = layouts.total("size") * split.samples_per_file
    else:
        per_split = layouts.total("size")
    return per_split * samples_read // split.num_samples


def _steps(split: DatasetSplit, ranks: int, batch: int, batch_key: str, files_key: str) -> int:
    """Steps per epoch on every rank; raises UserError when a rank's share cannot fill a batch."""
    share = split.num_samples // ranks
    if batch > share:
        raise UserError(
            f"{batch_key}={batch} is larger than a rank's share of the {split.name} samples "
            f"({split.num_samples} samples / {ranks} ranks = {share}); lower the batch size "
            f"or add files ({files_key})")
    return steps_per_epoch(split.num_samples, ranks, batch)


def _check_measurable(steps: int, cfg, phase: str) -> None:
    """AU excludes the first and last steps of an epoch; some must remain to be measured."""
    metric = cfg.output.metric
    if steps <= metric.exclude_start_steps + metric.exclude_end_steps:
        raise UserError(
            f"{phase} has {steps} steps per epoch, but output.metric.exclude_start_steps="
            f"{metric.exclude_start_steps} and exclude_end_steps={metric.exclude_end_steps} "
            "exclude them all from AU; add files or lower the batch size or the exclusions")


def _train_steps(cfg, train: DatasetSplit, ranks: int) -> int:
    steps = _steps(train, ranks, cfg.reader.batch_size, "reader.batch_size",
                   "dataset.num_files_train")
    cap = cfg.train.total_training_steps
    if cap is not None and cap > 0:
        if cap > steps:
            raise UserError(
                f"train.total_training_steps={cap} exceeds the {steps} steps an epoch "
                f"has ({train.num_samples} samples / {ranks} ranks / batch "
                f"{cfg.reader.batch_size})")
        steps = cap
    return steps


def _notes(cfg, library_read: str = "") -> tuple[str, ...]:
    """The settings that have no effect or act differently in dlio-mpi."""
    reads = cfg.workflow.train and cfg.dataset.format in implemented_formats()
    notes = ([loader_note(cfg, library_read)] if reads else []) + support_notes(cfg) \
        + _sized_notes(cfg)
    if reads:
        notes += _mpiio_notes(cfg.reader) + _engine_notes(cfg, library_read)
    return tuple(notes + _checkpoint_notes(cfg))


def _sized_notes(cfg) -> list[str]:
    """Formats whose sizes depend on the content: the plan's bytes are estimates."""
    from ..formats import format_for, sizes_recorded

    fmt = cfg.dataset.format
    if fmt not in implemented_formats() or not sizes_recorded(configured := format_for(
            cfg.dataset)):
        return []
    if getattr(configured, "record_width", None):  # parquet, compressed or of varying sizes
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


def _check_reader_fits(cfg) -> None:
    """What only some readers do: a format read by mmap (mmap_indexed_binary: through the
    page cache, with its mapped reads), synthetic data (read by nothing)."""
    from ..formats import get_format

    fmt = get_format(cfg.dataset.format)
    if getattr(fmt, "reads_nothing", False):
        if cfg.workflow.train and cfg.reader.file_access not in ("multi", "posix"):
            raise UserError(f"reader.file_access: {cfg.reader.file_access} reads with MPI-IO, "
                            "but dataset.format synthetic reads nothing; expected multi")
        return
    if not getattr(fmt, "reads_by_mmap", False):
        return
    if cfg.reader.odirect:
        raise UserError(f"reader.odirect: true does not combine with dataset.format "
                        f"{cfg.dataset.format}, which is read through a memory mapping (the "
                        "page cache); expected false, or dataset.format indexed_binary")
    if cfg.workflow.train and cfg.reader.file_access not in ("multi", "posix"):
        raise UserError(f"reader.file_access: {cfg.reader.file_access} reads with MPI-IO, but "
                        f"dataset.format {cfg.dataset.format} is read through a memory "
                        "mapping; expected multi (or dataset.format indexed_binary)")


def _check_whole_file_reads(cfg, mode: str) -> None:
    """Formats DLIO's readers decode whole (jpeg, png: the image; csv: the table) have no
    sample extent to read: reader.read_mode sample is refused for them."""
    from ..formats import get_format

    if mode == "sample" and cfg.workflow.train \
            and getattr(get_format(cfg.dataset.format), "whole_file_only", False):
        raise UserError(f"reader.read_mode: sample reads each sample's extent, but DLIO's "
                        f"{cfg.dataset.format} reader decodes whole files (a sample is not an "
                        "extent of one); expected auto, file or file_once")


def _check_shape_memory(cfg, ranks_per_node: int, node_memory: int) -> None:
    """Drawn sample shapes are kept for every file on every rank: refuse before drawing them
    when the ranks of a node could not hold them."""
    ds = cfg.dataset
    if ds.record_dims or ds.record_length_bytes_stdev <= 0:
        return  # one shape for all files
    files = ds.num_files_train + ds.num_files_eval
    per_rank = files * SHAPE_BYTES_PER_FILE
    if per_rank * ranks_per_node > node_memory:
        raise UserError(
            f"dataset.num_files_train={ds.num_files_train} and num_files_eval="
            f"{ds.num_files_eval} with dataset.record_length_bytes_stdev: the files' drawn "
            f"sample shapes need {_memory(per_rank, ranks_per_node, node_memory)}")


def _sample_keys(ds) -> str:
    """The keys that size a sample, with their values."""
    if ds.record_dims:
        return f"dataset.record_dims={list(ds.record_dims)}"
    stdev = ds.record_length_bytes_stdev
    return (f"dataset.record_length_bytes={_number(ds.record_length_bytes)}"
            + (f" (stdev {_number(stdev)})" if stdev else ""))


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _largest_sample(split: DatasetSplit) -> int:
    """Elements of the largest sample of `split` (exact: Python ints)."""
    if len(split.dims) == 1:
        return math.prod(int(d) for d in split.dims[0])
    return int(np.prod(split.dims.astype(np.int64), axis=1).max())  # two int32 dims each


def _check_read_once_memory(cfg, ranks: int, nodes: int, node_memory: int) -> None:
    """reader.staging: read_once holds the dataset in the nodes' memory: refuse, before any
    I/O, a dataset (as generated) whose share per node would not fit 80 % of a node's."""
    ds = cfg.dataset
    per_file = ds.num_samples_per_file * ds.record_length_bytes
    files = ds.num_files_train + (ds.num_files_eval if cfg.workflow.evaluation else 0)
    per_node = -(-files // nodes) * per_file
    if per_node > 0.8 * node_memory:
        raise UserError(f"reader.staging: read_once keeps the dataset in the nodes' memory, "
                        f"about {_size(per_node)} per node ({files} files of about "
                        f"{_size(per_file)} over {nodes} node(s)), more than 80 % of a node's "
                        f"{_size(node_memory)}; expected a dataset that fits, more nodes, or "
                        "reader.staging: none")


def _check_sizes(cfg, splits: Mapping[str, DatasetSplit]) -> None:
    """Sizes the C engine and int64 arithmetic can hold, checked before any layout is
    computed (they would overflow silently)."""
    ds = cfg.dataset
    for split in splits.values():
        if not split.num_files:
            continue
        if split.num_samples > MAX_SAMPLES:
            raise UserError(
                f"dataset.num_samples_per_file={ds.num_samples_per_file}: {split.num_files} "
                f"{split.name} files hold {split.num_samples} samples, more than the 2^62 "
                f"sample ids dlio-mpi counts")
        payload = _largest_sample(split) * np.dtype(split.dtype).itemsize \
            * split.samples_per_file
        if payload > MAX_FILE_BYTES:
            raise UserError(
                f"{_sample_keys(ds)} of {ds.record_element_type} with "
                f"dataset.num_samples_per_file={ds.num_samples_per_file}: a {split.name} file "
                f"would hold {payload} bytes, more than the 2^62 bytes the engine addresses "
                f"in a file")
        longest = max(len(split.path(i).encode()) for i in (0, split.num_files - 1))
        if longest > MAX_PATH_BYTES:
            raise UserError(
                f"dataset.data_folder: {split.name} file paths would be {longest} bytes long "
                f"(storage.storage_root + data_folder + name); the engine takes at most "
                f"{MAX_PATH_BYTES}")


def _check_batch_memory(cfg, plan_bytes: int, steps: int, ranks: int, ranks_per_node: int,
                        node_memory: int) -> None:
    """The engine keeps one batch per rank in memory more than it reads ahead
    (reader.keep_data; a torch DataLoader's batches in flight, readers.batches_in_flight):
    refuse when even batches of the mean size cannot fit in a node's memory."""
    if not cfg.reader.keep_data or steps == 0:
        return
    rd = cfg.reader
    slots = batches_in_flight(rd.data_loader, rd.prefetch_size, rd.read_threads) + 1
    batch = plan_bytes // (steps * ranks)
    if slots * batch * ranks_per_node > node_memory:
        raise UserError(
            f"reader.prefetch_size={cfg.reader.prefetch_size}, reader.batch_size="
            f"{cfg.reader.batch_size} and {_sample_keys(cfg.dataset)}: {slots} batch buffers "
            f"of about {_size(batch)} need {_memory(slots * batch, ranks_per_node, node_memory)}"
            f"; lower them, or read without keeping the data (reader.keep_data: false)")


def _memory(per_rank: int, ranks_per_node: int, node_memory: int) -> str:
    """'X per rank[, Y for the N ranks of a node], more than the node's Z of memory'."""
    node = f", {_size(per_rank * ranks_per_node)} for the {ranks_per_node} ranks of a node" \
        if ranks_per_node > 1 else ""
    return (f"{_size(per_rank)} per rank{node}, more than the node's {_size(node_memory)} "
            f"of memory")


def derive_plan(cfg, ranks: int, ranks_per_node: int | None = None, nodes: int | None = None,
                memory_bytes: int | None = None, generating: bool = False,
                local_ranks: int = 1) -> RunPlan:
    """Check what needs the rank count and derive the plan; raises UserError. Without a
    topology (validate --ranks) the ranks are on one node, or on emulated nodes of
    DLIO_MPI_RANKS_PER_NODE ranks, with this host's memory each. `generating`: the data will
    be generated whatever workflow.generate_data says (`dlio-mpi generate`). `local_ranks`:
    the processes of this host deriving the plan at once (each holds its tables)."""
    # Memory is judged on the job's own nodes; a plan for ranks not running (validate) can
    # only say whether one rank would fit in this host's memory.
    known = ranks_per_node is not None and nodes is not None
    if not known:
        ranks_per_node, nodes = plan_topology(ranks, emulated_ranks_per_node())
    if memory_bytes is None:
        memory_bytes = host_info().memory_bytes * nodes
    fmt = cfg.dataset.format
    node = (ranks_per_node if known else 1, memory_bytes // nodes)
    if cfg.storage.stage_in is not None and cfg.workflow.train:
        check_folders(cfg.storage.stage_in.to,
                      os.path.join(cfg.storage.storage_root, cfg.dataset.data_folder))
    if cfg.reader.staging == "read_once" and cfg.workflow.train:
        _check_read_once_memory(cfg, ranks, nodes, memory_bytes // nodes)
    mode = resolve_read_mode(cfg)
    if mode not in READ_MODES:
        raise UserError(f"reader.read_mode: '{mode}' unknown; expected one of {READ_MODES}")
    uses_data = cfg.workflow.train or cfg.workflow.generate_data or generating
    steps = eval_steps = dataset_bytes = epoch_bytes = files = samples = 0
    splits, layouts = {}, {}
    library_read = ""
    if uses_data:
        if fmt not in implemented_formats():
            raise UserError(f"dataset.format: '{fmt}' is not implemented yet in dlio-mpi; "
                            f"implemented: {', '.join(implemented_formats())}")
        _check_reader_fits(cfg)
        _check_whole_file_reads(cfg, mode)
        _check_shape_memory(cfg, max(local_ranks, node[0]), node[1])
        splits = describe_dataset(cfg)
        _check_sizes(cfg, splits)
        train = splits["train"]
        if cfg.workflow.train and not generating:  # files the engine cannot read yet
            refusal = read_refusal(train.format, train.spec(0))
            if refusal:
                raise UserError(refusal)
            library_read = library_read_reason(train.format, train.spec(0))
        layouts = {name: split.expected_layouts() for name, split in splits.items()}
        files, samples = train.num_files, train.num_samples
        dataset_bytes = sum(table.total("size") for table in layouts.values())
        if cfg.workflow.train:
            # reader.engine with what it cannot read
            refused = engine_refusal(cfg, library_read) or access_order_refusal(cfg)
            if refused:
                raise UserError(refused)
            steps = _train_steps(cfg, train, ranks)
            _check_measurable(steps, cfg, "training")
            epoch_bytes = _epoch_bytes(train, layouts["train"], mode,
                                       steps * cfg.reader.batch_size * ranks)
            _check_batch_memory(cfg, epoch_bytes, steps, ranks, *node)
            if cfg.workflow.evaluation:
                eval_steps = _steps(splits["valid"], ranks, cfg.reader.batch_size_eval,
                                    "reader.batch_size_eval", "dataset.num_files_eval")
                _check_measurable(eval_steps, cfg, "evaluation")
    checkpoint = _checkpoint_plan(cfg, ranks, steps)
    if checkpoint is not None and checkpoint["writer"] == "pt_save":
        _check_tensor_memory(checkpoint, max(local_ranks, node[0]), node[1])
    return RunPlan(
        ranks=ranks, format=fmt, read_mode=mode, train_files=files, train_samples=samples,
        samples_per_rank=steps * cfg.reader.batch_size, steps_per_epoch=steps,
        eval_steps_per_epoch=eval_steps,
        epochs=cfg.train.epochs, dataset_bytes=dataset_bytes, bytes_per_epoch=epoch_bytes,
        memory_bytes=memory_bytes, ranks_per_node=ranks_per_node, nodes=nodes,
        notes=_notes(cfg, library_read) + _unused_hints_note(cfg, splits, ranks),
        library_read=library_read, splits=splits, layouts=layouts,
        checkpoint=checkpoint)


def _unused_hints_note(cfg, splits, ranks: int) -> tuple[str, ...]:
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


def _checkpoint_plan(cfg, ranks: int, steps: int) -> dict | None:
    """With workflow.checkpoint, one checkpoint's sizing (refusing impossible parallelism
    before any I/O; checkpoint.sizing.CheckpointLayout.summary()) and how the run writes
    and restores checkpoints; else None."""
    if not cfg.workflow.checkpoint:
        return None
    from ..checkpoint.checkpointer import restore_methods, writer_name
    from ..checkpoint.schedule import Schedule
    from ..checkpoint.sizing import checkpoint_layout

    ck = cfg.checkpoint
    sizing = checkpoint_layout(cfg, ranks).summary()
    schedule = Schedule.of(cfg, steps)
    saves, loads = schedule.saves, schedule.loads
    if cfg.workflow.train:
        if ck.steps_between_checkpoints >= 0:
            when = (f"after every {ck.steps_between_checkpoints} steps of each epoch (each "
                    "ends a block of steps)" if ck.steps_between_checkpoints else "never "
                    "(steps_between_checkpoints 0)")
        else:
            when = (f"after epoch {ck.checkpoint_after_epoch}, then every "
                    f"{ck.epochs_between_checkpoints} epoch(s)")
    else:
        pause = ck.time_between_checkpoints
        when = (f"checkpoint-only: {saves} save(s), then {loads} load(s), each after "
                + (f"{pause.mean:g} s" if pause is not None else "1 s (DLIO's default)"))
    return {**sizing, "writer": writer_name(ck), "layout": ck.layout,
            "odirect": bool(ck.odirect), "fsync": bool(ck.fsync),
            "folder": ck.checkpoint_folder, "saves": saves, "loads": loads, "when": when,
            "bytes_written": saves * sizing["total_bytes"],
            "restore_methods": restore_methods(ck) if loads else []}


def _check_tensor_memory(checkpoint: Mapping, local_ranks: int, node_memory: int) -> None:
    """checkpoint_mechanism pt_save keeps each rank's checkpoint share in memory as tensors
    (as DLIO does): refuse before any I/O when a node's ranks could not hold them."""
    try:
        from ..checkpoint.torch_save import memory_needed  # imports torch
    except ImportError as exc:
        raise UserError(f"checkpoint.checkpoint_mechanism: pt_save writes with torch.save, but "
                        f"torch cannot be imported ({exc}); install it with "
                        "pip install 'dlio-mpi[torch]' (torch==2.13.0, the CPU wheel), or use "
                        "checkpoint_mechanism native") from None
    need = memory_needed(checkpoint["bytes_per_rank"][1], local_ranks)
    if need > node_memory:
        raise UserError(f"checkpoint.checkpoint_mechanism: pt_save holds each rank's share of a "
                        f"checkpoint in memory as tensors (and a file's worth more while a load "
                        f"checks it): {need / 2**30:,.1f} GiB for the {local_ranks} rank(s) of a "
                        f"node, which has {node_memory / 2**30:,.1f} GiB; expected "
                        "checkpoint_mechanism native (streams from one buffer), or a smaller "
                        "share (checkpoint.mode subset, more ranks)")


def _duration(seconds: float) -> str:
    for unit, length in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600),
                         ("minutes", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.3g} s"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def _filesystem_text(name: str, info: Mapping) -> str:
    """'data_folder: lustre at /lus (srv:/fs), default layout 4 stripes of 1.0 MiB'."""
    text = f"{name}: {info['type']} at {info['mount_point']}"
    if info.get("device") not in (None, "unknown"):
        text += f" ({info['device']})"
    if info["type"] == "gpfs" and info.get("block_size"):
        text += f", block size {_size(info['block_size'])}"
    layout = info.get("stripe_layout") or {}
    if "stripe_count" in layout:
        count = layout["stripe_count"]
        text += (f", default layout {'all OSTs' if count == -1 else f'{count} stripe(s)'} of "
                 f"{_size(layout.get('stripe_size', 0))}"
                 + (f" in pool {layout['pool']}" if layout.get("pool") else ""))
    elif layout:
        text += (", composite default layout" if "components" in layout
                 else f", layout unknown ({layout.get('error', 'unreadable')})")
    return text


def storage_lines(cfg, data_folder: str | None, filesystems: Mapping[str, Mapping] | None = None,
                  striping: Mapping | None = None) -> list[str]:
    """Plan lines on the run's file systems (filesystems.describe_filesystems) and the
    striping storage.lustre asks for (filesystems.check_striping's outcome when known);
    `data_folder` None: the run uses no data set."""
    lines = [f"file system     {_filesystem_text(name, info)}"
             for name, info in (filesystems or {}).items()]
    lustre = cfg.storage.lustre
    if lustre is None or data_folder is None:
        return lines
    args = setstripe_args(lustre, data_folder)
    command = shlex.join(["lfs", *args]) if args else "no lfs setstripe (no layout asked for)"
    if striping is not None and "note" in striping and striping["status"] != "planned":
        lines.append(f"striping        {striping['note']}")
    else:
        when = "" if striping is not None else " if the data folder is on Lustre"
        lines.append(f"striping        storage.lustre: {command}{when}, before files are "
                     "created; files already there keep their layout"
                     + (" (storage.lustre.required)" if lustre.required else ""))
    # The MPI-IO backend takes striping hints too: they set the layout of the files
    # MPI-IO creates, at creation, whatever the folder's default says.
    hints = getattr(cfg.reader, "mpiio_hints", None) or {}
    striping_hints = sorted(set(hints) & {"striping_factor", "striping_unit"})
    if args and striping_hints:
        lines.append(f"note            reader.mpiio_hints {', '.join(striping_hints)} set the "
                     "layout of files MPI-IO creates, storage.lustre the folder's default for "
                     "the others; the layout a data file took is in summary.json")
    return lines


def plan_record(plan: RunPlan, cfg, filesystems: Mapping[str, Mapping] | None = None,
                striping: Mapping | None = None, warnings: tuple[str, ...] = ()) -> dict:
    """The plan as plain data, ready for JSON (`dlio-mpi validate --json` prints it) and the
    one source describe_plan renders as text: counts, batch sizes and bytes as integers,
    `storage` the file system and striping lines (storage_lines), `notes` the plan's notes,
    `warnings` what the storage at hand says against the run (validate: not enough space).
    `filesystems` (describe_filesystems) and `striping` (check_striping), when given, add what
    rank 0 found on the storage."""
    uses_data = bool(cfg.workflow.train or cfg.workflow.generate_data)
    compute = cfg.train.computation_time.mean
    valid = plan.splits.get("valid")
    page_cache_note = None
    if uses_data and plan.fits_in_memory and not (cfg.reader.odirect
                                                  or cfg.reader.drop_page_cache):
        page_cache_note = (f"the dataset fits in the memory of the {plan.nodes} node(s): after "
                           "the first epoch reads may come from the page cache (reader.odirect: "
                           "true or reader.drop_page_cache: true avoid it)")
    data_folder = plan.splits["train"].root if plan.splits else None
    record = {
        "workload": cfg.model.name,
        "format": plan.format,
        "read_mode": plan.read_mode,
        "odirect": bool(cfg.reader.odirect),
        "file_access": cfg.reader.file_access,  # the reader backend
        "engine": cfg.reader.engine,  # native, or the real loader (framework)
        "ranks": plan.ranks,
        "ranks_per_node": plan.ranks_per_node,
        "nodes": plan.nodes,
        "uses_dataset": uses_data,  # false: workflow.train and workflow.generate_data are off
        "train": {
            "files": plan.train_files,
            "samples": plan.train_samples,
            "samples_per_file": cfg.dataset.num_samples_per_file,
            "steps_per_epoch": plan.steps_per_epoch,
            "batch_size": cfg.reader.batch_size,
            "samples_per_rank": plan.samples_per_rank,
        },
        "eval": {
            "files": valid.num_files if valid else 0,
            "samples": valid.num_samples if valid else 0,
            "steps_per_epoch": plan.eval_steps_per_epoch,  # 0: no evaluation
            "batch_size": cfg.reader.batch_size_eval,
            "after_epoch": cfg.evaluation.eval_after_epoch,
            "epochs_between": cfg.evaluation.epochs_between_evals,
        },
        "epochs": plan.epochs,
        "computation_time_seconds": compute,  # mean per step
        "compute_seconds": (plan.epochs * plan.steps_per_epoch * compute
                            if cfg.workflow.train else None),
        "bytes_per_epoch": plan.bytes_per_epoch,  # all ranks
        "bytes_per_node_per_epoch": plan.bytes_per_node_epoch,
        "dataset_bytes": plan.dataset_bytes,  # train + valid
        "memory_bytes": plan.memory_bytes,  # all nodes
        "fits_in_memory": plan.fits_in_memory,
        "page_cache_note": page_cache_note,
        "generation": (_generation(plan) if uses_data and cfg.workflow.generate_data
                       and plan.splits else None),
        "storage": storage_lines(cfg, data_folder, filesystems, striping),
        "notes": list(plan.notes),
        "warnings": list(warnings),
    }
    # Further top-level entries go here, one line each.
    record["reader"] = (reader_text(cfg, plan.library_read) if uses_data and cfg.workflow.train
                        else None)
    record["checkpoint"] = dict(plan.checkpoint) if plan.checkpoint is not None else None
    return record


def reader_text(cfg, library_read: str = "") -> str:
    """What reads the training data: the engine, the backend and the access (`library_read`:
    RunPlan.library_read)."""
    rd = cfg.reader
    access = ALIASES.get(rd.file_access, rd.file_access)
    if rd.staging == "read_once":
        return ("reader.staging read_once: every file read once into the ranks' memory before "
                "the first epoch (file f on rank f mod ranks), each step's samples delivered "
                "from there by one MPI_Alltoallv")
    if rd.cache is not None:
        return (f"engine native: the native C engine (threads, prefetch ring, pread) with the "
                f"access pattern of DLIO's {rd.data_loader} reader, through a node-local cache "
                f"in {rd.cache.folder} (policy {rd.cache.policy})")
    if rd.engine == "native" and library_read:
        return (f"engine native: h5py in {max(rd.read_threads, 1)} reader thread(s), not the "
                f"C engine, because {library_read}; reader.file_access {rd.file_access}, "
                f"reader.read_type {rd.read_type}")
    if rd.engine == "framework":
        loader = FRAMEWORK_LOADERS.get(rd.data_loader, {}).get("loader", rd.data_loader)
        return (f"engine framework: a real {loader} per rank (reader.data_loader "
                f"{rd.data_loader}), reader.file_access {rd.file_access}")
    backend = {"multi": "the native C engine (threads, prefetch ring, pread)",
               "shared": "MPI-IO independent reads", "collective": "MPI-IO collective reads"}
    return (f"engine native: {backend[access]}, reader.file_access {rd.file_access}, with the "
            f"access pattern of DLIO's {rd.data_loader} reader")


def describe_plan(plan: RunPlan, cfg, filesystems: Mapping[str, Mapping] | None = None,
                  striping: Mapping | None = None, warnings: tuple[str, ...] = ()) -> str:
    """The plan as a few lines of text, rendered from plan_record (same arguments)."""
    return render_plan(plan_record(plan, cfg, filesystems, striping, warnings))


def render_plan(r: Mapping) -> str:
    """plan_record's data as the text plan `validate` and `run` print."""
    train, ev = r["train"], r["eval"]
    lines = [
        f"workload        {r['workload']}: {r['format']}, read mode {r['read_mode']}, "
        f"O_DIRECT {'on' if r['odirect'] else 'off'}" if r["uses_dataset"] else
        f"workload        {r['workload']}: no dataset",
        f"ranks           {r['ranks']} ({r['ranks_per_node']} per node)",
    ]
    if not r["uses_dataset"]:
        lines.append("dataset         none: workflow.train and workflow.generate_data are off")
    else:
        compute = r["computation_time_seconds"]
        lines += [
            f"training data   {train['files']} files, {train['samples']} samples "
            f"({train['samples_per_file']} per file)",
            f"per epoch       {train['steps_per_epoch']} steps of batch {train['batch_size']} "
            f"per rank = {train['samples_per_rank']} samples per rank; {r['epochs']} epochs",
            *([f"run time        the run's compute alone takes "
               f"{_duration(r['compute_seconds'])} (epochs x steps x computation_time: "
               f"{r['epochs']} x {train['steps_per_epoch']} x {compute:g} s)"]
              if r["compute_seconds"] is not None else []),
            *([f"evaluation      {ev['steps_per_epoch']} steps of batch {ev['batch_size']} per "
               f"rank after epoch {ev['after_epoch']}, then every {ev['epochs_between']}"]
              if ev["steps_per_epoch"] else []),
            f"bytes per epoch {_size(r['bytes_per_epoch'])} read by all ranks "
            f"({_size(r['bytes_per_node_per_epoch'])} per node)",
            f"dataset size    {_size(r['dataset_bytes'])} vs {_size(r['memory_bytes'])} of "
            f"memory on the {r['nodes']} node(s)",
        ]
        if r.get("reader"):
            lines.append(f"reader          {r['reader']}")
        if r["page_cache_note"]:
            lines.append(f"note            {r['page_cache_note']}")
        if r["generation"]:
            lines.append(f"generation      {r['generation']['text']}")
    if r.get("checkpoint"):
        ck = r["checkpoint"]
        low, high = ck["bytes_per_rank"]
        files_low, files_high = ck["files_per_rank"]
        per_rank = _size(low) if low == high else f"{_size(low)} to {_size(high)}"
        files = str(files_low) if files_low == files_high else f"{files_low} to {files_high}"
        lines.append(f"checkpoint      {_size(ck['total_bytes'])} per checkpoint, written by "
                     f"{ck['writers']} of {ck['ranks']} ranks: {per_rank} and {files} file(s) "
                     f"per rank (TP {ck['tensor']}, PP {ck['pipeline']}, DP {ck['data']}, "
                     f"ZeRO {ck['zero_stage']}, {ck['mode']} mode)")
        writer = {"file_per_rank": "each rank its own files (C core)",
                  "shared": "one shared file per checkpoint (MPI-IO Write_at_all)",
                  "pt_save": "each rank its own files through torch.save"}[ck["writer"]]
        restore = (f"; restores defeat the page cache by {' + '.join(ck['restore_methods'])}"
                   if ck["restore_methods"] else "")
        lines.append(f"checkpoints     {ck['when']}; {ck['saves']:,} checkpoint(s) "
                     f"({_size(ck['bytes_written'])}, all kept) in {ck['folder']}: {writer}, "
                     f"O_DIRECT {'on' if ck['odirect'] else 'off'}, fsync "
                     f"{'on' if ck['fsync'] else 'off'}"
                     + (" (dlio-mpi's default, as MLPerf Storage requires; DLIO's is off and "
                        "its fsync never happens)" if ck["fsync"] else "") + restore)
    lines += r["storage"]
    lines.extend(f"note            {note}" for note in r["notes"])
    lines.extend(f"warning         {warning}" for warning in r["warnings"])
    return "\n".join(lines)


def _generation(plan: RunPlan) -> dict:
    """How generation will write the files: {"how": "collective" (all ranks together through
    MPI-IO), "whole_files" (fewer files than ranks, one rank a file) or "round_robin",
    "files", "writers" (ranks writing), "text" (the plan's generation line)}."""
    from ..data.generate import writes_collectively

    files = sum(s.num_files for s in plan.splits.values())
    if writes_collectively(plan.splits, plan.ranks):
        how, writers = "collective", plan.ranks
        text = (f"all {files} file(s) written by all {plan.ranks} ranks together, through "
                "MPI-IO (Write_at_all), fewer files than ranks")
    elif files < plan.ranks:
        how, writers = "whole_files", files
        from ..formats import get_format

        why = getattr(get_format(plan.format), "written_whole", "")
        text = (f"{files} file(s) dealt out to {files} of the {plan.ranks} ranks: {plan.format} "
                "cannot be written in parts" + (f" ({why})" if why else ""))
    else:
        how, writers = "round_robin", plan.ranks
        text = f"{files} files dealt out round-robin to the {plan.ranks} ranks"
    return {"how": how, "files": files, "writers": writers,
            "text": f"{text} (files already complete are kept)"}
