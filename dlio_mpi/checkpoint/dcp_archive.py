"""torch.save's bytes of one DCP item without torch: the zip archive torch writes for a
tensor or a pickled value (its records, their 64-byte alignment, the pickle of a tensor, the
serialization id), as a `TorchSaveArchive` whose payload an emulator writes itself.
References `file.py:N` are to torch/serialization.py and miniz's writer (docs/dcp_facts.md)."""

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
ZIP_MAX32 = 0xFFFFFFFF  # a size or offset this large needs ZIP64 fields (miniz, PyTorch's writer)
STORAGE_ALIGNMENT = 64  # torch.utils.serialization.config.save.storage_alignment's default


def pickle_int(value: int) -> bytes:
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
    body = b"".join(pickle_int(v) for v in values)
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
           b"X\x03\x00\x00\x00cpuq\x04" + pickle_int(numel) + b"tq\x05QK\x00")
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
