"""``collect comm``'s last barrier after a signal: a peer that a second signal sent away already (it leaves the
lock-step at once) has closed its connection, and the barrier's failure is the interruption, not a bug. The race
behind a flaky two-rank Ctrl-C test (tests/integration/test_collect_comm_signals.py), made deterministic here with
``torch.distributed``'s calls replaced in-process."""

from __future__ import annotations

import json
import signal

import pytest
import torch
import torch.distributed as dist

from opcast.collect.comm import CommConfig, _Ending, _measure
from opcast.collect.signals import StopSignals
from opcast.errors import OpcastError


def _run(tmp_path, monkeypatch, *, signal_at: int | None):
    """Rank 0 of two on the CPU, every all-reduce a no-op (the peer agrees), the ``signal_at``-th one
    bringing SIGINT, and the final barrier failing as gloo does when the peer has gone."""
    flag = StopSignals()
    calls = {"n": 0}

    def all_reduce(tensor, op=None):
        calls["n"] += 1
        if signal_at is not None and calls["n"] == signal_at:
            flag.signum = signal.SIGINT
        return None

    def barrier():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1234: Connection reset by peer")

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "barrier", barrier)
    cfg = CommConfig(out=tmp_path / "d", ops=("all_reduce",), min_bytes=4, max_bytes=64, warmup_iters=0, iters=3)
    setup = {"device": "cpu-test", "done": set(), "run_id": "r1"}
    (tmp_path / "d" / "comm").mkdir(parents=True)
    return _measure(
        cfg,
        [4, 8, 16, 32, 64],
        torch.float32,
        torch.device("cpu"),
        flag,
        _Ending(),
        setup,
        rank=0,
        world=2,
        nodes=1,
        per_node=2,
        progress=None,
    )


def test_a_peer_gone_at_the_last_barrier_after_a_signal_is_the_interruption(tmp_path, monkeypatch):
    # agreements: size 4's, its three iterations' and its rows' max (5 calls), size 8's; the 7th brings the signal
    result = _run(tmp_path, monkeypatch, signal_at=7)
    assert result.signal == "SIGINT" and result.interrupted
    assert result.rows_written == 1  # size 4 measured and written; size 8 is measured again on resume
    (run,) = json.loads((tmp_path / "d" / "run.json").read_text())["runs"]
    assert run["signal"] == "SIGINT" and run["rows_written"] == 1 and run["interrupted"]


def test_a_peer_gone_at_the_last_barrier_without_a_signal_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(OpcastError, match=r"a collective failed .*another rank has stopped or died"):
        _run(tmp_path, monkeypatch, signal_at=None)
