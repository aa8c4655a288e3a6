"""Kernel times: one small protocol, a learned source and a flagged roofline fallback, cached.

A :class:`Kernel` is one unique op query ``(kind, params, dtype, direction, tensor_cores)``. A
*kernel-time source* (:class:`KernelTimeSource`) turns a batch of them into seconds on a device,
NaN where it cannot speak. :class:`KernelCostModel` asks its sources in order, labels every
answer with the source that gave it (``learned`` or ``roofline``) and caches it per device, so a
layer repeated 96 times, or a config search over thousands of layouts, costs each unique kernel
once.

Sources:

- :class:`LearnedKernelCost` wraps ``opcast.train.artifacts.ModelSet`` (``--models DIR`` or the
  embedded default); it answers only the (op, dtype, direction) groups the set covers. A device
  outside the hardware a predictor was fitted on (:class:`HardwareRange`, from the training
  devices' specs recorded in ``meta.json``) is an extrapolation: the answer is flagged, and with
  ``in_range_only`` (the CLI's ``--analytic``) the roofline answers instead, flagged too.
- :class:`RooflineKernelCost`, the fallback, is ``max(FLOPs / (peak x eff_c), bytes / (bw x eff_m))``
  with the efficiencies of :data:`ROOFLINE_EFFICIENCY`. It has no constant terms, so a GPU with
  every spec doubled is exactly twice as fast on this path.

:func:`bottleneck` says where a kernel sits on the roofline of a device (compute- or memory-bound,
arithmetic intensity against the ridge point) and how much of the peak its predicted time uses.

Physical bounds (:meth:`LearnedKernelCost.bound`, applied by :class:`KernelCostModel` to every
learned answer, reported by :meth:`KernelCostModel.bound_flag` and in ``describe()``):

- no kernel runs faster than its roofline at the peak, ``max(FLOPs / peak, bytes / bw)``
  (datasheet peak for the kernel's dtype and tensor-core use, no efficiency derating);
- on a device its predictor was not fitted on, the kernel's utilisation of that roofline (of its
  bounding resource) stays within what the same model predicts for the same kernel on the
  training devices, ``[min, max]`` (:data:`UTILISATION_MARGIN`), no higher than on a training
  device with less of that resource and no lower than on one with more, so its speed-up against
  a training device is at most the ratio of the resource that bounds the kernel (where training
  devices disagree, a GPU with more of the resource reaching a larger share of it, the lower
  utilisation is kept);
- monotone in the resources: such a device with at least the peak and the bandwidth of a training
  device is never slower on a kernel than that training device, and one with at most both never faster.

Devices a predictor was fitted on get only the roofline floor.

Collectives are not kernels here: :mod:`opcast.predict.comm` costs them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.ops import get_op
from opcast.predict.intervals import Residuals

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
    spec = get_op(kind)
    if spec.defaults and any(n not in params for n in spec.defaults):
        params = {**spec.defaults, **params}
    return Kernel(kind, tuple((n, params[n]) for n in spec.param_names), dtype, direction,
                  uses_tensor_cores(kind, dtype, tensor_cores))


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
        peak = kernel_peak(k, device)
        curve = self.efficiency.matrix if matrix and k.tensor_cores else self.efficiency.vector
        compute = flops / (peak * curve(flops / 1e9)) if flops else 0.0
        memory = moved / (device.mem_bw_bytes_per_s * self.efficiency.memory(moved / 1e6)) if moved else 0.0
        return RooflineTerms(flops=flops, bytes=moved, compute_s=compute, memory_s=memory)

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        return np.array([self.terms(k, device).time_s for k in kernels], dtype=float)


def _peak_dtype(dtype: str) -> str:
    return "fp32" if dtype == "tf32" else dtype


def kernel_peak(k: Kernel, device: DeviceSpec) -> float:
    """The dense peak FLOP/s ``k`` runs against: tensor-core rate for matrix kinds on tensor
    cores, CUDA-core rate otherwise (:meth:`DeviceSpec.peak_flops`)."""
    return device.peak_flops(_peak_dtype(k.dtype), tensor_cores=k.kind in MATRIX_KINDS and k.tensor_cores)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bottleneck:
    """Where one kernel sits on a device's roofline, and how much of it a predicted time uses."""

    bound: str
    """``compute`` or ``memory``: the larger of the two achievable-roofline terms (the ones the
    fallback prices with, peaks derated by :data:`ROOFLINE_EFFICIENCY`), i.e. the spec the
    analytical time of this kernel scales with."""
    flops: float
    bytes: float
    intensity: float
    """Arithmetic intensity, FLOP per byte of device memory (registry FLOPs / compulsory bytes)."""
    ridge: float
    """The device's ridge point for this kernel's peak, FLOP/byte: ``peak / mem_bw`` (datasheet)."""
    compute_utilisation: float
    """``FLOPs / (time x peak)``: the fraction of the dense peak the predicted time achieves."""
    memory_utilisation: float
    """``bytes / (time x mem_bw)``: the fraction of the memory bandwidth it achieves."""

    @property
    def utilisation(self) -> float:
        """Utilisation of the bound resource."""
        return self.compute_utilisation if self.bound == "compute" else self.memory_utilisation


