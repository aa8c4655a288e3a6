"""Few-shot adaptation to a GPU the models never saw (issue 19): error against measured kernels.

    python benchmarks/few_shot.py [--published ../shared/published] [--work DIR]
        [--sections neusight,aiconfigurator,h200] [--aic-data FILE] [--ks 0,10,50,200] [--draws 5] [--json FILE]
        [--estimator xgb|blend]

For every GPU of a data set in turn (leave-one-GPU-out): opcast's models are fitted without that
GPU (``fit_frame``, xgb, no inner folds; ``--estimator blend``: the blend of xgb and the tile-MLP that ``auto``
now gives the GPUs ``models/default`` never measured of gemm-fwd-half, cross_entropy-fwd-half and layernorm-fwd-fp32,
on every group here), then
corrected with :func:`opcast.train.adapt.fit_correction` (what ``opcast train adapt`` writes)
from k kernels measured on it, k in ``--ks``, drawn at random (seeded, ``--draws`` draws per k),
and scored on rows of that GPU never drawn. A draw is stratified by predictor group (op,
direction, dtype class): k / groups rows of each, as a ``collect bench`` minute that times every
op would give, the remainder to random groups. k = 0 is the unadapted model.

1. NeuSight's five GPUs (FP32 CUDA cores, arXiv 2407.13853), NeuSight's test files scored, two
   pools to draw from: (A) the GPU's *training sweeps* (other shapes, another measuring campaign
   than the test files: what a user who benchmarks a minute and predicts a workload has), and
   (B) the GPU's test files themselves (the k drawn rows removed from the scored ones: same
   campaign). Training as in ``benchmarks/train_benchmark.py`` (b): the other four GPUs' sweeps
   minus every test shape.
2. AIConfigurator (``aiconfigurator-core``; ``benchmarks/modern_gpus.py``): the nine tensor-core
   systems, labels gemm bf16/fp8, prefill, decode; training at most ``--aic-train-rows`` rows per
   (system, label) of the other systems, the held-out system's rows split in half by a seeded
   shape hash: draws from one half, scores on the other.

3. ``h200`` (not in the default ``--sections``): first-party rows of a real H200 (``benchmarks/data/h200_torch``),
   half of its shapes drawn from, the other half scored. (a) fp32, 1,706 forward kernels timed by NeuSight's
   protocol (``collect bench --timing neusight``), the base fitted on every row of NeuSight's five GPUs (what
   ``models/default`` knew of fp32 before those rows joined it); (b) bf16, 458 forward GEMMs of torch's cuBLAS
   (``collect bench`` as it times by default: events, CUDA graphs under 10 us), the base fitted on AIConfigurator's
   ``gemm bf16`` rows of its other systems (``--aic-train-rows`` each; needs ``--aic-data`` or the
   aiconfigurator section's replay in ``--work``). What a user who runs ``collect bench`` for a minute on a GPU the
   models never saw gets from ``opcast train adapt``, on a GPU we had.

Beside the adapted model: ``oracle x1`` rescales the unadapted predictions of each GPU by the one
constant that is best on the *scored* rows themselves (the issue's "one oracle constant per GPU",
a diagnosis, not a method), and variants of the correction (no analogues: without the ``analogue``
terms, as before them; no shape term; levels only; priors x4 and /4). The base keeps, per row, the
fold's answer on each training GPU's specs (columns ``as:<GPU>``), which the analogue terms read, as
``opcast train adapt`` computes them from a written set. The shape terms'
hyper-parameters are picked by the correction itself on an inner split of the drawn kernels
(:func:`opcast.train.adapt.choose_shape`), never on the scored rows.
Fitting dominates the wall time; the base predictions are kept in ``--work`` and reused (a cache
written before the op parameters were kept gets them joined back from the replayed data).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

PUBLISHED = Path(__file__).resolve().parents[1].parent / "shared" / "published"
GEMM_LABELS = ("gemm (bmm)", "gemm (linear)", "gemm bf16", "gemm fp8")


# --------------------------------------------------------------------------- base predictions


def _fit_predict(
    train: pd.DataFrame, test: pd.DataFrame, devices, xgb_params: Mapping, seed: int, estimator: str = "xgb"
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Models fitted on ``train``: their answers for ``test`` (rows of one device) on its own specs,
    and on each training device's (``train``'s devices; what the ``analogue`` terms regress on)."""
    from opcast.train.fit import FitConfig, _predict_fitted, fit_frame

    cfg = FitConfig(estimator=estimator, folds=0, seed=seed, n_jobs=2, xgb_params=dict(xgb_params))  # type: ignore[arg-type]
    fitted, _, _ = fit_frame(train.reset_index(drop=True), devices, cfg)
    (dev,) = pd.unique(test["device"].astype(object))
    rows = test.reset_index(drop=True)
    pred = _predict_fitted(fitted, rows, devices[dev], devices)
    trained = sorted(pd.unique(train["device"].astype(object)))
    return pred, {other: _predict_fitted(fitted, rows, devices[other], devices) for other in trained}


