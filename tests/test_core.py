"""The C I/O core (csrc/, dlio_mpi._core) through its Python API: checksums, payloads, O_DIRECT
probing and the read engine, checked against Python's own reads of real files."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import threading
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.sampling.requests import EpochRequests
from helpers import resident_pages

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- helpers


def crc32c_reference(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def make_files(folder: Path, sizes: list[int], seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    paths = []
    for i, size in enumerate(sizes):
        path = folder / f"f{i}.bin"
        path.write_bytes(rng.randbytes(size))
        paths.append(str(path))
    return paths


def arrays(batches: list[list[tuple[int, int, int]]]):
    """[(file, offset, length), ...] per batch -> batch_start, file_idx, offset, length."""
    flat = [r for batch in batches for r in batch]
    start = np.cumsum([0] + [len(b) for b in batches]).astype(np.int64)
    col = [np.array([r[k] for r in flat], dtype=np.int64).reshape(-1) for k in range(3)]
    return start, col[0], col[1], col[2]


def expected_bytes(paths: list[str], file: int, offset: int, length: int) -> bytes:
    with open(paths[file], "rb") as f:
        f.seek(offset)
        return f.read(length)


def run_epoch(engine, paths, batches):
    """Start an epoch, consume it and check every request's bytes; returns the outputs."""
    start, files, offset, length = arrays(batches)
    n = len(files)
    buf_off, lat, nread = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    engine.start_epoch(EpochRequests(start, files, offset, length), req_buf_off=buf_off,
                       lat_ns=lat, nread=nread)
    got = []
    for b, batch in enumerate(batches):
        out = engine.next()
        assert out is not None, f"batch {b} missing"
        assert out.index == b and out.nreq == len(batch)
        assert out.bytes_requested == sum(r[2] for r in batch)
        data = out.data
        assert data.readonly and len(data) == out.data_len
        for k, (f, off, ln) in enumerate(batch):
            i = int(start[b]) + k
            want = expected_bytes(paths, f, off, ln)
            assert bytes(data[buf_off[i]: buf_off[i] + ln]) == want, f"batch {b} request {k}"
        got.append(out)
    assert engine.next() is None
    assert engine.next() is None
    return got, buf_off, lat, nread


def is_odirect_dir(folder: Path) -> bool:
    probe = folder / f"probe-{uuid.uuid4().hex}"
    probe.write_bytes(b"\0" * 8192)
    try:
        _core.probe_odirect(str(probe))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture
def disk_tmp(tmp_path) -> Path:
    """A folder on a file system with real direct I/O (tmp_path unless that is a tmpfs)."""
    if is_odirect_dir(tmp_path):
        yield tmp_path
        return
    alt = REPO / ".pytest_tmp" / uuid.uuid4().hex
    alt.mkdir(parents=True)
    try:
        if not is_odirect_dir(alt):
            pytest.skip("no file system with O_DIRECT support available")
        yield alt
    finally:
        shutil.rmtree(alt, ignore_errors=True)


