"""The derived plan of a run: what will be read, by how many ranks, in how many steps, and how
that compares with the nodes' memory. Computed from the configuration alone (no storage I/O),
on every rank, before anything is touched; `dlio-mpi validate` prints it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .dataset import DatasetSplit, LayoutTable, describe_dataset
from .errors import UserError
from .formats import implemented_formats
from .planner import READ_MODES
from .sharding import steps_per_epoch
from .topology import emulated_ranks_per_node, host_info, plan_topology

MAX_READ_THREADS = 4096  # the C engine's limit (csrc/dio_engine.c MAX_THREADS)


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


def resolve_read_mode(cfg) -> str:
    """reader.read_mode, with 'auto' following DLIO: extents for indexed formats, else the
    whole file per sample (on_demand) or once per epoch (memory)."""
    mode = cfg.reader.read_mode
    if mode != "auto":
        return mode
    if cfg.dataset.format in ("indexed_binary", "mmap_indexed_binary", "hdf5"):
        return "sample"
    return "file_once" if cfg.reader.read_type == "memory" else "file"


def _epoch_bytes(split: DatasetSplit, layouts: LayoutTable, mode: str, samples_read: int) -> int:
    """Expected bytes read per epoch when `samples_read` samples of `split` are consumed
    (exact integer arithmetic: products of sizes and counts overflow int64 at scale)."""
    if split.num_samples == 0:
        return 0
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


def _notes(cfg) -> tuple[str, ...]:
    notes = []
    if cfg.workflow.checkpoint:
        notes.append("workflow.checkpoint: checkpointing is not implemented in this version; "
                     "no checkpoints are written")
    if cfg.workflow.profiling:
        notes.append("workflow.profiling: profilers are not implemented in this version")
    return tuple(notes)


def derive_plan(cfg, ranks: int, ranks_per_node: int | None = None, nodes: int | None = None,
                memory_bytes: int | None = None, generating: bool = False) -> RunPlan:
    """Check what needs the rank count and derive the plan; raises UserError. Without a
    topology (validate --ranks) the ranks are on one node, or on emulated nodes of
    DLIO_MPI_RANKS_PER_NODE ranks, with this host's memory each. `generating`: the data will
    be generated whatever workflow.generate_data says (`dlio-mpi generate`)."""
    if ranks_per_node is None or nodes is None:
        ranks_per_node, nodes = plan_topology(ranks, emulated_ranks_per_node())
    if memory_bytes is None:
        memory_bytes = host_info().memory_bytes * nodes
    fmt = cfg.dataset.format
    if cfg.reader.read_threads > MAX_READ_THREADS:
        raise UserError(f"reader.read_threads={cfg.reader.read_threads} is more than the "
                        f"{MAX_READ_THREADS} threads the engine runs per rank")
    mode = resolve_read_mode(cfg)
    if mode not in READ_MODES:
        raise UserError(f"reader.read_mode: '{mode}' unknown; expected one of {READ_MODES}")
    uses_data = cfg.workflow.train or cfg.workflow.generate_data or generating
    steps = eval_steps = dataset_bytes = epoch_bytes = files = samples = 0
    splits, layouts = {}, {}
    if uses_data:
        if fmt not in implemented_formats():
            raise UserError(f"dataset.format: '{fmt}' is not implemented yet in dlio-mpi; "
                            f"implemented: {', '.join(implemented_formats())}")
        splits = describe_dataset(cfg)
        layouts = {name: split.expected_layouts() for name, split in splits.items()}
        train = splits["train"]
        files, samples = train.num_files, train.num_samples
        dataset_bytes = sum(table.total("size") for table in layouts.values())
        if cfg.workflow.train:
            steps = _train_steps(cfg, train, ranks)
            _check_measurable(steps, cfg, "training")
            epoch_bytes = _epoch_bytes(train, layouts["train"], mode,
                                       steps * cfg.reader.batch_size * ranks)
            if cfg.workflow.evaluation:
                eval_steps = _steps(splits["valid"], ranks, cfg.reader.batch_size_eval,
                                    "reader.batch_size_eval", "dataset.num_files_eval")
                _check_measurable(eval_steps, cfg, "evaluation")
    return RunPlan(
        ranks=ranks, format=fmt, read_mode=mode, train_files=files, train_samples=samples,
        samples_per_rank=steps * cfg.reader.batch_size, steps_per_epoch=steps,
        eval_steps_per_epoch=eval_steps,
        epochs=cfg.train.epochs, dataset_bytes=dataset_bytes, bytes_per_epoch=epoch_bytes,
        memory_bytes=memory_bytes, ranks_per_node=ranks_per_node, nodes=nodes,
        notes=_notes(cfg), splits=splits, layouts=layouts)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def describe_plan(plan: RunPlan, cfg) -> str:
    """The plan as a few lines of text."""
    lines = [
        f"workload        {cfg.model.name}: {plan.format}, read mode {plan.read_mode}, "
        f"O_DIRECT {'on' if cfg.reader.odirect else 'off'}",
        f"ranks           {plan.ranks} ({plan.ranks_per_node} per node)",
    ]
    if not (cfg.workflow.train or cfg.workflow.generate_data):
        lines.append("dataset         none: workflow.train and workflow.generate_data are off")
    else:
        lines += [
            f"training data   {plan.train_files} files, {plan.train_samples} samples "
            f"({cfg.dataset.num_samples_per_file} per file)",
            f"per epoch       {plan.steps_per_epoch} steps of batch {cfg.reader.batch_size} per "
            f"rank = {plan.samples_per_rank} samples per rank; {plan.epochs} epochs",
            *([f"evaluation      {plan.eval_steps_per_epoch} steps of batch "
               f"{cfg.reader.batch_size_eval} per rank after epoch "
               f"{cfg.evaluation.eval_after_epoch}, then every "
               f"{cfg.evaluation.epochs_between_evals}"] if plan.eval_steps_per_epoch else []),
            f"bytes per epoch {_size(plan.bytes_per_epoch)} read by all ranks "
            f"({_size(plan.bytes_per_node_epoch)} per node)",
            f"dataset size    {_size(plan.dataset_bytes)} vs {_size(plan.memory_bytes)} of "
            f"memory on the {plan.nodes} node(s)",
        ]
        if plan.fits_in_memory and not (cfg.reader.odirect or cfg.reader.drop_page_cache):
            lines.append(f"note            the dataset fits in the memory of the {plan.nodes} "
                         "node(s): after the first epoch reads may come from the page cache "
                         "(reader.odirect: true or reader.drop_page_cache: true avoid it)")
    lines.extend(f"note            {note}" for note in plan.notes)
    return "\n".join(lines)
