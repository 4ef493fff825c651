"""The file layout of a torch Distributed Checkpoint (DCP) save, computed without torch: which
files every rank writes, which items each holds in write order (with every byte around each
tensor payload) and which byte ranges every rank reads back at a restore at any world size.

The model is Llama-like, saved as FSDP2 (fully_shard) + AdamW's get_state_dict gives it: each
parameter and its exp_avg / exp_avg_sq a DTensor Shard(0) over all ranks, each "step" a
replicated 0-d fp32 tensor, AdamW's param group as plain Python values; FileSystemWriter with
single_file_per_rank and thread_count T, the torch_save serialization. docs/dcp_facts.md is
the spec (torch 2.13.0); references `file.py:N` are to torch/distributed/checkpoint/ unless
said otherwise (serialization.py is torch/serialization.py).
"""

from __future__ import annotations

import functools
import math
import pickle
import struct
import zlib
from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
# torch.save's pickle names a tensor's storage by its legacy class (serialization.py:1211)
STORAGE_CLASS = {"bf16": "BFloat16Storage", "fp16": "HalfStorage", "fp32": "FloatStorage",
                 "fp64": "DoubleStorage"}
# torch.optim.AdamW's default param group in torch 2.13 (without "params"), in its key order
ADAMW_PARAM_GROUP: tuple[tuple[str, object], ...] = (
    ("lr", 0.001), ("betas", (0.9, 0.999)), ("eps", 1e-08), ("weight_decay", 0.01),
    ("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
    ("differentiable", False), ("fused", None), ("decoupled_weight_decay", True))
ZIP_MAX32 = 0xFFFFFFFF  # a size or offset this large needs ZIP64 fields (miniz, PyTorch's writer)
STORAGE_ALIGNMENT = 64  # torch.utils.serialization.config.save.storage_alignment's default


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


# ---------------------------------------------------------------------------- torch.save's bytes
def _pickle_int(value: int) -> bytes:
    """An int as pickle protocol 2 writes it (BININT1, BININT2, BININT, LONG1)."""
    if 0 <= value <= 0xFF:
        return b"K" + bytes((value,))
    if 0 <= value <= 0xFFFF:
        return b"M" + struct.pack("<H", value)
    if -0x80000000 <= value <= 0x7FFFFFFF:
        return b"J" + struct.pack("<i", value)
    data = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    return b"\x8a" + bytes((len(data),)) + data


def _pickle_tuple(values: tuple[int, ...], memo: int) -> tuple[bytes, int]:
    """A tuple of ints and its memo put (none for the empty tuple); returns (bytes, next memo)."""
    if not values:
        return b")", memo
    body = b"".join(_pickle_int(v) for v in values)
    body = body + b"\x85\x86\x87"[len(values) - 1:len(values)] if len(values) <= 3 \
        else b"(" + body + b"t"
    return body + b"q" + bytes((memo,)), memo + 1


def tensor_pickle(shape: tuple[int, ...], dtype: str) -> bytes:
    """data.pkl of torch.save(tensor) for a contiguous CPU tensor that owns its storage:
    _rebuild_tensor_v2(persistent storage id, 0, shape, stride, False, OrderedDict()), protocol
    2 (serialization.py:1199-1257; the id's tuple: serialization.py:1241)."""
    numel = math.prod(shape)
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    out = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01"
           b"ctorch\n" + STORAGE_CLASS[dtype].encode() + b"\nq\x02X\x01\x00\x00\x000q\x03"
           b"X\x03\x00\x00\x00cpuq\x04" + _pickle_int(numel) + b"tq\x05QK\x00")
    shape_bytes, memo = _pickle_tuple(tuple(shape), 6)
    stride_bytes, memo = _pickle_tuple(stride, memo)
    return (out + shape_bytes + stride_bytes + b"\x89ccollections\nOrderedDict\nq"
            + bytes((memo,)) + b")Rq" + bytes((memo + 1,)) + b"tq" + bytes((memo + 2,))
            + b"Rq" + bytes((memo + 3,)) + b".")


