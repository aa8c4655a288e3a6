"""Disaggregated serving: a pool of prefill replicas and a pool of decode replicas, the KV cache of
each prompt sent between them over the cluster's links (DistServe, Zhong et al. 2024, arXiv
2401.09670; Splitwise, Patel et al. 2024, arXiv 2311.18677; vLLM's disaggregated prefill).

``--disaggregate P:D``: ``P`` prefill and ``D`` decode replicas, each ``tp x pp`` GPUs, placed in
rank order (the prefill replicas first) on nodes of ``--gpus-per-node`` GPUs (the GPU's typical
node). The scheduling is :func:`~opcast.predict.serve.simulate.simulate` with a
:class:`~opcast.predict.serve.simulate.Split` (its module docstring says what each pool does):

- **TTFT** ends at the prefill step that emits the first token, as DistServe defines it (§2.1:
  the prefill phase, queueing included, produces the first token); the KV transfer and the decode
  pool's queueing fall in **TPOT** and end-to-end latency, which is what a client measures.
- **KV transfer**: the prompt's KV, ``kv_bytes_per_token x prompt tokens`` on each GPU of the
  replica (the memory model's bytes per token of one GPU, :class:`~opcast.predict.serve.kv_cache.KvCapacity`),
  goes from each GPU of the prefill replica to its counterpart in the decode replica at once, one
  ``send_recv`` each (:mod:`opcast.predict.comm`): within a node when every such pair shares one,
  across nodes otherwise (the slowest pair sets the time). The first token's KV is computed by the
  first decode step, so it is not sent. A prefill replica sends one request's KV at a time.
- **KV capacity** is per replica of each pool, the same memory model as a colocated replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from opcast.archs import ArchSpec
from opcast.errors import OpcastError
from opcast.predict.comm import Collective, CollectiveCostModel, Group
from opcast.predict.parallel import InferConfig, ep_replica_reasons, replica_count_reasons
from opcast.predict.serve.deployment import ServeResult, replica_reasons, replica_step_cost
from opcast.predict.serve.engine import EngineConfig
from opcast.predict.serve.kv_cache import kv_capacity
from opcast.predict.serve.metrics import Distribution, serve_metrics
from opcast.predict.serve.requests import RequestStream
from opcast.predict.serve.simulate import SimResult, Split, StopRule, simulate
from opcast.predict.serve.step_cost import PricedStepCost

INTRA = Group(2, 1, 2)
"""A point-to-point pair within one node."""
INTER = Group(2, 2, 1)
"""A point-to-point pair across two nodes."""


def parse_disaggregate(text: str) -> tuple[int, int]:
    """``P:D`` -> (prefill replicas, decode replicas), each >= 1."""
    p, sep, d = text.partition(":")
    try:
        pools = (int(p), int(d)) if sep else None
    except ValueError:
        pools = None
    if pools is None or min(pools) < 1:
        raise OpcastError(f"--disaggregate {text!r} must be P:D, the prefill and decode replicas (each >= 1), e.g. 1:3")
    return pools


def same_node(p: int, d: int, *, prefill: int, gpus_per_replica: int, gpus_per_node: int) -> bool:
    """Whether every GPU of prefill replica ``p`` shares a node with its counterpart in decode replica
    ``d`` (``d`` counted from 0 in the decode pool), replicas laid out in rank order, prefill first."""
    g = gpus_per_replica
    src, dst = p * g, (prefill + d) * g
    return all((src + i) // gpus_per_node == (dst + i) // gpus_per_node for i in range(g))


class KvTransfer:
    """Seconds to send a request's prompt KV from a prefill replica to a decode replica (see the module
    docstring), a callable for :class:`~opcast.predict.serve.simulate.Split`."""

    def __init__(
        self,
        stream: RequestStream,
        device,
        *,
        kv_bytes_per_token: float,
        window: tuple[int, float] | None = None,
        prefill: int,
        decode: int,
        gpus_per_replica: int,
        gpus_per_node: int,
        comms: CollectiveCostModel,
    ) -> None:
        self.prefill = prefill
        self.kv_bytes_per_token = kv_bytes_per_token
        tokens = stream.input_tokens.astype(float)
        if window is not None:  # the windowed layers' share holds (and sends) the last W tokens only
            keys, share = window
            tokens = (1 - share) * tokens + share * np.minimum(tokens, keys)
        self.bytes_per_gpu = tokens * kv_bytes_per_token
        """Prompt KV bytes each GPU sends, per request."""
        self._gpus = (gpus_per_replica, gpus_per_node)
        self._intra: dict[tuple[int, int], bool] = {}
        self._device = device
        self._comms = comms
        self._inp = stream.input_tokens.tolist()
        self._cache: dict[tuple[int, bool], float] = {}

    def within_node(self, p: int, d: int) -> bool:
        """Whether prefill replica ``p`` sends to decode replica ``d`` (numbered after the prefill pool) within
        nodes (:func:`same_node`), for the pairs a run uses: a table of every pair took P x D (seconds for
        --disaggregate 3000:3000, forever for 1e6:1e6)."""
        intra = self._intra.get((p, d))
        if intra is None:
            g, per_node = self._gpus
            intra = self._intra[p, d] = same_node(
                p, d - self.prefill, prefill=self.prefill, gpus_per_replica=g, gpus_per_node=per_node
            )
        return intra

    def __call__(self, rid: int, p: int, d: int) -> float:
        intra = self.within_node(p, d)
        key = (self._inp[rid], intra)
        t = self._cache.get(key)
        if t is None:
            call = Collective("send_recv", int(round(self.bytes_per_gpu[rid])), INTRA if intra else INTER)
            t = self._cache[key] = self._comms.time_s(call, self._device)[0]
        return t


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolStats:
    replicas: int
    requests: int
    """Requests prefilled (prefill pool) or decoded (decode pool) there."""
    steps: int
    busy_fraction: float
    """Step time of the pool's replicas over (replicas x the run's duration)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DisaggStats:
    """What the split adds to a serving result."""

    prefill: PoolStats
    decode: PoolStats
    gpus_per_node: int
    kv_bytes_per_token_per_gpu: float
    transfers: int
    transfers_within_node: int
    transfer_bytes_per_gpu: float
    """Prompt KV bytes sent by each GPU, all requests together."""
    transfer: Distribution
    """Wire time of one request's KV transfer."""
    handoff: Distribution
    """First token to the KV landing on the decode replica (waits for the prefill replica's links included)."""


