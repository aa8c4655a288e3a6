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

A serving engine's own all-reduce (vLLM's custom IPC kernel; :func:`opcast.predict.serve.engine.tp_all_reduce_kind`
says when an engine uses it) is the kind :data:`CUSTOM_ALL_REDUCE`. Only a learned law prices it
(:mod:`opcast.predict.comm_learned`); where no source covers it, :class:`CollectiveCostModel`
prices the same call as NCCL's all-reduce and says so in the label.

Each algorithm is priced under NCCL's LL (low latency, a quarter of the bandwidth) and Simple
protocols; the minimum wins. Bandwidths are the catalog's per-GPU, one-direction link speeds
times :data:`LINK_EFFICIENCY`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

ALPHA_BETA = "alpha-beta"
CUSTOM_ALL_REDUCE = "all_reduce_custom"
"""A serving engine's custom (non-NCCL) all-reduce: law kind :data:`opcast.train.collectives.CUSTOM_ALL_REDUCE`."""
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
    :data:`CUSTOM_ALL_REDUCE` (an engine's own all-reduce)."""
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

LINK_EFFICIENCY = {"nvlink": 235.0 / 300.0, "pci": 0.8, "net": 0.9}
"""Achievable fraction of the catalog's link bandwidth. NVLink: NCCL caps the A100 NVLink bus
bandwidth at 235 GB/s of the 300 GB/s per direction (tuning.cc, ``compCap80``), the busbw
nccl-tests reach on DGX A100. Network: 0.9, Calculon's ``a100_80g.json`` InfiniBand efficiency.
PCIe: 0.8, the usual ratio of achieved to nominal PCIe throughput (TLP overheads)."""

PCIE_MAX_BYTES_PER_S = 64e9
"""Intra-node links at or below this (PCIe 4.0 x16 and slower) take PCIe latencies."""


def intra_tier(device: DeviceSpec) -> str:
    """``nvlink`` or ``pci``: the kind of link between the GPUs of one node of ``device``."""
    return "pci" if device.intra_node_bw_bytes_per_s <= PCIE_MAX_BYTES_PER_S else "nvlink"


@dataclass(frozen=True, slots=True)
class _Protocol:
    base_ring_s: float
    base_tree_s: float
    hop_ring_s: dict[str, float]
    hop_tree_s: dict[str, float]
    bw_ring: float
    bw_tree: float


# NCCL 2.7 src/graph/tuning.cc: baseLat {Tree, Ring} x {LL, Simple} and hwLat {NVLink, PCI, NET}.
_PROTOCOLS: dict[str, _Protocol] = {
    "LL": _Protocol(
        base_ring_s=3.6e-6,
        base_tree_s=4.4e-6,
        hop_ring_s={"nvlink": 0.47e-6, "pci": 1.0e-6, "net": 2.7e-6},
        hop_tree_s={"nvlink": 0.52e-6, "pci": 1.0e-6, "net": 5.0e-6},
        bw_ring=1.0 / 4.0,
        bw_tree=1.0 / 3.8,
    ),
    "Simple": _Protocol(
        base_ring_s=8.4e-6,
        base_tree_s=0.0,
        hop_ring_s={"nvlink": 3.4e-6, "pci": 5.7e-6, "net": 9.6e-6},
        hop_tree_s={"nvlink": 28e-6, "pci": 28e-6, "net": 50e-6},
        bw_ring=1.0,
        bw_tree=1.0,
    ),
}
_TREE_BW = 0.9  # NCCL: tree busBw = 0.9 x ring's


# --------------------------------------------------------------------------- alpha-beta


class AlphaBetaCollectives:
    """Ring / tree / hierarchical alpha-beta costs; see the module docstring."""

    name = ALPHA_BETA

    def covers(self, call: Collective, device: DeviceSpec) -> bool:
        return call.kind != CUSTOM_ALL_REDUCE  # NCCL's algorithms only

    def time_s(self, call: Collective, device: DeviceSpec) -> tuple[float, str]:
        g = call.group
        if g.size <= 1 or call.bytes <= 0:
            return 0.0, f"{ALPHA_BETA}/none"
        tier = intra_tier(device)
        b_intra = device.intra_node_bw_bytes_per_s * LINK_EFFICIENCY[tier]
        b_nic = device.inter_node_bw_bytes_per_s * LINK_EFFICIENCY["net"]
        options = self._options(call, g, tier, b_intra, b_nic)
        best = min(options, key=lambda o: o[0])
        return best[0], f"{ALPHA_BETA}/{best[1]}"

    def _options(self, call: Collective, g: Group, tier: str, b_intra: float, b_nic: float) -> list[tuple[float, str]]:
        n, nodes, per = g.size, g.nodes, g.per_node
        s = float(call.bytes)
        kind = call.kind
        # The bottleneck bandwidth of a ring or pairwise pattern over the whole group.
        if nodes == 1:
            b_flat = b_intra
        elif per == 1:
            b_flat = b_nic
        else:
            b_flat = min(b_intra, per * b_nic)
        out: list[tuple[float, str]] = []
        for pname, p in _PROTOCOLS.items():
            hop_i, hop_n = p.hop_ring_s[tier], p.hop_ring_s["net"]

            def ring(steps: int, inter_steps: int, volume: float, bw: float) -> float:
                # called only in the iteration that defines it, so the loop variables are the current ones
                return p.base_ring_s + (steps - inter_steps) * hop_i + inter_steps * hop_n + volume / (bw * p.bw_ring)  # noqa: B023

            if kind == "all_reduce":
                out.append((ring(2 * (n - 1), 2 * (nodes - 1), 2 * (n - 1) / n * s, b_flat), f"ring/{pname}"))
                tree_lat = p.base_tree_s + 2 * (
                    (per - 1) * p.hop_tree_s[tier] + math.ceil(math.log2(nodes)) * p.hop_tree_s["net"]
                )
                out.append((tree_lat + 2 * s / (_TREE_BW * b_flat * p.bw_tree), f"tree/{pname}"))
                if nodes > 1 and per > 1:
                    rs = ring(per - 1, 0, (per - 1) / per * s, b_intra)
                    ar = ring(2 * (nodes - 1), 2 * (nodes - 1), 2 * (nodes - 1) / nodes * s / per, b_nic)
                    out.append((2 * rs + ar, f"hierarchical/{pname}"))
            elif kind in ("all_gather", "reduce_scatter"):
                out.append((ring(n - 1, nodes - 1, (n - 1) / n * s, b_flat), f"ring/{pname}"))
                if nodes > 1 and per > 1:
                    inner = ring(per - 1, 0, (per - 1) / per * s, b_intra)
                    outer = ring(nodes - 1, nodes - 1, (nodes - 1) / nodes * s / per, b_nic)
                    out.append((inner + outer, f"hierarchical/{pname}"))
            elif kind == "all_to_all":
                intra_share = (per - 1) / n * s
                inter_share = (n - per) / n * s
                lat = p.base_ring_s + (per - 1) * hop_i + (n - per) * hop_n
                t = max(intra_share / (b_intra * p.bw_ring), inter_share / (b_nic * p.bw_ring))  # each GPU's own NIC
                out.append((lat + t, f"pairwise/{pname}"))
            elif kind == "send_recv":
                bw, hop = (b_intra, hop_i) if nodes == 1 else (b_nic, hop_n)
                out.append((p.base_ring_s + hop + s / (bw * p.bw_ring), f"p2p/{pname}"))
            elif kind == "broadcast":  # pipelined ring: S over the bottleneck link, n-1 hops
                out.append((ring(n - 1, nodes - 1, s, b_flat), f"ring/{pname}"))
            else:
                raise ValueError(f"unknown collective {kind!r}")
        return out


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
                if call.kind != CUSTOM_ALL_REDUCE:
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
