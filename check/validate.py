"""``opcast validate``: time real training steps of an arch on this machine and compare them with
what ``opcast predict train`` says for the same device.

Stages, as in predict: ``prepare`` (arch, device spec, training config; every bad input
is an :class:`~opcast.errors.OpcastError` before any work), ``predict`` (the same library call as
``opcast predict train --gpu cpu|cuda``: :func:`~opcast.predict.training.predict_train` on the
measured :func:`~opcast.collect.local_device.describe_local` spec with :func:`~opcast.predict.cost.load_kernel_cost`),
``measure`` (the arch built by :mod:`opcast.check.torch_model`, trained for real) and
``compare`` (a frozen :class:`ValidateReport`).

Measurement follows the timing conventions of ``collect`` (triton ``do_bench``, nccl-tests): warm-up
steps first, then every phase of every timed step bracketed by a device synchronise and
``time.perf_counter``, and the median over the steps reported with its p20 and p80. Phases map to
the prediction's breakdown: ``forward`` (loss computed with autograd recording), ``backward``
(``loss.backward()``; under DDP it includes the wait for the gradient all-reduce, so it is
compared with predicted backward + exposed data-parallel communication), ``optimizer``
(``AdamW.step`` and ``zero_grad``; with bf16/fp16 the fp32 master-weight copies too, as Megatron's
``Float16OptimizerWithFloat16Params``), ``total`` (one whole step) against ``iteration_time_s``,
and ``forward_nograd`` (a forward under ``torch.no_grad``) against the predicted forward. Under
``torchrun`` (``WORLD_SIZE > 1``) every rank trains a DDP replica (gloo on the CPU, nccl on CUDA)
and each step's phase time is the maximum over the ranks (nccl-tests' convention).

``profile=True`` adds a :mod:`torch.profiler` run whose op events are attributed to opcast op
groups (:data:`PROFILE_GROUPS`) from the outermost recognised op down, next to the predicted
seconds of the same groups.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from opcast.archs import ArchSpec, load_arch
from opcast.errors import OpcastError

PRECISIONS = ("fp32", "bf16", "fp16")
PHASES = ("forward", "backward", "optimizer", "total", "forward_nograd")
DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's default ``bucket_cap_mb=25``; the prediction uses buckets of the same size."""

MAX_STEPS = 1_000
"""The most ``--steps`` (and ``--warmup``) steps one validation runs (calibrate's validations too). The
median of a few steps is what is compared (5 by default), and it settles within tens; gpt2-124m at batch
1 x seq 256 took 7.6 s a step on the (shared) 2-core development machine, so 1,000 steps are about two
hours there and a minute or two on a GPU. --steps 100000000000 was accepted and would have run for
millennia."""
SPREAD = 1.25
"""A run is flagged when the p80 of its step times exceeds the p20 by more than this factor."""


# ---------------------------------------------------------------------------- check archs

CHECK_ARCHS: dict[str, ArchSpec] = {
    "gpt2-124m": ArchSpec(
        name="gpt2-124m",
        family="gpt2",
        n_layers=12,
        hidden=768,
        n_heads=12,
        n_kv_heads=12,
        head_dim=64,
        ffn_hidden=3072,
        vocab=50257,
        max_seq=1024,
        norm="layernorm",
        activation="gelu",
        gated_mlp=False,
        position="learned",
        tied_embeddings=True,
        linear_bias=True,
        parallel_residual=False,
        source="GPT-2 small: Radford et al. 2019, Table 2; Hugging Face openai-community/gpt2 config.json",
    ),
    "llama-style-125m": ArchSpec(
        name="llama-style-125m",
        family="llama",
        n_layers=12,
        hidden=768,
        n_heads=12,
        n_kv_heads=4,
        head_dim=64,
        ffn_hidden=2048,
        vocab=32000,
        max_seq=4096,
        norm="rmsnorm",
        activation="silu",
        gated_mlp=True,
        position="rope",
        tied_embeddings=False,
        linear_bias=False,
        parallel_residual=False,
        source="opcast check arch: the Llama-2 block (Touvron et al. 2023, arXiv 2307.09288: pre-RMSNorm, SwiGLU, "
        "rope, untied, 32000 vocab) with GQA, scaled to GPT-2 small's width and depth",
    ),
}
"""Small archs for checks on one machine (``opcast validate --arch gpt2-124m``); preset names,
preset JSON files and Hugging Face ``config.json`` files work as everywhere else."""


