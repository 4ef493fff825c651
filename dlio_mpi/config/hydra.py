"""The Hydra side of DLIO's command line, as MLPerf Storage's tool (mlpstorage) builds it:
`dlio_benchmark workload=NAME ++hydra.run.dir=DIR ++hydra.output_subdir=dlio_config
++workload.KEY=VALUE ... --config-dir=CONFIGS`. DLIO reads its workload through Hydra: the
file CONFIGS/workload/NAME.yaml, the results in the run folder (DLIO's output folder) and, in
its subfolder output_subdir, Hydra's record of the job (config.yaml, hydra.yaml,
overrides.yaml), which MLPerf Storage's report generator and submission checker read.
dlio-mpi takes the same command line; this module splits the hydra.* overrides from the
workload's and writes that record in Hydra's layout."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from ..results.names import WRITTEN_TEXT, is_written_name

HYDRA_KEYS = ("hydra.run.dir", "hydra.output_subdir")
RECORD_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # Hydra's, in output_subdir


@dataclass(frozen=True)
class HydraRun:
    """What the command line asked of Hydra: the run folder, the subfolder of Hydra's record
    (None: none written, Hydra's `null`), the --config-dir, and the task overrides as given
    (the workload's, `workload=NAME` included), which overrides.yaml lists."""

    run_dir: str | None = None
    output_subdir: str | None = None
    config_dir: str | None = None
    task_overrides: tuple[str, ...] = ()

    def record_files(self, workload: dict[str, Any], hydra_overrides: Sequence[str],
                     choice: str | None) -> dict[str, str]:
        """The texts of Hydra's record, by path relative to the run folder: config.yaml (the
        composed configuration, DLIO's `workload:` mapping), hydra.yaml (Hydra's settings
        of the job; the keys dlio-mpi has a value for) and overrides.yaml."""
        if not self.output_subdir:
            return {}
        hydra = {
            "run": {"dir": self.run_dir},
            "output_subdir": self.output_subdir,
            "overrides": {"hydra": list(hydra_overrides), "task": list(self.task_overrides)},
            "job": {"name": "dlio_mpi", "config_name": "config"},
            "runtime": {"cwd": os.getcwd(),
                        "output_dir": os.path.abspath(self.run_dir or os.getcwd()),
                        "config_sources": ([{"path": os.path.abspath(self.config_dir),
                                             "schema": "file", "provider": "command-line"}]
                                           if self.config_dir else []),
                        "choices": {"workload": choice} if choice else {}},
            "mode": "RUN",
        }
        texts = {"config.yaml": {"workload": workload}, "hydra.yaml": {"hydra": hydra},
                 "overrides.yaml": list(self.task_overrides)}
        return {os.path.join(self.output_subdir, name): yaml.safe_dump(
            texts[name], sort_keys=False) for name in RECORD_FILES}


def _hydra_key(text: str) -> str | None:
    """The hydra.* key an override sets (+, ++ and ~ stripped), else None."""
    body = text.strip().lstrip("+~")
    key = body.partition("=")[0].strip()
    return key if key == "hydra" or key.startswith("hydra.") else None


def split_hydra(overrides: Sequence[str], config_dir: str | None
                ) -> tuple[list[str], list[str], HydraRun]:
    """(the workload's overrides, the hydra ones as given, what they ask). hydra.run.dir sets
    output.folder (DLIO's output folder is Hydra's run folder); hydra.output_subdir names the
    folder inside it of Hydra's record (no '/', no name the run writes there: a clash would
    end the run after it had trained). Any other hydra key is refused, naming the ones
    taken."""
    workload, hydra, values, given = [], [], {}, {}
    for text in overrides:
        key = _hydra_key(text)
        if key is None:
            workload.append(text)
            continue
        if key not in HYDRA_KEYS or text.strip().startswith("~"):
            accepted = ", ".join(f"{k}=VALUE" for k in HYDRA_KEYS)
            raise ConfigError(f"override '{text}': {key} is not implemented yet in dlio-mpi; "
                              f"accepted Hydra settings: {accepted}")
        if key in given:  # as the workload's overrides: a mistake, not a sequence
            raise ConfigError(f"overrides '{given[key]}' and '{text}' both set {key}; keep one")
        given[key] = text
        values[key] = yaml.safe_load(text.partition("=")[2]) if "=" in text else None
        hydra.append(text)
    run_dir, subdir = values.get("hydra.run.dir"), values.get("hydra.output_subdir")
    if "hydra.run.dir" in values and not (isinstance(run_dir, str) and run_dir.strip()):
        raise ConfigError(f"hydra.run.dir: expected a folder, got {run_dir!r}")
    if subdir is not None and (not isinstance(subdir, str) or subdir in ("", ".", "..")
                               or "/" in subdir or is_written_name(subdir)):
        raise ConfigError(f"hydra.output_subdir: expected a folder name inside the run folder "
                          f"(no '/'), other than {WRITTEN_TEXT}, or null; got {subdir!r}")
    if run_dir is not None:
        given = [t for t in workload if t.strip().lstrip("+").removeprefix("workload.")
                 .startswith("output.folder=")]
        if given:
            raise ConfigError(f"overrides '{given[0]}' and hydra.run.dir={run_dir} both set the "
                              f"output folder (DLIO's is Hydra's run folder); keep one")
        workload.append(f"output.folder={run_dir}")
    return workload, hydra, HydraRun(run_dir, subdir, config_dir, tuple(
        t for t in overrides if _hydra_key(t) is None))


def workload_choice(source: str) -> str | None:
    """The workload `source` names as Hydra's config group choice (`workload=NAME`, or a bare
    name that is not a YAML path), else None (a path)."""
    if source.startswith("workload="):
        return source[len("workload="):]
    if "/" in source or source.endswith((".yaml", ".yml")):
        return None
    return source


def resolve_source(source: str, config_dir: str | None) -> str:
    """The workload `source` with --config-dir DIR: DIR/workload/NAME.yaml, which must be a
    regular file (Hydra reads it; a shipped file of that name runs only without
    --config-dir, so that no other file runs unnoticed); `source` as it is without one."""
    if config_dir is None:
        return source
    if not os.path.isdir(config_dir):
        raise ConfigError(f"--config-dir: {config_dir} is not a folder; expected the folder "
                          f"whose workload/NAME.yaml holds the workloads")
    name = workload_choice(source)
    if name is None or not name or name.startswith("/"):
        raise ConfigError(f"--config-dir {config_dir}: takes workload=NAME (its "
                          f"workload/NAME.yaml), got the workload {source!r}; give "
                          "workload=NAME, or the YAML path without --config-dir")
    candidate = os.path.abspath(os.path.join(config_dir, "workload", f"{name}.yaml"))
    try:  # a stat, never an open: a FIFO there must not block
        mode = os.stat(candidate).st_mode
    except OSError as exc:
        raise ConfigError(f"--config-dir {config_dir}: no workload file {candidate} "
                          f"({exc.strerror}); expected workload={name}'s YAML file there "
                          "(the shipped workloads run only without --config-dir)") from None
    if not stat.S_ISREG(mode):
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ConfigError(f"--config-dir {config_dir}: {candidate} is {what}; expected "
                          f"workload={name}'s YAML file there")
    return candidate
