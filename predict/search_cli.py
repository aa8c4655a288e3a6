"""``opcast search``: the best configuration of a training job (``search train``) or of a serving
deployment (``search serve``).

``opcast search train`` is also ``opcast search`` followed directly by its options (``opcast
search --arch ...``, as before there were two): :class:`TrainByDefault` routes arguments that do
not start with a command name to ``train``.

- ``search train``: the fastest (or cheapest, or leanest) parallel configuration that fits. Thin,
  as every command: parse -> :class:`~opcast.predict.search.SearchSpace` -> :func:`search` -> a rich
  table (:func:`opcast.predict.report.print_search`), ``--json`` or ``--csv``. The options are
  those of ``opcast predict train`` where they mean the same (:mod:`opcast.predict.options`),
  ``--set``, ``--analytic`` and ``--cluster`` included. When nothing fits, the reasons summary goes
  to stderr in one line (after the JSON document, with ``--json``) and the exit code is 2.
- ``search serve``: the deployment (tp, pp, replicas or a prefill/decode split, engine limits) of a
  model on up to ``--gpus`` GPUs that best serves a request stream within TTFT/TPOT SLOs
  (:func:`opcast.predict.serve.search.search_serve`); the stream and engine options are those of
  ``opcast predict serve``. When no deployment meets the SLOs, one line on stderr says why (after
  the JSON document, with ``--json``) and the exit code is 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from opcast.cli_common import console, err_console, print_json
from opcast.errors import OpcastError
from opcast.ops import INT_PARAM_LIMIT, whole_number
from opcast.predict.options import (
    ALLOW_STRADDLING,
    ARCH,
    ATTENTION,
    CLOCKS,
    CLUSTER,
    ENGINE_SETTINGS,
    FIX,
    FP8_RECIPE,
    FRAMEWORK,
    GPU,
    GPU_HOUR_PRICE,
    GPUS_PER_NODE,
    JSON,
    KERNEL_SOURCE,
    MAX_MEM,
    MAX_TP,
    MOE_DISPATCHER,
    OBJECTIVE,
    PRECISION,
    SEARCH_CSV,
    SEARCH_GLOBAL_BATCH,
    SEARCH_GPUS,
    SEARCH_OVERLAP,
    SEARCH_P2P_OVERLAP,
    SEARCH_PARAM_GATHER,
    SEARCH_PP_PARTITION,
    SEARCH_SEQ,
    SEARCH_TP_COMM_OVERLAP,
    SERVE,
    SERVE_PARALLEL,
    SET,
    TOP,
    TP_WITHIN_NODE,
    WORKERS,
    Args,
    Opt,
    command,
    device,
    kernel_cost,
    placement,
    serve_stream,
)


class TrainByDefault(TyperGroup):
    """``opcast search``: arguments that start with an option, not a command name, belong to
    ``search train`` (``opcast search --arch ...`` as it always worked); the help shows the commands
    and then ``search train``'s options."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            args = ["train", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        train = self.commands["train"]
        with train.make_context("train", [], parent=ctx, resilient_parsing=True) as sub:
            train.format_help(sub, formatter)


app = typer.Typer(
    cls=TrainByDefault,
    no_args_is_help=True,
    help="Search the best configuration: train (the default: `opcast search --arch ...` is `opcast search "
    "train --arch ...`) or serve. The options of search train follow.",
)


# --------------------------------------------------------------------------- where: --gpu, --cluster, --gpus

OPTIONAL_INT: Any = Optional[int]  # noqa: UP045 -- a runtime value typer builds the option from, as in options.py
OPTIONAL_STR: Any = Optional[str]  # noqa: UP045 -- likewise
SEARCH_GPU = GPU.but(default=None, default_help="the gpu of --cluster")
GPUS_OR_CLUSTER = SEARCH_GPUS.but(type=OPTIONAL_INT, default=None, default_help="the --cluster's nodes x GPUs")
SEARCH_CLUSTER = CLUSTER.but(
    help=CLUSTER.help.replace(
        "--nodes and --gpus-per-node take part of each domain, e.g. gb200-nvl72:2 --gpus-per-node 64 is 128 GPUs",
        "--gpus-per-node takes part of each domain and --gpus at most the GPUs it gives, e.g. gb200-nvl72:2 "
        "--gpus-per-node 64 searches 128 GPUs",
    )
)
"""Search has no --nodes: the GPUs are --gpus, or the cluster's."""


