"""Timing statistics and the CPU timer."""

from __future__ import annotations

import time

import pytest

from opcast.collect.timing import TimingBudget, measure_cpu, summarise


def test_summarise_quantiles_by_hand():
    s = summarise([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], "perf_counter")
    assert s.time_s_median == 6.0
    assert s.time_s_p20 == pytest.approx(3.0) and s.time_s_p80 == pytest.approx(9.0)
    assert s.n_reps == 11 and s.method == "perf_counter"
    g = summarise([10.0, 20.0, 30.0], "cuda_graph", calls_per_sample=10)
    assert g.time_s_median == 2.0 and g.n_reps == 30


def test_measure_cpu_respects_budget_and_measures_real_time():
    budget = TimingBudget(warmup_s=0.0, rep_s=0.02, min_reps=3, max_reps=50)
    stats = measure_cpu(lambda: time.sleep(0.002), budget)
    assert stats.time_s_median >= 0.002
    assert 3 <= stats.n_reps <= 50
    assert stats.time_s_p20 <= stats.time_s_median <= stats.time_s_p80


def test_cpu_calls_of_50us_and_more_start_cold_shorter_ones_warm():
    import time as _time

    from opcast.collect.timing import TimingBudget, measure_cpu

    budget = TimingBudget(warmup_s=0.0, rep_s=0.002, min_reps=3, max_reps=5)
    slow = measure_cpu(lambda: _time.sleep(1e-4), budget, flush_bytes=256 << 20)  # ~30+ ms to write
    fast = measure_cpu(lambda: None, budget, flush_bytes=1 << 20)
    plain = measure_cpu(lambda: _time.sleep(1e-4), budget)
    assert slow.method == "perf_counter+flush" and fast.method == "perf_counter" and plain.method == "perf_counter"
    assert 1e-4 <= slow.time_s_median < 0.01  # the flush stays outside the timed region
