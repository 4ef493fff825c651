"""The report folder (OUT/report): written only when it is new or holds nothing but an
earlier report of ours, listed with sizes and modification times in its manifest; those
files are replaced, anything else there makes the report refuse, naming it. Each file is
written under an exclusive temporary and renamed into place without replacing."""

from __future__ import annotations

import json
import os

from ..errors import UserError
from ..ownership import (
    create_exclusive,
    new_tag,
    read_own_json,
    remove_quietly,
    rename_noreplace,
    temporary_name,
)
from .names import REPORT_MANIFEST


def own_report_files(folder: str) -> list[str] | None:
    """The files of an earlier report of ours in `folder` (its manifest last), or None when
    the folder holds anything else: what a new run may remove with the results drawn."""
    manifest_path = os.path.join(folder, REPORT_MANIFEST)
    try:
        earlier = read_own_json(manifest_path, "")
        entries = os.listdir(folder)
    except (UserError, OSError):
        return None
    listed = (earlier or {}).get("files", {})
    for entry in entries:
        if entry == REPORT_MANIFEST:
            continue
        st = os.lstat(os.path.join(folder, entry))
        if listed.get(entry) != [st.st_size, st.st_mtime_ns]:
            return None
    ours = [e for e in entries if e != REPORT_MANIFEST]
    return ours + ([REPORT_MANIFEST] if REPORT_MANIFEST in entries else [])


def write_report_folder(folder: str, files: dict[str, bytes]) -> list[str]:
    """Replace our earlier report in `folder` by `files` (name -> content); their paths."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UserError(f"report: cannot make {folder}: {exc.strerror or exc}") from exc
    manifest_path = os.path.join(folder, REPORT_MANIFEST)
    earlier = read_own_json(manifest_path, f"report: {manifest_path} is not dlio-mpi's; "
                            "move it away or give another --output") or {}
    listed = earlier.get("files", {})
    for entry in sorted(os.listdir(folder)):
        full = os.path.join(folder, entry)
        if entry == REPORT_MANIFEST:
            continue
        st = os.lstat(full)
        if listed.get(entry) != [st.st_size, st.st_mtime_ns]:
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
            remove_quietly([final])
        for name, content in files.items():
            doing, final = "write", os.path.join(folder, name)
            tmp = temporary_name(final, tag)
            try:
                with os.fdopen(create_exclusive(tmp), "wb") as fp:
                    fp.write(content)
                rename_noreplace(tmp, final)
            finally:
                remove_quietly([tmp])
            st = os.lstat(final)
            recorded[name] = [st.st_size, st.st_mtime_ns]
            written.append(final)
        doing, final = "write", manifest_path
        _write_manifest(manifest_path, tag, recorded)
    except OSError as exc:  # a full disk, a read-only one: no part of this report is kept
        _undo(manifest_path, tag, written)
        raise UserError(f"report: cannot {doing} {final}: {exc.strerror or exc}; the report in "
                        f"{folder} was removed, not left half written: free some room (or "
                        "give another --output) and run dlio-mpi report again") from exc
    except BaseException:
        # the files written so far are listed, so that a next report may replace them
        try:
            _write_manifest(manifest_path, tag, recorded)
        except OSError:
            _undo(manifest_path, tag, written)
        raise
    return written


def _write_manifest(path: str, tag: str, recorded: dict[str, list[int]]) -> None:
    tmp = temporary_name(path, tag)
    try:
        with os.fdopen(create_exclusive(tmp), "w") as fp:
            json.dump({"tool": "dlio-mpi", "files": recorded}, fp, indent=1)
        os.replace(tmp, path)
    finally:
        remove_quietly([tmp])


def _undo(manifest_path: str, tag: str, written: list[str]) -> None:
    """Remove this report's files and the manifest (whose files are gone already), so that the
    folder holds nothing of a report rather than files no manifest lists."""
    for path in [*written, manifest_path, temporary_name(manifest_path, tag)]:
        try:
            os.unlink(path)
        except OSError:
            pass
