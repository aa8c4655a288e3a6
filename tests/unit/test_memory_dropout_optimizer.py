"""Issue 19 (memory): the arch's own dropout, eager vs flash saved tensors, and the optimizer choice.

Hand-worked on a tiny GPT-style block (h = 64, a = 4 heads of 16, f = 4h = 256, b = 2, s = 8,
bf16): sbh = 8 * 2 * 64 = 1024, a s^2 b = 4 * 64 * 2 = 512. Korthikanti et al. 2022 Eq. 1:
34 sbh = 34816 bytes outside the attention core; the eager core is 5 a s^2 b = 2560 with attention
dropout (softmax out 2, mask 1, dropout out 2) and 2 a s^2 b = 1024 without (softmax out only);
FlashAttention keeps a fp32 logsumexp, 4 a s b = 256, and no mask; no hidden dropout: -2 sbh.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opcast.archs import ArchSpec, arch_from_dict, arch_from_hf_config, load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.memory import (
    layer_activation_bytes,
    model_state_bytes,
    optimizer_state_bytes,
    stage_params,
    train_memory,
)

PUBLISHED = Path(__file__).resolve().parents[3] / "shared" / "published"
NEUSIGHT_CONFIGS = PUBLISHED / "neusight" / "scripts" / "asplos" / "data" / "DLmodel_configs"


def tiny(**kw) -> ArchSpec:
    base = dict(
        name="tiny",
        family="opt",
        n_layers=2,
        hidden=64,
        n_heads=4,
        n_kv_heads=4,
        head_dim=16,
        ffn_hidden=256,
        vocab=1000,
        max_seq=64,
        norm="layernorm",
        activation="relu",
        gated_mlp=False,
        position="learned",
        tied_embeddings=True,
        linear_bias=True,
        parallel_residual=False,
        source="test",
    )
    return ArchSpec(**{**base, **kw})


def one_layer(arch: ArchSpec, attention: str) -> float:
    return layer_activation_bytes(arch, tp=1, sp=False, batch=2, seq=8, attention=attention, dtype="bf16")


SBH, AS2B = 8 * 2 * 64, 4 * 8 * 8 * 2


@pytest.mark.parametrize(
    ("attn_p", "hidden_p", "attention", "expected"),
    [
        (0.1, 0.1, "eager", 34 * SBH + 5 * AS2B),  # Korthikanti Eq. 1 exactly: 37376
        (0.0, 0.1, "eager", 34 * SBH + 2 * AS2B),  # OPT: softmax output only: 35840
        (0.1, 0.1, "flash", 34 * SBH + 4 * 4 * 8 * 2),  # logsumexp, no s x s tensor, no mask: 35072
        (0.0, 0.1, "flash", 34 * SBH + 4 * 4 * 8 * 2),  # flash keeps no attention mask either way
        (0.0, 0.0, "eager", 32 * SBH + 2 * AS2B),  # no hidden dropout: two 1-byte masks fewer
    ],
)
def test_one_layer_hand_worked(attn_p, hidden_p, attention, expected) -> None:
    arch = tiny(attention_dropout=attn_p, hidden_dropout=hidden_p)
    assert one_layer(arch, attention) == expected


def test_family_default_dropout_keeps_todays_numbers() -> None:
    # no explicit dropout: a DROPOUT_FAMILIES arch keeps 0.1 / 0.1 (Megatron's defaults), others 0
    assert one_layer(tiny(), "eager") == 34 * SBH + 5 * AS2B
    assert tiny().attention_dropout_p == tiny().hidden_dropout_p == 0.1
    neox = tiny(family="gpt_neox")
    assert neox.attention_dropout_p == neox.hidden_dropout_p == 0.0
    assert one_layer(neox, "eager") == 32 * SBH + 2 * AS2B


def test_hf_configs_give_their_dropout() -> None:
    opt = {
        "model_type": "opt",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "ffn_dim": 256,
        "max_position_embeddings": 64,
        "vocab_size": 1000,
        "attention_dropout": 0.0,
        "dropout": 0.1,
    }
    a = arch_from_hf_config(opt, "opt-tiny")
    assert (a.attention_dropout, a.hidden_dropout) == (0.0, 0.1)
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 1000}
    assert (arch_from_hf_config(gpt2, "g").attention_dropout, arch_from_hf_config(gpt2, "g").hidden_dropout) == (
        0.1,
        0.1,
    )  # transformers' GPT2Config defaults
    g0 = arch_from_hf_config({**gpt2, "attn_pdrop": 0.0, "resid_pdrop": 0.05}, "g0")
    assert (g0.attention_dropout, g0.hidden_dropout) == (0.0, 0.05)
    with pytest.raises(OpcastError, match="attn_pdrop"):
        arch_from_hf_config({**gpt2, "attn_pdrop": "high"}, "bad")


def test_dropout_values_are_checked() -> None:
    with pytest.raises(OpcastError, match=r"attention_dropout=1\.5 must be a probability"):
        tiny(attention_dropout=1.5)
    with pytest.raises(OpcastError, match="hidden_dropout"):
        tiny(hidden_dropout=-0.1)
    preset = json.loads(json.dumps({k: getattr(tiny(), k) for k in ArchSpec.__dataclass_fields__}))
    assert arch_from_dict(preset, "p.json") == tiny()  # None round-trips as the family default
    with pytest.raises(OpcastError, match=r"p\.json: .*hidden_dropout=.x. is not a finite number"):
        arch_from_dict({**preset, "hidden_dropout": "x"}, "p.json")


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("bf16", "adam", 12),  # ZeRO Sec. 3.1: fp32 master + momentum + variance
        ("bf16", "sgd", 8),  # fp32 master + momentum_buffer
        ("bf16", "none", 0),
        ("fp32", "adam", 8),  # exp_avg + exp_avg_sq, no master copy
        ("fp32", "sgd", 4),
        ("fp32", "none", 0),
    ],
)
def test_optimizer_state_bytes(precision, optimizer, per_param) -> None:
    assert optimizer_state_bytes(precision, optimizer) == per_param
    arch = tiny()
    n = stage_params(arch, tp=1, pp=1).total
    w, g, o, _ = model_state_bytes(
        arch, stage=0, tp=1, pp=1, dp=4, cp=1, ep=1, zero=0, precision=precision, optimizer=optimizer
    )
    assert (w, g, o) == ((2 if precision == "bf16" else 4) * n, (2 if precision == "bf16" else 4) * n, per_param * n)
    _, _, o1, _ = model_state_bytes(
        arch, stage=0, tp=1, pp=1, dp=4, cp=1, ep=1, zero=1, precision=precision, optimizer=optimizer
    )
    assert o1 == per_param * n / 4  # ZeRO-1 shards whatever states there are


def test_unknown_optimizer_is_a_domain_error() -> None:
    with pytest.raises(OpcastError, match="optimizer='lion' is not one of adam, sgd, none"):
        optimizer_state_bytes("bf16", "lion")


def _neusight_memory(model: str, batch: int, optimizer: str) -> float:
    arch = load_arch(NEUSIGHT_CONFIGS / f"{model}.json")
    kw = dict(tp=1, pp=1, dp=1, cp=1, ep=1, sp=False, micro_batches=1, virtual_stages=1, zero=0)
    return train_memory(
        arch,
        stage=0,
        micro_batch=batch,
        seq=2048,
        precision="fp32",
        attention="eager",
        recompute="none",
        optimizer=optimizer,
        **kw,
    ).total_bytes


@pytest.mark.skipif(not NEUSIGHT_CONFIGS.is_dir(), reason=f"published NeuSight configs absent ({NEUSIGHT_CONFIGS})")
def test_neusight_runs_on_80gb_fit() -> None:
    """NeuSight measured OPT-1.3B batch 2 and GPT-3 2.7B batch 1 training on A100-80GB PCIe and
    H100 (fp32, eager, no optimizer): they ran, so they must fit."""
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import predict_train

    device = get_device("A100-PCIe-80GB")
    opt = load_arch(NEUSIGHT_CONFIGS / "opt_13.json")
    assert opt.attention_dropout == 0.0
    before = replace(opt, attention_dropout=None, hidden_dropout=None)  # the old family-default accounting
    kw = dict(tp=1, pp=1, dp=1, cp=1, ep=1, sp=False, micro_batches=1, virtual_stages=1, zero=0)
    old = train_memory(
        before, stage=0, micro_batch=2, seq=2048, precision="fp32", attention="eager", recompute="none", **kw
    ).total_bytes
    assert old > device.mem_bytes  # what the issue reported (86.8 GiB)
    assert _neusight_memory("opt_13", 2, "none") < device.mem_bytes
    assert _neusight_memory("gpt3_27", 1, "none") < device.mem_bytes
    cfg = TrainConfig(micro_batch=2, global_batch=2, seq=2048, precision="fp32", attention="eager", optimizer="none")
    r = predict_train(opt, device, cfg)
    assert r.fits and r.iteration_time_s is not None, r.reasons


def test_bad_optimizer_via_console_script() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "predict",
            "train",
            "--arch",
            "gpt3-125m",
            "--gpu",
            "A100-SXM4-80GB",
            "--optimizer",
            "lion",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error:") and "optimizer='lion'" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
