"""Gradient-boosted trees on log(time / roofline bound), one booster per op group.

The target ``log(t / t_roof)`` is the log of the inverse roofline utilisation plus fixed costs
(launch, tail): it is of order 0..5 on every GPU, so a tree fitted on some GPUs speaks about
another through the dimensionless features (waves, tail efficiency, intensity over the ridge,
working set over L2), where log seconds would put an unseen fast GPU outside every leaf.
Squared error on a log target is squared relative error. Monotone constraints where physics
gives them (a fuller last wave never slows a kernel); early stopping on a held-out set of whole
shapes.

The fitted trees, their file and the numpy predictions are
:class:`~opcast.train.estimators.xgb_predictor.XGBPredictor`'s, which this estimator extends with
scikit-learn's API and the fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opcast.train.estimators.base import RooflineEstimator
from opcast.train.estimators.trees import TreeArrays, trees_from_booster
from opcast.train.estimators.xgb_predictor import XGBPredictor
from opcast.train.features import MONOTONE_DECREASING
from opcast.train.splits import grouped_mask


class XGBEstimator(RooflineEstimator, XGBPredictor):
    """xgboost regressor of log(time / roofline) for one op group."""

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...] | None = None,
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
        self.feature_names = feature_names
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
        if self.monotone and self.feature_names is not None:  # a plain matrix names no feature
            params["monotone_constraints"] = (
                "(" + ",".join("-1" if n in MONOTONE_DECREASING else "0" for n in self.feature_names) + ")"
            )
        return params

    def fit(self, X: Any, y: Any, *, groups: np.ndarray | None = None) -> XGBEstimator:
        """Fit on a feature frame (or a plain matrix, see :mod:`~opcast.train.estimators.base`) and
        measured seconds ``y``; ``groups`` (shape ids) keep a shape's rows on one side of the
        early-stopping split."""
        import xgboost as xgb

        x, feats, time_s = self._inputs(X, y, fit=True)
        names = self._input_names()
        y = np.log(time_s) - np.log(self._reference(feats, len(x)))
        groups = np.arange(len(y)) if groups is None else groups
        val = grouped_mask(groups, self.val_fraction, self.seed) if len(y) >= 200 else np.zeros(len(y), dtype=bool)
        train = xgb.DMatrix(x[~val], label=y[~val], feature_names=names)
        evals = [(xgb.DMatrix(x[val], label=y[val], feature_names=names), "val")] if val.any() else []
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
        self.trees_ = _checked_trees(self.booster_, x[:2000], names)
        return self

    def config(self) -> dict[str, Any]:
        """What ``load`` needs besides the file, and what meta.json reports."""
        return {
            "hyper_parameters": self.hyper_parameters(),
            "n_trees": getattr(self, "n_trees_", None),
            "numpy_trees": getattr(self, "trees_", None) is not None,
            "target": "log(time_s / t_roof_s)",
        }


def _checked_trees(booster: Any, x: np.ndarray, feature_names: list[str] | None) -> TreeArrays | None:
    """The booster's numpy trees, if they reproduce xgboost's own margins on ``x`` (else None:
    predictions then always go through xgboost)."""
    import xgboost as xgb

    try:
        trees = trees_from_booster(booster)
    except (ValueError, KeyError):
        return None
    if len(x):
        ref = booster.predict(xgb.DMatrix(x, feature_names=feature_names), output_margin=True).astype(float)
        if not np.allclose(trees.margin(x), ref, rtol=1e-5, atol=1e-5):
            return None
    return trees
