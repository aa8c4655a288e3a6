"""The op registry: formulas against hand-computed values, validation and registration rules."""

from __future__ import annotations

import pytest

from opcast.errors import OpcastError
from opcast.ops import (
    BUS_FACTORS,
    ELEMENTWISE_FNS,
    INT_PARAM_LIMIT,
    OpKind,
    OpSpec,
    Param,
    arithmetic_intensity,
    bus_factor,
    get_op,
    moe_balanced_experts,
    op_kinds,
    param_types,
    register,
    uses_tensor_cores,
    whole_number,
)

REQUIRED_KINDS = {
    "gemm",
    "attention",
    "layernorm",
    "rmsnorm",
    "softmax",
    "elementwise",
    "embedding",
    "cross_entropy",
    "rope",
    "optimizer",
    "moe",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "broadcast",
}


def test_registry_holds_every_required_kind():
    assert set(op_kinds()) == REQUIRED_KINDS
    assert set(op_kinds(collective=True)) == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
        "broadcast",
    }


def test_registering_a_kind_twice_raises():
    with pytest.raises(ValueError, match="already registered"):
        register(get_op("gemm"))


def test_a_parameter_keeps_one_type_across_kinds():
    spec = OpSpec(
        kind=OpKind.GEMM,
        doc="",
        params=(Param(name="rows", type=str, doc=""),),
        flops_fwd=lambda p, d: 0.0,
        bytes_fwd=lambda p, d: 0.0,
    )
    with pytest.raises(ValueError):
        register(spec)
    assert param_types()["rows"] is int


def test_gemm_formulas_by_hand():
    g = get_op("gemm")
    p = g.validate({"b": 2, "m": 3, "n": 5, "k": 7})
    assert g.flops(p) == 2 * 2 * 3 * 5 * 7 == 420
    assert g.flops(p, "bwd") == 840
    # A [2,3,7], B [2,7,5], C [2,3,5] in fp16: 2 bytes x (42 + 70 + 30)
    assert g.bytes_moved(p, 2) == 2 * (42 + 70 + 30)
    assert g.bytes_moved(p, 2, "bwd") == 2 * g.bytes_moved(p, 2)
    assert arithmetic_intensity("gemm", p, 2) == pytest.approx(420 / 284)


def test_square_gemm_intensity_is_n_over_3_bytes():
    p = {"b": 1, "m": 4096, "n": 4096, "k": 4096}
    # 2n^3 / (3 n^2 * 2 bytes) = n / 3
    assert arithmetic_intensity("gemm", p, 2) == pytest.approx(4096 / 3)


def _attn(**kw):
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16, causal=False, impl="flash")
    base.update(kw)
    return get_op("attention").validate(base)


def test_attention_flops_full_and_causal():
    a = get_op("attention")
    full = _attn()
    assert a.flops(full) == 4 * 2 * 4 * 16 * 8 * 8  # 4 * b * h * d * sq * skv
    causal = _attn(causal=True)
    assert a.flops(causal) == 4 * 2 * 4 * 16 * (8 * 9 / 2)  # the triangle incl. the diagonal
    # decode: one query sees every key whether or not the mask is on
    assert a.flops(_attn(seq_q=1, seq_kv=100, causal=True)) == a.flops(_attn(seq_q=1, seq_kv=100))
    # eager computes the full square even when causal
    assert a.flops(_attn(causal=True, impl="eager")) == a.flops(full)
    assert a.flops(full, "bwd") == 2.5 * a.flops(full)
    assert a.flops(_attn(impl="eager"), "bwd") == 2 * a.flops(full)


def test_attention_bytes_by_hand():
    a = get_op("attention")
    p = _attn()
    qo = 2 * 4 * 8 * 16  # batch * heads * seq_q * head_dim
    kv = 2 * 2 * 8 * 16
    lse = 4 * 2 * 4 * 8
    assert a.bytes_moved(p, 2) == 2 * (2 * qo + 2 * kv) + lse
    eager = _attn(impl="eager")
    assert a.bytes_moved(eager, 2) == a.bytes_moved(p, 2) + 4 * 2 * (2 * 4 * 8 * 8)


def test_attention_validation_names_every_problem():
    with pytest.raises(OpcastError) as err:
        get_op("attention").validate(
            dict(batch=1, heads=6, kv_heads=4, seq_q=16, seq_kv=8, head_dim=8, causal=True, impl="flash")
        )
    assert "kv_heads=4 does not divide heads=6" in str(err.value)
    assert "seq_q=16 <= seq_kv=8" in str(err.value)
    with pytest.raises(OpcastError, match="impl='xformers' is not one of flash, sdpa, eager"):
        _attn(impl="xformers")


