"""np.load's file-system calls on npy and npz files, modelled.

`np.load(path)` (npy) and `np.load(path)["x"]` (npz) issue a fixed sequence of read(2) calls that
depends only on the file's size, its layout and st_blksize. This module replays that sequence on
small models of the buffered layers in between, so the C engine can issue the same reads:

* `open(path, "rb")`: CPython 3.11 `io.BufferedReader` over `io.FileIO` (Modules/_io/
  bufferedio.c, fileio.c): one fstat at open; a buffer of st_blksize bytes (8192 if <= 1).
* npy: `numpy.fromfile` on the open file object (numpy/_core/include/numpy/npy_3kcompat.h
  `npy_PyFile_Dup2`): a glibc FILE made by fdopen() on os.dup(fd), positioned with
  fseek(tell) then fseek(0, SEEK_CUR), read with one fread (glibc libio/fileops.c). Its buffer is
  min(st_blksize, BUFSIZ=8192) bytes (libio/filedoalloc.c, one more fstat).
* npz: `zipfile.ZipFile` (Lib/zipfile.py) finds the end record, checks for the zip64 locator,
  reads the central directory and the member's local header, then numpy's `format.read_array`
  reads the member through `ZipExtFile` in chunks of `format.BUFFER_SIZE` (2**18) bytes.

Only reads and fstats are modelled; lseek/fcntl/close calls move no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PY_DEFAULT_BUFFER = 8192  # io.DEFAULT_BUFFER_SIZE: FileIO's _blksize when st_blksize <= 1
STDIO_BUFSIZ = 8192       # glibc BUFSIZ: a FILE buffer takes st_blksize only below this
ZIP_MIN_READ = 4096       # zipfile.ZipExtFile.MIN_READ_SIZE
NPZ_CHUNK = 2**18         # numpy.lib.format.BUFFER_SIZE: read_array's chunk for non-files
_EOCD, _LOCATOR64, _EOCD64, _LOCAL = 22, 20, 56, 30  # zip record sizes (zipfile.sizeEndCentDir...)


@dataclass(frozen=True)
class LoaderReads:
    """The read system calls of one np.load, in order, on any descriptor of the file."""

    offset: np.ndarray  # int64: file offset of each read
    length: np.ndarray  # int64: bytes the read returns (clipped at end of file; 0 at EOF)
    asked: np.ndarray   # int64: bytes the read asks for (> length only where it reaches EOF)
    fstats: int         # fstat-like calls on the file's descriptors


class _File:
    """The file as the kernel sees it: every read(2) issued on any descriptor of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[tuple[int, int, int]] = []
        self.fstats = 0

    def read(self, pos: int, n: int) -> int:
        got = max(0, min(n, self.size - pos))
        self.calls.append((pos, got, n))
        return got

    def result(self) -> LoaderReads:
        cols = np.array(self.calls, dtype=np.int64).reshape(-1, 3)
        return LoaderReads(cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy(), self.fstats)


