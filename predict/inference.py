"""One batch of LLM inference: prefill, then token-by-token decode with a KV cache.

- **Prefill** (time to first token): one forward of ``batch x prompt_len`` tokens through every
  pipeline stage in turn (a single batch does not fill a pipeline), with the KV-cache writes, the
  TP collectives and the stage-to-stage sends; the LM head runs on the last position only.
- **Decode**: each step is a forward of ``batch`` tokens whose attention reads the cache of
  ``prompt_len + i`` positions. Steps differ only in that length, and attention time is close to
  linear in it, so the time per output token is the mean over up to :data:`DECODE_SAMPLES` evenly
  spaced steps (all steps when there are fewer) -- exact for a linear law.
- **Engine overhead** (``engine``, default none): a serving framework's CPU time per step that the
  GPU does not hide (scheduling, input preparation, sampling), from
  :func:`opcast.predict.serve.engine.step_overhead` (of ``engine_version``): the prefill pays one step's at
  ``batch`` sequences, and so does every decode step. The engine also decides each TP all-reduce:
  its own call where it would run one (:func:`opcast.predict.serve.engine.tp_all_reduce_kind`:
  vLLM and SGLang on one NVLink node under 8 MiB, TensorRT-LLM on one node), NCCL's otherwise; without an engine,
  NCCL's.
  ``cost_sources["tp_all_reduce"]`` counts the calls of each kind and how each was priced. And the kernels it
  runs (:func:`infer_precision`): an MoE block's fused kernel (under vllm, Marlin's for MXFP4 experts where that
  release runs it, else vLLM's own; TensorRT-LLM's otherwise) and a one-kernel rope.
- ``total = TTFT + (gen_len - 1) x TPOT``; throughput ``batch x gen_len / total``.
- **A batch past the engine's KV cache** (:func:`engine_wave`): with an engine whose KV cache (its share of the GPU,
  prefilling in chunks of its token budget) cannot hold the batch at its final length, TensorRT-LLM runs it in waves
  of what it holds, each to its end before the next (its ``GUARANTEED_NO_EVICT`` scheduler), and vLLM and SGLang,
  which admit more and preempt, are simulated on it (:func:`_in_waves`). Without an engine, or when not one sequence
  fits, the static accounting below refuses the batch.
- **Quantised checkpoints** (an fp8 or fp4 ``precision``): the linears of the blocks run in it; the LM head and an
  MoE router stay in the activations' dtype (:data:`UNQUANTISED_GEMMS`), and so do their weights, the embeddings'
  and the norms' (:attr:`opcast.predict.memory.StageParams.unquantised`).
- **Memory** per GPU: weights of the stage in the serving precision, the KV cache at its final
  length ``2 b (prompt + gen) k d B L / pp``, and the prefill working set of one block (its
  largest live tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Final, get_args

from opcast.archs import ArchSpec, balanced_equivalent_tokens, padded_vocab
from opcast.dtypes import dtype_bytes, element_bytes, weight_storage_bytes
from opcast.hardware import DeviceSpec
from opcast.predict.comm import TRTLLM_ALL_REDUCE, Collective, CollectiveCostModel, Group, place
from opcast.predict.cost import KernelCostModel, roofline_only
from opcast.predict.cost.query import LEARNED, Kernel, kernel
from opcast.predict.graph import (
    FP8_LINEARS,
    FWD,
    Comm,
    Dtypes,
    block_comms,
    block_ops,
    embedding_ops,
    head_ops,
    precision_of,
)
from opcast.predict.memory import Memory, kv_cache_bytes, overflow_reason, stage_params
from opcast.predict.moe_dispatch import ep_dispatch, infer_dispatcher
from opcast.predict.parallel import Cluster, InferConfig, Precision, device_reasons, validate_infer
from opcast.predict.serve.engine import (
    CUSTOM_ALL_REDUCE_RULES,
    ENGINE_GEMM_FAMILIES,
    MXFP4_MOE_DTYPE,
    allreduce_rms_fused,
    engine_fp8_gemm_s,
    engine_mxfp4_moe,
    fp8_kv_decode_fraction,
    fusions_of,
    moe_impl,
    static_fp8_quant_s,
    step_overhead,
    tp_all_reduce_kind,
)
from opcast.predict.serve.vllm_memory import FUSED_MOE_CHUNK_TOKENS, ExpertLayout

ALLREDUCE_FUSED_ROLES: Final = ("norm1", "norm2", "residual_add", "final_norm")
"""The kernels vLLM's ``allreduce_rms`` fusion folds into the all-reduce before them (the residual add and RMSNorm
after each TP all-reduce: the embedding's before the first block's norm, the output projection's and the MLP's
after, the last block's before the final norm; :data:`~opcast.predict.serve.engine.VLLM_FUSIONS`)."""
FUSED_QUANT_INPUTS: Final = ("qkv", "mlp_up")
"""The fp8 linears whose input that fused kernel writes already quantised (after the two RMSNorms of a block)."""

