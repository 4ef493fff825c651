"""Live progress on rank 0: generation (files), each epoch (steps), each checkpoint (rank 0's
share, in bytes).

On a terminal a tqdm bar with rate and ETA; otherwise (batch logs, srun) a plain line every
`output.progress_interval` seconds at most. Only rank 0 shows anything, from what it sees
itself (its own files, its own steps): no collective per update. A step loop running in C
with the GIL released is followed by a thread polling the step records it fills in place
(`watch`), so the loop itself does nothing more per step.

The run configures the reporter once (`configure`); code deep in the run asks for a `task`,
which is a no-op on other ranks or with progress off."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

BAR_POLL_SECONDS = 0.25  # a bar redraws a few times a second at most
BYTES = "bytes"  # the unit of tasks counted in bytes: shown in MiB (lines) or scaled (bar)


class Task:
    """One piece of work of `total` units (files, steps, bytes) being followed."""

    def __init__(self, what: str, total: int, unit: str, interval: float = 0.0,
                 stream: TextIO | None = None, bar: bool = False) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.interval, self.stream = interval, stream
        self.done = 0
        self._bar = None
        self._start = self._last = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the watching thread and the loop both update
        self._thread: threading.Thread | None = None
        self._count: Callable[[], int] | None = None
        self._volume: Callable[[], int] | None = None
        self._mark = (self._start, 0, 0)  # time, units and bytes at the last line
        if stream is not None and bar:
            from tqdm import tqdm

            # a terminal reporting no size (a bare pseudo-terminal) gets 80 x 24
            sized = _columns(stream) > 0
            scaled = dict(unit="B", unit_scale=True, unit_divisor=1024) \
                if unit == BYTES else dict(unit=f" {unit}")
            self._bar = tqdm(total=total, desc=what, file=stream,
                             mininterval=BAR_POLL_SECONDS, dynamic_ncols=sized,
                             ncols=None if sized else 80, nrows=None if sized else 24,
                             leave=True, **scaled)

    @property
    def active(self) -> bool:
        return self.stream is not None

    # ------------------------------------------------------------------ updates
    def advance(self, n: int = 1) -> None:
        """`n` more units done (from the loop doing them)."""
        if self.active:
            with self._lock:
                self._update(self.done + n)

    def update_to(self, done: int) -> None:
        """`done` units done so far (also called unchanged by the watching thread: a line
        is due every interval however far the work got, so a stall shows)."""
        if self.active:
            with self._lock:
                self._update(done)

    def _update(self, done: int) -> None:
        if self._bar is not None:
            if done != self.done:
                self._bar.update(done - self.done)
            else:
                self._bar.refresh()  # the elapsed time moves on
            self.done = done
            return
        self.done = done
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f" ({100 * self.done / self.total:.1f} %)" if self.total else ""
        eta = (f", ETA {_clock((self.total - self.done) / rate)}"
               if rate > 0 and self.total else "")
        # the last interval alone (fio's --status-interval): rank 0's view
        since, done_then, bytes_then = self._mark
        volume = self._volume() if self._volume is not None else 0
        span = now - since
        recent = ""
        if span > 0 and since > self._start:
            recent = f"; last {span:.0f} s: {self._rate((self.done - done_then) / span)}"
            if self._volume is not None:
                recent += f", rank 0 read {(volume - bytes_then) / span / 2**20:.1f} MiB/s"
        self._mark = (now, self.done, volume)
        if self.unit == BYTES:
            amount = f"{self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
        else:
            amount = f"{self.done}/{self.total} {self.unit}"
        print(f"progress: {self.what}: {amount}{share}, {self._rate(rate)}, "
              f"{_clock(elapsed)} elapsed{eta}{recent}", file=self.stream, flush=True)

    def _rate(self, per_second: float) -> str:
        if self.unit == BYTES:
            return f"{per_second / 2**20:.1f} MiB/s"
        return f"{per_second:.1f} {self.unit}/s"

    # ------------------------------------------------------------------ following a counter
    def watch(self, count: Callable[[], int] | None = None,
              volume: Callable[[], int] | None = None) -> None:
        """Follow `count()` (units done; by default what `advance` said) from a background
        thread until the task closes; `volume()`: bytes this rank read so far, for the
        lines' read rate of the last interval."""
        if not self.active:
            return
        self._volume = volume
        period = BAR_POLL_SECONDS if self._bar is not None else min(self.interval, 1.0)

        self._count = count

        def poll() -> None:
            while not self._stop.wait(period):
                if count is None:
                    with self._lock:
                        self._update(self.done)
                else:
                    self.update_to(count())

        self._thread = threading.Thread(target=poll, name="dlio-mpi-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self._count is not None and self._bar is not None:
                self.update_to(self._count())  # the bar ends where the work ended
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else \
        f"{rest // 60:02d}:{rest % 60:02d}"


class Reporter:
    """Where progress goes: nowhere (other ranks, `output.progress_interval: 0`), a bar when
    the stream is a terminal, else lines."""

    def __init__(self, interval: float = 0.0, stream: TextIO | None = None) -> None:
        self.interval = interval
        self.stream = stream if interval > 0 else None
        self.bar = self.stream is not None and _is_terminal(self.stream)

    def task(self, what: str, total: int, unit: str) -> Task:
        return Task(what, total, unit, self.interval, self.stream, self.bar)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


_reporter = Reporter()


def configure(rank: int, interval: float, stream: TextIO | None = None) -> None:
    """Show progress on rank 0 (to `stream`, default stdout) every `interval` seconds (0: off)."""
    global _reporter
    _reporter = Reporter(interval if rank == 0 else 0.0, stream or sys.stdout)


def task(what: str, total: int, unit: str) -> Task:
    """A task of the configured reporter (inactive unless rank 0 shows progress)."""
    return _reporter.task(what, total, unit)


def write(text: str) -> None:
    """Rank 0's lines on stdout in one write (they come from several threads), above a bar
    being drawn there (tqdm.write clears it and draws it again) so that neither breaks the
    other."""
    if _reporter.bar and _reporter.stream is sys.stdout:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stdout)
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()
