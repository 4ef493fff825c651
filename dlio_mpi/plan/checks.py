"""The checks that need the derived plan (steps, bytes, memory per node): each refuses with one
message naming the keys, the values and what would be accepted. Per-key rules live in the
schema, a backend's limits on its spec (readers/registry.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..config.schema import MAX_STEP_SECONDS, keys_set
from ..data.dataset import DatasetSplit
from ..errors import UserError, install_hint
from ..readers import ReaderSpec, access_spec, reader_spec
from ..storage.filesystems import check_direct_io_folder
from ..units import number_text, size_text
from .limits import (
    CACHE_FILL_BUFFER,
    CHECKPOINT_BLOCK,
    EPOCH_RECORD_BYTES,
    MAX_FILE_BYTES,
    MAX_PATH_BYTES,
    MAX_SAMPLES,
    SHAPE_BYTES_PER_FILE,
)
from .memory import Held


def check_measurable(steps: int, cfg, phase: str) -> None:
    """AU excludes the first and last steps of an epoch; some must remain to be measured."""
    metric = cfg.output.metric
    if steps <= metric.exclude_start_steps + metric.exclude_end_steps:
        raise UserError(
            f"{phase} has {steps} steps per epoch, but output.metric.exclude_start_steps="
            f"{metric.exclude_start_steps} and output.metric.exclude_end_steps="
            f"{metric.exclude_end_steps} "
            "exclude them all from AU; add files or lower the batch size or the exclusions")


def check_reader_fits(cfg) -> None:
    """What only some readers do: a format read by mmap (mmap_indexed_binary: through the
    page cache, with its mapped reads), synthetic data (read by nothing); what the file
    access cannot read, reader.file_access's backend says (readers.access_spec)."""
    from ..formats import get_format

    fmt = get_format(cfg.dataset.format)
    if not (fmt.reads_nothing or fmt.reads_by_mmap):
        return
    if fmt.reads_by_mmap and cfg.reader.odirect:
        raise UserError(f"reader.odirect: true does not combine with dataset.format "
                        f"{cfg.dataset.format}, which is read through a memory mapping (the "
                        "page cache); expected false, or dataset.format indexed_binary")
    refused = access_spec(cfg).format_refusal(cfg, fmt) if cfg.workflow.train else None
    if refused:
        raise UserError(refused)


def check_whole_file_reads(cfg, mode: str) -> None:
    """Formats DLIO's readers decode whole (jpeg, png: the image; csv: the table) have no
    sample extent to read: reader.read_mode sample is refused for them."""
    from ..formats import get_format

    if mode == "sample" and cfg.workflow.train \
            and get_format(cfg.dataset.format).whole_file_only:
        raise UserError(f"reader.read_mode: sample reads each sample's extent, but DLIO's "
                        f"{cfg.dataset.format} reader decodes whole files (a sample is not an "
                        "extent of one); expected auto, file or file_once")


def shapes_held(cfg) -> Held | None:
    """Drawn sample shapes are kept for every file on every rank (none with one shape)."""
    ds = cfg.dataset
    if ds.record_dims or ds.record_length_bytes_stdev <= 0:
        return None
    files = ds.num_files_train + ds.num_files_eval
    return Held("dataset.num_files_train",
                f"the drawn sample shapes of dataset.num_files_train={ds.num_files_train} and "
                f"num_files_eval={ds.num_files_eval} files (dataset.record_length_bytes_stdev)",
                per_rank=files * SHAPE_BYTES_PER_FILE,
                lower="fewer files, or dataset.record_length_bytes_stdev: 0")


def _sample_keys(ds, per_file: bool = True) -> str:
    """The keys that size a sample (and, `per_file`, a file of several), with their values."""
    per_file = (f", dataset.num_samples_per_file={ds.num_samples_per_file}"
                if per_file and ds.num_samples_per_file > 1 else "")
    if ds.record_dims:
        return f"dataset.record_dims={list(ds.record_dims)}{per_file}"
    stdev = ds.record_length_bytes_stdev
    return (f"dataset.record_length_bytes={number_text(ds.record_length_bytes)}"
            + (f" (stdev {number_text(stdev)})" if stdev else "") + per_file)


def _largest_sample(split: DatasetSplit) -> int:
    """Elements of the largest sample of `split` (exact: Python ints)."""
    if len(split.dims) == 1:
        return math.prod(int(d) for d in split.dims[0])
    return int(np.prod(split.dims.astype(np.int64), axis=1).max())  # two int32 dims each


