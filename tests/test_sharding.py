"""Epoch orders, shards and read plans (serial; the MPI scatter is tested in test_run_mpi)."""

from __future__ import annotations

import numpy as np
import pytest

from dlio_mpi.dataset import LayoutTable
from dlio_mpi.planner import plan_reads
from dlio_mpi.sharding import ShuffleSpec, epoch_order, steps_per_epoch


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


def test_file_shuffle_keeps_samples_of_a_file_together():
    order = epoch_order(10, 3, ShuffleSpec("seed", "off", seed=1), 1).reshape(10, 3)
    assert all(list(row) == [row[0], row[0] + 1, row[0] + 2] for row in order)
    assert sorted(order[:, 0] // 3) == list(range(10))


def test_steps_per_epoch_is_floor_of_share():
    assert steps_per_epoch(100, 3, 4) == 8  # floor(33 / 4)
    assert steps_per_epoch(7, 2, 4) == 0


LAYOUT = LayoutTable(size=np.array([1000, 2000]), data_offset=np.array([100, 200]),
                     sample_step=np.array([50, 60]), sample_span=np.array([50, 60]),
                     sample_bytes=np.array([50, 60]))


def test_sample_mode_reads_exact_extents():
    plan = plan_reads(np.array([3, 0, 2, 1, 9]), steps=2, batch_size=2, samples_per_file=2,
                      layouts=LAYOUT, mode="sample")
    assert list(plan.sample_ids) == [3, 0, 2, 1]
    assert list(plan.batch_start) == [0, 2, 4]
    assert list(plan.file_idx) == [1, 0, 1, 0]
    assert list(plan.offset) == [260, 100, 200, 150]
    assert list(plan.length) == [60, 50, 60, 50]


def test_file_mode_reads_whole_file_per_sample():
    plan = plan_reads(np.array([3, 0, 2, 1]), 2, 2, 2, LAYOUT, "file")
    assert list(plan.offset) == [0, 0, 0, 0] and list(plan.length) == [2000, 1000, 2000, 1000]


def test_file_once_reads_each_file_once_where_first_needed():
    plan = plan_reads(np.array([3, 2, 0, 1]), 2, 2, 2, LAYOUT, "file_once")
    assert list(plan.batch_start) == [0, 1, 2]  # file 1 in batch 0, file 0 in batch 1
    assert list(plan.file_idx) == [1, 0] and list(plan.length) == [2000, 1000]
