"""Checkpoint shards in the C core (dio_shard.c): a rank's bytes streamed from one reused
aligned buffer, with O_DIRECT and fsync when asked, read back and checked block by block.
Files live under the work tree (ext4: O_DIRECT works there)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi import _core

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1] / ".pytest_tmp"


@pytest.fixture
def folder():
    path = ROOT / f"shard-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def expected_shard(nbytes: int, seed: int, chunk: int) -> bytes:
    """What write_shard writes, built here from fill_random and the stamp format."""
    pattern = np.zeros(chunk, dtype=np.uint8)
    _core.fill_random(pattern, seed)
    out = bytearray()
    for k in range(-(-nbytes // chunk)):
        block = bytearray(pattern[:min(chunk, nbytes - k * chunk)].tobytes())
        stamp = struct.pack("<QQ", seed, k)[:len(block)]
        block[:len(stamp)] = stamp
        out += block
    return bytes(out)


def write(path: Path, nbytes: int, seed: int, **kw) -> dict:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        return _core.write_shard(fd, 0, nbytes, seed, path=str(path), **kw)
    finally:
        os.close(fd)


def read(path: Path, nbytes: int, seed: int, odirect: bool = False, **kw) -> dict:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if odirect else 0))
    try:
        return _core.read_shard(fd, 0, nbytes, seed, path=str(path), **kw)
    finally:
        os.close(fd)


@pytest.mark.parametrize("odirect", [False, True])
@pytest.mark.parametrize("nbytes", [4096, 3 * MiB + 123, 10])
def test_a_shard_holds_stamped_blocks_and_reads_back(folder, odirect, nbytes):
    path = folder / "shard.pt"
    chunk = MiB
    stats = write(path, nbytes, 77, chunk=chunk, odirect=odirect, fsync=True)
    assert stats["bytes"] == nbytes and stats["syncs"] == 1 and stats["sync_ns"] > 0
    assert stats["calls"] == -(-nbytes // chunk)  # one large write per block
    assert path.read_bytes() == expected_shard(nbytes, 77, min(chunk, -(-nbytes // 4096) * 4096))
    back = read(path, nbytes, 77, odirect=odirect, chunk=chunk, verify=2)
    assert back["bytes"] == nbytes and back["verified"] == nbytes


def test_without_fsync_none_is_made(folder):
    assert write(folder / "a.pt", MiB, 1)["syncs"] == 0


@pytest.mark.parametrize(("where", "verify"), [(16, 1), (MiB + 5000, 2), (64 * 4096 + 7, 1)])
def test_a_changed_byte_is_found_and_named(folder, where, verify):
    path = folder / "shard.pt"
    write(path, 2 * MiB, 5, chunk=4096 * 64)
    data = bytearray(path.read_bytes())
    data[where] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match=f"checkpoint {path}: block {where // (4096 * 64)} "):
        read(path, 2 * MiB, 5, chunk=4096 * 64, verify=verify)


def test_a_short_shard_is_an_error_naming_the_file(folder):
    path = folder / "shard.pt"
    write(path, MiB, 5)
    os.truncate(path, MiB - 100)
    with pytest.raises(OSError, match=f"checkpoint {path}: ends at offset"):
        read(path, MiB, 5)


def test_odirect_needs_an_aligned_offset(folder):
    fd = os.open(folder / "x.pt", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="4096-aligned offset"):
            _core.write_shard(fd, 100, MiB, 1, odirect=True, path="x.pt")
    finally:
        os.close(fd)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_fsync_reaches_the_kernel(folder):
    path = folder / "traced.pt"
    code = ("import os, sys; from dlio_mpi import _core; "
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644); "
            "_core.write_shard(fd, 0, 1 << 20, 3, odirect=True, fsync=True)")
    res = subprocess.run(["strace", "-f", "-e", "trace=fsync,pwrite64", sys.executable, "-P", "-c",
                          code, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = [line for line in res.stderr.splitlines() if "fsync(" in line or "pwrite64(" in line]
    assert any("pwrite64(" in line and "1048576" in line for line in calls), calls
    assert calls[-1].split("(")[0].split()[-1] == "fsync", calls  # the last call


def test_shard_block_is_what_write_shard_writes(folder):
    path = folder / "shard.pt"
    write(path, 3 * MiB + 5, 9, chunk=MiB)
    data = path.read_bytes()
    for k, n in [(0, MiB), (2, MiB), (3, 5)]:
        block = bytearray(n)
        _core.shard_block(block, 9, k)
        assert bytes(block) == data[k * MiB:k * MiB + n], k


@pytest.mark.parametrize("nbytes,chunk,offset", [
    (5 * MiB + 16 * 1024 + 77, 2 * MiB, 0),   # streamed blocks, lines after the 4-page runs, a tail
    (3 * MiB + 5, MiB, 5),                    # a destination off the 64-byte lines
    (MiB - 4096 + 13, 0, 64),                 # one block under 1 MiB: memcpy
])
def test_snapshot_is_what_write_shard_writes(folder, nbytes, chunk, offset):
    """dio_shard_snapshot (non-temporal stores for blocks of 1 MiB or more on x86-64) puts
    exactly write_shard's bytes into the buffer, and nothing around it."""
    path = folder / "shard.pt"
    write(path, nbytes, 11, chunk=chunk)
    pattern = np.empty(_core.shard_chunk(chunk, nbytes), dtype=np.uint8)
    _core.shard_block(pattern, 11, 0)
    whole = np.full(offset + nbytes + 64, 0xAB, dtype=np.uint8)
    _core.shard_snapshot(whole[offset:offset + nbytes], 11, pattern, chunk)
    assert whole[offset:offset + nbytes].tobytes() == path.read_bytes()
    assert (whole[:offset] == 0xAB).all() and (whole[offset + nbytes:] == 0xAB).all()
