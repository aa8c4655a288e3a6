"""One serving deployment end to end: replicas of ``arch`` at tp x pp on ``device`` under an engine,
fed a request stream: KV capacity, step prices, the simulation and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from opcast.archs import ArchSpec
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.parallel import (
    InferConfig,
    device_reasons,
    ep_replica_reasons,
    replica_count_reasons,
    validate_infer,
)
from opcast.predict.serve.engine import EngineConfig
from opcast.predict.serve.kv_cache import KvCapacity, kv_capacity
from opcast.predict.serve.metrics import ServeMetrics, serve_metrics
from opcast.predict.serve.requests import RequestStream
from opcast.predict.serve.simulate import SimResult, StopRule, simulate
from opcast.predict.serve.step_cost import PricedStepCost

if TYPE_CHECKING:
    from opcast.predict.serve.disagg import DisaggStats


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeResult:
    arch: ArchSpec
    device: DeviceSpec
    config: InferConfig
    """tp, pp, precision and attention of each replica (its batch fields unused)."""
    engine: EngineConfig
    replicas: int
    router: str
    capacity: KvCapacity
    metrics: ServeMetrics
    sim: SimResult
    cost_sources: tuple[str, ...]
    """Where kernel times came from (learned, roofline)."""
    disaggregated: DisaggStats | None = None
    """The prefill and decode pools and their KV transfers (:mod:`~opcast.predict.serve.disagg`); None colocated."""


def replica_reasons(
    arch: ArchSpec, device, cfg: InferConfig, engine: str, stream: RequestStream, gpus_per_node: int | None
):
    """(cluster of one replica, every reason it cannot run the stream's longest request under ``engine``)."""
    probe = replace(cfg, batch=1, prompt_len=1, gen_len=max(1, stream.max_tokens - 1), engine=engine)
    cluster, reasons = validate_infer(arch, device, probe, gpus_per_node=gpus_per_node, check_device=False)
    return cluster, [*device_reasons(device, cfg.precision), *reasons]


def replica_step_cost(
    arch: ArchSpec,
    device,
    cfg: InferConfig,
    engine: EngineConfig,
    stream: RequestStream,
    *,
    gpus_per_node: int,
    kernels,
    comms: CollectiveCostModel | None = None,
) -> PricedStepCost:
    """The step prices of one replica, tabulated to ``engine``'s limits and ``stream``'s longest request
    (``gpus_per_node``: of the replica's resolved cluster). The steps run under ``engine``'s engine,
    which decides each TP all-reduce (its own kernel or NCCL's,
    :func:`opcast.predict.serve.engine.tp_all_reduce_kind`)."""
    return PricedStepCost(
        arch,
        device,
        replace(cfg, engine=engine.engine),
        gpus_per_node=gpus_per_node,
        kernels=kernels,
        comms=comms,
        max_tokens=engine.max_num_batched_tokens,
        max_seqs=min(engine.max_num_seqs, engine.max_num_batched_tokens),
        max_len=stream.max_tokens,
    )


def predict_serve(
    arch: ArchSpec,
    device,
    cfg: InferConfig,
    engine: EngineConfig,
    stream: RequestStream,
    *,
    replicas: int = 1,
    router: str = "round_robin",
    kernels,
    comms: CollectiveCostModel | None = None,
    gpus_per_node: int | None = None,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    step_cost: PricedStepCost | None = None,
    stop: StopRule | None = None,
) -> ServeResult:
    """Simulate ``stream`` on the deployment; an infeasible one raises :class:`OpcastError` with every reason.

    ``step_cost``: the :func:`replica_step_cost` of these same arguments, built before (a search reuses
    one table for every deployment that needs it); ``stop``: see :func:`simulate` (raises
    :class:`~opcast.predict.serve.simulate.StoppedEarly`)."""
    cluster, reasons = replica_reasons(arch, device, cfg, engine.engine, stream, gpus_per_node)
    reasons += ep_replica_reasons(cfg, replicas) + replica_count_reasons(cfg, replicas)
    if cluster is None or reasons:
        raise OpcastError(f"infeasible configuration: {'; '.join(reasons)}")
    capacity = kv_capacity(arch, device, cfg, engine, longest_tokens=stream.max_tokens)
    step_s = step_cost
    if step_s is None:
        step_s = replica_step_cost(
            arch, device, cfg, engine, stream, gpus_per_node=cluster.gpus_per_node, kernels=kernels, comms=comms
        )
    sim = simulate(
        stream,
        engine,
        step_s,
        kv_blocks=capacity.blocks,
        kv_layout=capacity.layout,
        replicas=replicas,
        router=router,
        stop=stop,
    )
    return ServeResult(
        arch=arch,
        device=device,
        config=cfg,
        engine=engine,
        replicas=replicas,
        router=router,
        capacity=capacity,
        metrics=serve_metrics(sim, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s),
        sim=sim,
        cost_sources=tuple(step_s.sources),
    )
