"""Per-group estimators: gradient-boosted trees (``xgb``) and NeuSight's tile-MLP (``tile-mlp``).

Both follow scikit-learn's conventions: ``__init__`` stores hyper-parameters only, ``fit``
returns ``self`` and fitted attributes end in ``_``. Both learn a *normalised* target (time over
the roofline bound on the row's device), never raw seconds, and both read the feature frame of
:func:`opcast.train.features.features`. Each saves itself to one file (``save``) and is rebuilt
from that file plus its ``config()`` (``load``). xgboost and torch are imported inside the
methods that need them.
"""

from __future__ import annotations

from typing import Any, Final

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
