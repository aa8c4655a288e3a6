"""The PyTorch model of validate: parameter counts equal the arch's, output shapes, and the choices
the op graph makes (padded vocab, tied head, flash = eager)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from opcast.archs import ArchSpec, padded_vocab
from opcast.check.torch_model import build_model, check_arch, count_params
from opcast.errors import OpcastError

GPT = ArchSpec(
    name="tiny-gpt2",
    family="gpt2",
    n_layers=2,
    hidden=64,
    n_heads=4,
    n_kv_heads=4,
    head_dim=16,
    ffn_hidden=256,
    vocab=1000,
    max_seq=128,
    norm="layernorm",
    activation="gelu",
    gated_mlp=False,
    position="learned",
    tied_embeddings=True,
    linear_bias=True,
    parallel_residual=False,
    source="test",
)
LLAMA = ArchSpec(
    name="tiny-llama",
    family="llama",
    n_layers=3,
    hidden=64,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    ffn_hidden=160,
    vocab=999,
    max_seq=512,
    norm="rmsnorm",
    activation="silu",
    gated_mlp=True,
    position="rope",
    tied_embeddings=False,
    linear_bias=False,
    parallel_residual=False,
    source="test",
)
NEOX = replace(GPT, name="tiny-neox", family="gpt_neox", position="rope", tied_embeddings=False, parallel_residual=True)


@pytest.mark.parametrize("arch", [GPT, LLAMA, NEOX], ids=lambda a: a.name)
def test_parameter_count_equals_the_arch(arch):
    assert count_params(build_model(arch, pad_vocab=False)) == arch.params_total()


@pytest.mark.parametrize("arch", [GPT, LLAMA], ids=lambda a: a.name)
def test_padded_vocab_adds_the_padding_rows_once_per_matrix(arch):
    extra = (padded_vocab(arch.vocab) - arch.vocab) * arch.hidden * (1 if arch.tied_embeddings else 2)
    assert count_params(build_model(arch)) == arch.params_total() + extra


@pytest.mark.parametrize("arch", [GPT, LLAMA, NEOX], ids=lambda a: a.name)
def test_forward_shapes_and_a_finite_loss(arch):
    model = build_model(arch)
    ids = torch.randint(0, arch.vocab, (2, 16))
    assert model(ids).shape == (2, 16, padded_vocab(arch.vocab))
    loss = model(ids, ids)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tied_head_shares_the_embedding():
    model = build_model(GPT)
    assert model.lm_head.weight is model.embed.weight
    assert build_model(LLAMA).lm_head.weight is not build_model(LLAMA).embed.weight


@pytest.mark.parametrize("arch", [GPT, LLAMA], ids=lambda a: a.name)
def test_flash_and_eager_attention_compute_the_same(arch):
    ids = torch.randint(0, arch.vocab, (1, 24))
    flash, eager = build_model(arch, attention="flash").eval(), build_model(arch, attention="eager").eval()
    with torch.no_grad():
        assert torch.allclose(flash(ids), eager(ids), atol=1e-4)


def test_dropout_follows_the_family():
    assert build_model(GPT).p == pytest.approx(0.1)
    assert build_model(LLAMA).p == 0.0


def test_archs_the_model_cannot_build_are_refused():
    with pytest.raises(OpcastError, match="mixture of experts"):
        check_arch(replace(LLAMA, n_experts=8, experts_top_k=2))
    with pytest.raises(OpcastError, match="attention='paged'"):
        check_arch(LLAMA, "paged")
    with pytest.raises(OpcastError, match="post-norms"):
        check_arch(replace(LLAMA, post_norms=True))
    with pytest.raises(OpcastError, match="set sliding_window to null"):
        check_arch(replace(LLAMA, sliding_window=4096))
