"""Leave-one-GPU-out on NeuSight's five GPUs, per estimator (issue 19).

    python benchmarks/unseen_gpus.py [--published ../shared/published] [--work DIR]
        [--estimators xgb,tile-mlp,neusight,hier,hier+bounds,xgb+bounds] [--gpus P4,T4]
        [--out benchmarks/results/unseen_gpus.md] [--protocol neusight|shipped]

NeuSight's protocol (arXiv 2407.13853; the split of ``benchmarks/train_benchmark.py`` (b)): for each
of P4, P100, T4, V100 and A100-40GB, fit on the other four GPUs' *train* sweeps (less any shape of
NeuSight's test files) and score the left-out GPU's *test* files: a GPU and shapes never seen.
FP32 on CUDA cores, forward kernels; GEMM rows of bmm and linear files reported apart, as NeuSight
does. ``--protocol shipped`` fits on every row of the four other GPUs instead, their test files included:
what ``models/default`` knows of a GPU it never saw, whose test shapes the other GPUs' test files hold
(the issue's check scores NeuSight's test shapes on H100, L4 and A100-80GB); its folds are cached apart.

Estimators: ``xgb``, ``tile-mlp`` and ``hier`` as ``opcast train fit --estimator NAME`` fits them (their
defaults), and ``neusight`` (:mod:`opcast.train.estimators.neusight`), scored twice from one fit:
with the tile of the profiled kernel of every test row (``neusight (profiled tiles)``: what
NeuSight's kernel-level test does, ``Trainer.test`` passes the test rows' tiles) and with the tile
of the nearest training row (``neusight (nearest tiles)``: what its end-to-end predictor does for a
GPU it has no profile of). ``hier`` (:mod:`opcast.train.estimators.hier`) is scored twice from one fit
too: with its level predicted from the spec sheet (``hier``) and with the mean of the training GPUs'
levels (``hier (mean level)``); with the oracle table, that says what each part contributes.
``<est>+bounds`` (``hier+bounds``, ``xgb+bounds``, ...) scores what ``opcast predict`` itself answers for the
left-out GPU: the fold's fit written as a model set (its four training devices' specs recorded), loaded with
:func:`opcast.predict.cost.load_kernel_cost` and asked for every test row through ``opcast predict kernels``'
converter (:func:`opcast.predict.batch.predict_frame`), so the physical bounds of
:meth:`opcast.predict.cost.learned.LearnedKernelCost.bound` apply. Three columns from one fit: ``<est>+bounds
(bounds off)`` (the same model set, bounds off: the raw estimator through predict's path), ``<est>+bounds``
(as landed: the resource-ratio rule reads each training device's recorded sustained share) and
``<est>+bounds (datasheet ratio)`` (every predictor's ``sustained_utilisation`` removed: the rule before
that, utilisations of datasheet rooflines compared directly); the rule that moved each row is kept beside
them (``BOUND_RULE``) and tabulated. On the
2-core machine the neusight fit is bounded (``NEUSIGHT_BENCH``: a smaller MLP, a larger learning
rate, at most ``max_samples`` rows visited); the numbers say so.

Every (estimator, left-out GPU) result is written to ``--work`` as it completes and reused, so an
interrupted run (Ctrl-C, SIGTERM) resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_benchmark import NEUSIGHT_OOD_MAPE, PUBLISHED, _cfg, _fit_predict, _neusight_label

NEUSIGHT_BENCH = {"hidden": 128, "num_layers": 8, "learning_rate": 1e-3, "max_samples": 300_000, "n_jobs": 1}
"""The bounded neusight fit of this benchmark (NeuSight: 512 units, 100 epochs, lr 1e-5..5e-3;
one thread: on the shared 2-core machine two torch threads wait on each other)."""
NEUSIGHT_MAX_ROWS = 30_000
"""Training rows per op group and fold for neusight: a seeded draw (numpy default_rng(0)) of at
most this many of the four GPUs' rows (NeuSight fits all of them; this bounds the wall time)."""

PROTOCOLS = {
    "neusight": "the other four GPUs' train sweeps, less every shape of NeuSight's test files (NeuSight's own split)",
    "shipped": "every row of the other four GPUs, their test files included: what models/default holds for a GPU "
    "it never saw (the issue's held-out check scores NeuSight's test shapes on H100, L4 and A100-80GB)",
}
"""Training rows of a fold (the left-out GPU's test files are scored in both)."""

