"""One training iteration, in Calculon's explicit stages:

``compile_train(arch, device, cfg)`` validates and lays out the job (or returns an infeasible
:class:`TrainResult` with every reason), ``run_train(plan, kernels, comms)`` prices it, and
:func:`predict_train` does both. The result keeps the breakdown: per-micro-batch stage times
split into forward, backward and recomputation compute, exposed TP/CP/EP/PP communication, the
pipeline bubble, the optimizer step and the exposed data-parallel communication, which together
add up to the iteration time exactly.

Data-parallel gradients (Megatron-LM DDP): ZeRO 0 all-reduces, ZeRO 1/2 reduce-scatters them and
all-gathers the updated weights after the step (distributed optimizer), in buckets of
``max(40M, 1M x dp)`` parameters; with ``--overlap-grad-reduce`` the buckets run behind the last
micro-batch's backward, leaving ``max(one bucket, total - that backward)`` exposed. ZeRO-3 gathers
each layer's weights in forward (and recompute) and backward and reduce-scatters its gradients,
per micro-batch, prefetched behind the layer's compute (under a framework whose ZeRO-3 is torch FSDP,
``foundry``: in its reduce dtype, with FSDP's flat-gradient kernels in each backward,
:func:`fsdp_gradient_kernels`). MoE expert gradients are reduced over
dp x cp / ep ranks. A tied embedding split across pipeline stages all-reduces its gradient between
the first and last stage. Hiding a collective behind compute is not free: its NCCL kernel holds one SM
per channel (:func:`opcast.collectives_law.nccl_ctas`) while the compute beside it runs on the other
SMs, which costs that compute ``hidden seconds x SMs held / SM count``
(:func:`opcast.predict.tp_overlap.comm_sm_time_s`, the rule of Transformer Engine's bulk overlap), priced
with the data-parallel (and ZeRO-3) communication it comes from.

Each term is a pure function of plain values (section "the cost terms"): :func:`run_train` calls
them once per priced stage and :mod:`opcast.predict.search` memoises the same functions across
configurations, so a term is written once.

MFU (Chowdhery et al. 2022, arXiv 2204.02311, App. B: model FLOPs exclude recomputation) uses the
exact FLOPs of the unsharded op graph, forward and backward, for the global batch, over
``iteration time x world size x dense peak``; HFU adds the recomputation. The op graph counts
causal attention as the computed triangle (FlashAttention) and pointwise work, so it is a little
below ``6 N D``-style counts (Narayanan et al. 2021 Eq. 3 counts full attention).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, get_args

from opcast.archs import ArchSpec, padded_vocab
from opcast.collectives_law import nccl_ctas
from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec
from opcast.predict.comm import Collective, CollectiveCostModel, Group, place
from opcast.predict.cost import Kernel, KernelCostModel, kernel
from opcast.predict.cost.sustained import sustained_note, sustained_times
from opcast.predict.frameworks import fp32_gradients, framework_of
from opcast.predict.graph import (
    BWD,
    FWD,
    RECOMPUTE,
    Comm,
    Dtypes,
    Graph,
    Node,
    delayed_amax_reduction,
    fp8_amax_bytes,
    graph_flops,
    precision_of,
    traffic_op,
    train_block,
    train_extras,
    weight_casts,
)
from opcast.predict.intervals import DEFAULT_COVERAGE, Interval, IntervalMode, Residuals, propagate
from opcast.predict.memory import (
    FP32_GRAD_BYTES,
    Memory,
    activation_dtype,
    overflow_reason,
    rank_params,
    run_layer_activation_terms,
    stage_params,
    train_memory,
)
from opcast.predict.moe_dispatch import ALLTOALL, EpDispatch, ep_dispatch
from opcast.predict.offload import exposed_s as offload_exposed_s
from opcast.predict.parallel import (
    Layout,
    Precision,
    TrainConfig,
    data_parallel_groups,
    device_reasons,
    folded,
    gradient_bucket_params,
    validate_train,
)
from opcast.predict.schedule import PipelineTime, pipeline_time
from opcast.predict.tp_overlap import (
    OVERLAP_GEMMS,
    REDUCE_SCATTER,
    ROLE_GEMM,
    Overlapped,
    UbGemm,
    chunk_kernel,
    comm_sm_time_s,
    overlap_kernels,
    overlapped,
    parse_configs,
    reduce_kernel,
)
from opcast.predict.tp_overlap import configs as ub_configs

BREAKDOWN_KEYS = (
    "forward",
    "backward",
    "recompute",
    "optimizer",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm_exposed",
    "offload_exposed",
    "pipeline_bubble",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTime:
    """Seconds one rank of a pipeline stage spends per micro-batch, and per iteration after it."""

    stage: int
    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    """Exposed tensor-parallel (and model-level vocab-parallel) collectives, all phases."""
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    zero3_comm_s: float
    """Exposed per-micro-batch traffic over the data-parallel group: ZeRO-3 gathers / reduce-scatters
    and, training in fp8, the amax all-reduces (:func:`fp8_amax_s`)."""
    optimizer_s: float
    """Once per iteration: the optimizer step and, training in fp8 under Megatron, the weights'
    quantisation (:func:`weight_cast_s`)."""
    dp_comm_s: float
    """Exposed gradient / weight synchronisation after the last micro-batch, once per iteration."""
    dp_comm_total_s: float
    """All of it, hidden or not."""
    forward_comm_s: float = 0.0
    """The exposed TP/CP/EP/ZeRO-3 communication and activation offload of the forward phase (part of the fields
    above; for traces)."""
    offload_s: float = 0.0
    """``--offload-activations``: the host-link copies per micro-batch (device-to-host in the forward,
    host-to-device in the backward) that the layers' compute does not hide
    (:func:`opcast.predict.offload.exposed_s`)."""

    @property
    def per_micro_batch_s(self) -> float:
        return micro_batch_s(self, self.pp_comm_s, self.zero3_comm_s, self.offload_s)

    @property
    def tail_s(self) -> float:
        return stage_tail_s(self.optimizer_s, self.dp_comm_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class OpLine:
    """One kernel of the iteration on one stage."""

    stage: int
    phase: str
    role: str
    kernel: Kernel
    count: float
    """Calls per iteration on one GPU of the stage."""
    time_s: float
    """Seconds per call."""
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CommLine:
    stage: int
    phase: str
    role: str
    call: Collective
    count: float
    time_s: float
    exposed_s: float
    """Exposed seconds per iteration (count x time minus what hides behind compute)."""
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainPlan:
    """A validated configuration, laid out and decomposed, ready to price."""

    arch: ArchSpec
    device: DeviceSpec
    layout: Layout
    stage_kinds: tuple[int, ...]
    """The distinct stages to price (first, one middle, last); the rest repeat the middle one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """A prediction, or an infeasible configuration with every reason."""

    arch: ArchSpec
    device: DeviceSpec
    config: TrainConfig
    feasible: bool
    reasons: tuple[str, ...] = ()
    layout: Layout | None = None
    iteration_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    model_flops: float | None = None
    """FLOPs of one iteration without recomputation (all GPUs)."""
    breakdown_s: dict[str, float] = field(default_factory=dict)
    stages: tuple[StageTime, ...] = ()
    """One per pipeline stage."""
    memory: tuple[Memory, ...] = ()
    """One per pipeline stage."""
    ops: tuple[OpLine, ...] = ()
    comms: tuple[CommLine, ...] = ()
    cost_sources: dict[str, Any] = field(default_factory=dict)
    interval: Interval | None = None
    """The iteration time's prediction interval (:mod:`opcast.predict.intervals`), when learned
    kernels with held-out residuals price part of it and the per-op lines were kept."""

    @property
    def iteration_time_interval_s(self) -> tuple[float, float] | None:
        """(low, high) seconds of :attr:`interval`, or None."""
        return (self.interval.low_s, self.interval.high_s) if self.interval is not None else None

    @property
    def fits(self) -> bool:
        return bool(self.memory) and self.worst_memory.total_bytes <= self.device.mem_bytes

    @property
    def worst_memory(self) -> Memory:
        return max(self.memory, key=lambda m: m.total_bytes)


# --------------------------------------------------------------------------- stages


def compile_train(
    arch: ArchSpec, device: DeviceSpec, cfg: TrainConfig, *, nodes: int | None = None, gpus_per_node: int | None = None
) -> TrainPlan | TrainResult:
    """Validate and lay out ``cfg``; an infeasible configuration comes back as a result with every
    reason at once: a device that cannot run the precision still has its layout checked and, when
    that holds, its memory sized."""
    layout, reasons = validate_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node, check_device=False)
    precision_reasons = device_reasons(device, cfg.precision)
    if precision_reasons and layout is not None and cfg.precision in get_args(Precision):
        reasons = [
            r
            for r in (
                overflow_reason(max(_train_memory(arch, layout), key=lambda m: m.total_bytes), device, _MEMORY_FIX),
            )
            if r
        ]
    if precision_reasons or layout is None:
        return TrainResult(arch=arch, device=device, config=cfg, feasible=False, reasons=(*precision_reasons, *reasons))
    return TrainPlan(arch=arch, device=device, layout=layout, stage_kinds=stage_kinds(cfg.pp, layout.stage_layers))


