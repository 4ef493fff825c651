"""jpeg, png and csv under mpiexec (-n 2, -n 3, in-process): generation on every rank records
each file's size; a run reads exactly the recorded bytes of the files its samples live in; the
framework engine (a torch DataLoader and a tf.data pipeline loading through Pillow and pandas)
reads the same sample ids on each rank as the native engine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi.config import load_config
from dlio_mpi.data.dataset import describe_dataset
from dlio_mpi.data.recorded_sizes import sizes_path
from helpers import run_in_process, workload_overrides

pytestmark = pytest.mark.timeout(600)


def _run(tmp: Path, **values):
    return run_in_process(load_config("demo", workload_overrides(tmp, **values)))


def _logs(out: Path, name: str, ranks: int) -> list[np.ndarray]:
    return [np.load(out / "access_log" / f"{name}_rank{r}.npy") for r in range(ranks)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fmt,per_file", [("jpeg", 1), ("png", 1), ("csv", 2)])
def test_recorded_sizes_are_read_and_the_framework_reads_the_native_ids(shared_tmp, fmt,
                                                                        per_file):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common = dict(dataset__format=fmt, dataset__num_files_train=6 * size,
                  dataset__num_samples_per_file=per_file, dataset__record_length_bytes=256,
                  reader__batch_size=2, reader__read_threads=2, reader__sample_shuffle="seed",
                  reader__file_shuffle="seed", train__epochs=2, output__access_log="true")
    cfg, native = _run(shared_tmp, output__folder=shared_tmp / "native",
                       workflow__generate_data="true", **common)
    split = describe_dataset(cfg)["train"]
    sizes = np.load(sizes_path(split.root, "train"))
    assert sizes.tolist() == [os.stat(split.path(i)).st_size for i in range(split.num_files)]
    epochs = ("epoch1", "epoch2")
    native_logs = [_logs(shared_tmp / "native", e, size) for e in epochs]
    # read_mode file (auto): the whole file for every sample, on the rank reading the sample
    want = [sum(int(sizes[logs[r] // per_file].sum()) for logs in native_logs)
            for r in range(size)]
    metric = native["metric"]
    assert metric["train_bytes_transferred"] == sum(want)
    spread = metric["train_bytes_read_per_rank"]
    assert (spread["min"], spread["max"]) == (min(want), max(want))
    comm.Barrier()
    for loader in ("pytorch", "tensorflow"):
        out = shared_tmp / loader
        _, framework = _run(shared_tmp, output__folder=out, workflow__generate_data="false",
                            reader__engine="framework", framework=loader,
                            reader__data_loader=loader, **common)
        for e, name in enumerate(epochs):
            ids = np.load(out / "access_log" / f"{name}_rank{rank}.npy")
            assert len(ids) and np.array_equal(ids, native_logs[e][rank]), (loader, name)
        m = framework["metric"]
        described = framework["dlio_mpi"]["readers"]["train"]
        assert described["backend"] == "framework" and described["format"] == fmt
        # each load reads its whole file through the real library (and the modules it
        # imports at a first load): at least the native engine's bytes; DLIO's tensorflow
        # generators load a file once for its samples of the epoch (read_mode file_once)
        once = sum(int(sizes[np.unique(logs[r] // per_file)].sum()) for logs in native_logs
                   for r in range(size))
        least = metric["train_bytes_transferred"] if loader == "pytorch" else once
        assert m["train_bytes_transferred"] >= least, loader
        if loader == "pytorch":  # a load per sample, as the native plan's
            assert m["train_file_opens"] == metric["train_file_opens"]