def resolve_arch(arch: ArchSpec | str | Path, layers: int | None = None) -> ArchSpec:
    """A check arch by name, else :func:`opcast.archs.load_arch`; ``layers`` overrides ``n_layers``."""
    if isinstance(arch, ArchSpec):
        spec = arch
    elif str(arch) in CHECK_ARCHS:
        spec = CHECK_ARCHS[str(arch)]
    else:
        try:
            spec = load_arch(arch)
        except OpcastError as err:
            if "unknown arch" in str(err):
                raise OpcastError(f"{err}; or one of the check archs {', '.join(CHECK_ARCHS)}") from None
            raise
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise OpcastError(f"--layers must be a positive integer, got {layers!r}")
        spec = replace(spec, n_layers=layers, name=f"{spec.name}[layers={layers}]")
    return spec


def arch_file(arch: ArchSpec, folder: Path) -> Path:
    """``arch`` written as a preset-style JSON (for ``collect bench --arch``, which loads by path)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in arch.name)
    path = folder / f"{safe}.json"
    path.write_text(json.dumps(asdict(arch), indent=1) + "\n")
    return path


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseCheck:
    """One phase of a training step: measured against predicted."""

    phase: str
    """forward | backward | optimizer | total | forward_nograd."""
    measured_s: float
    """Median seconds over the timed steps (max over ranks under DDP)."""
    measured_p20_s: float
    measured_p80_s: float
    predicted_s: float
    """What the prediction says for the same phase."""
    predicted_as: str
    """Which prediction quantity, e.g. ``breakdown_s[forward]``."""

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, ``100 x (predicted - measured) / measured``."""
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else math.nan


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupCheck:
    """One op group of the profile: measured (torch.profiler) against predicted seconds per step."""

    group: str
    measured_s: float
    predicted_s: float
    predicted_sources: str
    """How the predicted kernels of the group were costed, e.g. ``learned`` or ``learned 12, roofline 2``."""


_PLAIN_FIELDS: Final = (
    "arch",
    "params",
    "device",
    "device_type",
    "precision",
    "attention",
    "batch",
    "seq",
    "world_size",
    "threads",
    "steps",
    "warmup",
    "models",
)
"""The fields of a :class:`ValidateReport` its JSON holds as they are (to_dict and from_dict)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidateReport:
    """Measured vs predicted training step of one arch on this machine."""

    arch: str
    params: int
    """Parameters of the model that ran (padded vocab, tied embedding counted once)."""
    device: str
    """The device spec the prediction used (``describe_local``)."""
    device_type: str
    """cpu | cuda."""
    precision: str
    attention: str
    batch: int
    """Sequences per step per rank."""
    seq: int
    world_size: int
    threads: int
    """CPU threads of each rank (torch.get_num_threads)."""
    steps: int
    warmup: int
    models: str
    """The kernel models that priced the prediction."""
    phases: tuple[PhaseCheck, ...]
    iteration_time_interval_s: tuple[float, float] | None = None
    """The prediction's interval of the iteration time, where the prediction carries one."""
    kernels_by_source: dict[str, int] = field(default_factory=dict)
    """Unique predicted kernels per cost source (learned / roofline)."""
    roofline_groups: tuple[str, ...] = ()
    """Op groups (op-direction-dtype class) the learned models did not cover: priced by the roofline."""
    roofline_share: float = 0.0
    """Share of the predicted iteration time that comes from roofline-priced kernels."""
    out_of_range_kernels: int = 0
    """Learned kernels flagged as outside the hardware or features their model was fitted on."""
    profile: tuple[GroupCheck, ...] = ()
    profile_overhead: float | None = None
    """Profiled step time over the unprofiled median (the profiler's own cost)."""
    notes: tuple[str, ...] = ()

    def phase(self, name: str) -> PhaseCheck:
        return next(p for p in self.phases if p.phase == name)

    @property
    def total_error_pct(self) -> float:
        return self.phase("total").error_pct

    @property
    def inside_interval(self) -> bool | None:
        if self.iteration_time_interval_s is None:
            return None
        lo, hi = self.iteration_time_interval_s
        return lo <= self.phase("total").measured_s <= hi

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in _PLAIN_FIELDS}
        out["phases"] = [{**asdict(p), "error_pct": _finite(p.error_pct)} for p in self.phases]
        out["total_error_pct"] = _finite(self.total_error_pct)
        out["iteration_time_interval_s"] = (
            list(self.iteration_time_interval_s) if self.iteration_time_interval_s else None
        )
        out["inside_interval"] = self.inside_interval
        out.update(
            kernels_by_source=dict(self.kernels_by_source),
            roofline_groups=list(self.roofline_groups),
            roofline_share=self.roofline_share,
            out_of_range_kernels=self.out_of_range_kernels,
            profile=[asdict(g) for g in self.profile],
            profile_overhead=self.profile_overhead,
            notes=list(self.notes),
        )
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ValidateReport:
        """The report back from :meth:`to_dict` (derived keys are recomputed, not read)."""
        plain = {k: doc[k] for k in _PLAIN_FIELDS}
        phases = tuple(PhaseCheck(**{k: v for k, v in p.items() if k != "error_pct"}) for p in doc["phases"])
        interval = doc.get("iteration_time_interval_s")
        return cls(
            **plain,
            phases=phases,
            iteration_time_interval_s=tuple(interval) if interval else None,
            kernels_by_source=dict(doc.get("kernels_by_source", {})),
            roofline_groups=tuple(doc.get("roofline_groups", ())),
            roofline_share=float(doc.get("roofline_share", 0.0)),
            out_of_range_kernels=int(doc.get("out_of_range_kernels", 0)),
            profile=tuple(GroupCheck(**g) for g in doc.get("profile", ())),
            profile_overhead=doc.get("profile_overhead"),
            notes=tuple(doc.get("notes", ())),
        )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------------------- prepare


