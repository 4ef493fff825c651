"""The np.load read model (dlio_mpi.formats.npload) against strace of a real np.load.

Files written by np.save / np.savez and by dlio-mpi's own writers are loaded in one traced
subprocess; each file's read calls (offset, bytes returned, bytes asked) and fstat count must
equal the model's exactly. The file system's st_blksize sets the buffers; to check other values,
list folders on other file systems in DLIO_NPLOAD_DIRS (os.pathsep-separated), e.g. XFS mounted
with `largeio,allocsize=64k` (st_blksize 65536) or a Lustre folder.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi.formats import base, get_format
from dlio_mpi.formats.base import SampleSpec
from dlio_mpi.formats.npload import npy_reads, npz_reads

MIB = 1 << 20
SIZES = [1, 100, 4000, 4096 - 128, 4096, 5000, 65536, 262143, 262144, 262145, MIB,
         3 * MIB + 5, 10 * MIB]
EXTRA_DIRS = [d for d in os.environ.get("DLIO_NPLOAD_DIRS", "").split(os.pathsep) if d]
FOLDERS = ["tmp", *EXTRA_DIRS]
TRACED = "openat,read,pread64,readv,lseek,newfstatat,fstat,statx,close,dup,dup2,dup3,fcntl"


def _hw1(n: int) -> tuple[int, int, int]:
    """An (h, w, 1) shape of n elements, as square as n's divisors allow."""
    h = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return h, n // h, 1


def _np_cases() -> dict[str, tuple]:
    """name -> (writer, array): np.save / np.savez of one sample."""
    cases = {}
    for size in SIZES:
        for dtype in ("u1", "f4"):
            n = size // np.dtype(dtype).itemsize
            if n:
                for writer in ("npy", "npz"):
                    cases[f"np-{writer}-{dtype}-{size}"] = (writer, np.zeros(_hw1(n), dtype))
    # longer headers: many axes (192 and 256 bytes), a 12-field record (320 bytes, itemsize 48,
    # so npz chunks of 48 * (2**18 // 48)), and 3-byte strings (chunks of 2**18 - 1)
    record = np.dtype([(f"f{i}", "<f4") for i in range(12)])
    for name, arr in {
        "hdr192": np.zeros((1,) * 18 + (512, 512, 4), "u1"),
        "hdr256": np.zeros((1,) * 37 + (1024, 1024, 3), "u1"),
        "record": np.zeros((21846,), record),
        "s3": np.zeros((349525,), "S3"),
    }.items():
        for writer in ("npy", "npz"):
            cases[f"np-{writer}-{name}"] = (writer, arr)
    cases["np-npz-zip64end"] = ("npz-zip64", np.zeros((300, 300, 1), "u1"))
    return cases


def _dlio_cases() -> dict[str, tuple]:
    """name -> (format, SampleSpec): files from dlio-mpi's own writers."""
    specs = [((1, 1), "|u1", 1, "first_axis"), ((64, 64), "|u1", 1, "first_axis"),
             ((512, 512), "|u1", 1, "first_axis"), ((1024, 1024), "|u1", 1, "first_axis"),
             ((1027, 1021), "|u1", 3, "first_axis"), ((256, 256), "<f4", 4, "last_axis")]
    return {f"dlio-{fmt}-{'x'.join(map(str, s[0]))}{s[1][1:]}-{s[2]}": (fmt, SampleSpec(*s))
            for fmt in ("npy", "npz") for s in specs}


NP_CASES, DLIO_CASES = _np_cases(), _dlio_cases()
CASES = [*NP_CASES, *DLIO_CASES]


