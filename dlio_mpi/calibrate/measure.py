"""Measuring a real loader: a torch DataLoader over a Dataset, warm and data-bound (no step
time between batches), with each item's costs recorded where the Dataset makes it.

Per item, in the process that makes it (a worker, or this one without workers): its CPU time
(the thread's), its wall time, the bytes and read calls of the thread (/proc/thread-self/io)
and the files it opened (a Python audit hook: `open` events of open() and os.open; files a
C library opens itself, h5py's, are not seen). Per pass: each worker process's CPU time from
/proc/<pid>/task/*/schedstat (the items', the collation's and the hand-over's), this process's:
the thread taking the batches (time.thread_time: receiving, rebuilding) apart from its other
threads (getrusage less it: the pin-memory thread, which works alongside the loader), and the
wall time from the loader's start to its last batch. The items' records travel through a
file mapped by every process (no change to the items or the collation).

torch is imported here: only calibration imports this module."""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from torch.utils.data import Dataset

from ..storage.counters import io_between, thread_io
from .datasets import EpochSampler, make_loader

# the columns of an item's record
CPU, START, END, BYTES, READS, OPENS, PID, DONE = range(8)
COLUMNS = 8
_opens = [0]  # files opened in this process since its audit hook was installed


def _count_open(event: str, args: tuple) -> None:
    if event == "open" and not str(args[0]).startswith("/proc/"):
        _opens[0] += 1


def count_opens() -> None:
    """Count this process's opens from now on (a worker_init_fn; once per process: audit
    hooks cannot be removed)."""
    if not getattr(count_opens, "installed", False):
        sys.addaudithook(_count_open)
        count_opens.installed = True


def _worker_init(_worker_id: int) -> None:
    count_opens()


