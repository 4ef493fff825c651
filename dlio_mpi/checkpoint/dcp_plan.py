"""The file layout of a torch Distributed Checkpoint (DCP) save, computed without torch: which
files every rank writes, which items each holds in write order (with every byte around each
tensor payload: dcp_archive.py) and which byte ranges every rank reads back at a restore at
any world size; the .metadata's bytes are dcp_metadata.py's.

The model is Llama-like, saved as FSDP2 (fully_shard) + AdamW's get_state_dict gives it: each
parameter and its exp_avg / exp_avg_sq a DTensor Shard(0) over all ranks, each "step" a
replicated 0-d fp32 tensor, AdamW's param group as plain Python values; FileSystemWriter with
single_file_per_rank and thread_count T, the torch_save serialization. docs/dcp_facts.md is
the spec (torch 2.13.0); references `file.py:N` are to torch/distributed/checkpoint/ unless
said otherwise (serialization.py is torch/serialization.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .dcp_archive import DTYPE_BYTES, TorchSaveArchive, object_archive, tensor_archive

# torch.optim.AdamW's default param group in torch 2.13 (without "params"), in its key order
ADAMW_PARAM_GROUP: tuple[tuple[str, object], ...] = (
    ("lr", 0.001), ("betas", (0.9, 0.999)), ("eps", 1e-08), ("weight_decay", 0.01),
    ("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
    ("differentiable", False), ("fused", None), ("decoupled_weight_decay", True))


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class LlamaModel:
    """A Llama-like decoder: untied embedding and lm_head, no biases: DLIO's parameter count
    (sizing.py, _Model.parameters) tensor for tensor. Dtypes are DTYPE_BYTES' keys."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    model_dtype: str = "bf16"
    optimizer_dtype: str = "fp32"

    def parameters(self) -> list[tuple[str, tuple[int, ...]]]:
        """(fqn, shape) of every parameter in HF LlamaForCausalLM's named_parameters order."""
        h, f = self.hidden_size, self.ffn_hidden_size
        kv = (h // self.num_attention_heads) * self.num_kv_heads
        out = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            out += [(p + "self_attn.q_proj.weight", (h, h)),
                    (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)),
                    (p + "self_attn.o_proj.weight", (h, h)),
                    (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                    (p + "mlp.down_proj.weight", (h, f)), (p + "input_layernorm.weight", (h,)),
                    (p + "post_attention_layernorm.weight", (h,))]
        return out + [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab_size, h))]


@dataclass(frozen=True)
class StateEntry:
    """One value of the flattened state dict (_nested_dict.py:27-59): a DTensor Shard(0)
    ("shard"), a plain tensor every rank holds ("tensor") or any other object ("bytes")."""

    fqn: str
    kind: str
    shape: tuple[int, ...] = ()
    dtype: str = "fp32"
    value: object = None
    path: tuple = ()  # the keys leading to it in the nested state dict (planner_data)


def state_entries(model: LlamaModel, param_group=ADAMW_PARAM_GROUP) -> list[StateEntry]:
    """The flattened state dict {"model": ..., "optim": {"state", "param_groups"}} in DCP's
    traversal order (_traverse.py:57-68: mappings in order, a param group's values leaves)."""
    params = model.parameters()
    out = [StateEntry("model." + fqn, "shard", shape, model.model_dtype, path=("model", fqn))
           for fqn, shape in params]
    for fqn, shape in params:
        base = ("optim", "state", fqn)
        out.append(StateEntry(f"optim.state.{fqn}.step", "tensor", (), "fp32",
                              path=base + ("step",)))
        out += [StateEntry(f"optim.state.{fqn}.{name}", "shard", shape, model.optimizer_dtype,
                           path=base + (name,)) for name in ("exp_avg", "exp_avg_sq")]
    group = list(param_group) + [("params", [fqn for fqn, _ in params])]
    out += [StateEntry(f"optim.param_groups.0.{key}", "bytes", value=value,
                       path=("optim", "param_groups", 0, key)) for key, value in group]
    return out


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(first row, rows) of `rank`'s Shard(0) chunk: torch.chunk's split (placement_types.py:
    358-375); an empty chunk starts at `rows` (tensor/_utils.py:174-175)."""
    if rows % world == 0:
        return rank * (rows // world), rows // world
    full = -(-rows // world)
    start = full * rank
    size = max(0, min(rows, start + full) - start)
    return (min(rows, start) if size else rows), size


# ---------------------------------------------------------------------------- the save plan
@dataclass(frozen=True)
class WriteItem:
    """One item of a rank's save plan: a value, or the rank's chunk of a DTensor
    (planner_helpers.py:177-225)."""

    entry: StateEntry
    chunk_offsets: tuple[int, ...] = ()
    chunk_sizes: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, tuple[int, ...] | None]:
        """What MetadataIndex compares (fqn, offset; not the index hint: metadata.py)."""
        return self.entry.fqn, (None if self.entry.kind == "bytes" else self.chunk_offsets)

    @property
    def planned_bytes(self) -> int | None:
        """WriteItem.tensor_storage_size (planner.py:70-82) and _item_size
        (filesystem.py:284-293): the GLOBAL tensor's bytes, even for a chunk; None: bytes."""
        if self.entry.kind == "bytes":
            return None
        return math.prod(self.entry.shape) * DTYPE_BYTES[self.entry.dtype]

    def archive(self) -> TorchSaveArchive:
        if self.entry.kind == "bytes":
            return object_archive(self.entry.value)
        return tensor_archive(self.chunk_sizes, self.entry.dtype)


