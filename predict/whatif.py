"""Hardware what-if: hypothetical GPUs, scaling grids and side-by-side GPUs, and where the time goes.

The questions are a hardware planner's (Kundu et al. 2024, arXiv 2407.14645: the A100 -> B200
speed-up of LLM training and inference, technology-node and DRAM scaling, compute- vs
memory-bound GEMMs): what does 2x HBM bandwidth buy a 70B training run, how much faster is B200
than A100 on our workload, and why.

- A hypothetical GPU is a catalog (or JSON) spec with fields multiplied or set,
  :func:`opcast.hardware.derive_device` (the CLI's ``--set``), named ``BASE[field=xK,...]``.
- :func:`time_split` divides one prediction's headline time (a training iteration, or an
  inference batch's total latency) into seconds that are **compute-bound**, **memory-bound**,
  **communication** (exposed) and **pipeline bubble**, and by phase (compute by op kind, each
  communication family, the bubble). A kernel counts as compute- or memory-bound by the larger
  term of the achievable roofline (:func:`opcast.predict.cost.bottleneck`): on the analytical path
  that is exactly the spec its time scales with, so the split says what a faster spec can buy.
- :func:`explore` predicts every point of a grid of factors over spec fields (``--vary``) and
  reports the speed-up over the base GPU and the split at each point: where the bottleneck moves.
- :func:`compare` runs one workload on several GPUs and gives each phase's seconds and speed-up
  over the first.

Scaling rules (what "every spec x2" means): the roofline fallback has no constant terms and its
efficiency curves depend on op size only, so peaks x K and memory bandwidth x K divide every
roofline kernel time by exactly K. The collective model is ``latency + bytes / bandwidth``:
a link-bandwidth factor scales the bandwidth term only; NCCL's per-step latencies are software
and switch costs a faster link does not shorten, so small messages gain less than K. SMs, L2,
clock and FP32 lanes enter the learned models only; a peak of a precision a kernel does not run in
moves none of its times (the learned models answer such a GPU as its base for that kernel,
:func:`opcast.train.features.unread_peaks`); memory size decides only whether a configuration
fits; ``gpus_per_node`` changes the default cluster (and with it which groups stay
inside a node) unless ``--nodes/--gpus-per-node`` fix it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opcast.archs import ArchSpec
from opcast.errors import OpcastError
from opcast.hardware import PEAKS_GROUP, DeviceSpec, Setting, derive_device, parse_setting
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.comm_learned import NETWORK_FIELDS, collective_cost_for
from opcast.predict.cost import Kernel, KernelCostModel, LearnedKernelCost, bottleneck, roofline_only
from opcast.predict.inference import InferResult, predict_infer
from opcast.predict.parallel import InferConfig, TrainConfig
from opcast.predict.report import infer_kernel
from opcast.predict.training import TrainResult, compile_train, run_train

WorkloadKind = Literal["train", "infer"]

MAX_POINTS = 4096
"""Most full predictions one what-if makes: the largest grid :func:`explore` accepts (one per point) and the
most ``--gpus`` :func:`compare` takes (one per GPU)."""

LEARNED_ONLY_FIELDS = frozenset({"sm_count", "fp32_lanes_per_sm", "l2_bytes", "boost_clock_hz"})
"""Spec fields only the learned models read (tiles, waves, cache, clock); the roofline ignores them. ``sm_count``
also sets the share of the device that overlapped communication holds (Transformer Engine's userbuffers SMs,
NCCL's channels beside hidden data-parallel traffic), which moves the communication terms, not a kernel."""

COMM_PARTS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed", "offload_exposed")
"""Training breakdown keys that are (exposed) communication (the activation offload's host-link copies too)."""

SPLIT_PARTS = ("compute_bound", "memory_bound", "communication", "bubble")
"""The four parts of :class:`TimeSplit`, in report order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One training or inference configuration, independent of the GPU it runs on."""

    kind: WorkloadKind
    """``train`` (one iteration) or ``infer`` (one request batch: prefill + decode)."""
    arch: ArchSpec
    config: TrainConfig | InferConfig
    nodes: int | None = None
    """Nodes; None: as few of the GPU's typical nodes as the configuration needs."""
    gpus_per_node: int | None = None
    """GPUs per node; None: the GPU's ``gpus_per_node``."""

    def __post_init__(self) -> None:
        want = TrainConfig if self.kind == "train" else InferConfig if self.kind == "infer" else None
        if want is None:
            raise OpcastError(f"workload kind {self.kind!r} must be train or infer")
        if not isinstance(self.config, want):
            raise OpcastError(f"a {self.kind} workload needs a {want.__name__}, got {type(self.config).__name__}")

    @property
    def metric(self) -> str:
        """The headline time a speed-up is measured on."""
        return "iteration_time_s" if self.kind == "train" else "total_latency_s"


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeSplit:
    """Seconds of one prediction's headline time by what bounds them; the four parts sum to ``total_s``."""

    total_s: float
    compute_bound_s: float
    """Kernels whose achievable-roofline compute term is the larger."""
    memory_bound_s: float
    """Kernels whose memory term is the larger (every kernel without FLOPs)."""
    communication_s: float
    """Exposed collectives and pipeline sends."""
    bubble_s: float
    """Pipeline fill and drain (training)."""
    by_phase: dict[str, float] = field(default_factory=dict)
    """Training: ``compute:<op kind>`` and the communication and bubble parts, summing to the
    iteration. Inference: the same under ``prefill/`` (summing to TTFT) and ``decode_step/``
    (summing to TPOT)."""
    phase_parts: dict[str, dict[str, float]] = field(default_factory=dict)
    """Inference only: ``prefill`` (sums to TTFT) and ``decode_step`` (sums to TPOT), each split
    into the :data:`SPLIT_PARTS` seconds."""

    def share(self, part: str) -> float:
        """``part`` (one of :data:`SPLIT_PARTS`) as a fraction of the total."""
        return getattr(self, f"{part}_s") / self.total_s if self.total_s > 0 else math.nan


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """One workload on one device: the prediction and where its time goes."""

    device: DeviceSpec
    result: TrainResult | InferResult
    split: TimeSplit | None
    """None when the configuration cannot be laid out on this device (no times)."""
    out_of_range: int = 0
    """Distinct kernels timed by a learned model outside its fitted hardware (or replaced by the roofline for it)."""
    learned: int = 0
    """Distinct kernels timed by a learned model."""

    @property
    def time_s(self) -> float:
        return self.split.total_s if self.split is not None else math.nan

    @property
    def fits(self) -> bool:
        return bool(self.result.fits)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(self.result.reasons)


# --------------------------------------------------------------------------- one prediction


def predict(
    workload: Workload,
    device: DeviceSpec,
    kernels: KernelCostModel | None = None,
    comms: CollectiveCostModel | None = None,
) -> Outcome:
    """Predict ``workload`` on ``device`` with the per-op details :func:`time_split` needs."""
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    comms = comms or collective_cost_for(kernels)
    if workload.kind == "train":
        plan = compile_train(
            workload.arch,
            device,
            workload.config,
            nodes=workload.nodes,  # type: ignore[arg-type]
            gpus_per_node=workload.gpus_per_node,
        )
        result: TrainResult | InferResult = plan if isinstance(plan, TrainResult) else run_train(plan, kernels, comms)
        timed = result.layout is not None  # type: ignore[union-attr]
        used = [(o.kernel, o.source) for o in result.ops] if timed else []  # type: ignore[union-attr]
    else:
        result = predict_infer(
            workload.arch,
            device,
            workload.config,
            nodes=workload.nodes,  # type: ignore[arg-type]
            gpus_per_node=workload.gpus_per_node,
            kernels=kernels,
            comms=comms,
        )
        timed = result.memory is not None
        used = [(infer_kernel(result, ln), ln["source"]) for ln in result.ops] if timed else []
    split = time_split(result, kernels) if timed else None
    unique = dict(used)
    flagged = sum(1 for k in unique if kernels.range_flag(k, device))
    return Outcome(
        device=device,
        result=result,
        split=split,
        out_of_range=flagged,
        learned=sum(1 for s in unique.values() if s == "learned"),
    )


def _bound(k: Kernel, device: DeviceSpec, time_s: float, kernels: KernelCostModel) -> str:
    return bottleneck(k, device, time_s, kernels.roofline).bound


def time_split(result: TrainResult | InferResult, kernels: KernelCostModel | None = None) -> TimeSplit:
    """Where the headline time of a prediction made with per-op details goes (see :class:`TimeSplit`)."""
    kernels = kernels or roofline_only()
    if isinstance(result, TrainResult):
        return _train_split(result, kernels)
    return _infer_split(result, kernels)


def _attribute(
    lines: Sequence[tuple[Kernel, float]],
    total: float,
    device: DeviceSpec,
    kernels: KernelCostModel,
    prefix: str,
    parts: dict[str, float],
    by_phase: dict[str, float],
) -> None:
    """Spread ``total`` seconds over compute/memory-bound and op kinds in proportion to the
    lines' (kernel, seconds per iteration)."""
    weight = math.fsum(s for _, s in lines)
    if total <= 0:
        return
    if weight <= 0:
        parts["memory_bound"] += total
        return
    for k, s in lines:
        t = total * s / weight
        bound = _bound(k, device, s, kernels)
        parts[f"{bound}_bound"] += t
        key = f"{prefix}compute:{k.kind}"
        by_phase[key] = by_phase.get(key, 0.0) + t


def _train_split(r: TrainResult, kernels: KernelCostModel) -> TimeSplit:
    if r.layout is None or not r.stages:
        raise OpcastError("time_split needs a laid-out training result")
    stages = r.stages
    crit = max(range(len(stages)), key=lambda i: stages[i].per_micro_batch_s)  # as pipeline_time picks it
    tail = max(stages, key=lambda st: st.tail_s).stage
    priced = {o.stage for o in r.ops}
    if not priced:
        raise OpcastError("time_split needs the per-op lines: predict with details=True")

    def kind_of(stage: int) -> int:
        return stage if stage in priced else 1  # the middle stages repeat stage 1

    parts = dict.fromkeys(SPLIT_PARTS, 0.0)
    by_phase: dict[str, float] = {}
    for phase, stage in (("forward", crit), ("backward", crit), ("recompute", crit), ("optimizer", tail)):
        lines = [(o.kernel, o.count * o.time_s) for o in r.ops if o.stage == kind_of(stage) and o.phase == phase]
        _attribute(lines, r.breakdown_s[phase], r.device, kernels, "", parts, by_phase)
    for key in COMM_PARTS:
        parts["communication"] += r.breakdown_s[key]
        if r.breakdown_s[key]:
            by_phase[key] = r.breakdown_s[key]
    parts["bubble"] = r.breakdown_s["pipeline_bubble"]
    if parts["bubble"]:
        by_phase["pipeline_bubble"] = parts["bubble"]
    return TimeSplit(
        total_s=r.iteration_time_s or 0.0,
        compute_bound_s=parts["compute_bound"],
        memory_bound_s=parts["memory_bound"],
        communication_s=parts["communication"],
        bubble_s=parts["bubble"],
        by_phase=_ordered(by_phase),
    )


def _infer_split(r: InferResult, kernels: KernelCostModel) -> TimeSplit:
    if r.memory is None:
        raise OpcastError("time_split needs a laid-out inference result")
    if not r.ops:
        raise OpcastError("time_split needs the per-op lines: predict with details=True")
    steps = r.config.gen_len - 1
    parts = dict.fromkeys(SPLIT_PARTS, 0.0)
    by_phase: dict[str, float] = {}
    phase_parts: dict[str, dict[str, float]] = {}
    for phase, label, weight in (("prefill", "prefill", 1.0), ("decode", "decode_step", float(steps))):
        bd = r.breakdown_s["prefill" if phase == "prefill" else "decode_step"]
        lines = [(infer_kernel(r, ln), ln["count"] * ln["time_s"]) for ln in r.ops if ln["phase"] == phase]
        step_parts = dict.fromkeys(SPLIT_PARTS, 0.0)
        step_phase: dict[str, float] = {}
        _attribute(lines, bd["compute"], r.device, kernels, f"{label}/", step_parts, step_phase)
        for key in ("tp_comm", "pp_comm"):
            step_parts["communication"] += bd[key]
            if bd[key]:
                step_phase[f"{label}/{key}"] = bd[key]
        if bd.get("overhead"):  # --engine's per-step CPU work: the GPU waits, as in a pipeline bubble
            step_parts["bubble"] += bd["overhead"]
            step_phase[f"{label}/overhead"] = bd["overhead"]
        if phase == "decode" and steps == 0:
            continue
        phase_parts[label] = step_parts
        for key, v in step_parts.items():
            parts[key] += weight * v
        by_phase.update(step_phase)
    one_run = math.fsum(parts.values())
    if "waves" in r.cost_sources and one_run > 0:  # the shares of a full wave, over every wave's time
        scale = (r.total_latency_s or 0.0) / one_run
        parts = {key: v * scale for key, v in parts.items()}
    ordered = {**_ordered(by_phase, "prefill/"), **_ordered(by_phase, "decode_step/")}
    return TimeSplit(
        total_s=r.total_latency_s or 0.0,
        compute_bound_s=parts["compute_bound"],
        memory_bound_s=parts["memory_bound"],
        communication_s=parts["communication"],
        bubble_s=parts["bubble"],
        by_phase=ordered,
        phase_parts=phase_parts,
    )


def _ordered(by_phase: dict[str, float], prefix: str = "") -> dict[str, float]:
    """The ``prefix`` rows: compute kinds by time (largest first), then communication and the
    bubble in breakdown order."""
    compute = sorted(((k, v) for k, v in by_phase.items() if k.startswith(f"{prefix}compute:")), key=lambda kv: -kv[1])
    rest = [
        (f"{prefix}{k}", by_phase[f"{prefix}{k}"])
        for k in (*COMM_PARTS, "pipeline_bubble", "overhead")
        if f"{prefix}{k}" in by_phase
    ]
    return dict(compute + rest)


# --------------------------------------------------------------------------- explore


def parse_vary(items: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """``--vary FIELD=1,1.5,2`` (factors of the base GPU's value; an ``x`` before each is allowed)
    -> {field: factors}; every factor is checked as ``--set FIELD=xK`` would be."""
    out: dict[str, tuple[float, ...]] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",")]
        if not sep or not key or not any(values):
            raise OpcastError(
                f"--vary {item!r}: give FIELD=F1,F2,... (factors of the base GPU's value), "
                "e.g. --vary mem_bw_bytes_per_s=1,1.5,2,4"
            )
        if not all(values):
            raise OpcastError(
                f"--vary {item!r} has an empty factor between commas; give each factor once, e.g. {key}=1,2,4"
            )
        factors = []
        for v in values:
            setting = parse_setting(f"{key}={v if v[:1] in 'xX*' else 'x' + v}", said=f"--vary {item!r}")
            factors.append(float(setting.factor))  # type: ignore[arg-type]
        if key in out:
            raise OpcastError(f"--vary {key} is given twice; list all its factors in one --vary {key}=...")
        if len(set(factors)) != len(factors):
            raise OpcastError(f"--vary {item!r} repeats a factor; give each once")
        out[key] = tuple(factors)
    if not out:
        raise OpcastError("give at least one --vary FIELD=F1,F2,..., e.g. --vary mem_bw_bytes_per_s=1,2,4")
    overlap = [f for f in out if f.startswith("peak_") and f != PEAKS_GROUP and PEAKS_GROUP in out]
    if overlap:
        raise OpcastError(f"--vary {PEAKS_GROUP} already scales {', '.join(overlap)}; vary one or the other")
    return out


