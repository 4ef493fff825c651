"""The report's figures, drawn with matplotlib (the `report` extra) into PNG bytes. Every
series has its own marker or hatch, so that the plots read in black and white too."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from .results import RunResults
from .traces import Requests

MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")
HATCHES = ("//", "..", "xx", "\\\\", "oo", "--", "++", "**")
MAX_POINTS = 200_000  # requests drawn in the scatter plots (an even sample of them beyond)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figure(title: str, rows: int = 1, cols: int = 1, size=(8, 4.5)):
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    fig.suptitle(title, fontsize=10)
    return fig, axes


def _series(values) -> tuple[list[int], list[float]]:
    """(x positions, values) of the (epoch, value) pairs that hold a value."""
    kept = [(x, v) for x, v in values if v is not None]
    return [x for x, _ in kept], [v for _, v in kept]


def epochs_plot(run: RunResults) -> bytes | None:
    """AU and samples/s per epoch, training's and (when the run evaluated) evaluation's."""
    if not run.epochs:
        return None
    fig, (au, rate) = _figure(f"AU and samples/s per epoch\n{run.title}", 1, 2)
    phases = [("train", run.epochs, "o", "-")]
    if run.eval_epochs:
        phases.append(("eval", run.eval_epochs, "^", ":"))
    for name, epochs, marker, line in phases:
        au.plot(*_series((e.epoch, e.au) for e in epochs), marker=marker, linestyle=line,
                color="black", label=name)
        rate.plot(*_series((e.epoch, e.samples_per_second) for e in epochs), marker=marker,
                  linestyle=line, color="black", label=name)
    au.set(xlabel="epoch", ylabel="AU (%)", title="accelerator utilisation")
    rate.set(xlabel="epoch", ylabel="samples/s", title="samples per second")
    if run.eval_epochs:
        au.legend()
        rate.legend()
    # from zero (a 0.5 % dip stays small), with room above the highest point
    au.set_ylim(0, max(105.0, au.get_ylim()[1]))
    rate.set_ylim(0, rate.get_ylim()[1] * 1.1)
    for ax in (au, rate):
        ax.grid(True, linestyle=":")
        ax.set_xticks([e.epoch for e in run.epochs])
    return _png(fig)


def rank_times_plot(run: RunResults) -> bytes | None:
    """Wait, compute and barrier seconds per rank (summed over the epochs), grouped bars."""
    times = run.rank_times()
    if not times:
        return None
    fig, (ax,) = _figure(f"wait, compute and barrier time per rank\n{run.title}")
    ranks = np.arange(len(times))
    width = 0.27
    for i, part in enumerate(("wait", "compute", "barrier")):
        ax.bar(ranks + (i - 1) * width, [t[part] for t in times.values()], width,
               label=part, hatch=HATCHES[i], edgecolor="black", color=f"C{i}")
    ax.set_xticks(ranks, [str(r) for r in times])
    ax.set(xlabel="rank", ylabel="seconds (all epochs)")
    ax.legend()
    ax.grid(True, axis="y", linestyle=":")
    return _png(fig)


def latency_plot(run: RunResults, requests: Requests | None) -> bytes | None:
    """The read latency: its CDF from traced requests, else p50 and p99 per epoch."""
    if requests is not None and len(requests):
        fig, (ax,) = _figure(f"read latency CDF ({len(requests)} traced requests)\n{run.title}")
        lat = np.sort(requests.latency_us) / 1e3
        ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), color="black",
                marker="o", markevery=max(1, len(lat) // 20))
        ax.set(xlabel="latency (ms)", ylabel="fraction of requests")
        if lat.min() > 0:
            ax.set_xscale("log")
        ax.grid(True, linestyle=":")
        return _png(fig)
    points = [(e.epoch, e.latency_p50_ms, e.latency_p99_ms) for e in run.epochs]
    if not any(p50 is not None or p99 is not None for _, p50, p99 in points):
        return None
    fig, (ax,) = _figure(f"read latency percentiles per epoch\n{run.title}")
    for i, (label, col) in enumerate((("p50", 1), ("p99", 2))):
        ax.plot(*_series((p[0], p[col]) for p in points), marker=MARKERS[i],
                linestyle=("-", "--")[i], color="black", label=label)
    ax.set(xlabel="epoch", ylabel="read latency (ms)")
    ax.set_xticks([e.epoch for e in run.epochs])
    ax.legend()
    ax.grid(True, linestyle=":")
    return _png(fig)


def throughput_plot(run: RunResults) -> bytes | None:
    """MiB/s read per epoch, at the epoch's end (seconds from the first epoch's start)."""
    series = [(e, e.mib_per_second) for e in run.epochs if e.mib_per_second is not None]
    if not series:
        return None
    ends = _epoch_ends(run)
    fig, (ax,) = _figure(f"read throughput per epoch\n{run.title}")
    if ends is not None:
        x = [ends[e.epoch] for e, _ in series]
        ax.set(xlabel="seconds from the first epoch's start (epoch end)")
    else:
        x = [e.epoch for e, _ in series]
        ax.set(xlabel="epoch")
    ax.plot(x, [v for _, v in series], marker="D", color="black")
    for (e, v), xi in zip(series, x):
        ax.annotate(f"e{e.epoch}", (xi, v), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ax.set(ylabel="MiB/s")
    ax.grid(True, linestyle=":")
    return _png(fig)


def intervals_plot(run: RunResults) -> bytes | None:
    """Read throughput and samples/s over time, every output.stats_interval seconds (from
    interval_stats.json), a series per phase, each point at its interval's end."""
    if not run.intervals:
        return None
    fig, (mib, rate) = _figure(f"throughput over time (interval statistics)\n{run.title}", 2, 1,
                               size=(8, 6))
    phases = sorted({str(r.get("phase")) for r in run.intervals})
    for i, phase in enumerate(phases):
        x: list[float] = []
        mibs: list[float] = []
        rates: list[float] = []
        epoch = None
        for r in run.intervals:
            if str(r.get("phase")) != phase:
                continue
            if epoch is not None and r.get("epoch") != epoch:  # no line between epochs
                x.append(np.nan)
                mibs.append(np.nan)
                rates.append(np.nan)
            epoch = r.get("epoch")
            x.append(r["start_s"] + r["seconds"])
            mibs.append(r["MiB_per_second"])
            rates.append(_number(r.get("samples_per_second")) or 0.0)
        style = dict(marker=MARKERS[i % len(MARKERS)], color="black", label=phase,
                     linestyle="-" if i == 0 else "--", markersize=4)
        mib.plot(x, mibs, **style)
        rate.plot(x, rates, **style)
    mib.set(ylabel="MiB/s read")
    rate.set(xlabel="seconds from the run's start (interval end)", ylabel="samples/s")
    for ax in (mib, rate):
        ax.set_ylim(0, max(ax.get_ylim()[1] * 1.1, 1e-9))
        ax.grid(True, linestyle=":")
        ax.legend()
    return _png(fig)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _epoch_ends(run: RunResults) -> dict[int, float] | None:
    from datetime import datetime

    try:
        starts = {e.epoch: datetime.fromisoformat(e.start).timestamp() for e in run.epochs}
    except (TypeError, ValueError):
        return None
    if any(e.duration is None for e in run.epochs):
        return None
    first = min(starts.values())
    return {e.epoch: starts[e.epoch] - first + e.duration for e in run.epochs}


