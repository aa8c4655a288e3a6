"""Kernel times: one small protocol, a learned source and a flagged roofline fallback, cached.

A :class:`Kernel` is one unique op query ``(kind, params, dtype, direction, tensor_cores)``. A
*kernel-time source* (:class:`KernelTimeSource`) turns a batch of them into seconds on a device,
NaN where it cannot speak. :class:`KernelCostModel` asks its sources in order, labels every
answer with the source that gave it (``learned`` or ``roofline``) and caches it per device, so a
layer repeated 96 times, or a config search over thousands of layouts, costs each unique kernel
once.

Sources:

- :class:`LearnedKernelCost` wraps ``opcast.train.artifacts.ModelSet`` (``--models DIR`` or the
  embedded default); it answers only the (op, dtype, direction) groups the set covers.
- :class:`RooflineKernelCost`, the fallback, is ``max(FLOPs / (peak x eff_c), bytes / (bw x eff_m))``
  with the efficiencies of :data:`ROOFLINE_EFFICIENCY`. It has no constant terms, so a GPU with
  every spec doubled is exactly twice as fast on this path.

Collectives are not kernels here: :mod:`opcast.predict.comm` costs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.ops import get_op

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

LEARNED = "learned"
ROOFLINE = "roofline"

MATRIX_KINDS = frozenset({"gemm", "attention"})
"""Kinds whose math may run on tensor/matrix cores; the rest are vector (CUDA-core) work."""


# --------------------------------------------------------------------------- kernels

@dataclass(frozen=True, slots=True)
class Kernel:
    """One unique kernel query: hashable, so it is the cache key."""

    kind: str
    """Op registry kind."""
    params: tuple[tuple[str, int | bool | str], ...]
    """Shape parameters as (name, value) pairs in the registry's canonical order."""
    dtype: str
    """fp32 | tf32 | fp16 | bf16 | fp8."""
    direction: str = "fwd"
    """fwd | bwd."""
    tensor_cores: bool = False
    """Matrix math runs on tensor cores (fp32: as TF32)."""

    @property
    def param_dict(self) -> dict[str, int | bool | str]:
        return dict(self.params)

    def flops(self) -> float:
        return get_op(self.kind).flops(self.param_dict, self.direction, dtype_bytes(self.dtype))

    def bytes_moved(self) -> float:
        return get_op(self.kind).bytes_moved(self.param_dict, dtype_bytes(self.dtype), self.direction)


def uses_tensor_cores(kind: str, dtype: str, tensor_cores: bool | None = None) -> bool:
    """Whether a kernel's math runs on tensor cores: only matrix kinds; tf32 always; an explicit
    flag wins; by default fp32 does not (PyTorch leaves TF32 matmul off) and every other dtype
    does. The same rule as ``opcast.train.features.uses_tensor_cores`` (a test holds them together)."""
    if kind not in MATRIX_KINDS:
        return False
    if dtype == "tf32":
        return True
    if tensor_cores is not None:
        return bool(tensor_cores)
    return dtype != "fp32"


def kernel(kind: str, params: Mapping[str, int | bool | str], dtype: str, direction: str = "fwd",
           tensor_cores: bool | None = None) -> Kernel:
    """A :class:`Kernel` with its parameters in canonical order (no validation: graph builders
    produce valid shapes by construction; user input goes through :func:`validated_kernel`).
    ``tensor_cores`` resolves by :func:`uses_tensor_cores`."""
    names = get_op(kind).param_names
    return Kernel(kind, tuple((n, params[n]) for n in names), dtype, direction, uses_tensor_cores(kind, dtype, tensor_cores))


def validated_kernel(kind: str, params: Mapping[str, object], dtype: str, direction: str = "fwd",
                     tensor_cores: bool | None = None) -> Kernel:
    """A kernel from user input: the registry coerces and checks every parameter."""
    spec = get_op(kind)
    if spec.collective:
        raise OpcastError(f"{kind} is a collective; cost it with opcast.predict.comm")
    dtype_bytes(dtype)
    clean = spec.validate(params, direction)
    return kernel(spec.kind.value, clean, dtype, direction, tensor_cores)


# --------------------------------------------------------------------------- sources

