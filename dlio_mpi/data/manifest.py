"""The generation manifest: which parameters produced the files under a data folder.

It is written before the first file (so an interrupted generation is still known to be ours:
file names follow from the parameters) and marked complete at the end. Cleanup and overwrite
decisions only ever touch files whose names follow from a manifest."""

from __future__ import annotations

import json
import os
import time

from ..formats import get_format, implemented_formats
from ..storage import storage_for
from ..storage.ownership import temporary_name

MANIFEST_NAME = "dlio_mpi_manifest.json"


def generation_params(cfg) -> dict:
    """The configuration values that determine the generated files' names and bytes."""
    ds = cfg.dataset
    params = {
        "format": ds.format,
        "num_files_train": ds.num_files_train,
        "num_files_eval": ds.num_files_eval,
        "num_subfolders_train": ds.num_subfolders_train,
        "num_subfolders_eval": ds.num_subfolders_eval,
        "num_samples_per_file": ds.num_samples_per_file,
        "file_prefix": ds.file_prefix,
        "record_length_bytes": ds.record_length_bytes,
        "record_length_bytes_stdev": ds.record_length_bytes_stdev,
        "record_dims": list(ds.record_dims),
        "record_element_type": ds.record_element_type,
        "sample_layout": ds.sample_layout,
    }
    # the format's own, only for it, so that other datasets' manifests stay valid
    if ds.format in implemented_formats():
        params.update(get_format(ds.format).manifest_params(ds))
    return params


def manifest_path(root: str) -> str:
    return os.path.join(root, MANIFEST_NAME)


def read_manifest(root: str) -> dict | None:
    """The manifest under `root`, or None if there is none."""
    path = manifest_path(root)
    try:
        raw = storage_for(path).read_small(path)
        if raw is None:
            return None
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("tool") != "dlio-mpi":
            raise ValueError("not a manifest of dlio-mpi")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not dlio-mpi's manifest ({exc}); it was left as it "
                         "is: choose another dataset.data_folder") from exc
    return body


def write_manifest(root: str, params: dict, complete: bool, tag: str, **extra) -> None:
    """Write the manifest atomically (an exclusive temporary carrying the job's `tag`, then a
    rename over the previous manifest, which read_manifest has found to be ours)."""
    from .. import __version__

    body = {"tool": "dlio-mpi", "version": __version__, "complete": complete,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "params": params, **extra}
    path = manifest_path(root)
    tmp = temporary_name(path, tag)
    fs = storage_for(path)
    fs.put(tmp, json.dumps(body, indent=1).encode())
    fs.replace_own(tmp, path)


def differing_params(manifest: dict, params: dict) -> list[str]:
    """Names of the parameters whose values differ between a manifest and `params`."""
    old = manifest.get("params", {})
    return sorted(k for k in params.keys() | old.keys() if old.get(k) != params.get(k))
