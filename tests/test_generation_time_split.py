"""Data generation's storage-bound verdict: the slowest rank's time split into the storage's
calls (the C core's pwrite calls, timed around each; open, close, syncfs and rename around
them) and the emulator's (making the bytes, encoding, Python), in the result and the line
the run prints."""

from __future__ import annotations

import pytest


def _generate(tmp_path, fmt: str):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.plan.derive import derive_plan
    from dlio_mpi.run import run_generation

    cfg = load_config("demo", [f"dataset.data_folder={tmp_path / fmt}", f"dataset.format={fmt}",
                               "dataset.num_files_train=16"])
    return run_generation(MPI.COMM_WORLD, cfg, derive_plan(cfg, 1))


@pytest.mark.parametrize("fmt", ["npz", "jpeg", "tfrecord"])
def test_a_generation_splits_its_time(tmp_path, fmt, capsys):
    result = _generate(tmp_path, fmt)
    split = result.time_split
    assert result.files_written == 16 and split is not None
    assert split["storage_seconds"] > 0 and split["emulator_seconds"] > 0
    assert split["storage_seconds"] + split["emulator_seconds"] == pytest.approx(
        result.seconds, abs=1e-6)
    assert f"the storage's calls {split['storage_seconds']:.3f} s" in capsys.readouterr().out
    assert _generate(tmp_path, fmt).files_written == 0  # complete: nothing written again


def test_the_c_cores_write_time_counts_only_its_writes(tmp_path):
    import os

    from dlio_mpi import _core

    before = _core.write_ns()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        _core.write_random(fd, 0, 32 << 20, 1, 0, "f")
    finally:
        os.close(fd)
    spent = _core.write_ns() - before
    assert spent > 0
    begun = _core.now_ns()
    _core.ckpt_fill(bytearray(8 << 20), 1)  # making bytes is not a write
    assert _core.write_ns() - before == spent and _core.now_ns() > begun
