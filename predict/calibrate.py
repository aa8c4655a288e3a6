"""``opcast calibrate``: fit kernel models for this machine and show what they change.

One command chains the three stages on the local device, inside a time budget:

1. ``validate`` every check (an arch at a batch and sequence length) with the embedded default
   models: the error *before*;
2. ``collect bench`` (:func:`opcast.collect.bench.run_bench`) of the op kinds and the precision the
   archs need: first the exact shapes the prediction of every workload queries (its forward ops
   and the gradient GEMMs of backward), then seeded Sobol samples of every kind until the budget
   is spent, so the learned models also see the shapes around them;
3. ``train fit`` (:func:`opcast.train.fit.fit_model_set`) on that data together with the datasets
   shipped in ``data/datasets`` and any ``datasets`` given, into ``OUT/<name>/``;
4. ``validate`` the checks again with the new models: the error *after*.

Collection gets the budget the other stages leave: the validations before are timed, the ones
after are assumed to take as long, and the fit is given :data:`FIT_SHARE` of the budget (at least
:data:`FIT_MIN_S`). ``OUT`` keeps everything: ``data/`` (the measurements; re-running the same
command resumes them, as ``collect bench`` does), ``archs/`` (the archs as preset JSON, which
``collect bench --arch`` reads), ``<name>/`` (the model set; ``--models OUT`` selects it) and
``calibrate.json`` (the report). Ctrl-C during collection stops after the current point and keeps
what was measured; the validations before are cached in ``validate-before.json``, so a re-run
does not repeat them. Every validation and the collection run in fresh processes
(:mod:`opcast.predict.isolated`): what one leaves in the allocator must not speed up the next.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from opcast.archs import ArchSpec
from opcast.errors import OpcastError
from opcast.predict.validate import CHECK_ARCHS, PRECISIONS, ValidateReport, arch_file, resolve_arch, run_validate

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
"""Collection runs at least this long, even when the validations leave less of the budget."""
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
    (:data:`~opcast.predict.validate.CHECK_ARCHS`)."""
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
    """train fit's estimator: xgb (fast), tile-mlp or auto."""
    steps: int = 3
    """Timed steps of each validation."""
    warmup: int = 1
    seed: int = 0


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
    fit_groups: tuple[FitGroup, ...] = ()
    fit_skipped: dict[str, str] = field(default_factory=dict)
    checks: tuple[ArchCheck, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("device", "models", "data", "budget_s", "seconds", "rows_collected",
                                             "rows_total", "points_remaining", "interrupted")}
        out["datasets"] = list(self.datasets)
        out["fit_groups"] = [asdict(g) for g in self.fit_groups]
        out["fit_skipped"] = dict(self.fit_skipped)
        out["checks"] = [{"arch": c.arch, "before": c.before.to_dict() if c.before else None,
                          "after": c.after.to_dict() if c.after else None} for c in self.checks]
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


def _shapes(arch_paths: Sequence[Path], batch_seq: Sequence[tuple[int, int]]) -> list[tuple[str, dict[str, Any]]]:
    from opcast.collect.sampling import arch_shapes
    from opcast.ops import get_op

    return [(op, get_op(op).validate(p)) for op, p in arch_shapes([str(a) for a in arch_paths], (1,), batch_seq=batch_seq)]


def max_point_s(arch_paths: Sequence[Path], batch_seq: Sequence[tuple[int, int]], precision: str, spec,
                device_type: str) -> float:
    """The longest one-call roofline estimate among the arch shapes (x1.2), at least collect's
    default 0.05 s and at most :data:`MAX_POINT_CAP_S`: every shape validate queries is measured."""
    from opcast.collect.sampling import roofline_s
    from opcast.ops import get_op

    worst = max((roofline_s(op, p, precision, str(d), spec, device_type)
                 for op, p in _shapes(arch_paths, batch_seq) for d in get_op(op).directions(p)), default=0.0)
    return min(MAX_POINT_CAP_S, max(0.05, 1.2 * worst))


def mem_fraction(arch_paths: Sequence[Path], batch_seq: Sequence[tuple[int, int]], precision: str, device) -> float:
    """``collect bench``'s ``max_mem_fraction`` for a calibration: room for the largest arch shape
    (x1.5, at least :data:`MIN_POINT_BYTES`) and no more, at most collect's default 0.25. Sampled
    points far larger than anything validated mostly cost the time of filling their tensors with
    random numbers (seconds each on a CPU); above the ceiling the learned models extrapolate on
    log(time / roofline), i.e. at constant utilisation."""
    import os

    from opcast.collect.sampling import footprint_bytes

    need = max((footprint_bytes(op, p, precision) for op, p in _shapes(arch_paths, batch_seq)), default=0.0)
    if device.type == "cuda":
        import torch

        free = float(torch.cuda.mem_get_info(device)[0])
    else:
        try:
            free = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            return 0.25
    return min(0.25, max(MIN_POINT_BYTES, 1.5 * need) / free) if free > 0 else 0.25


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


