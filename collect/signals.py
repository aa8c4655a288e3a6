"""Stopping a collect run without losing what it measured: SIGINT (Ctrl-C) and SIGTERM (a SLURM
time limit, ``timeout``, ``docker stop``, torchrun tearing the job down).

The first signal asks the run to stop at its next check; a second one aborts what is running
(``KeyboardInterrupt``), except while ``shielded`` (the final writes), when it is only noted.
Signals that were ignored when the run started (``nohup``, a background job) stay ignored.

A Python handler runs only when the main thread is back in the interpreter, so a rank blocked in
C++ (a collective whose peer is gone or stopped) would never see the signal, and its launcher
would SIGKILL it. With ``stuck_after_s``, a thread is woken by the signal itself
(``signal.set_wakeup_fd``) and calls ``on_stuck(signum)`` when the run has not ended that many
seconds after the first signal: in time to write before the SIGKILL.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any


class StopSignals:
    """SIGINT and SIGTERM while a collect run is in this context; see the module docstring."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, stuck_after_s: float | None = None, on_stuck: Callable[[int], None] | None = None) -> None:
        self.signum: int | None = None
        """The first signal received."""
        self.shielded = False
        """While true, a second signal is only noted."""
        self.stuck_after_s = stuck_after_s
        self.on_stuck = on_stuck
        self._previous: dict[int, Any] = {}
        self._ended = threading.Event()
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def stop(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        return signal_name(self.signum)

    def __enter__(self) -> StopSignals:
        for signum in self.SIGNALS:
            try:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: signals stay with the caller
                return self
        if self._previous and self.stuck_after_s is not None and self.on_stuck is not None:
            self._start_watchdog()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        elif not self.shielded:
            raise KeyboardInterrupt

    def _start_watchdog(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        self._previous_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="opcast-stop-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """Wait for the first of our signals, then for the run to end; call ``on_stuck`` if it has not."""
        assert self._pipe is not None
        while True:
            try:
                data = os.read(self._pipe[0], 64)
            except OSError:
                return
            if not data or self._ended.is_set():
                return
            ours = [s for s in data if s in self._previous]
            if ours:
                break
        if not self._ended.wait(self.stuck_after_s):
            self.on_stuck(ours[0])  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup if self._previous_wakeup is not None else -1)
            os.close(self._pipe[1])  # the watchdog's read ends
            if self._thread is not None:
                self._thread.join(timeout=1.0)
            if self._thread is None or not self._thread.is_alive():
                os.close(self._pipe[0])
            self._pipe = None
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def signal_name(signum: int | None) -> str | None:
    """``SIGTERM`` for 15; None for None or 0."""
    return signal.Signals(signum).name if signum else None
