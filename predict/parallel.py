"""Training and inference configurations, the cluster they run on, and their validation.

Validation collects *every* reason a configuration cannot run (a TP degree that does not divide
the heads, a world size that is not TP x PP x DP x CP, micro-batches that do not divide the global
batch, ...) instead of stopping at the first: an infeasible configuration is a result listing its
reasons (:class:`Layout` is only built for a feasible one).

Rank order is Megatron-LM's default ``tp-cp-ep-dp-pp`` (megatron/core/parallel_state.py): TP
ranks are consecutive, then CP, DP, and pipeline stages outermost, so a group of ``size`` ranks
``stride`` apart spans the nodes :func:`opcast.predict.comm.place` says.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from opcast.archs import ArchSpec
from opcast.dtypes import gemm_dtype
from opcast.errors import OpcastError
from opcast.hardware import device_name_beside, read_json_file
from opcast.ops import INT_PARAM_LIMIT, whole_number
from opcast.predict.comm import Group, place
from opcast.predict.frameworks import FrameworkName
from opcast.predict.memory import activation_dtype, expert_data_parallel
from opcast.predict.moe_dispatch import TRAIN_DISPATCHERS, MoeDispatcher, dispatcher_problem
from opcast.predict.recompute import recompute_problem
from opcast.predict.serve.engine import (
    EngineName,
    Mxfp4Moe,
    engine_device_problem,
    engine_version_problem,
    fusions_problem,
    mxfp4_moe_problem,
)

Precision = Literal["bf16", "fp16", "fp32", "fp8", "mxfp8", "nvfp4"]
AttentionImpl = Literal["flash", "eager", "flash1", "flash2"]
KvDtype = Literal["bf16", "fp16", "fp8"]
Schedule = Literal["1f1b", "interleaved"]
InferEngine = Literal["none", EngineName]  # type: ignore[valid-type]  # mypy sees opcast.predict.serve untyped (Any)
"""Serving framework whose per-step overhead an inference batch pays (:data:`opcast.predict.serve.engine.OVERHEADS`);
none: the forward passes alone."""
Fp8Recipe = Literal["delayed", "current"]
"""Transformer Engine's per-tensor fp8 scaling recipe (``--precision fp8``): ``DelayedScaling`` or
``Float8CurrentScaling`` (:func:`opcast.predict.graph.fp8_quantisation`)."""
Clocks = Literal["sustained", "boost"]
"""The clock a training step's compute-bound kernels run at (:mod:`opcast.predict.cost.sustained`): the one a GPU
holds at its power cap under a step's load, or the boost clock of the kernel benchmarks' bursts."""
Optimizer = Literal["adam", "sgd", "none"]
"""What the training step keeps besides weights and gradients (:func:`opcast.predict.memory.optimizer_state_bytes`)."""

MEGATRON_MIN_BUCKET_PARAMS = 40_000_000
"""Megatron-LM DDP gradient bucket: ``max(40M, 1M x dp)`` parameters (distributed_data_parallel_config.py)."""


def gradient_bucket_params(dp: int, bucket_params: int | None = None) -> int:
    """Parameters per gradient bucket: ``bucket_params`` when given, else Megatron's ``max(40M, 1M x dp)``."""
    return bucket_params or max(MEGATRON_MIN_BUCKET_PARAMS, 1_000_000 * dp)


def model_parallel_groups(
    *, tp: int, cp: int, ep: int, gpus_per_node: int, fold: bool = False
) -> tuple[Group, Group, Group]:
    """The (tp, cp, ep) communicators in Megatron's ``tp-cp-ep-dp-pp`` rank order: tp ranks
    consecutive, cp and ep ranks tp apart; folded (``fold``, :func:`folded`), the expert-parallel ranks
    consecutive over the tensor-parallel ones (Megatron-Core's expert rank order ``tp-ep-dp-pp`` with expert tp 1)."""
    return place(tp, 1, gpus_per_node), place(cp, tp, gpus_per_node), place(ep, 1 if fold else tp, gpus_per_node)


def data_parallel_groups(
    *, tp: int, cp: int, dp: int, ep: int, gpus_per_node: int, fold: bool = False
) -> tuple[Group, Group]:
    """The gradient-reduction communicators: the dp x cp ranks holding the same weights, and the
    dp x cp / ep ranks holding the same experts (tp x ep apart); folded, the tp x dp x cp / ep ranks holding
    the same whole experts (ep apart)."""
    experts = expert_data_parallel(tp=tp, dp=dp, cp=cp, ep=ep, fold=fold)
    return place(dp * cp, tp, gpus_per_node), place(experts, ep if fold else tp * ep, gpus_per_node)