def point_device(base: DeviceSpec, factors: Mapping[str, float]) -> DeviceSpec:
    """``base`` with each field multiplied by its factor (factors of 1 leave the name alone)."""
    settings = [Setting(f, factor=x) for f, x in factors.items() if x != 1.0]
    return derive_device(base, settings) if settings else base


@dataclass(frozen=True, kw_only=True, slots=True)
class ExploreResult:
    """A grid of hypothetical GPUs around a base, one row per point."""

    workload: Workload
    base: Outcome
    vary: dict[str, tuple[float, ...]]
    points: tuple[tuple[dict[str, float], Outcome], ...]
    """(factors, outcome) per grid point, the last field varying fastest."""
    notes: tuple[str, ...] = ()

    def frame(self) -> Any:
        """The grid as a pandas frame, columns as :data:`EXPLORE_COLUMNS` says."""
        import pandas as pd

        rows = [_row(self.workload, factors, out, self.base) for factors, out in self.points]
        columns = [f"x_{f}" for f in self.vary] + list(explore_columns(self.workload.kind))
        return pd.DataFrame(rows, columns=columns)


def explore_columns(kind: WorkloadKind) -> tuple[str, ...]:
    """The columns of :meth:`ExploreResult.frame` after the ``x_<field>`` factor columns."""
    metrics = (
        ("iteration_time_s", "tokens_per_s", "mfu")
        if kind == "train"
        else ("ttft_s", "tpot_s", "total_latency_s", "tokens_per_s")
    )
    speedups = ("speedup",) if kind == "train" else ("speedup", "ttft_speedup", "tpot_speedup")
    split = tuple(f"{p}_s" for p in SPLIT_PARTS) + tuple(f"{p}_share" for p in SPLIT_PARTS)
    return (
        "gpu",
        "feasible",
        "fits",
        *metrics,
        *speedups,
        *split,
        "learned_kernels",
        "learned_out_of_range",
        "reasons",
    )


