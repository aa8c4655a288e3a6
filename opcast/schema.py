"""The dataset schema: one tidy parquet row per measured op configuration.

Every stage speaks it: ``collect bench`` and ``collect comm`` write it, the replay importers
convert published measurements into it, ``train`` fits on it and ``predict kernels`` fills it.
The op parameter columns are the union of the registry's parameters (a kind leaves the others
null). The schema version sits in the parquet key-value metadata; writes are atomic (temp file
in the same folder + rename), and reading validates each file and names the offending one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Final

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from opcast.atomic import replace_with, temp_beside
from opcast.dtypes import DTYPES
from opcast.errors import OpcastError
from opcast.ops import Direction, get_op, is_missing, op_kinds, param_types

SCHEMA_VERSION: Final = 1
VERSION_KEY: Final = b"opcast.schema_version"
TABLE_KEY: Final = b"opcast.table"
"""Metadata key naming the table kind: ``ops`` (this schema; the default) or ``runs``."""

_PA_TYPES: Final = {int: pa.int64(), bool: pa.bool_(), str: pa.string()}

# (name, arrow type, required non-null, meaning)
PROVENANCE_COLUMNS: Final = (
    ("run_id", pa.string(), True, "id of the collect/replay run that produced the row"),
    ("source", pa.string(), True, "bench | comm | replay:<name>"),
    ("source_file", pa.string(), False, "file the row was replayed from, relative to the source root"),
    ("device", pa.string(), True, "hardware catalog name, or the local device's name"),
    ("torch_version", pa.string(), False, "torch version that ran the kernel"),
    ("cuda_version", pa.string(), False, "CUDA runtime version (null on CPU)"),
    ("opcast_version", pa.string(), False, "opcast version that wrote the row"),
    ("timing_method", pa.string(), True, "cuda_event | cuda_graph | perf_counter | wallclock_max_ranks | replay:<how>"),
)
OP_COLUMNS: Final = (
    ("op", pa.string(), True, "op kind (opcast.ops registry)"),
    ("dtype", pa.string(), True, "fp32 | tf32 | fp16 | bf16 | fp8 | fp8_block | nvfp4"),
    ("direction", pa.string(), True, "fwd | bwd"),
    ("tensor_cores", pa.bool_(), False, "tensor cores allowed (false: FP32 on CUDA cores)"),
    ("point_id", pa.string(), True, "hash of (op, params, dtype, direction, tensor_cores): the resume key"),
)
KERNEL_COLUMNS: Final = (
    ("kernel_name", pa.string(), False, "the (main) device kernel, where known"),
    ("grid", pa.string(), False, "kernel launch grid, where known"),
    ("block", pa.string(), False, "kernel launch block, where known"),
)
TIMING_COLUMNS: Final = (
    ("time_s_median", pa.float64(), True, "median time of one call, seconds"),
    ("time_s_p20", pa.float64(), False, "20th percentile, seconds"),
    ("time_s_p80", pa.float64(), False, "80th percentile, seconds"),
    ("n_reps", pa.int64(), False, "timed repetitions"),
    ("algbw_gbps", pa.float64(), False, "collectives: bytes / time, GB/s (1e9)"),
    ("busbw_gbps", pa.float64(), False, "collectives: algbw x nccl-tests bus factor, GB/s"),
)
COLLECTIVE_COLUMNS: Final = (
    ("cluster", pa.string(), False, "collectives: catalog cluster measured on (opcast.clusters), null if unknown"),
    ("backend", pa.string(), False, "collectives: nccl | gloo | rccl, null if unknown"),
    ("nccl_version", pa.string(), False, "collectives: NCCL library version (e.g. 2.18.5), null if unknown"),
)
"""The cluster a collective ran on, beside its topology (the op parameters ``world_size``,
``nodes``, ``gpus_per_node``). Optional and appended last, so files written before them read
with nulls (no schema version change)."""


def _param_columns() -> tuple[tuple[str, pa.DataType, bool, str], ...]:
    return tuple((name, _PA_TYPES[t], False, "op parameter") for name, t in param_types().items())


def columns() -> tuple[tuple[str, pa.DataType, bool, str], ...]:
    """All columns in order: provenance, op identity, op parameters, kernel, timing, collective."""
    return PROVENANCE_COLUMNS + OP_COLUMNS + _param_columns() + KERNEL_COLUMNS + TIMING_COLUMNS + COLLECTIVE_COLUMNS


def dataset_schema() -> pa.Schema:
    """The arrow schema, carrying the schema version in its metadata."""
    fields = [pa.field(name, typ, nullable=not required) for name, typ, required, _ in columns()]
    return pa.schema(fields, metadata={VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: b"ops"})


def required_columns() -> tuple[str, ...]:
    return tuple(name for name, _, required, _ in columns() if required)


def point_id(
    op: str, params: Mapping[str, object], dtype: str, direction: str, tensor_cores: bool | None = None
) -> str:
    """Stable id of one op configuration: the key that resumable collection skips on. A parameter a kind gained
    with an id-neutral default (:attr:`opcast.ops.Param.id_neutral`) is left out at that default or without a
    value, so a configuration keeps the id it had before its kind had the parameter."""
    neutral = ID_NEUTRAL.get(op)
    if neutral:
        params = {k: v for k, v in params.items() if not (k in neutral and (is_missing(v) or v == neutral[k]))}
    canon = {
        "op": op,
        "params": {k: canonical_value(params[k]) for k in sorted(params)},
        "dtype": dtype,
        "direction": direction,
        "tensor_cores": tensor_cores,
    }
    return hashlib.sha1(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _id_neutral() -> dict[str, dict[str, object]]:
    """op kind -> {parameter: its id-neutral default} (:attr:`opcast.ops.Param.id_neutral`)."""
    out: dict[str, dict[str, object]] = {}
    for kind in op_kinds():
        neutral: dict[str, object] = {p.name: p.default for p in get_op(kind).params if p.id_neutral}
        if neutral:
            out[kind] = neutral
    return out


ID_NEUTRAL: Final = _id_neutral()
"""op kind -> {parameter: default} left out of :func:`point_id` at that default."""


def canonical_value(value: object) -> object:
    """numpy/pandas scalars and integral floats as plain Python values, so ids are stable."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# --------------------------------------------------------------------------- frames


