"""Mergeable latency histograms: fixed log-spaced bins, so per-rank histograms add up exactly
across ranks and percentiles of the whole job come out within one bin (about 2.3 %)."""

from __future__ import annotations

import numpy as np

BINS_PER_DECADE = 100
LOW_NS, HIGH_NS = 1e2, 1e12  # 100 ns .. 1000 s
EDGES = np.logspace(np.log10(LOW_NS), np.log10(HIGH_NS),
                    int(np.log10(HIGH_NS / LOW_NS)) * BINS_PER_DECADE + 1)


def histogram(latency_ns: np.ndarray) -> np.ndarray:
    """Counts per bin; values outside the range land in the first/last bin."""
    clipped = np.clip(np.asarray(latency_ns, dtype=np.float64), EDGES[0], EDGES[-1] * 0.999)
    counts, _ = np.histogram(clipped, bins=EDGES)
    return counts.astype(np.int64)


def percentile_ns(counts: np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of a histogram: geometric centre of the bin holding it."""
    total = int(counts.sum())
    if total == 0:
        return 0.0
    rank = max(1, int(np.ceil(q / 100.0 * total)))
    index = int(np.searchsorted(np.cumsum(counts), rank))
    return float(np.sqrt(EDGES[index] * EDGES[index + 1]))
