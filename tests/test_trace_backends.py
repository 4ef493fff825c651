"""output.trace with the backends other than the native engine: the MPI-IO backends (shared,
collective) and the h5py backend give a "read" span per planned request, on their reader
threads' tracks; the same requests as the native engine's plan (file, offset, length), each
inside its epoch and over before its step's wait ends. The events are parsed generically
(files compared by their base name) so that the writer's layout may change around them."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from helpers import workload_overrides

pytestmark = pytest.mark.timeout(300)
SLACK_US = 0.002  # the writer's rounding to the ns


def _events(out: Path, rank: int) -> list[dict]:
    with gzip.open(out / f"trace_rank{rank}.json.gz", "rt") as fp:
        return json.load(fp)["traceEvents"]


def _run(tmp: Path, **values):
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    cfg = load_config("demo", workload_overrides(tmp, output__trace="true", **values))
    return run(MPI.COMM_WORLD, cfg)


def _requests(events: list[dict], phase: str = "train") -> list[tuple]:
    """(epoch, step, file's base name, offset, length) of each read span, sorted."""
    return sorted((e["args"]["epoch"], e["args"]["step"], os.path.basename(e["args"]["file"]),
                   e["args"]["offset"], e["args"]["length"]) for e in _reads(events, phase))


def _reads(events: list[dict], phase: str = "train") -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("name") == "read"
            and e.get("cat") == f"{phase} read"]


