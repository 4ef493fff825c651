"""One emulated training job, end to end, on every rank of the communicator:
validate -> (generate) -> per epoch: shuffle on rank 0, scatter shards, plan, read + sleep +
barrier -> gather metrics -> summary.json, per_epoch_stats.json, the resolved config."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import yaml

from . import __version__, _core
from .catalog import SplitFiles, locate_split
from .config import TimeSpec
from .dataset import DatasetSplit
from .errors import UserError, check_all, on_root
from .generate import generate
from .metrics.summary import EpochSummary, build_summary, condense, format_table
from .plan import RunPlan, derive_plan, describe_plan, resolve_read_mode
from .planner import plan_reads
from .reader import NativeReader
from .sharding import ShuffleSpec, epoch_order, scatter_shards
from .training import run_epoch


def say(comm, *lines: str) -> None:
    """Print on rank 0 only."""
    if comm.Get_rank() == 0:
        print(*lines, sep="\n", flush=True)


def ranks_per_node(comm) -> int:
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return comm.allreduce(node.Get_size(), op=MPI.MAX)
    finally:
        node.Free()


def check_output_folder(cfg) -> None:
    """Rank 0: make sure results can be written before any storage work starts."""
    folder = cfg.output.folder
    try:
        os.makedirs(os.path.join(folder, "access_log") if cfg.output.access_log else folder,
                    exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UserError(f"output.folder: cannot write results to {folder}: "
                        f"{exc.strerror or exc}") from exc


def prepare(comm, cfg, generating: bool = False) -> RunPlan:
    """Validate what needs the rank count and the output folder, agreeing on the outcome."""
    per_node = ranks_per_node(comm)
    plan = check_all(comm, lambda: derive_plan(cfg, comm.Get_size(), per_node, generating))
    if cfg.workflow.train:
        on_root(comm, lambda: check_output_folder(cfg))
    return plan


def run_generation(comm, cfg, plan: RunPlan) -> None:
    splits = plan.splits
    result = generate(comm, cfg, splits, plan.layouts)
    say(comm, f"generated {result.files_written} files ({result.bytes_written / 2**20:.1f} MiB"
              f", {result.mib_per_second:.1f} MiB/s), {result.files_skipped} already complete,"
              f" under {splits['train'].root}")


def _write_access_log(folder: str, name: str, ids: np.ndarray) -> None:
    os.makedirs(os.path.join(folder, "access_log"), exist_ok=True)
    np.save(os.path.join(folder, "access_log", name), ids)


@dataclass
class Phase:
    """Training or evaluation: one split read by one engine with its own batch, step count,
    per-step time and shuffling. Evaluation reads in file order and has no per-step barrier
    (as in DLIO)."""

    name: str
    split: DatasetSplit
    files: SplitFiles
    reader: NativeReader
    shuffle: ShuffleSpec
    steps: int
    batch: int
    step_time: TimeSpec
    barrier: bool


def open_phase(comm, cfg, plan: RunPlan, name: str) -> Phase:
    """Find the phase's files and start its engine (collectively)."""
    train = name == "train"
    split_name = "train" if train else "valid"
    split = plan.splits[split_name]
    files = locate_split(comm, cfg, split, plan.layouts[split_name])
    rd = cfg.reader
    reader = check_all(comm, lambda: NativeReader(files.paths, rd.read_threads, rd.prefetch_size,
                                                  rd.odirect, rd.fd_cache_size))
    if train:
        return Phase(name, split, files, reader,
                     ShuffleSpec(rd.file_shuffle, rd.sample_shuffle, cfg.train.seed,
                                 cfg.train.seed_change_epoch),
                     plan.steps_per_epoch, rd.batch_size, cfg.train.computation_time, True)
    return Phase(name, split, files, reader, ShuffleSpec(), plan.eval_steps_per_epoch,
                 rd.batch_size_eval, cfg.evaluation.eval_time, False)


def run_phase_epoch(comm, cfg, phase: Phase, epoch: int, rng: np.random.Generator,
                    clock_offset: int) -> EpochSummary | None:
    """One epoch of a phase on every rank; the gathered summary on rank 0, else None."""
    rank = comm.Get_rank()
    split = phase.split
    order = epoch_order(split.num_files, split.samples_per_file, phase.shuffle, epoch) \
        if rank == 0 else None
    shard = scatter_shards(comm, order, phase.steps * phase.batch)
    reads = plan_reads(shard, phase.steps, phase.batch, split.samples_per_file,
                       phase.files.layouts, resolve_read_mode(cfg))
    trace = run_epoch(comm, phase.reader, reads, phase.step_time.draw(rng, phase.steps), epoch,
                      barrier=phase.barrier)
    if cfg.output.access_log:
        prefix = "" if phase.name == "train" else f"{phase.name}_"
        _write_access_log(cfg.output.folder, f"{prefix}epoch{epoch}_rank{rank}.npy",
                          trace.sample_ids)
    record = condense(trace, rank, phase.batch, cfg.output.metric.exclude_start_steps,
                      cfg.output.metric.exclude_end_steps, clock_offset)
    records = comm.gather(record, root=0)
    if rank != 0:
        return None
    summary = EpochSummary(epoch, records)
    print(f"{phase.name} epoch {epoch}: AU {summary.au_percentage:.2f} %, "
          f"{summary.samples_per_second:.1f} samples/s, {summary.mib_per_second:.1f} MiB/s, "
          f"{summary.seconds:.2f} s", flush=True)
    return summary


