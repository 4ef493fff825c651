#!/usr/bin/env python3
"""Writing a run's results, and how long a stopped run takes to end (issue 30).

    source scripts/_env.sh
    python scripts/bench/results_writing.py --work DIR [write] [stop]

write: the results of --epochs (10,000) synthetic training epochs of --ranks (2) ranks,
       written as a stopped run writes them (run.write_result_files: summary.json,
       per_epoch_stats.json, config.yaml, each rank's two files, the table printed), beside
       the reference: json.dumps by json's C encoder of the same per_epoch_stats.json
       content (the values' text alone, no file). Also what run_phase_epoch spends at each
       epoch's end on its figures and per_epoch_stats.json entry (EpochSummary, the epoch's
       line, its entry built and encoded: json_text). The epochs' figures are drawn at full
       precision where a run measures them, 0.0 where the workload below models no cost
       (compute, host, preprocess). Median and best of --repeat (5) turns; target: under 1 s
       at 10,000 epochs on 2 ranks. The files written are checked: per_epoch_stats.json holds
       every epoch, the table is bounded.
stop:  `mpiexec -n 2 dlio-mpi run` of a workload of short epochs (2 steps of one 4 KiB npy
       sample a rank, no compute), SIGTERM to the ranks (not to mpiexec) after --after (15)
       seconds, and the seconds until mpiexec exits: in training, in evaluation (400 eval
       files: an evaluation takes 100 steps, training 2), during checkpoints saved after
       every step (16 MiB a rank with fsync, 100 epochs: the signal after 10 s); and
       `dlio-mpi generate` of 200,000 npy files of 4 KiB (the signal after 5 s: while
       writing), of 4,000 of 1 MiB (after 6 s: writing, stages of many MiB), and of 2 x 10^6
       of 4 KiB (after 2 s: while the ranks survey their files). 5 turns a case (--turns),
       median; target: under 2 s, the results written and marked incomplete (summary.json's
       dlio_mpi.complete false; the manifest's state incomplete).

Figures are printed and saved to DIR/results_writing.json. DIR holds the cases' data and
output folders (removed at the end but for the last turn's output folders); about 2 GB at
most (the checkpoints). --cases names the stop cases to run (default: all)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORKLOAD = """model: {name: results_writing}
framework: pytorch
workflow: {generate_data: true, train: true}
dataset: {data_folder: DATA, format: npy, num_files_train: 4, num_samples_per_file: 1,
          record_length_bytes: 4096}
reader: {data_loader: pytorch, batch_size: 1, read_threads: 1}
train: {epochs: 1000000, computation_time: 0.0}
output: {folder: OUT}
"""


def write_workload(work: Path) -> Path:
    path = work / "workload.yaml"
    path.write_text(WORKLOAD.replace("DATA", str(work / "data")).replace("OUT", str(work / "out")))
    return path


# ------------------------------------------------------------------------------ write
def synthetic_epochs(epochs: int, ranks: int, seed: int = 0) -> list:
    """EpochRecords of `ranks` ranks for `epochs` epochs, as the workload's would be."""
    from dataclasses import fields

    from dlio_mpi.metrics import latency
    from dlio_mpi.metrics.summary import EpochRecord

    rng = np.random.default_rng(seed)
    zero = {"compute_seconds", "host_seconds", "preprocess_cpu_seconds", "au_percentage",
            "preprocess_wall_seconds", "loader_startup_seconds", "checkpoint_pause_seconds",
            "overshoot_us_per_step", "au_without_barrier_percentage"}
    drawn = [(f.name, f.type == "int") for f in fields(EpochRecord)
             if f.name not in ("epoch", "rank", "start", "end", "steps", "latency_hist",
                               "cache")]
    hist = latency.histogram(rng.lognormal(7, 0.5, 16))
    start = time.time()
    out = []
    for epoch in range(1, epochs + 1):
        rows = []
        for rank in range(ranks):
            values = {name: 0.0 if name in zero else int(rng.integers(1, 1 << 16)) if whole
                      else float(rng.random() * 1e-3) for name, whole in drawn}
            begin = start + epoch * 1e-3 + rank * 1e-5
            rows.append(EpochRecord(epoch=epoch, rank=rank, steps=2, start=begin,
                                    end=begin + float(rng.random() * 1e-3),
                                    latency_hist=hist, **values))
        out.append(rows)
    return out


