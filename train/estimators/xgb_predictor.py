"""A fitted xgb predictor: its file format and its predictions, numpy only.

The model is gradient-boosted trees on ``log(time / t_roof)``
(:class:`~opcast.train.estimators.xgb.XGBEstimator` fits it). Saved as one ``.npz``: the
booster's UBJSON bytes plus its trees flattened for :mod:`opcast.train.estimators.trees`, so that
loading and predicting a few hundred kernels needs numpy only; xgboost's own predictor is used for
batches too large for the numpy walk. The archive is read with ``allow_pickle=False`` and xgboost
only ever parses the UBJSON bytes, so loading runs no code from the file. Sets saved by
opcast <= 0.1 held a pickled ``.joblib`` instead; those are refused
(:mod:`opcast.train.artifacts`): re-fit them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from opcast.errors import OpcastError
from opcast.train.estimators import RECORD_KEY, PredictorBase, parse_record, read_arrays, record_array, require_arrays
from opcast.train.estimators.trees import TreeArrays
from opcast.train.features import matrix

if TYPE_CHECKING:  # pandas stays off the predict path: a model set passes a features Table
    import pandas as pd

    from opcast.train.features import Table


class XGBPredictor(PredictorBase):
    """The fitted trees of one op group's xgb predictor (what a model set loads)."""

    name = "xgb"
    suffix = ".npz"
    """Compressed numpy archive: the booster's UBJSON bytes and the flattened trees."""
    numpy_max_cells = 4_000_000
    """Rows x trees above which importing xgboost (~1 s) and using its C++ predictor beats the
    numpy walk (~0.1 us a cell on one core, ~10x slower per cell than xgboost)."""
    numpy_max_cells_imported = 100_000
    """The same once xgboost is imported anyway: only small batches stay with numpy."""

    n_jobs: int = 2
    """Threads of xgboost's predictor (an estimator sets its own)."""
    # Set by fit or load (declared here for the type checker; no class-level values).
    booster_: Any
    """The ``xgboost.Booster``, or None in a loaded predictor until :meth:`booster` rebuilds it."""
    trees_: TreeArrays | None
    n_trees_: int
    raw_: bytes
    """The booster's UBJSON bytes, as loaded."""
    path_: Path

    def _input_names(self) -> list[str] | None:
        """The inputs' names as xgboost records them (None: a plain matrix, xgboost's f0, f1, ...)."""
        return None if self.feature_names is None else list(self.feature_names)

    @staticmethod
    def _reference(feats: pd.DataFrame | Table | None, n_rows: int) -> np.ndarray:
        """The roofline bound of every row (``t_roof_s``) that the target is normalised by; 1 s
        for a plain matrix (no feature frame): the target is then the time itself."""
        return np.ones(n_rows) if feats is None else feats["t_roof_s"].to_numpy(dtype=float)

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row of a feature frame or Table (NaN where the roofline bound is NaN)."""
        assert self.feature_names is not None  # a predictor of a model set always names its inputs
        x = matrix(feats, self.feature_names)
        return self._seconds(x, self._reference(feats, len(x)))

    def _seconds(self, x: np.ndarray, t_roof: np.ndarray) -> np.ndarray:
        """Seconds from the model-input matrix and each row's roofline bound."""
        trees = getattr(self, "trees_", None)
        cells = len(x) * (trees.n_trees if trees is not None else 0)
        limit = self.numpy_max_cells_imported if "xgboost" in sys.modules else self.numpy_max_cells
        if trees is not None and (cells <= limit or not _xgboost_installed()):
            ratio = trees.margin(x)
        else:
            import xgboost as xgb

            booster = self.booster()
            booster.set_param({"nthread": self.n_jobs})
            ratio = booster.predict(xgb.DMatrix(x, feature_names=self._input_names())).astype(float)
        return t_roof * np.exp(ratio)

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

    def save(self, path: Path, *, record: Mapping[str, Any] | None = None) -> Path:
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
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        est = cls._from_config(tuple(feature_names), config)
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
                {k: blob[k] for k in blob if k.startswith("tree_")}, path=path, n_features=len(feature_names)
            )
        est.n_trees_ = est.trees_.n_trees if est.trees_ is not None else int(est.booster().num_boosted_rounds())
        return est


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
