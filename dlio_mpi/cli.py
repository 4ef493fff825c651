"""The command line: dlio-mpi run, generate, validate, list-workloads, pack, calibrate,
datasize and report.

Every rank runs this. Errors the ranks agree on (bad configuration, missing data, a batch that
failed in training: its step's allreduce tells every rank) are printed once by rank 0 and every
rank exits with status 2; any other exception on any rank is printed by that rank and aborts
the whole job (MPI_Abort), so no rank waits forever for a dead peer."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import replace

from .mpi.launcher import launcher_rank

ABORT_GRACE_SECONDS = 0.5
USAGE = """dlio-mpi COMMAND [CONFIG] [KEY=VALUE ...]

CONFIG is a workload YAML path, a shipped workload name (see list-workloads) or workload=NAME;
overrides are section.key=value or DLIO's ++workload.section.key=value.
dlio-mpi report OUT [OUT ...] [--output DIR] draws a run's results (no MPI needed).
dlio-mpi calibrate CONFIG [KEY=VALUE ...] --workers W --out FILE.yaml measures the real torch
DataLoader pipeline in one process (no MPI) and writes the workload calibrated from it
(dlio-mpi calibrate --help).
dlio-mpi pack CONFIG [KEY=VALUE ...] --to DIR [--samples-per-shard K] merges a dataset of
one sample per file into indexed_binary shards and prints the overrides that read them.
dlio-mpi datasize CONFIG [KEY=VALUE ...] --accelerators N [--hosts H] --host-memory-gb M prints
the files MLPerf Storage's sizing rule asks for (no MPI; dlio-mpi datasize --help)."""


class _Parser(argparse.ArgumentParser):
    """argparse printing on the first rank only: every rank parses the same command line, so
    a usage error (or --help) would otherwise be printed once per rank."""

    def _print_message(self, message: str, file=None) -> None:
        if launcher_rank() == 0:
            super()._print_message(message, file)

    json_errors = False  # validate --json: a usage error is a JSON object on stdout too

    def error(self, message: str):
        """Usage, then the agreed one-line error; exit status 2."""
        self.print_usage(sys.stderr)
        if self.json_errors and launcher_rank() == 0:
            print(json.dumps({"error": message, "key": None, "status": 2}), flush=True)
        self.exit(2, f"dlio-mpi: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dlio-mpi", usage=USAGE,
                     description="Replay the I/O of a deep-learning training job on MPI ranks "
                                 "and measure it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, text in (("run", "generate (if configured) and train; write results"),
                       ("generate", "generate the dataset only"),
                       ("validate", "check the configuration and print the plan; no I/O")):
        cmd = sub.add_parser(name, help=text, description=text, prog=f"dlio-mpi {name}")
        cmd.add_argument("args", nargs="*", metavar="CONFIG|KEY=VALUE")
        cmd.add_argument("--config-dir", "-cd", metavar="DIR", default=None,
                         help="as DLIO's (Hydra's): workload=NAME is DIR/workload/NAME.yaml "
                              "where that file exists")
        if name == "validate":
            cmd.add_argument("--ranks", type=int, default=None,
                             help="plan for this many ranks (default: the MPI job's size)")
            cmd.add_argument("--json", action="store_true",
                             help="print the plan as one JSON object instead of text")
    text = ("merge the workload's dataset (one sample per file) into indexed_binary shards in "
            "DIR; print the overrides that read them")
    pack = sub.add_parser("pack", help=text, description=text, prog="dlio-mpi pack")
    pack.add_argument("args", nargs="*", metavar="CONFIG|KEY=VALUE")
    pack.add_argument("--to", metavar="DIR", required=True, help="the packed dataset's folder")
    pack.add_argument("--samples-per-shard", metavar="K", type=int, default=None,
                      help="samples per shard (default: shards of at most 256 MiB)")
    text = ("measure the workload's real torch DataLoader pipeline (one process, no MPI) and "
            "write it calibrated: dlio-mpi calibrate --help")
    sub.add_parser("calibrate", help=text, description=text, prog="dlio-mpi calibrate",
                   add_help=False)
    text = ("the training files MLPerf Storage's sizing rule asks for (one process, no MPI): "
            "dlio-mpi datasize --help")
    sub.add_parser("datasize", help=text, description=text, prog="dlio-mpi datasize",
                   add_help=False)
    sub.add_parser("list-workloads", help="list the shipped workload names",
                   prog="dlio-mpi list-workloads")
    text = ("plots and an HTML page of finished runs' results in OUT/report (needs "
            "matplotlib; no MPI)")
    report = sub.add_parser("report", help=text, description=text, prog="dlio-mpi report")
    report.add_argument("folders", nargs="+", metavar="OUT",
                        help="a run's output.folder; several are also compared")
    report.add_argument("--output", metavar="DIR", default=None,
                        help="where the comparison of several runs goes (default: the first "
                             "OUT's report folder)")
    return parser


