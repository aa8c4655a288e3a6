"""``--framework hf``: the op graph prices transformers' eager modules as they run (issue 19).

gelu_new as its eight torch kernels (and autograd's eleven backward), the head split/merge copies
and the attention-probability dropout of GPT-2 / OPT eager attention; a relu model keeps one
activation kernel; nothing moves without ``framework="hf"``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcast.archs import arch_from_dict, arch_from_hf_config, load_arch
from opcast.errors import OpcastError
from opcast.predict.graph import BWD, FWD, block_ops, precision_of, train_block

GPT2_HF = {
    "model_type": "gpt2",
    "n_embd": 256,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 512,
    "vocab_size": 1000,
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "resid_pdrop": 0.1,
}
OPT_HF = {
    "model_type": "opt",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_dim": 1024,
    "max_position_embeddings": 512,
    "vocab_size": 1000,
    "activation_function": "relu",
    "attention_dropout": 0.0,
    "dropout": 0.1,
}
B, S = 2, 128
TOKENS = B * S
GELU_NEW_FNS = ["mul_scalar", "pow_scalar", "mul_scalar", "add", "mul_scalar", "tanh", "add_scalar", "mul"]


def _ops(cfg: dict, *, framework: str | None = "hf", training: bool = False, attention: str = "eager"):
    arch = arch_from_hf_config(cfg, "m")
    return block_ops(
        arch, tp=1, batch=B, seq_q=S, seq_kv=S, sp=False, attention=attention, training=training, framework=framework
    )


def test_hf_config_records_the_transformers_activation_name() -> None:
    assert arch_from_hf_config(GPT2_HF, "m").hf_activation == "gelu_new"
    assert arch_from_hf_config({**GPT2_HF, "activation_function": None}, "m").hf_activation == "gelu_new"  # default
    assert arch_from_hf_config(OPT_HF, "m").hf_activation == "relu"
    assert arch_from_hf_config(GPT2_HF, "m").activation == "gelu"
    assert load_arch("gpt3-1.3b").hf_activation is None  # presets: none


def test_hf_activation_must_agree_with_activation() -> None:
    good = {**json.loads(json.dumps(_preset("gpt3-1.3b"))), "hf_activation": "gelu_new"}
    assert arch_from_dict(good, "x.json").hf_activation == "gelu_new"
    with pytest.raises(OpcastError, match="hf_activation=gelu_new computes gelu, not activation=relu"):
        arch_from_dict({**good, "activation": "relu"}, "x.json")
    with pytest.raises(OpcastError, match="hf_activation='swiglu' is not one of"):
        arch_from_dict({**good, "hf_activation": "swiglu"}, "x.json")


def _preset(name: str) -> dict:
    from dataclasses import asdict

    return asdict(load_arch(name))


def test_gelu_new_under_hf_is_its_eight_eager_kernels() -> None:
    ops = _ops(GPT2_HF)
    act = [(r, p["fn"], p["numel"], c) for r, k, p, c in ops if r.startswith("act")]
    assert [fn for _, fn, _, _ in act] == GELU_NEW_FNS
    assert {(n, c) for _, _, n, c in act} == {(TOKENS * 1024, 1)}
    assert "act" not in [r for r, *_ in ops]
    # between the two MLP GEMMs
    roles = [r for r, *_ in ops]
    assert roles.index("mlp_up") < roles.index("act.half_x") < roles.index("act.mul") < roles.index("mlp_down")


def test_gelu_new_bytes_are_ten_reads_and_eight_writes() -> None:
    """Hand count, fp32: binary ops (x + ., w * v) read two tensors, the rest one; each writes one."""
    prec = precision_of("fp32", framework="hf")
    numel = TOKENS * 1024
    moved = sum(prec.of(k, p).bytes_moved() * c for r, k, p, c in _ops(GPT2_HF) if r.startswith("act"))
    assert moved == (10 + 8) * 4 * numel
    one = [(k, p) for r, k, p, _ in _ops(GPT2_HF, framework=None) if r == "act"]
    assert prec.of(*one[0]).bytes_moved() == 2 * 4 * numel  # the fused GELU it replaces


def test_other_frameworks_keep_the_fused_activation_and_cache_write() -> None:
    for fw in (None, "megatron", "neox", "foundry"):
        ops = _ops(GPT2_HF, framework=fw)
        roles = [r for r, *_ in ops]
        assert [p["fn"] for r, k, p, c in ops if r == "act"] == ["gelu"]
        assert "kv_write" in roles and not any(r.startswith("attn.") for r in roles)


def test_relu_model_keeps_one_activation_kernel_under_hf() -> None:
    ops = _ops(OPT_HF)
    assert [(r, p["fn"]) for r, k, p, c in ops if r.startswith("act")] == [("act", "relu")]


@pytest.mark.parametrize("cfg", [GPT2_HF, OPT_HF])
def test_hf_eager_attention_copies_heads_in_and_out(cfg: dict) -> None:
    ops = _ops(cfg)
    by_role = {r: (p, c) for r, k, p, c in ops if k == "elementwise" and r.startswith("attn.")}
    qkv = TOKENS * 256
    assert by_role["attn.split_q"] == ({"numel": qkv, "fn": "copy"}, 1)
    assert by_role["attn.split_kv"] == ({"numel": qkv, "fn": "copy"}, 2)
    assert by_role["attn.merge_heads"] == ({"numel": qkv, "fn": "copy"}, 1)
    assert ("attn.q_scale" in by_role) == (cfg is OPT_HF)  # OPT scales q, GPT-2 the scores
    roles = [r for r, *_ in ops]
    assert roles.index("attn.split_kv") < roles.index("attn") < roles.index("attn.merge_heads") < roles.index("proj")
    assert "kv_write" not in roles  # the cache holds these tensors
    # flash attention: no eager modeling code around it
    assert not any(r.startswith("attn.") for r, *_ in _ops(cfg, attention="flash"))


def test_attention_probability_dropout_follows_the_arch() -> None:
    probs = B * 4 * S * S
    gpt2 = {r: p for r, k, p, c in _ops(GPT2_HF, training=True)}
    assert gpt2["attn.probs_dropout"] == {"numel": probs, "fn": "dropout"}
    assert "attn.probs_dropout" not in {r for r, *_ in _ops(GPT2_HF, training=False)}  # eval
    assert "attn.probs_dropout" not in {r for r, *_ in _ops(OPT_HF, training=True)}  # attention_dropout 0.0


def _block(cfg: dict, framework: str | None):
    arch = arch_from_hf_config(cfg, "m")
    return train_block(
        arch,
        tp=1,
        batch=B,
        seq=S,
        sp=False,
        cp=1,
        ep=1,
        attention="eager",
        recompute="none",
        prec=precision_of("fp32", framework=framework),
    )


def test_gelu_new_backward_is_autograds_eleven_kernels() -> None:
    g = _block(GPT2_HF, "hf")
    bwd = [n for n in g.nodes[BWD] if n.role.startswith("act.")]
    fns = sorted((n.kernel.param_dict["fn"], n.kernel.direction) for n in bwd)
    assert fns == sorted(
        [("mul_scalar", "fwd")] * 4  # 0.5 x, 0.044715 p, sqrt(2/pi) r, and 3 * x^2 of pow's backward
        + [("pow_scalar", "fwd"), ("mul", "fwd")]  # x.pow(2), grad * (3 x^2)
        + [("add", "fwd")] * 2  # x's three gradients summed
        + [("tanh", "bwd")]  # tanh_backward
        + [("mul", "fwd")] * 2  # w * v: grad * v, grad * w
    )
    # the copies' gradients are copied back; the dropout has its registry backward
    roles = {n.role for n in g.nodes[BWD]}
    assert {"attn.split_q.bwd0", "attn.split_kv.bwd0", "attn.merge_heads.bwd0", "attn.probs_dropout.bwd"} <= roles
    default = _block(GPT2_HF, None)
    assert [n.role for n in default.nodes[BWD] if n.role.startswith("act")] == ["act.bwd"]


def test_relu_backward_is_one_kernel_under_hf() -> None:
    g = _block(OPT_HF, "hf")
    assert [n.role for n in g.nodes[BWD] if n.role.startswith("act")] == ["act.bwd"]
    assert [n.role for n in g.nodes[FWD] if n.role.startswith("act")] == ["act"]


def test_bad_hf_activation_in_an_arch_file_is_one_line_exit_2(tmp_path) -> None:
    path = tmp_path / "arch.json"
    path.write_text(json.dumps({**_preset("gpt3-1.3b"), "hf_activation": "gelu_new", "activation": "silu"}))
    r = subprocess.run(
        [sys.executable, "-m", "opcast", "arch", "show", str(path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error:") and "hf_activation=gelu_new" in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
