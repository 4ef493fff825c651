"""One emulated training job, end to end, on every rank of the communicator: its plan, data,
epochs, evaluations and checkpoints, and its results.

validate -> (generate, stage-in) -> per epoch: each rank computes its shard of the seeded
permutation (nothing sent but a seed), plans its reads, reads + waits + synchronises (with the
checkpoints due between blocks of steps) -> metrics reduced -> summary.json,
per_epoch_stats.json, the resolved config."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import yaml

from . import __version__, _core, progress
from .checkpoint.checkpointer import Checkpointer
from .checkpoint.phase import (
    announce,
    describe_checkpoints,
    epoch_entries,
    metric_fields,
    open_checkpointer,
    run_checkpoint_only,
)
from .checkpoint.results import CheckpointRecord
from .checkpoint.schedule import Due, Schedule, after_epoch, steps_due
from .config import TimeSpec
from .data.catalog import SplitFiles, files_row_groups, locate_split
from .data.dataset import DatasetSplit, dlio_record_length
from .data.generate import (
    GenerationResult,
    check_dataset_space,
    check_free_space,
    generate,
    side_folders,
)
from .data.manifest import (
    differing_params,
    generation_params,
    manifest_path,
    read_manifest,
)
from .data.recorded_sizes import read_sizes, size_column, sizes_path
from .errors import JobError, Stopped, UserError, agreed_stop, check_all, on_root
from .metrics.intervals import IntervalStats
from .metrics.summary import (
    EpochSummary,
    build_summary,
    condense,
    format_table,
    last_arrivals,
    node_bandwidth,
    per_epoch_stats,
)
from .metrics.trace import RankTrace, trace_name
from .mpi.pacing import (
    Pacing,
    auto_batch_spin_ns,
    background_threads,
    make_pacing,
    models_loader_costs,
    usable_cpus,
)
from .mpi.topology import HostInfo, Topology, discover, emulated_ranks_per_node
from .plan.checks import check_direct_io
from .plan.derive import RunPlan, derive_plan, derive_plan_everywhere
from .plan.render import describe_plan
from .readers import ReaderBackend, ReaderSpec, files_spec, open_reader
from .results import jsonfile
from .results.environment import describe_environment
from .results.folder import OutputFolder, access_log_name
from .results.names import CONFIG, PER_EPOCH_STATS, SUMMARY
from .results.per_rank import epoch_stats_name, output_name, rank_files
from .sampling.requests import AccessPolicy, access_policy, loader_inputs, plan_reads
from .sampling.sharding import (
    ShuffleSpec,
    draw_entropy,
    epoch_shuffle,
    order_batches,
    rank_draws,
    rank_shard,
)
from .storage import storage_for
from .storage.filesystems import check_striping, describe_filesystems
from .tiers.cache import CacheTier, room_warning
from .tiers.stage_in import StageSet, clean_stage, rerooted, stage_in
from .time_split import verdict_text
from .training import run_epoch


def data_root(cfg) -> str:
    """The data folder (storage.storage_root joined with dataset.data_folder)."""
    return os.path.join(cfg.storage.storage_root, cfg.dataset.data_folder)


def say(comm, *lines: str, out: OutputFolder | None = None) -> None:
    """Print on rank 0 only, and append to the run's log when there is one."""
    if comm.Get_rank() == 0:
        progress.write("\n".join(lines))  # also from the interval thread, also under a bar
        if out is not None:
            out.log("\n".join(lines))


def prepare(comm, cfg, generating: bool = False) -> tuple[RunPlan, Topology]:
    """Find the nodes, validate what needs the rank count, agreeing on the outcome."""
    topo = discover(comm, check_all(comm, emulated_ranks_per_node))
    plan = derive_plan_everywhere(comm, lambda: derive_plan(
        cfg, comm.Get_size(), topo.ranks_per_node, topo.nodes, topo.memory_bytes, generating,
        budget=topo.node_budget))
    return plan, topo


def results_bytes(cfg, plan: RunPlan, ranks: int) -> int:
    """About what a run writes into output.folder: the access logs (8 bytes a sample) and a
    few MiB of summaries and log."""
    samples = 0
    if cfg.output.access_log:
        samples = cfg.train.epochs * ranks * (
            plan.steps_per_epoch * cfg.reader.batch_size
            + plan.eval_steps_per_epoch * cfg.reader.batch_size_eval)
    return 8 * samples + (4 << 20)


def open_output(comm, cfg, plan: RunPlan, workload: str | None,
                hydra_record: dict[str, str] | None = None,
                hydra_run_dir: bool = False) -> OutputFolder:
    """Rank 0 claims output.folder (refusing before any I/O if it holds anything not ours),
    writes Hydra's record of the job there when the command line asked for it (as Hydra
    does, before the job runs), and every rank learns the tag its result temporaries carry."""
    out = OutputFolder(cfg.output.folder, cfg.output.log_file, workload,
                       shared=hydra_run_dir, record=tuple(hydra_record or ()))

    def claim() -> str:
        out.claim(cfg.output.access_log)
        if hydra_record:
            out.write_started(hydra_record)
        try:
            check_free_space(cfg.output.folder, results_bytes(cfg, plan, comm.Get_size()),
                             "output.folder")
        except UserError as exc:  # the folder says why, and is free for the next run
            out.log(f"dlio-mpi: error: {exc}")
            out.finish("failed")
            raise
        return out.tag

    out.tag = on_root(comm, claim)
    return out


