"""The output folder: used only when it is new, empty, or holds nothing but an earlier run's
results of ours, which are then removed before this run starts (so that a run killed mid-way
never leaves the previous run's summary.json looking like its own).

A results manifest (`dlio_mpi_results.json`) lists every file a run wrote there, with its size
and modification time: a later run recognises them as ours and unchanged. Anything else in
the folder (a user's config.yaml, someone else's summary.json, a file ours but edited since)
makes the run refuse before any I/O, naming it. Files are written under exclusive temporaries
and renamed into place, so a result is whole or absent."""

from __future__ import annotations

import os
import re
import threading
import time

from ..errors import UserError
from ..storage import Storage, read_own_json, storage_for, walk
from ..storage.ownership import LOCK_NAME, is_temporary_of, new_tag, temporary_name
from . import jsonfile
from .names import ACCESS_LOG, REPORT, RESULTS_MANIFEST, WRITTEN_TEXT, is_written_name
from .report_folder import own_report_files, size_and_mtime


class OutputFolder:
    """Rank 0's handle on `output.folder`."""

    def __init__(self, folder: str, log_file: str, workload: str | None = None,
                 shared: bool = False, record: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.fs = storage_for(folder)
        # shared: a run folder another tool writes into too (Hydra's, given by
        # ++hydra.run.dir: mlpstorage's collector-staging/, its metadata), whose entries
        # not ours are left in place, but for names this run writes (`record`: Hydra's record)
        self.shared, self.record_names = shared, set(record)
        self.log_name = log_file
        self.workload = os.path.realpath(workload) if workload else None
        self.files: dict[str, list[int]] = {}
        self.tag = new_tag()
        self._log = None  # the log, a file object of its own on _log_handle
        self._log_handle = None
        self._lock = None  # the folder's claim (Storage.claim)
        self._held: list = []  # other folders' claims this run holds till it ends
        self._log_lock = threading.Lock()  # interval lines come from a thread
        self._own_dirs: set[str] = set()  # subfolders of an earlier run's listed files

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    # --------------------------------------------------------------------------- claiming
    def claim(self, access_log: bool) -> None:
        """Check the folder holds nothing but our earlier results, remove those, and start
        this run's manifest and log; UserError naming the first foreign file otherwise."""
        if os.path.basename(self.log_name) != self.log_name or self.log_name in (
                "", ".", "..") or is_written_name(self.log_name):
            raise UserError(f"output.log_file: {self.log_name!r} must be a file name inside "
                            f"output.folder (no '/'), other than {WRITTEN_TEXT}")
        try:
            self.fs.make_folders(self.folder)
            # one run at a time: a live run's files are not an earlier run's results
            self._lock = self.fs.claim(self.folder, "run")
            self._lock.acquire()
            previous = self._previous_results()
            self._remove(previous)
            if access_log:
                self.fs.make_folders(self.path(ACCESS_LOG))
            self.files = {}
            self._write_manifest("running")
            self._log_handle = self.fs.create_exclusive(self.path(self.log_name))
            self._log = self.fs.file_object(self._log_handle, "w")
        except OSError as exc:
            self.release()
            raise UserError(f"output.folder: cannot write results to {self.folder}: "
                            f"{exc.strerror or exc}") from exc
        except UserError:
            self.release()
            raise

    def write_started(self, texts: dict[str, str]) -> None:
        """At the start of the run, write these files (relative paths, their subfolders
        created) and list them in the manifest at once, so that a run that dies still leaves
        them recognisably ours (Hydra's record of the job: config/hydra.py)."""
        for name, text in texts.items():
            self.fs.make_folders(os.path.dirname(self.path(name)) or self.folder)
            self.write(name, lambda fp, text=text: fp.write(text))
            self.record(name)
        self._write_manifest("running")

    def hold(self, lock) -> None:
        """Keep another folder's lock (the checkpoint folder's: Storage.claim's) until the
        run ends."""
        self._held.append(lock)

    def release(self) -> None:
        """Let the next run have the folder, and the folders whose locks it holds."""
        for lock in self._held:
            lock.release()
        self._held = []
        if self._lock is not None:
            self._lock.release()

    def _previous_results(self) -> list[str]:
        """The entries of the folder (relative paths), all of them earlier results of ours."""
        manifest = self._read_manifest() or {}
        listed = manifest.get("files", {})
        # subfolders holding files a run listed (Hydra's record) are ours to walk and remove
        self._own_dirs = {os.path.dirname(rel) for rel in listed if os.path.dirname(rel)}
        tags = manifest.get("temporaries", [])
        # a run that did not finish: its growing files (the log) and access logs are ours
        unfinished = manifest.get("state") == "running"
        growing = set(manifest.get("growing", [])) if unfinished else set()
        entries = []
        for dirpath, dirnames, filenames, linked in walk(self.folder):
            rel_dir = os.path.relpath(dirpath, self.folder)
            if rel_dir == "." and REPORT in dirnames:
                # `dlio-mpi report`'s plots of the results replaced: removed with them
                drawn = own_report_files(self.path(REPORT))
                if drawn is not None:
                    dirnames.remove(REPORT)
                    entries += [os.path.join(REPORT, name) for name in drawn]
            for name in sorted(filenames) + [d for d in dirnames if d in linked]:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if rel in (RESULTS_MANIFEST, LOCK_NAME):
                    continue
                full = os.path.join(dirpath, name)
                if os.path.realpath(full) == self.workload:
                    raise UserError(
                        f"output.folder: {self.folder} holds {rel}, the workload file given, "
                        "which dlio-mpi never replaces: choose another output.folder")
                ours = (rel in growing or is_temporary_of(name, tags)
                        or (unfinished and is_access_log(rel))
                        or _unchanged(self.fs, full, listed.get(rel)))
                if not ours and self._theirs(rel):
                    continue  # another tool's, in a shared run folder: left as it is
                if not ours:
                    what = ("a result of an earlier dlio-mpi run, changed since"
                            if rel in listed else "not a result of an earlier dlio-mpi run")
                    raise UserError(
                        f"output.folder: {self.folder} holds {rel}, {what}; dlio-mpi replaces "
                        "only its own results: choose a new or empty output.folder")
                entries.append(rel)
            for name in list(dirnames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if rel != ACCESS_LOG and rel not in self._own_dirs:
                    if not self._theirs(rel):
                        raise UserError(self._folder_in_the_way(rel))
                    dirnames.remove(name)  # another tool's folder: not walked, not touched
        return entries

    def _theirs(self, rel: str) -> bool:
        """In a shared run folder: whether the entry `rel` (not ours) is another tool's to
        leave in place, not in the way of a name this run writes (its results, its log,
        Hydra's record and its folder)."""
        top = rel.split(os.sep)[0]
        return self.shared and not (is_written_name(top) or top == self.log_name or any(
            name == rel or name.startswith(rel + os.sep) or rel.startswith(name + os.sep)
            for name in self.record_names))

    def _folder_in_the_way(self, rel: str) -> str:
        """Why a folder inside output.folder keeps the run from taking it."""
        if rel == REPORT:
            what = "with files not of an unchanged dlio-mpi report"
        elif self.fs.exists(os.path.join(self.path(rel), RESULTS_MANIFEST)):
            # e.g. output/demo, the demo's results, under the default output.folder `output`
            what = ("the results of another dlio-mpi run, which a run never removes (it "
                    "replaces only its own folder's results)")
        else:
            what = "which is not part of an earlier run's results"
        return (f"output.folder: {self.folder} holds the folder {rel}, {what}: choose a new "
                f"or empty output.folder (e.g. output.folder={os.path.join(self.folder, 'run1')})")

    def _read_manifest(self) -> dict | None:
        return read_own_json(self.path(RESULTS_MANIFEST),
                             f"output.folder: {self.path(RESULTS_MANIFEST)} is not dlio-mpi's; "
                             "choose a new or empty output.folder")

    def _remove(self, entries: list[str]) -> None:
        self.fs.remove_quietly(self.path(rel) for rel in entries)
        for folder in (ACCESS_LOG, REPORT, *sorted(self._own_dirs, reverse=True)):
            # left when absent, or not empty (access_log is then recreated below or reported
            # next time)
            self.fs.remove_folder(self.path(folder))

    # --------------------------------------------------------------------------- writing
    def write(self, name: str, fill, binary: bool = False) -> None:
        """Write one result file whole (`fill(file)` into a temporary, then a rename); any
        rank may write, rank 0 lists it (`record`)."""
        final = self.path(name)
        tmp = temporary_name(final, self.tag)
        try:
            handle = self.fs.create_exclusive(tmp)
            try:
                with self.fs.file_object(handle, "wb" if binary else "w") as fp:
                    fill(fp)
            finally:
                self.fs.close(handle)
            self.fs.rename_noreplace(tmp, final)
        finally:
            self.fs.remove_quietly([tmp])

    def record(self, name: str) -> None:
        """List a file of ours under the folder (written by any rank)."""
        self.files[name] = size_and_mtime(self.fs, self.path(name))

    def log(self, text: str) -> None:
        with self._log_lock:
            if self._log is not None:
                self._log.write(text + "\n")
                self._log.flush()

    def finish(self, state: str) -> None:
        """Close the log and write the manifest with the final state ('complete',
        'incomplete')."""
        try:
            if self._log is not None:
                try:
                    self._log.close()
                finally:
                    self.fs.close(self._log_handle)
                self._log = None
                self.record(self.log_name)
            self._write_manifest(state)
        finally:
            self.release()

    def _write_manifest(self, state: str) -> None:
        from .. import __version__

        body = {"tool": "dlio-mpi", "version": __version__, "state": state,
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "files": self.files,
                "temporaries": [self.tag], "growing": [self.log_name]}
        tmp = temporary_name(self.path(RESULTS_MANIFEST), self.tag)
        # a file a line: access logs are one an epoch
        self.fs.put(tmp, (jsonfile.dumps(body, depth=2) + "\n").encode())
        self.fs.replace_own(tmp, self.path(RESULTS_MANIFEST))


def access_log_name(phase: str, epoch: int, rank: int) -> str:
    prefix = "" if phase == "train" else f"{phase}_"
    return os.path.join(ACCESS_LOG, f"{prefix}epoch{epoch}_rank{rank}.npy")


_ACCESS_LOG_NAME = re.compile(r"(eval_)?epoch\d+_rank\d+\.npy")


def is_access_log(rel: str) -> bool:
    folder, _, name = rel.rpartition(os.sep)
    return folder == ACCESS_LOG and _ACCESS_LOG_NAME.fullmatch(name) is not None


def _unchanged(fs: Storage, full: str, recorded: list[int] | None) -> bool:
    """Whether a file is as the manifest recorded it (size, modification time)."""
    if recorded is None:
        return False
    return size_and_mtime(fs, full) == recorded

