"""Run a measurement in a fresh process, so that what ran before cannot change its timing.

Why: on Linux, glibc serves a large allocation from free heap memory when some is left (the
``mmap`` threshold only applies when the heap has no room), and otherwise maps fresh pages whose
first touch costs a page fault each. A process that has just freed a model and its optimizer
states (a validation) therefore measures big-tensor ops 10x faster than a fresh one: an embedding
backward writing a 154 MB gradient took 5.6 ms in a ``collect bench`` that ran after a validation
in the same process and 56-75 ms in a fresh one, which is what a training step sees. ``calibrate``
and ``benchmarks/validate_cpu.py`` run each validation and the collection through
:func:`in_fresh_process`.

The child is started with ``spawn`` in its own process group, so a terminal's Ctrl-C reaches only
the parent: with ``forward_sigint`` the parent passes each one on (``collect bench`` then finishes
the current point and returns what it measured; a second one aborts it), otherwise the parent stops
the child and raises ``KeyboardInterrupt``. SIGTERM to the parent (``timeout``, a scheduler) is
handled alike while the child runs: passed on as SIGTERM with ``forward_sigint`` (``collect bench``
stops as on SIGINT), else the child is stopped and ``KeyboardInterrupt`` raised; the child never
outlives its parent's stop, and one whose parent was killed outright ends without a traceback.

``timeout_s`` makes a wall-time budget a hard bound on the child: shortly before it is spent the
child is asked to stop (SIGINT when it handles one, as ``collect bench`` does, else SIGTERM), then
without an answer stopped harder (SIGTERM, then SIGKILL), all within ``timeout_s`` (each signal
gets :data:`GRACE_S`, at most a quarter of the timeout between them), and :class:`Overran` is
raised with whatever it returned when asked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

GRACE_S = 5.0
"""Seconds a child that overran its timeout gets to answer each stop signal before the next one."""


class Overran(Exception):
    """The child ran past its ``timeout_s`` and was stopped."""

    def __init__(self, timeout_s: float, value: Any = None) -> None:
        super().__init__(f"stopped after its {timeout_s:.0f} s budget")
        self.timeout_s = timeout_s
        self.value = value
        """What the child returned when asked to stop (e.g. collect's rows so far), or None."""


def _child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.setpgrp()
    try:
        try:
            conn.send(("ok", fn(*args, **kwargs)))
        except BaseException as err:
            try:
                conn.send(("err", err))
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception:  # an exception that does not pickle
                conn.send(("tb", "".join(traceback.format_exception(err)).strip()))
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone (killed): no one to answer
        pass
    finally:
        conn.close()


def in_fresh_process(
    fn: Callable[..., Any],
    *args: Any,
    forward_sigint: bool = False,
    timeout_s: float | None = None,
    grace_s: float = GRACE_S,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)`` in a new ``spawn``-ed process; its result or its exception comes back.
    ``fn`` must be importable (a module-level function) and its arguments picklable. Within
    ``timeout_s`` seconds an unfinished child is stopped and :class:`Overran` raised (see the
    module docstring)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    previous = None
    terminated: list[int] = []
    if forward_sigint:

        def forward(signum: int, frame: Any) -> None:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)

        try:
            previous = signal.signal(signal.SIGINT, forward)
        except ValueError:  # not the main thread: Ctrl-C cannot be forwarded, the child keeps running
            previous = None

    def on_term(signum: int, frame: Any) -> None:
        """SIGTERM to the parent stops the child too (left alone, it outlived its parent: a
        collection went on measuring, holding its lock, and died on the closed pipe)."""
        terminated.append(signum)
        if not forward_sigint:
            from opcast.errors import Terminated

            raise Terminated  # the child is stopped below, as on Ctrl-C
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)  # collect bench finishes its point and returns what it measured

    try:
        previous_term = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        previous_term = None
    late = False
    signals = (signal.SIGINT, signal.SIGTERM) if forward_sigint else (signal.SIGTERM,)
    grace = 0.0 if timeout_s is None else min(grace_s, max(0.0, timeout_s) / 4 / len(signals))
    try:
        ready = parent.poll(None if timeout_s is None else max(0.0, timeout_s - grace * len(signals)))
        if not ready:
            late = True
            ready = _stop(proc, parent, signals, grace)
        if not ready:
            raise Overran(timeout_s or 0.0)
        try:
            status, value = parent.recv()
        except EOFError:
            proc.join()
            if late:
                raise Overran(timeout_s or 0.0) from None
            if terminated:  # the child died of the SIGTERM passed on: an interrupt, not a failure
                from opcast.errors import Terminated

                raise Terminated from None
            from opcast.errors import OpcastError

            why = " (killed: out of memory?)" if proc.exitcode in (-9, 137) else ""
            raise OpcastError(
                f"the measuring process died with exit code {proc.exitcode}{why} before it finished; "
                "try a smaller arch, batch or sequence"
            ) from None
    except KeyboardInterrupt:
        proc.terminate()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        parent.close()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if late:
        raise Overran(timeout_s or 0.0, value if status == "ok" else None)
    if status == "ok":
        return value
    if status == "err":
        raise value
    raise RuntimeError(f"the measuring process failed:\n{value}")


def _stop(proc: Any, conn: Any, signals: tuple[int, ...], grace_s: float) -> bool:
    """Signal an overrunning child (each of ``signals``, then SIGKILL), ``grace_s`` apart; True
    when it answered (a result or its end) before being killed."""
    for sig in signals:
        if proc.pid is not None and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        if conn.poll(grace_s):
            return True
    proc.kill()
    return False
