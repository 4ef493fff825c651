"""parquet on every rank of the job, in-process (mpiexec -n 2 or 3 python -m pytest --with-mpi):
each rank reads, per epoch, the footer of each file its samples are in and exactly the row
groups they live in, each once; together the ranks read every sample once an epoch."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import access_logs, workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

FILES, SAMPLES, GROUP, SIDE = 6, 10, 3, 64  # groups of 3, 3, 3 and 1 rows


def test_each_rank_reads_the_footers_and_row_groups_of_its_samples(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.formats.parquet import geometry
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__format="parquet", dataset__num_files_train=FILES,
        dataset__num_samples_per_file=SAMPLES, dataset__parquet__row_group_size=GROUP,
        dataset__record_length_bytes=SIDE * SIDE, reader__sample_shuffle="seed",
        reader__file_shuffle="seed", reader__read_threads=2, output__access_log="true"))
    summary = run(comm, cfg)
    assert summary["dlio_mpi"]["read_mode"] == "sample"
    geo = geometry(SIDE * SIDE, SAMPLES, GROUP)
    footer = sum(length for _, length in geo.footer_reads())
    rows = [min(GROUP, SAMPLES - g * GROUP) for g in range(len(geo.offset))]
    transferred = payload = 0
    epochs = access_logs(cfg.output.folder, [1, 2], size)
    for ids in epochs:  # one rank's epoch
        files, groups = ids // SAMPLES, ids % SAMPLES // GROUP
        transferred += footer * len(np.unique(files))
        for key in np.unique(files * 8 + groups):
            transferred += geo.length[key % 8]
            payload += rows[key % 8] * SIDE * SIDE
    for epoch in (0, 1):  # the ranks read every sample they keep once
        union = np.concatenate(epochs[epoch * size:(epoch + 1) * size])
        assert len(np.unique(union)) == len(union) == FILES * SAMPLES // size // 2 * 2 * size
    metric = summary["metric"]
    assert transferred > payload > 0
    assert metric["train_bytes_transferred"] == metric["train_bytes_requested"] == transferred
    assert metric["train_bytes_read"] == payload
