"""What the reader.staging backends share (read_once.py, replicated.py): reading files whole
into memory before the first epoch (reads of 64 MiB through the storage seam, one open each,
O_DIRECT with reader.odirect), timed from a barrier to a barrier, a rank's failure aborting
the job; the node of every rank; and the staging's record in describe()["staging"]."""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

from .. import _core
from ..errors import StopRequested, describe, raise_if_stopped
from ..mpi.topology import emulated_ranks_per_node
from ..storage import storage_for

CHUNK = 64 << 20  # bytes per read call while staging
ALIGN = 4096      # of each file's place in memory (O_DIRECT reads land there)


class StagingFailed(RuntimeError):
    """A rank's staging read failed: fatal for the job at once (cli.main aborts it)."""


def padded(sizes: np.ndarray) -> np.ndarray:
    """Each size rounded up to ALIGN (a file's place in memory)."""
    return (sizes + ALIGN - 1) // ALIGN * ALIGN


def anonymous_memory(size: int) -> tuple[mmap.mmap, np.ndarray]:
    """`size` bytes (at least ALIGN) of page-aligned memory, for O_DIRECT reads, faulted in
    (before any staging clock); the mapping and a uint8 view of it."""
    mapping = mmap.mmap(-1, max(size, ALIGN))
    view = np.frombuffer(mapping, dtype=np.uint8)
    view[::4096] = 0
    return mapping, view


def read_whole(path: str, size: int, memory: mmap.mmap, at: int | None,
               odirect: bool) -> int:
    """Read file `path` of `size` bytes whole, one open, reads of CHUNK, into `memory` from
    offset `at` on (None: every chunk into the start of `memory`, a reused buffer of at
    least CHUNK bytes, or the file's padded size); the bytes read (at most `size`)."""
    fs = storage_for(path)
    handle = fs.open_read(path, direct=odirect)  # a FIFO in its place neither blocks nor passes
    try:
        done = 0
        while done < size:
            raise_if_stopped()  # a stop signal ends the staging between two calls
            want = min(CHUNK, size - done)
            if odirect:
                want = (want + ALIGN - 1) // ALIGN * ALIGN
            into = 0 if at is None else at + done
            got = fs.read_into(handle, memoryview(memory)[into:into + want], done)
            if got <= 0:
                raise OSError(5, f"{path} ends at {done} bytes, before its {size} bytes: it "
                                 "changed since its size was taken", path)
            done += got
    finally:
        fs.close(handle)
    return min(done, size)


def timed_staging(comm, reading: Callable[[], int]) -> tuple[int, float]:
    """Run `reading` (this rank's staging reads; the bytes read) between two barriers; (the
    bytes, the seconds from barrier to barrier). An OSError raises StagingFailed; a stop
    signal, seen by any rank, StopRequested on every rank once all have left their reads."""
    from mpi4py import MPI

    comm.Barrier()
    began = _core.now_ns()
    stop = 0
    try:
        read = reading()
    except StopRequested as exc:  # the others stop too, or finish: all meet below
        read, stop = 0, exc.signum
    except OSError as exc:
        # not an error the ranks agree on (check_all around the backend's opening): the
        # others are reading or waiting in the barrier, so this rank aborts the job now
        raise StagingFailed(describe(exc)) from exc
    stop = comm.allreduce(stop, op=MPI.MAX)  # the closing barrier, carrying the stop
    if stop:
        raise StopRequested(stop)  # agreed by check_all around the backend's opening
    return read, (_core.now_ns() - began) / 1e9


def rank_nodes(comm, MPI) -> np.ndarray:
    """The node of every rank (its shared-memory group's first rank, or emulated nodes of
    DLIO_MPI_RANKS_PER_NODE ranks), numbered from 0."""
    rank = comm.Get_rank()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    first = local.allreduce(rank, op=MPI.MIN)
    local_rank = local.Get_rank()
    local.Free()
    per = emulated_ranks_per_node()
    key = (first, local_rank // per) if per else (first, 0)
    keys = comm.allgather(key)
    numbering = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([numbering[k] for k in keys], dtype=np.int64)


def staging_record(comm, MPI, node: np.ndarray, files: int, opens: int, read: int,
                   seconds: float, held: int) -> dict:
    """describe()["staging"] (collective): `files` staged, `opens` and `read` bytes of this
    rank, `seconds` of staging, `held` bytes of memory on this rank."""
    total = comm.allreduce(read)
    per_node = np.zeros(int(node.max()) + 1, dtype=np.int64)
    np.add.at(per_node, node, np.array(comm.allgather(held), dtype=np.int64))
    return {"files": int(files), "opens": int(comm.allreduce(opens)),
            "bytes_read": int(total), "seconds": round(seconds, 6),
            "GiB_per_second": round(total / 2**30 / seconds, 6) if seconds > 0 else 0.0,
            "memory_bytes_per_rank_max": int(comm.allreduce(held, op=MPI.MAX)),
            "memory_bytes_per_node": per_node.tolist()}


def sample_places(layout, base: np.ndarray, samples_per_file: int,
                  ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(where in memory, bytes) of samples `ids` (any shape), their files' `layout`s (all
    the split's, Layouts) placed at `base`."""
    file = ids // samples_per_file
    where = base[file] + layout.data_offset[file] + (ids % samples_per_file) \
        * layout.sample_step[file]
    return where, layout.sample_bytes[file]


def verify_samples(files, layout, samples: np.ndarray, into: np.ndarray, backend: str) -> None:
    """Each sample of `samples`, one after the other in `into`, equals its bytes in its file
    (the tests' self-check of a staging backend's batches; slow)."""
    spf, put = files.split.samples_per_file, 0
    for sid in samples.tolist():
        f, k = divmod(sid, spf)
        n = int(layout.sample_bytes[f])
        at = int(layout.data_offset[f] + k * layout.sample_step[f])
        path = files.path(f)
        fs = storage_for(path)
        handle = fs.open_read(path)
        try:
            want = fs.read_at(handle, n, at)
        finally:
            fs.close(handle)
        if into[put:put + n].tobytes() != want:
            raise RuntimeError(f"{backend}: sample {sid} arrived with other bytes than "
                               f"{path} holds at offset {at}")
        put += n