ISSUE_LOGO = {"xgb (auto)": {"gemm (bmm)": 25.6, "gemm (linear)": 41.2, "all": 29.4}, "tile-mlp": {"all": 48.8}}


def load(published: Path, work: Path, protocol: str = "neusight") -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(training rows, test rows, devices) of ``protocol`` (:data:`PROTOCOLS`); a fold keeps the
    training rows of the four other GPUs and the test rows of the left-out one."""
    from opcast.collect.replay import run_replay
    from opcast.train.fit import load_training_frame, resolve_devices

    path = work / "neusight.parquet"
    if not path.is_file():
        run_replay("neusight", published / "neusight", work)
    df = load_training_frame([path])
    df = df.assign(label=_neusight_label(df))
    train, test = split_rows(df, protocol)
    return train, test, resolve_devices(pd.unique(df["device"].astype(object)))


def split_rows(df: pd.DataFrame, protocol: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training rows, test rows) of NeuSight's replayed rows under ``protocol``: test rows are those of its
    test files; ``neusight`` trains on the train sweeps less every shape (``point_id``) of a test file,
    ``shipped`` on every row (a fold then drops the left-out GPU's)."""
    is_test = df["source_file"].astype(str).str.contains("/dataset/test/").to_numpy()
    if protocol == "shipped":
        train = df
    else:
        train = df[~is_test & ~df["point_id"].isin(set(df.loc[is_test, "point_id"])).to_numpy()]
    return train.reset_index(drop=True), df[is_test].reset_index(drop=True)


def _neusight_frame(frame: pd.DataFrame, devices: dict) -> pd.DataFrame:
    from opcast.train.estimators.neusight import measured_tiles
    from opcast.train.fit import feature_frame

    return pd.concat([feature_frame(frame, devices), measured_tiles(frame)], axis=1)


def neusight_fold(train: pd.DataFrame, test: pd.DataFrame, devices: dict) -> dict[str, np.ndarray]:
    """Fit neusight per group on ``train``; predict ``test`` with profiled and with nearest tiles."""
    from opcast.train.estimators import NotApplicable
    from opcast.train.estimators.neusight import NeuSightEstimator
    from opcast.train.estimators.neusight_predictor import MEASURED_TILE_COLUMNS
    from opcast.train.features import group_keys, model_inputs

    ftr, fte = _neusight_frame(train, devices), _neusight_frame(test, devices)
    ktr, kte = group_keys(train).to_numpy(), group_keys(test).to_numpy()
    out = {"profiled": np.full(len(test), np.nan), "nearest": np.full(len(test), np.nan)}
    for key in pd.unique(kte):
        kind = str(key).split("-")[0]
        rows = np.flatnonzero(ktr == key)
        if len(rows) > NEUSIGHT_MAX_ROWS:
            rows = np.sort(np.random.default_rng(0).choice(rows, NEUSIGHT_MAX_ROWS, replace=False))
        est = NeuSightEstimator(feature_names=model_inputs(kind, "neusight"), **NEUSIGHT_BENCH)
        try:
            est.fit(ftr.iloc[rows], train["time_s_median"].to_numpy(dtype=float)[rows])
        except NotApplicable:
            continue
        pos = np.flatnonzero(kte == key)
        out["profiled"][pos] = est.predict_s(fte.iloc[pos])
        out["nearest"][pos] = est.predict_s(fte.iloc[pos].drop(columns=list(MEASURED_TILE_COLUMNS)))
    return out


def hier_fold(train: pd.DataFrame, test: pd.DataFrame, devices: dict) -> dict[str, np.ndarray]:
    """Fit hier per group on ``train`` (as ``opcast train fit --estimator hier``); predict ``test``
    with its spec level model (``hier``) and with the mean of the training devices' levels in its
    place (``hier (mean level)``): the level model's contribution, from one fit."""
    from opcast.train.features import features, group_keys
    from opcast.train.fit import fit_frame

    fitted, _, _ = fit_frame(train.reset_index(drop=True), devices, _cfg("hier"))
    out = {"hier": np.full(len(test), np.nan), "hier (mean level)": np.full(len(test), np.nan)}
    keys = group_keys(test).to_numpy()
    names = test["device"].to_numpy(dtype=object)
    for dev in pd.unique(names):
        feats = features(test[names == dev].reset_index(drop=True), devices[dev])
        dkeys = keys[names == dev]
        for key in pd.unique(dkeys):
            if key not in fitted:
                continue
            est, pos = fitted[key][0], np.flatnonzero(dkeys == key)
            shape, level = est.parts_log(feats.iloc[pos])
            roof = feats["t_roof_s"].to_numpy(dtype=float)[pos]
            rows = np.flatnonzero(names == dev)[pos]
            out["hier"][rows] = roof * np.exp(shape + level)
            out["hier (mean level)"][rows] = roof * np.exp(shape + float(np.mean(est.device_levels_)))
    return out


