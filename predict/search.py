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
3. **Compose** each survivor's iteration time from those sums: stage times, pipeline sends, the
   data-parallel tail, :func:`~opcast.predict.schedule.pipeline_time`; a few microseconds each,
   memoised across configurations that share a part, and spread over a process pool when there
   are more than :data:`POOL_MIN_CONFIGS` of them.
4. **Rank** by the objective and re-predict the top K with
   :func:`~opcast.predict.training.run_train` (the full breakdown) for the report.

Composition mirrors ``run_train`` and memory mirrors ``train_memory`` term for term, the same
operations in the same order, so the floats are identical: ``tests/unit/test_search.py`` holds
them together on a space that takes every branch, and every search re-checks its top K against
``run_train`` (:attr:`SearchResult.max_recheck_rel_diff`).

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

from opcast.archs import DROPOUT_FAMILIES, ArchSpec, padded_vocab
from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.predict.comm import Collective, CollectiveCostModel, Group, place
from opcast.predict.cost import Kernel, KernelCostModel, kernel
from opcast.predict.graph import BWD, FWD, RECOMPUTE, precision_of, train_block, train_extras
from opcast.predict.memory import (STATE_BYTES, ZERO3_PREFETCH_LAYERS, in_flight_layers, in_flight_micro_batches,
                                   layer_activation_bytes, stage_params)
from opcast.predict.parallel import (MEGATRON_MIN_BUCKET_PARAMS, AttentionImpl, Precision, Recompute, Schedule,
                                     TrainConfig, _device_reasons)
from opcast.predict.schedule import pipeline_time

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec
    from opcast.predict.training import TrainResult

Objective = Literal["throughput", "cost", "memory"]

POOL_MIN_CONFIGS = 60_000
"""Survivors below which composition stays in this process. Composition runs at ~50-100k
configurations/s per core; a forked pool costs ~0.1 s to start, starts with cold memo tables and
sends back one float per configuration, so on 2 cores it only pays off above ~50k survivors
(measured: 49k survivors 0.9 s serial, 0.8 s on 2 processes; 90k: 1.6 s vs 1.0 s)."""

RECOMPUTE_MODES: tuple[str, ...] = get_args(Recompute)
ZERO_STAGES = (0, 1, 2, 3)
GIB = 2**30

