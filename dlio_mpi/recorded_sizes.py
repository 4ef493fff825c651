"""The sizes of generated files whose sizes depend on their content (jpeg, png, csv), recorded
by generation in a side file of the manifest, one per split: `dlio_mpi_sizes_<split>.npy`
under the data folder, an int64 array of one entry per file (-1: not known), named in the
manifest (`sizes`). Written like the manifest (an exclusive temporary carrying the job's tag,
then a rename over the previous one, which the manifest names as ours); read by the catalog
(layouts of the split) and by generation (what each existing file should weigh)."""

from __future__ import annotations

import os

import numpy as np

from .ownership import create_exclusive, remove_quietly, rename_noreplace, temporary_name

UNKNOWN = -1


def sizes_name(split: str) -> str:
    return f"dlio_mpi_sizes_{split}.npy"


def sizes_path(root: str, split: str) -> str:
    return os.path.join(root, sizes_name(split))


def write_sizes(root: str, split: str, sizes: np.ndarray, tag: str, replace: bool) -> str:
    """Write `split`'s sizes (synced before the rename) over the previous record when
    `replace` (the manifest names it: ours), else only where no file has that name; returns
    the file's name."""
    path = sizes_path(root, split)
    tmp = temporary_name(path, tag)
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "wb", closefd=False) as fp:
            np.save(fp, np.ascontiguousarray(sizes, dtype="<i8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            rename_noreplace(tmp, path)
    except BaseException:
        remove_quietly([tmp])
        raise
    return sizes_name(split)


def read_sizes(root: str, split: str, count: int, manifest: dict | None) -> np.ndarray | None:
    """`split`'s recorded sizes when the manifest names a file of `count` of them, else None
    (ValueError when the named file is not one)."""
    if not manifest or sizes_name(split) != (manifest.get("sizes") or {}).get(split):
        return None
    path = sizes_path(root, split)
    try:
        sizes = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not dlio-mpi's record of file sizes ({exc})") from None
    if sizes.dtype != np.int64 or sizes.shape != (count,):
        raise ValueError(f"{path} records {sizes.shape} sizes of {sizes.dtype}, not the "
                         f"{count} int64 sizes of the {split} files")
    return sizes