def bottleneck(k: Kernel, device: DeviceSpec, time_s: float, roofline: RooflineKernelCost | None = None) -> Bottleneck:
    """:class:`Bottleneck` of ``k`` on ``device`` for a predicted ``time_s`` per call."""
    terms = (roofline or _DEFAULT_ROOFLINE).terms(k, device)
    peak, bw = kernel_peak(k, device), device.mem_bw_bytes_per_s
    return Bottleneck(bound=terms.bound, flops=terms.flops, bytes=terms.bytes,
                      intensity=terms.flops / terms.bytes if terms.bytes else math.inf, ridge=peak / bw,
                      compute_utilisation=terms.flops / (time_s * peak) if time_s > 0 else 0.0,
                      memory_utilisation=terms.bytes / (time_s * bw) if time_s > 0 else 0.0)


_DEFAULT_ROOFLINE = RooflineKernelCost()


def peak_roofline_s(k: Kernel, device: DeviceSpec) -> tuple[float, str]:
    """(seconds, bounding resource) of ``k`` at the device's datasheet peaks, no efficiency
    derating: ``max(FLOPs / peak, bytes / mem_bw)``, the time no implementation can beat; NaN
    when the device has no peak for the kernel's dtype."""
    try:
        peak = kernel_peak(k, device)
    except OpcastError:
        return math.nan, "compute"
    return _roof_at_peak(k.flops(), k.bytes_moved(), peak, device.mem_bw_bytes_per_s)


def _roof_at_peak(flops: float, moved: float, peak: float, bw: float) -> tuple[float, str]:
    compute, memory = flops / peak, moved / bw
    return (compute, "compute") if compute >= memory else (memory, "memory")


# --------------------------------------------------------------------------- physical bounds

UTILISATION_MARGIN = 1.0
"""How far beyond the training devices' span a learned model may move a kernel's utilisation
of its roofline on a device it was not fitted on: ``[min / margin, min(1, max x margin)]``. 1.0:
exactly the span, so a device with twice the bandwidth runs a memory-bound kernel at most twice
as fast as the training device that uses its bandwidth best."""

FLOOR, SPAN, RATIO, MONOTONE = "roofline_floor", "utilisation_span", "resource_ratio", "monotone"
BOUND_RULES: dict[str, str] = {
    FLOOR: "no faster than the roofline at the datasheet peak",
    SPAN: f"utilisation of the bounding resource within the span of the training devices (margin {UTILISATION_MARGIN:g})",
    RATIO: "utilisation no higher than on a training device with less of the bounding resource and no lower than "
           "on one with more (speed-ups at most the resource ratio; where the training devices disagree, the lower)",
    MONOTONE: "no slower than a training device with less of both peak and bandwidth, no faster than one with more "
              "(the first wins where the training devices disagree)",
}
"""The rules of :meth:`LearnedKernelCost.bound`, by the name its reasons carry."""


# --------------------------------------------------------------------------- hardware range

RANGE_SLACK = 0.02
"""A device spec within 2 % of a predictor's fitted range counts as inside it (datasheet
rounding, re-measured specs); a fitted feature range gets the same slack on its (mostly log) scale."""

_DEVICE_FEATURES: dict[str, str] = {
    "log_peak_flops": "peak_flops", "log_mem_bw_bytes_per_s": "mem_bw_bytes_per_s", "log_sm_count": "sm_count",
    "log_l2_bytes": "l2_bytes", "log_clock_hz": "boost_clock_hz", "log_ridge": "ridge_flop_per_byte",
    "fp32_lanes_per_sm": "fp32_lanes_per_sm", "is_cpu": "is_cpu",
}
"""Device features of ``opcast.train.features`` -> the spec quantity each reads."""


