"""What a run needs recorded to be reproduced and compared: the software that ran (versions of
dlio-mpi, the MPI library, mpi4py, numpy, Python and the format libraries this run loaded), the
command line, and where the ranks ran (hosts, ranks per node)."""

from __future__ import annotations

import platform
import socket
import sys
from importlib import metadata
from typing import Any

# format and framework libraries, recorded only when this run imported them (importing torch or
# tensorflow to learn its version would cost seconds and memory on every rank)
OPTIONAL = {"h5py": "h5py", "pyarrow": "pyarrow", "PIL": "pillow", "torch": "torch",
            "tensorflow": "tensorflow", "pandas": "pandas"}


def _version(module: str, distribution: str) -> str | None:
    found = sys.modules.get(module)
    version = getattr(found, "__version__", None)
    if version is None:
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None
    return str(version)


def software_versions() -> dict[str, Any]:
    """Versions of the software this process runs with."""
    import mpi4py
    import numpy
    import yaml

    from .. import __version__

    versions: dict[str, Any] = {
        "dlio_mpi": __version__, "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "mpi4py": mpi4py.__version__, "numpy": numpy.__version__, "pyyaml": yaml.__version__}
    for module, distribution in OPTIONAL.items():
        if module in sys.modules:
            versions[distribution] = _version(module, distribution)
    return versions


def mpi_description() -> dict[str, Any]:
    """The MPI library: vendor name and version (as mpi4py reports them), the first line of
    MPI_Get_library_version, and the MPI standard it implements."""
    from mpi4py import MPI

    from ..mpi.library import mpi_library

    name, version = MPI.get_vendor()
    return {"name": name, "version": ".".join(str(v) for v in version),
            "library_version": mpi_library(),
            "standard": ".".join(str(v) for v in MPI.Get_version())}


def placement(comm, node: int) -> list[dict[str, Any]] | None:
    """Collectively: on rank 0, each node (emulated nodes too) with its host and ranks, in node
    order; None on the other ranks."""
    where = comm.gather((node, socket.gethostname()), root=0)
    if where is None:
        return None
    nodes: dict[int, dict[str, Any]] = {}
    for rank, (index, host) in enumerate(where):
        entry = nodes.setdefault(index, {"node": index, "host": host, "ranks": []})
        entry["ranks"].append(rank)
    return [nodes[i] for i in sorted(nodes)]


def ranks_per_host(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """How many ranks ran on each host (emulated nodes of one host counted together)."""
    counts: dict[str, int] = {}
    for entry in nodes:
        counts[entry["host"]] = counts.get(entry["host"], 0) + len(entry["ranks"])
    return counts


def describe_environment(comm, node: int) -> dict[str, Any] | None:
    """Collectively: the run's environment on rank 0 (None elsewhere)."""
    nodes = placement(comm, node)
    if nodes is None:
        return None
    return {"versions": software_versions(), "mpi": mpi_description(),
            "command_line": list(sys.argv), "executable": sys.executable,
            "ranks": comm.Get_size(), "ranks_per_host": ranks_per_host(nodes),
            "nodes": nodes}
