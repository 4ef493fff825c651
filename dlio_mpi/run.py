"""One emulated training job, end to end, on every rank of the communicator:
validate -> (generate) -> per epoch: shuffle on rank 0, scatter shards, plan, read + sleep +
barrier -> gather metrics -> summary.json, per_epoch_stats.json, the resolved config."""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import yaml

from . import __version__, _core
from .catalog import SplitFiles, locate_split
from .config import TimeSpec
from .dataset import DatasetSplit, dlio_record_length
from .errors import UserError, check_all, on_root
from .generate import generate
from .metrics.summary import EpochSummary, build_summary, condense, format_table, last_arrivals
from .pacing import Pacing, make_pacing
from .plan import RunPlan, derive_plan, describe_plan, resolve_read_mode
from .planner import AccessPolicy, plan_reads
from .reader import NativeReader
from .sharding import ShuffleSpec, draw_entropy, epoch_shuffle, rank_shard
from .topology import Topology, discover, emulated_ranks_per_node
from .training import run_epoch


def say(comm, *lines: str) -> None:
    """Print on rank 0 only."""
    if comm.Get_rank() == 0:
        print(*lines, sep="\n", flush=True)


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


def prepare(comm, cfg, generating: bool = False) -> tuple[RunPlan, Topology]:
    """Find the nodes, validate what needs the rank count and the output folder, agreeing on
    the outcome."""
    topo = discover(comm, check_all(comm, emulated_ranks_per_node))
    plan = check_all(comm, lambda: derive_plan(cfg, comm.Get_size(), topo.ranks_per_node,
                                               topo.nodes, topo.memory_bytes, generating))
    if cfg.workflow.train:
        on_root(comm, lambda: check_output_folder(cfg))
    return plan, topo


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
    pacing: Pacing
    policy: AccessPolicy


def _blksize(path: str) -> int:
    try:
        return os.stat(path).st_blksize or 4096
    except OSError:
        return 4096


def open_phase(comm, cfg, plan: RunPlan, name: str, pacing: Pacing) -> Phase:
    """Find the phase's files and start its engine (collectively)."""
    train = name == "train"
    split = plan.splits["train" if train else "valid"]
    files = locate_split(comm, cfg, split)
    rd = cfg.reader
    fmt = split.format
    blksize, facts = on_root(comm, lambda: (_blksize(files.path(0)),
                                            fmt.loader_facts(files.path(0))))
    policy = AccessPolicy(rd.access, rd.odirect, blksize, fmt.loader_model(
        facts, np.dtype(split.dtype).itemsize, split.samples_per_file))
    reader = check_all(comm, lambda: NativeReader(
        files, rd.read_threads, rd.prefetch_size, rd.odirect, rd.fd_cache_size,
        close_at_epoch_end=rd.access == "loader", drop_page_cache=rd.drop_page_cache,
        keep_data=rd.keep_data))
    if train:
        return Phase(name, split, files, reader,
                     ShuffleSpec(rd.file_shuffle, rd.sample_shuffle, cfg.train.seed,
                                 cfg.train.seed_change_epoch),
                     plan.steps_per_epoch, rd.batch_size, cfg.train.computation_time, True,
                     pacing, policy)
    return Phase(name, split, files, reader, ShuffleSpec(), plan.eval_steps_per_epoch,
                 rd.batch_size_eval, cfg.evaluation.eval_time, False, pacing, policy)


def run_phase_epoch(comm, cfg, phase: Phase, epoch: int, rng: np.random.Generator,
                    topo: Topology, wall_offset: int) -> EpochSummary | None:
    """One epoch of a phase on every rank; the gathered summary on rank 0, else None."""
    rank = comm.Get_rank()
    split = phase.split
    shuffle = epoch_shuffle(phase.shuffle, epoch, draw_entropy(comm, phase.shuffle))
    shard = rank_shard(split.num_files, split.samples_per_file, shuffle, rank,
                       phase.steps * phase.batch)
    reads = plan_reads(shard, phase.steps, phase.batch, split.samples_per_file,
                       phase.files.layouts, resolve_read_mode(cfg), phase.policy)
    trace = run_epoch(comm, phase.reader, reads, phase.step_time.draw(rng, phase.steps), epoch,
                      phase.pacing, barrier=phase.barrier)
    if cfg.output.access_log:
        prefix = "" if phase.name == "train" else f"{phase.name}_"
        _write_access_log(cfg.output.folder, f"{prefix}epoch{epoch}_rank{rank}.npy",
                          trace.sample_ids)
    latest = last_arrivals(comm, trace, topo.clock_offset_ns)
    record = condense(trace, latest, rank, phase.batch, reads.bytes_requested,
                      cfg.output.metric.exclude_start_steps, cfg.output.metric.exclude_end_steps,
                      wall_offset)
    records = comm.gather(record, root=0)
    if rank != 0:
        return None
    summary = EpochSummary(epoch, records, dlio_record_length(cfg.dataset))
    print(f"{phase.name} epoch {epoch}: AU {summary.au_percentage:.2f} %, "
          f"{summary.samples_per_second:.1f} samples/s, "
          f"{summary.transfer_mib_per_second:.1f} MiB/s read, {summary.seconds:.2f} s, "
          f"emulator overhead {summary.overhead_us_per_step:.1f} us/step", flush=True)
    return summary


