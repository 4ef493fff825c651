"""dlio-mpi pack: merge a one-sample-per-file dataset into large indexed_binary shards.

Small files cost an open, a probe and a close per sample: on a parallel file system that is
metadata-server load that can dwarf the data (the etalumis run merged 15 million files into
150). `pack` writes the workload's samples, each one original file's bytes unchanged, K to a
shard in DLIO's indexed_binary layout (the data file holds the samples back to back;
`<file>.off.idx` and `<file>.sz.idx` hold each sample's offset and size as uint64), which the
C engine reads by extent. Sample i of the original (file i) is sample i % K of shard i // K,
so the same configuration with the printed overrides reads the same samples in the same
order (shuffles included: they permute sample ids, which are unchanged).

Shards are dealt round-robin to the ranks, as generation deals files, and written through
StagedWrites (O_EXCL temporaries, renames that never replace). The target folder is claimed
with generation's lock and a manifest whose parameters say the files are a pack (so that
neither `generate` nor a run with workflow.generate_data writes into it, and runs read it as
data of another tool: its index files are probed). A rerun resumes, skipping complete
shards; a complete pack is left as it is."""

from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass

import numpy as np

from .. import _core
from ..config import ConfigError, load_config
from ..config.loader import parse_override
from ..errors import JobError, Stopped, UserError, agreed_stop, check_all, on_root
from ..formats.base import SampleSpec, StagedWrites
from ..formats.indexed_binary import IndexedBinaryFormat
from ..storage import Handle, Storage, missing_folders, remove_empty_folders, storage_for
from ..storage.ownership import LOCK_NAME, new_tag
from .catalog import locate_split
from .dataset import SHAPE_CHUNK, SPLITS, FileNaming, describe_dataset
from .generate import _remove_temporaries, check_free_space
from .manifest import (
    differing_params,
    generation_params,
    manifest_path,
    read_manifest,
    write_manifest,
)

SHARD_BYTES = 256 << 20  # default shard size: large reads, few files, still many per rank
OVERRIDES_NAME = "dlio_mpi_pack_overrides.txt"
FORMAT = IndexedBinaryFormat()


@dataclass(frozen=True)
class PackPlan:
    """What `pack` writes: for each split, `files` shards of `per_shard` samples of
    `sample_bytes` bytes, read from `sources` (the original files, by sample id)."""

    folder: str
    per_shard: int
    sample_bytes: int
    files: dict[str, int]
    overrides: tuple[str, ...]
    params: dict


def check_packable(cfg, folder: str, samples_per_shard: int | None) -> None:
    """Refusals that need no I/O: only one-sample-per-file datasets are packed."""
    ds = cfg.dataset
    if ds.num_samples_per_file != 1:
        raise UserError(
            f"dlio-mpi pack merges datasets of one sample per file, but dataset."
            f"num_samples_per_file={ds.num_samples_per_file}; its files are shards already "
            "(expected dataset.num_samples_per_file=1)")
    if samples_per_shard is not None and samples_per_shard < 1:
        raise UserError(f"--samples-per-shard {samples_per_shard}: expected an integer >= 1")
    if not cfg.dataset.num_files_train:
        raise UserError("dataset.num_files_train=0: there is nothing to pack")
    source = os.path.abspath(os.path.join(cfg.storage.storage_root, ds.data_folder))
    target = os.path.abspath(folder)
    if target == source or target.startswith(source + os.sep) or \
            source.startswith(target + os.sep):
        raise UserError(f"--to {folder}: the packed dataset must go to a folder apart from "
                        f"the workload's dataset.data_folder {source}")


