"""The MPI-IO backends (readers/mpiio.py): shared (independent Read_at) and collective
(Iread_at_all per file and step) deliver the bytes of every planned request, exactly as the
files hold them, on one shared many-sample file and on many files; collective steps where
ranks have unequal or no requests complete; the hints come back from Get_info; a rank failing
in a collective read ends the job. Runs in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

from conftest import mpiexec
from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

MODES = ("shared", "collective")
# one shared file of many samples; many files of one sample each
LAYOUTS = {
    "one-file": dict(dataset__format="indexed_binary", dataset__num_files_train=1,
                     dataset__num_samples_per_file=48, reader__read_mode="sample"),
    "many-files": dict(dataset__format="npy", dataset__num_files_train=24,
                       dataset__num_samples_per_file=1, reader__read_mode="file"),
}


def _dataset(tmp, **values):
    """Generate a small dataset under tmp; (cfg, its train split, SplitFiles)."""
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.data.catalog import locate_split
    from dlio_mpi.run import prepare, run_generation

    comm = MPI.COMM_WORLD
    cfg = load_config("demo", workload_overrides(tmp, workflow__generate_data="true",
                                                 reader__sample_shuffle="seed", **values))
    plan, _ = prepare(comm, cfg, generating=True)
    run_generation(comm, cfg, plan)
    split = plan.splits["train"]
    return cfg, split, locate_split(comm, cfg, split)


def _read_plan(cfg, split, files, steps: int, batch: int, shard=None):
    from mpi4py import MPI

    from dlio_mpi.readers import resolve_read_mode
    from dlio_mpi.sampling.requests import plan_reads
    from dlio_mpi.sampling.sharding import ShuffleSpec, epoch_shuffle, rank_shard

    if shard is None:  # the same on every rank: a failure here must not split the ranks
        assert steps * batch * MPI.COMM_WORLD.Get_size() <= split.num_samples
        shuffle = epoch_shuffle(ShuffleSpec(sample_shuffle="seed", seed=7), 1, 0)
        shard = rank_shard(split.num_files, split.samples_per_file, shuffle,
                           MPI.COMM_WORLD.Get_rank(), steps * batch)
    return plan_reads(np.asarray(shard, dtype=np.int64), steps, batch,
                      split.samples_per_file, files.layouts, resolve_read_mode(cfg))


def _open(mode: str, files, **options):
    from mpi4py import MPI

    from dlio_mpi.readers import REGISTRY, IoWatchdog, MpiioOptions

    settings = dict(read_threads=1, prefetch_size=2, odirect=False, fd_cache_size=4,
                    close_at_epoch_end=False, drop_page_cache=False, keep_data=True,
                    watchdog=IoWatchdog())
    settings.update(options)
    return REGISTRY[mode].open(files, MpiioOptions(**settings), MPI.COMM_WORLD)


def _checksums_read(reader, plan) -> list[int]:
    """One epoch through the backend: the crc32 of every request's bytes, in plan order."""
    from mpi4py import MPI

    reader.prepare_epoch(plan)
    MPI.COMM_WORLD.Barrier()
    reader.start_epoch(plan)
    sums = []
    for b in range(plan.steps):
        batch = reader.next_batch()
        assert batch is not None, f"batch {b} of {plan.steps} missing"
        first = int(plan.batch_start[b])
        for i, start in enumerate(batch.offsets.tolist()):
            sums.append(zlib.crc32(batch.data[start:start + int(plan.expect[first + i])]))
    assert reader.next_batch() is None
    reader.end_epoch()
    return sums


def _checksums_on_disk(files, plan) -> list[int]:
    sums = []
    for f, offset, expect in zip(plan.file_idx.tolist(), plan.offset.tolist(),
                                 plan.expect.tolist()):
        fd = os.open(files.path(f), os.O_RDONLY)
        try:
            sums.append(zlib.crc32(os.pread(fd, expect, offset)))
        finally:
            os.close(fd)
    return sums


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_every_request_brings_the_bytes_on_disk(shared_tmp, mode, layout):
    cfg, split, files = _dataset(shared_tmp, **LAYOUTS[layout])
    plan = _read_plan(cfg, split, files, steps=2, batch=3)
    reader = _open(mode, files)
    try:
        for epoch in (1, 2):  # the ring and the open files are reused
            sums = _checksums_read(reader, plan)
            assert sums == _checksums_on_disk(files, plan), f"epoch {epoch}"
        counters = reader.counters()
        assert counters["bytes_read"] == 2 * int(plan.expect.sum())
        assert len(reader.lat_ns) == len(plan.offset) and (reader.lat_ns > 0).all()
        if mode == "shared":
            assert counters["read_ops"] == 2 * len(plan.offset)
            assert counters["opens"] <= len(plan.files()) * (1 if layout == "one-file" else 2)
        else:  # each file any rank reads opened once, when first read (lean: kept open)
            from mpi4py import MPI

            read = set().union(*MPI.COMM_WORLD.allgather(set(plan.files().tolist())))
            assert counters["opens"] == len(read) and counters["closes"] == 0
            assert counters["read_ops"] >= 2 * plan.steps
    finally:
        reader.close()


