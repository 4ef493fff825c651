"""MLPerf Storage's dataset sizing rule: the fewest training files a run may use for its
accelerators and its client hosts' memory (`dlio-mpi datasize`, and validate's warning).

The rule (MLPerf Storage Rules.md, 3.1.2 trainingRecalculateDatasetSize): at least 500 steps
of `batch` samples on every accelerator, and at least 5 times the client hosts' total memory
(GiB, 1024^3 bytes) in samples of `record_length_bytes`, whichever needs more. Computed as
mlpstorage's `datasize` step does (mlcommons/storage, mlpstorage/rules/utils.py,
calculate_training_data_size, commit 4234cd9b37e760b096855c452f40a37f70c18a4f; its output:
mlpstorage/benchmarks/dlio.py, TrainingBenchmark.datasize, commit
23aa82edc1f0d66a4ccae6181d66a2c18472aeac): each bound in whole files, rounded down (floor),
the larger kept; the disk space is files x samples per file x record length. MLPerf rounds
down, so its count can fall a file short of either bound; a closed submission must use
exactly its number, so we print the same number rather than a rounded-up one.

The record length is `record_length_bytes` where the workload gives it, even where parquet
columns make the rows otherwise (dlrm_parquet_h100: 512 given, rows of 160); a parquet
workload that gives none is sized by its columns as mlpstorage counts them (MLPERF_DTYPE_BYTES),
and any other such workload by DLIO's default record length, where mlpstorage takes 0 and so
only the steps' bound."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import sys
from dataclasses import dataclass

from ..errors import UserError

MIN_STEPS = 500               # steps per epoch on every accelerator
HOST_MEMORY_MULTIPLIER = 5    # the dataset is this many times the hosts' memory
GIB = 1024 ** 3               # mlpstorage's "GB" of memory and of disk space
FILES_PER_FOLDER = 10_000     # above this mlpstorage suggests subfolders
RULE = "MLPerf Storage's dataset sizing rule (Rules.md 3.1.2)"
# mlpstorage's bytes per value of a parquet column without record_length_bytes (same file):
# these, and 4 for every other dtype (float16, int8 and int16 included)
MLPERF_DTYPE_BYTES = {"float64": 8, "int64": 8, "uint8": 1, "bool": 1}


@dataclass(frozen=True)
class Sizing:
    """What the rule asks of a workload on `accelerators` ranks and `hosts` client hosts
    holding `memory_bytes` together."""

    accelerators: int
    hosts: int
    memory_bytes: float
    batch_size: int
    samples_per_file: int
    record_bytes: float
    files_by_steps: int     # 500 steps x batch x accelerators, in whole files (floor)
    files_by_memory: int    # 5 x memory over the file size, in whole files (floor)

    @property
    def files(self) -> int:
        return max(self.files_by_steps, self.files_by_memory)

    @property
    def samples(self) -> int:
        return self.files * self.samples_per_file

    @property
    def disk_bytes(self) -> float:
        return self.files * self.samples_per_file * self.record_bytes

    @property
    def memory_bound(self) -> bool:
        """Is the count set by the memory bound? (MLPerf: only when strictly larger.)"""
        return self.files_by_memory > self.files_by_steps

    @property
    def subfolders(self) -> int:
        """The dataset.num_subfolders_train mlpstorage suggests (0: no suggestion)."""
        return int(self.files / FILES_PER_FOLDER) if self.files > FILES_PER_FOLDER else 0


def required(accelerators: int, hosts: int, memory_bytes: float, batch_size: int,
             samples_per_file: int, record_bytes: float) -> Sizing:
    """The rule for `accelerators` ranks on `hosts` hosts of `memory_bytes` together."""
    file_bytes = samples_per_file * record_bytes
    # Python's floor division, in mlpstorage's order, so float record lengths (resnet50's
    # 114660.07) give its numbers exactly.
    by_memory = int(HOST_MEMORY_MULTIPLIER * memory_bytes // file_bytes)
    by_steps = MIN_STEPS * accelerators * batch_size // samples_per_file
    return Sizing(accelerators, hosts, memory_bytes, batch_size, samples_per_file,
                  record_bytes, by_steps, by_memory)


def record_bytes(cfg, record_given: bool = True) -> float:
    """The record length the rule takes (see the module): `record_given` says whether the
    workload gives dataset.record_length_bytes."""
    ds = cfg.dataset
    if record_given or ds.format != "parquet" or not ds.parquet.columns:
        return ds.record_length_bytes
    return sum(MLPERF_DTYPE_BYTES.get(c.dtype, 4) * c.size for c in ds.parquet.columns)


def sizing_for(cfg, accelerators: int, hosts: int, memory_bytes: float,
               record_given: bool = True) -> Sizing:
    """The rule applied to a configuration's batch, samples per file and record length."""
    ds = cfg.dataset
    return required(accelerators, hosts, memory_bytes, cfg.reader.batch_size,
                    ds.num_samples_per_file, record_bytes(cfg, record_given))


