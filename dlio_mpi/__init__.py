"""dlio-mpi: replays the I/O of deep-learning training jobs on HPC storage, one MPI rank per
emulated accelerator, and reports accelerator utilisation, throughput and the I/O pattern."""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _installed_copy() -> "str | None":
    """The installed dlio_mpi folder, when this one is a source checkout whose C core was
    never built (`python -m dlio_mpi` run in the checkout's root finds the source first)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if any(name.startswith("_core.") and name.endswith((".so", ".pyd"))
           for name in _os.listdir(here)):
        return None
    for entry in _sys.path:
        folder = _os.path.join(_os.path.abspath(entry or _os.curdir), "dlio_mpi")
        if folder != here and _os.path.isdir(folder) and any(
                name.startswith("_core.") and name.endswith((".so", ".pyd"))
                for name in _os.listdir(folder)):
            return folder
    return None


# The source checkout holds no compiled core (the install builds it into site-packages):
# take every submodule from the installed copy, so that `python -m dlio_mpi` runs what
# `dlio-mpi` runs wherever it is started.
_installed = _installed_copy()
if _installed is not None:
    __path__[:] = [_installed]  # noqa: F821 (a package's __path__)
del _installed