def train(comm, cfg, plan: RunPlan, topo: Topology, pacing: Pacing
          ) -> tuple[list[EpochSummary], list[EpochSummary]]:
    """The training epochs, each followed by evaluation when it is due; returns the train and
    eval epoch summaries (complete on rank 0 only)."""
    rank = comm.Get_rank()
    rng = np.random.default_rng([cfg.train.seed, rank])
    wall_offset = time.time_ns() - _core.now_ns()
    phases = [open_phase(comm, cfg, plan, "train", pacing)]
    if cfg.workflow.evaluation:
        phases.append(open_phase(comm, cfg, plan, "eval", pacing))
    done: dict[str, list[EpochSummary]] = {"train": [], "eval": []}
    next_eval = cfg.evaluation.eval_after_epoch
    for epoch in range(1, cfg.train.epochs + 1):
        for phase in phases:
            if phase.name == "eval":
                if epoch < next_eval:
                    continue
                next_eval += cfg.evaluation.epochs_between_evals
            summary = run_phase_epoch(comm, cfg, phase, epoch, rng, topo, wall_offset)
            if summary is not None:
                done[phase.name].append(summary)
    # Closed only on success: on an error the job aborts at once, without waiting for reads
    # in flight (a stuck one would otherwise hold the abort back).
    for phase in phases:
        phase.reader.close()
    return done["train"], done["eval"]


def _header(comm, cfg, plan: RunPlan, topo: Topology, pacing: Pacing, start: float,
            end: float) -> dict:
    """The run's description: DLIO's fields (its meanings: lists per node, GB = 2^30 bytes,
    data per host from the configured record length), then ours."""
    ds = cfg.dataset
    size = comm.Get_size()
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, root=0)
    pacings = comm.gather(pacing.to_json(), root=0)
    per_host_gb = (topo.ranks_per_node * ds.num_samples_per_file * ds.num_files_train // size
                   * dlio_record_length(ds) / 2**30)
    memory_gb = [h.memory_bytes / 2**30 for h in topo.hosts]
    return {
        "start": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
        "end": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)),
        "num_accelerators": size,
        "num_hosts": size // topo.ranks_per_node,
        "hostname": topo.hosts[0].hostname,
        "num_files_train": ds.num_files_train,
        "num_files_eval": ds.num_files_eval,
        "num_samples_per_file": ds.num_samples_per_file,
        "host_cpu_count": [h.cpu_count for h in topo.hosts],
        "host_processor_name": topo.hosts[0].processor,
        "host_memory_GB": memory_gb,
        "data_size_per_host_GB": per_host_gb,
        "potential_caching": [0 if gb <= per_host_gb else 1 for gb in memory_gb],
        "dlio_mpi": {
            "version": __version__, "format": plan.format, "read_mode": plan.read_mode,
            "odirect": cfg.reader.odirect, "read_threads": cfg.reader.read_threads,
            "prefetch_size": cfg.reader.prefetch_size, "batch_size": cfg.reader.batch_size,
            "steps_per_epoch": plan.steps_per_epoch, "ranks_per_node": topo.ranks_per_node,
            "nodes": topo.nodes, "emulated_nodes": topo.emulated,
            "hosts": sorted({h.hostname for h in topo.hosts}),
            "dataset_bytes": plan.dataset_bytes, "memory_bytes": plan.memory_bytes,
            "dataset_fits_in_memory": plan.fits_in_memory,
            "access": cfg.reader.access, "drop_page_cache": cfg.reader.drop_page_cache,
            "keep_data": cfg.reader.keep_data,
            "pacing": {key: _spread_of([p[key] for p in pacings]) if isinstance(value, float)
                       else value for key, value in pacings[0].items()} if pacings else None,
            "peak_rss_bytes_per_rank": rss,
        },
    }


def _spread_of(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


def write_results(comm, cfg, plan: RunPlan, topo: Topology, pacing: Pacing,
                  train_epochs: list[EpochSummary], eval_epochs: list[EpochSummary],
                  start: float) -> dict:
    """Rank 0 writes summary.json, per_epoch_stats.json and config.yaml; returns the summary."""
    header = _header(comm, cfg, plan, topo, pacing, start, time.time())

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
    plan, topo = prepare(comm, cfg)
    say(comm, describe_plan(plan, cfg))
    if cfg.workflow.generate_data:
        run_generation(comm, cfg, plan)
    if not cfg.workflow.train:
        return None
    pacing = make_pacing(cfg.train.compute_spin_us, cfg.train.sync_spin_us)
    train_epochs, eval_epochs = train(comm, cfg, plan, topo, pacing)
    return write_results(comm, cfg, plan, topo, pacing, train_epochs, eval_epochs, start)
