"""Arch -> op graph: the per-rank kernels and collectives of one transformer block and of the
model-level ops (embedding, LM head, cross entropy), forward, backward and recomputation.

Shapes follow Megatron-LM tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3):
QKV and MLP-up column-parallel, out-proj and MLP-down row-parallel, heads sharded; with sequence
parallelism (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.2.2) norms, dropouts and residual
adds see ``T / tp`` rows and the two all-reduces per block and direction become an all-gather and
a reduce-scatter. For a dense arch without context parallelism the forward list equals
:func:`opcast.archs.layer_ops` / :func:`opcast.archs.model_ops` (a test holds them together), so
predictions use exactly the shapes ``collect bench --arch`` measures.

Extensions over ``layer_ops``:

- **Context parallelism** (ring attention with the load-balanced causal split of Megatron-Core /
  Transformer Engine: the sequence in ``2 cp`` chunks, rank r holding chunks r and 2cp-1-r): each
  rank runs one causal block of ``S/cp`` queries against its own ``S/cp`` keys and ``cp - 1``
  non-causal blocks of ``S/cp`` queries against ``S/(2cp)`` keys, i.e. exactly ``1/cp`` of the
  causal work; the K/V chunks travel around the ring by send/recv overlapped with those blocks.
- **MoE** with expert parallelism: router GEMM, token permutation and un-permutation (copies),
  all-to-all dispatch and combine over the EP group, and one grouped GEMM each for up and down over
  the ``n_experts / ep`` local experts with balanced routing (``ceil(T * top_k * ep / n_experts)``
  rows each; at small ``T``, over the experts expected to receive tokens, :func:`opcast.archs.routed_experts`),
  then the shared expert (:func:`opcast.archs.shared_expert_ops`); expert tensor parallelism equals ``tp``.
- **Backward**: a GEMM ``C = A @ B`` becomes its data-gradient ``dA = dC @ B^T`` and weight-gradient
  ``dB = A^T @ dC`` GEMMs; the other kinds use their registry backward kernel; identities (residual
  adds, copies) have none.
- **Recomputation**: ``selective`` recomputes the attention core (Korthikanti et al. Sec. 5),
  ``full`` the whole block forward, its collectives included, once per micro-batch.
- **Hugging Face eager** (``--framework hf``): transformers' modules as torch eager runs them, op by
  op: a multi-kernel activation module (``gelu_new``) as its kernels and autograd's, and around
  GPT-2's / OPT's eager attention core the modeling code's head copies and probability dropout
  (:func:`hf_activation_ops`, :func:`hf_attention_ops`).
- **fp8** (Transformer Engine): the block's linears run in fp8 (:data:`FP8_LINEARS`, MLA's included; the LM
  head and the router stay bf16), each with the cast / transpose kernels TE runs around it
  (:func:`fp8_quantisation`), in forward, backward and a full recomputation; with sequence
  parallelism their all-gathers move fp8 (:func:`block_comms`). Megatron's once-per-iteration weight
  casts (:func:`weight_casts`) and delayed scaling's amax all-reduces (:func:`fp8_amax_bytes`) are stage
  terms, priced in :mod:`opcast.predict.training`; current scaling (``--fp8-recipe current``) adds an amax
  pass and a scale kernel to each cast and all-reduces the amax of each fp8-gathered tensor over the
  tensor-parallel group (:func:`fp8_amax_comms`). On datacenter Blackwell the fp8 GEMMs take every layout
  and Transformer Engine 2.x writes no fp8 transposes (:func:`fp8_gemm_transposes`).
- **mxfp8 / nvfp4** (Transformer Engine's ``MXFP8BlockScaling`` / ``NVFP4BlockScaling``): the same
  linears run their forward, data- and weight-gradient GEMMs at the kernel dtype ``fp8_block`` /
  ``nvfp4`` (:func:`opcast.dtypes.gemm_dtype`), MXFP8's priced in training as cuBLASLt's per-tensor fp8
  GEMM (:data:`TE_GEMM_KERNELS`); the sequence-parallel all-gathers move their own format (:func:`block_comms`);
  the quantisation kernels and weight casts are priced as for fp8 (:func:`quantised`), and neither reduces
  amaxes (:func:`delayed_amax_reduction`). NVFP4's
  default is every block linear in FP4, all three GEMMs: TE's ``NVFP4BlockScaling`` quantises the
  inputs of fprop, dgrad and wgrad (``fp4_quant_fwd_inp``, ``fp4_quant_fwd_weight``,
  ``fp4_quant_bwd_grad``; ``backward_override`` None), attention stays unquantised (``fp8_dpa``
  False), and Megatron-Bridge's ``bf16_with_nvfp4_mixed`` recipe keeps no block in BF16
  (``first_last_layers_bf16`` off). The NVFP4 paper (arXiv 2509.25149, its "selective
  high-precision layers") keeps about 16 % of the linear layers, its last blocks', in BF16 for
  accuracy: an opt-in of those recipes (``first_last_layers_bf16``, ``num_layers_at_end_in_bf16``)
  not modelled here, so such a run is a little slower than priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from opcast.archs import (
    ArchSpec,
    attention_ops,
    gated_activation_ops,
    padded_vocab,
    routed_expert_ops,
    shared_expert_ops,
)
from opcast.dtypes import QUANTISED_PRECISIONS, dtype_bytes, element_bytes, gemm_dtype
from opcast.hardware import DeviceSpec
from opcast.ops import FLASH2_OWN_ARCHITECTURES, get_op, uses_tensor_cores
from opcast.predict.cost import Kernel, kernel
from opcast.predict.frameworks import FRAMEWORKS, framework_of
from opcast.predict.memory import activation_dtype
from opcast.predict.recompute import recompute_modules, recomputed_roles

FWD, BWD, RECOMPUTE = "forward", "backward", "recompute"


@dataclass(frozen=True, slots=True)
class Node:
    """One kernel of the graph, repeated ``count`` times per micro-batch."""

    role: str
    """What it is in the block: qkv, attn, mlp_up, ... (``.dgrad`` / ``.wgrad`` / ``.bwd`` in backward)."""
    kernel: Kernel
    count: int = 1


@dataclass(frozen=True, slots=True)
class Comm:
    """One collective of the graph, repeated ``count`` times per micro-batch."""

    role: str
    """tp, cp, ep (per block), embed_tp, head_tp, ce_tp (model level)."""
    kind: str
    """Collective kind (registry name)."""
    bytes: int
    """nccl-tests size."""
    count: int = 1
    overlap_with: str | None = None
    """Role of the kernel this collective is hidden behind, when it is (exposed = max(0, comm - kernel))."""


@dataclass(frozen=True, slots=True)
class Graph:
    """Per-rank work of one micro-batch in each phase."""

    nodes: dict[str, tuple[Node, ...]]
    comms: dict[str, tuple[Comm, ...]]


@dataclass(frozen=True, slots=True)
class Dtypes:
    """Which dtype each kind of kernel runs in."""

    matrix: str
    """GEMMs (the quantised linears' kernel dtype when training in fp8, mxfp8 or nvfp4: fp8, fp8_block, nvfp4)."""
    act: str
    """Attention, norms, pointwise ops and activations saved for backward."""
    tensor_cores: bool | None = None
    """Matrix math on tensor cores; None: by dtype (fp32 on CUDA cores, the rest on tensor cores)."""
    impls: tuple[tuple[str, str], ...] = FRAMEWORKS[None].impls
    """(op kind, registry ``impl``) the framework runs (:mod:`opcast.predict.frameworks`); a kernel
    whose params name an ``impl`` keeps it, but for attention's ``flash`` (the ``--attention`` default,
    FlashAttention-2/3), which the framework's attention implementation replaces (foundry: ``flash1``)."""
    fp8_gemm_impl: str | None = None
    """The kernel family (``impl``, :data:`opcast.ops.GEMM_IMPLS`) of the per-tensor fp8 GEMMs where it is not the
    registry default: a serving engine's own (:data:`opcast.predict.serve.engine.ENGINE_GEMM_FAMILIES`)."""
    fp8_modules: str = "megatron"
    """fp8 only: how the framework calls Transformer Engine (:func:`fp8_quantisation`). ``megatron``
    (Megatron-Core): QKV and MLP-up are ``LayerNormLinear`` (the norm writes fp8) and the weights are
    cast once per iteration (``is_first_microbatch``); ``linear``: every layer a plain ``te.Linear``
    called without ``is_first_microbatch`` (TE's default; llm-foundry's ``fc_type: te``), so the
    weights are cast every micro-batch."""
    framework: str | None = None
    """The ``--framework`` (None: not given); decides the kernels of the block's modules where the
    framework runs them op by op (``hf``: :func:`block_ops`)."""
    fp8_recipe: str = "delayed"
    """Per-tensor fp8 only (``matrix`` fp8; block-scaled runs keep ``delayed``): Transformer Engine's scaling
    recipe, ``delayed`` or ``current`` (:func:`fp8_quantisation`)."""
    fp8_transposes: bool = True
    """Per-tensor fp8 only: whether the device's fp8 GEMM takes only the TN layout, so that Transformer Engine
    writes fp8 transposes for the gradient GEMMs (:func:`fp8_gemm_transposes`); True for block-scaled runs
    (their quantisers always write a second, column-wise copy)."""
    te_gemms: bool = False
    """The quantised linears' GEMMs are Transformer Engine's (training): each is priced as the kernel of
    :data:`TE_GEMM_KERNELS` (MXFP8's as cuBLASLt's per-tensor fp8 GEMM); inference engines' block-scaled
    GEMMs keep their own kernel dtype."""
    flash2_own: bool = False
    """FlashAttention-2 (``flash2``) is a kernel family of its own on the device (Hopper, Blackwell:
    :data:`FLASH2_OWN_ARCHITECTURES`); elsewhere a ``flash2`` kernel is priced as ``flash``."""
    kv: str | None = None
    """The KV cache's dtype where it is not ``act`` (inference ``kv_dtype``). A prompt's attention runs in it
    (TensorRT-LLM's FP8 FMHA over an fp8 cache: the measured attention rows of that dtype). A decode step's attention
    keeps ``act`` queries over the cache (AIConfigurator's generation rows: bf16 attention over an fp8 or a bf16
    cache), memory-bound on the cache it reads: priced as the ``act`` kernel over the keys whose bytes it reads
    (``seq_kv`` scaled by the bytes ratio, half for fp8 under bf16). On B200 those rows time fp8 over bf16 caches
    at 0.65, 0.59 and 0.55x for batch 64 at 1k, 2k and 4k cached tokens, and at 1.0x for batch 1, where the launch
    sets the time (``systems/data/b200_sxm/attention/trtllm/1.3.0rc20/generation_attention_perf.parquet``); an engine
    whose decode kernel gains less over an fp8 cache says so in :attr:`kv_decode_fraction`."""
    kv_decode_fraction: float | None = None
    """The share of the cached keys a decode step's attention over a :attr:`kv` cache is priced over (the ``act``
    kernel's ``seq_kv`` scaled by it); None: the bytes ratio (:func:`opcast.predict.serve.engine.fp8_kv_decode_fraction`
    sets it where an engine's kernel is measured to gain less)."""
    moe_matrix: str | None = None
    """The fused MoE layer's GEMM dtype where it differs from :attr:`matrix`: ``fp8_block`` for MXFP4 experts run
    against MXFP8 activations (:data:`opcast.predict.serve.engine.MXFP4_MOE`); None: :attr:`matrix`."""
    fused_swiglu: bool = False
    """A SiLU-gated activation runs as one kernel (:func:`opcast.archs.gated_activation_ops`): the framework's
    (:attr:`opcast.predict.frameworks.Framework.fused_swiglu`) unless the run says otherwise."""

    def of(self, kind: str, params: dict, direction: str = "fwd") -> Kernel:
        for k, impl in self.impls:
            if k == kind and ("impl" not in params or (kind == "attention" and params["impl"] == "flash")):
                params = {**params, "impl": impl}
                break
        if kind == "attention" and params.get("impl") == "flash2" and not self.flash2_own:
            params = {**params, "impl": "flash"}
        if kind == "moe":  # an inference engine's fused MoE layer: its grouped GEMMs' dtype
            return kernel(kind, params, self.moe_matrix or self.matrix, direction, self.tensor_cores)
        if kind == "gemm":
            matrix = TE_GEMM_KERNELS.get(self.matrix, self.matrix) if self.te_gemms else self.matrix
            if self.fp8_gemm_impl is not None and matrix == "fp8" and "impl" not in params:
                params = {**params, "impl": self.fp8_gemm_impl}
            return kernel(kind, params, matrix, direction, self.tensor_cores)
        if kind == "attention" and self.kv is not None:
            if params["seq_q"] == 1:  # decode: act queries over the cache, memory-bound on its bytes
                ratio = self.kv_decode_fraction or element_bytes(self.kv) / element_bytes(self.act)
                params = {**params, "seq_kv": max(1, math.ceil(params["seq_kv"] * ratio))}
                return kernel(kind, params, self.act, direction, self.tensor_cores)
            return kernel(kind, params, self.kv, direction, self.tensor_cores)
        if kind == "attention":
            return kernel(kind, params, self.act, direction, self.tensor_cores)
        return kernel(kind, params, self.act, direction, False)

    def peak_tensor_cores(self) -> bool:
        """Whether the GEMMs' peak is a tensor-core one (for MFU)."""
        return uses_tensor_cores("gemm", self.matrix, self.tensor_cores)


def precision_of(
    precision: str,
    tensor_cores: bool | None = None,
    framework: str | None = None,
    *,
    fp8_recipe: str = "delayed",
    device: DeviceSpec | None = None,
    training: bool = False,
    rope_fusion: bool | None = None,
    swiglu_fusion: bool | None = None,
) -> Dtypes:
    """The dtypes of a run in ``precision`` and the kernel implementations of ``framework`` (None: the default),
    its rope one kernel or torch's ops and its SwiGLU one kernel or two where ``rope_fusion`` / ``swiglu_fusion``
    say (None: the framework's);
    for per-tensor fp8 the scaling ``fp8_recipe`` and whether ``device``'s fp8 GEMMs need fp8 transposes
    (:func:`fp8_gemm_transposes`; None: they do, as on Hopper); with ``training``, the quantised linears'
    GEMMs are Transformer Engine's (:attr:`Dtypes.te_gemms`). FlashAttention-2 is a family of its own on
    ``device`` where it is Hopper or Blackwell (:attr:`Dtypes.flash2_own`; None: it is not)."""
    per_tensor = gemm_dtype(precision) == "fp8"
    fw = framework_of(framework)
    impls = fw.impls
    if rope_fusion is not None:
        impls = (*((k, i) for k, i in impls if k != "rope"), ("rope", "fused" if rope_fusion else "unfused"))
    return Dtypes(
        matrix=gemm_dtype(precision),
        act=activation_dtype(precision),
        tensor_cores=tensor_cores,
        impls=impls,
        fp8_modules="megatron" if framework in (None, "megatron") else "linear",
        framework=framework,
        fp8_recipe=fp8_recipe if per_tensor else "delayed",
        fp8_transposes=fp8_gemm_transposes(device) if per_tensor and device is not None else True,
        te_gemms=training,
        flash2_own=device is not None and device.architecture in FLASH2_OWN_ARCHITECTURES,
        fused_swiglu=fw.fused_swiglu if swiglu_fusion is None else swiglu_fusion,
    )


# --------------------------------------------------------------------------- forward lists

Op = tuple[str, str, dict, int]
"""(role, kind, params, count)."""


# --------------------------------------------------------------------------- Hugging Face eager modules

ExplicitBwd = tuple[tuple[str, str], ...]
"""(elementwise ``fn``, registry direction) of each kernel autograd runs for one forward op, over the
forward op's ``numel``."""

HF_EAGER_ACTIVATIONS: dict[str, tuple[tuple[str, str, ExplicitBwd], ...]] = {
    # transformers 4.38.1 (NeuSight's setup.py pin) src/transformers/activations.py, NewGELUActivation:
    #   0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))
    # torch eager runs one kernel per operator, in Python's evaluation order (an FX/aten trace of HF
    # GPT-2 lists exactly: mul(x, 0.5), pow(x, 3.0), mul(., 0.044715), add(x, .), mul(., 0.79788), tanh,
    # add(1.0, .), mul(., .)). Backward is autograd's nodes for them (torch 2.1, NeuSight's tested
    # version; tools/autograd/derivatives.yaml): MulBackward1 (scalar) grad * c; PowBackward0
    # pow_backward = grad * (3 * x.pow(2)), three kernels; AddBackward0/1 pass the gradient on, no
    # kernel; TanhBackward0 tanh_backward(grad, y); MulBackward0 grad * other and grad * self, two
    # kernels; and x's three gradients (from 0.5 * x, pow and x + .) summed by the engine's
    # InputBuffer, two adds (listed with the add that uses x).
    "gelu_new": (
        ("act.half_x", "mul_scalar", (("mul_scalar", "fwd"),)),
        ("act.cube", "pow_scalar", (("pow_scalar", "fwd"), ("mul_scalar", "fwd"), ("mul", "fwd"))),
        ("act.mul_a", "mul_scalar", (("mul_scalar", "fwd"),)),
        ("act.add_x", "add", (("add", "fwd"), ("add", "fwd"))),
        ("act.mul_c", "mul_scalar", (("mul_scalar", "fwd"),)),
        ("act.tanh", "tanh", (("tanh", "bwd"),)),
        ("act.add_one", "add_scalar", ()),
        ("act.mul", "mul", (("mul", "fwd"), ("mul", "fwd"))),
    ),
}
"""The Hugging Face activations that torch eager runs as several kernels: (role, forward ``fn``,
autograd backward kernels) of each, by ``hf_activation``. ``gelu_accurate`` has the same expression
with a precomputed constant (``AccurateGELUActivation``); the others of
:data:`opcast.archs._HF_ACTIVATIONS` are one torch kernel each (``nn.functional.gelu``, ``gelu(approximate
="tanh")``, ``nn.SiLU``, ``nn.ReLU``) and keep the arch's one fused ``act``. Not modelled: ``gelu_fast`` and
``gelu_python`` (also multi-kernel; no measured run uses them)."""
HF_EAGER_ACTIVATIONS["gelu_accurate"] = HF_EAGER_ACTIVATIONS["gelu_new"]

HF_HEAD_COPY_FAMILIES = frozenset({"gpt2", "opt"})
"""Families whose transformers attention (4.38.1, eager) copies Q, K and V into ``[b, h, s, d]`` and the
output back to ``[b, s, h * d]``: ``modeling_gpt2.py`` ``GPT2Attention`` splits heads with
``view(...).permute(0, 2, 1, 3)`` (a strided view), so ``torch.matmul`` of the 4-d operands reshapes
each of Q, K^T and V to ``[b * h, ., .]``, a copy (ATen ``_matmul_impl``: ``expand(...).reshape``, not
viewable after the permute), and ``_merge_heads`` calls ``.contiguous()``; ``modeling_opt.py``
``OPTAttention._shape`` is ``view(...).transpose(1, 2).contiguous()`` for each of Q, K, V and the
output is ``transpose(1, 2).reshape(...)``, a copy. Their key/value cache holds these tensors (no
separate cache write). Backward copies each gradient back (GPT-2: the split's ``cat`` and the merge's
reshape; OPT: the transposes' reshapes): one copy of each tensor again. Other families (rope,
``repeat_kv``) copy differently and keep the generic graph."""

HF_EXPLICIT_BWD: dict[str, ExplicitBwd] = {
    **{role: bwd for fns in HF_EAGER_ACTIVATIONS.values() for role, _, bwd in fns},
    "attn.split_q": (("copy", "fwd"),),
    "attn.split_kv": (("copy", "fwd"),),
    "attn.merge_heads": (("copy", "fwd"),),
    "attn.q_scale": (("mul_scalar", "fwd"),),
}
"""Backward kernels of the Hugging Face eager ops by role, where autograd's kernels are not the
registry's one backward kernel of the forward op (:func:`backward_ops`)."""


def hf_activation_ops(arch: ArchSpec, numel: int) -> list[Op] | None:
    """The forward kernels of the arch's Hugging Face activation module in torch eager over ``numel``
    elements (:data:`HF_EAGER_ACTIVATIONS`), or None where it is one kernel (the arch's ``act``)."""
    fns = HF_EAGER_ACTIVATIONS.get(arch.hf_activation or "")
    if fns is None:
        return None
    return [(role, "elementwise", {"numel": numel, "fn": fn}, 1) for role, fn, _ in fns]


def hf_attention_ops(
    arch: ArchSpec, *, batch: int, seq_q: int, seq_kv: int, heads: int, kv_heads: int, training: bool, attention: str
) -> tuple[list[Op], list[Op]]:
    """(before, after) the attention core: the kernels transformers' eager attention module adds
    around it (:data:`HF_HEAD_COPY_FAMILIES`): the Q, K, V head-split copies, OPT's ``q_proj(x) *
    self.scaling`` (``modeling_opt.py``; GPT-2 scales the scores, inside the core), and in training the
    dropout on the attention probabilities (``nn.Dropout(attn_pdrop)`` / ``F.dropout(p=attention_dropout)``
    on the ``[b, h, s_q, s_kv]`` probabilities: torch's ``native_dropout``, none at p = 0) before
    ``P @ V``; after it, the head-merge copy. Empty for other families and non-eager attention."""
    if arch.family not in HF_HEAD_COPY_FAMILIES or attention != "eager":
        return [], []
    q, kv = batch * seq_q * heads * arch.head_dim, batch * seq_kv * kv_heads * arch.head_dim
    before: list[Op] = []
    if arch.family == "opt":
        before.append(("attn.q_scale", "elementwise", {"numel": q, "fn": "mul_scalar"}, 1))
    before += [
        ("attn.split_q", "elementwise", {"numel": q, "fn": "copy"}, 1),
        ("attn.split_kv", "elementwise", {"numel": kv, "fn": "copy"}, 2),
    ]
    if training and arch.attention_dropout_p > 0:
        probs = batch * heads * seq_q * seq_kv
        before.append(("attn.probs_dropout", "elementwise", {"numel": probs, "fn": "dropout"}, 1))
    return before, [("attn.merge_heads", "elementwise", {"numel": q, "fn": "copy"}, 1)]


def _mlp(
    arch: ArchSpec,
    tp: int,
    tokens: int,
    ep: int,
    training: bool,
    hf: bool = False,
    whole_experts: bool = False,
    fused_swiglu: bool = False,
) -> list[Op]:
    """The block's MLP on one rank. An MoE block's experts are split over ``tp`` (Megatron's expert tensor
    parallelism equal to tp) and ``ep`` ranks each hold ``n_experts / ep`` of them, each rank routing its own
    ``tokens``; with ``whole_experts`` (an inference engine's expert parallelism: vLLM ``--enable-expert-parallel``,
    SGLang's EP MoE) every expert is whole on one of the ``ep`` GPUs, and each GPU dispatches ``1 / tp`` of the
    tokens its tensor-parallel group replicates. In inference (not ``training``, not ``hf``) the routed experts
    are one fused ``moe`` kernel (an inference engine's fused MoE layer) over the ``ep`` ranks' tokens, priced by a
    learned model of that kernel where one covers it and as the grouped GEMMs of
    :func:`~opcast.archs.routed_expert_ops` elsewhere (:func:`opcast.predict.cost.decompose`); training lists
    those kernels themselves. ``fused_swiglu``: the framework runs a SiLU-gated activation as one kernel
    (:func:`opcast.archs.gated_activation_ops`)."""
    moe = arch.n_experts > 1
    ffn = arch.ffn_hidden // (1 if moe and whole_experts else tp)
    if not moe:
        act_numel = tokens * ffn
        act: list[Op] = [
            (role, kind, p, 1)
            for role, kind, p in gated_activation_ops(
                "", numel=act_numel, fn=arch.activation, gated=arch.gated_mlp, fused=fused_swiglu
            )
        ]
        eager = hf_activation_ops(arch, act_numel) if hf else None
        if eager is not None:  # the eager module's kernels in place of the one activation kernel
            act[:1] = eager
        return [
            ("mlp_up", "gemm", {"b": 1, "m": tokens, "n": (2 if arch.gated_mlp else 1) * ffn, "k": arch.hidden}, 1),
            *act,
            ("mlp_down", "gemm", {"b": 1, "m": tokens, "n": arch.hidden, "k": ffn}, 1),
        ]
    routed_tokens = -(-tokens // tp) if whole_experts else tokens
    experts: dict[str, int | bool | str] = {  # the fused layer over the ep ranks' tokens (opcast.ops moe)
        "tokens": ep * routed_tokens,
        "hidden": arch.hidden,
        "inter": ffn,
        "experts": arch.n_experts,
        "topk": arch.experts_top_k,
        "ep": ep,
        "gated": arch.gated_mlp,
        "fn": arch.activation,
        # a checkpoint's weight-only experts (gpt-oss's MXFP4) as served; training reads its bf16 master weights
        **({"weights": arch.expert_weights} if arch.expert_weights and not training else {}),
    }
    router: Op = ("router", "gemm", {"b": 1, "m": tokens, "n": arch.n_experts, "k": arch.hidden}, 1)
    shared = [
        (role, kind, params, 1)
        for role, kind, params in shared_expert_ops(arch, tp=tp, tokens=tokens, fused_swiglu=fused_swiglu)
    ]
    if not training and not hf:
        return [router, ("experts", "moe", experts, 1), *shared]
    parts: list[Op] = [(role, kind, p, 1) for role, kind, p in routed_expert_ops(experts, fused_swiglu=fused_swiglu)]
    if hf:  # transformers' eager activation modules in place of the one activation kernel
        ((_, _, act_params, _),) = [op for op in parts if op[0] == "act"]
        eager = hf_activation_ops(arch, int(act_params["numel"]))
        if eager is not None:
            i = next(i for i, op in enumerate(parts) if op[0] == "act")
            parts[i : i + 1] = eager
    return [router, *parts, *shared]


def window_core(arch: ArchSpec, attn: dict, *, seq_q: int, seq_kv: int) -> dict:
    """The attention op's parameters for ``seq_q`` queries against ``seq_kv`` keys (causal, bottom-right aligned)
    in a block of ``arch``. Under a sliding window of ``W`` keys (every block of ``arch`` windowed,
    :meth:`~opcast.archs.ArchSpec.attended_keys`) and ``seq_kv > W``, each query sees ``min(W, its position + 1)``
    keys: priced as ``seq_q`` queries against ``W`` keys without a mask, exact when the chunk's cached prefix is at
    least ``W - 1`` keys (decode, later prefill chunks) and ``W (W - 1) / 2`` query-key pairs over otherwise (a
    fresh prompt: ``(W - 1) / (2 seq_q)`` of the work). The kernel's tile padding of the band
    (FlashAttention's ``window_size`` skips only whole tiles) is not priced.

    An arch whose blocks mix windowed and full attention reaches here only in training (inference splits its
    blocks, :func:`opcast.predict.inference.block_kinds`), where every block is priced alike: its core is then
    the blocks' mean, ``seq_q`` queries against the mean number of keys a query sees, unmasked (exact in FLOPs,
    as the MLA core's mean head width is)."""
    keys = arch.attended_keys(seq_kv)
    windowed = arch.windowed_layers
    if 0 < windowed < arch.n_layers and arch.sliding_window is not None and seq_kv > arch.sliding_window:
        full_pairs = seq_q * (seq_kv - seq_q) + seq_q * (seq_q + 1) / 2  # causal, bottom-right aligned
        share = windowed / arch.n_layers
        mean_keys = ((1 - share) * full_pairs + share * seq_q * arch.sliding_window) / seq_q
        return {**attn, "seq_q": seq_q, "seq_kv": max(1, round(mean_keys)), "causal": False}
    if keys == seq_kv:
        return {**attn, "seq_q": seq_q, "seq_kv": seq_kv, "causal": True}
    return {**attn, "seq_q": seq_q, "seq_kv": keys, "causal": False}


def block_ops(
    arch: ArchSpec,
    *,
    tp: int,
    batch: int,
    seq_q: int,
    seq_kv: int,
    sp: bool,
    cp: int = 1,
    ep: int = 1,
    attention: str = "flash",
    training: bool = True,
    framework: str | None = None,
    whole_experts: bool = False,
    fused_swiglu: bool | None = None,
) -> list[Op]:
    """Forward ops of one block on one rank for ``batch`` sequences of ``seq_q`` local queries
    against ``seq_kv`` keys (training: ``seq_q = seq_kv = S / cp``; decode: ``seq_q = 1``);
    ``whole_experts``: an inference engine's expert parallelism (:func:`_mlp`); ``fused_swiglu``: a SiLU-gated
    activation in one kernel (:func:`opcast.archs.gated_activation_ops`; None: the framework's,
    :attr:`~opcast.predict.frameworks.Framework.fused_swiglu`; a serving engine's is True). Under a
    framework that runs transformers' modules op by op (``hf``, :attr:`Framework.hf_modules`) the
    activation is its module's eager kernels (:func:`hf_activation_ops`) and eager attention carries
    the modeling code's own kernels (:func:`hf_attention_ops`, which replace the cache write)."""
    fw = framework_of(framework)
    hf = fw.hf_modules
    tokens = batch * seq_q
    rows = tokens // tp if sp else tokens
    heads, kv_heads = arch.n_heads // tp, max(1, arch.n_kv_heads // tp)
    residual = rows * arch.hidden
    dropout = training and arch.hidden_dropout_p > 0  # the residual dropouts (attention probs: inside attention)
    norm = (arch.norm, {"rows": rows, "cols": arch.hidden})
    at = attention_ops(
        arch, tokens=tokens, heads=heads, kv_heads=kv_heads, absorbed=not training and seq_q == 1, rows=rows
    )
    attn = {"batch": batch, "heads": heads, "kv_heads": at.kv_heads, "head_dim": at.head_dim, "impl": attention}
    if cp == 1:
        core = [("attn", "attention", window_core(arch, attn, seq_q=seq_q, seq_kv=seq_kv), 1)]
    else:
        core = [
            ("attn", "attention", window_core(arch, attn, seq_q=seq_q, seq_kv=seq_q), 1),
            ("attn_cp", "attention", {**attn, "seq_q": seq_q, "seq_kv": seq_q // 2, "causal": False}, cp - 1),
        ]
    hf_before, hf_after = (
        hf_attention_ops(
            arch,
            batch=batch,
            seq_q=seq_q,
            seq_kv=seq_kv,
            heads=heads,
            kv_heads=kv_heads,
            training=training,
            attention=attention,
        )
        if hf and cp == 1
        else ([], [])
    )
    kv_write = (
        [] if training or hf_before else [("kv_write", "elementwise", {"numel": tokens * at.kv_write, "fn": "copy"}, 1)]
    )
    attention_part: list[Op] = [
        ("norm1", *norm, 1),
        *((role, kind, p, 1) for role, kind, p in at.before),
        *kv_write,
        *hf_before,
        *core,
        *hf_after,
        *((role, kind, p, 1) for role, kind, p in at.after),
        ("proj", "gemm", {"b": 1, "m": tokens, "n": arch.hidden, "k": at.proj_k}, 1),
        *([("attn_dropout", "elementwise", {"numel": residual, "fn": "dropout"}, 1)] if dropout else []),
        *([("post_norm1", *norm, 1)] if arch.post_norms else []),  # Gemma: on the sublayer's output
    ]
    mlp_ops: list[Op] = [
        ("norm2", *norm, 1),
        *_mlp(
            arch, tp, tokens, ep, training, hf, whole_experts, fw.fused_swiglu if fused_swiglu is None else fused_swiglu
        ),
        *([("mlp_dropout", "elementwise", {"numel": residual, "fn": "dropout"}, 1)] if dropout else []),
        *([("post_norm2", *norm, 1)] if arch.post_norms else []),
    ]
    add: Op = ("residual_add", "elementwise", {"numel": residual, "fn": "add"}, 1)
    if arch.parallel_residual:
        return [*attention_part, *mlp_ops, add, add]
    return [*attention_part, add, *mlp_ops, add]


def embedding_ops(arch: ArchSpec, *, tp: int, tokens: int, rows: int, training: bool = True) -> list[Op]:
    """Forward ops of the first stage before the blocks: vocab-parallel embedding, learned
    positions, embedding dropout."""
    vocab = padded_vocab(arch.vocab, tp) // tp
    ops: list[Op] = [("embed", "embedding", {"tokens": tokens, "vocab": vocab, "hidden": arch.hidden}, 1)]
    if arch.position == "learned":
        ops += [
            ("pos_embed", "embedding", {"tokens": tokens, "vocab": arch.max_seq, "hidden": arch.hidden}, 1),
            ("pos_add", "elementwise", {"numel": tokens * arch.hidden, "fn": "add"}, 1),
        ]
    if training and arch.hidden_dropout_p > 0:
        ops.append(("embed_dropout", "elementwise", {"numel": rows * arch.hidden, "fn": "dropout"}, 1))
    return ops


def head_ops(arch: ArchSpec, *, tp: int, tokens: int, rows: int, loss: bool = True) -> list[Op]:
    """Forward ops of the last stage after the blocks: final norm, LM head, vocab-parallel cross entropy."""
    vocab = padded_vocab(arch.vocab, tp) // tp
    ops: list[Op] = [
        ("final_norm", arch.norm, {"rows": rows, "cols": arch.hidden}, 1),
        ("lm_head", "gemm", {"b": 1, "m": tokens, "n": vocab, "k": arch.hidden}, 1),
    ]
    if loss:
        ops.append(("cross_entropy", "cross_entropy", {"tokens": tokens, "vocab": vocab}, 1))
    return ops


# --------------------------------------------------------------------------- backward


def backward_ops(ops: list[Op]) -> list[tuple[str, str, dict, str, int]]:
    """(role, kind, params, direction, count) of the backward pass of ``ops``, in reverse order."""
    out: list[tuple[str, str, dict, str, int]] = []
    for role, kind, p, count in reversed(ops):
        explicit = HF_EXPLICIT_BWD.get(role)
        if explicit is not None:  # autograd's own kernels for a Hugging Face eager op
            for i, (fn, direction) in enumerate(explicit):
                out.append((f"{role}.bwd{i}", kind, {"numel": p["numel"], "fn": fn}, direction, count))
        elif kind == "gemm":
            b, m, n, k = p["b"], p["m"], p["n"], p["k"]
            out.append((f"{role}.dgrad", "gemm", {"b": b, "m": m, "n": k, "k": n}, "fwd", count))
            out.append((f"{role}.wgrad", "gemm", {"b": b, "m": k, "n": n, "k": m}, "fwd", count))
        elif "bwd" in get_op(kind).directions(p):
            out.append((f"{role}.bwd", kind, p, "bwd", count))
    return out


# --------------------------------------------------------------------------- fp8 quantisation

QUANTISED_GEMM_DTYPES: frozenset[str] = frozenset(QUANTISED_PRECISIONS.values())
"""The kernel dtypes of the quantised linears' GEMMs (fp8, fp8_block, nvfp4)."""


def quantised(prec: Dtypes) -> bool:
    """Whether ``prec`` runs the :data:`FP8_LINEARS` through Transformer Engine's quantised GEMMs
    (fp8, mxfp8 or nvfp4 training), with the quantisation kernels, fp8 gathers and amaxes of fp8."""
    return prec.matrix in QUANTISED_GEMM_DTYPES


FP8_LINEARS: dict[str, str] = {
    "qkv": "column",
    "proj": "row",
    "mlp_up": "column",
    "mlp_down": "row",
    "shared_up": "column",
    "shared_down": "row",
    "q_proj": "column",
    "q_down": "duplicated",
    "q_up": "column",
    "kv_down": "duplicated",
    "kv_up": "column",
}
"""The GEMMs a training run in fp8 runs in fp8 (Transformer Engine's linear modules), with their
Megatron parallel mode (an MoE block's shared expert is Megatron-Core's ``SharedExpertMLP``, built of TE's
column- and row-parallel linears like the dense MLP). Multi-head latent attention is Megatron-Core's
``MLASelfAttention`` built from TE modules (``megatron/core/models/gpt/gpt_layer_specs.py``
``get_gpt_layer_with_transformer_engine_spec`` with ``multi_latent_attention``, ``TESpecProvider``):
``linear_q_proj`` ``column_parallel_linear``, ``linear_q_down_proj`` / ``linear_kv_down_proj`` ``linear``
(TE ``Linear`` with ``parallel_mode="duplicated"``: every tensor-parallel rank holds the whole down projection),
``linear_q_up_proj`` / ``linear_kv_up_proj`` ``column_parallel_layer_norm_linear`` (the latent RMSNorms fused in,
``qk_layernorm``) and ``linear_proj`` ``row_parallel_linear``; so all of them run in fp8 (the inference-only
absorbed GEMMs are not TE modules). Every other GEMM is a plain bf16 matmul: Megatron-Core's output layer is
``tensor_parallel.ColumnParallelLinear`` and its MoE router ``F.linear``, llm-foundry's MPT head is ``F.linear`` on the
tied embedding. Not modelled under sequence parallelism: MLA's down projections run on a rank's own rows and its
latents (not the hidden states) are gathered for the up projections; opcast prices the down projections over the
gathered rows and the hidden-state gather, as for standard attention."""

NORM_FREE_COLUMN_LINEARS = frozenset({"q_proj", "shared_up"})
"""Column-parallel fp8 linears whose input no fused norm writes in fp8: MLA's ``linear_q_proj``
(``column_parallel_linear``; MLA's input norm is a ``TENorm`` of its own) and an MoE block's shared expert
(``SharedExpertMLP``'s ``TEColumnParallelLinear``, after the ``pre_mlp_layernorm`` it shares with the router). Under
``megatron`` modules they cast their input like a ``Linear``; the other column-parallel ones (QKV, a dense MLP's up,
MLA's up projections) are ``LayerNormLinear`` modules there (:func:`fp8_quantisation`)."""

CastOps = tuple[list[Op], list[Op], list[Op]]
"""(before the forward GEMM, before the data-gradient GEMM, before the weight-gradient GEMM)."""


def gemm_precision(role: str, prec: Dtypes) -> Dtypes:
    """The dtypes the GEMM of ``role`` (``.dgrad`` / ``.wgrad`` included) runs in: in fp8 only the
    :data:`FP8_LINEARS`; the others in the activation dtype."""
    if quantised(prec) and role.split(".")[0] not in FP8_LINEARS:
        return replace(prec, matrix=prec.act)
    return prec


def traffic_op(role: str, bytes_moved: int) -> Op:
    """A memory-bound kernel moving ``bytes_moved`` bytes in mixed dtypes (a quantisation, an upcast),
    priced as the bf16 ``mul_scalar`` (``x * scale``, what a cast computes) that moves as many: it reads
    and writes 2 bytes an element, so ``numel = bytes / 4``. TE's casts read bf16 and write fp8, which no
    single registry dtype describes."""
    return (role, "elementwise", {"numel": -(-bytes_moved // 4), "fn": "mul_scalar"}, 1)


TE_GEMM_KERNELS: dict[str, str] = {"fp8_block": "fp8"}
"""The kernel dtype whose measurements price a quantised linear's GEMM in a Transformer Engine training run,
where that differs from the precision's own kernel dtype. MXFP8: TE runs its GEMMs through cuBLASLt with the
``CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0`` scale mode (TE v2.9 ``common/gemm/cublaslt_gemm.cu``), the library of
its per-tensor fp8 GEMMs, and Blackwell's tensor cores run the block-scaled fp8 MMA (``tcgen05.mma``
``kind::mxf8f6f4``) at the fp8 rate. The measured ``fp8_block`` GEMMs opcast learns from (AIConfigurator) are
another format and kernel family: DeepSeek-V3's 128-element blocks with fp32 scales in DeepGEMM / CUTLASS
blockwise kernels, which on B200 run 17-24 % faster than the same framework's cuBLASLt fp8 GEMMs at Llama 3 8B
shapes in TensorRT-LLM 1.3.0rc20's table and 18 % slower in vLLM 0.24.0's (m 8192, n 4096, k 4096: 0.113 vs
0.135 ms; 0.201 vs 0.170 ms). So MXFP8 training's GEMMs are priced as cuBLASLt's per-tensor fp8 GEMM of the
same shape; their scales (1/32 of the operand bytes) are left out of a compute-bound kernel."""


def fp8_gemm_transposes(device: DeviceSpec) -> bool:
    """Whether per-tensor fp8 GEMMs on ``device`` take only the TN layout, so that Transformer Engine keeps
    an fp8 transpose (column-wise data) of every operand a gradient GEMM reads transposed: True but on
    datacenter Blackwell (sm_100/103, :attr:`~opcast.hardware.DeviceSpec.mma_family` ``tcgen05``), whose
    fp8 GEMMs take every layout. TE v2.9 ``transformer_engine/common/transformer_engine.cpp``
    ``nvte_is_non_tn_fp8_gemm_supported``: compute capability 10.0-11.x or >= 13.0 (the same rule in v2.3,
    v2.5 and v2.14.1; v2.2's ``pytorch/utils.py`` ``non_tn_fp8_gemm_supported`` also counted sm_120);
    ``pytorch/csrc/quantizer.cpp`` ``Float8Quantizer::create_tensor`` and
    ``Float8CurrentScalingQuantizer::create_tensor`` then write the row-wise data only
    (``with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()``), and
    ``pytorch/distributed.py`` ``_all_gather_fp8`` transposes a gathered tensor only without it."""
    return device.mma_family != "tcgen05"


def _quantise(name: str, numel: int, *, recipe: str, columnwise: bool, amax_fused: bool = False) -> list[Op]:
    """The kernels quantising one bf16 tensor of ``numel`` elements to per-tensor fp8 (``name`` =
    ``{role}.{tensor}``), column-wise data (the fp8 transpose) included when ``columnwise``:

    - ``delayed`` (TE ``Float8Quantizer``, the scale from the amax history): one cast, the amax fused
      into it: ``fp8_cast_transpose_fused`` (4 bytes an element: bf16 read, two fp8 copies written) or
      ``cast_to_fp8`` (3);
    - ``current`` (TE v2.9 ``pytorch/csrc/quantizer.cpp`` ``Float8CurrentScalingQuantizer::quantize_impl``):
      ``nvte_compute_amax_with_config`` (reads the bf16 input, 2 bytes an element; not where the producing
      kernel computed the amax: ``amax_fused``), the amax all-reduce where the quantiser has an amax
      reduction group (priced as a collective, :func:`fp8_amax_comms`), ``nvte_compute_scale_from_amax``,
      then ``nvte_quantize_v2``, the cast (4 or 3 bytes as above). Not priced: the scale kernel, one thread
      (its launch, microseconds, below what the learned elementwise models were fitted on: they answer
      nanoseconds); about 0.1 % of the NeMo current-scaling rows' iteration at 2 us a launch."""
    role, tensor = name.rsplit(".", 1)
    ops: list[Op] = []
    if recipe == "current" and not amax_fused:
        ops.append(traffic_op(f"{role}.fp8_amax_{tensor}", 2 * numel))
    cast = "fp8_cast_transpose" if columnwise else "fp8_cast"
    ops.append(traffic_op(f"{role}.{cast}_{tensor}", (4 if columnwise else 3) * numel))
    return ops


def _weight_quantisation(role: str, p: dict, *, recipe: str = "delayed", transposes: bool = True) -> list[Op]:
    """The quantisation of the weight ``W[k, n]`` of the fp8 linear ``role`` (``b`` of them): bf16 read,
    the fp8 copy and, where the GEMMs need it (``transposes``), the fp8 transpose written (:func:`_quantise`;
    TE v1.13 ``fp8_cast_transpose_fused``; TE v2.9 ``Float8Quantizer`` / ``Float8CurrentScalingQuantizer``,
    the weight quantiser without an amax reduction group)."""
    return _quantise(f"{role}.weight", p["b"] * p["k"] * p["n"], recipe=recipe, columnwise=transposes)


def fp8_gathers(role: str, *, tp: int, sp: bool, grouped: bool) -> tuple[bool, bool]:
    """(input, output gradient) of the fp8 linear ``role`` quantised on the local rows and all-gathered in
    fp8 over the tensor-parallel group: with sequence parallelism, a column-parallel layer's input and a
    row-parallel layer's output gradient (TE ``_Linear.forward`` / ``_LayerNormLinear.forward``
    ``with_input_all_gather``, ``module/base.py`` ``grad_output_preprocess`` ``gather_grad_output``);
    TE's grouped expert linears are not sequence-parallel."""
    sp = sp and tp > 1 and not grouped
    mode = FP8_LINEARS[role]
    return sp and mode == "column", sp and mode == "row"  # a duplicated layer gathers nothing


def fp8_quantisation(
    role: str,
    p: dict,
    *,
    modules: str,
    tp: int,
    sp: bool,
    grouped: bool,
    recipe: str = "delayed",
    transposes: bool = True,
) -> CastOps:
    """The quantisation kernels Transformer Engine runs around the per-tensor fp8 linear ``role``
    ``C[m, n] = A[m, k] @ W[k, n]`` (``b`` of them when ``grouped``), per micro-batch. A GEMM that takes
    only the TN layout (Hopper; ``transposes``, :func:`fp8_gemm_transposes`) needs fp8 transposes of A
    and of dC for the weight-gradient GEMM and one of W for the data-gradient GEMM; on datacenter
    Blackwell TE 2.x writes none and every fused cast+transpose is a plain cast. Bytes per element: a
    fused cast+transpose reads bf16 and writes two fp8 copies (4), a cast 3, an fp8 transpose 2.

    **Delayed scaling** (``recipe`` delayed; TE v1.13 on Hopper, the layouts of TE v2.x on Blackwell), the
    amax computed inside the casts:

    - Input A, forward (``module/linear.py`` ``_Linear.forward``): ``fp8_cast_transpose_fused``
      (4 mk) without sequence parallelism; with it ``cast_to_fp8`` of the local rows (3 mk, m/tp rows
      for a column-parallel layer, whose fp8 rows are then all-gathered) and ``tex.fp8_transpose`` of
      the gathered A before the wgrad (2 mk, ``_Linear.backward``). A ``LayerNormLinear`` (QKV and
      MLP-up under ``megatron``) gets A in fp8 from its norm (``_apply_normalization`` writes fp8; the
      norm stays priced as the bf16 norm) and transposes it before the wgrad
      (``module/layernorm_linear.py`` ``_LayerNormLinear.backward``: ``tex.fp8_transpose(ln_out_total)``, 2 mk).
    - Weight W: ``Float8Tensor.quantize_`` with its transpose cache, a ``fp8_cast_transpose_fused``
      (4 kn; ``module/base.py`` ``get_fp8_workspace``, ``tensor/float8_tensor.py`` ``quantize_``), in
      each forward when ``is_first_microbatch`` is None (``linear``), else only in the first
      micro-batch of an iteration (``megatron``: ``module/linear.py`` ``Linear.forward``,
      ``update_workspace = is_first_microbatch is None or is_first_microbatch``; Megatron-Core's
      ``set_is_first_microbatch``): not in this per-micro-batch graph but once per iteration and
      layer (:func:`weight_casts`, priced with the optimizer step). Backward reads the cached
      transpose (``transpose_2d``), no kernel.
    - Output gradient dC, backward (``module/base.py`` ``grad_output_preprocess``):
      ``fp8_cast_transpose_fused`` (4 mn; ``fp8_cast_transpose_bgrad_fused`` with a bias, same
      bytes); a row-parallel layer with sequence parallelism casts its local rows (3 mn/tp),
      all-gathers them in fp8 and transposes the gathered dC (2 mn).
    - Outputs (C, dA, dW) are written by the GEMMs in bf16: no kernel.

    Their amaxes are reduced once per micro-batch and direction with the data-parallel traffic
    (:func:`fp8_amax_bytes`). Not priced: the ``torch.cat`` of the amaxes and the one
    ``fused_amax_and_scale_update_after_reduction`` kernel around it, microseconds each. Recipe:
    Micikevicius et al. 2022 (arXiv 2209.05433, Sec. 3-4: per-tensor scaling, E4M3 forward, E5M2
    gradients).

    **Current scaling** (``recipe`` current; TE v2.9, the ``release_v2.9`` that Megatron-Bridge v0.2.0 pins
    for NeMo 25.11; ``Float8CurrentScaling``): every quantisation is the steps of :func:`_quantise`
    (amax pass, amax all-reduce where the rows are gathered, scale, cast), on the tensors above:

    - Input A: a ``LayerNormLinear``'s norm writes bf16 with the amax fused
      (``pytorch/csrc/extensions/normalization.cpp`` ``FUSED_NORM_AMAX_FP8``, TE >= 2.7; TE 2.2-2.6, NeMo
      25.04 / 25.07, ran a separate amax pass there, not priced) and ``quantize_with_amax`` casts it; a
      ``Linear``'s input gets the amax pass and the cast. With sequence parallelism a column-parallel
      layer casts its local rows, its amax all-reduced over the tensor-parallel group
      (``module/linear.py`` / ``module/layernorm_linear.py`` ``_customize_quantizers_float8_current_scaling``:
      ``with_amax_reduction``, ``amax_reduction_group = self.tp_group``), the gathered rows transposed where
      the GEMMs need it (``distributed.py`` ``_all_gather_fp8``: ``_create_transpose``); a row-parallel
      layer's input is cast (and transposed) whole, without a reduction.
    - Weight W: the amax pass, the scale and the cast (and transpose) of the weight, when the delayed
      recipe casts it (``module/base.py`` ``get_weight_workspace``).
    - Output gradient dC: as the input, the row-parallel layer with sequence parallelism being the one
      that casts its local rows, all-reduces their amax over the tensor-parallel group and gathers them.

    No amax is reduced over the data-parallel ranks (``quantization.py`` ``add_fp8_tensors_to_global_buffer``
    and ``reduce_and_update_fp8_tensors``: "Delayed scaling only"). A bias's gradient
    (``tex.bgrad_quantize``) is not priced apart."""
    b, m, n, k = p["b"], p["m"], p["n"], p["k"]
    gathered_in, gathered_grad = fp8_gathers(role, tp=tp, sp=sp, grouped=grouped)
    row = FP8_LINEARS[role] == "row"
    fused_norm = (
        modules == "megatron" and FP8_LINEARS[role] == "column" and role not in NORM_FREE_COLUMN_LINEARS and not grouped
    )
    fwd: list[Op] = []
    dgrad: list[Op] = []
    wgrad: list[Op] = []
    if recipe == "current":
        rows = m // tp if gathered_in else m
        quantise = partial(_quantise, recipe=recipe)
        fwd += quantise(f"{role}.input", b * rows * k, columnwise=transposes and not gathered_in, amax_fused=fused_norm)
        if gathered_in and transposes:
            wgrad.append(traffic_op(f"{role}.fp8_transpose_input", 2 * b * m * k))
        if modules == "linear":
            fwd += _weight_quantisation(role, p, recipe=recipe, transposes=transposes)
        rows = m // tp if gathered_grad else m
        dgrad += quantise(f"{role}.grad", b * rows * n, columnwise=transposes and not gathered_grad)
        if gathered_grad and transposes:
            dgrad.append(traffic_op(f"{role}.fp8_transpose_grad", 2 * b * m * n))
        return fwd, dgrad, wgrad
    sp = gathered_in or gathered_grad  # sequence parallelism as fp8_gathers applies it (a role gathers one of them)
    if fused_norm:
        if transposes:
            wgrad.append(traffic_op(f"{role}.fp8_transpose_input", 2 * b * m * k))
    elif sp:
        local = m if row else m // tp
        fwd.append(traffic_op(f"{role}.fp8_cast_input", 3 * b * local * k))
        if transposes:
            wgrad.append(traffic_op(f"{role}.fp8_transpose_input", 2 * b * m * k))
    else:
        fwd += _quantise(f"{role}.input", b * m * k, recipe=recipe, columnwise=transposes)
    if modules == "linear":
        fwd += _weight_quantisation(role, p, transposes=transposes)
    if gathered_grad:
        dgrad.append(traffic_op(f"{role}.fp8_cast_grad", 3 * b * (m // tp) * n))
        if transposes:
            dgrad.append(traffic_op(f"{role}.fp8_transpose_grad", 2 * b * m * n))
    else:
        dgrad += _quantise(f"{role}.grad", b * m * n, recipe=recipe, columnwise=transposes)
    return fwd, dgrad, wgrad


def _grouped(ops: list[Op]) -> frozenset[str]:
    """The roles of a block's fp8 linears that are TE's grouped expert linears: an MoE block's (with its router)
    routed-expert up and down GEMMs. Its attention linears and shared expert are TE's ordinary (sequence-parallel)
    modules."""
    return frozenset({"mlp_up", "mlp_down"}) if any(role == "router" for role, *_ in ops) else frozenset()


def fp8_casts(ops: list[Op], prec: Dtypes, *, tp: int, sp: bool) -> dict[str, CastOps]:
    """:func:`fp8_quantisation` of every fp8 linear of ``ops`` by role (empty unless GEMMs run in fp8)."""
    if not quantised(prec):
        return {}
    grouped = _grouped(ops)
    return {
        role: fp8_quantisation(
            role,
            p,
            modules=prec.fp8_modules,
            tp=tp,
            sp=sp,
            grouped=role in grouped,
            recipe=prec.fp8_recipe,
            transposes=prec.fp8_transposes,
        )
        for role, kind, p, _ in ops
        if kind == "gemm" and role in FP8_LINEARS
    }


FP8_AMAX_BYTES = 4
"""One fp32 amax: what current scaling all-reduces (MAX) per quantisation with an amax reduction group."""


def fp8_amax_comms(ops: list[Op], prec: Dtypes, *, tp: int, sp: bool) -> dict[str, tuple[Comm, ...]]:
    """Current scaling's amax all-reduces of one block per micro-batch by phase: one blocking all-reduce
    (MAX) of :data:`FP8_AMAX_BYTES` over the tensor-parallel group (role ``tp_amax``, not hidden) before
    each cast of rows that are then all-gathered in fp8 (:func:`fp8_gathers`): forward, the column-parallel
    layers' inputs; backward, the row-parallel layers' output gradients (TE v2.9 ``pytorch/csrc/quantizer.cpp``
    ``Float8CurrentScalingQuantizer::quantize_impl``: ``amax_reduction_group->allreduce(...)->wait()``).
    Empty for delayed scaling, whose amaxes go in one call per direction (:func:`fp8_amax_bytes`)."""
    if not quantised(prec) or prec.fp8_recipe != "current":
        return {FWD: (), BWD: ()}
    grouped = _grouped(ops)
    gathers = [
        fp8_gathers(role, tp=tp, sp=sp, grouped=role in grouped)
        for role, kind, _, _ in ops
        if kind == "gemm" and role in FP8_LINEARS
    ]
    out: dict[str, tuple[Comm, ...]] = {}
    for phase, count in ((FWD, sum(g[0] for g in gathers)), (BWD, sum(g[1] for g in gathers))):
        out[phase] = (Comm("tp_amax", "all_reduce", FP8_AMAX_BYTES, count),) if count else ()
    return out


def delayed_amax_reduction(prec: Dtypes) -> bool:
    """Whether a run in ``prec`` reduces its amaxes once per direction and model chunk over the amax group
    (:func:`fp8_amax_bytes`): per-tensor fp8 with delayed scaling only. TE v2.9 ``pytorch/quantization.py``
    ``reduce_and_update_fp8_tensors`` ("Delayed scaling only"): ``add_fp8_tensors_to_global_buffer`` returns
    at once unless ``recipe.delayed()``, so current scaling, MXFP8 and NVFP4 (block scales computed where each
    tensor is quantised) leave the buffer empty."""
    return prec.matrix == "fp8" and prec.fp8_recipe == "delayed"


@lru_cache(maxsize=1024)
def weight_casts(arch: ArchSpec, *, tp: int, ep: int, prec: Dtypes, whole_experts: bool = False) -> tuple[Node, ...]:
    """The quantisation kernels of one block's fp8 weights that run once per iteration, not per
    micro-batch: under ``megatron`` modules each fp8 linear's weight is quantised
    (:func:`_weight_quantisation`: cast and, where the GEMMs need it, transpose, 4 bytes an element; under
    current scaling after its amax pass and scale) in the first micro-batch only (Megatron-Core v0.10
    ``megatron/core/pipeline_parallel/schedules.py`` ``forward_step``: ``model.set_is_first_microbatch()``;
    ``megatron/core/extensions/transformer_engine.py`` ``TELinear.forward`` passes it to TE as
    ``is_first_microbatch`` and sets it False; TE v1.13 ``module/linear.py`` ``Linear.forward``: ``update_workspace
    = is_first_microbatch is None or is_first_microbatch``, ``module/base.py`` ``get_fp8_workspace``).
    Empty unless the GEMMs run in fp8 under ``megatron`` (``linear`` casts every micro-batch, in the graph)."""
    if not quantised(prec) or prec.fp8_modules != "megatron":
        return ()
    # the weights' shapes do not depend on the tokens, only which experts receive any (routed_experts): enough
    # tokens per tensor-parallel rank that every local expert does
    tokens = tp * 64 * arch.n_experts
    ops = block_ops(arch, tp=tp, batch=1, seq_q=tokens, seq_kv=tokens, sp=False, ep=ep, whole_experts=whole_experts)
    return tuple(
        Node(r, prec.of(kk, pp), c)
        for role, kind, p, _ in ops
        if kind == "gemm" and role in FP8_LINEARS
        for r, kk, pp, c in _weight_quantisation(role, p, recipe=prec.fp8_recipe, transposes=prec.fp8_transposes)
    )


FP8_AMAXES: dict[str, int] = {FWD: 3, BWD: 2}
"""fp32 amaxes per fp8 GEMM and direction in Transformer Engine's delayed scaling: input, weight and
output forward, output and input gradients backward (TE v1.13 ``module/base.py``
``TransformerEngineBaseModule.init_fp8_meta_tensors``: ``num_gemms * 3`` if forward else ``num_gemms * 2``)."""


def fp8_gemms(arch: ArchSpec, ep: int) -> int:
    """fp8 GEMMs of one block on one rank: QKV and out-proj (MLA: ``q_proj`` or ``q_down`` and ``q_up``,
    ``kv_down``, ``kv_up`` and out-proj), and MLP-up and -down once each, or per local expert (TE
    ``GroupedLinear``, ``num_gemms`` = experts on the rank), plus the shared expert's two."""
    per_mlp = 1 if arch.n_experts == 1 else arch.n_experts // ep
    attention = 2 if arch.kv_lora_rank is None else (1 if arch.q_lora_rank is None else 2) + 3
    return attention + 2 * per_mlp + (2 if arch.shared_expert_ffn is not None else 0)


def fp8_amax_bytes(arch: ArchSpec, *, ep: int, layers: int) -> dict[str, int]:
    """Bytes of the amax all-reduce of a stage of ``layers`` blocks by direction. TE v1.13 keeps
    every fp8 module's amaxes in one buffer per direction, recipe and group (``fp8.py``
    ``FP8GlobalStateManager.add_fp8_tensors_to_global_buffer``) and reduces all of it at once
    (``reduce_and_update_fp8_tensors``: ``torch.cat``, then one ``all_reduce`` MAX, ``async_op=False``)
    at the exit of the outermost ``fp8_autocast`` (forward) and after the first fp8 module's backward."""
    gemms = layers * fp8_gemms(arch, ep)
    return {phase: 4 * n * gemms for phase, n in FP8_AMAXES.items()}


# --------------------------------------------------------------------------- comms


def block_comms(
    arch: ArchSpec,
    *,
    tp: int,
    batch: int,
    seq_q: int,
    sp: bool,
    cp: int,
    ep: int,
    dtype: str,
    training: bool = True,
    quantised: str | None = None,
) -> dict[str, tuple[Comm, ...]]:
    """Collectives of one block per micro-batch by phase (forward, backward; recompute = forward).

    ``quantised`` (the kernel dtype of the :data:`FP8_LINEARS` when they run in Transformer Engine's quantised
    GEMMs; None: they do not): with sequence parallelism the all-gathers feeding an fp8 GEMM move fp8, 1 byte an
    element (TE v1.13): the forward gather
    of a column-parallel input (``module/layernorm_linear.py`` ``_LayerNormLinear.forward``: the
    norm writes ``ln_out`` in fp8, ``return_layernorm_output=False`` in Megatron-Core's
    ``TELayerNormColumnParallelLinear``, then ``gather_along_first_dim(ln_out)``; ``module/linear.py``
    ``_Linear.forward``: ``cast_to_fp8`` of the local rows, then ``gather_along_first_dim``), its
    re-gather before the weight gradient (``_LayerNormLinear.backward`` / ``_Linear.backward``
    gather the saved fp8 tensor) and the gather of a row-parallel layer's output gradient
    (``module/base.py`` ``grad_output_preprocess``: ``cast_to_fp8``, then ``gather_along_first_dim``).
    Block-scaled runs gather their own format (:func:`opcast.dtypes.element_bytes` of ``quantised``: its
    scales included): TE v2.9 ``distributed.py`` ``gather_along_first_dim`` calls ``_all_gather_mxfp8`` /
    ``_all_gather_nvfp4``, which quantise the local rows and gather the packed data and scale-inverses (NVFP4:
    4.5 bits an element, MXFP8 8.25).
    The reduce-scatters stay in the activation dtype (the GEMMs write bf16). An MoE block's MLP
    side gathers and scatters tokens through its dispatcher, in bf16."""
    b = dtype_bytes(dtype)
    tokens = batch * seq_q
    act = tokens * arch.hidden * b
    fwd: list[Comm] = []
    bwd: list[Comm] = []
    if tp > 1:
        if sp:
            attn_ag = math.ceil(tokens * arch.hidden * element_bytes(quantised)) if quantised else act
            mlp_ag = attn_ag if arch.n_experts == 1 else act
        if sp and arch.kv_lora_rank is not None:
            mla = _mla_sequence_parallel_comms(
                arch, tokens=tokens, b=b, quantised=quantised, hidden_ag=attn_ag, mlp_ag=mlp_ag
            )
            fwd += mla[FWD]
            bwd += mla[BWD]
        elif sp:  # Korthikanti et al. Sec. 4.2.2: g = all-gather, g-bar = reduce-scatter, swapped in backward

            def gathers() -> list[Comm]:  # attention side then MLP side, one Comm when equal
                if attn_ag == mlp_ag:
                    return [Comm("tp", "all_gather", attn_ag, 2)]
                return [Comm("tp", "all_gather", attn_ag, 1), Comm("tp", "all_gather", mlp_ag, 1)]

            fwd += [*gathers(), Comm("tp", "reduce_scatter", act, 2)]
            bwd += [
                Comm("tp", "reduce_scatter", act, 2),
                *gathers(),
                # Megatron re-gathers the sharded QKV / MLP-up input for the weight gradient,
                # asynchronously, behind the data-gradient GEMM.
                Comm("tp", "all_gather", attn_ag, 1, overlap_with="qkv.dgrad"),
                Comm("tp", "all_gather", mlp_ag, 1, overlap_with="mlp_up.dgrad"),
            ]
        else:
            # A parallel residual (x + attn(ln1(x)) + mlp(ln2(x))) trained by GPT-NeoX sums the two
            # row-parallel outputs before one all-reduce (megatron/model/transformer.py,
            # ParallelTransformerLayer.forward, gpt_j_residual); backward still all-reduces the
            # gradients of both column-parallel inputs. Serving engines (vLLM) reduce each output.
            fwd.append(Comm("tp", "all_reduce", act, 1 if arch.parallel_residual and training else 2))
            bwd.append(Comm("tp", "all_reduce", act, 2))
    if arch.n_experts > 1 and ep > 1:
        routed = (tokens // tp if sp else tokens) * arch.experts_top_k * arch.hidden * b
        fwd.append(Comm("ep", "all_to_all", routed, 2))
        bwd.append(Comm("ep", "all_to_all", routed, 2))
    if cp > 1:  # the K and V of S/cp tokens go around the ring, behind the attention blocks
        kv = 2 * batch * seq_q * max(1, arch.n_kv_heads // tp) * arch.head_dim * b
        fwd.append(Comm("cp", "send_recv", kv, cp - 1, overlap_with="attn_cp"))
        bwd.append(Comm("cp", "send_recv", 2 * kv, cp - 1, overlap_with="attn_cp.bwd"))
    return {FWD: tuple(fwd), BWD: tuple(bwd)}


def _mla_sequence_parallel_comms(
    arch: ArchSpec, *, tokens: int, b: int, quantised: str | None, hidden_ag: int, mlp_ag: int
) -> dict[str, tuple[Comm, ...]]:
    """A multi-head latent attention block's tensor-parallel collectives under sequence parallelism
    (Megatron-Core ``MLASelfAttention.get_query_key_value_tensors``): the down projections are duplicated and run
    on the local rows, so the attention side gathers the latents, not the hidden states: the query latent
    (``q_lora_rank``; the hidden states where ``linear_q_proj`` has no latent) and the KV latent
    (``kv_lora_rank``) into their column-parallel up projections (in the quantised format where those run in
    fp8, as :func:`block_comms` says), and the rope key (``qk_pos_emb_head_dim``,
    ``gather_from_sequence_parallel_region``, in the activation dtype). Backward reduce-scatters the three
    gradients, re-gathers the two latents for the up projections' weight gradients, and gathers the out
    projection's output gradient (hidden-wide, ``hidden_ag`` bytes). The MLP side (``mlp_ag``) is
    :func:`block_comms`'s."""
    assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
    hidden_elem = element_bytes(quantised) if quantised else b
    act = tokens * arch.hidden * b
    q_w = arch.q_lora_rank or arch.hidden
    q_ag, kv_ag = (math.ceil(tokens * w * hidden_elem) for w in (q_w, arch.kv_lora_rank))
    rope_ag = tokens * arch.qk_rope_head_dim * b
    q_role = "q_up" if arch.q_lora_rank else "q_proj"
    fwd = (
        Comm("tp", "all_gather", q_ag, 1),
        Comm("tp", "all_gather", kv_ag, 1),
        Comm("tp", "all_gather", rope_ag, 1),
        Comm("tp", "all_gather", mlp_ag, 1),
        Comm("tp", "reduce_scatter", act, 2),
    )
    bwd = (
        Comm("tp", "reduce_scatter", tokens * q_w * b, 1),
        Comm("tp", "reduce_scatter", tokens * arch.kv_lora_rank * b, 1),
        Comm("tp", "reduce_scatter", rope_ag, 1),
        Comm("tp", "reduce_scatter", act, 1),
        Comm("tp", "all_gather", hidden_ag, 1),
        Comm("tp", "all_gather", mlp_ag, 1),
        Comm("tp", "all_gather", q_ag, 1, overlap_with=f"{q_role}.dgrad"),
        Comm("tp", "all_gather", kv_ag, 1, overlap_with="kv_up.dgrad"),
        Comm("tp", "all_gather", mlp_ag, 1, overlap_with="mlp_up.dgrad"),
    )
    return {FWD: fwd, BWD: bwd}


def embedding_comms(arch: ArchSpec, *, tp: int, tokens: int, sp: bool, dtype: str) -> dict[str, tuple[Comm, ...]]:
    if tp == 1:
        return {FWD: (), BWD: ()}
    act = tokens * arch.hidden * dtype_bytes(dtype)
    # vocab-parallel embedding: partial rows summed over tp (reduce-scatter into the SP region with sp)
    fwd = (Comm("embed_tp", "reduce_scatter" if sp else "all_reduce", act),)
    bwd = (Comm("embed_tp", "all_gather", act),) if sp else ()
    return {FWD: fwd, BWD: bwd}


def head_comms(
    arch: ArchSpec, *, tp: int, tokens: int, sp: bool, dtype: str, loss: bool = True
) -> dict[str, tuple[Comm, ...]]:
    if tp == 1:
        return {FWD: (), BWD: ()}
    act = tokens * arch.hidden * dtype_bytes(dtype)
    fwd: list[Comm] = [Comm("head_tp", "all_gather", act)] if sp else []
    bwd: list[Comm] = [Comm("head_tp", "reduce_scatter" if sp else "all_reduce", act)]
    if loss:  # vocab-parallel cross entropy: max, target logit and sum of exp over tp, fp32 per token
        fwd.append(Comm("ce_tp", "all_reduce", 4 * tokens, 3))
    return {FWD: tuple(fwd), BWD: tuple(bwd)}


# --------------------------------------------------------------------------- assembled, cached


def _nodes(ops: list[Op], prec: Dtypes, casts: dict[str, CastOps] | None = None) -> tuple[Node, ...]:
    """Forward nodes of ``ops``, each fp8 linear preceded by its quantisation kernels (``casts``)."""
    out: list[Node] = []
    for role, kind, p, count in ops:
        out += [Node(r, prec.of(kk, pp), count * c) for r, kk, pp, c in (casts or {}).get(role, ([], [], []))[0]]
        out.append(Node(role, gemm_precision(role, prec).of(kind, p), count))
    return tuple(out)


def _bwd_nodes(ops: list[Op], prec: Dtypes, casts: dict[str, CastOps] | None = None) -> tuple[Node, ...]:
    """Backward nodes of ``ops``, each fp8 data- / weight-gradient GEMM preceded by its quantisation kernels."""
    out: list[Node] = []
    for role, kind, p, direction, count in backward_ops(ops):
        base, _, grad = role.partition(".")
        phase = {"dgrad": 1, "wgrad": 2}.get(grad) if kind == "gemm" else None
        before = (casts or {})[base][phase] if phase and base in (casts or {}) else []
        out += [Node(r, prec.of(kk, pp), count * c) for r, kk, pp, c in before]
        out.append(Node(role, gemm_precision(role, prec).of(kind, p, direction), count))
    return tuple(out)


@lru_cache(maxsize=4096)
def _block_passes(
    arch: ArchSpec,
    tp: int,
    batch: int,
    seq: int,
    sp: bool,
    cp: int,
    ep: int,
    attention: str,
    prec: Dtypes,
    whole_experts: bool = False,
) -> tuple[tuple[Node, ...], tuple[Node, ...], dict[str, tuple[Comm, ...]]]:
    """(forward nodes, backward nodes, collectives) of one block, whatever the recomputation: the
    graphs of the three modes share these objects (built once, costed once by the search)."""
    seq_q = seq // cp
    ops = block_ops(
        arch,
        tp=tp,
        batch=batch,
        seq_q=seq_q,
        seq_kv=seq_q,
        sp=sp,
        cp=cp,
        ep=ep,
        attention=attention,
        framework=prec.framework,
        whole_experts=whole_experts,
        fused_swiglu=prec.fused_swiglu,
    )
    comms = block_comms(
        arch,
        tp=tp,
        batch=batch,
        seq_q=seq_q,
        sp=sp,
        cp=cp,
        ep=ep,
        dtype=prec.act,
        quantised=prec.matrix if quantised(prec) else None,
    )
    amax = fp8_amax_comms(ops, prec, tp=tp, sp=sp)
    comms = {phase: comms[phase] + amax[phase] for phase in (FWD, BWD)}
    casts = fp8_casts(ops, prec, tp=tp, sp=sp)
    return _nodes(ops, prec, casts), _bwd_nodes(ops, prec, casts), comms


def recomputed_comms(fwd: tuple[Comm, ...], mods: frozenset[str], *, moe: bool) -> tuple[Comm, ...]:
    """The forward collectives that selective recomputation of ``mods`` repeats: a recomputed MLP (``mlp`` in a
    dense block, ``moe`` in an MoE one; normal checkpointing reruns the module with its communication) repeats
    the MLP side's tensor-parallel collectives, what :func:`block_comms` lists last (one all-gather and one
    reduce-scatter with sequence parallelism, else one all-reduce) and, for ``moe``, the
    token all-to-alls. The attention core and the output-discarding modules communicate nothing."""
    if not (mods & {"moe"} if moe else mods & {"mlp"}):
        return ()
    out: list[Comm] = []
    tp = [c for c in fwd if c.role == "tp"]
    gathers = [c for c in tp if c.kind == "all_gather"]
    if gathers:  # the attention side's, then the MLP side's (one Comm of count 2 where they are equal)
        out.append(gathers[-1] if len(gathers) > 1 else replace(gathers[0], count=1))
    out += [replace(c, count=1) for c in tp if c.kind != "all_gather"]
    if moe:
        out += [c for c in fwd if c.role == "ep"]
    return tuple(out)


@lru_cache(maxsize=4096)
def train_block(
    arch: ArchSpec,
    *,
    tp: int,
    batch: int,
    seq: int,
    sp: bool,
    cp: int,
    ep: int,
    attention: str,
    recompute: str,
    prec: Dtypes,
    whole_experts: bool = False,
) -> Graph:
    """One block's training graph per micro-batch (``seq`` = full sequence; ranks hold ``seq / cp``);
    ``whole_experts``: MoE parallel folding (:func:`opcast.predict.parallel.folded`)."""
    fwd, bwd, comms = _block_passes(arch, tp, batch, seq, sp, cp, ep, attention, prec, whole_experts)
    rec_nodes: tuple[Node, ...] = ()
    rec_comms: tuple[Comm, ...] = ()
    if recompute == "full":
        rec_nodes, rec_comms = fwd, comms[FWD]
    elif mods := recompute_modules(recompute):
        roles = recomputed_roles(mods, moe=arch.n_experts > 1, mla=arch.kv_lora_rank is not None)
        rec_nodes = tuple(n for n in fwd if n.role.split(".")[0] in roles)
        rec_comms = recomputed_comms(comms[FWD], mods, moe=arch.n_experts > 1)
    return Graph(
        nodes={FWD: fwd, BWD: bwd, RECOMPUTE: rec_nodes}, comms={FWD: comms[FWD], BWD: comms[BWD], RECOMPUTE: rec_comms}
    )


@lru_cache(maxsize=4096)
def train_extras(
    arch: ArchSpec, *, tp: int, batch: int, seq: int, sp: bool, cp: int, first: bool, last: bool, prec: Dtypes
) -> Graph:
    """The model-level ops of a first and/or last pipeline stage per micro-batch."""
    tokens = batch * (seq // cp)
    rows = tokens // tp if sp else tokens
    ops: list[Op] = []
    fwd_c: list[Comm] = []
    bwd_c: list[Comm] = []
    if first:
        ops += embedding_ops(arch, tp=tp, tokens=tokens, rows=rows)
        c = embedding_comms(arch, tp=tp, tokens=tokens, sp=sp, dtype=prec.act)
        fwd_c += c[FWD]
        bwd_c += c[BWD]
    if last:
        ops += head_ops(arch, tp=tp, tokens=tokens, rows=rows)
        c = head_comms(arch, tp=tp, tokens=tokens, sp=sp, dtype=prec.act)
        fwd_c += c[FWD]
        bwd_c += c[BWD]
    bwd = _bwd_nodes(ops, prec)
    if first and last and arch.tied_embeddings:
        # One matrix serves as embedding and LM head: autograd sums its two weight gradients, an
        # add over the (vocab-parallel, padded) matrix each backward. With pp > 1 the copies live
        # on two stages and Megatron all-reduces their gradients instead (embedding group).
        numel = padded_vocab(arch.vocab, tp) // tp * arch.hidden
        bwd += (Node("embedding.tied_grad", prec.of("elementwise", {"numel": numel, "fn": "add"}, "fwd"), 1),)
    return Graph(
        nodes={FWD: _nodes(ops, prec), BWD: bwd, RECOMPUTE: ()},
        comms={FWD: tuple(fwd_c), BWD: tuple(bwd_c), RECOMPUTE: ()},
    )


def graph_flops(graph: Graph, phases: tuple[str, ...] = (FWD, BWD)) -> float:
    """FLOPs of the kernels of ``graph`` in ``phases`` (registry formulas)."""
    return sum(n.count * n.kernel.flops() for ph in phases for n in graph.nodes[ph])