# --------------------------------------------------------------------------- the cost terms
#
# Pure functions of plain values, the one implementation of each term: run_train calls them once
# per priced stage, the search (predict/search.py) memoises them across configurations.


def stage_kinds(pp: int, stage_layers: Sequence[int] = ()) -> tuple[int, ...]:
    """The distinct pipeline stages to price: the first, one middle and the last; every stage
    when the split is uneven (``stage_layers``, :func:`~opcast.predict.parallel.pipeline_split`)."""
    if len(set(stage_layers)) > 1:
        return tuple(range(pp))
    return (0,) if pp == 1 else (0, pp - 1) if pp == 2 else (0, 1, pp - 1)


def stage_kind(stage: int, pp: int) -> int:
    """The priced stage (:func:`stage_kinds`) whose compute, memory and data-parallel traffic
    ``stage`` repeats: itself when first or last, else stage 1 (a middle stage holds the same
    layers and neither embedding nor head; only its pipeline sends are its own)."""
    return stage if stage in (0, pp - 1) else 1


def graph_groups(tp_group: Group, cp_group: Group, ep_group: Group) -> dict[str, Group]:
    """The communicator of each collective role of the block and model-level graphs."""
    return {
        "tp": tp_group,
        "tp_amax": tp_group,
        "embed_tp": tp_group,
        "head_tp": tp_group,
        "ce_tp": tp_group,
        "cp": cp_group,
        "ep": ep_group,
    }


_FAMILY = {"cp": 1, "ep": 2}
"""Collective role -> index in (tp, cp, ep); every other role (tp_amax, embed_tp, head_tp, ce_tp) is tensor-parallel."""


def exposed_s(
    comm_s: float, overlap_with: str | None, role_times: Mapping[str, float], hidden_fraction: float = 1.0
) -> float:
    """What of a collective's ``comm_s`` is not hidden behind the kernels of role ``overlap_with``: at most
    ``hidden_fraction`` of it hides, and no more than those kernels' time."""
    if overlap_with is None:
        return comm_s
    return comm_s - min(hidden_fraction * comm_s, role_times.get(overlap_with, 0.0))


TP_COMM_OVERLAP_GEMMS = OVERLAP_GEMMS
"""``--tp-comm-overlap`` (Megatron-LM / Transformer Engine userbuffers, with sequence parallelism): the GEMM
each of a block's tensor-parallel collectives runs behind, by phase and kind, one per call in order
(:data:`opcast.predict.tp_overlap.OVERLAP_GEMMS`). Forward: the all-gather of the sequence-parallel input
behind the QKV and MLP-up GEMMs (TE's ring-exchange ``qkv_fprop`` / ``fc1_fprop``), the reduce-scatter of
the output behind the projection and MLP-down GEMMs (pipelined ``proj_fprop`` / ``fc2_fprop``); backward:
the all-gather of the incoming gradient behind the projection and MLP-down data-gradient GEMMs
(``proj_dgrad`` / ``fc2_dgrad``), the reduce-scatter of the QKV and MLP-up data gradients behind their
weight-gradient GEMMs (bulk ``qkv_wgrad`` / ``fc1_wgrad``; the bulk all-gather behind ``qkv_dgrad`` /
``fc1_dgrad`` names its GEMM, ``Comm.overlap_with``). Each is priced as TE runs it
(:func:`opcast.predict.tp_overlap.overlapped`): the GEMM's chunks on the SMs the transfer leaves it, and
what of the collective they do not hide. A GEMM the block lacks (an MoE block's experts) hides nothing."""


class PhaseCost(NamedTuple):
    """One copy of a graph in one phase, per micro-batch."""

    kernel_s: float
    comm_s: tuple[float, float, float]
    """Exposed (tp, cp, ep) collective seconds."""


KernelLine = tuple[Node, float, str]
"""(node, seconds per call, source) of one kernel of a priced phase."""
CommDetail = tuple[Comm, Collective, float, str, float]
"""(graph collective, the call, seconds per call, source, exposed seconds of its count) of a priced phase."""


def phase_cost(
    graph: Graph,
    phase: str,
    groups: Mapping[str, Group],
    kernel_times: Mapping[Kernel, tuple[float, str]],
    comms: CollectiveCostModel,
    device: DeviceSpec,
    kernel_lines: list[KernelLine] | None = None,
    comm_lines: list[CommDetail] | None = None,
    tp_comm_overlap: bool = False,
    overlap_cfgs: Mapping[str, UbGemm] | None = None,
    ep: EpDispatch = ALLTOALL,
) -> PhaseCost:
    """Kernel seconds and exposed collectives of one copy of ``graph`` in ``phase``; each kernel's
    time from ``kernel_times`` (a :meth:`KernelCostModel.lookup` answer), a collective hidden
    behind the kernels of the role it overlaps with, and with ``tp_comm_overlap`` each block
    tensor-parallel all-gather / reduce-scatter overlapped with its GEMM as Transformer Engine runs it
    (:data:`TP_COMM_OVERLAP_GEMMS`; per GEMM ``overlap_cfgs``, TE's defaults where None): the GEMM's
    kernels become its chunk GEMMs on the SMs the transfer leaves it (which ``kernel_times`` must hold,
    :func:`opcast.predict.tp_overlap.overlap_kernels`), the collective's exposed time what they do not
    hide. ``ep``: how the expert all-to-alls (role ``ep``) run, NCCL's (Megatron-Core's alltoall) or DeepEP's
    deduplicating kernels (:func:`opcast.predict.moe_dispatch.ep_dispatch`). ``kernel_lines`` / ``comm_lines``
    collect the per-item figures when given."""
    nodes = graph.nodes[phase]
    by_role: dict[str, float] = {}
    for n in nodes:
        by_role[n.role] = by_role.get(n.role, 0.0) + n.count * kernel_times[n.kernel][0]
    out = [0.0, 0.0, 0.0]
    gemms = TP_COMM_OVERLAP_GEMMS[phase] if tp_comm_overlap else {}
    cfgs = ub_configs(overlap_cfgs) if tp_comm_overlap else {}
    single = {n.role: n for n in nodes if n.count == 1 and n.role in ROLE_GEMM}
    replaced: dict[str, tuple[Overlapped, float, str]] = {}  # GEMM role -> (its overlap, reduction s, its source)
    calls: dict[str, int] = {}  # calls of each kind so far (a kind may come as several Comms: fp8 gathers)
    for c in graph.comms[phase]:
        call = (
            ep.call(c.bytes, groups[c.role])
            if c.role == "ep" and c.kind == "all_to_all"
            else Collective(c.kind, c.bytes, groups[c.role])
        )
        t, src = comms.time_s(call, device)
        tp_role = c.role == "tp" and bool(gemms or cfgs)
        behind: tuple[str, ...] = ()
        if tp_role and c.overlap_with is None:
            behind = gemms.get(c.kind, ())
            first = calls.get(c.kind, 0)
            calls[c.kind] = first + c.count
            behind = tuple(behind[(first + i) % len(behind)] for i in range(c.count)) if behind else ()
        elif tp_role and c.overlap_with in single:
            behind = (c.overlap_with,) * c.count
        if behind:  # call i behind GEMM i (TE's userbuffers)
            exposed = 0.0
            for role in behind:
                node = single.get(role)
                if node is None or role in replaced:  # a GEMM the block lacks (or already overlapped) hides nothing
                    exposed += t if role not in by_role else exposed_s(t, role, by_role)
                    continue
                cfg = cfgs[ROLE_GEMM[role]]
                tp = groups["tp"].size
                ring, rs = cfg.method == "ring_exchange", ROLE_GEMM[role] in REDUCE_SCATTER
                chunk_t = kernel_times[chunk_kernel(node.kernel, cfg, tp)][0] if ring and not rs else 0.0
                red_t, red_src = kernel_times[reduce_kernel(node.kernel, tp)] if ring and rs else (0.0, "")
                ov = overlapped(
                    cfg,
                    tp=tp,
                    gemm_s=kernel_times[node.kernel][0],
                    chunk_s=chunk_t,
                    comm_s=t,
                    sm_count=device.sm_count,
                    reduce_scatter=rs,
                    reduce_s=red_t,
                )
                replaced[role] = (ov, red_t, red_src)
                exposed += ov.exposed_s
        else:
            exposed = exposed_s(c.count * t, c.overlap_with, by_role)
        out[_FAMILY.get(c.role, 0)] += exposed
        if comm_lines is not None:
            comm_lines.append((c, call, t, src, exposed))
    total = 0.0
    for n in nodes:
        if n.role in replaced:
            ov, red_t, red_src = replaced[n.role]
            cfg = cfgs[ROLE_GEMM[n.role]]
            total += ov.gemm_s
            if kernel_lines is not None:
                src = kernel_times[n.kernel][1]
                how = f"tp-comm-overlap {cfg.method}, {ov.pieces} chunk(s) on {_sm_note(cfg, device)}"
                kernel_lines.append((n, ov.gemm_s - red_t, f"{src} ({how})"))
                if red_src:
                    reduce = reduce_kernel(n.kernel, groups["tp"].size)
                    kernel_lines.append((Node(f"{n.role}.ub_reduce", reduce), red_t, red_src))
            continue
        t, src = kernel_times[n.kernel]
        total += n.count * t
        if kernel_lines is not None:
            kernel_lines.append((n, t, src))
    return PhaseCost(total, (out[0], out[1], out[2]))


