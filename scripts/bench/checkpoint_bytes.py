"""What fresh checkpoint bytes cost (issue 32), side by side in one run:

- the generator: the C core's checkpoint stream (_core.ckpt_fill) in GB/s a core, beside the
  data files' payload stream (_core.fill_random) and a memcpy (numpy's copyto) of as much;
- checkpoint writes: 2 processes, each writing a file of --gib GiB with the C core's
  write_shard (64 MiB calls, O_DIRECT, fsync: file_per_rank's save), beside fio writing as
  many bytes in as many jobs the same way and, with --baseline, the same call from another
  checkout's build (the stamped 64 MiB block of before issue 32); each as dlio-mpi's save
  runs it (ours: its two block buffers allocated before the save, as the writer's allocate()
  does; the baseline: its buffer allocated in the call, as it was); rounds taking turns (the
  order turning, the file system synced between cases), medians;
- the emulator's share of a save, a restore and a generation, on the page cache and with
  O_DIRECT: `dlio-mpi run` of a checkpoint-only workload (2 ranks, one file of --gib GiB a
  rank) and `dlio-mpi generate` (npz), from their summary.json and printed lines.

    python scripts/bench/checkpoint_bytes.py --work ./bench-data
    python scripts/bench/checkpoint_bytes.py --work ./bench-data --baseline ../old-checkout

--work must be on a file system with O_DIRECT (not tmpfs); its files are removed afterwards.
--baseline: a checkout of dlio-mpi whose C core is built in place (python setup.py build_ext
--inplace), e.g. a `git worktree` of the commit before issue 32.
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

GiB, MiB = 1 << 30, 1 << 20
WRITER = """
import os, sys, time
from dlio_mpi import _core
path, nbytes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
if hasattr(_core, "shard_prepare"):  # as the writer's allocate() does before the first save
    _core.shard_prepare(64 << 20)    # (the baseline allocates its buffer in every call)
