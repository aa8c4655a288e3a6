"""``opcast train fit``: one predictor per (op kind, direction, dtype class), with held-out scores.

For every op group with enough rows: the held-out folds are built first (each fold leaves out one
whole training device *and* a fifth of the shapes, so a fold's score is on a GPU and on shapes
the model never saw; a group measured on a single device gets a grouped shape split instead).
With ``--estimator auto`` both estimators are scored on the same folds and the one with the
lower held-out median APE is kept (ties, within 0.5 points, go to xgb, the smaller and faster one);
the reason is recorded. The chosen estimator is then refitted on all the group's rows. Devices
named with ``--holdout-device`` are left out of fitting altogether and scored at the end.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, cast

import numpy as np
import pandas as pd

from opcast.collect.io import read_runs
from opcast.errors import OpcastError
from opcast.hardware import (
    DeviceSpec,
    answers_as_trained,
    device_to_dict,
    die_twin,
    get_device,
    other_vendor,
    spec_from_dict,
)
from opcast.ops import get_op, op_kinds
from opcast.train.collectives import custom_backend
from opcast.train.estimators import ESTIMATORS, Estimator, NotApplicable, estimator_class
from opcast.train.estimators.blend import Blend
from opcast.train.evaluate import ape_metrics
from opcast.train.features import FEATURES, board_time_s, features, group_keys, model_inputs, unread_peaks
from opcast.train.splits import grouped_mask, leave_one_group_out, seeded_draw, shape_groups

EstimatorChoice = Literal["xgb", "tile-mlp", "neusight", "hier", "blend", "auto"]
AUTO_ESTIMATORS: Final = ("xgb", "tile-mlp", "hier")
"""What ``auto`` fits on its folds and chooses between, with :data:`BLEND` of two of them. The NeuSight baseline
needs the target GPU's profiled kernel tiles to transfer (benchmarks/results/unseen_gpus.md) and an 8 x 512 MLP per
fold: asked for by name only."""
BLEND: Final = "blend"
"""The geometric mean of :data:`BLEND_PARTS`' answers (:class:`opcast.train.estimators.blend.Blend`): a candidate
of ``auto`` for the left-out GPUs, scored from its parts' fold predictions (no fit of its own), or asked for by
name (``--estimator blend``: both parts fitted, the blend answering every GPU the group was not fitted on)."""
BLEND_PARTS: Final = ("xgb", "tile-mlp")
"""The blend's parts, the first the one its training GPUs get unless ``auto`` prefers the other there. In
leave-one-GPU-out over AIConfigurator's nine NVIDIA systems (``benchmarks/modern_gpus.py``, 2,000 training rows per
system and label, seed 0) the blend priced the left-out GPUs' bf16 GEMMs at 9.9 % MAPE (xgb 11.3, tile-MLP 10.5)
and fp8 at 8.0 % (8.6, 9.1), better than both on seven of nine GPUs for bf16: the two miss in different places.
Routed as a model set routes them (H100-SXM and H200 answered by xgb as die boards of each other), 10.3 and 7.8 %.
On attention and on NeuSight's fp32 GPUs it is not better everywhere (prefill fp8 18.3 % against xgb's 10.8: the
tile-MLP misses L40S by 219 %), hence a candidate, chosen per group on ``auto``'s own folds."""
TIE_POINTS = 0.5
"""auto keeps xgb unless another candidate's (tile-mlp, hier, the blend) held-out median APE is lower by more than
this many points."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FitConfig:
    """How ``opcast train fit`` fits a model set."""

    estimator: EstimatorChoice = "auto"
    """xgb, tile-mlp, neusight, hier, blend (:data:`BLEND`), or auto (per group among :data:`AUTO_ESTIMATORS` and
    the blend, by held-out median APE on the left-out devices)."""
    holdout_devices: tuple[str, ...] = ()
    """Devices left out of fitting entirely and scored at the end (leave-one-GPU-out by hand)."""
    ops: tuple[str, ...] = ()
    """Fit only these op kinds (default: every compute kind in the data)."""
    collectives: bool = False
    """Also fit collectives. Off by default: their times are properties of a cluster's topology
    and network, which the published data sample on three clusters only, and their held-out error
    on another cluster is 25-350 % MAPE; predict's analytical model of links does better there."""
    seed: int = 0
    """Seed of every split and estimator."""
    n_jobs: int = 2
    """Worker processes that run the fits (each fit runs one thread, see :data:`FIT_THREADS`)."""
    folds: int = 4
    """Held-out folds per group (each leaves one device out); 0 skips held-out scoring. One fold
    picks by one device's luck (on NeuSight's GPUs it flipped gemm to tile-mlp for A100); with two,
    adding MI355X's GEMMs to the data redrew gemm-fwd-half's pair and flipped it to the tile-MLP
    (within-GPU bf16 GEMM 7.3 -> 10.3 %); four are the default. Groups whose rows times devices
    is at most :attr:`all_devices_fold_rows` leave every device out in turn instead."""
    all_devices_fold_rows: int = 20_000
    """Groups whose folds, one per device, would fit at most this many rows in all (rows x devices)
    are cheap to fit, so their folds leave out each device in turn: the estimator choice then
    rests on every device, not on the two a seeded draw picked (with two of NeuSight's five GPUs,
    auto took the tile-MLP for layernorm where xgb transfers better). Larger groups draw
    :attr:`folds` devices. A bound on rows alone (20,000, set when the groups were NeuSight's five
    GPUs) let AIConfigurator's fp8 GEMM and attention groups (16,000-17,000 rows of eight or nine
    GPUs) fit 8-9 folds x 3 candidates: a quarter of the whole refit's fit time. At 100,000 rows x
    devices the fused-MoE, fp4 GEMM, fp32 layernorm and softmax groups (3,500-10,000 rows of 5-8 GPUs)
    still left every device out: 43 % of the refit's fold CPU for 7 of its 31 groups, because a fold's
    cost is not its rows: the tile-MLP fits every fold of more than ~5,000 rows on 1-1.5 M samples
    (200 epochs, or its ``max_samples``), ~10 s, where xgb and hier take 1-5 s. At 20,000 six of them draw
    four devices (their first four folds are the ones they had) and the refit's fit CPU fell by 14 %
    (benchmarks/train_default_models.sh); the other 25 groups fit the same folds and predictors as before."""
    fold_max_rows: int = 40_000
    """A fold fits on at most this many of its training rows (a seeded sample): enough to rank
    estimators and score transfer, and it keeps the fit of a large set within minutes."""
    shape_fraction: float = 0.2
    """Share of the shapes a fold holds out."""
    min_rows: int = 30
    """Groups with fewer rows are not fitted (reported as skipped)."""
    xgb_params: Mapping[str, Any] = field(default_factory=dict)
    """Hyper-parameter overrides for XGBEstimator."""
    tile_mlp_params: Mapping[str, Any] = field(default_factory=dict)
    """Hyper-parameter overrides for TileMLPEstimator."""
    keep_suspect_sweeps: bool = False
    """Fit on sweeps that :func:`suspect_sweeps` flags too (by default they are left out and
    listed in the model set's ``skipped``)."""

    def __post_init__(self) -> None:
        """Every option is checked here, before any data is read."""
        if self.estimator not in (*ESTIMATORS, BLEND, "auto"):
            raise OpcastError(
                f"unknown estimator {self.estimator!r}; use xgb, tile-mlp, neusight, hier, {BLEND} or auto"
            )
        if self.folds < 0:
            raise OpcastError(f"--folds {self.folds}: give 0 (no held-out folds) or more")
        if not 0 < self.shape_fraction < 1:
            raise OpcastError(f"shape_fraction must be in (0, 1), got {self.shape_fraction}")
        unknown = sorted(set(self.ops) - set(FEATURES))
        if unknown:
            raise OpcastError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
        if not 1 <= self.n_jobs <= 1024:
            raise OpcastError(f"--jobs {self.n_jobs}: give a number of worker processes from 1 to 1024")
        if not 0 <= self.seed < 2**32:
            raise OpcastError(f"--seed {self.seed}: give an integer from 0 to 2**32 - 1")
        if self.min_rows < 1 or self.fold_max_rows < 1 or self.all_devices_fold_rows < 0:
            raise OpcastError(
                f"min_rows and fold_max_rows must be >= 1, all_devices_fold_rows >= 0; got {self.min_rows}, "
                f"{self.fold_max_rows}, {self.all_devices_fold_rows}"
            )