def to_table(rows: pd.DataFrame | Iterable[Mapping[str, object]]) -> pa.Table:
    """Rows (dicts or a frame) as an arrow table in the dataset schema.

    Missing optional columns become null; a missing required value, an unknown column or a value
    of the wrong type raises :class:`OpcastError`. ``point_id`` is filled in when absent.
    """
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    frame = frame.copy()
    schema = dataset_schema()
    unknown = sorted(set(frame.columns) - set(schema.names))
    if unknown:
        raise OpcastError(f"unknown dataset column(s) {', '.join(unknown)}; see opcast.schema.columns()")
    if "point_id" not in frame.columns and len(frame):
        frame["point_id"] = [_row_point_id(r) for r in frame.to_dict("records")]
    for name in schema.names:
        if name not in frame.columns:
            frame[name] = None
    missing = [c for c in required_columns() if frame[c].isna().any()]
    if missing:
        raise OpcastError(f"rows lack required value(s) for {', '.join(missing)}")
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as err:
        raise OpcastError(f"rows do not fit the dataset schema: {str(err).splitlines()[0]}") from None


def _row_point_id(row: Mapping[Hashable, object]) -> str:
    spec = get_op(str(row["op"]))
    params = {k: row[k] for k in spec.param_names if k in row}
    tc = row.get("tensor_cores")
    return point_id(
        spec.kind.value,
        params,
        str(row["dtype"]),
        str(row["direction"]),
        None if pd.isna(tc) else bool(tc),  # type: ignore[call-overload]  # pandas-stubs: isna takes any scalar
    )


