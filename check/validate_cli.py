"""``opcast validate`` and ``opcast calibrate``: check predictions against real training steps on
this machine, and fit kernel models for it.

Thin commands: parse -> :func:`~opcast.check.validate.run_validate` /
:func:`~opcast.check.calibrate.run_calibrate` -> a rich table or ``--json``. Torch is imported
only when a command runs. Under ``torchrun`` every rank trains and only rank 0 prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from opcast.cli_common import console, err_console, progress_bar

_ARCH_HELP = (
    "Arch preset (opcast arch list), check arch (gpt2-124m, llama-style-125m), preset JSON or Hugging Face config.json."
)


def _fmt_s(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t:.3f} s" if t >= 1 else f"{t * 1e3:.1f} ms"


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:+.1f} %"


def print_validate(r: Any) -> None:
    """The validate report as rich tables."""
    from rich.markup import escape
    from rich.table import Table

    world = f", {r.world_size} ranks (DDP)" if r.world_size > 1 else ""
    console.print(
        f"[bold]{escape(r.arch)}[/] ({r.params / 1e6:.1f} M parameters) on {escape(r.device)} "
        f"({r.device_type}, {r.threads} thread(s){world}): batch {r.batch} x seq {r.seq}, {r.precision}, "
        f"{r.attention} attention; median of {r.steps} steps after {r.warmup} warm-up"
    )
    table = Table(title=f"measured vs predicted ({escape(r.models)})")
    for col, justify in (
        ("phase", "left"),
        ("measured", "right"),
        ("p20-p80", "right"),
        ("predicted", "right"),
        ("error", "right"),
        ("predicted as", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for p in r.phases:
        table.add_row(
            p.phase,
            _fmt_s(p.measured_s),
            f"{_fmt_s(p.measured_p20_s)} - {_fmt_s(p.measured_p80_s)}",
            _fmt_s(p.predicted_s),
            _fmt_pct(p.error_pct),
            escape(p.predicted_as),
        )
    console.print(table)
    if r.iteration_time_interval_s is not None:
        lo, hi = r.iteration_time_interval_s
        console.print(
            f"predicted iteration {_fmt_s(r.phase('total').predicted_s)} [{_fmt_s(lo)}, {_fmt_s(hi)}]: the "
            f"measured {_fmt_s(r.phase('total').measured_s)} is {'inside' if r.inside_interval else 'OUTSIDE'}"
        )
    console.print(
        f"kernel costs: {r.kernels_by_source}; {100 * r.roofline_share:.0f} % of the predicted time from the "
        f"roofline; {r.out_of_range_kernels} learned kernel(s) flagged out of range",
        markup=False,
        highlight=False,
    )
    if r.profile:
        prof = Table(
            title="per op group, seconds per step (torch.profiler; the profiled step took "
            f"{r.profile_overhead or 0:.2f}x the unprofiled one)"
        )
        for col in ("group", "measured", "predicted", "error", "predicted from"):
            prof.add_column(col, justify="left" if col in ("group", "predicted from") else "right")
        for g in r.profile:
            err = 100 * (g.predicted_s - g.measured_s) / g.measured_s if g.measured_s > 0 else None
            prof.add_row(
                g.group,
                _fmt_s(g.measured_s),
                _fmt_s(g.predicted_s) if g.predicted_sources else "-",
                _fmt_pct(err) if g.predicted_sources else "-",
                escape(g.predicted_sources),
            )
        console.print(prof)
    for note in r.notes:
        console.print(f"  note: {note}", style="yellow", markup=False, highlight=False)


def validate_cmd(
    arch: Annotated[str, typer.Option("--arch", help=_ARCH_HELP)],
    batch: Annotated[int, typer.Option("--batch", help="Sequences per step (per rank under torchrun).")],
    seq: Annotated[int, typer.Option("--seq", help="Tokens per sequence.")],
    precision: Annotated[
        str, typer.Option("--precision", help="fp32, bf16 or fp16 (half precisions keep fp32 master weights).")
    ] = "fp32",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (under torchrun: cuda:LOCAL_RANK).")] = "cpu",
    models: Annotated[
        Path | None,
        typer.Option(
            "--models", help="Kernel models (opcast train fit / calibrate --out); default: the embedded ones."
        ),
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", help="Timed training steps (the median is reported; at most 1,000).")
    ] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed warm-up steps (at most 1,000).")] = 2,
    layers: Annotated[int | None, typer.Option("--layers", help="Override the arch's n_layers (quick checks).")] = None,
    attention: Annotated[
        str, typer.Option("--attention", help="flash (scaled_dot_product_attention) or eager.")
    ] = "flash",
    profile: Annotated[
        bool, typer.Option("--profile", help="Per op group: torch.profiler's time next to the predicted one.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Train an arch for a few steps on this machine and compare every phase with the prediction."""
    import contextlib

    from opcast.atomic import sigterm_as_interrupt
    from opcast.check.validate import local_env, run_validate

    env = local_env()  # RANK=abc, WORLD_SIZE=0, ...: one line before any work
    rank0 = env.rank == 0
    show = rank0 and not as_json and err_console.is_terminal

    def progress(msg: str) -> None:
        if show:
            err_console.print(f"validate: {msg}", highlight=False, markup=False, soft_wrap=True)

    # SIGTERM ended a run on the spot without a line; alone it is taken as an interrupt (exit 143). Under
    # torchrun it keeps its default action: a rank blocked in a collective would never run the handler.
    with sigterm_as_interrupt() if env.world == 1 else contextlib.nullcontext():
        report = run_validate(
            arch,
            batch=batch,
            seq=seq,
            precision=precision,
            device=device,
            models=models,
            steps=steps,
            warmup=warmup,
            profile=profile,
            attention=attention,
            layers=layers,
            progress=progress,
        )
    if not rank0:
        return
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        print_validate(report)


