"""Leave-one-GPU-out on NeuSight's five GPUs, per estimator (issue 19).

    python benchmarks/unseen_gpus.py [--published ../shared/published] [--work DIR]
        [--estimators xgb,tile-mlp,neusight,hier] [--gpus P4,T4] [--out benchmarks/results/unseen_gpus.md]

NeuSight's protocol (arXiv 2407.13853; the split of ``benchmarks/train_benchmark.py`` (b)): for each
of P4, P100, T4, V100 and A100-40GB, fit on the other four GPUs' *train* sweeps (less any shape of
NeuSight's test files) and score the left-out GPU's *test* files: a GPU and shapes never seen.
FP32 on CUDA cores, forward kernels; GEMM rows of bmm and linear files reported apart, as NeuSight
does.

Estimators: ``xgb``, ``tile-mlp`` and ``hier`` as ``opcast train fit --estimator NAME`` fits them (their
defaults), and ``neusight`` (:mod:`opcast.train.estimators.neusight`), scored twice from one fit:
with the tile of the profiled kernel of every test row (``neusight (profiled tiles)``: what
NeuSight's kernel-level test does, ``Trainer.test`` passes the test rows' tiles) and with the tile
of the nearest training row (``neusight (nearest tiles)``: what its end-to-end predictor does for a
GPU it has no profile of). ``hier`` (:mod:`opcast.train.estimators.hier`) is scored twice from one fit
too: with its level predicted from the spec sheet (``hier``) and with the mean of the training GPUs'
levels (``hier (mean level)``); with the oracle table, that says what each part contributes. On the
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

ISSUE_LOGO = {"xgb (auto)": {"gemm (bmm)": 25.6, "gemm (linear)": 41.2, "all": 29.4}, "tile-mlp": {"all": 48.8}}


def load(published: Path, work: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    from opcast.collect.replay import run_replay
    from opcast.train.fit import load_training_frame, resolve_devices

    path = work / "neusight.parquet"
    if not path.is_file():
        run_replay("neusight", published / "neusight", work)
    df = load_training_frame([path])
    df = df.assign(label=_neusight_label(df))
    is_test = df["source_file"].astype(str).str.contains("/dataset/test/").to_numpy()
    test_shapes = set(df.loc[is_test, "point_id"])
    train = df[~is_test & ~df["point_id"].isin(test_shapes).to_numpy()].reset_index(drop=True)
    test = df[is_test].reset_index(drop=True)
    return train, test, resolve_devices(pd.unique(df["device"].astype(object)))


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


def run(published: Path, work: Path, estimators: list[str], gpus: list[str] | None, log) -> pd.DataFrame:
    """Predictions of every estimator on every left-out GPU's test rows (cached in ``work``)."""
    train, test, devices = load(published, work)
    log(f"neusight data: {len(train)} train rows, {len(test)} test rows, GPUs {', '.join(sorted(devices))}")
    parts = []
    for name in estimators:  # one estimator's five folds at a time: a bounded run ends with whole tables
        for dev in sorted(devices):
            if gpus and dev not in gpus:
                continue
            tr = train[train["device"] != dev].reset_index(drop=True)
            te = test[test["device"] == dev].reset_index(drop=True)
            cache = work / f"logo-{name}-{dev}.parquet"
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
                else:
                    got = pd.DataFrame({name: _fit_predict(tr, te, devices, name)[0]})
                got.attrs = {}
                got.to_parquet(cache.with_suffix(".tmp"))
                cache.with_suffix(".tmp").replace(cache)  # whole or absent: a stopped run resumes here
                log(f"  {name} left out {dev}: {time.perf_counter() - t0:.0f} s")
            for col in got.columns:
                parts.append(te[["label", "device", "time_s_median"]].assign(estimator=col, pred=got[col].to_numpy()))
    return pd.concat(parts, ignore_index=True)


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
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    scored = run(
        args.published,
        args.work,
        [e for e in args.estimators.split(",") if e],
        [g for g in args.gpus.split(",") if g] or None,
        lambda m: print(m, file=sys.stderr, flush=True),
    )
    pooled, per_gpu = tables(scored)
    oracle, _ = tables(oracle_level(scored))
    text = (
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
