"""The learned kernel-time source (:class:`LearnedKernelCost`, a fitted
``opcast.train.artifacts.ModelSet``), the hardware and feature range each predictor was fitted on
(:class:`HardwareRange`) and the physical bounds every learned answer is held to
(:meth:`LearnedKernelCost.bound`, :data:`BOUND_RULES`):

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
  device is never slower on a kernel than that training device, beyond their clock ratio where the
  training device has the higher clock (latency runs at the clock,
  :func:`~opcast.predict.cost.roofline.slower_at_most`), and one with at most both never faster; not between
  two parts of equal peaks where the one with the bandwidth draws less board power (B200 and B300: which
  sustains more under load is the power limit's, and B300 measures faster);
- on another board of a training GPU's compute die (:func:`opcast.hardware.die_twin`: A100-SXM4-40GB of
  A100-SXM4-80GB), a compute-bound kernel takes that GPU's time as held there and no other rule: the two
  boards share SMs, clocks and peaks, and the model set already answers it with that GPU's features
  (:func:`opcast.train.features.board_time_s`); before this rule the cross-device bounds made A100-SXM4-40GB's
  large bf16 GEMMs ~10 % faster than A100-SXM4-80GB's. On a board of the training GPU's memory bandwidth too
  (H800 of H100-SXM: only its NVLink differs) every kernel does: the model set answers it with the same
  features, where the unseen-device bounds had H800's memory-bound kernels up to 1.25x slower than H100-SXM's.
  A memory-bound kernel on a board of another bandwidth lies between that GPU's time (latency-bound) and that time
  scaled by the ratio of their bandwidths (bound by it alone): the cross-device rules had held A100-SXM4-40GB's
  decode attention, at 1 % of its bandwidth, to other architectures' utilisations.
- on a GPU made from a training GPU with at least its peak, bandwidth and clock (``explore`` / ``--set``:
  ``B200[peak_bf16_flops=x1.05]``, ``B200[l2_bytes=x2]``), the resource ratio rule takes its cap from that GPU alone,
  credited with the share that GPU sustains, so it is never slower there and at most the resource ratio faster;
  capped by the weakest share of the other training devices, B200's bf16 GEMMs (77 % of its peak) fell to MI300X's
  62 %, 1.25x slower for 5 % more peak, where the monotone rule gave way to the ratio.

The training devices that bound a device are those of its vendor where the group's predictors were fitted on one
vendor's rows (:meth:`HardwareRange.reference_specs`; the entry's ``vendors`` and ``vendor_devices``): another
vendor's are answered by the group's ``other`` predictor, whose extrapolations had held B200's 65536 x 7168 x 8192
bf16 GEMM at MI300X's 51 % of its peak and A100-SXM4-40GB's decode attention at the Arc Pro B60's 1 % of its
bandwidth. A GEMM past the largest b, m, n or k its predictor was fitted on is asked at that size and its answer
scaled by its waves of output tiles and its reduction (:meth:`LearnedKernelCost.wave_scaled`, :func:`wave_factor`)
before any rule.

On the devices a predictor was fitted on, its answers are held to each other, from the device with
the least of the kernel's bounding resource up (:meth:`LearnedKernelCost._held_training`): never
slower than on one with less of both (beyond their clock ratio), and, where the kernel's shape is outside
the fitted ``feature_ranges`` (an extrapolation there too), at no higher a utilisation than on one with less of
the bounding resource. All rules are one projection onto the interval they allow; where it is empty
(training devices that disagree beyond the ratio of their resources) the floor and the resource
ratio are kept and the reason and the notes say so. On training devices inside the fitted shapes
that means the monotone rule lowers a time only as far as the resource ratio allows against the
training devices with less of the bounding resource (bar those the device whose time it copies
already outruns beyond the ratio: that relation is its data's, not the rule's). A small causal attention
(1 x 8 heads x 512 tokens, latency-bound) runs faster on L40S than on H100 in AIConfigurator's rows (vLLM's
FA2 and FA3 kernels): H100 has more peak and bandwidth, L40S the higher clock (2.52 vs 1.98 GHz), so the
monotone rule holds H100 no slower than 1.27x L40S's time. The resource ratio is not imposed on the training
devices' own answers inside the fitted shapes: their data break it where a GPU cannot sustain its
datasheet peak or measured another software stack (AIConfigurator's 8192^3 bf16 GEMM runs at 52 %
of L40S's peak and 72 % of H100's, 1.39x their peak ratio), and imposed it would put the least
efficient training device's utilisation on every stronger one.

Implementations (the registry's ``impl`` of norms, softmax, cross-entropy and rope,
:data:`opcast.ops.KERNEL_IMPLS`): a predictor speaks only for the implementations it has data of
(:meth:`LearnedKernelCost.speaks_for_impl`); another is priced as one streaming kernel over its own
registry traffic, the learned elementwise kernel that moves as many bytes
(:func:`opcast.predict.cost.model.decompose`; the roofline of the traffic where no elementwise model
covers it), and the set's notes say so. That is the one no-data rule for every implementation:
``fused`` (Apex / Transformer Engine / Megatron CUDA kernels) is priced from rows of those kernels where
a set has them (Megatron's fused softmax) and by this rule elsewhere
(their RMSNorm and LayerNorm, of which no half-precision data exist); ``liger`` (Liger-Kernel's
Triton kernels) from Liger's own rows and by this rule elsewhere; a set fitted before an
implementation existed speaks for it nowhere (its code lies outside the fitted ``impl_code`` range). Where a predictor
entry records which devices measured which implementation (``impl_devices``: implementation ->
device names), the bounds of a kernel take as training devices only those with data of its
implementation: a device that measured another implementation only answers by extrapolation for
this one (flagged out of range), is held to the ones that measured it, and is no reference for others.
The fused MoE layer's kernel families (:data:`opcast.ops.MOE_IMPLS`: TensorRT-LLM's, vLLM's, Marlin's) are predictor
groups of their own (``moe-fwd-half``, ``moe-fwd-half_vllm``, ``moe-fwd-half_marlin``;
:data:`opcast.train.features.FAMILY_GROUPS`): a set speaks for a family where it has its group; a set without a
family's group prices those layers as the default family's (TensorRT-LLM's fused MoE, the nearest measured kernel of
the same layer), with a note, and a set with neither leaves them to their grouped GEMMs
(:func:`opcast.predict.cost.decompose`).
Attention's published-only implementations (:data:`opcast.ops.PUBLISHED_ATTENTION_IMPLS`: ``flash1``,
``flash2``) are spoken for only where ``impl_devices`` records devices that measured them (no model set does
today), so FlashAttention-1-generation kernels, and FlashAttention-2's on Hopper and Blackwell, fall to
:mod:`~opcast.predict.cost.published`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np

from opcast.errors import OpcastError
from opcast.hardware import base_name, kernel_twin, other_vendor, same_die
from opcast.ops import INT_PARAM_LIMIT, MATRIX_KINDS, PUBLISHED_ATTENTION_IMPLS, get_op, takes_kernel_impls
from opcast.predict.cost.query import LEARNED, Kernel
from opcast.predict.cost.roofline import Resources, kernel_peak, roof_at_peak, slower_at_most
from opcast.predict.intervals import Residuals
from opcast.train.features import MMA_FEATURES

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec


# --------------------------------------------------------------------------- physical bounds

UTILISATION_MARGIN = 1.0
"""How far beyond the training devices' span a learned model may move a kernel's utilisation
of its roofline on a device it was not fitted on: ``[min / margin, min(1, max x margin)]``. 1.0:
exactly the span, so a device with twice the bandwidth runs a memory-bound kernel at most twice
as fast as the training device that uses its bandwidth best."""

FLOOR, SPAN, RATIO, MONOTONE, DIE = "roofline_floor", "utilisation_span", "resource_ratio", "monotone", "same_die"
BOUND_RULES: dict[str, str] = {
    FLOOR: "no faster than the roofline at the datasheet peak",
    SPAN: "utilisation of the bounding resource within the span of the training devices "
    f"(margin {UTILISATION_MARGIN:g})",
    RATIO: "utilisation no higher than on a training device with less of the bounding resource and no lower than "
    "on one with more (speed-ups at most the resource ratio; where the training devices disagree, the lower)",
    MONOTONE: "no slower than a training device with less of both peak and bandwidth (beyond their clock ratio where "
    "it has the higher clock; at equal peaks, only with at least its board power), no faster than one with more "
    "(on training devices too; where it conflicts with the resource ratio, the ratio is kept)",
    DIE: "a compute-bound kernel on another board of a training GPU's compute die takes that GPU's time, as held "
    "there, and so does any kernel on a board of that GPU's memory bandwidth; a memory-bound one on a board of "
    "another bandwidth lies between that time and it scaled by the bandwidth ratio (the other rules do not apply)",
}
"""The rules of :meth:`LearnedKernelCost.bound`, by the name its reasons carry."""


class _Seen(NamedTuple):
    """One kernel on one training device, for :meth:`LearnedKernelCost.bound`."""

    name: str
    time_s: float
    roof_s: float
    peak: float
    bw: float
    clock: float
    power: float | None = None
    """Board power in W (:attr:`~opcast.hardware.DeviceSpec.tdp_w`; None: not known), the monotone rule's fourth
    resource (:func:`~opcast.predict.cost.roofline.slower_at_most`)."""
    sustained: float = 1.0
    """The share of its datasheet roofline the device sustains on the predictor's long-running rows bound
    by the kernel's resource (:func:`opcast.train.fit.sustained_utilisation`; 1 where not recorded)."""
    resource: str = ""
    """The resource that bounds the kernel on the device (``compute`` or ``memory``; empty: not known)."""


