"""Side by side on the same files: the reference job (a real PyTorch DataLoader training loop,
reference.py), dlio-mpi calibrated from the real loader (`dlio-mpi calibrate`, then `dlio-mpi
run` of the file it writes) and, with --baseline, dlio-mpi configured the usual way
(reader.preprocess_time = one sample's preprocessing timed alone in one process). One table
of samples/s and AU per epoch, with the emulation's ratio to the reference.

    python scripts/fidelity/compare.py WORKLOAD [KEY=VALUE ...] --work DIR \\
        [--ranks 1,2] [--workers 1,2,4] [--calibrate-at each|W] [--epochs 2] \\
        [--dataset MODULE:CALLABLE | --transform imagenet|none] [--step-time S] \\
        [--prefix "scripts/slow_pfs.sh run --"] [--warm] [--baseline] [--sleep-model] \\
        [--repeat N]

Before each job the dataset's files leave the page cache (posix_fadvise DONTNEED), so the
first epoch reads from storage and the later ones from the page cache, for both sides alike
(--warm: read them all first instead). --prefix runs every job through a command (the
throttled slow tier). --repeat N runs every case N times, the cases taking turns, and the
table gives the medians (a shared host's speed drifts: the ratio of each run is given too,
and "reference CPU / calibrated", the reference's worker CPU per sample over calibration's: 1
where the host ran as fast as when it was calibrated).
Every command is printed before it runs. Results: DIR/fidelity.csv and DIR/fidelity.md; each
job's own output under DIR."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the installed command, else the package on PYTHONPATH (a checkout with its core built in place)
DLIO = [shutil.which("dlio-mpi")] if shutil.which("dlio-mpi") else [sys.executable, "-m",
                                                                      "dlio_mpi"]
LONE = re.compile(r"one sample made alone in one process\): ([0-9.]+) ms")
WALL = re.compile(r"in ([0-9.]+) ms of a worker's wall time")
WORKER_CPU = re.compile(r"= ([0-9.]+) ms CPU, in")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="+", metavar="WORKLOAD|KEY=VALUE")
    p.add_argument("--work", required=True, metavar="DIR")
    p.add_argument("--ranks", default="1", help="comma-separated rank counts")
    p.add_argument("--workers", default="2", help="comma-separated worker counts")
    p.add_argument("--calibrate-at", default="each",
                   help="the worker count to calibrate at, or 'each' (each run's own)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each side per case, interleaved; the table has their medians")
    p.add_argument("--files", type=int, default=1000, help="files calibration measures")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--dataset", metavar="MODULE:CALLABLE")
    how.add_argument("--transform", choices=("imagenet", "none"))
    step = p.add_mutually_exclusive_group()
    step.add_argument("--step-time", type=float, default=None,
                      help="the accelerator's step in seconds (default: the workload's)")
    step.add_argument("--model", metavar="MODULE:CALLABLE",
                      help="the reference trains this torch module on --device; calibration "
                           "times its step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--stand-in", action="store_true",
                   help="with --model: also run the reference with the step stood in by a "
                        "sleep of the step time calibration measured")
    p.add_argument("--prefix", default="", help="a command every job runs through")
    p.add_argument("--warm", action="store_true", help="the page cache holds the dataset")
    p.add_argument("--baseline", action="store_true",
                   help="also run dlio-mpi configured the usual way (preprocess_time)")
    p.add_argument("--sleep-model", action="store_true",
                   help="also run the calibration with each sample's cost slept instead of "
                        "spent as CPU work (preprocess_time = a worker's wall time per "
                        "sample where it was calibrated)")
    p.add_argument("--mpiexec", default="mpiexec")
    return p.parse_intermixed_args(argv)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(cmd: list[str], prefix: str = "", env: dict | None = None) -> str:
    """Run `cmd` (after `prefix`), printing it first; its standard output."""
    full = shlex.split(prefix) + cmd
    print("+ " + shlex.join(full), flush=True)
    done = subprocess.run(full, stdout=subprocess.PIPE, text=True, env=env)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"compare.py: the command above failed (exit {done.returncode})")
    return done.stdout


def dataset_paths(args: argparse.Namespace) -> list[str]:
    from dlio_mpi.calibrate.command import workload_files

    job = argparse.Namespace(args=args.args, files=1 << 62)
    return workload_files(job)[4]


def set_page_cache(paths: list[str], warm: bool) -> None:
    """Drop the files from the page cache, or (warm) read them all into it."""
    from dlio_mpi.readers.base import drop_cached_pages

    if not warm:
        drop_cached_pages(paths)
        return
    for path in paths:
        with open(path, "rb") as fp:
            while fp.read(1 << 20):
                pass


def pipeline(args: argparse.Namespace) -> list[str]:
    if args.dataset:
        return ["--dataset", args.dataset]
    return ["--transform", args.transform] if args.transform else []


def step_options(args: argparse.Namespace, option: str) -> list[str]:
    """The accelerator's step as given: a time (`option` SECONDS), or a model on a device."""
    if args.model:
        return ["--model", args.model, "--device", args.device]
    return [option, str(args.step_time)] if args.step_time is not None else []


