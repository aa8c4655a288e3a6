"""Results as JSON, rich summaries, Chrome/Perfetto traces and charts: the presentation of every
prediction command (``predict kernel|train|infer``, ``search``, ``explore``, ``compare``) in one
place, with one way to write seconds (:func:`fmt_s`) and non-finite numbers (:func:`finite`).

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.markup import escape

from opcast.atomic import write_atomically, write_failure
from opcast.errors import OpcastError
from opcast.plotting import pyplot, save_figure
from opcast.predict.cost import Kernel, KernelCostModel, bottleneck
from opcast.predict.inference import InferResult
from opcast.predict.training import BREAKDOWN_KEYS, TrainResult

GIB = 2**30


def _kernel_dict(k) -> dict[str, Any]:
    return {
        "kind": k.kind,
        "params": dict(k.params),
        "dtype": k.dtype,
        "direction": k.direction,
        "tensor_cores": k.tensor_cores,
    }


def finite(x: float) -> float | None:
    """``x``, or None (JSON null) when it is not finite."""
    return x if math.isfinite(x) else None


def op_bottleneck(k: Kernel, time_s: float, device, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The per-op bottleneck keys of the JSON documents."""
    b = bottleneck(k, device, time_s, kernels.roofline if kernels is not None else None)
    return {
        "roofline_bound": b.bound,
        "arithmetic_intensity_flop_per_byte": finite(b.intensity),
        "ridge_flop_per_byte": b.ridge,
        "compute_utilisation": b.compute_utilisation,
        "memory_bw_utilisation": b.memory_utilisation,
        "out_of_range": kernels.range_flag(k, device) if kernels is not None else None,
    }


def _split_dict(r: TrainResult | InferResult, kernels: KernelCostModel | None) -> dict[str, Any]:
    from opcast.predict.whatif import SPLIT_PARTS, time_split

    split = time_split(r, kernels)
    return {
        "time_split_s": {p: getattr(split, f"{p}_s") for p in SPLIT_PARTS},
        "time_split_definition": "headline time by what bounds it: kernels on the compute or memory side of the "
        "achievable roofline, exposed communication, pipeline bubble (sums to the total)",
        "time_by_phase_s": split.by_phase,
    }


def _range_summary(sources: dict[str, Any], flagged: int) -> dict[str, Any]:
    out = dict(sources)
    out["learned_out_of_range_kernels"] = flagged
    return out


