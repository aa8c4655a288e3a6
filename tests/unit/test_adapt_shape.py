"""opcast train adapt's shape term: a residual that depends on the kernel's shape is recovered from
200 measured rows and left alone with 5; it survives the file round trip and the predict path, and a
malformed shape term is refused in one line (exit 2 through the console script)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.schema import write_parquet
from opcast.train.adapt import SHAPE_MIN_ROWS, AdaptConfig, adapt_model_set, correction, fit_correction
from opcast.train.artifacts import _body_digest, load_adaptation, load_model_set, write_model_set
from opcast.train.features import group_key_array
from opcast.train.fit import FitConfig, fit_frame

from helpers.cli import gemm_query, refusal
from helpers.synthetic import aligned_gemms, fake_devices, synthetic_dataset

TARGET = "H100-SXM"
SLOW, FAST = 1.2, 0.9
"""Kernels with a small m (< 256) run 20 % slower than the set predicts, the others 10 % faster."""


def _factor(m: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(m, dtype=float) < 256, SLOW, FAST)


def _gemms(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: np.round(np.exp(rng.uniform(np.log(16), np.log(8192), n))) for name in ("b", "m", "n", "k")} | {
        "b": np.ones(n)
    }


def _learned_s(p: dict[str, np.ndarray]) -> np.ndarray:
    """A stand-in for a set's learned times: a roofline with a launch floor."""
    return 2.0 * p["m"] * p["n"] * p["k"] / 5e14 + 5e-6


def _mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / true - 1.0)) * 100.0)


def _fit(n: int, shape: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    p = _gemms(n, seed=1)
    pred = _learned_s(p)
    true = pred * _factor(p["m"]) * np.exp(np.random.default_rng(2).normal(0.0, 0.01, n))
    keys = np.full(n, "gemm-fwd-half", dtype=object)
    return fit_correction(keys, pred, true, AdaptConfig(shape=shape), params=p), p


def test_a_shape_dependent_residual_is_recovered_from_200_rows():
    fresh = _gemms(2000, seed=7)  # shapes never measured
    pred, true = _learned_s(fresh), _learned_s(fresh) * _factor(fresh["m"])
    keys = np.full(len(pred), "gemm-fwd-half", dtype=object)
    shaped, _ = _fit(200)
    plain, _ = _fit(200, shape=False)
    assert "shape" in shaped["groups"]["gemm-fwd-half"] and "shape" not in plain["groups"]["gemm-fwd-half"]
    with_shape = _mape(correction(shaped).apply(keys, pred, fresh), true)
    without = _mape(correction(plain).apply(keys, pred, fresh), true)
    assert without > 8.0  # the levels and size slope cannot follow m
    assert with_shape < 4.0 and with_shape < without / 2
    # without the parameters the shape term is left out: the levels and slopes alone
    assert np.allclose(correction(shaped).apply(keys, pred), correction(plain).apply(keys, pred), rtol=0.02)


def test_with_5_rows_it_stays_near_the_level():
    fields, _ = _fit(5)
    assert "shape" not in fields["groups"]["gemm-fwd-half"] and SHAPE_MIN_ROWS > 5
    fresh = _gemms(500, seed=7)
    keys = np.full(500, "gemm-fwd-half", dtype=object)
    factor = correction(fields).apply(keys, _learned_s(fresh), fresh) / _learned_s(fresh)
    level = np.exp(fields["log_factor"] + fields["groups"]["gemm-fwd-half"]["log_factor"])
    assert np.all(np.abs(factor / level - 1) < 0.15)  # near one level, nowhere the 1.2 / 0.9 split
    assert 0.85 < level < 1.25


# --------------------------------------------------------------------------- through a model set


@pytest.fixture(scope="module")
def shaped_set(tmp_path_factory):
    """A small set fitted on three fake GPUs (gemm), and 300 gemm rows of a GPU it never saw whose
    measured times are the set's own predictions x :func:`_factor` of their m (1 % noise)."""
    devices = {d.name: d for d in fake_devices(3)}
    frame = synthetic_dataset(list(devices.values()), ops=("gemm",), rows_per_op=60, seed=4)
    groups, _, _ = fit_frame(frame, devices, FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 40}))
    root = write_model_set(tmp_path_factory.mktemp("sets"), "toy", groups, {"datasets": []})
    target = get_device(TARGET)
    rows = aligned_gemms(synthetic_dataset([target], ops=("gemm",), rows_per_op=300, seed=9)).reset_index(drop=True)
    base = load_model_set(root).predict_s(rows, target)
    noise = np.exp(np.random.default_rng(1).normal(0.0, 0.01, len(rows)))
    rows["time_s_median"] = base * _factor(rows["m"]) * noise
    return root, rows, base


