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
per micro-batch, prefetched behind the layer's compute. MoE expert gradients are reduced over
dp x cp / ep ranks. A tied embedding split across pipeline stages all-reduces its gradient between
the first and last stage.

MFU (Chowdhery et al. 2022, arXiv 2204.02311, App. B: model FLOPs exclude recomputation) uses the
exact FLOPs of the unsharded op graph, forward and backward, for the global batch, over
``iteration time x world size x dense peak``; HFU adds the recomputation. The op graph counts
causal attention as the computed triangle (FlashAttention) and pointwise work, so it is a little
below ``6 N D``-style counts (Narayanan et al. 2021 Eq. 3 counts full attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, get_args

from opcast.archs import ArchSpec, padded_vocab
from opcast.dtypes import dtype_bytes
from opcast.hardware import DeviceSpec
from opcast.predict.comm import Collective, CollectiveCostModel, Group, place
from opcast.predict.cost import Kernel, KernelCostModel, kernel
from opcast.predict.graph import BWD, FWD, RECOMPUTE, Graph, graph_flops, precision_of, train_block, train_extras
from opcast.predict.intervals import DEFAULT_COVERAGE, Interval, IntervalMode, Residuals, propagate
from opcast.predict.memory import Memory, overflow_reason, stage_params, train_memory
from opcast.predict.parallel import MEGATRON_MIN_BUCKET_PARAMS, Layout, Precision, TrainConfig, _device_reasons, validate_train
from opcast.predict.schedule import pipeline_time

BREAKDOWN_KEYS = ("forward", "backward", "recompute", "optimizer", "tp_comm", "cp_comm", "ep_comm", "pp_comm",
                  "dp_comm_exposed", "pipeline_bubble")


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
    """Exposed ZeRO-3 gathers / reduce-scatters per micro-batch."""
    optimizer_s: float
    """Once per iteration."""
    dp_comm_s: float
    """Exposed gradient / weight synchronisation after the last micro-batch, once per iteration."""
    dp_comm_total_s: float
    """All of it, hidden or not."""
    forward_comm_s: float = 0.0
    """The exposed TP/CP/EP/ZeRO-3 communication of the forward phase (part of the fields above; for traces)."""

    @property
    def per_micro_batch_s(self) -> float:
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s
                + self.ep_comm_s + self.pp_comm_s + self.zero3_comm_s)

    @property
    def tail_s(self) -> float:
        return self.optimizer_s + self.dp_comm_s


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

def compile_train(arch: ArchSpec, device: DeviceSpec, cfg: TrainConfig, *, nodes: int | None = None,
                  gpus_per_node: int | None = None) -> TrainPlan | TrainResult:
    """Validate and lay out ``cfg``; an infeasible configuration comes back as a result with every
    reason at once: a device that cannot run the precision still has its layout checked and, when
    that holds, its memory sized."""
    layout, reasons = validate_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node, check_device=False)
    device_reasons = _device_reasons(device, cfg.precision)
    if device_reasons and layout is not None and cfg.precision in get_args(Precision):
        reasons = [r for r in (overflow_reason(max(_train_memory(arch, layout), key=lambda m: m.total_bytes), device,
                                               _MEMORY_FIX),) if r]
    if device_reasons or layout is None:
        return TrainResult(arch=arch, device=device, config=cfg, feasible=False, reasons=(*device_reasons, *reasons))
    pp = cfg.pp
    kinds = (0,) if pp == 1 else (0, pp - 1) if pp == 2 else (0, 1, pp - 1)
    return TrainPlan(arch=arch, device=device, layout=layout, stage_kinds=kinds)


def _exposed(comm_s: float, role: str | None, role_times: dict[str, float]) -> float:
    if role is None:
        return comm_s
    return max(0.0, comm_s - role_times.get(role, 0.0))


