"""A real torch Distributed Checkpoint (DCP) save of a Llama-like model, for holding
dlio_mpi/checkpoint/dcp_plan.py's predicted layout against (docs/dcp_facts.md).

N processes (stdlib multiprocessing, spawn; gloo on CPU, no mpiexec) each build the state dict
that FSDP2 (fully_shard) + AdamW's get_state_dict gives, without any training:
{"model": {fqn: DTensor Shard(0) over a 1-D mesh of all ranks}, "optim": {"state": {fqn:
{"step": 0-d fp32 tensor, "exp_avg": DTensor, "exp_avg_sq": DTensor}}, "param_groups":
[AdamW's default group, "params": [fqns]]}}, and save it with
FileSystemWriter(path, thread_count=T, sync_files=True). A local shard of an uneven split is a
view of a padded buffer, as FSDP2's is. With --load-ranks M, M other processes then load the
checkpoint at world size M through a FileSystemReader that records every item request
(file, offset, length) and every read of the file stream (--load-only: no save, the load of
the checkpoint already in --out, e.g. one written from dcp_plan). Prints JSON ("save" only
when it saved):

    {"files": {name: size}, "save": {rank: [{"fqn", "file", "offset", "length", "chunk_offsets",
     "chunk_sizes", "global_shape", "kind"}, ...]}, "param_group": {...}, "fqns": [...],
     "load": {rank: {"requests": [[file, offset, length], ...], "reads": [[file, offset, n]]}}}

    python scripts/fidelity/dcp_reference.py --ranks 2 --threads 1 --out /tmp/ckpt \\
        --layers 2 --hidden 64 --ffn 128 --vocab 256 --heads 4 --kv-heads 2 --load-ranks 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

DTYPES = ("bf16", "fp16", "fp32", "fp64")


def llama_tensors(layers: int, hidden: int, ffn: int, vocab: int, heads: int,
                  kv_heads: int) -> list[tuple[str, tuple[int, ...]]]:
    """(fqn, shape) of every parameter, in HF LlamaForCausalLM's named_parameters order:
    untied embeddings and lm_head, no biases (DLIO's parameter count, sizing.py)."""
    kv_dim = (hidden // heads) * kv_heads
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (kv_dim, hidden)),
                (p + "self_attn.v_proj.weight", (kv_dim, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (ffn, hidden)),
                (p + "mlp.up_proj.weight", (ffn, hidden)),
                (p + "mlp.down_proj.weight", (hidden, ffn)),
                (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    return out + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def _torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
            "fp64": torch.float64}[name]


def _shard(global_shape, dtype, mesh, rank: int, world: int, fill: float,
           compact: bool = False):
    """A DTensor Shard(0) whose local tensor is FSDP2's: torch.chunk's split, the local rows a
    view of a buffer padded to the full chunk (so DCP must clone uneven shards); `compact`:
    the rows alone, as a GPU tensor's .to("cpu") gives them (--gpu-loader-order)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    rows, rest = global_shape[0], tuple(global_shape[1:])
    chunk = -(-rows // world)
    start = min(rows, chunk * rank)
    local_rows = max(0, min(rows, start + chunk) - start)
    padded = torch.full((chunk, *rest), fill, dtype=dtype)
    local = padded[:local_rows].clone() if compact else padded[:local_rows]
    stride = torch.empty(global_shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                              shape=torch.Size(global_shape), stride=stride)


def adamw_default_group() -> dict:
    """torch.optim.AdamW's default param group (without "params"), in its key order."""
    import torch

    probe = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    group = dict(probe.state_dict()["param_groups"][0])
    group.pop("params")
    return group


def state_dict_for(args, rank: int, world: int, mesh) -> dict:
    """The FSDP2 + AdamW get_state_dict-shaped state dict of this rank."""
    import torch

    tensors = llama_tensors(args.layers, args.hidden, args.ffn, args.vocab, args.heads,
                            args.kv_heads)
    if args.fsdp2:
        return _fsdp2_state_dict(tensors, _torch_dtype(args.model_dtype), mesh)
    mdt, odt = _torch_dtype(args.model_dtype), _torch_dtype(args.optim_dtype)
    compact = args.gpu_loader_order
    model = {fqn: _shard(shape, mdt, mesh, rank, world, 1.0, compact) for fqn, shape in tensors}
    # get_state_dict's optimizer fqns are str objects of their own (not the model's keys),
    # shared with the param group's "params": it shows in .metadata's pickle memo
    optim_fqns = [(fqn + ".")[:-1] for fqn, _ in tensors]
    state = {key: {"step": torch.tensor(0.0, dtype=torch.float32),
                   "exp_avg": _shard(shape, odt, mesh, rank, world, 0.5, compact),
                   "exp_avg_sq": _shard(shape, odt, mesh, rank, world, 0.25, compact)}
             for key, (_, shape) in zip(optim_fqns, tensors)}
    group = adamw_default_group()
    group["params"] = optim_fqns
    return {"model": model, "optim": {"state": state, "param_groups": [group]}}


def _fsdp2_state_dict(tensors, dtype, mesh) -> dict:
    """The state dict of a real fully_shard model and AdamW (get_state_dict initialises the
    optimizer's state with one step of zero gradients); its tensors all of `dtype`."""
    import torch
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    root = nn.Module()
    for fqn, shape in tensors:
        owner = root
        for name in fqn.split(".")[:-1]:
            if not hasattr(owner, name):
                owner.add_module(name, nn.Module())
            owner = getattr(owner, name)
        owner.register_parameter("weight", nn.Parameter(torch.ones(shape, dtype=dtype)))
    fully_shard(root, mesh=mesh)
    optim = torch.optim.AdamW(root.parameters())
    model_sd, optim_sd = get_state_dict(root, optim)
    return {"model": model_sd, "optim": optim_sd}


def _init(rank: int, world: int, store: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    return init_device_mesh("cpu", (world,))


def save_worker(rank: int, world: int, args, store: str, results: str) -> None:
    """One rank of the save; rank 0 writes what the returned Metadata says was written."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    mesh = _init(rank, world, store)
    if args.gpu_loader_order:
        _pretend_accelerator()
    writer = FileSystemWriter(args.out, thread_count=args.threads, sync_files=True)
    metadata = dcp.save(state_dict_for(args, rank, world, mesh), storage_writer=writer)
    if rank == 0:
        Path(results, "save.json").write_text(json.dumps(_written_items(metadata)))
    dist.barrier()
    dist.destroy_process_group()


def _pretend_accelerator() -> None:
    """Make FileSystemWriter take its accelerator path (_OverlappingCpuLoader, used when
    torch.cuda.is_available() and thread_count == 1: filesystem.py:397-408) on CPU, its
    'device' being torch.cpu's streams, to observe the write order a GPU node gets."""
    import torch
    import torch.distributed.checkpoint.filesystem as fs

    torch.cuda.is_available = lambda: True
    fs._get_available_device_type = lambda: "cpu"
    torch.cpu.Stream.synchronize = lambda self: None  # the CPU "stream" runs synchronously


def _written_items(metadata) -> list[dict]:
    """Every stored item: its fqn, file, offset and length, chunk and global shape."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out = []
    for index, info in metadata.storage_data.items():
        md = metadata.state_dict_metadata[index.fqn]
        item = {"fqn": index.fqn, "file": info.relative_path, "offset": info.offset,
                "length": info.length, "kind": "bytes"}
        if isinstance(md, TensorStorageMetadata):
            chunk = next(c for c in md.chunks if tuple(c.offsets) == tuple(index.offset))
            item.update(kind="tensor", chunk_offsets=list(chunk.offsets),
                        chunk_sizes=list(chunk.sizes), global_shape=list(md.size))
        out.append(item)
    return out


def _by_rank(items: list[dict]) -> dict[str, list[dict]]:
    """Items grouped by the rank that wrote them (file __{rank}_{i}.distcp), in file order."""
    ranks: dict[str, list[dict]] = {}
    for item in sorted(items, key=lambda i: (i["file"], i["offset"])):
        ranks.setdefault(item["file"][2:].split("_")[0], []).append(item)
    return dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))


def load_worker(rank: int, world: int, args, store: str, results: str) -> None:
    """One rank of a load at world size `world`, recording what it asks of the files."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    mesh = _init(rank, world, store)
    reader = _recording_reader(args.out)
    dcp.load(state_dict_for(args, rank, world, mesh), storage_reader=reader)
    Path(results, f"load{rank}.json").write_text(json.dumps(
        {"requests": reader.requests, "reads": reader.reads}))
    dist.barrier()
    dist.destroy_process_group()


def _recording_reader(path: str):
    """A FileSystemReader that records each item request (relative path, offset, length:
    FileSystemReader._slice_file, filesystem.py:852) and each read of the file stream."""
    from contextlib import contextmanager

    from torch.distributed.checkpoint import FileSystemReader

    class RecordingReader(FileSystemReader):
        def __init__(self, folder):
            super().__init__(folder)
            self.requests, self.reads = [], []
            create_stream = self.fs.create_stream

            @contextmanager
            def recording_stream(file_path, mode):
                with create_stream(file_path, mode) as stream:
                    yield _RecordingStream(stream, Path(file_path).name, self.reads)

            self.fs.create_stream = recording_stream

        def _slice_file(self, file, sinfo):
            self.requests.append([sinfo.relative_path, sinfo.offset, sinfo.length])
            return super()._slice_file(file, sinfo)

    return RecordingReader(path)


class _RecordingStream:
    """Delegates to a binary stream, recording [name, offset, bytes] of each read."""

    def __init__(self, stream, name: str, log: list):
        self._stream, self._name, self._log = stream, name, log

    def __getattr__(self, attr):
        return getattr(self._stream, attr)

    def read(self, size=-1):
        at = self._stream.tell()
        data = self._stream.read(size)
        self._log.append([self._name, at, len(data)])
        return data

    def readinto(self, buffer):
        at = self._stream.tell()
        n = self._stream.readinto(buffer)
        self._log.append([self._name, at, n])
        return n


def _run(target, world: int, args, results: str) -> None:
    """`world` spawned processes running target(rank, world, args, store, results)."""
    ctx = multiprocessing.get_context("spawn")
    store = tempfile.mktemp(prefix="dcp_store_", dir=results)
    procs = [ctx.Process(target=target, args=(r, world, args, store, results))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        sys.exit(f"dcp_reference: a rank failed (exit codes {failed})")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="world size of the save")
    p.add_argument("--threads", type=int, default=1, help="FileSystemWriter thread_count")
    p.add_argument("--out", required=True, help="checkpoint folder (made if missing)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--model-dtype", choices=DTYPES, default="bf16")
    p.add_argument("--optim-dtype", choices=DTYPES, default="fp32")
    p.add_argument("--load-ranks", type=int, default=0,
                   help="then load at this world size, recording the reads (0: no load)")
    p.add_argument("--load-only", action="store_true",
                   help="no save: load the checkpoint already in --out (with --load-ranks)")
    p.add_argument("--fsdp2", action="store_true",
                   help="the state dict of a real fully_shard model and AdamW (its tensors "
                        "all of --model-dtype) instead of one built directly")
    p.add_argument("--gpu-loader-order", action="store_true",
                   help="write as on a node with an accelerator (thread_count 1 only)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out = os.path.abspath(args.out)
    with tempfile.TemporaryDirectory(prefix="dcp_reference_") as results:
        report = {}
        if not args.load_only:
            _run(save_worker, args.ranks, args, results)
            report["save"] = _by_rank(json.loads(Path(results, "save.json").read_text()))
        report["files"] = {p.name: p.stat().st_size for p in sorted(Path(args.out).iterdir())}
        if args.load_ranks:
            _run(load_worker, args.load_ranks, args, results)
            report["load"] = {str(r): json.loads(Path(results, f"load{r}.json").read_text())
                              for r in range(args.load_ranks)}
    import torch  # after the workers: the parent needs it only for these facts

    report["param_group"] = {k: (list(v) if isinstance(v, tuple) else v)
                             for k, v in adamw_default_group().items()}
    report["fqns"] = [f for f, _ in llama_tensors(args.layers, args.hidden, args.ffn,
                                                  args.vocab, args.heads, args.kv_heads)]
    report["torch"] = torch.__version__
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
