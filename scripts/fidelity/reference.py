"""The reference job: a real PyTorch data-parallel training loop over a workload's dataset
files, one process per rank under mpiexec, for holding dlio-mpi's predictions against.

Each rank: the workload's training files (all of them), each epoch's seeded permutation of
them dealt round-robin to the ranks (DistributedSampler's way, the same number of full batches
on every rank), a real torch.utils.data.DataLoader over its share (the Dataset: --dataset
MODULE:CALLABLE, or a built-in --transform; the workload's batch size, --workers worker
processes started once and kept, DLIO's prefetch_factor, pin_memory), and per step: take the
batch, the accelerator's step, a barrier with the other ranks (the gradient allreduce's
synchronisation). The step is real (--model MODULE:CALLABLE on --device: forward, backward,
optimizer step; the batch copied to the device, waited for) or stood in by a sleep of
--step-time seconds (default: the workload's train.computation_time): a GPU step costs the
host no CPU. The barrier naps while it waits (MPI_Ibarrier tested every NAP_SECONDS): the
gradient allreduce of a GPU job runs on the GPUs, and a barrier spinning on the host (MPICH's
blocking one) would take cores from the loader's workers that the real job leaves them.

Measured as dlio-mpi measures itself (dlio_mpi.metrics.au.block_metrics, DLIO's formulas): per
rank and epoch, samples/s = steps x batch over the epoch's wall time (from the loader's start
to the last step's end) and AU = the steps' compute from step 1 over the epoch's time less step
0's wait and compute; the job's samples/s is the ranks' sum, its AU their mean. Rank 0 prints
one line per epoch and writes --out (JSON).

    mpiexec -n 2 python scripts/fidelity/reference.py WORKLOAD [KEY=VALUE ...] --workers 2 \\
        --out ref.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from dlio_mpi.calibrate.command import job_dataset, workload_files
from dlio_mpi.calibrate.datasets import EpochSampler, make_loader
from dlio_mpi.calibrate.measure import process_cpu_ns, self_cpu_s
from dlio_mpi.errors import UserError
from dlio_mpi.metrics.au import block_metrics


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="*", metavar="WORKLOAD|KEY=VALUE")
    p.add_argument("--workers", type=int, required=True)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--dataset", metavar="MODULE:CALLABLE")
    how.add_argument("--transform", choices=("imagenet", "none"))
    step = p.add_mutually_exclusive_group()
    step.add_argument("--step-time", type=float, metavar="S")
    step.add_argument("--model", metavar="MODULE:CALLABLE")
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=None, help="default: train.epochs")
    p.add_argument("--out", default=None, metavar="FILE.json")
    args = p.parse_intermixed_args(argv)
    args.files = 1 << 62  # every training file
    return args


NAP_SECONDS = 50e-6


def barrier(comm) -> None:
    """Wait for every rank without spinning on a core (see the module)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(NAP_SECONDS)


def shard(epoch: int, seed: int, files: int, rank: int, ranks: int, take: int) -> np.ndarray:
    """This rank's items of the epoch: the epoch's permutation dealt round-robin."""
    order = np.random.default_rng([seed, epoch]).permutation(files)
    return order[rank::ranks][:take]


