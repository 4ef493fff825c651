"""Small workloads for tests: overrides on the shipped demo workload."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import mpiexec


def workload_overrides(tmp: Path, **values) -> list[str]:
    """Overrides making the demo workload tiny and local to `tmp`; `values` use '__' for '.'
    (dataset__num_files_train=8)."""
    base = {
        "dataset.data_folder": str(tmp / "data"),
        "output.folder": str(tmp / "out"),
        "dataset.num_files_train": 8,
        "dataset.record_length_bytes": 4096,
        "dataset.record_length_bytes_stdev": 0,
        "reader.batch_size": 2,
        "train.computation_time": 0.0,
        "train.epochs": 2,
    }
    base.update({k.replace("__", "."): v for k, v in values.items()})
    return [f"{k}={v}" for k, v in base.items()]


def run_cli(args: list[str], ranks: int = 2, timeout: float = 120,
            cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `dlio-mpi ARGS` on `ranks` MPI ranks (`env` added to the environment); fails the
    test if it hangs."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **env} if env else None)


def run_cli_opens(args: list[str], ranks: int, log: Path, env: dict | None = None,
                  timeout: float = 240) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run `dlio-mpi ARGS` on `ranks` MPI ranks (with `env` added to the environment), under
    `strace -f` writing to `log` when strace is installed; the result and every path the job
    opened (openat), None without strace."""
    res, text = run_cli_strace(args, ranks, log, ["-e", "trace=openat"], env, timeout)
    if text is None:
        return res, None
    return res, re.findall(r'openat\(AT_FDCWD, "([^"]+)"', text)


def run_cli_strace(args: list[str], ranks: int, log: Path, strace_args: list[str],
                   env: dict | None = None, timeout: float = 240
                   ) -> tuple[subprocess.CompletedProcess, str | None]:
    """Run `dlio-mpi ARGS` on `ranks` MPI ranks under `strace -f -qq STRACE_ARGS` writing
    to `log` when strace is installed; the result and the log's text (one line a system
    call, led by the thread's id), None without strace or when the job failed."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", *args]
    traced = shutil.which("strace") is not None
    if traced:
        cmd = ["strace", "-f", "-qq", *strace_args, "-o", str(log), *cmd]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    if not traced or res.returncode != 0:
        return res, None
    return res, log.read_text()


def strace_calls(text: str) -> list[tuple[int, str]]:
    """The system calls of a `strace -f` log as (thread id, call as one line), the halves of
    calls other threads' calls interrupted ("<unfinished ...>", "<... resumed>") joined."""
    calls, pending = [], {}
    for line in text.splitlines():
        tid, _, call = line.partition(" ")
        if not tid.isdigit():
            continue
        call = call.lstrip()
        if call.endswith("<unfinished ...>"):
            pending[int(tid)] = call[:-len("<unfinished ...>")].rstrip()
            continue
        resumed = re.match(r"<\.\.\. \w+ resumed>\s*(.*)", call)
        if resumed:
            call = pending.pop(int(tid), "") + resumed.group(1)
        calls.append((int(tid), call))
    return calls