def _device_quantities(device: DeviceSpec, k: Kernel) -> dict[str, float] | None:
    """The spec quantities of ``device`` a predictor of ``k``'s group reads (None: no peak for its dtype)."""
    try:
        peak = kernel_peak(k, device)
    except OpcastError:
        return None
    return {"peak_flops": peak, "mem_bw_bytes_per_s": device.mem_bw_bytes_per_s, "sm_count": float(device.sm_count),
            "l2_bytes": float(device.l2_bytes), "boost_clock_hz": device.boost_clock_hz,
            "ridge_flop_per_byte": peak / device.mem_bw_bytes_per_s, "fp32_lanes_per_sm": float(device.fp32_lanes_per_sm),
            "is_cpu": float(device.vendor == "cpu")}


class HardwareRange:
    """The hardware (and, where recorded, feature) range each predictor of a model set was fitted on.

    Read from ``meta.json``: a predictor's ``devices`` (names) and the set's ``device_specs``
    (name -> catalog-style spec) give, for every device quantity the predictor reads (its
    ``features``; all of them when none is listed), the [min, max] over its training devices; a
    query device outside one of them by more than :data:`RANGE_SLACK` is an extrapolation. A
    predictor entry that records ``feature_ranges`` (feature -> [min, max] over its training rows)
    is also checked feature by feature, which covers shapes too. What is not recorded is not
    checked, and :attr:`notes` says so.
    """

    def __init__(self, meta: Mapping[str, Any] | None) -> None:
        self.meta = meta or {}
        self.notes: list[str] = []
        self._specs: dict[str, DeviceSpec] = {}
        self._reasons: dict[tuple[Any, ...], str | None] = {}
        specs = self.meta.get("device_specs")
        if not isinstance(specs, Mapping):
            self.notes.append("the model set records no device_specs: learned predictions are not range-checked")
            return
        from opcast.hardware import spec_from_dict

        for name, raw in specs.items():
            try:
                self._specs[str(name)] = spec_from_dict(raw, f"device_specs[{name}] of the model set")
            except OpcastError:
                self.notes.append(f"device spec {name} of the model set is invalid: its range is not checked")
        predictors = self.meta.get("predictors", {})
        if predictors and not any("feature_ranges" in e for e in predictors.values() if isinstance(e, Mapping)):
            self.notes.append("hardware range checked against the training devices' specs; shape ranges are not "
                              "recorded in the model set and are not checked")

    def fitted_on(self, key: str) -> tuple[str, ...]:
        """Names of the devices predictor ``key`` was fitted on (empty when not recorded)."""
        entry = self.meta.get("predictors", {}).get(key)
        return tuple(str(n) for n in entry.get("devices", ())) if isinstance(entry, Mapping) else ()

    def training_specs(self, key: str) -> tuple[DeviceSpec, ...]:
        """The specs (from ``device_specs``) of the devices predictor ``key`` was fitted on."""
        return tuple(self._specs[n] for n in self.fitted_on(key) if n in self._specs)

    def reason(self, key: str, k: Kernel, device: DeviceSpec) -> str | None:
        """Why ``device`` is outside the hardware predictor ``key`` was fitted on, or None."""
        cache_key = (key, k.dtype, k.tensor_cores, device)
        if cache_key in self._reasons:
            return self._reasons[cache_key]
        entry = self.meta.get("predictors", {}).get(key)
        why = None
        if isinstance(entry, Mapping):
            names = [str(n) for n in entry.get("devices", ()) if str(n) in self._specs]
            listed = [_DEVICE_FEATURES[f] for f in entry.get("features", ()) if f in _DEVICE_FEATURES]
            wanted = listed or list(_DEVICE_FEATURES.values())
            mine = _device_quantities(device, k)
            fitted = [q for n in names if (q := _device_quantities(self._specs[n], k)) is not None]
            if mine is not None and fitted:
                out = []
                for q in wanted:
                    lo, hi, v = min(f[q] for f in fitted), max(f[q] for f in fitted), mine[q]
                    if q == "is_cpu":
                        if not lo <= v <= hi:
                            out.append("a CPU, fitted on GPUs only" if v else "a GPU, fitted on CPUs only")
                    elif v < lo * (1 - RANGE_SLACK) or v > hi * (1 + RANGE_SLACK):
                        out.append(f"{q} {v:.3g} {'below' if v < lo else 'above'} {lo:.3g}..{hi:.3g}")
                if out:
                    why = f"{key} fitted on {', '.join(names)}: {'; '.join(out)}"
        self._reasons[cache_key] = why
        return why

    def feature_reasons(self, key: str, kernels: Sequence[Kernel], device: DeviceSpec, feats: Any = None) -> dict[Kernel, str]:
        """Kernels of group ``key`` whose features leave the predictor's recorded ``feature_ranges``
        (``feats``: their feature rows, when the caller computed them already)."""
        entry = self.meta.get("predictors", {}).get(key)
        ranges = entry.get("feature_ranges") if isinstance(entry, Mapping) else None
        if not ranges or not kernels:
            return {}
        if feats is None:
            from opcast.train.features import features

            feats = features(_query_frame(kernels), device)
        out: dict[Kernel, str] = {}
        for name, bounds in ranges.items():
            if name not in feats.columns:
                continue
            lo, hi = float(bounds[0]), float(bounds[1])
            values = feats[name].to_numpy(dtype=float)
            for k, v in zip(kernels, values):
                if k not in out and np.isfinite(v) and (v < lo - RANGE_SLACK or v > hi + RANGE_SLACK):
                    out[k] = f"{key}: feature {name} = {v:.3g} outside its fitted {lo:.3g}..{hi:.3g}"
        return out


