"""The report's HTML pages (plots embedded as base64 PNG, so that a page is one file to
send) and the comparison CSV."""

from __future__ import annotations

import base64
import csv
import html
import io

from .results import RunResults

STYLE = ("body{font-family:sans-serif;max-width:1000px;margin:auto}"
         ".warning{border:2px solid #c00;padding:4px 8px;font-weight:bold}"
         "table{border-collapse:collapse}td,th{border:1px solid #999;padding:2px 6px;"
         "text-align:right}th{background:#eee}img{max-width:100%;border:1px solid #ccc}")


def _format(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _table(rows: list[dict]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_format(v))}</td>" for v in r.values())
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(name: str, png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure id="{html.escape(name)}"><img alt="{html.escape(name)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)} '
            f"({html.escape(name)})</figcaption></figure>")


def run_page(run: RunResults, figures: list[tuple[str, bytes, str]],
             skipped: list[str], compare_link: str | None = None) -> bytes:
    """One run's page: its key figures, each plot, and why any plot is missing."""
    metrics = run.key_metrics()
    keys = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_format(v))}</td></tr>"
                   for k, v in metrics.items())
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
             f"<title>dlio-mpi report: {html.escape(run.title)}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>dlio-mpi report: {html.escape(run.workload)}</h1>",
             f"<p>results folder: <code>{html.escape(run.folder)}</code></p>"]
    state = run.state()
    if state != "complete":
        parts.append(f'<p class="warning">{html.escape(state)}: the run ended before its '
                     f"last epoch; these figures cover only the {len(run.epochs)} epoch(s) it "
                     "finished</p>")
    parts.append(f"<h2>key figures</h2><table>{keys}</table>")
    if compare_link:
        parts.append(f'<p>comparison with other runs: <a href="{html.escape(compare_link)}">'
                     f"{html.escape(compare_link)}</a></p>")
    for title, epochs in (("epochs", run.epochs), ("evaluation epochs", run.eval_epochs)):
        if epochs:
            rows = [{"epoch": e.epoch, "AU %": e.au, "samples/s": e.samples_per_second,
                     "MiB/s": e.mib_per_second, "p50 ms": e.latency_p50_ms,
                     "p99 ms": e.latency_p99_ms, "seconds": e.duration} for e in epochs]
            if state != "complete":
                title += f" ({state})"
            parts.append(f"<h2>{html.escape(title)}</h2>{_table(rows)}")
    parts.append("<h2>plots</h2>")
    parts += [_figure(name, png, caption) for name, png, caption in figures]
    if skipped:
        parts.append("<h2>not drawn</h2><ul>"
                     + "".join(f"<li>{html.escape(s)}</li>" for s in skipped) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts).encode()


def compare_page(rows: list[dict], png: bytes) -> bytes:
    numbered = [{"#": i + 1, **r} for i, r in enumerate(rows)]
    stopped = [f"#{i + 1} (stopped by {r['stopped_by'] or 'an early stop'})"
               for i, r in enumerate(rows) if r["state"] != "complete"]
    warning = (f'<p class="warning">incomplete: {html.escape(", ".join(stopped))}; their '
               "figures cover only the epochs they finished</p>") if stopped else ""
    return "\n".join([
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>dlio-mpi report: "
        f"comparison</title><style>{STYLE}</style></head><body>",
        f"<h1>dlio-mpi report: {len(rows)} runs compared</h1>", warning, _table(numbered),
        _figure("compare.png", png, "key metrics per run (bar number = # in the table)"),
        "</body></html>"]).encode()


def compare_csv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    return buf.getvalue().encode()