class MeasuredDataset(Dataset):
    """`dataset` with each item's costs recorded in the file `records` (len(dataset) rows of
    COLUMNS int64, mapped by every process that makes items)."""

    def __init__(self, dataset: Dataset, records: str) -> None:
        self.dataset, self.records = dataset, records
        self._table: np.ndarray | None = None

    def __getstate__(self) -> dict:  # a spawned worker maps the file itself
        return {**self.__dict__, "_table": None}

    def __len__(self) -> int:
        return len(self.dataset)

    def table(self) -> np.ndarray:
        if self._table is None:
            self._table = np.memmap(self.records, dtype=np.int64, mode="r+",
                                    shape=(len(self.dataset), COLUMNS))
        return self._table

    def __getitem__(self, i: int):
        return self._measured([i], lambda: [self.dataset[i]])[0]

    def _measured(self, indices: list, make):
        """make()'s items, their costs recorded (shared equally where made together)."""
        io, opens = thread_io(), _opens[0]
        cpu, start = time.thread_time_ns(), time.monotonic_ns()
        items = make()
        end, cpu = time.monotonic_ns(), time.thread_time_ns() - cpu
        got, reads = io_between(io, thread_io())
        n = len(indices)
        self.table()[indices] = (cpu // n, start, end, got // n, reads // n,
                                 (_opens[0] - opens) // n, os.getpid(), 1)
        return items


class MeasuredBatchDataset(MeasuredDataset):
    """A MeasuredDataset over a Dataset with a batched fetch (__getitems__), which the
    DataLoader then calls: the batch's costs are shared equally by its items."""

    def __getitems__(self, indices: list):
        return self._measured(list(indices), lambda: self.dataset.__getitems__(indices))


def measured(dataset: Dataset, records: str) -> MeasuredDataset:
    """`dataset` measured item by item (or batch by batch where it fetches batches)."""
    cls = MeasuredBatchDataset if hasattr(dataset, "__getitems__") else MeasuredDataset
    return cls(dataset, records)


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of process `pid` so far (schedstat, ns); 0 once it is gone."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as fp:
                total += int(fp.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Pass:
    """One pass of the loader over the items: per item records (rows of the items read, in
    sampler order) and the pass's totals."""

    items: np.ndarray       # (n, COLUMNS) int64
    steps: int
    wall_s: float           # the loader's start to its last batch
    iter_s: float           # in iter(): the main thread starting (or resetting) the workers
    started_ns: int         # CLOCK_MONOTONIC when iter() was called
    worker_cpu_s: float     # the worker processes' CPU time over the pass
    main_cpu_s: float       # this process's (all its threads)
    taking_cpu_s: float     # of which the thread taking the batches (this one)

    @property
    def samples(self) -> int:
        return len(self.items)

    def worker_start_s(self) -> list[float]:
        """Per worker process, from the loader's start to its first item's start."""
        pids = self.items[:, PID]
        return [(int(self.items[pids == pid, START].min()) - self.started_ns) / 1e9
                for pid in np.unique(pids)]


class LoaderProbe:
    """A DataLoader over `dataset` set up as DLIO's, whose passes are measured (see the
    module). Use as a context manager: it removes its records file."""

    def __init__(self, dataset: Dataset, batch_size: int, workers: int, prefetch_size: int,
                 pin_memory: bool = True, context: str = "fork") -> None:
        self.folder = tempfile.mkdtemp(prefix="dlio-mpi-calibrate-")
        path = os.path.join(self.folder, "items.bin")
        np.zeros((len(dataset), COLUMNS), dtype=np.int64).tofile(path)
        self.dataset = measured(dataset, path)
        self.sampler = EpochSampler()
        self.workers, self.batch_size = workers, batch_size
        self._pids: list[int] = []  # the worker processes, once a pass has seen them
        if workers == 0:
            count_opens()
        self.loader = make_loader(self.dataset, self.sampler, batch_size, workers,
                                  prefetch_size, pin_memory, context, _worker_init)

    def __enter__(self) -> LoaderProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.loader = None  # its workers end with it
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, order: np.ndarray) -> Pass:
        """One pass over the items `order` (the full batches of it), data-bound."""
        table = self.dataset.table()
        table[:] = 0
        self.sampler.start(order)
        pids = list(self._pids)
        worker0 = sum(process_cpu_ns(p) for p in pids)
        main0, taking0, started = self_cpu_s(), time.thread_time(), time.monotonic_ns()
        batches = iter(self.loader)
        iter_s = (time.monotonic_ns() - started) / 1e9
        steps = sum(1 for _ in batches)
        wall_s = (time.monotonic_ns() - started) / 1e9
        main_s, taking_s = self_cpu_s() - main0, time.thread_time() - taking0
        read = np.asarray(order[:steps * self.batch_size])
        items = np.array(table[read])
        if not np.all(items[:, DONE]):
            raise RuntimeError("the loader returned batches whose items were not all made")
        pids = pids or sorted(set(items[:, PID].tolist()) - {os.getpid()})
        worker_s = (sum(process_cpu_ns(p) for p in pids) - worker0) / 1e9 if pids else 0.0
        self._pids = pids
        return Pass(items, steps, wall_s, iter_s, started, worker_s, main_s, taking_s)


    def handover(self, order: np.ndarray, period_s: float) -> np.ndarray:
        """A pass over `order` whose steps come every `period_s` (the loader ahead of them):
        per step after the first two, the wall time of taking a batch that is there, less
        the CPU time the taking thread spent: the hand-over's waits on the workers."""
        self.sampler.start(order)
        waits = []
        batches = iter(self.loader)
        while True:
            deadline = time.perf_counter() + period_s
            while (left := deadline - time.perf_counter()) > 0:
                time.sleep(left)
            wall, cpu = time.perf_counter(), time.thread_time()
            if next(batches, None) is None:
                break
            waits.append((time.perf_counter() - wall) - (time.thread_time() - cpu))
        return np.maximum(np.asarray(waits[2:]), 0.0)


def lone_item_seconds(dataset: Dataset, indices: np.ndarray) -> float:
    """The usual practice's per-sample preprocessing time: the mean wall time of making
    `indices`' items one by one in this process, nothing else running (warm)."""
    for i in indices[:2]:
        dataset[int(i)]
    start = time.perf_counter()
    for i in indices:
        dataset[int(i)]
    return (time.perf_counter() - start) / max(len(indices), 1)
