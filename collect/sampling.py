"""The measurement plan: which op configurations to benchmark, in which order.

Lightweight sampling (in the spirit of NeuSight's and Vidur's profilers, but sparser): for each
(op kind, dtype) stratum, a seeded scrambled Sobol sequence over log-spaced shape ranges, mostly
hardware-aligned (a fifth of GEMM and row-wise shapes are left odd, :data:`UNALIGNED_SHARE`);
plus the exact shapes that named archs produce under common tensor-parallel degrees. Strata are
interleaved round-robin, so a run cut short by its time budget still covers every kind. Every
point is validated before it is planned: registry checks, a memory bound and a roofline time
estimate against the device, so nothing that cannot run (or would take too long) reaches the
device.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec
from opcast.ops import ATTENTION_IMPLS, ELEMENTWISE_FNS, get_op, op_kinds, sdpa_flash_family
from opcast.schema import point_id


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPoint:
    """One configuration to measure."""

    op: str
    """Op kind."""
    params: dict[str, Any]
    """Validated op parameters."""
    dtype: str
    """Precision."""
    direction: str
    """fwd | bwd."""
    tensor_cores: bool | None
    """Tensor cores allowed (None on CPU)."""
    stratum: str
    """sobol:<op>:<dtype> or arch:<name>."""
    point_id: str
    """Resume key (opcast.schema.point_id)."""


@dataclass(kw_only=True, slots=True)
class Plan:
    """The ordered points and what was left out, with reasons."""

    points: list[PlanPoint] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)

    def shard(self, rank: int, world_size: int) -> list[PlanPoint]:
        """The points rank ``rank`` of ``world_size`` measures (a strided split keeps the mix)."""
        return self.points[rank::world_size]


# --------------------------------------------------------------------------- shape spaces


def align(value: float, lo: int = 1) -> int:
    """Round to a hardware-friendly multiple: 8 below 256, 64 up to 4096, 128 above."""
    v = max(float(lo), value)
    step = 1 if v < 8 else 8 if v < 256 else 64 if v < 4096 else 128
    return max(lo, int(round(v / step)) * step)


def log_int(u: float, lo: int, hi: int, *, aligned: bool = True) -> int:
    """Map u in [0, 1) log-uniformly onto [lo, hi], aligned."""
    v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return min(hi, align(v, lo)) if aligned else int(round(v))


def choose(u: float, options: Sequence[Any]) -> Any:
    return options[min(len(options) - 1, int(u * len(options)))]


HEAD_DIMS = (64, 80, 96, 128, 128, 256)  # 128 twice: the common case is sampled more


UNALIGNED_SHARE = 0.2
"""Share of the sampled GEMM and row-wise shapes left unaligned (odd sizes such as GPT-2's 50257
vocabulary), so that a fitted model has seen what misalignment costs on the device and what
alignment buys. NeuSight's data show the gap a one-sided sample leaves: its GEMM training sweeps
are random integers (244 of 119,847 rows have m, n and k all multiples of 8, none all multiples
of 64) while 60 % of its test rows are multiples of 64 in every dimension."""


def _gemm(u: np.ndarray, _: str) -> dict[str, Any]:
    b = 1 if u[0] < 0.6 else log_int((u[0] - 0.6) / 0.4, 2, 128, aligned=False)
    aligned = bool(u[4] >= UNALIGNED_SHARE)
    return {
        "b": b,
        "m": log_int(u[1], 16, 16384, aligned=aligned),
        "n": log_int(u[2], 16, 16384, aligned=aligned),
        "k": log_int(u[3], 16, 16384, aligned=aligned),
    }


def _attention(u: np.ndarray, device_type: str) -> dict[str, Any]:
    heads = log_int(u[1], 1, 64, aligned=False)
    groups = [g for g in (1, 2, 4, 8) if heads % g == 0]
    seq = log_int(u[3], 128, 16384)
    decode = bool(u[4] < 0.2)
    impls = ATTENTION_IMPLS
    return {
        "batch": log_int(u[0], 1, 32, aligned=False),
        "heads": heads,
        "kv_heads": heads // choose(u[2], groups),
        "seq_q": 1 if decode else seq,
        "seq_kv": seq,
        "head_dim": choose(u[5], HEAD_DIMS),
        "causal": bool(not decode and u[6] < 0.7),
        "impl": choose(u[7], impls),
    }


def _rowwise(u: np.ndarray, _: str) -> dict[str, Any]:
    # torch's own single-kernel ops (collect.ops.norm / softmax): registry impl "native"
    cols = log_int(u[1], 64, 65536, aligned=bool(u[2] >= UNALIGNED_SHARE))
    return {"rows": log_int(u[0], 1, 65536), "cols": cols, "impl": "native"}


def _elementwise(u: np.ndarray, _: str) -> dict[str, Any]:
    return {"numel": 1024 * log_int(u[0], 1, 1 << 18, aligned=False), "fn": choose(u[1], tuple(ELEMENTWISE_FNS))}


def _embedding(u: np.ndarray, _: str) -> dict[str, Any]:
    return {
        "tokens": log_int(u[0], 64, 32768),
        "vocab": log_int(u[1], 1024, 262144),
        "hidden": log_int(u[2], 256, 16384),
    }


def _cross_entropy(u: np.ndarray, _: str) -> dict[str, Any]:
    return {"tokens": log_int(u[0], 64, 16384), "vocab": log_int(u[1], 1024, 262144), "impl": "native"}


def _rope(u: np.ndarray, _: str) -> dict[str, Any]:
    return {
        "tokens": log_int(u[0], 64, 65536),
        "heads": log_int(u[1], 1, 128, aligned=False),
        "head_dim": choose(u[2], (64, 128)),
    }


def _optimizer(u: np.ndarray, _: str) -> dict[str, Any]:
    return {"numel": 1024 * log_int(u[0], 64, 1 << 20, aligned=False)}


SPACES: dict[str, tuple[int, Callable[[np.ndarray, str], dict[str, Any]]]] = {
    "gemm": (5, _gemm),
    "attention": (8, _attention),
    "layernorm": (3, _rowwise),
    "rmsnorm": (3, _rowwise),
    "softmax": (3, _rowwise),
    "elementwise": (2, _elementwise),
    "embedding": (3, _embedding),
    "cross_entropy": (2, _cross_entropy),
    "rope": (3, _rope),
    "optimizer": (1, _optimizer),
}
"""Per op kind: (dimensions of the unit cube, map from a unit-cube point to parameters)."""


def sobol_points(n: int, dims: int, seed: int) -> np.ndarray:
    """The first ``n`` points of a scrambled, seeded Sobol sequence in [0, 1)^dims."""
    from scipy.stats import qmc

    if n <= 0:
        return np.zeros((0, dims))
    sampler = qmc.Sobol(d=dims, scramble=True, seed=seed)
    return sampler.random_base2(max(0, math.ceil(math.log2(n))))[:n]


def _stratum_seed(seed: int, *parts: str) -> int:
    return int.from_bytes(hashlib.sha1(":".join((str(seed), *parts)).encode()).digest()[:4], "little")


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceLimits:
    """What the device can run in one point."""

    spec: DeviceSpec
    """The local device."""
    device_type: str
    """cpu | cuda."""
    max_point_s: float
    """Points whose roofline estimate of one call exceeds this are skipped."""
    max_bytes: float
    """Points whose tensors would exceed this are skipped."""


def tensor_cores_for(dtype: str, device_type: str) -> bool | None:
    """Tensor cores allowed: on CUDA all but fp32 (which runs on CUDA cores, TF32 off)."""
    return None if device_type != "cuda" else dtype != "fp32"


def peak_for(spec: DeviceSpec, dtype: str, device_type: str) -> float:
    """The device's peak for ``dtype``, falling back to fp32 where the sheet has no number."""
    tc = bool(tensor_cores_for(dtype, device_type))
    try:
        return spec.peak_flops(dtype, tensor_cores=tc)
    except OpcastError:
        return spec.peak_fp32_flops


