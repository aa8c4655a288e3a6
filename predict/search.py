"""``opcast search``: every parallel configuration of one training job, the infeasible ones pruned
early and counted by reason, the rest predicted and ranked.

The stages, each cheap because the one before shrank the space:

1. **Enumerate and prune** (:func:`_enumerate`): a tree tp -> pp -> cp -> ep -> sp -> ZeRO ->
   micro-batch -> recomputation -> schedule. Every check sits at the first level where its factors
   are known, so a whole subtree is pruned, and counted, at once (a 2520-GPU space of 30 million
   configurations is mostly pruned by arithmetic on subtree sizes). Layouts whose groups would
   straddle node boundaries are skipped (:attr:`SearchSpace.aligned_groups`). Memory is checked before any
   timing: first a lower bound that does not depend on the micro-batch (weights, gradients,
   optimizer states and the ZeRO-3 gather buffer), then the exact per-GPU memory.
2. **Compile** the survivors' op graphs. Block and model-level graphs depend on tp, cp, ep, sp,
   micro-batch and recomputation only, so there are far fewer of them than configurations; every
   kernel in them (and every optimizer step) is priced in **one** :meth:`KernelCostModel.lookup`,
   i.e. one batched call per learned model, and each graph's per-phase kernel time and exposed
   collectives are summed once.
3. **Compose** each survivor's iteration time from those sums with ``run_train``'s own terms:
   stage times, pipeline sends, the data-parallel tail,
   :func:`~opcast.predict.training.compose_iteration`; a few microseconds each, memoised across
   configurations that share a part, and spread over a process pool when there are more than
   :data:`POOL_MIN_CONFIGS` of them.
4. **Rank** by the objective and re-predict the top K with
   :func:`~opcast.predict.training.run_train` (the full breakdown) for the report.

There is one cost model. Every term -- model states, activations, a stage's compute and exposed
collectives, the data-parallel synchronisation, pipeline sends, the optimizer step, the pipeline
composition -- is a pure function in :mod:`opcast.predict.memory` or
:mod:`opcast.predict.training` that ``run_train`` calls once per priced stage; the search
(:class:`_Terms`) only memoises the same functions across configurations, so a new term is
written once and the floats are identical. ``tests/unit/test_search.py`` still holds the two
together against brute force on spaces that take every branch, and every search re-checks its
top K against ``run_train`` (:attr:`SearchResult.max_recheck_rel_diff`).

Objectives (:data:`Objective`):

- ``throughput``: the most tokens per second.
- ``cost``: the fewest GPU-seconds per token, ``world x iteration time / (global batch x seq)``,
  i.e. GPU-hours per token at any fixed price per GPU-hour. With one world size this ranks like
  throughput, so this objective also tries **fewer GPUs** than ``--gpus``: every divisor of it that
  is a whole number of nodes or fits in one node. A smaller job with fewer data-parallel replicas
  (more micro-batches, less gradient traffic, a smaller pipeline bubble) is often cheaper per token
  though slower.
- ``memory``: the smallest peak memory per GPU, ties broken by throughput.
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from opcast.archs import ArchSpec
from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.cost import Kernel, KernelCostModel
from opcast.predict.cost.sustained import sustained_times
from opcast.predict.frameworks import FrameworkName, framework_of
from opcast.predict.graph import (
    BWD,
    FWD,
    RECOMPUTE,
    Graph,
    Node,
    delayed_amax_reduction,
    precision_of,
    train_block,
    train_extras,
    weight_casts,
)
from opcast.predict.memory import (
    activation_dtype,
    fullest_stages,
    model_state_bytes,
    run_layer_activation_terms,
    stage_activation_bytes,
    stage_total_bytes,
)
from opcast.predict.moe_dispatch import TRAIN_DISPATCHERS, MoeDispatcher, dispatcher_problem, ep_dispatch
from opcast.predict.parallel import (
    MAX_GPUS,
    PP_PARTITION_AUTO,
    AttentionImpl,
    Clocks,
    Fp8Recipe,
    Precision,
    Schedule,
    TrainConfig,
    accounted_layers,
    device_reasons,
    fp8_recipe_reasons,
    model_parallel_groups,
    parse_pp_partition,
    pipeline_split,
)
from opcast.predict.recompute import Recompute, canonical_recompute, recompute_problem, recompute_rank
from opcast.predict.tp_overlap import configs as ub_configs
from opcast.predict.tp_overlap import overlap_kernels
from opcast.predict.training import (
    DataParallelSync,
    PhaseCost,
    StageCompute,
    TrainResult,
    compose_iteration,
    data_parallel_sync,
    data_parallel_time,
    dense_peak_flops,
    flops_utilisation,
    fp8_amax_s,
    fsdp_gradient_s,
    fsdp_stage_kernels,
    gradient_reduce_bytes,
    graph_groups,
    micro_batch_s,
    model_flops,
    optimizer_kernel,
    optimizer_numel,
    p2p_message_bytes,
    p2p_overlap_windows,
    phase_cost,
    pipeline_send_s,
    pipeline_sends,
    stage_compute,
    stage_kind,
    stage_kinds,
    stage_tail_s,
    tokens_per_s,
    weight_cast_s,
)

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

Objective = Literal["throughput", "cost", "memory"]

POOL_MIN_CONFIGS = 60_000
"""Survivors below which composition stays in this process. Composition runs at ~50-100k
configurations/s per core; a forked pool costs ~0.1 s to start, starts with cold memo tables and
sends back one float per configuration, so on 2 cores it only pays off above ~50k survivors
(measured: 49k survivors 0.9 s serial, 0.8 s on 2 processes; 90k: 1.6 s vs 1.0 s)."""

RECOMPUTE_MODES: tuple[str, ...] = get_args(Recompute)
ZERO_STAGES = (0, 1, 2, 3)
MAX_SEARCH_GPUS = MAX_GPUS
"""The most GPUs a training search takes (2,097,152, several times the largest clusters built): the
search enumerates every divisor of the world size and of its sub-groups, and for a count such as
963,761,198,400 (6,720 divisors) that ran for minutes before this bound."""
MAX_SEARCH_GLOBAL_BATCH = 2**24
"""The largest global batch (sequences) a training search takes: every divisor is a micro-batch to
try; at 14,414,400 sequences a roofline search takes ~10 s here, at 963,761,198,400 ~40 s."""
GIB = 2**30

# Pruning reasons, in the order they are checked; a pruned configuration counts under the first.
REASONS: dict[str, str] = {
    "max_tp": "tp above --max-tp",
    "tp_within_node": "tp group spans nodes (--tp-within-node)",
    "tp_arch": "tp does not divide the heads, kv heads or ffn of the arch",
    "pp_layers": "pp does not divide n_layers (the search splits evenly or, with --pp-partition "
    "megatron:embedding,loss, as Megatron-LM counting the embedding and loss; price another split with opcast "
    "predict train --pp-partition or --pp-layers)",
    "cp_seq": "2 x cp does not divide seq (context-parallel chunks)",
    "node_straddle": "tp, tp x cp or tp x cp x dp groups straddle node boundaries (--allow-straddling)",
    "ep_dp": "ep does not divide dp x cp",
    "sp_tp1": "sequence parallelism needs tp > 1",
    "sp_seq": "sequence parallelism needs tp to divide seq / cp",
    "zero3_pp": "ZeRO-3 with pp > 1 is not supported",
    "mem_states": "weights, gradients and optimizer states alone exceed the memory limit",
    "global_batch": "global batch not a multiple of micro-batch x dp",
    "interleaved_pp1": "interleaved schedule needs pp > 1",
    "interleaved_layers": "interleaved: pp x virtual stages does not divide n_layers (with --pp-partition "
    "megatron:...: the virtual stages do not divide each rank's layers)",
    "interleaved_m": "interleaved: micro-batches per rank not a multiple of pp",
    "mem_total": "does not fit the memory limit (activations included)",
}
FIXABLE = ("tp", "pp", "cp", "ep", "sp", "micro_batch", "recompute", "zero", "schedule", "virtual_stages")
"""Dimensions ``--fix`` can restrict."""


# --------------------------------------------------------------------------- the space


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """One training job whose parallel configuration is to be chosen."""

    gpus: int
    """GPUs available (the world size; ``cost`` may use fewer, see the module docstring)."""
    gpus_per_node: int | None = None
    """GPUs per node; None: the device's typical node (or all GPUs, when fewer)."""
    global_batch: int
    """Sequences per iteration."""
    seq: int
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Compute precision."""
    fp8_recipe: Fp8Recipe = "delayed"
    """Transformer Engine's per-tensor fp8 scaling (precision fp8 only), as ``predict train --fp8-recipe``."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How MoE tokens reach their experts' ranks, as ``predict train --moe-dispatcher``."""
    clocks: Clocks = "sustained"
    """The clock compute-bound kernels run at, as ``predict train --clocks``."""
    attention: AttentionImpl = "flash"
    """Attention kernel."""
    framework: FrameworkName | None = None
    """The training framework, as ``predict train --framework``: the kernels it runs (Megatron's fused rope and
    SwiGLU, Hugging Face's eager ops, llm-foundry's attention), what it keeps (Megatron's fp32 ``main_grad``) and
    how it reduces gradients (fp32 under Megatron, DeepSpeed's all-reduce under ``neox``, torch FSDP's
    flat-gradient kernels under ``foundry``'s ZeRO-3); None: opcast's default kernels, 16 bytes a parameter."""
    objective: Objective = "throughput"
    """What to rank by."""
    max_tp: int | None = None
    """Largest tensor-parallel degree to consider."""
    tp_within_node: bool = False
    """Keep every tensor-parallel group inside one node (tp divides the GPUs per node)."""
    max_mem_bytes: float | None = None
    """Memory limit per GPU; None: the device's memory (a larger limit is capped at it)."""
    aligned_groups: bool = True
    """Skip layouts whose groups straddle nodes: tp, tp x cp or tp x cp x dp (= world / pp) that
    neither divides nor is a multiple of the GPUs per node (e.g. tp = 3 on 8-GPU nodes). Megatron
    runs them, but :func:`opcast.predict.comm.place` prices every group as node-aligned, so their
    predictions would be optimistic."""
    overlap_grad_reduce: bool = True
    """Overlap the data-parallel gradient reduction with the last backward (fixed, not searched:
    in the model it never hurts)."""
    overlap_param_gather: bool = False
    """Megatron-LM's ``--overlap-param-gather`` on every configuration that can run it (ZeRO 1 or 2, the distributed
    optimizer): the weight all-gather behind the next iteration's first forward. Needs ``overlap_grad_reduce``."""
    tp_comm_overlap: bool = False
    """Transformer Engine's userbuffers overlap of the tensor-parallel collectives with their GEMMs (TE's default
    settings) on every configuration that can run it: with sequence parallelism, as Megatron-LM asserts."""
    pp_partition: str = "auto"
    """How the layers are split over the pipeline stages: ``auto``, evenly (pp, and pp x virtual stages when
    interleaved, divide n_layers), or ``megatron:embedding,loss`` (or one of the two), Megatron-LM's
    ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the embedding and the loss
    count as a layer each, so the first and last stages hold one layer fewer (NeMo's Llama 3.1 405B: 126 + 2 layers
    over pp 8 x vp 8). The splits of ``predict train --pp-partition`` beyond these are priced there only."""
    overlap_p2p_comm: bool = False
    """Megatron-LM's ``overlap_p2p_comm`` on every interleaved configuration (it turns it off for 1F1B): each
    pipeline send behind one model chunk's compute."""
    fixed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Dimension -> the only values to enumerate (``--fix tp=8``); keys from :data:`FIXABLE`.
    Restricting a dimension shrinks the space; it does not count as pruning."""

    def param_gather(self, zero: int) -> bool:
        """Whether a configuration of ZeRO stage ``zero`` overlaps its weight gather (the distributed optimizer's)."""
        return self.overlap_param_gather and zero in (1, 2)

    def tp_overlap(self, sp: bool) -> bool:
        """Whether a configuration runs TE's userbuffers overlap (only with sequence parallelism)."""
        return self.tp_comm_overlap and sp

    def p2p_overlap(self, virtual_stages: int) -> bool:
        """Whether a configuration overlaps its pipeline sends (interleaved only: Megatron-LM turns it off for 1F1B)."""
        return self.overlap_p2p_comm and virtual_stages > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One feasible configuration and its predicted figures."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    sp: bool
    micro_batch: int
    micro_batches: int
    """Per data-parallel rank and iteration."""
    recompute: Recompute
    zero: int
    schedule: Schedule
    virtual_stages: int
    nodes: int
    gpus_per_node: int
    iteration_time_s: float
    tokens_per_s: float
    mfu: float
    memory_bytes: float
    """Peak memory per GPU (the fullest pipeline stage)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_s_per_token(self) -> float:
        """GPU-seconds per token: the ``cost`` objective (times a price per GPU-second = money)."""
        return self.world_size / self.tokens_per_s

    def train_config(self, space: SearchSpace) -> TrainConfig:
        return TrainConfig(
            tp=self.tp,
            pp=self.pp,
            dp=self.dp,
            cp=self.cp,
            ep=self.ep,
            sp=self.sp,
            micro_batch=self.micro_batch,
            global_batch=space.global_batch,
            seq=space.seq,
            recompute=self.recompute,
            zero=self.zero,
            precision=space.precision,
            fp8_recipe=space.fp8_recipe,
            moe_dispatcher=space.moe_dispatcher,
            attention=space.attention,
            framework=space.framework,
            clocks=space.clocks,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
            overlap_grad_reduce=space.overlap_grad_reduce,
            overlap_param_gather=space.param_gather(self.zero),
            tp_comm_overlap=space.tp_overlap(self.sp),
            overlap_p2p_comm=space.p2p_overlap(self.virtual_stages),
            pp_partition=space.pp_partition,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """Every feasible configuration ranked, the pruning counts and the top K predicted in full."""

    arch: ArchSpec
    device: DeviceSpec
    space: SearchSpace
    memory_limit_bytes: float
    worlds: tuple[tuple[int, int], ...]
    """(nodes, GPUs per node) of each world size searched."""
    considered: int
    """Configurations in the space."""
    pruned: dict[str, int]
    """Reason key (:data:`REASONS`) -> configurations pruned for it, in check order."""
    candidates: tuple[Candidate, ...]
    """Every feasible configuration, best first."""
    top: tuple[TrainResult, ...]
    """The first K candidates predicted by ``run_train`` with the full breakdown."""
    seconds: dict[str, float]
    """Wall time of each stage: enumerate, compile (graphs and their sums), kernels (the one batched
    kernel lookup, which loads learned predictors on first use), compose, rank."""
    unique_graphs: int
    unique_kernels: int
    kernels_by_source: dict[str, int]
    workers: int
    """Processes that composed (1: this one)."""
    max_recheck_rel_diff: float
    """Largest relative difference of the top K's iteration times between the search and run_train
    (0 unless the two have drifted apart)."""
    cost_sources: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted(self) -> int:
        return len(self.candidates)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def reasons_summary(self) -> str:
        """``reason (count); ...`` by count, largest first."""
        items = sorted(((n, k) for k, n in self.pruned.items() if n), reverse=True)
        return "; ".join(f"{REASONS[k]}: {n:,}" for n, k in items)


def objective_key(objective: str) -> Callable[[Candidate], tuple]:
    """Sort key of a candidate, best first; ties go to less memory, then to the simpler configuration."""

    def simple(c: Candidate) -> tuple:
        return (
            c.world_size,
            c.tp,
            c.pp,
            c.cp,
            c.ep,
            c.zero,
            recompute_rank(c.recompute),
            -c.micro_batch,
            c.virtual_stages,
            c.sp,
        )

    if objective == "throughput":
        return lambda c: (-c.tokens_per_s, c.memory_bytes, *simple(c))
    if objective == "cost":
        return lambda c: (c.gpu_s_per_token, c.memory_bytes, *simple(c))
    if objective == "memory":
        return lambda c: (c.memory_bytes, -c.tokens_per_s, *simple(c))
    raise OpcastError(f"objective={objective!r} is not one of {', '.join(get_args(Objective))}")


# --------------------------------------------------------------------------- checks of the request


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def space_problems(device: DeviceSpec, space: SearchSpace) -> list[str]:
    """Every problem of a request (empty when it can be searched)."""
    problems: list[str] = []
    for label in ("gpus", "global_batch", "seq"):
        v = getattr(space, label)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            problems.append(f"{label}={v!r} must be a positive integer")
    for label in ("gpus_per_node", "max_tp"):
        v = getattr(space, label)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            problems.append(f"{label}={v!r} must be a positive integer")
    for label, most, flag in (
        ("gpus", MAX_SEARCH_GPUS, "--gpus"),
        ("global_batch", MAX_SEARCH_GLOBAL_BATCH, "--global-batch"),
    ):
        v = getattr(space, label)
        if isinstance(v, int) and v > most:
            problems.append(
                f"{flag} {v} is past the {most:,} a search takes; search a smaller {label.replace('_', ' ')}"
            )
    if space.max_mem_bytes is not None and not (math.isfinite(space.max_mem_bytes) and space.max_mem_bytes > 0):
        problems.append(f"max_mem={space.max_mem_bytes / GIB:g} GiB must be a positive finite number")
    if space.objective not in get_args(Objective):
        problems.append(f"objective={space.objective!r} is not one of {', '.join(get_args(Objective))}")
    if space.attention not in get_args(AttentionImpl):
        problems.append(f"attention={space.attention!r} is not one of {', '.join(get_args(AttentionImpl))}")
    if space.clocks not in get_args(Clocks):
        problems.append(f"clocks={space.clocks!r} is not one of {', '.join(get_args(Clocks))}")
    if space.overlap_param_gather and not space.overlap_grad_reduce:
        problems.append(
            "--overlap-param-gather needs --overlap-grad-reduce (Megatron-LM); drop one or turn the other on"
        )
    if (problem := pp_partition_problem(space.pp_partition)) is not None:
        problems.append(problem)
    if space.framework is not None and space.framework not in get_args(FrameworkName):
        problems.append(f"framework={space.framework!r} is not one of {', '.join(get_args(FrameworkName))}")
    problems += device_reasons(device, space.precision)
    problems += fp8_recipe_reasons(space.precision, space.fp8_recipe)
    if (problem := dispatcher_problem(space.moe_dispatcher, TRAIN_DISPATCHERS)) is not None:
        problems.append(problem)
    problems += _fixed_problems(space.fixed)
    return problems


def _check_space(arch: ArchSpec, device: DeviceSpec, space: SearchSpace) -> list[tuple[int, int]]:
    """The (nodes, GPUs per node) of each world to search; every problem of the request at once
    as an :class:`OpcastError`."""
    problems = space_problems(device, space)
    if problems:
        raise OpcastError("; ".join(problems))
    if arch.position == "learned" and space.seq > arch.max_seq:
        raise OpcastError(
            f"seq={space.seq} exceeds max_seq={arch.max_seq} of {arch.name} (learned positions); nothing to search"
        )
    g = space.gpus_per_node or min(space.gpus, device.gpus_per_node)
    if space.gpus % g and space.gpus > g:
        raise OpcastError(f"--gpus {space.gpus} is not a whole number of {g}-GPU nodes; give --gpus-per-node")
    if space.objective != "cost":
        worlds = [(max(1, space.gpus // g), min(g, space.gpus))]
    else:
        sizes = [w for w in _divisors(space.gpus) if w < g or w % g == 0]
        worlds = [(w // g, g) if w >= g else (1, w) for w in sizes]
    problems = _unsearched_fixes(arch, space, [n * per for n, per in worlds])
    if problems:
        raise OpcastError("; ".join(problems))
    return worlds


def _unsearched_fixes(arch: ArchSpec, space: SearchSpace, sizes: Sequence[int]) -> list[str]:
    """A --fix value the walk of :func:`_enumerate` never reaches (it walks only the divisors of each
    dimension's whole): it was dropped without a word where another value of its key was searched
    (--fix tp=2,3 on 8 GPUs searched tp 2), and where none was, the search ended in "nothing to
    search" without naming the value."""
    fx = space.fixed
    shown = " or ".join(map(str, sizes))
    world = (lambda v: any(w % v == 0 for w in sizes), f"it does not divide the world size searched ({shown} GPUs)")
    total = split_total(arch, space.pp_partition)
    counted = (
        f"the {arch.n_layers} layers of {arch.name}"
        if total == arch.n_layers
        else f"the {total} layers --pp-partition {space.pp_partition} counts ({arch.n_layers} of {arch.name} with the "
        "embedding and loss)"
    )
    whole = {
        "tp": world,
        "pp": world,
        "cp": world,
        "ep": (
            lambda v: arch.n_experts % v == 0,
            f"it does not divide the {arch.n_experts} expert(s) of {arch.name}; "
            f"choose from {', '.join(map(str, _divisors(arch.n_experts)))}",
        ),
        "micro_batch": (
            lambda v: space.global_batch % v == 0,
            f"it does not divide --global-batch {space.global_batch}",
        ),
        "virtual_stages": (
            lambda v: total % v == 0,
            f"it does not divide {counted}",
        ),
    }
    problems = []
    for key, (reached, why) in whole.items():
        bad = [v for v in fx.get(key, ()) if not reached(v)]
        if bad:
            problems.append(f"--fix {key}={','.join(map(str, bad))} is never searched: {why}")
    return problems


def _fixed_problems(fixed: Mapping[str, tuple[Any, ...]]) -> list[str]:
    problems = []
    for key, values in fixed.items():
        if key not in FIXABLE:
            problems.append(f"--fix {key}: unknown dimension; use one of {', '.join(FIXABLE)}")
            continue
        if not values:
            problems.append(f"--fix {key}: give at least one value")
        for v in values:
            if key == "recompute" and (problem := recompute_problem(v)) is not None:
                problems.append(f"--fix {problem}")
                continue
            if key == "sp":
                ok = isinstance(v, bool)
            elif key == "recompute":
                ok = True  # checked above, with recompute_problem's reason
            elif key == "schedule":
                ok = v in get_args(Schedule)
            elif key == "zero":
                ok = v in ZERO_STAGES
            else:
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            if not ok:
                problems.append(f"--fix {key}={v!r} is not a valid {key}")
    return problems


def parse_fix(items: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """``--fix KEY=V[,V...]`` (repeatable) -> :attr:`SearchSpace.fixed`; every problem at once."""
    out: dict[str, tuple[Any, ...]] = {}
    problems: list[str] = []
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not text.strip():
            problems.append(f"--fix takes KEY=V[,V...], e.g. --fix tp=4,8; got {item!r}")
            continue
        if key in seen:  # a second --fix tp=... replaced the first silently
            problems.append(f"--fix {key} is given twice; list all its values in one --fix {key}=V,V...")
            continue
        seen.add(key)
        values: list[Any] = []
        for raw in (t.strip() for t in text.split(",")):
            if key == "sp":
                low = raw.lower()
                if low not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                    problems.append(f"--fix sp={raw!r}: use on or off")
                    continue
                values.append(low in ("on", "true", "1", "yes"))
            elif key == "recompute":  # Megatron-Core's modules too (selective:mlp+layernorm), in one spelling
                low = raw.lower()
                values.append(low if recompute_problem(low) else canonical_recompute(low))
            elif key == "schedule":
                values.append(raw.lower())
            else:
                try:
                    values.append(int(raw))
                except ValueError:
                    problems.append(f"--fix {key}={raw!r} is not an integer")
        if values:
            out[key] = tuple(dict.fromkeys(values))
    problems += _fixed_problems(out)
    if problems:
        raise OpcastError("; ".join(problems))
    return out


# --------------------------------------------------------------------------- the pipeline split


def pp_partition_problem(pp_partition: str) -> str | None:
    """Why the search cannot split as ``pp_partition`` (None: it can): ``auto`` (even) and Megatron-LM's
    embedding / loss accounting only (:attr:`SearchSpace.pp_partition`)."""
    parsed = parse_pp_partition(pp_partition)
    if not isinstance(parsed, str):
        method, opts = parsed
        if method == PP_PARTITION_AUTO or (method == "megatron" and opts and set(opts) <= {"embedding", "loss"}):
            return None
    return (
        f"--pp-partition {pp_partition}: the search splits evenly (auto) or as Megatron-LM counting the embedding "
        "and loss (megatron:embedding,loss); price this split with opcast predict train --pp-partition"
    )


def split_total(arch: ArchSpec, pp_partition: str) -> int:
    """The layers a split divides over the pipeline: n_layers, plus one each for the embedding and the loss where
    Megatron-LM counts them (``megatron:embedding,loss``; :func:`opcast.predict.parallel.megatron_chunks`)."""
    parsed = parse_pp_partition(pp_partition)
    if isinstance(parsed, str) or parsed[0] != "megatron":
        return arch.n_layers
    opts = parsed[1]
    return accounted_layers(arch.n_layers, embedding=bool(opts.get("embedding")), loss=bool(opts.get("loss")))


# --------------------------------------------------------------------------- the shared cost terms, memoised


class _Terms:
    """The cost terms of one search: the pure functions of :mod:`opcast.predict.memory` and
    :mod:`opcast.predict.training` that ``run_train`` calls, each called here once per distinct
    argument set (configurations share most of them: the compute of a stage across ZeRO stages
    and schedules, the data-parallel collectives across all but the layout and ZeRO stage, the
    pipeline sends across recomputation modes and ZeRO stages). Nothing here computes a term."""

    def __init__(
        self,
        arch: ArchSpec,
        device: DeviceSpec,
        space: SearchSpace,
        worlds: Sequence[tuple[int, int]],
        comms: CollectiveCostModel | None = None,
    ) -> None:
        self.arch, self.device, self.space, self.worlds = arch, device, space, tuple(worlds)
        self.act_dtype = activation_dtype(space.precision)
        self.grad_b = dtype_bytes(self.act_dtype)
        self.amax = delayed_amax_reduction(
            precision_of(space.precision, None, space.framework, fp8_recipe=space.fp8_recipe, training=True)
        )
        self.reduce_b = gradient_reduce_bytes(self.grad_b, space.framework)
        self.fsdp = framework_of(space.framework).zero3_fsdp_kernels
        self.peak = dense_peak_flops(device, space.precision)
        self.comms = comms if comms is not None else CollectiveCostModel()
        self.graph_costs: dict[tuple, dict[str, PhaseCost]] = {}
        """(graph key, GPUs per node) -> phase -> cost of one copy (filled by :func:`_compile`)."""
        self.opt_s: dict[int, float] = {}
        """Optimizer-step seconds by parameters updated (filled by :func:`_compile`)."""
        self.casts: dict[tuple[int, int], tuple[Node, ...]] = {}
        """One block's once-per-iteration fp8 weight casts by (tp, ep) (filled by :func:`_compile`)."""
        self.cast_times: dict[Kernel, tuple[float, str]] = {}
        """Their kernels' (seconds, source) (filled by :func:`_compile`)."""
        self.model_flops: dict[str, float] = {}
        """Model FLOPs of an iteration by recomputation mode (filled by :func:`_compile`)."""
        self._splits: dict[tuple[int, int], tuple[int, ...] | None] = {}
        """(pp, virtual stages) -> transformer layers of each stage (:func:`pipeline_split`), None where it fails."""
        self.fsdp_s: dict[tuple, float] = {}
        """Seconds per micro-batch of a ZeRO-3 stage's torch FSDP flat-gradient kernels (under a framework that runs
        them, :attr:`~opcast.predict.frameworks.Framework.zero3_fsdp_kernels`) by (tp, pp, ep, dp, stage) (filled
        by :func:`_compile`)."""
        self._clear()

    def _clear(self) -> None:
        self._states: dict[tuple, tuple[float, float, float, float]] = {}
        self._layer: dict[tuple, tuple[float, float]] = {}
        self._acts: dict[tuple, float] = {}
        self._numel: dict[tuple, int] = {}
        self._compute: dict[tuple, StageCompute] = {}
        self._sync: dict[tuple, tuple[DataParallelSync, float]] = {}
        self._p2p: dict[tuple, tuple[float, ...]] = {}
        self._stages: dict[tuple, tuple[dict[int, tuple[StageCompute, float, DataParallelSync]], list[float]]] = {}

    def __getstate__(self) -> dict[str, Any]:  # memo tables stay behind: a spawned worker builds its own
        # the same collective sources (learned laws included) with an empty cache
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {
            "comms": CollectiveCostModel(sources=self.comms.sources)
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clear()

    # -- the pipeline split (parallel.pipeline_split, as run_train's layout takes it)

    def _split(self, pp: int, v: int) -> tuple[int, ...] | None:
        key = (pp, v)
        if key not in self._splits:
            if self.space.pp_partition == PP_PARTITION_AUTO and v == 1 and self.arch.n_layers % pp:
                self._splits[key] = None  # auto 1F1B would fall to DeepSpeed's split; the search splits evenly
            else:
                self._splits[key] = pipeline_split(
                    self.arch,
                    pp=pp,
                    schedule="interleaved" if v > 1 else "1f1b",
                    virtual_stages=v,
                    pp_partition=self.space.pp_partition,
                )[0]
        return self._splits[key]

    def layers_of(self, pp: int) -> tuple[int, ...] | None:
        """Transformer layers of each of ``pp`` stages (a rank's chunks together), None where the split fails."""
        return self._split(pp, 1)

    def interleaves(self, pp: int, v: int) -> bool:
        """Whether ``v`` virtual stages split ``pp`` ranks' layers (the ranks' totals are :meth:`layers_of`'s)."""
        return self._split(pp, v) is not None

    def uneven(self, pp: int) -> bool:
        """Whether ``pp`` stages hold different numbers of layers."""
        split = self.layers_of(pp)
        return split is not None and len(set(split)) > 1

    def own(self, pp: int, stage: int) -> int | None:
        """``stage``'s layers where the split is uneven, None where even (the terms' default, ``n_layers / pp``)."""
        split = self.layers_of(pp)
        return split[stage] if split is not None and self.uneven(pp) else None

    def count(self, pp: int, stage: int) -> int:
        """``stage``'s transformer layers."""
        own = self.own(pp, stage)
        return self.arch.n_layers // pp if own is None else own

    def kinds(self, pp: int) -> tuple[int, ...]:
        """The stages to price (:func:`stage_kinds`: every stage of an uneven split)."""
        return stage_kinds(pp, self.layers_of(pp) or ())

    def kind(self, stage: int, pp: int) -> int:
        """The priced stage whose terms ``stage`` takes (:func:`stage_kind`; itself in an uneven split)."""
        return stage if self.uneven(pp) else stage_kind(stage, pp)

    def fullest(self, pp: int) -> tuple[int, ...]:
        """The stages whose memory can be the largest: :func:`fullest_stages`, every stage of an uneven split."""
        return tuple(range(pp)) if self.uneven(pp) else fullest_stages(pp)

    # -- memory (memory.train_memory's terms)

    def states(
        self, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, stage: int
    ) -> tuple[float, float, float, float]:
        key = (tp, pp, dp, cp, ep, zero, stage)
        hit = self._states.get(key)
        if hit is None:
            hit = self._states[key] = model_state_bytes(
                self.arch,
                stage=stage,
                tp=tp,
                pp=pp,
                dp=dp,
                cp=cp,
                ep=ep,
                zero=zero,
                precision=self.space.precision,
                framework=self.space.framework,
                layers=self.own(pp, stage),
            )
        return hit

    def layer(self, tp: int, sp: bool, mb: int, cp: int, ep: int, rc: str) -> tuple[float, float]:
        key = (tp, sp, mb, cp, ep, rc)
        hit = self._layer.get(key)
        if hit is None:
            hit = self._layer[key] = run_layer_activation_terms(
                self.arch,
                tp=tp,
                sp=sp,
                micro_batch=mb,
                seq=self.space.seq,
                cp=cp,
                ep=ep,
                attention=self.space.attention,
                recompute=rc,
                precision=self.space.precision,
            )
        return hit

    def states_bound(self, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int) -> float:
        """A lower bound of the peak that does not depend on the micro-batch: the memory without activations."""
        return max(
            stage_total_bytes(w, g, o, 0.0, 0.0, gather)
            for w, g, o, gather in (self.states(tp, pp, dp, cp, ep, zero, st) for st in self.fullest(pp))
        )

    def memory(
        self, tp: int, pp: int, dp: int, cp: int, ep: int, sp: bool, zero: int, mb: int, rc: str, m: int, v: int
    ) -> float:
        """Peak bytes per GPU over the pipeline stages (``train_memory``'s ``total_bytes`` of the fullest)."""
        per_layer, working = self.layer(tp, sp, mb, cp, ep, rc)
        best = 0.0
        for stage in self.fullest(pp):
            w, g, o, gather = self.states(tp, pp, dp, cp, ep, zero, stage)
            key = (tp, pp, cp, ep, sp, mb, rc, m, v, stage)
            acts = self._acts.get(key)
            if acts is None:
                acts = self._acts[key] = stage_activation_bytes(
                    self.arch,
                    stage=stage,
                    pp=pp,
                    tp=tp,
                    sp=sp,
                    cp=cp,
                    micro_batch=mb,
                    seq=self.space.seq,
                    micro_batches=m,
                    virtual_stages=v,
                    per_layer_bytes=per_layer,
                    dtype=self.act_dtype,
                    layers=self.own(pp, stage),
                )
            best = max(best, stage_total_bytes(w, g, o, acts, working, gather))
        return best

    # -- time (training.run_train's terms)

    def numel(self, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, stage: int) -> int:
        key = (tp, pp, dp, cp, ep, zero, stage)
        hit = self._numel.get(key)
        if hit is None:
            hit = self._numel[key] = optimizer_numel(
                self.arch, stage=stage, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, zero=zero, layers=self.own(pp, stage)
            )
        return hit

    def compute(
        self, tp: int, pp: int, cp: int, ep: int, sp: bool, mb: int, rc: str, stage: int, g: int
    ) -> StageCompute:
        key = (tp, pp, cp, ep, sp, mb, rc, stage, g)
        hit = self._compute.get(key)
        if hit is None:
            costs = self.graph_costs
            hit = self._compute[key] = stage_compute(
                (
                    (costs[(_block_key(tp, cp, ep, sp, mb, rc), g)], self.count(pp, stage)),
                    (costs[(_extras_key(tp, cp, sp, mb, stage == 0, stage == pp - 1), g)], 1),
                )
            )
        return hit

    def sync(
        self, tp: int, pp: int, cp: int, ep: int, zero: int, stage: int, wi: int
    ) -> tuple[DataParallelSync, float]:
        """A stage's data-parallel collectives and its once-per-iteration step seconds (the optimizer
        step and the fp8 weight casts, as ``run_train`` adds them)."""
        key = (tp, pp, cp, ep, zero, stage, wi)
        hit = self._sync.get(key)
        if hit is None:
            nodes, g = self.worlds[wi]
            dp = nodes * g // (tp * pp * cp)
            sync = data_parallel_sync(
                self.arch,
                self.device,
                self.comms,
                stage=stage,
                tp=tp,
                pp=pp,
                cp=cp,
                ep=ep,
                dp=dp,
                zero=zero,
                gpus_per_node=g,
                grad_bytes=self.grad_b,
                reduce_bytes=self.reduce_b,
                framework=self.space.framework,
                fp8=self.amax,
                layers=self.own(pp, stage),
            )
            step_s = self.opt_s[self.numel(tp, pp, dp, cp, ep, zero, stage)]
            step_s += weight_cast_s(self.casts[(tp, ep)], self.cast_times, self.count(pp, stage))
            hit = self._sync[key] = (sync, step_s)
        return hit

    def p2p(
        self,
        tp: int,
        pp: int,
        cp: int,
        mb: int,
        v: int,
        stride: int,
        g: int,
        work: Mapping[int, tuple[StageCompute, float, DataParallelSync]] | None = None,
        work_key: tuple | None = None,
    ) -> tuple[float, ...]:
        """Pipeline-send seconds per micro-batch of every stage; with ``work`` (the stages' compute, memoised under
        ``work_key``) each send hides behind one model chunk's compute (``overlap_p2p_comm``)."""
        key = (tp, pp, cp, mb, v, stride, g, work_key)
        hit = self._p2p.get(key)
        if hit is None:
            act = p2p_message_bytes(
                self.arch, micro_batch=mb, seq=self.space.seq, cp=cp, tp=tp, precision=self.space.precision
            )
            hit = self._p2p[key] = tuple(
                pipeline_send_s(
                    self.comms,
                    self.device,
                    pipeline_sends(
                        stage=st, pp=pp, virtual_stages=v, message_bytes=act, stride=stride, gpus_per_node=g
                    ),
                    None if work is None else p2p_overlap_windows(work[self.kind(st, pp)][0], v),
                )
                for st in range(pp)
            )
        return hit

    def iteration(self, s: _Survivor) -> float:
        """Iteration seconds of a survivor: ``run_train``'s composition of the same terms (the
        stages' work memoised across schedules, which change only the pipeline sends)."""
        space = self.space
        nodes, g = self.worlds[s.wi]
        tp, pp, cp, ep, mb, rc = s.tp, s.pp, s.cp, s.ep, s.mb, s.rc
        dp = nodes * g // (tp * pp * cp)
        m = space.global_batch // (mb * dp)
        key = (tp, pp, cp, ep, s.sp, mb, rc, s.zero, s.wi)  # everything but the schedule
        hit = self._stages.get(key)
        if hit is None:
            work: dict[int, tuple[StageCompute, float, DataParallelSync]] = {}
            tails = []
            for stage in self.kinds(pp):
                comp = self.compute(tp, pp, cp, ep, s.sp, mb, rc, stage, g)
                if s.zero == 3 and self.fsdp:  # as run_train: torch FSDP's kernels in each micro-batch's backward
                    comp = comp._replace(backward_s=comp.backward_s + self.fsdp_s[(tp, pp, ep, dp, stage)])
                sync, opt_s = self.sync(tp, pp, cp, ep, s.zero, stage, s.wi)
                dpt = data_parallel_time(
                    sync,
                    comp,
                    layers=self.count(pp, stage),
                    micro_batches=m,
                    recompute=rc,
                    overlap_grad_reduce=space.overlap_grad_reduce,
                    overlap_param_gather=space.param_gather(s.zero),
                )
                work[stage] = (comp, dpt.zero3_s, sync)
                tails.append(stage_tail_s(opt_s, dpt.exposed_s))
            hit = self._stages[key] = (work, tails)
        work, tails = hit
        overlap = space.p2p_overlap(s.v)
        p2p = self.p2p(tp, pp, cp, mb, s.v, tp * cp * dp, g, work if overlap else None, key if overlap else None)
        stage_s = []
        for stage in range(pp):
            comp, zero3_s, sync = work[self.kind(stage, pp)]
            stage_s.append(micro_batch_s(comp, p2p[stage], zero3_s + fp8_amax_s(sync, s.v)[0]))
        return compose_iteration(stage_s, tails, m, s.v)[2]

    def candidate(self, s: _Survivor, it: float) -> Candidate:
        """The candidate of a survivor whose iteration takes ``it`` seconds."""
        nodes, g = self.worlds[s.wi]
        dp = nodes * g // (s.tp * s.pp * s.cp)
        space = self.space
        m = space.global_batch // (s.mb * dp)
        world = nodes * g
        return Candidate(
            tp=s.tp,
            pp=s.pp,
            dp=dp,
            cp=s.cp,
            ep=s.ep,
            sp=s.sp,
            micro_batch=s.mb,
            micro_batches=m,
            recompute=s.rc,
            zero=s.zero,
            schedule="interleaved" if s.v > 1 else "1f1b",
            virtual_stages=s.v,
            nodes=nodes,
            gpus_per_node=g,
            iteration_time_s=it,
            tokens_per_s=tokens_per_s(space.global_batch, space.seq, it),
            mfu=flops_utilisation(self.model_flops[s.rc], it, world, self.peak),
            memory_bytes=s.mem,
        )


def _block_key(tp: int, cp: int, ep: int, sp: bool, mb: int, rc: str) -> tuple:
    return ("block", tp, cp, ep, sp, mb, rc)


def _extras_key(tp: int, cp: int, sp: bool, mb: int, first: bool, last: bool) -> tuple:
    return ("extras", tp, cp, sp, mb, first, last)


# --------------------------------------------------------------------------- stage 1: enumerate


@dataclass(slots=True)
class _Survivor:
    """A configuration that passed every check (compact; becomes a Candidate once timed)."""

    wi: int
    tp: int
    pp: int
    cp: int
    ep: int
    sp: bool
    zero: int
    mb: int
    rc: Recompute
    v: int
    mem: float


def _schedules(
    arch: ArchSpec, fixed: Mapping[str, tuple[Any, ...]], pp_partition: str = "auto"
) -> list[tuple[str, int]]:
    """1F1B and interleaving with every v >= 2 dividing the layers the split counts (:func:`split_total`)."""
    out: list[tuple[str, int]] = []
    scheds = fixed.get("schedule", get_args(Schedule))
    vs = fixed.get("virtual_stages")
    if "1f1b" in scheds and (vs is None or 1 in vs):
        out.append(("1f1b", 1))
    if "interleaved" in scheds:
        total = split_total(arch, pp_partition)
        out += [("interleaved", v) for v in _divisors(total) if v >= 2 and (vs is None or v in vs)]
    return out


def _values(fixed: Mapping[str, tuple[Any, ...]], key: str, default: Iterable[Any]) -> list[Any]:
    default = list(default)
    if key not in fixed:
        return default
    allowed = set(fixed[key])
    return [v for v in default if v in allowed]


def _enumerate(
    arch: ArchSpec,
    space: SearchSpace,
    worlds: Sequence[tuple[int, int]],
    limit: float,
    terms: _Terms,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[int, Counter, list[_Survivor]]:
    """Walk the tree, counting pruned subtrees by reason; returns (considered, pruned, survivors).

    The space of one world W: every (tp, pp, cp) whose product divides W (dp = W / (tp pp cp)),
    ep dividing n_experts, sp on/off, ZeRO 0-3, micro-batch dividing the global batch, the three
    recomputation modes, and 1F1B plus interleaving with every v >= 2 dividing the layers the split counts
    (:func:`split_total`); pp and v where the split (:meth:`_Terms.layers_of`, :meth:`_Terms.interleaves`) holds."""
    fx, seq, GB = space.fixed, space.seq, space.global_batch
    eps = _values(fx, "ep", _divisors(arch.n_experts))
    sps = _values(fx, "sp", (False, True))
    zeros = _values(fx, "zero", ZERO_STAGES)
    mbs = _values(fx, "micro_batch", _divisors(GB))
    # the three modes, or the fixed values in their order (Megatron-Core's modules too, which no default holds)
    rcs = list(fx.get("recompute", RECOMPUTE_MODES))
    scheds = _schedules(arch, fx, space.pp_partition)
    n_rs = len(rcs) * len(scheds)
    n_mb = len(mbs) * n_rs
    n_z = len(zeros) * n_mb
    n_sp = len(sps) * n_z
    n_ep = len(eps) * n_sp
    tp_ok = set(arch.tp_choices())
    pruned: Counter = Counter()
    survivors: list[_Survivor] = []
    considered = 0
    trees = [
        (
            wi,
            nodes * g,
            g,
            tp,
            [
                (pp, cp)
                for pp in _values(fx, "pp", _divisors(nodes * g // tp))
                for cp in _values(fx, "cp", _divisors(nodes * g // (tp * pp)))
            ],
        )
        for wi, (nodes, g) in enumerate(worlds)
        for tp in _values(fx, "tp", _divisors(nodes * g))
    ]
    total = sum(len(pairs) for *_, pairs in trees) * n_ep
    for wi, world, g, tp, pairs in trees:
        subtree = len(pairs) * n_ep
        considered += subtree
        if progress:
            progress("enumerate", considered, total)
        if space.max_tp is not None and tp > space.max_tp:
            pruned["max_tp"] += subtree
            continue
        if space.tp_within_node and g % tp:
            pruned["tp_within_node"] += subtree
            continue
        if tp not in tp_ok:
            pruned["tp_arch"] += subtree
            continue
        for pp, cp in pairs:
            if terms.layers_of(pp) is None:
                pruned["pp_layers"] += n_ep
                continue
            if cp > 1 and seq % (2 * cp):
                pruned["cp_seq"] += n_ep
                continue
            if space.aligned_groups and not all(g % n == 0 or n % g == 0 for n in (tp, tp * cp, world // pp)):
                pruned["node_straddle"] += n_ep
                continue
            dp = world // (tp * pp * cp)
            for ep in eps:
                if ep > 1 and (dp * cp) % ep:
                    pruned["ep_dp"] += n_sp
                    continue
                for sp in sps:
                    if sp and tp == 1:
                        pruned["sp_tp1"] += n_z
                        continue
                    if sp and (seq // cp) % tp:
                        pruned["sp_seq"] += n_z
                        continue
                    for zero in zeros:
                        if zero == 3 and pp > 1:
                            pruned["zero3_pp"] += n_mb
                            continue
                        if terms.states_bound(tp, pp, dp, cp, ep, zero) > limit:
                            pruned["mem_states"] += n_mb
                            continue
                        for mb in mbs:
                            if GB % (mb * dp):
                                pruned["global_batch"] += n_rs
                                continue
                            m = GB // (mb * dp)
                            ok_scheds = []
                            for sched, v in scheds:
                                if sched == "interleaved":
                                    reason = (
                                        "interleaved_pp1"
                                        if pp == 1
                                        else "interleaved_layers"
                                        if not terms.interleaves(pp, v)
                                        else "interleaved_m"
                                        if m % pp
                                        else None
                                    )
                                    if reason:
                                        pruned[reason] += len(rcs)
                                        continue
                                ok_scheds.append(v)
                            for rc in rcs:
                                for v in ok_scheds:
                                    mem = terms.memory(tp, pp, dp, cp, ep, sp, zero, mb, rc, m, v)
                                    if mem > limit:
                                        pruned["mem_total"] += 1
                                        continue
                                    survivors.append(_Survivor(wi, tp, pp, cp, ep, sp, zero, mb, rc, v, mem))
    return considered, pruned, survivors


# --------------------------------------------------------------------------- stage 2: compile


def _compile(
    terms: _Terms,
    survivors: Sequence[_Survivor],
    kernels: KernelCostModel,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[dict[str, int], int, int, float]:
    """Build every distinct graph of the survivors, price all their kernels (and optimizer steps)
    in one lookup, and cost each graph per phase into ``terms``. Returns kernels by source, the
    counts of distinct graphs and kernels, and the seconds of the lookup."""
    arch, device, space, worlds = terms.arch, terms.device, terms.space, terms.worlds
    prec = precision_of(
        space.precision, None, space.framework, fp8_recipe=space.fp8_recipe, device=device, training=True
    )
    seq, attn = space.seq, space.attention
    block_keys: dict[tuple, None] = {}
    extras_keys: dict[tuple, None] = {}
    layouts: dict[tuple, None] = {}
    for s in survivors:
        g = worlds[s.wi][1]
        block_keys[(_block_key(s.tp, s.cp, s.ep, s.sp, s.mb, s.rc), g)] = None
        layouts[(s.wi, s.tp, s.pp, s.cp, s.ep, s.zero)] = None
        for stage in stage_kinds(s.pp):
            extras_keys[(_extras_key(s.tp, s.cp, s.sp, s.mb, stage == 0, stage == s.pp - 1), g)] = None
    numels: dict[int, None] = {}
    for wi, tp, pp, cp, ep, zero in layouts:
        dp = worlds[wi][0] * worlds[wi][1] // (tp * pp * cp)
        for stage in terms.kinds(pp):
            numels[terms.numel(tp, pp, dp, cp, ep, zero, stage)] = None
    graphs: dict[tuple, Graph] = {}
    todo = len(block_keys) + len(extras_keys)
    for i, (key, _g) in enumerate(block_keys):
        if key not in graphs:
            _, tp, cp, ep, sp, mb, rc = key
            graphs[key] = train_block(
                arch, tp=tp, batch=mb, seq=seq, sp=sp, cp=cp, ep=ep, attention=attn, recompute=rc, prec=prec
            )
        if progress and i % 256 == 0:
            progress("compile", i, todo)
    for key, _g in extras_keys:
        if key not in graphs:
            _, tp, cp, sp, mb, first, last = key
            graphs[key] = train_extras(arch, tp=tp, batch=mb, seq=seq, sp=sp, cp=cp, first=first, last=last, prec=prec)
    if progress:
        progress("compile", todo, todo)
    wanted = [n.kernel for gr in graphs.values() for nodes in gr.nodes.values() for n in nodes]

    def overlap_tp(key: tuple) -> bool:  # TE's userbuffers overlap runs where sequence parallelism does
        return space.tp_overlap(key[4 if key[0] == "block" else 3])

    for key, gr in graphs.items():
        if overlap_tp(key):  # the chunk GEMMs TE's userbuffers overlap runs instead, as run_train prices them
            wanted += overlap_kernels(gr, key[1], ub_configs(None))
    opt_kernels = {numel: optimizer_kernel(numel) for numel in numels}
    wanted += opt_kernels.values()
    for _, tp, _, _, ep, _ in layouts:
        if (tp, ep) not in terms.casts:
            terms.casts[(tp, ep)] = weight_casts(arch, tp=tp, ep=ep, prec=prec)
    wanted += [n.kernel for casts in terms.casts.values() for n in casts]
    fsdp: dict[tuple, tuple[tuple[Node, ...], tuple[Node, ...], int]] = {}
    if terms.fsdp:
        for wi, tp, pp, cp, ep, zero in layouts:
            if zero == 3:
                dp = worlds[wi][0] * worlds[wi][1] // (tp * pp * cp)
                for stage in stage_kinds(pp):
                    fsdp.setdefault(
                        (tp, pp, ep, dp, stage), _fsdp_kernels(terms, tp=tp, pp=pp, ep=ep, dp=dp, stage=stage)
                    )
        wanted += [n.kernel for per_layer, rest, _ in fsdp.values() for n in (*per_layer, *rest)]
    unique = list(dict.fromkeys(wanted))
    t0 = time.perf_counter()
    table = kernels.lookup(unique, device)  # the one batched prediction of the whole space
    if space.clocks == "sustained":  # as run_train prices a step
        table = sustained_times(table, device, unique)[0]
    lookup_s = time.perf_counter() - t0
    by_source = Counter(table[k][1] for k in unique)
    # Graphs share the node and collective tuples of a phase they have in common (the forward and
    # backward of the three recomputation modes); each shared phase is costed once. ``graphs``
    # keeps every tuple alive, so their ids identify them for this loop.
    costed: dict[tuple, PhaseCost] = {}
    for key, g in (*block_keys, *extras_keys):
        tp, cp = key[1], key[2]
        ep = key[3] if key[0] == "block" else 1
        groups = graph_groups(*model_parallel_groups(tp=tp, cp=cp, ep=ep, gpus_per_node=g))
        ep_call = ep_dispatch(space.moe_dispatcher, arch, groups["ep"].nodes)
        graph = graphs[key]
        phases = {}
        for phase in (FWD, BWD, RECOMPUTE):
            shared = (id(graph.nodes[phase]), id(graph.comms[phase]), tp, cp, ep, g, overlap_tp(key))
            cost = costed.get(shared)
            if cost is None:
                cost = costed[shared] = phase_cost(
                    graph, phase, groups, table, terms.comms, device, tp_comm_overlap=overlap_tp(key), ep=ep_call
                )
            phases[phase] = cost
        terms.graph_costs[(key, g)] = phases
    terms.opt_s.update({numel: table[k][0] for numel, k in opt_kernels.items()})
    terms.cast_times.update({n.kernel: table[n.kernel] for casts in terms.casts.values() for n in casts})
    terms.fsdp_s.update(
        {key: fsdp_gradient_s(per_layer, rest, table, layers) for key, (per_layer, rest, layers) in fsdp.items()}
    )
    for rc in {s.rc for s in survivors}:
        terms.model_flops[rc] = model_flops(
            arch, seq=seq, global_batch=space.global_batch, precision=space.precision, attention=attn, recompute=rc
        )[0]
    return dict(sorted(by_source.items())), len(graphs), len(unique), lookup_s


def _fsdp_kernels(
    terms: _Terms, *, tp: int, pp: int, ep: int, dp: int, stage: int
) -> tuple[tuple[Node, ...], tuple[Node, ...], int]:
    """(per block, rest of the stage, blocks) torch FSDP flat-gradient kernels of a ZeRO-3 ``stage``, as
    ``run_train`` prices them (:func:`opcast.predict.training.fsdp_stage_kernels`; ZeRO-3 runs without a pipeline,
    so the stage holds every layer)."""
    per_layer, rest = fsdp_stage_kernels(
        terms.arch,
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        stage=stage,
        grad_bytes=terms.grad_b,
        framework=terms.space.framework,
        layers=terms.own(pp, stage),
    )
    return per_layer, rest, terms.count(pp, stage)


# --------------------------------------------------------------------------- stage 3: compose

_WORKER: _Terms | None = None
_WORK: list[_Survivor] = []


def _init_worker(terms: _Terms | None) -> None:
    global _WORKER
    if terms is not None:  # spawn: pickled here; fork: inherited as the module global
        _WORKER = terms


def _compose_chunk(chunk: tuple[int, int] | list[_Survivor]) -> array:
    """Iteration times of a slice of the inherited survivors (fork) or of the survivors sent (spawn)."""
    if _WORKER is None:
        raise RuntimeError("internal: a search worker started without its cost terms")
    items = _WORK[chunk[0] : chunk[1]] if isinstance(chunk, tuple) else chunk
    return array("d", map(_WORKER.iteration, items))


def _compose(
    terms: _Terms, survivors: list[_Survivor], workers: int, progress: Callable[[str, int, int], None] | None
) -> tuple[list[Candidate], int]:
    """Candidates of every survivor, serially or over ``workers`` processes. Forked workers inherit
    the terms and the survivors and send back iteration times only."""
    total = len(survivors)
    if workers <= 1 or total < POOL_MIN_CONFIGS:
        step = 8192
        times = array("d")
        for i in range(0, total, step):
            times.extend(map(terms.iteration, survivors[i : i + step]))
            if progress:
                progress("compose", len(times), total)
        return list(map(terms.candidate, survivors, times)), 1
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    global _WORKER, _WORK
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    forked = ctx.get_start_method() == "fork"
    # Contiguous chunks keep configurations that share memoised parts together.
    n_chunks = max(workers * 4, -(-total // 20_000))
    size = -(-total // n_chunks)
    bounds = [(i, min(total, i + size)) for i in range(0, total, size)]
    if forked:
        _WORKER, _WORK = terms, survivors
    results: list[array] = [array("d") for _ in bounds]
    done = 0
    try:
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(None if forked else terms,)
        ) as pool:
            futures = {
                pool.submit(_compose_chunk, b if forked else survivors[b[0] : b[1]]): i for i, b in enumerate(bounds)
            }
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                done += bounds[i][1] - bounds[i][0]
                if progress:
                    progress("compose", done, total)
    finally:
        if forked:
            _WORKER, _WORK = None, []
    times = array("d")
    for part in results:
        times.extend(part)
    return list(map(terms.candidate, survivors, times)), workers


# --------------------------------------------------------------------------- the search

MAX_WORKERS = 1024
"""Most processes a search may be asked for (--workers)."""
MAX_TOP = 1000
"""Most configurations a search re-predicts in full (--top): each is a complete run_train with its
op list (~4 ms and ~2 KB of JSON here), and a 1,024-GPU search of llama2-7b keeps 79,023 feasible
ones, which --top 100000 re-predicted for minutes into a JSON of ~140 MB. --csv lists every one."""


def default_workers() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def search(
    arch: ArchSpec,
    device: DeviceSpec,
    space: SearchSpace,
    *,
    kernels: KernelCostModel | None = None,
    top: int = 10,
    workers: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    cluster: str | None = None,
    comms: CollectiveCostModel | None = None,
) -> SearchResult:
    """Enumerate, prune, predict and rank every parallel configuration of ``space``.

    ``kernels`` defaults to the roofline fallback (the CLI passes the learned models); ``comms`` to
    the learned collectives of ``kernels``' model set for catalog ``cluster`` (``--cluster NAME``,
    :attr:`opcast.predict.options.Placement.cluster`) in front of alpha-beta; ``workers``
    to the cores available (a pool is only used above :data:`POOL_MIN_CONFIGS` survivors);
    ``progress(stage, done, total)`` is called as the enumerate, compile and compose stages advance. Raises
    :class:`OpcastError` for a malformed request, never for an empty result (``candidates`` is
    then empty and ``pruned`` says why)."""
    from opcast.predict.cost import roofline_only
    from opcast.predict.training import predict_train

    if not isinstance(top, int) or isinstance(top, bool) or top < 0:
        raise OpcastError(f"top={top!r} must be a non-negative integer")
    if top > MAX_TOP:
        raise OpcastError(
            f"--top {top} is past the {MAX_TOP:,} configurations a search predicts in full; "
            f"give --top {MAX_TOP} or less (--csv lists every feasible configuration)"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS
    ):
        raise OpcastError(f"workers={workers!r} must be a whole number of processes from 1 to {MAX_WORKERS}")
    worlds = _check_space(arch, device, space)
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    workers = default_workers() if workers is None else max(1, workers)
    limit = (
        float(device.mem_bytes)
        if space.max_mem_bytes is None
        else min(float(space.max_mem_bytes), float(device.mem_bytes))
    )
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    if comms is None:
        from opcast.predict.comm_learned import collective_cost_for

        comms = collective_cost_for(kernels, cluster=cluster)
    terms = _Terms(arch, device, space, worlds, comms)
    considered, pruned, survivors = _enumerate(arch, space, worlds, limit, terms, progress)
    t1 = time.perf_counter()
    seconds["enumerate"] = t1 - t0

    by_source, n_graphs, n_kernels, lookup_s = _compile(terms, survivors, kernels, progress)
    t2 = time.perf_counter()
    seconds["compile"] = t2 - t1 - lookup_s
    seconds["kernels"] = lookup_s

    candidates, used = _compose(terms, survivors, workers, progress)
    t3 = time.perf_counter()
    seconds["compose"] = t3 - t2

    candidates.sort(key=objective_key(space.objective))
    top_results = []
    worst = 0.0
    for c in candidates[:top]:
        r = predict_train(
            arch,
            device,
            c.train_config(space),
            nodes=c.nodes,
            gpus_per_node=c.gpus_per_node,
            kernels=kernels,
            comms=terms.comms,
        )
        if r.iteration_time_s is None:  # the search and run_train disagree on feasibility: a bug, not the input's
            raise RuntimeError(
                "internal: search kept a configuration run_train finds infeasible "
                f"({describe_config(c)}: {'; '.join(r.reasons)})"
            )
        worst = max(worst, abs(r.iteration_time_s - c.iteration_time_s) / r.iteration_time_s)
        top_results.append(r)
    seconds["rank"] = time.perf_counter() - t3
    ordered = {k: pruned[k] for k in REASONS if pruned.get(k)}
    return SearchResult(
        arch=arch,
        device=device,
        space=space,
        memory_limit_bytes=limit,
        worlds=tuple(worlds),
        considered=considered,
        pruned=ordered,
        candidates=tuple(candidates),
        top=tuple(top_results),
        seconds=seconds,
        unique_graphs=n_graphs,
        unique_kernels=n_kernels,
        kernels_by_source=by_source,
        workers=used,
        max_recheck_rel_diff=worst,
        cost_sources={**kernels.describe(), **terms.comms.describe()},
    )


# --------------------------------------------------------------------------- reporting helpers


def main_cost(result: TrainResult) -> tuple[str, float, str, float]:
    """(largest part, its share, largest overhead, its share) of a prediction's breakdown; an
    overhead is anything but forward and backward compute."""
    it = result.iteration_time_s or 1.0
    parts = result.breakdown_s
    big = max(parts, key=lambda k: parts[k])
    overheads = {k: v for k, v in parts.items() if k not in ("forward", "backward")}
    over = max(overheads, key=lambda k: overheads[k])
    return big, parts[big] / it, over, overheads[over] / it


def candidate_row(c: Candidate, rank: int) -> dict[str, Any]:
    """One CSV / JSON row of a candidate (units in the names)."""
    return {
        "rank": rank,
        "world_size": c.world_size,
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "tp": c.tp,
        "pp": c.pp,
        "dp": c.dp,
        "cp": c.cp,
        "ep": c.ep,
        "sp": c.sp,
        "micro_batch": c.micro_batch,
        "micro_batches": c.micro_batches,
        "recompute": c.recompute,
        "zero": c.zero,
        "schedule": c.schedule,
        "virtual_stages": c.virtual_stages,
        "iteration_time_s": c.iteration_time_s,
        "tokens_per_s": c.tokens_per_s,
        "mfu": c.mfu,
        "memory_per_gpu_bytes": c.memory_bytes,
        "gpu_hours_per_million_tokens": c.gpu_s_per_token * 1e6 / 3600,
    }


def describe_config(c: Candidate | TrainConfig) -> str:
    """``tp8 pp4 dp16 cp2 sp mb1 full z1 v2`` style."""
    parts = [f"tp{c.tp}", f"pp{c.pp}", f"dp{c.dp}"]
    if c.cp > 1:
        parts.append(f"cp{c.cp}")
    if c.ep > 1:
        parts.append(f"ep{c.ep}")
    if c.sp:
        parts.append("sp")
    parts += [f"mb{c.micro_batch}", c.recompute, f"z{c.zero}"]
    if c.schedule == "interleaved":
        parts.append(f"v{c.virtual_stages}")
    return " ".join(parts)


def search_to_dict(result: SearchResult) -> dict[str, Any]:
    """The ``--json`` document: the request, the counts by reason, timings and the top K in full."""
    space = result.space
    total_s = result.total_s
    top = []
    for rank, (c, r) in enumerate(zip(result.candidates, result.top), start=1):
        big, big_share, over, over_share = main_cost(r)
        worst = r.worst_memory
        top.append(
            {
                "rank": rank,
                "summary": describe_config(c),
                "config": {
                    **{
                        k: v
                        for k, v in candidate_row(c, rank).items()
                        if k
                        in (
                            "world_size",
                            "nodes",
                            "gpus_per_node",
                            "tp",
                            "pp",
                            "dp",
                            "cp",
                            "ep",
                            "sp",
                            "micro_batch",
                            "micro_batches",
                            "recompute",
                            "zero",
                            "schedule",
                            "virtual_stages",
                        )
                    },
                    "global_batch": space.global_batch,
                    "seq": space.seq,
                    "precision": space.precision,
                    "fp8_recipe": space.fp8_recipe,
                    "attention": space.attention,
                    "framework": space.framework,
                    "overlap_grad_reduce": space.overlap_grad_reduce,
                    # where the configuration runs them (Candidate.train_config's rule)
                    "overlap_param_gather": r.config.overlap_param_gather,
                    "tp_comm_overlap": r.config.tp_comm_overlap,
                    "overlap_p2p_comm": r.config.overlap_p2p_comm,
                    "pp_partition": space.pp_partition,
                    "pp_layers": list(r.layout.stage_layers) if r.layout is not None else None,
                },
                "iteration_time_s": r.iteration_time_s,
                "tokens_per_s": r.tokens_per_s,
                "mfu": r.mfu,
                "hfu": r.hfu,
                "gpu_hours_per_million_tokens": c.gpu_s_per_token * 1e6 / 3600,
                "memory_per_gpu_bytes": worst.total_bytes,
                "memory_breakdown_bytes": worst.breakdown(),
                "breakdown_s": dict(r.breakdown_s),
                "main_cost": {"part": big, "share": big_share},
                "largest_overhead": {"part": over, "share": over_share},
            }
        )
    return {
        "arch": result.arch.name,
        "gpu": result.device.name,
        "objective": space.objective,
        "space": {
            "gpus": space.gpus,
            "global_batch": space.global_batch,
            "seq": space.seq,
            "precision": space.precision,
            "fp8_recipe": space.fp8_recipe,
            "attention": space.attention,
            "framework": space.framework,
            "clocks": space.clocks,
            "max_tp": space.max_tp,
            "tp_within_node": space.tp_within_node,
            "max_mem_bytes": space.max_mem_bytes,
            "aligned_groups": space.aligned_groups,
            "overlap_grad_reduce": space.overlap_grad_reduce,
            "overlap_param_gather": space.overlap_param_gather,
            "tp_comm_overlap": space.tp_comm_overlap,
            "overlap_p2p_comm": space.overlap_p2p_comm,
            "pp_partition": space.pp_partition,
            "fixed": {k: list(v) for k, v in space.fixed.items()},
            "worlds": [{"nodes": n, "gpus_per_node": g, "world_size": n * g} for n, g in result.worlds],
        },
        "memory_limit_bytes": result.memory_limit_bytes,
        "considered": result.considered,
        "pruned_total": sum(result.pruned.values()),
        "pruned": {k: {"count": n, "reason": REASONS[k]} for k, n in result.pruned.items()},
        "predicted": result.predicted,
        "seconds": {**result.seconds, "total": total_s},
        "configs_per_s": result.considered / total_s if total_s else None,
        "predicted_per_s": result.predicted / total_s if total_s else None,
        "workers": result.workers,
        "unique_graphs": result.unique_graphs,
        "unique_kernels": result.unique_kernels,
        "kernels_by_source": result.kernels_by_source,
        "max_recheck_rel_diff": result.max_recheck_rel_diff,
        "cost_sources": result.cost_sources,
        "top": top,
    }


__all__ = [
    "REASONS",
    "Candidate",
    "Objective",
    "SearchResult",
    "SearchSpace",
    "candidate_row",
    "describe_config",
    "main_cost",
    "objective_key",
    "parse_fix",
    "search",
    "search_to_dict",
    "space_problems",
]