def rank_pids(marker: str) -> list[int]:
    """The Python processes (ranks) whose command line holds `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fp:
                args = fp.read().split(b"\0")
        except OSError:
            continue
        if args and b"python" in os.path.basename(args[0]) and marker.encode() in b" ".join(args):
            pids.append(int(entry))
    return pids


def file_digests(folder) -> dict[str, str]:
    """Every file under `folder` but dlio-mpi's own (manifests, locks), by its path below
    it, with its SHA-256."""
    import hashlib

    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if not name.startswith("dlio_mpi"):
                path = os.path.join(root, name)
                with open(path, "rb") as fp:
                    out[os.path.relpath(path, folder)] = hashlib.sha256(fp.read()).hexdigest()
    return out


def started_until(cmd: list[str], ready, timeout: float = 60) -> subprocess.Popen:
    """`cmd` started in a session of its own (text output piped) and waited for until
    `ready()`; the test fails if it ends first or takes over `timeout` s (the session
    killed)."""
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.01)
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise
    return job


def ended_after(job: subprocess.Popen, act, timeout: float = 60) -> tuple[str, str]:
    """`act()` done to the running `job` (a session of its own), then its output once it
    ends; on any failure, or past `timeout` s, the whole session is killed first."""
    try:
        act()
        return job.communicate(timeout=timeout)
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise


def signal_one_rank_when(job: subprocess.Popen, marker: str, ready, sig: int) -> None:
    """Once `ready()`, send `sig` to one rank (the highest pid) of the running `job`."""
    deadline = time.monotonic() + 60
    while not ready():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.02)
    pids = rank_pids(marker)
    assert pids, "no rank found"
    os.kill(max(pids), sig)



def resident_pages(path: str | Path) -> int:
    """How many pages of the file are in the page cache (mincore over a mapping of it)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap", str(path))
        try:
            if libc.mincore(address, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore", str(path))
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def run_in_session(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                   timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `cmd` in a session of its own (text output captured); on a hang, kill the whole
    session (mpiexec and every rank) and fail the test."""
    job = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                           start_new_session=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} hung for {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, job.returncode, out, err)


def write_yaml(tmp_path: Path, data, name: str = "w.yaml") -> str:
    """`data` written as a YAML workload file in tmp_path; its path."""
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def error_of(source: str, overrides=()) -> str:
    """The one-line ConfigError loading `source` with `overrides` raises."""
    from dlio_mpi.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def access_logs(out, epochs, ranks: int) -> list:
    """The sample ids each rank read (output.access_log), epoch by epoch then rank by rank."""
    import numpy as np

    return [np.load(os.path.join(out, "access_log", f"epoch{e}_rank{r}.npy"))
            for e in epochs for r in range(ranks)]


def write_one(path: Path, fmt, spec, seed: int) -> Path:
    """One file of `fmt` written through StagedWrites at `path` (side files too), completed;
    its size as write() reports it checked against the file's."""
    from dlio_mpi.formats.base import StagedWrites

    staged = StagedWrites("test")
    size = fmt.write(str(path), spec, seed, staged)
    staged.commit()
    assert size == os.path.getsize(path)
    return path


def nest(dotted: str, value) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


def merged(a: dict, b: dict) -> dict:
    """`a` with `b` merged into it, mappings key by key."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def reads_as_native(run, folder: Path, epochs: tuple[str, ...], common: dict,
                    native: dict, framework: dict, length: int | None = None):
    """The native engine's run (generating the data), then the framework loader's on the same
    files (`run(folder, **overrides)` -> (cfg, summary)): every epoch's access log of this
    rank is the native one (`length` ids long, or at least one), the samples' payload bytes
    are the same and the bytes the loader's reads returned at most a 64 KiB .pyc per read
    thread and rank more. The two summaries (native, framework)."""
    import numpy as np
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    _, by_native = run(folder, output__folder=folder / "native",
                       workflow__generate_data="true", **native, **common)
    _, by_framework = run(folder, output__folder=folder / "framework",
                          workflow__generate_data="false", **framework, **common)
    for name in epochs:
        logs = [np.load(folder / side / "access_log" / f"{name}_rank{rank}.npy")
                for side in ("native", "framework")]
        assert (len(logs[0]) == length if length else len(logs[0]) > 0), name
        assert np.array_equal(*logs), name
    m, n = by_framework["metric"], by_native["metric"]
    assert m["train_bytes_read"] == n["train_bytes_read"] > 0  # the samples' payload
    extra = m["train_bytes_transferred"] - n["train_bytes_transferred"]
    assert 0 <= extra <= size * 2 * 64 * 1024, (m["train_bytes_transferred"],
                                                 n["train_bytes_transferred"])
    assert by_native["dlio_mpi"]["readers"]["train"] == {"backend": "native",
                                                          "file_access": "multi"}
    return by_native, by_framework


def run_in_process(cfg):
    """A whole run of `cfg` on MPI.COMM_WORLD, in this process (under mpiexec): (cfg, its
    summary)."""
    from mpi4py import MPI

    from dlio_mpi.run import run

    return cfg, run(MPI.COMM_WORLD, cfg)



@contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at `path` (made) for the with-block, unmounted after: room runs
    out there. Needs root: the test is skipped where the mount is refused."""
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _memory_hierarchy(version: int) -> tuple[Path, str] | str:
    """(the folder to make a child memory cgroup in, its limit file) of this process's
    cgroup `version` hierarchy, or why there is none to use."""
    from dlio_mpi.mpi.host_memory import cgroup_folders

    for found, point, path in cgroup_folders():
        if found != version:
            continue
        parent = Path(point) / path.lstrip("/")
        if version == 2:
            if "memory" not in (Path(point) / "cgroup.controllers").read_text():
                return (f"the cgroup v2 hierarchy at {point} has no memory controller on "
                        "this machine (memory is bound to cgroup v1)")
            parent = Path(point)  # a child of the root: no internal-process rule there
            return parent, "memory.max"
        return parent if parent.is_dir() else Path(point), "memory.limit_in_bytes"
    return f"no cgroup v{version} memory hierarchy on this machine"


@contextmanager
def memory_cgroup(version: int, limit_bytes: int) -> Iterator[list[str]]:
    """A memory cgroup (v1 or v2) of `limit_bytes`, made for the with-block and removed
    after; yields the command prefix that runs a command inside it. Skips the test, with
    the reason, where this machine or user cannot make one."""
    where = _memory_hierarchy(version)
    if isinstance(where, str):
        pytest.skip(where)
    parent, limit_file = where
    group = parent / f"dlio-mpi-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit_bytes))
    except OSError as exc:
        if group.exists():
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup v{version} under {parent}: {exc}")
    try:
        yield ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"]
    finally:
        for _ in range(50):  # its processes have exited; the kernel lets the group go
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _blkio_group() -> tuple[Path, str] | str:
    """(the folder to make a throttling cgroup in, "v1" or "v2"), or why there is none."""
    v1 = Path("/sys/fs/cgroup/blkio")
    if (v1 / "blkio.throttle.read_bps_device").exists():
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    if "io" in ((v2 / "cgroup.controllers").read_text().split()
                if (v2 / "cgroup.controllers").exists() else []):
        return v2, "v2"
    return "no block-I/O cgroup controller (v1 blkio, v2 io) on this machine"


def _throttle(loop: str, mount: Path, group: Path, flavour: str, rate: int) -> None:
    """An ext4 file system on `loop` mounted at `mount`, its device throttled to `rate`
    bytes/s for the block-I/O cgroup `group` (made)."""
    subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
    mount.mkdir()
    subprocess.run(["mount", loop, str(mount)], check=True, capture_output=True)
    dev = subprocess.run(["lsblk", "-dno", "MAJ:MIN", loop], capture_output=True, text=True,
                         check=True).stdout.strip()
    group.mkdir()
    if flavour == "v1":
        for verb in ("read", "write"):
            (group / f"blkio.throttle.{verb}_bps_device").write_text(f"{dev} {rate}")
    else:
        (group / "io.max").write_text(f"{dev} rbps={rate} wbps={rate}")


@contextmanager
def throttled_fs(tmp_path: Path, mib_per_second: int, size: str = "3G"
                 ) -> Iterator[tuple[Path, list[str]]]:
    """An ext4 file system on a loop device over an image in `tmp_path` (direct I/O to it),
    whose reads and writes are throttled to `mib_per_second` for the processes run through
    the yielded command prefix (a block-I/O cgroup, as scripts/slow_pfs.sh does): (its mount
    point, the prefix). Writes are throttled where they reach the device: write it with
    O_DIRECT. Skips the test where this machine or user cannot make one."""
    where = _blkio_group()
    if isinstance(where, str):
        pytest.skip(where)
    parent, flavour = where
    image, mount = tmp_path / "throttled.img", tmp_path / "throttled"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    try:
        made = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(image)],
                              capture_output=True, text=True)
    except FileNotFoundError as exc:
        made = subprocess.CompletedProcess([], 1, "", str(exc))
    if made.returncode != 0:
        image.unlink()
        pytest.skip(f"cannot make a loop device here: {made.stderr.strip()}")
    loop = made.stdout.strip()
    group = parent / f"dlio-mpi-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        try:
            _throttle(loop, mount, group, flavour, mib_per_second * 2**20)
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot make a throttled file system here: {exc}")
        yield mount, ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)
        for _ in range(50):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        image.unlink(missing_ok=True)


