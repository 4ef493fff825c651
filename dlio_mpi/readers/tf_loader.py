"""The framework engine for TensorFlow (reader.engine: framework, reader.data_loader:
tensorflow): each rank reads its planned samples through a real tf.data pipeline. npy, npz,
jpeg, png and csv go through DLIO's generators (TfGeneratorReader, below: each file loaded
whole by its library, Format.load_whole); TFRecord files through the pipeline
DLIO's TFRecord reader (reader/tf_reader.py) builds:

    tf.data.TFRecordDataset(files, buffer_size=reader.transfer_size,
                            num_parallel_reads=reader.read_threads)
      .batch(batch size, drop_remainder=True)
      .map(parse the batch's Examples, num_parallel_calls=reader.computation_threads)
      .prefetch(reader.prefetch_size)

with DLIO's values: buffer_size None when reader.transfer_size is unset (DLIO's default: the
TFRecordDataset's own, 256 KiB), num_parallel_reads = read_threads (0: None, the files one
after the other; DLIO would hand TensorFlow a cycle of 0), the map's parallel calls
computation_threads (DLIO's default 1), prefetch prefetch_size batches. The map parses each
Example with DLIO's feature spec ('image' a string, 'size' an int64) and hands the images as
(batch, d, d) uint8, d = int(sqrt(record length)) (DLIO wraps the parse in a tf.py_function
and hands a constant image of that shape instead; here the parse stays in the graph and its
bytes are the batch). TensorFlow's thread pools are left as DLIO leaves them (its defaults:
one inter-op and one intra-op thread per core); no GPU is claimed.

What the rank reads is the native engine's plan (read_mode file_once for TFRecord with this
loader): the distinct files of the epoch's ReadPlan, in first-use order, are streamed whole,
and between the TFRecordDataset and the batch an `enumerate` and a `filter` keep the records
of the plan's sample ids (a file's records that other ranks own are read and dropped, as the
native engine's whole-file loads read them). DLIO shards files per rank instead and does not
follow the sampler; the plan's shard keeps the two engines comparable.

Order: TFRecordDataset with num_parallel_reads n interleaves the files deterministically (a
cycle of n files, one record of each in turn; equal record counts, so consecutive groups of n
files), so record k of the stream is a known sample id (`stream_ids`). The rank consumes
exactly the plan's sample ids each epoch; in the plan's order when the plan walks its files
record by record and n <= 1 (no sample shuffle, read_threads 0 or 1), otherwise in the
stream's order: the same ids per epoch, not per step. reader.sample_shuffle's tf.data shuffle
buffer (reader.shuffle_size) is not run: the plan chose the samples.

Measured per batch: bytes and read calls from /proc/self/io (rchar, syscr) of the whole
process, since TensorFlow reads on its own threads (this process's other threads read little;
the last batch includes reading the rest of the epoch's last files, which the pipeline streams
to their end). Opens and closes: one per streamed file (not observed: TensorFlow's file system
opens each file once per TFRecordDataset). Stats: none counted. lat_ns: per sample, its
batch's wait divided by the batch's samples.

output.trace: step spans only, no read span. The TFRecord pipeline reads on TensorFlow's C++
threads, where no code of ours runs per request or per sample (lat_ns is each batch's wait
shared out, not a read's time); the generators load whole npy/npz files with np.load, which
the plan models as several requests per load (modelled from strace, not observed one by one),
so a span per planned request would be made up (as with the torch loader's whole-file loads).

This module imports no MPI; TensorFlow initialises nothing MPI-related. TF_CPP_MIN_LOG_LEVEL
is set to 2 unless already set (TensorFlow's INFO and WARNING lines off, errors kept);
TensorFlow 2.21 still prints its oneDNN line at import, before it reads the level."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # INFO and WARNING off; errors still show
import tensorflow as tf  # noqa: E402

from .. import _core  # noqa: E402
from ..data.catalog import SplitFiles  # noqa: E402
from ..sampling.requests import ReadPlan  # noqa: E402
from ..storage.counters import process_io  # noqa: E402
from . import FRAMEWORK_LOADERS  # noqa: E402
from .base import (  # noqa: E402
    BatchStats,
    BatchWaitWatch,
    ReaderBackend,
    as_item,
    batch_paths,
    drop_cached_pages,
)
from .registry import TfOptions  # noqa: E402

if TYPE_CHECKING:
    pass

READS = FRAMEWORK_LOADERS["tensorflow"]["reads"]
FEATURES = {"image": tf.io.FixedLenFeature([], tf.string),   # DLIO's feature spec
            "size": tf.io.FixedLenFeature([], tf.int64)}

try:  # one rank per accelerator is the emulation; TensorFlow takes no GPU here
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # already initialised, or no GPU support
    pass


def parallel_reads(read_threads: int) -> int | None:
    """TFRecordDataset's num_parallel_reads for reader.read_threads (0: None, sequential)."""
    return read_threads if read_threads > 0 else None


