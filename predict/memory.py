"""Memory per GPU: weights, gradients and optimizer states by ZeRO stage and precision;
activations by recomputation mode and the pipeline's in-flight micro-batches; the KV cache.

**Model states** (Rajbhandari et al. 2020, "ZeRO", arXiv 1910.02054, Sec. 3.1 and 5): mixed
precision with Adam keeps 2 bytes of 16-bit weights, 2 of 16-bit gradients and K = 12 of fp32
master weights, momentum and variance per parameter (16 per parameter in all); fp32 training 4 +
4 + 8. ZeRO-1 divides the optimizer states by the data-parallel degree N_d, ZeRO-2 also the
gradients, ZeRO-3 also the weights (plus a gathered-layer buffer for prefetch). N_d is dp x cp
(context-parallel ranks hold the same weights) and, for expert weights, dp x cp / ep.

The optimizer is a choice (``TrainConfig.optimizer``, :func:`optimizer_state_bytes`): Adam's
``exp_avg`` and ``exp_avg_sq`` (torch.optim.Adam; the ZeRO paper's K = 12 with the fp32 master
copy, Megatron-LM's distributed optimizer keeps the same), SGD's ``momentum_buffer``
(torch.optim.SGD, 4 B + the master copy), or ``none`` (forward + backward only, as NeuSight's
measured training runs: sitar-lab/NeuSight ``neusight/Tracing/trace.py`` ``measure_e2e`` builds no
optimizer and times ``model(x)`` and ``loss.backward()`` of an fp32 Hugging Face model).

**Activations** (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.1 Eq. 1, and Sec. 4.2 Eq. 2
with tensor parallelism, 16-bit): per layer and micro-batch ``sbh(34 + 5as/h)`` bytes without
parallelism. Of the 34: attention 11 (QKV input 2, Q and K 4, V 2, out-proj input 2, its
dropout mask 1), MLP 19 (input 2, activation input 8, down-proj input 8, dropout mask 1), the two
LayerNorm inputs 4. The ``5as/h`` term is the eager attention core, ``5 a s^2 b``: the softmax
output 2, the attention-dropout mask 1 and the dropped-out probabilities 2 that the
attention-over-V GEMM reads. An arch without attention dropout (``ArchSpec.attention_dropout``
0, e.g. OPT's ``attention_dropout: 0.0``; torch's dropout at p = 0 returns its input) keeps only
the softmax output, ``2as/h``; one without hidden dropout drops the two 1-byte masks (32 instead
of 34); FlashAttention keeps no ``s x s`` tensor at all. Korthikanti's other forms: ``sbh(10 + 24/t + 5as/(ht))`` with
tensor parallelism t, ``sbh/t (34 + 5as/h)`` with sequence parallelism too, ``34 sbh/t`` with
selective recomputation, and the layer input only with full recomputation. We derive these from
the tensors each op saves, so the same accounting covers GQA, gated MLPs, RMSNorm, families
without dropout, FlashAttention and MoE, and reduces exactly to Korthikanti's formulas for a GPT
block with eager attention (tests check both):

================================  =====================  ==============================
saved tensor                      bytes (B = act dtype)   Korthikanti (B = 2, a GPT block)
================================  =====================  ==============================
norm-1 input, QKV input           2 B sbh / sp            4 sbh
Q and K (after rope), V           B sb (a+2k) d / t       6 sbh / t
softmax out, its dropout mask,    (2B + 1) a s^2 b / t    5 a s^2 b / t   (eager only)
  dropout out                     (B a s^2 b / t without
                                  attention dropout)
FlashAttention logsumexp          4 a s b / t             --
out-proj input                    B sb a d / t            2 sbh / t
two dropout masks                 2 sbh / sp              2 sbh   (hidden dropout only)
norm-2 input, MLP input           2 B sbh / sp            4 sbh
MLP act input, down-proj input    2 B sb f / t            16 sbh / t      (f = 4h)
  (gated, fused SwiGLU: 3 B sb f / t)
post-norm inputs (Gemma)          2 B sbh / sp            --
================================  =====================  ==============================

(``sp`` is t with sequence parallelism and 1 without.) Pipelining keeps ``min(p - s, m)``
micro-batches in flight on stage s under 1F1B (stage 0: p of them, Korthikanti Sec. 4.2.3), and
Megatron's interleaved warm-up ``2(p - s - 1) + (v - 1)p + 1`` model chunks of ``L/(pv)`` layers,
which is Korthikanti's ``1 + (p - 1)/(pv)`` factor on stage 0. The first stage adds the embedding
dropout mask per in-flight micro-batch, the last the final-norm and LM-head inputs and the fp32
logits of the cross entropy, ``4 sbv/t`` (Korthikanti Sec. 4.3). With full recomputation one
layer's activations are materialised again during its backward (the working set).

Training in fp8 (Transformer Engine) the four block linears save fp8 copies of their inputs, 1 byte
an element (:func:`layer_activation_bytes`). mxfp8 and nvfp4 are priced the same, an assumption:
their saved copies carry block scales (MXFP8 8.25 bits an element) or are smaller (NVFP4 4.5 bits,
so its activations are overstated by under half a byte per saved linear input), and their weights,
gradients and optimizer states are fp8's.

With ``--offload-activations N`` (pp = 1; :mod:`opcast.predict.offload`) the first N layers' activations
go to host memory behind the compute: ``L - N + 1`` layers' stay on the GPU at the peak (one group in
flight), and the N offloaded ones are counted in host memory instead.

Not counted: the CUDA context, allocator fragmentation, NCCL and cuBLAS workspaces, and in fp8 TE's
cached fp8 copy and transpose of each linear's weight (2 bytes a weight under Megatron).
"""