def check_dataset_removable(cfg, plan: RunPlan) -> None:
    """Rank 0: `dataset.keep_files: false` deletes the dataset after the run, as DLIO does;
    we delete only files our manifest lists, so the data must be ours (or be generated now)."""
    root = data_root(cfg)
    if cfg.workflow.generate_data:
        return  # generation refuses a folder that is not ours
    manifest = read_manifest(root) if storage_for(root).is_folder(root) else None
    if manifest is None or differing_params(manifest, generation_params(cfg)):
        raise UserError(f"dataset.keep_files: false deletes the dataset after the run, but "
                        f"{root} was not generated by dlio-mpi with this configuration, so "
                        "its files are not dlio-mpi's to delete; set keep_files: true")


STRIPING_HINTS = ("striping_factor", "striping_unit")


def striping_set_by(result: GenerationResult) -> str:
    """What set the layout of the files this generation created: MPI-IO striping hints at
    their collective creation (ROMIO's Lustre driver applies them then, over the folder's
    layout), storage.lustre on their folder, or the file system's default."""
    if not result.files_written:
        return "no file created"
    hints = (result.collective or {}).get("hints_requested", {})
    if any(name in hints for name in STRIPING_HINTS):
        return "reader.mpiio_hints (striping hints at creation)"
    if (result.striping or {}).get("status") == "applied":
        return "storage.lustre (lfs setstripe on the folder)"
    return "the file system's default"


def run_generation(comm, cfg, plan: RunPlan, out: OutputFolder | None = None,
                   check_every_file: bool = False) -> GenerationResult:
    """Generate the dataset (striping the data folder first when storage.lustre asks);
    returns what it did. check_every_file: do not trust a complete
    manifest's spot checks (the `generate` command: it repairs a dataset that lost files)."""
    _core.stop_on_signals()
    splits = plan.splits
    result = generate(comm, cfg, splits, plan.layouts, trust_complete=not check_every_file)
    striping = result.striping
    for key in ("note", "mismatch"):
        if striping and striping.get(key):
            say(comm, f"striping: {striping[key]}", out=out)
    together = (f" by all {comm.Get_size()} ranks together through MPI-IO (Write_at_all)"
                if result.collective and result.files_written else "")
    split = (f"; {verdict_text(result.time_split)}"
             if result.time_split and result.files_written else "")
    say(comm, f"generated {result.files_written} files{together} ("
              f"{result.bytes_written / 2**20:.1f} MiB, {result.mib_per_second:.1f} MiB/s), "
              f"{result.files_skipped} already complete, under {splits['train'].root}{split}",
        out=out)
    return result


@dataclass
class Phase:
    """Training or evaluation: one split read by one engine with its own batch, step count,
    per-step time and shuffling. Evaluation reads in file order and has no per-step barrier
    (as in DLIO)."""

    name: str
    split: DatasetSplit
    files: SplitFiles
    reader: ReaderBackend
    spec: ReaderSpec  # the reader backend's (readers.files_spec)
    shuffle: ShuffleSpec
    steps: int
    batch: int
    step_time: TimeSpec
    barrier: bool
    pacing: Pacing
    policy: AccessPolicy
    cache: CacheTier | None = None  # reader.cache


def open_phase(comm, cfg, plan: RunPlan, name: str, pacing: Pacing,
               cache: CacheTier | None = None) -> Phase:
    """Find the phase's files and start its engine (collectively); with reader.cache, its
    engine reads through `cache`."""
    train = name == "train"
    split = plan.splits["train" if train else "valid"]
    files = locate_split(comm, cfg, split)
    rd = cfg.reader
    policy = access_policy(rd, split, *on_root(comm, lambda: loader_inputs(split.format,
                                                                            files.path(0))))
    spec = files_spec(cfg, files)
    reader = check_all(comm, lambda: open_reader(cfg, files, comm, spec))
    if cache is not None:
        reader.attach_cache(cache, name, files)
    opened = spec.opened_line(name, reader)
    if opened:  # reader.staging (read_once, replicated) read the files just now
        say(comm, opened)
    if train:
        return Phase(name, split, files, reader, spec,
                     ShuffleSpec(rd.file_shuffle, rd.sample_shuffle, cfg.train.seed,
                                 cfg.train.seed_change_epoch),
                     plan.steps_per_epoch, rd.batch_size, cfg.train.computation_time, True,
                     pacing, policy, cache)
    return Phase(name, split, files, reader, spec, ShuffleSpec(), plan.eval_steps_per_epoch,
                 rd.batch_size_eval, cfg.evaluation.eval_time, False, pacing, policy, cache)