@pytest.fixture
def shm_dir():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs a tmpfs at /dev/shm")
    folder = Path(f"/dev/shm/dlio-core-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------- time


def test_now_ns_is_monotonic():
    a = _core.now_ns()
    b = _core.now_ns()
    assert 0 < a <= b


def test_sleep_until_wakes_at_or_after_the_deadline():
    for delay in (0, 1_000, 2_000_000, 10_000_000):
        deadline = _core.now_ns() + delay
        woke = _core.sleep_until_ns(deadline)
        assert woke >= deadline
        assert _core.now_ns() >= woke
        assert woke - deadline < 50_000_000  # no runaway oversleep
    past = _core.now_ns() - 1_000_000
    assert _core.sleep_until_ns(past) >= past


def test_sleep_releases_the_gil():
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    _core.sleep_until_ns(_core.now_ns() + 50_000_000)
    stop.set()
    t.join()
    assert len(ticks) >= 5


# ------------------------------------------------------------------------------- checksums


@pytest.mark.parametrize("size", [0, 1, 3, 7, 8, 9, 15, 17, 63, 255, 1001, 4097, 65537, 1_000_003])
def test_crc32_matches_zlib(size):
    data = random.Random(size).randbytes(size)
    assert _core.crc32(data) == zlib.crc32(data)
    for skew in (1, 3, 7):  # unaligned starts
        view = memoryview(data)[skew:]
        assert _core.crc32(view) == zlib.crc32(view)
    # chaining, as zlib does it
    cut = size // 3
    assert _core.crc32(data[cut:], _core.crc32(data[:cut])) == zlib.crc32(data)
    assert _core.crc32(data, 12345) == zlib.crc32(data, 12345)


def test_crc32_accepts_buffers():
    arr = np.arange(1000, dtype=np.float64)
    assert _core.crc32(arr) == zlib.crc32(arr.tobytes())
    assert _core.crc32(bytearray(b"abc")) == zlib.crc32(b"abc")
    with pytest.raises(TypeError):
        _core.crc32("text")


def test_crc32c_check_value_and_reference():
    assert _core.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c(b"") == 0
    for size in (1, 5, 8, 13, 64, 1000, 4099):
        data = random.Random(size).randbytes(size)
        assert _core.crc32c(data) == crc32c_reference(data)
        assert _core.crc32c(memoryview(data)[1:]) == crc32c_reference(data[1:])
        cut = size // 2
        assert _core.crc32c(data[cut:], _core.crc32c(data[:cut])) == _core.crc32c(data)
    big = random.Random(7).randbytes(200_001)  # the GIL-free path
    assert _core.crc32c(big) == _core.crc32c(big[100:], _core.crc32c(big[:100]))


# ------------------------------------------------------------------------------- payloads


def test_fill_random_is_deterministic_per_seed():
    a, b, c = bytearray(10_007), bytearray(10_007), bytearray(10_007)
    _core.fill_random(a, 42)
    _core.fill_random(b, 42)
    _core.fill_random(c, 43)
    assert a == b
    assert a != c
    assert len(set(a)) > 200  # looks random
    shorter = bytearray(1001)
    _core.fill_random(shorter, 42)
    assert shorter == a[:1001]  # a prefix of the same stream
    big = np.zeros(300_000, dtype=np.uint8)  # GIL-free path, numpy buffer
    _core.fill_random(big, 42)
    assert big[:10_007].tobytes() == bytes(a)
    _core.fill_random(bytearray(0), 1)
    _core.fill_random(bytearray(8), -1)  # negative seeds wrap to uint64
    with pytest.raises((TypeError, BufferError)):
        _core.fill_random(b"read-only", 1)


def test_any_part_of_the_payload_stream_can_be_made_alone():
    block = _core.PAYLOAD_BLOCK
    whole = np.zeros(2 * block + 1000, dtype=np.uint8)
    _core.fill_random(whole, 7)
    for start, n in [(0, 10), (block, 500), (block - 3, 8), (5, block), (2 * block + 1, 999),
                     (block + 12_345, block - 12_345)]:
        part = np.zeros(n, dtype=np.uint8)
        _core.fill_random(part, 7, start)
        assert np.array_equal(part, whole[start:start + n]), (start, n)
    # blocks are not copies of each other
    assert not np.array_equal(whole[:1000], whole[block:block + 1000])


@pytest.mark.parametrize(("chunk", "nbytes"), [(0, 3 * MiB + 5), (1, 3 * MiB + 5),
                                               (7, 3 * MiB + 5), (4099, 3 * MiB + 5),
                                               (MiB, 3 * MiB + 5), (0, 17 * MiB + 3),
                                               (3 * MiB, 17 * MiB + 3)])
def test_write_random_writes_exactly_the_stream(tmp_path, chunk, nbytes):
    offset = 13
    stream = bytearray(nbytes)
    _core.fill_random(stream, 99)
    path = tmp_path / "payload.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"HEADER-------", 0)
        crc = _core.write_random(fd, offset, nbytes, 99, chunk, str(path))
    finally:
        os.close(fd)
    content = path.read_bytes()
    assert len(content) == offset + nbytes
    assert content[offset:] == stream
    assert crc == zlib.crc32(stream)


def test_write_random_chains_a_crc_and_names_the_path(tmp_path):
    path = tmp_path / "chained.bin"
    header = b"x.npy header"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        crc = _core.write_random(fd, len(header), 1000, 5, 0, str(path), crc=_core.crc32(header))
        assert _core.write_random(fd, 0, 0, 5, 0, str(path)) == 0  # nothing to write
    finally:
        os.close(fd)
    stream = bytearray(1000)
    _core.fill_random(stream, 5)
    assert crc == zlib.crc32(header + stream)
    rfd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as exc:
            _core.write_random(rfd, 0, 10, 1, 0, "/some/file.bin")
    finally:
        os.close(rfd)
    assert exc.value.errno == errno.EBADF
    assert exc.value.filename == "/some/file.bin" and "/some/file.bin" in exc.value.strerror


# ------------------------------------------------------------------------------- direct I/O


def test_odirect_alignment(disk_tmp):
    path = disk_tmp / "a.bin"
    path.write_bytes(b"\0" * 4096)
    mem, off = _core.odirect_alignment(str(path))
    for value in (mem, off):
        assert value > 0 and value & (value - 1) == 0
    with pytest.raises(FileNotFoundError) as exc:
        _core.odirect_alignment(str(disk_tmp / "missing"))
    assert exc.value.filename == str(disk_tmp / "missing")


def test_probe_odirect(disk_tmp, shm_dir):
    path = disk_tmp / "ok.bin"
    path.write_bytes(b"\1" * 10000)
    assert _core.probe_odirect(str(path)) is None
    bad = shm_dir / "x.bin"
    bad.write_bytes(b"\1" * 10000)
    with pytest.raises(OSError) as exc:
        _core.probe_odirect(str(bad))
    assert exc.value.errno == errno.EINVAL
    assert str(bad) in exc.value.strerror and "reader.odirect" in exc.value.strerror
    with pytest.raises(FileNotFoundError):
        _core.probe_odirect(str(disk_tmp / "missing"))


# ------------------------------------------------------------------------------- engine


def mixed_batches(paths, sizes, nbatches, seed, max_len=20_000):
    rng = random.Random(seed)
    batches = []
    for _ in range(nbatches):
        batch = []
        for _ in range(rng.randint(0, 12)):
            f = rng.randrange(len(paths))
            ln = min(rng.choice([0, 1, 7, 100, 2500, 4096, max_len]), sizes[f])
            off = rng.randint(0, sizes[f] - ln)
            batch.append((f, off, ln))
        batches.append(batch)
    return batches


@pytest.mark.parametrize("threads", [0, 1, 3])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_engine_returns_the_requested_bytes(tmp_path, threads, prefetch):
    sizes = [50_000, 123_457, 7, 6 * MiB + 3, 4096, 1]
    paths = make_files(tmp_path, sizes)
    batches = mixed_batches(paths, sizes, 60, seed=threads * 10 + prefetch)
    batches[3] = []  # an empty batch
    batches[5] = [(3, 17, 5 * MiB), (3, 0, 3 * MiB + 1), (0, 0, 50_000)]  # > 2 MiB requests
    batches[6] = [(1, 0, 0), (2, 7, 0)]  # zero-length requests only (offset at EOF is fine)
    with _core.Engine(threads, prefetch, fd_cache=4) as engine:
        engine.set_files(paths)
        got, buf_off, lat, nread = run_epoch(engine, paths, batches)
        # normal reads: bytes read == bytes requested, placements 64-byte aligned
        assert all(b.bytes_read == b.bytes_requested for b in got)
        assert all(off % 64 == 0 for off in buf_off)
        _, _, _, length = arrays(batches)
        assert (nread == length).all()
        assert (lat[length > 0] > 0).all() and (lat[length == 0] == 0).all()
        assert sum(b.read_ops for b in got) >= int((length > 0).sum())
        assert all(b.ready_ns > 0 for b in got)
        counters = engine.counters()
        assert counters["bytes_read"] == int(length.sum())
        assert counters["read_ops"] == sum(b.read_ops for b in got)
        # a second epoch over the same engine (buffers reused)
        run_epoch(engine, paths, mixed_batches(paths, sizes, 20, seed=99))
    assert engine.closed
    engine.close()  # idempotent


def test_engine_many_small_requests(tmp_path):
    """Many batches of small requests across many files, with several threads."""
    sizes = [10_000] * 40
    paths = make_files(tmp_path, sizes, seed=3)
    rng = random.Random(5)
    batches = [[(rng.randrange(40), rng.randrange(0, 7500), 2500) for _ in range(64)]
               for _ in range(50)]
    with _core.Engine(3, 4, fd_cache=8) as engine:
        engine.set_files(paths)
        got, _, _, nread = run_epoch(engine, paths, batches)
        assert (nread == 2500).all()
        assert sum(b.bytes_read for b in got) == 50 * 64 * 2500


@pytest.mark.parametrize("prefetch", [0, 2])
def test_readers_stay_within_the_prefetch_window(tmp_path, prefetch):
    """While the consumer holds batch b, the threads read at most batches b+1 .. b+prefetch."""
    paths = make_files(tmp_path, [1000])
    batches = [[(0, 0, 1000)] for _ in range(8)]
    start, files, offset, length = arrays(batches)

    def settled_bytes(engine, expect):
        deadline = time.monotonic() + 5
        while engine.counters()["bytes_read"] < expect and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # give them time to overrun the window if they could
        return engine.counters()["bytes_read"]

    with _core.Engine(2, prefetch) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(start, files, offset, length))
        assert engine.next().index == 0
        assert settled_bytes(engine, 1000 * (1 + prefetch)) == 1000 * (1 + prefetch)
        assert engine.next().index == 1  # releases batch 0: one more batch may be read
        assert settled_bytes(engine, 1000 * (2 + prefetch)) == 1000 * (2 + prefetch)