@pytest.fixture(scope="module")
def adapted(tmp_path_factory, shaped_set):
    """The set adapted from the first 200 rows (written once; tests that edit it copy it)."""
    root, rows, _ = shaped_set
    tmp = tmp_path_factory.mktemp("adapted")
    return adapt_model_set([_dataset(tmp, rows, 200)], TARGET, models=root, out=tmp / "copy")


def _dataset(tmp_path: Path, rows, n: int) -> Path:
    out = tmp_path / f"measured{n}"
    out.mkdir()
    write_parquet(rows.iloc[:n].reset_index(drop=True), out / "rows.parquet")
    return out


def test_the_shape_term_round_trips_and_the_predict_path_applies_it(shaped_set, adapted):
    from opcast.predict.cost import kernel, load_kernel_cost

    root, rows, base = shaped_set
    result, copy = adapted, adapted.set_path
    body = json.loads(result.path.read_text())
    assert body["format_version"] == 2 and "shape" in body["groups"]["gemm-fwd-half"]
    loaded = load_adaptation(load_model_set(copy), TARGET)
    assert loaded is not None and loaded.needs_params
    keys = group_key_array(rows)
    held = rows.iloc[200:]  # rows the correction never saw
    again = loaded.apply(keys[200:], base[200:], held)
    assert np.allclose(again, correction(result.fields).apply(keys[200:], base[200:], held))
    assert _mape(again, held["time_s_median"].to_numpy()) < 6.0
    assert _mape(loaded.apply(keys[200:], base[200:]), held["time_s_median"].to_numpy()) > 8.0  # the level alone
    plain, adapted = load_kernel_cost(root), load_kernel_cost(copy)
    target = get_device(TARGET)
    for m, want in ((64, SLOW), (4096, FAST)):
        k = kernel("gemm", {"b": 1, "m": m, "n": 2048, "k": 2048}, "fp16")
        ratio = adapted.time_s(k, target)[0] / plain.time_s(k, target)[0]
        assert abs(ratio / want - 1) < 0.06, (m, ratio)


def test_few_rows_write_the_old_format(tmp_path, shaped_set):
    root, rows, _ = shaped_set
    result = adapt_model_set([_dataset(tmp_path, rows, 10)], TARGET, models=root, out=tmp_path / "copy")
    body = json.loads(result.path.read_text())
    assert body["format_version"] == 1 and not any("shape" in g for g in body["groups"].values())


def _tampered(tmp_path: Path, adapted, edit) -> Path:
    copy = Path(shutil.copytree(adapted.set_path, tmp_path / "copy"))
    path = copy / adapted.path.relative_to(adapted.set_path)
    body = json.loads(path.read_text())
    edit(body["groups"]["gemm-fwd-half"]["shape"])
    body["sha256"] = _body_digest(body)  # re-hashed: the field checks must catch it
    path.write_text(json.dumps(body))
    return copy


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda s: s.update(features=["m", "rows"]), "features must be"),
        (lambda s: s.update(length=0), "length must be"),
        (lambda s: s["anchors"].append([1.0]), "same non-zero length"),
        (lambda s: s["anchors"][0].append(1.0), "anchors must be lists"),
        (lambda s: s["weights"].__setitem__(0, 1e9), "weights must be"),
        (lambda s: s.update(extra=1), "exactly features"),
    ],
)
def test_a_malformed_shape_term_is_refused_in_one_line(tmp_path, adapted, edit, needle):
    copy = _tampered(tmp_path, adapted, edit)
    with pytest.raises(OpcastError, match=needle) as err:
        load_adaptation(load_model_set(copy), TARGET)
    assert "\n" not in str(err.value) and "re-run opcast train adapt" in str(err.value)


def test_the_console_script_refuses_a_malformed_shape_term_with_exit_2(tmp_path, adapted):
    copy = _tampered(tmp_path, adapted, lambda s: s["weights"].__setitem__(0, "x"))
    assert "shape" in refusal(gemm_query(TARGET, copy))