def run_phase_epoch(comm, cfg, phase: Phase, epoch: int, rng: np.random.Generator,
                    topo: Topology, wall_offset: int, out: OutputFolder,
                    pause_after: list[int] = (), pause=None,
                    tracer: RankTrace | None = None,
                    intervals: IntervalStats | None = None) -> EpochSummary | None:
    """One epoch of a phase on every rank; the gathered summary on rank 0, else None.
    `pause_after`, `pause`: checkpoints ending blocks of steps (training.run_epoch);
    `tracer`: output.trace's; `intervals`: output.stats_interval's."""
    rank = comm.Get_rank()
    split = phase.split
    entropy = draw_entropy(comm, phase.shuffle)
    if phase.barrier and cfg.reader.sampling == "replacement":  # training's draws
        shard = rank_draws(split.num_samples, phase.shuffle, epoch, entropy, rank,
                           phase.steps * phase.batch)
    else:
        shard = rank_shard(split.num_files, split.samples_per_file,
                           epoch_shuffle(phase.shuffle, epoch, entropy), rank,
                           phase.steps * phase.batch)
    shard = order_batches(shard, phase.steps, phase.batch, cfg.reader.access_order)
    rd = cfg.reader
    # per sample, in the reader before the batch is ready: a sleep, then CPU work
    delays, cpu = (np.round(spec.draw(rng, phase.steps * phase.batch) * 1e9).astype(np.int64)
                   if spec.mean > 0 else None
                   for spec in (rd.preprocess_time, rd.preprocess_cpu_time))
    reads = plan_reads(shard, phase.steps, phase.batch, split.samples_per_file,
                       phase.files.layouts, phase.spec.read_mode(cfg), phase.policy, delays, cpu)
    if phase.cache is not None:  # its readers may run that many batches ahead
        ahead = phase.spec.batches_in_flight(rd)
        reads = phase.cache.plan_epoch(phase.name, reads, ahead + 2)
    host = {kind: spec.draw(rng, phase.steps)
            for kind, spec in (("cpu", rd.step_cpu_time), ("wait", rd.step_wait_time))
            if spec.mean > 0}
    trace = run_epoch(comm, phase.reader, reads, phase.step_time.draw(rng, phase.steps), epoch,
                      phase.pacing, barrier=phase.barrier, pause_after=pause_after,
                      pause=pause, name=phase.name, intervals=intervals, host_s=host)
    if tracer is not None:
        tracer.epoch(phase.name, epoch, reads, trace, phase.files.path)
    if cfg.output.access_log:
        out.write(access_log_name(phase.name, epoch, rank),
                  lambda fp: np.save(fp, trace.sample_ids), binary=True)
    metric = cfg.output.metric
    # stopped early: with the per-step synchronisation every rank ran the same steps, without
    # it (evaluation) each stopped on its own, so agree on the fewest
    steps = trace.steps if phase.barrier else comm.allreduce(trace.steps, op=_min_op())
    if steps < phase.steps and steps <= metric.exclude_start_steps + metric.exclude_end_steps:
        return None  # stopped before any step AU counts
    latest = last_arrivals(comm, trace, topo.clock_offset_ns)
    record = condense(trace, latest, rank, phase.batch, reads.bytes_requested,
                      cfg.output.metric.exclude_start_steps, cfg.output.metric.exclude_end_steps,
                      wall_offset)
    records = comm.gather(record, root=0)
    if rank != 0:
        return None
    if cfg.output.access_log:  # every rank's is written by now
        for r in range(comm.Get_size()):
            out.record(access_log_name(phase.name, epoch, r))
    summary = EpochSummary(epoch, records, dlio_record_length(cfg.dataset))
    say(comm, f"{phase.name} epoch {epoch}: AU {summary.au_percentage:.2f} %, "
              f"{summary.samples_per_second:.1f} samples/s, "
              f"{summary.transfer_mib_per_second:.1f} MiB/s read, {summary.seconds:.2f} s, "
              f"emulator overhead {summary.overhead_us_per_step:.1f} us/step", out=out)
    summary.json_text()  # its per_epoch_stats.json entry, encoded now: a stop only writes it
    if phase.cache is not None and (warning := room_warning(
            [r.cache for r in records], cfg.reader.cache.folder, phase.name, epoch)):
        say(comm, warning, out=out)
    return summary


