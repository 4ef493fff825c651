"""reader.preprocess_time in the plan: each sample's preprocessing is slept after the request
that completes the sample; a load serving several samples (read_mode file_once) carries all
of theirs, after its last request."""

from __future__ import annotations

import numpy as np

from dlio_mpi.data.dataset import ListedLayouts
from dlio_mpi.formats import FileLayout
from dlio_mpi.sampling.requests import AccessPolicy, plan_reads

LAYOUTS = ListedLayouts.from_layouts([FileLayout(4096 * 4, 0, 4096, 4096, 4096)] * 3)
SHARD = np.array([0, 5, 1, 9, 4, 2], dtype=np.int64)  # files 0, 1, 0, 2, 1, 0
DELAYS = np.array([10, 20, 30, 40, 50, 60], dtype=np.int64)


def test_one_request_per_sample_carries_its_own_delay():
    plan = plan_reads(SHARD, 3, 2, 4, LAYOUTS, "sample", AccessPolicy(), DELAYS)
    assert plan.delay_ns.tolist() == DELAYS.tolist()
    assert plan_reads(SHARD, 3, 2, 4, LAYOUTS, "sample").delay_ns is None


def test_a_load_for_several_samples_carries_all_their_delays_after_its_last_request():
    plan = plan_reads(SHARD, 3, 2, 4, LAYOUTS, "file_once", AccessPolicy(access="lean"), DELAYS)
    assert plan.file_idx.tolist() == [0, 1, 2]  # each file once, in first-use order
    assert plan.delay_ns.tolist() == [10 + 30 + 60, 20 + 50, 40]
    loader = plan_reads(SHARD, 3, 2, 4, LAYOUTS, "file", AccessPolicy(access="loader"), DELAYS)
    assert loader.delay_ns.sum() == DELAYS.sum()
    ends = np.flatnonzero(loader.delay_ns)  # after the last request of each sample's load
    assert len(ends) == len(SHARD) and loader.delay_ns[ends].tolist() == DELAYS.tolist()