def _neusight_label(frame: pd.DataFrame) -> pd.Series:
    label = frame["op"].astype(object).copy()
    gemm = (label == "gemm").to_numpy()
    linear = frame["source_file"].astype(str).str.contains("linear").to_numpy()
    label[gemm & linear] = "gemm (linear)"
    label[gemm & ~linear] = "gemm (bmm)"
    return label


def neusight_base(path: Path, cache: Path, log, estimator: str = "xgb") -> pd.DataFrame:
    """Every row of each GPU (its sweeps and its test files) with the prediction of the models
    fitted without that GPU (``pred``), ``pool`` = ``sweep`` | ``test``; cached in ``cache``."""
    if cache.is_file():
        log(f"neusight: reusing base predictions {cache}")
        return pd.read_parquet(cache)
    from opcast.train.fit import load_training_frame, resolve_devices

    df = load_training_frame([path])
    df = df.assign(label=_neusight_label(df))
    is_test = df["source_file"].astype(str).str.contains("/dataset/test/").to_numpy()
    test_shapes = set(df.loc[is_test, "point_id"])
    sweep = df[~is_test & ~df["point_id"].isin(test_shapes).to_numpy()]
    devices = resolve_devices(pd.unique(df["device"].astype(object)))
    parts = []
    for dev in sorted(devices):
        t0 = time.perf_counter()
        train = sweep[sweep["device"] != dev]
        mine = pd.concat(
            [
                sweep[sweep["device"] == dev].assign(pool="sweep"),
                df[is_test & (df["device"] == dev).to_numpy()].assign(pool="test"),
            ],
            ignore_index=True,
        )
        mine["pred"], answers = _fit_predict(train, mine, devices, {}, 0, estimator)
        parts.append(mine.assign(**{f"{AS}{d}": v for d, v in answers.items()}))
        dt = time.perf_counter() - t0
        log(f"neusight: left out {dev}: fitted on {len(train)} rows, predicted {len(mine)} in {dt:.0f} s")
    out = pd.concat(parts, ignore_index=True)
    keep = [*BASE_COLUMNS, *_param_columns(out), *_answer_columns(out)]
    out = out.assign(key=_keys(out))[[*keep, "key"]]
    out.to_parquet(cache)
    return out


