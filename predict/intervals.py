"""Prediction intervals: from the held-out residuals of each learned predictor to an iteration.

Each learned predictor records, at fit time, quantiles of ``r = log(measured / predicted)`` on
rows it never saw (:func:`opcast.train.fit.residual_quantiles`, split-conformal), separately for
shapes on devices it was fitted on (``seen_device``) and for left-out devices
(``unseen_device``). A kernel's interval at coverage ``c`` is ``t * exp(q_r((1 - c) / 2))`` to
``t * exp(q_r((1 + c) / 2))``.

An iteration sums many kernels. How their errors combine is an assumption, stated in every
result:

- ``group`` (default): errors are fully correlated within one predictor (one draw of ``r`` for
  every kernel it prices: its errors on similar shapes of one device share a sign) and
  independent between predictors;
- ``correlated``: one quantile for every predictor at once (comonotone), the widest.

The iteration time is taken as linear in each predictor's kernel time along the critical path,
``T = T0 + sum_g S_g (exp(r_g) - 1)``, where ``S_g`` are the seconds predictor ``g`` contributes
to the critical pipeline stage, scaled by that stage's share of the pipeline time (bubbles grow
with it; overlap of communication with compute is held fixed). Kernels priced by the roofline
and collectives priced analytically carry no residual data: they enter as point values, and
the result says which share of the iteration that is. Draws are Monte Carlo, seeded, so the same
query gives the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

IntervalMode = Literal["group", "correlated"]
INTERVAL_MODES: Final = ("group", "correlated")
DEFAULT_COVERAGE: Final = 0.9
_DRAWS: Final = 4096


@dataclass(frozen=True, slots=True)
class Residuals:
    """Held-out log-ratio quantiles of one predictor for one device class."""

    group: str
    device_class: str
    levels: np.ndarray
    log_ratio: np.ndarray

    def quantile(self, level: float | np.ndarray) -> np.ndarray:
        """The log-ratio quantile at ``level`` (linear between stored levels, flat beyond them)."""
        return np.interp(level, self.levels, self.log_ratio)

    def bounds(self, time_s: float, coverage: float = DEFAULT_COVERAGE) -> tuple[float, float]:
        """The central ``coverage`` interval of a kernel predicted at ``time_s``."""
        lo, hi = self.quantile(np.array([(1 - coverage) / 2, (1 + coverage) / 2]))
        return float(time_s * np.exp(lo)), float(time_s * np.exp(hi))


@dataclass(frozen=True, slots=True)
class Interval:
    """An iteration time's interval and what it rests on."""

    low_s: float
    high_s: float
    coverage: float
    mode: str
    learned_share: float
    """Share of the critical path priced by learned predictors with residual data (the rest is
    a point value: roofline kernels, analytical collectives, bubbles of those)."""
    device_classes: tuple[str, ...]
    """The device classes of the residuals used (``seen_device`` / ``unseen_device`` / ``seen_device only``)."""

    def assumption(self) -> str:
        how = (
            "errors fully correlated within each learned predictor, independent between predictors"
            if self.mode == "group"
            else "errors fully correlated across all learned predictors"
        )
        return (
            f"{self.coverage:.0%} interval from held-out residuals ({', '.join(self.device_classes) or 'none'}); "
            f"{how}; "
            f"{self.learned_share:.0%} of the critical path is learned, the rest enters as a point value"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "low_s": self.low_s,
            "high_s": self.high_s,
            "coverage": self.coverage,
            "mode": self.mode,
            "learned_share": self.learned_share,
            "device_classes": list(self.device_classes),
            "assumption": self.assumption(),
        }


def propagate(
    total_s: float,
    contributions: Mapping[str, float],
    residuals: Mapping[str, Residuals],
    *,
    coverage: float = DEFAULT_COVERAGE,
    mode: IntervalMode = "group",
    seed: int = 0,
) -> Interval:
    """The interval of ``total_s`` when predictor ``g`` contributes ``contributions[g]`` seconds of it
    (linearly) and its error follows ``residuals[g]``."""
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    keys = [g for g, s in contributions.items() if s > 0 and g in residuals]
    share = sum(contributions[g] for g in keys) / total_s if total_s > 0 else 0.0
    classes = tuple(sorted({residuals[g].device_class for g in keys}))
    if not keys:
        return Interval(total_s, total_s, coverage, mode, 0.0, ())
    rng = np.random.default_rng(seed)
    if mode == "correlated":
        u = np.broadcast_to(rng.random(_DRAWS)[:, None], (_DRAWS, len(keys)))
    else:
        u = rng.random((_DRAWS, len(keys)))
    s = np.array([contributions[g] for g in keys])
    r = np.column_stack([residuals[g].quantile(u[:, i]) for i, g in enumerate(keys)])
    draws = total_s + (np.expm1(r) * s).sum(axis=1)
    lo, hi = sample_quantiles(draws, ((1 - coverage) / 2, (1 + coverage) / 2))
    return Interval(float(lo), float(hi), coverage, mode, float(min(share, 1.0)), classes)


def sample_quantiles(values: np.ndarray, levels: tuple[float, ...]) -> tuple[float, ...]:
    """``np.quantile(values, levels)`` (its default ``linear`` method, the same arithmetic as numpy's
    ``_lerp``) without what ``np.quantile`` imports on first use (``numpy.ma``, ~13 ms of every
    ``predict`` process)."""
    v = np.sort(np.asarray(values, dtype=float))
    out = []
    for q in levels:
        pos = q * (len(v) - 1)
        i = int(math.floor(pos))
        j = min(i + 1, len(v) - 1)
        t = pos - i
        a, b = float(v[i]), float(v[j])
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)
    return tuple(out)
