"""MPI-IO plumbing shared by the MPI-IO readers, collective generation and shared checkpoints:
hints as an MPI.Info, opening a file with an error that names it, MPI errors as OSErrors."""

from __future__ import annotations

import errno

from mpi4py import MPI


def info_of(hints: dict[str, str]) -> MPI.Info:
    info = MPI.Info.Create()
    for name, value in hints.items():
        info.Set(name, value)
    return info


def mpi_oserror(exc: MPI.Exception, what: str, path: str) -> OSError:
    """An MPI-IO error as an OSError naming `path` (with the errno of its class where there
    is one): `what`, then the text of its class (the full string is a call stack)."""
    kind = exc.Get_error_class()
    code = {MPI.ERR_NO_SUCH_FILE: errno.ENOENT, MPI.ERR_FILE_EXISTS: errno.EEXIST,
            MPI.ERR_NO_SPACE: errno.ENOSPC, MPI.ERR_QUOTA: errno.EDQUOT,
            MPI.ERR_ACCESS: errno.EACCES}.get(kind, errno.EIO)
    return OSError(code, f"{what}: {MPI.Get_error_string(kind)}", path)


def open_file(comm, path: str, info: MPI.Info, mode: int = MPI.MODE_RDONLY) -> MPI.File:
    """File.Open (collective on `comm`), read-only unless `mode` says otherwise; an OSError
    naming the file if refused."""
    try:
        return MPI.File.Open(comm, path, mode, info)
    except MPI.Exception as exc:
        verb = "create" if mode & MPI.MODE_CREATE else "open"
        raise mpi_oserror(exc, f"cannot {verb} {path} with MPI-IO", path) from None
