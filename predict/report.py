"""Results as JSON, rich summaries, Chrome/Perfetto traces and breakdown charts.

Every op line carries its roofline bottleneck on the device (:func:`opcast.predict.cost.bottleneck`:
compute- or memory-bound, arithmetic intensity against the ridge point, the fraction of the peak
and of the memory bandwidth its predicted time achieves) and, given the kernel cost model that
priced it, whether a learned model extrapolated beyond the hardware it was fitted on
(``out_of_range``). The inference document lists the decode-phase GEMMs' intensity against the
ridge point; both documents split the headline time into compute-bound, memory-bound,
communication and bubble seconds (:func:`opcast.predict.whatif.time_split`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.markup import escape

from opcast.errors import OpcastError
from opcast.plotting import pyplot, save_figure
from opcast.predict.cost import Kernel, KernelCostModel, bottleneck
from opcast.predict.inference import InferResult
from opcast.predict.training import BREAKDOWN_KEYS, TrainResult

GIB = 2**30


def _kernel_dict(k) -> dict[str, Any]:
    return {"kind": k.kind, "params": dict(k.params), "dtype": k.dtype, "direction": k.direction,
            "tensor_cores": k.tensor_cores}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def op_bottleneck(k: Kernel, time_s: float, device, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The per-op bottleneck keys of the JSON documents."""
    b = bottleneck(k, device, time_s, kernels.roofline if kernels is not None else None)
    return {"roofline_bound": b.bound, "arithmetic_intensity_flop_per_byte": _finite(b.intensity),
            "ridge_flop_per_byte": b.ridge, "compute_utilisation": b.compute_utilisation,
            "memory_bw_utilisation": b.memory_utilisation,
            "out_of_range": kernels.range_flag(k, device) if kernels is not None else None}


def _split_dict(r: TrainResult | InferResult, kernels: KernelCostModel | None) -> dict[str, Any]:
    from opcast.predict.whatif import SPLIT_PARTS, time_split

    split = time_split(r, kernels)
    return {"time_split_s": {p: getattr(split, f"{p}_s") for p in SPLIT_PARTS},
            "time_split_definition": "headline time by what bounds it: kernels on the compute or memory side of the "
                                     "achievable roofline, exposed communication, pipeline bubble (sums to the total)",
            "time_by_phase_s": split.by_phase}


def _range_summary(sources: dict[str, Any], flagged: int) -> dict[str, Any]:
    out = dict(sources)
    out["learned_out_of_range_kernels"] = flagged
    return out


