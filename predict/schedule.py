"""Pipeline schedules: the iteration time of 1F1B and interleaved 1F1B, and a timeline for traces.

Analytical time (what predictions use). With ``t_s`` the time stage s spends on one micro-batch
(forward + backward + recompute + its exposed communication), m micro-batches and v model chunks
per stage::

    T_pipeline = m * max_s t_s + (sum_s t_s - max_s t_s) / v

The slowest stage sets the pace of the steady state; the fill and drain add every other stage
once, divided by v under interleaving. For identical stages this is Narayanan et al. 2021 (arXiv
2104.04473, Sec. 2.2): a bubble of ``(p - 1) t`` next to the ideal ``m t``, i.e. ``(p - 1)/m`` of
it for 1F1B and ``(p - 1)/(v m)`` interleaved. For unequal stages and v = 1 it is the critical path
of 1F1B: the first micro-batch's trip through every stage plus ``m - 1`` steady-state slots of the
slowest one.

:func:`simulate` replays Megatron-LM's actual schedule order (``forward_backward_pipelining_*``:
warm-up forwards, one-forward-one-backward steady state, cool-down backwards) task by task with
the p2p dependencies, for the ``--trace`` timeline; for identical stages its makespan equals the
formula above (tests hold the two together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineTime:
    """The pipeline part of one iteration."""

    time_s: float
    """Fill + steady state + drain, seconds."""
    critical_stage: int
    """The slowest stage (first of ties)."""
    steady_s: float
    """m x the slowest stage's per-micro-batch time."""
    bubble_s: float
    """What the fill and drain add on top: (sum - max) / v."""


def pipeline_time(stage_s: Sequence[float], micro_batches: int, virtual_stages: int = 1) -> PipelineTime:
    """Analytical 1F1B / interleaved pipeline time for per-micro-batch stage times ``stage_s``."""
    slowest = max(range(len(stage_s)), key=lambda i: stage_s[i])
    t_max = stage_s[slowest]
    steady = micro_batches * t_max
    bubble = (sum(stage_s) - t_max) / max(1, virtual_stages)
    return PipelineTime(time_s=steady + bubble, critical_stage=slowest, steady_s=steady, bubble_s=bubble)


def bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Narayanan et al. 2021: bubble time / ideal time = (p - 1) / (v m)."""
    return (pp - 1) / (virtual_stages * micro_batches)


# --------------------------------------------------------------------------- simulation (traces)


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One forward or backward of one micro-batch's model chunk on one stage."""

    stage: int
    kind: str
    """F or B."""
    micro_batch: int
    chunk: int
    start_s: float
    end_s: float


def _order(pp: int, stage: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron-LM's task order on ``stage``: (F|B, micro-batch, chunk)."""
    total = m * v
    if v == 1:
        warm = min(pp - stage - 1, m)
    else:
        warm = min(2 * (pp - stage - 1) + (v - 1) * pp, total)

    def fwd(k: int) -> tuple[str, int, int]:
        if v == 1:
            return ("F", k, 0)
        group, pos = divmod(k, pp * v)
        return ("F", group * pp + pos % pp, pos // pp)

    def bwd(k: int) -> tuple[str, int, int]:
        if v == 1:
            return ("B", k, 0)
        group, pos = divmod(k, pp * v)
        return ("B", group * pp + pos % pp, v - 1 - pos // pp)

    order = [fwd(k) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order.append(fwd(f))
        f += 1
        order.append(bwd(b))
        b += 1
    while b < total:
        order.append(bwd(b))
        b += 1
    return order


def simulate(
    fwd_s: Sequence[float], bwd_s: Sequence[float], micro_batches: int, virtual_stages: int = 1, p2p_s: float = 0.0
) -> list[Task]:
    """Timeline of one iteration: per-stage forward / backward times of one micro-batch (all of the
    stage's chunks together), split evenly over its ``virtual_stages`` chunks."""
    pp, v, m = len(fwd_s), max(1, virtual_stages), micro_batches
    orders = [_order(pp, s, m, v) for s in range(pp)]
    done: dict[tuple[str, int, int, int], float] = {}  # (kind, stage, mb, chunk) -> end
    clock = [0.0] * pp
    pos = [0] * pp
    tasks: list[Task] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                kind, mb, chunk = orders[s][pos[s]]
                if kind == "F":
                    prev = ("F", s - 1, mb, chunk) if s > 0 else ("F", pp - 1, mb, chunk - 1) if chunk > 0 else None
                else:
                    prev = (
                        ("B", s + 1, mb, chunk)
                        if s < pp - 1
                        else ("B", 0, mb, chunk + 1)
                        if chunk < v - 1
                        else ("F", s, mb, chunk)
                    )
                if prev is not None and prev not in done:
                    break
                ready = 0.0 if prev is None else done[prev] + (p2p_s if prev[1] != s else 0.0)
                start = max(clock[s], ready)
                end = start + (fwd_s[s] if kind == "F" else bwd_s[s]) / v
                done[(kind, s, mb, chunk)] = end
                clock[s] = end
                tasks.append(Task(stage=s, kind=kind, micro_batch=mb, chunk=chunk, start_s=start, end_s=end))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for a valid schedule
            raise RuntimeError("pipeline simulation deadlocked")
    return tasks
