#!/usr/bin/env python3
"""Side-by-side benchmarks of dlio-mpi against a reference measured in the same run.

  overhead: the emulator's own cost per step with storage out of the way (4 KiB samples from
            the page cache, batch 4, 2 ranks x 1 read thread) at 3.5 ms and 0.375 ms of
            compute, beside step_probe.c (a C loop of sleep + MPI_Barrier, no I/O, no Python)
            with the same spin, sleeping only, and busy-waiting.
  hosts:    emulated accelerators per host: ranks are added until AU < 90 % for a
            resnet50_h100-like (114,660 B npz samples, batch 400, 0.224 s) and a unet3d_h100-
            like workload (~140 MB npz samples, batch 7, 0.323 s), data in the page cache,
            reads as the loader does them (default) and lean; beside the DLIO benchmark 2.0.0
            (pytorch loader) on the same files.
  small:    2.5 KB samples from the page cache, computation_time 0, against a plain C pread
            loop (raw_pread.c) over exactly the extents dlio-mpi read, in the same order (from
            its access log): batch 256 x 1 read thread, and batch 64 x 2 read threads.
  trace:    what output.trace costs on the `small` case (2.5 KB samples from the page cache,
            batch 256, 1 read thread, computation_time 0): runs with the trace on and off taking
            turns, 3 each; samples/s of the warm epochs (the hot path: requests recorded by
            the C engine) and the whole run's seconds (with writing the trace files at the end),
            ratio on/off; the trace files' size per request; and the C engine alone, with and
            without the trace's arrays (15 turns each). DLIO_MPI_BENCH_TRACE_FILES sets
            fewer files (default 128 of 4096 samples) for a quick try.
  stagein:  storage.stage_in (2 ranks, O_DIRECT on both sides, 64 MiB calls) of 256 files of
            8 MiB (2 GiB) from one folder to another of the same disk, beside raw_copy.c (a C
            pread/pwrite loop with O_DIRECT, 2 threads, 64 MiB calls, syncfs) between the
            same folders; 3 rounds alternating, medians, ratio ours / reference.
  tiers:    reader.cache with a slow "PFS" (scripts/slow_pfs.sh: a loop-device ext4 whose reads
            a block-I/O cgroup throttles to 150 MiB/s and 1500 IOPS; needs root), O_DIRECT
            reads, 2 ranks, 512 npy files of 1 MiB, batch 8, 30 ms compute, 4 epochs: the
            data on the slow tier read through a cache on the local disk, beside the same
            data on the local disk from the start (the reference) and on the slow tier without
            a cache; AU per epoch, the cached epochs' AU over the reference's (target >= 0.9),
            the first epoch's penalty.
  large:    16 MiB samples with O_DIRECT against fio and a C loop with huge-page buffers.
  mpiio:    the MPI-IO reader backends against the POSIX engine on one shared file (indexed
            binary), 2 ranks, computation_time 0, data in the page cache (ROMIO's UFS driver
            ignores O_DIRECT), the same seed: reader.file_access multi (the C engine), shared
            (MPI-IO independent), collective (MPI-IO collective), and collective with ROMIO's
            collective buffering and data sieving disabled (hints); 3 runs each, the modes
            alternating. 16 MiB samples: MiB/s (and the C engine with O_DIRECT, for reference);
            2.5 KB samples, batch 256: samples/s and us per sample. Ratios over the C engine;
            per-request latency p50; CPU time per sample (user, sys: all processes, less a
            2-step run's start-up) and, where perf can sample, split by shared object (kernel,
            Python, libc, MPICH/ROMIO, mpi4py, C core) with the top symbols.
  checkpoint: checkpoints written and restored by `dlio-mpi run` (mpiexec -n 2, the
            checkpoint-only workflow: one save and one load per run), 2 ranks x 2 GiB
            (model_size_bytes with ZeRO 1: one file per rank), fsync, 64 MiB calls:
            file_per_rank's O_DIRECT save beside fio's O_DIRECT sequential write (2 jobs, the
            same bytes per job, end_fsync) and its O_DIRECT load beside fio's O_DIRECT read of
            the files fio wrote; shared (collective MPI-IO, one file; ROMIO's defaults, and
            with romio_cb_write disabled for reference) beside file_per_rank, with O_DIRECT
            and through the page cache (like for like: ROMIO's UFS driver has no O_DIRECT);
            shared with O_DIRECT (each rank's own calls into the one file). dlio-mpi's
            figures come from each run's summary.json; median of 3 rounds, dlio-mpi and fio
            taking turns; ratios against issue 8's targets. DLIO_MPI_BENCH_CHECKPOINT_BYTES
            sets other bytes per rank (a multiple of 64 MiB) for a quick try.
  burst:    burst-buffer checkpoints (issue 23), 2 ranks, one file per rank (ZeRO 1), O_DIRECT,
            fsync, the demo workload (8 steps an epoch): checkpoint.async_write's stall against
            the synchronous pause on the same checkpoints (512 MiB a rank, 4 saves 1.6 s and
            40 ms of steps apart; the modes taking turns, 3 rounds, medians per checkpoint),
            the snapshot's GiB/s per rank beside memcpy_ref.c (one memcpy of as many bytes, as
            many threads as ranks) in the same rounds; checkpoint.drain's bandwidth (one save
            of 1 GiB a rank drained alone, O_DIRECT, 64 MiB calls; the copies checked with cmp)
            beside raw_copy.c between the same folders (target >= 0.9); as root, a slow tier
            (scripts/slow_pfs.sh, writes throttled to 300 MiB/s) behind the local disk: AU,
            pause per checkpoint and time to durable without a drain, drained (sync and
            async saves) and written straight to it; skipped where slow_pfs.sh cannot run.
  formats:  the native engine on each implemented format (indexed_binary, mmap_indexed_binary,
            tfrecord, hdf5, npy), the same 128 KiB samples read by extent, 2 ranks, page cache
            warm, no compute: samples/s beside indexed_binary's (issue 9's target: tfrecord and
            contiguous hdf5 >= 0.8x).
  parquet:  MLPerf Storage's dlrm parquet workload (mlperf/dlrm_mi355: 200 typed columns, 40 of
            them read, 160 of 761 bytes a row; batch 18,432), scaled to 32 files x 12,288 rows
            (338 MiB) in the page cache, 2 ranks x 1 read thread: the emulator's overhead per
            step at dlrm's 0.375 ms step (issue 22's target: < 20 us), at the workload's batch
            and at batch 1,024 (1 and 2 ranks), beside `overhead`'s case (no I/O to speak of)
            in the same rounds; the read cost per step with no compute beside pyarrow's
            read_row_group(g, columns=...) loop (one process a rank) and raw_pread.c over the
            same row groups' column-chunk extents (epoch 2's access log). 3 rounds, medians.
  loaders:  110 KB npz samples (1 per file, 2048 files), batch 32, 2 ranks, no compute, page
            cache warm, for DLIO's pytorch and tensorflow loaders: the native engine (that
            loader's access pattern), the framework engine (a real torch DataLoader with 2
            workers per rank; tf.data with 2 generators) and the DLIO benchmark 2.0.0 (that
            loader, 2 read threads) on the same files: samples/s, and what fidelity mode
            costs (native / framework).
  startup:  seconds from launching mpiexec to the first training step: 2 ranks; 64 ranks
            (oversubscribed: it must start, finish and say how long it took); 10^6 real files.
  fidelity: dlio-mpi calibrated from the real loader against the reference job (a real torch
            DataLoader training loop, the step a sleep: scripts/fidelity/), jpeg and npz, 1, 2
            and 4 workers on 1 and 2 ranks, epoch 1 cold and 2 warm; calibrated at 2 workers
            predicting 1 and 4; the slow tier when it is up; calibration's own time.

Usage (from the repository, with the .venv on PATH: `source scripts/_env.sh`):
  python scripts/bench/bench.py --work DIR [overhead] [hosts] [small] [trace] [large] [mpiio]
                                     [checkpoint] [burst] [formats] [parquet] [loaders]
                                     [startup] [fidelity]
DIR (default ./bench-data) must be on a file system with O_DIRECT support for `large` and
`checkpoint`. The figures are printed and saved to DIR/results.json (each benchmark's under its
name, the others' kept). Each benchmark's files are under DIR, named after it (mpiio:
DIR/mpiio-*). A benchmark removes the datasets it generated once it has done with them (only
the files dlio-mpi's generation wrote, as dataset.keep_files: false does) and its other large
files (checkpoints, copies); the runs' output folders stay. Kept for reruns: startup's 10^6
files (about 4 GB on disk, minutes to generate). Not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESNET_RECORD = 114660


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return res


def dlio(args: list[str], ranks: int = 2, prefix: tuple[str, ...] = (),
         **kw) -> subprocess.CompletedProcess:
    """mpiexec -n ranks dlio-mpi args, under `prefix` (a profiler) if given."""
    # The installed console script: `python -m dlio_mpi` from the repository would import the
    # source folder, which has no compiled core.
    command = str(Path(sys.executable).parent / "dlio-mpi")
    return sh([*prefix, "mpiexec", "-n", str(ranks), command, *args], **kw)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def build(work: Path, source: str, compiler: str = "cc", flags: tuple = ()) -> str:
    exe = work / Path(source).stem
    sh([compiler, "-O2", "-o", str(exe), str(HERE / source), *flags])
    return str(exe)


def fio_MiB_per_s(fio: str, jobs: list[str], direction: str) -> float:  # noqa: N802
    """Run fio with `jobs` (its job options), group-reported; the MiB/s of `direction`
    ("read" or "write") over all jobs."""
    text = sh([fio, "--output-format=json", "--group_reporting", *jobs]).stdout
    return json.loads(text[text.index("{"):])["jobs"][0][direction]["bw_bytes"] / 2**20


def overrides(**kw) -> list[str]:
    return [f"{k.replace('__', '.')}={v}" for k, v in kw.items()]


class _OneRank:
    """A communicator of this one process, for dlio-mpi's helpers run here without MPI."""

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's names)
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def bcast(self, value, root: int = 0):
        return value

    def allreduce(self, value, op=None):
        return value


def remove_dataset(args: list[str]) -> None:
    """Remove the dataset that `dlio-mpi generate ARGS` generated (ARGS: a workload and its
    overrides), as `dataset.keep_files: false` does: only the files dlio-mpi's generation wrote
    that are still as generated, their side files and manifest, and the folders left empty;
    anything else there stays. A folder not generated with this configuration is left alone."""
    from types import SimpleNamespace

    from dlio_mpi.config import load_config
    from dlio_mpi.data.dataset import describe_dataset
    from dlio_mpi.data.manifest import differing_params, generation_params, read_manifest
    from dlio_mpi.run import remove_dataset as remove

    cfg = load_config(args[0], args[1:])
    splits = describe_dataset(cfg)
    root = splits["train"].root
    manifest = read_manifest(root) if os.path.isdir(root) else None
    if manifest is None or differing_params(manifest, generation_params(cfg)):
        print(f"{root}: not removed (not a dataset dlio-mpi generated with these settings)",
              flush=True)
        return
    plan = SimpleNamespace(splits=splits, layouts={name: split.expected_layouts()
                                                   for name, split in splits.items()})
    kept = remove(_OneRank(), plan)
    print(f"removed the generated dataset {root}"
          + (f" (kept {kept} file(s) changed since)" if kept else ""), flush=True)


# ------------------------------------------------------------------------------- overhead


def _overhead_args(work: Path, name: str) -> list[str]:
    """`overhead`'s case (4 KiB samples, batch 4, 1 read thread: storage out of the way) in
    DIR/NAME-data, its output in DIR/NAME-out; no computation_time (each run gives its own)."""
    return ["demo", *overrides(
        dataset__data_folder=work / f"{name}-data", output__folder=work / f"{name}-out",
        dataset__format="indexed_binary", dataset__num_files_train=8,
        dataset__num_samples_per_file=2000, dataset__record_dims="[4096]",
        dataset__record_length_bytes_stdev=0, reader__batch_size=4, reader__read_threads=1,
        reader__file_shuffle="off", reader__sample_shuffle="seed", train__epochs=3)]


def bench_overhead(work: Path) -> dict:
    """AU and the emulator's overhead per step with storage out of the way, beside the C probe."""
    common = _overhead_args(work, "overhead")
    out = work / "overhead-out"
    dlio(["generate", *common])
    probe = build(work, "step_probe.c", "mpicc")
    results = {}
    for compute_s in (0.0035, 0.000375):
        dlio(["run", *common, f"train.computation_time={compute_s}"])
        s = summary(out)
        m = s["metric"]
        ours = {"au_percentage": m["train_au_percentage"],
                "au_mean": m["train_au_mean_percentage"],
                "au_without_barrier_mean": m["train_au_without_barrier_mean_percentage"],
                "overhead_us_per_step": {k: v["median"] for k, v in
                                         m["train_emulator_overhead_us_per_step"].items()},
                "pacing": s["dlio_mpi"]["pacing"]}
        spin = int(s["dlio_mpi"]["pacing"]["compute_spin_us_now"]["median"] * 1e3)
        compute_ns = int(compute_s * 1e9)
        steps = str(int(1.5 / compute_s))  # 1.5 s of steps
        probes = {}
        for label, spin_ns in (("sleep_only", 0), ("same_spin", spin), ("busy_wait", 10**10)):
            runs = []
            for _ in range(3):
                line = sh(["mpiexec", "-n", "2", probe, str(compute_ns), steps,
                           str(spin_ns)]).stdout
                runs.append(float(re.search(r"au_percentage=([\d.]+)", line).group(1)))
            probes[label] = {"au_median": statistics.median(runs), "runs": runs}
        results[f"{compute_s * 1e3:g}ms"] = {"dlio_mpi": ours, "probe": probes}
        print(f"{compute_s * 1e3:g} ms steps: dlio-mpi AU {ours['au_mean']:.2f} % "
              f"(without barrier {ours['au_without_barrier_mean']:.2f} %), overhead "
              f"{ours['overhead_us_per_step']['total']:.1f} us/step "
              f"(spin now {spin / 1e3:.0f} us); C probe: sleep only "
              f"{probes['sleep_only']['au_median']:.2f} %, same spin "
              f"{probes['same_spin']['au_median']:.2f} %, busy "
              f"{probes['busy_wait']['au_median']:.2f} %", flush=True)
    remove_dataset(common)
    return results