BOUNDS = "+bounds"
"""Suffix of an estimator scored through ``opcast predict``'s physical bounds (:func:`bounds_fold`)."""
BOUND_RULE = " [bound rule]"
"""Suffix of the cached column naming the bound rule that moved each row of a ``+bounds`` column."""


def _bound_variants(fitted: dict, devices: dict, train_devices: list[str], root: Path) -> dict[str, Path]:
    """The fold's fit as two model sets under ``root``: ``landed`` (as ``opcast train fit`` writes it:
    each predictor's ``sustained_utilisation`` recorded) and ``datasheet`` (the same files with every
    ``sustained_utilisation`` removed and the meta digest recomputed: the resource-ratio rule before
    the shares were recorded)."""
    import json

    from opcast.hardware import device_to_dict
    from opcast.train import artifacts

    meta = {"datasets": [], "device_specs": {d: device_to_dict(devices[d]) for d in train_devices}}
    landed = artifacts.write_model_set(root, "landed", fitted, meta)
    doc = json.loads((landed / "meta.json").read_text())
    for entry in doc["predictors"].values():
        entry.pop("sustained_utilisation", None)
    doc["meta_sha256"] = artifacts._meta_digest(doc)
    datasheet = root / "datasheet"
    datasheet.mkdir()
    for f in landed.iterdir():
        (datasheet / f.name).write_bytes(f.read_bytes())
    (datasheet / "meta.json").write_text(json.dumps(doc))
    return {"landed": landed, "datasheet": datasheet}


def bounds_fold(train: pd.DataFrame, test: pd.DataFrame, devices: dict, estimator: str) -> pd.DataFrame:
    """Fit ``estimator`` on ``train`` exactly as its raw column does (``_cfg``), write the fit as a model
    set and predict every ``test`` row through ``opcast predict``'s path (:func:`load_kernel_cost`,
    :func:`opcast.predict.batch.predict_frame`): bounds off, bounds as landed, bounds with datasheet
    ratios (:func:`_bound_variants`); beside each bounded column, the rule that moved each row."""
    import dataclasses
    import tempfile

    from opcast.predict.batch import predict_frame
    from opcast.predict.cost import LearnedKernelCost, load_kernel_cost
    from opcast.predict.cost.query import LEARNED
    from opcast.train.fit import fit_frame

    fitted, _, _ = fit_frame(train.reset_index(drop=True), devices, _cfg(estimator))
    name = estimator + BOUNDS
    cols = {f"{name} (bounds off)": None, name: "landed", f"{name} (datasheet ratio)": "datasheet"}
    out = {col: np.full(len(test), np.nan) for col in cols}
    rules = {col: np.full(len(test), "", dtype=object) for col, kind in cols.items() if kind}
    names = test["device"].to_numpy(dtype=object)
    with tempfile.TemporaryDirectory(prefix="opcast-logo-bounds-") as tmp:
        sets = _bound_variants(fitted, devices, sorted(pd.unique(train["device"].astype(object))), Path(tmp))
        for col, kind in cols.items():
            for dev in pd.unique(names):
                pos = np.flatnonzero(names == dev)
                cost = load_kernel_cost(sets[kind or "landed"])  # one fresh model per answer: no shared caches
                cost = dataclasses.replace(cost, physical_bounds=kind is not None)
                for source in cost.sources:  # bounds off: the raw answers, no scaling past the fitted sizes either
                    if isinstance(source, LearnedKernelCost):
                        source.wave_scaling = kind is not None
                rows = test.iloc[pos].reset_index(drop=True)
                asked = _Asked(cost)
                filled = predict_frame(rows, devices[dev], asked)
                learned = (filled["source_pred"] == LEARNED).to_numpy()  # the raw columns have no roofline rows
                out[col][pos[learned]] = filled["time_s_pred"].to_numpy(dtype=float)[learned]
                if kind:
                    moved = cost.bound_flags(devices[dev])
                    assert len(asked.kernels) == len(rows)
                    rules[col][pos] = [moved[k][0] if k in moved else "" for k in asked.kernels]
    frame = pd.DataFrame(out)
    for col, got in rules.items():
        frame[col + BOUND_RULE] = got
    return frame


