"""Fitted model sets on disk: ``MODELS_DIR/<name>/`` with one file per predictor and ``meta.json``.

``meta.json`` records, per predictor (one per op group, :func:`opcast.train.features.group_key`),
the estimator, its input features, hyper-parameters, rows and devices it was fitted on and its
held-out metrics, and for the whole set the training datasets with their content hash, the
library versions, the feature-definition version and the sha256 of every file. Loading checks
all of that and refuses a mismatch in one line that says how to fix it. Predictors are loaded on
first use, so a set of xgboost predictors never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec
from opcast.train.features import FEATURES, FEATURES_VERSION, dtype_class, features, group_key, group_keys

FORMAT_VERSION: Final = 1
"""Layout version of a model set; a newer one than this opcast knows is refused."""
META: Final = "meta.json"
LIBRARIES: Final = ("opcast", "numpy", "pandas", "xgboost", "torch", "scikit-learn")
_LIB_OF_ESTIMATOR: Final = {"xgb": "xgboost", "tile-mlp": "torch"}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries a model set depends on (read without importing them)."""
    out: dict[str, str | None] = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def _meta_digest(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def default_models_path() -> Path:
    """The embedded default model set (``models/default`` in the repo, ``opcast.models`` installed)."""
    try:
        root = Path(str(resources.files("opcast.models")))
        if root.is_dir():
            return root / "default"
    except ModuleNotFoundError:  # a checkout without an install
        pass
    return Path(__file__).resolve().parent.parent / "models" / "default"


class ModelSet:
    """A loaded model set: which op groups it covers, and batched predictions."""

    def __init__(self, *, name: str, path: Path, meta: dict[str, Any]) -> None:
        self.name = name
        self.path = path
        self.meta = meta
        self._loaded: dict[str, Any] = {}

    @property
    def predictors(self) -> dict[str, dict[str, Any]]:
        """Group key -> its meta.json entry."""
        return self.meta["predictors"]

    def covers(self, op: str, dtype: str, direction: str) -> bool:
        """Whether a fitted predictor covers (op, dtype, direction) with the default tensor-core use."""
        try:
            return group_key(op, direction, dtype_class(op, dtype, None)) in self.predictors
        except OpcastError:
            return False

    def estimator(self, key: str) -> Any:
        """The fitted estimator of group ``key`` (loaded on first use)."""
        est = self._loaded.get(key)
        if est is None:
            from opcast.train.estimators import estimator_class

            entry = self.predictors[key]
            cls = estimator_class(entry["estimator"])
            try:
                est = cls.load(self.path / entry["file"], feature_names=tuple(entry["features"]), config=entry.get("config", {}))
            except OpcastError:
                raise
            except Exception as err:  # a file that passed its hash but a library cannot read
                raise OpcastError(f"{self.path / entry['file']}: cannot be loaded by {_LIB_OF_ESTIMATOR[entry['estimator']]} "
                                  f"({str(err).splitlines()[0][:120]}); re-fit with opcast train fit") from None
            self._loaded[key] = est
        return est

    def residuals(self, key: str, device_name: str) -> tuple[str, np.ndarray, np.ndarray] | None:
        """(device class, quantile levels, quantiles of log(measured / predicted)) of predictor
        ``key`` on held-out rows like a query on ``device_name``: ``seen_device`` (shapes it never
        saw on a device it was fitted on) or ``unseen_device`` (a left-out device). A device it
        never saw with only seen-device residuals recorded (a group measured on one device) gets
        those, labelled ``seen_device only``: that interval is understated. None when the set
        records no residuals (fitted before opcast recorded them, or without held-out folds)."""
        entry = self.predictors.get(key)
        res = (entry or {}).get("residuals") or {}
        seen = device_name in (entry or {}).get("devices", ())
        label = "seen_device" if seen else "unseen_device"
        got = res.get(label)
        if got is None and not seen and res.get("seen_device"):
            label, got = "seen_device only", res["seen_device"]
        if got is None and seen and res.get("unseen_device"):
            label, got = "unseen_device", res["unseen_device"]  # wider than needed: conservative
        if not got:
            return None
        return label, np.asarray(got["levels"], dtype=float), np.asarray(got["log_ratio"], dtype=float)

    def predict_s(self, frame: pd.DataFrame, device: DeviceSpec) -> np.ndarray:
        """Predicted seconds of every row of ``frame`` on ``device`` (float64, NaN where no
        predictor covers the row or the device has no peak for its dtype)."""
        out = np.full(len(frame), np.nan)
        if not len(frame):
            return out
        keys = group_keys(frame).to_numpy()
        covered = np.isin(keys, list(self.predictors))
        if not covered.any():
            return out
        pos = np.flatnonzero(covered)
        sub = frame.iloc[pos].reset_index(drop=True)
        feats = features(sub, device)
        sub_keys = keys[pos]
        for key in pd.unique(sub_keys):
            rows = np.flatnonzero(sub_keys == key)
            out[pos[rows]] = self.estimator(key).predict_s(feats.iloc[rows])
        bad = ~np.isfinite(out) | (out <= 0)
        out[bad] = np.nan
        return out

    def __repr__(self) -> str:
        return f"ModelSet({self.name!r}, {len(self.predictors)} predictors, {self.path})"


def _resolve(path: Path) -> Path:
    if (path / META).is_file():
        return path
    if path.is_dir():
        sets = sorted(p for p in path.iterdir() if (p / META).is_file())
        if len(sets) == 1:
            return sets[0]
        if sets:
            raise OpcastError(f"{path} holds several model sets ({', '.join(p.name for p in sets)}); give one of them, "
                              f"e.g. {sets[0]}")
        raise OpcastError(f"{path} holds no model set (no {META}); fit one with opcast train fit DATASET --out {path}")
    raise OpcastError(f"model set {path} does not exist; fit one with opcast train fit DATASET --out DIR, "
                      "or leave --models out to use the embedded default")


def load_model_set(path: str | Path | None = None) -> ModelSet:
    """Load and verify a model set (``None``: the embedded default). The folder may be the set
    itself or a folder holding exactly one set. A missing or tampered file, an unknown layout,
    changed feature definitions or a too old library raise :class:`OpcastError` in one line."""
    root = _resolve(Path(path) if path is not None else default_models_path())
    meta_path = root / META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise OpcastError(f"{meta_path}: cannot be read ({err}); re-fit with opcast train fit") from None
    except json.JSONDecodeError as err:
        raise OpcastError(f"{meta_path}: not valid JSON ({err.msg} at line {err.lineno}); it was edited or truncated, "
                          "re-fit with opcast train fit") from None
    if not isinstance(meta, dict) or "format_version" not in meta or "predictors" not in meta:
        raise OpcastError(f"{meta_path} is not an opcast model set (no format_version/predictors); re-fit with opcast train fit")
    if meta.get("meta_sha256") != _meta_digest(meta):
        raise OpcastError(f"{meta_path} was modified after fitting (its sha256 does not match); restore it "
                          "(e.g. git checkout) or re-fit with opcast train fit")
    if int(meta["format_version"]) > FORMAT_VERSION:
        raise OpcastError(f"{root}: model-set format {meta['format_version']} is newer than this opcast reads "
                          f"({FORMAT_VERSION}); upgrade opcast")
    if int(meta.get("features_version", -1)) != FEATURES_VERSION:
        raise OpcastError(f"{root}: fitted on feature definitions v{meta.get('features_version')}, this opcast computes "
                          f"v{FEATURES_VERSION}; re-fit with opcast train fit")
    files = meta.get("files", {})
    for key, entry in meta["predictors"].items():
        name = entry.get("file")
        if name not in files:
            raise OpcastError(f"{meta_path}: predictor {key} names {name!r}, which has no recorded sha256; re-fit")
        kind = key.rsplit("-", 2)[0]
        unknown = [f for f in entry.get("features", ()) if f not in FEATURES.get(kind, ())]
        if unknown:
            raise OpcastError(f"{root}: predictor {key} uses feature(s) {', '.join(unknown)} that this opcast does not "
                              "compute; re-fit with opcast train fit")
    for name, digest in files.items():
        file = root / name
        if not file.is_file():
            raise OpcastError(f"{file} is missing from the model set; restore it or re-fit with opcast train fit")
        if sha256_file(file) != digest:
            raise OpcastError(f"{file} does not match the sha256 in {META} (tampered or corrupt); restore it "
                              "or re-fit with opcast train fit")
    installed = library_versions()
    used = {_LIB_OF_ESTIMATOR[e["estimator"]] for e in meta["predictors"].values() if e.get("estimator") in _LIB_OF_ESTIMATOR}
    for lib in sorted(used):
        fitted = meta.get("versions", {}).get(lib)
        have = installed.get(lib)
        if have is None:
            raise OpcastError(f"{root} needs {lib} (fitted with {fitted}), which is not installed; pip install {lib}")
        if fitted and _major(have) < _major(fitted):
            raise OpcastError(f"{root} was fitted with {lib} {fitted} but {have} is installed; "
                              f"pip install '{lib}>={_major(fitted)}' or re-fit with opcast train fit")
    return ModelSet(name=str(meta.get("name", root.name)), path=root, meta=meta)


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def write_model_set(out: Path, name: str, fitted: Mapping[str, tuple[Any, dict[str, Any]]], meta: dict[str, Any]) -> Path:
    """Write ``out/name/`` atomically: each (estimator, entry) of ``fitted`` (group key -> ...)
    saved to ``<group><suffix>``, then ``meta.json`` with every file's sha256."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    except OSError as err:
        raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
    try:
        predictors: dict[str, Any] = {}
        files: dict[str, str] = {}
        for key, (est, entry) in sorted(fitted.items()):
            path = est.save(tmp / key)
            files[path.name] = sha256_file(path)
            predictors[key] = {**entry, "file": path.name, "estimator": est.name, "config": est.config()}
        body = {"format_version": FORMAT_VERSION, "name": name, "features_version": FEATURES_VERSION,
                "versions": library_versions(), **meta, "predictors": predictors, "files": files}
        body["meta_sha256"] = _meta_digest(json.loads(json.dumps(body, default=str)))
        (tmp / META).write_text(json.dumps(body, indent=1, sort_keys=False, default=str) + "\n")
        final = out / name
        old = None
        if final.exists():
            old = out / f".{name}.old-{os.getpid()}"
            final.rename(old)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        os.chmod(final, 0o755)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
