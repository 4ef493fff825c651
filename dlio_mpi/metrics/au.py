"""Accelerator utilisation and throughput of one block of training steps on one rank.

AU is DLIO's formula, with the *planned* compute time in the numerator as in DLIO and MLPerf
Storage (a sleep that overshoots is emulator latency, not useful compute):

    AU = sum(planned_i, i=s..e) / (T_block - sum(proc_i, i<s) - sum(proc_i, i>e))

s = exclude_start_steps, e = last step - exclude_end_steps, proc = wait + compute as measured,
T_block the block's wall time including the per-step barriers. With s = 1 and e = last this is
exactly the released DLIO 2.0.0's figure.

Throughput under DLIO's name follows the released DLIO 2.0.0 package: all k steps of the block
times the batch over the block's wall time. The throughput over exactly AU's measured span
(steps s..e over AU's denominator) has a name of its own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockMetrics:
    au_percentage: float
    au_without_barrier_percentage: float  # AU's denominator less the measured steps' barriers
    samples_per_second: float             # DLIO 2.0.0: k * batch / T_block (this rank)
    au_span_samples_per_second: float     # (e - s + 1) * batch / AU's denominator
    measured_seconds: float               # AU's denominator
    compute_seconds: float                # AU's numerator (planned)
    first: int                            # s
    last: int                             # e (last < first: nothing measured)


def block_metrics(wait: np.ndarray, compute: np.ndarray, planned: np.ndarray,
                  sync: np.ndarray, block_seconds: float, batch_size: int, exclude_start: int,
                  exclude_end: int) -> BlockMetrics:
    """AU and throughput of a block whose per-step times (seconds) are given: measured wait,
    measured compute, planned compute and time in the barrier."""
    steps = len(compute)
    first, last = exclude_start, steps - 1 - exclude_end
    thr = steps * batch_size / block_seconds if block_seconds > 0 else 0.0
    if last < first:  # every step excluded: nothing to measure
        return BlockMetrics(0.0, 0.0, thr, 0.0, 0.0, 0.0, first, last)
    proc = np.asarray(wait) + np.asarray(compute)
    compute_sum = float(np.sum(planned[first:last + 1]))
    measured = block_seconds - float(np.sum(proc[:first])) - float(np.sum(proc[last + 1:]))
    counted = last - first + 1
    if measured <= 0:
        return BlockMetrics(0.0, 0.0, thr, 0.0, measured, compute_sum, first, last)
    without_sync = measured - float(np.sum(sync[first:last + 1]))

    def pct(denominator: float) -> float:
        return 100.0 * compute_sum / denominator if compute_sum > 0 and denominator > 0 else 0.0

    return BlockMetrics(pct(measured), pct(without_sync), thr, counted * batch_size / measured,
                        measured, compute_sum, first, last)