EXPLORE_COLUMNS = {"train": explore_columns("train"), "infer": explore_columns("infer")}
"""Columns of an explore grid (CSV) per workload kind, after one ``x_<field>`` column per varied
field: the point's GPU name, feasibility, the workload's metrics, the speed-up(s) over the base
(base time / point time), the :class:`TimeSplit` parts in seconds and as shares of the total, how
many distinct kernels a learned model timed and how many of those were outside its fitted
hardware, and the reasons a point is infeasible."""


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a and b and math.isfinite(a) and math.isfinite(b) else math.nan


def _row(workload: Workload, factors: Mapping[str, float], out: Outcome, base: Outcome) -> dict[str, Any]:
    r = out.result
    row: dict[str, Any] = {f"x_{f}": x for f, x in factors.items()}
    row.update(gpu=out.device.name, feasible=bool(r.feasible), fits=out.fits)
    if isinstance(r, TrainResult):
        row.update(
            iteration_time_s=r.iteration_time_s,
            tokens_per_s=r.tokens_per_s,
            mfu=r.mfu,
            speedup=_ratio(base.result.iteration_time_s, r.iteration_time_s),  # type: ignore[union-attr]
        )
    else:
        b: Any = base.result
        row.update(
            ttft_s=r.ttft_s,
            tpot_s=r.tpot_s,
            total_latency_s=r.total_latency_s,
            tokens_per_s=r.tokens_per_s,
            speedup=_ratio(b.total_latency_s, r.total_latency_s),
            ttft_speedup=_ratio(b.ttft_s, r.ttft_s),
            tpot_speedup=_ratio(b.tpot_s, r.tpot_s),
        )
    for p in SPLIT_PARTS:
        row[f"{p}_s"] = getattr(out.split, f"{p}_s") if out.split else math.nan
        row[f"{p}_share"] = out.split.share(p) if out.split else math.nan
    row.update(learned_kernels=out.learned, learned_out_of_range=out.out_of_range, reasons="; ".join(out.reasons))
    return row


