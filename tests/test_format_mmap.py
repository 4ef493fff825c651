"""mmap_indexed_binary: the files of indexed_binary (DLIO writes both with one generator), read
through a memory mapping: each sample's extent mapped and copied out, every page faulted in
through the page cache; no read() system call moves the payload (so /proc/self/io's rchar,
which counts read calls, stays far below the bytes delivered), where indexed_binary's preads
count every byte. Run in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import os

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

SAMPLE = 64 * 1024
SETTINGS = dict(dataset__num_files_train=6, dataset__num_samples_per_file=16,
                dataset__record_length_bytes=SAMPLE, reader__batch_size=4, train__epochs=2,
                workflow__generate_data="true")


def _rchar() -> int:
    with open("/proc/self/io") as fp:
        return next(int(line.split()[1]) for line in fp if line.startswith("rchar:"))


def _run(tmp, fmt: str) -> tuple[dict, int]:
    """(summary, bytes this rank's read calls returned during training)."""
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    overrides = workload_overrides(tmp / fmt, dataset__format=fmt, **SETTINGS)
    run(comm, load_config("demo", [*overrides, "workflow.train=false"]))  # generate only
    comm.Barrier()
    trained = [o for o in overrides if not o.startswith("workflow.generate_data")]
    before = _rchar()
    summary = run(comm, load_config("demo", trained))
    return summary, _rchar() - before


def test_samples_are_read_through_a_mapping_not_read_calls(shared_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mapped, mapped_rchar = _run(shared_tmp, "mmap_indexed_binary")
    preads, pread_rchar = _run(shared_tmp, "indexed_binary")
    delivered = mapped["metric"]["train_bytes_read"]
    assert delivered == preads["metric"]["train_bytes_read"] > 0
    assert mapped["metric"]["train_bytes_transferred"] == delivered  # exact sample extents
    mine = delivered // comm.Get_size()
    assert pread_rchar >= mine  # every payload byte through pread
    assert mapped_rchar < mine // 4, (mapped_rchar, mine)  # only headers, manifests, logs
    files = os.listdir(shared_tmp / "mmap_indexed_binary" / "data" / "train")
    assert sorted(files)[:3] == ["img_0_of_6.mmap_indexed_binary",
                                 "img_0_of_6.mmap_indexed_binary.off.idx",
                                 "img_0_of_6.mmap_indexed_binary.sz.idx"]


@pytest.mark.parametrize("override, message", [
    ("reader.odirect=true", "reader.odirect: true does not combine with dataset.format "
                            "mmap_indexed_binary"),
    ("reader.file_access=collective", "reader.file_access: collective reads with MPI-IO, but "
                                      "dataset.format mmap_indexed_binary is read through a "
                                      "memory mapping"),
])
def test_what_a_mapping_cannot_do_is_refused_before_any_io(shared_tmp, override, message):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.errors import JobError
    from dlio_mpi.run import run

    cfg = load_config("demo", [*workload_overrides(shared_tmp, dataset__format="mmap_indexed_"
                                                   "binary", **SETTINGS), override])
    with pytest.raises(JobError, match=message):
        run(MPI.COMM_WORLD, cfg)
    assert not (shared_tmp / "data").exists() and not (shared_tmp / "out").exists()