class _Asked:
    """A kernel cost model that records the kernels :func:`opcast.predict.batch.predict_frame` asks it for
    (one per row, in row order: the rows' kernels as ``opcast predict kernels`` builds them)."""

    def __init__(self, cost) -> None:
        self.cost, self.kernels = cost, []

    def lookup(self, kernels, device):
        self.kernels = list(kernels)
        return self.cost.lookup(kernels, device)


def run(
    published: Path, work: Path, estimators: list[str], gpus: list[str] | None, log, protocol: str = "neusight"
) -> pd.DataFrame:
    """Predictions of every estimator on every left-out GPU's test rows (cached in ``work``)."""
    train, test, devices = load(published, work, protocol)
    log(f"neusight data: {len(train)} train rows, {len(test)} test rows, GPUs {', '.join(sorted(devices))}")
    parts = []
    for name in estimators:  # one estimator's five folds at a time: a bounded run ends with whole tables
        for dev in sorted(devices):
            if gpus and dev not in gpus:
                continue
            tr = train[train["device"] != dev].reset_index(drop=True)
            te = test[test["device"] == dev].reset_index(drop=True)
            cache = work / f"logo-{'' if protocol == 'neusight' else protocol + '-'}{name}-{dev}.parquet"
            if cache.is_file():
                got = pd.read_parquet(cache)
            else:
                t0 = time.perf_counter()
                if name == "neusight":
                    preds = neusight_fold(tr, te, devices)
                    got = pd.DataFrame(
                        {"neusight (profiled tiles)": preds["profiled"], "neusight (nearest tiles)": preds["nearest"]}
                    )
                elif name == "hier":
                    got = pd.DataFrame(hier_fold(tr, te, devices))
                elif name.endswith(BOUNDS):
                    got = bounds_fold(tr, te, devices, name.removesuffix(BOUNDS))
                else:
                    got = pd.DataFrame({name: _fit_predict(tr, te, devices, name)[0]})
                got.attrs = {}
                got.to_parquet(cache.with_suffix(".tmp"))
                cache.with_suffix(".tmp").replace(cache)  # whole or absent: a stopped run resumes here
                log(f"  {name} left out {dev}: {time.perf_counter() - t0:.0f} s")
            for col in got.columns:
                if col.endswith(BOUND_RULE):
                    continue
                rule = got[col + BOUND_RULE].to_numpy(dtype=object) if col + BOUND_RULE in got else ""
                parts.append(
                    te[["label", "device", "time_s_median"]].assign(
                        estimator=col, pred=got[col].to_numpy(), rule=rule, row=np.arange(len(te))
                    )
                )
    return pd.concat(parts, ignore_index=True)


def bound_moves(scored: pd.DataFrame) -> pd.DataFrame | None:
    """Per ``+bounds`` column, left-out GPU (and ``all`` of them) and op: how many test rows each bound rule
    moved, and their MAPE before (the same fit with the bounds off) and after. None when no ``+bounds``
    column was run."""
    from opcast.train.evaluate import ape_metrics

    def mape(g: pd.DataFrame) -> float:
        return round(ape_metrics(g["pred"].to_numpy(), g["time_s_median"].to_numpy())["mape"], 1)

    rows = []
    for col in pd.unique(scored["estimator"]):
        base = col.split(" (")[0]
        if not base.endswith(BOUNDS) or col == f"{base} (bounds off)":
            continue
        off = scored[scored["estimator"] == f"{base} (bounds off)"].set_index(["device", "row"])
        on = scored[scored["estimator"] == col]
        moved = on[on["rule"] != ""]
        pooled = moved.assign(device="all")  # every left-out GPU together
        for (dev, label, rule), g in pd.concat([moved, pooled]).groupby(["device", "label", "rule"]):
            before = off.loc[list(zip(on.loc[g.index, "device"], g["row"]))]
            rows.append(
                {
                    "column": col,
                    "left out": dev,
                    "op": label,
                    "rule": rule,
                    "rows": len(g),
                    "of": int((((on["device"] == dev) | (dev == "all")) & (on["label"] == label)).sum()),
                    "MAPE off": mape(before),
                    "MAPE on": mape(g),
                }
            )
    return pd.DataFrame(rows).set_index(["column", "left out", "op", "rule"]) if rows else None