def local_save_plan(entries: list[StateEntry], world: int, rank: int) -> list[WriteItem]:
    """A rank's items before deduplication, in state-dict order: every rank lists its chunk
    of each DTensor (an empty chunk too) and every other value (default_planner.py:531-555)."""
    out = []
    for entry in entries:
        if entry.kind == "shard":
            start, rows = shard_rows(entry.shape[0], world, rank)
            zeros = (0,) * (len(entry.shape) - 1)
            out.append(WriteItem(entry, (start, *zeros), (rows, *entry.shape[1:])))
        elif entry.kind == "tensor":
            out.append(WriteItem(entry, (0,) * len(entry.shape), entry.shape))
        else:
            out.append(WriteItem(entry))
    return out


def _int_set_order(values: list[int]) -> list[int]:
    """The iteration order of a CPython set of distinct consecutive non-negative ints added
    in ascending order: by value modulo its table size (setobject.c: 8 slots at first, resized
    to the power of 2 above 4 x used once fill x 5 >= mask x 3)."""
    size, used = 8, 0
    for _ in values:
        used += 1
        if used * 5 >= (size - 1) * 3:
            size = 8
            while size <= used * 4:
                size <<= 1
    return sorted(values, key=lambda v: v & (size - 1))


def _holders(item: WriteItem, world: int, rank: int) -> list[int]:
    """The ranks whose plans hold this item's key: all for a replicated value, the ranks with
    an empty chunk of the same DTensor (they share the offset), else `rank` alone."""
    if item.entry.kind != "shard":
        return list(range(world))
    if item.chunk_sizes[0] == 0:
        return [r for r in range(world) if shard_rows(item.entry.shape[0], world, r)[1] == 0]
    return [rank]


def dedup_owners(entries: list[StateEntry], world: int) -> dict[tuple, int]:
    """Which rank writes each key that several plans hold (_dedup_save_plans.py:15-65): keys
    in first-seen order over the plans of ranks 0, 1, ...; each goes to the holder with the
    fewest planned bytes so far (ties: the first in the set's iteration order), which then
    counts its planned bytes (1 for a non-tensor). Keys of one rank are counted the same."""
    planned = [0] * world
    owners: dict[tuple, int] = {}
    for rank in range(world):
        for item in local_save_plan(entries, world, rank):
            holders = _holders(item, world, rank)
            if len(holders) > 1 and item.key in owners:
                continue
            owner = min(_int_set_order(holders), key=planned.__getitem__)
            planned[owner] += item.planned_bytes or 1
            if len(holders) > 1:
                owners[item.key] = owner
    return owners


def split_into_files(items: list[WriteItem], thread_count: int) -> list[list[WriteItem]]:
    """A rank's items, one list per file (filesystem.py:296-317, 695-699): all in one with one
    thread; else non-tensors dealt round robin, then tensors by planned bytes, largest first
    (a stable sort), each to the file with the fewest planned bytes (the first such)."""
    if thread_count == 1:
        return [list(items)]
    files: list[list[WriteItem]] = [[] for _ in range(thread_count)]
    planned = [0] * thread_count
    values = [i for i in items if i.entry.kind == "bytes"]
    for n, item in enumerate(values):
        files[n % thread_count].append(item)
    for item in sorted((i for i in items if i.entry.kind != "bytes"),
                       key=lambda i: i.planned_bytes, reverse=True):
        least = min(range(thread_count), key=planned.__getitem__)
        files[least].append(item)
        planned[least] += item.planned_bytes
    return files


