#!/usr/bin/env python3
"""Run the DLIO benchmark 2.0.0 (PyPI `dlio-benchmark==2.0.0`) as the reference on the same files.

`ensure_dlio_venv(repo)` makes `<repo>/.venv-dlio` once: CPU torch 2.13.0 (pinned to the `+cpu`
wheel by a constraints file, so pip can never swap in a CUDA build), tensorflow-cpu (imported
unconditionally by `dlio_benchmark.main` through `profiler/tf_profiler.py`), pydftracer 1.0.2,
hydra-core, omegaconf, pandas, psutil, mpi4py and the `mpich` wheel (same MPI as dlio-mpi, and
`.venv-dlio/bin/mpiexec`), then `dlio-benchmark==2.0.0 --no-deps` (its declared dependencies
pull `tensorflow`, `torchvision`, `torchaudio` and `nvidia-dali-cuda110`, none used here).

`run_dlio(venv, workload, ranks, out_dir)` writes `<out_dir>/config/workload/<model>.yaml` and runs
  mpiexec -n R <venv>/bin/dlio_benchmark --config-dir <out_dir>/config workload=<model>
      ++hydra.run.dir=<out_dir>/hydra ++workload.output.folder=<out_dir>/output
with DFTRACER_ENABLE=0, then returns `<out_dir>/output/summary.json` (none for generate-only).

Keys DLIO 2.0.0 reads (`dlio_benchmark/utils/config.py:LoadConfig`; any other key is ignored
silently):
  model (a plain string), framework (tensorflow|pytorch)
  workflow: generate_data, train (false = generate only), evaluation, checkpoint, profiling, debug
  dataset: data_folder, format, num_files_train, num_files_eval, num_samples_per_file,
    record_length, record_length_stdev, record_length_resize, num_subfolders_train,
    num_subfolders_eval, file_prefix, keep_files, compression, compression_level,
    enable_chunking, chunk_size, generation_buffer_size
    (NOT record_length_bytes / record_length_bytes_stdev / record_dims: later-DLIO names)
  reader (or data_reader): data_loader, read_threads, batch_size, batch_size_eval, prefetch_size,
    sample_shuffle, file_shuffle, shuffle_size, read_type, file_access, transfer_size,
    dont_use_mmap, multiprocessing_context, preprocess_time, preprocess_time_stdev,
    computation_threads (read, never used), data_loader_classname, data_loader_sampler,
    reader_classname
  train: epochs, computation_time, computation_time_stdev, total_training_steps, seed,
    seed_change_epoch
  evaluation: eval_time, eval_time_stdev, eval_after_epoch, epochs_between_evals
  checkpoint: checkpoint_folder, checkpoint_after_epoch, epochs_between_checkpoints,
    steps_between_checkpoints, type, model_size, optimization_groups, num_layers,
    layer_parameters, tensor_parallelism, pipeline_parallelism, checkpoint_mechanism_classname
  storage: storage_type, storage_root;  output: folder, log_file;  metric: au
  profiling: profiler, iostat_devices
Quirks of 2.0.0 worth knowing:
- Generated samples are int(sqrt(record_length))**2 bytes (114660 -> 338x338 = 114244 B); npz files
  hold x (dim, dim, samples_per_file) uint8 and y; the npz reader np.load()s the whole 'x' of the
  file for each sample, takes x[..., i] and hands the loader a fixed random image instead.
- Steps per epoch = floor(files * samples_per_file / batch_size / ranks); with more files on disk
  than num_files_train the sorted first num_files_train are used (a warning); fewer is an error.
- Throughput per epoch = sum over ranks of batches * batch_size / epoch time (the first step, which
  forks the read workers, included); AU = compute time / (epoch time - first step).
- Hydra (version_base=None) chdirs into hydra.run.dir: relative data paths resolve there, so
  run_dlio makes dataset.data_folder absolute.
- A generate-only run (workflow.train false) writes no summary.json.

CLI (data under --work, e.g. /work/bench-dlio):
  python scripts/bench/dlio_reference.py --work DIR [setup] [threads] [au] [interop]
threads: 4096 npz files of 1 x 114660 B (DLIO's generator, 2 ranks), then pytorch loader,
  read_threads 1/2/4, batch 400, computation_time 0, 2 epochs, 2 ranks: samples/s of epoch 2.
au: computation_time 0.224, batch 400, files = ranks*400*4 (4 steps per rank and epoch), ranks
  1, 2, 4, ... until AU < 90 %.  interop: DLIO reads npz files written by `dlio-mpi generate`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

DLIO = "dlio-benchmark==2.0.0"
# Installed before DLIO (which goes in with --no-deps). torch is pinned by the constraints file.
REQUIREMENTS = ["torch==2.13.0", "tensorflow-cpu==2.21.0", "pydftracer==1.0.2", "mpi4py>=4.0",
                "mpich>=4.2", "hydra-core>=1.3.2", "omegaconf>=2.2.0", "pandas", "psutil",
                "PyYAML", "numpy"]
CONSTRAINTS = "torch==2.13.0+cpu\n"  # the CPU wheel, never a CUDA one
CHECK = ("import importlib.metadata as m, torch, dlio_benchmark.main\n"
         "assert torch.version.cuda is None, torch.__version__\n"
         "bad = [d.metadata['Name'] for d in m.distributions()\n"
         "       if d.metadata['Name'].lower().startswith('nvidia')]\n"
         "assert not bad, bad\n")
RECORD = 114660  # resnet50-like sample size (bytes)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).splitlines()[-30:])
        raise RuntimeError(f"failed ({res.returncode}): {' '.join(cmd)}\n{tail}")
    return res


def ensure_dlio_venv(repo: Path) -> Path:
    """Make `<repo>/.venv-dlio` with DLIO 2.0.0 and what it imports (once); return its path."""
    venv = Path(repo).resolve() / ".venv-dlio"
    stamp = venv / ".dlio-reference"
    want = "\n".join([*REQUIREMENTS, DLIO, CONSTRAINTS])
    if stamp.exists() and stamp.read_text() == want:
        return venv
    if not (venv / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    (venv / "constraints.txt").write_text(CONSTRAINTS)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check", "-c", str(venv / "constraints.txt")]
    _run([*pip, *REQUIREMENTS])
    _run([*pip, "--no-deps", DLIO])
    _run([str(venv / "bin" / "python"), "-c", CHECK], env={**os.environ, "DFTRACER_ENABLE": "0"})
    stamp.write_text(want)
    return venv


def dlio_command(venv: Path, name: str, ranks: int, out_dir: Path) -> list[str]:
    bin_ = venv / "bin"
    return [str(bin_ / "mpiexec"), "-n", str(ranks), str(bin_ / "dlio_benchmark"),
            "--config-dir", str(out_dir / "config"), f"workload={name}",
            f"++hydra.run.dir={out_dir / 'hydra'}",
            f"++workload.output.folder={out_dir / 'output'}"]


def run_dlio(venv: Path, workload: dict, ranks: int, out_dir: Path,
             timeout: float = 1800) -> dict:
    """Run DLIO on `workload` (a DLIO 2.0.0 workload mapping) with `ranks` MPI ranks; return its
    summary.json ({} for a generate-only run). DLIO's stdout/stderr go to <out_dir>/dlio.*.txt."""
    out_dir = Path(out_dir).resolve()
    name = str(workload.get("model", "reference"))
    workload = json.loads(json.dumps(workload))  # deep copy
    dataset = workload.setdefault("dataset", {})
    dataset["data_folder"] = str(Path(dataset.get("data_folder", "data")).resolve())
    (out_dir / "config" / "workload").mkdir(parents=True, exist_ok=True)
    (out_dir / "config" / "workload" / f"{name}.yaml").write_text(
        yaml.safe_dump(workload, sort_keys=False))
    shutil.rmtree(out_dir / "output", ignore_errors=True)
    cmd = dlio_command(Path(venv), name, ranks, out_dir)
    with open(out_dir / "dlio.stdout.txt", "w") as so, open(out_dir / "dlio.stderr.txt", "w") as se:
        proc = subprocess.Popen(cmd, cwd=out_dir, stdout=so, stderr=se, start_new_session=True,
                                env={**os.environ, "DFTRACER_ENABLE": "0"})
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and its ranks: our own process group
            proc.wait()
            rc = f"timeout after {timeout} s"
    summary = out_dir / "output" / "summary.json"
    if rc == 0 and summary.exists():
        return json.loads(summary.read_text())
    if rc == 0 and not workload.get("workflow", {}).get("train", True):
        return {}
    tail = "\n".join((out_dir / "dlio.stderr.txt").read_text().splitlines()[-25:])
    raise RuntimeError(f"DLIO failed ({rc}): {' '.join(cmd)}\n{tail}")