def _check_spans(events: list[dict], data: Path, tracks: set[str]) -> list[dict]:
    """Every read span: a dataset file, on a reader track named in `tracks`, inside its
    epoch's span and ended before its step's wait did; its latency its duration."""
    reads = _reads(events)
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {names[e["tid"]] for e in reads} <= tracks, {names[e["tid"]] for e in reads}
    epochs = {e["args"]["epoch"]: e for e in events
              if e.get("cat") == "epoch" and e["name"].startswith("train epoch")}
    waits = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "wait" and e.get("cat") == "train":
            waits[(e["args"]["epoch"], e["args"]["step"])] = e
    files = set(os.listdir(data))
    for e in reads:
        a = e["args"]
        assert os.path.basename(a["file"]) in files
        assert a["latency_ns"] >= 0 and e["dur"] == pytest.approx(a["latency_ns"] / 1e3,
                                                                  abs=0.001)
        epoch, wait = epochs[a["epoch"]], waits[(a["epoch"], a["step"])]
        assert epoch["ts"] - SLACK_US <= e["ts"]
        assert e["ts"] + e["dur"] <= wait["ts"] + wait["dur"] + SLACK_US
    return reads


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("access", ["shared", "collective"])
def test_mpiio_traces_every_request_of_the_plan(shared_tmp, access):
    """The MPI-IO backends' read spans: the native engine's requests, one span each, with
    the bytes each returned (a collective call's requests: its start and latency)."""
    from mpi4py import MPI

    from dlio_mpi.mpi.library import is_open_mpi

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    common = dict(dataset__num_files_train=4 * comm.Get_size(), reader__read_threads=1,
                  train__computation_time=0.001)
    root = shared_tmp / access
    native = _run(root, output__folder=root / "native", **common)
    summary = _run(root, output__folder=root / "mpiio", workflow__generate_data="false",
                   reader__file_access=access, **common)
    assert summary["dlio_mpi"]["readers"]["train"]["backend"] == "mpiio"
    events = _events(root / "mpiio", rank)
    track = "train reader step thread" if is_open_mpi() else "train reader thread 0"
    reads = _check_spans(events, root / "data" / "train", {track})
    assert comm.allreduce(len(reads)) == summary["metric"]["train_requests"] \
        == native["metric"]["train_requests"]
    assert _requests(events) == _requests(_events(root / "native", rank))
    assert all(e["args"]["bytes"] <= e["args"]["length"] for e in reads)
    traced = comm.allreduce(sum(e["args"]["bytes"] for e in reads))
    assert traced == native["metric"]["train_bytes_transferred"]  # each request's own bytes
    moved = summary["metric"]["train_bytes_transferred"]
    # one collective call per file and step reads overlapping requests' bytes once (np.load's
    # model reads parts of a file twice); independent reads read each request
    assert moved == traced if access == "shared" else moved < traced
    if access == "collective":  # per call (a file of a batch): one start, one latency
        calls = Counter((e["args"]["epoch"], e["args"]["step"], e["args"]["file"])
                        for e in reads)
        spans = Counter((e["args"]["epoch"], e["args"]["step"], e["args"]["file"], e["ts"],
                         e["args"]["latency_ns"]) for e in reads)
        assert len(spans) == len(calls)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_h5py_traces_a_span_per_sample(shared_tmp):
    """The h5py backend: a span per sample (the plan's request of it) on the track of the
    thread that read it, with its own bytes (its HDF5 reads: more than nothing)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_tmp / "h5"
    summary = _run(root, dataset__format="hdf5", dataset__record_length_bytes=256,
                   dataset__num_samples_per_file=4, dataset__num_files_train=3 * size,
                   dataset__compression="gzip", dataset__hdf5__chunk_dims="[2,16,16]",
                   reader__read_threads=2, reader__batch_size=2,
                   train__computation_time=0.001)
    assert summary["dlio_mpi"]["readers"]["train"]["backend"] == "h5py"
    events = _events(root / "out", rank)
    reads = _check_spans(events, root / "data" / "train",
                         {"train reader thread 0", "train reader thread 1"})
    assert comm.allreduce(len(reads)) == summary["metric"]["train_requests"] == 2 * 12 * size
    assert all(e["args"]["bytes"] > 0 for e in reads)
    # each sample's bytes measured on its own: together the batches' (the same probes)
    assert comm.allreduce(sum(e["args"]["bytes"] for e in reads)) \
        == summary["metric"]["train_bytes_transferred"]
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_torch_loader_traces_a_span_per_sample_on_its_workers_tracks(shared_tmp):
    """reader.engine framework (torch DataLoader, 2 workers), indexed_binary: each sample's
    read is its planned request (the native engine's: extents at multiples of the record
    length), recorded in the worker that read it, on that worker's track."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common = dict(dataset__format="indexed_binary", dataset__num_samples_per_file=4,
                  dataset__num_files_train=3 * size, reader__read_threads=2,
                  train__computation_time=0.001)
    root = shared_tmp / "torch"
    native = _run(root, output__folder=root / "native", **common)
    summary = _run(root, output__folder=root / "torch", workflow__generate_data="false",
                   reader__engine="framework", **common)
    described = summary["dlio_mpi"]["readers"]["train"]
    assert described["backend"] == "framework" and "span per sample" in described["trace"]
    events = _events(root / "torch", rank)
    reads = _check_spans(events, root / "data" / "train",
                         {"train reader thread 0", "train reader thread 1"})
    assert len({e["tid"] for e in reads}) == 2  # both workers read
    assert comm.allreduce(len(reads)) == summary["metric"]["train_requests"] \
        == native["metric"]["train_requests"] == 2 * 12 * size
    assert _requests(events) == _requests(_events(root / "native", rank))
    assert all(e["args"]["offset"] % 4096 == 0 and e["args"]["length"] == 4096
               for e in reads)
    assert all(e["args"]["bytes"] >= 4096 for e in reads)  # (a worker's first: index files)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_torch_loader_whole_file_loads_trace_steps_only(shared_tmp):
    """npz (np.load of the whole file: several planned requests per sample, not observed
    one by one): the step spans, no read span, and describe() says why."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    root = shared_tmp / "npz"
    summary = _run(root, reader__engine="framework", reader__read_threads=1,
                   dataset__num_files_train=4 * comm.Get_size())
    described = summary["dlio_mpi"]["readers"]["train"]
    assert described["backend"] == "framework" and "step spans only" in described["trace"]
    events = _events(root / "out", comm.Get_rank())
    assert not _reads(events)
    assert sum(e.get("name") == "wait" for e in events) == summary["dlio_mpi"][
        "steps_per_epoch"] * 2
    comm.Barrier()
