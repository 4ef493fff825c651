"""Parallel data generation: files dealt round-robin across ranks, each written by the C core
under a temporary name and renamed when complete; a rerun skips complete files. A dataset of
fewer files than ranks (one or a few shared files of many samples) is written by all ranks
together instead, file after file, through MPI-IO (collective_generation.py).

Sizes come from dataset.sample_shapes (seeded, independent of the rank count) and payload
bytes from a per-file seed, so the same configuration always produces the same dataset."""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass

import numpy as np

from .. import _core, progress
from ..errors import JobError, Stopped, UserError, agreed_stop, check_all, on_root
from ..formats.base import StagedWrites
from ..storage import Storage, storage_for
from ..storage.filesystems import apply_striping, nearest_existing
from ..storage.ownership import LOCK_NAME, is_temporary_of, new_tag
from ..time_split import split_of
from .catalog import spot_check_sizes
from .collective_generation import collective_format, write_file_collectively
from .dataset import SPLITS, DatasetSplit, LayoutTable, SizedLayouts
from .manifest import differing_params, generation_params, read_manifest, write_manifest
from .recorded_sizes import (
    UNKNOWN,
    read_sizes,
    size_column,
    sizes_name,
    unknown_records,
    write_sizes,
)


@dataclass(frozen=True)
class GenerationResult:
    files_written: int
    files_skipped: int
    bytes_written: int
    seconds: float  # slowest rank
    striping: dict | None = None  # what storage.lustre did (filesystems.apply_striping)
    collective: dict | None = None  # files written by all ranks through MPI-IO: how
    # the slowest rank's time in the storage's calls and the emulator's (checkpoint.results
    # split_of); None where files were written collectively (MPI-IO's calls are not split)
    time_split: dict | None = None

    @property
    def mib_per_second(self) -> float:
        return self.bytes_written / 2**20 / self.seconds if self.seconds > 0 else 0.0


def file_seed(split: str, index: int) -> int:
    """Seed of one file's payload bytes: a function of its identity only."""
    return (SPLITS.index(split) + 1) << 40 | index


STAGE_FILES = 1024           # files completed together (one syncfs, then their renames)
# ... or bytes: a stop completes the files staged, so its syncfs flushes up to this much a
# rank (with 1 GiB, a SIGTERM took 0.9 s to several seconds to end the job; 64 MiB stages
# generate 1 MiB files as fast)
STAGE_BYTES = 64 << 20


def _my_files(splits: dict[str, DatasetSplit], rank: int, size: int
              ) -> list[tuple[str, int]]:
    """(split, index) of the files this rank writes: every size-th of train then valid."""
    train = splits["train"].num_files
    work = range(rank, train + splits["valid"].num_files, size)
    return [("train", g) if g < train else ("valid", g - train) for g in work]


def writes_collectively(splits: dict[str, DatasetSplit], ranks: int) -> bool:
    """Whether generation writes every file with all ranks: fewer files than ranks, in a
    format that can be written in parts."""
    files = sum(s.num_files for s in splits.values())
    return 0 < files < ranks and all(
        collective_format(s) for s in splits.values() if s.num_files)


def generate(comm, cfg, splits: dict[str, DatasetSplit],
             layouts: dict[str, LayoutTable] | None = None,
             trust_complete: bool = True) -> GenerationResult:
    """Generate the dataset of `cfg` collectively; returns totals over all ranks. `layouts`
    are the splits' expected layouts when the caller has them already. trust_complete: a
    complete manifest is trusted after a few spot checks (else every file is looked at and
    what is missing written: `dlio-mpi generate` repairs a dataset that lost files). Rank 0
    holds the data folder's lock throughout; files are only ever created, never replaced
    (storage/ownership.py)."""
    root = splits["train"].root
    params = generation_params(cfg)
    lock = storage_for(root).claim(root, "generation")
    if layouts is None:
        layouts = {name: split.expected_layouts() for name, split in splits.items()}
    try:
        return _generate(comm, splits, layouts, root, params, lock, cfg.storage.lustre,
                         trust_complete, dict(cfg.reader.mpiio_hints))
    finally:
        lock.release()


def _generate(comm, splits, layouts, root, params, lock, lustre,
              trust_complete: bool, hints: dict[str, str]) -> GenerationResult:
    return _Generation(comm, splits, layouts, root, params, lock, lustre, trust_complete,
                       hints).run()


