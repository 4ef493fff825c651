"""Which MPI library runs, which MPI-IO layer reads its files, and which MPI-IO hints that
layer reports back.

MPICH and its derivatives (Intel MPI, Cray MPICH, MVAPICH) read files through ROMIO. Open MPI
has two io components, OMPIO (its default) and ROMIO (`romio341` in Open MPI 5), chosen per
file by priority unless the MCA parameter `io` names one (OMPI_MCA_io, `mpiexec --mca io`, an
MCA parameter file). Open MPI has no call that says which component a file got; only its
`io_base_verbose` output on stderr does. So the decision is made from what the open file
reports (File.Get_info): ROMIO always reports its own `romio_*` hints, with defaults for those
not given, while OMPIO reports none of them (Open MPI 5.0 reports only cb_buffer_size, cb_nodes
and collective_buffering, and only when they were given). tests/test_openmpi.py checks this
decision against Open MPI's verbose output for both components.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Mapping

ROMIO, OMPIO = "ROMIO", "OMPIO"
# honoured_hints statuses
HONOURED, OTHER_VALUE, NOT_REPORTED = "honoured", "other_value", "not_reported"


def mpi_library() -> str:
    """The first line of MPI_Get_library_version (Open MPI ends it with a NUL, dropped)."""
    from mpi4py import MPI

    lines = MPI.Get_library_version().replace("\0", "").strip().splitlines()
    return lines[0].strip() if lines else ""


def is_open_mpi() -> bool:
    """Whether mpi4py runs on Open MPI (or a derivative defining OPEN_MPI)."""
    from mpi4py import MPI

    return MPI.get_vendor()[0] == "Open MPI"


def file_hints(handle) -> dict[str, str]:
    """The hints the MPI-IO layer reports for an open MPI.File (File.Get_info)."""
    info = handle.Get_info()
    try:
        return {info.Get_nthkey(i): info.Get(info.Get_nthkey(i))
                for i in range(info.Get_nkeys())}
    finally:
        info.Free()


def mpiio_implementation(effective: Mapping[str, str] | None = None) -> str:
    """"ROMIO" or "OMPIO": the MPI-IO layer that reads this library's files. Outside Open MPI,
    ROMIO. Under Open MPI, decided from `effective`, the hints an open file reports
    (file_hints): ROMIO if any `romio_*` hint is among them, else OMPIO. Without `effective`,
    a scratch file is opened on MPI.COMM_SELF to look (once per process; Open MPI chooses per
    file, so give a data file's hints where there is one)."""
    if not is_open_mpi():
        return ROMIO
    if effective is None:
        effective = _scratch_file_hints()
    return ROMIO if any(name.startswith("romio_") for name in effective) else OMPIO


@functools.lru_cache(maxsize=1)
def _scratch_file_hints() -> dict[str, str]:
    """The hints reported for an empty temporary file opened read-only on MPI.COMM_SELF."""
    from mpi4py import MPI

    fd, path = tempfile.mkstemp(prefix="dlio_mpi-probe-")
    os.close(fd)
    try:
        handle = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDONLY)
        try:
            return file_hints(handle)
        finally:
            handle.Close()
    finally:
        os.unlink(path)


def _same(requested: str, reported: str) -> bool:
    """Equal as MPI spells hint values: case and surrounding blanks aside, or equal integers."""
    a, b = requested.strip().lower(), reported.strip().lower()
    if a == b:
        return True
    try:
        return int(a) == int(b)
    except ValueError:
        return False


def honoured_hints(requested: Mapping[str, str],
                   effective: Mapping[str, str]) -> dict[str, dict[str, str | None]]:
    """For each requested hint, whether the MPI-IO layer reports it back (`effective`, from
    file_hints): {name: {"requested", "reported" (None if absent), "status"}}, status
    "honoured" (reported with the requested value), "other_value" (reported with another:
    the layer adjusted or ignored it) or "not_reported" (unknown to the layer, or not
    applicable to the file system). A reported value is the best evidence MPI gives that a
    hint is in use; it does not prove that the layer acts on it."""
    out: dict[str, dict[str, str | None]] = {}
    for name, value in requested.items():
        reported = effective.get(name)
        if reported is None:
            status = NOT_REPORTED
        else:
            status = HONOURED if _same(str(value), reported) else OTHER_VALUE
        out[name] = {"requested": str(value), "reported": reported, "status": status}
    return out
