"""Writing a run's results takes time linear in its epochs with a small constant, as a
stopped run writes them before it exits (issue 30): each epoch's figures and
per_epoch_stats.json entry are computed once, the same to the bit as numpy's mean and sum
over the ranks; the files of one entry an epoch are written one entry a line by json's C
encoder and read as json.dumps would have written them; the per-rank files come from one pass;
the table printed shows at most TABLE_EPOCHS epochs of a phase and names those left out."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields

import numpy as np
import pytest

from helpers import workload_overrides

MIB = 2**20


def _record(epoch: int, rank: int, rng):
    from dlio_mpi.metrics import latency
    from dlio_mpi.metrics.summary import EpochRecord

    values = {f.name: int(rng.integers(0, 1 << 20)) if f.type == "int" else float(rng.random())
              for f in fields(EpochRecord)
              if f.name not in ("epoch", "rank", "steps", "latency_hist", "cache")}
    values["start"] = 1.7e9 + epoch + rank * 1e-3
    values["end"] = values["start"] + 0.5
    return EpochRecord(epoch=epoch, rank=rank, steps=4, cache=None,
                       latency_hist=latency.histogram(rng.lognormal(11, 1, 20)), **values)


def _epochs(numbers, ranks: int, seed: int = 0) -> list:
    from dlio_mpi.metrics.summary import EpochSummary

    rng = np.random.default_rng(seed)
    return [EpochSummary(e, [_record(e, r, rng) for r in range(ranks)], 4096.0)
            for e in numbers]


def _summary(train, evals) -> dict:
    from dlio_mpi.metrics.summary import build_summary

    class Cfg:
        class metric:
            au = 0.9

    return build_summary(train, evals, Cfg, {"data_size_per_host_GB": 0.0})


def _epoch_rows(table: str, phase: str) -> list[int]:
    return [int(m.group(1)) for line in table.splitlines()
            if (m := re.match(rf" *{phase} +(\d+) ", line))]


def test_the_table_of_many_epochs_shows_the_first_and_last_and_names_those_left_out():
    from dlio_mpi.metrics.summary import TABLE_EPOCHS, format_table

    train = _epochs(range(1, 1001), ranks=2)
    evals = _epochs(range(2, 1001, 2), ranks=2, seed=1)  # every second epoch
    table = format_table(train, evals, _summary(train, evals))
    half = TABLE_EPOCHS // 2
    assert _epoch_rows(table, "train") == [*range(1, half + 1), *range(1001 - half, 1001)]
    assert _epoch_rows(table, "eval") == [*range(2, 2 * half + 1, 2),
                                          *range(1002 - 2 * half, 1001, 2)]
    gaps = [line for line in table.splitlines() if "left out" in line]
    assert gaps == [
        f"train   ... {1000 - TABLE_EPOCHS} epochs left out here ({half + 1} to "
        f"{1000 - half}): per_epoch_stats.json holds every epoch",
        f" eval   ... {500 - TABLE_EPOCHS} epochs left out here ({2 * half + 2} to "
        f"{1000 - 2 * half}): per_epoch_stats.json holds every epoch"]
    assert len(table.splitlines()) == 1 + 2 * (TABLE_EPOCHS + 1) + 3


def test_the_table_of_a_short_run_has_a_row_per_epoch():
    from dlio_mpi.metrics.summary import TABLE_EPOCHS, format_table

    train = _epochs(range(1, TABLE_EPOCHS + 1), ranks=3)
    evals = _epochs([5, 10], ranks=3, seed=1)
    table = format_table(train, evals, _summary(train, evals))
    assert _epoch_rows(table, "train") == list(range(1, TABLE_EPOCHS + 1))
    assert _epoch_rows(table, "eval") == [5, 10]
    assert "left out" not in table
    p50, p99 = train[0].read_latency_ms
    assert table.splitlines()[1].endswith(f"{p50:>8.3f} {p99:>8.3f}")


@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 8, 9, 16, 33])
def test_an_epoch_s_figures_are_numpy_s_mean_and_sum_over_the_ranks_to_the_bit(ranks):
    summary = _epochs([1], ranks, seed=ranks)[0]
    records = summary.records
    assert summary.au_percentage == float(np.mean([r.au_percentage for r in records]))
    assert summary.au_without_barrier_percentage == float(
        np.mean([r.au_without_barrier_percentage for r in records]))
    assert summary.overhead_us_per_step == float(
        np.mean([r.overhead_us_per_step for r in records]))
    assert summary.samples_per_second == float(np.sum([r.samples_per_second for r in records]))
    assert summary.au_span_samples_per_second == float(
        np.sum([r.au_span_samples_per_second for r in records]))
    assert np.array_equal(summary.latency_hist(), np.sum([r.latency_hist for r in records],
                                                         axis=0))


def test_an_epoch_s_entry_is_encoded_once_as_json_dumps_writes_it():
    summary = _epochs([3], ranks=2)[0]
    text = summary.json_text()
    assert summary.json_text() is text and json.loads(text) == json.loads(
        json.dumps(summary.to_json()))
    entry = summary.to_json()
    assert [set(r) for r in entry["per_rank"]] == [set(entry["per_rank"][0])] * 2
    assert "latency_hist" not in entry["per_rank"][0] and "epoch" not in entry["per_rank"][0]


def test_per_epoch_stats_add_evaluations_and_checkpoints_as_dict_update_does():
    from dlio_mpi.metrics.summary import per_epoch_stats
    from dlio_mpi.results import jsonfile

    train = _epochs([1, 2, 3], ranks=2)
    evals = _epochs([2, 3], ranks=2, seed=1)
    extra = {3: {"save_ckpt1": {"start": "x", "duration": 1.5}}, 7: {"load_ckpt1": {"a": [1]}}}
    expected = {str(e.epoch): e.to_json() for e in train}
    for e in evals:
        expected[str(e.epoch)]["eval"] = e.to_json()
    for epoch, entries in extra.items():
        expected.setdefault(str(epoch), {}).update(entries)
    stats = per_epoch_stats(train, evals, extra)
    assert list(stats) == ["1", "2", "3", "7"]
    text = jsonfile.dumps(stats)
    assert text == jsonfile.dumps(json.loads(json.dumps(expected)))  # same text, same order
    assert jsonfile.dumps(per_epoch_stats([], [], {})) == "{}"


def test_the_results_files_hold_every_epoch_one_a_line_as_json_reads_them(tmp_path):
    from dlio_mpi.config import load_config
    from dlio_mpi.mpi.topology import HostInfo
    from dlio_mpi.results.folder import OutputFolder
    from dlio_mpi.results.names import iso_time
    from dlio_mpi.run import RunRecord, write_result_files

    ranks, epochs = 3, 300
    train = _epochs(range(1, epochs + 1), ranks)
    evals = _epochs(range(3, epochs + 1, 3), ranks, seed=1)
    cfg = load_config("demo", workload_overrides(tmp_path))
    out = OutputFolder(str(tmp_path), "dlio.log")
    hosts = [HostInfo(f"h{r}", 4, 2**34, "cpu") for r in range(ranks)]
    header = {"num_accelerators": ranks, "data_size_per_host_GB": 1.0, "dlio_mpi": {}}
    record = RunRecord(0.0, out, None, train_epochs=train, eval_epochs=evals)
    summary, table = write_result_files(out, cfg, header, record, hosts, 0)
    text = (tmp_path / "per_epoch_stats.json").read_text()
    stats = json.loads(text)
    expected = {str(e.epoch): e.to_json() for e in train}
    for e in evals:
        expected[str(e.epoch)]["eval"] = e.to_json()
    assert stats == json.loads(json.dumps(expected)) and len(stats) == epochs
    assert len(text.splitlines()) == epochs + 2  # "{", an epoch a line, "}"
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(
        json.dumps(summary))
    for rank in range(ranks):
        output = json.loads((tmp_path / f"{rank}_output.json").read_text())
        own = json.loads((tmp_path / f"{rank}_per_epoch_stats.json").read_text())
        assert output["hostname"] == f"h{rank}" and len(own) == epochs
        for e in train:
            mine = e.records[rank]
            assert output[str(e.epoch)]["au"]["block1"] == mine.au_percentage
            assert own[str(e.epoch)]["duration"] == mine.end - mine.start
        for e in evals:
            mine = e.records[rank]
            assert output[str(e.epoch)]["throughput"]["eval"] == mine.samples_per_second
            assert own[str(e.epoch)]["eval"]["start"] == iso_time(mine.start)
    assert sorted(out.files) == sorted(["summary.json", "per_epoch_stats.json", "config.yaml",
                                        *(f"{r}_{n}.json" for r in range(ranks)
                                          for n in ("output", "per_epoch_stats"))])
    assert "left out" in table


@pytest.mark.parametrize("depth", [0, 1, 2, None])
def test_jsonfile_reads_as_json_dumps_and_indents_as_json_does(depth):
    from dlio_mpi.results import jsonfile

    obj = {"a": [1, 2.5, "x"], "b": {"c": {}, "d": [], "e": [{"f": None}, {"g": [True]}]},
           "i": (1, 2), "j": {1: "int key", 2.5: "float key", None: 0}, "k": "é\n\"",
           "l": -math.inf}
    assert json.loads(jsonfile.dumps(obj, depth)) == json.loads(json.dumps(obj))
    assert math.isnan(json.loads(jsonfile.dumps({"h": math.nan}, depth))["h"])
    plain = {"a": {"b": 1, "c": {}}, "d": [{"e": 2}], "f": []}  # no list of scalars
    assert jsonfile.dumps(plain, None) == json.dumps(plain, indent=2)
    lines = jsonfile.dumps({str(k): {"v": [k, k]} for k in range(5)}).splitlines()
    assert lines[1:-1] == [f'  "{k}": {{"v": [{k}, {k}]}},' for k in range(4)] + [
        '  "4": {"v": [4, 4]}']
    with pytest.raises(TypeError):
        jsonfile.dumps({"x": object()})
