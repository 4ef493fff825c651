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

A checkpoint's folder is global_epoch<E>_step<S>, as DLIO and DeepSpeed name it. A run may
plan millions of checkpoints (DLIO's released megatron workload: 311,541 epochs), so nothing
here lists them all: an epoch's are listed when it runs, and the whole run's are counted and
recognised by arithmetic (`Schedule`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

ID = re.compile(r"global_epoch([0-9]+)_step([0-9]+)")


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


@dataclass(frozen=True)
class Schedule:
    """The checkpoints a run saves and loads: training's (`train`, `epochs` of `steps`
    steps) or the checkpoint-only workflow's."""

    ck: object  # the checkpoint section
    train: bool
    epochs: int
    steps: int

    @staticmethod
    def of(cfg, steps: int) -> Schedule:
        return Schedule(cfg.checkpoint, bool(cfg.workflow.train), cfg.train.epochs, steps)

    # ---------------------------------------------------------------- training
    def _epoch_mode_epochs(self) -> range:
        """The epochs that end with a checkpoint (epoch mode)."""
        first, every = self.ck.checkpoint_after_epoch, self.ck.epochs_between_checkpoints
        if first < 1:
            first += -(-(1 - first) // every) * every
        return range(first, self.epochs + 1, every)

    def in_epoch(self, epoch: int) -> list[Due]:
        """The checkpoints of one training epoch, in order."""
        k = self.ck.steps_between_checkpoints
        if not self.train:
            return []
        if k >= 0:
            return [Due(epoch, step, block)
                    for block, step in enumerate(range(k, self.steps + 1, k), start=1)] if k else []
        return [Due(epoch, self.steps + 1, 1)] if epoch in self._epoch_mode_epochs() else []

    # ---------------------------------------------------------------- the whole run
    @property
    def saves(self) -> int:
        """How many checkpoints the run writes (each is kept)."""
        if not self.train:
            return max(self.ck.num_checkpoints_write, 0)
        k = self.ck.steps_between_checkpoints
        if k >= 0:
            return self.epochs * (self.steps // k) if k else 0
        return len(self._epoch_mode_epochs())

    @property
    def loads(self) -> int:
        return 0 if self.train else max(self.ck.num_checkpoints_read, 0)

    def saved(self, cid: str) -> bool:
        """Whether the run writes a checkpoint named `cid`."""
        match = ID.fullmatch(cid)
        if match is None:
            return False
        epoch, step = int(match.group(1)), int(match.group(2))
        if not self.train:
            return epoch == 1 and 1 <= step <= self.saves
        if not 1 <= epoch <= self.epochs:
            return False
        return any(d.step == step for d in self.in_epoch(epoch))

    def save_ids(self) -> list[str]:
        """The checkpoint-only workflow's saves, in order."""
        return [checkpoint_id(1, k) for k in range(1, self.saves + 1)]

    def load_ids(self) -> list[str]:
        """The checkpoint-only workflow's loads, in order."""
        return [checkpoint_id(1, k) for k in range(1, self.loads + 1)]


def steps_due(due: list[Due], steps: int) -> list[int]:
    """The steps after which one of an epoch's checkpoints `due` ends a block inside it
    (before its last step); the others come after the epoch's last step."""
    return [d.step for d in due if d.step < steps]


def after_epoch(due: list[Due], steps: int) -> list[Due]:
    """The epoch's checkpoints written after its last step (end of the last block)."""
    return [d for d in due if d.step >= steps]