def train_to_dict(r: TrainResult, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The ``--json`` document of a training prediction (infeasible ones carry ``reasons``);
    ``kernels``, the cost model that priced it, adds the learned models' range flags."""
    out: dict[str, Any] = {
        "arch": r.arch.name,
        "gpu": r.device.name,
        "config": asdict(r.config),
        "feasible": r.feasible,
        "reasons": list(r.reasons),
    }
    if r.layout is None:
        return out
    lay = r.layout
    out["config"].update(
        dp=lay.dp,
        world_size=lay.world_size,
        nodes=lay.cluster.nodes,
        gpus_per_node=lay.cluster.gpus_per_node,
        micro_batches=lay.micro_batches,
    )
    worst = r.worst_memory
    out.update(
        {
            "iteration_time_s": r.iteration_time_s,
            "iteration_time_interval_s": list(r.iteration_time_interval_s or []) or None,
            "interval": r.interval.to_dict()
            if r.interval is not None
            else {"assumption": "no interval: no learned kernel with held-out residuals on the critical path"},
            "tokens_per_s": r.tokens_per_s,
            "mfu": r.mfu,
            "hfu": r.hfu,
            "model_flops_per_iteration": r.model_flops,
            "mfu_definition": "op-graph FLOPs (forward + backward, no recomputation) / (iteration time x world size x "
            "dense peak)",
            "memory_per_gpu_bytes": worst.total_bytes,
            "memory_breakdown_bytes": worst.breakdown(),
            "memory_worst_stage": worst.stage,
            "gpu_memory_bytes": r.device.mem_bytes,
            "fits": r.fits,
            "memory_overflow_bytes": max(0.0, worst.total_bytes - r.device.mem_bytes),
            "memory_per_stage_bytes": [m.total_bytes for m in r.memory],
            "host_activations_bytes": worst.host_activations_bytes,
            "breakdown_s": {k: r.breakdown_s[k] for k in BREAKDOWN_KEYS},
            "stages": [asdict(st) | {"per_micro_batch_s": st.per_micro_batch_s} for st in r.stages],
            "ops": [
                {
                    "stage": o.stage,
                    "phase": o.phase,
                    "role": o.role,
                    **_kernel_dict(o.kernel),
                    "count": o.count,
                    "time_s": o.time_s,
                    "total_s": o.count * o.time_s,
                    "source": o.source,
                    **op_bottleneck(o.kernel, o.time_s, r.device, kernels),
                }
                for o in r.ops
            ],
            "collectives": [
                {
                    "stage": c.stage,
                    "phase": c.phase,
                    "role": c.role,
                    "kind": c.call.kind,
                    "bytes": c.call.bytes,
                    "group": {
                        "size": c.call.group.size,
                        "nodes": c.call.group.nodes,
                        "per_node": c.call.group.per_node,
                    },
                    "count": c.count,
                    "time_s": c.time_s,
                    "exposed_s": c.exposed_s,
                    "source": c.source,
                }
                for c in r.comms
            ],
            "cost_sources": _range_summary(r.cost_sources, _flagged(r.device, kernels, (o.kernel for o in r.ops))),
        }
    )
    if r.ops:
        out.update(_split_dict(r, kernels))
    if r.config.pp > 2:
        out["ops_note"] = (
            f"ops and collectives list stages 0, 1 and {r.config.pp - 1}; stages 2..{r.config.pp - 2} repeat stage 1"
        )
    return out


def _flagged(device, kernels: KernelCostModel | None, ks) -> int:
    if kernels is None:
        return 0
    return sum(1 for k in set(ks) if kernels.range_flag(k, device))


def infer_kernel(r: InferResult, line: dict[str, Any]) -> Kernel:
    """The kernel of one of an inference result's op lines."""
    from opcast.predict.inference import infer_precision

    return infer_precision(r.config, r.arch, r.device).of(line["kind"], line["params"], line["direction"])


def decode_gemms(r: InferResult, kernels: KernelCostModel | None = None) -> list[dict[str, Any]]:
    """The GEMMs of one decode step (the median sampled step) with their arithmetic intensity
    against the device's ridge point: at small batches they sit far left of it, memory-bound."""
    out = []
    for line in r.ops:
        if line["phase"] != "decode" or line["kind"] != "gemm":
            continue
        k = infer_kernel(r, line)
        p = line["params"]
        out.append(
            {
                "role": line["role"],
                "b": p["b"],
                "m": p["m"],
                "n": p["n"],
                "k": p["k"],
                "dtype": line["dtype"],
                "count": line["count"],
                "time_s": line["time_s"],
                "source": line["source"],
                **op_bottleneck(k, line["time_s"], r.device, kernels),
            }
        )
    return out


def infer_to_dict(r: InferResult, kernels: KernelCostModel | None = None) -> dict[str, Any]:
    """The ``--json`` document of an inference prediction; ``kernels`` adds the range flags."""
    out: dict[str, Any] = {
        "arch": r.arch.name,
        "gpu": r.device.name,
        "config": asdict(r.config),
        "feasible": r.feasible,
        "reasons": list(r.reasons),
    }
    if r.memory is None:
        return out
    kerns = [infer_kernel(r, line) for line in r.ops]
    out.update(
        {
            "ttft_s": r.ttft_s,
            "tpot_s": r.tpot_s,
            "total_latency_s": r.total_latency_s,
            "tokens_per_s": r.tokens_per_s,
            "kv_cache_bytes": r.kv_cache_bytes,
            "memory_per_gpu_bytes": r.memory.total_bytes,
            "memory_breakdown_bytes": r.memory.breakdown(),
            "gpu_memory_bytes": r.device.mem_bytes,
            "fits": r.fits,
            "breakdown_s": r.breakdown_s,
            "ops": [{**line, **op_bottleneck(k, line["time_s"], r.device, kernels)} for line, k in zip(r.ops, kerns)],
            "decode_gemms": decode_gemms(r, kernels),
            "cost_sources": _range_summary(r.cost_sources, _flagged(r.device, kernels, kerns)),
        }
    )
    if r.ops:
        out.update(_split_dict(r, kernels))
    if r.cluster is not None:
        out["config"].update(nodes=r.cluster.nodes, gpus_per_node=r.cluster.gpus_per_node)
    return out


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=float)