@dataclass(frozen=True, kw_only=True, slots=True)
class _Env:
    rank: int
    world: int
    local_rank: int
    local_world: int = 1
    """Ranks on this host (torchrun's LOCAL_WORLD_SIZE): they share its cores."""


def local_env() -> _Env:
    """This process's place under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), each
    checked before any work: a value torchrun would never set is a one-line error naming it."""
    from opcast.collect.bench import env_int

    rank = env_int("RANK", default=0, minimum=0)
    world = env_int("WORLD_SIZE", default=1, minimum=1)
    local = env_int("LOCAL_RANK", default=0, minimum=0)
    local_world = env_int("LOCAL_WORLD_SIZE", default=world, minimum=1)
    if not rank < world:
        raise OpcastError(f"rank {rank} is outside world size {world}; check RANK/WORLD_SIZE")
    if local_world > world or not local < local_world:
        raise OpcastError(
            f"LOCAL_RANK={local} and LOCAL_WORLD_SIZE={local_world} do not fit WORLD_SIZE={world}; "
            "unset them or launch with torchrun, which sets them"
        )
    return _Env(rank=rank, world=world, local_rank=local, local_world=local_world)


def _positive(label: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OpcastError(f"--{label} must be an integer >= {minimum}, got {value!r}")


def device_type(device: str) -> str:
    """``cpu`` or ``cuda`` of a ``--device`` value, checked without torch; raises :class:`OpcastError` for another."""
    text = device.strip().lower()
    if text == "cpu":
        return "cpu"
    if text == "cuda" or text.startswith("cuda:"):
        return "cuda"
    raise OpcastError(f"unknown --device {device!r}; use cpu or cuda")


def torch_device(device: str, env: _Env):
    """The torch device of a ``--device`` value (:func:`device_type`), checked against what torch sees."""
    import torch

    text = device.strip().lower()
    if device_type(text) == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise OpcastError(f"--device {device}: torch sees no CUDA device (torch {torch.__version__}); use --device cpu")
    try:
        index = int(text.split(":", 1)[1]) if ":" in text else env.local_rank
    except ValueError:
        raise OpcastError(f"--device {device}: use cuda or cuda:N") from None
    if index >= torch.cuda.device_count():
        raise OpcastError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def check_inputs(arch: ArchSpec, batch: int, seq: int, precision: str, attention: str, steps: int, warmup: int) -> None:
    """Every input that no device decides, checked before torch is imported (:func:`check_on_device` after)."""
    from opcast.check.buildable import check_arch

    _positive("batch", batch)
    _positive("seq", seq)
    _positive("steps", steps)
    _positive("warmup", warmup, 0)
    for label, n in (("steps", steps), ("warmup", warmup)):
        if n > MAX_STEPS:
            raise OpcastError(
                f"--{label} {n}: at most {MAX_STEPS:,} steps are run (the median settles within tens); give fewer"
            )
    if precision not in PRECISIONS:
        raise OpcastError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    check_arch(arch, attention)
    arch.validate_parallel(tp=1)
    if arch.position == "learned" and seq > arch.max_seq:
        raise OpcastError(
            f"--seq {seq} exceeds max_seq={arch.max_seq} of {arch.name} (learned positions); "
            f"use --seq <= {arch.max_seq}"
        )


def check_on_device(device_type: str, precision: str, attention: str) -> None:
    """The option combinations a device rules out, checked once :func:`torch_device` has found the device: on a
    machine without CUDA, --device cuda:3 with the default flash attention in fp32 was told to change its
    precision or attention before it was told there is no such device."""
    if device_type == "cuda" and attention == "flash" and precision == "fp32":
        raise OpcastError("flash attention on CUDA needs bf16 or fp16; use --precision bf16 or --attention eager")


# ---------------------------------------------------------------------------- predict


def check_fits(
    result,
    arch: ArchSpec,
    spec,
    *,
    batch: int,
    seq: int,
    precision: str,
    fix: str = "use --layers, a smaller --batch or --seq",
) -> None:
    """Refuse a step that :func:`predict_step` (``result``) says does not fit the device's memory, or that
    fits only without what validate's own step adds (:data:`HALF_GRAD_COPY_BYTES`): it would fail (or swap)
    only once measured."""
    copies = HALF_GRAD_COPY_BYTES * arch.params_total() if precision != "fp32" else 0
    need = (result.worst_memory.total_bytes if result.memory else math.nan) + copies
    if not result.feasible or need > spec.mem_bytes:
        own = f", {copies / 2**30:.1f} GiB of it validate's fp32 gradient copies" if copies else ""
        raise OpcastError(
            f"{arch.name} at batch {batch} x seq {seq} ({precision}) needs {need / 2**30:.1f} GiB by the "
            f"prediction{own}, more than the {spec.mem_bytes / 2**30:.1f} GiB of {spec.name}; {fix}"
        )


HALF_GRAD_COPY_BYTES = 4
"""Bytes a parameter validate's half-precision step holds beyond the prediction: ``_Optimizer.step`` copies each
bf16/fp16 gradient up to fp32 for its fp32 master (``m.grad = p.grad.float()``) while the half gradients still
live. Uncounted, a 1-layer llama3-8b in bf16 passed the check on a 24 GiB machine (18.9 GiB predicted) and was
killed by the system after 6 minutes, without a message."""


def predict_step(arch: ArchSpec, spec, *, batch: int, seq: int, precision: str, attention: str, world: int, kernels):
    """The training prediction matching a validate run: ``dp = world`` replicas of ``batch``
    sequences, one micro-batch each, on one node; under DDP with its gradient buckets overlapped
    with backward; the kernels of plain PyTorch modules (``--framework torch``: native norms and cross-entropy,
    torch SDPA's flash backend, FlashAttention-2)."""
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import predict_train

    grad_bytes = 4 if precision == "fp32" else 2
    cfg = TrainConfig(
        micro_batch=batch,
        global_batch=batch * world,
        dp=world,
        seq=seq,
        precision=precision,  # type: ignore[arg-type]
        attention=attention,
        framework="torch",  # the check model's modules: torch's native kernels, SDPA's flash backend (flash2)
        overlap_grad_reduce=world > 1,  # type: ignore[arg-type]
        bucket_params=DDP_BUCKET_BYTES // grad_bytes if world > 1 else None,
    )
    result = predict_train(arch, spec, cfg, nodes=1, gpus_per_node=world, kernels=kernels)
    if not result.feasible and result.layout is None:
        raise OpcastError(f"the prediction refuses this configuration: {'; '.join(result.reasons)}")
    return result


def _kernel_summary(result, kernels, device) -> tuple[dict[str, int], tuple[str, ...], float, int]:
    from opcast.train.features import dtype_class, group_key

    by_source: dict[str, int] = {}
    roof: set[str] = set()
    roof_s = total_s = 0.0
    seen: set[Any] = set()
    for o in result.ops:
        t = o.count * o.time_s
        total_s += t
        if o.source != "learned":
            roof_s += t
            k = o.kernel
            roof.add(
                group_key(k.kind, k.direction, dtype_class(k.kind, k.dtype, k.tensor_cores), k.param_dict.get("impl"))
            )
        if o.kernel not in seen:
            seen.add(o.kernel)
            by_source[o.source] = by_source.get(o.source, 0) + 1
    flagged = sum(1 for k in seen if kernels.range_flag(k, device))
    return dict(sorted(by_source.items())), tuple(sorted(roof)), (roof_s / total_s if total_s else 0.0), flagged


# ---------------------------------------------------------------------------- process group


@dataclass(kw_only=True, slots=True)
class GroupSession:
    """What :func:`process_group` did: whether it started a group, and whether the group was freed
    (its communication threads joined) when the block ended."""

    started: bool = False
    released: bool | None = None
    """None while the block runs or when no group was started; then True when nothing kept the
    group alive past ``destroy_process_group``."""


@contextmanager
def process_group(backend: str, world: int) -> Iterator[GroupSession]:
    """The default process group of a ``torchrun`` validation (``world > 1``), torn down so that
    none of its threads outlives it.

    Why: ``torch.distributed.nn.functional`` binds ``group.WORLD`` as a default argument when it is
    first imported, and DDP's construction imports it; imported after ``init_process_group``, it
    keeps the gloo group alive past ``destroy_process_group``, with its worker threads running into
    interpreter shutdown. A worker that drops the last reference to a finished collective's tensors
    then needs the GIL while the interpreter finalises: it is made to exit inside a C++ destructor
    and the rank dies with SIGABRT ("terminate called without an active exception"), more often on
    a loaded machine where the worker runs late. Imported before the group exists, it binds None;
    on success every rank passes a barrier (no rank leaves while a peer is inside a collective),
    then the group is destroyed, which joins its threads."""
    import gc
    import weakref

    session = GroupSession()
    if world <= 1:
        yield session
        return
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401 - before init_process_group, see the docstring

    if dist.is_initialized():  # somebody else's group: theirs to tear down
        yield session
        return
    dist.init_process_group(backend)
    session.started = True
    world_group = weakref.ref(dist.group.WORLD)
    ok = False
    try:
        yield session
        ok = True
    finally:
        try:
            if ok:
                dist.barrier()
        finally:
            dist.destroy_process_group()
            gc.collect()
            session.released = world_group() is None


# ---------------------------------------------------------------------------- measure


@dataclass(frozen=True, kw_only=True, slots=True)
class _Timings:
    samples: dict[str, list[float]]
    """phase -> seconds per timed step (max over ranks)."""
    params: int
    threads: int
    profile: dict[str, float] | None
    profiled_step_s: float | None


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


class _Optimizer:
    """AdamW over the model's parameters; with half precision over fp32 master copies (Megatron's
    mixed-precision optimizer: grads copied up, step in fp32, weights copied down)."""

    def __init__(self, params: list[Any], half: bool) -> None:
        import torch

        self.params = params
        self.half = half
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in params] if half else params
        kwargs: dict[str, Any] = {"lr": 1e-4, "weight_decay": 0.1}
        try:
            self.opt = torch.optim.AdamW(self.masters, fused=True, **kwargs)
        except (RuntimeError, ValueError):
            self.opt = torch.optim.AdamW(self.masters, foreach=True, **kwargs)

    def step(self) -> None:
        import torch

        with torch.profiler.record_function("opcast::optimizer"):
            if self.half:
                for m, p in zip(self.masters, self.params):
                    if p.grad is not None:
                        m.grad = p.grad.float()
            self.opt.step()
            if self.half:
                with torch.no_grad():
                    torch._foreach_copy_([p.data for p in self.params], [m.data for m in self.masters])
            self.opt.zero_grad(set_to_none=True)
            for p in self.params if self.half else ():
                p.grad = None


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def _quantiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) == 1:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return q[1], q[7]


