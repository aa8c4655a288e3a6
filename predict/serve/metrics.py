"""Serving metrics of a simulation, and its timeline as a Perfetto / Chrome trace.

- **TTFT**: first token minus arrival (queueing included); **TPOT**: ``(finish - first token) /
  (output tokens - 1)`` of the requests with more than one output token; **end-to-end** latency:
  finish minus arrival; each at p50, p90, p99 and the mean.
- **Throughput** over the span from the first arrival to the last finish: requests/s and output
  tokens/s.
- **Goodput** (DistServe, Zhong et al. 2024, arXiv 2401.09670): requests/s that meet every SLO
  given (TTFT <= ``slo_ttft_s`` and TPOT <= ``slo_tpot_s``), and the fraction that do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opcast.atomic import write_atomically, write_failure
from opcast.errors import OpcastError
from opcast.predict.serve.simulate import SimResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, kw_only=True, slots=True)
class Distribution:
    """Percentiles and mean of one latency, seconds (None when no request has it)."""

    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    mean_s: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        if len(values) == 0:
            return cls(p50_s=None, p90_s=None, p99_s=None, mean_s=None)
        p = np.percentile(values, PERCENTILES)
        return cls(p50_s=float(p[0]), p90_s=float(p[1]), p99_s=float(p[2]), mean_s=float(values.mean()))


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeMetrics:
    requests: int
    duration_s: float
    """First arrival to last finish."""
    ttft: Distribution
    tpot: Distribution
    e2e: Distribution
    requests_per_s: float
    output_tokens_per_s: float
    preemptions: int
    steps: int
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    goodput_requests_per_s: float | None = None
    """Requests/s meeting every SLO given; None without SLOs."""
    slo_attainment: float | None = None
    """Fraction of requests meeting every SLO given."""
    per_replica_requests: list[int] = field(default_factory=list)
    """Requests each replica served (disaggregated: prefilled on a prefill replica, decoded on a decode one)."""


def request_latencies(sim: SimResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT, TPOT, end-to-end) of every request as its client sees them, seconds (the engine's times plus
    its :attr:`~opcast.predict.serve.engine.EngineConfig.frontend_s`); TPOT is NaN for one-token outputs."""
    s = sim.stream
    ttft = sim.first_token_s - s.arrival_s + sim.engine.frontend_s
    e2e = sim.finish_s - s.arrival_s + sim.engine.frontend_s
    steps = s.output_tokens - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(steps > 0, (sim.finish_s - sim.first_token_s) / np.maximum(steps, 1), np.nan)
    return ttft, tpot, e2e


def serve_metrics(sim: SimResult, *, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> ServeMetrics:
    ttft, tpot, e2e = request_latencies(sim)
    s = sim.stream
    duration = float(sim.finish_s.max() - s.arrival_s.min())
    duration = duration if duration > 0 else float("nan")
    goodput = attained = None
    if slo_ttft_s is not None or slo_tpot_s is not None:
        ok = np.ones(len(s), dtype=bool)
        if slo_ttft_s is not None:
            ok &= ttft <= slo_ttft_s
        if slo_tpot_s is not None:
            ok &= np.isnan(tpot) | (tpot <= slo_tpot_s)
        attained = float(ok.mean())
        goodput = float(ok.sum() / duration)
    return ServeMetrics(
        requests=len(s),
        duration_s=duration,
        ttft=Distribution.of(ttft),
        tpot=Distribution.of(tpot[~np.isnan(tpot)]),
        e2e=Distribution.of(e2e),
        requests_per_s=len(s) / duration,
        output_tokens_per_s=float(s.output_tokens.sum()) / duration,
        preemptions=int(sim.preemptions.sum()),
        steps=len(sim.steps),
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        goodput_requests_per_s=goodput,
        slo_attainment=attained,
        per_replica_requests=_per_replica(sim),
    )


def _per_replica(sim: SimResult) -> list[int]:
    counts = np.bincount(sim.replica, minlength=sim.replicas)
    if sim.decode_replica is not None:
        counts += np.bincount(sim.decode_replica[sim.decode_replica >= 0], minlength=sim.replicas)
    return counts.tolist()


def trace_events(sim: SimResult) -> list[dict]:
    """One complete event (``ph: X``, microseconds) per step on a track per replica."""
    P = sim.prefill_replicas

    def name(r: int) -> str:
        return f"replica {r}" if not P else f"prefill replica {r}" if r < P else f"decode replica {r}"

    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": r, "args": {"name": name(r)}} for r in range(sim.replicas)
    ]
    if sim.transfer_start_s is not None and sim.transfer_end_s is not None and sim.decode_replica is not None:
        for rid in np.flatnonzero(~np.isnan(sim.transfer_start_s)).tolist():  # on the sender's track
            start, end = sim.transfer_start_s[rid], sim.transfer_end_s[rid]
            events.append(
                {
                    "name": "kv transfer",
                    "ph": "X",
                    "pid": int(sim.replica[rid]),
                    "tid": 1,
                    "ts": start * 1e6,
                    "dur": (end - start) * 1e6,
                    "args": {"request": rid, "to_replica": int(sim.decode_replica[rid])},
                }
            )
    for st in sim.steps:
        kind = "mixed" if st.prefill_tokens and st.decode_seqs else "prefill" if st.prefill_tokens else "decode"
        events.append(
            {
                "name": kind,
                "ph": "X",
                "pid": st.replica,
                "tid": 0,
                "ts": st.start_s * 1e6,
                "dur": st.duration_s * 1e6,
                "args": {
                    "prefill_tokens": st.prefill_tokens,
                    "decode_seqs": st.decode_seqs,
                    "seqs": st.seqs,
                    "kv_blocks_used": st.kv_blocks_used,
                    "preempted": st.preempted,
                },
            }
        )
    return events


def write_trace(sim: SimResult, path: Path, *, other: dict | None = None) -> Path:
    """The steps as a Chrome / Perfetto trace JSON (ui.perfetto.dev opens it), written atomically."""
    doc = {"traceEvents": trace_events(sim), "displayTimeUnit": "ms", "otherData": other or {}}
    try:
        return write_atomically(Path(path), lambda tmp: tmp.write_text(json.dumps(doc)))
    except OSError as err:
        raise OpcastError(write_failure("--trace", path, err, "the trace")) from None
