#!/usr/bin/env python3
"""How far real checkpoint bytes compress and deduplicate (issue 32): the measurements behind
`checkpoint.content` in docs/checkpoints.md.

    source scripts/_env.sh && pip install zstandard lz4     # torch: pip install '.[torch]'
    python scripts/bench/tensor_ratios.py [--quick] [--out DIR] [--keep]

It trains a small Llama-like decoder (RMSNorm, rotary attention, SwiGLU MLP, untied embedding
and output head; by default 4 layers, hidden 384, vocabulary 8,192: 13.4 M parameters) with
AdamW (fp32 master weights and moments, the forward and backward passes under bf16 autocast,
as mixed-precision training runs) on a synthetic token stream with structure to learn (a
first-order Markov chain whose successors and unigram draws follow Zipf laws), on the CPU.
Then it saves with torch.save, at step 0 and after the last step:

  weights_bf16   the model's state_dict cast to bf16 (what a bf16 trainer's model states hold)
  weights_fp32   the fp32 master weights
  adam_fp32      the AdamW state_dict (exp_avg and exp_avg_sq of every parameter, fp32); at
                 step 0 torch has none yet: the file holds the zeros it creates at the first
                 step (what DeepSpeed allocates up front)

and, for comparison, what emulators write in their place (a quarter as many elements as the
model: a ratio does not depend on the size):
DLIO's `randomize_tensor: true` tensors (torch.rand in bf16, fp16 and fp32), its
`randomize_tensor: false` tensors (torch.ones), the zeros MLPerf Storage's fallback writer
streams and uniformly random bytes (dgen-py at compress_ratio 1). For each file: the
compression ratio (bytes in / bytes out) of zstd (levels 1 and 3), lz4 (block format, default
fast mode) and zlib (levels 1 and 6), each over the whole file, per 128 KiB record and per
4 KiB block (a record or block that does not shrink is counted at its own size, as a store
keeps it raw); what a ZFS-like store keeps per 128 KiB record (compressed only where that saves
1/8 of the record, rounded up to 4 KiB sectors); and the deduplication ratio (blocks / unique
blocks, by SHA-1) at 4 KiB and 128 KiB fixed blocks, within each file and across the last two
saves (taken --pair-gap steps apart). Markdown tables are printed and written to
OUT/tensor_ratios.md, every figure to OUT/tensor_ratios.json (OUT: output/tensor_ratios). The
checkpoint files are written to a temporary folder and removed unless --keep.

Training takes 300 steps of 4 sequences of 64 tokens (77k tokens; 97 % of the vocabulary is
seen, so few moments stay zero). About 3 minutes on 2 CPUs busy with other work (half of it
the training steps on one thread, --threads; most of the rest zlib); --quick is a tiny model
and a few steps, seconds long, for checking that the script runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    import lz4.block
    import torch
    import torch.nn.functional as F
    import zstandard
    from torch import nn
except ImportError as exc:  # pragma: no cover - a message instead of a traceback
    sys.exit(f"tensor_ratios.py needs torch, zstandard and lz4 ({exc}): "
             "pip install '.[torch]' zstandard lz4")

KIB = 1024
RECORD = 128 * KIB
BLOCK = 4 * KIB
SECTOR = 4 * KIB
GRAINS = {"file": None, "128k": RECORD, "4k": BLOCK}


@dataclass(frozen=True)
class Setup:
    """The model, its data and its training."""

    vocab: int = 8192
    hidden: int = 384
    layers: int = 4
    heads: int = 6
    ffn: int = 1024
    seq: int = 64
    batch: int = 4
    steps: int = 300
    lr: float = 2e-3
    pair_gap: int = 10
    seed: int = 0


QUICK = Setup(vocab=1024, hidden=64, layers=2, heads=2, ffn=192, seq=32, batch=4, steps=12,
              pair_gap=2)


# ---------------------------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return (x.float() * scale).type_as(x) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim) queries or keys."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(nn.Module):
    def __init__(self, s: Setup) -> None:
        super().__init__()
        self.heads = s.heads
        self.attn_norm = RMSNorm(s.hidden)
        self.wq = nn.Linear(s.hidden, s.hidden, bias=False)
        self.wk = nn.Linear(s.hidden, s.hidden, bias=False)
        self.wv = nn.Linear(s.hidden, s.hidden, bias=False)
        self.wo = nn.Linear(s.hidden, s.hidden, bias=False)
        self.mlp_norm = RMSNorm(s.hidden)
        self.w_gate = nn.Linear(s.hidden, s.ffn, bias=False)
        self.w_up = nn.Linear(s.hidden, s.ffn, bias=False)
        self.w_down = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)

        def split(proj: nn.Linear) -> torch.Tensor:
            return proj(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = rotary(split(self.wq), cos, sin), rotary(split(self.wk), cos, sin), split(self.wv)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Decoder(nn.Module):
    def __init__(self, s: Setup) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden)
        self.head = nn.Linear(s.hidden, s.vocab, bias=False)
        head_dim = s.hidden // s.heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(s.seq).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


# ----------------------------------------------------------------------------------- the data
def zipf(n: int, exponent: float) -> np.ndarray:
    p = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def token_stream(s: Setup, count: int) -> np.ndarray:
    """A first-order Markov chain over the vocabulary: each token has 32 successors, drawn by a
    Zipf unigram law (exponent 0.6, over a shuffled vocabulary), taken with Zipf probabilities
    (exponent 1.2); one token in five is a fresh unigram draw instead."""
    rng = np.random.default_rng(s.seed)
    order = rng.permutation(s.vocab)
    unigram = zipf(s.vocab, 0.6)
    successors = order[rng.choice(s.vocab, size=(s.vocab, 32), p=unigram)]
    which = rng.choice(32, size=count, p=zipf(32, 1.2))
    fresh = order[rng.choice(s.vocab, size=count, p=unigram)]
    jump = rng.random(count) < 0.2
    out = np.empty(count, dtype=np.int64)
    token = int(fresh[0])
    for i in range(count):
        token = int(fresh[i]) if jump[i] else int(successors[token, which[i]])
        out[i] = token
    return out


# ------------------------------------------------------------------------------- the training
def train(s: Setup, folder: Path, saves: dict[str, Path]) -> dict:
    """Trains the model, saving its states at step 0, at steps - pair_gap and at the end."""
    torch.manual_seed(s.seed)
    model = Decoder(s)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1)
    per_step = s.batch * (s.seq + 1)
    stream = torch.from_numpy(token_stream(s, per_step * s.steps)).view(s.steps, s.batch, -1)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    save_states(model, opt, folder, "step0", saves)
    losses, started = [], time.perf_counter()
    for step in range(s.steps):
        if step == s.steps - s.pair_gap:
            save_states(model, opt, folder, "earlier", saves)
        batch = stream[step]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, s.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(loss.item(), 4))
    seconds = time.perf_counter() - started
    save_states(model, opt, folder, "final", saves)
    return training_facts(s, model, opt, initial, losses, seconds)


def training_facts(s: Setup, model: nn.Module, opt: torch.optim.Optimizer, initial: dict,
                   losses: list[float], seconds: float) -> dict:
    """What shows the states are no longer their initial values."""
    params = sum(p.numel() for p in model.parameters())
    weights = model.state_dict()
    moved = sum(int((v != initial[k]).sum()) for k, v in weights.items())
    drift = math.sqrt(sum(float((v - initial[k]).pow(2).sum()) for k, v in weights.items()))
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in initial.values()))
    moments = [st[key] for st in opt.state.values() for key in ("exp_avg", "exp_avg_sq")]
    zeros = sum(int((m == 0).sum()) for m in moments)
    embed_rows_seen = int((opt.state[model.embed.weight]["exp_avg"].abs().sum(1) > 0).sum())
    return {"setup": asdict(s), "parameters": params, "train_seconds": round(seconds, 1),
            "loss_first": losses[0], "loss_last_10_mean": round(sum(losses[-10:]) / 10, 4),
            "uniform_loss": round(math.log(s.vocab), 4),
            "weights_changed_fraction": round(moved / params, 4),
            "weights_relative_change": round(drift / norm, 4),
            "adam_moment_zero_fraction": round(zeros / (2 * params), 4),
            "embedding_rows_seen_fraction": round(embed_rows_seen / s.vocab, 4),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def adam_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The optimizer's state_dict; before the first step, with the zero moments torch creates
    at that step (a step-0 state_dict of torch's own has no moments at all)."""
    if opt.state:
        return opt.state_dict()
    state = opt.state_dict()
    state["state"] = {i: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)}
                      for i, p in enumerate(model.parameters())}
    return state


