"""A storage-bound verdict for checkpoint saves and restores: each record splits the slowest
rank's time into the storage's calls (writes or reads and fsync timed in the C core; open,
close, rename, fadvise around them) and the emulator's (the rest: making or checking bytes,
barriers, Python), summary.json gives the largest share per kind, and the table says
"limited by the emulator" where it is above 10 %."""

from __future__ import annotations

import time

import pytest

from dlio_mpi.time_split import split_of

MEDIUM = {"model.transformer.hidden_size": 256, "model.transformer.ffn_hidden_size": 512,
          "model.transformer.vocab_size": 1024, "model.transformer.num_attention_heads": 8,
          "model.transformer.num_kv_heads": 8, "model.num_layers": 2}


def _run(tmp_path, **values):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    settings = {"checkpoint.checkpoint_folder": str(tmp_path / "ck"),
                "output.folder": str(tmp_path / "out"),
                "checkpoint.time_between_checkpoints": 0,
                "checkpoint.num_checkpoints_write": 2, "checkpoint.num_checkpoints_read": 2,
                **MEDIUM, **values}
    cfg = load_config("llama_7b_zero3", [f"{k}={v}" for k, v in settings.items()])
    return run(MPI.COMM_WORLD, cfg)


def test_the_split_names_what_limits_a_phase():
    assert split_of(1_000_000_000, 950_000_000) == {
        "storage_seconds": 0.95, "emulator_seconds": 0.05, "emulator_share": 0.05,
        "limited_by": "storage"}
    assert split_of(1_000_000_000, 800_000_000)["limited_by"] == "emulator"
    assert split_of(1_000, 5_000)["emulator_share"] == 0.0  # clocks apart: never negative


def test_every_save_and_restore_splits_its_time(tmp_path):
    summary = _run(tmp_path)
    ck = summary["dlio_mpi"]["checkpoint"]
    records = [r for r in ck["records"] if r["kind"] in ("save", "load")]
    assert [r["kind"] for r in records] == ["save", "save", "load", "load"]
    for r in records:
        split = r["time_split"]
        assert split["storage_seconds"] > 0
        assert split["storage_seconds"] + split["emulator_seconds"] == \
            pytest.approx(r["rank_seconds"]["max"], abs=1e-6)
    assert set(ck["time_split"]) == {"save", "load"}
    for kind, figures in ck["time_split"].items():
        mine = [r["time_split"] for r in records if r["kind"] == kind]
        assert figures["emulator_share_max"] == max(s["emulator_share"] for s in mine)


def test_a_phase_the_emulator_holds_up_is_called_so(tmp_path, monkeypatch):
    """50 ms of the emulator's own before each file's write (a slow maker, say): the saves are
    limited by the emulator and the table says so; the restores are not held up."""
    from dlio_mpi.checkpoint import file_per_rank
    from dlio_mpi.metrics.summary import format_table

    real = file_per_rank._core.write_shard

    def slow(*args, **kw):
        time.sleep(0.05)
        return real(*args, **kw)

    monkeypatch.setattr(file_per_rank._core, "write_shard", slow)
    summary = _run(tmp_path)
    split = summary["dlio_mpi"]["checkpoint"]["time_split"]
    assert split["save"]["limited_by"] == "emulator"
    assert split["save"]["emulator_seconds_total"] >= 2 * 2 * 0.05  # 2 saves of 2 files
    table = format_table([], [], summary)
    assert "checkpoint save:" in table and "LIMITED BY THE EMULATOR" in table.split(
        "checkpoint save:")[1].split("\n")[0]