def _where(o: Args) -> tuple[Any, Any, int]:
    """(the :class:`~opcast.predict.options.Placement` of --gpu/--gpus-per-node/--cluster, the device with
    every --set, the GPUs: --gpus, or the cluster's nodes x GPUs per node)."""
    where = placement(o)  # --cluster NAME with --gpus-per-node: the GPUs of each NVLink domain it uses
    if where.gpu is None:
        raise OpcastError("--gpu is required (or a --cluster naming its gpu); see opcast hardware list")
    dev = device(where.gpu, o.set_)
    world = where.nodes * (where.gpus_per_node or dev.gpus_per_node) if where.nodes else None
    gpus = o.gpus if o.gpus is not None else world
    if gpus is None:
        raise OpcastError("--gpus is required (or a --cluster NODESxGPUS or NAME:NODES giving the GPUs)")
    if world is not None and gpus > world:
        raise OpcastError(f"--gpus {gpus} exceeds the {world} GPUs of --cluster {o.cluster}; give at most {world}")
    return where, dev, gpus


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

            self.progress = Progress(
                TextColumn("search: {task.description:9s}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self.progress.start()
        task = self.tasks.get(stage)
        if task is None:
            task = self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(task, completed=done, total=total)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _write_csv(result, path: Path) -> None:
    import csv

    from opcast.atomic import write_atomically, write_failure
    from opcast.errors import OpcastError
    from opcast.predict.search import candidate_row

    rows = [candidate_row(c, rank) for rank, c in enumerate(result.candidates, start=1)]
    fields = list(candidate_row(result.candidates[0], 1)) if rows else ["rank"]

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    try:  # a failed or interrupted write leaves no temp file behind
        write_atomically(path, write)
    except OSError as err:
        raise OpcastError(write_failure("--csv", path, err)) from None


@app.command("train")
@command(
    ARCH,
    SEARCH_GPU,
    GPUS_OR_CLUSTER,
    SEARCH_GLOBAL_BATCH,
    SEARCH_SEQ,
    GPUS_PER_NODE,
    SEARCH_CLUSTER,
    PRECISION,
    FP8_RECIPE,
    MOE_DISPATCHER,
    ATTENTION,
    FRAMEWORK,
    CLOCKS,
    TOP,
    OBJECTIVE,
    MAX_TP,
    TP_WITHIN_NODE,
    MAX_MEM,
    FIX,
    ALLOW_STRADDLING,
    SEARCH_OVERLAP,
    SEARCH_PARAM_GATHER,
    SEARCH_TP_COMM_OVERLAP,
    SEARCH_P2P_OVERLAP,
    SEARCH_PP_PARTITION,
    GPU_HOUR_PRICE,
    WORKERS,
    *KERNEL_SOURCE,
    SET,
    JSON,
    SEARCH_CSV,
    defer_problems=True,
)
def search_cmd(o: Args) -> None:
    """Search every TP/PP/DP/CP/SP, micro-batch, recomputation, ZeRO and schedule combination; rank the feasible ones."""  # noqa: E501 -- the command's one-line help
    from opcast.archs import load_arch
    from opcast.predict.report import print_search
    from opcast.predict.search import SearchSpace, parse_fix, search, search_to_dict, space_problems

    spec = load_arch(o.arch)
    where, dev, gpus = _where(o)
    problems: list[str] = []
    try:
        fixed = parse_fix(o.fix or [])
    except OpcastError as err:
        fixed = {}
        problems.append(str(err))
    problems += o.problems  # the options' own checks (--gpu-hour-price, --models with --roofline)
    space = SearchSpace(
        gpus=gpus,
        gpus_per_node=where.gpus_per_node,
        global_batch=o.global_batch,
        seq=o.seq,
        precision=o.precision,
        fp8_recipe=o.fp8_recipe,
        moe_dispatcher=o.moe_dispatcher,
        attention=o.attention,
        framework=o.framework,
        clocks=o.clocks,
        objective=o.objective,
        max_tp=o.max_tp,
        tp_within_node=o.tp_within_node,
        aligned_groups=not o.allow_straddling,
        max_mem_bytes=None if o.max_mem is None else o.max_mem * 2**30,
        overlap_grad_reduce=o.overlap_grad_reduce,
        overlap_param_gather=o.overlap_param_gather,
        tp_comm_overlap=o.tp_comm_overlap,
        overlap_p2p_comm=o.overlap_p2p_comm,
        pp_partition=o.pp_partition,
        fixed=fixed,
    )
    problems += space_problems(dev, space)
    if problems:  # every problem of the request in one line
        raise OpcastError("; ".join(problems))
    kernels = kernel_cost(o)
    bar = _LazyBar()
    try:
        result = search(
            spec, dev, space, kernels=kernels, top=o.top, workers=o.workers, progress=bar, cluster=where.cluster
        )
    finally:
        bar.close()
    if o.csv is not None:
        _write_csv(result, o.csv)
    if o.as_json:
        print_json(search_to_dict(result))
    elif result.candidates:
        print_search(result, console, o.gpu_hour_price)
    if not result.considered:
        raise OpcastError(
            f"nothing to search: the --fix values leave no configuration on {gpus} GPUs "
            "(tp x pp x cp must divide --gpus, micro_batch the --global-batch, virtual_stages n_layers)"
        )
    if not result.candidates:
        where = " or ".join(f"{n * g}" for n, g in result.worlds)
        raise OpcastError(
            f"nothing fits: none of the {result.considered:,} configurations of {spec.name} on {where} "
            f"x {dev.name} with global batch {o.global_batch} x {o.seq} tokens fits in "
            f"{result.memory_limit_bytes / 2**30:.1f} GiB per GPU; pruned: {result.reasons_summary()}; "
            "try more GPUs, a smaller --global-batch or --seq, or fewer constraints"
        )


# --------------------------------------------------------------------------- search serve


def _int_list(flag: str):
    def check(text: str) -> str | None:
        numbers = [whole_number(t) for t in text.split(",")]
        if any(n is None or n < 1 for n in numbers):
            return f"{flag} {text!r}: give whole numbers >= 1, comma-separated, e.g. 1,2,4"
        if any(n is not None and n >= INT_PARAM_LIMIT for n in numbers):
            return f"{flag} {text!r} is too large: give whole numbers below 2**63"
        return None

    return check


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(whole_number(t) or 0 for t in text.split(","))


def _split_problem(text: str) -> str | None:
    from opcast.predict.serve.search import parse_splits

    try:
        parse_splits(text)
    except OpcastError as err:
        return str(err)
    return None


def _serve_option(name: str) -> Opt:
    return next(s for s in (*SERVE, *SERVE_PARALLEL) if s.name == name)


SERVE_SEARCH = (
    Opt(
        "tp",
        "--tp",
        OPTIONAL_STR,
        "Tensor-parallel degrees to try, comma-separated.",
        None,
        "every divisor of --gpus up to the GPUs per node",
        check=_int_list("--tp"),
    ),
    Opt(
        "pp",
        "--pp",
        OPTIONAL_STR,
        "Pipeline depths to try, comma-separated (in the simulator a pipeline runs one batch at a time: it only "
        "helps a model that does not fit otherwise).",
        None,
        "1",
        check=_int_list("--pp"),
    ),
    Opt(
        "ep",
        "--ep",
        OPTIONAL_STR,
        "Expert-parallel degrees to try for an MoE arch, comma-separated, each a multiple of the tp it goes with "
        "(ep = tp: whole experts on the replica's GPUs; ep = k x tp: over k replicas as attention data-parallel "
        "ranks, with --gpus for a multiple of k replicas).",
        None,
        "1 and each tp (an MoE arch); 1 (dense)",
        check=_int_list("--ep"),
    ),
    Opt(
        "max_num_seqs",
        "--max-num-seqs",
        OPTIONAL_STR,
        "Values of the engine's most sequences per step to try, comma-separated (vLLM: a value above a "
        "--max-num-batched-tokens value is not tried with it).",
        None,
        "128 and the --engine's default",
        check=_int_list("--max-num-seqs"),
    ),
    Opt(
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
        OPTIONAL_STR,
        "Values of the engine's most tokens per step to try, comma-separated.",
        None,
        "2048 and the --engine's default",
        check=_int_list("--max-num-batched-tokens"),
    ),
    Opt(
        "use_all_gpus",
        "--use-all-gpus",
        bool,
        "Only deployments on all --gpus (replicas = GPUs / (tp x pp)); by default every replica count up to it is "
        "tried, so the answer also says how few GPUs the traffic needs.",
        False,
    ),
    Opt(
        "disaggregate",
        "--disaggregate",
        str,
        "Also try disaggregated deployments: P replicas that only prefill and D that only decode, of the same tp x pp "
        "and limits, the prompt's KV sent over the links (as predict serve --disaggregate P:D). auto: every P, D >= 1 "
        "with (P + D) x tp x pp <= --gpus; or the given P:D pairs, comma-separated (e.g. 1:1,1:3); off: colocated "
        "replicas only. Ranked with the colocated ones per GPU used.",
        "off",
        check=_split_problem,
    ),
    Opt(
        "slo_percentile",
        "--slo-percentile",
        int,
        "Percentile of TTFT and TPOT the SLOs bound: 50, 90 or 99.",
        90,
        check=lambda v: None if v in (50, 90, 99) else f"--slo-percentile {v} is not one of 50, 90, 99",
    ),
    OBJECTIVE.but(
        help="Among deployments meeting the SLOs: goodput: most requests/s meeting every SLO per GPU used; "
        "throughput: most output tokens/s per GPU used.",
        default="goodput",
        check=lambda v: (
            None if v in ("goodput", "throughput") else f"--objective {v!r} is not one of goodput, throughput"
        ),
    ),
    TOP.but(help="Deployments meeting the SLOs to list (the best is also shown in full).", default=5),
)
"""``opcast search serve``'s own options: the space and the objective."""
SERVE_STREAM = tuple(
    _serve_option(n)
    for n in (
        "rate",
        "num_requests",
        "input_len",
        "output_len",
        "lengths",
        "trace_file",
        "seed",
        "prefix_cache_hit",
        "slo_ttft_s",
        "slo_tpot_s",
        "engine",
        "router",
        *ENGINE_SETTINGS,
        "precision",
        "kv_dtype",
        "attention",
        "tensor_cores",
        "engine_version",
        "fusions",
        "mxfp4_moe",
        "moe_dispatcher",
    )
)
"""The request stream, SLOs, engine and numerics, as ``opcast predict serve`` takes them."""


@app.command("serve")
@command(
    ARCH,
    SEARCH_GPU,
    GPUS_OR_CLUSTER,
    GPUS_PER_NODE,
    SEARCH_CLUSTER,
    *SERVE_SEARCH,
    *SERVE_STREAM,
    *KERNEL_SOURCE,
    SET,
    JSON,
)
def search_serve_cmd(o: Args) -> None:
    """The serving deployment (tp, pp, replicas or a prefill/decode split, engine batch limits) with the most goodput (or output tokens/s) per GPU within TTFT/TPOT SLOs, every candidate simulated on the same requests."""  # noqa: E501 -- the command's one-line help
    from opcast.archs import load_arch
    from opcast.predict.serve.search import ServeSpace, search_serve, search_serve_to_dict, space_problems

    spec = load_arch(o.arch)
    where, dev, gpus = _where(o)
    space = ServeSpace(
        gpus=gpus,
        gpus_per_node=where.gpus_per_node,
        engine=o.engine,
        precision=o.precision,
        attention=o.attention,
        tensor_cores=o.tensor_cores,
        moe_dispatcher=o.moe_dispatcher,
        kv_dtype=o.kv_dtype,
        engine_version=o.engine_version,
        fusions=o.fusions,
        mxfp4_moe=o.mxfp4_moe,
        tp=_ints(o.tp),
        pp=_ints(o.pp),
        ep=_ints(o.ep),
        max_num_seqs=_ints(o.max_num_seqs),
        max_num_batched_tokens=_ints(o.max_num_batched_tokens),
        use_all_gpus=o.use_all_gpus,
        disaggregate=o.disaggregate,
        engine_overrides={n: getattr(o, n) for n in ENGINE_SETTINGS if getattr(o, n) is not None},
        router=o.router,
        slo_ttft_s=o.slo_ttft_s,
        slo_tpot_s=o.slo_tpot_s,
        slo_percentile=o.slo_percentile,
        objective=o.objective,
    )
    problems = space_problems(space)
    if problems:
        raise OpcastError("; ".join(problems))
    # the KV block size is not searched: every candidate's prefix-cache hits are in the same blocks
    from opcast.predict.serve.engine import engine_config

    stream = serve_stream(o, engine_config(o.engine, dev, block_size=o.block_size))
    kernels = kernel_cost(o)
    result = search_serve(spec, dev, space, stream, kernels=kernels, comms=where.comms(kernels))
    if o.as_json:
        print_json(search_serve_to_dict(result))
    elif result.ranked:
        _print_serve_search(result, o.top)
    if not result.ranked:
        raise OpcastError(_none_meets(result))


def _slo_text(space) -> str:
    p = space.slo_percentile
    parts = [
        f"{name} p{p} <= {v * 1e3:g} ms"
        for name, v in (("TTFT", space.slo_ttft_s), ("TPOT", space.slo_tpot_s))
        if v is not None
    ]
    return " and ".join(parts) or "no SLO"


def _has_slo(space) -> bool:
    return space.slo_ttft_s is not None or space.slo_tpot_s is not None


def _none_meets(result) -> str:
    s = result.space
    n = len(result.ranked) + len(result.others)
    infeasible = [e for e in result.others if e.status == "infeasible"]
    misses = n - len(infeasible)
    first = f" (e.g. {infeasible[0].deployment.describe()}: {infeasible[0].reason})" if infeasible else ""
    if not _has_slo(s):  # nothing to miss: every deployment did not fit ('meets no SLO', 'looser SLOs' said before)
        return (
            f"no deployment of {result.arch.name} on up to {s.gpus} x {result.device.name} fits for "
            f"{result.stream.source}: none of {n} deployments fits{first}; try more --gpus or shorter requests"
        )
    return (
        f"no deployment of {result.arch.name} on up to {s.gpus} x {result.device.name} meets {_slo_text(s)} for "
        f"{result.stream.source}: of {n} deployments, {misses} miss the SLOs and {len(infeasible)} do not fit"
        f"{first}; try more --gpus, a lower --rate, shorter requests or looser SLOs"
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _print_serve_search(result, top: int) -> None:
    from rich.table import Table

    from opcast.predict.serve.report import print_serve

    s, p = result.space, result.space.slo_percentile
    unit = "goodput/GPU, req/s" if s.objective == "goodput" else "tokens/s/GPU"
    console.print(
        f"{result.arch.name} on up to {s.gpus} x {result.device.name}, {s.engine}, {result.stream.source} "
        f"({len(result.stream):,} requests, the same for every deployment); {_slo_text(s)}; objective: {s.objective} "
        "per GPU used",
        markup=False,
        highlight=False,
    )
    which = "meeting the SLOs" if _has_slo(s) else "that fit (no SLO)"
    table = Table(title=f"top {min(top, len(result.ranked))} of {len(result.ranked)} deployments {which}")
    columns = ("#", "GPUs", "replicas x tp x pp", "ep", "max seqs", "max tokens", f"TTFT p{p} ms", f"TPOT p{p} ms")
    for col in (*columns, unit, "SLO met"):
        table.add_column(col, justify="right")
    for rank, e in enumerate(result.ranked[:top], start=1):
        d, m = e.deployment, e.metrics
        table.add_row(
            str(rank),
            str(d.gpus),
            f"{f'{d.prefill}P+{d.decode}D' if d.prefill else d.replicas} x {d.tp} x {d.pp}",
            str(d.ep),
            str(d.max_num_seqs),
            str(d.max_num_batched_tokens),
            _ms(getattr(m.ttft, f"p{p}_s")),
            _ms(getattr(m.tpot, f"p{p}_s")),
            f"{e.value:,.2f}" if s.objective == "goodput" else f"{e.value:,.0f}",
            "-" if m.slo_attainment is None else f"{m.slo_attainment:.1%}",
        )
    console.print(table)
    counts = {k: result.count(k) for k in ("misses_slo", "slo_certain_miss", "outranked", "infeasible")}
    sec = result.seconds
    slo_counts = (
        f"{len(result.ranked)} meet the SLOs, {counts['misses_slo'] + counts['slo_certain_miss']} miss them "
        f"({counts['slo_certain_miss']} stopped early), "
        if _has_slo(s)
        else f"{len(result.ranked)} fit (no SLO to meet), "
    )
    console.print(
        f"{len(result.ranked) + len(result.others)} deployments: {slo_counts}"
        f"{counts['outranked']} cannot beat the best (stopped or skipped), {counts['infeasible']} do not fit; "
        f"{result.tables} step tables, {result.steps:,} steps simulated in {sec['total']:.1f} s",
        markup=False,
        highlight=False,
        style="dim",
    )
    console.print("best deployment:", markup=False, highlight=False)
    print_serve(result.best, console)
