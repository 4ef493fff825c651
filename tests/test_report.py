"""dlio-mpi report: plots and an HTML page from real runs' results folders (2 MPI ranks),
drawn by one process without MPI; several runs compared in a CSV; trace files drawn when
present (synthetic ones here), skipped with a line when absent; folders that are not results
and a missing matplotlib refused with exit status 2."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import run_cli, workload_overrides

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.timeout(240)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_PLOTS = ("epochs.png", "rank_times.png", "latency.png", "throughput.png")
TRACE_PLOTS = ("spatial.png", "temporal.png", "request_sizes.png")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished 2-rank runs: the plain demo, and one with more compute, checkpoints and
    evaluation."""
    base = tmp_path_factory.mktemp("report")
    plain = run_cli(["run", "demo", *workload_overrides(base / "a")])
    assert plain.returncode == 0, plain.stderr
    ck = base / "b"
    res = run_cli(["run", "demo", *workload_overrides(
        ck, train__computation_time=0.01, workflow__checkpoint="true",
        checkpoint__checkpoint_folder=ck / "ck", checkpoint__epochs_between_checkpoints=1,
        workflow__evaluation="true", dataset__num_files_eval=4, reader__batch_size_eval=1,
        evaluation__eval_time=0.005)])
    assert res.returncode == 0, res.stderr
    return base / "a" / "out", ck / "out"