def explore(
    workload: Workload,
    base: DeviceSpec,
    vary: Mapping[str, Sequence[float]],
    *,
    kernels: KernelCostModel | None = None,
    comms: CollectiveCostModel | None = None,
) -> ExploreResult:
    """Predict ``workload`` on every point of the grid ``vary`` (field -> factors of ``base``'s
    value; the cartesian product, the last field varying fastest) and on ``base`` itself."""
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    comms = comms or collective_cost_for(kernels)
    grid = {f: tuple(float(x) for x in xs) for f, xs in vary.items()}
    size = math.prod(len(xs) for xs in grid.values())
    if not grid or size == 0:
        raise OpcastError("explore needs at least one field with at least one factor")
    if size > MAX_POINTS:
        raise OpcastError(f"the grid has {size} points (> {MAX_POINTS}); vary fewer fields or factors")
    for f, xs in grid.items():  # the checks of --set, and of the GPU each factor makes, before any prediction runs
        for x in xs:
            derive_device(base, [parse_setting(f"{f}=x{x!r}")], said=f"--vary {f}={x:g}", vary=True)
    base_out = predict(workload, base, kernels, comms)
    if base_out.split is None:
        raise OpcastError(
            f"the configuration cannot run on the base GPU {base.name} "
            f"({len(base_out.reasons)} reason(s)): " + "; ".join(base_out.reasons)
        )
    points = []
    for combo in itertools.product(*grid.values()):
        factors = dict(zip(grid, combo))
        device = point_device(base, factors)
        points.append((factors, base_out if device == base else predict(workload, device, kernels, comms)))
    return ExploreResult(
        workload=workload,
        base=base_out,
        vary=grid,
        points=tuple(points),
        notes=tuple(_notes(workload, grid, base_out, [o for _, o in points], kernels, comms)),
    )


