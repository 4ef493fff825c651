"""Shared dataset files written by all ranks together through MPI-IO.

When a dataset has fewer files than there are ranks (one or a few large files holding many
samples), dealing files out would leave most ranks idle and write each file from one client.
Instead every file is written by every rank: the file's temporary is created collectively
(File.Open with MODE_CREATE | MODE_EXCL, so that MPI-IO striping hints act at creation and
an existing file is never opened for writing), rank 0 writes the header and side files, and
the payload goes in rounds of one collective `Write_at_all` each, where rank r writes block
round * ranks + r of the payload stream (blocks of _core.PAYLOAD_BLOCK bytes, each made
alone: the bytes do not depend on how many ranks wrote them). Then File.Sync, Close, and
rank 0 completes the file with the others it staged (side files first, then renames).
The rounds and their error agreement are mpi/write_rounds.py's."""

from __future__ import annotations

from .. import _core
from ..errors import check_all, on_root
from ..formats.base import StagedWrites
from ..mpi.write_rounds import mpiio_call, open_shared, write_rounds
from ..storage.ownership import temporary_name
from .dataset import DatasetSplit


def collective_format(split: DatasetSplit) -> bool:
    """Whether the split's format can be written in parts (npz cannot: its zip headers hold
    the CRC of the whole payload)."""
    return split.num_files > 0 and split.format.payload_extent(split.spec(0)) is not None


def write_file_collectively(comm, split: DatasetSplit, index: int, seed: int,
                            staged: StagedWrites | None, hints: dict[str, str]
                            ) -> tuple[int, dict[str, str]]:
    """Write file `index` of `split` with every rank of `comm`; `staged` is rank 0's (None on
    the others). Returns the file's size and the MPI-IO hints in effect for it."""
    from mpi4py import MPI

    from ..mpi.library import file_hints

    path, spec, fmt = split.path(index), split.spec(index), split.format
    header, payload = fmt.payload_extent(spec)
    tmp = comm.bcast(temporary_name(path, staged.tag) if staged is not None else None, root=0)
    on_root(comm, lambda: fmt.write_side_files(path, spec, staged))
    # MODE_EXCL: a file in the way is never written
    handle = open_shared(comm, tmp, hints, MPI.MODE_WRONLY | MPI.MODE_CREATE | MPI.MODE_EXCL)
    if staged is not None:  # from now on, removed with the others on failure
        staged.adopt(tmp, path, len(header) + payload)
    try:
        effective = file_hints(handle)
        if header:
            check_all(comm, lambda: comm.Get_rank() or mpiio_call(
                lambda: handle.Write_at(0, header), "write the header of", tmp))
        _write_payload(comm, handle, len(header), payload, seed, tmp)
        check_all(comm, lambda: mpiio_call(handle.Sync, "sync", tmp))
    finally:
        handle.Close()
    return len(header) + payload, effective


def _write_payload(comm, handle, at: int, nbytes: int, seed: int, path: str) -> None:
    """The payload stream's bytes [0, nbytes) at file offset `at`: in round r, rank i writes
    block r * ranks + i (blocks of _core.PAYLOAD_BLOCK bytes, each made alone)."""
    block = _core.PAYLOAD_BLOCK
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = range(rank, -(-nbytes // block), size)
    write_rounds(comm, handle, [
        (at + k * block, min(block, nbytes - k * block),
         lambda view, start=k * block: _core.fill_random(view, seed, start)) for k in mine],
        path)
