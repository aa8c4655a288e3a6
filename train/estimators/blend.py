"""A blend of two fitted predictors: the geometric mean of their answers.

``auto`` (:mod:`opcast.train.fit`) scores it beside the single estimators, from the fold predictions of its two
parts (:data:`opcast.train.fit.BLEND_PARTS`, no fit of its own), and gives it a group's left-out GPUs where it
transfers best; the GPUs the group was fitted on keep one estimator. Averaging models whose errors are partly
independent cuts the part of the error that is not shared (Breiman, "Stacked regressions", Machine Learning 24,
1996; Hastie, Tibshirani and Friedman, *The Elements of Statistical Learning*, 2nd ed., 2009, section 8.8): gradient
boosted trees over the spec and shape features and an MLP over tile and wave features miss a left-out GPU in
different places. The mean is taken in log time, the scale both are fitted in, so a part that is 20 % slow and one
that is 20 % fast cancel. A written model set stores the parts as the entry's own file and its ``blend`` part
(:data:`opcast.train.artifacts.BLEND_SUFFIX`); this class needs numpy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from opcast.train.features import Table


class Blend:
    """The geometric mean of ``primary``'s and ``blend``'s predicted seconds (NaN where either is NaN).
    ``primary`` is the part written as the entry's own file (the one the training GPUs get, where it is one of
    the two), ``blend`` the other."""

    name: Final = "blend"

    def __init__(self, primary: Any, blend: Any) -> None:
        self.primary, self.blend = primary, blend
        self.feature_names: tuple[str, ...] = tuple(
            dict.fromkeys((*(primary.feature_names or ()), *(blend.feature_names or ())))
        )
        """Every feature either part reads, in order (the entry's feature ranges cover both)."""

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row: ``sqrt(t_primary * t_blend)``."""
        first = np.asarray(self.primary.predict_s(feats), dtype=float)
        second = np.asarray(self.blend.predict_s(feats), dtype=float)
        with np.errstate(invalid="ignore"):
            return np.sqrt(first * second)

    def __repr__(self) -> str:
        return f"Blend({self.primary.name}, {self.blend.name})"
