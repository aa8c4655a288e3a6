"""Collective times: a hierarchical ring/tree alpha-beta model over the catalog's two link tiers.

A :class:`Collective` is one call (kind, bytes per rank in the nccl-tests sense, and the
:class:`Group` of ranks, which says how many nodes they span). A *collective-cost source*
(:class:`CollectiveCostSource`) returns its time and a label of how it was costed; the only one
here is :class:`AlphaBetaCollectives` (label ``alpha-beta/<algorithm>/<protocol>``); the learned
per-cluster laws (:mod:`opcast.predict.comm_learned`, label ``learned/<cluster>/...``, fitted by
``train fit`` on ``collect comm`` and replayed data) plug in as another source in front of it:
:class:`CollectiveCostModel` asks its sources in order and caches.

The alpha-beta model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, "Optimization of
collective communication operations in MPICH", IJHPCA 19(1)) prices each algorithm as
``latency + bytes_on_the_bottleneck_link / bandwidth`` and takes the fastest, as NCCL's own tuner
does (NCCL ``src/graph/tuning.cc``, whose per-step latencies we use):

- **ring** over all n ranks: all-reduce moves ``2(n-1)/n * S`` per rank, all-gather and
  reduce-scatter ``(n-1)/n * S``, in ``2(n-1)`` or ``n-1`` steps. Across nodes every GPU's NIC
  carries one ring channel (rail-optimised), so the bottleneck bandwidth is
  ``min(B_intra, g * B_nic)`` for g ranks of the group per node.
- **tree** (all-reduce only; NCCL's double binary tree, Sanders et al. 2009): ``2S / (0.9 B)``
  with ``2((g-1) * lat_intra + log2(N) * lat_net)`` latency.
- **hierarchical** (nodes > 1, g > 1): reduce-scatter inside each node, all-reduce of the 1/g shard
  across nodes over each GPU's own NIC, all-gather inside the node:
  ``2(g-1)/g * S / B_intra + 2(N-1)/N * (S/g) / B_nic`` plus the three phases' latencies.
- **all-to-all**: the intra-node and inter-node shares of ``(n-1)/n * S`` in parallel on their links.
- **send/recv**: one hop on the link between the two ranks.

A serving engine's own all-reduce (:func:`opcast.predict.serve.engine.tp_all_reduce_kind` says when an engine uses
it) is the kind :data:`CUSTOM_ALL_REDUCE` (vLLM's custom IPC kernel, SGLang's port of it) or
:data:`TRTLLM_ALL_REDUCE` (TensorRT-LLM's ``AllReduce``, strategy AUTO). Only a learned law prices them
(:mod:`opcast.predict.comm_learned`); where no source covers it, :class:`CollectiveCostModel`
prices the same call as NCCL's all-reduce and says so in the label.

Each algorithm is priced under NCCL's LL (low latency, a quarter of the bandwidth) and Simple
protocols; the minimum wins. Bandwidths are the catalog's per-GPU, one-direction link speeds
times :data:`LINK_EFFICIENCY`. The law itself is :mod:`opcast.collectives_law` (one implementation,
shared with the learned collective predictors' reference time in :mod:`opcast.train.features`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opcast.collectives_law import (
    LINK_EFFICIENCY,
    PROTOCOLS,
    TREE_BW,
    NcclProtocol,
    alpha_beta_options,
    alpha_beta_time_s,
    link_tier,
)

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

ALPHA_BETA = "alpha-beta"
CUSTOM_ALL_REDUCE = "all_reduce_custom"
"""A serving engine's custom (non-NCCL) all-reduce: law kind :data:`opcast.train.collectives.CUSTOM_ALL_REDUCE`."""
TRTLLM_ALL_REDUCE = "all_reduce_trtllm"
"""TensorRT-LLM's all-reduce (strategy AUTO): law kind :data:`opcast.train.collectives.TRTLLM_ALL_REDUCE`."""
ENGINE_ALL_REDUCES: frozenset[str] = frozenset({CUSTOM_ALL_REDUCE, TRTLLM_ALL_REDUCE})
"""The kinds of a serving engine's own all-reduce: only a learned law prices them, else NCCL's all-reduce does."""
NCCL_FALLBACK = "custom all-reduce without a measured law here: priced as NCCL"


@dataclass(frozen=True, slots=True)
class Group:
    """The ranks of one communicator as placed on the cluster."""

    size: int
    """Ranks taking part."""
    nodes: int
    """Nodes they span."""
    per_node: int
    """Ranks of the group on each node (the last node may hold fewer)."""