class _BufferedReader:
    """io.BufferedReader(io.FileIO(path)): what `open(path, "rb")` returns (CPython 3.11)."""

    def __init__(self, f: _File, blksize: int) -> None:
        f.fstats += 1  # FileIO.__init__ fstat()s: directory check and st_blksize
        self.f = f
        self.bufsize = blksize if blksize > 1 else PY_DEFAULT_BUFFER
        self.raw = 0     # the descriptor's file offset
        self.start = 0   # file offset of buffer[0] (while the buffer is valid, raw == start+end)
        self.end = -1    # read_end: valid bytes in the buffer; -1 when invalid
        self.pos = 0     # next byte to hand out, an index into the buffer

    def _raw_read(self, n: int) -> int:
        got = self.f.read(self.raw, n)
        self.raw += got
        return got

    def _avail(self) -> int:  # READAHEAD
        return self.end - self.pos if self.end >= 0 else 0

    def tell(self) -> int:
        return self.start + self.pos if self.end >= 0 else self.raw

    def seek(self, target: int, whence: int = 0) -> None:
        if whence == 1:
            target += self.tell()
        # SEEK_SET/SEEK_CUR stay inside the buffer if it still has unread bytes (avail > 0)
        if whence != 2 and self._avail() > 0 and self.start <= target <= self.start + self.end:
            self.pos = target - self.start
            return
        self.raw = target + (self.f.size if whence == 2 else 0)  # lseek; buffer dropped
        self.end = -1

    def read(self, n: int = -1) -> int:
        avail = self._avail()
        if n < 0:  # _bufferedreader_read_all: the buffered bytes, then FileIO.readall()
            self.end = -1
            return avail + self._readall()
        if n <= avail:  # _bufferedreader_read_fast
            self.pos += n
            return n
        # _bufferedreader_read_generic: take the buffered bytes, read whole buffers' worth
        # straight into the result, then refill the buffer for the remainder
        got, remaining = avail, n - avail
        self.end = -1
        while remaining >= self.bufsize:
            r = self._raw_read(self.bufsize * (remaining // self.bufsize))  # MINUS_LAST_BLOCK
            if r == 0:
                return got
            got, remaining = got + r, remaining - r
        self.start, self.end, self.pos = self.raw, 0, 0
        while remaining > 0 and self.end < self.bufsize:  # _bufferedreader_fill_buffer
            r = self._raw_read(self.bufsize - self.end)
            if r == 0:
                break
            self.end += r
            take = min(r, remaining)
            self.pos, got, remaining = self.pos + take, got + take, remaining - take
        return got

    def _readall(self) -> int:
        """FileIO.readall: fstat for the size, ask for one byte more than is left, then read
        until a read returns 0 (the first one leaves one byte of room, so a second is needed)."""
        self.f.fstats += 1
        size = self.f.size
        room = size - self.raw + 1 if size >= max(self.raw, 1) else 8192  # else SMALLCHUNK
        got = 0
        while (r := self._raw_read(room - got)) > 0:
            got += r
        return got


class _StdioFile:
    """glibc FILE from fdopen(dup(fd), "rb"): numpy.fromfile's view of the open file object."""

    def __init__(self, f: _File, blksize: int) -> None:
        self.f = f
        self.bufsize = blksize if 0 < blksize < STDIO_BUFSIZ else STDIO_BUFSIZ
        self.allocated = False
        self.offset: int | None = None  # fp->_offset: file offset of read_end; unknown at first
        self.base = self.ptr = self.end = 0  # read_base, read_ptr, read_end as buffer indexes

    def seek(self, target: int, whence: int = 0) -> None:
        """_IO_new_file_seekoff for SEEK_SET (0) and SEEK_CUR (1) on a read-only stream."""
        must_be_exact = self.base == self.end  # nothing buffered: read only up to the target
        if not self.allocated:  # _IO_doallocbuf -> _IO_file_doallocate fstat()s for st_blksize
            self.f.fstats += 1
            self.allocated = True
        if whence == 1:
            target += self.offset - (self.end - self.ptr)
        if self.offset is not None and self.offset - self.end <= target < self.offset:
            self.base, self.ptr = 0, target - (self.offset - self.end)  # inside the buffer
            return
        # seek to a buffer-size boundary and read up to the target (exact) or a whole buffer
        aligned = target & ~(self.bufsize - 1)
        delta = target - aligned
        if delta > self.bufsize:
            aligned, delta = target, 0
        count = self.f.read(aligned, delta if must_be_exact else self.bufsize) if delta else 0
        if count < delta:
            raise ValueError("seek target beyond end of file")
        self.base, self.ptr, self.end, self.offset = 0, delta, count, aligned + count

    def read(self, want: int) -> None:
        """_IO_file_xsgetn: copy from the buffer; read whole buffers' worth straight into the
        destination; refill (__underflow, a whole buffer) for a remainder below a buffer."""
        while want > 0:
            have = self.end - self.ptr
            if want <= have:
                self.ptr += want
                return
            want -= have
            if want < self.bufsize:
                count = self.f.read(self.offset, self.bufsize)
                self.base, self.ptr, self.end, self.offset = 0, 0, count, self.offset + count
                if count == 0:
                    return
                continue
            direct = want - want % self.bufsize if self.bufsize >= 128 else want
            self.base = self.ptr = self.end = 0
            got = self.f.read(self.offset, direct)
            if got == 0:
                return
            self.offset += got
            want -= got


class _SharedFile:
    """zipfile._SharedFile: seeks the shared file object to its own position before each read."""

    def __init__(self, fp: _BufferedReader, pos: int) -> None:
        self.fp, self.pos = fp, pos

    def seek(self, pos: int) -> None:
        self.fp.seek(pos)
        self.pos = self.fp.tell()

    def read(self, n: int) -> int:
        self.fp.seek(self.pos)
        got = self.fp.read(n)
        self.pos = self.fp.tell()
        return got


class _ZipExtFile:
    """zipfile.ZipExtFile for a stored (uncompressed) member; only buffer lengths are kept."""

    def __init__(self, fileobj: _SharedFile, size: int) -> None:
        self.fileobj, self.size, self.start = fileobj, size, fileobj.pos
        self.left = size  # == _compress_left for a stored member
        self.buffered = self.offset = 0  # len(_readbuffer), _offset

    def _read2(self, n: int) -> int:  # at least MIN_READ_SIZE, at most what the member has left
        got = self.fileobj.read(min(max(n, ZIP_MIN_READ), self.left))
        self.left -= got
        return got

    def read(self, n: int) -> None:
        end = n + self.offset
        if end < self.buffered:
            self.offset = end
            return
        n = end - self.buffered
        self.buffered = self.offset = 0
        while n > 0 and self.left > 0:
            data = self._read2(n)
            if n < data:  # keep the rest of this read for later calls
                self.buffered, self.offset = data, n
                return
            n -= data

    def rewind(self) -> None:
        """seek(0): move inside the read buffer if it still holds the member's first byte, else
        reposition the shared file at the member's start and drop the buffer."""
        pos = self.size - self.left - self.buffered + self.offset
        if 0 <= self.offset - pos < self.buffered:
            self.offset -= pos
            return
        self.fileobj.seek(self.start)
        self.left, self.buffered, self.offset = self.size, 0, 0


def _read_npy_header(fp: _BufferedReader | _ZipExtFile, header_len: int) -> None:
    """format.read_magic, then _read_array_header: the length field is 2 bytes in version 1.0
    (which np.save writes whenever the header fits) and 4 bytes in 2.0/3.0."""
    field = 2 if header_len - 10 <= 0xFFFF else 4
    fp.read(8)
    fp.read(field)
    fp.read(header_len - 8 - field)


def _sniff(fid: _BufferedReader) -> None:
    """np.load reads the first 6 bytes to tell npy from npz, then backs up."""
    got = fid.read(6)
    fid.seek(-min(6, got), 1)


def npy_reads(size: int, header_len: int, blksize: int = 4096) -> LoaderReads:
    """Reads of `np.load(path)` on an npy file of `size` bytes whose header (magic, length
    field and dict) is `header_len` bytes; the array is the rest of the file."""
    f = _File(size)
    fid = _BufferedReader(f, blksize)  # open(path, "rb")
    _sniff(fid)
    _read_npy_header(fid, header_len)  # format.read_array
    stdio = _StdioFile(f, blksize)     # numpy.fromfile: fdopen(dup(fd))
    stdio.seek(fid.tell())             # npy_PyFile_Dup2: fseek to the Python-side position
    stdio.seek(0, 1)                   # fromfile: fseek(fp, offset=0, SEEK_CUR)
    stdio.read(size - header_len)      # one fread of count * itemsize
    return f.result()


def npz_reads(
    size: int,
    header_len: int,
    payload: int,
    cd_offset: int,
    *,
    member_offset: int = 0,
    name_len: int = 5,
    extra_len: int = 20,
    zip64_end: bool = False,
    itemsize: int = 1,
    blksize: int = 4096,
) -> LoaderReads:
    """Reads of `np.load(path)["x"]` on an npz (zip) file of `size` bytes whose member x.npy is
    stored uncompressed.

    header_len: the npy header length inside x.npy; payload: the array bytes after it (the
    member is header_len + payload bytes). cd_offset: where the central directory starts; it
    must end where the end records begin (so its length follows), as np.savez and dlio-mpi
    write it. member_offset: offset of x.npy's local header; name_len and extra_len: its file
    name and extra-field lengths (np.savez: 5 and 20, for it forces a zip64 extra; dlio-mpi:
    5 and 0, or 20 for a member of 4 GiB or more). zip64_end: whether a zip64 end record and
    locator (76 bytes) precede the 22-byte end record. The archive has no comment. itemsize:
    the array's dtype itemsize, which sets read_array's chunk. blksize: the file's st_blksize.
    """
    f = _File(size)
    fid = _BufferedReader(f, blksize)  # open(path, "rb")
    _sniff(fid)
    # zipfile._EndRecData: seek(0, 2) and tell() for the size, then read() the end record
    fid.seek(0, 2)
    fid.seek(-_EOCD, 2)
    fid.read()
    # _EndRecData64: read the 20 bytes where a zip64 locator would be (unless the file is too
    # short to seek there), and the zip64 end record if the locator is there
    if size >= _EOCD + _LOCATOR64:
        fid.seek(-_EOCD - _LOCATOR64, 2)
        fid.read(_LOCATOR64)
        if zip64_end:
            fid.seek(-_EOCD - _LOCATOR64 - _EOCD64, 2)
            fid.read(_EOCD64)
    # _RealGetContents: the central directory in one read
    end_records = size - _EOCD - (_LOCATOR64 + _EOCD64 if zip64_end else 0)
    fid.seek(cd_offset)
    fid.read(end_records - cd_offset)
    # NpzFile["x"] -> ZipFile.open("x.npy"): local header, name and extra field, one read each
    shared = _SharedFile(fid, member_offset)
    shared.read(_LOCAL)
    shared.read(name_len)
    if extra_len:
        shared.read(extra_len)
    member = _ZipExtFile(shared, header_len + payload)
    member.read(6)  # NpzFile.__getitem__ checks the npy magic, then seeks back
    member.rewind()
    _read_npy_header(member, header_len)  # format.read_array
    chunk = itemsize * (NPZ_CHUNK // min(NPZ_CHUNK, itemsize))
    for done in range(0, payload, chunk):
        member.read(min(chunk, payload - done))
    return f.result()