class _Pricer:
    """Prices graphs with the kernel and collective models, remembering lines for the report."""

    def __init__(self, plan: TrainPlan, kernels: KernelCostModel, comms: CollectiveCostModel, keep_lines: bool) -> None:
        self.plan, self.kernels, self.comms, self.keep = plan, kernels, comms, keep_lines
        self.device = plan.device
        self.ops: list[OpLine] = []
        self.comm_lines: list[CommLine] = []

    def kernels_s(self, graph: Graph, phase: str, stage: int, repeat: float, per_iter: float) -> tuple[float, dict[str, float]]:
        nodes = graph.nodes[phase]
        if not nodes:
            return 0.0, {}
        table = self.kernels.lookup([n.kernel for n in nodes], self.device)
        total, by_role = 0.0, {}
        for n in nodes:
            t, src = table[n.kernel]
            total += n.count * t
            by_role[n.role] = by_role.get(n.role, 0.0) + n.count * t
            if self.keep:
                self.ops.append(OpLine(stage=stage, phase=phase, role=n.role, kernel=n.kernel,
                                       count=n.count * repeat * per_iter, time_s=t, source=src))
        return total, by_role

    def comms_s(self, graph: Graph, phase: str, groups: dict[str, Group], role_times: dict[str, float], stage: int,
                repeat: float, per_iter: float) -> dict[str, float]:
        """Exposed seconds per comm family (tp, cp, ep) of one copy of ``graph`` in ``phase``."""
        out = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
        for c in graph.comms[phase]:
            call = Collective(c.kind, c.bytes, groups[c.role])
            t, src = self.comms.time_s(call, self.device)
            exposed = _exposed(c.count * t, c.overlap_with, role_times)
            family = c.role.split("_")[0] if c.role.split("_")[0] in out else "tp"
            out[family] += exposed
            if self.keep:
                self.comm_lines.append(CommLine(stage=stage, phase=phase, role=c.role, call=call,
                                                count=c.count * repeat * per_iter, time_s=t,
                                                exposed_s=exposed * repeat * per_iter, source=src))
        return out

    def collective(self, stage: int, phase: str, role: str, call: Collective, count: float, exposed_s: float) -> float:
        t, src = self.comms.time_s(call, self.device)
        if self.keep and call.group.size > 1:
            self.comm_lines.append(CommLine(stage=stage, phase=phase, role=role, call=call, count=count, time_s=t,
                                            exposed_s=exposed_s, source=src))
        return t


def _bucketed_s(pricer: _Pricer, kind: str, params: int, bytes_per_param: int, group: Group, bucket_params: int) -> tuple[float, float]:
    """(total, last bucket) seconds of a bucketed collective over ``params`` parameters."""
    if group.size <= 1 or params <= 0:
        return 0.0, 0.0
    full, rest = divmod(params, bucket_params)
    t_full = pricer.comms.time_s(Collective(kind, bucket_params * bytes_per_param, group), pricer.device)[0] if full else 0.0
    t_rest = pricer.comms.time_s(Collective(kind, rest * bytes_per_param, group), pricer.device)[0] if rest else 0.0
    return full * t_full + t_rest, (t_rest if rest else t_full)


