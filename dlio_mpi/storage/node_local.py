"""Node-local folders: where each node's copy goes (emulated nodes share one host, so each gets
a subfolder), and the collective check that a folder given as node-local is not one the nodes
share (each node's leader leaves a probe file and looks for the others'). Used by the tiers."""

from __future__ import annotations

import os

from ..errors import UserError, check_all
from ..ownership import create_exclusive, remove_quietly


def node_root(to: str, scope: str, node: int, emulated: bool) -> str:
    """Where this rank's copy goes."""
    return os.path.join(to, f"node{node}") if scope == "node" and emulated else to


def check_node_local(comm, to: str, node: int, leader: bool, tag: str) -> None:
    """Collective (scope node on real nodes): refuse a `to` that the nodes share."""
    probe = os.path.join(to, f".dlio_mpi-{tag}-node{node}.probe")

    def write() -> None:
        if leader:
            os.makedirs(to, exist_ok=True)
            os.close(create_exclusive(probe))

    check_all(comm, write)
    comm.Barrier()
    seen = []
    if leader:
        seen = sorted(n for n in os.listdir(to)
                      if n.startswith(f".dlio_mpi-{tag}-node") and n.endswith(".probe")
                      and n != os.path.basename(probe))
    seen = comm.allgather(seen)
    comm.Barrier()
    if leader:
        remove_quietly([probe])
    shared = [(n, s) for n, s in enumerate(seen) if s]
    if shared:
        raise UserError(f"storage.stage_in.scope: node, but {to} is one folder the nodes "
                        f"share (a rank sees {shared[0][1][0]}, another node's file there); "
                        "expected a node-local folder, or scope: job")
