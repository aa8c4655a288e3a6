"""``predict kernels``: fill ``time_s_pred`` (and ``source_pred``) for every row of a table.

Input rows name an op (``op``), its parameters (one column each, as in the dataset schema),
``dtype`` (default bf16), ``direction`` (default fwd) and optionally ``tensor_cores`` (default:
True for matrix kinds). Collective rows (``bytes``, ``world_size``, ``nodes``, ``gpus_per_node``)
go to the alpha-beta model. Every row is validated by the op registry; a blank cell takes the
default, ``tensor_cores`` is read strictly (:func:`opcast.ops.parse_bool`: true/false, yes/no,
on/off, 1/0), and bad rows are named in one error (the first few of them, with their row numbers).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from opcast.errors import OpcastError
from opcast.ops import get_op, parse_bool
from opcast.predict.comm import Collective, CollectiveCostModel, Group
from opcast.predict.cost import KernelCostModel, validated_kernel

SHOWN_BAD_ROWS = 3


def read_rows(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if path.is_dir():
        raise OpcastError(f"{path} is a folder; give a .parquet or .csv file of kernels")
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise OpcastError(f"{path} {what}; give a .parquet or .csv of kernels")
    if path.suffix not in (".parquet", ".csv"):
        raise OpcastError(f"{path}: give a .parquet or .csv file, not {path.suffix or 'a file without suffix'}")
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else _read_csv(path)
    except OpcastError:
        raise
    except Exception as err:  # pandas/pyarrow raise many types for unreadable files
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise OpcastError(
            f"{path} is not a readable {path.suffix[1:]} file ({first}); give a table with an op column"
        ) from None
    if frame.empty:
        raise OpcastError(f"{path} holds no rows; give at least one kernel (op, dtype, direction and its parameters)")
    return frame


def _read_csv(path: Path) -> pd.DataFrame:
    """A CSV of kernels read strictly: a row with more cells than the header is refused (pandas took its first
    cells for an index and shifted the rest, or dropped the extra ones), and so is a column named twice (pandas
    renamed the second ``m`` to ``m.1`` and predicted with the first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            frame = pd.read_csv(path, index_col=False)
        except pd.errors.ParserWarning:
            raise OpcastError(
                f"{path}: the first row has more cells than the header has columns; quote cells that hold a comma "
                "or name every column in the header"
            ) from None
    header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
    names = [str(v) for v in header.iloc[0]] if len(header) else []
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise OpcastError(f"{path}: column {', '.join(map(repr, twice))} appears more than once; name each once")
    return frame


def write_rows(frame: pd.DataFrame, path: str | Path) -> Path:
    import pyarrow as pa

    from opcast.atomic import write_atomically, write_failure

    path = Path(path)
    if path.suffix not in (".parquet", ".csv") or path.is_dir():
        raise OpcastError(f"--out {path}: give a .parquet or .csv file name")
    try:  # a failed or interrupted write leaves no temp file behind
        if path.suffix == ".parquet":
            write_atomically(path, lambda tmp: frame.to_parquet(tmp, index=False))
        else:
            write_atomically(path, lambda tmp: frame.to_csv(tmp, index=False))
    except OSError as err:
        raise OpcastError(write_failure("--out", path, err)) from None
    except (pa.ArrowException, ValueError, TypeError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise OpcastError(f"cannot write {path} as parquet ({first}); write a .csv instead") from None
    return path


def _value(row: dict, key: str, default):
    """The cell ``key`` of ``row``, or ``default`` when absent or blank (null, NaN, empty text)."""
    v = row.get(key)
    blank = v is None or v is pd.NA or (isinstance(v, float) and v != v) or (isinstance(v, str) and not v.strip())
    return default if blank else v


def _tensor_cores(row: dict) -> bool | None:
    try:
        return parse_bool(_value(row, "tensor_cores", None))
    except ValueError as err:
        raise OpcastError(f"tensor_cores={err}") from None


def predict_frame(
    frame: pd.DataFrame, device, kernels: KernelCostModel, comms: CollectiveCostModel | None = None
) -> pd.DataFrame:
    """``frame`` with ``time_s_pred`` (seconds per call) and ``source_pred`` for every row."""
    if "op" not in frame.columns:
        raise OpcastError("the input has no 'op' column; name each row's op kind (e.g. gemm)")
    comms = comms or CollectiveCostModel()
    rows = frame.to_dict("records")
    parsed: list[object] = []
    bad: list[str] = []
    for i, row in enumerate(rows):
        try:
            op = _value(row, "op", None)
            if op is None:
                raise OpcastError("the op cell is blank; name the op kind (e.g. gemm)")
            spec = get_op(str(op).strip())
            params = {n: row[n] for n in spec.param_names if n in row}
            if spec.collective:
                clean = spec.validate(params)
                parsed.append(
                    Collective(
                        spec.kind.value,
                        clean["bytes"],
                        Group(clean["world_size"], clean["nodes"], clean["gpus_per_node"]),
                    )
                )
            else:
                parsed.append(
                    validated_kernel(
                        spec.kind.value,
                        params,
                        str(_value(row, "dtype", "bf16")),
                        str(_value(row, "direction", "fwd")),
                        _tensor_cores(row),
                    )
                )
        except OpcastError as err:
            bad.append(f"row {i}: {err}")
    if bad:
        more = f" (and {len(bad) - SHOWN_BAD_ROWS} more)" if len(bad) > SHOWN_BAD_ROWS else ""
        raise OpcastError(
            f"{len(bad)} of {len(rows)} rows cannot be predicted: " + "; ".join(bad[:SHOWN_BAD_ROWS]) + more
        )
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
