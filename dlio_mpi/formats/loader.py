"""The real loader's reads of whole files, for the planner: np.load's system calls (modelled in
npload.py) turned into flat request arrays for the files of an epoch.

Files alike in the facts the model depends on (size, header, payload) share one simulation,
cached, so an epoch of a dataset without size variation costs one simulation; each distinct
file costs one (a few tens of microseconds)."""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..storage import storage_for
from . import npload

_LOCAL = 30  # zip local file header


@dataclass(frozen=True)
class ZipFacts:
    """What np.load's walk through an npz depends on beyond sizes, read from one file: the
    length of x.npy's name and extra field in its local header, the central directory's
    length, whether zip64 end records precede the end record."""

    name_len: int
    extra_len: int
    cd_size: int
    zip64_end: bool


def open_zip(fp, path: str) -> zipfile.ZipFile:
    """The zip archive in the open file fp (of `path`); ValueError naming the path when fp
    holds none (a truncated or foreign file)."""
    try:
        return zipfile.ZipFile(fp)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path} is not a zip archive np.load can read ({exc})") from None


def zip_facts(path: str) -> ZipFacts:
    with storage_for(path).stream(path) as fp:
        with open_zip(fp, path) as archive:
            info = archive.getinfo("x.npy")
            cd_start = archive.start_dir
        fp.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", fp.read(_LOCAL)[26:30])
        fp.seek(0, 2)
        size = fp.tell()
        fp.seek(max(size - 42, 0))
        zip64_end = fp.read(4) == b"PK\x06\x07"  # the zip64 end locator's signature
    end_records = size - 22 - (76 if zip64_end else 0)
    return ZipFacts(name_len, extra_len, end_records - cd_start, zip64_end)


@dataclass(frozen=True)
class WholeFileReads:
    """The reads that load whole files, flattened: file k issues reads
    [start[k], start[k+1]) of (offset, length asked, expect: bytes that arrive, fewer where
    the read reaches the end of the file), and extra_fstats[k] fstat calls beyond the one at
    open. `flags`: the REQ_* flags of each read, when the model places the opens, closes and
    fstats itself (a loader opening the file more than once); None: one access per file."""

    start: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    expect: np.ndarray
    extra_fstats: np.ndarray
    flags: np.ndarray | None = None


def gather(keys: np.ndarray, simulate: Callable[[tuple], npload.LoaderReads],
           cache: dict) -> WholeFileReads:
    """The reads of files described by rows of `keys`, one simulation per distinct row."""
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    per = []
    for row in map(tuple, uniq.tolist()):
        if row not in cache:
            cache[row] = simulate(row)
        per.append(cache[row])
    counts = np.array([len(r.offset) for r in per], dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(counts)))
    flat = {name: np.concatenate([getattr(r, name) for r in per])
            for name in ("offset", "length", "asked")}
    n = counts[inverse]
    start = np.concatenate(([0], np.cumsum(n))).astype(np.int64)
    take = np.repeat(first[inverse] - start[:-1], n) + np.arange(start[-1])
    return WholeFileReads(start, flat["offset"][take], flat["asked"][take],
                          flat["length"][take],
                          np.array([r.fstats - 1 for r in per], dtype=np.int64)[inverse])


TF_BUFFER = 256 * 1024  # TFRecordDataset's buffer_size when none is given (TensorFlow's)


class TFRecordStreams:
    """tf.data.TFRecordDataset(path, buffer_size) streaming whole files, as strace shows it
    (TensorFlow 2.21): open, pread of buffer_size bytes at 0, buffer_size, ... until one comes
    back short, then a pread of the rest of the buffer at the end of the file (0 bytes; after
    a full last buffer, a whole buffer's pread there), close. TensorFlow makes no fstat; the
    engine's one at open (its check that the path is a regular file) stays."""

    def __init__(self, buffer_size: int | None) -> None:
        self.buffer = int(buffer_size or TF_BUFFER)

    def __call__(self, lay, blksize: int) -> WholeFileReads:
        size = np.asarray(lay.size, dtype=np.int64)
        b = self.buffer
        full, rest = size // b, size % b
        count = full + 1 + (rest > 0)
        start = np.concatenate(([0], np.cumsum(count))).astype(np.int64)
        owner = np.repeat(np.arange(len(size)), count)
        k = np.arange(start[-1], dtype=np.int64) - start[owner]
        tail = k == full[owner] + 1  # the read of the rest of the buffer at the end
        offset = np.where(tail, size[owner], k * b)
        length = np.where(tail, b - rest[owner], b)
        expect = np.where(tail, 0, np.clip(size[owner] - k * b, 0, b))
        return WholeFileReads(start, offset, length, expect,
                              np.zeros(len(size), dtype=np.int64))


class NpyLoads:
    """np.load(path) of npy files."""

    def __init__(self) -> None:
        self.cache: dict = {}

    def __call__(self, lay, blksize: int) -> WholeFileReads:
        keys = np.stack([lay.size, lay.data_offset], axis=1)
        return gather(keys, lambda k: npload.npy_reads(k[0], k[1], blksize),
                      self.cache.setdefault(blksize, {}))


class NpzLoads:
    """np.load(path)["x"] of npz files laid out as `facts` says."""

    def __init__(self, facts: ZipFacts, itemsize: int, samples: int) -> None:
        self.facts, self.itemsize, self.samples = facts, itemsize, samples
        self.cache: dict = {}

    def __call__(self, lay, blksize: int) -> WholeFileReads:
        f = self.facts
        member_data = _LOCAL + f.name_len + f.extra_len  # x.npy's first byte (member at 0)
        payload = lay.sample_bytes * self.samples
        cd_offset = lay.size - 22 - (76 if f.zip64_end else 0) - f.cd_size
        keys = np.stack([lay.size, lay.data_offset - member_data, payload, cd_offset], axis=1)

        def simulate(k: tuple) -> npload.LoaderReads:
            return npload.npz_reads(k[0], k[1], k[2], k[3], name_len=f.name_len,
                                    extra_len=f.extra_len, zip64_end=f.zip64_end,
                                    itemsize=self.itemsize, blksize=blksize)

        return gather(keys, simulate, self.cache.setdefault(blksize, {}))