def _stage_time(pr: _Pricer, stage: int) -> StageTime:
    plan = pr.plan
    arch, lay, cfg = plan.arch, plan.layout, plan.layout.cfg
    tp, pp, cp, ep, m = cfg.tp, cfg.pp, cfg.cp, cfg.ep, lay.micro_batches
    prec = precision_of(cfg.precision, cfg.tensor_cores)
    block, extras = _graphs(plan, stage)
    layers = arch.n_layers // pp
    groups = {"tp": lay.tp_group, "embed_tp": lay.tp_group, "head_tp": lay.tp_group, "ce_tp": lay.tp_group,
              "cp": lay.cp_group, "ep": lay.ep_group}
    phase_s = {FWD: 0.0, BWD: 0.0, RECOMPUTE: 0.0}
    comm_s = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    fwd_comm = 0.0
    for graph, repeat in ((block, layers), (extras, 1)):
        for phase in (FWD, BWD, RECOMPUTE):
            t, roles = pr.kernels_s(graph, phase, stage, repeat, m)
            phase_s[phase] += repeat * t
            for fam, s in pr.comms_s(graph, phase, groups, roles, stage, repeat, m).items():
                comm_s[fam] += repeat * s
                fwd_comm += repeat * s if phase == FWD else 0.0

    pp_s = _p2p_s(pr, stage)

    # Parameters, optimizer, data-parallel synchronisation.
    params = stage_params(arch, tp=tp, pp=pp, ep=ep, stage=stage)
    grad_b = dtype_bytes(prec.act)
    zero3_s = 0.0
    dp_exposed = dp_total = 0.0
    if cfg.zero == 3 and lay.dp_group.size > 1:
        # Per micro-batch: gather weights for forward (and recompute) and backward, reduce-scatter grads,
        # each layer's behind its compute (prefetch).
        gathers = 3 if cfg.recompute == "full" else 2
        per_layer_full = params.per_layer
        ag = pr.collective(stage, "zero3", "dp", Collective("all_gather", per_layer_full * grad_b, lay.dp_group),
                           gathers * layers * m, 0.0)
        rs = pr.collective(stage, "zero3", "dp", Collective("reduce_scatter", per_layer_full * grad_b, lay.dp_group),
                           layers * m, 0.0)
        fwd_layer = phase_s[FWD] / layers
        bwd_layer = (phase_s[BWD] + phase_s[RECOMPUTE]) / layers
        zero3_fwd = layers * max(0.0, ag - fwd_layer)
        zero3_s = zero3_fwd + layers * max(0.0, (gathers - 1) * ag + rs - bwd_layer)
        fwd_comm += zero3_fwd
        dp_total = m * layers * (gathers * ag + rs)
    else:
        bucket = cfg.bucket_params or max(MEGATRON_MIN_BUCKET_PARAMS, 1_000_000 * lay.dp)
        reduce_kind = "all_reduce" if cfg.zero == 0 else "reduce_scatter"
        tot_d, last_d = _bucketed_s(pr, reduce_kind, params.dense, grad_b, lay.dp_group, bucket)
        tot_e, last_e = _bucketed_s(pr, reduce_kind, params.expert, grad_b, lay.expert_dp_group, bucket)
        reduce_total, last = tot_d + tot_e, max(last_d, last_e)
        window = phase_s[BWD] + phase_s[RECOMPUTE]  # the last micro-batch's backward on this stage
        reduce_exposed = max(last, reduce_total - window) if cfg.overlap_grad_reduce else reduce_total
        gather_total = 0.0
        if cfg.zero in (1, 2):
            g_d = _bucketed_s(pr, "all_gather", params.dense, grad_b, lay.dp_group, bucket)[0]
            g_e = _bucketed_s(pr, "all_gather", params.expert, grad_b, lay.expert_dp_group, bucket)[0]
            gather_total = g_d + g_e
        dp_total = reduce_total + gather_total
        dp_exposed = min(dp_total, reduce_exposed + gather_total)
        if dp_total and pr.keep:
            call = Collective(reduce_kind, params.total * grad_b, lay.dp_group)
            pr.comm_lines.append(CommLine(stage=stage, phase="dp", role="dp", call=call, count=1, time_s=dp_total,
                                          exposed_s=dp_exposed, source=pr.comms.time_s(call, pr.device)[1] + " (bucketed)"))
    if arch.tied_embeddings and pp > 1 and stage in (0, pp - 1):
        tied = Collective("all_reduce", padded_vocab(arch.vocab, tp) // tp * arch.hidden * grad_b,
                          place(2, (pp - 1) * tp * cp * lay.dp, lay.cluster.gpus_per_node))
        t = pr.collective(stage, "dp", "tied_embedding", tied, 1, 0.0)
        dp_total += t
        dp_exposed += t

    opt_kernel = _optimizer_kernel(plan, stage)
    opt_s, opt_src = pr.kernels.time_s(opt_kernel, pr.device)
    if pr.keep:
        pr.ops.append(OpLine(stage=stage, phase="optimizer", role="adam", kernel=opt_kernel, count=1, time_s=opt_s, source=opt_src))
    return StageTime(stage=stage, forward_s=phase_s[FWD], backward_s=phase_s[BWD], recompute_s=phase_s[RECOMPUTE],
                     tp_comm_s=comm_s["tp"], cp_comm_s=comm_s["cp"], ep_comm_s=comm_s["ep"], pp_comm_s=pp_s,
                     zero3_comm_s=zero3_s, optimizer_s=opt_s, dp_comm_s=dp_exposed, dp_comm_total_s=dp_total,
                     forward_comm_s=fwd_comm)


