"""A stop stays a stop through nested collectives (errors.py): a writer that agrees its own
calls (check_all inside) and the checkpointer that agrees the whole save (check_all outside)
end in Stopped, exit 128 + the signal, not in a failure (exit 2); a real failure on any rank
still outweighs it."""

from __future__ import annotations

import signal

import pytest

from dlio_mpi.errors import JobError, Stopped, StopRequested, check_all, on_root


def _comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def _stopping():
    raise StopRequested(signal.SIGTERM)


def test_a_stop_agreed_inside_stays_a_stop_outside():
    comm = _comm()
    with pytest.raises(Stopped) as caught:
        check_all(comm, lambda: check_all(comm, _stopping))
    assert caught.value.exit_status == 128 + signal.SIGTERM
    with pytest.raises(Stopped):
        on_root(comm, lambda: check_all(comm, _stopping))


def test_a_failure_is_not_taken_for_a_stop():
    def failing():
        raise OSError(5, "the disk failed")

    with pytest.raises(JobError) as caught:
        check_all(_comm(), lambda: check_all(_comm(), failing))
    assert not isinstance(caught.value, Stopped) and "the disk failed" in str(caught.value)
