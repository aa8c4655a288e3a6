"""Loading a model set never runs code from it, and a corrupt, swapped or wrongly typed one is
refused in one line (issue 15, item 2 and the model-set part of item 3).

Every hostile set here is *re-hashed* after the edit (files and ``meta_sha256``), as anyone who
edits a set can do: the hashes catch accidents, these checks must hold without them.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.train import artifacts
from opcast.train.artifacts import load_model_set, write_model_set
from opcast.train.estimators.tile_mlp import TileMLPEstimator
from opcast.train.features import model_inputs
from opcast.train.fit import FitConfig, fit_frame

from helpers.synthetic import fake_devices, synthetic_dataset


class Payload:
    """Unpickling this creates ``target``: proof that code from the file ran."""

    def __init__(self, target: pathlib.Path) -> None:
        self.target = pathlib.Path(target)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.target,))


@pytest.fixture(scope="module")
def fitted():
    """Two small xgb predictors with the same features (gemm fwd and bwd) and a tile-MLP with
    random weights (no torch needed: only its file format matters here)."""
    devices = {d.name: d for d in fake_devices(2)}
    fwd = synthetic_dataset(list(devices.values()), ops=("gemm",), rows_per_op=40, seed=5)
    bwd = fwd.assign(direction="bwd", time_s_median=2.0 * fwd["time_s_median"])
    xgb = FitConfig(estimator="xgb", folds=0, xgb_params={"n_estimators": 20})
    groups, _, _ = fit_frame(pd.concat([fwd, bwd], ignore_index=True), devices, xgb)
    names = model_inputs("layernorm", "tile-mlp")
    rng = np.random.default_rng(0)
    mlp = TileMLPEstimator(feature_names=names, hidden=(8,))
    mlp.mean_, mlp.std_ = np.zeros(len(names)), np.ones(len(names))
    mlp.weights_ = [
        (rng.normal(size=(8, len(names))), rng.normal(size=8)),
        (rng.normal(size=(3, 8)), rng.normal(size=3)),
    ]
    groups["layernorm-fwd-half"] = (
        mlp,
        {"op": "layernorm", "rows": 1, "devices": sorted(devices), "features": list(names)},
    )
    assert set(groups) == {"gemm-fwd-half", "gemm-bwd-half", "layernorm-fwd-half"}
    return devices, groups


@pytest.fixture
def model_dir(tmp_path, fitted):
    return write_model_set(tmp_path / "models", "toy", fitted[1], {"datasets": []})


def _meta(model_dir: pathlib.Path) -> dict:
    return json.loads((model_dir / "meta.json").read_text())


def _rehash(model_dir: pathlib.Path, meta: dict) -> None:
    """Recompute every file's sha256 and meta_sha256, as anyone editing a set can."""
    if isinstance(meta.get("files"), dict):
        meta["files"] = {
            name: hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
            if (model_dir / name).is_file()
            else digest
            for name, digest in meta["files"].items()
        }
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    (model_dir / "meta.json").write_text(json.dumps(meta))


def _replace_file(model_dir: pathlib.Path, key: str, data: bytes, suffix: str | None = None) -> pathlib.Path:
    """Put ``data`` in the place of predictor ``key``'s file (renamed to ``suffix``), re-hashed."""
    meta = _meta(model_dir)
    entry = meta["predictors"][key]
    old = model_dir / entry["file"]
    new = old.with_suffix(suffix) if suffix else old
    old.unlink()
    new.write_bytes(data)
    del meta["files"][old.name]
    meta["files"][new.name] = ""
    entry["file"] = new.name
    _rehash(model_dir, meta)
    return new


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # allow_pickle is True when saving: object arrays are pickled into the file
    return buf.getvalue()


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg, msg
    return msg


def _predict_all(ms, devices) -> None:
    """Load every predictor of ``ms`` (they are loaded on first use)."""
    for key in ms.predictors:
        ms.estimator(key)


# --------------------------------------------------------------------------- no code runs


def test_the_payload_is_live(tmp_path):
    """The control: unpickling the payload does create its file, so the tests below can fail."""
    target = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(target)))
    assert target.exists()