def report(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dlio-mpi report ARGS` in one plain process, checking it never imports mpi4py.MPI."""
    code = ("import sys; from dlio_mpi.cli import main; rc = main(sys.argv[1:]); "
            "assert 'mpi4py.MPI' not in sys.modules, 'report imported MPI'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-P", "-c", code, "report", *args],
                          capture_output=True, text=True, timeout=timeout)


def copy_results(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    return dst


def test_a_run_gets_its_plots_and_one_page_naming_them(runs, tmp_path):
    out = copy_results(runs[0], tmp_path / "out")
    res = report(str(out))
    assert res.returncode == 0, res.stderr
    folder = out / "report"
    page = (folder / "report.html").read_text()
    for name in RUN_PLOTS:
        png = (folder / name).read_bytes()
        assert png.startswith(PNG_MAGIC), name
        assert f'id="{name}"' in page and "data:image/png;base64," in page
    assert "demo" in page and str(out) in page
    # no traces, no checkpoints in this run: those plots are named as not drawn, and why
    for name in TRACE_PLOTS:
        assert not (folder / name).exists()
        assert f"{name}: no trace files" in page
    assert "checkpoints.png: the run wrote or read no checkpoint" in page
    assert "read latency p50 and p99 per epoch" in page
    assert str(folder / "report.html") in res.stdout
    # a second report replaces the first (its own files); a foreign file there is refused
    assert report(str(out)).returncode == 0
    (folder / "notes.txt").write_text("mine")
    res = report(str(out))
    assert res.returncode == 2
    assert "notes.txt" in res.stderr and str(folder) in res.stderr
    assert (folder / "notes.txt").read_text() == "mine"


def test_checkpoints_and_evaluation_are_shown_when_the_run_has_them(runs, tmp_path):
    out = copy_results(runs[1], tmp_path / "out")
    assert report(str(out)).returncode == 0, report(str(out)).stderr
    png = (out / "report" / "checkpoints.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    page = (out / "report" / "report.html").read_text()
    assert 'id="checkpoints.png"' in page
    # the evaluation epochs: a table of their own, with the figures per_epoch_stats holds
    stats = json.loads((out / "per_epoch_stats.json").read_text())
    evals = {int(k): v["eval"] for k, v in stats.items() if "eval" in v}
    assert sorted(evals) == [1, 2]
    table = page.split("<h2>evaluation epochs</h2>")[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert len(rows) == 2
    for row, (epoch, entry) in zip(rows, sorted(evals.items())):
        cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
        assert int(cells[0]) == epoch
        assert float(cells[2]) == pytest.approx(entry["throughput_samples_per_second"],
                                                rel=1e-3)
    plain = copy_results(runs[0], tmp_path / "plain")
    assert report(str(plain)).returncode == 0
    assert "evaluation epochs" not in (plain / "report" / "report.html").read_text()


def test_interval_statistics_are_drawn_over_time_when_the_run_wrote_them(runs, tmp_path):
    out = copy_results(runs[1], tmp_path / "out")  # stats_interval 10 s: a row per epoch
    assert json.loads((out / "interval_stats.json").read_text())
    assert report(str(out)).returncode == 0
    assert (out / "report" / "intervals.png").read_bytes().startswith(PNG_MAGIC)
    assert 'id="intervals.png"' in (out / "report" / "report.html").read_text()
    bare = copy_results(runs[1], tmp_path / "bare")  # as a run with stats_interval 0
    (bare / "interval_stats.json").unlink()
    assert report(str(bare)).returncode == 0
    assert not (bare / "report" / "intervals.png").exists()
    assert "intervals.png: no interval_stats.json" in \
        (bare / "report" / "report.html").read_text()


def test_two_runs_are_compared_in_a_csv_with_their_summaries_figures(runs, tmp_path):
    outs = [copy_results(r, tmp_path / f"out{i}") for i, r in enumerate(runs)]
    res = report(*map(str, outs), "--output", str(tmp_path / "cmp"))
    assert res.returncode == 0, res.stderr
    with open(tmp_path / "cmp" / "compare.csv") as fp:
        rows = list(csv.DictReader(fp))
    assert [row["run"] for row in rows] == [str(o) for o in outs]
    for row, out in zip(rows, outs):
        metric = json.loads((out / "summary.json").read_text())["metric"]
        assert float(row["au_percentage"]) == pytest.approx(metric["train_au_mean_percentage"])
        assert float(row["samples_per_second"]) == pytest.approx(
            metric["train_throughput_mean_samples_per_second"])
        assert float(row["MiB_per_second"]) == pytest.approx(
            metric["train_transfer_mean_MiB_per_second"])
        assert float(row["read_latency_p99_ms"]) == pytest.approx(
            metric["train_read_latency_p99_ms"])
        assert (out / "report" / "report.html").exists()  # each run's own report too
    assert rows[0]["save_checkpoint_GB_per_second"] == ""
    assert float(rows[1]["save_checkpoint_GB_per_second"]) > 0
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(PNG_MAGIC)
    assert 'id="compare.png"' in (tmp_path / "cmp" / "compare.html").read_text()
    # without --output the comparison goes into the first run's report folder
    assert report(*map(str, outs)).returncode == 0
    assert (outs[0] / "report" / "compare.csv").exists()


def _request(rank: int, i: int) -> dict:
    return {"name": "read", "ph": "X", "pid": rank, "tid": 1, "ts": 1000.0 + 50 * i + rank,
            "dur": 20.0 + i, "args": {"file": f"train/f{rank}.npz", "offset": i * 4096,
                                      "length": 4096 * (1 + i % 3), "latency": 20.0 + i}}


def test_traces_give_the_spatial_and_temporal_plots(runs, tmp_path):
    out = copy_results(runs[0], tmp_path / "out")
    steps = [{"name": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 10},
             {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
    with gzip.open(out / "trace_rank0.json.gz", "wt") as fp:
        json.dump({"traceEvents": steps + [_request(0, i) for i in range(30)]}, fp)
    (out / "trace_rank1.json").write_text(json.dumps([_request(1, i) for i in range(30)]))
    (out / "trace_rank2.json").write_text("{not json")
    res = report(str(out))
    assert res.returncode == 0, res.stderr
    page = (out / "report" / "report.html").read_text()
    for name in (*RUN_PLOTS, *TRACE_PLOTS):
        assert (out / "report" / name).read_bytes().startswith(PNG_MAGIC), name
        assert f'id="{name}"' in page
    assert "read latency CDF of 60 traced requests" in page  # rank 2's file is not parsed
    assert "trace skipped: trace_rank2.json" in page


def test_the_requests_read_from_traces(tmp_path):
    from dlio_mpi.report.traces import read_requests

    assert read_requests(str(tmp_path)) is None
    events = [_request(1, i) for i in range(4)] + [{"ph": "X", "args": {"offset": "x"}}, 7]
    with gzip.open(tmp_path / "trace_rank1.json.gz", "wt") as fp:
        json.dump({"traceEvents": events}, fp)
    requests = read_requests(str(tmp_path))
    assert len(requests) == 4 and requests.files == 1 and not requests.problems
    assert requests.rank.tolist() == [1] * 4
    assert requests.offset.tolist() == [0, 4096, 8192, 12288]
    assert requests.length.tolist() == [4096, 8192, 12288, 4096]
    assert requests.start_us.tolist() == [0.0, 50.0, 100.0, 150.0]
    assert requests.latency_us.tolist() == [20.0, 21.0, 22.0, 23.0]


def test_without_matplotlib_report_says_how_to_install_it(runs, monkeypatch, capsys):
    from dlio_mpi.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert main(["report", str(runs[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install matplotlib" in err


@pytest.mark.parametrize("make", ["empty", "missing", "file"])
def test_a_folder_that_is_not_results_is_refused_by_name(tmp_path, make):
    target = tmp_path / "nothing"
    if make == "empty":
        target.mkdir()
    elif make == "file":
        target.write_text("x")
    res = report(str(target))
    assert res.returncode == 2
    assert str(target) in res.stderr and res.stderr.startswith("dlio-mpi: error: report:")
    assert not (target / "report").exists()


def test_a_new_run_replaces_the_report_with_the_results_it_drew(tmp_path):
    args = ["run", "demo", *workload_overrides(tmp_path)]
    assert run_cli(args).returncode == 0
    out = tmp_path / "out"
    assert report(str(out)).returncode == 0
    res = run_cli(args)
    assert res.returncode == 0, res.stderr
    assert not (out / "report").exists()  # it drew the results just replaced
    assert report(str(out)).returncode == 0
    (out / "report" / "notes.txt").write_text("mine")
    res = run_cli(args)
    assert res.returncode == 2
    assert "holds the folder report, with files not of an unchanged dlio-mpi report" in res.stderr
    assert (out / "report" / "notes.txt").read_text() == "mine"
    assert (out / "summary.json").exists()  # refused before touching the results


def test_a_fifo_named_like_a_trace_is_named_on_the_page_not_waited_on(runs, tmp_path):
    out = copy_results(runs[0], tmp_path / "out")
    os.mkfifo(out / "trace_rank0.json.gz")  # opened plainly, it blocks until a writer comes
    (out / "trace_rank1.json").write_text(json.dumps([_request(1, i) for i in range(30)]))
    res = report(str(out), timeout=60)
    assert res.returncode == 0, res.stderr
    page = (out / "report" / "report.html").read_text()
    assert "trace skipped: trace_rank0.json.gz: " in page
    assert "trace_rank0.json.gz is a FIFO, not a regular file" in page
    assert "read latency CDF of 30 traced requests" in page  # rank 1's file is still drawn
    # and on the terminal, once
    assert res.stderr.count("trace skipped") == 1, res.stderr
    assert f"dlio-mpi: report: {out}: trace skipped: trace_rank0.json.gz: " in res.stderr
    assert "is a FIFO, not a regular file" in res.stderr


@pytest.mark.parametrize("name", ["summary.json", "per_epoch_stats.json", "config.yaml",
                                  "interval_stats.json", "report/dlio_mpi_report.json"])
def test_a_fifo_in_place_of_a_results_file_is_refused_by_name(runs, tmp_path, name):
    out = copy_results(runs[1], tmp_path / "out")
    if name.startswith("report/"):
        assert report(str(out)).returncode == 0
    target = out / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    res = report(str(out), timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("dlio-mpi: error: report: ")
    assert str(target) in res.stderr
    if name.startswith("report/"):
        assert "is not dlio-mpi's" in res.stderr
        assert (out / "report" / "report.html").exists()  # the earlier report is left as it is
    else:
        assert f"{target} is a FIFO, not a regular file" in res.stderr
        assert not (out / "report").exists()


def _key_figure(page: str, key: str) -> str:
    return page.split(f"<th>{key}</th><td>")[1].split("</td>")[0]


def test_a_run_stopped_by_a_signal_says_so_on_every_page(runs, tmp_path):
    stopped = copy_results(runs[1], tmp_path / "stopped")
    summary = json.loads((stopped / "summary.json").read_text())
    summary["dlio_mpi"].update(complete=False, stopped_by="SIGTERM")  # as run.py writes it
    (stopped / "summary.json").write_text(json.dumps(summary))
    whole = copy_results(runs[0], tmp_path / "whole")
    res = report(str(stopped), str(whole), "--output", str(tmp_path / "cmp"))
    assert res.returncode == 0, res.stderr
    page = (stopped / "report" / "report.html").read_text()
    assert _key_figure(page, "state") == "incomplete"
    assert _key_figure(page, "stopped_by") == "SIGTERM"
    assert '<p class="warning">incomplete, stopped by SIGTERM' in page
    assert "<h2>epochs (incomplete, stopped by SIGTERM)</h2>" in page
    assert "(incomplete, stopped by SIGTERM)</title>" in page
    with open(tmp_path / "cmp" / "compare.csv") as fp:
        rows = list(csv.DictReader(fp))
    assert [(r["state"], r["stopped_by"]) for r in rows] == [("incomplete", "SIGTERM"),
                                                             ("complete", "")]
    compare = (tmp_path / "cmp" / "compare.html").read_text()
    assert "incomplete: #1 (stopped by SIGTERM)" in compare
    assert "<td>incomplete</td><td>SIGTERM</td>" in compare
    plain = (whole / "report" / "report.html").read_text()
    assert "incomplete" not in plain and "SIGTERM" not in plain
    assert _key_figure(plain, "state") == "complete"


def test_a_full_disk_while_writing_the_report_is_one_message_and_leaves_no_report(
        runs, small_fs):
    from dlio_mpi.results.report_folder import own_report_files

    out = copy_results(runs[0], small_fs / "out")
    folder = out / "report"
    fs = os.statvfs(small_fs)
    filler = small_fs / "filler"
    with open(filler, "wb") as fp:  # leave 48 KiB: less than the plots and the page need
        fp.write(bytes(fs.f_bavail * fs.f_frsize - 48 * 1024))
    res = report(str(out))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"dlio-mpi: error: report: cannot write {folder}{os.sep}")
    assert "No space left on device" in res.stderr
    # nothing that looks like a report, and nothing a next report or run would refuse
    assert not (folder / "report.html").exists()
    assert not folder.exists() or not list(folder.iterdir())
    assert own_report_files(str(folder)) is not None
    filler.unlink()
    res = report(str(out))
    assert res.returncode == 0, res.stderr
    assert (folder / "report.html").exists()