def calibrate(args: argparse.Namespace, workers: int) -> tuple[str, float, float, float, float]:
    """The calibrated workload at `workers` workers; the usual practice's seconds per
    sample; the step time it sets; a worker's wall time per sample; the workers' CPU
    seconds per sample."""
    import yaml

    out = os.path.join(args.work, f"calibrated_w{workers}.yaml")
    run([*DLIO, "calibrate", *args.args, "--workers", str(workers), "--files",
         str(args.files), *pipeline(args), *step_options(args, "--compute-time"),
         "--out", out], args.prefix)
    with open(out) as fp:
        text = fp.read()
    lone, wall, cpu = LONE.search(text), WALL.search(text), WORKER_CPU.search(text)
    step = yaml.safe_load(text).get("train", {}).get("computation_time", 0.0)
    return (out, float(lone.group(1)) / 1e3 if lone else 0.0, float(step),
            float(wall.group(1)) / 1e3 if wall else 0.0, float(cpu.group(1)) / 1e3 if cpu else 0.0)


def reference(args, ranks: int, workers: int, stand_in: float | None = None) -> list[dict]:
    name = "reference" if stand_in is None else "stand_in"
    out = os.path.join(args.work, f"{name}_r{ranks}_w{workers}.json")
    step = (["--step-time", str(stand_in)] if stand_in is not None
            else step_options(args, "--step-time"))
    run([args.mpiexec, "-n", str(ranks), sys.executable, os.path.join(HERE, "reference.py"),
         *args.args, "--workers", str(workers), "--epochs", str(args.epochs),
         *pipeline(args), *step, "--out", out], args.prefix)
    with open(out) as fp:
        return [{"samples_per_second": e["samples_per_second"], "au": e["au_percentage"],
                 "worker_cpu_per_sample": worker_cpu_per_sample(e)}
                for e in json.load(fp)["epochs"]]


def worker_cpu_per_sample(epoch: dict) -> float:
    """The reference's worker processes' CPU seconds per sample in `epoch` (all ranks)."""
    ranks = epoch["per_rank"]
    samples = sum(r["samples_per_second"] * r["seconds"] for r in ranks)
    return sum(r.get("worker_cpu_seconds", 0.0) for r in ranks) / samples if samples else 0.0


def emulate(args, name: str, workload: list[str], ranks: int, workers: int) -> list[dict]:
    folder = os.path.join(args.work, f"{name}_r{ranks}_w{workers}")
    step = ([f"train.computation_time={args.step_time}"]
            if args.step_time is not None else [])
    run([args.mpiexec, "-n", str(ranks), *DLIO, "run", *workload,
         f"reader.read_threads={workers}", f"train.epochs={args.epochs}",
         f"output.folder={folder}", "output.progress_interval=0", *step], args.prefix)
    with open(os.path.join(folder, "summary.json")) as fp:
        metric = json.load(fp)["metric"]
    return [{"samples_per_second": t, "au": a}
            for t, a in zip(metric["train_throughput_samples_per_second"],
                            metric["train_au_percentage"])]


def baseline_workload(args, lone_s: float) -> list[str]:
    """The workload configured the usual way: its reader, preprocess_time the lone figure."""
    return [*args.args, "reader.data_loader=pytorch", f"reader.preprocess_time={lone_s:.6f}"]


# the sides beside the calibrated emulation: (key, column title)
OTHERS = (("usual", "usual way"), ("sleep", "sleep model"), ("stand_in", "stand-in"))


def _against(name: str, side: dict, ref: dict) -> dict:
    """A side's columns: its samples/s, its ratio to the reference's, its AU."""
    return {f"{name}_samples_per_second": round(side["samples_per_second"], 1),
            f"{name}_ratio": round(side["samples_per_second"] / ref["samples_per_second"], 3),
            f"{name}_au": round(side["au"], 2)}