def measure_step(
    arch: ArchSpec,
    *,
    batch: int,
    seq: int,
    precision: str,
    attention: str,
    device,
    env: _Env,
    steps: int,
    warmup: int,
    profile: bool,
    progress: Callable[[str], None] | None = None,
) -> _Timings:
    """Train ``arch`` for ``warmup + steps`` steps and time every phase (see the module docstring)."""
    import torch
    import torch.distributed as dist

    from opcast.check.torch_model import build_model, count_params
    from opcast.dtypes import torch_dtype

    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // env.local_world))
    else:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs on CUDA cores, as the prediction assumes
        torch.backends.cudnn.allow_tf32 = False
    dtype = torch_dtype(precision)
    model = build_model(arch, attention=attention, device=device, dtype=dtype, seed=0)
    model.train()
    params = list(model.parameters())
    n_params = count_params(model)
    if env.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(
            model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=DDP_BUCKET_BYTES / 2**20
        )
    opt = _Optimizer(params, half=precision != "fp32")
    gen = torch.Generator().manual_seed(1234 + env.rank)
    ids = torch.randint(0, arch.vocab, (batch, seq), generator=gen).to(device)
    targets = torch.randint(0, arch.vocab, (batch, seq), generator=gen).to(device)

    def step() -> tuple[float, float, float, float]:
        _sync(device)
        t0 = time.perf_counter()
        loss = model(ids, targets)
        _sync(device)
        t1 = time.perf_counter()
        loss.backward()
        _sync(device)
        t2 = time.perf_counter()
        opt.step()
        _sync(device)
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t3 - t0

    def forward_nograd() -> float:
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(ids, targets)
        _sync(device)
        return time.perf_counter() - t0

    samples: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        for i in range(warmup):
            if progress:
                progress(f"warm-up step {i + 1}/{warmup}")
            step()
        for i in range(steps):
            if progress:
                progress(f"step {i + 1}/{steps}")
            for name, t in zip(("forward", "backward", "optimizer", "total"), step()):
                samples[name].append(t)
        forward_nograd()  # warm-up of the no-grad path (other buffers than training)
        for i in range(steps):
            if progress:
                progress(f"forward (no grad) {i + 1}/{steps}")
            samples["forward_nograd"].append(forward_nograd())
        prof_groups = prof_step = None
        if profile:
            if progress:
                progress("profiling")
            prof_groups, prof_step = _profile(step, device, min(steps, 3))
    except torch.OutOfMemoryError:
        raise OpcastError(
            f"{arch.name} at batch {batch} x seq {seq} ({precision}) does not fit in {device} memory; "
            "use a smaller --batch, --seq or --layers"
        ) from None
    if env.world > 1:  # per-step max over ranks
        for name in PHASES:
            per_rank = torch.tensor(samples[name], dtype=torch.float64)
            dist.all_reduce(per_rank, op=dist.ReduceOp.MAX)
            samples[name] = per_rank.tolist()
    return _Timings(
        samples=samples,
        params=n_params,
        threads=torch.get_num_threads(),
        profile=prof_groups,
        profiled_step_s=prof_step,
    )