def _notes(
    workload: Workload,
    grid: Mapping[str, Sequence[float]],
    base: Outcome,
    outs: Sequence[Outcome],
    kernels: KernelCostModel,
    comms: CollectiveCostModel | None = None,
) -> list[str]:
    notes = []
    network = sorted(f for f in grid if f in NETWORK_FIELDS)
    if network and comms is not None and "learned_collectives" in comms.describe():
        notes.append(
            f"varying {', '.join(network)} leaves the cluster's measured network: points whose links differ "
            "from it price their collectives with alpha-beta, not the learned laws"
        )
    if "gpus_per_node" in grid and workload.gpus_per_node is not None:
        notes.append(
            f"--gpus-per-node {workload.gpus_per_node} fixes the node size, so varying the GPU's typical "
            "gpus_per_node changes nothing; leave --gpus-per-node out to let it set the cluster"
        )
    learned = any(isinstance(s, LearnedKernelCost) for s in kernels.sources)
    ignored = sorted(f for f in grid if f in LEARNED_ONLY_FIELDS)
    if ignored:
        notes.append(
            f"{', '.join(ignored)} enter the learned models only (sm_count also the share of SMs overlapped "
            "communication holds); kernels timed by the roofline do not change "
            + ("(no learned models are loaded, so nothing changes)" if not learned else "")
        )
    if "mem_bytes" in grid:
        notes.append("mem_bytes changes only whether the configuration fits (fits column), not its time")
    if "tdp_w" in grid:
        notes.append("tdp_w does not enter the time model")
    if any(f in grid for f in ("intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s")):
        notes.append(
            "a link-bandwidth factor scales the bandwidth term of each collective; NCCL's per-step "
            "latencies stay, so latency-bound collectives gain less than the factor"
        )
    if not base.fits:
        notes.append(
            f"the configuration does not fit in the base GPU's memory ({base.reasons[0] if base.reasons else ''}); "
            "times are still predicted"
        )
    flagged = sum(o.out_of_range for o in outs)
    if flagged:
        how = (
            "replaced by the roofline (--analytic)"
            if kernels.in_range_only
            else "flagged (--analytic uses the roofline)"
        )
        notes.append(
            f"{flagged} learned kernel time(s) over the grid are outside the shapes or hardware their model was "
            f"fitted on: {how}"
        )
    return notes


