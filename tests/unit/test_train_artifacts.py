"""Model sets round-trip through disk, and a tampered, missing or incompatible one is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.train import artifacts
from opcast.train.artifacts import default_models_path, load_model_set, write_model_set
from opcast.train.fit import FitConfig, fit_frame

from helpers.synthetic import fake_devices, synthetic_dataset

FAST = {"n_estimators": 60}


@pytest.fixture(scope="module")
def fitted():
    devices = {d.name: d for d in fake_devices(3)}
    frame = synthetic_dataset(list(devices.values()), ops=("gemm", "layernorm"), rows_per_op=80, seed=2)
    cfg = FitConfig(estimator="xgb", folds=0, xgb_params=FAST)
    groups, _, _ = fit_frame(frame, devices, cfg)
    # one tile-mlp predictor too, so both file kinds round-trip
    mlp = FitConfig(estimator="tile-mlp", folds=0, tile_mlp_params={"epochs": 5, "hidden": (16,)})
    groups.update(fit_frame(frame[frame["op"] == "layernorm"], devices, mlp)[0])
    return frame, devices, groups


@pytest.fixture
def model_dir(tmp_path, fitted):
    _, _, groups = fitted
    return write_model_set(tmp_path, "toy", groups, {"datasets": []})


def _file_of(model_dir, estimator):
    meta = json.loads((model_dir / "meta.json").read_text())
    return next(e["file"] for e in meta["predictors"].values() if e["estimator"] == estimator)


def _expected(fitted, device):
    frame, devices, groups = fitted
    from opcast.train.fit import _predict_fitted

    sub = frame[frame["device"] == device].reset_index(drop=True)
    return sub, _predict_fitted(groups, sub, devices[device])


def test_round_trip_predicts_the_same(fitted, model_dir):
    _, devices, _ = fitted
    ms = load_model_set(model_dir.parent)  # the parent holds exactly one set: found
    assert ms.name == "toy" and ms.path == model_dir
    assert ms.covers("gemm", "bf16", "fwd") and ms.covers("layernorm", "fp16", "fwd")
    assert not ms.covers("gemm", "fp32", "fwd") and not ms.covers("softmax", "fp16", "fwd")
    sub, want = _expected(fitted, "fake-1")
    got = ms.predict_s(sub, devices["fake-1"])
    assert got.dtype == np.float64 and np.allclose(got, want, rtol=1e-5)
    meta = json.loads((model_dir / "meta.json").read_text())
    assert set(meta["files"]) == {p.name for p in model_dir.iterdir() if p.name != "meta.json"}
    assert meta["versions"]["xgboost"] and meta["features_version"] >= 1


def test_uncovered_rows_are_nan_and_mixed_kinds_are_batched(fitted, model_dir):
    _, devices, _ = fitted
    ms = load_model_set(model_dir)
    q = pd.DataFrame(
        [
            {
                "op": "gemm",
                "dtype": "fp16",
                "direction": "fwd",
                "tensor_cores": None,
                "b": 1,
                "m": 512,
                "n": 512,
                "k": 512,
            },
            {"op": "softmax", "dtype": "fp16", "direction": "fwd", "tensor_cores": None, "rows": 8, "cols": 512},
            {"op": "layernorm", "dtype": "bf16", "direction": "fwd", "tensor_cores": None, "rows": 8, "cols": 512},
        ],
        index=[10, 10, 3],
    )  # a repeated, unordered index must not matter
    got = ms.predict_s(q, devices["fake-0"])
    assert np.isfinite(got[0]) and np.isnan(got[1]) and np.isfinite(got[2]) and got[0] > 0


def test_a_tampered_artifact_is_refused(model_dir):
    target = model_dir / _file_of(model_dir, "xgb")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    target.write_bytes(bytes(data))
    with pytest.raises(OpcastError, match=r"does not match the sha256 .*re-fit"):
        load_model_set(model_dir)


def test_an_edited_meta_or_missing_file_is_refused(model_dir):
    meta = json.loads((model_dir / "meta.json").read_text())
    meta["rows"] = 1
    (model_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(OpcastError, match="modified after fitting"):
        load_model_set(model_dir)


def test_missing_file_dir_and_incompatible_versions(tmp_path, fitted, model_dir, monkeypatch):
    (model_dir / _file_of(model_dir, "tile-mlp")).unlink()
    with pytest.raises(OpcastError, match="is missing from the model set"):
        load_model_set(model_dir)
    with pytest.raises(OpcastError, match="does not exist"):
        load_model_set(tmp_path / "nope")
    _, _, groups = fitted
    fresh = write_model_set(tmp_path / "v", "toy", groups, {})
    fitted_version = artifacts.FEATURES_VERSION
    monkeypatch.setattr(artifacts, "FEATURES_VERSION", 999)
    with pytest.raises(OpcastError, match=f"feature definitions v{fitted_version}.*re-fit"):
        load_model_set(fresh)
    monkeypatch.undo()
    monkeypatch.setattr(artifacts, "library_versions", lambda: {"xgboost": "1.7.0", "torch": "2.0"})
    with pytest.raises(OpcastError, match=r"fitted with xgboost .* but 1.7.0 is installed"):
        load_model_set(fresh)


def test_xgboost_installed_as_its_cpu_only_wheel_counts_as_xgboost(model_dir, monkeypatch):
    # pip install xgboost-cpu installs the same import package under another distribution name:
    # the default set was silently priced by the roofline on such a machine (an H200 with xgboost-cpu).
    real = artifacts.metadata.version

    def version(dist: str) -> str:
        if dist == "xgboost":
            raise artifacts.metadata.PackageNotFoundError(dist)
        return "3.2.0" if dist == "xgboost-cpu" else real(dist)

    monkeypatch.setattr(artifacts.metadata, "version", version)
    assert artifacts.library_versions()["xgboost"] == "3.2.0"
    load_model_set(model_dir)
    monkeypatch.setattr(artifacts, "_DISTRIBUTIONS", {})
    assert artifacts.library_versions()["xgboost"] is None
    with pytest.raises(OpcastError, match=r"needs xgboost .* not installed"):
        load_model_set(model_dir)


def test_loading_and_small_predictions_import_neither_torch_nor_xgboost(model_dir):
    code = (
        "import sys, pandas as pd\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"  # tests/, for helpers
        "from opcast.train.artifacts import load_model_set\n"
        "from helpers.synthetic import fake_devices\n"
        f"ms = load_model_set({str(model_dir)!r})\n"
        "q = pd.DataFrame([{'op': 'gemm', 'dtype': 'bf16', 'direction': 'fwd', 'b': 1, 'm': 64, 'n': 64, 'k': 64},\n"
        "                  {'op': 'layernorm', 'dtype': 'bf16', 'direction': 'fwd', 'rows': 64, 'cols': 1024}])\n"
        "assert (ms.predict_s(q, fake_devices(3)[0]) > 0).all()\n"
        "print('torch' in sys.modules, 'xgboost' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_numpy_trees_match_xgboost_and_large_batches_use_xgboost(fitted, monkeypatch):
    import xgboost as xgb

    from opcast.train.estimators.xgb import XGBEstimator
    from opcast.train.features import features, matrix

    frame, devices, groups = fitted
    est = next(e for e, _ in groups.values() if e.name == "xgb")
    sub = frame[(frame["op"] == "gemm") & (frame["device"] == "fake-2")].reset_index(drop=True)
    feats = features(sub, devices["fake-2"])
    x = matrix(feats, est.feature_names)
    x[::3, 0] = np.nan  # missing values take the trees' default direction, as in xgboost
    ref = est.booster().predict(xgb.DMatrix(x, feature_names=list(est.feature_names)), output_margin=True)
    assert est.trees_ is not None and np.allclose(est.trees_.margin(x), ref, rtol=1e-5, atol=1e-5)
    calls = []
    monkeypatch.setattr(XGBEstimator, "numpy_max_cells_imported", 0)
    monkeypatch.setattr(type(est.trees_), "margin", lambda self, x: calls.append(len(x)) or np.zeros(len(x)))
    assert np.allclose(est.predict_s(feats), XGBEstimator.predict_s(est, feats)) and not calls  # xgboost's predictor


def test_model_sets_saved_before_the_numpy_archives_still_load(tmp_path, fitted, model_dir):
    """Sets written by opcast <= 0.1 hold tile-mlp as a torch state dict (format 1, no record):
    still read, tensors only. Their xgboost .joblib pickles are refused (test_model_set_safety)."""
    import hashlib

    import torch

    _, devices, _ = fitted
    meta = json.loads((model_dir / "meta.json").read_text())
    for entry in meta["predictors"].values():
        if entry["estimator"] != "tile-mlp":
            continue
        new = model_dir / entry["file"]
        blob = np.load(new)
        old = new.with_suffix(".pt")
        torch.save({k: torch.tensor(blob[k]) for k in blob.files if k != "opcast_record"}, old)
        new.unlink()
        del meta["files"][new.name]
        meta["files"][old.name] = hashlib.sha256(old.read_bytes()).hexdigest()
        entry["file"] = old.name
    meta["format_version"] = 1
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    (model_dir / "meta.json").write_text(json.dumps(meta))
    sub, want = _expected(fitted, "fake-0")
    assert np.allclose(load_model_set(model_dir).predict_s(sub, devices["fake-0"]), want, rtol=1e-5)


def test_default_models_path_is_models_default():
    assert default_models_path().name == "default" and default_models_path().parent.name == "models"


def test_the_embedded_default_loads_and_predicts_sanely():
    if not (default_models_path() / "meta.json").is_file():
        pytest.skip(
            f"no embedded default at {default_models_path()} (re-make it: bash benchmarks/train_default_models.sh)"
        )
    from opcast.hardware import get_device
    from opcast.train.features import features

    ms = load_model_set()
    assert ms.name == "default" and ms.covers("gemm", "bf16", "fwd") and ms.covers("gemm", "fp32", "fwd")
    assert ms.meta["datasets"] and all(d["sha256"] for d in ms.meta["datasets"])
    h100 = get_device("H100-SXM")
    q = pd.DataFrame(
        [
            {"op": "gemm", "dtype": "bf16", "direction": d, "b": 1, "m": 8192, "n": 8192, "k": 8192}
            for d in ("fwd", "bwd")
        ]
    )
    pred = ms.predict_s(q, h100)
    roof = features(q, h100)["t_roof_s"].to_numpy()
    assert np.all(pred > 0.9 * roof) and np.all(pred < 5 * roof), (pred, roof)  # near the roofline, never 5x off


def test_a_set_replaces_a_set_but_never_a_users_folder_or_file(tmp_path, fitted):
    _, _, groups = fitted
    first = write_model_set(tmp_path, "toy", groups, {"rows": 1})
    again = write_model_set(tmp_path, "toy", groups, {"rows": 2})  # a re-fit replaces the old set
    assert again == first and json.loads((again / "meta.json").read_text())["rows"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # no temporary or old folder left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    (tmp_path / "file").write_text("keep")
    for name, needle in (("mine", "folder that is not a model set"), ("file", "exists and is a file")):
        with pytest.raises(OpcastError, match=needle):
            write_model_set(tmp_path, name, groups, {})
    assert (mine / "notes.txt").read_text() == "keep" and (tmp_path / "file").read_text() == "keep"
    with pytest.raises(OpcastError, match="is a file"):
        write_model_set(tmp_path / "file", "toy", groups, {})