def test_a_joblib_predictor_is_refused_unread(tmp_path, model_dir):
    import joblib  # installed with scikit-learn

    target = tmp_path / "pwned-joblib"
    buf = io.BytesIO()
    joblib.dump({"format": "xgboost-ubj", "model": Payload(target)}, buf)
    _replace_file(model_dir, "gemm-fwd-half", buf.getvalue(), ".joblib")
    with pytest.raises(OpcastError) as err:
        load_model_set(model_dir)
    assert "pickled predictor" in _one_line(err) and "re-fit" in str(err.value)
    assert not target.exists()
    from opcast.train.estimators.xgb import XGBEstimator  # the estimator itself refuses one too

    with pytest.raises(OpcastError, match="never loaded"):
        XGBEstimator.load(model_dir / "gemm-fwd-half.joblib", feature_names=("a",), config={})
    assert not target.exists()


@pytest.mark.parametrize("member", ["ubj", "opcast_record", "extra"])
def test_an_object_array_in_an_npz_is_refused_unpickled(tmp_path, model_dir, fitted, member):
    target = tmp_path / f"pwned-{member}"
    path = model_dir / "gemm-fwd-half.npz"
    with np.load(path) as blob:
        arrays = {k: blob[k] for k in blob.files}
    arrays[member] = np.array([Payload(target)], dtype=object)
    _replace_file(model_dir, "gemm-fwd-half", _npz(**arrays))
    with pytest.raises(OpcastError) as err:
        _predict_all(load_model_set(model_dir), fitted[0])
    assert "pickle" in _one_line(err) and "gemm-fwd-half.npz" in str(err.value)
    assert not target.exists()


def test_a_pickle_in_a_torch_state_dict_is_refused_unpickled(tmp_path, model_dir):
    import torch

    target = tmp_path / "pwned-pt"
    buf = io.BytesIO()
    torch.save({"mean": torch.zeros(3), "evil": Payload(target)}, buf)
    _replace_file(model_dir, "layernorm-fwd-half", buf.getvalue(), ".pt")
    ms = load_model_set(model_dir)  # a .pt is read when first used (that needs torch)
    with pytest.raises(OpcastError) as err:
        ms.estimator("layernorm-fwd-half")
    assert "not a readable torch state dict" in _one_line(err)
    assert not target.exists()


def test_a_pickled_set_through_the_console_script_is_exit_2_and_runs_nothing(tmp_path, model_dir):
    """The real command line: `opcast predict kernel --models DIR` on a set whose gemm predictor is
    an npz smuggling a pickle, and on one holding a .joblib."""
    target = tmp_path / "pwned-cli"
    with np.load(model_dir / "gemm-fwd-half.npz") as blob:
        arrays = {k: blob[k] for k in blob.files}
    arrays["ubj"] = np.array([Payload(target)], dtype=object)
    _replace_file(model_dir, "gemm-fwd-half", _npz(**arrays))
    other = shutil.copytree(model_dir, tmp_path / "other" / "toy")
    buf = io.BytesIO()
    pickle.dump(Payload(target), buf)
    _replace_file(other, "gemm-bwd-half", buf.getvalue(), ".joblib")
    for models, needle in ((model_dir, "object arrays"), (other, "pickled predictor")):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "opcast",
                "predict",
                "kernel",
                "--gpu",
                "A100-SXM4-80GB",
                "--op",
                "gemm",
                "--param",
                "b=1",
                "--param",
                "m=512",
                "--param",
                "n=512",
                "--param",
                "k=512",
                "--models",
                str(models),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        err = out.stderr.strip()
        assert out.returncode == 2, (out.returncode, err)
        assert err.startswith("opcast: error:") and needle in err and err.count("\n") == 0, err
        assert "Traceback" not in out.stderr + out.stdout
        assert not target.exists()


# --------------------------------------------------------------------------- corrupt files


def _record_of(model_dir, key):
    with np.load(model_dir / f"{key}.npz") as blob:
        return blob["opcast_record"]