# ------------------------------------------------------------------------------- hosts


HOST_WORKLOADS = {
    # name: (record length, stdev, batch, compute, read_threads, prefetch, max ranks, steps)
    "resnet50_h100": (RESNET_RECORD, 0, 400, 0.224, 1, 4, 32, 4),
    "unet3d_h100": (146600628, 68341808, 7, 0.323, 4, 2, 4, 3),
}
DLIO_READ_THREADS = 4  # DLIO's best setting on this kind of machine


def warm(folder: Path) -> None:
    """Read every file once, so that the runs find the data in the page cache."""
    from concurrent.futures import ThreadPoolExecutor

    def read(path: Path) -> None:
        with open(path, "rb") as fp:
            while fp.read(1 << 22):
                pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(read, (p for p in folder.rglob("*") if p.is_file())))


def _host_runs(name: str, work: Path, access: str, data: Path, files: int) -> dict:
    record, stdev, batch, compute, threads, prefetch, max_ranks, steps = HOST_WORKLOADS[name]
    found, ranks = {}, 1
    while ranks <= max_ranks:
        out = work / f"hosts-{name}-{access}-{ranks}"
        dlio(["run", "demo", *overrides(
            dataset__data_folder=data, output__folder=out, dataset__format="npz",
            dataset__num_files_train=files, dataset__record_length_bytes=record,
            dataset__record_length_bytes_stdev=stdev, reader__batch_size=batch,
            reader__read_threads=threads, reader__prefetch_size=prefetch, reader__access=access,
            train__computation_time=compute, train__total_training_steps=steps,
            train__epochs=3, workflow__generate_data="false")], ranks=ranks, timeout=1800)
        au = summary(out)["metric"]["train_au_percentage"]
        warm = statistics.mean(au[1:])  # the first epoch also fills the page cache
        found[ranks] = {"au_warm": warm, "au_per_epoch": au}
        print(f"{name} {access}: {ranks} ranks: AU {warm:.1f} % (epochs "
              f"{', '.join(f'{x:.1f}' for x in au)})", flush=True)
        if warm < 90:
            break
        ranks = ranks * 2 if ranks < 8 else ranks + 4
    passing = [r for r, v in found.items() if v["au_warm"] >= 90]
    return {"accelerators_at_90": max(passing, default=0), "runs": found}


def _dlio_runs(name: str, work: Path, data: Path, max_ranks: int) -> dict:
    sys.path.insert(0, str(HERE))
    from dlio_reference import ensure_dlio_venv, run_dlio

    record, stdev, batch, compute, _, _, _, steps = HOST_WORKLOADS[name]
    venv = ensure_dlio_venv(REPO)
    found, ranks = {}, 1
    while ranks <= max_ranks:
        # DLIO takes the first num_files_train files of the folder (sorted): exactly `steps`
        # steps per rank, without total_training_steps (which its 2.0.0 epochs handle badly)
        wl = {"model": f"{name}_ref", "framework": "pytorch",
              "workflow": {"generate_data": False, "train": True},
              "dataset": {"data_folder": str(data), "format": "npz",
                          "num_files_train": ranks * batch * steps, "num_samples_per_file": 1,
                          "record_length": record, "record_length_stdev": stdev},
              "reader": {"data_loader": "pytorch", "read_threads": DLIO_READ_THREADS,
                         "batch_size": batch},
              "train": {"epochs": 3, "computation_time": compute}}
        try:
            s = run_dlio(venv, wl, ranks, work / f"hosts-{name}-dlio-{ranks}", timeout=1800)
            au = s["metric"]["train_au_percentage"]
            warm = statistics.mean(au[1:])
        except RuntimeError as exc:
            found[ranks] = {"error": str(exc).splitlines()[-1]}
            break
        found[ranks] = {"au_warm": warm, "au_per_epoch": au}
        print(f"{name} DLIO 2.0.0: {ranks} ranks: AU {warm:.1f} %", flush=True)
        if warm < 90:
            break
        ranks *= 2
    passing = [r for r, v in found.items() if v.get("au_warm", 0) >= 90]
    return {"accelerators_at_90": max(passing, default=0), "runs": found}


def bench_hosts(work: Path, with_dlio: bool = True) -> dict:
    results = {}
    for name, (record, stdev, batch, _, _, _, max_ranks, steps) in HOST_WORKLOADS.items():
        files = max_ranks * batch * steps
        data = work / f"hosts-{name}-data"
        generated = ["demo", *overrides(
            dataset__data_folder=data, dataset__format="npz", dataset__num_files_train=files,
            dataset__record_length_bytes=record, dataset__record_length_bytes_stdev=stdev)]
        dlio(["generate", *generated], timeout=3600)
        warm(data)
        results[name] = {access: _host_runs(name, work, access, data, files)
                         for access in ("loader", "lean")}
        if with_dlio:
            warm(data)
            results[name]["dlio_2.0.0"] = _dlio_runs(name, work, data, max_ranks)
        print(f"{name}: emulated accelerators at AU >= 90 %: " + ", ".join(
            f"{k} {v['accelerators_at_90']}" for k, v in results[name].items()), flush=True)
        remove_dataset(generated)  # 5.9 GB, 12.8 GB: one workload's data at a time
    return results


# ------------------------------------------------------------------------------- small


def _small_args(work: Path, batch: int, threads: int) -> tuple[list[str], Path]:
    """The small case's workload and overrides (1.3 GB of data), and its output folder."""
    out = work / f"small-out-{batch}-{threads}"
    return ["demo", *overrides(
        dataset__data_folder=work / "small-data", output__folder=out,
        dataset__format="indexed_binary", dataset__num_files_train=128,
        dataset__num_samples_per_file=4096, dataset__record_length_bytes=2500,
        dataset__record_length_bytes_stdev=0, dataset__record_dims="[2500]",
        reader__batch_size=batch, reader__read_threads=threads, reader__prefetch_size=4,
        reader__read_mode="sample", reader__sample_shuffle="seed", reader__file_shuffle="off",
        train__computation_time=0, train__epochs=6, output__access_log="true")], out


def _small_once(work: Path, batch: int, threads: int) -> dict:
    """2.5 KB samples: dlio-mpi samples/s vs the raw C pread loop over the same extents."""
    import numpy as np

    from dlio_mpi.config import load_config
    from dlio_mpi.data.dataset import describe_dataset

    common, out = _small_args(work, batch, threads)
    dlio(["generate", *common, "workflow.generate_data=true"])
    dlio(["run", *common, "workflow.generate_data=false"])  # warms the page cache too
    per_epoch = summary(out)["metric"]["train_throughput_samples_per_second"]
    ours = statistics.median(per_epoch[1:])  # warm epochs (the first also fills the cache)
    cfg = load_config(common[0], common[1:])
    split = describe_dataset(cfg)["train"]
    lines = []
    for rank in range(2):  # the same extents in the same order: epoch 2's access log
        ids = np.load(out / "access_log" / f"epoch2_rank{rank}.npy")
        files, index = ids // split.samples_per_file, ids % split.samples_per_file
        lay = split.expected_layouts().take(files)
        offset = lay.data_offset + index * lay.sample_step
        lines += [f"{split.path(f)} {o} {s}" for f, o, s in
                  zip(files.tolist(), offset.tolist(), lay.sample_span.tolist())]
    listing = work / "small-requests.txt"
    listing.write_text("\n".join(lines) + "\n")
    exe = build(work, "raw_pread.c", flags=("-pthread",))
    raw = []
    for _ in range(5):
        text = sh([exe, "-t", str(2 * threads), "-r", "1", str(listing)]).stdout
        raw.append(float(re.search(r"req_per_s=([\d.e+]+)", text).group(1)))
    ref = statistics.median(raw)
    listing.unlink()  # 40 MB
    print(f"small 2.5 KB, batch {batch}, {threads} read thread(s) per rank: dlio-mpi "
          f"{ours:,.0f} samples/s, raw pread loop ({2 * threads} threads) {ref:,.0f}/s, "
          f"ratio {ours / ref:.2f}", flush=True)
    return {"dlio_mpi_samples_per_s": ours, "raw_pread_samples_per_s": ref,
            "ratio": ours / ref, "per_epoch": per_epoch, "raw_runs": raw}


def bench_small(work: Path) -> dict:
    result = {"batch256_1thread": _small_once(work, 256, 1),
              "batch64_2threads": _small_once(work, 64, 2)}
    remove_dataset(_small_args(work, 256, 1)[0])  # 1.3 GB (trace generates it again)
    return result


def _trace_run(work: Path, common: list[str], trace: bool, run: int) -> dict:
    out = work / f"trace-out-{'on' if trace else 'off'}-{run}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    dlio(["run", *common, f"output.folder={out}", f"output.trace={str(trace).lower()}"])
    seconds = time.perf_counter() - t0
    result = summary(out)
    per_epoch = result["metric"]["train_throughput_samples_per_second"]
    traced = sorted(out.glob("trace_rank*.json.gz"))
    size = sum(p.stat().st_size for p in traced)
    shutil.rmtree(out, ignore_errors=True)
    own = result["dlio_mpi"].get("trace") or {}
    return {"samples_per_s": statistics.median(per_epoch[1:]), "seconds": seconds,
            "trace_bytes": size, "requests": result["metric"]["train_requests"],
            "trace_seconds": own.get("seconds_max", 0.0)}


def bench_trace(work: Path, repeats: int = 7) -> dict:
    """output.trace on against off on the small case."""
    files = int(os.environ.get("DLIO_MPI_BENCH_TRACE_FILES", "128"))
    data = work / ("small-data" if files == 128 else f"trace-data-{files}")
    common = ["demo", *overrides(
        dataset__data_folder=data, dataset__format="indexed_binary",
        dataset__num_files_train=files, dataset__num_samples_per_file=4096,
        dataset__record_length_bytes=2500, dataset__record_length_bytes_stdev=0,
        dataset__record_dims="[2500]", reader__batch_size=256, reader__read_threads=1,
        reader__prefetch_size=4, reader__read_mode="sample", reader__sample_shuffle="seed",
        reader__file_shuffle="off", train__computation_time=0, train__epochs=6)]
    dlio(["generate", *common, "workflow.generate_data=true",
          f"output.folder={work / 'trace-out-gen'}"])
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for run in range(repeats + 1):  # the first pair warms the host up and is left out
        for trace in (False, True):
            result = _trace_run(work, common, trace, run)
            if run:
                runs["on" if trace else "off"].append(result)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    best = (max(r["samples_per_s"] for r in runs["on"])
            / max(r["samples_per_s"] for r in runs["off"]))

    engine = _trace_engine_only(sorted(str(p) for p in (data / "train").glob("*.indexed_binary")))
    remove_dataset(common)  # 1.3 GB by default (small's data)
    rate = med("on", "samples_per_s") / med("off", "samples_per_s")
    wall = med("on", "seconds") / med("off", "seconds")
    per_request = med("on", "trace_bytes") / max(med("on", "requests"), 1)
    # the trace's own time (formatting and compressing after each epoch, writing at the end)
    # per request of the slowest rank: ranks hold requests / ranks each
    own_us = med("on", "trace_seconds") / max(med("on", "requests") / 2, 1) * 1e6
    print(f"trace: samples/s on/off {rate:.3f} median, {best:.3f} best "
          f"({med('on', 'samples_per_s'):,.0f} vs "
          f"{med('off', 'samples_per_s'):,.0f}), whole run on/off {wall:.3f} "
          f"({med('on', 'seconds'):.2f} s vs {med('off', 'seconds'):.2f} s), "
          f"trace's own time {own_us:.3f} us per request of a rank, "
          f"{per_request:.1f} trace bytes (gzip) per request", flush=True)
    return {"samples_per_s_ratio": rate, "samples_per_s_best_ratio": best,
            "run_seconds_ratio": wall,
            "trace_bytes_per_request": per_request, "trace_us_per_request": own_us,
            "engine_only": engine, "runs": runs}