def folded(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` folds its experts (:attr:`TrainConfig.etp` 1 under ``tp > 1``): whole experts, the expert
    group over the tensor-parallel ranks too."""
    return cfg.etp == 1 and cfg.tp > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """Where the job runs: nodes of identical GPUs."""

    nodes: int
    """Nodes."""
    gpus_per_node: int
    """GPUs used per node."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training configuration (Megatron-LM vocabulary)."""

    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel stages."""
    dp: int | None = None
    """Data-parallel degree; None: world size / (tp x pp x cp) with a cluster given, else 1."""
    cp: int = 1
    """Context-parallel degree (ring attention over the sequence, load-balanced causal split)."""
    ep: int = 1
    """Expert-parallel degree (MoE archs)."""
    etp: int | None = None
    """Expert tensor parallelism (Megatron ``--expert-tensor-parallel-size``): None or ``tp``, the experts split
    over the tensor-parallel ranks like a dense MLP and sharded over ``ep`` of the data-parallel ranks; 1 with
    ``tp > 1``, MoE parallel folding (Liu et al. 2025, arXiv 2504.14960; Megatron-Bridge's Qwen3 and DeepSeek
    recipes): every expert whole, the expert-parallel group folded over the ``tp x dp x cp`` ranks, each rank
    routing its sequence-parallel share of the tokens (:func:`folded`)."""
    sp: bool = False
    """Sequence parallelism (Korthikanti et al. 2022): norms and dropout sharded over tp."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    global_batch: int | None = None
    """Sequences per iteration over all data-parallel ranks; None: one micro-batch per rank."""
    seq: int = 2048
    """Tokens per sequence."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core), full (every layer), or
    ``selective:MODULE[+MODULE...]`` with Megatron-Core's recompute modules (:mod:`opcast.predict.recompute`)."""
    zero: int = 0
    """ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also weights (Rajbhandari et al. 2020)."""
    precision: Precision = "bf16"
    """Compute precision; bf16/fp16/fp8/mxfp8/nvfp4 train with fp32 master weights and Adam states.
    fp8, mxfp8 and nvfp4 run the blocks' linears in Transformer Engine's per-tensor fp8, block-scaled
    fp8 (MXFP8 on Blackwell, 1x128/128x128 blocks on Hopper) and NVFP4 GEMMs
    (:data:`opcast.dtypes.QUANTISED_PRECISIONS`), the rest in bf16."""
    fp8_recipe: Fp8Recipe = "delayed"
    """``precision`` fp8 only: Transformer Engine's per-tensor scaling recipe, ``delayed`` (``DelayedScaling``:
    the amax fused into the casts, one amax all-reduce per direction and model chunk over the amax group) or
    ``current`` (``Float8CurrentScaling``: an amax pass, a scale kernel and, where the quantised rows are
    all-gathered, an amax all-reduce over the tensor-parallel group before each cast):
    :func:`opcast.predict.graph.fp8_quantisation`."""
    attention: AttentionImpl = "flash"
    """Attention kernel: flash (FlashAttention-2/3: the device's fastest measured kernel), eager (score matrix
    in memory), flash1 (FlashAttention-1 generation, priced at its published measured rate; ``--framework
    foundry`` picks it in place of flash) or flash2 (FlashAttention-2 generation: flash-attn 2, torch SDPA's
    flash backend; on Hopper and Blackwell priced at its published measured rate, elsewhere as flash;
    ``--framework neox``, ``hf`` and ``hf-liger`` pick it in place of flash)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank for the interleaved schedule."""
    pp_layers: tuple[int, ...] | None = None
    """Transformer layers of each pipeline stage (an explicit, possibly uneven, split); None: by ``pp_partition``."""
    pp_partition: str = "auto"
    """How layers are split over the stages when ``pp_layers`` is not given (:func:`pipeline_split`): auto (even
    when pp divides the layers, else DeepSpeed's ``type:transformer|mlp``, GPT-NeoX's default; interleaved:
    Megatron's), DeepSpeed's ``uniform``, ``parameters`` or ``type:REGEX``, or
    ``megatron[:first=N,last=N|embedding,loss]`` (Megatron-LM's decoder_first/last_pipeline_num_layers and
    account_for_embedding/loss_in_pipeline_split)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with the last micro-batch's backward."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's (ZeRO 1/2) weight all-gather with the next iteration's first
    forward (Megatron-LM ``--overlap-param-gather``, default off; it needs ``--use-distributed-optimizer``
    and ``--overlap-grad-reduce``)."""
    tp_comm_overlap: bool = False
    """Overlap each block's tensor-parallel all-gathers and reduce-scatters with the GEMMs of the same
    layer (Megatron-LM ``--tp-comm-overlap``, Transformer Engine userbuffers; default off; needs sequence
    parallelism)."""
    tp_comm_overlap_cfg: str | None = None
    """With ``tp_comm_overlap``: per-GEMM userbuffers settings that replace Transformer Engine's defaults
    (a recipe's ``ub_cfgs``), ``GEMM=METHOD[:smN][:splitN][:margin|:nomargin][:aggregate],...``
    (:func:`opcast.predict.tp_overlap.parse_configs`); None: TE's defaults."""
    overlap_p2p_comm: bool = False
    """Overlap pipeline sends with the compute of the neighbouring model chunk (Megatron-LM's
    ``overlap_p2p_comm``, on by default there but only for the interleaved schedule; off here so that a
    configuration is priced as before unless asked)."""
    overlap_moe_ep_comm: bool = False
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``, EP A2A overlap): one micro-batch's
    forward runs beside another's backward, each MoE block's dispatch and combine all-to-alls of one hidden behind
    the other's expert and attention compute (:func:`opcast.predict.training.moe_a2a_exposed`)."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How an MoE block's tokens reach their experts' ranks (:mod:`opcast.predict.moe_dispatch`): ``alltoall``
    (Megatron-Core's NCCL all-to-all, one copy a token per expert) or ``flex`` (DeepEP / HybridEP: one copy a
    token per remote node, forwarded over NVLink inside it); the same bytes inside one node."""
    tensor_cores: bool | None = None
    """Matrix math on tensor cores (fp32: as TF32); None: by dtype, fp32 on CUDA cores as PyTorch's
    default (TF32 matmul off), every other precision on tensor cores."""
    framework: FrameworkName | None = None
    """The training framework (:mod:`opcast.predict.frameworks`): the kernel implementations it runs
    (fused or unfused norms, softmax, cross-entropy) and what it keeps in memory (Megatron's fp32
    ``main_grad``); None: Megatron's kernels with the ZeRO paper's 16 bytes a parameter."""
    grad_reduce_in_fp32: bool | None = None
    """Keep a 16-bit run's gradients in fp32 and reduce them in fp32 over the data-parallel ranks (Megatron-Core
    ``grad_reduce_in_fp32``: 4 bytes a gradient in memory and in the reduce-scatter / all-reduce); None: the
    framework's (megatron: on, as Megatron-LM sets it for bf16; others off)
    (:func:`opcast.predict.frameworks.fp32_gradients`)."""
    rope_fusion: bool | None = None
    """Rotary embeddings in one kernel (registry ``impl`` fused, Megatron-Core ``apply_rope_fusion``) or as Hugging
    Face's chain of torch ops (unfused, Megatron-LM's ``--no-rope-fusion``); None: the framework's (megatron and
    hf-liger's Liger kernel fuse it, the others do not)."""
    swiglu_fusion: bool | None = None
    """A SiLU-gated MLP's activation and gate product in one kernel (Megatron-Core ``bias_activation_fusion``) or two
    (Megatron-LM's ``--no-bias-swiglu-fusion``, torch eager); None: the framework's
    (:attr:`opcast.predict.frameworks.Framework.fused_swiglu`)."""
    optimizer: Optimizer = "adam"
    """The optimizer whose states are kept: adam (Adam/AdamW, 8 B of fp32 states a parameter plus the fp32
    master copy in mixed precision), sgd (SGD with momentum, 4 B plus the master copy) or none (forward and
    backward only, no optimizer step: NeuSight's measured training runs)."""
    bucket_params: int | None = None
    """Gradient bucket size in parameters; None: Megatron's max(40M, 1M x dp)."""
    offload_activations: int = 0
    """Transformer layers whose activations go to host memory between their forward and backward (Megatron-Core
    ``cpu_offloading`` with ``cpu_offloading_num_layers``, activations only; Transformer Engine's
    ``get_cpu_offload_context``): :mod:`opcast.predict.offload`. 0: none."""
    clocks: Clocks = "sustained"
    """``sustained``: compute-bound tensor-core kernels at the rate a GPU holds at its power cap, on GPUs where that
    is measured (:mod:`opcast.predict.cost.sustained`); ``boost``: at the kernel benchmarks' burst rates."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InferConfig:
    """One inference request batch."""

    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline stages (one batch: the stages run one after another)."""
    ep: int = 1
    """Expert parallelism of an MoE arch as inference engines run it: every expert whole on one of ``ep`` GPUs
    (``n_experts / ep`` each; 1: the experts split over ``tp`` like a dense MLP). ``ep = tp``: the replica's own
    GPUs (vLLM ``--enable-expert-parallel``); ``ep = k x tp``: ``k`` replicas' GPUs, each replica an attention
    data-parallel rank (SGLang ``--enable-dp-attention``, vLLM ``--data-parallel-size`` with
    ``--enable-expert-parallel``), the tokens dispatched to their experts and combined back by all-to-alls over
    the ``ep`` GPUs; priced as if every replica of the group ran a batch like this one (they step together)."""
    batch: int = 1
    """Sequences decoded together."""
    prompt_len: int = 512
    """Prompt tokens per sequence (prefill)."""
    gen_len: int = 128
    """Generated tokens per sequence (the first comes out of prefill)."""
    precision: Precision = "bf16"
    """Weights, activations and KV cache precision (fp8 / mxfp8 / nvfp4: the blocks' GEMMs and
    weights in fp8 / block-scaled fp8 / nvfp4, the rest bf16)."""
    kv_dtype: KvDtype | None = None
    """The KV cache's dtype; None: the activations' (bf16 under every precision but fp16 and fp32). fp8 (e4m3 with a
    per-tensor scale: vLLM ``--kv-cache-dtype fp8``, TensorRT-LLM ``kv_cache_config.dtype: fp8``, which
    TensorRT-LLM's ``auto`` takes from NVIDIA's fp8 and nvfp4 checkpoints) holds a token in half the bytes, and
    attention reads it as an fp8 kernel (TensorRT-LLM's FP8 FMHA over an fp8 cache, the measured attention rows of
    that dtype); it needs a GPU with fp8."""
    attention: AttentionImpl = "flash"
    """Attention kernel."""
    tensor_cores: bool | None = None
    """Matrix math on tensor cores; None: by dtype (see TrainConfig.tensor_cores)."""
    engine: InferEngine = "none"
    """Serving framework whose per-step overhead (scheduling, input preparation, sampling) each prefill
    and decode step pays on top of its forward; none: the forward alone. It also picks the MoE blocks' fused
    kernel family (:func:`opcast.predict.serve.engine.moe_impl`: under vllm, Marlin's for MXFP4 experts where vLLM
    runs it, else vLLM's own; TensorRT-LLM's under any other) and, under any engine, a one-kernel rope."""
    engine_version: str | None = None
    """The engine's release (``0.11.0``) where its kernels depend on it: vLLM before 0.12 runs MXFP4 experts on
    Hopper with Marlin (:func:`opcast.predict.serve.engine.vllm_runs_marlin`); None: the newest."""
    fusions: str | None = None
    """vLLM's compile-time kernel fusions that ran, comma-separated (:data:`opcast.predict.serve.engine.VLLM_FUSIONS`:
    ``allreduce_rms``, ``attn_quant``; under ``engine`` vllm only); None: none."""
    mxfp4_moe: Mxfp4Moe | None = None
    """How MXFP4 experts (gpt-oss's) run (:data:`opcast.predict.serve.engine.MXFP4_MOE`): ``marlin`` (vLLM's
    ``VLLM_MXFP4_USE_MARLIN=1``), ``bf16`` (the engine's W4A16 kernel) or ``mxfp8`` (activations in MXFP8 on
    Blackwell, vLLM's ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``). None: the engine's choice by GPU and release
    (:func:`opcast.predict.serve.engine.engine_mxfp4_moe`: TensorRT-LLM's and SGLang's MXFP8 on Blackwell; else
    :func:`~opcast.predict.serve.engine.moe_impl`'s kernel with bf16 activations)."""
    moe_dispatcher: MoeDispatcher | None = None
    """How expert parallelism across replicas (``ep > tp``) moves tokens (:mod:`opcast.predict.moe_dispatch`):
    ``alltoall``, one copy of a token per expert; ``flex``, DeepEP as SGLang runs it (``--moe-a2a-backend
    deepep``, ``--deepep-mode auto``): its normal kernels in prefill steps, one copy a token per remote node, its
    low-latency kernels in decode steps, one per expert; ``allgather``, vLLM's ``allgather_reducescatter``. None:
    the engine's (:func:`opcast.predict.moe_dispatch.infer_dispatcher`: vLLM's allgather, else alltoall)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """A validated training configuration placed on its cluster."""

    cfg: TrainConfig
    cluster: Cluster
    dp: int
    """Resolved data-parallel degree."""
    micro_batches: int
    """Micro-batches per iteration per data-parallel rank (m)."""
    tp_group: Group
    cp_group: Group
    ep_group: Group
    dp_group: Group
    """Gradient reduction group: dp x cp ranks hold the same weights."""
    expert_dp_group: Group
    """Gradient reduction group of expert weights: dp x cp / ep."""
    pp_group: Group
    """The pipeline's ranks (send/recv is inter-node when this spans nodes)."""
    stage_layers: tuple[int, ...] = ()
    """Transformer layers of each pipeline stage (:func:`pipeline_split`); empty: ``n_layers / pp`` each."""

    def layers(self, stage: int) -> int | None:
        """Transformer layers of pipeline ``stage``, or None when the split is the even default."""
        return self.stage_layers[stage] if self.stage_layers else None

    @property
    def uneven(self) -> bool:
        """Whether the stages hold different numbers of layers."""
        return len(set(self.stage_layers)) > 1

    @property
    def world_size(self) -> int:
        return self.cfg.tp * self.cfg.pp * self.dp * self.cfg.cp

    @property
    def compute_dtype(self) -> str:
        return self.cfg.precision

    @property
    def act_dtype(self) -> str:
        return activation_dtype(self.cfg.precision)


# --------------------------------------------------------------------------- pipeline split
#
# How the frameworks assign transformer layers to pipeline stages, reproduced exactly:
# DeepSpeed's PipelineModule._partition_layers (deepspeed/runtime/pipe/module.py) over the layer
# specs of GPT-NeoX's GPTModelPipe, with partition_uniform / partition_balanced
# (deepspeed/runtime/utils.py), and Megatron-LM's get_num_layers_to_build
# (megatron/core/transformer/transformer_block.py).

PP_PARTITION_AUTO = "auto"
DEEPSPEED_NEOX_DEFAULT = "type:transformer|mlp"
"""GPT-NeoX's default ``pipe_partition_method``."""


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: part boundaries (num_parts + 1), the first
    ``num_items % num_parts`` parts one item longer."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: the linear-partition dynamic programme minimising the
    spread (heaviest minus lightest part), ties to the later cut, as boundaries (num_parts + 1)."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = math.inf
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = dp_cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                hi, lo = max(dp_max[k][j - 1], part), min(dp_min[k][j - 1], part)
                if dp_cost[i][j] >= hi - lo:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = hi - lo, hi, lo, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def neox_layer_specs(arch: ArchSpec, *, tp: int, ep: int = 1) -> list[tuple[str, int]]:
    """(type name, parameters on one tensor-parallel rank) of each entry of GPT-NeoX's
    ``GPTModelPipe`` specs: the embedding, ``_pre_transformer_block``, the transformer layers,
    ``_post_transformer_block``, the final norm and the head (a tied head is the embedding again)."""
    from opcast.archs import padded_vocab
    from opcast.predict.memory import layer_params

    dense_l, expert_l = layer_params(arch, tp, ep)
    embedding = padded_vocab(arch.vocab, tp) // tp * arch.hidden
    embedding += arch.max_seq * arch.hidden if arch.position == "learned" else 0
    head = (
        ("EmbeddingPipe", embedding)
        if arch.tied_embeddings
        else ("ParallelLinearPipe", padded_vocab(arch.vocab, tp) // tp * arch.hidden)
    )
    return [
        ("EmbeddingPipe", embedding),
        ("_pre_transformer_block", 0),
        *[("ParallelTransformerLayerPipe", dense_l + expert_l)] * arch.n_layers,
        ("_post_transformer_block", 0),
        ("NormPipe", arch.norm_params()),
        head,
    ]


def deepspeed_split(
    arch: ArchSpec, pp: int, method: str, *, tp: int = 1, ep: int = 1
) -> tuple[tuple[int, ...] | None, list[str]]:
    """Transformer layers per stage as DeepSpeed's ``partition_method`` (uniform, parameters,
    type:REGEX) splits GPT-NeoX's layer specs over ``pp`` stages."""
    specs = neox_layer_specs(arch, tp=tp, ep=ep)
    if method == "uniform":
        parts = partition_uniform(len(specs), pp)
    elif method == "parameters":
        parts = partition_balanced([float(n) for _, n in specs], pp)
    else:  # type:REGEX, matched case-insensitively anywhere in each spec's type name
        try:
            pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
        except re.error as err:
            return None, [f"pp_partition={method!r}: bad regular expression ({err})"]
        weights = [1.0 if pattern.search(name) else 0.0 for name, _ in specs]
        if not any(weights):
            return None, [
                f"pp_partition={method!r} matches no layer type (GPT-NeoX's are "
                f"{', '.join(dict.fromkeys(n for n, _ in specs))})"
            ]
        parts = partition_balanced(weights, pp)
    is_layer = [name == "ParallelTransformerLayerPipe" for name, _ in specs]
    return tuple(sum(is_layer[parts[s] : parts[s + 1]]) for s in range(pp)), []


def accounted_layers(n_layers: int, *, embedding: bool = False, loss: bool = False) -> int:
    """The layers Megatron-LM divides over the pipeline: the transformer layers, plus one each for the embedding and
    the loss where ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` count them."""
    return n_layers + embedding + loss


def megatron_chunks(
    n_layers: int,
    pp: int,
    virtual_stages: int = 1,
    *,
    first: int | None = None,
    last: int | None = None,
    embedding: bool = False,
    loss: bool = False,
) -> tuple[tuple[tuple[int, ...], ...] | None, list[str]]:
    """Transformer layers of each model chunk of each pipeline rank, as Megatron-LM's
    ``get_num_layers_to_build`` builds them (``decoder_first/last_pipeline_num_layers``,
    ``account_for_embedding/loss_in_pipeline_split``), or None and why it refuses."""
    v = max(1, virtual_stages)
    if (first is not None or last is not None) and (embedding or loss):
        return None, ["Megatron-LM cannot combine first/last-stage layer counts with account_for_embedding/loss"]
    if first is not None or last is not None:
        rest, left = n_layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if rest < 0:
            return None, [
                f"Megatron-LM: first={first}, last={last} put more layers on the first and last stages than "
                f"the model's n_layers={n_layers}; give counts that sum to at most {n_layers}"
            ]
        if (left > 0 and rest % left) or (left == 0 and rest):
            return None, [
                f"Megatron-LM: the {rest} layers left after first={first}, last={last} do not divide "
                f"evenly over the {left} other stage(s) of pp={pp}"
            ]
        middle = rest // left if left > 0 else 0
        per_rank = [middle] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        total = accounted_layers(n_layers, embedding=embedding, loss=loss)
        if total % pp:
            what = "n_layers" + (" + embedding" if embedding else "") + (" + loss" if loss else "")
            return None, [
                f"Megatron-LM needs pp={pp} to divide {what} = {total}; give first=/last= stage layer "
                "counts, embedding/loss, or --pp-layers"
            ]
        per_rank = [total // pp] * pp
    if v > 1 and pp > 1 and any(n % v for n in per_rank):
        return None, [f"Megatron-LM needs virtual_stages={v} to divide each rank's layers {per_rank}"]
    chunks = [[n // v if (v > 1 and pp > 1) else n] * (v if pp > 1 else 1) for n in per_rank]
    if embedding:
        chunks[0][0] -= 1
    if loss:
        chunks[-1][-1] -= 1
    if any(c < 0 for rank in chunks for c in rank):
        return None, ["Megatron-LM: not enough layers in the first/last virtual stage for the embedding/loss"]
    return tuple(tuple(rank) for rank in chunks), []


def parse_pp_partition(text: str) -> tuple[str, dict[str, int | bool]] | str:
    """(method, Megatron options) of ``pp_partition``, or the problem with it."""
    how = "give auto, uniform, parameters, type:REGEX or megatron[:first=N,last=N|embedding,loss]"
    if not isinstance(text, str) or not text:
        return f"pp_partition={text!r}: {how}"
    if text in (PP_PARTITION_AUTO, "uniform", "parameters") or (text.startswith("type:") and len(text) > 5):
        return text, {}
    head, _, tail = text.partition(":")
    if head != "megatron":
        return f"pp_partition={text!r}: {how}"
    opts: dict[str, int | bool] = {}
    for item in filter(None, (t.strip() for t in tail.split(","))):
        key, eq, value = item.partition("=")
        if key in ("embedding", "loss") and not eq:
            opts[key] = True
        elif key in ("first", "last") and eq and (n := whole_number(value)) is not None and n >= 1:
            opts[key] = n
        else:
            return f"pp_partition={text!r}: bad Megatron option {item!r}; {how}"
    return "megatron", opts


def pipeline_split(
    arch: ArchSpec,
    *,
    pp: int,
    tp: int = 1,
    ep: int = 1,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    pp_layers: tuple[int, ...] | None = None,
    pp_partition: str = PP_PARTITION_AUTO,
) -> tuple[tuple[int, ...] | None, list[str]]:
    """Transformer layers of each pipeline rank (all its chunks), or None and every reason.

    ``pp_layers`` is an explicit split; else ``pp_partition`` (see :attr:`TrainConfig.pp_partition`).
    An even split (pp divides the layers) is the same in every framework."""
    L, v = arch.n_layers, virtual_stages
    interleaved = schedule == "interleaved"
    if pp > L:
        return None, [f"pp={pp} exceeds n_layers={L}: every stage needs a layer"]
    if pp_layers is not None:
        layers = tuple(pp_layers)
        problems = []
        if len(layers) != pp:
            problems.append(f"--pp-layers gives {len(layers)} stages, pp={pp}")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers):
            problems.append(f"--pp-layers {','.join(map(str, layers))}: every stage needs >= 1 layer")
        elif sum(layers) != L:
            problems.append(f"--pp-layers sums to {sum(layers)}, {arch.name} has n_layers={L}")
        if not problems and interleaved and any(n % v for n in layers):
            problems.append(f"interleaving needs virtual_stages={v} to divide each stage's layers {list(layers)}")
        return (None, problems) if problems else (layers, [])
    parsed = parse_pp_partition(pp_partition)
    if isinstance(parsed, str):
        return None, [parsed]
    method, opts = parsed
    if method == PP_PARTITION_AUTO:
        if interleaved:
            if L % (pp * v):
                return None, [
                    f"interleaving needs pp x virtual_stages = {pp * v} to divide n_layers={L}; "
                    "or give --pp-partition megatron:embedding,loss or --pp-layers"
                ]
            return (L // pp,) * pp, []
        if L % pp == 0:
            return (L // pp,) * pp, []
        method = DEEPSPEED_NEOX_DEFAULT
    if method == "megatron":
        chunks, problems = megatron_chunks(L, pp, v if interleaved else 1, **opts)  # type: ignore[arg-type]
        return (None, problems) if chunks is None else (tuple(sum(c) for c in chunks), [])
    if interleaved:
        return None, [
            f"pp_partition={pp_partition!r} is DeepSpeed's, which has no interleaved schedule; "
            "use megatron[:...] or --pp-layers"
        ]
    return deepspeed_split(arch, pp, method, tp=tp, ep=ep)


# --------------------------------------------------------------------------- validation


def _positive(label: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{label}={value!r} must be a positive integer"
    return None


def _arch_reasons(arch: ArchSpec, **factor: int) -> list[str]:
    """validate_parallel's reasons for one factor at a time, without the arch-name prefix."""
    try:
        arch.validate_parallel(**factor)
    except OpcastError as err:
        text, prefix = str(err), f"{arch.name}: "
        return [text[len(prefix) :] if text.startswith(prefix) else text]
    return []


def device_reasons(device, precision: str) -> list[str]:
    """Why ``device`` cannot compute in ``precision`` (empty when it can)."""
    if precision not in get_args(Precision):
        return [f"precision={precision!r} is not one of {', '.join(get_args(Precision))}"]
    if not device.supports(gemm_dtype(precision)):
        plain = [d for d in device.supported_dtypes() if d in get_args(Precision)]
        usable = plain + [p for p in get_args(Precision) if p not in plain and device.supports(gemm_dtype(p))]
        gemm = gemm_dtype(precision)
        what = f"{precision} peak" if gemm == precision else f"{gemm} peak for {precision}"
        return [f"{device.name} has no {what}; use one of {', '.join(usable)}"]
    return []


def resolve_cluster(
    device, *, nodes: int | None, gpus_per_node: int | None, world_needed: int | None
) -> tuple[Cluster | None, list[str]]:
    """The cluster from --nodes/--gpus-per-node, or the smallest one of ``device`` nodes holding
    ``world_needed`` GPUs."""
    problems = [
        p
        for p in (
            _positive("nodes", nodes) if nodes is not None else None,
            _positive("gpus_per_node", gpus_per_node) if gpus_per_node is not None else None,
        )
        if p
    ]
    if not problems and nodes is not None and gpus_per_node is not None and nodes * gpus_per_node >= INT_PARAM_LIMIT:
        problems.append(
            f"{nodes} nodes x {gpus_per_node} GPUs per node is {nodes * gpus_per_node:.3g} GPUs, past 2**63; "
            "give fewer nodes"
        )
    if problems:
        return None, problems
    if nodes is None and gpus_per_node is None:
        if world_needed is None:
            return Cluster(nodes=1, gpus_per_node=1), []
        g = device.gpus_per_node
        if world_needed <= g:
            return Cluster(nodes=1, gpus_per_node=world_needed), []
        if world_needed % g:
            return None, [
                f"world size {world_needed} is not a whole number of {g}-GPU {device.name} nodes; "
                "give --nodes and --gpus-per-node"
            ]
        return Cluster(nodes=world_needed // g, gpus_per_node=g), []
    if gpus_per_node is None:
        gpus_per_node = device.gpus_per_node
    if nodes is None:
        if world_needed is None:
            nodes = 1
        elif world_needed < gpus_per_node:  # part of one node: a 2-GPU replica on an 8-GPU server
            return Cluster(nodes=1, gpus_per_node=world_needed), []
        elif world_needed % gpus_per_node:
            return None, [f"world size {world_needed} is not a multiple of --gpus-per-node {gpus_per_node}"]
        else:
            nodes = max(1, world_needed // gpus_per_node)
    return Cluster(nodes=nodes, gpus_per_node=gpus_per_node), []


def _part_of_each_node(cluster: Cluster, world_needed: int) -> str:
    """The hint for a world size over one node that whole nodes overshoot but part of each node matches
    (128 GPUs on two 72-GPU GB200 NVL72 racks: 64 of each), else nothing."""
    per, rest = divmod(world_needed, cluster.nodes)
    if rest or per >= cluster.gpus_per_node or world_needed <= cluster.gpus_per_node:
        return ""
    return f"; to use {per} of each node's {cluster.gpus_per_node} GPUs, give --gpus-per-node {per}"


def _degree_reasons(arch: ArchSpec, bad: set[str], **factor: int) -> list[str]:
    """The arch's reasons against each degree in ``factor`` that is itself a positive integer."""
    reasons: list[str] = []
    for label, value in factor.items():
        if label in bad:
            continue
        if label == "ep" and value > 1 and arch.n_experts == 1:
            reasons.append(f"ep={value} needs an MoE arch; {arch.name} is dense (n_experts=1)")
        else:
            reasons += _arch_reasons(arch, **{label: value})
    return reasons


def overlap_reasons(cfg: TrainConfig, sm_count: int | None = None) -> list[str]:
    """Why ``cfg``'s communication-overlap switches cannot apply, as Megatron-LM's ``validate_args`` refuses
    (or, for p2p overlap outside the interleaved schedule, silently turns off) them; ``sm_count``: the GPU's
    SMs, which the userbuffers kernels of ``tp_comm_overlap_cfg`` must leave some of (None: not checked)."""
    reasons = []
    if cfg.overlap_param_gather and (cfg.zero not in (1, 2) or not cfg.overlap_grad_reduce):
        reasons.append(
            "--overlap-param-gather needs the distributed optimizer (--zero 1 or 2) and --overlap-grad-reduce "
            "(Megatron-LM)"
        )
    if cfg.tp_comm_overlap and not cfg.sp:
        reasons.append("--tp-comm-overlap needs sequence parallelism (--sp), as Megatron-LM asserts")
    if cfg.tp_comm_overlap_cfg is not None:
        from opcast.predict.tp_overlap import config_problem

        if not cfg.tp_comm_overlap:
            reasons.append("--tp-comm-overlap-cfg sets how --tp-comm-overlap runs; give --tp-comm-overlap too")
        if (problem := config_problem(cfg.tp_comm_overlap_cfg, sm_count)) is not None:
            reasons.append(problem)
    if cfg.overlap_p2p_comm and cfg.schedule != "interleaved":
        reasons.append(
            "--overlap-p2p-comm needs --schedule interleaved "
            "(Megatron-LM turns it off for the non-interleaved schedule)"
        )
    return reasons


def offload_reasons(cfg: TrainConfig, device, *, layers: int) -> list[str]:
    """Why ``cfg.offload_activations`` cannot apply: Megatron-Core's ``TransformerConfig.__post_init__`` refuses
    offloading ``cpu_offloading_num_layers`` outside ``[0, num_layers)``, with pipeline parallelism and with
    activation recomputation (core_v0.13.0 ``megatron/core/transformer/transformer_config.py``, the same in
    core_v0.15.0); the copies need the ``device``'s host link (None: not checked)."""
    n = cfg.offload_activations
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return [f"offload_activations={n!r} must be a whole number of layers >= 0 (--offload-activations N)"]
    if n == 0:
        return []
    reasons = []
    if n >= layers:
        reasons.append(
            f"--offload-activations {n} must be below the model's {layers} layers (Megatron-Core offloads fewer "
            "layers than the model has)"
        )
    if cfg.pp > 1:
        reasons.append(
            "--offload-activations needs pp=1 (Megatron-Core has no CPU offloading with pipeline parallelism)"
        )
    if cfg.recompute != "none":
        reasons.append(
            f"--offload-activations does not combine with --recompute {cfg.recompute} (Megatron-Core refuses CPU "
            "offloading with activation recomputation)"
        )
    if device is not None and getattr(device, "host_link_bw_bytes_per_s", None) is None:
        reasons.append(
            f"{device.name} has no host link bandwidth in the catalog; give one with "
            "--set host_link_bw_bytes_per_s=VALUE (bytes/s, one direction, e.g. 64e9 for PCIe Gen5 x16)"
        )
    return reasons


def fp8_recipe_reasons(precision: str, fp8_recipe: str) -> list[str]:
    """What is wrong with an fp8 scaling recipe for ``precision`` (``predict train`` and ``search``
    share it): one of :data:`Fp8Recipe`, and other than delayed only with per-tensor fp8."""
    if fp8_recipe not in get_args(Fp8Recipe):
        return [f"fp8_recipe={fp8_recipe!r} is not one of {', '.join(get_args(Fp8Recipe))}"]
    if fp8_recipe != "delayed" and precision != "fp8":
        return [f"fp8_recipe={fp8_recipe!r} applies to precision fp8 (per-tensor scaling) only, not {precision}"]
    return []


def validate_train(
    arch: ArchSpec,
    device,
    cfg: TrainConfig,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    check_device: bool = True,
) -> tuple[Layout | None, list[str]]:
    """The :class:`Layout` of ``cfg``, or None and every reason it cannot run, of every class at
    once (bad values, the device and precision, the arch's parallel degrees, the cluster, the
    batch). ``check_device=False`` leaves the device and precision out, so a caller can still
    lay out (and size the memory of) a configuration the device cannot run."""
    reasons: list[str] = []
    ints = {
        "tp": cfg.tp,
        "pp": cfg.pp,
        "cp": cfg.cp,
        "ep": cfg.ep,
        "micro_batch": cfg.micro_batch,
        "seq": cfg.seq,
        "virtual_stages": cfg.virtual_stages,
    }
    for optional in ("dp", "global_batch"):
        if getattr(cfg, optional) is not None:
            ints[optional] = getattr(cfg, optional)
    bad = {k for k, v in ints.items() if _positive(k, v)}
    reasons += [p for k, v in ints.items() if (p := _positive(k, v))]
    if cfg.zero not in (0, 1, 2, 3):
        reasons.append(f"zero={cfg.zero!r} must be 0, 1, 2 or 3")
    if (problem := recompute_problem(cfg.recompute)) is not None:
        reasons.append(problem)
    for label, value, choices in (
        ("attention", cfg.attention, AttentionImpl),
        ("schedule", cfg.schedule, Schedule),
        ("optimizer", cfg.optimizer, Optimizer),
        ("clocks", cfg.clocks, Clocks),
    ):
        if value not in get_args(choices):
            reasons.append(f"{label}={value!r} is not one of {', '.join(get_args(choices))}")
    reasons += fp8_recipe_reasons(cfg.precision, cfg.fp8_recipe)
    if (problem := dispatcher_problem(cfg.moe_dispatcher, TRAIN_DISPATCHERS)) is not None:
        reasons.append(problem)
    if cfg.framework is not None and cfg.framework not in get_args(FrameworkName):
        reasons.append(f"framework={cfg.framework!r} is not one of {', '.join(get_args(FrameworkName))}")
    if check_device:
        reasons += device_reasons(device, cfg.precision)
    reasons += _degree_reasons(arch, bad, tp=cfg.tp, ep=cfg.ep)  # pp: pipeline_split below
    if cfg.etp is not None and "tp" not in bad and cfg.etp not in (1, cfg.tp):
        reasons.append(f"etp={cfg.etp!r} must be 1 (MoE parallel folding) or tp={cfg.tp} (the default)")
    elif folded(cfg) and not cfg.sp:
        reasons.append("--etp 1 under tp > 1 routes each rank's sequence-parallel share of the tokens: give --sp")
    if cfg.overlap_moe_ep_comm:
        if cfg.ep == 1:
            reasons.append("--overlap-moe-ep-comm overlaps expert-parallel all-to-alls: it needs --ep > 1")
        if cfg.recompute == "full":
            reasons.append("--overlap-moe-ep-comm does not run with --recompute full (Megatron-Core's combined 1F1B)")
        if cfg.pp > 1 and cfg.schedule != "interleaved":
            reasons.append(
                "--overlap-moe-ep-comm with pp > 1 needs --schedule interleaved (Megatron-Core's combined 1F1B runs "
                "without a pipeline or interleaved)"
            )
    if not bad & {"pp", "virtual_stages"}:  # a bad tp or ep does not hide the split's reasons
        stage_layers, split_reasons = pipeline_split(
            arch,
            pp=cfg.pp,
            tp=1 if "tp" in bad else cfg.tp,
            ep=1 if "ep" in bad else cfg.ep,
            schedule=cfg.schedule,
            virtual_stages=cfg.virtual_stages,
            pp_layers=cfg.pp_layers,
            pp_partition=cfg.pp_partition,
        )
        reasons += split_reasons
    if bad:  # the arithmetic below needs sane integers
        return None, reasons

    tp, pp, cp, ep = cfg.tp, cfg.pp, cfg.cp, cfg.ep
    if cfg.dp is not None:
        world_needed: int | None = tp * pp * cp * cfg.dp
    else:  # no dp: the cluster decides it, or dp = 1 without a cluster
        world_needed = None if (nodes is not None or gpus_per_node is not None) else tp * pp * cp
    cluster, problems = resolve_cluster(device, nodes=nodes, gpus_per_node=gpus_per_node, world_needed=world_needed)
    reasons += problems
    dp = cfg.dp
    if cluster is not None:
        world = cluster.world_size
        if dp is None:
            if world % (tp * pp * cp):
                reasons.append(
                    f"world size {world} ({cluster.nodes} nodes x {cluster.gpus_per_node} GPUs) is not a "
                    f"multiple of tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp}"
                )
            else:
                dp = world // (tp * pp * cp)
        elif world != tp * pp * dp * cp:
            reasons.append(
                f"world size {world} ({cluster.nodes} nodes x {cluster.gpus_per_node} GPUs) != "
                f"tp x pp x dp x cp = {tp} x {pp} x {dp} x {cp} = {tp * pp * dp * cp}"
                + _part_of_each_node(cluster, tp * pp * dp * cp)
            )
    if cfg.sp and tp == 1:
        reasons.append("sequence parallelism (--sp) needs tp > 1")
    if cp > 1 and cfg.seq % (2 * cp):
        reasons.append(
            f"context parallelism splits the sequence into 2 x cp = {2 * cp} chunks; "
            f"cp={cp} needs seq={cfg.seq} divisible by {2 * cp}"
        )
    if cfg.sp and tp > 1 and (cfg.seq // cp) % tp:
        reasons.append(f"sequence parallelism needs tp={tp} to divide the per-rank sequence {cfg.seq // cp}")
    if arch.position == "learned" and cfg.seq > arch.max_seq:
        reasons.append(f"seq={cfg.seq} exceeds max_seq={arch.max_seq} of {arch.name} (learned positions)")
    micro_batches = 0
    global_batch = cfg.global_batch
    if dp is not None:
        if global_batch is None:
            global_batch = cfg.micro_batch * dp
        if global_batch % (cfg.micro_batch * dp):
            reasons.append(
                f"global_batch={global_batch} is not a multiple of micro_batch x dp = "
                f"{cfg.micro_batch} x {dp} = {cfg.micro_batch * dp}"
            )
        else:
            micro_batches = global_batch // (cfg.micro_batch * dp)
        if ep > 1 and folded(cfg) and (tp * dp * cp) % ep:
            reasons.append(f"ep={ep} must divide tp x dp x cp = {tp * dp * cp} (the experts fold over them, --etp 1)")
        elif ep > 1 and not folded(cfg) and (dp * cp) % ep:
            reasons.append(
                f"ep={ep} must divide dp x cp = {dp * cp} (experts are sharded across data-parallel ranks; "
                "--etp 1 folds them over the tensor-parallel ranks too)"
            )
    v = cfg.virtual_stages
    if cfg.schedule == "interleaved":
        if pp == 1:
            reasons.append("the interleaved schedule needs pp > 1")
        if v < 2:
            reasons.append(f"the interleaved schedule needs --virtual-stages >= 2, got {v}")
        if micro_batches and micro_batches % pp:
            reasons.append(
                f"interleaving needs the {micro_batches} micro-batches per rank "
                f"to be a multiple of pp={pp} (Megatron-LM)"
            )
    elif v != 1:
        reasons.append(f"--virtual-stages {v} needs --schedule interleaved")
    if cfg.zero == 3 and pp > 1:
        reasons.append(
            "zero=3 with pp > 1 is not supported (DeepSpeed's pipeline engine allows ZeRO stage <= 1; "
            "Megatron's distributed optimizer is zero 1/2)"
        )
    reasons += overlap_reasons(cfg, getattr(device, "sm_count", None))
    reasons += offload_reasons(cfg, device, layers=arch.n_layers)
    if cfg.bucket_params is not None and (p := _positive("bucket_params", cfg.bucket_params)):
        reasons.append(p)
    if reasons or cluster is None or dp is None or stage_layers is None:
        return None, reasons
    g = cluster.gpus_per_node
    fold = folded(cfg)
    tp_group, cp_group, ep_group = model_parallel_groups(tp=tp, cp=cp, ep=ep, gpus_per_node=g, fold=fold)
    dp_group, expert_dp_group = data_parallel_groups(tp=tp, cp=cp, dp=dp, ep=ep, gpus_per_node=g, fold=fold)
    layout = Layout(
        cfg=replace(
            cfg,
            dp=dp,
            global_batch=global_batch,
            pp_layers=stage_layers if len(set(stage_layers)) > 1 else cfg.pp_layers,
        ),
        cluster=cluster,
        dp=dp,
        micro_batches=micro_batches,
        tp_group=tp_group,
        cp_group=cp_group,
        ep_group=ep_group,
        dp_group=dp_group,
        expert_dp_group=expert_dp_group,
        pp_group=place(pp, tp * cp * dp, g),
        stage_layers=stage_layers,
    )
    return layout, []


MAX_GPUS = 2**21
"""The most GPUs a search or a serving simulation takes (2,097,152, several times the largest clusters built):
past it a search enumerates divisors for minutes, and a simulation keeps per-replica arrays and trace tracks
(--replicas 1e8 held 0.8 GB for 10 requests, and its --json listed 1e8 request counts)."""


def replica_count_reasons(cfg: InferConfig, replicas: int) -> list[str]:
    """Why ``replicas`` replicas of tp x pp GPUs are more than a serving simulation takes (:data:`MAX_GPUS`)."""
    gpus = replicas * max(cfg.tp, 1) * max(cfg.pp, 1)
    if gpus <= MAX_GPUS:
        return []
    return [
        f"{replicas:,} replicas of tp={cfg.tp} x pp={cfg.pp} are {gpus:,} GPUs, past the {MAX_GPUS:,} a serving "
        "simulation takes; give fewer replicas"
    ]


def ep_replica_reasons(cfg: InferConfig, replicas: int, pool: str = "") -> list[str]:
    """Why ``replicas`` replicas (of a ``pool``: "prefill " / "decode ") cannot form whole expert-parallel
    groups: ``ep > tp`` spreads the experts over ``ep / tp`` replicas, which serve together."""
    if cfg.tp < 1:  # validate_infer names the bad tp; there is no span to speak of
        return []
    span = cfg.ep // cfg.tp if cfg.ep > cfg.tp and cfg.ep % cfg.tp == 0 else 1
    if replicas % span:
        return [
            f"ep={cfg.ep} spreads the experts over {span} replicas of tp={cfg.tp} (attention data parallelism): "
            f"{pool}replicas={replicas} must be a multiple of {span}"
        ]
    return []


def validate_infer(
    arch: ArchSpec,
    device,
    cfg: InferConfig,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    check_device: bool = True,
) -> tuple[Cluster | None, list[str]]:
    """The cluster of an inference configuration, or None and every reason it cannot run, of
    every class at once (see :func:`validate_train`, also for ``check_device``)."""
    ints = {k: getattr(cfg, k) for k in ("tp", "pp", "ep", "batch", "prompt_len", "gen_len")}
    bad = {k for k, v in ints.items() if _positive(k, v)}
    reasons = [p for k, v in ints.items() if (p := _positive(k, v))]
    if cfg.attention not in get_args(AttentionImpl):
        reasons.append(f"attention={cfg.attention!r} is not one of {', '.join(get_args(AttentionImpl))}")
    if cfg.engine not in get_args(InferEngine):
        reasons.append(f"engine={cfg.engine!r} is not one of {', '.join(get_args(InferEngine))}")
    elif (problem := engine_device_problem(cfg.engine, device)) is not None:
        reasons.append(problem)
    if cfg.engine_version is not None and (problem := engine_version_problem(cfg.engine_version)) is not None:
        reasons.append(problem)
    if cfg.fusions is not None and (problem := fusions_problem(cfg.fusions, cfg.engine)) is not None:
        reasons.append(problem)
    if cfg.mxfp4_moe is not None and (
        problem := mxfp4_moe_problem(cfg.mxfp4_moe, cfg.engine, arch.expert_weights, device, arch.name)
    ):
        reasons.append(problem)
    if cfg.kv_dtype is not None:
        if cfg.kv_dtype not in get_args(KvDtype):
            reasons.append(f"kv_dtype={cfg.kv_dtype!r} is not one of {', '.join(get_args(KvDtype))}")
        elif not device.supports(cfg.kv_dtype):
            reasons.append(f"kv_dtype={cfg.kv_dtype} needs a GPU with {cfg.kv_dtype}; {device.name} has none")
    if cfg.moe_dispatcher is not None and (problem := dispatcher_problem(cfg.moe_dispatcher)) is not None:
        reasons.append(problem)
    if check_device:
        reasons += device_reasons(device, cfg.precision)
    reasons += _degree_reasons(arch, bad, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep)
    if not bad & {"tp", "ep"} and cfg.ep > 1 and cfg.ep % cfg.tp:
        reasons.append(
            f"ep={cfg.ep} must be a multiple of tp={cfg.tp}: the experts spread over the replica's tp GPUs, or over "
            "those of ep / tp replicas (attention data parallelism)"
        )
    if bad:
        return None, reasons
    if arch.position == "learned" and cfg.prompt_len + cfg.gen_len > arch.max_seq:
        reasons.append(
            f"prompt_len + gen_len = {cfg.prompt_len + cfg.gen_len} exceeds max_seq={arch.max_seq} "
            f"of {arch.name} (learned positions)"
        )
    cluster, problems = resolve_cluster(device, nodes=nodes, gpus_per_node=gpus_per_node, world_needed=cfg.tp * cfg.pp)
    reasons += problems
    if cluster is not None and cluster.world_size != cfg.tp * cfg.pp:
        reasons.append(
            f"world size {cluster.world_size} ({cluster.nodes} nodes x {cluster.gpus_per_node} GPUs) != "
            f"tp x pp = {cfg.tp} x {cfg.pp} = {cfg.tp * cfg.pp} (one model replica)"
            + _part_of_each_node(cluster, cfg.tp * cfg.pp)
        )
    return (cluster if not reasons else None), reasons


# --------------------------------------------------------------------------- --cluster

_SHORTHAND = re.compile(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*")
_CLUSTER_KEYS = {"name": str, "nodes": int, "gpus_per_node": int, "gpu": str, "source": str}


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterChoice:
    """A ``--cluster`` naming a catalog cluster (or a catalog-style cluster file): its nodes when
    given (``NAME:NODES`` or ``--nodes``), else as few as the world size needs, of its NVLink domains
    (:func:`job_on_cluster`)."""

    nodes: int | None
    """Nodes given, or None."""
    gpus_per_node: int | None = None
    """GPUs used of each node (``--gpus-per-node``, at most the domain); None: the cluster's whole NVLink
    domain (the device :func:`opcast.clusters.cluster_device_name` prices)."""
    name: str
    """The catalog cluster's name."""


def job_on_cluster(
    choice: ClusterChoice, text: str, *, domain_gpus: int, nodes: int | None, gpus_per_node: int | None
) -> ClusterChoice:
    """``--cluster NAME[:NODES]`` (``text``) with ``--nodes`` and ``--gpus-per-node`` as the job's counts on
    it: ``nodes`` of the cluster's NVLink domains (the nodes a catalog cluster is priced in, ``domain_gpus``
    GPUs each: 72 for a GB200 NVL72 rack) and ``gpus_per_node`` GPUs of each (at most the domain: NVIDIA's
    128-GPU GB200 runs take 64 of each of two racks). The cluster's GPU, links and domain stay, so a group
    inside one domain runs over NVLink and one across domains over the network. Raises one line naming
    every disagreement: a ``--nodes`` other than ``NAME:NODES``, a ``--gpus-per-node`` above the domain."""
    problems = []
    if nodes is not None and choice.nodes is not None and nodes != choice.nodes:
        problems.append(
            f"--nodes {nodes} disagrees with --cluster {text} ({choice.nodes} nodes); give the node count once, "
            f"as --cluster {choice.name}:{nodes} or as --cluster {choice.name} --nodes {nodes}"
        )
    if gpus_per_node is not None and gpus_per_node > domain_gpus:
        problems.append(
            f"--gpus-per-node {gpus_per_node} exceeds the {domain_gpus}-GPU NVLink domain of cluster {choice.name} "
            f"(its node); give at most {domain_gpus}, and more --nodes for more GPUs"
        )
    if problems:
        raise OpcastError("; ".join(problems))
    return replace(choice, nodes=choice.nodes if nodes is None else nodes, gpus_per_node=gpus_per_node)


_CLUSTER_NAME = re.compile(r"\s*([A-Za-z][\w.\-]*?)(?::(\d+))?\s*")


def parse_cluster(text: str) -> tuple[Cluster | ClusterChoice, str | None]:
    """``--cluster``: ``NODESxGPUS`` (e.g. ``16x8``), a catalog cluster ``NAME`` or ``NAME:NODES``
    (``data/clusters``, :mod:`opcast.clusters`), a catalog-style cluster JSON file, or a JSON file
    with keys ``nodes``, ``gpus_per_node`` and optional ``name``, ``gpu`` (a catalog name, or a device
    file taken from the cluster file's folder) and ``source``. Returns the cluster and its GPU name, if it
    names one (for a catalog cluster, the GPU with the cluster's links and NVLink domain)."""
    from opcast.clusters import cluster_device_name, cluster_from_dict, find_cluster

    m = _SHORTHAND.fullmatch(text)
    if m:
        nodes, g = (whole_number(m.group(i)) or 0 for i in (1, 2))
        if nodes < 1 or g < 1:
            raise OpcastError(f"--cluster {text!r}: nodes and GPUs per node must be >= 1")
        if max(nodes, g) >= INT_PARAM_LIMIT:
            raise OpcastError(f"--cluster {text!r}: nodes and GPUs per node must be below 2**63 (as --nodes)")
        return Cluster(nodes=nodes, gpus_per_node=g), None
    path = Path(text).expanduser()
    named = _CLUSTER_NAME.fullmatch(text)
    if named and not path.is_file() and (spec := find_cluster(named.group(1))) is not None:
        given = whole_number(named.group(2)) if named.group(2) else None
        if given is not None and not 1 <= given < INT_PARAM_LIMIT:
            raise OpcastError(f"--cluster {text!r}: nodes must be >= 1 and below 2**63 (as --nodes)")
        return ClusterChoice(nodes=given, name=spec.name), cluster_device_name(spec)
    if not path.is_file():
        from opcast.clusters import cluster_catalog

        raise OpcastError(
            f"--cluster {text!r} is neither NODESxGPUS (e.g. 16x8), a catalog cluster "
            f"({', '.join(sorted(cluster_catalog()))}, optionally NAME:NODES) nor a cluster JSON file"
        )
    data = read_json_file(path, "the cluster file")
    if not isinstance(data, dict):
        raise OpcastError(f"{path}: expected a JSON object with keys nodes, gpus_per_node")
    if "nodes" not in data:  # a catalog-style cluster (data/clusters/*.json)
        spec = cluster_from_dict(data, str(path))
        return ClusterChoice(nodes=None, name=spec.name), cluster_device_name(spec)
    problems = [f"unknown key {k!r}" for k in data if k not in _CLUSTER_KEYS]
    problems += [f"missing key {k!r}" for k in ("nodes", "gpus_per_node") if k not in data]
    for k, t in _CLUSTER_KEYS.items():
        if k in data and (not isinstance(data[k], t) or isinstance(data[k], bool)):
            problems.append(f"{k!r} must be {'an integer' if t is int else 'a string'}")
        elif k in data and t is int and not 1 <= data[k] < INT_PARAM_LIMIT:
            problems.append(f"{k!r} must be >= 1 and below 2**63")
    if problems:
        raise OpcastError(f"{path}: " + "; ".join(problems) + f" (valid keys: {', '.join(_CLUSTER_KEYS)})")
    gpu = data.get("gpu")
    return Cluster(nodes=data["nodes"], gpus_per_node=data["gpus_per_node"]), (
        None if gpu is None else device_name_beside(gpu, path.parent)
    )
