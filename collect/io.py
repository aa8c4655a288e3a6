"""Where collect runs put things: per-rank parquet parts, the resume index, run.json and the lock
that keeps two writers off one dataset folder.

Files are written through a temp file and a rename (atomic), with the mode a plain ``open``
would give them (0666 less the umask, e.g. 0644), so a team can share a dataset; a write that
fails (a full disk) leaves no temp file behind and keeps every part written before it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opcast.atomic import write_atomically
from opcast.errors import OpcastError
from opcast.schema import dataset_files, read_table, write_parquet


def write_problem(err: BaseException) -> str:
    """What went wrong with a write, in words: a full disk and an exceeded quota are named."""
    code = getattr(err, "errno", None)
    if code == errno.ENOSPC:
        return "the disk is full"
    if code == errno.EDQUOT:
        return "the disk quota is exceeded"
    strerror = getattr(err, "strerror", None)
    return f"cannot write ({strerror or str(err).splitlines()[0]})"


class DiskWriteError(OpcastError):
    """A part could not be written (a full disk, a quota, an I/O error); the parts written
    before it are kept and the rows it held are still in the writer."""

    def __init__(self, problem: str, path: Path) -> None:
        super().__init__(f"{problem} (writing {path})")
        self.problem = problem
        self.path = path


class PartWriter:
    """Buffers rows and writes them as numbered parquet parts, each one atomic.

    The first row is written at once (a folder that cannot take parts fails early, and a watcher
    sees the run has started); then a part is written every ``every_rows`` rows or ``every_s``
    seconds, and on :meth:`flush`, so an interrupted run loses at most the point being measured.
    A failed write raises :class:`DiskWriteError` and keeps the rows, so a later flush can retry.
    """

    def __init__(self, folder: Path, *, rank: int, run_id: str, every_rows: int = 50, every_s: float = 15.0) -> None:
        self.folder = Path(folder)
        self.prefix = f"rank{rank:04d}-{run_id}"
        self.every_rows = every_rows
        self.every_s = every_s
        self.rows: list[dict[str, Any]] = []
        self.parts = 0
        self.saved = 0
        """Rows written to parts so far."""
        self._last = float("-inf")

    def add(self, row: Mapping[str, Any]) -> None:
        self.rows.append(dict(row))
        if len(self.rows) >= self.every_rows or time.monotonic() - self._last > self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            path = self.folder / f"{self.prefix}-{self.parts:04d}.parquet"
            try:
                write_parquet(self.rows, path)
            except OSError as err:
                raise DiskWriteError(write_problem(err), path) from None
            self.parts += 1
            self.saved += len(self.rows)
            self.rows = []
        self._last = time.monotonic()


def done_point_ids(out: Path, device: str, timed: Callable[[str], bool] | None = None) -> set[str]:
    """Point ids already measured on ``device`` anywhere in the dataset folder ``out`` (with ``timed``, only
    rows whose ``timing_method`` it accepts: a point timed by another protocol is not done)."""
    out = Path(out)
    if not out.exists():
        return set()
    done: set[str] = set()
    for f in dataset_files(out):
        table = read_table(f)
        cols = ["device", "point_id"] + (["timing_method"] if timed is not None else [])
        data = table.select(cols).to_pydict()
        methods = data.get("timing_method") or [None] * len(data["device"])
        done.update(
            pid
            for dev, pid, method in zip(data["device"], data["point_id"], methods)
            if dev == device and (timed is None or timed(str(method)))
        )
    return done


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically, with the umask's mode; a failed write
    (a full disk) leaves ``path`` as it was and no temp file."""

    def write(tmp: Path) -> None:
        with open(tmp, "w") as fh:
            json.dump(payload, fh, indent=2, default=str)

    write_atomically(path, write)


def read_runs(path: Path) -> list[Any] | None:
    """The ``runs`` list of a run.json (empty when the object has none), or None when the file cannot be
    read as one: unreadable, not JSON text (invalid, binary, an integer of thousands of digits), nested
    too deeply, not an object, or ``runs`` not a list."""
    try:
        runs = json.loads(path.read_text(encoding="utf-8")).get("runs", [])
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return runs if isinstance(runs, list) else None


def record_run(out: Path, *, rank: int, record: Mapping[str, Any]) -> Path:
    """Append ``record`` to ``out/run.json`` (rank 0) or ``out/run-rank<r>.json``."""
    path = Path(out) / ("run.json" if rank == 0 else f"run-rank{rank}.json")
    runs = read_runs(path) if path.exists() else []
    if runs is None:
        raise OpcastError(f"{path} is corrupt; move it aside and re-run (the measured parquet parts are kept)")
    write_json_atomic(path, {"runs": [*runs, dict(record)]})
    return path


def failure_text(failure: BaseException | None) -> str | None:
    """What stopped a run, for the ``error`` of its run.json record (None: nothing went wrong)."""
    if failure is None:
        return None
    if isinstance(failure, DiskWriteError):
        return f"{failure.problem} (writing {failure.path})"
    return f"{type(failure).__name__}: {str(failure)[:200]}"


def finish_run(
    writer: PartWriter,
    out: Path,
    *,
    rank: int,
    failure: BaseException | None,
    record: Callable[[BaseException | None], Mapping[str, Any]],
) -> None:
    """The one way a collect run ends, whatever stopped it (done, a signal, a full disk, a bug):
    write the buffered rows, then append ``record(failure)`` to run.json (``failure`` includes a
    full disk met by this last write), then raise ``failure``; a full disk becomes one line that
    says what is on disk. A run.json that cannot be written is an error only when nothing else
    went wrong (the first problem is the one reported)."""
    try:
        writer.flush()
    except DiskWriteError as err:
        failure = failure or err
    recorded = True
    try:
        record_run(out, rank=rank, record=record(failure))
    except OSError:
        if failure is None:
            raise
        recorded = False
    if isinstance(failure, DiskWriteError):
        raise OpcastError(
            f"{failure}: {writer.saved} rows of this run are on disk, {len(writer.rows)} measured rows "
            f"could not be written{'' if recorded else ' and run.json could not be updated'}; "
            "free space and re-run the same command to resume"
        ) from None
    if failure is not None:
        raise failure


class WriterLock:
    """One writer per place in a dataset folder: an exclusive ``flock`` on ``path``, which holds
    the holder's PID and host for the message a second writer gets.

    The kernel drops the lock when its holder exits, however it dies, so a lock file left by a
    dead process is simply taken over. Where the file system cannot lock (some network mounts),
    the writer goes on unlocked.
    """

    def __init__(self, path: Path, *, command: str, out: Path) -> None:
        self.path = Path(path)
        self.command = command
        self.out = Path(out)
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise OpcastError(f"cannot write to {self.out}: {err.strerror}; choose a writable --out folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise OpcastError(
                f"{self.out} is being written by {holder} (lock {self.path.name}); wait for it to finish "
                f"or stop it, or give another --out"
            ) from None
        except OSError:  # no locking on this file system
            os.close(fd)
            return self
        os.ftruncate(fd, 0)
        os.write(fd, f"opcast collect {self.command}, PID {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