@pytest.mark.parametrize(
    "kind",
    [
        "empty",
        "random",
        "zip-not-npz",
        "foreign-npz",
        "foreign-npz-with-record",
        "bare-npy",
        "short-trees",
        "mlp-shapes",
    ],
)
def test_a_corrupt_predictor_file_is_one_line(model_dir, fitted, kind):
    key = "layernorm-fwd-half" if kind == "mlp-shapes" else "gemm-fwd-half"
    if kind == "empty":
        data = b""
    elif kind == "random":
        data = np.random.default_rng(0).bytes(4096)
    elif kind == "zip-not-npz":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("ubj.npy", "not an array")
            z.writestr("opcast_record.npy", "nor this")
        data = buf.getvalue()
    elif kind == "foreign-npz":
        data = _npz(weights=np.ones(4))
    elif kind == "foreign-npz-with-record":  # passes the record check, read when first used
        data = _npz(weights=np.ones(4), opcast_record=_record_of(model_dir, key))
    elif kind == "bare-npy":
        buf = io.BytesIO()
        np.save(buf, np.ones(4))
        data = buf.getvalue()
    elif kind == "short-trees":
        with np.load(model_dir / f"{key}.npz") as blob:
            arrays = {k: blob[k] for k in blob.files}
        arrays["tree_left"] = arrays["tree_left"][:-1]
        data = _npz(**arrays)
    else:
        with np.load(model_dir / f"{key}.npz") as blob:
            arrays = {k: blob[k] for k in blob.files}
        arrays["layer0.weight"] = arrays["layer0.weight"][:, :-1]
        data = _npz(**arrays)
    _replace_file(model_dir, key, data)
    with pytest.raises(OpcastError) as err:
        _predict_all(load_model_set(model_dir), fitted[0])
    msg = _one_line(err)
    assert f"{key}.npz" in msg and "re-fit" in msg, msg


