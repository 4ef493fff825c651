"""checkpoint.content: checkpoint bytes that compress R:1 (zstd and lz4, per 128 KiB record
as storage compresses, and whole) and deduplicate D:1 at 4 KiB, written and read back by
the writers; the default, fresh bytes, neither compresses nor deduplicates."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from dlio_mpi import _core
from dlio_mpi.checkpoint.content import core_content
from dlio_mpi.config.schema import Content
from helpers import ckpt_stream

MiB = 1 << 20
RECORD = 128 << 10
ROOT = Path(__file__).resolve().parents[1] / ".pytest_tmp"


def ratios(data: bytes) -> dict[str, float]:
    """zstd-1 and lz4 per 128 KiB record, zstd-3 whole, and 4 KiB deduplication."""
    import lz4.frame
    import zstandard

    records = [data[at:at + RECORD] for at in range(0, len(data), RECORD)]
    zstd1 = zstandard.ZstdCompressor(level=1)
    blocks = [data[at:at + 4096] for at in range(0, len(data), 4096)]
    return {"zstd": len(data) / sum(len(zstd1.compress(r)) for r in records),
            "lz4": len(data) / sum(len(lz4.frame.compress(r)) for r in records),
            "zstd_whole": len(data) / len(zstandard.ZstdCompressor(level=3).compress(data)),
            "dedup": len(blocks) / len({hashlib.blake2b(b, digest_size=16).digest()
                                        for b in blocks})}


def stream(nbytes: int, compression: float, dedup: float, seed: int = 5) -> bytes:
    out = np.empty(nbytes, dtype=np.uint8)
    _core.ckpt_fill(out, seed, 0, core_content(Content(compression, dedup), nbytes))
    return out.tobytes()


def test_the_default_neither_compresses_nor_deduplicates():
    assert core_content(Content(), 64 * MiB) is None
    got = ratios(stream(16 * MiB, 1, 1))
    assert all(value < 1.01 for value in got.values()), got


@pytest.mark.parametrize("compression,dedup", [(2, 1), (4, 1), (1.28, 1), (1, 2), (1, 5),
                                               (3, 4)])
def test_bytes_compress_and_deduplicate_as_asked(compression, dedup):
    got = ratios(stream(16 * MiB, compression, dedup))
    for name in ("zstd", "lz4", "zstd_whole"):
        assert compression * 0.95 <= got[name] <= compression * 1.02, (name, got)
    assert got["dedup"] == pytest.approx(dedup, rel=0.01), got


def test_the_stream_with_a_content_is_what_the_numpy_model_makes():
    content = core_content(Content(3, 4), 5 * MiB)
    made = np.empty(MiB + 100, dtype=np.uint8)
    _core.ckpt_fill(made, 9, 2 * MiB + 7, content)
    assert made.tobytes() == ckpt_stream(9, 2 * MiB + 7, MiB + 100, content)


def test_a_written_shard_with_a_content_reads_back_and_is_checked():
    folder = ROOT / f"content-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        from dlio_mpi.checkpoint.file_per_rank import FilePerRank
        from dlio_mpi.checkpoint.sizing import RankShard

        (folder / "c1").mkdir()
        shard = RankShard(0, (("a.pt", 3 * MiB + 5), ("b.pt", 2 * MiB)))
        writer = FilePerRank(str(folder), "t", False, False, content=Content(4, 2))
        writer.save(1, "c1", shard)
        assert 3.8 <= ratios((folder / "c1" / "a.pt").read_bytes())["zstd"] <= 4.1
        assert writer.load(1, "c1", shard).bytes == shard.nbytes
        fresh = FilePerRank(str(folder), "t", False, False)  # another content: refused
        with pytest.raises(OSError, match="do not hold the bytes written"):
            fresh.load(1, "c1", shard)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_ratios_out_of_range_are_refused_before_any_io():
    from dlio_mpi.config import load_config
    from dlio_mpi.errors import ConfigError

    for key, value, said in [("compression_ratio", "0.5", ">= 1"),
                             ("compression_ratio", "65", "<= 64"),
                             ("dedup_ratio", "0", ">= 1")]:
        with pytest.raises(ConfigError, match=f"checkpoint.content.{key}: .*{said}"):
            load_config("llama_7b_zero3", [f"checkpoint.content.{key}={value}"])


@pytest.mark.parametrize("layout", ["file_per_rank", "dcp"])
def test_a_run_with_a_content_saves_and_restores(tmp_path, layout):
    """Every writer takes the content (its files compress as asked) and restores check it."""
    from mpi4py import MPI
    from test_checkpoint_time_split import MEDIUM

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {"checkpoint.checkpoint_folder": str(tmp_path / "ck"),
                "output.folder": str(tmp_path / "out"), "checkpoint.layout": layout,
                "checkpoint.time_between_checkpoints": 0,
                "checkpoint.num_checkpoints_write": 1, "checkpoint.num_checkpoints_read": 1,
                "checkpoint.content.compression_ratio": 4, **MEDIUM}
    summary = run(MPI.COMM_WORLD, load_config("llama_7b_zero3", [
        f"{k}={v}" for k, v in settings.items()]))
    kinds = [r["kind"] for r in summary["dlio_mpi"]["checkpoint"]["records"]]
    assert kinds == ["save", "load"]
    largest = max((p for p in (tmp_path / "ck").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    assert 3.5 <= ratios(largest.read_bytes())["zstd"] <= 4.1