# ---------------------------------------------------------------------------- profile

PROFILE_GROUPS = (
    "gemm",
    "attention",
    "norm",
    "softmax",
    "elementwise",
    "embedding",
    "cross_entropy",
    "optimizer",
    "other",
)
"""Op groups of the profile comparison. Predicted kinds map onto them (layernorm, rmsnorm -> norm;
rope -> elementwise, since torch runs it as multiplies, a concatenation and an add); measured op
events are attributed by :func:`profile_group` from the outermost recognised op down, so a
composite op (``aten::linear``, ``aten::cross_entropy_loss``, ``embedding_dense_backward``) counts
whole under its group; what no rule recognises (autograd bookkeeping, allocation, views) is
``other``."""

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "_addmm_activation"}
_NORM = {
    "layer_norm",
    "native_layer_norm",
    "native_layer_norm_backward",
    "rms_norm",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "group_norm",
}
_SOFTMAX = {"softmax", "_softmax", "_softmax_backward_data", "safe_softmax", "_safe_softmax"}
_CROSS_ENTROPY = {
    "cross_entropy_loss",
    "log_softmax",
    "_log_softmax",
    "_log_softmax_backward_data",
    "nll_loss",
    "nll_loss_nd",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d_forward",
    "nll_loss2d_backward",
}
_EMBEDDING = {"embedding", "embedding_backward", "embedding_dense_backward", "embedding_renorm_"}
_ELEMENTWISE = {
    "add",
    "add_",
    "sub",
    "sub_",
    "mul",
    "mul_",
    "div",
    "div_",
    "neg",
    "pow",
    "rsqrt",
    "sqrt",
    "exp",
    "tanh",
    "sigmoid",
    "gelu",
    "gelu_backward",
    "silu",
    "silu_backward",
    "relu",
    "threshold_backward",
    "dropout",
    "native_dropout",
    "native_dropout_backward",
    "masked_fill",
    "masked_fill_",
    "cat",
    "copy_",
    "clone",
    "contiguous",
    "mean",
    "sum",
    "where",
    "_to_copy",
    "to",
    "repeat_interleave",
    "index_select",
    "fill_",
    "zero_",
    "zeros_like",
    "ones_like",
    "bernoulli_",
    "slice_backward",
    "select_backward",
    "add_n",
}


