"""Collective MPI-IO writes and reads of one shared file in rounds: each rank has a list of
blocks (file offset, bytes, and what to put there or check there), and round r is one
Write_at_all (Read_at_all) in which every rank moves its block r, or nothing once it has no
more; the number of rounds is agreed (the most blocks any rank has). Every round's errors are
agreed by all ranks (errors.check_all), so a rank failing never leaves the others waiting in
the next collective call; a stop signal ends them all before the next round (Stopped). Used
by shared dataset generation and shared checkpoints."""

from __future__ import annotations

import errno
from collections.abc import Callable

import numpy as np

from ..errors import check_all, raise_if_stopped

# (file offset, bytes, fill or check): fill(view) puts the block's bytes in view (writes);
# check(view) raises OSError if view does not hold them (reads)
Block = tuple[int, int, Callable[[np.ndarray], None]]


def open_shared(comm, path: str, hints: dict[str, str], mode: int):
    """File.Open of `path` on `comm` with `hints`, its errors agreed by all ranks (JobError
    naming the file)."""
    from .mpiio import info_of, open_file

    info = info_of(hints)
    try:
        return check_all(comm, lambda: open_file(comm, path, info, mode))
    finally:
        info.Free()


def write_rounds(comm, handle, blocks: list[Block], path: str) -> int:
    """Write this rank's `blocks` to the open file `handle` collectively; the bytes written."""
    from mpi4py import MPI

    def move(buffer: np.ndarray, offset: int, n: int, fill) -> None:
        failed = None
        try:
            if n:
                fill(buffer[:n])
        except (OSError, ValueError, MemoryError) as exc:  # still take part, then say so
            failed, n = exc, 0
        status = MPI.Status()
        mpiio_call(lambda: handle.Write_at_all(offset if n else 0, [buffer, n, MPI.BYTE],
                                               status), "write", path)
        if failed is not None:
            raise failed
        _check_count(status.Get_count(MPI.BYTE), n, offset, "write", path)

    return _rounds(comm, blocks, move)


def read_rounds(comm, handle, blocks: list[Block], path: str) -> int:
    """Read this rank's `blocks` from the open file `handle` collectively, checking each
    with its check(view); the bytes read."""
    from mpi4py import MPI

    def move(buffer: np.ndarray, offset: int, n: int, check) -> None:
        status = MPI.Status()
        mpiio_call(lambda: handle.Read_at_all(offset if n else 0, [buffer, n, MPI.BYTE],
                                              status), "read", path)
        _check_count(status.Get_count(MPI.BYTE), n, offset, "read", path)
        if n:
            check(buffer[:n])

    return _rounds(comm, blocks, move)


def _rounds(comm, blocks: list[Block], move) -> int:
    from mpi4py import MPI

    rounds = comm.allreduce(len(blocks), op=MPI.MAX)
    buffer = np.empty(max((n for _, n, _ in blocks), default=0), dtype=np.uint8)

    def round_of(offset: int, n: int, act) -> None:
        raise_if_stopped()  # agreed by check_all: every rank leaves before this round
        move(buffer, offset, n, act)

    for r in range(rounds):
        offset, n, act = blocks[r] if r < len(blocks) else (0, 0, None)
        check_all(comm, lambda offset=offset, n=n, act=act: round_of(offset, n, act))
    return sum(n for _, n, _ in blocks)


def _check_count(got: int, n: int, offset: int, verb: str, path: str) -> None:
    if got != n:
        raise OSError(errno.EIO, f"short {verb}: {got} of {n} bytes at offset {offset} of "
                                 f"{path}", path)


def mpiio_call(call, verb: str, path: str):
    """An MPI-IO call whose errors are OSErrors naming `path`."""
    from mpi4py import MPI

    from .mpiio import mpi_oserror

    try:
        return call()
    except MPI.Exception as exc:
        raise mpi_oserror(exc, f"cannot {verb} {path} with MPI-IO", path) from None