def _trace_engine_only(paths: list[str], n: int = 131072, repeats: int = 15) -> dict:
    """The C engine alone (1 thread, prefetch 4, no MPI, no step loop) reading the same
    n random 2.5 KB samples of the page cache with and without the trace's arrays, taking
    turns: the hot path's cost, with less of the noise of whole runs on a busy host."""
    import numpy as np

    from dlio_mpi import _core
    from dlio_mpi.metrics.epoch_trace import RequestTrace
    from dlio_mpi.sampling.requests import EpochRequests

    rng = np.random.default_rng(1)
    files = rng.integers(0, len(paths), n).astype(np.int64)
    offset = (rng.integers(0, 4096, n) * 2500).astype(np.int64)
    length = np.full(n, 2500, dtype=np.int64)
    starts = np.arange(0, n + 1, 256, dtype=np.int64)
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    with _core.Engine(1, 4, fd_cache=len(paths)) as engine:
        engine.set_files(paths)
        for _ in range(repeats):
            for mode in ("off", "on"):
                rt = RequestTrace.empty(n) if mode == "on" else None
                lat = np.zeros(n, dtype=np.int64)
                requests = EpochRequests(starts, files, offset, length)
                engine.reserve(requests)
                t0 = time.perf_counter()
                engine.start_epoch(requests, lat_ns=lat, nread=rt and rt.nread,
                                   start_ns=rt and rt.start_ns, thread=rt and rt.thread)
                while engine.next() is not None:
                    pass
                seconds[mode].append(time.perf_counter() - t0)
    result = {"min_ratio": min(seconds["on"]) / min(seconds["off"]),
              "median_ratio": statistics.median(seconds["on"]) / statistics.median(seconds["off"]),
              "us_per_request_off": min(seconds["off"]) / n * 1e6, "seconds": seconds}
    print(f"trace, C engine alone: on/off {result['median_ratio']:.3f} (median), "
          f"{result['min_ratio']:.3f} (best), {result['us_per_request_off']:.2f} us/request "
          "off", flush=True)
    return result


# ------------------------------------------------------------------------------- stagein


def bench_stagein(work: Path, rounds: int = 3) -> dict:
    """storage.stage_in against a C copy loop between the same folders."""
    data, bb, ref = work / "stagein-data", work / "stagein-bb", work / "stagein-ref"
    common = ["demo", *overrides(
        dataset__data_folder=data, dataset__format="npy", dataset__num_files_train=256,
        dataset__num_samples_per_file=1, dataset__record_dims=f"[{8 << 20}]",
        dataset__record_length_bytes_stdev=0, reader__batch_size=16,
        train__computation_time=0, train__epochs=1, storage__stage_in__to=bb,
        storage__stage_in__odirect="true", storage__stage_in__clean="true")]
    dlio(["generate", *common, "workflow.generate_data=true",
          f"output.folder={work / 'stagein-gen'}"])
    exe = build(work, "raw_copy.c", flags=("-pthread",))
    files = sorted((data / "train").glob("*.npy"))
    listing = work / "stagein-list.txt"
    listing.write_text("".join(f"{p}\t{p.name}\n" for p in files))
    ours, theirs = [], []
    for r in range(rounds):
        out = work / f"stagein-out-{r}"
        shutil.rmtree(out, ignore_errors=True)
        dlio(["run", *common, f"output.folder={out}"])
        staged = summary(out)["dlio_mpi"]["stage_in"]
        ours.append(staged["bytes_written"] / 2**20 / staged["seconds"])
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ref, ignore_errors=True)
        ref.mkdir()
        line = sh([exe, "-j", "2", "-d", "-b", str(64 << 20), str(listing), str(ref)]).stdout
        theirs.append(float(re.search(r"MiB_per_s=([\d.]+)", line)[1]))
        shutil.rmtree(ref, ignore_errors=True)
    remove_dataset(common)  # 2 GiB
    result = {"dlio_mpi_MiB_per_s": statistics.median(ours),
              "raw_copy_MiB_per_s": statistics.median(theirs),
              "ratio": statistics.median(ours) / statistics.median(theirs),
              "runs": {"dlio_mpi": ours, "raw_copy": theirs}}
    print(f"stagein: {result['dlio_mpi_MiB_per_s']:.0f} MiB/s vs raw_copy "
          f"{result['raw_copy_MiB_per_s']:.0f} MiB/s, ratio {result['ratio']:.3f}", flush=True)
    return result


# ------------------------------------------------------------------------------- tiers


def bench_tiers(work: Path) -> dict:
    """reader.cache over a throttled slow tier against the data on the fast tier."""
    if os.geteuid() != 0:
        print("tiers: skipped (scripts/slow_pfs.sh needs root)", flush=True)
        return {"skipped": "needs root"}
    slow_pfs = str(HERE.parent / "slow_pfs.sh")
    mount, image = work / "slow-pfs", work / "slow-pfs.img"
    sh([slow_pfs, "up", "--mount", str(mount), "--size", "2G", "--read-mibps", "150",
        "--read-iops", "1500", "--image", str(image)])
    try:
        return _tiers(work, mount, (slow_pfs, "run", "--"))
    finally:
        sh([slow_pfs, "down"])


def _tiers(work: Path, mount: Path, throttled: tuple[str, ...]) -> dict:
    fast, cache = work / "tiers-fast-data", work / "tiers-cache"

    def common(data: Path) -> list[str]:
        return ["demo", *overrides(
            dataset__data_folder=data, dataset__format="npy", dataset__num_files_train=512,
            dataset__num_samples_per_file=1, dataset__record_dims=f"[{1 << 20}]",
            dataset__record_length_bytes_stdev=0, reader__batch_size=8,
            reader__read_threads=2, reader__odirect="true", train__computation_time=0.03,
            train__epochs=4)]

    results: dict = {}
    for name, data, extra in (("fast", fast, []), ("cached", mount / "data",
                                                   [f"reader.cache.folder={cache}"]),
                              ("slow", mount / "data", []),
                              ("read_once", mount / "data", ["reader.staging=read_once"])):
        dlio(["generate", *common(data), "workflow.generate_data=true",
              f"output.folder={work / 'tiers-gen'}"])
        out = work / f"tiers-out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        dlio(["run", *common(data), f"output.folder={out}", *extra], prefix=throttled)
        stats = json.loads((out / "per_epoch_stats.json").read_text())
        results[name] = {"au": [stats[k]["au_percentage"] for k in sorted(stats, key=int)],
                         "cache": [stats[k].get("cache") for k in sorted(stats, key=int)]}
        if name == "read_once":
            reader = summary(out)["dlio_mpi"]["readers"]["train"]
            dataset = sum(p.stat().st_size for p in (data / "train").iterdir())
            results[name].update(staging=reader["staging"], exchange=reader["exchange"],
                                 pfs_bytes_over_dataset=reader["staging"]["bytes_read"]
                                 / dataset)
    remove_dataset(common(fast))  # 512 MiB; the slow tier's goes with its image
    fast_au, cached_au = results["fast"]["au"], results["cached"]["au"]
    later = statistics.mean(cached_au[1:]) / statistics.mean(fast_au[1:])
    results.update(cached_over_fast_later_epochs=later,
                   first_epoch_penalty_points=fast_au[0] - cached_au[0])
    once = results["read_once"]
    print(f"tiers: AU per epoch: fast {[round(a, 1) for a in fast_au]}, cached "
          f"{[round(a, 1) for a in cached_au]}, slow "
          f"{[round(a, 1) for a in results['slow']['au']]}, read_once "
          f"{[round(a, 1) for a in once['au']]}; cached epochs 2+ / fast "
          f"{later:.3f}; first epoch penalty {fast_au[0] - cached_au[0]:.1f} AU points; "
          f"read_once: PFS bytes / dataset {once['pfs_bytes_over_dataset']:.4f}, staging "
          f"{once['staging']['seconds']:.2f} s, exchange "
          f"{once['exchange']['seconds_per_step'] * 1e3:.2f} ms per step", flush=True)
    return results


# ------------------------------------------------------------------------------- large


def bench_large(work: Path) -> dict:
    """16 MiB samples with O_DIRECT: dlio-mpi MiB/s vs fio and a C loop over the same files."""
    data, out = work / "large-data", work / "large-out"
    mib16 = 16 * 2**20
    common = ["demo", *overrides(
        dataset__data_folder=data, output__folder=out, dataset__format="npy",
        dataset__num_files_train=48, dataset__num_samples_per_file=1,
        dataset__record_dims=f"[{mib16}]", dataset__record_length_bytes_stdev=0,
        reader__batch_size=1, reader__read_threads=1, reader__prefetch_size=2,
        reader__read_mode="sample", reader__odirect="true", train__computation_time=0,
        train__epochs=8)]
    dlio(["generate", *common, "workflow.generate_data=true"])
    dlio(["run", *common, "workflow.generate_data=false"])
    per_epoch = [e["transfer_MiB_per_second"] for e in
                 json.loads((out / "per_epoch_stats.json").read_text()).values()]
    ours = statistics.median(per_epoch[1:])
    files = sorted((data / "train").glob("*.npy"))
    result = {"dlio_mpi_MiB_per_s": ours, "per_epoch": per_epoch}
    fio = shutil.which("fio")
    if fio is not None:
        half = len(files) // 2
        jobs = []
        for j, part in enumerate((files[:half], files[half:])):
            jobs += [f"--name=job{j}", "--filename=" + ":".join(str(p) for p in part),
                     "--rw=read", "--bs=16M", "--direct=1", "--ioengine=psync",
                     f"--size={len(part) * mib16}", "--iodepth=1"]
        runs = []
        for _ in range(3):
            runs.append(fio_MiB_per_s(fio, jobs, "read"))
        result.update(fio_MiB_per_s=statistics.median(runs), fio_runs=runs,
                      ratio_fio=ours / statistics.median(runs))
    else:
        print("fio not found (apt-get install fio): no fio reference", flush=True)
    # fio's buffers are 4 KiB pages; ours are transparent huge pages, which makes the page
    # pinning of every O_DIRECT request far cheaper: a C loop with the same buffers.
    listing = work / "large-requests.txt"
    listing.write_text("".join(f"{p} 0 {p.stat().st_size}\n" for p in files))
    exe = build(work, "raw_pread.c", flags=("-pthread",))
    huge = [float(re.search(r"MiB_per_s=([\d.e+]+)", sh(
        [exe, "-d", "-H", "-t", "2", "-r", "1", str(listing)]).stdout).group(1))
        for _ in range(3)]
    result.update(raw_pread_hugepages_MiB_per_s=statistics.median(huge),
                  ratio_raw_hugepages=ours / statistics.median(huge), raw_hugepage_runs=huge)
    remove_dataset(common)  # 768 MiB
    print(f"large 16 MiB O_DIRECT: dlio-mpi {ours:,.0f} MiB/s; C pread loop with huge-page "
          f"buffers {statistics.median(huge):,.0f} MiB/s (ratio "
          f"{result['ratio_raw_hugepages']:.2f})"
          + (f"; fio {result['fio_MiB_per_s']:,.0f} MiB/s" if "fio_MiB_per_s" in result
             else ""), flush=True)
    return result


# ------------------------------------------------------------------------------- mpiio


MPIIO_MODES = {
    # name: (reader.file_access, further settings, what it is); the first is the reference
    "multi": ("multi", {}, "POSIX engine"),
    "shared": ("shared", {}, "MPI-IO independent"),
    "collective": ("collective", {}, "MPI-IO collective"),
    # ROMIO's defaults make a collective read two-phase I/O through one aggregator per node,
    # which reads the whole span of the step's requests, holes included (data sieving): the
    # same reads without both, to tell the backend's cost from those defaults'
    "collective_no_cb_ds": ("collective", {
        "reader__mpiio_hints": "{romio_cb_read: disable, romio_ds_read: disable}"},
        "coll., cb/ds disabled"),
}
MPIIO_RANKS = 2
MPIIO_SHAPES = {
    # name: (sample bytes, samples in the one shared file, batch, prefetch, epochs per mode,
    #        the figure compared); every epoch but the first is measured, and epoch e reads the
    #        same samples in the same order in every mode. The slow modes read fewer epochs,
    #        so that the benchmark takes minutes.
    "large": (16 * 2**20, 128, 1, 2, dict.fromkeys(MPIIO_MODES, 10), "MiB_per_s"),  # 2 GiB
    "small": (2500, 131072, 256, 4, {"multi": 8, "shared": 4, "collective": 2,
                                     "collective_no_cb_ds": 8}, "samples_per_s"),  # 312.5 MiB
}
# A run of two steps (AU excludes the first): start-up, imports, opens and results, the fixed
# costs taken out of a run's CPU time to leave the reads'
FIXED_COSTS = {"train__epochs": 1, "train__total_training_steps": 2}
PERF_GROUPS = (  # perf's shared object (by prefix) -> where the CPU time goes; first match wins
    ("kernel", ("[kernel",)),
    ("mpi4py", ("MPI.",)),
    ("dlio-mpi C core", ("_core.",)),
    ("MPICH + ROMIO", ("libmpi", "libuc", "hydra", "mpiexec")),
    ("libc (malloc, locks, memmove)", ("libc.", "libpthread", "ld-linux", "[vdso]")),
    ("Python + numpy", ("libpython", "python", "libscipy_openblas")),  # and *.cpython-*
)


