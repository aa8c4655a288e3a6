"""A compact PyTorch implementation of the GPT / Llama decoder family, kernel for kernel the op
graph that ``opcast predict train`` prices at ``tp = pp = 1`` (:mod:`opcast.predict.graph`).

``opcast validate`` builds an :class:`~opcast.archs.ArchSpec` with :func:`build_model` and times
real training steps of it, so every choice here follows the graph, not a particular Hugging Face
model:

- **block** (``block_ops``): pre-norm (LayerNorm with bias, or RMSNorm) -> one fused QKV linear of
  ``(heads + 2 kv_heads) x head_dim`` outputs -> RoPE over the query and key heads together (rope
  archs) -> attention -> output projection -> hidden dropout (GPT-2/3, Megatron, OPT) -> residual
  add; then norm -> MLP up (``2 x ffn`` wide when gated: gate and up in one GEMM) -> activation
  (GELU in its tanh form, SiLU or ReLU) -> gate multiply (gated) -> MLP down -> dropout -> add.
  ``parallel_residual`` archs (GPT-NeoX) add both branches to the block input at the end.
- **attention**: ``flash`` is ``torch.nn.functional.scaled_dot_product_attention`` restricted to
  its flash backend (the CPU build has one), GQA through ``enable_gqa``; ``eager`` is matmul,
  scale, causal mask, softmax, matmul with the K/V heads repeated for GQA, as Hugging Face's eager
  path and ``opcast collect bench`` do. Attention-probability dropout is not applied (the graph
  has none).
- **model level** (``embedding_ops`` / ``head_ops``): token embedding, learned positions added
  (``learned`` archs), embedding dropout, final norm, LM head (tied to the embedding when the arch
  says so), cross entropy with mean reduction.
- The vocab is padded as Megatron-LM does (:func:`opcast.archs.padded_vocab`) unless
  ``pad_vocab=False``, so the LM head and the cross entropy run the graph's shapes; unpadded, the
  parameter count equals :meth:`ArchSpec.params_total` exactly.

Dropout probability 0.1 is GPT-2's ``resid_pdrop``/``embd_pdrop`` (Radford et al. 2019, Hugging Face
``gpt2`` config). Torch is imported when this module is imported; nothing in the ``opcast`` CLI
imports it at start-up.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from opcast.archs import DROPOUT_FAMILIES, ArchSpec, padded_vocab
from opcast.check.buildable import ATTENTION_IMPLS as ATTENTION_IMPLS  # re-exported: the model builds these
from opcast.check.buildable import check_arch as check_arch
from opcast.errors import OpcastError

DROPOUT_P = 0.1
"""Hidden and embedding dropout of the dropout families (GPT-2 ``resid_pdrop`` / ``embd_pdrop``)."""
NORM_EPS = 1e-5
"""LayerNorm / RMSNorm epsilon (GPT-2 ``layer_norm_epsilon``; Llama-2 ``rms_norm_eps``)."""
ROPE_THETA = 10000.0
"""RoPE base (Su et al. 2021, arXiv 2104.09864, Eq. 15; Llama-2's ``rope_theta``)."""

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's gelu_new, the form collect bench times
    "silu": F.silu,
    "relu": F.relu,
}


def _norm(arch: ArchSpec) -> nn.Module:
    if arch.norm == "layernorm":
        return nn.LayerNorm(arch.hidden, eps=NORM_EPS)
    return nn.RMSNorm(arch.hidden, eps=NORM_EPS)