def staging_held(cfg, ranks_per_node: int, nodes: int) -> Held | None:
    """What the reader backend keeps in a node's memory for the whole run beyond its batches
    (reader.staging's copies of the dataset: its spec's memory_held), per node."""
    if not cfg.workflow.train:
        return None
    held = reader_spec(cfg).memory_held(cfg, ranks_per_node, nodes)
    if held is None:
        return None
    key, per_node, what, lower = held
    return Held(key, what, per_node=per_node, lower=lower)


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
                f"{_sample_keys(ds, per_file=False)} of {ds.record_element_type} with "
                f"dataset.num_samples_per_file={ds.num_samples_per_file}: a {split.name} file "
                f"would hold {payload} bytes, more than the 2^62 bytes the engine addresses "
                f"in a file")
        longest = max(len(split.path(i).encode()) for i in (0, split.num_files - 1))
        if longest > MAX_PATH_BYTES:
            raise UserError(
                f"dataset.data_folder: {split.name} file paths would be {longest} bytes long "
                f"(storage.storage_root + data_folder + name); the engine takes at most "
                f"{MAX_PATH_BYTES}")


def batch_held(cfg, plan_bytes: int, steps: int, ranks: int,
               library_read: str = "") -> Held | None:
    """The engine keeps one batch per rank in memory more than it reads ahead
    (reader.keep_data; a torch DataLoader's batches in flight: the backend's spec says,
    readers.reader_spec, `library_read` RunPlan.library_read)."""
    slots, batch = _batch_buffers(cfg, plan_bytes, steps, ranks,
                                  reader_spec(cfg, library_read))
    if not slots:
        return None
    return Held("reader.prefetch_size",
                f"{slots} batch buffers of about {size_text(batch)} (reader.prefetch_size="
                f"{cfg.reader.prefetch_size}, reader.batch_size={cfg.reader.batch_size}, "
                f"{_sample_keys(cfg.dataset)})", per_rank=slots * batch,
                lower="a smaller reader.prefetch_size or batch, or reading without keeping the "
                      "data (reader.keep_data: false)")


def _batch_buffers(cfg, plan_bytes: int, steps: int, ranks: int,
                   spec: ReaderSpec) -> tuple[int, int]:
    """(batch buffers a rank holds, their mean bytes); (0, 0) when it keeps no data."""
    rd = cfg.reader
    if not rd.keep_data or steps == 0:
        return 0, 0
    slots = spec.batches_in_flight(rd) + 1
    return slots, plan_bytes // (steps * ranks)


def checkpoint_held(cfg, checkpoint: Mapping | None) -> list[Held]:
    """What checkpoints hold on a rank: an asynchronous save's snapshot of its share
    (checkpoint.async_write), pt_save's tensors (as DLIO keeps them), the C core's or MPI-IO's
    block buffer of a synchronous write or a restore, drain's copy buffer."""
    if checkpoint is None:
        return []
    ck, held = cfg.checkpoint, []
    share = checkpoint["bytes_per_rank"][1]
    sized_by = ", ".join(keys_set(cfg, ("model.",)))  # what sizes the shares
    of_share = f"the largest rank's share ({sized_by})" if sized_by else "the largest share"
    if checkpoint["snapshot_bytes_per_rank"]:
        held.append(Held("checkpoint.async_write",
                         f"checkpoint.async_write's snapshot of {of_share}",
                         per_rank=checkpoint["snapshot_bytes_per_rank"],
                         lower="checkpoint.async_write: false, or more ranks (smaller shares)"))
    if checkpoint["writer"] == "pt_save":  # its tensors, and a file's more while a load checks
        held.append(Held("checkpoint.checkpoint_mechanism",
                         f"checkpoint_mechanism pt_save's tensors of {of_share}",
                         per_rank=2 * share,
                         lower="checkpoint_mechanism native (streams from one buffer), or a "
                               "smaller share (checkpoint.mode subset, more ranks)"))
    else:  # a synchronous write's two blocks (one written, the next being made); a restore's
        block = min(CHECKPOINT_BLOCK, share)
        blocks = max(0 if ck.async_write else 2, 1 if checkpoint["loads"] else 0)
        held.append(Held("workflow.checkpoint", "the checkpoint writer's or reader's blocks",
                         per_rank=blocks * block))
    if ck.drain is not None:
        held.append(Held("checkpoint.drain.buffer_bytes", "checkpoint.drain's copy buffer",
                         per_rank=ck.drain.buffer_bytes,
                         lower="a smaller checkpoint.drain.buffer_bytes"))
    return held


