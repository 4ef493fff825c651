"""checkpoint/dcp_plan.py (with dcp_archive.py and dcp_metadata.py) against real torch
Distributed Checkpoint saves and loads (scripts/fidelity/dcp_reference.py: 2 and 3 gloo
processes on CPU, thread_count 1 and 2, a tiny Llama-like model): file names, counts and
sizes, every item's place, the .metadata byte for byte, torch.save's archive byte for byte,
the ranges a load at another world size asks for, and a checkpoint written from the plan
alone loaded by torch. Needs torch (skipped without); each reference run spawns its
processes (tens of seconds on 2 busy cores)."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dlio_mpi.checkpoint import dcp_archive, dcp_metadata, dcp_plan

try:
    import torch
except ImportError:  # the plan itself needs no torch: only the tests against real saves do
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="the reference saves need torch "
                                 "(pip install torch==2.13.0 from the CPU index)")

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "scripts" / "fidelity" / "dcp_reference.py"
# kv_heads 1 with 8 heads: k_proj and v_proj have one row, so at 3 ranks two ranks hold an
# empty chunk of each, at the same offset: deduplicated to one writer
TINY = {"layers": 2, "hidden": 8, "ffn": 16, "vocab": 32, "heads": 8, "kv_heads": 1}
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")




def tiny_model(model_dtype="bf16", optimizer_dtype="fp32"):
    return dcp_plan.LlamaModel(TINY["layers"], TINY["hidden"], TINY["ffn"], TINY["vocab"],
                               TINY["heads"], TINY["kv_heads"], model_dtype, optimizer_dtype)


def run_reference(folder: Path, ranks: int, threads: int, *extra: str) -> dict:
    """A real save (and whatever `extra` asks) into `folder`; the reference's JSON."""
    command = [sys.executable, str(REFERENCE), "--ranks", str(ranks), "--threads",
               str(threads), "--out", str(folder)]
    for key, value in TINY.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command + list(extra), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"{' '.join(command + list(extra))}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def saves(tmp_path_factory) -> dict:
    """(ranks, threads) -> (folder, reference JSON); the 2-rank save is also loaded at 3
    ranks and the 3-rank one at 2, recording what each rank asks for."""
    out = {}
    for ranks, threads, load in ((2, 1, 3), (3, 2, 2), (2, 2, 0), (3, 1, 0)):
        folder = tmp_path_factory.mktemp(f"dcp_{ranks}r{threads}t") / "checkpoint"
        extra = ("--load-ranks", str(load)) if load else ()
        out[(ranks, threads)] = folder, run_reference(folder, ranks, threads, *extra)
    return out


