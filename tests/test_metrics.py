"""AU, throughput and the emulator's overhead on synthetic timings; the mergeable latency
histogram."""

from __future__ import annotations

import numpy as np
import pytest

from dlio_mpi.metrics import latency
from dlio_mpi.metrics.au import block_metrics
from dlio_mpi.metrics.epoch_trace import EpochTrace
from dlio_mpi.metrics.summary import EpochSummary, condense, phase_metrics


def _block(wait, compute, planned=None, sync=None, block=1.0, batch=1, start=0, end=0):
    wait, compute = np.asarray(wait, float), np.asarray(compute, float)
    planned = compute if planned is None else np.asarray(planned, float)
    sync = np.zeros(len(compute)) if sync is None else np.asarray(sync, float)
    return block_metrics(wait, compute, planned, sync, block, batch, start, end)


def test_au_of_a_block_without_stalls_is_compute_over_time():
    m = _block(np.zeros(10), np.full(10, 0.1), block=1.0, batch=4)
    assert m.au_percentage == pytest.approx(100.0)
    assert m.samples_per_second == pytest.approx(40.0)


def test_au_excludes_first_step_and_throughput_follows_dlio_2_0_0():
    wait = np.array([0.5, 0.1, 0.1, 0.1])
    compute = np.array([0.2, 0.2, 0.2, 0.2])
    block = 0.7 + 3 * 0.3 + 0.15  # plus 0.15 s spent in barriers
    m = _block(wait, compute, block=block, batch=2, start=1)
    assert m.measured_seconds == pytest.approx(block - 0.7)
    assert m.au_percentage == pytest.approx(100 * 0.6 / (block - 0.7))
    # DLIO 2.0.0: all k steps x batch over the block's wall time
    assert m.samples_per_second == pytest.approx(4 * 2 / block)
    # ours: the measured steps over AU's span
    assert m.au_span_samples_per_second == pytest.approx(3 * 2 / (block - 0.7))


def test_au_numerator_is_the_planned_compute_not_the_oversleep():
    planned = np.full(5, 0.0035)
    slept = planned + 0.00015  # each sleep overshot by 150 us
    block = float(np.sum(slept))
    m = _block(np.zeros(5), slept, planned=planned, block=block, start=1)
    assert m.au_percentage == pytest.approx(100 * 0.0035 / 0.00365)
    assert m.compute_seconds == pytest.approx(4 * 0.0035)


def test_au_without_barrier_removes_the_measured_steps_barriers_only():
    compute, sync = np.full(4, 0.1), np.array([0.05, 0.02, 0.02, 0.02])
    block = 0.4 + 0.11
    m = _block(np.zeros(4), compute, sync=sync, block=block, start=1)
    assert m.au_percentage == pytest.approx(100 * 0.3 / (block - 0.1))
    assert m.au_without_barrier_percentage == pytest.approx(100 * 0.3 / (block - 0.1 - 0.06))


def test_au_excludes_end_steps():
    m = _block(np.zeros(5), [1.0, 1.0, 1.0, 1.0, 3.0], block=7.0, start=1, end=1)
    assert m.compute_seconds == pytest.approx(3.0)
    assert m.measured_seconds == pytest.approx(3.0)
    assert m.au_percentage == pytest.approx(100.0)


def test_au_is_zero_when_nothing_is_measured():
    assert _block(np.zeros(1), np.ones(1), start=1).au_percentage == 0.0


def _trace(rows, planned, synchronised=True):
    """rows: per step (start, ready, got, deadline, computed, synced) in us."""
    stamps = np.asarray(rows, dtype=np.int64) * 1000
    steps = len(stamps)
    return EpochTrace(epoch=1, block_start_ns=int(stamps[0, 0]),
                      block_end_ns=int(stamps[-1, 5]), stamps=stamps,
                      planned_compute_ns=np.asarray(planned, dtype=np.int64) * 1000,
                      step_bytes=np.full(steps, 100), step_read_ops=np.ones(steps, np.int64),
                      payload_bytes=90 * steps, opens=steps, closes=steps, stats=2 * steps,
                      requests=steps, lat_ns=np.full(steps, 1000),
                      sample_ids=np.arange(steps), synchronised=synchronised)


def test_condense_splits_steps_into_storage_stall_overhead_and_imbalance():
    # step 0: batch ready 30 us after the step starts, held 2 us later; compute 100 us planned,
    # returns 3 us late; the last rank arrives 10 us later, the barrier returns 4 us after that.
    # step 1: batch already there; held 5 us after the step starts.
    rows = [(0, 30, 32, 132, 135, 149),
            (149, 100, 154, 254, 254, 260)]
    last_arrival = np.array([145, 256]) * 1000
    record = condense(_trace(rows, [100, 100]), last_arrival, rank=0, batch_size=2,
                      bytes_requested=200, exclude_start=0, exclude_end=0, clock_offset_ns=0)
    assert record.storage_stall_seconds == pytest.approx(30e-6)
    assert record.loop_us_per_step == pytest.approx((2 + 5) / 2)
    assert record.overshoot_us_per_step == pytest.approx((3 + 0) / 2)
    assert record.sync_wakeup_us_per_step == pytest.approx((4 + 4) / 2)
    assert record.sync_imbalance_seconds == pytest.approx((10 + 2) * 1e-6)
    assert record.sync_seconds == pytest.approx((14 + 6) * 1e-6)
    assert record.overhead_us_per_step == pytest.approx(3.5 + 1.5 + 4)
    assert record.au_percentage == pytest.approx(100 * 200 / 260)
    assert record.bytes_read == 180 and record.bytes_transferred == 200
    assert record.read_ops == 2 and record.opens == record.closes == 2 and record.stats == 4


def test_dlio_io_field_is_samples_per_second_times_record_length():
    rows = [(0, 0, 0, 100, 100, 100), (100, 100, 100, 200, 200, 200)]
    record = condense(_trace(rows, [100, 100], synchronised=False), None, 0, 4, 8, 0, 0, 0)
    epochs = [EpochSummary(1, [record, record], record_length=114660.07)]
    metric = phase_metrics("train", epochs, 0.9)
    thr = 2 * (2 * 4 / 200e-6)  # two ranks, each 2 steps x batch 4 over 200 us
    assert metric["train_throughput_mean_samples_per_second"] == pytest.approx(thr)
    assert metric["train_io_mean_MB_per_second"] == pytest.approx(thr * 114660.07 / 2**20)
    assert metric["train_au_meet_expectation"] == "success"


def test_latency_histograms_merge_and_give_percentiles_within_a_bin():
    rng = np.random.default_rng(0)
    a, b = rng.lognormal(11, 1, 5000), rng.lognormal(12, 0.5, 5000)
    merged = latency.histogram(a) + latency.histogram(b)
    both = np.concatenate([a, b])
    for q in (50, 99):
        assert latency.percentile_ns(merged, q) == pytest.approx(np.percentile(both, q),
                                                                 rel=0.03)