def test_odirect_reads_aligned_extents(disk_tmp):
    sizes = [100_003, 3 * MiB + 11, 4096]
    paths = make_files(disk_tmp, sizes, seed=8)
    align = _core.odirect_alignment(paths[0])[1]
    batches = [
        [(0, 1, 10), (0, 4095, 2), (1, 12345, 2 * MiB + 1), (0, 100_000, 3)],  # last: at EOF
        [(2, 0, 4096), (0, 0, 0), (1, 3 * MiB, 11), (0, 99_999, 4)],
        [(1, 5, 3 * MiB + 6)],
    ]
    with _core.Engine(2, 1, odirect=True, fd_cache=4, align=align) as engine:
        engine.set_files(paths)
        got, buf_off, _, nread = run_epoch(engine, paths, batches)
    start, files, offset, length = arrays(batches)
    for i in range(len(files)):
        size = sizes[files[i]]
        lo = offset[i] // align * align
        hi = min(-(-(offset[i] + length[i]) // align) * align, size)
        assert nread[i] == (hi - lo if length[i] else 0), i
        assert (buf_off[i] - (offset[i] - lo)) % align == 0  # extents placed aligned
    assert sum(b.bytes_read for b in got) == int(nread.sum())


@pytest.mark.parametrize("threads", [0, 2])
def test_odirect_on_tmpfs_is_a_clear_error(shm_dir, threads):
    paths = make_files(shm_dir, [10_000])
    start, files, offset, length = arrays([[(0, 0, 4096)]])
    with _core.Engine(threads, 1, odirect=True) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(start, files, offset, length))
        with pytest.raises(OSError) as exc:
            engine.next()
    assert exc.value.errno == errno.EINVAL
    message = exc.value.strerror
    assert paths[0] in message and "reader.odirect" in message and message.count("O_DIRECT") == 1


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_short_read_names_file_and_offset(tmp_path, threads):
    paths = make_files(tmp_path, [10_000, 20_000])
    good = [(0, 0, 100), (1, 500, 1000)]
    batches = [good, good, [(1, 19_000, 1000), (0, 9_990, 20), (1, 0, 10)], good, good]
    start, files, offset, length = arrays(batches)
    with _core.Engine(threads, 2) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(start, files, offset, length))
        assert engine.next().index == 0
        assert engine.next().index == 1
        with pytest.raises(OSError) as exc:
            engine.next()
        assert exc.value.errno == errno.EIO
        assert exc.value.filename == paths[0]
        assert paths[0] in exc.value.strerror and "9990" in exc.value.strerror
        assert "short read" in exc.value.strerror
        with pytest.raises(OSError):  # sticky for the epoch
            engine.next()
        # the engine restarts cleanly
        run_epoch(engine, paths, [good, good])


