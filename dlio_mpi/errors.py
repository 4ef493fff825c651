"""Errors, and the two patterns that keep a failure on one rank from hanging the others.

- `check_all(comm, fn)`: every rank runs a check; the outcome is agreed with one allgather, so
  either every rank goes on or every rank raises `JobError` with the same message.
- `on_root(comm, fn)`: rank 0 computes something and broadcasts the result or its error.
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


class Stopped(JobError):
    """The ranks agreed to stop early on a signal (SIGINT, SIGTERM); exits 128 + its number,
    as a process that signal ended would."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_status = 128 + signum


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
    with the distinct messages (and which ranks saw them when not all did)."""
    result, message = None, None
    try:
        result = fn()
    except expected as exc:
        message = describe(exc)
    messages = comm.allgather(message)
    failed = [(rank, msg) for rank, msg in enumerate(messages) if msg is not None]
    if failed:
        raise JobError(_merge(failed, comm.Get_size()))
    return result


def on_root(comm, fn: Callable[[], T], expected=(UserError, OSError, ValueError),
            nap: bool = False) -> T:
    """Run `fn` on rank 0 only and broadcast its result; if it raised `expected`, every rank
    raises JobError with its message. nap: the other ranks wait for rank 0 asleep (for work
    of a second or more: a blocking bcast spins, and where ranks share cores rank 0's work
    took a third longer beside them)."""
    payload = None
    if comm.Get_rank() == 0:
        try:
            payload = (True, fn())
        except expected as exc:
            payload = (False, describe(exc))
    if nap:
        napping_barrier(comm)
    ok, value = comm.bcast(payload, root=0)
    if not ok:
        raise JobError(value)
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


def agreed_stop(comm) -> int:
    """The stop a signal asked of any rank (SIGINT or SIGTERM: its number, the highest where
    the ranks differ), agreed by all ranks with one allreduce; 0 when none was asked."""
    from mpi4py import MPI

    from . import _core

    return comm.allreduce(_core.stop_signal(), op=MPI.MAX)