def sizing_text(s: Sizing, source: str, overrides: list[str]) -> list[str]:
    """The lines `dlio-mpi datasize` prints: mlpstorage's, then the overrides to use."""
    per_host = s.memory_bytes / s.hosts / GIB
    lines = [
        f"{RULE} for {source}: {s.accelerators} accelerator(s), {s.hosts} host(s) of "
        f"{per_host:g} GiB",
        f"  {MIN_STEPS} steps x batch {s.batch_size} x {s.accelerators} accelerator(s) = "
        f"{MIN_STEPS * s.batch_size * s.accelerators} samples: {s.files_by_steps} files",
        f"  {HOST_MEMORY_MULTIPLIER} x {s.memory_bytes / GIB:g} GiB of host memory / "
        f"({s.samples_per_file} x {_bytes(s.record_bytes)}-byte samples per file): "
        f"{s.files_by_memory} files",
        f"Number of training files: {s.files}",
        f"Number of training samples: {s.samples}",
        "Number of training subfolders: 0",
        f"Total disk space required for training: {s.disk_bytes / GIB:.2f} GB",
        "Minimum file count dictated by " + (
            "dataset size to memory size ratio." if s.memory_bound else
            f"{MIN_STEPS} step requirement of given accelerator count and batch size."),
    ]
    if s.subfolders:
        lines.append(f"note: {s.files} files in one folder may be slow on some file systems; "
                     f"dataset.num_subfolders_train={s.subfolders} keeps near "
                     f"{FILES_PER_FOLDER:,} files per folder")
    mine = [o for o in overrides if not _sets(o, "dataset.num_files_train")]
    lines.append(f"overrides: dataset.num_files_train={s.files}")
    lines.append("run it with: " + shlex.join(
        ["dlio-mpi", "run", source, *mine, f"dataset.num_files_train={s.files}"]))
    return lines


def _bytes(x: float) -> str:
    """A record length as the workload gives it (146600628, 114660.07)."""
    return str(int(x)) if float(x).is_integer() else str(x)


def _sets(override: str, key: str) -> bool:
    """Does `override` (KEY=VALUE or DLIO's ++workload.KEY=VALUE) set `key`?"""
    name = override.split("=", 1)[0].lstrip("+")
    return name.removeprefix("workload.") == key


# the models of MLPerf Storage's training workloads (v1.0-v2.0 and its 2026 files), whose
# datasets the rule sizes; a workload of another model (the demo, bert, llama) is not warned
MLPERF_TRAINING_MODELS = ("unet3d", "resnet50", "cosmoflow", "retinanet", "flux", "dlrm")