def workload(data: Path, files: int, *, batch: int = 400, threads: int = 1,
             compute: float = 0.0, epochs: int = 2, generate: bool = False) -> dict:
    """A resnet50-like npz workload (1 sample of RECORD bytes per file, pytorch loader)."""
    return {"model": "resnet50_ref", "framework": "pytorch",
            "workflow": {"generate_data": generate, "train": not generate},
            "dataset": {"data_folder": str(data), "format": "npz", "num_files_train": files,
                        "num_samples_per_file": 1, "record_length": RECORD},
            "reader": {"data_loader": "pytorch", "read_threads": threads, "batch_size": batch},
            "train": {"epochs": epochs, "computation_time": compute}}


def generate(venv: Path, data: Path, files: int, out: Path) -> None:
    """DLIO's own npz generator on 2 ranks, unless the files are already there."""
    if len(list((data / "train").glob(f"*_of_{files}.npz"))) != files:
        shutil.rmtree(data, ignore_errors=True)
        run_dlio(venv, workload(data, files, generate=True), 2, out)


def timed(label: str, results: dict, fn, *args):
    t0 = time.monotonic()
    try:
        return fn(*args)
    finally:
        results.setdefault("wall_s", {})[label] = round(time.monotonic() - t0, 1)


def step_threads(venv: Path, work: Path, results: dict) -> None:
    files, batch, ranks = 4096, 400, 2
    assert files // batch // ranks >= 2
    data = work / "resnet50" / "data"
    timed("threads: generate 4096 files", results, generate, venv, data, files,
          work / "resnet50" / "gen")
    out = results.setdefault("threads", {})
    for threads in (1, 2, 4):
        s = timed(f"threads: read_threads={threads}", results, run_dlio, venv,
                  workload(data, files, batch=batch, threads=threads), ranks,
                  work / "resnet50" / f"rt{threads}")
        per_epoch = s["metric"]["train_throughput_samples_per_second"]
        out[threads] = {"samples_per_s_warm": per_epoch[-1], "per_epoch": per_epoch}
        print(f"read_threads={threads}: {per_epoch[-1]:.0f} samples/s (epoch 2; epochs: "
              f"{', '.join(f'{x:.0f}' for x in per_epoch)})", flush=True)