def aic_base(data: Path, cache: Path, train_rows: int, seed: int, log, estimator: str = "xgb") -> pd.DataFrame:
    """AIConfigurator rows of every system with the prediction of models fitted without it;
    ``pool`` = ``draw`` | ``test`` (a seeded half of its shapes each); cached in ``cache``."""
    if cache.is_file():
        log(f"aiconfigurator: reusing base predictions {cache}")
        return pd.read_parquet(cache)
    mg = _modern_gpus()
    from opcast.train.fit import resolve_devices
    from opcast.train.splits import grouped_mask, shape_groups

    frame = mg.load(data)
    frame = frame[frame["op"].isin(("gemm", "attention"))].reset_index(drop=True)
    devices = resolve_devices(pd.unique(frame["device"].astype(object)))
    pool = mg.cap(frame, train_rows, seed)
    parts = []
    for dev in sorted(devices):
        t0 = time.perf_counter()
        train = pool[pool["device"] != dev]
        mine = mg.cap(frame[frame["device"] == dev], 4 * train_rows, seed + 1).reset_index(drop=True)
        half = grouped_mask(shape_groups(mine), 0.5, seed + 11)
        mine = mine.assign(pool=np.where(half, "test", "draw"))
        mine["pred"], answers = _fit_predict(train, mine, devices, {}, seed, estimator)
        parts.append(mine.assign(**{f"{AS}{d}": v for d, v in answers.items()}))
        dt = time.perf_counter() - t0
        log(f"aiconfigurator: left out {dev}: fitted on {len(train)} rows, predicted {len(mine)} in {dt:.0f} s")
    out = pd.concat(parts, ignore_index=True)
    keep = [*BASE_COLUMNS, *_param_columns(out), *_answer_columns(out)]
    out = out.assign(key=_keys(out))[[*keep, "key"]]
    out.to_parquet(cache)
    return out


H200_KERNELS = Path(__file__).resolve().parent / "data" / "h200_torch" / "kernels"
"""First-party H200 measurements (``benchmarks/h200_measured.py`` says how they were taken)."""


def h200_base(
    train: pd.DataFrame, target: pd.DataFrame, cache: Path, seed: int, log, name: str, estimator: str = "xgb"
) -> pd.DataFrame:
    """The H200's first-party rows ``target`` with the prediction of models fitted on ``train`` (other GPUs'
    rows: the H200 is unseen); ``pool`` = ``draw`` | ``test`` (a seeded half of its shapes each); cached."""
    if cache.is_file():
        log(f"{name}: reusing base predictions {cache}")
        return pd.read_parquet(cache)
    from opcast.train.fit import resolve_devices
    from opcast.train.splits import grouped_mask, shape_groups

    t0 = time.perf_counter()
    devices = resolve_devices(pd.unique(pd.concat([train["device"], target["device"]]).astype(object)))
    mine = target.reset_index(drop=True)
    half = grouped_mask(shape_groups(mine), 0.5, seed + 11)
    mine = mine.assign(pool=np.where(half, "test", "draw"))
    mine["pred"], answers = _fit_predict(train, mine, devices, {}, seed, estimator)
    out = mine.assign(**{f"{AS}{d}": v for d, v in answers.items()})
    keep = [*BASE_COLUMNS, *_param_columns(out), *_answer_columns(out)]
    out = out.assign(key=_keys(out))[[*keep, "key"]]
    out.to_parquet(cache)
    log(f"{name}: fitted on {len(train)} rows of other GPUs, predicted {len(mine)} in {time.perf_counter() - t0:.0f} s")
    return out


def h200_fp32_target() -> pd.DataFrame:
    """The H200's forward fp32 kernels timed by NeuSight's protocol, labelled as NeuSight's rows are
    (a GEMM with b > 1 is ``torch.bmm``'s, b = 1 a linear layer's)."""
    from opcast.schema import read_dataset

    rows = read_dataset(H200_KERNELS / "neusight_fp32")
    label = rows["op"].astype(object).copy()
    gemm = (label == "gemm").to_numpy()
    label[gemm] = np.where(rows.loc[gemm, "b"].to_numpy(dtype=float) > 1, "gemm (bmm)", "gemm (linear)")
    return rows.assign(label=label)


