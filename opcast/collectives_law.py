"""NCCL's alpha-beta law: the time of one collective from the catalog's link speeds, pure arithmetic.

The one implementation of the analytical collective time, shared by the cost model
(:class:`opcast.predict.comm.AlphaBetaCollectives`, which wraps it for a call on a cluster) and the
learned collective predictors (:mod:`opcast.train.features`, which use it as the reference time the
model corrects, so an unseen GPU is referenced to its own link physics, NVLink or PCIe). It lives in
the core because ``train`` may not import ``predict`` (CONTRIBUTING.md, dependency rules).

The model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1)) prices each algorithm as
``latency + bytes_on_the_bottleneck_link / bandwidth`` and takes the fastest, as NCCL's own tuner
does (NCCL ``src/graph/tuning.cc``, whose per-step latencies are :data:`PROTOCOLS`); the algorithms
are documented in :mod:`opcast.predict.comm`. Each is priced under NCCL's LL (low latency, a quarter
of the bandwidth) and Simple protocols; the minimum wins. Bandwidths are the catalog's per-GPU,
one-direction link speeds times :data:`LINK_EFFICIENCY`, with PCIe latencies for intra-node links
at or below :data:`PCIE_MAX_BYTES_PER_S`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

LINK_EFFICIENCY: Final[dict[str, float]] = {"nvlink": 235.0 / 300.0, "pci": 0.8, "net": 0.9}
"""Achievable fraction of the catalog's link bandwidth. NVLink: NCCL caps the A100 NVLink bus
bandwidth at 235 GB/s of the 300 GB/s per direction (tuning.cc, ``compCap80``), the busbw
nccl-tests reach on DGX A100. Network: 0.9, Calculon's ``a100_80g.json`` InfiniBand efficiency.
PCIe: 0.8, the usual ratio of achieved to nominal PCIe throughput (TLP overheads)."""

PCIE_MAX_BYTES_PER_S: Final = 64e9
"""Intra-node links at or below this (PCIe 5.0 x16, 64 GB/s one direction, and slower) take PCIe
latencies."""


def link_tier(intra_node_bw_bytes_per_s: float) -> str:
    """``nvlink`` or ``pci``: the kind of link between the GPUs of one node, from its per-GPU,
    one-direction bandwidth."""
    return "pci" if intra_node_bw_bytes_per_s <= PCIE_MAX_BYTES_PER_S else "nvlink"


@dataclass(frozen=True, slots=True)
class NcclProtocol:
    """One NCCL protocol's latencies (seconds) and bandwidth share, per algorithm."""

    base_ring_s: float
    base_tree_s: float
    hop_ring_s: dict[str, float]
    """Per step of a ring, by link tier (nvlink, pci, net)."""
    hop_tree_s: dict[str, float]
    bw_ring: float
    """Share of the link bandwidth the protocol reaches on a ring."""
    bw_tree: float


PROTOCOLS: Final[dict[str, NcclProtocol]] = {
    # NCCL 2.7 src/graph/tuning.cc: baseLat {Tree, Ring} x {LL, Simple} and hwLat {NVLink, PCI, NET}.
    "LL": NcclProtocol(
        base_ring_s=3.6e-6,
        base_tree_s=4.4e-6,
        hop_ring_s={"nvlink": 0.47e-6, "pci": 1.0e-6, "net": 2.7e-6},
        hop_tree_s={"nvlink": 0.52e-6, "pci": 1.0e-6, "net": 5.0e-6},
        bw_ring=1.0 / 4.0,
        bw_tree=1.0 / 3.8,
    ),
    "Simple": NcclProtocol(
        base_ring_s=8.4e-6,
        base_tree_s=0.0,
        hop_ring_s={"nvlink": 3.4e-6, "pci": 5.7e-6, "net": 9.6e-6},
        hop_tree_s={"nvlink": 28e-6, "pci": 28e-6, "net": 50e-6},
        bw_ring=1.0,
        bw_tree=1.0,
    ),
}
TREE_BW: Final = 0.9
"""NCCL: tree busBw = 0.9 x ring's."""

EP_DISPATCH: Final = "ep_dispatch"
"""DeepEP's (and HybridEP's) expert dispatch / combine kernels, priced by :func:`alpha_beta_options` as an
all-to-all whose peers are written at once (one-sided RDMA and NVLink stores from many SMs): one latency, not one
per peer as NCCL's pairwise exchange pays. Not an NCCL collective, so not a :data:`KINDS` law."""

KINDS: Final = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
"""The collectives the law prices (the registry's collective kinds)."""

NVLS_CTAS: Final[dict[str, int]] = {"hopper": 16, "blackwell": 24, "blackwell-multinode": 32}
"""Thread blocks (one per channel, each on its own SM) of an NVLink SHARP all-reduce: NCCL's defaults
``NVLS_NCHANNELS_SM90`` 16, ``NVLS_NCHANNELS_SM100_NVL`` 24 within one NVLink domain and
``NVLS_NCHANNELS_SM100`` 32 across nodes (NVIDIA/nccl ``src/transport/nvls.cc`` ``ncclNvlsTuning``, master
at 5067397, 2026-06)."""