def _check_config(cfg: CalibrateConfig) -> None:
    if isinstance(cfg.budget_s, bool) or not isinstance(cfg.budget_s, (int, float)) or not cfg.budget_s > 0:
        raise OpcastError(f"--budget-s must be a positive number of seconds, got {cfg.budget_s!r}")
    _positive_ints("--batch", cfg.batches)
    _positive_ints("--seq", cfg.seqs)
    for w in (*cfg.workloads, *(cfg.checks or ())):
        _positive_ints("a workload's batch and seq", (w.batch, w.seq))
    if cfg.precision not in PRECISIONS:
        raise OpcastError(f"--precision {cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    if not cfg.name or "/" in cfg.name or cfg.name.startswith(".") or cfg.name in ("data", "archs"):
        raise OpcastError(f"--name {cfg.name!r} must be a plain folder name other than data and archs")
    for d in cfg.datasets:
        if not Path(d).exists():
            raise OpcastError(f"--datasets {d} does not exist; give a dataset folder or .parquet file")


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
    return json.dumps({"arch": asdict(w.arch), "batch": w.batch, "seq": w.seq, "precision": cfg.precision,  # type: ignore[call-overload]
                       "attention": cfg.attention, "device": device, "steps": cfg.steps, "warmup": cfg.warmup},
                      sort_keys=True)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
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


class _Collected:
    rows = 0
    remaining = 0
    interrupted = False


def run_calibrate(cfg: CalibrateConfig, *, log: Callable[[str], None] | None = None, progress: Any = None) -> CalibrateReport:
    """Validate, collect, fit, validate; see the module docstring."""
    import os

    from opcast.collect.bench import BenchConfig, build_plan
    from opcast.collect.timing import TimingBudget
    from opcast.hardware import describe_local
    from opcast.predict.isolated import in_fresh_process
    from opcast.predict.validate import check_inputs, local_env, torch_device
    from opcast.train.fit import FitConfig, fit_model_set

    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    _check_config(cfg)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OpcastError("opcast calibrate runs on one device; start it without torchrun")
    dev = torch_device(cfg.device, local_env())
    measured, checks = plan_workloads(cfg)
    for w in (*measured, *checks):
        check_inputs(w.arch, w.batch, w.seq, cfg.precision, cfg.attention, cfg.steps, cfg.warmup, dev.type)  # type: ignore[arg-type]
    spec = describe_local("cpu" if dev.type == "cpu" else f"cuda:{dev.index}")
    out = Path(cfg.out)
    data, arch_dir = out / "data", out / "archs"
    archs = list({w.arch.name: w.arch for w in measured}.values())  # type: ignore[union-attr]
    try:
        paths = {a.name: arch_file(a, arch_dir) for a in archs}
    except OSError as err:
        raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
    extra = [Path(d) for d in cfg.datasets]
    shipped = default_datasets()
    notes: list[str] = []
    seconds: dict[str, float] = {}
    device = str(dev)

    def validate(w: Workload, models: Path | None, label: str) -> ValidateReport | None:
        say(f"validate {w.arch.name} ({label}): batch {w.batch} x seq {w.seq}, {cfg.steps} steps")  # type: ignore[union-attr]
        try:
            return in_fresh_process(run_validate, w.arch, batch=w.batch, seq=w.seq, precision=cfg.precision,
                                    device=device, steps=cfg.steps, warmup=cfg.warmup, attention=cfg.attention,
                                    models=models)
        except OpcastError as err:
            notes.append(f"validate {w.arch.name} {label}: {err}")  # type: ignore[union-attr]
            return None

    # 1. before, with the embedded default models (cached across re-runs)
    t = time.monotonic()
    cache_path = out / BEFORE_CACHE
    cache = _read_cache(cache_path)
    before: list[ValidateReport | None] = []
    cached_s = 0.0
    for w in checks:
        key = _cache_key(w, cfg, spec.name)
        hit = cache.get(key)
        if isinstance(hit, dict) and "report" in hit:
            before.append(ValidateReport.from_dict(hit["report"]))
            cached_s += float(hit.get("seconds", 0.0))
            say(f"validate {w.arch.name} (before): cached in {cache_path.name}")  # type: ignore[union-attr]
            continue
        t1 = time.monotonic()
        r = validate(w, None, "before")
        before.append(r)
        if r is not None:
            cache[key] = {"report": r.to_dict(), "seconds": time.monotonic() - t1}
            _write_json(cache_path, cache)
    seconds["validate_before"] = time.monotonic() - t
    after_reserve = seconds["validate_before"] + cached_s

    # 2. collect: the workloads' exact shapes (arch points only), then Sobol samples
    fit_reserve = max(FIT_MIN_S, FIT_SHARE * cfg.budget_s)
    collect_s = cfg.budget_s - (time.monotonic() - t0) - fit_reserve - after_reserve
    if collect_s < COLLECT_MIN_S:
        notes.append(f"the budget leaves {collect_s:.0f} s for collection after the validations and the fit; "
                     f"collected for {COLLECT_MIN_S:.0f} s (raise --budget-s)")
        collect_s = COLLECT_MIN_S
    all_pairs = sorted({(w.batch, w.seq) for w in measured})
    all_paths = list(paths.values())
    base = BenchConfig(out=data, device=device, ops=needed_ops(archs), dtypes=(cfg.precision,), tp_degrees=(1,),
                       arch_first=True, seed=cfg.seed,
                       max_point_s=max_point_s(all_paths, all_pairs, cfg.precision, spec, dev.type),
                       max_mem_fraction=mem_fraction(all_paths, all_pairs, cfg.precision, dev),
                       timing=TimingBudget(warmup_s=0.025, rep_s=0.1, min_reps=3))
    say(f"collect on {spec.name}: {', '.join(base.ops)} in {cfg.precision} for up to {collect_s:.0f} s, first the "
        f"shapes of {len(measured)} workload(s) of {', '.join(a.name for a in archs)}")
    t = time.monotonic()
    deadline = t + collect_s
    got = _Collected()
    runs = []
    for pair in all_pairs:  # one arch-only run per (batch, seq): samples = its arch points
        names = sorted({w.arch.name for w in measured if (w.batch, w.seq) == pair})  # type: ignore[union-attr]
        runs.append(replace(base, archs=tuple(str(paths[n]) for n in names), arch_batch_seq=(pair,)))
    runs.append(base)  # the Sobol samples of every kind
    for run in runs:
        left = deadline - time.monotonic()
        if left <= 1.0:
            break
        if run.archs:
            n = sum(1 for p in build_plan(run, spec, dev).points if p.stratum == "arch")
            run = replace(run, samples=n, budget_s=left)
        else:
            run = replace(run, budget_s=left)
        result = in_fresh_process(bench_with_progress, run, forward_sigint=True)
        got.rows += result.rows_written
        got.remaining += result.remaining
        if result.interrupted:
            got.interrupted = True
            break
    seconds["collect"] = time.monotonic() - t
    rows_total = _rows(data)
    datasets = [*([data] if rows_total else []), *shipped, *extra]
    common = dict(device=spec.name, data=str(data), budget_s=float(cfg.budget_s), rows_collected=got.rows,
                  rows_total=rows_total, points_remaining=got.remaining, datasets=tuple(str(d) for d in datasets))
    if got.interrupted:
        seconds["total"] = time.monotonic() - t0
        report = CalibrateReport(models=None, seconds=seconds, interrupted=True, notes=tuple(notes),
                                 checks=tuple(ArchCheck(arch=w.arch.name, before=b, after=None)  # type: ignore[union-attr]
                                              for w, b in zip(checks, before)), **common)
        _write_json(out / REPORT, report.to_dict())
        return report

    # 3. fit
    if not datasets:
        raise OpcastError(f"nothing was measured in {collect_s:.0f} s, too few to fit any op group; re-run the same "
                          f"command to collect more (kept in {data}), or raise --budget-s")
    if not shipped:
        notes.append("data/datasets holds no dataset: fitted on this machine's measurements" + (" and --datasets" if extra else ""))
    say(f"fit {cfg.estimator} predictors on {rows_total} local rows"
        + (f" and {len(datasets) - 1} more dataset(s)" if len(datasets) > 1 else ""))
    t = time.monotonic()
    fit_cfg = FitConfig(estimator=cfg.estimator, seed=cfg.seed, n_jobs=FIT_JOBS, min_rows=FIT_MIN_ROWS)  # type: ignore[arg-type]
    command = " ".join(["opcast calibrate --device", cfg.device, "--budget-s", f"{cfg.budget_s:g}", "--out", str(out)])
    try:
        fitted = fit_model_set(datasets, out, name=cfg.name, cfg=fit_cfg, progress=progress, command=command)
    except OpcastError as err:
        if "no op group could be fitted" not in str(err) and "no parquet files found" not in str(err):
            raise
        raise OpcastError(f"the {rows_total} rows measured so far are too few to fit any op group (each needs "
                          f"{fit_cfg.min_rows}); re-run the same command to collect more (kept in {data}), "
                          "or raise --budget-s") from None
    seconds["fit"] = time.monotonic() - t
    groups = tuple(FitGroup(group=str(r["group"]), rows=int(r["rows"]), estimator=str(r["estimator"]),
                            held_out_mape=_float_or_none(r.get("held_out_mape")))
                   for r in fitted.groups.to_dict("records"))

    # 4. after, with the new models
    t = time.monotonic()
    after = [validate(w, fitted.path, "after") for w in checks]
    seconds["validate_after"] = time.monotonic() - t
    seconds["total"] = time.monotonic() - t0
    report = CalibrateReport(models=str(fitted.path), seconds=seconds, interrupted=False, fit_groups=groups,
                             fit_skipped=dict(fitted.skipped), notes=tuple(notes),
                             checks=tuple(ArchCheck(arch=w.arch.name, before=b, after=a)  # type: ignore[union-attr]
                                          for w, b, a in zip(checks, before, after)), **common)
    _write_json(out / REPORT, report.to_dict())
    return report


def _float_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None
