"""What Transformer Engine's userbuffers overlap of a block's tensor-parallel collectives with their GEMMs
(Megatron-LM ``--tp-comm-overlap``) costs, as TE runs it.

TE names ten GEMMs of a transformer layer and overlaps each one's collective by one of three methods
(``transformer_engine/pytorch/module/base.py`` ``initialize_ub``; the C++ in
``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp``; TE v2.2, commit
c55e425ac5751c72bfa656560fc7c65ab7d895e9):

- ``ring_exchange`` (``CommOverlapP2PBase::split_overlap_ag`` / ``split_overlap_rs``): the GEMM runs as
  ``tp`` chunk GEMMs of ``m / tp`` rows (tokens) while each rank passes chunks around the ring on the copy
  engines (``use_ce``, one step = the collective's time over its ``tp - 1`` steps). An all-gather starts
  on the local chunk and chunk ``i + 1`` waits for step ``i``; a reduce-scatter sends each chunk behind the
  next, keeps the last (its own) and then sums the ``tp`` partials (``reduce_bf16``, one memory-bound
  kernel). ``aggregate`` (NeMo's 405B configs) first swaps one chunk with the pair rank, exposed, then runs
  ``tp / 2`` chunks of ``2 m / tp`` rows.
- ``pipeline`` (``CommOverlapBase::split_overlap_rs``, reduce-scatter only): ``num_splits`` chunk GEMMs of
  ``n / num_splits`` output columns (the weight's rows, ``m_chunk = m / _num_splits`` on ``A``); chunk
  ``i``'s reduce-scatter runs on ``num_sm`` SMs after chunk ``i``, the last one after every chunk (on
  ``UB_MAX_SM`` = 32 SMs): the edge nothing hides.
- ``bulk`` (``CommOverlapBase::bulk_overlap``): the whole collective as one userbuffers kernel on
  ``num_sm`` SMs, launched first, beside the unsplit GEMM.

The chunk GEMMs go round-robin to ``min(3, chunks)`` compute streams (``_NUM_MAX_UB_STREAMS`` = 3 in
``module/base.py``; ``_stream_compute``), so one chunk's wave tail fills with the next one's tiles: the
chunks together cost the unsplit GEMM's time, except where a transfer holds the next chunk back (the
timelines: :func:`overlapped`).

With ``set_sm_margin`` every GEMM (or chunk) of the overlap launches on ``_math_sms = sm_count - num_sm``
SMs (``CommOverlapCore::initialize``) for its whole run. opcast scales its time by ``sm_count /
(sm_count - num_sm)``: the block GEMMs of a TP training step are compute-bound and span many waves of
tiles, so their time goes with the SMs they get (a wave-quantised rule would need the kernel's tile
shape, which neither the learned models nor the roofline know). Without the margin a ``bulk`` GEMM
launches on every SM but loses the comm kernel's ``num_sm`` while it runs: it finishes at
``min(g S / (S - num_sm), g + c num_sm / S)``. Not modelled: the copy engines' and SM comm kernels' own
draw on memory bandwidth, chunks that the stream scheduler runs less evenly than round-robin, atomic GEMMs
(``atomic_gemm``, off by default), TE >= 2.8's ``external`` wgrad overlap.

:data:`TE_DEFAULTS` is what a run without a per-model configuration gets (``get_default_config`` and
``methods`` in ``initialize_ub``); NeMo's and Megatron-Bridge's recipes pass their own per model and GPU
(NeMo ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``, v2.2.0 7192a2c9), which
:func:`parse_configs` reads from the ``--tp-comm-overlap-cfg`` text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

from opcast.ops import whole_number
from opcast.predict.cost import Kernel, kernel
from opcast.predict.graph import BWD, FWD, RECOMPUTE, Graph

Method = Literal["ring_exchange", "pipeline", "bulk"]


@dataclass(frozen=True, kw_only=True, slots=True)
class UbGemm:
    """How TE overlaps one GEMM's collective (one entry of ``initialize_ub``'s ``ub_cfgs``)."""

    method: Method
    num_sm: int
    """SMs the communication kernel runs on (ring_exchange: its copy-engine transfers take 1)."""
    set_sm_margin: bool
    """The GEMM launches on ``sm_count - num_sm`` SMs."""
    num_splits: int = 4
    """Chunks of a ``pipeline`` overlap (a ``ring_exchange`` runs ``tp``)."""
    aggregate: bool = False
    """``ring_exchange`` in ``tp / 2`` double chunks after an exposed swap with the pair rank."""


_RING = UbGemm(method="ring_exchange", num_sm=1, set_sm_margin=False)
_PIPELINE = UbGemm(method="pipeline", num_sm=16, set_sm_margin=True, num_splits=4)
_BULK = UbGemm(method="bulk", num_sm=16, set_sm_margin=True)

TE_DEFAULTS: dict[str, UbGemm] = {
    "qkv_fprop": _RING,
    "fc1_fprop": _RING,
    "proj_dgrad": _RING,
    "fc2_dgrad": _RING,
    "proj_fprop": _PIPELINE,
    "fc2_fprop": _PIPELINE,
    "qkv_dgrad": _BULK,
    "qkv_wgrad": _BULK,
    "fc1_dgrad": _BULK,
    "fc1_wgrad": _BULK,
}
"""TE's default per GEMM (TE v2.2 c55e425a ``transformer_engine/pytorch/module/base.py`` ``initialize_ub``:
``methods`` ring_exchange for qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad, pipeline for proj_fprop, fc2_fprop,
bulk for the rest; ``get_default_config``: ``num_sm`` 1 for ring_exchange else 16, ``set_sm_margin`` = not
ring_exchange, ``num_splits`` tp for ring_exchange else 4, ``cga_size`` 1 / 2, ``atomic_gemm`` False,
``aggregate`` False, ``use_ce`` True; the same at TE v2.8 and at main d0067d0d)."""

REDUCE_SCATTER: frozenset[str] = frozenset({"proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad"})
"""TE's ``layers_reduce_scatter_overlap``; the rest all-gather."""

