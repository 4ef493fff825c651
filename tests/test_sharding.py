"""Epoch orders, shards and read plans (serial; whole runs are tested in test_run_mpi)."""

from __future__ import annotations

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.data.dataset import ListedLayouts
from dlio_mpi.formats.loader import WholeFileReads
from dlio_mpi.sampling.requests import AccessPolicy, plan_reads
from dlio_mpi.sampling.sharding import (
    ShuffleSpec,
    epoch_shuffle,
    order_slice,
    rank_shard,
    steps_per_epoch,
)


def epoch_order(files: int, per_file: int, spec: ShuffleSpec, epoch: int, entropy: int = 0):
    return order_slice(files, per_file, epoch_shuffle(spec, epoch, entropy), 0,
                       files * per_file)


def test_no_shuffle_is_file_order():
    assert list(epoch_order(3, 2, ShuffleSpec(), 1)) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("files,samples", [("seed", "off"), ("off", "seed"), ("seed", "seed")])
def test_seeded_shuffles_are_permutations_reproducible_and_change_per_epoch(files, samples):
    spec = ShuffleSpec(files, samples, seed=42)
    first = epoch_order(50, 4, spec, 1)
    assert sorted(first) == list(range(200))
    assert np.array_equal(first, epoch_order(50, 4, spec, 1))
    assert not np.array_equal(first, epoch_order(50, 4, spec, 2))
    fixed = ShuffleSpec(files, samples, seed=42, seed_change_epoch=False)
    assert np.array_equal(epoch_order(50, 4, fixed, 1), epoch_order(50, 4, fixed, 2))
    assert not np.array_equal(first, epoch_order(50, 4, ShuffleSpec(files, samples, seed=43), 1))


def test_random_shuffles_follow_the_drawn_entropy():
    spec = ShuffleSpec("random", "random")
    a, b = epoch_order(20, 3, spec, 1, entropy=5), epoch_order(20, 3, spec, 1, entropy=6)
    assert sorted(a) == sorted(b) == list(range(60)) and not np.array_equal(a, b)


