"""The op graph: same shapes as archs.layer_ops, backward and recompute, CP and MoE splits."""

from __future__ import annotations

import pytest

from opcast.archs import layer_ops, load_arch, model_ops
from opcast.predict.cost import decompose, kernel
from opcast.predict.graph import (
    BWD,
    FWD,
    RECOMPUTE,
    backward_ops,
    block_comms,
    block_ops,
    embedding_ops,
    graph_flops,
    head_ops,
    precision_of,
    train_block,
)

BF16 = precision_of("bf16")


@pytest.mark.parametrize("name", ["gpt3-1.3b", "llama2-7b", "gpt-neox-20b", "llama3-8b", "megatron-22b"])
@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (4, True)])
def test_forward_equals_the_ops_collect_benchmarks(name, tp, sp):
    arch = load_arch(name)
    mine = block_ops(arch, tp=tp, batch=2, seq_q=512, seq_kv=512, sp=sp)
    assert [(k, p) for _, k, p, c in mine] == [(k, p) for k, p in layer_ops(arch, tp=tp, batch=2, seq=512, sp=sp)]
    tokens, rows = 2 * 512, 2 * 512 // (tp if sp else 1)
    model = embedding_ops(arch, tp=tp, tokens=tokens, rows=rows) + head_ops(arch, tp=tp, tokens=tokens, rows=rows)
    assert [(k, p) for _, k, p, c in model] == [(k, p) for k, p in model_ops(arch, tp=tp, batch=2, seq=512, sp=sp)]


def test_moe_with_ep1_equals_layer_ops_plus_permutation():
    arch = load_arch("mixtral-8x7b")
    mine = [
        (k, p)
        for r, k, p, c in block_ops(arch, tp=2, batch=1, seq_q=256, seq_kv=256, sp=False)
        if r not in ("permute", "unpermute")
    ]
    assert mine == [(k, p) for k, p in layer_ops(arch, tp=2, batch=1, seq=256)]


def test_expert_parallelism_keeps_the_expert_flops_per_rank():
    arch = load_arch("mixtral-8x7b")

    def expert_flops(ep):
        ops = block_ops(arch, tp=1, batch=1, seq_q=1024, seq_kv=1024, sp=False, ep=ep)
        ups = [p for r, k, p, c in ops if r == "mlp_up"]
        return ups[0]["b"], 2 * ups[0]["b"] * ups[0]["m"] * ups[0]["n"] * ups[0]["k"]

    (b1, f1), (b4, f4) = expert_flops(1), expert_flops(4)
    assert (b1, b4) == (8, 2) and f1 == f4
    assert any(
        c.kind == "all_to_all"
        for c in block_comms(arch, tp=1, batch=1, seq_q=1024, sp=False, cp=1, ep=4, dtype="bf16")[FWD]
    )


def test_backward_gemms_are_dgrad_and_wgrad_with_twice_the_flops():
    ops = [("qkv", "gemm", {"b": 1, "m": 4096, "n": 3072, "k": 1024}, 1)]
    bwd = backward_ops(ops)
    assert [(r, p) for r, _, p, _, _ in bwd] == [
        ("qkv.dgrad", {"b": 1, "m": 4096, "n": 1024, "k": 3072}),
        ("qkv.wgrad", {"b": 1, "m": 1024, "n": 3072, "k": 4096}),
    ]
    identity = backward_ops([("residual_add", "elementwise", {"numel": 10, "fn": "add"}, 1)])
    assert identity == []


def test_block_backward_is_about_twice_the_forward_and_recompute_modes():
    arch = load_arch("llama2-7b")
    g = train_block(arch, tp=1, batch=1, seq=2048, sp=False, cp=1, ep=1, attention="flash", recompute="none", prec=BF16)
    fwd, bwd = graph_flops(g, (FWD,)), graph_flops(g, (BWD,))
    assert 2.0 <= bwd / fwd <= 2.1  # GEMMs exactly 2x, flash attention 2.5x
    assert g.nodes[RECOMPUTE] == ()
    full = train_block(
        arch, tp=1, batch=1, seq=2048, sp=False, cp=1, ep=1, attention="flash", recompute="full", prec=BF16
    )
    assert graph_flops(full, (RECOMPUTE,)) == fwd
    sel = train_block(
        arch, tp=1, batch=1, seq=2048, sp=False, cp=1, ep=1, attention="flash", recompute="selective", prec=BF16
    )
    assert [n.role for n in sel.nodes[RECOMPUTE]] == ["attn"]


