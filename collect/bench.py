"""``opcast collect bench``: run the measurement plan on the local device.

Sharded by rank and world size (``torchrun`` or SLURM environment), so one plan spreads over
every GPU of a node or cluster; each rank appends its own parquet parts, merged on read.
Resumable: points already in the output folder (same device) are skipped. One writer per rank
and folder: a second ``collect bench`` on the same ``--out`` is refused (:class:`WriterLock`).

Stopping: Ctrl-C (SIGINT) and SIGTERM (a SLURM time limit, ``timeout``, ``docker stop``, torchrun
tearing down the job) abandon the point being measured at its next repetition (it is measured
again on resume), write every measured row and record the run as interrupted, with the signal,
in run.json; a second signal also aborts a call that is still running, and still writes every
row. The time budget is a hard bound checked between repetitions too. A full disk stops the run
the same way, keeping every part already written.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcast.collect.io import PartWriter, WriterLock, done_point_ids, failure_text, finish_run
from opcast.collect.local_device import describe_local
from opcast.collect.sampling import DeviceLimits, Plan, PlanPoint, check_bench_ops, check_tp_degrees, make_plan
from opcast.collect.signals import StopSignals
from opcast.collect.timing import (
    MAX_POINT_BUDGET_S,
    PROTOCOLS,
    Abandoned,
    TimingBudget,
    measure_cpu,
    measure_cuda,
    measure_neusight,
    protocol_of,
)
from opcast.dtypes import BLOCK_SCALED_DTYPES, DTYPE_BYTES, DTYPES
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec

DEFAULT_TIMING = TimingBudget()
"""Default warm-up and repetition budgets (frozen, so one shared instance is safe)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchConfig:
    """Everything ``collect bench`` was asked to do."""

    out: Path
    """Dataset folder (parts go to out/bench/)."""
    device: str = "cpu"
    """cpu | cuda | cuda:N (under torchrun, cuda means cuda:LOCAL_RANK)."""
    ops: tuple[str, ...] = ()
    """Op kinds; empty = every compute kind."""
    dtypes: tuple[str, ...] = ()
    """Precisions; empty = fp32, fp16, bf16."""
    archs: tuple[str, ...] = ()
    """Archs whose exact shapes join the plan."""
    tp_degrees: tuple[int, ...] = (1, 2, 4, 8)
    """TP degrees for the arch shapes (each where the arch can take it)."""
    tp_given: bool = False
    """``tp_degrees`` came from the user: each must suit one of ``archs`` (:func:`check_tp_degrees`)."""
    arch_batch_seq: tuple[tuple[int, int], ...] = ()
    """(batch, seq) pairs of the arch shapes; empty: batch 1 and 4 at min(max_seq, 4096)."""
    arch_first: bool = False
    """Measure the arch shapes before the sampled points instead of interleaving them."""
    samples: int | None = None
    """Total planned points (split evenly across strata); None with a time budget."""
    budget_s: float | None = None
    """Stop after this many seconds (resume continues)."""
    seed: int = 0
    """Plan seed."""
    max_point_s: float = 0.05
    """Skip points whose roofline time of one call is above this."""
    max_mem_fraction: float = 0.25
    """Largest share of device memory one point may use."""
    timing: TimingBudget = DEFAULT_TIMING
    """Warm-up and repetition budgets."""
    cuda_graphs: bool = True
    """Time sub-10 us CUDA ops inside CUDA graphs."""
    protocol: str = "opcast"
    """How each point is timed: ``opcast`` (budgets, cold L2, graphs: :func:`measure_cuda`) or
    ``neusight`` (NeuSight's rule, :func:`measure_neusight`, so the rows can join its published ones).
    A point timed by the other protocol in the same folder is measured again, not taken as done."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise OpcastError(f"--timing takes {' or '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.samples is not None and not 0 <= self.samples <= MAX_SAMPLES:
            raise OpcastError(
                f"--samples takes 1 to {MAX_SAMPLES} points, got {self.samples}; "
                "split a larger plan over runs with other --seed values"
            )
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise OpcastError(
                f"--budget-s takes a finite number of seconds > 0, got {self.budget_s}; "
                "omit it to run without a time limit"
            )
        if not (math.isfinite(self.max_point_s) and 0 < self.max_point_s <= MAX_POINT_BUDGET_S):
            raise OpcastError(
                f"--max-point-s takes seconds per call, > 0 and at most {MAX_POINT_BUDGET_S:.0f}, "
                f"got {self.max_point_s}"
            )
        if not (math.isfinite(self.max_mem_fraction) and 0 < self.max_mem_fraction <= 1):
            raise OpcastError(f"--max-mem-fraction takes a share of free memory in (0, 1], got {self.max_mem_fraction}")
        if not self.tp_degrees or min(self.tp_degrees) < 1:
            raise OpcastError(f"--tp takes positive integers, got {self.tp_degrees}")
        check_bench_ops(self.ops)  # before the --out folder is made: a typo leaves nothing behind
        if self.tp_given:
            check_tp_degrees(self.archs, self.tp_degrees)


MAX_SAMPLES = 1_000_000
"""Most points one run may plan."""


@dataclass(kw_only=True, slots=True)
class BenchResult:
    """What a bench run did."""

    rows_written: int = 0
    already_done: int = 0
    remaining: int = 0
    planned: int = 0
    interrupted: bool = False
    skipped_in_plan: Counter = field(default_factory=Counter)
    skipped_at_run: Counter = field(default_factory=Counter)
    device: str = ""
    run_id: str = ""
    signal: str | None = None
    """SIGINT or SIGTERM when a signal stopped the run."""


def env_int(*names: str, default: int, minimum: int) -> int:
    """The first of the environment variables ``names`` that is set, as an integer >= ``minimum``
    (``default`` when none is); anything else is an :class:`OpcastError` naming the variable."""
    for name in names:
        text = os.environ.get(name)
        if text is None:
            continue
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise OpcastError(
                f"{name}={text!r} in the environment is not an integer >= {minimum}; "
                f"unset it or launch with torchrun/srun, which set it"
            )
        return value
    return default


def rank_and_world() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, ranks on this host) from the torchrun or SLURM environment;
    (0, 1, 0, 1) alone."""
    rank = env_int("RANK", "SLURM_PROCID", default=0, minimum=0)
    world = env_int("WORLD_SIZE", "SLURM_NTASKS", default=1, minimum=1)
    local = env_int("LOCAL_RANK", "SLURM_LOCALID", default=0, minimum=0)
    local_world = env_int("LOCAL_WORLD_SIZE", default=1, minimum=1)
    if not 0 <= rank < world:
        raise OpcastError(f"rank {rank} is outside world size {world}; check RANK/WORLD_SIZE")
    return rank, world, local, local_world