def step_au(venv: Path, work: Path, results: dict, max_ranks: int, threads: int) -> None:
    out = results.setdefault("au", {})
    ranks = 1
    while ranks <= max_ranks:
        files = ranks * 400 * 4
        data, root = work / "au" / "data", work / "au" / f"r{ranks}"
        timed(f"au: generate {files} files", results, generate, venv, data, files, root / "gen")
        s = timed(f"au: ranks={ranks}", results, run_dlio, venv,
                  workload(data, files, threads=threads, compute=0.224), ranks, root)
        au = s["metric"]["train_au_percentage"]
        out[ranks] = {"au_warm": au[-1], "au_per_epoch": au,
                      "samples_per_s": s["metric"]["train_throughput_samples_per_second"]}
        print(f"ranks={ranks}: AU {au[-1]:.1f} % (epoch 2; epochs: "
              f"{', '.join(f'{x:.1f}' for x in au)})", flush=True)
        if au[-1] < 90:
            break
        ranks *= 2
    shutil.rmtree(work / "au" / "data", ignore_errors=True)


def step_interop(venv: Path, repo: Path, work: Path, results: dict) -> None:
    data, files = work / "interop" / "data", 64
    shutil.rmtree(data, ignore_errors=True)
    main = repo / ".venv" / "bin"
    timed("interop: dlio-mpi generate", results, _run,
          [str(main / "mpiexec"), "-n", "2", str(main / "dlio-mpi"), "generate", "demo",
           f"dataset.data_folder={data}", "dataset.format=npz",
           f"dataset.num_files_train={files}", f"dataset.record_length_bytes={RECORD}",
           "dataset.record_length_bytes_stdev=0", "dataset.sample_layout=last_axis"])
    names = sorted(p.name for p in (data / "train").glob("*.npz"))
    attempts = []
    for mkdir_valid in (False, True):  # DLIO 2.0.0 lists <data>/valid even with no eval files
        if mkdir_valid:
            (data / "valid").mkdir(exist_ok=True)
        try:
            s = timed(f"interop: DLIO run (valid/ made: {mkdir_valid})", results, run_dlio, venv,
                      workload(data, files, batch=4, epochs=1), 2, work / "interop")
            rate = s["metric"]["train_throughput_samples_per_second"][0]
            attempts.append({"valid_dir_made": mkdir_valid, "works": True,
                             "note": f"{rate:.0f} samples/s"})
            break
        except RuntimeError as e:
            errors = [ln for ln in str(e).splitlines() if "Error:" in ln or "Exception:" in ln]
            attempts.append({"valid_dir_made": mkdir_valid, "works": False,
                             "note": (errors or str(e).splitlines())[-1]})
    results["interop"] = {"files": len(names), "first": names[:1], "attempts": attempts}
    for a in attempts:
        print(f"DLIO on dlio-mpi npz files ({len(names)} files, {names[0]}..), valid/ made: "
              f"{a['valid_dir_made']}: {'works' if a['works'] else 'FAILS'}: {a['note']}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="data and outputs (outside the repo)")
    parser.add_argument("--max-ranks", type=int, default=16, help="cap for the AU procedure")
    parser.add_argument("--au-read-threads", type=int, default=4)
    parser.add_argument("which", nargs="*", default=["setup", "threads", "au", "interop"])
    args = parser.parse_args()
    repo, work = Path(__file__).resolve().parents[2], Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    venv = timed("setup: ensure_dlio_venv", results, ensure_dlio_venv, repo)
    print(f"DLIO venv: {venv}", flush=True)
    if "threads" in args.which:
        step_threads(venv, work, results)
    if "au" in args.which:
        step_au(venv, work, results, args.max_ranks, args.au_read_threads)
    if "interop" in args.which:
        step_interop(venv, repo, work, results)
    for label, secs in results["wall_s"].items():
        print(f"wall {secs:8.1f} s  {label}")
    (work / "dlio_results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
