"""Prediction intervals: conformal residuals recorded at fit time cover held-out rows, and their
propagation to an iteration follows the stated assumption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.predict.cost import KernelCostModel, LearnedKernelCost, RooflineKernelCost, load_kernel_cost
from opcast.predict.intervals import Residuals, propagate
from opcast.predict.parallel import TrainConfig
from opcast.predict.report import train_to_dict
from opcast.predict.training import predict_train
from opcast.train.artifacts import load_model_set, write_model_set
from opcast.train.fit import INTERVAL_LEVELS, FitConfig, fit_frame, residual_quantiles

from helpers.synthetic import fake_devices, synthetic_dataset

NOISE = 0.05


@pytest.fixture(scope="module")
def model_set(tmp_path_factory):
    devices = {d.name: d for d in fake_devices(5)}
    train = [devices[f"fake-{i}"] for i in range(4)]  # fake-4 is never seen
    frame = synthetic_dataset(train, ops=("gemm", "layernorm"), rows_per_op=250, noise=NOISE, seed=3)
    groups, _, _ = fit_frame(frame, devices, FitConfig(estimator="xgb", xgb_params={"n_estimators": 120}))
    path = write_model_set(tmp_path_factory.mktemp("iv"), "iv", groups, {})
    return load_model_set(path), devices


def _normal_residuals(group: str, sigma: float) -> Residuals:
    from statistics import NormalDist

    q = [NormalDist(0.0, sigma).inv_cdf(lv) for lv in INTERVAL_LEVELS]
    return Residuals(group, "seen_device", np.array(INTERVAL_LEVELS), np.array(q))


def test_residual_quantiles_are_conservative_order_statistics():
    rng = np.random.default_rng(0)
    true = np.exp(rng.normal(0, 0.1, 2000))
    got = residual_quantiles(np.ones(2000), true)
    r = np.log(true)
    assert got["n"] == 2000 and got["levels"] == list(INTERVAL_LEVELS)
    lo, hi = got["log_ratio"][2], got["log_ratio"][-3]  # 5 % and 95 %
    assert np.mean(r < lo) <= 0.05 and np.mean(r > hi) <= 0.05
    assert lo == pytest.approx(-0.1645, abs=0.02) and hi == pytest.approx(0.1645, abs=0.02)
    assert residual_quantiles(np.ones(5), np.ones(5)) is None  # too few rows to say anything


def test_one_group_interval_is_the_kernel_interval_scaled():
    res = _normal_residuals("gemm-fwd-half", 0.1)
    iv = propagate(10.0, {"gemm-fwd-half": 6.0}, {"gemm-fwd-half": res}, coverage=0.9)
    lo, hi = 4.0 + 6.0 * np.exp(-0.1645), 4.0 + 6.0 * np.exp(0.1645)
    assert iv.low_s == pytest.approx(lo, rel=0.01) and iv.high_s == pytest.approx(hi, rel=0.01)
    assert iv.learned_share == pytest.approx(0.6) and "independent between predictors" in iv.assumption()
    assert res.bounds(2.0, 0.9) == pytest.approx((2 * np.exp(-0.1645), 2 * np.exp(0.1645)), rel=1e-3)


def test_independent_groups_give_a_narrower_interval_than_correlated_ones():
    groups = [f"g{i}" for i in range(6)]
    res = {g: _normal_residuals(g, 0.2) for g in groups}
    contrib = {g: 1.0 for g in groups}
    ind = propagate(6.0, contrib, res, mode="group")
    cor = propagate(6.0, contrib, res, mode="correlated")
    assert cor.high_s - cor.low_s > 1.8 * (ind.high_s - ind.low_s)  # ~sqrt(6) for small sigma
    assert ind.low_s < 6.0 < ind.high_s
    assert propagate(6.0, contrib, res) == ind  # seeded: the same query, the same interval
    none = propagate(6.0, {"other": 1.0}, res)
    assert none.low_s == none.high_s == 6.0 and none.learned_share == 0.0


@pytest.mark.parametrize("device", ["fake-1", "fake-4"])
def test_kernel_intervals_cover_held_out_rows(model_set, device):
    """90 % intervals cover about 90 % of fresh shapes on a seen device and on one never seen."""
    ms, devices = model_set
    fresh = synthetic_dataset([devices[device]], ops=("gemm", "layernorm"), rows_per_op=200, noise=NOISE, seed=11)
    pred = ms.predict_s(fresh, devices[device])
    inside, widths = [], []
    for op in ("gemm", "layernorm"):
        cls, levels, q = ms.residuals(f"{op}-fwd-half", device)
        assert cls == ("seen_device" if device == "fake-1" else "unseen_device")
        res = Residuals(f"{op}-fwd-half", cls, levels, q)
        rows = (fresh["op"] == op).to_numpy()
        bounds = np.array([res.bounds(p, 0.9) for p in pred[rows]])
        true = fresh["time_s_median"].to_numpy()[rows]
        inside.append((bounds[:, 0] <= true) & (true <= bounds[:, 1]))
        widths.append(bounds[:, 1] / bounds[:, 0])
    coverage = np.concatenate(inside).mean()
    assert 0.8 <= coverage <= 0.995, coverage
    assert np.median(np.concatenate(widths)) < 1.6  # informative, not a blanket


def test_predict_train_carries_the_interval(model_set):
    ms, devices = model_set
    kernels = KernelCostModel(
        sources=(LearnedKernelCost(ms, "synthetic"), RooflineKernelCost()), models_label="synthetic"
    )
    arch = load_arch("gpt3-125m")
    cfg = TrainConfig(micro_batch=4, global_batch=8, seq=1024, precision="fp16")
    r = predict_train(arch, devices["fake-4"], cfg, kernels=kernels)
    lo, hi = r.iteration_time_interval_s
    assert lo < r.iteration_time_s < hi and hi / lo < 2
    assert 0 < r.interval.learned_share < 1  # gemm and layernorm are learned, the rest roofline
    doc = json.loads(json.dumps(train_to_dict(r, kernels), default=str))
    assert doc["iteration_time_interval_s"] == [lo, hi] and doc["interval"]["device_classes"] == ["unseen_device"]
    wider = predict_train(arch, devices["fake-4"], cfg, kernels=kernels, coverage=0.99)
    assert wider.iteration_time_interval_s[0] < lo and wider.iteration_time_interval_s[1] > hi
    plain = predict_train(arch, devices["fake-4"], cfg, kernels=load_kernel_cost(use_learned=False))
    assert plain.interval is None and train_to_dict(plain)["iteration_time_interval_s"] is None


def test_sample_quantiles_is_numpys_linear_quantile_exactly():
    from opcast.predict.intervals import sample_quantiles

    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 17, 4096):
        x = rng.lognormal(size=n) * 50
        for levels in ((0.05, 0.95), (0.025, 0.975), (0.5, 0.5), (0.0, 1.0)):
            assert sample_quantiles(x, levels) == tuple(np.quantile(x, levels))
