"""``opcast train``: fit per-op predictors on datasets (fit) and score a model set on any dataset (eval)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from opcast.cli_common import console, err_console, print_frame, progress_bar

app = typer.Typer(no_args_is_help=True, help="Fit learned kernel predictors and report their held-out errors.")


@app.command()
def fit(
    dataset: Annotated[
        list[Path], typer.Argument(help="Dataset files or folders (opcast collect / collect replay output).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Models folder; the set is written to OUT/NAME/.")],
    name: Annotated[str, typer.Option(help="Name of the model set (its folder under --out).")] = "default",
    estimator: Annotated[
        str,
        typer.Option(
            help="xgb, tile-mlp, neusight (NeuSight's tile-level baseline), hier (device level from "
            "the spec sheet + xgb shape model), blend (the geometric mean of xgb and tile-mlp for the GPUs "
            "a group was not fitted on, xgb for the others), or auto (xgb, tile-mlp, hier or blend per op group, "
            "by error on left-out devices; where another is better on held-out shapes of the training devices, "
            "that one answers for them)."
        ),
    ] = "auto",
    holdout_device: Annotated[
        list[str] | None,
        typer.Option("--holdout-device", help="Leave this device out of fitting and score it (repeat)."),
    ] = None,
    op: Annotated[
        list[str] | None, typer.Option("--op", help="Fit only this op kind (repeat); default: all in the data.")
    ] = None,
    collectives: Annotated[
        bool,
        typer.Option(
            help="Also fit collectives as cluster-blind kernel predictors (off: cluster-tagged collectives are "
            "fitted per cluster into collectives.json either way)."
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of every split and estimator.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", help="Fits at once, each a one-thread worker process.")] = 2,
    folds: Annotated[
        int,
        typer.Option(
            help="Held-out folds per group (each leaves one device and a fifth of the shapes out; "
            "groups of at most 20k rows leave out every device in turn); 0: none."
        ),
    ] = 4,
    keep_suspect_sweeps: Annotated[
        bool,
        typer.Option(
            help="Also fit sweeps that ran at under a third of another sweep's rate of the same op "
            "on the same device (left out by default)."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Fit one predictor per (op, direction, dtype class); write the artifacts and meta.json."""
    from opcast.train.fit import FitConfig, fit_model_set

    cfg = FitConfig(
        estimator=estimator,  # type: ignore[arg-type]
        holdout_devices=tuple(holdout_device or ()),
        ops=tuple(op or ()),
        collectives=collectives,
        seed=seed,
        n_jobs=jobs,
        folds=folds,
        keep_suspect_sweeps=keep_suspect_sweeps,
    )
    command = " ".join(
        [
            "opcast train fit",
            *map(str, dataset),
            "--out",
            str(out),
            "--name",
            name,
            "--estimator",
            estimator,
            *[f"--holdout-device {h}" for h in holdout_device or ()],
            *[f"--op {o}" for o in op or ()],
            *(["--collectives"] if collectives else []),
            "--seed",
            str(seed),
            "--jobs",
            str(jobs),
            "--folds",
            str(folds),
            *(["--keep-suspect-sweeps"] if keep_suspect_sweeps else []),
        ]
    )
    from opcast.atomic import sigterm_as_interrupt
    from opcast.train.artifacts import check_output
    from opcast.train.collectives import fit_datasets, summary, write_collectives_only_set

    check_output(out, name)  # before any work
    # SIGTERM while fitting (not only while writing) ended the process on the spot, without a line
    with sigterm_as_interrupt():
        laws, has_kernels = fit_datasets(dataset)  # per-cluster collective laws, where rows name their cluster
        if laws is not None and not has_kernels:  # only collectives in the data: a set of collective laws alone
            result = None
            path = write_collectives_only_set(out, name, dataset, command, collectives=laws)
        else:
            with progress_bar() as progress:
                result = fit_model_set(
                    dataset, out, name=name, cfg=cfg, progress=progress, command=command, collectives=laws
                )
            path = result.path
    held = summary(laws.held_out) if laws is not None else []
    if as_json:
        console.print_json(
            json.dumps(
                {
                    "path": str(path),
                    "seconds": None if result is None else round(result.seconds, 1),
                    "skipped": {} if result is None else result.skipped,
                    "groups": [] if result is None else json.loads(result.groups.to_json(orient="records")),
                    "holdout": None
                    if result is None or result.holdout is None
                    else json.loads(result.holdout.to_json(orient="records")),
                    "collectives": None
                    if laws is None
                    else {"clusters": {c: sorted(k) for c, k in laws.laws.items()}, "held_out": held},
                }
            )
        )
        return
    if laws is not None:
        import pandas as pd

        print_frame(
            pd.DataFrame(held),
            title=f"collective laws of {', '.join(sorted(laws.laws))} -> {path}/collectives.json: held-out % error",
        )
    if result is None:
        return
    print_frame(
        result.groups.drop(columns=["why"]),
        title=f"{len(result.groups)} predictors -> {result.path} ({result.seconds:.0f} s)",
    )
    for row in result.groups.itertuples():
        console.print(f"  {row.group}: {row.why}")
    for key, why in result.skipped.items():
        console.print(f"  skipped {key}: {why}")
    if result.holdout is not None:
        print_frame(result.holdout, title="held-out devices (never fitted on)")


