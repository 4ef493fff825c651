"""The framework engine for PyTorch (reader.engine: framework, reader.data_loader: pytorch):
each rank reads its planned samples through a real `torch.utils.data.DataLoader`, with the
worker processes, prefetching, collation and pinning that DLIO's pytorch data loader sets up.

What runs, per rank and phase (DLIO's data_loader/torch_data_loader.py, its settings):
- one DataLoader, built at the first epoch: batch_size the phase's, num_workers =
  reader.read_threads (0: read in this process), prefetch_factor = ceil(prefetch_size /
  read_threads) (2 when prefetch_size is 0), persistent_workers with workers,
  multiprocessing_context and pin_memory from the configuration, drop_last;
- a map-style Dataset over the split's sample ids, whose items are read as DLIO's readers read
  them, through the format's library: npy `np.load(path)`, npz `np.load(path)['x']`, jpeg
  and png `np.asarray(PIL.Image.open(path))` (the image is the sample), csv
  `pandas.read_csv(path)` (the whole file per sample; with reader.read_type memory once per
  worker and epoch), then the sample; indexed_binary: the file's two index files once per
  worker, then per sample `open`, `seek`, `readinto` of its extent;
- a sampler yielding this epoch's planned ids in the plan's order, so that the rank reads
  exactly the samples the native engine would, in the same order. The sampler (not the
  Dataset) carries the epoch's order because persistent workers keep the Dataset they got
  at start for the whole run, as in DLIO, whose sampler yields global ids too.
Each item handed to the collation is the sample's bytes as a (d, d) uint8 array, d =
int(sqrt(record length)): the shape of the image DLIO's readers return (its `resized_image`),
so the collation stacks as much as DLIO's does, filled with the bytes read
(dataset.record_length_bytes_resize and reader.transformed_record_dims shape it as they shape
DLIO's: dataset.decoded_item). reader.preprocess_time is slept in the reader after each
sample's read, as DLIO's read_index sleeps it, the sampler handing each sample its draw.

Measured in the process that reads (a worker, or this one), per batch and handed back with it:
the bytes its thread's read calls returned (/proc/thread-self/io rchar: from storage or the
page cache, index files, headers and the modules a worker's first load imports included),
its read calls (syscr), the files it opened (each np.load or open() opens one file and closes
it before the item is returned; with read_type memory when the epoch changes) and each
sample's load time (lat_ns: one entry per sample, not per planned request). File stats are
not observed: each open counts the fstat calls the loader model (formats/npload.py, checked
against strace) gives the plan's loads (npz: 2 a load), one where the plan has no whole-file
loads (CPython's open makes one).

output.trace: a span per sample, where the plan has one request per sample (its extent: hdf5,
indexed_binary, formats read by sample with several samples a file; `one_request_per_sample`),
recorded where the Dataset reads it: its start (CLOCK_MONOTONIC, as the main process's clock)
and load time, the worker that read it (its track: `get_worker_info().id`; -1, the step loop's
thread, without workers) and its bytes (the sample's own /proc/thread-self/io delta, chained
probes so that the batch's figures stay exact; the plan's bytes without /proc io), handed back
with the batch in its stats tensor. Where each load is several planned requests (np.load's
header and data reads of a whole npy/npz file, modelled from strace, not observed one by one),
no per-request span would be true: the trace has the step spans only, as without output.trace
(describe() says which). Without output.trace the fetch takes no extra probe.

Worker processes must never initialise MPI: this module imports no MPI (nor does anything it
imports), since a spawned or forkserver worker unpickling the Dataset imports it, and a
process that calls MPI_Init under the launcher's environment aborts. Workers start at the
first epoch's first batch, inside that epoch, as in DLIO (the step's wait includes them)."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from .. import _core
from ..data.catalog import SplitFiles
from ..data.dataset import FileNaming
from ..formats.base import Format
from ..sampling.requests import ReadPlan
from ..storage import storage_for
from ..storage.counters import IoChain
from . import FRAMEWORK_LOADERS, torch_prefetch_factor
from .base import (
    BatchStats,
    BatchWaitWatch,
    ReaderBackend,
    RequestTrace,
    as_item,
    batch_paths,
    drop_cached_pages,
)
from .registry import TorchOptions

if TYPE_CHECKING:
    pass

READS = FRAMEWORK_LOADERS["pytorch"]["reads"]
STATS_HEAD = 3  # stats tensor: bytes, read calls, file opens, then each sample's load ns
# (with output.trace, after them: each sample's start ns, each sample's bytes, the worker)


def one_request_per_sample(plan: ReadPlan, samples_per_file: int) -> bool:
    """Whether request i of `plan` is sample i's read (its extent, in its file): then a span
    per sample is the span of its planned request."""
    n = len(plan.sample_ids)
    return (len(plan.offset) == n and plan.steps > 0
            and np.array_equal(plan.batch_start, np.arange(plan.steps + 1) * (n // plan.steps))
            and np.array_equal(plan.file_idx, plan.sample_ids // samples_per_file))



@dataclass(frozen=True)
class Fetched:
    """One batch's items as the Dataset fetched them, with what fetching them took."""

    items: list
    stats: torch.Tensor  # int64: bytes, read calls, opens, then each item's load ns


