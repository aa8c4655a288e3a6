"""opcast train adapt's analogue term: a device whose kernels follow a training GPU's shape behaviour
is mapped onto that GPU's answers from 200 measured rows, left alone with few rows or unrelated
answers; the term survives the file round trip and the predict path, and a malformed one is refused
in one line (exit 2 through the console script)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.hardware import device_to_dict, get_device
from opcast.schema import write_parquet
from opcast.train.adapt import ANALOGUE_MIN_ROWS, AdaptConfig, adapt_model_set, correction, fit_correction
from opcast.train.artifacts import _body_digest, load_adaptation, load_model_set, write_model_set
from opcast.train.fit import FitConfig, fit_frame

from helpers.cli import gemm_query, refusal
from helpers.synthetic import aligned_gemms, fake_devices, synthetic_dataset

TARGET = "H100-SXM"
KEY = "gemm-fwd-half"


def _gemms(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = {name: np.round(np.exp(rng.uniform(np.log(16), np.log(8192), n))) for name in ("m", "n", "k")}
    return {"b": np.ones(n), **p}


def _own_s(p: dict[str, np.ndarray]) -> np.ndarray:
    """A stand-in for the set's answer on the device: a roofline with a launch floor."""
    return 2.0 * p["m"] * p["n"] * p["k"] / 5e14 + 5e-6


def _twin_s(p: dict[str, np.ndarray]) -> np.ndarray:
    """The set's answer as a training GPU whose tiles the device shares: a shape pattern finer than
    a smoother over 200 rows can follow (it flips within one e-fold of m and n)."""
    return _own_s(p) * (1.0 + 0.3 * np.sin(3.0 * np.log(p["m"])) * np.cos(2.0 * np.log(p["n"])))


def _other_s(p: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """An unrelated training GPU's answer: the device's own times with 30 % noise of its own."""
    return _own_s(p) * np.exp(np.random.default_rng(seed).normal(0.0, 0.3, len(p["m"])))


def _mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / true - 1.0)) * 100.0)


def _measured(p: dict[str, np.ndarray], seed: int) -> np.ndarray:
    return 1.1 * _twin_s(p) * np.exp(np.random.default_rng(seed).normal(0.0, 0.01, len(p["m"])))


def _fit(n: int, cfg: AdaptConfig | None = None) -> dict:
    p = _gemms(n, seed=1)
    keys = np.full(n, KEY, dtype=object)
    answers = {"twin": _twin_s(p), "other": _other_s(p, 3)}
    return fit_correction(keys, _own_s(p), _measured(p, 2), cfg or AdaptConfig(), params=p, analogue_s=answers)


def test_a_twin_s_shape_behaviour_is_taken_from_200_rows():
    fresh = _gemms(2000, seed=7)  # shapes never measured
    keys = np.full(2000, KEY, dtype=object)
    true, own = 1.1 * _twin_s(fresh), _own_s(fresh)
    answers = {"twin": _twin_s(fresh), "other": _other_s(fresh, 8)}
    fields = _fit(200)
    term = fields["groups"][KEY]["analogue"]
    assert term["devices"] == ["other", "twin"]
    b_own, b_other, b_twin = term["coef"][1:]
    b_own, b_other, b_twin = term["coef"][1:]
    assert b_twin > 0.9 and abs(b_other) < 0.05 and abs(b_own) < 0.1  # the twin, not the noise
    with_term = _mape(correction(fields).apply(keys, own, fresh, answers), true)
    without = _mape(correction(_fit(200, AdaptConfig(analogues=False))).apply(keys, own, fresh, answers), true)
    assert without > 8.0  # levels, slopes and a smoother cannot follow the twin's tiles
    assert with_term < 3.0


def test_few_rows_or_unrelated_answers_leave_the_correction_as_it_was():
    assert "analogue" not in _fit(ANALOGUE_MIN_ROWS - 1)["groups"][KEY]
    p = _gemms(200, seed=1)
    keys = np.full(200, KEY, dtype=object)
    true = 1.2 * _own_s(p) * np.exp(np.random.default_rng(2).normal(0.0, 0.01, 200))
    fields = fit_correction(keys, _own_s(p), true, AdaptConfig(), params=p, analogue_s={"other": _other_s(p, 3)})
    fresh = _gemms(1000, seed=7)
    got = correction(fields).apply(
        np.full(1000, KEY, dtype=object), _own_s(fresh), fresh, {"other": _other_s(fresh, 8)}
    )
    assert _mape(got, 1.2 * _own_s(fresh)) < 2.0


