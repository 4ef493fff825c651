#!/usr/bin/env python3
"""Collect the points of a striping study (study.sbatch) into one CSV, a row per point.

    python scripts/striping/collect.py OUT_ROOT [FOLDER ...] --output study.csv [--all]

A point is a dlio-mpi output folder (one holding dlio_mpi_results.json or summary.json) given
or found under the folders given; its study is the name of the folder above it. A study's
OUT_ROOT holds the list of the points it ran (study-points.txt, written by study.sbatch): then
only those are collected, one row each, and the other points found there (an earlier study's)
are named on stderr and left out; --all collects every point found. A listed point whose run
failed before writing results, so that its folder still holds an earlier run's, gets a row
with its status and none of those results. The figures
(training phase only) and what was found on the storage come from summary.json as dlio-mpi
wrote it, nothing is recomputed; the striping requested comes from the resolved configuration
the run wrote beside it (config.yaml), since summary.json only has it inside the lfs command
line. A point without summary.json (a failed run) still gets a row, with its status.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

SUMMARY = "summary.json"
RESULTS = "dlio_mpi_results.json"  # written by every run, from its start
CONFIG = "config.yaml"
LOG = ".log"  # study.sbatch writes the launcher's output of point P beside it, in P.log
POINTS = "study-points.txt"  # study.sbatch's list of the points it ran, in OUT_ROOT
POINTS_HEADER = "# dlio-mpi striping study"  # how that list starts
# effective MPI-IO hints worth a column beside those requested
CB_HINTS = ("romio_cb_read", "cb_nodes", "cb_buffer_size", "striping_factor", "striping_unit")


@dataclass(frozen=True)
class Point:
    folder: Path
    summary: dict[str, Any]  # {} without summary.json
    config: dict[str, Any]   # config.yaml's workload section; {} without it
    state: str | None        # the results manifest's state (running, complete, failed, ...)
    earlier: bool = False    # its run failed before writing results: the folder's are older


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fp:
            value = json.load(fp)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_point(folder: Path, earlier: bool = False) -> Point:
    if earlier:  # nothing of an earlier run's results
        return Point(folder, {}, {}, None, earlier=True)
    try:
        config = yaml.safe_load((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        config = None
    workload = config.get("workload") if isinstance(config, dict) else None
    return Point(folder, read_json(folder / SUMMARY),
                 workload if isinstance(workload, dict) else {},
                 read_json(folder / RESULTS).get("state"))


def is_point(folder: Path) -> bool:
    return (folder / RESULTS).is_file() or (folder / SUMMARY).is_file()


def points_under(path: Path) -> set[Path]:
    """The output folders under `path`; under a study's OUT_ROOT also the folder of every
    STUDY/POINT.log (the launcher's output), so that a point that failed before writing
    results has a row too."""
    found = {p.parent for name in (RESULTS, SUMMARY) for p in path.rglob(name)}
    found.update(log.with_suffix("") for log in path.glob(f"*/*{LOG}")
                 if not is_point(log.parent))  # not a run's own log (dlio.log)
    return found


def read_points_list(path: Path) -> tuple[list[Path], set[Path]]:
    """A study's list of points (study-points.txt in its OUT_ROOT): the folders of the points
    it ran, and of those that failed before writing results (their folders hold an earlier
    run's)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"collect.py: cannot read {path}: {exc}") from exc
    if not lines or not lines[0].startswith(POINTS_HEADER):
        raise SystemExit(f"collect.py: {path} is not a list of points of study.sbatch; "
                         "give --all to collect every point found")
    ran: list[Path] = []
    earlier: set[Path] = set()
    for line in lines[1:]:
        word, _, name = line.partition(" ")
        if word == "point" and name:
            ran.append(path.parent / name)
        elif word == "earlier" and name:
            earlier.add(path.parent / name)
    return ran, earlier


def find_points(paths: list[Path], everything: bool = False) -> tuple[list[Path], set[Path]]:
    """The output folders given or under the folders given, sorted, each once; under a
    folder holding a study's list of points (unless `everything`), only the points listed,
    the others named on stderr. Also the points whose folders hold an earlier run's results."""
    found: set[Path] = set()
    earlier: set[Path] = set()
    for path in paths:
        if is_point(path):
            found.add(path)
        elif not everything and (path / POINTS).is_file():
            listed, older = read_points_list(path / POINTS)
            found.update(listed)
            earlier.update(older)
            others = sorted(points_under(path) - set(listed))
            if others:
                print(f"collect.py: left out {len(others)} point(s) in {path} that its study "
                      f"did not run ({path / POINTS} lists those it ran; --all collects every "
                      "point): " + ", ".join(str(p.relative_to(path)) for p in others),
                      file=sys.stderr)
        else:
            found.update(points_under(path))
    return sorted(found), earlier


# --------------------------------------------------------------------------- cells
def dig(tree: Any, *keys: str) -> Any:
    """tree[k1][k2]..., None where a key is missing."""
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def pairs(mapping: Any) -> str | None:
    """{"a": 1, "b": 2} as "a=1;b=2"; None for no mapping."""
    if not isinstance(mapping, dict):
        return None
    return ";".join(f"{k}={v}" for k, v in mapping.items())


def status(point: Point) -> str:
    if point.earlier:
        return "failed before writing results (its folder holds an earlier run's, left out)"
    if not point.summary:
        if point.state is None:
            return "failed before writing results"
        return f"failed: no summary.json (results manifest: {point.state})"
    if dig(point.summary, "dlio_mpi", "complete") is False:
        return f"incomplete (stopped by {dig(point.summary, 'dlio_mpi', 'stopped_by')})"
    return "complete"


def train_reader(point: Point) -> dict[str, Any]:
    return dig(point.summary, "dlio_mpi", "readers", "train") or {}


def hints_effective(point: Point) -> str | None:
    """The hints in effect (read back) of those requested and the collective-buffering ones."""
    reader = train_reader(point)
    effective = reader.get("hints_effective")
    if not isinstance(effective, dict):
        return None
    names = [*(reader.get("hints_requested") or {}), *CB_HINTS]
    return pairs({n: effective[n] for n in dict.fromkeys(names) if n in effective})


def mismatch(point: Point) -> str | None:
    """What the layout read back after lfs setstripe differs in from the request."""
    found = dig(point.summary, "dlio_mpi", "striping", "mismatch")
    if not isinstance(found, dict):
        return None
    return ";".join(f"{k}: requested {dig(v, 'requested')}, found {dig(v, 'found')}"
                    for k, v in found.items())


def data_file_layout(point: Point, key: str) -> Any:
    """`key` of the layout the first data file took (lfs getstripe, Lustre only); a
    composite layout's components are joined with "|"; an lfs error for key "error"."""
    layout = dig(point.summary, "dlio_mpi", "filesystems", "data_file", "stripe_layout")
    if not isinstance(layout, dict):
        return None
    values = [part.get(key) for part in layout.get("components", [layout])]
    if all(v is None for v in values):
        return None
    return values[0] if len(values) == 1 else "|".join("" if v is None else str(v)
                                                         for v in values)


def launcher_log(point: Point) -> str | None:
    log = point.folder.with_name(point.folder.name + LOG)
    return str(log) if log.is_file() else None


Cell = Callable[[Point], Any]


def summary(*keys: str) -> Cell:
    return lambda point: dig(point.summary, *keys)


def metric(name: str) -> Cell:
    return summary("metric", name)


def ours(*keys: str) -> Cell:
    return summary("dlio_mpi", *keys)


def requested_stripe(key: str) -> Cell:
    return lambda point: dig(point.config, "storage", "lustre", key)


def layout(key: str) -> Cell:
    return lambda point: data_file_layout(point, key)


COLUMNS: dict[str, Cell] = {
    "study": lambda point: point.folder.parent.name,
    "point": lambda point: point.folder.name,
    "status": status,
    # what was asked for
    "stripe_count": requested_stripe("stripe_count"),
    "stripe_size": requested_stripe("stripe_size"),
    "stripe_pool": requested_stripe("pool"),
    "file_access": ours("readers", "train", "file_access"),
    "hints": lambda point: pairs(train_reader(point).get("hints_requested")),
    "ranks": summary("num_accelerators"),
    "nodes": summary("num_hosts"),
    "epochs": summary("epochs"),
    # what was measured (DLIO's fields, then ours)
    "AU_percent": metric("train_au_mean_percentage"),
    "AU_stdev": metric("train_au_stdev_percentage"),
    "AU_meets_expectation": metric("train_au_meet_expectation"),
    "samples_per_s": metric("train_throughput_mean_samples_per_second"),
    "MB_per_s": metric("train_io_mean_MB_per_second"),
    "transfer_MiB_per_s": metric("train_transfer_mean_MiB_per_second"),
    "read_latency_p50_ms": metric("train_read_latency_p50_ms"),
    "read_latency_p99_ms": metric("train_read_latency_p99_ms"),
    "bytes_transferred": metric("train_bytes_transferred"),
    "file_opens": metric("train_file_opens"),
    # what was found on the storage
    "fs_type": ours("filesystems", "data_folder", "type"),
    "fs_mount_point": ours("filesystems", "data_folder", "mount_point"),
    "fs_device": ours("filesystems", "data_folder", "device"),
    "striping_status": ours("striping", "status"),
    "setstripe_command": ours("striping", "command"),
    "striping_mismatch": mismatch,
    "striping_note": ours("striping", "note"),
    "file_stripe_count": layout("stripe_count"),
    "file_stripe_size": layout("stripe_size"),
    "file_stripe_pool": layout("pool"),
    "file_layout_error": layout("error"),
    "mpi_library": ours("readers", "train", "mpi_library"),
    "mpiio_implementation": ours("readers", "train", "mpiio_implementation"),
    "mpiio_fs_driver": ours("readers", "train", "hints_effective", "romio_filesystem_type"),
    "hints_effective": hints_effective,
    "data_folder": ours("filesystems", "data_folder", "path"),
    "output_folder": lambda point: str(point.folder),
    "log": launcher_log,
}


def cell(value: Any) -> Any:
    """A CSV cell: empty for missing, JSON for anything not a plain value."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def rows(folders: list[Path], earlier: set[Path] | None = None) -> list[dict[str, Any]]:
    points = [read_point(folder, folder in (earlier or ())) for folder in folders]
    return [{name: cell(get(point)) for name, get in COLUMNS.items()} for point in points]


def write_csv(table: list[dict[str, Any]], output: Path) -> None:
    """Write the CSV; a file of that name is replaced only when it is one of ours (an
    earlier collection, whose header starts as ours does)."""
    if output.exists():
        with open(output, encoding="utf-8", errors="replace", newline="") as fp:
            if not fp.readline().startswith(",".join(list(COLUMNS)[:3]) + ","):
                raise SystemExit(f"collect.py: {output} exists and is not a CSV of this "
                                 "script; not replacing it")
    with open(output, "w", encoding="utf-8", newline="") as fp:
        writer = csv.DictWriter(fp, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path,
                        help="output folders, or folders holding them (OUT_ROOT)")
    parser.add_argument("--output", "-o", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--all", action="store_true", dest="everything",
                        help=f"collect every point found, also those not in a study's {POINTS}")
    args = parser.parse_args(argv)
    folders, earlier = find_points(args.folders, args.everything)
    if not folders:
        print(f"collect.py: no dlio-mpi output folder in {', '.join(map(str, args.folders))}",
              file=sys.stderr)
        return 1
    table = rows(folders, earlier)
    write_csv(table, args.output)
    done = sum(row["status"] == "complete" for row in table)
    print(f"{len(table)} point(s), {done} complete: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
