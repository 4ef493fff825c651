"""The sizes of generated files whose sizes depend on their content (jpeg, png, csv), recorded
by generation in a side file of the manifest, one per split: `dlio_mpi_sizes_<split>.npy`
under the data folder, an int64 array of one entry per file (-1: not known), named in the
manifest (`sizes`). A format that needs more of each file than its size (parquet's row groups
when their bytes depend on the content: its `record_width`) records a row per file instead,
(files, record_width) int64, whose first column is the size (a row of -1: not known).
Written like the manifest (an exclusive temporary carrying the job's tag, then a rename over
the previous one, which the manifest names as ours); read by the catalog (layouts of the
split) and by generation (what each existing file should weigh)."""

from __future__ import annotations

import os

import numpy as np

from ..storage import storage_for
from ..storage.ownership import temporary_name

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
    fs = storage_for(path)
    handle = fs.create_exclusive(tmp)
    try:
        with fs.file_object(handle, "wb") as fp:  # np.save streams the array: no copy
            np.save(fp, np.ascontiguousarray(sizes, dtype="<i8"))
        fs.sync(handle)
    finally:
        fs.close(handle)
    try:
        if replace:
            fs.replace_own(tmp, path)
        else:
            fs.rename_noreplace(tmp, path)
    except BaseException:
        fs.remove_quietly([tmp])
        raise
    return sizes_name(split)


def size_column(records: np.ndarray) -> np.ndarray:
    """The sizes of recorded files (the first column of per-file rows)."""
    return records if records.ndim == 1 else records[:, 0]


def unknown_records(count: int, width: int | None) -> np.ndarray:
    """`count` records of nothing known (one size each, or rows of `width`)."""
    return np.full(count if width is None else (count, width), UNKNOWN, dtype=np.int64)


def read_sizes(root: str, split: str, count: int, manifest: dict | None,
               width: int | None = None) -> np.ndarray | None:
    """`split`'s recorded sizes (rows of `width` when given) when the manifest names a file of
    `count` of them, else None (ValueError when the named file is not one)."""
    if not manifest or sizes_name(split) != (manifest.get("sizes") or {}).get(split):
        return None
    path = sizes_path(root, split)
    try:
        with storage_for(path).stream(path) as fp:
            sizes = np.load(fp, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not dlio-mpi's record of file sizes ({exc})") from None
    want = (count,) if width is None else (count, width)
    if sizes.dtype != np.int64 or sizes.shape != want:
        raise ValueError(f"{path} records {sizes.shape} sizes of {sizes.dtype}, not the "
                         f"{want} int64 records of the {split} files")
    return sizes
