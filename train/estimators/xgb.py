"""Gradient-boosted trees on log(time / roofline bound), one booster per op group.

The target ``log(t / t_roof)`` is the log of the inverse roofline utilisation plus fixed costs
(launch, tail): it is of order 0..5 on every GPU, so a tree fitted on some GPUs speaks about
another through the dimensionless features (waves, tail efficiency, intensity over the ridge,
working set over L2), where log seconds would put an unseen fast GPU outside every leaf.
Squared error on a log target is squared relative error. Monotone constraints where physics
gives them (a fuller last wave never slows a kernel); early stopping on a held-out set of whole
shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcast.train.features import MONOTONE_DECREASING, matrix
from opcast.train.splits import grouped_mask


class XGBEstimator:
    """xgboost regressor of log(time / roofline) for one op group."""

    name = "xgb"
    suffix = ".joblib"
    """The booster's UBJSON bytes, zlib-compressed by joblib (3-5x smaller than a bare .ubj)."""

    def __init__(self, *, feature_names: tuple[str, ...], n_estimators: int = 400, max_depth: int = 7,
                 learning_rate: float = 0.1, subsample: float = 0.8, colsample_bytree: float = 0.8,
                 min_child_weight: float = 3.0, reg_lambda: float = 1.0, early_stopping_rounds: int = 50,
                 val_fraction: float = 0.15, monotone: bool = True, seed: int = 0, n_jobs: int = 2) -> None:
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
        return {k: getattr(self, k) for k in ("n_estimators", "max_depth", "learning_rate", "subsample",
                                              "colsample_bytree", "min_child_weight", "reg_lambda",
                                              "early_stopping_rounds", "val_fraction", "monotone", "seed")}

    def _params(self) -> dict[str, Any]:
        params = {"objective": "reg:squarederror", "eta": self.learning_rate, "max_depth": self.max_depth,
                  "subsample": self.subsample, "colsample_bytree": self.colsample_bytree,
                  "min_child_weight": self.min_child_weight, "lambda": self.reg_lambda, "tree_method": "hist",
                  "seed": self.seed, "nthread": self.n_jobs}
        if self.monotone:
            params["monotone_constraints"] = "(" + ",".join("-1" if n in MONOTONE_DECREASING else "0"
                                                            for n in self.feature_names) + ")"
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
        evals = [(xgb.DMatrix(x[val], label=y[val], feature_names=list(self.feature_names)), "val")] if val.any() else []
        self.booster_ = xgb.train(self._params(), train, num_boost_round=self.n_estimators, evals=evals,
                                  early_stopping_rounds=self.early_stopping_rounds if evals else None, verbose_eval=False)
        if evals:  # keep only the trees up to the best validation round: a smaller artifact, same predictions
            self.booster_ = self.booster_[: self.booster_.best_iteration + 1]
        self.n_trees_ = int(self.booster_.num_boosted_rounds())
        return self

    def predict_s(self, feats: pd.DataFrame) -> np.ndarray:
        """Predicted seconds of every row (NaN where the roofline bound is NaN)."""
        import xgboost as xgb

        x = matrix(feats, self.feature_names)
        self.booster_.set_param({"nthread": self.n_jobs})
        ratio = self.booster_.predict(xgb.DMatrix(x, feature_names=list(self.feature_names)))
        return feats["t_roof_s"].to_numpy(dtype=float) * np.exp(ratio.astype(float))

    def config(self) -> dict[str, Any]:
        """What ``load`` needs besides the file, and what meta.json reports."""
        return {"hyper_parameters": self.hyper_parameters(), "n_trees": getattr(self, "n_trees_", None),
                "target": "log(time_s / t_roof_s)"}

    def save(self, path: Path) -> Path:
        import joblib

        path = Path(path).with_suffix(self.suffix)
        joblib.dump({"format": "xgboost-ubj", "model": bytes(self.booster_.save_raw(raw_format="ubj"))}, path, compress=("zlib", 6))
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: dict[str, Any]) -> XGBEstimator:
        import xgboost as xgb

        hp = dict(config.get("hyper_parameters", {}))
        est = cls(feature_names=feature_names, **{k: v for k, v in hp.items() if k in _INIT_KEYS})
        import joblib

        blob = joblib.load(path)
        booster = xgb.Booster()
        booster.load_model(bytearray(blob["model"]))
        est.booster_ = booster
        est.n_trees_ = int(booster.num_boosted_rounds())
        return est


_INIT_KEYS = frozenset({"n_estimators", "max_depth", "learning_rate", "subsample", "colsample_bytree", "min_child_weight",
                        "reg_lambda", "early_stopping_rounds", "val_fraction", "monotone", "seed"})
