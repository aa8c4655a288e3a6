"""Fitted model sets on disk: ``MODELS_DIR/<name>/`` with one file per predictor and ``meta.json``.

``meta.json`` records, per predictor (one per op group, :func:`opcast.train.features.group_key`),
the estimator, its input features, hyper-parameters, rows and devices it was fitted on and its
held-out metrics, and for the whole set the training datasets with their content hash, the
library versions, the feature-definition version and the sha256 of every file. Loading checks
all of that and refuses a mismatch in one line that says how to fix it. Predictors are loaded on
first use, so a set of xgboost predictors never imports torch.

What the hashes guarantee: ``meta_sha256`` (over meta.json's other fields) and the per-file
sha256 catch *accidents* — a truncated download, a partial copy, a hand edit, a file from another
fit. They are unkeyed digests, so they do **not** prove who made a set: anyone who edits a set can
recompute them. Trust a model set as much as its source. What makes a set from an untrusted
source safe to load is that loading never runs code from it: predictor files are numpy archives
read with ``allow_pickle=False`` (older sets' torch state dicts with ``weights_only=True``),
xgboost reads only its UBJSON bytes, pickled files (``.joblib``, ``.pkl``) are refused, and every
field of meta.json is type-checked (:func:`check_meta`) before it is used.

Each predictor file also records what it holds (group, estimator, feature names, under
:data:`~opcast.train.estimators.RECORD_KEY`), checked against its meta.json entry, so a file
renamed or copied over another predictor's is refused even with the hashes recomputed. Sets of
format 1 (the embedded default among them) were written without that record: it is checked
where present and required from format 2 on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata, resources
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec, answers_as_trained, die_twin, other_vendor, read_capped, spec_from_dict
from opcast.train.estimators import ESTIMATORS, RECORD_KEY, parse_record, read_arrays
from opcast.train.features import (
    FEATURES,
    FEATURES_VERSION,
    Columns,
    Table,
    board_time_s,
    columns_of,
    dtype_class,
    feature_table,
    group_key,
    group_key_array,
    unread_peaks,
)

if TYPE_CHECKING:  # pandas stays off the predict path: only callers that have a frame import it
    import pandas as pd

FORMAT_VERSION: Final = 2
"""Layout version of a model set; a newer one than this opcast knows is refused. 2: every
predictor file holds its record (group, estimator, features); 1 (the embedded default): not
always."""
RECORD_REQUIRED_FROM: Final = 2
"""First format whose predictor files must all hold their record."""
META: Final = "meta.json"
ARTIFACT_SUFFIXES: Final = (".npz", ".pt")
"""Predictor files opcast reads: numpy archives, and torch state dicts of sets saved before them."""
PICKLE_SUFFIXES: Final = (".joblib", ".pkl", ".pickle")
LIBRARIES: Final = ("opcast", "numpy", "pandas", "xgboost", "torch", "scikit-learn")
# Distributions that install a library under another name: XGBoost's CPU-only wheel (xgboost-cpu,
# https://xgboost.readthedocs.io/en/stable/install.html) is imported as xgboost, without the GPU build.
_DISTRIBUTIONS: Final = {"xgboost": ("xgboost", "xgboost-cpu")}
_LIB_OF_ESTIMATOR: Final = {"xgb": "xgboost", "tile-mlp": "torch", "neusight": "numpy", "hier": "xgboost"}


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
        out[lib] = None
        for dist in _DISTRIBUTIONS.get(lib, (lib,)):
            try:
                out[lib] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def parse_device_specs(meta: Mapping[str, Any]) -> tuple[dict[str, DeviceSpec], list[str]]:
    """(name -> spec of every valid entry of a set's ``device_specs``, the names of the invalid ones)."""
    raw = meta.get("device_specs")
    specs: dict[str, DeviceSpec] = {}
    invalid: list[str] = []
    for name, spec in raw.items() if isinstance(raw, Mapping) else ():
        try:
            specs[str(name)] = spec_from_dict(spec, f"device_specs[{name}] of the model set")
        except OpcastError:
            invalid.append(str(name))
    return specs, invalid


def _meta_digest(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- meta.json types


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_finite(v: Any) -> bool:
    return _is_num(v) and math.isfinite(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_line(v: Any) -> bool:
    """A short printable string (it ends up in one-line messages and reports)."""
    return isinstance(v, str) and len(v) <= 200 and v.isprintable()


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _dict_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(ok(x) for x in v.values())


_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,200}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GROUP_KEY = re.compile(r"[a-z0-9_]{1,40}-[a-z0-9_]{1,20}-[a-z0-9_]{1,20}")


RESIDUAL_MAX_LOG_RATIO: Final = 20.0
"""Largest |log(measured / predicted)| a recorded residual quantile may hold: a factor of e**20
(~5e8) is no prediction, and larger ones overflow the interval's ``exp``."""


def _is_residuals(v: Any) -> bool:
    """{levels, log_ratio}: a quantile function, as :func:`opcast.train.fit.residual_quantiles` writes
    it: at least one level, levels strictly ascending in [0, 1], quantiles finite, non-decreasing and
    at most :data:`RESIDUAL_MAX_LOG_RATIO` in size (the intervals interpolate between them)."""
    levels, ratios = (v.get("levels"), v.get("log_ratio")) if isinstance(v, dict) else (None, None)
    if not (isinstance(levels, list) and isinstance(ratios, list)):
        return False
    return (
        _list_of(_is_finite)(levels)
        and _list_of(_is_finite)(ratios)
        and 0 < len(levels) == len(ratios)
        and all(0 <= lv <= 1 for lv in levels)
        and all(a < b for a, b in pairwise(levels))
        and all(a <= b for a, b in pairwise(ratios))
        and all(abs(r) <= RESIDUAL_MAX_LOG_RATIO for r in ratios)
    )


def _is_range(v: Any) -> bool:
    """[min, max]: two finite numbers, min <= max."""
    return isinstance(v, list) and len(v) == 2 and _is_finite(v[0]) and _is_finite(v[1]) and v[0] <= v[1]


_Field = tuple[bool, Callable[[Any], bool], str]
"""(required, check, what the value must be)"""

META_FIELDS: Final[dict[str, _Field]] = {
    "format_version": (True, lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "features_version": (True, _is_int, "an integer"),
    "name": (False, _is_line, "a short printable string"),
    "versions": (False, _dict_of(lambda v: v is None or _is_line(v)), "an object of library -> version string or null"),
    "predictors": (True, _dict_of(lambda v: isinstance(v, dict)), "an object of group -> predictor object"),
    "files": (
        True,
        lambda v: (
            isinstance(v, dict)
            and all(_FILE_NAME.fullmatch(k) and _is_str(d) and _SHA256.fullmatch(d) for k, d in v.items())
        ),
        "an object of plain file name -> sha256 hex digest",
    ),
    "meta_sha256": (True, _is_str, "a sha256 hex digest"),
    "datasets": (
        False,
        _list_of(lambda d: isinstance(d, dict) and _is_str(d.get("sha256"))),
        "a list of objects with a sha256",
    ),
    "device_specs": (False, _dict_of(lambda v: isinstance(v, dict)), "an object of device name -> spec object"),
    "skipped": (False, _dict_of(_is_str), "an object of name -> reason"),
    "rows": (False, _is_int, "an integer"),
}
"""What :func:`check_meta` requires of meta.json's top-level fields (others are free-form)."""

ENTRY_FIELDS: Final[dict[str, _Field]] = {
    "file": (True, lambda v: _is_str(v) and bool(_FILE_NAME.fullmatch(v)), "a plain file name"),
    "estimator": (True, lambda v: v in ESTIMATORS, f"one of {', '.join(ESTIMATORS)}"),
    "features": (True, lambda v: _list_of(_is_str)(v) and len(v) > 0, "a non-empty list of feature names"),
    "config": (
        False,
        lambda v: isinstance(v, dict) and isinstance(v.get("hyper_parameters", {}), dict),
        "an object whose hyper_parameters is an object",
    ),
    "devices": (False, _list_of(_is_str), "a list of device names"),
    "vendors": (False, _list_of(_is_str), "a list of vendor names"),
    "impl_devices": (
        False,
        _dict_of(_list_of(_is_str)),
        "an object of implementation -> list of device names",
    ),
    "feature_ranges": (
        False,
        _dict_of(_is_range),
        "an object of feature -> [min, max] (finite, min <= max)",
    ),
    "residuals": (
        False,
        _dict_of(_is_residuals),
        "an object of device class -> {levels, log_ratio}: ascending levels in [0, 1] and their "
        f"non-decreasing finite quantiles (|q| <= {RESIDUAL_MAX_LOG_RATIO:g})",
    ),
    "held_out": (False, lambda v: v is None or isinstance(v, dict), "an object or null"),
    "rows": (False, _is_int, "an integer"),
}
"""What :func:`check_meta` requires of each ``predictors`` entry."""
SEEN_SUFFIX: Final = "+seen"
"""Suffix of the group key (file stem and record) of a predictor's ``seen`` part: the estimator that
answers for the devices the group was fitted on where ``auto`` chose another for the rest
(:class:`opcast.train.fit.SeenSplit`)."""
SEEN_FIELDS: Final[dict[str, _Field]] = {k: ENTRY_FIELDS[k] for k in ("file", "estimator", "features", "config")}
"""What :func:`check_meta` requires of an entry's ``seen`` part (and of its ``other`` and ``blend`` parts)."""
OTHER_SUFFIX: Final = "+other"
"""Suffix of the group key (file stem and record) of a predictor's ``other`` part: where the group mixes vendors,
the estimator fitted on every vendor's rows, which answers for the devices of the vendors but ``vendors``, the
vendors whose rows alone the group's own predictors were fitted on (:func:`opcast.train.fit.vendor_rows`)."""
BLEND_SUFFIX: Final = "+blend"
"""Suffix of the group key (file stem and record) of a predictor's ``blend`` part: the second estimator of a
:class:`~opcast.train.estimators.blend.Blend`, whose answers' geometric mean with the entry's own estimator's
answers the GPUs the group was not fitted on; the training GPUs get the entry's own estimator (or its ``seen``
part)."""
PARTS: Final = (("seen", SEEN_SUFFIX), ("other", OTHER_SUFFIX), ("blend", BLEND_SUFFIX))
"""An entry's optional predictor parts: (entry field, file stem suffix)."""


def _parts(key: str, entry: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(record group, entry) of each predictor file of group ``key``: its own and each of its :data:`PARTS`."""
    out: list[tuple[str, Mapping[str, Any]]] = [(key, entry)]
    for field, suffix in PARTS:
        part = entry.get(field)
        if isinstance(part, Mapping) and "file" in part:
            out.append((key + suffix, part))
    return out


def _brief(value: Any) -> str:
    """``repr(value)`` cut to one short line, for an error message."""
    text = repr(value)
    return text[:40] + "..." if len(text) > 40 else text


def _show(value: Any) -> str:
    """A short one-line description of a JSON value (type and value) for an error message."""
    return f"{type(value).__name__} {_brief(value)}"


def _check_fields(obj: Mapping[str, Any], spec: Mapping[str, _Field], where: str, prefix: str) -> None:
    for name, (required, ok, what) in spec.items():
        if name not in obj:
            if required:
                raise OpcastError(
                    f"{where}: {prefix}{name} is missing; this is not a complete opcast model set, "
                    "re-fit with opcast train fit"
                )
            continue
        if not ok(obj[name]):
            raise OpcastError(
                f"{where}: {prefix}{name} must be {what}, got {_show(obj[name])}; the set is corrupt, "
                "restore it or re-fit with opcast train fit"
            )


def check_meta(meta: Any, where: str | Path = META) -> None:
    """Check that every field of a parsed meta.json that opcast reads has the type it expects;
    the first that does not is named in a one-line :class:`OpcastError`."""
    if not isinstance(meta, dict):
        raise OpcastError(
            f"{where} holds a JSON {type(meta).__name__}, not an object; it is not an opcast model set, "
            "re-fit with opcast train fit"
        )
    _check_fields(meta, META_FIELDS, str(where), "")
    for key, entry in meta["predictors"].items():
        prefix = f"predictors[{key[:60]!r}]."
        if not _GROUP_KEY.fullmatch(key) or key.rsplit("-", 2)[0] not in FEATURES:
            raise OpcastError(
                f"{where}: predictor {key[:60]!r} is not <op>-<direction>-<dtype class> of an op this opcast "
                f"knows ({', '.join(FEATURES)}); re-fit with opcast train fit"
            )
        _check_fields(entry, ENTRY_FIELDS, str(where), prefix)
        for field, _ in PARTS:
            if field not in entry:
                continue
            if not isinstance(entry[field], dict):
                raise OpcastError(
                    f"{where}: {prefix}{field} must be an object, got {_show(entry[field])}; the set is corrupt, "
                    "restore it or re-fit with opcast train fit"
                )
            _check_fields(entry[field], SEEN_FIELDS, str(where), f"{prefix}{field}.")
        if "other" in entry and not entry.get("vendors"):
            raise OpcastError(
                f"{where}: {prefix}other needs the vendors its group's own predictors were fitted on (vendors); "
                "the set is corrupt, restore it or re-fit with opcast train fit"
            )


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
        self._as_seen: dict[tuple[str, DeviceSpec], bool] = {}
        self._die_twin: dict[tuple[str, DeviceSpec], DeviceSpec | None] = {}

    @property
    def predictors(self) -> dict[str, dict[str, Any]]:
        """Group key -> its meta.json entry."""
        return self.meta["predictors"]

    def covers(self, op: str, dtype: str, direction: str, impl: str | None = None) -> bool:
        """Whether a fitted predictor covers (op, dtype, direction) with the default tensor-core use (and, for a kind
        of :data:`opcast.train.features.FAMILY_GROUPS`, the kernel family ``impl``: its own group)."""
        try:
            return group_key(op, direction, dtype_class(op, dtype, None), impl) in self.predictors
        except OpcastError:
            return False

    def estimator(self, key: str, seen: bool = False, *, other: bool = False) -> Any:
        """The fitted predictor of group ``key`` (loaded on first use, by the estimator's light
        predictor class: numpy only, no scikit-learn, xgboost or torch): the one that answers the devices the
        group was not fitted on (a :class:`~opcast.train.estimators.blend.Blend` of the entry's own and its
        ``blend`` part where it has one); with ``seen``, the one that answers for the devices the group was
        fitted on (its ``seen`` part, else its own); with ``other``, the one that answers for the devices of the
        vendors the group's own were not fitted on."""
        entry = self.predictors[key]
        if other and isinstance(entry.get("other"), Mapping):
            return self._part(key + OTHER_SUFFIX, entry["other"])
        if seen and isinstance(entry.get("seen"), Mapping):
            return self._part(key + SEEN_SUFFIX, entry["seen"])
        own = self._part(key, entry)
        if seen or not isinstance(entry.get("blend"), Mapping):
            return own
        memo = key + "+blended"
        if memo not in self._loaded:
            from opcast.train.estimators.blend import Blend

            self._loaded[memo] = Blend(own, self._part(key + BLEND_SUFFIX, entry["blend"]))
        return self._loaded[memo]

    def _part(self, memo: str, entry: Mapping[str, Any]) -> Any:
        """The predictor of one file of the set, described by ``entry`` (a group's, or one of its parts') and
        recorded as group ``memo``; loaded on first use."""
        est = self._loaded.get(memo)
        if est is None:
            from opcast.train.estimators import predictor_class

            cls = predictor_class(entry["estimator"])
            file = self.path / entry["file"]
            try:
                est = cls.load(file, feature_names=tuple(entry["features"]), config=entry.get("config", {}))
            except OpcastError:
                raise
            except Exception as err:  # a file that passed its hash but a library cannot read
                why = (str(err).splitlines() or [type(err).__name__])[0][:120]
                raise OpcastError(
                    f"{file}: cannot be loaded by {_LIB_OF_ESTIMATOR[entry['estimator']]} "
                    f"({why}); re-fit with opcast train fit"
                ) from None
            _check_record(getattr(est, "record_", None), memo, entry, file, _record_required(self.meta))
            self._loaded[memo] = est
        return est

    def answers_as_seen(self, key: str, device: DeviceSpec) -> bool:
        """Whether group ``key``'s ``seen`` predictor answers for ``device``: the set holds one (or a ``blend``
        part, which answers other GPUs only, so its entry's own estimator is the seen one) and the
        group was fitted on that GPU (a copy of a training GPU on another network is that GPU) or on a
        board of the same compute die (A100-SXM4-40GB for A100-SXM4-80GB: SMs, clocks, peaks and L2
        alike, :func:`opcast.hardware.same_die`; its bandwidth is a feature of that predictor, and the
        left-out-GPU score that chose the other was measured on other dies). Such a board's compute-bound
        kernels take the training board's answer (:meth:`die_twin`, :meth:`predict_s`). Memoised per device."""
        memo = (key, device)
        got = self._as_seen.get(memo)
        if got is None:
            entry = self.predictors.get(key) or {}
            two = isinstance(entry.get("seen"), Mapping) or isinstance(entry.get("blend"), Mapping)
            devices = entry.get("devices", ()) if two else ()
            got = self._as_seen[memo] = answers_as_trained(device, devices, self.device_specs, unread_peaks(key))
        return got

    def other_vendor(self, key: str, device: DeviceSpec) -> bool:
        """Whether group ``key``'s ``other`` predictor answers for ``device``: the set holds one and ``device`` is
        of none of the vendors the group's own predictors were fitted on (:func:`opcast.hardware.other_vendor`)."""
        entry = self.predictors.get(key) or {}
        return isinstance(entry.get("other"), Mapping) and other_vendor(device, entry.get("vendors", ()))

    def die_twin(self, key: str, device: DeviceSpec) -> DeviceSpec | None:
        """The training device of group ``key`` whose compute die ``device`` is another board of
        (:func:`opcast.hardware.die_twin`), or None. Memoised per device."""
        memo = (key, device)
        if memo not in self._die_twin:
            devices = (self.predictors.get(key) or {}).get("devices", ())
            self._die_twin[memo] = die_twin(device, devices, self.device_specs, unread_peaks(key))
        return self._die_twin[memo]

    @functools.cached_property
    def device_specs(self) -> dict[str, DeviceSpec]:
        """The training devices' specs the set recorded (``device_specs``), the invalid ones left out."""
        return parse_device_specs(self.meta)[0]

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

    def predict_s(self, frame: pd.DataFrame | Table | Columns, device: DeviceSpec) -> np.ndarray:
        """Predicted seconds of every row of ``frame`` (a DataFrame, or its columns as numpy
        arrays: a :class:`~opcast.train.features.Table` or mapping) on ``device`` (float64, NaN where no
        predictor covers the row or the device has no peak for its dtype)."""
        cols = columns_of(frame)
        n = len(next(iter(cols.values()))) if cols else 0
        out = np.full(n, np.nan)
        if not n:
            return out
        keys = group_key_array(cols)
        predictors = self.predictors
        covered = np.fromiter((k in predictors for k in keys.tolist()), dtype=bool, count=n)
        if not covered.any():
            return out
        pos = np.flatnonzero(covered)
        sub = {c: v[pos] for c, v in cols.items()}
        feats = feature_table(sub, device)
        on_die: dict[str, Table] = {}
        sub_keys = keys[pos]
        for key in dict.fromkeys(sub_keys.tolist()):
            rows = np.flatnonzero(sub_keys == key)
            if self.other_vendor(key, device):
                est = self.estimator(key, other=True)
            else:
                est = self.estimator(key, self.answers_as_seen(key, device))
            mine = feats.take(rows)
            got = est.predict_s(mine)
            die = self.die_twin(key, device)
            if die is not None:  # a board of a training GPU's die: that GPU's answer where compute-bound
                if die.name not in on_die:
                    on_die[die.name] = feature_table(sub, die)
                got = board_time_s(got, est.predict_s(on_die[die.name].take(rows)), mine)
            out[pos[rows]] = got
        bad = ~np.isfinite(out) | (out <= 0)
        out[bad] = np.nan
        return out

    def __repr__(self) -> str:
        return f"ModelSet({self.name!r}, {len(self.predictors)} predictors, {self.path})"


def _resolve(path: Path) -> Path:
    try:
        if (path / META).is_file():
            return path
        if path.is_dir():
            sets = sorted(p for p in path.iterdir() if (p / META).is_file())
        elif path.exists():
            raise OpcastError(
                f"model set {path} is a file, not a folder; give the folder written by opcast train fit "
                "(the one holding meta.json)"
            )
        else:
            raise OpcastError(
                f"model set {path} does not exist; fit one with opcast train fit DATASET --out DIR, "
                "or leave --models out to use the embedded default"
            )
    except OSError as err:
        raise OpcastError(f"model set {path} cannot be read ({err.strerror}); fix its permissions") from None
    if len(sets) == 1:
        return sets[0]
    if sets:
        raise OpcastError(
            f"{path} holds several model sets ({', '.join(p.name for p in sets)}); give one of them, e.g. {sets[0]}"
        )
    raise OpcastError(f"{path} holds no model set (no {META}); fit one with opcast train fit DATASET --out {path}")


def _record_required(meta: Mapping[str, Any]) -> bool:
    return int(meta["format_version"]) >= RECORD_REQUIRED_FROM


def _check_record(
    record: Mapping[str, Any] | None, key: str, entry: Mapping[str, Any], file: Path, required: bool
) -> None:
    """Refuse predictor ``file`` unless the record saved in it (what it holds) is ``key``'s entry
    of meta.json: a file renamed or copied over another predictor's is caught here even when
    the hashes in meta.json were recomputed."""
    if record is None:
        if required:
            raise OpcastError(
                f"{file} holds no record of which predictor it is (every file of a format "
                f"{RECORD_REQUIRED_FROM}+ set has one); restore the set or re-fit with opcast train fit"
            )
        return
    want = {"group": key, "estimator": entry["estimator"], "features": list(entry["features"])}
    wrong = [k for k, v in want.items() if record.get(k) != v]
    if wrong:
        raise OpcastError(
            f"{file} holds the {_brief(record.get('estimator'))} predictor of {_brief(record.get('group'))}, "
            f"but {META} lists it as the {entry['estimator']} predictor of {key} (differs in "
            f"{', '.join(wrong)}): a predictor file was renamed or copied over another; restore the set "
            "or re-fit with opcast train fit"
        )


def _file_record(file: Path) -> dict[str, Any] | None:
    """The record saved in a numpy archive (reading that member only), or None without one."""
    arrays = read_arrays(file, names=(RECORD_KEY,))
    return parse_record(arrays[RECORD_KEY], file) if RECORD_KEY in arrays else None


META_MAX_BYTES: Final = 64 << 20
"""Largest meta.json opcast reads (the default set's is ~0.3 MB): a bigger file is not one it wrote,
and is refused before it is read into memory."""


def _read_meta(
    meta_path: Path, what: str = "a model set's meta.json", fix: str = "re-fit with opcast train fit"
) -> Any:
    """The parsed JSON of ``meta_path`` (a set's meta.json, or ``what``: one of its side files, which
    have smaller bounds of their own); any problem reading or parsing it is one :class:`OpcastError`
    line that ends with ``fix``."""
    try:
        data = read_capped(meta_path, META_MAX_BYTES)
    except OSError as err:
        raise OpcastError(f"{meta_path}: cannot be read ({err.strerror}); fix its permissions or {fix}") from None
    if len(data) > META_MAX_BYTES:
        raise OpcastError(
            f"{meta_path}: larger than {META_MAX_BYTES >> 20} MiB, not {what} opcast writes; restore it or {fix}"
        )
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise OpcastError(f"{meta_path}: not UTF-8 text; it is corrupt, restore it or {fix}") from None
    except json.JSONDecodeError as err:
        raise OpcastError(
            f"{meta_path}: not valid JSON ({err.msg} at line {err.lineno}); it was edited or truncated, {fix}"
        ) from None
    except RecursionError:
        raise OpcastError(f"{meta_path}: nested too deeply to be {what}; {fix}") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise OpcastError(f"{meta_path}: holds an integer of thousands of digits, not {what}; {fix}") from None


def load_model_set(path: str | Path | None = None) -> ModelSet:
    """Load and verify a model set (``None``: the embedded default). The folder may be the set
    itself or a folder holding exactly one set. A missing, tampered, swapped or unreadable file,
    a meta.json field of the wrong type, a pickled predictor, an unknown layout, changed feature
    definitions or a too old library raise :class:`OpcastError` in one line. No code from the
    set runs (see the module docstring)."""
    root = _resolve(Path(path) if path is not None else default_models_path())
    meta_path = root / META
    meta = _read_meta(meta_path)
    if not isinstance(meta, dict) or "format_version" not in meta or "predictors" not in meta:
        raise OpcastError(
            f"{meta_path} is not an opcast model set (no format_version/predictors); re-fit with opcast train fit"
        )
    if meta.get("meta_sha256") != _meta_digest(meta):
        raise OpcastError(
            f"{meta_path} was modified after fitting (its sha256 does not match); restore it "
            "(e.g. git checkout) or re-fit with opcast train fit"
        )
    if _is_int(meta["format_version"]) and meta["format_version"] > FORMAT_VERSION:
        raise OpcastError(
            f"{root}: model-set format {meta['format_version']} is newer than this opcast reads "
            f"({FORMAT_VERSION}); upgrade opcast"
        )
    check_meta(meta, meta_path)
    if meta["features_version"] != FEATURES_VERSION:
        raise OpcastError(
            f"{root}: fitted on feature definitions v{meta['features_version']}, this opcast computes "
            f"v{FEATURES_VERSION}; re-fit with opcast train fit"
        )
    files = meta["files"]
    for name in files:
        suffix = Path(name).suffix
        if suffix in PICKLE_SUFFIXES:
            raise OpcastError(
                f"{root / name} is a pickled predictor (an opcast <= 0.1 set), which opcast never loads "
                "because unpickling can run code; re-fit the set with opcast train fit"
            )
        if suffix not in ARTIFACT_SUFFIXES:
            raise OpcastError(
                f"{root / name}: opcast reads predictor files of type {', '.join(ARTIFACT_SUFFIXES)} only, "
                f"not {suffix or 'without a suffix'}; re-fit with opcast train fit"
            )
    for group, whole in meta["predictors"].items():
        for key, entry in _parts(group, whole):
            name = entry["file"]
            if name not in files:
                raise OpcastError(f"{meta_path}: predictor {key} names {name!r}, which has no recorded sha256; re-fit")
            kind = group.rsplit("-", 2)[0]
            unknown = [f for f in entry["features"] if f not in FEATURES[kind]]
            if unknown:
                raise OpcastError(
                    f"{root}: predictor {key} uses feature(s) {', '.join(unknown)[:200]} that this opcast does not "
                    "compute; re-fit with opcast train fit"
                )
    for name, digest in files.items():
        file = root / name
        try:
            if not file.is_file():
                raise OpcastError(f"{file} is missing from the model set; restore it or re-fit with opcast train fit")
            actual = sha256_file(file)
        except OSError as err:
            raise OpcastError(
                f"{file} cannot be read ({err.strerror}); fix its permissions (chmod a+r) or re-fit "
                "with opcast train fit"
            ) from None
        if actual != digest:
            raise OpcastError(
                f"{file} does not match the sha256 in {META} (tampered or corrupt); restore it "
                "or re-fit with opcast train fit"
            )
    required = _record_required(meta)
    parts = [part for group, whole in meta["predictors"].items() for part in _parts(group, whole)]
    for key, entry in parts:
        file = root / entry["file"]
        if file.suffix == ".npz":  # a .pt's record is checked when it is loaded (that needs torch)
            _check_record(_file_record(file), key, entry, file, required)
    installed = library_versions()
    used = {_LIB_OF_ESTIMATOR[e["estimator"]] for _, e in parts}
    for lib in sorted(used):
        fitted = meta.get("versions", {}).get(lib)
        have = installed.get(lib)
        if have is None:
            raise OpcastError(f"{root} needs {lib} (fitted with {fitted}), which is not installed; pip install {lib}")
        if fitted and _major(have) < _major(fitted):
            raise OpcastError(
                f"{root} was fitted with {lib} {fitted} but {have} is installed; "
                f"pip install '{lib}>={_major(fitted)}' or re-fit with opcast train fit"
            )
    return ModelSet(name=str(meta.get("name", root.name)), path=root, meta=meta)


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def check_output(out: str | Path, name: str) -> Path:
    """Check, before any fitting, that ``out/name/`` can be written: ``name`` is a plain folder
    name, ``out`` is (or can be created as) a writable folder, and ``out/name`` is absent or a
    model set (which the new one replaces). Returns ``out/name``; a one-line OpcastError otherwise,
    so nothing the user already has is overwritten."""
    plain = bool(name.strip()) and name == name.strip() and len(name) <= 100 and name.isprintable()
    if not plain or "/" in name or "\\" in name or name.startswith("."):
        raise OpcastError(
            f"--name {name[:60]!r} must be a plain folder name (no / or \\, no leading . or space, no "
            "trailing space, at most 100 characters)"
        )
    from opcast.atomic import output_folder_problem

    out = Path(out)
    final = out / name
    problem = output_folder_problem("--out", out, holds=f"the set is written to OUT/{name}/")
    if problem:
        raise OpcastError(problem)
    try:
        if final.exists() and not (final.is_dir() and (final / META).is_file()):
            kind = "folder that is not a model set" if final.is_dir() else "file"
            raise OpcastError(
                f"{final} exists and is a {kind}; it would be replaced, so choose another --name or --out "
                "(or remove it yourself)"
            )
    except OSError as err:
        raise OpcastError(
            f"--out {out} cannot be inspected ({err.strerror}); choose a readable, writable folder"
        ) from None
    return final


def install_set(staged: Path, final: Path) -> None:
    """Replace the folder ``final`` (absent, or a model set) by the folder ``staged`` beside it: the
    old set is moved aside, the new one in, then the old one removed. An interrupt or error between
    the two moves puts the old set back (it was left hidden as ``.NAME.old-PID``, with nothing at
    ``final``)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    try:
        staged.rename(final)
    except BaseException:
        if old is not None:
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_model_set(
    out: Path,
    name: str,
    fitted: Mapping[str, tuple[Any, dict[str, Any]]],
    meta: dict[str, Any],
    collectives: Any = None,
) -> Path:
    """Write ``out/name/`` atomically: each (estimator, entry) of ``fitted`` (group key -> ...)
    saved to ``<group><suffix>`` with its record (group, estimator, features), then ``meta.json``
    with every file's sha256, then the set's ``collectives`` laws (:func:`write_collectives`), if
    any, all before the new set replaces the old one: a file that would not load stops the write
    with the old set whole. An existing model set of that name is replaced; anything else there is
    refused (:func:`check_output`)."""
    from opcast.atomic import sigterm_as_interrupt

    with sigterm_as_interrupt():  # a SIGTERM mid-write removes the half-written folder, as Ctrl-C does
        out = Path(out)
        final = check_output(out, name)
        try:
            out.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
        except OSError as err:
            raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
        try:
            predictors: dict[str, Any] = {}
            files: dict[str, str] = {}
            for key, (est, entry) in sorted(fitted.items()):
                own = getattr(est, "primary", est)  # a Blend's (or a SeenSplit's Blend's) first part is the own file
                record = {"group": key, "estimator": own.name, "features": list(own.feature_names)}
                path = own.save(tmp / key, record=record)
                files[path.name] = sha256_file(path)
                predictors[key] = {
                    **entry,
                    "file": path.name,
                    "estimator": own.name,
                    "features": list(own.feature_names),
                    "config": own.config(),
                }
                # a SeenSplit: the training devices' own estimator, another vendors'; a Blend: its second part
                for field, suffix in PARTS:
                    part = getattr(est, field, None)
                    if part is None or part is own or part is getattr(est, "unseen", None):
                        continue
                    stem = key + suffix
                    record = {"group": stem, "estimator": part.name, "features": list(part.feature_names)}
                    path = part.save(tmp / stem, record=record)
                    files[path.name] = sha256_file(path)
                    predictors[key][field] = {
                        **entry.get(field, {}),
                        "file": path.name,
                        "estimator": part.name,
                        "features": list(part.feature_names),
                        "config": part.config(),
                    }
            body = {
                "format_version": FORMAT_VERSION,
                "name": name,
                "features_version": FEATURES_VERSION,
                "versions": library_versions(),
                **meta,
                "predictors": predictors,
                "files": files,
            }
            body["meta_sha256"] = _meta_digest(json.loads(json.dumps(body, default=str)))
            (tmp / META).write_text(json.dumps(body, indent=1, sort_keys=False, default=str) + "\n")
            if collectives is not None:
                write_collectives(tmp, collectives)
            install_set(tmp, final)
            os.chmod(final, 0o755)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final


# --------------------------------------------------------------------------- learned collectives

COLLECTIVES_FILE: Final = "collectives.json"
"""The per-cluster collective laws of a set (:mod:`opcast.train.collectives`), beside meta.json."""
COLLECTIVES_MAX_BYTES: Final = 4 << 20


def _is_finite_nonneg(v: Any) -> bool:
    return _is_finite(v) and v >= 0


def _is_bandwidth(v: Any) -> bool:
    return _is_finite(v) and v > 0


def _is_pair_list(first: Callable[[Any], bool], second: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: (
        isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and first(p[0]) and second(p[1]) for p in v)
    )


def _is_count(v: Any) -> bool:
    return _is_int(v) and v >= 1


_CLUSTER_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,80}")

CURVES_MAX: Final = 256
"""Most topologies, and most points of one topology's curve, a law's ``curves`` may hold."""


def _is_curve(v: Any) -> bool:
    """[nodes, ranks per node, points]: counts, then :func:`_is_points`."""
    return isinstance(v, list) and len(v) == 3 and _is_count(v[0]) and _is_count(v[1]) and _is_points(v[2])


def _is_points(points: Any) -> bool:
    """At most :data:`CURVES_MAX` finite [x, y] pairs with x strictly ascending and |y| <= 20 (a
    factor of e**20 is no correction): a law's curve or a transfer curve."""
    if not (isinstance(points, list) and 0 < len(points) <= CURVES_MAX):
        return False
    if not _is_pair_list(_is_finite, lambda y: _is_finite(y) and abs(y) <= 20)(points):
        return False
    return all(a[0] < b[0] for a, b in pairwise(points))


COLLECTIVES_FIELDS: Final[dict[str, _Field]] = {
    "format": (True, lambda v: v == "opcast-collectives", "'opcast-collectives'"),
    "format_version": (True, lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "set_meta_sha256": (True, lambda v: _is_str(v) and bool(_SHA256.fullmatch(v)), "a sha256 hex digest"),
    "sha256": (True, lambda v: _is_str(v) and bool(_SHA256.fullmatch(v)), "a sha256 hex digest"),
    "clusters": (True, _dict_of(lambda v: isinstance(v, dict)), "an object of cluster -> object of kind -> law"),
    "held_out": (False, _list_of(lambda v: isinstance(v, dict)), "a list of objects"),
    "skipped": (False, _dict_of(_is_int), "an object of reason -> count"),
    "transfer": (
        False,
        lambda v: isinstance(v, list) and len(v) <= CURVES_MAX and all(isinstance(c, dict) for c in v),
        f"a list of at most {CURVES_MAX} transfer-curve objects",
    ),
}
"""What :func:`check_collectives` requires of ``collectives.json`` (no other key is allowed)."""

TRANSFER_FIELDS: Final[dict[str, _Field]] = {
    "tier": (True, lambda v: v in ("nvlink", "pci"), "'nvlink' or 'pci'"),
    "architecture": (True, lambda v: v is None or (_is_str(v) and 0 < len(v) <= 40), "null or an architecture name"),
    "node_gpus": (True, lambda v: v is None or _is_count(v), "null or an integer >= 1"),
    "kind": (True, lambda v: v in _collective_kinds(), "a collective kind"),
    "per_node": (True, _is_count, "an integer >= 1"),
    "clusters": (True, _list_of(lambda v: _is_str(v) and bool(_CLUSTER_KEY.fullmatch(v))), "a list of cluster names"),
    "points": (True, _is_points, "a list of [log2 bytes, log ratio] pairs, ascending"),
}
"""What :func:`check_collectives` requires of each ``transfer`` curve (no other key is allowed)."""


def _collective_kinds() -> tuple[str, ...]:
    from opcast.train.collectives import KINDS

    return KINDS


LAW_FIELDS: Final[dict[str, _Field]] = {
    "base_s": (True, _is_finite_nonneg, "a finite number >= 0 (seconds)"),
    "step_intra_s": (True, lambda v: v is None or _is_finite_nonneg(v), "null or a finite number >= 0 (seconds)"),
    "step_net_s": (True, lambda v: v is None or _is_finite_nonneg(v), "null or a finite number >= 0 (seconds)"),
    "intra_bw_bytes_per_s": (True, _is_pair_list(_is_count, _is_bandwidth), "a list of [ranks per node, bytes/s > 0]"),
    "net_bw_bytes_per_s": (True, lambda v: v is None or _is_bandwidth(v), "null or a finite number > 0 (bytes/s)"),
    "net_ranks_exponent": (True, lambda v: _is_num(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "rows": (True, _is_count, "an integer >= 1"),
    "bytes_min": (True, _is_count, "an integer >= 1"),
    "bytes_max": (True, _is_count, "an integer >= 1"),
    "topologies": (True, _is_pair_list(_is_count, _is_count), "a list of [nodes, ranks per node]"),
    "kernel_timed": (False, lambda v: isinstance(v, bool), "true or false"),
    "curves": (
        False,
        lambda v: isinstance(v, list) and len(v) <= CURVES_MAX and all(_is_curve(c) for c in v),
        f"a list of at most {CURVES_MAX} [nodes, ranks per node, [[log2 bytes, log ratio], ...] ascending]",
    ),
}
"""What :func:`check_collectives` requires of each law (no other key is allowed)."""


def _body_digest(body: Mapping[str, Any]) -> str:
    """The sha256 of a side file's fields but its own ``sha256`` (``collectives.json``, ``adapt/*.json``)."""
    return hashlib.sha256(
        json.dumps({k: v for k, v in body.items() if k != "sha256"}, sort_keys=True).encode()
    ).hexdigest()


@dataclass(frozen=True, slots=True)
class _SideFile:
    """A JSON file a model set carries beside meta.json, bound to it (``set_meta_sha256``) and to its
    own content (``sha256``): what :func:`_write_side_file` and :func:`_read_side_file` need to say."""

    what: str
    """The file in a sentence ("a collectives file")."""
    max_bytes: int
    check: Callable[[Any, Path], None]
    """Every field, one :class:`OpcastError` line on the first problem."""
    modified: str
    """How a file whose digest does not match is described."""
    foreign: str
    """How a file of another set is described."""
    redo: str
    """How to make a new one."""
    redo_here: str
    """How to make a new one for this set."""
    no_set_fix: str
    """What to do when the target folder is not a model set."""
    write_fix: str
    """What to do when the file cannot be written."""


def _write_side_file(
    set_path: str | Path, body: Mapping[str, Any], kind: _SideFile, name: Callable[[dict], Path]
) -> Path:
    """Write ``body`` into the set at ``set_path`` (at ``name(data)`` below it) atomically, bound to
    that set's meta.json by ``set_meta_sha256`` and to its own content by ``sha256``, checked as a
    reader would check it before it is written."""
    from opcast.atomic import replace_with, temp_beside

    root = Path(set_path)
    meta = _read_meta(root / META)
    if not isinstance(meta, dict) or not _is_str(meta.get("meta_sha256")):
        raise OpcastError(f"{root} is not an opcast model set (no meta.json digest); {kind.no_set_fix}")
    data = json.loads(json.dumps({**body, "set_meta_sha256": meta["meta_sha256"]}))
    data["sha256"] = _body_digest(data)
    target = root / name(data)
    kind.check(data, target)  # what is written must load
    try:
        tmp = temp_beside(target)
        return replace_with(tmp, target, lambda t: Path(t).write_text(json.dumps(data, indent=1) + "\n"))
    except OSError as err:  # named as the target, not the temporary file (replace_with removed it)
        raise OpcastError(f"cannot write {target}: {err.strerror}; {kind.write_fix}") from None


def _read_side_file(model_set: ModelSet, path: Path, kind: _SideFile) -> dict | None:
    """The checked fields of ``path``, a side file of ``model_set``, or None when it is absent; any
    problem (too large, unreadable, a bad field, edited, another set's) is one :class:`OpcastError`."""
    try:
        if not path.is_file():
            if not (path.exists() or path.is_symlink()):
                return None
            what = "a link to nothing" if not path.exists() else "a folder" if path.is_dir() else "not a file"
            raise OpcastError(  # not left out silently: the set would answer without it
                f"{path} is {what}, not {kind.what}; remove it or {kind.redo}"
            )
        if path.stat().st_size > kind.max_bytes:
            raise OpcastError(
                f"{path} is larger than {kind.max_bytes >> 20} MiB, not {kind.what} opcast writes; {kind.redo}"
            )
    except OSError as err:
        raise OpcastError(f"{path} cannot be read ({err.strerror}); fix its permissions") from None
    data = _read_meta(path, kind.what, kind.redo)
    kind.check(data, path)
    if data["sha256"] != _body_digest(data):
        raise OpcastError(f"{path} {kind.modified} (its sha256 does not match); {kind.redo}")
    if data["set_meta_sha256"] != model_set.meta.get("meta_sha256"):
        raise OpcastError(f"{path} {kind.foreign} (its set_meta_sha256 is not this set's meta.json); {kind.redo_here}")
    return data


def check_collectives(data: Any, where: str | Path = COLLECTIVES_FILE) -> None:
    """Check every field of a parsed ``collectives.json`` (unknown keys included); the first
    problem is one :class:`OpcastError` line naming it."""
    from opcast.train.collectives import FORMAT_VERSION as COLLECTIVES_FORMAT
    from opcast.train.collectives import KINDS

    fix = "restore the set or re-fit with opcast train fit"
    if not isinstance(data, dict):
        raise OpcastError(f"{where} holds a JSON {type(data).__name__}, not an object; {fix}")
    unknown = sorted(set(data) - set(COLLECTIVES_FIELDS))
    if unknown:
        raise OpcastError(f"{where}: unknown field {_brief(unknown[0])}; {fix}")
    _check_fields(data, COLLECTIVES_FIELDS, str(where), "")
    if data["format_version"] > COLLECTIVES_FORMAT:
        raise OpcastError(
            f"{where}: format {data['format_version']} is newer than this opcast reads ({COLLECTIVES_FORMAT}); "
            "upgrade opcast"
        )
    for cluster, kinds in data["clusters"].items():
        if not _CLUSTER_KEY.fullmatch(cluster):
            raise OpcastError(f"{where}: cluster {_brief(cluster)} is not a plain cluster name; {fix}")
        for kind, law in kinds.items():
            prefix = f"clusters[{cluster!r}][{kind[:30]!r}]."
            if kind not in KINDS:
                raise OpcastError(f"{where}: {prefix[:-1]} is not a collective ({', '.join(KINDS)}); {fix}")
            if not isinstance(law, dict):
                raise OpcastError(f"{where}: {prefix[:-1]} must be an object, got {_show(law)}; {fix}")
            extra = sorted(set(law) - set(LAW_FIELDS))
            if extra:
                raise OpcastError(f"{where}: {prefix}{extra[0][:40]} is not a field of a collective law; {fix}")
            _check_fields(law, LAW_FIELDS, str(where), prefix)
            if law["bytes_max"] < law["bytes_min"]:
                raise OpcastError(f"{where}: {prefix}bytes_max is below bytes_min; {fix}")
    for i, curve in enumerate(data.get("transfer", ())):
        extra = sorted(set(curve) - set(TRANSFER_FIELDS))
        if extra:
            raise OpcastError(f"{where}: transfer[{i}].{extra[0][:40]} is not a field of a transfer curve; {fix}")
        _check_fields(curve, TRANSFER_FIELDS, str(where), f"transfer[{i}].")


def write_collectives(set_path: str | Path, models: Any) -> Path:
    """Write ``collectives.json`` (:class:`opcast.train.collectives.CollectiveModels`) into the
    model set at ``set_path`` atomically, bound to that set's meta.json by its ``meta_sha256``
    (a file copied from another fit is refused on load) and to its own content by ``sha256``."""
    from opcast.train.collectives import models_to_dict

    return _write_side_file(set_path, models_to_dict(models), _COLLECTIVES, lambda _: Path(COLLECTIVES_FILE))


def load_collectives(model_set: ModelSet) -> Any:
    """The set's learned collective laws (:class:`opcast.train.collectives.CollectiveModels`), or
    None when it has none. Validated field by field and bound to the set; any problem is one
    :class:`OpcastError` line. Only parsed: nothing in it runs."""
    from opcast.train.collectives import models_from_dict

    data = _read_side_file(model_set, Path(model_set.path) / COLLECTIVES_FILE, _COLLECTIVES)
    return None if data is None else models_from_dict(data)


# --------------------------------------------------------------------------- per-device adaptations

ADAPT_DIR: Final = "adapt"
"""Folder of a set holding its per-device adaptations (:mod:`opcast.train.adapt`), one
``<device>.json`` each, beside meta.json."""
ADAPT_FORMAT_VERSION: Final = 3
"""1: levels and size slopes; 2: a group may carry a ``shape`` term; 3: a group may carry an
``analogue`` term (each read by this opcast, and written only when one was fitted, so a file without
it stays readable by older ones)."""
ADAPT_MAX_BYTES: Final = 1 << 20
ADAPT_SHAPE_MAX_ANCHORS: Final = 4000
"""Most measured rows one group's ``shape`` term may carry (the writer keeps far fewer)."""


MISALIGNED_SUFFIX: Final = "_misaligned"
"""Added to a predictor group's key for the rows of an adaptation that are tensor-core GEMMs cuBLAS runs through
its slower kernels (:func:`opcast.ops.misaligned_tensor_gemm`): ``gemm-fwd-half_misaligned`` gets its own level,
slope and shape terms, so a fifth of ``collect bench``'s GEMM shapes, left odd on purpose, no longer pulls the
aligned ones' correction (on the H200 they pulled it 26.9 -> 34.6 % MAPE at 200 rows; ``benchmarks/few_shot.py``)."""


def misaligned_rows(rows: Any) -> np.ndarray:
    """Whether each row (a DataFrame, a :class:`Table` or a mapping of column -> array, with ``op``, ``dtype``,
    ``tensor_cores``, ``n`` and ``k``) is a misaligned tensor-core GEMM (:func:`opcast.ops.misaligned_tensor_gemm`;
    a row whose ``tensor_cores`` is missing is not)."""
    from opcast.ops import misaligned_tensor_gemm
    from opcast.train.features import _flags, _n_rows

    cols = columns_of(rows)
    n = _n_rows(cols)
    none = np.full(n, None, dtype=object)
    flags = _flags(cols, n)
    return np.array(
        [
            op == "gemm" and flag == 1 and misaligned_tensor_gemm(nn, kk, str(dt), True)
            for op, dt, flag, nn, kk in zip(
                cols["op"].tolist(),
                cols["dtype"].tolist(),
                flags.tolist(),
                cols.get("n", none).tolist(),
                cols.get("k", none).tolist(),
            )
        ],
        dtype=bool,
    )


def adaptation_keys(keys: np.ndarray, misaligned: np.ndarray, groups: Any = None) -> np.ndarray:
    """Each row's group in an adaptation: its predictor group ``keys``, with :data:`MISALIGNED_SUFFIX` where
    ``misaligned`` -- when ``groups`` (an adaptation's fitted groups) is given, only where it has that group, so
    an adaptation fitted without such rows corrects them as their predictor group, as before."""
    out = np.asarray(keys, dtype=object).copy()
    for i in np.flatnonzero(np.asarray(misaligned, dtype=bool)):
        sub = f"{out[i]}{MISALIGNED_SUFFIX}"
        if groups is None or sub in groups:
            out[i] = sub
    return out


def shape_params(group: str) -> tuple[str, ...]:
    """The parameters of ``group``'s op whose logs a ``shape`` term reads: its integer ones (a GEMM's
    b, m, n, k; a softmax's rows, cols), collectives' message bytes excluded."""
    from opcast.ops import get_op

    return tuple(p.name for p in get_op(group.rsplit("-", 2)[0]).params if p.type is int and p.name != "bytes")


def _shape_term_problem(v: Any, group: str) -> str | None:
    """What is wrong with a group's ``shape`` term (None: nothing): an object of ``features`` (a
    non-empty subset of :func:`shape_params`), ``length`` (> 0, in e-folds of each parameter),
    ``anchors`` (rows of as many finite log values) and ``weights`` (one finite number each)."""
    if not isinstance(v, dict) or set(v) != {"features", "length", "anchors", "weights"}:
        return "must be an object of exactly features, length, anchors, weights"
    names, length, anchors, weights = v["features"], v["length"], v["anchors"], v["weights"]
    allowed = shape_params(group)
    if not (isinstance(names, list) and 0 < len(names) <= len(allowed) and len(set(names)) == len(names)):
        return f"features must be a list of distinct parameters of the op ({', '.join(allowed)})"
    if not all(_is_str(n) and n in allowed for n in names):
        return f"features must be parameters of the op ({', '.join(allowed)})"
    if not (_is_finite(length) and 0.01 <= length <= 100):
        return "length must be a finite number in [0.01, 100]"
    if not (isinstance(anchors, list) and isinstance(weights, list) and 0 < len(anchors) == len(weights)):
        return "anchors and weights must be lists of the same non-zero length"
    if len(anchors) > ADAPT_SHAPE_MAX_ANCHORS:
        return f"carries more than {ADAPT_SHAPE_MAX_ANCHORS} anchors"
    if not all(isinstance(a, list) and len(a) == len(names) and all(_is_finite(x) for x in a) for a in anchors):
        return f"anchors must be lists of {len(names)} finite numbers"
    if not all(_is_finite(w) and abs(w) <= 100 for w in weights):
        return "weights must be finite numbers in [-100, 100]"
    return None


ADAPT_ANALOGUE_MAX_DEVICES: Final = 64
ADAPT_ANALOGUE_MAX_COEF: Final = 50.0
"""Largest magnitude of an ``analogue`` term's coefficients: the reader refuses more, and the writer
(:func:`opcast.train.adapt.fit_analogues`) keeps no term past it."""


def _analogue_term_problem(v: Any) -> str | None:
    """What is wrong with a group's ``analogue`` term (None: nothing): an object of ``devices`` (1 to
    :data:`ADAPT_ANALOGUE_MAX_DEVICES` distinct device names), ``coef`` (``2 + len(devices)`` finite
    numbers: the intercept, the weight of the device's own log time, one weight per device) and
    ``ridge`` (the penalty it was fitted with, > 0)."""
    if not isinstance(v, dict) or set(v) != {"devices", "coef", "ridge"}:
        return "must be an object of exactly devices, coef, ridge"
    names, coef = v["devices"], v["coef"]
    if not (isinstance(names, list) and 0 < len(names) <= ADAPT_ANALOGUE_MAX_DEVICES):
        return f"devices must be a list of 1 to {ADAPT_ANALOGUE_MAX_DEVICES} device names"
    if not all(_is_line(n) and bool(n) for n in names) or len(set(names)) != len(names):
        return "devices must be distinct device names"
    if not (
        isinstance(coef, list)
        and len(coef) == 2 + len(names)
        and all(_is_finite(c) and abs(c) <= ADAPT_ANALOGUE_MAX_COEF for c in coef)
    ):
        return (
            f"coef must be {2 + len(names)} finite numbers in [-{ADAPT_ANALOGUE_MAX_COEF:g}, "
            f"{ADAPT_ANALOGUE_MAX_COEF:g}] (intercept, own, one per device)"
        )
    if not (_is_finite(v["ridge"]) and v["ridge"] > 0):
        return "ridge must be a finite number > 0"
    return None


def _is_pair_of_positive(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_is_bandwidth(x) for x in v) and v[0] <= v[1]


ADAPT_FIELDS: Final[dict[str, _Field]] = {
    "format": (True, lambda v: v == "opcast-adaptation", "'opcast-adaptation'"),
    "format_version": (True, lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "device": (True, lambda v: _is_line(v) and bool(v), "a device name"),
    "set_meta_sha256": (True, lambda v: _is_str(v) and bool(_SHA256.fullmatch(v)), "a sha256 hex digest"),
    "sha256": (True, lambda v: _is_str(v) and bool(_SHA256.fullmatch(v)), "a sha256 hex digest"),
    "rows": (True, _is_count, "an integer >= 1"),
    "prior_rows": (True, _dict_of(_is_finite_nonneg), "an object of level -> prior strength >= 0"),
    "t_ref_s": (True, _is_bandwidth, "a finite number > 0 (seconds)"),
    "pred_s_range": (True, _is_pair_of_positive, "[min, max] seconds, 0 < min <= max"),
    "log_factor": (True, lambda v: _is_finite(v) and abs(v) <= 5, "a finite number in [-5, 5]"),
    "slope": (True, lambda v: _is_finite(v) and abs(v) <= 2, "a finite number in [-2, 2]"),
    "groups": (True, _dict_of(lambda v: isinstance(v, dict)), "an object of group -> correction object"),
    "datasets": (False, _list_of(lambda d: isinstance(d, dict)), "a list of objects"),
    "command": (False, lambda v: _is_str(v) and len(v) <= 4000, "a string"),
    "created_utc": (False, _is_line, "a short printable string"),
    "cross_validated": (False, lambda v: v is None or isinstance(v, dict), "an object or null"),
}
"""What :func:`check_adaptation` requires of ``adapt/<device>.json`` (no other key is allowed)."""

ADAPT_GROUP_FIELDS: Final[dict[str, _Field]] = {
    "rows": (True, _is_count, "an integer >= 1"),
    "log_factor": (True, lambda v: _is_finite(v) and abs(v) <= 5, "a finite number in [-5, 5]"),
    "slope": (True, lambda v: _is_finite(v) and abs(v) <= 2, "a finite number in [-2, 2]"),
    "shape": (False, lambda v: isinstance(v, dict), "an object (checked by _shape_term_problem)"),
    "analogue": (False, lambda v: isinstance(v, dict), "an object (checked by _analogue_term_problem)"),
}
"""What :func:`check_adaptation` requires of each group's correction (no other key is allowed)."""


def adaptation_file(device_name: str) -> str:
    """The file name of ``device_name``'s adaptation in a set's :data:`ADAPT_DIR`: the name with
    every character outside ``[A-Za-z0-9_.+-]`` replaced by ``_`` (the file records the exact name)."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", device_name)[:120]
    return f"{'_' if not safe or safe.startswith('.') else ''}{safe}.json"


class Adaptation:
    """A fitted per-device correction of a set's learned times (:mod:`opcast.train.adapt`), numpy only:
    ``log(t) = log(t_learned) + a + a_g + (c + c_g) * z + s_g(x)`` with ``z = log(t_learned / t_ref_s)``
    held inside the range of the rows it was fitted on; groups it never measured take the device
    terms. ``s_g`` (a group's optional ``shape`` term) is a kernel smoother of what the other terms
    left on the group's measured rows: ``sum_i w_i exp(-|x - x_i|^2 / (2 length^2))`` over its
    anchors ``x_i`` (the logs of the rows' op parameters), clipped to +-log 4; it fades to 0 away
    from the measured shapes.

    A group's optional ``analogue`` term replaces ``t_learned`` first, before every term above:
    ``log t = b_0 + b_own log t_own + sum_d b_d log t_d``, where ``t_own`` is the set's answer on
    this device's specs and ``t_d`` its answer for the same kernel on training device ``d``'s
    (:func:`opcast.train.adapt.fit_analogues`); a row missing one of those answers keeps ``t_own``."""

    __slots__ = ("data", "path")

    def __init__(self, data: Mapping[str, Any], path: Path | None = None) -> None:
        self.data = dict(data)
        self.path = path

    @property
    def device(self) -> str:
        return str(self.data["device"])

    @property
    def rows(self) -> int:
        return int(self.data["rows"])

    @property
    def label(self) -> str:
        """How a time it corrected is labelled: ``learned+adapted(n=ROWS)``."""
        return f"learned+adapted(n={self.rows})"

    @property
    def analogue_devices(self) -> tuple[str, ...]:
        """The training devices whose answers the groups' ``analogue`` terms read (sorted; empty: none)."""
        names = {d for g in self.data["groups"].values() for d in (g.get("analogue") or {}).get("devices", ())}
        return tuple(sorted(names))

    def analogue_s(
        self, keys: np.ndarray | list[str], pred_s: np.ndarray, analogue_s: Mapping[str, np.ndarray] | None
    ) -> np.ndarray:
        """``pred_s`` with each row of a group that has an ``analogue`` term replaced by that term's
        time; ``analogue_s`` maps each of :attr:`analogue_devices` to the set's answers for the same
        rows on that device (raises :class:`OpcastError` when one is missing)."""
        pred = np.asarray(pred_s, dtype=float)
        devices = self.analogue_devices  # a pass over the groups: once a call
        if not devices:
            return pred
        missing = [d for d in devices if analogue_s is None or d not in analogue_s]
        if missing:
            raise OpcastError(
                f"the adaptation to {self.device} reads the set's answers on {', '.join(missing)}, which were not "
                "given; re-run opcast train adapt with this opcast"
            )
        assert analogue_s is not None
        keys = np.asarray(keys, dtype=object)
        out = pred.copy()
        for key, group in self.data["groups"].items():
            term = group.get("analogue")
            rows = np.flatnonzero(keys == key) if term else ()
            if not len(rows):
                continue
            cols = [pred[rows], *(np.asarray(analogue_s[d], dtype=float)[rows] for d in term["devices"])]
            x = np.column_stack(cols)
            ok = np.isfinite(x).all(axis=1) & (x > 0).all(axis=1)
            coef = np.asarray(term["coef"], dtype=float)
            logs = np.log(np.where(ok[:, None], x, 1.0))
            out[rows] = np.where(ok, np.exp(np.clip(coef[0] + logs @ coef[1:], -50.0, 50.0)), pred[rows])
        return out

    @property
    def needs_params(self) -> bool:
        """Whether a group carries a ``shape`` term (then :meth:`apply` wants the rows' parameters)."""
        return any("shape" in g for g in self.data["groups"].values())

    def log_factor(self, keys: np.ndarray | list[str], pred_s: np.ndarray, params: Any = None) -> np.ndarray:
        """``log(adapted / learned)`` of each row (group key, learned seconds); 0 where ``pred_s``
        is not a positive finite time. ``params``: the rows' op parameters (a DataFrame, a
        :class:`opcast.train.features.Table` or a mapping of column -> array), which the groups'
        ``shape`` terms read; None leaves those terms out."""
        pred = np.asarray(pred_s, dtype=float)
        ok = np.isfinite(pred) & (pred > 0)
        lo, hi = self.data["pred_s_range"]
        z = np.log(np.clip(np.where(ok, pred, lo), lo, hi) / float(self.data["t_ref_s"]))
        groups = self.data["groups"]
        a = np.array([groups[k]["log_factor"] if k in groups else 0.0 for k in keys], dtype=float)
        c = np.array([groups[k]["slope"] if k in groups else 0.0 for k in keys], dtype=float)
        out = float(self.data["log_factor"]) + a + (float(self.data["slope"]) + c) * z
        if params is not None and self.needs_params:
            out = out + self.shape_log_factor(keys, params)
        return np.where(ok, out, 0.0)

    def shape_log_factor(self, keys: np.ndarray | list[str], params: Any) -> np.ndarray:
        """The groups' ``shape`` terms of each row (0 for a row of a group without one, or missing
        one of its parameters)."""
        keys = np.asarray(keys, dtype=object)
        out = np.zeros(len(keys))
        for key, group in self.data["groups"].items():
            term = group.get("shape")
            rows = np.flatnonzero(keys == key) if term else ()
            if not len(rows):
                continue
            q = np.empty((len(rows), len(term["features"])))
            for j, name in enumerate(term["features"]):
                col = params.get(name)
                vals = np.full(len(keys), np.nan) if col is None else _as_float_array(col)
                q[:, j] = np.log(np.maximum(vals[rows], 1.0))
            out[rows] = _smooth(q, term)
        return out

    def apply(
        self,
        keys: np.ndarray | list[str],
        pred_s: np.ndarray,
        params: Any = None,
        analogue_s: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """``pred_s`` (learned seconds of rows of groups ``keys``, with their op ``params`` for the
        ``shape`` terms and, for the ``analogue`` terms, the set's answers for the same rows on each of
        :attr:`analogue_devices`) corrected for this device."""
        base = self.analogue_s(keys, pred_s, analogue_s)
        return base * np.exp(self.log_factor(keys, base, params))

    def __repr__(self) -> str:
        return f"Adaptation({self.device!r}, {self.rows} rows, {len(self.data['groups'])} groups)"


_SHAPE_CLIP: Final = float(np.log(4.0))


def _smooth(q: np.ndarray, term: Mapping[str, Any], chunk: int = 2048) -> np.ndarray:
    """A ``shape`` term at the rows ``q`` (logs of its features), clipped; 0 where a row has a NaN."""
    anchors = np.asarray(term["anchors"], dtype=float) / float(term["length"])
    weights = np.asarray(term["weights"], dtype=float)
    q = q / float(term["length"])
    a2 = (anchors**2).sum(axis=1)
    out = np.empty(len(q))
    for start in range(0, len(q), chunk):  # bounded memory for long kernel lists
        part = q[start : start + chunk]
        d2 = np.maximum((part**2).sum(axis=1)[:, None] + a2[None, :] - 2.0 * part @ anchors.T, 0.0)
        out[start : start + chunk] = np.exp(-0.5 * d2) @ weights
    return np.clip(np.nan_to_num(out, nan=0.0), -_SHAPE_CLIP, _SHAPE_CLIP)


def _as_float_array(col: Any) -> np.ndarray:
    """A parameter column as floats (NaN where missing or not a number)."""
    arr = np.asarray(col.to_numpy() if hasattr(col, "to_numpy") else col)
    if arr.dtype.kind in "iuf":
        return arr.astype(float)
    out = np.full(len(arr), np.nan)
    for i, v in enumerate(arr.tolist()):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[i] = float(v)
    return out


def check_adaptation(data: Any, where: str | Path = ADAPT_DIR) -> None:
    """Check every field of a parsed ``adapt/<device>.json`` (unknown keys refused); the first
    problem is one :class:`OpcastError` line naming it."""
    fix = "re-run opcast train adapt (or delete the file to predict without it)"
    if not isinstance(data, dict):
        raise OpcastError(f"{where} holds a JSON {type(data).__name__}, not an object; {fix}")
    unknown = sorted(set(data) - set(ADAPT_FIELDS))
    if unknown:
        raise OpcastError(f"{where}: unknown field {_brief(unknown[0])}; {fix}")
    try:
        _check_fields(data, ADAPT_FIELDS, str(where), "")
    except OpcastError as err:  # the same message, with this file's fix
        raise OpcastError(str(err).split("; ")[0] + f"; {fix}") from None
    if data["format_version"] > ADAPT_FORMAT_VERSION:
        raise OpcastError(
            f"{where}: format {data['format_version']} is newer than this opcast reads ({ADAPT_FORMAT_VERSION}); "
            "upgrade opcast"
        )
    for key, group in data["groups"].items():
        if not _GROUP_KEY.fullmatch(key) or key.rsplit("-", 2)[0] not in FEATURES:
            raise OpcastError(f"{where}: group {_brief(key)} is not <op>-<direction>-<dtype class>; {fix}")
        prefix = f"groups[{key!r}]."
        extra = sorted(set(group) - set(ADAPT_GROUP_FIELDS))
        if extra:
            raise OpcastError(f"{where}: {prefix}{extra[0][:40]} is not a field of a group correction; {fix}")
        try:
            _check_fields(group, ADAPT_GROUP_FIELDS, str(where), prefix)
        except OpcastError as err:
            raise OpcastError(str(err).split("; ")[0] + f"; {fix}") from None
        if "shape" in group:
            problem = _shape_term_problem(group["shape"], key)
            if problem:
                raise OpcastError(f"{where}: {prefix}shape {problem}; {fix}")
        if "analogue" in group:
            problem = _analogue_term_problem(group["analogue"])
            if problem:
                raise OpcastError(f"{where}: {prefix}analogue {problem}; {fix}")


def write_adaptation(set_path: str | Path, body: Mapping[str, Any]) -> Path:
    """Write ``body`` (the fields of :data:`ADAPT_FIELDS` but the two digests) as the set's
    ``adapt/<device>.json`` atomically, bound to the set's meta.json by ``set_meta_sha256`` and
    to its own content by ``sha256``; checked as a reader would check it before it is written."""
    return _write_side_file(
        set_path, body, _ADAPTATION, lambda data: Path(ADAPT_DIR) / adaptation_file(str(data.get("device", "")))
    )


def load_adaptation(model_set: ModelSet, device_name: str) -> Adaptation | None:
    """The set's adaptation to ``device_name`` (``adapt/<device>.json``), or None when it has
    none. Validated field by field, bound to the set's meta.json and to its own digest; any
    problem is one :class:`OpcastError` line. Only parsed: nothing in it runs."""
    path = Path(model_set.path) / ADAPT_DIR / adaptation_file(device_name)
    data = _read_side_file(model_set, path, _ADAPTATION)
    if data is None:
        return None
    if data["device"] != device_name:
        raise OpcastError(f"{path} adapts {_brief(data['device'])}, not {device_name!r}; re-run opcast train adapt")
    return Adaptation(data, path)


_COLLECTIVES: Final = _SideFile(
    what="a collectives file",
    max_bytes=COLLECTIVES_MAX_BYTES,
    check=lambda data, where: check_collectives(data, where),
    modified="was modified after fitting",
    foreign="belongs to another fit",
    redo="re-fit with opcast train fit",
    redo_here="re-fit with opcast train fit",
    no_set_fix="write the set first",
    write_fix="choose a writable --out folder",
)
_ADAPTATION: Final = _SideFile(
    what="an adaptation",
    max_bytes=ADAPT_MAX_BYTES,
    check=lambda data, where: check_adaptation(data, where),
    modified="was modified after it was fitted",
    foreign="was fitted on another model set",
    redo="re-run opcast train adapt",
    redo_here="re-run opcast train adapt with this set",
    no_set_fix="give a set written by train fit",
    write_fix="choose a writable set (or --out)",
)
