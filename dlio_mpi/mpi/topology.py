"""Which ranks share a node, and what the nodes are.

Nodes are found with MPI (`Split_type(COMM_TYPE_SHARED)`: the ranks that share memory). For
tests and single-host studies, DLIO_MPI_RANKS_PER_NODE=N splits each host's ranks into emulated
nodes of N consecutive ranks; everything per node (host fields, page-cache checks, node-local
work) then follows the emulated nodes, so multi-node behaviour can be exercised on one machine.

Clocks: CLOCK_MONOTONIC is one clock per host; across hosts each host leader's offset to rank
0's clock is estimated once (the best of a few ping-pongs), so per-step stamps of different
hosts can be compared (barrier arrivals)."""

from __future__ import annotations

import collections
import dataclasses
import os
import platform
import socket
from dataclasses import dataclass

from .. import _core
from ..errors import UserError
from .host_memory import Budget, node_budget

ENV_RANKS_PER_NODE = "DLIO_MPI_RANKS_PER_NODE"
PING_PONGS = 8


@dataclass(frozen=True)
class HostInfo:
    """What a node leader reports about its node (DLIO's host fields)."""

    hostname: str
    cpu_count: int
    memory_bytes: int
    processor: str
    budget: Budget | None = None  # what the host could still give the job when it started


@dataclass(frozen=True)
class Topology:
    node: int             # this rank's node index (nodes numbered by their first rank)
    nodes: int
    local_rank: int       # rank within the node
    local_size: int       # ranks on this node
    host_ranks: int       # ranks on this rank's host (emulated nodes share it)
    ranks_per_node: int   # ranks on rank 0's node (DLIO's npernode)
    emulated: bool        # nodes split by DLIO_MPI_RANKS_PER_NODE
    clock_offset_ns: int  # this rank's monotonic clock minus rank 0's
    hosts: tuple[HostInfo, ...]  # per node, in node order

    @property
    def memory_bytes(self) -> int:
        """Memory of the distinct hosts together (emulated nodes share their host's)."""
        return sum({h.hostname: h.memory_bytes for h in self.hosts}.values())

    @property
    def node_budget(self) -> Budget:
        """The memory every node can still give the job: the least of the hosts' budgets,
        each shared by the emulated nodes of its host."""
        nodes_on = collections.Counter(h.hostname for h in self.hosts)
        return min((dataclasses.replace(h.budget, bytes=h.budget.bytes // nodes_on[h.hostname],
                                        shared_by=nodes_on[h.hostname])
                    for h in self.hosts if h.budget is not None), key=lambda b: b.bytes)


def emulated_ranks_per_node(environ=os.environ) -> int | None:
    """DLIO_MPI_RANKS_PER_NODE as a positive integer, None when unset; UserError otherwise."""
    text = environ.get(ENV_RANKS_PER_NODE, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"{ENV_RANKS_PER_NODE}={text!r}: expected a whole number >= 1 "
                        "(ranks per emulated node)")
    return int(text)


def host_info(budget: bool = False) -> HostInfo:
    """This host's description; with `budget`, what it can still give the job
    (plan.memory.node_budget)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    return HostInfo(socket.gethostname(), os.cpu_count() or 0, memory, platform.processor(),
                    node_budget() if budget else None)


def discover(comm, per_node: int | None) -> Topology:
    """Collectively: this rank's node (emulated nodes of `per_node` ranks when given)."""
    from mpi4py import MPI

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node = host
    if per_node is not None:
        node = host.Split(host.Get_rank() // per_node, host.Get_rank())
    local_rank, local_size = node.Get_rank(), node.Get_size()
    # Number the nodes by the world rank of their leader.
    leader = node.bcast(comm.Get_rank() if local_rank == 0 else None, root=0)
    leaders = sorted(r for r in comm.allgather(comm.Get_rank() if local_rank == 0 else None)
                     if r is not None)
    offset = _clock_offset(comm, host)
    infos = comm.allgather(host_info(budget=True) if local_rank == 0 else None)
    hosts = tuple(i for i in infos if i is not None)
    per_node0 = comm.bcast(local_size, root=0)
    host_ranks = host.Get_size()
    if node is not host:
        node.Free()
    host.Free()
    return Topology(node=leaders.index(leader), nodes=len(leaders), local_rank=local_rank,
                    local_size=local_size, host_ranks=host_ranks, ranks_per_node=per_node0,
                    emulated=per_node is not None, clock_offset_ns=offset, hosts=hosts)


def _clock_offset(comm, host) -> int:
    """This rank's CLOCK_MONOTONIC minus rank 0's, estimated by the host leaders (0 on the
    host of rank 0 and when all ranks share one host)."""
    from mpi4py import MPI

    is_leader = host.Get_rank() == 0
    leaders = comm.Split(0 if is_leader else MPI.UNDEFINED, comm.Get_rank())
    offset = 0
    if leaders != MPI.COMM_NULL:
        if leaders.Get_size() > 1:
            offset = _leader_offsets(leaders)
        leaders.Free()
    return host.bcast(offset, root=0)


def _leader_offsets(leaders) -> int:
    """Among host leaders (rank 0 of `leaders` holds world rank 0): each one's offset to rank
    0's clock, from the ping-pong with the shortest round trip (Cristian's method)."""
    rank = leaders.Get_rank()
    offset = 0
    for peer in range(1, leaders.Get_size()):
        if rank == 0:
            best = None
            for _ in range(PING_PONGS):
                t0 = _core.now_ns()
                leaders.send(t0, dest=peer, tag=7)
                remote = leaders.recv(source=peer, tag=8)
                t1 = _core.now_ns()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, remote - (t0 + t1) // 2)
            leaders.send(best[1], dest=peer, tag=9)
        elif rank == peer:
            for _ in range(PING_PONGS):
                leaders.recv(source=0, tag=7)
                leaders.send(_core.now_ns(), dest=0, tag=8)
            offset = leaders.recv(source=0, tag=9)
    return offset


def plan_topology(ranks: int, per_node: int | None) -> tuple[int, int]:
    """(ranks per node, nodes) for a plan made without running on the ranks (validate
    --ranks): emulated nodes when DLIO_MPI_RANKS_PER_NODE is set, else one node."""
    per = min(per_node or ranks, ranks)
    return per, -(-ranks // per)