# --------------------------------------------------------------------------- rich


def fmt_s(t: float | None, *, short: bool = False) -> str:
    """Seconds for reading: ``1.234 s`` from one second up; below, ``12.345 ms`` down to a
    millisecond, then ``123.4 us``; ``short`` (table columns): ``12.3 ms`` all the way down; None: ``-``."""
    if t is None:
        return "-"
    if t >= 1:
        return f"{t:.3f} s"
    if short:
        return f"{t * 1e3:.1f} ms"
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
        console.print(
            f"  warning: {len(reasons)} kernel time(s) from learned models outside the shapes or hardware they "
            f"were fitted on, e.g. {reasons[0]}",
            style="yellow",
            markup=False,
            highlight=False,
        )


def print_train(r: TrainResult, console, kernels: KernelCostModel | None = None) -> None:
    from rich.table import Table

    lay, cfg = r.layout, r.config
    assert lay is not None
    console.print(
        f"[bold]{escape(r.arch.name)}[/] on {lay.world_size} x {escape(r.device.name)} "
        f"({lay.cluster.nodes} node(s) x {lay.cluster.gpus_per_node}): tp {cfg.tp}, pp {cfg.pp}, dp {lay.dp}, "
        f"cp {cfg.cp}, ep {cfg.ep}{', sp' if cfg.sp else ''}; micro-batch {cfg.micro_batch} x "
        f"{lay.micro_batches} per rank, global batch {cfg.global_batch} x {cfg.seq} tokens; "
        f"recompute {cfg.recompute}, zero {cfg.zero}, {cfg.precision}, {cfg.attention} attention, {cfg.schedule}"
        + (f" v={cfg.virtual_stages}" if cfg.schedule == "interleaved" else "")
    )
    span = r.iteration_time_interval_s
    console.print(
        f"iteration [bold]{fmt_s(r.iteration_time_s)}[/]"
        + (escape(f" [{fmt_s(span[0])}, {fmt_s(span[1])}]") if span else "")
        + f"   {r.tokens_per_s:,.0f} tokens/s   MFU [bold]{100 * r.mfu:.1f} %[/] (HFU {100 * r.hfu:.1f} %)"
    )
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
    mem = Table(
        title=f"memory per GPU (stage {worst.stage}, the fullest): {worst.total_bytes / GIB:.2f} GiB of "
        f"{r.device.mem_bytes / GIB:.0f} GiB -> {'fits' if r.fits else 'DOES NOT FIT'}"
    )
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for k, v in worst.breakdown().items():
        mem.add_row(k, f"{v / GIB:.3f}")
    console.print(mem)
    if worst.host_activations_bytes:
        console.print(
            f"  offloaded activations in host memory: {worst.host_activations_bytes / GIB:.2f} GiB per GPU "
            f"({r.config.offload_activations} layers, over {r.device.host_link_bw_bytes_per_s / 1e9:.0f} GB/s each way)"
        )
    if r.ops:
        console.print(_split_line(r, kernels))
    top = sorted(r.ops, key=lambda o: -o.count * o.time_s)[:8]
    ops = Table(title="heaviest kernels (one GPU of the stage, per iteration); bound and utilisation of its peak")
    for col in ("stage", "phase", "role", "kind", "count", "total", "bound", "util", "source"):
        ops.add_column(col)
    for o in top:
        b = op_bottleneck(o.kernel, o.time_s, r.device, kernels)
        util = b["compute_utilisation"] if b["roofline_bound"] == "compute" else b["memory_bw_utilisation"]
        ops.add_row(
            str(o.stage),
            o.phase,
            o.role,
            o.kernel.kind,
            f"{o.count:g}",
            fmt_s(o.count * o.time_s),
            b["roofline_bound"],
            f"{100 * util:.0f} %",
            o.source + (" (out of range)" if b["out_of_range"] else ""),
        )
    console.print(ops)
    src = r.cost_sources
    console.print(
        f"kernel costs: {src.get('unique_kernels_by_source')} "
        f"({src.get('kernel_models') or 'no learned models'}); collectives: {src.get('collectives_by_source')}",
        markup=False,
    )
    _range_lines(console, r.device, kernels, (o.kernel for o in r.ops))
    for note in src.get("notes", []):
        print_note(console, note)


