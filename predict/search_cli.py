"""``opcast search``: the fastest (or cheapest, or leanest) parallel configuration that fits.

Thin, as every command: parse -> :class:`~opcast.predict.search.SearchSpace` -> :func:`search` ->
a rich table, ``--json`` or ``--csv``. When nothing fits, the reasons summary goes to stderr in
one line (after the JSON document, with ``--json``) and the exit code is 2.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from opcast.cli_common import console, err_console

_OBJECTIVE_HELP = ("throughput: most tokens/s; cost: fewest GPU-hours per token (also tries fewer GPUs than --gpus: "
                   "every divisor that is whole nodes or fits one node); memory: least memory per GPU.")


class _LazyBar:
    """A progress bar on stderr that appears only once a search has run for a second."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.t0 = time.perf_counter()
        self.delay_s = delay_s
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.progress is None:
            if time.perf_counter() - self.t0 < self.delay_s or not err_console.is_terminal:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("search: {task.description:9s}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=err_console, transient=True)
            self.progress.start()
        task = self.tasks.get(stage)
        if task is None:
            task = self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(task, completed=done, total=total)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _fmt_s(t: float) -> str:
    return f"{t:.3f} s" if t >= 1 else f"{t * 1e3:.1f} ms"


def _print(result, console, price: float | None) -> None:
    from rich.table import Table

    from opcast.predict.search import REASONS, describe_config, main_cost

    space = result.space
    worlds = ", ".join(f"{n * g} ({n} x {g})" for n, g in result.worlds)
    console.print(f"[bold]{result.arch.name}[/] on {result.device.name}: GPUs {worlds}; global batch "
                  f"{space.global_batch} x {space.seq} tokens, {space.precision}, {space.attention} attention; "
                  f"objective [bold]{space.objective}[/]; memory limit {result.memory_limit_bytes / 2**30:.1f} GiB per GPU")
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
        row = [str(rank), describe_config(c), str(c.world_size), str(c.micro_batches), f"{r.tokens_per_s:,.0f}",
               _fmt_s(r.iteration_time_s), f"{100 * r.mfu:.1f} %", f"{r.worst_memory.total_bytes / 2**30:.1f}",
               f"{gpu_h:.3g}"]
        if price is not None:
            row.append(f"{gpu_h * price:.3g}")
        row.append(f"{big} {100 * big_share:.0f} % ({over} {100 * over_share:.0f} %)")
        table.add_row(*row)
    console.print(table)
    total = result.total_s
    console.print(f"considered {result.considered:,} configurations, pruned {sum(result.pruned.values()):,}, "
                  f"predicted {result.predicted:,} in {total:.2f} s ({result.considered / total:,.0f} configurations/s, "
                  f"{result.predicted / total:,.0f} predicted/s; {result.workers} process(es))")
    for key, n in sorted(result.pruned.items(), key=lambda kv: -kv[1]):
        console.print(f"  pruned {n:>12,}  {REASONS[key]}")
    console.print(f"  {result.unique_graphs:,} distinct op graphs, {result.unique_kernels:,} distinct kernels "
                  f"{result.kernels_by_source}; stages " + ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items()))
    for note in result.cost_sources.get("notes", []):
        console.print(f"  note: {note}", style="yellow" if "roofline" in note else None)
    if result.max_recheck_rel_diff > 1e-9:
        console.print(f"  warning: the search and run_train differ by {result.max_recheck_rel_diff:.2e} on the top "
                      "configurations (the table shows run_train's figures)", style="yellow")


