"""The storage seam's POSIX implementation: every operation does what storage/seam.py says, on
real files (tmp_path), and storage_for picks it by path."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.errors import UserError
from dlio_mpi.storage import Entry, Storage, implementations, storage_for
from dlio_mpi.storage.posix import PosixStorage
from dlio_mpi.storage.seam import Storage as DeclaredStorage


def _bytes(path) -> bytes:
    with open(path, "rb") as fp:
        return fp.read()


@pytest.fixture
def fs() -> PosixStorage:
    return storage_for("/any/path")


def test_storage_for_picks_posix_for_paths_and_refuses_an_unknown_scheme(tmp_path):
    assert isinstance(storage_for(str(tmp_path)), PosixStorage)
    assert isinstance(storage_for("relative/name"), PosixStorage)
    assert isinstance(storage_for("odd/a://b"), PosixStorage)  # a folder named "a:" is a path
    assert set(implementations()) == {""}
    with pytest.raises(UserError, match=r"s3://bucket/x: no storage implements s3:// yet"):
        storage_for("s3://bucket/x")


def test_every_declared_operation_is_implemented():
    declared = {n for n, v in vars(DeclaredStorage).items()
                if callable(v) and not n.startswith("_")}
    assert declared, "the protocol declares operations"
    missing = [n for n in sorted(declared) if getattr(PosixStorage, n) is getattr(Storage, n)]
    assert missing == []


def test_create_exclusive_write_read_back(fs, tmp_path):
    path = str(tmp_path / "f")
    h = fs.create_exclusive(path)
    assert fs.write_at(h, b"world", 6) == 5
    assert fs.write_at(h, memoryview(b"hello "), 0) == 6
    fs.sync(h)
    fs.close(h)
    with pytest.raises(UserError, match="exists and is not dlio-mpi's"):
        fs.create_exclusive(path)
    h = fs.open_read(path)
    try:
        assert fs.handle_size(h) == 11
        assert fs.read_at(h, 5, 6) == b"world"
        buf = bytearray(4)
        assert fs.read_into(h, buf, 2) == 4 and bytes(buf) == b"llo "
        fs.drop_cached(h)
    finally:
        fs.close(h)
    assert fs.size(path) == 11
    with fs.stream(path) as fp:
        assert fp.read() == b"hello world"
    assert fs.read_small(path, 5) == b"hello"
    assert fs.read_small(str(tmp_path / "none")) is None


def test_append_truncate_and_open_write(fs, tmp_path):
    path = str(tmp_path / "f")
    h = fs.create_exclusive(path)
    fs.append(h, b"ab")
    fs.append(h, bytearray(b"cd"))
    fs.close(h)
    h = fs.open_write(path)
    fs.truncate(h, 3)
    fs.close(h)
    assert _bytes(path) == b"abc"


def test_put_is_exclusive_whole_and_leaves_nothing_on_failure(fs, tmp_path):
    path = str(tmp_path / "record.json")
    fs.put(path, b'{"a": 1}', sync=True)
    assert _bytes(path) == b'{"a": 1}'
    with pytest.raises(UserError):
        fs.put(path, b"other")
    assert _bytes(path) == b'{"a": 1}'  # the file there is left as it is

    with pytest.raises(TypeError):  # the write fails after the create: nothing stays
        fs.put(str(tmp_path / "broken"), object())
    assert not os.path.lexists(tmp_path / "broken")


def test_open_read_refuses_a_fifo_without_blocking_and_names_it(fs, tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    done = []

    def attempt() -> None:
        with pytest.raises(OSError, match=f"{fifo} is a FIFO, not a regular file"):
            fs.open_read(fifo)
        with pytest.raises(OSError, match="fifo"):
            fs.size(fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            fs.read_small(fifo)
        done.append(True)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert done == [True], "an open of a FIFO blocked"
    with pytest.raises(IsADirectoryError, match="is a directory, not a regular file"):
        fs.open_read(str(tmp_path))


def test_entries_and_listing(fs, tmp_path):
    (tmp_path / "file").write_bytes(b"12345")
    (tmp_path / "sub").mkdir()
    os.symlink("file", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    listed = {e.name: e.kind for e in fs.list(str(tmp_path))}
    assert listed == {"file": "file", "sub": "folder", "link": "link", "fifo": "other"}
    e = fs.entry(str(tmp_path / "file"))
    st = os.lstat(tmp_path / "file")
    assert e == Entry("file", "file", 5, st.st_mtime_ns)
    assert fs.entry(str(tmp_path / "none")) is None
    assert fs.exists(str(tmp_path / "link")) and not fs.exists(str(tmp_path / "none"))
    assert fs.is_folder(str(tmp_path / "sub")) and not fs.is_folder(str(tmp_path / "file"))


def test_folders(fs, tmp_path):
    deep = str(tmp_path / "a" / "b" / "c")
    fs.make_folders(deep)
    fs.make_folders(deep)  # again: nothing to do
    with pytest.raises(FileExistsError):
        fs.make_folder(deep)
    (tmp_path / "a" / "b" / "c" / "x").write_bytes(b"")
    assert fs.remove_folder(deep) is False  # holds something: left
    fs.remove(deep + "/x")
    assert fs.remove_folder(deep) is True and not os.path.lexists(deep)


def test_renames_never_replace_unless_told(fs, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    fs.put(a, b"ours")
    fs.put(b, b"theirs")
    with pytest.raises(UserError, match="appeared while dlio-mpi was writing it"):
        fs.rename_noreplace(a, b)
    assert _bytes(a) == b"ours" and _bytes(b) == b"theirs"
    fs.replace_own(a, b)
    assert not os.path.lexists(a) and _bytes(b) == b"ours"
    c = str(tmp_path / "c")
    fs.rename_noreplace(b, c)
    assert _bytes(c) == b"ours" and not os.path.lexists(b)
    fs.remove_quietly([c, str(tmp_path / "never")])
    assert not os.path.lexists(c)
    with pytest.raises(FileNotFoundError):
        fs.remove(c)


def test_claim_is_one_job_at_a_time(fs, tmp_path):
    lock = fs.claim(str(tmp_path), "generation")
    lock.acquire()
    assert os.path.lexists(tmp_path / "dlio_mpi.lock")
    with pytest.raises(UserError, match="claimed twice by this job"):
        fs.claim(str(tmp_path), "run").acquire()
    lock.release()
    assert not os.path.lexists(tmp_path / "dlio_mpi.lock")
    assert [e.name for e in fs.list(str(tmp_path))] == []  # no temporary left


def test_bulk_moves_are_the_c_cores(fs, tmp_path):
    path = str(tmp_path / "shard")
    h = fs.create_exclusive(path)
    wrote = fs.write_shard(h, 0, 3 << 20, 7, fsync=True, path=path)
    fs.close(h)
    assert wrote["bytes"] == 3 << 20 and wrote["syncs"] == 1
    h = fs.open_read(path)
    got = fs.read_shard(h, 0, 3 << 20, 7, path=path)
    assert got["bytes"] == 3 << 20 and got["verified"] > 0
    fs.close(h)
    copy = str(tmp_path / "copy")
    src, dst = fs.open_read(path), fs.create_exclusive(copy)
    copier = fs.copier(1 << 20)
    copier.copy(src, dst, 0, 3 << 20, path, copy)
    fs.close(src)
    fs.close(dst)
    assert _bytes(copy) == _bytes(path)
    data = str(tmp_path / "payload")
    h = fs.create_exclusive(data)
    fs.write_random(h, 0, 1000, 5, path=data)
    snapshot = np.frombuffer(_bytes(data), dtype=np.uint8)
    fs.write_buffer(h, 1000, snapshot)
    fs.close(h)
    expect = bytearray(1000)
    _core.fill_random(expect, 5)
    assert _bytes(data) == bytes(expect) * 2


def test_the_operations_added_for_their_callers(fs, tmp_path):
    path = str(tmp_path / "f")
    fs.put(path, b"0123456789")
    with pytest.raises(FileNotFoundError, match=r"open .*none: No such file"):
        fs.open_as_engine(str(tmp_path / "none"))  # the engine's words, as a probe reports it
    h = fs.open_as_engine(path)
    assert fs.same_file(h, path)
    with fs.file_object(h, "rb") as fp:  # a descriptor of its own: the handle stays open
        assert fp.read(4) == b"0123"
    assert fs.read_at(h, 2, 8) == b"89"
    fs.close(h)
    os.replace(path, path + ".old")
    fs.put(path, b"other")
    h = fs.open_read(path + ".old")
    assert not fs.same_file(h, path)  # another file under the name since
    fs.close(h)
    with fs.open_buffered(path) as fp:
        assert fp.read() == b"other"
    (tmp_path / "sub").mkdir()
    kinds = {e.name: e.kind for e in fs.list_kinds(str(tmp_path))}
    assert kinds == {"f": "file", "f.old": "file", "sub": "folder"}
    assert fs.block_size(path) > 0
    st = os.statvfs(tmp_path)
    assert fs.allocation_unit(str(tmp_path)) == (st.f_frsize or 4096)
    assert 0 < fs.free_bytes(str(tmp_path)) <= st.f_blocks * st.f_frsize
    fs.drop_cached_file(path)
    with pytest.raises(IsADirectoryError, match="is a directory, not a regular file"):
        fs.drop_cached_file(str(tmp_path / "sub"))


def test_walk_is_os_walk_top_down_with_links_listed_not_walked(tmp_path):
    from dlio_mpi.storage import walk

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x").write_bytes(b"")
    os.symlink(tmp_path / "a", tmp_path / "link")
    seen = [(os.path.relpath(top, tmp_path), sorted(folders), sorted(others), linked)
            for top, folders, others, linked in walk(str(tmp_path))]
    assert seen == [(".", ["a", "link"], [], {"link"}), ("a", ["b"], ["x"], set()),
                    ("a/b", [], [], set())]