SOLO = Group(1, 1, 1)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call."""

    kind: str
    """all_reduce | all_gather | reduce_scatter | all_to_all | send_recv | broadcast, or
    one of :data:`ENGINE_ALL_REDUCES` (an engine's own all-reduce)."""
    bytes: int
    """nccl-tests ``size``: the buffer per rank (all-gather: the gathered output)."""
    group: Group


class CollectiveCostSource(Protocol):
    """Anything that can time a collective on a cluster of ``device``."""

    name: str

    def covers(self, call: Collective, device: DeviceSpec) -> bool: ...

    def time_s(self, call: Collective, device: DeviceSpec) -> tuple[float, str]:
        """(seconds, label of how it was costed)."""
        ...


# --------------------------------------------------------------------------- constants

# The law itself (constants, latencies, algorithms) is opcast.collectives_law, shared with the
# learned collective predictors' reference time; these names stay importable from here.
_Protocol = NcclProtocol
_PROTOCOLS: dict[str, NcclProtocol] = PROTOCOLS
"""NCCL's protocols as this module prices them (the same object as the core's table; read at
call time, so a test may replace it here)."""
_TREE_BW = TREE_BW


def intra_tier(device: DeviceSpec) -> str:
    """``nvlink`` or ``pci``: the kind of link between the GPUs of one node of ``device``."""
    return link_tier(device.intra_node_bw_bytes_per_s)


# --------------------------------------------------------------------------- alpha-beta


class AlphaBetaCollectives:
    """Ring / tree / hierarchical alpha-beta costs (:func:`opcast.collectives_law.alpha_beta_time_s`);
    see the module docstring."""

    name = ALPHA_BETA

    def covers(self, call: Collective, device: DeviceSpec) -> bool:
        return call.kind not in ENGINE_ALL_REDUCES  # NCCL's algorithms only

    def time_s(self, call: Collective, device: DeviceSpec) -> tuple[float, str]:
        g = call.group
        seconds, how = alpha_beta_time_s(
            call.kind,
            call.bytes,
            g.size,
            g.nodes,
            g.per_node,
            device.intra_node_bw_bytes_per_s,
            device.inter_node_bw_bytes_per_s,
            _PROTOCOLS,
        )
        return seconds, f"{ALPHA_BETA}/{how}"

    def _options(self, call: Collective, g: Group, tier: str, b_intra: float, b_nic: float) -> list[tuple[float, str]]:
        """Every (seconds, ``algorithm/protocol``) candidate (:func:`opcast.collectives_law.alpha_beta_options`)."""
        return alpha_beta_options(call.kind, call.bytes, g.size, g.nodes, g.per_node, tier, b_intra, b_nic, _PROTOCOLS)


@dataclass(kw_only=True, slots=True)
class CollectiveCostModel:
    """Sources in order of preference (a learned collective model would go first), cached."""

    sources: tuple[CollectiveCostSource, ...] = (AlphaBetaCollectives(),)
    _cache: dict[Any, dict[Collective, tuple[float, str]]] = field(default_factory=dict)

    def time_s(self, call: Collective, device: DeviceSpec) -> tuple[float, str]:
        cache = self._cache.get(device)
        if cache is None:
            cache = self._cache[device] = {}
        hit = cache.get(call)
        if hit is None:
            for source in self.sources:
                if source.covers(call, device):
                    hit = cache[call] = source.time_s(call, device)
                    break
            else:
                if call.kind not in ENGINE_ALL_REDUCES:
                    raise ValueError(f"no collective-cost source covers {call}")
                seconds, label = self.time_s(Collective("all_reduce", call.bytes, call.group), device)
                hit = cache[call] = (seconds, f"{label} ({NCCL_FALLBACK})")
        return hit

    def total_s(self, calls: Sequence[tuple[Collective, float]], device: DeviceSpec) -> float:
        """Sum of ``count x time`` over ``(call, count)`` pairs."""
        return sum(n * self.time_s(c, device)[0] for c, n in calls)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "collective_models": [s.name for s in self.sources],
            "link_efficiency": dict(LINK_EFFICIENCY),
            "latencies": "NCCL 2.7 src/graph/tuning.cc baseLat/hwLat (LL and Simple protocols)",
        }
        for s in self.sources:  # a learned source says where its laws came from
            describe = getattr(s, "describe", None)
            if describe is not None:
                out.update(describe())
        return out


def place(size: int, stride: int, gpus_per_node: int) -> Group:
    """The :class:`Group` of ``size`` ranks spaced ``stride`` apart in a rank order that fills
    nodes of ``gpus_per_node`` consecutively (Megatron's ``tp-cp-ep-dp-pp`` order)."""
    if size <= 1:
        return SOLO
    per = 1 if stride >= gpus_per_node else max(1, min(size, gpus_per_node // stride))
    return Group(size, -(-size // per), per)
