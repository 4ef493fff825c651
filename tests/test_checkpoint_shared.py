"""checkpoint/shared_file.py under mpiexec -n 2 and -n 3: one file per checkpoint holds every
rank's bytes at its offset (ranks' shares back to back, uneven ones and an empty one
included), written collectively, synced, renamed only when whole, never over a file in the
way; read back collectively and checked."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

MiB = 1 << 20
CHUNK = MiB


def share(rank: int) -> int:
    """Uneven shares; rank 1 has none."""
    return 0 if rank == 1 else 2 * MiB + 1000 * rank + 7


def test_every_ranks_bytes_sit_at_its_offset_and_read_back(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi import _core
    from dlio_mpi.checkpoint.file_per_rank import shard_seed
    from dlio_mpi.checkpoint.shared_file import SharedFile

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = shared_tmp / "ckpt"
    if rank == 0:
        (folder / "global_epoch1_step1").mkdir(parents=True)
    comm.Barrier()
    writer = SharedFile(comm, str(folder), "t1", fsync=True,
                        hints={"romio_cb_write": "enable"}, chunk=CHUNK)
    saved = writer.save(1, "global_epoch1_step1", "model_states.pt", share(rank))
    assert saved.bytes == share(rank) and saved.syncs == 1
    path = folder / "global_epoch1_step1" / "model_states.pt"
    assert os.listdir(path.parent) == ["model_states.pt"]  # no temporary left
    data = path.read_bytes()
    assert len(data) == sum(share(r) for r in range(size))
    start = sum(share(r) for r in range(rank))
    for k in range(-(-share(rank) // CHUNK)):  # built independently, block by block
        n = min(CHUNK, share(rank) - k * CHUNK)
        block = np.empty(n, dtype=np.uint8)
        _core.shard_block(block, shard_seed(1, rank, 0), k)
        assert data[start + k * CHUNK:start + k * CHUNK + n] == block.tobytes(), k
    loaded = writer.load(1, "global_epoch1_step1", "model_states.pt", share(rank),
                         drop_cache=True)
    assert loaded.bytes == share(rank)
    with pytest.raises(Exception, match="does not hold the bytes written"):  # another's
        writer.load(2, "global_epoch1_step1", "model_states.pt", share(rank))


def test_a_file_in_the_way_is_left_as_it_is(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.checkpoint.shared_file import SharedFile
    from dlio_mpi.errors import JobError

    comm = MPI.COMM_WORLD
    folder = shared_tmp / "ckpt"
    theirs = folder / "global_epoch1_step1" / "model_states.pt"
    if comm.Get_rank() == 0:
        theirs.parent.mkdir(parents=True)
        theirs.write_bytes(b"a user's file")
    comm.Barrier()
    writer = SharedFile(comm, str(folder), "t2", fsync=False, hints={}, chunk=CHUNK)
    with pytest.raises(JobError, match="appeared"):
        writer.save(1, "global_epoch1_step1", "model_states.pt", MiB)
    comm.Barrier()
    assert theirs.read_bytes() == b"a user's file"
    assert os.listdir(theirs.parent) == ["model_states.pt"]
