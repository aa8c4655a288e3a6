"""NeuSight's tile-level predictor as an opcast estimator (``--estimator neusight``): the model of
:mod:`opcast.train.estimators.neusight_predictor` (what it reproduces of sitar-lab/NeuSight and
where opcast's data force a difference) and its fit.

The fit follows NeuSight's ``neusight/Model/trainer.py`` (l.23-135) and the configs of
``scripts/asplos/data/predictor/configs/MLP_WAVE_*.json``: 8 Linear layers of 512 units with
ReLU, no dropout, AdamW at a per-op learning rate (BMM 1e-5, LINEAR 5e-3, VEC 5e-4, LN and
SOFTMAX 1e-6), batches of 128 (GEMM), 64 (pointwise) or 16 (row-wise) rows, 100 epochs, the
SMAPE loss ``|t - p| / (t + p)`` on the predicted time, a random 80/20 split of the rows and the
epoch of the lowest validation MAPE kept. ``learning_rate`` and ``batch_size`` None take
NeuSight's value of the group's kind (the pooled ``gemm`` group takes BMM's: most of NeuSight's
GEMM rows are bmm). ``max_samples`` (rows visited in all; None: NeuSight's full 100 epochs) bounds
the fit's wall time on a small machine; ``benchmarks/unseen_gpus.py`` says what it used.

The tile of a GEMM row comes from the profiled kernel's name when the frame carries it
(:func:`measured_tiles`, columns :data:`~opcast.train.estimators.neusight_predictor.MEASURED_TILE_COLUMNS`),
as NeuSight trains and tests; the fit keeps a table of those rows' keys and tiles for the
nearest-row lookup of rows without a profile (NeuSight's ``MetaTable``), at most
``tile_table_rows`` of them (a seeded draw). A frame without profiled tiles (``opcast train fit``
on collected data) falls back to opcast's tile rule for both.
"""

from __future__ import annotations

import re
from typing import Any, Final

import numpy as np
import pandas as pd

from opcast.errors import OpcastError
from opcast.train.estimators import NotApplicable
from opcast.train.estimators.base import RooflineEstimator
from opcast.train.estimators.neusight_predictor import UTIL_FLOOR, NeuSightPredictor, mode_of

NEUSIGHT_LR: Final = {"mm": 1e-5, "vec": 5e-4, "row": 1e-6, "plain": 1e-3}
NEUSIGHT_BATCH: Final = {"mm": 128, "vec": 64, "row": 16, "plain": 16}

_TILE_NAME: Final = (
    re.compile(r"_mt(\d+)x(\d+)"),
    re.compile(r"sgemm_(\d+)x(\d+)"),
    re.compile(r"tilesize(\d+)x(\d+)"),
)
"""NeuSight's ``read_tile`` patterns, in its order: AMD ``_mt128x64``, cuBLAS ``sgemm_128x64``,
H100-style ``tilesize128x64`` (``neusight/Dataset/dataset.py`` l.49-79)."""


def gemm_tile_of_kernel(name: object) -> tuple[float, float]:
    """(tile rows, tile cols) in opcast's ``C[m, n]`` of a GEMM kernel name, NaN if it names none.
    cuBLAS is column-major, so a name's first number tiles its ``m``, which is opcast's ``n``."""
    text = str(name).lower() if isinstance(name, str) else ""
    for pattern in _TILE_NAME:
        found = pattern.search(text)
        if found:
            first, second = int(found.group(1)), int(found.group(2))
            return float(second), float(first)
    return np.nan, np.nan


