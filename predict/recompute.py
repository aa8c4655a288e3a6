"""Activation recomputation: the ``--recompute`` spelling and which submodules of a block it recomputes.

``none``, ``full`` (every block from its input; Korthikanti et al. 2022, arXiv 2205.05198, Sec. 5) and
``selective`` as before, plus Megatron-Core's selective submodules, spelled ``selective:MODULE[+MODULE...]``
(``--recompute-granularity selective --recompute-modules ...``; ``TransformerConfig.recompute_modules``,
megatron/core/transformer/transformer_config.py). ``selective`` alone is Megatron's default list,
``core_attn``. What each module recomputes, as Megatron-Core documents it:

- ``core_attn``: the core attention (normal checkpointing): the score and softmax tensors are not kept.
- ``moe_act``: the MoE experts' activation function (output-discarding checkpointing,
  ``CheckpointWithoutOutput`` in ``moe/experts.py``): the activation's output, the down projection's input,
  is freed after the down projection and rebuilt in backward from the kept activation input.
- ``layernorm``: ``input_layernorm`` and ``pre_mlp_layernorm`` (output-discarding), where they are modules of
  their own: an MoE block's pre-MLP norm (its output feeds the router and the dispatcher) and an MLA block's
  input norm (it feeds the two down projections). A norm that Transformer Engine fuses into the next linear
  (``TELayerNormColumnParallelLinear``: the dense blocks' QKV and MLP-up) is not a module, so nothing is freed.
- ``mla_up_proj``: multi-latent attention's up projections and RoPE (output-discarding,
  ``qkv_up_checkpoint`` in ``multi_latent_attention.py``): the per-head Q, K and V are freed after the
  core attention and rebuilt from the kept latents.
- ``mlp``: a dense block's MLP (normal checkpointing): only its input is kept.
- ``moe``: an MoE block's MoE layer, router, dispatch, experts and shared expert (normal checkpointing): only
  its input is kept; the recompute repeats the token all-to-alls.
- ``shared_experts``: the shared expert of an MoE block (normal checkpointing).

A module that has nothing to act on in an arch (``mla_up_proj`` without MLA, ``mlp`` in an MoE arch, whose
dense first blocks opcast times as MoE blocks) recomputes nothing, as in Megatron-Core.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

RECOMPUTE_MODULES: Final[tuple[str, ...]] = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
)
"""Megatron-Core's ``recompute_modules`` choices, in its order (the canonical spelling's order)."""

DEFAULT_MODULES: Final[frozenset[str]] = frozenset({"core_attn"})
"""What ``selective`` recomputes (Megatron-Core's default ``recompute_modules``)."""

Recompute = Literal["none", "selective", "full"]
"""The recomputation modes (``selective`` also takes modules: ``selective:MODULE[+MODULE...]``)."""
MODES: Final[tuple[str, ...]] = get_args(Recompute)

RECOMPUTE_HELP: Final[str] = (
    "none, selective (the attention core), full (every block from its input), or "
    "selective:MODULE[+MODULE...] with Megatron-Core's --recompute-modules, MODULE one of "
    + ", ".join(RECOMPUTE_MODULES)
    + " (e.g. selective:mla_up_proj+moe_act)."
)


def recompute_problem(value: str) -> str | None:
    """Why ``value`` is not a ``--recompute`` spelling, or None."""
    if not isinstance(value, str):
        return f"recompute={value!r} must be a string: {RECOMPUTE_HELP}"
    mode, sep, rest = value.partition(":")
    if not sep:
        return None if mode in MODES else f"recompute={value!r} is not one of {', '.join(MODES)} or selective:MODULES"
    if mode != "selective":
        return f"recompute={value!r}: only selective takes modules (selective:{rest})"
    names = rest.split("+")
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if bad:
        what = f"{', '.join(repr(n) for n in bad)} is not a recompute module" if rest else "names no module"
        return f"recompute={value!r} {what}; give selective:MODULE[+MODULE...] with MODULE one of " + ", ".join(
            RECOMPUTE_MODULES
        )
    if len(set(names)) != len(names):
        return f"recompute={value!r} names a module twice"
    return None


def canonical_recompute(value: str) -> str:
    """One spelling of a valid ``--recompute`` value: its modules in Megatron-Core's order, and ``selective`` for
    ``selective:core_attn`` (Megatron-Core's default list), so that two spellings of one choice are one choice."""
    mods = recompute_modules(value)
    if not mods or mods == DEFAULT_MODULES:
        return value.partition(":")[0]
    return "selective:" + "+".join(m for m in RECOMPUTE_MODULES if m in mods)


def recompute_rank(value: str) -> int:
    """How much a valid ``--recompute`` value recomputes, coarsely: none 0, selective (any modules) 1, full 2."""
    return MODES.index(value.partition(":")[0])


def recompute_modules(value: str) -> frozenset[str]:
    """The submodules a valid ``--recompute`` value recomputes selectively (empty for none and full)."""
    mode, sep, rest = value.partition(":")
    if mode != "selective":
        return frozenset()
    return frozenset(rest.split("+")) if sep else DEFAULT_MODULES


_MOE_LAYER_ROLES: Final = frozenset({"router", "permute", "mlp_up", "act", "gate_mul", "mlp_down", "unpermute"})
_SHARED_EXPERT_ROLES: Final = frozenset({"shared_up", "shared_act", "shared_gate_mul", "shared_down"})


def recomputed_roles(mods: frozenset[str], *, moe: bool, mla: bool) -> frozenset[str]:
    """The roles of a block's forward kernels (:func:`opcast.predict.graph.block_ops`; an fp8 linear's
    quantisation kernels share their linear's role) that selective recomputation of ``mods`` runs again in
    backward (the module docstring)."""
    roles: set[str] = set()
    if "core_attn" in mods:
        roles |= {"attn", "attn_cp"}
    if "layernorm" in mods:
        roles |= ({"norm2"} if moe else set()) | ({"norm1"} if mla else set())
    if "mla_up_proj" in mods and mla:
        roles |= {"q_up", "q_proj", "kv_up", "rope"}
    if "mlp" in mods and not moe:
        roles |= {"norm2", "mlp_up", "act", "gate_mul", "mlp_down"}
    if moe and "moe_act" in mods:
        roles |= {"act", "gate_mul"}
    if moe and "moe" in mods:
        roles |= _MOE_LAYER_ROLES | _SHARED_EXPERT_ROLES | {"shared_add"}
    if moe and "shared_experts" in mods:
        roles |= _SHARED_EXPERT_ROLES
    return frozenset(roles)