def shard_samples(counts: list[int], sample_bytes: int, wanted: int | None) -> int:
    """Samples per shard: `wanted` when it divides every split's sample count (every file of
    a dataset holds dataset.num_samples_per_file samples), else the largest divisor of them
    all whose shards stay within SHARD_BYTES."""
    common = math.gcd(*counts)
    if wanted is not None:
        if common % wanted:
            raise UserError(
                f"--samples-per-shard {wanted} does not divide the "
                f"{' and '.join(map(str, [c for c in counts if c]))} samples of the dataset "
                f"(every shard holds the same number); divisors near it: "
                f"{', '.join(map(str, _near_divisors(common, wanted)))}")
        return wanted
    limit = max(SHARD_BYTES // max(sample_bytes, 1), 1)
    return max(d for d in _divisors(common) if d <= limit)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _near_divisors(n: int, wanted: int) -> list[int]:
    return sorted(sorted(_divisors(n), key=lambda d: abs(d - wanted))[:4])


def packed_overrides(folder: str, per_shard: int, sample_bytes: int,
                     files: dict[str, int]) -> tuple[str, ...]:
    """The overrides that make the workload read the packed dataset."""
    return (
        "dataset.format=indexed_binary",
        f"dataset.data_folder={os.path.abspath(folder)}",
        f"dataset.num_files_train={files['train']}",
        f"dataset.num_files_eval={files['valid']}",
        f"dataset.num_samples_per_file={per_shard}",
        f"dataset.record_dims=[{sample_bytes}]",
        "dataset.record_element_type=uint8",
        f"dataset.record_length_bytes={sample_bytes}",
        "dataset.record_length_bytes_stdev=0",
        "dataset.num_subfolders_train=0",
        "dataset.num_subfolders_eval=0",
        "dataset.sample_layout=first_axis",
        "workflow.generate_data=False",
    )  # data_folder is absolute: storage.storage_root does not apply to it


def combined(overrides: list[str], packed: tuple[str, ...]) -> list[str]:
    """The user's overrides but those of keys the pack sets, then the pack's."""
    ours = {parse_override(text)[0] for text in packed}
    return [text for text in overrides if parse_override(text)[0] not in ours] + list(packed)


def plan_pack(comm, cfg, source: str, overrides: list[str], folder: str,
              samples_per_shard: int | None):
    """Collectively: the pack's plan and each split's located original files."""
    check_all(comm, lambda: check_packable(cfg, folder, samples_per_shard))
    splits = describe_dataset(cfg)
    located = {name: locate_split(comm, cfg, split) for name, split in splits.items()
               if split.num_files}

    def sizes() -> int:
        found = set()
        for files in located.values():  # a chunk at a time: 10^7 files' layouts are GiBs
            for start in range(0, files.count, SHAPE_CHUNK):
                chunk = np.arange(start, min(start + SHAPE_CHUNK, files.count))
                found.update(np.unique(files.layouts.take(chunk).size).tolist())
        if len(found) != 1:
            raise UserError(
                f"the dataset's files have {len(found)} different sizes "
                f"({min(found)} to {max(found)} bytes): packing samples of unequal sizes is "
                "not implemented yet (dlio-mpi's indexed_binary reader takes samples of one "
                "size only)")
        return found.pop()

    sample_bytes = on_root(comm, sizes)
    counts = [split.num_files for split in splits.values()]
    per_shard = check_all(comm, lambda: shard_samples([c for c in counts if c], sample_bytes,
                                                      samples_per_shard))
    files = {name: split.num_files // per_shard for name, split in splits.items()}
    packed = packed_overrides(folder, per_shard, sample_bytes, files)
    packed_cfg = check_all(comm, lambda: load_config(source, combined(overrides, packed)),
                           expected=(ConfigError, UserError))
    params = generation_params(packed_cfg)
    params["packed_from"] = {"data_folder": os.path.abspath(located["train"].split.root),
                             "format": cfg.dataset.format,
                             "files": {name: split.num_files for name, split in splits.items()},
                             "sample_bytes": sample_bytes}
    return PackPlan(os.path.abspath(folder), per_shard, sample_bytes, files, packed,
                    params), located


def _naming(plan: PackPlan, split: str, prefix: str) -> FileNaming:
    return FileNaming(plan.folder, split, plan.files[split], 0, prefix, FORMAT.extension)


def pack(comm, cfg, source: str, overrides: list[str], folder: str,
         samples_per_shard: int | None = None) -> dict:
    """Collectively pack the workload's dataset into `folder`; returns what was done
    (the same on every rank)."""
    plan, located = plan_pack(comm, cfg, source, overrides, folder, samples_per_shard)
    prefix = cfg.dataset.file_prefix
    shards = [(name, i) for name in SPLITS for i in range(plan.files[name])]
    lock = storage_for(plan.folder).claim(plan.folder, "pack")
    try:
        made = missing_folders(plan.folder)  # a pack refused for room leaves none of them
        tag, complete, fresh = on_root(comm, lambda: _claim(plan, lock))
        written = 0
        if not complete:
            mine = shards[comm.Get_rank()::comm.Get_size()]
            spec = SampleSpec((plan.sample_bytes,), "|u1", plan.per_shard)
            need = check_all(comm, lambda: _todo(plan, mine, prefix, spec))
            total_need = comm.allreduce(sum(size for *_, size in need))
            on_root(comm, lambda: _check_room(plan, total_need, fresh, lock, made))
            _core.stop_on_signals()  # SIGINT, SIGTERM: stop after the shard being written
            try:
                written = comm.allreduce(check_all(comm, lambda: _write_shards(
                    plan, need, located, prefix, spec, tag)))
            except JobError as exc:
                stop = agreed_stop(comm)
                if stop:
                    raise Stopped(f"{exc}", stop) from None
                raise
            on_root(comm, lambda: _complete(plan, tag))
    finally:
        on_root(comm, lambda: lock.release())
    return {"folder": plan.folder, "shards": len(shards), "samples_per_shard": plan.per_shard,
            "sample_bytes": plan.sample_bytes, "bytes_written": written,
            "already_complete": complete, "overrides": list(plan.overrides),
            "run_overrides": combined(overrides, plan.overrides)}


def _check_room(plan: PackPlan, need: int, fresh: bool, lock, made: list[str]) -> None:
    """Rank 0: refuse a pack the folder has no room for; a folder it began just now is left
    as it was (its manifest, split folders and the folders made for it removed)."""
    try:
        check_free_space(plan.folder, need, "--to")
    except UserError:
        if fresh:
            storage_for(plan.folder).remove_quietly([manifest_path(plan.folder)])
            lock.release()
            remove_empty_folders([*(os.path.join(plan.folder, s) for s in SPLITS), *made])
        raise


def _claim(plan: PackPlan, lock) -> tuple[str, bool, bool]:
    """Rank 0: lock the folder and decide whether it is ours. It must be new, empty or a pack
    of ours with these parameters (complete: nothing to do; else its temporaries removed).
    The tag, whether it is complete, whether it was begun now (no manifest before)."""
    fs = storage_for(plan.folder)
    try:
        fs.make_folders(plan.folder)
    except OSError as exc:
        raise UserError(f"--to: cannot create {plan.folder}: {exc.strerror or exc}") from None
    lock.acquire()
    try:
        manifest = read_manifest(plan.folder)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if manifest is None:
        foreign = sorted(e.name for e in fs.list_kinds(plan.folder) if e.name != LOCK_NAME)
        if foreign:
            raise UserError(f"--to {plan.folder} holds files that are not dlio-mpi's "
                            f"({foreign[0]}, ...): it was left as it is; choose a new or "
                            "empty folder")
    elif differing_params(manifest, plan.params):
        raise UserError(f"--to {plan.folder} holds a dataset of dlio-mpi made with other "
                        f"parameters ({', '.join(differing_params(manifest, plan.params))} "
                        "differ); choose another folder or delete it yourself")
    elif manifest.get("complete"):
        return "", True, False
    split_folders = [os.path.join(plan.folder, s) for s in SPLITS]
    for path in split_folders:
        fs.make_folders(path)
    if manifest is not None:
        _remove_temporaries([plan.folder, *split_folders], manifest.get("temporaries", []))
    tag = new_tag()
    write_manifest(plan.folder, plan.params, complete=False, tag=tag, temporaries=[tag],
                   packed=True)
    return tag, False, manifest is None


def _todo(plan: PackPlan, mine: list[tuple[str, int]], prefix: str, spec: SampleSpec
          ) -> list[tuple[str, int, int]]:
    """My shards still to write, with their sizes. A shard present is ours (the manifest
    names the folder's files), complete (renamed whole), and kept if of its size."""
    size = spec.samples * spec.sample_bytes
    fs, todo = storage_for(plan.folder), []
    for name, index in mine:
        path = _naming(plan, name, prefix).path(index)
        try:
            found = fs.size(path)
        except FileNotFoundError:
            for side in FORMAT.side_files(path):  # renamed before an interrupted data file
                if fs.exists(side):
                    fs.remove(side)
            todo.append((name, index, size))
            continue
        if found != size:
            raise UserError(f"{path} has {found} bytes where dlio-mpi packed {size}: it was "
                            "changed since; delete it to have it packed again")
    return todo


def _write_shards(plan: PackPlan, todo, located, prefix: str, spec: SampleSpec,
                  tag: str) -> int:
    """Write my shards: index files, then the samples' bytes, each one original file."""
    staged = StagedWrites(tag, storage_for(plan.folder))
    written = 0
    try:
        for name, index, _ in todo:
            if _core.stop_signal():  # the shards written so far are whole and committed
                raise UserError(f"pack stopped by {signal.Signals(_core.stop_signal()).name}; "
                                "complete shards stay, and a rerun resumes after them")
            path = _naming(plan, name, prefix).path(index)
            sources = [located[name].path(i) for i in range(index * plan.per_shard,
                                                            (index + 1) * plan.per_shard)]
            FORMAT.write_side_files(path, spec, staged)
            written += staged.write(path, lambda handle, src=sources: _concatenate(
                staged.storage, handle, src, plan.sample_bytes))
            staged.commit()  # one syncfs per shard (shards are large)
    finally:
        staged.discard()
    return written


def _concatenate(fs: Storage, handle: Handle, sources: list[str], sample_bytes: int) -> None:
    """The `sources`' bytes one after the other onto `handle` (of `fs`), each read whole."""
    for src in sources:
        with storage_for(src).stream(src) as fp:
            data = fp.read()
        if len(data) != sample_bytes:
            raise UserError(f"{src} has {len(data)} bytes where the dataset's files have "
                            f"{sample_bytes}: it changed while being packed")
        fs.append(handle, data)


def _complete(plan: PackPlan, tag: str) -> None:
    """Rank 0: the overrides file (through an O_EXCL temporary and a rename that replaces
    nothing; one of an interrupted pack is kept when it says the same), then the manifest
    marked complete."""
    path = os.path.join(plan.folder, OVERRIDES_NAME)
    text = "\n".join(plan.overrides) + "\n"
    fs = storage_for(path)
    present = fs.read_small(path)
    if present is not None and present.decode(errors="replace") != text:
        raise UserError(f"{path} exists and says something else than this pack: it was left "
                        "as it is; delete it yourself to have it written")
    if present is None:
        staged = StagedWrites(tag, fs)
        staged.write(path, lambda handle: fs.append(handle, text.encode()))
        staged.commit()
    write_manifest(plan.folder, plan.params, complete=True, tag=tag, packed=True,
                   files=plan.files, overrides=list(plan.overrides))
