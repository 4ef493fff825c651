"""What the kernel counted of this process's and each thread's storage calls (/proc/self/io,
/proc/thread-self/io): the bytes and read calls a reader or a checkpoint moved."""

from __future__ import annotations

import os
import threading


def process_io() -> tuple[int, int, int] | None:
    """(rchar, syscr, bytes of this very read) of the whole process from /proc/self/io;
    None where the kernel does not say."""
    try:
        fd = os.open("/proc/self/io", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    values = dict(line.split(b":") for line in text.splitlines() if b":" in line)
    return int(values[b"rchar"]), int(values[b"syscr"]), len(text)


def process_field(field: str) -> int:
    """This process's `field` of /proc/self/io (rchar, wchar: bytes read or written by its
    system calls, every thread's); -1 where the kernel does not say."""
    try:
        fd = os.open("/proc/self/io", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        if name == field.encode():
            return int(value)
    return -1


_IO_FDS: dict[tuple[int, int], int] = {}  # (pid, thread id) -> fd of its /proc io file


def thread_io() -> tuple[int, int, int] | None:
    """(rchar, syscr, bytes of this very read) of the calling thread, from
    /proc/thread-self/io; None where the kernel does not say. The read itself counts in the
    next call's figures (one read call of the returned length)."""
    key = (os.getpid(), threading.get_native_id())
    fd = _IO_FDS.get(key)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/io", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        _IO_FDS[key] = fd
    if fd < 0:
        return None
    text = os.pread(fd, 1024, 0)
    values = dict(line.split(b":") for line in text.splitlines() if b":" in line)
    return int(values[b"rchar"]), int(values[b"syscr"]), len(text)


def io_since(before: tuple[int, int, int] | None) -> tuple[int, int]:
    """(bytes, read calls) of the calling thread since `before` = thread_io() (the reads of
    /proc themselves left out); (-1, -1) where the kernel does not say."""
    return io_between(before, thread_io())


def io_between(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None
               ) -> tuple[int, int]:
    """(bytes, read calls) of the calling thread between two thread_io() (the read of
    `before` left out; of `after` too, as it counts only in the next); (-1, -1) where the
    kernel does not say. Chained probes split the thread's reads exactly."""
    if before is None or after is None:
        return -1, -1
    return after[0] - before[0] - before[2], after[1] - before[1] - 1


class IoChain:
    """The calling thread's reads over a batch, split into parts by chained thread_io()
    probes (output.trace: each sample's own bytes): `part()` the bytes since the last probe,
    `end()` the whole batch's (bytes, read calls), the probes' own reads left out, as
    io_since(thread_io() at the start) gives them without parts. -1 where the kernel does
    not say."""

    def __init__(self) -> None:
        self.mark = thread_io()
        self.bytes = self.calls = 0

    def part(self) -> int:
        if self.mark is None:
            return -1
        probe = thread_io()
        got, calls = io_between(self.mark, probe)
        self.mark = probe
        self.bytes += got
        self.calls += calls
        return got

    def end(self) -> tuple[int, int]:
        if self.mark is None:
            return -1, -1
        got, calls = io_since(self.mark)
        return self.bytes + got, self.calls + calls


def forget_thread_io() -> None:
    """Close the calling thread's /proc io file (a thread that ends: its id may come back)."""
    fd = _IO_FDS.pop((os.getpid(), threading.get_native_id()), -1)
    if fd >= 0:
        os.close(fd)