def train(comm, cfg, plan: RunPlan) -> tuple[list[EpochSummary], list[EpochSummary]]:
    """The training epochs, each followed by evaluation when it is due; returns the train and
    eval epoch summaries (complete on rank 0 only)."""
    rank = comm.Get_rank()
    rng = np.random.default_rng([cfg.train.seed, rank])
    clock_offset = time.time_ns() - _core.now_ns()
    phases = [open_phase(comm, cfg, plan, "train")]
    if cfg.workflow.evaluation:
        phases.append(open_phase(comm, cfg, plan, "eval"))
    done: dict[str, list[EpochSummary]] = {"train": [], "eval": []}
    next_eval = cfg.evaluation.eval_after_epoch
    for epoch in range(1, cfg.train.epochs + 1):
        for phase in phases:
            if phase.name == "eval":
                if epoch < next_eval:
                    continue
                next_eval += cfg.evaluation.epochs_between_evals
            summary = run_phase_epoch(comm, cfg, phase, epoch, rng, clock_offset)
            if summary is not None:
                done[phase.name].append(summary)
    # Closed only on success: on an error the job aborts at once, without waiting for reads
    # in flight (a stuck one would otherwise hold the abort back).
    for phase in phases:
        phase.reader.close()
    return done["train"], done["eval"]


def _header(comm, cfg, plan: RunPlan, start: float, end: float) -> dict:
    hosts = comm.gather(socket.gethostname(), root=0)
    return {
        "start": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
        "end": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)),
        "num_accelerators": comm.Get_size(),
        "num_hosts": len(set(hosts)) if hosts else 0,
        "hostname": socket.gethostname(),
        "num_files_train": cfg.dataset.num_files_train,
        "num_files_eval": cfg.dataset.num_files_eval,
        "num_samples_per_file": cfg.dataset.num_samples_per_file,
        "host_memory_GB": plan.node_memory_bytes / 2**30,
        "data_size_GB": plan.dataset_bytes / 2**30,
        "potential_caching": plan.fits_in_node_memory,
        "dlio_mpi": {
            "version": __version__, "format": plan.format, "read_mode": plan.read_mode,
            "odirect": cfg.reader.odirect, "read_threads": cfg.reader.read_threads,
            "prefetch_size": cfg.reader.prefetch_size, "batch_size": cfg.reader.batch_size,
            "steps_per_epoch": plan.steps_per_epoch, "ranks_per_node": plan.ranks_per_node,
        },
    }


def write_results(comm, cfg, plan: RunPlan, train_epochs: list[EpochSummary],
                  eval_epochs: list[EpochSummary], start: float) -> dict:
    """Rank 0 writes summary.json, per_epoch_stats.json and config.yaml; returns the summary."""
    header = _header(comm, cfg, plan, start, time.time())

    def write() -> dict:
        summary = build_summary(train_epochs, eval_epochs, cfg, header)
        folder = cfg.output.folder
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "summary.json"), "w") as fp:
            json.dump(summary, fp, indent=2)
        with open(os.path.join(folder, "per_epoch_stats.json"), "w") as fp:
            stats = {str(e.epoch): e.to_json() for e in train_epochs}
            for e in eval_epochs:
                stats[str(e.epoch)]["eval"] = e.to_json()
            json.dump(stats, fp, indent=2)
        with open(os.path.join(folder, "config.yaml"), "w") as fp:
            yaml.safe_dump({"workload": cfg.to_dict()}, fp, sort_keys=False)
        print(format_table(train_epochs, eval_epochs, summary), flush=True)
        print(f"results in {folder}/summary.json", flush=True)
        return summary

    return on_root(comm, write)


def run(comm, cfg) -> dict | None:
    """The whole job; returns the summary (on every rank) when training ran."""
    start = time.time()
    plan = prepare(comm, cfg)
    say(comm, describe_plan(plan, cfg))
    if cfg.workflow.generate_data:
        run_generation(comm, cfg, plan)
    if not cfg.workflow.train:
        return None
    train_epochs, eval_epochs = train(comm, cfg, plan)
    return write_results(comm, cfg, plan, train_epochs, eval_epochs, start)