def write_parquet(rows: pd.DataFrame | Iterable[Mapping[str, object]] | pa.Table, path: str | Path) -> Path:
    """Write rows atomically to ``path`` (temp file in the same folder, then rename)."""
    table = rows if isinstance(rows, pa.Table) else to_table(rows)
    path = Path(path)
    try:
        tmp = temp_beside(path)
    except OSError as err:
        raise OpcastError(f"cannot write {path}: {err.strerror}; choose a writable --out folder") from None
    return replace_with(tmp, path, lambda t: pq.write_table(table, t, compression="zstd"))


_PANDAS_TYPES: Final = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype(), pa.string(): pd.StringDtype()}


def _is_other_table(path: Path) -> bool:
    """True for opcast parquet files of another table kind (e.g. runs), which op readers skip."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError):
        return False  # unreadable: read_table names it
    return meta.get(TABLE_KEY, b"ops") != b"ops"


def dataset_files(path: str | Path) -> list[Path]:
    """The op parquet files of a dataset: the file itself, or every ``*.parquet`` below a folder
    (hidden temp files and other opcast tables such as runs left out)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(
            p for p in path.rglob("*.parquet") if p.is_file() and not p.name.startswith(".") and not _is_other_table(p)
        )
    if path.exists():  # a device, a pipe, a socket
        raise OpcastError(
            f"dataset {path} is not a regular file or a folder; "
            "give a .parquet file or a folder written by opcast collect"
        )
    raise OpcastError(f"dataset {path} does not exist; give a .parquet file or a folder written by opcast collect")


def _check_version(path: Path, meta: Mapping[bytes, bytes]) -> int:
    """The file's schema version from its metadata; a missing, non-numeric or newer one is a
    one-line :class:`OpcastError` naming the file."""
    raw = meta.get(VERSION_KEY)
    if raw is None:
        raise OpcastError(
            f"{path} has no opcast schema version; it was not written by opcast (convert it with opcast collect replay)"
        )
    text = raw.decode("utf-8", "replace").strip()
    if not text.isascii() or not text.isdigit():
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise OpcastError(
            f"{path}: its opcast.schema_version metadata {shown!r} is not a whole number; the file was "
            "edited or written by another tool: delete it or re-create it with opcast collect"
        )
    version = int(text)
    if version > SCHEMA_VERSION:
        raise OpcastError(
            f"{path} has schema version {version}, newer than this opcast ({SCHEMA_VERSION}); upgrade opcast"
        )
    return version


def _unreadable(path: Path, err: Exception) -> OpcastError:
    return OpcastError(
        f"{path} is not a readable parquet file ({(str(err).splitlines() or [''])[0]}); give a dataset written by "
        "opcast collect (convert other files with opcast collect replay), or re-create a damaged one"
    )


def _check_footer(path: Path, schema: pa.Schema) -> None:
    """The file's schema version and required columns, from its footer alone."""
    _check_version(path, schema.metadata or {})
    missing = [n for n in required_columns() if n not in schema.names]
    if missing:
        raise OpcastError(f"{path} lacks required column(s) {', '.join(missing)}")


def check_dataset(path: str | Path) -> None:
    """Refuse, without reading its rows, a dataset that :func:`read_dataset` would refuse for what its
    files' footers show (not a file or folder, no parquet files, not parquet, another tool's, missing
    columns): for an option read only after long work (calibrate --datasets, read by the fit)."""
    files = dataset_files(path)
    if not files:
        raise OpcastError(f"no parquet files found in {path}")
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (pa.ArrowException, OSError) as err:
            raise _unreadable(f, err) from None
        _check_footer(f, schema)


