"""Per-group estimators: gradient-boosted trees (``xgb``) and NeuSight's tile-MLP (``tile-mlp``).

Each estimator is a scikit-learn regressor (``sklearn.base.BaseEstimator`` + ``RegressorMixin``):
its hyper-parameters are declared once, as ``__init__`` keyword arguments, and ``get_params`` /
``set_params``, ``clone`` and the hyper-parameters a model set records (``config()``) all derive
from them; ``fit(X, y)`` returns ``self``, fitted attributes end in ``_``, and
``tests/unit/test_estimator_contract.py`` runs scikit-learn's ``check_estimator`` and opcast's own
contract (save -> load predicts the same, deterministic fits) over every estimator of
:data:`ESTIMATORS`. Both learn a *normalised* target (time over the roofline bound on the row's
device), never raw seconds, reading the feature frame of :func:`opcast.train.features.features`
(see :mod:`opcast.train.estimators.base` for the two kinds of ``X``).

Each estimator is a subclass of a light *predictor* class (:data:`PREDICTORS`,
``xgb_predictor.py``, ``tile_mlp_predictor.py``) that holds the fitted state, predicts with numpy
and writes and reads the predictor file. A model set loads predictors, never estimators, so
predicting imports neither scikit-learn (with scipy, ~1.7 s) nor xgboost nor torch; fitting
imports them inside the methods that need them.

Reading a predictor file never runs code from it: numpy archives are read with
``allow_pickle=False`` (:func:`read_arrays`), xgboost only from its UBJSON/JSON bytes, torch state
dicts of older sets with ``weights_only=True``; pickled files (``.joblib``) are not read at all.
Each file also carries a small record of what it holds (:data:`RECORD_KEY`: group, estimator,
feature names), which :mod:`opcast.train.artifacts` compares with ``meta.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, Self, TypeVar

import numpy as np

from opcast.errors import OpcastError

if TYPE_CHECKING:
    import pandas as pd

    from opcast.train.features import Table


class Predictor(Protocol):
    """A fitted predictor as a model set loads it (:mod:`opcast.train.artifacts`): numpy only."""

    name: ClassVar[str]
    """The estimator's name as the CLI and ``meta.json`` spell it."""
    suffix: ClassVar[str]
    """The predictor file's suffix."""
    feature_names: tuple[str, ...] | None
    """The feature-frame columns the model reads, in order."""
    record_: dict[str, Any] | None
    """What a loaded file says it holds (:data:`RECORD_KEY`); None: saved without a record."""

    def predict_s(self, feats: pd.DataFrame | Table) -> np.ndarray:
        """Predicted seconds of every row of a feature frame (or its numpy :class:`Table`)."""
        ...

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        """Read a predictor file (and the ``config`` its ``meta.json`` entry records)."""
        ...


