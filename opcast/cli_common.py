"""What every CLI command shares: consoles, tables, JSON output and the progress bar."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

# emoji=False: rich replaces ``:name:`` codes in printed strings, which turned user input in messages
# and tables into pictures (a path a:fire:b printed as a🔥b, --device cuda:abc: as cuda🔤)
console = Console(width=None if Console().is_terminal else 160, emoji=False)  # wide tables in logs and pipes
err_console = Console(stderr=True, emoji=False)


def print_json(doc: Any) -> None:
    """``doc`` as an indented JSON document on stdout (the ``--json`` of every command): plain
    text, byte for byte what rich's ``print_json`` writes to a pipe, without its highlighting
    (0.4 s for the 90 KB document of a training prediction). Values JSON does not know
    (numpy scalars) are written as floats."""
    sys.stdout.write(json.dumps(doc, indent=2, default=float, ensure_ascii=False) + "\n")


def print_frame(frame: Any, *, title: str | None = None) -> None:
    """A pandas frame as a rich table (floats in 4 significant digits)."""
    table = Table(title=title, show_lines=False)
    for column in frame.columns:
        wide = frame[column].astype(str).str.len().max() > 40 if len(frame) else False
        table.add_column(str(column), overflow="fold", no_wrap=not wide)
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Any]:
    """A rich progress bar with ETA on stderr; None when stderr is not a terminal."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if not enabled or not err_console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
    ) as progress:
        yield progress