def save_states(model: nn.Module, opt: torch.optim.Optimizer, folder: Path, tag: str,
                saves: dict[str, Path]) -> None:
    weights = model.state_dict()
    contents = {"weights_bf16": {k: v.to(torch.bfloat16) for k, v in weights.items()},
                "weights_fp32": weights, "adam_fp32": adam_state(model, opt)}
    for kind, obj in contents.items():
        path = folder / f"{tag}_{kind}.pt"
        torch.save(obj, path)
        saves[f"{tag}_{kind}"] = path


def save_references(count: int, folder: Path, saves: dict[str, Path]) -> None:
    """What emulators write instead of trained states, `count` elements each."""
    gen = torch.Generator().manual_seed(1)
    tensors = {"dlio_rand_bf16": torch.rand(count, dtype=torch.bfloat16, generator=gen),
               "dlio_rand_fp16": torch.rand(count, dtype=torch.float16, generator=gen),
               "dlio_rand_fp32": torch.rand(count, dtype=torch.float32, generator=gen),
               "dlio_ones_bf16": torch.ones(count, dtype=torch.bfloat16)}
    for name, tensor in tensors.items():
        saves[name] = folder / f"{name}.pt"
        torch.save({"0": tensor}, saves[name])
    raw = {"zeros_raw": bytes(2 * count),
           "random_raw": np.random.default_rng(2).bytes(2 * count)}
    for name, data in raw.items():
        saves[name] = folder / f"{name}.bin"
        saves[name].write_bytes(data)


