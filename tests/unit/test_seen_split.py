"""auto may keep two estimators for one group (train.fit.SeenSplit): the one that transfers best to a
left-out GPU answers for GPUs the group was not fitted on, the one best on held-out shapes of the
training GPUs answers for those; the model set stores, hashes, checks and routes both."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from opcast.hardware import device_to_dict
from opcast.train import fit
from opcast.train.artifacts import SEEN_SUFFIX, load_model_set, write_model_set
from opcast.train.features import board_time_s
from opcast.train.fit import feature_frame

from helpers.model_sets import assert_part_checked
from helpers.synthetic import die_variants, fake_devices, synthetic_dataset


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    devs = fake_devices(3)
    training = {d.name: d for d in devs[:2]}
    frame = synthetic_dataset(devs[:2], ops=("gemm",), rows_per_op=120, seed=4)
    xgb, _, _ = fit.fit_frame(frame, training, fit.FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 30}))
    mlp, _, _ = fit.fit_frame(
        frame, training, fit.FitConfig(estimator="tile-mlp", folds=0, tile_mlp_params={"epochs": 5, "hidden": (16,)})
    )
    (seen_est, entry), (unseen_est, _) = xgb["gemm-fwd-half"], mlp["gemm-fwd-half"]
    both = fit.SeenSplit(unseen_est, seen_est, list(training))
    entry = {**entry, "seen": {"estimator": "xgb", "why": "test"}}
    path = write_model_set(
        tmp_path_factory.mktemp("m"),
        "split",
        {"gemm-fwd-half": (both, entry)},
        {"datasets": [], "device_specs": {n: device_to_dict(d) for n, d in training.items()}},
    )
    return {"frame": frame, "devices": devs, "seen": seen_est, "unseen": unseen_est, "both": both, "path": path}


def test_training_gpus_get_the_seen_estimator_and_others_the_unseen_one(split):
    ms = load_model_set(split["path"])
    entry = ms.predictors["gemm-fwd-half"]
    assert entry["estimator"] == "tile-mlp" and entry["seen"]["estimator"] == "xgb" and entry["seen"]["why"] == "test"
    assert entry["seen"]["file"] == "gemm-fwd-half" + SEEN_SUFFIX + ".npz"
    rows = split["frame"].head(40).reset_index(drop=True)
    for dev in split["devices"]:
        feats = feature_frame(rows.assign(device=dev.name), {dev.name: dev})
        want = (split["seen"] if dev.name in split["both"].devices else split["unseen"]).predict_s(feats)
        got = ms.predict_s(rows, dev)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert ms.answers_as_seen("gemm-fwd-half", dev) == (dev.name in split["both"].devices)
        np.testing.assert_allclose(
            fit._predict_fitted({"gemm-fwd-half": (split["both"], {})}, rows, dev), want, rtol=1e-6
        )
    # the two estimators really differ, so the routing is what the assertions above check
    feats = feature_frame(rows.assign(device=split["devices"][0].name), {split["devices"][0].name: split["devices"][0]})
    assert not np.allclose(split["seen"].predict_s(feats), split["unseen"].predict_s(feats))


def test_a_seen_file_swapped_or_missing_from_meta_is_refused(split, tmp_path):
    assert_part_checked(split["path"], tmp_path, "seen")


def _job(scored, estimator="auto"):
    job = fit._GroupFit.__new__(fit._GroupFit)
    job.key, job.kind, job.cfg = "gemm-fwd-half", "gemm", fit.FitConfig(estimator=estimator)
    job.candidates = list(scored) if estimator == "auto" else [estimator]
    job.folds = [("device a + 20% of shapes", None, None, None)]
    job.y = np.ones(10)
    job.feats = job.shapes = None
    job.chosen = job.why = job.chosen_seen = job.why_seen = ""
    job.scored, job.finals = {}, {}
    job.other = None  # one vendor's rows
    job.plan, job.preds = [], {}
    job._score = lambda name: scored.get(name)  # type: ignore[method-assign]  # the blend: as its parts' folds say
    return job


def _m(median):
    return {"median_ape": median, "mape": median}


def test_auto_fits_a_second_estimator_only_where_the_training_gpus_prefer_another():
    differ = _job(
        {"xgb": (_m(19.0), {}, _m(6.0)), "tile-mlp": (_m(16.0), {}, _m(9.0)), "hier": (_m(18.0), {}, _m(7.0))}
    )
    assert [t.what for t in differ.final_tasks()] == [("final", "tile-mlp"), ("final", "xgb")]
    assert differ.chosen == "tile-mlp" and differ.chosen_seen == "xgb"
    same = _job({"xgb": (_m(12.0), {}, _m(6.0)), "tile-mlp": (_m(16.0), {}, _m(9.0)), "hier": (_m(18.0), {}, _m(7.0))})
    assert [t.what for t in same.final_tasks()] == [("final", "xgb")]
    no_seen = _job({"xgb": (_m(19.0), {}, None), "tile-mlp": (_m(16.0), {}, None), "hier": (_m(18.0), {}, None)})
    assert [t.what for t in no_seen.final_tasks()] == [("final", "tile-mlp")]
    named = _job({"tile-mlp": (_m(16.0), {}, _m(9.0))}, estimator="tile-mlp")
    assert [t.what for t in named.final_tasks()] == [("final", "tile-mlp")]


def test_a_board_of_a_training_gpus_die_is_answered_as_that_gpu(split):
    ms = load_model_set(split["path"])
    bigger, other_die = die_variants(split["devices"][0], 1.2)
    assert ms.answers_as_seen("gemm-fwd-half", bigger)  # the same SMs, clocks, peaks and L2: that GPU's estimator
    assert not ms.answers_as_seen("gemm-fwd-half", other_die)
    rows = split["frame"].head(20).reset_index(drop=True)
    die = split["devices"][0]
    assert ms.die_twin("gemm-fwd-half", bigger) == die and ms.die_twin("gemm-fwd-half", other_die) is None
    feats = feature_frame(rows.assign(device=bigger.name), {bigger.name: bigger})
    on_die = feature_frame(rows.assign(device=die.name), {die.name: die})
    # the seen estimator, with its answer on the die's training board where the kernel is compute-bound
    want = board_time_s(split["seen"].predict_s(feats), split["seen"].predict_s(on_die), feats)
    np.testing.assert_allclose(ms.predict_s(rows, bigger), want, rtol=1e-6)
    # the benchmarks' in-memory path routes by the same rule once the split knows its devices' specs
    specs = {d.name: d for d in split["devices"][:2]}
    both = fit.SeenSplit(split["unseen"], split["seen"], split["both"].devices, specs)
    entry = {"devices": list(split["both"].devices)}
    for dev, blend_want in (
        (bigger, want),
        (
            other_die,
            split["unseen"].predict_s(feature_frame(rows.assign(device=other_die.name), {other_die.name: other_die})),
        ),
    ):
        got = fit._predict_fitted({"gemm-fwd-half": (both, entry)}, rows, dev, specs)
        np.testing.assert_allclose(got, blend_want, rtol=1e-6)
    # without the training devices' specs the in-memory path answers with the board's own features only
    np.testing.assert_allclose(
        fit._predict_fitted({"gemm-fwd-half": (both, entry)}, rows, bigger), split["seen"].predict_s(feats), rtol=1e-6
    )


def test_fit_frame_gives_a_split_its_training_devices_specs(monkeypatch):
    devs = fake_devices(2)
    frame = synthetic_dataset(devs, ops=("gemm",), rows_per_op=60, seed=5)
    real = fit._GroupFit.estimator

    def split_always(job):  # force the two-estimator outcome whatever the scores say
        est = real(job)
        return est if isinstance(est, fit.SeenSplit) else fit.SeenSplit(est, est, pd.unique(job.devices).tolist())

    monkeypatch.setattr(fit._GroupFit, "estimator", split_always)
    monkeypatch.setattr(  # no scores behind the forced split: a bare entry
        fit._GroupFit, "entry", lambda job, est, s: {"rows": len(job.y), "devices": [], "held_out": None, "why": ""}
    )
    fitted, _, _ = fit.fit_frame(
        frame, {d.name: d for d in devs}, fit.FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 5})
    )
    est = fitted["gemm-fwd-half"][0]
    assert isinstance(est, fit.SeenSplit) and est.specs == {d.name: d for d in devs}
