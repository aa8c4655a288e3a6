"""The op registry: every kind of operator opcast measures, learns and predicts.

One registry is shared by ``collect`` (what to benchmark and how to store it), ``train`` (the
features: FLOPs, bytes, arithmetic intensity) and ``predict`` (what an arch decomposes into), so
the three can never disagree about what an op's parameters mean or what work it does.

Each :class:`OpSpec` declares its shape parameters, its FLOPs and bytes-moved formulas for the
forward and (where it has one) backward direction, and cross-parameter checks. FLOPs count
multiply-adds as two operations and, for the pointwise ops, one operation per arithmetic step
with each transcendental (exp, tanh, sqrt) counted as one. Bytes are the compulsory DRAM
traffic of an ideal kernel: every input read once, every output written once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, SupportsFloat, cast

from opcast.dtypes import WEIGHT_STORAGE_BITS, weight_storage_bytes
from opcast.errors import OpcastError

ParamValue = int | bool | str
Params = Mapping[str, ParamValue]


class OpKind(StrEnum):
    """Names of the op kinds; the string value is what datasets and the CLI use."""

    GEMM = "gemm"
    ATTENTION = "attention"
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
    SOFTMAX = "softmax"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"
    CROSS_ENTROPY = "cross_entropy"
    ROPE = "rope"
    OPTIMIZER = "optimizer"
    MOE = "moe"
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"


class Direction(StrEnum):
    """Forward pass, or the backward pass (all input gradients of the op)."""

    FWD = "fwd"
    BWD = "bwd"


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    """One shape parameter of an op kind."""

    name: str
    """Column name in datasets and key in parameter mappings."""
    type: type
    """``int``, ``bool`` or ``str``."""
    doc: str
    """What the parameter means, with its unit."""
    choices: tuple[str, ...] | None = None
    """Allowed values of a ``str`` parameter."""
    minimum: int = 1
    """Smallest allowed value of an ``int`` parameter."""
    default: ParamValue | None = None
    """Value taken when the parameter is not given (None: it is required). Lets a kind gain a
    parameter without invalidating older datasets and callers."""
    id_neutral: bool = False
    """Left out of a configuration's id (:func:`opcast.schema.point_id`) at its default or without a value: a
    parameter the kind gained after datasets of it existed, so that their rows, resumable collections and the seeded
    draws over ids stay as they were (the GEMM's ``impl``)."""


Formula = Callable[[Params, float], float]
"""A cost formula of (validated params, bytes per element of the dtype: fractional for the
block-scaled dtypes, :func:`opcast.dtypes.element_bytes`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpSpec:
    """An op kind: its parameters and the work it does in each direction."""

    kind: OpKind
    """Registry key."""
    doc: str
    """One line on what the op computes and the tensor layout the parameters describe."""
    params: tuple[Param, ...]
    """Shape parameters, in canonical order."""
    flops_fwd: Formula
    """Floating-point operations of the forward pass."""
    bytes_fwd: Formula
    """Compulsory bytes moved by the forward pass (for collectives: bus bytes per rank)."""
    flops_bwd: Formula | None = None
    """Floating-point operations of the backward pass; ``None`` when the op has none."""
    bytes_bwd: Formula | None = None
    """Compulsory bytes moved by the backward pass."""
    has_bwd: Callable[[Params], bool] | None = None
    """Whether a particular parameter set has a backward kernel (default: when formulas exist)."""
    check: Callable[[Params], list[str]] | None = None
    """Cross-parameter constraints; returns the list of problems (empty when valid)."""
    collective: bool = False
    """True for communication collectives (parameters: bytes, world_size, nodes, gpus_per_node)."""
    benchmarked: bool = True
    """Whether ``opcast collect bench`` has a microbenchmark of it (:mod:`opcast.collect.ops`); False for a kind
    whose rows come only from replayed measurements of an engine's own fused kernel (``moe``)."""
    source: str = ""
    """Where the formulas come from."""
    param_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_names", tuple(p.name for p in self.params))

    def directions(self, params: Params | None = None) -> tuple[Direction, ...]:
        """Directions this op (or this parameter set of it) can be measured in."""
        if self.flops_bwd is None:
            return (Direction.FWD,)
        if params is not None and self.has_bwd is not None and not self.has_bwd(params):
            return (Direction.FWD,)
        return (Direction.FWD, Direction.BWD)

    def flops(self, params: Params, direction: str = "fwd", dtype_bytes: float = 2) -> float:
        """FLOPs of one call in ``direction``."""
        return float(self._formula(direction, self.flops_fwd, self.flops_bwd)(params, dtype_bytes))

    def bytes_moved(self, params: Params, dtype_bytes: float, direction: str = "fwd") -> float:
        """Compulsory bytes moved by one call in ``direction`` with ``dtype_bytes`` per element."""
        return float(self._formula(direction, self.bytes_fwd, self.bytes_bwd)(params, dtype_bytes))

    def _formula(self, direction: str, fwd: Formula, bwd: Formula | None) -> Formula:
        if direction == Direction.FWD:
            return fwd
        if direction == Direction.BWD and bwd is not None:
            return bwd
        if direction == Direction.BWD:
            raise OpcastError(f"{self.kind} has no backward pass; use direction fwd")
        raise OpcastError(f"unknown direction {direction!r}; use fwd or bwd")

    @property
    def int_params(self) -> tuple[str, ...]:
        """Names of the integer (shape) parameters; the others are categorical."""
        return tuple(p.name for p in self.params if p.type is int)

    @property
    def categorical_params(self) -> tuple[str, ...]:
        """Names of the non-integer parameters (bool flags and choices)."""
        return tuple(p.name for p in self.params if p.type is not int)

    @property
    def defaults(self) -> dict[str, ParamValue]:
        """The optional parameters with the value they take when not given."""
        return {p.name: p.default for p in self.params if p.default is not None}

    def validate(self, params: Mapping[str, object], direction: str | None = None) -> dict[str, ParamValue]:
        """Coerce ``params`` to this kind's types and check them, naming every problem.

        Returns a new dict holding exactly this kind's parameters in canonical order.
        """
        problems: list[str] = []
        out: dict[str, ParamValue] = {}
        for p in self.params:
            given = params.get(p.name)
            if given is None or _is_nan(given):
                if p.default is None:
                    problems.append(f"missing parameter {p.name} ({p.doc})")
                    continue
                given = p.default
            value, problem = _coerce(p, given)
            if problem:
                problems.append(problem)
            else:
                out[p.name] = value
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            problems.append(
                f"unknown parameter(s) {', '.join(unknown)}; {self.kind} takes {', '.join(self.param_names)}"
            )
        if not problems and self.check is not None:
            problems.extend(self.check(out))
        if not problems and direction is not None and direction not in self.directions(out):
            problems.append(f"direction {direction!r} not available; use {' or '.join(self.directions(out))}")
        if problems:
            raise OpcastError(f"invalid {self.kind}: " + "; ".join(problems))
        return out


TRUE_WORDS: Final = ("true", "yes", "on", "1")
FALSE_WORDS: Final = ("false", "no", "off", "0")


def parse_bool(value: object) -> bool | None:
    """A strict boolean from user data (a table cell, a ``--param``): a bool, 1 or 0 (also as an
    integral float, as a CSV column with blanks reads), or one of the words true/false, yes/no,
    on/off, 1/0 in any case; None for a blank (None, NaN, empty text). Anything else raises
    :class:`ValueError` whose message says what was given and what is accepted."""
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # numpy / pandas scalars as plain Python values
    if value is None or _is_nan(value):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if not word:
            return None
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise ValueError(f"{shown} is not a boolean; use true/false, yes/no, on/off or 1/0")


INT_PARAM_LIMIT: Final = 2**63
"""Integer parameters stay below this: datasets store them as int64 (:mod:`opcast.schema`), and so
do the feature tables of the learned models; a larger one would overflow there."""


def whole_number(text: str) -> int | None:
    """``text`` as a whole number >= 0 written in decimal digits (blanks around it allowed), or None.

    The one test of every option that carries counts in a string (``--cluster 16x8``, ``--pp-layers 5,6``,
    ``--input-len 128:1024``, the lists of search serve, ...): ``str.isdigit`` also passes '²' and other
    digits that ``int`` refuses, and ``int`` refuses a string of more than 4,300 digits; both escaped as
    internal errors. A number of more digits than an int64 has comes back as :data:`INT_PARAM_LIMIT`, for
    the caller's bound to refuse as too large."""
    digits = text.strip()
    if not digits.isdecimal():  # exactly the digits int() reads; '' is not decimal
        return None
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else INT_PARAM_LIMIT


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def is_missing(value: object) -> bool:
    """A missing value of a dataset cell: None, NaN, or pandas' NA and NaT (recognised by type name, without
    pandas)."""
    return value is None or _is_nan(value) or type(value).__name__ in ("NAType", "NaTType")


def exact_int(value: object) -> int | None:
    """``value`` as the whole number it writes, or None: ints (numpy's too) and decimal digits as they are,
    integral floats (parquet, a csv column with blanks) and float text ("1e3", "4096.0") through float.
    Digits went through float too, so 2**63 - 1 read as 2**63 (and was refused as too large) and
    9007199254740993 as ...992; the result is bounded (:data:`INT_PARAM_LIMIT`) by the caller."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        body = text[1:] if text[:1] in ("+", "-") else text
        digits = whole_number(body) if body[:1].isdecimal() else None  # no blank after a sign
        if digits is not None:
            return -digits if text[:1] == "-" else digits
    try:
        as_float = float(cast("SupportsFloat | str", value))
    except (TypeError, ValueError):
        return None
    return int(as_float) if as_float.is_integer() else None


def _coerce(p: Param, value: object) -> tuple[ParamValue, str]:
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # numpy / pandas scalars as plain Python values
    if p.type is bool:
        try:
            flag = parse_bool(value)
        except ValueError as err:
            return False, f"{p.name}={err}"
        if flag is None:
            return (False, f"missing parameter {p.name} ({p.doc})") if p.default is None else (p.default, "")
        return flag, ""
    if p.type is int:
        number = exact_int(value)
        if number is None:
            return 0, f"{p.name}={value!r} is not an integer"
        if number < p.minimum:
            return 0, f"{p.name}={number} must be >= {p.minimum}"
        if number >= INT_PARAM_LIMIT:
            return 0, f"{p.name}={value!r} is too large: give an integer below 2**63 (a dataset column is int64)"
        return number, ""
    text = str(value)
    if p.choices is not None and text not in p.choices:
        return "", f"{p.name}={text!r} is not one of {', '.join(p.choices)}"
    return text, ""


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[OpKind, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to the registry; a kind may be registered once, and a parameter name must
    keep one type across kinds (datasets store each parameter in one column)."""
    if spec.kind in _REGISTRY:
        raise ValueError(f"op kind {spec.kind!r} is already registered")
    for p in spec.params:
        for other in _REGISTRY.values():
            for q in other.params:
                if q.name == p.name and q.type is not p.type:
                    raise ValueError(
                        f"parameter {p.name!r} of {spec.kind} is {p.type.__name__} but {q.type.__name__} in "
                        f"{other.kind}"
                    )
    _REGISTRY[spec.kind] = spec
    return spec


def get_op(kind: str) -> OpSpec:
    """The spec of op ``kind``; unknown names raise :class:`OpcastError` listing the known ones."""
    try:
        return _REGISTRY[OpKind(kind)]
    except ValueError:
        raise OpcastError(f"unknown op {kind!r}; known ops: {', '.join(op_kinds())}") from None


def op_kinds(*, collective: bool | None = None, benchmarked: bool | None = None) -> tuple[str, ...]:
    """Registered kinds, optionally only the (non-)collective ones, or only those ``collect bench`` does (not)
    measure (:attr:`OpSpec.benchmarked`)."""
    return tuple(
        k.value
        for k, s in _REGISTRY.items()
        if (collective is None or s.collective == collective) and (benchmarked is None or s.benchmarked == benchmarked)
    )


MATRIX_KINDS: Final = frozenset({OpKind.GEMM.value, OpKind.ATTENTION.value, OpKind.MOE.value})
"""Kinds whose math may run on tensor (matrix) cores; every other kind runs on the vector units."""


def uses_tensor_cores(kind: str, dtype: str, tensor_cores: bool | None = None) -> bool:
    """Whether an op's math runs on tensor cores: only :data:`MATRIX_KINDS`; tf32 always; an
    explicit flag wins; by default fp32 does not (PyTorch leaves TF32 matmul off) and every other
    dtype does. The one statement of this rule: the cost model, the features and the graph use it."""
    if kind not in MATRIX_KINDS:
        return False
    if dtype == "tf32":
        return True
    if tensor_cores is not None:
        return bool(tensor_cores)
    return dtype != "fp32"


def param_defaults(kind: str) -> dict[str, ParamValue]:
    """The optional parameters of ``kind`` with the value they take when not given."""
    return get_op(kind).defaults


def param_types() -> dict[str, type]:
    """Every parameter name of every kind with its type: the op columns of the dataset schema."""
    out: dict[str, type] = {}
    for spec in _REGISTRY.values():
        for p in spec.params:
            out.setdefault(p.name, p.type)
    return out


def arithmetic_intensity(kind: str, params: Params, dtype_bytes: float, direction: str = "fwd") -> float:
    """FLOPs per byte moved (0 for ops that do no arithmetic)."""
    spec = get_op(kind)
    moved = spec.bytes_moved(params, dtype_bytes, direction)
    return spec.flops(params, direction, dtype_bytes) / moved if moved else 0.0


# --------------------------------------------------------------------------- GEMM


def _i(p: Params, name: str) -> int:
    """Integer parameter ``name``; a numpy array stays one, so that a formula can be evaluated
    over many configurations at once (:func:`opcast.train.features` does, in float64)."""
    v = p[name]
    return v if getattr(v, "ndim", 0) else int(v)  # type: ignore[return-value]


def _f(x: float) -> float:
    """``float(x)``, or ``x`` itself when it is an array (see :func:`_i`)."""
    return x if getattr(x, "ndim", 0) else float(x)


def _gemm_flops(p: Params, _: float) -> float:
    return 2.0 * _i(p, "b") * _i(p, "m") * _i(p, "n") * _i(p, "k")


def _gemm_bytes(p: Params, dt: float) -> float:
    b, m, n, k = _i(p, "b"), _i(p, "m"), _i(p, "n"), _i(p, "k")
    return _f(dt * b * (m * k + k * n + m * n))


GEMM_IMPLS: Final = ("cublas", "vllm")
"""GEMM kernel families (``impl``): ``cublas`` the cuBLAS / cuBLASLt GEMMs of torch (``torch.matmul``, ``F.linear``),
Transformer Engine and TensorRT-LLM (``torch_flow``: its fp8 GEMM is one ``cublasLtMatmul`` on per-tensor scales),
the default and every measured GEMM's family but one; ``vllm`` vLLM's per-tensor fp8 linear,
``CutlassFP8ScaledMMLinearKernel`` (CUTLASS ``cutlass_scaled_mm`` with static activation scales; AIConfigurator's
``gemm/vllm`` fp8 rows). The fp8 families differ by tens of per cent, by an amount that moves with the shape and the
GPU: against TensorRT-LLM's rows vLLM's run 0.56-0.63x at m <= 64 (no amax pass in the call) and 1.11x (H100), 1.20x
(H200) and 1.26x (B200) at m > 2,048 (medians over AIConfigurator 0.12.0's shapes of both). Each is a predictor group
of its own (``opcast.train.features.FAMILY_GROUPS``: ``gemm-fwd-fp8_vllm``); a set without a family's group prices
its GEMMs as the default family's (``opcast.predict.cost.learned``). The family is no parameter of a GEMM's work
(flops, bytes)."""


register(
    OpSpec(
        kind=OpKind.GEMM,
        doc="C[b,m,n] = A[b,m,k] @ B[b,k,n]; b=1 is a plain linear layer (m tokens, k in, n out features)",
        params=(
            Param(name="b", type=int, doc="batch of independent matrix products", default=1),
            Param(name="m", type=int, doc="rows of A and C"),
            Param(name="n", type=int, doc="columns of B and C"),
            Param(name="k", type=int, doc="reduction dimension"),
            Param(
                name="impl",
                type=str,
                doc="kernel family: cublas (cuBLAS/cuBLASLt: torch, Transformer Engine, TensorRT-LLM) or vllm (vLLM's "
                "CUTLASS fp8 scaled_mm)",
                choices=GEMM_IMPLS,
                default="cublas",
                id_neutral=True,
            ),
        ),
        flops_fwd=_gemm_flops,
        bytes_fwd=_gemm_bytes,
        # Backward: dA = dC @ B^T and dB = A^T @ dC, two GEMMs of the forward's size, each reading
        # two of the three operands and writing the third.
        flops_bwd=lambda p, dt: 2.0 * _gemm_flops(p, dt),
        bytes_bwd=lambda p, dt: 2.0 * _gemm_bytes(p, dt),
        source="2*m*n*k multiply-add count (e.g. Narayanan et al. 2021, arXiv 2104.04473, Sec. 5.1)",
    )
)


FLASH2_OWN_ARCHITECTURES: Final = frozenset({"hopper", "blackwell"})
"""Architectures where FlashAttention-2 is not the kernel the learned ``flash`` models measured: their attention
rows are TensorRT-LLM's and cuDNN's FlashAttention-3-class kernels (AIConfigurator's), about twice
FlashAttention-2's speed (FlashAttention-2's H100 figure, ``opcast.predict.cost.published.FA2_FWD_BWD_TFLOPS``,
against FlashAttention-3's; on a real H200 torch SDPA's flash backend ran training attention at 0.45-0.5 of what
the learned ``flash`` predicted, ``benchmarks/h200_measured.py``). On Ampere and Ada the learned ``flash`` rows
are FlashAttention-2's (Vidur's and 2509.22832's A100 and A40 runs). On these architectures ``opcast collect``
labels torch SDPA's flash backend ``flash2``, so that its measured rows are their own family's (a set fitted on them
speaks for ``flash2`` where they were measured)."""


def sdpa_flash_family(architecture: str) -> str:
    """The ``impl`` of torch SDPA's flash backend (FlashAttention-2's kernel) on a GPU of ``architecture``: ``flash2``
    where that is a family of its own (:data:`FLASH2_OWN_ARCHITECTURES`), ``flash`` elsewhere."""
    return "flash2" if architecture in FLASH2_OWN_ARCHITECTURES else "flash"


# --------------------------------------------------------------------------- attention

ATTENTION_IMPLS: Final = ("flash", "sdpa", "eager")
"""Attention kernel families the microbenchmarks run and the learned models code (``impl_code`` 0, 1, 2:
``opcast.train.features`` codes ``impl`` as the position in ``(*ATTENTION_IMPLS, *ROPE_IMPLS)``, so this
tuple keeps its three members, and the norms' codes after them do not shift): ``flash`` FlashAttention-2/3
(flash-attn 2, torch SDPA's flash backend, FlashAttention-3 and TensorRT-LLM kernels on Hopper), ``sdpa``
torch SDPA's other backends, ``eager`` the score matrix in memory."""

PUBLISHED_ATTENTION_IMPLS: Final = ("flash1", "flash2")
"""Attention implementations priced from published measurements only, appended after
:data:`ATTENTION_IMPLS` among attention's ``impl`` choices (no microbenchmark runs them, no learned
model codes them): ``flash1``, FlashAttention-1-generation kernels (FlashAttention-1's CUDA kernels,
HazyResearch's / OpenAI's Triton FlashAttention as llm-foundry's ``attn_impl: triton`` ran it),
priced by ``opcast.predict.cost.published`` at FlashAttention-1's measured speed; ``flash2``,
FlashAttention-2-generation kernels (flash-attn 2, torch SDPA's flash backend) on Hopper and Blackwell,
priced at FlashAttention-2's measured H100 speed, where the learned ``flash`` models measured
FlashAttention-3-class kernels about twice as fast (elsewhere ``flash`` is FlashAttention-2 and the graph
prices ``flash2`` as it: :func:`opcast.predict.graph.precision_of`). Same FLOPs and bytes as ``flash``
(tiled, S recomputed in backward); FlashAttention-1 runs at about half FlashAttention-2's speed on A100."""


def _attention_pairs(p: Params) -> float:
    """Query-key pairs computed: all of them, or the causal (bottom-right aligned) triangle."""
    sq, skv = _i(p, "seq_q"), _i(p, "seq_kv")
    if not p["causal"] or p["impl"] == "eager":  # eager computes the full score matrix, then masks
        return _f(sq * skv)
    # Row i of the queries sees skv - sq + i + 1 keys (flash-attn >= 2.1 convention).
    return _f(sq * (skv - sq) + sq * (sq + 1) / 2)


def _attention_flops_fwd(p: Params, _: float) -> float:
    # Two GEMMs (S = Q K^T and O = P V), 2*d FLOPs per pair each: 4*d per pair.
    return 4.0 * _i(p, "batch") * _i(p, "heads") * _i(p, "head_dim") * _attention_pairs(p)


def _attention_flops_bwd(p: Params, dt: float) -> float:
    # FlashAttention-2 (Dao 2023, arXiv 2307.08691, Sec. 3.2): five GEMMs in backward (S recomputed,
    # dV, dP, dQ, dK) against two forward, 2.5x; eager keeps P and runs four, 2x.
    return (2.0 if p["impl"] == "eager" else 2.5) * _attention_flops_fwd(p, dt)


def _attention_io(p: Params, dt: float, q_like: int, kv_like: int) -> float:
    b, h, kvh, d = _i(p, "batch"), _i(p, "heads"), _i(p, "kv_heads"), _i(p, "head_dim")
    sq, skv = _i(p, "seq_q"), _i(p, "seq_kv")
    return _f(dt * (q_like * b * h * sq * d + kv_like * b * kvh * skv * d) + 4 * b * h * sq)  # + fp32 logsumexp


def _attention_scores_bytes(p: Params, dt: float) -> float:
    return _f(dt * _i(p, "batch") * _i(p, "heads") * _i(p, "seq_q") * _i(p, "seq_kv"))


def _attention_bytes_fwd(p: Params, dt: float) -> float:
    io = _attention_io(p, dt, q_like=2, kv_like=2)  # read Q, K, V; write O
    if p["impl"] == "eager":  # write S, read S, write P, read P
        io += 4 * _attention_scores_bytes(p, dt)
    return io


def _attention_bytes_bwd(p: Params, dt: float) -> float:
    io = _attention_io(p, dt, q_like=4, kv_like=4)  # read Q, O, dO, K, V; write dQ, dK, dV
    if p["impl"] == "eager":  # read P, write dP, read dP, write dS, read dS (twice: dQ and dK)
        io += 6 * _attention_scores_bytes(p, dt)
    return io


def _attention_check(p: Params) -> list[str]:
    problems = []
    if _i(p, "heads") % _i(p, "kv_heads"):
        problems.append(f"kv_heads={p['kv_heads']} does not divide heads={p['heads']}")
    if p["causal"] and _i(p, "seq_q") > _i(p, "seq_kv"):
        problems.append(f"causal attention needs seq_q={p['seq_q']} <= seq_kv={p['seq_kv']}")
    return problems


register(
    OpSpec(
        kind=OpKind.ATTENTION,
        doc="softmax(Q K^T / sqrt(d)) V with Q [batch, heads, seq_q, head_dim], K/V [batch, kv_heads, seq_kv, "
        "head_dim]",
        params=(
            Param(name="batch", type=int, doc="sequences in the batch"),
            Param(name="heads", type=int, doc="query heads (per rank)"),
            Param(name="kv_heads", type=int, doc="key/value heads (per rank; < heads for GQA/MQA)"),
            Param(name="seq_q", type=int, doc="query length (1 for a decode step)"),
            Param(name="seq_kv", type=int, doc="key/value length"),
            Param(name="head_dim", type=int, doc="channels per head"),
            Param(name="causal", type=bool, doc="causal mask"),
            Param(
                name="impl",
                type=str,
                doc="kernel family: flash (FlashAttention-2/3), sdpa, eager, flash1 (FlashAttention-1 generation), "
                "flash2 (FlashAttention-2 generation on Hopper and Blackwell)",
                choices=(*ATTENTION_IMPLS, *PUBLISHED_ATTENTION_IMPLS),
            ),
        ),
        flops_fwd=_attention_flops_fwd,
        bytes_fwd=_attention_bytes_fwd,
        flops_bwd=_attention_flops_bwd,
        bytes_bwd=_attention_bytes_bwd,
        check=_attention_check,
        source="FlashAttention-2 FLOP count (Dao 2023, arXiv 2307.08691); causal pairs per flash-attn 2.1 alignment",
    )
)


# --------------------------------------------------------------------------- row-wise ops

KERNEL_IMPLS: Final = ("fused", "unfused", "native", "liger")
"""How a non-matrix op runs, named by the kernel that runs it (``native`` and then ``liger`` were
appended, so that the ordinal codes of the others do not shift):

- ``fused``: a hand-written one-pass CUDA kernel (two or three for a backward with a separate
  weight-gradient reduction) that reads its inputs and writes its outputs once, the row held in
  registers or shared memory: Apex's and Transformer Engine's fused LayerNorm and RMSNorm (Apex
  runs RMSNorm through its LayerNorm kernels with ``rms_only``, ``csrc/layer_norm_cuda_kernel.cu``
  ``cuApplyRMSNorm`` / ``HostRMSNormGradient``; TE's ``rmsnorm_bwd_tuned_kernel`` is its
  ``ln_bwd_tuned_kernel`` less the mean terms), Megatron's fused softmax kernels, flash-attn's
  cross-entropy kernel.
- ``liger``: Liger-Kernel's Triton kernels (``LigerRMSNorm``, ``LigerLayerNorm``, ``LigerSoftmax``,
  ``LigerCrossEntropyLoss``, ``liger_rotary_pos_emb``), what Hugging Face runs with
  ``use_liger_kernel`` (:mod:`opcast.predict.frameworks` ``hf-liger``). One pass as well, but a
  different implementation with its own speed: Liger 0.2.1's RMSNorm backward runs one persistent
  program per SM and a partial-sum pass for the weight gradient, 7-31 % of A100's bandwidth where
  Apex / TE kernels reach 60-90 % (benchmarks/results/kernel_sanity.md). The compulsory bytes are
  those of ``fused`` (Liger's cross-entropy forward also writes the gradient into the logits and its
  backward only scales it: the pair moves the fused pair's bytes, split differently).
- ``native``: torch's own single-launch kernel for the op (``F.layer_norm``, ``F.rms_norm`` since
  torch 2.8's ``aten::_fused_rms_norm`` (pytorch PR #153666; from 2.4 to 2.7 it was a composition of
  torch ops, i.e. unfused), ``torch.softmax``, ``F.cross_entropy`` = ``log_softmax`` + ``nll_loss``:
  two kernels),
  and vLLM's 2023 ``rms_norm_kernel``: one launch, but several passes over the row in global
  memory (and a block-per-row reduction), measured at 24-57 % of memory bandwidth
  (benchmarks/results/kernel_sanity.md). The compulsory bytes are those of ``fused``: the
  difference is the kernel's efficiency, which the learned models carry by this code.
- ``unfused``: a Python composition of elementwise and reduction kernels, each a pass over the
  tensor (GPT-NeoX's and Hugging Face Llama's RMSNorm, Megatron's ``vocab_parallel_cross_entropy``).

Each implementation is priced from measurements of that implementation only; where a device or
shape has none, by the no-data rule (:func:`opcast.predict.cost.model.decompose`): one streaming kernel
over the implementation's registry traffic, priced as the learned elementwise kernel that moves as many
bytes (its device's streaming bandwidth and launch floor), the roofline of that traffic where no
elementwise model covers the dtype. Rope has no
torch native kernel: its ``impl`` takes ``fused``, ``unfused`` or ``liger`` (:func:`_rope_check`)."""

_IMPL = Param(
    name="impl",
    type=str,
    doc="fused (one one-pass CUDA kernel: Apex, Transformer Engine, Megatron), unfused (a Python composition of "
    "torch ops, one pass each), native (torch's single-launch multi-pass kernel: F.layer_norm, F.rms_norm, "
    "torch.softmax, F.cross_entropy) or liger (Liger-Kernel's Triton kernels)",
    choices=KERNEL_IMPLS,
    default="fused",
)


def _unfused(p: Params) -> bool:
    return p.get("impl", "fused") == "unfused"


_ROWS = Param(name="rows", type=int, doc="independent rows (tokens)")
_COLS = Param(name="cols", type=int, doc="elements per row, reduced over (hidden size or softmax width)")


def _rc(p: Params) -> float:
    return _f(_i(p, "rows") * _i(p, "cols"))


UNFUSED_PASSES: Final[dict[str, dict[str, tuple[int, int]]]] = {
    # kind: {direction: (fused, unfused) passes over the [rows, cols] (or [tokens, vocab]) tensor}
    "layernorm": {"fwd": (2, 11), "bwd": (3, 20)},
    "rmsnorm": {"fwd": (2, 5), "bwd": (3, 21)},
    "softmax": {"fwd": (2, 8), "bwd": (3, 9)},
    "cross_entropy": {"fwd": (1, 8), "bwd": (2, 3)},
}
"""Element passes (one read or one write of the whole tensor) of each implementation. Fused: the
compulsory traffic (inputs read once, outputs written once). Unfused, counted over the torch ops
and their autograd: GPT-NeoX's RMSNorm (``megatron/model/norms.py``: ``x.norm`` reads x, ``x / rms``
reads x and writes x_n, ``scale * x_n`` reads and writes: 5; its backward, through mul, div and
norm with the broadcast reductions of d(scale) and d(rms): 21); a LayerNorm written as mean,
subtract, variance, rsqrt-multiply, gamma, beta (11; backward 20); a softmax as max, subtract, exp,
sum, divide (8; backward: y * dy, sum, subtract, multiply: 9); Megatron's
``vocab_parallel_cross_entropy`` (max, subtract, exp, sum, divide into the saved softmax, gather of
the target logit: 8; backward: the saved softmax minus the one-hot, times the loss gradient: 3)."""


TENSOR_OP_ALIGN_BYTES: Final = 16
"""cuBLAS's tensor-op GEMM kernels read their operands 16 bytes at a time, so the leading dimensions of a GEMM on
tensor cores must be multiples of 16 bytes for them (cuBLAS documentation, "Tensor Core Usage"; NVIDIA's Matrix
Multiplication Background User's Guide, Sec. 2.2: since cuBLAS 11 other sizes still run on tensor cores, through
slower kernels). For ``x[m, k] @ w[k, n]`` those are k and n; m is free. Measured on an H200 with torch's cuBLAS
(``benchmarks/data/h200_torch/kernels/bf16_gemm``): bf16 GEMMs with n or k odd ran 1.9x (under 50 us) to 3.7x
(above) slower than the aligned ones' model prices them; with only m odd, as the aligned ones."""

_TENSOR_OP_STORAGE_BITS: Final[dict[str, int]] = {
    "tf32": 32,
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "fp8_block": 8,
    "nvfp4": 4,
}
"""Storage bits of an operand element of each tensor-core GEMM dtype (block scales are separate tensors)."""


def misaligned_tensor_gemm(n: object, k: object, dtype: str, tensor_cores: bool) -> bool:
    """Whether a GEMM on tensor cores has a leading dimension (n or k) that is not a multiple of
    :data:`TENSOR_OP_ALIGN_BYTES`: cuBLAS runs another, slower kernel for it. False off tensor cores (an fp32
    CUDA-core GEMM takes any size) and for a size that is not a number."""
    bits = _TENSOR_OP_STORAGE_BITS.get(dtype) if tensor_cores else None
    if bits is None:
        return False
    align = TENSOR_OP_ALIGN_BYTES * 8 // bits
    for v in (n, k):
        try:
            f = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(f) and f >= 1 and int(f) % align:
            return True
    return False


NATIVE_EXTRA_PASSES: Final[dict[str, dict[str, int]]] = {"cross_entropy": {"fwd": 1, "bwd": 2}}
"""Passes over the tensor that torch's native kernels make beyond the compulsory ones (the fused column of
:data:`UNFUSED_PASSES`), for the kinds whose native form is more than one kernel. ``F.cross_entropy`` is
``log_softmax``, which writes the log-probabilities (one more pass), then ``nll_loss``; its backward is
``nll_loss_backward``, which writes the whole gradient of the log-probabilities (zeros and the targets'
entries), then ``log_softmax_backward_data``, which reads it and the saved output and writes the logits'
gradient (two more than the fused pair's two; PyTorch ``aten/src/ATen/native/LossNLL.cpp``,
``SoftMax.cpp``). The registry's bytes stay the compulsory ones, as for every ``native`` kernel (a learned
model carries an implementation's efficiency by its code, and the features of fitted sets do not move); the
no-data rule prices this traffic (:func:`opcast.predict.cost.model.decompose`). On a real H200 with no data of
it, the compulsory bytes priced torch's cross-entropy of llama3-8b's 4,096 x 128,256 logits at 0.45 of its
measured 2.36 ms (``benchmarks/results/h200_measured.md``)."""


def native_extra_bytes(kind: str, params: Params, elem_bytes: float, direction: str) -> float:
    """Bytes torch's native kernels of ``kind`` move beyond the registry's compulsory ones
    (:data:`NATIVE_EXTRA_PASSES`; 0 for another ``impl`` and for the single-kernel kinds)."""
    extra = NATIVE_EXTRA_PASSES.get(kind, {}).get(direction, 0) if params.get("impl") == "native" else 0
    return extra * elem_bytes * _tv(params) if extra else 0.0


def _passes(p: Params, kind: str, direction: str) -> int:
    return UNFUSED_PASSES[kind][direction][1 if _unfused(p) else 0]


register(
    OpSpec(
        kind=OpKind.LAYERNORM,
        doc="y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim of x [rows, cols]",
        params=(_ROWS, _COLS, _IMPL),
        # mean 1, variance 3, normalise 2, affine 2 per element; backward about twice that.
        flops_fwd=lambda p, dt: 8.0 * _rc(p),
        bytes_fwd=lambda p, dt: (
            dt * (_passes(p, "layernorm", "fwd") * _rc(p) + 2 * _i(p, "cols")) + 8.0 * _i(p, "rows")
        ),  # x, y, gamma, beta; fp32 mean/rstd
        flops_bwd=lambda p, dt: 16.0 * _rc(p),
        bytes_bwd=lambda p, dt: (
            dt * (_passes(p, "layernorm", "bwd") * _rc(p) + 4 * _i(p, "cols")) + 8.0 * _i(p, "rows")
        ),  # x, dy, dx; gamma, beta, dgamma, dbeta
        source="Ba et al. 2016 (arXiv 1607.06450); per-element operation count; unfused passes in UNFUSED_PASSES",
    )
)

register(
    OpSpec(
        kind=OpKind.RMSNORM,
        doc="y = x / sqrt(mean(x^2) + eps) * gamma over the last dim of x [rows, cols]",
        params=(_ROWS, _COLS, _IMPL),
        flops_fwd=lambda p, dt: 4.0 * _rc(p),  # square, accumulate, scale, gamma
        bytes_fwd=lambda p, dt: dt * (_passes(p, "rmsnorm", "fwd") * _rc(p) + _i(p, "cols")) + 4.0 * _i(p, "rows"),
        flops_bwd=lambda p, dt: 8.0 * _rc(p),
        bytes_bwd=lambda p, dt: dt * (_passes(p, "rmsnorm", "bwd") * _rc(p) + 2 * _i(p, "cols")) + 4.0 * _i(p, "rows"),
        source="Zhang & Sennrich 2019 (arXiv 1910.07467); per-element operation count; unfused passes in "
        "UNFUSED_PASSES",
    )
)

register(
    OpSpec(
        kind=OpKind.SOFTMAX,
        doc="y = exp(x - max) / sum(exp(x - max)) over the last dim of x [rows, cols]",
        params=(_ROWS, _COLS, _IMPL),
        flops_fwd=lambda p, dt: 5.0 * _rc(p),  # max, subtract, exp, sum, divide
        bytes_fwd=lambda p, dt: dt * _passes(p, "softmax", "fwd") * _rc(p),
        flops_bwd=lambda p, dt: 4.0 * _rc(p),  # dx = y * (dy - sum(dy * y)): multiply, sum, subtract, multiply
        bytes_bwd=lambda p, dt: dt * _passes(p, "softmax", "bwd") * _rc(p),
        source="per-element operation count of the numerically stable softmax; unfused passes in UNFUSED_PASSES",
    )
)


# --------------------------------------------------------------------------- elementwise


@dataclass(frozen=True, kw_only=True, slots=True)
class ElementwiseFn:
    """Per-element cost of one pointwise function."""

    inputs: int
    """Tensor inputs of numel elements (a scalar operand does not count)."""
    flops: float
    """Operations per element, forward."""
    bwd: tuple[int, int, float] | None
    """Backward (tensors read, tensors written, operations) per element; None: no kernel (identity)."""
    extra_bytes_per_elem: float = 0.0
    """Extra bytes per element in each direction (e.g. dropout's 1-byte mask)."""


ELEMENTWISE_FNS: Final[dict[str, ElementwiseFn]] = {
    "add": ElementwiseFn(inputs=2, flops=1, bwd=None),
    "sub": ElementwiseFn(inputs=2, flops=1, bwd=None),
    "mul": ElementwiseFn(inputs=2, flops=1, bwd=(3, 2, 2)),
    "div": ElementwiseFn(inputs=2, flops=1, bwd=(3, 2, 4)),
    "pow": ElementwiseFn(inputs=2, flops=1, bwd=(3, 2, 6)),
    "add_scalar": ElementwiseFn(inputs=1, flops=1, bwd=None),
    "sub_scalar": ElementwiseFn(inputs=1, flops=1, bwd=None),
    "mul_scalar": ElementwiseFn(inputs=1, flops=1, bwd=(1, 1, 1)),
    "div_scalar": ElementwiseFn(inputs=1, flops=1, bwd=(1, 1, 1)),
    "pow_scalar": ElementwiseFn(inputs=1, flops=1, bwd=(2, 1, 3)),
    "relu": ElementwiseFn(inputs=1, flops=1, bwd=(2, 1, 1)),
    "gelu": ElementwiseFn(inputs=1, flops=8, bwd=(2, 1, 12)),  # tanh form: x/2 (1 + tanh(c (x + 0.044715 x^3)))
    "silu": ElementwiseFn(inputs=1, flops=4, bwd=(2, 1, 6)),  # x * sigmoid(x)
    "sigmoid": ElementwiseFn(inputs=1, flops=3, bwd=(2, 1, 2)),
    "tanh": ElementwiseFn(inputs=1, flops=1, bwd=(2, 1, 2)),
    "exp": ElementwiseFn(inputs=1, flops=1, bwd=(2, 1, 1)),
    "swiglu": ElementwiseFn(inputs=2, flops=5, bwd=(3, 2, 10)),  # silu(a) * b, fused
    "dropout": ElementwiseFn(
        inputs=1, flops=2, bwd=(1, 1, 1), extra_bytes_per_elem=1.0
    ),  # bool mask written, then read
    "copy": ElementwiseFn(inputs=1, flops=0, bwd=None),
}


def _ew(p: Params) -> ElementwiseFn:
    return ELEMENTWISE_FNS[str(p["fn"])]


def _ew_bwd_flops(p: Params, dt: float) -> float:
    bwd = _ew(p).bwd
    return _f(bwd[2] * _i(p, "numel")) if bwd else 0.0


def _ew_bwd_bytes(p: Params, dt: float) -> float:
    fn = _ew(p)
    if fn.bwd is None:
        return 0.0
    return _f(_i(p, "numel") * (dt * (fn.bwd[0] + fn.bwd[1]) + fn.extra_bytes_per_elem))


register(
    OpSpec(
        kind=OpKind.ELEMENTWISE,
        doc="y = fn(x[, x2]) over numel elements (the *_scalar variants take a scalar second operand)",
        params=(
            Param(name="numel", type=int, doc="elements of the output"),
            Param(name="fn", type=str, doc="pointwise function", choices=tuple(ELEMENTWISE_FNS)),
        ),
        flops_fwd=lambda p, dt: _ew(p).flops * _i(p, "numel"),
        bytes_fwd=lambda p, dt: _i(p, "numel") * (dt * (_ew(p).inputs + 1) + _ew(p).extra_bytes_per_elem),
        flops_bwd=_ew_bwd_flops,
        bytes_bwd=_ew_bwd_bytes,
        has_bwd=lambda p: _ew(p).bwd is not None,
        source="per-element operation counts; each input read and the output written once",
    )
)


# --------------------------------------------------------------------------- model-level ops

register(
    OpSpec(
        kind=OpKind.EMBEDDING,
        doc="y[t] = table[ids[t]] for tokens ids into a [vocab, hidden] table",
        params=(
            Param(name="tokens", type=int, doc="looked-up token ids"),
            Param(name="vocab", type=int, doc="rows of the table (per rank when vocab-parallel)"),
            Param(name="hidden", type=int, doc="embedding width"),
        ),
        flops_fwd=lambda p, dt: 0.0,
        bytes_fwd=lambda p, dt: (
            8.0 * _i(p, "tokens") + dt * 2.0 * _i(p, "tokens") * _i(p, "hidden")
        ),  # int64 ids, rows, output
        # Backward: zero the dense [vocab, hidden] gradient, then scatter-add the token rows into it.
        flops_bwd=lambda p, dt: _f(_i(p, "tokens") * _i(p, "hidden")),
        bytes_bwd=lambda p, dt: (
            8.0 * _i(p, "tokens") + dt * (_i(p, "vocab") * _i(p, "hidden") + 3.0 * _i(p, "tokens") * _i(p, "hidden"))
        ),
        source="gather / scatter-add traffic of torch.nn.functional.embedding with a dense gradient",
    )
)


def _tv(p: Params) -> float:
    return _f(_i(p, "tokens") * _i(p, "vocab"))


register(
    OpSpec(
        kind=OpKind.CROSS_ENTROPY,
        doc="mean over tokens of -log softmax(logits)[target] with logits [tokens, vocab]",
        params=(
            Param(name="tokens", type=int, doc="predicted tokens"),
            Param(name="vocab", type=int, doc="logit width (per rank when vocab-parallel)"),
            _IMPL,
        ),
        flops_fwd=lambda p, dt: 4.0 * _tv(p),  # max, subtract, exp, sum
        bytes_fwd=lambda p, dt: (
            dt * _passes(p, "cross_entropy", "fwd") * _tv(p) + 16.0 * _i(p, "tokens")
        ),  # logits, int64 targets, loss
        flops_bwd=lambda p, dt: 3.0 * _tv(p),  # softmax from saved logsumexp, minus one-hot, scale
        bytes_bwd=lambda p, dt: dt * _passes(p, "cross_entropy", "bwd") * _tv(p) + 16.0 * _i(p, "tokens"),
        source="log-softmax + NLL per-element count (PyTorch cross_entropy); unfused passes in UNFUSED_PASSES",
    )
)


@functools.cache
def takes_kernel_impls(kind: str) -> bool:
    """Whether op ``kind``'s ``impl`` parameter chooses among :data:`KERNEL_IMPLS` (norms, softmax,
    cross-entropy, rope)."""
    return next((p.choices for p in get_op(kind).params if p.name == "impl"), None) == KERNEL_IMPLS


ROPE_IMPLS: Final = KERNEL_IMPLS


def _rope_bytes(p: Params, dt: float) -> float:
    """Fused and liger: read x, cos, sin, write y. Unfused (x*cos + cat(-x2, x1)*sin as torch ops): x*cos
    reads x and cos, writes t1; the neg and cat read half and all of x and write half and all of
    it; the multiply by sin reads and writes one more x-sized tensor, the add two in one out:
    about 10 x-sized passes plus cos and sin."""
    x = _i(p, "tokens") * _i(p, "heads") * _i(p, "head_dim")
    table = 2.0 * _i(p, "tokens") * _i(p, "head_dim")
    return dt * ((10.0 if p.get("impl", "unfused") == "unfused" else 2.0) * x + table)


def _rope_check(p: Params) -> list[str]:
    if p.get("impl") == "native":
        return ["impl=native: torch has no native rotary-embedding kernel; use impl fused, unfused or liger"]
    return []


register(
    OpSpec(
        kind=OpKind.ROPE,
        doc="rotary position embedding of x [tokens, heads, head_dim] (Su et al. 2021, arXiv 2104.09864)",
        params=(
            Param(name="tokens", type=int, doc="positions (batch x sequence)"),
            Param(name="heads", type=int, doc="heads rotated (queries and keys together, per rank)"),
            Param(name="head_dim", type=int, doc="channels per head"),
            Param(
                name="impl",
                type=str,
                doc="fused (one kernel: vLLM, apex, Transformer Engine), unfused (torch ops: "
                "Hugging Face / Megatron apply_rotary_pos_emb) or liger (Liger-Kernel's Triton liger_rotary_pos_emb)",
                choices=ROPE_IMPLS,
                default="unfused",
            ),
        ),
        # y = x * cos + rotate_half(x) * sin: two multiplies and an add per element.
        flops_fwd=lambda p, dt: 3.0 * _i(p, "tokens") * _i(p, "heads") * _i(p, "head_dim"),
        bytes_fwd=lambda p, dt: _rope_bytes(p, dt),
        flops_bwd=lambda p, dt: 3.0 * _i(p, "tokens") * _i(p, "heads") * _i(p, "head_dim"),
        bytes_bwd=lambda p, dt: _rope_bytes(p, dt),
        check=_rope_check,
        source="Su et al. 2021 (arXiv 2104.09864), Eq. 34; unfused traffic counted over the torch ops of Hugging Face "
        "Llama's apply_rotary_pos_emb",
    )
)

register(
    OpSpec(
        kind=OpKind.OPTIMIZER,
        doc="one Adam step over numel parameters, states in the parameter dtype (torch.optim.Adam)",
        params=(Param(name="numel", type=int, doc="parameters updated"),),
        # Kingma & Ba 2015 (arXiv 1412.6980) Algorithm 1: m update 3, v update 4, step 5 per element.
        flops_fwd=lambda p, dt: 12.0 * _i(p, "numel"),
        bytes_fwd=lambda p, dt: 7.0 * dt * _i(p, "numel"),  # read param, grad, m, v; write param, m, v
        source="Kingma & Ba 2015 (arXiv 1412.6980), Algorithm 1",
    )
)


# --------------------------------------------------------------------------- fused MoE layer

MOE_FNS: Final = ("silu", "gelu", "relu")
"""Activations of a fused MoE layer's experts (``fn``): SwiGLU's silu when gated; AIConfigurator's non-gated
rows are Nemotron-3's squared ReLU (TensorRT-LLM ``ActivationType.Relu2``), coded ``relu``."""


def moe_balanced_experts(p: Params) -> tuple[float, float]:
    """(busy experts, rows of each) on one of ``ep`` ranks of a fused MoE layer whose ``tokens`` tokens each
    pick ``topk`` of ``experts`` experts with balanced routing: the rank's ``ceil(tokens * topk / ep)``
    (token, expert) pairs spread over as many of its ``experts / ep`` experts as they can reach, one row each
    until every expert has one (AIConfigurator's ``balanced_logits``: token ``t``'s ``i``-th expert is
    ``(t + i * ceil(experts / topk)) % experts``, spread out when there are fewer tokens than that stride).
    Array-safe (:func:`_i`)."""
    local = _i(p, "experts") // _i(p, "ep")
    pairs = -(-_i(p, "tokens") * _i(p, "topk") // _i(p, "ep"))
    busy = pairs + (local - pairs) * (local < pairs)
    return busy, -(-pairs // busy)


def _moe_width(p: Params) -> float:
    """Weights of one expert over ``hidden x inter``: up (twice as wide when gated) and down."""
    return (3 if p["gated"] else 2) * _i(p, "hidden") * _i(p, "inter")


def _moe_flops(p: Params, _: float) -> float:
    busy, rows = moe_balanced_experts(p)
    return _f(2.0 * busy * rows * _moe_width(p))


MOE_IMPLS: Final = ("trtllm", "vllm", "marlin")
"""Fused MoE kernel families (``impl``), named by the kernels whose layer they time: ``trtllm``
TensorRT-LLM's fused MoE (CUTLASS / TRT-LLM-gen grouped GEMMs; AIConfigurator's ``moe/trtllm`` rows, the
default), ``vllm`` vLLM's own ``FusedMoE`` layer as it dispatches on the GPU and dtype (Triton ``fused_moe``,
OpenAI Triton ``matmul_ogs`` for gpt-oss's MXFP4 on Hopper, FlashInfer's CUTLASS / TRT-LLM-gen kernels on
Blackwell; AIConfigurator's ``moe/vllm`` rows but Marlin's), ``marlin`` vLLM's Marlin W4A16 MoE (IST-DASLab's
Marlin, ``vllm/model_executor/layers/fused_moe/fused_marlin_moe.py``: the 4-bit weights dequantised in registers,
``mma.sync`` bf16 tensor-core math on every GPU, Hopper's and Blackwell's included; AIConfigurator's vLLM rows of
a ``*marlin*`` kernel source). vLLM runs Marlin for MXFP4 experts where it has no faster kernel
(:func:`opcast.predict.serve.engine.moe_impl`). The families differ by tens of per cent (Marlin on an H100 about 2x
TensorRT-LLM's time at a prefill's token counts) by an amount that moves per GPU and dtype, so each family is a
predictor group of its own (``opcast.train.features.FAMILY_GROUPS``); a set without a family's group prices it as
the default family's (``opcast.predict.cost.learned``)."""


MOE_WEIGHTS: Final = ("dtype", *WEIGHT_STORAGE_BITS)
"""How a fused MoE layer's expert weights are stored (``weights``): in the GEMMs' dtype, or weight-only narrower
(:data:`opcast.dtypes.WEIGHT_STORAGE_BITS`: gpt-oss's MXFP4, dequantised in the kernel, the activations in dtype)."""


def _moe_weight_bytes(p: Params, dt: float) -> float:
    """Bytes an expert weight element: ``dt`` (the dtype's) or its storage format's (a missing ``weights``, as in
    a dataset written before the parameter, is the dtype's). Array-safe (:func:`_i`): an array of names compares
    element-wise."""
    storage = p.get("weights", "dtype")
    out = dt
    for name in WEIGHT_STORAGE_BITS:
        out = out + (weight_storage_bytes(name) - dt) * (storage == name)
    return out


def _moe_bytes(p: Params, dt: float) -> float:
    busy, _ = moe_balanced_experts(p)
    return _f(_moe_weight_bytes(p, dt) * busy * _moe_width(p) + dt * 2.0 * _i(p, "tokens") * _i(p, "hidden"))


def _moe_check(p: Params) -> list[str]:
    problems = []
    if _i(p, "experts") % _i(p, "ep"):
        problems.append(f"ep={p['ep']} does not divide experts={p['experts']}")
    if _i(p, "topk") > _i(p, "experts"):
        problems.append(f"topk={p['topk']} exceeds experts={p['experts']}")
    return problems


register(
    OpSpec(
        kind=OpKind.MOE,
        doc="one rank's fused MoE layer: route tokens[tokens, hidden] to topk of experts (experts / ep of them on "
        "this rank, each inter wide here), permute, grouped up GEMM, activation, grouped down GEMM, un-permute "
        "and the top-k weighted sum (one engine's fused MoE, impl; the router GEMM and any all-to-all not included)",
        params=(
            Param(name="tokens", type=int, doc="tokens entering the layer on this rank (all of its group's)"),
            Param(name="hidden", type=int, doc="model width"),
            Param(name="inter", type=int, doc="intermediate width of one expert on this rank (/ expert tp)"),
            Param(name="experts", type=int, doc="routed experts of the layer, over all ranks"),
            Param(name="topk", type=int, doc="experts each token is routed to"),
            Param(name="ep", type=int, doc="expert-parallel ranks the experts are split over", default=1),
            Param(name="gated", type=bool, doc="gated MLP experts (SwiGLU: the up GEMM twice as wide)", default=True),
            Param(name="fn", type=str, doc="the experts' activation", choices=MOE_FNS, default="silu"),
            Param(
                name="weights",
                type=str,
                doc="storage of the expert weights: the dtype's, or weight-only mxfp4 (W4A16: dequantised in the "
                "kernel, activations in dtype)",
                choices=MOE_WEIGHTS,
                default="dtype",
            ),
            Param(
                name="impl",
                type=str,
                doc="kernel family: trtllm (TensorRT-LLM's fused MoE), vllm (vLLM's FusedMoE kernels) or marlin "
                "(vLLM's Marlin W4A16 MoE)",
                choices=MOE_IMPLS,
                default="trtllm",
            ),
        ),
        flops_fwd=_moe_flops,
        # compulsory traffic: the weights of the experts that receive tokens (at their storage size), the layer's
        # input and output
        bytes_fwd=_moe_bytes,
        check=_moe_check,
        benchmarked=False,
        source="2 x rows x weights of the busy experts (balanced routing, moe_balanced_experts); "
        "ai-dynamo/aiconfigurator collector/{trtllm,vllm}/collect_moe.py (what one measured row times)",
    )
)


# --------------------------------------------------------------------------- collectives

BUS_FACTORS: Final[dict[OpKind, Callable[[int], float]]] = {
    OpKind.ALL_REDUCE: lambda n: 2.0 * (n - 1) / n,
    OpKind.ALL_GATHER: lambda n: (n - 1) / n,
    OpKind.REDUCE_SCATTER: lambda n: (n - 1) / n,
    OpKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    OpKind.SEND_RECV: lambda n: 1.0,
    OpKind.BROADCAST: lambda n: 1.0,
}
"""busbw = algbw x factor(world_size), from nccl-tests doc/PERFORMANCE.md."""


def bus_factor(kind: str, world_size: int) -> float:
    """The nccl-tests bus-bandwidth factor of collective ``kind`` over ``world_size`` ranks."""
    return BUS_FACTORS[OpKind(kind)](world_size)


def _collective_check(p: Params) -> list[str]:
    n, nodes, g = _i(p, "world_size"), _i(p, "nodes"), _i(p, "gpus_per_node")
    problems = []
    if nodes * g != n:
        problems.append(f"world_size={n} != nodes={nodes} x gpus_per_node={g}")
    if n < 2:
        problems.append(f"world_size={n} must be >= 2 for a collective")
    return problems


_COLLECTIVE_DOCS: Final = {
    OpKind.ALL_REDUCE: "sum a bytes-sized buffer across ranks, result on every rank",
    OpKind.ALL_GATHER: "concatenate every rank's shard; bytes is the gathered (output) size",
    OpKind.REDUCE_SCATTER: "sum across ranks and leave 1/world_size on each; bytes is the input size",
    OpKind.ALL_TO_ALL: "every rank sends a distinct 1/world_size of its bytes-sized buffer to every other",
    OpKind.SEND_RECV: "point-to-point transfer of bytes between two ranks (pipeline stages)",
    OpKind.BROADCAST: "copy a bytes-sized buffer from one rank to all",
}


ALL_REDUCE_IMPLS: Final = ("nccl", "trtllm")
"""All-reduce implementations (``impl``), a measurement's identity beside its ``backend`` column: ``nccl`` the default
(NCCL's, or where the row's ``backend`` is ``custom`` a serving engine's custom kernel of vLLM's kind, its rows fp16 and
bf16 apart); ``trtllm`` TensorRT-LLM's ``AllReduce`` with strategy AUTO (its own one-shot and two-shot kernels, NCCL
where it picks it), which the AIConfigurator replay emits as a family of its own
(``opcast.collect.replay.aiconfigurator.CUSTOM_FAMILIES``) beside the same configurations of the shared family. Each
family is a law of its own (``opcast.train.collectives.CUSTOM_BACKENDS``), never a feature; it changes no flops or
bytes."""


def _collective_params(kind: OpKind) -> tuple[Param, ...]:
    shape = (
        Param(name="bytes", type=int, doc="message size in bytes (nccl-tests 'size')"),
        Param(name="world_size", type=int, doc="ranks taking part"),
        Param(name="nodes", type=int, doc="nodes the ranks span"),
        Param(name="gpus_per_node", type=int, doc="ranks per node"),
    )
    if kind is not OpKind.ALL_REDUCE:
        return shape
    impl = Param(
        name="impl",
        type=str,
        doc="implementation: nccl (NCCL's, or a serving engine's custom kernel as the row's backend says) or trtllm "
        "(TensorRT-LLM's AllReduce, strategy AUTO)",
        choices=ALL_REDUCE_IMPLS,
        default="nccl",
        id_neutral=True,
    )
    return (*shape, impl)


def _reduction_flops(p: Params, dt: float) -> float:
    n = _i(p, "world_size")
    return (n - 1) / n * _i(p, "bytes") / dt


for _kind, _doc in _COLLECTIVE_DOCS.items():
    _factor = BUS_FACTORS[_kind]
    _reduces = _kind in (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER)
    register(
        OpSpec(
            kind=_kind,
            doc=_doc,
            params=_collective_params(_kind),
            # Reductions add (n-1)/n of the elements on each rank; the others do no arithmetic.
            flops_fwd=_reduction_flops if _reduces else (lambda p, dt: 0.0),
            # Bus bytes per rank: size x the nccl-tests factor.
            bytes_fwd=(lambda f: lambda p, dt: f(_i(p, "world_size")) * _i(p, "bytes"))(_factor),
            check=_collective_check,
            collective=True,
            source="nccl-tests doc/PERFORMANCE.md (algbw, busbw factors)",
        )
    )
