"""A fitted hierarchical (device level + shape) predictor: its file format and its predictions, numpy only.

The model (:class:`~opcast.train.estimators.hier.HierEstimator` fits it, issue 19) splits the
normalised target ``log(time / t_roof)`` of a row on a device into two parts:

- a **device level**: the log-utilisation the device sustains, one number per device. A training
  device keeps its fitted level; any other is predicted from its spec columns (the device
  features of the row: log peak, log bandwidth, log ridge, ...) by ``g(spec)``, a
  ridge-regularised linear model fitted across the training devices' levels. With one training
  device ``g`` is that device's level; with a strong penalty it is their mean;
- a **shape** part ``f(row)``: gradient-boosted trees (the xgb predictor's trees) on the row's
  features less the absolute device specs, fitted to the target less the row's device level.

``t = t_roof * exp(level + f(row))``: the level only shifts the log-utilisation, the roofline
and the shape part carry everything else.

Saved as one ``.npz``: the shape model's booster (UBJSON bytes) and its numpy trees, the column
indices each part reads from the predictor's inputs, and the level model's arrays. Read with
``allow_pickle=False``; xgboost only ever parses the UBJSON bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

import numpy as np

from opcast.errors import OpcastError
from opcast.train.estimators import RECORD_KEY, PredictorBase, parse_record, read_arrays, record_array, require_arrays
from opcast.train.estimators.trees import TreeArrays
from opcast.train.estimators.xgb_predictor import XGBPredictor, _checked_raw
from opcast.train.features import matrix

if TYPE_CHECKING:  # pandas stays off the predict path: a model set passes a features Table
    import pandas as pd

    from opcast.train.features import Table

FORMAT: Final = "hier-xgb+ridge-v1"
LEVEL_ARRAYS: Final = ("level_mean", "level_scale", "level_coef")
"""Per level feature: its mean and scale over the training devices, and its ridge coefficient."""


class HierPredictor(PredictorBase):
    """Device level from specs + shape trees, for one op group (what a model set loads)."""

    name = "hier"
    suffix = ".npz"
    n_jobs: int = 2

    # Set by fit or load.
    shape_: XGBPredictor
    """The shape model: an xgb predictor over the columns :attr:`shape_idx_`."""
    shape_idx_: np.ndarray
    """Columns of the predictor's inputs the shape model reads (int64)."""
    level_idx_: np.ndarray
    """Columns of the predictor's inputs the level model reads (int64; empty: a constant level)."""
    level_mean_: np.ndarray
    level_scale_: np.ndarray
    level_coef_: np.ndarray
    level_intercept_: float
    """The level model: ``intercept + ((spec - mean) / scale) @ coef``."""
    device_levels_: np.ndarray
    """The fitted level of every training device: what a row of that device is predicted with."""
    device_specs_: np.ndarray
    """The level features of every training device, rows as :attr:`device_levels_` (how a row is
    recognised as one of theirs)."""

    @staticmethod
    def _reference(feats: pd.DataFrame | Table | None, n_rows: int) -> np.ndarray:
        """The roofline bound of every row; 1 s for a plain matrix."""
        return np.ones(n_rows) if feats is None else feats["t_roof_s"].to_numpy(dtype=float)

    def _x(self, feats: pd.DataFrame | Table) -> np.ndarray:
        assert self.feature_names is not None  # a predictor of a model set always names its inputs
        return matrix(feats, self.feature_names)

    def level_log(self, x: np.ndarray) -> np.ndarray:
        """The device level of every row of the input matrix ``x``: a training device's own fitted
        level (its level features equal, to 1e-9, those it was fitted with), else ``g(spec)``, the
        level model's prediction from the row's spec columns."""
        if not len(self.level_idx_):
            return np.full(len(x), float(self.level_intercept_))
        spec = x[:, self.level_idx_]
        out = float(self.level_intercept_) + ((spec - self.level_mean_) / self.level_scale_) @ self.level_coef_
        known = np.zeros(len(x), dtype=bool)
        for level, seen in zip(self.device_levels_, self.device_specs_):
            rows = ~known & np.isclose(spec, seen, rtol=1e-9, atol=0.0, equal_nan=True).all(axis=1)
            out[rows], known[rows] = level, True
        return out

    def spec_level_log(self, x: np.ndarray) -> np.ndarray:
        """``g(spec)`` of every row of ``x``, even on a training device (benchmarks, tests)."""
        if not len(self.level_idx_):
            return np.full(len(x), float(self.level_intercept_))
        return float(self.level_intercept_) + ((x[:, self.level_idx_] - self.level_mean_) / self.level_scale_) @ (
            self.level_coef_
        )

    def shape_log(self, x: np.ndarray) -> np.ndarray:
        """``f(row)`` of every row of the input matrix ``x`` (log of time over roofline, less the level)."""
        return np.log(self.shape_._seconds(x[:, self.shape_idx_], np.ones(len(x))))

    def parts_log(self, feats: pd.DataFrame | Table) -> tuple[np.ndarray, np.ndarray]:
        """(``f(row)``, ``g(spec)``) of every row of a feature frame: the two parts of the log
        target, for benchmarks that score each part apart."""
        x = self._x(feats)
        return self.shape_log(x), self.level_log(x)

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row of a feature frame or Table (NaN where the roofline bound is NaN)."""
        x = self._x(feats)
        return self._seconds(x, self._reference(feats, len(x)))

    def _seconds(self, x: np.ndarray, t_roof: np.ndarray) -> np.ndarray:
        """Seconds from the input matrix and each row's roofline bound."""
        self.shape_.n_jobs = self.n_jobs
        return self.shape_._seconds(x[:, self.shape_idx_], t_roof) * np.exp(self.level_log(x))

    def save(self, path: Path, *, record: Mapping[str, Any] | None = None) -> Path:
        """Write ``<path>.npz``: the shape model's booster and trees, the level model, ``record``."""
        path = Path(path).with_suffix(self.suffix)
        raw = np.frombuffer(bytes(self.shape_.booster().save_raw(raw_format="ubj")), dtype=np.uint8)
        trees = self.shape_.trees_.to_arrays() if getattr(self.shape_, "trees_", None) is not None else {}
        extra = {RECORD_KEY: record_array(record)} if record is not None else {}
        with open(path, "wb") as fh:  # a file object: savez would append .npz to a bare path
            np.savez_compressed(
                fh,
                format=np.array(FORMAT),
                ubj=raw,
                shape_idx=np.asarray(self.shape_idx_, dtype=np.int64),
                level_idx=np.asarray(self.level_idx_, dtype=np.int64),
                level_mean=np.asarray(self.level_mean_, dtype=np.float64),
                level_scale=np.asarray(self.level_scale_, dtype=np.float64),
                level_coef=np.asarray(self.level_coef_, dtype=np.float64),
                level_intercept=np.array([self.level_intercept_], dtype=np.float64),
                device_levels=np.asarray(self.device_levels_, dtype=np.float64),
                device_specs=np.asarray(self.device_specs_, dtype=np.float64).reshape(len(self.device_levels_), -1),
                **trees,
                **extra,
            )
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        est = cls._from_config(tuple(feature_names), config)
        path = Path(path)
        if path.suffix != cls.suffix:
            raise OpcastError(
                f"{path}: hier predictors are read from {cls.suffix} archives only; re-fit with opcast train fit"
            )
        blob = read_arrays(path)
        require_arrays(
            blob,
            {"ubj": "u", "shape_idx": "iu", "level_idx": "iu", "level_intercept": "f", "device_levels": "f"}
            | {"device_specs": "f"}
            | dict.fromkeys(LEVEL_ARRAYS, "f"),
            path,
        )
        width = len(feature_names)
        shape_idx, level_idx = blob["shape_idx"].astype(np.int64), blob["level_idx"].astype(np.int64)
        p = len(level_idx)
        bad = (
            shape_idx.ndim != 1
            or level_idx.ndim != 1
            or any(((i < 0) | (i >= width)).any() for i in (shape_idx, level_idx))
            or any(blob[k].shape != (p,) for k in LEVEL_ARRAYS)
            or blob["level_intercept"].shape != (1,)
            or blob["device_levels"].ndim != 1
            or blob["device_specs"].shape != (len(blob["device_levels"]), p)
            or not all(np.isfinite(blob[k]).all() for k in (*LEVEL_ARRAYS, "level_intercept"))
            or (blob["level_scale"] <= 0).any()
        )
        if bad:
            raise OpcastError(
                f"{path}: its column indices or level model do not fit the {width} inputs meta.json names; "
                "re-fit with opcast train fit"
            )
        shape = XGBPredictor(feature_names=tuple(feature_names[i] for i in shape_idx))
        shape.booster_ = None
        shape.path_ = path
        shape.raw_ = _checked_raw(blob["ubj"].tobytes(), path)
        shape.trees_ = (
            TreeArrays.from_arrays(
                {k: blob[k] for k in blob if k.startswith("tree_")}, path=path, n_features=len(shape_idx)
            )
            if "tree_shape" in blob
            else None
        )
        shape.n_trees_ = shape.trees_.n_trees if shape.trees_ is not None else int(shape.booster().num_boosted_rounds())
        est.shape_ = shape
        est.shape_idx_, est.level_idx_ = shape_idx, level_idx
        est.level_mean_, est.level_scale_, est.level_coef_ = (blob[k].astype(np.float64) for k in LEVEL_ARRAYS)
        est.level_intercept_ = float(blob["level_intercept"][0])
        est.device_levels_ = blob["device_levels"].astype(np.float64)
        est.device_specs_ = blob["device_specs"].astype(np.float64)
        est.record_ = parse_record(blob[RECORD_KEY], path) if RECORD_KEY in blob else None
        return est