def check_snapshot_pace(cfg, checkpoint: Mapping | None) -> None:
    """checkpoint.snapshot_bytes_per_second: refused where one snapshot of the largest
    rank's share would take longer than a day (its stall is the step loop's)."""
    rate = cfg.checkpoint.snapshot_bytes_per_second
    if checkpoint is None or not checkpoint["snapshot_bytes_per_rank"] or not rate:
        return
    share = checkpoint["bytes_per_rank"][1]
    if share / rate > MAX_STEP_SECONDS:
        least = math.ceil(share / MAX_STEP_SECONDS)
        raise UserError(f"checkpoint.snapshot_bytes_per_second: {number_text(rate)} would take "
                        f"{share / rate / 86400:,.1f} days to snapshot the largest rank's share "
                        f"({size_text(share)}); expected at least {least} (a snapshot within "
                        "a day), or 0 (as fast as memory copies)")


def run_held(cfg, ranks: int) -> list[Held]:
    """What the run itself keeps: the cache tier's and stage-in's copy buffers, and rank 0's
    record of every epoch of every rank (the results, gathered there)."""
    held = []
    if cfg.workflow.train and cfg.reader.cache is not None:  # each reader thread's, and the
        threads = max(cfg.reader.read_threads, 1) + 1           # step loop's own
        held.append(Held("reader.cache", "reader.cache's fill buffers",
                         per_rank=threads * CACHE_FILL_BUFFER,
                         lower="fewer reader.read_threads"))
    stage = cfg.storage.stage_in
    if stage is not None and cfg.workflow.train:
        held.append(Held("storage.stage_in.buffer_bytes", "storage.stage_in's copy buffer",
                         per_rank=stage.buffer_bytes,
                         lower="a smaller storage.stage_in.buffer_bytes"))
    if cfg.workflow.train:
        epochs = cfg.train.epochs * (2 if cfg.workflow.evaluation else 1)
        held.append(Held("train.epochs", f"rank 0's records of {cfg.train.epochs} epoch(s) of "
                                         f"{ranks} rank(s)",
                         per_node=epochs * ranks * EPOCH_RECORD_BYTES,
                         lower="fewer train.epochs"))
    return held


def check_pt_save_importable() -> None:
    """checkpoint_mechanism pt_save writes with torch.save: refused before any I/O where torch
    cannot be imported."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise UserError(f"checkpoint.checkpoint_mechanism: pt_save writes with torch.save, but "
                        f"torch cannot be imported ({exc}); install it with "
                        f"{install_hint('torch')} (torch 2.13.0, the CPU build), or use "
                        "checkpoint_mechanism native") from None


def direct_io_uses(cfg, data_folder: str) -> list[tuple[str, str, str]]:
    """(folder, its key, the O_DIRECT key) of every folder the run reads or writes with
    O_DIRECT outside the C engine's epochs (whose opens refuse such a file system
    themselves, naming the file): checkpoints, their drain (both tiers), reader.staging's
    reads."""
    uses = []
    ck = cfg.checkpoint
    if cfg.workflow.checkpoint and ck.odirect:
        uses.append((ck.checkpoint_folder, "checkpoint.checkpoint_folder", "checkpoint.odirect"))
    if cfg.workflow.checkpoint and ck.drain is not None and ck.drain.odirect:
        uses += [(ck.drain.to, "checkpoint.drain.to", "checkpoint.drain.odirect"),
                 (ck.checkpoint_folder, "checkpoint.checkpoint_folder",
                  "checkpoint.drain.odirect")]
    if cfg.workflow.train:  # the reader backend's own (reader.staging's whole-file reads)
        uses += reader_spec(cfg).direct_io_uses(cfg, data_folder)
    return uses


def check_direct_io(cfg, data_folder: str) -> None:
    """Refuse, before any I/O, O_DIRECT asked of a folder on a file system without real
    direct I/O (direct_io_uses)."""
    for folder, folder_key, odirect_key in direct_io_uses(cfg, data_folder):
        check_direct_io_folder(folder, folder_key, odirect_key)