def _load(args):
    """(configuration, workload source, its overrides, Hydra's record to write, the workload
    file's absolute path, whether output.folder is Hydra's run folder) of the command line:
    DLIO's own included (--config-dir, ++hydra.run.dir, ++hydra.output_subdir)."""
    from .config import load_config, split_args
    from .config.hydra import resolve_source, split_hydra, workload_choice
    from .config.loader import source_file

    source, given = split_args(args.args)
    config_dir = getattr(args, "config_dir", None)  # pack has none
    overrides, hydra_given, hydra = split_hydra(given, config_dir)
    name = workload_choice(source)
    if name is not None:  # a workload named, as Hydra's config group choice
        hydra = replace(hydra, task_overrides=(f"workload={name}", *hydra.task_overrides))
    source = resolve_source(source, config_dir)
    cfg = load_config(source, overrides)
    if cfg.output.log_file == hydra.output_subdir:
        from .config import ConfigError

        raise ConfigError(f"hydra.output_subdir: {hydra.output_subdir!r} is output.log_file's "
                          "name; expected another folder name")
    record = hydra.record_files(cfg.to_dict(), hydra_given, name)
    return cfg, source, overrides, record, source_file(source), hydra.run_dir is not None


def _command(args, comm) -> int:
    from .config import ConfigError
    from .errors import UserError, check_all, on_root, stop_if_asked

    cfg, source, overrides, hydra_record, workload_file, run_dir = check_all(
        comm, lambda: _load(args), expected=(ConfigError, UserError, OSError))
    stop_if_asked(comm)  # a signal during start-up (imports, MPI_Init, the loading)
    if args.command == "validate":
        from .plan.derive import derive_plan, derive_plan_everywhere
        from .plan.render import plan_record, render_plan

        ranks = comm.Get_size() if args.ranks is None else args.ranks

        local_ranks = _ranks_on_this_host(comm)

        def plan_for_ranks():
            if ranks < 1:
                raise UserError(f"--ranks {ranks}: a plan needs at least 1 rank")
            return derive_plan(cfg, ranks, local_ranks=local_ranks)

        plan = derive_plan_everywhere(comm, plan_for_ranks)
        if comm.Get_rank() == 0:
            from .config import is_given
            from .plan.datasize import validate_warnings

            given = is_given(source, overrides, "dataset.record_length_bytes")
            record = plan_record(plan, cfg, warnings=_space_warnings(cfg, plan)
                                 + validate_warnings(cfg, plan, given),
                                 workload_file=workload_file)
            print(json.dumps(record, indent=2) if args.json else render_plan(record))
        return 0
    if args.command == "pack":
        return _pack(comm, cfg, source, overrides, args.to, args.samples_per_shard)
    from . import progress
    from .data.generate import check_dataset_space
    from .run import data_root, prepare, run, run_generation

    progress.configure(comm.Get_rank(), cfg.output.progress_interval)

    if args.command == "generate":
        plan = prepare(comm, cfg, generating=True)[0]
        on_root(comm, lambda: check_dataset_space(data_root(cfg), plan.dataset_bytes))
        run_generation(comm, cfg, plan, check_every_file=True)
        return 0
    run(comm, cfg, workload=workload_file, hydra_record=hydra_record, hydra_run_dir=run_dir)
    return 0


def _pack(comm, cfg, source: str, overrides: list[str], folder: str,
          per_shard: int | None) -> int:
    from .data.pack import OVERRIDES_NAME, pack

    done = pack(comm, cfg, source, overrides, folder, per_shard)
    if comm.Get_rank() == 0:
        what = ("already complete, left as it is" if done["already_complete"] else
                f"{done['bytes_written'] / 2**20:,.1f} MiB written")
        print(f"packed into {done['shards']} indexed_binary shards of "
              f"{done['samples_per_shard']} samples of {done['sample_bytes']} bytes under "
              f"{done['folder']} ({what}); the overrides (also in "
              f"{os.path.join(done['folder'], OVERRIDES_NAME)}) that read it:")
        print(" ".join(done["overrides"]))
        print(f"run it with: dlio-mpi run {source} {' '.join(done['run_overrides'])}",
              flush=True)
    return 0


