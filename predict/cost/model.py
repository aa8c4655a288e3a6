"""The kernel cost model: :class:`KernelCostModel` asks its sources in order (learned where they
cover, published measurements for FlashAttention-1-generation attention, the roofline elsewhere),
labels every answer with the source that gave it (a source with ``source_label`` labels each kernel), holds learned
answers to the physical bounds and caches per device; eager attention is priced from its kernels
(:func:`decompose`). The entry points that build one: :func:`load_kernel_cost` (``--models``,
``--roofline``, ``--analytic``) and :func:`roofline_only`."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from opcast.archs import routed_expert_ops
from opcast.dtypes import QUANTISED_PRECISIONS, element_bytes
from opcast.errors import OpcastError
from opcast.ops import native_extra_bytes, takes_kernel_impls
from opcast.predict.cost.learned import BOUND_RULES, LearnedKernelCost
from opcast.predict.cost.published import PublishedAttentionCost
from opcast.predict.cost.query import LEARNED, Kernel, KernelTimeSource, kernel
from opcast.predict.cost.roofline import RooflineKernelCost
from opcast.predict.intervals import Residuals

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec


# --------------------------------------------------------------------------- decompositions


def decompose(k: Kernel) -> list[tuple[Kernel, int]] | None:
    """What prices an op no source covers, from kernels a source may cover (None: nothing).

    A one-pass kernel of an implementation no learned model has data of (a norm, softmax, cross-entropy
    or rope whose ``impl`` its predictor does not speak for: Apex / Transformer Engine RMSNorm and
    LayerNorm, Liger's rope) is one streaming kernel over the registry's traffic of that implementation
    (torch's native cross-entropy, two kernels, with their extra passes: :data:`opcast.ops.NATIVE_EXTRA_PASSES`):
    priced as the learned ``elementwise`` ``mul_scalar`` of its dtype that moves as many bytes (reads and
    writes one element each, so ``numel = bytes / (2 x element size)``; the convention of
    :func:`opcast.predict.graph.traffic_op`), which carries the device's measured streaming bandwidth and
    its launch floor where the roofline of the traffic has neither (a 1 MB norm at 1.1 us on an A100).
    Else :func:`_decompose_eager`."""
    if k.kind == "moe":
        return _decompose_moe(k)
    if takes_kernel_impls(k.kind) and "impl" in k.param_dict:
        moved = k.bytes_moved() + native_extra_bytes(k.kind, k.param_dict, element_bytes(k.dtype), k.direction)
        numel = max(1, math.ceil(moved / (2 * element_bytes(k.dtype))))
        return [(kernel("elementwise", {"numel": numel, "fn": "mul_scalar"}, k.dtype, "fwd"), 1)]
    return _decompose_eager(k)


DECOMPOSED_KINDS: Final = frozenset({"moe"})
"""Kinds that, where no learned source covers them, are their parts (:func:`decompose`) whatever prices those: a
fused MoE layer is priced as the grouped GEMMs opcast prices a block's experts as without it (learned or roofline,
each part by its own source), never by a roofline of the fused kernel."""


def _decompose_moe(k: Kernel) -> list[tuple[Kernel, int]]:
    """A fused MoE layer (``moe``) as the kernels of :func:`opcast.archs.routed_expert_ops`: GEMMs in the kernel's
    dtype, the copies and the activation in the activations'
    (bf16 under a quantised precision, :func:`opcast.predict.memory.activation_dtype`); a gated SiLU as the one
    ``silu_and_mul`` kernel every engine's fused MoE runs (:func:`opcast.archs.gated_activation_ops`)."""
    act = "bf16" if k.dtype in QUANTISED_PRECISIONS.values() else k.dtype
    parts = routed_expert_ops(k.param_dict, fused_swiglu=True)  # an engine's fused layer: one silu_and_mul
    return [
        (
            kernel(kind, params, k.dtype, k.direction, k.tensor_cores)
            if kind == "gemm"
            else kernel(kind, params, act, k.direction, False),
            1,
        )
        for _, kind, params in parts
    ]


def _parts_sum_s(
    k: Kernel, parts: list[tuple[Kernel, int]], table: dict[Kernel, tuple[float, str]], device: DeviceSpec
) -> float:
    """``k``'s time as the sum of its parts (:func:`decompose`) priced in ``table``: a weight-only fused MoE layer's
    grouped GEMMs read its narrower expert weights (:func:`opcast.predict.weight_only.weight_only_time_s`)."""
    storage = str(k.param_dict.get("weights", "dtype")) if k.kind == "moe" else "dtype"
    if storage == "dtype":
        return sum(n * table[p][0] for p, n in parts)
    from opcast.predict.weight_only import weight_only_time_s

    return sum(
        n
        * (
            weight_only_time_s(table[p][0], p.param_dict, device=device, dtype=p.dtype, storage=storage)
            if p.kind == "gemm"
            else table[p][0]
        )
        for p, n in parts
    )


def _decompose_eager(k: Kernel) -> list[tuple[Kernel, int]] | None:
    """The kernels an op runs as, where it is not one kernel: eager attention is two batched GEMMs
    around a scale, a mask and torch's native softmax over the ``[b*h, s_q, s_kv]`` scores (Hugging
    Face's eager path, Megatron's unfused core attention without its fused softmax; K/V heads repeated
    for GQA), and in backward the four
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

    # torch's own softmax kernel (registry impl native), as Hugging Face's eager path runs it;
    # Megatron's FusedScaleMaskSoftmax would fold the scale and mask in (not modelled here)
    softmax = {"rows": bh * sq, "cols": skv, "impl": "native"}
    if k.direction == "fwd":
        parts = [
            g(sq, skv, d),
            ew("div_scalar"),
            *([ew("add")] if p["causal"] else []),
            kernel("softmax", softmax, k.dtype),
            g(sq, d, skv),
        ]
    else:
        parts = [
            g(sq, skv, d),
            g(skv, d, sq),  # dP = dO V^T, dV = P^T dO
            kernel("softmax", softmax, k.dtype, "bwd"),
            ew("div_scalar", "bwd"),
            g(sq, d, skv),
            g(skv, d, sq),
        ]  # dQ = dS K, dK = dS^T Q
    return [(part, 1) for part in parts]


def _composite_label(k: Kernel) -> str:
    """How :func:`decompose` priced ``k`` (for its flags)."""
    if k.kind == "attention":
        return "eager attention from its kernels"
    if k.kind == "moe":
        return "fused MoE layer as its grouped GEMMs"
    return "priced as the streaming kernel of its traffic"


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

    def family_of(self, k: Kernel) -> str | None:
        """The kernel family (``impl``) whose own predictor group prices ``k``: that of the first source covering it
        that has one (a learned set with the family's group, :meth:`LearnedKernelCost.family_of`), else None (the
        kind's default family, or no learned source)."""
        for source in self.sources:
            family_of = getattr(source, "family_of", None)
            if family_of is not None and source.covers(k):
                return family_of(k)
        return None

    def lookup(self, kernels: Sequence[Kernel], device: DeviceSpec) -> dict[Kernel, tuple[float, str]]:
        """(seconds, source) for every kernel, computing only the ones not cached yet."""
        cache = self._cache.get(device)
        if cache is None:
            cache = self._cache[device] = {}
        flags = self._flags.setdefault(device, {})
        todo = [k for k in dict.fromkeys(kernels) if k not in cache]
        *preferred, fallback = self.sources
        parted = [k for k in todo if k.kind in DECOMPOSED_KINDS and not any(s.covers(k) for s in preferred)]
        if parted:
            self._price_parts(parted, device, cache, flags)
            todo = [k for k in todo if k not in cache]
        if preferred and todo:
            # One batch per source: the kernels themselves plus the parts of uncovered multi-kernel
            # ops (a learned model's per-call overhead dwarfs its per-row cost).
            composite = {
                k: parts
                for k in todo
                if not any(s.covers(k) for s in preferred)
                and (parts := decompose(k))
                and all(any(s.covers(p) for s in preferred) for p, _ in parts)
            }
            batch = list(
                dict.fromkeys([*todo, *(p for parts in composite.values() for p, _ in parts if p not in cache)])
            )
            for source in preferred:
                batch = self._ask(source, batch, device, cache, flags)
            for k, parts in composite.items():
                if all(cache.get(p, (0.0, ""))[1] == LEARNED for p, _ in parts):
                    cache[k] = (sum(n * cache[p][0] for p, n in parts), LEARNED)
                why = next((flags[p] for p, _ in parts if p in flags), None)
                if why:
                    flags[k] = f"{_composite_label(k)}; {why}"
                bounds = self._bounds.get(device, {})
                rule = next((bounds[p] for p, _ in parts if p in bounds), None)
                if rule and k in cache:
                    bounds[k] = (rule[0], f"{_composite_label(k)}; {rule[1]}")
            todo = [k for k in todo if k not in cache]
        todo = self._ask(fallback, todo, device, cache, flags)
        if todo:  # the last source always answers; reaching here is a bug in a source, not bad input
            raise RuntimeError(f"internal: no kernel-time source could time {todo[0].kind} {dict(todo[0].params)}")
        return cache

    def parts_time_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> list[float]:
        """Each of ``kernels`` priced as its parts (:func:`decompose`) whatever source covers it whole: what this
        model prices a fused MoE layer as without a learned model of the fused kernel (``benchmarks/moe_kernels.py``
        scores it). A kernel without parts is 0."""
        parts = {k: decompose(k) or [] for k in kernels}
        table = self.lookup([p for ps in parts.values() for p, _ in ps], device)
        return [_parts_sum_s(k, parts[k], table, device) for k in kernels]

    def _price_parts(
        self,
        kernels: list[Kernel],
        device: DeviceSpec,
        cache: dict[Kernel, tuple[float, str]],
        flags: dict[Kernel, str],
    ) -> None:
        """Price each of ``kernels`` (of :data:`DECOMPOSED_KINDS`, no learned source covering them) as the sum of
        its parts (:func:`decompose`), each part by the source that answers it; labelled learned where every part
        is, else with the first other part's source, its flags and bounds carried as for the eager composites."""
        parts = {k: decompose(k) or [] for k in kernels}
        table = self.lookup([p for ps in parts.values() for p, _ in ps], device)
        for k, ps in parts.items():
            labels = [table[p][1] for p, _ in ps]
            label = next((lab for lab in labels if lab != LEARNED), LEARNED)
            cache[k] = (_parts_sum_s(k, ps, table, device), label)
            why = next((flags[p] for p, _ in ps if p in flags), None)
            if why:
                flags[k] = f"{_composite_label(k)}; {why}"
            bounded = self._bounds.get(device, {})
            rule = next((bounded[p] for p, _ in ps if p in bounded), None)
            if rule:
                self._bounds.setdefault(device, {})[k] = (rule[0], f"{_composite_label(k)}; {rule[1]}")

    def _ask(
        self,
        source: KernelTimeSource,
        todo: list[Kernel],
        device: DeviceSpec,
        cache: dict[Kernel, tuple[float, str]],
        flags: dict[Kernel, str],
    ) -> list[Kernel]:
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
            label = getattr(source, "source_label", None)  # a source that labels each kernel (published)
            for k, t in zip(mine, times):
                if np.isfinite(t):
                    cache[k] = (float(t), source.name if label is None else label(k, device))
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
            out[device.name] = {
                "bounded_kernels": len(bounded),
                "learned_kernels": learned,
                "by_rule": dict(sorted(by_rule.items())),
                "example": next(iter(bounded.values()))[1],
            }
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
                if (wave := s.wave_note()) is not None:
                    notes.append(wave)
            if isinstance(s, PublishedAttentionCost):
                notes += [n for n in s.notes if n not in notes]
        summary = self.bounds_summary()
        for name, b in summary.items():
            rules = ", ".join(f"{n} {rule.replace('_', ' ')}" for rule, n in b["by_rule"].items())
            notes.append(
                f"physical bounds moved {b['bounded_kernels']} of {b['learned_kernels']} learned kernel time(s) "
                f"on {name} ({rules}), e.g. {b['example']}"
            )
        out: dict[str, Any] = {
            "kernel_models": self.models_label,
            "roofline_efficiency": self.roofline.efficiency.source,
            "learned_out_of_range": "roofline" if self.in_range_only else "flagged",
            "notes": notes,
        }
        if learned:
            out["physical_bounds"] = {"rules": dict(BOUND_RULES) if self.physical_bounds else "off", "bounded": summary}
        return out


def roofline_only(note: str = "roofline forced") -> KernelCostModel:
    return KernelCostModel(sources=(RooflineKernelCost(),), notes=[note])


def models_flag_problem(models: str | Path | None, use_learned: bool) -> str | None:
    """The one rule of ``--models`` with ``--roofline``: together they contradict each other
    (the roofline ignores every learned model), so the pair is refused, never silently resolved."""
    if models is not None and not use_learned:
        return (
            f"--models {models} and --roofline contradict each other (--roofline ignores every learned model); "
            "drop one of them"
        )
    return None


BOUNDS_ENV = "OPCAST_PHYSICAL_BOUNDS"
"""Internal switch, not a user option: ``off`` turns the physical bounds off in
:func:`load_kernel_cost`, and the scaling of GEMMs past the fitted sizes with them
(:meth:`LearnedKernelCost.wave_scaled`), to measure what they change (the JSON's ``physical_bounds.rules`` then
says ``off``). Anything else, or unset: on."""


def physical_bounds_enabled() -> bool:
    return os.environ.get(BOUNDS_ENV, "on").strip().lower() != "off"


def load_kernel_cost(
    models: str | Path | None = None, *, use_learned: bool = True, in_range_only: bool = False
) -> KernelCostModel:
    """The kernel cost model for ``--models DIR`` (errors are the user's to fix), or the embedded
    default (its absence falls back to the roofline, said in ``notes``). ``in_range_only``: learned
    models answer only inside the hardware they were fitted on (``--analytic``). ``models`` with
    ``use_learned=False`` is refused (:func:`models_flag_problem`)."""
    if problem := models_flag_problem(models, use_learned):
        raise OpcastError(problem)
    if not use_learned:
        return roofline_only("learned models disabled (--roofline): every kernel uses the roofline fallback")
    try:
        from opcast.train.artifacts import load_model_set
    except ImportError as err:
        if models is not None:
            raise OpcastError(
                f"--models {models} needs opcast.train.artifacts, which cannot be imported ({err}); "
                "install the full opcast or drop --models"
            ) from None
        return roofline_only(
            f"learned models unavailable (opcast.train.artifacts cannot be imported: {err}); "
            "every kernel uses the roofline fallback"
        )
    if models is not None:
        path = Path(models)
        if not path.exists():
            raise OpcastError(
                f"--models {path} does not exist; give a folder written by `opcast train fit`, "
                "or drop --models to use the embedded default"
            )
        model_set = load_model_set(path)
        label = str(path)
    else:
        try:
            model_set = load_model_set(None)
        except OpcastError as err:
            return roofline_only(f"default models unavailable ({err}); every kernel uses the roofline fallback")
        label = "embedded default (models/default)"
    bounds = physical_bounds_enabled()
    where = "(op, dtype, direction)" + (
        " inside the hardware they were fitted on (--analytic)" if in_range_only else ""
    )
    return KernelCostModel(
        # flash1 attention (FlashAttention-1 generation): no learned model has data of it, so its
        # published measured rate answers before the roofline; nothing else is covered by it
        sources=(
            LearnedKernelCost(model_set, label, wave_scaling=bounds),
            PublishedAttentionCost(),
            RooflineKernelCost(),
        ),
        models_label=label,
        in_range_only=in_range_only,
        physical_bounds=bounds,
        notes=[f"learned models from {label} where they cover the {where}; roofline elsewhere"],
    )