def _sm_note(cfg: UbGemm, device: DeviceSpec) -> str:
    left = device.sm_count - cfg.num_sm
    if cfg.method == "bulk" and not cfg.set_sm_margin:
        return f"{device.sm_count} SMs, {cfg.num_sm} to the comm while it runs"
    return f"{left if cfg.set_sm_margin else device.sm_count} of {device.sm_count} SMs"


class StageCompute(NamedTuple):
    """Seconds per micro-batch on one rank of a stage: compute by phase and exposed collectives."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    forward_comm_s: float
    """The forward phase's share of the three collective fields."""


EXPERT_ROLES = frozenset({"permute", "mlp_up", "act", "gate_mul", "mlp_down", "unpermute"})
"""An MoE block's work between its dispatch and its combine all-to-all (the rest of the block: attention side)."""


def moe_a2a_exposed(
    graph: Graph,
    costs: Mapping[str, PhaseCost],
    kernel_times: Mapping[Kernel, tuple[float, str]],
    *,
    paired: float,
) -> dict[str, float]:
    """Exposed expert all-to-all seconds of one block per micro-batch by phase (FWD, BWD) under Megatron-Core's
    combined 1F1B (``--overlap-moe-expert-parallel-comm``; ``core.pipeline_parallel.combined_1f1b``: "the forward
    pass of Transformer layers for one micro-batch runs in parallel with the backward pass of another [...] EP A2A in
    forward step is hidden by the attention/mlp computation in the backward step, and vice versa"; the pairing of
    DeepSeek-V3's DualPipe, arXiv 2412.19437 Sec. 3.2.1): a forward's dispatch hides behind the paired backward's
    expert work and its combine behind the backward's attention side, a backward's dispatch and combine behind the
    forward's expert work and attention side. ``costs``: the block's :class:`PhaseCost` (its ep family, all
    exposed without the overlap, is the dispatch and combine of equal size); ``paired``: the share of micro-batches
    whose forward runs beside a backward (the rest, warm-up and cool-down, keep their all-to-alls exposed). The
    streams' contention for SMs and memory bandwidth is not priced."""
    part = {}
    for phase in (FWD, BWD):
        expert = attention = 0.0
        for n in graph.nodes[phase]:
            t = n.count * kernel_times[n.kernel][0]
            if n.role.split(".")[0] in EXPERT_ROLES:
                expert += t
            else:
                attention += t
        part[phase] = (expert, attention)
    a2a = {phase: costs[phase].comm_s[2] / 2 for phase in (FWD, BWD)}  # one dispatch = one combine
    other = {FWD: BWD, BWD: FWD}
    out = {}
    for phase in (FWD, BWD):
        expert, attention = part[other[phase]]
        hidden = max(0.0, a2a[phase] - expert) + max(0.0, a2a[phase] - attention)
        out[phase] = paired * hidden + (1 - paired) * 2 * a2a[phase]
    return out


def combined_1f1b_paired(*, micro_batches: int, pp: int, virtual_stages: int) -> float:
    """The share of a rank's micro-batch forwards that combined 1F1B runs beside a backward: all but the first
    without a pipeline (``combined_1f1b_schedule_for_no_pipelining``), all but the interleaved schedule's warm-up
    forwards (``(pp - 1) x 2 + (v - 1) x pp`` model chunks of the first stage, Megatron-LM's
    ``get_pp_rank_microbatches``) and one, of ``m x v`` chunks, with it."""
    chunks = micro_batches * max(1, virtual_stages)
    warmup = 1 if pp == 1 else (pp - 1) * 2 + (virtual_stages - 1) * pp + 1
    return max(0.0, 1 - warmup / chunks)


def stage_compute(parts: Iterable[tuple[Mapping[str, PhaseCost], int]]) -> StageCompute:
    """A stage's compute from its graphs: (phase -> :class:`PhaseCost`, copies) for the block
    (``n_layers / pp`` copies) and the model-level graph (one)."""
    phase_s = {FWD: 0.0, BWD: 0.0, RECOMPUTE: 0.0}
    comm_s = [0.0, 0.0, 0.0]
    fwd_comm = 0.0
    for costs, repeat in parts:
        for phase in (FWD, BWD, RECOMPUTE):
            kernel_s, fams = costs[phase]
            phase_s[phase] += repeat * kernel_s
            for i in range(3):
                comm_s[i] += repeat * fams[i]
                fwd_comm += repeat * fams[i] if phase == FWD else 0.0
    return StageCompute(phase_s[FWD], phase_s[BWD], phase_s[RECOMPUTE], comm_s[0], comm_s[1], comm_s[2], fwd_comm)


def micro_batch_s(
    work: StageCompute | StageTime, pp_comm_s: float, zero3_comm_s: float, offload_s: float = 0.0
) -> float:
    """Seconds a stage spends per micro-batch: compute, exposed TP/CP/EP collectives, pipeline
    sends, exposed ZeRO-3 traffic and exposed activation offload (:attr:`StageTime.per_micro_batch_s`)."""
    return (
        work.forward_s
        + work.backward_s
        + work.recompute_s
        + work.tp_comm_s
        + work.cp_comm_s
        + work.ep_comm_s
        + pp_comm_s
        + zero3_comm_s
        + offload_s
    )


def stage_tail_s(optimizer_s: float, dp_comm_s: float) -> float:
    """What a stage adds once per iteration after its last micro-batch (:attr:`StageTime.tail_s`)."""
    return optimizer_s + dp_comm_s


def bucketed_s(
    comms: CollectiveCostModel,
    device: DeviceSpec,
    kind: str,
    params: int,
    bytes_per_param: int,
    group: Group,
    bucket_params: int,
) -> tuple[float, float]:
    """(total, last bucket) seconds of a bucketed collective over ``params`` parameters."""
    if group.size <= 1 or params <= 0:
        return 0.0, 0.0
    full, rest = divmod(params, bucket_params)
    t_full = comms.time_s(Collective(kind, bucket_params * bytes_per_param, group), device)[0] if full else 0.0
    t_rest = comms.time_s(Collective(kind, rest * bytes_per_param, group), device)[0] if rest else 0.0
    return full * t_full + t_rest, (t_rest if rest else t_full)


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelSync:
    """The data-parallel collectives of one stage's rank, which do not depend on its compute."""

    zero3: tuple[Collective, float, Collective, float] | None
    """ZeRO-3: (per-layer all-gather, its seconds, per-layer reduce-scatter, its seconds); else None."""
    reduce: Collective | None = None
    """Bucketed (ZeRO 0-2): the whole gradient reduction as one call (for the report line)."""
    reduce_total_s: float = 0.0
    last_bucket_s: float = 0.0
    gather_total_s: float = 0.0
    """ZeRO 1/2: the all-gather of the updated weights after the step."""
    gather_bucket_s: float = 0.0
    """ZeRO 1/2: one bucket's weight all-gather (what ``--overlap-param-gather`` always leaves exposed)."""
    tied: Collective | None = None
    """The tied-embedding gradient all-reduce between the first and last stage, when split by pp."""
    tied_s: float = 0.0
    amax: tuple[Collective, float, Collective, float] | None = None
    """Training in fp8: (forward amax all-reduce, its seconds, backward one, its seconds) of one model
    chunk's micro-batch (:func:`fp8_amax_sync`); else None."""
    sm_count: int = 1
    """The device's SMs, which the collectives' SMs below are shares of."""
    gather_sms: int = 0
    """SMs an all-gather of the weights (ZeRO-3's or ZeRO 1/2's) holds while it runs (:func:`comm_sms`)."""
    reduce_sms: int = 0
    """SMs a gradient reduction (ZeRO-3's reduce-scatter, the bucketed reduce-scatter or all-reduce) holds."""


ALL_REDUCE_ZERO_FRAMEWORKS = frozenset({"neox"})
"""Frameworks whose ZeRO-1/2 is DeepSpeed's (GPT-NeoX): ``stage_1_and_2.py`` ``average_tensor`` sends
each gradient bucket through ``allreduce_and_scatter`` (``use_multi_rank_bucket_allreduce``, on by
default since DeepSpeed 0.10; the 2509.22832 runs print it) and keeps its own partition, so the
reduction costs an all-reduce, not Megatron's distributed-optimizer reduce-scatter; the weight
all-gather after the step is the same."""


def gradient_reduce_kind(zero: int, framework: str | None = None) -> str:
    """The collective that reduces the gradients of ZeRO ``zero`` < 3 under ``framework``: all-reduce
    for ZeRO 0 and for DeepSpeed's ZeRO 1/2 (:data:`ALL_REDUCE_ZERO_FRAMEWORKS`), else reduce-scatter."""
    return "all_reduce" if zero == 0 or framework in ALL_REDUCE_ZERO_FRAMEWORKS else "reduce_scatter"


