"""Pacing of the emulated steps: the compute wait and the per-step synchronisation, precise to
a few microseconds so that what the emulator itself spends does not pass for storage time.

- Compute: a `clock_nanosleep` to an absolute deadline wakes up late by the timer slack (50 us
  by default; set to 1 ns here) and the scheduler's wake-up latency (tens to hundreds of us,
  more on a VM). The C pacer sleeps until a margin before the deadline and polls the clock for
  the rest; "auto" adapts the margin to the lateness this rank's sleeps show.
- Synchronisation: a persistent allreduce (a barrier that also carries a stop request from
  SIGINT/SIGTERM, see StepSync) polled with `sched_yield` between polls for
  `sync_spin_ns` (a runnable reader thread on this core gets the CPU at once), then with naps
  doubling from 10 us to 200 us, so a rank whose peers are stalled on storage does not keep
  taking the cores their readers need (at 16 ranks on 2 cores, fixed 20 us naps cost ~2 points
  of AU against doubling ones). MPICH's
  blocking barrier would poll without yielding.
- The batch: a step whose batch is still being read by the reader threads polls for it
  (yielding between polls) for `batch_spin_us` before sleeping until the readers signal it.
  A sleeping step loop starts tens to hundreds of microseconds after that signal on a VM (or
  from a deep C-state), time the emulator would add to every step that waits on storage.
  "auto" polls up to 2 ms where each thread of the host's ranks has a CPU of its own and the
  run replays reads alone, and not at all where they share (a poll would take a reader's
  core) or where it models a loader's costs (whose training process sleeps for its batch).
Both run inside the C step loop (dio_steps.c): no Python between a deadline and the next
compute."""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import numpy as np

from .. import _core

NAP_NS = 200_000            # the longest nap of the barrier (they double from 10 us)
AUTO_SYNC_SPIN_NS = 200_000
# "auto" batch poll where the threads have a CPU each: it covers the waits whose wake-up
# matters (mlperf/dlrm's 0.375 ms steps wait 0.4-0.6 ms for a batch on this VM); a step that
# waits longer is the storage's, a wake-up a few percent of it
AUTO_BATCH_SPIN_NS = 2_000_000


@dataclass
class Pacing:
    """How this rank paces its steps."""

    pacer: _core.Pacer
    sync_spin_ns: int
    batch_spin_auto: bool = True

    @property
    def compute_spin(self) -> str | float:
        return "auto" if self.pacer.adaptive else self.pacer.spin_ns / 1e3

    def to_json(self) -> dict:
        waits = max(self.pacer.waits, 1)
        return {"compute_spin_us": self.compute_spin,
                "compute_spin_us_now": self.pacer.spin_ns / 1e3,
                "compute_spun_us_per_wait": self.pacer.spun_ns / 1e3 / waits,
                "sync_spin_us": self.sync_spin_ns / 1e3,
                "batch_spin_us": "auto" if self.batch_spin_auto
                else self.pacer.batch_poll_ns / 1e3,
                "batch_spin_us_now": self.pacer.batch_poll_ns / 1e3,
                "batch_polled_seconds": self.pacer.batch_polled_ns / 1e9}


def auto_batch_spin_ns(host_ranks: int, read_threads: int, cpus: int,
                       loader_modelled: bool = False, background_threads: int = 0) -> int:
    """The batch poll of "auto": AUTO_BATCH_SPIN_NS where the step loops, read threads and
    `background_threads` (a rank's checkpoint writer and drain) of the host's ranks have a
    CPU each, else 0 (measured at mlperf/dlrm's batch on 2 CPUs: 1
    rank's 2 threads went from 25-33 to 14-18 us of overhead a step polling; 2 ranks' 4
    threads from about 430 to 540-570). Also 0 where the run models a loader's costs
    (`loader_modelled`: reader.preprocess_time, preprocess_cpu_time, step_cpu_time or
    step_wait_time): the real loader's training process sleeps until its batch comes and pays
    the wake-up, which the calibrated figures of docs/fidelity.md include (a polling step loop
    took a calibrated jpeg job at 1 worker from 0.965-0.975 of the real one to 0.83-0.90)."""
    threads = 1 + read_threads + background_threads
    fits = 0 < read_threads and host_ranks * threads <= cpus
    return AUTO_BATCH_SPIN_NS if fits and not loader_modelled else 0


def models_loader_costs(reader) -> bool:
    """Whether the `reader` config models a loader's costs beside its reads."""
    return any(t.mean > 0 for t in (reader.preprocess_time, reader.preprocess_cpu_time,
                                    reader.step_cpu_time, reader.step_wait_time))