def oracle_level(scored: pd.DataFrame) -> pd.DataFrame:
    """``scored`` with every prediction scaled by the median measured/predicted ratio of its
    (estimator, left-out GPU, op): what a perfect device-level model (one constant per GPU and op,
    known only from the held-out measurements) would leave of each estimator's error."""
    ratio = scored["time_s_median"] / scored["pred"]
    level = ratio.groupby([scored["estimator"], scored["device"], scored["label"]]).transform("median")
    return scored.assign(pred=scored["pred"] * level, estimator=scored["estimator"] + " x oracle level")


def tables(scored: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pooled MAPE per op and estimator, MAPE per op, left-out GPU and estimator)."""
    from opcast.train.evaluate import ape_metrics

    def mape(g: pd.DataFrame) -> float:
        return round(ape_metrics(g["pred"].to_numpy(), g["time_s_median"].to_numpy())["mape"], 1)

    pooled = scored.groupby(["label", "estimator"]).apply(mape, include_groups=False).unstack("estimator")
    pooled.loc["all"] = scored.groupby("estimator").apply(mape, include_groups=False)
    pooled["NeuSight paper"] = [NEUSIGHT_OOD_MAPE.get(op) for op in pooled.index]
    counts = scored[scored["estimator"] == scored["estimator"].iloc[0]].groupby("label").size()
    pooled.insert(0, "n", [int(counts.get(op, counts.sum())) for op in pooled.index])
    per_gpu = scored.groupby(["label", "device", "estimator"]).apply(mape, include_groups=False).unstack("estimator")
    return pooled, per_gpu


def hier_parts(pooled: pd.DataFrame, oracle: pd.DataFrame) -> pd.DataFrame | None:
    """What each part of hier contributes (pooled MAPE per op): the shape model with the mean of
    the training devices' levels, with the level predicted from the specs (hier), and with the
    held-out GPU's own level (an oracle: diagnosis only)."""
    cols = {
        "shape + mean training level": (pooled, "hier (mean level)"),
        "shape + spec level (hier)": (pooled, "hier"),
        "shape x oracle level": (oracle, "hier x oracle level"),
    }
    if any(col not in frame.columns for frame, col in cols.values()):
        return None
    return pd.DataFrame({name: frame[col] for name, (frame, col) in cols.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--published", type=Path, default=PUBLISHED)
    ap.add_argument("--work", type=Path, default=Path("/tmp/opcast-unseen-gpus"))
    ap.add_argument("--estimators", default="xgb,tile-mlp,neusight")
    ap.add_argument("--gpus", default="", help="comma-separated left-out GPUs (default: all five)")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables as markdown here")
    ap.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        default="neusight",
        help="training rows of a fold: " + "; ".join(f"{k}: {v}" for k, v in PROTOCOLS.items()),
    )
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    scored = run(
        args.published,
        args.work,
        [e for e in args.estimators.split(",") if e],
        [g for g in args.gpus.split(",") if g] or None,
        lambda m: print(m, file=sys.stderr, flush=True),
        args.protocol,
    )
    pooled, per_gpu = tables(scored)
    oracle, _ = tables(oracle_level(scored))
    text = (
        f"Training rows of a fold ({args.protocol}): {PROTOCOLS[args.protocol]}.\n\n"
        "## Leave-one-GPU-out on NeuSight's five GPUs, pooled over the left-out GPUs — MAPE %\n\n"
        + pooled.to_string()
        + "\n\n## The same with one oracle constant per (left-out GPU, op) — MAPE %\n\n"
        + "What a perfect device-level model would leave: each prediction times the median measured/predicted\n"
        + "ratio of its GPU and op (taken from the held-out measurements, so an upper bound, not a result).\n\n"
        + oracle.drop(columns=["NeuSight paper"]).to_string()
        + "\n\n## Per left-out GPU — MAPE %\n\n"
        + per_gpu.to_string()
        + f"\n\nwall time {time.perf_counter() - t0:.0f} s (cached folds reused); neusight fit {NEUSIGHT_BENCH}, "
        f"at most {NEUSIGHT_MAX_ROWS} rows a group\n"
    )
    moves = bound_moves(scored)
    if moves is not None:
        text += (
            "\n## Physical bounds: test rows each rule moved, and their MAPE % with the bounds off / on\n\n"
            + moves.to_string()
            + "\n"
        )
    parts = hier_parts(pooled, oracle)
    if parts is not None:
        text += (
            "\n## hier: what each part contributes, pooled — MAPE %\n\n"
            + "The same fits scored three ways; the oracle column reads the held-out GPU's measurements.\n\n"
            + parts.to_string()
            + "\n"
        )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
