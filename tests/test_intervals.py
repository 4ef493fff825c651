"""output.stats_interval (intervals.py): real runs on 2 and 3 MPI ranks with a real compute
time; the interval rows add up to the epochs (samples, bytes), their AU agrees with the
epoch's, one line per row in rank 0's log and stdout (no other rank prints); 0 turns it all
off. summary.json's bandwidth per node (one emulated node per rank here)."""

from __future__ import annotations

import json
import re

import pytest

from helpers import run_cli, workload_overrides

pytestmark = pytest.mark.timeout(120)

LINE = re.compile(
    r"interval: (train|eval) epoch (\d+) \[\d+\.\d-\d+\.\d s\]: \d+\.\d samples/s, "
    r"\d+\.\d MiB/s read, AU \d+\.\d %, read latency mean \d+\.\d us, p50 \d+\.\d us, "
    r"p99 \d+\.\d us, (\d+)/(\d+) ranks")


def _run(tmp_path, ranks: int, **values):
    """2 epochs of 0.03 s steps (60 files of batch 2: 15 steps on 2 ranks, 10 on 3), then
    evaluation after each (8 files, batch 1, 0.02 s), each rank its own emulated node."""
    args = ["run", "demo", *workload_overrides(
        tmp_path, dataset__num_files_train=60, train__computation_time=0.03,
        workflow__evaluation="true", dataset__num_files_eval=2 * ranks,
        evaluation__eval_time=0.02, output__progress_interval=0, **values)]
    return run_cli(args, ranks=ranks)


@pytest.fixture(autouse=True)
def _node_per_rank(monkeypatch):
    monkeypatch.setenv("DLIO_MPI_RANKS_PER_NODE", "1")


@pytest.mark.parametrize("ranks", [2, 3])
def test_interval_rows_add_up_to_the_epochs_and_only_rank_0_prints_them(tmp_path, ranks):
    res = _run(tmp_path, ranks, output__stats_interval=0.1)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    rows = json.loads((out / "interval_stats.json").read_text())
    stats = json.loads((out / "per_epoch_stats.json").read_text())
    listed = json.loads((out / "dlio_mpi_results.json").read_text())["files"]
    assert "interval_stats.json" in listed
    for phase in ("train", "eval"):
        for epoch in ("1", "2"):
            entry = stats[epoch] if phase == "train" else stats[epoch]["eval"]
            mine = [r for r in rows if r["phase"] == phase and r["epoch"] == int(epoch)]
            assert mine, (phase, epoch, rows)
            batch = 2 if phase == "train" else 1
            assert sum(r["samples"] for r in mine) == entry["steps"] * batch * ranks
            assert sum(r["steps"] for r in mine) == entry["steps"] * ranks
            assert sum(r["bytes"] for r in mine) == entry["bytes_transferred"]
            assert sum(r["read_ops"] for r in mine) == entry["read_ops"]
            indices = [r["interval"] for r in mine]
            assert indices == list(range(indices[0], indices[0] + len(indices)))
            for r in mine:
                assert 1 <= r["ranks"] <= ranks
                assert 0 < r["seconds"] <= 0.1 * 1.25 + 0.1  # at most 1.25 N, and wake-up delay
                assert r["samples_per_second"] == pytest.approx(r["samples"] / r["seconds"])
                assert r["MiB_per_second"] == pytest.approx(r["bytes"] / 2**20 / r["seconds"])
                lat = r["read_latency_us"]
                if r["steps"]:
                    assert 0 < lat["p50"] <= lat["p99"] and lat["mean"] > 0
            if phase == "train":
                # the rows' time-weighted AU: each rank's planned compute over its block (the
                # first step's wait included, which the epoch's AU leaves out), and so
                # roughly the epoch's AU
                seconds = sum(r["seconds"] for r in mine)
                au = sum(r["au_percentage"] * r["seconds"] for r in mine) / seconds
                block = [100 * entry["steps"] * 0.03 / row["block_seconds"]
                         for row in entry["per_rank"]]
                assert au == pytest.approx(sum(block) / ranks, abs=3), mine
                assert au == pytest.approx(entry["au_percentage"], abs=15), mine
                assert len(mine) >= 3  # 0.45 s or 0.3 s of steps, a row per 0.1 s
    starts = [r["start_s"] for r in rows]
    assert starts == sorted(starts)  # a time series
    # one line per row, from rank 0 alone: in stdout and in the log
    printed = [line for line in res.stdout.splitlines() if line.startswith("interval:")]
    logged = [line for line in (out / "dlio.log").read_text().splitlines()
              if line.startswith("interval:")]
    assert len(printed) == len(logged) == len(rows), res.stdout
    assert printed == logged
    for line, row in zip(printed, rows):
        match = LINE.fullmatch(line)
        assert match, line
        assert (match[1], int(match[2])) == (row["phase"], row["epoch"])
        assert int(match[3]) == row["ranks"] and int(match[4]) == ranks
    assert "interval:" not in res.stderr
    # every epoch's rows come before its summary line
    log = (out / "dlio.log").read_text()
    last_row = log.rindex("interval: train epoch 1 ")
    assert last_row < log.index("train epoch 1: AU") < log.index("interval: eval epoch 1 ")


@pytest.mark.parametrize("ranks", [2, 3])
def test_bandwidth_per_node_is_each_nodes_bytes_over_the_training_time(tmp_path, ranks):
    res = _run(tmp_path, ranks, output__stats_interval=0)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    # stats_interval 0: no file, no line
    assert not (out / "interval_stats.json").exists()
    assert "interval:" not in res.stdout and "interval:" not in (out / "dlio.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    stats = json.loads((out / "per_epoch_stats.json").read_text())
    nodes = summary["dlio_mpi"]["bandwidth_per_node"]
    assert [n["node"] for n in nodes] == list(range(ranks))
    assert [n["ranks"] for n in nodes] == [[r] for r in range(ranks)]  # a node per rank
    seconds = sum(stats[e]["duration"] for e in ("1", "2"))
    for n in nodes:
        mine = sum(row["bytes_transferred"] for e in ("1", "2")
                   for row in stats[e]["per_rank"] if row["rank"] == n["ranks"][0])
        assert n["bytes_transferred"] == mine > 0
        assert n["seconds"] == pytest.approx(seconds, rel=1e-5)
        assert n["MiB_per_second"] == pytest.approx(mine / 2**20 / n["seconds"])
    assert sum(n["bytes_transferred"] for n in nodes) == \
        summary["metric"]["train_bytes_transferred"]


@pytest.mark.parametrize("value", [-1, 0.001])
def test_a_negative_or_too_short_stats_interval_is_refused(tmp_path, value):
    res = _run(tmp_path, 1, output__stats_interval=value)
    assert res.returncode == 2 and "output.stats_interval" in res.stderr, res.stderr
    assert not (tmp_path / "data").exists()