def measured_tiles(frame: pd.DataFrame) -> pd.DataFrame:
    """The profiled tile of every row of a dataset frame with ``kernel_name`` and ``grid`` columns
    (replayed NeuSight data): GEMM rows' tile from the kernel name, pointwise rows'
    ``2 ** ceil(log2(numel / blocks))`` from the launch grid (NeuSight's ``read_tile``); NaN where
    neither says. Add the result's columns to a feature frame to fit or score with them."""
    n = len(frame)
    out = pd.DataFrame(
        {c: np.full(n, np.nan) for c in ("measured_tile_m", "measured_tile_n", "measured_tile_elems")},
        index=frame.index,
    )
    op = frame["op"].astype(object).to_numpy()
    if "kernel_name" in frame.columns:
        gemm = np.flatnonzero(op == "gemm")
        tiles = [gemm_tile_of_kernel(v) for v in frame["kernel_name"].to_numpy(dtype=object)[gemm]]
        if tiles:
            arr = np.array(tiles, dtype=float)
            out.iloc[gemm, 0], out.iloc[gemm, 1] = arr[:, 0], arr[:, 1]
    if "grid" in frame.columns and "numel" in frame.columns:
        vec = np.flatnonzero(op == "elementwise")

        def blocks(g: object) -> float:
            try:
                return float(np.prod([int(v) for v in str(g).split(",")]))
            except ValueError:
                return np.nan

        grid = np.array([blocks(g) for g in frame["grid"].to_numpy(dtype=object)[vec]], dtype=float)
        numel = frame["numel"].to_numpy(dtype=float)[vec]
        with np.errstate(all="ignore"):
            out.iloc[vec, 2] = 2.0 ** np.ceil(np.log2(numel / grid))
    return out


