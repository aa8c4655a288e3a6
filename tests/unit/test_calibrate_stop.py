"""The hard bound calibrate puts on each stage: a fresh process past its timeout is stopped and
reported as overrun (real child processes; the only time taken is the child's start-up)."""

from __future__ import annotations

import math
import time

import pytest

from opcast.check.isolated import Overran, in_fresh_process


def test_a_child_within_its_timeout_returns_its_result():
    assert in_fresh_process(math.sqrt, 4.0, timeout_s=120) == 2.0


@pytest.mark.parametrize("forward_sigint", [False, True])
def test_a_child_past_its_timeout_is_stopped(forward_sigint):
    """SIGTERM (a child with no handler), or SIGINT first (collect bench's way to finish a point):
    either way the parent gets Overran long before the child's 600 s sleep would end."""
    t0 = time.monotonic()
    with pytest.raises(Overran) as err:
        in_fresh_process(time.sleep, 600, forward_sigint=forward_sigint, timeout_s=0.5, grace_s=5.0)
    assert err.value.timeout_s == 0.5 and err.value.value is None
    assert time.monotonic() - t0 < 300


@pytest.mark.parametrize("forward_sigint", [False, True])
def test_sigterm_to_the_parent_stops_the_child_too(forward_sigint):
    """SIGTERM to calibrate killed it and left the stage's child running (a collection measured on,
    holding its lock, then printed a BrokenPipeError traceback): now the child is stopped (passed
    the SIGTERM with ``forward_sigint``) and the parent sees an interrupt, not 'the measuring process died'."""
    import multiprocessing
    import os
    import signal
    import threading

    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            in_fresh_process(time.sleep, 600, forward_sigint=forward_sigint, timeout_s=300)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 120
    assert multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGTERM) == before  # the parent's own handling is back
