"""``opcast explore`` and ``opcast compare``: hardware what-if studies on the command line.

- ``opcast explore train|infer --arch A --gpu BASE --vary FIELD=1,1.5,2,4 [--vary FIELD2=...]``
  predicts the workload on every point of the grid of hypothetical GPUs around BASE and prints
  the speed-up over BASE with the compute-bound / memory-bound / communication / bubble shares
  at each point (``--csv`` writes the grid, ``--plot`` draws where the bottleneck moves).
- ``opcast compare train|infer --arch A --gpus A100-SXM4-80GB,H100-SXM,B200`` runs the same
  workload on each GPU and prints every phase's seconds and speed-up over the first.

Both take the training or inference options of ``opcast predict train|infer``; a GPU may be any
``--gpu`` spelling, including a derived ``NAME[field=xK,...]``. Commands are thin: parse, build
the workload, call :mod:`opcast.predict.whatif`, print.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from opcast.cli_common import console, err_console
from opcast.predict.cli import _ANALYTIC, _JSON, _MODELS, _ROOFLINE, _SET, _device, _kernel_cost

explore_app = typer.Typer(no_args_is_help=True, help="Scan hypothetical GPUs around a base: speed-up and where the "
                                                     "bottleneck moves (--vary FIELD=1,2,4).")
compare_app = typer.Typer(no_args_is_help=True, help="One workload on several GPUs, side by side, phase by phase.")

# Options shared by the four commands (the same words as `opcast predict train|infer`).
Arch = Annotated[str, typer.Option("--arch", help="Arch preset (opcast arch list), preset JSON or Hugging Face config.json.")]
BaseGpu = Annotated[str, typer.Option("--gpu", help="The base GPU: catalog name or alias, device JSON file, or NAME[field=xK,...].")]
Gpus = Annotated[str, typer.Option("--gpus", help="Comma-separated GPUs, the first is the reference, e.g. "
                                                  "A100-SXM4-80GB,H100-SXM,B200 (NAME[field=xK,...] allowed).")]
Vary = Annotated[list[str], typer.Option("--vary", help="FIELD=F1,F2,...: factors of the base GPU's FIELD (any numeric "
                                                        "spec key, or peak_flops for every peak); repeat for a grid.")]
Sets = Annotated[Optional[list[str]], _SET]
Nodes = Annotated[Optional[int], typer.Option("--nodes", help="Nodes (default: as few of the GPU's nodes as needed).")]
PerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU's typical node).")]
Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline stages.")]
Dp = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: world / (tp x pp x cp)).")]
Sp = Annotated[bool, typer.Option("--sp", help="Sequence parallelism.")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel degree.")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")]
MicroBatch = Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")]
GlobalBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per iteration.")]
Seq = Annotated[int, typer.Option("--seq", help="Sequence length, tokens.")]
Recompute = Annotated[str, typer.Option("--recompute", help="none, selective or full.")]
Zero = Annotated[int, typer.Option("--zero", help="ZeRO stage 0, 1, 2 or 3.")]
Precision = Annotated[str, typer.Option("--precision", help="bf16, fp16, fp32 or fp8.")]
Attention = Annotated[str, typer.Option("--attention", help="flash or eager.")]
Schedule = Annotated[str, typer.Option("--schedule", help="1f1b or interleaved.")]
Virtual = Annotated[int, typer.Option("--virtual-stages", help="Model chunks per stage (interleaved).")]
Overlap = Annotated[bool, typer.Option("--overlap-grad-reduce", help="Overlap DP gradient reduction with backward.")]
TensorCores = Annotated[Optional[bool], typer.Option("--tensor-cores/--no-tensor-cores",
                                                     help="Matrix math on tensor cores (fp32: TF32); default: all but fp32.")]
Batch = Annotated[int, typer.Option("--batch", help="Sequences decoded together.")]
PromptLen = Annotated[int, typer.Option("--prompt-len", help="Prompt tokens per sequence.")]
GenLen = Annotated[int, typer.Option("--gen-len", help="Generated tokens per sequence.")]
Models = Annotated[Optional[Path], _MODELS]
Roofline = Annotated[bool, _ROOFLINE]
Analytic = Annotated[bool, _ANALYTIC]
AsJson = Annotated[bool, _JSON]
Csv = Annotated[Optional[Path], typer.Option("--csv", help="Also write the table to this .csv file.")]
Plot = Annotated[Optional[Path], typer.Option("--plot", help="Write a chart (.png; needs matplotlib).")]


# --------------------------------------------------------------------------- building blocks

def _train_workload(arch: str, nodes, gpus_per_node, **cfg: Any):
    from opcast.archs import load_arch
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.whatif import Workload

    return Workload(kind="train", arch=load_arch(arch), config=TrainConfig(**cfg), nodes=nodes, gpus_per_node=gpus_per_node)


def _infer_workload(arch: str, nodes, gpus_per_node, **cfg: Any):
    from opcast.archs import load_arch
    from opcast.predict.parallel import InferConfig
    from opcast.predict.whatif import Workload

    return Workload(kind="infer", arch=load_arch(arch), config=InferConfig(**cfg), nodes=nodes, gpus_per_node=gpus_per_node)


def _describe(w) -> str:
    c = w.config
    if w.kind == "train":
        return (f"{w.arch.name} training: tp {c.tp}, pp {c.pp}, dp {c.dp or 'auto'}, cp {c.cp}, ep {c.ep}{', sp' if c.sp else ''}; "
                f"micro-batch {c.micro_batch}, global batch {c.global_batch or 'auto'} x {c.seq} tokens; recompute "
                f"{c.recompute}, zero {c.zero}, {c.precision}")
    return (f"{w.arch.name} inference: tp {c.tp}, pp {c.pp}; batch {c.batch}, prompt {c.prompt_len}, generate "
            f"{c.gen_len}; {c.precision}")


def _check_csv(path: Optional[Path]) -> None:
    from opcast.errors import OpcastError

    if path is not None and path.suffix != ".csv":
        raise OpcastError(f"--csv {path}: give a file name ending in .csv")


def _write_csv(frame, path: Optional[Path]) -> None:
    if path is None:
        return
    from opcast.predict.batch import write_rows

    write_rows(frame, path)
    err_console.print(f"wrote {path}", markup=False, highlight=False)


def _records(frame) -> list[dict[str, Any]]:
    """Rows with NaN as null (strict JSON)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %" if math.isfinite(x) else "-"