def _std_hash(data: bytes) -> int:
    """libstdc++'s std::hash<std::string> (_Hash_bytes, 64-bit, seed 0xc70f6907)."""
    mask, mul = (1 << 64) - 1, (0xC6A4A793 << 32) + 0x5BD1E995
    length, aligned = len(data), len(data) & ~7
    value = (0xC70F6907 ^ (length * mul)) & mask
    for at in range(0, aligned, 8):
        word = (int.from_bytes(data[at:at + 8], "little") * mul) & mask
        value = ((value ^ ((word ^ (word >> 47)) * mul & mask)) * mul) & mask
    if length & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * mul) & mask
    value = ((value ^ (value >> 47)) * mul) & mask
    return value ^ (value >> 47)


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64-bit size_t."""
    mask = (1 << 64) - 1
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & mask) + (seed >> 2)) & mask)) & mask


def serialization_id(names: list[str], crcs: list[int]) -> bytes:
    """The .data/serialization_id record PyTorchStreamWriter writes last (inline_container.cc,
    writeSerializationId): 20 digits of the record names' combined std::hash (the written names
    in reverse order: observed) and 20 of the combined crc32s of the records that hold data,
    in write order (an empty record's is left out: observed)."""
    name_hash = 0
    for name in reversed(names):
        name_hash = _hash_combine(name_hash, _std_hash(name.encode()))
    crc_hash = 0
    for crc in crcs:
        crc_hash = _hash_combine(crc_hash, crc)
    return f"{name_hash:020d}{crc_hash:020d}".encode()


@dataclass(frozen=True)
class ZipRecord:
    """One record of a torch.save archive as PyTorchStreamWriter (miniz, ZIP64 mode) lays it
    out: local header, name "archive/<name>", a ZIP64 extra when the size or the header's
    offset reaches 2^32-1, an "FB" extra padding the data to STORAGE_ALIGNMENT, the data, a
    data descriptor (crc32 and sizes: 16 bytes, 24 with ZIP64; none for an empty record, whose
    flags then lack bit 3)."""

    name: str
    offset: int
    size: int

    @property
    def zip64(self) -> bool:
        return self.size >= ZIP_MAX32 or self.offset >= ZIP_MAX32

    def _zip64_extra(self, central: bool) -> int:
        """Bytes of the ZIP64 extra field: 4 + 8 per field too large (sizes, offset)."""
        fields = 2 * (self.size >= ZIP_MAX32) + (self.offset >= ZIP_MAX32)
        return 4 + 8 * fields if (fields and central) or (self.zip64 and not central) else 0

    @property
    def padding(self) -> int:
        """The FB extra's padding bytes (inline_container.cc, getPadding)."""
        start = self.offset + 30 + len(self.full_name) + 4 + self._zip64_extra(False)
        return -start % STORAGE_ALIGNMENT

    @property
    def full_name(self) -> str:
        return "archive/" + self.name

    @property
    def data_offset(self) -> int:
        return (self.offset + 30 + len(self.full_name) + self._zip64_extra(False) + 4
                + self.padding)

    @property
    def flags(self) -> int:
        """UTF-8 names (bit 11); sizes and crc32 in a data descriptor after the data (bit 3)."""
        return 0x0808 if self.size else 0x0800

    @property
    def end(self) -> int:
        return self.data_offset + self.size + len(self.descriptor(0))

    @property
    def central_size(self) -> int:
        return 46 + len(self.full_name) + self._zip64_extra(True)

    def local_header(self) -> bytes:
        """Everything before the data."""
        name = self.full_name.encode()
        extra = self._zip64_fields(central=False)
        pad = b"FB" + struct.pack("<H", self.padding) + b"Z" * self.padding
        return (struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, self.flags, 0, 0, 0, 0, 0, 0, len(name),
                            len(extra) + len(pad)) + name + extra + pad)

    def descriptor(self, crc: int) -> bytes:
        if not self.size:
            return b""
        sizes = struct.pack("<QQ" if self.zip64 else "<II", self.size, self.size)
        return b"PK\x07\x08" + struct.pack("<I", crc) + sizes

    def central_header(self, crc: int) -> bytes:
        name = self.full_name.encode()
        extra = self._zip64_fields(central=True)
        size32, offset32 = min(self.size, ZIP_MAX32), min(self.offset, ZIP_MAX32)
        return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, self.flags, 0, 0, 0, crc, size32,
                           size32, len(name), len(extra), 0, 0, 0, 0, offset32) + name + extra

    def _zip64_fields(self, central: bool) -> bytes:
        if not self._zip64_extra(central):
            return b""
        # the local header's compressed size is 0 there (a data descriptor follows): observed
        values = [self.size, self.size if central else 0] if self.size >= ZIP_MAX32 else []
        values += [self.offset] if self.offset >= ZIP_MAX32 else []
        return struct.pack("<HH", 1, 8 * len(values)) + struct.pack(f"<{len(values)}Q", *values)


