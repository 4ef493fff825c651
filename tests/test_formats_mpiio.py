"""The MPI-IO backends read the newer formats by extent as the native engine does: tfrecord
and contiguous hdf5 through reader.file_access shared and collective, the same samples and
bytes. In-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]


@pytest.mark.parametrize("fmt", ["tfrecord", "hdf5"])
def test_mpiio_reads_the_same_samples_and_bytes_as_the_native_engine(shared_tmp, fmt):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    common = dict(dataset__format=fmt, dataset__num_files_train=6,
                  dataset__num_samples_per_file=8, dataset__record_length_bytes=4096,
                  reader__batch_size=2, reader__read_mode="sample", train__epochs=1)
    run(comm, load_config("demo", workload_overrides(
        shared_tmp, workflow__generate_data="true", workflow__train="false", **common)))
    metrics = {}
    for access in ("multi", "shared", "collective"):
        cfg = load_config("demo", workload_overrides(
            shared_tmp, output__folder=shared_tmp / f"out-{access}",
            reader__file_access=access, **common))
        metrics[access] = run(comm, cfg)["metric"]
    steps = 48 // comm.Get_size() // 2
    for access, metric in metrics.items():
        assert metric["train_bytes_read"] == comm.Get_size() * steps * 2 * 4096, access
        assert metric["train_requests"] == metrics["multi"]["train_requests"], access
        assert metric["train_bytes_requested"] == metrics["multi"]["train_bytes_requested"]