def print_calibrate(r: Any) -> None:
    """The calibrate report: before/after per check arch, then what was done."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"step time on {escape(r.device)}: prediction error before (embedded default models) and after "
        f"({escape(r.models or 'not fitted')})"
    )
    for col in ("arch", "batch x seq", "measured", "predicted before", "error", "measured", "predicted after", "error"):
        table.add_column(col, justify="left" if col == "arch" else "right")
    for c in r.checks:
        ref = c.after or c.before
        cells = []
        for rep in (c.before, c.after):
            p = rep.phase("total") if rep is not None else None
            cells += [
                _fmt_s(p.measured_s if p else None),
                _fmt_s(p.predicted_s if p else None),
                _fmt_pct(p.error_pct if p else None),
            ]
        table.add_row(escape(c.arch), f"{ref.batch} x {ref.seq}" if ref else "-", *cells)
    console.print(table)
    fitted = len(r.fit_groups)
    console.print(
        f"collected {r.rows_collected} rows ({r.rows_total} in {r.data}, {r.points_remaining} planned points left); "
        f"fitted {fitted} predictor(s)" + (f" -> {r.models}" if r.models else ""),
        markup=False,
        highlight=False,
    )
    console.print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in r.seconds.items()), markup=False, highlight=False)
    for i in r.intervals:
        console.print(
            f"interval of {i['arch']} (batch {i['batch']} x seq {i['seq']}): {_fmt_s(i['predicted_s'])} "
            f"[{_fmt_s(i['low_s'])}, {_fmt_s(i['high_s'])}], {i['high_s'] / i['low_s']:.2g}x wide"
            if i["low_s"] > 0
            else f"interval of {i['arch']}: [{i['low_s']}, {i['high_s']}]",
            markup=False,
            highlight=False,
        )
    for note in r.notes:
        console.print(f"  note: {note}", style="yellow", markup=False, highlight=False)
    if r.failure:
        console.print(f"FAILED: {r.failure}", style="bold red", markup=False, highlight=False)


def calibrate_cmd(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Folder for the model set (OUT/NAME, selected by --models OUT), the data and the report."
        ),
    ],
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    budget_s: Annotated[
        float,
        typer.Option(
            "--budget-s", help="Seconds for the whole calibration; collection gets what validation and fit leave."
        ),
    ] = 840.0,
    arch: Annotated[
        list[str] | None,
        typer.Option(
            "--arch", help="Arch whose shapes are measured (repeat); default: gpt2-124m and llama-style-125m."
        ),
    ] = None,
    op: Annotated[
        list[str] | None,
        typer.Option(
            "--op",
            help="Op kind to measure (repeat; as collect bench --op), e.g. gemm; default: every kind the archs' "
            "training step uses. The set then models these kinds (and those of any --datasets) only: the others are "
            "priced by the roofline under --models OUT.",
        ),
    ] = None,
    validate_arch: Annotated[
        list[str] | None,
        typer.Option("--validate-arch", help="Arch validated before and after (repeat); default: the --arch ones."),
    ] = None,
    datasets: Annotated[
        list[Path] | None,
        typer.Option("--datasets", help="More datasets to fit on (repeat), besides data/datasets."),
    ] = None,
    batch: Annotated[
        list[int] | None,
        typer.Option("--batch", help="Batch size of the measured arch shapes (repeat; the first is validated)."),
    ] = None,
    seq: Annotated[
        list[int] | None,
        typer.Option(
            "--seq",
            help="Sequence length of the measured arch shapes (repeat; default 256, 512, 1024; the shortest is "
            "validated).",
        ),
    ] = None,
    precision: Annotated[str, typer.Option("--precision", help="fp32, bf16 or fp16.")] = "fp32",
    attention: Annotated[str, typer.Option("--attention", help="flash or eager.")] = "flash",
    name: Annotated[str, typer.Option("--name", help="Name of the model set (its folder under --out).")] = "calibrated",
    estimator: Annotated[
        str, typer.Option("--estimator", help="xgb (fast), tile-mlp, hier, neusight or auto.")
    ] = "xgb",
    steps: Annotated[int, typer.Option("--steps", help="Timed steps of each validation (at most 1,000).")] = 3,
    allow_busy: Annotated[
        bool,
        typer.Option(
            "--allow-busy", help="Calibrate even on a busy machine or with noisy timings (the report says so)."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Collect kernel timings on this machine, fit models on them and show the validation error before and after.
    --budget-s bounds the wall time of the whole command; a busy machine, noisy timings or too wide
    an interval fail the calibration (exit 2), keeping what was measured."""
    from opcast.check.calibrate import DEFAULT_SEQS, CalibrateConfig, run_calibrate

    cfg = CalibrateConfig(
        out=out,
        device=device,
        budget_s=budget_s,
        archs=tuple(arch or ()),
        ops=tuple(op or ()),
        validate_archs=tuple(validate_arch or ()),
        datasets=tuple(datasets or ()),
        batches=tuple(batch or (1,)),
        seqs=tuple(seq or DEFAULT_SEQS),
        precision=precision,
        attention=attention,
        name=name,
        estimator=estimator,
        steps=steps,
        allow_busy=allow_busy,
    )

    def log(msg: str) -> None:
        err_console.print(f"calibrate: {msg}", highlight=False, markup=False, soft_wrap=True)

    from opcast.atomic import sigterm_as_interrupt

    # SIGTERM between the stages (planning, the report's write) is an interrupt too; within a stage the
    # child is stopped (opcast.check.isolated), and a collection returns what it measured
    with sigterm_as_interrupt(), progress_bar() as bar:
        report = run_calibrate(cfg, log=log, progress=bar)
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        print_calibrate(report)
    if report.interrupted:
        import signal

        name = report.signal or "SIGINT"
        what = "terminated (SIGTERM)" if name == "SIGTERM" else "interrupted"
        err_console.print(
            f"{what}: the {report.rows_total} measured rows are kept in {report.data}; "
            "re-run the same command to resume",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(128 + int(signal.Signals[name]))  # 143 for SIGTERM, as opcast.errors.Terminated
    if report.failure:
        from opcast.errors import OpcastError

        raise OpcastError(report.failure)
