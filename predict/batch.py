"""``predict kernels``: fill ``time_s_pred`` (and ``source_pred``) for every row of a table.

Input rows name an op (``op``), its parameters (one column each, as in the dataset schema),
``dtype`` (default bf16), ``direction`` (default fwd) and optionally ``tensor_cores`` (default:
True for matrix kinds). Collective rows (``bytes``, ``world_size``, ``nodes``, ``gpus_per_node``)
go to the alpha-beta model. Every row is validated by the op registry; bad rows are named in one
error (the first few of them, with their row numbers).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from opcast.errors import OpcastError
from opcast.ops import get_op
from opcast.predict.comm import Collective, CollectiveCostModel, Group
from opcast.predict.cost import KernelCostModel, validated_kernel

SHOWN_BAD_ROWS = 3


def read_rows(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise OpcastError(f"{path} does not exist; give a .parquet or .csv of kernels")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".csv":
            return pd.read_csv(path)
    except Exception as err:  # pandas/pyarrow raise many types for unreadable files
        raise OpcastError(f"{path} is not a readable {path.suffix[1:]} file ({str(err).splitlines()[0]})") from None
    raise OpcastError(f"{path}: give a .parquet or .csv file, not {path.suffix or 'a file without suffix'}")


def write_rows(frame: pd.DataFrame, path: str | Path) -> Path:
    import os
    import tempfile

    path = Path(path)
    if path.suffix not in (".parquet", ".csv"):
        raise OpcastError(f"--out {path}: give a .parquet or .csv file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        if path.suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except OSError as err:
        raise OpcastError(f"cannot write {path}: {err.strerror}; choose a writable --out") from None
    return path


def _value(row: dict, key: str, default):
    v = row.get(key)
    return default if v is None or (isinstance(v, float) and v != v) or v is pd.NA else v


def predict_frame(frame: pd.DataFrame, device, kernels: KernelCostModel,
                  comms: CollectiveCostModel | None = None) -> pd.DataFrame:
    """``frame`` with ``time_s_pred`` (seconds per call) and ``source_pred`` for every row."""
    if "op" not in frame.columns:
        raise OpcastError("the input has no 'op' column; name each row's op kind (e.g. gemm)")
    comms = comms or CollectiveCostModel()
    rows = frame.to_dict("records")
    parsed: list[object] = []
    bad: list[str] = []
    for i, row in enumerate(rows):
        try:
            spec = get_op(str(row["op"]))
            params = {n: row[n] for n in spec.param_names if n in row}
            if spec.collective:
                clean = spec.validate(params)
                parsed.append(Collective(spec.kind.value, clean["bytes"],
                                         Group(clean["world_size"], clean["nodes"], clean["gpus_per_node"])))
            else:
                tc = _value(row, "tensor_cores", None)
                parsed.append(validated_kernel(spec.kind.value, params, str(_value(row, "dtype", "bf16")),
                                               str(_value(row, "direction", "fwd")), None if tc is None else bool(tc)))
        except OpcastError as err:
            bad.append(f"row {i}: {err}")
    if bad:
        more = f" (and {len(bad) - SHOWN_BAD_ROWS} more)" if len(bad) > SHOWN_BAD_ROWS else ""
        raise OpcastError(f"{len(bad)} of {len(rows)} rows cannot be predicted: " + "; ".join(bad[:SHOWN_BAD_ROWS]) + more)
    table = kernels.lookup([p for p in parsed if not isinstance(p, Collective)], device)
    times, sources = [], []
    for p in parsed:
        t, src = comms.time_s(p, device) if isinstance(p, Collective) else table[p]
        times.append(t)
        sources.append(src)
    out = frame.copy()
    out["time_s_pred"] = times
    out["source_pred"] = sources
    return out