# ---- the checkpoint stream (csrc/dio_ckpt_stream.c), built here independently in numpy
GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _rotl(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


def ckpt_stream(seed: int, start: int, n: int, content: tuple[int, int] | None = None) -> bytes:
    """Bytes [start, start + n) of the checkpoint stream of seed under content (random bytes
    of each 4 KiB granule, granules before one repeats): granule g is 8 xoshiro256** lanes
    interleaved word by word, lane j seeded with splitmix64 outputs 4j+1..4j+4 of
    mix64(key + g' * GAMMA), key = mix64(seed ^ 0x6A09E667F3BCC909), g' = g % unique."""
    if n == 0:
        return b""
    keep, unique = content if content else (4096, 0)
    granules = np.arange(start // 4096, (start + n - 1) // 4096 + 1, dtype=np.uint64)
    source = granules % np.uint64(unique) if unique else granules
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed ^ 0x6A09E667F3BCC909], dtype=np.uint64))[0]
        base = _mix64(key + source * GAMMA)
        counters = np.arange(1, 33, dtype=np.uint64).reshape(8, 4)  # lane j, word i
        state = _mix64(base[:, None, None] + counters[None] * GAMMA)  # (granules, 8, 4)
        s0, s1, s2, s3 = (state[:, :, i].copy() for i in range(4))
        words = np.empty((len(granules), 64, 8), dtype=np.uint64)
        for step in range(64):
            words[:, step] = _rotl(s1 * np.uint64(5), 7) * np.uint64(9)
            t = s1 << np.uint64(17)
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = _rotl(s3, 45)
    data = words.astype("<u8").view(np.uint8).reshape(len(granules), 4096)
    data[:, keep:] = 0
    offset = start % 4096
    return data.reshape(-1)[offset:offset + n].tobytes()