def collate(fetched: Fetched) -> tuple[torch.Tensor, torch.Tensor]:
    """The DataLoader's collate_fn: torch's default collation of the items (a stacked
    tensor), and the batch's stats tensor."""
    return default_collate(fetched.items), fetched.stats


class SampleDataset(Dataset):
    """The split's samples by global id, read as DLIO's pytorch reader reads them (see the
    module). Indices are (epoch, sample id): with reader.read_type memory a worker keeps the
    files it loaded until the epoch changes. Picklable: spawned workers get a copy."""

    def __init__(self, naming: FileNaming, listed: tuple[str, ...] | None, fmt: Format,
                 samples_per_file: int, sample_layout: str, item: tuple[tuple[int, ...], str],
                 memory: bool, trace: bool = False) -> None:
        self.naming, self.listed, self.fmt = naming, listed, fmt  # fmt: the configured format
        self.samples_per_file, self.last_axis = samples_per_file, sample_layout == "last_axis"
        self.item, self.memory = item, memory
        self.trace = trace  # output.trace: each item's start, bytes and worker too
        self.opens = 0
        self._epoch = -1
        self._kept: dict[str, object] = {}  # read_type memory: loaded arrays / open files
        self._index: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # indexed_binary

    @staticmethod
    def of(files: SplitFiles, options: TorchOptions) -> SampleDataset:
        fmt = files.split.format
        return SampleDataset(files.split.naming, files.listed, fmt,
                             files.split.samples_per_file, files.sample_layout,
                             (options.item_shape, options.item_dtype),
                             options.read_type == "memory", options.trace)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_kept"], state["_index"] = {}, {}
        return state

    def __len__(self) -> int:
        return self.naming.count * self.samples_per_file

    def path(self, file: int) -> str:
        if self.listed is not None:
            return os.path.join(self.naming.root, self.listed[file])
        return self.naming.path(file)

    def __getitem__(self, index: tuple[int, int, int]) -> np.ndarray:
        epoch, sample_id = index[:2]
        if epoch != self._epoch:
            self._forget()
            self._epoch = epoch
        file, within = divmod(sample_id, self.samples_per_file)
        path = self.path(file)
        if self.fmt.indexed:
            sample = self._read_extent(path, within)
        else:
            array = self._kept.get(path) if self.memory else None
            if array is None:
                array = self._load(path)
                if self.memory:
                    self._kept[path] = array
            sample = self.fmt.library_sample(array, within, self.last_axis)
            if not self.memory:
                self.fmt.release(array)
        return as_item(sample, *self.item)

    def __getitems__(self, indices: list) -> Fetched:
        """The batch's items (the DataLoader's batched fetch), timed and measured."""
        io, opens = IoChain(), self.opens
        items, lat, traced = [], [], []
        for index in indices:
            start = time.monotonic_ns()  # CLOCK_MONOTONIC: the clock of _core.now_ns
            items.append(self[index])
            lat.append(time.monotonic_ns() - start)
            if self.trace:  # output.trace: its start and its own bytes (-1: not known)
                traced.append((start, io.part()))
            if index[2]:  # reader.preprocess_time, after the read as DLIO's read_index sleeps
                time.sleep(index[2] / 1e9)
        nbytes, reads = io.end()
        if traced:  # then the worker reading (-1: this process, no workers)
            info = get_worker_info()
            traced = [*(t[0] for t in traced), *(t[1] for t in traced),
                      -1 if info is None else info.id]
        return Fetched(items, torch.tensor([nbytes, reads, self.opens - opens, *lat, *traced],
                                           dtype=torch.int64))

    def _load(self, path: str):
        self.opens += 1
        return self.fmt.load_whole(path)

    def _read_extent(self, path: str, within: int) -> np.ndarray:
        if path not in self._index:
            self._index[path] = (self._read_index(path + ".off.idx"),
                                 self._read_index(path + ".sz.idx"))
        offsets, sizes = self._index[path]
        sample = np.empty(int(sizes[within]), dtype=np.uint8)
        fp = self._kept.get(path) if self.memory else None
        if fp is None:
            self.opens += 1
            # the emulated reader's own calls, as DLIO's makes them (Python's open: one
            # fstat), not the storage's stream (a non-blocking open and a second fstat)
            fp = storage_for(path).open_buffered(path)
        try:
            fp.seek(int(offsets[within]))
            fp.readinto(sample)
        finally:
            if self.memory:
                self._kept[path] = fp
            else:
                fp.close()
        return sample

    def _read_index(self, path: str) -> np.ndarray:
        self.opens += 1
        with storage_for(path).open_buffered(path) as fp:
            values = np.empty(self.samples_per_file, dtype=np.int64)
            fp.readinto(values)
        return values

    def _forget(self) -> None:
        for kept in self._kept.values():
            self.fmt.release(kept)
        self._kept = {}