def _children_cpu() -> tuple[float, float]:
    """User and system seconds of the children waited for so far (mpiexec and, through it,
    the ranks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def _mpiio_args(work: Path, shape: str, mode: str, label: str = "",
                **extra: object) -> tuple[list[str], Path]:
    """`run` arguments reading the one file of `shape` as MPIIO_MODES[mode] says."""
    record, samples, batch, prefetch, epochs, _ = MPIIO_SHAPES[shape]
    file_access, settings_of_mode, _ = MPIIO_MODES[mode]
    out = work / f"mpiio-{shape}-out-{mode}{label}"
    settings: dict[str, object] = dict(
        dataset__data_folder=work / f"mpiio-{shape}-data", output__folder=out,
        dataset__format="indexed_binary", dataset__num_files_train=1,
        dataset__num_samples_per_file=samples, dataset__record_length_bytes=record,
        dataset__record_length_bytes_stdev=0, dataset__record_dims=f"[{record}]",
        reader__batch_size=batch, reader__read_threads=1, reader__prefetch_size=prefetch,
        reader__read_mode="sample", reader__file_shuffle="off", reader__sample_shuffle="seed",
        reader__file_access=file_access, train__computation_time=0, train__epochs=epochs[mode],
        workflow__generate_data="false")
    settings.update(settings_of_mode)
    settings.update(extra)
    return ["run", "demo", *overrides(**settings)], out


def _mpiio_run(work: Path, shape: str, mode: str, label: str = "",
               prefix: tuple[str, ...] = (), **extra: object) -> dict:
    """One run: its figures from summary.json (warm epochs: all but the first), and the CPU
    time of every process it started."""
    args, out = _mpiio_args(work, shape, mode, label, **extra)
    cpu, start = _children_cpu(), time.time()
    dlio(args, ranks=MPIIO_RANKS, prefix=prefix, timeout=1800)
    wall, cpu = time.time() - start, [b - a for a, b in zip(cpu, _children_cpu())]
    s = summary(out)
    m, reader = s["metric"], s["dlio_mpi"]["readers"]["train"]
    file_access = MPIIO_MODES[mode][0]
    if (reader["backend"] == "native") != (file_access == "multi") or \
            reader["file_access"] != file_access:
        sys.exit(f"{out}: reader.file_access={file_access} ran the backend {reader}")
    described = {k: reader[k] for k in ("backend", "file_access", "mpiio_implementation")
                 if k in reader}
    if reader.get("hints_requested"):  # and what the MPI-IO layer made of them
        described["hints"] = {k: (reader["hints_effective"] or {}).get(k)
                              for k in reader["hints_requested"]}
    mib, sps = m["train_transfer_MiB_per_second"], m["train_throughput_samples_per_second"]
    return {"MiB_per_s": statistics.median(mib[1:] or mib),
            "samples_per_s": statistics.median(sps[1:] or sps),
            "per_epoch_MiB_per_s": mib, "per_epoch_samples_per_s": sps,
            "latency_p50_ms": m["train_read_latency_p50_ms"],
            "latency_p99_ms": m["train_read_latency_p99_ms"],
            "requests": m["train_requests"], "read_calls": m["train_read_ops"],
            "bytes_read": m["train_bytes_read"], "user_s": cpu[0], "sys_s": cpu[1],
            "wall_s": wall, "backend": described}


def _perf_usable() -> str | None:
    """perf, if it is installed and may sample this user's processes."""
    perf = shutil.which("perf")
    if perf is None:
        return None
    probe = subprocess.run([perf, "record", "-q", "-o", os.devnull, "--", "true"],
                           capture_output=True)
    return perf if probe.returncode == 0 else None


def _perf_seconds(perf: str, data: Path, keys: str) -> list[tuple[float, str]]:
    """(CPU seconds, key) of a perf.data file sorted by `keys` (dso; dso,sym), most first."""
    text = sh([perf, "report", "-i", str(data), "--stdio", "--sort", keys,
               "-F", f"period,{keys}", "-t", "\t"]).stdout
    rows = [line.split("\t") for line in text.splitlines()
            if line.strip() and not line.startswith("#")]
    return sorted(((int(r[0]) / 1e9, " ".join(x.strip() for x in r[1:])) for r in rows),
                  reverse=True)


def _perf_group(dso: str) -> str:
    found = next((group for group, starts in PERF_GROUPS if dso.startswith(starts)), None)
    return found or (PERF_GROUPS[-1][0] if ".cpython-" in dso else "other")


def _mpiio_profile(work: Path, shape: str, mode: str, perf: str) -> dict:
    """CPU microseconds per sample of a run sampled by perf, by shared object grouped as
    PERF_GROUPS, less a FIXED_COSTS run's; and the top symbols of the whole run."""
    split, samples, top = {}, [], []
    for label, extra in (("-perf", {}), ("-perf-base", FIXED_COSTS)):
        data = work / f"mpiio-{shape}-perf" / f"{mode}{label}.data"
        data.parent.mkdir(exist_ok=True)
        run = _mpiio_run(work, shape, mode, label, (perf, "record", "-q", "-F", "999", "-o",
                                                    str(data), "--"), **extra)
        samples.append(run["requests"])
        sign = 1 if label == "-perf" else -1
        for seconds, dso in _perf_seconds(perf, data, "dso"):
            group = _perf_group(dso)
            split[group] = split.get(group, 0.0) + sign * seconds
        if not top:
            rows = _perf_seconds(perf, data, "dso,sym")
            total = sum(x for x, _ in rows)
            top = [{"percent": round(100 * x / total, 1), "symbol": name}
                   for x, name in rows[:12]]
    count = samples[0] - samples[1]
    return {"cpu_us_per_sample": {g: round(x / count * 1e6, 3) for g, x in
                                  sorted(split.items(), key=lambda kv: -kv[1])},
            "top_symbols_whole_run": top}


def _mpiio_compare(work: Path, shape: str, repeats: int = 3) -> dict:
    """The three reader.file_access modes on the one file of `shape`, in the page cache:
    `repeats` runs of each, the modes alternating so that drift hits all alike."""
    record, samples, batch, _, epochs, figure = MPIIO_SHAPES[shape]
    dlio(["generate", *_mpiio_generate_args(work, shape)], ranks=MPIIO_RANKS, timeout=1800)
    warm(work / f"mpiio-{shape}-data")
    runs: dict[str, list[dict]] = {mode: [] for mode in MPIIO_MODES}
    bases: dict[str, list[dict]] = {mode: [] for mode in MPIIO_MODES}
    for _ in range(repeats):
        for mode in MPIIO_MODES:
            runs[mode].append(_mpiio_run(work, shape, mode))
        for mode in MPIIO_MODES:
            bases[mode].append(_mpiio_run(work, shape, mode, "-base", **FIXED_COSTS))
    per_epoch = {r["bytes_read"] / epochs[mode] for mode, rs in runs.items() for r in rs}
    if len(per_epoch) != 1:
        sys.exit(f"mpiio {shape}: the modes read different bytes per epoch: {per_epoch}")
    result: dict[str, object] = {
        "sample_bytes": record, "samples_in_file": samples, "batch": batch,
        "ranks": MPIIO_RANKS, "figure": figure}
    perf = _perf_usable()
    for mode in MPIIO_MODES:
        mine, base = runs[mode], bases[mode]

        def med(key: str, rs: list[dict] = mine) -> float:
            return statistics.median(r[key] for r in rs)

        fixed = {kind: med(f"{kind}_s", base) for kind in ("user", "sys")}
        cpu = {kind: statistics.median((r[f"{kind}_s"] - fixed[kind]) * 1e6
                                       / (r["requests"] - base[0]["requests"]) for r in mine)
               for kind in ("user", "sys")}
        result[mode] = {
            "MiB_per_s": med("MiB_per_s"), "samples_per_s": med("samples_per_s"),
            "us_per_sample_per_rank": MPIIO_RANKS * 1e6 / med("samples_per_s"),
            "latency_p50_ms": med("latency_p50_ms"), "latency_p99_ms": med("latency_p99_ms"),
            "read_calls_per_request": mine[0]["read_calls"] / mine[0]["requests"],
            "cpu_us_per_sample": cpu, "backend": mine[0]["backend"], "epochs": epochs[mode],
            "runs": mine, "fixed_cost_runs": base}
        if perf is not None:
            result[mode]["perf"] = _mpiio_profile(work, shape, mode, perf)
    for mode in list(MPIIO_MODES)[1:]:
        result[f"ratio_{mode}_multi"] = result[mode][figure] / result["multi"][figure]
    _print_mpiio(shape, result, perf is not None)
    return result


def _print_mpiio(shape: str, result: dict, profiled: bool) -> None:
    size = (f"{result['sample_bytes'] / 2**20:g} MiB" if result["sample_bytes"] >= 2**20
            else f"{result['sample_bytes'] / 1e3:g} KB")
    print(f"mpiio {shape}: {size} samples from one shared file, batch {result['batch']}, "
          f"{result['ranks']} ranks, page cache, median of {len(result['multi']['runs'])} "
          f"runs; ratio: {result['figure']} over the POSIX engine's", flush=True)
    for mode, (_, _, name) in MPIIO_MODES.items():
        r = result[mode]
        ratio = f"{result[f'ratio_{mode}_multi']:5.2f}x" if mode != "multi" else " " * 6
        cpu = r["cpu_us_per_sample"]
        print(f"  {name:21} {r['MiB_per_s']:7,.0f} MiB/s {r['samples_per_s']:10,.0f} samples/s "
              f"{ratio} {r['us_per_sample_per_rank']:8.2f} us/sample/rank; latency p50 "
              f"{r['latency_p50_ms'] * 1e3:7,.0f} us; CPU us/sample user {cpu['user']:.2f} "
              f"sys {cpu['sys']:.2f}", flush=True)
        if profiled:
            split = r["perf"]["cpu_us_per_sample"]
            print("      perf, CPU us/sample: " + ", ".join(
                f"{group} {x:.2f}" for group, x in split.items() if abs(x) >= 0.005),
                flush=True)


def bench_mpiio(work: Path) -> dict:
    """One shared file read by the POSIX engine, MPI-IO independent reads and MPI-IO collective
    reads: 16 MiB samples (MiB/s) and 2.5 KB samples (samples/s, and where the time goes)."""
    large = _mpiio_compare(work, "large")
    # For reference, the POSIX engine with O_DIRECT on the same file: storage, not page cache
    # (ROMIO's UFS driver ignores direct_read, so the MPI-IO modes have no such line)
    direct = _mpiio_run(work, "large", "multi", "-odirect", reader__odirect="true",
                        train__epochs=3)
    large["multi_odirect_reference"] = direct
    print(f"  POSIX engine, O_DIRECT {direct['MiB_per_s']:7,.0f} MiB/s (reference: storage, "
          "not the page cache)", flush=True)
    remove_dataset(_mpiio_generate_args(work, "large"))  # 2 GiB
    small = _mpiio_compare(work, "small")
    remove_dataset(_mpiio_generate_args(work, "small"))  # 312.5 MiB
    return {"large": large, "small": small}


def _mpiio_generate_args(work: Path, shape: str) -> list[str]:
    """`dlio-mpi generate` arguments of the one file of `shape`."""
    args, _ = _mpiio_args(work, shape, "multi", workflow__generate_data="true")
    return args[1:]


# ------------------------------------------------------------------------------- checkpoint


CKPT_RANKS = 2
CKPT_BYTES_PER_RANK = 2 * 2**30
CKPT_BYTES_ENV = "DLIO_MPI_BENCH_CHECKPOINT_BYTES"  # bytes per rank instead, for a quick try
CKPT_BLOCK = 64 * 2**20  # bytes per write/read call: the writers' (C core, MPI-IO rounds), fio's bs


# the runs of `dlio-mpi run`: name: (checkpoint.layout, checkpoint.odirect, mpiio_hints)
CKPT_VARIANTS: dict[str, tuple[str, bool, dict[str, str]]] = {
    "file_per_rank": ("file_per_rank", True, {}),
    # through the page cache, like for like with the collective writes: ROMIO's UFS driver
    # has no O_DIRECT (their loads drop the files from the page cache first)
    "file_per_rank_buffered": ("file_per_rank", False, {}),
    "shared": ("shared", False, {}),  # collective MPI-IO, ROMIO's defaults (no hints given)
    "shared_cb_disabled": ("shared", False, {"romio_cb_write": "disable"}),  # for reference
    # one file created collectively, each rank's share by its own O_DIRECT calls
    "shared_odirect": ("shared", True, {}),
}


def _checkpoint_bytes_per_rank() -> int:
    text = os.environ.get(CKPT_BYTES_ENV)
    if text is None:
        return CKPT_BYTES_PER_RANK
    nbytes = int(text)
    if nbytes <= 0 or nbytes % CKPT_BLOCK:
        sys.exit(f"checkpoint: {CKPT_BYTES_ENV}={text}: expected a positive multiple of "
                 f"{CKPT_BLOCK} (the {CKPT_BLOCK >> 20} MiB calls)")
    return nbytes


