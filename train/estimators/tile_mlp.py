"""NeuSight's tile model (Lee et al., ASPLOS'25, arXiv 2407.13853, Sec. 4), one MLP per op group.

A kernel is split into tiles (thread blocks) that run in ``waves = tiles / sm_count`` over the
SMs. A wave's work is bounded by the roofline of the SMs it occupies; an MLP predicts how close
a tile gets to that bound (its utilisation, in (0, 1], a sigmoid), so the prediction can never
beat the roofline, and the tiles' time is aggregated over the waves:

    t = t_roof * (ceil(waves) / waves) ** gamma / utilisation + overhead

``t_roof * ceil(waves) / waves`` is the time of ``ceil(waves)`` full waves of tiles at the
roofline (a partly filled last wave costs a whole wave, and a kernel of fewer tiles than SMs
leaves SMs idle); ``gamma`` in [0, 1] (a sigmoid output) lets the network soften that
quantisation where the library's real tiling differs from our tile heuristic (split-K,
persistent kernels). ``overhead`` (a softplus output, in microseconds) is the fixed launch and
ramp cost that NeuSight leaves out and that dominates small kernels. All three heads read the
same standardised features (the group's declared list), so they can depend on the GPU's specs.
The loss is the squared log error, i.e. relative error. Trained with Adam on the CPU with early
stopping on held-out shapes; inference is a numpy forward pass of the saved state dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcast.errors import OpcastError
from opcast.train.estimators import RECORD_KEY, NotApplicable, parse_record, read_arrays, record_array, require_arrays
from opcast.train.features import matrix
from opcast.train.splits import grouped_mask

_UTIL_FLOOR = 1e-3
_OVERHEAD_UNIT_S = 1e-6
_CLIP_SIGMA = 5.0
"""Standardised inputs are clipped to +-5 sigma, so a device or shape far outside the training
range saturates instead of sending a SiLU network (which extrapolates linearly) off to infinity."""
_LOGIT_CLIP = 30.0


class TileMLPEstimator:
    """Tile/wave MLP of one op group (torch for fitting, numpy for predicting)."""

    name = "tile-mlp"
    suffix = ".npz"
    """numpy archive of the standardisation and the layers' weights: loading needs no torch
    (sets saved before hold a torch state dict, ``.pt``, still read with torch, tensors only:
    ``weights_only=True``)."""

    record_: dict[str, Any] | None
    """What a loaded file says it holds (None: a file saved without a record); set by load."""

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...],
        hidden: tuple[int, ...] = (128, 128, 64),
        epochs: int = 200,
        batch_size: int = 512,
        max_samples: int = 1_500_000,
        learning_rate: float = 2e-3,
        weight_decay: float = 1e-5,
        patience: int = 25,
        val_fraction: float = 0.15,
        seed: int = 0,
        n_jobs: int = 2,
    ) -> None:
        self.feature_names = tuple(feature_names)
        self.hidden = tuple(hidden)
        self.epochs = epochs
        self.batch_size = batch_size
        self.max_samples = max_samples
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.patience = patience
        self.val_fraction = val_fraction
        self.seed = seed
        self.n_jobs = n_jobs

    def hyper_parameters(self) -> dict[str, Any]:
        return {
            "hidden": list(self.hidden),
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "max_samples": self.max_samples,
            "learning_rate": self.learning_rate,
            "weight_decay": self.weight_decay,
            "patience": self.patience,
            "val_fraction": self.val_fraction,
            "seed": self.seed,
        }

    # ------------------------------------------------------------------ fit

    def fit(self, feats: pd.DataFrame, time_s: np.ndarray, *, groups: np.ndarray | None = None) -> TileMLPEstimator:
        import torch

        if "waves" not in feats.columns or not np.isfinite(feats["waves"].to_numpy(dtype=float)).all():
            raise NotApplicable("tile-mlp needs the tile/wave features; this op group has none (collectives)")
        if "log_link_bw_bytes_per_s" in self.feature_names:
            raise NotApplicable("tile-mlp models kernels that run in waves over the SMs, not collectives")
        torch.manual_seed(self.seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, self.n_jobs))
        try:
            x = matrix(feats, self.feature_names)
            self.mean_ = np.nanmean(x, axis=0)
            std = np.nanstd(x, axis=0)
            self.std_ = np.where(std > 1e-9, std, 1.0)
            self.mean_ = np.where(np.isfinite(self.mean_), self.mean_, 0.0)
            xs = self._standardise(x)
            aux = self._aux(feats)
            y = np.log(np.asarray(time_s, dtype=float))
            groups = np.arange(len(y)) if groups is None else groups
            val = grouped_mask(groups, self.val_fraction, self.seed) if len(y) >= 200 else np.zeros(len(y), dtype=bool)
            n = int((~val).sum())
            # Small groups still take >= 16 steps an epoch; large ones see at most max_samples rows
            # in all (>= 10 epochs) in batches of >= n/200, so a fit stays within a minute or two.
            batch = max(32, min(self.batch_size, n // 16), n // 200)
            epochs = min(self.epochs, max(10, self.max_samples // max(n, 1)))
            net = self._network(torch)
            opt = torch.optim.AdamW(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
            tx = torch.tensor(xs[~val], dtype=torch.float32)
            ta = torch.tensor(aux[~val], dtype=torch.float32)
            ty = torch.tensor(y[~val], dtype=torch.float32)
            vx, va, vy = (torch.tensor(a[val], dtype=torch.float32) for a in (xs, aux, y))
            gen = torch.Generator().manual_seed(self.seed)
            best, best_state, stale = np.inf, None, 0
            epochs_run = 0
            for _ in range(epochs):
                epochs_run += 1
                net.train()
                order = torch.randperm(n, generator=gen)
                for start in range(0, n, batch):
                    idx = order[start : start + batch]
                    loss = torch.mean((_log_time(torch, net(tx[idx]), ta[idx]) - ty[idx]) ** 2)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                sched.step()
                if len(vy):
                    net.eval()
                    with torch.no_grad():
                        score = float(torch.mean((_log_time(torch, net(vx), va) - vy) ** 2))
                    if score < best - 1e-6:
                        best, stale = score, 0
                        best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
                    else:
                        stale += 1
                        if stale >= self.patience:
                            break
            if best_state is not None:
                net.load_state_dict(best_state)
            self.epochs_run_ = epochs_run
            self.weights_ = _numpy_layers(net)
        finally:
            torch.set_num_threads(threads)
        return self

    def _network(self, torch: Any) -> Any:
        layers: list[Any] = []
        width = len(self.feature_names)
        for h in self.hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.SiLU()]
            width = h
        head = torch.nn.Linear(width, 3)  # utilisation logit, overhead (softplus, us), tail exponent logit
        with torch.no_grad():
            head.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
        return torch.nn.Sequential(*layers, head)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        xs = (x - self.mean_) / self.std_
        return np.clip(np.nan_to_num(xs, nan=0.0, posinf=_CLIP_SIGMA, neginf=-_CLIP_SIGMA), -_CLIP_SIGMA, _CLIP_SIGMA)

    @staticmethod
    def _aux(feats: pd.DataFrame) -> np.ndarray:
        """log t_roof and log(ceil(waves) / waves): the roofline and wave quantisation terms."""
        waves = feats["waves"].to_numpy(dtype=float)
        return np.column_stack(
            [np.log(feats["t_roof_s"].to_numpy(dtype=float)), np.log(np.maximum(np.ceil(waves), 1.0) / waves)]
        )

    # ------------------------------------------------------------------ predict

    def predict_s(self, feats: pd.DataFrame) -> np.ndarray:
        """Predicted seconds of every row (NaN where the roofline bound is NaN)."""
        x = self._standardise(matrix(feats, self.feature_names))
        h = x
        for i, (w, b) in enumerate(self.weights_):
            h = h @ w.T + b
            if i < len(self.weights_) - 1:
                h = h * (0.5 + 0.5 * np.tanh(0.5 * h))  # SiLU = h * sigmoid(h), overflow-free
        aux = self._aux(feats)
        h = np.clip(h, -_LOGIT_CLIP, _LOGIT_CLIP)
        util = _UTIL_FLOOR + (1 - _UTIL_FLOOR) / (1.0 + np.exp(-h[:, 0]))
        overhead = np.logaddexp(0.0, h[:, 1]) * _OVERHEAD_UNIT_S
        gamma = 1.0 / (1.0 + np.exp(-h[:, 2]))
        return np.exp(aux[:, 0] + gamma * aux[:, 1]) / util + overhead

    # ------------------------------------------------------------------ persistence

    def config(self) -> dict[str, Any]:
        return {
            "hyper_parameters": self.hyper_parameters(),
            "epochs_run": getattr(self, "epochs_run_", None),
            "target": "log(time_s) of t_roof * (ceil(waves)/waves)**gamma / utilisation + overhead",
        }

    def save(self, path: Path, *, record: dict[str, Any] | None = None) -> Path:
        """Write ``<path>.npz``; ``record`` (what the file holds, see
        :data:`~opcast.train.estimators.RECORD_KEY`) is stored beside the arrays."""
        path = Path(path).with_suffix(self.suffix)
        arrays: dict[str, np.ndarray] = {
            "mean": np.asarray(self.mean_, dtype=np.float64),
            "std": np.asarray(self.std_, dtype=np.float64),
        }
        if record is not None:
            arrays[RECORD_KEY] = record_array(record)
        for i, (w, b) in enumerate(self.weights_):
            arrays[f"layer{i}.weight"] = np.asarray(w, dtype=np.float32)
            arrays[f"layer{i}.bias"] = np.asarray(b, dtype=np.float32)
        with open(path, "wb") as fh:  # a file object: savez would append .npz to a bare path
            # numpy's stub checks **kwds against allow_pickle (a bool) too; every key here is an array name
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: Path, *, feature_names: tuple[str, ...], config: dict[str, Any]) -> TileMLPEstimator:
        hp = dict(config.get("hyper_parameters", {}))
        hp["hidden"] = tuple(hp.get("hidden", ()))
        est = cls(feature_names=feature_names, **{k: v for k, v in hp.items() if k in _INIT_KEYS})
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
        est.mean_, est.std_, est.weights_ = _checked_layers(state, len(est.feature_names), path)
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
    names = [k for k in state if k not in ("mean", "std")]
    count = len(names) // 2
    expected = {f"layer{i}.{part}" for i in range(count) for part in ("weight", "bias")}
    if not count or set(names) != expected:
        raise OpcastError(
            f"{path}: its arrays ({', '.join(sorted(names)[:6])}) are not layer0..layerN weights and biases; "
            "re-fit with opcast train fit"
        )
    layers, width = [], n_features
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
    if width != 3:
        raise OpcastError(f"{path}: the network ends in {width} outputs, not the 3 heads; re-fit with opcast train fit")
    return mean, std, layers


_INIT_KEYS = frozenset(
    {
        "hidden",
        "epochs",
        "batch_size",
        "max_samples",
        "learning_rate",
        "weight_decay",
        "patience",
        "val_fraction",
        "seed",
    }
)


def _log_time(torch: Any, out: Any, aux: Any) -> Any:
    """log of the predicted seconds from the network's three heads (see the module docstring)."""
    out = torch.clamp(out, -_LOGIT_CLIP, _LOGIT_CLIP)
    util = _UTIL_FLOOR + (1 - _UTIL_FLOOR) * torch.sigmoid(out[:, 0])
    overhead = torch.nn.functional.softplus(out[:, 1]) * _OVERHEAD_UNIT_S
    gamma = torch.sigmoid(out[:, 2])
    roof = aux[:, 0] + gamma * aux[:, 1] - torch.log(util)
    return torch.logaddexp(roof, torch.log(overhead + 1e-12))


def _numpy_layers(net: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    return [
        (m.weight.detach().double().numpy().copy(), m.bias.detach().double().numpy().copy())
        for m in net
        if isinstance(m, torch.nn.Linear)
    ]