def _p2p_s(pr: _Pricer, stage: int, record: bool = True) -> float:
    """Seconds of pipeline sends of one micro-batch on ``stage``: each of its v chunks sends its
    output forward and its input gradient backward, except the very last chunk's forward and the
    very first chunk's backward; interleaving wraps from the last stage to the first. With
    Megatron's scatter/gather optimisation (or SP) each message is 1/tp of the activation; a
    boundary between ranks on different nodes goes over the NIC."""
    plan = pr.plan
    lay, cfg = plan.layout, plan.layout.cfg
    pp, v = cfg.pp, cfg.virtual_stages
    if pp == 1:
        return 0.0
    act = cfg.micro_batch * (cfg.seq // cfg.cp) * plan.arch.hidden * dtype_bytes(precision_of(cfg.precision).act) // cfg.tp
    stride, g = cfg.tp * cfg.cp * lay.dp, lay.cluster.gpus_per_node
    total = 0.0
    for target, sends in (((stage + 1) % pp, v - (stage == pp - 1)), ((stage - 1) % pp, v - (stage == 0))):
        if sends <= 0:
            continue
        same_node = (stage * stride) // g == (target * stride) // g
        call = Collective("send_recv", act, Group(2, 1, 2) if same_node else Group(2, 2, 1))
        t = pr.comms.time_s(call, pr.device)[0]
        total += sends * t
        if record:
            pr.collective(stage, "pipeline", "pp", call, sends * lay.micro_batches, sends * t * lay.micro_batches)
    return total


def _graphs(plan: TrainPlan, stage: int) -> tuple[Graph, Graph]:
    """The block graph and the model-level graph of ``stage`` (both cached)."""
    arch, cfg = plan.arch, plan.layout.cfg
    prec = precision_of(cfg.precision, cfg.tensor_cores)
    block = train_block(arch, tp=cfg.tp, batch=cfg.micro_batch, seq=cfg.seq, sp=cfg.sp, cp=cfg.cp, ep=cfg.ep,
                        attention=cfg.attention, recompute=cfg.recompute, prec=prec)
    extras = train_extras(arch, tp=cfg.tp, batch=cfg.micro_batch, seq=cfg.seq, sp=cfg.sp, cp=cfg.cp,
                          first=stage == 0, last=stage == cfg.pp - 1, prec=prec)
    return block, extras


def _optimizer_kernel(plan: TrainPlan, stage: int) -> Kernel:
    """One fused Adam step over the parameters this rank updates (its ZeRO shard)."""
    lay, cfg = plan.layout, plan.layout.cfg
    params = stage_params(plan.arch, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep, stage=stage)
    n_d = lay.dp * cfg.cp
    numel = params.dense / (n_d if cfg.zero >= 1 else 1) + params.expert / (max(1, n_d // cfg.ep) if cfg.zero >= 1 else 1)
    return kernel("optimizer", {"numel": max(1, int(round(numel)))}, "fp32", "fwd", False)


def _model_flops(arch: ArchSpec, cfg: TrainConfig) -> tuple[float, float]:
    """(model FLOPs, recompute FLOPs) of one iteration on all GPUs, from the unsharded graph."""
    prec = precision_of(cfg.precision, cfg.tensor_cores)
    block = train_block(arch, tp=1, batch=1, seq=cfg.seq, sp=False, cp=1, ep=1, attention=cfg.attention,
                        recompute=cfg.recompute, prec=prec)
    extras = train_extras(arch, tp=1, batch=1, seq=cfg.seq, sp=False, cp=1, first=True, last=True, prec=prec)
    per_seq = arch.n_layers * graph_flops(block) + graph_flops(extras)
    rec = arch.n_layers * graph_flops(block, (RECOMPUTE,))
    return per_seq * cfg.global_batch, rec * cfg.global_batch


def run_train(plan: TrainPlan, kernels: KernelCostModel, comms: CollectiveCostModel | None = None, *,
              details: bool = True, coverage: float = DEFAULT_COVERAGE, interval_mode: IntervalMode = "group") -> TrainResult:
    """Price a compiled plan. ``details=False`` skips the per-op and per-collective lines and the
    prediction interval (search); ``coverage`` and ``interval_mode`` shape the interval."""
    comms = comms or CollectiveCostModel()
    lay, cfg, arch, device = plan.layout, plan.layout.cfg, plan.arch, plan.device
    pr = _Pricer(plan, kernels, comms, keep_lines=details)
    # Every unique kernel of the iteration in one lookup: one batched call per learned model.
    wanted = [_optimizer_kernel(plan, s) for s in plan.stage_kinds]
    for s in plan.stage_kinds:
        for graph in _graphs(plan, s):
            wanted += [n.kernel for nodes in graph.nodes.values() for n in nodes]
    kernels.lookup(wanted, device)
    priced = {s: _stage_time(pr, s) for s in plan.stage_kinds}
    pp = cfg.pp
    stages = tuple(priced.get(s) or _replace(priced[1], stage=s, pp_comm_s=_p2p_s(pr, s, record=False)) for s in range(pp))
    pipe = pipeline_time([st.per_micro_batch_s for st in stages], lay.micro_batches, cfg.virtual_stages)
    crit = stages[pipe.critical_stage]
    tail = max(stages, key=lambda st: st.tail_s)
    m = lay.micro_batches
    breakdown = {
        "forward": m * crit.forward_s, "backward": m * crit.backward_s, "recompute": m * crit.recompute_s,
        "optimizer": tail.optimizer_s, "tp_comm": m * crit.tp_comm_s, "cp_comm": m * crit.cp_comm_s,
        "ep_comm": m * crit.ep_comm_s, "pp_comm": m * crit.pp_comm_s,
        "dp_comm_exposed": tail.dp_comm_s + m * crit.zero3_comm_s, "pipeline_bubble": pipe.bubble_s,
    }
    iteration = pipe.time_s + tail.tail_s
    model_flops, rec_flops = _model_flops(arch, cfg)
    peak = device.peak_flops(cfg.precision, tensor_cores=precision_of(cfg.precision, cfg.tensor_cores).peak_tensor_cores())
    world = lay.world_size
    memory = _train_memory(arch, lay)
    ops = tuple(pr.ops)
    sources = _cost_sources(kernels, comms, ops, pr.comm_lines)
    interval = _interval(plan, kernels, ops, pipe, crit, tail, iteration, coverage, interval_mode) if details else None
    result = TrainResult(
        arch=arch, device=device, config=cfg, feasible=True, layout=lay, iteration_time_s=iteration,
        tokens_per_s=cfg.global_batch * cfg.seq / iteration, mfu=model_flops / (iteration * world * peak),
        hfu=(model_flops + rec_flops) / (iteration * world * peak), model_flops=model_flops,
        breakdown_s=breakdown, stages=stages, memory=memory, ops=ops, comms=tuple(pr.comm_lines), cost_sources=sources,
        interval=interval)
    reason = overflow_reason(result.worst_memory, device, _MEMORY_FIX)
    if reason:
        result = _replace(result, feasible=False, reasons=(reason,))
    return result


_MEMORY_FIX = "try a higher --zero, --recompute, more tp/pp or a smaller --micro-batch"


def _train_memory(arch: ArchSpec, lay: Layout) -> tuple[Memory, ...]:
    """Memory per GPU of every pipeline stage of a laid-out configuration."""
    cfg = lay.cfg
    return tuple(train_memory(arch, stage=s, tp=cfg.tp, pp=cfg.pp, dp=lay.dp, cp=cfg.cp, ep=cfg.ep, sp=cfg.sp,
                              micro_batch=cfg.micro_batch, seq=cfg.seq, micro_batches=lay.micro_batches,
                              virtual_stages=cfg.virtual_stages, zero=cfg.zero, precision=cfg.precision,
                              attention=cfg.attention, recompute=cfg.recompute) for s in range(cfg.pp))


def _interval(plan: TrainPlan, kernels: KernelCostModel, ops: tuple[OpLine, ...], pipe: Any, crit: StageTime,
              tail: StageTime, iteration_s: float, coverage: float, mode: IntervalMode) -> Interval | None:
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


def _cost_sources(kernels: KernelCostModel, comms: CollectiveCostModel, ops: tuple[OpLine, ...],
                  comm_lines: list[CommLine]) -> dict[str, Any]:
    by_source: dict[str, int] = {}
    for k, src in {(o.kernel, o.source) for o in ops}:
        by_source[src] = by_source.get(src, 0) + 1
    coll: dict[str, int] = {}
    for c in comm_lines:
        coll[c.source] = coll.get(c.source, 0) + 1
    return {**kernels.describe(), "unique_kernels_by_source": dict(sorted(by_source.items())),
            **comms.describe(), "collectives_by_source": dict(sorted(coll.items()))}


def predict_train(arch: ArchSpec, device: DeviceSpec, cfg: TrainConfig, *, nodes: int | None = None,
                  gpus_per_node: int | None = None, kernels: KernelCostModel | None = None,
                  comms: CollectiveCostModel | None = None, details: bool = True, coverage: float = DEFAULT_COVERAGE,
                  interval_mode: IntervalMode = "group") -> TrainResult:
    """Compile and run one training configuration (roofline-only kernels unless given a model)."""
    from opcast.predict.cost import roofline_only

    plan = compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node)
    if isinstance(plan, TrainResult):
        return plan
    return run_train(plan, kernels or roofline_only("no kernel models given: roofline fallback"), comms, details=details,
                     coverage=coverage, interval_mode=interval_mode)


def iteration_sum_check(result: TrainResult) -> float:
    """Sum of the breakdown (equals ``iteration_time_s`` by construction)."""
    return math.fsum(result.breakdown_s.values())