def _ep_text(cfg) -> str:
    """``, ep N`` of an expert-parallel inference configuration, else nothing."""
    return f", ep {cfg.ep}" if cfg.ep > 1 else ""


def print_infer(r: InferResult, console, kernels: KernelCostModel | None = None) -> None:
    cfg = r.config
    assert r.memory is not None
    console.print(
        f"[bold]{escape(r.arch.name)}[/] on {cfg.tp * cfg.pp} x {escape(r.device.name)}: "
        f"tp {cfg.tp}, pp {cfg.pp}{_ep_text(cfg)}; "
        f"batch {cfg.batch}, prompt {cfg.prompt_len}, generate {cfg.gen_len}; {cfg.precision}, {cfg.attention}"
    )
    console.print(
        f"time to first token [bold]{fmt_s(r.ttft_s)}[/]   time per output token [bold]{fmt_s(r.tpot_s)}[/]   "
        f"total {fmt_s(r.total_latency_s)}   {r.tokens_per_s:,.0f} tokens/s"
    )
    for phase, parts in r.breakdown_s.items():
        console.print(f"  {phase}: " + ", ".join(f"{k} {fmt_s(v)}" for k, v in parts.items()))
    console.print(
        f"memory per GPU {r.memory.total_bytes / GIB:.2f} GiB of {r.device.mem_bytes / GIB:.0f} GiB "
        f"({', '.join(f'{k} {v / GIB:.2f}' for k, v in r.memory.breakdown().items())}) -> "
        f"{'fits' if r.fits else 'DOES NOT FIT'}; KV cache {r.kv_cache_bytes / GIB:.3f} GiB"
    )
    if r.ops:
        console.print(_split_line(r, kernels))
    gemms = decode_gemms(r, kernels)
    if gemms:
        from rich.table import Table

        ridge = gemms[0]["ridge_flop_per_byte"]
        table = Table(
            title=f"decode-step GEMMs on {escape(r.device.name)}: arithmetic intensity vs the ridge point "
            f"({ridge:.0f} FLOP/byte)"
        )
        for col in ("role", "m x n x k", "FLOP/byte", "bound", "util", "time", "source"):
            table.add_column(col, justify="right" if col in ("FLOP/byte", "util", "time") else "left")
        for g in gemms:
            util = g["compute_utilisation"] if g["roofline_bound"] == "compute" else g["memory_bw_utilisation"]
            table.add_row(
                g["role"],
                f"{g['m']} x {g['n']} x {g['k']}" + (f" (batch {g['b']})" if g["b"] > 1 else ""),
                f"{g['arithmetic_intensity_flop_per_byte']:.1f}",
                g["roofline_bound"],
                f"{100 * util:.0f} %",
                fmt_s(g["time_s"]),
                g["source"] + (" (out of range)" if g["out_of_range"] else ""),
            )
        console.print(table)
    console.print(f"kernel costs: {r.cost_sources.get('unique_kernels_by_source')}")
    _range_lines(console, r.device, kernels, (infer_kernel(r, line) for line in r.ops))
    for note in r.cost_sources.get("notes", []):
        print_note(console, note)


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
        events.append(
            {"ph": "M", "name": "thread_name", "pid": s, "tid": 0, "args": {"name": "compute + exposed comm"}}
        )
    for t in tasks:
        name = f"{'forward' if t.kind == 'F' else 'backward'} mb{t.micro_batch}" + (
            f" chunk{t.chunk}" if cfg.virtual_stages > 1 else ""
        )
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": t.kind,
                "pid": t.stage,
                "tid": 0,
                "ts": t.start_s * 1e6,
                "dur": (t.end_s - t.start_s) * 1e6,
            }
        )
    end = max((t.end_s for t in tasks), default=0.0)
    for st in r.stages:
        events.append(
            {
                "ph": "X",
                "name": "dp grad sync (exposed)",
                "cat": "dp",
                "pid": st.stage,
                "tid": 0,
                "ts": end * 1e6,
                "dur": st.dp_comm_s * 1e6,
            }
        )
        events.append(
            {
                "ph": "X",
                "name": "optimizer",
                "cat": "optimizer",
                "pid": st.stage,
                "tid": 0,
                "ts": (end + st.dp_comm_s) * 1e6,
                "dur": st.optimizer_s * 1e6,
            }
        )
    return events