def _num(x: float, fmt: str = ".4g") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


# --------------------------------------------------------------------------- explore

def _run_explore(workload, gpu: str, sets, vary: list[str], models, roofline: bool, analytic: bool, as_json: bool,
                 csv: Optional[Path], plot: Optional[Path]) -> None:
    from opcast.predict.whatif import explore, parse_vary

    _check_csv(csv)
    grid = parse_vary(vary)
    base = _device(gpu, sets)
    kernels = _kernel_cost(models, roofline, analytic)
    result = explore(workload, base, grid, kernels=kernels)
    frame = result.frame()
    if as_json:
        doc = {"workload": _describe(workload), "kind": workload.kind, "base_gpu": base.name,
               "metric": workload.metric, "base_time_s": result.base.time_s, "vary": {k: list(v) for k, v in grid.items()},
               "grid_shape": [len(v) for v in grid.values()], "columns": list(frame.columns), "points": _records(frame),
               "cost_sources": kernels.describe(), "notes": list(result.notes)}
        console.print_json(json.dumps(doc))
    else:
        _print_explore(result, frame)
    _write_csv(frame, csv)
    if plot is not None:
        _plot_explore(result, frame, plot)


def _print_explore(result, frame) -> None:
    from rich.table import Table

    w = result.workload
    console.print(f"[bold]{escape(_describe(w))}[/]")
    console.print(f"base {escape(result.base.device.name)}: {w.metric.removesuffix('_s').replace('_', ' ')} "
                  f"{_num(result.base.time_s)} s; {len(frame)} point(s) of {' x '.join(str(len(v)) for v in result.vary.values())}")
    table = Table(title="speed-up over the base and where the time goes at each point")
    factor_cols = [c for c in frame.columns if c.startswith("x_")]
    for c in factor_cols:
        table.add_column(c.removeprefix("x_"), justify="right")
    heads = [w.metric.removesuffix("_s") + " (s)", "speed-up"] + (["ttft x", "tpot x"] if w.kind == "infer" else [])
    for c in (*heads, "compute", "memory", "comm", "bubble", "fits", "flags"):
        table.add_column(c, justify="right")
    for row in frame.to_dict("records"):
        cells = [f"x{row[c]:g}" for c in factor_cols]
        cells += [_num(row[w.metric]), _num(row["speedup"], ".3f")]
        if w.kind == "infer":
            cells += [_num(row["ttft_speedup"], ".3f"), _num(row["tpot_speedup"], ".3f")]
        cells += [_pct(row[f"{p}_share"]) for p in ("compute_bound", "memory_bound", "communication", "bubble")]
        flags = (f"{row['learned_out_of_range']} out of range" if row["learned_out_of_range"] else "")
        if row["reasons"] and not row["feasible"] and not math.isfinite(row[w.metric]):
            flags = "infeasible"
        cells += ["yes" if row["fits"] else "NO", flags]
        table.add_row(*cells)
    console.print(table)
    console.print("compute / memory: kernels on that side of the achievable roofline; comm: exposed collectives and "
                  "pipeline sends; bubble: pipeline fill and drain (shares of the point's time)")
    for note in result.notes:
        console.print(f"  note: {note}", style="yellow", markup=False, highlight=False)
    bad = [r for r in frame.to_dict("records") if r["reasons"] and not math.isfinite(r[w.metric])]
    for r in bad[:3]:
        console.print(f"  {r['gpu']}: {r['reasons']}", markup=False, highlight=False)


