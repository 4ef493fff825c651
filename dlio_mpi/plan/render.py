"""The plan as the user reads it: the record `validate --json` prints and summary.json keeps,
and its text (the storage lines, the reader, the generation and checkpoint lines)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ..readers import reader_spec
from ..storage.filesystems import setstripe_args
from ..units import duration_text, size_text
from .derive import RunPlan


def _filesystem_text(name: str, info: Mapping) -> str:
    """'data_folder: lustre at /lus (srv:/fs), default layout 4 stripes of 1.0 MiB'."""
    text = f"{name}: {info['type']} at {info['mount_point']}"
    if info.get("device") not in (None, "unknown"):
        text += f" ({info['device']})"
    if info["type"] == "gpfs" and info.get("block_size"):
        text += f", block size {size_text(info['block_size'])}"
    layout = info.get("stripe_layout") or {}
    if "stripe_count" in layout:
        count = layout["stripe_count"]
        text += (f", default layout {'all OSTs' if count == -1 else f'{count} stripe(s)'} of "
                 f"{size_text(layout.get('stripe_size', 0))}"
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
    # The issue's MPI-IO backend takes striping hints too: they set the layout of the files
    # MPI-IO creates, at creation, whatever the folder's default says.
    hints = dict(cfg.reader.mpiio_hints)  # the configuration holds (name, value) pairs
    striping_hints = sorted(set(hints) & {"striping_factor", "striping_unit"})
    if args and striping_hints:
        lines.append(f"note            reader.mpiio_hints {', '.join(striping_hints)} set the "
                     "layout of files MPI-IO creates, storage.lustre the folder's default for "
                     "the others; the layout a data file took is in summary.json")
    return lines


def plan_record(plan: RunPlan, cfg, filesystems: Mapping[str, Mapping] | None = None,
                striping: Mapping | None = None, warnings: tuple[str, ...] = (),
                workload_file: str | None = None) -> dict:
    """The plan as plain data, ready for JSON (`dlio-mpi validate --json` prints it) and the
    one source describe_plan renders as text: counts, batch sizes and bytes as integers,
    `storage` the file system and striping lines (storage_lines), `notes` the plan's notes,
    `warnings` what the storage at hand says against the run (validate: not enough space).
    `filesystems` (describe_filesystems) and `striping` (check_striping), when given, add what
    rank 0 found on the storage; `workload_file`, the workload file read (absolute path; None
    where the caller has none)."""
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
        "workload_file": workload_file,
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
    record["reader"] = (reader_text(cfg, plan.library_read, plan) if uses_data
                        and cfg.workflow.train else None)
    record["checkpoint"] = dict(plan.checkpoint) if plan.checkpoint is not None else None
    return record


def reader_text(cfg, library_read: str = "", plan: RunPlan | None = None) -> str:
    """What reads the training data: the engine, the backend and the access, as the run's
    backend's spec says it (`library_read`: RunPlan.library_read; `plan` the plan's sizes)."""
    return reader_spec(cfg, library_read).reader_text(cfg, library_read, plan)


def describe_plan(plan: RunPlan, cfg, filesystems: Mapping[str, Mapping] | None = None,
                  striping: Mapping | None = None, warnings: tuple[str, ...] = (),
                  workload_file: str | None = None) -> str:
    """The plan as a few lines of text, rendered from plan_record (same arguments)."""
    return render_plan(plan_record(plan, cfg, filesystems, striping, warnings, workload_file))


def render_plan(r: Mapping) -> str:
    """plan_record's data as the text plan `validate` and `run` print."""
    train, ev = r["train"], r["eval"]
    lines = [
        f"workload        {r['workload']}: {r['format']}, read mode {r['read_mode']}, "
        f"O_DIRECT {'on' if r['odirect'] else 'off'}" if r["uses_dataset"] else
        f"workload        {r['workload']}: no dataset",
        f"ranks           {r['ranks']} ({r['ranks_per_node']} per node)",
    ]
    if r.get("workload_file"):
        lines.insert(1, f"workload file   {r['workload_file']}")
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
               f"{duration_text(r['compute_seconds'])} (epochs x steps x computation_time: "
               f"{r['epochs']} x {train['steps_per_epoch']} x {compute:g} s)"]
              if r["compute_seconds"] is not None else []),
            *([f"evaluation      {ev['steps_per_epoch']} steps of batch {ev['batch_size']} per "
               f"rank after epoch {ev['after_epoch']}, then every {ev['epochs_between']}"]
              if ev["steps_per_epoch"] else []),
            f"bytes per epoch {size_text(r['bytes_per_epoch'])} read by all ranks "
            f"({size_text(r['bytes_per_node_per_epoch'])} per node)",
            f"dataset size    {size_text(r['dataset_bytes'])} vs {size_text(r['memory_bytes'])} of "
            f"memory on the {r['nodes']} node(s)",
        ]
        if r.get("reader"):
            lines.append(f"reader          {r['reader']}")
        if r["page_cache_note"]:
            lines.append(f"note            {r['page_cache_note']}")
        if r["generation"]:
            lines.append(f"generation      {r['generation']['text']}")
    if r.get("checkpoint"):
        lines += _checkpoint_lines(r["checkpoint"])
    lines += r["storage"]
    lines.extend(f"note            {note}" for note in r["notes"])
    lines.extend(f"warning         {warning}" for warning in r["warnings"])
    return "\n".join(lines)