@dataclass
class Checkpoints:
    """The run's checkpointer and what it did: (when it was due, its record) per save/load."""

    checkpointer: Checkpointer
    records: list = field(default_factory=list)
    dues: list = field(default_factory=list)  # every save's Due, by its index - 1

    def save(self, due: Due, out: OutputFolder) -> None:
        """Collective: save the checkpoint `due` now (the run's next save); with
        checkpoint.async_write its write goes on after this returns."""
        self.dues.append(due)
        self._done(self.checkpointer.save(due.checkpoint_id, len(self.dues)), out)

    def finish(self, out: OutputFolder, final: bool = False) -> None:
        """Collective: wait for an asynchronous save's write still under way; complete the
        drains done (all of them, waited for, when `final`)."""
        self._done(self.checkpointer.finish(final), out)

    def hold_locks(self, out: OutputFolder) -> None:
        """Rank 0: the checkpoint folder's lock, and drain.to's, held till the run ends."""
        ckpt = self.checkpointer
        for lock in (ckpt.lock, ckpt.drainer.lock if ckpt.drainer is not None else None):
            if lock is not None:
                out.hold(lock)

    def _done(self, records: list[CheckpointRecord], out: OutputFolder) -> None:
        for record in records:
            self.records.append((self.dues[record.index - 1], record))
            say(self.checkpointer.comm, announce(record), out=out)


def train(comm, cfg, plan: RunPlan, topo: Topology, pacing: Pacing, out: OutputFolder,
          checkpoints: Checkpoints | None = None, tracer: RankTrace | None = None,
          intervals: IntervalStats | None = None, cache: CacheTier | None = None
          ) -> tuple[list[EpochSummary], list[EpochSummary], int, dict]:
    """The training epochs, each followed by evaluation when it is due, with the
    checkpoints due (workflow.checkpoint: `checkpoints`) and reader.cache's tier (`cache`,
    claimed already; closed here); returns the train and eval epoch summaries (complete on
    rank 0 only), the signal that stopped them early on every rank (0: none) and each
    phase's reader backend's description."""
    rank = comm.Get_rank()
    rng = np.random.default_rng([cfg.train.seed, rank])
    wall_offset = time.time_ns() - _core.now_ns()
    if cache is not None:  # what its copies copy (the staged copy, with stage-in)
        cache.source_root = next(iter(plan.splits.values())).root
    phases: list[Phase] = []
    try:
        for name in ("train", "eval") if cfg.workflow.evaluation else ("train",):
            phases.append(open_phase(comm, cfg, plan, name, pacing, cache))
    except Stopped as stopped:  # a signal during reader.staging's reads: no epoch ran
        for phase in phases:
            phase.reader.close()
        return [], [], stopped.signum, {}
    done: dict[str, list[EpochSummary]] = {"train": [], "eval": []}
    next_eval = cfg.evaluation.eval_after_epoch
    stop = 0
    schedule = Schedule.of(cfg, plan.steps_per_epoch) if checkpoints is not None else None
    for epoch in range(1, cfg.train.epochs + 1):
        for phase in phases:
            if phase.name == "eval":
                if epoch < next_eval:
                    continue
                next_eval += cfg.evaluation.epochs_between_evals
                if checkpoints is not None:  # an evaluation waits for a save's write
                    checkpoints.finish(out)
            due = schedule.in_epoch(epoch) if schedule and phase.name == "train" else []
            by_step = {d.step: d for d in due}
            summary = run_phase_epoch(
                comm, cfg, phase, epoch, rng, topo, wall_offset, out,
                pause_after=steps_due(due, phase.steps),
                pause=lambda step, by_step=by_step: checkpoints.save(by_step[step], out),
                tracer=tracer, intervals=intervals)
            if summary is not None:
                done[phase.name].append(summary)
            # the step loop stops every rank after the same step; a signal that came during
            # evaluation (no per-step synchronisation) or between epochs is agreed on here
            stop = agreed_stop(comm)
            if stop:
                break
            if phase.name == "train":  # after the last step (step mode) or the epoch
                for last in after_epoch(due, phase.steps):
                    checkpoints.save(last, out)
        if stop:
            break
    if checkpoints is not None:  # the run ends when the last save is written and drained
        checkpoints.finish(out, final=True)
        stop = stop or agreed_stop(comm)  # a signal that cut a drain short
    # Closed only on success: on an error the job aborts at once, without waiting for reads
    # in flight (a stuck one would otherwise hold the abort back).
    described = {phase.name: phase.reader.describe() for phase in phases}
    for phase in phases:
        phase.reader.close()
    if cache is not None:
        described["cache"] = cache.describe()
        cache.close()
    return done["train"], done["eval"], stop, described


def _header(comm, cfg, plan: RunPlan, topo: Topology, pacing: Pacing, start: float,
            end: float) -> dict:
    """The run's description: DLIO's fields (its meanings: lists per node, GB = 2^30 bytes,
    data per host from the configured record length), then ours."""
    ds = cfg.dataset
    size = comm.Get_size()
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, root=0)
    pacings = comm.gather(pacing.to_json(), root=0)
    environment = describe_environment(comm, topo.node)
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
            "environment": environment,
            "config": cfg.to_dict(),  # resolved: every key with the value this run used
        },
    }


