"""Errors, and the two patterns that keep a failure on one rank from hanging the others.

- `check_all(comm, fn)`: every rank runs a check; the outcome is agreed with one allgather, so
  either every rank goes on or every rank raises `JobError` with the same message.
- `on_root(comm, fn)`: rank 0 computes something and broadcasts the result or its error.
- `agreed_failure(comm, exc)`: where every rank already knows that one failed (a batch that
  failed in training is carried by its step's allreduce: training._end_failed), their
  messages as one JobError.
Anything else that fails on a rank is fatal: the entry point prints it once and aborts the
communicator (see cli.main)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """Bad input (configuration, dataset, environment) that the user must fix."""


# How to install an optional package, for the messages that need one. dlio-mpi itself is
# installed from its checkout (it is not on PyPI, so no "dlio-mpi[extra]"), and torch's PyPI
# wheel for Linux is the CUDA build (2.7 GB of NVIDIA packages): point at the CPU build.
_INSTALL = {
    "torch": "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
    "tensorflow": "pip install tensorflow-cpu==2.21.0",
}


def install_hint(module: str) -> str:
    """The pip command that installs `module` (an importable name) as dlio-mpi expects it."""
    return _INSTALL.get(module, f"pip install {module}")


class ConfigError(UserError, ValueError):
    """An invalid configuration: one line naming the key, the value and what is accepted."""


class JobError(UserError):
    """A UserError that all ranks agreed on; rank 0 reports it, every rank exits non-zero."""

    exit_status = 2
    heading = "error: "  # what rank 0's line says after "dlio-mpi: "


class Stopped(JobError):
    """The ranks agreed to stop early on a signal (SIGINT, SIGTERM); exits 128 + its number,
    as a process that signal ended would."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum


class StopRequested(Exception):
    """Raised on a rank by a loop that moves bytes or waits (a checkpoint write or read, a
    copy, a paced snapshot, a staging read) when it saw the stop signal (SIGINT, SIGTERM):
    not a failure. check_all and on_root turn it into Stopped on every rank, where the
    caller abandons what it was doing and the run ends with its results so far."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {_signal_name(signum)}")
        self.signum = signum


def raise_if_stopped() -> None:
    """StopRequested when a stop signal was received (for loops in Python that move bytes
    or wait: between two calls)."""
    from . import _core

    if signum := _core.stop_signal():
        raise StopRequested(signum)


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stopped_everywhere(signum: int) -> Stopped:
    """The Stopped every rank raises when the ranks agreed on a stop by `signum`."""
    return Stopped(f"stopped by {_signal_name(signum)}", signum)


def startup_stop_text(signum: int) -> str:
    """What the job says when a signal stops it before the run's own stop handling."""
    return f"stopped by {_signal_name(signum)} during start-up"


def stop_if_asked(comm) -> None:
    """Start-up's agreement on a stop: a SIGINT or SIGTERM any rank recorded so far (cli.main
    records them before MPI starts) ends every rank with Stopped, said as a stop, not an
    error."""
    signum = agreed_stop(comm)
    if signum:
        stop = Stopped(startup_stop_text(signum), signum)
        stop.heading = ""
        raise stop


def describe(exc: BaseException) -> str:
    """One line for an exception: an OSError's own text (the C core's names the file), with
    the file added where it does not, without Python's "[Errno N]" decoration."""
    if isinstance(exc, OSError) and exc.strerror:
        what = exc.strerror
        if exc.filename and str(exc.filename) not in what:
            what += f": {exc.filename}"
        return what
    return str(exc) or type(exc).__name__


def check_all(comm, fn: Callable[[], T], expected=(UserError, OSError, ValueError)) -> T:
    """Run `fn` on every rank; if it raised `expected` on any rank, raise JobError everywhere
    with the distinct messages (and which ranks saw them when not all did); else, if it
    raised StopRequested on any rank, Stopped everywhere."""
    result, failure = None, None
    try:
        result = fn()
    except StopRequested as exc:
        failure = exc
    except expected as exc:
        failure = exc
    agreed = agreed_failure(comm, failure)
    if agreed is not None:
        raise agreed
    return result


def agreed_failure(comm, failure: BaseException | None) -> JobError | None:
    """Collectively: this rank's `failure` (None: none) and the others' as one JobError, with
    the distinct messages (and which ranks saw them when not all did); a StopRequested is a
    stop, not a failure: Stopped when no rank failed otherwise; None when no rank did either.
    A Stopped already agreed by a collective inside (a writer's own check_all) stays a stop."""
    if isinstance(failure, (StopRequested, Stopped)):
        mine = (None, failure.signum)
    else:
        mine = (None if failure is None else describe(failure), 0)
    outcomes = comm.allgather(mine)
    failed = [(rank, msg) for rank, (msg, _) in enumerate(outcomes) if msg is not None]
    if failed:  # a failure outweighs a stop
        return JobError(_merge(failed, comm.Get_size()))
    stops = [signum for _, signum in outcomes if signum]
    return stopped_everywhere(max(stops)) if stops else None


def on_root(comm, fn: Callable[[], T], expected=(UserError, OSError, ValueError),
            nap: bool = False) -> T:
    """Run `fn` on rank 0 only and broadcast its result; if it raised `expected`, every rank
    raises JobError with its message (Stopped for StopRequested). nap: the other ranks wait
    for rank 0 asleep (for work of a second or more: a blocking bcast spins, and where ranks
    share cores rank 0's work took a third longer beside them)."""
    payload = None
    if comm.Get_rank() == 0:
        try:
            payload = (True, fn())
        except (StopRequested, Stopped) as exc:  # a stop, whether agreed inside or not
            payload = (False, exc.signum)
        except expected as exc:
            payload = (False, describe(exc))
    if nap:
        napping_barrier(comm)
    ok, value = comm.bcast(payload, root=0)
    if not ok:
        raise stopped_everywhere(value) if isinstance(value, int) else JobError(value)
    return value


def napping_barrier(comm, nap_seconds: float = 0.001) -> None:
    """A barrier whose waiting ranks sleep: a nonblocking one, polled every `nap_seconds`."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(nap_seconds)


def _merge(failed: list[tuple[int, str]], size: int) -> str:
    by_message: dict[str, list[int]] = {}
    for rank, msg in failed:
        by_message.setdefault(msg, []).append(rank)
    lines = []
    for msg, ranks in by_message.items():
        if len(ranks) == size:
            lines.append(msg)
        else:
            lines.append(f"{msg} (on rank{'s' if len(ranks) > 1 else ''} "
                         f"{', '.join(map(str, ranks))})")
    return "\n".join(lines)


def agreed_stop(comm, mine: int | None = None) -> int:
    """The stop a signal asked of any rank (SIGINT or SIGTERM: its number, the highest where
    the ranks differ; `mine`: this rank's, default the signal it received), agreed by all
    ranks with one allreduce; 0 when none was asked."""
    from mpi4py import MPI

    from . import _core

    return comm.allreduce(_core.stop_signal() if mine is None else mine, op=MPI.MAX)
