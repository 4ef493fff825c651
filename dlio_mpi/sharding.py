"""Who reads which samples, epoch by epoch.

Rank 0 draws the epoch's order of all samples (file_shuffle permutes files, sample_shuffle
permutes samples) and scatters contiguous blocks of it, so every rank gets the same number of
steps and, across ranks, every kept sample is read exactly once per epoch. drop_last is decided
globally: the last T mod (P*B) samples of the epoch's order are not read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHUFFLE_MODES = ("off", "seed", "random")


@dataclass(frozen=True)
class ShuffleSpec:
    """How an epoch's order is drawn (reader.file_shuffle / sample_shuffle, train.seed...)."""

    file_shuffle: str = "off"
    sample_shuffle: str = "off"
    seed: int = 123
    seed_change_epoch: bool = True

    def rng(self, mode: str, epoch: int, stream: int) -> np.random.Generator:
        """Generator for one shuffle: seeded (seed [+ epoch]) or from OS entropy (random)."""
        if mode == "random":
            return np.random.default_rng()
        seed = self.seed + epoch if self.seed_change_epoch else self.seed
        return np.random.default_rng([seed, stream])


def epoch_order(num_files: int, samples_per_file: int, shuffle: ShuffleSpec,
                epoch: int) -> np.ndarray:
    """Global sample ids (file * samples_per_file + index) in the order they are consumed."""
    files = np.arange(num_files, dtype=np.int64)
    if shuffle.file_shuffle != "off":
        files = shuffle.rng(shuffle.file_shuffle, epoch, 0).permutation(files)
    order = (files[:, None] * samples_per_file
             + np.arange(samples_per_file, dtype=np.int64)[None, :]).ravel()
    if shuffle.sample_shuffle != "off":
        order = shuffle.rng(shuffle.sample_shuffle, epoch, 1).permutation(order)
    return order


def steps_per_epoch(total_samples: int, ranks: int, batch_size: int) -> int:
    """floor(samples per rank / batch): the same on every rank."""
    return total_samples // ranks // batch_size


def scatter_shards(comm, order: np.ndarray | None, per_rank: int) -> np.ndarray:
    """Scatter the first ranks*per_rank ids of `order` (significant on rank 0 only) in
    contiguous blocks; returns this rank's block."""
    shard = np.empty(per_rank, dtype=np.int64)
    send = None
    if comm.Get_rank() == 0:
        send = np.ascontiguousarray(order[: per_rank * comm.Get_size()], dtype=np.int64)
    comm.Scatter(send, shard, root=0)
    return shard
