"""The hierarchical estimator (``hier``, issue 19) on hand-checkable cases: the level model's ridge,
device identification, levels recovered from fake GPUs whose sustained rate differs by a known
factor, a new GPU's level read off the spec line, and its file through a model set and the
console script."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.train import artifacts
from opcast.train.artifacts import write_model_set
from opcast.train.estimators.hier import HierEstimator, device_codes, ridge
from opcast.train.estimators.hier_predictor import HierPredictor
from opcast.train.features import features, model_inputs

FAST = {"n_estimators": 100, "n_jobs": 1}


def test_ridge_without_penalty_is_the_line_through_the_levels_and_a_large_penalty_the_mean():
    specs = np.array([[0.0], [2.0]])  # two devices, one spec feature: mean 1, std 1
    levels = np.array([0.1, 0.5])
    mean, scale, coef, intercept = ridge(specs, levels, 0.0)
    assert mean == pytest.approx([1.0]) and scale == pytest.approx([1.0])
    assert intercept == pytest.approx(0.3) and coef == pytest.approx([0.2])  # slope 0.2 per unit of spec
    assert intercept + ((np.array([4.0]) - mean) / scale) @ coef == pytest.approx(0.9)  # a third device on the line
    # alpha = 2: z = (-1, 1), coef = z.(l - 0.3) / (z.z + alpha) = 0.4 / 4
    assert ridge(specs, levels, 2.0)[2] == pytest.approx([0.1])
    assert ridge(specs, levels, 1e12)[2] == pytest.approx([0.0], abs=1e-9)
    # one device: no slope, its level; a feature constant over the devices gets no weight
    assert ridge(specs[:1], levels[:1], 0.0)[2:] == (pytest.approx([0.0]), pytest.approx(0.1))
    const = ridge(np.array([[3.0, 0.0], [3.0, 2.0]]), levels, 0.0)
    assert const[1][0] == 1.0 and const[2] == pytest.approx([0.0, 0.2])


def test_devices_are_the_distinct_spec_tuples_in_order_of_first_appearance():
    x = np.array([[5.0, 1.0, np.nan], [1.0, 1.0, np.nan], [5.0, 1.0, np.nan], [1.0, 2.0, np.nan]])
    codes, first = device_codes(x, np.array([0, 2]))
    assert codes.tolist() == [0, 1, 0, 1] and first.tolist() == [0, 1]
    codes, first = device_codes(x, np.array([0, 1]))
    assert codes.tolist() == [0, 1, 0, 2] and first.tolist() == [0, 1, 3]
    codes, first = device_codes(x, np.zeros(0, dtype=np.int64))  # a plain matrix: one device
    assert codes.tolist() == [0, 0, 0, 0] and first.tolist() == [0]


def _gpu(peak_scale: float):
    base = get_device("A100-SXM4-80GB")
    return replace(
        base,
        name=f"fake-x{peak_scale:g}",
        aliases=(),
        peak_bf16_flops=base.peak_bf16_flops * peak_scale,
        peak_fp16_flops=base.peak_fp16_flops * peak_scale,
    )


def _large_gemms(n: int = 80, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "op": "gemm",
            "dtype": "bf16",
            "direction": "fwd",
            "b": 1,
            "m": 2 ** rng.integers(11, 14, n),
            "n": 2 ** rng.integers(11, 14, n),
            "k": 2 ** rng.integers(11, 14, n),
        }
    )


def _fleet(level_of, scales, noise: float = 0.0, seed: int = 0):
    """Large GEMMs on fake GPUs that differ in tensor peak only, each running at
    ``exp(level_of(log2 peak_scale))`` times its roofline (the same factor on every shape)."""
    rng = np.random.default_rng(seed)
    rows = _large_gemms()
    feats = pd.concat([features(rows, _gpu(s)) for s in scales], ignore_index=True)
    level = np.repeat([level_of(np.log2(s)) for s in scales], len(rows))
    time_s = feats["t_roof_s"].to_numpy() * np.exp(level + rng.normal(0, noise, len(feats)))
    return feats, time_s, np.tile(np.arange(len(rows)).astype(str), len(scales))


def test_two_devices_whose_levels_differ_by_a_known_constant_are_recovered():
    feats, time_s, shapes = _fleet(lambda s: 0.2 + 0.5 * s, (1.0, 2.0), noise=0.01)
    est = HierEstimator(feature_names=model_inputs("gemm", "hier"), **FAST).fit(feats, time_s, groups=shapes)
    assert len(est.device_levels_) == 2
    # the levels carry the devices' difference (log 2 of peak apart -> 0.5 apart); their sum with f is the law
    assert est.device_levels_[1] - est.device_levels_[0] == pytest.approx(0.5, abs=0.03)
    assert np.median(np.abs(est.predict_s(feats) / time_s - 1)) < 0.02


def test_a_third_device_gets_its_level_from_the_spec_line():
    """Levels linear in log peak on three GPUs (x1, x2, x4); the fourth (x8) was never seen: with no
    ridge penalty and log peak as the only level feature, its level is read off the line."""
    law = lambda s: 0.1 + 0.3 * s  # noqa: E731
    feats, time_s, shapes = _fleet(law, (1.0, 2.0, 4.0))
    est = HierEstimator(
        feature_names=model_inputs("gemm", "hier"),
        level_features=("log_peak_flops",),
        level_alpha=0.0,
        **FAST,
    ).fit(feats, time_s, groups=shapes)
    new = features(_large_gemms(seed=11), _gpu(8.0))
    shape_log, level_log = est.parts_log(new)
    level_step = est.device_levels_[1] - est.device_levels_[0]
    assert level_step == pytest.approx(0.3, abs=0.01)
    assert level_log == pytest.approx(est.device_levels_[2] + level_step, abs=0.02)  # one more step up the line
    want = new["t_roof_s"].to_numpy() * np.exp(law(3.0))
    assert est.predict_s(new) == pytest.approx(want, rel=0.03)
    assert est.predict_s(new) == pytest.approx(new["t_roof_s"].to_numpy() * np.exp(shape_log + level_log))
    # the mean level alone (an infinite penalty) misses the new GPU by 0.6 in log, ~45 %
    mean_only = HierEstimator(feature_names=model_inputs("gemm", "hier"), level_alpha=1e12, **FAST)
    got = mean_only.fit(feats, time_s, groups=shapes).predict_s(new)
    assert np.median(got / want) == pytest.approx(np.exp(-0.6), rel=0.03)


def test_save_then_load_predicts_the_same_and_a_tampered_level_model_is_one_line(tmp_path):
    feats, time_s, shapes = _fleet(lambda s: 0.2 + 0.1 * s, (1.0, 2.0, 4.0), noise=0.02)
    names = model_inputs("gemm", "hier")
    est = HierEstimator(feature_names=names, **FAST).fit(feats, time_s, groups=shapes)
    path = est.save(tmp_path / "gemm-fwd-half")
    config = json.loads(json.dumps(est.config()))
    loaded = HierPredictor.load(path, feature_names=names, config=config)
    assert np.array_equal(loaded.predict_s(feats), est.predict_s(feats))
    assert np.array_equal(loaded.device_levels_, est.device_levels_)
    with np.load(path) as blob:
        arrays = {k: blob[k] for k in blob.files}
    for key, value in (("level_idx", np.array([len(names) + 3])), ("level_scale", -arrays["level_scale"])):
        with open(tmp_path / "bad.npz", "wb") as fh:
            np.savez(fh, **{**arrays, key: value})
        with pytest.raises(OpcastError, match="do not fit the") as err:
            HierPredictor.load(tmp_path / "bad.npz", feature_names=names, config=config)
        assert "\n" not in str(err.value)


def _kernel(models) -> subprocess.CompletedProcess:
    args = ["predict", "kernel", "--gpu", "H100-SXM", "--op", "gemm", "--dtype", "bf16"]
    args += [a for p in ("b=1", "m=4096", "n=4096", "k=4096") for a in ("--param", p)]
    return subprocess.run(
        [sys.executable, "-m", "opcast", *args, "--models", str(models)], capture_output=True, text=True, timeout=120
    )


def test_a_hier_model_set_predicts_through_the_console_script_and_a_corrupt_one_is_exit_2(tmp_path):
    feats, time_s, shapes = _fleet(lambda s: 0.2 + 0.1 * s, (1.0, 2.0, 4.0), noise=0.02)
    names = model_inputs("gemm", "hier")
    est = HierEstimator(feature_names=names, **FAST).fit(feats, time_s, groups=shapes)
    entry = {"op": "gemm", "rows": len(feats), "devices": ["fake-x1", "fake-x2", "fake-x4"], "features": list(names)}
    models = write_model_set(tmp_path / "models", "hier", {"gemm-fwd-half": (est, entry)}, {"datasets": []})
    done = _kernel(models)
    assert done.returncode == 0, done.stderr
    # tamper: a level model that reads a column past the inputs, re-hashed as anyone editing a set can
    meta = json.loads((models / "meta.json").read_text())
    path = models / meta["predictors"]["gemm-fwd-half"]["file"]
    with np.load(path) as blob:
        arrays = {k: blob[k] for k in blob.files}
    with open(path, "wb") as fh:
        np.savez(fh, **{**arrays, "level_idx": np.array([999])})
    meta["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    (models / "meta.json").write_text(json.dumps(meta))
    bad = _kernel(models)
    assert bad.returncode == 2, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error:") and "do not fit the" in lines[0], bad.stderr
