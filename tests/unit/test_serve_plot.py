"""The load panels of ``predict serve --plot`` summed over many replicas: the time-weighted mean per bin of
steps that start, end and straddle bins anywhere, against a brute-force integral (no matplotlib needed)."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.predict.serve.report import _integral


def test_binned_step_integral_matches_brute_force():
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 10, 300))
    end = start + rng.exponential(0.2, 300)  # many steps straddle bins, some overlap (other replicas)
    value = rng.integers(1, 50, 300).astype(float)
    edges = np.linspace(0, 11, 23)
    got = _integral(edges, start, end, value)
    want = [np.sum(value * np.clip(t - start, 0, end - start)) for t in edges]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert got[-1] == pytest.approx(np.sum(value * (end - start)))  # the last edge is past every step


def test_one_step_spread_over_the_bins_it_covers():
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    per_bin = np.diff(_integral(edges, np.array([0.5]), np.array([2.25]), np.array([4.0])))
    assert per_bin == pytest.approx([2.0, 4.0, 1.0])  # value x time in each bin