def write_trace(r: TrainResult, path: str | Path) -> Path:
    path = Path(path)
    doc = {
        "traceEvents": trace_events(r),
        "displayTimeUnit": "ms",
        "otherData": {
            "arch": r.arch.name,
            "gpu": r.device.name,
            "iteration_time_s": r.iteration_time_s,
            "note": "timeline replayed task by task (Megatron order); iteration_time_s is the analytical prediction",
        },
    }
    try:  # atomic: a full disk leaves the old trace, not a truncated one, and no temp file
        return write_atomically(path, lambda tmp: tmp.write_text(json.dumps(doc)))
    except OSError as err:
        raise OpcastError(write_failure("--trace", path, err, "the trace")) from None


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


# --------------------------------------------------------------------------- kernel


def print_kernel(doc: dict[str, Any], console) -> None:
    """The ``predict kernel`` document in a few lines: time, interval, roofline position, flags."""
    seconds, span = doc["time_s"], doc.get("time_s_interval")
    console.print(
        f"[bold]{doc['op']}[/] {escape(str(doc['params']))} on {escape(doc['gpu'])}: [bold]{seconds * 1e6:.2f} us[/] "
        + (escape(f"[{span[0] * 1e6:.2f}, {span[1] * 1e6:.2f}] ") if span else "")
        + f"({doc['source']})"
    )
    if span:
        console.print(f"  90 % interval from the {escape(doc['interval_basis'])}")
    if "roofline_bound" in doc:
        util = doc["compute_utilisation"] if doc["roofline_bound"] == "compute" else doc["memory_bw_utilisation"]
        console.print(
            f"  {doc['flops']:.4g} FLOP, {doc['bytes']:.4g} bytes; roofline {doc['roofline_time_s'] * 1e6:.2f} us, "
            f"{doc['roofline_bound']}-bound (intensity {doc['arithmetic_intensity_flop_per_byte'] or 0:.3g} vs ridge "
            f"{doc['ridge_flop_per_byte']:.3g} FLOP/byte); the prediction uses {100 * util:.0f} % of the "
            f"{'peak' if doc['roofline_bound'] == 'compute' else 'memory bandwidth'}"
        )
        if doc["out_of_range"]:
            console.print(f"  warning: {doc['out_of_range']}", style="yellow", markup=False, highlight=False)
        for note in doc["notes"]:
            print_note(console, note)


# --------------------------------------------------------------------------- search


def print_note(console, note: str) -> None:
    """One ``note:`` line of a report, as plain text: notes carry names the user chose (a --models folder,
    a device file's GPU), and rich read '[/x]' in them as markup (a MarkupError, exit 1)."""
    console.print(f"  note: {note}", style="yellow" if "roofline" in note else None, markup=False)