@dataclass(kw_only=True, slots=True)
class FitResult:
    """What a fit produced."""

    path: Path | None
    """The model-set folder (None when nothing was written)."""
    groups: pd.DataFrame
    """One row per group: rows, devices, estimator, held-out metrics, why."""
    holdout: pd.DataFrame | None
    """Metrics on the --holdout-device rows, per op and device."""
    seconds: float
    skipped: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- data and devices


def portable_path(path: str | Path) -> str:
    """A path as recorded in meta.json: relative to the working folder when inside it, else just
    its last component, so artifacts never carry a path of the machine that fitted them (the
    content hash identifies the data)."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.name


def portable_command(command: str) -> str:
    """``command`` with every absolute path argument made portable (see :func:`portable_path`)."""
    return " ".join(portable_path(a) if a.startswith("/") else a for a in command.split())


def dataset_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Each dataset argument with its parquet files and a content hash (sha256 over the files'
    bytes in path order)."""
    from opcast.schema import dataset_files
    from opcast.train.artifacts import sha256_file

    out = []
    for p in paths:
        files = dataset_files(p)
        digest = hashlib.sha256()
        for f in files:
            digest.update(sha256_file(f).encode())
        out.append(
            {
                "path": portable_path(p),
                "files": [str(Path(f).relative_to(p)) if Path(p).is_dir() else Path(f).name for f in files],
                "sha256": digest.hexdigest(),
            }
        )
    return out


def _run_json_specs(paths: Iterable[str | Path]) -> dict[str, DeviceSpec]:
    """Device specs recorded by ``collect bench`` in run.json files beside the datasets."""
    found: dict[str, DeviceSpec] = {}
    for p in paths:
        p = Path(p)
        for run_json in [p / "run.json", *p.glob("**/run*.json")] if p.is_dir() else [p.parent / "run.json"]:
            if not run_json.is_file():
                continue
            runs = read_runs(run_json)
            for run in runs or ():
                spec = run.get("device_spec") if isinstance(run, dict) else None
                if isinstance(spec, dict) and spec.get("name"):
                    try:
                        found.setdefault(spec["name"], spec_from_dict(spec, str(run_json)))
                    except OpcastError:
                        continue
    return found


def resolve_devices(
    names: Iterable[str], datasets: Iterable[str | Path] = (), known: Mapping[str, Any] | None = None
) -> dict[str, DeviceSpec]:
    """A spec for every device name: the hardware catalog, a spec recorded in a dataset's
    run.json (``collect bench`` writes one), ``known`` specs (e.g. a model set's training
    devices), or this machine's CPU. Anything else is refused in one line."""
    names = list(names)
    out: dict[str, DeviceSpec] = {}
    recorded: dict[str, DeviceSpec] | None = None
    local = None
    for name in names:
        try:
            out[name] = get_device(name)
            continue
        except OpcastError:
            pass
        if recorded is None:
            recorded = _run_json_specs(datasets)
            for k, v in (known or {}).items():
                recorded.setdefault(k, v if isinstance(v, DeviceSpec) else spec_from_dict(v, f"model-set spec {k}"))
        if name in recorded:
            out[name] = recorded[name]
            continue
        if local is None and name.startswith("cpu-"):
            from opcast.collect.local_device import describe_local

            local = describe_local("cpu")
        if local is not None and local.name == name:
            out[name] = local
            continue
        raise OpcastError(
            f"device {name!r} of the dataset is neither in the hardware catalog nor described by a run.json "
            "beside the dataset nor this machine; add data/hardware/<name>.json or keep the run.json "
            "that opcast collect wrote"
        )
    return out


NO_TIME: Final = "rows without a time"
"""The key under which :func:`load_training_frame` counts the rows it leaves out."""


def load_training_frame(datasets: Sequence[str | Path], left_out: dict[str, int] | None = None) -> pd.DataFrame:
    """The rows of ``datasets`` usable for fitting (positive times), with a clean index. The rows
    left out (a NaN, zero, negative or infinite ``time_s_median``) are counted in ``left_out``
    under :data:`NO_TIME`, when given, so that the fit's ``skipped`` and adapt's ``ignored`` say so."""
    from opcast.schema import read_dataset

    if not datasets:
        raise OpcastError("give at least one dataset (a .parquet file or a folder written by opcast collect)")
    frame = read_dataset(list(datasets))
    t = frame["time_s_median"].astype(float)
    usable = np.isfinite(t) & (t > 0)
    if not usable.any():  # else the fit blamed --op and --holdout-device, and adapt the --gpu
        where = ", ".join(map(str, datasets))
        if not len(frame):
            raise OpcastError(f"{where}: the dataset holds no rows; give one with measurements (opcast collect)")
        raise OpcastError(
            f"{where}: none of the {len(frame)} rows has a positive, finite time_s_median; give measured rows "
            "(rows without a time are left out)"
        )
    if left_out is not None and not usable.all():
        left_out[NO_TIME] = int((~usable).sum())
    return frame[usable].reset_index(drop=True)


def feature_frame(frame: pd.DataFrame, devices: Mapping[str, DeviceSpec]) -> pd.DataFrame:
    """:func:`features` of rows spanning several devices, in ``frame``'s row order."""
    parts = []
    names = frame["device"].astype(object).to_numpy()
    for name in pd.unique(names):
        pos = np.flatnonzero(names == name)
        parts.append(features(frame.iloc[pos], devices[name]))
    return pd.concat(parts).loc[frame.index] if parts else pd.DataFrame(index=frame.index)


# --------------------------------------------------------------------------- fitting

FIT_THREADS: Final = 1
"""Threads of every fit: ``--jobs`` runs that many fits at once in worker processes instead.
A fit's parallel regions (an xgboost round, a small MLP batch) are too short to share, and on a
machine busy with other work every region waits for a descheduled thread. Measured on the shared
2-core box (load ~6, medians of interleaved runs): xgboost, 40k rows, 150 rounds, 5.7 s on one
thread and 14.9 s on two; a tile-MLP step (batch 512) 17 ms on one and 200 ms on two; earlier, a
31-row xgboost fit 1.9 s on one and 166 s on two. Processes never share a parallel region."""


def _make(name: str, kind: str, cfg: FitConfig) -> Estimator:
    params = dict(cfg.xgb_params if name == "xgb" else cfg.tile_mlp_params if name == "tile-mlp" else {})
    params.setdefault("seed", cfg.seed)
    params.setdefault("n_jobs", FIT_THREADS)
    return estimator_class(name)(feature_names=model_inputs(kind, name), **params)