def h200_bf16_target() -> pd.DataFrame:
    """The H200's forward bf16 GEMMs (torch's cuBLAS, ``collect bench`` as it times by default)."""
    from opcast.schema import read_dataset

    rows = read_dataset(H200_KERNELS / "bf16_gemm")
    rows = rows[(rows["op"] == "gemm") & (rows["direction"] == "fwd")].reset_index(drop=True)
    return rows.assign(label="gemm bf16")


AS = "as:"
"""Prefix of a base column holding the fold's answer for the row on a training device's specs."""


def _answer_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith(AS)]


def _answers(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Training device -> the fold's answers for ``frame``'s rows on its specs (NaN: another fold's device)."""
    return {c[len(AS) :]: frame[c].to_numpy(dtype=float) for c in _answer_columns(frame)}


BASE_COLUMNS = (
    "device",
    "op",
    "dtype",
    "direction",
    "tensor_cores",
    "point_id",
    "label",
    "pool",
    "time_s_median",
    "pred",
)
JOIN = ["device", "point_id", "op", "dtype", "direction"]


def _param_columns(frame: pd.DataFrame) -> list[str]:
    """The integer op parameters among ``frame``'s columns (what the shape terms read)."""
    from opcast.ops import param_types

    return [c for c, t in param_types().items() if t is int and c in frame.columns and c not in BASE_COLUMNS]


def with_params(base: pd.DataFrame, data: Path, log) -> pd.DataFrame:
    """``base`` with its rows' integer op parameters, joined from the replayed ``data`` when a cache
    written before they were kept lacks them."""
    if _param_columns(base):
        return base
    src = pd.read_parquet(data)
    cols = _param_columns(src)
    out = base.merge(src[[*JOIN, *cols]], on=JOIN, how="left", validate="m:1")
    log(f"joined the op parameters of {int(out[cols].notna().any(axis=1).sum())} of {len(out)} cached rows from {data}")
    return out


def _params(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return {c: frame[c].to_numpy(dtype=float) for c in _param_columns(frame)}


def _keys(frame: pd.DataFrame) -> np.ndarray:
    from opcast.train.features import group_key_array

    return group_key_array(frame)


def _modern_gpus():
    spec = importlib.util.spec_from_file_location("modern_gpus", Path(__file__).with_name("modern_gpus.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- draws and scores


def draw(keys: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of ``k`` rows, stratified by group: ``k // groups`` of each (all of a smaller
    group), the rest from the remaining rows at random."""
    if k <= 0:
        return np.array([], dtype=int)
    groups = sorted(set(keys.tolist()))
    share = k // len(groups)
    picked: list[int] = []
    for g in groups:
        pos = np.flatnonzero(keys == g)
        picked += rng.choice(pos, min(share, len(pos)), replace=False).tolist()
    rest = np.setdiff1d(np.arange(len(keys)), picked)
    more = min(k - len(picked), len(rest))
    if more > 0:
        picked += rng.choice(rest, more, replace=False).tolist()
    return np.array(sorted(picked), dtype=int)


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred / true - 1.0) * 100.0


VARIANTS: dict[str, dict] = {
    "adapted": {},
    "no analogues": {"analogues": False},
    "no shape": {"shape": False},
    "levels only": {"slope": False},
    "priors x4": {"scale": 4.0},
    "priors /4": {"scale": 0.25},
    "no misaligned group": {"misaligned": False},
}


def _cfg(variant: Mapping):
    from opcast.train.adapt import PRIOR_ROWS, AdaptConfig

    scale = variant.get("scale", 1.0)
    return AdaptConfig(
        prior_rows={k: v * scale for k, v in PRIOR_ROWS.items()},
        slope=variant.get("slope", True),
        shape=variant.get("shape", True),
        analogues=variant.get("analogues", True),
    )


def curve(
    base: pd.DataFrame, draw_pool: str, score_pool: str, ks: Sequence[int], draws: int, seed: int
) -> pd.DataFrame:
    """One row per (device, k, draw, variant, label): MAPE on the scored rows not drawn."""
    from opcast.train.adapt import correction, fit_correction
    from opcast.train.artifacts import adaptation_keys, misaligned_rows

    def fit_keys(frame: pd.DataFrame, variant: Mapping, groups: Mapping | None = None) -> np.ndarray:
        """The groups of the correction, as ``opcast train adapt`` fits them and ``opcast predict`` applies them
        (``groups``: the fitted ones); the draws stay stratified by predictor group (``key``)."""
        keys = frame["key"].to_numpy(dtype=object)
        return keys if variant.get("misaligned") is False else adaptation_keys(keys, misaligned_rows(frame), groups)

    rows = []
    for dev in sorted(pd.unique(base["device"])):
        mine = base[(base["device"] == dev) & np.isfinite(base["pred"].to_numpy(dtype=float))]
        pool = mine[mine["pool"] == draw_pool].reset_index(drop=True)
        test = mine[mine["pool"] == score_pool].reset_index(drop=True)
        true, pred = test["time_s_median"].to_numpy(float), test["pred"].to_numpy(float)
        labels = test["label"].astype(str).to_numpy()
        test_params = _params(test)
        test_answers = _answers(test)
        oracle = pred * np.exp(np.median(np.log(true / pred)))  # one constant, fitted on the scored rows
        for k in ks:
            for d in range(draws if k else 1):
                rng = np.random.default_rng([seed, d, k, int(hashlib.sha1(dev.encode()).hexdigest()[:6], 16)])
                picked = draw(pool["key"].to_numpy(dtype=object), k, rng)
                scored = np.ones(len(test), dtype=bool)
                if draw_pool == score_pool and len(picked):
                    scored[picked] = False
                preds = {"oracle x1": oracle}
                if k == 0:
                    preds["adapted"] = pred
                else:
                    sub = pool.iloc[picked]
                    for name, variant in VARIANTS.items():
                        fields = fit_correction(
                            fit_keys(sub, variant),
                            sub["pred"].to_numpy(float),
                            sub["time_s_median"].to_numpy(float),
                            _cfg(variant),
                            params=_params(sub),
                            seed=d,
                            analogue_s=_answers(sub),
                        )
                        test_keys = fit_keys(test, variant, fields["groups"])
                        preds[name] = correction(fields).apply(test_keys, pred, test_params, test_answers)
                for name, p in preds.items():
                    ape = _ape(p, true)
                    for label in [*sorted(set(labels.tolist())), "GEMM", "all"]:
                        if label == "all":
                            m = scored.copy()
                        elif label == "GEMM":
                            m = scored & np.isin(labels, GEMM_LABELS)
                        else:
                            m = scored & (labels == label)
                        if m.any():
                            rows.append(
                                {
                                    "device": dev,
                                    "k": k,
                                    "draw": d,
                                    "variant": name,
                                    "label": label,
                                    "mape": ape[m].mean(),
                                }
                            )
    return pd.DataFrame(rows)


def pooled(res: pd.DataFrame, variant: str = "adapted") -> pd.DataFrame:
    """MAPE per label and k pooled over devices (mean of the per-device MAPEs), mean and spread over draws."""
    sub = res[res["variant"] == variant]
    per_draw = sub.groupby(["label", "k", "draw"]).mape.mean().reset_index()
    agg = per_draw.groupby(["label", "k"]).mape.agg(["mean", "std"]).reset_index()
    wide = agg.pivot(index="label", columns="k", values="mean")
    spread = agg.pivot(index="label", columns="k", values="std")
    out = wide.copy()
    for k in wide.columns:
        out[k] = [f"{m:.1f}" + (f" ± {s:.1f}" if np.isfinite(s) and s > 0 else "") for m, s in zip(wide[k], spread[k])]
    out.columns = [f"k={k}" for k in wide.columns]
    return out.reset_index()


def per_device(res: pd.DataFrame, label: str, ks: Sequence[int]) -> pd.DataFrame:
    sub = res[(res["label"] == label)]
    agg = sub.groupby(["device", "variant", "k"]).mape.mean().reset_index()
    rows = []
    for dev in sorted(pd.unique(agg["device"])):
        a = agg[agg["device"] == dev]
        row = {"device": dev}
        for k in ks:
            v = a[(a["variant"] == "adapted") & (a["k"] == k)].mape
            row[f"k={k}"] = round(float(v.iloc[0]), 1) if len(v) else None
        o = a[(a["variant"] == "oracle x1") & (a["k"] == 0)].mape
        row["oracle x1"] = round(float(o.iloc[0]), 1) if len(o) else None
        rows.append(row)
    return pd.DataFrame(rows)


def variants(res: pd.DataFrame, labels: Sequence[str], k_max: int) -> pd.DataFrame:
    sub = res[res["label"].isin(labels) & (res["k"] > 0)]
    per_draw = sub.groupby(["variant", "label", "k", "draw"]).mape.mean().reset_index()
    agg = per_draw.groupby(["variant", "label", "k"]).mape.mean().reset_index()
    wide = agg.pivot(index=["label", "variant"], columns="k", values="mape").round(1)
    wide.columns = [f"k={k}" for k in wide.columns]
    return wide.reset_index()


# --------------------------------------------------------------------------- main


def _print(title: str, table: pd.DataFrame) -> None:
    print(f"\n## {title}\n")
    try:
        print(table.to_markdown(index=False, floatfmt=".1f"))
    except ImportError:
        print(table.to_string(index=False))


def _report(name: str, res: pd.DataFrame, ks: Sequence[int], tables: dict[str, pd.DataFrame]) -> None:
    tables[
        f"{name}: MAPE % of the held-out GPU vs measured kernels k (mean ± sd over draws; pooled = mean over GPUs)"
    ] = pooled(res)
    tables[f"{name}: GEMM per held-out GPU (adapted; oracle x1 = one constant fitted on the scored rows)"] = per_device(
        res, "GEMM", ks
    )
    labels = ["GEMM", "all"]
    tables[f"{name}: variants of the correction (GEMM and all ops, pooled)"] = variants(res, labels, max(ks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--published", type=Path, default=PUBLISHED, help="The shared published measurements.")
    ap.add_argument("--work", type=Path, default=None, help="Keep replays and base predictions here (reused).")
    ap.add_argument("--sections", default="neusight,aiconfigurator")
    ap.add_argument(
        "--aic-data", type=Path, default=None, help="A replayed aiconfigurator.parquet (modern_gpus.py --replay-to)."
    )
    ap.add_argument(
        "--aic-train-rows", type=int, default=2000, help="Training rows per (system, label) (default: %(default)s)."
    )
    ap.add_argument("--ks", default="0,10,50,200", help="Measured kernels per held-out GPU (default: %(default)s).")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="Corrections to score, of: %(default)s (fewer: faster; 'adapted' is what train adapt writes).",
    )
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--estimator", default="xgb", choices=["xgb", "blend"], help="The base models' estimator (default: xgb)."
    )
    args = ap.parse_args(argv)
    tag = "" if args.estimator == "xgb" else f"_{args.estimator}"  # the base caches of each estimator apart
    ks = [int(k) for k in args.ks.split(",")]
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown or "adapted" not in args.variants.split(","):
        print(f"few_shot: --variants takes 'adapted' and any of {', '.join(VARIANTS)}; got {unknown}", file=sys.stderr)
        return 2
    for name in set(VARIANTS) - set(args.variants.split(",")):
        del VARIANTS[name]
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    tmp = tempfile.TemporaryDirectory() if args.work is None else None
    work = Path(tmp.name) if tmp else args.work
    work.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    tables: dict[str, pd.DataFrame] = {}
    t_start = time.perf_counter()
    if "neusight" in sections:
        from opcast.collect.replay import run_replay

        data = work / "neusight.parquet"
        if not data.is_file():
            run_replay("neusight", args.published / "neusight", work)
        cache = work / f"few_shot_neusight_base_v2{tag}.parquet"
        base = with_params(neusight_base(data, cache, log, args.estimator), data, log)
        t0 = time.perf_counter()
        res_a = curve(base, "sweep", "test", ks, args.draws, args.seed)
        res_b = curve(base, "test", "test", ks, args.draws, args.seed)
        log(f"neusight: adaptation curves in {time.perf_counter() - t0:.1f} s")
        _report("NeuSight (A) drawn from the GPU's training sweeps, scored on its test files", res_a, ks, tables)
        _report("NeuSight (B) drawn from the GPU's test files, scored on the rest of them", res_b, ks, tables)
    if "aiconfigurator" in sections:
        data = args.aic_data or work / "aiconfigurator.parquet"
        if not data.is_file():
            if importlib.util.find_spec("aiconfigurator_core") is None:
                print("few_shot: aiconfigurator-core is not installed and --aic-data not given", file=sys.stderr)
                return 2
            _modern_gpus().replay_aiconfigurator(work, cap_rows=3000, seed=args.seed)
            data = work / "aiconfigurator.parquet"
        cache = work / f"few_shot_aic_base_v2_{args.aic_train_rows}{tag}.parquet"
        base = aic_base(data, cache, args.aic_train_rows, args.seed, log, args.estimator)
        base = with_params(base, data, log)
        res = curve(base, "draw", "test", ks, args.draws, args.seed)
        _report("AIConfigurator: drawn from half of the system's shapes, scored on the other half", res, ks, tables)
    if "h200" in sections:
        from opcast.train.fit import load_training_frame

        ns_data = work / "neusight.parquet"
        if not ns_data.is_file():
            from opcast.collect.replay import run_replay

            run_replay("neusight", args.published / "neusight", work)
        ns_rows = load_training_frame([ns_data])
        cache = work / f"few_shot_h200_fp32_base{tag}.parquet"
        base = h200_base(ns_rows, h200_fp32_target(), cache, args.seed, log, "h200 fp32", args.estimator)
        res = curve(base, "draw", "test", ks, args.draws, args.seed)
        _report(
            "H200 fp32 (NeuSight's protocol; fitted on NeuSight's five GPUs): half the shapes drawn from, half scored",
            res,
            ks,
            tables,
        )
        aic = args.aic_data or work / "aiconfigurator.parquet"
        if aic.is_file():
            mg = _modern_gpus()
            frame = mg.load(aic)
            frame = frame[(frame["label"] == "gemm bf16") & (frame["device"] != "H200")].reset_index(drop=True)
            train = mg.cap(frame, args.aic_train_rows, args.seed)
            cache = work / f"few_shot_h200_bf16_base_{args.aic_train_rows}{tag}.parquet"
            base = h200_base(train, h200_bf16_target(), cache, args.seed, log, "h200 bf16", args.estimator)
            res = curve(base, "draw", "test", ks, args.draws, args.seed)
            _report(
                "H200 bf16 GEMMs (torch; fitted on AIConfigurator's other eight systems): half the shapes drawn from, "
                "half scored",
                res,
                ks,
                tables,
            )
        else:
            log(f"h200 bf16: skipped ({aic} absent: pass --aic-data, or run the aiconfigurator section first)")
    print(
        f"# few-shot adaptation (opcast train adapt), leave-one-GPU-out; base {args.estimator}; ks {ks}, "
        f"{args.draws} draws; "
        f"{time.perf_counter() - t_start:.0f} s"
    )
    for title, table in tables.items():
        _print(title, table)
    if args.json:
        args.json.write_text(
            json.dumps({k: json.loads(v.to_json(orient="records")) for k, v in tables.items()}, indent=1)
        )
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