def checkpoint_plot(run: RunResults) -> bytes | None:
    """GB/s of each checkpoint save and load."""
    records = [r for r in run.checkpoints
               if isinstance(r.get("throughput_GB_per_second"), (int, float))]
    if not records:
        return None
    fig, (ax,) = _figure(f"checkpoint bandwidth per checkpoint\n{run.title}")
    for i, kind in enumerate(("save", "load")):
        mine = [(n, r) for n, r in enumerate(records) if r.get("kind") == kind]
        if mine:
            ax.bar([n for n, _ in mine], [r["throughput_GB_per_second"] for _, r in mine],
                   label=kind, hatch=HATCHES[i], edgecolor="black", color=f"C{i}")
    ax.set_xticks(range(len(records)),
                  [f"{r.get('kind', '?')} {r.get('index', '')}" for r in records])
    ax.set(ylabel="GiB/s (slowest rank's duration)", xlabel="checkpoint")
    ax.legend()
    ax.grid(True, axis="y", linestyle=":")
    return _png(fig)


def _sample(requests: Requests) -> np.ndarray:
    n = len(requests)
    return np.arange(n) if n <= MAX_POINTS else np.linspace(0, n - 1, MAX_POINTS).astype(int)


def spatial_plot(run: RunResults, requests: Requests) -> bytes:
    """File offset against rank, coloured by request size (Darshan DXT's spatial view)."""
    pick = _sample(requests)
    fig, (ax,) = _figure(f"spatial pattern: offset by rank, size as colour\n{run.title}")
    points = ax.scatter(requests.rank[pick], requests.offset[pick] / 2**20,
                        c=requests.length[pick] / 1024, cmap="viridis", marker="_", s=120)
    fig.colorbar(points, ax=ax, label="request size (KiB)")
    ax.set(xlabel="rank", ylabel="file offset (MiB)")
    ax.set_xticks(sorted(set(requests.rank.tolist())))
    ax.grid(True, linestyle=":")
    return _png(fig)


