"""GEMMs past the sizes a predictor was fitted on are priced at the largest fitted size and scaled in
proportion (LearnedKernelCost.wave_scaled), and a training device of another vendor is no bound on this
vendor's (HardwareRange.reference_specs): on the embedded default set, whose bf16 GEMMs were measured up to
m = 40962 and whose MI300X answers come from the group's `other` predictor."""

from __future__ import annotations

import math

import pytest

from opcast.hardware import get_device
from opcast.predict.cost import (
    WAVE_NOTE,
    WAVE_TILE,
    LearnedKernelCost,
    kernel,
    load_kernel_cost,
    peak_roofline_s,
    wave_factor,
)
from opcast.train.artifacts import load_model_set


@pytest.fixture(scope="module")
def learned() -> LearnedKernelCost:
    return LearnedKernelCost(load_model_set(None), "embedded default")


def _gemm(m: int, n: int = 7168, k: int = 8192):
    return kernel("gemm", {"b": 1, "m": m, "n": n, "k": k}, "bf16")


def test_the_fitted_limit_is_the_recorded_range(learned):
    entry = learned.range.meta["predictors"]["gemm-fwd-half"]["feature_ranges"]
    limits = learned.range.largest_fitted("gemm-fwd-half")
    assert limits["m"] == math.floor(math.exp(entry["log_m"][1]) + 1e-6)
    assert set(limits) <= {"b", "m", "n", "k"}


def test_a_gemm_past_the_fitted_m_is_the_largest_fitted_one_scaled_in_proportion(learned):
    limit = learned.range.largest_fitted("gemm-fwd-half")["m"]
    b200 = get_device("B200")
    at, twice, inside = learned.predict_s([_gemm(limit), _gemm(2 * limit), _gemm(limit // 2)], b200)
    rows = -(-limit // 128)  # tile rows of 128 (WAVE_TILE): the factor is theirs, 2x and 3x to within one row
    assert twice == pytest.approx(at * -(-2 * limit // 128) / rows, rel=1e-12)
    asked, factors = learned.wave_scaled([_gemm(3 * limit), _gemm(limit // 2)], b200)
    assert asked[0].param_dict["m"] == limit and factors[0] == pytest.approx(-(-3 * limit // 128) / rows)
    assert asked[1] == _gemm(limit // 2) and factors[1] == 1.0
    assert inside < at  # inside the range the model answers as fitted
    assert learned.wave_note() == WAVE_NOTE.format(n=2)


def test_a_batch_inside_one_wave_costs_no_more_than_one_product():
    """Hand-worked on 132 SMs and 128 x 128 tiles: 16 products of 32 x 512 (one tile row, four tile columns each) are
    64 tiles, half a wave, so asked at b = 1 they keep its time; 1,056 products of one tile each are 8 waves (8x);
    past the first wave a larger m is linear in it, and k always is; backward GEMMs and a call without a device
    keep the product of the sizes."""
    assert WAVE_TILE == (128, 128)
    small = {"b": 16, "m": 32, "n": 512, "k": 128}
    assert wave_factor(small, {"b": 1}, 132, True) == 1.0
    assert wave_factor({"b": 1056, "m": 128, "n": 128, "k": 64}, {"b": 1}, 132, True) == pytest.approx(8.0)
    big = {"b": 1, "m": 65536, "n": 7168, "k": 8192}
    assert wave_factor(big, {"m": 32768}, 132, True) == pytest.approx(2.0)
    assert wave_factor(big, {"m": 32768, "k": 4096}, 132, True) == pytest.approx(4.0)
    assert wave_factor({"b": 1, "m": 64, "n": 128, "k": 8192}, {"m": 32}, 132, True) == 1.0  # still under a wave
    # a decode's LM head (m = 1) past the fitted n: 1,002 tiles of one row, 7.6 waves, linear in n
    head = {"b": 1, "m": 1, "n": 128256, "k": 4096}
    assert wave_factor(head, {"n": 64128}, 132, True) == pytest.approx(1002 / 501)
    assert wave_factor(small, {"b": 1}, 132, False) == 16.0  # backward: in proportion
    assert wave_factor(small, {"b": 1}, None, True) == 16.0  # no device: in proportion


def test_a_batched_fp8_gemm_past_the_fitted_batch_is_priced_by_its_waves(learned):
    """The fp8 GEMM predictor was fitted on AIConfigurator's single products (b = 1): an MLA decode's absorbed
    projection (16 heads x 32 tokens x 512 x 128 on an H200) is one wave, so it costs what one product does, not 16x."""
    limit = learned.range.largest_fitted("gemm-fwd-fp8").get("b")
    if limit != 1:
        pytest.skip(f"the default set's fp8 GEMMs were fitted up to b = {limit}")
    h200 = get_device("H200")
    one, sixteen, many = (kernel("gemm", {"b": b, "m": 32, "n": 512, "k": 128}, "fp8") for b in (1, 16, 16 * 132))
    t_one, t_sixteen, t_many = learned.predict_s([one, sixteen, many], h200)
    assert t_sixteen == pytest.approx(t_one, rel=1e-12)
    assert t_many == pytest.approx(t_one * 16 * 132 * 4 / 132, rel=1e-12)  # 4 whole tiles a product: 64 waves


def test_off_with_the_physical_bounds_the_raw_answer_extrapolates(learned):
    raw = LearnedKernelCost(learned.model_set, "raw", wave_scaling=False)
    limit = raw.range.largest_fitted("gemm-fwd-half")["m"]
    asked, factors = raw.wave_scaled([_gemm(2 * limit)])
    assert asked == [_gemm(2 * limit)] and factors[0] == 1.0 and raw.wave_note() is None


def test_a_scaled_gemm_is_not_flagged_as_an_extrapolation(learned):
    b200 = get_device("B200")
    limit = learned.range.largest_fitted("gemm-fwd-half")["m"]
    assert _gemm(2 * limit) not in learned.out_of_range([_gemm(2 * limit)], b200)


def test_another_vendors_training_device_bounds_none_of_this_vendors():
    b200, mi300x = get_device("B200"), get_device("MI300X")
    cost = load_kernel_cost(None)
    source = next(s for s in cost.sources if isinstance(s, LearnedKernelCost))
    names = {s.name for s in source.range.reference_specs("gemm-fwd-half", b200)}
    every = {s.name for s in source.range.training_specs("gemm-fwd-half")}
    assert "MI300X" in every and "MI300X" not in names and "B200" in names
    assert {s.name for s in source.range.reference_specs("gemm-fwd-half", mi300x)} == every


def test_a_long_gemm_past_the_fitted_m_runs_near_the_rate_of_the_largest_fitted_one():
    """Through predict's path (bounds on): 65536 x 7168 x 8192 on B200 ran at 40 % of its peak (MI300X's
    extrapolated share, as a bound) where 32768 x 7168 x 8192 runs at 65 %."""
    cost = load_kernel_cost(None)
    b200 = get_device("B200")
    util = {}
    for m in (32768, 65536):
        k = _gemm(m)
        util[m] = peak_roofline_s(k, b200)[0] / cost.time_s(k, b200)[0]
    assert util[65536] >= 0.95 * util[32768]
