"""The checks that need the derived plan (steps, bytes, memory per node): each refuses with one
message naming the keys, the values and what would be accepted. Per-key rules live in the
schema, a backend's limits on the backend."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..data.dataset import DatasetSplit
from ..errors import UserError, install_hint
from ..readers import (
    batches_in_flight,
)
from .limits import MAX_FILE_BYTES, MAX_PATH_BYTES, MAX_SAMPLES, SHAPE_BYTES_PER_FILE
from .units import number_text, size_text


def access_order_refusal(cfg) -> str | None:
    """reader.access_order sorted reorders the plan's reads per batch: refused where no
    planned read per batch goes to storage in the plan's order (the framework loaders read as
    their own samplers and workers decide; reader.staging reads every file before the epochs)."""
    if cfg.reader.access_order != "sorted":
        return None
    if cfg.reader.engine == "framework":
        return ("reader.access_order: sorted with reader.engine framework is not implemented "
                "yet (the real loader orders its own reads); accepted: reader.access_order "
                "shuffled, or reader.engine native")
    if cfg.reader.staging != "none":
        return (f"reader.access_order: sorted with reader.staging {cfg.reader.staging} is not "
                "implemented yet (the files are read whole before the first epoch: there are "
                "no reads per batch to order); accepted: reader.access_order shuffled, or "
                "reader.staging none")
    return None


def check_measurable(steps: int, cfg, phase: str) -> None:
    """AU excludes the first and last steps of an epoch; some must remain to be measured."""
    metric = cfg.output.metric
    if steps <= metric.exclude_start_steps + metric.exclude_end_steps:
        raise UserError(
            f"{phase} has {steps} steps per epoch, but output.metric.exclude_start_steps="
            f"{metric.exclude_start_steps} and exclude_end_steps={metric.exclude_end_steps} "
            "exclude them all from AU; add files or lower the batch size or the exclusions")


def check_reader_fits(cfg) -> None:
    """What only some readers do: a format read by mmap (mmap_indexed_binary: through the
    page cache, with its mapped reads), synthetic data (read by nothing)."""
    from ..formats import get_format

    fmt = get_format(cfg.dataset.format)
    if fmt.reads_nothing:
        if cfg.workflow.train and cfg.reader.file_access not in ("multi", "posix"):
            raise UserError(f"reader.file_access: {cfg.reader.file_access} reads with MPI-IO, "
                            "but dataset.format synthetic reads nothing; expected multi")
        return
    if not fmt.reads_by_mmap:
        return
    if cfg.reader.odirect:
        raise UserError(f"reader.odirect: true does not combine with dataset.format "
                        f"{cfg.dataset.format}, which is read through a memory mapping (the "
                        "page cache); expected false, or dataset.format indexed_binary")
    if cfg.workflow.train and cfg.reader.file_access not in ("multi", "posix"):
        raise UserError(f"reader.file_access: {cfg.reader.file_access} reads with MPI-IO, but "
                        f"dataset.format {cfg.dataset.format} is read through a memory "
                        "mapping; expected multi (or dataset.format indexed_binary)")


def check_whole_file_reads(cfg, mode: str) -> None:
    """Formats DLIO's readers decode whole (jpeg, png: the image; csv: the table) have no
    sample extent to read: reader.read_mode sample is refused for them."""
    from ..formats import get_format

    if mode == "sample" and cfg.workflow.train \
            and get_format(cfg.dataset.format).whole_file_only:
        raise UserError(f"reader.read_mode: sample reads each sample's extent, but DLIO's "
                        f"{cfg.dataset.format} reader decodes whole files (a sample is not an "
                        "extent of one); expected auto, file or file_once")


def check_shape_memory(cfg, ranks_per_node: int, node_memory: int) -> None:
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
    return (f"dataset.record_length_bytes={number_text(ds.record_length_bytes)}"
            + (f" (stdev {number_text(stdev)})" if stdev else ""))


def _largest_sample(split: DatasetSplit) -> int:
    """Elements of the largest sample of `split` (exact: Python ints)."""
    if len(split.dims) == 1:
        return math.prod(int(d) for d in split.dims[0])
    return int(np.prod(split.dims.astype(np.int64), axis=1).max())  # two int32 dims each


def staging_memory(cfg, ranks_per_node: int, nodes: int) -> tuple[int, str, str]:
    """What reader.staging holds of the dataset (as generated) in a node's memory: read_once
    a node's share of it, replicated a copy on every rank (ranks per node x the dataset, none
    with reader.keep_data false, which reads into one buffer). (bytes per node, what is held,
    what would hold less); (0, "", "") when it holds nothing."""
    rd, ds = cfg.reader, cfg.dataset
    if not cfg.workflow.train or rd.staging == "none" \
            or (rd.staging == "replicated" and not rd.keep_data):
        return 0, "", ""
    per_file = ds.num_samples_per_file * ds.record_length_bytes
    files = ds.num_files_train + (ds.num_files_eval if cfg.workflow.evaluation else 0)
    if rd.staging == "replicated":
        per_node = ranks_per_node * files * per_file
        return (per_node,
                f"a copy of the dataset in every rank's memory, about {size_text(per_node)} "
                f"per node ({ranks_per_node} rank(s) of a node each holding {files} files of "
                f"about {size_text(per_file)})",
                "fewer ranks per node, reader.keep_data: false (every file read, none kept), "
                "or reader.staging: none")
    per_node = -(-files // nodes) * per_file
    return (per_node,
            f"the dataset in the nodes' memory, about {size_text(per_node)} per node "
            f"({files} files of about {size_text(per_file)} over {nodes} node(s))",
            "more nodes, or reader.staging: none")


def check_staging_memory(cfg, ranks_per_node: int, nodes: int, node_memory: int) -> None:
    """Refuse, before any I/O, reader.staging that would hold more than 80 % of a node's
    memory (staging_memory)."""
    per_node, held, other = staging_memory(cfg, ranks_per_node, nodes)
    if per_node > 0.8 * node_memory:
        raise UserError(f"reader.staging: {cfg.reader.staging} keeps {held}, more than 80 % "
                        f"of a node's {size_text(node_memory)}; expected a dataset that fits, "
                        f"{other}")


def check_sizes(cfg, splits: Mapping[str, DatasetSplit]) -> None:
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


def check_batch_memory(cfg, plan_bytes: int, steps: int, ranks: int, ranks_per_node: int,
                        node_memory: int) -> None:
    """The engine keeps one batch per rank in memory more than it reads ahead
    (reader.keep_data; a torch DataLoader's batches in flight, readers.batches_in_flight):
    refuse when even batches of the mean size cannot fit in a node's memory."""
    if not cfg.reader.keep_data or steps == 0:
        return
    slots, batch = _batch_buffers(cfg, plan_bytes, steps, ranks)
    if slots * batch * ranks_per_node > node_memory:
        raise UserError(
            f"reader.prefetch_size={cfg.reader.prefetch_size}, reader.batch_size="
            f"{cfg.reader.batch_size} and {_sample_keys(cfg.dataset)}: {slots} batch buffers "
            f"of about {size_text(batch)} need "
            f"{_memory(slots * batch, ranks_per_node, node_memory)}"
            f"; lower them, or read without keeping the data (reader.keep_data: false)")


def _batch_buffers(cfg, plan_bytes: int, steps: int, ranks: int) -> tuple[int, int]:
    """(batch buffers a rank holds, their mean bytes); (0, 0) when it keeps no data."""
    rd = cfg.reader
    if not rd.keep_data or steps == 0:
        return 0, 0
    slots = batches_in_flight(rd.data_loader, rd.prefetch_size, rd.read_threads) + 1
    return slots, plan_bytes // (steps * ranks)


def check_snapshot_memory(cfg, snapshot: int, plan_bytes: int, steps: int, ranks: int,
                          ranks_per_node: int, node_memory: int, staged: int = 0) -> None:
    """checkpoint.async_write keeps a snapshot of each rank's share (`snapshot` bytes with
    its patterns, the largest rank's) in memory all run, beside the reader's batch buffers
    and what reader.staging holds of the dataset (`staged` bytes a node, staging_memory):
    refuse, before any I/O, when a node would need more than 80 % of its memory for them."""
    slots, batch = _batch_buffers(cfg, plan_bytes, steps, ranks)
    per_rank = snapshot + slots * batch
    if per_rank * ranks_per_node + staged <= 0.8 * node_memory:
        return
    held = (f"checkpoint.async_write: true keeps a snapshot of each rank's share of a "
            f"checkpoint in memory ({size_text(snapshot)} for the largest share) beside {slots} "
            f"batch buffers of about {size_text(batch)}")
    if staged:
        raise UserError(
            f"{held} and reader.staging: {cfg.reader.staging}'s {size_text(staged)} per node: "
            f"{size_text(per_rank * ranks_per_node + staged)} for a node of {ranks_per_node} "
            f"rank(s), more than 80 % of the node's {size_text(node_memory)} of memory; "
            "expected async_write: false, more ranks (smaller shares), or reader.staging: none")
    raise UserError(
        f"{held}: {_memory(per_rank, ranks_per_node, node_memory, 'more than 80 % of')}; "
        "expected async_write: false, more ranks (smaller shares), or smaller batches")


def _memory(per_rank: int, ranks_per_node: int, node_memory: int,
            more: str = "more than") -> str:
    """'X per rank[, Y for the N ranks of a node], more than the node's Z of memory'."""
    node = f", {size_text(per_rank * ranks_per_node)} for the {ranks_per_node} ranks of a node" \
        if ranks_per_node > 1 else ""
    return (f"{size_text(per_rank)} per rank{node}, {more} the node's {size_text(node_memory)} "
            f"of memory")


def check_tensor_memory(checkpoint: Mapping, local_ranks: int, node_memory: int) -> None:
    """checkpoint_mechanism pt_save keeps each rank's checkpoint share in memory as tensors
    (as DLIO does): refuse before any I/O when a node's ranks could not hold them."""
    try:
        from ..checkpoint.torch_save import memory_needed  # imports torch
    except ImportError as exc:
        raise UserError(f"checkpoint.checkpoint_mechanism: pt_save writes with torch.save, but "
                        f"torch cannot be imported ({exc}); install it with "
                        f"{install_hint('torch')} (torch 2.13.0, the CPU build), or use "
                        "checkpoint_mechanism native") from None
    need = memory_needed(checkpoint["bytes_per_rank"][1], local_ranks)
    if need > node_memory:
        raise UserError(f"checkpoint.checkpoint_mechanism: pt_save holds each rank's share of a "
                        f"checkpoint in memory as tensors (and a file's worth more while a load "
                        f"checks it): {need / 2**30:,.1f} GiB for the {local_ranks} rank(s) of a "
                        f"node, which has {node_memory / 2**30:,.1f} GiB; expected "
                        "checkpoint_mechanism native (streams from one buffer), or a smaller "
                        "share (checkpoint.mode subset, more ranks)")