# Pruning reasons, in the order they are checked; a pruned configuration counts under the first.
REASONS: dict[str, str] = {
    "max_tp": "tp above --max-tp",
    "tp_within_node": "tp group spans nodes (--tp-within-node)",
    "tp_arch": "tp does not divide the heads, kv heads or ffn of the arch",
    "pp_layers": "pp does not divide n_layers",
    "cp_seq": "2 x cp does not divide seq (context-parallel chunks)",
    "node_straddle": "tp, tp x cp or tp x cp x dp groups straddle node boundaries (--allow-straddling)",
    "ep_dp": "ep does not divide dp x cp",
    "sp_tp1": "sequence parallelism needs tp > 1",
    "sp_seq": "sequence parallelism needs tp to divide seq / cp",
    "zero3_pp": "ZeRO-3 with pp > 1 is not supported",
    "mem_states": "weights, gradients and optimizer states alone exceed the memory limit",
    "global_batch": "global batch not a multiple of micro-batch x dp",
    "interleaved_pp1": "interleaved schedule needs pp > 1",
    "interleaved_layers": "interleaved: pp x virtual stages does not divide n_layers",
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
    attention: AttentionImpl = "flash"
    """Attention kernel."""
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
    fixed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Dimension -> the only values to enumerate (``--fix tp=8``); keys from :data:`FIXABLE`.
    Restricting a dimension shrinks the space; it does not count as pruning."""


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
    recompute: str
    zero: int
    schedule: str
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
        return TrainConfig(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, sp=self.sp,
                           micro_batch=self.micro_batch, global_batch=space.global_batch, seq=space.seq,
                           recompute=self.recompute, zero=self.zero, precision=space.precision,  # type: ignore[arg-type]
                           attention=space.attention, schedule=self.schedule,  # type: ignore[arg-type]
                           virtual_stages=self.virtual_stages, overlap_grad_reduce=space.overlap_grad_reduce)


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
        return (c.world_size, c.tp, c.pp, c.cp, c.ep, c.zero, RECOMPUTE_MODES.index(c.recompute), -c.micro_batch,
                c.virtual_stages, c.sp)

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
    if space.max_mem_bytes is not None and not (math.isfinite(space.max_mem_bytes) and space.max_mem_bytes > 0):
        problems.append(f"max_mem={space.max_mem_bytes / GIB:g} GiB must be a positive finite number")
    if space.objective not in get_args(Objective):
        problems.append(f"objective={space.objective!r} is not one of {', '.join(get_args(Objective))}")
    if space.attention not in get_args(AttentionImpl):
        problems.append(f"attention={space.attention!r} is not one of {', '.join(get_args(AttentionImpl))}")
    problems += _device_reasons(device, space.precision)
    problems += _fixed_problems(space.fixed)
    return problems


def _check_space(arch: ArchSpec, device: DeviceSpec, space: SearchSpace) -> list[tuple[int, int]]:
    """The (nodes, GPUs per node) of each world to search; every problem of the request at once
    as an :class:`OpcastError`."""
    problems = space_problems(device, space)
    if problems:
        raise OpcastError("; ".join(problems))
    if arch.position == "learned" and space.seq > arch.max_seq:
        raise OpcastError(f"seq={space.seq} exceeds max_seq={arch.max_seq} of {arch.name} (learned positions); "
                          "nothing to search")
    g = space.gpus_per_node or min(space.gpus, device.gpus_per_node)
    if space.gpus % g and space.gpus > g:
        raise OpcastError(f"--gpus {space.gpus} is not a whole number of {g}-GPU nodes; give --gpus-per-node")
    if space.objective != "cost":
        return [(max(1, space.gpus // g), min(g, space.gpus))]
    worlds = [w for w in _divisors(space.gpus) if w < g or w % g == 0]
    return [(w // g, g) if w >= g else (1, w) for w in worlds]


def _fixed_problems(fixed: Mapping[str, tuple[Any, ...]]) -> list[str]:
    problems = []
    for key, values in fixed.items():
        if key not in FIXABLE:
            problems.append(f"--fix {key}: unknown dimension; use one of {', '.join(FIXABLE)}")
            continue
        if not values:
            problems.append(f"--fix {key}: give at least one value")
        for v in values:
            if key == "sp":
                ok = isinstance(v, bool)
            elif key == "recompute":
                ok = v in RECOMPUTE_MODES
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
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not text.strip():
            problems.append(f"--fix takes KEY=V[,V...], e.g. --fix tp=4,8; got {item!r}")
            continue
        values: list[Any] = []
        for raw in (t.strip() for t in text.split(",")):
            if key == "sp":
                low = raw.lower()
                if low not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                    problems.append(f"--fix sp={raw!r}: use on or off")
                    continue
                values.append(low in ("on", "true", "1", "yes"))
            elif key in ("recompute", "schedule"):
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
    rc: str
    v: int
    mem: float


class _Memory:
    """Per-GPU memory, memoised by part. Mirrors :func:`opcast.predict.memory.train_memory` term
    for term (same operations, same order) for the stages that can be the fullest, the first and
    the last: a middle stage holds neither the embedding nor the head and no more in-flight
    activations than stage 0."""

    def __init__(self, arch: ArchSpec, space: SearchSpace) -> None:
        self.arch, self.space = arch, space
        self.act_dtype = "bf16" if space.precision == "fp8" else space.precision
        self.B = dtype_bytes(self.act_dtype)
        self.state_bytes = STATE_BYTES[space.precision]
        self._params: dict[tuple, Any] = {}
        self._states: dict[tuple, tuple[float, float, float, float]] = {}
        self._act: dict[tuple, float] = {}

    def params(self, tp: int, pp: int, ep: int, stage: int):
        key = (tp, pp, ep, stage)
        p = self._params.get(key)
        if p is None:
            p = self._params[key] = stage_params(self.arch, tp=tp, pp=pp, ep=ep, stage=stage)
        return p

    def states(self, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, stage: int) -> tuple[float, float, float, float]:
        """(weights, gradients, optimizer states, ZeRO-3 gather) bytes."""
        key = (tp, pp, dp, cp, ep, zero, stage)
        hit = self._states.get(key)
        if hit is None:
            params = self.params(tp, pp, ep, stage)
            w, g, o = self.state_bytes
            n_d, n_e = dp * cp, max(1, dp * cp // ep)

            def shard(per_param: float, sharded: bool) -> float:
                if not sharded:
                    return per_param * params.total
                return per_param * (params.dense / n_d + params.expert / n_e)

            gather = ZERO3_PREFETCH_LAYERS * w * params.per_layer if zero == 3 else 0.0
            hit = self._states[key] = (shard(w, zero >= 3), shard(g, zero >= 2), shard(o, zero >= 1), gather)
        return hit

    def states_bound(self, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int) -> float:
        """A lower bound of the peak: model states and the ZeRO-3 buffer, no activations."""
        best = 0.0
        for stage in {0, pp - 1}:
            w, g, o, gather = self.states(tp, pp, dp, cp, ep, zero, stage)
            best = max(best, w + g + o + gather)
        return best

    def per_layer(self, tp: int, sp: bool, mb: int, cp: int, ep: int, rc: str) -> float:
        key = (tp, sp, mb, cp, ep, rc)
        hit = self._act.get(key)
        if hit is None:
            hit = self._act[key] = layer_activation_bytes(
                self.arch, tp=tp, sp=sp, batch=mb, seq=self.space.seq, cp=cp, ep=ep, attention=self.space.attention,
                recompute=rc, dtype=self.act_dtype)
        return hit

    def total(self, tp: int, pp: int, dp: int, cp: int, ep: int, sp: bool, zero: int, mb: int, rc: str, m: int,
              v: int) -> float:
        """Peak bytes per GPU over the pipeline stages."""
        arch, seq = self.arch, self.space.seq
        per_layer = self.per_layer(tp, sp, mb, cp, ep, rc)
        working = self.per_layer(tp, sp, mb, cp, ep, "none") if rc == "full" else 0.0
        sbh = (seq // cp) * mb * arch.hidden
        div = tp if sp else 1
        best = 0.0
        for stage in ((0,) if pp == 1 else (0, pp - 1)):
            w, g, o, gather = self.states(tp, pp, dp, cp, ep, zero, stage)
            acts = per_layer * in_flight_layers(n_layers=arch.n_layers, pp=pp, stage=stage, micro_batches=m,
                                                virtual_stages=v)
            if stage == 0 and arch.family in DROPOUT_FAMILIES:
                acts += sbh / div * in_flight_micro_batches(pp=pp, stage=0, micro_batches=m, virtual_stages=v)
            if stage == pp - 1:
                acts += 2 * self.B * sbh / div + 4 * (seq // cp) * mb * padded_vocab(arch.vocab, tp) // tp
            total = w + g + o + acts + working + gather + 0.0
            best = max(best, total)
        return best


def _schedules(arch: ArchSpec, fixed: Mapping[str, tuple[Any, ...]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    scheds = fixed.get("schedule", get_args(Schedule))
    vs = fixed.get("virtual_stages")
    if "1f1b" in scheds and (vs is None or 1 in vs):
        out.append(("1f1b", 1))
    if "interleaved" in scheds:
        out += [("interleaved", v) for v in _divisors(arch.n_layers) if v >= 2 and (vs is None or v in vs)]
    return out


def _values(fixed: Mapping[str, tuple[Any, ...]], key: str, default: Iterable[Any]) -> list[Any]:
    default = list(default)
    if key not in fixed:
        return default
    allowed = set(fixed[key])
    return [v for v in default if v in allowed]


def _enumerate(arch: ArchSpec, space: SearchSpace, worlds: Sequence[tuple[int, int]], limit: float, memory: _Memory,
               progress: Callable[[str, int, int], None] | None = None) -> tuple[int, Counter, list[_Survivor]]:
    """Walk the tree, counting pruned subtrees by reason; returns (considered, pruned, survivors).

    The space of one world W: every (tp, pp, cp) whose product divides W (dp = W / (tp pp cp)),
    ep dividing n_experts, sp on/off, ZeRO 0-3, micro-batch dividing the global batch, the three
    recomputation modes, and 1F1B plus interleaving with every v >= 2 dividing n_layers."""
    fx, L, seq, GB = space.fixed, arch.n_layers, space.seq, space.global_batch
    eps = _values(fx, "ep", _divisors(arch.n_experts))
    sps = _values(fx, "sp", (False, True))
    zeros = _values(fx, "zero", ZERO_STAGES)
    mbs = _values(fx, "micro_batch", _divisors(GB))
    rcs = _values(fx, "recompute", RECOMPUTE_MODES)
    scheds = _schedules(arch, fx)
    n_rs = len(rcs) * len(scheds)
    n_mb = len(mbs) * n_rs
    n_z = len(zeros) * n_mb
    n_sp = len(sps) * n_z
    n_ep = len(eps) * n_sp
    tp_ok = set(arch.tp_choices())
    pruned: Counter = Counter()
    survivors: list[_Survivor] = []
    considered = 0
    trees = [(wi, nodes * g, g, tp, [(pp, cp) for pp in _values(fx, "pp", _divisors(nodes * g // tp))
                                     for cp in _values(fx, "cp", _divisors(nodes * g // (tp * pp)))])
             for wi, (nodes, g) in enumerate(worlds) for tp in _values(fx, "tp", _divisors(nodes * g))]
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
            if L % pp:
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
                        if memory.states_bound(tp, pp, dp, cp, ep, zero) > limit:
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
                                    reason = ("interleaved_pp1" if pp == 1 else "interleaved_layers" if L % (pp * v)
                                              else "interleaved_m" if m % pp else None)
                                    if reason:
                                        pruned[reason] += len(rcs)
                                        continue
                                ok_scheds.append(v)
                            for rc in rcs:
                                for v in ok_scheds:
                                    mem = memory.total(tp, pp, dp, cp, ep, sp, zero, mb, rc, m, v)
                                    if mem > limit:
                                        pruned["mem_total"] += 1
                                        continue
                                    survivors.append(_Survivor(wi, tp, pp, cp, ep, sp, zero, mb, rc, v, mem))
    return considered, pruned, survivors


# --------------------------------------------------------------------------- stage 2: compile

class _DevicePlan:
    """The only attribute of a plan :class:`opcast.predict.training._Pricer` reads."""

    __slots__ = ("device",)

    def __init__(self, device: DeviceSpec) -> None:
        self.device = device


def _stage_kinds(pp: int) -> tuple[int, ...]:
    return (0,) if pp == 1 else (0, pp - 1) if pp == 2 else (0, 1, pp - 1)


def _optimizer_numel(mem: _Memory, tp: int, pp: int, dp: int, cp: int, ep: int, zero: int, stage: int) -> int:
    """Mirrors ``training._optimizer_kernel``: the parameters this rank's Adam step updates."""
    params = mem.params(tp, pp, ep, stage)
    n_d = dp * cp
    numel = params.dense / (n_d if zero >= 1 else 1) + params.expert / (max(1, n_d // ep) if zero >= 1 else 1)
    return max(1, int(round(numel)))


def _optimizer_kernel(numel: int) -> Kernel:
    return kernel("optimizer", {"numel": numel}, "fp32", "fwd", False)


GraphTable = dict[tuple, tuple[float, tuple[float, float, float]]]
"""(graph key, phase, gpus per node) -> (kernel seconds, exposed (tp, cp, ep) collective seconds)
of one copy of the graph in that phase."""


def _compile(arch: ArchSpec, device: DeviceSpec, space: SearchSpace, worlds: Sequence[tuple[int, int]],
             survivors: Sequence[_Survivor], memory: _Memory, kernels: KernelCostModel, comms: CollectiveCostModel,
             progress: Callable[[str, int, int], None] | None = None
             ) -> tuple[GraphTable, dict[int, float], dict[str, int], int, int, float]:
    """Build every distinct graph of the survivors, price all their kernels in one lookup, and sum
    each graph per phase. Returns the graph table, optimizer seconds by numel, kernels by source,
    the counts of distinct graphs and kernels, and the seconds of the lookup."""
    from opcast.predict.training import _Pricer

    prec = precision_of(space.precision)
    seq, attn = space.seq, space.attention
    block_keys: dict[tuple, None] = {}
    extras_keys: dict[tuple, None] = {}
    layouts: dict[tuple, None] = {}
    for s in survivors:
        g = worlds[s.wi][1]
        block_keys[(s.tp, s.cp, s.ep, s.sp, s.mb, s.rc, g)] = None
        layouts[(s.wi, s.tp, s.pp, s.cp, s.ep, s.zero)] = None
        for stage in _stage_kinds(s.pp):
            extras_keys[(s.tp, s.cp, s.sp, s.mb, stage == 0, stage == s.pp - 1, g)] = None
    numels: dict[int, None] = {}
    for wi, tp, pp, cp, ep, zero in layouts:
        dp = worlds[wi][0] * worlds[wi][1] // (tp * pp * cp)
        for stage in _stage_kinds(pp):
            numels[_optimizer_numel(memory, tp, pp, dp, cp, ep, zero, stage)] = None
    graphs: dict[tuple, Any] = {}
    todo = len(block_keys) + len(extras_keys)
    for i, (tp, cp, ep, sp, mb, rc, _g) in enumerate(block_keys):
        key = ("block", tp, cp, ep, sp, mb, rc)
        if key not in graphs:
            graphs[key] = train_block(arch, tp=tp, batch=mb, seq=seq, sp=sp, cp=cp, ep=ep, attention=attn,
                                      recompute=rc, prec=prec)
        if progress and i % 256 == 0:
            progress("compile", i, todo)
    for tp, cp, sp, mb, first, last, _g in extras_keys:
        key = ("extras", tp, cp, sp, mb, first, last)
        if key not in graphs:
            graphs[key] = train_extras(arch, tp=tp, batch=mb, seq=seq, sp=sp, cp=cp, first=first, last=last, prec=prec)
    if progress:
        progress("compile", todo, todo)
    wanted = [n.kernel for gr in graphs.values() for nodes in gr.nodes.values() for n in nodes]
    opt_kernels = {numel: _optimizer_kernel(numel) for numel in numels}
    wanted += opt_kernels.values()
    unique = list(dict.fromkeys(wanted))
    t0 = time.perf_counter()
    table = kernels.lookup(unique, device)  # the one batched prediction of the whole space
    lookup_s = time.perf_counter() - t0
    by_source = Counter(table[k][1] for k in unique)
    pricer = _Pricer(_DevicePlan(device), kernels, comms, keep_lines=False)  # type: ignore[arg-type]
    out: GraphTable = {}
    for keyset, kind in ((block_keys, "block"), (extras_keys, "extras")):
        for key in keyset:
            g = key[-1]
            tp, cp = key[0], key[1]
            ep = key[2] if kind == "block" else 1
            graph = graphs[(kind, *key[:-1])]
            grp = place(tp, 1, g)
            groups = {"tp": grp, "embed_tp": grp, "head_tp": grp, "ce_tp": grp, "cp": place(cp, tp, g),
                      "ep": place(ep, tp, g)}
            for phase in (FWD, BWD, RECOMPUTE):
                t, roles = pricer.kernels_s(graph, phase, 0, 1, 1)
                fam = pricer.comms_s(graph, phase, groups, roles, 0, 1, 1)
                out[((kind, *key[:-1]), phase, g)] = (t, (fam["tp"], fam["cp"], fam["ep"]))
    opt_s = {numel: table[k][0] for numel, k in opt_kernels.items()}
    return out, opt_s, dict(sorted(by_source.items())), len(graphs), len(unique), lookup_s


# --------------------------------------------------------------------------- stage 3: compose

class _Composer:
    """Iteration time of a survivor from the graph table: mirrors ``training._stage_time`` and
    ``run_train`` term for term, memoising the parts configurations share (the compute of a stage
    across ZeRO stages and schedules, the data-parallel collectives across everything but the
    layout and ZeRO stage, the pipeline sends across recomputation modes and ZeRO stages)."""

    def __init__(self, arch: ArchSpec, device: DeviceSpec, space: SearchSpace, worlds: Sequence[tuple[int, int]],
                 graph_table: GraphTable, opt_s: dict[int, float], model_flops: dict[str, float], memory: _Memory) -> None:
        self.arch, self.device, self.space, self.worlds = arch, device, space, tuple(worlds)
        self.graph_table, self.opt_s, self.model_flops, self.memory = graph_table, opt_s, model_flops, memory
        prec = precision_of(space.precision)
        self.grad_b = dtype_bytes(prec.act)
        self.peak = device.peak_flops(space.precision, tensor_cores=prec.peak_tensor_cores())
        self.comms = CollectiveCostModel()
        self._compute: dict[tuple, tuple] = {}
        self._sync: dict[tuple, tuple] = {}
        self._p2p: dict[tuple, tuple[float, ...]] = {}

    def __getstate__(self) -> dict[str, Any]:  # memo tables stay behind: a worker builds its own
        state = dict(self.__dict__)
        state.update(_compute={}, _sync={}, _p2p={}, comms=CollectiveCostModel())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- parts

    def compute(self, tp: int, pp: int, cp: int, ep: int, sp: bool, mb: int, rc: str, stage: int, g: int) -> tuple:
        """(forward, backward, recompute, tp comm, cp comm, ep comm) seconds per micro-batch."""
        key = (tp, pp, cp, ep, sp, mb, rc, stage, g)
        hit = self._compute.get(key)
        if hit is not None:
            return hit
        layers = self.arch.n_layers // pp
        bkey = ("block", tp, cp, ep, sp, mb, rc)
        ekey = ("extras", tp, cp, sp, mb, stage == 0, stage == pp - 1)
        phase_s = {FWD: 0.0, BWD: 0.0, RECOMPUTE: 0.0}
        comm_s = [0.0, 0.0, 0.0]
        table = self.graph_table
        for gkey, repeat in ((bkey, layers), (ekey, 1)):
            for phase in (FWD, BWD, RECOMPUTE):
                t, fams = table[(gkey, phase, g)]
                phase_s[phase] += repeat * t
                for i in range(3):
                    comm_s[i] += repeat * fams[i]
        hit = self._compute[key] = (phase_s[FWD], phase_s[BWD], phase_s[RECOMPUTE], comm_s[0], comm_s[1], comm_s[2])
        return hit

    def sync(self, tp: int, pp: int, cp: int, ep: int, zero: int, stage: int, wi: int) -> tuple:
        """The data-parallel collectives of a stage that do not depend on its compute: ZeRO-3's
        per-layer (all-gather, reduce-scatter) or the bucketed (reduce total, last bucket, gather
        total, all of it); the tied-embedding all-reduce (or None); the optimizer step."""
        key = (tp, pp, cp, ep, zero, stage, wi)
        hit = self._sync.get(key)
        if hit is not None:
            return hit
        from opcast.predict.training import _bucketed_s

        nodes, g = self.worlds[wi]
        dp = nodes * g // (tp * pp * cp)
        arch, comms, device, grad_b = self.arch, self.comms, self.device, self.grad_b
        params = self.memory.params(tp, pp, ep, stage)
        dp_group = place(dp * cp, tp, g)
        if zero == 3 and dp_group.size > 1:
            ag = comms.time_s(Collective("all_gather", params.per_layer * grad_b, dp_group), device)[0]
            rs = comms.time_s(Collective("reduce_scatter", params.per_layer * grad_b, dp_group), device)[0]
            parts: tuple = ("zero3", ag, rs)
        else:
            expert_dp_group = place(dp * cp // ep, tp * ep, g)
            bucket = max(MEGATRON_MIN_BUCKET_PARAMS, 1_000_000 * dp)
            reduce_kind = "all_reduce" if zero == 0 else "reduce_scatter"
            pr = _CommsOnly(comms, device)
            tot_d, last_d = _bucketed_s(pr, reduce_kind, params.dense, grad_b, dp_group, bucket)  # type: ignore[arg-type]
            tot_e, last_e = _bucketed_s(pr, reduce_kind, params.expert, grad_b, expert_dp_group, bucket)  # type: ignore[arg-type]
            reduce_total, last = tot_d + tot_e, max(last_d, last_e)
            gather_total = 0.0
            if zero in (1, 2):
                g_d = _bucketed_s(pr, "all_gather", params.dense, grad_b, dp_group, bucket)[0]  # type: ignore[arg-type]
                g_e = _bucketed_s(pr, "all_gather", params.expert, grad_b, expert_dp_group, bucket)[0]  # type: ignore[arg-type]
                gather_total = g_d + g_e
            parts = ("buckets", reduce_total, last, gather_total, reduce_total + gather_total)
        tied_s = None
        if arch.tied_embeddings and pp > 1 and stage in (0, pp - 1):
            tied = Collective("all_reduce", padded_vocab(arch.vocab, tp) // tp * arch.hidden * grad_b,
                              place(2, (pp - 1) * tp * cp * dp, g))
            tied_s = comms.time_s(tied, device)[0]
        opt = self.opt_s[_optimizer_numel(self.memory, tp, pp, dp, cp, ep, zero, stage)]
        hit = self._sync[key] = (parts, tied_s, opt)
        return hit

    def tail(self, pp: int, rc: str, sync: tuple, comp: tuple) -> tuple[float, float, float]:
        """(ZeRO-3 exposed per micro-batch, exposed data-parallel sync, optimizer) seconds of a
        stage: what of ``sync`` its compute ``comp`` does not hide."""
        parts, tied_s, opt = sync
        fwd_s, bwd_s, rec_s = comp[0], comp[1], comp[2]
        zero3_s = 0.0
        dp_exposed = 0.0
        if parts[0] == "zero3":
            _, ag, rs = parts
            layers = self.arch.n_layers // pp
            gathers = 3 if rc == "full" else 2
            fwd_layer = fwd_s / layers
            bwd_layer = (bwd_s + rec_s) / layers
            zero3_fwd = layers * max(0.0, ag - fwd_layer)
            zero3_s = zero3_fwd + layers * max(0.0, (gathers - 1) * ag + rs - bwd_layer)
        else:
            _, reduce_total, last, gather_total, dp_total = parts
            window = bwd_s + rec_s
            reduce_exposed = max(last, reduce_total - window) if self.space.overlap_grad_reduce else reduce_total
            dp_exposed = min(dp_total, reduce_exposed + gather_total)
        if tied_s is not None:
            dp_exposed += tied_s
        return zero3_s, dp_exposed, opt

    def p2p(self, act: int, pp: int, v: int, stride: int, g: int) -> tuple[float, ...]:
        """Pipeline-send seconds per micro-batch of every stage (mirrors ``training._p2p_s``)."""
        key = (act, pp, v, stride, g)
        hit = self._p2p.get(key)
        if hit is not None:
            return hit
        comms, device = self.comms, self.device
        out = []
        for stage in range(pp):
            total = 0.0
            if pp > 1:
                for target, sends in (((stage + 1) % pp, v - (stage == pp - 1)), ((stage - 1) % pp, v - (stage == 0))):
                    if sends <= 0:
                        continue
                    same_node = (stage * stride) // g == (target * stride) // g
                    call = Collective("send_recv", act, Group(2, 1, 2) if same_node else Group(2, 2, 1))
                    total += sends * comms.time_s(call, device)[0]
            out.append(total)
        hit = self._p2p[key] = tuple(out)
        return hit

    # -- one configuration

    def iteration(self, s: _Survivor) -> float:
        """Iteration seconds of a survivor."""
        arch, space = self.arch, self.space
        nodes, g = self.worlds[s.wi]
        tp, pp, cp, ep, sp, mb, rc, zero, v = s.tp, s.pp, s.cp, s.ep, s.sp, s.mb, s.rc, s.zero, s.v
        dp = nodes * g // (tp * pp * cp)
        m = space.global_batch // (mb * dp)
        act = mb * (space.seq // cp) * arch.hidden * self.grad_b // tp
        p2p = self.p2p(act, pp, v, tp * cp * dp, g)
        per_mb: dict[int, float] = {}
        max_tail = -math.inf
        base1 = zero3_1 = 0.0
        for stage in _stage_kinds(pp):
            comp = self.compute(tp, pp, cp, ep, sp, mb, rc, stage, g)
            zero3_s, dp_exposed, opt = self.tail(pp, rc, self.sync(tp, pp, cp, ep, zero, stage, s.wi), comp)
            base = comp[0] + comp[1] + comp[2] + comp[3] + comp[4] + comp[5]
            per_mb[stage] = base + p2p[stage] + zero3_s
            max_tail = max(max_tail, opt + dp_exposed)
            if stage == 1:
                base1, zero3_1 = base, zero3_s
        if pp > 3:
            stage_s = [per_mb[0], per_mb[1], *(base1 + p2p[i] + zero3_1 for i in range(2, pp - 1)), per_mb[pp - 1]]
        else:
            stage_s = [per_mb[i] for i in range(pp)]
        pipe = pipeline_time(stage_s, m, v)
        return pipe.time_s + max_tail

    def candidate(self, s: _Survivor, it: float) -> Candidate:
        """The candidate of a survivor whose iteration takes ``it`` seconds."""
        nodes, g = self.worlds[s.wi]
        dp = nodes * g // (s.tp * s.pp * s.cp)
        space = self.space
        m = space.global_batch // (s.mb * dp)
        world = nodes * g
        return Candidate(tp=s.tp, pp=s.pp, dp=dp, cp=s.cp, ep=s.ep, sp=s.sp, micro_batch=s.mb, micro_batches=m,
                         recompute=s.rc, zero=s.zero, schedule="interleaved" if s.v > 1 else "1f1b",
                         virtual_stages=s.v, nodes=nodes, gpus_per_node=g, iteration_time_s=it,
                         tokens_per_s=space.global_batch * space.seq / it,
                         mfu=self.model_flops[s.rc] / (it * world * self.peak), memory_bytes=s.mem)


class _CommsOnly:
    """What ``training._bucketed_s`` reads of a pricer."""

    __slots__ = ("comms", "device")

    def __init__(self, comms: CollectiveCostModel, device: DeviceSpec) -> None:
        self.comms, self.device = comms, device


_WORKER: _Composer | None = None
_WORK: list[_Survivor] = []


def _init_worker(composer: _Composer | None) -> None:
    global _WORKER
    if composer is not None:  # spawn: pickled here; fork: inherited as the module global
        _WORKER = composer


def _compose_chunk(chunk: tuple[int, int] | list[_Survivor]) -> array:
    """Iteration times of a slice of the inherited survivors (fork) or of the survivors sent (spawn)."""
    assert _WORKER is not None
    items = _WORK[chunk[0]:chunk[1]] if isinstance(chunk, tuple) else chunk
    return array("d", map(_WORKER.iteration, items))


def _compose(composer: _Composer, survivors: list[_Survivor], workers: int,
             progress: Callable[[str, int, int], None] | None) -> tuple[list[Candidate], int]:
    """Candidates of every survivor, serially or over ``workers`` processes. Forked workers inherit
    the composer and the survivors and send back iteration times only."""
    total = len(survivors)
    if workers <= 1 or total < POOL_MIN_CONFIGS:
        step = 8192
        times = array("d")
        for i in range(0, total, step):
            times.extend(map(composer.iteration, survivors[i:i + step]))
            if progress:
                progress("compose", len(times), total)
        return list(map(composer.candidate, survivors, times)), 1
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
        _WORKER, _WORK = composer, survivors
    results: list[array] = [array("d") for _ in bounds]
    done = 0
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(None if forked else composer,)) as pool:
            futures = {pool.submit(_compose_chunk, b if forked else survivors[b[0]:b[1]]): i
                       for i, b in enumerate(bounds)}
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
    return list(map(composer.candidate, survivors, times)), workers


# --------------------------------------------------------------------------- the search

MAX_WORKERS = 1024
"""Most processes a search may be asked for (--workers)."""


def default_workers() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def search(arch: ArchSpec, device: DeviceSpec, space: SearchSpace, *, kernels: KernelCostModel | None = None,
           top: int = 10, workers: int | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Enumerate, prune, predict and rank every parallel configuration of ``space``.

    ``kernels`` defaults to the roofline fallback (the CLI passes the learned models); ``workers``
    to the cores available (a pool is only used above :data:`POOL_MIN_CONFIGS` survivors);
    ``progress(stage, done, total)`` is called as the enumerate, compile and compose stages advance. Raises
    :class:`OpcastError` for a malformed request, never for an empty result (``candidates`` is
    then empty and ``pruned`` says why)."""
    from opcast.predict.cost import roofline_only
    from opcast.predict.training import _model_flops, predict_train

    if not isinstance(top, int) or isinstance(top, bool) or top < 0:
        raise OpcastError(f"top={top!r} must be a non-negative integer")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS):
        raise OpcastError(f"workers={workers!r} must be a whole number of processes from 1 to {MAX_WORKERS}")
    worlds = _check_space(arch, device, space)
    kernels = kernels or roofline_only("no kernel models given: roofline fallback")
    workers = default_workers() if workers is None else max(1, workers)
    limit = float(device.mem_bytes) if space.max_mem_bytes is None else min(float(space.max_mem_bytes), float(device.mem_bytes))
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    memory = _Memory(arch, space)
    considered, pruned, survivors = _enumerate(arch, space, worlds, limit, memory, progress)
    t1 = time.perf_counter()
    seconds["enumerate"] = t1 - t0

    comms = CollectiveCostModel()
    graph_table, opt_s, by_source, n_graphs, n_kernels, lookup_s = _compile(arch, device, space, worlds, survivors,
                                                                            memory, kernels, comms, progress)
    model_flops = {}
    for rc in {s.rc for s in survivors}:
        cfg = TrainConfig(seq=space.seq, global_batch=space.global_batch, precision=space.precision, attention=space.attention,
                          recompute=rc)  # type: ignore[arg-type]
        model_flops[rc] = _model_flops(arch, cfg)[0]
    t2 = time.perf_counter()
    seconds["compile"] = t2 - t1 - lookup_s
    seconds["kernels"] = lookup_s

    composer = _Composer(arch, device, space, worlds, graph_table, opt_s, model_flops, memory)
    composer.comms = comms
    candidates, used = _compose(composer, survivors, workers, progress)
    t3 = time.perf_counter()
    seconds["compose"] = t3 - t2

    candidates.sort(key=objective_key(space.objective))
    top_results = []
    worst = 0.0
    for c in candidates[:top]:
        r = predict_train(arch, device, c.train_config(space), nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                          kernels=kernels, comms=comms)
        if r.iteration_time_s is None:  # the search and run_train disagree on feasibility: a bug
            raise OpcastError(f"internal: search kept an infeasible configuration ({'; '.join(r.reasons)})")
        worst = max(worst, abs(r.iteration_time_s - c.iteration_time_s) / r.iteration_time_s)
        top_results.append(r)
    seconds["rank"] = time.perf_counter() - t3
    ordered = {k: pruned[k] for k in REASONS if pruned.get(k)}
    return SearchResult(
        arch=arch, device=device, space=space, memory_limit_bytes=limit, worlds=tuple(worlds), considered=considered,
        pruned=ordered, candidates=tuple(candidates), top=tuple(top_results), seconds=seconds, unique_graphs=n_graphs,
        unique_kernels=n_kernels, kernels_by_source=by_source, workers=used, max_recheck_rel_diff=worst,
        cost_sources={**kernels.describe(), **comms.describe()})


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
    return {"rank": rank, "world_size": c.world_size, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
            "tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "ep": c.ep, "sp": c.sp, "micro_batch": c.micro_batch,
            "micro_batches": c.micro_batches, "recompute": c.recompute, "zero": c.zero, "schedule": c.schedule,
            "virtual_stages": c.virtual_stages, "iteration_time_s": c.iteration_time_s, "tokens_per_s": c.tokens_per_s,
            "mfu": c.mfu, "memory_per_gpu_bytes": c.memory_bytes,
            "gpu_hours_per_million_tokens": c.gpu_s_per_token * 1e6 / 3600}


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
        top.append({
            "rank": rank, "summary": describe_config(c),
            "config": {**{k: v for k, v in candidate_row(c, rank).items()
                          if k in ("world_size", "nodes", "gpus_per_node", "tp", "pp", "dp", "cp", "ep", "sp",
                                   "micro_batch", "micro_batches", "recompute", "zero", "schedule", "virtual_stages")},
                       "global_batch": space.global_batch, "seq": space.seq, "precision": space.precision,
                       "attention": space.attention, "overlap_grad_reduce": space.overlap_grad_reduce},
            "iteration_time_s": r.iteration_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "hfu": r.hfu,
            "gpu_hours_per_million_tokens": c.gpu_s_per_token * 1e6 / 3600,
            "memory_per_gpu_bytes": worst.total_bytes, "memory_breakdown_bytes": worst.breakdown(),
            "breakdown_s": dict(r.breakdown_s), "main_cost": {"part": big, "share": big_share},
            "largest_overhead": {"part": over, "share": over_share},
        })
    return {
        "arch": result.arch.name, "gpu": result.device.name, "objective": space.objective,
        "space": {"gpus": space.gpus, "global_batch": space.global_batch, "seq": space.seq,
                  "precision": space.precision, "attention": space.attention, "max_tp": space.max_tp,
                  "tp_within_node": space.tp_within_node, "max_mem_bytes": space.max_mem_bytes,
                  "aligned_groups": space.aligned_groups,
                  "overlap_grad_reduce": space.overlap_grad_reduce,
                  "fixed": {k: list(v) for k, v in space.fixed.items()},
                  "worlds": [{"nodes": n, "gpus_per_node": g, "world_size": n * g} for n, g in result.worlds]},
        "memory_limit_bytes": result.memory_limit_bytes, "considered": result.considered,
        "pruned_total": sum(result.pruned.values()),
        "pruned": {k: {"count": n, "reason": REASONS[k]} for k, n in result.pruned.items()},
        "predicted": result.predicted, "seconds": {**result.seconds, "total": total_s},
        "configs_per_s": result.considered / total_s if total_s else None,
        "predicted_per_s": result.predicted / total_s if total_s else None,
        "workers": result.workers, "unique_graphs": result.unique_graphs, "unique_kernels": result.unique_kernels,
        "kernels_by_source": result.kernels_by_source, "max_recheck_rel_diff": result.max_recheck_rel_diff,
        "cost_sources": result.cost_sources, "top": top,
    }


__all__ = ["Candidate", "Objective", "REASONS", "SearchResult", "SearchSpace", "candidate_row", "describe_config",
           "main_cost", "objective_key", "parse_fix", "search", "search_to_dict", "space_problems"]

