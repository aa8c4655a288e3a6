"""A group that mixes vendors (train.fit.vendor_rows): its own predictors are fitted on the rows of the vendor
with the most devices, and an ``other`` predictor fitted on every row answers for the other vendors' devices; the
model set stores, hashes, checks and routes all of them, as the in-memory fit routes them."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.hardware import device_to_dict
from opcast.train import artifacts, fit
from opcast.train.artifacts import OTHER_SUFFIX, load_model_set, write_model_set
from opcast.train.fit import feature_frame, vendor_rows

from helpers.model_sets import assert_part_checked
from helpers.synthetic import fake_devices, synthetic_dataset


def test_vendor_rows_keeps_the_vendor_with_the_most_devices():
    devices = np.array(["a", "a", "b", "c", "d"], dtype=object)
    mask, vendors = vendor_rows(devices, {"a": "nvidia", "b": "nvidia", "c": "amd", "d": "intel"})
    assert vendors == ("nvidia",) and mask.tolist() == [True, True, True, False, False]
    assert vendor_rows(devices, {"a": "nvidia", "b": "nvidia", "c": "nvidia", "d": "nvidia"}) is None  # one vendor
    assert vendor_rows(devices, {"a": "nvidia", "b": "nvidia", "c": "amd", "d": "amd"}) is None  # a tie
    assert vendor_rows(devices[[0, 2, 3]], {"a": "nvidia", "b": "amd", "c": "intel"}) is None  # one device each
    assert vendor_rows(devices, {"a": "nvidia", "b": "nvidia", "c": "amd"}) is None  # a device of unknown vendor


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    devs = fake_devices(5)
    amd = replace(devs[3], name="fake-amd", vendor="amd")
    unseen_amd = replace(devs[4], name="fake-amd-2", vendor="amd")
    training = {d.name: d for d in (*devs[:3], amd)}
    frame = synthetic_dataset(list(training.values()), ops=("gemm",), rows_per_op=120, seed=5)
    # the other vendor's library: twice as slow, so a predictor that learned its rows is told apart
    frame.loc[frame["device"] == amd.name, "time_s_median"] *= 2.0
    cfg = fit.FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 30})
    fitted, _, _ = fit.fit_frame(frame, training, cfg)
    est, entry = fitted["gemm-fwd-half"]
    path = write_model_set(
        tmp_path_factory.mktemp("m"),
        "mixed",
        {"gemm-fwd-half": (est, entry)},
        {"datasets": [], "device_specs": {n: device_to_dict(d) for n, d in training.items()}},
    )
    return {"frame": frame, "est": est, "entry": entry, "path": path, "amd": amd, "unseen_amd": unseen_amd} | {
        "devs": devs
    }


def test_the_main_vendor_fit_leaves_the_other_vendors_rows_out(mixed):
    est, entry = mixed["est"], mixed["entry"]
    assert isinstance(est, fit.SeenSplit) and est.vendors == ("nvidia",) and est.other is not None
    assert est.seen is est.unseen  # one estimator chosen: one fit answers the main vendor's GPUs, seen or not
    assert entry["vendors"] == ["nvidia"] and entry["other"]["estimator"] == "xgb"
    frame = mixed["frame"]
    # the group is fitted and scored on NVIDIA's rows; the other part on every row
    assert entry["rows"] == int((frame["device"] != mixed["amd"].name).sum()) < entry["other"]["rows"] == len(frame)
    # the routing and the physical bounds know every device; the main vendor's are listed apart
    assert mixed["amd"].name in entry["devices"] and mixed["amd"].name not in entry["vendor_devices"]


def test_the_written_set_routes_each_vendor_as_the_fit_does(mixed):
    ms = load_model_set(mixed["path"])
    entry = ms.predictors["gemm-fwd-half"]
    assert entry["other"]["file"] == "gemm-fwd-half" + OTHER_SUFFIX + ".npz" and "seen" not in entry
    rows = mixed["frame"].head(40).reset_index(drop=True)
    nvidia_unseen = mixed["devs"][4]
    for dev, part in (
        (mixed["devs"][0], "unseen"),  # a training GPU of the main vendor
        (nvidia_unseen, "unseen"),  # a GPU of the main vendor it never saw
        (mixed["amd"], "other"),  # a training GPU of another vendor
        (mixed["unseen_amd"], "other"),  # another vendor's GPU it never saw
    ):
        feats = feature_frame(rows.assign(device=dev.name), {dev.name: dev})
        want = getattr(mixed["est"], part).predict_s(feats)
        np.testing.assert_allclose(ms.predict_s(rows, dev), want, rtol=1e-6)
        in_memory = fit._predict_fitted({"gemm-fwd-half": (mixed["est"], {})}, rows, dev)
        np.testing.assert_allclose(in_memory, want, rtol=1e-6)
        assert ms.other_vendor("gemm-fwd-half", dev) == (part == "other")
    # the other vendor's slower rows are in the every-row fit only: on the AMD GPU it answers slower
    amd = mixed["amd"]
    feats = feature_frame(rows.assign(device=amd.name), {amd.name: amd})
    assert np.median(mixed["est"].other.predict_s(feats) / mixed["est"].unseen.predict_s(feats)) > 1.5


def test_an_other_part_swapped_or_without_its_vendors_is_refused(mixed, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(mixed["path"], bad)
    meta = json.loads((bad / "meta.json").read_text())
    entry = meta["predictors"]["gemm-fwd-half"]

    def write() -> None:
        meta["meta_sha256"] = artifacts._meta_digest(meta)  # a consistent meta.json: the checks below refuse it
        (bad / "meta.json").write_text(json.dumps(meta))

    del entry["vendors"]
    write()
    with pytest.raises(OpcastError, match=r"other needs the vendors"):
        load_model_set(bad)
    assert_part_checked(mixed["path"], tmp_path, "other")