def _checkpoint_run(work: Path, variant: str, nbytes: int, run: int) -> dict:
    """One `mpiexec -n 2 dlio-mpi run` of the checkpoint-only workflow: one checkpoint saved
    (O_DIRECT as the variant says, fsync) and loaded back. Its figures from its summary.json:
    MiB/s of the save and the load over all ranks (bytes over the slowest rank's time, the
    metric's save/load_checkpoint_io_mean_GB_per_second), and each one's record. The
    checkpoint is removed afterwards."""
    import yaml

    layout, odirect, hints = CKPT_VARIANTS[variant]
    runs, checkpoints = work / "checkpoint-runs", work / "checkpoint-out"
    runs.mkdir(exist_ok=True)
    out = runs / f"{run:02d}-{variant}"
    workload = {
        # ZeRO >= 1: every rank writes one file (model_states-<rank>.pt) of model_size_bytes
        "model": {"name": f"checkpoint_bench_{variant}", "model_size_bytes": nbytes,
                  "parallelism": {"zero_stage": 1}},
        "framework": "pytorch",
        "workflow": {"generate_data": False, "train": False, "checkpoint": True},
        "checkpoint": {"checkpoint_folder": str(checkpoints), "num_checkpoints_write": 1,
                       "num_checkpoints_read": 1, "time_between_checkpoints": 0,
                       "layout": layout, "odirect": odirect, "fsync": True,
                       "mpiio_hints": hints},
        "output": {"folder": str(out)}}
    config = runs / f"{variant}.yaml"
    config.write_text(yaml.safe_dump(workload, sort_keys=False))
    try:
        dlio(["run", str(config)], ranks=CKPT_RANKS, timeout=600)
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)  # 4 GiB: one checkpoint at a time
    s = summary(out)
    ck, metric = s["dlio_mpi"]["checkpoint"], s["metric"]
    asked = {"layout": layout, "odirect": odirect, "fsync": True, "mpiio_hints": hints,
             "bytes_per_rank": [nbytes] * CKPT_RANKS, "kinds": ["save", "load"]}
    found = {"layout": ck["layout"], "odirect": ck["odirect"], "fsync": ck["fsync"],
             "mpiio_hints": ck["mpiio_hints"], "bytes_per_rank": ck["sizing"]["bytes_per_rank"],
             "kinds": [r["kind"] for r in ck["records"]]}
    if found != asked:
        sys.exit(f"checkpoint: {out / 'summary.json'}: the run did {found}, not {asked}")
    result = {}
    for record in ck["records"]:
        kind = record["kind"]
        result[kind] = {
            "MiB_per_s": metric[f"{kind}_checkpoint_io_mean_GB_per_second"] * 1024, **record}
    result["restore_methods"] = ck["restore"]["methods"]
    return result


def _checkpoint_fio(fio: str, work: Path, nbytes: int) -> dict:
    """fio's O_DIRECT sequential write (then fsync) of as many bytes in as many jobs, then its
    O_DIRECT read of the files it wrote; its files removed afterwards."""
    folder = work / "checkpoint-fio"
    folder.mkdir(exist_ok=True)
    common = ["--name=ckpt", f"--directory={folder}", "--direct=1", "--ioengine=psync",
              f"--numjobs={CKPT_RANKS}", f"--bs={CKPT_BLOCK}", f"--size={nbytes}",
              "--fallocate=none"]  # the writers append to new files; so does fio here
    try:
        write = fio_MiB_per_s(fio, [*common, "--rw=write", "--end_fsync=1"], "write")
        read = fio_MiB_per_s(fio, [*common, "--rw=read"], "read")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"write_MiB_per_s": write, "read_MiB_per_s": read}


def bench_checkpoint(work: Path, repeats: int = 3) -> dict:
    """Checkpoints written and restored by `dlio-mpi run` (checkpoint-only workflow, 2 ranks x
    2 GiB, fsync; file_per_rank with O_DIRECT) beside fio: file_per_rank's save against fio's
    O_DIRECT write and its O_DIRECT load against fio's O_DIRECT read; shared (collective
    MPI-IO, one file) beside file_per_rank. Figures from the runs' summary.json; medians of
    `repeats` rounds, dlio-mpi and fio taking turns. The benchmark's folders under `work`
    (checkpoint-runs, checkpoint-out, checkpoint-fio) are removed afterwards."""
    fio = shutil.which("fio")
    if fio is None:
        sys.exit("checkpoint: fio not found (apt-get install fio)")
    nbytes = _checkpoint_bytes_per_rank()
    order = ["file_per_rank", "fio", *list(CKPT_VARIANTS)[1:]]
    runs: dict[str, list[dict]] = {what: [] for what in order}
    run = 0
    try:
        for round_ in range(repeats):
            for what in order if round_ % 2 == 0 else order[::-1]:
                run += 1
                runs[what].append(_checkpoint_fio(fio, work, nbytes) if what == "fio"
                                  else _checkpoint_run(work, what, nbytes, run))
    finally:
        for name in ("checkpoint-runs", "checkpoint-out", "checkpoint-fio"):
            shutil.rmtree(work / name, ignore_errors=True)

    def med(what: str, kind: str) -> float:
        return statistics.median(r[kind]["MiB_per_s"] if what != "fio" else r[kind]
                                 for r in runs[what])

    figures = {f"{variant}_{kind}": med(variant, kind)
               for variant in CKPT_VARIANTS for kind in ("save", "load")}
    figures |= {"fio_write": med("fio", "write_MiB_per_s"),
                "fio_read": med("fio", "read_MiB_per_s")}
    ratios = {  # name: (figure, over, target)
        "file_per_rank_save_over_fio_write": ("file_per_rank_save", "fio_write", 0.9),
        "shared_save_over_file_per_rank_save": ("shared_save", "file_per_rank_save", 0.7),
        "file_per_rank_load_over_fio_read": ("file_per_rank_load", "fio_read", 0.9),
        "shared_load_over_file_per_rank_load": ("shared_load", "file_per_rank_load", None),
        "shared_save_over_file_per_rank_buffered_save": (
            "shared_save", "file_per_rank_buffered_save", None),
        "shared_cb_disabled_save_over_file_per_rank_save": (
            "shared_cb_disabled_save", "file_per_rank_save", None),
        "shared_odirect_save_over_file_per_rank_save": (
            "shared_odirect_save", "file_per_rank_save", None),
        "shared_odirect_load_over_file_per_rank_load": (
            "shared_odirect_load", "file_per_rank_load", None)}
    result: dict[str, object] = {
        "source": f"dlio-mpi run summaries (mpiexec -n {CKPT_RANKS} dlio-mpi run, "
                  "checkpoint-only workflow; summary.json metric and "
                  "dlio_mpi.checkpoint.records)",
        "ranks": CKPT_RANKS, "bytes_per_rank": nbytes, "block": CKPT_BLOCK,
        "variants": {name: {"layout": layout, "odirect": odirect, "mpiio_hints": hints}
                     for name, (layout, odirect, hints) in CKPT_VARIANTS.items()},
        "MiB_per_s": figures, "runs": runs,
        "ratios": {name: {"ratio": figures[a] / figures[b], "target": target}
                   for name, (a, b, target) in ratios.items()}}
    print(f"checkpoint: {CKPT_RANKS} ranks x {nbytes / 2**30:g} GiB, fsync, "
          f"{CKPT_BLOCK >> 20} MiB calls, median of {repeats} rounds (MiB/s; dlio-mpi's from "
          "`dlio-mpi run` summaries):", flush=True)
    for name, value in figures.items():
        print(f"  {name:30} {value:8,.0f}", flush=True)
    for name, r in result["ratios"].items():
        target = (f"target >= {r['target']}: {'met' if r['ratio'] >= r['target'] else 'MISSED'}"
                  if r["target"] is not None else "no target")
        print(f"  {name:48} {r['ratio']:5.2f}  ({target})", flush=True)
    return result


# ------------------------------------------------------------------------------- burst


BURST_RANKS = 2
BURST_SHARE = 512 << 20        # bytes per rank of each checkpoint of the stall cases
BURST_DRAIN_SHARE = 1 << 30    # bytes per rank of the drained checkpoint
BURST_SLOW_SHARE = 256 << 20   # bytes per rank of each checkpoint on the throttled tier
BURST_BUFFER = 64 << 20        # drain.buffer_bytes and raw_copy's -b: bytes per call
BURST_SLOW_MIBPS = 300         # the throttled tier's write limit (slow_pfs.sh --write-mibps)
# the stall's cases (the demo workload: 8 steps an epoch): name: (computation_time,
# steps_between_checkpoints, epochs); long_steps: 1.6 s of steps between two saves, longer
# than one background write and the next save's patterns (0.6-1 s here); short_steps: 40 ms,
# shorter (the stall holds the rest of the previous write)
BURST_STALL_CASES = {"long_steps": (0.4, 4, 2), "short_steps": (0.02, 2, 1)}
# the throttled tier's cases: name: (async_write, drained to it, checkpoint_folder on it)
BURST_SLOW_CASES = {"fast": (False, False, False), "fast_drain": (False, True, False),
                    "fast_async_drain": (True, True, False), "slow": (False, False, True)}


def _burst_common(work: Path) -> list[str]:
    """The demo workload (32 small npz files, batch 2, 8 steps an epoch) with checkpoints of one
    file per rank (ZeRO 1: model_size_bytes each), O_DIRECT, fsync."""
    return ["demo", *overrides(dataset__data_folder=work / "burst-data",
                               model__parallelism__zero_stage=1, workflow__checkpoint="true",
                               checkpoint__odirect="true", checkpoint__fsync="true")]