class KernelTimeSource(Protocol):
    """Anything that can time a batch of kernels on a device."""

    name: str
    """Label written next to every time it gives (``learned``, ``roofline``)."""

    def covers(self, k: Kernel) -> bool:
        """Whether this source speaks for ``k``'s (op, dtype, direction) group."""
        ...

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        """Seconds per call, one per kernel; NaN where the source has no answer."""
        ...


@dataclass(frozen=True, slots=True)
class EfficiencyCurve:
    """Achievable fraction of a peak as a function of the op's size, interpolated linearly in
    log10(size) between anchors and held constant beyond the ends."""

    anchors: tuple[tuple[float, float], ...]
    """(size, efficiency) pairs with increasing size; size in GFLOP or MB as the field says."""

    def __call__(self, size: float) -> float:
        pts = self.anchors
        if size <= pts[0][0]:
            return pts[0][1]
        for (s0, e0), (s1, e1) in zip(pts, pts[1:]):
            if size <= s1:
                w = (math.log10(size) - math.log10(s0)) / (math.log10(s1) - math.log10(s0))
                return e0 + w * (e1 - e0)
        return pts[-1][1]


@dataclass(frozen=True, kw_only=True, slots=True)
class RooflineEfficiency:
    """Efficiency constants of the roofline fallback: data, not code (Calculon's convention).

    Source: Calculon (Isaev et al., SC'23; github.com/calculon-ai/calculon, ``systems/a100_80g.json``),
    whose A100 system file gives matrix-unit efficiency by op size (0.1 at 0, 0.6 at 1 GFLOP, 0.9 at
    16, 0.95 at >= 128 GFLOP), vector-unit efficiency (0.1 at 0, 0.5 at 1, 0.95 at >= 16 GFLOP) and
    HBM efficiency by bytes moved (0.3 at 0, 0.6 at 1 MB, 0.75 at 10 MB, 0.9 at >= 100 MB). Calculon
    steps between anchors; we interpolate in log-size and put its size-0 anchor at 1/1000 of the next
    one (1 MFLOP, 1 kB), so a tiny op is not priced at the floor efficiency. Sizes do not depend on
    the hardware, so these curves keep the fallback scale-invariant. They were fitted by Calculon's
    authors to A100 Megatron runs and are not tuned here.
    """

    matrix: EfficiencyCurve = EfficiencyCurve(anchors=((1e-3, 0.1), (1.0, 0.6), (16.0, 0.9), (128.0, 0.95)))
    """Tensor-core math vs GFLOP of the call."""
    vector: EfficiencyCurve = EfficiencyCurve(anchors=((1e-3, 0.1), (1.0, 0.5), (16.0, 0.95)))
    """CUDA-core / vector math vs GFLOP of the call."""
    memory: EfficiencyCurve = EfficiencyCurve(anchors=((1e-3, 0.3), (1.0, 0.6), (10.0, 0.75), (100.0, 0.9)))
    """Device-memory bandwidth vs MB moved by the call."""
    source: str = "Calculon (Isaev et al. SC'23) systems/a100_80g.json efficiency tables, log-size interpolation"


ROOFLINE_EFFICIENCY = RooflineEfficiency()


