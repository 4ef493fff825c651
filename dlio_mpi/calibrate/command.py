"""dlio-mpi calibrate: run the real training pipeline of a workload once, in this process
(no MPI), measure what its loader costs, and write the workload with the emulator's model of
those costs set, so that `dlio-mpi run FILE.yaml` stands for the real job.

Steps: the workload's first N training files; the Dataset (the user's MODULE:CALLABLE or a
built-in one); a torch DataLoader as the job's (batch, W workers, prefetch, pin_memory);
one pass starting the workers and warming the page cache, then PASSES warm data-bound passes
measured (measure.py; each cost their median) and a paced pass for the batches' hand-over;
the emulator's own read of the same samples, measured in this process
(its CPU time is taken off the workers', since the emulator reads for real); with --model, a
training step timed on the device. Bad input is refused with one message, exit status 2,
before any file of the dataset is read."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib.util import find_spec

import numpy as np

from ..errors import UserError, install_hint

PASSES = 3           # warm passes measured (each cost: the median over them)
HANDOVER_SECONDS = 3.0  # the paced pass measuring the batches' hand-over ...
HANDOVER_STEPS = 10     # ... at least this many steps (the first two left out)
LONE_SAMPLES = 64    # items timed alone for the usual practice's figure
DEFAULT_FILES = 1000
SEED = 20261126


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlio-mpi calibrate",
        description="Measure a workload's real torch DataLoader pipeline in this process and "
                    "write the workload with the emulator's model of its costs (no MPI).")
    p.add_argument("args", nargs="*", metavar="WORKLOAD|KEY=VALUE")
    p.add_argument("--workers", type=int, required=True, metavar="W",
                   help="DataLoader worker processes, as in the real job")
    p.add_argument("--files", type=int, default=DEFAULT_FILES, metavar="N",
                   help=f"the first N training files (default {DEFAULT_FILES}, or all)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--dataset", metavar="MODULE:CALLABLE",
                     help="your Dataset: CALLABLE(files) returns a torch Dataset whose item i "
                          "is made from files[i]")
    how.add_argument("--transform", choices=("imagenet", "none"),
                     help="a built-in Dataset (default: imagenet for jpeg and png, else none)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--compute-time", type=float, metavar="S",
                      help="the accelerator's step time in seconds (default: the workload's "
                           "train.computation_time)")
    step.add_argument("--model", metavar="MODULE:CALLABLE",
                      help="time a training step of this torch module on --device")
    p.add_argument("--device", default="cpu", help="cpu or cuda (with --model)")
    p.add_argument("--out", required=True, metavar="FILE.yaml",
                   help="the calibrated workload to write")
    return p


def check_arguments(args) -> None:
    """Refuse bad options (UserError), before anything is read."""
    if args.workers < 0:
        raise UserError(f"--workers {args.workers}: expected 0 or more worker processes")
    if args.files < 1:
        raise UserError(f"--files {args.files}: expected at least 1 file")
    if args.compute_time is not None and not args.compute_time >= 0:
        raise UserError(f"--compute-time {args.compute_time}: expected seconds >= 0")
    if args.device != "cpu" and not args.model:
        raise UserError(f"--device {args.device}: it is where --model's step is timed; give "
                        "--model MODULE:CALLABLE too")
    if find_spec("torch") is None:
        raise UserError("dlio-mpi calibrate runs a real torch DataLoader, but torch is not "
                        f"installed; install it with {install_hint('torch')} (the CPU build)")
    from .output import check_out_path

    check_out_path(args.out)


def main(argv: list[str]) -> int:
    """The command; its exit status (2 for bad input, printed once)."""
    args = parser().parse_intermixed_args(argv)
    try:
        check_arguments(args)
        result = calibrate(args)
    except UserError as exc:
        print(f"dlio-mpi calibrate: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:  # reading the dataset failed: what and where, once
        from ..errors import describe

        print(f"dlio-mpi calibrate: error: {describe(exc)}", file=sys.stderr, flush=True)
        return 1
    print("\n".join(result), flush=True)
    return 0


def workload_files(args):
    """(config, source, overrides, the train split's files, the paths of its first
    args.files files) of the workload args.args names (UserError if it cannot be used)."""
    from ..config import ConfigError, load_config, split_args
    from ..data.catalog import locate_split_here
    from ..plan.derive import derive_plan

    source, overrides = split_args(args.args)
    try:
        cfg = load_config(source, overrides)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    plan = derive_plan(cfg, 1)
    if "train" not in plan.splits:
        raise UserError("the workload trains on nothing (workflow.train: false, or no "
                        "training files): calibration measures the training loader")
    check_emulated_by_native(cfg, plan.library_read)
    files = locate_split_here(cfg, plan.splits["train"])
    count = min(args.files, files.count)
    if count < cfg.reader.batch_size:
        raise UserError(f"--files {args.files}: {count} file(s) make no batch of "
                        f"reader.batch_size={cfg.reader.batch_size}; give more files")
    return cfg, source, overrides, files, [files.path(i) for i in range(count)]


def check_emulated_by_native(cfg, library_read: str) -> None:
    """The calibrated model is spent by the native C engine (reader.preprocess_cpu_time,
    reader.startup_time): refuse a workload whose reads another backend makes, before any
    measurement."""
    from dataclasses import replace
    from types import SimpleNamespace

    from ..config import TimeSpec
    from ..readers import loader_cost_refusal

    modelled = replace(cfg.reader, engine="native", preprocess_cpu_time=TimeSpec(
        "constant", (0.001,)))
    why = loader_cost_refusal(SimpleNamespace(reader=modelled), library_read)
    if why:
        raise UserError(f"the calibrated workload could not run: {why}")


def job_dataset(args, cfg, files, paths):
    """(the job's Dataset over `paths`: args.dataset's, or a built-in one; its name)."""
    from ..data.dataset import decoded_item
    from ..formats import format_for
    from .datasets import builtin_dataset, default_transform, user_dataset

    if args.dataset:
        return user_dataset(args.dataset, paths), f"--dataset {args.dataset}"
    fmt = format_for(cfg.dataset)
    transform = args.transform or default_transform(fmt)
    return (builtin_dataset(transform, paths, fmt,
                            files.sample_layout == "last_axis", decoded_item(cfg)),
            f"--transform {transform}")


def calibrate(args) -> list[str]:
    """Measure and write (see the module); the lines to print."""
    from . import model_step
    from .output import write_calibrated

    if args.device != "cpu" or args.model:
        model_step.check_device(args.device)
    cfg, source, overrides, files, paths = workload_files(args)
    model = model_step.load_model(args.model) if args.model else None
    dataset, named = job_dataset(args, cfg, files, paths)
    try:
        loader = measure_loader(cfg, files, dataset, args.workers)
    except (OSError, UserError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's Dataset failed in the loader
        # a worker's failure comes back with the worker's traceback: its last line says it
        last = (str(exc).strip().splitlines() or [""])[-1]
        said = last if last.startswith(f"{type(exc).__name__}:") else \
            f"{type(exc).__name__}: {last}"
        raise UserError(f"the DataLoader over {named} failed: {said}") from None
    step = None
    if model is not None:
        step = model_step.time_training_step(model, first_batch(dataset, cfg.reader.batch_size),
                                             args.device)
    compute = step.step_seconds if step else args.compute_time
    lines = _what_ran(cfg, args, named, len(paths), step)
    from .model import report_lines

    lines += report_lines(loader)
    written = write_calibrated(args.out, source, overrides, args.workers, loader, compute,
                               lines)
    return [*lines, f"model: {written['model']}", f"written: {args.out} (run it with: "
            f"mpiexec -n RANKS dlio-mpi run {args.out})"]


def _what_ran(cfg, args, named: str, files: int, step) -> list[str]:
    import torch

    from .. import __version__

    lines = [f"dlio-mpi {__version__} calibrate on {platform.node()} ({os.cpu_count()} CPUs, "
             f"{platform.processor() or platform.machine()}), torch {torch.__version__}, "
             f"Python {platform.python_version()}",
             f"pipeline: {named} over the first {files} {cfg.dataset.format} training files of "
             f"{cfg.dataset.data_folder}, batch {cfg.reader.batch_size}, {args.workers} worker(s) "
             f"({cfg.reader.multiprocessing_context}), reader.prefetch_size "
             f"{cfg.reader.prefetch_size}"]
    if step is not None:
        lines.append(f"training step of --model {args.model} on {step.device}: "
                     f"{step.step_seconds * 1e3:.2f} ms (median of {step.steps})")
    return lines


def first_batch(dataset, batch_size: int):
    """The Dataset's first batch_size items, collated as the DataLoader collates them."""
    from torch.utils.data import default_collate

    return default_collate([dataset[i] for i in range(min(batch_size, len(dataset)))])