def profile_group(name: str) -> str | None:
    """The :data:`PROFILE_GROUPS` entry of a profiler event name, None when not recognised."""
    if (
        name.startswith(("Optimizer.", "opcast::optimizer"))
        or "adam" in name.lower()
        or name.startswith("aten::_foreach")
    ):
        return "optimizer"
    if not name.startswith("aten::"):
        return None
    op = name[6:]
    if "scaled_dot_product" in op or "flash_attention" in op or "efficient_attention" in op or "cudnn_attention" in op:
        return "attention"
    for group, names in (
        ("gemm", _GEMM),
        ("norm", _NORM),
        ("softmax", _SOFTMAX),
        ("cross_entropy", _CROSS_ENTROPY),
        ("embedding", _EMBEDDING),
        ("elementwise", _ELEMENTWISE),
    ):
        if op in names:
            return group
    return None


def _event_time_us(evt: Any, cuda: bool, inclusive: bool) -> float:
    if cuda:
        name = "device_time_total" if inclusive else "self_device_time_total"
        alt = "cuda_time_total" if inclusive else "self_cuda_time_total"
        return float(getattr(evt, name, getattr(evt, alt, 0.0)) or 0.0)
    return float(evt.cpu_time_total if inclusive else evt.self_cpu_time_total)