def _query_frame(kernels: Sequence[Kernel]) -> Any:
    """Kernels as query rows of the dataset schema (op, dtype, direction, tensor_cores, params)."""
    import pandas as pd

    rows = []
    for k in kernels:
        row: dict[str, object] = {"op": k.kind, "dtype": k.dtype, "direction": k.direction, "tensor_cores": k.tensor_cores}
        row.update(k.params)
        rows.append(row)
    return pd.DataFrame(rows)


class LearnedKernelCost:
    """Adapter of a fitted ``opcast.train.artifacts.ModelSet`` to :class:`KernelTimeSource`."""

    name = LEARNED

    def __init__(self, model_set: Any, label: str) -> None:
        self.model_set = model_set
        self.label = label
        """Where the models came from (a folder, or 'embedded default')."""
        self._covers: dict[tuple[str, str, str], bool] = {}
        self._residuals: dict[tuple[str, str], Residuals | None] = {}
        self._groups: dict[tuple[str, str, str, bool], str] = {}
        self._on_training: dict[str, dict[Kernel, float]] = {}
        """Training device name -> this source's raw time of each kernel asked there (for :meth:`bound`)."""
        meta = getattr(model_set, "meta", None)
        self.range = HardwareRange(meta if isinstance(meta, Mapping) else None)
        """The hardware each predictor was fitted on (:class:`HardwareRange`)."""

    def group_of(self, k: Kernel) -> str:
        """The predictor group key of ``k`` (:func:`opcast.train.features.group_key`), memoised."""
        memo = (k.kind, k.direction, k.dtype, k.tensor_cores)
        key = self._groups.get(memo)
        if key is None:
            from opcast.train.features import dtype_class, group_key

            key = self._groups[memo] = group_key(k.kind, k.direction, dtype_class(k.kind, k.dtype, k.tensor_cores))
        return key

    def out_of_range(self, kernels: Sequence[Kernel], device: DeviceSpec) -> dict[Kernel, str]:
        """Why each of ``kernels`` (covered ones) would be an extrapolation on ``device``; the
        kernels inside the fitted range are absent."""
        if not self.range.meta.get("predictors") or not kernels:
            return {}
        try:
            import opcast.train.features  # noqa: F401
        except ImportError:
            return {}
        out: dict[Kernel, str] = {}
        by_key: dict[str, list[Kernel]] = {}
        for k in kernels:
            key = self.group_of(k)
            why = self.range.reason(key, k, device)
            if why:
                out[k] = why
            else:
                by_key.setdefault(key, []).append(k)
        if by_key:  # one feature computation for every group (pandas overhead is per call)
            from opcast.train.features import features

            todo = [k for ks in by_key.values() for k in ks]
            feats = features(_query_frame(todo), device).reset_index(drop=True)
            start = 0
            for key, ks in by_key.items():
                rows = feats.iloc[start:start + len(ks)]
                start += len(ks)
                out.update(self.range.feature_reasons(key, ks, device, rows))
        return out

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

    def residuals(self, k: Kernel, device: DeviceSpec) -> Residuals | None:
        """The held-out residuals of the predictor that prices ``k`` on ``device`` (None when the
        model set records none)."""
        get = getattr(self.model_set, "residuals", None)
        if get is None:
            return None
        key = self.group_of(k)
        memo = self._residuals.get((key, device.name), False)
        if memo is False:
            got = get(key, device.name)
            memo = self._residuals[(key, device.name)] = Residuals(key, *got) if got is not None else None
        return memo

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        out = np.asarray(self.model_set.predict_s(_query_frame(kernels), device), dtype=float)
        if out.shape != (len(kernels),):
            raise OpcastError(f"learned models {self.label} returned {out.shape} predictions for {len(kernels)} kernels; "
                              "refit them with this opcast (opcast train fit)")
        out[~np.isfinite(out) | (out <= 0)] = np.nan
        return out

    def bound(self, kernels: Sequence[Kernel], times: np.ndarray, device: DeviceSpec,
              margin: float = UTILISATION_MARGIN) -> tuple[np.ndarray, dict[Kernel, tuple[str, str]]]:
        """``times`` (this source's answers for ``kernels`` on ``device``) held to physics
        (:data:`BOUND_RULES`): the roofline floor everywhere; on a device a kernel's predictor was
        not fitted on, also the utilisation span of its training devices and monotonicity
        against them. Returns the bounded times and, for each kernel a rule moved, (rule, why).
        The training devices' times come from this source in one batched call per device, cached."""
        out = np.array(times, dtype=float)
        why: dict[Kernel, tuple[str, str]] = {}
        keys = [self.group_of(k) for k in kernels]
        work = [(k.flops(), k.bytes_moved()) for k in kernels]
        peaks: dict[tuple[str, str, bool], float] = {}

        def roof(i: int, spec: DeviceSpec) -> tuple[float, float, str]:
            """(roofline seconds at the peak, the peak, the bounding resource) of kernel i on spec."""
            k = kernels[i]
            memo = (spec.name, k.dtype, k.kind in MATRIX_KINDS and k.tensor_cores)
            peak = peaks.get(memo)
            if peak is None:
                try:
                    peak = kernel_peak(k, spec)
                except OpcastError:
                    peak = math.nan
                peaks[memo] = peak
            seconds, resource = _roof_at_peak(*work[i], peak, spec.mem_bw_bytes_per_s)
            return seconds, peak, resource

        roofs = [roof(i, device) for i in range(len(kernels))]
        extrapolated: list[int] = []
        wanted: dict[str, tuple[DeviceSpec, list[Kernel]]] = {}
        for i, (k, key) in enumerate(zip(kernels, keys)):
            if not np.isfinite(out[i]):
                continue
            if device.name in self.range.fitted_on(key):
                self._on_training.setdefault(device.name, {})[k] = float(out[i])
                continue
            specs = self.range.training_specs(key)
            if specs and np.isfinite(roofs[i][0]):
                extrapolated.append(i)
                for spec in specs:
                    if k not in self._on_training.get(spec.name, {}):
                        wanted.setdefault(spec.name, (spec, []))[1].append(k)
        for name, (spec, ks) in wanted.items():  # one batched call per training device
            got = self.predict_s(list(dict.fromkeys(ks)), spec)
            self._on_training.setdefault(name, {}).update(zip(dict.fromkeys(ks), (float(t) for t in got)))
        for i in extrapolated:
            k, key = kernels[i], keys[i]
            r_s, peak, resource = roofs[i]
            seen: list[tuple[str, float, float, float, float, float]] = []  # (name, time, utilisation, peak, bw, roof)
            for spec in self.range.training_specs(key):
                t_i = self._on_training[spec.name].get(k, math.nan)
                r_i, peak_i, _ = roof(i, spec)
                if np.isfinite(t_i) and np.isfinite(r_i):
                    t_i = max(t_i, r_i)
                    seen.append((spec.name, t_i, r_i / t_i, peak_i, spec.mem_bw_bytes_per_s, r_i))
            if not seen:
                continue
            utils = [u for _, _, u, *_ in seen]
            lo, hi = min(utils) / margin, min(1.0, max(utils) * margin)
            t, u = out[i], r_s / out[i]
            what = "peak" if resource == "compute" else "memory bandwidth"
            if u > hi or u < lo:
                t = r_s / (hi if u > hi else lo)
                why[k] = (SPAN, f"{key} on {device.name} at {u:.0%} of its {what}, outside the {lo:.0%}..{hi:.0%} "
                                f"it predicts on its training devices ({', '.join(n for n, *_ in seen)}); "
                                f"held at {100 * r_s / t:.0f} %")
            # Speed-ups at most the ratio of what bounds the kernel, against a training device with
            # less of it (utilisation no higher than there) and one with more (no lower than there).
            weaker = [(n, ui) for n, _, ui, _, _, r_i in seen if r_i >= r_s]
            stronger = [(n, ui) for n, _, ui, _, _, r_i in seen if r_i <= r_s]
            cap = min(weaker, key=lambda nu: nu[1]) if weaker else None
            rise = max(stronger, key=lambda nu: nu[1]) if stronger else None
            u = r_s / t
            if rise is not None and u < rise[1] / margin and (cap is None or rise[1] <= cap[1]):
                t = r_s / (rise[1] / margin)
                why[k] = (RATIO, f"{key} on {device.name} at {u:.0%} of its {what}, below the {rise[1]:.0%} it "
                                 f"predicts on {rise[0]}, which has more of it; held there")
            if cap is not None and u > cap[1] * margin:
                t = r_s / (cap[1] * margin)
                why[k] = (RATIO, f"{key} on {device.name} at {u:.0%} of its {what}, above the {cap[1]:.0%} it "
                                 f"predicts on {cap[0]}, which has less of it; held there")
            for name, t_i, _, peak_i, bw_i, _ in seen:  # monotone in the resources; "never slower" wins
                if peak <= peak_i and device.mem_bw_bytes_per_s <= bw_i and t < t_i:
                    t, why[k] = t_i, (MONOTONE, f"{key} on {device.name} faster than on {name}, which has more of "
                                                "both peak and bandwidth; held at its time")
            for name, t_i, _, peak_i, bw_i, _ in seen:
                if peak >= peak_i and device.mem_bw_bytes_per_s >= bw_i and t > t_i:
                    t, why[k] = t_i, (MONOTONE, f"{key} on {device.name} slower than on {name}, which has less of "
                                                "both peak and bandwidth; held at its time")
            out[i] = t
        for i, k in enumerate(kernels):  # the floor, last: nothing beats the roofline at the peak
            r_s, _, resource = roofs[i]
            if np.isfinite(out[i]) and np.isfinite(r_s) and out[i] < r_s:
                why[k] = (FLOOR, f"{keys[i]} on {device.name} faster than its {resource} roofline at the datasheet peak "
                                 f"({r_s * 1e6:.3g} us; {out[i] / r_s:.0%} of it); held at the roofline")
                out[i] = r_s
        return out, why


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
    in_range_only: bool = False
    """A learned model answers only inside the hardware range it was fitted on; outside it the
    roofline does (the CLI's ``--analytic``). Either way the kernel is flagged (:meth:`range_flag`)."""
    physical_bounds: bool = True
    """Hold every learned answer to physics (:meth:`LearnedKernelCost.bound`); off only to measure
    what the bounds change (``benchmarks/kernel_sanity.py``)."""
    _cache: dict[Any, dict[Kernel, tuple[float, str]]] = field(default_factory=dict)
    _flags: dict[Any, dict[Kernel, str]] = field(default_factory=dict)
    _bounds: dict[Any, dict[Kernel, tuple[str, str]]] = field(default_factory=dict)

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
        flags = self._flags.setdefault(device, {})
        todo = [k for k in dict.fromkeys(kernels) if k not in cache]
        *preferred, fallback = self.sources
        if preferred and todo:
            # One batch per source: the kernels themselves plus the parts of uncovered multi-kernel
            # ops (a learned model's per-call overhead dwarfs its per-row cost).
            composite = {k: parts for k in todo if not any(s.covers(k) for s in preferred)
                         and (parts := decompose(k)) and all(any(s.covers(p) for s in preferred) for p, _ in parts)}
            batch = list(dict.fromkeys([*todo, *(p for parts in composite.values() for p, _ in parts if p not in cache)]))
            for source in preferred:
                batch = self._ask(source, batch, device, cache, flags)
            for k, parts in composite.items():
                if all(cache.get(p, (0.0, ""))[1] == LEARNED for p, _ in parts):
                    cache[k] = (sum(n * cache[p][0] for p, n in parts), LEARNED)
                why = next((flags[p] for p, _ in parts if p in flags), None)
                if why:
                    flags[k] = f"eager attention from its kernels; {why}"
                bounds = self._bounds.get(device, {})
                rule = next((bounds[p] for p, _ in parts if p in bounds), None)
                if rule and k in cache:
                    bounds[k] = (rule[0], f"eager attention from its kernels; {rule[1]}")
            todo = [k for k in todo if k not in cache]
        todo = self._ask(fallback, todo, device, cache, flags)
        if todo:  # the last source always answers; reaching here is a bug in a source
            raise OpcastError(f"no kernel-time source could time {todo[0].kind} {dict(todo[0].params)}")
        return cache

    def _ask(self, source: KernelTimeSource, todo: list[Kernel], device: DeviceSpec,
             cache: dict[Kernel, tuple[float, str]], flags: dict[Kernel, str]) -> list[Kernel]:
        """Cache what ``source`` answers among ``todo``; return the rest. A learned source's
        answers outside its fitted hardware range are flagged, or (``in_range_only``) refused."""
        mine = [k for k in todo if source.covers(k)]
        outside: dict[Kernel, str] = {}
        if mine and isinstance(source, LearnedKernelCost):
            outside = source.out_of_range(mine, device)
            if self.in_range_only and outside:
                mine = [k for k in mine if k not in outside]
                for k, why in outside.items():
                    flags[k] = f"{why}; roofline used instead (--analytic)"
        if mine:
            times = source.predict_s(mine, device)
            if self.physical_bounds and isinstance(source, LearnedKernelCost):
                times, bounded = source.bound(mine, times, device)
                if bounded:
                    self._bounds.setdefault(device, {}).update(bounded)
            for k, t in zip(mine, times):
                if np.isfinite(t):
                    cache[k] = (float(t), source.name)
                    if k in outside:
                        flags[k] = f"{outside[k]}; the learned model extrapolates (--analytic uses the roofline)"
        return [k for k in todo if k not in cache]

    def residuals(self, k: Kernel, device: DeviceSpec) -> Residuals | None:
        """The held-out residuals behind a learned kernel's time (for its prediction interval):
        those of the predictor that priced it, or for a kernel priced from its parts (eager
        attention) those of its costliest part. None for roofline-priced kernels. Valid after
        the kernel was looked up."""
        cache = self._cache.get(device, {})
        hit = cache.get(k)
        if hit is None or hit[1] != LEARNED:
            return None
        learned = [s for s in self.sources if isinstance(s, LearnedKernelCost)]
        for source in learned:
            if source.covers(k):
                return source.residuals(k, device)
        parts = decompose(k) or []
        if parts:
            part = max(parts, key=lambda pn: pn[1] * cache.get(pn[0], (0.0, ""))[0])[0]
            return next((s.residuals(part, device) for s in learned if s.covers(part)), None)
        return None

    def range_flag(self, k: Kernel, device: DeviceSpec) -> str | None:
        """Why the time of ``k`` on ``device`` comes from a learned model outside the shapes or
        hardware it was fitted on (or, with ``in_range_only``, why the roofline replaced it); None otherwise.
        Valid after the kernel was looked up."""
        return self._flags.get(device, {}).get(k)

    def range_flags(self, device: DeviceSpec) -> dict[Kernel, str]:
        """Every flagged kernel looked up on ``device`` so far."""
        return dict(self._flags.get(device, {}))

    def bound_flag(self, k: Kernel, device: DeviceSpec) -> str | None:
        """Why a physical bound (:data:`BOUND_RULES`) moved the learned time of ``k`` on ``device``;
        None when none did. Valid after the kernel was looked up."""
        hit = self._bounds.get(device, {}).get(k)
        return hit[1] if hit else None

    def bound_flags(self, device: DeviceSpec) -> dict[Kernel, tuple[str, str]]:
        """Every kernel looked up on ``device`` so far whose learned time a bound moved: (rule, why)."""
        return dict(self._bounds.get(device, {}))

    def bounds_summary(self) -> dict[str, dict[str, Any]]:
        """Per device looked up so far: how many learned kernel times the physical bounds moved,
        by rule, out of how many learned ones, and the first reason."""
        out: dict[str, dict[str, Any]] = {}
        for device, bounded in self._bounds.items():
            if not bounded:
                continue
            learned = sum(1 for k, (_, src) in self._cache.get(device, {}).items() if src == LEARNED)
            by_rule: dict[str, int] = {}
            for rule, _ in bounded.values():
                by_rule[rule] = by_rule.get(rule, 0) + 1
            out[device.name] = {"bounded_kernels": len(bounded), "learned_kernels": learned,
                                "by_rule": dict(sorted(by_rule.items())), "example": next(iter(bounded.values()))[1]}
        return out

    def warm(self) -> int:
        """Load every learned predictor now; returns how many."""
        return sum(s.warm() for s in self.sources if isinstance(s, LearnedKernelCost))

    def time_s(self, k: Kernel, device: DeviceSpec) -> tuple[float, str]:
        return self.lookup([k], device)[k]

    def describe(self) -> dict[str, object]:
        """The ``cost_sources`` header: which kernel sources exist and why one is missing."""
        notes = list(self.notes)
        learned = any(isinstance(s, LearnedKernelCost) for s in self.sources)
        for s in self.sources:
            if isinstance(s, LearnedKernelCost):
                notes += [n for n in s.range.notes if n not in notes]
        summary = self.bounds_summary()
        for name, b in summary.items():
            rules = ", ".join(f"{n} {rule.replace('_', ' ')}" for rule, n in b["by_rule"].items())
            notes.append(f"physical bounds moved {b['bounded_kernels']} of {b['learned_kernels']} learned kernel time(s) "
                         f"on {name} ({rules}), e.g. {b['example']}")
        out: dict[str, Any] = {
            "kernel_models": self.models_label,
            "roofline_efficiency": self.roofline.efficiency.source,
            "learned_out_of_range": "roofline" if self.in_range_only else "flagged",
            "notes": notes,
        }
        if learned:
            out["physical_bounds"] = {"rules": dict(BOUND_RULES) if self.physical_bounds else "off",
                                      "bounded": summary}
        return out