def validate_warnings(cfg, plan, record_given: bool = True) -> tuple[str, ...]:
    """validate: the rule's warning when a run of an MLPerf Storage training model trains on
    fewer files than the rule asks for its ranks (the accelerators) and its nodes with the
    plan's memory (this host's MemTotal per node, emulated nodes included); empty when it
    meets the rule, does not train, or is of another model."""
    if not cfg.workflow.train or "train" not in plan.splits or \
            cfg.model.name not in MLPERF_TRAINING_MODELS:
        return ()  # the rule sizes MLPerf Storage's training benchmarks, not any workload
    s = sizing_for(cfg, plan.ranks, plan.nodes, plan.memory_bytes, record_given)
    if plan.train_files >= s.files:
        return ()
    bound = (f"{HOST_MEMORY_MULTIPLIER} x the hosts' {plan.memory_bytes / GIB:.1f} GiB"
             if s.memory_bound else
             f"{MIN_STEPS} steps x batch {s.batch_size} x {plan.ranks} ranks")
    return (f"dataset.num_files_train={plan.train_files} is below {RULE}: {plan.ranks} "
            f"rank(s) on {plan.nodes} host(s) need {s.files} files ({bound}); dlio-mpi "
            f"datasize with this workload and --accelerators {plan.ranks} --hosts "
            f"{plan.nodes} --host-memory-gb {plan.memory_bytes / plan.nodes / GIB:.2f} prints "
            "the overrides",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlio-mpi datasize",
        description=f"Print the training files and samples {RULE} asks for (as MLPerf "
                    "Storage's datasize step), and the override that sets them; no MPI.")
    p.add_argument("args", nargs="*", metavar="WORKLOAD|KEY=VALUE")
    p.add_argument("--accelerators", required=True, metavar="N",
                   help="emulated accelerators (ranks) of the run, all hosts together")
    p.add_argument("--hosts", default="1", metavar="H",
                   help="client hosts running them (default 1)")
    p.add_argument("--host-memory-gb", required=True, metavar="M",
                   help="memory of each client host in GiB (1024^3 bytes), as MemTotal")
    return p


# Bounds of the options: far beyond any machine (the largest jobs run some 10^5 accelerators
# on 10^4 hosts of a few TiB), and small enough that the rule's arithmetic stays exact
MAX_ACCELERATORS = 1 << 24
MAX_HOST_MEMORY_GB = 1 << 20  # 1 PiB a host


def _whole(option: str, text: str, maximum: int) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= maximum:
        raise UserError(f"{option} {text}: expected a whole number from 1 to {maximum:,}")
    return int(text)


def _memory_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_HOST_MEMORY_GB):
        raise UserError(f"--host-memory-gb {text}: expected a number of GiB > 0 and <= "
                        f"{MAX_HOST_MEMORY_GB:,} (each host's memory)")
    return int(value) if value.is_integer() else value


def _machine(args) -> tuple[int, int, float]:
    """(accelerators, hosts, GiB per host) of the options, or UserError naming the one."""
    accelerators = _whole("--accelerators", args.accelerators, MAX_ACCELERATORS)
    hosts = _whole("--hosts", args.hosts, MAX_ACCELERATORS)
    if hosts > accelerators:
        raise UserError(f"--hosts {hosts}: more hosts than --accelerators {accelerators}; "
                        "expected at most one host per accelerator (each host runs at "
                        "least one)")
    return accelerators, hosts, _memory_gb(args.host_memory_gb)


def main(argv: list[str]) -> int:
    """dlio-mpi datasize, in this process (no MPI); its exit status (2 for bad input).
    Started by mpiexec, every process computes the same and only the launcher's rank 0
    prints."""
    from ..mpi.launcher import launcher_rank

    if launcher_rank() != 0:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), \
                contextlib.redirect_stderr(quiet):
            return _main(argv)
    return _main(argv)


def _main(argv: list[str]) -> int:
    from ..config import ConfigError, is_given, load_config, split_args

    args = parser().parse_intermixed_args(argv)
    try:
        accelerators, hosts, memory_gb = _machine(args)
        source, overrides = split_args(args.args)
        cfg = load_config(source, overrides)
        record_given = is_given(source, overrides, "dataset.record_length_bytes")
        if not cfg.workflow.train:
            raise UserError(f"{source}: workflow.train is false; the sizing rule is for "
                            "training workloads")
    except (UserError, ConfigError) as exc:
        print(f"dlio-mpi datasize: error: {exc}", file=sys.stderr, flush=True)
        return 2
    # mlpstorage's order: GiB per host, times the hosts
    s = sizing_for(cfg, accelerators, hosts, memory_gb * 1024 * 1024 * 1024 * hosts,
                   record_given)
    print("\n".join(sizing_text(s, source, overrides)), flush=True)
    return 0