DECODE_SAMPLES = 16
"""Decode steps priced explicitly; the rest follow by averaging (attention is linear in length)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InferResult:
    arch: ArchSpec
    device: DeviceSpec
    config: InferConfig
    feasible: bool
    reasons: tuple[str, ...] = ()
    cluster: Cluster | None = None
    ttft_s: float | None = None
    """Time to first token: the prefill."""
    tpot_s: float | None = None
    """Mean time per output token after the first."""
    total_latency_s: float | None = None
    tokens_per_s: float | None = None
    """Generated tokens per second over the whole request batch."""
    kv_cache_bytes: float | None = None
    """Per GPU, at the final length."""
    memory: Memory | None = None
    breakdown_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """prefill / decode_step: compute, tp_comm (with ``ep > tp``, the experts' all-to-alls too), pp_comm (and
    overhead, with an engine)."""
    ops: tuple[dict[str, Any], ...] = ()
    cost_sources: dict[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.total_bytes <= self.device.mem_bytes


ENGINE_KERNELS: tuple[tuple[str, str], ...] = (("rope", "fused"),)
"""(kind, ``impl``) every serving engine runs as one kernel where the registry default is Hugging Face's torch ops:
rotary embeddings, applied to the queries and keys in one launch (vLLM ``RotaryEmbedding.forward_cuda``,
``_custom_ops.rotary_embedding``, or its torch.compile'd native form; SGLang's ``sgl_kernel`` rope; TensorRT-LLM
inside its attention's QKV preprocessing), not ``apply_rotary_pos_emb``'s chain of eager kernels. Likewise a
SiLU-gated MLP's activation (``block_ops(fused_swiglu=True)`` under an engine: vLLM ``SiluAndMul`` /
``torch.ops._C.silu_and_mul``, SGLang's ``silu_and_mul``, TensorRT-LLM's fused gated activation)."""


UNQUANTISED_GEMMS: frozenset[str] = frozenset({"lm_head", "router"})
"""The GEMMs an fp8 or fp4 inference checkpoint keeps in the activations' dtype: the LM head and an MoE block's router.
NVIDIA Model Optimizer's quantisation configs (the FP8 and NVFP4 checkpoints TensorRT-LLM, vLLM and SGLang serve)
disable the quantizers of ``*lm_head*``, ``*router*``, ``*mlp.gate.*`` and ``*block_sparse_moe.gate*``
(``modelopt/torch/quantization/config.py``, ``_default_disabled_quantizer_cfg``), and DeepSeek-V3's fp8 checkpoint
stores its ``lm_head`` and its routers' ``gate`` weights in bf16; the engines load such a layer as an unquantised
linear. Every other GEMM of the blocks runs in the precision's kernel dtype, but for :data:`VLLM_UNQUANTISED_GEMMS`."""
VLLM_UNQUANTISED_GEMMS: frozenset[str] = frozenset({"q_absorb", "v_absorb"})
"""The GEMMs ``--engine vllm`` also runs in the activations' dtype: an MLA decode's absorbed projections. vLLM
dequantises ``kv_b_proj`` at load time and keeps bf16 copies of ``W_UK_T`` and ``W_UV`` ("we currently do not have
quantized bmm's which are needed for `W_UV` and `W_UK_T`, we just store fp16/bf16 copies and perform the bmm's in
16-bit": ``MLACommonImpl.process_weights_after_loading``, ``vllm/attention/backends/mla/common.py``); SGLang runs
them in fp8 (``bmm_fp8`` on an fp8 checkpoint's ``w_kc`` / ``w_vc``, ``python/sglang/srt/models/deepseek_v2.py``)."""


def infer_precision(cfg: InferConfig, arch: ArchSpec, device: DeviceSpec) -> Dtypes:
    """The kernels' dtypes of an inference run of ``arch`` on ``device`` in ``cfg.precision``, its MoE blocks' fused
    kernel the family of ``cfg.engine`` at ``cfg.engine_version`` (:func:`opcast.predict.serve.engine.moe_impl`:
    vLLM's own under ``--engine vllm``, Marlin's for MXFP4 experts where vLLM runs it or ``cfg.mxfp4_moe`` says so,
    else TensorRT-LLM's; MXFP8 activations under ``mxfp4_moe`` mxfp8 or, where it says nothing, where the engine
    quantises them itself (:func:`opcast.predict.serve.engine.engine_mxfp4_moe`: TensorRT-LLM and SGLang on
    Blackwell),
    :attr:`~opcast.predict.graph.Dtypes.moe_matrix`),
    its per-tensor fp8 GEMMs the engine's family (:data:`opcast.predict.serve.engine.ENGINE_GEMM_FAMILIES`), its
    decode over an fp8 cache as its kernel gains (:func:`opcast.predict.serve.engine.fp8_kv_decode_fraction`), and
    under any engine its single-kernel rotary embedding (:data:`ENGINE_KERNELS`). Every
    priced forward (:func:`predict_infer`, :func:`forward_time_s`, the serving tables) and the report read the
    kernels through it."""
    prec = precision_of(cfg.precision, cfg.tensor_cores)
    mxfp4 = cfg.mxfp4_moe or engine_mxfp4_moe(cfg.engine, device)
    block_fp8 = block_fp8_moe(arch, prec)
    impl = moe_impl(cfg.engine, device, arch.expert_weights, cfg.engine_version, mxfp4, block_fp8=block_fp8)
    mxfp8 = mxfp4 == "mxfp8" and arch.expert_weights == "mxfp4"
    impls = (*prec.impls, ("moe", impl), *(ENGINE_KERNELS if cfg.engine != "none" else ()))
    kv = kv_cache_dtype(cfg, prec.act)
    gemm = ENGINE_GEMM_FAMILIES.get(cfg.engine)
    fraction = fp8_kv_decode_fraction(cfg.engine, device) if kv == "fp8" != prec.act else None
    return replace(
        prec,
        impls=impls,
        kv=kv if kv != prec.act else None,
        fp8_gemm_impl=gemm,
        kv_decode_fraction=fraction,
        moe_matrix=MXFP4_MOE_DTYPE if mxfp8 or block_fp8 else None,  # both run the block-scaled fp8 MoE kernels
    )


