"""A stopped generation ends within a stage of files (issue 30): the survey of a rank's
files looks for the stop every STAGE_FILES files (2 x 10^6 files took 14-19 s to survey
before a SIGTERM was seen), and a stop while writing completes the files staged, at most
STAGE_BYTES a rank (their syncfs is what the stop waits for). The signal is stood in for by
_core.stop_signal, patched. Runs in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import signal

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

MiB = 1 << 20


def _generate(tmp, **values):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.data.generate import generate
    from dlio_mpi.run import prepare

    cfg = load_config("demo", workload_overrides(tmp, workflow__generate_data="true",
                                                 workflow__train="false",
                                                 dataset__format="npy", **values))
    plan, _ = prepare(MPI.COMM_WORLD, cfg, generating=True)
    return generate(MPI.COMM_WORLD, cfg, plan.splits, plan.layouts)


def _stop_when(monkeypatch, asked) -> None:
    """_core.stop_signal says SIGTERM once asked() is true, on this rank."""
    from dlio_mpi import _core

    monkeypatch.setattr(_core, "stop_signal", lambda: signal.SIGTERM if asked() else 0)


def test_a_stop_during_the_survey_ends_it_within_a_stage_of_files(shared_tmp, monkeypatch):
    from mpi4py import MPI

    from dlio_mpi import _core
    from dlio_mpi.data.generate import STAGE_FILES
    from dlio_mpi.errors import Stopped

    looked = []
    regular_size = _core.regular_size

    def counted(path):
        looked.append(path)
        return regular_size(path)

    monkeypatch.setattr(_core, "regular_size", counted)
    _stop_when(monkeypatch, lambda: len(looked) >= 1500)
    files = 5000 * MPI.COMM_WORLD.Get_size()  # 5,000 a rank
    with pytest.raises(Stopped, match="stopped by SIGTERM before writing"):
        _generate(shared_tmp / "survey", dataset__num_files_train=files)
    assert 1500 <= len(looked) <= 1500 + STAGE_FILES
    assert not list((shared_tmp / "survey" / "data").rglob("*.npy"))


def test_a_stop_while_writing_completes_at_most_a_stage_of_bytes(shared_tmp, monkeypatch):
    from mpi4py import MPI

    from dlio_mpi.data.generate import STAGE_BYTES
    from dlio_mpi.errors import Stopped
    from dlio_mpi.formats.base import StagedWrites

    staged, written = [], []  # each completion's bytes; the files written
    commit, write = StagedWrites.commit, StagedWrites.write

    def counted_commit(self):
        if self.pending:
            staged.append(self.bytes)
        commit(self)

    def counted_write(self, path, fill):
        written.append(path)
        return write(self, path, fill)

    monkeypatch.setattr(StagedWrites, "commit", counted_commit)
    monkeypatch.setattr(StagedWrites, "write", counted_write)
    _stop_when(monkeypatch, lambda: len(written) >= 80)
    comm = MPI.COMM_WORLD
    with pytest.raises(Stopped, match="stopped by SIGTERM; complete files stay"):
        _generate(shared_tmp / "writing", dataset__num_files_train=100 * comm.Get_size(),
                  dataset__record_length_bytes=MiB)
    # 80 files of 1 MiB: more than a stage; each completion holds at most one stage
    assert len(staged) >= 2 and max(staged) < STAGE_BYTES + 2 * MiB
    comm.Barrier()
    data = shared_tmp / "writing" / "data"
    assert len(list(data.rglob("*.npy"))) == comm.allreduce(len(written))
    assert not [p for p in data.rglob("*") if p.name.endswith(".tmp")]
