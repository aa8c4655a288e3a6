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
stopping on held-out shapes. The fitted network, its file and the numpy forward pass are
:class:`~opcast.train.estimators.tile_mlp_predictor.TileMLPPredictor`'s, which this estimator
extends with scikit-learn's API and the fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opcast.train.estimators import NotApplicable
from opcast.train.estimators.base import RooflineEstimator
from opcast.train.estimators.tile_mlp_predictor import LOGIT_CLIP, OVERHEAD_UNIT_S, UTIL_FLOOR, TileMLPPredictor
from opcast.train.splits import grouped_mask


class TileMLPEstimator(RooflineEstimator, TileMLPPredictor):
    """Tile/wave MLP of one op group (torch for fitting, numpy for predicting)."""

    def __init__(
        self,
        *,
        feature_names: tuple[str, ...] | None = None,
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
        self.feature_names = feature_names
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.max_samples = max_samples
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.patience = patience
        self.val_fraction = val_fraction
        self.seed = seed
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------ fit

    def fit(self, X: Any, y: Any, *, groups: np.ndarray | None = None) -> TileMLPEstimator:
        """Fit on a feature frame (or a plain matrix, see :mod:`~opcast.train.estimators.base`) and
        measured seconds ``y``; ``groups`` (shape ids) keep a shape's rows on one side of the
        early-stopping split."""
        import torch

        x, feats, time_s = self._inputs(X, y, fit=True)
        if feats is not None and (
            "waves" not in feats.columns or not np.isfinite(feats["waves"].to_numpy(dtype=float)).all()
        ):
            raise NotApplicable("tile-mlp needs the tile/wave features; this op group has none (collectives)")
        if self.feature_names is not None and "log_link_bw_bytes_per_s" in self.feature_names:
            raise NotApplicable("tile-mlp models kernels that run in waves over the SMs, not collectives")
        torch.manual_seed(self.seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, self.n_jobs))
        try:
            self.mean_ = np.nanmean(x, axis=0)
            std = np.nanstd(x, axis=0)
            self.std_ = np.where(std > 1e-9, std, 1.0)
            self.mean_ = np.where(np.isfinite(self.mean_), self.mean_, 0.0)
            xs = self._standardise(x)
            aux = self._reference(feats, len(x))
            y = np.log(time_s)
            groups = np.arange(len(y)) if groups is None else groups
            val = grouped_mask(groups, self.val_fraction, self.seed) if len(y) >= 200 else np.zeros(len(y), dtype=bool)
            n = int((~val).sum())
            # Small groups still take >= 16 steps an epoch; large ones see at most max_samples rows
            # in all (>= 10 epochs) in batches of >= n/200, so a fit stays within a minute or two.
            batch = max(32, min(self.batch_size, n // 16), n // 200)
            epochs = min(self.epochs, max(10, self.max_samples // max(n, 1)))
            net = self._network(torch, x.shape[1])
            # fused: one kernel updates every parameter (torch >= 2.4 on the CPU); the same AdamW
            # update, a third less time a step than the per-tensor loop on a small network.
            opt = torch.optim.AdamW(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay, fused=True)
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

    def _network(self, torch: Any, width: int) -> Any:
        layers: list[Any] = []
        for h in self.hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.SiLU()]
            width = h
        head = torch.nn.Linear(width, 3)  # utilisation logit, overhead (softplus, us), tail exponent logit
        with torch.no_grad():
            head.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
        return torch.nn.Sequential(*layers, head)

    # ------------------------------------------------------------------ persistence

    def config(self) -> dict[str, Any]:
        return {
            "hyper_parameters": self.hyper_parameters(),
            "epochs_run": getattr(self, "epochs_run_", None),
            "target": "log(time_s) of t_roof * (ceil(waves)/waves)**gamma / utilisation + overhead",
        }


def _log_time(torch: Any, out: Any, aux: Any) -> Any:
    """log of the predicted seconds from the network's three heads (see the module docstring)."""
    out = torch.clamp(out, -LOGIT_CLIP, LOGIT_CLIP)
    util = UTIL_FLOOR + (1 - UTIL_FLOOR) * torch.sigmoid(out[:, 0])
    overhead = torch.nn.functional.softplus(out[:, 1]) * OVERHEAD_UNIT_S
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