def zip_records(sizes: list[tuple[str, int]]) -> list[ZipRecord]:
    """The records of an archive of (name, size) written in this order, back to back."""
    records, cursor = [], 0
    for name, size in sizes:
        records.append(ZipRecord(name, cursor, size))
        cursor = records[-1].end
    return records


def _end_records(cursor: int, count: int, central_size: int) -> bytes:
    """ZIP64 end of central directory record and locator, then the classic end record."""
    return (struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x002D, 0, 0, count, count,
                        central_size, cursor)
            + struct.pack("<IIQI", 0x07064B50, 0, cursor + central_size, 1)
            + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count,
                          min(central_size, ZIP_MAX32), min(cursor, ZIP_MAX32), 0))


END_RECORDS_BYTES = 56 + 20 + 22
VERSION_RECORD = b"3\n"  # archive/version: the file format version torch.save writes



@dataclass(frozen=True)
class TorchSaveArchive:
    """The bytes torch.save(obj, stream) writes for one DCP item (serialization.py:1183-1312;
    records data.pkl, .format_version "1", .storage_alignment "64", byteorder "little",
    data/0 (the tensor's storage, absent for a non-tensor), version, .data/serialization_id;
    then the central directory and end records). Every byte but the payload's is known here;
    those after the payload depend on its crc32 too (a data descriptor, the central directory
    and the serialization id)."""

    pickle_bytes: bytes
    payload_length: int | None  # None: not a tensor (a bytes item: no data/0)

    def _leading(self) -> list[tuple[str, bytes]]:
        return [("data.pkl", self.pickle_bytes), (".format_version", b"1"),
                (".storage_alignment", str(STORAGE_ALIGNMENT).encode()), ("byteorder", b"little")]

    @functools.cached_property
    def _records(self) -> list[ZipRecord]:
        sizes = [(name, len(data)) for name, data in self._leading()]
        if self.payload_length is not None:
            sizes.append(("data/0", self.payload_length))
        return zip_records(sizes + [("version", len(VERSION_RECORD)),
                                    (".data/serialization_id", 40)])

    def records(self) -> list[ZipRecord]:
        """The archive's records in write order."""
        return list(self._records)

    @functools.cached_property
    def length(self) -> int:
        """Bytes of the whole archive."""
        records = self._records
        return records[-1].end + sum(r.central_size for r in records) + END_RECORDS_BYTES

    @functools.cached_property
    def payload_offset(self) -> int:
        """Where the tensor's bytes start (a multiple of 64); for a bytes item, where the
        records after the leading ones start."""
        records = self._records
        return records[4].data_offset if self.payload_length is not None else records[3].end

    def prefix(self) -> bytes:
        """The bytes before the payload."""
        out = []
        for record, (_, data) in zip(self.records(), self._leading()):
            out += [record.local_header(), data, record.descriptor(zlib.crc32(data))]
        if self.payload_length is not None:
            out.append(self.records()[4].local_header())
        return b"".join(out)

    def suffix(self, payload_crc32: int = 0) -> bytes:
        """The bytes after the payload, given its crc32 (zlib.crc32); ignored for bytes items."""
        records = self.records()
        datas = [data for _, data in self._leading()]
        if self.payload_length is not None:
            datas.append(None)
        datas.append(VERSION_RECORD)
        crcs = [payload_crc32 if d is None else zlib.crc32(d) for d in datas]
        ident = serialization_id([r.name for r in records[:-1]],
                                 [c for r, c in zip(records, crcs) if r.size])
        datas.append(ident)
        crcs.append(zlib.crc32(ident))
        out = [records[4].descriptor(payload_crc32)] if self.payload_length is not None else []
        for record, data, crc in zip(records[len(records) - 2:], datas[-2:], crcs[-2:]):
            out += [record.local_header(), data, record.descriptor(crc)]
        central = b"".join(r.central_header(c) for r, c in zip(records, crcs))
        out += [central, _end_records(records[-1].end, len(records), len(central))]
        return b"".join(out)


