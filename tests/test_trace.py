"""output.trace: each rank's Chrome trace-event file (trace_rank<R>.json.gz) parses, holds one
wait, compute and barrier span per step and epoch on its steps track, one read span per
planned request on its reader threads' tracks (real files, offsets inside them), checkpoint
spans; backends without per-request data give the step spans only; off, nothing is written."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter

import pytest

from helpers import run_cli, workload_overrides

STEPS_TID = 1


def _load(out, rank: int) -> list[dict]:
    with gzip.open(out / f"trace_rank{rank}.json.gz", "rt") as fp:
        doc = json.load(fp)
    assert doc["displayTimeUnit"] == "ms"
    return doc["traceEvents"]


def _check_steps(events: list[dict], rank: int, steps: int, barrier: bool = True) -> None:
    """One wait, compute (and barrier) span per step, in order and not overlapping."""
    assert all(e["pid"] == rank for e in events)
    meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": f"rank {rank}"}
    assert meta[("thread_name", STEPS_TID)] == {"name": "steps"}
    kinds = ["wait", "compute"] + (["barrier"] if barrier else [])
    spans = sorted((e for e in events if e["ph"] == "X" and e["name"] in kinds),
                   key=lambda e: (e["ts"], kinds.index(e["name"])))
    assert Counter(e["name"] for e in spans) == {k: steps for k in kinds}
    assert all(e["tid"] == STEPS_TID and e["dur"] >= 0 for e in spans)
    assert [e["name"] for e in spans] == kinds * steps  # each step's, in order
    for a, b in zip(spans, spans[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 0.002  # rounding to the ns
    assert spans[0]["ts"] >= 0


def _reads(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e["name"] == "read"]


def test_two_rank_run_traces_steps_and_every_request(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, output__trace="true", reader__read_threads=2,
        train__computation_time=0.001, workflow__evaluation="true", dataset__num_files_eval=4,
        reader__batch_size_eval=1)])
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["dlio_mpi"]["steps_per_epoch"] * 2
    names = json.loads((out / "dlio_mpi_results.json").read_text())["files"]
    assert {"trace_rank0.json.gz", "trace_rank1.json.gz"} <= set(names)
    requests = Counter()
    for rank in (0, 1):
        events = _load(out, rank)
        _check_steps(events, rank, steps)
        # evaluation: its own steps (no barrier) and reader threads, after each epoch
        evals = Counter(e["name"] for e in events if e.get("cat") == "eval")
        assert evals["eval wait"] == evals["eval compute"] > 0 and len(evals) == 2
        epochs = [e["name"] for e in sorted(events, key=lambda e: e.get("ts", -1))
                  if e.get("cat") == "epoch"]
        assert epochs == ["train epoch 1", "eval epoch 1", "train epoch 2", "eval epoch 2"]
        requests.update(e["cat"] for e in _reads(events))
        reads = [e for e in _reads(events) if e["cat"] == "train read"]
        threads = {e["tid"]: e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] != STEPS_TID}
        assert {e["tid"] for e in reads} <= set(threads)
        assert set(threads.values()) <= {f"{phase} reader thread {t}"
                                          for phase in ("train", "eval") for t in (0, 1)}
        for e in reads:
            a = e["args"]
            path = a["file"]
            assert os.path.isfile(path) and path.startswith(str(tmp_path / "data"))
            assert 0 <= a["bytes"] <= a["length"]
            assert a["offset"] + a["bytes"] <= os.path.getsize(path)
            assert a["latency_ns"] >= 0 and e["dur"] == pytest.approx(a["latency_ns"] / 1e3,
                                                                      abs=0.001)
        assert sum(e["args"]["bytes"] for e in reads) > 0
        generate = [e for e in events if e["name"] == "generate"]
        assert len(generate) == 1 and generate[0]["ts"] + generate[0]["dur"] <= min(
            e["ts"] for e in reads)
    assert requests == {"train read": summary["metric"]["train_requests"],
                        "eval read": summary["metric"]["eval_requests"]}
    # what the trace holds and cost, reported apart as the emulator's own time
    own = summary["dlio_mpi"]["trace"]
    assert own["files"] == ["trace_rank0.json.gz", "trace_rank1.json.gz"]
    assert own["requests"] == sum(requests.values())
    assert own["events"] == sum(len([e for e in _load(out, r) if e["ph"] == "X"])
                                for r in (0, 1))
    assert own["bytes"] == sum((out / f).stat().st_size for f in own["files"])
    assert len(own["seconds_per_rank"]) == 2 and own["seconds_max"] == max(
        own["seconds_per_rank"]) > 0


def test_backend_without_requests_traces_steps_only(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(
        tmp_path, output__trace="true", reader__engine="framework")])  # npz: np.load
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for rank in (0, 1):
        events = _load(tmp_path / "out", rank)
        _check_steps(events, rank, summary["dlio_mpi"]["steps_per_epoch"] * 2)
        assert not _reads(events)


def test_trace_off_writes_no_file(tmp_path):
    res = run_cli(["run", "demo", *workload_overrides(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith("trace")]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
def test_in_process_trace_with_checkpoints(shared_tmp):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    steps = 24 // size // 2  # 24 files of 1 sample, batch 2
    cfg = load_config("demo", workload_overrides(
        shared_tmp, dataset__num_files_train=24, dataset__num_samples_per_file=1,
        train__computation_time=0.001, workflow__checkpoint="true", output__trace="true",
        checkpoint__checkpoint_folder=str(shared_tmp / "ck"),
        checkpoint__steps_between_checkpoints=2, model__model_size_bytes=1 << 20,
        model__parallelism__zero_stage=1))
    summary = run(comm, cfg)
    events = _load(shared_tmp / "out", rank)
    _check_steps(events, rank, steps * 2)
    assert comm.allreduce(len(_reads(events))) == summary["metric"]["train_requests"]
    saves = sorted(e["args"]["id"] for e in events if e["name"].startswith("checkpoint save"))
    assert saves == sorted(f"global_epoch{e}_step{s}" for e in (1, 2)
                           for s in range(2, steps + 1, 2))
    assert [e["name"] for e in events if e.get("cat") == "epoch"] == [
        "train epoch 1", "train epoch 2"]
    comm.Barrier()


def test_checkpoint_only_run_traces_saves_and_loads(tmp_path):
    res = run_cli(["run", "demo", f"output.folder={tmp_path / 'out'}", "workflow.train=false",
                   "workflow.generate_data=false", "workflow.checkpoint=true",
                   f"checkpoint.checkpoint_folder={tmp_path / 'ck'}",
                   "checkpoint.num_checkpoints_write=2", "checkpoint.num_checkpoints_read=1",
                   "checkpoint.time_between_checkpoints=0", "model.model_size_bytes=1048576",
                   "model.parallelism.zero_stage=1", "output.trace=true"])
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        spans = [e for e in _load(tmp_path / "out", rank) if e["ph"] == "X"]
        assert [e["name"] for e in sorted(spans, key=lambda e: e["ts"])] == [
            "checkpoint save 1", "checkpoint save 2", "checkpoint load 1"]
        assert all(e["tid"] == STEPS_TID and e["args"]["bytes"] == 2 << 20 for e in spans)