def epoch_ends(records: list) -> tuple[list, float]:
    """The summaries as run_phase_epoch makes them at each epoch's end, and the seconds."""
    from dlio_mpi.metrics.summary import EpochSummary

    began = time.perf_counter()
    summaries = []
    for rows in records:
        summary = EpochSummary(rows[0].epoch, rows, 4096.0)
        _ = (summary.au_percentage, summary.samples_per_second,  # the epoch's line
             summary.transfer_mib_per_second, summary.seconds, summary.overhead_us_per_step)
        summary.json_text()
        summaries.append(summary)
    return summaries, time.perf_counter() - began


def write_turn(cfg, summaries: list, ranks: int, folder: Path) -> tuple[float, str]:
    """One write of the results into a new `folder`: seconds, the table."""
    from dlio_mpi.mpi.topology import HostInfo
    from dlio_mpi.results.folder import OutputFolder
    from dlio_mpi.run import RunRecord, write_result_files

    folder.mkdir(parents=True)
    out = OutputFolder(str(folder), "dlio.log")
    record = RunRecord(time.time(), out, None, train_epochs=summaries)
    header = {"num_accelerators": ranks, "data_size_per_host_GB": 0.0,
              "dlio_mpi": {"complete": False, "stopped_by": "SIGTERM"}}
    hosts = [HostInfo("host", os.cpu_count() or 1, 2**34, "cpu")] * ranks
    began = time.perf_counter()
    _, table = write_result_files(out, cfg, header, record, hosts, time.time_ns())
    return time.perf_counter() - began, table


def bench_write(work: Path, epochs: int, ranks: int, repeat: int) -> dict:
    from dlio_mpi.config import load_config
    from dlio_mpi.metrics.summary import TABLE_EPOCHS

    cfg = load_config(str(write_workload(work)), [])
    records = synthetic_epochs(epochs, ranks)
    ends, writes, refs, table = [], [], [], ""
    for turn in range(repeat):
        summaries, seconds = epoch_ends(records)
        ends.append(seconds / epochs * 1e6)
        folder = work / f"write-{turn}"
        shutil.rmtree(folder, ignore_errors=True)
        seconds, table = write_turn(cfg, summaries, ranks, folder)
        writes.append(seconds)
        stats = {str(e.epoch): e.to_json() for e in summaries}
        began = time.perf_counter()
        text = json.dumps(stats)
        refs.append(time.perf_counter() - began)
        written = json.loads((folder / "per_epoch_stats.json").read_text())
        assert written == json.loads(text) and len(written) == epochs
        if turn:
            shutil.rmtree(folder)
        print(f"  turn {turn + 1}: write {writes[-1]:.3f} s, C encoder {refs[-1]:.3f} s, "
              f"epoch end {ends[-1]:.1f} us", flush=True)
    rows = [line for line in table.splitlines() if re.match(r"train +\d", line)]
    assert len(rows) <= TABLE_EPOCHS, len(rows)
    ratios = [w / r for w, r in zip(writes, refs)]
    return {"epochs": epochs, "ranks": ranks, "turns": repeat,
            "write_seconds": _figure(writes), "c_encoder_seconds": _figure(refs),
            "ratio_write_over_c_encoder": _figure(ratios),
            "epoch_end_us": _figure(ends), "table_rows": len(rows),
            "per_epoch_stats_bytes": (work / "write-0" / "per_epoch_stats.json").stat().st_size,
            "target_seconds": 1.0}


def _figure(values: list[float]) -> dict:
    return {"median": statistics.median(values), "best": min(values), "all": values}


# ------------------------------------------------------------------------------ stop
CASES = {  # name: (command, overrides, seconds before the signal: --after where None)
    "train": ("run", [], None),
    "eval": ("run", ["workflow.evaluation=true", "dataset.num_files_eval=400",
                     "evaluation.eval_after_epoch=1", "evaluation.epochs_between_evals=1"],
             None),
    "checkpoint": ("run", ["workflow.checkpoint=true", "checkpoint.steps_between_checkpoints=1",
                           "model.model_size_bytes=33554432", "train.epochs=100"], 10.0),
    "generate_4KiB": ("generate", ["dataset.num_files_train=200000"], 5.0),
    "generate_1MiB": ("generate", ["dataset.num_files_train=4000",
                                   "dataset.record_length_bytes=1048576"], 6.0),
    "generate_survey": ("generate", ["dataset.num_files_train=2000000"], 2.0),
}


