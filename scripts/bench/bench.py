#!/usr/bin/env python3
"""Side-by-side benchmarks of dlio-mpi against a reference measured in the same run.

  small:  2.5 KB samples from the page cache, computation_time 0, 2 ranks, against a plain C
          pread loop (raw_pread.c, 2 threads) reading exactly the same extents in the same order
          (taken from dlio-mpi's access log). Reported: samples/s and the ratio.
  large:  16 MiB samples with O_DIRECT, 2 ranks, against fio (direct=1, bs=16M, 2 jobs) over
          the same files. Reported: MiB/s and the ratio.
  startup: wall time from launching `mpiexec -n 2 dlio-mpi run` to the first training step.

Usage: scripts/bench/bench.py [--work DIR] [small] [large] [startup]   (run from the repo, with
the .venv on PATH: `source scripts/_env.sh`). Data goes under --work (default ./bench-data,
which must be on a file system with O_DIRECT support for `large`). Not a test: prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return res


def dlio(args: list[str], ranks: int = 2) -> subprocess.CompletedProcess:
    return sh(["mpiexec", "-n", str(ranks), sys.executable, "-m", "dlio_mpi", *args])


def raw_pread_binary(work: Path) -> str:
    exe = work / "raw_pread"
    sh(["cc", "-O2", "-pthread", "-o", str(exe), str(HERE / "raw_pread.c")])
    return str(exe)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def bench_small(work: Path) -> dict:
    """2.5 KB samples: dlio-mpi samples/s vs raw C pread loop over the same extents."""
    data, out = work / "small-data", work / "small-out"
    common = ["demo", f"dataset.data_folder={data}", f"output.folder={out}",
              "dataset.format=indexed_binary", "dataset.num_files_train=128",
              "dataset.num_samples_per_file=4096", "dataset.record_length_bytes=2500",
              "dataset.record_length_bytes_stdev=0", "dataset.record_dims=[2500]",
              "reader.batch_size=256", "reader.read_threads=1", "reader.prefetch_size=4",
              "reader.read_mode=sample", "reader.sample_shuffle=seed",
              "reader.file_shuffle=off", "train.computation_time=0", "train.epochs=6",
              "output.access_log=true"]
    dlio(["generate", *common, "workflow.generate_data=true"])
    dlio(["run", *common, "workflow.generate_data=false"])  # warms the page cache too
    res = summary(out)
    per_epoch = res["metric"]["train_throughput_samples_per_second"]
    ours = statistics.median(per_epoch[1:])  # warm epochs (the first also fills the cache)

    # The same extents, in the same order, for the raw loop: epoch 2's access log.
    import numpy as np

    sys.path.insert(0, str(HERE.parents[1]))
    from dlio_mpi.config import load_config
    from dlio_mpi.dataset import describe_dataset

    cfg = load_config(common[0], common[1:])
    split = describe_dataset(cfg)["train"]
    layouts = split.expected_layouts()
    lines = []
    for rank in range(2):
        ids = np.load(out / "access_log" / f"epoch2_rank{rank}.npy")
        files, idx = ids // split.samples_per_file, ids % split.samples_per_file
        for f, i in zip(files.tolist(), idx.tolist()):
            off = int(layouts.data_offset[f] + i * layouts.sample_step[f])
            lines.append(f"{split.path(f)} {off} {int(layouts.sample_span[f])}")
    listing = work / "small-requests.txt"
    listing.write_text("\n".join(lines) + "\n")
    exe = raw_pread_binary(work)
    raw_rates = []
    for _ in range(5):
        raw = sh([exe, "-t", "2", "-r", "1", str(listing)]).stdout
        raw_rates.append(float(re.search(r"req_per_s=([\d.e+]+)", raw).group(1)))
    raw_rate = statistics.median(raw_rates)
    result = {"dlio_mpi_samples_per_s": ours, "raw_pread_samples_per_s": raw_rate,
              "ratio": ours / raw_rate, "per_epoch": per_epoch, "raw_runs": raw_rates,
              "au_percentage": res["metric"]["train_au_percentage"]}
    print(f"small 2.5 KB: dlio-mpi {ours:,.0f} samples/s, raw pread loop {raw_rate:,.0f} "
          f"samples/s, ratio {ours / raw_rate:.2f}")
    return result


def bench_large(work: Path) -> dict:
    """16 MiB samples with O_DIRECT: dlio-mpi MiB/s vs fio over the same files."""
    data, out = work / "large-data", work / "large-out"
    mib16 = 16 * 2**20
    common = ["demo", f"dataset.data_folder={data}", f"output.folder={out}",
              "dataset.format=npy", "dataset.num_files_train=48",
              "dataset.num_samples_per_file=1", f"dataset.record_dims=[{mib16}]",
              "dataset.record_length_bytes_stdev=0", "reader.batch_size=1",
              "reader.read_threads=1", "reader.prefetch_size=2", "reader.read_mode=sample",
              "reader.odirect=true", "train.computation_time=0", "train.epochs=8"]
    dlio(["generate", *common, "workflow.generate_data=true"])
    dlio(["run", *common, "workflow.generate_data=false"])
    per_epoch = [e["io_MB_per_second"] for e in
                 json.loads((out / "per_epoch_stats.json").read_text()).values()]
    ours = statistics.median(per_epoch[1:])
    fio = shutil.which("fio")
    if fio is None:
        print("fio not found (apt-get install fio): large benchmark has no reference")
        return {"dlio_mpi_MiB_per_s": ours, "per_epoch": per_epoch}
    files = sorted((data / "train").glob("*.npy"))
    half = len(files) // 2
    jobs = []
    for j, part in enumerate((files[:half], files[half:])):
        jobs += [f"--name=job{j}", "--filename=" + ":".join(str(p) for p in part),
                 "--rw=read", "--bs=16M", "--direct=1", "--ioengine=psync",
                 f"--size={len(part) * mib16}", "--iodepth=1"]
    runs = []
    for _ in range(3):
        res_fio = sh([fio, "--output-format=json", "--group_reporting", *jobs])
        report = json.loads(res_fio.stdout[res_fio.stdout.index("{"):])
        runs.append(report["jobs"][0]["read"]["bw_bytes"] / 2**20)
    ref = statistics.median(runs)
    # fio's buffers are 4 KiB pages; ours are transparent huge pages, which makes the page
    # pinning of every O_DIRECT request far cheaper on this VM. A plain C loop with the same
    # buffers (raw_pread -d -H) shows how much of the gap that is.
    listing = work / "large-requests.txt"
    listing.write_text("".join(f"{p} 0 {p.stat().st_size}\n" for p in files))
    exe = raw_pread_binary(work)
    huge = []
    for _ in range(3):
        out_raw = sh([exe, "-d", "-H", "-t", "2", "-r", "1", str(listing)]).stdout
        huge.append(float(re.search(r"MiB_per_s=([\d.e+]+)", out_raw).group(1)))
    raw_huge = statistics.median(huge)
    print(f"large 16 MiB O_DIRECT: dlio-mpi {ours:,.0f} MiB/s, fio {ref:,.0f} MiB/s "
          f"(ratio {ours / ref:.2f}); C pread loop with huge-page buffers {raw_huge:,.0f} MiB/s "
          f"(ratio {ours / raw_huge:.2f})")
    return {"dlio_mpi_MiB_per_s": ours, "fio_MiB_per_s": ref, "ratio": ours / ref,
            "raw_pread_hugepages_MiB_per_s": raw_huge, "ratio_raw_hugepages": ours / raw_huge,
            "per_epoch": per_epoch, "fio_runs": runs, "raw_hugepage_runs": huge}


def bench_startup(work: Path) -> dict:
    """Seconds from launching mpiexec to the first training step (data already there)."""
    data, out = work / "startup-data", work / "startup-out"
    common = ["demo", f"dataset.data_folder={data}", f"output.folder={out}",
              "train.epochs=1", "train.computation_time=0"]
    dlio(["generate", *common, "workflow.generate_data=true"])
    times = []
    for _ in range(3):
        t0 = time.time()
        dlio(["run", *common, "workflow.generate_data=false"])
        stats = json.loads((out / "per_epoch_stats.json").read_text())["1"]
        first = min(r["start"] for r in stats["per_rank"])
        times.append(first - t0)
    print(f"start-up to first step (2 ranks): {min(times):.2f} s (runs: "
          f"{', '.join(f'{t:.2f}' for t in times)})")
    return {"startup_seconds": min(times), "runs": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="bench-data")
    parser.add_argument("which", nargs="*", default=["small", "large", "startup"])
    args = parser.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.which:
        results[name] = {"small": bench_small, "large": bench_large,
                         "startup": bench_startup}[name](work)
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
