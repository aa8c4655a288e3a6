"""The runs table: measured end-to-end executions (model, mode, batch, sequence, latencies),
kept beside the op rows so that ``predict`` can be validated against real runs.

Stored as parquet with ``opcast.table = runs`` in its metadata, so dataset readers skip it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from opcast.errors import OpcastError
from opcast.schema import TABLE_KEY, VERSION_KEY, write_parquet

RUNS_SCHEMA_VERSION: Final = 1

RUN_COLUMNS: Final = (
    ("source", pa.string(), "replay:<name>"),
    ("source_file", pa.string(), "file the run was read from, relative to the source root"),
    ("device", pa.string(), "hardware catalog name"),
    ("model", pa.string(), "model name as the source gives it (e.g. gpt2-large)"),
    ("arch", pa.string(), "opcast arch preset or config the model maps to, where known"),
    ("mode", pa.string(), "inf (one forward) | train (forward + backward) | train_step (with optimizer)"),
    ("dtype", pa.string(), "fp32 | fp16 | bf16"),
    ("batch", pa.int64(), "sequences per step"),
    ("seq", pa.int64(), "tokens per sequence"),
    ("num_layers", pa.int64(), "transformer layers of the measured model"),
    ("total_s", pa.float64(), "end-to-end latency, seconds"),
    ("fwd_s", pa.float64(), "forward latency, seconds"),
    ("bwd_s", pa.float64(), "backward latency, seconds (null for inference)"),
    ("ops_json", pa.string(), "per-op rows of one layer as JSON (name, kind, fwd_s, bwd_s), where the source has them"),
)


def runs_schema() -> pa.Schema:
    return pa.schema(
        [pa.field(n, t) for n, t, _ in RUN_COLUMNS],
        metadata={VERSION_KEY: str(RUNS_SCHEMA_VERSION).encode(), TABLE_KEY: b"runs"},
    )


def write_runs(runs: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """Write runs atomically in the runs schema."""
    frame = pd.DataFrame(list(runs))
    schema = runs_schema()
    unknown = sorted(set(frame.columns) - set(schema.names))
    if unknown:
        raise OpcastError(f"unknown runs column(s) {', '.join(unknown)}")
    for name in schema.names:
        if name not in frame.columns:
            frame[name] = None
    table = pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    return write_parquet(table, path)


def read_runs(path: Path) -> pd.DataFrame:
    """Read a runs file, checking that it is one."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise OpcastError(f"{path} is not a readable parquet file ({str(err).splitlines()[0]})") from None
    if (table.schema.metadata or {}).get(TABLE_KEY) != b"runs":
        raise OpcastError(f"{path} is not an opcast runs table")
    return table.to_pandas()