@app.command("eval")
def evaluate(
    dataset: Annotated[list[Path], typer.Argument(help="Dataset files or folders to score.")],
    models: Annotated[
        Path | None, typer.Option("--models", help="Model set folder (default: the embedded default).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON records.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a predicted-vs-measured log-log scatter per op (needs matplotlib)."),
    ] = None,
) -> None:
    """Score a model set on datasets: MAPE, median/p90 APE and share within 10 %, per op and device."""
    from opcast.plotting import check_plot_path
    from opcast.train.artifacts import load_model_set
    from opcast.train.evaluate import evaluate as run_eval
    from opcast.train.evaluate import plot_scatter, records

    if plot is not None:  # fail before the work: a bad path, or the optional dependency missing
        check_plot_path(plot)
    model_set = load_model_set(models)
    result = run_eval(model_set, dataset)
    table = result["table"]
    if plot is not None:
        plot_scatter(
            result["frame"], result["pred"], plot, title=f"{model_set.name} on {', '.join(p.name for p in dataset)}"
        )
    if as_json:
        console.print_json(
            json.dumps(
                {"models": str(model_set.path), "training_data": result["training_data"], "metrics": records(table)}
            )
        )
        return
    print_frame(table, title=f"{model_set.name} ({model_set.path}) on {', '.join(map(str, dataset))}: absolute % error")
    if result["rows_without_time"]:
        err_console.print(
            f"note: {result['rows_without_time']} rows without a positive, finite time_s_median were left out"
        )
    if result["training_data"]:
        err_console.print(
            f"note: {', '.join(result['training_data'])} was used to fit these models: this is training "
            "error, not a held-out score"
        )
    if plot is not None:
        console.print(f"scatter -> {plot}")


@app.command()
def adapt(
    dataset: Annotated[
        list[Path],
        typer.Argument(
            help="Rows measured on the GPU: a collect bench run folder, or replayed rows (files or folders)."
        ),
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="The GPU the rows were measured on (catalog name or alias).")],
    models: Annotated[
        Path | None,
        typer.Option("--models", help="Model set to adapt (default: the embedded default, which needs --out)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write an adapted copy of the set here (default: add the adaptation to --models itself)."
        ),
    ] = None,
    levels_only: Annotated[
        bool,
        typer.Option(
            "--levels-only", help="Fit levels only: no dependence on the kernel's size, shape or training-GPU analogue."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Fit a per-GPU correction of the learned times from a few measured kernels (10 to a few
    hundred) and store it in the set as adapt/<gpu>.json; predictions on that GPU with that set use it."""
    from opcast.train.adapt import AdaptConfig, adapt_model_set

    command = " ".join(
        [
            "opcast train adapt",
            *map(str, dataset),
            "--gpu",
            gpu,
            *(["--models", str(models)] if models is not None else []),
            *(["--out", str(out)] if out is not None else []),
            *(["--levels-only"] if levels_only else []),
        ]
    )
    from opcast.atomic import sigterm_as_interrupt

    with sigterm_as_interrupt():  # SIGTERM mid-copy left the hidden temporary copy of the set behind
        result = adapt_model_set(
            dataset,
            gpu,
            models=models,
            out=out,
            cfg=AdaptConfig(slope=not levels_only, analogues=not levels_only),
            command=command,
        )
    f = result.fields
    if as_json:
        console.print_json(
            json.dumps(
                {
                    "path": str(result.path),
                    "models": str(result.set_path),
                    "device": f["device"],
                    "rows": f["rows"],
                    "ignored": result.ignored,
                    "cross_validated": f["cross_validated"],
                    "groups": json.loads(result.table.to_json(orient="records")),
                }
            )
        )
        return
    print_frame(
        result.table,
        title=f"{f['device']}: correction from {f['rows']} measured rows -> {result.path} (in-sample % error)",
    )
    cv = f["cross_validated"]
    if cv:
        console.print(
            f"  {cv['folds']}-fold cross-validated on the measured rows: learned {cv['learned_mape']:.1f} % -> "
            f"adapted {cv['adapted_mape']:.1f} % MAPE"
        )
    for why, n in result.ignored.items():
        console.print(f"  ignored {n} rows: {why}")
    console.print(f"  predict with: --models {result.set_path} --gpu {f['device']}")