class Step:
    """The accelerator's step: a sleep of `seconds`, or a real training step of a model."""

    def __init__(self, seconds: float, model=None, device: str = "cpu") -> None:
        self.seconds, self.model, self.device = seconds, model, device
        if model is not None:
            import torch

            self.torch = torch
            self.model = model.to(device).train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def warm_up(self, dataset, batch_size: int, steps: int = 3) -> None:
        """A real model's first steps (cuDNN's autotuning, the allocator's growth) before the
        epochs' clock: they are the model's start-up, not the loader's."""
        if self.model is None:
            return
        from dlio_mpi.calibrate.command import first_batch

        batch = first_batch(dataset, batch_size)
        for _ in range(steps):
            self(batch)

    def __call__(self, batch) -> float:
        """Run the step; its compute seconds (the planned sleep, or the step measured)."""
        if self.model is None:
            deadline = time.perf_counter() + self.seconds
            while (left := deadline - time.perf_counter()) > 0:
                time.sleep(left)
            return self.seconds
        from dlio_mpi.calibrate.model_step import _inputs, _loss

        torch, start = self.torch, time.perf_counter()
        inputs, labels = _inputs(batch)
        inputs = inputs.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True) if labels is not None else None
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                            enabled=self.device == "cuda"):
            loss = _loss(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start


def run_epoch(comm, loader, sampler, order: np.ndarray, steps: int, step: Step,
              batch: int, exclude: tuple[int, int]) -> dict:
    """One epoch on this rank: its metrics as dlio-mpi computes its own."""
    sampler.start(order)
    comm.Barrier()
    start, began = time.perf_counter(), time.time()
    main_cpu = self_cpu_s()
    batches = iter(loader)  # the loader's start: persistent workers start at the first
    workers = [w.pid for w in getattr(batches, "_workers", [])]
    worker_cpu = sum(process_cpu_ns(pid) for pid in workers)
    wait, compute, planned, sync = (np.zeros(steps) for _ in range(4))
    last = start
    for i in range(steps):
        data = next(batches)
        got = time.perf_counter()
        planned[i] = step(data)
        computed = time.perf_counter()
        barrier(comm)
        synced = time.perf_counter()
        wait[i], compute[i], sync[i] = got - last, computed - got, synced - computed
        last = synced
    main_cpu = self_cpu_s() - main_cpu
    worker_cpu = (sum(process_cpu_ns(pid) for pid in workers) - worker_cpu) / 1e9
    for _ in batches:  # drop_last keeps nothing more; let the iterator end as a loop's would
        pass
    m = block_metrics(wait, compute, planned, sync, last - start, batch, *exclude)
    return {"samples_per_second": m.samples_per_second, "au_percentage": m.au_percentage,
            "seconds": last - start, "start": began, "end": began + (last - start),
            "wait_seconds": float(wait.sum()),
            "compute_seconds": float(compute.sum()), "sync_seconds": float(sync.sum()),
            "main_cpu_seconds": main_cpu, "worker_cpu_seconds": worker_cpu}


def main(argv: list[str]) -> int:
    args = parse(argv)
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    try:
        cfg, _, _, files, paths = workload_files(args)
        dataset, named = job_dataset(args, cfg, files, paths)
        model = None
        if args.model:
            from dlio_mpi.calibrate.model_step import check_device, load_model

            check_device(args.device)
            model = load_model(args.model)
    except UserError as exc:
        if rank == 0:
            print(f"reference.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    rd = cfg.reader
    seconds = args.step_time if args.step_time is not None else cfg.train.computation_time.mean
    step = Step(seconds, model, args.device)
    step.warm_up(dataset, cfg.reader.batch_size)
    steps = len(paths) // ranks // rd.batch_size
    sampler = EpochSampler()
    loader = make_loader(dataset, sampler, rd.batch_size, args.workers, rd.prefetch_size,
                         rd.pin_memory, rd.multiprocessing_context)
    exclude = (cfg.output.metric.exclude_start_steps, cfg.output.metric.exclude_end_steps)
    epochs = []
    for epoch in range(1, (args.epochs or cfg.train.epochs) + 1):
        order = shard(epoch, cfg.train.seed, len(paths), rank, ranks, steps * rd.batch_size)
        mine = run_epoch(comm, loader, sampler, order, steps, step, rd.batch_size, exclude)
        every = comm.gather(mine, root=0)
        if rank == 0:
            job = {"epoch": epoch, "steps": steps,
                   "samples_per_second": sum(r["samples_per_second"] for r in every),
                   "au_percentage": float(np.mean([r["au_percentage"] for r in every])),
                   "seconds": max(r["seconds"] for r in every), "per_rank": every}
            epochs.append(job)
            print(f"reference epoch {epoch}: {job['samples_per_second']:.1f} samples/s, AU "
                  f"{job['au_percentage']:.2f} %, {job['seconds']:.2f} s ({ranks} rank(s), "
                  f"{args.workers} worker(s), {named})", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as fp:
            json.dump({"ranks": ranks, "workers": args.workers, "dataset": named,
                       "step": model and f"{args.model} on {args.device}" or seconds,
                       "epochs": epochs}, fp, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