def _resources(s: _Seen) -> Resources:
    """What :func:`~opcast.predict.cost.roofline.slower_at_most` compares of a training device."""
    return s.peak, s.bw, s.clock, s.power


def _clock_note(f: float) -> str:
    """What a monotone bound's reason adds where the clock ratio ``f`` (:func:`slower_at_most`) loosens it."""
    return f" (beyond their clock ratio, {f:.2f}x)" if f > 1.0 else ""


def _util(s: _Seen) -> float:
    """``s``'s utilisation of its roofline at the peak (of the kernel's bounding resource)."""
    return s.roof_s / s.time_s


def _rel(s: _Seen) -> float:
    """``s``'s utilisation relative to what the device sustains (:attr:`_Seen.sustained`): the resource
    ratio rule compares these, so a power-limited training device (T4 sustains 0.49 of its FP32 peak)
    does not cap every stronger GPU at its share of a datasheet peak it never reaches."""
    return _util(s) / s.sustained


def _at_rel(w: _Seen, s: _Seen) -> float:
    """The time of ``s``'s kernel at ``w``'s utilisation relative to what each device sustains."""
    return s.roof_s / (_rel(w) * s.sustained)


def _sustained_note(s: _Seen, credited: float) -> str:
    """Why a resource-ratio bound against ``s`` is not its raw utilisation, where it is not."""
    if abs(s.sustained - credited) < 1e-9:
        return ""
    return (
        f" ({_util(s):.0%} there, where it sustains {s.sustained:.0%} of its datasheet roofline; "
        f"the training devices sustain {credited:.0%} at {'best' if credited > s.sustained else 'least'})"
    )


# --------------------------------------------------------------------------- implementations

_LEGACY_IMPLS: dict[tuple[str, str], tuple[str, ...]] = {
    ("layernorm", "fwd"): ("native",),
    ("layernorm", "bwd"): ("native",),
    ("rmsnorm", "fwd"): ("native", "unfused"),
    ("rmsnorm", "bwd"): ("unfused",),
    ("softmax", "fwd"): ("fused", "native"),
    ("softmax", "bwd"): ("fused", "native"),
    ("cross_entropy", "fwd"): ("unfused",),
    ("cross_entropy", "bwd"): ("unfused",),
}
"""The implementations the published sources measured, for a predictor fitted before the op had an
``impl`` parameter (no ``impl_code`` among its features: its rows were all read as the registry
default, fused): half-precision RMSNorm forward from Vidur (vLLM's 2023 ``rms_norm_kernel``, a
single multi-pass kernel: native; A100 and A40) and arXiv 2509.22832 (GPT-NeoX's Python RMSNorm,
A100 and GH200), its backward from 2509.22832 only; cross-entropy from 2509.22832 (Megatron's
Python ``vocab_parallel_cross_entropy``); LayerNorm: torch's ``nn.LayerNorm`` in 2509.22832,
NeuSight and Vidur (native); softmax: ``nn.Softmax`` (native) and Megatron's fused causal kernel
(fused), both in 2509.22832. Every other kind measured the registry default. Such a predictor
speaks for an implementation only where it is the one its data measured, and is asked with the
default (the features it was fitted on)."""


_FAMILY_KINDS = frozenset({"moe", "gemm"})
"""Kinds whose ``impl`` names an engine's kernel family with a predictor group of its own
(:data:`opcast.train.features.FAMILY_GROUPS`): the fused MoE layer (:data:`opcast.ops.MOE_IMPLS`: TensorRT-LLM's,
vLLM's, Marlin's) and the GEMM (:data:`opcast.ops.GEMM_IMPLS`: cuBLAS's, vLLM's fp8). A set speaks for a family
where it has its group; without it, as the default family (:meth:`LearnedKernelCost.family_of`)."""


def _kernel_impl(k: Kernel) -> str | None:
    """``k``'s implementation (``impl``) where its op takes one of :data:`opcast.ops.KERNEL_IMPLS`
    (norms, softmax, cross-entropy, rope) or is attention of a published-only implementation
    (:data:`opcast.ops.PUBLISHED_ATTENTION_IMPLS`, which no learned model has data of), else None
    (attention's measured kernel families are kinds of kernel, priced as before; a fused MoE layer's family is
    its predictor group, :func:`_family`)."""
    impl = k.param_dict.get("impl")
    if impl is None:
        return None
    return str(impl) if takes_kernel_impls(k.kind) or impl in PUBLISHED_ATTENTION_IMPLS else None


def _family(k: Kernel) -> str | None:
    """``k``'s kernel family where it has a predictor group of its own (a kind of :data:`_FAMILY_KINDS` whose
    ``impl`` is not the registry default: :data:`opcast.train.features.FAMILY_GROUPS`), else None."""
    if k.kind not in _FAMILY_KINDS:
        return None
    impl = k.param_dict.get("impl")
    return str(impl) if impl is not None and impl != get_op(k.kind).defaults.get("impl") else None


def _impl_devices(entry: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """A predictor entry's ``impl_devices`` (implementation -> names of the devices whose rows
    measured it), type-checked; empty when not recorded or malformed (then every training device
    counts for every implementation the predictor speaks for, as before it was recorded)."""
    raw = entry.get("impl_devices")
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, frozenset[str]] = {}
    for impl, names in raw.items():
        if not isinstance(impl, str) or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return {}
        out[impl] = frozenset(names)
    return out


# --------------------------------------------------------------------------- hardware range

RANGE_SLACK = 0.02
"""A device spec within 2 % of a predictor's fitted range counts as inside it (datasheet
rounding, re-measured specs); a fitted feature range gets the same slack on its (mostly log) scale."""

WAVE_DIMS: Final = ("b", "m", "n", "k")
"""The GEMM dimensions a learned time is scaled along past the largest size its predictor was fitted on
(:meth:`LearnedKernelCost.wave_scaled`)."""
WAVE_NOTE: Final = (
    "{n} GEMM(s) larger than any its predictor was fitted on (b, m, n or k past the fitted range) priced at the "
    "largest fitted size and scaled: past one wave of output tiles a GEMM's time is linear in the tiles (b, m, n) "
    "and always in the reduction per tile (k), where the learned model would extrapolate"
)
WAVE_TILE: Final = (128, 128)
"""The output tile (rows, cols) :meth:`LearnedKernelCost.wave_scaled` counts a forward GEMM's waves with: the middle
of :data:`opcast.train.features.GEMM_TILES`, CUTLASS's and cuBLAS's common threadblock shape."""