def roofline_s(
    op: str, params: dict[str, Any], dtype: str, direction: str, spec: DeviceSpec, device_type: str
) -> float:
    """max(FLOPs / peak, bytes / bandwidth): a lower bound on one call's time."""
    kind = get_op(op)
    db = dtype_bytes(dtype)
    return max(
        kind.flops(params, direction, db) / peak_for(spec, dtype, device_type),
        kind.bytes_moved(params, db, direction) / spec.mem_bw_bytes_per_s,
    )


def footprint_bytes(op: str, params: dict[str, Any], dtype: str) -> float:
    """Rough bytes of device memory a point allocates (inputs, outputs, saved and grad tensors)."""
    kind = get_op(op)
    db = dtype_bytes(dtype)
    total = kind.bytes_moved(params, db, "fwd")
    if "bwd" in kind.directions(params):
        total += kind.bytes_moved(params, db, "bwd")
    return total


NATIVE_OPS: Final = frozenset({"layernorm", "rmsnorm", "softmax", "cross_entropy"})
"""Ops whose torch kernel (``F.layer_norm``, ``F.rms_norm``, ``torch.softmax``, ``F.cross_entropy``)
is the registry's ``native`` implementation; their points are sampled as native."""


def unsupported_reason(op: str, params: dict[str, Any], dtype: str, device_type: str) -> str | None:
    """Why this device/torch cannot run the point, or None."""
    if dtype == "fp8" and op != "gemm":
        return "fp8 is benchmarked for gemm only"
    if dtype == "fp8" and (params["b"] != 1 or any(params[d] % 16 for d in ("m", "n", "k"))):
        return "fp8 GEMM is benchmarked with b=1 and m, n, k multiples of 16 (torch._scaled_mm)"
    if op in NATIVE_OPS and params.get("impl") == "fused":
        return "impl=fused is a one-pass Apex/Transformer Engine kernel torch lacks; collect runs native or unfused"
    if op in NATIVE_OPS and params.get("impl") == "liger":
        return "impl=liger is Liger-Kernel's Triton kernel, not torch's; collect runs native or unfused"
    if op == "attention" and params["impl"] in ("flash", "flash2") and device_type == "cuda":
        if dtype not in ("fp16", "bf16"):
            return "flash attention on CUDA needs fp16 or bf16"
        if params["head_dim"] > 256 or params["head_dim"] % 8:
            return "flash attention needs head_dim <= 256, a multiple of 8"
    return None