def resolve_device(device: str, local_rank: int):
    """The torch device to run on, checked to exist."""
    import torch

    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise OpcastError(
                f"--device {device}: no CUDA device is visible (torch {torch.__version__}); use --device cpu"
            )
        index = int(device.split(":", 1)[1]) if ":" in device else local_rank
        if index >= torch.cuda.device_count():
            raise OpcastError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    raise OpcastError(f"unknown --device {device!r}; use cpu, cuda or cuda:N")


def check_dtypes(dtypes: tuple[str, ...], device) -> None:
    """Refuse precisions the device lacks, naming the fix."""
    for dtype in dtypes:
        if dtype in BLOCK_SCALED_DTYPES:
            raise OpcastError(
                f"dtype {dtype} is replay-only for now (opcast collect replay aiconfigurator); "
                f"collect bench measures {', '.join(DTYPE_BYTES)}: drop --dtype {dtype}"
            )
    import torch

    for dtype in dtypes:
        if dtype not in DTYPES:
            raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        if device.type == "cpu" and dtype in ("fp8", "tf32"):
            raise OpcastError(f"dtype {dtype} is not available on the CPU; use fp32, bf16 or fp16")
        if device.type == "cuda":
            cc = torch.cuda.get_device_capability(device)
            if dtype == "bf16" and not torch.cuda.is_bf16_supported():
                raise OpcastError(
                    f"dtype bf16 needs compute capability >= 8.0, this GPU is {cc[0]}.{cc[1]}; use fp16 or fp32"
                )
            if dtype == "tf32" and cc < (8, 0):
                raise OpcastError(f"dtype tf32 needs compute capability >= 8.0, this GPU is {cc[0]}.{cc[1]}")
            if dtype == "fp8" and cc < (8, 9):
                raise OpcastError(
                    f"dtype fp8 needs compute capability >= 8.9, this GPU is {cc[0]}.{cc[1]}; drop --dtype fp8"
                )


