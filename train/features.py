"""Features of op rows on a device, computed only from the op registry and the hardware catalog.

Fit and predict call the same :func:`features`, and every predictor records the feature list it
was fitted on (:func:`feature_names`), so the two can never drift apart (Habitat's lesson).

For each row (an op configuration: kind, shape parameters, dtype, direction, tensor cores) on a
:class:`~opcast.hardware.DeviceSpec` we compute

- the work: FLOPs and compulsory bytes from the registry (:mod:`opcast.ops`), arithmetic intensity;
- the roofline bound on the device: ``t_roof = max(flops / peak, bytes / bw)`` with the
  dtype-aware peak (tensor-core or CUDA-core rate, :meth:`DeviceSpec.peak_flops`), a decode
  step's KV cache and a GEMM's operands read from the L2 where they fit and the L2 is the faster
  (:func:`_l2_speedup`); for a
  collective the reference time ``t_roof`` is NCCL's alpha-beta time on the catalog's links
  (:func:`opcast.collectives_law.alpha_beta_time_s`: ring/tree, LL/Simple, NVLink or PCIe
  latencies and efficiencies), so a learned collective model predicts a correction to the link
  physics of the GPU's own node, and ``t_memory`` stays the bus bytes over the link (NVLink or
  PCIe within a node, the NIC across nodes);
- the tile/wave structure (NeuSight, arXiv 2407.13853, Sec. 4): the kernel is split into output
  tiles (thread blocks) that run in waves of ``sm_count`` tiles; ``waves = tiles / sm_count`` and
  the tail efficiency ``waves / ceil(waves)`` say how well the last wave fills the GPU, and the
  tile fill how much of the tiles' work is useful (GEMM edge tiles, attention blocks, the slots
  PyTorch's softmax kernels give a row);
- the working set against the L2 cache;
- the device's spec (peak, bandwidth, SMs, L2, clock, lanes), and the shape parameters themselves.

Everything that spans orders of magnitude enters as a natural log, so that a tree split or an MLP
unit means "ratio", which is what transfers between GPUs.

Rows are grouped into predictors by (op kind, direction, dtype class), :func:`group_key`.

The computation is numpy only, over the rows' columns (:func:`feature_table`, a name -> array
mapping in, a :class:`Table` out), so ``opcast predict`` never imports pandas; the
training side's :func:`features` and :func:`group_keys` take and return pandas objects and are
thin wrappers of the same code (:func:`columns_of` turns a frame into columns).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, KeysView, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from opcast.collectives_law import alpha_beta_time_s
from opcast.dtypes import BLOCK_SCALED_DTYPES, DTYPE_BITS, DTYPES
from opcast.errors import OpcastError
from opcast.hardware import MMA_FAMILIES, PEAK_DTYPES, DeviceSpec
from opcast.ops import (
    ATTENTION_IMPLS,
    ELEMENTWISE_FNS,
    MOE_WEIGHTS,
    PUBLISHED_ATTENTION_IMPLS,
    ROPE_IMPLS,
    get_op,
    is_missing,
    moe_balanced_experts,
    op_kinds,
    param_defaults,
)
from opcast.ops import MATRIX_KINDS as MATRIX_KINDS  # the registry's tensor-core rule, re-exported
from opcast.ops import uses_tensor_cores as uses_tensor_cores

if TYPE_CHECKING:
    import pandas as pd

FEATURES_VERSION: Final = 7
"""Bumped whenever a feature's definition changes; artifacts fitted on another version are refused.
4: a collective's ``t_roof_s`` is its alpha-beta time (was the bus bytes over the link), and its
features add ``log_t_memory_s`` (the bus bytes over the link, the old reference); a decode step's
attention tiles follow flash-decoding (:func:`_decode_tiles`), and attention adds
:data:`ATTENTION_LATENCY_FEATURES`.
5: GEMM and attention declare :data:`MMA_FEATURES` (the device's tensor-core instruction family),
read by ``hier`` only.
6: a decode step's ``t_roof_s`` reads an L2-resident KV cache at the SMs' rate
(:data:`DECODE_L2_BYTES_PER_SM_CYCLE`, :func:`_l2_speedup`) where that beats DRAM (the GDDR
parts); ``log_t_memory_s`` stays the DRAM time. Leave-one-GPU-out on AIConfigurator
(``benchmarks/modern_gpus.py``, xgb, seeds 0 / 1): decode bf16 13.0 / 13.4 -> 11.6 / 11.3 %
(L40S 31.8 / 30.7 -> 12.4 / 11.5 %), prefill bf16 11.5 / 11.9 -> 11.6 / 11.2, fp8 11.8 / 11.8 -> 11.3 / 11.3;
the same factor put on the caches that do NOT fit the L2 (a placebo) gives decode 15.4.
7: a GEMM's ``t_roof_s`` reads its operands at the same SM rate where they fit
:data:`GEMM_L2_RESIDENT_SHARE` of the L2 (again only the GDDR parts move). Leave-one-GPU-out on
AIConfigurator (``benchmarks/modern_gpus.py --sections logo --labels "gemm bf16,gemm fp8"``, seeds
0 / 1): xgb gemm bf16 13.1 / 13.1 -> 11.3 / 11.7 % (L40S 30.0 / 28.8 -> 16.9 / 16.8, RTX PRO 6000
19.5 / 19.0 -> 19.8 / 22.3, H100 9.0 / 8.7 -> 11.0 / 11.0), gemm fp8 8.7 / 8.8 -> 8.7 / 8.8; hier
(seed 0) bf16 11.9 -> 11.0, fp8 9.8 -> 9.8; tile-mlp (seed 0) bf16 13.0 -> 10.8, fp8 9.5 -> 10.0.
The factor put on the GEMMs that do NOT fit (a placebo) gives xgb bf16 15.5; residency at the
whole L2 11.7, at a quarter 11.2."""

GEMM_TILES: Final = ((128, 256), (128, 128), (64, 128), (64, 64), (32, 64), (32, 32), (16, 16))
"""Candidate output tiles (rows, cols), largest first: CUTLASS/cuBLAS threadblock shapes."""

ROW_TILE_ELEMS: Final = 1024
"""Row-wise kernels (norms, softmax, cross-entropy) give a block one row, or several short rows."""

VECTOR_TILE_BYTES: Final = 128 * 16
"""Pointwise kernels: 128 threads x one 16-byte vector each per block (PyTorch's
vectorized_elementwise_kernel; NeuSight's fp32 add launches numel / 512 blocks)."""

ATTENTION_TILE_ROWS: Final = 128
"""FlashAttention-2 tiles queries (forward) and keys (backward) in blocks of 128 rows; a decode
step (one query) is tiled as flash-decoding does, :func:`_decode_tiles`."""

ATTENTION_LATENCY_FEATURES: Final = ("log_t_roof_cycles", "log_tile_t_roof_cycles", "log_dram_bytes_per_sm_cycle")
"""Attention's extra inputs, for the launch- and latency-bound rows (small prefills, most decode
steps) to transfer between GPUs. AIConfigurator's smallest decode kernels take 21-23 thousand
clock cycles on seven of its nine systems (9-14 us: the floor is in cycles, not seconds), so the
roofline and one block's share of it enter in cycles too (``log(t_roof * clock)``). The DRAM bytes
an SM gets per clock (``log(bw / (sm_count * clock))``: 13-27 on the HBM parts, 2.4-3.5 on the
GDDR L40S and RTX PRO 6000) says how much an L2-resident KV cache gains over the DRAM roofline
(a KV cache of 0.3-1x the L2 runs at 1.4x the DRAM roofline on L40S, at most 0.9x on HBM parts)."""

MMA_FEATURES: Final = ("mma_sync", "mma_wgmma", "mma_tcgen05")
"""One-hot tensor-core instruction family of the device (:attr:`DeviceSpec.mma_family`:
warp-level ``mma.sync``, Hopper's warpgroup ``wgmma``, datacenter Blackwell's ``tcgen05``), read
by the half, fp8 and block-scaled (fp8b, fp4) rows of :data:`MATRIX_KINDS`: the family decides the kernel generation
(CUTLASS 2.x / FlashAttention-2 on mma.sync, CUTLASS 3.x / FlashAttention-3 on wgmma, the sm100
kernels on tcgen05), and with it the share of the peak a GPU sustains. It tells apart the GPUs
the other specs place near a sibling of another family (the sm_120 RTX PRO 6000 is a Blackwell
of mma.sync kernels). All three 0: a device with none (AMD, Intel, CPU); NaN on fp32 and tf32
rows, which these columns do not describe. Only ``hier`` reads them (:data:`HIER_ONLY_FEATURES`)."""

EPS: Final = 1e-30

WORK_FEATURES: Final = (
    "log_flops",
    "log_bytes",
    "log_intensity",
    "log_t_compute_s",
    "log_t_memory_s",
    "log_t_roof_s",
    "log_compute_over_memory",
    "log_bytes_over_l2",
    "dtype_bytes",
    "tensor_cores",
)
TILE_FEATURES: Final = (
    "log_tiles",
    "log_waves",
    "tail_efficiency",
    "tile_fill",
    "log_tile_t_roof_s",
    "log_tile_traffic_over_bytes",
)
DEVICE_FEATURES: Final = (
    "log_peak_flops",
    "log_mem_bw_bytes_per_s",
    "log_sm_count",
    "log_l2_bytes",
    "log_clock_hz",
    "log_ridge",
    "fp32_lanes_per_sm",
    "is_cpu",
)
COLLECTIVE_FEATURES: Final = (
    "log_bytes",
    "log_message_bytes",
    "log_t_roof_s",
    "log_t_memory_s",
    "log_link_bw_bytes_per_s",
    "world_size",
    "nodes",
    "gpus_per_node",
    "log_bytes_per_rank",
)

RAW_COLUMNS: Final = ("t_roof_s", "waves", "ceil_waves", "flops", "bytes")
"""Unlogged helpers in the frame that :func:`features` returns (estimators that aggregate use them)."""


# --------------------------------------------------------------------------- columns

Columns = Mapping[str, np.ndarray]
"""Rows as one numpy array per column (what :func:`columns_of` returns): numeric columns as
numbers (NaN: missing), others as object arrays (None: missing)."""


def columns_of(rows: Any) -> dict[str, np.ndarray]:
    """The columns of ``rows``: a :class:`Table`, a :class:`Columns` mapping or a pandas
    DataFrame (read through its own methods: this never imports pandas). A frame's plain numpy
    columns are kept as they are; the others (strings, nullable booleans and integers) become
    object arrays with None where the frame has a missing value."""
    if isinstance(rows, Table):
        return dict(rows.data)
    if isinstance(rows, Mapping):
        return {str(k): np.asarray(v) for k, v in rows.items()}
    out: dict[str, np.ndarray] = {}
    for name in rows.columns:
        column = rows[name]
        if isinstance(column.dtype, np.dtype) and column.dtype.kind in "biuf":
            out[str(name)] = column.to_numpy()
        else:
            values = column.to_numpy(dtype=object, copy=True)
            values[column.isna().to_numpy(dtype=bool)] = None
            out[str(name)] = values
    return out


def _n_rows(cols: Columns) -> int:
    return len(next(iter(cols.values()))) if cols else 0


def _missing(a: np.ndarray) -> np.ndarray:
    """Where ``a`` holds no value (:func:`opcast.ops.is_missing`)."""
    if a.dtype.kind == "f":
        return np.isnan(a)
    if a.dtype.kind != "O":
        return np.zeros(len(a), dtype=bool)
    return np.fromiter((is_missing(v) for v in a.tolist()), dtype=bool, count=len(a))


def _number(v: Any) -> float:
    if is_missing(v):
        return np.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return np.nan


def _as_float(a: np.ndarray) -> np.ndarray:
    """``a`` as float64, NaN where it is missing or not a number (pandas' ``to_numeric(errors="coerce")``)."""
    if a.dtype.kind in "biuf":
        return a.astype(float)
    return np.fromiter((_number(v) for v in a.tolist()), dtype=float, count=len(a))


def _as_flag(a: np.ndarray) -> np.ndarray:
    """A boolean column as int8: 1 true, 0 false, -1 missing."""
    if a.dtype.kind == "b":
        return a.astype(np.int8)
    miss = _missing(a)
    return np.fromiter(
        (-1 if m else int(bool(v)) for v, m in zip(a.tolist(), miss.tolist())), dtype=np.int8, count=len(a)
    )


def _mapped(a: np.ndarray, table: Mapping[Any, float]) -> np.ndarray:
    """``table[v]`` of every value of ``a`` as float64, NaN for a value it lacks (``Series.map``)."""
    return np.fromiter((table.get(v, np.nan) for v in a.tolist()), dtype=float, count=len(a))


def _unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values in order of first appearance (``pd.unique``)."""
    return list(dict.fromkeys(values))


def _factorize(keys: Sequence[tuple[Any, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(code of every key, position of each code's first appearance); codes number the distinct
    keys in order of first appearance."""
    index: dict[tuple[Any, ...], int] = {}
    codes = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64, count=len(keys))
    first = np.unique(codes, return_index=True)[1] if len(codes) else np.zeros(0, dtype=np.int64)
    return codes, first


def _flags(cols: Columns, n: int) -> np.ndarray:
    """The ``tensor_cores`` column as :func:`_as_flag` (-1 everywhere when there is none)."""
    return _as_flag(cols["tensor_cores"]) if "tensor_cores" in cols else np.full(n, -1, dtype=np.int8)


# --------------------------------------------------------------------------- groups


DTYPE_CLASSES: Final[dict[str, str]] = {
    "fp16": "half",
    "bf16": "half",
    "fp8": "fp8",
    "fp8_block": "fp8b",
    "nvfp4": "fp4",
}
"""The class (predictor group suffix) of every dtype but fp32/tf32, whose class depends on the tensor cores."""

ELEMENT_BYTES: Final[dict[str, float]] = {name: bits / 8.0 for name, bits in DTYPE_BITS.items()}
"""The ``dtype_bytes`` feature: bytes per element of every dtype, block scales included (nvfp4 0.5625)."""


def dtype_class(op: str, dtype: str, tensor_cores: object = None) -> str:
    """``fp32`` (CUDA cores), ``tf32`` (fp32 on tensor cores), ``half`` (fp16 and bf16: same
    element size, same tensor-core rate on every GPU that has both), ``fp8`` (per-tensor scaled),
    ``fp8b`` (block-scaled fp8: its own kernels, DeepGEMM / Cutlass / MXFP8, at the fp8 peak) or
    ``fp4`` (nvfp4, at the fp4 peak); a missing ``tensor_cores`` (None, NaN) takes the default of
    :func:`uses_tensor_cores`."""
    if dtype in DTYPE_CLASSES:
        return DTYPE_CLASSES[dtype]
    if dtype in ("fp32", "tf32"):
        use = uses_tensor_cores(op, dtype, None if is_missing(tensor_cores) else bool(tensor_cores))
        return "tf32" if use else "fp32"
    raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")


_HALF_PEAKS: Final = ("fp32", "fp16", "bf16")
"""Peaks every tensor-core row may read: fp32 (vector work, :meth:`DeviceSpec.peak_flops` without tensor cores)
and the half peaks (:attr:`DeviceSpec.mma_family` tells sm_100 from sm_120 by the half rate per SM)."""
PEAKS_READ: Final[dict[str, frozenset[str]]] = {
    "fp32": frozenset({"fp32"}),
    "tf32": frozenset({"fp32", "tf32"}),
    "half": frozenset(_HALF_PEAKS),
    "fp8": frozenset({*_HALF_PEAKS, "fp8"}),
    "fp8b": frozenset({*_HALF_PEAKS, "fp8"}),
    "fp4": frozenset({*_HALF_PEAKS, "fp4"}),
}
"""The precisions whose peak (``peak_<dtype>_flops``) the features of a dtype class's rows read (:func:`_peaks`,
the ``mma_*`` features); the device features read no other peak."""


@functools.cache
def unread_peaks(key: str) -> frozenset[str]:
    """The device fields (``peak_<dtype>_flops``) predictor group ``key``'s features never read: the other
    precisions' peaks, so that a GPU changed only there (``H100-SXM[peak_fp8_flops=x2]``) is the same die for its
    bf16 kernels (:func:`opcast.hardware.same_die`) and a what-if of the fp8 rate leaves them exactly as they were.
    None are skipped for a class this module does not name."""
    dclass = key.rsplit("-", 2)[-1].split("_")[0]
    read = PEAKS_READ.get(dclass)
    return frozenset() if read is None else frozenset(f"peak_{d}_flops" for d in PEAK_DTYPES if d not in read)


FAMILY_GROUPS: Final[dict[str, str]] = {
    "moe": str(param_defaults("moe")["impl"]),
    "gemm": str(param_defaults("gemm")["impl"]),
}
"""Kinds whose kernel families (``impl``) other than the one named here each fit a predictor group of their own:
the fused MoE layer (:data:`opcast.ops.MOE_IMPLS`), TensorRT-LLM's rows keeping the plain key (``moe-fwd-half``),
vLLM's and Marlin's their own (``moe-fwd-half_vllm``, ``moe-fwd-half_marlin``). Measured leave-one-GPU-out on
H100 / H200 / B200 (AIConfigurator's moe rows, 700 a GPU and label, benchmarks/moe_kernels.py, 2026-12-03): one
group of both families (``impl_code`` telling them apart) scored TensorRT-LLM's bf16 / fp8 layers 17.3 / 19.1 %
against 16.0 / 15.7 % alone, and vLLM's bf16 / MXFP4 / fp8 11.3 / 14.5 / 20.0 % against 9.7 / 14.3 / 18.7 % alone:
the engines' kernels differ by an amount that moves per GPU, so each family's trees do better on its own rows. The
family is not a feature (:func:`_shape_features`): a group holds one, and TensorRT-LLM's group reads the features it
always read (the estimators sample columns: a constant extra column would redraw its trees; the rows drawn under a
cap do move, as the rows' point ids hold ``impl``). A set fitted without a family has no group for it, and prices its
layers as the default family's (``opcast.predict.cost.learned``). The GEMM (:data:`opcast.ops.GEMM_IMPLS`): cuBLAS's
rows keep the plain key (``gemm-fwd-fp8``), vLLM's CUTLASS fp8 linear its own (``gemm-fwd-fp8_vllm``)."""


def group_key(op: str, direction: str, dclass: str, impl: object = None) -> str:
    """The predictor a row belongs to, e.g. ``gemm-fwd-half``; a kernel family of :data:`FAMILY_GROUPS` other than
    its kind's first adds its name to the class (``moe-fwd-half_vllm``)."""
    first = FAMILY_GROUPS.get(op)
    if first is not None and isinstance(impl, str) and impl != first:
        dclass = f"{dclass}_{impl}"
    return f"{op}-{direction}-{dclass}"


def group_key_array(rows: Any) -> np.ndarray:
    """:func:`group_key` of every row (a :class:`Columns` mapping or a DataFrame), as an object
    array, computed once per distinct op, dtype, direction, tensor-core flag and (for the kinds of
    :data:`FAMILY_GROUPS`) kernel family."""
    cols = columns_of(rows)
    n = _n_rows(cols)
    flag = _flags(cols, n)
    ops = cols["op"].tolist()
    impls: list[Any] = [None] * n
    if "impl" in cols and any(op in FAMILY_GROUPS for op in _unique(ops)):
        impls = [v if op in FAMILY_GROUPS and isinstance(v, str) else None for op, v in zip(ops, cols["impl"].tolist())]
    keys = list(zip(ops, cols["dtype"].tolist(), cols["direction"].tolist(), flag.tolist(), impls))
    codes, first = _factorize(keys)
    labels = np.array(
        [
            group_key(op, direction, dtype_class(op, dtype, None if f < 0 else bool(f)), impl)
            for op, dtype, direction, f, impl in (keys[i] for i in first)
        ],
        dtype=object,
    )
    return labels[codes] if n else np.zeros(0, dtype=object)


def group_keys(frame: pd.DataFrame) -> pd.Series:
    """:func:`group_key` of every row of a dataset-schema frame, as a Series on its index."""
    import pandas as pd

    return pd.Series(group_key_array(frame), index=frame.index, dtype=object)


# --------------------------------------------------------------------------- feature lists


def _shape_features(kind: str) -> tuple[str, ...]:
    spec = get_op(kind)
    names: list[str] = []
    for p in spec.params:
        if p.name == "impl" and (kind in FAMILY_GROUPS or spec.collective):  # a predictor group or a law, no feature
            continue
        if p.type is int:
            names.append(f"log_{p.name}")
        elif p.type is bool:
            names.append(p.name)
        else:
            names.append(f"{p.name}_code")
    if kind in MATRIX_KINDS:
        names += list(MMA_FEATURES)
    if kind == "gemm":
        names += ["align_m", "align_n", "align_k"]
    elif kind == "elementwise":
        names += ["fn_flops_per_elem", "fn_inputs"]
    elif kind in ("layernorm", "rmsnorm", "softmax"):
        names += ["align_cols"]
    elif kind == "attention":
        names += list(ATTENTION_LATENCY_FEATURES)
    return tuple(names)


def feature_names(kind: str) -> tuple[str, ...]:
    """The declared model inputs of op ``kind``, in order (shared by every estimator)."""
    spec = get_op(kind)
    if spec.collective:
        return (*COLLECTIVE_FEATURES, "log_clock_hz", "is_cpu")
    return WORK_FEATURES + TILE_FEATURES + DEVICE_FEATURES + _shape_features(kind)


FEATURES: Final[dict[str, tuple[str, ...]]] = {k: feature_names(k) for k in op_kinds()}
"""Declared feature list of every registered kind."""

MONOTONE_DECREASING: Final = frozenset({"tail_efficiency", "tile_fill"})
"""Features along which time / roofline can only fall (a fuller last wave never slows a kernel)."""


# --------------------------------------------------------------------------- work and tiles


def _align(values: np.ndarray, cap: int = 64) -> np.ndarray:
    """log2 of the largest power of two dividing each value, capped at ``cap`` (vector widths)."""
    # a size past int64 (a float column, from a nonsense-sized query) has no alignment to read: 0
    v = np.where(np.abs(values) < 2**62, values, 0).astype(np.int64)
    low = v & (-v)
    return np.log2(np.minimum(np.maximum(low, 1), cap).astype(float))


def _cdiv(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    return np.ceil(a / b)


def _gemm_tiles(
    b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, sms: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tiles, elements all tiles stream with no cache reuse, padded output elements) of
    C[m,n] = A[m,k] B[k,n] x b, with the largest candidate tile that still fills one wave (cuBLAS
    prefers a fuller GPU), else the smallest. Padded elements are what the tiles compute: a tile
    that overhangs the matrix edge does the full tile's work (tile quantisation, NVIDIA's *Matrix
    Multiplication Background* guide), so ``m * n * b / padded`` is the useful share."""
    tiles = np.full(len(m), np.nan)
    elems = np.full(len(m), np.nan)
    padded = np.full(len(m), np.nan)
    todo = np.ones(len(m), dtype=bool)
    for i, (tm, tn) in enumerate(GEMM_TILES):
        t = b * _cdiv(m, tm) * _cdiv(n, tn)
        take = todo & ((t >= sms) | (i == len(GEMM_TILES) - 1))
        tiles[take] = t[take]
        elems[take] = (t * (tm * k + k * tn + tm * tn))[take]
        padded[take] = (t * tm * tn)[take]
        todo &= ~take
    return tiles, elems, padded


def _softmax_fill(width: np.ndarray, dt: np.ndarray) -> np.ndarray:
    """The useful share of the element slots PyTorch's softmax kernels give a row of ``width``
    elements (``aten/src/ATen/native/cuda/SoftMax.cu``, 1.x-2.1). Rows of at most 1024 elements
    and 4 KiB go to the persistent warp kernel, whose lanes cover the next power of two
    (``dispatch_softmax_forward``/``_backward``: ``next_power_of_two``). Wider rows get one block
    each, of ``SoftMax_getBlockSize(ILP, width)`` threads (the power of two at or above
    ``min(width / ILP, 1024) / 2``, at least a warp; ILP = 16 bytes / element), which sweeps the
    row in chunks of threads x ILP elements: the last chunk may be part empty."""
    w = np.maximum(width, 1.0)
    warp = w / 2.0 ** np.ceil(np.log2(w))
    ilp = 16.0 / dt
    half = np.maximum(np.minimum(np.floor(w / ilp), 1024.0) / 2.0, 1.0)
    chunk = np.maximum(32.0, 2.0 ** np.ceil(np.log2(half))) * ilp
    block = w / (chunk * _cdiv(w, chunk))
    return np.where((w <= 1024) & (w * dt <= 4096), warp, block)


DECODE_TILE_ROWS: Final = 64
"""FlashAttention-2's split-KV kernel tiles the (packed) queries in blocks of 64 rows."""


def _decode_kv_block(head_dim: np.ndarray) -> np.ndarray:
    """Keys per block of FlashAttention-2's split-KV kernel: 256 up to head_dim 64, 128 up to 128, else 64."""
    return np.where(head_dim <= 64, 256.0, np.where(head_dim <= 128, 128.0, 64.0))


def _kv_splits(blocks: np.ndarray, kv_blocks: np.ndarray, slots: int, max_splits: int = 128) -> np.ndarray:
    """FlashAttention-2's ``num_splits_heuristic`` (csrc/flash_attn/flash_api.cpp): no split when
    ``blocks`` fills 80 % of the ``slots``; else the fewest splits of the KV blocks whose wave
    efficiency (waves / ceil(waves)) is at least 85 % of the best, over the eligible counts (those
    that change the KV blocks per split)."""
    pairs, inverse = np.unique(np.column_stack([blocks, kv_blocks]), axis=0, return_inverse=True)
    chosen = np.ones(len(pairs))
    for j, (b, nb) in enumerate(pairs.tolist()):
        if b >= 0.8 * slots:
            continue
        s = np.arange(1.0, max(1, int(min(max_splits, slots, nb))) + 1.0)
        eligible = (s == 1) | (np.ceil(nb / s) != np.ceil(nb / np.maximum(s - 1, 1)))
        waves = b * s / slots
        eff = np.where(eligible, waves / np.ceil(waves), 0.0)
        chosen[j] = s[np.flatnonzero(eligible & (eff >= 0.85 * eff.max()))[0]]
    return chosen[inverse.ravel()]


def _decode_tiles(cols: Mapping[str, np.ndarray], sms: int) -> tuple[np.ndarray, np.ndarray]:
    """(tiles, fill) of a decode step (one query per sequence): FlashAttention-2 packs the
    ``heads / kv_heads`` queries that share a KV head into the rows of one query tile
    (``seqlenq_ngroups_swapped`` in ``mha_fwd``), so blocks run per (sequence, KV head), and splits
    the KV length over more blocks when those few blocks would leave the GPU idle (split-KV /
    flash-decoding, ``set_params_splitkv``: two 128-thread blocks per SM). vLLM's, FlashInfer's and
    TensorRT-LLM's XQA decode kernels partition the same way (a block per KV head and chunk of the
    cache). Fill: the useful share of the packed query rows and of the last KV block."""
    rows = cols["seq_q"] * cols["heads"] / cols["kv_heads"]
    m_blocks = _cdiv(rows, DECODE_TILE_ROWS)
    kv_block = _decode_kv_block(cols["head_dim"])
    kv_blocks = _cdiv(cols["seq_kv"], kv_block)
    base = cols["batch"] * cols["kv_heads"] * m_blocks
    splits = _kv_splits(base, kv_blocks, 2 * sms)
    fill = rows / (m_blocks * DECODE_TILE_ROWS) * cols["seq_kv"] / (kv_blocks * kv_block)
    return base * splits, fill


DECODE_L2_BYTES_PER_SM_CYCLE: Final = 7.0
"""Bytes per SM per clock at which a decode step streams a KV cache that sits in the L2 (and a GEMM
its operands, :data:`GEMM_L2_RESIDENT_SHARE`). A kernel
benchmark re-runs one step on one cache, so a cache no larger than the L2 stays there between
runs (a warm-L2 time: in a real forward pass the other layers' caches evict it). On
AIConfigurator's measurements the FlashAttention-2 decode kernel peaks at 6.9 (L40S), 7.1 (RTX
PRO 6000) and 6.9 (A100, at 0.7-0.85x its L2) bytes per SM-clock on caches just under the L2,
FA3 at 7.8 (H100, H200): in cycles the SMs' side is the limit, alike on those parts, and on the
GDDR parts the same kernel falls to 2.0-3.4 once the cache outgrows the L2 (DRAM gives an SM 2.4
bytes per clock on L40S, 3.5 on RTX PRO 6000). On the HBM parts (13-27 bytes per SM-clock from
DRAM, more than any decode kernel there takes from the L2: Blackwell's TRT-LLM kernels peak at
15-21) the L2 gains nothing over the DRAM roofline."""


GEMM_L2_RESIDENT_SHARE: Final = 0.5
"""The share of the L2 that keeps a GEMM's operands between the runs of a kernel benchmark (which,
as vLLM's and TensorRT-LLM's GEMM timings do, re-runs one GEMM on the same matrices: a warm-L2 time;
in a forward pass the next layer's weights evict a layer's, as for the decode step). A100's L2 is
two partitions, each caching the data the SMs wired to it read (NVIDIA A100 Tensor Core GPU
Architecture whitepaper, "A100 L2 Cache"); a GEMM's operand tiles are read by SMs on both sides, so
they may sit in both and the whole L2 holds half of them (a decode step's KV blocks are each read
by one block, :func:`_decode_tiles`, and keep the whole L2). NVIDIA documents no such split for the
GDDR parts this moves (AD102, GB202); there AIConfigurator's memory-bound bf16 GEMMs stop beating
DRAM above 0.16-0.3 of the L2 (20-30 MB on both), under this half. Within it a GEMM's memory time is the
SMs' L2 rate, :data:`DECODE_L2_BYTES_PER_SM_CYCLE`, where that beats DRAM. On AIConfigurator's memory-bound bf16
GEMMs the small ones run at the SMs' pace on every part (1-3 MB: 1.0-1.2 bytes per SM-clock on the
GDDR L40S and RTX PRO 6000, 1.6-1.9 on the HBM parts), so the DRAM roofline of a GDDR part (2.4
and 3.5 bytes per SM-clock) misplaces them against the HBM parts (13-27); those of 10-20 MB beat
the GDDR parts' DRAM by 1.1x. The HBM parts' DRAM exceeds the L2 rate: they keep the DRAM roofline."""


def _l2_speedup(cols: Mapping[str, np.ndarray], moved: np.ndarray, device: DeviceSpec) -> np.ndarray:
    """Per row, the factor (<= 1) by which L2-resident data shorten the memory time:
    ``bw / max(bw, sm_count * clock * DECODE_L2_BYTES_PER_SM_CYCLE)`` on a decode step whose bytes
    fit the L2 and on a GEMM whose bytes fit :data:`GEMM_L2_RESIDENT_SHARE` of it, else 1 (and 1
    for every other row)."""
    n = len(moved)
    out = np.ones(n)
    ops = cols["op"].astype(object)
    fits = np.isfinite(moved) & (moved <= device.l2_bytes)
    resident = (ops == "gemm") & fits & (moved <= GEMM_L2_RESIDENT_SHARE * device.l2_bytes)
    if "seq_q" in cols:
        step = (ops == "attention") & (cols["direction"].astype(object) == "fwd") & (_as_float(cols["seq_q"]) == 1)
        resident |= step & fits
    bw = device.mem_bw_bytes_per_s
    sm_rate = device.sm_count * device.boost_clock_hz * DECODE_L2_BYTES_PER_SM_CYCLE
    out[resident] = bw / max(bw, sm_rate)
    return out


def _tiles(
    kind: str, cols: Mapping[str, np.ndarray], fwd: np.ndarray, dt: np.ndarray, sms: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tiles, bytes all tiles stream without cache reuse or NaN where the compulsory bytes stand,
    tile fill: the useful share of the work the tiles do) of rows of one kind; ``cols`` holds the
    parameter columns as floats."""
    n = len(fwd)
    nan = np.full(n, np.nan)
    full = np.ones(n)
    if kind == "gemm":
        b, m, nn, k = cols["b"], cols["m"], cols["n"], cols["k"]
        t0, e0, p0 = _gemm_tiles(b, m, nn, k, sms)
        t1, e1, p1 = _gemm_tiles(b, m, k, nn, sms)  # dA[m,k] = dC[m,n] B^T, reducing n
        t2, e2, p2 = _gemm_tiles(b, k, nn, m, sms)  # dB[k,n] = A^T dC, reducing m
        fill = np.where(fwd, b * m * nn / p0, (b * m * k * nn + b * k * nn * m) / (p1 * nn + p2 * m))
        return np.where(fwd, t0, t1 + t2), np.where(fwd, e0, e1 + e2) * dt, fill
    if kind == "moe":  # the down grouped GEMM's output tiles, [rows, hidden] of each busy expert
        busy, rows = (np.asarray(v, dtype=float) for v in moe_balanced_experts(cols))  # type: ignore[arg-type]
        t, _, padded = _gemm_tiles(busy, rows, cols["hidden"], cols["inter"], sms)
        return t, nan, busy * rows * cols["hidden"] / padded
    if kind == "attention":
        seq = np.where(fwd, cols["seq_q"], cols["seq_kv"])
        blocks = _cdiv(seq, ATTENTION_TILE_ROWS)
        tiles, fill = cols["batch"] * cols["heads"] * blocks, seq / (blocks * ATTENTION_TILE_ROWS)
        step = fwd & (cols["seq_q"] == 1)  # a decode step: flash-decoding's grid
        if step.any():
            tiles[step], fill[step] = _decode_tiles({k: v[step] for k, v in cols.items()}, sms)
        return tiles, nan, fill
    if kind in ("layernorm", "rmsnorm", "softmax", "cross_entropy"):
        rows = cols["rows"] if "rows" in cols else cols["tokens"]
        width = cols["cols"] if "cols" in cols else cols["vocab"]
        fill = _softmax_fill(width, dt) if kind == "softmax" else full
        return _cdiv(rows, np.maximum(1.0, np.floor(ROW_TILE_ELEMS / width))), nan, fill
    if kind in ("elementwise", "optimizer"):
        numel = cols["numel"]
    elif kind == "rope":
        numel = cols["tokens"] * cols["heads"] * cols["head_dim"]
    elif kind == "embedding":
        numel = cols["tokens"] * cols["hidden"]
    else:  # collectives and kinds registered later: one tile
        return np.ones(n), nan, full
    return _cdiv(numel, np.maximum(1.0, VECTOR_TILE_BYTES / dt)), nan, full


def _formulas(
    spec: Any, first: Mapping[str, np.ndarray], formulas: Mapping[str, tuple[Any, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) of the distinct configurations ``first`` (parameter columns, ``_d`` the
    direction, ``_dt`` the dtype bytes). The registry's formulas are evaluated once per direction,
    dtype and categorical values, over float64 arrays of the integer parameters; a formula that
    cannot take arrays (a branch on an integer parameter) is evaluated row by row."""
    n = len(first["_d"])
    f_u = np.full(n, np.nan)
    b_u = np.full(n, np.nan)
    ints, cats = spec.int_params, spec.categorical_params
    cols = {name: _as_float(first[name]) for name in ints}
    keys = list(zip(first["_d"].tolist(), first["_dt"].tolist(), *(first[c].tolist() for c in cats)))
    codes, heads = _factorize(keys)
    for code, head in enumerate(heads.tolist()):
        pos = np.flatnonzero(codes == code)
        d, dt, *cat_vals = keys[head]
        pair = formulas.get(d)
        if pair is None:
            continue
        params: dict[str, object] = {name: cols[name][pos] for name in ints}
        params.update(zip(cats, cat_vals))
        try:
            with np.errstate(all="ignore"):
                f = np.asarray(pair[0](params, float(dt)), dtype=float)
                b = np.asarray(pair[1](params, float(dt)), dtype=float)
            f_u[pos], b_u[pos] = np.broadcast_to(f, pos.shape), np.broadcast_to(b, pos.shape)
            continue
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            pass
        for j in pos:
            row = {name: first[name][j] for name in (*ints, *cats)}
            with contextlib.suppress(KeyError, TypeError, ValueError, ZeroDivisionError):
                f_u[j], b_u[j] = pair[0](row, float(dt)), pair[1](row, float(dt))
    return f_u, b_u


def _work(rows: Any, sms: int) -> dict[str, np.ndarray]:
    """flops, bytes, tiles, per-tile traffic and tile fill of every row (a :class:`Columns`
    mapping or a DataFrame). FLOPs and bytes are the registry's formulas, called once per
    distinct configuration (predict queries repeat shapes)."""
    cols = columns_of(rows)
    n = _n_rows(cols)
    flops = np.full(n, np.nan)
    moved = np.full(n, np.nan)
    tiles = np.full(n, np.nan)
    traffic = np.full(n, np.nan)
    fill = np.full(n, np.nan)
    ops = cols["op"].astype(object)
    dt_all = _mapped(cols["dtype"], ELEMENT_BYTES)
    for kind in _unique(ops.tolist()):
        spec = get_op(str(kind))
        names = spec.param_names
        missing = [c for c in names if c not in cols]
        if missing:
            raise OpcastError(f"{kind} rows lack parameter column(s) {', '.join(missing)}")
        idx = np.flatnonzero(ops == kind)
        ok = np.isfinite(dt_all[idx])
        for name in names:
            ok &= ~_missing(cols[name][idx])
        idx = idx[ok]
        if not len(idx):
            continue
        sub = {name: cols[name][idx] for name in names}
        dirs = cols["direction"][idx].astype(object)
        dts = dt_all[idx]
        codes, heads = _factorize(list(zip(*(sub[name].tolist() for name in names), dirs.tolist(), dts.tolist())))
        first = {name: sub[name][heads] for name in names} | {"_d": dirs[heads], "_dt": dts[heads]}
        formulas = {
            d: (spec._formula(d, spec.flops_fwd, spec.flops_bwd), spec._formula(d, spec.bytes_fwd, spec.bytes_bwd))
            for d in _unique(dirs.tolist())
            if d in spec.directions()
        }
        f_u, b_u = _formulas(spec, first, formulas)
        f_out, b_out = f_u[codes], b_u[codes]
        flops[idx], moved[idx] = f_out, b_out
        numeric = {name: _as_float(sub[name]) for name in spec.int_params}
        t, tr, fl = _tiles(str(kind), numeric, dirs == "fwd", dts, sms)
        tiles[idx] = t
        fill[idx] = fl
        traffic[idx] = np.where(np.isfinite(tr), tr, b_out)
    return {"flops": flops, "bytes": moved, "tiles": tiles, "traffic": traffic, "fill": fill}


# --------------------------------------------------------------------------- features


def _peaks(cols: Columns, device: DeviceSpec) -> tuple[np.ndarray, np.ndarray]:
    """(peak FLOP/s per row, tensor_cores flag per row); NaN where the device lacks the dtype."""
    n = _n_rows(cols)
    keys = list(zip(cols["op"].tolist(), cols["dtype"].tolist(), _flags(cols, n).tolist()))
    codes, first = _factorize(keys)
    peak_u = np.empty(len(first))
    tc_u = np.empty(len(first))
    for i, (op, dtype, f) in enumerate(keys[j] for j in first):
        use = uses_tensor_cores(op, dtype, None if f < 0 else bool(f))
        try:
            peak_u[i] = device.peak_flops("fp32" if dtype == "tf32" and not use else dtype, tensor_cores=use)
        except OpcastError:
            peak_u[i] = np.nan
        tc_u[i] = use
    return peak_u[codes], tc_u[codes]


def _log(x: np.ndarray | float) -> np.ndarray:
    return np.log(np.maximum(x, EPS))


class Column(np.ndarray):
    """A numpy array that also reads as a pandas column does (``to_numpy``): what indexing a
    :class:`Table` gives, so code written for a DataFrame's columns reads it unchanged."""

    def to_numpy(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.view(np.ndarray), dtype=dtype)


class Table:
    """Rows as one numpy array per column (:attr:`data`), without pandas: what the numpy path
    passes where the training side passes a DataFrame (query rows, :func:`feature_table`'s
    features). It reads as the slice of a DataFrame that path uses: ``columns``, ``len`` (rows),
    ``table[name]`` (a :class:`Column`), :func:`matrix`; :meth:`take` selects rows."""

    __slots__ = ("data", "n_rows")

    def __init__(self, data: dict[str, np.ndarray], n_rows: int | None = None) -> None:
        self.data = data
        self.n_rows = _n_rows(data) if n_rows is None else n_rows

    @property
    def columns(self) -> KeysView[str]:
        return self.data.keys()

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, name: str) -> Column:
        return self.data[name].view(Column)

    def take(self, rows: np.ndarray) -> Table:
        """The rows at positions (or where the mask is true) ``rows``."""
        rows = np.asarray(rows)
        return Table({k: v[rows] for k, v in self.data.items()}, int(rows.sum()) if rows.dtype == bool else len(rows))