def disagg_stats(sim: SimResult, duration_s: float, *, transfer: KvTransfer | None, gpus_per_node: int) -> DisaggStats:
    """The pools' loads and the transfers of a split simulation."""
    assert sim.decode_replica is not None and sim.transfer_start_s is not None and sim.transfer_end_s is not None
    P, R = sim.prefill_replicas, sim.replicas
    sent = ~np.isnan(sim.transfer_start_s)
    busy = np.zeros(R)
    steps = np.zeros(R, dtype=np.int64)
    for st in sim.steps:
        busy[st.replica] += st.duration_s
        steps[st.replica] += 1
    within = 0
    sent_bytes = 0.0
    if transfer is not None:
        within = sum(
            transfer.within_node(p, d) for p, d in zip(sim.replica[sent].tolist(), sim.decode_replica[sent].tolist())
        )
        sent_bytes = float(transfer.bytes_per_gpu[sent].sum())

    def pool(lo: int, hi: int, requests: int) -> PoolStats:
        frac = float(busy[lo:hi].sum() / ((hi - lo) * duration_s)) if duration_s > 0 else float("nan")
        return PoolStats(replicas=hi - lo, requests=requests, steps=int(steps[lo:hi].sum()), busy_fraction=frac)

    return DisaggStats(
        prefill=pool(0, P, len(sim.replica)),
        decode=pool(P, R, int((sim.decode_replica >= 0).sum())),
        gpus_per_node=gpus_per_node,
        kv_bytes_per_token_per_gpu=transfer.kv_bytes_per_token if transfer is not None else 0.0,
        transfers=int(sent.sum()),
        transfers_within_node=int(within),
        transfer_bytes_per_gpu=sent_bytes,
        transfer=Distribution.of((sim.transfer_end_s - sim.transfer_start_s)[sent]),
        handoff=Distribution.of((sim.transfer_end_s - sim.first_token_s)[sent]),
    )


