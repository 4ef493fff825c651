"""NumPy .npz files: an uncompressed (stored) zip holding x.npy (the samples) and y.npy (one
label per sample), as np.savez writes them, so np.load reads our files and we read DLIO's.

The zip is written by hand because the payload is streamed by the C core: the local header is
written first with a zero CRC, the CRC is taken while the payload is written, then patched in.
ZIP64 records are used when a member or the archive passes 4 GiB."""

from __future__ import annotations

import os
import struct
import zipfile

import numpy as np

from .. import _core
from ..storage import Handle, storage_for
from .base import FileLayout, Format, SampleSpec, StagedWrites, StoredArray
from .loader import NpzLoads, ZipFacts, open_zip, zip_facts
from .npy import npy_header, stored_array

_LOCAL = struct.Struct("<IHHHHHIIIHH")          # local file header, 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header, 46 bytes
_EOCD = struct.Struct("<IHHHHIIH")              # end of central directory, 22 bytes
_EOCD64 = struct.Struct("<IQHHIIQQQQ")          # zip64 end of central directory, 56 bytes
_LOCATOR64 = struct.Struct("<IIQI")             # zip64 end of central directory locator
_DOS_DATE = (0 << 9) | (1 << 5) | 1             # 1980-01-01: fixed, so files are reproducible
_U32 = 0xFFFFFFFF


def _local_header(name: bytes, size: int, crc: int) -> bytes:
    if size >= _U32:
        extra = struct.pack("<HHQQ", 1, 16, size, size)
        return _LOCAL.pack(0x04034B50, 45, 0, 0, 0, _DOS_DATE, crc, _U32, _U32,
                           len(name), len(extra)) + name + extra
    return _LOCAL.pack(0x04034B50, 20, 0, 0, 0, _DOS_DATE, crc, size, size,
                       len(name), 0) + name


def _central_header(name: bytes, size: int, crc: int, offset: int) -> bytes:
    big = [v for v in (size, size, offset) if v >= _U32]
    extra = struct.pack("<HH" + "Q" * len(big), 1, 8 * len(big), *big) if big else b""
    version = 45 if big else 20
    return _CENTRAL.pack(0x02014B50, version, version, 0, 0, 0, _DOS_DATE, crc,
                         min(size, _U32), min(size, _U32), len(name), len(extra), 0, 0, 0,
                         0o644 << 16, min(offset, _U32)) + name + extra


def _end_records(count: int, cd_offset: int, cd_size: int) -> bytes:
    if cd_offset + cd_size < _U32:
        return _EOCD.pack(0x06054B50, 0, 0, count, count, cd_size, cd_offset, 0)
    eocd64_offset = cd_offset + cd_size
    return (_EOCD64.pack(0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_offset)
            + _LOCATOR64.pack(0x07064B50, 0, eocd64_offset, 1)
            + _EOCD.pack(0x06054B50, 0, 0, count, count, _U32, _U32, 0))


def _labels(spec: SampleSpec) -> bytes:
    labels = np.zeros(spec.samples, dtype=np.uint8)
    header = npy_header(SampleSpec((), "|u1", spec.samples))
    return header + labels.tobytes()


class NpzFormat(Format):
    """dataset.format: npz"""

    name = "npz"
    written_whole = "its zip headers hold a checksum of the payload"
    extension = "npz"
    loads_whole_array = True

    def layout(self, spec: SampleSpec) -> FileLayout:
        x_header = npy_header(spec)
        x_size = len(x_header) + spec.samples * spec.sample_bytes
        x_local = len(_local_header(b"x.npy", x_size, 0))
        y = _labels(spec)
        y_local = len(_local_header(b"y.npy", len(y), 0))
        y_offset = x_local + x_size
        cd_offset = y_offset + y_local + len(y)
        cd_size = (len(_central_header(b"x.npy", x_size, 0, 0))
                   + len(_central_header(b"y.npy", len(y), 0, y_offset)))
        size = cd_offset + cd_size + len(_end_records(2, cd_offset, cd_size))
        return FileLayout.for_array(spec, x_local + len(x_header), size)

    def write(self, path: str, spec: SampleSpec, seed: int, staged: StagedWrites) -> int:
        x_header = npy_header(spec)
        payload = spec.samples * spec.sample_bytes
        x_size = len(x_header) + payload
        y = _labels(spec)

        fs = staged.storage_of(path)

        def fill(handle: Handle) -> None:
            local = _local_header(b"x.npy", x_size, 0)
            fs.write_at(handle, local + x_header, 0)
            crc = fs.write_random(handle, len(local) + len(x_header), payload, seed, chunk=0,
                                  path=path, crc=_core.crc32(x_header))
            fs.write_at(handle, struct.pack("<I", crc), 14)  # CRC field of the local header
            y_offset = len(local) + x_size
            y_crc = _core.crc32(y)
            central = (_central_header(b"x.npy", x_size, crc, 0)
                       + _central_header(b"y.npy", len(y), y_crc, y_offset))
            y_local = _local_header(b"y.npy", len(y), y_crc)
            cd_offset = y_offset + len(y_local) + len(y)
            tail = y_local + y + central + _end_records(2, cd_offset, len(central))
            fs.write_at(handle, tail, y_offset)

        return staged.write(path, fill)

    def probe(self, path: str) -> StoredArray:
        with storage_for(path).stream(path) as fp:
            with open_zip(fp, path) as archive:
                info = archive.getinfo("x.npy")
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError("has a compressed x.npy, which cannot be read by sample extent "
                                 "(reader.read_mode: file reads whole files)")
            fp.seek(info.header_offset)
            local = fp.read(_LOCAL.size)
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            member = info.header_offset + _LOCAL.size + name_len + extra_len
            size = fp.seek(0, os.SEEK_END)
            fp.seek(member)
            return stored_array(fp, size, member)

    def loader_facts(self, path: str) -> ZipFacts:
        return zip_facts(path)

    def loader_model(self, facts: ZipFacts, itemsize: int, samples: int) -> NpzLoads:
        return NpzLoads(facts, itemsize, samples)

    def load_whole(self, path: str) -> np.ndarray:
        return np.load(path, allow_pickle=True)["x"]