def rope_tables(seq: int, head_dim: int, *, device=None, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``[seq, 1, head_dim]``: angles ``pos x theta^(-2i/d)`` for the two
    halves of each head (Su et al. 2021, Eq. 34, in the rotate-half layout of GPT-NeoX / Llama)."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat((angles, angles), dim=-1)[:, None, :]
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` over the last dim of ``x [batch, seq, heads, head_dim]``
    (the kernel ``opcast collect bench`` times for the ``rope`` op)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Fused QKV projection, RoPE, causal attention and the output projection."""

    def __init__(self, arch: ArchSpec, attention: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = arch.n_heads, arch.n_kv_heads, arch.head_dim
        self.rope = arch.position == "rope"
        self.impl = attention
        self.qkv = nn.Linear(arch.hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=arch.linear_bias)
        self.proj = nn.Linear(self.heads * self.head_dim, arch.hidden, bias=arch.linear_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(x).view(b, s, h + 2 * kvh, d)
        qk, v = qkv[:, :, : h + kvh], qkv[:, :, h + kvh :]
        if self.rope:  # one rope op over the query and key heads together, as the graph lists it
            assert cos is not None and sin is not None, "a rope arch gets its cos/sin tables from DecoderLM"
            qk = apply_rope(qk, cos, sin)
        q, k = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2)
        v = v.transpose(1, 2)
        out = self._flash(q, k, v) if self.impl == "flash" else self._eager(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, s, h * d))

    def _flash(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = q.shape[-2]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril().logical_not()
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


class MLP(nn.Module):
    """Up projection (gate and up in one GEMM when gated), activation, gate multiply, down."""

    def __init__(self, arch: ArchSpec) -> None:
        super().__init__()
        self.gated = arch.gated_mlp
        self.act = _ACTIVATIONS[arch.activation]
        self.up = nn.Linear(arch.hidden, (2 if self.gated else 1) * arch.ffn_hidden, bias=arch.linear_bias)
        self.down = nn.Linear(arch.ffn_hidden, arch.hidden, bias=arch.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up(x)
        if self.gated:
            gate, up = up.chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(up))


class Block(nn.Module):
    """One transformer block (sequential or parallel residual)."""

    def __init__(self, arch: ArchSpec, attention: str, dropout_p: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(arch), _norm(arch)
        self.attn = Attention(arch, attention)
        self.mlp = MLP(arch)
        self.parallel = arch.parallel_residual
        self.p = dropout_p

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p, self.training) if self.p else x

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        if self.parallel:
            a = self._drop(self.attn(self.norm1(x), cos, sin))
            m = self._drop(self.mlp(self.norm2(x)))
            return x + a + m
        x = x + self._drop(self.attn(self.norm1(x), cos, sin))
        return x + self._drop(self.mlp(self.norm2(x)))


class DecoderLM(nn.Module):
    """Embeddings, ``n_layers`` blocks, final norm, LM head and the cross-entropy loss."""

    def __init__(
        self, arch: ArchSpec, *, attention: str = "flash", pad_vocab: bool = True, dropout: bool | None = None
    ) -> None:
        super().__init__()
        check_arch(arch, attention)
        self.arch = arch
        self.vocab = padded_vocab(arch.vocab) if pad_vocab else arch.vocab
        use_dropout = arch.family in DROPOUT_FAMILIES if dropout is None else dropout
        self.p = DROPOUT_P if use_dropout else 0.0
        self.embed = nn.Embedding(self.vocab, arch.hidden)
        self.pos = nn.Embedding(arch.max_seq, arch.hidden) if arch.position == "learned" else None
        self.blocks = nn.ModuleList(Block(arch, attention, self.p) for _ in range(arch.n_layers))
        self.final_norm = _norm(arch)
        self.lm_head = nn.Linear(arch.hidden, self.vocab, bias=False)
        if arch.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        self._rope: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rope_tables(self, seq: int, ref: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.arch.position != "rope":
            return None, None
        key = (seq, ref.device, ref.dtype)
        if key not in self._rope:
            self._rope[key] = rope_tables(seq, self.arch.head_dim, device=ref.device, dtype=ref.dtype)
        return self._rope[key]

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The final-norm output ``[batch, seq, hidden]`` of token ids ``[batch, seq]``."""
        b, s = ids.shape
        if self.pos is not None and s > self.arch.max_seq:
            raise OpcastError(f"seq={s} exceeds max_seq={self.arch.max_seq} of {self.arch.name} (learned positions)")
        x = self.embed(ids)
        if self.pos is not None:  # positions looked up for every token, as the graph's pos_embed
            x = x + self.pos(torch.arange(s, device=ids.device).expand(b, s))
        if self.p:
            x = F.dropout(x, self.p, self.training)
        cos, sin = self._rope_tables(s, x)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.final_norm(x)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]``, or the mean cross-entropy loss when ``targets`` are given."""
        logits = self.lm_head(self.hidden_states(ids))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(
    arch: ArchSpec,
    *,
    attention: str = "flash",
    pad_vocab: bool = True,
    dropout: bool | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> DecoderLM:
    """A seeded :class:`DecoderLM` of ``arch`` on ``device`` in ``dtype`` (GPT-2's initialisation:
    normal(0, 0.02) weights, zero biases; norms at one)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = DecoderLM(arch, attention=attention, pad_vocab=pad_vocab, dropout=dropout)
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                bias = getattr(module, "bias", None)  # nn.Embedding has none
                if bias is not None:
                    nn.init.zeros_(bias)
    finally:
        torch.random.set_rng_state(gen_state)
    return model.to(device=device, dtype=dtype)


def count_params(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counted once)."""
    return sum(p.numel() for p in model.parameters())
