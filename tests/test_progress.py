"""Rank 0's progress reporter (progress.py) on its own: lines at most once per interval, a
heartbeat while nothing moves, a tqdm bar on a terminal, nothing when off."""

from __future__ import annotations

import io
import time

from dlio_mpi import progress
from dlio_mpi.progress import Reporter, Task


def test_lines_come_at_most_once_per_interval():
    out = io.StringIO()
    task = Task("generation (rank 0's files)", 40, "files", interval=0.1, stream=out)
    for _ in range(40):
        time.sleep(0.01)
        task.advance()
    task.close()
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 5, lines  # 0.4 s of work, one line per 0.1 s at most
    assert all(line.startswith("progress: generation (rank 0's files): ") for line in lines)
    assert " files (" in lines[-1] and " files/s, " in lines[-1] and "ETA" in lines[-1]


def test_a_watched_task_shows_its_elapsed_time_while_nothing_moves():
    out = io.StringIO()
    with Task("checkpoint save 1 (global_epoch1_step2)", 1, "checkpoints", interval=0.1,
              stream=out) as task:
        task.watch()
        time.sleep(0.45)
        task.advance()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2, lines
    assert lines[0].startswith("progress: checkpoint save 1 (global_epoch1_step2): 0/1 "
                               "checkpoints (0.0 %)")


def test_a_watched_counter_is_polled_from_a_thread():
    out = io.StringIO()
    done = [0]
    with Task("train epoch 1", 100, "steps", interval=0.05, stream=out) as task:
        task.watch(lambda: done[0])
        for _ in range(10):
            done[0] += 10
            time.sleep(0.05)
    lines = out.getvalue().splitlines()
    counts = [int(line.split(": ")[2].split("/")[0]) for line in lines]
    assert counts and counts == sorted(counts) and counts[-1] <= 100
    # the lines after the first give the last interval's rate too
    assert all("; last " in line and " steps/s" in line for line in lines[1:]), lines


def test_a_terminal_gets_a_bar():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    task = Reporter(10.0, out).task("train epoch 1", 5, "steps")
    for _ in range(5):
        task.advance()
    task.close()
    text = out.getvalue()
    assert text.startswith("\rtrain epoch 1:") and "5/5" in text and "steps/s" in text
    assert "progress:" not in text


def test_off_and_other_ranks_show_nothing(capsys):
    for rank, interval in ((0, 0.0), (1, 10.0)):
        progress.configure(rank, interval)
        task = progress.task("train epoch 1", 3, "steps")
        assert not task.active
        task.watch(lambda: 1)
        task.advance(3)
        task.close()
    progress.configure(0, 0.0)
    assert capsys.readouterr().out == ""


def test_a_task_in_bytes_shows_mib(tmp_path):
    """Checkpoints are followed in bytes of rank 0's share (its process's /proc io counter)."""
    from dlio_mpi.storage.counters import process_field as _process_io

    out = io.StringIO()
    before = _process_io("wchar")
    assert before >= 0
    total = 8 << 20
    with Task("checkpoint save 1 (global_epoch1_step2), rank 0's share", total,
              progress.BYTES, interval=0.05, stream=out) as task:
        task.watch(lambda: min(_process_io("wchar") - before, total))
        with open(tmp_path / "share", "wb") as fp:
            for _ in range(8):
                fp.write(b"\0" * (1 << 20))
                fp.flush()
                time.sleep(0.04)
    assert _process_io("wchar") - before >= total
    lines = out.getvalue().splitlines()
    assert lines, lines
    done = [float(line.split(": ")[2].split("/")[0]) for line in lines]
    assert done == sorted(done) and done[-1] <= 8.0
    assert all("/8.0 MiB (" in line and " MiB/s, " in line for line in lines), lines


def test_a_terminal_bar_in_bytes_is_scaled():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    task = Reporter(10.0, out).task("checkpoint load 1", 3 << 20, progress.BYTES)
    task.advance(3 << 20)
    task.close()
    assert "3.00M/3.00M" in out.getvalue(), out.getvalue()