def _burst_run(work: Path, name: str, args: list[str], remove: tuple[Path, ...] = (),
               prefix: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """`mpiexec -n BURST_RANKS dlio-mpi run ARGS` into DIR/burst-runs/NAME; its summary and
    per-epoch stats; the folders `remove` (its checkpoints) removed afterwards."""
    out = work / "burst-runs" / name
    shutil.rmtree(out, ignore_errors=True)
    try:
        dlio(["run", *args, "workflow.generate_data=false", f"output.folder={out}"],
             ranks=BURST_RANKS, prefix=prefix, timeout=600)
    finally:
        for folder in remove:
            shutil.rmtree(folder, ignore_errors=True)
    stats = out / "per_epoch_stats.json"
    return summary(out), json.loads(stats.read_text()) if stats.exists() else {}


def _records(s: dict, kind: str, share: int, count: int | None = None) -> list[dict]:
    """The run's checkpoint records of `kind`, checked: every rank's share written."""
    records = [r for r in s["dlio_mpi"]["checkpoint"]["records"] if r["kind"] == kind]
    if any(r["bytes"] != share * BURST_RANKS for r in records) or not records or \
            (count is not None and len(records) != count):
        sys.exit(f"burst: expected {count or 'some'} {kind} record(s) of "
                 f"{share * BURST_RANKS} bytes, got {[r['bytes'] for r in records]}")
    return records


def _stall_once(work: Path, case: str, mode: str, run: int) -> dict:
    """One training run of `case` with synchronous or asynchronous saves: per checkpoint, the
    step loop's pause (sync: the save; async: the stall) and the async figures."""
    compute, between, epochs = BURST_STALL_CASES[case]
    ck = work / "burst-ck"
    args = [*_burst_common(work), *overrides(
        model__model_size_bytes=BURST_SHARE, checkpoint__checkpoint_folder=ck,
        checkpoint__steps_between_checkpoints=between, train__computation_time=compute,
        train__epochs=epochs, checkpoint__async_write=str(mode == "async").lower())]
    s, stats = _burst_run(work, f"{run:02d}-{case}-{mode}", args, (ck,))
    saves = _records(s, "save", BURST_SHARE, epochs * 8 // between)
    result = {"epoch_pause_seconds": sum(e["checkpoint_pause_seconds"] for e in stats.values()),
              "write_seconds": [r["duration_seconds"] for r in saves]}
    if mode == "sync":
        return {**result, "pause_seconds": result["write_seconds"]}
    a = [r["async"] for r in saves]
    return {**result, "pause_seconds": [x["stall_seconds"] for x in a],
            "snapshot_seconds": [x["snapshot_seconds"] for x in a],
            "waited_for_previous_seconds": [x["waited_for_previous_seconds"] for x in a],
            "write_seconds": [x["write_seconds"] for x in a],
            "snapshot_GiB_per_second_per_rank": [x["snapshot_GiB_per_second_per_rank"]
                                                 for x in a]}


def _per_checkpoint(runs: list[dict], key: str) -> list[float]:
    """The median over the rounds of each checkpoint's `key`."""
    return [statistics.median(values) for values in zip(*(r[key] for r in runs))]


def _stall_case(runs: dict, case: str) -> dict:
    """A stall case's medians per checkpoint, async against sync, and their ratios."""
    sync, asy = runs[(case, "sync")], runs[(case, "async")]
    pause, stall = _per_checkpoint(sync, "pause_seconds"), _per_checkpoint(asy, "pause_seconds")
    ratios = [a / p for a, p in zip(stall, pause)]
    return {"sync_pause_seconds": pause, "async_stall_seconds": stall,
            "stall_over_pause": ratios,
            "snapshot_seconds": _per_checkpoint(asy, "snapshot_seconds"),
            "waited_for_previous_seconds": _per_checkpoint(asy, "waited_for_previous_seconds"),
            "async_write_seconds": _per_checkpoint(asy, "write_seconds"),
            "epoch_pause_seconds": {m: statistics.median(r["epoch_pause_seconds"]
                                                         for r in runs[(case, m)])
                                    for m in ("sync", "async")},
            "snapshot_GiB_per_second_per_rank": statistics.median(
                g for r in asy for g in r["snapshot_GiB_per_second_per_rank"]),
            "stall_over_pause_median": statistics.median(ratios),
            "stall_over_pause_max": max(ratios)}


def _burst_stall(work: Path, rounds: int = 3) -> dict:
    """Async stall against the synchronous pause on the same checkpoints (BURST_STALL_CASES,
    the modes taking turns, `rounds` rounds, medians), and the snapshot's GiB/s per rank
    beside memcpy_ref.c (as many threads as ranks, the share's bytes) in the same rounds."""
    exe = build(work, "memcpy_ref.c", flags=("-pthread",))
    runs: dict[tuple[str, str], list[dict]] = {(c, m): [] for c in BURST_STALL_CASES
                                               for m in ("sync", "async")}
    memcpy: list[float] = []
    for r in range(rounds):
        for case, mode in runs if r % 2 == 0 else list(runs)[::-1]:
            runs[(case, mode)].append(_stall_once(work, case, mode, r))
        line = sh([exe, "-j", str(BURST_RANKS), "-b", str(BURST_SHARE), "-r", "5"]).stdout
        memcpy.append(float(re.search(r"median=([\d.]+)", line)[1]))
    result = {case: _stall_case(runs, case) for case in BURST_STALL_CASES}
    result["memcpy_GiB_per_second_per_thread"] = statistics.median(memcpy)
    result["runs"] = {f"{c}_{m}": v for (c, m), v in runs.items()}
    for case in BURST_STALL_CASES:
        c = result[case]
        c["snapshot_over_memcpy"] = (c["snapshot_GiB_per_second_per_rank"]
                                     / result["memcpy_GiB_per_second_per_thread"])
        print(f"burst stall, {case} ({BURST_STALL_CASES[case]}): per checkpoint, sync pause "
              f"{_ms(c['sync_pause_seconds'])} ms, async stall {_ms(c['async_stall_seconds'])}"
              f" ms (of it waiting for the previous write "
              f"{_ms(c['waited_for_previous_seconds'])}), stall / pause "
              f"{[round(x, 3) for x in c['stall_over_pause']]}, median "
              f"{c['stall_over_pause_median']:.3f}, max {c['stall_over_pause_max']:.3f}; "
              f"snapshot {c['snapshot_GiB_per_second_per_rank']:.2f} GiB/s per rank, "
              f"{c['snapshot_over_memcpy']:.2f}x memcpy_ref's "
              f"{result['memcpy_GiB_per_second_per_thread']:.2f}", flush=True)
    return result


def _ms(seconds: list[float]) -> list[int]:
    return [round(s * 1e3) for s in seconds]


def _identical(a: Path, b: Path) -> bool:
    """Whether the files in folder `a` are those of `b`, byte for byte (cmp)."""
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        subprocess.run(["cmp", "-s", str(a / n), str(b / n)]).returncode == 0 for n in names)


def _drain_once(work: Path, exe: str, run: int) -> dict:
    """One checkpoint-only run (one save of BURST_DRAIN_SHARE a rank, drained with O_DIRECT
    while nothing else runs), then raw_copy.c of the same files between the same folders
    (O_DIRECT, as many threads as ranks, the same call size); drained copies checked byte for
    byte against the fast tier's; every copy removed afterwards."""
    ck, pfs, ref = work / "burst-ck", work / "burst-pfs", work / "burst-ref"
    listing = work / "burst-list.txt"
    args = [*_burst_common(work), *overrides(
        workflow__train="false", model__model_size_bytes=BURST_DRAIN_SHARE,
        checkpoint__checkpoint_folder=ck, checkpoint__num_checkpoints_write=1,
        checkpoint__num_checkpoints_read=0, checkpoint__time_between_checkpoints=0,
        checkpoint__drain__to=pfs, checkpoint__drain__odirect="true",
        checkpoint__drain__buffer_bytes=BURST_BUFFER)]
    try:
        s, _ = _burst_run(work, f"{run:02d}-drain", args)
        (drain,) = _records(s, "drain", BURST_DRAIN_SHARE, 1)
        cid = drain["checkpoint_id"]
        identical = _identical(ck / cid, pfs / cid) and drain["drain"]["complete"]
        shutil.rmtree(pfs)  # room for raw_copy's copy
        files = sorted((ck / cid).iterdir())
        listing.write_text("".join(f"{p}\t{p.name}\n" for p in files))
        ref.mkdir()
        line = sh([exe, "-j", str(BURST_RANKS), "-d", "-b", str(BURST_BUFFER), str(listing),
                   str(ref)]).stdout
        return {"drain_MiB_per_s": drain["bytes"] / 2**20 / drain["duration_seconds"],
                "raw_copy_MiB_per_s": float(re.search(r"MiB_per_s=([\d.]+)", line)[1]),
                "identical": identical, "record": drain}
    finally:
        for folder in (ck, pfs, ref):
            shutil.rmtree(folder, ignore_errors=True)
        listing.unlink(missing_ok=True)


def _burst_drain(work: Path, rounds: int = 3) -> dict:
    """checkpoint.drain's bandwidth against raw_copy.c between the same folders."""
    exe = build(work, "raw_copy.c", flags=("-pthread",))
    runs = [_drain_once(work, exe, r) for r in range(rounds)]
    ours = statistics.median(r["drain_MiB_per_s"] for r in runs)
    theirs = statistics.median(r["raw_copy_MiB_per_s"] for r in runs)
    result = {"drain_MiB_per_s": ours, "raw_copy_MiB_per_s": theirs, "ratio": ours / theirs,
              "identical": all(r["identical"] for r in runs), "runs": runs}
    print(f"burst drain: {BURST_RANKS} ranks x {BURST_DRAIN_SHARE / 2**30:g} GiB, O_DIRECT, "
          f"{BURST_BUFFER >> 20} MiB calls: {ours:.0f} MiB/s vs raw_copy {theirs:.0f} MiB/s, "
          f"ratio {ours / theirs:.3f} (target >= 0.9: "
          f"{'met' if ours / theirs >= 0.9 else 'MISSED'}); drained copies byte-identical: "
          f"{result['identical']}", flush=True)
    if not result["identical"]:
        sys.exit("burst: a drained checkpoint differs from the fast tier's")
    return result


def _slow_once(work: Path, mount: Path, case: str, throttled: tuple[str, ...]) -> dict:
    """One training run of BURST_SLOW_CASES[case] (4 saves of BURST_SLOW_SHARE a rank, 2 s of
    steps apart) through the throttle: AU per epoch, the step loop's pause per checkpoint and
    its time to durable on the slow tier (a drain's end, or the save's on the slow tier)."""
    asynchronous, drained, on_slow = BURST_SLOW_CASES[case]
    fast, slow = work / "burst-ck", mount / "ck"
    args = [*_burst_common(work), *overrides(
        model__model_size_bytes=BURST_SLOW_SHARE, train__computation_time=0.5,
        train__epochs=2, checkpoint__steps_between_checkpoints=4,
        checkpoint__checkpoint_folder=slow if on_slow else fast,
        checkpoint__async_write=str(asynchronous).lower())]
    if drained:
        args += overrides(checkpoint__drain__to=slow, checkpoint__drain__odirect="true",
                          checkpoint__drain__buffer_bytes=BURST_BUFFER)
    s, stats = _burst_run(work, f"slow-{case}", args, (fast, slow), prefix=throttled)
    saves = _records(s, "save", BURST_SLOW_SHARE, 4)
    pause = [r["async"]["stall_seconds"] if asynchronous else r["duration_seconds"]
             for r in saves]
    result = {"au": [stats[k]["au_percentage"] for k in sorted(stats, key=int)],
              "pause_seconds": pause, "pause_seconds_total": sum(pause),
              "save_seconds": [r["duration_seconds"] for r in saves]}
    if drained:
        drains = _records(s, "drain", BURST_SLOW_SHARE, 4)
        if not all(r["drain"]["complete"] for r in drains):
            sys.exit(f"burst: {case}: a drain did not complete")
        result.update(durable_seconds=[r["drain"]["durable_seconds"] for r in drains],
                      drain_MiB_per_s=[r["bytes"] / 2**20 / r["duration_seconds"]
                                       for r in drains],
                      final_wait_seconds=s["dlio_mpi"]["checkpoint"]["drain"][
                          "final_wait_seconds"])
    elif on_slow:
        result["durable_seconds"] = result["save_seconds"]
    return result


def _dd_direct_MiB_per_s(path: Path, prefix: tuple[str, ...], mib: int = 128) -> float:  # noqa: N802
    """dd's O_DIRECT write of `mib` MiB to `path` (removed after) under `prefix`."""
    res = sh([*prefix, "dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={mib // 4}",
              "oflag=direct"])
    path.unlink()
    seconds = float(re.search(r"copied, ([\d.]+) s", res.stderr)[1])
    return mib / seconds


def _burst_slow(work: Path) -> dict:
    """The throttled slow tier (scripts/slow_pfs.sh, writes limited to BURST_SLOW_MIBPS) as
    the PFS behind the local disk; skipped where slow_pfs.sh cannot run."""
    if os.geteuid() != 0:
        print("burst slow tier: skipped (scripts/slow_pfs.sh needs root)", flush=True)
        return {"skipped": "needs root"}
    slow_pfs = str(HERE.parent / "slow_pfs.sh")
    mount, image = work / "burst-slow-pfs", work / "burst-slow-pfs.img"
    up = subprocess.run([slow_pfs, "up", "--mount", str(mount), "--size", "3G",
                         "--write-mibps", str(BURST_SLOW_MIBPS), "--image", str(image)],
                        capture_output=True, text=True)
    if up.returncode != 0:
        print(f"burst slow tier: skipped (scripts/slow_pfs.sh up failed: "
              f"{up.stderr.strip()})", flush=True)
        return {"skipped": up.stderr.strip()}
    throttled = (slow_pfs, "run", "--")
    try:
        result: dict = {"write_limit_MiB_per_s": BURST_SLOW_MIBPS, "cgroup": (
            "v1" if Path("/sys/fs/cgroup/blkio").is_dir() else "v2")}
        result["dd_direct_MiB_per_s"] = _dd_direct_MiB_per_s(mount / "dd", throttled)
        for case in BURST_SLOW_CASES:
            result[case] = _slow_once(work, mount, case, throttled)
    finally:
        sh([slow_pfs, "down"])
    print(f"burst slow tier (writes throttled to {BURST_SLOW_MIBPS} MiB/s, cgroup "
          f"{result['cgroup']}; dd oflag=direct through it: "
          f"{result['dd_direct_MiB_per_s']:.0f} MiB/s), 2 ranks x "
          f"{BURST_SLOW_SHARE >> 20} MiB a checkpoint, 2 s of steps apart:", flush=True)
    for case in BURST_SLOW_CASES:
        c = result[case]
        durable = (f", durable on the slow tier after {[round(x, 2) for x in c['durable_seconds']]}"
                   " s" if "durable_seconds" in c else " (never on the slow tier)")
        print(f"  {case:17} AU {[round(a, 2) for a in c['au']]} %, pause per checkpoint "
              f"{_ms(c['pause_seconds'])} ms{durable}", flush=True)
    return result


def bench_burst(work: Path) -> dict:
    """Burst-buffer checkpoints (issue 23): checkpoint.async_write's stall against the
    synchronous pause, checkpoint.drain's bandwidth against raw_copy.c, and a throttled slow
    tier behind the local disk. Data, checkpoints and copies removed afterwards."""
    data = _burst_common(work)
    dlio(["generate", *data, "workflow.generate_data=true",
          f"output.folder={work / 'burst-runs' / 'generate'}"])
    try:
        return {"stall": _burst_stall(work), "drain": _burst_drain(work),
                "slow_tier": _burst_slow(work)}
    finally:
        remove_dataset(data)
        (work / "burst-list.txt").unlink(missing_ok=True)


# ------------------------------------------------------------------------------- formats


FORMAT_SAMPLE = 128 * 1024  # bytes of every sample, whatever the format
FORMATS_COMPARED = ("indexed_binary", "mmap_indexed_binary", "tfrecord", "hdf5", "npy")
FORMAT_TARGETS = {"tfrecord": 0.8, "hdf5": 0.8}  # issue 9: x indexed_binary's rate


def _format_run(work: Path, fmt: str) -> dict:
    """One format: 32 files x 64 samples of FORMAT_SAMPLE bytes (256 MiB) generated, then 5
    epochs on 2 ranks reading exact sample extents (read_mode sample), batch 16, 2 reader
    threads, no compute: samples/s and MiB/s of epochs 2-5 (the page cache warm after the
    first), median."""
    data, out = work / f"formats-{fmt}", work / f"formats-{fmt}-out"
    common = ["demo", *overrides(
        dataset__data_folder=data, output__folder=out, dataset__format=fmt,
        dataset__num_files_train=32, dataset__num_samples_per_file=64,
        dataset__record_length_bytes=FORMAT_SAMPLE, dataset__record_length_bytes_stdev=0,
        dataset__record_dims=f"[{FORMAT_SAMPLE}]", reader__batch_size=16,
        reader__read_threads=2, reader__prefetch_size=4, reader__read_mode="sample",
        train__computation_time=0, train__epochs=5)]
    try:
        dlio(["generate", *common, "workflow.generate_data=true"])
        dlio(["run", *common, "workflow.generate_data=false"])
        epochs = list(json.loads((out / "per_epoch_stats.json").read_text()).values())[1:]
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    return {"samples_per_s": statistics.median(e["throughput_samples_per_second"]
                                               for e in epochs),
            "MiB_per_s": statistics.median(e["transfer_MiB_per_second"] for e in epochs),
            "epochs": [{k: e[k] for k in ("throughput_samples_per_second",
                                          "transfer_MiB_per_second", "read_ops",
                                          "file_opens")} for e in epochs]}


def bench_formats(work: Path) -> dict:
    """The native engine on each implemented format of FORMATS_COMPARED, the same samples
    (128 KiB, exact extents, page cache warm, 2 ranks), beside indexed_binary's rate."""
    from dlio_mpi.formats import implemented_formats

    formats = [f for f in FORMATS_COMPARED if f in implemented_formats()]
    runs = {fmt: _format_run(work, fmt) for fmt in formats}
    base = runs["indexed_binary"]["samples_per_s"]
    print(f"formats: 2 ranks, {FORMAT_SAMPLE >> 10} KiB samples read by extent, page cache "
          "warm, no compute (samples/s, median of epochs 2-5):", flush=True)
    for fmt, run in runs.items():
        ratio = run["samples_per_s"] / base
        run["over_indexed_binary"] = ratio
        target = FORMAT_TARGETS.get(fmt)
        verdict = (f"target >= {target}: {'met' if ratio >= target else 'MISSED'}"
                   if target else "no target")
        print(f"  {fmt:20} {run['samples_per_s']:10,.0f} samples/s {run['MiB_per_s']:8,.0f} "
              f"MiB/s  {ratio:5.2f}x indexed_binary ({verdict})", flush=True)
    missing = [f for f in FORMAT_TARGETS if f not in formats]
    if missing:
        print(f"  not implemented here: {', '.join(missing)}", flush=True)
    return {"sample_bytes": FORMAT_SAMPLE, "runs": runs, "targets": FORMAT_TARGETS}


# ------------------------------------------------------------------------------- parquet


PARQUET_WORKLOAD = "mlperf/dlrm_mi355"  # 200 typed columns, 40 read: 160 of 761 bytes a row
PARQUET_FILES, PARQUET_ROWS = 32, 12288  # 2 row groups of 6,144 rows a file: 338 MiB
PARQUET_RANKS = 2
PARQUET_STEP_S = 0.000375                # dlrm's step (issue 22's target: overhead < 20 us)
PARQUET_TARGET_US = 20.0
PARQUET_CASES = {  # label: (ranks, batch a rank, computation_time, epochs, read threads)
    "dlrm": (2, 18432, PARQUET_STEP_S, 12, 1),    # the workload's batch: 10 steps an epoch
    "dlrm_1rank": (1, 18432, PARQUET_STEP_S, 6, 1),  # one rank's 2 threads on 2 cores
    "no_compute": (2, 18432, 0, 12, 1),           # the same, its read cost per step
    "no_compute_inline": (2, 18432, 0, 12, 0),    # read by the step loop's thread: no hand-off
    "batch1024": (2, 1024, PARQUET_STEP_S, 4, 1),  # 1/18 of it: reading keeps up
    "batch1024_1rank": (1, 1024, PARQUET_STEP_S, 2, 1),  # one rank's 2 threads on 2 cores
}
PARQUET_CONTROLS = {"control": 2, "control_1rank": 1}  # `overhead`'s case: label -> ranks


def _parquet_args(work: Path, label: str) -> tuple[list[str], Path]:
    """The scaled dlrm workload's overrides for one case of PARQUET_CASES (its batch, compute
    and epochs; generation ignores them), and the case's output folder."""
    _, batch, compute_s, epochs, threads = PARQUET_CASES[label]
    out = work / f"parquet-out-{label}"
    return [PARQUET_WORKLOAD, *overrides(
        dataset__data_folder=work / "parquet-data", output__folder=out,
        dataset__num_files_train=PARQUET_FILES, dataset__num_samples_per_file=PARQUET_ROWS,
        reader__batch_size=batch, reader__read_threads=threads, train__epochs=epochs,
        train__computation_time=compute_s,
        output__access_log=str(label == "no_compute").lower())], out  # what the references read


def _step_figures(out: Path, ranks: int) -> dict:
    """A run's overhead per step (summary.json's parts, over all epochs; the total's median
    over epochs 2-N, the first warming up), AU, us per step (epochs 2-N) and bytes a sample."""
    s = summary(out)
    m, d = s["metric"], s["dlio_mpi"]
    epochs = list(json.loads((out / "per_epoch_stats.json").read_text()).values())
    warm_epochs = epochs[1:]
    samples = sum(e["steps"] for e in epochs) * d["batch_size"] * ranks
    return {"overhead_us_per_step": {k: v["median"] for k, v in
                                     m["train_emulator_overhead_us_per_step"].items()},
            "overhead_us_per_step_warm_median": statistics.median(
                e["emulator_overhead_us_per_step"] for e in warm_epochs),
            "au_mean": m["train_au_mean_percentage"],
            "us_per_step_warm_median": statistics.median(
                e["duration"] / e["steps"] * 1e6 for e in warm_epochs),
            "bytes_read_per_sample": m["train_bytes_read"] / samples,
            "bytes_transferred_per_sample": m["train_bytes_transferred"] / samples,
            "steps_per_epoch": d["steps_per_epoch"], "batch_size": d["batch_size"],
            "spin_us_now": d["pacing"]["compute_spin_us_now"]["median"]}


def _parquet_groups(work: Path, out: Path) -> tuple[list[list[tuple[int, int]]], dict]:
    """What dlio-mpi read in epoch 2 (its access log): per rank, the (file, row group) pairs in
    the order first read; and the files' paths, the column names read, each row group's
    coalesced column-chunk reads and a file's footer reads."""
    import numpy as np

    from dlio_mpi.config import load_config
    from dlio_mpi.data.dataset import describe_dataset

    args, _ = _parquet_args(work, "dlrm")
    cfg = load_config(args[0], args[1:])
    split = describe_dataset(cfg)["train"]
    units = split.expected_layouts().units()
    order = []
    for rank in range(PARQUET_RANKS):
        ids = np.load(out / "access_log" / f"epoch2_rank{rank}.npy")
        keys = ids // split.samples_per_file * units.count + (
            ids % split.samples_per_file) // units.per_unit
        _, first = np.unique(keys, return_index=True)
        order.append([divmod(int(k), units.count) for k in keys[np.sort(first)]])
    part_offset, part_length = units.pieces()
    extents = {"groups": [[(int(o), int(n)) for o, n in zip(po, pl) if n > 0]
                          for po, pl in zip(part_offset, part_length)],
               "footer": [(int(o), int(n)) for o, n in zip(units.open_offset,
                                                           units.open_length) if n > 0],
               "paths": [split.path(f) for f in range(PARQUET_FILES)],
               "columns": [c.name for c in cfg.dataset.parquet.columns if c.read]}
    return order, extents