@needs_torch
@pytest.mark.parametrize("ranks,threads", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_file_names_counts_and_sizes_equal_a_real_save(saves, ranks, threads):
    folder, real = saves[(ranks, threads)]
    plan = dcp_plan.DcpSavePlan(tiny_model(), ranks, threads)
    real_files = dict(real["files"])
    metadata = folder.joinpath(".metadata").read_bytes()
    predicted = dcp_metadata.metadata_bytes(plan, str(folder),
                                            UUID.search(metadata).group().decode())
    assert plan.file_sizes() | {".metadata": len(predicted)} == real_files
    assert len(real_files) == ranks * threads + 1
    if threads == 1:  # with more threads, files finish in any order: .metadata's order too
        assert predicted == metadata


@needs_torch
@pytest.mark.parametrize("ranks,threads", [(2, 1), (3, 2)])
def test_every_item_is_where_the_real_save_put_it(saves, ranks, threads):
    _, real = saves[(ranks, threads)]
    plan = dcp_plan.DcpSavePlan(tiny_model(), ranks, threads)
    for rank in range(ranks):
        want = [(i["file"], i["offset"], i["length"], i["fqn"], tuple(i.get("chunk_offsets", ())),
                 tuple(i.get("chunk_sizes", ()))) for i in real["save"].get(str(rank), [])]
        got = sorted((i.file, i.offset, i.length, i.fqn, i.chunk_offsets if i.kind != "bytes"
                      else (), i.chunk_sizes if i.kind != "bytes" else ())
                     for f in plan.rank_files(rank) for i in f.items)
        assert got == want, f"rank {rank}"


@needs_torch
def test_shared_items_go_to_the_ranks_after_rank_0(saves):
    """Replicated values (steps, the param group) and the empty chunks two ranks share are
    written once, none by rank 0, as the real save did."""
    _, real = saves[(3, 1)]
    plan = dcp_plan.DcpSavePlan(tiny_model(), 3, 1)
    assert set(plan.owners.values()) == {1, 2}
    keys = [(i["fqn"], str(i.get("chunk_offsets"))) for items in real["save"].values()
            for i in items]
    assert len(keys) == len(set(keys))
    assert not [i for i in real["save"]["0"] if i["kind"] == "bytes" or i["fqn"].endswith(".step")]
    empties = [i for items in real["save"].values() for i in items
               if i["kind"] == "tensor" and i["chunk_sizes"] and i["chunk_sizes"][0] == 0]
    assert empties and all(i["file"].startswith("__2_") for i in empties)


@needs_torch
@pytest.mark.parametrize("saved,loaded", [((2, 1), 3), ((3, 2), 2)])
def test_a_restore_at_another_world_size_asks_for_the_planned_ranges(saves, saved, loaded):
    _, real = saves[saved]
    plan = dcp_plan.DcpSavePlan(tiny_model(), *saved)
    for rank in range(loaded):
        record = real["load"][str(rank)]
        predicted = dcp_plan.restore_reads(plan, loaded, rank)
        assert [[r.file, r.offset, r.length] for r in predicted] == record["requests"], rank
        # torch.load reads inside the item only; the tensor's bytes once, whole
        items = [(r.file, r.offset, r.offset + r.length) for r in predicted]
        for name, at, size in record["reads"]:
            if name != ".metadata":
                assert any(n == name and lo <= at and at + size <= hi for n, lo, hi in items)
        payloads = {(r.file, r.payload_offset, r.payload_length) for r in predicted
                    if r.payload_length > 64}
        assert payloads <= {tuple(read) for read in record["reads"]}


@needs_torch
def test_the_accelerator_loader_writes_smallest_first(tmp_path):
    """On a node with CUDA, thread_count 1, FileSystemWriter's _OverlappingCpuLoader sorts a
    file's tensors by their global size (observed on CPU by pretending to have one)."""
    real = run_reference(tmp_path / "checkpoint", 2, 1, "--gpu-loader-order")
    plan = dcp_plan.DcpSavePlan(tiny_model(), 2, 1, overlapping_loader=True)
    for rank in range(2):
        got = [(i.file, i.offset, i.length, i.fqn) for f in plan.rank_files(rank)
               for i in f.items]
        assert got == [(i["file"], i["offset"], i["length"], i["fqn"])
                       for i in real["save"][str(rank)]]


@needs_torch
@pytest.mark.parametrize("shape", [(), (0,), (0, 8), (1,), (3, 5), (300, 70), (70000,),
                                   (2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp64"])
def test_a_tensor_archive_is_torch_save_byte_for_byte(shape, dtype):
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                   "fp64": torch.float64}[dtype]
    tensor = (torch.randn(shape) if shape else torch.tensor(1.5)).to(torch_dtype)
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    payload = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    archive = dcp_archive.tensor_archive(shape, dtype)
    assert archive.length == len(buffer.getvalue())
    assert archive.prefix() + payload + archive.suffix(zlib.crc32(payload)) == buffer.getvalue()
    assert archive.payload_offset % 64 == 0


@needs_torch
@pytest.mark.parametrize("value", [0.001, (0.9, 0.999), False, None, ["model.a.weight"] * 1200])
def test_a_value_archive_is_torch_save_byte_for_byte(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    archive = dcp_archive.object_archive(value)
    assert archive.prefix() + archive.suffix() == buffer.getvalue()


@needs_torch
def test_a_checkpoint_written_from_the_plan_alone_loads_in_torch(tmp_path):
    """Every file made from the plan (our payload bytes, torch's bytes around them, the
    .metadata emulated): torch loads it at 3 ranks, asking for the planned ranges."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    plan = dcp_plan.DcpSavePlan(tiny_model(), 2, 1)
    for rank in range(2):
        for planned in plan.rank_files(rank):
            with open(folder / planned.name, "wb") as out:
                for item in planned.items:
                    payload = bytes([rank + 1]) * item.payload_length
                    out.write(item.archive.prefix() + payload
                              + item.archive.suffix(zlib.crc32(payload)))
    folder.joinpath(".metadata").write_bytes(dcp_metadata.metadata_bytes(
        plan, str(folder), "6b1d2c3e-0000-4000-8000-000000000000"))
    real = run_reference(folder, 2, 1, "--load-only", "--load-ranks", "3")
    for rank in range(3):
        assert real["load"][str(rank)]["requests"] == [
            [r.file, r.offset, r.length] for r in dcp_plan.restore_reads(plan, 3, rank)]


def test_the_tensors_are_dlio_s_parameter_count():
    """DLIO's formula (sizing.py) counts exactly these tensors: untied embedding and lm_head,
    no biases, grouped-query k and v projections."""
    from dlio_mpi.checkpoint.sizing import _Model

    for dims in ((32, 4096, 14336, 128256, 32, 8), (80, 8192, 28672, 128256, 64, 8),
                 (2, 8, 16, 32, 8, 1)):
        ours = dcp_plan.LlamaModel(*dims)
        dlio = _Model(num_layers=dims[0], hidden=dims[1], ffn=dims[2], vocab=dims[3],
                      heads=dims[4], kv_heads=dims[5], model_dtype=2, optimizer_dtype=4,
                      flat_bytes=0, layer_parameters=(), optimization_groups=())
        assert sum(math.prod(shape) for _, shape in ours.parameters()) == dlio.parameters()


@pytest.mark.parametrize("count", [2, 5, 6, 7, 40, 100, 1000])
@pytest.mark.parametrize("first", [0, 3, 30, 1018])
def test_int_set_order_is_cpython_s(first, count):
    values = list(range(first, first + count))
    real: set[int] = set()
    for v in values:
        real.add(v)
    assert dcp_plan._int_set_order(values) == list(real)


def test_shard_rows_is_torch_chunk_s_split():
    assert [dcp_plan.shard_rows(5, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 1), (5, 0)]
    assert [dcp_plan.shard_rows(1, 3, r) for r in range(3)] == [(0, 1), (1, 0), (1, 0)]
    assert [dcp_plan.shard_rows(128256, 1024, r)[1] for r in (1016, 1017, 1018)] == [126, 114, 0]
