"""How ``opcast predict serve`` shows a result: a JSON document, a rich table and a figure (``--plot``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from opcast.predict.inference import context_note
from opcast.predict.serve.deployment import ServeResult

GIB = 2**30


def serve_notes(r: ServeResult) -> list[str]:
    """What the reader should know beside the numbers: a request longer than the arch's max_position_embeddings
    (:func:`~opcast.predict.inference.context_note`); one batch-wait setting given without the other, which holds
    nothing (:attr:`~opcast.predict.serve.engine.EngineConfig.batch_waits`)."""
    note = context_note(r.arch, r.sim.stream.max_tokens, "the longest request (prompt + output)")
    notes = [] if note is None else [note]
    e = r.engine
    if (e.batch_wait_iters or e.batch_wait_tokens_ratio) and not e.batch_waits:
        notes.append(
            "--batch-wait-iters and --batch-wait-tokens-ratio hold prompts back only together (TensorRT-LLM waits "
            "while both are above 0): with one of them nothing was held"
        )
    return notes


def serve_to_dict(r: ServeResult) -> dict[str, Any]:
    m = r.metrics
    eng = dataclasses.asdict(r.engine)
    notes = serve_notes(r)
    return {
        "arch": r.arch.name,
        "gpu": r.device.name,
        "tp": r.config.tp,
        "pp": r.config.pp,
        "ep": r.config.ep,
        "precision": r.config.precision,
        "replicas": r.replicas,
        "gpus": r.replicas * r.config.tp * r.config.pp,
        "router": r.router,
        "engine": eng,
        "requests_source": r.sim.stream.source,
        "kv_cache": {
            "blocks_per_replica": r.capacity.blocks,
            "tokens_per_replica": r.capacity.tokens,
            "bytes_per_gpu": r.capacity.kv_bytes,
            "kv_bytes_per_token_per_gpu": r.capacity.kv_bytes_per_token,
            "weights_bytes_per_gpu": r.capacity.weights_bytes,
            "activations_bytes_per_gpu": r.capacity.activations_bytes,
        },
        "metrics": dataclasses.asdict(m),
        "cost_sources": list(r.cost_sources),
        **({} if r.disaggregated is None else {"disaggregated": _disagg_to_dict(r)}),
        **({"notes": notes} if notes else {}),
    }


def _disagg_to_dict(r: ServeResult) -> dict[str, Any]:
    d = r.disaggregated
    assert d is not None
    return {
        "prefill_replicas": d.prefill.replicas,
        "decode_replicas": d.decode.replicas,
        "gpus_per_node": d.gpus_per_node,
        "pools": {"prefill": dataclasses.asdict(d.prefill), "decode": dataclasses.asdict(d.decode)},
        "kv_transfer": {
            "transfers": d.transfers,
            "within_node": d.transfers_within_node,
            "kv_bytes_per_token_per_gpu": d.kv_bytes_per_token_per_gpu,
            "bytes_per_gpu": d.transfer_bytes_per_gpu,
            "time": dataclasses.asdict(d.transfer),
            "handoff": dataclasses.asdict(d.handoff),
        },
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _ms3(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3g}"


def _ep(cfg) -> str:
    """`` ep=N`` of an expert-parallel configuration, else nothing."""
    return f" ep={cfg.ep}" if cfg.ep > 1 else ""


def print_serve(r: ServeResult, console) -> None:
    m = r.metrics
    e = r.engine
    dis = r.disaggregated
    pools = "" if dis is None else f" ({dis.prefill.replicas} prefill + {dis.decode.replicas} decode)"
    console.print(
        f"{r.arch.name} on {r.replicas}{pools} x {r.config.tp * r.config.pp} {r.device.name} "
        f"(tp={r.config.tp} pp={r.config.pp}{_ep(r.config)}, {r.config.precision}), {e.engine}: "
        f"max_num_seqs {e.max_num_seqs}, "
        f"max_num_batched_tokens {e.max_num_batched_tokens}, chunked prefill {'on' if e.chunked_prefill else 'off'}, "
        + (
            f"batch waiting {e.batch_wait_iters} steps / {e.batch_wait_tokens_ratio:g} of the tokens, "
            if e.batch_waits
            else ""
        )
        + f"KV {r.capacity.tokens:,} tokens per replica ({r.capacity.kv_bytes / GIB:.1f} GiB per GPU)",
        markup=False,
        highlight=False,
    )
    console.print(f"requests: {r.sim.stream.source}", markup=False, highlight=False)
    table = Table(show_lines=False)
    for col in ("latency, ms", "p50", "p90", "p99", "mean"):
        table.add_column(col, justify="right" if col != "latency, ms" else "left")
    for name, d in (("TTFT", m.ttft), ("TPOT", m.tpot), ("end-to-end", m.e2e)):
        table.add_row(name, _ms(d.p50_s), _ms(d.p90_s), _ms(d.p99_s), _ms(d.mean_s))
    console.print(table)
    line = (
        f"throughput {m.requests_per_s:.2f} req/s, {m.output_tokens_per_s:,.0f} output tokens/s over "
        f"{m.duration_s:.1f} s; {m.steps:,} steps, {m.preemptions} preemptions"
    )
    if m.goodput_requests_per_s is not None:
        slos = ", ".join(
            f"{k} <= {v * 1e3:g} ms" for k, v in (("TTFT", m.slo_ttft_s), ("TPOT", m.slo_tpot_s)) if v is not None
        )
        line += f"; goodput {m.goodput_requests_per_s:.2f} req/s ({m.slo_attainment:.1%} meet {slos})"
    console.print(line, markup=False, highlight=False)
    if dis is not None:
        console.print(
            f"KV transfer p50 {_ms3(dis.transfer.p50_s)} ms, p99 {_ms3(dis.transfer.p99_s)} ms "
            f"({dis.transfers_within_node} of {dis.transfers} within a node; first token to KV landed p99 "
            f"{_ms3(dis.handoff.p99_s)} ms); busy: prefill pool {dis.prefill.busy_fraction:.0%}, "
            f"decode pool {dis.decode.busy_fraction:.0%}",
            markup=False,
            highlight=False,
        )
    console.print(
        f"step overhead {e.overhead.fixed_s * 1e6:.0f} us + {e.overhead.per_seq_s * 1e6:g} us/seq: "
        f"{e.overhead.source}; "
        + (
            f"TTFT and end-to-end include the API front end, {e.frontend_s * 1e3:.1f} ms a request; "
            if e.frontend_s
            else ""
        )
        + f"kernel times: {', '.join(r.cost_sources)}",
        markup=False,
        highlight=False,
        style="dim",
    )
    for note in serve_notes(r):
        console.print(f"  note: {note}", markup=False, highlight=False)


# --------------------------------------------------------------------------- plot

MAX_REPLICA_LINES = 4
"""Up to this many replicas the load panels draw one line per replica, step by step; beyond it, one line per
pool (all replicas, or the prefill and decode pools) of their sum, averaged over :data:`LOAD_BINS` bins."""
LOAD_BINS = 400


def write_plot(r: ServeResult, path: str | Path) -> Path:
    """The serving figure of ``--plot`` (needs matplotlib, an optional extra): on the left the CDFs of TTFT,
    TPOT and end-to-end latency as the client sees them (p50/p90/p99 marked, the SLOs drawn); on the right,
    over simulated time, requests arrived, given a first token and finished (cumulative: the gap between the
    first two is the queue), running sequences and tokens per step, and KV-cache blocks in use."""
    from opcast.plotting import pyplot, save_figure
    from opcast.predict.serve.metrics import request_latencies

    plt = pyplot()
    sim, m = r.sim, r.metrics
    ttft, tpot, e2e = request_latencies(sim)
    fig = plt.figure(figsize=(13, 10))
    grid = fig.add_gridspec(12, 2)
    left = [fig.add_subplot(grid[4 * i : 4 * i + 4, 0]) for i in range(3)]
    right = [fig.add_subplot(grid[3 * i : 3 * i + 3, 1]) for i in range(4)]
    for ax in right[1:]:
        ax.sharex(right[0])
    _cdf(left[0], ttft, m.ttft, "TTFT", m.slo_ttft_s)
    _cdf(left[1], tpot[~np.isnan(tpot)], m.tpot, "TPOT", m.slo_tpot_s)
    _cdf(left[2], e2e, m.e2e, "end-to-end latency", None)
    _counts(right[0], sim)
    e = r.engine
    cols = np.array(  # one pass over the steps: replica, start, end, sequences, tokens, KV blocks
        [
            (
                st.replica,
                st.start_s,
                st.start_s + st.duration_s,
                st.seqs,
                st.prefill_tokens + st.decode_seqs,
                st.kv_blocks_used,
            )
            for st in sim.steps
        ],
        dtype=float,
    ).reshape(-1, 6)
    when = (cols[:, 0].astype(np.int64), cols[:, 1], cols[:, 2])
    limit = e.max_num_seqs
    _load(
        right[1],
        sim,
        when,
        cols[:, 3],
        "running sequences per step",
        limit=limit,
        limit_label=f"max_num_seqs {limit:,}",
    )
    limit = e.max_num_batched_tokens
    label = f"max_num_batched_tokens {limit:,}"
    _load(right[2], sim, when, cols[:, 4], "tokens per step", limit=limit, limit_label=label)
    label = f"full: {sim.kv_blocks:,} blocks a replica"
    kv = 100 * cols[:, 5] / sim.kv_blocks
    _load(right[3], sim, when, kv, "KV blocks in use, % of the cache", limit=100.0, limit_label=label, share=True)
    right[3].set_xlabel("simulated time, s")
    dis = r.disaggregated
    pools = "" if dis is None else f" ({dis.prefill.replicas} prefill + {dis.decode.replicas} decode)"
    fig.suptitle(
        f"{r.arch.name} on {r.replicas}{pools} x {r.config.tp * r.config.pp} {r.device.name}, {e.engine}: "
        f"{m.requests:,} requests, {m.requests_per_s:.2f} req/s, {m.output_tokens_per_s:,.0f} output tokens/s",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path)


def _cdf(ax, values, d, name: str, slo_s: float | None) -> None:
    """The empirical CDF of ``values`` (seconds, drawn in ms), its percentiles ``d`` marked and the SLO drawn."""
    ax.set_title(name, fontsize=9)
    ax.set_ylabel("fraction of requests")
    ax.set_xlabel("ms")
    if len(values) == 0:
        ax.text(0.5, 0.5, "no request has more than one output token", ha="center", transform=ax.transAxes)
        return
    x = np.sort(values) * 1e3
    ax.plot(x, np.arange(1, len(x) + 1) / len(x), drawstyle="steps-post", color="C0")
    for q, v in ((0.5, d.p50_s), (0.9, d.p90_s), (0.99, d.p99_s)):
        ms = v * 1e3
        ax.plot([ms], [q], "o", color="C1", markersize=4)
        ax.annotate(
            f" p{round(q * 100)} {ms:,.0f}" if ms >= 100 else f" p{round(q * 100)} {ms:.3g}",
            (ms, q),
            fontsize=7,
            va="top",
        )
    if slo_s is not None:
        meet = float(np.mean(values <= slo_s))
        ax.axvline(slo_s * 1e3, color="C3", linestyle="--", label=f"SLO {slo_s * 1e3:g} ms ({meet:.1%} meet it)")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)


def _counts(ax, sim) -> None:
    """Cumulative arrivals, first tokens and completions at the engine: the gaps are requests waiting."""
    n = len(sim.stream)
    y = np.arange(1, n + 1)
    for label, t in (
        ("arrived", sim.stream.arrival_s),
        ("first token", sim.first_token_s),
        ("finished", sim.finish_s),
    ):
        ax.plot(np.sort(t), y, drawstyle="steps-post", label=label)
    ax.set_title("requests over time (cumulative, engine times)", fontsize=9)
    ax.set_ylabel("requests")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)


def _load(
    ax,
    sim,
    when: tuple[np.ndarray, np.ndarray, np.ndarray],
    v: np.ndarray,
    title: str,
    *,
    limit: float,
    limit_label: str,
    share: bool = False,
) -> None:
    """``v``, one value of every step (``when``: its replica, start and end), over time: per replica (step by
    step) up to :data:`MAX_REPLICA_LINES` replicas, else per pool its replicas' sum (``share``: their mean),
    averaged over :data:`LOAD_BINS` bins of time; an idle replica counts 0 (its KV: every request it held is
    done, or, on a prefill replica, sent but for the microseconds of a transfer). ``limit``: a replica's
    limit, drawn per replica and for a share."""
    P = sim.prefill_replicas
    replica, start, end = when
    if sim.replicas <= MAX_REPLICA_LINES:
        for rep in range(sim.replicas):
            on = replica == rep
            name = f"replica {rep}" if not P else f"prefill replica {rep}" if rep < P else f"decode replica {rep}"
            s, e = start[on], end[on]
            idle = np.append(s[1:] > e[:-1], True)  # steps followed by idle time (the next starts later), and the last
            at = np.flatnonzero(idle) + 1
            x, y = np.insert(s, at, e[idle]), np.insert(v[on], at, 0.0)  # each step's value; 0 while idle
            ax.plot(x, y, drawstyle="steps-post", linewidth=0.8, label=name)
        ax.set_title(f"{title}, per replica", fontsize=9)
        _limit(ax, limit, limit_label, top=float(v.max()))
    else:
        pools = [(0, sim.replicas, "all")] if not P else [(0, P, "prefill pool"), (P, sim.replicas, "decode pool")]
        edges = np.linspace(float(start.min()), float(end.max()), LOAD_BINS + 1)
        width = float(edges[1] - edges[0])
        top, how = 0.0, "mean" if share else "sum"
        for lo, hi, name in pools:
            on = (replica >= lo) & (replica < hi)
            mean = np.diff(_integral(edges, start[on], end[on], v[on])) / width / (hi - lo if share else 1)
            top = max(top, float(mean.max()))
            ax.stairs(mean, edges, linewidth=0.8, label=f"{name}, {how} of {hi - lo} replicas")
        ax.set_title(f"{title}, {how} over replicas, time-mean per {width * 1e3:.3g} ms", fontsize=9)
        if share:
            _limit(ax, limit, limit_label, top=top)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)


def _limit(ax, limit: float, label: str, *, top: float) -> None:
    """A dotted line at ``limit`` when the data reach near it (``top``: their highest), else the limit in the
    legend only, so a batch of 4 is not drawn flat under a limit of 1024."""
    if limit <= 1.5 * top:
        ax.axhline(limit, color="black", linestyle=":", linewidth=0.8, label=label)
    else:
        ax.plot([], [], color="black", linestyle=":", linewidth=0.8, label=f"{label} (off the scale)")
    ax.set_ylim(bottom=0)


def _integral(edges, start, end, value):
    """``F(t)`` at each edge: the integral up to ``t`` of the sum of ``value[i]`` over the steps ``[start[i],
    end[i])`` in progress, ``sum_i value[i] * clip(t - start[i], 0, end[i] - start[i])``, by prefix sums."""

    def ramp(points):
        order = np.argsort(points)
        p, w = points[order], value[order]
        k = np.searchsorted(p, edges, side="right")
        cw = np.concatenate(([0.0], np.cumsum(w)))
        cwp = np.concatenate(([0.0], np.cumsum(w * p)))
        return edges * cw[k] - cwp[k]  # sum over points <= t of w * (t - p)

    return ramp(start) - ramp(end)