RING_CTAS: Final = 24
"""Thread blocks of an NCCL ring collective over NVLink: the 24 blocks Nsight Systems shows for
``ncclAllGather`` beside FSDP's GEMMs on an H100 (NVIDIA developer forum, "Compute-Communication Overlap
Causes Severe GEMM Performance Degradation because of Tail Effect", topic 337991, 2025). NCCL caps a
communicator at ``MAXCHANNELS`` = 32; the count it picks comes from its topology search, which this
law does not repeat, so one measured count stands for every NVLink ring (all-gather and reduce-scatter,
whose NVLS versions need buffers registered with NCCL, which PyTorch's allocator does not do)."""


def nccl_ctas(kind: str, *, vendor: str, architecture: str, intra_node_bw_bytes_per_s: float, nodes: int) -> int:
    """SMs an NCCL collective of ``kind`` holds while it runs (one thread block per channel) on a GPU of
    ``vendor`` / ``architecture`` whose intra-node links run at ``intra_node_bw_bytes_per_s`` (one direction),
    over a group spanning ``nodes`` nodes: an all-reduce over NVLink on Hopper or Blackwell is NVLS's
    (:data:`NVLS_CTAS`), the other collectives over NVLink a ring's (:data:`RING_CTAS`). 0 where no count is
    established: PCIe-only parts (NCCL opens fewer channels there) and RCCL on AMD."""
    if vendor != "nvidia" or link_tier(intra_node_bw_bytes_per_s) != "nvlink":
        return 0
    if kind == "all_reduce" and architecture in ("hopper", "blackwell"):
        return NVLS_CTAS["blackwell-multinode" if architecture == "blackwell" and nodes > 1 else architecture]
    return RING_CTAS


def alpha_beta_options(
    kind: str,
    size_bytes: float,
    ranks: int,
    nodes: int,
    per_node: int,
    tier: str,
    b_intra: float,
    b_nic: float,
    protocols: Mapping[str, NcclProtocol] = PROTOCOLS,
) -> list[tuple[float, str]]:
    """Every (seconds, ``algorithm/protocol``) candidate of one call: ``kind`` over ``ranks`` ranks
    on ``nodes`` nodes (``per_node`` on each), ``size_bytes`` the nccl-tests size, intra-node
    links of ``tier`` at ``b_intra`` and each GPU's NIC at ``b_nic`` bytes/s (achievable, i.e.
    already times :data:`LINK_EFFICIENCY`)."""
    n, per = ranks, per_node
    s = float(size_bytes)
    if kind == EP_DISPATCH:
        # Every peer at once: the launch and one hop of the slowest tier, then each GPU's share inside the node
        # over NVLink and its share across nodes over its own NIC, in parallel (DeepEP's normal kernels forward
        # between the two; its low-latency kernels write each expert's rank directly). Its own kernels, so no NCCL
        # protocol choice: Simple's latencies and full bandwidth.
        p = protocols["Simple"]
        hop = p.hop_ring_s["net" if nodes > 1 else tier]
        t = max((per - 1) / n * s / b_intra, (n - per) / n * s / b_nic)
        return [(p.base_ring_s + hop + t, "one-shot/Simple")]
    # The bottleneck bandwidth of a ring or pairwise pattern over the whole group.
    if nodes == 1:
        b_flat = b_intra
    elif per == 1:
        b_flat = b_nic
    else:
        b_flat = min(b_intra, per * b_nic)
    out: list[tuple[float, str]] = []
    for pname, p in protocols.items():
        hop_i, hop_n = p.hop_ring_s[tier], p.hop_ring_s["net"]

        def ring(steps: int, inter_steps: int, volume: float, bw: float) -> float:
            # called only in the iteration that defines it, so the loop variables are the current ones
            return p.base_ring_s + (steps - inter_steps) * hop_i + inter_steps * hop_n + volume / (bw * p.bw_ring)  # noqa: B023

        if kind == "all_reduce":
            out.append((ring(2 * (n - 1), 2 * (nodes - 1), 2 * (n - 1) / n * s, b_flat), f"ring/{pname}"))
            tree_lat = p.base_tree_s + 2 * (
                (per - 1) * p.hop_tree_s[tier] + math.ceil(math.log2(nodes)) * p.hop_tree_s["net"]
            )
            out.append((tree_lat + 2 * s / (TREE_BW * b_flat * p.bw_tree), f"tree/{pname}"))
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


def alpha_beta_time_s(
    kind: str,
    size_bytes: float,
    ranks: int,
    nodes: int,
    per_node: int,
    intra_node_bw_bytes_per_s: float,
    inter_node_bw_bytes_per_s: float,
    protocols: Mapping[str, NcclProtocol] = PROTOCOLS,
) -> tuple[float, str]:
    """(seconds, ``algorithm/protocol``) of the fastest candidate of :func:`alpha_beta_options` on
    links of the given catalog speeds (per GPU, one direction); ``(0.0, "none")`` for one rank or
    an empty message."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0, "none"
    tier = link_tier(intra_node_bw_bytes_per_s)
    b_intra = intra_node_bw_bytes_per_s * LINK_EFFICIENCY[tier]
    b_nic = inter_node_bw_bytes_per_s * LINK_EFFICIENCY["net"]
    options = alpha_beta_options(kind, size_bytes, ranks, nodes, per_node, tier, b_intra, b_nic, protocols)
    return min(options, key=lambda o: o[0])
