"""Timing statistics and the CPU timer."""

from __future__ import annotations

import time

import pytest

from opcast.collect.timing import TimingBudget, measure_cpu, summarise


def test_summarise_quantiles_by_hand():
    s = summarise([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], "perf_counter")
    assert s.time_s_median == 6.0
    assert s.time_s_p20 == pytest.approx(3.0) and s.time_s_p80 == pytest.approx(9.0)
    assert s.n_reps == 11 and s.method == "perf_counter"
    g = summarise([10.0, 20.0, 30.0], "cuda_graph", calls_per_sample=10)
    assert g.time_s_median == 2.0 and g.n_reps == 30


def test_measure_cpu_respects_budget_and_measures_real_time():
    budget = TimingBudget(warmup_s=0.0, rep_s=0.02, min_reps=3, max_reps=50)
    stats = measure_cpu(lambda: time.sleep(0.002), budget)
    assert stats.time_s_median >= 0.002
    assert 3 <= stats.n_reps <= 50
    assert stats.time_s_p20 <= stats.time_s_median <= stats.time_s_p80


def test_cpu_calls_of_50us_and_more_start_cold_shorter_ones_warm():
    import time as _time

    from opcast.collect.timing import TimingBudget, measure_cpu

    budget = TimingBudget(warmup_s=0.0, rep_s=0.002, min_reps=3, max_reps=5)
    slow = measure_cpu(lambda: _time.sleep(1e-4), budget, flush_bytes=256 << 20)  # ~30+ ms to write
    fast = measure_cpu(lambda: None, budget, flush_bytes=1 << 20)
    plain = measure_cpu(lambda: _time.sleep(1e-4), budget)
    assert slow.method == "perf_counter+flush" and fast.method == "perf_counter" and plain.method == "perf_counter"
    assert 1e-4 <= slow.time_s_median < 0.01  # the flush stays outside the timed region


class _FakeCudaTorch:
    """Just enough of torch for measure_cuda: a GPU clock that a launch-bound call advances by ``host_s``
    (events around it see the host's launch rate) and a graph replay by ``kernel_s`` a captured call."""

    int8 = "int8"

    def __init__(self, host_s: float, kernel_s: float, empty_capture: bool = False) -> None:
        import contextlib
        import types
        import warnings

        self.host_s, self.kernel_s, self.empty_capture = host_s, kernel_s, empty_capture
        self.clock, self.capturing, self.captured = 0.0, False, 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = 0.0

            def record(self) -> None:
                self.t = fake.clock

            def elapsed_time(self, other: Event) -> float:
                return (other.t - self.t) * 1e3

        class Stream:
            def __init__(self, device=None) -> None:
                pass

            def wait_stream(self, other) -> None:
                pass

        class CUDAGraph:
            def replay(self) -> None:
                fake.clock += fake.captured * fake.kernel_s

        @contextlib.contextmanager
        def graph(g):
            fake.capturing, fake.captured = True, 0
            yield
            fake.capturing = False
            if fake.captured == 0:
                warnings.warn("The CUDA Graph is empty. This usually means ...", UserWarning, stacklevel=2)

        self.cuda = types.SimpleNamespace(
            Event=Event,
            Stream=Stream,
            CUDAGraph=CUDAGraph,
            graph=graph,
            current_stream=lambda device=None: Stream(),
            stream=lambda s: contextlib.nullcontext(),
            synchronize=lambda device=None: None,
        )

    def empty(self, n, dtype=None, device=None):
        import types

        return types.SimpleNamespace(zero_=lambda: None)

    def call(self) -> None:
        if not self.capturing:
            self.clock += self.host_s
        elif not self.empty_capture:
            self.captured += 1


@pytest.mark.parametrize(
    ("host_s", "kernel_s", "empty", "method", "median_s"),
    [
        (27e-6, 3e-6, False, "cuda_graph", 3e-6),  # launch-bound events; the graph shows a 3 us kernel
        (27e-6, 20e-6, False, "cuda_event", 27e-6),  # the graph shows 20 us: long enough for events
        (27e-6, 3e-6, True, "cuda_event", 27e-6),  # nothing captured: an empty replay times nothing
        (300e-6, 3e-6, False, "cuda_event", 300e-6),  # far above the probe: no graph is tried
    ],
)
def test_cuda_graphs_are_chosen_by_the_kernels_gpu_time(monkeypatch, host_s, kernel_s, empty, method, median_s):
    # On an H200 in a virtual machine five launches between two events read 27 us a call for a ~3 us
    # kernel, so a rule on that estimate never used a graph (503 of 503 collected rows were events).
    import sys

    from opcast.collect.timing import measure_cuda

    fake = _FakeCudaTorch(host_s, kernel_s, empty)
    monkeypatch.setitem(sys.modules, "torch", fake)
    stats = measure_cuda(fake.call, device=None, l2_bytes=0, budget=TimingBudget(warmup_s=0.001, rep_s=0.005))
    assert stats.method == method
    assert stats.time_s_median == pytest.approx(median_s, rel=1e-6)


def test_neusight_protocol_is_the_mean_of_the_fastest_five_of_25(monkeypatch):
    """NeuSight's rule on a scripted clock: 5 untimed calls, then 25 timed ones, each alone; the latency
    is the mean of the 5 fastest (here 1..5 ms, so 3 ms), whatever the slow ones did."""
    from opcast.collect import timing

    durations = [0.5] * timing.NEUSIGHT_WARMUP_CALLS + [0.001 * d for d in (9, 3, 7, 1, 25, 4, 8, 2, 6, 5)] + [0.1] * 15
    now = [0.0]
    calls = []

    def fn():
        calls.append(now[0])
        now[0] += durations[len(calls) - 1]

    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    stats = timing.measure_neusight(fn)
    assert len(calls) == timing.NEUSIGHT_WARMUP_CALLS + timing.NEUSIGHT_CALLS == 30
    assert stats.time_s_median == pytest.approx(0.003)
    assert stats.n_reps == 25 and stats.method == "neusight:mean_fastest5"
    assert stats.time_s_p20 == pytest.approx(0.0058) and stats.time_s_p80 == pytest.approx(0.1)