def data_parallel_sync(
    arch: ArchSpec,
    device: DeviceSpec,
    comms: CollectiveCostModel,
    *,
    stage: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    dp: int,
    zero: int,
    gpus_per_node: int,
    grad_bytes: int,
    reduce_bytes: int | None = None,
    bucket_params: int | None = None,
    layers: int | None = None,
    framework: str | None = None,
    fp8: bool = False,
    fold: bool = False,
) -> DataParallelSync:
    """Data-parallel gradients (module docstring): ZeRO-3 gathers and reduce-scatters each layer;
    ZeRO 0 all-reduces, 1/2 reduce-scatter (DeepSpeed's all-reduce) and all-gather the weights, in
    buckets, the expert gradients over dp x cp / ep ranks; a tied embedding split over stages all-reduces its gradient.
    ``layers``: the stage's transformer layers when the pipeline split is uneven; ``framework``: whose
    ZeRO 1/2 (:func:`gradient_reduce_kind`); ``fp8``: the amax all-reduces too (:func:`fp8_amax_sync`).
    ``grad_bytes``: bytes a weight element moves in the gathers (the 16-bit parameters); ``reduce_bytes``: a
    gradient element in the reductions (:func:`gradient_reduce_bytes`; None: ``grad_bytes``)."""
    red_b = grad_bytes if reduce_bytes is None else reduce_bytes
    params = stage_params(arch, tp=tp, pp=pp, ep=ep, stage=stage, layers=layers, whole_experts=fold)
    amax = (
        fp8_amax_sync(
            arch,
            device,
            comms,
            tp=tp,
            cp=cp,
            dp=dp,
            ep=ep,
            layers=arch.n_layers // pp if layers is None else layers,
            gpus_per_node=gpus_per_node,
        )
        if fp8
        else None
    )
    dp_group, expert_dp_group = data_parallel_groups(tp=tp, cp=cp, dp=dp, ep=ep, gpus_per_node=gpus_per_node, fold=fold)
    reduce_kind = "reduce_scatter" if zero == 3 else gradient_reduce_kind(zero, framework)
    gather_sms, reduce_sms = comm_sms("all_gather", device, dp_group), comm_sms(reduce_kind, device, dp_group)
    tied = tied_s = None
    if arch.tied_embeddings and pp > 1 and stage in (0, pp - 1):
        tied = Collective(
            "all_reduce",
            padded_vocab(arch.vocab, tp) // tp * arch.hidden * red_b,
            place(2, (pp - 1) * tp * cp * dp, gpus_per_node),
        )
        tied_s = comms.time_s(tied, device)[0]
    if zero == 3 and dp_group.size > 1:
        ag = Collective("all_gather", params.per_layer * grad_bytes, dp_group)
        rs_b = max(red_b, zero3_reduce_bytes(framework, grad_bytes))
        rs = Collective("reduce_scatter", params.per_layer * rs_b, dp_group)
        return DataParallelSync(
            zero3=(ag, comms.time_s(ag, device)[0], rs, comms.time_s(rs, device)[0]),
            tied=tied,
            tied_s=tied_s or 0.0,
            amax=amax,
            sm_count=device.sm_count,
            gather_sms=gather_sms,
            reduce_sms=reduce_sms,
        )
    bucket = gradient_bucket_params(dp, bucket_params)
    tot_d, last_d = bucketed_s(comms, device, reduce_kind, params.dense, red_b, dp_group, bucket)
    tot_e, last_e = bucketed_s(comms, device, reduce_kind, params.expert, red_b, expert_dp_group, bucket)
    gather_total = gather_bucket = 0.0
    if zero in (1, 2):
        g_d, b_d = bucketed_s(comms, device, "all_gather", params.dense, grad_bytes, dp_group, bucket)
        g_e, b_e = bucketed_s(comms, device, "all_gather", params.expert, grad_bytes, expert_dp_group, bucket)
        gather_total, gather_bucket = g_d + g_e, max(b_d, b_e)
    return DataParallelSync(
        zero3=None,
        reduce=Collective(reduce_kind, params.total * red_b, dp_group),
        reduce_total_s=tot_d + tot_e,
        last_bucket_s=max(last_d, last_e),
        gather_total_s=gather_total,
        gather_bucket_s=gather_bucket,
        tied=tied,
        tied_s=tied_s or 0.0,
        amax=amax,
        sm_count=device.sm_count,
        gather_sms=gather_sms,
        reduce_sms=reduce_sms,
    )


def comm_sms(kind: str, device: DeviceSpec, group: Group) -> int:
    """SMs a data-parallel collective of ``kind`` over ``group`` holds on ``device`` while it runs
    (:func:`opcast.collectives_law.nccl_ctas`)."""
    return nccl_ctas(
        kind,
        vendor=device.vendor,
        architecture=device.architecture,
        intra_node_bw_bytes_per_s=device.intra_node_bw_bytes_per_s,
        nodes=group.nodes,
    )


def fp8_amax_sync(
    arch: ArchSpec,
    device: DeviceSpec,
    comms: CollectiveCostModel,
    *,
    tp: int,
    cp: int,
    dp: int,
    ep: int,
    layers: int,
    gpus_per_node: int,
) -> tuple[Collective, float, Collective, float] | None:
    """The amax all-reduces (MAX) of delayed-scaling fp8 on a stage of ``layers`` blocks: (forward
    call, its seconds, backward call, its seconds), or None when the group is one rank. The amaxes
    of every fp8 GEMM of the stage go in one call per direction (:func:`~opcast.predict.graph.fp8_amax_bytes`)
    over Megatron-Core's amax reduction group, the tensor x data x context-parallel ranks of a
    pipeline stage (v0.10 ``megatron/core/transformer/transformer_block.py`` ``TransformerBlock.forward``:
    ``fp8_autocast(fp8_group=get_amax_reduction_group(with_context_parallel=True))``;
    ``parallel_state.py`` ``_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP``), consecutive in its rank order."""
    group = place(tp * cp * dp, 1, gpus_per_node)
    if group.size <= 1:
        return None
    size = fp8_amax_bytes(arch, ep=ep, layers=layers)
    fwd, bwd = Collective("all_reduce", size[FWD], group), Collective("all_reduce", size[BWD], group)
    return fwd, comms.time_s(fwd, device)[0], bwd, comms.time_s(bwd, device)[0]


def fp8_amax_s(sync: DataParallelSync, virtual_stages: int) -> tuple[float, float]:
    """(exposed seconds per micro-batch, their forward share) of a stage's amax all-reduces: one per
    direction and model chunk (each chunk's ``TransformerBlock.forward`` is its own ``fp8_autocast``;
    TE v1.13 ``fp8.py`` ``FP8GlobalStateManager.fp8_autocast_exit`` reduces the forward amaxes,
    ``module/linear.py`` ``_Linear.backward`` (``reduce_and_update_bwd_fp8_tensors``, the first fp8
    module of the autocast) the backward ones), blocking (``async_op=False``): all exposed."""
    if sync.amax is None:
        return 0.0, 0.0
    _, fwd_s, _, bwd_s = sync.amax
    return virtual_stages * (fwd_s + bwd_s), virtual_stages * fwd_s


def weight_cast_s(casts: Sequence[Node], kernel_times: Mapping[Kernel, tuple[float, str]], layers: int) -> float:
    """Seconds a stage of ``layers`` blocks spends once per iteration quantising its fp8 weights
    (:func:`~opcast.predict.graph.weight_casts`), each kernel's time from ``kernel_times``."""
    return layers * math.fsum(n.count * kernel_times[n.kernel][0] for n in casts)


def zero3_gathers(recompute: str) -> int:
    """ZeRO-3 weight gathers per layer and micro-batch: forward, backward and, with full recomputation, recompute."""
    return 3 if recompute == "full" else 2


def gradient_reduce_bytes(grad_bytes: int, framework: str | None, grad_reduce_in_fp32: bool | None = None) -> int:
    """Bytes a gradient element moves in the data-parallel reduction: 4 where a 16-bit run reduces in fp32
    (:func:`~opcast.predict.frameworks.fp32_gradients`), else ``grad_bytes`` (the run's 16-bit or fp32 element)."""
    return max(grad_bytes, FP32_GRAD_BYTES) if fp32_gradients(framework, grad_reduce_in_fp32) else grad_bytes


def zero3_reduce_bytes(framework: str | None, grad_bytes: int) -> int:
    """Bytes per gradient element of ZeRO-3's reduce-scatter: the gradient's own, or the framework's
    wider reduce dtype (:attr:`~opcast.predict.frameworks.Framework.zero3_reduce_bytes`; foundry: fp32)."""
    return max(grad_bytes, framework_of(framework).zero3_reduce_bytes or 0)


