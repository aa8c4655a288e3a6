"""The blend (train.estimators.blend.Blend): the geometric mean of xgb's and the tile-MLP's answers for the GPUs a
group was not fitted on. auto scores it from its parts' fold predictions and may choose it; ``--estimator blend``
asks for it; the written set stores its parts as the entry's own file and a ``blend`` part, routes the training GPUs
to one estimator and the others to the mean, and refuses a blend part that is swapped or incomplete."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.hardware import device_to_dict
from opcast.train import artifacts, fit
from opcast.train.artifacts import BLEND_SUFFIX, SEEN_SUFFIX, load_model_set
from opcast.train.estimators.blend import Blend
from opcast.train.fit import feature_frame

from helpers.model_sets import assert_part_checked
from helpers.synthetic import fake_devices, synthetic_dataset

FAST = {"xgb_params": {"n_estimators": 30}, "tile_mlp_params": {"epochs": 5, "hidden": (16,)}}


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    devs = fake_devices(3)
    training = {d.name: d for d in devs[:2]}
    frame = synthetic_dataset(devs[:2], ops=("gemm",), rows_per_op=120, seed=4)
    cfg = fit.FitConfig(estimator="blend", folds=0, **FAST)
    fitted, summary, _ = fit.fit_frame(frame, training, cfg)
    est, entry = fitted["gemm-fwd-half"]
    path = artifacts.write_model_set(
        tmp_path_factory.mktemp("m"),
        "blended",
        fitted,
        {"datasets": [], "device_specs": {n: device_to_dict(d) for n, d in training.items()}},
    )
    return {"frame": frame, "devices": devs, "est": est, "entry": entry, "path": path, "summary": summary}


def _feats(rows, dev):
    return feature_frame(rows.assign(device=dev.name), {dev.name: dev})


def test_the_blend_answers_unseen_gpus_with_the_geometric_mean_and_training_gpus_with_xgb(blended):
    est = blended["est"]
    assert isinstance(est, fit.SeenSplit) and isinstance(est.unseen, Blend)
    xgb, mlp = est.unseen.primary, est.unseen.blend
    assert (xgb.name, mlp.name) == ("xgb", "tile-mlp") and est.seen is xgb
    assert "blend of xgb and tile-mlp (xgb on its GPUs)" in blended["summary"].to_string()
    ms = load_model_set(blended["path"])
    entry = ms.predictors["gemm-fwd-half"]
    assert entry["estimator"] == "xgb" and entry["blend"]["estimator"] == "tile-mlp"
    assert entry["blend"]["file"] == "gemm-fwd-half" + BLEND_SUFFIX + ".npz" and "seen" not in entry
    assert not (blended["path"] / ("gemm-fwd-half" + SEEN_SUFFIX + ".npz")).exists()  # xgb is written once
    rows = blended["frame"].head(40).reset_index(drop=True)
    for dev in blended["devices"]:
        feats = _feats(rows, dev)
        trained = dev.name in est.devices
        want = xgb.predict_s(feats) if trained else np.sqrt(xgb.predict_s(feats) * mlp.predict_s(feats))
        np.testing.assert_allclose(ms.predict_s(rows, dev), want, rtol=1e-6)
        np.testing.assert_allclose(fit._predict_fitted({"gemm-fwd-half": (est, {})}, rows, dev), want, rtol=1e-6)
        assert ms.answers_as_seen("gemm-fwd-half", dev) == trained
    # the parts really differ, so the mean is what the assertions above check
    feats = _feats(rows, blended["devices"][2])
    assert not np.allclose(xgb.predict_s(feats), mlp.predict_s(feats), rtol=0.02)


def test_a_blend_part_swapped_or_incomplete_is_refused(blended, tmp_path):
    assert_part_checked(blended["path"], tmp_path, "blend")


def _m(median):
    return {"median_ape": median, "mape": median}


def _job(fold_preds, seen_scores):
    """A group's held-out scoring with given fold predictions (one fold of four test rows) and seen scores."""
    job = fit._GroupFit.__new__(fit._GroupFit)
    job.key, job.kind, job.cfg = "gemm-fwd-half", "gemm", fit.FitConfig(estimator="auto")
    job.candidates = list(fit.AUTO_ESTIMATORS)
    test = np.array([True, True, True, True, False, False])
    seen = np.array([False, False, False, False, True, True])
    job.folds = [("device a + 20% of shapes", None, test, seen)]
    job.plan = [(None, test, seen)]
    job.y = np.ones(6)
    job.feats = job.shapes = None
    job.devices = np.array(["a"] * 4 + ["b"] * 2, dtype=object)
    job.chosen = job.why = job.chosen_seen = job.why_seen = ""
    job.scored, job.finals, job.other = {}, {}, None
    job.preds = {(name, 0): np.asarray(p, dtype=float) for name, p in fold_preds.items()}
    real = job._score
    job._score = lambda name: (  # type: ignore[method-assign]
        (real(name)[0], {}, _m(seen_scores[name])) if name in seen_scores else real(name)
    )
    return job


def test_auto_scores_the_blend_from_its_parts_folds_and_fits_both_where_it_wins():
    # xgb 30 % slow and the tile-MLP 30 % fast on the left-out device: alone 30 % off, blended ~0 %
    wins = _job(
        {"xgb": [1.3] * 4 + [1.0] * 2, "tile-mlp": [1 / 1.3] * 4 + [1.1] * 2, "hier": [1.25] * 6},
        {"xgb": 1.0, "tile-mlp": 10.0, "hier": 5.0},
    )
    tasks = wins.final_tasks()
    np.testing.assert_allclose(wins.preds[("blend", 0)][:4], 1.0)
    assert wins.chosen == "blend" and wins.scored["blend"][0]["median_ape"] < 1e-6
    assert wins.chosen_seen == "xgb"  # the training GPUs keep one estimator, never the blend
    assert [t.what for t in tasks] == [("final", "xgb"), ("final", "tile-mlp")]
    # where the training GPUs prefer hier it is fitted too, and answers for them
    hier_seen = _job(
        {"xgb": [1.3] * 4 + [1.0] * 2, "tile-mlp": [1 / 1.3] * 4 + [1.1] * 2, "hier": [1.25] * 6},
        {"xgb": 3.0, "tile-mlp": 10.0, "hier": 1.0},
    )
    assert [t.what for t in hier_seen.final_tasks()] == [("final", "xgb"), ("final", "tile-mlp"), ("final", "hier")]
    # both parts off the same way: the blend is no better than xgb, which ties keep
    loses = _job(
        {"xgb": [1.3] * 4 + [1.0] * 2, "tile-mlp": [1.3] * 4 + [1.1] * 2, "hier": [1.5] * 6},
        {"xgb": 1.0, "tile-mlp": 10.0, "hier": 5.0},
    )
    assert [t.what for t in loses.final_tasks()] == [("final", "xgb")] and loses.chosen == "xgb"


def test_the_blend_is_not_applicable_where_a_part_is_not():
    job = _job({"xgb": [1.3] * 6, "hier": [1.2] * 6}, {"xgb": 1.0, "hier": 2.0})
    job.preds[("tile-mlp", 0)] = None  # the tile-MLP does not apply (a collective)
    job.final_tasks()
    assert job.scored["blend"] is None and job.chosen == "hier"


def test_the_blend_estimator_is_named_in_the_cli_error():
    with pytest.raises(OpcastError, match="use xgb, tile-mlp, neusight, hier, blend or auto"):
        fit.FitConfig(estimator="blnd")  # type: ignore[arg-type]
