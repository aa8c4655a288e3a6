"""The hierarchical transfer model of issue 19: device level from specs, shape from tiles and waves.

Most of xgb's leave-one-GPU-out error is the level a GPU sustains (one oracle constant per GPU
and op halves it, ``benchmarks/results/unseen_gpus.md``). This estimator models that level
apart from the shape (:mod:`~opcast.train.estimators.hier_predictor` has the model and its file):

1. **Devices** are the distinct tuples of the device-feature columns (``DEVICE_FEATURES``) of
   the rows; a plain matrix is one device.
2. **Backfitting** (a random-effects fit): ``level[device]`` starts as the median of
   ``log(t / t_roof)`` over the device's *saturated* rows (roofline time at least
   ``level_min_roof_s``, where it has enough of them: launch-bound rows say little about the rate
   a GPU sustains); the shape model ``f`` (xgb on the features less the device specs
   ``shape_features`` drops) is fitted to ``log(t / t_roof) - level[device]``, and the level moves
   by the median of what ``f`` leaves on those rows; ``rounds`` times. Starting from the medians
   matters: the relative features (roofline times, ridge, waves) tell the training devices
   apart, so trees fitted first would absorb every level and leave the level model nothing to
   learn (on NeuSight's GPUs the levels came out within 0.02 of 0).
3. **Level model** ``g``: ridge regression of the devices' levels on their standardised
   ``level_features`` (closed form; the penalty ``level_alpha`` shrinks to the mean level), each
   device weighted equally. One training device: ``g`` is its level. The level features include
   the tensor-core instruction family (:data:`~opcast.train.features.MMA_FEATURES`, one-hot,
   half and fp8 groups), which the shape model reads too: it places a GPU with no sibling among
   the training GPUs next to the ones whose kernels it shares (the sm_120 RTX PRO 6000 with the
   mma.sync Ampere and Ada parts, not the tcgen05 B200). A group whose rows lack a column of
   :data:`~opcast.train.features.HIER_ONLY_FEATURES` (fp32, tf32) fits without it.

Predict ``t_roof * exp(g(spec) + f(row))``.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from opcast.train.estimators.base import RooflineEstimator
from opcast.train.estimators.hier_predictor import HierPredictor
from opcast.train.estimators.xgb import XGBEstimator
from opcast.train.features import ABSOLUTE_DEVICE_FEATURES, DEVICE_FEATURES, HIER_ONLY_FEATURES, MMA_FEATURES

SHAPE_FEATURES: Final = ("relative", "all", "no-device")
"""What the shape model reads: every input but the absolute device specs (``relative``), every
input (``all``), or no device feature at all (``no-device``)."""
LEVEL_FEATURES: Final = (
    "log_peak_flops",
    "log_mem_bw_bytes_per_s",
    "log_ridge",
    "log_sm_count",
    "log_l2_bytes",
    "log_clock_hz",
    *MMA_FEATURES,
)
MIN_LEVEL_ROWS: Final = 20
"""A device with fewer saturated rows than this takes its level from all its rows."""


def device_codes(x: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(device code of every row, the first row of each device): devices are the distinct
    tuples of ``x[:, columns]`` (NaN equal to NaN), numbered in order of first appearance."""
    if not len(columns) or not len(x):
        return np.zeros(len(x), dtype=np.int64), np.zeros(min(len(x), 1), dtype=np.int64)
    key = np.nan_to_num(x[:, columns], nan=-1e300)
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # renumber by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()].astype(np.int64), first[order].astype(np.int64)


