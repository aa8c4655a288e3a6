"""LLM architectures ("archs"): presets, Hugging Face config import, parameter counts, and the
per-rank ops of one transformer block under Megatron tensor parallelism.

An :class:`ArchSpec` is the shape of a decoder-only transformer. Presets live as strict JSON in
``data/archs/<name>.json`` (keys = the ArchSpec fields). :func:`load_arch` accepts a preset name,
a preset-style JSON file, or a Hugging Face ``config.json`` (or a folder holding one).

:func:`layer_ops` and :func:`model_ops` turn an arch into the op list that ``collect bench
--arch`` measures and ``predict`` costs. They follow Megatron-LM tensor parallelism (Shoeybi et
al. 2019, arXiv 1909.08053, Sec. 3): QKV and MLP-up are column-parallel (output features split
over ``tp`` ranks), out-proj and MLP-down are row-parallel (input features split), so every GEMM
keeps all ``T = batch * seq`` tokens as rows. With sequence parallelism (Korthikanti et al. 2022,
arXiv 2205.05198, Sec. 4.2.2) the norms, dropouts and residual adds see ``T / tp`` rows.
Op kinds and parameter names are those of the op registry (:mod:`opcast.ops`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from opcast.errors import OpcastError
from opcast.hardware import read_json_file
from opcast.ops import moe_balanced_experts
from opcast.paths import data_path, link_problem

Family = Literal[
    "gpt2",
    "gpt_neox",
    "llama",
    "mistral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "glm4_moe",
    "gemma2",
    "gemma3",
    "opt",
    "mixtral",
    "gpt3",
    "megatron",
]
Norm = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "silu", "relu"]
Position = Literal["learned", "rope", "alibi"]

Op = tuple[str, dict[str, int | bool | str]]
"""An op: (registry kind, shape parameters)."""

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron-LM's default ``--make-vocab-size-divisible-by`` (megatron/training/arguments.py)."""

DROPOUT_FAMILIES = frozenset({"gpt2", "gpt3", "megatron", "opt"})
"""Families trained with hidden dropout after attention and MLP (GPT-2/3, Megatron GPT, OPT).
GPT-NeoX-20B trained with hidden-dropout 0 (its 20B.yml) and the llama family has none.
An arch without explicit ``attention_dropout`` / ``hidden_dropout`` takes 0.1 for both in these
families (Megatron-LM's defaults ``--attention-dropout 0.1 --hidden-dropout 0.1``, arguments.py;
GPT-2's ``attn_pdrop = resid_pdrop = 0.1``) and 0 otherwise."""

FAMILY_DROPOUT = 0.1
"""The dropout probability of a :data:`DROPOUT_FAMILIES` arch that gives none of its own."""

_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout")
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
"""The fields a multi-head latent attention arch gives together (``q_lora_rank`` optional)."""
_OPTIONAL_NONE_FIELDS = (
    *_DROPOUT_FIELDS,
    "hf_activation",
    "shared_expert_ffn",
    "q_lora_rank",
    *_MLA_FIELDS,
    "dense_layers",
    "dense_ffn_hidden",
    "sliding_window",
    "sliding_window_layers",
    "expert_weights",
    "expert_groups",
    "expert_groups_top_k",
)
"""Fields that may be None (a default taken elsewhere, or nothing to say)."""