def test_missing_file_raises_file_not_found(tmp_path):
    paths = make_files(tmp_path, [1000])
    missing = str(tmp_path / "no-such-file.bin")
    start, files, offset, length = arrays([[(0, 0, 10)], [(1, 0, 10)]])
    for threads in (0, 2):
        with _core.Engine(threads, 1) as engine:
            engine.set_files([*paths, missing])
            engine.start_epoch(EpochRequests(start, files, offset, length))
            assert engine.next().index == 0
            with pytest.raises(FileNotFoundError) as exc:
                engine.next()
            assert exc.value.filename == missing and missing in exc.value.strerror


def test_fd_cache_counts_opens(tmp_path):
    paths = make_files(tmp_path, [1000, 1000])
    batches = [[(i % 2, 0, 10) for i in range(20)] for _ in range(5)]  # alternating files
    with _core.Engine(1, 1, fd_cache=1) as engine:
        engine.set_files(paths)
        run_epoch(engine, paths, batches)
        c = engine.counters()
        assert c["opens"] == 100 and c["closes"] == 99
    with _core.Engine(1, 1, fd_cache=64) as engine:
        engine.set_files(paths)
        run_epoch(engine, paths, batches)
        run_epoch(engine, paths, batches)
        assert engine.counters()["opens"] == 2 and engine.counters()["closes"] == 0
        engine.set_files(paths)  # closes cached descriptors
        assert engine.counters()["closes"] == 2
        run_epoch(engine, paths, batches)
        assert engine.counters()["opens"] == 4


def test_new_epoch_abandons_the_one_in_flight(tmp_path):
    sizes = [2 * MiB] * 4
    paths = make_files(tmp_path, sizes, seed=11)
    big = [[(b % 4, 0, 2 * MiB), ((b + 1) % 4, 5, MiB)] for b in range(40)]
    small = mixed_batches(paths, sizes, 15, seed=12)
    for threads in (0, 1, 3):
        with _core.Engine(threads, 3) as engine:
            engine.set_files(paths)
            start, files, offset, length = arrays(big)
            lat = np.zeros(len(files), dtype=np.int64)
            engine.start_epoch(EpochRequests(start, files, offset, length), lat_ns=lat)
            assert engine.next().index == 0
            run_epoch(engine, paths, small)  # replaces the big epoch mid-way
            # the abandoned epoch wrote nothing more once replaced, and never got far
            done = np.count_nonzero(lat)
            assert 2 <= done < len(files), (threads, done)
            frozen = lat.copy()
            # and abandon with nothing taken
            engine.start_epoch(EpochRequests(start, files, offset, length))
            run_epoch(engine, paths, small)
            assert np.array_equal(lat, frozen)
            engine.start_epoch(EpochRequests(start, files, offset, length))  # close while in flight
            t0 = time.monotonic()
            engine.close()
            assert time.monotonic() - t0 < 5 and engine.closed


def test_engine_api_edges(tmp_path):
    paths = make_files(tmp_path, [100])
    with pytest.raises(ValueError):
        _core.Engine(-1, 0)
    with pytest.raises(ValueError):
        _core.Engine(1, -1)
    with pytest.raises(ValueError):
        _core.Engine(1, 1, fd_cache=0)
    with pytest.raises(ValueError):
        _core.Engine(1, 1, align=3000)
    engine = _core.Engine(2, 1)
    assert engine.next() is None  # no epoch yet
    engine.set_files(paths)
    start, files, offset, length = arrays([[(0, 0, 10)]])
    with pytest.raises(ValueError):
        engine.start_epoch(EpochRequests(start, files, offset[:0], length))
    with pytest.raises(OSError) as exc:  # a file index outside the table
        engine.start_epoch(EpochRequests(start, files + 1, offset, length))
    assert exc.value.errno == errno.EINVAL
    with pytest.raises(OSError):  # negative offset
        engine.start_epoch(EpochRequests(start, files, offset - 1, length))
    engine.start_epoch(EpochRequests(np.zeros(1, dtype=np.int64), files[:0], offset[:0],
                                     length[:0]))
    assert engine.next() is None  # an epoch of no batches
    engine.start_epoch(EpochRequests(start, files, offset, length))
    batch = engine.next()
    with pytest.raises(TypeError):
        batch.data[0] = 1  # read-only
    assert "nreq=1" in repr(batch)
    engine.close()
    with pytest.raises(ValueError):
        engine.next()
    with pytest.raises(ValueError):
        engine.counters()
    del engine  # dealloc after close is fine
    unclosed = _core.Engine(2, 2)
    unclosed.set_files(paths)
    unclosed.start_epoch(EpochRequests(start, files, offset, length))
    del unclosed  # dealloc closes


# ------------------------------------------------------------------------------- data files
# Opening a FIFO for reading blocks until a writer comes: these tests end the process (method
# "thread") rather than hang when an open blocks.


def not_regular(folder: Path) -> dict[str, tuple[str, str]]:
    """Things where a data file should be: name -> (path, what the message calls it)."""
    fifo, folder_ = folder / "fifo.npz", folder / "folder.npz"
    os.mkfifo(fifo)
    folder_.mkdir()
    return {"fifo": (str(fifo), "a FIFO"), "directory": (str(folder_), "a directory"),
            "device": ("/dev/null", "a character device")}


