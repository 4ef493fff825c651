"""The C core's model of a real loader's costs (issue 19): CPU work per sample in the reader
threads (cpu_ns, dio_burn_cpu_ns), the loader's start-up (not_before_ns), whole batches per
reader thread (a DataLoader's workers) and the step loop's host work (host_cpu_ns, then
host_wait_ns), measured with the thread and process CPU clocks."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from test_core import arrays, make_files

from dlio_mpi import _core
from dlio_mpi.readers.base import batches_in_flight
from dlio_mpi.sampling.requests import EpochRequests

MS = 1_000_000


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_burn_spends_its_cpu_time_on_this_thread():
    for ns in (0, 2 * MS, 10 * MS):
        cpu, wall = time.thread_time_ns(), time.monotonic_ns()
        done = _core.burn_cpu_ns(ns)
        spent = time.thread_time_ns() - cpu
        assert ns <= spent < ns + 2 * MS, (ns, spent)
        assert done >= wall + ns  # a wall clock can only be later than the CPU clock


def test_burn_takes_longer_than_its_cpu_time_when_the_cores_are_shared():
    """Three threads burning 40 ms each on fewer cores take longer than 40 ms of wall time:
    CPU work contends for the cores, which a sleep does not."""
    import os
    import threading

    cores = len(os.sched_getaffinity(0))
    threads = cores + 1
    walls = []

    def burn():
        start = time.monotonic_ns()
        _core.burn_cpu_ns(40 * MS)
        walls.append(time.monotonic_ns() - start)

    workers = [threading.Thread(target=burn) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # threads x 40 ms of CPU on `cores` cores: the last one cannot end before
    assert max(walls) >= 40 * MS * threads / cores * 0.9


@pytest.mark.parametrize("threads", [0, 2])
def test_reader_cpu_time_is_spent_after_each_read_and_counted(tmp_path, threads):
    sizes = [4096] * 8
    paths = make_files(tmp_path, sizes)
    start, files, offset, length = arrays([[(2 * b, 0, 4096), (2 * b + 1, 0, 4096)]
                                           for b in range(4)])
    cpu = np.full(len(files), 3 * MS, dtype=np.int64)
    with _core.Engine(threads, 2) as engine:
        engine.set_files(paths)
        before = process_cpu_s()
        t0 = _core.now_ns()
        engine.start_epoch(EpochRequests(start, files, offset, length, cpu_ns=cpu))
        ready = [engine.next().ready_ns for _ in range(4)]
        assert engine.next() is None
        spent = process_cpu_s() - before
        counters = engine.counters()
    # 8 samples x 3 ms of CPU, spent by this process (not slept), and counted
    assert spent >= 8 * 0.003 * 0.95
    assert counters["preprocess_cpu_ns"] == 8 * 3 * MS
    assert counters["preprocess_wall_ns"] >= 8 * 3 * MS
    # a batch is ready only after its samples' CPU work: two of them at least
    assert ready[0] - t0 >= 2 * 3 * MS


def test_no_read_starts_before_the_loader_has_started(tmp_path):
    paths = make_files(tmp_path, [4096] * 4)
    start, files, offset, length = arrays([[(0, 0, 4096)], [(1, 0, 4096)]])
    began = np.zeros(len(files), dtype=np.int64)
    thread = np.zeros(len(files), dtype=np.int64)
    with _core.Engine(2, 2) as engine:
        engine.set_files(paths)
        not_before = _core.now_ns() + 80 * MS
        engine.start_epoch(EpochRequests(start, files, offset, length), start_ns=began,
                           thread=thread, not_before_ns=not_before)
        first = engine.next().ready_ns
        engine.next()
        assert first >= not_before and (began >= not_before).all()
        # the next epoch (not_before 0) starts at once
        t0 = _core.now_ns()
        engine.start_epoch(EpochRequests(start, files, offset, length))
        assert engine.next().ready_ns - t0 < 50 * MS


@pytest.mark.parametrize("whole", [True, False])
def test_whole_batches_are_each_read_by_one_thread(tmp_path, whole):
    """A DataLoader's worker makes each batch alone: with whole_batches every request of a
    batch is served by one reader thread; without, the threads share big batches."""
    paths = make_files(tmp_path, [1 << 20] * 16)
    batches = [[(f, 0, 1 << 20) for f in range(8 * b, 8 * b + 8)] for b in range(2)]
    start, files, offset, length = arrays(batches)
    began = np.zeros(len(files), dtype=np.int64)
    thread = np.full(len(files), -9, dtype=np.int64)
    # a little CPU work a sample, so that idle threads claim what they may meanwhile
    cpu = np.full(len(files), 2 * MS, dtype=np.int64)
    with _core.Engine(4, 2, whole_batches=whole) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(start, files, offset, length, cpu_ns=cpu),
                           start_ns=began, thread=thread)
        engine.next()
        engine.next()
    per_batch = [set(thread[int(start[b]):int(start[b + 1])].tolist()) for b in range(2)]
    if whole:
        assert all(len(t) == 1 for t in per_batch), per_batch
    else:  # 8 MiB batches in chunks of at most 4 MiB: two threads at least
        assert all(len(t) >= 2 for t in per_batch), per_batch


@pytest.mark.parametrize("cpu_ms,wait_ms", [(4, 0), (0, 4), (3, 2)])
def test_the_step_loop_spends_the_host_work_before_the_compute(tmp_path, cpu_ms, wait_ms):
    paths = make_files(tmp_path, [4096] * 4)
    start, files, offset, length = arrays([[(b, 0, 4096)] for b in range(4)])
    compute = np.full(4, 5 * MS, dtype=np.int64)
    host_cpu = np.full(4, cpu_ms * MS, dtype=np.int64)
    host_wait = np.full(4, wait_ms * MS, dtype=np.int64)
    out = np.zeros((4, 8), dtype=np.int64)
    with _core.Engine(1, 2) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(start, files, offset, length))
        cpu = time.thread_time_ns()
        done = engine.run_steps(_core.Pacer(), None, compute, _core.now_ns(), out,
                                host_cpu, host_wait)
        spent = time.thread_time_ns() - cpu
    assert done == 4
    got, deadline, computed = out[:, 2], out[:, 3], out[:, 4]
    began = deadline - compute  # the compute's start: after the host work
    assert (began - got >= (cpu_ms + wait_ms) * MS).all()
    assert (computed >= deadline).all()
    assert spent >= 4 * cpu_ms * MS  # the host CPU work ran on this (the calling) thread


def test_a_torch_loader_reads_workers_times_prefetch_factor_ahead():
    # DLIO's prefetch_factor: ceil(prefetch_size / workers), 2 when prefetch_size is 0
    assert batches_in_flight("pytorch", 4, 2) == 4
    assert batches_in_flight("pytorch", 4, 3) == 6
    assert batches_in_flight("pytorch", 0, 3) == 6
    assert batches_in_flight("pytorch", 2, 4) == 4
    assert batches_in_flight("pytorch", 8, 0) == 0  # no workers: read when asked for
    assert batches_in_flight("tensorflow", 4, 3) == 4  # tf.data's prefetch(prefetch_size)
