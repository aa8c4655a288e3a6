"""The analytic kernel price: the roofline fallback source (:class:`RooflineKernelCost`,
``max(FLOPs / (peak x eff_c), bytes / (bw x eff_m))`` with the efficiencies of
:data:`ROOFLINE_EFFICIENCY`; no constant terms, so a GPU with every spec doubled is exactly twice
as fast on this path), where a kernel sits on a device's roofline (:func:`bottleneck`) and the
roofline at the datasheet peak that no implementation can beat (:func:`peak_roofline_s`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from opcast.errors import OpcastError
from opcast.ops import MATRIX_KINDS
from opcast.predict.cost.query import ROOFLINE, Kernel

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec


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
        for (s0, e0), (s1, e1) in itertools.pairwise(pts):
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


def kernel_resources(k: Kernel, device: DeviceSpec) -> Resources:
    """(peak FLOP/s ``k`` runs against, memory bandwidth in bytes/s, boost clock in Hz, board power in W or None)
    of ``device``: what :func:`slower_at_most` compares."""
    return kernel_peak(k, device), device.mem_bw_bytes_per_s, device.boost_clock_hz, device.tdp_w


Resources = tuple[float, float, float, float | None]
"""A device's (peak FLOP/s of a kernel, memory bandwidth in bytes/s, boost clock in Hz, board power in W or None)."""


def slower_at_most(a: Resources, b: Resources) -> float | None:
    """How many times slower than a device of resources ``b`` one of resources ``a`` (each
    :func:`kernel_resources`) may run any kernel: None (no bound) unless ``a`` has at least ``b``'s peak and
    bandwidth; then 1 where it has at least ``b``'s clock too, else the clock ratio ``b / a``. The physical
    bounds' monotone rule. A kernel's time is its compute and memory terms plus a latency term (launch, the
    pipeline fill of a few waves of short tiles) that runs at the clock: with ``t = c / peak + m / bw + l /
    clock`` and every term no larger on ``a`` but the last, at most ``b / a`` times larger, ``t_a <= t_b x
    b / a``. The clock matters where kernels take microseconds: in AIConfigurator's rows small GEMMs and
    attention run faster on L40S (2.52 GHz) and RTX PRO 6000 (2.43 GHz) than on H100 (1.98 GHz), which has more
    peak and bandwidth, and a rule on peak and bandwidth alone lowered 24 % / 30 % of H100's / H200's measured
    bf16 GEMMs with m <= 256 (median 12 %, nearly all under 10 us) below the measurements
    (``benchmarks/skinny_gemm.py``).

    No bound either where the two peaks are equal and ``a`` draws less board power (both known): a datasheet
    peak is the boost clock's, and two parts rated the same run under load at the clocks their power limits
    hold, so the one with more power may be the faster whatever their bandwidths. Measured: B300 (1,100 W) and
    B200 (1,000 W) have the same dense bf16 and fp8 peaks and B200 3 % more bandwidth, yet B200 runs
    AIConfigurator's GEMMs 4-6 % slower (median over the shapes both measured, every dtype and duration bin,
    vLLM's and TensorRT-LLM's tables), and an A100 PCIe (250 W) sustains less than an A100 SXM4 (400 W) of the
    same peaks; the rule had held B200's own measured GEMMs to B300's times."""
    (peak_a, bw_a, clock_a, power_a), (peak_b, bw_b, clock_b, power_b) = a, b
    if peak_a < peak_b or bw_a < bw_b:
        return None
    if peak_a == peak_b and power_a is not None and power_b is not None and power_a < power_b:
        return None
    return max(1.0, clock_b / clock_a)


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
    return Bottleneck(
        bound=terms.bound,
        flops=terms.flops,
        bytes=terms.bytes,
        intensity=terms.flops / terms.bytes if terms.bytes else math.inf,
        ridge=peak / bw,
        compute_utilisation=terms.flops / (time_s * peak) if time_s > 0 else 0.0,
        memory_utilisation=terms.bytes / (time_s * bw) if time_s > 0 else 0.0,
    )


_DEFAULT_ROOFLINE = RooflineKernelCost()


def peak_roofline_s(k: Kernel, device: DeviceSpec) -> tuple[float, str]:
    """(seconds, bounding resource) of ``k`` at the device's datasheet peaks, no efficiency
    derating: ``max(FLOPs / peak, bytes / mem_bw)``, the time no implementation can beat; NaN
    when the device has no peak for the kernel's dtype."""
    try:
        peak = kernel_peak(k, device)
    except OpcastError:
        return math.nan, "compute"
    return roof_at_peak(k.flops(), k.bytes_moved(), peak, device.mem_bw_bytes_per_s)


def roof_at_peak(flops: float, moved: float, peak: float, bw: float) -> tuple[float, str]:
    """(seconds, bounding resource) of ``flops`` and ``moved`` bytes at ``peak`` FLOP/s and ``bw``
    bytes/s: the arithmetic of :func:`peak_roofline_s`, shared with the learned source's bounds."""
    compute, memory = flops / peak, moved / bw
    return (compute, "compute") if compute >= memory else (memory, "memory")