def measure_loader(cfg, files, dataset, workers: int):
    """The loader's model (model.LoaderModel), measured as the module says."""
    from ..readers.base import batches_in_flight
    from .measure import LoaderProbe, lone_item_seconds
    from .model import derive

    rd = cfg.reader
    rng = np.random.default_rng(SEED)
    n = len(dataset)
    flight = batches_in_flight("pytorch", rd.prefetch_size, workers)
    with LoaderProbe(dataset, rd.batch_size, workers, rd.prefetch_size, rd.pin_memory,
                     rd.multiprocessing_context) as probe:
        first = probe.run(rng.permutation(n))  # starts the workers, warms the page cache
        lone = lone_item_seconds(dataset, rng.permutation(n)[:LONE_SAMPLES])
        passes = [probe.run(rng.permutation(n)) for _ in range(PASSES)]
        # the hand-over, with the loader ahead: steps at twice the data-bound batch period,
        # HANDOVER_SECONDS of them (HANDOVER_STEPS at least)
        period = 2 * sum(p.wall_s for p in passes) / sum(p.steps for p in passes)
        steps = max(HANDOVER_STEPS, min(int(HANDOVER_SECONDS / period), n // rd.batch_size))
        waits = probe.handover(rng.permutation(n)[:steps * rd.batch_size], period)
    read = emulator_read_cost(cfg, files, n)
    return derive(first, passes, workers, rd.batch_size, flight, read, lone, waits)


def emulator_read_cost(cfg, files, count: int):
    """The emulator's native engine reading the first `count` files' first samples as the
    workload's loader reads them (warm, one reader thread): CPU time and reads per sample."""
    from dataclasses import replace

    from ..readers import REGISTRY, resolve_read_mode
    from ..readers.native import NativeReader
    from ..sampling.requests import access_policy, loader_inputs, plan_reads
    from .measure import self_cpu_s
    from .model import ReadCost

    split = files.split
    policy = access_policy(cfg.reader, split, *loader_inputs(split.format, files.path(0)))
    ids = np.arange(count, dtype=np.int64) * split.samples_per_file
    plan = plan_reads(ids, count, 1, split.samples_per_file, files.layouts,
                      resolve_read_mode(cfg), policy)
    options = REGISTRY["multi"].options(cfg, 0)  # the native C engine's
    reader = NativeReader(files, replace(options, read_threads=1, in_flight=2,
                                         drop_page_cache=False, startup_ns=0, trace=False))
    try:
        for _ in range(2):  # the first warms the page cache for these files
            before, cpu = reader.counters(), self_cpu_s()
            reader.prepare_epoch(plan)
            reader.start_epoch(plan)
            while reader.next_batch() is not None:
                pass
            reader.end_epoch()
            cpu, after = self_cpu_s() - cpu, reader.counters()
    finally:
        reader.close()
    per = {k: (after[k] - before[k]) / count for k in ("bytes_read", "read_ops", "opens")}
    return ReadCost(cpu / count, per["bytes_read"], per["read_ops"], per["opens"])