from __future__ import annotations

from dataclasses import dataclass

from opcast.archs import ArchSpec, padded_vocab, routed_experts
from opcast.dtypes import dtype_bytes, quantises
from opcast.errors import OpcastError
from opcast.predict.frameworks import fp32_gradients
from opcast.predict.offload import resident_layers
from opcast.predict.recompute import recompute_modules

STATE_BYTES = {  # (weights, gradients, optimizer states) bytes per parameter
    "bf16": (2, 2, 12),
    "fp16": (2, 2, 12),
    "fp8": (2, 2, 12),
    "mxfp8": (2, 2, 12),
    "nvfp4": (2, 2, 12),
    "fp32": (4, 4, 8),
}
"""ZeRO paper Sec. 3.1 (mixed-precision Adam: 2 + 2 + K with K = 12); fp8 keeps 16-bit weights
and gradients (Transformer Engine casts to fp8 per GEMM); fp32 has no master copy."""

OPTIMIZERS = ("adam", "sgd", "none")
"""What the training step keeps besides weights and gradients (``TrainConfig.optimizer``)."""

FP32_MASTER_BYTES = 4
"""The fp32 master copy of a 16-bit weight that any optimizer step updates (ZeRO Sec. 3.1; Megatron's
``Float16OptimizerWithFloat16Params``)."""

OPTIMIZER_STATE_FP32_BYTES = {"adam": 8, "sgd": 4, "none": 0}
"""fp32 states per parameter: Adam/AdamW ``exp_avg`` and ``exp_avg_sq`` (torch.optim.Adam, 2 x 4 B);
SGD with momentum its ``momentum_buffer`` (torch.optim.SGD, 4 B; plain SGD without momentum keeps
none, which is what ``none`` prices below the master copy); ``none``: no optimizer step at all (a
forward + backward benchmark such as NeuSight's, which never builds an optimizer)."""


def optimizer_state_bytes(precision: str, optimizer: str = "adam") -> float:
    """Optimizer bytes per parameter: its fp32 states plus, in 16-bit or fp8 training, the fp32
    master weights any step updates (Adam: 4 + 8 = 12, the ZeRO paper's K; SGD with momentum 4 + 4;
    fp32 training has no master copy; ``none`` has no step and keeps nothing)."""
    if optimizer not in OPTIMIZER_STATE_FP32_BYTES:
        raise OpcastError(f"optimizer={optimizer!r} is not one of {', '.join(OPTIMIZERS)}; pass one of them")
    if optimizer == "none":
        return 0.0
    master = 0 if precision == "fp32" else FP32_MASTER_BYTES
    return float(master + OPTIMIZER_STATE_FP32_BYTES[optimizer])


