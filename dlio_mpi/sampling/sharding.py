"""Who reads which samples, epoch by epoch.

An epoch's order of all T samples is a seeded bijection of positions to sample ids, computed
pointwise (a Feistel permutation in the C core): file_shuffle permutes files (their samples stay
together and in order), sample_shuffle then permutes the resulting order of all samples. Rank r
reads the contiguous positions [r*S, (r+1)*S) with S = steps * batch, so every rank runs the same
number of steps, across ranks every kept sample is read exactly once per epoch, and drop_last is
global: the last T mod (P*B) positions are not read. Each rank computes only its own slice: no
rank ever holds the whole order (O(T/P) memory), and nothing is communicated but, for
"random" shuffles, one seed drawn by rank 0."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import _core

FILE_STREAM, SAMPLE_STREAM, DRAW_STREAM = 0, 1, 2


@dataclass(frozen=True)
class ShuffleSpec:
    """How an epoch's order is drawn (reader.file_shuffle / sample_shuffle, train.seed...)."""

    file_shuffle: str = "off"
    sample_shuffle: str = "off"
    seed: int = 123
    seed_change_epoch: bool = True

    @property
    def draws_randomly(self) -> bool:
        return "random" in (self.file_shuffle, self.sample_shuffle)


@dataclass(frozen=True)
class EpochShuffle:
    """The permutation keys of one epoch; None leaves that level in order."""

    file_key: int | None = None
    sample_key: int | None = None


def _key(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed & (2**63 - 1), stream]).generate_state(
        1, np.uint64)[0])


def epoch_shuffle(spec: ShuffleSpec, epoch: int, entropy: int = 0) -> EpochShuffle:
    """The keys of `epoch`: from the seed (plus the epoch when seed_change_epoch) for "seed",
    from `entropy` (drawn once per epoch by rank 0, see draw_entropy) for "random"."""
    seed = spec.seed + epoch if spec.seed_change_epoch else spec.seed

    def key(mode: str, stream: int) -> int | None:
        if mode == "off":
            return None
        return _key(entropy if mode == "random" else seed, stream)

    return EpochShuffle(key(spec.file_shuffle, FILE_STREAM),
                        key(spec.sample_shuffle, SAMPLE_STREAM))


def draw_entropy(comm, spec: ShuffleSpec) -> int:
    """Collectively: rank 0's fresh random seed for a "random" shuffle (0 when not needed)."""
    if not spec.draws_randomly:
        return 0
    return comm.bcast(int.from_bytes(os.urandom(8), "little") if comm.Get_rank() == 0
                      else None, root=0)


def order_slice(num_files: int, samples_per_file: int, shuffle: EpochShuffle, start: int,
                count: int) -> np.ndarray:
    """Sample ids (file * samples_per_file + index) at positions [start, start + count) of the
    epoch's order."""
    ids = np.arange(start, start + count, dtype=np.int64)
    if shuffle.sample_key is not None:
        _core.permute(num_files * samples_per_file, shuffle.sample_key, ids)
    if shuffle.file_key is not None:
        files, within = np.divmod(ids, samples_per_file)
        if len(files) > num_files:  # each file's place once, not once per sample
            table = np.arange(num_files, dtype=np.int64)
            _core.permute(num_files, shuffle.file_key, table)
            files = table[files]
        else:
            _core.permute(num_files, shuffle.file_key, files)
        ids = files * samples_per_file + within
    return ids


def rank_shard(num_files: int, samples_per_file: int, shuffle: EpochShuffle, rank: int,
               per_rank: int) -> np.ndarray:
    """The ids rank `rank` reads this epoch, in order: positions [rank, rank + 1) * per_rank."""
    return order_slice(num_files, samples_per_file, shuffle, rank * per_rank, per_rank)


ACCESS_ORDERS = ("shuffled", "sorted")


def order_batches(ids: np.ndarray, steps: int, batch_size: int, order: str) -> np.ndarray:
    """reader.access_order on a rank's shard: "sorted" reads each batch's samples by
    (file, offset), i.e. by sample id (id = file * samples_per_file + index, and a file's
    samples lie in index order), so that reads within a file are sequential. Per batch, not
    per epoch shard: every step still consumes the same samples as with "shuffled" (what
    SGD sees is unchanged), only the order of the reads changes. Ids past the last batch are
    left as they are."""
    if order == "shuffled":
        return ids
    if order != "sorted":
        raise ValueError(f"unknown access order {order!r}; expected one of {ACCESS_ORDERS}")
    head = steps * batch_size
    out = np.array(ids, dtype=np.int64, copy=True)
    out[:head] = np.sort(out[:head].reshape(steps, batch_size), axis=1).reshape(-1)
    return out


def steps_per_epoch(total_samples: int, ranks: int, batch_size: int) -> int:
    """floor(samples per rank / batch): the same on every rank."""
    return total_samples // ranks // batch_size


def rank_draws(total: int, spec: ShuffleSpec, epoch: int, entropy: int, rank: int,
               per_rank: int) -> np.ndarray:
    """reader.sampling: replacement: the ids rank `rank` reads this epoch, drawn uniformly
    from all `total` samples with replacement (a sample may come twice, or never), as
    training that samples its batches does (the climate runs at NERSC); seeded by train.seed
    (plus the epoch with seed_change_epoch) and the rank, or by rank 0's entropy with
    sample_shuffle random."""
    seed = spec.seed + epoch if spec.seed_change_epoch else spec.seed
    base = entropy if spec.sample_shuffle == "random" else seed
    rng = np.random.default_rng([_key(base, DRAW_STREAM), rank])
    return rng.integers(0, total, size=per_rank, dtype=np.int64)