def fsdp_gradient_kernels(numel: int, *, grad_bytes: int, reduce_bytes: int, dp: int) -> tuple[Node, ...]:
    """The kernels PyTorch FSDP runs over one unit's flat gradient of ``numel`` elements per
    micro-batch, besides its reduce-scatter (torch 2.1 ``torch/distributed/fsdp``, unchanged since):

    - flatten: FSDP computes with views of the ``FlatParameter`` (``flat_param.py``
      ``_get_unflat_views``: ``torch.split(flat_param, numels)`` then ``.view``), so autograd's backward
      of the split concatenates the parameters' gradients into the flat gradient: ``grad_bytes`` read
      and written an element;
    - upcast, when the reduce dtype is wider than the gradient: ``_post_backward_hook``'s
      ``flat_param.grad.to(handle._reduce_dtype)``: ``grad_bytes`` read, ``reduce_bytes`` written;
    - pre-divide: ``_reduce_grad``'s ``_div_if_needed(padded_unsharded_grad, predivide_factor)``, in
      place, whose factor (``default_hooks.DefaultState._get_gradient_predivide_factor``) is >= 2 for
      every ``dp`` >= 2: ``reduce_bytes`` read and written.

    Each is priced by :func:`opcast.predict.graph.traffic_op`, as the fp8 casts are. None for ``dp`` 1
    (FSDP reduces nothing)."""
    if dp <= 1 or numel <= 0:
        return ()
    moved = [("fsdp.grad_flatten", 2 * grad_bytes)]
    if reduce_bytes > grad_bytes:
        moved.append(("fsdp.grad_upcast", grad_bytes + reduce_bytes))
    moved.append(("fsdp.grad_predivide", 2 * reduce_bytes))
    bf16 = precision_of("bf16")
    return tuple(
        Node(role, bf16.of(kind, params)) for role, kind, params, _ in (traffic_op(r, numel * b) for r, b in moved)
    )


def fsdp_gradient_s(
    layer_kernels: Sequence[Node], rest_kernels: Sequence[Node], times: Mapping[Kernel, tuple[float, str]], layers: int
) -> float:
    """Seconds per micro-batch of a stage's FSDP flat-gradient kernels (:func:`fsdp_gradient_kernels`):
    one set per block (``layers``) and one for the rest of the stage's parameters (the root unit)."""
    return layers * math.fsum(times[n.kernel][0] for n in layer_kernels) + math.fsum(
        times[n.kernel][0] for n in rest_kernels
    )


class DataParallelTime(NamedTuple):
    """What of a stage's :class:`DataParallelSync` its compute does not hide."""

    zero3_s: float
    """Exposed ZeRO-3 traffic per micro-batch."""
    zero3_forward_s: float
    """Its forward share."""
    exposed_s: float
    """Exposed gradient / weight synchronisation after the last micro-batch, once per iteration."""
    total_s: float
    """All of the data-parallel traffic of an iteration, hidden or not."""
    gradients_exposed_s: float
    """The bucketed reduction and weight gather's share of ``exposed_s`` (all but the tied embedding)."""


def data_parallel_time(
    sync: DataParallelSync,
    compute: StageCompute,
    *,
    layers: int,
    micro_batches: int,
    recompute: str,
    overlap_grad_reduce: bool,
    overlap_param_gather: bool = False,
) -> DataParallelTime:
    """ZeRO-3 prefetches each layer's gathers behind the previous layer's compute; the bucketed
    reduction overlaps (``overlap_grad_reduce``) the last micro-batch's backward, leaving
    ``max(one bucket, total - that backward)`` exposed, and the weight gather follows the step, or
    with ``overlap_param_gather`` (Megatron-LM: each bucket's gather is waited for in the forward
    pre-hook of its first layer) runs behind the next iteration's first micro-batch forward, leaving
    ``max(one bucket, gather - that forward)`` exposed. What hides takes its SMs from the compute it hides
    behind (module docstring): each hidden second of a gather costs ``sync.gather_sms / sync.sm_count``
    seconds, of a reduction ``sync.reduce_sms / sync.sm_count``, counted with the exposed traffic."""
    zero3_s = zero3_fwd = dp_exposed = dp_total = 0.0

    def taken(hidden_s: float, sms: int) -> float:
        return comm_sm_time_s(hidden_s, sms, sync.sm_count)

    if sync.zero3 is not None:
        _, ag, _, rs = sync.zero3
        gathers = zero3_gathers(recompute)
        fwd_layer = compute.forward_s / layers
        bwd_layer = (compute.backward_s + compute.recompute_s) / layers
        bwd_comm = (gathers - 1) * ag + rs
        # the backward's hidden share is split between its gathers and its reduce-scatter by their times
        bwd_hidden = min(bwd_comm, bwd_layer)
        bwd_taken = (
            taken(bwd_hidden * (gathers - 1) * ag / bwd_comm, sync.gather_sms)
            + taken(bwd_hidden * rs / bwd_comm, sync.reduce_sms)
            if bwd_comm > 0
            else 0.0
        )
        zero3_fwd = layers * (max(0.0, ag - fwd_layer) + taken(min(ag, fwd_layer), sync.gather_sms))
        zero3_s = zero3_fwd + layers * (max(0.0, bwd_comm - bwd_layer) + bwd_taken)
        dp_total = micro_batches * layers * (gathers * ag + rs)
    else:
        window = compute.backward_s + compute.recompute_s  # the last micro-batch's backward on this stage
        reduce_exposed = (
            max(sync.last_bucket_s, sync.reduce_total_s - window) if overlap_grad_reduce else sync.reduce_total_s
        )
        gather_exposed = (
            max(sync.gather_bucket_s, sync.gather_total_s - compute.forward_s)
            if overlap_param_gather and sync.gather_total_s > 0
            else sync.gather_total_s
        )
        dp_total = sync.reduce_total_s + sync.gather_total_s
        dp_exposed = min(dp_total, reduce_exposed + gather_exposed)
        dp_exposed += taken(max(0.0, sync.reduce_total_s - reduce_exposed), sync.reduce_sms) + taken(
            max(0.0, sync.gather_total_s - gather_exposed), sync.gather_sms
        )
    gradients_exposed = dp_exposed
    if sync.tied is not None:
        dp_total += sync.tied_s
        dp_exposed += sync.tied_s
    return DataParallelTime(zero3_s, zero3_fwd, dp_exposed, dp_total, gradients_exposed)


def offload_time(
    arch: ArchSpec, device: DeviceSpec, cfg: TrainConfig, block_costs: Mapping[str, PhaseCost], *, layers: int
) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch the compute waits for ``--offload-activations``' copies
    (:func:`opcast.predict.offload.exposed_s`): one layer's saved activations
    (:func:`~opcast.predict.memory.run_layer_activation_terms`, as the memory counts them) over the device's host
    link, behind the block's compute and exposed collectives of the layers of each copy's window."""
    host_bw = device.host_link_bw_bytes_per_s
    if host_bw is None:  # validate_train refuses it first
        raise OpcastError(f"{device.name} has no host link bandwidth; give --set host_link_bw_bytes_per_s=VALUE")
    layer_bytes, _ = run_layer_activation_terms(
        arch,
        tp=cfg.tp,
        sp=cfg.sp,
        micro_batch=cfg.micro_batch,
        seq=cfg.seq,
        cp=cfg.cp,
        ep=cfg.ep,
        attention=cfg.attention,
        recompute=cfg.recompute,
        precision=cfg.precision,
        fold=folded(cfg),
    )

    def per_layer(phase: str) -> float:
        kernel_s, fams = block_costs[phase]
        return kernel_s + sum(fams)

    return offload_exposed_s(
        layer_bytes=layer_bytes,
        host_bw_bytes_per_s=host_bw,
        forward_layer_s=per_layer(FWD),
        backward_layer_s=per_layer(BWD),
        layers=layers,
        offloaded=cfg.offload_activations,
    )


def p2p_message_bytes(arch: ArchSpec, *, micro_batch: int, seq: int, cp: int, tp: int, precision: str) -> int:
    """Bytes of one pipeline message: a micro-batch's activation, 1/tp of it with Megatron's
    scatter/gather optimisation (or SP)."""
    return micro_batch * (seq // cp) * arch.hidden * dtype_bytes(activation_dtype(precision)) // tp


def pipeline_sends(
    *, stage: int, pp: int, virtual_stages: int, message_bytes: int, stride: int, gpus_per_node: int
) -> tuple[tuple[Collective, int], ...]:
    """(send, count per micro-batch) of ``stage``: each of its v chunks sends its output forward and
    its input gradient backward, except the very last chunk's forward and the very first chunk's
    backward; interleaving wraps from the last stage to the first. A boundary between ranks
    (``stride`` apart per stage) on different nodes goes over the NIC. With pp > 1 the forward
    sends come first, then the backward ones (a count may be 0)."""
    if pp == 1:
        return ()
    v, g = virtual_stages, gpus_per_node
    out = []
    for target, sends in (((stage + 1) % pp, v - (stage == pp - 1)), ((stage - 1) % pp, v - (stage == 0))):
        same_node = (stage * stride) // g == (target * stride) // g
        out.append((Collective("send_recv", message_bytes, Group(2, 1, 2) if same_node else Group(2, 2, 1)), sends))
    return tuple(out)


def pipeline_send_s(
    comms: CollectiveCostModel,
    device: DeviceSpec,
    sends: Sequence[tuple[Collective, int]],
    windows_s: tuple[float, float] | None = None,
) -> float:
    """Exposed seconds of a stage's pipeline sends per micro-batch (:func:`pipeline_sends`): all of
    them, or with ``windows_s`` (:func:`p2p_overlap_windows`, ``--overlap-p2p-comm``) what of each
    forward / backward send its chunk's forward / backward compute does not hide."""
    total = 0.0
    for i, (call, n) in enumerate(sends):
        if n:
            total += n * send_exposed_s(comms.time_s(call, device)[0], None if windows_s is None else windows_s[i])
    return total


def send_exposed_s(send_s: float, window_s: float | None) -> float:
    """What of one pipeline send of ``send_s`` the chunk compute ``window_s`` beside it does not hide
    (None: no overlap, all of it)."""
    return send_s if window_s is None else exposed_s(send_s, "chunk", {"chunk": window_s})