def _spread_of(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


@dataclass
class RunRecord:
    """What a run gathers for its results as it goes (write_results)."""

    start: float        # time.time() when the run began
    out: OutputFolder
    pacing: Pacing
    striping: dict | None = None    # what storage.lustre did
    generation: dict | None = None  # what this run's data generation did
    checkpoints: Checkpoints | None = None  # the checkpoints saved and loaded
    stage_in: dict | None = None    # what storage.stage_in did
    trace: dict | None = None       # what output.trace wrote (write_trace)
    readers: dict | None = None     # rank 0's reader backends, described
    train_epochs: list[EpochSummary] = field(default_factory=list)
    eval_epochs: list[EpochSummary] = field(default_factory=list)
    stopped_by: int = 0             # the signal that ended the run early


def write_results(comm, cfg, plan: RunPlan, topo: Topology, record: RunRecord) -> dict:
    """Rank 0 writes summary.json, per_epoch_stats.json and config.yaml, each whole or not at
    all; returns the summary."""
    pacing, start, out, stopped_by = record.pacing, record.start, record.out, record.stopped_by
    striping, readers, generation = record.striping, record.readers, record.generation
    checkpoints, trace, stage_in = record.checkpoints, record.trace, record.stage_in
    train_epochs = record.train_epochs
    header = _header(comm, cfg, plan, topo, pacing, start, time.time())
    header["dlio_mpi"]["workload_file"] = out.workload  # the file read, absolute
    header["dlio_mpi"]["complete"] = not stopped_by
    header["dlio_mpi"]["stopped_by"] = signal.Signals(stopped_by).name if stopped_by else None
    wall_offset = time.time_ns() - _core.now_ns()  # rank 0's: checkpoint records' clock
    node_of_rank = comm.gather(topo.node, root=0)

    def write() -> dict:
        # on rank 0 only (lfs runs once); data_file: the layout a data file really took
        folders = {}
        if plan.splits:
            train = plan.splits["train"]
            folders = {"data_folder": train.root, "data_file": train.path(0)}
        if checkpoints is not None:
            folders["checkpoint_folder"] = cfg.checkpoint.checkpoint_folder
        if stage_in is not None:
            folders["stage_folder"] = stage_in["to"]
        if cfg.reader.cache is not None:
            folders["cache_folder"] = cfg.reader.cache.folder
        header["dlio_mpi"]["filesystems"] = describe_filesystems(
            {**folders, "output_folder": cfg.output.folder})
        header["dlio_mpi"]["striping"] = striping
        header["dlio_mpi"]["readers"] = readers
        header["dlio_mpi"]["generation"] = generation
        header["dlio_mpi"]["trace"] = trace
        header["dlio_mpi"]["stage_in"] = stage_in
        header["dlio_mpi"]["bandwidth_per_node"] = node_bandwidth(
            train_epochs, node_of_rank, [h.hostname for h in topo.hosts])
        if checkpoints is not None:
            header["dlio_mpi"]["checkpoint"] = describe_checkpoints(
                cfg, checkpoints.checkpointer, [r for _, r in checkpoints.records], topo)
        summary, table = write_result_files(out, cfg, header, record,
                                            [topo.hosts[node] for node in node_of_rank],
                                            wall_offset)
        say(comm, table, f"results in {out.path('summary.json')}", out=out)
        return summary

    return on_root(comm, write, nap=True)  # ~1 s for 10,000 epochs: the others sleep


def write_result_files(out: OutputFolder, cfg, header: dict, record: RunRecord,
                       rank_hosts: list[HostInfo], wall_offset_ns: int) -> tuple[dict, str]:
    """Rank 0: summary.json (`header`: the run's description), per_epoch_stats.json,
    config.yaml and each rank's files (`rank_hosts`: each rank's host), each whole or not at
    all; returns the summary and the table to print. Its time grows with the epochs (a
    stopped run writes these before it exits): each epoch's figures and entry were computed
    and encoded as it ended, and the other files are written by json's C encoder."""
    train, evals, checkpoints = record.train_epochs, record.eval_epochs, record.checkpoints
    summary = build_summary(train, evals, cfg, header)
    if checkpoints is not None:
        summary["metric"].update(metric_fields(checkpoints.checkpointer,
                                               [r for _, r in checkpoints.records]))
    stats = per_epoch_stats(train, evals, epoch_entries(checkpoints.records, wall_offset_ns)
                            if checkpoints is not None else None)
    out.write(SUMMARY, lambda fp: jsonfile.dump(summary, fp, depth=None))
    out.write(PER_EPOCH_STATS, lambda fp: jsonfile.dump(stats, fp))
    out.write(CONFIG, lambda fp: yaml.safe_dump({"workload": cfg.to_dict()}, fp,
                                                sort_keys=False))
    for name in (SUMMARY, PER_EPOCH_STATS, CONFIG):
        out.record(name)
    write_per_rank(out, rank_hosts, summary["data_size_per_host_GB"], record, wall_offset_ns)
    return summary, format_table(train, evals, summary)


def write_per_rank(out: OutputFolder, rank_hosts: list[HostInfo], per_host_gb: float,
                   record: RunRecord, wall_offset_ns: int) -> None:
    """Rank 0: each rank's RANK_output.json (DLIO's) and RANK_per_epoch_stats.json (MLPerf's
    DLIO fork's), which MLPerf Storage's checker asks for, from the figures gathered."""
    checkpoints = record.checkpoints.records if record.checkpoints is not None else []
    files = rank_files(rank_hosts, per_host_gb, record.train_epochs, record.eval_epochs,
                       checkpoints, wall_offset_ns)
    for rank, bodies in enumerate(files):
        for name, body in zip((output_name(rank), epoch_stats_name(rank)), bodies):
            out.write(name, lambda fp, body=body: jsonfile.dump(body, fp))
            out.record(name)


def write_trace(comm, tracer: RankTrace, out: OutputFolder,
                checkpoints: Checkpoints | None) -> dict | None:
    """output.trace: every rank writes its trace file (with a span per checkpoint save and
    load), rank 0 lists them all and returns what they hold and cost (summary.json's
    dlio_mpi.trace), the other ranks None."""
    records = [r for _, r in checkpoints.records] if checkpoints is not None else []
    for r in records:  # the earliest start to the latest end over the ranks, rank 0's clock
        tracer.span(f"checkpoint {r.kind} {r.index}", "checkpoint", r.start_ns, r.end_ns,
                    {"bytes": r.bytes, "id": r.checkpoint_id}, rank0_clock=True)
    name = trace_name(comm.Get_rank())
    check_all(comm, lambda: out.write(name, tracer.write, binary=True))
    stats = comm.gather(tracer.stats(), root=0)
    if comm.Get_rank() != 0:
        return None
    for rank in range(comm.Get_size()):
        out.record(trace_name(rank))
    return {"files": [trace_name(rank) for rank in range(comm.Get_size())],
            "events": sum(s["events"] for s in stats),
            "requests": sum(s["requests"] for s in stats),
            "bytes": sum(s["bytes"] for s in stats),
            # the emulator's own time, between epochs and after the last: the slowest rank's
            "seconds_max": max(s["seconds"] for s in stats),
            "seconds_per_rank": [s["seconds"] for s in stats],
            "compressor": stats[0]["compressor"]}


def run_stage_in(comm, cfg, plan: RunPlan, topo: Topology, out: OutputFolder,
                 tracer: RankTrace | None):
    """storage.stage_in: copy the splits training reads to the stage folder (collectively);
    what it did, and the copy (for its cleaning)."""
    opts = cfg.storage.stage_in
    names = ["train"] + (["valid"] if cfg.workflow.evaluation
                         and plan.splits["valid"].num_files else [])
    files = StageSet({name: locate_split(comm, cfg, plan.splits[name]) for name in names})
    began = _core.now_ns()
    result, stage = stage_in(comm, opts, files, data_root(cfg), topo, out.tag)
    if tracer is not None:
        tracer.span("stage_in", "stage_in", began, _core.now_ns(),
                    {"bytes_per_copy": result.bytes, "copies": result.copies})
    say(comm, f"stage-in: {result.files} file(s), {result.bytes / 2**20:.1f} MiB per copy, "
              f"{result.copies} cop{'y' if result.copies == 1 else 'ies'} under {opts.to} "
              f"({opts.scope}) in {result.seconds:.2f} s, "
              f"{result.bytes * result.copies / 2**30 / max(result.seconds, 1e-9):.2f} GiB/s",
        out=out)
    return result, stage


def _recorded(root: str, splits, sized: list[str]) -> dict:
    """The recorded sizes of the `sized` splits' files (None for a split without them)."""
    manifest = read_manifest(root)
    return {name: read_sizes(root, name, splits[name].num_files, manifest,
                             splits[name].format.record_width) for name in sized}


def remove_dataset(comm, plan: RunPlan) -> int:
    """`dataset.keep_files: false`: every rank deletes its share of the generated files (and
    their side files) that are still as generated (a regular file of the generated size: a
    changed one cannot be told from a foreign one, and stays); rank 0 then the manifest and
    the folders left empty. Returns how many files were kept, over all ranks."""
    rank, size = comm.Get_rank(), comm.Get_size()
    kept = 0
    root = plan.splits["train"].root
    fs = storage_for(root)
    sized = [name for name, s in plan.splits.items() if s.format.sizes_recorded]
    recorded = on_root(comm, lambda: _recorded(root, plan.splits, sized)) if sized else {}
    for name, split in plan.splits.items():
        mine = np.arange(rank, split.num_files, size, dtype=np.int64)
        if name not in sized:
            expected = plan.layouts[name].take(mine).size
        elif recorded[name] is not None:
            expected = size_column(recorded[name])[mine]
        else:  # no record of the sizes: none of the files can be told ours
            kept += len(mine)
            continue
        for index, want in zip(mine.tolist(), expected.tolist()):
            path = split.path(index)
            st = fs.entry(path)
            if st is None:
                continue
            if st.kind != "file" or st.size != want:
                kept += 1
                continue
            fs.remove_quietly([path, *(p for p in split.format.side_files(path)
                                       if (side := fs.entry(p)) and side.kind == "file")])
    kept = comm.allreduce(kept)
    if rank == 0:
        if not kept:
            fs.remove_quietly([manifest_path(root),
                               *(sizes_path(root, name) for name in sized)])
        folders = {f for s in plan.splits.values() for f in s.naming.folders()}
        folders |= set(side_folders(plan.splits, sorted(folders)))  # tfrecord's index/<split>
        for folder in sorted(folders | {os.path.dirname(f) for f in folders} | {root},
                             key=len, reverse=True):
            fs.remove_folder(folder)  # not if something not ours is there: it stays
    return kept


def run(comm, cfg, workload: str | None = None,
        hydra_record: dict[str, str] | None = None, hydra_run_dir: bool = False) -> dict | None:
    """The whole job; returns the summary (on every rank) when training ran. `workload`: the
    workload file given, which is never replaced; `hydra_record`: the texts of Hydra's record
    of the job by relative path (config.hydra), written into output.folder with the results;
    `hydra_run_dir`: output.folder is Hydra's run folder (++hydra.run.dir), whose entries that
    are not ours are left in place (a tool driving DLIO puts its own files there)."""
    start = time.time()
    _core.stop_on_signals()
    files_rows = on_root(comm, lambda: files_row_groups(cfg))  # parquet data's own row groups
    if files_rows is not None:
        cfg = dataclasses.replace(cfg, dataset=dataclasses.replace(
            cfg.dataset, parquet=dataclasses.replace(cfg.dataset.parquet, **files_rows[0])))
    plan, topo = prepare(comm, cfg)
    if not cfg.dataset.keep_files and plan.splits:
        on_root(comm, lambda: check_dataset_removable(cfg, plan))
    striping = None
    if cfg.storage.lustre is not None:  # storage.lustre.required refuses before any I/O
        if plan.splits:
            striping = on_root(comm, lambda: check_striping(cfg.storage.lustre,
                                                            data_root(cfg)))
        if cfg.workflow.checkpoint:  # the checkpoint folder takes the layout too
            on_root(comm, lambda: check_striping(cfg.storage.lustre,
                                                 cfg.checkpoint.checkpoint_folder))
    on_root(comm, lambda: check_direct_io(cfg, data_root(cfg)))  # real direct I/O, or none
    if cfg.workflow.generate_data and plan.splits:  # no room for the dataset: before any I/O
        on_root(comm, lambda: check_dataset_space(data_root(cfg), plan.dataset_bytes))
    out = open_output(comm, cfg, plan, workload, hydra_record, hydra_run_dir)
    if files_rows is not None:
        say(comm, f"note: {files_rows[1]}", out=out)
    try:
        summary = _run_claimed(comm, cfg, plan, topo, out, start, striping)
    except JobError as exc:  # agreed on by every rank: the log says why the run ended
        state = "incomplete" if isinstance(exc, Stopped) else "failed"
        message = f"dlio-mpi: error: {exc}"

        def close_log() -> None:
            out.log(message)
            out.finish(state)

        on_root(comm, close_log)
        raise
    on_root(comm, lambda: out.finish("complete"))
    return summary


def _run_claimed(comm, cfg, plan: RunPlan, topo: Topology, out: OutputFolder,
                 start: float, striping: dict | None) -> dict | None:
    root = data_root(cfg)
    filesystems = on_root(comm, lambda: describe_filesystems(_run_folders(cfg, plan, root)))
    say(comm, describe_plan(plan, cfg, filesystems, striping, workload_file=out.workload),
        out=out)
    checkpoints = None
    if cfg.workflow.checkpoint:  # its folder made ready (or refused) before any other I/O
        checkpoints = Checkpoints(open_checkpointer(
            comm, cfg, plan, topo, out.tag, lambda line: say(comm, line, out=out)))
        on_root(comm, lambda: checkpoints.hold_locks(out))  # till the run ends
    cache = None
    if cfg.workflow.train and cfg.reader.cache is not None:  # claimed before other I/O too
        cache = CacheTier(comm, cfg.reader.cache, topo, out.tag, root)
    tracer = RankTrace.start(comm, topo.clock_offset_ns) if cfg.output.trace else None
    intervals = IntervalStats.start(comm, cfg.output.stats_interval, topo.clock_offset_ns,
                                    lambda line: say(comm, line, out=out)) \
        if cfg.workflow.train else None
    generation = None
    if cfg.workflow.generate_data:
        generation, striping = _generate_in_run(comm, cfg, plan, out, tracer, striping)
    summary, stop, done = None, 0, "training epoch(s)"
    pacing = make_pacing(cfg.train.compute_spin_us, cfg.train.sync_spin_us,
                         cfg.train.batch_spin_us,
                         auto_batch_spin_ns(topo.host_ranks, cfg.reader.read_threads,
                                            usable_cpus(), models_loader_costs(cfg.reader),
                                            background_threads(cfg)))
    record = RunRecord(start, out, pacing, striping, generation, checkpoints)
    staged = None
    with contextlib.ExitStack() as held:
        if cache is not None:
            held.callback(cache.release)  # the cache folder's lock, however the run ends
        if checkpoints is not None:  # an async save's write waited for, however it ends
            held.callback(checkpoints.checkpointer.close)
        if cfg.workflow.train and cfg.storage.stage_in is not None and plan.splits:
            try:
                staged, stage = run_stage_in(comm, cfg, plan, topo, out, tracer)
            except Stopped as stopped:  # the copy cut short: no epoch runs
                record.stopped_by = stopped.signum
            else:
                held.callback(stage.release)  # the stage folder's lock, however the run ends
                record.stage_in = staged.to_json(root)
        if cfg.workflow.train:
            read_plan = plan if staged is None else dataclasses.replace(plan, splits={
                name: rerooted(split, staged.root) for name, split in plan.splits.items()})
            summary = _train_and_write(comm, cfg, plan, read_plan, topo, record, tracer,
                                       intervals, cache)
            stop = record.stopped_by
            done = f"{len(record.train_epochs)} complete or partial training epoch(s)"
        elif checkpoints is not None:
            records, stop = run_checkpoint_only(comm, cfg, checkpoints.checkpointer,
                                                lambda line: say(comm, line, out=out))
            checkpoints.records.extend((None, r) for r in records)
            if tracer is not None:
                record.trace = write_trace(comm, tracer, out, checkpoints)
            record.stopped_by = stop
            summary = write_results(comm, cfg, plan, topo, record)
            done = f"{len(records)} checkpoint save(s) and load(s)"
        elif tracer is not None:  # generation alone
            write_trace(comm, tracer, out, checkpoints)
        if staged is not None and cfg.storage.stage_in.clean:
            clean_stage(comm, stage)
            say(comm, f"removed the staged copy under {staged.root} (storage.stage_in.clean)",
                out=out)
    if stop:
        raise Stopped(f"stopped by {signal.Signals(stop).name} after {done}; the results "
                      f"so far are in {out.path('summary.json')}, marked incomplete "
                      "(dlio_mpi.complete: false)", stop)
    if not cfg.dataset.keep_files and plan.splits:
        kept = remove_dataset(comm, plan)
        say(comm, f"removed the dataset under {plan.splits['train'].root} "
                  "(dataset.keep_files: false)" + (
                      f"; kept {kept} file(s) changed since they were generated, and the "
                      "manifest" if kept else ""), out=out)
    return summary


def _train_and_write(comm, cfg, plan: RunPlan, read_plan: RunPlan, topo: Topology,
                     record: RunRecord, tracer, intervals, cache) -> dict:
    """The training epochs of `read_plan` (none when a stop already came: record.stopped_by)
    and the results; the summary."""
    out, checkpoints = record.out, record.checkpoints
    if not record.stopped_by:
        record.train_epochs, record.eval_epochs, record.stopped_by, record.readers = train(
            comm, cfg, read_plan, topo, record.pacing, out, checkpoints, tracer, intervals,
            cache)
    if intervals is not None:
        on_root(comm, lambda: intervals.write(out))
        intervals.close()
    if tracer is not None:
        record.trace = write_trace(comm, tracer, out, checkpoints)
    return write_results(comm, cfg, plan, topo, record)


def _run_folders(cfg, plan: RunPlan, root: str) -> dict[str, str]:
    """The folders the run uses, by role (summary.json's dlio_mpi.filesystems)."""
    folders = {"data_folder": root} if plan.splits else {}
    if cfg.workflow.checkpoint:
        folders["checkpoint_folder"] = cfg.checkpoint.checkpoint_folder
    if cfg.storage.stage_in is not None and cfg.workflow.train:
        folders["stage_folder"] = cfg.storage.stage_in.to
    if cfg.reader.cache is not None:
        folders["cache_folder"] = cfg.reader.cache.folder
    folders["output_folder"] = cfg.output.folder
    return folders


def _generate_in_run(comm, cfg, plan: RunPlan, out: OutputFolder, tracer,
                     striping: dict | None) -> tuple[dict, dict | None]:
    """workflow.generate_data inside a run: the generation's summary and the striping."""
    began = _core.now_ns()
    result = run_generation(comm, cfg, plan, out)
    if tracer is not None:
        tracer.span("generate", "generate", began, _core.now_ns(),
                    {"files_written": result.files_written,
                     "bytes_written": result.bytes_written})
    striping = result.striping or striping
    return ({"files_written": result.files_written, "files_skipped": result.files_skipped,
             "bytes_written": result.bytes_written, "seconds": result.seconds,
             "collective": result.collective, "striping_set_by": striping_set_by(result),
             "time_split": result.time_split if result.files_written else None},
            striping)


def _min_op():
    from mpi4py import MPI

    return MPI.MIN
