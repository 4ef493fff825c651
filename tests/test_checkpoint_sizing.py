"""checkpoint/sizing.py: per-rank files and bytes of one checkpoint, checked against values
computed by hand from DLIO's formula (census section 5.3), written out below; DLIO's reported
figure against the census's totals; subset mode, flat models, the corrected defects, refusals."""

from __future__ import annotations

import time

import pytest

from dlio_mpi.checkpoint.sizing import checkpoint_layout, dlio_reported_bytes
from dlio_mpi.config.loader import load_config
from dlio_mpi.errors import UserError

GiB = 1 << 30


# ---------------------------------------------------------------------- the formula, by hand
def params(L, h, F, V, heads, kv):
    """N = 2Vh + L(2h + h(h + 2 d_kv) + h^2 + 3Fh) + h, d_kv = (h / heads) kv."""
    d_kv = (h // heads) * kv
    return 2 * V * h + L * (2 * h + h * (h + 2 * d_kv) + h * h + 3 * F * h) + h


def layer_elements(h, F, heads, kv, tp, sf):
    """One transformer layer on one rank: norms not split by TP, matrices by TP, all by sf."""
    d_kv = (h // heads) * kv
    return (h // sf + h * (h + 2 * d_kv) // tp // sf + h * h // tp // sf + h // sf
            + 2 * h * F // tp // sf + h * F // tp // sf)


def optimizer_bytes(n, h):
    """Groups [n, 5h, n, 5h, n, 5h] in fp32."""
    return (3 * n + 15 * h) * 4


# llama_7b: L 32, h 4096, F 11008, V 32000, heads 32, kv 32
N_7B = params(32, 4096, 11008, 32000, 32, 32)
# llama_8b: L 32, h 4096, F 14336, V 128256, heads 32, kv 8
N_8B = params(32, 4096, 14336, 128256, 32, 8)
# llama_70b: L 80, h 8192, F 28672, V 128256, heads 128, kv 8
N_70B = params(80, 8192, 28672, 128256, 128, 8)
# llama_405b: L 126, h 16384, F 53248, V 128256, heads 128, kv 8
N_405B = params(126, 16384, 53248, 128256, 128, 8)


def test_hand_formula_matches_the_written_out_numbers():
    # 7b: 2*32000*4096 + 32*(8192 + 4096*12288 + 4096^2 + 3*11008*4096) + 4096
    assert N_7B == 262_144_000 + 32 * 202_383_360 + 4096 == 6_738_415_616
    assert N_8B == 8_030_261_248
    assert N_70B == 69_882_617_856
    assert N_405B == 405_853_388_800


# ---------------------------------------------------------------------- llama_7b, ZeRO 1
def test_llama_7b_zero1_8_ranks():
    layout = checkpoint_layout(load_config("llama_7b", []), 8)
    assert (layout.tensor, layout.pipeline, layout.data, layout.zero_stage) == (1, 1, 8, 1)
    assert layout.sharding_factor == 1 and layout.writers == 8
    model = 2 * N_7B  # fp16, one replica, written by dp 0 in one file (PP 1)
    assert model == 13_476_831_232
    opt = optimizer_bytes(N_7B // 8, 4096)  # n = N // (DP * MP)
    assert opt == (3 * 842_301_952 + 61_440) * 4 == 10_107_869_184
    assert layout.shard(0).files == (("model_0_model_states.pt", 13_476_831_232),
                                     ("zero_pp_rank_0_mp_rank_0_optim_states.pt", 10_107_869_184))
    assert layout.shard(3).files == (("zero_pp_rank_3_mp_rank_0_optim_states.pt", 10_107_869_184),)
    assert layout.total_bytes == 13_476_831_232 + 8 * 10_107_869_184 == 94_339_784_704
    assert layout.bytes_per_rank == (10_107_869_184, 23_584_700_416)
    assert layout.files_per_rank == (1, 2)


# ---------------------------------------------------------------------- llama_8b, ZeRO 3
def test_llama_8b_zero3_8_ranks():
    layout = checkpoint_layout(load_config("llama_8b_zero3", []), 8)
    assert layout.sharding_factor == 8
    h, V = 4096, 128256
    elements = (2 * (h * V // 8)  # embedding + lm_head, TP 1, sf 8: 65,667,072 each
                + 32 * layer_elements(h, 14336, 32, 8, 1, 8)  # 27,264,000 per layer
                + h // 8)  # final norm
    assert elements == 2 * 65_667_072 + 32 * 27_264_000 + 512 == 1_003_782_656
    model = 2 * elements
    opt = optimizer_bytes(N_8B // 8, h)
    assert (model, opt) == (2_007_565_312, 12_045_637_632)
    for rank in (0, 5):
        assert layout.shard(rank).files == (
            (f"zero_pp_rank_{rank}_mp_rank_0_model_states.pt", 2_007_565_312),
            (f"zero_pp_rank_{rank}_mp_rank_0_optim_states.pt", 12_045_637_632))
    assert layout.bytes_per_rank == (14_053_202_944, 14_053_202_944)
    assert layout.total_bytes == 8 * 14_053_202_944 == dlio_reported_bytes(
        load_config("llama_8b_zero3", []), 8)


def test_llama_8b_zero3_subset_of_1024():
    """The CI setting: 8 ranks write their share of a 1024-rank job."""
    cfg = load_config("llama_8b_zero3", ["checkpoint.mode=subset",
                                         "model.parallelism.data=1024"])
    layout = checkpoint_layout(cfg, 8)
    assert (layout.ranks, layout.data, layout.sharding_factor) == (8, 1024, 1024)
    h, V = 4096, 128256
    elements = 2 * (h * V // 1024) + 32 * layer_elements(h, 14336, 32, 8, 1, 1024) + h // 1024
    assert elements == 2 * 513_024 + 32 * 213_000 + 4 == 7_842_052
    opt = optimizer_bytes(N_8B // 1024, h)
    assert opt == (3 * 7_842_052 + 61_440) * 4 == 94_350_384
    assert layout.shard(7).files == (("zero_pp_rank_7_mp_rank_0_model_states.pt", 15_684_104),
                                     ("zero_pp_rank_7_mp_rank_0_optim_states.pt", 94_350_384))
    assert layout.total_bytes == 8 * (15_684_104 + 94_350_384)
    # the same share as those ranks have in the full 1024-rank job
    full = checkpoint_layout(load_config("llama_8b_zero3", []), 1024)
    assert full.shard(7).files == layout.shard(7).files


# ---------------------------------------------------------------------- llama_70b, TP 8 PP 4
EMB_70B = 2 * (8192 * 128256 // 8)  # embedding or lm_head on one TP rank, fp16
LAYER_70B = 2 * layer_elements(8192, 28672, 128, 8, 8, 1)


def test_llama_70b_32_ranks():
    layout = checkpoint_layout(load_config("llama_70b", []), 32)
    assert (layout.tensor, layout.pipeline, layout.data, layout.model_parallel) == (8, 4, 1, 32)
    assert (EMB_70B, LAYER_70B) == (262_668_288, 211_845_120)
    opt = optimizer_bytes(N_70B // 32, 8192)
    assert opt == (3 * 2_183_831_808 + 122_880) * 4 == 26_206_473_216
    optim0 = ("zero_pp_rank_0_mp_rank_0_optim_states.pt", opt)
    # rank 0: tp 0, pp 0: layer 0 (embedding) and transformer layers 1..20
    assert layout.shard(0).files == (
        (("layer_0-model_0_model_states.pt", 262_668_288),)
        + tuple((f"layer_{k}-model_0_model_states.pt", 211_845_120) for k in range(1, 21))
        + (optim0,))
    # rank 9: tp 1, pp 1, mp 9: layers 21..40
    assert layout.coordinates(9) == (1, 1, 0, 9)
    assert layout.shard(9).names == (
        tuple(f"layer_{k}-model_9_model_states.pt" for k in range(21, 41))
        + ("zero_pp_rank_0_mp_rank_9_optim_states.pt",))
    # rank 31: last stage: layers 61..80, lm_head 81, final norm 82 (8192 fp16)
    last = layout.shard(31)
    assert last.files[-3:] == (("layer_81-model_31_model_states.pt", 262_668_288),
                               ("layer_82-model_31_model_states.pt", 16_384),
                               ("zero_pp_rank_0_mp_rank_31_optim_states.pt", opt))
    assert last.nbytes == 262_668_288 + 16_384 + 20 * 211_845_120 + opt == 30_706_060_288
    assert layout.bytes_per_rank == (20 * 211_845_120 + opt, 30_706_060_288)
    assert layout.files_per_rank == (21, 23)
    assert layout.total_bytes == 8 * (2 * 262_668_288 + 16_384 + 80 * 211_845_120) + 32 * opt


def test_llama_70b_64_ranks_second_replica_writes_optimizer_only():
    layout = checkpoint_layout(load_config("llama_70b", []), 64)
    opt = optimizer_bytes(N_70B // 64, 8192)
    assert layout.shard(41).files == (("zero_pp_rank_1_mp_rank_9_optim_states.pt", opt),)
    assert layout.total_bytes == 8 * (2 * EMB_70B + 16_384 + 80 * LAYER_70B) + 64 * opt


# ---------------------------------------------------------------------- llama_405b, subset
def test_llama_405b_subset_8_of_256():
    cfg = load_config("llama_405b", ["checkpoint.mode=subset", "model.parallelism.data=1"])
    layout = checkpoint_layout(cfg, 8)
    assert (layout.model_parallel, layout.data) == (256, 1)
    h = 16384
    emb = 2 * (h * 128256 // 8)
    layer = 2 * layer_elements(h, 53248, 128, 8, 8, 1)
    opt = optimizer_bytes(N_405B // 256, h)
    assert (emb, layer, opt) == (525_336_576, 796_983_296, 19_025_360_640)
    # 126 layers over 32 stages: 3 each, the first 30 stages 4: stage 0 holds 0..4
    for rank in range(8):
        assert layout.coordinates(rank) == (rank, 0, 0, rank)
        assert layout.shard(rank).files == (
            ((f"layer_0-model_{rank}_model_states.pt", emb),)
            + tuple((f"layer_{k}-model_{rank}_model_states.pt", layer) for k in range(1, 5))
            + ((f"zero_pp_rank_0_mp_rank_{rank}_optim_states.pt", opt),))
    assert layout.total_bytes == 8 * (emb + 4 * layer + opt) == 8 * 22_738_630_400


# ---------------------------------------------------------------------- census totals
@pytest.mark.parametrize("name, ranks, gib", [
    ("llama_7b", 8, 87.86), ("llama_8b_zero3", 1, 104.70), ("llama_70b", 32, 911.20),
    ("llama_405b", 256, 5292.01)])
def test_census_totals(name, ranks, gib):
    """The census's 104.7 GiB, 911 GiB, 5.29 (thousand GiB) at DP 1; ours equal DLIO's here."""
    cfg = load_config(name, [])
    reported = dlio_reported_bytes(cfg, ranks)
    assert reported / GiB == pytest.approx(gib, abs=0.01)
    assert checkpoint_layout(cfg, ranks).total_bytes == reported


# ---------------------------------------------------------------------- corrected defects
def test_zero2_counts_what_is_written():
    cfg = load_config("llama_7b", ["model.parallelism.zero_stage=2"])
    layout = checkpoint_layout(cfg, 8)
    opt = optimizer_bytes(N_7B // 8, 4096)
    assert layout.shard(0).files == (("model_0_model_states.pt", 2 * N_7B),
                                     ("zero_pp_rank_0_mp_rank_0_optim_states.pt", opt))
    assert layout.total_bytes == 2 * N_7B + 8 * opt == 94_339_784_704
    # DLIO allocates the model on all 8 data-parallel ranks and adds them all up
    assert dlio_reported_bytes(cfg, 8) == 8 * 2 * N_7B + 8 * opt == 188_677_603_328


FLAT = ["model.type=cnn", "model.num_layers=-1", "model.model_size_bytes=1000"]


def test_flat_model_written_by_every_writer():
    cfg = load_config("llama_7b", FLAT)  # ZeRO 1: every rank writes
    layout = checkpoint_layout(cfg, 4)
    assert layout.shard(2).files == (("model_states-2.pt", 1000),)
    assert layout.total_bytes == 4000 and layout.writers == 4
    assert dlio_reported_bytes(cfg, 4) == 1000  # DLIO: once


def test_flat_model_zero0_first_replica_only():
    cfg = load_config("llama_7b", FLAT + ["model.parallelism.zero_stage=0",
                                          "model.parallelism.tensor=2"])
    layout = checkpoint_layout(cfg, 8)
    assert [layout.shard(r).files for r in range(4)] == [
        (("model_states-0.pt", 1000),), (("model_states-1.pt", 1000),), (), ()]
    assert (layout.writers, layout.total_bytes) == (2, 2000)
    assert layout.bytes_per_rank == (0, 1000) and layout.files_per_rank == (0, 1)
    assert dlio_reported_bytes(cfg, 8) == 1000


def test_shipped_flat_workload_unet3d():
    cfg = load_config("unet3d_h100", [])  # model.model_size 499153191 (legacy name), ZeRO 0
    layout = checkpoint_layout(cfg, 4)
    assert layout.shard(0).files == (("model_states-0.pt", 499_153_191),)
    assert layout.total_bytes == 499_153_191 == dlio_reported_bytes(cfg, 4)


def test_zero0_transformer_first_replica():
    cfg = load_config("llama_7b", ["model.parallelism.zero_stage=0"])
    layout = checkpoint_layout(cfg, 4)
    opt = optimizer_bytes(N_7B, 4096)  # n = N // MP
    assert layout.shard(0).files == (("zero_pp_rank_0_mp_rank_0_model_states.pt", 2 * N_7B),
                                     ("zero_pp_rank_0_mp_rank_0_optim_states.pt", opt))
    assert layout.shard(1).files == ()
    assert layout.writers == 1 and layout.total_bytes == 2 * N_7B + opt


def test_legacy_lists_are_counted():
    cfg = load_config("megatron_deepspeed_LLNL", [])  # TP 4, PP 8, ZeRO 1, 40 layers
    layout = checkpoint_layout(cfg, 32)
    layer = 52_583_936 // 4 + 209_715_200 // 4  # int8, split by TP
    opt = 3 * (1_009_254_400 + 865_075_200 + 793_600)  # a, b, combined
    assert layout.shard(0).files == (
        (("model_states-0.pt", 30102),)
        + tuple((f"layer_{k}-model_0_model_states.pt", layer) for k in range(1, 6))
        + (("zero_pp_rank_0_mp_rank_0_optim_states.pt", opt),))
    assert layout.total_bytes == 32 * 30102 + 4 * 40 * layer + 32 * opt
    assert dlio_reported_bytes(cfg, 32) == 30102


# ---------------------------------------------------------------------- scale
def test_many_ranks_fast_and_consistent():
    cfg = load_config("llama_70b", [])
    start = time.perf_counter()
    big = checkpoint_layout(cfg, 32 * 512)
    assert big.writers == 32 * 512 and big.bytes_per_rank[0] > 0
    assert big.total_bytes > 0 and big.files_per_rank == (1, 23)
    assert time.perf_counter() - start < 0.5
    small = checkpoint_layout(cfg, 96)
    shards = [small.shard(r) for r in range(96)]
    assert small.total_bytes == sum(s.nbytes for s in shards)
    assert small.bytes_per_rank == (min(s.nbytes for s in shards), max(s.nbytes for s in shards))
    assert len({n for s in shards for n in s.names}) == sum(len(s.files) for s in shards)


# ---------------------------------------------------------------------- refusals
def test_refuses_zero3_with_pipeline():
    with pytest.raises(UserError, match=r"zero_stage: 3 .*pipeline.*got pipeline 4"):
        load_config("llama_70b", ["model.parallelism.zero_stage=3"])


def test_refuses_ranks_not_a_multiple_of_tp_pp():
    cfg = load_config("llama_70b", [])
    with pytest.raises(UserError, match=r"tensor × pipeline = 8 × 4 = 32 must divide .* "
                                        r"got 48 ranks"):
        checkpoint_layout(cfg, 48)
    with pytest.raises(UserError, match="got 8 ranks"):
        checkpoint_layout(cfg, 8)


def test_refuses_data_outside_subset():
    with pytest.raises(UserError, match=r"model\.parallelism\.data: .*default.*got 4"):
        load_config("llama_7b", ["model.parallelism.data=4"])


def test_refuses_subset_larger_than_the_job():
    cfg = load_config("llama_7b", ["checkpoint.mode=subset", "model.parallelism.data=4"])
    assert checkpoint_layout(cfg, 3).data == 4
    with pytest.raises(UserError, match=r"checkpoint\.mode: subset .* at most 4 ranks"):
        checkpoint_layout(cfg, 5)


def test_shard_rank_out_of_range():
    with pytest.raises(ValueError):
        checkpoint_layout(load_config("llama_7b", []), 2).shard(2)


def test_llama_70b_zero3_tp8_dp2():
    layout = checkpoint_layout(load_config("llama_70b_zero3", []), 16)
    assert (layout.tensor, layout.pipeline, layout.data, layout.sharding_factor) == (8, 1, 2, 2)
    h = 8192
    elements = 2 * (h * 128256 // 8 // 2) + 80 * layer_elements(h, 28672, 128, 8, 8, 2) + h // 2
    assert elements == 2 * 65_667_072 + 80 * 52_961_280 + 4096
    opt = optimizer_bytes(N_70B // 16, h)
    assert layout.coordinates(13) == (5, 0, 1, 5)
    assert layout.shard(13).files == (("zero_pp_rank_1_mp_rank_5_model_states.pt", 2 * elements),
                                      ("zero_pp_rank_1_mp_rank_5_optim_states.pt", opt))
    assert layout.total_bytes == 16 * (2 * elements + opt) == dlio_reported_bytes(
        load_config("llama_70b_zero3", []), 16)


def test_datatypes():
    cfg = load_config("llama_7b", ["model.model_datatype=fp32", "model.optimizer_datatype=bf16"])
    layout = checkpoint_layout(cfg, 2)
    n = N_7B // 2
    assert layout.shard(0).files == (("model_0_model_states.pt", 4 * N_7B),
                                     ("zero_pp_rank_0_mp_rank_0_optim_states.pt",
                                      (3 * n + 15 * 4096) * 2))
