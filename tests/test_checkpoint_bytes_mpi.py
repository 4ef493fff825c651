"""Checkpoint bytes no storage can shortcut, under mpiexec -n 2 and -n 3: every 4 KiB block
a job's saves write (file per rank and shared, synchronous and asynchronous, shares of several
64 MiB blocks, two checkpoints) is unique, and nothing compresses: zlib on a sample of every
file, zstd with a window longer than a file (which would find a block repeated 64 MiB
later) on all of it. The bytes of before (a 64 MiB block repeated, a 16-byte stamp apart)
deduplicated 4x at 4 KiB."""

from __future__ import annotations

import hashlib
import os
import zlib

import pytest
from test_checkpoint_run_mpi import SMALL, _checkpoint_run

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

# llama_7b_zero3 at 18.6 M parameters: optimizer files of 73-110 MiB a rank (2-3 ranks)
MEDIUM = {**SMALL, "model.transformer.hidden_size": 768,
          "model.transformer.ffn_hidden_size": 1536, "model.transformer.vocab_size": 4096,
          "model.num_layers": 2}
GRANULE = 4096
SAMPLE = 1 << 20  # zlib's sample: this many bytes every 16 MiB of each file


def _written(folder) -> list[str]:
    return sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                  for name in names if name.endswith(".pt"))


def _granules_and_ratios(paths: list[str]) -> tuple[int, int, float, float]:
    """(4 KiB blocks, distinct ones, zlib ratio of the samples, zstd ratio of everything)."""
    import zstandard

    seen, blocks, sampled, packed, whole, squeezed = set(), 0, 0, 0, 0, 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for at in range(0, len(data), GRANULE):
            seen.add(hashlib.blake2b(data[at:at + GRANULE], digest_size=16).digest())
            blocks += 1
        for at in range(0, len(data), 16 << 20):
            sampled += len(data[at:at + SAMPLE])
            packed += len(zlib.compress(data[at:at + SAMPLE], 6))
        params = zstandard.ZstdCompressionParameters.from_level(
            1, window_log=28, enable_ldm=True)  # a 256 MiB window, long-distance matching
        whole += len(data)
        squeezed += len(zstandard.ZstdCompressor(compression_params=params).compress(data))
    return blocks, len(seen), sampled / packed, whole / squeezed


@pytest.mark.parametrize("layout", ["file_per_rank", "shared"])
@pytest.mark.parametrize("async_write", ["false", "true"])
def test_no_two_blocks_of_a_jobs_saves_are_equal_and_none_compress(shared_tmp, layout,
                                                                    async_write):
    from mpi4py import MPI

    _checkpoint_run(shared_tmp, "llama_7b_zero3", **MEDIUM,
                    **{"checkpoint.layout": layout, "checkpoint.async_write": async_write,
                       "checkpoint.num_checkpoints_read": 0})
    if MPI.COMM_WORLD.Get_rank() == 0:
        paths = _written(shared_tmp / "ck")
        assert len(paths) == (2 if layout == "shared" else 4 * MPI.COMM_WORLD.Get_size())
        assert max(os.path.getsize(p) for p in paths) > 64 << 20  # several blocks a file
        blocks, distinct, zlib_ratio, zstd_ratio = _granules_and_ratios(paths)
        assert distinct == blocks
        assert zlib_ratio <= 1.01 and zstd_ratio <= 1.01, (zlib_ratio, zstd_ratio)
    MPI.COMM_WORLD.Barrier()