def features(frame: pd.DataFrame, device: DeviceSpec) -> pd.DataFrame:
    """Every feature (the union of the declared lists) and the raw helpers of ``frame``'s rows on
    ``device``, as a DataFrame on ``frame``'s index: :func:`feature_table` of its columns."""
    import pandas as pd

    return pd.DataFrame(feature_table(frame, device).data, index=frame.index)


def board_time_s(own_s: np.ndarray, die_s: np.ndarray, feats: pd.DataFrame | Table) -> np.ndarray:
    """Seconds of kernels on a board of a training GPU's compute die (:func:`opcast.hardware.die_twin`), from
    one predictor's answers with the board's own features (``own_s``, its bandwidth a feature) and with its
    die's training board's (``die_s``): a kernel bound by compute on the board's datasheet (``feats``, the
    board's features: ``t_compute > t_memory``) runs as on the board the die was measured on (``die_s``), any
    other as the board's own bandwidth says (``own_s``; ``die_s`` NaN too). Trees read a GPU's bandwidth as
    its identity as much as its speed: with H100-SXM left out and H200 (its die) among eight AIConfigurator
    systems, xgb answered H100's compute-bound rows with splits placed between A100 and H200 (prefill fp8
    7.9 % MAPE with H100's own features, 3.9 % with H200's), while the other board's features are wrong for
    memory-bound rows (H200 left out and answered with H100's: gemm bf16 8.2 -> 12.8 %). This rule, left-out
    H100 / H200 (``benchmarks/results/modern_gpus.md``, 2026-12-03): gemm bf16 11.0 -> 10.5 / 8.2 -> 7.9 %,
    prefill bf16 11.7 -> 11.3 / 11.1 -> 8.9, prefill fp8 7.9 -> 6.2 / 7.8 -> 5.5, decode unchanged. A blend
    of the two by the compute share (``t_compute / (t_compute + t_memory)`` of the log time) gained more on
    those folds (gemm bf16 8.6 / 7.4 %) but carried the die's bandwidth into partly memory-bound kernels: the
    A100-SXM4-40GB decode steps of ``benchmarks/serving_public.py`` ran faster on A100-SXM4-80GB's answers
    (TPOT p50 at 16 req/s -14.9 -> -18.7 %), where this rule leaves them as they were."""
    tc = feats["log_t_compute_s"].to_numpy(dtype=float)
    tm = feats["log_t_memory_s"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        compute = np.isfinite(tc) & np.isfinite(tm) & (tc > tm) & np.isfinite(die_s) & (die_s > 0)
    return np.where(compute, die_s, own_s)


def feature_table(rows: Any, device: DeviceSpec) -> Table:
    """Every feature (the union of the declared lists) and the raw helpers of the rows (a
    :class:`Columns` mapping or a DataFrame) on ``device``; rows the device cannot run (no peak
    for the dtype) or with missing parameters get NaN ``t_roof_s``. numpy only."""
    cols = columns_of(rows)
    for col in ("op", "dtype", "direction"):
        if col not in cols:
            raise OpcastError(f"query frame lacks column {col!r}; give op, dtype, direction and the op's parameters")
    cols = _fill_defaults(cols)
    n = _n_rows(cols)
    sms = device.sm_count
    work = _work(cols, sms)
    peak, tcs = _peaks(cols, device)
    bw = device.mem_bw_bytes_per_s
    out: dict[str, np.ndarray] = {}
    flops = work["flops"]
    moved = work["bytes"]
    tiles = work["tiles"]
    traffic = work["traffic"]
    ops = cols["op"].astype(object)
    collective = _mapped(ops, {k: float(get_op(str(k)).collective) for k in _unique(ops.tolist())}).astype(bool)
    # Collectives: bus bytes over the link (NVLink or PCIe within a node, the NIC across nodes) is
    # t_memory; the reference t_roof is NCCL's alpha-beta time on those links.
    nodes = _as_float(cols["nodes"]) if "nodes" in cols else np.full(n, np.nan)
    link = np.where(nodes > 1, device.inter_node_bw_bytes_per_s, device.intra_node_bw_bytes_per_s)
    t_compute = flops / peak
    t_memory = np.where(collective, moved / link, moved / bw)
    # A decode step's KV cache and a GEMM's operands that fit the L2 stream from there (_l2_speedup).
    t_memory_l2 = t_memory * _l2_speedup(cols, moved, device)
    t_roof = np.maximum(t_compute, t_memory_l2)
    if collective.any():
        t_roof = np.where(collective, _alpha_beta_s(cols, collective, device), t_roof)
    t_roof = np.where(np.isfinite(t_roof) & (t_roof > 0), t_roof, np.where(np.isfinite(t_roof), 1e-9, np.nan))
    waves = tiles / sms
    ceil_waves = np.ceil(waves)
    out.update(
        flops=flops,
        bytes=moved,
        t_roof_s=t_roof,
        waves=waves,
        ceil_waves=ceil_waves,
        log_flops=_log(flops + 1.0),
        log_bytes=_log(moved + 1.0),
        log_intensity=_log((flops + 1.0) / (moved + 1.0)),
        log_t_compute_s=_log(t_compute),
        log_t_memory_s=_log(t_memory),
        log_t_roof_s=_log(t_roof),
        log_compute_over_memory=_log(t_compute) - _log(t_memory),
        log_bytes_over_l2=_log(moved) - _log(max(device.l2_bytes, 1)),
        dtype_bytes=_mapped(cols["dtype"], ELEMENT_BYTES),
        tensor_cores=tcs,
        log_tiles=_log(tiles),
        log_waves=_log(waves),
        tail_efficiency=waves / np.maximum(ceil_waves, 1.0),
        tile_fill=work["fill"],
        # One SM's share: a tile's roofline on 1/sm_count of the GPU, i.e. t_roof / waves.
        log_tile_t_roof_s=_log(t_roof) - _log(waves),
        log_tile_traffic_over_bytes=_log(traffic) - _log(moved),
        log_peak_flops=_log(peak),
        log_mem_bw_bytes_per_s=np.full(n, np.log(bw)),
        log_sm_count=np.full(n, np.log(sms)),
        log_l2_bytes=np.full(n, np.log(max(device.l2_bytes, 1))),
        log_clock_hz=np.full(n, np.log(device.boost_clock_hz)),
        log_ridge=_log(peak / bw),
        fp32_lanes_per_sm=np.full(n, float(device.fp32_lanes_per_sm)),
        is_cpu=np.full(n, float(device.vendor == "cpu")),
        log_link_bw_bytes_per_s=_log(link),
    )
    # Attention's latency features (ATTENTION_LATENCY_FEATURES): the roofline in clock cycles, and
    # the DRAM bytes an SM gets per cycle.
    log_clock = np.log(device.boost_clock_hz)
    out["log_t_roof_cycles"] = out["log_t_roof_s"] + log_clock
    out["log_tile_t_roof_cycles"] = out["log_tile_t_roof_s"] + log_clock
    out["log_dram_bytes_per_sm_cycle"] = np.full(n, np.log(bw / (sms * device.boost_clock_hz)))
    # The tensor-core instruction family (MMA_FEATURES), on the half, fp8 and block-scaled tensor-core rows only.
    low_precision = (tcs > 0) & np.isin(cols["dtype"].astype(object), ("fp16", "bf16", "fp8", *BLOCK_SCALED_DTYPES))
    family = device.mma_family
    for name, fam in zip(MMA_FEATURES, MMA_FAMILIES):
        out[name] = np.where(low_precision, float(family == fam), np.nan)
    for name, typ in _param_columns().items():
        if name not in cols:
            continue
        column = cols[name]
        if typ is int:
            vals = _as_float(column)
            out["log_message_bytes" if name == "bytes" else f"log_{name}"] = _log(vals)
            if name in ("world_size", "nodes", "gpus_per_node"):
                out[name] = vals
        elif typ is bool:
            flag = _as_flag(column)
            out[name] = np.where(flag < 0, np.nan, flag.astype(float))
        else:
            out[f"{name}_code"] = _mapped(column, _CODES.get(name, {}))
    if "bytes" in cols and "world_size" in cols:
        out["log_bytes_per_rank"] = _log(_as_float(cols["bytes"])) - _log(_as_float(cols["world_size"]))
    for name in ("m", "n", "k", "cols"):
        if name in cols:
            vals = _as_float(cols[name])
            ok = np.isfinite(vals)
            a = np.full(n, np.nan)
            a[ok] = _align(vals[ok])
            out[f"align_{name}"] = a
    if "fn" in cols:
        fns = cols["fn"]
        out["fn_flops_per_elem"] = _mapped(fns, {k: float(f.flops) for k, f in ELEMENTWISE_FNS.items()})
        out["fn_inputs"] = _mapped(fns, {k: float(f.inputs) for k, f in ELEMENTWISE_FNS.items()})
    return Table(out, n)


def _alpha_beta_s(cols: Columns, collective: np.ndarray, device: DeviceSpec) -> np.ndarray:
    """NCCL's alpha-beta time (:func:`opcast.collectives_law.alpha_beta_time_s`) of every
    collective row on ``device``'s links, computed once per distinct call; NaN for the other rows
    and for rows with a missing parameter (bytes, world_size, nodes, gpus_per_node) or a count below one."""
    out = np.full(len(collective), np.nan)
    names = ("bytes", "world_size", "nodes", "gpus_per_node")
    if any(name not in cols for name in names):
        return out
    idx = np.flatnonzero(collective)
    vals = [_as_float(cols[name][idx]) for name in names]
    ok = np.all([np.isfinite(v) & (v >= (0 if name == "bytes" else 1)) for name, v in zip(names, vals)], axis=0)
    idx = idx[ok]
    keys = list(zip(cols["op"][idx].tolist(), *(v[ok].tolist() for v in vals)))
    codes, first = _factorize(keys)
    times = np.empty(len(first))
    for i, j in enumerate(first.tolist()):
        op, size, ranks, nodes, per_node = keys[j]
        times[i] = alpha_beta_time_s(
            str(op),
            size,
            int(ranks),
            int(nodes),
            int(per_node),
            device.intra_node_bw_bytes_per_s,
            device.inter_node_bw_bytes_per_s,
        )[0]
    out[idx] = times[codes]
    return out


def _fill_defaults(rows: Any) -> dict[str, np.ndarray]:
    """The columns of ``rows`` with the optional parameters of its ops
    (:func:`opcast.ops.param_defaults`) set to their defaults where absent (rows written before
    the parameter existed, callers that leave it out)."""
    cols = columns_of(rows)
    n = _n_rows(cols)
    ops = cols["op"].astype(object)
    for kind in _unique(ops.tolist()):
        if kind not in FEATURES:
            continue
        for name, default in param_defaults(str(kind)).items():
            rows_of_kind = ops == kind
            if name in cols:
                rows_of_kind &= _missing(cols[name])
            if rows_of_kind.any():
                column = cols.get(name)
                if column is None:
                    column = np.full(n, None, dtype=object)
                elif column.dtype.kind != "O" and not (
                    column.dtype.kind == "f" and isinstance(default, (int, float)) and not isinstance(default, bool)
                ):
                    column = column.astype(object)
                else:
                    column = column.copy()
                column[rows_of_kind] = default
                cols[name] = column
    return cols


def _param_columns() -> dict[str, type]:
    from opcast.ops import param_types

    return param_types()


_CODES: Final[dict[str, dict[str, float]]] = {
    "fn": {name: float(i) for i, name in enumerate(ELEMENTWISE_FNS)},
    "impl": {name: float(i) for i, name in enumerate((*ATTENTION_IMPLS, *ROPE_IMPLS, *PUBLISHED_ATTENTION_IMPLS))},
    "weights": {name: float(i) for i, name in enumerate(MOE_WEIGHTS)},
}
"""Ordinal codes of the string parameters (their position in the registry's choices). ``impl``:
attention's kernel families, then :data:`opcast.ops.KERNEL_IMPLS` (rope's choices); ``native`` (code 5)
and ``liger`` (code 6) were appended to those, so the codes of model sets fitted before them do not
shift and their features are unchanged (no features-version bump): such a set speaks for ``liger``
nowhere (code 6 lies outside its fitted ``impl_code`` range, :mod:`opcast.predict.cost.learned`). Attention's
published-only families follow (``flash1`` 7, ``flash2`` 8: collect measures ``flash2`` on Hopper and Blackwell); a
set speaks for them only where its ``impl_devices`` records devices that measured them. The fused MoE
layer's kernel families (:data:`opcast.ops.MOE_IMPLS`) are no code: each is a predictor group
(:data:`FAMILY_GROUPS`). ``weights``:
the fused MoE layer's expert storage (:data:`opcast.ops.MOE_WEIGHTS`); a set fitted without mxfp4 rows speaks for
the dtype's weights only (the same range rule)."""


def matrix(feats: pd.DataFrame | Table, names: tuple[str, ...]) -> np.ndarray:
    """The model-input matrix of ``names`` (float64; a declared feature absent from the frame is NaN)."""
    cols = [feats[n].to_numpy(dtype=float) if n in feats.columns else np.full(len(feats), np.nan) for n in names]
    return np.column_stack(cols) if cols else np.zeros((len(feats), 0))


ABSOLUTE_DEVICE_FEATURES: Final = frozenset(
    {"log_peak_flops", "log_mem_bw_bytes_per_s", "log_sm_count", "log_l2_bytes", "log_clock_hz", "fp32_lanes_per_sm"}
)
"""Device features in absolute units. With a handful of training GPUs an MLP reads them as a
GPU's identity and does not transfer; the relative features (the roofline times, the ridge, waves,
working set over L2) carry the device into the tile-MLP instead."""


HIER_ONLY_FEATURES: Final = frozenset(MMA_FEATURES)
"""Features only the hierarchical estimator reads (``hier``, in its level and its shape model):
the tensor-core family. Leave-one-GPU-out on AIConfigurator's nine systems
(``benchmarks/modern_gpus.py --sections logo --estimator hier``, 2026-12-02) it lowers hier's
pooled MAPE on every GEMM and attention label (gemm bf16 13.4 -> 11.9 %, fp8 12.3 -> 9.6, prefill
17.5 / 17.5 -> 14.9 / 14.7, decode 21.8 -> 18.6). xgb given the same columns scored as with all-NaN
columns in their place (gemm bf16 13.3 vs 13.4, decode 18.0 vs 17.6: its trees already tell the
training GPUs apart by their specs, so the family adds no split they lack), so xgb and the
tile-MLP do not read them and fit as before."""


def model_inputs(kind: str, estimator: str) -> tuple[str, ...]:
    """The declared features an estimator reads for ``kind``: all of :data:`FEATURES` for hier,
    all but :data:`HIER_ONLY_FEATURES` for xgb, and also less the absolute device specs for the
    tile-MLP."""
    names = FEATURES[kind] if kind in FEATURES else feature_names(kind)
    if estimator == "hier":
        return names
    names = tuple(n for n in names if n not in HIER_ONLY_FEATURES)
    if estimator == "tile-mlp":
        return tuple(n for n in names if n not in ABSOLUTE_DEVICE_FEATURES)
    return names