@pytest.mark.timeout(20, method="thread")
def test_open_regular_refuses_what_is_no_regular_file_without_blocking(tmp_path):
    for path, what in not_regular(tmp_path).values():
        for call in (_core.open_regular, _core.regular_size, _core.probe_odirect):
            with pytest.raises(OSError) as exc:
                call(path)
            assert exc.value.strerror == f"{path} is {what}, not a regular file", call
            assert exc.value.filename == path
            assert isinstance(exc.value, IsADirectoryError) == (what == "a directory")
    data = make_files(tmp_path, [5000])[0]
    with _core.open_regular(data) as fp:
        assert fp.read() == Path(data).read_bytes()
    assert _core.regular_size(data) == 5000
    with pytest.raises(FileNotFoundError):
        _core.open_regular(str(tmp_path / "missing"))


@pytest.mark.timeout(20, method="thread")
@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("odirect", [False, True])
def test_the_engine_refuses_what_is_no_regular_file_without_blocking(disk_tmp, threads,
                                                                     odirect):
    paths = make_files(disk_tmp, [8192])
    start, files, offset, length = arrays([[(0, 0, 4096)], [(1, 0, 4096)]])
    for path, what in not_regular(disk_tmp).values():
        with _core.Engine(threads, 1, odirect=odirect) as engine:
            engine.set_files([*paths, path])
            engine.start_epoch(EpochRequests(start, files, offset, length))
            assert engine.next().index == 0
            with pytest.raises(OSError) as exc:
                engine.next()
            assert exc.value.filename == path
            assert exc.value.strerror == f"{path} is {what}, not a regular file"
            with pytest.raises(OSError, match="not a regular file"):
                engine.drop_cache(np.array([1], dtype=np.int64))


# ------------------------------------------------------------------------------- accesses


def _start(engine, requests, expect=None):
    """requests: one batch of (file, offset, length, flags)."""
    start = np.array([0, len(requests)], dtype=np.int64)
    cols = [np.array([r[k] for r in requests], dtype=np.int64) for k in range(3)]
    flags = np.array([r[3] for r in requests], dtype=np.uint32)
    exp = None if expect is None else np.array(expect, dtype=np.int64)
    buf_off = np.zeros(len(requests), dtype=np.int64)
    engine.start_epoch(EpochRequests(start, *cols, flags=flags, expect=exp), req_buf_off=buf_off)
    return buf_off


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_an_access_opens_probes_reads_and_closes_its_file(tmp_path, threads):
    paths = make_files(tmp_path, [5000, 7000])
    o, c, f = _core.REQ_OPEN, _core.REQ_CLOSE, _core.REQ_FSTAT
    reqs = [(0, 0, 4096, o), (0, 0, 128, f), (0, 4096, 904, c),  # one access of file 0
            (1, 100, 50, o | c),                                  # a one-read access
            (1, 0, 10, 0)]                                        # a cached descriptor
    with _core.Engine(threads, 1) as engine:
        engine.set_files(paths)
        buf_off = _start(engine, reqs)
        batch = engine.next()
        data = bytes(batch.data)
        for i, (file, off, ln, _) in enumerate(reqs):
            assert data[buf_off[i]:buf_off[i] + ln] == expected_bytes(paths, file, off, ln)
        assert batch.read_ops == 5
        assert engine.next() is None
        counters = engine.counters()
        assert counters["opens"] == 3 and counters["closes"] == 2
        assert counters["stats"] == 3 + 1  # one per open, one asked for
        engine.close_files()
        assert engine.counters()["closes"] == 3


def test_a_read_reaching_the_end_of_the_file_brings_exactly_what_is_expected(tmp_path):
    paths = make_files(tmp_path, [5000])
    o, c = _core.REQ_OPEN, _core.REQ_CLOSE
    with _core.Engine(1, 1) as engine:
        engine.set_files(paths)
        _start(engine, [(0, 0, 4096, o), (0, 4096, 4096, 0), (0, 5000, 1, c)],
               expect=[4096, 904, 0])
        batch = engine.next()
        assert batch.bytes_read == 5000 and batch.read_ops == 3  # the last one sees EOF
        assert engine.next() is None
        # the file grew: the loader's read would bring more than the layout says
        with open(paths[0], "ab") as fp:
            fp.write(b"x" * 10)
        _start(engine, [(0, 4096, 4096, o | c)], expect=[904])
        with pytest.raises(OSError, match="long read .* goes on past the end"):
            engine.next()
        os.truncate(paths[0], 4500)
        _start(engine, [(0, 4096, 4096, o | c)], expect=[904])
        with pytest.raises(OSError, match="short read"):
            engine.next()


def test_broken_accesses_are_refused_before_anything_runs(tmp_path):
    paths = make_files(tmp_path, [100, 100])
    o, c = _core.REQ_OPEN, _core.REQ_CLOSE
    with _core.Engine(1, 1) as engine:
        engine.set_files(paths)
        for bad in ([(0, 0, 10, o)],                      # never closed
                    [(0, 0, 10, c)],                      # closed, never opened
                    [(0, 0, 10, o), (1, 0, 10, c)],       # another file inside the access
                    [(0, 0, 10, o), (0, 0, 10, o | c)]):  # nested
            with pytest.raises(OSError, match="access"):
                _start(engine, bad)
        with pytest.raises(OSError, match="expect"):
            _start(engine, [(0, 0, 10, 0)], expect=[11])


