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


ROW_KEY = ["source", "device", "point_id"]
"""One measurement: the same point on the same device from the same source is one row, however
often it was written (two runs of an older opcast on one folder wrote some points twice)."""


def read_unique(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, int]:
    """The dataset's rows with duplicates of :data:`ROW_KEY` dropped (the first kept), and how
    many were dropped."""
    df = read_dataset(list(paths))
    unique = df.drop_duplicates(subset=ROW_KEY, keep="first", ignore_index=True)
    return unique, len(df) - len(unique)


def summarise(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per (op, device, dtype, source): rows (duplicates counted once, see
    :func:`read_unique`), directions, shape ranges and time range."""
    return summarise_frame(read_unique(paths)[0])


def summarise_frame(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarise` of rows already read."""
    records = []
    for key, group in df.groupby(GROUP, sort=True, dropna=False):
        spec = get_op(str(key[0]))
        shapes = ", ".join(f"{p}={_range(group[p])}" for p in spec.param_names)
        records.append(
            {
                **dict(zip(GROUP, key)),
                "rows": len(group),
                "directions": "/".join(sorted(group["direction"].unique())),
                "shapes": shapes,
                "time_s_min": float(group["time_s_median"].min()),
                "time_s_max": float(group["time_s_median"].max()),
            }
        )
    columns = [*GROUP, "rows", "directions", "shapes", "time_s_min", "time_s_max"]
    return pd.DataFrame.from_records(records, columns=columns)  # the columns even of no rows (an empty dataset)
