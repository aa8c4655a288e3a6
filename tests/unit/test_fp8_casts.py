"""fp8 training prices Transformer Engine's quantisation kernels (predict/graph.py fp8_quantisation):
which kernels, their bytes, in forward and backward, none in bf16, and their time in the prediction."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import opcast.predict.graph as graph
from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.graph import BWD, FWD, RECOMPUTE, fp8_quantisation, precision_of, train_block, train_extras
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train

M, N, K = 64, 32, 48  # one linear C[m, n] = A[m, k] @ W[k, n]
P = {"b": 1, "m": M, "n": N, "k": K}


def _bytes(ops):
    """(role suffix, bytes moved) of cast ops, with the registry's formula for the bf16 kernel they are priced as."""
    prec = precision_of("fp8")
    return [(role.split(".", 1)[1], prec.of(kind, p).bytes_moved()) for role, kind, p, _ in ops]


def test_a_plain_te_linear_casts_input_and_weight_forward_and_its_output_gradient_backward():
    # te.Linear, no sequence parallelism, is_first_microbatch None (llm-foundry): fp8_cast_transpose_fused
    # of A (2 bytes read + 1 + 1 written per element) and of W in forward, of dC in backward; the
    # wgrad finds A^T from the forward.
    fwd, dgrad, wgrad = fp8_quantisation("proj", P, modules="linear", tp=1, sp=False, grouped=False)
    assert _bytes(fwd) == [("fp8_cast_transpose_input", 4 * M * K), ("fp8_cast_transpose_weight", 4 * K * N)]
    assert _bytes(dgrad) == [("fp8_cast_transpose_grad", 4 * M * N)]
    assert wgrad == []
    assert fwd[0][2] == {"numel": M * K, "fn": "mul_scalar"}  # a bf16 x*scale moving the same bytes


