"""The fit's speed-ups change no result: fits in worker processes give the model set of one process."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.train import fit as fit_module
from opcast.train.features import group_keys
from opcast.train.fit import FitConfig, feature_frame, fit_frame, fit_group

from helpers.synthetic import fake_devices, synthetic_dataset

FAST = {"xgb_params": {"n_estimators": 60}, "tile_mlp_params": {"epochs": 15, "patience": 5, "hidden": (16, 16)}}


@pytest.fixture(scope="module")
def synthetic():
    devices = {d.name: d for d in fake_devices(3)}
    frame = synthetic_dataset(list(devices.values()), ops=("gemm", "layernorm"), rows_per_op=60, seed=3)
    return frame, devices


def _entries(fitted):
    return {k: {n: v for n, v in e.items() if n != "fit_seconds"} for k, (_, e) in fitted.items()}


def test_worker_processes_and_one_process_fit_the_same_model_set(synthetic, monkeypatch):
    frame, devices = synthetic
    monkeypatch.setattr(fit_module, "PARALLEL_MIN_ROWS", 0)  # the synthetic frame is small: use the pool anyway
    pooled, pooled_summary, pooled_skipped = fit_frame(frame, devices, FitConfig(n_jobs=2, **FAST))
    serial, serial_summary, serial_skipped = fit_frame(frame, devices, FitConfig(n_jobs=1, **FAST))
    assert list(pooled) == list(serial) == ["gemm-fwd-half", "layernorm-fwd-half"]
    assert _entries(pooled) == _entries(serial) and pooled_skipped == serial_skipped
    assert pooled_summary.equals(serial_summary)
    feats = feature_frame(frame, devices)
    keys = group_keys(frame).to_numpy()
    for key in pooled:
        rows = keys == key
        # all three candidates were scored on every left-out device, and the same estimator predicts the same
        assert set(pooled[key][1]["candidates"]) == {"xgb", "tile-mlp", "hier", "blend"}
        assert len(pooled[key][1]["held_out_split"]) == 3
        np.testing.assert_array_equal(pooled[key][0].predict_s(feats[rows]), serial[key][0].predict_s(feats[rows]))


def test_fit_group_is_the_entry_fit_frame_writes(synthetic):
    frame, devices = synthetic
    cfg = FitConfig(n_jobs=1, **FAST)
    layernorm = frame[frame["op"] == "layernorm"]
    est, entry = fit_group("layernorm-fwd-half", layernorm, feature_frame(layernorm, devices), cfg)
    fitted, _, _ = fit_frame(layernorm, devices, cfg)
    assert _entries({"g": (est, entry)})["g"] == _entries(fitted)["layernorm-fwd-half"]


def test_every_candidate_is_scored_on_the_same_seeded_rows():
    devices = np.repeat(np.array(["a", "b", "c"], dtype=object), 400)
    shapes = np.tile(np.arange(400), 3)
    cfg = FitConfig(fold_max_rows=300, folds=2, all_devices_fold_rows=0)
    folds = fit_module._folds(devices, shapes, cfg)
    plan = fit_module._fold_plan(folds, cfg)
    again = fit_module._fold_plan(folds, cfg)
    assert len(plan) == 2
    for (_, train, test, seen), (t, te, s), (t2, _, s2) in zip(folds, plan, again):
        assert t.sum() == 300 and not (t & ~train).any()  # a subsample of the fold's training rows
        assert s.sum() == 75 and not (s & ~seen).any()  # a quarter as many seen-device rows
        assert (te == test).all() and (t == t2).all() and (s == s2).all()
        assert not (t & te).any()


def test_adding_a_device_keeps_the_left_out_devices_it_does_not_displace():
    """Large groups leave out cfg.folds devices chosen by a seeded hash of each name: a new device in the
    data takes a fold only where its own hash ranks among the first, and the others keep theirs."""
    names = [f"gpu{i}" for i in range(12)]
    cfg = FitConfig(folds=4, all_devices_fold_rows=0)

    def left_out(devs):
        devices = np.repeat(np.array(devs, dtype=object), 50)
        shapes = np.tile(np.arange(50), len(devs))
        return [label.split(" + ")[0].removeprefix("device ") for label, *_ in fit_module._folds(devices, shapes, cfg)]

    before = left_out(names)
    assert len(before) == 4 and len(set(before)) == 4
    displaced = 0
    for newcomer in [f"new{i}" for i in range(12)]:
        after = left_out([*names, newcomer])
        if newcomer in after:  # it ranks among the first four and pushes out the fourth only
            displaced += 1
            assert [d for d in after if d != newcomer] == before[:3]
        else:
            assert after == before
    assert 0 < displaced < 12  # both cases were exercised


def test_small_groups_leave_every_device_out_by_their_fitted_rows():
    """A group leaves each device out in turn while its rows x devices (what those folds fit) is within
    the bound; one row more and it draws cfg.folds devices."""
    devices = np.repeat(np.array([f"gpu{i}" for i in range(6)], dtype=object), 100)
    shapes = np.tile(np.arange(100), 6)
    every = fit_module._folds(devices, shapes, FitConfig(folds=4, all_devices_fold_rows=600 * 6))
    drawn = fit_module._folds(devices, shapes, FitConfig(folds=4, all_devices_fold_rows=600 * 6 - 1))
    assert len(every) == 6 and len(drawn) == 4
    assert {label for label, *_ in drawn} < {label for label, *_ in every}


def test_default_bound_draws_folds_for_a_fused_moe_sized_group():
    """By default a group of the fused-MoE groups' size (700 rows on each of 8 GPUs) draws cfg.folds devices:
    its tile-MLP folds cost ~10 s each whatever their rows, so leaving all 8 out cost twice as much;
    a group of 5 GPUs x 500 rows still leaves every device out."""
    cfg = FitConfig()
    assert cfg.folds == 4

    def n_folds(n_devices, rows_each):
        devices = np.repeat(np.array([f"gpu{i}" for i in range(n_devices)], dtype=object), rows_each)
        return len(fit_module._folds(devices, np.tile(np.arange(rows_each), n_devices), cfg))

    assert n_folds(8, 700) == 4
    assert n_folds(5, 500) == 5
