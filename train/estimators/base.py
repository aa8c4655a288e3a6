"""What every estimator shares as a scikit-learn regressor: inputs, tags, and the hyper-parameters
a model set records.

``X`` is one of two things:

- a **feature frame** (:func:`opcast.train.features.features`, a DataFrame, or the numpy
  :class:`~opcast.train.features.Table` of :func:`~opcast.train.features.feature_table`) when the estimator
  declares ``feature_names``, as every estimator of a model set does: the model reads those
  columns, and the target is normalised by the frame's roofline columns (``t_roof_s``, and
  ``waves`` for the tile-MLP);
- a **plain matrix** (any 2-D array-like, scikit-learn's usual input) when ``feature_names`` is
  None, scikit-learn's default construction: every column is an input, validated by
  ``sklearn.utils.validation.validate_data``, and the roofline bound is 1 s, so the target is the
  time itself. scikit-learn's generic ``check_estimator`` runs the estimators this way.

Either way ``y`` holds positive times (seconds), ``fit`` returns ``self``, ``predict`` returns
seconds, and the fitting and predicting code is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Self

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from opcast.train.features import Table, matrix

RUNTIME_PARAMS: Final = frozenset({"feature_names", "n_jobs"})
"""``__init__`` arguments that are not hyper-parameters of the fitted model: the inputs (recorded
apart, as the predictor's ``features``) and the thread count (a property of the machine)."""


class RooflineEstimator(RegressorMixin, BaseEstimator):
    """Base of the estimators: combine with a predictor class (which brings ``_reference``,
    ``_seconds``, ``save`` and ``load``) and declare the hyper-parameters in ``__init__``."""

    feature_names: tuple[str, ...] | None

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # a missing feature: xgboost's default branch, the MLP's mean
        tags.target_tags.positive_only = True  # times: the target is their log
        return tags

    # ------------------------------------------------------------------ inputs

    def _inputs(
        self, X: Any, y: Any = None, *, fit: bool
    ) -> tuple[np.ndarray, pd.DataFrame | Table | None, np.ndarray]:
        """(model-input matrix, the feature frame or None for a plain matrix, y as float seconds,
        empty when predicting). Fitting sets ``n_features_in_`` (and, for a plain DataFrame,
        ``feature_names_in_``); predicting checks ``X`` against them."""
        if self.feature_names is None:
            if fit:
                x, y = validate_data(self, X, y, dtype=np.float64, ensure_all_finite="allow-nan", y_numeric=True)
            else:
                x = validate_data(self, X, reset=False, dtype=np.float64, ensure_all_finite="allow-nan")
            feats = None
        else:
            if not isinstance(X, (pd.DataFrame, Table)):
                raise ValueError(
                    f"{type(self).__name__} with feature_names reads a feature frame (a DataFrame of "
                    f"opcast.train.features.features), not {type(X).__name__}; or construct it without "
                    "feature_names to fit a plain matrix"
                )
            x, feats = matrix(X, tuple(self.feature_names)), X
            if fit:
                self.n_features_in_ = x.shape[1]
        if not fit:
            return x, feats, np.empty(0)
        y = np.asarray(y, dtype=float)
        if y.shape != (len(x),) or not (np.isfinite(y) & (y > 0)).all():
            raise ValueError(f"y must hold {len(x)} positive, finite times in seconds, one per row of X")
        return x, feats, y

    def predict(self, X: Any) -> np.ndarray:
        """Predicted seconds of every row of ``X`` (NaN where a feature frame's roofline bound is NaN)."""
        check_is_fitted(self)
        x, feats, _ = self._inputs(X, fit=False)
        return self._seconds(x, self._reference(feats, len(x)))  # type: ignore[attr-defined]  # the predictor's

    # ------------------------------------------------------------------ what a model set records

    def hyper_parameters(self) -> dict[str, Any]:
        """``get_params()`` less :data:`RUNTIME_PARAMS`: what ``meta.json`` records and ``load`` restores."""
        return {k: v for k, v in self.get_params(deep=False).items() if k not in RUNTIME_PARAMS}

    @classmethod
    def _from_config(cls, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        """An unfitted estimator with the hyper-parameters ``config`` records (JSON lists back to
        tuples; names this version no longer has are ignored, missing ones take their default)."""
        known = set(cls._get_param_names()) - RUNTIME_PARAMS
        hp = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in dict(config.get("hyper_parameters", {})).items()
            if k in known
        }
        return cls(feature_names=feature_names, **hp)