def write_order(items: list[WriteItem], overlapping_loader: bool) -> list[WriteItem]:
    """The order a file's items are written (filesystem.py:414-450): non-tensors first, then
    tensors in plan order; with _OverlappingCpuLoader (thread_count 1 on a node where
    torch.cuda.is_available(), per_thread_copy_ahead > 0: filesystem.py:397-408) the tensors
    by planned bytes, smallest first (a stable sort: filesystem.py:220)."""
    tensors = [i for i in items if i.entry.kind != "bytes"]
    if overlapping_loader:
        tensors.sort(key=lambda i: i.planned_bytes)
    return [i for i in items if i.entry.kind == "bytes"] + tensors


@dataclass(frozen=True)
class PlannedItem:
    """One item as written: where in which file, and its torch.save archive (every byte of it
    but the tensor payload: `archive.prefix()` before, `archive.suffix(crc32)` after)."""

    fqn: str
    kind: str  # "shard", "tensor" or "bytes"
    dtype: str
    global_shape: tuple[int, ...]
    chunk_offsets: tuple[int, ...]
    chunk_sizes: tuple[int, ...]
    file: str
    offset: int  # of the item in its file
    length: int
    payload_offset: int  # of the tensor's bytes in the file
    payload_length: int  # 0 for a non-tensor
    archive: TorchSaveArchive


@dataclass(frozen=True)
class PlannedFile:
    """One file a rank writes, `__{rank}_{i}.distcp` (filesystem.py:688-692)."""

    name: str
    items: tuple[PlannedItem, ...]

    @property
    def size(self) -> int:
        return sum(item.length for item in self.items)


def lay_out_file(name: str, items: list[WriteItem]) -> PlannedFile:
    """Items written back to back, each a torch.save archive (filesystem.py:320-372)."""
    out, cursor = [], 0
    for item in items:
        archive = item.archive()
        e = item.entry
        payload = 0 if archive.payload_length is None else archive.payload_length
        out.append(PlannedItem(e.fqn, e.kind, e.dtype, e.shape, item.chunk_offsets,
                               item.chunk_sizes, name, cursor, archive.length,
                               cursor + archive.payload_offset, payload, archive))
        cursor += archive.length
    return PlannedFile(name, tuple(out))


class DcpSavePlan:
    """Every rank's files of one DCP save of `model` at `world` ranks with FileSystemWriter's
    thread_count (single_file_per_rank, torch_save format). A rank's files are computed when
    first asked for; only the owners of shared keys are kept for all ranks."""

    RANKS_KEPT = 64

    def __init__(self, model: LlamaModel, world: int, thread_count: int = 1,
                 overlapping_loader: bool = False, param_group=ADAMW_PARAM_GROUP) -> None:
        if world < 1 or thread_count < 1:
            raise ValueError(f"expected world >= 1 and thread_count >= 1, got {world}, "
                             f"{thread_count}")
        self.model, self.world, self.thread_count = model, world, thread_count
        self.overlapping_loader = overlapping_loader and thread_count == 1
        self.entries = state_entries(model, param_group)
        self.owners = dedup_owners(self.entries, world)
        self._files: dict[int, tuple[PlannedFile, ...]] = {}
        self._index: dict[int, dict[tuple, PlannedItem]] = {}
        self._chunks: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], int]]] = {}

    def kept_items(self, rank: int) -> list[WriteItem]:
        """The rank's plan after deduplication, in plan order."""
        return [item for item in local_save_plan(self.entries, self.world, rank)
                if self.owners.get(item.key, rank) == rank]

    def rank_files(self, rank: int) -> tuple[PlannedFile, ...]:
        """The files `rank` writes, in file number order, each with its items in write order
        (the last RANKS_KEPT ranks asked for are kept)."""
        if rank not in self._files:
            buckets = split_into_files(self.kept_items(rank), self.thread_count)
            if len(self._files) >= self.RANKS_KEPT:
                evicted = next(iter(self._files))
                del self._files[evicted]
                self._index.pop(evicted, None)
            self._files[rank] = tuple(
                lay_out_file(f"__{rank}_{i}.distcp", write_order(b, self.overlapping_loader))
                for i, b in enumerate(buckets))
        return self._files[rank]

    def file_sizes(self) -> dict[str, int]:
        """{file name: bytes} of every .distcp file of the save (not .metadata)."""
        return {f.name: f.size for rank in range(self.world) for f in self.rank_files(rank)}

    def chunks(self, fqn: str) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
        """(offsets, sizes, writing rank) of a tensor's chunks in the metadata's order: plans
        in rank order after deduplication (default_planner.py:570-611)."""
        if fqn not in self._chunks:
            entry = next(e for e in self.entries if e.fqn == fqn)
            self._chunks[fqn] = []
            for rank in range(self.world):
                item = local_save_plan([entry], self.world, rank)[0]
                if self.owners.get(item.key, rank) == rank:
                    self._chunks[fqn].append((item.chunk_offsets, item.chunk_sizes, rank))
        return self._chunks[fqn]

    def locate(self, fqn: str, chunk_offsets: tuple[int, ...] | None, rank: int) -> PlannedItem:
        """The written item of this key (chunk_offsets None for a non-tensor), which `rank`
        wrote."""
        if rank not in self._index:
            self._index[rank] = {(i.fqn, None if i.kind == "bytes" else i.chunk_offsets): i
                                 for f in self.rank_files(rank) for i in f.items}
        return self._index[rank][(fqn, chunk_offsets)]

    def writer_of(self, item: WriteItem) -> int:
        """The rank that wrote this key (for a chunk: its own rank unless shared)."""
        if item.key in self.owners:
            return self.owners[item.key]
        if item.entry.kind != "shard":  # a value one rank holds: world 1
            return 0
        start = item.chunk_offsets[0]
        return next(r for r in range(self.world)
                    if shard_rows(item.entry.shape[0], self.world, r)[0] == start)