def test_a_file_pattern_names_files_as_dlio_does(tmp_path):
    names = [tmp_path / "train" / f"{i % 3}" / f"img_{i:02d}_of_12.npy" for i in range(12)]
    for i, path in enumerate(names):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * 10)
    with _core.Engine(2, 1) as engine:
        engine.set_file_pattern(12, str(tmp_path / "train"), 3, 1, "img_", 2, "_of_12.npy")
        buf_off = _start(engine, [(i, 0, 10, 0) for i in range(12)])
        data = bytes(engine.next().data)
        assert [data[buf_off[i]] for i in range(12)] == list(range(12))


def test_descriptor_cache_is_least_recently_used(tmp_path):
    paths = make_files(tmp_path, [100] * 4)
    with _core.Engine(1, 1, fd_cache=2) as engine:
        engine.set_files(paths)
        # 0 1 0 2 (evicts 1, the least recently used) 0 (hit) 1 (evicts 2)
        run_epoch(engine, paths, [[(f, 0, 10) for f in (0, 1, 0, 2, 0, 1)]])
        assert engine.counters()["opens"] == 4 and engine.counters()["closes"] == 2


def test_drop_cache_advises_every_file_away(tmp_path):
    paths = make_files(tmp_path, [1 << 20, 1 << 20, 1 << 20])
    for path in paths:  # dirty pages are not dropped
        with open(path, "rb") as fp:
            os.fsync(fp.fileno())
    assert all(resident_pages(p) == 256 for p in paths)  # just written
    with _core.Engine(1, 1) as engine:
        engine.set_files(paths)
        engine.drop_cache(np.array([0, 1], dtype=np.int64))
        assert [resident_pages(p) for p in paths] == [0, 0, 256]
        with pytest.raises(OSError, match="not in the table"):
            engine.drop_cache(np.array([3], dtype=np.int64))
        assert engine.counters()["opens"] == 0  # not counted as the loader's opens


# ------------------------------------------------------------------------------- pacing


def test_pacer_waits_until_the_deadline_and_adapts_its_spin():
    _core.set_timer_slack_ns(0)
    pacer = _core.Pacer()
    assert pacer.adaptive and pacer.spin_ns == 200_000
    late = []
    for _ in range(40):
        deadline = _core.now_ns() + 1_000_000
        late.append(pacer.wait_until(deadline) - deadline)
    assert min(late) >= 0
    assert 10_000 <= pacer.spin_ns <= 2_000_000 and pacer.waits == 40
    fixed = _core.Pacer(0)
    deadline = _core.now_ns() + 2_000_000
    assert fixed.wait_until(deadline) >= deadline and fixed.spin_ns == 0
    assert fixed.spun_ns < 1_000_000  # it slept: the spin only covers its own lateness



@pytest.mark.timeout(60)
@pytest.mark.parametrize("poll_ms,stall_ms", [(0, 20), (60, 20), (5, 40)])
def test_the_step_loop_polls_for_a_batch_being_read_then_sleeps(monkeypatch, tmp_path,
                                                                poll_ms, stall_ms):
    """Pacer(batch_poll_ns): a step whose batch is still being read polls for it up to the
    limit, then sleeps until the readers signal it. The read of f1.bin stalls (the engine's
    test hook): polled for 60 ms, the step stops polling when the batch is there (before the
    limit); for 5 ms, it polls 5 ms and sleeps the rest (on no CPU); 0 never polls. Either
    way every step gets its batch, and ready <= got."""
    monkeypatch.setenv("DLIO_MPI_TEST_STALL", f"read:{stall_ms / 1e3}:f1.bin")
    paths = make_files(tmp_path, [4096] * 3)
    out = np.zeros((3, 8), dtype=np.int64)
    pacer = _core.Pacer(0, poll_ms * 1_000_000)
    assert pacer.batch_poll_ns == poll_ms * 1_000_000
    with _core.Engine(1, 1) as engine:
        engine.set_files(paths)
        engine.start_epoch(EpochRequests(*arrays([[(f, 0, 4096)] for f in range(3)])))
        cpu = time.thread_time_ns()
        done = engine.run_steps(pacer, None, np.zeros(3, dtype=np.int64), _core.now_ns(), out)
        cpu = time.thread_time_ns() - cpu
    assert done == 3 and out[:, 6].tolist() == [4096] * 3
    assert (out[:, 2] >= out[:, 1]).all()  # got >= ready
    polled = pacer.batch_polled_ns
    if poll_ms == 0:
        assert polled == 0
    elif poll_ms > stall_ms:  # polled until the batch came, well before the limit
        assert 0 < polled < poll_ms * 1_000_000, polled
    else:  # polled to the limit, then slept
        assert poll_ms * 1_000_000 <= polled < (poll_ms + 10) * 1_000_000, polled
        assert cpu < (stall_ms - 10) * 1_000_000, cpu
    with pytest.raises(ValueError, match="batch_poll_ns must be >= 0"):
        _core.Pacer(0, -1)


