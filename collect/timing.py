"""Timing one op call, done right (after triton's ``do_bench``).

- Warm-up and repetitions are sized by *time budgets*, from a first estimate of one call.
- On CUDA: one pair of events per repetition, an L2-sized buffer zeroed *on the device* before
  each repetition so every call starts with a cold cache, and a single synchronise at the end.
  Ops under ~10 us on the GPU are timed inside a CUDA graph of many back-to-back calls, so launch
  overhead does not swamp them (then the L2 is warm; the method says so). A capture that records no
  kernel (torch warns "The CUDA Graph is empty") is not a timing: such calls are timed with events.
- On CPU: ``time.perf_counter`` around each call, with the same statistics; calls of 50 us and
  more start from a cold cache too (a buffer twice the last-level cache is written between
  repetitions, outside the timing), as their operands are in a training step, where each GEMM
  streams weights the previous ops evicted. Shorter calls are timed warm (the method says so).
- Raw samples are kept and summarised as median, p20 and p80.
- A ``stop`` callable (a signal, the run's deadline) is checked between calls: when it says
  stop, the measurement is abandoned (:class:`Abandoned`) within one call, whatever the budgets.

:func:`measure_neusight` is another protocol, NeuSight's (arXiv 2407.13853; the rule its published
kernel rows were timed with, :mod:`opcast.collect.replay.neusight`): each call alone between two
events, 25 calls, the mean of the fastest 5, no L2 flush, no graph. Its rows carry the host's launch
gap in every short kernel, as NeuSight's do, so they can join NeuSight's in one fit.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from opcast.errors import OpcastError

GRAPH_THRESHOLD_S = 10e-6
"""Kernels faster than this on the GPU are timed in a CUDA graph (launches would dominate their events)."""

GRAPH_PROBE_S = 100e-6
"""Calls whose launch-bound estimate is below this are first timed in a graph, to learn their GPU time.
The estimate (five launches between two events) measures the host's launch rate as much as the kernel:
on an H200 in a virtual machine a 1,024-element ``mul_`` read 27 us a call, so a 10 us rule on it sent
every kernel to events (none of 503 collected rows was timed in a graph)."""

NEUSIGHT_CALLS = 25
"""Calls NeuSight times per shape (its published rows: ``opcast.collect.replay.neusight``)."""
NEUSIGHT_FASTEST = 5
"""NeuSight's latency is the mean of this many fastest calls."""
NEUSIGHT_WARMUP_CALLS = 5
"""Untimed calls before NeuSight's timed ones (ours: NeuSight's published rows do not say)."""
NEUSIGHT_METHOD = "neusight:mean_fastest5"
"""``timing_method`` of rows timed by :func:`measure_neusight` (replayed rows: ``replay:`` + this)."""
PROTOCOLS = ("opcast", "neusight")
"""Timing protocols of ``collect bench --timing``."""


def protocol_of(method: str) -> str:
    """The protocol (:data:`PROTOCOLS`) a row's ``timing_method`` was timed by."""
    return "neusight" if method == NEUSIGHT_METHOD else "opcast"


MAX_POINT_BUDGET_S = 3600.0
"""Most seconds of warm-up, or of repetitions, one point may be given."""


class Abandoned(Exception):
    """The measurement was stopped (a signal, the run's time budget) before it finished."""


