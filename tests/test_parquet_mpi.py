"""parquet on every rank of the job, in-process (mpiexec -n 2 or 3 python -m pytest --with-mpi):
each rank reads, per epoch, the footer of each file its samples are in and exactly the row
groups they live in, each once; together the ranks read every sample once an epoch. Files
alike are read where the computed layout says, compressed files or files of varying sample
sizes where generation recorded each file's row groups and footer."""

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


@pytest.mark.parametrize("codec,stdev", [("zstd", 0), ("none", 800), ("snappy", 800)])
def test_each_rank_reads_the_recorded_footers_and_row_groups_of_its_samples(shared_tmp, codec,
                                                                             stdev):
    import pyarrow.parquet as pq
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.formats.parquet import FOOTER_READ
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    folder = shared_tmp / f"{codec}{stdev}"
    cfg = load_config("demo", workload_overrides(
        folder, dataset__format="parquet", dataset__num_files_train=FILES,
        dataset__num_samples_per_file=SAMPLES, dataset__parquet__row_group_size=GROUP,
        dataset__record_length_bytes=SIDE * SIDE, dataset__compression=codec,
        dataset__record_length_bytes_stdev=stdev, reader__sample_shuffle="seed",
        reader__file_shuffle="seed", reader__read_threads=2, output__access_log="true"))
    summary = run(comm, cfg)
    assert summary["dlio_mpi"]["read_mode"] == "sample"
    files = sorted((folder / "data" / "train").iterdir())
    metas = [pq.ParquetFile(p).metadata for p in files]
    chunks = [[m.row_group(g).column(0) for g in range(m.num_row_groups)] for m in metas]
    lengths = [[c.total_compressed_size for c in file] for file in chunks]
    widths = [m.schema.column(0).length for m in metas]
    footers = []
    for p in files:  # pyarrow's tail read, and the metadata when it is longer
        data = p.read_bytes()
        meta, tail = int.from_bytes(data[-8:-4], "little"), min(len(data), FOOTER_READ)
        footers.append(tail + (meta if meta + 8 > tail else 0))
    record = np.load(folder / "data" / "dlio_mpi_sizes_train.npy")
    assert record[:, 3:3 + 4].tolist() == [[c.data_page_offset for c in f] for f in chunks]
    assert record[:, 3 + 4:].tolist() == lengths and record[:, 1].tolist() == widths
    if stdev:
        assert len(set(widths)) > 1
    rows = [min(GROUP, SAMPLES - g * GROUP) for g in range(4)]
    transferred = payload = 0
    epochs = access_logs(cfg.output.folder, [1, 2], size)
    for ids in epochs:  # one rank's epoch
        used = ids // SAMPLES
        transferred += sum(footers[f] for f in np.unique(used))
        for key in np.unique(used * 8 + ids % SAMPLES // GROUP):
            transferred += lengths[key // 8][key % 8]
            payload += rows[key % 8] * widths[key // 8]
    for epoch in (0, 1):  # the ranks read every sample they keep once
        union = np.concatenate(epochs[epoch * size:(epoch + 1) * size])
        assert len(np.unique(union)) == len(union) == FILES * SAMPLES // size // 2 * 2 * size
    metric = summary["metric"]
    assert metric["train_bytes_transferred"] == metric["train_bytes_requested"] == transferred
    assert metric["train_bytes_read"] == payload


def test_only_rank_0_learns_a_parquet_layout_the_others_take_it(shared_tmp, monkeypatch):
    """A layout costs a whole file written through pyarrow (3 s for dlrm_b200's files):
    rank 0 learns it and hands it on; the plans agree, and an error comes back on every rank."""
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.errors import JobError
    from dlio_mpi.formats import parquet
    from dlio_mpi.plan.derive import derive_plan, derive_plan_everywhere

    comm = MPI.COMM_WORLD
    learned = []
    original = parquet._learn_geometry
    monkeypatch.setattr(parquet, "_learn_geometry",
                        lambda *key: learned.append(key) or original(*key))
    parquet._GEOMETRIES.clear()
    rows = 1000 + comm.Get_size()  # a layout no other test learned
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__format="parquet", dataset__num_files_train=4,
        dataset__num_samples_per_file=rows, dataset__parquet__row_group_size=64,
        dataset__record_length_bytes=100))
    plan = derive_plan_everywhere(comm, lambda: derive_plan(cfg, comm.Get_size()))
    keys = [key for key in learned if key[1] == rows]
    assert len(keys) == (1 if comm.Get_rank() == 0 else 0)
    sizes = comm.allgather(plan.dataset_bytes)
    assert len(set(sizes)) == 1 and sizes[0] > 4 * rows * 100
    bad = load_config("demo", workload_overrides(
        shared_tmp, dataset__format="parquet", reader__batch_size=10**6))
    with pytest.raises(JobError, match="reader.batch_size"):
        derive_plan_everywhere(comm, lambda: derive_plan(bad, comm.Get_size()))