def test_an_empty_booster_is_exit_2_not_sigabrt(model_dir):
    """xgboost aborts the interpreter on an empty model buffer; run in a child process so a
    regression shows as its exit status instead of killing the test session."""
    _replace_file(
        model_dir,
        "gemm-fwd-half",
        _npz(ubj=np.zeros(0, dtype=np.uint8), opcast_record=_record_of(model_dir, "gemm-fwd-half")),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "predict",
            "kernel",
            "--gpu",
            "A100-SXM4-80GB",
            "--op",
            "gemm",
            "--param",
            "b=1",
            "--param",
            "m=64",
            "--param",
            "n=64",
            "--param",
            "k=64",
            "--models",
            str(model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, err)
    assert "booster bytes are empty" in err and err.count("\n") == 0 and "Traceback" not in err, err


def test_an_unreadable_artifact_is_one_line(model_dir, monkeypatch):
    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(artifacts, "sha256_file", denied)
    with pytest.raises(OpcastError) as err:
        load_model_set(model_dir)
    assert "cannot be read (Permission denied)" in _one_line(err)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads a chmod 000 file anyway")
def test_a_chmod_000_artifact_is_one_line(model_dir):
    target = model_dir / "gemm-fwd-half.npz"
    target.chmod(0)
    try:
        with pytest.raises(OpcastError) as err:
            load_model_set(model_dir)
        assert "cannot be read" in _one_line(err)
    finally:
        target.chmod(0o644)


# --------------------------------------------------------------------------- swapped files


def test_a_predictor_copied_over_another_is_refused(model_dir):
    """gemm-bwd's weights saved as gemm-fwd: same estimator, same features, right hashes."""
    shutil.copyfile(model_dir / "gemm-bwd-half.npz", model_dir / "gemm-fwd-half.npz")
    _rehash(model_dir, _meta(model_dir))
    with pytest.raises(OpcastError) as err:
        load_model_set(model_dir)
    msg = _one_line(err)
    assert "gemm-fwd-half.npz holds the" in msg and "'gemm-bwd-half'" in msg and "differs in group" in msg, msg


def test_renamed_predictors_of_different_kinds_are_refused(model_dir):
    meta = _meta(model_dir)
    a, b = meta["predictors"]["gemm-fwd-half"], meta["predictors"]["layernorm-fwd-half"]
    a["file"], b["file"] = b["file"], a["file"]
    _rehash(model_dir, meta)
    with pytest.raises(OpcastError, match=r"differs in group, estimator, features"):
        load_model_set(model_dir)


def test_a_format_1_set_without_records_loads_and_its_records_are_checked_when_present(model_dir, fitted):
    """The embedded default (format 1) was saved without records: accepted; a record present is
    still checked; a format-2 file without one is refused."""
    devices = fitted[0]
    meta = _meta(model_dir)
    bare = model_dir / "gemm-fwd-half.npz"
    with np.load(bare) as blob:
        arrays = {k: blob[k] for k in blob.files if k != "opcast_record"}
    bare.write_bytes(_npz(**arrays))
    _rehash(model_dir, meta)
    with pytest.raises(OpcastError, match="holds no record"):
        load_model_set(model_dir)
    meta["format_version"] = 1
    _rehash(model_dir, meta)
    ms = load_model_set(model_dir)
    _predict_all(ms, devices)
    shutil.copyfile(model_dir / "gemm-bwd-half.npz", model_dir / "gemm-fwd-half.npz")  # has a record: checked
    _rehash(model_dir, meta)
    with pytest.raises(OpcastError, match="copied over another"):
        load_model_set(model_dir)


# --------------------------------------------------------------------------- meta.json types


def _set(path: str, value):
    def edit(meta):
        obj = meta
        *parents, last = path.split("/")
        for p in parents:
            obj = obj[p]
        obj[last] = value

    return edit


def _rename_key(meta):
    meta["predictors"]["../../etc"] = meta["predictors"].pop("gemm-fwd-half")


META_EDITS = {
    "predictors a list": (_set("predictors", []), "predictors must be"),
    "predictors a string": (_set("predictors", "gemm"), "predictors must be"),
    "an entry a list": (_set("predictors/gemm-fwd-half", ["xgb"]), "predictors must be"),
    "features a string": (_set("predictors/gemm-fwd-half/features", "log_flops"), "features must be"),
    "features empty": (_set("predictors/gemm-fwd-half/features", []), "features must be"),
    "features of numbers": (_set("predictors/gemm-fwd-half/features", [1, 2]), "features must be"),
    "files a list": (_set("files", ["gemm-fwd-half.npz"]), "files must be"),
    "files outside the set": (lambda m: m["files"].update({"../meta.json": "0" * 64}), "files must be"),
    "format_version a string": (_set("format_version", "x"), "format_version must be"),
    "format_version a float": (_set("format_version", 1.5), "format_version must be"),
    "format_version a bool": (_set("format_version", True), "format_version must be"),
    "features_version a string": (_set("features_version", "3"), "features_version must be"),
    "versions a list": (_set("versions", ["xgboost"]), "versions must be"),
    "a version a number": (_set("versions/xgboost", 3), "versions must be"),
    "name multi-line": (_set("name", "a\nb"), "name must be"),
    "datasets an object": (_set("datasets", {"sha256": "x"}), "datasets must be"),
    "device_specs a list": (_set("device_specs", []), "device_specs must be"),
    "file a number": (_set("predictors/gemm-fwd-half/file", 3), "file must be"),
    "file a path": (_set("predictors/gemm-fwd-half/file", "../../../etc/passwd"), "file must be"),
    "estimator unknown": (_set("predictors/gemm-fwd-half/estimator", "forest"), "estimator must be"),
    "estimator a list": (_set("predictors/gemm-fwd-half/estimator", ["xgb"]), "estimator must be"),
    "config a string": (_set("predictors/gemm-fwd-half/config", "x"), "config must be"),
    "hyper_parameters a list": (_set("predictors/gemm-fwd-half/config", {"hyper_parameters": [1]}), "config must be"),
    "devices a string": (_set("predictors/gemm-fwd-half/devices", "A100"), "devices must be"),
    "feature_ranges wrong": (
        _set("predictors/gemm-fwd-half/feature_ranges", {"log_flops": "1..2"}),
        "feature_ranges must be",
    ),
    "residuals wrong": (
        _set("predictors/gemm-fwd-half/residuals", {"seen_device": {"levels": "x"}}),
        "residuals must be",
    ),
    **{
        f"residuals {what}": (
            _set("predictors/gemm-fwd-half/residuals", {"seen_device": {"levels": levels, "log_ratio": ratios}}),
            "residuals must be",
        )
        for what, levels, ratios in [
            ("empty", [], []),  # np.interp of no points: an internal error before
            ("NaN", [0.05, 0.95], [float("nan"), 0.1]),
            ("inf", [0.05, 0.95], [-0.1, float("inf")]),
            ("huge", [0.05, 0.95], [-0.1, 1e308]),  # exp overflowed: an interval of [inf, inf]
            ("levels descending", [0.95, 0.05], [-0.1, 0.1]),
            ("quantiles descending", [0.05, 0.95], [0.1, -0.1]),
            ("level above 1", [0.05, 2.0], [-0.1, 0.1]),
            ("lengths differ", [0.05, 0.95], [0.1]),
        ]
    },
    "feature_ranges reversed": (
        _set("predictors/gemm-fwd-half/feature_ranges", {"log_flops": [40.0, 1.0]}),
        "feature_ranges must be",
    ),
    "feature_ranges NaN": (
        _set("predictors/gemm-fwd-half/feature_ranges", {"log_flops": [float("nan"), 1.0]}),
        "feature_ranges must be",
    ),
    "held_out a string": (_set("predictors/gemm-fwd-half/held_out", "good"), "held_out must be"),
    "a group key of no op": (_rename_key, "is not <op>-<direction>-<dtype class>"),
    "file missing": (lambda m: m["predictors"]["gemm-fwd-half"].pop("file"), "file is missing"),
}


@pytest.mark.parametrize("case", sorted(META_EDITS))
def test_a_wrongly_typed_meta_is_one_line_naming_the_field(model_dir, case):
    edit, needle = META_EDITS[case]
    meta = copy.deepcopy(_meta(model_dir))
    edit(meta)
    _rehash(model_dir, meta)
    with pytest.raises(OpcastError) as err:
        load_model_set(model_dir)
    msg = _one_line(err)
    assert needle in msg, msg


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[]", "not an opcast model set"),
        (b'{"format_version": 1, "predictors": {}', "not valid JSON"),
    ],
)
def test_a_meta_json_that_is_not_a_model_set_is_one_line(model_dir, content, needle):
    (model_dir / "meta.json").write_bytes(content)
    with pytest.raises(OpcastError) as err:
        load_model_set(model_dir)
    assert needle in _one_line(err)