def p2p_overlap_windows(compute: StageCompute | StageTime, virtual_stages: int) -> tuple[float, float]:
    """(forward, backward) seconds of one model chunk of a stage per micro-batch: what one pipeline
    send hides behind with Megatron-LM's ``overlap_p2p_comm`` (interleaved schedule: the send of one
    chunk's output or input gradient runs while the next chunk computes)."""
    v = max(1, virtual_stages)
    return compute.forward_s / v, (compute.backward_s + compute.recompute_s) / v


def optimizer_numel(
    arch: ArchSpec,
    *,
    stage: int,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    ep: int,
    zero: int,
    layers: int | None = None,
    fold: bool = False,
) -> int:
    """Parameters one rank's Adam step updates: its stage's (``layers`` blocks when the split is
    uneven), divided over the dp x cp ranks (the experts' over :func:`expert_data_parallel`) from ZeRO 1 on."""
    held = rank_params(
        arch, stage=stage, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sharded=zero >= 1, layers=layers, fold=fold
    )
    return max(1, int(round(held)))


def optimizer_kernel(numel: int) -> Kernel:
    """One fused Adam step over ``numel`` fp32 parameters."""
    return kernel("optimizer", {"numel": numel}, "fp32", "fwd", False)


def stage_time(
    stage: int,
    compute: StageCompute,
    dp: DataParallelTime,
    *,
    pp_comm_s: float,
    optimizer_s: float,
    amax_s: tuple[float, float] = (0.0, 0.0),
    offload_s: tuple[float, float] = (0.0, 0.0),
) -> StageTime:
    """A priced stage from its terms (``amax_s``: :func:`fp8_amax_s`; ``optimizer_s`` with the weight casts;
    ``offload_s``: the (forward, backward) exposed activation offload, :func:`offload_time`)."""
    return StageTime(
        stage=stage,
        forward_s=compute.forward_s,
        backward_s=compute.backward_s,
        recompute_s=compute.recompute_s,
        tp_comm_s=compute.tp_comm_s,
        cp_comm_s=compute.cp_comm_s,
        ep_comm_s=compute.ep_comm_s,
        pp_comm_s=pp_comm_s,
        zero3_comm_s=dp.zero3_s + amax_s[0],
        optimizer_s=optimizer_s,
        dp_comm_s=dp.exposed_s,
        dp_comm_total_s=dp.total_s,
        forward_comm_s=compute.forward_comm_s + dp.zero3_forward_s + amax_s[1] + offload_s[0],
        offload_s=offload_s[0] + offload_s[1],
    )


def compose_iteration(
    stage_s: Sequence[float], tails_s: Sequence[float], micro_batches: int, virtual_stages: int
) -> tuple[PipelineTime, int, float]:
    """(pipeline, index of the slowest tail, iteration seconds) from every stage's seconds per
    micro-batch and the stages' tails: the pipeline (:func:`~opcast.predict.schedule.pipeline_time`)
    plus the slowest optimizer step and exposed data-parallel synchronisation."""
    pipe = pipeline_time(stage_s, micro_batches, virtual_stages)
    tail = max(range(len(tails_s)), key=tails_s.__getitem__)
    return pipe, tail, pipe.time_s + tails_s[tail]


def tokens_per_s(global_batch: int, seq: int, iteration_s: float) -> float:
    """Training throughput: the tokens of an iteration over its seconds."""
    return global_batch * seq / iteration_s


def flops_utilisation(flops: float, iteration_s: float, world: int, peak_flops: float) -> float:
    """MFU (model FLOPs) or HFU (with recomputation): FLOPs over iteration time x GPUs x dense peak."""
    return flops / (iteration_s * world * peak_flops)


def dense_peak_flops(device: DeviceSpec, precision: str, tensor_cores: bool | None = None) -> float:
    """The peak MFU is measured against: the GEMMs' (tensor-core unless fp32 without TF32; the fp8 one
    for mxfp8, the fp4 one for nvfp4)."""
    prec = precision_of(precision, tensor_cores)
    return device.peak_flops(prec.matrix, tensor_cores=prec.peak_tensor_cores())


def model_flops(
    arch: ArchSpec,
    *,
    seq: int,
    global_batch: int,
    precision: str,
    attention: str,
    recompute: str,
    tensor_cores: bool | None = None,
) -> tuple[float, float]:
    """(model FLOPs, recompute FLOPs) of one iteration on all GPUs, from the unsharded graph."""
    prec = precision_of(precision, tensor_cores)
    block = train_block(
        arch, tp=1, batch=1, seq=seq, sp=False, cp=1, ep=1, attention=attention, recompute=recompute, prec=prec
    )
    extras = train_extras(arch, tp=1, batch=1, seq=seq, sp=False, cp=1, first=True, last=True, prec=prec)
    per_seq = arch.n_layers * graph_flops(block) + graph_flops(extras)
    rec = arch.n_layers * graph_flops(block, (RECOMPUTE,))
    return per_seq * global_batch, rec * global_batch


# --------------------------------------------------------------------------- pricing a plan