# ------------------------------------------------------------------------------ the measures
def codecs() -> dict[str, Callable[[memoryview], int]]:
    """Name -> the compressed size of a buffer."""
    z1, z3 = zstandard.ZstdCompressor(level=1), zstandard.ZstdCompressor(level=3)
    return {"zstd-1": lambda b: len(z1.compress(b)),
            "zstd-3": lambda b: len(z3.compress(b)),
            "lz4": lambda b: len(lz4.block.compress(b, mode="default", store_size=False)),
            "zlib-1": lambda b: len(zlib.compress(b, 1)),
            "zlib-6": lambda b: len(zlib.compress(b, 6))}


def pieces(data: memoryview, size: int | None) -> Iterator[memoryview]:
    if size is None:
        yield data
        return
    for start in range(0, len(data), size):
        yield data[start:start + size]


def compression(data: memoryview) -> dict:
    """Ratios per codec and grain; a piece that does not shrink counts at its own size."""
    out: dict = {}
    for name, compress in codecs().items():
        out[name] = {}
        for grain, size in GRAINS.items():
            kept, zfs = 0, 0
            for piece in pieces(data, size):
                n = compress(piece)
                kept += min(n, len(piece))
                if size == RECORD:
                    fits = n <= len(piece) - len(piece) // 8
                    zfs += -(-n // SECTOR) * SECTOR if fits else len(piece)
            out[name][grain] = round(len(data) / kept, 4)
            if zfs:
                out[name]["128k_zfs"] = round(len(data) / zfs, 4)
    return out


def block_hashes(data: memoryview, size: int) -> list[bytes]:
    return [hashlib.sha1(piece).digest() for piece in pieces(data, size)]


def dedup(*buffers: memoryview) -> dict:
    """Blocks over unique blocks at 4 KiB and 128 KiB, across all the buffers given."""
    out = {}
    for grain, size in (("4k", BLOCK), ("128k", RECORD)):
        hashes = [h for data in buffers for h in block_hashes(data, size)]
        out[grain] = round(len(hashes) / len(set(hashes)), 4)
    return out


def measure(saves: dict[str, Path]) -> dict:
    results = {}
    for name, path in saves.items():
        if name.startswith("earlier_"):
            continue
        started = time.perf_counter()
        data = memoryview(path.read_bytes())
        entry = {"bytes": len(data), "compression": compression(data), "dedup": dedup(data)}
        earlier = saves.get(name.replace("final_", "earlier_"))
        if name.startswith("final_") and earlier:
            entry["dedup_with_earlier_save"] = dedup(memoryview(earlier.read_bytes()), data)
        entry["measure_seconds"] = round(time.perf_counter() - started, 1)
        results[name] = entry
        print(f"  {name}: {len(data) / 2**20:.1f} MiB, {entry['measure_seconds']} s",
              file=sys.stderr)
    return results


def moments_apart(path: Path) -> dict:
    """zstd-1 and lz4 per 128 KiB record of each Adam moment alone (its tensors' raw bytes)."""
    state = torch.load(path, weights_only=True)["state"].values()
    out = {}
    for key in ("exp_avg", "exp_avg_sq"):
        raw = torch.cat([st[key].flatten() for st in state]).numpy().tobytes()
        data, fast = memoryview(raw), codecs()
        out[key] = {c: round(len(data) / sum(min(fast[c](p), len(p))
                                             for p in pieces(data, RECORD)), 4)
                    for c in ("zstd-1", "lz4")}
    return out


# ------------------------------------------------------------------------------ the report
def fmt(ratio: float) -> str:
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.2f}"


