"""dlio-mpi report OUT [OUT ...]: plots and an HTML page of finished runs' results (and their
traces), without MPI; several runs compared side by side.

Drawn from the results folders; the comparison is compare.html, compare.png, compare.csv."""

from __future__ import annotations

import os
import sys

from ..errors import UserError, install_hint

INSTALL_HINT = ("dlio-mpi report draws with matplotlib, which is not installed: "
                + install_hint("matplotlib"))
REPORT_FOLDER = "report"


class MissingMatplotlib(UserError):
    pass


def make_report(folders: list[str], output: str | None = None) -> list[str]:
    """Write each folder's report into FOLDER/report (and the comparison into `output`, or
    the first folder's report, given several); the paths written. UserError before any
    writing when a folder is not results or matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401 - the `report` extra
    except ImportError:
        raise MissingMatplotlib(INSTALL_HINT) from None
    from ..results.report_folder import write_report_folder
    from .results import read_results

    runs = [read_results(folder) for folder in folders]
    contents: dict[str, dict[str, bytes]] = {}
    compare_folder = (output if output is not None
                      else os.path.join(folders[0], REPORT_FOLDER)) if len(runs) > 1 else None
    for run in runs:
        folder = os.path.join(run.folder, REPORT_FOLDER)
        link = None
        if compare_folder is not None:
            link = os.path.relpath(os.path.join(compare_folder, "compare.html"), folder)
        contents.setdefault(folder, {}).update(_run_files(run, link))
    if compare_folder is not None:
        contents.setdefault(compare_folder, {}).update(_compare_files(runs))
    written = []
    for folder, files in contents.items():
        written += write_report_folder(folder, files)
    return written


def _run_files(run, compare_link: str | None) -> dict[str, bytes]:
    from . import plots
    from .page import run_page
    from .traces import read_requests

    requests = read_requests(run.folder)
    figures: list[tuple[str, bytes, str]] = []
    skipped: list[str] = []

    def add(name: str, png: bytes | None, caption: str, why_not: str) -> None:
        if png is None:
            skipped.append(f"{name}: {why_not}")
        else:
            figures.append((name, png, caption))

    add("epochs.png", plots.epochs_plot(run), "AU and samples/s per epoch",
        "the results hold no training epoch")
    add("rank_times.png", plots.rank_times_plot(run),
        "wait, compute and barrier time per rank", "the results hold no per-rank times")
    traced = requests is not None and len(requests) > 0
    add("latency.png", plots.latency_plot(run, requests),
        f"read latency CDF of {len(requests)} traced requests" if traced
        else "read latency p50 and p99 per epoch (the CDF needs traces)",
        "the results hold no read latency")
    add("throughput.png", plots.throughput_plot(run), "read throughput (MiB/s) per epoch",
        "the results hold no per-epoch throughput")
    add("intervals.png", plots.intervals_plot(run),
        "throughput over time, one point per output.stats_interval",
        "no interval_stats.json (the run had output.stats_interval: 0)")
    add("checkpoints.png", plots.checkpoint_plot(run), "bandwidth of each checkpoint",
        "the run wrote or read no checkpoint")
    if not traced:
        why = ("no trace files (trace_rank<R>.json[.gz]: run with output.trace=true)"
               if requests is None else "the trace files hold no read request")
        for name in ("spatial.png", "temporal.png", "request_sizes.png"):
            skipped.append(f"{name}: {why}")
    else:
        add("spatial.png", plots.spatial_plot(run, requests),
            "spatial pattern: file offset by rank, colour = request size", "")
        add("temporal.png", plots.temporal_plot(run, requests),
            "temporal pattern: each rank's requests over time", "")
        add("request_sizes.png", plots.request_sizes_plot(run, requests),
            "request-size histogram", "")
    if requests is not None:
        skipped += [f"trace skipped: {p}" for p in requests.problems]
        for problem in requests.problems:  # on the terminal too: the page may go unread
            print(f"dlio-mpi: report: {run.folder}: trace skipped: {problem}", file=sys.stderr,
                  flush=True)
    files = {name: png for name, png, _ in figures}
    files["report.html"] = run_page(run, figures, skipped, compare_link)
    return files


def _compare_files(runs) -> dict[str, bytes]:
    from .page import compare_csv, compare_page
    from .plots import compare_plot

    rows = [run.key_metrics() for run in runs]
    png = compare_plot(rows)
    return {"compare.png": png, "compare.csv": compare_csv(rows),
            "compare.html": compare_page(rows, png)}