@functools.lru_cache(maxsize=4096)
def tensor_archive(shape: tuple[int, ...], dtype: str) -> TorchSaveArchive:
    """The archive of one tensor item of this local shape (one object per shape: cached)."""
    return TorchSaveArchive(tensor_pickle(shape, dtype), math.prod(shape) * DTYPE_BYTES[dtype])


def object_archive(value: object) -> TorchSaveArchive:
    """The archive of a non-tensor value (DefaultSavePlanner.transform_object,
    default_planner.py:282-288): torch's pickler writes plain values as pickle protocol 2."""
    return _pickled_object_archive(pickle.dumps(value, protocol=2))


@functools.lru_cache(maxsize=256)
def _pickled_object_archive(data: bytes) -> TorchSaveArchive:
    return TorchSaveArchive(data, None)


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


# ---------------------------------------------------------------------------- .metadata
class _Global:
    """A class, function or dtype that pickle writes by reference (module, name)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _NewObj:
    """An instance pickled as copyreg.__newobj__(cls) then BUILD(state); state None: no BUILD."""

    __slots__ = ("cls", "state")

    def __init__(self, cls: _Global, state: object) -> None:
        self.cls, self.state = cls, state


class _Reduce:
    """An object pickled as func(*args) (REDUCE)."""

    __slots__ = ("func", "args")

    def __init__(self, func: _Global, args: tuple) -> None:
        self.func, self.args = func, args


def _fresh(text: str) -> str:
    """An equal str that is another object, as an unpickled one is (but one character: CPython
    caches those, so they stay one object)."""
    return text[:1] + text[1:]


class _Pickler4:
    """CPython's C pickler (Modules/_pickle.c), protocol 4, for the objects of a DCP Metadata:
    memo by identity (MEMOIZE; BINGET, LONG_BINGET from 256), SHORT_BINUNICODE, batches of
    1000 (a dict's last batch of MARK..SETITEMS even if empty, unless it has one item), and
    frames of at least 64 KiB committed where a save() begins."""

    FRAME_TARGET, BATCH = 64 * 1024, 1000

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04")
        self.memo: dict[int, tuple[int, object]] = {}
        self.frame_start = len(self.out)
        self.out += bytes(9)

    def dumps(self, obj: object) -> bytes:
        self.save(obj)
        self.out += b"."
        self._commit_frame()
        return bytes(self.out)

    def _commit_frame(self) -> None:
        length = len(self.out) - self.frame_start - 9
        if length >= 4:
            self.out[self.frame_start:self.frame_start + 9] = b"\x95" + struct.pack("<Q", length)
        else:
            del self.out[self.frame_start:self.frame_start + 9]

    def _boundary(self) -> None:
        if len(self.out) - self.frame_start - 9 >= self.FRAME_TARGET:
            self._commit_frame()
            self.frame_start = len(self.out)
            self.out += bytes(9)

    def _memoize(self, obj: object) -> None:
        self.memo[id(obj)] = (len(self.memo), obj)
        self.out += b"\x94"

    def save(self, obj: object) -> None:
        self._boundary()
        if obj is None or obj is True or obj is False:
            self.out += {None: b"N", True: b"\x88", False: b"\x89"}[obj]
        elif type(obj) is int:
            self.out += _pickle_int(obj)
        elif id(obj) in self.memo:
            index = self.memo[id(obj)][0]
            self.out += b"h" + bytes((index,)) if index < 256 else b"j" + struct.pack("<I", index)
        elif type(obj) is str:
            data = obj.encode()
            self.out += (b"\x8c" + bytes((len(data),)) if len(data) < 256
                         else b"X" + struct.pack("<I", len(data))) + data
            self._memoize(obj)
        else:
            self._save_container(obj)

    def _save_container(self, obj: object) -> None:
        if type(obj) is tuple:
            self._save_tuple(obj)
        elif type(obj) is list:
            self._save_list(obj)
        elif type(obj) is dict:
            self._save_dict(obj)
        elif type(obj) is _Global:
            self.save(obj.module)
            self.save(obj.name)
            self.out += b"\x93"
            self._memoize(obj)
        elif type(obj) is _Reduce:
            self.save(obj.func)
            self.save(obj.args)
            self.out += b"R"
            self._memoize(obj)
        else:
            self.save(obj.cls)
            self.save(())
            self.out += b"\x81"
            self._memoize(obj)
            if obj.state is not None:
                self.save(obj.state)
                self.out += b"b"

    def _save_tuple(self, obj: tuple) -> None:
        if not obj:
            self.out += b")"
            return
        if len(obj) > 3:
            self.out += b"("
        for value in obj:
            self.save(value)
        self.out += b"\x85\x86\x87"[len(obj) - 1:len(obj)] if len(obj) <= 3 else b"t"
        self._memoize(obj)

    def _save_list(self, obj: list) -> None:
        self.out += b"]"
        self._memoize(obj)
        if len(obj) == 1:
            self.save(obj[0])
            self.out += b"a"
            return
        for start in range(0, len(obj), self.BATCH):
            self.out += b"("
            for value in obj[start:start + self.BATCH]:
                self.save(value)
            self.out += b"e"

    def _save_dict(self, obj: dict) -> None:
        self.out += b"}"
        self._memoize(obj)
        items = list(obj.items())
        if len(items) == 1:
            self.save(items[0][0])
            self.save(items[0][1])
            self.out += b"s"
            return
        for start in range(0, len(items) + 1 if items else 0, self.BATCH):
            self.out += b"("
            for key, value in items[start:start + self.BATCH]:
                self.save(key)
                self.save(value)
            self.out += b"u"


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_TORCH_MODULE = "torch"  # whichmodule's answer for a dtype: one str, its sys.modules key
_DTYPE_NAME = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
DCP_VERSION = "1.0.0"  # filesystem.py:71


class _MetadataClasses:
    """The globals a Metadata pickle refers to, each one object (memoized once)."""

    def __init__(self) -> None:
        meta = {name: _Global(_METADATA_MODULE, name) for name in (
            "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
            "BytesStorageMetadata", "MetadataIndex", "StorageMeta")}
        self.__dict__.update(meta)
        self.storage_info = _Global("torch.distributed.checkpoint.filesystem", "_StorageInfo")
        self.size = _Global(_fresh(_TORCH_MODULE), "Size")
        self.dtypes = {k: _Global(_TORCH_MODULE, v) for k, v in _DTYPE_NAME.items()}
        self.strided = _Reduce(_Global("torch.serialization", "_get_layout"), ("torch.strided",))
        self.contiguous = _Reduce(_Global(_METADATA_MODULE, "_MEM_FORMAT_ENCODING"), (0,))
        self.posix_path = _Global("pathlib", "PosixPath")

    def torch_size(self, values: tuple[int, ...]) -> _Reduce:
        return _Reduce(self.size, (tuple([*values]),))  # a new tuple: torch.Size pickles one

    def properties(self, dtype: str) -> _NewObj:
        """TensorProperties: its __getstate__'s tuple (metadata.py:57-75)."""
        return _NewObj(self.TensorProperties,
                       (self.dtypes[dtype], self.strided, False, self.contiguous, False))


def _state_dict_metadata(plan: DcpSavePlan, g: _MetadataClasses, fqn_of) -> dict:
    """fqn -> TensorStorageMetadata or BytesStorageMetadata, built from the deduplicated plans
    in rank order (default_planner.py:570-611); keys are the first plan's fqn objects."""
    md: dict = {}
    for rank in range(plan.world):
        for item in plan.kept_items(rank):
            e = item.entry
            if e.kind == "bytes":
                md[fqn_of(rank, e.fqn)] = _NewObj(g.BytesStorageMetadata, None)
                continue
            if e.fqn not in md:
                md[fqn_of(rank, e.fqn)] = _NewObj(g.TensorStorageMetadata, {
                    "properties": g.properties(e.dtype), "size": g.torch_size(e.shape),
                    "chunks": []})
            md[e.fqn].state["chunks"].append(_NewObj(g.ChunkStorageMetadata, {
                "offsets": g.torch_size(item.chunk_offsets),
                "sizes": g.torch_size(item.chunk_sizes)}))
    return md


def _planner_data(plan: DcpSavePlan, fqn_of) -> dict:
    """fqn -> path in the nested state dict: dict(ChainMap(*plans' mappings)), so the last
    rank's keys, in its order, and rank 0's paths (default_planner.py:150-152). A path holds
    its state dict's key objects: the optimizer's fqns are not the model's (get_state_dict)."""
    shared: dict[str, str] = {}
    optim_fqns: dict[str, str] = {}

    def one(key: object) -> object:
        return key if type(key) is int else shared.setdefault(key, _fresh(key))

    paths = {}
    for e in plan.entries:
        path = [one(key) for key in e.path]
        if e.path[:2] == ("optim", "state"):
            path[2] = optim_fqns.setdefault(e.path[2], _fresh(e.path[2]))
        paths[fqn_of(plan.world - 1, e.fqn)] = tuple(path)
    return paths


def _storage_data(plan: DcpSavePlan, g: _MetadataClasses, chunk_index) -> dict:
    """MetadataIndex -> _StorageInfo of every item, rank by rank, each rank's files in order
    and their items in write order (filesystem.py:758-764): fresh objects (gathered), but
    one file name per file of a rank."""
    data = {}
    for rank in range(plan.world):
        for planned_file in plan.rank_files(rank):
            name = _fresh(planned_file.name)
            for item in planned_file.items:
                index = {"fqn": _fresh(item.fqn), "index": None}
                if item.kind != "bytes":
                    index["index"] = chunk_index[(item.fqn, item.chunk_offsets)]
                    index["offset"] = g.torch_size(item.chunk_offsets)
                data[_NewObj(g.MetadataIndex, index)] = _NewObj(g.storage_info, {
                    "relative_path": name, "offset": item.offset, "length": item.length})
    return data


def metadata_fields(plan: DcpSavePlan) -> tuple[_MetadataClasses, dict]:
    """The globals and the Metadata's fields but storage_meta (which holds the checkpoint's
    path and save id): state_dict_metadata, planner_data, storage_data."""
    g = _MetadataClasses()
    objects: dict[tuple[int, str], str] = {}

    def fqn_of(rank: int, fqn: str) -> str:
        return objects.setdefault((rank, fqn), _fresh(fqn))

    state = _state_dict_metadata(plan, g, fqn_of)
    chunk_index = {(fqn, tuple(c.state["offsets"].args[0])): i
                   for fqn, md in state.items() if md.state
                   for i, c in enumerate(md.state["chunks"])}
    return g, {"state_dict_metadata": state, "planner_data": _planner_data(plan, fqn_of),
               "storage_data": _storage_data(plan, g, chunk_index)}


def storage_meta(g: _MetadataClasses, checkpoint_path: str, save_id: str) -> _NewObj:
    """StorageMeta(checkpoint_id=Path(checkpoint_path), save_id): PurePosixPath's parts."""
    import pathlib

    parts = tuple(_fresh(p) for p in pathlib.PurePosixPath(checkpoint_path).parts)
    return _NewObj(g.StorageMeta, {
        "checkpoint_id": _Reduce(g.posix_path, parts), "save_id": _fresh(save_id),
        "load_id": None, "modules": []})


def metadata_object(g: _MetadataClasses, fields: dict, meta: object) -> _NewObj:
    """The Metadata of `fields` (metadata_fields) and `meta` (storage_meta)."""
    return _NewObj(g.Metadata, {**fields, "storage_meta": meta, "version": _fresh(DCP_VERSION)})


def metadata_bytes(plan: DcpSavePlan, checkpoint_path: str, save_id: str = "0" * 36) -> bytes:
    """The .metadata the coordinator writes (pickle.dump of Metadata, filesystem.py:758-790)
    for this save into `checkpoint_path` (as given to FileSystemWriter: PurePosixPath's parts
    are pickled) with this uuid4 save_id (36 characters). Exact but for thread_count > 1,
    where the order threads finish files in can move a 64 KiB frame's end (9 bytes)."""
    g, fields = metadata_fields(plan)
    return _Pickler4().dumps(metadata_object(g, fields, storage_meta(g, checkpoint_path,
                                                                     save_id)))