def test_file_shuffle_keeps_samples_of_a_file_together():
    order = epoch_order(10, 3, ShuffleSpec("seed", "off", seed=1), 1).reshape(10, 3)
    assert all(list(row) == [row[0], row[0] + 1, row[0] + 2] for row in order)
    assert sorted(order[:, 0] // 3) == list(range(10))
    assert list(order[:, 0] // 3) != list(range(10))


@pytest.mark.parametrize("samples", ["off", "seed"])
def test_file_order_is_the_same_through_a_table_of_files_or_per_sample(samples):
    # a slice longer than the file count permutes a table of the files; a shorter one each id
    shuffle = epoch_shuffle(ShuffleSpec("seed", samples, seed=9), 3)
    whole = order_slice(40, 25, shuffle, 0, 1000)
    pieces = [order_slice(40, 25, shuffle, start, min(7, 1000 - start))
              for start in range(0, 1000, 7)]
    assert np.array_equal(whole, np.concatenate(pieces))


@pytest.mark.parametrize("ranks", [1, 2, 3, 7])
def test_rank_shards_partition_the_kept_samples(ranks):
    shuffle = epoch_shuffle(ShuffleSpec("seed", "seed", seed=3), 2)
    per_rank = 101 * 5 // ranks // 4 * 4  # whole batches of 4
    shards = [rank_shard(101, 5, shuffle, r, per_rank) for r in range(ranks)]
    union = np.concatenate(shards)
    assert len(np.unique(union)) == len(union) == per_rank * ranks
    assert np.array_equal(union, order_slice(101, 5, shuffle, 0, per_rank * ranks))


def test_a_shard_of_a_billion_samples_is_computed_without_the_whole_order():
    shuffle = epoch_shuffle(ShuffleSpec("seed", "seed"), 1)
    shard = rank_shard(10**7, 100, shuffle, 1023, 10**9 // 1024)
    assert len(shard) == 976562 and shard.min() >= 0 and shard.max() < 10**9
    assert len(np.unique(shard)) == len(shard)


def test_steps_per_epoch_is_floor_of_share():
    assert steps_per_epoch(100, 3, 4) == 8  # floor(33 / 4)
    assert steps_per_epoch(7, 2, 4) == 0


# two files of 2 samples: (size, data_offset, sample_step, sample_span, sample_bytes)
LAYOUT = ListedLayouts(np.array([[1000, 100, 50, 50, 50], [2000, 200, 60, 60, 60]]))


def test_sample_mode_reads_exact_extents():
    plan = plan_reads(np.array([3, 0, 2, 1, 9]), steps=2, batch_size=2, samples_per_file=2,
                      layouts=LAYOUT, mode="sample")
    assert list(plan.sample_ids) == [3, 0, 2, 1]
    assert list(plan.batch_start) == [0, 2, 4]
    assert list(plan.file_idx) == [1, 0, 1, 0]
    assert list(plan.offset) == [260, 100, 200, 150]
    assert list(plan.length) == [60, 50, 60, 50]
    assert list(plan.flags) == [0, 0, 0, 0]
    assert list(plan.batch_payload) == [110, 110]


def test_file_mode_reads_whole_file_per_sample():
    plan = plan_reads(np.array([3, 0, 2, 1]), 2, 2, 2, LAYOUT, "file")
    assert list(plan.offset) == [0, 0, 0, 0] and list(plan.length) == [2000, 1000, 2000, 1000]
    assert list(plan.batch_payload) == [220, 220]  # each load delivers both samples' bytes


def test_file_once_reads_each_file_once_where_first_needed():
    plan = plan_reads(np.array([3, 2, 0, 1]), 2, 2, 2, LAYOUT, "file_once")
    assert list(plan.batch_start) == [0, 1, 2]  # file 1 in batch 0, file 0 in batch 1
    assert list(plan.file_idx) == [1, 0] and list(plan.length) == [2000, 1000]


def _two_reads(lay, blksize):
    """A made-up loader: a 16-byte header read, then the rest to the end of the file."""
    n = len(lay.size)
    offset = np.stack([np.zeros(n, np.int64), np.full(n, 16)], axis=1).ravel()
    length = np.stack([np.full(n, 16), lay.size - 16], axis=1).ravel()
    expect = length - np.tile([0, 1], n)  # the second read stops one byte short, at EOF
    return WholeFileReads(np.arange(0, 2 * n + 1, 2), offset, length, expect,
                          np.ones(n, dtype=np.int64))


def test_loader_access_opens_probes_reads_and_closes_each_whole_file_load():
    policy = AccessPolicy("loader", format_reads=_two_reads)
    plan = plan_reads(np.array([3, 0, 2, 1]), 2, 2, 2, LAYOUT, "file", policy)
    assert list(plan.file_idx) == [1, 1, 0, 0, 1, 1, 0, 0]
    assert list(plan.batch_start) == [0, 4, 8]
    assert list(plan.offset) == [0, 16] * 4
    assert list(plan.length) == [16, 1984, 16, 984, 16, 1984, 16, 984]
    first = _core.REQ_OPEN
    second = _core.REQ_CLOSE | _core.REQ_FSTAT
    assert list(plan.flags) == [first, second] * 4
    assert list(plan.expect) == [16, 1983, 16, 983, 16, 1983, 16, 983]


def test_loader_reads_of_multi_sample_files_by_extent_use_cached_descriptors():
    plan = plan_reads(np.array([3, 0, 2, 1]), 2, 2, 2, LAYOUT, "sample",
                      AccessPolicy("loader", format_reads=_two_reads))
    assert list(plan.flags) == [0, 0, 0, 0] and list(plan.length) == [60, 50, 60, 50]


def test_loader_with_odirect_reads_each_file_in_one_aligned_read():
    plan = plan_reads(np.array([1, 0]), 1, 2, 1, LAYOUT, "sample",
                      AccessPolicy("loader", odirect=True, format_reads=_two_reads))
    assert list(plan.length) == [2000, 1000] and list(plan.offset) == [0, 0]
    both = _core.REQ_OPEN | _core.REQ_CLOSE
    assert list(plan.flags) == [both, both] and list(plan.expect) == [2000, 1000]
    assert list(plan.batch_payload) == [110]