class _Generation:
    """One generation of the dataset in `root` (see generate()): rank 0 prepares the folder,
    every rank surveys its files and writes those missing, rank 0 records what was made."""

    def __init__(self, comm, splits, layouts, root, params, lock, lustre,
                 trust_complete: bool, hints: dict[str, str]) -> None:
        self.comm, self.splits, self.layouts, self.root = comm, splits, layouts, root
        self.params, self.lock, self.lustre, self.hints = params, lock, lustre, hints
        self.trust_complete = trust_complete
        self.sized = [name for name, split in splits.items() if split.format.sizes_recorded]
        self.fs = storage_for(root)

    def prepare(self) -> tuple[bool, bool, str, dict | None, dict]:
        """Rank 0: take the folder's lock; decide whether existing files are ours (a manifest
        with these parameters lists them) and whether they are complete (the manifest says
        so and a few spot checks agree: a rerun then costs no look at every file); remove
        the temporaries a dead generation of ours left; draw this job's temporaries' tag.
        Also the sizes recorded for formats whose sizes depend on the content (None where
        none are: such files of ours are then checked for existence only, since our files
        only ever get their names complete)."""
        root, splits, params, sized = self.root, self.splits, self.params, self.sized
        try:
            self.fs.make_folders(root)
        except OSError as exc:
            raise UserError(f"dataset.data_folder: cannot create {root}: "
                            f"{exc.strerror or exc}") from None
        self.lock.acquire()
        manifest = read_manifest(root)
        ours = manifest is not None and not differing_params(manifest, params)
        if manifest is not None and not ours:
            raise UserError(
                f"{root} holds a dataset generated with other parameters "
                f"({', '.join(differing_params(manifest, params))} differ); choose another "
                "dataset.data_folder or delete that dataset yourself")
        recorded = {}
        for name in sized if ours else ():
            try:
                recorded[name] = read_sizes(root, name, splits[name].num_files, manifest,
                                            splits[name].format.record_width)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        if ours and manifest.get("complete") and self.trust_complete \
                and all(recorded[name] is not None for name in sized):
            try:
                for name, split in splits.items():
                    spot_check_sizes(split, SizedLayouts(recorded[name], split.samples_per_file,
                                                         split.format)
                                     if name in sized else self.layouts[name])
                return ours, True, "", None, {}
            except UserError:
                pass  # a file changed since: the survey looks at every file
        # both split folders, even an empty valid/: DLIO lists it whatever num_files_eval is
        folders = sorted({f for s in splits.values() for f in s.naming.folders()})
        striping = None if self.lustre is None else _stripe(self.lustre, root, folders, ours)
        for folder in folders:
            self.fs.make_folders(folder)
        if ours:
            _remove_temporaries([root, *folders, *side_folders(splits, folders)],
                                manifest.get("temporaries", []))
        return ours, False, new_tag(), striping, recorded

    def expect(self, recorded: dict) -> None:
        """The expected size of each of my files, in the order of `mine` (train first):
        computed, or recorded (UNKNOWN where no size is recorded), and what each will take
        at most; for sized formats each file's record as found or written (a size, or a
        row: parquet's)."""
        splits, layouts, sized, mine = self.splits, self.layouts, self.sized, self.mine
        self.my_index = {name: np.array([i for n, i in mine if n == name], dtype=np.int64)
                         for name in SPLITS}
        self.estimate = np.concatenate([layouts[name].take(self.my_index[name]).size
                                        for name in SPLITS])
        self.my_records = {name: (recorded[name][self.my_index[name]]
                                  if recorded.get(name) is not None
                                  else unknown_records(len(self.my_index[name]),
                                                       splits[name].format.record_width))
                           for name in sized}
        self.expected_size = np.concatenate([
            size_column(self.my_records[name]) if name in sized
            else layouts[name].take(self.my_index[name]).size for name in SPLITS]).tolist()

    def survey(self) -> tuple[list[tuple[str, int]], int]:
        """Which of my files still need writing, and their bytes; refuse when a file in the
        way is not ours, or is ours but changed since (it cannot be told from a foreign one)."""
        todo, todo_bytes = [], 0
        block = self.fs.allocation_unit(self.root)  # files take whole blocks
        for k, ((name, index), want) in enumerate(zip(self.mine, self.expected_size)):
            if k % STAGE_FILES == 0 and _core.stop_signal():  # 10^6 files take seconds
                raise UserError(f"generation stopped by {_signal_name()} before writing; a "
                                "rerun generates the dataset")
            split = self.splits[name]
            path = split.path(index)
            try:
                if _is_link(self.fs, path):  # even a dangling one: it is not a file of ours
                    raise UserError(f"{path} is a symbolic link, not a file dlio-mpi "
                                    "generated; remove it or choose another dataset.data_folder")
                size = self.fs.size(path)  # a FIFO or folder there is refused by name
            except FileNotFoundError:
                todo.append((name, index))
                todo_bytes += -(-int(self.estimate[k]) // block) * block
                _clear_side_files(self.fs, split.format.side_files(path), self.ours)
                continue
            if not self.ours:
                raise UserError(f"{path} exists and was not generated by dlio-mpi with this "
                                "configuration; remove it or choose another dataset.data_folder")
            if want == UNKNOWN:  # ours, complete (renamed when whole): its size as found
                at = k - (len(self.my_index["train"]) if name == "valid" else 0)
                self.my_records[name][at] = _record_of(split, path, size)
            elif size != want:
                raise UserError(
                    f"{path} has {size} bytes where dlio-mpi generated {want}: it was changed "
                    "since, and dlio-mpi overwrites no file it cannot tell from a foreign one; "
                    "delete it to have it generated again")
        return todo, todo_bytes

    def run(self) -> GenerationResult:
        comm, splits, root, sized = self.comm, self.splits, self.root, self.sized
        self.ours, complete, tag, striping, recorded = on_root(comm, self.prepare)
        collective = writes_collectively(splits, comm.Get_size())
        # collectively written files are surveyed by rank 0 alone
        self.mine = (_my_files(splits, 0, 1) if comm.Get_rank() == 0 else []) \
            if collective else _my_files(splits, comm.Get_rank(), comm.Get_size())
        if complete:
            return GenerationResult(0, sum(s.num_files for s in splits.values()), 0, 0.0)
        self.expect(recorded)
        recorded_names = {name: sizes_name(name) for name, r in recorded.items()
                          if r is not None}
        todo, todo_bytes = _check_all_or_stop(comm, self.survey)
        if collective:
            todo = comm.bcast(todo, root=0)
        need = comm.allreduce(todo_bytes)
        on_root(comm, lambda: check_free_space(root, need, "dataset.data_folder"))
        # Only now, with no foreign file in the way, claim the names: an interrupted
        # generation is then still known to be ours, and its temporaries by their tag.
        on_root(comm, lambda: write_manifest(root, self.params, complete=False, tag=tag,
                                             temporaries=[tag],
                                             **({"sizes": dict(recorded_names)} if sized
                                                else {})))
        written, how, sizes_written, seconds, split = self.write(todo, tag, collective)
        if collective:  # every rank knows the totals
            totals = np.array([len(todo), len(_my_files(splits, 0, 1)) - len(todo), written])
        else:
            totals = comm.allreduce(np.array([len(todo), len(self.mine) - len(todo), written],
                                             dtype=np.int64))
        totals_bytes = {name: self.layouts[name].total("size") for name in splits
                        if name not in sized}
        if sized:  # every file's record to rank 0, which records them
            names, sums = self.record(todo, sizes_written, collective, tag, recorded_names)
            totals_bytes.update(sums)
            recorded_names.update(names)
        on_root(comm, lambda: write_manifest(
            root, self.params, complete=True, tag=tag,
            files={name: s.num_files for name, s in splits.items()},
            bytes=totals_bytes, **({"sizes": dict(recorded_names)} if sized else {})))
        return GenerationResult(int(totals[0]), int(totals[1]), int(totals[2]), seconds,
                                striping, how, split)

    def write(self, todo: list, tag: str, collective: bool) -> tuple:
        """Write `todo` (collectively, or each rank its own files): (files written, how,
        the records of the files written, the slowest rank's seconds, and its time split
        between the storage's calls and the emulator's work, None when collective)."""
        comm, splits, root = self.comm, self.splits, self.root
        start, written_ns = _core.now_ns(), _core.write_ns()
        how, sizes_written, meta_ns = None, [], 0
        if collective:
            try:
                written, how = _write_collectively(comm, splits, todo, tag, root, self.hints)
            except JobError as exc:
                _raise_if_stopped(comm, exc)
                raise
        else:
            written, sizes_written, meta_ns = _check_all_or_stop(
                comm, lambda: _write_files(splits, todo, tag, root))
        own = _core.now_ns() - start
        storage = _core.write_ns() - written_ns + meta_ns
        slowest = max(comm.allgather((own, storage)))
        split = None if collective else split_of(*slowest)
        return written, how, sizes_written, slowest[0] / 1e9, split

    def record(self, todo: list, sizes_written: list, collective: bool, tag: str,
               recorded_names: dict) -> tuple[dict, dict]:
        """Every file's record to rank 0, which records them: (names, bytes) per split."""
        sized = self.sized
        if not collective and todo:
            position = {name: {i: k for k, i in enumerate(self.my_index[name].tolist())}
                        for name in sized}
            for (name, index), record in zip(todo, sizes_written):
                if name in sized:
                    self.my_records[name][position[name][index]] = record
        parts = self.comm.gather((self.my_index, self.my_records), root=0)
        return on_root(self.comm, lambda: _record_sizes(self.root, self.splits, sized, parts,
                                                        tag, set(recorded_names)))


def _check_all_or_stop(comm, fn):
    """check_all(comm, fn), its failure raised as Stopped where the ranks agree that a signal
    asked them to stop (a rank that saw it stopped with UserError)."""
    try:
        return check_all(comm, fn)
    except JobError as exc:
        _raise_if_stopped(comm, exc)
        raise


def _raise_if_stopped(comm, exc: JobError) -> None:
    stop = agreed_stop(comm)
    if stop:
        raise Stopped(f"{exc}", stop) from None


def _signal_name() -> str:
    return signal.Signals(_core.stop_signal() or signal.SIGINT).name


def _stripe(lustre, root: str, folders: list[str], ours: bool) -> dict:
    """storage.lustre on the data folder, before its folders and files are created: only on
    a folder that is new, empty (but for our lock) or ours, never on a user's; on a dataset of
    ours its existing folders too (new files take their folder's layout)."""
    fs = storage_for(root)
    if not ours and [e for e in fs.list_kinds(root) if e.name != LOCK_NAME]:
        if lustre.required:
            raise UserError(f"storage.lustre.required is true, but {root} holds files that "
                            "are not dlio-mpi's: its layout is left as it is")
        return {"folder": root, "status": "not applied",
                "note": f"storage.lustre: {root} holds files that are not dlio-mpi's: its "
                        "layout is left as it is"}
    result = apply_striping(lustre, root)
    if ours and result.get("status") == "applied":
        result["folders"] = {f: apply_striping(lustre, f)["status"]
                             for f in folders if fs.is_folder(f)}
    return result


def _write_files(splits, todo: list[tuple[str, int]], tag: str, root: str
                 ) -> tuple[int, list[int], int]:
    """Write my files; returns the bytes written, each file's size (its record row for a
    format that records rows: write_recorded) and the ns spent in the storage's calls made
    from Python (open, close, syncfs, rename, a rendered file's writes). On a failure remove
    my uncommitted temporaries (committed files are complete) and say which folder filled
    when it is ENOSPC."""
    written, sizes = 0, []
    staged = StagedWrites(tag, storage_for(root))
    shown = progress.task("generation (rank 0's files)", len(todo), "files")
    try:
        for name, index in todo:
            if _core.stop_signal():
                staged.commit()  # the files written so far are whole: keep them
                raise UserError(f"generation stopped by {_signal_name()}; complete files "
                                "stay, and a rerun resumes after them")
            split = splits[name]
            write = (split.format.write_recorded if split.format.record_width
                     else split.format.write)
            sizes.append(write(split.path(index), split.spec(index), file_seed(name, index),
                               staged))
            written += int(np.ravel(sizes[-1])[0])  # a size, or a row starting with it
            if len(staged.pending) >= STAGE_FILES or staged.bytes >= STAGE_BYTES:
                staged.commit()
            shown.advance()
        staged.commit()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"dataset.data_folder: {root}: {exc.strerror} while generating; "
                            "dlio-mpi removed its partial files (complete ones stay, and a "
                            "rerun resumes after them)") from None
        raise
    finally:
        shown.close()
        staged.discard()
    return written, sizes, staged.storage_ns