def _write(folder: Path, name: str) -> Path:
    if name in DLIO_CASES:
        fmt, spec = DLIO_CASES[name]
        path = folder / f"{name}.{fmt}"
        staged = base.StagedWrites("7e57")
        get_format(fmt).write(str(path), spec, 7, staged)
        staged.commit()
        return path
    writer, arr = NP_CASES[name]
    path = folder / f"{name}.{writer[:3]}"
    if writer == "npy":
        np.save(path, arr)
    elif writer == "npz":
        np.savez(path, x=arr)
    else:  # zipfile writes zip64 end records past ZIP64_LIMIT; lower it to get them cheaply
        limit, zipfile.ZIP64_LIMIT = zipfile.ZIP64_LIMIT, 1000
        try:
            np.savez(path, x=arr)
        finally:
            zipfile.ZIP64_LIMIT = limit
    return path


LOADER = """
import sys
import numpy as np
for path in sys.argv[1:]:
    a = np.load(path)["x"] if path.endswith(".npz") else np.load(path)
"""


def _strace(paths: list[Path], log: Path, loader: str = LOADER) -> dict[str, dict]:
    """np.load (or `loader`'s code, given the paths as arguments) each path in one traced
    subprocess; per path its reads (offset, returned, asked), fstat-like calls (of its
    descriptors or its path), opens and closes. Offsets come from following each open file
    description's position through lseek results and read return values."""
    cmd = ["strace", "-f", "-qq", "-s", "0", "-o", str(log), "-e", f"trace={TRACED}"]
    for p in paths:
        cmd += ["-P", str(p)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    subprocess.run([*cmd, sys.executable, "-P", "-c", loader, *map(str, paths)],
                   check=True, env=env, timeout=120)
    out = {str(p): {"reads": [], "fstats": 0, "opens": 0, "closes": 0} for p in paths}
    fds: dict[int, tuple[str, list[int]]] = {}  # fd -> (path, [shared file position])
    call = re.compile(r"^(?:\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+|0x[0-9a-f]+)")
    for line in log.read_text().splitlines():
        assert "unfinished" not in line and "resumed" not in line, line
        m = call.match(line)
        if not m:
            continue
        name, args, ret = m.group(1), m.group(2), int(m.group(3), 0)
        if name == "openat":
            path = re.search(r'"([^"]*)"', args).group(1)
            out[path]["opens"] += 1
            fds[ret] = (path, [0])
            continue
        if args.startswith("AT_FDCWD"):  # a stat of the path itself
            path = re.search(r'"([^"]*)"', args).group(1)
            out[path]["fstats"] += name in ("newfstatat", "statx")
            continue
        fd = int(args.split(",")[0])
        path, position = fds[fd]
        rec = out[path]
        if name in ("dup", "dup2", "dup3") or (name == "fcntl" and "F_DUPFD" in args):
            fds[ret] = fds[fd]  # a duplicate shares the open file description's position
        elif name == "close":
            rec["closes"] += 1
            del fds[fd]
        elif name == "lseek":
            position[0] = ret
        elif name == "read":
            rec["reads"].append((position[0], ret, int(args.rsplit(",", 1)[1])))
            position[0] += ret
        elif name == "pread64":
            asked, offset = (int(v) for v in args.rsplit(",", 2)[1:])
            rec["reads"].append((offset, ret, asked))
        elif name in ("newfstatat", "fstat", "statx"):
            rec["fstats"] += 1
        elif name == "readv":
            raise AssertionError(f"readv not modelled: {line}")
    return out


def _npy_header(fp) -> tuple[np.dtype, int]:
    """dtype and header length of the npy array at fp's position."""
    start = fp.tell()
    version = np.lib.format.read_magic(fp)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    _, _, dtype = read(fp)
    return dtype, fp.tell() - start


def _model(path: Path):
    """The model's reads for `path`, its zip structure read with zipfile and struct."""
    size, blksize = path.stat().st_size, path.stat().st_blksize
    if path.suffix == ".npy":
        with open(path, "rb") as fp:
            _, header_len = _npy_header(fp)
        return npy_reads(size, header_len, blksize=blksize)
    with zipfile.ZipFile(path) as archive:
        info, cd_offset = archive.getinfo("x.npy"), archive.start_dir
    with open(path, "rb") as fp:
        fp.seek(info.header_offset)
        name_len, extra_len = struct.unpack("<HH", fp.read(30)[26:30])
        fp.seek(info.header_offset + 30 + name_len + extra_len)
        dtype, header_len = _npy_header(fp)
        fp.seek(size - 42)
        zip64_end = fp.read(4) == b"PK\x06\x07"  # the zip64 end-of-central-directory locator
    assert info.compress_type == zipfile.ZIP_STORED
    return npz_reads(size, header_len, info.file_size - header_len, cd_offset,
                     member_offset=info.header_offset, name_len=name_len, extra_len=extra_len,
                     zip64_end=zip64_end, itemsize=dtype.itemsize, blksize=blksize)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """folder -> {case: (path, strace record)}, one traced subprocess per folder."""
    result, written = {}, []
    for folder in FOLDERS:
        where = tmp_path_factory.mktemp("npload") if folder == "tmp" else Path(folder)
        paths = {name: _write(where, name) for name in CASES}
        written += paths.values()
        got = _strace(list(paths.values()), tmp_path_factory.mktemp("strace") / "log")
        result[folder] = {name: (p, got[str(p)]) for name, p in paths.items()}
    yield result
    for p in written:  # the DLIO_NPLOAD_DIRS folders are not pytest's to clean
        p.unlink()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("case", CASES)
def test_model_matches_strace(traces, folder, case):
    path, seen = traces[folder][case]
    model = _model(path)
    expected = list(zip(model.offset.tolist(), model.length.tolist(), model.asked.tolist()))
    assert seen["reads"] == expected
    assert seen["fstats"] == model.fstats == 2
    # one open; npy also closes the descriptor numpy.fromfile dup()s for its FILE
    assert (seen["opens"], seen["closes"]) == (1, 2 if path.suffix == ".npy" else 1)


# Observed with strace on XFS mounted with largeio,allocsize=64k and allocsize=4m (st_blksize
# 65536 and 4 MiB): np.save / np.savez(x=...) of a (1024, 1024, 1) uint8 array. CPython's buffer
# follows st_blksize, glibc's FILE buffer stops at BUFSIZ (8192).
OBSERVED = {
    ("npy", 65536): [(0, 65536, 65536), (0, 128, 128), (0, 8192, 8192),
                     (8192, 1040384, 1040384), (1048576, 128, 8192)],
    ("npz", 65536): [(0, 65536, 65536), (1048810, 22, 23), (1048832, 0, 1),
                     (1048790, 42, 65536), (1048759, 73, 65536), (0, 65536, 65536),
                     (65536, 196608, 196608), (262144, 65536, 65536), (327680, 196608, 196608),
                     (524288, 65536, 65536), (589824, 196608, 196608), (786432, 65536, 65536),
                     (851968, 196608, 196608), (1048576, 256, 65536)],
    ("npy", 4 * MIB): [(0, 1048704, 4 * MIB), (0, 128, 128), (0, 8192, 8192),
                       (8192, 1040384, 1040384), (1048576, 128, 8192)],
    ("npz", 4 * MIB): [(0, 1048832, 4 * MIB), (1048810, 22, 23), (1048832, 0, 1),
                       (1048790, 42, 4 * MIB), (1048759, 73, 4 * MIB), (0, 1048832, 4 * MIB)],
}


@pytest.mark.parametrize("fmt,blksize", list(OBSERVED))
def test_model_matches_large_blksize_observations(fmt, blksize):
    if fmt == "npy":
        model = npy_reads(1048704, 128, blksize=blksize)
    else:
        model = npz_reads(1048832, 128, MIB, 1048759, blksize=blksize)
    got = list(zip(model.offset.tolist(), model.length.tolist(), model.asked.tolist()))
    assert got == OBSERVED[fmt, blksize]
    assert model.fstats == 2
