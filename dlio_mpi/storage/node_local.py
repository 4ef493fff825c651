"""Node-local folders: where each node's copy goes (emulated nodes share one host, so each gets
a subfolder), and the collective check that a folder given as node-local is not one the nodes
share (each node's leader leaves a probe file and looks for the others'). Used by the tiers."""

from __future__ import annotations

import os

from ..errors import UserError, check_all
from . import storage_for


def node_root(to: str, scope: str, node: int, emulated: bool) -> str:
    """Where this rank's copy goes."""
    return os.path.join(to, f"node{node}") if scope == "node" and emulated else to


def check_node_local(comm, to: str, node: int, leader: bool, tag: str) -> None:
    """Collective (scope node on real nodes): refuse a `to` that the nodes share."""
    probe = os.path.join(to, f".dlio_mpi-{tag}-node{node}.probe")
    fs = storage_for(to)

    def write() -> None:
        if leader:
            fs.make_folders(to)
            fs.close(fs.create_exclusive(probe))

    check_all(comm, write)
    comm.Barrier()
    seen = []
    if leader:
        seen = sorted(e.name for e in fs.list(to)
                      if e.name.startswith(f".dlio_mpi-{tag}-node")
                      and e.name.endswith(".probe") and e.name != os.path.basename(probe))
    seen = comm.allgather(seen)
    comm.Barrier()
    if leader:
        fs.remove_quietly([probe])
    shared = [(n, s) for n, s in enumerate(seen) if s]
    if shared:
        raise UserError(f"storage.stage_in.scope: node, but {to} is one folder the nodes "
                        f"share (a rank sees {shared[0][1][0]}, another node's file there); "
                        "expected a node-local folder, or scope: job")