class _Pricer:
    """Prices one plan's stages with the cost terms above, remembering lines for the report."""

    def __init__(self, plan: TrainPlan, kernels: KernelCostModel, comms: CollectiveCostModel, keep_lines: bool) -> None:
        self.plan, self.kernels, self.comms, self.keep = plan, kernels, comms, keep_lines
        self.device = plan.device
        lay = plan.layout
        self.ep_dispatch = ep_dispatch(lay.cfg.moe_dispatcher, plan.arch, lay.ep_group.nodes)
        self.table: Mapping[Kernel, tuple[float, str]] = {}
        self.ops: list[OpLine] = []
        self.comm_lines: list[CommLine] = []

    def graph_costs(self, graph: Graph, groups: Mapping[str, Group], stage: int, repeat: int) -> dict[str, PhaseCost]:
        """Phase -> cost of one copy of ``graph``, recording its lines (``repeat`` copies per micro-batch)."""
        m = self.plan.layout.micro_batches
        out = {}
        for phase in (FWD, BWD, RECOMPUTE):
            klines: list[KernelLine] | None = [] if self.keep else None
            clines: list[CommDetail] | None = [] if self.keep else None
            out[phase] = phase_cost(
                graph,
                phase,
                groups,
                self.table,
                self.comms,
                self.device,
                klines,
                clines,
                tp_comm_overlap=self.plan.layout.cfg.tp_comm_overlap,
                overlap_cfgs=_overlap_cfgs(self.plan),
                ep=self.ep_dispatch,
            )
            for n, t, src in klines or ():
                self.ops.append(
                    OpLine(
                        stage=stage,
                        phase=phase,
                        role=n.role,
                        kernel=n.kernel,
                        count=n.count * repeat * m,
                        time_s=t,
                        source=src,
                    )
                )
            for c, call, t, src, exposed in clines or ():
                self.comm_lines.append(
                    CommLine(
                        stage=stage,
                        phase=phase,
                        role=c.role,
                        call=call,
                        count=c.count * repeat * m,
                        time_s=t,
                        exposed_s=exposed * repeat * m,
                        source=src,
                    )
                )
        return out

    def collective(self, stage: int, phase: str, role: str, call: Collective, count: float, exposed_s: float) -> None:
        if self.keep and call.group.size > 1:
            t, src = self.comms.time_s(call, self.device)
            self.comm_lines.append(
                CommLine(
                    stage=stage,
                    phase=phase,
                    role=role,
                    call=call,
                    count=count,
                    time_s=t,
                    exposed_s=exposed_s,
                    source=src,
                )
            )

    def p2p_s(self, stage: int, compute: StageCompute | StageTime, record: bool = True) -> float:
        """Exposed seconds of pipeline sends of one micro-batch on ``stage`` (:func:`pipeline_sends`),
        ``compute`` the stage's (the chunks a send hides behind with ``overlap_p2p_comm``)."""
        plan = self.plan
        lay, cfg = plan.layout, plan.layout.cfg
        act = p2p_message_bytes(
            plan.arch, micro_batch=cfg.micro_batch, seq=cfg.seq, cp=cfg.cp, tp=cfg.tp, precision=cfg.precision
        )
        sends = pipeline_sends(
            stage=stage,
            pp=cfg.pp,
            virtual_stages=cfg.virtual_stages,
            message_bytes=act,
            stride=cfg.tp * cfg.cp * lay.dp,
            gpus_per_node=lay.cluster.gpus_per_node,
        )
        windows = p2p_overlap_windows(compute, cfg.virtual_stages) if cfg.overlap_p2p_comm else None
        if record:
            for i, (call, n) in enumerate(sends):
                if n:
                    t = self.comms.time_s(call, self.device)[0]
                    exposed = n * send_exposed_s(t, None if windows is None else windows[i])
                    self.collective(stage, "pipeline", "pp", call, n * lay.micro_batches, exposed * lay.micro_batches)
        return pipeline_send_s(self.comms, self.device, sends, windows)

    def stage(self, stage: int) -> StageTime:
        plan = self.plan
        arch, lay, cfg = plan.arch, plan.layout, plan.layout.cfg
        m = lay.micro_batches
        block, extras = _graphs(plan, stage)
        own = lay.layers(stage)
        layers = arch.n_layers // cfg.pp if own is None else own
        groups = graph_groups(lay.tp_group, lay.cp_group, lay.ep_group)
        block_costs = self.graph_costs(block, groups, stage, layers)
        if cfg.overlap_moe_ep_comm and cfg.ep > 1:
            paired = combined_1f1b_paired(micro_batches=m, pp=cfg.pp, virtual_stages=cfg.virtual_stages)
            exposed = moe_a2a_exposed(block, block_costs, self.table, paired=paired)
            block_costs = {
                ph: c._replace(comm_s=(c.comm_s[0], c.comm_s[1], exposed[ph])) if ph in exposed else c
                for ph, c in block_costs.items()
            }
        compute = stage_compute(((block_costs, layers), (self.graph_costs(extras, groups, stage, 1), 1)))
        grad_b = dtype_bytes(lay.act_dtype)
        per_layer, rest = _fsdp_kernels(plan, stage)
        if per_layer or rest:  # torch FSDP's flat-gradient kernels run in each micro-batch's backward
            compute = compute._replace(
                backward_s=compute.backward_s + fsdp_gradient_s(per_layer, rest, self.table, layers)
            )
            for nodes, copies in ((per_layer, layers), (rest, 1)):
                for n in nodes if self.keep else ():
                    t, src = self.table[n.kernel]
                    self.ops.append(
                        OpLine(
                            stage=stage, phase=BWD, role=n.role, kernel=n.kernel, count=copies * m, time_s=t, source=src
                        )
                    )
        pp_s = self.p2p_s(stage, compute)
        sync = data_parallel_sync(
            arch,
            self.device,
            self.comms,
            stage=stage,
            tp=cfg.tp,
            pp=cfg.pp,
            cp=cfg.cp,
            ep=cfg.ep,
            dp=lay.dp,
            zero=cfg.zero,
            gpus_per_node=lay.cluster.gpus_per_node,
            grad_bytes=grad_b,
            reduce_bytes=gradient_reduce_bytes(grad_b, cfg.framework, cfg.grad_reduce_in_fp32),
            bucket_params=cfg.bucket_params,
            layers=own,
            framework=cfg.framework,
            fp8=delayed_amax_reduction(_precision(plan)),
            fold=folded(cfg),
        )
        dp = data_parallel_time(
            sync,
            compute,
            layers=layers,
            micro_batches=m,
            recompute=cfg.recompute,
            overlap_grad_reduce=cfg.overlap_grad_reduce,
            overlap_param_gather=cfg.overlap_param_gather,
        )
        if sync.zero3 is not None:
            ag, _, rs, _ = sync.zero3
            self.collective(stage, "zero3", "dp", ag, zero3_gathers(cfg.recompute) * layers * m, 0.0)
            self.collective(stage, "zero3", "dp", rs, layers * m, 0.0)
        else:
            bucketed = sync.reduce_total_s + sync.gather_total_s
            if bucketed and self.keep and sync.reduce is not None:
                self.comm_lines.append(
                    CommLine(
                        stage=stage,
                        phase="dp",
                        role="dp",
                        call=sync.reduce,
                        count=1,
                        time_s=bucketed,
                        exposed_s=dp.gradients_exposed_s,
                        source=self.comms.time_s(sync.reduce, self.device)[1] + " (bucketed)",
                    )
                )
        if sync.tied is not None:
            self.collective(stage, "dp", "tied_embedding", sync.tied, 1, 0.0)
        amax = fp8_amax_s(sync, cfg.virtual_stages)
        if sync.amax is not None:
            n = cfg.virtual_stages * m
            fwd_call, fwd_s, bwd_call, bwd_s = sync.amax
            self.collective(stage, FWD, "fp8_amax", fwd_call, n, n * fwd_s)
            self.collective(stage, BWD, "fp8_amax", bwd_call, n, n * bwd_s)
        opt_kernel = _optimizer_kernel(plan, stage)
        opt_s, opt_src = self.table[opt_kernel]
        if plan.layout.cfg.optimizer == "none":  # a forward + backward without a step (NeuSight's measured runs)
            opt_s = 0.0
        elif self.keep:
            self.ops.append(
                OpLine(
                    stage=stage,
                    phase="optimizer",
                    role="adam",
                    kernel=opt_kernel,
                    count=1,
                    time_s=opt_s,
                    source=opt_src,
                )
            )
        casts = _weight_casts(plan)
        for n in casts if self.keep else ():
            t, src = self.table[n.kernel]
            self.ops.append(
                OpLine(
                    stage=stage,
                    phase="optimizer",
                    role=n.role,
                    kernel=n.kernel,
                    count=n.count * layers,
                    time_s=t,
                    source=src,
                )
            )
        opt_s += weight_cast_s(casts, self.table, layers)
        offload = offload_time(arch, self.device, cfg, block_costs, layers=layers) if cfg.offload_activations else None
        return stage_time(
            stage, compute, dp, pp_comm_s=pp_s, optimizer_s=opt_s, amax_s=amax, offload_s=offload or (0.0, 0.0)
        )


def _precision(plan: TrainPlan) -> Dtypes:
    """The dtypes of ``plan``'s kernels: its precision, framework and, in per-tensor fp8, its scaling recipe and
    whether its GPU's fp8 GEMMs need fp8 transposes (:func:`~opcast.predict.graph.precision_of`)."""
    cfg = plan.layout.cfg
    return precision_of(
        cfg.precision,
        cfg.tensor_cores,
        cfg.framework,
        fp8_recipe=cfg.fp8_recipe,
        device=plan.device,
        training=True,
        rope_fusion=cfg.rope_fusion,
        swiglu_fusion=cfg.swiglu_fusion,
    )


def _graphs(plan: TrainPlan, stage: int) -> tuple[Graph, Graph]:
    """The block graph and the model-level graph of ``stage`` (both cached)."""
    arch, cfg = plan.arch, plan.layout.cfg
    prec = _precision(plan)
    block = train_block(
        arch,
        tp=cfg.tp,
        batch=cfg.micro_batch,
        seq=cfg.seq,
        sp=cfg.sp,
        cp=cfg.cp,
        ep=cfg.ep,
        attention=cfg.attention,
        recompute=cfg.recompute,
        prec=prec,
        whole_experts=folded(cfg),
    )
    extras = train_extras(
        arch,
        tp=cfg.tp,
        batch=cfg.micro_batch,
        seq=cfg.seq,
        sp=cfg.sp,
        cp=cfg.cp,
        first=stage == 0,
        last=stage == cfg.pp - 1,
        prec=prec,
    )
    return block, extras


def _overlap_cfgs(plan: TrainPlan) -> dict[str, UbGemm] | None:
    """The per-GEMM userbuffers settings of ``--tp-comm-overlap-cfg`` (None: TE's defaults)."""
    text = plan.layout.cfg.tp_comm_overlap_cfg
    return None if text is None else parse_configs(text)


def _weight_casts(plan: TrainPlan) -> tuple[Node, ...]:
    """One block's once-per-iteration fp8 weight quantisation kernels (cached)."""
    cfg = plan.layout.cfg
    return weight_casts(plan.arch, tp=cfg.tp, ep=cfg.ep, prec=_precision(plan), whole_experts=folded(cfg))


def fsdp_stage_kernels(
    arch: ArchSpec,
    *,
    tp: int,
    pp: int,
    ep: int,
    dp: int,
    stage: int,
    grad_bytes: int,
    framework: str | None,
    layers: int | None = None,
    whole_experts: bool = False,
) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(per block, rest of the stage) torch FSDP flat-gradient kernels (:func:`fsdp_gradient_kernels`) of a ZeRO-3
    ``stage`` of ``layers`` blocks (None: ``n_layers / pp``): one set over a block's parameters, one over the rest of
    the stage's (the root unit), in ``framework``'s reduce dtype."""
    params = stage_params(arch, tp=tp, pp=pp, ep=ep, stage=stage, layers=layers, whole_experts=whole_experts)
    blocks = arch.n_layers // pp if layers is None else layers
    red_b = zero3_reduce_bytes(framework, grad_bytes)
    rest = params.dense + params.expert - blocks * params.per_layer
    return (
        fsdp_gradient_kernels(params.per_layer, grad_bytes=grad_bytes, reduce_bytes=red_b, dp=dp),
        fsdp_gradient_kernels(rest, grad_bytes=grad_bytes, reduce_bytes=red_b, dp=dp),
    )


def _fsdp_kernels(plan: TrainPlan, stage: int) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(per block, rest of the stage) FSDP flat-gradient kernels of ``stage`` under ZeRO-3 when the
    framework's ZeRO-3 is torch FSDP (:attr:`~opcast.predict.frameworks.Framework.zero3_fsdp_kernels`); else empty."""
    lay, cfg = plan.layout, plan.layout.cfg
    if cfg.zero != 3 or not framework_of(cfg.framework).zero3_fsdp_kernels:
        return (), ()
    return fsdp_stage_kernels(
        plan.arch,
        tp=cfg.tp,
        pp=cfg.pp,
        ep=cfg.ep,
        dp=lay.dp,
        stage=stage,
        grad_bytes=dtype_bytes(lay.act_dtype),
        framework=cfg.framework,
        layers=lay.layers(stage),
        whole_experts=folded(cfg),
    )


