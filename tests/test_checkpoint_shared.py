"""checkpoint/shared_file.py under mpiexec -n 2 and -n 3: one file per checkpoint holds every
rank's bytes at its offset (ranks' shares back to back, uneven ones and an empty one
included), written collectively, synced, renamed only when whole, never over a file in the
way; read back collectively and checked."""

from __future__ import annotations

import os

import pytest

from helpers import ckpt_stream

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

MiB = 1 << 20
CHUNK = MiB


def share(rank: int) -> int:
    """Uneven shares; rank 1 has none."""
    return 0 if rank == 1 else 2 * MiB + 1000 * rank + 7


def mine(rank: int):
    from dlio_mpi.checkpoint.sizing import RankShard

    return RankShard(rank, (("share", share(rank)),))


def test_every_ranks_bytes_sit_at_its_offset_and_read_back(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.checkpoint.file_per_rank import shard_seed
    from dlio_mpi.checkpoint.shared_file import NAME, SharedFile

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = shared_tmp / "ckpt"
    if rank == 0:
        (folder / "global_epoch1_step1").mkdir(parents=True)
    comm.Barrier()
    sizes = [share(r) for r in range(size)]
    writer = SharedFile(comm, str(folder), "t1", fsync=True,
                        hints={"romio_cb_write": "enable"}, sizes=sizes, chunk=CHUNK)
    saved = writer.save(1, "global_epoch1_step1", mine(rank))
    assert saved.bytes == share(rank) and saved.syncs == 1
    path = folder / "global_epoch1_step1" / NAME
    assert os.listdir(path.parent) == [NAME]  # no temporary left
    data = path.read_bytes()
    assert len(data) == sum(share(r) for r in range(size))
    start = sum(share(r) for r in range(rank))
    for k in range(-(-share(rank) // CHUNK)):  # built independently, block by block
        n = min(CHUNK, share(rank) - k * CHUNK)
        block = ckpt_stream(shard_seed(1, rank, 0), k * CHUNK, n)
        assert data[start + k * CHUNK:start + k * CHUNK + n] == block, k
    loaded = writer.load(1, "global_epoch1_step1", mine(rank), drop_cache=True)
    assert loaded.bytes == share(rank)
    shifted = mine((rank + 1) % size)  # recovery_rank_shift: another rank's share, checked
    assert writer.load(1, "global_epoch1_step1", shifted).bytes == share((rank + 1) % size)
    with pytest.raises(Exception, match="do not hold the bytes written"):  # another's
        writer.load(2, "global_epoch1_step1", mine(rank))


def test_a_file_in_the_way_is_left_as_it_is(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.checkpoint.shared_file import NAME, SharedFile
    from dlio_mpi.checkpoint.sizing import RankShard
    from dlio_mpi.errors import JobError

    comm = MPI.COMM_WORLD
    folder = shared_tmp / "ckpt"
    theirs = folder / "global_epoch1_step1" / NAME
    if comm.Get_rank() == 0:
        theirs.parent.mkdir(parents=True)
        theirs.write_bytes(b"a user's file")
    comm.Barrier()
    writer = SharedFile(comm, str(folder), "t2", fsync=False, hints={},
                        sizes=[MiB] * comm.Get_size(), chunk=CHUNK)
    with pytest.raises(JobError, match="appeared"):
        writer.save(1, "global_epoch1_step1", RankShard(comm.Get_rank(), (("x", MiB),)))
    comm.Barrier()
    assert theirs.read_bytes() == b"a user's file"
    assert os.listdir(theirs.parent) == [NAME]
