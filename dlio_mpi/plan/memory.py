"""One memory budget: what the job's buffers hold on a node, counted once, against what the
node can still give the job (mpi/host_memory.py).

What the job holds is a list of `Held` items (the reader's batch buffers, reader.staging's
copies, an asynchronous save's snapshot, the checkpoint and copy engines' buffers, the
drawn sample shapes, rank 0's per-epoch records, ...), each per rank or per node; one check
refuses, before any I/O, a plan whose items together take more than MEMORY_SHARE of the
budget, naming the largest item's key. validate and run call the same check."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..mpi.host_memory import Budget
from ..units import size_text

MEMORY_SHARE = 0.8  # of the budget: the rest for what is not counted (tables, MPI, cache)


@dataclass(frozen=True)
class Held:
    """Memory the plan holds: `per_rank` bytes on every rank (the largest rank's) and
    `per_node` bytes on a node besides. `key`: the configuration key that asks for it;
    `what`: what it is; `lower`: what would hold less."""

    key: str
    what: str
    per_rank: int = 0
    per_node: int = 0
    lower: str = ""

    def on_node(self, ranks_per_node: int) -> int:
        return self.per_rank * ranks_per_node + self.per_node


def check_memory(held: list[Held], ranks_per_node: int, budget: Budget) -> None:
    """Refuse, naming the largest item's key, a plan whose items take more than
    MEMORY_SHARE of a node's budget; one message with every item."""
    items = [h for h in held if h.on_node(ranks_per_node) > 0]
    need = sum(h.on_node(ranks_per_node) for h in items)
    if need <= MEMORY_SHARE * budget.bytes:
        return
    largest = max(items, key=lambda h: h.on_node(ranks_per_node))
    parts = "; ".join(_item_text(h, ranks_per_node) for h in
                      sorted(items, key=lambda h: -h.on_node(ranks_per_node)))
    raise UserError(
        f"{largest.key}: a node's {ranks_per_node} rank(s) would hold {size_text(need)} of "
        f"memory: {parts}; more than {MEMORY_SHARE * 100:.0f} % of the "
        f"{size_text(budget.bytes)} the node can give this job ({budget_text(budget)}); "
        f"expected {largest.lower or 'less'}")


def budget_text(budget: Budget) -> str:
    """Where a budget comes from, as the messages say it."""
    if budget.kind.startswith("cgroup"):
        text = (f"the job's memory {budget.kind.replace(' ', ' (')}) {budget.folder}: limit "
                f"{size_text(budget.limit)}, {size_text(budget.in_use)} in use")
    elif budget.kind == "MemAvailable":
        text = "the kernel's MemAvailable"
    else:
        text = budget.kind
    if budget.shared_by > 1:
        text += f", shared by the {budget.shared_by} emulated nodes of its host"
    return text


def _item_text(h: Held, ranks_per_node: int) -> str:
    text = f"{h.what} {size_text(h.on_node(ranks_per_node))}"
    if h.per_rank and ranks_per_node > 1:
        text += f" ({size_text(h.per_rank)} per rank)"
    return text