def tables(results: dict) -> str:
    names = list(next(iter(results.values()))["compression"])
    lines = []
    for grain, title in (("128k", "per 128 KiB record"), ("4k", "per 4 KiB block"),
                         ("file", "whole file")):
        lines += [f"Compression ratio {title} (bytes in / bytes out):", "",
                  "| file | MiB | " + " | ".join(names) + " | dedup 4 KiB | dedup 128 KiB |",
                  "|---|---:|" + "---:|" * (len(names) + 2)]
        for file, e in results.items():
            cells = [fmt(e["compression"][c][grain]) for c in names]
            cells += [fmt(e["dedup"]["4k"]), fmt(e["dedup"]["128k"])]
            lines.append(f"| {file} | {e['bytes'] / 2**20:.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["A ZFS-like store per 128 KiB record (compressed only where 1/8 is saved, 4 KiB "
              "sectors), and deduplication across the last two saves:", "",
              "| file | zstd-1 | lz4 | zstd-3 | dedup 4 KiB, 2 saves | dedup 128 KiB, 2 saves |",
              "|---|---:|---:|---:|---:|---:|"]
    for file, e in results.items():
        pair = e.get("dedup_with_earlier_save", {})
        cells = [fmt(e["compression"][c]["128k_zfs"]) for c in ("zstd-1", "lz4", "zstd-3")]
        cells += [fmt(pair[g]) if pair else "" for g in ("4k", "128k")]
        lines.append(f"| {file} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, seconds long")
    parser.add_argument("--out", type=Path, default=Path("output/tensor_ratios"))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint files")
    parser.add_argument("--steps", type=int, help="training steps (default 300)")
    parser.add_argument("--pair-gap", type=int, help="steps between the last two saves (10)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's threads (1: steady beside other work; 2 on an idle host)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup = QUICK if args.quick else Setup()
    overrides = {"steps": args.steps, "pair_gap": args.pair_gap}
    setup = Setup(**{**asdict(setup), **{k: v for k, v in overrides.items() if v}})
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="tensor_ratios-", dir=args.out))
    saves: dict[str, Path] = {}
    try:
        print(f"training {setup}", file=sys.stderr)
        facts = train(setup, folder, saves)
        print(f"  {facts['train_seconds']} s, loss {facts['loss_first']} -> "
              f"{facts['loss_last_10_mean']}", file=sys.stderr)
        save_references(max(facts["parameters"] // 4, 1 << 16), folder, saves)
        results = measure(saves)
        facts["adam_moments_apart_128k"] = moments_apart(saves["final_adam_fp32"])
    finally:
        if not args.keep:
            shutil.rmtree(folder)
    versions = {"zstandard": zstandard.__version__, "lz4": lz4.__version__,
                "zlib": zlib.ZLIB_RUNTIME_VERSION, "numpy": np.__version__}
    report = {"training": facts, "versions": versions, "files": results}
    (args.out / "tensor_ratios.json").write_text(json.dumps(report, indent=1) + "\n")
    text = tables(results)
    (args.out / "tensor_ratios.md").write_text(text)
    print(text)
    print(json.dumps({"training": facts, "versions": versions}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