def _write_csv(result, path: Path) -> None:
    import csv
    import os
    import tempfile

    from opcast.errors import OpcastError
    from opcast.predict.search import candidate_row

    rows = [candidate_row(c, rank) for rank, c in enumerate(result.candidates, start=1)]
    fields = list(candidate_row(result.candidates[0], 1)) if rows else ["rank"]
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise OpcastError(f"cannot write {path}: {err.strerror or err}; free space or choose a writable --csv") from None
    finally:  # a failed or interrupted write leaves no temp file behind
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def search_cmd(
    arch: Annotated[str, typer.Option("--arch", help="Arch preset (opcast arch list), preset JSON or Hugging Face config.json.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU name or alias (opcast hardware list), or a device JSON file.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs available (the world size).")],
    global_batch: Annotated[int, typer.Option("--global-batch", help="Sequences per iteration.")],
    seq: Annotated[int, typer.Option("--seq", help="Tokens per sequence.")],
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU's typical node).")] = None,
    precision: Annotated[str, typer.Option("--precision", help="bf16, fp16, fp32 or fp8.")] = "bf16",
    attention: Annotated[str, typer.Option("--attention", help="flash or eager.")] = "flash",
    top: Annotated[int, typer.Option("--top", help="Configurations to show (each re-predicted with the full breakdown).")] = 10,
    objective: Annotated[str, typer.Option("--objective", help=_OBJECTIVE_HELP)] = "throughput",
    max_tp: Annotated[Optional[int], typer.Option("--max-tp", help="Largest tensor-parallel degree.")] = None,
    tp_within_node: Annotated[bool, typer.Option("--tp-within-node", help="Keep tensor-parallel groups inside a node.")] = False,
    max_mem: Annotated[Optional[float], typer.Option("--max-mem", help="Memory limit per GPU, GiB (default: the GPU's memory).")] = None,
    fix: Annotated[Optional[list[str]], typer.Option("--fix", help="Restrict a dimension: KEY=V[,V...] with KEY one of tp, pp, cp, ep, sp (on/off), micro_batch, recompute, zero, schedule, virtual_stages (repeat).")] = None,
    allow_straddling: Annotated[bool, typer.Option("--allow-straddling", help="Also search layouts whose tp / cp / dp groups straddle node boundaries (priced as if aligned: optimistic).")] = False,
    overlap_grad_reduce: Annotated[bool, typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Overlap the DP gradient reduction with the last backward.")] = True,
    gpu_hour_price: Annotated[Optional[float], typer.Option("--gpu-hour-price", help="Price of one GPU-hour: adds a cost column in that currency.")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Processes for large spaces (default: the cores available; small spaces stay in one).")] = None,
    models: Annotated[Optional[Path], typer.Option("--models", help="Learned kernel models (opcast train fit --out); default: the embedded ones.")] = None,
    roofline: Annotated[bool, typer.Option("--roofline", help="Ignore learned models: every kernel from the roofline fallback.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write every feasible configuration, ranked, to this CSV.")] = None,
) -> None:
    """Search every TP/PP/DP/CP/SP, micro-batch, recomputation, ZeRO and schedule combination; rank the feasible ones."""
    from opcast.archs import load_arch
    from opcast.errors import OpcastError
    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost, models_flag_problem
    from opcast.predict.report import to_json
    from opcast.predict.search import SearchSpace, parse_fix, search, search_to_dict, space_problems

    spec = load_arch(arch)
    device = get_device(gpu)
    problems: list[str] = []
    try:
        fixed = parse_fix(fix or [])
    except OpcastError as err:
        fixed = {}
        problems.append(str(err))
    if gpu_hour_price is not None and not (math.isfinite(gpu_hour_price) and gpu_hour_price >= 0):
        problems.append(f"--gpu-hour-price {gpu_hour_price} must be a finite number >= 0")
    if (problem := models_flag_problem(models, not roofline)):
        problems.append(problem)
    space = SearchSpace(gpus=gpus, gpus_per_node=gpus_per_node, global_batch=global_batch, seq=seq,
                        precision=precision, attention=attention, objective=objective,  # type: ignore[arg-type]
                        max_tp=max_tp, tp_within_node=tp_within_node, aligned_groups=not allow_straddling,
                        max_mem_bytes=None if max_mem is None else max_mem * 2**30,
                        overlap_grad_reduce=overlap_grad_reduce, fixed=fixed)
    problems += space_problems(device, space)
    if problems:  # every problem of the request in one line
        raise OpcastError("; ".join(problems))
    kernels = load_kernel_cost(models, use_learned=not roofline)
    bar = _LazyBar()
    try:
        result = search(spec, device, space, kernels=kernels, top=top, workers=workers, progress=bar)
    finally:
        bar.close()
    if csv is not None:
        _write_csv(result, csv)
    if as_json:
        console.print_json(to_json(search_to_dict(result)))
    elif result.candidates:
        _print(result, console, gpu_hour_price)
    if not result.considered:
        raise OpcastError(f"nothing to search: the --fix values leave no configuration on {gpus} GPUs "
                          "(tp x pp x cp must divide --gpus, micro_batch the --global-batch, virtual_stages n_layers)")
    if not result.candidates:
        where = " or ".join(f"{n * g}" for n, g in result.worlds)
        raise OpcastError(f"nothing fits: none of the {result.considered:,} configurations of {spec.name} on {where} "
                          f"x {device.name} with global batch {global_batch} x {seq} tokens fits in "
                          f"{result.memory_limit_bytes / 2**30:.1f} GiB per GPU; pruned: {result.reasons_summary()}; "
                          "try more GPUs, a smaller --global-batch or --seq, or fewer constraints")
