"""checkpoint.layout: dcp's sizing and limits: what every rank writes in a torch Distributed
Checkpoint save (dcp_plan: FSDP2 over all ranks + AdamW, FileSystemWriter with
checkpoint.dcp.thread_count files per rank), with the interface of sizing.CheckpointLayout so
the plan, the space checks and summary.json describe it; and check_params, the refusals of
what dcp cannot model yet (before any I/O)."""

from __future__ import annotations

import functools

from ..errors import UserError
from .dcp_plan import DcpSavePlan, LlamaModel
from .shard import RankShard

METADATA = ".metadata"
# .metadata's bytes, estimated (fitted to dcp_metadata.metadata_bytes within 10 %: 174 bytes
# per item and 269 per fqn); dcp_metadata.MetadataTemplate makes the real one on rank 0
METADATA_PER_ITEM, METADATA_PER_FQN, METADATA_BASE = 174, 269, 0
DTYPES = ("bf16", "fp16", "fp32", "fp64")  # dcp_plan.DTYPE_BYTES'


def dcp_seed(checkpoint: int, rank: int, file: int) -> int:
    """The seed of one .distcp file's payload bytes (a function of its identity only): the
    checkpoint stream of this seed at the file's offsets, under the items' framing."""
    return (0xDC << 56) | (checkpoint & 0xFFFF) << 40 | (rank & 0xFFFFFF) << 16 | file & 0xFFFF


def check_params(cfg) -> None:
    """Refuse (UserError, before any I/O) what checkpoint.layout: dcp cannot model yet."""
    ck, m = cfg.checkpoint, cfg.model
    par = m.parallelism
    refusals = [
        (par.tensor > 1, "model.parallelism.tensor", par.tensor, "1 (tensor parallelism's 2-D "
         "meshes are not implemented yet)"),
        (par.pipeline > 1, "model.parallelism.pipeline", par.pipeline, "1 (pipeline "
         "parallelism is not implemented yet)"),
        (ck.mode != "default", "checkpoint.mode", ck.mode, "default (dcp saves FSDP2 over "
         "every rank of the job; subset is not implemented yet)"),
        (m.num_layers <= 0, "model.num_layers", m.num_layers, "a transformer (num_layers > 0 "
         "with model.transformer.*): a flat model (model_size_bytes) has no tensors to save"),
        (bool(m.layer_parameters), "model.layer_parameters", list(m.layer_parameters),
         "none (legacy layer lists are not implemented yet)"),
        (bool(m.optimization_groups), "model.optimization_groups",
         list(m.optimization_groups), "none (legacy optimizer groups are not implemented yet)"),
        (ck.checkpoint_mechanism != "native", "checkpoint.checkpoint_mechanism",
         ck.checkpoint_mechanism, "native (dcp writes torch.save's archives itself)"),
        (ck.odirect, "checkpoint.odirect", ck.odirect, "false (DCP writes through the page "
         "cache; O_DIRECT is not implemented yet)"),
        (bool(ck.mpiio_hints), "checkpoint.mpiio_hints", dict(ck.mpiio_hints),
         "none (layout shared's)"),
        (m.model_datatype not in DTYPES, "model.model_datatype", m.model_datatype,
         f"one of {', '.join(DTYPES)}"),
        (m.optimizer_datatype not in DTYPES, "model.optimizer_datatype", m.optimizer_datatype,
         f"one of {', '.join(DTYPES)}"),
    ]
    for refused, key, value, accepted in refusals:
        if refused:
            raise UserError(f"{key}: {value} with checkpoint.layout dcp is not accepted; "
                            f"expected {accepted}")


def llama_model(cfg) -> LlamaModel:
    """The model dcp saves, from the workload's transformer dims and datatypes."""
    m, t = cfg.model, cfg.model.transformer
    return LlamaModel(m.num_layers, t.hidden_size, t.ffn_hidden_size, t.vocab_size,
                      t.num_attention_heads, t.num_kv_heads, m.model_datatype,
                      m.optimizer_datatype)


class DcpLayout:
    """One DCP checkpoint of a job of `ranks` ranks: every rank's .distcp files (rank 0's
    followed by `.metadata`, at its estimated size), the totals sizing.CheckpointLayout gives."""

    mode = "default"

    def __init__(self, cfg, ranks: int) -> None:
        self.ranks = ranks
        self.thread_count = cfg.checkpoint.dcp.thread_count
        self.plan = DcpSavePlan(llama_model(cfg), ranks, self.thread_count)

    @functools.cached_property
    def _files(self) -> list[tuple[tuple[str, int], ...]]:
        return [tuple((f.name, f.size) for f in self.plan.rank_files(r))
                for r in range(self.ranks)]

    @functools.cached_property
    def metadata_bytes(self) -> int:
        """.metadata's bytes, estimated (its exact length varies with the checkpoint's path)."""
        items = sum(len(f.items) for r in range(self.ranks) for f in self.plan.rank_files(r))
        return (METADATA_BASE + METADATA_PER_ITEM * items
                + METADATA_PER_FQN * len(self.plan.entries))

    @functools.cached_property
    def template(self):
        """.metadata's pickle up to its path (dcp_metadata.MetadataTemplate): rank 0's, made
        once."""
        from .dcp_metadata import MetadataTemplate

        return MetadataTemplate(self.plan)

    def shard(self, rank: int) -> RankShard:
        """The files `rank` writes: its .distcp files; rank 0's also .metadata (it commits)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} is not in 0..{self.ranks - 1}")
        files = self._files[rank]
        return RankShard(rank, files + (((METADATA, self.metadata_bytes),) if rank == 0 else ()))

    @property
    def distcp_bytes(self) -> int:
        return sum(n for files in self._files for _, n in files)

    @property
    def total_bytes(self) -> int:
        return self.distcp_bytes + self.metadata_bytes

    @property
    def writers(self) -> int:
        return self.ranks

    @property
    def bytes_per_rank(self) -> tuple[int, int]:
        sizes = [self.shard(r).nbytes for r in range(self.ranks)]
        return min(sizes), max(sizes)

    @property
    def files_per_rank(self) -> tuple[int, int]:
        counts = [len(self.shard(r).files) for r in range(self.ranks)]
        return min(counts), max(counts)

    def summary(self) -> dict:
        """Plain figures for the plan and the results (sizing.CheckpointLayout.summary's keys
        and the dcp layout's own)."""
        return {"ranks": self.ranks, "mode": self.mode, "tensor": 1, "pipeline": 1,
                "data": self.ranks, "zero_stage": 3, "sharding_factor": self.ranks,
                "writers": self.writers, "total_bytes": self.total_bytes,
                "bytes_per_rank": list(self.bytes_per_rank),
                "files_per_rank": list(self.files_per_rank),
                "dcp": {"thread_count": self.thread_count, "distcp_files": sum(
                    len(f) for f in self._files), "distcp_bytes": self.distcp_bytes,
                    "metadata_bytes_estimated": self.metadata_bytes,
                    "model": "Llama-like, FSDP2 (Shard(0) over every rank) + AdamW"}}


def dcp_layout(cfg, ranks: int) -> DcpLayout:
    """The dcp layout of workload `cfg` on `ranks` ranks, its limits checked first."""
    if ranks < 1:
        raise UserError(f"checkpoint: expected at least 1 rank, got {ranks}")
    check_params(cfg)
    return DcpLayout(cfg, ranks)