def _folds(
    devices: np.ndarray, shapes: np.ndarray, cfg: FitConfig
) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(label, train mask, test mask, seen-device test mask) of each held-out fold. The test rows
    are the left-out device's held-out shapes; the seen-device rows are the same shapes on the
    devices the fold trains on (scored for the prediction intervals of known devices)."""
    if cfg.folds == 0:
        return []
    by_device = leave_one_group_out(devices)  # in sorted device order
    if len(by_device) >= 2:
        # Devices in the order of a seeded hash of their name, not a permutation of the sorted list:
        # adding a device to the data (say MI355X) then changes the folds only where the newcomer
        # draws among the first, instead of redrawing every large group's left-out devices.
        order = np.argsort(seeded_draw([str(dev) for dev, _ in by_device], cfg.seed), kind="stable")
        n_folds = len(by_device) if len(devices) * len(by_device) <= cfg.all_devices_fold_rows else cfg.folds
        out = []
        for i in order[:n_folds]:
            dev, left_out = by_device[i]
            held_shapes = grouped_mask(shapes, cfg.shape_fraction, cfg.seed + 1 + int(i))
            test = left_out & held_shapes
            train = ~left_out & ~held_shapes
            if test.any() and train.any():
                out.append((f"device {dev} + {cfg.shape_fraction:.0%} of shapes", train, test, ~left_out & held_shapes))
        return out
    held = grouped_mask(shapes, cfg.shape_fraction, cfg.seed + 1)
    empty = np.zeros(len(held), dtype=bool)
    return [(f"{cfg.shape_fraction:.0%} of shapes", ~held, empty, held)] if held.any() and (~held).any() else []


INTERVAL_LEVELS: tuple[float, ...] = (0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975, 0.995)
"""Quantile levels of the held-out log residuals stored per predictor (prediction intervals)."""


def residual_quantiles(pred: np.ndarray, true: np.ndarray) -> dict[str, Any] | None:
    """Split-conformal summary of ``log(measured / predicted)`` on held-out rows: n and the
    quantiles at :data:`INTERVAL_LEVELS`. Levels below the median take the lower order statistic
    and those above the higher one, so an interval between them covers at least its nominal share
    of exchangeable held-out rows (Vovk et al., *Algorithmic Learning in a Random World*, 2005;
    Lei et al., JASA 2018, split conformal). None without finite rows."""
    pred = np.asarray(pred, dtype=float)
    true = np.asarray(true, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(true) & (pred > 0) & (true > 0)
    r = np.log(true[ok] / pred[ok])
    if len(r) < 10:
        return None
    q = [
        float(np.quantile(r, lv, method="lower" if lv < 0.5 else "higher" if lv > 0.5 else "linear"))
        for lv in INTERVAL_LEVELS
    ]
    return {"n": int(len(r)), "levels": list(INTERVAL_LEVELS), "log_ratio": [round(v, 5) for v in q]}


def _fold_plan(
    folds: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], cfg: FitConfig
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(train, test, seen) masks each fold fits and scores on: at most :attr:`FitConfig.fold_max_rows`
    training rows and a quarter as many seen-device rows (residual quantiles need a sample, not
    every row), each a seeded draw (one generator consumed fold by fold, the same for every
    candidate, so the candidates are scored on the same rows)."""
    rng = np.random.default_rng(cfg.seed)
    out = []
    for _, train, test, seen in folds:
        if train.sum() > cfg.fold_max_rows:
            keep = np.zeros(len(train), dtype=bool)
            keep[rng.choice(np.flatnonzero(train), cfg.fold_max_rows, replace=False)] = True
            train = keep
        if seen.sum() > cfg.fold_max_rows // 4:
            pick = np.zeros(len(seen), dtype=bool)
            pick[rng.choice(np.flatnonzero(seen), cfg.fold_max_rows // 4, replace=False)] = True
            seen = pick
        out.append((train, test, seen))
    return out


def _fold_fit(
    name: str, kind: str, cfg: FitConfig, x: pd.DataFrame, y: np.ndarray, shapes: np.ndarray, x_pred: pd.DataFrame
) -> np.ndarray | None:
    """Predictions on ``x_pred`` of estimator ``name`` fitted on (``x``, ``y``); None when it does not
    apply. A module-level function of picklable arguments: it runs in a worker process too."""
    try:
        est = _make(name, kind, cfg).fit(x, y, groups=shapes)
    except NotApplicable:
        return None
    return np.asarray(est.predict_s(x_pred), dtype=float)


def _final_fit(
    name: str, kind: str, cfg: FitConfig, x: pd.DataFrame, y: np.ndarray, shapes: np.ndarray
) -> Estimator | NotApplicable:
    """Estimator ``name`` fitted on all of a group's rows (a NotApplicable is returned, not raised)."""
    try:
        return _make(name, kind, cfg).fit(x, y, groups=shapes)
    except NotApplicable as err:
        return err


OTHER_FIT: Final = "@every-vendor"
"""Marks the final fits on every row of a group that mixes vendors (:func:`vendor_rows`): they answer the devices
of the vendors other than the main one."""
OTHER_WHY: Final = "fitted on every vendor's rows: answers the devices of the other vendors (vendor_rows)"
BLEND_WHY: Final = (
    "with the entry's own estimator: the geometric mean of the two answers the GPUs the group was not fitted on (Blend)"
)


def _subset_args(
    name: str,
    kind: str,
    cfg: FitConfig,
    feats: pd.DataFrame,
    y: np.ndarray,
    shapes: np.ndarray,
    train: np.ndarray,
    pred: np.ndarray,
) -> tuple[Any, ...]:
    """:func:`_fold_fit`'s arguments for one fold: its training rows and the rows it predicts."""
    return name, kind, cfg, feats[train], y[train], shapes[train], feats[pred]


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """(``fn(*args)``, seconds it took): what a worker process returns."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


# Rough CPU seconds of a fit, only to start the longest tasks first (the order never changes a result).
_COST_S_PER_ROW: Final = {"xgb": 2e-4, "hier": 2e-4, "tile-mlp": 1e-4, "neusight": 3e-4}
_COST_S_FIXED: Final = {"tile-mlp": 10.0, "neusight": 20.0}


def _cost_s(name: str, rows: int) -> float:
    return _COST_S_FIXED.get(name, 0.5) + _COST_S_PER_ROW.get(name, 2e-4) * rows


class SeenSplit:
    """A group's two fitted estimators where ``auto`` chose differently for the two questions a model set
    answers: ``unseen`` (the lower held-out error on the left-out devices) for every device it was not
    fitted on, ``seen`` (the lower error on held-out shapes of the devices it was fitted on) for those
    ``devices``. It stands in for ``unseen`` everywhere an estimator is expected (name, features,
    predict_s: a left-out device's answer); :func:`_predict_fitted` and the written model set route the
    training devices to ``seen``. With MI355X's GEMMs in the data the tile-MLP transfers best to a left-out
    GPU on gemm-fwd-half (median 16.2 % vs xgb 18.9) while xgb is the better on the GPUs it has data of:
    one estimator had to give up one of the two. Where the group mixes vendors (:func:`vendor_rows`) both are
    fitted on the main vendor's rows (then ``seen`` may be ``unseen`` itself) and ``other``, fitted on every row,
    answers for the other vendors' devices."""

    def __init__(
        self,
        unseen: Estimator,
        seen: Estimator,
        devices: Sequence[str],
        specs: Mapping[str, DeviceSpec] | None = None,
        *,
        other: Estimator | None = None,
        vendors: Sequence[str] = (),
    ) -> None:
        self.unseen, self.seen, self.devices = unseen, seen, tuple(devices)
        self.specs: dict[str, DeviceSpec] = dict(specs or {})
        """The training devices' specs (:func:`fit_frame` fills them): a board of one's die answers as it."""
        self.other = other
        """Where ``unseen`` and ``seen`` were fitted on the rows of ``vendors`` alone (:func:`vendor_rows`): the
        estimator fitted on every row, which answers for the devices of every other vendor; else None."""
        self.vendors = tuple(vendors)

    def __getattr__(self, name: str) -> Any:
        if name in ("unseen", "seen", "devices", "specs", "other", "vendors"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.unseen, name)

    def for_device(self, device: DeviceSpec, unread: Iterable[str] = ()) -> Estimator:
        """The estimator that answers for ``device``: ``other`` for a device of a vendor the other two were not
        fitted on (:func:`opcast.hardware.other_vendor`), ``seen`` for a training device or a board of one's die
        for a group that never reads the fields ``unread`` (:func:`opcast.hardware.answers_as_trained`), else
        ``unseen``: the written model set's rules."""
        if self.other is not None and other_vendor(device, self.vendors):
            return self.other
        return self.seen if answers_as_trained(device, self.devices, self.specs, unread) else self.unseen


VENDOR_MIN_DEVICES: Final = 2
"""Devices the most-measured vendor of a group needs before its left-out-GPU predictor is fitted on that
vendor's rows alone (:func:`vendor_rows`)."""


def vendor_rows(devices: np.ndarray, vendor_of: Mapping[str, str]) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """``(mask, (vendor,))``: where a group mixes vendors, the rows of the vendor with the most devices (at least
    :data:`VENDOR_MIN_DEVICES`; a tie or a device of unknown vendor: None), on which the group is fitted as any
    other (``auto``'s held-out folds, its choices, the entry's rows and scores; its ``devices`` stay every vendor's,
    as the set's routing and physical bounds read them, the main vendor's in ``vendor_devices``); else None (every
    row). The estimator the training GPUs get, fitted once more on every row, is the group's ``other`` predictor: it
    answers for the devices of the other vendors, measured or not (:class:`SeenSplit`,
    :func:`opcast.hardware.other_vendor`).

    Another vendor's kernels are another library's (cuBLAS, hipBLASLt, oneDNN), and a predictor does not keep them
    apart on the GPUs it was not fitted on: in leave-one-GPU-out over AIConfigurator's nine NVIDIA systems
    (``benchmarks/modern_gpus.py``'s folds and caps: 2,000 training rows per system and label, seed 0) with Intel's
    Arc Pro B60 (AIConfigurator's replay) and AMD's MI300X and MI355X (aiter's tuned GEMMs) among the training rows,
    xgb priced the left-out NVIDIA GPUs' bf16 GEMMs at 13.0 % MAPE (A100 21.9, L40S 23.1) and fp8 at 10.0 % (H200
    10.9); fitted on NVIDIA's rows alone, 11.3 % (14.3, 16.9) and 8.6 % (5.8). The tile-MLP with the B60 among its
    rows 11.4 %, without 10.5 % (fp8 9.1 both). A one-hot vendor feature instead did not keep xgb apart (13.0 %
    with it). On the attention rows (the B60's) xgb's prefill bf16 20.1 -> 11.3 %, decode 18.0 -> 11.6 %; the
    tile-MLP 16.8 -> 13.4 / 18.1 -> 12.5 %. The twenty-sixth session's runs: ``benchmarks/results/modern_gpus.md``."""
    names = np.asarray(devices, dtype=object)
    vendors = np.array([vendor_of.get(str(n), "") for n in names], dtype=object)
    by_vendor = Counter(vendor_of.get(str(n), "") for n in pd.unique(names))
    if len(by_vendor) < 2 or "" in by_vendor:
        return None
    (top, count), (_, second) = by_vendor.most_common(2)
    if count < VENDOR_MIN_DEVICES or count == second:
        return None
    return vendors == top, (top,)


@dataclass(kw_only=True, slots=True)
class _Task:
    """One fit to run: a candidate on one held-out fold, or a group's final fit."""

    group: str
    what: tuple[str, ...]
    """("fold", estimator, fold index) or ("final", estimator)."""
    fn: Any
    args: Any
    """A callable returning ``fn``'s arguments: the rows are copied only when the task starts."""
    cost_s: float


class _GroupFit:
    """The held-out scoring and the final fit of one group, as tasks (see :func:`_run_tasks`)."""

    def __init__(
        self,
        key: str,
        frame: pd.DataFrame,
        feats: pd.DataFrame,
        cfg: FitConfig,
        other: tuple[pd.DataFrame, pd.DataFrame, tuple[str, ...]] | None = None,
    ) -> None:
        self.key, self.frame, self.feats, self.cfg = key, frame, feats, cfg
        self.kind = key.rsplit("-", 2)[0]
        self.y = frame["time_s_median"].to_numpy(dtype=float)
        self.shapes = shape_groups(frame)
        self.devices = frame["device"].astype(object).to_numpy()
        self.other = other
        """Where the group mixes vendors (:func:`vendor_rows`; ``frame`` then holds the main vendor's rows): every
        row of the group (rows, features) and the main vendors, for the ``other`` fit; else None."""
        self.folds = _folds(self.devices, self.shapes, cfg)
        self.plan = _fold_plan(self.folds, cfg)
        self.candidates = (
            list(AUTO_ESTIMATORS)
            if cfg.estimator == "auto"
            else list(BLEND_PARTS)
            if cfg.estimator == BLEND
            else [cfg.estimator]
        )
        self.preds: dict[tuple[str, int], np.ndarray | None] = {}
        self.seconds = 0.0
        self.chosen = ""
        self.why = ""
        self.chosen_seen = ""
        self.why_seen = ""
        self.scored: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None] = {}
        self.finals: dict[str, Estimator] = {}

    def score_tasks(self) -> list[_Task]:
        out = []
        for name in self.candidates:
            for i, (train, test, seen) in enumerate(self.plan):
                rows = int(train.sum())
                args = partial(
                    _subset_args, name, self.kind, self.cfg, self.feats, self.y, self.shapes, train, test | seen
                )
                out.append(
                    _Task(
                        group=self.key,
                        what=("fold", name, str(i)),
                        fn=_fold_fit,
                        args=args,
                        cost_s=_cost_s(name, rows),
                    )
                )
        return out

    def add_fold(self, name: str, i: int, pred: np.ndarray | None, seconds: float) -> None:
        self.preds[(name, i)] = pred
        self.seconds += seconds

    def final_tasks(self) -> list[_Task]:
        """Score the candidates on the folds, choose, and return the chosen estimator's final fit, and
        under ``auto`` a second one where another candidate is better on the training devices' held-out
        shapes (:class:`SeenSplit`); raises NotApplicable when no candidate applies."""
        for name in self.candidates:
            self.scored[name] = self._score(name)
        if set(BLEND_PARTS) <= set(self.candidates):
            self._blend_folds()
            self.scored[BLEND] = self._score(BLEND)
        scores = {n: (s[0] if s is not None else None) for n, s in self.scored.items()}
        usable = {n: s for n, s in scores.items() if s is not None}
        if not usable:
            raise NotApplicable(f"{self.key}: no estimator applies ({', '.join(self.candidates)})")
        self.chosen, self.why = _choose(usable, self.cfg.estimator, [f[0] for f in self.folds])
        if self.cfg.estimator != "auto" and scores[self.chosen] is None:
            raise NotApplicable(f"{self.key}: {self.chosen} does not apply")
        # the training GPUs keep one estimator: the blend answers the GPUs a group was not fitted on
        seen = {n: s[2] for n, s in self.scored.items() if s is not None and s[2] and n != BLEND}
        unseen_scored = all(s for s in usable.values())  # left-out devices were scored, not only shapes
        if self.cfg.estimator == "auto" and unseen_scored and len(seen) == len(usable) - (BLEND in usable) > 1:
            self.chosen_seen, self.why_seen = _choose(seen, "auto", ["held-out shapes of the training devices"])
        names = list(BLEND_PARTS) if self.chosen == BLEND else [self.chosen]
        if self.chosen_seen and self.chosen_seen not in names:
            names.append(self.chosen_seen)
        tasks = [
            _Task(
                group=self.key,
                what=("final", name),
                fn=_final_fit,
                args=partial(tuple, (name, self.kind, self.cfg, self.feats, self.y, self.shapes)),
                cost_s=_cost_s(name, len(self.y)),
            )
            for name in names
        ]
        if self.other is None:
            return tasks
        # The group mixes vendors (vendor_rows): the estimator the training GPUs get, fitted once more on every
        # row, answers for the other vendors' devices.
        rows, feats, _ = self.other
        name = self.seen_name()
        y, shapes = rows["time_s_median"].to_numpy(dtype=float), shape_groups(rows)
        every = _Task(
            group=self.key,
            what=("final", name, OTHER_FIT),
            fn=_final_fit,
            args=partial(tuple, (name, self.kind, self.cfg, feats, y, shapes)),
            cost_s=_cost_s(name, len(y)),
        )
        return [*tasks, every]

    def seen_name(self) -> str:
        """The estimator the training GPUs get: ``auto``'s choice on their held-out shapes, else the one chosen
        for the left-out GPUs (of a blend, its part :data:`BLEND_PARTS` names first)."""
        return self.chosen_seen or (BLEND_PARTS[0] if self.chosen == BLEND else self.chosen)

    def required(self) -> tuple[str, ...]:
        """The final fits without which the group is not fitted: the chosen estimator, or both parts of a blend."""
        return BLEND_PARTS if self.chosen == BLEND else (self.chosen,)

    def _blend_folds(self) -> None:
        """The blend's fold predictions: the geometric mean of its parts' (None where a part does not apply)."""
        for i in range(len(self.plan)):
            first, second = (self.preds.get((name, i)) for name in BLEND_PARTS)
            self.preds[(BLEND, i)] = None if first is None or second is None else np.sqrt(first * second)

    def estimator(self) -> Estimator:
        """The fitted estimator (a :class:`SeenSplit` where two were chosen, where the group mixes vendors:
        :func:`vendor_rows`, or where a :class:`~opcast.train.estimators.blend.Blend` answers the GPUs it was not
        fitted on), once every final fit ran."""
        if self.chosen == BLEND:
            first = self.seen_name() if self.seen_name() in BLEND_PARTS else BLEND_PARTS[0]
            second = next(n for n in BLEND_PARTS if n != first)
            unseen = cast(Estimator, Blend(self.finals[first], self.finals[second]))
            seen = self.finals.get(self.seen_name(), self.finals[first])
        else:
            unseen = self.finals[self.chosen]
            seen = self.finals.get(self.seen_name(), unseen)
        every_row = self.seen_name() + OTHER_FIT
        if self.other is not None and (other := self.finals.get(every_row)) is not None:
            return cast(Estimator, SeenSplit(unseen, seen, self._devices(), other=other, vendors=self.other[2]))
        return unseen if seen is unseen else cast(Estimator, SeenSplit(unseen, seen, self._devices()))

    def _devices(self) -> list[str]:
        return pd.unique(self.devices).tolist()

    def _score(self, name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None:
        """(pooled held-out metrics on the left-out devices, residual quantiles per device class
        ``unseen_device``/``seen_device``, pooled metrics on the training devices' held-out shapes or
        None without any) of estimator ``name`` over the folds; None when the estimator does not apply
        to the group."""
        if not self.folds:
            return {}, {}, None
        preds, trues, seen_p, seen_t = [], [], [], []
        for i, (_, test, seen) in enumerate(self.plan):
            got = self.preds[(name, i)]
            if got is None:
                return None
            both = test | seen
            pred = np.full(len(self.y), np.nan)
            pred[both] = got
            preds.append(pred[test])
            trues.append(self.y[test])
            seen_p.append(pred[seen])
            seen_t.append(self.y[seen])
        cat = np.concatenate
        metrics = (
            ape_metrics(cat(preds), cat(trues)) if sum(len(p) for p in preds) else ape_metrics(cat(seen_p), cat(seen_t))
        )
        residuals = {
            k: v
            for k, v in (
                ("unseen_device", residual_quantiles(cat(preds), cat(trues))),
                ("seen_device", residual_quantiles(cat(seen_p), cat(seen_t))),
            )
            if v is not None
        }
        seen_metrics = ape_metrics(cat(seen_p), cat(seen_t)) if sum(len(p) for p in seen_p) else None
        return metrics, residuals, seen_metrics

    def entry(self, est: Estimator, seconds: float) -> dict[str, Any]:
        self.seconds += seconds
        scores = {n: (s[0] if s is not None else None) for n, s in self.scored.items()}
        chosen_scored = self.scored.get(self.chosen)
        residuals = dict(chosen_scored[1]) if chosen_scored else {}
        extra: dict[str, Any] = {}
        if isinstance(est, SeenSplit) and est.seen is not est.unseen:
            seen_scored = self.scored.get(self.seen_name())
            if seen_scored is not None and "seen_device" in seen_scored[1]:
                residuals["seen_device"] = seen_scored[1]["seen_device"]
            seen_part = {
                "estimator": est.seen.name,
                "held_out": seen_scored and seen_scored[2],
                "why": self.why_seen or "the blend's first part",
            }
            # a Blend's training GPUs that get its first part, the entry's own file, need no seen part of their own
            own_seen = isinstance(est.unseen, Blend) and est.seen is est.unseen.primary
            if isinstance(est.unseen, Blend):
                extra["blend"] = {"why": BLEND_WHY, **({"seen": seen_part} if own_seen else {})}
            if not own_seen:
                extra["seen"] = seen_part
        if isinstance(est, SeenSplit) and est.other is not None and self.other is not None:
            extra["vendors"] = list(est.vendors)
            extra["other"] = {"estimator": est.other.name, "why": OTHER_WHY, "rows": len(self.other[0])}
            extra["vendor_devices"] = sorted(self._devices())
        seen_scores = {n: s[2] for n, s in self.scored.items() if s is not None and s[2]}
        if seen_scores:
            extra["candidates_seen"] = seen_scores
        # the devices a set's routing and physical bounds know the group by: every vendor's (the other part answers
        # for theirs); the rows and scores are the main vendor's
        every, every_feats = (self.frame, self.feats) if self.other is None else self.other[:2]
        return {
            "op": self.kind,
            "rows": int(len(self.frame)),
            "devices": sorted(pd.unique(every["device"].astype(object)).tolist()),
            **_impl_devices(every),
            "features": list(est.feature_names),
            "feature_ranges": _ranges(self.feats, est.feature_names),
            "held_out": scores.get(self.chosen) or None,
            "held_out_split": [f[0] for f in self.folds],
            "candidates": {n: (s or None) for n, s in scores.items()},
            "why": self.why,
            "residuals": residuals,
            **extra,
            **_sustained_entry(every, every_feats),
        }


PARALLEL_MIN_ROWS = 20_000
"""Fits of fewer rows in all run in this process: a worker process costs seconds to start."""


def _run_tasks(jobs: dict[str, _GroupFit], workers: int, done: Any) -> dict[str, tuple[Estimator, float] | str]:
    """Run every group's fold fits, then its final fit, on ``workers`` processes (in this process
    when 1); returns group -> (fitted estimator, seconds) or the reason it was not fitted.

    The longest pending task starts first; each runs one thread (:data:`FIT_THREADS`), so the
    machine never runs more threads than ``workers``. Every fit is the same
    computation whichever process runs it and in whichever order (seeds, rows and threads are
    fixed per task), so the model set is the same for any ``workers``. ``done(group)`` is called
    as each group completes."""
    pending: list[_Task] = []
    waiting: dict[str, int] = {}
    out: dict[str, tuple[Estimator, float] | str] = {}

    finals_left: dict[str, int] = {}

    def queue_final(key: str) -> None:
        try:
            tasks = jobs[key].final_tasks()
        except NotApplicable as err:
            out[key] = str(err)
            done(key)
            return
        finals_left[key] = len(tasks)
        pending.extend(tasks)

    for key, job in jobs.items():
        tasks = job.score_tasks()
        waiting[key] = len(tasks)
        pending.extend(tasks)
        if not tasks:
            queue_final(key)

    def finish(task: _Task, result: Any, seconds: float) -> None:
        job = jobs[task.group]
        if task.what[0] == "fold":
            job.add_fold(task.what[1], int(task.what[2]), result, seconds)
            waiting[task.group] -= 1
            if waiting[task.group] == 0:
                queue_final(task.group)
        else:
            job.seconds += seconds
            every_row = task.what[2:] == (OTHER_FIT,)
            if not isinstance(result, NotApplicable):
                job.finals[task.what[1] + (OTHER_FIT if every_row else "")] = result
            elif task.what[1] in job.required() and not every_row:
                job.finals.clear()  # the chosen one does not apply: the group is not fitted
                out[task.group] = str(result)
            finals_left[task.group] -= 1
            if finals_left[task.group] == 0:
                if task.group not in out:
                    out[task.group] = (job.estimator(), 0.0)
                done(task.group)

    if workers <= 1:
        while pending:
            pending.sort(key=lambda t: -t.cost_s)
            task = pending.pop(0)
            finish(task, *_timed(task.fn, *task.args()))
        return out

    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    running: dict[Future[Any], _Task] = {}
    free = workers
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))
    try:
        # Start every worker now: the executor spawns one on submit only when none is idle, and counts a
        # worker idle once per finished task, so after a run of one-at-a-time (multi-thread) tasks it
        # would never start the second (CPython's lazy spawning, 3.9+).
        for warm in [pool.submit(int) for _ in range(workers)]:
            warm.result()
        while pending or running:
            pending.sort(key=lambda t: -t.cost_s)
            while pending and free:
                task = pending.pop(0)
                free -= 1
                running[pool.submit(_timed, task.fn, *task.args())] = task
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                task = running.pop(fut)
                free += 1
                finish(task, *fut.result())
    except KeyboardInterrupt:  # Ctrl-C reaches the workers too, a SIGTERM taken as one only this process:
        for proc in list(pool._processes.values()):  # stop them, not wait for the fits they run
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out


def fit_group(key: str, frame: pd.DataFrame, feats: pd.DataFrame, cfg: FitConfig) -> tuple[Estimator, dict[str, Any]]:
    """Fit the predictor of one group (rows of ``frame``/``feats``) in this process, choosing the
    estimator with held-out folds when ``cfg.estimator`` is auto; returns (estimator, meta entry)."""
    job = _GroupFit(key, frame, feats, cfg)
    got = _run_tasks({key: job}, 1, lambda _: None)[key]
    if isinstance(got, str):
        raise NotApplicable(got)
    return got[0], job.entry(*got)


def _impl_devices(frame: pd.DataFrame) -> dict[str, dict[str, list[str]]]:
    """``{"impl_devices": {implementation: [devices that measured it]}}`` for a group whose rows
    name a registry ``impl`` (norms, softmax, cross-entropy, rope, attention), else nothing: predict
    holds a learned kernel only to the devices that measured its implementation
    (:func:`opcast.predict.cost.learned._impl_devices`)."""
    if "impl" not in frame.columns:
        return {}
    named = frame[frame["impl"].notna()]
    if named.empty:
        return {}
    by_impl = named.groupby(named["impl"].astype(str))["device"]
    return {"impl_devices": {str(impl): sorted(map(str, pd.unique(dev))) for impl, dev in by_impl}}


def _ranges(feats: pd.DataFrame, names: Sequence[str]) -> dict[str, list[float]]:
    """[min, max] of each input feature over the training rows (predict flags queries outside)."""
    out = {}
    for n in names:
        v = feats[n].to_numpy(dtype=float) if n in feats.columns else np.array([])
        v = v[np.isfinite(v)]
        if len(v):
            out[n] = [round(float(v.min()), 4), round(float(v.max()), 4)]
    return out


def _choose(scores: Mapping[str, dict[str, Any]], mode: str, split: list[str]) -> tuple[str, str]:
    if mode != "auto":
        return mode, f"{mode} requested"
    if len(scores) == 1:
        only = next(iter(scores))
        return only, f"only {only} applies to this group"
    if not all(scores.values()):
        return "xgb", "no held-out split possible (too few rows or shapes); xgb by default"
    # The median, not the mean: a fold's left-out device may hold rows no model can predict (a
    # throttled sweep, a differently built kernel), and their APE of hundreds of percent would
    # decide the choice by luck rather than by the typical row.
    mx = scores["xgb"]["median_ape"]
    on = "; ".join(split)
    best = min(scores, key=lambda n: (scores[n]["median_ape"], n != "xgb"))
    others = ", ".join(
        f"{n} {s['median_ape']:.1f} % (MAPE {s['mape']:.1f})" for n, s in sorted(scores.items()) if n != best
    )
    if best != "xgb" and scores[best]["median_ape"] < mx - TIE_POINTS:
        won = scores[best]
        return best, f"held-out median APE {won['median_ape']:.1f} % (MAPE {won['mape']:.1f}) vs {others}; {on}"
    others = ", ".join(
        f"{n} {s['median_ape']:.1f} % (MAPE {s['mape']:.1f})" for n, s in sorted(scores.items()) if n != "xgb"
    )
    return "xgb", (
        f"held-out median APE {mx:.1f} % (MAPE {scores['xgb']['mape']:.1f}) vs {others}; {on}; "
        f"ties within {TIE_POINTS} points go to xgb"
    )


SWEEP_SATURATED_S = 3e-3
"""Rows whose roofline time is at least this long are past launch latency and ramp-up: their
utilisation (roofline / measured) is the device's sustained rate for that op."""
SWEEP_MIN_ROWS = 20
SWEEP_MIN_RATIO = 0.45
"""A sweep whose median sustained utilisation is under this share of another sweep's of the same
op (kind, direction, dtype class and categorical parameters) on the same device is suspect."""


SUSTAINED_QUANTILE = 0.9
"""The share of its roofline a device sustains on an op: this quantile of the utilisation of its
long-running rows (at least :data:`SWEEP_MIN_ROWS` of them), per side of the ridge."""
SUSTAINED_L2_MULTIPLE = 4.0
"""A memory-bound row is long-running for :func:`sustained_utilisation` when it moves at least this many
times the device's L2 (streamed from DRAM, not served by the cache; at least 40-100 us at the roofline on
every catalog GPU, so launch latency is a small part), or when it lasts :data:`SWEEP_SATURATED_S` at the
roofline like a compute-bound one. Norms, softmax and elementwise kernels seldom last 3 ms."""


def sustained_utilisation(frame: pd.DataFrame, feats: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Device -> {"compute" | "memory": the share of its datasheet roofline it sustains on long-running
    rows of ``frame`` (:data:`SUSTAINED_QUANTILE` of ``t_roof_s / time``)}, where it has enough of them.
    Power-limited parts run far below the datasheet clock: NeuSight's T4 (70 W) sustains 0.49 of its
    FP32 peak on GEMMs of 3 ms or more where V100 sustains 0.97 and A100 0.85, and
    AIConfigurator's L40S 0.52 of its bf16 peak on 8192^3 where H100 reaches 0.72. Predict's physical
    bounds compare compute-bound utilisations relative to these
    (:meth:`opcast.predict.cost.learned.LearnedKernelCost.bound`), so a throttled training device's datasheet
    does not cap every stronger GPU at its share; the memory side is recorded for the reader."""
    if not {"t_roof_s", "log_compute_over_memory"} <= set(feats.columns) or not len(frame):
        return {}
    t_roof = feats["t_roof_s"].to_numpy(dtype=float)
    t = frame["time_s_median"].to_numpy(dtype=float)
    compute_bound = feats["log_compute_over_memory"].to_numpy(dtype=float) >= 0
    over_l2 = (
        feats["log_bytes_over_l2"].to_numpy(dtype=float)
        if "log_bytes_over_l2" in feats.columns
        else np.full(len(feats), -np.inf)
    )
    streamed = ~compute_bound & (over_l2 >= np.log(SUSTAINED_L2_MULTIPLE))
    sat = np.isfinite(t_roof) & (t > 0) & ((t_roof >= SWEEP_SATURATED_S) | streamed)
    if not sat.any():
        return {}
    side = np.where(compute_bound[sat], "compute", "memory")
    table = pd.DataFrame(
        {"device": frame["device"].astype(str).to_numpy()[sat], "side": side, "u": t_roof[sat] / t[sat]}
    )
    out: dict[str, dict[str, float]] = {}
    for (device, bound), g in table.groupby(["device", "side"]):
        if len(g) >= SWEEP_MIN_ROWS:
            out.setdefault(str(device), {})[str(bound)] = round(float(g["u"].quantile(SUSTAINED_QUANTILE)), 4)
    return out


def _sustained_entry(frame: pd.DataFrame, feats: pd.DataFrame) -> dict[str, Any]:
    got = sustained_utilisation(frame, feats)
    return {"sustained_utilisation": got} if got else {}


def suspect_sweeps(frame: pd.DataFrame, feats: pd.DataFrame) -> dict[str, str]:
    """Source files (sweeps) whose long-running rows ran far slower than another sweep of the same
    op on the same device -> why. Two sweeps of one op on one GPU cannot legitimately sustain rates
    more than 1 / :data:`SWEEP_MIN_RATIO` (2.2x) apart once both are past launch latency; one of
    them ran throttled (power or thermal capping, a shared GPU) or was timed wrongly, and no
    feature can tell its rows apart. Seen in NeuSight's data: the P4 ``linear`` sweep sustains 0.20
    of the FP32 roofline where the P4 ``bmm`` sweep sustains 0.53 and NeuSight's own P4 test file
    0.78; among all other sweeps of the published data the lowest ratio to their op's best sweep
    on the same device is 0.64. Only rows of ``frame`` are compared, and only rows on the same side
    of the ridge: a compute-bound row's utilisation is a share of the peak FLOP/s, a memory-bound
    row's a share of the bandwidth, two different rates (AIConfigurator's prefill sweep, 0.41 of
    the FLOP roofline on RTX PRO 6000, was flagged against its decode sweep's 0.96 of the
    bandwidth). :func:`suspect_groups` also says which predictor groups each sweep was flagged in."""
    return {sweep: why for sweep, (why, _) in suspect_groups(frame, feats).items()}


def suspect_groups(frame: pd.DataFrame, feats: pd.DataFrame) -> dict[str, tuple[str, set[str]]]:
    """:func:`suspect_sweeps` with, per sweep, the predictor groups
    (:func:`opcast.train.features.group_key`) in which it ran too slowly: only its rows of those
    groups are suspect (a file may hold several ops)."""
    if "source_file" not in frame.columns or not len(frame):
        return {}
    t_roof = feats["t_roof_s"].to_numpy(dtype=float)
    t = frame["time_s_median"].to_numpy(dtype=float)
    sat = np.isfinite(t_roof) & (t_roof >= SWEEP_SATURATED_S) & (t > 0)
    if not sat.any():
        return {}
    sub = frame[sat]
    cats = pd.Series("", index=sub.index, dtype=object)
    for kind in pd.unique(sub["op"].astype(object)):
        names = [n for n in get_op(str(kind)).categorical_params if n in sub.columns]
        if names:
            m = (sub["op"] == kind).to_numpy()
            # pandas-stubs: a masked Series.__setitem__ takes a list of values at runtime, the overloads do not
            cats[m] = ["|".join(map(str, r)) for r in sub.loc[m, names].itertuples(index=False)]  # type: ignore[call-overload]
    compute_bound = feats["log_compute_over_memory"].to_numpy(dtype=float)[sat] >= 0
    table = pd.DataFrame(
        {
            "device": sub["device"].astype(object).to_numpy(),
            "key": group_keys(sub).to_numpy(),
            "group": (group_keys(sub) + ":" + cats).to_numpy(),
            "bound": np.where(compute_bound, "compute-bound", "memory-bound"),
            "sweep": sub["source_file"].astype(object).fillna("").to_numpy(),
            "u": t_roof[sat] / t[sat],
        }
    )
    stats = table.groupby(["device", "key", "group", "bound", "sweep"]).u.agg(["size", "median"])
    stats = stats[stats["size"] >= SWEEP_MIN_ROWS]
    out: dict[str, tuple[str, set[str]]] = {}
    for (device, key, group, bound), g in stats.groupby(level=[0, 1, 2, 3]):
        if len(g) < 2:
            continue
        best = g["median"].idxmax()
        assert isinstance(best, tuple)  # a label of the (device, key, group, bound, sweep) index
        best_sweep = best[4]
        assert isinstance(best_sweep, str) and isinstance(group, str) and isinstance(key, str)  # strings
        best_median = g["median"].max()  # the value at best
        for idx, row in g.iterrows():
            assert isinstance(idx, tuple)
            ratio = row["median"] / best_median
            sweep = idx[4]
            if ratio < SWEEP_MIN_RATIO and sweep:
                why = (
                    f"{device} {group.rstrip(':')} ({bound}): sustains {row['median']:.2f} of the roofline on rows of "
                    f"{SWEEP_SATURATED_S * 1e3:g} ms or more, {ratio:.2f}x the {best_median:.2f} of "
                    f"{best_sweep} (a throttled or mistimed sweep; --keep-suspect-sweeps fits it anyway)"
                )
                first, keys = out.get(sweep, (why, set()))
                out[sweep] = (first, keys | {key})
    return out


def fit_frame(
    frame: pd.DataFrame, devices: Mapping[str, DeviceSpec], cfg: FitConfig = FitConfig(), progress: Any = None
) -> tuple[dict[str, tuple[Estimator, dict[str, Any]]], pd.DataFrame, dict[str, str]]:
    """Fit every group of ``frame`` (rows already filtered to training rows); returns
    (group -> (estimator, entry), the per-group summary, skipped group -> reason)."""
    if cfg.ops:
        frame = frame[frame["op"].isin(cfg.ops)]
    skipped: dict[str, str] = {}
    if not cfg.collectives and not cfg.ops:
        coll = frame["op"].isin(op_kinds(collective=True)).to_numpy()
        if coll.any():
            skipped["collectives"] = (
                f"{int(coll.sum())} rows not fitted as kernels (cluster-tagged ones become "
                "collectives.json's per-cluster laws; --collectives also fits cluster-blind kernel predictors)"
            )
            frame = frame[~coll]
    custom = custom_backend(frame)
    if custom.any():  # an engine's own all-reduce is another kernel than NCCL's: collectives.json's law
        skipped["custom all-reduce"] = (
            f"{int(custom.sum())} rows of serving engines' own all-reduce kernels (fitted only as "
            "collectives.json's all_reduce_custom and all_reduce_trtllm laws, never as NCCL's all_reduce)"
        )
        frame = frame[~custom]
    if not len(frame):
        raise OpcastError(
            "no training rows left (check --op and --holdout-device against the dataset's ops and devices)"
        )
    feats = feature_frame(frame, devices)
    ok = np.isfinite(feats["t_roof_s"].to_numpy(dtype=float))
    if not ok.all():
        skipped["rows without a roofline"] = f"{int((~ok).sum())} rows (device lacks the dtype, or missing parameters)"
    frame, feats = frame[ok], feats[ok]
    suspect = suspect_groups(frame, feats)
    if suspect and not cfg.keep_suspect_sweeps:
        # only the sweep's rows of the groups it was flagged in: a file may hold other ops too
        files = frame["source_file"].astype(object).fillna("").to_numpy()  # collected rows have none
        row_keys = group_keys(frame).to_numpy()
        drop = np.zeros(len(frame), dtype=bool)
        for sweep, (why, flagged) in suspect.items():
            rows = (files == sweep) & np.isin(row_keys, list(flagged))
            drop |= rows
            skipped[f"sweep {sweep}"] = f"{int(rows.sum())} rows of {', '.join(sorted(flagged))}: {why}"
        frame, feats = frame[~drop], feats[~drop]
    keys = group_keys(frame).to_numpy()
    groups = sorted(pd.unique(keys))
    fitted: dict[str, tuple[Estimator, dict[str, Any]]] = {}
    summary = []
    task = progress.add_task("fit", total=len(groups)) if progress is not None else None
    jobs: dict[str, _GroupFit] = {}
    vendor_of = {name: spec.vendor for name, spec in devices.items()}
    device_col = frame["device"].astype(object).to_numpy()
    for key in groups:
        pos = np.flatnonzero(keys == key)
        if len(pos) >= cfg.min_rows:
            split = vendor_rows(device_col[pos], vendor_of)
            if split is not None and int(split[0].sum()) >= cfg.min_rows:  # the main vendor's rows; every row too
                main = pos[split[0]]
                other = (frame.iloc[pos], feats.iloc[pos], split[1])
                jobs[key] = _GroupFit(key, frame.iloc[main], feats.iloc[main], cfg, other)
            else:
                jobs[key] = _GroupFit(key, frame.iloc[pos], feats.iloc[pos], cfg)

    def done(key: str) -> None:
        if task is not None:
            progress.update(task, description=f"fit {key}")
            progress.advance(task)

    workers = cfg.n_jobs if len(frame) >= PARALLEL_MIN_ROWS and len(jobs) else 1
    results = _run_tasks(jobs, workers, done)
    for key in groups:
        if key not in jobs:
            skipped[key] = f"{int((keys == key).sum())} rows < min_rows={cfg.min_rows}"
            done(key)
            continue
        got = results[key]
        if isinstance(got, str):
            skipped[key] = got
            continue
        est, seconds = got
        if isinstance(est, SeenSplit):
            est.specs = {d: devices[d] for d in est.devices if d in devices}
        entry = jobs[key].entry(est, seconds)
        entry["fit_seconds"] = round(jobs[key].seconds, 2)
        fitted[key] = (est, entry)
        h = entry["held_out"] or {}
        summary.append(
            {
                "group": key,
                "rows": entry["rows"],
                "devices": len(entry["devices"]),
                "estimator": _describe(est),
                "held_out_mape": h.get("mape"),
                "held_out_p90": h.get("p90_ape"),
                "within_10": h.get("within_10"),
                "why": entry["why"],
            }
        )
    return fitted, pd.DataFrame(summary), skipped


def _describe(est: Estimator) -> str:
    """The estimator(s) of a fitted group in words, for the fit's summary table."""
    if isinstance(est, Blend):
        return f"{BLEND} of {est.primary.name} and {est.blend.name}"
    if not isinstance(est, SeenSplit):
        return est.name
    text = _describe(est.unseen)
    text += "" if est.seen is est.unseen else f" ({est.seen.name} on its GPUs)"
    if est.other is not None:
        text += f"; {est.other.name} on every row for other vendors than {', '.join(est.vendors)}"
    return text


def fit_model_set(
    datasets: Sequence[str | Path],
    out: str | Path,
    *,
    name: str = "default",
    cfg: FitConfig = FitConfig(),
    progress: Any = None,
    command: str = "opcast train fit",
    collectives: Any = None,
) -> FitResult:
    """Read ``datasets``, fit every group, write ``out/name/`` (with the ``collectives`` laws, if
    any, inside the same atomic write) and score --holdout-device rows."""
    from opcast.train.artifacts import check_output, write_model_set
    from opcast.train.evaluate import predict_frame, score_table

    t0 = time.perf_counter()
    check_output(out, name)  # before any work: a bad --out or --name must not cost a fit
    no_time: dict[str, int] = {}
    frame = load_training_frame(datasets, no_time)
    devices = resolve_devices(pd.unique(frame["device"].astype(object)), datasets)
    held = set()
    for h in cfg.holdout_devices:
        canon = get_device(h).name if not any(h == d for d in devices) else h
        if canon not in devices:
            raise OpcastError(
                f"--holdout-device {h}: no rows of that device in the datasets (devices: {', '.join(sorted(devices))})"
            )
        held.add(canon)
    is_held = frame["device"].isin(held).to_numpy()
    train = frame[~is_held]
    fitted, summary, skipped = fit_frame(train, devices, cfg, progress)
    skipped = {**{k: f"{n} rows (time_s_median not a positive, finite number)" for k, n in no_time.items()}, **skipped}
    if not fitted:
        raise OpcastError("no op group could be fitted: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    records = dataset_records(datasets)
    train_devices = sorted(pd.unique(train["device"].astype(object)))
    meta = {
        "command": portable_command(command),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fit_config": {
            "estimator": cfg.estimator,
            "holdout_devices": sorted(held),
            "ops": list(cfg.ops),
            "collectives": cfg.collectives,
            "seed": cfg.seed,
            "fold_max_rows": cfg.fold_max_rows,
            "folds": cfg.folds,
            "all_devices_fold_rows": cfg.all_devices_fold_rows,
            "shape_fraction": cfg.shape_fraction,
            "min_rows": cfg.min_rows,
            "xgb_params": dict(cfg.xgb_params),
            "tile_mlp_params": dict(cfg.tile_mlp_params),
            "keep_suspect_sweeps": cfg.keep_suspect_sweeps,
        },
        "datasets": records,
        "rows": int(len(train)),
        "sources": sorted(pd.unique(train["source"].astype(object)).tolist()),
        "device_specs": {d: device_to_dict(devices[d]) for d in train_devices},
        "skipped": skipped,
    }
    holdout = None
    if held:

        class _Fitted:  # score the fitted estimators before they are written
            meta: ClassVar[dict[str, Any]] = {"predictors": {k: e for k, (_, e) in fitted.items()}}

            def predict_s(self, f: pd.DataFrame, device: DeviceSpec) -> np.ndarray:
                return _predict_fitted(fitted, f, device, devices)

        test = frame[is_held & ~custom_backend(frame)].reset_index(drop=True)  # as fitted: NCCL's collectives
        holdout = score_table(test, predict_frame(_Fitted(), test, devices))
        meta["holdout_metrics"] = json.loads(holdout.to_json(orient="records"))
    path = write_model_set(Path(out), name, fitted, meta, collectives=collectives)
    return FitResult(path=path, groups=summary, holdout=holdout, seconds=time.perf_counter() - t0, skipped=skipped)


def _predict_fitted(
    fitted: Mapping[str, tuple[Estimator, dict[str, Any]]],
    frame: pd.DataFrame,
    device: DeviceSpec,
    specs: Mapping[str, DeviceSpec] | None = None,
) -> np.ndarray:
    """Predicted seconds of ``frame``'s rows on ``device`` by in-memory fits, routed as a written model set
    routes them (:meth:`opcast.train.artifacts.ModelSet.predict_s`): a training device or a board of one's
    die to ``seen``, and, given the training devices' ``specs``, a board of a training GPU's die answered with
    :func:`opcast.train.features.board_time_s`."""
    out = np.full(len(frame), np.nan)
    frame = frame.reset_index(drop=True)
    keys = group_keys(frame).to_numpy()
    feats = features(frame, device)
    on_die: dict[str, pd.DataFrame] = {}
    for key in pd.unique(keys):
        if key in fitted:
            pos = np.flatnonzero(keys == key)
            est, entry = fitted[key]
            if isinstance(est, SeenSplit):
                est = est.for_device(device, unread_peaks(key))
            mine = feats.iloc[pos]
            got = est.predict_s(mine)
            die = None if specs is None else die_twin(device, entry.get("devices", ()), specs, unread_peaks(key))
            if die is not None:
                if die.name not in on_die:
                    on_die[die.name] = features(frame, die)
                got = board_time_s(got, est.predict_s(on_die[die.name].iloc[pos]), mine)
            out[pos] = got
    return out