def block_fp8_moe(arch: ArchSpec, prec: Dtypes) -> bool:
    """Whether ``arch``'s routed experts run as block-scaled fp8 MoE kernels at ``prec``: a checkpoint of 128 x 128
    block-scaled fp8 weights (:attr:`opcast.archs.ArchSpec.fp8_block_checkpoint`) served in fp8. The engines run
    its fused MoE on those blocks (vLLM's Triton ``fp8_w8a8`` with ``block_shape``, SGLang's ``fused_moe_triton``,
    priced by vLLM's rows (:func:`opcast.predict.serve.engine.moe_impl`), TensorRT-LLM's ``FP8_BLOCK_SCALES``
    CUTLASS MoE), which AIConfigurator measures as ``fp8_block``: on an H200 at DeepSeek-V3's shape and TP 8,
    vLLM's runs 32 decode tokens in 0.26 ms, where its per-tensor fp8 family, never measured at that hidden size,
    extrapolated to 0.88."""
    return arch.fp8_block_checkpoint and prec.matrix == "fp8" and arch.n_experts > 1


def kv_cache_dtype(cfg: InferConfig, act: str) -> str:
    """The dtype ``cfg``'s KV cache is kept in: ``cfg.kv_dtype``, else the activations' ``act``."""
    return cfg.kv_dtype or act


def _forward_s(
    arch: ArchSpec,
    cfg: InferConfig,
    prec: Dtypes,
    *,
    batch: int,
    seq_q: int,
    seq_kv: int,
    tp_group: Group,
    kernels: KernelCostModel,
    comms: CollectiveCostModel,
    device: DeviceSpec,
    lines: list[dict[str, Any]] | None,
    phase: str,
    ep_group: Group,
    dp_group: Group,
    comm_sources: dict[str, int] | None = None,
) -> tuple[float, float]:
    """(compute, tp comm) seconds of one forward of all layers, the stages one after another
    (``ep_group`` / ``dp_group``: an expert group and the data-parallel group of its replicas, :func:`_expert_groups`;
    ``comm_sources``: where given, counts the TP collective calls by ``kind: label``)."""
    tp = cfg.tp
    tokens = batch * seq_q
    blocks = [
        (
            block_ops(
                a,
                tp=tp,
                batch=batch,
                seq_q=seq_q,
                seq_kv=seq_kv,
                sp=False,
                ep=cfg.ep if a.n_experts > 1 else 1,
                attention=cfg.attention,
                training=False,
                whole_experts=cfg.ep > 1,
                fused_swiglu=cfg.engine != "none",
            ),
            n,
        )
        for a, n in block_kinds(arch)
    ]
    model = embedding_ops(arch, tp=tp, tokens=tokens, rows=tokens, training=False)
    model += head_ops(arch, tp=tp, tokens=batch, rows=batch, loss=False)  # logits of the last position only
    comm = block_comms(arch, tp=tp, batch=batch, seq_q=seq_q, sp=False, cp=1, ep=1, dtype=prec.act, training=False)[FWD]
    dispatcher = infer_dispatcher(cfg.moe_dispatcher, cfg.engine)
    ep_comm = _ep_all_to_all(arch, cfg, tokens, dtype_bytes(prec.act), dispatcher)
    # flex: DeepEP's normal kernels in a prefill step (one copy a token per remote node), its low-latency ones in
    # a decode step (one per expert; DeepEP's README: "low-latency kernels with pure RDMA"), as SGLang's
    # --deepep-mode auto picks them
    ep = ep_dispatch(dispatcher, arch, ep_group.nodes, deduplicate=seq_q > 1)
    extra_comm: tuple[Comm, ...] = ()
    if tp > 1:
        extra_comm = (
            Comm("embed_tp", "all_reduce", tokens * arch.hidden * dtype_bytes(prec.act)),
            Comm("head_tp", "all_gather", batch * padded_vocab(arch.vocab, tp) * dtype_bytes(prec.act)),
        )
    compute = comm_s = 0.0
    # an engine runs fp8 linears without an amax pass (engine_fp8_gemm_s), unless its own family's rows priced them
    static_fp8 = cfg.engine != "none"
    # vLLM's compile-time fusions (engine.VLLM_FUSIONS): kernels folded into the all-reduce or the attention
    fusions = fusions_of(cfg.fusions)
    ar_bytes = tokens * arch.hidden * dtype_bytes(prec.act)
    ar_fused = arch.norm == "rmsnorm" and allreduce_rms_fused(fusions, ar_bytes, tp, device)  # its patterns: RMSNorm
    # the fp8 linears whose input a fused kernel writes quantised, with the fusion that does
    quant_fused = dict.fromkeys(FUSED_QUANT_INPUTS if ar_fused else (), "allreduce_rms")
    quant_fused |= {"proj": "attn_quant"} if "attn_quant" in fusions else {}
    family_of = getattr(kernels, "family_of", None)  # a stand-in cost model (a recorder) may lack it: no family
    plain = replace(prec, matrix=prec.act)  # UNQUANTISED_GEMMS' dtypes
    unquantised = UNQUANTISED_GEMMS | (VLLM_UNQUANTISED_GEMMS if cfg.engine == "vllm" else frozenset())
    for group_ops, repeat in (*blocks, (model, 1)):
        kern = [
            (plain if kind == "gemm" and role in unquantised else prec).of(kind, p) for role, kind, p, _ in group_ops
        ]
        balanced = {k: _balanced_kernel(k) for k in kern if k.kind == "moe"}
        table = kernels.lookup(kern + [b for b in balanced.values() if b is not None], device)
        for (role, _, _, count), k in zip(group_ops, kern):
            t, src = table[k]
            routed: dict[str, int] = {}
            if (b := balanced.get(k)) is not None and table[b][1].startswith(LEARNED):
                (t, src), routed = table[b], {"priced_at_tokens": int(b.param_dict["tokens"])}
            if static_fp8 and k.kind == "gemm" and k.dtype == "fp8" and role in FP8_LINEARS:
                p = k.param_dict
                if p["b"] == 1 and (family_of is None or family_of(k) is None):  # plain linears, default family
                    t = engine_fp8_gemm_s(t, int(p["m"]), int(p["k"]), k.bytes_moved(), device)
            fused = ""
            if ar_fused and role in ALLREDUCE_FUSED_ROLES:
                t, fused = 0.0, "allreduce_rms"
            elif role in quant_fused and k.kind == "gemm" and k.dtype == "fp8" and k.param_dict["b"] == 1:
                p = k.param_dict
                quant_s = static_fp8_quant_s(int(p["m"]), int(p["k"]), device)
                t, fused = max(t - quant_s, k.bytes_moved() / device.mem_bw_bytes_per_s), quant_fused[role]
            compute += repeat * count * t
            if lines is not None:
                lines.append(
                    {
                        "phase": phase,
                        "role": role,
                        "kind": k.kind,
                        "params": dict(k.params),
                        "dtype": k.dtype,
                        "direction": k.direction,
                        "count": repeat * count,
                        "time_s": t,
                        "source": src,
                        **({"fused": fused} if fused else {}),
                        **routed,
                    }
                )
    for c, repeat in [(c, arch.n_layers) for c in comm] + [(c, 1) for c in extra_comm] + ep_comm:
        kind = c.kind if c.kind != "all_reduce" else tp_all_reduce_kind(cfg.engine, c.bytes, tp_group, device)
        if ar_fused and c.kind == "all_reduce" and c.role in ("tp", "embed_tp"):
            kind = TRTLLM_ALL_REDUCE  # FlashInfer's fused kernel is TensorRT-LLM's all-reduce with an epilogue
        call = (
            ep.call(c.bytes, ep_group)
            if c.role == "ep"
            else Collective(kind, c.bytes, dp_group if c.role == "ep_dp" else tp_group)
        )
        t, label = comms.time_s(call, device)
        comm_s += repeat * c.count * t
        if comm_sources is not None:
            key = f"{call.kind}: {label}"
            comm_sources[key] = comm_sources.get(key, 0) + repeat * c.count
    return compute, comm_s


