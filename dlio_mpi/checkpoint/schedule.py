"""When checkpoints are written, with the DLIO benchmark's semantics (census section 5.1).

During training (workflow.train and workflow.checkpoint):
- step mode (checkpoint.steps_between_checkpoints = k >= 0): after steps k, 2k, ... of every
  epoch (step numbers start at 1 in each epoch; k = 0 never fires); each checkpoint ends the
  current block of steps, and the next block starts after it (its time is not training's);
- epoch mode (k < 0): after the last step of epochs checkpoint_after_epoch,
  + epochs_between_checkpoints, ...; the checkpoint is named with step = steps + 1, as DLIO's
  step counter stands after an epoch.

Checkpoint-only (workflow.train false): num_checkpoints_write saves global_epoch1_step1 ..
step<n>, each after time_between_checkpoints, then num_checkpoints_read loads of step1 ..
step<m> (m <= n; with no saves, of an earlier run's complete checkpoints).

A checkpoint's folder is global_epoch<E>_step<S>, as DLIO and DeepSpeed name it."""

from __future__ import annotations

from dataclasses import dataclass


def checkpoint_id(epoch: int, step: int) -> str:
    return f"global_epoch{epoch}_step{step}"


@dataclass(frozen=True)
class Due:
    """One checkpoint due during training: after step `step` of epoch `epoch` (in epoch
    mode, after the epoch: step = steps + 1); `block`: the block of steps it ends (1, 2, ...
    within the epoch; per_epoch_stats names it save_ckpt<block>)."""

    epoch: int
    step: int
    block: int

    @property
    def checkpoint_id(self) -> str:
        return checkpoint_id(self.epoch, self.step)


def training_schedule(ck, epochs: int, steps: int) -> list[Due]:
    """The checkpoints a training run of `epochs` epochs of `steps` steps writes."""
    due = []
    if ck.steps_between_checkpoints >= 0:
        k = ck.steps_between_checkpoints
        for epoch in range(1, epochs + 1):
            if k > 0:
                due.extend(Due(epoch, step, block)
                           for block, step in enumerate(range(k, steps + 1, k), start=1))
        return due
    epoch = ck.checkpoint_after_epoch
    while epoch <= epochs:
        if epoch >= 1:
            due.append(Due(epoch, steps + 1, 1))
        epoch += ck.epochs_between_checkpoints
    return due


def steps_due(schedule: list[Due], epoch: int, steps: int) -> list[int]:
    """The steps of `epoch` after which a checkpoint ends a block inside the epoch (step
    mode, before its last step); the others come after the epoch's last step."""
    return [d.step for d in schedule if d.epoch == epoch and d.step < steps]


def after_epoch(schedule: list[Due], epoch: int, steps: int) -> list[Due]:
    """The checkpoints of `epoch` written after its last step (end of the last block)."""
    return [d for d in schedule if d.epoch == epoch and d.step >= steps]


def checkpoint_only_ids(ck) -> tuple[list[str], list[str]]:
    """(saved, loaded) checkpoint ids of the checkpoint-only workflow, in order."""
    writes = max(ck.num_checkpoints_write, 0)
    reads = max(ck.num_checkpoints_read, 0)
    return ([checkpoint_id(1, k) for k in range(1, writes + 1)],
            [checkpoint_id(1, k) for k in range(1, reads + 1)])


def planned_saves(cfg, steps: int) -> int:
    """How many checkpoints the run writes (each kept: they all need room)."""
    if not cfg.workflow.checkpoint:
        return 0
    if cfg.workflow.train:
        return len(training_schedule(cfg.checkpoint, cfg.train.epochs, steps))
    return len(checkpoint_only_ids(cfg.checkpoint)[0])
