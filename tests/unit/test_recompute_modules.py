"""Megatron-Core's selective recompute modules (``--recompute selective:MODULE[+MODULE...]``): the spelling,
what each module frees from a block's saved activations, and which forward kernels and collectives it runs
again in backward (:mod:`opcast.predict.recompute`)."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch, routed_experts
from opcast.hardware import get_device
from opcast.predict.graph import FWD, RECOMPUTE, Dtypes, train_block
from opcast.predict.memory import layer_activation_bytes
from opcast.predict.parallel import TrainConfig, validate_train
from opcast.predict.recompute import canonical_recompute, recompute_modules, recompute_problem, recompute_rank

BF16 = Dtypes(matrix="bf16", act="bf16")


@pytest.mark.parametrize(
    "value, mods",
    [
        ("none", set()),
        ("full", set()),
        ("selective", {"core_attn"}),
        ("selective:core_attn", {"core_attn"}),
        ("selective:mla_up_proj+moe_act", {"mla_up_proj", "moe_act"}),
    ],
)
def test_spellings_name_their_modules(value, mods):
    assert recompute_problem(value) is None
    assert recompute_modules(value) == mods


@pytest.mark.parametrize(
    "value, needle",
    [
        ("partial", "is not one of none, selective, full"),
        ("selective:", "names no module"),
        ("selective:mla_up_prj", "'mla_up_prj' is not a recompute module"),
        ("full:mlp", "only selective takes modules"),
        ("selective:mlp+mlp", "names a module twice"),
    ],
)
def test_bad_spellings_are_refused_with_the_fix(value, needle):
    problem = recompute_problem(value)
    assert problem is not None and needle in problem and "\n" not in problem


def test_a_training_config_refuses_an_unknown_module_among_its_reasons():
    arch = load_arch("gpt3-125m")
    h100 = get_device("H100-SXM")
    _, reasons = validate_train(arch, h100, TrainConfig(recompute="selective:attn"))
    assert any("'attn' is not a recompute module" in r for r in reasons)
    assert not validate_train(arch, h100, TrainConfig(recompute="selective:core_attn+mlp"))[1]


def _saved(arch, recompute, *, fp8=False, tp=1, sp=False, ep=1):
    return layer_activation_bytes(
        arch, tp=tp, sp=sp, batch=2, seq=4096, ep=ep, attention="flash", recompute=recompute, fp8=fp8
    )


def test_selective_is_core_attn():
    arch = load_arch("llama3-8b")
    assert _saved(arch, "selective") == _saved(arch, "selective:core_attn") < _saved(arch, "none")


def test_mla_up_proj_frees_the_per_head_q_k_v():
    arch = load_arch("deepseek-v3")
    tokens, b = 2 * 4096, 2
    qkv = b * tokens * (arch.n_heads + 2 * arch.n_kv_heads) * arch.head_dim  # 192-wide heads at tp 1
    assert _saved(arch, "none") - _saved(arch, "selective:mla_up_proj") == qkv
    # no MLA, nothing to free
    dense = load_arch("llama3-8b")
    assert _saved(dense, "selective:mla_up_proj") == _saved(dense, "none")


def test_moe_act_frees_the_down_projection_input_in_bf16_only():
    arch = load_arch("gpt-oss-120b")
    experts, rows = routed_experts(arch, tokens=2 * 4096, ep=8)
    down_in = 2 * experts * rows * arch.ffn_hidden
    assert _saved(arch, "none", ep=8) - _saved(arch, "selective:moe_act", ep=8) == down_in
    # in fp8 the grouped linear keeps its own fp8 copy of its input: nothing freed
    assert _saved(arch, "selective:moe_act", ep=8, fp8=True) == _saved(arch, "none", ep=8, fp8=True)


def test_layernorm_frees_the_separate_norms_outputs_only():
    moe = load_arch("gpt-oss-120b")  # the pre-MLP norm feeds the router: 2 B a token and hidden unit
    assert _saved(moe, "none") - _saved(moe, "selective:layernorm") == 2 * 2 * 4096 * moe.hidden
    dense = load_arch("llama3-8b")  # TE fuses both norms into the next linear: no module to discard
    assert _saved(dense, "selective:layernorm") == _saved(dense, "none")


def test_mlp_keeps_only_the_dense_mlp_input():
    arch = load_arch("llama3-8b")
    tokens = 2 * 4096
    mlp = 2 * tokens * arch.hidden + (2 * 2 * arch.ffn_hidden + 2 * arch.ffn_hidden) * tokens
    assert _saved(arch, "none") - _saved(arch, "selective:mlp") == mlp


def test_moe_keeps_only_the_moe_layer_input():
    arch = load_arch("deepseek-v3")
    tokens = 2 * 4096
    experts, rows = routed_experts(arch, tokens=tokens, ep=8)
    routed = experts * rows * (2 * arch.hidden + 2 * 2 * arch.ffn_hidden + 2 * arch.ffn_hidden)
    shared = (2 * 2 * arch.shared_expert_ffn + 2 * arch.shared_expert_ffn) * tokens
    probs = 4 * tokens * arch.n_experts
    assert _saved(arch, "none", ep=8) - _saved(arch, "selective:moe", ep=8) == routed + shared + probs
    assert _saved(arch, "none", ep=8) - _saved(arch, "selective:shared_experts", ep=8) == shared


def _recomputed(name, recompute, *, tp=1, sp=False, ep=1):
    g = train_block(
        load_arch(name), tp=tp, batch=1, seq=2048, sp=sp, cp=1, ep=ep, attention="flash", recompute=recompute, prec=BF16
    )
    return [n.role for n in g.nodes[RECOMPUTE]], g.comms[RECOMPUTE], g


def test_each_module_runs_its_own_kernels_again():
    assert _recomputed("deepseek-v3", "selective:mla_up_proj")[0] == ["q_up", "rope", "kv_up"]
    assert _recomputed("gpt-oss-120b", "selective:layernorm+moe_act")[0] == ["norm2", "act", "gate_mul"]
    assert _recomputed("llama3-8b", "selective:mlp")[0] == ["norm2", "mlp_up", "act", "gate_mul", "mlp_down"]
    assert _recomputed("llama3-8b", "selective")[0] == ["attn"]
    roles, _, g = _recomputed("deepseek-v3", "selective:moe")
    first = [n.role for n in g.nodes[FWD]].index("router")
    assert roles == [n.role for n in g.nodes[FWD]][first:-1]  # router to the shared expert's add


def test_normal_checkpointing_repeats_the_mlp_sides_collectives():
    _, comms, g = _recomputed("llama3-8b", "selective:mlp", tp=4, sp=True)
    assert [(c.kind, c.count) for c in comms] == [("all_gather", 1), ("reduce_scatter", 1)]
    assert {c.bytes for c in comms} == {c.bytes for c in g.comms[FWD] if c.role == "tp"}
    _, comms, _ = _recomputed("llama3-8b", "selective:mlp", tp=4)
    assert [(c.kind, c.count) for c in comms] == [("all_reduce", 1)]
    _, comms, g = _recomputed("deepseek-v3", "selective:moe", ep=8)
    assert [c for c in comms if c.role == "ep"] == [c for c in g.comms[FWD] if c.role == "ep"]
    # output-discarding modules communicate nothing
    assert _recomputed("deepseek-v3", "selective:mla_up_proj+moe_act+layernorm", tp=2, sp=True, ep=8)[1] == ()


def test_one_spelling_and_rank_of_a_recompute_choice():
    assert canonical_recompute("selective:mlp+core_attn+layernorm") == "selective:core_attn+layernorm+mlp"
    assert canonical_recompute("selective:core_attn") == canonical_recompute("selective") == "selective"
    assert canonical_recompute("none") == "none" and canonical_recompute("full") == "full"
    assert [recompute_rank(v) for v in ("none", "selective", "selective:moe", "full")] == [0, 1, 1, 2]