ALLOWED: dict[str, frozenset[str]] = {
    "qkv_fprop": frozenset({"ring_exchange"}),
    "fc1_fprop": frozenset({"ring_exchange"}),
    "proj_dgrad": frozenset({"ring_exchange"}),
    "fc2_dgrad": frozenset({"ring_exchange"}),
    "proj_fprop": frozenset({"ring_exchange", "pipeline"}),
    "fc2_fprop": frozenset({"ring_exchange", "pipeline"}),
    "qkv_dgrad": frozenset({"bulk"}),
    "qkv_wgrad": frozenset({"bulk"}),
    "fc1_dgrad": frozenset({"bulk"}),
    "fc1_wgrad": frozenset({"bulk"}),
}
"""Methods opcast prices per GEMM: TE refuses ``pipeline`` for an all-gather (``add_ub``), and the bulk
GEMMs' collectives belong to another GEMM's data (the re-gathered input, the data gradient)."""

ROLE_GEMM: dict[str, str] = {
    "qkv": "qkv_fprop",
    "mlp_up": "fc1_fprop",
    "proj": "proj_fprop",
    "mlp_down": "fc2_fprop",
    "proj.dgrad": "proj_dgrad",
    "mlp_down.dgrad": "fc2_dgrad",
    "qkv.dgrad": "qkv_dgrad",
    "mlp_up.dgrad": "fc1_dgrad",
    "qkv.wgrad": "qkv_wgrad",
    "mlp_up.wgrad": "fc1_wgrad",
}
"""opcast's block GEMM role -> TE's GEMM name."""

OVERLAP_GEMMS: dict[str, dict[str, tuple[str, ...]]] = {
    FWD: {"all_gather": ("qkv", "mlp_up"), "reduce_scatter": ("proj", "mlp_down")},
    RECOMPUTE: {"all_gather": ("qkv", "mlp_up"), "reduce_scatter": ("proj", "mlp_down")},
    BWD: {"all_gather": ("proj.dgrad", "mlp_down.dgrad"), "reduce_scatter": ("qkv.wgrad", "mlp_up.wgrad")},
}
"""The GEMM each of a block's tensor-parallel collectives runs behind, by phase and kind, one per call in
order (the bulk all-gathers behind ``qkv.dgrad`` / ``mlp_up.dgrad`` name theirs, ``Comm.overlap_with``)."""


def configs(overrides: Mapping[str, UbGemm] | None = None) -> dict[str, UbGemm]:
    """TE's defaults with ``overrides`` (a recipe's per-GEMM settings) in place."""
    return {**TE_DEFAULTS, **(overrides or {})}


# --------------------------------------------------------------------------- --tp-comm-overlap-cfg

CFG_HELP = (
    "GEMM=METHOD[:smN][:splitN][:margin|:nomargin][:aggregate],... e.g. "
    "qkv_wgrad=bulk:sm24:nomargin,proj_fprop=pipeline:sm24:split4:margin,fc2_fprop=ring_exchange:sm1:margin"
)