def stream_ids(first_ids: np.ndarray, records: int, cycle: int | None) -> np.ndarray:
    """The sample id of each record TFRecordDataset streams from files whose first sample
    ids are `first_ids` (in the order given), `records` records each, read `cycle` at a time
    interleaved one record each in turn (None or 1: one file after the other)."""
    first = np.asarray(first_ids, dtype=np.int64)
    within = np.arange(records, dtype=np.int64)
    if not cycle or cycle <= 1:
        return (first[:, None] + within[None, :]).reshape(-1)
    parts = [(first[g:g + cycle][None, :] + within[:, None]).reshape(-1)
             for g in range(0, len(first), cycle)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class TfDataReader(ReaderBackend):
    """A ReaderBackend reading one split's planned batches through a tf.data pipeline (see
    the module)."""

    def __init__(self, files: SplitFiles, options: TfOptions, comm=None) -> None:
        self.files, self.options = files, options
        self.fmt = files.split.format.name
        if self.fmt not in READS:
            raise ValueError(f"the tf.data loader reads {', '.join(READS)}, not {self.fmt}")
        self.samples_per_file = files.split.samples_per_file
        self.num_parallel_reads = parallel_reads(options.read_threads)
        self.buffer_size = options.transfer_size
        self.map_calls = options.computation_threads
        self.item_shape, self.item_dtype = options.item_shape, options.item_dtype
        self.shuffle_size, self.shuffle_seed = options.shuffle_size, options.shuffle_seed
        self._epochs = 0  # pipelines built: the shuffle seed moves on per epoch
        self._watch = BatchWaitWatch(options.watchdog, "tf.data pipeline")
        self._dataset: tf.data.Dataset | None = None
        self._iter = None
        self.batch = None
        self.ids = np.zeros(0, dtype=np.int64)  # the sample ids of the batch held
        self.consumed: list[np.ndarray] = []     # the epoch's batches' sample ids
        self._plan: ReadPlan | None = None
        self._step = self._position = 0
        self._io = None
        self._bytes = self._reads = self._opens = 0
        self.lat_ns = np.zeros(0, dtype=np.int64)
        self.request_trace = None  # output.trace: step spans only (see the module)
        self._asked_ns = 0

    def paths_of(self, plan: ReadPlan) -> tuple[list[str], np.ndarray]:
        """The plan's distinct files in first-use order: paths and file indexes."""
        files = plan.sample_ids // self.samples_per_file
        _, first = np.unique(files, return_index=True)
        order = files[np.sort(first)]
        return [self.files.path(int(f)) for f in order], order

    def _pipeline(self, plan: ReadPlan) -> tf.data.Dataset:
        paths, order = self.paths_of(plan)
        batch = len(plan.sample_ids) // plan.steps
        ids = stream_ids(order * self.samples_per_file, self.samples_per_file,
                         self.num_parallel_reads)
        keep = np.isin(ids, plan.sample_ids)
        ids_t, keep_t = tf.constant(ids), tf.constant(keep)
        shape, dtype = self.item_shape, tf.as_dtype(np.dtype(self.item_dtype))
        nbytes = math.prod(shape) * dtype.size

        delays = None if plan.sample_delay_ns is None else dict(
            zip(plan.sample_ids.tolist(), plan.sample_delay_ns.tolist(), strict=True))

        def preprocess(sample_ids) -> int:
            """reader.preprocess_time of the batch's samples, slept in the batch map (DLIO's
            py_function stage, computation_threads of them in parallel)."""
            time.sleep(sum(delays[i] for i in sample_ids.numpy().tolist()) / 1e9)
            return 0

        def parse(sample_ids: tf.Tensor, serialized: tf.Tensor):
            if delays is not None:
                with tf.control_dependencies([tf.py_function(preprocess, [sample_ids],
                                                             tf.int32)]):
                    sample_ids = tf.identity(sample_ids)
            parsed = tf.io.parse_example(serialized=serialized, features=FEATURES)
            if not shape:
                return sample_ids, parsed["image"]
            images = tf.io.decode_raw(parsed["image"], dtype, fixed_length=nbytes)
            return sample_ids, tf.reshape(images, (-1, *shape))

        ds = tf.data.TFRecordDataset(paths, buffer_size=self.buffer_size,
                                     num_parallel_reads=self.num_parallel_reads)
        ds = ds.enumerate()
        ds = ds.filter(lambda k, record: tf.gather(keep_t, k))
        ds = ds.map(lambda k, record: (tf.gather(ids_t, k), record))
        if self.shuffle_size:  # DLIO's reader.sample_shuffle: a shuffle buffer of records
            seed = None if self.shuffle_seed is None else self.shuffle_seed + self._epochs
            ds = ds.shuffle(self.shuffle_size, seed=seed)
        self._epochs += 1
        ds = ds.batch(batch, drop_remainder=True)
        ds = ds.map(parse, num_parallel_calls=self.map_calls)
        return ds.prefetch(self.options.prefetch_size)

    def prepare_epoch(self, plan: ReadPlan) -> None:
        """Before the clock: the epoch's pipeline, and the plan's files dropped from the page
        cache if asked."""
        self._dataset = self._pipeline(plan) if plan.steps else None
        if self.options.drop_page_cache:
            drop_cached_pages(self.paths_of(plan)[0])

    def start_epoch(self, plan: ReadPlan) -> None:
        """The pipeline's iteration started (its readers begin at once)."""
        self._plan, self._step, self._position = plan, 0, 0
        self.lat_ns = np.zeros(len(plan.sample_ids), dtype=np.int64)
        self.consumed = []
        self._io = process_io()
        if self._dataset is None:
            self._dataset = self._pipeline(plan) if plan.steps else None
        self._iter = iter(self._dataset) if self._dataset is not None else iter(())
        self._opens += len(self.paths_of(plan)[0]) if plan.steps else 0

    def _next(self):
        try:
            return next(self._iter)
        except StopIteration:
            return None
        except tf.errors.OpError as exc:
            message = re.sub(r"\{\{[^}]*\}\}\s*", "", exc.message or "").strip()
            message = (message.splitlines() or [type(exc).__name__])[0]
            raise RuntimeError(f"the tf.data pipeline failed: {message}") from exc

    def next_batch(self) -> BatchStats | None:
        """Wait for the pipeline's next batch; None at the end of the epoch. The epoch's last
        planned batch also streams the rest of its files (the pipeline's end)."""
        self.batch = None
        asked = _core.now_ns()
        if self._plan is not None and self._step < self._plan.steps:
            self._watch.start(self._step, batch_paths(self._plan, self._step, self.files.path))
        try:
            got = self._next()
        finally:
            self._watch.stop()
        if got is None:
            return None
        ids, images = got
        if self._plan is not None and self._step == self._plan.steps - 1:
            extra = self._next()
            if extra is not None:
                raise RuntimeError("the tf.data pipeline has more batches than the plan")
        ready = _core.now_ns()
        self.ids, self.batch = ids.numpy(), images
        self.consumed.append(self.ids)
        n = len(self.ids)
        self.lat_ns[self._position:self._position + n] = (ready - asked) // max(n, 1)
        self._position += n
        self._step += 1
        nbytes, reads = self._measure()
        self._bytes += nbytes
        self._reads += reads
        return BatchStats(ready, nbytes, reads)

    def _measure(self) -> tuple[int, int]:
        now = process_io()
        before, self._io = self._io, now
        if before is None or now is None:  # no /proc io: the plan's bytes for the batch
            b, step = self._plan.batch_start, self._step - 1
            return (int(self._plan.expect[b[step]:b[step + 1]].sum()),
                    int(b[step + 1] - b[step]))
        return now[0] - before[0] - before[2], now[1] - before[1] - 1

    def _order(self) -> str:
        if self.shuffle_size:
            return (f"a tf.data shuffle buffer of {self.shuffle_size} records over the "
                    + ("plan's" if (self.num_parallel_reads or 1) == 1 else
                       f"files interleaved {self.num_parallel_reads} at a time")
                    + (" (seeded: train.seed + epoch)" if self.shuffle_seed is not None
                       else " (unseeded)"))
        if (self.num_parallel_reads or 1) == 1:
            return "the plan's"
        return f"the files interleaved {self.num_parallel_reads} at a time"

    def abandon_epoch(self) -> None:
        """Stop before the epoch's last batch: the pipeline is dropped."""
        self._iter = self.batch = self._dataset = None

    def end_epoch(self) -> None:
        self._iter = self.batch = self._dataset = None

    def counters(self) -> dict:
        return {"opens": self._opens, "closes": self._opens, "stats": 0,
                "bytes": self._bytes, "reads": self._reads}

    def describe(self) -> dict:
        return {"backend": "framework", "loader": "tf.data", "data_loader": "tensorflow",
                "file_access": "multi", "format": self.fmt, "reads": READS[self.fmt],
                "pipeline": "TFRecordDataset -> enumerate/filter (the plan's samples) -> "
                            "batch(drop_remainder) -> map(parse_example) -> prefetch",
                "buffer_size": self.buffer_size, "num_parallel_reads": self.num_parallel_reads,
                "num_parallel_calls": self.map_calls,
                "prefetch": self.options.prefetch_size,
                "item_shape": list(self.item_shape) or None, "item_dtype": self.item_dtype,
                "shuffle_size": self.shuffle_size or None,
                "order": self._order(),
                "bytes_read_measured": self._bytes,
                "counted": "bytes and read calls: /proc/self/io of the rank's process; opens "
                           "and closes: one per streamed file, not observed; stats: none",
                "tensorflow": tf.__version__}

    def close(self) -> None:
        self._iter = self.batch = self._dataset = None


class NpyFiles:
    """The rank's whole-file loads of one epoch (npy `np.load(path)`, npz
    `np.load(path)['x']`), shared by the generators' threads: each file loaded once while any
    of its planned samples is left (read_mode file_once, DLIO's reader keeping a file open for
    its samples), or once per sample (read_mode file: on_demand with one sample per file)."""

    def __init__(self, files: SplitFiles, keep: bool) -> None:
        self.files, self.fmt, self.keep = files, files.split.format, keep
        self.last_axis = files.sample_layout == "last_axis"
        self.samples_per_file = files.split.samples_per_file
        self.loads = 0
        self._lock = threading.Lock()
        self._kept: dict[int, object] = {}  # file -> array, or an Event while it loads
        self._left: dict[int, int] = {}

    def start(self, sample_ids: np.ndarray) -> None:
        files, counts = np.unique(sample_ids // self.samples_per_file, return_counts=True)
        self._kept, self._left = {}, dict(zip(files.tolist(), counts.tolist(), strict=True))

    def _load(self, file: int):
        path = self.files.path(file)
        with self._lock:
            self.loads += 1
        return self.fmt.load_whole(path)

    def sample(self, sample_id: int) -> np.ndarray:
        file, within = divmod(sample_id, self.samples_per_file)
        if not self.keep:
            array = self._load(file)
            sample = self.fmt.library_sample(array, within, self.last_axis)
            self.fmt.release(array)
            return sample
        with self._lock:
            entry = self._kept.get(file)
            mine = entry is None
            if mine:
                entry = self._kept[file] = _Load()
        if mine:
            try:
                entry.array = self._load(file)
            finally:
                entry.done.set()
        else:
            entry.done.wait()
        if entry.array is None:
            raise RuntimeError(f"{self.files.path(file)} could not be loaded")
        array = entry.array
        sample = self.fmt.library_sample(array, within, self.last_axis)
        with self._lock:
            self._left[file] -= 1
            done = self._left[file] == 0
            if done:
                self._kept.pop(file, None)
        if done:  # hdf5: read by every thread that wanted it
            self.fmt.release(array)
        return sample


class _Load:
    """A file's load, shared by the threads that want it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.array: np.ndarray | None = None


class TfGeneratorReader(TfDataReader):
    """npy and npz through tf.data as DLIO's tf data loader reads them: read_threads
    generators (tf.data.Dataset.from_generator, each a reader thread yielding whole batches)
    interleaved by `from_tensor_slices(range(threads)).interleave(cycle_length=threads,
    num_parallel_calls=threads)` (deterministic), the dataset's private thread pool and
    intra-op parallelism set to threads, then `prefetch(prefetch_size)` when it is > 0.
    Thread t yields the plan's steps t, t + threads, ...: the interleave hands the batches
    over in the plan's order, each holding the plan's samples. A sample is its file's whole
    np.load, the file kept for the epoch's other samples in it (read_mode file_once: more
    than one sample per file, or reader.read_type memory) and shared by the threads, as the
    native engine's plan loads it once."""

    def __init__(self, files: SplitFiles, options: TfOptions, comm=None) -> None:
        super().__init__(files, options, comm)
        self.threads = max(options.read_threads, 1)  # DLIO: 0 becomes 1
        keep = options.read_type == "memory" or self.samples_per_file > 1
        self.loaded = NpyFiles(files, keep)
        self._steps: list[np.ndarray] = []
        self._delays: list[list[int]] | None = None

    def _generate(self, thread: int):
        item = (self.item_shape, self.item_dtype)
        for step in range(int(thread), len(self._steps), self.threads):
            ids = self._steps[step]
            delays = self._delays[step] if self._delays is not None else repeat(0)
            samples = []
            for i, delay in zip(ids.tolist(), delays):
                samples.append(as_item(self.loaded.sample(i), *item))
                if delay:  # reader.preprocess_time, after the read as DLIO's reader sleeps
                    time.sleep(delay / 1e9)
            images = np.stack(samples)
            yield ids, images

    def _pipeline(self, plan: ReadPlan) -> tf.data.Dataset:
        batch = len(plan.sample_ids) // plan.steps
        self._steps = list(plan.sample_ids.reshape(plan.steps, batch))
        self._delays = None if plan.sample_delay_ns is None else \
            plan.sample_delay_ns.reshape(plan.steps, batch).tolist()
        self.loaded.start(plan.sample_ids)
        signature = (tf.TensorSpec((batch,), tf.int64),
                     tf.TensorSpec((batch, *self.item_shape),
                                   tf.as_dtype(np.dtype(self.item_dtype))))
        options = tf.data.Options()
        options.threading.private_threadpool_size = self.threads
        options.threading.max_intra_op_parallelism = self.threads
        ds = tf.data.Dataset.from_tensor_slices(np.arange(self.threads)).with_options(options)
        ds = ds.interleave(
            lambda t: tf.data.Dataset.from_generator(self._generate, args=(t,),
                                                     output_signature=signature),
            cycle_length=self.threads, num_parallel_calls=self.threads, deterministic=True)
        if self.options.prefetch_size > 0:
            ds = ds.prefetch(self.options.prefetch_size)
        return ds

    def counters(self) -> dict:
        out = super().counters()
        out["opens"] = out["closes"] = self.loaded.loads
        return out

    def describe(self) -> dict:
        return {"backend": "framework", "loader": "tf.data", "data_loader": "tensorflow",
                "file_access": "multi", "format": self.fmt, "reads": READS[self.fmt],
                "pipeline": "from_tensor_slices(range(threads)) -> interleave(from_generator "
                            "per reader thread, deterministic) -> prefetch",
                "threads": self.threads, "prefetch": self.options.prefetch_size,
                "item_shape": list(self.item_shape), "item_dtype": self.item_dtype,
                "order": "the plan's",
                "files_kept_for_their_samples": self.loaded.keep,
                "bytes_read_measured": self._bytes,
                "counted": "bytes and read calls: /proc/self/io of the rank's process; opens "
                           "and closes: the generators' np.load calls; stats: none",
                "tensorflow": tf.__version__}


def open_tf_data(files: SplitFiles, options: TfOptions, comm=None) -> TfDataReader:
    """The tf.data backend for the split's format: TFRecordDataset for tfrecord, DLIO's
    generators for npy and npz."""
    if files.split.format.streams_files:  # tfrecord
        return TfDataReader(files, options, comm)
    return TfGeneratorReader(files, options, comm)