def test_megatron_layernorm_linear_and_sequence_parallel_row_linear():
    tp = 4
    # QKV as LayerNormLinear: the norm writes fp8, no forward cast; the weight is cast once per
    # iteration (not per micro-batch); backward casts+transposes dC and transposes the gathered A.
    fwd, dgrad, wgrad = fp8_quantisation("qkv", P, modules="megatron", tp=tp, sp=True, grouped=False)
    assert fwd == []
    assert _bytes(dgrad) == [("fp8_cast_transpose_grad", 4 * M * N)]
    assert _bytes(wgrad) == [("fp8_transpose_input", 2 * M * K)]
    # Row-parallel out-proj with SP: cast A (3 bytes an element), transpose it before the wgrad; dC
    # arrives as m/tp local rows, is cast (3), all-gathered in fp8 and transposed (2).
    fwd, dgrad, wgrad = fp8_quantisation("proj", P, modules="megatron", tp=tp, sp=True, grouped=False)
    assert _bytes(fwd) == [("fp8_cast_input", 3 * M * K)]
    assert _bytes(dgrad) == [("fp8_cast_grad", 3 * (M // tp) * N), ("fp8_transpose_grad", 2 * M * N)]
    assert _bytes(wgrad) == [("fp8_transpose_input", 2 * M * K)]
    # A column-parallel te.Linear with SP casts only its local m/tp rows before the all-gather.
    fwd, _, _ = fp8_quantisation("mlp_up", P, modules="linear", tp=tp, sp=True, grouped=False)
    assert _bytes(fwd)[0] == ("fp8_cast_input", 3 * (M // tp) * K)


def test_the_graph_places_the_casts_before_their_gemms_in_every_phase():
    arch = load_arch("gpt3-125m")
    prec = precision_of("fp8", framework="hf")
    g = train_block(arch, tp=1, batch=1, seq=128, sp=False, cp=1, ep=1, attention="flash", recompute="full", prec=prec)
    fwd = [n.role for n in g.nodes[FWD]]
    dense = ["qkv", "proj", "mlp_up", "mlp_down"]  # a standard-attention dense block's fp8 linears
    assert set(dense) <= set(graph.FP8_LINEARS)
    for role in dense:
        i = fwd.index(role)
        assert fwd[i - 2 : i] == [f"{role}.fp8_cast_transpose_input", f"{role}.fp8_cast_transpose_weight"]
    bwd = [n.role for n in g.nodes[BWD]]
    for role in dense:
        assert bwd[bwd.index(f"{role}.dgrad") - 1] == f"{role}.fp8_cast_transpose_grad"
    assert g.nodes[RECOMPUTE] == g.nodes[FWD]  # a full recomputation re-runs the casts
    # qkv's dC is m x 3h: its cast+transpose moves 4 bytes an element of it
    qkv_grad = next(n for n in g.nodes[BWD] if n.role == "qkv.fp8_cast_transpose_grad")
    assert qkv_grad.kernel.bytes_moved() == 4 * 128 * 3 * arch.hidden
    assert {n.kernel.dtype for n in g.nodes[FWD] if ".fp8_" in n.role} == {"bf16"}


def test_bf16_has_no_casts_and_only_the_block_linears_run_in_fp8():
    arch = load_arch("llama2-7b")
    kw = dict(tp=2, batch=1, seq=256, sp=True, cp=1)
    bf16 = train_block(arch, **kw, ep=1, attention="flash", recompute="none", prec=precision_of("bf16"))
    fp8 = train_block(arch, **kw, ep=1, attention="flash", recompute="none", prec=precision_of("fp8"))
    assert not any(".fp8_" in n.role for ph in (FWD, BWD, RECOMPUTE) for n in bf16.nodes[ph])
    assert any(".fp8_" in n.role for n in fp8.nodes[BWD])
    # the uncast nodes are the bf16 graph's, GEMMs aside
    assert [n.role for n in fp8.nodes[FWD] if ".fp8_" not in n.role] == [n.role for n in bf16.nodes[FWD]]
    head = train_extras(arch, **kw, first=True, last=True, prec=precision_of("fp8"))
    assert {n.kernel.dtype for ph in (FWD, BWD) for n in head.nodes[ph] if n.kernel.kind == "gemm"} == {"bf16"}
    assert not any(".fp8_" in n.role for ph in (FWD, BWD) for n in head.nodes[ph])


def test_moe_expert_linears_cast_every_expert_without_sequence_parallelism():
    arch = load_arch("mixtral-8x7b")
    g = train_block(
        arch, tp=2, batch=1, seq=256, sp=True, cp=1, ep=2, attention="flash", recompute="none", prec=precision_of("fp8")
    )
    up = next(n for n in g.nodes[FWD] if n.role == "mlp_up")
    cast = next(n for n in g.nodes[FWD] if n.role == "mlp_up.fp8_cast_transpose_input")
    p = up.kernel.param_dict
    assert cast.kernel.bytes_moved() == 4 * p["b"] * p["m"] * p["k"]
    assert next(n for n in g.nodes[FWD] if n.role == "router").kernel.dtype == "bf16"


def _predict(monkeypatch, with_casts: bool):
    if not with_casts:
        monkeypatch.setattr(graph, "fp8_casts", lambda ops, prec, *, tp, sp: {})
    graph.train_block.cache_clear()
    graph._block_passes.cache_clear()
    cfg = TrainConfig(precision="fp8", micro_batch=2, global_batch=4, seq=1024, framework="hf")
    try:
        return predict_train(load_arch("gpt3-125m"), get_device("H100-SXM"), cfg, kernels=load_kernel_cost())
    finally:
        graph.train_block.cache_clear()
        graph._block_passes.cache_clear()


def test_fp8_on_h100_is_slower_than_before_by_exactly_the_priced_casts(monkeypatch):
    after = _predict(monkeypatch, with_casts=True)
    casts = [o for o in after.ops if ".fp8_" in o.role]
    assert casts and all(o.source.startswith("learned") for o in casts)
    cast_s = sum(o.count * o.time_s for o in casts)
    before = _predict(monkeypatch, with_casts=False)
    assert not any(".fp8_" in o.role for o in before.ops)
    assert cast_s > 0.01 * before.iteration_time_s  # not a rounding: several percent of the step
    assert after.iteration_time_s - before.iteration_time_s == pytest.approx(cast_s, rel=1e-9)


def test_the_console_script_lists_the_cast_kernels_for_fp8_only():
    def roles(precision):
        cmd = [sys.executable, "-m", "opcast", "predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM"]
        cmd += ["--seq", "512", "--precision", precision, "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return {o["role"] for o in json.loads(done.stdout)["ops"]}

    fp8 = roles("fp8")
    assert {"qkv.fp8_cast_transpose_grad", "qkv.fp8_transpose_input", "proj.fp8_cast_transpose_input"} <= fp8
    assert not any(".fp8_" in r for r in roles("bf16"))