def _checkpoint_lines(ck: dict) -> list[str]:
    """The plan's checkpoint lines: sizing, when and how, drain and asynchronous saves."""
    lines = []
    low, high = ck["bytes_per_rank"]
    files_low, files_high = ck["files_per_rank"]
    per_rank = size_text(low) if low == high else f"{size_text(low)} to {size_text(high)}"
    files = str(files_low) if files_low == files_high else f"{files_low} to {files_high}"
    lines.append(f"checkpoint      {size_text(ck['total_bytes'])} per checkpoint, written by "
                 f"{ck['writers']} of {ck['ranks']} ranks: {per_rank} and {files} file(s) "
                 f"per rank (TP {ck['tensor']}, PP {ck['pipeline']}, DP {ck['data']}, "
                 f"ZeRO {ck['zero_stage']}, {ck['mode']} mode)")
    writer = {"file_per_rank": "each rank its own files (C core)",
              "shared": "one shared file per checkpoint (MPI-IO Write_at_all)",
              "pt_save": "each rank its own files through torch.save",
              "dcp": "torch Distributed Checkpoint's files (each rank its __<rank>_<i>.distcp, "
                     "rank 0 .metadata once every rank's are in)"}[ck["writer"]]
    if ck.get("dcp"):
        d = ck["dcp"]
        lines.append(f"checkpoint      dcp: {d['distcp_files']:,} .distcp file(s) "
                     f"({d['thread_count']} per rank, checkpoint.dcp.thread_count) of "
                     f"{size_text(d['distcp_bytes'])} and a .metadata of about "
                     f"{size_text(d['metadata_bytes_estimated'])}; {d['model']}")
    restore = (f"; restores defeat the page cache by {' + '.join(ck['restore_methods'])}"
               if ck["restore_methods"] else "")
    lines.append(f"checkpoints     {ck['when']}; {ck['saves']:,} checkpoint(s) "
                 f"({size_text(ck['bytes_written'])}, {_kept(ck)}) in {ck['folder']}: "
                 f"{writer}, "
                 f"O_DIRECT {'on' if ck['odirect'] else 'off'}, fsync "
                 f"{'on' if ck['fsync'] else 'off'}"
                 + (" (dlio-mpi's default, as MLPerf Storage requires; DLIO's is off and "
                    "its fsync never happens)" if ck["fsync"] else "") + restore)
    if ck.get("drain"):
        d = ck["drain"]
        kept = {"all": "all kept there", "last": "the last drained kept there",
                "none": "each removed there once drained"}[d["keep"]]
        lines.append(
            f"checkpoints     drained to {d['to']} in the background (checkpoint.drain: C "
            f"copy engine, {size_text(d['buffer_bytes'])} calls, O_DIRECT "
            f"{'on' if d['odirect'] else 'off'}, fsync {'on' if ck['fsync'] else 'off'}) "
            f"once complete in {ck['folder']} ({kept}); restores read "
            f"{'the drained copies' if d['restore_from'] == 'pfs' else ck['folder']}; the "
            "run ends when every drain is complete")
    content = ck.get("content") or {}
    lines.append(
        "content         checkpoint bytes "
        + ("fresh in every 4 KiB: nothing compresses or deduplicates"
           if content.get("compression_ratio", 1) == 1 and content.get("dedup_ratio", 1) == 1
           else f"compress {content['compression_ratio']:g}:1 and deduplicate "
                f"{content['dedup_ratio']:g}:1 at 4 KiB (checkpoint.content)"))
    if ck.get("async_write"):
        lines.append(
            "checkpoints     asynchronous (checkpoint.async_write): training stalls for a "
            "snapshot of the rank's share into host memory "
            f"({size_text(ck['snapshot_bytes_per_rank'])} held all run by the largest "
            "share), written in the "
            "background; the next save, an evaluation, a restore or the run's end waits "
            "for the write")
    return lines


def _kept(ck: dict) -> str:
    """Which checkpoints the checkpoint folder keeps."""
    keep = (ck.get("drain") or {}).get("keep", "all")
    return {"all": "all kept", "last": "the last drained kept",
            "none": "each removed once drained"}[keep]


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

        why = get_format(plan.format).written_whole
        text = (f"{files} file(s) dealt out to {files} of the {plan.ranks} ranks: {plan.format} "
                "cannot be written in parts" + (f" ({why})" if why else ""))
    else:
        how, writers = "round_robin", plan.ranks
        text = f"{files} files dealt out round-robin to the {plan.ranks} ranks"
    return {"how": how, "files": files, "writers": writers,
            "text": f"{text} (files already complete are kept)"}
