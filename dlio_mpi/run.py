"""One emulated training job, end to end, on every rank of the communicator:
validate -> (generate) -> per epoch: shuffle on rank 0, scatter shards, plan, read + sleep +
barrier -> gather metrics -> summary.json, per_epoch_stats.json, the resolved config."""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import yaml

from . import __version__, _core
from .catalog import locate_split
from .dataset import describe_dataset
from .errors import check_all, on_root
from .generate import generate
from .metrics.summary import EpochSummary, build_summary, condense, format_table
from .plan import RunPlan, derive_plan, describe_plan
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


def prepare(comm, cfg) -> RunPlan:
    """Validate what needs the rank count, on every rank, agreeing on the outcome."""
    per_node = ranks_per_node(comm)
    return check_all(comm, lambda: derive_plan(cfg, comm.Get_size(), per_node))


def run_generation(comm, cfg) -> None:
    splits = describe_dataset(cfg)
    result = generate(comm, cfg, splits)
    say(comm, f"generated {result.files_written} files ({result.bytes_written / 2**20:.1f} MiB"
              f", {result.mib_per_second:.1f} MiB/s), {result.files_skipped} already complete,"
              f" under {splits['train'].root}")


def _write_access_log(folder: str, epoch: int, rank: int, ids: np.ndarray) -> None:
    os.makedirs(os.path.join(folder, "access_log"), exist_ok=True)
    np.save(os.path.join(folder, "access_log", f"epoch{epoch}_rank{rank}.npy"), ids)


def train(comm, cfg, plan: RunPlan) -> list[EpochSummary]:
    """The training epochs; returns every epoch's records (complete on rank 0 only)."""
    rank = comm.Get_rank()
    split = describe_dataset(cfg)["train"]
    files = locate_split(comm, cfg, split)
    rd = cfg.reader
    reader = check_all(comm, lambda: NativeReader(files.paths, rd.read_threads, rd.prefetch_size,
                                                  rd.odirect, rd.fd_cache_size))
    shuffle = ShuffleSpec(rd.file_shuffle, rd.sample_shuffle, cfg.train.seed,
                          cfg.train.seed_change_epoch)
    steps, batch = plan.steps_per_epoch, rd.batch_size
    rng = np.random.default_rng([cfg.train.seed, rank])
    clock_offset = time.time_ns() - _core.now_ns()
    summaries = []
    try:
        for epoch in range(1, cfg.train.epochs + 1):
            order = epoch_order(split.num_files, split.samples_per_file, shuffle, epoch) \
                if rank == 0 else None
            shard = scatter_shards(comm, order, steps * batch)
            reads = plan_reads(shard, steps, batch, split.samples_per_file, files.layouts,
                               plan.read_mode)
            compute = cfg.train.computation_time.draw(rng, steps)
            trace = run_epoch(comm, reader, reads, compute, epoch)
            if cfg.output.access_log:
                _write_access_log(cfg.output.folder, epoch, rank, trace.sample_ids)
            record = condense(trace, rank, batch, cfg.output.metric.exclude_start_steps,
                              cfg.output.metric.exclude_end_steps, clock_offset)
            records = comm.gather(record, root=0)
            if rank == 0:
                summary = EpochSummary(epoch, records)
                summaries.append(summary)
                print(f"epoch {epoch}: AU {summary.au_percentage:.2f} %, "
                      f"{summary.samples_per_second:.1f} samples/s, "
                      f"{summary.mib_per_second:.1f} MiB/s, {summary.seconds:.2f} s", flush=True)
    finally:
        reader.close()
    return summaries


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


def write_results(comm, cfg, plan: RunPlan, summaries: list[EpochSummary], start: float) -> dict:
    """Rank 0 writes summary.json, per_epoch_stats.json and config.yaml; returns the summary."""
    header = _header(comm, cfg, plan, start, time.time())

    def write() -> dict:
        summary = build_summary(summaries, cfg, header)
        folder = cfg.output.folder
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "summary.json"), "w") as fp:
            json.dump(summary, fp, indent=2)
        with open(os.path.join(folder, "per_epoch_stats.json"), "w") as fp:
            json.dump({str(e.epoch): e.to_json() for e in summaries}, fp, indent=2)
        with open(os.path.join(folder, "config.yaml"), "w") as fp:
            yaml.safe_dump({"workload": cfg.to_dict()}, fp, sort_keys=False)
        print(format_table(summaries, summary), flush=True)
        print(f"results in {folder}/summary.json", flush=True)
        return summary

    return on_root(comm, write)


def run(comm, cfg) -> dict | None:
    """The whole job; returns the summary (on every rank) when training ran."""
    start = time.time()
    plan = prepare(comm, cfg)
    say(comm, describe_plan(plan, cfg))
    if cfg.workflow.generate_data:
        run_generation(comm, cfg)
    if not cfg.workflow.train:
        return None
    summaries = train(comm, cfg, plan)
    return write_results(comm, cfg, plan, summaries, start)