def _plot_explore(result, frame, path: Path) -> None:
    """Left: speed-up against the first varied field's factor (one line per combination of the
    others). Right: the four shares at every point, stacked."""
    from opcast.plotting import pyplot, save_figure

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
    for part, colour in (("compute_bound", "tab:blue"), ("memory_bound", "tab:orange"), ("communication", "tab:green"),
                         ("bubble", "tab:gray")):
        values = [v if math.isfinite(v) else 0.0 for v in frame[f"{part}_share"]]
        ax_b.bar(range(len(frame)), values, bottom=bottom, label=part.replace("_", "-"), color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_b.set_xticks(range(len(frame)), labels, rotation=60 if len(frame) > 6 else 0, fontsize=7)
    ax_b.set_xlabel(" / ".join(fields))
    ax_b.set_ylabel("share of the time")
    ax_b.set_title("where the time goes")
    ax_b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4)
    fig.tight_layout()
    save_figure(fig, path)
    err_console.print(f"wrote {path}", markup=False, highlight=False)


@explore_app.command("train")
def explore_train(arch: Arch, gpu: BaseGpu, vary: Vary, set_: Sets = None, nodes: Nodes = None, gpus_per_node: PerNode = None,
                  tp: Tp = 1, pp: Pp = 1, dp: Dp = None, sp: Sp = False, cp: Cp = 1, ep: Ep = 1, micro_batch: MicroBatch = 1,
                  global_batch: GlobalBatch = None, seq: Seq = 2048, recompute: Recompute = "none", zero: Zero = 0,
                  precision: Precision = "bf16", attention: Attention = "flash", schedule: Schedule = "1f1b",
                  virtual_stages: Virtual = 1, overlap_grad_reduce: Overlap = False, tensor_cores: TensorCores = None,
                  models: Models = None, roofline: Roofline = False, analytic: Analytic = False, as_json: AsJson = False,
                  csv: Csv = None, plot: Plot = None) -> None:
    """A training iteration on a grid of hypothetical GPUs around --gpu."""
    w = _train_workload(arch, nodes, gpus_per_node, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=sp, micro_batch=micro_batch,
                        global_batch=global_batch, seq=seq, recompute=recompute, zero=zero, precision=precision,
                        attention=attention, schedule=schedule, virtual_stages=virtual_stages,
                        overlap_grad_reduce=overlap_grad_reduce, tensor_cores=tensor_cores)
    _run_explore(w, gpu, set_, vary, models, roofline, analytic, as_json, csv, plot)