def print_search(result, console, price: float | None) -> None:
    """The ranked table of a search, what was pruned and why, and where the search spent its time."""
    from rich.table import Table

    from opcast.predict.search import REASONS, describe_config, main_cost

    space = result.space
    worlds = ", ".join(f"{n * g} ({n} x {g})" for n, g in result.worlds)
    console.print(
        f"[bold]{escape(result.arch.name)}[/] on {escape(result.device.name)}: GPUs {worlds}; global batch "
        f"{space.global_batch} x {space.seq} tokens, {space.precision}, {space.attention} attention"
        f"{'' if space.framework is None else f', {space.framework} kernels'}; "
        f"objective [bold]{space.objective}[/]; memory limit {result.memory_limit_bytes / 2**30:.1f} GiB per GPU"
    )
    table = Table(title=f"top {len(result.top)} of {result.predicted:,} feasible configurations")
    cols = ["#", "configuration", "GPUs", "m", "tokens/s", "iteration", "MFU", "mem GiB", "GPU-h / 1M tok"]
    if price is not None:
        cols.append("$ / 1M tok")
    cols.append("main cost (largest overhead)")
    for col in cols:
        table.add_column(col, justify="left" if col in ("configuration", "main cost (largest overhead)") else "right")
    for rank, (c, r) in enumerate(zip(result.candidates, result.top), start=1):
        big, big_share, over, over_share = main_cost(r)
        gpu_h = c.gpu_s_per_token * 1e6 / 3600
        row = [
            str(rank),
            describe_config(c),
            str(c.world_size),
            str(c.micro_batches),
            f"{r.tokens_per_s:,.0f}",
            fmt_s(r.iteration_time_s, short=True),
            f"{100 * r.mfu:.1f} %",
            f"{r.worst_memory.total_bytes / 2**30:.1f}",
            f"{gpu_h:.3g}",
        ]
        if price is not None:
            row.append(f"{gpu_h * price:.3g}")
        row.append(f"{big} {100 * big_share:.0f} % ({over} {100 * over_share:.0f} %)")
        table.add_row(*row)
    console.print(table)
    total = result.total_s
    console.print(
        f"considered {result.considered:,} configurations, pruned {sum(result.pruned.values()):,}, "
        f"predicted {result.predicted:,} in {total:.2f} s ({result.considered / total:,.0f} configurations/s, "
        f"{result.predicted / total:,.0f} predicted/s; {result.workers} process(es))"
    )
    for key, n in sorted(result.pruned.items(), key=lambda kv: -kv[1]):
        console.print(f"  pruned {n:>12,}  {REASONS[key]}")
    console.print(
        f"  {result.unique_graphs:,} distinct op graphs, {result.unique_kernels:,} distinct kernels "
        f"{result.kernels_by_source}; stages " + ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items())
    )
    for note in result.cost_sources.get("notes", []):
        print_note(console, note)
    if result.max_recheck_rel_diff > 1e-9:
        console.print(
            f"  warning: the search and run_train differ by {result.max_recheck_rel_diff:.2e} on the top "
            "configurations (the table shows run_train's figures)",
            style="yellow",
        )


# --------------------------------------------------------------------------- explore and compare

_SPLIT_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:gray")
"""Chart colours of :data:`opcast.predict.whatif.SPLIT_PARTS`, in order."""


def pct(x: float) -> str:
    return f"{100 * x:.1f} %" if math.isfinite(x) else "-"


def num(x: float, fmt: str = ".4g") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def records(frame) -> list[dict[str, Any]]:
    """A frame's rows with NaN as null (strict JSON)."""
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        for row in frame.to_dict("records")
    ]


def describe_workload(w) -> str:
    """One line naming a what-if workload's arch and configuration."""
    c = w.config
    if w.kind == "train":
        return (
            f"{w.arch.name} training: tp {c.tp}, pp {c.pp}, dp {c.dp or 'auto'}, cp {c.cp}, ep "
            f"{c.ep}{', sp' if c.sp else ''}; "
            f"micro-batch {c.micro_batch}, global batch {c.global_batch or 'auto'} x {c.seq} tokens; recompute "
            f"{c.recompute}, zero {c.zero}, {c.precision}"
        )
    return (
        f"{w.arch.name} inference: tp {c.tp}, pp {c.pp}{_ep_text(c)}; batch {c.batch}, prompt {c.prompt_len}, generate "
        f"{c.gen_len}; {c.precision}"
    )


def explore_to_dict(result, frame, kernels: KernelCostModel) -> dict[str, Any]:
    """The ``explore --json`` document: every grid point's row, the grid and the cost sources."""
    w = result.workload
    return {
        "workload": describe_workload(w),
        "kind": w.kind,
        "base_gpu": result.base.device.name,
        "metric": w.metric,
        "base_time_s": result.base.time_s,
        "vary": {k: list(v) for k, v in result.vary.items()},
        "grid_shape": [len(v) for v in result.vary.values()],
        "columns": list(frame.columns),
        "points": records(frame),
        "cost_sources": kernels.describe(),
        "notes": list(result.notes),
    }