def _mxfp4_moe_note(cfg: InferConfig, prec: Dtypes, device: DeviceSpec) -> str:
    """Which kernel MXFP4 experts run as under ``cfg.engine`` (``prec``: the run's :func:`infer_precision`), and how
    to say another: a deployment's environment picks it (vLLM's ``VLLM_MXFP4_USE_MARLIN``, ...), which no flag of the
    run shows."""
    family = dict(prec.impls)["moe"]  # infer_precision always names it
    acts = "MXFP8" if prec.moe_matrix is not None else "bf16"
    how = f"--mxfp4-moe {cfg.mxfp4_moe}" if cfg.mxfp4_moe else f"{cfg.engine}'s choice on {device.name}"
    return (
        f"MXFP4 experts run as the {family} fused-MoE kernel with {acts} activations ({how}); give --mxfp4-moe "
        "marlin|bf16|mxfp8 where the deployment runs another (vLLM: VLLM_MXFP4_USE_MARLIN=1, "
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 or VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1; TensorRT-LLM: "
        "OVERRIDE_QUANT_ALGO=W4A16_MXFP4 or W4A8_MXFP4_MXFP8)"
    )


@cache  # every forward of a serving table asks it of the same few kernels
def _balanced_kernel(k: Kernel) -> Kernel | None:
    """A fused MoE kernel ``k`` asked as its learned model's balanced-routing rows would measure the experts a
    uniformly routed batch reaches (:func:`opcast.archs.balanced_equivalent_tokens`), or None where they reach as
    many. Only a learned price takes it: the grouped GEMMs a fused layer decomposes into count uniform routing's
    experts themselves (:func:`opcast.archs.routed_expert_ops`)."""
    tokens = balanced_equivalent_tokens(k.param_dict)
    if tokens is None:
        return None
    return kernel(k.kind, {**k.param_dict, "tokens": tokens}, k.dtype, k.direction, k.tensor_cores)


