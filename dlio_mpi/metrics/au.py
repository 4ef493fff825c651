"""Accelerator utilisation and throughput of one block of training steps, DLIO's formula:

    AU = sum(compute_i, i=s..e) / (T_block - sum(proc_i, i<s) - sum(proc_i, i>e))

with s = exclude_start_steps, e = last step - exclude_end_steps, proc = wait + compute and
T_block the block's wall time including the per-step barriers. Throughput counts the samples of
steps s..e over the same denominator (DLIO hard-codes k-2 steps instead)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockMetrics:
    au_percentage: float
    samples_per_second: float  # this rank's
    measured_seconds: float    # the AU denominator
    compute_seconds: float     # the AU numerator
    steps_counted: int


def block_metrics(wait: np.ndarray, compute: np.ndarray, block_seconds: float, batch_size: int,
                  exclude_start: int, exclude_end: int) -> BlockMetrics:
    """AU and throughput of a block whose per-step wait/compute times (seconds) are given."""
    steps = len(compute)
    first, last = exclude_start, steps - 1 - exclude_end
    proc = np.asarray(wait) + np.asarray(compute)
    if last < first:  # every step excluded: nothing to measure
        return BlockMetrics(0.0, 0.0, 0.0, 0.0, 0)
    compute_sum = float(np.sum(compute[first:last + 1]))
    measured = block_seconds - float(np.sum(proc[:first])) - float(np.sum(proc[last + 1:]))
    counted = last - first + 1
    if measured <= 0:
        return BlockMetrics(0.0, 0.0, measured, compute_sum, counted)
    au = 100.0 * compute_sum / measured if compute_sum > 0 else 0.0
    return BlockMetrics(au, counted * batch_size / measured, measured, compute_sum, counted)