def _space_warnings(cfg, plan) -> tuple[str, ...]:
    """validate: why `run` would refuse to generate the dataset, write the checkpoints or
    fill the cache tier on the storage at hand (not enough free space), as warnings; the
    configuration itself is valid."""
    from .data.generate import check_dataset_space
    from .errors import UserError
    from .run import data_root

    warnings = []
    if cfg.workflow.generate_data and plan.splits:
        try:
            check_dataset_space(data_root(cfg), plan.dataset_bytes)
        except (UserError, OSError) as exc:
            warnings.append(f"run would refuse: {exc}")
    if plan.checkpoint is not None:
        from .checkpoint.phase import space_warning

        warnings.append(space_warning(cfg, plan))
    if cfg.reader.cache is not None and cfg.workflow.train:
        from .tiers.cache import capacity_warning

        warnings.append(capacity_warning(cfg.reader.cache))
    return tuple(w for w in warnings if w)


def _print_json_error(message: str, status: int) -> None:
    """validate --json refusing the configuration: one JSON object on stdout, for scripts,
    with the message (also on stderr), the configuration key it is about (null when unknown)
    and the exit status."""
    from .config.schema import message_key

    print(json.dumps({"error": message, "key": message_key(message), "status": status}),
          flush=True)


def _ranks_on_this_host(comm) -> int:
    """Collectively: how many ranks of `comm` share this host."""
    from mpi4py import MPI

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    size = host.Get_size()
    host.Free()
    return size


def _report(folders: list[str], output: str | None) -> int:
    """dlio-mpi report: run by one process, without MPI (mpi4py.MPI is never imported)."""
    from .errors import UserError, describe
    from .report import make_report

    try:
        written = make_report(folders, output)
    except UserError as exc:
        print(f"dlio-mpi: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:  # one the report does not name itself: describe names the file
        print(f"dlio-mpi: error: report: {describe(exc)}", file=sys.stderr, flush=True)
        return 2
    for path in written:
        if path.endswith(".html") or path.endswith(".csv"):
            print(path)
    return 0


def _record_stops() -> None:
    """From here on SIGINT and SIGTERM are recorded by the C core (the run's stop handling)
    rather than raising KeyboardInterrupt: a rank ending alone during start-up would leave the
    others waiting in MPI_Init or a collective, or take them down with MPI_Abort. The ranks
    agree on a stop once the configuration is loaded (errors.stop_if_asked); a second signal
    ends the process at once."""
    from . import _core

    _core.stop_on_signals()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["calibrate"]:  # its own options; one process, no MPI (calibrate/)
        from .calibrate.command import main as calibrate

        return calibrate(argv[1:])
    if argv[:1] == ["datasize"]:  # its own options; one process, no MPI (plan/datasize.py)
        from .plan.datasize import main as datasize

        return datasize(argv[1:])
    parser = _parser()
    _Parser.json_errors = argv[:1] == ["validate"] and "--json" in argv
    # Options may follow the overrides (validate demo x=1 --ranks 4): collect the leftovers.
    args, rest = parser.parse_known_args(argv)
    unknown = [arg for arg in rest if arg.startswith("-")]
    if unknown:
        hint = ""
        if any("=" in arg or "." in arg for arg in unknown):
            hint = (f" (overrides take no dashes: "
                    f"{unknown[0].lstrip('-')}; options: --ranks and --json for validate, --help)")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if rest:
        args.args = [*getattr(args, "args", []), *rest]
    if args.command == "report":
        return _report([*args.folders, *rest], args.output)
    if args.command == "list-workloads":
        from .config import list_workloads

        print("\n".join(list_workloads()))
        return 0
    _record_stops()  # before MPI_Init and the loading of the configuration
    from mpi4py import MPI

    from .errors import JobError, describe

    comm = MPI.COMM_WORLD
    try:
        return _command(args, comm)
    except JobError as exc:
        if comm.Get_rank() == 0:
            print(f"dlio-mpi: {exc.heading}{exc}", file=sys.stderr, flush=True)
            if args.command == "validate" and args.json:
                _print_json_error(str(exc), exc.exit_status)
        return exc.exit_status
    except BaseException as exc:  # noqa: B036 - any failure must abort the whole job
        if os.environ.get("DLIO_MPI_DEBUG"):
            traceback.print_exc()
        what = describe(exc)
        # one write, so that the lines of ranks failing together do not run into each other
        sys.stderr.flush()
        os.write(2, f"dlio-mpi: rank {comm.Get_rank()}: error: {what}\n".encode())
        # MPI_Abort has the launcher kill every process, which can drop output it has not
        # forwarded yet: give it a moment to pass this rank's message on first.
        time.sleep(ABORT_GRACE_SECONDS)
        comm.Abort(1)
        return 1
