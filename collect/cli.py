"""``opcast collect``: measure ops on the local device (bench), collectives (comm), and summarise
datasets (info)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from opcast.cli_common import console, err_console, print_frame, progress_bar

app = typer.Typer(no_args_is_help=True, help="Measure ops and collectives on the local device into parquet datasets.")


def _ints(text: str, option: str) -> tuple[int, ...]:
    from opcast.errors import OpcastError

    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise OpcastError(f"{option} takes comma-separated integers, e.g. 1,2,4,8; got {text!r}") from None
    if not values or min(values) < 1:
        raise OpcastError(f"{option} takes positive integers, got {text!r}")
    return values


@app.command()
def bench(
    out: Annotated[Path, typer.Option("--out", help="Dataset folder; re-running the same command resumes it.")],
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N (under torchrun, cuda = cuda:LOCAL_RANK).")] = "cpu",
    op: Annotated[
        list[str] | None, typer.Option("--op", help="Op kind to measure (repeat); default: all compute kinds.")
    ] = None,
    dtype: Annotated[
        list[str] | None,
        typer.Option("--dtype", help="fp32, fp16, bf16, tf32, fp8 (repeat); default: fp32, fp16, bf16."),
    ] = None,
    arch: Annotated[
        list[str] | None,
        typer.Option("--arch", help="Add the exact shapes of this arch preset or config.json (repeat)."),
    ] = None,
    tp: Annotated[
        str | None,
        typer.Option(
            help="Tensor-parallel degrees of the --arch shapes, each of which one of them must take "
            "(default: 1,2,4,8, where each arch takes them)."
        ),
    ] = None,
    samples: Annotated[int | None, typer.Option(help="Points to plan in all (split across op/dtype strata).")] = None,
    budget_s: Annotated[
        float | None, typer.Option("--budget-s", help="Stop after this many seconds; re-run to continue.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampling plan.")] = 0,
    max_point_s: Annotated[
        float, typer.Option("--max-point-s", help="Skip points whose roofline time per call exceeds this.")
    ] = 0.05,
    max_mem_fraction: Annotated[float, typer.Option(help="Largest share of free memory one point may use.")] = 0.25,
    warmup_s: Annotated[float, typer.Option("--warmup-s", help="Warm-up seconds per point.")] = 0.025,
    rep_s: Annotated[float, typer.Option("--rep-s", help="Timed seconds per point.")] = 0.1,
    cuda_graphs: Annotated[bool, typer.Option(help="Time sub-10 us CUDA ops inside CUDA graphs.")] = True,
    timing: Annotated[
        str,
        typer.Option(
            "--timing",
            help="opcast (warm-up and repetition budgets, cold L2, graphs) or neusight (NeuSight's rule: "
            "25 calls alone, mean of the fastest 5; rows that can join its published ones).",
        ),
    ] = "opcast",
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Sample op shapes and time them on this device (resumable; Ctrl-C, SIGTERM and a full disk keep what is done)."""
    from opcast.collect.bench import BenchConfig, run_bench
    from opcast.collect.timing import TimingBudget
    from opcast.errors import OpcastError

    if samples is None and budget_s is None:
        samples = 200
    if samples is not None and samples < 1:
        raise OpcastError(f"--samples must be >= 1, got {samples}")
    cfg = BenchConfig(
        out=out,
        device=device,
        ops=tuple(op or ()),
        dtypes=tuple(dtype or ()),
        archs=tuple(arch or ()),
        tp_degrees=(1, 2, 4, 8) if tp is None else _ints(tp, "--tp"),
        tp_given=tp is not None,
        samples=samples,
        budget_s=budget_s,
        seed=seed,
        max_point_s=max_point_s,
        max_mem_fraction=max_mem_fraction,
        timing=TimingBudget(warmup_s=warmup_s, rep_s=rep_s),
        cuda_graphs=cuda_graphs,
        protocol=timing,
    )
    with progress_bar() as progress:
        result = run_bench(cfg, progress=progress)
    summary = {
        "device": result.device,
        "run_id": result.run_id,
        "rows_written": result.rows_written,
        "already_done": result.already_done,
        "remaining": result.remaining,
        "planned": result.planned,
        "interrupted": result.interrupted,
        "skipped_in_plan": dict(result.skipped_in_plan),
        "skipped_at_run": dict(result.skipped_at_run),
        "out": str(out),
    }
    if as_json:
        console.print_json(json.dumps(summary))
    else:
        console.print(
            f"[bold]{result.device}[/]: wrote {result.rows_written} rows to {out} "
            f"({result.already_done} already done, {result.remaining} left of {result.planned} planned)"
        )
        for reason, count in sorted({**result.skipped_in_plan, **result.skipped_at_run}.items(), key=lambda kv: -kv[1])[
            :8
        ]:
            console.print(f"  skipped {count:5d}: {reason}")
        if result.remaining:
            console.print("  re-run the same command to continue")
    if result.interrupted:
        name = result.signal or "SIGINT"
        err_console.print(
            f"opcast: interrupted by {name}: the {result.rows_written} rows measured are saved in {out}; "
            "re-run the same command to resume",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(128 + int(getattr(signal.Signals, name)))


@app.command()
def comm(
    out: Annotated[Path, typer.Option("--out", help="Dataset folder (rank 0 writes it).")],
    backend: Annotated[str, typer.Option(help="nccl (GPUs) or gloo (CPUs).")] = "gloo",
    op: Annotated[list[str] | None, typer.Option("--op", help="Collective (repeat); default: all.")] = None,
    dtype: Annotated[str, typer.Option(help="Buffer element type.")] = "fp32",
    min_bytes: Annotated[int, typer.Option("--min-bytes", help="Smallest message, bytes.")] = 1 << 10,
    max_bytes: Annotated[int, typer.Option("--max-bytes", help="Largest message, bytes (at most 8 GiB).")] = 1 << 26,
    step_factor: Annotated[int, typer.Option(help="Ratio of consecutive message sizes.")] = 4,
    iters: Annotated[int, typer.Option(help="Timed iterations per size (at most 10,000).")] = 10,
    warmup_iters: Annotated[int, typer.Option(help="Untimed iterations per size (at most 10,000).")] = 3,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="Catalog cluster (see data/clusters) or cluster JSON file the job runs on; recorded on every row "
            "so that `opcast train fit` learns this cluster's collectives.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Sweep collectives over all ranks; run under torchrun (`torchrun --nproc-per-node N --no-python opcast collect comm ...`)."""  # noqa: E501 -- the command's one-line help
    from opcast.collect.comm import COMM_OPS, CommConfig, run_comm

    cfg = CommConfig(
        out=out,
        backend=backend,
        ops=tuple(op or COMM_OPS),
        dtype=dtype,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        step_factor=step_factor,
        iters=iters,
        warmup_iters=warmup_iters,
        cluster=cluster,
    )
    import os

    is_rank0 = os.environ.get("RANK", "0") == "0"
    with progress_bar(enabled=is_rank0) as progress:
        result = run_comm(cfg, progress=progress)
    if result.interrupted and result.signal:
        if is_rank0:
            err_console.print(
                f"opcast: interrupted by {result.signal}: the {result.rows_written} rows measured are saved "
                f"in {out}; re-run the same command to resume",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(128 + int(getattr(signal.Signals, result.signal)))
    if not is_rank0:
        return
    summary = {
        "device": result.device,
        "world_size": result.world_size,
        "nodes": result.nodes,
        "gpus_per_node": result.gpus_per_node,
        "rows_written": result.rows_written,
        "already_done": result.already_done,
        "remaining": result.remaining,
        "run_id": result.run_id,
        "out": str(out),
    }
    if as_json:
        console.print_json(json.dumps(summary))
    else:
        console.print(
            f"[bold]{result.device}[/] x{result.world_size} ({result.nodes} node(s) x {result.gpus_per_node}): "
            f"wrote {result.rows_written} collective rows to {out} ({result.already_done} already done)"
        )


@app.command()
def replay(
    source: Annotated[
        str,
        typer.Argument(
            help="neusight | vidur | estimate-train-time | kineto | nccl-tests | aiconfigurator | liger | aiter"
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Dataset folder to write <source>.parquet into.")],
    path: Annotated[
        Path | None,
        typer.Argument(
            help="The source's repository checkout, or the trace / log file; "
            "aiconfigurator: default the installed package's data."
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="Catalog name of the device (kineto, nccl-tests; aiter: the product of its chip)."),
    ] = None,
    world_size: Annotated[int | None, typer.Option(help="Ranks of the run (nccl-tests).")] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes of the run (nccl-tests).")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="Ranks per node (nccl-tests).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Convert published measurements (NeuSight, Vidur, 2509.22832, NVIDIA AIConfigurator, Liger-Kernel, AMD aiter), a profiler trace or an nccl-tests log."""  # noqa: E501 -- the command's one-line help
    from opcast.collect.info import summarise
    from opcast.collect.replay import ReplayOptions, run_replay

    summary = run_replay(
        source, path, out, ReplayOptions(device=device, world_size=world_size, nodes=nodes, gpus_per_node=gpus_per_node)
    )
    record = {
        "source": source,
        "files": summary.files,
        "rows_read": summary.rows_read,
        "rows_written": summary.rows_written,
        "runs_written": summary.runs_written,
        "skipped": dict(summary.skipped),
        "notes": summary.notes,
        "outputs": [str(p) for p in summary.outputs],
    }
    if as_json:
        console.print_json(json.dumps(record))
        return
    ops_files = [p for p in summary.outputs if not p.name.endswith("-runs.parquet")]
    if ops_files:
        table = summarise(ops_files)
        print_frame(
            table[["op", "device", "dtype", "source", "rows", "directions"]],
            title=f"{source}: {summary.rows_written} rows from {summary.files} files",
        )
    if summary.runs_written:
        console.print(f"{summary.runs_written} end-to-end runs -> {summary.outputs[-1]}")
    for reason, count in sorted(summary.skipped.items(), key=lambda kv: -kv[1]):
        console.print(f"  skipped {count:6d}: {reason}")
    for note in summary.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)


@app.command()
def info(
    dataset: Annotated[list[Path], typer.Argument(help="Dataset files or folders.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON records.")] = False,
) -> None:
    """Rows per op, device, dtype and source, with shape and time ranges (duplicate rows counted once)."""
    from opcast.collect.info import read_unique, summarise_frame

    rows, duplicates = read_unique(dataset)
    table = summarise_frame(rows)
    if duplicates:
        err_console.print(
            f"note: {duplicates} duplicate rows (same source, device and point) are counted once; "
            "they come from two runs writing one folder at once",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        console.print_json(table.to_json(orient="records"))
        return
    print_frame(table, title=f"{int(table['rows'].sum())} rows in {', '.join(map(str, dataset))}")
