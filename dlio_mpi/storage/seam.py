"""The storage seam: every operation the emulator asks of storage, declared once (Storage), so
that readers, generation, checkpoints, tiers and results name no file-system call themselves.

An implementation serves the paths of one scheme (storage_for in __init__.py picks it): POSIX
(posix.py, the C core behind it) for plain paths. Every operation says below what it is on
POSIX and what it would be on an object store (S3), so that one can be written against this
protocol without changing its callers:

operation: POSIX / S3 (the full table: docs/architecture.md)
- entry, exists: lstat / HeadObject (a key), ListObjectsV2 max-keys 1 (a prefix)
- size: stat of a regular file, refusing a FIFO or device / HeadObject's Content-Length
- list: scandir / ListObjectsV2 with delimiter "/" (keys and common prefixes)
- open_read: open O_RDONLY O_NONBLOCK (+ O_DIRECT), fstat / HeadObject, keeping the ETag
- read_into, read_at: pread, preadv into our buffer / ranged GetObject into our buffer
- stream: a buffered reader on the file / GetObject's body
- drop_cached: posix_fadvise DONTNEED / nothing (no client cache)
- create_exclusive: open O_CREAT O_EXCL / CreateMultipartUpload, completed If-None-Match: *
- put: create_exclusive, write, fsync, close / PutObject with If-None-Match: *
- open_write: open O_WRONLY of a file of ours / the upload id of one we created
- write_at, append: pwrite, write / UploadPart on part boundaries, PutObject when small
- truncate: ftruncate / the size the parts will sum to
- sync, close: fsync, close / CompleteMultipartUpload: the object exists only then
- sync_all: syncfs / nothing (each object is durable once completed)
- rename_noreplace: renameat2 RENAME_NOREPLACE, or link + unlink / no rename: write under the
  final key with If-None-Match: *, or CopyObject + DeleteObject of a temporary
- replace_own: rename over our own file / PutObject over our own key
- remove: unlink / DeleteObject
- make_folders, make_folder, remove_folder: mkdir, rmdir / nothing (prefixes are no objects)
- claim: a lock file linked under its name / a lock object put with If-None-Match: *
- write_shard, read_shard, write_buffer, write_random, write_tfrecords, copier: the C core's
  loops on a descriptor / the same bytes made in our buffers, sent as parts, read by ranged
  GETs
- direct_alignment: an O_DIRECT probe read, statx STATX_DIOALIGN / (1, 1): no client cache
- block_size: stat's st_blksize / 0 (none said)
- drop_cached_file: open, posix_fadvise DONTNEED, close / nothing
- open_as_engine: the C core's open of a data file (its words for a fault) / as open_read
- open_buffered: Python's open(path, "rb") / GetObject's body
- file_object: os.fdopen of a dup of the descriptor / a buffered reader of ranged GETs, or a
  writer sending the upload's parts
- same_file: fstat and stat agree / true (no object until its upload completes)
- free_bytes, allocation_unit: statvfs / None (no bound said), 1
- list_kinds: scandir's entry types, no lookup per name / ListObjectsV2 with delimiter "/"

A handle is what open_read, create_exclusive and open_write return and only the same
implementation takes back (a descriptor on POSIX). Failures raise OSError naming the path
(FileNotFoundError, PermissionError, ... by errno), or UserError where a file is not ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Literal

Handle = int  # a descriptor on POSIX; opaque to everything outside the implementation
Kind = Literal["file", "folder", "link", "other"]


@dataclass(frozen=True)
class Entry:
    """What entry() and list() tell of a name: its kind (a link is not followed), size and
    modification time."""

    name: str
    kind: Kind
    size: int = 0
    mtime_ns: int = 0


class Storage:
    """What the emulator asks of storage; each operation's POSIX and S3 meaning is in the
    module's table. Every operation raises NotImplementedError unless an implementation
    provides it."""

    scheme: str = ""  # the paths it serves: "" plain paths, else "<scheme>://"

    # ---- look up
    def entry(self, path: str) -> Entry | None:
        """What `path` is (not following a link), None when nothing has that name."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def is_folder(self, path: str) -> bool:
        """Whether `path` is a folder (a link to one counts)."""
        raise NotImplementedError

    def list(self, folder: str) -> list[Entry]:
        """The names in `folder`, in no order."""
        raise NotImplementedError

    def size(self, path: str) -> int:
        """The size of the regular file `path`; OSError naming it when it is anything else."""
        raise NotImplementedError

    # ---- read
    def open_read(self, path: str, direct: bool = False) -> Handle:
        """Open a file for reading: never blocking on a FIFO or device in its place, and
        refusing anything but a regular file (OSError naming it); `direct`: bypass caches."""
        raise NotImplementedError

    def handle_size(self, handle: Handle) -> int:
        raise NotImplementedError

    def read_into(self, handle: Handle, buffer, offset: int) -> int:
        """Read into `buffer` (writable, our own) from `offset`; the bytes read (0 at the
        end)."""
        raise NotImplementedError

    def read_at(self, handle: Handle, length: int, offset: int) -> bytes:
        raise NotImplementedError

    def stream(self, path: str) -> BinaryIO:
        """A binary reader of the whole file, opened as open_read opens (what a library
        reading a file object is given)."""
        raise NotImplementedError

    def read_small(self, path: str, limit: int = 1 << 24) -> bytes | None:
        """The first `limit` bytes of a small regular file (a record, a manifest), None when
        there is none; ValueError when something else is there."""
        raise NotImplementedError

    def drop_cached(self, handle: Handle, offset: int = 0, length: int = 0) -> None:
        """Let the host forget its cached copy of the range (0: to the end)."""
        raise NotImplementedError

    # ---- write
    def create_exclusive(self, path: str, direct: bool = False) -> Handle:
        """Create a new file for writing; UserError if anything already has that name."""
        raise NotImplementedError

    def put(self, path: str, data, sync: bool = False) -> None:
        """Create `path` exclusively (as create_exclusive) holding `data`, made durable first
        when `sync`; nothing left under its name on failure (a manifest's temporary, a
        record, a probe)."""
        raise NotImplementedError

    def open_write(self, path: str, direct: bool = False) -> Handle:
        """Open again for writing a file this job created (a temporary another rank
        created, a staged copy being filled)."""
        raise NotImplementedError

    def write_at(self, handle: Handle, data, offset: int) -> int:
        """Write all of `data` at `offset`; its length."""
        raise NotImplementedError

    def append(self, handle: Handle, data) -> int:
        """Write all of `data` after what was written; its length."""
        raise NotImplementedError

    def truncate(self, handle: Handle, size: int) -> None:
        raise NotImplementedError

    def sync(self, handle: Handle) -> None:
        """Make what was written durable (fsync; an object store's commit)."""
        raise NotImplementedError

    def sync_all(self, path: str) -> None:
        """Make durable everything written to the storage holding `path` (one commit for
        many small files)."""
        raise NotImplementedError

    def close(self, handle: Handle) -> None:
        raise NotImplementedError

    # ---- names
    def make_folders(self, path: str) -> None:
        """Create `path` and the folders above it that are missing."""
        raise NotImplementedError

    def make_folder(self, path: str) -> None:
        """Create the folder `path`; FileExistsError when something has that name."""
        raise NotImplementedError

    def remove_folder(self, path: str) -> bool:
        """Remove the folder `path` if it is empty; whether it was removed."""
        raise NotImplementedError

    def rename_noreplace(self, src: str, dst: str) -> None:
        """Give `src` (ours) the name `dst` unless something has it (UserError then, `src`
        left in place)."""
        raise NotImplementedError

    def replace_own(self, src: str, dst: str) -> None:
        """Give `src` the name `dst`, replacing the file there, which the caller has
        checked is ours (a manifest, a record)."""
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def remove_quietly(self, paths) -> None:
        """Remove each of `paths` that exists."""
        raise NotImplementedError

    def claim(self, folder: str, what: str):
        """The lock of `folder`, one job at a time (`what`: what the job writes there), not
        taken yet: acquire(), check_free(), release()."""
        raise NotImplementedError

    # ---- the C core's bulk moves (bytes made or checked in our buffers)
    def write_shard(self, handle: Handle, offset: int, nbytes: int, seed: int,
                    **options) -> dict[str, int]:
        """A checkpoint shard's bytes of `seed` made and written at `offset` (options:
        _core.write_shard's); its counters."""
        raise NotImplementedError

    def read_shard(self, handle: Handle, offset: int, nbytes: int, seed: int,
                   **options) -> dict[str, int]:
        """A checkpoint shard read back and checked against `seed`; its counters."""
        raise NotImplementedError

    def write_buffer(self, handle: Handle, offset: int, buffer, **options) -> dict[str, int]:
        """`buffer` (a snapshot) written at `offset` in large calls; its counters."""
        raise NotImplementedError

    def write_random(self, handle: Handle, offset: int, nbytes: int, seed: int,
                     **options) -> int:
        """A data file's random payload of `seed` written at `offset`; its CRC-32 when
        asked (options: _core.write_random's)."""
        raise NotImplementedError

    def write_tfrecords(self, handle: Handle, offset: int, head, tail, payload_len: int,
                        count: int, seed: int, **options) -> None:
        raise NotImplementedError

    def copier(self, buffer_bytes: int, align: int = 4096):
        """A copier of byte ranges between two handles of this storage (copy(src, dst,
        offset, length, src_path, dst_path), read_ns, write_ns)."""
        raise NotImplementedError

    # ---- added for tiers and readers (stage-in, native reader, drop_cached_pages, requests)
    def direct_alignment(self, path: str) -> tuple[int, int]:
        """(memory, offset) alignment direct reads of `path` need, after a probe read: OSError
        naming it where the storage cannot bypass its cache (POSIX: an O_DIRECT pread, tmpfs
        refused as it only emulates it; statx STATX_DIOALIGN / S3: no client cache, every
        GET reaches the store: (1, 1))."""
        raise NotImplementedError

    def block_size(self, path: str) -> int:
        """The preferred size of one read of `path`, 0 when it does not say (POSIX: stat's
        st_blksize, following a link / S3: 0); OSError naming it when there is none."""
        raise NotImplementedError

    def drop_cached_file(self, path: str) -> None:
        """drop_cached of the whole file `path`, opened as the C engine opens data files (its
        refusals; POSIX: open, posix_fadvise DONTNEED, close / S3: nothing)."""
    # ---- added for data (formats' probes and writes, generation, pack, results)
    def open_as_engine(self, path: str) -> Handle:
        """open_read, a file that is missing or not regular refused in the C engine's words
        for the same fault (POSIX: dio_open_regular's "open P: No such file or directory",
        "P is a directory, not a regular file"), so that a start-up probe and the engine name
        it alike / S3: as open_read."""
        raise NotImplementedError

    def file_object(self, handle: Handle, mode: str = "rb"):
        """A Python file object on `handle` (what a library given a file object reads or
        writes: pyarrow's writer, json.dump), of its own: closing it flushes it and leaves the
        handle open, which close(handle) closes after it / POSIX: os.fdopen of a dup of the
        descriptor; S3: a buffered reader of ranged GETs, or a writer sending the upload's
        parts."""
        raise NotImplementedError

    def same_file(self, handle: Handle, path: str) -> bool:
        """Whether `path` still names the file `handle` was opened on (nothing put another
        file under its name since), before a library is given the path / POSIX: fstat and
        stat agree (samestat); S3: true (a key is no object until its upload completes)."""
        raise NotImplementedError

    def open_buffered(self, path: str) -> BinaryIO:
        """A buffered binary reader of `path` as a Python reader's own open(path, "rb") makes
        it, for the loaders that stand for DLIO's Python readers: their calls as theirs
        (POSIX: builtin open, one openat and one fstat; a FIFO there would block, so only
        files the catalog found regular are given) / S3: GetObject's body."""
        raise NotImplementedError

    def free_bytes(self, path: str) -> int | None:
        """The room left for new files where `path` (existing) is, None where the storage
        sets no such bound (POSIX: statvfs f_bavail x f_frsize / S3: None, a bucket's quota
        is not said)."""
        raise NotImplementedError

    def allocation_unit(self, path: str) -> int:
        """What every file's size is rounded up to on the storage of `path` (existing)
        (POSIX: statvfs f_frsize, 4096 when it says 0 / S3: 1)."""
        raise NotImplementedError

    def list_kinds(self, folder: str) -> list[Entry]:
        """The names in `folder` with their kinds only (size and mtime 0), in no order, no
        look-up per name (a listing of 10^7 files) / POSIX: scandir's entry types (an lstat
        only where the file system gives none); S3: ListObjectsV2 with delimiter "/"."""
        raise NotImplementedError