def group_times(events: Iterable[Any], cuda: bool) -> dict[str, float]:
    """Seconds per :data:`PROFILE_GROUPS` entry of profiler events: a recognised event counts with
    its inclusive time and is not descended into; an unrecognised one adds its self time to
    ``other`` and its children are attributed in turn."""
    out = dict.fromkeys(PROFILE_GROUPS, 0.0)

    def visit(evt: Any) -> None:
        group = profile_group(evt.name)
        if group is not None:
            out[group] += _event_time_us(evt, cuda, inclusive=True) * 1e-6
            return
        out["other"] += _event_time_us(evt, cuda, inclusive=False) * 1e-6
        for child in evt.cpu_children:
            visit(child)

    for evt in events:
        if evt.cpu_parent is None and str(getattr(evt, "device_type", "CPU")).endswith("CPU"):
            visit(evt)
    return out


def _profile(step: Callable[[], tuple[float, float, float, float]], device, n: int) -> tuple[dict[str, float], float]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    totals = []
    with profile(activities=activities) as prof:
        for _ in range(n):
            totals.append(step()[3])
    groups = group_times(prof.events(), cuda=device.type == "cuda")
    return {g: t / n for g, t in groups.items()}, _median(totals)


def _predicted_groups(result) -> dict[str, tuple[float, dict[str, int]]]:
    kind_group = {"layernorm": "norm", "rmsnorm": "norm", "rope": "elementwise"}
    out: dict[str, tuple[float, dict[str, int]]] = {}
    for o in result.ops:
        g = kind_group.get(o.kernel.kind, o.kernel.kind)
        t, src = out.get(g, (0.0, {}))
        src = dict(src)
        src[o.source] = src.get(o.source, 0) + 1
        out[g] = (t + o.count * o.time_s, src)
    return out


# ---------------------------------------------------------------------------- the whole check


