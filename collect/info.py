"""``opcast collect info``: what a dataset holds, per op, device, dtype and source."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from opcast.ops import get_op
from opcast.schema import read_dataset

GROUP = ["op", "device", "dtype", "source"]


def _range(series: pd.Series) -> str:
    values = series.dropna()
    if values.empty:
        return "-"
    if values.dtype == bool or str(values.dtype) in ("boolean", "string", "str", "object"):
        return "|".join(sorted(map(str, values.unique())))
    lo, hi = values.min(), values.max()
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def summarise(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per (op, device, dtype, source): rows, directions, shape ranges and time range."""
    df = read_dataset(list(paths))
    records = []
    for key, group in df.groupby(GROUP, sort=True, dropna=False):
        spec = get_op(str(key[0]))
        shapes = ", ".join(f"{p}={_range(group[p])}" for p in spec.param_names)
        records.append({
            **dict(zip(GROUP, key)),
            "rows": len(group),
            "directions": "/".join(sorted(group["direction"].unique())),
            "shapes": shapes,
            "time_s_min": float(group["time_s_median"].min()),
            "time_s_max": float(group["time_s_median"].max()),
        })
    return pd.DataFrame.from_records(records)