def device_limits(spec: DeviceSpec, device, cfg: BenchConfig, world_on_host: int) -> DeviceLimits:
    mem: float
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        mem = free
    else:
        try:
            mem = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / max(1, world_on_host)
        except (ValueError, OSError):
            mem = spec.mem_bytes / max(1, world_on_host)
    return DeviceLimits(
        spec=spec, device_type=device.type, max_point_s=cfg.max_point_s, max_bytes=cfg.max_mem_fraction * mem
    )


def build_plan(cfg: BenchConfig, spec: DeviceSpec, device, world_on_host: int = 1) -> Plan:
    from opcast.collect.ops import BUILDERS

    ops = cfg.ops or tuple(BUILDERS)
    dtypes = cfg.dtypes or ("fp32", "fp16", "bf16")
    limits = device_limits(spec, device, cfg, world_on_host)
    strata = len(ops) * len(dtypes) + (len(dtypes) if cfg.archs else 0)
    per_stratum = 256 if cfg.samples is None else max(1, -(-cfg.samples // strata))
    plan = make_plan(
        ops=ops,
        dtypes=dtypes,
        limits=limits,
        seed=cfg.seed,
        per_stratum=per_stratum,
        archs=cfg.archs,
        tp_degrees=cfg.tp_degrees,
        arch_batch_seq=cfg.arch_batch_seq,
        arch_first=cfg.arch_first,
    )
    if cfg.samples is not None:
        plan.points = plan.points[: cfg.samples]
    return plan


def environment(device) -> dict[str, Any]:
    """Library versions and, on CUDA, the device, driver and clocks where readable."""
    import platform
    import subprocess

    import torch

    import opcast

    env: dict[str, Any] = {
        "opcast": opcast.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version(),
        )
        try:
            query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
            res = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", "-i", str(device.index)],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            env["nvidia_smi"] = dict(zip(query.split(","), (x.strip() for x in res.stdout.split(","))))
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = None
    return env


def _row(point: PlanPoint, stats, *, run_id: str, device_name: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "source": "bench",
        "device": device_name,
        "torch_version": env["torch"],
        "cuda_version": env["cuda"] if "gpu" in env else None,
        "opcast_version": env["opcast"],
        "timing_method": stats.method,
        "op": point.op,
        "dtype": point.dtype,
        "direction": point.direction,
        "tensor_cores": point.tensor_cores,
        "point_id": point.point_id,
        **point.params,
        "time_s_median": stats.time_s_median,
        "time_s_p20": stats.time_s_p20,
        "time_s_p80": stats.time_s_p80,
        "n_reps": stats.n_reps,
    }


def run_bench(cfg: BenchConfig, *, progress: Any = None) -> BenchResult:
    """Measure this rank's share of the plan into ``cfg.out``; see the module docstring."""
    from opcast.archs import load_arch
    from opcast.atomic import output_folder_problem

    for name in cfg.archs:  # a bad --arch fails here, before torch's seconds of start-up
        load_arch(name)
    if problem := output_folder_problem("--out", Path(cfg.out), holds="the dataset is written into it"):
        raise OpcastError(problem)
    rank, world, local_rank, local_world = rank_and_world()
    with StopSignals() as flag:
        import torch

        device = resolve_device(cfg.device, local_rank)
        check_dtypes(cfg.dtypes, device)
        out = Path(cfg.out)
        parts = out / "bench"
        try:
            parts.mkdir(parents=True, exist_ok=True)
            probe = parts / f".write-test-{rank}"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
        with WriterLock(parts / f".rank{rank:04d}.lock", command="bench", out=out):
            if device.type == "cuda":
                torch.cuda.set_device(device)
            else:
                cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
                torch.set_num_threads(max(1, cores // local_world))
            spec = describe_local(str(device))
            plan = build_plan(cfg, spec, device, local_world)
            if not plan.points and cfg.samples != 0:
                reasons = ", ".join(f"{n} x {why}" for why, n in plan.skipped.most_common(3)) or "no shapes"
                raise OpcastError(
                    f"nothing to measure: every planned point was skipped ({reasons}); "
                    "raise --max-point-s or --max-mem-fraction, or choose other --op/--dtype"
                )
            return _measure_plan(cfg, plan, spec, device, flag, rank=rank, world=world, progress=progress)


def _measure_plan(
    cfg: BenchConfig,
    plan: Plan,
    spec: DeviceSpec,
    device: Any,
    flag: StopSignals,
    *,
    rank: int,
    world: int,
    progress: Any,
) -> BenchResult:
    """Measure this rank's unmeasured points of ``plan``; whatever stops it (the budget, a signal,
    a full disk, a bug), every measured row is written and the run recorded in run.json."""
    import torch

    from opcast.collect.ops import BUILDERS, BuildRequest, UnsupportedPoint

    out = Path(cfg.out)
    mine = plan.shard(rank, world)
    done = done_point_ids(out, spec.name, timed=lambda method: protocol_of(method) == cfg.protocol)
    todo = [p for p in mine if p.point_id not in done]
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    env = environment(device)
    result = BenchResult(
        planned=len(mine),
        already_done=len(mine) - len(todo),
        skipped_in_plan=plan.skipped,
        device=spec.name,
        run_id=run_id,
    )
    writer = PartWriter(out / "bench", rank=rank, run_id=run_id)
    deadline = time.monotonic() + cfg.budget_s if cfg.budget_s else None
    started = time.time()
    task = progress.add_task(f"bench {spec.name}", total=len(todo)) if progress is not None else None
    l2 = spec.l2_bytes  # CUDA: the L2; CPU: the last-level cache describe_local reports

    def should_stop() -> bool:
        return flag.stop or (deadline is not None and time.monotonic() > deadline)

    processed = 0
    failure: BaseException | None = None
    try:
        for point in todo:
            if should_stop():
                break
            allow_tf32 = point.dtype == "tf32"
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = allow_tf32
                torch.backends.cudnn.allow_tf32 = allow_tf32
            req = BuildRequest(
                params=point.params, dtype=point.dtype, direction=point.direction, device=device, seed=cfg.seed
            )
            try:
                fn = BUILDERS[point.op](req)
                if cfg.protocol == "neusight":
                    stats = measure_neusight(fn, device=device, stop=should_stop)
                elif device.type == "cuda":
                    stats = measure_cuda(
                        fn, device=device, l2_bytes=l2, budget=cfg.timing, use_graphs=cfg.cuda_graphs, stop=should_stop
                    )
                else:
                    stats = measure_cpu(fn, cfg.timing, flush_bytes=2 * l2, stop=should_stop)
            except Abandoned:  # a signal or the budget: measured again on resume
                break
            except UnsupportedPoint as err:
                result.skipped_at_run[f"{point.op}: {err}"] += 1
            except torch.OutOfMemoryError:
                result.skipped_at_run[f"{point.op}: out of memory"] += 1
            except RuntimeError as err:
                result.skipped_at_run[f"{point.op}: {str(err).splitlines()[0][:100]}"] += 1
            else:
                flag.shielded = True  # a second signal must not land between writing a part and forgetting its rows
                try:
                    writer.add(_row(point, stats, run_id=run_id, device_name=spec.name, env=env))
                finally:
                    flag.shielded = False
            finally:
                fn = None  # free the point's tensors before the next one
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            processed += 1
            if task is not None:
                progress.update(
                    task, advance=1, description=f"bench {spec.name} [{point.op} {point.dtype} {point.direction}]"
                )
    except KeyboardInterrupt:  # a second signal: the running point is dropped, the rest is written below
        pass
    except BaseException as err:  # a full disk, a bug: write what was measured, record the run, then re-raise
        failure = err
    flag.shielded = True
    result.remaining = len(todo) - processed
    result.signal = flag.name

    def record(failure: BaseException | None) -> dict[str, Any]:
        result.rows_written = writer.saved
        result.interrupted = failure is not None or (
            flag.stop and result.remaining > 0
        )  # a signal after the last point loses nothing
        return {
            "run_id": run_id,
            "command": "bench",
            "rank": rank,
            "world_size": world,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in _config_dict(cfg).items()},
            "environment": env,
            "device_spec": _spec_dict(spec),
            "rows_written": result.rows_written,
            "rows_not_written": len(writer.rows),
            "planned": result.planned,
            "already_done": result.already_done,
            "remaining": result.remaining,
            "interrupted": result.interrupted,
            "signal": result.signal,
            "error": failure_text(failure),
            "skipped_in_plan": dict(plan.skipped),
            "skipped_at_run": dict(result.skipped_at_run),
        }

    finish_run(writer, out, rank=rank, failure=failure, record=record)
    return result


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)


def _spec_dict(spec: DeviceSpec) -> dict[str, Any]:
    from opcast.hardware import device_to_dict

    return device_to_dict(spec)
