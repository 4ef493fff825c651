"""AU and throughput on synthetic timings, and the mergeable latency histogram."""

from __future__ import annotations

import numpy as np
import pytest

from dlio_mpi.metrics import latency
from dlio_mpi.metrics.au import block_metrics


def test_au_of_a_block_without_stalls_is_compute_over_time():
    compute = np.full(10, 0.1)
    wait = np.zeros(10)
    m = block_metrics(wait, compute, block_seconds=1.0, batch_size=4, exclude_start=0,
                      exclude_end=0)
    assert m.au_percentage == pytest.approx(100.0)
    assert m.samples_per_second == pytest.approx(40.0)


def test_au_excludes_first_step_from_numerator_and_denominator():
    wait = np.array([0.5, 0.1, 0.1, 0.1])
    compute = np.array([0.2, 0.2, 0.2, 0.2])
    block = 0.7 + 3 * 0.3 + 0.15  # plus 0.15 s spent in barriers
    m = block_metrics(wait, compute, block, batch_size=2, exclude_start=1, exclude_end=0)
    assert m.measured_seconds == pytest.approx(block - 0.7)
    assert m.au_percentage == pytest.approx(100 * 0.6 / (block - 0.7))
    assert m.samples_per_second == pytest.approx(3 * 2 / (block - 0.7))
    assert m.steps_counted == 3


def test_au_excludes_end_steps():
    wait = np.zeros(5)
    compute = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    m = block_metrics(wait, compute, 7.0, 1, exclude_start=1, exclude_end=1)
    assert m.compute_seconds == pytest.approx(3.0)
    assert m.measured_seconds == pytest.approx(3.0)
    assert m.au_percentage == pytest.approx(100.0)


def test_au_is_zero_when_nothing_is_measured():
    assert block_metrics(np.zeros(1), np.ones(1), 1.0, 1, 1, 0).au_percentage == 0.0


def test_latency_histograms_merge_and_give_percentiles_within_a_bin():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(11, 1, 5000), rng.lognormal(12, 0.5, 5000)
    merged = latency.histogram(a) + latency.histogram(b)
    both = np.concatenate([a, b])
    for q in (50, 99):
        assert latency.percentile_ns(merged, q) == pytest.approx(np.percentile(both, q),
                                                                 rel=0.03)
