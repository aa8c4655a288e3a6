"""Multi-head latent attention under sequence parallelism (Megatron-Core ``MLASelfAttention``): the duplicated
down projections run on the rank's sequence shard, and the attention side gathers the latents, not the hidden
states (:func:`opcast.archs.attention_ops` ``rows``, :func:`opcast.predict.graph.block_comms`)."""

from __future__ import annotations

import math

from opcast.archs import load_arch
from opcast.dtypes import element_bytes
from opcast.predict.graph import BWD, FWD, RECOMPUTE, Dtypes, block_comms, block_ops, train_block

DS = load_arch("deepseek-v3")
TOKENS = 2 * 4096


def _gemm(ops, role):
    (p,) = [p for r, kind, p, _ in ops if r == role]
    return p


def _ops(sp: bool, tp: int = 4):
    return block_ops(DS, tp=tp, batch=2, seq_q=4096, seq_kv=4096, sp=sp, ep=8)


def test_the_down_projections_run_on_the_local_shard_only_under_sp():
    for sp, rows in ((True, TOKENS // 4), (False, TOKENS)):
        ops = _ops(sp)
        assert _gemm(ops, "q_down")["m"] == rows and _gemm(ops, "kv_down")["m"] == rows
        assert _gemm(ops, "q_down_norm")["rows"] == rows
        assert _gemm(ops, "q_up")["m"] == TOKENS and _gemm(ops, "kv_up")["m"] == TOKENS  # after the gather


def _comms(quantised=None):
    return block_comms(DS, tp=4, batch=2, seq_q=4096, sp=True, cp=1, ep=8, dtype="bf16", quantised=quantised)


def test_the_attention_side_gathers_the_latents_and_the_rope_key():
    c = _comms()
    gathers = [x.bytes for x in c[FWD] if x.kind == "all_gather"]
    q, kv, rope, mlp = gathers
    assert (q, kv) == (TOKENS * DS.q_lora_rank * 2, TOKENS * DS.kv_lora_rank * 2)
    assert rope == TOKENS * DS.qk_rope_head_dim * 2
    assert mlp == TOKENS * DS.hidden * 2  # the MoE side's dispatcher input, bf16
    assert q + kv + rope < TOKENS * DS.hidden * 2 / 3  # 2,112 values a token instead of 7,168
    # backward: the three gradients reduce-scattered at their widths, the out projection's output gradient
    # gathered hidden-wide, the latents re-gathered for the up projections' weight gradients
    rs = sorted(x.bytes for x in c[BWD] if x.kind == "reduce_scatter")
    assert rs == sorted([q, kv, rope, TOKENS * DS.hidden * 2])
    overlapped = {x.overlap_with: x.bytes for x in c[BWD] if x.overlap_with}
    assert overlapped == {"q_up.dgrad": q, "kv_up.dgrad": kv, "mlp_up.dgrad": mlp}


def test_fp8_up_projections_gather_their_latents_in_fp8():
    c = _comms(quantised="fp8")
    q, kv, rope, mlp = [x.bytes for x in c[FWD] if x.kind == "all_gather"]
    assert (q, kv) == (TOKENS * DS.q_lora_rank, TOKENS * DS.kv_lora_rank)
    assert rope == TOKENS * DS.qk_rope_head_dim * 2 and mlp == TOKENS * DS.hidden * 2
    mxfp8 = _comms(quantised="fp8_block")
    assert next(x.bytes for x in mxfp8[FWD]) == math.ceil(TOKENS * DS.q_lora_rank * element_bytes("fp8_block"))


def test_a_recomputed_moe_layer_repeats_the_mlp_sides_gather():
    g = train_block(
        DS,
        tp=4,
        batch=2,
        seq=4096,
        sp=True,
        cp=1,
        ep=8,
        attention="flash",
        recompute="selective:moe",
        prec=Dtypes(matrix="bf16", act="bf16"),
    )
    tp = [(x.kind, x.bytes, x.count) for x in g.comms[RECOMPUTE] if x.role == "tp"]
    assert tp == [("all_gather", TOKENS * DS.hidden * 2, 1), ("reduce_scatter", TOKENS * DS.hidden * 2, 1)]