def _record_of(split: DatasetSplit, path: str, size: int):
    """What to record of a complete file of ours found with no record: its size, or its row
    read from the file (a format recording rows)."""
    if not split.format.record_width:
        return size
    try:
        return split.format.probe_record(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: {exc}: it was changed since; delete it to have it "
                        "generated again") from None


def _record_sizes(root: str, splits, sized: list[str], parts: list, tag: str,
                  ours: set[str]) -> tuple[dict[str, str], dict[str, int]]:
    """Rank 0: record the sizes of the `sized` splits' files from every rank's part (its
    file indexes and records per split), replacing only the records of
    the splits in `ours` (named by the manifest); returns the recorded files' names and
    each split's bytes."""
    names, totals = {}, {}
    for name in sized:
        sizes = unknown_records(splits[name].num_files, splits[name].format.record_width)
        for index, part in parts:
            sizes[index[name]] = part[name]
        names[name] = write_sizes(root, name, sizes, tag, replace=name in ours)
        totals[name] = int(size_column(sizes).sum())
    return names, totals


def _write_collectively(comm, splits, todo: list[tuple[str, int]], tag: str, root: str,
                        hints: dict[str, str]) -> tuple[int, dict]:
    """Write every file of `todo` with all ranks (collective_generation.py); rank 0 stages
    and completes them. Returns the bytes written and what to record of how."""
    staged = StagedWrites(tag, storage_for(root)) if comm.Get_rank() == 0 else None
    written, effective = 0, None
    shown = progress.task("generation (all ranks together)", len(todo), "files")
    try:
        for name, index in todo:
            if agreed_stop(comm):
                on_root(comm, lambda: staged.commit())  # the files written so far are whole
                raise JobError(f"generation stopped by {_signal_name()}; complete files "
                               "stay, and a rerun resumes after them")
            size, effective = write_file_collectively(
                comm, splits[name], index, file_seed(name, index), staged, hints)
            written += size
            on_root(comm, lambda: staged.commit())
            shown.advance()
    finally:
        shown.close()
        if staged is not None:
            staged.discard()
    return written, {"files": len(todo), "ranks": comm.Get_size(), "api": "MPI-IO Write_at_all",
                     "hints_requested": hints, "hints_effective": effective}