def _pyarrow_rank(paths: list[str], pairs: list[tuple[int, int]], columns: list[str],
                  start) -> float:
    """One reference process: pq.ParquetFile(path) at a file's first use (its footer), then
    read_row_group(g, columns=...) of each pair in turn; its seconds."""
    import pyarrow.parquet as pq

    start.wait()
    t0 = time.perf_counter()
    opened: dict = {}
    for f, g in pairs:
        if f not in opened:
            opened[f] = pq.ParquetFile(paths[f])
        opened[f].read_row_group(g, columns=columns)
    return time.perf_counter() - t0


def _pyarrow_loop(extents: dict, order: list, repeats: int = 5) -> list[float]:
    """pyarrow reading the same row groups' same columns, one process a rank, all at once:
    each repeat's slowest process's seconds."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    runs = []
    with mp.Manager() as manager, ProcessPoolExecutor(len(order)) as pool:
        for _ in range(repeats):
            start = manager.Barrier(len(order))
            futures = [pool.submit(_pyarrow_rank, extents["paths"], pairs,
                                   extents["columns"], start) for pairs in order]
            runs.append(max(f.result() for f in futures))
    return runs


def _raw_loop(work: Path, extents: dict, order: list, repeats: int = 5) -> list[float]:
    """raw_pread.c over the same extents (each file's footer at its first use, then the row
    groups' coalesced column-chunk reads), one thread a rank: each repeat's seconds."""
    lines = []
    for pairs in order:
        seen: set = set()
        for f, g in pairs:
            reads = ([] if f in seen else extents["footer"]) + extents["groups"][g]
            seen.add(f)
            lines += [f"{extents['paths'][f]} {o} {n}" for o, n in reads]
    listing = work / "parquet-requests.txt"
    listing.write_text("\n".join(lines) + "\n")
    exe = build(work, "raw_pread.c", flags=("-pthread",))
    runs = []
    for _ in range(repeats):
        text = sh([exe, "-t", str(len(order)), "-r", "1", str(listing)]).stdout
        runs.append(float(re.search(r"seconds=([\d.e+-]+)", text).group(1)))
    listing.unlink()
    return runs


def bench_parquet(work: Path, rounds: int = 3) -> dict:
    """The scaled dlrm parquet workload from the page cache, 2 ranks x 1 read thread: the
    emulator's overhead per step at dlrm's 0.375 ms step (issue 22's target: < 20 us) at the
    workload's batch and at 1/18 of it, beside `overhead`'s case (no I/O to speak of) in the
    same rounds; and the read cost per step with no compute beside pyarrow's read_row_group
    loop and a C pread loop over the same row groups (epoch 2's access log)."""
    args, _ = _parquet_args(work, "dlrm")
    control = _overhead_args(work, "parquet-control")
    dlio(["generate", *args])
    dlio(["generate", *control])
    warm(work / "parquet-data")
    runs: dict = {**{label: [] for label in (*PARQUET_CASES, *PARQUET_CONTROLS)},
                  "pyarrow": [], "raw_pread": []}
    for _ in range(rounds):  # the cases take turns, so that drift hits them alike
        for label, (ranks, *_) in PARQUET_CASES.items():
            case, out = _parquet_args(work, label)
            dlio(["run", *case], ranks=ranks)
            runs[label].append(_step_figures(out, ranks))
        for label, ranks in PARQUET_CONTROLS.items():
            dlio(["run", *control, f"train.computation_time={PARQUET_STEP_S}"], ranks=ranks)
            runs[label].append(_step_figures(work / "parquet-control-out", ranks))
        order, extents = _parquet_groups(work, work / "parquet-out-no_compute")
        runs["pyarrow"] += _pyarrow_loop(extents, order)
        runs["raw_pread"] += _raw_loop(work, extents, order)
    remove_dataset(args)
    remove_dataset(control)
    result = _parquet_result(runs)
    _print_parquet(result)
    return result


def _parquet_result(runs: dict) -> dict:
    """Medians over the rounds (and their range), ratios to the target and the references."""
    med = statistics.median
    cases = {}
    for label in (*PARQUET_CASES, *PARQUET_CONTROLS):
        totals = [r["overhead_us_per_step"]["total"] for r in runs[label]]
        cases[label] = {
            "overhead_us_per_step": med(totals), "range": [min(totals), max(totals)],
            "parts_us": {k: med(r["overhead_us_per_step"][k] for r in runs[label])
                         for k in runs[label][0]["overhead_us_per_step"] if k != "total"},
            "over_target": med(totals) / PARQUET_TARGET_US,
            "au_mean": med(r["au_mean"] for r in runs[label]),
            "us_per_step": med(r["us_per_step_warm_median"] for r in runs[label]),
            "batch_size": runs[label][0]["batch_size"],
            "ranks": PARQUET_CASES[label][0] if label in PARQUET_CASES
            else PARQUET_CONTROLS[label]}
    steps = runs["dlrm"][0]["steps_per_epoch"]
    ours = cases["no_compute"]["us_per_step"]
    inline = cases["no_compute_inline"]["us_per_step"]
    ref = {name: med(runs[name]) / steps * 1e6 for name in ("pyarrow", "raw_pread")}
    return {"workload": PARQUET_WORKLOAD, "files": PARQUET_FILES,
            "rows_per_file": PARQUET_ROWS, "ranks": PARQUET_RANKS,
            "computation_time": PARQUET_STEP_S, "target_us": PARQUET_TARGET_US,
            "cases": cases, "runs": runs,
            "bytes_read_per_sample": runs["dlrm"][0]["bytes_read_per_sample"],
            "bytes_transferred_per_sample": runs["dlrm"][0]["bytes_transferred_per_sample"],
            "read_us_per_step": {"dlio_mpi": ours, "dlio_mpi_inline": inline, **ref},
            "read_over_pyarrow": ours / ref["pyarrow"],
            "read_over_raw_pread": ours / ref["raw_pread"],
            "inline_over_raw_pread": inline / ref["raw_pread"]}


def _print_parquet(r: dict) -> None:
    print(f"parquet ({r['workload']} scaled: {r['files']} files x {r['rows_per_file']} rows, "
          "1 read thread a rank, page cache; "
          f"{r['bytes_read_per_sample']:.1f} bytes read a sample, "
          f"{r['bytes_transferred_per_sample']:.1f} transferred):", flush=True)
    for label, c in r["cases"].items():
        parts = ", ".join(f"{k} {v:.1f}" for k, v in c["parts_us"].items())
        print(f"  {label:17} {c['ranks']} rank(s), batch {c['batch_size']:5}: overhead "
              f"{c['overhead_us_per_step']:7.1f} us/step "
              f"({c['range'][0]:.1f}-{c['range'][1]:.1f}; {parts}), "
              f"{c['over_target']:.2f}x the {r['target_us']:g} us target; AU "
              f"{c['au_mean']:.2f} %, {c['us_per_step']:.0f} us a step", flush=True)
    us = r["read_us_per_step"]
    print(f"  read cost per step of batch {r['cases']['no_compute']['batch_size']} (no compute): "
          f"dlio-mpi {us['dlio_mpi']:.0f} us (read by the step loop's thread: "
          f"{us['dlio_mpi_inline']:.0f} us), pyarrow read_row_group loop {us['pyarrow']:.0f} us "
          f"(dlio-mpi {r['read_over_pyarrow']:.2f}x), C pread loop {us['raw_pread']:.0f} us "
          f"(dlio-mpi {r['read_over_raw_pread']:.2f}x, inline "
          f"{r['inline_over_raw_pread']:.2f}x)", flush=True)


# ------------------------------------------------------------------------------- loaders


LOADER_FILES, LOADER_BATCH, LOADER_WORKERS = 2048, 32, 2
LOADER_RECORD = 114660  # bytes: resnet50-like npz samples, 1 per file


LOADERS = ("pytorch", "tensorflow")


def _loader_run(work: Path, data: Path, engine: str, loader: str) -> dict:
    """One `dlio-mpi run` on the loaders' files: engine native (the C engine with the access
    pattern of DLIO's `loader` reader) or framework (a real torch DataLoader of LOADER_WORKERS
    workers per rank, or tf.data with LOADER_WORKERS generators); 4 epochs, no compute;
    samples/s of epochs 2-4."""
    out = work / f"loaders-{engine}-{loader}-out"
    dlio(["run", "demo", *overrides(
        dataset__data_folder=data, output__folder=out, dataset__format="npz",
        dataset__num_files_train=LOADER_FILES, dataset__record_length_bytes=LOADER_RECORD,
        dataset__record_length_bytes_stdev=0, reader__batch_size=LOADER_BATCH,
        reader__read_threads=LOADER_WORKERS, reader__data_loader=loader,
        framework=loader, reader__engine=engine, train__computation_time=0,
        train__epochs=4, workflow__generate_data="false")], timeout=1800)
    thr = summary(out)["metric"]["train_throughput_samples_per_second"]
    shutil.rmtree(out, ignore_errors=True)
    return {"samples_per_s": statistics.median(thr[1:]), "per_epoch": thr}


def bench_loaders(work: Path, with_dlio: bool = True) -> dict:
    """110 KB npz samples (1 per file, 2048 files), batch 32, 2 ranks, no compute, page cache
    warm: for each of DLIO's pytorch and tensorflow loaders, the native engine (its access
    pattern), the framework engine (the real torch DataLoader with 2 workers per rank, or
    tf.data with 2 generators) and the DLIO benchmark 2.0.0 (that loader, 2 read threads) on
    the same files; samples/s and what fidelity mode costs."""
    from importlib.util import find_spec

    missing = [extra for extra in ("torch", "tensorflow") if find_spec(extra) is None]
    if missing:  # the framework engine's extras, pinned (torch: the CPU wheel)
        sh([sys.executable, "-m", "pip", "install", "-q", f"{REPO}[{','.join(missing)}]"])
    data = work / "loaders-data"
    dlio(["generate", "demo", *overrides(
        dataset__data_folder=data, dataset__format="npz", dataset__num_files_train=LOADER_FILES,
        dataset__record_length_bytes=LOADER_RECORD, dataset__record_length_bytes_stdev=0)],
        timeout=1800)
    warm(data)
    runs: dict[str, list[dict]] = {f"{engine}_{loader}": [] for loader in LOADERS
                                   for engine in ("native", "framework")}
    for _ in range(3):  # interleaved rounds
        for name in runs:
            runs[name].append(_loader_run(work, data, *name.split("_")))
    result = {name: {"samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
                     "rounds": rs} for name, rs in runs.items()}
    if with_dlio:
        sys.path.insert(0, str(HERE))
        from dlio_reference import ensure_dlio_venv, run_dlio

        venv = ensure_dlio_venv(REPO)
        for loader in LOADERS:
            wl = {"model": "loaders_ref", "framework": loader,
                  "workflow": {"generate_data": False, "train": True},
                  "dataset": {"data_folder": str(data), "format": "npz",
                              "num_files_train": LOADER_FILES, "num_samples_per_file": 1,
                              "record_length": LOADER_RECORD},
                  "reader": {"data_loader": loader, "read_threads": LOADER_WORKERS,
                             "batch_size": LOADER_BATCH},
                  "train": {"epochs": 4, "computation_time": 0}}
            thr = run_dlio(venv, wl, 2, work / f"loaders-dlio-{loader}",
                           timeout=1800)["metric"]["train_throughput_samples_per_second"]
            result[f"dlio_2.0.0_{loader}"] = {"samples_per_s": statistics.median(thr[1:]),
                                              "per_epoch": thr}
    shutil.rmtree(data, ignore_errors=True)
    print(f"loaders: 2 ranks, {LOADER_FILES} npz files of {LOADER_RECORD:,} B, batch "
          f"{LOADER_BATCH}, {LOADER_WORKERS} workers/threads, no compute, warm (samples/s, "
          "median of epochs 2-4):", flush=True)
    for name, r in result.items():
        native = result[f"native_{name.rsplit('_', 1)[1]}"]["samples_per_s"]
        print(f"  {name:22} {r['samples_per_s']:10,.0f}  ({r['samples_per_s'] / native:.3f}x "
              "native, same loader)", flush=True)
    result["fidelity_cost"] = {loader: result[f"native_{loader}"]["samples_per_s"]
                               / result[f"framework_{loader}"]["samples_per_s"]
                               for loader in LOADERS}
    return result


# ------------------------------------------------------------------------------- startup


def _first_step_seconds(args: list[str], ranks: int, out: Path, runs: int = 3) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.time()
        dlio(args, ranks=ranks, timeout=1800)
        stats = json.loads((out / "per_epoch_stats.json").read_text())["1"]
        times.append(min(r["start"] for r in stats["per_rank"]) - t0)
    return times


def bench_startup(work: Path, million: int = 10**6) -> dict:
    """Seconds from launching mpiexec to the first training step (data already there). The
    10^6 files stay in DIR/startup-1000000-data for the next run."""
    results = {}
    data, out = work / "startup-data", work / "startup-out"
    common = ["demo", *overrides(dataset__data_folder=data, output__folder=out,
                                 train__epochs=1, train__computation_time=0)]
    dlio(["generate", *common])
    times = _first_step_seconds(["run", *common], 2, out)
    results["2_ranks"] = {"seconds": min(times), "runs": times}
    print(f"start-up to first step, 2 ranks: {min(times):.2f} s", flush=True)
    remove_dataset(common)  # 35 MB

    ranks = 64
    common = ["demo", *overrides(dataset__data_folder=work / "startup64-data",
                                 output__folder=work / "startup64-out", train__epochs=1,
                                 train__computation_time=0.001, dataset__num_files_train=512,
                                 dataset__record_length_bytes=4096, reader__read_threads=1)]
    dlio(["generate", *common])
    t0 = time.time()
    times = _first_step_seconds(["run", *common], ranks, work / "startup64-out", runs=1)
    results["64_ranks_oversubscribed"] = {"seconds_to_first_step": times[0],
                                          "seconds_total": time.time() - t0}
    print(f"start-up to first step, {ranks} ranks on {os.cpu_count()} cores: {times[0]:.2f} s "
          f"(whole run {time.time() - t0:.1f} s)", flush=True)
    remove_dataset(common)  # 305 MB

    # kept afterwards (10^6 files: about 4 GB on disk, a 4 KiB block each), since generating
    # them takes minutes: a rerun finds them and skips generation

    data, out = work / f"startup-{million}-data", work / f"startup-{million}-out"
    common = ["demo", *overrides(
        dataset__data_folder=data, output__folder=out, dataset__format="npy",
        dataset__num_files_train=million, dataset__record_length_bytes=64,
        dataset__record_length_bytes_stdev=0, dataset__num_subfolders_train=1000,
        reader__batch_size=64, train__epochs=1, train__total_training_steps=10,
        train__computation_time=0)]
    t0 = time.time()
    dlio(["generate", *common], timeout=7200)
    generated = time.time() - t0
    times = _first_step_seconds(["run", *common], 2, out)
    results[f"{million}_files"] = {"seconds": min(times), "runs": times,
                                   "generation_seconds": generated}
    print(f"start-up to first step at {million} files, 2 ranks: {min(times):.2f} s "
          f"(generation took {generated:.0f} s)", flush=True)
    return results


FIDELITY = HERE.parent / "fidelity"
SLOW_PFS_STATE = Path("/run/dlio-mpi-slow-pfs.env")


def _compare(work: Path, name: str, workload: str, data: Path, *options: str,
             prefix: str = "") -> dict:
    """scripts/fidelity/compare.py on `workload` with its data in `data`: its rows and the
    worst errors (samples/s ratio off 1, AU points)."""
    folder = work / f"fidelity-{name}"
    cmd = [sys.executable, str(FIDELITY / "compare.py"), str(FIDELITY / "workloads" / workload),
           f"dataset.data_folder={data}", "--work", str(folder), *options]
    if prefix:
        cmd += ["--prefix", prefix]
    sh(cmd)
    with open(folder / "fidelity.csv") as fp:
        rows = list(csv.DictReader(fp))
    worst = max(abs(float(r["ratio"]) - 1) for r in rows)
    points = max(abs(float(r["au_points"])) for r in rows)
    print(f"fidelity {name}: worst samples/s error {100 * worst:.1f} %, worst AU error "
          f"{points:.1f} points over {len(rows)} epochs (table: {folder / 'fidelity.md'})",
          flush=True)
    return {"rows": rows, "worst_samples_per_second_error": worst, "worst_au_points": points}


def bench_fidelity(work: Path) -> dict:
    """The calibrated emulation against the reference job (a real torch DataLoader training
    loop, the step a sleep), side by side on the same files: jpeg (imagenet transform) and npz
    (np.load), 1, 2 and 4 workers on 1 and 2 ranks, each calibrated at its own worker count
    (and the usual configuration beside it); calibrated at 2 workers, predicting 1 and 4; the
    slow tier when it is up (scripts/slow_pfs.sh up); calibrating 1,000 files. Every case
    three times, the cases taking turns (this host's speed drifts): medians."""
    results = {}
    sweep = ["--workers", "1,2,4", "--ranks", "1,2", "--epochs", "2", "--repeat", "3"]
    for fmt in ("jpeg", "npz"):
        data = work / f"fidelity-data-{fmt}"
        results[fmt] = _compare(work, fmt, f"{fmt}_vm.yaml", data, *sweep, "--baseline")
        results[f"{fmt}_across_workers"] = _compare(
            work, f"{fmt}-across", f"{fmt}_vm.yaml", data, "--calibrate-at", "2",
            "--workers", "1,4", "--ranks", "1", "--epochs", "2", "--repeat", "3")
    if SLOW_PFS_STATE.exists():
        mount = dict(line.split("=", 1) for line in SLOW_PFS_STATE.read_text().split()
                     if "=" in line).get("MOUNT", "/mnt/slow-pfs")
        results["jpeg_slow_tier"] = _compare(
            work, "jpeg-slow", "jpeg_vm.yaml", Path(mount) / "fidelity-jpeg", *sweep,
            prefix=f"{REPO / 'scripts' / 'slow_pfs.sh'} run --")
    else:
        print("fidelity on the slow tier: skipped (scripts/slow_pfs.sh up, as root, to "
              "include it)", flush=True)
    out = work / "fidelity-calibration.yaml"
    t0 = time.time()
    sh([str(Path(sys.executable).parent / "dlio-mpi"), "calibrate",
        str(FIDELITY / "workloads" / "jpeg_vm.yaml"),
        f"dataset.data_folder={work / 'fidelity-data-jpeg'}", "--workers", "2",
        "--files", "1000", "--out", str(out)])
    results["calibration_seconds_1000_jpeg"] = time.time() - t0
    print(f"calibrating 1,000 jpeg files at 2 workers: "
          f"{results['calibration_seconds_1000_jpeg']:.1f} s", flush=True)
    for fmt in ("jpeg", "npz"):  # the data compare.py generated (a rerun generates it again)
        remove_dataset([str(FIDELITY / "workloads" / f"{fmt}_vm.yaml"),
                        f"dataset.data_folder={work / f'fidelity-data-{fmt}'}"])
    return results


BENCHMARKS = {"overhead": bench_overhead, "hosts": bench_hosts, "small": bench_small,
              "trace": bench_trace, "stagein": bench_stagein, "tiers": bench_tiers,
              "large": bench_large, "mpiio": bench_mpiio, "checkpoint": bench_checkpoint,
              "burst": bench_burst, "formats": bench_formats, "parquet": bench_parquet,
              "loaders": bench_loaders, "startup": bench_startup, "fidelity": bench_fidelity}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="bench-data")
    parser.add_argument("which", nargs="*", default=list(BENCHMARKS),
                        choices=list(BENCHMARKS))
    args = parser.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.json"
    ours = {}
    for name in args.which:
        ours[name] = BENCHMARKS[name](work)
        # read again: another benchmark may have saved its figures there meanwhile
        results = json.loads(results_file.read_text()) if results_file.exists() else {}
        results_file.write_text(json.dumps({**results, **ours}, indent=2))
    print(json.dumps(ours, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