start = time.perf_counter()
_core.write_shard(fd, 0, nbytes, seed, 0, True, True, path)
print(time.perf_counter() - start)
os.close(fd)
"""


def generator_rates(repeats: int = 20) -> dict:
    """GB/s (10^9 B/s) of one core making 64 MiB: the checkpoint stream, the data stream,
    and a memcpy of as much."""
    import numpy as np

    from dlio_mpi import _core

    buf, src = np.empty(64 * MiB, np.uint8), np.ones(64 * MiB, np.uint8)
    cases = {"ckpt_fill": lambda i: _core.ckpt_fill(buf, i),
             "fill_random": lambda i: _core.fill_random(buf, i),
             "memcpy": lambda i: np.copyto(buf, src)}
    out = {}
    for name, act in cases.items():
        act(0)  # warm
        times = []
        for i in range(repeats):
            began = time.perf_counter()
            act(i + 1)
            times.append(time.perf_counter() - began)
        out[name] = round(64 * MiB / statistics.median(times) / 1e9, 2)
    return out


def _writes(work: Path, nbytes: int, pythonpath: str | None) -> float:
    """2 processes writing nbytes each (write_shard, O_DIRECT, fsync): GiB/s of both."""
    folder = work / "ckpt-bytes"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    flag = [] if pythonpath else ["-P"]  # -P: the installed package, not this folder
    began = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, *flag, "-c", WRITER, str(folder / f"r{r}"),
                               str(nbytes), str(r + 7)], env=env, stdout=subprocess.PIPE,
                              text=True) for r in range(2)]
    for p in procs:
        if p.wait() != 0:
            sys.exit("checkpoint_bytes: a writer failed")
    seconds = time.perf_counter() - began
    shutil.rmtree(folder, ignore_errors=True)
    return 2 * nbytes / GiB / seconds


def _fio(work: Path, nbytes: int) -> float:
    folder = work / "ckpt-bytes-fio"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    res = subprocess.run(["fio", "--output-format=json", "--group_reporting", "--name=ck",
                          f"--directory={folder}", "--rw=write", "--direct=1", "--bs=64M",
                          f"--size={nbytes}", "--numjobs=2", "--end_fsync=1",
                          "--ioengine=psync", "--fallocate=none"],
                         capture_output=True, text=True, check=True)
    shutil.rmtree(folder, ignore_errors=True)
    return json.loads(res.stdout)["jobs"][0]["write"]["bw_bytes"] / GiB


def write_rates(work: Path, nbytes: int, baseline: str | None, rounds: int) -> dict:
    fio = shutil.which("fio") is not None
    runs: dict[str, list[float]] = {"ours": [], **({"fio": []} if fio else {}),
                                    **({"baseline": []} if baseline else {})}
    cases = {"ours": lambda: _writes(work, nbytes, None), "fio": lambda: _fio(work, nbytes),
             "baseline": lambda: _writes(work, nbytes, baseline)}
    names = list(runs)
    for round_ in range(rounds):  # the order turns each round: none always follows another
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            os.sync()  # the previous case's removed files settled first
            time.sleep(1)
            runs[name].append(cases[name]())
    med = {k: statistics.median(v) for k, v in runs.items()}
    out = {f"{k}_GiB_per_s": round(v, 3) for k, v in med.items()}
    out |= {f"{k}_runs": [round(x, 3) for x in v] for k, v in runs.items()}
    if fio:
        out["ours_over_fio"] = round(med["ours"] / med["fio"], 3)
    if baseline:
        out["ours_over_baseline"] = round(med["ours"] / med["baseline"], 3)
    return out


def _dlio(args: list[str]) -> str:
    res = subprocess.run([str(Path(sys.executable).parent / "mpiexec"), "-n", "2",
                          sys.executable, "-P", "-m", "dlio_mpi", *args],
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"checkpoint_bytes: dlio-mpi {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return res.stdout


def phase_shares(work: Path, nbytes: int) -> dict:
    """The emulator's share of saves, restores and a generation, page cache and O_DIRECT."""
    out = {}
    for odirect in ("false", "true"):
        folder, results = work / "ckpt-bytes-runs", work / "ckpt-bytes-out"
        _dlio(["run", "llama_7b_zero3", "model.type=flat", f"model.model_size_bytes={nbytes}",
               "model.num_layers=0", "model.parallelism.zero_stage=1",
               f"checkpoint.checkpoint_folder={folder}", f"output.folder={results}",
               f"checkpoint.odirect={odirect}", "checkpoint.num_checkpoints_write=3",
               "checkpoint.num_checkpoints_read=3", "checkpoint.time_between_checkpoints=0"])
        summary = json.loads((results / "summary.json").read_text())
        for kind, figures in summary["dlio_mpi"]["checkpoint"]["time_split"].items():
            out[f"{kind}_{'odirect' if odirect == 'true' else 'page_cache'}"] = figures
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(results, ignore_errors=True)
    data = work / "ckpt-bytes-data"
    text = _dlio(["generate", "demo", f"dataset.data_folder={data}",
                  "dataset.num_files_train=512"])
    found = re.search(r"the emulator's ([\d.]+) s \(([\d.]+) %", text)
    out["generation_npz_page_cache"] = {"emulator_share": float(found.group(2)) / 100,
                                        "line": text.strip().splitlines()[-1]}
    shutil.rmtree(data, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--gib", type=float, default=2.0, help="GiB a process writes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("fio") is None:
        print("fio not found (apt-get install fio): no fio reference", flush=True)
    nbytes = int(args.gib * GiB) // MiB * MiB
    result = {"generator_GB_per_s_a_core": generator_rates()}
    print(json.dumps(result), flush=True)
    result["writes_odirect_fsync"] = write_rates(args.work, nbytes, args.baseline, args.rounds)
    print(json.dumps(result["writes_odirect_fsync"]), flush=True)
    result["emulator_share"] = phase_shares(args.work, nbytes)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