def _family_dropout(family: str) -> float:
    return FAMILY_DROPOUT if family in DROPOUT_FAMILIES else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchSpec:
    """The shape of a decoder-only transformer LLM."""

    name: str
    """Preset or model name, e.g. ``llama2-7b``."""
    family: Family
    """Architecture family; decides details such as dropout placement."""
    n_layers: int
    """Transformer blocks."""
    hidden: int
    """Model (residual stream) width."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads: ``n_heads`` for multi-head attention, fewer for GQA/MQA."""
    head_dim: int
    """Channels per head, usually ``hidden // n_heads``."""
    ffn_hidden: int
    """MLP intermediate width (per expert for MoE)."""
    vocab: int
    """Tokenizer vocabulary (unpadded)."""
    max_seq: int
    """Longest sequence (rows of a learned position table)."""
    norm: Norm
    """Normalisation layer; LayerNorm has weight and bias, RMSNorm weight only."""
    activation: Activation
    """MLP activation."""
    gated_mlp: bool
    """SwiGLU-style MLP: the up projection is ``2 * ffn_hidden`` wide (gate and up)."""
    position: Position
    """Position encoding; ``learned`` adds a ``max_seq x hidden`` table."""
    tied_embeddings: bool
    """LM head shares the input embedding matrix."""
    linear_bias: bool
    """Attention and MLP projections carry biases."""
    parallel_residual: bool
    """GPT-NeoX/GPT-J block: ``x + attn(ln1(x)) + mlp(ln2(x))``."""
    n_experts: int = 1
    """MoE experts per MLP (1 = dense)."""
    experts_top_k: int = 1
    """Experts each token is routed to."""
    shared_expert_ffn: int | None = None
    """Intermediate width of the shared expert of an MoE block: a gated MLP every token passes through beside
    its routed experts (Qwen2-MoE ``shared_expert_intermediate_size``, DeepSeekMoE's shared experts as one);
    None: no shared expert. Split over ``tp`` like a dense MLP, never over ``ep``."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by ``sigmoid(x W_g)``, ``W_g`` a ``hidden x 1`` linear (Qwen2-MoE's
    ``shared_expert_gate``)."""
    expert_groups: int | None = None
    """Group-limited routing (DeepSeek-V3, arXiv 2412.19437, Sec. 2.1.2 "node-limited routing"; Hugging Face
    ``n_group``, Megatron-Core ``moe_router_num_groups``): the experts fall into this many equal groups of
    consecutive experts and a token's experts come from :attr:`expert_groups_top_k` of them; None: no limit. It
    bounds the nodes a token's experts occupy (:mod:`opcast.predict.moe_dispatch`)."""
    expert_groups_top_k: int | None = None
    """Groups a token's experts are chosen from (``topk_group``, ``moe_router_group_topk``); with
    :attr:`expert_groups`."""
    qk_norm: bool = False
    """RMSNorm over each query and key head (``head_dim`` weights each) before rope (Qwen3 ``q_norm`` /
    ``k_norm``; Megatron ``--qk-layernorm``)."""
    kv_lora_rank: int | None = None
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): keys and values are projected
    up from one ``kv_lora_rank``-wide latent per token (``kv_a_proj_with_mqa``, RMSNorm, ``kv_b_proj``), and
    the KV cache holds that latent and the shared rope key, ``kv_lora_rank + qk_rope_head_dim`` values a token
    and layer, on every tensor-parallel rank. None: standard (GQA) attention. With MLA ``head_dim`` is the
    query/key head width ``qk_nope_head_dim + qk_rope_head_dim`` and ``n_kv_heads == n_heads``."""
    q_lora_rank: int | None = None
    """MLA's query compression (``q_a_proj`` to this width, RMSNorm, ``q_b_proj``); None: one ``q_proj``."""
    qk_rope_head_dim: int | None = None
    """MLA: the rotary part of each query/key head (decoupled rope; the key's is one head shared by all)."""
    v_head_dim: int | None = None
    """MLA: the value (and attention output) head width."""
    dense_layers: int | None = None
    """An MoE arch's first blocks with a dense MLP of ``dense_ffn_hidden`` instead of experts (DeepSeek
    ``first_k_dense_replace``). Their parameters are counted exactly, on the pipeline stages that hold them, and
    inference prices them as dense blocks (:func:`opcast.predict.inference.block_kinds`); training times them as
    MoE blocks (every block alike), whose active width DeepSeek matches (V3: a dense 18,432 = 9 active experts of
    2,048, the same FLOPs a token)."""
    dense_ffn_hidden: int | None = None
    """The MLP width of the ``dense_layers`` blocks."""
    sliding_window: int | None = None
    """Sliding-window (local) attention: a query attends to the last ``sliding_window`` positions, itself
    included (Hugging Face ``sliding_window``; Mistral-7B-v0.1 4,096, gpt-oss 128), and the KV cache of such a
    block holds only those (vLLM's hybrid KV cache manager frees the blocks that slide out). None: every block
    attends to the whole context."""
    sliding_window_layers: int | None = None
    """How many blocks use the window (gpt-oss: every other one, ``layer_types``); None with ``sliding_window``
    set: all of them. Inference and serving price the windowed and the full blocks apart
    (:func:`opcast.predict.inference.block_kinds`); training prices every block alike, its attention core the
    blocks' mean (:func:`opcast.predict.graph.window_core`)."""
    post_norms: bool = False
    """A norm on each sublayer's output before its residual add, four norms a block (Gemma 2/3
    ``post_attention_layernorm`` / ``post_feedforward_layernorm``, arXiv 2408.00118 Sec. 2.2)."""
    attention_sinks: bool = False
    """A learned logit per head in every softmax's denominator (gpt-oss ``sinks``; Xiao et al. 2023, arXiv
    2309.17453): ``n_heads`` parameters a block, folded into the attention kernel at no priced cost."""
    fp8_block_checkpoint: bool = False
    """The checkpoint's linears are fp8 with one scale per 128 x 128 weight block (DeepSeek-V3's and Kimi K2's
    ``quantization_config``: ``quant_method`` fp8, ``weight_block_size`` [128, 128], activations quantised per 128
    values at run time). Serving it in fp8 runs its routed experts as block-scaled fp8 MoE kernels (the
    ``fp8_block`` families: :func:`opcast.predict.inference.infer_precision`); its other GEMMs are priced as
    per-tensor fp8. Training and other precisions ignore it."""
    expert_weights: str | None = None
    """Storage format of the routed experts' weights in the checkpoint when it differs from the serving
    precision: ``mxfp4`` (gpt-oss ``quantization_config``: OCP MX FP4, 4-bit e2m1 values with one E8M0 scale per
    32, 4.25 bits; attention, router, embeddings and head stay bf16). Inference reads those weights at that
    size (:mod:`opcast.predict.weight_only`); training ignores it (bf16 master weights). None: the precision's."""
    attention_dropout: float | None = None
    """Dropout probability on the attention probabilities (HF ``attention_dropout`` / ``attn_pdrop``,
    Megatron ``--attention-dropout``); None: the family's default (:data:`DROPOUT_FAMILIES`: 0.1,
    Megatron-LM's default, else 0)."""
    hidden_dropout: float | None = None
    """Dropout probability after attention and MLP and on the embeddings (HF ``dropout`` /
    ``resid_pdrop`` / ``hidden_dropout``, Megatron ``--hidden-dropout``); None: the family's default."""
    hf_activation: str | None = None
    """The Hugging Face name of the MLP activation (config.json ``activation_function`` /
    ``hidden_act``, or the model's default, e.g. ``gelu_new``) when the arch came from a config.json;
    None otherwise. ``activation`` says which function it computes; this says which transformers module
    computes it, which decides the kernels it runs in torch eager (``--framework hf``:
    :func:`opcast.predict.graph.hf_activation_ops`)."""
    source: str
    """Citation: paper table, or model card and config.json."""

    def __post_init__(self) -> None:
        label = self.name if isinstance(self.name, str) and self.name else "<unnamed>"
        problems = [
            p
            for f in fields(self)
            if not (f.name in _OPTIONAL_NONE_FIELDS and getattr(self, f.name) is None)
            and (p := value_problem(f.name, getattr(self, f.name), _FIELD_TYPES[f.name], _CHOICES.get(f.name)))
        ]
        problems += [
            f"{key}={value} must be a probability in [0, 1)"
            for key in _DROPOUT_FIELDS
            if not any(key in p for p in problems) and (value := getattr(self, key)) is not None and not 0 <= value < 1
        ]
        if not problems:
            if not self.name.strip():
                problems.append("name is empty")
            if self.n_heads % self.n_kv_heads:
                problems.append(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
            if self.experts_top_k > self.n_experts:
                problems.append(f"experts_top_k={self.experts_top_k} exceeds n_experts={self.n_experts}")
            if self.shared_expert_ffn is not None and self.n_experts == 1:
                problems.append("shared_expert_ffn needs an MoE arch (n_experts > 1); a dense MLP is ffn_hidden")
            if self.shared_expert_gate and self.shared_expert_ffn is None:
                problems.append("shared_expert_gate needs a shared expert (shared_expert_ffn)")
            mla = [getattr(self, f) is not None for f in _MLA_FIELDS]
            if any(mla) and not all(mla):
                problems.append(f"multi-head latent attention needs all of {', '.join(_MLA_FIELDS)}")
            elif all(mla):
                if self.n_kv_heads != self.n_heads:
                    problems.append(f"multi-head latent attention has n_kv_heads = n_heads, not {self.n_kv_heads}")
                if self.qk_rope_head_dim is not None and self.qk_rope_head_dim >= self.head_dim:
                    problems.append(f"qk_rope_head_dim={self.qk_rope_head_dim} must be below head_dim={self.head_dim}")
            elif self.q_lora_rank is not None:
                problems.append("q_lora_rank needs multi-head latent attention (kv_lora_rank)")
            if (self.dense_layers is None) != (self.dense_ffn_hidden is None):
                problems.append("dense_layers and dense_ffn_hidden go together")
            elif self.dense_layers is not None and (self.n_experts == 1 or self.dense_layers >= self.n_layers):
                problems.append(f"dense_layers={self.dense_layers} needs an MoE arch with more than that many layers")
            if self.sliding_window_layers is not None and (
                self.sliding_window is None or not 1 <= self.sliding_window_layers <= self.n_layers
            ):
                problems.append(
                    f"sliding_window_layers={self.sliding_window_layers} needs sliding_window and 1..n_layers blocks"
                )
            if (self.expert_groups is None) != (self.expert_groups_top_k is None):
                problems.append("expert_groups and expert_groups_top_k go together")
            elif self.expert_groups is not None and self.expert_groups_top_k is not None:
                groups, chosen = self.expert_groups, self.expert_groups_top_k
                if self.n_experts == 1 or self.n_experts % groups:
                    problems.append(f"expert_groups={groups} must divide n_experts={self.n_experts} of an MoE arch")
                elif not 1 <= chosen <= groups:
                    problems.append(f"expert_groups_top_k={chosen} must be 1..expert_groups={groups}")
                elif self.experts_top_k > chosen * (self.n_experts // groups):
                    problems.append(
                        f"experts_top_k={self.experts_top_k} exceeds the {chosen * (self.n_experts // groups)} "
                        f"experts of expert_groups_top_k={chosen} groups"
                    )
            if self.expert_weights is not None and self.n_experts == 1:
                problems.append(f"expert_weights={self.expert_weights} needs an MoE arch (n_experts > 1)")
            if self.hf_activation is not None and _HF_ACTIVATIONS[self.hf_activation] != self.activation:
                problems.append(
                    f"hf_activation={self.hf_activation} computes {_HF_ACTIVATIONS[self.hf_activation]}, "
                    f"not activation={self.activation}"
                )
        if problems:
            raise OpcastError(f"arch {label}: " + "; ".join(problems))

    # ------------------------------------------------------------------ dropout

    @property
    def attention_dropout_p(self) -> float:
        """The attention-probability dropout in training (``attention_dropout`` or the family default)."""
        return _family_dropout(self.family) if self.attention_dropout is None else float(self.attention_dropout)

    @property
    def hidden_dropout_p(self) -> float:
        """The hidden (residual-branch and embedding) dropout in training (``hidden_dropout`` or the family default)."""
        return _family_dropout(self.family) if self.hidden_dropout is None else float(self.hidden_dropout)

    @property
    def windowed_layers(self) -> int:
        """Blocks with sliding-window attention (:attr:`sliding_window_layers`; all with a window, 0 without)."""
        if self.sliding_window is None:
            return 0
        return self.n_layers if self.sliding_window_layers is None else self.sliding_window_layers

    def attended_keys(self, keys: int) -> int:
        """Keys a query of a block of this arch sees of a context of ``keys``: all of them, or the window when
        every block is windowed (:attr:`windowed_layers`)."""
        if self.sliding_window is None or self.windowed_layers < self.n_layers:
            return keys
        return min(keys, self.sliding_window)

    # ------------------------------------------------------------------ parameter counts

    @property
    def norms_per_block(self) -> int:
        """The hidden-wide norms of a block: before attention and MLP, and after each with :attr:`post_norms`."""
        return 4 if self.post_norms else 2

    def norm_params(self) -> int:
        """The weights of one hidden-wide norm: a scale, and a bias for LayerNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def _attention_params(self) -> int:
        if self.kv_lora_rank is not None:
            return self._mla_params()
        qkv_out = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        weights = self.hidden * qkv_out + self.n_heads * self.head_dim * self.hidden
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        sinks = self.n_heads if self.attention_sinks else 0
        return weights + qk_norms + sinks + (qkv_out + self.hidden if self.linear_bias else 0)

    def _mla_params(self) -> int:
        return self.mla_params(tp=1)

    def mla_params(self, tp: int) -> int:
        """MLA's projections and latent norms on one of ``tp`` ranks (transformers ``DeepseekV3Attention``):
        ``q_a_proj``, its norm and ``q_b_proj`` (or ``q_proj``), ``kv_a_proj_with_mqa``, its norm, ``kv_b_proj`` and
        ``o_proj``, no biases. The down-projections and their norms are whole on every rank (vLLM
        ``ReplicatedLinear``, Megatron-Core MLA's duplicated ``linear_q_down_proj`` / ``linear_kv_down_proj``), the
        up-projections and ``o_proj`` split by heads."""
        assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None and self.v_head_dim is not None
        h, heads, c, r, v = self.hidden, self.n_heads // tp, self.kv_lora_rank, self.qk_rope_head_dim, self.v_head_dim
        q_out, ql = heads * self.head_dim, self.q_lora_rank
        q = h * q_out if ql is None else h * ql + ql + ql * q_out
        kv = h * (c + r) + c + c * heads * (self.head_dim - r + v)
        return q + kv + heads * v * h

    def mlp_params(self, ffn: int) -> int:
        """Parameters of an MLP ``ffn`` wide (one rank's slice when ``ffn`` is split over tp: the row-parallel bias
        whole on every rank)."""
        up_out = (2 if self.gated_mlp else 1) * ffn
        weights = self.hidden * up_out + ffn * self.hidden
        return weights + (up_out + self.hidden if self.linear_bias else 0)

    def _expert_params(self) -> int:
        return self.mlp_params(self.ffn_hidden)

    def shared_expert_params(self, tp: int = 1) -> int:
        """The shared expert and its gate on one of ``tp`` ranks (split over tp like a dense MLP, whole on every
        expert-parallel rank); 0 without one."""
        if self.shared_expert_ffn is None:
            return 0
        return self.mlp_params(self.shared_expert_ffn // tp) + (self.hidden if self.shared_expert_gate else 0)

    def router_params(self) -> int:
        """The router's ``hidden x n_experts`` weights (and its bias with :attr:`linear_bias`), whole on every rank."""
        if self.n_experts == 1:
            return 0
        return (self.hidden + (1 if self.linear_bias else 0)) * self.n_experts  # gpt-oss's router has a bias

    def params_per_layer(self) -> int:
        """Parameters of one block: attention, all experts' MLPs (and the shared expert), router, two norms."""
        return (
            self._attention_params()
            + self.n_experts * self._expert_params()
            + self.shared_expert_params()
            + self.router_params()
            + self.norms_per_block * self.norm_params()
        )

    def embedding_params(self) -> int:
        """Token embedding (unpadded vocab) plus the learned position table, if any."""
        return self.vocab * self.hidden + (self.max_seq * self.hidden if self.position == "learned" else 0)

    def _outside_layers(self) -> int:
        lm_head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.embedding_params() + self.norm_params() + lm_head

    def dense_block_saving(self) -> int:
        """Parameters a :attr:`dense_layers` block has fewer than an MoE block (0 for an arch without)."""
        if self.dense_layers is None or self.dense_ffn_hidden is None:
            return 0
        moe = self.n_experts * self._expert_params() + self.shared_expert_params() + self.router_params()
        return moe - self.mlp_params(self.dense_ffn_hidden)

    def params_total(self) -> int:
        """Exact parameter count: blocks, embeddings, final norm and (when untied) the LM head.

        For GPT-style archs this is Narayanan et al. 2021 (arXiv 2104.04473) Sec. 5.1,
        ``12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))``, plus the final LayerNorm.
        """
        dense = (self.dense_layers or 0) * self.dense_block_saving()
        return self.n_layers * self.params_per_layer() - dense + self._outside_layers()

    def active_params_total(self) -> int:
        """Parameters a token passes through: only ``experts_top_k`` experts per MoE layer."""
        inactive = (self.n_experts - self.experts_top_k) * self._expert_params()
        return self.params_total() - (self.n_layers - (self.dense_layers or 0)) * inactive

    # ------------------------------------------------------------------ parallelism

    def tp_choices(self) -> list[int]:
        """Tensor-parallel degrees this arch admits (see :meth:`validate_parallel`)."""
        return [t for t in _divisors(self.n_heads) if not self._tp_conflicts(t)]

    def _tp_conflicts(self, tp: int) -> list[str]:
        bad = []
        if self.n_heads % tp:
            bad.append(f"n_heads={self.n_heads}")
        # GQA with tp > n_kv_heads is fine when tp is a multiple: Megatron replicates the kv heads
        if self.n_kv_heads != self.n_heads and self.n_kv_heads % tp and tp % self.n_kv_heads:
            bad.append(f"n_kv_heads={self.n_kv_heads}")
        if self.ffn_hidden % tp:
            bad.append(f"ffn_hidden={self.ffn_hidden}")
        if self.shared_expert_ffn is not None and self.shared_expert_ffn % tp:
            bad.append(f"shared_expert_ffn={self.shared_expert_ffn}")
        if self.dense_ffn_hidden is not None and self.dense_ffn_hidden % tp:
            bad.append(f"dense_ffn_hidden={self.dense_ffn_hidden}")
        return bad

    def validate_parallel(self, tp: int = 1, pp: int = 1, ep: int = 1) -> None:
        """Raise :class:`OpcastError` naming every factor that does not fit this arch.

        ``tp`` must divide ``n_heads`` and ``ffn_hidden`` (Megatron's column/row-parallel split)
        and either divide ``n_kv_heads`` or be a multiple of it (kv heads are then replicated);
        ``pp`` must divide ``n_layers``; ``ep`` must divide ``n_experts``.
        """
        problems: list[str] = []
        for label, value in (("tp", tp), ("pp", pp), ("ep", ep)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{label}={value!r} must be a positive integer")
        if problems:
            raise OpcastError(f"{self.name}: " + "; ".join(problems))
        bad = self._tp_conflicts(tp)
        if bad:
            nor = f" (nor {', '.join(bad[1:])})" if len(bad) > 1 else ""
            problems.append(f"tp={tp} does not divide {bad[0]}{nor}; choose tp in {_join(self.tp_choices())}")
        if self.n_layers % pp:
            problems.append(
                f"pp={pp} does not divide n_layers={self.n_layers}; choose pp in {_join(_divisors(self.n_layers))}"
            )
        if self.n_experts % ep:
            problems.append(
                f"ep={ep} does not divide n_experts={self.n_experts}; choose ep in {_join(_divisors(self.n_experts))}"
            )
        if problems:
            raise OpcastError(f"{self.name}: " + "; ".join(problems))


_FIELD_TYPES: dict[str, type] = {
    "name": str,
    "family": str,
    "n_layers": int,
    "hidden": int,
    "n_heads": int,
    "n_kv_heads": int,
    "head_dim": int,
    "ffn_hidden": int,
    "vocab": int,
    "max_seq": int,
    "norm": str,
    "activation": str,
    "gated_mlp": bool,
    "position": str,
    "tied_embeddings": bool,
    "linear_bias": bool,
    "parallel_residual": bool,
    "n_experts": int,
    "experts_top_k": int,
    "shared_expert_ffn": int,
    "shared_expert_gate": bool,
    "qk_norm": bool,
    "kv_lora_rank": int,
    "q_lora_rank": int,
    "qk_rope_head_dim": int,
    "v_head_dim": int,
    "dense_layers": int,
    "dense_ffn_hidden": int,
    "sliding_window": int,
    "sliding_window_layers": int,
    "post_norms": bool,
    "attention_sinks": bool,
    "fp8_block_checkpoint": bool,
    "expert_weights": str,
    "expert_groups": int,
    "expert_groups_top_k": int,
    "attention_dropout": float,
    "hidden_dropout": float,
    "hf_activation": str,
    "source": str,
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "family": get_args(Family),
    "norm": get_args(Norm),
    "activation": get_args(Activation),
    "position": get_args(Position),
    "expert_weights": ("mxfp4",),
}
_DEFAULTED_FIELDS = (
    "n_experts",
    "experts_top_k",
    "shared_expert_gate",
    "qk_norm",
    "attention_sinks",
    "post_norms",
    "fp8_block_checkpoint",
)
"""Fields a preset may leave out (a dense arch without these features)."""
_REQUIRED = tuple(f.name for f in fields(ArchSpec) if f.name not in (*_DEFAULTED_FIELDS, *_OPTIONAL_NONE_FIELDS))

MAX_SIZE = 2**31 - 1
"""Largest size (layers, widths, heads, vocab, sequence, experts) an arch may give."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def value_problem(key: str, value: Any, kind: type, choices: tuple[str, ...] | None = None) -> str | None:
    """What is wrong with one arch value, or None: the one schema rule of presets, ArchSpec
    fields and Hugging Face config keys. ``int`` is a size (an integer from 1 to
    :data:`MAX_SIZE`, not a bool), ``float`` a finite number, ``bool`` true/false, ``str`` a
    string (one of ``choices`` when given)."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key}={_show(value)} is not an integer"
        if value < 1:
            return f"{key}={value} must be >= 1"
        if value > MAX_SIZE:
            return f"{key}={_show(value)} exceeds {MAX_SIZE}"
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{key}={_show(value)} is not a finite number"
    elif kind is bool:
        if not isinstance(value, bool):
            return f"{key}={_show(value)} is not true/false"
    elif not isinstance(value, str):
        return f"{key}={_show(value)} is not a string"
    elif choices is not None and value not in choices:
        return f"{key}={_show(value)} is not one of {', '.join(choices)}"
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _join(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def padded_vocab(vocab: int, tp: int = 1, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Vocab padded as Megatron-LM does (``_vocab_size_with_padding``): up to a multiple of
    ``--make-vocab-size-divisible-by`` (128) times ``tp``, so every rank holds an equal slice."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


# ---------------------------------------------------------------------- op lists


def _tokens(arch: ArchSpec, tp: int, batch: int, seq: int, sp: bool) -> tuple[int, int]:
    """``(T, rows)``: all tokens, and the tokens of the sequence-parallel region."""
    arch.validate_parallel(tp=tp)
    for label, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OpcastError(f"{label}={value!r} must be a positive integer")
    if arch.position == "learned" and seq > arch.max_seq:
        raise OpcastError(f"seq={seq} exceeds max_seq={arch.max_seq} of {arch.name} (learned positions)")
    tokens = batch * seq
    if sp and seq % tp:  # Megatron splits the sequence dimension of [seq, batch, hidden]
        raise OpcastError(f"sequence parallelism needs tp={tp} to divide seq={seq}")
    return tokens, tokens // tp if sp else tokens


def _dropout(arch: ArchSpec, numel: int) -> list[Op]:
    return [("elementwise", {"numel": numel, "fn": "dropout"})] if arch.hidden_dropout_p > 0 else []


RoleOp = tuple[str, str, dict[str, int | bool | str]]
"""An op with the role it plays in the block: (role, registry kind, shape parameters)."""


def qk_norm_ops(arch: ArchSpec, *, tokens: int, heads: int, kv_heads: int) -> list[RoleOp]:
    """Qwen3's per-head RMSNorms of the queries and keys after the QKV projection, before rope
    (transformers ``Qwen3Attention.forward``: ``self.q_norm(query_states)``, ``self.k_norm(key_states)``, each
    over ``head_dim``): one rmsnorm of ``tokens * heads`` rows and one of ``tokens * kv_heads`` rows."""
    if not arch.qk_norm:
        return []
    return [
        ("q_norm", "rmsnorm", {"rows": tokens * heads, "cols": arch.head_dim}),
        ("k_norm", "rmsnorm", {"rows": tokens * kv_heads, "cols": arch.head_dim}),
    ]


def gated_activation_ops(prefix: str, *, numel: int, fn: str, gated: bool, fused: bool) -> list[RoleOp]:
    """The activation of an MLP over ``numel`` outputs: ``fn`` of the up projection, times its gate half when
    ``gated``. Two kernels, the activation and the gate product (``silu(a) * b`` as torch eager runs it:
    Hugging Face's ``LlamaMLP``, GPT-NeoX's ``LLaMAParallelMLP``), or where ``fused`` and the activation is
    SiLU one SwiGLU kernel (registry ``fn`` ``swiglu``: reads both halves, writes the product; its backward reads
    the gradient and both halves and writes both gradients): Megatron-Core's ``bias_swiglu_impl``
    (``megatron/core/fusions/fused_bias_swiglu.py``, on under ``bias_activation_fusion``, the default of
    Megatron-LM's ``--no-bias-swiglu-fusion`` and of NeMo's Llama configs), Liger-Kernel's ``LigerSiLUMulFunction``,
    and every serving engine's ``silu_and_mul`` (vLLM ``SiluAndMul``, SGLang, TensorRT-LLM's fused MoE and MLP).
    Other gated activations (GeGLU) keep two kernels. Roles ``{prefix}act`` and ``{prefix}gate_mul``."""
    if gated and fused and fn == "silu":
        return [(f"{prefix}act", "elementwise", {"numel": numel, "fn": "swiglu"})]
    gate: list[RoleOp] = [(f"{prefix}gate_mul", "elementwise", {"numel": numel, "fn": "mul"})] if gated else []
    return [(f"{prefix}act", "elementwise", {"numel": numel, "fn": fn}), *gate]


def shared_expert_ops(arch: ArchSpec, *, tp: int, tokens: int, fused_swiglu: bool = False) -> list[RoleOp]:
    """The shared expert of an MoE block on one tensor-parallel rank: a gated MLP over every token with its
    intermediate width split over ``tp`` (column-parallel up, row-parallel down, as a dense MLP; Megatron-Core
    ``SharedExpertMLP``), its output added to the routed experts' before the block's TP reduction. With
    ``shared_expert_gate`` (transformers ``Qwen2MoeSparseMoeBlock``): ``sigmoid(x W_g)`` scales it, a
    ``hidden -> 1`` GEMM, the sigmoid and a product. ``fused_swiglu``: :func:`gated_activation_ops`."""
    if arch.shared_expert_ffn is None:
        return []
    ffn = arch.shared_expert_ffn // tp
    act = gated_activation_ops(
        "shared_", numel=tokens * ffn, fn=arch.activation, gated=arch.gated_mlp, fused=fused_swiglu
    )
    ops: list[RoleOp] = [
        ("shared_up", "gemm", {"b": 1, "m": tokens, "n": (2 if arch.gated_mlp else 1) * ffn, "k": arch.hidden}),
        *act,
        ("shared_down", "gemm", {"b": 1, "m": tokens, "n": arch.hidden, "k": ffn}),
    ]
    if arch.shared_expert_gate:
        ops += [
            ("shared_gate", "gemm", {"b": 1, "m": tokens, "n": 1, "k": arch.hidden}),
            ("shared_gate_sigmoid", "elementwise", {"numel": tokens, "fn": "sigmoid"}),
            ("shared_scale", "elementwise", {"numel": tokens * arch.hidden, "fn": "mul"}),
        ]
    return [*ops, ("shared_add", "elementwise", {"numel": tokens * arch.hidden, "fn": "add"})]


def routed_experts(arch: ArchSpec, *, tokens: int, ep: int = 1) -> tuple[int, int]:
    """``(experts, rows)`` of one rank's grouped expert GEMM for ``tokens`` tokens on each of the ``ep`` ranks
    of an expert-parallel group: the local experts that receive any token and the rows of each, with routing
    spread evenly over the experts. The group's ``ep * tokens`` tokens each pick ``experts_top_k`` distinct
    experts of ``n_experts``, so an expert receives none with probability ``(1 - top_k / n_experts) **
    (ep * tokens)`` (uniform routing; the occupancy of balls in bins) and the rank's ``n_experts / ep``
    experts, of which that share is expected idle, take its ``tokens * top_k`` assignments in equal rows.
    A grouped MoE GEMM reads the weights of the experts that have rows only (vLLM ``fused_moe`` skips empty
    expert blocks; Megatron-Core ``GroupedMLP`` / TE ``GroupedLinear`` run one GEMM per local expert with its
    ``tokens_per_expert`` rows): at decode batch sizes a fine-grained MoE touches a fraction of its experts
    (a batch of 16 tokens picking 8 of 128 experts reaches 82 of them), and in training every expert is busy,
    the balanced ``ceil(tokens * top_k * ep / n_experts)`` rows of each (Megatron's capacity-free dispatch)."""
    return expert_occupancy(experts=arch.n_experts, topk=arch.experts_top_k, tokens=tokens, ep=ep)


def expert_occupancy(*, experts: int, topk: int, tokens: int, ep: int = 1) -> tuple[int, int]:
    """:func:`routed_experts` of a layer given by its numbers: ``experts`` routed experts, ``topk`` a token."""
    local = experts // ep
    idle = (1.0 - topk / experts) ** (ep * tokens)
    busy = min(local, max(1, math.ceil(local * (1.0 - idle) - 1e-9)))
    return busy, -(-tokens * topk // busy)


def balanced_equivalent_tokens(moe: Mapping[str, int | bool | str]) -> int | None:
    """The tokens at which a fused MoE layer under balanced routing reaches as many experts as the ``moe`` op's
    ``tokens`` reach routed uniformly at random (:func:`expert_occupancy`), where that is fewer; None where it is not.
    The fused layer's learned model is fitted on AIConfigurator's balanced rows (``balanced_logits``: ``tokens x
    topk`` pairs spread over as many experts as they can reach, :func:`opcast.ops.moe_balanced_experts`), and a decode
    batch routed by a model reaches fewer: 32 tokens picking 4 of 128 experts reach all 128 balanced, about 82 at
    random (36 % fewer expert weights read, and decode reads little else). Asked at these tokens, the balanced kernel
    reads the weights a real batch does; its FLOPs fall too, which it does not feel: uniform routing leaves experts
    idle only while an expert gets under about ``ln(2 x experts)`` rows (5-7), far below any GPU's ridge point, and from
    there (some ``experts / topk x ln(2 x experts)`` tokens) both reach every local expert and the tokens are the op's
    own."""
    experts, topk, ep = int(moe["experts"]), int(moe["topk"]), int(moe["ep"])
    tokens = int(moe["tokens"])
    uniform, _ = expert_occupancy(experts=experts, topk=topk, tokens=-(-tokens // ep), ep=ep)
    balanced, _ = moe_balanced_experts(moe)
    if uniform >= balanced:
        return None
    return max(1, uniform * ep // topk)


def routed_expert_ops(moe: Mapping[str, int | bool | str], *, fused_swiglu: bool = False) -> list[RoleOp]:
    """The kernels of one rank's routed experts as grouped GEMMs, for the parameters of an ``moe`` op (the fused
    layer, :mod:`opcast.ops`): its ``tokens`` are the expert-parallel group's, of which each of the ``ep`` ranks
    routes ``ceil(tokens / ep)`` itself. The permutation of their ``topk`` copies, the up grouped GEMM over the
    experts that receive tokens (:func:`expert_occupancy`), the activation ``fn`` (and the gate multiply when
    ``gated``), the down grouped GEMM of ``inter`` (the expert's width on this rank) to ``hidden`` and the
    un-permutation. What training prices a block's experts as, and inference where no learned fused-MoE model
    covers its GPU and dtype (:func:`opcast.predict.cost.decompose` of the ``moe`` kernel). ``fused_swiglu``:
    :func:`gated_activation_ops`."""
    ep, topk, hidden, inter = int(moe["ep"]), int(moe["topk"]), int(moe["hidden"]), int(moe["inter"])
    tokens = -(-int(moe["tokens"]) // ep)
    gated, fn = bool(moe["gated"]), str(moe["fn"])
    b, rows = expert_occupancy(experts=int(moe["experts"]), topk=topk, tokens=tokens, ep=ep)
    routed = tokens * topk * hidden
    return [
        ("permute", "elementwise", {"numel": routed, "fn": "copy"}),
        ("mlp_up", "gemm", {"b": b, "m": rows, "n": (2 if gated else 1) * inter, "k": hidden}),
        *gated_activation_ops("", numel=b * rows * inter, fn=fn, gated=gated, fused=fused_swiglu),
        ("mlp_down", "gemm", {"b": b, "m": rows, "n": hidden, "k": inter}),
        ("unpermute", "elementwise", {"numel": routed, "fn": "copy"}),
    ]


@dataclass(frozen=True, slots=True)
class AttentionOps:
    """The ops of a block's attention around its core on one tensor-parallel rank: the projections before it
    (``before``: QKV, norms, rope), the core's head layout (``kv_heads``, ``head_dim``) and the ops between the
    core and the output projection (``after``), which reads ``proj_k`` channels; ``kv_write`` values a token
    go to the KV cache."""

    before: list[RoleOp]
    kv_heads: int
    head_dim: int
    after: list[RoleOp]
    proj_k: int
    kv_write: int


def attention_ops(
    arch: ArchSpec, *, tokens: int, heads: int, kv_heads: int, absorbed: bool = False, rows: int | None = None
) -> AttentionOps:
    """:class:`AttentionOps` of ``tokens`` tokens with ``heads`` / ``kv_heads`` heads on this rank; ``rows``
    (default ``tokens``): the rows multi-head latent attention's down projections and latent norms run on, the
    rank's sequence-parallel shard under sequence parallelism (Megatron-Core ``MLASelfAttention``: the
    duplicated ``linear_q_down_proj`` / ``linear_kv_down_proj`` read the local ``[s / TP, b, h]`` hidden states,
    and the column-parallel up projections, with their fused latent norms, gather the latents).

    Standard attention: the fused QKV GEMM, Qwen3's q/k norms (:func:`qk_norm_ops`), rope; K and V are
    written, ``2 kv_heads head_dim`` values a token.

    Multi-head latent attention (:attr:`ArchSpec.kv_lora_rank`; DeepSeek-V2, arXiv 2405.04434, Sec. 2.1;
    transformers ``DeepseekV3Attention``): ``q_a_proj`` / its RMSNorm / ``q_b_proj`` (or ``q_proj``),
    ``kv_a_proj_with_mqa`` to the latent and the shared rope key, the latent's RMSNorm, rope on the rotary parts
    (the key's one head), and the latent cached (``kv_lora_rank + qk_rope_head_dim`` values a token). Then either
    ``kv_b_proj`` expands the latent to every head's key and value (training and prefill: vLLM's
    ``_forward_prefill``), the core runs ``heads`` heads of queries/keys ``head_dim`` and values ``v_head_dim``
    wide, priced as one width of their mean (exact in FLOPs and bytes); or (``absorbed``: decode, vLLM's
    ``_forward_decode`` / FlashMLA) ``kv_b_proj``'s key half is folded into the queries (a batched GEMM per head
    to the latent width), the core attends every head to the one cached latent, priced as one KV head of half
    the cached width (the bytes it reads, once; its FLOPs are about twice that layout's, still below the
    ridge of every catalog GPU at decode), and the value half expands the per-head outputs."""
    if arch.kv_lora_rank is None:
        qkv: RoleOp = (
            "qkv",
            "gemm",
            {"b": 1, "m": tokens, "n": (heads + 2 * kv_heads) * arch.head_dim, "k": arch.hidden},
        )
        rope: list[RoleOp] = (
            [("rope", "rope", {"tokens": tokens, "heads": heads + kv_heads, "head_dim": arch.head_dim})]
            if arch.position == "rope"
            else []
        )
        before = [qkv, *qk_norm_ops(arch, tokens=tokens, heads=heads, kv_heads=kv_heads), *rope]
        return AttentionOps(before, kv_heads, arch.head_dim, [], heads * arch.head_dim, 2 * kv_heads * arch.head_dim)
    assert arch.qk_rope_head_dim is not None and arch.v_head_dim is not None
    h, c, r, v, ql = arch.hidden, arch.kv_lora_rank, arch.qk_rope_head_dim, arch.v_head_dim, arch.q_lora_rank
    down = tokens if rows is None else rows
    nope = arch.head_dim - r
    q_out = heads * arch.head_dim
    q: list[RoleOp] = (
        [("q_proj", "gemm", {"b": 1, "m": tokens, "n": q_out, "k": h})]
        if ql is None
        else [
            ("q_down", "gemm", {"b": 1, "m": down, "n": ql, "k": h}),
            ("q_down_norm", "rmsnorm", {"rows": down, "cols": ql}),
            ("q_up", "gemm", {"b": 1, "m": tokens, "n": q_out, "k": ql}),
        ]
    )
    before = [
        *q,
        ("kv_down", "gemm", {"b": 1, "m": down, "n": c + r, "k": h}),
        ("kv_down_norm", "rmsnorm", {"rows": down, "cols": c}),
        ("rope", "rope", {"tokens": tokens, "heads": heads + 1, "head_dim": r}),
    ]
    if not absorbed:
        before.append(("kv_up", "gemm", {"b": 1, "m": tokens, "n": heads * (nope + v), "k": c}))
        return AttentionOps(before, heads, (arch.head_dim + v) // 2, [], heads * v, c + r)
    before.append(("q_absorb", "gemm", {"b": heads, "m": tokens, "n": c, "k": nope}))
    after: list[RoleOp] = [("v_absorb", "gemm", {"b": heads, "m": tokens, "n": v, "k": c})]
    return AttentionOps(before, 1, (c + r) // 2, after, heads * v, c + r)


def _mlp_ops(arch: ArchSpec, tp: int, tokens: int) -> list[Op]:
    ffn = arch.ffn_hidden // tp
    up_n = (2 if arch.gated_mlp else 1) * ffn
    if arch.n_experts == 1:
        router: list[Op] = []
        batch, rows = 1, tokens
    else:  # experts batched in one grouped GEMM over the experts that receive tokens (:func:`routed_experts`)
        batch, rows = routed_experts(arch, tokens=tokens)
        router = [("gemm", {"b": 1, "m": tokens, "n": arch.n_experts, "k": arch.hidden})]
    act_numel = batch * rows * ffn
    gate: list[Op] = [("elementwise", {"numel": act_numel, "fn": "mul"})] if arch.gated_mlp else []
    return [
        *router,
        ("gemm", {"b": batch, "m": rows, "n": up_n, "k": arch.hidden}),
        ("elementwise", {"numel": act_numel, "fn": arch.activation}),
        *gate,
        ("gemm", {"b": batch, "m": rows, "n": arch.hidden, "k": ffn}),
        *((kind, params) for _, kind, params in shared_expert_ops(arch, tp=tp, tokens=tokens)),
    ]


def layer_ops(
    arch: ArchSpec, *, tp: int = 1, batch: int, seq: int, sp: bool = False, attention_impl: str = "flash"
) -> list[Op]:
    """Forward ops of ONE transformer block on one tensor-parallel rank, in execution order.

    Communication (all-reduce, or all-gather/reduce-scatter with ``sp``) is not listed. With
    ``tp > n_kv_heads`` each rank holds one replicated kv head. MoE layers list the router GEMM
    and one grouped GEMM each for up and down over the experts that receive tokens
    (:func:`routed_experts`: all of them but at small ``T``, ``ceil(T * top_k / n_experts)`` rows each), then
    the shared expert if any
    (:func:`shared_expert_ops`); token permutation is not listed. Qwen3's query/key norms follow the QKV
    GEMM (:func:`qk_norm_ops`).
    """
    if not isinstance(attention_impl, str) or not attention_impl:
        raise OpcastError(f"attention_impl={attention_impl!r} must be a kernel name such as flash")
    tokens, rows = _tokens(arch, tp, batch, seq, sp)
    heads, kv_heads = arch.n_heads // tp, max(1, arch.n_kv_heads // tp)
    residual = rows * arch.hidden
    norm: Op = (arch.norm, {"rows": rows, "cols": arch.hidden})
    add: Op = ("elementwise", {"numel": residual, "fn": "add"})
    at = attention_ops(arch, tokens=tokens, heads=heads, kv_heads=kv_heads)
    attention: list[Op] = [
        norm,
        *((kind, params) for _, kind, params in at.before),
        (
            "attention",
            {
                "batch": batch,
                "heads": heads,
                "kv_heads": at.kv_heads,
                "seq_q": seq,
                "seq_kv": seq,
                "head_dim": at.head_dim,
                "causal": True,
                "impl": attention_impl,
            },
        ),
        *((kind, params) for _, kind, params in at.after),
        ("gemm", {"b": 1, "m": tokens, "n": arch.hidden, "k": at.proj_k}),
        *_dropout(arch, residual),
    ]
    post = [norm] if arch.post_norms else []  # Gemma's norms on each sublayer's output
    attention += post
    mlp: list[Op] = [norm, *_mlp_ops(arch, tp, tokens), *_dropout(arch, residual), *post]
    if arch.parallel_residual:  # x + attn(ln1(x)) + mlp(ln2(x)): two adds at the end
        ops = [*attention, *mlp, add, add]
    else:
        ops = [*attention, add, *mlp, add]
    return [(kind, dict(params)) for kind, params in ops]


def model_ops(arch: ArchSpec, *, tp: int = 1, batch: int, seq: int, sp: bool = False) -> list[Op]:
    """Forward ops outside the blocks on one tensor-parallel rank: vocab-parallel embedding
    (plus the replicated position table when learned), final norm, LM head and vocab-parallel
    cross entropy, with the vocab padded by :func:`padded_vocab`."""
    tokens, rows = _tokens(arch, tp, batch, seq, sp)
    vocab = padded_vocab(arch.vocab, tp) // tp
    ops: list[Op] = [("embedding", {"tokens": tokens, "vocab": vocab, "hidden": arch.hidden})]
    if arch.position == "learned":
        ops += [
            ("embedding", {"tokens": tokens, "vocab": arch.max_seq, "hidden": arch.hidden}),
            ("elementwise", {"numel": tokens * arch.hidden, "fn": "add"}),
        ]
    ops += _dropout(arch, rows * arch.hidden)
    ops += [
        (arch.norm, {"rows": rows, "cols": arch.hidden}),
        ("gemm", {"b": 1, "m": tokens, "n": vocab, "k": arch.hidden}),
        ("cross_entropy", {"tokens": tokens, "vocab": vocab}),
    ]
    return ops


# ---------------------------------------------------------------------- presets and loading


def _presets_dir() -> Path:
    return data_path("archs")


def _read_json(path: Path) -> Any:
    return read_json_file(path, "the arch config")


def arch_from_dict(data: Any, origin: str) -> ArchSpec:
    """An ArchSpec from a preset-style mapping; unknown or missing keys raise naming ``origin``."""
    if not isinstance(data, dict):
        raise OpcastError(
            f"{origin}: expected a JSON object with the ArchSpec keys (or a Hugging Face config.json "
            f"with model_type), got {type(data).__name__}; see opcast arch show llama2-7b"
        )
    unknown = sorted(set(data) - set(_FIELD_TYPES))
    if unknown:
        raise OpcastError(f"{origin}: unknown key '{unknown[0]}' (valid keys: {', '.join(_FIELD_TYPES)})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise OpcastError(
            f"{origin}: missing key '{missing[0]}'" + (f" (and {', '.join(missing[1:])})" if len(missing) > 1 else "")
        )
    try:
        return ArchSpec(**data)
    except OpcastError as e:
        raise OpcastError(
            f"{origin}: {e}; fix these keys (opcast arch show llama2-7b prints a complete preset)"
        ) from None


def _normalise(name: str) -> str:
    """Spelling-insensitive key: ``Llama-2-7b``, ``meta-llama/Llama-2-7b-hf`` -> ``llama27b``."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"^meta-", "", key)
    key = re.sub(r"-hf$|-v\d+(\.\d+)*$", "", key)
    return re.sub(r"[^a-z0-9.]", "", key)


@cache
def _preset_index(directory: Path) -> dict[str, Path]:
    index: dict[str, Path] = {}
    for path in sorted(directory.glob("*.json")):
        key = _normalise(path.stem)
        if key in index:
            raise OpcastError(f"presets {index[key].name} and {path.name} have the same normalised name '{key}'")
        index[key] = path
    return index


def list_archs() -> list[str]:
    """Names of the bundled presets."""
    return sorted(p.stem for p in _presets_dir().glob("*.json"))


def load_arch(name_or_path: str | Path, *, given_as: str = "--arch") -> ArchSpec:
    """A preset by name (case- and separator-insensitive), a preset-style JSON file, or a
    Hugging Face ``config.json`` (or a folder holding one). ``given_as`` names where the user wrote it."""
    if not str(name_or_path).strip():  # Path("") is the current folder
        raise OpcastError(f"{given_as} is empty; give a preset name (opcast arch list), a preset JSON or a config.json")
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except OSError:  # e.g. a name too long to be a path: then it is no preset either
        exists = False
    if exists:
        return _load_path(path)
    text = str(name_or_path)
    if text.lower().endswith(".json"):
        link = link_problem(path)
        raise OpcastError(
            f"{text}{(' ' + link) if link else ': no such file'}; give an existing preset JSON or config.json, "
            "or a preset name (opcast arch list)"
        )
    found = _preset_index(_presets_dir()).get(_normalise(text))
    if found is None:
        raise OpcastError(
            f"unknown arch {_show(text)}; choose one of {', '.join(list_archs())}, "
            "or pass a preset JSON or a Hugging Face config.json"
        )
    return arch_from_dict(_read_json(found), str(found))


def _load_path(path: Path) -> ArchSpec:
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise OpcastError(
                f"{path}: folder has no config.json; give a preset name, a preset JSON or a "
                "Hugging Face config.json (or its folder)"
            )
        path = path / "config.json"
    data = _read_json(path)
    if isinstance(data, dict) and "model_type" in data:
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return arch_from_hf_config(data, name, origin=str(path))
    if isinstance(data, dict) and "n_layers" not in data and (hf_keys := sorted(_HF_MARKERS & data.keys())):
        raise OpcastError(
            f"{path}: a Hugging Face config without model_type (it has {', '.join(hf_keys)}); "
            f'add "model_type", one of {", ".join(HF_MODEL_TYPES)}'
        )
    return arch_from_dict(data, str(path))


_HF_MARKERS = frozenset(
    {"hidden_size", "num_attention_heads", "num_hidden_layers", "architectures", "n_embd", "n_layer"}
)
"""Keys of a Hugging Face config.json that no preset-style arch file has (presets say ``n_layers``, ``hidden``)."""


# ---------------------------------------------------------------------- Hugging Face configs

HF_MODEL_TYPES = (*(f for f in get_args(Family) if f not in ("gpt3", "megatron")), "kimi_k2", "gemma3_text")
"""``model_type`` values :func:`arch_from_hf_config` understands: the families but the two of papers' tables
(GPT-3, Megatron), and ``kimi_k2`` (DeepSeek-V3's architecture)."""

_HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_fast": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python": "gelu",
    "gelu_accurate": "gelu",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
_CHOICES["hf_activation"] = tuple(_HF_ACTIVATIONS)


class _HfConfig:
    """Typed key access on a config.json dict. Each accessor checks its value with
    :func:`value_problem` and records what is wrong instead of raising, so :meth:`raise_problems`
    reports every bad key of the file in one line; a bad value reads as a harmless placeholder."""

    _PLACEHOLDER: ClassVar[dict[type, Any]] = {int: 1, float: 1.0, bool: False, str: ""}

    def __init__(self, cfg: Mapping[str, Any], origin: str) -> None:
        self.cfg, self.origin = cfg, origin
        self.problems: list[str] = []
        self.bad: set[str] = set()
        """Keys whose value is missing or wrong (read as a placeholder)."""
        self.hf_activation: str | None = None
        """The transformers name of the activation :meth:`activation` read (``ACT2FN`` key)."""

    def _checked(self, key: str, value: Any, kind: type) -> Any:
        problem = value_problem(key, value, kind)
        if problem:
            self.problems.append(problem)
            self.bad.add(key)
            return self._PLACEHOLDER[kind]
        return value

    def req(self, *keys: str) -> int:
        """The size under the first of ``keys`` (aliases) present and not null."""
        for key in keys:
            if self.cfg.get(key) is not None:
                return self._checked(key, self.cfg[key], int)
        problem = f"missing key '{keys[0]}'" + (f" (or {', '.join(keys[1:])})" if len(keys) > 1 else "")
        if problem not in self.problems:  # a key read twice (the layer count by two rules) is named once
            self.problems.append(problem)
        self.bad.update(keys)
        return 1

    def get(self, key: str, default: Any, kind: type = int) -> Any:
        """The value of ``key`` (``default`` when absent or null), checked as ``kind``."""
        value = self.cfg.get(key)
        return default if value is None else self._checked(key, value, kind)

    def activation(self, key: str, default: str) -> Activation:
        act = self.cfg.get(key)
        if act is None:
            self.hf_activation = default
            return _HF_ACTIVATIONS[default]
        if not isinstance(act, str) or act not in _HF_ACTIVATIONS:
            self.problems.append(f"{key}={_show(act)} is not supported (use one of {', '.join(_HF_ACTIVATIONS)})")
            return _HF_ACTIVATIONS[default]
        self.hf_activation = act
        return _HF_ACTIVATIONS[act]

    def head_dim(self, hidden: int, heads: int) -> int:
        if self.cfg.get("head_dim") is not None:
            return self.get("head_dim", 1)
        sizes_ok = not self.bad & {"n_embd", "hidden_size", "n_head", "num_attention_heads"}
        if sizes_ok and hidden % heads:
            self.problems.append(f"hidden size {hidden} is not a multiple of the {heads} attention heads")
        return max(1, hidden // heads)

    def raise_problems(self) -> None:
        if self.problems:
            raise OpcastError(
                f"{self.origin}: "
                + "; ".join(self.problems)
                + " (sizes are integers >= 1, flags true or false); fix these keys of the config"
            )


_HF_NAMES = (
    "n_heads is num_attention_heads, n_kv_heads num_key_value_heads, n_experts the routed experts "
    "(num_local_experts, num_experts, n_routed_experts), experts_top_k num_experts_per_tok, expert_groups_top_k "
    "topk_group, dense_layers first_k_dense_replace"
)
"""How the arch fields that :class:`ArchSpec` checks across each other are spelled in a Hugging Face config."""


def _deepseek_fields(c: _HfConfig) -> dict[str, Any]:
    """The MLA and DeepSeekMoE fields of a DeepSeek-V2/V3 config (transformers ``DeepseekV3Config``; Kimi K2
    ships the same architecture as ``kimi_k2``): ``head_dim = qk_nope_head_dim + qk_rope_head_dim``, the
    ``n_shared_experts`` shared experts as one of their summed width, ungated, and the first
    ``first_k_dense_replace`` blocks dense (``intermediate_size``). A config with MoE blocks only every
    ``moe_layer_freq > 1`` blocks is refused, as opcast prices the blocks alike."""
    heads = c.req("num_attention_heads")
    rope, expert = c.req("qk_rope_head_dim"), c.req("moe_intermediate_size")
    dense = c.get("first_k_dense_replace", 0) if c.cfg.get("first_k_dense_replace") != 0 else 0
    freq = c.get("moe_layer_freq", 1)
    if freq != 1:
        c.problems.append(
            f"moe_layer_freq={freq}: MoE blocks between dense ones are not modelled (every block is priced "
            "alike); use moe_layer_freq 1"
        )
    shared = c.cfg.get("n_shared_experts")
    groups = c.get("n_group", 1) or 1
    chosen = c.get("topk_group", groups)
    if chosen > groups and not c.bad & {"n_group", "topk_group"}:
        c.problems.append(f"topk_group={chosen} exceeds n_group={groups}; give 1..n_group groups per token")
    limited = groups > 1 and chosen < groups
    experts = c.cfg.get("n_routed_experts")
    if limited and isinstance(experts, int) and experts % groups:
        c.problems.append(f"n_group={groups} does not divide n_routed_experts={experts}; give equal expert groups")
        limited = False
    return {
        "n_kv_heads": heads,
        "head_dim": c.req("qk_nope_head_dim") + rope,
        "kv_lora_rank": c.req("kv_lora_rank"),
        "q_lora_rank": c.get("q_lora_rank", None),
        "qk_rope_head_dim": rope,
        "v_head_dim": c.req("v_head_dim"),
        "n_experts": c.req("n_routed_experts"),
        "experts_top_k": c.req("num_experts_per_tok"),
        "ffn_hidden": expert,
        "shared_expert_ffn": None if not shared else c.get("n_shared_experts", 1) * expert,
        "dense_layers": dense or None,
        "dense_ffn_hidden": c.req("intermediate_size") if dense else None,
        "expert_groups": groups if limited else None,
        "expert_groups_top_k": chosen if limited else None,
        "fp8_block_checkpoint": _fp8_block_quantised(c),
    }


def _fp8_block_quantised(c: _HfConfig) -> bool:
    """Whether ``quantization_config`` says fp8 weights with block scales (``quant_method`` fp8 and a
    ``weight_block_size``: DeepSeek-V3's, Kimi K2's)."""
    quant = c.cfg.get("quantization_config")
    return isinstance(quant, dict) and quant.get("quant_method") == "fp8" and bool(quant.get("weight_block_size"))


def _windowed_blocks(c: _HfConfig, layers: int) -> int | None:
    """How many blocks ``layer_types`` marks ``sliding_attention`` (transformers' per-block attention types), or
    None when the config has no ``layer_types``; a malformed list is recorded as a problem."""
    types = c.cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or not all(t in ("sliding_attention", "full_attention") for t in types):
        c.problems.append(f"layer_types={_show(types)} must list 'sliding_attention' or 'full_attention' per block")
        return 1
    if len(types) != layers and "num_hidden_layers" not in c.bad:
        c.problems.append(f"layer_types lists {len(types)} blocks, num_hidden_layers={layers}; give one per block")
        return 1
    return sum(t == "sliding_attention" for t in types)


def _gemma_fields(c: _HfConfig, model_type: str) -> dict[str, Any]:
    """The fields of a Gemma 2 / Gemma 3 language model (transformers ``Gemma2Config`` / ``Gemma3TextConfig``;
    arXiv 2408.00118, 2503.19786): GeGLU (``hidden_activation``), four norms a block (:attr:`ArchSpec.post_norms`),
    tied embeddings, and sliding-window blocks: ``layer_types`` where given, else Gemma 2's every other block from
    the first and Gemma 3's all but every ``sliding_window_pattern``-th (6); Gemma 3 adds per-head q/k norms."""
    layers = c.req("num_hidden_layers")
    windowed = _windowed_blocks(c, layers)
    if windowed is None and model_type == "gemma2":  # transformers Gemma2: layer i slides when i is even
        windowed = (layers + 1) // 2
    elif windowed is None:  # Gemma 3: layer i slides unless (i + 1) is a multiple of the pattern
        pattern = c.get("sliding_window_pattern", 6)
        windowed = layers - layers // max(1, pattern)
    return {
        "activation": c.activation("hidden_activation", "gelu_pytorch_tanh"),
        "tied_embeddings": c.get("tie_word_embeddings", True, bool),
        "post_norms": True,
        "qk_norm": model_type != "gemma2",
        "sliding_window": c.req("sliding_window") if windowed else None,
        "sliding_window_layers": windowed or None,
    }


def _glm4_moe_fields(c: _HfConfig) -> dict[str, Any]:
    """The MoE fields of a GLM-4.5 config (transformers ``Glm4MoeConfig``; arXiv 2508.06471): DeepSeekMoE's
    layout with GQA attention, ``n_routed_experts`` experts of ``moe_intermediate_size``, ``n_shared_experts``
    shared ones (ungated, as one of their summed width), the first ``first_k_dense_replace`` blocks dense
    (``intermediate_size``), and per-head q/k norms when ``use_qk_norm``."""
    expert = c.req("moe_intermediate_size")
    dense = c.get("first_k_dense_replace", 0)
    shared = c.get("n_shared_experts", 0)
    return {
        "n_experts": c.req("n_routed_experts"),
        "experts_top_k": c.req("num_experts_per_tok"),
        "ffn_hidden": expert,
        "shared_expert_ffn": shared * expert or None,
        "dense_layers": dense or None,
        "dense_ffn_hidden": c.req("intermediate_size") if dense else None,
        "qk_norm": c.get("use_qk_norm", False, bool),
    }


def _gpt_oss_fields(c: _HfConfig) -> dict[str, Any]:
    """The fields of a gpt-oss config (transformers ``GptOssConfig``, OpenAI's gpt-oss model card, arXiv
    2508.10925): MoE with ``num_local_experts`` experts of ``intermediate_size``, biases on every projection and on
    the router (``attention_bias``), attention sinks, ``sliding_window`` on the blocks ``layer_types`` marks
    ``sliding_attention`` (every other one), and the experts in MXFP4 when ``quantization_config.quant_method`` is
    ``mxfp4`` (the released checkpoints)."""
    layers = c.req("num_hidden_layers")
    windowed = _windowed_blocks(c, layers)
    if windowed is None:  # transformers' default: even blocks sliding, odd blocks full
        windowed = (layers + 1) // 2
    quant = c.cfg.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method not in (None, "mxfp4"):
        c.problems.append(f"quantization_config.quant_method={_show(method)} is not supported (mxfp4 or none)")
    top_k = c.get("num_experts_per_tok", None) or c.req("experts_per_token")
    return {
        "n_experts": c.req("num_local_experts"),
        "experts_top_k": top_k,
        "linear_bias": c.get("attention_bias", True, bool),
        "attention_sinks": True,
        "sliding_window": c.req("sliding_window") if windowed else None,
        "sliding_window_layers": windowed or None,
        "expert_weights": "mxfp4" if method == "mxfp4" else None,
    }


def _every_block_moe(c: _HfConfig) -> None:
    """Record a problem unless every block of a Qwen MoE config is an MoE block (transformers
    ``Qwen3MoeDecoderLayer``: layer ``i`` is sparse when ``i not in mlp_only_layers`` and ``(i + 1) %
    decoder_sparse_step == 0``): opcast prices every block alike, and the released Qwen MoE models
    (Qwen1.5-MoE, Qwen2-57B-A14B, Qwen3-30B-A3B, Qwen3-235B-A22B) have no dense blocks."""
    step = c.get("decoder_sparse_step", 1)
    dense = c.cfg.get("mlp_only_layers") or []
    if step != 1 or dense:
        c.problems.append(
            f"decoder_sparse_step={step}, mlp_only_layers={_show(dense)}: blocks mixing dense and MoE MLPs are not "
            "modelled (every block is priced alike); use decoder_sparse_step 1 and mlp_only_layers [] to price "
            "every block as MoE"
        )


def arch_from_hf_config(cfg: Mapping[str, Any], name: str, *, origin: str | None = None) -> ArchSpec:
    """An ArchSpec from a Hugging Face ``config.json`` dict, using the transformers defaults
    for optional keys. Every key is type-checked (:func:`value_problem`) and every problem of the
    config is named in one :class:`OpcastError` starting with ``origin`` (the file; default
    ``config.json of NAME``). Simplifications (each noted in ``source``): GPT-NeoX partial rotary is
    treated as full rope; Qwen2's (and Qwen2-MoE's) QKV-only biases are not counted (``linear_bias`` False);
    OPT's ``word_embed_proj_dim`` projections are not modelled; Qwen's ``use_sliding_window`` is
    ignored. Mistral's ``sliding_window`` and gpt-oss's windowed blocks are read
    (:attr:`ArchSpec.sliding_window`). Qwen3 (dense and MoE) carries its per-head query/key norms
    (``qk_norm``); Qwen2-MoE its gated shared expert; a Qwen MoE config whose blocks are not all MoE is
    refused (:func:`_every_block_moe`)."""
    where = origin or f"config.json of {name}"
    if not isinstance(cfg, Mapping):
        raise OpcastError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        raise OpcastError(
            f"{where}: model_type={_show(model_type)} is not supported; supported: {', '.join(HF_MODEL_TYPES)}"
        )
    if model_type == "gemma3" and "text_config" in cfg and not isinstance(cfg["text_config"], Mapping):
        # it was read as a flat config, and each of its keys reported missing (num_hidden_layers twice)
        raise OpcastError(
            f"{where}: text_config={_show(cfg['text_config'])} must be a JSON object (Gemma 3's language model: "
            "hidden_size, num_hidden_layers, ...); give the object, or the text model's own config.json"
        )
    if model_type == "gemma3" and isinstance(cfg.get("text_config"), Mapping):  # Gemma 3's multimodal config
        cfg = {**cfg["text_config"], "model_type": "gemma3_text", "_name_or_path": cfg.get("_name_or_path")}
        model_type = "gemma3_text"
    c = _HfConfig(cfg, where)
    label = cfg.get("_name_or_path") if isinstance(cfg.get("_name_or_path"), str) and cfg.get("_name_or_path") else name
    source = f"Hugging Face config.json ({label})"
    if model_type == "gpt2":
        hidden, heads = c.req("n_embd", "hidden_size"), c.req("n_head", "num_attention_heads")
        fields_: dict[str, Any] = dict(
            n_layers=c.req("n_layer", "num_hidden_layers"),
            ffn_hidden=c.get("n_inner", 4 * hidden),
            max_seq=c.req("n_positions", "n_ctx"),
            norm="layernorm",
            gated_mlp=False,
            position="learned",
            activation=c.activation("activation_function", "gelu_new"),
            tied_embeddings=c.get("tie_word_embeddings", True, bool),
            linear_bias=True,
            parallel_residual=False,
        )
    elif model_type == "gpt_neox":
        hidden, heads = c.req("hidden_size"), c.req("num_attention_heads")
        fields_ = dict(
            n_layers=c.req("num_hidden_layers"),
            ffn_hidden=c.req("intermediate_size"),
            max_seq=c.req("max_position_embeddings"),
            norm="layernorm",
            gated_mlp=False,
            position="rope",
            activation=c.activation("hidden_act", "gelu"),
            tied_embeddings=c.get("tie_word_embeddings", False, bool),
            linear_bias=c.get("attention_bias", True, bool),
            parallel_residual=c.get("use_parallel_residual", True, bool),
        )
        rotary = c.get("rotary_pct", 0.25, float)
        if rotary != 1:
            source += f"; rotary_pct={rotary} treated as full rope"
    elif model_type == "opt":
        hidden, heads = c.req("hidden_size"), c.req("num_attention_heads")
        fields_ = dict(
            n_layers=c.req("num_hidden_layers"),
            ffn_hidden=c.req("ffn_dim"),
            max_seq=c.req("max_position_embeddings"),
            norm="layernorm",
            gated_mlp=False,
            position="learned",
            activation=c.activation("activation_function", "relu"),
            tied_embeddings=c.get("tie_word_embeddings", True, bool),
            linear_bias=c.get("enable_bias", True, bool),
            parallel_residual=False,
        )
        proj = c.get("word_embed_proj_dim", hidden)
        if proj != hidden:
            source += f"; word_embed_proj_dim={proj} != hidden_size={hidden}: project_in/out not modelled"
    else:  # llama, mistral, qwen2, mixtral: pre-RMSNorm, rope, gated MLP (gate_proj/up_proj/down_proj)
        hidden, heads = c.req("hidden_size"), c.req("num_attention_heads")
        fields_ = dict(
            n_layers=c.req("num_hidden_layers"),
            n_kv_heads=c.get("num_key_value_heads", heads),
            ffn_hidden=c.req("intermediate_size"),
            max_seq=c.req("max_position_embeddings"),
            norm="rmsnorm",
            gated_mlp=True,
            position="rope",
            activation=c.activation("hidden_act", "silu"),
            tied_embeddings=c.get("tie_word_embeddings", False, bool),
            linear_bias=c.get("attention_bias", False, bool) if model_type == "llama" else False,
            parallel_residual=False,
        )
        if model_type in ("qwen2", "qwen2_moe"):
            source += "; QKV biases not counted"
        if model_type == "mistral" and c.cfg.get("sliding_window") is not None:  # Mistral-7B-v0.1: every block
            fields_.update(sliding_window=c.get("sliding_window", None))
        if model_type in ("qwen3", "qwen3_moe", "qwen2_moe") and c.get("use_sliding_window", False, bool):
            source += "; use_sliding_window ignored (every layer priced with full attention)"
        if model_type == "mixtral":
            fields_.update(n_experts=c.req("num_local_experts"), experts_top_k=c.req("num_experts_per_tok"))
        if model_type in ("qwen3", "qwen3_moe"):  # transformers Qwen3Config / Qwen3MoeConfig: head_dim 128 by default
            fields_.update(head_dim=c.get("head_dim", 128), qk_norm=True)
        if model_type in ("qwen3_moe", "qwen2_moe"):
            fields_.update(
                n_experts=c.req("num_experts"),
                experts_top_k=c.req("num_experts_per_tok"),
                ffn_hidden=c.req("moe_intermediate_size"),
            )
            _every_block_moe(c)
        if model_type == "qwen2_moe":
            fields_.update(shared_expert_ffn=c.req("shared_expert_intermediate_size"), shared_expert_gate=True)
        if model_type in ("gemma2", "gemma3", "gemma3_text"):
            fields_.update(_gemma_fields(c, model_type))
            source += "; vision tower and logit soft-capping not modelled"
        if model_type == "glm4_moe":
            fields_.update(_glm4_moe_fields(c))
            source += "; QKV biases not counted; partial rotary treated as full rope; MTP layers not modelled"
        if model_type == "gpt_oss":
            fields_.update(_gpt_oss_fields(c))
            source += "; SwiGLU clamp and alpha priced as silu"
        if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
            fields_.update(_deepseek_fields(c))
            source += "; multi-token-prediction layers (num_nextn_predict_layers) not modelled"
    # dropout as transformers applies it in training (each model's defaults when the key is absent)
    if model_type == "gpt2":
        attn_p, hidden_p = c.get("attn_pdrop", 0.1, float), c.get("resid_pdrop", 0.1, float)
    elif model_type == "gpt_neox":
        attn_p, hidden_p = c.get("attention_dropout", 0.0, float), c.get("hidden_dropout", 0.0, float)
    elif model_type == "opt":
        attn_p, hidden_p = c.get("attention_dropout", 0.0, float), c.get("dropout", 0.1, float)
    else:  # llama family: attention dropout only (default 0), no hidden dropout
        attn_p, hidden_p = c.get("attention_dropout", 0.0, float), 0.0
    fields_.update(attention_dropout=float(attn_p), hidden_dropout=float(hidden_p))
    fields_.setdefault("n_kv_heads", heads)
    fields_.setdefault("head_dim", c.head_dim(hidden, heads))
    fields_.update(hidden=hidden, n_heads=heads)
    # Kimi K2 is DeepSeek-V3's architecture; gemma3_text is Gemma 3's language model
    family = {"kimi_k2": "deepseek_v3", "gemma3_text": "gemma3"}.get(model_type, model_type)
    fields_.update(name=name, family=family, vocab=c.req("vocab_size"), source=source)
    fields_.update(hf_activation=c.hf_activation)
    c.raise_problems()
    try:
        return ArchSpec(**fields_)
    except OpcastError as e:  # the arch's field names; say which keys of the config they come from
        raise OpcastError(f"{where}: {e}; fix these keys of the config ({_HF_NAMES})") from None