def run_validate(
    arch: ArchSpec | str | Path,
    *,
    batch: int,
    seq: int,
    precision: str = "fp32",
    device: str = "cpu",
    models: str | Path | None = None,
    steps: int = 5,
    warmup: int = 2,
    profile: bool = False,
    attention: str = "flash",
    layers: int | None = None,
    kernels: Any = None,
    progress: Callable[[str], None] | None = None,
) -> ValidateReport:
    """Measure and predict one training step of ``arch`` on the local ``device``; see the module
    docstring. ``kernels`` (a :class:`~opcast.predict.cost.KernelCostModel`) replaces ``models``."""
    from opcast.check.calibrate_noise import load_average, load_reason
    from opcast.collect.local_device import describe_local
    from opcast.predict.cost import LearnedKernelCost, load_kernel_cost

    env = local_env()
    load = load_average()
    spec_arch = resolve_arch(arch, layers)
    device_type(device)  # an unknown --device, before torch
    check_inputs(spec_arch, batch, seq, precision, attention, steps, warmup)  # before torch
    dev = torch_device(device, env)
    check_on_device(dev.type, precision, attention)
    spec = describe_local("cpu" if dev.type == "cpu" else f"cuda:{dev.index}")
    if not spec.supports(precision):
        raise OpcastError(f"{spec.name} has no {precision} peak; use --precision fp32")
    cost = kernels if kernels is not None else load_kernel_cost(models)
    result = predict_step(
        spec_arch, spec, batch=batch, seq=seq, precision=precision, attention=attention, world=env.world, kernels=cost
    )
    notes: list[str] = []
    check_fits(result, spec_arch, spec, batch=batch, seq=seq, precision=precision)
    with process_group("nccl" if dev.type == "cuda" else "gloo", env.world):
        timings = measure_step(
            spec_arch,
            batch=batch,
            seq=seq,
            precision=precision,
            attention=attention,
            device=dev,
            env=env,
            steps=steps,
            warmup=warmup,
            profile=profile,
            progress=progress,
        )
    b = result.breakdown_s
    dp_s = b.get("dp_comm_exposed", 0.0)
    predicted = {
        "forward": (b["forward"], "breakdown_s[forward]"),
        "backward": (
            b["backward"] + dp_s,
            "breakdown_s[backward] + [dp_comm_exposed]" if env.world > 1 else "breakdown_s[backward]",
        ),
        "optimizer": (b["optimizer"], "breakdown_s[optimizer]"),
        "total": (result.iteration_time_s, "iteration_time_s"),
        "forward_nograd": (b["forward"], "breakdown_s[forward]"),
    }
    phases = []
    for name in PHASES:
        xs = timings.samples[name]
        p20, p80 = _quantiles(xs)
        phases.append(
            PhaseCheck(
                phase=name,
                measured_s=_median(xs),
                measured_p20_s=p20,
                measured_p80_s=p80,
                predicted_s=float(predicted[name][0]),
                predicted_as=predicted[name][1],
            )
        )
    by_source, roof_groups, roof_share, flagged = _kernel_summary(result, cost, spec)
    if not any(isinstance(s, LearnedKernelCost) for s in getattr(cost, "sources", ())):
        notes.extend(cost.notes)  # why no learned model answers, e.g. the default set could not be loaded
    if roof_groups:
        notes.append(
            f"{len(roof_groups)} op group(s) not covered by the learned models, priced by the roofline "
            f"({100 * roof_share:.0f} % of the predicted time): {', '.join(roof_groups)}; "
            "opcast calibrate fits models for this machine"
        )
    if env.world > 1:
        link = "placeholder" if spec.vendor == "cpu" or "Placeholders" in spec.notes else "catalog"
        if link == "placeholder":
            notes.append(
                f"data-parallel communication ({1e3 * dp_s:.3g} ms exposed predicted) is unknown: {spec.name}'s "
                "link bandwidths are placeholders, not measured links (alpha-beta on them is no prediction)"
            )
        if dev.type == "cpu":
            notes.append(
                f"the {env.world} ranks share this CPU's cores ({timings.threads} thread(s) each) while the "
                "prediction prices each rank on the whole CPU's spec"
            )
    busy = load_reason(load) if dev.type == "cpu" else None
    if busy:
        notes.append(
            f"the machine was busy ({busy}): other work steals cores and every multi-threaded op waits for "
            "them; time on a quiet machine, or pin this run to free cores with taskset -c"
        )
    step = phases[PHASES.index("total")]
    if step.measured_p80_s > SPREAD * step.measured_p20_s:
        notes.append(
            f"the steps varied widely (p20 {step.measured_p20_s:.3g} s, p80 {step.measured_p80_s:.3g} s): "
            "more --steps, or a quieter machine"
        )
    if precision == "fp16":
        notes.append("fp16 runs without loss scaling (the timing is what is checked)")
    if attention == "eager" and profile:
        notes.append(
            "eager attention runs as gemm, softmax and elementwise kernels: the measured profile shows it there, "
            "the prediction under attention"
        )
    interval = getattr(result, "iteration_time_interval_s", None)
    groups: tuple[GroupCheck, ...] = ()
    overhead = None
    if timings.profile is not None:
        pred = _predicted_groups(result)
        groups = tuple(
            GroupCheck(
                group=g,
                measured_s=timings.profile.get(g, 0.0),
                predicted_s=pred.get(g, (0.0, {}))[0],
                predicted_sources=", ".join(f"{k} {v}" for k, v in sorted(pred.get(g, (0.0, {}))[1].items())),
            )
            for g in PROFILE_GROUPS
            if timings.profile.get(g, 0.0) > 0 or g in pred
        )
        overhead = (
            timings.profiled_step_s / step.measured_s if timings.profiled_step_s and step.measured_s > 0 else None
        )
    return ValidateReport(
        arch=spec_arch.name,
        params=timings.params,
        device=spec.name,
        device_type=dev.type,
        precision=precision,
        attention=attention,
        batch=batch,
        seq=seq,
        world_size=env.world,
        threads=timings.threads,
        steps=steps,
        warmup=warmup,
        models=cost.models_label or "roofline only",
        phases=tuple(phases),
        iteration_time_interval_s=tuple(float(x) for x in interval) if interval is not None else None,  # type: ignore[arg-type]
        kernels_by_source=by_source,
        roofline_groups=roof_groups,
        roofline_share=roof_share,
        out_of_range_kernels=flagged,
        profile=groups,
        profile_overhead=overhead,
        notes=tuple(notes),
    )
