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
    return percentiles_ns(counts, (q,))[0]


def percentiles_ns(counts: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """percentile_ns of each of `qs`, the counts' running sum taken once."""
    running = np.cumsum(counts)
    total = int(running[-1]) if len(running) else 0
    if total == 0:
        return [0.0] * len(qs)
    ranks = [max(1, int(np.ceil(q / 100.0 * total))) for q in qs]
    return [float(np.sqrt(EDGES[i] * EDGES[i + 1]))
            for i in np.searchsorted(running, ranks).tolist()]
