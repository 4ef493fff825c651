"""Drive dlio-mpi's checkpoint writers for bench.py's `checkpoint` benchmark: under mpiexec,
every rank saves its share of one checkpoint and loads it back, and rank 0 prints one JSON
line: {"layout", "ranks", "save": record, "load": record} (CheckpointRecord.to_json).

  mpiexec -n 2 python -P scripts/bench/checkpoint_driver.py --folder DIR --layout file_per_rank
          --bytes-per-rank N [--odirect] [--fsync] [--chunk BYTES] [--step K]

The checkpoint phase is not wired into `dlio-mpi run` yet; once runs write checkpoints, the
benchmark will run `dlio-mpi run` instead and this driver will go. It does what that phase
will: rank 0 makes the checkpoint's folder DIR/global_epoch1_step<K>, each save and load is
timed with checkpoint/results.py's gather_record (a barrier, then each rank's start and end
on _core.now_ns()), and the load follows the save. `file_per_rank`: one file per rank
(FilePerRank: O_DIRECT and fsync as asked; loads with O_DIRECT when --odirect, else after
dropping the files from the page cache). `shared`: one file, every rank's share at its offset
(SharedFile, collective MPI-IO; ROMIO's UFS driver has no O_DIRECT, so the load drops the
file from the page cache first). Afterwards it removes what it wrote, and only that: its
files and the folder it made (if empty)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from mpi4py import MPI

from dlio_mpi import _core
from dlio_mpi.checkpoint.file_per_rank import FilePerRank, IoStats, ShardFile
from dlio_mpi.checkpoint.results import CheckpointRecord, gather_record
from dlio_mpi.checkpoint.shared_file import SharedFile

SHARED_NAME = "model_states.pt"


def rank_file(rank: int) -> str:
    """This rank's file in a file_per_rank checkpoint, named as DeepSpeed names it."""
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def remove(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def timed(comm, kind: str, checkpoint_id: str, act) -> CheckpointRecord:
    """One save or load: a barrier, this rank's part between its clock's start and end, and
    the checkpoint's record over all ranks."""
    comm.Barrier()
    start = _core.now_ns()
    stats: IoStats = act()
    end = _core.now_ns()
    return gather_record(comm, kind, 1, checkpoint_id, stats.bytes, start, end, stats.syncs,
                         stats.sync_ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--layout", choices=("file_per_rank", "shared"), required=True)
    parser.add_argument("--bytes-per-rank", type=int, required=True)
    parser.add_argument("--odirect", action="store_true")
    parser.add_argument("--fsync", action="store_true")
    parser.add_argument("--chunk", type=int, default=64 << 20, help="bytes per write call")
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                        help="an MPI-IO hint for the shared file (repeatable)")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    checkpoint_id = f"global_epoch1_step{args.step}"
    folder = os.path.join(args.folder, checkpoint_id)
    tag = comm.bcast(f"ckptbench{os.getpid()}", root=0)
    made = False
    if rank == 0:
        os.makedirs(args.folder, exist_ok=True)
        os.mkdir(folder)  # refused if there: not ours
        made = True
    comm.Barrier()
    nbytes = args.bytes_per_rank
    mine: list[str] = []
    try:
        if args.layout == "file_per_rank":
            files = [ShardFile(rank_file(rank), nbytes)]
            fpr = FilePerRank(args.folder, rank, tag, args.odirect, args.fsync, args.chunk)
            save = timed(comm, "save", checkpoint_id,
                         lambda: fpr.save(args.step, checkpoint_id, files))
            mine = [fpr.path(checkpoint_id, f.name) for f in files]
            load = timed(comm, "load", checkpoint_id,
                         lambda: fpr.load(args.step, checkpoint_id, files, drop_cache=True))
        else:
            shared = SharedFile(comm, args.folder, tag, args.fsync,
                                dict(h.split("=", 1) for h in args.hint), args.chunk)
            save = timed(comm, "save", checkpoint_id,
                         lambda: shared.save(args.step, checkpoint_id, SHARED_NAME, nbytes))
            mine = [os.path.join(folder, SHARED_NAME)] if rank == 0 else []
            load = timed(comm, "load", checkpoint_id,
                         lambda: shared.load(args.step, checkpoint_id, SHARED_NAME, nbytes,
                                             drop_cache=True))
    except BaseException:
        # a rank's failure is not collective: remove this rank's files and stop every rank
        import traceback

        traceback.print_exc()
        remove(mine)
        comm.Abort(1)
    comm.Barrier()
    remove(mine)
    comm.Barrier()
    if made:
        try:
            os.rmdir(folder)  # only if empty: anything else in it is not ours
        except OSError as exc:
            print(f"left {folder}: {exc}", file=sys.stderr)
    if rank == 0:
        print(json.dumps({"layout": args.layout, "ranks": comm.Get_size(),
                          "bytes_per_rank": nbytes, "odirect": args.odirect,
                          "fsync": args.fsync, "chunk": args.chunk, "hints": args.hint,
                          "save": save.to_json(), "load": load.to_json()}), flush=True)


if __name__ == "__main__":
    main()
