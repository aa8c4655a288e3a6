"""The noise rules of calibrate on synthetic timings (no timing is taken here)."""

from __future__ import annotations

import math

import pytest

from opcast.check.calibrate_noise import (
    AnchorTiming,
    NoiseRules,
    anchor_reasons,
    assess,
    drift_reasons,
    interval_reason,
    load_reason,
    row_reasons,
    spread,
)


def _anchor(name: str, median_ms: float, spread_x: float = 1.02) -> AnchorTiming:
    m = median_ms * 1e-3
    return AnchorTiming(name=name, median_s=m, p20_s=m / math.sqrt(spread_x), p80_s=m * math.sqrt(spread_x))


QUIET = (_anchor("gemm", 5.0), _anchor("add", 2.0))


def test_spread_and_a_broken_timing_is_never_quiet():
    assert spread(1.0, 1.5) == pytest.approx(1.5)
    assert spread(0.0, 1.0) == math.inf and spread(1.0, math.nan) == math.inf


def test_quiet_machine_passes_every_rule():
    rows = [(1.0, 1.1)] * 100
    verdict = assess(load=(0.5, 2), anchors=QUIET, start_anchors=QUIET, rows=rows)
    assert not verdict.noisy and verdict.reasons == ()


@pytest.mark.parametrize(
    "load, busy", [((1.4, 2), False), ((1.6, 2), True), ((3.9, 2), True), ((3.9, 8), False), (None, False)]
)
def test_load_average_against_the_cores(load, busy):
    assert (load_reason(load) is not None) is busy


def test_a_wide_anchor_spread_is_noise():
    reasons = anchor_reasons((_anchor("gemm", 5.0, spread_x=2.3), _anchor("add", 2.0)))
    assert len(reasons) == 1 and "gemm" in reasons[0] and "2.30x" in reasons[0]


def test_anchor_drift_either_way():
    slower = (_anchor("gemm", 8.0), _anchor("add", 2.0))
    faster = (_anchor("gemm", 5.0), _anchor("add", 1.0))
    assert len(drift_reasons(QUIET, slower)) == 1 and "1.60x" in drift_reasons(QUIET, slower)[0]
    assert len(drift_reasons(QUIET, faster)) == 1 and "add" in drift_reasons(QUIET, faster)[0]
    assert drift_reasons(QUIET, (_anchor("gemm", 6.0),)) == []  # 1.2x: within 1.3x
    assert drift_reasons(QUIET, (_anchor("other", 50.0),)) == []  # an anchor not timed at the start


def test_rows_judged_by_the_share_of_wide_ones():
    quiet = [(1.0, 1.1)] * 80 + [(1.0, 2.0)] * 20  # 20 %: under the 25 % threshold
    busy = [(1.0, 1.1)] * 70 + [(1.0, 2.0)] * 30
    assert row_reasons(quiet) == []
    assert len(row_reasons(busy)) == 1 and "30 of 100" in row_reasons(busy)[0]
    assert row_reasons([(1.0, 3.0)] * 10) == []  # too few rows to judge a machine by


def test_every_reason_is_reported_together():
    verdict = assess(
        load=(4.0, 2), anchors=(_anchor("gemm", 9.0, spread_x=1.8),), start_anchors=QUIET, rows=[(1.0, 2.0)] * 40
    )
    assert verdict.noisy and len(verdict.reasons) == 4
    assert verdict.to_dict()["noisy"] is True and "load average 4.0" in verdict.message()


def test_interval_width_threshold():
    assert interval_reason("llama", 3.6, 203.0) is not None and "56.4x" in interval_reason("llama", 3.6, 203.0)
    assert interval_reason("gpt2", 1.039, 1.564) is None
    assert interval_reason("x", 0.0, 1.0) is not None  # a zero low bound is no interval
    assert interval_reason("x", 1.0, 7.9) is None and interval_reason("x", 1.0, 8.1) is not None
    assert interval_reason("x", 1.0, 3.0, NoiseRules(max_interval_ratio=2.0)) is not None


def test_anchor_round_trip():
    a = _anchor("gemm", 5.0)
    assert AnchorTiming.from_dict(a.to_dict()) == a