def test_applying_a_term_without_the_answers_it_reads_is_refused():
    fields = _fit(200)
    p = _gemms(5, seed=7)
    with pytest.raises(OpcastError, match="reads the set's answers on other, twin"):
        correction(fields).apply(np.full(5, KEY, dtype=object), _own_s(p), p)


# --------------------------------------------------------------------------- through a model set


@pytest.fixture(scope="module")
def twin_set(tmp_path_factory):
    """A small set fitted on three fake GPUs (gemm), and 300 gemm rows of a GPU it never saw whose
    measured times are 1.15 x the set's answers for the same kernels as the first fake GPU."""
    devices = {d.name: d for d in fake_devices(3)}
    frame = synthetic_dataset(list(devices.values()), ops=("gemm",), rows_per_op=60, seed=4)
    groups, _, _ = fit_frame(frame, devices, FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 40}))
    specs = {name: device_to_dict(spec) for name, spec in devices.items()}  # as train fit records them
    root = write_model_set(tmp_path_factory.mktemp("sets"), "toy", groups, {"datasets": [], "device_specs": specs})
    twin = sorted(devices)[0]
    rows = aligned_gemms(synthetic_dataset([get_device(TARGET)], ops=("gemm",), rows_per_op=300, seed=9)).reset_index(
        drop=True
    )
    rows["time_s_median"] = 1.15 * load_model_set(root).predict_s(rows, devices[twin])
    measured = tmp_path_factory.mktemp("measured")
    write_parquet(rows, measured / "rows.parquet")
    result = adapt_model_set([measured], TARGET, models=root, out=measured.parent / "copy")
    return root, twin, devices, result


def test_the_term_round_trips_and_the_predict_path_applies_it(twin_set):
    from opcast.predict.cost import kernel, load_kernel_cost

    root, twin, devices, result = twin_set
    body = json.loads(result.path.read_text())
    assert body["format_version"] == 3
    term = body["groups"][KEY]["analogue"]
    assert twin in term["devices"] and TARGET not in term["devices"]
    loaded = load_adaptation(load_model_set(result.set_path), TARGET)
    assert loaded is not None and loaded.analogue_devices == tuple(term["devices"])
    plain, adapted = load_kernel_cost(root), load_kernel_cost(result.set_path)
    for m in (64, 1024, 4096):
        k = kernel("gemm", {"b": 1, "m": m, "n": 2048, "k": 2048}, "fp16")
        want = 1.15 * plain.time_s(k, devices[twin])[0]
        got = adapted.time_s(k, get_device(TARGET))[0]
        assert abs(got / want - 1) < 0.05, (m, got, want)


def _tampered(tmp_path: Path, result, edit) -> Path:
    copy = Path(shutil.copytree(result.set_path, tmp_path / "copy"))
    path = copy / result.path.relative_to(result.set_path)
    body = json.loads(path.read_text())
    edit(body["groups"][KEY]["analogue"])
    body["sha256"] = _body_digest(body)  # re-hashed: the field checks must catch it
    path.write_text(json.dumps(body))
    return copy


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda t: t["coef"].append(0.0), "coef must be"),
        (lambda t: t["coef"].__setitem__(0, float("nan")), "coef must be"),
        (lambda t: t.update(devices=[]), "devices must be"),
        (lambda t: t.update(ridge=0), "ridge must be"),
        (lambda t: t.update(extra=1), "exactly devices"),
    ],
)
def test_a_malformed_term_is_refused_in_one_line(tmp_path, twin_set, edit, needle):
    copy = _tampered(tmp_path, twin_set[3], edit)
    with pytest.raises(OpcastError, match=needle) as err:
        load_adaptation(load_model_set(copy), TARGET)
    assert "\n" not in str(err.value) and "re-run opcast train adapt" in str(err.value)


def test_the_console_script_refuses_a_term_on_a_device_the_set_never_saw_with_exit_2(tmp_path, twin_set):
    def rename(term: dict) -> None:
        term["devices"] = ["NoSuchGPU" if d == term["devices"][0] else d for d in term["devices"]]

    copy = _tampered(tmp_path, twin_set[3], rename)
    assert "NoSuchGPU" in refusal(gemm_query(TARGET, copy))
