"""Every I/O the emulator asks of storage, behind one seam (seam.py; POSIX in posix.py); which
files are ours; file system type, mount and Lustre striping; node-local folders.

storage_for picks the implementation serving a path; ownership.py names our temporaries and
locks; filesystems.py and node_local.py hold the file-system facts."""

from __future__ import annotations

import os
from collections.abc import Iterator

from ..errors import UserError
from .posix import PosixStorage
from .seam import Entry, Handle, Storage

__all__ = ["Entry", "Handle", "Storage", "implementations", "missing_folders",
           "read_own_json", "remove_empty_folders", "storage_for", "walk"]

_POSIX = PosixStorage()
_BY_SCHEME: dict[str, Storage] = {"": _POSIX}  # an object store adds its "<scheme>" here


def implementations() -> dict[str, Storage]:
    """The registry: each implementation under the scheme of the paths it serves."""
    return dict(_BY_SCHEME)


def storage_for(path: str) -> Storage:
    """The implementation serving `path`: its "<scheme>://" prefix, none for POSIX."""
    scheme, sep, _ = path.partition("://")
    if not sep or "/" in scheme:
        return _POSIX
    try:
        return _BY_SCHEME[scheme]
    except KeyError:
        raise UserError(f"{path}: no storage implements {scheme}:// yet; expected a path "
                        f"(or one of: {', '.join(s for s in _BY_SCHEME if s) or 'none'})") \
            from None


def read_own_json(path: str, refusal: str) -> dict | None:
    """A JSON record dlio-mpi wrote (its "tool" is "dlio-mpi"): None when there is none;
    UserError(refusal) when the file there is anything else."""
    import json

    try:
        raw = storage_for(path).read_small(path, 1 << 26)
        if raw is None:
            return None
        body = json.loads(raw)
    except (OSError, ValueError):
        body = None
    if not isinstance(body, dict) or body.get("tool") != "dlio-mpi":
        raise UserError(refusal)
    return body


def missing_folders(path: str) -> list[str]:
    """The folders make_folders(path) would create, deepest first (to remove them again)."""
    fs, missing = storage_for(path), []
    path = os.path.abspath(path) if not fs.scheme else path
    while path and not fs.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_empty_folders(folders) -> None:
    """Remove each of `folders` in order, leaving any that holds something."""
    for folder in folders:
        storage_for(folder).remove_folder(folder)


# ---- added for data (the results folder's and the report's walks)
def walk(top: str) -> Iterator[tuple[str, list[str], list[str], set[str]]]:
    """os.walk(top) on its storage, top down: (folder, its subfolders' names (prune them in
    place to walk fewer), its other names, the subfolders that are links (listed, not
    walked)); a folder that cannot be listed yields nothing."""
    fs = storage_for(top)
    try:
        entries = fs.list_kinds(top)
    except OSError:
        return
    folders, others, linked = [], [], set()
    for entry in entries:
        if entry.kind == "folder" or (entry.kind == "link"
                                      and fs.is_folder(os.path.join(top, entry.name))):
            folders.append(entry.name)
            if entry.kind == "link":
                linked.add(entry.name)
        else:
            others.append(entry.name)
    yield top, folders, others, linked
    for name in folders:
        if name not in linked:
            yield from walk(os.path.join(top, name))
