"""``opcast calibrate``: fit kernel models for this machine and show what they change.

One command chains the three stages on the local device, inside a time budget:

1. ``validate`` every check (an arch at a batch and sequence length) with the embedded default
   models: the error *before*;
2. ``collect bench`` (:func:`opcast.collect.bench.run_bench`) of the op kinds and the precision the
   archs need (or the kinds ``ops`` names, ``--op``): first the exact shapes the prediction of every
   workload queries (its forward ops and the gradient GEMMs of backward), then seeded Sobol samples of
   every kind until the budget is spent, so the learned models also see the shapes around them;
3. ``train fit`` (:func:`opcast.train.fit.fit_model_set`) on that data together with the datasets
   shipped in ``data/datasets`` and any ``datasets`` given, into ``OUT/<name>/``;
4. ``validate`` the checks again with the new models: the error *after*.

The budget is a hard bound on wall time. Every stage runs in a fresh process with a deadline
(:func:`opcast.check.isolated.in_fresh_process` stops it when the deadline passes): the
validations before get at most :data:`VALIDATE_SHARE` of the budget, the ones after are assumed to
take as long as those before did, the fit is given :data:`FIT_SHARE` (at least :data:`FIT_MIN_S`),
and collection gets what is left (its own budget ends :data:`WIND_DOWN_S` early, so it writes its
rows in time). When too little is left, the validations after are dropped first, then collection;
whatever was done is kept and the report says what the budget cut. A budget spent before any
model set was fitted is a failure (exit 2) that says how to continue.

Noise (:mod:`opcast.check.calibrate_noise`): the load average before any work and fixed anchor
shapes timed at the start (re-measured once when noisy) must say the machine is quiet, else the
calibration is refused; after collection the anchors are timed again, and drift or a wide spread
of the collected repetitions fails the calibration, with the noisy rows moved to ``OUT/noisy/`` so
that a re-run measures them again. The fitted set is written to ``OUT/.staging/`` and installed as
``OUT/<name>/`` only when the 90 % interval of every check and measured workload is narrower than
:attr:`~opcast.check.calibrate_noise.NoiseRules.max_interval_ratio`; a wider one fails the
calibration and the set goes to ``OUT/rejected/<name>/`` (a good set from an earlier run stays).
``allow_busy`` (``--allow-busy``) keeps going on a busy machine and turns these failures into notes.

``OUT`` keeps everything: ``data/`` (the measurements; re-running the same
command resumes them, as ``collect bench`` does), ``archs/`` (the archs as preset JSON, which
``collect bench --arch`` reads), ``<name>/`` (the model set; ``--models OUT`` selects it) and
``calibrate.json`` (the report). Ctrl-C during collection stops after the current point and keeps
what was measured; the validations before are cached in ``validate-before.json``, so a re-run
does not repeat them. Every validation and the collection run in fresh processes
(:mod:`opcast.check.isolated`): what one leaves in the allocator must not speed up the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from opcast.archs import ArchSpec
from opcast.check.calibrate_noise import ANCHOR_SHAPES, AnchorTiming, Verdict, assess, interval_reason, load_average
from opcast.check.validate import CHECK_ARCHS, PRECISIONS, ValidateReport, arch_file, resolve_arch, run_validate
from opcast.errors import OpcastError

MAX_BUDGET_S = 7 * 24 * 3600.0
"""Longest --budget-s: a week (the default is 14 minutes); 1e300 s passed the check and, after the
anchors and a validation, overflowed the stage deadline (an internal error)."""
FIT_SHARE = 0.08
"""Share of the budget reserved for ``train fit`` (xgboost on a few thousand rows: tens of seconds)."""
FIT_MIN_S = 10.0
FIT_JOBS = 1
"""xgboost threads in the fit. The groups are small (hundreds of rows), where threads buy nothing,
and on a machine shared with other work every parallel region of a boosting round waits for a
descheduled thread: two threads made one 31-row fit 85x slower (166 s vs 1.9 s) on the 2-core box."""
FIT_MIN_ROWS = 15
"""Fewest rows of an op group the fit accepts (train fit's default is 30). A calibration's groups
start with the exact shapes the checks query, so a short budget with 15 rows per group, those
shapes among them, prices them better than the roofline fallback the group would get instead."""
COLLECT_MIN_S = 20.0
"""When the budget leaves collection less than this, the validations after are dropped to give it more."""
COLLECT_SKIP_S = 5.0
"""With less than this left for collection it is skipped (the fit uses the rows already there)."""
VALIDATE_SHARE = 0.25
"""Most of the budget the validations before may use together (one that would pass it is stopped)."""
WIND_DOWN_S = 3.0
"""collect's own budget ends this long before its stage's deadline, so that it writes its rows in time."""
MIN_BUDGET_S = FIT_MIN_S + COLLECT_SKIP_S
"""Shortest --budget-s (15 s): the fit keeps :data:`FIT_MIN_S` and collection, skipped with less than
:data:`COLLECT_SKIP_S` beside it (:func:`plan_stages`), gets nothing in a shorter budget, whatever the machine;
--budget-s 0.001 or 1 measured nothing and failed only after start-up (seconds, torch imported, archs/ and
calibrate.json written into --out) with 'the budget was spent before a model set could be fitted'."""
ANCHOR_MAX_S = 60.0
"""Most seconds one anchor measurement (a fresh process: start-up, two shapes) may take."""
NOISY_DIR = "noisy"
REJECTED_DIR = "rejected"
STAGING_DIR = ".staging"
MAX_POINT_CAP_S = 2.0
"""The longest one-call roofline estimate a calibration point may have (the arch shapes set it, up to this)."""
MIN_POINT_BYTES = 512 * 2**20
"""A calibration point may always use this much memory (see :func:`mem_fraction`)."""
DEFAULT_SEQS = (256, 512, 1024)
REPORT = "calibrate.json"
BEFORE_CACHE = "validate-before.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """An arch trained at one batch size and sequence length."""

    arch: ArchSpec | str
    batch: int
    seq: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrateConfig:
    """What ``opcast calibrate`` was asked to do."""

    out: Path
    """Folder for data/, archs/, the model set <name>/ and calibrate.json."""
    device: str = "cpu"
    """cpu | cuda | cuda:N."""
    budget_s: float = 840.0
    """Seconds for the whole calibration (roughly: collection takes what the other stages leave, and
    the point in progress and the validations after may overrun it a little; 14 minutes keeps the
    issue's 15-minute target)."""
    archs: tuple[ArchSpec | str, ...] = ()
    """Archs whose shapes are measured at every batch x seq; empty: the check archs
    (:data:`~opcast.check.validate.CHECK_ARCHS`)."""
    ops: tuple[str, ...] = ()
    """Op kinds to measure (``collect bench --op``'s names and checks), e.g. ``("gemm",)`` to spend the
    budget on GEMMs alone; empty: every kind the archs' training step prices (:func:`needed_ops`)."""
    batches: tuple[int, ...] = (1,)
    """Batch sizes of the arch shapes (the first is validated)."""
    seqs: tuple[int, ...] = DEFAULT_SEQS
    """Sequence lengths of the arch shapes (the shortest is validated)."""
    workloads: tuple[Workload, ...] = ()
    """Explicit (arch, batch, seq) to measure, instead of archs x batches x seqs."""
    validate_archs: tuple[ArchSpec | str, ...] = ()
    """Archs validated before and after at the first batch and the shortest seq; empty: ``archs``."""
    checks: tuple[Workload, ...] | None = None
    """Explicit validations instead (``()``: none)."""
    datasets: tuple[Path, ...] = ()
    """More datasets to fit on, besides the collected data and data/datasets."""
    precision: str = "fp32"
    attention: str = "flash"
    name: str = "calibrated"
    """Name of the model set (its folder under ``out``)."""
    estimator: str = "xgb"
    """train fit's estimator: xgb (fast), tile-mlp, hier, neusight, blend or auto."""
    steps: int = 3
    """Timed steps of each validation."""
    warmup: int = 1
    seed: int = 0
    allow_busy: bool = False
    """Calibrate even when the machine is busy or the timings are noisy (the report says so, and an
    interval wider than the threshold is a note instead of a failure)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchCheck:
    """One check validated before and after."""

    arch: str
    before: ValidateReport | None
    after: ValidateReport | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FitGroup:
    """One fitted predictor."""

    group: str
    rows: int
    estimator: str
    held_out_mape: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrateReport:
    """What a calibration did, and the validation error before and after."""

    device: str
    models: str | None
    """The model set written (None when collection was interrupted before fitting)."""
    data: str
    budget_s: float
    seconds: dict[str, float]
    """Wall seconds per stage: validate_before, collect, fit, validate_after, total."""
    rows_collected: int
    """Rows measured by this run."""
    rows_total: int
    """Rows of the local dataset after it."""
    points_remaining: int
    """Planned points not measured yet (a re-run continues with them)."""
    interrupted: bool
    datasets: tuple[str, ...]
    signal: str | None = None
    """SIGINT or SIGTERM when a signal stopped the collection (``interrupted``)."""
    fit_groups: tuple[FitGroup, ...] = ()
    fit_skipped: dict[str, str] = field(default_factory=dict)
    checks: tuple[ArchCheck, ...] = ()
    notes: tuple[str, ...] = ()
    noise: dict[str, Any] = field(default_factory=dict)
    """What the noise rules saw: load, anchors at the start and the end, their verdicts."""
    intervals: tuple[dict[str, Any], ...] = ()
    """The 90 % interval of each check's and measured workload's predicted step with the fitted models."""
    budget_cut: tuple[str, ...] = ()
    """What the budget cut short (stages skipped or stopped)."""
    failure: str | None = None
    """Why the calibration failed (busy machine, noisy timings, too wide an interval, the budget
    spent before a fit); None when it produced a model set."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k)
            for k in (
                "device",
                "models",
                "data",
                "budget_s",
                "seconds",
                "rows_collected",
                "rows_total",
                "points_remaining",
                "interrupted",
                "signal",
                "failure",
            )
        }
        out["budget_cut"] = list(self.budget_cut)
        out["noise"] = dict(self.noise)
        out["intervals"] = [dict(i) for i in self.intervals]
        out["datasets"] = list(self.datasets)
        out["fit_groups"] = [asdict(g) for g in self.fit_groups]
        out["fit_skipped"] = dict(self.fit_skipped)
        out["checks"] = [
            {
                "arch": c.arch,
                "before": c.before.to_dict() if c.before else None,
                "after": c.after.to_dict() if c.after else None,
            }
            for c in self.checks
        ]
        out["notes"] = list(self.notes)
        return out


# --------------------------------------------------------------------------- planning


def needed_ops(archs: Sequence[ArchSpec]) -> tuple[str, ...]:
    """Op kinds the training graph of ``archs`` prices (eager attention is measured whole, so
    softmax is not needed)."""
    ops = {"gemm", "attention", "elementwise", "embedding", "cross_entropy", "optimizer"}
    ops |= {a.norm for a in archs}
    if any(a.position == "rope" for a in archs):
        ops.add("rope")
    return tuple(sorted(ops))


def _shapes(
    arch_paths: Sequence[Path], batch_seq: Sequence[tuple[int, int]], ops: Sequence[str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The arch shapes (of the kinds ``ops``; None: all) as validated parameters."""
    from opcast.collect.sampling import arch_shapes
    from opcast.ops import get_op

    return [
        (op, get_op(op).validate(p))
        for op, p in arch_shapes([str(a) for a in arch_paths], (1,), batch_seq=batch_seq)
        if ops is None or op in ops
    ]


def max_point_s(
    arch_paths: Sequence[Path],
    batch_seq: Sequence[tuple[int, int]],
    precision: str,
    spec,
    device_type: str,
    ops: Sequence[str] | None = None,
    max_bytes: float | None = None,
) -> float:
    """The longest one-call roofline estimate among the arch shapes (x1.2), at least collect's
    default 0.05 s and at most :data:`MAX_POINT_CAP_S`: every shape validate queries is measured.
    Shapes over ``max_bytes`` (collection's memory budget) are never measured, so they do not count:
    a --batch 100000000 beside --batch 1 raised the ceiling to the cap, and the Sobol samples, admitted
    up to 2 s a call, measured a handful of rows instead of hundreds."""
    from opcast.collect.sampling import footprint_bytes, roofline_s
    from opcast.ops import get_op

    worst = max(
        (
            roofline_s(op, p, precision, str(d), spec, device_type)
            for op, p in _shapes(arch_paths, batch_seq, ops)
            if max_bytes is None or footprint_bytes(op, p, precision) <= max_bytes
            for d in get_op(op).directions(p)
        ),
        default=0.0,
    )
    return min(MAX_POINT_CAP_S, max(0.05, 1.2 * worst))


def mem_fraction(
    arch_paths: Sequence[Path],
    batch_seq: Sequence[tuple[int, int]],
    precision: str,
    device,
    ops: Sequence[str] | None = None,
) -> float:
    """``collect bench``'s ``max_mem_fraction`` for a calibration: room for the largest arch shape
    (x1.5, at least :data:`MIN_POINT_BYTES`) and no more, at most collect's default 0.25. Sampled
    points far larger than anything validated mostly cost the time of filling their tensors with
    random numbers (seconds each on a CPU); above the ceiling the learned models extrapolate on
    log(time / roofline), i.e. at constant utilisation."""

    from opcast.collect.sampling import footprint_bytes

    need = max((footprint_bytes(op, p, precision) for op, p in _shapes(arch_paths, batch_seq, ops)), default=0.0)
    free = free_bytes(device)
    return min(0.25, max(MIN_POINT_BYTES, 1.5 * need) / free) if free else 0.25


def free_bytes(device) -> float | None:
    """Free memory of ``device`` as collect bench sees it (the GPU's, or the host's available pages), or
    None where it cannot be told."""
    if device.type == "cuda":
        import torch

        return float(torch.cuda.mem_get_info(device)[0])
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return None


def default_datasets() -> list[Path]:
    """``data/datasets`` when it holds any parquet file."""
    from opcast.paths import data_path
    from opcast.schema import dataset_files

    folder = data_path("datasets")
    return [folder] if folder.is_dir() and dataset_files(folder) else []


def _rows(folder: Path) -> int:
    import pyarrow.parquet as pq

    from opcast.schema import dataset_files

    return sum(pq.ParquetFile(f).metadata.num_rows for f in dataset_files(folder)) if folder.is_dir() else 0


def _positive_ints(label: str, values: Sequence[object]) -> None:
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise OpcastError(f"{label} takes positive integers, got {list(values)!r}")


def fit_config(cfg: CalibrateConfig) -> Any:
    """The :class:`~opcast.train.fit.FitConfig` of a calibration (it checks the estimator name)."""
    from opcast.train.fit import FitConfig

    return FitConfig(estimator=cfg.estimator, seed=cfg.seed, n_jobs=FIT_JOBS, min_rows=FIT_MIN_ROWS)  # type: ignore[arg-type]


def _check_out(out: Path, name: str) -> None:
    """``out`` must be (or become) a folder whose data/, archs/, report and model set can be written."""
    from opcast.train.artifacts import check_output

    check_output(out, name)  # out a file, out/name a file or a non-set folder, an unwritable parent
    for sub, kind in (
        ("data", "folder"),
        ("archs", "folder"),
        (NOISY_DIR, "folder"),
        (REJECTED_DIR, "folder"),
        (STAGING_DIR, "folder"),
        (REPORT, "file"),
        (BEFORE_CACHE, "file"),
    ):
        p = out / sub
        if p.exists() and (p.is_dir() if kind == "file" else not p.is_dir()):
            raise OpcastError(
                f"{p} exists and is not a {kind}; calibrate writes its {sub} there, so choose another "
                "--out (or move it away)"
            )


def _check_config(cfg: CalibrateConfig) -> None:
    """Every option, before any work (a bad one must not cost a calibration first)."""
    import math

    if (
        isinstance(cfg.budget_s, bool)
        or not isinstance(cfg.budget_s, (int, float))
        or not (math.isfinite(cfg.budget_s) and 0 < cfg.budget_s <= MAX_BUDGET_S)
    ):
        raise OpcastError(
            f"--budget-s takes a finite number of seconds > 0 and at most {MAX_BUDGET_S:.0f} (a week), "
            f"got {cfg.budget_s!r}"
        )
    if cfg.budget_s < MIN_BUDGET_S:
        raise OpcastError(
            f"--budget-s {cfg.budget_s:g} is below {MIN_BUDGET_S:g} s, the least in which calibrate can measure "
            f"anything (the fit keeps {FIT_MIN_S:g} s and collection needs {COLLECT_SKIP_S:g} s beside it); "
            f"give --budget-s {MIN_BUDGET_S:g} or more"
        )
    if isinstance(cfg.steps, bool) or not isinstance(cfg.steps, int) or cfg.steps < 1:
        raise OpcastError(f"--steps must be an integer >= 1, got {cfg.steps!r}")
    if isinstance(cfg.warmup, bool) or not isinstance(cfg.warmup, int) or cfg.warmup < 0:
        raise OpcastError(f"warmup must be an integer >= 0, got {cfg.warmup!r}")
    if cfg.attention not in ("flash", "eager"):
        raise OpcastError(f"--attention {cfg.attention!r} is not one of flash, eager")
    text = str(cfg.device).strip().lower()
    if not (text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit())):
        raise OpcastError(f"unknown --device {cfg.device!r}; use cpu, cuda or cuda:N")
    fit_config(cfg)
    from opcast.collect.sampling import check_bench_ops

    check_bench_ops(cfg.ops)  # collect bench's own check of its --op
    _positive_ints("--batch", cfg.batches)
    _positive_ints("--seq", cfg.seqs)
    for w in (*cfg.workloads, *(cfg.checks or ())):
        _positive_ints("a workload's batch and seq", (w.batch, w.seq))
    if cfg.precision not in PRECISIONS:
        raise OpcastError(f"--precision {cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    own = (
        "data",
        "archs",
        NOISY_DIR,
        REJECTED_DIR,
        REPORT,
        BEFORE_CACHE,
    )  # --name noisy: noisy parts went into the set
    if not cfg.name or "/" in cfg.name or cfg.name.startswith(".") or cfg.name in own:
        raise OpcastError(
            f"--name {cfg.name!r} must be a plain folder name other than calibrate's own {', '.join(own)}"
        )
    from opcast.schema import check_dataset

    for d in cfg.datasets:
        if not Path(d).exists():
            raise OpcastError(f"--datasets {d} does not exist; give a dataset folder or .parquet file")
        check_dataset(d)  # read by the fit, after the collection: a device, a CSV or another table fails now
    _check_out(Path(cfg.out), cfg.name)


def plan_workloads(cfg: CalibrateConfig) -> tuple[list[Workload], list[Workload]]:
    """(measured, validated) workloads with resolved archs."""
    if cfg.workloads:
        measured = [replace(w, arch=resolve_arch(w.arch)) for w in cfg.workloads]
    else:
        archs = [resolve_arch(a) for a in (cfg.archs or tuple(CHECK_ARCHS.values()))]
        measured = [Workload(arch=a, batch=b, seq=s) for a in archs for b in cfg.batches for s in cfg.seqs]
    if cfg.checks is not None:
        checks = [replace(w, arch=resolve_arch(w.arch)) for w in cfg.checks]
    else:
        names = cfg.validate_archs or cfg.archs or tuple(CHECK_ARCHS.values())
        checks = [Workload(arch=resolve_arch(a), batch=cfg.batches[0], seq=min(cfg.seqs)) for a in names]
    return measured, checks


# --------------------------------------------------------------------------- before-cache


def _cache_key(w: Workload, cfg: CalibrateConfig, device: str) -> str:
    return json.dumps(
        {
            "arch": asdict(w.arch),  # type: ignore[arg-type]  # resolved by plan_workloads
            "batch": w.batch,
            "seq": w.seq,
            "precision": cfg.precision,
            "attention": cfg.attention,
            "device": device,
            "steps": cfg.steps,
            "warmup": cfg.warmup,
        },
        sort_keys=True,
    )


def _read_cache(path: Path) -> dict[str, Any]:
    """The before-cache, or {} (validated again) where it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    # not JSON text (ValueError: invalid, binary, or an integer of thousands of digits), or too deep
    except (OSError, ValueError, RecursionError):
        return {}


def _write_json(path: Path, payload: Any) -> None:
    from opcast.collect.io import write_json_atomic

    write_json_atomic(path, payload)


# --------------------------------------------------------------------------- the chain


def bench_with_progress(cfg: Any) -> Any:
    """``run_bench(cfg)`` with a progress bar on stderr when it is a terminal (for a fresh process)."""
    from opcast.cli_common import progress_bar
    from opcast.collect.bench import run_bench

    with progress_bar() as bar:
        return run_bench(cfg, progress=bar)


def fit_with_progress(datasets: Sequence[Path], out: Path, name: str, cfg: Any, command: str) -> Any:
    """``fit_model_set`` with a progress bar on stderr when it is a terminal (for a fresh process)."""
    from opcast.cli_common import progress_bar
    from opcast.train.fit import fit_model_set

    with progress_bar() as bar:
        return fit_model_set(datasets, out, name=name, cfg=cfg, progress=bar, command=command)


def measure_anchors(device: str) -> tuple[AnchorTiming, ...]:
    """Time the anchor shapes of ``device`` (:data:`~opcast.check.calibrate_noise.ANCHOR_SHAPES`),
    with collect's timing (for a fresh process)."""
    import torch

    from opcast.collect.local_device import describe_local
    from opcast.collect.ops import BUILDERS, BuildRequest
    from opcast.collect.timing import TimingBudget, measure_cpu, measure_cuda
    from opcast.ops import get_op

    dev = torch.device(device)
    if dev.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(cores)  # as collect bench times with one rank
    budget = TimingBudget(warmup_s=0.05, rep_s=0.25, min_reps=10)
    l2 = describe_local(str(dev)).l2_bytes
    out = []
    for label, (op, params) in ANCHOR_SHAPES[dev.type].items():
        fn = BUILDERS[op](BuildRequest(params=get_op(op).validate(params), dtype="fp32", direction="fwd", device=dev))
        if dev.type == "cuda":
            stats = measure_cuda(fn, device=dev, l2_bytes=l2, budget=budget, use_graphs=False)
        else:
            stats = measure_cpu(fn, budget, flush_bytes=2 * l2)
        out.append(
            AnchorTiming(name=label, median_s=stats.time_s_median, p20_s=stats.time_s_p20, p80_s=stats.time_s_p80)
        )
    return tuple(out)


class Budget:
    """The wall-time budget of one calibration, on ``clock`` (a fake one in tests)."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = float(total_s)
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.total_s - self.elapsed()


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """Seconds for the stages after the validations before, out of what the budget has left."""

    collect_s: float
    """0: collection is skipped."""
    fit_s: float
    after_s: float
    """Reserved for the validations after; 0: they are dropped."""


def plan_stages(left_s: float, *, budget_s: float, after_s: float, anchors_s: float) -> StagePlan:
    """Split ``left_s``: the fit keeps :data:`FIT_SHARE` of the budget (at least :data:`FIT_MIN_S`),
    the validations after ``after_s`` (as long as those before took), the anchors at the end
    ``anchors_s``, collection the rest. Short of :data:`COLLECT_MIN_S` for collection, the
    validations after are dropped; short of :data:`COLLECT_SKIP_S`, collection is skipped."""
    left_s = max(0.0, left_s)
    fit_s = min(left_s, max(FIT_MIN_S, FIT_SHARE * budget_s))
    collect_s = left_s - fit_s - after_s - anchors_s
    if collect_s < COLLECT_MIN_S:
        after_s = 0.0
        collect_s = left_s - fit_s - anchors_s
    if collect_s < COLLECT_SKIP_S:
        collect_s = 0.0
    return StagePlan(collect_s=max(0.0, collect_s), fit_s=fit_s, after_s=after_s)


def _part_files(data: Path, run_ids: Sequence[str]) -> list[Path]:
    parts = data / "bench"
    if not parts.is_dir() or not run_ids:
        return []
    return sorted(p for p in parts.glob("*.parquet") if any(f"-{r}-" in p.name for r in run_ids))


def _row_spreads(files: Sequence[Path]) -> list[tuple[float, float]]:
    """(p20, p80) of every row in ``files``."""
    import pyarrow.parquet as pq

    out: list[tuple[float, float]] = []
    for f in files:
        t = pq.read_table(f, columns=["time_s_p20", "time_s_p80"]).to_pydict()
        out += list(zip(t["time_s_p20"], t["time_s_p80"]))
    return out


def _move_all(files: Sequence[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        os.replace(f, dest / f.name)


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # absent, or not empty: left as it is
        folder.rmdir()


def check_intervals(models: Path, checks: Sequence[Workload], spec: Any, cfg: CalibrateConfig) -> list[dict[str, Any]]:
    """The 90 % interval of the predicted step of every workload in ``checks`` with ``models`` (no
    measurement): the validated checks and the measured workloads, whose shapes the set was fitted on."""
    from opcast.check.validate import predict_step
    from opcast.predict.cost import load_kernel_cost

    cost = load_kernel_cost(models)
    out = []
    for w in checks:
        result = predict_step(
            w.arch,
            spec,
            batch=w.batch,
            seq=w.seq,
            precision=cfg.precision,  # type: ignore[arg-type]
            attention=cfg.attention,
            world=1,
            kernels=cost,
        )
        interval = getattr(result, "iteration_time_interval_s", None)
        if interval is not None:
            lo, hi = (float(x) for x in interval)
            out.append(
                {
                    "arch": w.arch.name,  # type: ignore[union-attr]
                    "batch": w.batch,
                    "seq": w.seq,
                    "predicted_s": float(result.iteration_time_s),
                    "low_s": lo,
                    "high_s": hi,
                }
            )
    return out


def _check_checks_fit(checks: Sequence[Workload], spec: Any, cfg: CalibrateConfig) -> None:
    """Every validated check must fit the device's memory by the prediction with the embedded models,
    as :func:`~opcast.check.validate.run_validate` requires: --batch 100000000 failed both validations
    on memory only after a whole collection and fit had been spent in between."""
    from opcast.check.validate import check_fits, predict_step
    from opcast.predict.cost import load_kernel_cost

    cost = load_kernel_cost(None)
    for w in checks:
        result = predict_step(
            w.arch,  # type: ignore[arg-type]  # resolved by plan_workloads
            spec,
            batch=w.batch,
            seq=w.seq,
            precision=cfg.precision,
            attention=cfg.attention,
            world=1,
            kernels=cost,
        )
        check_fits(
            result,
            w.arch,  # type: ignore[arg-type]
            spec,
            batch=w.batch,
            seq=w.seq,
            precision=cfg.precision,
            fix="give a smaller first --batch or shortest --seq (they are validated), or another --validate-arch",
        )


class _Collected:
    rows = 0
    remaining = 0
    interrupted = False
    signal: str | None = None


def run_calibrate(
    cfg: CalibrateConfig,
    *,
    log: Callable[[str], None] | None = None,
    progress: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> CalibrateReport:
    """Validate, collect, fit, validate; see the module docstring. ``clock`` times the budget."""
    from opcast.check import isolated
    from opcast.check.validate import check_inputs, check_on_device, device_type, local_env, torch_device

    say = log or (lambda _msg: None)
    budget = Budget(cfg.budget_s, clock)
    _check_config(cfg)
    if local_env().world > 1:
        raise OpcastError("opcast calibrate runs on one device; start it without torchrun")
    measured, checks = plan_workloads(cfg)
    device_type(cfg.device)
    for w in (*measured, *checks):  # every input checked before torch is imported (torch_device)
        check_inputs(w.arch, w.batch, w.seq, cfg.precision, cfg.attention, cfg.steps, cfg.warmup)  # type: ignore[arg-type]
    dev = torch_device(cfg.device, local_env())
    check_on_device(dev.type, cfg.precision, cfg.attention)  # once the device is known to exist
    fit_cfg = fit_config(cfg)
    load = load_average() if dev.type == "cpu" else None  # before any of our own work
    from opcast.collect.bench import BenchConfig, build_plan
    from opcast.collect.local_device import describe_local
    from opcast.collect.timing import TimingBudget

    spec = describe_local("cpu" if dev.type == "cpu" else f"cuda:{dev.index}")
    _check_checks_fit(checks, spec, cfg)  # before any measurement: a check that cannot fit would only be noted
    out = Path(cfg.out)
    data, arch_dir = out / "data", out / "archs"
    # plan_workloads resolved every arch name to its ArchSpec
    archs = cast("list[ArchSpec]", list({w.arch.name: w.arch for w in measured}.values()))  # type: ignore[union-attr]
    try:
        paths = {a.name: arch_file(a, arch_dir) for a in archs}
    except OSError as err:
        raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
    extra = [Path(d) for d in cfg.datasets]
    shipped = default_datasets()
    notes: list[str] = []
    cut: list[str] = []
    seconds: dict[str, float] = {}
    noise: dict[str, Any] = {"load": list(load) if load else None}
    device = str(dev)
    got = _Collected()
    before: list[ValidateReport | None] = [None] * len(checks)
    after: list[ValidateReport | None] = [None] * len(checks)
    intervals: list[dict[str, Any]] = []

    def report(
        models: str | None,
        failure: str | None = None,
        groups: tuple[FitGroup, ...] = (),
        skipped: dict[str, str] | None = None,
    ) -> CalibrateReport:
        seconds["total"] = budget.elapsed()
        rows_total = _rows(data)
        r = CalibrateReport(
            device=spec.name,
            models=models,
            data=str(data),
            budget_s=float(cfg.budget_s),
            seconds=seconds,
            rows_collected=got.rows,
            rows_total=rows_total,
            points_remaining=got.remaining,
            interrupted=got.interrupted,
            signal=got.signal,
            datasets=tuple(str(d) for d in ([data] if rows_total else []) + shipped + extra),
            fit_groups=groups,
            fit_skipped=dict(skipped or {}),
            notes=tuple(notes),
            noise=noise,
            intervals=tuple(intervals),
            budget_cut=tuple(cut),
            failure=failure,
            checks=tuple(
                ArchCheck(arch=w.arch.name, before=b, after=a)  # type: ignore[union-attr]
                for w, b, a in zip(checks, before, after)
            ),
        )
        _write_json(out / REPORT, r.to_dict())
        return r

    def spent(stage: str) -> CalibrateReport:
        """The budget ran out before a model set was fitted."""
        rows = _rows(data)
        return report(
            None,
            f"the --budget-s {cfg.budget_s:g} s budget was spent before a model set could be fitted "
            f"({'; '.join(cut) or stage}); the {rows} measured rows are kept in {data}: re-run the same "
            "command to continue, or raise --budget-s",
        )

    def anchors(label: str, limit_s: float = ANCHOR_MAX_S) -> tuple[AnchorTiming, ...] | None:
        left = min(ANCHOR_MAX_S, limit_s, budget.left())
        if left <= 1.0:
            cut.append(f"anchors ({label}) skipped: no budget left")
            return None
        say(f"anchors ({label}): timing {', '.join(ANCHOR_SHAPES[dev.type])}")
        try:
            return isolated.in_fresh_process(measure_anchors, device, timeout_s=left)
        except isolated.Overran:
            cut.append(f"anchors ({label}) stopped after {left:.0f} s")
            return None

    def refuse_or_note(verdict: Verdict, what: str) -> str | None:
        if not verdict.noisy:
            return None
        if cfg.allow_busy:
            notes.append(f"{what} ({verdict.message()}); kept because of --allow-busy")
            return None
        return verdict.message()

    # 0. is the machine quiet? (load before any work, anchors; re-measured once when noisy)
    t = budget.clock()
    start = anchors("start")
    verdict = assess(load=load, anchors=start or ())
    if verdict.noisy and not cfg.allow_busy:
        say(f"noisy timings ({verdict.message()}): measuring the anchors again")
        start = anchors("start, again") or start
        load = load_average() if dev.type == "cpu" else None
        verdict = assess(load=load, anchors=start or ())
    noise.update(start=[a.to_dict() for a in start or ()], start_verdict=verdict.to_dict())
    seconds["anchors_start"] = budget.clock() - t
    why = refuse_or_note(verdict, "the machine was busy at the start")
    if why:
        return report(
            None,
            f"the machine is busy ({why}): calibrate times this machine's kernels and would fit the "
            "other work's noise; stop other work (or pin calibrate to free cores with taskset -c) and "
            "re-run, or pass --allow-busy to calibrate anyway",
        )

    # 1. before, with the embedded default models (cached across re-runs; together at most VALIDATE_SHARE)
    def validate(w: Workload, models: Path | None, label: str, limit_s: float) -> ValidateReport | None:
        if limit_s <= 1.0:
            cut.append(f"validate {w.arch.name} ({label}) skipped: no budget left")  # type: ignore[union-attr]
            return None
        say(f"validate {w.arch.name} ({label}): batch {w.batch} x seq {w.seq}, {cfg.steps} steps")  # type: ignore[union-attr]
        try:
            return isolated.in_fresh_process(
                run_validate,
                w.arch,
                batch=w.batch,
                seq=w.seq,
                precision=cfg.precision,
                device=device,
                steps=cfg.steps,
                warmup=cfg.warmup,
                attention=cfg.attention,
                models=models,
                timeout_s=limit_s,
            )
        except isolated.Overran:
            cut.append(f"validate {w.arch.name} ({label}) stopped at its {limit_s:.0f} s share of the budget")  # type: ignore[union-attr]
        except OpcastError as err:
            notes.append(f"validate {w.arch.name} {label}: {err}")  # type: ignore[union-attr]
        return None

    t = budget.clock()
    cache_path = out / BEFORE_CACHE
    cache = _read_cache(cache_path)
    cached_s = 0.0
    share_end = t + VALIDATE_SHARE * cfg.budget_s
    for i, w in enumerate(checks):
        key = _cache_key(w, cfg, spec.name)
        hit = cache.get(key)
        if isinstance(hit, dict) and "report" in hit:
            before[i] = ValidateReport.from_dict(hit["report"])
            cached_s += float(hit.get("seconds", 0.0))
            say(f"validate {w.arch.name} (before): cached in {cache_path.name}")  # type: ignore[union-attr]
            continue
        t1 = budget.clock()
        before[i] = validate(w, None, "before", min(share_end - t1, budget.left()))
        if before[i] is not None:
            cache[key] = {"report": before[i].to_dict(), "seconds": budget.clock() - t1}  # type: ignore[union-attr]
            _write_json(cache_path, cache)
    seconds["validate_before"] = budget.clock() - t
    before_s = seconds["validate_before"] + cached_s

    # 2. collect: the workloads' exact shapes (arch points only), then Sobol samples
    stages = plan_stages(budget.left(), budget_s=cfg.budget_s, after_s=before_s, anchors_s=seconds["anchors_start"])
    if not stages.after_s and checks:
        cut.append("validations after dropped: the budget leaves too little to collect otherwise")
    all_pairs = sorted({(w.batch, w.seq) for w in measured})
    all_paths = list(paths.values())
    ops = tuple(dict.fromkeys(cfg.ops)) or needed_ops(archs)
    mem_share = mem_fraction(all_paths, all_pairs, cfg.precision, dev, ops)
    free = free_bytes(dev)
    base = BenchConfig(
        out=data,
        device=device,
        ops=ops,
        dtypes=(cfg.precision,),
        tp_degrees=(1,),
        arch_first=True,
        seed=cfg.seed,
        max_point_s=max_point_s(
            all_paths, all_pairs, cfg.precision, spec, dev.type, ops, max_bytes=mem_share * free if free else None
        ),
        max_mem_fraction=mem_share,
        timing=TimingBudget(warmup_s=0.025, rep_s=0.1, min_reps=3),
    )
    t = budget.clock()
    run_ids: list[str] = []
    if stages.collect_s <= 0:
        cut.append("collection skipped: no budget left for it")
    else:
        say(
            f"collect on {spec.name}: {', '.join(base.ops)} in {cfg.precision} for up to {stages.collect_s:.0f} s, "
            f"first the shapes of {len(measured)} workload(s) of {', '.join(a.name for a in archs)}"
        )
        deadline = t + stages.collect_s
        runs = []
        for pair in all_pairs:  # one arch-only run per (batch, seq): samples = its arch points
            names = sorted({w.arch.name for w in measured if (w.batch, w.seq) == pair})  # type: ignore[union-attr]
            runs.append(replace(base, archs=tuple(str(paths[n]) for n in names), arch_batch_seq=(pair,)))
        runs.append(base)  # the Sobol samples of every kind
        for run in runs:
            left = deadline - budget.clock()
            if left <= WIND_DOWN_S + 1.0:
                cut.append(f"collection stopped at its {stages.collect_s:.0f} s share of the budget")
                break
            own = left - WIND_DOWN_S
            if run.archs:
                n = sum(1 for p in build_plan(run, spec, dev).points if p.stratum == "arch")
                run = replace(run, samples=n, budget_s=own)
            else:
                run = replace(run, budget_s=own)
            try:
                result = isolated.in_fresh_process(bench_with_progress, run, forward_sigint=True, timeout_s=left)
            except isolated.Overran as late:
                cut.append(f"collection stopped at its {stages.collect_s:.0f} s share of the budget")
                if late.value is not None:
                    got.rows += late.value.rows_written
                    got.remaining += late.value.remaining
                    run_ids.append(late.value.run_id)
                break
            got.rows += result.rows_written
            got.remaining += result.remaining
            run_ids.append(result.run_id)
            if result.interrupted:
                got.interrupted, got.signal = True, result.signal
                break
    seconds["collect"] = budget.clock() - t
    if got.interrupted:
        return report(None)

    # 3. the anchors again, and the spread of what was collected: a machine that got busy fails
    if got.rows:
        t = budget.clock()
        # as long as the start's took (twice, for slack), never from the fit's share
        end = anchors("end", min(2 * seconds["anchors_start"], budget.left() - stages.fit_s)) if start else None
        new_parts = _part_files(data, run_ids)
        verdict = assess(anchors=end or (), start_anchors=start if end else None, rows=_row_spreads(new_parts))
        noise.update(end=[a.to_dict() for a in end or ()], end_verdict=verdict.to_dict())
        seconds["anchors_end"] = budget.clock() - t
        why = refuse_or_note(verdict, "the timings were noisy")
        if why:
            _move_all(new_parts, out / NOISY_DIR)
            got.rows = 0
            return report(
                None,
                f"the timings were noisy ({why}): the machine got busy while calibrating; the "
                f"{len(new_parts)} part(s) this run measured are moved to {out / NOISY_DIR} and a re-run "
                "measures them again; calibrate on a quiet machine (stop other work, or pin it to free "
                "cores with taskset -c), or pass --allow-busy to fit them anyway",
            )

    # 4. fit, into OUT/.staging: installed as OUT/<name> only when its intervals are narrow enough
    rows_total = _rows(data)
    datasets = [*([data] if rows_total else []), *shipped, *extra]
    if not datasets:
        if cut:
            return spent("collection")
        raise OpcastError(
            f"nothing was measured in {seconds['collect']:.0f} s, too few to fit any op group; re-run the "
            f"same command to collect more (kept in {data}), or raise --budget-s"
        )
    if not shipped:
        notes.append(
            "data/datasets holds no dataset: fitted on this machine's measurements"
            + (" and --datasets" if extra else "")
        )
    fit_s = budget.left() - stages.after_s
    if fit_s < FIT_MIN_S:  # the validations after give way to the fit
        fit_s = budget.left()
    if fit_s <= 1.0:
        cut.append("fit skipped: no budget left")
        return spent("fit")
    say(
        f"fit {cfg.estimator} predictors on {rows_total} local rows"
        + (f" and {len(datasets) - 1} more dataset(s)" if len(datasets) > 1 else "")
        + f" (up to {fit_s:.0f} s)"
    )
    t = budget.clock()
    command = " ".join(["opcast calibrate --device", cfg.device, "--budget-s", f"{cfg.budget_s:g}", "--out", str(out)])
    staging = out / STAGING_DIR
    try:
        fitted = isolated.in_fresh_process(
            fit_with_progress, datasets, staging, cfg.name, fit_cfg, command, timeout_s=fit_s
        )
    except isolated.Overran:
        seconds["fit"] = budget.clock() - t
        cut.append(f"fit stopped after {fit_s:.0f} s")
        return spent("fit")
    except OpcastError as err:
        if "no op group could be fitted" not in str(err) and "no parquet files found" not in str(err):
            raise
        raise OpcastError(
            f"the {rows_total} rows measured so far are too few to fit any op group (each needs "
            f"{fit_cfg.min_rows}); re-run the same command to collect more (kept in {data}), "
            "or raise --budget-s"
        ) from None
    seconds["fit"] = budget.clock() - t
    groups = tuple(
        FitGroup(
            group=str(r["group"]),
            rows=int(r["rows"]),
            estimator=str(r["estimator"]),
            held_out_mape=_float_or_none(r.get("held_out_mape")),
        )
        for r in fitted.groups.to_dict("records")
    )
    judged = list({(w.arch.name, w.batch, w.seq): w for w in (*checks, *measured)}.values())  # type: ignore[union-attr]
    intervals.extend(check_intervals(fitted.path, judged, spec, cfg))
    wide = [
        why
        for i in intervals
        if (why := interval_reason(f"{i['arch']} (batch {i['batch']} x seq {i['seq']})", i["low_s"], i["high_s"]))
    ]
    if wide and not cfg.allow_busy:
        rejected = out / REJECTED_DIR / cfg.name
        import shutil

        shutil.rmtree(rejected, ignore_errors=True)
        rejected.parent.mkdir(parents=True, exist_ok=True)
        os.replace(fitted.path, rejected)
        _remove_empty(staging)
        return report(
            None,
            f"calibration failed: {wide[0]}{f' (and {len(wide) - 1} more)' if len(wide) > 1 else ''}; "
            f"models that uncertain are no result, so they are set aside in {rejected}; the usual cause "
            "is a busy machine or too few rows: re-run on a quiet machine (the measured rows are kept) or "
            "raise --budget-s",
            groups,
            dict(fitted.skipped),
        )
    if wide:
        notes.append("; ".join(wide) + "; kept because of --allow-busy")
    from opcast.train.artifacts import install_set

    final = out / cfg.name
    install_set(fitted.path, final)  # the old set back on failure
    _remove_empty(staging)

    # 5. after, with the new models
    t = budget.clock()
    if stages.after_s:
        for i, w in enumerate(checks):
            after[i] = validate(w, final, "after", budget.left())
    seconds["validate_after"] = budget.clock() - t
    if cut:
        notes.append(f"the --budget-s {cfg.budget_s:g} s budget cut: {'; '.join(cut)}")
    return report(str(final), None, groups, dict(fitted.skipped))


def _float_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None