@explore_app.command("infer")
def explore_infer(arch: Arch, gpu: BaseGpu, vary: Vary, set_: Sets = None, nodes: Nodes = None, gpus_per_node: PerNode = None,
                  tp: Tp = 1, pp: Pp = 1, batch: Batch = 1, prompt_len: PromptLen = 512, gen_len: GenLen = 128,
                  precision: Precision = "bf16", attention: Attention = "flash", tensor_cores: TensorCores = None,
                  models: Models = None, roofline: Roofline = False, analytic: Analytic = False, as_json: AsJson = False,
                  csv: Csv = None, plot: Plot = None) -> None:
    """One inference batch (prefill + decode) on a grid of hypothetical GPUs around --gpu."""
    w = _infer_workload(arch, nodes, gpus_per_node, tp=tp, pp=pp, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                        precision=precision, attention=attention, tensor_cores=tensor_cores)
    _run_explore(w, gpu, set_, vary, models, roofline, analytic, as_json, csv, plot)


# --------------------------------------------------------------------------- compare

def _run_compare(workload, gpus: str, sets, models, roofline: bool, analytic: bool, as_json: bool,
                 csv: Optional[Path], plot: Optional[Path]) -> None:
    from opcast.predict.whatif import compare, split_gpu_list

    _check_csv(csv)
    devices = [_device(name, sets) for name in split_gpu_list(gpus)]
    kernels = _kernel_cost(models, roofline, analytic)
    result = compare(workload, devices, kernels=kernels)
    frame = result.frame()
    summary = [_gpu_summary(o) for o in result.outcomes]
    if as_json:
        doc = {"workload": _describe(workload), "kind": workload.kind, "reference_gpu": devices[0].name,
               "gpus": summary, "columns": list(frame.columns), "phases": _records(frame),
               "cost_sources": kernels.describe()}
        console.print_json(json.dumps(doc))
    else:
        _print_compare(result, frame, summary)
    _write_csv(frame, csv)
    if plot is not None:
        _plot_compare(result, plot)


def _gpu_summary(o) -> dict[str, Any]:
    r = o.result
    out: dict[str, Any] = {"gpu": o.device.name, "feasible": bool(r.feasible), "fits": o.fits, "time_s": _finite(o.time_s),
                           "learned_kernels": o.learned, "learned_out_of_range": o.out_of_range, "reasons": list(o.reasons)}
    if o.split is not None:
        out["shares"] = {p: o.split.share(p) for p in ("compute_bound", "memory_bound", "communication", "bubble")}
        if hasattr(r, "mfu"):
            out["mfu"] = r.mfu
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _print_compare(result, frame, summary) -> None:
    from rich.table import Table

    names = [o.device.name for o in result.outcomes]
    console.print(f"[bold]{escape(_describe(result.workload))}[/]")
    table = Table(title=f"seconds per phase and speed-up over {escape(names[0])} (its seconds / this GPU's)")
    table.add_column("phase")
    for n in names:
        table.add_column(f"{escape(n)} s", justify="right")
        if n != names[0]:
            table.add_column("x", justify="right")
    for row in frame.to_dict("records"):
        cells = [row["phase"]]
        for n in names:
            cells.append(_num(row[f"{n}_s"]))
            if n != names[0]:
                cells.append(_num(row[f"{n}_speedup"], ".2f"))
        table.add_row(*cells)
    console.print(table)
    for s in summary:
        extra = f", MFU {100 * s['mfu']:.1f} %" if s.get("mfu") else ""
        state = "fits" if s["fits"] else "DOES NOT FIT" if s["time_s"] is not None else "cannot run"
        console.print(f"  {s['gpu']}: {state}{extra}"
                      + (f"; {s['learned_out_of_range']} learned kernel(s) out of range" if s["learned_out_of_range"] else ""),
                      markup=False, highlight=False)
        if s["reasons"]:
            console.print(f"    {'; '.join(s['reasons'])}", style="yellow", markup=False, highlight=False)