# npz files read as DLIO's loader reads them (np.load: some reads run past the end of the
# file), with ROMIO's collective buffering forced on
NPZ_LOADER = dict(dataset__format="npz", dataset__num_files_train=12, reader__access="loader",
                  reader__mpiio_hints="{romio_cb_read: enable}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["one-file", "npz-loader"])
def test_whole_runs_match_the_native_engine(shared_tmp, monkeypatch, mode, layout):
    """The same samples per rank, the same bytes and payload as the POSIX engine."""
    from mpi4py import MPI

    import dlio_mpi.readers
    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    rank = MPI.COMM_WORLD.Get_rank()
    common = dict(LAYOUTS["one-file"] if layout == "one-file" else NPZ_LOADER,
                  reader__batch_size=2, train__epochs=2, train__computation_time=0.002,
                  output__access_log="true")

    def run_into(name: str, generate: str):
        cfg = load_config("demo", workload_overrides(
            shared_tmp, output__folder=shared_tmp / name, workflow__generate_data=generate,
            **common))
        return run(MPI.COMM_WORLD, cfg)

    native = run_into("native", "true")
    monkeypatch.setitem(dlio_mpi.readers.REGISTRY, "multi", dlio_mpi.readers.REGISTRY[mode])
    ours = run_into(mode, "false")
    for epoch in (1, 2):
        name = f"access_log/epoch{epoch}_rank{rank}.npy"
        assert np.array_equal(np.load(shared_tmp / "native" / name),
                              np.load(shared_tmp / mode / name))
    if rank == 0:
        m, n = ours["metric"], native["metric"]
        assert m["train_bytes_read"] == n["train_bytes_read"] > 0
        if mode == "collective" and layout == "npz-loader":
            # np.load's model reads parts of each file twice; one collective call per file and
            # step reads their union once (the whole file), and bytes counted are bytes moved
            files = sorted((shared_tmp / "data" / "train").glob("*.npz"))
            assert len(files) == 12
            whole = sum(f.stat().st_size for f in files)
            assert m["train_bytes_transferred"] == 2 * whole < n["train_bytes_transferred"]
        else:
            assert m["train_bytes_transferred"] == n["train_bytes_transferred"]


def test_collective_steps_with_uneven_and_empty_requests_complete(shared_tmp):
    """Rank 0 reads nothing in step 1 and rank 1 nothing in step 2; the others read
    different numbers of samples per step; every collective call completes everywhere."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    cfg, split, files = _dataset(shared_tmp, **LAYOUTS["one-file"])
    per_step = {0: [2, 0, 1], 1: [0, 3, 2]}.get(rank, [1, 1, 4])
    ids = np.arange(rank * 8, rank * 8 + sum(per_step)) % split.num_samples
    base = _read_plan(cfg, split, files, steps=1, batch=len(ids), shard=ids)
    starts = np.concatenate(([0], np.cumsum(per_step))).astype(np.int64)
    plan = type(base)(base.sample_ids, starts, base.file_idx, base.offset, base.length,
                      base.flags, base.expect, np.zeros(len(per_step), dtype=np.int64))
    reader = _open("collective", files, prefetch_size=1)
    try:
        assert _checksums_read(reader, plan) == _checksums_on_disk(files, plan)
        assert reader.counters()["read_ops"] == 3  # one collective call per step: one file
    finally:
        reader.close()


def test_hints_are_given_and_read_back(shared_tmp):
    cfg, split, files = _dataset(shared_tmp, **LAYOUTS["one-file"])
    hints = (("cb_buffer_size", "8388608"), ("romio_cb_read", "enable"))
    for mode in MODES:
        reader = _open(mode, files, mpiio_hints=hints, odirect=True)
        try:
            _checksums_read(reader, _read_plan(cfg, split, files, steps=1, batch=2))
            described = reader.describe()
        finally:
            reader.close()
        assert described["file_access"] == mode
        assert described["hints_requested"] == {**dict(hints), "direct_read": "true"}
        assert described["direct_read"]["requested"] is True
        json.dumps(described)  # it goes into summary.json
        if described["mpiio_implementation"] == "ROMIO":
            effective = described["hints_effective"]
            assert effective["cb_buffer_size"] == "8388608"
            assert effective["romio_cb_read"] == "enable"
            # ROMIO's generic (ext4, tmpfs) driver does not do O_DIRECT and does not say so
            assert described["direct_read"]["reported_by_get_info"] == effective.get(
                "direct_read")


def test_collective_reader_refuses_too_many_files(shared_tmp, monkeypatch):
    import dlio_mpi.readers.mpiio as mpiio
    from dlio_mpi.errors import UserError

    _, _, files = _dataset(shared_tmp, **LAYOUTS["many-files"])
    monkeypatch.setattr(mpiio, "COLLECTIVE_FILE_LIMIT", files.count - 1)
    with pytest.raises(UserError, match="reader.file_access: shared"):
        _open("collective", files)


def test_a_missing_file_is_an_oserror_naming_it(shared_tmp):
    from mpi4py import MPI

    cfg, split, files = _dataset(shared_tmp, **LAYOUTS["many-files"])
    plan = _read_plan(cfg, split, files, steps=2, batch=2)
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.Get_rank() == 0:
        os.rename(files.path(int(plan.file_idx[0])), files.path(int(plan.file_idx[0])) + ".x")
    MPI.COMM_WORLD.Barrier()
    reader = _open("shared", files)
    try:
        reader.prepare_epoch(plan)
        reader.start_epoch(plan)
        if MPI.COMM_WORLD.Get_rank() == 0:
            with pytest.raises(OSError, match=os.path.basename(files.path(int(
                    plan.file_idx[0])))):
                reader.next_batch()
    finally:
        reader.close()


FAILING_RUN = """
    import sys
    from mpi4py import MPI
    from dataclasses import replace
    import dlio_mpi.readers
    from dlio_mpi.cli import main
    from dlio_mpi.readers.mpiio import CollectiveReader

    class FailingOnRank1(CollectiveReader):
        def _read_batch(self, plan, first, last, buffer):
            if MPI.COMM_WORLD.Get_rank() == 1 and first >= plan.batch_start[2]:
                raise OSError(5, "injected read failure on rank 1")
            return super()._read_batch(plan, first, last, buffer)

    dlio_mpi.readers.REGISTRY["multi"] = replace(dlio_mpi.readers.REGISTRY["collective"],
                                                 module="__main__", cls="FailingOnRank1")
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.mpi(min_size=2)
def test_a_rank_failing_in_a_collective_read_ends_the_job(shared_tmp):
    """Run as its own mpiexec -n 2 (from rank 0 only): rank 1 raises where rank 0 waits in
    Iread_at_all; the job must end, non-zero, naming the error."""
    from mpi4py import MPI

    _dataset(shared_tmp, **LAYOUTS["one-file"])
    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    script = shared_tmp / "failing_run.py"
    script.write_text(textwrap.dedent(FAILING_RUN))
    args = workload_overrides(shared_tmp, output__folder=shared_tmp / "failing",
                              workflow__generate_data="false", reader__batch_size=2,
                              train__epochs=1, train__computation_time=0.01,
                              **LAYOUTS["one-file"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MPI", "HYDRA"))}
    began = time.monotonic()
    job = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-P", str(script), "run",
                          "demo", *args], capture_output=True, text=True, timeout=60, env=env)
    assert job.returncode != 0, job.stdout
    assert "injected read failure on rank 1" in job.stderr, job.stderr
    assert time.monotonic() - began < 60


@pytest.mark.parametrize("mode", MODES)
def test_drop_page_cache_empties_the_cache_of_the_files_read(shared_tmp, mode):
    from mpi4py import MPI

    from helpers import resident_pages

    cfg, split, files = _dataset(shared_tmp, **LAYOUTS["many-files"])
    plan = _read_plan(cfg, split, files, steps=2, batch=2)
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        for index in range(files.count):  # written and flushed: all in the cache
            with open(files.path(index), "rb") as fp:
                os.fsync(fp.fileno())
                fp.read()
    comm.Barrier()
    mine = plan.files().tolist()
    reader = _open(mode, files, drop_page_cache=True)
    try:
        assert all(resident_pages(files.path(i)) for i in mine)
        reader.prepare_epoch(plan)  # outside the epoch's clock, as the native engine does
        assert [resident_pages(files.path(i)) for i in mine] == [0] * len(mine)
        reader.start_epoch(plan)
        while reader.next_batch() is not None:
            pass
        reader.end_epoch()
    finally:
        reader.close()


def test_collective_files_open_in_the_epoch_and_close_at_its_end_with_loader_access(shared_tmp):
    from mpi4py import MPI

    cfg, split, files = _dataset(shared_tmp, **LAYOUTS["many-files"])
    plan = _read_plan(cfg, split, files, steps=2, batch=2)
    read = set().union(*MPI.COMM_WORLD.allgather(set(plan.files().tolist())))
    reader = _open("collective", files, close_at_epoch_end=True)
    try:
        assert reader.counters()["opens"] == 0  # nothing opened before an epoch
        for epoch in (1, 2):
            _checksums_read(reader, plan)
            counters = reader.counters()
            assert counters["opens"] == counters["closes"] == epoch * len(read)
    finally:
        reader.close()