@lru_cache(maxsize=64)
def parse_configs(text: str) -> dict[str, UbGemm]:
    """The per-GEMM overrides of ``--tp-comm-overlap-cfg`` (fields left out keep TE's default for the
    method); raises ValueError naming what is wrong."""
    out: dict[str, UbGemm] = {}
    for item in (t.strip() for t in text.split(",")):
        name, eq, spec = item.partition("=")
        name = name.strip()
        if not eq or name not in ALLOWED:
            raise ValueError(f"{item!r}: give GEMM=METHOD with GEMM one of {', '.join(ALLOWED)}")
        if name in out:
            raise ValueError(f"{name} given twice")
        method, *fields = (f.strip() for f in spec.split(":"))
        if method not in ALLOWED[name]:
            raise ValueError(f"{name}: method {method!r} is not one of {', '.join(sorted(ALLOWED[name]))}")
        base = _RING if method == "ring_exchange" else _PIPELINE if method == "pipeline" else _BULK
        values: dict[str, int | bool] = {}
        for f in fields:
            if f in ("margin", "nomargin"):
                values["set_sm_margin"] = f == "margin"
            elif f == "aggregate" and method == "ring_exchange":
                values["aggregate"] = True
            elif f[:2] == "sm" and (n := whole_number(f[2:])) is not None and n >= 1:
                values["num_sm"] = n
            elif f[:5] == "split" and (n := whole_number(f[5:])) is not None and n >= 1 and method == "pipeline":
                values["num_splits"] = n
            else:
                raise ValueError(
                    f"{name}: bad field {f!r} for {method}; fields are smN, splitN (pipeline), "
                    "margin, nomargin, aggregate (ring_exchange)"
                )
        out[name] = dataclasses.replace(base, **values)  # type: ignore[arg-type]  # checked field by field above
    return out


def config_problem(text: str | None, sm_count: int | None = None) -> str | None:
    """What is wrong with a ``--tp-comm-overlap-cfg`` text (and its SM counts on a GPU of ``sm_count``), or None."""
    if text is None:
        return None
    try:
        cfgs = parse_configs(text)
    except ValueError as err:
        return f"--tp-comm-overlap-cfg {text!r}: {err}; {CFG_HELP}"
    too_many = [n for n, c in configs(cfgs).items() if sm_count is not None and c.num_sm >= sm_count]
    if too_many:
        return f"--tp-comm-overlap-cfg: num_sm of {', '.join(too_many)} leaves no SM of {sm_count} to the GEMM"
    return None


# --------------------------------------------------------------------------- the kernels it runs


def pieces(cfg: UbGemm, tp: int) -> int:
    """Chunk GEMMs the overlap runs (1: the GEMM unsplit)."""
    if cfg.method == "ring_exchange":
        return tp // 2 if cfg.aggregate and tp % 2 == 0 else tp
    return cfg.num_splits if cfg.method == "pipeline" else 1


