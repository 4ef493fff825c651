"""Which files dlio-mpi may write, rename over or delete: only its own, decided per file.

- Temporaries are created with O_EXCL under a name no user file has: `<final>.dlio_mpi-<tag>.tmp`,
  where the tag is drawn per job and recorded (in the dataset manifest, the results manifest)
  before the first one is created, so that a later job can clean a dead job's temporaries
  knowing they are ours.
- A temporary becomes its final name by a rename that never replaces an existing file
  (renameat2 RENAME_NOREPLACE, or link + unlink where the file system lacks it), except where
  the caller names the file it replaces as its own.
- A folder is claimed by one generation at a time through a lock file holding the host, pid
  and process start time; a lock whose process is gone (same host) is stale and taken over.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import socket
import stat
import time

from .errors import UserError

TMP_MARK = ".dlio_mpi-"
LOCK_NAME = "dlio_mpi.lock"
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def new_tag() -> str:
    """A job's temporaries' tag: 48 random bits, so that no other file carries it."""
    return secrets.token_hex(6)


def temporary_name(final: str, tag: str) -> str:
    return f"{final}{TMP_MARK}{tag}.tmp"


def is_temporary_of(name: str, tags) -> bool:
    """Whether a file name is a temporary of a job with one of `tags`."""
    if not name.endswith(".tmp") or TMP_MARK not in name:
        return False
    return name[:-4].rpartition(TMP_MARK)[2] in tags


def create_exclusive(path: str, mode: int = 0o644) -> int:
    """Open a new file for writing; UserError if anything already has that name."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise UserError(f"{path} exists and is not dlio-mpi's: it was left as it is; "
                        "remove it yourself or choose another folder") from None


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc < 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _renameat2()


def rename_noreplace(src: str, dst: str) -> None:
    """Rename `src` to `dst` unless `dst` exists (UserError then, `src` left in place)."""
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


def _appeared(path: str) -> UserError:
    return UserError(f"{path} appeared while dlio-mpi was writing it (another program?); "
                     "it was left as it is")


def read_regular(path: str, limit: int = 1 << 24) -> bytes | None:
    """The first `limit` bytes of a regular file, None if it does not exist; opened so that a
    FIFO or device in its place cannot block (O_NONBLOCK), and refused (ValueError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
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


def read_own_json(path: str, refusal: str) -> dict | None:
    """A JSON record dlio-mpi wrote (its "tool" is "dlio-mpi"): None when there is none;
    UserError(refusal) when the file there is anything else."""
    import json

    try:
        raw = read_regular(path, 1 << 26)
        if raw is None:
            return None
        body = json.loads(raw)
    except (OSError, ValueError):
        body = None
    if not isinstance(body, dict) or body.get("tool") != "dlio-mpi":
        raise UserError(refusal)
    return body


def remove_quietly(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def missing_folders(path: str) -> list[str]:
    """The folders os.makedirs(path) would create, deepest first (to remove them again)."""
    missing = []
    path = os.path.abspath(path)
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_empty_folders(folders) -> None:
    """rmdir each of `folders` in order, leaving any that holds something."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            pass  # something else lives there


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

    def __init__(self, folder: str, what: str) -> None:
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
        with os.fdopen(create_exclusive(tmp), "w") as fp:
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
            remove_quietly([tmp])
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
            holder = json.loads(read_regular(self.path, 4096) or b"")
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
            remove_quietly([self.path])
            self.held = False
