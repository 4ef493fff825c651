"""Which checkpoints in checkpoint.checkpoint_folder are dlio-mpi's: a manifest beside them
(dlio_mpi_checkpoints.json, a name no checkpoint has) lists each checkpoint folder a run made,
its files with their size and modification time, and whether it completed, and the tags of
the runs' temporaries.

Before a run writes checkpoint <id>, a folder <id> already there is removed only when the
manifest lists it and every file in it is as listed (or is a temporary of ours); anything
else there is refused, naming it, before any I/O: nothing the user owns is written, renamed
or deleted. A checkpoint is listed as complete only after every rank's files are in under
their final names, so one a fault interrupted never looks complete. Rank 0 reads and writes
the manifest; the ranks only write their files."""

from __future__ import annotations

import errno
import json
import os
import time
from typing import TYPE_CHECKING

from ..errors import UserError
from ..storage import Entry, Storage, read_own_json, storage_for
from ..storage.ownership import is_temporary_of, temporary_name

if TYPE_CHECKING:
    from .schedule import Schedule

MANIFEST = "dlio_mpi_checkpoints.json"


class CheckpointFolder:
    """The manifest of one checkpoint folder, for this run (whose temporaries carry `tag`)."""

    def __init__(self, root: str, tag: str, key: str = "checkpoint.checkpoint_folder") -> None:
        self.root, self.tag, self.fs = root, tag, storage_for(root)
        self.key = key  # the configuration key of the folder, which its messages name
        self.body = self._read() or {"tool": "dlio-mpi", "checkpoints": {}, "temporaries": []}

    def _read(self) -> dict | None:
        path = os.path.join(self.root, MANIFEST)
        return read_own_json(path, f"{self.key}: {path} is not dlio-mpi's; choose another "
                                   "folder")

    def _present(self, checkpoint_ids: list[str]) -> list[str]:
        return [cid for cid in checkpoint_ids if self.fs.exists(os.path.join(self.root, cid))]

    def check_clear(self, checkpoint_ids: list[str]) -> None:
        """Refuse, naming it, anything in the place of `checkpoint_ids` that clear() would
        not remove."""
        for cid in self._present(checkpoint_ids):
            self._check_ours(cid)

    def listed_bytes(self, checkpoint_ids: list[str]) -> int:
        """Bytes of the listed files of those of `checkpoint_ids` that are there."""
        return sum(size for cid in self._present(checkpoint_ids)
                   for size, _ in self.body["checkpoints"].get(cid, {}).get("files",
                                                                            {}).values())

    def clear(self, checkpoint_ids: list[str]) -> list[str]:
        """Make way for the checkpoints `checkpoint_ids`: remove those of an earlier run of
        ours (unchanged since), refuse anything else in their place. Returns the removed."""
        present = self._present(checkpoint_ids)
        self.check_clear(present)  # all looked at before anything is removed
        removed = []
        for cid in present:
            _remove_checkpoint(self.fs, os.path.join(self.root, cid))
            del self.body["checkpoints"][cid]
            removed.append(cid)
        if removed:
            self._write()
        return removed

    def _check_ours(self, cid: str) -> None:
        """Refuse, naming it, anything in the way of checkpoint `cid` that is not ours."""
        folder = os.path.join(self.root, cid)
        listed, entry = self.body["checkpoints"].get(cid), self.fs.entry(folder)
        if listed is None or entry is None or entry.kind != "folder":  # a link is refused
            raise UserError(f"{self.key}: {folder} is not a checkpoint of an earlier dlio-mpi "
                            "run; remove it or choose another folder")
        files, tags = listed.get("files", {}), self.body.get("temporaries", [])
        strangers = [os.path.join(folder, e.name) for e in self.fs.list(folder)
                     if not (is_temporary_of(e.name, tags) or _unchanged(e, files.get(e.name))
                             or _renamed_in(e, listed))]
        if strangers:
            raise UserError(f"{self.key}: {strangers[0]} was not written by an earlier dlio-mpi "
                            "run, or changed since; dlio-mpi replaces only its own "
                            "checkpoints: remove it or choose another folder")

    def begin(self, checkpoint_id: str, names: list[str]) -> None:
        """Claim a new checkpoint folder (refused if it appeared meanwhile): listed as
        incomplete, with this run's tag, the names its files will have and when it began,
        before any rank writes into it."""
        self.fs.make_folder(os.path.join(self.root, checkpoint_id))
        self.body["checkpoints"][checkpoint_id] = {"complete": False, "files": {},
                                                   "names": names, "began_ns": time.time_ns()}
        if self.tag not in self.body["temporaries"]:
            self.body["temporaries"].append(self.tag)
        self._write()

    def complete(self, checkpoint_id: str, names: list[str]) -> None:
        """Every rank's files `names` are in: list them and mark the checkpoint complete."""
        folder = os.path.join(self.root, checkpoint_id)
        files = {}
        for name in names:
            path = os.path.join(folder, name)
            entry = self.fs.entry(path)
            if entry is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            files[name] = [entry.size, entry.mtime_ns]
        self.body["checkpoints"][checkpoint_id] = {"complete": True, "files": files}
        self._write()

    def abandon(self, checkpoint_id: str) -> None:
        """A save that failed (out of room, a rank's error): its folder, begun by this run,
        removed with what its ranks wrote (its files and this run's temporaries), and its
        listing dropped; a file of anyone else's there keeps the folder, listed incomplete."""
        folder = os.path.join(self.root, checkpoint_id)
        listed = self.body["checkpoints"].get(checkpoint_id, {})
        try:
            ours = [os.path.join(folder, e.name) for e in self.fs.list(folder)
                    if is_temporary_of(e.name, [self.tag]) or _renamed_in(e, listed)
                    or _unchanged(e, listed.get("files", {}).get(e.name))]
        except OSError:
            ours = []
        self.fs.remove_quietly(ours)
        if not self.fs.remove_folder(folder) and self.fs.exists(folder):
            return  # something else is there: the listing (incomplete) stays
        del self.body["checkpoints"][checkpoint_id]
        try:
            self._write()
        except OSError:
            pass  # no room even for the manifest: it lists a checkpoint that is gone

    def _write(self) -> None:
        from .. import __version__

        self.body |= {"version": __version__, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        path = os.path.join(self.root, MANIFEST)
        tmp = temporary_name(path, self.tag)
        # put: out of room part way, no half manifest is left
        self.fs.put(tmp, json.dumps(self.body, indent=1).encode())
        self.fs.replace_own(tmp, path)  # over our own manifest (_read refused any other)


def _remove_checkpoint(fs: Storage, folder: str) -> None:
    """Remove a checkpoint folder of ours, which check_clear found holds only our files."""
    fs.remove_quietly([os.path.join(folder, e.name) for e in fs.list(folder)])
    if not fs.remove_folder(folder):
        raise OSError(errno.ENOTEMPTY, f"{folder}: something appeared in it while dlio-mpi "
                      "was removing it; it was left there", folder)


def _renamed_in(entry: Entry, listed: dict) -> bool:
    """Whether `entry`, in a checkpoint listed incomplete, is one of its files renamed into
    place whole before the save failed or was killed: named as the checkpoint's files are,
    a regular file written since the checkpoint began (file times lag the clock by a tick)."""
    began = listed.get("began_ns")
    if listed.get("complete") or not isinstance(began, int) or \
            entry.name not in listed.get("names", []) or entry.kind != "file":
        return False
    return entry.mtime_ns >= began - 10**9


def _unchanged(entry: Entry, recorded: list[int] | None) -> bool:
    return recorded is not None and entry.kind == "file" and \
        [entry.size, entry.mtime_ns] == recorded


def in_the_way_of(root: str, schedule: Schedule) -> list[str]:
    """The entries of the checkpoint folder named as a checkpoint the run saves."""
    try:
        return sorted(e.name for e in storage_for(root).list(root) if schedule.saved(e.name))
    except FileNotFoundError:
        return []


def check_checkpoint_space(folder: CheckpointFolder, saves: int, replaced: list[str],
                           checkpoint_bytes: int) -> None:
    """Refuse up front when the checkpoint folder's file system has less room than the run's
    `saves` checkpoints take (all kept, or as many as it holds at once), less those of ours
    they replace."""
    need = saves * checkpoint_bytes - folder.listed_bytes(replaced)
    from ..storage.filesystems import nearest_existing

    where = nearest_existing(folder.root)
    try:
        free = folder.fs.free_bytes(where)
    except OSError:
        return  # making the folder says why
    if free is not None and need > free:
        raise UserError(f"{folder.key}: the run's {saves:,} "
                        f"checkpoint(s) take {need / 2**30:,.2f} GiB ({need:,} bytes), but the "
                        f"file system of {folder.root} has {free / 2**30:,.2f} GiB free (at "
                        f"{where}); free space, choose another folder, or write fewer or "
                        "smaller checkpoints")
