"""Every folder a run reads or writes, checked against every other in one place, before any
I/O: no two of them may be one folder, or one inside the other, by real path (symlinks
resolved), whatever their keys say. A drain into the dataset, checkpoints inside the output
folder (which the next run then refuses as not its results), a stage folder holding the data
folder: each is refused with one message naming both keys.

The data folder counts even where the run neither reads nor generates it (a checkpoint-only
run): its files are the user's dataset. Hydra's run folder is output.folder (config/hydra.py)
and its output_subdir a name inside it, so they are covered by output.folder's entry. Later
folders (new checkpoint layouts, object storage's local tiers) are added to `run_folders`."""

from __future__ import annotations

import itertools
import os

from ..errors import UserError


def run_folders(cfg) -> list[tuple[str, str]]:
    """(key, folder) of every folder the run uses, in the order their messages name them."""
    folders = [("dataset.data_folder",
                os.path.join(cfg.storage.storage_root, cfg.dataset.data_folder)),
               ("output.folder", cfg.output.folder)]
    ck = cfg.checkpoint
    if cfg.workflow.checkpoint:
        folders.append(("checkpoint.checkpoint_folder", ck.checkpoint_folder))
        if ck.drain is not None:
            folders.append(("checkpoint.drain.to", ck.drain.to))
    if cfg.workflow.train and cfg.storage.stage_in is not None:
        folders.append(("storage.stage_in.to", cfg.storage.stage_in.to))
    if cfg.workflow.train and cfg.reader.cache is not None:
        folders.append(("reader.cache.folder", cfg.reader.cache.folder))
    return folders


def _inside(inner: str, outer: str) -> bool:
    return inner.startswith(outer.rstrip(os.sep) + os.sep)


def check_folders_apart(cfg) -> None:
    """Refuse two folders of the run that are one, or one inside the other (run_folders),
    naming the later key first."""
    real = [(key, folder, os.path.realpath(os.path.abspath(folder)))
            for key, folder in run_folders(cfg)]
    for (key_a, a, real_a), (key_b, b, real_b) in itertools.combinations(real, 2):
        if real_b == real_a:
            how = "the same folder as"
        elif _inside(real_b, real_a):
            how = "inside"
        elif _inside(real_a, real_b):
            how = "a folder holding"
        else:
            continue
        linked = "" if (os.path.abspath(a), os.path.abspath(b)) == (real_a, real_b) else \
            f" (by real path: {real_b} and {real_a})"
        raise UserError(f"{key_b}: {b} is {how} {key_a} {a}{linked}; expected folders apart "
                        "(no folder of the run inside another): a run writes its own files "
                        "into each and claims it for itself")
