"""synthetic: files are generated (empty: nothing is ever read from them) and training reads
nothing, no open and no read, as DLIO's synthetic reader; steps, samples and AU are still
counted. Run in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import os

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_a_synthetic_run_reads_nothing_and_counts_its_steps(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__format="synthetic", dataset__num_files_train=12,
        dataset__num_samples_per_file=4, reader__batch_size=2, train__epochs=2,
        train__computation_time=0.002, workflow__generate_data="true"))
    summary = run(comm, cfg)
    folder = shared_tmp / "data" / "train"
    names = sorted(os.listdir(folder))
    assert len(names) == 12 and all(n.endswith(".synthetic") for n in names)
    assert all((folder / n).stat().st_size == 0 for n in names)
    metric = summary["metric"]
    for key in ("train_bytes_read", "train_bytes_transferred", "train_read_ops",
                "train_file_opens", "train_requests"):
        assert metric[key] == 0, key
    steps = 48 // size // 2
    assert len(metric["train_throughput_samples_per_second"]) == 2
    assert summary["dlio_mpi"]["steps_per_epoch"] == steps
    assert metric["train_compute_seconds_per_rank"]["min"] >= 2 * steps * 0.002


def test_synthetic_data_with_an_mpiio_backend_is_refused_before_any_io(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.errors import JobError
    from dlio_mpi.run import run

    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__format="synthetic", reader__file_access="collective",
        workflow__generate_data="true"))
    with pytest.raises(JobError, match="reader.file_access: collective reads with MPI-IO, but "
                                       "dataset.format synthetic reads nothing; expected multi"):
        run(MPI.COMM_WORLD, cfg)
    assert not (shared_tmp / "data").exists()
