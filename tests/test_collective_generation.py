"""Shared dataset files (fewer files than ranks) are written by all ranks together through
MPI-IO: the bytes are the payload stream of each file's seed, whatever the rank count, exactly
as a file written by one rank; side files and the manifest are there, no temporary is left;
a rank failing in a collective round fails every rank and leaves nothing partial. Runs
in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

MiB = 1 << 20


def _config(tmp, **values):
    from dlio_mpi.config import load_config

    return load_config("demo", workload_overrides(tmp, workflow__generate_data="true",
                                                  workflow__train="false", **values))


def _generate(cfg):
    from mpi4py import MPI

    from dlio_mpi.run import prepare, run_generation

    plan, _ = prepare(MPI.COMM_WORLD, cfg, generating=True)
    return plan, run_generation(MPI.COMM_WORLD, cfg, plan)


def _expected(split, index: int) -> bytes:
    """The file as one rank writes it: header, then the payload stream of its seed."""
    from dlio_mpi import _core
    from dlio_mpi.data.generate import file_seed

    header, payload = split.format.payload_extent(split.spec(index))
    stream = np.zeros(payload, dtype=np.uint8)
    _core.fill_random(stream, file_seed(split.name, index))
    return header + stream.tobytes()


# 9 MiB + 5 samples: payload blocks (8 MiB) cross sample and round boundaries
@pytest.mark.parametrize("fmt", ["indexed_binary", "npy"])
def test_fewer_files_than_ranks_are_written_by_all_ranks_byte_exact(shared_tmp, fmt):
    from mpi4py import MPI

    from dlio_mpi.data.manifest import read_manifest

    comm = MPI.COMM_WORLD
    files = comm.Get_size() - 1
    cfg = _config(shared_tmp, dataset__format=fmt, dataset__num_files_train=files,
                  dataset__num_samples_per_file=3, dataset__record_length_bytes=3 * MiB + 5,
                  dataset__record_length_bytes_stdev=0, dataset__num_files_eval=0)
    plan, result = _generate(cfg)
    assert result.collective is not None and result.collective["ranks"] == comm.Get_size()
    assert result.files_written == files and result.collective["files"] == files
    assert result.collective["hints_effective"]  # read back from the MPI-IO layer
    split = plan.splits["train"]
    for index in range(files):
        with open(split.path(index), "rb") as fp:
            assert fp.read() == _expected(split, index), index
        for side in split.format.side_files(split.path(index)):
            assert os.path.getsize(side) == 3 * 8  # a uint64 per sample
        assert os.stat(split.path(index)).st_mode & 0o777 == 0o644 & ~_umask()
    folder = os.path.dirname(split.path(0))
    assert [n for n in os.listdir(folder) if n.endswith(".tmp")] == []
    assert read_manifest(split.root)["complete"] is True
    again = _generate(cfg)[1]  # a rerun finds them complete
    assert again.files_written == 0 and again.files_skipped == files


def test_npz_and_more_files_than_ranks_are_dealt_out(shared_tmp):
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    _, result = _generate(_config(shared_tmp / "npz", dataset__format="npz",
                                  dataset__num_files_train=1))
    assert result.collective is None and result.files_written == 1
    _, result = _generate(_config(shared_tmp / "many", dataset__format="npy",
                                  dataset__num_files_train=size))
    assert result.collective is None and result.files_written == size


def test_a_rank_failing_in_a_collective_round_fails_all_and_leaves_nothing(shared_tmp,
                                                                           monkeypatch):
    from mpi4py import MPI

    import dlio_mpi.data.collective_generation as collective
    from dlio_mpi.errors import JobError

    comm = MPI.COMM_WORLD
    real_fill = collective._core.fill_random

    class FailingCore:
        PAYLOAD_BLOCK = collective._core.PAYLOAD_BLOCK

        @staticmethod
        def fill_random(buffer, seed, start=0):
            if comm.Get_rank() == 1 and start >= FailingCore.PAYLOAD_BLOCK:
                raise OSError(5, "injected failure on rank 1")
            real_fill(buffer, seed, start)

    monkeypatch.setattr(collective, "_core", FailingCore)
    cfg = _config(shared_tmp, dataset__format="indexed_binary", dataset__num_files_train=1,
                  dataset__num_samples_per_file=8, dataset__record_length_bytes=4 * MiB,
                  dataset__record_length_bytes_stdev=0, dataset__num_files_eval=0)
    with pytest.raises(JobError, match="injected failure on rank 1"):
        _generate(cfg)
    comm.Barrier()
    train = shared_tmp / "data" / "train"
    assert sorted(os.listdir(train)) == []  # no temporary, no side file, no data file


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_striping_of_new_files_is_attributed_to_what_set_it():
    from dlio_mpi.data.generate import GenerationResult
    from dlio_mpi.run import striping_set_by

    hinted = {"hints_requested": {"striping_factor": "4"}}
    applied = {"status": "applied"}
    assert striping_set_by(GenerationResult(1, 0, 1, 1.0, applied, hinted)).startswith(
        "reader.mpiio_hints")
    assert striping_set_by(GenerationResult(1, 0, 1, 1.0, applied, None)).startswith(
        "storage.lustre")
    assert striping_set_by(GenerationResult(1, 0, 1, 1.0, None, {"hints_requested": {}})) == \
        "the file system's default"
    assert striping_set_by(GenerationResult(0, 3, 0, 0.0, applied, hinted)) == "no file created"
