"""benchmarks/unseen_gpus.py ``<est>+bounds`` (issues 19 and 21): a leave-one-GPU-out fold scored through
``opcast predict``'s own path (the fold's fit written as a model set, loaded, every test row asked through
``predict kernels``' converter) so the physical bounds apply; with the bounds off it answers exactly what the
raw estimator does, and ``(datasheet ratio)`` is the resource-ratio rule before the sustained shares were
recorded: a throttled training GPU caps a stronger unseen one at its share of the datasheet."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from opcast.predict.cost import peak_roofline_s, validated_kernel

from helpers import synthetic
from helpers.scripts import REPO, load_script

ug = load_script(REPO / "benchmarks" / "unseen_gpus.py", "unseen_gpus_benchmark_bounds")


@pytest.fixture(scope="module")
def fold():
    """Two training GPUs of one bandwidth, the first with half the second's peak and power-limited (every
    GEMM takes twice the law's time: it sustains half its datasheet peak), and a left-out third with twice
    the second's peak. Peaks are a thousandth of the catalog's, so most GEMMs run past the 3 ms a row needs
    to tell what a device sustains."""
    devs = [
        replace(d, **{f: getattr(d, f) / 1000 for f in ("peak_fp16_flops", "peak_bf16_flops", "peak_fp32_flops")})
        for d in synthetic.fake_devices(3)
    ]
    throttled, strong, big = devs
    train = synthetic.synthetic_dataset([throttled, strong], ops=("gemm",), rows_per_op=200, seed=5)
    train.loc[train["device"] == throttled.name, "time_s_median"] *= 2.0
    test = synthetic.synthetic_dataset([big], ops=("gemm",), rows_per_op=200, seed=5)
    devices = {d.name: d for d in devs}
    got = ug.bounds_fold(train, test, devices, "xgb")
    raw, _ = ug._fit_predict(train, test, devices, "xgb")
    kernels = [
        validated_kernel("gemm", {p: r[p] for p in ("b", "m", "n", "k")}, "fp16", "fwd", True)
        for r in test.to_dict("records")
    ]
    roof = np.array([peak_roofline_s(k, big)[0] for k in kernels])
    return {"got": got, "raw": raw, "roof": roof, "test": test}


def test_bounds_off_is_the_raw_estimator_through_predicts_path(fold):
    off = fold["got"]["xgb+bounds (bounds off)"].to_numpy()
    assert np.all(np.isfinite(off))
    np.testing.assert_allclose(off, fold["raw"], rtol=1e-9)


def test_bound_rows_are_named_and_held_to_the_roofline(fold):
    got, off = fold["got"], fold["got"]["xgb+bounds (bounds off)"].to_numpy()
    for col in ("xgb+bounds", "xgb+bounds (datasheet ratio)"):
        on, rule = got[col].to_numpy(), got[col + ug.BOUND_RULE].to_numpy(dtype=object)
        moved = ~np.isclose(on, off, rtol=1e-12, atol=0.0)
        assert moved.any()
        assert np.array_equal(moved, rule != "")  # a rule is named exactly where the time moved
        assert set(rule[moved]) <= {"roofline_floor", "utilisation_span", "resource_ratio", "monotone"}
        assert np.all(on >= fold["roof"] * (1 - 1e-12))


def test_the_datasheet_ratio_caps_a_stronger_gpu_at_the_throttled_share_and_the_landed_rule_does_not(fold):
    got, roof = fold["got"], fold["roof"]
    long = roof >= 3e-3  # compute-bound GEMMs past ramp-up on the left-out GPU
    assert long.sum() >= 15
    u_sheet = roof[long] / got["xgb+bounds (datasheet ratio)"].to_numpy()[long]
    u_landed = roof[long] / got["xgb+bounds"].to_numpy()[long]
    u_true = roof[long] / fold["test"]["time_s_median"].to_numpy()[long]
    assert np.median(u_true) > 0.9  # the left-out GPU runs them near its peak (the law)
    assert np.median(u_sheet) < 0.6  # capped near the throttled GPU's half of its datasheet
    assert np.median(u_landed) > 0.85  # credited with the share the training GPUs sustain
    rules = got["xgb+bounds (datasheet ratio)" + ug.BOUND_RULE].to_numpy(dtype=object)[long]
    assert np.mean(rules == "resource_ratio") > 0.5


def test_bound_moves_counts_each_rule_and_scores_the_rows_before_and_after():
    base = pd.DataFrame(
        {"label": ["gemm"] * 3, "device": ["X"] * 3, "time_s_median": [1.0, 1.0, 1.0], "row": [0, 1, 2]}
    )
    scored = pd.concat(
        [
            base.assign(estimator="e+bounds (bounds off)", pred=[1.5, 1.2, 1.0], rule=""),
            base.assign(estimator="e+bounds", pred=[1.1, 1.2, 1.0], rule=["resource_ratio", "", ""]),
            base.assign(estimator="e", pred=[1.5, 1.2, 1.0], rule=""),
        ],
        ignore_index=True,
    )
    moves = ug.bound_moves(scored)
    for gpu in ("X", "all"):  # the one left-out GPU, and all of them pooled
        assert moves.loc[("e+bounds", gpu, "gemm", "resource_ratio")].to_dict() == {
            "rows": 1,
            "of": 3,
            "MAPE off": 50.0,
            "MAPE on": 10.0,
        }
    assert len(moves) == 2
    assert ug.bound_moves(scored[scored["estimator"] == "e"]) is None


def test_protocols_split_neusights_rows():
    """``neusight`` trains on the train sweeps less every test shape; ``shipped`` on every row (what
    models/default holds), test files included; both score the test files."""
    df = pd.DataFrame(
        {
            "source_file": [
                "data/dataset/train/collect/bmm/p2.1.0/T4.csv",
                "data/dataset/train/collect/bmm/p2.1.0/T4.csv",
                "data/dataset/test/bmm/T4.csv",
                "data/dataset/test/bmm/V100.csv",
            ],
            "point_id": ["a", "b", "b", "c"],
        }
    )
    train, test = ug.split_rows(df, "neusight")
    assert list(train["point_id"]) == ["a"]  # b is a test shape (on any GPU)
    assert list(test["point_id"]) == ["b", "c"]
    train, test = ug.split_rows(df, "shipped")
    assert list(train["point_id"]) == ["a", "b", "b", "c"]
    assert list(test["point_id"]) == ["b", "c"]
    assert set(ug.PROTOCOLS) == {"neusight", "shipped"}
