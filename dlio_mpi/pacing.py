"""Pacing of the emulated steps: the compute wait and the per-step synchronisation, precise to
a few microseconds so that what the emulator itself spends does not pass for storage time.

- Compute: a `clock_nanosleep` to an absolute deadline wakes up late by the timer slack (50 us
  by default; set to 1 ns here) and the scheduler's wake-up latency (tens to hundreds of us,
  more on a VM). The C pacer sleeps until a margin before the deadline and polls the clock for
  the rest; "auto" adapts the margin to the lateness this rank's sleeps show.
- Synchronisation: a non-blocking barrier polled with `sched_yield` between polls for
  `sync_spin_ns` (a runnable reader thread on this core gets the CPU at once), then with short
  naps, so a rank whose peers are stalled on storage does not keep a core busy. MPICH's
  blocking barrier would poll without yielding."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _core

NAP_NS = 20_000             # one nap of the barrier past its spin (plus the wake-up latency)
AUTO_SYNC_SPIN_NS = 200_000


@dataclass
class Pacing:
    """How this rank paces its steps."""

    pacer: _core.Pacer
    sync_spin_ns: int

    @property
    def compute_spin(self) -> str | float:
        return "auto" if self.pacer.adaptive else self.pacer.spin_ns / 1e3

    def to_json(self) -> dict:
        waits = max(self.pacer.waits, 1)
        return {"compute_spin_us": self.compute_spin,
                "compute_spin_us_now": self.pacer.spin_ns / 1e3,
                "compute_spun_us_per_wait": self.pacer.spun_ns / 1e3 / waits,
                "sync_spin_us": self.sync_spin_ns / 1e3}


def make_pacing(compute_spin_us: float | None, sync_spin_us: float | None) -> Pacing:
    """Pacing for this rank (None: "auto"); sets this thread's timer slack to the minimum."""
    _core.set_timer_slack_ns(0)
    pacer = _core.Pacer(-1 if compute_spin_us is None else int(compute_spin_us * 1e3))
    sync = AUTO_SYNC_SPIN_NS if sync_spin_us is None else int(sync_spin_us * 1e3)
    return Pacing(pacer, sync)


class StepBarrier:
    """The per-step synchronisation of a communicator: a persistent barrier (MPI 4
    MPI_Barrier_init, started each step; a fresh MPI_Ibarrier where the MPI library lacks it).
    A persistent request skips building the collective's schedule every step, which costs
    ~30 us when the code is cold after a compute wait of milliseconds, against ~4 us."""

    def __init__(self, comm, spin_ns: int) -> None:
        self.comm, self.spin_ns = comm, spin_ns
        try:
            self._request = comm.Barrier_init()
        except (NotImplementedError, AttributeError):
            self._request = None

    def wait(self) -> None:
        """Return once every rank has called it: poll the barrier, yielding the core between
        polls for up to spin_ns, then napping between polls."""
        request = self._request
        if request is None:
            request = self.comm.Ibarrier()
        else:
            request.Start()
        if request.Test():
            return
        now, test, yield_ = _core.now_ns, request.Test, os.sched_yield
        deadline = now() + self.spin_ns
        while not test():
            t = now()
            if t < deadline:
                yield_()
            else:
                _core.sleep_until_ns(t + NAP_NS, 0)

    def close(self) -> None:
        if self._request is not None:
            self._request.Free()
            self._request = None