def _check_stop(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise Abandoned


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingStats:
    """Summary of the repeated timings of one op call."""

    time_s_median: float
    """Median seconds per call."""
    time_s_p20: float
    """20th percentile, seconds."""
    time_s_p80: float
    """80th percentile, seconds."""
    n_reps: int
    """Timed repetitions (calls, for a CUDA graph: replays x calls per graph)."""
    method: str
    """perf_counter | cuda_event | cuda_graph, or :data:`NEUSIGHT_METHOD` (``time_s_median`` then holds
    the mean of the fastest 5 calls)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimingBudget:
    """How long to warm up and to repeat one measurement."""

    warmup_s: float = 0.025
    """Seconds of warm-up calls."""
    rep_s: float = 0.1
    """Seconds of timed repetitions."""
    min_reps: int = 5
    """Fewest timed repetitions, whatever the budget."""
    max_reps: int = 1000
    """Most timed repetitions."""

    def __post_init__(self) -> None:
        for option, value, lo in (("--warmup-s", self.warmup_s, 0.0), ("--rep-s", self.rep_s, None)):
            if not (
                isinstance(value, (int, float))
                and math.isfinite(value)
                and value <= MAX_POINT_BUDGET_S
                and (value >= lo if lo is not None else value > 0)
            ):
                bound = ">= 0" if lo is not None else "> 0"
                raise OpcastError(
                    f"{option} takes seconds per point, {bound} and at most {MAX_POINT_BUDGET_S:.0f}; got {value}"
                )
        if not 1 <= self.min_reps <= self.max_reps:
            raise OpcastError(f"timing needs 1 <= min_reps <= max_reps, got {self.min_reps} and {self.max_reps}")


def summarise(samples_s: list[float], method: str, calls_per_sample: int = 1) -> TimingStats:
    """Median and p20/p80 of per-sample seconds (divided by the calls each sample holds)."""
    per_call = sorted(s / calls_per_sample for s in samples_s)
    if len(per_call) == 1:
        q20 = q80 = per_call[0]
    else:
        cuts = statistics.quantiles(per_call, n=10, method="inclusive")
        q20, q80 = cuts[1], cuts[7]
    return TimingStats(
        time_s_median=statistics.median(per_call),
        time_s_p20=q20,
        time_s_p80=q80,
        n_reps=len(per_call) * calls_per_sample,
        method=method,
    )


def _rep_count(estimate_s: float, budget_s: float, budget: TimingBudget) -> int:
    return int(min(budget.max_reps, max(budget.min_reps, budget_s / max(estimate_s, 1e-9))))


CPU_FLUSH_MIN_S = 50e-6
"""CPU calls at least this long are timed from a cold cache."""


@functools.lru_cache(maxsize=1)
def _flush_buffer(flush_bytes: int):
    """The process's cache-flush buffer: a fresh one per measured point paid its page faults (2x
    the last-level cache, 64 MiB here) every point, outside the timing but inside the collect budget."""
    import numpy as np

    return np.empty(max(1, flush_bytes // 8))


def measure_cpu(
    fn: Callable[[], object],
    budget: TimingBudget = TimingBudget(),
    *,
    flush_bytes: int = 0,
    stop: Callable[[], bool] | None = None,
) -> TimingStats:
    """Time ``fn`` on the CPU with ``perf_counter``; with ``flush_bytes``, calls of
    :data:`CPU_FLUSH_MIN_S` or more each start after ``flush_bytes`` were written (cold caches).
    Raises :class:`Abandoned` as soon as ``stop()`` is true between two calls."""
    t0 = time.perf_counter()
    fn()  # first call: allocations, lazy initialisation
    first = time.perf_counter() - t0
    deadline = time.perf_counter() + budget.warmup_s
    while time.perf_counter() < deadline:
        _check_stop(stop)
        fn()
    _check_stop(stop)
    t0 = time.perf_counter()
    fn()
    estimate = min(first, time.perf_counter() - t0)
    flush = None
    if flush_bytes > 0 and estimate >= CPU_FLUSH_MIN_S:
        flush = _flush_buffer(flush_bytes)
        t0 = time.perf_counter()
        flush.fill(1.0)
        estimate += time.perf_counter() - t0  # the wall budget pays for the flushes too
    samples = []
    for _ in range(_rep_count(estimate, budget.rep_s, budget)):
        _check_stop(stop)
        if flush is not None:
            flush.fill(1.0)
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summarise(samples, "perf_counter+flush" if flush is not None else "perf_counter")


def measure_cuda(
    fn: Callable[[], object],
    *,
    device,
    l2_bytes: int,
    budget: TimingBudget = TimingBudget(),
    use_graphs: bool = True,
    stop: Callable[[], bool] | None = None,
) -> TimingStats:
    """Time ``fn`` on a CUDA device with events, flushing the L2 between repetitions (``stop`` as
    for :func:`measure_cpu`, checked between launches)."""
    import torch

    fn()
    torch.cuda.synchronize(device)
    flush = torch.empty(max(2 * l2_bytes, 1 << 20), dtype=torch.int8, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    estimate = start.elapsed_time(end) / 5 / 1e3
    _check_stop(stop)
    if use_graphs and estimate < GRAPH_PROBE_S:
        stats = _measure_cuda_graph(fn, device=device, estimate_s=estimate, budget=budget)
        if stats is not None and stats.time_s_median < GRAPH_THRESHOLD_S:
            return stats
    for _ in range(int(min(budget.max_reps, max(1, budget.warmup_s / max(estimate, 1e-9))))):
        _check_stop(stop)
        fn()
    torch.cuda.synchronize(device)
    _check_stop(stop)
    samples = _event_samples(fn, device=device, n=_rep_count(estimate, budget.rep_s, budget), before=flush.zero_)
    return summarise(samples, "cuda_event")


def _event_samples(
    fn: Callable[[], object], *, device, n: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Seconds of ``n`` calls of ``fn``, one event pair each (``before`` runs outside the pair),
    with a single synchronise at the end."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        if before is not None:
            before()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]


def _measure_cuda_graph(
    fn: Callable[[], object], *, device, estimate_s: float, budget: TimingBudget
) -> TimingStats | None:
    """Time ``fn`` as ``calls`` back-to-back calls captured in one CUDA graph; None if capture fails."""
    import torch

    calls = max(10, int(100e-6 / max(estimate_s, 1e-7)))  # ~100 us of work per replay
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
        graph.replay()
        torch.cuda.synchronize(device)
    except Exception:
        return None
    if any("graph is empty" in str(w.message).lower() for w in caught):
        return None  # nothing was captured (the call ran elsewhere): replaying it would time nothing
    samples = _event_samples(graph.replay, device=device, n=_rep_count(estimate_s * calls, budget.rep_s, budget))
    return summarise(samples, "cuda_graph", calls_per_sample=calls)


def measure_neusight(fn: Callable[[], object], *, device=None, stop: Callable[[], bool] | None = None) -> TimingStats:
    """Time ``fn`` by NeuSight's protocol: :data:`NEUSIGHT_WARMUP_CALLS` untimed calls, then
    :data:`NEUSIGHT_CALLS` calls each alone (on CUDA between two events with a synchronise after
    each, elsewhere with ``perf_counter``); ``time_s_median`` is the mean of the
    :data:`NEUSIGHT_FASTEST` fastest, p20/p80 are over all calls. ``stop`` as for :func:`measure_cpu`."""
    cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
    for _ in range(NEUSIGHT_WARMUP_CALLS):
        _check_stop(stop)
        fn()
    samples: list[float] = []
    if cuda:
        import torch

        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(NEUSIGHT_CALLS):
            _check_stop(stop)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(NEUSIGHT_CALLS):
            _check_stop(stop)
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    spread = summarise(samples, NEUSIGHT_METHOD)
    fastest = sorted(samples)[:NEUSIGHT_FASTEST]
    return TimingStats(
        time_s_median=sum(fastest) / len(fastest),
        time_s_p20=spread.time_s_p20,
        time_s_p80=spread.time_s_p80,
        n_reps=len(samples),
        method=NEUSIGHT_METHOD,
    )