def check_point(op: str, params: dict[str, Any], dtype: str, direction: str, limits: DeviceLimits) -> str | None:
    """The reason to skip a point, or None when it is runnable."""
    reason = unsupported_reason(op, params, dtype, limits.device_type)
    if reason:
        return reason
    if footprint_bytes(op, params, dtype) > limits.max_bytes:
        return "exceeds the memory budget"
    if roofline_s(op, params, dtype, direction, limits.spec, limits.device_type) > limits.max_point_s:
        return "roofline estimate above --max-point-s"
    return None


# --------------------------------------------------------------------------- the plan


def measured_impl(op: str, params: dict[str, Any], limits: DeviceLimits) -> dict[str, Any]:
    """The ``impl`` a point's row is labelled with: torch SDPA's flash backend is FlashAttention-2's kernel, which on a
    CUDA GPU of :data:`opcast.ops.FLASH2_OWN_ARCHITECTURES` (Hopper, Blackwell) is the family ``flash2``, not the
    FlashAttention-3-class ``flash`` the learned models know there."""
    if op == "attention" and params.get("impl") == "flash" and limits.device_type == "cuda":
        return {**params, "impl": sdpa_flash_family(limits.spec.architecture)}
    return params


def _expand(
    op: str,
    params: dict[str, Any],
    dtype: str,
    stratum: str,
    limits: DeviceLimits,
    plan_points: list[PlanPoint],
    skipped: Counter,
    seen: set[str],
) -> None:
    kind = get_op(op)
    try:
        params = kind.validate(measured_impl(op, params, limits))
    except OpcastError:
        skipped[f"{op}: invalid shape"] += 1
        return
    tc = tensor_cores_for(dtype, limits.device_type)
    directions = ("fwd",) if dtype == "fp8" else kind.directions(params)
    for direction in directions:
        pid = point_id(op, params, dtype, direction, tc)
        if pid in seen:
            continue
        seen.add(pid)
        reason = check_point(op, params, dtype, direction, limits)
        if reason:
            skipped[f"{op}: {reason}"] += 1
            continue
        plan_points.append(
            PlanPoint(
                op=op,
                params=params,
                dtype=dtype,
                direction=str(direction),
                tensor_cores=tc,
                stratum=stratum,
                point_id=pid,
            )
        )


