"""MoE token dispatchers: what the expert all-to-all sends between nodes (``--moe-dispatcher``).

- ``alltoall`` (Megatron-Core's ``moe_token_dispatcher_type="alltoall"``, ``MoEAlltoAllTokenDispatcher``): each
  rank permutes its tokens by expert and sends one copy of a token to the rank of each of its ``top_k`` experts
  in one NCCL all-to-all. A token whose experts sit on one remote node crosses the network once per expert: of
  the ``k`` copies, ``k (N - 1) / N`` leave the node on average over an expert-parallel group of ``N`` nodes,
  what :func:`opcast.collectives_law.alpha_beta_options`' pairwise all-to-all moves over each GPU's NIC.
- ``flex`` (``moe_token_dispatcher_type="flex"`` with ``moe_flex_dispatcher_backend`` ``deepep`` or ``hybridep``):
  DeepEP's normal kernels and NVIDIA's HybridEP send a token **once to each remote node** that holds at least
  one of its experts, over RDMA to the GPU of the same in-node index, which forwards it over NVLink to the
  experts' GPUs; the combine returns the same way, the partial sums reduced on the node first. DeepSeek-V3
  (arXiv 2412.19437, Sec. 3.2.2): "each token [...] is first transmitted via IB to the GPUs with the same in-node
  index on its target nodes. Once it reaches the target nodes, we will endeavor to ensure that it is
  instantaneously forwarded via NVLink to specific GPUs that host their target experts"; the DeepEP README
  reports its RDMA "bottleneck bandwidth" as logical bytes, above the NIC's 50 GB/s for that reason.

So under ``flex`` a token crosses the network ``R`` times, ``R`` the expected number of *distinct* remote nodes
among its experts' nodes, not ``k (N - 1) / N``. With routing spread evenly over the ``E`` experts, each of the
``N`` nodes holding ``E / N`` of them (Megatron-Core places ``E / ep`` consecutive experts on each
expert-parallel rank, and the group's ranks fill a node before the next, :func:`opcast.predict.parallel.
model_parallel_groups`), a node holds none of a token's ``k`` distinct experts with probability
``C(E - E/N, k) / C(E, k)`` (drawn without replacement), and by symmetry

    R = (N - 1) * (1 - C(E - E/N, k) / C(E, k)).

opcast prices the flex dispatch as the same all-to-all call with its message scaled by ``R / (k (N - 1) / N)``,
so that the bytes each GPU sends over its NIC are the deduplicated ones; the NVLink forwarding inside the node
runs behind the RDMA transfer (DeepEP pipelines the two), and its latency terms are the all-to-all's. Inside one
node (``N = 1``) the two dispatchers move the same bytes and the factor is 1. Routing is taken as balanced (as
``moe_router_force_load_balancing`` makes it, and opcast's expert GEMMs assume); DeepSeek-V3's node-limited
routing (at most ``topk_group`` of ``n_group`` expert groups a token, hence at most 4 nodes) is not used, so
``R`` is an upper bound there (EP 32 over 4 nodes: 2.70 copies a token where group-limited routing gives about
2.36; alltoall's 6.0)."""

from __future__ import annotations

import math
from typing import Final, Literal, get_args

MoeDispatcher = Literal["alltoall", "flex"]
DISPATCHERS: Final = get_args(MoeDispatcher)


def remote_nodes_per_token(experts: int, top_k: int, nodes: int) -> float:
    """``R``: the expected number of distinct remote nodes a token's ``top_k`` experts occupy when ``experts``
    are split evenly over ``nodes`` nodes and a token picks ``top_k`` distinct ones uniformly (module docstring)."""
    if nodes <= 1:
        return 0.0
    per_node = experts / nodes
    missing = math.comb(experts - int(per_node), top_k) / math.comb(experts, top_k)
    return (nodes - 1) * (1.0 - missing)


def dispatch_scale(dispatcher: str, *, experts: int, top_k: int, nodes: int) -> float:
    """The factor on the alltoall dispatcher's all-to-all message that prices ``dispatcher`` over an
    expert-parallel group spread over ``nodes`` nodes: 1 for ``alltoall`` and inside one node, else
    ``R / (top_k (N - 1) / N)`` (module docstring)."""
    if dispatcher == "alltoall" or nodes <= 1 or experts % nodes:
        return 1.0
    return remote_nodes_per_token(experts, top_k, nodes) / (top_k * (nodes - 1) / nodes)
