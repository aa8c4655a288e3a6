"""Per-group estimators: gradient-boosted trees (``xgb``) and NeuSight's tile-MLP (``tile-mlp``).

Both follow scikit-learn's conventions: ``__init__`` stores hyper-parameters only, ``fit``
returns ``self`` and fitted attributes end in ``_``. Both learn a *normalised* target (time over
the roofline bound on the row's device), never raw seconds, and both read the feature frame of
:func:`opcast.train.features.features`. Each saves itself to one file (``save``) and is rebuilt
from that file plus its ``config()`` (``load``). xgboost and torch are imported inside the
methods that need them.

Reading a predictor file never runs code from it: numpy archives are read with
``allow_pickle=False`` (:func:`read_arrays`), xgboost only from its UBJSON/JSON bytes, torch state
dicts of older sets with ``weights_only=True``; pickled files (``.joblib``) are not read at all.
Each file also carries a small record of what it holds (:data:`RECORD_KEY`: group, estimator,
feature names), which :mod:`opcast.train.artifacts` compares with ``meta.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from opcast.errors import OpcastError

ESTIMATORS: Final = ("xgb", "tile-mlp")
"""Estimator names as the CLI and ``meta.json`` spell them."""


class NotApplicable(OpcastError):
    """The estimator cannot model this op group (e.g. tile-mlp on collectives)."""


def estimator_class(name: str) -> Any:
    """The class of estimator ``name`` (imported on demand)."""
    if name == "xgb":
        from opcast.train.estimators.xgb import XGBEstimator

        return XGBEstimator
    if name == "tile-mlp":
        from opcast.train.estimators.tile_mlp import TileMLPEstimator

        return TileMLPEstimator
    raise OpcastError(f"unknown estimator {name!r}; use one of {', '.join(ESTIMATORS)} or auto")


RECORD_KEY: Final = "opcast_record"
"""Name of the array, in every predictor file, holding the JSON record of what the file holds:
``{"group": ..., "estimator": ..., "features": [...]}`` (a unicode scalar, no pickle)."""


def record_array(record: Mapping[str, Any]) -> np.ndarray:
    """``record`` as the unicode scalar array stored under :data:`RECORD_KEY`."""
    return np.array(json.dumps(dict(record), sort_keys=True))


def parse_record(value: Any, path: Path) -> dict[str, Any]:
    """The record stored under :data:`RECORD_KEY` (an array from :func:`record_array`, or the
    string itself in a torch state dict), or a one-line :class:`OpcastError`."""
    try:
        text = value.item() if isinstance(value, np.ndarray) and value.shape == () else value
        record = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        raise OpcastError(
            f"{path}: its {RECORD_KEY} is not a JSON object; the file is corrupt, re-fit with opcast train fit"
        )
    return record


def read_arrays(path: Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the numpy archive ``path`` (all of them, or those of ``names`` it holds),
    read with ``allow_pickle=False``: an object array (a pickle) is refused, never unpickled.
    Anything that is not a readable ``.npz`` raises :class:`OpcastError` in one line."""
    path = Path(path)
    wanted = None if names is None else set(names)
    try:
        blob = np.load(path, allow_pickle=False)
        if not isinstance(blob, np.lib.npyio.NpzFile):
            raise OpcastError(
                f"{path} is a bare numpy array, not an opcast predictor archive; re-fit with opcast train fit"
            )
        with blob:
            out = {k: blob[k] for k in blob.files if wanted is None or k in wanted}
    except OpcastError:
        raise
    except PermissionError as err:
        raise OpcastError(f"{path} cannot be read ({err.strerror}); fix its permissions (chmod a+r)") from None
    except Exception as err:  # whatever numpy or zipfile raise on a corrupt file is the file's fault
        why = (str(err).splitlines() or [type(err).__name__])[0][:160]
        if "Object arrays" in why:
            why = "it holds object arrays, i.e. pickles, which opcast never loads: unpickling can run code"
        elif "pickled data" in why:
            why = "not a numpy archive; opcast never unpickles a file: that can run code"
        raise OpcastError(
            f"{path} is not a readable opcast predictor archive ({why}); re-fit with opcast train fit"
        ) from None
    bad = [k for k, v in out.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise OpcastError(f"{path}: member(s) {', '.join(bad)} are not numpy arrays; re-fit with opcast train fit")
    return out


def require_arrays(arrays: Mapping[str, np.ndarray], spec: Mapping[str, str], path: Path) -> None:
    """Check that ``arrays`` holds every name of ``spec`` with a dtype of the kinds it gives
    (numpy kind letters, e.g. ``"f"``, ``"iu"``, ``"b"``); one-line :class:`OpcastError` otherwise."""
    for name, kinds in spec.items():
        arr = arrays.get(name)
        if arr is None:
            raise OpcastError(
                f"{path} lacks the array {name!r}; it is not a predictor of this kind, re-fit with opcast train fit"
            )
        if arr.dtype.kind not in kinds:
            raise OpcastError(
                f"{path}: array {name!r} has dtype {arr.dtype}, expected kind {kinds!r}; re-fit with opcast train fit"
            )