def test_norms_softmax_by_hand():
    ln, rms, sm = get_op("layernorm"), get_op("rmsnorm"), get_op("softmax")
    p = {"rows": 10, "cols": 100}
    assert ln.bytes_moved(p, 2) == 2 * (2 * 1000 + 200) + 80
    assert rms.bytes_moved(p, 2) == 2 * (2 * 1000 + 100) + 40
    assert sm.bytes_moved(p, 4) == 4 * 2 * 1000
    assert sm.bytes_moved(p, 4, "bwd") == 4 * 3 * 1000
    assert ln.flops(p) == 8000 and rms.flops(p) == 4000 and sm.flops(p) == 5000


def test_elementwise_by_hand():
    ew = get_op("elementwise")
    add = ew.validate({"numel": 1000, "fn": "add"})
    assert ew.bytes_moved(add, 2) == 1000 * 2 * 3  # two inputs, one output
    assert ew.directions(add) == ("fwd",)  # add's gradient is the identity: no kernel
    gelu = ew.validate({"numel": 1000, "fn": "gelu"})
    assert ew.bytes_moved(gelu, 4) == 1000 * 4 * 2
    assert ew.bytes_moved(gelu, 4, "bwd") == 1000 * 4 * 3
    drop = ew.validate({"numel": 1000, "fn": "dropout"})
    assert ew.bytes_moved(drop, 2) == 1000 * (2 * 2 + 1)  # x, y and a 1-byte mask
    with pytest.raises(OpcastError, match="direction 'bwd' not available"):
        ew.validate({"numel": 10, "fn": "add"}, direction="bwd")
    assert {"gelu", "silu", "add", "mul", "dropout"} <= set(ELEMENTWISE_FNS)


def test_model_level_ops_by_hand():
    emb = get_op("embedding").validate({"tokens": 8, "vocab": 100, "hidden": 4})
    assert get_op("embedding").bytes_moved(emb, 2) == 8 * 8 + 2 * 2 * 8 * 4
    ce = get_op("cross_entropy").validate({"tokens": 8, "vocab": 100})
    assert get_op("cross_entropy").flops(ce) == 4 * 800
    rope = get_op("rope").validate({"tokens": 8, "heads": 3, "head_dim": 4})
    assert get_op("rope").flops(rope) == 3 * 8 * 3 * 4
    adam = get_op("optimizer").validate({"numel": 1000})
    assert get_op("optimizer").bytes_moved(adam, 4) == 7 * 4 * 1000
    assert get_op("optimizer").directions() == ("fwd",)
    with pytest.raises(OpcastError, match="no backward"):
        get_op("optimizer").flops(adam, "bwd")


def test_collectives_follow_nccl_tests_factors():
    ar = get_op("all_reduce")
    p = ar.validate({"bytes": 1 << 20, "world_size": 8, "nodes": 1, "gpus_per_node": 8})
    assert ar.bytes_moved(p, 2) == 2 * 7 / 8 * (1 << 20)
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("send_recv", 2) == 1.0 and bus_factor("broadcast", 16) == 1.0
    assert ar.flops(p, dtype_bytes=2) == 7 / 8 * (1 << 19)
    assert get_op("all_gather").flops(p) == 0.0
    assert set(BUS_FACTORS) == {OpKind(k) for k in op_kinds(collective=True)}


def test_collective_topology_must_add_up():
    with pytest.raises(OpcastError, match=r"world_size=8 != nodes=2 x gpus_per_node=8"):
        get_op("all_reduce").validate({"bytes": 10, "world_size": 8, "nodes": 2, "gpus_per_node": 8})


def test_whole_number_reads_decimal_digits_only():
    assert whole_number(" 16 ") == 16 and whole_number("0") == 0 and whole_number("0" * 30 + "7") == 7
    assert whole_number(str(2**63 - 1)) == 2**63 - 1
    # more digits than int64 has: the limit, for the caller's 'too large' (int() refused past 4,300 digits)
    assert whole_number("1" * 5000) == INT_PARAM_LIMIT and whole_number("9" * 21) == INT_PARAM_LIMIT
    # str.isdigit passed these, then int() raised ValueError: an internal error, exit 1
    for text in ("\u00b2", "1\u00b2", "", " ", "-1", "+1", "1.0", "1e3", "0x10", "1_000"):
        assert whole_number(text) is None, text


def test_validation_coerces_and_rejects():
    g = get_op("gemm")
    assert g.validate({"b": 1.0, "m": "64", "n": 64, "k": 64}) == {"b": 1, "m": 64, "n": 64, "k": 64, "impl": "cublas"}
    with pytest.raises(OpcastError) as err:
        g.validate({"b": 1, "m": 0, "n": 2.5, "q": 1})
    msg = str(err.value)
    assert (
        "m=0 must be >= 1" in msg
        and "n=2.5 is not an integer" in msg
        and "missing parameter k" in msg
        and "unknown parameter(s) q" in msg
    )
    assert "\n" not in msg
    with pytest.raises(OpcastError, match="unknown op 'conv2d'"):
        get_op("conv2d")