# --------------------------------------------------------------------------- compare


@dataclass(frozen=True, kw_only=True, slots=True)
class CompareResult:
    """One workload on several GPUs."""

    workload: Workload
    outcomes: tuple[Outcome, ...]
    """In the order given; speed-ups are over the first."""

    def rows(self) -> list[tuple[str, list[float]]]:
        """(phase, seconds per GPU) rows: the headline times, then every phase any GPU has, in
        the first GPU's order (NaN where a GPU has no times)."""
        heads: list[tuple[str, list[float]]]
        if self.workload.kind == "train":
            heads = [("iteration", [o.result.iteration_time_s if o.split else math.nan for o in self.outcomes])]
        else:
            heads = [
                (name, [getattr(o.result, attr) if o.split else math.nan for o in self.outcomes])
                for name, attr in (("total_latency", "total_latency_s"), ("ttft", "ttft_s"), ("tpot", "tpot_s"))
            ]
        split_rows = [
            (f"{p} (all phases)", [getattr(o.split, f"{p}_s") if o.split else math.nan for o in self.outcomes])
            for p in SPLIT_PARTS
        ]
        if self.workload.kind == "infer":
            split_rows = [r for r in split_rows if not r[0].startswith("bubble")]
        phases: list[str] = []
        for o in self.outcomes:
            for key in o.split.by_phase if o.split else {}:
                if key not in phases:
                    phases.append(key)
        phase_rows = [
            (key, [o.split.by_phase.get(key, 0.0) if o.split else math.nan for o in self.outcomes]) for key in phases
        ]
        return heads + phase_rows + split_rows

    def frame(self) -> Any:
        """Long table: phase, then ``<gpu>_s`` and ``<gpu>_speedup`` (first GPU's seconds / this
        GPU's) for every GPU."""
        import pandas as pd

        names = [o.device.name for o in self.outcomes]
        records = []
        for phase, secs in self.rows():
            rec: dict[str, Any] = {"phase": phase}
            for name, s in zip(names, secs):
                rec[f"{name}_s"] = s
            for name, s in zip(names, secs):
                rec[f"{name}_speedup"] = _ratio(secs[0], s)
            records.append(rec)
        return pd.DataFrame(records)


