"""How much a checkpoint writes: which files each rank writes and how many bytes each, as the
DLIO benchmark lays them out (census section 5.2/5.3), without any I/O.

Ranks are decomposed as DLIO does: MP = TP * PP, DP = ranks // MP (checkpoint.mode default) or
model.parallelism.data (mode subset), rank r has tp = r % TP, pp = (r // TP) % PP,
dp = r // MP, mp = r % MP. ZeRO 0: only the ranks r < MP write; ZeRO >= 1: every rank writes.
A rank's files (extension `.pt`, DLIO's names, numbers not zero-padded):

- `model_states-<rank>`: the flat model (`model.model_size_bytes`, int8) when model.type is not
  `transformer` and the size is > 0;
- the model layers (LLM formula when model.num_layers > 0, else the legacy
  `model.layer_parameters`, int8 and divided by TP): with ZeRO 1/2 written by dp 0 only, one file
  per layer `layer_<k>-model_<mp>_model_states` when PP > 1, else `model_<mp>_model_states`; with
  ZeRO 0/3 `zero_pp_rank_<dp>_mp_rank_<mp>_model_states` (ZeRO 3 shards every tensor by DP);
- `zero_pp_rank_<dp>_mp_rank_<mp>_optim_states`: (3n + 15h) optimizer elements,
  n = N // (DP * MP) (ZeRO > 0) or N // MP (ZeRO 0); legacy `model.optimization_groups`: two
  int8 tensors per group plus one of their sum.

Sizes are tensor payload bytes (what our writers put in the file; torch.save's container adds a
few KiB per file, which neither DLIO nor we count).

Size accounting, corrected against DLIO's reported `checkpoint_size` (`dlio_reported_bytes`
replicates that figure, in bytes rather than DLIO's bytes / 2^30 labelled "GB"): our totals count
what the ranks WRITE. (1) ZeRO 2: DLIO allocates the model layers on every data-parallel rank and
adds them all up, but only dp 0 writes them; we count the dp-0 copy once (DLIO's model part is
DP times too large). (2) A flat model (`model_size_bytes`) is written by every writing rank as
`model_states-<rank>`; DLIO counts it once, we count it once per writer. (3) The legacy
`layer_parameters` / `optimization_groups` tensors are written but DLIO counts none of them; we
count them. The shipped llama workloads (llama_7b, llama_7b_zero3, llama_8b_zero3, llama_70b,
llama_70b_zero3, llama_405b: ZeRO 1 or 3, transformer, no flat model) hit none of these, so our
total equals DLIO's reported figure byte for byte, e.g. llama_8b_zero3 at 8 ranks
112,425,623,552 B (104.705 GiB), llama_70b at 32 ranks 978,390,843,392 B (911.197 GiB),
llama_405b at 256 ranks 5,682,257,133,568 B (5,292.0 GiB = 5.168 TiB; the census's "5.29 TiB"
is this number of GiB). They differ where the defects bite: llama_7b with zero_stage 2 at 8 ranks
writes 94,339,784,704 B, DLIO reports 188,677,603,328 B (the 13,476,831,232-byte model counted
8 times); bert_v100 and unet3d_* (flat model, ZeRO 0, MP 1: one writer) agree, but a flat model
with ZeRO >= 1 on P ranks (or ZeRO 0 with MP > 1) is written P (MP) times; megatron_deepspeed_LLNL
(legacy lists) at 64 ranks writes 370,517,546,368 B where DLIO reports its flat model only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError
from .shard import RankShard

EXTENSION = "pt"
DATATYPE_BYTES = {"int8": 1, "uint8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}


@dataclass(frozen=True)
class _Model:
    """What sizes the tensors (from cfg.model), independent of the rank count."""

    num_layers: int
    hidden: int
    vocab: int
    ffn: int
    heads: int
    kv_heads: int
    model_dtype: int  # bytes per element
    optimizer_dtype: int
    flat_bytes: int  # model_states-<rank>; 0 = none
    layer_parameters: tuple[int, ...]
    optimization_groups: tuple[int, ...]

    def parameters(self) -> int:
        """DLIO's N: total parameters of the transformer (0 without layers)."""
        if self.num_layers <= 0:
            return 0
        h, d_kv = self.hidden, (self.hidden // self.heads) * self.kv_heads
        per_layer = h + h * (h + 2 * d_kv) + h * h + h + 2 * self.ffn * h + self.ffn * h
        return 2 * self.vocab * h + self.num_layers * per_layer + h


@dataclass(frozen=True)
class CheckpointLayout:
    """One checkpoint of a job of `ranks` ranks: decomposition, per-rank files, totals."""

    ranks: int
    mode: str  # checkpoint.mode: default | subset
    tensor: int
    pipeline: int
    data: int  # DP: ranks // MP (default) or model.parallelism.data (subset)
    zero_stage: int
    model: _Model = field(repr=False)
    # per pipeline stage: ((layer index, bytes of that layer on one rank), ...)
    stage_layers: tuple[tuple[tuple[int, int], ...], ...] = field(repr=False)

    # ------------------------------------------------------------------ decomposition
    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline

    @property
    def sharding_factor(self) -> int:
        """How many ways every model tensor is split besides TP: DP for ZeRO 3, else 1."""
        return self.data if self.zero_stage == 3 else 1

    def coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """(tp, pp, dp, mp) of `rank`."""
        mp = self.model_parallel
        return rank % self.tensor, (rank // self.tensor) % self.pipeline, rank // mp, rank % mp

    # ------------------------------------------------------------------ one rank
    def shard(self, rank: int) -> RankShard:
        """The files `rank` writes (none for a ZeRO-0 rank outside the first replica)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} is not in 0..{self.ranks - 1}")
        _, pp, dp, mp = self.coordinates(rank)
        files: list[tuple[str, int]] = []
        if self.zero_stage == 0 and rank >= self.model_parallel:
            return RankShard(rank, ())
        m = self.model
        if m.flat_bytes > 0:
            files.append((f"model_states-{rank}.{EXTENSION}", m.flat_bytes))
        layers = self.stage_layers[pp]
        if layers:
            if 0 < self.zero_stage < 3:
                if dp == 0 and m.num_layers > 0:
                    if self.pipeline > 1:
                        files.extend((f"layer_{index}-model_{mp}_model_states.{EXTENSION}", size)
                                     for index, size in layers)
                    else:
                        files.append((f"model_{mp}_model_states.{EXTENSION}",
                                      sum(size for _, size in layers)))
            else:
                files.append((f"zero_pp_rank_{dp}_mp_rank_{mp}_model_states.{EXTENSION}",
                              sum(size for _, size in layers)))
        optimizer = self._optimizer_bytes()
        if optimizer is not None:
            files.append((f"zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.{EXTENSION}", optimizer))
        return RankShard(rank, tuple(files))

    def _optimizer_bytes(self) -> int | None:
        """Bytes of one writing rank's optim_states file; None = no such file."""
        m = self.model
        if m.optimization_groups:
            return 3 * sum(g for g in m.optimization_groups if g > 0)  # a, b, combined: int8
        n = self._optimizer_elements()
        if n <= 0:
            return None
        return (3 * n + 15 * m.hidden) * m.optimizer_dtype

    def _optimizer_elements(self) -> int:
        n = self.model.parameters()
        return n // (self.data * self.model_parallel) if self.zero_stage > 0 \
            else n // self.model_parallel

    # ------------------------------------------------------------------ all ranks
    def _classes(self) -> list[tuple[int, int]]:
        """(number of ranks, a representative rank) per class of ranks writing the same sizes:
        sizes depend only on the pipeline stage and on dp == 0. O(PP), whatever the ranks."""
        first = min(self.ranks, self.model_parallel)
        out = []
        for pp in range(self.pipeline):
            for lo, hi in ((0, first), (self.model_parallel, self.ranks)):
                count = self._count(hi, pp) - self._count(lo, pp) if hi > lo else 0
                if count > 0:
                    out.append((count, lo + pp * self.tensor))
        return out

    def _count(self, n: int, pp: int) -> int:
        """How many ranks r < n sit on pipeline stage pp."""
        full, rest = divmod(n, self.model_parallel)
        return full * self.tensor + min(max(rest - pp * self.tensor, 0), self.tensor)

    @property
    def total_bytes(self) -> int:
        """Bytes one checkpoint writes, summed over all ranks."""
        return sum(count * self.shard(rep).nbytes for count, rep in self._classes())

    @property
    def writers(self) -> int:
        """Ranks that write at least one file."""
        return sum(count for count, rep in self._classes() if self.shard(rep).files)

    @property
    def bytes_per_rank(self) -> tuple[int, int]:
        """(min, max) bytes a rank writes, over all ranks."""
        sizes = [self.shard(rep).nbytes for _, rep in self._classes()]
        return min(sizes), max(sizes)

    @property
    def files_per_rank(self) -> tuple[int, int]:
        """(min, max) files a rank writes, over all ranks."""
        counts = [len(self.shard(rep).files) for _, rep in self._classes()]
        return min(counts), max(counts)

    def summary(self) -> dict:
        """Plain figures for the plan and the results."""
        return {"ranks": self.ranks, "mode": self.mode, "tensor": self.tensor,
                "pipeline": self.pipeline, "data": self.data, "zero_stage": self.zero_stage,
                "sharding_factor": self.sharding_factor, "writers": self.writers,
                "total_bytes": self.total_bytes, "bytes_per_rank": list(self.bytes_per_rank),
                "files_per_rank": list(self.files_per_rank)}


# ---------------------------------------------------------------------- building a layout
def _model_of(cfg) -> _Model:
    m, t = cfg.model, cfg.model.transformer
    flat = m.model_size_bytes if m.type != "transformer" else 0
    return _Model(num_layers=m.num_layers, hidden=t.hidden_size, vocab=t.vocab_size,
                  ffn=t.ffn_hidden_size, heads=t.num_attention_heads, kv_heads=t.num_kv_heads,
                  model_dtype=DATATYPE_BYTES[m.model_datatype],
                  optimizer_dtype=DATATYPE_BYTES[m.optimizer_datatype], flat_bytes=flat,
                  layer_parameters=tuple(m.layer_parameters),
                  optimization_groups=tuple(m.optimization_groups))


def _stage_range(num_layers: int, stages: int, pp: int, ends: bool) -> range:
    """Layer indices of pipeline stage pp: transformer layers 1..L split in order, the first
    `L % PP` stages one more; with `ends`, stage 0 also holds 0 (embedding) and the last stage
    L+1 (lm_head) and L+2 (final norm)."""
    q, rem = divmod(num_layers, stages)
    if pp < rem:
        start = pp * (q + 1) + 1
        end = start + q
    else:
        start = rem * (q + 1) + (pp - rem) * q + 1
        end = start + q - 1
    if ends:
        if pp == stages - 1:
            end = num_layers + 2
        if pp == 0:
            start = 0
    return range(start, end + 1)


def _layer_elements(m: _Model, index: int, tensor: int, sf: int) -> list[int]:
    """Elements of each tensor of layer `index` on one rank (DLIO's formula)."""
    h, L = m.hidden, m.num_layers
    if index in (0, L + 1):
        return [h * m.vocab // tensor // sf]  # embedding, lm_head
    if index == L + 2:
        return [h // sf]  # final norm
    d_kv = (h // m.heads) * m.kv_heads
    return [h // sf, h * (h + 2 * d_kv) // tensor // sf, h * h // tensor // sf, h // sf,
            2 * h * m.ffn // tensor // sf, h * m.ffn // tensor // sf]


def _stage_layers(m: _Model, tensor: int, pipeline: int, sf: int
                  ) -> tuple[tuple[tuple[int, int], ...], ...]:
    stages = []
    for pp in range(pipeline):
        if m.layer_parameters:  # legacy: int8 tensors, the same on every layer, split by TP
            size = sum(p // tensor for p in m.layer_parameters if p > 0)
            layers = tuple((k, size) for k in _stage_range(m.num_layers, pipeline, pp, False))
        elif m.num_layers > 0:
            layers = tuple((k, m.model_dtype * sum(e for e in _layer_elements(m, k, tensor, sf)
                                                   if e > 0))
                           for k in _stage_range(m.num_layers, pipeline, pp, True))
        else:
            layers = ()
        stages.append(layers)
    return tuple(stages)


def checkpoint_layout(cfg, ranks: int) -> CheckpointLayout:
    """The layout of one checkpoint of workload `cfg` run on `ranks` ranks. Refuses (UserError)
    a rank count the parallelism does not fit. (ZeRO 3 with pipeline > 1 and
    model.parallelism.data outside subset mode are refused by the loader.) checkpoint.layout
    dcp: torch DCP's files instead (checkpoint/dcp_layout.py)."""
    if cfg.checkpoint.layout == "dcp":
        from .dcp_layout import dcp_layout

        return dcp_layout(cfg, ranks)
    par, mode = cfg.model.parallelism, cfg.checkpoint.mode
    mp = par.tensor * par.pipeline
    if ranks < 1:
        raise UserError(f"checkpoint: expected at least 1 rank, got {ranks}")
    if mode == "subset":
        data = par.data
        if ranks > data * mp:
            raise UserError(f"checkpoint.mode: subset emulates {ranks} ranks of a job of "
                            f"model.parallelism.data × tensor × pipeline = {data} × "
                            f"{par.tensor} × {par.pipeline} = {data * mp} ranks; expected at "
                            f"most {data * mp} ranks (or raise model.parallelism.data)")
    else:
        if ranks % mp:
            raise UserError(f"model.parallelism.tensor × model.parallelism.pipeline: "
                            f"tensor × pipeline = {par.tensor} × "
                            f"{par.pipeline} = {mp} must divide the rank count in "
                            f"checkpoint.mode default, got {ranks} ranks; expected a multiple "
                            f"of {mp} (or checkpoint.mode subset with model.parallelism.data)")
        data = ranks // mp
    model = _model_of(cfg)
    sf = data if par.zero_stage == 3 else 1
    return CheckpointLayout(ranks=ranks, mode=mode, tensor=par.tensor, pipeline=par.pipeline,
                            data=data, zero_stage=par.zero_stage, model=model,
                            stage_layers=_stage_layers(model, par.tensor, par.pipeline, sf))


def dlio_reported_bytes(cfg, ranks: int) -> int:
    """DLIO's reported `checkpoint_size` for the same job, in bytes (DLIO prints it / 2^30 as
    "GB"): model = the flat size once if there is one, else the formula's layer bytes summed
    over the ranks that allocate them (ZeRO 0: r < MP; ZeRO 1: dp 0; ZeRO 2, 3: all); plus the
    formula's optimizer bytes over the writers; legacy lists count nothing."""
    layout = checkpoint_layout(cfg, ranks)
    m = layout.model
    n = layout._optimizer_elements()
    optimizer = (3 * n + 15 * m.hidden) * m.optimizer_dtype if m.num_layers > 0 and n > 0 else 0
    optimizer = 0 if m.optimization_groups else optimizer
    model, writers = 0, 0
    for count, rep in layout._classes():
        _, pp, dp, _ = layout.coordinates(rep)
        if layout.zero_stage == 0 and rep >= layout.model_parallel:
            continue
        writers += count
        allocates = not (layout.zero_stage == 1 and dp != 0)
        if allocates and not m.layer_parameters and m.num_layers > 0:
            model += count * sum(size for _, size in layout.stage_layers[pp])
    if m.flat_bytes > 0:
        model = m.flat_bytes
    return model + writers * optimizer