class Estimator(Predictor, Protocol):
    """A scikit-learn regressor that fits a :class:`Predictor` (what :mod:`opcast.train.fit`
    makes and :func:`opcast.train.artifacts.write_model_set` saves)."""

    def fit(self, X: Any, y: Any, *, groups: np.ndarray | None = None) -> Self:
        """Fit on a feature frame (or a plain matrix) and measured seconds; returns ``self``."""
        ...

    def predict(self, X: Any) -> np.ndarray:
        """Predicted seconds (scikit-learn's name; :meth:`predict_s` for a feature frame)."""
        ...

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The ``__init__`` arguments (scikit-learn)."""
        ...

    def set_params(self, **params: Any) -> Self:
        """Change ``__init__`` arguments (scikit-learn)."""
        ...

    def config(self) -> dict[str, Any]:
        """What ``meta.json`` records of the fit (hyper-parameters from ``get_params``) and
        :meth:`load` reads back."""
        ...

    def save(self, path: Path, *, record: Mapping[str, Any] | None = None) -> Path:
        """Write the predictor file (``path`` with :attr:`suffix`) holding ``record``."""
        ...


T = TypeVar("T")


def _xgb() -> type[Estimator]:
    from opcast.train.estimators.xgb import XGBEstimator

    return XGBEstimator


def _tile_mlp() -> type[Estimator]:
    from opcast.train.estimators.tile_mlp import TileMLPEstimator

    return TileMLPEstimator


def _neusight() -> type[Estimator]:
    from opcast.train.estimators.neusight import NeuSightEstimator

    return NeuSightEstimator


def _hier() -> type[Estimator]:
    from opcast.train.estimators.hier import HierEstimator

    return HierEstimator


def _xgb_predictor() -> type[Predictor]:
    from opcast.train.estimators.xgb_predictor import XGBPredictor

    return XGBPredictor


def _tile_mlp_predictor() -> type[Predictor]:
    from opcast.train.estimators.tile_mlp_predictor import TileMLPPredictor

    return TileMLPPredictor


def _neusight_predictor() -> type[Predictor]:
    from opcast.train.estimators.neusight_predictor import NeuSightPredictor

    return NeuSightPredictor


def _hier_predictor() -> type[Predictor]:
    from opcast.train.estimators.hier_predictor import HierPredictor

    return HierPredictor


class Registry(Mapping[str, Callable[[], type[T]]]):
    """An immutable name -> class-loader mapping. Asking whether any value is a name (a JSON
    value read from meta.json: a list, a dict) is a plain True or False, never a TypeError."""

    def __init__(self, loaders: Mapping[str, Callable[[], type[T]]]) -> None:
        self._loaders = dict(loaders)

    def __getitem__(self, name: str) -> Callable[[], type[T]]:
        return self._loaders[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


ESTIMATORS: Final[Registry[Estimator]] = Registry(
    {"xgb": _xgb, "tile-mlp": _tile_mlp, "neusight": _neusight, "hier": _hier}
)
"""Estimator name (as the CLI and ``meta.json`` spell it) -> its class, imported on demand."""
PREDICTORS: Final[Registry[Predictor]] = Registry(
    {
        "xgb": _xgb_predictor,
        "tile-mlp": _tile_mlp_predictor,
        "neusight": _neusight_predictor,
        "hier": _hier_predictor,
    }
)
"""Estimator name -> the light class that loads and runs its saved predictors."""


class PredictorBase:
    """Base of the light predictor classes: built from a ``meta.json`` entry with no
    hyper-parameters (:meth:`_from_config`), then filled by their ``load``. An estimator's
    ``_from_config`` (:class:`opcast.train.estimators.base.RooflineEstimator`) restores its
    hyper-parameters instead."""

    feature_names: tuple[str, ...] | None
    record_: dict[str, Any] | None
    """What a loaded file says it holds (None: a file saved without a record); set by load."""

    def __init__(self, *, feature_names: tuple[str, ...]) -> None:
        self.feature_names = feature_names

    @classmethod
    def _from_config(cls, feature_names: tuple[str, ...], config: Mapping[str, Any]) -> Self:
        """An unfitted instance to load a file into."""
        return cls(feature_names=feature_names)


class NotApplicable(OpcastError):
    """The estimator cannot model this op group (e.g. tile-mlp on collectives)."""


def _unknown(name: str) -> OpcastError:
    return OpcastError(f"unknown estimator {name!r}; use one of {', '.join(ESTIMATORS)} or auto")


def estimator_class(name: str) -> type[Estimator]:
    """The scikit-learn class of estimator ``name`` (imports scikit-learn)."""
    if name not in ESTIMATORS:
        raise _unknown(name)
    return ESTIMATORS[name]()


def predictor_class(name: str) -> type[Predictor]:
    """The class that loads and runs the saved predictors of estimator ``name`` (numpy only)."""
    if name not in PREDICTORS:
        raise _unknown(name)
    return PREDICTORS[name]()


RECORD_KEY: Final = "opcast_record"
"""Name of the array, in every predictor file, holding the JSON record of what the file holds:
``{"group": ..., "estimator": ..., "features": [...]}`` (a unicode scalar, no pickle)."""


def record_array(record: Mapping[str, Any]) -> np.ndarray:
    """``record`` as the unicode scalar array stored under :data:`RECORD_KEY`."""
    return np.array(json.dumps(dict(record), sort_keys=True))


def parse_record(value: Any, path: Path) -> dict[str, Any]:
    """The record stored under :data:`RECORD_KEY` (an array from :func:`record_array`, or the
    string itself in a torch state dict), or a one-line :class:`OpcastError`."""
    try:
        text = value.item() if isinstance(value, np.ndarray) and value.shape == () else value
        record = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        raise OpcastError(
            f"{path}: its {RECORD_KEY} is not a JSON object; the file is corrupt, re-fit with opcast train fit"
        )
    return record


def read_arrays(path: Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the numpy archive ``path`` (all of them, or those of ``names`` it holds),
    read with ``allow_pickle=False``: an object array (a pickle) is refused, never unpickled.
    Anything that is not a readable ``.npz`` raises :class:`OpcastError` in one line."""
    path = Path(path)
    wanted = None if names is None else set(names)
    try:
        blob = np.load(path, allow_pickle=False)
        if not isinstance(blob, np.lib.npyio.NpzFile):
            raise OpcastError(
                f"{path} is a bare numpy array, not an opcast predictor archive; re-fit with opcast train fit"
            )
        with blob:
            out = {k: blob[k] for k in blob.files if wanted is None or k in wanted}
    except OpcastError:
        raise
    except PermissionError as err:
        raise OpcastError(f"{path} cannot be read ({err.strerror}); fix its permissions (chmod a+r)") from None
    except Exception as err:  # whatever numpy or zipfile raise on a corrupt file is the file's fault
        why = (str(err).splitlines() or [type(err).__name__])[0][:160]
        if "Object arrays" in why:
            why = "it holds object arrays, i.e. pickles, which opcast never loads: unpickling can run code"
        elif "pickled data" in why:
            why = "not a numpy archive; opcast never unpickles a file: that can run code"
        raise OpcastError(
            f"{path} is not a readable opcast predictor archive ({why}); re-fit with opcast train fit"
        ) from None
    bad = [k for k, v in out.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise OpcastError(f"{path}: member(s) {', '.join(bad)} are not numpy arrays; re-fit with opcast train fit")
    return out


def require_arrays(arrays: Mapping[str, np.ndarray], spec: Mapping[str, str], path: Path) -> None:
    """Check that ``arrays`` holds every name of ``spec`` with a dtype of the kinds it gives
    (numpy kind letters, e.g. ``"f"``, ``"iu"``, ``"b"``); one-line :class:`OpcastError` otherwise."""
    for name, kinds in spec.items():
        arr = arrays.get(name)
        if arr is None:
            raise OpcastError(
                f"{path} lacks the array {name!r}; it is not a predictor of this kind, re-fit with opcast train fit"
            )
        if arr.dtype.kind not in kinds:
            raise OpcastError(
                f"{path}: array {name!r} has dtype {arr.dtype}, expected kind {kinds!r}; re-fit with opcast train fit"
            )


def layer_arrays(weights: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """An MLP's ``[(weight, bias), ...]`` as the ``layer<i>.weight`` / ``layer<i>.bias`` float32 arrays
    its ``.npz`` holds (read back by :func:`checked_layers`)."""
    arrays: dict[str, np.ndarray] = {}
    for i, (w, b) in enumerate(weights):
        arrays[f"layer{i}.weight"] = np.asarray(w, dtype=np.float32)
        arrays[f"layer{i}.bias"] = np.asarray(b, dtype=np.float32)
    return arrays


def checked_layers(
    state: Mapping[str, np.ndarray], width: int, outputs: int, path: Path
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``layer<i>`` weights and biases of ``state`` (its only arrays) as float64, each checked to
    chain from ``width`` inputs to ``outputs`` outputs, so a corrupt or foreign file is a one-line
    :class:`OpcastError`, never a shape error in the middle of a prediction."""
    count = len(state) // 2
    expected = {f"layer{i}.{part}" for i in range(count) for part in ("weight", "bias")}
    if not count or set(state) != expected:
        raise OpcastError(
            f"{path}: its arrays ({', '.join(sorted(state)[:6])}) are not layer0..layerN weights and biases; "
            "re-fit with opcast train fit"
        )
    layers = []
    for i in range(count):
        require_arrays(state, {f"layer{i}.weight": "f", f"layer{i}.bias": "f"}, path)
        w, b = state[f"layer{i}.weight"].astype(np.float64), state[f"layer{i}.bias"].astype(np.float64)
        if w.ndim != 2 or w.shape[1] != width or b.shape != (w.shape[0],):
            raise OpcastError(
                f"{path}: layer {i} has weights {w.shape} and bias {b.shape} after a layer of {width}; "
                "re-fit with opcast train fit"
            )
        layers.append((w, b))
        width = w.shape[0]
    if width != outputs:
        raise OpcastError(
            f"{path}: the network ends in {width} outputs, not its {outputs} heads; re-fit with opcast train fit"
        )
    return layers