class NeuSightEstimator(RooflineEstimator, NeuSightPredictor):
    """NeuSight's utilisation MLP of one op group (torch for fitting, numpy for predicting)."""

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...] | None = None,
        hidden: int = 512,
        num_layers: int = 8,
        epochs: int = 100,
        batch_size: int | None = None,
        learning_rate: float | None = None,
        max_samples: int | None = None,
        val_fraction: float = 0.2,
        tile_table_rows: int = 50_000,
        seed: int = 0,
        n_jobs: int = 2,
    ) -> None:
        self.feature_names = feature_names
        self.hidden = hidden
        self.num_layers = num_layers
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.max_samples = max_samples
        self.val_fraction = val_fraction
        self.tile_table_rows = tile_table_rows
        self.seed = seed
        self.n_jobs = n_jobs

    def fit(self, X: Any, y: Any, *, groups: np.ndarray | None = None) -> NeuSightEstimator:
        """Fit on a feature frame (or a plain matrix) and measured seconds ``y``. ``groups`` is
        accepted for the protocol and unused: NeuSight splits rows at random."""
        import torch

        del groups
        if self.num_layers < 2:
            raise ValueError("num_layers must be at least 2 (NeuSight's MLPBlock)")
        x, feats, time_s = self._inputs(X, y, fit=True)
        try:
            self.mode_ = mode_of(None if feats is None else tuple(self.feature_names or ()))
        except OpcastError as err:
            raise NotApplicable(str(err)) from None
        if self.feature_names is not None and "log_link_bw_bytes_per_s" in self.feature_names:
            raise NotApplicable("neusight models kernels that run in waves over the SMs, not collectives")
        rng = np.random.default_rng(self.seed)
        self.tile_keys_, self.tile_table_ = np.zeros((0, 8)), np.zeros((0, 2))
        if self.mode_ == "mm":
            self._keep_tile_table(feats, x, rng)
        kern = self._kernels(feats, x)
        ok = np.isfinite(kern["inputs"]).all(axis=1) & np.isfinite(kern["roof"]) & (kern["roof"] > 0)
        bad_rows = np.unique(kern["row"][~ok])
        if len(bad_rows) == len(x):
            raise NotApplicable("neusight: no row has the device specs and shape its kernel model needs")
        keep_row = np.ones(len(x), dtype=bool)
        keep_row[bad_rows] = False
        torch.manual_seed(self.seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, self.n_jobs))
        try:
            self.weights_ = self._train(torch, kern, time_s, keep_row, rng)
        finally:
            torch.set_num_threads(threads)
        return self

    def _keep_tile_table(self, feats: Any, x: np.ndarray, rng: np.random.Generator) -> None:
        """The nearest-tile table: forward rows with a profiled tile (a seeded draw of at most
        ``tile_table_rows``)."""
        if "measured_tile_m" not in feats.columns:
            return
        tiles = np.column_stack([feats[c].to_numpy(dtype=float) for c in ("measured_tile_m", "measured_tile_n")])
        self.tile_keys_ = np.zeros((0, 8))  # _kernels reads no table for rows with a measured tile
        kern = self._kernels(feats, x)
        fwd = kern["part"] == 0  # a forward row's own GEMM (backward rows have no profiled tile)
        first, keys = kern["row"][fwd], kern["key"][fwd]
        good = np.isfinite(keys).all(axis=1) & np.isfinite(tiles[first]).all(axis=1)
        first, keys = first[good], keys[good]
        if len(first) > self.tile_table_rows:
            pick = np.sort(rng.choice(len(first), self.tile_table_rows, replace=False))
            first, keys = first[pick], keys[pick]
        self.tile_keys_, self.tile_table_ = keys, tiles[first]

    def _train(
        self,
        torch: Any,
        kern: dict[str, np.ndarray],
        time_s: np.ndarray,
        keep_row: np.ndarray,
        rng: np.random.Generator,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        n_rows = len(time_s)
        rows = np.flatnonzero(keep_row)
        val = np.zeros(n_rows, dtype=bool)
        if len(rows) >= 10:
            val[rng.choice(rows, int(round(self.val_fraction * len(rows))), replace=False)] = True
        train_rows = rows[~val[rows]]
        val_rows = rows[val[rows]]
        lr = self.learning_rate if self.learning_rate is not None else NEUSIGHT_LR[self.mode_]
        batch = self.batch_size if self.batch_size is not None else NEUSIGHT_BATCH[self.mode_]
        epochs = self.epochs
        if self.max_samples is not None:
            epochs = max(1, min(epochs, self.max_samples // max(len(train_rows), 1)))
        width = kern["inputs"].shape[1]
        layers: list[Any] = [torch.nn.Linear(width, self.hidden), torch.nn.ReLU()]
        for _ in range(self.num_layers - 2):
            layers += [torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(self.hidden, 3))
        net = torch.nn.Sequential(*layers)
        opt = torch.optim.AdamW(net.parameters(), lr=lr)
        # kernels grouped by row: a row's time is the sum of its kernels' (a GEMM backward has two)
        order = np.argsort(kern["row"], kind="stable")
        k_row = kern["row"][order]
        start = np.searchsorted(k_row, np.arange(n_rows))
        stop = np.searchsorted(k_row, np.arange(n_rows), side="right")
        t = {
            name: torch.tensor(np.nan_to_num(kern[name][order]), dtype=torch.float32)
            for name in ("inputs", "waves", "ops_per_wave", "roof")
        }
        target = torch.tensor(time_s, dtype=torch.float32)

        def predict(row_ids: np.ndarray) -> Any:
            counts = stop[row_ids] - start[row_ids]
            seg = np.repeat(np.arange(len(row_ids)), counts)
            idx = np.repeat(start[row_ids], counts) + (
                np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
            )
            ti = torch.as_tensor(idx)
            out = net(t["inputs"][ti])
            alpha, gamma = torch.sigmoid(out[:, 0]), torch.sigmoid(out[:, 2])
            waves = t["waves"][ti]
            util = torch.clamp(gamma - alpha / waves, min=UTIL_FLOOR)
            k_time = waves * t["ops_per_wave"][ti] / (t["roof"][ti] * util)
            return torch.zeros(len(row_ids)).index_add(0, torch.as_tensor(seg), k_time)

        gen = np.random.default_rng(self.seed + 1)
        best, best_state = np.inf, None
        self.epochs_run_ = 0
        for _ in range(epochs):
            self.epochs_run_ += 1
            net.train()
            perm = gen.permutation(train_rows)
            for s in range(0, len(perm), batch):
                ids = perm[s : s + batch]
                pred = predict(ids)
                truth = target[torch.as_tensor(ids)]
                loss = torch.mean(torch.abs(truth - pred) / (truth + pred))  # SMAPE (trainer.py l.42-43)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if len(val_rows):
                net.eval()
                with torch.no_grad():
                    p = predict(val_rows).numpy()
                score = float(np.mean(np.abs(p - time_s[val_rows]) / time_s[val_rows]))
                if score < best:  # the epoch of the lowest validation MAPE (trainer.py l.126-131)
                    best = score
                    best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        if best_state is not None:
            net.load_state_dict(best_state)
        return [
            (m.weight.detach().double().numpy().copy(), m.bias.detach().double().numpy().copy())
            for m in net
            if isinstance(m, torch.nn.Linear)
        ]

    def config(self) -> dict[str, Any]:
        return {
            "hyper_parameters": self.hyper_parameters(),
            "epochs_run": getattr(self, "epochs_run_", None),
            "mode": getattr(self, "mode_", None),
            "target": "time = waves * ops_per_wave / (roofline * (sigmoid(gamma) - sigmoid(alpha) / waves)), SMAPE",
        }
