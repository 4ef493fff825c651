"""Which files dlio-mpi may write, rename over or delete, as it was reached before the storage
seam: its names and operations delegate to storage/ (for callers not moved onto it yet)."""

from __future__ import annotations

from .storage import missing_folders, read_own_json, remove_empty_folders, storage_for
from .storage.ownership import LOCK_NAME, TMP_MARK, is_temporary_of, new_tag, temporary_name

__all__ = ["LOCK_NAME", "TMP_MARK", "FolderLock", "create_exclusive", "is_temporary_of",
           "missing_folders", "new_tag", "read_own_json", "read_regular",
           "remove_empty_folders", "remove_quietly", "rename_noreplace", "temporary_name"]


def create_exclusive(path: str, mode: int = 0o644) -> int:
    return storage_for(path).create_exclusive(path, mode=mode)


def rename_noreplace(src: str, dst: str) -> None:
    storage_for(dst).rename_noreplace(src, dst)


def read_regular(path: str, limit: int = 1 << 24) -> bytes | None:
    return storage_for(path).read_small(path, limit)


def remove_quietly(paths) -> None:
    for path in paths:
        storage_for(path).remove_quietly([path])


def FolderLock(folder: str, what: str):  # noqa: N802 - the class it stood for
    return storage_for(folder).claim(folder, what)
