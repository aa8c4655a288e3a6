"""Pipeline schedules: the (p-1)/(v m) bubble of Narayanan et al. 2021 and the replayed timeline."""

from __future__ import annotations

import itertools

import pytest

from opcast.predict.schedule import bubble_fraction, pipeline_time, simulate


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16), (4, 3)])
def test_1f1b_bubble_is_p_minus_1_over_m(p, m):
    t = 1.5
    pipe = pipeline_time([t] * p, m)
    assert pipe.bubble_s / pipe.steady_s == pytest.approx((p - 1) / m)
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 16, 4)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    pipe = pipeline_time([1.0] * p, m, v)
    assert pipe.bubble_s / pipe.steady_s == pytest.approx((p - 1) / (v * m))


def test_the_slowest_stage_sets_the_pace():
    pipe = pipeline_time([1.0, 2.0, 1.0, 1.5], 10)
    assert pipe.critical_stage == 1
    assert pipe.time_s == pytest.approx(10 * 2.0 + (1.0 + 1.0 + 1.5))  # (m - 1) t_max + sum of all stages


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (4, 4), (8, 12)])
def test_replayed_1f1b_matches_the_formula_for_equal_stages(p, m):
    tf, tb = 1.0, 2.0
    tasks = simulate([tf] * p, [tb] * p, m)
    assert max(t.end_s for t in tasks) == pytest.approx(pipeline_time([tf + tb] * p, m).time_s)
    for s in range(p):
        mine = [t for t in tasks if t.stage == s]
        assert sorted(t.micro_batch for t in mine if t.kind == "F") == list(range(m))
        assert sorted(t.micro_batch for t in mine if t.kind == "B") == list(range(m))
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in itertools.pairwise(mine))  # one task at a time


def test_replayed_interleaved_schedule_matches_the_formula_and_beats_1f1b():
    p, m, v = 4, 8, 2
    tasks = simulate([1.0] * p, [2.0] * p, m, v)
    assert len(tasks) == 2 * p * m * v
    interleaved = max(t.end_s for t in tasks)
    plain = max(t.end_s for t in simulate([1.0] * p, [2.0] * p, m))
    assert m * 3.0 < interleaved < plain
    assert interleaved == pytest.approx(pipeline_time([3.0] * p, m, v).time_s, rel=1e-9)


def test_p2p_delays_the_timeline():
    a = max(t.end_s for t in simulate([1.0] * 4, [2.0] * 4, 8))
    b = max(t.end_s for t in simulate([1.0] * 4, [2.0] * 4, 8, p2p_s=0.1))
    assert b > a