def test_context_parallel_attention_is_balanced_and_exact():
    # Load-balanced causal split: every rank does 1/cp of the causal pairs, and together they do all.
    arch = load_arch("llama2-7b")
    s, cp = 4096, 4
    full = block_ops(arch, tp=1, batch=1, seq_q=s, seq_kv=s, sp=False)
    per_rank = block_ops(arch, tp=1, batch=1, seq_q=s // cp, seq_kv=s // cp, sp=False, cp=cp)

    def attn_pairs(ops):
        total = 0
        for _role, kind, p, count in ops:
            if kind == "attention":
                sq, skv = p["seq_q"], p["seq_kv"]
                total += count * (sq * (skv - sq) + sq * (sq + 1) / 2 if p["causal"] else sq * skv)
        return total

    assert cp * attn_pairs(per_rank) == attn_pairs(full)
    comms = block_comms(arch, tp=1, batch=1, seq_q=s // cp, sp=False, cp=cp, ep=1, dtype="bf16")
    assert [c.kind for c in comms[FWD]] == ["send_recv"] and comms[FWD][0].count == cp - 1


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter():
    arch = load_arch("gpt3-1.3b")
    plain = block_comms(arch, tp=4, batch=1, seq_q=2048, sp=False, cp=1, ep=1, dtype="bf16")
    sp = block_comms(arch, tp=4, batch=1, seq_q=2048, sp=True, cp=1, ep=1, dtype="bf16")
    assert [(c.kind, c.count) for c in plain[FWD]] == [("all_reduce", 2)]
    assert sorted((c.kind, c.count) for c in sp[FWD]) == [("all_gather", 2), ("reduce_scatter", 2)]
    assert all(c.bytes == 2048 * arch.hidden * 2 for c in sp[FWD])


def test_fp8_runs_gemms_in_fp8_and_the_rest_in_bf16():
    prec = precision_of("fp8")
    arch = load_arch("llama2-7b")
    g = train_block(arch, tp=1, batch=1, seq=512, sp=False, cp=1, ep=1, attention="flash", recompute="none", prec=prec)
    dtypes = {n.kernel.kind: n.kernel.dtype for n in g.nodes[FWD]}
    assert dtypes["gemm"] == "fp8" and dtypes["attention"] == "bf16" and dtypes["rmsnorm"] == "bf16"


def test_a_tied_embedding_sums_its_two_weight_gradients_only_on_a_single_stage():
    from opcast.archs import padded_vocab
    from opcast.predict.graph import train_extras

    def tied_adds(arch, tp, first, last):
        g = train_extras(arch, tp=tp, batch=1, seq=512, sp=False, cp=1, first=first, last=last, prec=BF16)
        return [n.kernel.param_dict for n in g.nodes[BWD] if n.role == "embedding.tied_grad"]

    gpt = load_arch("gpt3-125m")  # tied
    assert gpt.tied_embeddings
    assert tied_adds(gpt, 2, True, True) == [{"numel": padded_vocab(gpt.vocab, 2) // 2 * gpt.hidden, "fn": "add"}]
    assert tied_adds(gpt, 1, True, False) == [] and tied_adds(gpt, 1, False, True) == []  # pp > 1: two copies
    assert tied_adds(load_arch("llama2-7b"), 1, True, True) == []  # untied


def test_a_parallel_residual_trained_by_neox_all_reduces_once_forward():
    # x + attn(ln1(x)) + mlp(ln2(x)): GPT-NeoX sums both row-parallel outputs before one all-reduce;
    # the backward still reduces both column-parallel inputs; inference engines reduce each output
    neox, llama = load_arch("gpt-neox-20b"), load_arch("llama2-7b")
    assert neox.parallel_residual and not llama.parallel_residual

    def counts(arch, training):
        got = block_comms(arch, tp=4, batch=1, seq_q=2048, sp=False, cp=1, ep=1, dtype="fp16", training=training)
        return [(c.kind, c.count) for c in got[FWD]], [(c.kind, c.count) for c in got[BWD]]

    assert counts(neox, True) == ([("all_reduce", 1)], [("all_reduce", 2)])
    assert counts(neox, False)[0] == [("all_reduce", 2)]
    assert counts(llama, True) == ([("all_reduce", 2)], [("all_reduce", 2)])


def test_qwen3_forward_equals_the_ops_collect_benchmarks_and_moe_decode_reads_busy_experts():
    arch = load_arch("qwen3-30b-a3b")
    mine = [
        (k, p)
        for r, k, p, c in block_ops(arch, tp=2, batch=1, seq_q=256, seq_kv=256, sp=False)
        if r not in ("permute", "unpermute")
    ]
    assert mine == [(k, p) for k, p in layer_ops(arch, tp=2, batch=1, seq=256)]
    # a decode step of 4 sequences: one fused MoE layer; as grouped GEMMs (no learned model of it), 32 assignments
    # reach 128 (1 - (120/128)^4) = 29.1 -> 30 of 128 experts
    decode = block_ops(arch, tp=1, batch=4, seq_q=1, seq_kv=512, sp=False, training=False)
    ((experts, count),) = [(p, c) for r, k, p, c in decode if k == "moe"]
    assert count == 1 and not any(r in ("mlp_up", "permute") for r, *_ in decode)
    parts = [p for p, _ in decompose(kernel("moe", experts, "bf16"))]
    up = next(p.param_dict for p in parts if p.kind == "gemm")
    assert (up["b"], up["m"]) == (30, 2)
    # training lists the same kernels itself (under a framework that runs SwiGLU as one kernel, as the fused layer)
    roles = ("permute", "mlp_up", "act", "gate_mul", "mlp_down", "unpermute")
    ops = block_ops(arch, tp=1, batch=4, seq_q=1, seq_kv=512, sp=False, framework="megatron")
    train = [(k, kernel(k, p, "bf16").param_dict) for r, k, p, c in ops if r in roles]  # with the defaults filled
    assert [(p.kind, p.param_dict) for p in parts] == train


def test_a_shared_expert_runs_in_fp8_beside_the_routed_ones():
    import dataclasses

    from opcast.predict.graph import fp8_gemms

    arch = dataclasses.replace(load_arch("mixtral-8x7b"), shared_expert_ffn=4096)
    prec = precision_of("fp8")
    g = train_block(arch, tp=2, batch=1, seq=256, sp=True, cp=1, ep=2, attention="flash", recompute="none", prec=prec)
    fwd = {n.role: n for n in g.nodes[FWD]}
    assert fwd["shared_up"].kernel.dtype == "fp8" and fwd["shared_down"].kernel.dtype == "fp8"
    assert dict(fwd["shared_up"].kernel.params)["n"] == 2 * 4096 // 2  # gate + up, split over tp
    assert fp8_gemms(arch, ep=2) == fp8_gemms(load_arch("mixtral-8x7b"), ep=2) + 2