def compare(
    workload: Workload,
    devices: Sequence[DeviceSpec],
    *,
    kernels: KernelCostModel | None = None,
    comms: CollectiveCostModel | None = None,
) -> CompareResult:
    """Predict ``workload`` on each of ``devices`` (at least two, distinct)."""
    if len(devices) < 2:
        raise OpcastError("compare needs at least two GPUs, e.g. --gpus A100-SXM4-80GB,H100-SXM,B200")
    names = [d.name for d in devices]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise OpcastError(f"--gpus names {', '.join(dupes)} more than once; give each GPU once")
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    comms = comms or collective_cost_for(kernels)
    outcomes = tuple(predict(workload, d, kernels, comms) for d in devices)
    unlaid = {o.reasons for o in outcomes if o.split is None}
    if len(unlaid) == 1 and all(o.split is None for o in outcomes):  # the same reasons on every GPU: the input's
        raise OpcastError(f"the configuration cannot run on any of --gpus: {'; '.join(next(iter(unlaid)))}")
    return CompareResult(workload=workload, outcomes=outcomes)


def split_gpu_list(text: str) -> list[str]:
    """``A100,H100-SXM[mem_bw_bytes_per_s=x2,peak_flops=x1.5],B200`` -> the three names (commas
    inside brackets belong to a derived GPU)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    names = [n for n in out if n]
    if not names:
        raise OpcastError("--gpus is empty; give a comma-separated list, e.g. --gpus A100-SXM4-80GB,H100-SXM,B200")
    if len(names) < len(out):
        raise OpcastError(f"--gpus {text!r} has an empty name between commas; give each GPU once, comma-separated")
    if len(names) > MAX_POINTS:  # each is a full prediction, as each point of explore's grid
        raise OpcastError(f"--gpus names {len(names)} GPUs (> {MAX_POINTS}, each a full prediction); compare fewer")
    return names
