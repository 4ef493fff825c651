"""The calibrated workload file: the input workload (its YAML with the command line's
overrides applied) with the measured model set, DLIO's keys where DLIO has them with the same
meaning (reader.read_threads, train.computation_time), ours otherwise
(reader.preprocess_cpu_time, reader.step_cpu_time, reader.startup_time), and comments on
what was measured, how and on which host. It is written under an O_EXCL temporary and
renamed into place; an existing file is replaced only if an earlier calibration wrote it (its
first line is MARK), anything else there is refused."""

from __future__ import annotations

import os
import sys
import time

import yaml

from ..errors import UserError
from ..storage import storage_for
from ..storage.ownership import new_tag, temporary_name
from .model import LoaderModel, model_keys

MARK = "# dlio-mpi calibrate:"


def _ours(path: str) -> bool | None:
    """None: nothing there; True: an earlier calibration's file; False: anything else."""
    try:
        head = storage_for(path).read_small(path, len(MARK))
    except (OSError, ValueError):
        return False
    return None if head is None else head == MARK.encode()


def check_out_path(path: str) -> None:
    """Refuse an --out that is not a .yaml path, whose folder is missing, or where a file
    dlio-mpi did not write is in the way."""
    if not path.endswith((".yaml", ".yml")):
        raise UserError(f"--out {path}: expected a .yaml file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not storage_for(folder).is_folder(folder):
        raise UserError(f"--out {path}: the folder {folder} does not exist")
    if _ours(path) is False:
        raise UserError(f"--out {path}: a file dlio-mpi calibrate did not write is there; it "
                        "is left as it is: choose another name or remove it yourself")


def calibrated_tree(source: str, overrides: list[str], workers: int, m: LoaderModel,
                    compute: float | None) -> tuple[dict, dict]:
    """(the workload's mapping with the model set, the keys set)."""
    from ..config.loader import apply_override, normalize_aliases, read_source

    tree = normalize_aliases(read_source(source))
    for text in overrides:
        apply_override(tree, text)
    normalize_aliases(tree)
    reader = tree.setdefault("reader", {})
    changed = {"reader.data_loader": "pytorch", "reader.engine": "native",
               "reader.read_threads": workers, "reader.preprocess_time": 0,
               **{f"reader.{k}": v for k, v in model_keys(m).items()}}
    reader.pop("preprocess_time_stdev", None)
    reader.pop("preprocess_cpu_time_stdev", None)
    for name in ("step_cpu_time_stdev", "step_wait_time_stdev"):
        reader.pop(name, None)
    if compute is not None:
        train = tree.setdefault("train", {})
        train.pop("computation_time_stdev", None)
        changed["train.computation_time"] = round(float(compute), 6)
    for dotted, value in changed.items():
        section, key = dotted.split(".")
        tree.setdefault(section, {})[key] = value
    return tree, changed


def write_calibrated(path: str, source: str, overrides: list[str], workers: int,
                     m: LoaderModel, compute: float | None, measured: list[str]) -> dict:
    """Write the calibrated workload at `path` (see the module); what it set."""
    from ..config import ConfigError, load_config

    tree, changed = calibrated_tree(source, overrides, workers, m, compute)
    head = [f"{MARK} {source} {' '.join(overrides)}".rstrip(),
            f"# written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by: dlio-mpi calibrate "
            f"{' '.join(sys.argv[2:])}".rstrip(),
            "# What was measured (warm, data-bound; docs/fidelity.md says how the emulator "
            "models it):",
            *(f"#   {line}" for line in measured),
            "# What it sets (the workload's other keys are as given):",
            *(f"#   {k}: {v}" for k, v in changed.items()),
            "#   reader.preprocess_cpu_time: the workers' CPU time per sample (and the training "
            "process's pinning thread's) less the emulator's own read of it (the emulator "
            "reads for real);",
            "#   reader.step_cpu_time: the training process's CPU time per step;",
            "#   reader.step_wait_time: its wait per step on the batch's hand-over;",
            "#   reader.startup_time: the first epoch's wait for the worker processes;",
            "#   reader.preprocess_time: 0 (the measured CPU time replaces the usual sleep).",
            ""]
    text = "\n".join(head) + yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
    tmp = temporary_name(path, new_tag())
    fs = storage_for(path)
    fs.put(tmp, text.encode())
    try:
        try:
            load_config(tmp)
        except ConfigError as exc:
            raise UserError(f"the calibrated workload does not load ({exc}); it was not "
                            f"written") from None
        if _ours(path):
            fs.replace_own(tmp, path)  # an earlier calibration's file (checked just now)
        else:
            fs.rename_noreplace(tmp, path)
    finally:
        fs.remove_quietly([tmp])
    model = ", ".join(f"{k}={v}" for k, v in changed.items() if k.startswith(
        ("reader.preprocess_cpu", "reader.step", "reader.startup", "train.")))
    return {"keys": changed, "model": model}
