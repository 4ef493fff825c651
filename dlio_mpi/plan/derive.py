"""The derived plan of a run: what will be read, by how many ranks, in how many steps, and how
that compares with the nodes' memory. Computed from the configuration alone (no storage I/O),
on every rank, before anything is touched; `dlio-mpi validate` prints it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..data.dataset import DatasetSplit, LayoutTable, describe_dataset
from ..errors import UserError, check_all, on_root
from ..formats import adopt_layouts, implemented_formats, learned_layouts
from ..mpi.host_memory import Budget, node_budget
from ..mpi.topology import emulated_ranks_per_node, host_info, plan_topology
from ..readers import engine_refusal, reader_spec
from ..sampling.requests import READ_MODES
from ..sampling.sharding import steps_per_epoch
from .checks import (
    batch_held,
    check_measurable,
    check_pt_save_importable,
    check_reader_fits,
    check_sizes,
    check_snapshot_pace,
    check_whole_file_reads,
    checkpoint_held,
    run_held,
    shapes_held,
    staging_held,
)
from .folders import check_folders_apart
from .limits import MAX_FILE_BYTES
from .memory import check_memory
from .notes import plan_notes, unused_hints_note


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


def derive_plan_everywhere(comm, derive: Callable[[], RunPlan]) -> RunPlan:
    """`derive()` (a derive_plan call) on every rank, agreed as check_all agrees. Rank 0
    derives first and hands what its formats learned at a cost (formats.learned_layouts:
    parquet's layouts, each a whole file written through pyarrow) to the others, so that the
    ranks of a node do not each pay that CPU time and memory; its errors come back below."""
    if comm.Get_size() > 1:
        def learn() -> dict:
            try:
                derive()
            except (UserError, OSError, ValueError):
                pass  # raised again, on every rank, by check_all
            return learned_layouts()

        adopt_layouts(on_root(comm, learn))
    return check_all(comm, derive)


def derive_plan(cfg, ranks: int, ranks_per_node: int | None = None, nodes: int | None = None,
                memory_bytes: int | None = None, generating: bool = False,
                local_ranks: int = 1, budget: Budget | None = None) -> RunPlan:
    """Check what needs the rank count and derive the plan; raises UserError. Without a
    topology (validate --ranks) the ranks are on one node, or on emulated nodes of
    DLIO_MPI_RANKS_PER_NODE ranks, with this host's memory each. `generating`: the data will
    be generated whatever workflow.generate_data says (`dlio-mpi generate`). `local_ranks`:
    the processes of this host deriving the plan at once (each holds its tables). `budget`:
    the memory a node can still give the job (plan.memory; default: this host's, or the whole
    of `memory_bytes` per node when that is given)."""
    # Memory is judged on the job's own nodes; a plan for ranks not running (validate) can
    # only say whether one rank would fit in this host's memory.
    known = ranks_per_node is not None and nodes is not None
    if not known:
        ranks_per_node, nodes = plan_topology(ranks, emulated_ranks_per_node())
    if budget is None:
        budget = node_budget() if memory_bytes is None else Budget(memory_bytes // nodes,
                                                                    "the node's memory")
    if memory_bytes is None:
        memory_bytes = host_info().memory_bytes * nodes
    fmt = cfg.dataset.format
    # the ranks a node holds: the job's; a plan for ranks not running (validate) can only say
    # whether the ranks deriving it on this host would fit
    counted = ranks_per_node if known else max(local_ranks, 1)
    check_folders_apart(cfg)
    held = [h for h in (shapes_held(cfg), staging_held(cfg, ranks_per_node, nodes)) if h]
    check_memory(held, counted, budget)  # before the shapes are drawn
    mode = reader_spec(cfg).read_mode(cfg)
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
        check_reader_fits(cfg)
        check_whole_file_reads(cfg, mode)
        splits = describe_dataset(cfg)
        check_sizes(cfg, splits)
        train = splits["train"]
        if cfg.workflow.train and not generating:  # files the engine cannot read yet
            refusal = train.format.read_refusal(train.spec(0))
            if refusal:
                raise UserError(refusal)
            library_read = train.format.library_read_reason(train.spec(0))
        layouts = {name: split.expected_layouts() for name, split in splits.items()}
        files, samples = train.num_files, train.num_samples
        dataset_bytes = sum(table.total("size") for table in layouts.values())
        if cfg.workflow.train:
            # the reader backend with what it cannot read
            refused = engine_refusal(cfg, library_read)
            if refused:
                raise UserError(refused)
            steps = _train_steps(cfg, train, ranks)
            check_measurable(steps, cfg, "training")
            epoch_bytes = _epoch_bytes(train, layouts["train"], mode,
                                       steps * cfg.reader.batch_size * ranks)
            held.append(batch_held(cfg, epoch_bytes, steps, ranks, library_read))
            if cfg.workflow.evaluation:
                eval_steps = _steps(splits["valid"], ranks, cfg.reader.batch_size_eval,
                                    "reader.batch_size_eval", "dataset.num_files_eval")
                check_measurable(eval_steps, cfg, "evaluation")
    checkpoint = _checkpoint_plan(cfg, ranks, steps)
    if checkpoint is not None and checkpoint["writer"] == "pt_save":
        check_pt_save_importable()
    check_snapshot_pace(cfg, checkpoint)
    check_memory([h for h in (*held, *checkpoint_held(cfg, checkpoint),
                              *run_held(cfg, ranks)) if h], counted, budget)
    return RunPlan(
        ranks=ranks, format=fmt, read_mode=mode, train_files=files, train_samples=samples,
        samples_per_rank=steps * cfg.reader.batch_size, steps_per_epoch=steps,
        eval_steps_per_epoch=eval_steps,
        epochs=cfg.train.epochs, dataset_bytes=dataset_bytes, bytes_per_epoch=epoch_bytes,
        memory_bytes=memory_bytes, ranks_per_node=ranks_per_node, nodes=nodes,
        notes=plan_notes(cfg, library_read) + unused_hints_note(cfg, splits, ranks),
        library_read=library_read, splits=splits, layouts=layouts,
        checkpoint=checkpoint)


def _snapshot_bytes(cfg, ranks: int) -> int:
    """checkpoint.async_write's memory on the rank with the largest: its snapshot buffer
    (checkpoint/async_write.py)."""
    from ..checkpoint.async_write import snapshot_bytes
    from ..checkpoint.sizing import checkpoint_layout

    layout = checkpoint_layout(cfg, ranks)
    # a shared file's share is one part; file_per_rank's files each one (the C core's block)
    shares = ([[layout.shard(r).nbytes] for r in range(ranks)] if cfg.checkpoint.layout ==
              "shared" else [[n for _, n in layout.shard(r).files] for r in range(ranks)])
    return max(snapshot_bytes(sizes) for sizes in shares) if shares else 0


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
    if sizing["total_bytes"] > MAX_FILE_BYTES:  # shares past what int64 offsets address
        from ..config.schema import keys_set

        raise UserError(f"{', '.join(keys_set(cfg, ('model.',))) or 'model'}: a checkpoint of "
                        f"{sizing['total_bytes']:,} bytes, more than the 2^62 bytes dlio-mpi "
                        "addresses; expected a smaller model")
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
            "async_write": bool(ck.async_write),
            "content": {"compression_ratio": ck.content.compression_ratio,
                        "dedup_ratio": ck.content.dedup_ratio},
            "drain": None if ck.drain is None else {
                "to": ck.drain.to, "keep": ck.drain.keep, "restore_from": ck.drain.restore_from,
                "odirect": ck.drain.odirect, "buffer_bytes": ck.drain.buffer_bytes},
            "snapshot_bytes_per_rank": _snapshot_bytes(cfg, ranks) if ck.async_write else 0,
            "folder": ck.checkpoint_folder, "saves": saves, "loads": loads, "when": when,
            "bytes_written": saves * sizing["total_bytes"],
            "bytes_drained": saves * sizing["total_bytes"] if ck.drain is not None else 0,
            "restore_methods": restore_methods(ck) if loads else []}


