"""Atomic file writes: the one rule for every file opcast writes that a reader may find half-written
(datasets, run records, predictions, traces, tables).

The file is written to a temporary name in the same folder, given the mode ``open()`` would have
given it, and renamed over the target; any failure (a full disk, Ctrl-C) removes the temporary
file and leaves the target as it was.
"""

from __future__ import annotations

import errno
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def shared_mode(path: Path | str) -> None:
    """Give ``path`` the mode ``open()`` would have created it with (0666 less the umask): files
    written through ``mkstemp`` are 0600, which other members of a team cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


NOT_REGULAR: str = "not a regular file (a device, pipe or socket), which the write would replace"


def not_regular(path: Path) -> bool:
    """True when ``path`` exists and is neither a regular file nor a folder: the rename of an atomic
    write would put a regular file in its place (run as root, ``--csv /dev/full`` replaced the
    device node with the table)."""
    try:
        return path.exists() and not path.is_file() and not path.is_dir()
    except OSError:
        return False  # cannot be inspected: the write reports what goes wrong


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
        if not_regular(path):
            raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
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


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a file, when ``path`` lies below one: ``exists()``
    is False below a file); the folders a write would make start below it."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def output_file_problem(flag: str, path: Path, suffixes: tuple[str, ...] = (), *, example: str = "") -> str | None:
    """Why ``flag PATH`` cannot name a file to write, found before any work, or None: a folder, a
    device, pipe or socket (:func:`not_regular`), a path below a file (its folders could not be
    made), or a suffix not in ``suffixes`` (with the dot; empty: any). ``example``: the file name a
    folder's message suggests (default out.SUFFIX)."""
    example = example or f"out{suffixes[0] if suffixes else ''}"
    if path.is_dir():
        return f"{flag} {path} is a folder; give a file name such as {path / example}"
    if not_regular(path):
        return f"{flag} {path} is {NOT_REGULAR}; give a regular file to write"
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        return f"{flag} {path} lies under {parent}, which is a file; choose another path"
    if suffixes and path.suffix not in suffixes:
        return f"{flag} {path}: give a file name ending in {' or '.join(suffixes)}"
    return None


def write_failure(flag: str, path: Path, err: OSError, what: str = "") -> str:
    """The one-line message of a failed write of ``flag``'s file: the system's reason and the fix
    that fits it (free space only when space is what ran out)."""
    reason = err.strerror or str(err)
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = f"free space or choose another {flag}" if full else f"choose another {flag}"
    return f"cannot write {what + ' ' if what else ''}{path}: {reason}; {fix}"


def output_folder_problem(flag: str, path: Path, *, holds: str = "") -> str | None:
    """Why ``flag PATH`` cannot be a folder to write into, found before any work, or None: a file,
    a path below a file, or a nearest existing folder that is not writable (it is made later).
    ``holds``: what the folder receives, said in the message of a file (e.g. "the set is written
    to OUT/NAME/")."""
    try:
        if path.exists() and not path.is_dir():
            return f"{flag} {path} is a file; give a folder{f' ({holds})' if holds else ''}"
        base = _nearest_existing(path)
    except OSError as err:
        return f"{flag} {path} cannot be inspected ({err.strerror}); choose a readable, writable folder"
    if not base.is_dir():
        return f"{flag} {path} lies under {base}, which is a file; choose a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{flag} {path}: {base} is not writable; choose a writable folder"
    return None


def _interrupt(signum: int, frame: object) -> None:
    from opcast.errors import Terminated

    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the body runs, SIGTERM raises :class:`~opcast.errors.Terminated` (a ``KeyboardInterrupt``),
    so the cleanup of a half-written output runs (the default action ends the process on the spot and
    leaves it), and the CLI exits 143. For writes outside a command's own signal handling (``collect``
    has :mod:`opcast.collect.signals`); off the main thread it does nothing."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