def test_auto_batch_polls_only_where_every_thread_has_a_cpu_and_no_loader_is_modelled():
    from dlio_mpi.config import load_config
    from dlio_mpi.mpi.pacing import (
        AUTO_BATCH_SPIN_NS,
        auto_batch_spin_ns,
        background_threads,
        make_pacing,
        models_loader_costs,
    )

    assert not models_loader_costs(load_config("demo").reader)
    for key in ("preprocess_time", "preprocess_cpu_time", "step_cpu_time", "step_wait_time"):
        assert models_loader_costs(load_config("demo", [f"reader.{key}=0.001"]).reader), key

    assert auto_batch_spin_ns(1, 1, 2) == AUTO_BATCH_SPIN_NS  # a step loop and a reader
    assert auto_batch_spin_ns(2, 1, 2) == 0                   # 4 threads on 2 CPUs
    assert auto_batch_spin_ns(4, 3, 16) == AUTO_BATCH_SPIN_NS
    assert auto_batch_spin_ns(4, 4, 16) == 0
    assert auto_batch_spin_ns(1, 0, 64) == 0                  # inline reads: nothing to wait for
    assert auto_batch_spin_ns(1, 1, 64, loader_modelled=True) == 0  # its process sleeps
    assert auto_batch_spin_ns(2, 1, 6, background_threads=1) == AUTO_BATCH_SPIN_NS
    assert auto_batch_spin_ns(2, 1, 5, background_threads=1) == 0  # an async writer each
    assert background_threads(load_config("demo")) == 0
    assert background_threads(load_config("demo", [
        "workflow.checkpoint=true", "checkpoint.async_write=true",
        "checkpoint.drain={to: /tmp/pfs}"])) == 2
    auto = make_pacing(None, None, None, 1_500_000)
    assert auto.pacer.batch_poll_ns == 1_500_000 and auto.to_json()["batch_spin_us"] == "auto"
    fixed = make_pacing(None, None, 300.0, 1_500_000)
    assert fixed.pacer.batch_poll_ns == 300_000 and fixed.to_json()["batch_spin_us"] == 300.0


def test_permutation_is_a_seeded_bijection():
    for n in (1, 2, 3, 1000, 4097):
        values = np.arange(n, dtype=np.int64)
        _core.permute(n, 42, values)
        assert sorted(values.tolist()) == list(range(n))
    a, b = np.arange(100, dtype=np.int64), np.arange(100, dtype=np.int64)
    _core.permute(100, 1, a)
    _core.permute(100, 2, b)
    assert not np.array_equal(a, b) and not np.array_equal(a, np.arange(100))
    with pytest.raises(ValueError):
        _core.permute(10, 1, np.array([10], dtype=np.int64))



