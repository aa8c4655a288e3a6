"""Stand-ins for the package's objects in tests: ``from helpers.fakes import FixedModelSet``."""

from __future__ import annotations

from typing import Any

import numpy as np


class FixedModelSet:
    """A model set that covers every group and answers one microsecond a kernel, with the given
    ``predictors`` entries of meta.json (what :class:`opcast.predict.cost.LearnedKernelCost` reads:
    features, feature ranges, impl devices). ``asked`` keeps the impls of the last call."""

    def __init__(self, predictors: dict[str, Any]) -> None:
        self.meta = {"predictors": predictors}
        self.asked: list[Any] = []

    def covers(self, *key: Any) -> bool:
        return True

    def predict_s(self, cols: Any, device: Any) -> np.ndarray:
        self.asked = list(cols["impl"]) if "impl" in cols.columns else []
        return np.full(len(cols), 1e-6)


class FixedCollectives:
    """A collective source that takes ``seconds[kind]`` for every call (one entry of
    :class:`opcast.predict.comm.CollectiveCostModel`'s ``sources``)."""

    name = "fixed"

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    def covers(self, call: Any, device: Any) -> bool:
        return True

    def time_s(self, call: Any, device: Any) -> tuple[float, str]:
        return self.seconds[call.kind], "fixed"