def roofline_only(note: str = "roofline forced") -> KernelCostModel:
    return KernelCostModel(sources=(RooflineKernelCost(),), notes=[note])


def models_flag_problem(models: str | Path | None, use_learned: bool) -> str | None:
    """The one rule of ``--models`` with ``--roofline``: together they contradict each other
    (the roofline ignores every learned model), so the pair is refused, never silently resolved."""
    if models is not None and not use_learned:
        return (f"--models {models} and --roofline contradict each other (--roofline ignores every learned model); "
                "drop one of them")
    return None


BOUNDS_ENV = "OPCAST_PHYSICAL_BOUNDS"
"""Internal switch, not a user option: ``off`` turns the physical bounds off in
:func:`load_kernel_cost` (to measure what they change; the JSON's ``physical_bounds.rules`` then
says ``off``). Anything else, or unset: on."""


def physical_bounds_enabled() -> bool:
    return os.environ.get(BOUNDS_ENV, "on").strip().lower() != "off"


def load_kernel_cost(models: str | Path | None = None, *, use_learned: bool = True,
                     in_range_only: bool = False) -> KernelCostModel:
    """The kernel cost model for ``--models DIR`` (errors are the user's to fix), or the embedded
    default (its absence falls back to the roofline, said in ``notes``). ``in_range_only``: learned
    models answer only inside the hardware they were fitted on (``--analytic``). ``models`` with
    ``use_learned=False`` is refused (:func:`models_flag_problem`)."""
    if (problem := models_flag_problem(models, use_learned)):
        raise OpcastError(problem)
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
    where = "(op, dtype, direction)" + (" inside the hardware they were fitted on (--analytic)" if in_range_only else "")
    return KernelCostModel(sources=(LearnedKernelCost(model_set, label), RooflineKernelCost()), models_label=label,
                           in_range_only=in_range_only, physical_bounds=physical_bounds_enabled(),
                           notes=[f"learned models from {label} where they cover the {where}; roofline elsewhere"])