def ridge(specs: np.ndarray, levels: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(mean, scale, coef, intercept) of the ridge fit of ``levels`` on the standardised rows of
    ``specs`` (one row per device, equal weights); the intercept is the mean level, so a large
    ``alpha`` or a single device predicts the mean. A feature constant over the devices gets scale
    1 and coefficient 0."""
    p = specs.shape[1]
    mean = specs.mean(axis=0) if len(specs) else np.zeros(p)
    scale = specs.std(axis=0) if len(specs) else np.ones(p)
    scale = np.where(np.isfinite(scale) & (scale > 1e-12), scale, 1.0)
    z = (specs - mean) / scale
    intercept = float(levels.mean())
    # pinv: with no penalty and fewer devices than features (or one device) the normal equations are
    # singular; the minimum-norm solution gives a direction the devices do not span no weight
    coef = np.linalg.pinv(z.T @ z + alpha * np.eye(p)) @ (z.T @ (levels - intercept)) if p else np.zeros(0)
    return mean, scale, coef, intercept


class HierEstimator(RooflineEstimator, HierPredictor):
    """Device level from the spec sheet + xgb shape model, for one op group."""

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...] | None = None,
        shape_features: str = "relative",
        level_features: tuple[str, ...] = LEVEL_FEATURES,
        level_alpha: float = 4.0,
        level_min_roof_s: float = 1e-5,
        rounds: int = 1,
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
        self.shape_features = shape_features
        self.level_features = level_features
        self.level_alpha = level_alpha
        self.level_min_roof_s = level_min_roof_s
        self.rounds = rounds
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

    # ------------------------------------------------------------------ columns

    def _columns(self, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(columns identifying the device, columns of the shape model, columns of the level model)."""
        if self.shape_features not in SHAPE_FEATURES:
            raise ValueError(f"shape_features must be one of {', '.join(SHAPE_FEATURES)}, not {self.shape_features!r}")
        if self.feature_names is None:  # a plain matrix: one device, every column a shape input
            return np.zeros(0, dtype=np.int64), np.arange(width, dtype=np.int64), np.zeros(0, dtype=np.int64)
        names = list(self.feature_names)
        device = [i for i, n in enumerate(names) if n in DEVICE_FEATURES]
        drop = {"all": set(), "relative": ABSOLUTE_DEVICE_FEATURES, "no-device": set(DEVICE_FEATURES)}
        shape = [i for i, n in enumerate(names) if n not in drop[self.shape_features]]
        level = [names.index(n) for n in self.level_features if n in names]
        return (np.array(device, dtype=np.int64), np.array(shape, dtype=np.int64), np.array(level, dtype=np.int64))

    def _present(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``idx`` less the :data:`HIER_ONLY_FEATURES` columns that no row of ``x`` has (the
        tensor-core family of an fp32 or tf32 group): no input of either model, so such a group
        fits exactly as it did before they existed."""
        if self.feature_names is None or not len(x):
            return idx
        absent = [i for i in idx.tolist() if self.feature_names[i] in HIER_ONLY_FEATURES and np.isnan(x[:, i]).all()]
        return np.array([i for i in idx.tolist() if i not in absent], dtype=np.int64)

    def _shape_estimator(self) -> XGBEstimator:
        """The xgb shape model with this estimator's tree hyper-parameters (the ones both declare)."""
        names = None if self.feature_names is None else tuple(self.feature_names[i] for i in self.shape_idx_)
        trees = {n: getattr(self, n) for n in XGBEstimator._get_param_names() if n != "feature_names"}
        return XGBEstimator(feature_names=names, **trees)

    # ------------------------------------------------------------------ fit

    def fit(self, X: Any, y: Any, *, groups: np.ndarray | None = None) -> HierEstimator:
        """Fit on a feature frame (or a plain matrix) and measured seconds ``y``; ``groups``
        (shape ids) keep a shape's rows on one side of the shape model's early-stopping split."""
        if not (isinstance(self.rounds, int) and self.rounds >= 1 and self.level_alpha >= 0):
            raise ValueError(f"rounds must be an int >= 1 and level_alpha >= 0; got {self.rounds}, {self.level_alpha}")
        x, feats, time_s = self._inputs(X, y, fit=True)
        device_idx, self.shape_idx_, self.level_idx_ = self._columns(x.shape[1])
        self.shape_idx_, self.level_idx_ = self._present(x, self.shape_idx_), self._present(x, self.level_idx_)
        ref = self._reference(feats, len(x))
        target = np.log(time_s) - np.log(ref)
        dev, first = device_codes(x, device_idx)
        n_dev = len(first)
        saturated = ref >= self.level_min_roof_s if feats is not None else np.ones(len(x), dtype=bool)
        level_rows = [np.flatnonzero(dev == d) for d in range(n_dev)]
        level_rows = [
            rows[saturated[rows]] if saturated[rows].sum() >= min(MIN_LEVEL_ROWS, len(rows)) else rows
            for rows in level_rows
        ]
        shape_in = x[:, self.shape_idx_] if feats is None else feats
        # Start from each device's median target over its saturated rows: the level carries the
        # devices' differences before the trees see them (trees that could tell the devices apart
        # by their relative features would otherwise absorb every level and leave g nothing).
        levels = np.array([np.median(target[rows]) for rows in level_rows]) if n_dev else np.zeros(0)
        for _ in range(self.rounds):
            shape = self._shape_estimator()
            shape.fit(shape_in, time_s * np.exp(-levels[dev]), groups=groups)
            self.shape_ = shape
            resid = target - levels[dev] - self.shape_log(x)
            levels = levels + np.array([np.median(resid[rows]) for rows in level_rows])
        self.device_levels_ = levels
        self.device_specs_ = x[first][:, self.level_idx_]
        self.level_mean_, self.level_scale_, self.level_coef_, self.level_intercept_ = ridge(
            self.device_specs_, levels, float(self.level_alpha)
        )
        self.n_devices_ = n_dev
        return self

    def config(self) -> dict[str, Any]:
        """What ``load`` needs besides the file, and what meta.json reports."""
        return {
            "hyper_parameters": self.hyper_parameters(),
            "n_trees": getattr(getattr(self, "shape_", None), "n_trees_", None),
            "devices": getattr(self, "n_devices_", None),
            "target": "log(time_s / t_roof_s) = level(device specs) + shape(row)",
        }