def _is_link(fs: Storage, path: str) -> bool:
    """Whether `path` is a symbolic link (False when it cannot be looked up: os.path.islink)."""
    try:
        entry = fs.entry(path)
    except OSError:
        return False
    return entry is not None and entry.kind == "link"


def _clear_side_files(fs: Storage, paths: list[str], ours: bool) -> None:
    """Side files of a data file still to write: left by an interrupted generation of ours
    (renamed before their data file), removed; anyone else's, refused."""
    present = [p for p in paths if fs.exists(p)]
    if present and not ours:
        raise UserError(f"{present[0]} exists and was not generated by dlio-mpi; remove it or "
                        "choose another dataset.data_folder")
    fs.remove_quietly(present)


def side_folders(splits: dict[str, DatasetSplit], folders: list[str]) -> list[str]:
    """Existing folders of side files away from the data files (tfrecord's
    <root>/index/<split>: one per split, the folder of its first file's side files)."""
    found = {os.path.dirname(p) for s in splits.values() if s.num_files
             for p in s.format.side_files(s.path(0))}
    return sorted(f for f in found.difference(folders) if storage_for(f).is_folder(f))


def _remove_temporaries(folders: list[str], tags: list[str]) -> None:
    """Remove the temporaries of earlier generations of ours (by the tags their manifest
    recorded: data files, side files and the manifest's own) from `folders`."""
    for folder in folders:
        fs = storage_for(folder)
        fs.remove_quietly([os.path.join(folder, e.name) for e in fs.list_kinds(folder)
                           if is_temporary_of(e.name, tags)])