def rank_pids(tag: str) -> list[int]:
    """The ranks' processes: argv[0] this Python and `tag` in their arguments (not mpiexec,
    not its proxies)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace") == sys.executable and \
                any(tag.encode() in a for a in argv):
            pids.append(int(entry))
    return pids


def stop_turn(work: Path, workload: Path, name: str, after: float) -> dict:
    command, overrides, own_after = CASES[name]
    data, out = work / f"data-{name}", work / f"out-{name}"
    for folder in (data, out, work / "checkpoints"):
        shutil.rmtree(folder, ignore_errors=True)
    cmd = [os.environ.get("MPIEXEC", "mpiexec"), "-n", "2", sys.executable, "-P", "-m",
           "dlio_mpi", command, str(workload), *overrides, f"dataset.data_folder={data}",
           f"output.folder={out}", f"checkpoint.checkpoint_folder={work / 'checkpoints'}"]
    log_path = work / f"{name}.log"  # not a pipe: a full one would hold the ranks back
    with open(log_path, "w") as log_file:
        job = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        time.sleep(own_after or after)
        pids = rank_pids(str(out))
        signalled = time.perf_counter()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        job.wait(timeout=600)
    seconds = time.perf_counter() - signalled
    log = log_path.read_text()
    epochs = sum(line.startswith("train epoch ") for line in log.splitlines())
    summary = out / "summary.json"
    complete = json.loads(summary.read_text())["dlio_mpi"]["complete"] \
        if summary.exists() else None
    manifest = out / "dlio_mpi_results.json"
    state = json.loads(manifest.read_text())["state"] if manifest.exists() else None
    shutil.rmtree(data, ignore_errors=True)
    return {"seconds": seconds, "ranks_signalled": len(pids), "exit": job.returncode,
            "train_epochs": epochs, "complete": complete, "manifest_state": state,
            "stopped": "stopped by SIGTERM" in log}


def bench_stop(work: Path, after: float, turns: int, cases: list[str]) -> dict:
    workload = write_workload(work)
    results = {}
    for name in cases:
        runs = []
        for turn in range(turns):
            runs.append(stop_turn(work, workload, name, after))
            r = runs[-1]
            print(f"  {name} turn {turn + 1}: {r['seconds']:.2f} s after SIGTERM to "
                  f"{r['ranks_signalled']} ranks, {r['train_epochs']} training epochs, exit "
                  f"{r['exit']}, complete {r['complete']}, manifest {r['manifest_state']}",
                  flush=True)
        # a job that ended before the signal (another process's signal, a failure) is left out
        valid = [r["seconds"] for r in runs if r["ranks_signalled"] == 2 and r["stopped"]]
        results[name] = {"seconds": _figure(valid) if valid else None, "runs": runs,
                         "left_out": len(runs) - len(valid)}
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--after", type=float, default=15.0)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"stop cases, comma-separated, of {', '.join(CASES)}")
    parser.add_argument("benchmarks", nargs="*", default=["write", "stop"],
                        choices=["write", "stop"])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    if "write" in args.benchmarks:
        print(f"write: {args.epochs} epochs of {args.ranks} ranks", flush=True)
        results["write"] = bench_write(args.work, args.epochs, args.ranks, args.repeat)
        w = results["write"]
        print(f"write: {w['write_seconds']['median']:.3f} s median "
              f"({w['write_seconds']['best']:.3f} best), "
              f"{w['ratio_write_over_c_encoder']['median']:.2f}x the C encoder's "
              f"json.dumps of per_epoch_stats.json's content; "
              f"{w['epoch_end_us']['median']:.1f} us at each epoch's end")
    if "stop" in args.benchmarks:
        results["stop"] = bench_stop(args.work, args.after, args.turns,
                                     args.cases.split(","))
        for name, r in results["stop"].items():
            left = f", {r['left_out']} run(s) left out" if r["left_out"] else ""
            print(f"stop {name}: no valid run{left}" if r["seconds"] is None else
                  f"stop {name}: {r['seconds']['median']:.2f} s median "
                  f"({min(r['seconds']['all']):.2f}-{max(r['seconds']['all']):.2f}){left}")
    (args.work / "results_writing.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
