"""Checkpoint shards in the C core (dio_shard.c, dio_ckpt_stream.c): a rank's bytes, the
checkpoint stream of its seed (checked against tests/helpers.ckpt_stream, built apart in
numpy), made a block ahead by a second thread and written in large calls, with O_DIRECT and
fsync when asked, read back and checked granule by granule. Files live under the work tree
(ext4: O_DIRECT works there)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi import _core
from helpers import ckpt_stream

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1] / ".pytest_tmp"


@pytest.fixture
def folder():
    path = ROOT / f"shard-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
def test_a_shard_holds_the_checkpoint_stream_and_reads_back(folder, odirect, nbytes):
    path = folder / "shard.pt"
    chunk = MiB
    stats = write(path, nbytes, 77, chunk=chunk, odirect=odirect, fsync=True)
    assert stats["bytes"] == nbytes and stats["syncs"] == 1 and stats["sync_ns"] > 0
    assert stats["calls"] == -(-nbytes // chunk)  # one large write per block
    assert 0 < stats["io_ns"] and 0 < stats["emulator_ns"]  # block 0 is made before any write
    assert path.read_bytes() == ckpt_stream(77, 0, nbytes)
    back = read(path, nbytes, 77, odirect=odirect, chunk=chunk, verify=2)
    assert back["bytes"] == nbytes and back["verified"] == nbytes


def test_no_two_granules_of_a_shard_are_equal_and_nothing_compresses(folder):
    """Block after block (the writer's thread making each), the bytes stay fresh: a shard of
    many blocks has no 4 KiB granule twice (the stamped single block of before had 4x)."""
    import zlib

    path = folder / "shard.pt"
    write(path, 24 * MiB + 4096, 3, chunk=MiB)
    data = path.read_bytes()
    granules = {hashlib.blake2b(data[at:at + 4096], digest_size=16).digest()
                for at in range(0, len(data), 4096)}
    assert len(granules) == len(data) // 4096
    assert len(data) / len(zlib.compress(data, 6)) <= 1.01


def test_a_restore_checks_the_head_of_every_granule(folder):
    """verify=1 compares the first 64 bytes of every 4 KiB and every 64th 4 KiB whole: a change
    in a head is found, past it in a granule checked whole too; past the head of another
    granule it is not (the documented sampling), and verify=2 finds it."""
    path = folder / "shard.pt"
    write(path, 3 * MiB, 8, chunk=MiB)
    clean = path.read_bytes()
    granules = 3 * MiB // 4096
    for where, found in [(MiB + 7 * 4096 + 63, True), (MiB + 7 * 4096 + 64, False),
                         (64 * 4096 + 100, True)]:
        data = bytearray(clean)
        data[where] ^= 1
        path.write_bytes(bytes(data))
        at = f"the 4 KiB at offset {where // 4096 * 4096} "
        if found:
            with pytest.raises(OSError, match=at):
                read(path, 3 * MiB, 8, chunk=MiB)
        else:
            whole = granules // 64
            assert read(path, 3 * MiB, 8, chunk=MiB)["verified"] == \
                (granules - whole) * 64 + whole * 4096
        with pytest.raises(OSError, match=at):
            read(path, 3 * MiB, 8, chunk=MiB, verify=2)


def test_without_fsync_none_is_made(folder):
    assert write(folder / "a.pt", MiB, 1)["syncs"] == 0


@pytest.mark.parametrize(("where", "verify"), [(16, 1), (MiB + 5000, 2), (64 * 4096 + 7, 1)])
def test_a_changed_byte_is_found_and_named(folder, where, verify):
    path = folder / "shard.pt"
    write(path, 2 * MiB, 5, chunk=4096 * 64)
    data = bytearray(path.read_bytes())
    data[where] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(OSError, match=f"checkpoint {path}: the 4 KiB at offset "
                                      f"{where // 4096 * 4096} "):
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


@pytest.mark.parametrize("start,n", [(0, MiB), (2 * MiB - 100, MiB + 5), (3 * MiB, 5)])
def test_ckpt_fill_is_what_write_shard_writes_at_any_offset(folder, start, n):
    path = folder / "shard.pt"
    write(path, 3 * MiB + 5, 9, chunk=MiB)
    block = bytearray(n)
    _core.ckpt_fill(block, 9, start)
    assert bytes(block) == path.read_bytes()[start:start + n]
    assert _core.ckpt_check(block, 9, start, whole_every=1) == (-1, n)
    assert _core.ckpt_check(block, 10, start)[0] == 0  # another seed's bytes differ at once


@pytest.mark.parametrize("nbytes,chunk,offset", [
    (5 * MiB + 16 * 1024 + 77, 2 * MiB, 0),   # several blocks and a tail
    (3 * MiB + 5, MiB, 5),                    # a destination off the 64-byte lines
    (MiB - 4096 + 13, 0, 64),                 # one block, a partial granule
])
def test_snapshot_is_what_write_shard_writes(folder, nbytes, chunk, offset):
    """dio_shard_snapshot puts exactly write_shard's bytes into the buffer, and nothing
    around it."""
    path = folder / "shard.pt"
    write(path, nbytes, 11, chunk=chunk)
    whole = np.full(offset + nbytes + 64, 0xAB, dtype=np.uint8)
    _core.shard_snapshot(whole[offset:offset + nbytes], 11, chunk)
    assert whole[offset:offset + nbytes].tobytes() == path.read_bytes()
    assert (whole[:offset] == 0xAB).all() and (whole[offset + nbytes:] == 0xAB).all()