@dataclass(frozen=True, kw_only=True, slots=True)
class RooflineTerms:
    """The two bounds of one kernel on one device, seconds."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


class RooflineKernelCost:
    """The explicit, flagged fallback: ``max(FLOPs / (peak x eff), bytes / (bw x eff))``."""

    name = ROOFLINE

    def __init__(self, efficiency: RooflineEfficiency = ROOFLINE_EFFICIENCY) -> None:
        self.efficiency = efficiency

    def covers(self, k: Kernel) -> bool:
        return True

    def terms(self, k: Kernel, device: DeviceSpec) -> RooflineTerms:
        flops, moved = k.flops(), k.bytes_moved()
        matrix = k.kind in MATRIX_KINDS
        peak = device.peak_flops(_peak_dtype(k.dtype), tensor_cores=matrix and k.tensor_cores)
        curve = self.efficiency.matrix if matrix and k.tensor_cores else self.efficiency.vector
        compute = flops / (peak * curve(flops / 1e9)) if flops else 0.0
        memory = moved / (device.mem_bw_bytes_per_s * self.efficiency.memory(moved / 1e6)) if moved else 0.0
        return RooflineTerms(flops=flops, bytes=moved, compute_s=compute, memory_s=memory)

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        return np.array([self.terms(k, device).time_s for k in kernels], dtype=float)


def _peak_dtype(dtype: str) -> str:
    return "fp32" if dtype == "tf32" else dtype


class LearnedKernelCost:
    """Adapter of a fitted ``opcast.train.artifacts.ModelSet`` to :class:`KernelTimeSource`."""

    name = LEARNED

    def __init__(self, model_set: Any, label: str) -> None:
        self.model_set = model_set
        self.label = label
        """Where the models came from (a folder, or 'embedded default')."""
        self._covers: dict[tuple[str, str, str], bool] = {}

    def warm(self) -> int:
        """Load every predictor now (a ModelSet loads them on first use); returns how many. A
        benchmark calls this so that 'after the models are loaded' means what it says."""
        keys = list(getattr(self.model_set, "predictors", {}) or {})
        load = getattr(self.model_set, "estimator", None)
        if load is not None:
            for key in keys:
                load(key)
        return len(keys)

    def covers(self, k: Kernel) -> bool:
        key = (k.kind, k.dtype, k.direction)
        hit = self._covers.get(key)
        if hit is None:
            hit = self._covers[key] = bool(self.model_set.covers(*key))
        return hit

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        import pandas as pd

        rows = []
        for k in kernels:
            row: dict[str, object] = {"op": k.kind, "dtype": k.dtype, "direction": k.direction, "tensor_cores": k.tensor_cores}
            row.update(k.params)
            rows.append(row)
        out = np.asarray(self.model_set.predict_s(pd.DataFrame(rows), device), dtype=float)
        if out.shape != (len(kernels),):
            raise OpcastError(f"learned models {self.label} returned {out.shape} predictions for {len(kernels)} kernels; "
                              "refit them with this opcast (opcast train fit)")
        out[~np.isfinite(out) | (out <= 0)] = np.nan
        return out


# --------------------------------------------------------------------------- decompositions

def decompose(k: Kernel) -> list[tuple[Kernel, int]] | None:
    """The kernels an op runs as, where it is not one kernel: eager attention is two batched GEMMs
    around a scale, a mask and a softmax over the ``[b*h, s_q, s_kv]`` scores (Megatron's unfused
    core attention, Hugging Face's eager path; K/V heads repeated for GQA), and in backward the four
    gradient GEMMs, the softmax backward and the scale's. Used to price an uncovered ``attention``
    kernel from learned GEMM/softmax/elementwise models; None for kernels that are one kernel."""
    if k.kind != "attention":
        return None
    p = k.param_dict
    if p["impl"] != "eager":
        return None
    bh, sq, skv, d = p["batch"] * p["heads"], p["seq_q"], p["seq_kv"], p["head_dim"]
    scores = bh * sq * skv

    def g(m: int, n: int, kk: int) -> Kernel:
        return kernel("gemm", {"b": bh, "m": m, "n": n, "k": kk}, k.dtype, "fwd", k.tensor_cores)

    def ew(fn: str, direction: str = "fwd") -> Kernel:
        return kernel("elementwise", {"numel": scores, "fn": fn}, k.dtype, direction)

    softmax = {"rows": bh * sq, "cols": skv}
    if k.direction == "fwd":
        parts = [g(sq, skv, d), ew("div_scalar"), *([ew("add")] if p["causal"] else []),
                 kernel("softmax", softmax, k.dtype), g(sq, d, skv)]
    else:
        parts = [g(sq, skv, d), g(skv, d, sq),            # dP = dO V^T, dV = P^T dO
                 kernel("softmax", softmax, k.dtype, "bwd"), ew("div_scalar", "bwd"),
                 g(sq, d, skv), g(skv, d, sq)]            # dQ = dS K, dK = dS^T Q
    return [(part, 1) for part in parts]


# --------------------------------------------------------------------------- the composite, cached

@dataclass(kw_only=True, slots=True)
class KernelCostModel:
    """Learned where covered, roofline elsewhere; every answer labelled and cached per device."""

    sources: tuple[KernelTimeSource, ...]
    """In order of preference; the last must cover everything (the roofline)."""
    notes: list[str] = field(default_factory=list)
    """Why a source is missing (no train package, no default models), for ``cost_sources``."""
    models_label: str | None = None
    """Where the learned models came from, or None."""
    _cache: dict[Any, dict[Kernel, tuple[float, str]]] = field(default_factory=dict)

    @property
    def roofline(self) -> RooflineKernelCost:
        for s in self.sources:
            if isinstance(s, RooflineKernelCost):
                return s
        return RooflineKernelCost()

    def lookup(self, kernels: Sequence[Kernel], device: DeviceSpec) -> dict[Kernel, tuple[float, str]]:
        """(seconds, source) for every kernel, computing only the ones not cached yet."""
        cache = self._cache.get(device)
        if cache is None:
            cache = self._cache[device] = {}
        todo = [k for k in dict.fromkeys(kernels) if k not in cache]
        *preferred, fallback = self.sources
        if preferred and todo:
            # One batch per source: the kernels themselves plus the parts of uncovered multi-kernel
            # ops (a learned model's per-call overhead dwarfs its per-row cost).
            composite = {k: parts for k in todo if not any(s.covers(k) for s in preferred)
                         and (parts := decompose(k)) and all(any(s.covers(p) for s in preferred) for p, _ in parts)}
            batch = list(dict.fromkeys([*todo, *(p for parts in composite.values() for p, _ in parts if p not in cache)]))
            for source in preferred:
                batch = self._ask(source, batch, device, cache)
            for k, parts in composite.items():
                if all(cache.get(p, (0.0, ""))[1] == LEARNED for p, _ in parts):
                    cache[k] = (sum(n * cache[p][0] for p, n in parts), LEARNED)
            todo = [k for k in todo if k not in cache]
        todo = self._ask(fallback, todo, device, cache)
        if todo:  # the last source always answers; reaching here is a bug in a source
            raise OpcastError(f"no kernel-time source could time {todo[0].kind} {dict(todo[0].params)}")
        return cache

    @staticmethod
    def _ask(source: KernelTimeSource, todo: list[Kernel], device: DeviceSpec,
             cache: dict[Kernel, tuple[float, str]]) -> list[Kernel]:
        """Cache what ``source`` answers among ``todo``; return the rest."""
        mine = [k for k in todo if source.covers(k)]
        if mine:
            for k, t in zip(mine, source.predict_s(mine, device)):
                if np.isfinite(t):
                    cache[k] = (float(t), source.name)
        return [k for k in todo if k not in cache]

    def warm(self) -> int:
        """Load every learned predictor now; returns how many."""
        return sum(s.warm() for s in self.sources if isinstance(s, LearnedKernelCost))

    def time_s(self, k: Kernel, device: DeviceSpec) -> tuple[float, str]:
        return self.lookup([k], device)[k]

    def describe(self) -> dict[str, object]:
        """The ``cost_sources`` header: which kernel sources exist and why one is missing."""
        return {
            "kernel_models": self.models_label,
            "roofline_efficiency": self.roofline.efficiency.source,
            "notes": list(self.notes),
        }


def roofline_only(note: str = "roofline forced") -> KernelCostModel:
    return KernelCostModel(sources=(RooflineKernelCost(),), notes=[note])


def load_kernel_cost(models: str | Path | None = None, *, use_learned: bool = True) -> KernelCostModel:
    """The kernel cost model for ``--models DIR`` (errors are the user's to fix), or the embedded
    default (its absence falls back to the roofline, said in ``notes``)."""
    if not use_learned:
        return roofline_only("learned models disabled (--roofline): every kernel uses the roofline fallback")
    try:
        from opcast.train.artifacts import load_model_set
    except ImportError as err:
        if models is not None:
            raise OpcastError(f"--models {models} needs opcast.train.artifacts, which cannot be imported ({err}); "
                              "install the full opcast or drop --models") from None
        return roofline_only(f"learned models unavailable (opcast.train.artifacts cannot be imported: {err}); "
                             "every kernel uses the roofline fallback")
    if models is not None:
        path = Path(models)
        if not path.exists():
            raise OpcastError(f"--models {path} does not exist; give a folder written by `opcast train fit`, "
                              "or drop --models to use the embedded default")
        model_set = load_model_set(path)
        label = str(path)
    else:
        try:
            model_set = load_model_set(None)
        except OpcastError as err:
            return roofline_only(f"default models unavailable ({err}); every kernel uses the roofline fallback")
        label = "embedded default (models/default)"
    return KernelCostModel(sources=(LearnedKernelCost(model_set, label), RooflineKernelCost()), models_label=label,
                           notes=[f"learned models from {label} where they cover the (op, dtype, direction); roofline elsewhere"])
