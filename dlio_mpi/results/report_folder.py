"""The report folder (OUT/report): written only when it is new or holds nothing but an
earlier report of ours, listed with sizes and modification times in its manifest; those
files are replaced, anything else there makes the report refuse, naming it. Each file is
written under an exclusive temporary and renamed into place without replacing."""

from __future__ import annotations

import errno
import json
import os

from ..errors import UserError
from ..storage import Storage, read_own_json, storage_for
from ..storage.ownership import new_tag, temporary_name
from .names import REPORT_MANIFEST


def size_and_mtime(fs: Storage, path: str) -> list[int]:
    """[size, modification time in ns] of `path` (a link not followed), as manifests record
    them; FileNotFoundError naming it when nothing is there."""
    entry = fs.entry(path)
    if entry is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return [entry.size, entry.mtime_ns]


def own_report_files(folder: str) -> list[str] | None:
    """The files of an earlier report of ours in `folder` (its manifest last), or None when
    the folder holds anything else: what a new run may remove with the results drawn."""
    manifest_path = os.path.join(folder, REPORT_MANIFEST)
    try:
        earlier = read_own_json(manifest_path, "")
        found = storage_for(folder).list(folder)
    except (UserError, OSError):
        return None
    listed = (earlier or {}).get("files", {})
    for entry in found:
        if entry.name != REPORT_MANIFEST and \
                listed.get(entry.name) != [entry.size, entry.mtime_ns]:
            return None
    entries = [e.name for e in found]
    ours = [e for e in entries if e != REPORT_MANIFEST]
    return ours + ([REPORT_MANIFEST] if REPORT_MANIFEST in entries else [])


def write_report_folder(folder: str, files: dict[str, bytes]) -> list[str]:
    """Replace our earlier report in `folder` by `files` (name -> content); their paths."""
    fs = storage_for(folder)
    try:
        fs.make_folders(folder)
    except OSError as exc:
        raise UserError(f"report: cannot make {folder}: {exc.strerror or exc}") from exc
    manifest_path = os.path.join(folder, REPORT_MANIFEST)
    earlier = read_own_json(manifest_path, f"report: {manifest_path} is not dlio-mpi's; "
                            "move it away or give another --output") or {}
    listed = earlier.get("files", {})
    for found in sorted(fs.list(folder), key=lambda e: e.name):
        entry = found.name
        if entry == REPORT_MANIFEST:
            continue
        if listed.get(entry) != [found.size, found.mtime_ns]:
            raise UserError(f"report: {folder} holds {entry}, not an unchanged file of an "
                            "earlier dlio-mpi report; dlio-mpi replaces only its own files: "
                            "move it away or give another --output")
    tag = new_tag()
    recorded: dict[str, list[int]] = {}
    written: list[str] = []
    doing, final = "write", manifest_path
    try:
        for entry in listed:
            doing, final = "remove", os.path.join(folder, entry)
            fs.remove_quietly([final])
        for name, content in files.items():
            doing, final = "write", os.path.join(folder, name)
            tmp = temporary_name(final, tag)
            try:
                fs.put(tmp, content)
                fs.rename_noreplace(tmp, final)
            finally:
                fs.remove_quietly([tmp])
            recorded[name] = size_and_mtime(fs, final)
            written.append(final)
        doing, final = "write", manifest_path
        _write_manifest(fs, manifest_path, tag, recorded)
    except OSError as exc:  # a full disk, a read-only one: no part of this report is kept
        _undo(fs, manifest_path, tag, written)
        raise UserError(f"report: cannot {doing} {final}: {exc.strerror or exc}; the report in "
                        f"{folder} was removed, not left half written: free some room (or "
                        "give another --output) and run dlio-mpi report again") from exc
    except BaseException:
        # the files written so far are listed, so that a next report may replace them
        try:
            _write_manifest(fs, manifest_path, tag, recorded)
        except OSError:
            _undo(fs, manifest_path, tag, written)
        raise
    return written


def _write_manifest(fs: Storage, path: str, tag: str, recorded: dict[str, list[int]]) -> None:
    tmp = temporary_name(path, tag)
    try:
        fs.put(tmp, json.dumps({"tool": "dlio-mpi", "files": recorded}, indent=1).encode())
        fs.replace_own(tmp, path)
    finally:
        fs.remove_quietly([tmp])


def _undo(fs: Storage, manifest_path: str, tag: str, written: list[str]) -> None:
    """Remove this report's files and the manifest (whose files are gone already), so that the
    folder holds nothing of a report rather than files no manifest lists."""
    for path in [*written, manifest_path, temporary_name(manifest_path, tag)]:
        try:
            fs.remove(path)
        except OSError:
            pass