def wave_factor(params: Mapping[str, int], cut: Mapping[str, int], sm_count: int | None, fwd: bool) -> float:
    """The factor on the time of a GEMM of ``params`` asked at ``params`` with ``cut``'s dimensions put in: its
    tiles' waves past the first (b, m, n; whole :data:`WAVE_TILE` tiles on ``sm_count`` SMs) times its reduction
    (k). Below one wave the SMs a larger grid adds were idle, so its time does not grow: a batch of 16 fp8 32 x 512 x
    128 products (an MLA decode's absorbed projection over 16 heads) is one wave on an H200, where the product of the
    sizes put it at 16 times the one product's 12.7 us, the one batch size its predictor (AIConfigurator's b = 1
    tables) was fitted on. A decode's LM head (m = 1, n = 128,256: one tile row of 1,002 tiles) stays linear in n.
    Backward GEMMs (two products reducing over m and n) and calls without a device scale in proportion to each cut
    dimension."""
    if not fwd or sm_count is None or not {"m", "n"} <= set(params):
        return math.prod(params[d] / cut[d] for d in cut)
    tm, tn = WAVE_TILE

    def waves(p: Mapping[str, int]) -> float:  # whole tiles: one row of them however few its rows (m = 1)
        return max(1.0, p.get("b", 1) * -(-p["m"] // tm) * -(-p["n"] // tn) / sm_count)

    asked = {**params, **cut}
    return waves(params) / waves(asked) * (params["k"] / cut["k"] if "k" in cut else 1.0)


_DEVICE_FEATURES: dict[str, str] = {
    "log_peak_flops": "peak_flops",
    "log_mem_bw_bytes_per_s": "mem_bw_bytes_per_s",
    "log_sm_count": "sm_count",
    "log_l2_bytes": "l2_bytes",
    "log_clock_hz": "boost_clock_hz",
    "log_ridge": "ridge_flop_per_byte",
    "fp32_lanes_per_sm": "fp32_lanes_per_sm",
    "is_cpu": "is_cpu",
}
"""Device features of ``opcast.train.features`` -> the spec quantity each reads."""
_SPEC_FEATURES: Final = frozenset({*_DEVICE_FEATURES, *MMA_FEATURES})
"""The features a device's spec sheet gives, the same for every kernel on it."""


def _device_quantities(device: DeviceSpec, k: Kernel) -> dict[str, float] | None:
    """The spec quantities of ``device`` a predictor of ``k``'s group reads (None: no peak for its dtype)."""
    try:
        peak = kernel_peak(k, device)
    except OpcastError:
        return None
    return {
        "peak_flops": peak,
        "mem_bw_bytes_per_s": device.mem_bw_bytes_per_s,
        "sm_count": float(device.sm_count),
        "l2_bytes": float(device.l2_bytes),
        "boost_clock_hz": device.boost_clock_hz,
        "ridge_flop_per_byte": peak / device.mem_bw_bytes_per_s,
        "fp32_lanes_per_sm": float(device.fp32_lanes_per_sm),
        "is_cpu": float(device.vendor == "cpu"),
    }


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
        self._same_die: dict[tuple[DeviceSpec, frozenset[str]], frozenset[str]] = {}
        self._reasons: dict[tuple[Any, ...], str | None] = {}
        self._fitted: dict[tuple[str, str | None], tuple[str, ...]] = {}
        self._largest: dict[str, dict[str, int]] = {}
        if not isinstance(self.meta.get("device_specs"), Mapping):
            self.notes.append("the model set records no device_specs: learned predictions are not range-checked")
            return
        from opcast.train.artifacts import parse_device_specs

        self._specs, invalid = parse_device_specs(self.meta)
        for name in invalid:
            self.notes.append(f"device spec {name} of the model set is invalid: its range is not checked")
        predictors = self.meta.get("predictors", {})
        if predictors and not any("feature_ranges" in e for e in predictors.values() if isinstance(e, Mapping)):
            self.notes.append(
                "hardware range checked against the training devices' specs; shape ranges are not "
                "recorded in the model set and are not checked"
            )

    def fitted_on(self, key: str, impl: str | None = None) -> tuple[str, ...]:
        """Names of the devices predictor ``key`` was fitted on (empty when not recorded); with
        ``impl``, only those with data of that implementation where the entry records them
        (:func:`_impl_devices`): a training device that measured another implementation only is an
        extrapolation for this one, not a reference."""
        got = self._fitted.get((key, impl))
        if got is not None:
            return got
        entry = self.meta.get("predictors", {}).get(key)
        if not isinstance(entry, Mapping):
            return ()
        names = tuple(str(n) for n in entry.get("devices", ()))
        measured = _impl_devices(entry).get(impl) if impl is not None else None
        got = self._fitted[(key, impl)] = names if measured is None else tuple(n for n in names if n in measured)
        return got

    def sustained(self, key: str, device: str, resource: str) -> float:
        """The share of its datasheet roofline training device ``device`` sustains on predictor ``key``'s
        long-running rows bound by ``resource`` (``compute`` or ``memory``), as the fit recorded it
        (``sustained_utilisation``, :func:`opcast.train.fit.sustained_utilisation`); 1 when not recorded."""
        entry = self.meta.get("predictors", {}).get(key)
        table = entry.get("sustained_utilisation") if isinstance(entry, Mapping) else None
        sides = table.get(device) if isinstance(table, Mapping) else None
        got = sides.get(resource) if isinstance(sides, Mapping) else None
        return min(float(got), 1.0) if isinstance(got, (int, float)) and got >= 0.05 else 1.0

    def same_die_as(self, device: DeviceSpec, unread: frozenset[str] = frozenset()) -> frozenset[str]:
        """Names of the set's training devices of ``device``'s compute die (:func:`opcast.hardware.same_die`) for
        kernels that never read the fields ``unread``, memoised per device."""
        got = self._same_die.get((device, unread))
        if got is None:
            names = frozenset(n for n, s in self._specs.items() if same_die(device, s, unread))
            got = self._same_die[(device, unread)] = names
        return got

    def training_specs(self, key: str, impl: str | None = None) -> tuple[DeviceSpec, ...]:
        """The specs (from ``device_specs``) of the devices predictor ``key`` was fitted on (with
        ``impl``: on data of that implementation, as :meth:`fitted_on`)."""
        return tuple(self._specs[n] for n in self.fitted_on(key, impl) if n in self._specs)

    def reference_specs(self, key: str, device: DeviceSpec, impl: str | None = None) -> tuple[DeviceSpec, ...]:
        """The training devices whose answers bound predictor ``key``'s on ``device`` (:meth:`LearnedKernelCost.bound`):
        :meth:`training_specs`, but for a device of a vendor the group's own predictors were fitted on (the entry's
        ``vendors``, :func:`opcast.train.fit.vendor_rows`), only that vendor's (``vendor_devices``). Another vendor's
        training devices are answered by the group's ``other`` predictor, fitted on every row: its extrapolation is no
        bound on this vendor's (MI300X's 51 % of its peak on a 65536 x 7168 x 8192 bf16 GEMM, past every fitted m,
        held B200 there, 40 % of its peak)."""
        specs = self.training_specs(key, impl)
        entry = self.meta.get("predictors", {}).get(key)
        if not isinstance(entry, Mapping) or other_vendor(device, entry.get("vendors", ())):
            return specs
        mine = set(entry.get("vendor_devices", ()))
        return tuple(s for s in specs if s.name in mine) if mine else specs

    def largest_fitted(self, key: str) -> dict[str, int]:
        """The largest size of each :data:`WAVE_DIMS` dimension predictor ``key`` was fitted on (its recorded
        ``feature_ranges`` of ``log_<dim>``), memoised; empty when none is recorded."""
        got = self._largest.get(key)
        if got is None:
            entry = self.meta.get("predictors", {}).get(key)
            ranges = entry.get("feature_ranges") if isinstance(entry, Mapping) else None
            got = {}
            for dim in WAVE_DIMS:
                bounds = ranges.get(f"log_{dim}") if isinstance(ranges, Mapping) else None
                if isinstance(bounds, (list, tuple)) and len(bounds) == 2 and math.isfinite(float(bounds[1])):
                    got[dim] = max(1, math.floor(math.exp(float(bounds[1])) + 1e-6))
            self._largest[key] = got
        return got

    def reason(self, key: str, k: Kernel, device: DeviceSpec) -> str | None:
        """Why ``device`` is outside the hardware predictor ``key`` was fitted on (for ``k``'s
        implementation where the entry records them per implementation), or None."""
        impl = _kernel_impl(k)
        cache_key = (key, k.dtype, k.tensor_cores, device, impl)
        if cache_key in self._reasons:
            return self._reasons[cache_key]
        entry = self.meta.get("predictors", {}).get(key)
        why = None
        if isinstance(entry, Mapping):
            names = [n for n in self.fitted_on(key, impl) if n in self._specs]
            listed = [_DEVICE_FEATURES[f] for f in entry.get("features", ()) if f in _DEVICE_FEATURES]
            wanted = listed or list(_DEVICE_FEATURES.values())
            mine = _device_quantities(device, k)
            fitted = [fq for n in names if (fq := _device_quantities(self._specs[n], k)) is not None]
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

    def feature_reasons(
        self, key: str, kernels: Sequence[Kernel], device: DeviceSpec, feats: Any = None, *, shapes_only: bool = False
    ) -> dict[Kernel, str]:
        """Kernels of group ``key`` whose features leave the predictor's recorded ``feature_ranges``
        (``feats``: their feature rows, when the caller computed them already); a kernel is
        named for the first recorded feature it leaves. With ``shapes_only`` the device's own features
        (:data:`_SPEC_FEATURES`) are not checked: the kernel's shape is."""
        entry = self.meta.get("predictors", {}).get(key)
        ranges = entry.get("feature_ranges") if isinstance(entry, Mapping) else None
        if not ranges or not kernels:
            return {}
        if feats is None:
            from opcast.train.features import feature_table

            feats = feature_table(_query_columns(kernels), device)
        out: dict[Kernel, str] = {}
        left = np.ones(len(kernels), dtype=bool)
        for name, bounds in ranges.items():
            if name not in feats.columns or (shapes_only and name in _SPEC_FEATURES):
                continue
            lo, hi = float(bounds[0]), float(bounds[1])
            values = feats[name].to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                outside = left & np.isfinite(values) & ((values < lo - RANGE_SLACK) | (values > hi + RANGE_SLACK))
            for i in np.flatnonzero(outside).tolist():
                out[kernels[i]] = f"{key}: feature {name} = {values[i]:.3g} outside its fitted {lo:.3g}..{hi:.3g}"
            left &= ~outside
        return out


def _query_columns(kernels: Sequence[Kernel]) -> Any:
    """Kernels as query rows of the dataset schema (op, dtype, direction, tensor_cores, params):
    an ``opcast.train.features.Table``, one numpy array per column, typed as a DataFrame of the
    same rows would be: integers as int64 (float64 with NaN where a kernel lacks the parameter),
    flags as bool, the rest as objects (None where absent)."""
    n = len(kernels)
    cols: dict[str, list[Any]] = {
        "op": [k.kind for k in kernels],
        "dtype": [k.dtype for k in kernels],
        "direction": [k.direction for k in kernels],
        "tensor_cores": [k.tensor_cores for k in kernels],
    }
    for i, k in enumerate(kernels):
        for name, value in k.params:
            column = cols.get(name)
            if column is None:
                column = cols[name] = [None] * n
            column[i] = value
    from opcast.train.features import Table

    return Table({name: _typed(values) for name, values in cols.items()}, n)


def _typed(values: list[Any]) -> np.ndarray:
    """One column of :func:`_query_columns` as the array type its values call for."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return np.array(values, dtype=bool) if len(present) == len(values) else np.array(values, dtype=object)
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        if len(present) == len(values) and all(abs(v) < INT_PARAM_LIMIT for v in present):
            return np.array(values, dtype=np.int64)
        # a blank, or a size past int64 (a decode length from a huge --gen-len): float, as a dataset reads it
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    return np.array(values, dtype=object)


def _in_span(code: float | None, span) -> bool:
    """Whether a categorical parameter's ``code`` (:data:`opcast.train.features._CODES`) lies in a predictor's fitted
    ``[lo, hi]`` feature range (to rounding): what a learned model has data of."""
    return code is not None and float(span[0]) - 1e-9 <= code <= float(span[1]) + 1e-9


def _as_its_die(die: DeviceSpec, device: DeviceSpec) -> bool:
    """Whether ``device``, a board of training GPU ``die``'s compute die, has its memory bandwidth too, and so is
    priced as it for every kernel (rule ``same_die``, its interval included): H800 of H100-SXM, only the NVLink
    capped."""
    return die.mem_bw_bytes_per_s == device.mem_bw_bytes_per_s


class LearnedKernelCost:
    """Adapter of a fitted ``opcast.train.artifacts.ModelSet`` to :class:`KernelTimeSource`."""

    name = LEARNED

    def __init__(self, model_set: Any, label: str, *, wave_scaling: bool = True) -> None:
        self.model_set = model_set
        self.label = label
        """Where the models came from (a folder, or 'embedded default')."""
        self.wave_scaling = wave_scaling
        """Whether GEMMs past the fitted sizes are scaled from the largest fitted one (:meth:`wave_scaled`); off with
        the physical bounds (``OPCAST_PHYSICAL_BOUNDS=off``: the raw estimator's answers)."""
        self._covers: dict[tuple[str, str, str, str | None], bool] = {}
        self._residuals: dict[tuple[str, str], Residuals | None] = {}
        self._groups: dict[tuple[Any, ...], str] = {}
        self._on_training: dict[str, dict[Kernel, float]] = {}
        """Training device name -> this source's raw time of each kernel asked there (for :meth:`bound`)."""
        meta = getattr(model_set, "meta", None)
        self.range = HardwareRange(meta if isinstance(meta, Mapping) else None)
        """The hardware each predictor was fitted on (:class:`HardwareRange`)."""
        self._adaptations: dict[str, Any] = {}
        """Device name -> its adaptation in the set (``opcast train adapt``), or None."""
        self._impls: dict[tuple[str, str], tuple[bool, bool]] = {}
        """(group, impl) -> (speaks for it, a predictor fitted before impl was recorded)."""
        self._weights: dict[tuple[str, str], bool] = {}
        """(group, weight storage) -> whether its predictor was fitted on that storage (:meth:`_speaks_for_weights`)."""
        self._families: dict[tuple[str, str, str, str], bool] = {}
        """(kind, dtype, direction, family) -> whether the set has that family's group (:meth:`family_of`)."""
        self._shape_why: dict[tuple[str, Kernel, tuple[str, ...]], str | None] = {}
        """(group, kernel, the reference devices' names) -> why its shape is outside the predictor's fitted feature
        ranges on them, or None (:meth:`_outside_shapes`)."""
        self._wave: dict[tuple[Kernel, int | None], tuple[Kernel, float]] = {}
        """(kernel, SMs) -> (the kernel as asked, the factor on its time) (:meth:`wave_scaled`)."""

    def family_of(self, k: Kernel) -> str | None:
        """``k``'s kernel family as this set prices it (:func:`_family`): its own where the set has the family's
        group, else None, the kind's default family (TensorRT-LLM's fused MoE for a vLLM or Marlin layer the set has
        no rows of: the nearest measured kernel of the same layer, which is what the set answered before it knew
        families), with a note saying so. Memoised per (kind, dtype, direction, family)."""
        family = _family(k)
        if family is None:
            return None
        memo = (k.kind, k.dtype, k.direction, family)
        got = self._families.get(memo)
        if got is None:
            got = self._families[memo] = bool(self.model_set.covers(*memo))
            if not got:
                default = get_op(k.kind).defaults.get("impl")
                self.range.notes.append(
                    f"{k.kind} {k.dtype} {k.direction}: the learned model has no data of the {family} kernel family; "
                    f"those layers are priced as the {default} family"
                )
        return family if got else None

    def group_of(self, k: Kernel) -> str:
        """The predictor group key of ``k`` (:func:`opcast.train.features.group_key`), memoised."""
        impl = self.family_of(k)
        memo = (k.kind, k.direction, k.dtype, k.tensor_cores, impl)
        key = self._groups.get(memo)
        if key is None:
            from opcast.train.features import dtype_class, group_key

            dclass = dtype_class(k.kind, k.dtype, k.tensor_cores)
            key = self._groups[memo] = group_key(k.kind, k.direction, dclass, impl)
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
        if by_key:  # one feature computation for every group
            from opcast.train.features import feature_table

            todo = [k for ks in by_key.values() for k in ks]
            feats = feature_table(_query_columns(self.as_fitted(self.wave_scaled(todo, device)[0])), device)
            start = 0
            for key, ks in by_key.items():
                rows = feats.take(np.arange(start, start + len(ks)))
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
        key = (k.kind, k.dtype, k.direction, self.family_of(k))
        hit = self._covers.get(key)
        if hit is None:  # a family other than the kind's first is its own group (model sets take it as a 4th argument)
            hit = self._covers[key] = bool(self.model_set.covers(*(key[:3] if key[3] is None else key)))
        return hit and self.speaks_for_impl(k) and self._speaks_for_weights(k)

    def _speaks_for_weights(self, k: Kernel) -> bool:
        """Whether ``k``'s predictor has data of its expert weights' storage (a fused MoE layer's ``weights``,
        :data:`opcast.ops.MOE_WEIGHTS`): the dtype's always; a weight-only format only inside the fitted
        ``weights_code`` range (a set fitted without W4A16 MXFP4 rows leaves those layers to their grouped GEMMs,
        :func:`opcast.predict.cost.decompose`). Memoised per group and format: ``covers`` asks it of every kernel."""
        if k.kind != "moe":
            return True
        storage = str(k.param_dict.get("weights", "dtype"))
        if storage == "dtype":
            return True
        key = (self.group_of(k), storage)
        ok = self._weights.get(key)
        if ok is None:
            from opcast.train.features import _CODES

            entry = self.range.meta.get("predictors", {}).get(key[0])
            span = (entry.get("feature_ranges") or {}).get("weights_code") if isinstance(entry, Mapping) else None
            ok = self._weights[key] = bool(span) and _in_span(_CODES["weights"].get(storage), span)
        return ok

    def _impl_status(self, k: Kernel) -> tuple[bool, bool]:
        """(speaks for ``k``'s implementation, its predictor predates the impl parameter), memoised."""
        impl = _kernel_impl(k)
        if impl is None:  # no impl, or attention's kernel families: priced as before
            return True, False
        key = self.group_of(k)
        memo = self._impls.get((key, str(impl)))
        if memo is not None:
            return memo
        entry = self.range.meta.get("predictors", {}).get(key)
        status = (True, False)
        if impl in PUBLISHED_ATTENTION_IMPLS:  # only where the predictor records devices that measured it
            status = (bool(isinstance(entry, Mapping) and _impl_devices(entry).get(impl)), False)
            if not status[0]:
                self.range.notes.append(
                    f"{key}: the learned model has no data of impl {impl} (no device of its impl_devices measured it); "
                    "those kernels are priced by the next source"
                )
        elif isinstance(entry, Mapping) and "features" in entry:
            if "impl_code" in entry["features"]:
                from opcast.train.features import _CODES

                span = (entry.get("feature_ranges") or {}).get("impl_code")
                code = _CODES["impl"].get(str(impl))
                recorded = _impl_devices(entry)
                # fitted before impl native existed (no impl_devices, native above its code range): its
                # "fused" rows were torch's native kernels (NeuSight, 2509.22832, Vidur), so native is
                # read as, and asked as, the old fused
                legacy_native = bool(
                    str(impl) == "native" and not recorded and span and code is not None and code > float(span[1])
                )
                if legacy_native:
                    code = _CODES["impl"]["fused"]
                ok = not span or _in_span(code, span)
                if recorded and not recorded.get(str(impl)):  # inside the code range, but no row measured it
                    ok = False
                status = (bool(ok), legacy_native)
                measured = (
                    "data of " + ", ".join(sorted(i for i, names in recorded.items() if names))
                    if recorded
                    else "the implementations inside its fitted impl_code range"
                )
            else:
                default = next(p.default for p in get_op(k.kind).params if p.name == "impl")
                measured_impls = _LEGACY_IMPLS.get((k.kind, k.direction), (str(default),))
                status = (measured_impls == (str(impl),), True)
                measured = " and ".join(measured_impls) + " data, read as one (fitted before impl was recorded)"
            if not status[0]:
                self.range.notes.append(
                    f"{key}: the learned model has no data of impl {impl} ({measured}); those kernels are "
                    "priced as the streaming kernel of their own traffic"
                )
        self._impls[(key, str(impl))] = status
        return status

    def speaks_for_impl(self, k: Kernel) -> bool:
        """Whether the predictor of ``k``'s group has data of ``k``'s implementation (``impl``): within
        the ``impl_code`` range it was fitted on, or, for a predictor fitted before the op had an
        ``impl`` (no ``impl_code`` feature), the one implementation its sources measured
        (:data:`_LEGACY_IMPLS`). Kinds without an ``impl`` of :data:`opcast.ops.KERNEL_IMPLS` always (a fused MoE
        layer's family is its group: :meth:`covers`)."""
        return self._impl_status(k)[0]

    def as_fitted(self, kernels: Sequence[Kernel]) -> list[Kernel]:
        """``kernels`` as their predictors read them: a predictor fitted before the op had an ``impl``
        saw every row with the registry default, so it is asked with that (its features then are the
        ones it learned), and so is a kernel of a family the set has no group of (the default family's group
        prices it); the physical bounds still use the kernel's own traffic."""
        out = list(kernels)
        for i, k in enumerate(out):
            # a kernel family the set has no group of (:meth:`family_of`) is asked as the default family, or its
            # group key would name no predictor and the kernel fall to the roofline
            if "impl" in k.param_dict and (self._impl_status(k)[1] or (_family(k) and self.family_of(k) is None)):
                default = next(p.default for p in get_op(k.kind).params if p.name == "impl")
                if k.param_dict["impl"] != default:
                    out[i] = Kernel(
                        k.kind,
                        tuple((n, default if n == "impl" else v) for n, v in k.params),
                        k.dtype,
                        k.direction,
                        k.tensor_cores,
                    )
        return out

    def residuals(self, k: Kernel, device: DeviceSpec) -> Residuals | None:
        """The held-out residuals of the predictor that prices ``k`` on ``device`` (None when the
        model set records none): a training device's shapes-held-out ones for that device, for one on another
        network or changed in fields the predictor never reads (:func:`opcast.hardware.kernel_twin`) and for a
        board of its die and memory bandwidth, which :meth:`bound` prices as it."""
        get = getattr(self.model_set, "residuals", None)
        if get is None:
            return None
        from opcast.train.features import unread_peaks

        key = self.group_of(k)
        die = self._die_of(key, device)
        name = die.name if die is not None and _as_its_die(die, device) else kernel_twin(device, unread_peaks(key))
        memo = self._residuals.get((key, name), False)
        if memo is False:
            got = get(key, name)
            memo = self._residuals[(key, name)] = Residuals(key, *got) if got is not None else None
        return memo

    def _die_of(self, key: str, device: DeviceSpec) -> DeviceSpec | None:
        """The training device of group ``key`` whose compute die ``device`` is another board of (the model set's
        ``die_twin``, :func:`opcast.hardware.die_twin`), or None."""
        get = getattr(self.model_set, "die_twin", None)
        return get(key, device) if get is not None else None

    def adaptation(self, device: DeviceSpec) -> Any:
        """The set's per-device correction for ``device`` (``adapt/<device>.json``, written by
        ``opcast train adapt``), loaded and checked once, or None. A GPU derived from a catalog one
        (``BASE[...]``: placed on a cluster's network by ``--cluster``, or a what-if's hypothetical GPU) keeps
        its base's correction: on another network it is that GPU, and a what-if's speed-ups are then of the
        corrected base, not the correction's factor with them. Using it adds a ``learned+adapted(n=...)`` note
        to ``cost_sources``."""
        if device.name in self._adaptations:
            return self._adaptations[device.name]
        got = None
        if isinstance(getattr(self.model_set, "meta", None), Mapping) and getattr(self.model_set, "path", None):
            from opcast.train.artifacts import load_adaptation

            base = base_name(device)
            got = load_adaptation(self.model_set, base)
            unknown = [d for d in (got.analogue_devices if got else ()) if d not in self.model_set.device_specs]
            if unknown:
                raise OpcastError(
                    f"{got.path} reads the set's answers on {', '.join(unknown)}, whose specs the set does not "
                    "record; re-run opcast train adapt with this set"
                )
        self._adaptations[device.name] = got
        if got is not None:
            measured = ", ".join(f"{g} ({e['rows']})" for g, e in sorted(got.data["groups"].items()))
            carried = f" (carried from {base}, its base)" if base != device.name else ""
            self.range.notes.append(
                f"{got.label} on {device.name}{carried}: learned times corrected by {got.path} (opcast train "
                f"adapt) from {got.rows} measured kernels of {measured}; other groups take its device-level "
                "correction; only the roofline floor bounds them there"
            )
        return got

    def wave_scaled(
        self, kernels: Sequence[Kernel], device: DeviceSpec | None = None
    ) -> tuple[list[Kernel], np.ndarray]:
        """``kernels`` as the predictors are asked them, and the factor on each answer: a GEMM any of whose
        :data:`WAVE_DIMS` exceeds the largest its predictor was fitted on is asked at that largest size, and its
        time scaled by :func:`wave_factor` on ``device``'s SMs. Past a wave of output tiles a GEMM runs as many
        more waves (m, n, b: more tiles) or a proportionally longer reduction per tile (k), so its time is linear
        in each; a learned model extrapolating in ``log m`` answered a 65536 x 7168 x 8192 bf16 GEMM on B200 at
        59 % of its peak, against 65 % at m = 32768 (and held by the bounds, at 40 %). Every other kernel is asked
        as it is, factor 1."""
        asked: list[Kernel] = []
        factors = np.ones(len(kernels))
        sms = None if device is None else device.sm_count
        for i, k in enumerate(kernels):
            got = self._wave.get((k, sms))
            if got is None:
                got = (k, 1.0)
                if k.kind == "gemm" and self.wave_scaling:
                    limits = self.range.largest_fitted(self.group_of(k))
                    params = k.param_dict
                    cut = {d: limits[d] for d in limits if isinstance(params.get(d), int) and params[d] > limits[d]}
                    if cut:
                        factor = wave_factor(params, cut, sms, k.direction == "fwd")
                        got = (
                            Kernel(
                                k.kind,
                                tuple((n, cut.get(n, v)) for n, v in k.params),
                                k.dtype,
                                k.direction,
                                k.tensor_cores,
                            ),
                            factor,
                        )
                self._wave[(k, sms)] = got
            asked.append(got[0])
            factors[i] = got[1]
        return asked, factors

    def wave_note(self) -> str | None:
        """The note of :data:`WAVE_NOTE` when a kernel priced so far was asked at a smaller size, else None."""
        n = len({k for (k, _), (asked, _) in self._wave.items() if asked != k})
        return WAVE_NOTE.format(n=n) if n else None

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        asked, factors = self.wave_scaled(kernels, device)
        query = _query_columns(self.as_fitted(asked))
        out = np.asarray(self.model_set.predict_s(query, device), dtype=float)
        adapted = self.adaptation(device)
        if adapted is not None and out.shape == (len(kernels),):
            params = query.data if adapted.needs_params else None  # its shape terms read the op parameters
            keys = np.array([self.group_of(k) for k in kernels], dtype=object)
            answers = self._analogue_answers(adapted, keys, query)
            out = adapted.apply(self._adaptation_keys(adapted, keys, query), out, params, answers)
        if out.shape != (len(kernels),):
            raise OpcastError(
                f"learned models {self.label} returned {out.shape} predictions for {len(kernels)} kernels; "
                "refit them with this opcast (opcast train fit)"
            )
        out[~np.isfinite(out) | (out <= 0)] = np.nan
        if out.shape == factors.shape:
            out = out * factors
        return out

    @staticmethod
    def _adaptation_keys(adapted: Any, keys: np.ndarray, query: Any) -> np.ndarray:
        """``keys`` with a misaligned tensor-core GEMM's own group where ``adapted`` fitted one
        (:func:`opcast.train.artifacts.adaptation_keys`; ``query``: the kernels' rows)."""
        from opcast.train.artifacts import MISALIGNED_SUFFIX, adaptation_keys, misaligned_rows  # loaded with it

        groups = adapted.data["groups"]
        if not any(g.endswith(MISALIGNED_SUFFIX) for g in groups):
            return keys
        return adaptation_keys(keys, misaligned_rows(query), groups)

    def _analogue_answers(self, adapted: Any, keys: np.ndarray, query: Any) -> dict[str, np.ndarray]:
        """The set's answers on each training device an adaptation's ``analogue`` terms read, for the
        query rows of groups that have one (NaN elsewhere: those rows never read them)."""
        mapped = [g for g, entry in adapted.data["groups"].items() if "analogue" in entry]
        rows = np.flatnonzero(np.isin(keys, mapped))
        sub = query.take(rows) if len(rows) < len(keys) else query
        specs = self.model_set.device_specs
        answers: dict[str, np.ndarray] = {}
        for name in adapted.analogue_devices:
            answers[name] = np.full(len(keys), np.nan)
            if len(rows):
                answers[name][rows] = self.model_set.predict_s(sub, specs[name])
        return answers

    def _outside_shapes(self, items: Sequence[tuple[str, Kernel]], device: DeviceSpec) -> dict[Kernel, str]:
        """Of ``(group key, kernel)`` pairs, the kernels whose features leave their predictor's recorded
        ``feature_ranges`` on one of the training devices that bound ``device`` (:meth:`HardwareRange.reference_specs`;
        where the device features are inside): the model then extrapolates in shape on the devices it was fitted on
        too. Memoised; a predictor that records no ranges has none. (The Arc Pro B60's small L2 put an A100 attention
        kernel's ``log_bytes_over_l2`` outside the NVIDIA rows' range, and so under the resource-ratio rule.)"""
        todo: dict[str, list[Kernel]] = {}
        refs = {key: self.range.reference_specs(key, device) for key, _ in items}
        names = {key: tuple(s.name for s in specs) for key, specs in refs.items()}
        for key, k in items:
            if (key, k, names[key]) not in self._shape_why:
                todo.setdefault(key, []).append(k)
        for key, ks in todo.items():
            found: dict[Kernel, str] = {}
            fitted = self.as_fitted(self.wave_scaled(ks, device)[0])
            for spec in refs[key]:
                try:
                    # the shape alone: a training device of another vendor may lie outside the device features of
                    # a predictor fitted on one vendor's rows (opcast.train.fit.vendor_rows), which is no shape's doing
                    got = self.range.feature_reasons(key, fitted, spec, shapes_only=True)
                except ImportError:
                    break
                for k, f in zip(ks, fitted):
                    if f in got and k not in found:
                        found[k] = f"{got[f]} on {spec.name}"
            for k in ks:
                self._shape_why[(key, k, names[key])] = found.get(k)
        return {k: why for key, k in items if (why := self._shape_why[(key, k, names[key])])}

    @staticmethod
    def _held_training(
        key: str, seen: Sequence[_Seen], shape_why: str | None
    ) -> dict[str, tuple[float, tuple[str, str] | None]]:
        """The times of one kernel on its predictor's training devices (``seen``, floored) held to each
        other: taken from the one with the least of the kernel's bounding resource up, each no slower
        than one with less of both peak and bandwidth, beyond their clock ratio (:data:`MONOTONE`) and,
        when the kernel lies outside the shapes the predictor was fitted on (``shape_why``; its answers there are
        extrapolations on every device), at no higher a utilisation than one with less of the bounding
        resource (:data:`RATIO`). Where the two conflict the ratio is kept: inside the fitted shapes the
        monotone rule lowers a time only as far as the resource ratio allows against the devices with
        less of the bounding resource (other than those the device it copies already outruns beyond
        that ratio), so it never makes a training device faster than the ratio allows where its own
        answer was not. Returns name -> (time, the (rule, why) that moved it or None)."""
        done: list[_Seen] = []
        out: dict[str, tuple[float, tuple[str, str] | None]] = {}
        for s in sorted(seen, key=lambda s: (-s.roof_s, s.peak, s.bw, s.name)):
            lo, hi = s.roof_s, math.inf
            lo_by: _Seen | None = None
            hi_f = 1.0
            hi_by: _Seen | None = None
            for w in done:  # every w has at least s's roofline time: at most as much of the bounding resource
                if shape_why and _at_rel(w, s) > lo:
                    lo, lo_by = _at_rel(w, s), w
                f = slower_at_most(_resources(s), _resources(w))
                if f is not None and w.time_s * f < hi:
                    hi, hi_by, hi_f = w.time_s * f, w, f
            ratio_by: _Seen | None = None
            if not shape_why and hi_by is not None and hi < s.time_s:
                # the monotone rule carries hi_by's time over only as far as the resource ratio allows against
                # the devices with less of the bounding resource, bar those hi_by itself already outruns
                # beyond that ratio (that relation is its own data's, not one the rule creates)
                for w in done:
                    if hi_by.roof_s <= w.roof_s and _util(hi_by) > _util(w) * (1 + 1e-12):
                        continue
                    if w.time_s * s.roof_s / w.roof_s > hi:  # the datasheet ratio: monotone in the resources
                        hi, ratio_by = w.time_s * s.roof_s / w.roof_s, w
            t, why = s.time_s, None
            if lo > hi:  # the training devices disagree beyond the ratio of their resources: the ratio is kept
                t = max(lo, min(t, hi))
            else:
                t = min(max(t, lo), hi)
            if t > s.time_s and lo_by is not None:
                why = (
                    RATIO,
                    f"{key} on training device {s.name} at {s.roof_s / s.time_s:.0%} of its bounding resource, above "
                    f"the {lo_by.roof_s / lo_by.time_s:.0%} it predicts on {lo_by.name}, which has less of it"
                    f"{_sustained_note(lo_by, s.sustained)}, for a shape outside those it was fitted on ({shape_why}); "
                    "held there",
                )
                if lo > hi and hi_by is not None:
                    why = (
                        RATIO,
                        why[1] + f"; slower than on {hi_by.name}, which has less of both peak and bandwidth"
                        f"{_clock_note(hi_f)}: the "
                        "bounds conflict (the training devices disagree beyond the ratio of their resources) and the "
                        "ratio is kept",
                    )
            elif t < s.time_s and hi_by is not None:
                why = (
                    MONOTONE,
                    f"{key} on training device {s.name} slower than on {hi_by.name}, which has less of both peak "
                    f"and bandwidth{_clock_note(hi_f)}; held there",
                )
                if ratio_by is not None:
                    why = (
                        MONOTONE,
                        f"{key} on training device {s.name} slower than on {hi_by.name}, which has less of both peak "
                        f"and bandwidth{_clock_note(hi_f)}; lowered toward its time only as far as the resource ratio "
                        f"to {ratio_by.name} allows (at most the {_util(ratio_by):.0%} of the bounding resource it "
                        "predicts there, which has less of it)",
                    )
            out[s.name] = (t, why)
            done.append(s._replace(time_s=t))
        return out

    def bound(
        self, kernels: Sequence[Kernel], times: np.ndarray, device: DeviceSpec, margin: float = UTILISATION_MARGIN
    ) -> tuple[np.ndarray, dict[Kernel, tuple[str, str]]]:
        """``times`` (this source's answers for ``kernels`` on ``device``) held to physics
        (:data:`BOUND_RULES`): the roofline floor everywhere; on a device a kernel's predictor was
        fitted on, monotonicity against its other training devices (and the resource ratio where the
        kernel's shape is outside the fitted ones, :meth:`_held_training`); on one it was not fitted
        on, the utilisation span, the resource ratio and monotonicity against the training devices'
        (so held) times, applied as one projection onto the interval all of them allow (where that is
        empty, onto the one the floor and the ratio allow, and the reason says so). Returns the bounded
        times and, for each kernel a rule moved, (rule, why). The training devices' times come from
        this source in one batched call per device, cached."""
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
            seconds, resource = roof_at_peak(*work[i], peak, spec.mem_bw_bytes_per_s)
            return seconds, peak, resource

        roofs = [roof(i, device) for i in range(len(kernels))]
        held: list[int] = []
        wanted: dict[str, tuple[DeviceSpec, list[Kernel]]] = {}
        from opcast.train.features import unread_peaks

        # a training GPU placed on another network, or changed only in peaks a group never reads, is still that GPU
        unread = {key: unread_peaks(key) for key in dict.fromkeys(keys)}
        twins = {key: kernel_twin(device, unread[key]) for key in unread}
        adapted = self.adaptation(device) is not None  # measured there: its correction, not the bounds, rules
        for i, (k, key) in enumerate(zip(kernels, keys)):
            if not np.isfinite(out[i]) or adapted:
                continue
            impl = _kernel_impl(k)
            specs = self.range.reference_specs(key, device, impl)
            twin = twins[key]
            if twin in self.range.fitted_on(key, impl):
                self._on_training.setdefault(twin, {})[k] = float(out[i])
                if len(specs) < 2 or twin not in {s.name for s in specs}:
                    continue
            if specs and np.isfinite(roofs[i][0]):
                held.append(i)
                for spec in specs:
                    if spec.name != twin and k not in self._on_training.get(spec.name, {}):
                        wanted.setdefault(spec.name, (spec, []))[1].append(k)
        for name, (spec, ks) in wanted.items():  # one batched call per training device
            got = self.predict_s(list(dict.fromkeys(ks)), spec)
            self._on_training.setdefault(name, {}).update(zip(dict.fromkeys(ks), (float(t) for t in got)))
        shapes = self._outside_shapes([(keys[i], kernels[i]) for i in held], device)
        same_die_names = {key: self.range.same_die_as(device, unread[key]) - {twins[key]} for key in twins}
        for i in held:
            k, key = kernels[i], keys[i]
            r_s, peak, resource = roofs[i]
            seen: list[_Seen] = []
            for spec in self.range.reference_specs(key, device, _kernel_impl(k)):
                t_i = self._on_training[spec.name].get(k, math.nan)
                r_i, peak_i, res_i = roof(i, spec)
                if np.isfinite(t_i) and np.isfinite(r_i) and r_i > 0:
                    # the compute side only: a power-limited part's clock is a property of that part (T4,
                    # L40S), where a memory-side shortfall is the kernel's on that part (the rmsnorm rows reach
                    # 0.34-0.40 of GH200's and A100's bandwidth), which the datasheet ratio is meant to hold:
                    # normalised there, H100-B200 ran 1.2-2.6x their ratio past A100 (kernel_sanity, issue 21)
                    sus = self.range.sustained(key, spec.name, res_i) if res_i == "compute" else 1.0
                    bw_i, clock_i = spec.mem_bw_bytes_per_s, spec.boost_clock_hz
                    seen.append(_Seen(spec.name, max(t_i, r_i), r_i, peak_i, bw_i, clock_i, spec.tdp_w, sus, res_i))
            if not seen:
                continue
            on_training = self._held_training(key, seen, shapes.get(k))
            twin = twins[key]
            if twin in on_training:  # a training device: held against the others only
                t, moved = on_training[twin]
                if moved is not None and t != out[i]:
                    out[i], why[k] = t, moved
                continue
            die = self._die_of(key, device)
            if die is not None and (resource == "compute" or _as_its_die(die, device)) and die.name in on_training:
                # another board of a training GPU's die, compute-bound: that GPU's time as held there (the
                # model set already answers with its features, opcast.train.features.board_time_s); any kernel
                # where the board has that GPU's memory bandwidth too (H800 of H100-SXM: NVLink capped, the chip
                # and HBM alike), which the model set answers with the same features: held as an unseen device
                # instead, H800's decode steps ran 1.13x H100-SXM's on one GPU
                t = on_training[die.name][0]
                if t != out[i]:
                    bound_by = "compute-bound" if resource == "compute" else "its memory bandwidth alike"
                    out[i], why[k] = t, (DIE, f"{key} on {device.name}, {bound_by}: as on {die.name}, its die")
                continue
            if die is not None and die.name in on_training:
                # another board of a training GPU's die, bound by memory: the same SMs, clocks and L2, another
                # bandwidth, so between that GPU's time (latency-bound: the bandwidth does not enter) and that time
                # scaled by the bandwidth ratio (bound by it alone). The cross-device rules instead held
                # A100-SXM4-40GB's decode attention (1 % of its bandwidth) at the utilisation of other
                # architectures' kernels: 0.8x A100-SXM4-80GB's time, or 1.5x at the Arc Pro B60's
                t_die, ratio = on_training[die.name][0], die.mem_bw_bytes_per_s / device.mem_bw_bytes_per_s
                # this product, not t_die * ratio: they differ in the last bit, which made an answer at the end "moved"
                ends = (t_die, t_die * die.mem_bw_bytes_per_s / device.mem_bw_bytes_per_s)
                t = min(max(out[i], min(ends), r_s), max(max(ends), r_s))
                if t != out[i]:
                    said = (
                        f"between its time on {die.name}, its die, and that time x {ratio:.2f}, their bandwidth ratio"
                    )
                    out[i], why[k] = t, (DIE, f"{key} on {device.name}, memory-bound: {said}")
                continue
            seen = [s._replace(time_s=on_training[s.name][0]) for s in seen]
            t, u = out[i], r_s / out[i]
            what = "peak" if resource == "compute" else "memory bandwidth"
            names = ", ".join(s.name for s in seen)
            utils = [s.roof_s / s.time_s for s in seen]
            lo, hi = min(utils) / margin, min(1.0, max(utils) * margin)
            # (seconds, rule, what the rule says): each rule's lower and upper bound on the time
            lowers = [(r_s, FLOOR, "no faster than the roofline at the datasheet peak")]
            uppers: list[tuple[float, str, str]] = []
            lowers.append((r_s / hi, SPAN, f"at most the {hi:.0%} it predicts on its training devices ({names})"))
            uppers.append((r_s / lo, SPAN, f"at least the {lo:.0%} it predicts on its training devices ({names})"))
            # speed-ups at most the ratio of what bounds the kernel, against a training device with less
            # of it (utilisation no higher than there) and one with more (no lower than there)
            # of the share of its datasheet each sustains (_rel): this device is credited with the best share a
            # training device sustains against a weaker one, and the least against a stronger one
            # against training devices where the same resource bounds the kernel: a utilisation of the memory
            # there says nothing of one of the peak here (NeuSight's bmm rows compute-bound on A100 and
            # memory-bound on P4, ridge 12.5 vs 28.6 FLOP/byte, were held at P4's share of its bandwidth)
            alike = [s for s in seen if s.resource in ("", resource)]
            weaker = [s for s in alike if s.roof_s >= r_s]
            stronger = [s for s in alike if s.roof_s <= r_s]
            # on a compute-bound kernel, a bigger board of a training GPU's compute die (A100-PCIe-80GB of
            # A100-PCIe-40GB: the same SMs and peak, more bandwidth) takes its utilisation cap from that GPU alone,
            # not from another architecture (P4's held A100-PCIe-80GB's 8192^3 FP32 GEMM at 65 % of the peak,
            # below the 85 % A100-PCIe-40GB reaches); memory-bound kernels differ between the boards by design
            board_of = [
                s
                for s in weaker
                if resource == "compute"
                and s.name in same_die_names[key]
                and peak >= s.peak
                and device.mem_bw_bytes_per_s >= s.bw
            ]
            # a hypothetical GPU made from a training GPU (explore / --set: B200[peak_bf16_flops=x1.05]) with at least
            # its peak, bandwidth and clock takes its cap from that GPU alone, on any kernel, credited with the share
            # that GPU sustains: capped by the weakest share of the others, B200's bf16 GEMMs (77 % of its peak) fell
            # to MI300X's 62 %, 1.25x slower than on B200 itself for 5 % more peak, or for more L2 or SMs
            made_from = base_name(device)
            mine = (peak, device.mem_bw_bytes_per_s, device.boost_clock_hz, device.tdp_w)
            base_of = [s for s in weaker if s.name == made_from and slower_at_most(mine, _resources(s)) == 1]
            weaker = board_of or base_of or weaker
            best, least = max(s.sustained for s in seen), min(s.sustained for s in seen)
            if base_of and not board_of:
                best = base_of[0].sustained
            cap = min(weaker, key=_rel) if weaker else None
            rise = max(stronger, key=_rel) if stronger else None
            u_cap = min(1.0, _rel(cap) * best) if cap is not None else math.inf
            if cap is not None:
                lowers.append(
                    (
                        r_s / (u_cap * margin),
                        RATIO,
                        f"at most the {u_cap:.0%} it predicts on {cap.name}, which has less of it"
                        + _sustained_note(cap, best),
                    )
                )
            if rise is not None and _rel(rise) * least <= u_cap:
                u_rise = _rel(rise) * least
                uppers.append(
                    (
                        r_s / (u_rise / margin),
                        RATIO,
                        f"at least the {u_rise:.0%} it predicts on {rise.name}, which has more of it"
                        + _sustained_note(rise, least),
                    )
                )
            for s in seen:  # monotone in the resources, latency at the clock
                if (f := slower_at_most(_resources(s), mine)) is not None:
                    lowers.append(
                        (
                            s.time_s / f,
                            MONOTONE,
                            f"no faster than on {s.name}, which has more of both peak and bandwidth" + _clock_note(f),
                        )
                    )
                if (f := slower_at_most(mine, _resources(s))) is not None:
                    uppers.append(
                        (
                            s.time_s * f,
                            MONOTONE,
                            f"no slower than on {s.name}, which has less of both peak and bandwidth" + _clock_note(f),
                        )
                    )
            low = max(lowers, key=lambda b: b[0])
            high = min(uppers, key=lambda b: b[0]) if uppers else (math.inf, "", "")
            conflict = ""
            if low[0] > high[0] * (1 + 1e-12):  # empty: keep the floor and the ratio
                conflict = (
                    f"; its bounds conflict ({low[2]}: >= {low[0] * 1e6:.3g} us; {high[2]}: <= {high[0] * 1e6:.3g} us; "
                    "the training devices disagree beyond the ratio of their resources), the roofline-ratio-consistent "
                    "bound is kept"
                )
                low = max((b for b in lowers if b[1] in (FLOOR, RATIO)), key=lambda b: b[0])
                if high[0] < low[0]:  # the others as far as the floor and the ratio allow
                    high = low
                note = (
                    f"{key} on {device.name}: its training devices disagree beyond the ratio of their resources on "
                    "some kernels; there the roofline-ratio-consistent bound is kept, not the monotone one"
                )
                if note not in self.range.notes:
                    self.range.notes.append(note)
            if t < low[0]:
                t, rule = low[0], low
            elif t > high[0]:
                t, rule = high[0], high
            else:
                continue
            out[i] = t
            why[k] = (
                rule[1],
                f"{key} on {device.name} at {u:.0%} of its {what}: {rule[2]}; held at {100 * r_s / t:.0f} %{conflict}",
            )
        for i, k in enumerate(kernels):  # the floor, last: nothing beats the roofline at the peak
            r_s, _, resource = roofs[i]
            if np.isfinite(out[i]) and np.isfinite(r_s) and out[i] < r_s:
                why[k] = (
                    FLOOR,
                    f"{keys[i]} on {device.name} faster than its {resource} roofline at the datasheet peak "
                    f"({r_s * 1e6:.3g} us; {out[i] / r_s:.0%} of it); held at the roofline",
                )
                out[i] = r_s
        return out, why
