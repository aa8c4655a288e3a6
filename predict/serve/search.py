"""``opcast search serve``: the best serving deployment of a model on up to a number of GPUs for a
request stream and latency SLOs.

**Space** (:class:`ServeSpace`, :func:`deployments`): tensor-parallel degrees ``tp`` (default: every
divisor of the GPUs that fits in one node), for an MoE arch expert parallelism ``ep`` (default 1 and each
``tp``: the experts split over the replica's GPUs or whole on them; a larger multiple of ``tp`` spans
``ep / tp`` replicas, tried with replica counts that fill whole groups), pipeline depths ``pp`` (default 1 only: in this
simulator a pipeline runs one batch at a time, so it only ever helps a model that does not fit
otherwise; give ``pp`` to search it), ``replicas`` from 1 to ``GPUs / (tp x pp)`` (``use_all_gpus``:
only the largest), and every pair of engine limits from two small grids, ``max_num_seqs`` (default
128 and the engine's default) x ``max_num_batched_tokens`` (2,048 and the engine's default). A
replica of ``tp x pp`` GPUs lies on ``min(tp x pp, GPUs per node)``-GPU nodes
(:func:`replica_gpus_per_node`).

**Disaggregated** deployments (``disaggregate``, ``opcast search serve --disaggregate``; off by
default): besides the colocated replicas, ``P`` prefill and ``D`` decode replicas of the same
``tp x pp`` and engine limits (:func:`~opcast.predict.serve.disagg.predict_serve_disagg`, the prompt's
KV sent over the links of nodes of the space's GPUs per node, replicas in rank order, prefill first),
for every ``P, D >= 1`` with ``(P + D) x tp x pp <= GPUs`` (``auto``; ``use_all_gpus``: ``=``) or for
the given ``P:D`` pairs that fit. They are ranked with the colocated ones by the same objective per
GPU used (all ``P + D`` replicas' GPUs).

**Feasible**: the layout is valid for the arch (tp divides the heads, ...), the GPU runs the
precision, and the weights, a full token budget's working set and the longest request's KV fit
(:func:`~opcast.predict.serve.deployment.predict_serve`'s own checks; their reasons are kept).

**Meets the SLOs**: the ``slo_percentile``-th percentile (p50, p90 or p99) of TTFT is at most
``slo_ttft_s`` and that of TPOT at most ``slo_tpot_s`` (each when given).

**Objective** (``objective``), among the deployments that meet the SLOs, per GPU *used* (so the
search also says how few GPUs the traffic needs):

- ``goodput`` (default): requests/s meeting every SLO per request (DistServe's goodput, see
  :mod:`~opcast.predict.serve.metrics`) per GPU;
- ``throughput``: output tokens/s per GPU.

Ties go to the lower TTFT then TPOT percentile, then fewer GPUs per replica, the shallower
pipeline, colocated before split (then fewer prefill replicas), then the smaller limits.

**Evaluation**: every deployment is simulated by :func:`predict_serve` on the *same* request stream
(common random numbers: one seed, one stream, so differences are the deployments', not the
draws'), of ``len(stream)`` requests (``opcast search serve --num-requests``, 1,000 by default).
Speed, without changing the answer:

- one step-price table per distinct (tp, pp, token budget, sequence limit), shared by every replica
  count, and one kernel cost model for all, whose cache prices each kernel shape once: the first
  table of a layout (built at the space's largest limits) asks the learned models for nearly all of
  the layout's kernels in one batch;
- a deployment whose objective could not reach the best found so far even if every request met
  every SLO (its requests, or output tokens, over the span of the arrivals, which its run can only
  exceed, per GPU) is not simulated;
- a simulation stops as soon as its deployment can no longer be the answer
  (:class:`~opcast.predict.serve.simulate.StopRule`): once more requests missed the TTFT (TPOT) SLO
  than the percentile allows, or once its objective is surely below the best so far (the requests
  not yet known to miss, or the output tokens, over the time since the first arrival). Split
  deployments too: a split's first token is counted at its prefill step and its finish at the last
  token, after the KV transfer, as the metrics count them.

The skip holds for a split as it stands (its run also lasts from the first arrival to the last
finish, at least the arrivals' span, and its goodput and throughput are the same functions of it).
All three are exact: a deployment skipped or stopped misses the SLOs or ranks below the best, so
the best deployment is the one exhaustive evaluation finds (``tests/unit/test_serve_search.py``
checks it by brute force). The order deployments are tried in (fewest GPUs first, the engine's
default limits first) only decides how soon the bounds bite. Below the best, the ranking lists the
deployments that were simulated to the end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from opcast.archs import ArchSpec
from opcast.errors import OpcastError
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.moe_dispatch import dispatcher_problem
from opcast.predict.parallel import MAX_GPUS, InferConfig
from opcast.predict.serve.deployment import ServeResult, predict_serve, replica_reasons, replica_step_cost
from opcast.predict.serve.disagg import parse_disaggregate, predict_serve_disagg
from opcast.predict.serve.engine import (
    ENGINES,
    EngineConfig,
    engine_config,
    engine_defaults,
    engine_device_problem,
    fusions_problem,
    limits_problem,
    mxfp4_moe_problem,
)
from opcast.predict.serve.kv_cache import kv_capacity
from opcast.predict.serve.metrics import PERCENTILES, ServeMetrics
from opcast.predict.serve.requests import RequestStream
from opcast.predict.serve.simulate import RATE_MARGIN, ROUTERS, StoppedEarly, StopRule
from opcast.predict.serve.step_cost import PricedStepCost

OBJECTIVES = ("goodput", "throughput")
STATUSES = ("meets_slo", "misses_slo", "slo_certain_miss", "outranked", "infeasible")
SEQS_GRID = (128,)
"""``max_num_seqs`` tried beside the engine's default."""
TOKENS_GRID = (2048,)
"""``max_num_batched_tokens`` tried beside the engine's default."""
MISS_MARGIN = 1e-9
"""Index margin of the percentile bound (see :func:`misses_that_break`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeSpace:
    """What to choose a deployment for, and among what."""

    gpus: int
    """GPUs available (a deployment may use fewer; see ``use_all_gpus``)."""
    gpus_per_node: int | None = None
    """GPUs per node; None: the device's typical node."""
    engine: str = "vllm"
    """Serving engine (its defaults, behaviour and per-step overhead)."""
    precision: str = "bf16"
    attention: str = "flash"
    tensor_cores: bool | None = None
    moe_dispatcher: str | None = None
    """How expert parallelism across replicas moves tokens, as ``predict serve --moe-dispatcher`` (None: the
    engine's)."""
    kv_dtype: str | None = None
    """The KV cache's dtype, as ``predict serve --kv-dtype`` (None: the activations')."""
    engine_version: str | None = None
    """The engine's release, as ``predict serve --engine-version`` (None: the newest)."""
    fusions: str | None = None
    """vLLM's compile-time fusions, as ``predict serve --fusions`` (None: none)."""
    mxfp4_moe: str | None = None
    """How MXFP4 experts run, as ``predict serve --mxfp4-moe`` (None: the engine's choice)."""
    tp: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try; None: every divisor of ``gpus`` up to the GPUs per node."""
    pp: tuple[int, ...] | None = None
    """Pipeline depths to try; None: 1 only."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees to try (:attr:`InferConfig.ep`), each with the tps it is a multiple of (``ep > tp``:
    with replica counts that fill whole groups); None: 1 and the tp itself for an MoE arch, 1 for a dense one."""
    use_all_gpus: bool = False
    """Only ``replicas = gpus / (tp x pp)``; otherwise every count from 1 up to it."""
    max_num_seqs: tuple[int, ...] | None = None
    """Values to try; None: :data:`SEQS_GRID` and the engine's default."""
    max_num_batched_tokens: tuple[int, ...] | None = None
    """Values to try; None: :data:`TOKENS_GRID` and the engine's default."""
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    """Other engine settings, fixed (chunked_prefill, block_size, gpu_memory_utilization, batch waiting)."""
    router: str = "round_robin"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_percentile: int = 90
    """The percentile the SLOs bound (50, 90 or 99)."""
    objective: str = "goodput"
    early_stop: bool = True
    """Skip or stop simulations that can no longer be the answer (exact; off only to check that it is)."""
    disaggregate: str = "off"
    """Prefill/decode splits to add: ``off``, ``auto`` (every split that fits) or ``P:D[,P:D...]``
    (:func:`parse_splits`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Deployment:
    """One point of the space."""

    tp: int
    pp: int
    replicas: int
    """All replicas (a split's prefill and decode replicas together)."""
    ep: int = 1
    """Expert parallelism (:attr:`InferConfig.ep`)."""
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill: int = 0
    """Replicas that only prefill (the rest only decode); 0: colocated, every replica does both."""

    @property
    def decode(self) -> int:
        """Replicas that only decode (0 colocated)."""
        return self.replicas - self.prefill if self.prefill else 0

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp * self.pp

    def describe(self) -> str:
        pools = f"{self.prefill}P+{self.decode}D" if self.prefill else str(self.replicas)
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        return (
            f"{pools} x tp={self.tp} pp={self.pp}{ep}, max_num_seqs {self.max_num_seqs}, "
            f"max_num_batched_tokens {self.max_num_batched_tokens}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluated:
    """A deployment and what became of it."""

    deployment: Deployment
    status: str
    """``meets_slo``, ``misses_slo`` (simulated to the end), ``slo_certain_miss`` (stopped: more requests
    missed an SLO than its percentile allows), ``outranked`` (stopped: surely below the best found) or
    ``infeasible`` (not simulated)."""
    reason: str | None = None
    metrics: ServeMetrics | None = None
    value: float | None = None
    """The objective per GPU (simulated to the end only)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeSearchResult:
    arch: ArchSpec
    device: Any
    space: ServeSpace
    stream: RequestStream
    ranked: tuple[Evaluated, ...]
    """Deployments meeting the SLOs, best first."""
    others: tuple[Evaluated, ...]
    """The rest, in the order tried."""
    best: ServeResult | None
    """The best deployment re-simulated in full by :func:`predict_serve` (None when none meets the SLOs)."""
    tables: int
    """Step-price tables built."""
    steps: int
    """Steps simulated in all."""
    seconds: dict[str, float]

    def count(self, status: str) -> int:
        return sum(1 for e in (*self.ranked, *self.others) if e.status == status)


def replica_gpus_per_node(tp: int, pp: int, gpus_per_node: int) -> int:
    """A replica of ``tp x pp`` GPUs sits in one node when it fits one, else on whole ``gpus_per_node`` nodes."""
    return min(tp * pp, gpus_per_node)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_splits(text: str) -> str | tuple[tuple[int, int], ...]:
    """``--disaggregate``: ``off``, ``auto``, or the ``P:D`` pairs of ``P:D[,P:D...]`` (each as
    :func:`~opcast.predict.serve.disagg.parse_disaggregate` reads it, duplicates dropped); raises
    :class:`OpcastError`."""
    if text in ("off", "auto"):
        return text
    try:
        return tuple(dict.fromkeys(parse_disaggregate(t.strip()) for t in text.split(",")))
    except OpcastError:
        raise OpcastError(
            f"--disaggregate {text!r} must be off, auto or P:D pairs (prefill and decode replicas, each >= 1), "
            "comma-separated, e.g. 1:1,1:3"
        ) from None


def splits(space: ServeSpace, most: int) -> list[tuple[int, int]]:
    """The (prefill, decode) replica pairs of the space for a layout of which ``most`` replicas fit
    the GPUs: fewest replicas first, then fewest prefill."""
    wanted = parse_splits(space.disaggregate)
    if wanted == "off":
        return []
    if isinstance(wanted, str):  # auto
        pairs = [(p, n - p) for n in range(2, most + 1) for p in range(1, n)]
    else:
        pairs = [(p, d) for p, d in wanted if p + d <= most]
    pairs.sort(key=lambda pd: (pd[0] + pd[1], pd[0]))
    return [pd for pd in pairs if not space.use_all_gpus or sum(pd) == most]


def space_problems(space: ServeSpace) -> list[str]:
    """Every problem of the request itself (one line each)."""
    out = []
    try:
        wanted = parse_splits(space.disaggregate)
    except OpcastError as err:
        out.append(str(err))
    else:
        if isinstance(wanted, tuple) and isinstance(space.gpus, int):
            big = [f"{p}:{d}" for p, d in wanted if p + d > space.gpus]
            if big:
                out.append(
                    f"--disaggregate {','.join(big)} needs more replicas than --gpus {space.gpus} holds "
                    "(P + D replicas of tp x pp GPUs each); give smaller splits or more --gpus"
                )
    if not isinstance(space.gpus, int) or space.gpus < 1:
        out.append(f"--gpus {space.gpus} must be >= 1")
    elif space.gpus > MAX_GPUS:  # every replica count of every layout is a deployment: --gpus 2**21+1 never ended
        out.append(f"--gpus {space.gpus} is past the {MAX_GPUS:,} GPUs a search takes; give fewer")
    for name in ("tp", "pp", "ep", "max_num_seqs", "max_num_batched_tokens"):
        values = getattr(space, name)
        if values is not None and (not values or any(v < 1 for v in values)):
            out.append(f"--{name.replace('_', '-')} {','.join(map(str, values))}: give whole numbers >= 1")
    for name in ("tp", "pp"):
        values = getattr(space, name)
        if values and isinstance(space.gpus, int) and (big := [v for v in values if v > space.gpus]):
            out.append(f"--{name} {','.join(map(str, big))} exceeds --gpus {space.gpus}")
    if space.objective not in OBJECTIVES:
        out.append(f"--objective {space.objective!r} is not one of {', '.join(OBJECTIVES)}")
    if space.slo_percentile not in PERCENTILES:
        out.append(f"--slo-percentile {space.slo_percentile} is not one of {', '.join(map(str, PERCENTILES))}")
    if space.engine not in ENGINES:
        out.append(f"--engine {space.engine!r} is not one of {', '.join(ENGINES)}")
    if space.moe_dispatcher is not None and (problem := dispatcher_problem(space.moe_dispatcher)) is not None:
        out.append(problem)
    if space.fusions is not None and (problem := fusions_problem(space.fusions, space.engine)) is not None:
        out.append(problem)
    waits = {n: space.engine_overrides.get(n) for n in ("batch_wait_iters", "batch_wait_tokens_ratio")}
    if space.engine in ENGINES and any(waits.values()):
        try:  # the engine's own check (batch waiting is TensorRT-LLM's)
            EngineConfig(engine=space.engine, **{n: v for n, v in waits.items() if v is not None})  # type: ignore[arg-type]
        except OpcastError as err:
            out.append(str(err))
    if space.router not in ROUTERS:
        out.append(f"--router {space.router!r} is not one of {', '.join(ROUTERS)}")
    if space.objective == "goodput" and space.slo_ttft_s is None and space.slo_tpot_s is None:
        out.append(
            "--objective goodput needs an SLO: give --slo-ttft-s and/or --slo-tpot-s (or --objective throughput)"
        )
    return out


def _tps(device, space: ServeSpace) -> list[int]:
    """The tensor-parallel degrees to try: --tp, or every divisor of --gpus that fits in one node."""
    per_node = space.gpus_per_node or device.gpus_per_node
    return list(dict.fromkeys(space.tp or [d for d in _divisors(space.gpus) if d <= per_node]))


def ep_problems(arch: ArchSpec, device, space: ServeSpace) -> list[str]:
    """Why --ep asks for what no deployment can be: expert parallelism of a dense arch, or a degree that is
    a multiple of no tp tried (ep = tp: whole experts on a replica's GPUs; ep = k x tp: over k replicas).
    Such values were dropped without a word, and with none left the search said no deployment met the SLOs."""
    wanted = [e for e in dict.fromkeys(space.ep or ()) if e > 1]
    if wanted and arch.n_experts <= 1:
        return [
            f"--ep {','.join(map(str, wanted))}: {arch.name} is dense (n_experts={arch.n_experts}); expert "
            "parallelism needs an MoE arch: leave --ep out"
        ]
    tps = _tps(device, space)
    alone = [e for e in wanted if all(e % tp for tp in tps)]
    if alone:
        return [
            f"--ep {','.join(map(str, alone))} is a multiple of no tensor-parallel degree tried "
            f"(tp {','.join(map(str, tps))}): ep = tp puts whole experts on a replica's GPUs, ep = k x tp spreads "
            "them over k replicas; give multiples of a --tp"
        ]
    return []


def _limit_grids(base: EngineConfig, space: ServeSpace) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``max_num_seqs`` and ``max_num_batched_tokens`` values the space tries, given or the grids."""
    seqs = space.max_num_seqs or tuple(sorted({*SEQS_GRID, base.max_num_seqs}))
    tokens = space.max_num_batched_tokens or tuple(sorted({*TOKENS_GRID, base.max_num_batched_tokens}))
    return seqs, tokens


def limit_problems(device, space: ServeSpace) -> list[str]:
    """Why a --max-num-seqs value pairs with no --max-num-batched-tokens value the engine accepts
    (:func:`~opcast.predict.serve.engine.limits_problem`): only the pairs it accepts are tried, and a value
    given of none of them would have been dropped without a word (one of the default grid is left out, unless
    none is left)."""
    seqs, tokens = _limit_grids(engine_defaults(space.engine, device), space)
    if not seqs or not tokens or min(*seqs, *tokens) < 1:  # space_problems names these
        return []
    lone = [s for s in dict.fromkeys(seqs) if limits_problem(space.engine, s, max(tokens)) is not None]
    if not lone or (space.max_num_seqs is None and len(lone) < len(set(seqs))):
        return []  # a value of the default grid that pairs with none is left out, as long as one is left
    given = "--max-num-seqs" if space.max_num_seqs is not None else "max_num_seqs (the default grid)"
    return [
        f"{given} {','.join(map(str, lone))} exceeds every --max-num-batched-tokens tried "
        f"({','.join(map(str, tokens))}), which {space.engine} refuses (a step needs a token for each sequence); "
        f"give --max-num-seqs <= {max(tokens)} or --max-num-batched-tokens >= {max(lone)}"
    ]


def deployments(arch: ArchSpec, device, space: ServeSpace) -> list[Deployment]:
    """Every deployment of the space, in the order they are tried: fewest GPUs first, then the
    smaller tp, the shallower pipeline, colocated before split (fewest prefill replicas first), then
    the engine's default limits before the others (largest first)."""
    base = engine_defaults(space.engine, device)
    seqs, tokens = _limit_grids(base, space)
    limits = sorted(
        (
            (s, t)
            for s in dict.fromkeys(seqs)
            for t in dict.fromkeys(tokens)
            if limits_problem(space.engine, s, t) is None  # a pair the engine refuses is no deployment
        ),
        key=lambda st: (st != (base.max_num_seqs, base.max_num_batched_tokens), -st[0], -st[1]),
    )
    out = []
    for tp in _tps(device, space):
        eps = space.ep or ((1, tp) if arch.n_experts > 1 else (1,))
        for ep in dict.fromkeys(e for e in eps if e == 1 or e % tp == 0):
            span = ep // tp if ep > tp else 1  # replicas one expert-parallel group spans
            for pp in dict.fromkeys(space.pp or (1,)):
                most = space.gpus // (tp * pp)
                counts = [most] if space.use_all_gpus else range(1, most + 1)
                for replicas in (r for r in counts if r % span == 0):
                    out += [
                        Deployment(tp=tp, pp=pp, ep=ep, replicas=replicas, max_num_seqs=s, max_num_batched_tokens=t)
                        for s, t in limits
                    ]
                for prefill, decode in splits(space, most):
                    if prefill % span or decode % span:
                        continue
                    split = dict(tp=tp, pp=pp, ep=ep, replicas=prefill + decode, prefill=prefill)
                    out += [Deployment(**split, max_num_seqs=s, max_num_batched_tokens=t) for s, t in limits]
    # stable: colocated before split at equal GPUs, and the limits keep their order
    out.sort(key=lambda d: (d.replicas * d.gpus_per_replica, d.tp, d.pp, d.ep))
    return out


def misses_that_break(n: int, percentile: int) -> int:
    """The fewest of ``n`` values above a limit that put their ``percentile``-th percentile (numpy's
    linear interpolation) above it: the sorted values from index ``floor(p (n - 1))`` up then all
    exceed it. The index is taken a hair low (:data:`MISS_MARGIN`), so rounding can only ask for one
    more miss than needed, never one fewer."""
    return n - max(0, math.floor(percentile / 100 * (n - 1) - MISS_MARGIN))


def _value(space: ServeSpace, m: ServeMetrics, gpus: int) -> float:
    if space.objective == "goodput":
        return (m.goodput_requests_per_s or 0.0) / gpus
    return m.output_tokens_per_s / gpus


def _meets(space: ServeSpace, m: ServeMetrics) -> bool:
    p = space.slo_percentile
    ttft, tpot = getattr(m.ttft, f"p{p}_s"), getattr(m.tpot, f"p{p}_s")
    return (space.slo_ttft_s is None or ttft <= space.slo_ttft_s) and (
        space.slo_tpot_s is None or tpot is None or tpot <= space.slo_tpot_s
    )


def _rank_key(space: ServeSpace, e: Evaluated) -> tuple:
    m, d, p = e.metrics, e.deployment, space.slo_percentile
    assert m is not None and e.value is not None
    tpot = getattr(m.tpot, f"p{p}_s")
    return (
        -e.value,
        getattr(m.ttft, f"p{p}_s"),
        0.0 if tpot is None else tpot,
        d.gpus,
        d.gpus_per_replica,
        d.pp,
        d.ep,
        d.prefill,
        d.max_num_seqs,
        d.max_num_batched_tokens,
    )


def _stop_rule(space: ServeSpace, stream: RequestStream, best: float | None, gpus: int) -> StopRule | None:
    if not space.early_stop:
        return None
    p = space.slo_percentile
    multi = int((stream.output_tokens > 1).sum())
    floor = None if best is None or best <= 0 else best * gpus
    return StopRule(
        slo_ttft_s=space.slo_ttft_s,
        slo_tpot_s=space.slo_tpot_s,
        ttft_misses=None if space.slo_ttft_s is None else misses_that_break(len(stream), p),
        tpot_misses=None if space.slo_tpot_s is None or multi == 0 else misses_that_break(multi, p),
        goodput_floor_per_s=floor if space.objective == "goodput" else None,
        throughput_floor_per_s=floor if space.objective == "throughput" else None,
    )


def search_serve(
    arch: ArchSpec,
    device,
    space: ServeSpace,
    stream: RequestStream,
    *,
    kernels,
    comms: CollectiveCostModel | None = None,
) -> ServeSearchResult:
    """Evaluate every deployment of ``space`` on ``stream`` and rank those meeting the SLOs (see the
    module docstring). ``kernels`` prices every step table (its cache is shared by all of them);
    ``comms`` defaults to the collectives :func:`predict_serve` uses. Raises :class:`OpcastError`
    for a malformed request, never for an empty answer (``ranked`` is then empty)."""
    on_device = engine_device_problem(space.engine, device)
    mxfp4 = (
        mxfp4_moe_problem(space.mxfp4_moe, space.engine, arch.expert_weights, device, arch.name)
        if space.mxfp4_moe
        else None
    )
    problems = (
        space_problems(space)
        or ([on_device] if on_device else [])
        or ([mxfp4] if mxfp4 else [])
        or ep_problems(arch, device, space)
        or limit_problems(device, space)
    )
    if problems:
        raise OpcastError("; ".join(problems))
    if comms is None:
        from opcast.predict.comm_learned import collective_cost_for

        comms = collective_cost_for(kernels)
    g = space.gpus_per_node or device.gpus_per_node
    t0 = time.perf_counter()
    tables: dict[tuple, PricedStepCost] = {}
    table_s = sim_s = 0.0
    steps = 0
    done: list[Evaluated] = []
    best: Evaluated | None = None
    cfgs: dict[tuple[int, int, int], InferConfig] = {}
    span_s = float(stream.arrival_s.max() - stream.arrival_s.min())
    most = len(stream) if space.objective == "goodput" else int(stream.output_tokens.sum())
    for d in deployments(arch, device, space):
        if space.early_stop and best is not None and span_s > 0:
            ceiling = most / span_s / d.gpus  # every request meeting every SLO, over the arrivals' span
            if ceiling * (1 + RATE_MARGIN) < best.value:
                why = f"at most {ceiling:.4g} per GPU if every request met every SLO, below the best's {best.value:.4g}"
                done.append(Evaluated(deployment=d, status="outranked", reason=why))
                continue
        cfg = cfgs.setdefault(
            (d.tp, d.pp, d.ep),
            InferConfig(
                tp=d.tp,
                pp=d.pp,
                ep=d.ep,
                precision=space.precision,  # type: ignore[arg-type]
                attention=space.attention,  # type: ignore[arg-type]
                tensor_cores=space.tensor_cores,
                moe_dispatcher=space.moe_dispatcher,  # type: ignore[arg-type]
                kv_dtype=space.kv_dtype,  # type: ignore[arg-type]
                engine_version=space.engine_version,
                fusions=space.fusions,
                mxfp4_moe=space.mxfp4_moe,  # type: ignore[arg-type]
            ),
        )
        engine = engine_config(
            space.engine,
            device,
            max_num_seqs=d.max_num_seqs,
            max_num_batched_tokens=d.max_num_batched_tokens,
            **space.engine_overrides,
        )
        per_node = replica_gpus_per_node(d.tp, d.pp, g)
        cluster, reasons = replica_reasons(arch, device, cfg, engine.engine, stream, per_node)
        if cluster is None or reasons:
            done.append(Evaluated(deployment=d, status="infeasible", reason="; ".join(reasons)))
            continue
        try:
            kv_capacity(arch, device, cfg, engine, longest_tokens=stream.max_tokens)
        except OpcastError as err:
            done.append(Evaluated(deployment=d, status="infeasible", reason=str(err)))
            continue
        limits = (engine.max_num_batched_tokens, min(engine.max_num_seqs, engine.max_num_batched_tokens))
        key = (d.tp, d.pp, d.ep, cluster.gpus_per_node, *limits)
        t = time.perf_counter()
        if (d.tp, d.pp, d.ep) not in {k[:3] for k in tables}:  # first of its layout: the largest table, one batch
            _warm(arch, device, cfg, space, stream, cluster.gpus_per_node, kernels, comms, tables)
        table = tables.get(key)
        if table is None:
            table = tables[key] = replica_step_cost(
                arch, device, cfg, engine, stream, gpus_per_node=cluster.gpus_per_node, kernels=kernels, comms=comms
            )
        t1 = time.perf_counter()
        table_s += t1 - t
        rule = _stop_rule(space, stream, None if best is None else best.value, d.gpus)
        try:
            r = _simulate(arch, device, space, cfg, engine, stream, d, g, kernels, comms, table=table, stop=rule)
        except StoppedEarly as stop:
            sim_s += time.perf_counter() - t1
            status = "outranked" if stop.kind == "rate_floor" else "slo_certain_miss"
            done.append(Evaluated(deployment=d, status=status, reason=stop.reason))
            continue
        except OpcastError as err:  # e.g. a prompt beyond the token budget with chunked prefill off
            sim_s += time.perf_counter() - t1
            done.append(Evaluated(deployment=d, status="infeasible", reason=str(err)))
            continue
        sim_s += time.perf_counter() - t1
        steps += r.metrics.steps
        meets = _meets(space, r.metrics)
        e = Evaluated(
            deployment=d,
            status="meets_slo" if meets else "misses_slo",
            metrics=r.metrics,
            value=_value(space, r.metrics, d.gpus),
        )
        done.append(e)
        if meets and (best is None or _rank_key(space, e) < _rank_key(space, best)):
            best = e
    ranked = sorted((e for e in done if e.status == "meets_slo"), key=lambda e: _rank_key(space, e))
    others = [e for e in done if e.status != "meets_slo"]
    t2 = time.perf_counter()
    best_result = None
    if ranked:
        best_result = _recheck(arch, device, space, stream, ranked[0], cfgs, kernels, comms, g)
    seconds = {"tables": table_s, "simulate": sim_s, "recheck": time.perf_counter() - t2}
    seconds["total"] = time.perf_counter() - t0
    return ServeSearchResult(
        arch=arch,
        device=device,
        space=space,
        stream=stream,
        ranked=tuple(ranked),
        others=tuple(others),
        best=best_result,
        tables=len(tables),
        steps=steps,
        seconds=seconds,
    )


def _warm(arch, device, cfg, space, stream, gpus_per_node, kernels, comms, tables) -> None:
    """Build the layout's table at the largest limits of the space (cached under its key like any
    other), so the kernel models price nearly all of the layout's kernels in one batch."""
    base = engine_defaults(space.engine, device)
    seqs = max(space.max_num_seqs or (*SEQS_GRID, base.max_num_seqs))
    tokens = max(space.max_num_batched_tokens or (*TOKENS_GRID, base.max_num_batched_tokens))
    engine = replace(base, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    key = (cfg.tp, cfg.pp, cfg.ep, gpus_per_node, tokens, min(seqs, tokens))
    tables[key] = replica_step_cost(
        arch, device, cfg, engine, stream, gpus_per_node=gpus_per_node, kernels=kernels, comms=comms
    )


def _simulate(
    arch, device, space: ServeSpace, cfg, engine, stream, d: Deployment, g: int, kernels, comms, *, table, stop
) -> ServeResult:
    """Deployment ``d`` simulated by :func:`predict_serve`, or by :func:`predict_serve_disagg` for a
    split (on nodes of ``g`` GPUs); ``stop`` applies to both."""
    common = dict(
        router=space.router,
        kernels=kernels,
        comms=comms,
        slo_ttft_s=space.slo_ttft_s,
        slo_tpot_s=space.slo_tpot_s,
        step_cost=table,
    )
    if d.prefill:
        return predict_serve_disagg(
            arch, device, cfg, engine, stream, prefill=d.prefill, decode=d.decode, gpus_per_node=g, stop=stop, **common
        )
    per_node = replica_gpus_per_node(d.tp, d.pp, g)
    return predict_serve(
        arch, device, cfg, engine, stream, replicas=d.replicas, gpus_per_node=per_node, stop=stop, **common
    )


def _recheck(arch, device, space, stream, e: Evaluated, cfgs, kernels, comms, g) -> ServeResult:
    """The best deployment simulated again from scratch by :func:`predict_serve` (or
    :func:`predict_serve_disagg`; its own table, no stop rule): it must give the very metrics the
    search ranked, or the search has a bug."""
    d = e.deployment
    engine = engine_config(
        space.engine,
        device,
        max_num_seqs=d.max_num_seqs,
        max_num_batched_tokens=d.max_num_batched_tokens,
        **space.engine_overrides,
    )
    cfg = cfgs[(d.tp, d.pp, d.ep)]
    r = _simulate(arch, device, space, cfg, engine, stream, d, g, kernels, comms, table=None, stop=None)
    if r.metrics != e.metrics:
        raise RuntimeError(f"internal: the search's metrics of {d.describe()} differ from predict_serve's")
    return r


def deployment_row(e: Evaluated, space: ServeSpace, rank: int | None = None) -> dict[str, Any]:
    """One deployment as a flat row (JSON and tables)."""
    d, m, p = e.deployment, e.metrics, space.slo_percentile
    row: dict[str, Any] = {
        "rank": rank,
        "tp": d.tp,
        "pp": d.pp,
        "ep": d.ep,
        "replicas": d.replicas,
        "prefill_replicas": d.prefill or None,
        "decode_replicas": d.decode or None,
        "gpus": d.gpus,
        "max_num_seqs": d.max_num_seqs,
        "max_num_batched_tokens": d.max_num_batched_tokens,
        "status": e.status,
        "reason": e.reason,
    }
    if m is not None:
        row.update(
            {
                f"ttft_p{p}_s": getattr(m.ttft, f"p{p}_s"),
                f"tpot_p{p}_s": getattr(m.tpot, f"p{p}_s"),
                "goodput_requests_per_s_per_gpu": None
                if m.goodput_requests_per_s is None
                else m.goodput_requests_per_s / d.gpus,
                "output_tokens_per_s_per_gpu": m.output_tokens_per_s / d.gpus,
                "slo_attainment": m.slo_attainment,
                "preemptions": m.preemptions,
            }
        )
    return row


def search_serve_to_dict(result: ServeSearchResult) -> dict[str, Any]:
    from opcast.predict.serve.report import serve_to_dict

    s = result.space
    return {
        "arch": result.arch.name,
        "gpu": result.device.name,
        "gpus": s.gpus,
        "engine": s.engine,
        "disaggregate": s.disaggregate,
        "objective": s.objective,
        "objective_unit": "requests/s meeting every SLO per GPU"
        if s.objective == "goodput"
        else "output tokens/s per GPU",
        "slo": {"ttft_s": s.slo_ttft_s, "tpot_s": s.slo_tpot_s, "percentile": s.slo_percentile},
        "requests": len(result.stream),
        "requests_source": result.stream.source,
        "considered": len(result.ranked) + len(result.others),
        "counts": {k: result.count(k) for k in STATUSES},
        "tables": result.tables,
        "steps": result.steps,
        "seconds": result.seconds,
        "best": None if result.best is None else serve_to_dict(result.best),
        "ranked": [deployment_row(e, s, i) for i, e in enumerate(result.ranked, start=1)],
        "others": [deployment_row(e, s) for e in result.others],
    }