def print_explore(result, frame, console) -> None:
    from rich.table import Table

    from opcast.predict.whatif import SPLIT_PARTS

    w = result.workload
    console.print(f"[bold]{escape(describe_workload(w))}[/]")
    console.print(
        f"base {escape(result.base.device.name)}: {w.metric.removesuffix('_s').replace('_', ' ')} "
        f"{num(result.base.time_s)} s; {len(frame)} point(s) of {' x '.join(str(len(v)) for v in result.vary.values())}"
    )
    table = Table(title="speed-up over the base and where the time goes at each point")
    factor_cols = [c for c in frame.columns if c.startswith("x_")]
    for c in factor_cols:
        table.add_column(c.removeprefix("x_"), justify="right")
    heads = [w.metric.removesuffix("_s") + " (s)", "speed-up"] + (["ttft x", "tpot x"] if w.kind == "infer" else [])
    for c in (*heads, "compute", "memory", "comm", "bubble", "fits", "flags"):
        table.add_column(c, justify="right")
    for row in frame.to_dict("records"):
        cells = [f"x{row[c]:g}" for c in factor_cols]
        cells += [num(row[w.metric]), num(row["speedup"], ".3f")]
        if w.kind == "infer":
            cells += [num(row["ttft_speedup"], ".3f"), num(row["tpot_speedup"], ".3f")]
        cells += [pct(row[f"{p}_share"]) for p in SPLIT_PARTS]
        flags = f"{row['learned_out_of_range']} out of range" if row["learned_out_of_range"] else ""
        if row["reasons"] and not row["feasible"] and not math.isfinite(row[w.metric]):
            flags = "infeasible"
        cells += ["yes" if row["fits"] else "NO", flags]
        table.add_row(*cells)
    console.print(table)
    console.print(
        "compute / memory: kernels on that side of the achievable roofline; comm: exposed collectives and "
        "pipeline sends; bubble: pipeline fill and drain (shares of the point's time)"
    )
    for note in result.notes:
        console.print(f"  note: {note}", style="yellow", markup=False, highlight=False)
    bad = [r for r in frame.to_dict("records") if r["reasons"] and not math.isfinite(r[w.metric])]
    for r in bad[:3]:
        console.print(f"  {r['gpu']}: {r['reasons']}", markup=False, highlight=False)


def plot_explore(result, frame, path: str | Path) -> Path:
    """Left: speed-up against the first varied field's factor (one line per combination of the
    others). Right: the four shares at every point, stacked."""
    from opcast.predict.whatif import SPLIT_PARTS

    plt = pyplot()
    fields = list(result.vary)
    first, others = fields[0], fields[1:]
    fig, (ax_s, ax_b) = plt.subplots(1, 2, figsize=(12, 4.8))
    groups = frame.groupby([f"x_{f}" for f in others], sort=False) if others else [((), frame)]
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{f} x{v:g}" for f, v in zip(others, key)) or None
        ax_s.plot(sub[f"x_{first}"], sub["speedup"], marker="o", label=label)
    ax_s.set_xlabel(f"{first} (x base)")
    ax_s.set_ylabel(f"speed-up over {result.base.device.name}")
    ax_s.set_title(f"{result.workload.arch.name} {result.workload.kind}: {result.workload.metric}")
    ax_s.grid(True, alpha=0.3)
    if others:
        ax_s.legend(fontsize=7)
    labels = ["/".join(f"x{row[f'x_{f}']:g}" for f in fields) for row in frame.to_dict("records")]
    bottom = [0.0] * len(frame)
    for part, colour in zip(SPLIT_PARTS, _SPLIT_COLOURS):
        values = [v if math.isfinite(v) else 0.0 for v in frame[f"{part}_share"]]
        ax_b.bar(range(len(frame)), values, bottom=bottom, label=part.replace("_", "-"), color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_b.set_xticks(range(len(frame)), labels, rotation=60 if len(frame) > 6 else 0, fontsize=7)
    ax_b.set_xlabel(" / ".join(fields))
    ax_b.set_ylabel("share of the time")
    ax_b.set_title("where the time goes")
    ax_b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4)
    fig.tight_layout()
    return save_figure(fig, path)