def chunk_kernel(gemm: Kernel, cfg: UbGemm, tp: int) -> Kernel:
    """One chunk GEMM of ``gemm`` (``m`` tokens x ``n`` outputs x ``k``) under ``cfg``: ring_exchange splits
    the tokens, pipeline the output columns; a bulk overlap keeps the GEMM whole."""
    k = pieces(cfg, tp)
    if k == 1:
        return gemm
    dim = "m" if cfg.method == "ring_exchange" else "n"
    p = gemm.param_dict
    return kernel(gemm.kind, {**p, dim: -(-int(p[dim]) // k)}, gemm.dtype, gemm.direction, gemm.tensor_cores)


def reduce_kernel(gemm: Kernel, tp: int) -> Kernel:
    """A ring-exchange reduce-scatter's ``reduce_bf16``: ``tp`` partial chunks of ``m / tp`` rows read, one
    written, bf16 (priced as :func:`opcast.predict.graph.traffic_op` prices a memory-bound kernel)."""
    p = gemm.param_dict
    chunk = int(p["b"]) * -(-int(p["m"]) // tp) * int(p["n"])
    return kernel("elementwise", {"numel": -(-(tp + 1) * chunk * 2 // 4), "fn": "mul_scalar"}, "bf16", "fwd", False)


def overlap_kernels(graph: Graph, tp: int, cfgs: Mapping[str, UbGemm]) -> list[Kernel]:
    """The kernels the overlap prices beyond a block GEMM of ``graph`` (for one batched lookup): a
    ring-exchange all-gather's chunk GEMM, a ring-exchange reduce-scatter's reduction."""
    out: list[Kernel] = []
    for nodes in graph.nodes.values():
        for n in nodes:
            name = ROLE_GEMM.get(n.role)
            if name is None or tp < 2 or cfgs[name].method != "ring_exchange":
                continue
            out.append(
                reduce_kernel(n.kernel, tp) if name in REDUCE_SCATTER else chunk_kernel(n.kernel, cfgs[name], tp)
            )
    return out


# --------------------------------------------------------------------------- the timeline


class Overlapped(NamedTuple):
    """One GEMM and its collective as the overlap runs them."""

    gemm_s: float
    """The GEMM's kernels: its chunks together, on the SMs they get (and a ring reduce-scatter's reduction)."""
    exposed_s: float
    """What of the collective nothing hides (the time past the GEMM's kernels)."""
    pieces: int


def comm_sm_time_s(comm_s: float, comm_sms: int, sm_count: int) -> float:
    """Seconds a compute-bound kernel loses to a communication kernel that holds ``comm_sms`` of the
    device's ``sm_count`` SMs for ``comm_s`` seconds beside it: its tiles run on the other SMs meanwhile, so
    it gives up ``comm_s * comm_sms / sm_count`` of its time (the module docstring's ``c num_sm / S``)."""
    return comm_s * comm_sms / sm_count


def sm_share(cfg: UbGemm, sm_count: int) -> float:
    """The slowdown of a compute-bound GEMM launched on ``sm_count - num_sm`` SMs (1 without the margin)."""
    return sm_count / (sm_count - cfg.num_sm) if cfg.set_sm_margin else 1.0


def overlapped(
    cfg: UbGemm,
    *,
    tp: int,
    gemm_s: float,
    chunk_s: float,
    comm_s: float,
    sm_count: int,
    reduce_scatter: bool = False,
    reduce_s: float = 0.0,
) -> Overlapped:
    """The overlap of one GEMM (``gemm_s`` unsplit and ``chunk_s`` a chunk alone, both on the full device)
    with its collective of ``comm_s`` seconds (the collective cost model's, run alone), on a GPU of
    ``sm_count`` SMs; ``reduce_scatter``: the collective is one (``reduce_s``: a ring exchange's reduction).

    TE launches the chunk GEMMs round-robin on ``min(3, pieces)`` compute streams (``_NUM_MAX_UB_STREAMS``
    = 3, ``CommOverlapCore``'s ``_stream_compute``), so a chunk's wave tail fills with the next chunk's
    tiles wherever no transfer holds the next one back: together the chunks take the unsplit GEMM's time
    ``G`` (on the SMs they get), chunk ``i`` done at about ``(i + 1) G / k``. A pipeline's piece ``i``
    follows chunk ``i`` and piece ``i - 1``: ``G / k + p + (k - 1) max(G / k, p)``; a ring-exchange
    reduce-scatter sends chunk ``i`` behind chunk ``i + 1`` and keeps the last: ``G / k + (k - 1) max(G / k,
    s)``, then its reduction; a ring-exchange all-gather's chunk ``i`` waits for the ``i``-th step, so the
    last chunk starts when the last step lands and runs alone: ``max(G, (k - 1) s + g)`` (``g`` = a chunk
    alone, priced as its own kernel), after the pair swap with ``aggregate``. A bulk collective runs
    beside the unsplit GEMM (see the module docstring)."""
    k = pieces(cfg, tp)
    if cfg.method == "bulk":
        full = gemm_s * sm_count / (sm_count - cfg.num_sm)  # on S - num_sm SMs throughout
        gemm = full if cfg.set_sm_margin else min(full, gemm_s + comm_sm_time_s(comm_s, cfg.num_sm, sm_count))
        return Overlapped(gemm, max(0.0, comm_s - gemm), 1)
    scale = sm_share(cfg, sm_count)
    big = gemm_s * scale
    g = big / k
    if cfg.method == "pipeline":
        piece = comm_s / k
        return Overlapped(big, g + piece + (k - 1) * max(g, piece) - big, k)
    step = comm_s / (tp - 1)  # one ring step: the collective over its tp - 1 steps
    if reduce_scatter:
        return Overlapped(big + reduce_s, g + (k - 1) * max(g, step) - big, k)
    swap = step if k < tp else 0.0  # aggregate: one chunk swapped with the pair rank first, then two a step
    last = swap + (k - 1) * step * (tp // k)
    return Overlapped(big, max(swap + big, last + chunk_s * scale) - big, k)