def _fusions_report(given: str, lines: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Which of the ``--fusions`` given applied in the prefill and in the decode steps (the per-op ``lines``'
    ``fused`` marks), and a note that says so: a fusion applies nowhere at TP 1, to a LayerNorm model or on a GPU vLLM
    has no fused all-reduce for (``allreduce_rms``), past its size limit (a long prompt's all-reduce), or without fp8
    linears."""
    applied = {
        phase: sorted({ln["fused"] for ln in lines if ln.get("fused") and ln["phase"] == phase})
        for phase in ("prefill", "decode")
    }
    names = sorted(fusions_of(given))
    parts = [f"{phase} {', '.join(v) if v else 'none'}" for phase, v in applied.items()]
    note = f"vLLM fusions (--fusions {given}) applied: {'; '.join(parts)}"
    if any(set(names) - set(v) for v in applied.values()):
        note += (
            " (not applied: TP 1, a LayerNorm model, a GPU vLLM has no fused all-reduce for, an all-reduce past the "
            "size limit, or no fp8 linears)"
        )
    return {"given": names, **{f"{phase}_applied": v for phase, v in applied.items()}}, note


@cache  # the serving tables price thousands of forwards of one arch: its block kinds are built once
def block_kinds(arch: ArchSpec) -> tuple[tuple[ArchSpec, int], ...]:
    """The blocks of ``arch`` as (the arch of a block, how many): one kind, or DeepSeek's first
    :attr:`~opcast.archs.ArchSpec.dense_layers` blocks with their dense MLP (``dense_ffn_hidden``) and the MoE rest.
    Inference prices the two kinds apart (a dense block reads its whole MLP, an MoE block the experts its tokens
    reach); training prices every block as an MoE one (:attr:`~opcast.archs.ArchSpec.dense_layers`).

    An arch whose blocks mix sliding-window and full attention (gpt-oss, :attr:`~opcast.archs.ArchSpec.
    sliding_window_layers`) splits further: its windowed blocks (their attention and KV cache over the window)
    apart from the full ones (the windowed ones taken from the MoE blocks; no released model has both)."""
    kinds = _mlp_kinds(arch)
    windowed = arch.windowed_layers
    if not windowed or windowed == arch.n_layers:
        return kinds
    *rest, (last, n) = kinds
    full = replace(last, sliding_window=None, sliding_window_layers=None)
    local = replace(last, sliding_window_layers=None)
    return (*rest, *((k, c) for k, c in ((full, n - windowed), (local, windowed)) if c > 0))


def _mlp_kinds(arch: ArchSpec) -> tuple[tuple[ArchSpec, int], ...]:
    if not arch.dense_layers or arch.dense_ffn_hidden is None:
        return ((arch, arch.n_layers),)
    dense = replace(
        arch,
        n_experts=1,
        experts_top_k=1,
        ffn_hidden=arch.dense_ffn_hidden,
        shared_expert_ffn=None,
        shared_expert_gate=False,
        dense_layers=None,
        dense_ffn_hidden=None,
        expert_groups=None,
        expert_groups_top_k=None,
    )
    return ((dense, arch.dense_layers), (arch, arch.n_layers - arch.dense_layers))


def _expert_groups(cfg: InferConfig, gpus_per_node: int) -> tuple[Group, Group]:
    """(the ``ep`` GPUs of an expert group, the data-parallel group of its replicas: one GPU of each, the same tp
    rank) on nodes of ``gpus_per_node``."""
    return place(cfg.ep, 1, gpus_per_node), place(cfg.ep // cfg.tp, cfg.tp, gpus_per_node)


def _ep_all_to_all(
    arch: ArchSpec, cfg: InferConfig, tokens: int, act_b: int, dispatcher: str
) -> list[tuple[Comm, int]]:
    """The MoE dispatch and combine of expert parallelism across replicas (``ep > tp``) under ``dispatcher``
    (:mod:`opcast.predict.moe_dispatch`). The all-to-alls (alltoall, flex): each GPU sends its ``1 / tp`` of the
    replica's tokens, ``top_k`` copies of each, to the experts' GPUs and takes the results back, one all-to-all
    each way per MoE block over the ``ep`` GPUs (SGLang ``DeepEPMoE``, vLLM's DeepEP backends). Within a replica
    (``ep = tp``) the tokens are already on every GPU and the block's tensor-parallel all-reduce sums the experts'
    outputs: nothing more moves. How the all-to-alls run (alltoall or flex) is :func:`_forward_s`'s to price.
    Under ``dispatcher`` allgather (vLLM's ``allgather_reducescatter``, ``AgRsAll2AllManager``: ``all_gatherv``
    then ``reduce_scatterv`` over the data-parallel group, role ``ep_dp``) each replica's tokens go whole to every
    other replica and come back summed: an all-gather and a reduce-scatter of ``ep / tp`` replicas' hidden states
    a block."""
    if cfg.ep <= cfg.tp or arch.n_experts == 1:
        return []
    moe_blocks = arch.n_layers - (arch.dense_layers or 0)
    if dispatcher == "allgather":
        gathered = cfg.ep // cfg.tp * tokens * arch.hidden * act_b
        return [(Comm("ep_dp", kind, gathered), moe_blocks) for kind in ("all_gather", "reduce_scatter")]
    routed = -(-tokens // cfg.tp) * arch.experts_top_k * arch.hidden * act_b
    return [(Comm("ep", "all_to_all", routed, 2), moe_blocks)]


def context_note(arch: ArchSpec, tokens: int, what: str = "prompt_len + gen_len") -> str | None:
    """A note where a sequence runs past the arch's ``max_seq`` (its ``max_position_embeddings``) with rope or
    alibi positions (learned positions are refused: the table has no row past it). vLLM refuses a prompt
    longer than its ``max_model_len`` (``Processor._validate_model_input``) and stops a sequence that reaches
    it, and by default derives that length from the config: ``max_position_embeddings`` times a rope scaling
    factor (YaRN, dynamic NTK, ...), which opcast does not read, and a larger ``--max-model-len`` only with
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``. So it is a note, not a refusal: the length may well be served.
    ``tokens``: the longest sequence, prompt and output, that ``what`` names."""
    if arch.position == "learned" or tokens <= arch.max_seq:
        return None
    return (
        f"{what} = {tokens:,} exceeds max_seq={arch.max_seq:,} of {arch.name} (its "
        "max_position_embeddings): vLLM refuses a longer prompt and stops a sequence there unless rope scaling "
        "(the config's rope_scaling, which opcast does not read) or --max-model-len with "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 extends the context; the times assume the whole length runs"
    )


def predict_infer(
    arch: ArchSpec,
    device: DeviceSpec,
    cfg: InferConfig,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    kernels: KernelCostModel | None = None,
    comms: CollectiveCostModel | None = None,
    details: bool = True,
) -> InferResult:
    """Latency, throughput and memory of one inference batch (see the module docstring)."""
    cluster, reasons = validate_infer(arch, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node, check_device=False)
    precision_reasons = device_reasons(device, cfg.precision)
    if precision_reasons and cluster is not None and cfg.precision in get_args(Precision):  # every reason at once
        reasons = [r for r in (overflow_reason(_infer_memory(arch, cfg), device, _MEMORY_FIX),) if r]
    if precision_reasons or cluster is None:
        return InferResult(arch=arch, device=device, config=cfg, feasible=False, reasons=(*precision_reasons, *reasons))
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    if comms is None:
        from opcast.predict.comm_learned import collective_cost_for

        comms = collective_cost_for(kernels)  # the model set's learned collectives where it has the cluster
    if (wave := engine_wave(arch, device, cfg)) is not None and wave < cfg.batch:
        return _in_waves(
            arch,
            device,
            cfg,
            wave,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            kernels=kernels,
            comms=comms,
            details=details,
        )
    prec = infer_precision(cfg, arch, device)
    tp_group = place(cfg.tp, 1, cluster.gpus_per_node)
    ep_group, dp_group = _expert_groups(cfg, cluster.gpus_per_node)
    pp_hop = place(2, cfg.tp, cluster.gpus_per_node)
    lines: list[dict[str, Any]] | None = [] if details else None
    b, P, G = cfg.batch, cfg.prompt_len, cfg.gen_len
    act_b = dtype_bytes(prec.act)

    def pp_s(tokens: int) -> float:
        return _pp_send_s(arch, cfg, act_b, tokens=tokens, pp_hop=pp_hop, comms=comms, device=device)

    prefill_comms: dict[str, int] = {}
    decode_comms: dict[str, int] = {}
    # A single batch runs the stages one after another: its latency is the forward of all layers.
    pre_c, pre_tp = _forward_s(
        arch,
        cfg,
        prec,
        batch=b,
        seq_q=P,
        seq_kv=P,
        tp_group=tp_group,
        kernels=kernels,
        comms=comms,
        device=device,
        lines=lines,
        phase="prefill",
        comm_sources=prefill_comms,
        ep_group=ep_group,
        dp_group=dp_group,
    )
    pre_pp = pp_s(b * P)
    overhead = step_overhead(cfg.engine, cfg.engine_version) if cfg.engine != "none" else None
    step_overhead_s = overhead.time_s(b) if overhead is not None else 0.0  # prefill and decode steps alike
    ttft = pre_c + pre_tp + pre_pp + step_overhead_s
    # the sample is taken without listing every step: a huge --gen-len must not build a list of G steps
    steps = (
        sorted({1 + round(i * (G - 2) / (DECODE_SAMPLES - 1)) for i in range(DECODE_SAMPLES)})
        if G - 1 > DECODE_SAMPLES
        else list(range(1, G))
    )
    dec_c = dec_tp = 0.0
    for n, i in enumerate(steps):
        c, t = _forward_s(
            arch,
            cfg,
            prec,
            batch=b,
            seq_q=1,
            seq_kv=P + i,
            tp_group=tp_group,
            kernels=kernels,
            comms=comms,
            device=device,
            lines=lines if n == len(steps) // 2 else None,
            phase="decode",
            comm_sources=decode_comms if n == len(steps) // 2 else None,
            ep_group=ep_group,
            dp_group=dp_group,
        )
        dec_c += c
        dec_tp += t
    k = max(1, len(steps))
    dec_c, dec_tp = dec_c / k, dec_tp / k
    dec_pp = pp_s(b)
    tpot = (dec_c + dec_tp + dec_pp + step_overhead_s) if G > 1 else 0.0
    total = ttft + (G - 1) * tpot

    memory = _infer_memory(arch, cfg)
    kv = memory.kv_cache_bytes
    sources: dict[str, Any] = {**kernels.describe(), **comms.describe()}
    if cfg.tp > 1:
        rule = CUSTOM_ALL_REDUCE_RULES.get(cfg.engine)
        sources["tp_all_reduce"] = {
            "engine": cfg.engine,
            "rule": rule.source if rule is not None else "NCCL: no serving engine",  # every engine has a rule
            "prefill_calls": dict(sorted(prefill_comms.items())),
            "decode_step_calls": dict(sorted(decode_comms.items())),
        }
    if lines is not None:
        counts: dict[str, int] = {}
        for _key, src in {
            (str((ln["kind"], ln["params"], ln["dtype"], ln["direction"])), ln["source"]) for ln in lines
        }:
            counts[src] = counts.get(src, 0) + 1
        sources["unique_kernels_by_source"] = dict(sorted(counts.items()))
    breakdown = {
        "prefill": {"compute": pre_c, "tp_comm": pre_tp, "pp_comm": pre_pp},
        "decode_step": {"compute": dec_c, "tp_comm": dec_tp, "pp_comm": dec_pp},
    }
    if overhead is not None:
        for parts in breakdown.values():
            parts["overhead"] = step_overhead_s
        sources["step_overhead"] = {
            "engine": cfg.engine,
            "fixed_s": overhead.fixed_s,
            "per_seq_s": overhead.per_seq_s,
            "seqs": b,
            "source": overhead.source,
        }
        note = (
            f"{cfg.engine} step overhead {step_overhead_s * 1e6:.0f} us a step at batch {b} "
            f"({overhead.fixed_s * 1e6:g} us + {overhead.per_seq_s * 1e6:g} us/seq): {overhead.source}, "
            "not measured; calibrate before trusting small-batch TPOT"
        )
        sources["notes"] = [*sources.get("notes", []), note]
    if (context := context_note(arch, cfg.prompt_len + cfg.gen_len)) is not None:
        sources["notes"] = [*sources.get("notes", []), context]
    if cfg.fusions and lines is not None:
        sources["fusions"], note = _fusions_report(cfg.fusions, lines)
        sources["notes"] = [*sources.get("notes", []), note]
    if arch.expert_weights == "mxfp4" and cfg.engine != "none":
        sources["notes"] = [*sources.get("notes", []), _mxfp4_moe_note(cfg, prec, device)]
    result = InferResult(
        arch=arch,
        device=device,
        config=cfg,
        feasible=True,
        cluster=cluster,
        ttft_s=ttft,
        tpot_s=tpot,
        total_latency_s=total,
        tokens_per_s=b * G / total,
        kv_cache_bytes=kv,
        memory=memory,
        breakdown_s=breakdown,
        ops=tuple(lines or ()),
        cost_sources=sources,
    )
    reason = overflow_reason(memory, device, _MEMORY_FIX)
    if reason and wave is None:
        result = _with_reason(result, reason)
    elif reason:  # the engine's own capacity holds the batch; the accounting above prefills every prompt at once
        note = (
            f"{reason.split(';')[0]} as one whole-prompt prefill, but {cfg.engine}'s KV cache holds the batch and "
            "it prefills in chunks of its token budget"
        )
        result = replace(result, cost_sources={**sources, "notes": [*sources.get("notes", []), note]})
    return result


def engine_wave(arch: ArchSpec, device: DeviceSpec, cfg: InferConfig) -> int | None:
    """The sequences ``cfg.engine`` runs at once (at most ``cfg.batch``; fewer when its KV cache cannot hold the whole
    batch at its final length, or the batch is larger than its ``max_num_seqs``), or None: no engine, or not even
    one sequence fits (then the static memory accounting refuses the batch as before). The capacity is the engine's own
    (:func:`opcast.predict.serve.kv_cache.kv_capacity`: its share of the GPU less the weights and its profiling peak
    over one token budget, in pages of ``prompt_len + gen_len`` tokens), which prefills in chunks of that budget
    rather than every prompt at once."""
    if cfg.engine == "none":
        return None
    from opcast.errors import OpcastError
    from opcast.predict.serve.kv_cache import kv_capacity

    tokens = cfg.prompt_len + cfg.gen_len
    engine = _static_engine(cfg, device)
    try:
        cap = kv_capacity(arch, device, cfg, engine, longest_tokens=tokens)
    except OpcastError:  # not one sequence fits: the static accounting says why
        return None
    fit = min(cap.blocks // max(1, cap.pages(tokens)), engine.max_num_seqs)  # nor more than it schedules at once
    return min(fit, cfg.batch) if fit >= 1 else None


def _static_engine(cfg: InferConfig, device: DeviceSpec):
    """The :class:`~opcast.predict.serve.engine.EngineConfig` a static batch runs on: ``cfg.engine``'s defaults on
    ``device`` with its release's per-step overhead, and no API server in front (an offline batch)."""
    from opcast.predict.serve.engine import engine_config

    return engine_config(cfg.engine, device, frontend_s=0.0, overhead=step_overhead(cfg.engine, cfg.engine_version))


def _in_waves(arch: ArchSpec, device: DeviceSpec, cfg: InferConfig, wave: int, **how: Any) -> InferResult:
    """``cfg.batch`` sequences of which the engine runs ``wave`` at once (:func:`engine_wave`). TensorRT-LLM's
    default capacity scheduler (``GUARANTEED_NO_EVICT`` admits a request only when blocks for its whole prompt and
    output can be reserved) runs them ``wave`` at a time, each wave to its end before the next: the total is the
    waves' sum, the last one of the remainder. vLLM and SGLang admit requests while their prompts fit and preempt
    the newest (recomputing it later) when the cache runs out: the batch, every request arriving at once, is
    simulated through that scheduler (:func:`opcast.predict.serve.deployment.predict_serve` on
    :func:`_static_engine`), and the total is when its last request finishes. TTFT and TPOT are a full wave's (its
    first requests')."""
    waves, rest = divmod(cfg.batch, wave)
    full = predict_infer(arch, device, replace(cfg, batch=wave), **how)
    if not full.feasible:
        return replace(full, config=cfg)
    count = waves + (1 if rest else 0)
    if cfg.engine == "trtllm":
        last = predict_infer(arch, device, replace(cfg, batch=rest), **how) if rest else None
        if last is not None and not last.feasible:
            return replace(full, config=cfg)
        rest_s = (last.total_latency_s or 0.0) if last is not None else 0.0
        total = waves * (full.total_latency_s or 0.0) + rest_s
        how_run = f"the batch runs in {count} waves of at most {wave}"
        record: dict[str, Any] = {"sequences_at_once": wave, "waves": count}
    else:
        total, preemptions = _simulated_batch_s(arch, device, cfg, how)
        how_run = (
            f"simulated through {cfg.engine}'s scheduler with every request arriving at once ({preemptions} "
            "preemptions, each recomputed later)"
        )
        record = {"sequences_at_once": wave, "waves": count, "simulated": True, "preemptions": preemptions}
    note = (
        f"{cfg.engine} runs at most {wave} of the {cfg.batch} sequences of {cfg.prompt_len + cfg.gen_len} tokens "
        f"at once (its KV cache and max_num_seqs): {how_run} (TTFT and TPOT are a full wave's)"
    )
    sources = {**full.cost_sources, "waves": record}
    sources["notes"] = [*sources.get("notes", []), note]
    return replace(
        full, config=cfg, total_latency_s=total, tokens_per_s=cfg.batch * cfg.gen_len / total, cost_sources=sources
    )


def _simulated_batch_s(arch: ArchSpec, device: DeviceSpec, cfg: InferConfig, how: dict[str, Any]) -> tuple[float, int]:
    """(seconds until the last of ``cfg.batch`` requests arriving at once finishes, preemptions) under
    ``cfg.engine``'s scheduler and defaults on ``device``."""
    import numpy as np

    from opcast.predict.serve.deployment import predict_serve
    from opcast.predict.serve.requests import RequestStream

    b = cfg.batch
    stream = RequestStream(
        arrival_s=np.zeros(b),
        input_tokens=np.full(b, cfg.prompt_len, dtype=np.int64),
        output_tokens=np.full(b, cfg.gen_len, dtype=np.int64),
        source=f"one static batch of {b}",
    )
    served = predict_serve(
        arch,
        device,
        cfg,
        _static_engine(cfg, device),
        stream,
        kernels=how["kernels"],
        comms=how["comms"],
        gpus_per_node=how.get("gpus_per_node"),
    )
    return float(served.metrics.duration_s), int(served.metrics.preemptions)


def _pp_send_s(
    arch: ArchSpec, cfg: InferConfig, act_b: float, *, tokens: int, pp_hop: Group, comms: CollectiveCostModel, device
) -> float:
    """The stage-to-stage sends of one forward of ``tokens`` tokens through ``cfg.pp`` stages."""
    if cfg.pp == 1:
        return 0.0
    return (cfg.pp - 1) * comms.time_s(Collective("send_recv", tokens * arch.hidden * act_b, pp_hop), device)[0]


def forward_time_s(
    arch: ArchSpec,
    device: DeviceSpec,
    cfg: InferConfig,
    *,
    batch: int,
    seq_q: int,
    seq_kv: int,
    gpus_per_node: int,
    kernels: KernelCostModel,
    comms: CollectiveCostModel,
) -> float:
    """Seconds of one forward of ``batch`` sequences of ``seq_q`` new tokens against ``seq_kv`` keys
    through every stage (compute, TP collectives, stage-to-stage sends), priced exactly as
    :func:`predict_infer` prices its prefill (``seq_q = seq_kv = prompt``) and a decode step
    (``seq_q = 1``). The serving simulator (:mod:`opcast.predict.serve`) prices its steps with it."""
    ep_group, dp_group = _expert_groups(cfg, gpus_per_node)
    prec = infer_precision(cfg, arch, device)
    compute, tp_comm = _forward_s(
        arch,
        cfg,
        prec,
        batch=batch,
        seq_q=seq_q,
        seq_kv=seq_kv,
        tp_group=place(cfg.tp, 1, gpus_per_node),
        kernels=kernels,
        comms=comms,
        device=device,
        lines=None,
        phase="forward",
        ep_group=ep_group,
        dp_group=dp_group,
    )
    pp_hop = place(2, cfg.tp, gpus_per_node)
    pp = _pp_send_s(arch, cfg, dtype_bytes(prec.act), tokens=batch * seq_q, pp_hop=pp_hop, comms=comms, device=device)
    return compute + tp_comm + pp


def infer_memory(arch: ArchSpec, cfg: InferConfig, *, experts: ExpertLayout | None = None) -> Memory:
    """Memory per GPU of the worst stage of ``cfg`` (weights, the prefill working set of one block,
    the KV cache at its final length): the accounting :func:`predict_infer` reports; ``experts``: the
    weight-only experts as a serving engine lays them out (:mod:`opcast.predict.serve.vllm_memory`)."""
    return _infer_memory(arch, cfg, experts=experts)


_MEMORY_FIX = "try more tp/pp or a smaller --batch"


def _infer_memory(arch: ArchSpec, cfg: InferConfig, *, experts: ExpertLayout | None = None) -> Memory:
    """Memory per GPU of the worst stage (the first holds the embedding, the last the head).

    The working set is one block's largest live tensors over the ``b P`` tokens: the residual stream and the
    normed input (``2 h``), the QKV projection, and the MLP's output(s); in an MoE block the fused experts'
    intermediate caches instead, ``top_k (max(u, h) + f)`` a token for an expert ``f`` wide (``u`` = ``2 f``
    gated) on at most ``chunk`` tokens (vLLM ``fused_moe.py`` ``fused_experts_impl``: ``cache13`` of
    ``M top_k max(N, K)`` shared by the up and down outputs, ``intermediate_cache2`` of ``M top_k N / 2``;
    ``fused_marlin_moe.py`` ``fused_marlin_moe`` the same at the padded widths, unchunked)."""
    prec = precision_of(cfg.precision, cfg.tensor_cores)
    b, P = cfg.batch, cfg.prompt_len
    act_b = dtype_bytes(prec.act)
    weight_b = element_bytes(prec.matrix)  # nvfp4 weights: 0.5625 bytes with their scales
    expert_b = weight_storage_bytes(arch.expert_weights) if arch.expert_weights else weight_b  # gpt-oss's MXFP4 experts
    kv = kv_cache_bytes(
        arch, tp=cfg.tp, pp=cfg.pp, batch=b, tokens=P + cfg.gen_len, dtype=kv_cache_dtype(cfg, prec.act)
    )
    heads = arch.n_heads // cfg.tp
    whole = cfg.ep > 1
    ffn = arch.ffn_hidden // (1 if whole and arch.n_experts > 1 else cfg.tp)  # one rank's expert (or MLP) width
    layout = experts if arch.n_experts > 1 and arch.expert_weights else None
    hidden, ffn_stored = layout.widths(arch, ffn) if layout is not None else (arch.hidden, ffn)
    up = (2 if arch.gated_mlp else 1) * ffn_stored
    tokens = b * P
    if arch.n_experts > 1:
        chunk = layout.chunk_tokens if layout is not None else FUSED_MOE_CHUNK_TOKENS
        mlp_work = min(tokens, chunk or tokens) * arch.experts_top_k * (max(up, hidden) + ffn_stored)
    else:
        mlp_work = tokens * up
    qkv = (heads + 2 * max(1, arch.n_kv_heads // cfg.tp)) * arch.head_dim
    work = act_b * (tokens * (2 * arch.hidden + qkv) + mlp_work)
    if cfg.attention == "eager":
        work += act_b * b * heads * P * P
    mems = []
    for s in {0, cfg.pp - 1}:
        params = stage_params(arch, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep, stage=s, whole_experts=whole)
        expert_bytes = expert_b * params.expert
        if layout is not None and params.expert:  # the experts this rank holds, each as the engine stores it
            expert_bytes = params.expert // arch.mlp_params(ffn) * layout.expert_bytes(arch, ffn, expert_b)
        mems.append(
            Memory(
                stage=s,
                weights_bytes=weight_b * (params.dense - params.unquantised)
                + act_b * params.unquantised
                + expert_bytes,
                gradients_bytes=0.0,
                optimizer_states_bytes=0.0,
                activations_bytes=work,
                kv_cache_bytes=kv,
            )
        )
    return max(mems, key=lambda m: m.total_bytes)


def _with_reason(result: InferResult, reason: str) -> InferResult:
    from dataclasses import replace

    return replace(result, feasible=False, reasons=(*result.reasons, reason))
