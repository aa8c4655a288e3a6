"""Honest error reports: absolute percentage errors per op and device, on rows a model never saw.

Metrics (all on ``|predicted / measured - 1|``): MAPE (the mean), the median and 90th percentile,
and the fraction of rows within 10 %. ``opcast train eval`` scores any dataset with a model set;
when that dataset is one the set was fitted on, the report says so (training error is not a
transfer score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcast.hardware import DeviceSpec


def ape_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """n, MAPE, median and p90 APE (percent), and the share within 10 % (percent), over finite rows."""
    pred = np.asarray(pred, dtype=float)
    true = np.asarray(true, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(true) & (true > 0)
    ape = np.abs(pred[ok] / true[ok] - 1.0) * 100.0
    if not len(ape):
        return {
            "n": 0,
            "mape": float("nan"),
            "median_ape": float("nan"),
            "p90_ape": float("nan"),
            "within_10": float("nan"),
        }
    return {
        "n": int(len(ape)),
        "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)),
        "p90_ape": float(np.quantile(ape, 0.9)),
        "within_10": float((ape <= 10.0).mean() * 100.0),
    }


def score_table(frame: pd.DataFrame, pred: np.ndarray, by: Sequence[str] = ("op", "device")) -> pd.DataFrame:
    """Metrics per ``by`` group (rows with no prediction counted in ``uncovered``), then ``all``."""
    work = (
        frame[list(by)]
        .astype(object)
        .assign(_pred=np.asarray(pred, dtype=float), _true=frame["time_s_median"].to_numpy(dtype=float))
    )
    rows = []
    for key, g in work.groupby(list(by), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        m = ape_metrics(g["_pred"].to_numpy(), g["_true"].to_numpy())
        rows.append({**dict(zip(by, key)), **m, "uncovered": int((~np.isfinite(g["_pred"].to_numpy())).sum())})
    m = ape_metrics(work["_pred"].to_numpy(), work["_true"].to_numpy())
    rows.append({**{b: "all" for b in by}, **m, "uncovered": int((~np.isfinite(work["_pred"].to_numpy())).sum())})
    return pd.DataFrame(rows)


def predict_frame(model_set: Any, frame: pd.DataFrame, devices: Mapping[str, DeviceSpec]) -> np.ndarray:
    """Predicted seconds of rows that may span several devices (one batched call per device)."""
    out = np.full(len(frame), np.nan)
    names = frame["device"].astype(object).to_numpy()
    for name in pd.unique(names):
        pos = np.flatnonzero(names == name)
        out[pos] = model_set.predict_s(frame.iloc[pos], devices[name])
    return out


def evaluate(model_set: Any, datasets: Sequence[str | Path]) -> dict[str, Any]:
    """Score ``model_set`` on ``datasets``: the per-op-and-device table, the predictions, and
    whether any dataset was part of the training data."""
    from opcast.train.fit import NO_TIME, dataset_records, load_training_frame, resolve_devices

    left_out: dict[str, int] = {}
    frame = load_training_frame(datasets, left_out)  # the rows with a time to score (none: one line)
    devices = resolve_devices(
        pd.unique(frame["device"].astype(object)), datasets, known=model_set.meta.get("device_specs", {})
    )
    pred = predict_frame(model_set, frame, devices)
    trained = {d["sha256"] for d in model_set.meta.get("datasets", [])}
    seen = [
        str(p) for p, r in zip(datasets, dataset_records(datasets)) if r["sha256"] in trained
    ]  # as the user named it
    return {
        "table": score_table(frame, pred),
        "frame": frame,
        "pred": pred,
        "training_data": seen,
        "rows_without_time": left_out.get(NO_TIME, 0),
    }


def plot_scatter(frame: pd.DataFrame, pred: np.ndarray, path: str | Path, *, title: str = "") -> Path:
    """Predicted vs measured, log-log, one panel per op (needs the optional matplotlib)."""
    from opcast.plotting import pyplot, save_figure

    plt = pyplot()
    ops = sorted(pd.unique(frame["op"].astype(object)))
    cols = min(3, len(ops)) or 1
    rows = -(-len(ops) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.0 * rows), squeeze=False)
    true = frame["time_s_median"].to_numpy(dtype=float)
    for ax, op in zip(axes.flat, ops):
        m = (frame["op"].astype(object).to_numpy() == op) & np.isfinite(pred)
        for dev in sorted(pd.unique(frame.loc[m, "device"].astype(object))):
            d = m & (frame["device"].astype(object).to_numpy() == dev)
            ax.scatter(true[d] * 1e6, pred[d] * 1e6, s=3, alpha=0.4, label=str(dev))
        if m.any():
            lo, hi = np.nanmin(true[m]) * 1e6, np.nanmax(true[m]) * 1e6
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            mape = float(np.mean(np.abs(pred[m] / true[m] - 1)) * 100)
            ax.set_title(f"{op} (MAPE {mape:.1f} %)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured (us)")
        ax.set_ylabel("predicted (us)")
        ax.legend(fontsize=6, markerscale=3)
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The table as JSON-safe records (NaN -> None)."""
    return [
        {str(k): (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
        for r in table.to_dict("records")
    ]
