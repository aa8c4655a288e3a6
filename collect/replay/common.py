"""What every replay importer shares: the result it returns, malformed-file errors, and the
normalisation (validation, provenance, de-duplication) applied to every source's rows."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcast.errors import OpcastError
from opcast.ops import exact_int, get_op
from opcast.schema import point_id


class MalformedFile(OpcastError):
    """A source file that cannot be parsed; the message names the file and the line."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")


@dataclass(kw_only=True, slots=True)
class ReplayResult:
    """What an importer read: op rows in the dataset schema (without run-level provenance),
    end-to-end runs (optional), and the rows it skipped with reasons."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    """One dict per measurement: op, params, dtype, direction, device, time_s_median, ..."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """End-to-end runs (opcast.collect.replay.runs schema), where the source has them."""
    skipped: Counter = field(default_factory=Counter)
    """reason -> rows not converted."""
    files: int = 0
    """Source files read."""
    notes: list[str] = field(default_factory=list)
    """What the user should know of rows that were converted (e.g. a log that looks cut off)."""


def _csv_rows(path: Path, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every record of the CSV ``path``; a file that cannot be opened, is
    not UTF-8 text (a binary file) or is not a readable CSV (a field past the csv module's limit)
    raises :class:`MalformedFile` naming the file and line."""
    try:
        # closed by the `with fh` below; opened apart so that only open() errors read as unreadable
        fh = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115
    except OSError as err:
        raise MalformedFile(path, None, f"cannot read: {err.strerror}") from None
    with fh:
        reader = csv.reader(fh, delimiter=delimiter)
        while True:
            try:
                values = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError:  # decoded a block at a time: the line is not known
                raise MalformedFile(
                    path, None, "not UTF-8 text (a binary file?); give the source's CSV as published"
                ) from None
            except csv.Error as err:
                raise MalformedFile(
                    path, reader.line_num, f"not a readable CSV ({err}); give the source's CSV as published"
                ) from None
            yield reader.line_num, values


def csv_header(path: Path) -> list[str] | None:
    """The stripped column names of the CSV ``path``'s first record (None: an empty file)."""
    for _, header in _csv_rows(path):
        return [h.strip() for h in header]
    return None


def read_csv(
    path: Path, *, required: tuple[str, ...] = (), delimiter: str = ","
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV with a header; a missing column or a ragged row raises
    :class:`MalformedFile` naming the file and line, as do the problems of :func:`_csv_rows`."""
    rows = _csv_rows(path, delimiter)
    first = next(rows, None)
    if first is None:
        raise MalformedFile(path, 1, "empty file, expected a CSV header")
    header = [h.strip() for h in first[1]]
    missing = [c for c in required if c not in header]
    if missing:
        raise MalformedFile(path, 1, f"header lacks column(s) {', '.join(missing)}")
    for line, values in rows:
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise MalformedFile(path, line, f"{len(values)} fields, the header has {len(header)}")
        yield line, dict(zip(header, (v.strip() for v in values)))


def number(path: Path, line: int, row: Mapping[str, str], column: str) -> float:
    """``row[column]`` as a float, or a :class:`MalformedFile` naming file, line and column."""
    try:
        return float(row[column])
    except (KeyError, ValueError):
        raise MalformedFile(path, line, f"column {column!r} is {row.get(column)!r}, not a number") from None


def whole(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    """``row[column]`` as a whole number (written as an int or an integral float), or a
    :class:`MalformedFile` naming file, line and column."""
    value = exact_int(row.get(column))  # digits exactly: through float, 2**53 + 1 read as 2**53
    if value is None:
        raise MalformedFile(path, line, f"column {column!r} is {row.get(column)!r}, not a whole number")
    return value


def normalise(
    result: ReplayResult, *, source: str, run_id: str, opcast_version: str
) -> tuple[list[dict[str, Any]], Counter]:
    """Validate every row against its op kind, add provenance, and drop duplicates.

    Returns the kept rows and the skipped counter (the importer's own skips plus invalid rows
    and duplicates). A duplicate is the same (device, op config, dtype, direction); the first
    row read is kept.
    """
    skipped = Counter(result.skipped)
    kept: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    # validation and point ids by the row's raw configuration: sources measure each shape on many devices
    # (AIConfigurator's ten systems), so most rows repeat one already checked (the same answer, ~2x faster)
    checked: dict[tuple, tuple[dict[str, Any], str] | str] = {}
    for row in result.rows:
        op, direction = str(row["op"]), str(row["direction"])
        try:
            spec = get_op(op)
        except OpcastError as err:
            skipped[f"invalid {row.get('op')}: {str(err).split(': ', 1)[-1]}"] += 1
            continue
        names = spec.param_names
        raw = tuple((k, type(row[k]), row[k]) if k in row else (k,) for k in names)
        memo: tuple | None = (op, direction, str(row["dtype"]), row.get("tensor_cores"), raw)
        try:
            got = checked.get(memo)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value (a list where a number belongs): validation refuses it below
            got = memo = None
        if got is None:
            try:
                params = spec.validate({k: row[k] for k in names if k in row}, direction=direction)
            except OpcastError as err:
                got = f"invalid {row.get('op')}: {str(err).split(': ', 1)[-1]}"
            else:
                pid = point_id(spec.kind.value, params, str(row["dtype"]), direction, row.get("tensor_cores"))
                got = (params, pid)
            if memo is not None:
                checked[memo] = got
        if isinstance(got, str):
            skipped[got] += 1
            continue
        params, pid = got
        key = (str(row["device"]), pid)
        if key in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(key)
        out = {k: v for k, v in row.items() if k not in spec.param_names}
        out.update(params)
        out.update(run_id=run_id, source=f"replay:{source}", opcast_version=opcast_version, point_id=pid)
        out.setdefault("timing_method", f"replay:{source}")
        kept.append(out)
    return kept, skipped
