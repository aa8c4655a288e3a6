"""How ``opcast predict serve`` shows a result: a JSON document and a rich table."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.table import Table

from opcast.predict.serve.deployment import ServeResult

GIB = 2**30


def serve_to_dict(r: ServeResult) -> dict[str, Any]:
    m = r.metrics
    eng = dataclasses.asdict(r.engine)
    return {
        "arch": r.arch.name,
        "gpu": r.device.name,
        "tp": r.config.tp,
        "pp": r.config.pp,
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


def print_serve(r: ServeResult, console) -> None:
    m = r.metrics
    e = r.engine
    dis = r.disaggregated
    pools = "" if dis is None else f" ({dis.prefill.replicas} prefill + {dis.decode.replicas} decode)"
    console.print(
        f"{r.arch.name} on {r.replicas}{pools} x {r.config.tp * r.config.pp} {r.device.name} "
        f"(tp={r.config.tp} pp={r.config.pp}, {r.config.precision}), {e.engine}: max_num_seqs {e.max_num_seqs}, "
        f"max_num_batched_tokens {e.max_num_batched_tokens}, chunked prefill {'on' if e.chunked_prefill else 'off'}, "
        f"KV {r.capacity.tokens:,} tokens per replica ({r.capacity.kv_bytes / GIB:.1f} GiB per GPU)",
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