def rows_of(ranks: int, workers: int, calibrated_at: int, ref, emu, base, stand,
            slept=None) -> list[dict]:
    """A row per epoch: the reference, the calibrated emulation (dlio_mpi_*, ratio, AU
    points) and the other sides run (OTHERS)."""
    others = {"usual": base, "sleep": slept, "stand_in": stand}
    rows = []
    for epoch, (r, e) in enumerate(zip(ref, emu), start=1):
        row = {"ranks": ranks, "workers": workers, "calibrated_at": calibrated_at,
               "epoch": epoch, "reference_samples_per_second": round(r["samples_per_second"], 1),
               "dlio_mpi_samples_per_second": round(e["samples_per_second"], 1),
               "ratio": round(e["samples_per_second"] / r["samples_per_second"], 3),
               "reference_au": round(r["au"], 2), "dlio_mpi_au": round(e["au"], 2),
               "au_points": round(e["au"] - r["au"], 2),
               "reference_cpu_vs_calibrated": round(r.get("cpu_vs_calibrated", 0.0), 3)}
        for name, _ in OTHERS:
            if others[name]:
                row.update(_against(name, others[name][epoch - 1], r))
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ["ranks", "workers", "calibrated at", "epoch", "reference samples/s",
            "dlio-mpi samples/s", "ratio", "ratio per run", "reference AU %", "dlio-mpi AU %",
            "AU points", "reference CPU / calibrated"]
    keys = ["ranks", "workers", "calibrated_at", "epoch", "reference_samples_per_second",
            "dlio_mpi_samples_per_second", "ratio", "ratio_range", "reference_au",
            "dlio_mpi_au", "au_points", "reference_cpu_vs_calibrated"]
    for name, title in OTHERS:
        if rows and f"{name}_ratio" in rows[0]:
            head += [f"{title} samples/s", f"{title} ratio", f"{title} AU %"]
            keys += [f"{name}_samples_per_second", f"{name}_ratio", f"{name}_au"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def one_round(args, ranks: int, workers: int, calibrated: dict, paths: list[str]):
    """One run of each side for (ranks, workers): (calibrated at, reference, calibrated
    emulation, usual configuration or None, stand-in or None, sleep model or None), each a
    list of epochs."""
    # each run's own calibration just before it (a shared host drifts), or one for all
    cal_w = workers if args.calibrate_at == "each" else int(args.calibrate_at)
    if cal_w not in calibrated or args.calibrate_at == "each":
        set_page_cache(paths, warm=True)  # calibration measures the warm loader
        calibrated[cal_w] = calibrate(args, cal_w)
    set_page_cache(paths, args.warm)
    ref = reference(args, ranks, workers)
    for epoch in ref:  # the host's speed then against calibration's (1: as calibrated)
        cal_cpu = calibrated[cal_w][4]
        epoch["cpu_vs_calibrated"] = epoch.pop("worker_cpu_per_sample") / cal_cpu if cal_cpu \
            else 0.0
    set_page_cache(paths, args.warm)
    emu = emulate(args, "calibrated", [calibrated[cal_w][0]], ranks, workers)
    base = stand = slept = None
    if args.sleep_model:
        set_page_cache(paths, args.warm)
        slept = emulate(args, "sleep", [calibrated[cal_w][0], "reader.preprocess_cpu_time=0",
                                        f"reader.preprocess_time={calibrated[cal_w][3]:.6f}"],
                        ranks, workers)
    if args.baseline:
        set_page_cache(paths, args.warm)
        base = emulate(args, "usual", baseline_workload(args, calibrated[cal_w][1]), ranks,
                       workers)
    if args.stand_in and args.model:
        set_page_cache(paths, args.warm)
        stand = reference(args, ranks, workers, stand_in=calibrated[cal_w][2])
    return cal_w, ref, emu, base, stand, slept


def medians(runs: list) -> list[dict] | None:
    """Per epoch, the median over repeated runs of samples/s and AU (None: not run)."""
    if runs[0] is None:
        return None
    return [{k: statistics.median(run[e][k] for run in runs)
             for k in ("samples_per_second", "au", "cpu_vs_calibrated") if k in runs[0][e]}
            for e in range(len(runs[0]))]


def main(argv: list[str]) -> int:
    args = parse(argv)
    os.makedirs(args.work, exist_ok=True)
    started = time.time()
    workers, ranks = ints(args.workers), ints(args.ranks)
    # generation's results (and the folder it claims) go under --work, never into the
    # workload's own output.folder, which may be --work itself or hold a user's runs
    own = [] if any(a.startswith("output.folder=") for a in args.args[1:]) else [
        f"output.folder={os.path.join(args.work, 'generate')}"]
    run([args.mpiexec, "-n", str(max(ranks)), *DLIO, "generate", *args.args, *own],
        args.prefix)
    paths = dataset_paths(args)
    calibrated: dict = {}
    runs: dict = {}
    for _ in range(args.repeat):  # the repeats interleaved: drift hits every case alike
        for r in ranks:
            for w in workers:
                runs.setdefault((r, w), []).append(one_round(args, r, w, calibrated, paths))
    rows = []
    for (r, w), done in runs.items():
        sides = [medians([d[k] for d in done]) for k in range(1, 6)]
        rows += rows_of(r, w, done[0][0], *sides)
        spread = [[e["samples_per_second"] / f["samples_per_second"]
                   for e, f in zip(d[2], d[1])] for d in done]
        for row in rows[-len(sides[0]):]:
            ratios = [per_run[row["epoch"] - 1] for per_run in spread]
            row["ratio_range"] = f"{min(ratios):.3f}-{max(ratios):.3f}"
    with open(os.path.join(args.work, "fidelity.csv"), "w", newline="") as fp:
        writer = csv.DictWriter(fp, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows)
    with open(os.path.join(args.work, "fidelity.md"), "w") as fp:
        fp.write(table + "\n")
    worst = max(abs(r["ratio"] - 1) for r in rows)
    points = max(abs(r["au_points"]) for r in rows)
    print(table)
    print(f"worst samples/s error {100 * worst:.1f} %, worst AU error {points:.1f} points "
          f"({len(rows)} epochs, medians of {args.repeat} run(s) each; "
          f"{time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