def gpu_summary(o) -> dict[str, Any]:
    """One GPU of a comparison: whether it runs and fits, its time, range flags and time shares."""
    from opcast.predict.whatif import SPLIT_PARTS

    r = o.result
    out: dict[str, Any] = {
        "gpu": o.device.name,
        "feasible": bool(r.feasible),
        "fits": o.fits,
        "time_s": finite(o.time_s),
        "learned_kernels": o.learned,
        "learned_out_of_range": o.out_of_range,
        "reasons": list(o.reasons),
    }
    if o.split is not None:
        out["shares"] = {p: o.split.share(p) for p in SPLIT_PARTS}
        if hasattr(r, "mfu"):
            out["mfu"] = r.mfu
    if getattr(getattr(r, "config", None), "clocks", None) == "sustained":  # training: say which GPUs were derated
        from opcast.predict.cost.sustained import sustained_clock

        clock = sustained_clock(o.device)
        out["sustained_clock_fraction"] = None if clock is None else clock.fraction
    return out


def compare_to_dict(result, frame, kernels: KernelCostModel) -> dict[str, Any]:
    """The ``compare --json`` document: each GPU's summary and every phase's seconds and speed-up."""
    w = result.workload
    return {
        "workload": describe_workload(w),
        "kind": w.kind,
        "reference_gpu": result.outcomes[0].device.name,
        "gpus": [gpu_summary(o) for o in result.outcomes],
        "columns": list(frame.columns),
        "phases": records(frame),
        "cost_sources": kernels.describe(),
    }


def print_compare(result, frame, console) -> None:
    from rich.table import Table

    names = [o.device.name for o in result.outcomes]
    console.print(f"[bold]{escape(describe_workload(result.workload))}[/]")
    table = Table(title=f"seconds per phase and speed-up over {escape(names[0])} (its seconds / this GPU's)")
    table.add_column("phase")
    for n in names:
        table.add_column(f"{escape(n)} s", justify="right")
        if n != names[0]:
            table.add_column("x", justify="right")
    for row in frame.to_dict("records"):
        cells = [row["phase"]]
        for n in names:
            cells.append(num(row[f"{n}_s"]))
            if n != names[0]:
                cells.append(num(row[f"{n}_speedup"], ".2f"))
        table.add_row(*cells)
    console.print(table)
    for s in map(gpu_summary, result.outcomes):
        extra = f", MFU {100 * s['mfu']:.1f} %" if s.get("mfu") else ""
        state = "fits" if s["fits"] else "DOES NOT FIT" if s["time_s"] is not None else "cannot run"
        if "sustained_clock_fraction" in s:
            fraction = s["sustained_clock_fraction"]
            extra += (
                "; no measured sustained clock: compute-bound kernels at their burst rates"
                if fraction is None
                else f"; compute-bound kernels at {fraction:.3f} of their burst rate (its sustained clock)"
            )
        console.print(
            f"  {s['gpu']}: {state}{extra}"
            + (f"; {s['learned_out_of_range']} learned kernel(s) out of range" if s["learned_out_of_range"] else ""),
            markup=False,
            highlight=False,
        )
        if s["reasons"]:
            console.print(f"    {'; '.join(s['reasons'])}", style="yellow", markup=False, highlight=False)


def plot_compare(result, path: str | Path) -> Path:
    """One stacked bar per GPU: its headline time split into compute-bound, memory-bound,
    communication and bubble seconds."""
    from opcast.predict.whatif import SPLIT_PARTS

    plt = pyplot()
    names = [o.device.name for o in result.outcomes]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(names) + 3), 4.5))
    bottom = [0.0] * len(names)
    for part, colour in zip(SPLIT_PARTS, _SPLIT_COLOURS):
        values = [getattr(o.split, f"{part}_s") if o.split else 0.0 for o in result.outcomes]
        ax.bar(range(len(names)), values, bottom=bottom, label=part.replace("_", "-"), color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel(f"seconds ({result.workload.metric.removesuffix('_s').replace('_', ' ')})")
    ax.set_title(f"{result.workload.arch.name} {result.workload.kind}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
