#!/usr/bin/env python3
"""The small-file mitigation study: one workload read four ways, side by side.

    source scripts/_env.sh && pip install matplotlib
    python scripts/small_files_study.py --work DIR [--files 4096] [--sample-bytes 16384] ...

It generates a dataset of one sample per file (npz, `--files` files; dlio-mpi generate), packs
it into indexed_binary shards (dlio-mpi pack), then runs the same training workload
(`mpiexec -n RANKS dlio-mpi run`: the same samples, batches, seed-shuffled order and epochs)
as
  original  the small files, read as DLIO's pytorch reader loads them (reader.access loader:
            open, probe, read, close per sample);
  packed    the packed shards (each sample one extent of a shard, shards kept open per reader
            thread and epoch);
  lean      the small files with cached file handles (reader.access lean: descriptors kept
            across epochs, one read per sample; reader.fd_cache_size large enough for every
            file a rank reads, within the process's open-file limit);
  sorted    the small files with each batch read in (file, offset) order
            (reader.access_order sorted).
Every run drops the files it will read from the page cache before each epoch
(reader.drop_page_cache: true), so that each epoch reads from storage and the variants are
compared storage against storage (without it, a dataset this small is served from memory
after the first epoch). The kernel's dentry and inode caches are not dropped: opens of a
local file system stay cheap, where a parallel file system sends each one to its metadata
server; the opens per second column is what that server would see.

From each run's summary.json (and per_epoch_stats.json for the epochs' seconds): AU (%),
samples/s, file opens per second of epoch time and MiB/s storage returned. One CSV
(DIR/small_files_study.csv) and one PNG (DIR/small_files_study.png: one panel per figure, a
bar per variant, hatched so that it reads in black and white); the table is printed. The
files it made are left in DIR (remove it when done); a rerun reuses the dataset and the pack.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import subprocess
import sys
from pathlib import Path

VARIANTS = {
    "original": ("small files, reader.access loader", ["reader.access=loader"]),
    "packed": ("indexed_binary shards (dlio-mpi pack)", ["reader.access=loader"]),
    "lean": ("small files, cached file handles (reader.access lean)", ["reader.access=lean"]),
    "sorted": ("small files, reader.access_order sorted",
               ["reader.access=loader", "reader.access_order=sorted"]),
}
COLUMNS = ("variant", "description", "au_percentage", "samples_per_second",
           "opens_per_second", "mib_per_second", "file_opens", "epoch_seconds", "bytes_read",
           "epochs", "output_folder")
FIGURES = (("au_percentage", "AU (%)"), ("samples_per_second", "samples/s"),
           ("opens_per_second", "file opens/s"), ("mib_per_second", "MiB/s read"))
HATCHES = ("", "///", "...", "xx")


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def dlio(ranks: int, work: Path, *args: str, timeout: float) -> str:
    """`mpiexec -n RANKS dlio-mpi ARGS` in `work` (so that a checkout's source tree in the
    current folder does not shadow the installed package); its output, or exit with it on
    failure."""
    cmd = [_mpiexec(), "-n", str(ranks), sys.executable, "-m", "dlio_mpi", *args]
    print("+", shlex.join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=work)
    if done.returncode != 0:
        sys.exit(f"small_files_study: failed (exit {done.returncode}):\n{done.stdout}"
                 f"{done.stderr}")
    return done.stdout


def figures(out: Path) -> dict:
    """The run's figures from its summary.json (and the epochs' seconds)."""
    summary = json.loads((out / "summary.json").read_text())
    epochs = json.loads((out / "per_epoch_stats.json").read_text())
    metric = summary["metric"]
    seconds = sum(float(e["duration"]) for e in epochs.values() if isinstance(e, dict)
                  and "duration" in e)
    opens = int(metric["train_file_opens"])
    return {"au_percentage": metric["train_au_mean_percentage"],
            "samples_per_second": metric["train_throughput_mean_samples_per_second"],
            "opens_per_second": opens / seconds if seconds > 0 else 0.0,
            "mib_per_second": metric["train_transfer_mean_MiB_per_second"],
            "file_opens": opens, "epoch_seconds": seconds,
            "bytes_read": metric["train_bytes_transferred"], "epochs": summary["epochs"]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4 * len(FIGURES), 4))
    names = [row["variant"] for row in rows]
    for ax, (key, label) in zip(axes, FIGURES):
        values = [float(row[key]) for row in rows]
        bars = ax.bar(names, values, color="white", edgecolor="black",
                      hatch=None, linewidth=1.2)
        for bar, hatch in zip(bars, HATCHES):
            bar.set_hatch(hatch)
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:,.0f}" if value >= 100 else f"{value:.2f}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(label)
        if key == "au_percentage":
            ax.set_ylim(0, 100)
        ax.tick_params(axis="x", labelrotation=30)
        ax.margins(y=0.15)
    fig.suptitle("small files: original, packed, cached handles, sorted order")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, type=Path,
                        help="folder for the datasets, the runs and the results")
    parser.add_argument("--files", type=int, default=4096, help="small files (samples)")
    parser.add_argument("--sample-bytes", type=int, default=16384,
                        help="dataset.record_length_bytes of each sample")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="reader.batch_size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--read-threads", type=int, default=1)
    parser.add_argument("--computation-time", type=float, default=0.01,
                        help="train.computation_time per step (s)")
    parser.add_argument("--samples-per-shard", type=int, default=None,
                        help="dlio-mpi pack's (default: its own, shards of <= 256 MiB)")
    parser.add_argument("--timeout", type=float, default=1800, help="per command (s)")
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = [f"dataset.data_folder={work / 'files'}", "dataset.format=npz",
            f"dataset.num_files_train={args.files}", "dataset.num_samples_per_file=1",
            f"dataset.record_length_bytes={args.sample_bytes}",
            "dataset.record_length_bytes_stdev=0", "dataset.num_files_eval=0",
            "workflow.evaluation=False", "workflow.checkpoint=False"]
    dlio(args.ranks, work, "generate", "demo", *base, timeout=args.timeout)
    pack = ["pack", "demo", *base, "--to", str(work / "packed")]
    if args.samples_per_shard:
        pack += ["--samples-per-shard", str(args.samples_per_shard)]
    dlio(args.ranks, work, *pack, timeout=args.timeout)
    from dlio_mpi.data.pack import OVERRIDES_NAME, combined

    packed = tuple((work / "packed" / OVERRIDES_NAME).read_text().split())
    training = ["workflow.generate_data=False", f"reader.batch_size={args.batch}",
                f"train.epochs={args.epochs}", f"train.computation_time={args.computation_time}",
                f"reader.read_threads={args.read_threads}", "reader.sample_shuffle=seed",
                "reader.drop_page_cache=true", "reader.data_loader=pytorch"]
    # lean: a descriptor for every file a rank reads, as far as the open-file limit allows
    handles = min(args.files, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256, 256))
    rows = []
    for name, (text, extra) in VARIANTS.items():
        if name == "lean":
            extra = [*extra, f"reader.fd_cache_size={handles}"]
        out = work / "runs" / name
        if out.exists():  # dlio-mpi claims an output folder once: take the next free name
            k = 2
            while (work / "runs" / f"{name}.{k}").exists():
                k += 1
            out = work / "runs" / f"{name}.{k}"
        settings = [*base, *training, *extra, f"output.folder={out}"]
        dlio(args.ranks, work, "run", "demo", *(combined(settings, packed) if name == "packed"
                                           else settings), timeout=args.timeout)
        rows.append({"variant": name, "description": text, **figures(out),
                     "output_folder": str(out)})
    table = work / "small_files_study.csv"
    with open(table, "w", newline="") as fp:
        writer = csv.DictWriter(fp, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    picture = work / "small_files_study.png"
    plot(rows, picture)
    print(f"\n{'variant':<10}{'AU %':>8}{'samples/s':>12}{'opens/s':>12}{'MiB/s':>10}"
          f"{'opens':>8}{'epoch s':>9}")
    for row in rows:
        print(f"{row['variant']:<10}{row['au_percentage']:>8.2f}"
              f"{row['samples_per_second']:>12,.0f}{row['opens_per_second']:>12,.0f}"
              f"{row['mib_per_second']:>10,.1f}{row['file_opens']:>8}"
              f"{row['epoch_seconds']:>9.3f}")
    print(f"\n{table}\n{picture}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