class PlannedSampler(Sampler):
    """Yields (epoch, id, preprocessing ns) for this epoch's planned sample ids, in the
    plan's order."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, dtype=np.int64)
        self.delays: list[int] | None = None
        self.epoch = 0

    def start(self, epoch: int, ids: np.ndarray, delays: np.ndarray | None = None) -> None:
        self.epoch, self.ids = epoch, ids
        self.delays = None if delays is None else delays.tolist()

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        epoch, delays = self.epoch, self.delays or repeat(0)
        return ((epoch, sample, delay) for sample, delay in zip(self.ids.tolist(), delays))

    def __len__(self) -> int:
        return len(self.ids)


class TorchLoaderReader(ReaderBackend):
    """A ReaderBackend reading one split's planned batches through a torch DataLoader (see
    the module)."""

    def __init__(self, files: SplitFiles, options: TorchOptions, comm=None) -> None:
        self.files, self.options = files, options
        self.workers = options.read_threads
        self.prefetch_factor = torch_prefetch_factor(options.prefetch_size, self.workers)
        self.dataset = SampleDataset.of(files, options)
        self.sampler = PlannedSampler()
        self.loader: DataLoader | None = None
        self._iter = None
        self.batch = None  # the batch the step holds, as a training step would
        self._epochs = self._position = 0
        self._plan: ReadPlan | None = None
        self._bytes = self._reads = self._opens = self._stats = 0
        self._stats_per_open = 1.0
        self.lat_ns = np.zeros(0, dtype=np.int64)  # per sample of the current epoch
        self.request_trace: RequestTrace | None = None  # per sample (output.trace; see module)
        self._request_trace: RequestTrace | None = None  # the next epoch's (prepare_epoch)
        self._spans = False  # this epoch's plan has one request per sample
        self._watch = BatchWaitWatch(options.watchdog, "torch DataLoader")

    def _make_loader(self, batch: int) -> DataLoader:
        extra = {}
        if self.workers:
            extra = dict(multiprocessing_context=self.options.multiprocessing_context,
                         prefetch_factor=self.prefetch_factor, persistent_workers=True)
            if self.options.watchdog.abort:  # a batch not there in time fails the wait
                extra["timeout"] = self.options.watchdog.seconds
        return DataLoader(self.dataset, batch_size=batch, sampler=self.sampler,
                          num_workers=self.workers, pin_memory=self.options.pin_memory,
                          drop_last=True, collate_fn=collate, **extra)

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Before the clock: the DataLoader at the first epoch (its workers start when the
        epoch's iteration does, in start_epoch), and dropping the plan's files from the page
        cache if asked."""
        if self.loader is None and plan.steps:
            self.loader = self._make_loader(len(plan.sample_ids) // plan.steps)
        if self.options.drop_page_cache:
            drop_cached_pages(self.files.path(int(f)) for f in plan.files())
        if self._trace_of(plan):  # its pages faulted in here, not inside the clock
            self._request_trace = RequestTrace.empty(len(plan.offset))

    def _trace_of(self, plan: ReadPlan) -> bool:
        return self.options.trace and one_request_per_sample(plan, self.files.split
                                                             .samples_per_file)

    def start_epoch(self, plan: ReadPlan) -> None:
        """The epoch's order to the sampler, and the DataLoader's iteration started (its
        workers get their first batches' indices at once)."""
        self._epochs += 1
        self._plan, self._position = plan, 0
        self.lat_ns = np.zeros(len(plan.sample_ids), dtype=np.int64)
        rt, self._request_trace = self._request_trace, None
        self._spans = self._trace_of(plan)
        if self._spans and (rt is None or len(rt.start_ns) != len(plan.offset)):
            rt = RequestTrace.empty(len(plan.offset))  # without prepare_epoch
        self.request_trace = rt if self._spans else None
        self.sampler.start(self._epochs, plan.sample_ids, plan.sample_delay_ns)
        opens = int(np.count_nonzero(plan.flags & _core.REQ_OPEN))
        fstats = int(np.count_nonzero(plan.flags & _core.REQ_FSTAT))
        self._stats_per_open = (opens + fstats) / opens if opens else 1.0
        with warnings.catch_warnings():  # said in describe(): pinned or not
            warnings.filterwarnings("ignore", message=".*pin_memory.*")
            self._iter = iter(self.loader)

    def next_batch(self) -> BatchStats | None:
        """Wait for the DataLoader's next batch; None at the end of the epoch."""
        self.batch = None
        step = self._position // max(self.loader.batch_size or 1, 1) if self.loader else 0
        if self._plan is not None and step < self._plan.steps:
            self._watch.start(step, batch_paths(self._plan, step, self.files.path))
        try:
            batch, stats = next(self._iter)
        except StopIteration:
            return None
        except Exception as exc:  # a worker's error comes with its traceback: its last line
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise RuntimeError(f"the torch DataLoader failed: {lines[-1]}") from exc
        finally:
            self._watch.stop()
        ready = _core.now_ns()
        self.batch = batch
        head = stats[:STATS_HEAD].tolist()
        lat = stats[STATS_HEAD:].numpy()
        if self.dataset.trace:  # lat, starts, bytes, then the worker
            n = (len(lat) - 1) // 3
            lat, starts, nread, worker = lat[:n], lat[n:2 * n], lat[2 * n:3 * n], int(lat[-1])
            self._record(starts, nread, worker)
        nbytes, reads, opens = head
        if nbytes < 0:  # no /proc io: the plan's bytes for the batch
            step = self._position // max(len(lat), 1)
            b = self._plan.batch_start
            nbytes = int(self._plan.expect[b[step]:b[step + 1]].sum())
            reads = int(b[step + 1] - b[step])
        self.lat_ns[self._position:self._position + len(lat)] = lat
        self._position += len(lat)
        self._bytes += nbytes
        self._reads += reads
        self._opens += opens
        self._stats += round(opens * self._stats_per_open)
        return BatchStats(ready, nbytes, reads)

    def _record(self, starts: np.ndarray, nread: np.ndarray, worker: int) -> None:
        """A batch's samples into the epoch's request trace (requests: one per sample)."""
        rt, at = self.request_trace, self._position
        if rt is None:
            return
        rt.start_ns[at:at + len(starts)] = starts
        rt.thread[at:at + len(starts)] = worker
        if (nread < 0).any():  # no /proc io: the plan's bytes of the sample
            nread = np.where(nread < 0, self._plan.expect[at:at + len(starts)], nread)
        rt.nread[at:at + len(starts)] = nread

    def abandon_epoch(self) -> None:
        """Stop before the epoch's last batch: the next iteration resets the workers."""
        self._iter, self.batch = None, None

    def end_epoch(self) -> None:
        self._iter, self.batch = None, None

    def counters(self) -> dict:
        return {"opens": self._opens, "closes": self._opens, "stats": self._stats,
                "bytes": self._bytes, "reads": self._reads}

    def describe(self) -> dict:
        pinned = bool(self.options.pin_memory and torch.accelerator.is_available())
        return {"backend": "framework", "loader": "torch.utils.data.DataLoader",
                "data_loader": "pytorch", "file_access": "multi",
                "format": self.dataset.fmt.name, "reads": READS[self.dataset.fmt.name]
                + (" (files kept per worker and epoch: reader.read_type memory)"
                   if self.dataset.memory else ""),
                "workers": self.workers, "prefetch_factor": self.prefetch_factor,
                "persistent_workers": self.workers > 0,
                "pin_memory": self.options.pin_memory, "pinned": pinned,
                "multiprocessing_context": (self.options.multiprocessing_context
                                            if self.workers else None),
                "item_shape": list(self.dataset.item[0]) or None,
                "item_dtype": self.dataset.item[1],
                "bytes_read_measured": self._bytes,
                "trace": None if not self.options.trace else
                "a span per sample (its planned request), on its worker's track"
                if self._spans else "step spans only: each load is several planned requests "
                                     "that are not observed one by one",
                "counted": "bytes and read calls: /proc/thread-self/io of the reading thread; "
                           "opens and closes: the files the Dataset opened; stats: the "
                           "loader model's fstat calls per open, not observed",
                "torch": torch.__version__}

    def close(self) -> None:
        """Stop the workers."""
        self._iter = self.batch = None
        loader, self.loader = self.loader, None
        running = getattr(loader, "_iterator", None)
        if running is not None and hasattr(running, "_shutdown_workers"):
            running._shutdown_workers()
