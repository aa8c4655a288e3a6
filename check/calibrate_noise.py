"""Is this machine quiet enough to calibrate on? Rules that read timings, never take them.

A calibration fits this machine's kernel speed; timings taken while other work steals the cores
are that work's noise, and a model fitted on them predicts it: on a loaded 2-core box one fitted a
GEMM model whose 90 % interval for a six-layer Llama step was [3.6 s, 203 s] around 5.4 s
(measured 1.35 s). Three signals, each a pure function of numbers measured elsewhere:

- **load**: the 1-minute load average before any of our own work, per usable core
  (``os.getloadavg()`` against the CPU affinity), above :attr:`NoiseRules.busy_load`;
- **spread** of repetitions: p80 / p20 of one measurement's repetitions (the spread triton's
  ``do_bench`` reports), per anchor and over the rows a collection wrote;
- **drift** of anchors: a few fixed shapes (:data:`ANCHOR_SHAPES`) timed at the start and again
  at the end; a machine that got busier (or throttled) in between times them differently.

And one on the result: a prediction interval whose high / low ratio exceeds
:attr:`NoiseRules.max_interval_ratio` is a failed calibration, not a result. The thresholds are
stated in :class:`NoiseRules`, with where each number comes from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class NoiseRules:
    """Thresholds of the noise rules."""

    busy_load: float = 0.75
    """Busy when the 1-minute load average exceeds this many runnable tasks per usable core (the
    rule ``opcast validate`` already notes: other work then holds most cores, and every
    multi-threaded op waits for a descheduled thread)."""
    anchor_spread: float = 1.3
    """Noisy when an anchor's p80 exceeds its p20 by this factor. Anchors are milliseconds-long
    ops repeated tens of times on a cold cache; on a quiet machine their p80/p20 stays within a
    few percent to ~15 %."""
    anchor_drift: float = 1.3
    """Noisy when an anchor's median at the end differs from the start by this factor either way."""
    row_spread: float = 1.5
    """A collected row is noisy when its p80/p20 exceeds this factor."""
    noisy_row_share: float = 0.25
    """Noisy when more than this share of the rows a collection wrote are noisy rows."""
    min_rows: int = 20
    """Fewer rows than this are not judged by their share (one bad row is not a busy machine)."""
    max_interval_ratio: float = 8.0
    """A 90 % interval whose high / low exceeds this is a failed calibration. The widest interval
    of the recorded CPU calibrations (benchmarks/results/validate_cpu.md, 873 points) was 4.5x;
    the busy-machine one of issue 15 was 56x."""


RULES = NoiseRules()


@dataclass(frozen=True, kw_only=True, slots=True)
class AnchorTiming:
    """One anchor shape's timing: median and p20/p80 of its repetitions, in seconds."""

    name: str
    median_s: float
    p20_s: float
    p80_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "median_s": self.median_s, "p20_s": self.p20_s, "p80_s": self.p80_s}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AnchorTiming:
        return cls(
            name=str(doc["name"]), median_s=float(doc["median_s"]), p20_s=float(doc["p20_s"]), p80_s=float(doc["p80_s"])
        )


