"""A fitted tile-MLP predictor: its file format and its numpy forward pass.

The model (NeuSight's tile/wave MLP, :mod:`opcast.train.estimators.tile_mlp`, which fits it) is

    t = t_roof * (ceil(waves) / waves) ** gamma / utilisation + overhead

with utilisation, overhead and gamma the three heads of an MLP over the standardised features.
Saved as a numpy archive of the standardisation and the layers' weights, so loading and
predicting need numpy only; sets saved before that hold a torch state dict (``.pt``), still read
with torch, tensors only (``weights_only=True``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from opcast.errors import OpcastError
from opcast.train.estimators import (
    RECORD_KEY,
    PredictorBase,
    checked_layers,
    layer_arrays,
    parse_record,
    read_arrays,
    record_array,
    require_arrays,
)
from opcast.train.features import matrix

if TYPE_CHECKING:  # pandas stays off the predict path: a model set passes a features Table
    import pandas as pd

    from opcast.train.features import Table

UTIL_FLOOR = 1e-3
OVERHEAD_UNIT_S = 1e-6
CLIP_SIGMA = 5.0
"""Standardised inputs are clipped to +-5 sigma, so a device or shape far outside the training
range saturates instead of sending a SiLU network (which extrapolates linearly) off to infinity."""
LOGIT_CLIP = 30.0


class TileMLPPredictor(PredictorBase):
    """The fitted network of one op group's tile-MLP predictor (what a model set loads)."""

    name = "tile-mlp"
    suffix = ".npz"
    """numpy archive of the standardisation and the layers' weights: loading needs no torch
    (sets saved before hold a torch state dict, ``.pt``, still read with torch, tensors only:
    ``weights_only=True``)."""

    # Set by fit or load (declared here for the type checker; no class-level values).
    mean_: np.ndarray
    std_: np.ndarray
    weights_: list[tuple[np.ndarray, np.ndarray]]

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        xs = (x - self.mean_) / self.std_
        return np.clip(np.nan_to_num(xs, nan=0.0, posinf=CLIP_SIGMA, neginf=-CLIP_SIGMA), -CLIP_SIGMA, CLIP_SIGMA)

    @staticmethod
    def _reference(feats: pd.DataFrame | Table | None, n_rows: int) -> np.ndarray:
        """log t_roof and log(ceil(waves) / waves) of every row: the roofline and wave quantisation
        terms; both 0 for a plain matrix (no feature frame): one full wave at a 1 s roofline."""
        if feats is None:
            return np.zeros((n_rows, 2))
        waves = feats["waves"].to_numpy(dtype=float)
        return np.column_stack(
            [np.log(feats["t_roof_s"].to_numpy(dtype=float)), np.log(np.maximum(np.ceil(waves), 1.0) / waves)]
        )

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row of a feature frame or Table (NaN where the roofline bound is NaN)."""
        assert self.feature_names is not None  # a predictor of a model set always names its inputs
        x = matrix(feats, self.feature_names)
        return self._seconds(x, self._reference(feats, len(x)))

    def _seconds(self, x: np.ndarray, aux: np.ndarray) -> np.ndarray:
        """Seconds from the model-input matrix and :meth:`_reference`'s two terms."""
        h = self._standardise(x)
        for i, (w, b) in enumerate(self.weights_):
            h = h @ w.T + b
            if i < len(self.weights_) - 1:
                h = h * (0.5 + 0.5 * np.tanh(0.5 * h))  # SiLU = h * sigmoid(h), overflow-free
        h = np.clip(h, -LOGIT_CLIP, LOGIT_CLIP)
        util = UTIL_FLOOR + (1 - UTIL_FLOOR) / (1.0 + np.exp(-h[:, 0]))
        overhead = np.logaddexp(0.0, h[:, 1]) * OVERHEAD_UNIT_S
        gamma = 1.0 / (1.0 + np.exp(-h[:, 2]))
        return np.exp(aux[:, 0] + gamma * aux[:, 1]) / util + overhead

    def save(self, path: Path, *, record: Mapping[str, Any] | None = None) -> Path:
        """Write ``<path>.npz``; ``record`` (what the file holds, see
        :data:`~opcast.train.estimators.RECORD_KEY`) is stored beside the arrays."""
        path = Path(path).with_suffix(self.suffix)
        arrays: dict[str, np.ndarray] = {
            "mean": np.asarray(self.mean_, dtype=np.float64),
            "std": np.asarray(self.std_, dtype=np.float64),
        }
        if record is not None:
            arrays[RECORD_KEY] = record_array(record)
        arrays.update(layer_arrays(self.weights_))
        with open(path, "wb") as fh:  # a file object: savez would append .npz to a bare path
            # numpy's stub checks **kwds against allow_pickle (a bool) too; every key here is an array name
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        est = cls._from_config(tuple(feature_names), config)
        path = Path(path)
        est.record_ = None
        if path.suffix == ".pt":  # model sets saved before the numpy archive
            state = _torch_state(path)
        elif path.suffix == cls.suffix:
            state = read_arrays(path)
        else:
            raise OpcastError(
                f"{path}: tile-mlp predictors are read from .npz or .pt (torch state dict) files only; "
                "re-fit with opcast train fit"
            )
        if RECORD_KEY in state:
            est.record_ = parse_record(state.pop(RECORD_KEY), path)
        est.mean_, est.std_, est.weights_ = _checked_layers(state, len(feature_names), path)
        return est


def _torch_state(path: Path) -> dict[str, Any]:
    """A torch state dict read with ``weights_only=True`` (tensors and plain containers only; no
    code runs), as numpy arrays; a tensor-free :data:`RECORD_KEY` entry is kept as its string."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch's unpickler refuses anything but tensors, however it fails
        why = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise OpcastError(f"{path} is not a readable torch state dict ({why}); re-fit with opcast train fit") from None
    if not isinstance(state, dict):
        raise OpcastError(
            f"{path} holds a {type(state).__name__}, not a torch state dict; re-fit with opcast train fit"
        )
    out: dict[str, Any] = {}
    for k, v in state.items():
        if k == RECORD_KEY:
            out[k] = v
        elif isinstance(v, torch.Tensor):
            out[str(k)] = v.detach().cpu().numpy()
        else:
            raise OpcastError(
                f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor; re-fit with opcast train fit"
            )
    return out


def _checked_layers(
    state: dict[str, np.ndarray], n_features: int, path: Path
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(mean, std, [(weight, bias), ...]) of a saved network, each checked to chain from
    ``n_features`` inputs to the three heads, so a corrupt or foreign file is a one-line
    :class:`OpcastError`, never a shape error in the middle of a prediction."""
    require_arrays(state, {"mean": "f", "std": "f"}, path)
    mean, std = (np.asarray(state[k], dtype=np.float64) for k in ("mean", "std"))
    if mean.shape != (n_features,) or std.shape != (n_features,):
        raise OpcastError(
            f"{path}: its standardisation has {mean.shape}/{std.shape} values for {n_features} features; "
            "it belongs to another predictor, re-fit with opcast train fit"
        )
    layers = checked_layers({k: v for k, v in state.items() if k not in ("mean", "std")}, n_features, 3, path)
    return mean, std, layers
