"""``opcast search``: the fastest (or cheapest, or leanest) parallel configuration that fits.

Thin, as every command: parse -> :class:`~opcast.predict.search.SearchSpace` -> :func:`search` ->
a rich table (:func:`opcast.predict.report.print_search`), ``--json`` or ``--csv``. The options are
those of ``opcast predict train`` where they mean the same (:mod:`opcast.predict.options`),
``--set`` and ``--analytic`` included. When nothing fits, the reasons summary goes to stderr in
one line (after the JSON document, with ``--json``) and the exit code is 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from opcast.cli_common import console, err_console, print_json
from opcast.predict.options import (
    ALLOW_STRADDLING,
    ARCH,
    ATTENTION,
    FIX,
    GPU,
    GPU_HOUR_PRICE,
    GPUS_PER_NODE,
    JSON,
    KERNEL_SOURCE,
    MAX_MEM,
    MAX_TP,
    OBJECTIVE,
    PRECISION,
    SEARCH_CSV,
    SEARCH_GLOBAL_BATCH,
    SEARCH_GPUS,
    SEARCH_OVERLAP,
    SEARCH_SEQ,
    SET,
    TOP,
    TP_WITHIN_NODE,
    WORKERS,
    Args,
    command,
    device,
    kernel_cost,
)


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

    from opcast.atomic import write_atomically
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
        raise OpcastError(
            f"cannot write {path}: {err.strerror or err}; free space or choose a writable --csv"
        ) from None


@command(
    ARCH,
    GPU,
    SEARCH_GPUS,
    SEARCH_GLOBAL_BATCH,
    SEARCH_SEQ,
    GPUS_PER_NODE,
    PRECISION,
    ATTENTION,
    TOP,
    OBJECTIVE,
    MAX_TP,
    TP_WITHIN_NODE,
    MAX_MEM,
    FIX,
    ALLOW_STRADDLING,
    SEARCH_OVERLAP,
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
    from opcast.errors import OpcastError
    from opcast.predict.report import print_search
    from opcast.predict.search import SearchSpace, parse_fix, search, search_to_dict, space_problems

    spec = load_arch(o.arch)
    dev = device(o.gpu, o.set_)
    problems: list[str] = []
    try:
        fixed = parse_fix(o.fix or [])
    except OpcastError as err:
        fixed = {}
        problems.append(str(err))
    problems += o.problems  # the options' own checks (--gpu-hour-price, --models with --roofline)
    space = SearchSpace(
        gpus=o.gpus,
        gpus_per_node=o.gpus_per_node,
        global_batch=o.global_batch,
        seq=o.seq,
        precision=o.precision,
        attention=o.attention,
        objective=o.objective,
        max_tp=o.max_tp,
        tp_within_node=o.tp_within_node,
        aligned_groups=not o.allow_straddling,
        max_mem_bytes=None if o.max_mem is None else o.max_mem * 2**30,
        overlap_grad_reduce=o.overlap_grad_reduce,
        fixed=fixed,
    )
    problems += space_problems(dev, space)
    if problems:  # every problem of the request in one line
        raise OpcastError("; ".join(problems))
    kernels = kernel_cost(o)
    bar = _LazyBar()
    try:
        result = search(spec, dev, space, kernels=kernels, top=o.top, workers=o.workers, progress=bar)
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
            f"nothing to search: the --fix values leave no configuration on {o.gpus} GPUs "
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
