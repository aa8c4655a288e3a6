"""Microbenchmark builders, one module per op kind.

A builder turns one validated plan point (:class:`BuildRequest`) into a zero-argument closure
that runs the op once on the device, forward or backward; :mod:`opcast.collect.timing` times
the closure. Every compute kind of the registry has exactly one builder here, but those only replays measure
(:attr:`opcast.ops.OpSpec.benchmarked`: the fused MoE layer).
"""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops import attention, cross_entropy, elementwise, embedding, gemm, norm, optimizer, rope, softmax
from opcast.collect.ops.common import BuildRequest, UnsupportedPoint
from opcast.ops import op_kinds

BUILDERS: dict[str, Callable[[BuildRequest], Callable[[], object]]] = {
    "gemm": gemm.build,
    "attention": attention.build,
    "layernorm": norm.build_layernorm,
    "rmsnorm": norm.build_rmsnorm,
    "softmax": softmax.build,
    "elementwise": elementwise.build,
    "embedding": embedding.build,
    "cross_entropy": cross_entropy.build,
    "rope": rope.build,
    "optimizer": optimizer.build,
}

_missing = set(op_kinds(collective=False, benchmarked=True)) ^ set(BUILDERS)
if _missing:  # the registry and the builders must cover the same kinds
    raise RuntimeError(f"op kinds without a builder or registry entry: {sorted(_missing)}")

__all__ = ["BUILDERS", "BuildRequest", "UnsupportedPoint"]