def predict_serve_disagg(
    arch: ArchSpec,
    device,
    cfg: InferConfig,
    engine: EngineConfig,
    stream: RequestStream,
    *,
    prefill: int,
    decode: int,
    router: str = "round_robin",
    kernels,
    comms: CollectiveCostModel | None = None,
    gpus_per_node: int | None = None,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    step_cost: PricedStepCost | None = None,
    transfer_s: Callable[[int, int, int], float] | None = None,
    stop: StopRule | None = None,
) -> ServeResult:
    """Simulate ``stream`` on ``prefill`` prefill and ``decode`` decode replicas (see the module docstring);
    ``router`` places arrivals in the prefill pool, a prefilled request goes to the least-loaded decode
    replica. ``transfer_s``: the KV transfer's price instead of :class:`KvTransfer` (a test's); ``stop``: see
    :func:`simulate` (its counts hold for a split: a first token is counted at the prefill step, a finish
    at the last token, after the transfer)."""
    if prefill < 1 or decode < 1:
        raise OpcastError(f"--disaggregate {prefill}:{decode} needs >= 1 prefill and >= 1 decode replica, e.g. 1:3")
    cluster, reasons = replica_reasons(arch, device, cfg, engine.engine, stream, gpus_per_node)
    reasons += ep_replica_reasons(cfg, prefill, "prefill ") + ep_replica_reasons(cfg, decode, "decode ")
    reasons += replica_count_reasons(cfg, prefill + decode)
    if cluster is None or reasons:
        raise OpcastError(f"infeasible configuration: {'; '.join(reasons)}")
    capacity = kv_capacity(arch, device, cfg, engine, longest_tokens=stream.max_tokens)
    if comms is None:
        from opcast.predict.comm_learned import collective_cost_for

        comms = collective_cost_for(kernels)  # the collectives the step prices use by default
    step_s = step_cost
    if step_s is None:
        step_s = replica_step_cost(
            arch, device, cfg, engine, stream, gpus_per_node=cluster.gpus_per_node, kernels=kernels, comms=comms
        )
    node = gpus_per_node or device.gpus_per_node
    link = KvTransfer(
        stream,
        device,
        kv_bytes_per_token=capacity.kv_bytes_per_token,
        window=(arch.sliding_window, arch.windowed_layers / arch.n_layers) if arch.sliding_window else None,
        prefill=prefill,
        decode=decode,
        gpus_per_replica=cfg.tp * cfg.pp,
        gpus_per_node=node,
        comms=comms,
    )
    sim = simulate(
        stream,
        engine,
        step_s,
        kv_blocks=capacity.blocks,
        kv_layout=capacity.layout,
        replicas=prefill + decode,
        router=router,
        split=Split(prefill=prefill, transfer_s=transfer_s or link),
        stop=stop,
    )
    metrics = serve_metrics(sim, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    stats = disagg_stats(sim, metrics.duration_s, transfer=link, gpus_per_node=node)
    return ServeResult(
        arch=arch,
        device=device,
        config=cfg,
        engine=engine,
        replicas=prefill + decode,
        router=router,
        capacity=capacity,
        metrics=metrics,
        sim=sim,
        cost_sources=tuple(step_s.sources),
        disaggregated=stats,
    )