FP32_GRAD_BYTES = 4
"""Bytes a parameter of an fp32 gradient buffer (Megatron's ``main_grad``)."""

ZERO3_PREFETCH_LAYERS = 2
"""Layers of gathered weights ZeRO-3 holds at once: the current one and the prefetched next."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds."""

    dense: int
    """Weights replicated across the data-parallel group (attention, dense MLP, norms, embeddings)."""
    expert: int
    """MoE expert weights (sharded over ep; their data-parallel group is dp x cp / ep)."""
    per_layer: int
    """All parameters of one block on this rank."""
    unquantised: int = 0
    """Of :attr:`dense`, those an fp8 or fp4 inference checkpoint keeps in the activations' dtype: the embeddings, the
    LM head, the MoE routers and the norms (:data:`opcast.predict.inference.UNQUANTISED_GEMMS`)."""

    @property
    def total(self) -> int:
        return self.dense + self.expert


def expert_data_parallel(*, tp: int, dp: int, cp: int, ep: int, fold: bool = False) -> int:
    """Ranks holding the same experts (their gradients' reduction group, their ZeRO shards): ``dp x cp / ep``, or
    with MoE parallel folding (:func:`opcast.predict.parallel.folded`) ``tp x dp x cp / ep``."""
    return max(1, (tp if fold else 1) * dp * cp // ep)


def rank_params(
    arch: ArchSpec,
    *,
    stage: int,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    ep: int,
    sharded: bool,
    layers: int | None = None,
    fold: bool = False,
) -> float:
    """Parameters of pipeline ``stage`` one rank holds a state of: all of them, or ``sharded`` (ZeRO) the dense ones
    over the dp x cp ranks and the experts over :func:`expert_data_parallel` (ZeRO paper Sec. 5). The one sharding
    rule of the model states and the optimizer step."""
    params = stage_params(arch, tp=tp, pp=pp, ep=ep, stage=stage, layers=layers, whole_experts=fold)
    if not sharded:
        return float(params.total)
    return params.dense / (dp * cp) + params.expert / expert_data_parallel(tp=tp, dp=dp, cp=cp, ep=ep, fold=fold)


def layer_params(arch: ArchSpec, tp: int, ep: int = 1, whole_experts: bool = False) -> tuple[int, int]:
    """(dense, expert) parameters of one block on one rank; the experts split over ``tp`` too unless
    ``whole_experts`` (an inference engine's expert parallelism)."""
    heads, kv = arch.n_heads // tp, max(1, arch.n_kv_heads // tp)
    qkv_out = (heads + 2 * kv) * arch.head_dim
    attn = arch.hidden * qkv_out + heads * arch.head_dim * arch.hidden
    if arch.linear_bias:
        attn += qkv_out + arch.hidden
    attn += heads if arch.attention_sinks else 0
    if arch.kv_lora_rank is not None:
        attn = arch.mla_params(tp)
    mlp = arch.mlp_params(arch.ffn_hidden // (1 if whole_experts and arch.n_experts > 1 else tp))
    norms = block_norm_params(arch)
    if arch.n_experts == 1:
        return attn + mlp + norms, 0
    return attn + norms + arch.router_params() + arch.shared_expert_params(tp), (arch.n_experts // ep) * mlp


def block_norm_params(arch: ArchSpec) -> int:
    """The norm weights of one block (its pre-norms, post-norms with ``norms_per_block``, and per-head q/k norms)."""
    return arch.norms_per_block * arch.norm_params() + (2 * arch.head_dim if arch.qk_norm else 0)


def stage_params(
    arch: ArchSpec,
    *,
    tp: int,
    pp: int,
    ep: int = 1,
    stage: int = 0,
    layers: int | None = None,
    whole_experts: bool = False,
) -> StageParams:
    """Parameters on one rank of pipeline ``stage``: its ``layers`` blocks (default ``n_layers / pp``;
    an uneven split gives each stage's own, :func:`opcast.predict.parallel.pipeline_split`), the
    vocab-parallel embedding (and learned positions) on stage 0, the final norm and LM head on the
    last (a tied head is a second copy of the embedding when pp > 1, as in Megatron-LM)."""
    dense_l, expert_l = layer_params(arch, tp, ep, whole_experts)
    layers = arch.n_layers // pp if layers is None else layers
    dense, expert = layers * dense_l, layers * expert_l
    unquantised = layers * block_norm_params(arch)
    # DeepSeek's first blocks: a dense MLP instead of the experts (the stage's layers start at stage x layers:
    # exact for an even split; an uneven one is taken as if even)
    first = min(layers, max(0, (arch.dense_layers or 0) - stage * layers))
    if first:
        assert arch.dense_ffn_hidden is not None
        moe_dense = arch.router_params() + arch.shared_expert_params(tp)  # router and shared expert
        dense += first * (arch.mlp_params(arch.dense_ffn_hidden // tp) - moe_dense)
        expert -= first * expert_l
    unquantised += (layers - first) * arch.router_params()
    vocab_slice = padded_vocab(arch.vocab, tp) // tp * arch.hidden
    edges = 0
    if stage == 0:
        edges += vocab_slice + (arch.max_seq * arch.hidden if arch.position == "learned" else 0)
    if stage == pp - 1:
        edges += arch.norm_params()
        if not arch.tied_embeddings or pp > 1:
            edges += vocab_slice
    return StageParams(
        dense=dense + edges, expert=expert, per_layer=dense_l + expert_l, unquantised=unquantised + edges
    )


# --------------------------------------------------------------------------- activations


def layer_activation_bytes(
    arch: ArchSpec,
    *,
    tp: int,
    sp: bool,
    batch: int,
    seq: int,
    cp: int = 1,
    ep: int = 1,
    attention: str = "flash",
    recompute: str = "none",
    dtype: str = "bf16",
    fp8: bool = False,
    whole_experts: bool = False,
) -> float:
    """Bytes one block keeps for its backward, per micro-batch, on one rank (see the module table);
    ``whole_experts``: MoE parallel folding (each rank's experts whole, over its sequence-parallel tokens).

    ``seq`` is the full sequence; a context-parallel rank holds ``seq / cp`` of it. ``recompute``: none, full,
    selective or Megatron-Core's ``selective:MODULE[+MODULE...]``; what each module frees is in
    :mod:`opcast.predict.recompute`.

    ``fp8`` (the block's four linears in Transformer Engine's fp8, activations in ``dtype``): each of
    them saves the fp8 copy of its input for the weight gradient, 1 byte an element, not the
    ``dtype`` one (TE v1.13 ``module/linear.py`` ``_Linear.forward``: ``ctx.save_for_backward`` of
    ``saved_inputmat_t`` = the fp8 ``inputmat_t`` of ``fp8_cast_transpose_fused``, or the fp8
    ``inputmat`` of ``cast_to_fp8`` with sequence parallelism; ``module/layernorm_linear.py``
    ``_LayerNormLinear.forward`` saves the norm's input in ``dtype`` and its fp8 ``ln_out``;
    ``module/grouped_linear.py`` ``_GroupedLinear.forward`` the fp8 ``inputmats(_t)``). Where another
    op keeps the ``dtype`` tensor for itself, it stays: the attention output that FlashAttention /
    TE's ``FusedAttnFunc.forward`` saves (``qkvo_tensors = (q, k, v, out_save)``) unless selective
    recomputation rebuilds it, the activation's input, an MoE block's MLP input (the bf16 router's).
    """
    B = dtype_bytes(dtype)
    lin = dtype_bytes("fp8") if fp8 else B  # a block linear's saved input
    s = seq // cp
    sbh = s * batch * arch.hidden
    div = tp if sp else 1
    if recompute == "full":
        return B * sbh / div
    mods = recompute_modules(recompute)
    moe, mla = arch.n_experts > 1, arch.kv_lora_rank is not None
    heads, kv = arch.n_heads // tp, max(1, arch.n_kv_heads // tp)
    attn_dropout, hidden_dropout = arch.attention_dropout_p > 0, arch.hidden_dropout_p > 0
    tokens = s * batch
    # norm-1 input, QKV input; an MLA block's input norm is a module of its own, whose output (the down
    # projections' input) ``layernorm`` frees where they keep it themselves (in fp8 each keeps its own fp8 copy)
    out = B * sbh / div + (0 if mla and "layernorm" in mods and not fp8 else lin * sbh / div)
    # Q, K, V (multi-head latent attention: as head_dim-wide heads; for DeepSeek-V3 at tp 1 its 128-wide V and
    # attention output counted 192 wide, 16k values a token and layer too many, its latents and their norms'
    # inputs, about 4k, not counted); ``mla_up_proj`` frees them and rebuilds them from the latents
    if not (mla and "mla_up_proj" in mods):
        out += B * tokens * (heads + 2 * kv) * arch.head_dim
    if arch.qk_norm:  # the per-head norms' inputs (Q and K before the norm)
        out += B * tokens * (heads + kv) * arch.head_dim
    core_attn = "core_attn" in mods
    if not core_attn:
        if attention == "eager":
            pairs = batch * heads * (s * s + (cp - 1) * s * (s // 2))  # score entries of this rank's blocks
            # softmax out (+ with dropout: its 1-byte mask and the dropped-out probabilities the PV GEMM reads;
            # without, torch's dropout at p = 0 returns its input and the GEMM reads the softmax output)
            out += (2 * B + 1 if attn_dropout else B) * pairs
        else:
            out += 4 * batch * heads * s * (1 + (cp - 1))  # fp32 logsumexp per query and block
    # out-proj input (in fp8 its fp8 copy, beside the bf16 attention output FlashAttention keeps)
    attn_out = lin + (B if fp8 and attention != "eager" and not core_attn else 0)
    out += attn_out * tokens * heads * arch.head_dim
    out += 2 * sbh / div if hidden_dropout else 0  # two 1-byte dropout masks
    out += 2 * B * sbh / div if arch.post_norms else 0  # the post-norms' inputs (Gemma)
    ffn = arch.ffn_hidden // tp
    act_in = (2 if arch.gated_mlp else 1) * ffn  # the activation's input (with the gate)
    if not moe:
        out += B * sbh / div  # norm-2 input
        if "mlp" not in mods:  # MLP input, act input (+ gate) and down-proj input; ``mlp`` keeps only its input
            out += lin * sbh / div + (B * act_in + lin * ffn) * tokens
    else:
        # norm-2 input, MLP input (the router's, bf16; ``layernorm`` frees it, ``moe`` keeps it as its input)
        out += B * sbh / div + (0 if "layernorm" in mods and "moe" not in mods else B * sbh / div)
        if whole_experts:  # folded: whole experts over the rank's sequence-parallel share of the tokens
            ffn, act_in = arch.ffn_hidden, (2 if arch.gated_mlp else 1) * arch.ffn_hidden
        experts, rows = routed_experts(arch, tokens=-(-tokens // tp) if whole_experts else tokens, ep=ep)
        routed_rows = experts * rows
        if "moe" not in mods:
            # permuted expert inputs and activations; ``moe_act`` frees the down projection's input where it is the
            # activation's output itself (in fp8 the grouped linear keeps its own fp8 copy)
            down_in = 0 if "moe_act" in mods and not fp8 else lin * ffn
            out += routed_rows * (lin * arch.hidden + B * act_in + down_in)
            out += 4 * tokens * arch.n_experts  # fp32 router probabilities
        if arch.shared_expert_ffn is not None and not mods & {"moe", "shared_experts"}:
            # the shared expert's act input (+ gate) and down-proj input
            shared_ffn = arch.shared_expert_ffn // tp
            out += (B * (2 if arch.gated_mlp else 1) * shared_ffn + lin * shared_ffn) * tokens
    return float(out)


def in_flight_layers(
    *, n_layers: int, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1, layers: int | None = None
) -> float:
    """Layers' worth of activations stage ``stage`` holds at its peak (1F1B or interleaved);
    ``layers``: the stage's own layers when the split is uneven (default ``n_layers / pp``; its
    chunks of an interleaved schedule are taken as ``layers / virtual_stages`` each)."""
    if layers is not None and layers * pp != n_layers:  # uneven: this stage's own layers
        if virtual_stages <= 1:
            return float(min(pp - stage, micro_batches) * layers)
        chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, micro_batches * virtual_stages)
        return chunks * layers / virtual_stages
    if virtual_stages <= 1:
        return min(pp - stage, micro_batches) * n_layers / pp
    chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, micro_batches * virtual_stages)
    return chunks * n_layers / (pp * virtual_stages)


def in_flight_micro_batches(*, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose first-stage inputs are alive at stage ``stage``'s peak."""
    if virtual_stages <= 1:
        return float(min(pp - stage, micro_batches))
    chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, micro_batches * virtual_stages)
    return chunks / virtual_stages


def stage_total_bytes(
    weights: float,
    gradients: float,
    optimizer_states: float,
    activations: float,
    working_set: float = 0.0,
    zero3_gather: float = 0.0,
    kv_cache: float = 0.0,
) -> float:
    """Bytes per GPU of a stage from its parts (:attr:`Memory.total_bytes`; the search sums the same way)."""
    return weights + gradients + optimizer_states + activations + working_set + zero3_gather + kv_cache


@dataclass(frozen=True, kw_only=True, slots=True)
class Memory:
    """Bytes per GPU on one pipeline stage."""

    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_states_bytes: float
    activations_bytes: float
    activation_working_set_bytes: float = 0.0
    """Full recomputation: one layer's activations rebuilt during its backward."""
    zero3_gather_bytes: float = 0.0
    """ZeRO-3: gathered full weights of the current and prefetched layer."""
    kv_cache_bytes: float = 0.0
    host_activations_bytes: float = 0.0
    """``--offload-activations``: the offloaded layers' activations, in pinned host memory (not GPU memory)."""

    @property
    def total_bytes(self) -> float:
        return stage_total_bytes(
            self.weights_bytes,
            self.gradients_bytes,
            self.optimizer_states_bytes,
            self.activations_bytes,
            self.activation_working_set_bytes,
            self.zero3_gather_bytes,
            self.kv_cache_bytes,
        )

    def breakdown(self) -> dict[str, float]:
        """Bytes by part; parts that are zero (inference has no gradients) are left out."""
        out = {"weights": self.weights_bytes}
        for key, value in (("gradients", self.gradients_bytes), ("optimizer_states", self.optimizer_states_bytes)):
            if value:
                out[key] = value
        out["activations"] = self.activations_bytes
        for key, value in (
            ("activation_working_set", self.activation_working_set_bytes),
            ("zero3_gather", self.zero3_gather_bytes),
            ("kv_cache", self.kv_cache_bytes),
        ):
            if value:
                out[key] = value
        return out


def activation_dtype(precision: str) -> str:
    """The dtype of activations, attention, norms and pointwise ops (and the gradients and pipeline
    messages sized by them) when computing in ``precision``: fp8 trains with bf16 activations
    (Transformer Engine casts to fp8 per GEMM), every other precision in itself. The one rule."""
    return "bf16" if quantises(precision) else precision


def model_state_bytes(
    arch: ArchSpec,
    *,
    stage: int,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    ep: int,
    zero: int,
    precision: str,
    layers: int | None = None,
    framework: str | None = None,
    optimizer: str = "adam",
    grad_reduce_in_fp32: bool | None = None,
    fold: bool = False,
) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer states, ZeRO-3 gather buffer) bytes per GPU of pipeline
    ``stage``: :data:`STATE_BYTES` per parameter (gradients in fp32 where ``framework`` keeps an fp32
    ``main_grad``, :func:`opcast.predict.frameworks.fp32_gradients`: Megatron's 18 bytes with Adam), sharded over the
    N_d = dp x cp ranks (expert weights over dp x cp / ep) from ZeRO stage 3, 2 and 1 on (ZeRO paper Sec. 5);
    the optimizer states by ``optimizer`` (:func:`optimizer_state_bytes`; Adam is the table's K)."""
    params = stage_params(arch, tp=tp, pp=pp, ep=ep, stage=stage, layers=layers, whole_experts=fold)
    w, g, _ = STATE_BYTES[precision]
    o = optimizer_state_bytes(precision, optimizer)
    if fp32_gradients(framework, grad_reduce_in_fp32):
        g = max(g, FP32_GRAD_BYTES)

    def shard(per_param: float, sharded: bool) -> float:
        held = rank_params(
            arch, stage=stage, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sharded=sharded, layers=layers, fold=fold
        )
        return per_param * held

    gather = ZERO3_PREFETCH_LAYERS * w * params.per_layer if zero == 3 else 0.0
    return shard(w, zero >= 3), shard(g, zero >= 2), shard(o, zero >= 1), gather


def layer_activation_terms(
    arch: ArchSpec,
    *,
    tp: int,
    sp: bool,
    batch: int,
    seq: int,
    cp: int,
    ep: int,
    attention: str,
    recompute: str,
    dtype: str,
    fp8: bool = False,
    whole_experts: bool = False,
) -> tuple[float, float]:
    """(bytes one block keeps per micro-batch, the working set its backward rebuilds): with full
    recomputation one layer's activations are materialised again during its backward; ``fp8``: see
    :func:`layer_activation_bytes`."""

    def saved(mode: str) -> float:
        return layer_activation_bytes(
            arch,
            tp=tp,
            sp=sp,
            batch=batch,
            seq=seq,
            cp=cp,
            ep=ep,
            attention=attention,
            recompute=mode,
            dtype=dtype,
            fp8=fp8,
            whole_experts=whole_experts,
        )

    return saved(recompute), saved("none") if recompute == "full" else 0.0


def run_layer_activation_terms(
    arch: ArchSpec,
    *,
    tp: int,
    sp: bool,
    micro_batch: int,
    seq: int,
    cp: int,
    ep: int,
    attention: str,
    recompute: str,
    precision: str,
    fold: bool = False,
) -> tuple[float, float]:
    """:func:`layer_activation_terms` of a run in ``precision``: its activation dtype, and the block linears'
    inputs saved in fp8 where the precision quantises them (:func:`opcast.dtypes.quantises`); ``fold``: MoE
    parallel folding. The one mapping the memory, the search and the activation offload share."""
    return layer_activation_terms(
        arch,
        tp=tp,
        sp=sp,
        batch=micro_batch,
        seq=seq,
        cp=cp,
        ep=ep,
        attention=attention,
        recompute=recompute,
        dtype=activation_dtype(precision),
        fp8=quantises(precision),
        whole_experts=fold,
    )


def stage_activation_bytes(
    arch: ArchSpec,
    *,
    stage: int,
    pp: int,
    tp: int,
    sp: bool,
    cp: int,
    micro_batch: int,
    seq: int,
    micro_batches: int,
    virtual_stages: int,
    per_layer_bytes: float,
    dtype: str,
    layers: int | None = None,
    offload_layers: int = 0,
) -> float:
    """Activations stage ``stage`` holds at its peak: ``per_layer_bytes`` (see
    :func:`layer_activation_terms`) times its in-flight layers (with ``offload_layers`` of a single stage
    offloaded, :func:`opcast.predict.offload.resident_layers` of them), the embedding dropout mask of each
    in-flight micro-batch on the first stage, the final-norm and LM-head inputs and the fp32
    logits on the last (module docstring)."""
    in_flight = in_flight_layers(
        n_layers=arch.n_layers,
        pp=pp,
        stage=stage,
        micro_batches=micro_batches,
        virtual_stages=virtual_stages,
        layers=layers,
    )
    if offload_layers:  # pp = 1 (validated): one micro-batch's layers in flight
        in_flight = float(resident_layers(round(in_flight), offload_layers))
    acts = per_layer_bytes * in_flight
    B = dtype_bytes(dtype)
    sbh = (seq // cp) * micro_batch * arch.hidden
    div = tp if sp else 1
    if stage == 0 and arch.hidden_dropout_p > 0:
        acts += (
            sbh
            / div
            * in_flight_micro_batches(pp=pp, stage=0, micro_batches=micro_batches, virtual_stages=virtual_stages)
        )
    if stage == pp - 1:
        acts += 2 * B * sbh / div + 4 * (seq // cp) * micro_batch * padded_vocab(arch.vocab, tp) // tp
    return acts


def fullest_stages(pp: int) -> tuple[int, ...]:
    """The stages whose memory can be the largest: the first and the last. A middle stage holds
    neither the embedding nor the head, and no more in-flight activations than the first."""
    return (0,) if pp == 1 else (0, pp - 1)


def train_memory(
    arch: ArchSpec,
    *,
    stage: int,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    ep: int,
    sp: bool,
    micro_batch: int,
    seq: int,
    micro_batches: int,
    virtual_stages: int,
    zero: int,
    precision: str,
    attention: str,
    recompute: str,
    layers: int | None = None,
    framework: str | None = None,
    optimizer: str = "adam",
    offload_layers: int = 0,
    grad_reduce_in_fp32: bool | None = None,
    fold: bool = False,
) -> Memory:
    """Memory of one GPU of pipeline ``stage`` during training: :func:`model_state_bytes`,
    :func:`layer_activation_terms` and :func:`stage_activation_bytes` (the search memoises the
    same three); ``layers``: the stage's transformer layers when the pipeline split is uneven;
    ``offload_layers``: ``--offload-activations`` (:mod:`opcast.predict.offload`)."""
    w, g, o, gather = model_state_bytes(
        arch,
        stage=stage,
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        zero=zero,
        precision=precision,
        layers=layers,
        framework=framework,
        optimizer=optimizer,
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        fold=fold,
    )
    act_dtype = activation_dtype(precision)
    per_layer, working = run_layer_activation_terms(
        arch,
        tp=tp,
        sp=sp,
        micro_batch=micro_batch,
        seq=seq,
        cp=cp,
        ep=ep,
        attention=attention,
        recompute=recompute,
        precision=precision,
        fold=fold,
    )
    acts = stage_activation_bytes(
        arch,
        stage=stage,
        pp=pp,
        tp=tp,
        sp=sp,
        cp=cp,
        micro_batch=micro_batch,
        seq=seq,
        micro_batches=micro_batches,
        virtual_stages=virtual_stages,
        per_layer_bytes=per_layer,
        dtype=act_dtype,
        layers=layers,
        offload_layers=offload_layers,
    )
    return Memory(
        stage=stage,
        weights_bytes=w,
        gradients_bytes=g,
        optimizer_states_bytes=o,
        activations_bytes=acts,
        activation_working_set_bytes=working,
        zero3_gather_bytes=gather,
        host_activations_bytes=per_layer * offload_layers,
    )


def overflow_reason(memory: Memory, device, fix: str) -> str | None:
    """Why ``memory`` (a GPU's worst stage) does not fit ``device``, with ``fix`` (what to try),
    or None when it fits: the one wording of the memory reason of an infeasible configuration."""
    if memory.total_bytes <= device.mem_bytes:
        return None
    parts = ", ".join(f"{key} {v / 2**30:.1f}" for key, v in memory.breakdown().items())
    return (
        f"does not fit: stage {memory.stage} needs {memory.total_bytes / 2**30:.1f} GiB per GPU ({parts} GiB) "
        f"> {device.name}'s {device.mem_bytes / 2**30:.0f} GiB, over by "
        f"{(memory.total_bytes - device.mem_bytes) / 2**30:.1f} GiB; {fix}"
    )


def kv_cache_bytes(arch: ArchSpec, *, tp: int, pp: int, batch: int, tokens: int, dtype: str) -> float:
    """K and V of ``tokens`` positions for ``batch`` sequences on one rank: ``2 b T k d B L / pp``; under
    multi-head latent attention the latent and the rope key, ``b T (kv_lora_rank + qk_rope_head_dim) B L / pp``,
    whole on every tensor-parallel rank (vLLM's MLA cache: one latent "head", not split by heads). A
    sliding-window block holds the last ``min(T, sliding_window)`` positions only (vLLM's hybrid KV cache manager,
    ``SlidingWindowManager``, frees the blocks that slide out); the stage's share of the windowed blocks is the
    arch's (they alternate in gpt-oss)."""
    if arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None:
        per_token = float(arch.kv_lora_rank + arch.qk_rope_head_dim)
    else:
        per_token = 2.0 * max(1, arch.n_kv_heads // tp) * arch.head_dim
    layers = arch.n_layers // pp
    windowed = layers * arch.windowed_layers / arch.n_layers
    held = (layers - windowed) * tokens + windowed * min(tokens, arch.sliding_window or tokens)
    return batch * held * per_token * dtype_bytes(dtype)