def train_to_dict(r: TrainResult, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The ``--json`` document of a training prediction (infeasible ones carry ``reasons``);
    ``kernels``, the cost model that priced it, adds the learned models' range flags."""
    out: dict[str, Any] = {"arch": r.arch.name, "gpu": r.device.name, "config": asdict(r.config),
                           "feasible": r.feasible, "reasons": list(r.reasons)}
    if r.layout is None:
        return out
    lay = r.layout
    out["config"].update(dp=lay.dp, world_size=lay.world_size, nodes=lay.cluster.nodes,
                         gpus_per_node=lay.cluster.gpus_per_node, micro_batches=lay.micro_batches)
    worst = r.worst_memory
    out.update({
        "iteration_time_s": r.iteration_time_s, "iteration_time_interval_s": list(r.iteration_time_interval_s or []) or None,
        "interval": r.interval.to_dict() if r.interval is not None else
        {"assumption": "no interval: no learned kernel with held-out residuals on the critical path"},
        "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "hfu": r.hfu,
        "model_flops_per_iteration": r.model_flops,
        "mfu_definition": "op-graph FLOPs (forward + backward, no recomputation) / (iteration time x world size x dense peak)",
        "memory_per_gpu_bytes": worst.total_bytes, "memory_breakdown_bytes": worst.breakdown(),
        "memory_worst_stage": worst.stage, "gpu_memory_bytes": r.device.mem_bytes, "fits": r.fits,
        "memory_overflow_bytes": max(0.0, worst.total_bytes - r.device.mem_bytes),
        "memory_per_stage_bytes": [m.total_bytes for m in r.memory],
        "breakdown_s": {k: r.breakdown_s[k] for k in BREAKDOWN_KEYS},
        "stages": [asdict(st) | {"per_micro_batch_s": st.per_micro_batch_s} for st in r.stages],
        "ops": [{"stage": o.stage, "phase": o.phase, "role": o.role, **_kernel_dict(o.kernel), "count": o.count,
                 "time_s": o.time_s, "total_s": o.count * o.time_s, "source": o.source,
                 **op_bottleneck(o.kernel, o.time_s, r.device, kernels)} for o in r.ops],
        "collectives": [{"stage": c.stage, "phase": c.phase, "role": c.role, "kind": c.call.kind, "bytes": c.call.bytes,
                         "group": {"size": c.call.group.size, "nodes": c.call.group.nodes, "per_node": c.call.group.per_node},
                         "count": c.count, "time_s": c.time_s, "exposed_s": c.exposed_s, "source": c.source}
                        for c in r.comms],
        "cost_sources": _range_summary(r.cost_sources, _flagged(r.device, kernels, (o.kernel for o in r.ops))),
    })
    if r.ops:
        out.update(_split_dict(r, kernels))
    if r.config.pp > 2:
        out["ops_note"] = f"ops and collectives list stages 0, 1 and {r.config.pp - 1}; stages 2..{r.config.pp - 2} repeat stage 1"
    return out


def _flagged(device, kernels: KernelCostModel | None, ks) -> int:
    if kernels is None:
        return 0
    return sum(1 for k in set(ks) if kernels.range_flag(k, device))


def infer_kernel(r: InferResult, line: dict[str, Any]) -> Kernel:
    """The kernel of one of an inference result's op lines."""
    from opcast.predict.graph import precision_of

    return precision_of(r.config.precision, r.config.tensor_cores).of(line["kind"], line["params"], line["direction"])


def decode_gemms(r: InferResult, kernels: KernelCostModel | None = None) -> list[dict[str, Any]]:
    """The GEMMs of one decode step (the median sampled step) with their arithmetic intensity
    against the device's ridge point: at small batches they sit far left of it, memory-bound."""
    out = []
    for line in r.ops:
        if line["phase"] != "decode" or line["kind"] != "gemm":
            continue
        k = infer_kernel(r, line)
        p = line["params"]
        out.append({"role": line["role"], "b": p["b"], "m": p["m"], "n": p["n"], "k": p["k"], "dtype": line["dtype"],
                    "count": line["count"], "time_s": line["time_s"], "source": line["source"],
                    **op_bottleneck(k, line["time_s"], r.device, kernels)})
    return out


def infer_to_dict(r: InferResult, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The ``--json`` document of an inference prediction; ``kernels`` adds the range flags."""
    out: dict[str, Any] = {"arch": r.arch.name, "gpu": r.device.name, "config": asdict(r.config),
                           "feasible": r.feasible, "reasons": list(r.reasons)}
    if r.memory is None:
        return out
    kerns = [infer_kernel(r, line) for line in r.ops]
    out.update({
        "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "total_latency_s": r.total_latency_s, "tokens_per_s": r.tokens_per_s,
        "kv_cache_bytes": r.kv_cache_bytes, "memory_per_gpu_bytes": r.memory.total_bytes,
        "memory_breakdown_bytes": r.memory.breakdown(), "gpu_memory_bytes": r.device.mem_bytes, "fits": r.fits,
        "breakdown_s": r.breakdown_s,
        "ops": [{**line, **op_bottleneck(k, line["time_s"], r.device, kernels)} for line, k in zip(r.ops, kerns)],
        "decode_gemms": decode_gemms(r, kernels),
        "cost_sources": _range_summary(r.cost_sources, _flagged(r.device, kernels, kerns)),
    })
    if r.ops:
        out.update(_split_dict(r, kernels))
    if r.cluster is not None:
        out["config"].update(nodes=r.cluster.nodes, gpus_per_node=r.cluster.gpus_per_node)
    return out


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=float)


# --------------------------------------------------------------------------- rich

def _fmt_s(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"


def _split_line(r: TrainResult | InferResult, kernels: KernelCostModel | None) -> str:
    from opcast.predict.whatif import SPLIT_PARTS, time_split

    split = time_split(r, kernels)
    parts = [f"{p.replace('_', '-')} {100 * split.share(p):.1f} %" for p in SPLIT_PARTS if getattr(split, f"{p}_s") > 0]
    return "time by bottleneck: " + ", ".join(parts)


def _range_lines(console, device, kernels: KernelCostModel | None, ks) -> None:
    """The learned kernels outside the shapes or hardware they were fitted on: a count and the first reason."""
    if kernels is None:
        return
    reasons = [why for k in dict.fromkeys(ks) if (why := kernels.range_flag(k, device))]
    if reasons:
        console.print(f"  warning: {len(reasons)} kernel time(s) from learned models outside the shapes or hardware they "
                      f"were fitted on, e.g. {reasons[0]}", style="yellow", markup=False, highlight=False)


def print_train(r: TrainResult, console, kernels: KernelCostModel | None = None) -> None:
    from rich.table import Table

    lay, cfg = r.layout, r.config
    assert lay is not None
    console.print(f"[bold]{escape(r.arch.name)}[/] on {lay.world_size} x {escape(r.device.name)} "
                  f"({lay.cluster.nodes} node(s) x {lay.cluster.gpus_per_node}): tp {cfg.tp}, pp {cfg.pp}, dp {lay.dp}, "
                  f"cp {cfg.cp}, ep {cfg.ep}{', sp' if cfg.sp else ''}; micro-batch {cfg.micro_batch} x "
                  f"{lay.micro_batches} per rank, global batch {cfg.global_batch} x {cfg.seq} tokens; "
                  f"recompute {cfg.recompute}, zero {cfg.zero}, {cfg.precision}, {cfg.attention} attention, {cfg.schedule}"
                  + (f" v={cfg.virtual_stages}" if cfg.schedule == "interleaved" else ""))
    span = r.iteration_time_interval_s
    console.print(f"iteration [bold]{_fmt_s(r.iteration_time_s)}[/]" + (escape(f" [{_fmt_s(span[0])}, {_fmt_s(span[1])}]") if span else "")
                  + f"   {r.tokens_per_s:,.0f} tokens/s   MFU [bold]{100 * r.mfu:.1f} %[/] (HFU {100 * r.hfu:.1f} %)")
    if r.interval is not None:
        console.print(f"  interval: {escape(r.interval.assumption())}", style="dim")
    table = Table(title="where the time goes (critical stage; sums to the iteration)")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key in BREAKDOWN_KEYS:
        v = r.breakdown_s[key]
        if v or key in ("forward", "backward"):
            table.add_row(key, f"{v:.4g}", f"{100 * v / r.iteration_time_s:.1f} %")
    console.print(table)
    worst = r.worst_memory
    mem = Table(title=f"memory per GPU (stage {worst.stage}, the fullest): {worst.total_bytes / GIB:.2f} GiB of "
                      f"{r.device.mem_bytes / GIB:.0f} GiB -> {'fits' if r.fits else 'DOES NOT FIT'}")
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for k, v in worst.breakdown().items():
        mem.add_row(k, f"{v / GIB:.3f}")
    console.print(mem)
    if r.ops:
        console.print(_split_line(r, kernels))
    top = sorted(r.ops, key=lambda o: -o.count * o.time_s)[:8]
    ops = Table(title="heaviest kernels (one GPU of the stage, per iteration); bound and utilisation of its peak")
    for col in ("stage", "phase", "role", "kind", "count", "total", "bound", "util", "source"):
        ops.add_column(col)
    for o in top:
        b = op_bottleneck(o.kernel, o.time_s, r.device, kernels)
        util = b["compute_utilisation"] if b["roofline_bound"] == "compute" else b["memory_bw_utilisation"]
        ops.add_row(str(o.stage), o.phase, o.role, o.kernel.kind, f"{o.count:g}", _fmt_s(o.count * o.time_s),
                    b["roofline_bound"], f"{100 * util:.0f} %", o.source + (" (out of range)" if b["out_of_range"] else ""))
    console.print(ops)
    src = r.cost_sources
    console.print(f"kernel costs: {src.get('unique_kernels_by_source')} "
                  f"({src.get('kernel_models') or 'no learned models'}); collectives: {src.get('collectives_by_source')}")
    _range_lines(console, r.device, kernels, (o.kernel for o in r.ops))
    for note in src.get("notes", []):
        console.print(f"  note: {note}", style="yellow" if "roofline" in note else None)


def print_infer(r: InferResult, console, kernels: KernelCostModel | None = None) -> None:
    cfg = r.config
    assert r.memory is not None
    console.print(f"[bold]{escape(r.arch.name)}[/] on {cfg.tp * cfg.pp} x {escape(r.device.name)}: tp {cfg.tp}, pp {cfg.pp}; "
                  f"batch {cfg.batch}, prompt {cfg.prompt_len}, generate {cfg.gen_len}; {cfg.precision}, {cfg.attention}")
    console.print(f"time to first token [bold]{_fmt_s(r.ttft_s)}[/]   time per output token [bold]{_fmt_s(r.tpot_s)}[/]   "
                  f"total {_fmt_s(r.total_latency_s)}   {r.tokens_per_s:,.0f} tokens/s")
    for phase, parts in r.breakdown_s.items():
        console.print(f"  {phase}: " + ", ".join(f"{k} {_fmt_s(v)}" for k, v in parts.items()))
    console.print(f"memory per GPU {r.memory.total_bytes / GIB:.2f} GiB of {r.device.mem_bytes / GIB:.0f} GiB "
                  f"({', '.join(f'{k} {v / GIB:.2f}' for k, v in r.memory.breakdown().items())}) -> "
                  f"{'fits' if r.fits else 'DOES NOT FIT'}; KV cache {r.kv_cache_bytes / GIB:.3f} GiB")
    if r.ops:
        console.print(_split_line(r, kernels))
    gemms = decode_gemms(r, kernels)
    if gemms:
        from rich.table import Table

        ridge = gemms[0]["ridge_flop_per_byte"]
        table = Table(title=f"decode-step GEMMs on {escape(r.device.name)}: arithmetic intensity vs the ridge point "
                            f"({ridge:.0f} FLOP/byte)")
        for col in ("role", "m x n x k", "FLOP/byte", "bound", "util", "time", "source"):
            table.add_column(col, justify="right" if col in ("FLOP/byte", "util", "time") else "left")
        for g in gemms:
            util = g["compute_utilisation"] if g["roofline_bound"] == "compute" else g["memory_bw_utilisation"]
            table.add_row(g["role"], f"{g['m']} x {g['n']} x {g['k']}" + (f" (batch {g['b']})" if g["b"] > 1 else ""),
                          f"{g['arithmetic_intensity_flop_per_byte']:.1f}", g["roofline_bound"], f"{100 * util:.0f} %",
                          _fmt_s(g["time_s"]), g["source"] + (" (out of range)" if g["out_of_range"] else ""))
        console.print(table)
    console.print(f"kernel costs: {r.cost_sources.get('unique_kernels_by_source')}")
    _range_lines(console, r.device, kernels, (infer_kernel(r, line) for line in r.ops))
    for note in r.cost_sources.get("notes", []):
        console.print(f"  note: {note}", style="yellow" if "roofline" in note else None)


# --------------------------------------------------------------------------- trace

def trace_events(r: TrainResult) -> list[dict[str, Any]]:
    """Chrome trace events (``ph: X``, microseconds) of one iteration, one process per pipeline stage."""
    from opcast.predict.schedule import simulate

    assert r.layout is not None
    cfg, lay = r.config, r.layout
    fwd = [st.forward_s + st.forward_comm_s for st in r.stages]
    bwd = [st.per_micro_batch_s - st.pp_comm_s - f for st, f in zip(r.stages, fwd)]
    p2p = r.stages[0].pp_comm_s / (2 * cfg.virtual_stages - 1) if cfg.pp > 1 else 0.0  # stage 0 sends 2v - 1 times
    tasks = simulate(fwd, bwd, lay.micro_batches, cfg.virtual_stages, p2p)
    events: list[dict[str, Any]] = []
    for s in range(cfg.pp):
        events.append({"ph": "M", "name": "process_name", "pid": s, "args": {"name": f"pipeline stage {s}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": s, "tid": 0, "args": {"name": "compute + exposed comm"}})
    for t in tasks:
        name = f"{'forward' if t.kind == 'F' else 'backward'} mb{t.micro_batch}" + (f" chunk{t.chunk}" if cfg.virtual_stages > 1 else "")
        events.append({"ph": "X", "name": name, "cat": t.kind, "pid": t.stage, "tid": 0,
                       "ts": t.start_s * 1e6, "dur": (t.end_s - t.start_s) * 1e6})
    end = max((t.end_s for t in tasks), default=0.0)
    for st in r.stages:
        events.append({"ph": "X", "name": "dp grad sync (exposed)", "cat": "dp", "pid": st.stage, "tid": 0,
                       "ts": end * 1e6, "dur": st.dp_comm_s * 1e6})
        events.append({"ph": "X", "name": "optimizer", "cat": "optimizer", "pid": st.stage, "tid": 0,
                       "ts": (end + st.dp_comm_s) * 1e6, "dur": st.optimizer_s * 1e6})
    return events


def write_trace(r: TrainResult, path: str | Path) -> Path:
    path = Path(path)
    doc = {"traceEvents": trace_events(r), "displayTimeUnit": "ms",
           "otherData": {"arch": r.arch.name, "gpu": r.device.name, "iteration_time_s": r.iteration_time_s,
                         "note": "timeline replayed task by task (Megatron order); iteration_time_s is the analytical prediction"}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:  # atomic: a full disk leaves the old trace, not a truncated one, and no temp file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError as err:
        raise OpcastError(f"cannot write the trace {path}: {err.strerror or err}; free space or choose another --trace") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_plot(r: TrainResult, path: str | Path) -> Path:
    """Two bars: the time breakdown and the memory breakdown (needs matplotlib, an optional extra)."""
    plt = pyplot()
    path = Path(path)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.5))
    left = 0.0
    for key in BREAKDOWN_KEYS:
        v = r.breakdown_s[key]
        if v > 0:
            ax_t.barh([0], [v], left=left, label=key)
            left += v
    ax_t.set_yticks([])
    ax_t.set_xlabel("seconds per iteration")
    ax_t.set_title(f"{r.arch.name} on {r.device.name}: {r.iteration_time_s:.3g} s, MFU {100 * r.mfu:.1f} %")
    ax_t.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4)
    left = 0.0
    worst = r.worst_memory
    for key, v in worst.breakdown().items():
        ax_m.barh([0], [v / GIB], left=left, label=key)
        left += v / GIB
    ax_m.axvline(r.device.mem_bytes / GIB, color="black", linestyle="--", label="GPU memory")
    ax_m.set_yticks([])
    ax_m.set_xlabel("GiB per GPU")
    ax_m.set_title(f"memory, stage {worst.stage}")
    ax_m.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    fig.tight_layout()
    return save_figure(fig, path)