ANCHOR_SHAPES: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "cpu": {
        "gemm 512^3": ("gemm", {"b": 1, "m": 512, "n": 512, "k": 512}),
        "add 4M": ("elementwise", {"numel": 1 << 22, "fn": "add"}),
    },
    "cuda": {
        "gemm 4096^3": ("gemm", {"b": 1, "m": 4096, "n": 4096, "k": 4096}),
        "add 64M": ("elementwise", {"numel": 1 << 26, "fn": "add"}),
    },
}
"""Anchors per device type: one compute-bound GEMM and one memory-bound add, a few milliseconds
each on their device (a 2-core CPU; one GPU)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """Whether timings look noisy, and every reason why."""

    noisy: bool
    reasons: tuple[str, ...] = ()

    def message(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"noisy": self.noisy, "reasons": list(self.reasons)}


def spread(p20_s: float, p80_s: float) -> float:
    """p80 / p20 (inf when p20 is not positive, so a broken timing never passes as quiet)."""
    return p80_s / p20_s if p20_s > 0 and math.isfinite(p80_s) else math.inf


def load_average() -> tuple[float, int] | None:
    """(1-minute load average, usable cores), where the OS reports one."""
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return os.getloadavg()[0], cores
    except OSError:
        return None


def load_reason(load: tuple[float, int] | None, rules: NoiseRules = RULES) -> str | None:
    """Why the load average says busy, or None."""
    if load is None:
        return None
    avg, cores = load
    if avg > rules.busy_load * max(cores, 1):
        return f"load average {avg:.1f} on {cores} core(s) before the run"
    return None


def anchor_reasons(anchors: Sequence[AnchorTiming], rules: NoiseRules = RULES) -> list[str]:
    """The anchors whose repetitions spread too widely."""
    out = []
    for a in anchors:
        s = spread(a.p20_s, a.p80_s)
        if s > rules.anchor_spread:
            out.append(
                f"anchor {a.name} varied {s:.2f}x between its repetitions (p80/p20; quiet: < {rules.anchor_spread:g}x)"
            )
    return out


def drift_reasons(start: Sequence[AnchorTiming], end: Sequence[AnchorTiming], rules: NoiseRules = RULES) -> list[str]:
    """The anchors whose median moved between ``start`` and ``end``."""
    before = {a.name: a for a in start}
    out = []
    for a in end:
        b = before.get(a.name)
        if b is None or b.median_s <= 0 or a.median_s <= 0:
            continue
        ratio = a.median_s / b.median_s
        if max(ratio, 1 / ratio) > rules.anchor_drift:
            out.append(
                f"anchor {a.name} took {1e3 * b.median_s:.3g} ms at the start and {1e3 * a.median_s:.3g} ms "
                f"at the end ({ratio:.2f}x; quiet: within {rules.anchor_drift:g}x)"
            )
    return out


def row_reasons(spreads: Sequence[tuple[float, float]], rules: NoiseRules = RULES) -> list[str]:
    """Whether too many collected rows, each given as (p20_s, p80_s), spread widely."""
    if len(spreads) < rules.min_rows:
        return []
    noisy = sum(1 for p20, p80 in spreads if spread(p20, p80) > rules.row_spread)
    share = noisy / len(spreads)
    if share > rules.noisy_row_share:
        return [
            f"{noisy} of {len(spreads)} measured points ({100 * share:.0f} %) varied more than {rules.row_spread:g}x "
            f"between repetitions (quiet: under {100 * rules.noisy_row_share:.0f} %)"
        ]
    return []


def interval_reason(label: str, low_s: float, high_s: float, rules: NoiseRules = RULES) -> str | None:
    """Why the interval of ``label`` is too wide to be a result, or None."""
    ratio = high_s / low_s if low_s > 0 else math.inf
    if not ratio <= rules.max_interval_ratio:
        return (
            f"the 90 % interval of {label} is [{low_s:.3g} s, {high_s:.3g} s], {ratio:.3g}x wide "
            f"(a calibration fails above {rules.max_interval_ratio:g}x)"
        )
    return None


def assess(
    *,
    load: tuple[float, int] | None = None,
    anchors: Sequence[AnchorTiming] = (),
    start_anchors: Sequence[AnchorTiming] | None = None,
    rows: Sequence[tuple[float, float]] = (),
    rules: NoiseRules = RULES,
) -> Verdict:
    """Every rule on what was measured: the load before the run, the anchors (and their drift from
    ``start_anchors``), the (p20, p80) of collected rows."""
    reasons: list[str] = []
    why = load_reason(load, rules)
    if why:
        reasons.append(why)
    reasons += anchor_reasons(anchors, rules)
    if start_anchors is not None:
        reasons += drift_reasons(start_anchors, anchors, rules)
    reasons += row_reasons(rows, rules)
    return Verdict(noisy=bool(reasons), reasons=tuple(reasons))