# ---------------------------------------------------------------------------- a restore
@dataclass(frozen=True)
class ReadRange:
    """One item a rank asks for at a restore: the whole written item is read (torch.load of
    its archive, then narrowed: filesystem.py:869-915)."""

    file: str
    offset: int
    length: int
    fqn: str
    payload_offset: int  # the tensor's bytes, within [offset, offset + length)
    payload_length: int


def _overlapping_chunks(local: tuple[tuple[int, ...], tuple[int, ...]],
                        saved: list[tuple[tuple[int, ...], tuple[int, ...], int]]) -> list[int]:
    """Indices of the saved chunks a local chunk reads, in the order create_read_items_for_
    chunk_list emits them (planner_helpers.py:254-374: a sweep over the dimension of largest
    extent, saved chunks ordered by (end, index), kept if they overlap in every dimension as
    resharding.py:7-22 says; a 0-d tensor's one chunk always)."""
    offsets, sizes = local
    dims = len(offsets)
    if dims == 0:
        return list(range(len(saved)))
    sweep, widest = 0, 0
    for d in range(dims if dims > 1 else 0):
        extent = max([offsets[d] + sizes[d]] + [o[d] + s[d] for o, s, _ in saved])
        if extent > widest:
            sweep, widest = d, extent
    start, end = offsets[sweep], offsets[sweep] + sizes[sweep]
    candidates = sorted((o[sweep] + s[sweep], i) for i, (o, s, _) in enumerate(saved)
                        if o[sweep] < end and o[sweep] + s[sweep] >= start)
    return [i for _, i in candidates if all(
        offsets[d] < saved[i][0][d] + saved[i][1][d] and saved[i][0][d] < offsets[d] + sizes[d]
        for d in range(dims))]


def restore_reads(save: DcpSavePlan, world: int, rank: int) -> list[ReadRange]:
    """The items `rank` of a job of `world` ranks reads to restore `save` (DefaultLoadPlanner,
    same model, FileSystemReader), in the order it reads them: grouped by file in the order
    the files are first needed, each file's items in state-dict order (filesystem.py:861-871).
    Before them every rank reads all of .metadata (state_dict_loader.py:234)."""
    reads: dict[str, list[ReadRange]] = {}
    for item in local_save_plan(save.entries, world, rank):
        if item.entry.kind == "shard":
            saved = save.chunks(item.entry.fqn)
            sources = [(saved[i][0], saved[i][2])
                       for i in _overlapping_chunks((item.chunk_offsets, item.chunk_sizes), saved)]
        else:
            sources = [(item.key[1], save.writer_of(item))]
        for offsets, writer in sources:
            found = save.locate(item.entry.fqn, offsets, writer)
            reads.setdefault(found.file, []).append(ReadRange(
                found.file, found.offset, found.length, found.fqn, found.payload_offset,
                found.payload_length))
    return [r for file_reads in reads.values() for r in file_reads]
