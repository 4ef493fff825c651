"""Storage on a POSIX file system (seam.py's protocol): the C core's descriptors, its loops
for the bulk moves, exclusive creation, renames that never replace, and folder locks."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import stat
import time
from typing import IO, BinaryIO

from .. import _core
from ..errors import UserError
from .ownership import LOCK_NAME, new_tag, temporary_name
from .seam import Entry, Handle, Storage

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO there cannot block


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc < 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _renameat2()


def _kind(mode: int) -> str:
    return ("file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode)
            else "link" if stat.S_ISLNK(mode) else "other")


def _what(mode: int) -> str:  # worded as the C core's open of a data file (dio_open.c)
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket")


def _appeared(path: str) -> UserError:
    return UserError(f"{path} appeared while dlio-mpi was writing it (another program?); "
                     "it was left as it is")


class PosixStorage(Storage):
    """Plain paths on any POSIX file system (local, Lustre, GPFS, NFS, tmpfs)."""

    scheme = ""

    # ---- look up
    def entry(self, path: str) -> Entry | None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        return Entry(os.path.basename(path), _kind(st.st_mode), st.st_size, st.st_mtime_ns)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_folder(self, path: str) -> bool:
        return os.path.isdir(path)

    def list(self, folder: str) -> list[Entry]:
        out = []
        with os.scandir(folder) as entries:
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while listed (another rank's temporary)
                out.append(Entry(e.name, _kind(st.st_mode), st.st_size, st.st_mtime_ns))
        return out

    def size(self, path: str) -> int:
        return _core.regular_size(path)

    # ---- read
    def open_read(self, path: str, direct: bool = False) -> Handle:
        fd = os.open(path, _READ | (os.O_DIRECT if direct else 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # pread would say "Illegal seek", naming nothing
                raise OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                              f"{path} is {_what(mode)}, not a regular file", path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def handle_size(self, handle: Handle) -> int:
        return os.fstat(handle).st_size

    def read_into(self, handle: Handle, buffer, offset: int) -> int:
        return os.preadv(handle, [buffer], offset)

    def read_at(self, handle: Handle, length: int, offset: int) -> bytes:
        return os.pread(handle, length, offset)

    def stream(self, path: str) -> BinaryIO:
        return _core.open_regular(path)

    def read_small(self, path: str, limit: int = 1 << 24) -> bytes | None:
        try:
            fd = os.open(path, _READ)
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{path} is not a regular file")
            chunks, left = [], limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def drop_cached(self, handle: Handle, offset: int = 0, length: int = 0) -> None:
        os.posix_fadvise(handle, offset, length, os.POSIX_FADV_DONTNEED)

    # ---- write
    def create_exclusive(self, path: str, direct: bool = False, mode: int = 0o644) -> Handle:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(path, flags | (os.O_DIRECT if direct else 0), mode)
        except FileExistsError:
            raise UserError(f"{path} exists and is not dlio-mpi's: it was left as it is; "
                            "remove it yourself or choose another folder") from None

    def put(self, path: str, data, sync: bool = False) -> None:
        fd = self.create_exclusive(path)
        try:
            try:
                self.append(fd, data)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            self.remove_quietly([path])
            raise

    def open_write(self, path: str, direct: bool = False) -> Handle:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK
                       | (os.O_DIRECT if direct else 0))

    def write_at(self, handle: Handle, data, offset: int) -> int:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += os.pwrite(handle, view[done:], offset + done)
        return done

    def append(self, handle: Handle, data) -> int:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += os.write(handle, view[done:])
        return done

    def truncate(self, handle: Handle, size: int) -> None:
        os.ftruncate(handle, size)

    def sync(self, handle: Handle) -> None:
        os.fsync(handle)

    def sync_all(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            _core.syncfs(fd)
        finally:
            os.close(fd)

    def close(self, handle: Handle) -> None:
        os.close(handle)

    # ---- names
    def make_folders(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def make_folder(self, path: str) -> None:
        os.mkdir(path)

    def remove_folder(self, path: str) -> bool:
        try:
            os.rmdir(path)
        except OSError:
            return False  # something else lives there
        return True

    def rename_noreplace(self, src: str, dst: str) -> None:
        if _RENAMEAT2 is not None:
            if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                          _RENAME_NOREPLACE) == 0:
                return
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                raise _appeared(dst)
            if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(err, os.strerror(err), dst)
        try:  # file systems without RENAME_NOREPLACE: a hard link cannot replace either
            os.link(src, dst)
        except FileExistsError:
            raise _appeared(dst) from None
        os.unlink(src)

    def replace_own(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def remove_quietly(self, paths) -> None:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def claim(self, folder: str, what: str) -> FolderLock:
        return FolderLock(self, folder, what)

    # ---- the C core's bulk moves
    def write_shard(self, handle: Handle, offset: int, nbytes: int, seed: int,
                    **options) -> dict[str, int]:
        return _core.write_shard(handle, offset, nbytes, seed, **options)

    def read_shard(self, handle: Handle, offset: int, nbytes: int, seed: int,
                   **options) -> dict[str, int]:
        return _core.read_shard(handle, offset, nbytes, seed, **options)

    def write_buffer(self, handle: Handle, offset: int, buffer, **options) -> dict[str, int]:
        return _core.write_buffer(handle, offset, buffer, **options)

    def write_random(self, handle: Handle, offset: int, nbytes: int, seed: int,
                     **options) -> int:
        return _core.write_random(handle, offset, nbytes, seed, **options)

    def write_tfrecords(self, handle: Handle, offset: int, head, tail, payload_len: int,
                        count: int, seed: int, **options) -> None:
        _core.write_tfrecords(handle, offset, head, tail, payload_len, count, seed, **options)

    def copier(self, buffer_bytes: int, align: int = 4096) -> _core.Copier:
        return _core.Copier(buffer_bytes, align)

    # ---- added for tiers and readers (stage-in, native reader, drop_cached_pages, requests)
    def direct_alignment(self, path: str) -> tuple[int, int]:
        _core.probe_odirect(path)  # its refusal first, naming the path and why
        return _core.odirect_alignment(path)

    def block_size(self, path: str) -> int:
        return os.stat(path).st_blksize

    def drop_cached_file(self, path: str) -> None:
        with _core.open_regular(path) as fp:
            os.posix_fadvise(fp.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    # ---- added for data (formats' probes and writes, generation, pack, results)
    def open_as_engine(self, path: str) -> Handle:
        with _core.open_regular(path) as fp:  # the engine's open, refused in its words
            return os.dup(fp.fileno())

    def file_object(self, handle: Handle, mode: str = "rb") -> IO:
        return os.fdopen(os.dup(handle), mode)

    def same_file(self, handle: Handle, path: str) -> bool:
        return os.path.samestat(os.fstat(handle), os.stat(path))

    def open_buffered(self, path: str) -> BinaryIO:
        return open(path, "rb")  # noqa: SIM115 - the caller's to close

    def free_bytes(self, path: str) -> int | None:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def allocation_unit(self, path: str) -> int:
        return os.statvfs(path).f_frsize or 4096

    def list_kinds(self, folder: str) -> list[Entry]:
        with os.scandir(folder) as entries:
            return [Entry(e.name, "link" if e.is_symlink()
                          else "folder" if e.is_dir(follow_symlinks=False)
                          else "file" if e.is_file(follow_symlinks=False) else "other")
                    for e in entries]


# ------------------------------------------------------------------------------ the lock


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None if there is none or
    it has exited (a zombie its parent has not reaped yet, as an aborted job's rank is for a
    second or two, holds no folder)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            fields = fp.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


class FolderLock:
    """The lock file of a folder one job writes into; `acquire` refuses while a live job holds
    it and takes over the lock of a job that is gone (on this host)."""

    def __init__(self, storage: PosixStorage, folder: str, what: str) -> None:
        self.storage = storage
        self.path = os.path.join(folder, LOCK_NAME)
        self.what = what
        self.held = False

    def acquire(self) -> None:
        me = {"tool": "dlio-mpi", "what": self.what, "host": socket.gethostname(),
              "pid": os.getpid(), "start": _process_start(os.getpid()),
              "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        # written whole under a temporary, then linked to the lock's name: a link cannot
        # replace a file, and no job ever sees a lock without its holder's details
        tmp = temporary_name(self.path, new_tag())
        with os.fdopen(self.storage.create_exclusive(tmp), "w") as fp:
            json.dump(me, fp)
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    holder = self._holder()
                    if self._alive(holder):
                        raise self._in_use(holder) from None
                    os.unlink(self.path)  # the job that held it is gone
                    continue
                self.held = True
                return
        finally:
            self.storage.remove_quietly([tmp])
        raise UserError(f"{self.path}: could not take the lock (another job took it)")

    def check_free(self) -> None:
        """Before any I/O: refuse, as acquire would, a folder a live job holds (acquire
        takes it later, after the run's other checks)."""
        if os.path.lexists(self.path):
            holder = self._holder()
            if self._alive(holder):
                raise self._in_use(holder)

    def _in_use(self, holder: dict) -> UserError:
        if holder["host"] == socket.gethostname() and holder["pid"] == os.getpid():
            return UserError(f"{os.path.dirname(self.path)} is claimed twice by this job, as "
                             f"the {holder['what']} folder and the {self.what} folder; "
                             "expected a folder of its own for each")
        return UserError(f"{os.path.dirname(self.path)} is in use by another dlio-mpi job "
                         f"({holder['what']} on {holder['host']}, pid {holder['pid']}, "
                         f"since {holder['since']}); wait for it, or if no such job is "
                         f"running, delete {self.path}")

    def _holder(self) -> dict:
        try:
            holder = json.loads(self.storage.read_small(self.path, 4096) or b"")
            if holder.get("tool") == "dlio-mpi" and isinstance(holder.get("pid"), int) and \
                    all(isinstance(holder.get(k), str) for k in ("what", "host", "since")):
                return holder
        except (OSError, ValueError, AttributeError):
            pass
        raise UserError(f"{self.path} exists and is not a dlio-mpi lock; remove it yourself "
                        "or choose another folder")

    @staticmethod
    def _alive(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return True  # cannot tell: another host's job is taken to be alive
        start = _process_start(holder["pid"])
        return start is not None and start == holder.get("start")

    def release(self) -> None:
        if self.held:
            self.storage.remove_quietly([self.path])
            self.held = False