def _plot_compare(result, path: Path) -> None:
    """One stacked bar per GPU: its headline time split into compute-bound, memory-bound,
    communication and bubble seconds."""
    from opcast.plotting import pyplot, save_figure

    plt = pyplot()
    names = [o.device.name for o in result.outcomes]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(names) + 3), 4.5))
    bottom = [0.0] * len(names)
    for part, colour in (("compute_bound", "tab:blue"), ("memory_bound", "tab:orange"), ("communication", "tab:green"),
                         ("bubble", "tab:gray")):
        values = [getattr(o.split, f"{part}_s") if o.split else 0.0 for o in result.outcomes]
        ax.bar(range(len(names)), values, bottom=bottom, label=part.replace("_", "-"), color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel(f"seconds ({result.workload.metric.removesuffix('_s').replace('_', ' ')})")
    ax.set_title(f"{result.workload.arch.name} {result.workload.kind}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    err_console.print(f"wrote {path}", markup=False, highlight=False)


@compare_app.command("train")
def compare_train(arch: Arch, gpus: Gpus, set_: Sets = None, nodes: Nodes = None, gpus_per_node: PerNode = None,
                  tp: Tp = 1, pp: Pp = 1, dp: Dp = None, sp: Sp = False, cp: Cp = 1, ep: Ep = 1, micro_batch: MicroBatch = 1,
                  global_batch: GlobalBatch = None, seq: Seq = 2048, recompute: Recompute = "none", zero: Zero = 0,
                  precision: Precision = "bf16", attention: Attention = "flash", schedule: Schedule = "1f1b",
                  virtual_stages: Virtual = 1, overlap_grad_reduce: Overlap = False, tensor_cores: TensorCores = None,
                  models: Models = None, roofline: Roofline = False, analytic: Analytic = False, as_json: AsJson = False,
                  csv: Csv = None, plot: Plot = None) -> None:
    """One training iteration on each of --gpus: seconds and speed-up per phase (compute by op kind,
    communication, bubble). --set applies to every GPU."""
    w = _train_workload(arch, nodes, gpus_per_node, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=sp, micro_batch=micro_batch,
                        global_batch=global_batch, seq=seq, recompute=recompute, zero=zero, precision=precision,
                        attention=attention, schedule=schedule, virtual_stages=virtual_stages,
                        overlap_grad_reduce=overlap_grad_reduce, tensor_cores=tensor_cores)
    _run_compare(w, gpus, set_, models, roofline, analytic, as_json, csv, plot)


@compare_app.command("infer")
def compare_infer(arch: Arch, gpus: Gpus, set_: Sets = None, nodes: Nodes = None, gpus_per_node: PerNode = None,
                  tp: Tp = 1, pp: Pp = 1, batch: Batch = 1, prompt_len: PromptLen = 512, gen_len: GenLen = 128,
                  precision: Precision = "bf16", attention: Attention = "flash", tensor_cores: TensorCores = None,
                  models: Models = None, roofline: Roofline = False, analytic: Analytic = False, as_json: AsJson = False,
                  csv: Csv = None, plot: Plot = None) -> None:
    """One inference batch on each of --gpus: TTFT, TPOT and each phase's seconds and speed-up.
    --set applies to every GPU."""
    w = _infer_workload(arch, nodes, gpus_per_node, tp=tp, pp=pp, batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                        precision=precision, attention=attention, tensor_cores=tensor_cores)
    _run_compare(w, gpus, set_, models, roofline, analytic, as_json, csv, plot)