def test_a_gemm_without_a_batch_is_one_matrix_product():
    # b=1 is the plain linear layer the kind's doc names; m, n and k stay required
    g = get_op("gemm")
    assert g.validate({"m": 64, "n": 32, "k": 16}) == {"b": 1, "m": 64, "n": 32, "k": 16, "impl": "cublas"}
    assert g.validate({"b": float("nan"), "m": 64, "n": 32, "k": 16})["b"] == 1
    with pytest.raises(OpcastError, match="missing parameter k") as err:
        g.validate({"m": 64, "n": 32})
    assert "parameter b" not in str(err.value)


def test_integer_parameters_are_read_exactly():
    # digits went through float: 2**63 - 1 read as 2**63 and was refused, 2**53 + 1 lost its last unit
    g = get_op("gemm")
    base = {"b": 1, "n": 64, "k": 64}
    assert g.validate({**base, "m": str(2**63 - 1)})["m"] == 2**63 - 1
    assert g.validate({**base, "m": str(2**53 + 1)})["m"] == 2**53 + 1
    assert g.validate({**base, "m": " +64 "})["m"] == 64
    assert g.validate({**base, "m": "1e3"})["m"] == 1000 and g.validate({**base, "m": "64.0"})["m"] == 64
    with pytest.raises(OpcastError, match=r"m='9223372036854775808' is too large"):
        g.validate({**base, "m": str(2**63)})
    with pytest.raises(OpcastError, match=r"m=-5 must be >= 1"):
        g.validate({**base, "m": "-5"})
    for text in ("- 5", "64.5", "x", "True"):
        with pytest.raises(OpcastError, match="is not an integer"):
            g.validate({**base, "m": text})
    with pytest.raises(OpcastError, match="is not an integer"):
        g.validate({**base, "m": True})


def test_optional_parameters_take_their_default_and_still_validate():
    spec = get_op("rope")
    assert spec.validate({"tokens": 8, "heads": 3, "head_dim": 4})["impl"] == "unfused"
    fused = spec.validate({"tokens": 8, "heads": 3, "head_dim": 4, "impl": "fused"})
    unfused = spec.validate({"tokens": 8, "heads": 3, "head_dim": 4})
    x, table = 8 * 3 * 4, 2 * 8 * 4
    assert spec.bytes_moved(fused, 2) == 2 * (2 * x + table) and spec.bytes_moved(unfused, 2) == 2 * (10 * x + table)
    with pytest.raises(OpcastError, match="impl"):
        spec.validate({"tokens": 8, "heads": 3, "head_dim": 4, "impl": "triton"})


def test_moe_is_one_ranks_fused_layer_under_balanced_routing():
    spec = get_op("moe")
    p = spec.validate({"tokens": 4, "hidden": 1024, "inter": 512, "experts": 64, "topk": 8, "ep": 4})
    assert (p["gated"], p["fn"]) == (True, "silu")  # SwiGLU experts unless told
    # 4 tokens x top 8 over 4 ranks: 8 pairs on this rank's 16 experts, one row each
    assert moe_balanced_experts(p) == (8, 1)
    width = 3 * 1024 * 512  # gate + up and down
    assert spec.flops(p) == 2.0 * 8 * width
    assert spec.bytes_moved(p, 2) == 2 * (8 * width + 2 * 4 * 1024)
    # 512 tokens: every local expert busy, 512 x 8 / 4 / 16 = 64 rows each; non-gated: two weights, not three
    big = spec.validate({**p, "tokens": 512, "gated": False, "fn": "relu"})
    assert moe_balanced_experts(big) == (16, 64)
    assert spec.flops(big) == 2.0 * 16 * 64 * 2 * 1024 * 512
    assert uses_tensor_cores("moe", "bf16") and not get_op("moe").benchmarked
    assert "moe" not in op_kinds(benchmarked=True) and "gemm" in op_kinds(benchmarked=True)


def test_moe_refuses_uneven_expert_parallelism_and_too_many_picks():
    with pytest.raises(OpcastError, match="ep=3 does not divide experts=64"):
        get_op("moe").validate({"tokens": 4, "hidden": 64, "inter": 64, "experts": 64, "topk": 8, "ep": 3})
    with pytest.raises(OpcastError, match="topk=9 exceeds experts=8"):
        get_op("moe").validate({"tokens": 4, "hidden": 64, "inter": 64, "experts": 8, "topk": 9})