def _optimizer_kernel(plan: TrainPlan, stage: int) -> Kernel:
    lay, cfg = plan.layout, plan.layout.cfg
    return optimizer_kernel(
        optimizer_numel(
            plan.arch,
            stage=stage,
            tp=cfg.tp,
            pp=cfg.pp,
            dp=lay.dp,
            cp=cfg.cp,
            ep=cfg.ep,
            zero=cfg.zero,
            layers=lay.layers(stage),
            fold=folded(cfg),
        )
    )


def run_train(
    plan: TrainPlan,
    kernels: KernelCostModel,
    comms: CollectiveCostModel | None = None,
    *,
    details: bool = True,
    coverage: float = DEFAULT_COVERAGE,
    interval_mode: IntervalMode = "group",
) -> TrainResult:
    """Price a compiled plan. ``details=False`` skips the per-op and per-collective lines and the
    prediction interval (search); ``coverage`` and ``interval_mode`` shape the interval."""
    if comms is None:
        from opcast.predict.comm_learned import collective_cost_for

        comms = collective_cost_for(kernels)  # the model set's learned collectives where it has the cluster
    lay, cfg, arch, device = plan.layout, plan.layout.cfg, plan.arch, plan.device
    pr = _Pricer(plan, kernels, comms, keep_lines=details)
    # Every unique kernel of the iteration in one lookup: one batched call per learned model.
    wanted = [_optimizer_kernel(plan, s) for s in plan.stage_kinds] + [n.kernel for n in _weight_casts(plan)]
    for s in plan.stage_kinds:
        wanted += [n.kernel for nodes in _fsdp_kernels(plan, s) for n in nodes]
        for graph in _graphs(plan, s):
            wanted += [n.kernel for nodes in graph.nodes.values() for n in nodes]
            if cfg.tp_comm_overlap:  # the chunk GEMMs TE's userbuffers overlap runs instead
                wanted += overlap_kernels(graph, cfg.tp, ub_configs(_overlap_cfgs(plan)))
    pr.table = kernels.lookup(wanted, device)
    slowed = 0
    if cfg.clocks == "sustained":  # a step holds the GPU at its power cap
        pr.table, slowed = sustained_times(pr.table, device, wanted)
    priced = {s: pr.stage(s) for s in plan.stage_kinds}
    pp = cfg.pp
    stages = tuple(
        priced[s]
        if s in priced
        else _replace(
            priced[stage_kind(s, pp)], stage=s, pp_comm_s=pr.p2p_s(s, priced[stage_kind(s, pp)], record=False)
        )
        for s in range(pp)
    )
    m = lay.micro_batches
    pipe, tail_stage, iteration = compose_iteration(
        [st.per_micro_batch_s for st in stages], [st.tail_s for st in stages], m, cfg.virtual_stages
    )
    crit = stages[pipe.critical_stage]
    tail = stages[tail_stage]
    breakdown = {
        "forward": m * crit.forward_s,
        "backward": m * crit.backward_s,
        "recompute": m * crit.recompute_s,
        "optimizer": tail.optimizer_s,
        "tp_comm": m * crit.tp_comm_s,
        "cp_comm": m * crit.cp_comm_s,
        "ep_comm": m * crit.ep_comm_s,
        "pp_comm": m * crit.pp_comm_s,
        "dp_comm_exposed": tail.dp_comm_s + m * crit.zero3_comm_s,
        "offload_exposed": m * crit.offload_s,
        "pipeline_bubble": pipe.bubble_s,
    }
    flops, rec_flops = model_flops(
        arch,
        seq=cfg.seq,
        global_batch=cfg.global_batch,
        precision=cfg.precision,
        attention=cfg.attention,
        recompute=cfg.recompute,
        tensor_cores=cfg.tensor_cores,
    )
    peak = dense_peak_flops(device, cfg.precision, cfg.tensor_cores)
    world = lay.world_size
    memory = _train_memory(arch, lay)
    ops = tuple(pr.ops)
    sources = _cost_sources(kernels, comms, ops, pr.comm_lines)
    if slowed:
        sources["notes"] = [*sources.get("notes", []), sustained_note(device, slowed)]
    interval = _interval(plan, kernels, ops, pipe, crit, tail, iteration, coverage, interval_mode) if details else None
    result = TrainResult(
        arch=arch,
        device=device,
        config=cfg,
        feasible=True,
        layout=lay,
        iteration_time_s=iteration,
        tokens_per_s=tokens_per_s(cfg.global_batch, cfg.seq, iteration),
        mfu=flops_utilisation(flops, iteration, world, peak),
        hfu=flops_utilisation(flops + rec_flops, iteration, world, peak),
        model_flops=flops,
        breakdown_s=breakdown,
        stages=stages,
        memory=memory,
        ops=ops,
        comms=tuple(pr.comm_lines),
        cost_sources=sources,
        interval=interval,
    )
    reason = overflow_reason(result.worst_memory, device, _MEMORY_FIX)
    if reason:
        result = _replace(result, feasible=False, reasons=(reason,))
    return result


_MEMORY_FIX = "try a higher --zero, --recompute, more tp/pp or a smaller --micro-batch"


def _train_memory(arch: ArchSpec, lay: Layout) -> tuple[Memory, ...]:
    """Memory per GPU of every pipeline stage of a laid-out configuration."""
    cfg = lay.cfg
    return tuple(
        train_memory(
            arch,
            stage=s,
            tp=cfg.tp,
            pp=cfg.pp,
            dp=lay.dp,
            cp=cfg.cp,
            ep=cfg.ep,
            sp=cfg.sp,
            micro_batch=cfg.micro_batch,
            seq=cfg.seq,
            micro_batches=lay.micro_batches,
            virtual_stages=cfg.virtual_stages,
            zero=cfg.zero,
            precision=cfg.precision,
            attention=cfg.attention,
            recompute=cfg.recompute,
            layers=lay.layers(s),
            framework=cfg.framework,
            optimizer=cfg.optimizer,
            offload_layers=cfg.offload_activations,
            grad_reduce_in_fp32=cfg.grad_reduce_in_fp32,
            fold=folded(cfg),
        )
        for s in range(cfg.pp)
    )


def _interval(
    plan: TrainPlan,
    kernels: KernelCostModel,
    ops: tuple[OpLine, ...],
    pipe: Any,
    crit: StageTime,
    tail: StageTime,
    iteration_s: float,
    coverage: float,
    mode: IntervalMode,
) -> Interval | None:
    """The iteration's prediction interval: each learned predictor's seconds on the critical
    path (the critical stage's ops scaled by its share of the pipeline time, the optimizer of the
    slowest tail) with its held-out residuals (:func:`opcast.predict.intervals.propagate`)."""
    m = plan.layout.micro_batches
    crit_kind = pipe.critical_stage if pipe.critical_stage in plan.stage_kinds else 1
    tail_kind = tail.stage if tail.stage in plan.stage_kinds else 1
    scale = pipe.time_s / (m * crit.per_micro_batch_s) if crit.per_micro_batch_s > 0 else 0.0
    contributions: dict[str, float] = {}
    residuals: dict[str, Residuals] = {}
    for o in ops:
        on_path = o.stage == tail_kind if o.phase == "optimizer" else o.stage == crit_kind
        res = kernels.residuals(o.kernel, plan.device) if on_path else None
        if res is not None:
            residuals[res.group] = res
            weight = 1.0 if o.phase == "optimizer" else scale
            contributions[res.group] = contributions.get(res.group, 0.0) + weight * o.count * o.time_s
    return propagate(iteration_s, contributions, residuals, coverage=coverage, mode=mode) if residuals else None


def _replace(obj: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(obj, **changes)


def _cost_sources(
    kernels: KernelCostModel, comms: CollectiveCostModel, ops: tuple[OpLine, ...], comm_lines: list[CommLine]
) -> dict[str, Any]:
    by_source: dict[str, int] = {}
    for _k, src in {(o.kernel, o.source) for o in ops}:
        by_source[src] = by_source.get(src, 0) + 1
    coll: dict[str, int] = {}
    for c in comm_lines:
        coll[c.source] = coll.get(c.source, 0) + 1
    return {
        **kernels.describe(),
        "unique_kernels_by_source": dict(sorted(by_source.items())),
        **comms.describe(),
        "collectives_by_source": dict(sorted(coll.items())),
    }


def predict_train(
    arch: ArchSpec,
    device: DeviceSpec,
    cfg: TrainConfig,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    kernels: KernelCostModel | None = None,
    comms: CollectiveCostModel | None = None,
    details: bool = True,
    coverage: float = DEFAULT_COVERAGE,
    interval_mode: IntervalMode = "group",
) -> TrainResult:
    """Compile and run one training configuration (roofline-only kernels unless given a model)."""
    from opcast.predict.cost import roofline_only

    plan = compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node)
    if isinstance(plan, TrainResult):
        return plan
    return run_train(
        plan,
        kernels or roofline_only("no kernel models given: roofline fallback"),
        comms,
        details=details,
        coverage=coverage,
        interval_mode=interval_mode,
    )


def iteration_sum_check(result: TrainResult) -> float:
    """Sum of the breakdown (equals ``iteration_time_s`` by construction)."""
    return math.fsum(result.breakdown_s.values())
