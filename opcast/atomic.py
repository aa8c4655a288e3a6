"""Atomic file writes: the one rule for every file opcast writes that a reader may find half-written
(datasets, run records, predictions, traces, tables).

The file is written to a temporary name in the same folder, given the mode ``open()`` would have
given it, and renamed over the target; any failure (a full disk, Ctrl-C) removes the temporary
file and leaves the target as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def shared_mode(path: Path | str) -> None:
    """Give ``path`` the mode ``open()`` would have created it with (0666 less the umask): files
    written through ``mkstemp`` are 0600, which other members of a team cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def temp_beside(path: Path) -> Path:
    """A new empty temporary file in ``path``'s folder (created with its parents); raises OSError
    when the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def replace_with(tmp: Path, path: Path, write: Callable[[Path], object]) -> Path:
    """Run ``write(tmp)``, then move ``tmp`` over ``path`` with the umask's mode; on any exception
    ``tmp`` is removed and the exception propagates."""
    try:
        write(tmp)
        shared_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """``write`` a temporary file beside ``path`` and rename it over ``path`` (see the module)."""
    return replace_with(temp_beside(path), path, write)
