"""Where collect runs put things: per-rank parquet parts, the resume index and run.json."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opcast.errors import OpcastError
from opcast.schema import dataset_files, read_table, write_parquet


class PartWriter:
    """Buffers rows and writes them as numbered parquet parts, each one atomic.

    A part is written every ``every_rows`` rows or ``every_s`` seconds, and on :meth:`flush`,
    so an interrupted run loses at most the point being measured.
    """

    def __init__(self, folder: Path, *, rank: int, run_id: str, every_rows: int = 50, every_s: float = 15.0) -> None:
        self.folder = Path(folder)
        self.prefix = f"rank{rank:04d}-{run_id}"
        self.every_rows = every_rows
        self.every_s = every_s
        self.rows: list[dict[str, Any]] = []
        self.parts = 0
        self._last = time.monotonic()

    def add(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))
        if len(self.rows) >= self.every_rows or time.monotonic() - self._last > self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            write_parquet(self.rows, self.folder / f"{self.prefix}-{self.parts:04d}.parquet")
            self.parts += 1
            self.rows = []
        self._last = time.monotonic()


def done_point_ids(out: Path, device: str) -> set[str]:
    """Point ids already measured on ``device`` anywhere in the dataset folder ``out``."""
    out = Path(out)
    if not out.exists():
        return set()
    done: set[str] = set()
    for f in dataset_files(out):
        table = read_table(f).select(["device", "point_id"]).to_pydict()
        done.update(pid for dev, pid in zip(table["device"], table["point_id"]) if dev == device)
    return done


def write_json_atomic(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2, default=str)
    os.replace(tmp, path)


def record_run(out: Path, *, rank: int, record: Mapping[str, Any]) -> Path:
    """Append ``record`` to ``out/run.json`` (rank 0) or ``out/run-rank<r>.json``."""
    path = Path(out) / ("run.json" if rank == 0 else f"run-rank{rank}.json")
    runs: list[Any] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (json.JSONDecodeError, AttributeError):
            raise OpcastError(f"{path} is corrupt; move it aside and re-run (the measured parquet parts are kept)") from None
    write_json_atomic(path, {"runs": runs + [dict(record)]})
    return path