def temporal_plot(run: RunResults, requests: Requests) -> bytes:
    """Each rank's requests over time: a bar per request, from its start for its latency."""
    pick = _sample(requests)
    fig, (ax,) = _figure(f"temporal pattern: requests over time per rank\n{run.title}")
    rank, start, lat = requests.rank[pick], requests.start_us[pick] / 1e6, \
        requests.latency_us[pick] / 1e6
    ax.hlines(rank, start, start + np.maximum(lat, 1e-6), color="black", linewidth=6)
    ax.plot(start, rank, linestyle="none", marker="|", color="C0", markersize=10)
    ax.set(xlabel="seconds from the first request", ylabel="rank")
    ax.set_yticks(sorted(set(rank.tolist())))
    ax.grid(True, axis="x", linestyle=":")
    return _png(fig)


def request_sizes_plot(run: RunResults, requests: Requests) -> bytes:
    """How many requests of each size."""
    fig, (ax,) = _figure(f"request-size histogram\n{run.title}")
    ax.hist(requests.length / 1024, bins=40, hatch="//", edgecolor="black", color="C1")
    ax.set(xlabel="request size (KiB)", ylabel="requests")
    ax.grid(True, axis="y", linestyle=":")
    return _png(fig)


COMPARED = (("au_percentage", "AU (%)"), ("samples_per_second", "samples/s"),
            ("MiB_per_second", "MiB/s"), ("read_latency_p99_ms", "read latency p99 (ms)"))


def compare_plot(rows: list[dict]) -> bytes:
    """Bars of the key metrics, one bar per run, one panel per metric."""
    fig, axes = _figure("runs compared: " + ", ".join(str(r["workload"]) for r in rows),
                        2, 2, size=(10, 7))
    labels = [f"{i + 1}" + ("" if r.get("state", "complete") == "complete" else "\nincomplete")
              for i, r in enumerate(rows)]
    for ax, (key, label) in zip(axes, COMPARED):
        values = [r[key] if r[key] is not None else 0.0 for r in rows]
        for i, v in enumerate(values):
            ax.bar(i, v, hatch=HATCHES[i % len(HATCHES)], edgecolor="black",
                   color=f"C{i % 10}")
        ax.set_xticks(range(len(rows)), labels)
        ax.set(title=label, xlabel="run (see the table)")
        ax.grid(True, axis="y", linestyle=":")
    return _png(fig)
