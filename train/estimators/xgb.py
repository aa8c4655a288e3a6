"""Gradient-boosted trees on log(time / roofline bound), one booster per op group.

The target ``log(t / t_roof)`` is the log of the inverse roofline utilisation plus fixed costs
(launch, tail): it is of order 0..5 on every GPU, so a tree fitted on some GPUs speaks about
another through the dimensionless features (waves, tail efficiency, intensity over the ridge,
working set over L2), where log seconds would put an unseen fast GPU outside every leaf.
Squared error on a log target is squared relative error. Monotone constraints where physics
gives them (a fuller last wave never slows a kernel); early stopping on a held-out set of whole
shapes.

Saved as one ``.npz``: the booster's UBJSON bytes plus its trees flattened for
:mod:`opcast.train.estimators.trees`, so that loading and predicting a few hundred kernels
needs numpy only; xgboost's own predictor is used for batches too large for the numpy walk.
The archive is read with ``allow_pickle=False`` and xgboost only ever parses the UBJSON bytes,
so loading runs no code from the file. Sets saved by opcast <= 0.1 held a pickled ``.joblib``
instead; those are refused (:mod:`opcast.train.artifacts`): re-fit them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcast.errors import OpcastError
from opcast.train.estimators import RECORD_KEY, parse_record, read_arrays, record_array, require_arrays
from opcast.train.estimators.trees import TreeArrays, trees_from_booster
from opcast.train.features import MONOTONE_DECREASING, matrix
from opcast.train.splits import grouped_mask


class XGBEstimator:
    """xgboost regressor of log(time / roofline) for one op group."""

    name = "xgb"
    suffix = ".npz"
    """Compressed numpy archive: the booster's UBJSON bytes and the flattened trees."""
    numpy_max_cells = 4_000_000
    """Rows x trees above which importing xgboost (~1 s) and using its C++ predictor beats the
    numpy walk (~0.1 us a cell on one core, ~10x slower per cell than xgboost)."""
    numpy_max_cells_imported = 100_000
    """The same once xgboost is imported anyway: only small batches stay with numpy."""

    # Set by fit or load (declared here for the type checker; no class-level values).
    booster_: Any
    """The ``xgboost.Booster``, or None in a loaded estimator until :meth:`booster` rebuilds it."""
    trees_: TreeArrays | None
    n_trees_: int
    raw_: bytes
    """The booster's UBJSON bytes, as loaded."""
    path_: Path
    record_: dict[str, Any] | None

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...],
        n_estimators: int = 400,
        max_depth: int = 7,
        learning_rate: float = 0.1,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 3.0,
        reg_lambda: float = 1.0,
        early_stopping_rounds: int = 50,
        val_fraction: float = 0.15,
        monotone: bool = True,
        seed: int = 0,
        n_jobs: int = 2,
    ) -> None:
        self.feature_names = tuple(feature_names)
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.early_stopping_rounds = early_stopping_rounds
        self.val_fraction = val_fraction
        self.monotone = monotone
        self.seed = seed
        self.n_jobs = n_jobs

    def hyper_parameters(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "n_estimators",
                "max_depth",
                "learning_rate",
                "subsample",
                "colsample_bytree",
                "min_child_weight",
                "reg_lambda",
                "early_stopping_rounds",
                "val_fraction",
                "monotone",
                "seed",
            )
        }

    def _params(self) -> dict[str, Any]:
        params = {
            "objective": "reg:squarederror",
            "eta": self.learning_rate,
            "max_depth": self.max_depth,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "tree_method": "hist",
            "seed": self.seed,
            "nthread": self.n_jobs,
        }
        if self.monotone:
            params["monotone_constraints"] = (
                "(" + ",".join("-1" if n in MONOTONE_DECREASING else "0" for n in self.feature_names) + ")"
            )
        return params

    def fit(self, feats: pd.DataFrame, time_s: np.ndarray, *, groups: np.ndarray | None = None) -> XGBEstimator:
        """Fit on the feature frame and measured seconds; ``groups`` (shape ids) keep a shape's
        rows on one side of the early-stopping split."""
        import xgboost as xgb

        x = matrix(feats, self.feature_names)
        y = np.log(np.asarray(time_s, dtype=float)) - np.log(feats["t_roof_s"].to_numpy(dtype=float))
        groups = np.arange(len(y)) if groups is None else groups
        val = grouped_mask(groups, self.val_fraction, self.seed) if len(y) >= 200 else np.zeros(len(y), dtype=bool)
        train = xgb.DMatrix(x[~val], label=y[~val], feature_names=list(self.feature_names))
        evals = (
            [(xgb.DMatrix(x[val], label=y[val], feature_names=list(self.feature_names)), "val")] if val.any() else []
        )
        self.booster_ = xgb.train(
            self._params(),
            train,
            num_boost_round=self.n_estimators,
            evals=evals,
            early_stopping_rounds=self.early_stopping_rounds if evals else None,
            verbose_eval=False,
        )
        if evals:  # keep only the trees up to the best validation round: a smaller artifact, same predictions
            self.booster_ = self.booster_[: self.booster_.best_iteration + 1]
        self.n_trees_ = int(self.booster_.num_boosted_rounds())
        self.trees_ = _checked_trees(self.booster_, x[:2000], self.feature_names)
        return self

    def predict_s(self, feats: pd.DataFrame) -> np.ndarray:
        """Predicted seconds of every row (NaN where the roofline bound is NaN)."""
        x = matrix(feats, self.feature_names)
        trees = getattr(self, "trees_", None)
        cells = len(x) * (trees.n_trees if trees is not None else 0)
        limit = self.numpy_max_cells_imported if "xgboost" in sys.modules else self.numpy_max_cells
        if trees is not None and (cells <= limit or not _xgboost_installed()):
            ratio = trees.margin(x)
        else:
            import xgboost as xgb

            booster = self.booster()
            booster.set_param({"nthread": self.n_jobs})
            ratio = booster.predict(xgb.DMatrix(x, feature_names=list(self.feature_names))).astype(float)
        return feats["t_roof_s"].to_numpy(dtype=float) * np.exp(ratio)

    def booster(self) -> Any:
        """The ``xgboost.Booster`` (rebuilt from the saved bytes on first use)."""
        if getattr(self, "booster_", None) is None:
            import xgboost as xgb

            raw = _checked_raw(bytes(self.raw_), getattr(self, "path_", "the predictor"))
            booster = xgb.Booster()
            try:
                booster.load_model(bytearray(raw))
            except xgb.core.XGBoostError as err:
                raise OpcastError(
                    f"{getattr(self, 'path_', 'the predictor')}: xgboost cannot read its booster "
                    f"({str(err).splitlines()[0][-120:]}); re-fit with opcast train fit"
                ) from None
            self.booster_ = booster
        return self.booster_

    def config(self) -> dict[str, Any]:
        """What ``load`` needs besides the file, and what meta.json reports."""
        return {
            "hyper_parameters": self.hyper_parameters(),
            "n_trees": getattr(self, "n_trees_", None),
            "numpy_trees": getattr(self, "trees_", None) is not None,
            "target": "log(time_s / t_roof_s)",
        }

    def save(self, path: Path, *, record: dict[str, Any] | None = None) -> Path:
        """Write ``<path>.npz``; ``record`` (what the file holds, see
        :data:`~opcast.train.estimators.RECORD_KEY`) is stored beside the arrays."""
        path = Path(path).with_suffix(self.suffix)
        raw = np.frombuffer(bytes(self.booster_.save_raw(raw_format="ubj")), dtype=np.uint8)
        fitted_trees = getattr(self, "trees_", None)
        trees = fitted_trees.to_arrays() if fitted_trees is not None else {}
        extra = {RECORD_KEY: record_array(record)} if record is not None else {}
        with open(path, "wb") as fh:  # a file object: savez would append .npz to a bare path
            np.savez_compressed(fh, format=np.array("xgboost-ubj+trees"), ubj=raw, **trees, **extra)
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: dict[str, Any]) -> XGBEstimator:
        hp = dict(config.get("hyper_parameters", {}))
        est = cls(feature_names=feature_names, **{k: v for k, v in hp.items() if k in _INIT_KEYS})
        est.booster_ = None
        est.trees_ = None
        est.path_ = path = Path(path)
        if path.suffix != cls.suffix:
            raise OpcastError(
                f"{path}: xgb predictors are read from {cls.suffix} archives only (a pickled .joblib "
                "of an older opcast is never loaded: unpickling can run code); re-fit with opcast train fit"
            )
        blob = read_arrays(path)
        require_arrays(blob, {"ubj": "u"}, path)
        est.record_ = parse_record(blob[RECORD_KEY], path) if RECORD_KEY in blob else None
        est.raw_ = _checked_raw(blob["ubj"].tobytes(), path)
        if "tree_shape" in blob:
            est.trees_ = TreeArrays.from_arrays(
                {k: blob[k] for k in blob if k.startswith("tree_")}, path=path, n_features=len(est.feature_names)
            )
        est.n_trees_ = est.trees_.n_trees if est.trees_ is not None else int(est.booster().num_boosted_rounds())
        return est