def gemm_grads(ops: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``ops`` with, after each GEMM ``C = A @ B``, its data-gradient ``dA = dC @ B^T`` and
    weight-gradient ``dB = A^T @ dC`` as forward GEMMs: the shapes predict's backward graph prices
    (``opcast.predict.graph.backward_ops``)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for kind, p in ops:
        out.append((kind, p))
        if kind == "gemm":
            b, m, n, k = p["b"], p["m"], p["n"], p["k"]
            out += [("gemm", {"b": b, "m": m, "n": k, "k": n}), ("gemm", {"b": b, "m": k, "n": n, "k": m})]
    return out


def arch_shapes(
    arch_names: Iterable[str], tp_degrees: Sequence[int], *, batch_seq: Sequence[tuple[int, int]] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """The exact per-rank ops (kind, params) of the named archs under each valid TP degree, the
    gradient GEMMs of the backward pass included (:func:`gemm_grads`)."""
    from opcast.archs import layer_ops, load_arch, model_ops

    out: list[tuple[str, dict[str, Any]]] = []
    for name in arch_names:
        arch = load_arch(name)
        seq = min(arch.max_seq, 4096)
        for tp in tp_degrees:
            try:
                arch.validate_parallel(tp=tp)
            except OpcastError:
                continue
            for batch, s in batch_seq or ((1, seq), (4, seq)):
                out.extend(gemm_grads(layer_ops(arch, tp=tp, batch=batch, seq=s)))
                out.extend(gemm_grads(model_ops(arch, tp=tp, batch=batch, seq=s)))
            # Adam over one layer's and over the whole rank's parameters (predict prices one fused
            # step over everything a pp=1 rank holds)
            out.append(("optimizer", {"numel": max(1, arch.params_per_layer() // tp)}))
            out.append(("optimizer", {"numel": max(1, arch.params_total() // tp)}))
    return out


def check_tp_degrees(arch_names: Sequence[str], tp_degrees: Sequence[int]) -> None:
    """The one-line error for ``--tp`` degrees a user gave that add no arch shape: without ``--arch``
    (they set nothing), or one that no named arch can split by (:meth:`~opcast.archs.ArchSpec.validate_parallel`;
    :func:`arch_shapes` passes over such a degree, which for the default degrees is what a user wants, but
    an explicit ``--tp 3`` for a 32-head arch measured none of its shapes without a word)."""
    from opcast.archs import load_arch

    if not arch_names:
        raise OpcastError("--tp sets the tensor-parallel degrees of the --arch shapes; give --arch too, or drop --tp")
    archs = [load_arch(name) for name in arch_names]
    for tp in tp_degrees:
        problems: list[str] = []
        for arch in archs:
            try:
                arch.validate_parallel(tp=tp)
            except OpcastError as err:
                problems.append(str(err))
            else:
                break
        else:
            raise OpcastError(f"--tp {tp} fits none of the --arch models ({'; '.join(problems)})")


def check_bench_ops(ops: Sequence[str]) -> None:
    """The one-line error for an ``--op`` that ``collect bench`` cannot measure: unknown, a
    collective (``collect comm``'s) or an engine's fused kernel without a microbenchmark."""
    for op in ops:
        if op in op_kinds(collective=True):
            raise OpcastError(f"{op} is a collective; measure it with `opcast collect comm` under torchrun")
        if not get_op(op).benchmarked:
            raise OpcastError(
                f"{op} has no microbenchmark (an inference engine's fused kernel); replay its measurements with "
                "`opcast collect replay aiconfigurator`"
            )


def make_plan(
    *,
    ops: Sequence[str],
    dtypes: Sequence[str],
    limits: DeviceLimits,
    seed: int = 0,
    per_stratum: int = 64,
    archs: Sequence[str] = (),
    tp_degrees: Sequence[int] = (1, 2, 4, 8),
    arch_batch_seq: Sequence[tuple[int, int]] = (),
    arch_first: bool = False,
) -> Plan:
    """The deterministic, interleaved plan: ``per_stratum`` Sobol points per (op, dtype), plus
    the arch shapes, each validated against ``limits``. ``arch_batch_seq`` replaces the default
    (batch, seq) pairs of the arch shapes (:func:`arch_shapes`); ``arch_first`` puts the arch
    shapes before the sampled ones instead of interleaving them (a run that must cover given
    shapes, e.g. ``opcast calibrate``, measures them first)."""
    check_bench_ops(ops)
    strata: list[list[PlanPoint]] = []
    skipped: Counter = Counter()
    seen: set[str] = set()
    shapes = arch_shapes(archs, tp_degrees, batch_seq=arch_batch_seq) if archs else []

    def arch_points(dtype: str) -> list[PlanPoint]:
        points: list[PlanPoint] = []
        for op, params in shapes:
            if op in ops:
                _expand(op, params, dtype, "arch", limits, points, skipped, seen)
        return points

    first = [p for dtype in dtypes for p in arch_points(dtype)] if arch_first and shapes else []
    for op in ops:  # op-major, dtype inner: a short run reaches every dtype early, not only the first
        for dtype in dtypes:
            dims, to_params = SPACES[op]
            points: list[PlanPoint] = []
            for u in sobol_points(per_stratum, dims, _stratum_seed(seed, op, dtype)):
                _expand(
                    op, to_params(u, limits.device_type), dtype, f"sobol:{op}:{dtype}", limits, points, skipped, seen
                )
            strata.append(points)
    if shapes and not arch_first:
        strata.extend(arch_points(dtype) for dtype in dtypes)
    plan = Plan(points=first, skipped=skipped)
    for i in range(max((len(s) for s in strata), default=0)):  # round-robin across strata
        plan.points.extend(s[i] for s in strata if i < len(s))
    return plan