def check_free_space(folder: str, need: int, key: str) -> None:
    """Refuse up front when `folder`'s file system has less room than `need` bytes."""
    free = storage_for(folder).free_bytes(folder)
    if free is not None and need > free:
        raise UserError(f"{key}: {folder} has {_gib(free)} free, but this run would write "
                        f"{_gib(need)} there; free space or choose another folder")


def check_dataset_space(root: str, dataset_bytes: int) -> None:
    """Before anything is created (run, generate; validate makes it a warning): refuse when
    the whole dataset is to be written into `root` (no dlio-mpi manifest there yet)
    and the file system it goes to has less free space than the dataset's bytes. A dataset
    partly there is left to generate()'s survey, which knows what is missing."""
    fs = storage_for(root)
    if fs.exists(root) and (not fs.is_folder(root) or read_manifest(root) is not None):
        return
    where = nearest_existing(root)
    try:
        free = fs.free_bytes(where)
    except OSError:
        return  # generation says why it cannot create the folder
    if free is not None and dataset_bytes > free:
        raise UserError(f"dataset.data_folder: the dataset takes {_gib(dataset_bytes)}, but "
                        f"the file system of {root} has {_gib(free)} free (at {where}); "
                        "free space, choose another folder or make the dataset smaller")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} bytes)"


def _max_op():
    from mpi4py import MPI

    return MPI.MAX
