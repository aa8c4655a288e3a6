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
- ``allgather`` (serving only: vLLM's default ``--all2all-backend allgather_reducescatter``, ``ParallelConfig.
  all2all_backend``; ``AgRsAll2AllManager``): before the experts every data-parallel rank all-gathers the hidden
  states of every other rank's tokens over the data-parallel group (``ep / tp`` ranks, one per replica), computes
  its experts on all of them, and reduce-scatters the outputs back: an all-gather and a reduce-scatter of
  ``ep / tp`` replicas' tokens per MoE block, whatever the top-k (:func:`opcast.predict.inference.
  _ep_all_to_all`). Megatron's ``allgather`` token dispatcher is not priced; training takes the other two.

So under ``flex`` a token crosses the network ``R`` times, ``R`` the expected number of *distinct* remote nodes
among its experts' nodes, not ``k (N - 1) / N``. With routing spread evenly over the ``E`` experts, each of the
``N`` nodes holding ``E / N`` of them (Megatron-Core places ``E / ep`` consecutive experts on each
expert-parallel rank, and the group's ranks fill a node before the next, :func:`opcast.predict.parallel.
model_parallel_groups`), a node holds none of a token's ``k`` distinct experts with probability
``C(E - E/N, k) / C(E, k)`` (drawn without replacement), and by symmetry

    R = (N - 1) * (1 - C(E - E/N, k) / C(E, k)).

Group-limited routing (DeepSeek-V3, arXiv 2412.19437, Sec. 2.1.2: "we ensure that each token will be sent to at
most M nodes"; :attr:`opcast.archs.ArchSpec.expert_groups`, Megatron-Core ``moe_router_num_groups`` /
``moe_router_group_topk``) draws a token's experts from ``G_k`` of ``G`` groups of consecutive experts. Taken as
``G_k`` groups drawn uniformly, then ``k`` experts uniformly among their ``G_k E / G``: where a node holds whole
groups (``G`` a multiple of ``N``, ``G / N`` each), the probability it holds none of the token's experts sums over
``j``, the node's groups among the chosen (hypergeometric), of ``C(G_k E/G - j E/G, k) / C(G_k E/G, k)``; where a
group spans ``N / G`` nodes, it is ``1 - G_k/G`` plus ``G_k/G`` times ``C(G_k E/G - E/N, k) / C(G_k E/G, k)``.
(DeepSeek's router picks the groups by their two best scores, so a chosen group rarely goes empty; the uniform
draw lets it, which makes ``R`` slightly low.) Other splits take the unlimited formula.

opcast prices the flex dispatch as DeepEP's kernels (:data:`opcast.collectives_law.EP_DISPATCH`: every peer
written at once, one latency rather than NCCL's one per peer) on the all-to-all's message scaled by
``R / (k (N - 1) / N)``, so that the bytes each GPU sends over its NIC are the deduplicated ones; the NVLink
forwarding inside the node runs behind the RDMA transfer (DeepEP pipelines the two). Inside one node (``N = 1``)
the two dispatchers move the same bytes and the factor is 1. Serving's decode steps run DeepEP's low-latency
kernels: the same one-shot pricing, one copy a token per expert (``deduplicate=False``). Against the latencies
DeepEP publishes for those (``benchmarks/deepep_kernels.py``, nothing fitted) this is 10 % MAPE over EP 8-256, where
NCCL's pairwise all-to-all, one latency per peer, is 3-6x slow at EP 64-256. Routing is taken as balanced (as
``moe_router_force_load_balancing`` makes it, and opcast's expert GEMMs assume). DeepSeek-V3 with EP 32 over
4 nodes: 2.20 copies of a token cross the network (2.71 without its group limit), against alltoall's 6.0. The
scaled message shrinks the NVLink share too, though the forwarding inside the node moves about the alltoall's
bytes there; with NVLink ~9x the NIC that share does not bound the call (its time is the larger of the two)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, get_args

from opcast.collectives_law import EP_DISPATCH
from opcast.predict.comm import Collective, Group

if TYPE_CHECKING:
    from opcast.archs import ArchSpec

MoeDispatcher = Literal["alltoall", "flex", "allgather"]
DISPATCHERS: Final = get_args(MoeDispatcher)
TRAIN_DISPATCHERS: Final = ("alltoall", "flex")
"""The dispatchers training prices (Megatron's ``allgather`` is not among them)."""


def infer_dispatcher(dispatcher: str | None, engine: str) -> str:
    """The dispatcher a serving ``engine`` runs expert parallelism across replicas with when none is given: vLLM's
    default ``allgather_reducescatter`` (``allgather``), else the all-to-all."""
    if dispatcher is not None:
        return dispatcher
    return "allgather" if engine == "vllm" else "alltoall"


def dispatcher_problem(dispatcher: object, choices: tuple[str, ...] = DISPATCHERS) -> str | None:
    """Why ``dispatcher`` is not one of ``choices`` (one line), or None: the one check of every configuration."""
    if dispatcher in choices:
        return None
    if dispatcher == "allgather":
        return (
            "moe_dispatcher='allgather' is vLLM's allgather_reducescatter, priced in predict infer / serve; "
            f"training takes {' or '.join(choices)}"
        )
    return f"moe_dispatcher={dispatcher!r} is not one of {', '.join(choices)}"


def _untouched(experts: int, top_k: int, nodes: int, groups: int | None, groups_top_k: int | None) -> float:
    """The probability that one node of ``nodes`` holds none of a token's ``top_k`` experts (module docstring)."""
    held = experts // nodes
    if not groups or not groups_top_k or groups_top_k >= groups or (groups % nodes and nodes % groups):
        return math.comb(experts - held, top_k) / math.comb(experts, top_k)
    size = experts // groups
    pool = groups_top_k * size  # the experts of the chosen groups
    if groups % nodes == 0:
        mine = groups // nodes  # whole groups on each node
        return sum(
            math.comb(mine, j)
            * math.comb(groups - mine, groups_top_k - j)
            / math.comb(groups, groups_top_k)
            * math.comb(pool - j * size, top_k)
            / math.comb(pool, top_k)
            for j in range(min(mine, groups_top_k) + 1)
        )
    chosen = groups_top_k / groups  # the node's group is among the chosen
    return (1.0 - chosen) + chosen * math.comb(pool - held, top_k) / math.comb(pool, top_k)


def remote_nodes_per_token(
    experts: int, top_k: int, nodes: int, groups: int | None = None, groups_top_k: int | None = None
) -> float:
    """``R``: the expected number of distinct remote nodes a token's ``top_k`` experts occupy when ``experts``
    are split evenly over ``nodes`` nodes, drawn uniformly (from ``groups_top_k`` of ``groups`` expert groups
    where given; module docstring)."""
    if nodes <= 1:
        return 0.0
    return (nodes - 1) * (1.0 - _untouched(experts, top_k, nodes, groups, groups_top_k))


def dispatch_scale(
    dispatcher: str,
    *,
    experts: int,
    top_k: int,
    nodes: int,
    groups: int | None = None,
    groups_top_k: int | None = None,
) -> float:
    """The factor on the alltoall dispatcher's all-to-all message that prices ``dispatcher`` over an
    expert-parallel group spread over ``nodes`` nodes: 1 for ``alltoall`` and inside one node, else
    ``R / (top_k (N - 1) / N)`` (module docstring)."""
    if dispatcher == "alltoall" or nodes <= 1 or experts % nodes:
        return 1.0
    return remote_nodes_per_token(experts, top_k, nodes, groups, groups_top_k) / (top_k * (nodes - 1) / nodes)


@dataclass(frozen=True, slots=True)
class EpDispatch:
    """How one configuration's expert all-to-alls run: NCCL's all-to-all (``alltoall``), or DeepEP's kernels
    (``flex``) on the message scaled by ``scale`` (:func:`dispatch_scale`)."""

    dispatcher: str = "alltoall"
    scale: float = 1.0

    def call(self, nbytes: int, group: Group) -> Collective:
        """The collective of one expert all-to-all of ``nbytes`` (one copy a token per expert) over ``group``."""
        if self.dispatcher == "alltoall":
            return Collective("all_to_all", nbytes, group)
        return Collective(EP_DISPATCH, round(nbytes * self.scale), group)


ALLTOALL: Final = EpDispatch()


def ep_dispatch(dispatcher: str, arch: ArchSpec, nodes: int, *, deduplicate: bool = True) -> EpDispatch:
    """The :class:`EpDispatch` of ``arch``'s expert all-to-alls over an expert group on ``nodes`` nodes;
    ``deduplicate``: DeepEP's normal kernels (one copy a token per remote node), else its low-latency ones."""
    if dispatcher != "flex":
        return ALLTOALL
    scale = (
        dispatch_scale(
            dispatcher,
            experts=arch.n_experts,
            top_k=arch.experts_top_k,
            nodes=nodes,
            groups=arch.expert_groups,
            groups_top_k=arch.expert_groups_top_k,
        )
        if deduplicate
        else 1.0
    )
    return EpDispatch(dispatcher, scale)