def read_table(path: str | Path) -> pa.Table:
    """Read and validate one parquet file of the dataset schema."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise _unreadable(path, err) from None
    _check_footer(path, table.schema)
    schema = dataset_schema()
    for name in table.schema.names:
        if name in schema.names and not table.schema.field(name).type.equals(schema.field(name).type):
            try:
                table = table.set_column(
                    table.schema.get_field_index(name), name, table[name].cast(schema.field(name).type)
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise OpcastError(
                    f"{path}: column {name} has type {table.schema.field(name).type}, expected "
                    f"{schema.field(name).type}"
                ) from None
    for name in schema.names:  # older files may lack newer optional columns
        if name not in table.schema.names:
            table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    table = table.select(schema.names).replace_schema_metadata(schema.metadata)
    problem = value_problem(table)
    if problem is not None:
        raise OpcastError(
            f"{path}: {problem}; the file was edited or written by another tool: delete it or re-create it "
            "with opcast collect"
        )
    return table


def _shown(values: Iterable[object]) -> str:
    return ", ".join(repr(v) for v in sorted(map(str, values))[:3])


def value_problem(table: pa.Table) -> str | None:
    """The first row value of ``table`` (in the dataset schema) outside the op registry: a required
    value that is null (as :func:`to_table` refuses it: a null op, dtype or direction passed the checks
    of known values below), an op, dtype or direction opcast does not know, or an op parameter that is
    missing, below its minimum or not one of its choices (as :meth:`opcast.ops.OpSpec.validate` refuses
    it). Such a row was summarised and scored as if it were a measurement (``m = -64`` priced, an
    unknown op or direction counted as uncovered); None when every row is one opcast could have written."""
    for name, _, required, meaning in columns():
        if required and table[name].null_count:
            return f"column {name} ({meaning}) is null in {table[name].null_count} row(s), where a value is required"
    frame = table.select(["op", "dtype", "direction"]).to_pandas()
    for column, known in (("op", op_kinds()), ("dtype", DTYPES), ("direction", tuple(d.value for d in Direction))):
        bad = set(frame[column].dropna().astype(str)) - set(known)
        if bad:
            return f"{column} {_shown(bad)} is not one opcast knows ({', '.join(known)})"
    for kind in sorted(set(frame["op"].dropna().astype(str))):
        rows = pa.array((frame["op"] == kind).to_numpy())
        for p in get_op(kind).params:
            values = table[p.name].filter(rows).to_pandas()
            missing = int(values.isna().sum())
            if missing and p.default is None:
                return f"{missing} {kind} row(s) lack parameter {p.name} ({p.doc})"
            present = values.dropna()
            low = present[present < p.minimum] if p.type is int else present[:0]
            if len(low):
                return f"{kind} parameter {p.name} is {low.iloc[0]} in {len(low)} row(s), below its minimum {p.minimum}"
            if p.choices is not None and not set(present.astype(str)) <= set(p.choices):
                bad = set(present.astype(str)) - set(p.choices)
                return f"{kind} parameter {p.name} {_shown(bad)} is not one of {', '.join(p.choices)}"
    return None


def read_dataset(paths: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Read one or more datasets (files or folders of per-rank parts) into one validated frame; a file
    named more than once (directly or through a folder) is read once."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    # each file once, however often it is named (a file twice, or a file and its folder): its rows
    # were read, fitted and scored twice over
    seen: dict[Path, Path] = {}
    for p in paths:
        for f in dataset_files(p):
            seen.setdefault(f.resolve(), f)
    files = list(seen.values())
    if not files:
        raise OpcastError(f"no parquet files found in {', '.join(map(str, paths))}")
    table = pa.concat_tables([read_table(f) for f in files])
    return table.to_pandas(types_mapper=_PANDAS_TYPES.get)


def row_params(row: Mapping[str, object]) -> dict[str, object]:
    """The op parameters of a dataset row: the ones its kind takes that the row gives (a missing one is the
    parameter's default)."""
    return {k: row[k] for k in get_op(str(row["op"])).param_names if k in row and not is_missing(row[k])}