def test_gather_copies_the_ranges_in_order_end_to_end_or_nothing():
    """_core.gather: what the staging tiers' batches are made of. The ranges come out in the
    given order (not sorted), end to end; one range outside the source or too much for the
    destination copies nothing at all."""
    src = np.frombuffer(np.random.default_rng(7).bytes(1 << 16), dtype=np.uint8)
    at = np.array([60_000, 5, 1000, 65_530], dtype=np.int64)
    length = np.array([100, 0, 4096, 6], dtype=np.int64)
    out = np.full(8192, 0xAB, dtype=np.uint8)
    assert _core.gather(out, src, at, length) == 4202
    assert out[:4202].tobytes() == b"".join(src[a:a + n].tobytes() for a, n in zip(at, length))
    assert set(out[4202:].tolist()) == {0xAB}
    for bad_at, bad_len, size in ([65_530], [7], 64), ([-1], [1], 64), ([0], [65], 64), \
            ([0, 10], [40, 40], 64), ([0], [-1], 64):
        out = np.zeros(size, dtype=np.uint8)
        with pytest.raises(ValueError, match="gather: a range is outside"):
            _core.gather(out, src, np.array(bad_at, np.int64), np.array(bad_len, np.int64))
        assert not out.any()
    with pytest.raises(ValueError, match="2 offsets but 1 lengths"):
        _core.gather(out, src, np.zeros(2, np.int64), np.zeros(1, np.int64))
    assert _core.gather(out, src, np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


def test_discarding_engine_reads_the_same_bytes_into_no_batch_memory(tmp_path):
    paths = make_files(tmp_path, [3 * MiB, MiB])
    batches = [[(0, 0, 3 * MiB), (1, 5, 1000)], [(1, 0, MiB)]]
    start, files, offset, length = arrays(batches)
    for keep in (True, False):
        with _core.Engine(2, 1, discard=not keep) as engine:
            engine.set_files(paths)
            # buffers made before the clock
            engine.reserve(EpochRequests(start, files, offset, length))
            engine.start_epoch(EpochRequests(start, files, offset, length))
            got = [engine.next() for _ in batches]
            assert [b.bytes_read for b in got] == [3 * MiB + 1000, MiB]
            assert len(got[-1].data) == (MiB if keep else 0)


# ------------------------------------------------------------------------------- the watchdog


def stalled_engine(monkeypatch, tmp_path, stall: str, **watchdog):
    """A 2-thread engine over files f0..f2 whose first `stall` (DLIO_MPI_TEST_STALL, the
    engine's test hook) of f1.bin hangs, and an epoch of one request per file started."""
    monkeypatch.setenv("DLIO_MPI_TEST_STALL", stall)
    paths = make_files(tmp_path, [1000] * 3)
    engine = _core.Engine(2, 1, who="rank 7", **watchdog)
    engine.set_files(paths)
    engine.start_epoch(EpochRequests(*arrays([[(f, 0, 100)] for f in range(3)])))
    return engine, paths[1]


@pytest.mark.timeout(30, method="thread")
@pytest.mark.parametrize("op", ["read", "open"])
def test_the_watchdog_reports_a_stuck_request_once_and_waits_on(monkeypatch, tmp_path, capfd,
                                                                op):
    engine, stuck = stalled_engine(monkeypatch, tmp_path, f"{op}:1.5:f1.bin", watchdog_s=0.3)
    with engine:
        begin = time.monotonic()
        assert [engine.next().index for _ in range(3)] == [0, 1, 2]
        assert engine.next() is None
        assert time.monotonic() - begin >= 1.5  # the request did complete
    what = "a read" if op == "read" else "an open"
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # stuck for 5 times the limit: reported once
    m = re.fullmatch(f"dlio-mpi: rank 7: watchdog: {what} of {re.escape(stuck)} has waited "
                     r"(\d\.\d) s \(reader.io_watchdog_seconds=0.3\)", lines[0])
    assert m and 0.3 <= float(m.group(1)) < 0.6, lines


@pytest.mark.timeout(30, method="thread")
def test_the_watchdog_with_abort_fails_the_wait_at_the_limit(monkeypatch, tmp_path, capfd):
    engine, stuck = stalled_engine(monkeypatch, tmp_path, "read:2:f1.bin", watchdog_s=0.3,
                                   watchdog_abort=True)
    with engine:
        assert engine.next().index == 0
        begin = time.monotonic()
        with pytest.raises(TimeoutError) as exc:
            engine.next()
        assert 0.25 <= time.monotonic() - begin < 1.0  # at the limit, not when the read ends
        assert exc.value.filename == stuck
        assert exc.value.strerror.startswith(f"watchdog: a read of {stuck} has waited 0.")
        assert "reader.io_watchdog_abort: true ends the job" in exc.value.strerror
        with pytest.raises(TimeoutError):  # sticky for the epoch
            engine.next()
    assert capfd.readouterr().err == ""  # the error is the report


@pytest.mark.timeout(30, method="thread")
def test_without_the_watchdog_a_stuck_request_is_waited_for_silently(monkeypatch, tmp_path,
                                                                     capfd):
    engine, _ = stalled_engine(monkeypatch, tmp_path, "read:1:f1.bin")
    with engine:
        assert [engine.next().index for _ in range(3)] == [0, 1, 2]
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("threads", [0, 3])
def test_engine_records_request_start_and_thread_for_traces(tmp_path, threads):
    sizes = [50_000, 123_457, 4096]
    paths = make_files(tmp_path, sizes)
    batches = mixed_batches(paths, sizes, 20, seed=threads)
    start, files, offset, length = arrays(batches)
    n = len(files)
    lat, began, thread = (np.full(n, -7, dtype=np.int64) for _ in range(3))
    with _core.Engine(threads, 2, fd_cache=4) as engine:
        engine.set_files(paths)
        with pytest.raises(ValueError, match="go together"):
            engine.start_epoch(EpochRequests(start, files, offset, length), lat_ns=lat,
                               start_ns=began)
        with pytest.raises(ValueError, match="thread has"):
            engine.start_epoch(EpochRequests(start, files, offset, length), start_ns=began,
                               thread=thread[:1])
        before = _core.now_ns()
        engine.start_epoch(EpochRequests(start, files, offset, length), lat_ns=lat,
                           start_ns=began, thread=thread)
        ends = [engine.next().ready_ns for _ in batches]
        assert engine.next() is None
    after = _core.now_ns()
    # every request: begun within the epoch on the monotonic clock; a read ended by its
    # batch's end (a zero-length request, nothing read, is stamped when passed)
    assert ((began >= before) & (began + lat <= after)).all()
    for b in range(len(batches)):
        rows = np.arange(int(start[b]), int(start[b + 1]))
        rows = rows[length[rows] > 0]
        assert (began[rows] + lat[rows] <= ends[b]).all()
    assert set(thread.tolist()) <= ({-1} if threads == 0 else set(range(threads)))


def test_trace_reads_formats_each_request_exactly():
    """output.trace's read events (csrc/dio_trace.c): the text per request, times as
    microseconds with three decimals (negative ones too), chunks never splitting an event."""
    col = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    chunks: list[bytearray] = []
    _core.trace_reads(b",\n{\"name\":\"read\",\"tid\":", col(2, 3, 2),
                      col(1234567, -5, 0), col(999, 0, 10**12), col(10, 0, 7), col(0, 1, 0),
                      col(7, 8, 2**40), col(1, 2, 3), col(1, 1, 2), b'"a""b\\"c"',
                      col(0, 3, 9), 4, chunks.append, chunk=600)
    # an event is written only where its largest possible text (~350 bytes here) fits
    assert len(chunks) == 2 and len(chunks[0]) < 600
    text = b"".join(chunks).decode()
    events = json.loads("[" + text[1:] + "]")
    assert [e["ts"] for e in events] == [1234.567, -0.005, 0.0]
    assert [e["dur"] for e in events] == [0.999, 0.0, 1e9]
    assert events[1]["args"] == {"file": "b\"c", "offset": 8, "length": 2, "bytes": 0,
                                 "latency_ns": 0, "epoch": 4, "step": 1}
    assert events[2]["args"]["offset"] == 2**40 and events[2]["tid"] == 2
    assert text.startswith(',\n{"name":"read","tid":2,"ts":1234.567,"dur":0.999,')
    with pytest.raises(ValueError, match="file index"):
        _core.trace_reads(b"", col(1), col(0), col(0), col(0), col(5), col(0), col(0),
                          col(0), b'"a"', col(0, 3), 1, chunks.append)