def _checked_trees(booster: Any, x: np.ndarray, feature_names: tuple[str, ...]) -> TreeArrays | None:
    """The booster's numpy trees, if they reproduce xgboost's own margins on ``x`` (else None:
    predictions then always go through xgboost)."""
    import xgboost as xgb

    try:
        trees = trees_from_booster(booster)
    except (ValueError, KeyError):
        return None
    if len(x):
        ref = booster.predict(xgb.DMatrix(x, feature_names=list(feature_names)), output_margin=True).astype(float)
        if not np.allclose(trees.margin(x), ref, rtol=1e-5, atol=1e-5):
            return None
    return trees


def _checked_raw(raw: bytes, path: Any) -> bytes:
    """``raw`` if it can be a UBJSON or JSON booster (both open with ``{``): xgboost aborts the
    interpreter (SIGABRT) on an empty buffer, so nothing else reaches it."""
    if not raw.startswith(b"{"):
        raise OpcastError(
            f"{path}: its booster bytes are {'empty' if not raw else 'not xgboost UBJSON or JSON'}; "
            "re-fit with opcast train fit"
        )
    return raw


def _xgboost_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("xgboost") is not None


_INIT_KEYS = frozenset(
    {
        "n_estimators",
        "max_depth",
        "learning_rate",
        "subsample",
        "colsample_bytree",
        "min_child_weight",
        "reg_lambda",
        "early_stopping_rounds",
        "val_fraction",
        "monotone",
        "seed",
    }
)