def background_threads(cfg) -> int:
    """The threads a rank runs beside its step loop and readers while it trains: the
    asynchronous checkpoint writer and the drain (checkpoint/async_write.py, drain.py)."""
    ck = cfg.checkpoint
    if not cfg.workflow.checkpoint:
        return 0
    return int(ck.async_write) + int(ck.drain is not None)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a batch system's binding)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def make_pacing(compute_spin_us: float | None, sync_spin_us: float | None,
                batch_spin_us: float | None, auto_batch_ns: int) -> Pacing:
    """Pacing for this rank (None: "auto", the batch poll then `auto_batch_ns`); sets this
    thread's timer slack to the minimum."""
    _core.set_timer_slack_ns(0)
    batch = auto_batch_ns if batch_spin_us is None else int(batch_spin_us * 1e3)
    pacer = _core.Pacer(-1 if compute_spin_us is None else int(compute_spin_us * 1e3), batch)
    sync = AUTO_SYNC_SPIN_NS if sync_spin_us is None else int(sync_spin_us * 1e3)
    return Pacing(pacer, sync, batch_spin_us is None)


class StepSync:
    """The per-step synchronisation of a communicator, handed to the C step loop: a persistent
    allreduce (MAX) of one int32, this rank's stop signal (MPI 4 MPI_Allreduce_init; a
    persistent request skips building the collective's schedule each step, which costs ~30 us
    when the code is cold after a compute wait), started and tested through the MPI library's
    own MPI_Start and MPI_Test. It synchronises as a barrier does (no rank leaves before all
    arrived) and carries a SIGINT or SIGTERM any rank received to all of them in the same
    step, so that every rank stops after that step. Where the symbols cannot be found, or
    MPI_Allreduce_init is missing, the C loop calls back into mpi4py instead."""

    def __init__(self, comm, spin_ns: int) -> None:
        from mpi4py import MPI

        self.comm, self.spin_ns = comm, spin_ns
        self.stop_out = np.zeros(1, dtype=np.int32)
        self.stop_in = np.zeros(1, dtype=np.int32)
        try:
            self._request = comm.Allreduce_init(self.stop_out, self.stop_in, op=MPI.MAX)
        except (NotImplementedError, AttributeError, MPI.Exception):
            self._request = None
        functions = mpi_functions() if self._request is not None else None
        buffers = (self.stop_out.ctypes.data, self.stop_in.ctypes.data)
        if functions is not None:
            self._keep = None
            start, test = functions
            self._sync = (start, test, MPI._addressof(self._request), spin_ns, NAP_NS, *buffers)
        else:  # the request argument is unused by the callbacks, but must not be NULL
            self._keep = _callbacks(comm, self._request, self.stop_out, self.stop_in)
            start, test = (ctypes.cast(f, ctypes.c_void_p).value for f in self._keep)
            self._sync = (start, test, 1, spin_ns, NAP_NS, *buffers)

    @property
    def native(self) -> tuple[int, int, int, int, int, int, int]:
        """(MPI_Start, MPI_Test, the request's address, spin ns, nap ns, the send and the
        receive buffer's addresses) for the C loop."""
        return self._sync

    def synchronise(self) -> int:
        """One step's synchronisation from Python (for backends whose step loop is
        readers.python_steps), polled in C as the C step loop polls it; returns the stop
        signal any rank had, or 0."""
        _core.sync_once(self._sync)
        return int(self.stop_in[0])

    @property
    def failed(self) -> bool:
        """Did the last step's allreduce carry a rank's failed batch (_core.STEP_FAILED)? Then
        every rank ended its step loop with an error in that step, and they can agree on it."""
        return int(self.stop_in[0]) >= _core.STEP_FAILED

    def close(self) -> None:
        if self._request is not None:
            self._request.Free()
            self._request = None


_START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_TEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                         ctypes.c_void_p)


def _callbacks(comm, persistent, stop_out: np.ndarray, stop_in: np.ndarray):
    """MPI_Start/MPI_Test look-alikes calling mpi4py (the GIL is taken for each call)."""
    from mpi4py import MPI

    state = {"request": None}

    def start(_request) -> int:
        if persistent is not None:
            persistent.Start()
            state["request"] = persistent
        else:
            state["request"] = comm.Iallreduce(stop_out, stop_in, op=MPI.MAX)
        return 0

    def test(_request, flag, _status) -> int:
        flag[0] = 1 if state["request"].Test() else 0
        return 0

    return _START(start), _TEST(test)


@functools.lru_cache(maxsize=1)
def mpi_functions() -> tuple[int, int] | None:
    """Addresses of MPI_Start and MPI_Test in the MPI library mpi4py loaded (found among the
    shared libraries this process maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line and "/" in line}
    except OSError:
        return None
    for path in sorted(paths, key=lambda p: "mpi" not in os.path.basename(p).lower()):
        if "mpi" not in os.path.basename(path).lower():
            break
        try:
            lib = ctypes.CDLL(path)
            start, test = lib.MPI_Start, lib.MPI_Test
        except (OSError, AttributeError):
            continue
        return (ctypes.cast(start, ctypes.c_void_p).value,
                ctypes.cast(test, ctypes.c_void_p).value)
    return None
