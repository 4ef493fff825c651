"""The plan's notes: what the configured reader does per sample (as DLIO's loaders do), which
settings have no effect with the chosen engine, and what a format, checkpoint or MPI-IO setting
means for the run. Notes inform; they never refuse."""

from __future__ import annotations

from ..config import keys_set, support_notes
from ..formats import implemented_formats
from ..readers import access_spec, reader_spec
from ..units import number_text


def plan_notes(cfg, library_read: str = "") -> tuple[str, ...]:
    """The settings that have no effect or act differently in dlio-mpi; the reader's from
    its spec (readers.reader_spec: `library_read`, RunPlan.library_read, picks h5py's)."""
    reads = cfg.workflow.train and cfg.dataset.format in implemented_formats()
    spec = reader_spec(cfg, library_read) if reads else None
    loader = spec.loader_note(cfg, library_read) if spec else ""
    notes = ([loader] if loader else []) + support_notes(cfg) + _columns_notes(cfg) \
        + _sized_notes(cfg)
    if spec:
        notes += spec.setting_notes(cfg, library_read)
    if cfg.storage.storage_type == "direct_fs":
        notes.append("storage.storage_type=direct_fs: the data under storage.storage_root read "
                     "with O_DIRECT (reader.odirect: true), as MLPerf's DLIO fork reads it "
                     "through s3dlio's direct:// mode; the same files as local_fs")
    return tuple(notes + _checkpoint_notes(cfg))


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


def unused_hints_note(cfg, splits, ranks: int) -> tuple[str, ...]:
    """reader.mpiio_hints set where nothing opens a file through MPI-IO: the native engine
    reads and generation (if any) deals files out."""
    if not cfg.reader.mpiio_hints or access_spec(cfg).takes_mpiio_hints:
        return ()
    from ..data.generate import writes_collectively

    if cfg.workflow.generate_data and splits and writes_collectively(splits, ranks):
        return ()
    return ("reader.mpiio_hints: no effect here: reader.file_access="
            f"{cfg.reader.file_access} reads with the native engine and no file is written "
            "through MPI-IO (the hints act with reader.file_access shared or collective, and "
            "in collective generation: fewer files than ranks)",)