def test_a_newer_format_asks_for_an_upgrade_not_a_refit(model_dir):
    meta = _meta(model_dir)
    meta["format_version"] = artifacts.FORMAT_VERSION + 1
    _rehash(model_dir, meta)
    with pytest.raises(OpcastError, match=r"newer than this opcast reads.*upgrade opcast"):
        load_model_set(model_dir)


def test_a_set_written_now_is_format_2_with_a_record_in_every_file(model_dir):
    meta = _meta(model_dir)
    assert meta["format_version"] == artifacts.FORMAT_VERSION == 2
    for key, entry in meta["predictors"].items():
        with np.load(model_dir / entry["file"], allow_pickle=False) as blob:
            record = json.loads(blob["opcast_record"].item())
        assert record == {"group": key, "estimator": entry["estimator"], "features": entry["features"]}
    artifacts.check_meta(meta)  # what opcast writes passes its own checks


def test_a_failure_between_the_renames_puts_the_old_set_back(tmp_path, fitted, monkeypatch):
    """Replacing a set moves the old one aside, then the new one in; an interrupt or error on the
    second rename left the old set hidden as .toy.old-PID with nothing at models/toy."""
    root = write_model_set(tmp_path / "models", "toy", fitted[1], {"datasets": []})
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    real = pathlib.Path.rename

    def rename(self, target):
        if pathlib.Path(target) == root and ".old-" not in self.name:
            raise KeyboardInterrupt  # the new set's move in
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        write_model_set(tmp_path / "models", "toy", fitted[1], {"datasets": [], "name": "new"})
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["toy"]  # no temporary or hidden set left
    load_model_set(root)
    fresh = tmp_path / "fresh"  # calibrate installs its staged set the same way (install_set)
    fresh.mkdir()
    with pytest.raises(KeyboardInterrupt):
        artifacts.install_set(fresh, root)
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before and fresh.is_dir()


def test_a_meta_json_past_its_bound_is_refused_unread(model_dir, monkeypatch):
    """meta.json had no size bound (its side files have one): a huge file was read whole into memory."""
    monkeypatch.setattr(artifacts, "META_MAX_BYTES", 1 << 10)
    with (model_dir / "meta.json").open("ab") as f:
        f.write(b" " * 2048)  # still valid JSON: only the size is wrong
    with pytest.raises(OpcastError, match="larger than") as err:
        load_model_set(model_dir)
    assert "meta.json" in _one_line(err)


def test_sigterm_mid_write_leaves_no_half_written_folder(tmp_path, fitted, monkeypatch):
    """SIGTERM's default action ended train fit on the spot: a signal while the set was being written
    left the hidden temporary folder behind; now it is removed as on Ctrl-C, and the old set stays."""
    import os
    import signal

    root = write_model_set(tmp_path / "models", "toy", fitted[1], {"datasets": []})
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    real = artifacts.sha256_file
    calls = []

    def hash_then_terminate(path):
        calls.append(path)
        if len(calls) == 2:  # the second predictor file is written: the folder is half done
            os.kill(os.getpid(), signal.SIGTERM)
        return real(path)

    monkeypatch.setattr(artifacts, "sha256_file", hash_then_terminate)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        write_model_set(tmp_path / "models", "toy", fitted[1], {"datasets": [], "name": "new"})
    assert signal.getsignal(signal.SIGTERM) == handler
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["toy"]
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before
