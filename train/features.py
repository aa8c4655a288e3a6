"""Features of op rows on a device, computed only from the op registry and the hardware catalog.

Fit and predict call the same :func:`features`, and every predictor records the feature list it
was fitted on (:func:`feature_names`), so the two can never drift apart (Habitat's lesson).

For each row (an op configuration: kind, shape parameters, dtype, direction, tensor cores) on a
:class:`~opcast.hardware.DeviceSpec` we compute

- the work: FLOPs and compulsory bytes from the registry (:mod:`opcast.ops`), arithmetic intensity;
- the roofline bound on the device: ``t_roof = max(flops / peak, bytes / bw)`` with the
  dtype-aware peak (tensor-core or CUDA-core rate, :meth:`DeviceSpec.peak_flops`); collectives
  use the link bandwidth (NVLink within a node, the NIC across nodes);
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
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Final

import numpy as np
import pandas as pd

from opcast.dtypes import DTYPE_BYTES
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec
from opcast.ops import ATTENTION_IMPLS, ELEMENTWISE_FNS, ROPE_IMPLS, get_op, op_kinds, param_defaults

FEATURES_VERSION: Final = 3
"""Bumped whenever a feature's definition changes; artifacts fitted on another version are refused."""

MATRIX_KINDS: Final = frozenset({"gemm", "attention"})
"""Kinds whose math may run on tensor cores; every other kind runs on the vector units."""

GEMM_TILES: Final = ((128, 256), (128, 128), (64, 128), (64, 64), (32, 64), (32, 32), (16, 16))
"""Candidate output tiles (rows, cols), largest first: CUTLASS/cuBLAS threadblock shapes."""

ROW_TILE_ELEMS: Final = 1024
"""Row-wise kernels (norms, softmax, cross-entropy) give a block one row, or several short rows."""

VECTOR_TILE_BYTES: Final = 128 * 16
"""Pointwise kernels: 128 threads x one 16-byte vector each per block (PyTorch's
vectorized_elementwise_kernel; NeuSight's fp32 add launches numel / 512 blocks)."""

ATTENTION_TILE_ROWS: Final = 128
"""FlashAttention-2 tiles queries (forward) and keys (backward) in blocks of 128 rows."""

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
    "log_link_bw_bytes_per_s",
    "world_size",
    "nodes",
    "gpus_per_node",
    "log_bytes_per_rank",
)

RAW_COLUMNS: Final = ("t_roof_s", "waves", "ceil_waves", "flops", "bytes")
"""Unlogged helpers in the frame that :func:`features` returns (estimators that aggregate use them)."""


# --------------------------------------------------------------------------- groups


def uses_tensor_cores(op: str, dtype: str, tensor_cores: object) -> bool:
    """Whether the row's math runs on tensor cores: only matrix kinds; an explicit flag wins;
    by default fp32 does not (PyTorch leaves TF32 matmul off) and every other dtype does."""
    if op not in MATRIX_KINDS:
        return False
    if dtype == "tf32":
        return True
    # pandas-stubs: isna takes any object at runtime, but its overloads have none for a bare object
    if tensor_cores is not None and not pd.isna(tensor_cores):  # type: ignore[call-overload]
        return bool(tensor_cores)
    return dtype != "fp32"


def dtype_class(op: str, dtype: str, tensor_cores: object = None) -> str:
    """``fp32`` (CUDA cores), ``tf32`` (fp32 on tensor cores), ``half`` (fp16 and bf16: same
    element size, same tensor-core rate on every GPU that has both) or ``fp8``."""
    if dtype in ("fp16", "bf16"):
        return "half"
    if dtype == "fp8":
        return "fp8"
    if dtype in ("fp32", "tf32"):
        return "tf32" if uses_tensor_cores(op, dtype, tensor_cores) else "fp32"
    raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")


def group_key(op: str, direction: str, dclass: str) -> str:
    """The predictor a row belongs to, e.g. ``gemm-fwd-half``."""
    return f"{op}-{direction}-{dclass}"


def group_keys(frame: pd.DataFrame) -> pd.Series:
    """:func:`group_key` of every row of a dataset-schema frame (computed once per distinct
    op, dtype, direction and tensor-core flag)."""
    tc = frame["tensor_cores"] if "tensor_cores" in frame.columns else pd.Series(pd.NA, index=frame.index)
    flag = tc.astype("boolean").astype("Int8").fillna(-1).to_numpy(dtype=np.int8)
    keys = pd.DataFrame(
        {
            "op": frame["op"].astype(object).to_numpy(),
            "dtype": frame["dtype"].astype(object).to_numpy(),
            "direction": frame["direction"].astype(object).to_numpy(),
            "tc": flag,
        }
    )
    codes = keys.groupby(["op", "dtype", "direction", "tc"], sort=False, dropna=False).ngroup().to_numpy()
    first = keys.drop_duplicates()  # first appearances: the order of ngroup(sort=False)
    labels = np.array(
        [
            group_key(op, direction, dtype_class(op, dtype, None if f < 0 else bool(f)))
            for op, dtype, direction, f in first.itertuples(index=False)
        ],
        dtype=object,
    )
    return pd.Series(labels[codes], index=frame.index, dtype=object)


# --------------------------------------------------------------------------- feature lists


def _shape_features(kind: str) -> tuple[str, ...]:
    spec = get_op(kind)
    names: list[str] = []
    for p in spec.params:
        if p.type is int:
            names.append(f"log_{p.name}")
        elif p.type is bool:
            names.append(p.name)
        else:
            names.append(f"{p.name}_code")
    if kind == "gemm":
        names += ["align_m", "align_n", "align_k"]
    elif kind == "elementwise":
        names += ["fn_flops_per_elem", "fn_inputs"]
    elif kind in ("layernorm", "rmsnorm", "softmax"):
        names += ["align_cols"]
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
    v = values.astype(np.int64)
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
    if kind == "attention":
        seq = np.where(fwd, cols["seq_q"], cols["seq_kv"])
        blocks = _cdiv(seq, ATTENTION_TILE_ROWS)
        return cols["batch"] * cols["heads"] * blocks, nan, seq / (blocks * ATTENTION_TILE_ROWS)
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


def _formulas(spec, first: pd.DataFrame, formulas: Mapping[str, tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) of the distinct configurations ``first`` (parameter columns, ``_d`` the
    direction, ``_dt`` the dtype bytes). The registry's formulas are evaluated once per direction,
    dtype and categorical values, over float64 arrays of the integer parameters; a formula that
    cannot take arrays (a branch on an integer parameter) is evaluated row by row."""
    f_u = np.full(len(first), np.nan)
    b_u = np.full(len(first), np.nan)
    ints, cats = spec.int_params, spec.categorical_params
    cols = {n: first[n].to_numpy(dtype=float) for n in ints}
    for key, pos in first.groupby(["_d", "_dt", *cats], sort=False, dropna=False).indices.items():
        assert isinstance(key, tuple) and isinstance(pos, np.ndarray)  # grouped by >= 2 columns: tuple keys
        d, dt, *cat_vals = key
        pair = formulas.get(d)
        if pair is None:
            continue
        params: dict[str, object] = {n: cols[n][pos] for n in ints}
        params.update(zip(cats, cat_vals))
        try:
            with np.errstate(all="ignore"):
                f = np.asarray(pair[0](params, int(dt)), dtype=float)
                b = np.asarray(pair[1](params, int(dt)), dtype=float)
            f_u[pos], b_u[pos] = np.broadcast_to(f, pos.shape), np.broadcast_to(b, pos.shape)
            continue
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            pass
        for j in pos:
            row = {n: first[n].iat[j] for n in (*ints, *cats)}
            with contextlib.suppress(KeyError, TypeError, ValueError, ZeroDivisionError):
                f_u[j], b_u[j] = pair[0](row, int(dt)), pair[1](row, int(dt))
    return f_u, b_u


def _work(frame: pd.DataFrame, sms: int) -> pd.DataFrame:
    """flops, bytes, tiles and per-tile traffic of every row. FLOPs and bytes are the registry's
    formulas, called once per distinct configuration (predict queries repeat shapes)."""
    n = len(frame)
    flops = np.full(n, np.nan)
    moved = np.full(n, np.nan)
    tiles = np.full(n, np.nan)
    traffic = np.full(n, np.nan)
    fill = np.full(n, np.nan)
    ops = frame["op"].to_numpy(dtype=object)
    dt_all = frame["dtype"].map(DTYPE_BYTES).to_numpy(dtype=float)
    for kind in pd.unique(ops):
        spec = get_op(str(kind))
        names = spec.param_names
        missing = [c for c in names if c not in frame.columns]
        if missing:
            raise OpcastError(f"{kind} rows lack parameter column(s) {', '.join(missing)}")
        idx = np.flatnonzero(ops == kind)
        sub = frame.iloc[idx]
        ok = np.isfinite(dt_all[idx]) & sub[list(names)].notna().all(axis=1).to_numpy()
        idx, sub = idx[ok], sub[ok]
        if not len(idx):
            continue
        dirs = sub["direction"].to_numpy(dtype=object)
        dts = dt_all[idx]
        keys = sub[list(names)].assign(_d=dirs, _dt=dts)
        codes = keys.groupby(list(keys.columns), sort=False, dropna=False).ngroup().to_numpy()
        first = keys.drop_duplicates()  # first appearances: the order of ngroup(sort=False)
        formulas = {
            d: (spec._formula(d, spec.flops_fwd, spec.flops_bwd), spec._formula(d, spec.bytes_fwd, spec.bytes_bwd))
            for d in pd.unique(dirs)
            if d in spec.directions()
        }
        f_u, b_u = _formulas(spec, first, formulas)
        f_out, b_out = f_u[codes], b_u[codes]
        flops[idx], moved[idx] = f_out, b_out
        numeric = {n: pd.to_numeric(sub[n], errors="coerce").to_numpy(dtype=float) for n in spec.int_params}
        t, tr, fl = _tiles(str(kind), numeric, dirs == "fwd", dts, sms)
        tiles[idx] = t
        fill[idx] = fl
        traffic[idx] = np.where(np.isfinite(tr), tr, b_out)
    return pd.DataFrame(
        {"flops": flops, "bytes": moved, "tiles": tiles, "traffic": traffic, "fill": fill}, index=frame.index
    )


# --------------------------------------------------------------------------- features


def _peaks(frame: pd.DataFrame, device: DeviceSpec) -> tuple[np.ndarray, np.ndarray]:
    """(peak FLOP/s per row, tensor_cores flag per row); NaN where the device lacks the dtype."""
    tc = frame["tensor_cores"] if "tensor_cores" in frame.columns else pd.Series(pd.NA, index=frame.index)
    flag = tc.astype("boolean").astype("Int8").fillna(-1).to_numpy(dtype=np.int8)
    keys = pd.DataFrame(
        {"op": frame["op"].astype(object).to_numpy(), "dtype": frame["dtype"].astype(object).to_numpy(), "tc": flag}
    )
    codes = keys.groupby(["op", "dtype", "tc"], sort=False, dropna=False).ngroup().to_numpy()
    first = keys.drop_duplicates()  # first appearances: the order of ngroup(sort=False)
    peak_u = np.empty(len(first))
    tc_u = np.empty(len(first))
    for i, (op, dtype, f) in enumerate(first.itertuples(index=False)):
        use = uses_tensor_cores(op, dtype, None if f < 0 else bool(f))
        try:
            peak_u[i] = device.peak_flops("fp32" if dtype == "tf32" and not use else dtype, tensor_cores=use)
        except OpcastError:
            peak_u[i] = np.nan
        tc_u[i] = use
    return peak_u[codes], tc_u[codes]


def _log(x: np.ndarray | float) -> np.ndarray:
    return np.log(np.maximum(x, EPS))


def features(frame: pd.DataFrame, device: DeviceSpec) -> pd.DataFrame:
    """Every feature (the union of the declared lists) and the raw helpers of ``frame``'s rows on
    ``device``; rows the device cannot run (no peak for the dtype) or with missing parameters get
    NaN ``t_roof_s``. The index is ``frame``'s."""
    for col in ("op", "dtype", "direction"):
        if col not in frame.columns:
            raise OpcastError(f"query frame lacks column {col!r}; give op, dtype, direction and the op's parameters")
    frame = _fill_defaults(frame)
    sms = device.sm_count
    work = _work(frame, sms)
    peak, tcs = _peaks(frame, device)
    bw = device.mem_bw_bytes_per_s
    out: dict[str, np.ndarray] = {}
    flops = work["flops"].to_numpy()
    moved = work["bytes"].to_numpy()
    tiles = work["tiles"].to_numpy()
    traffic = work["traffic"].to_numpy()
    collective = frame["op"].map({k: get_op(str(k)).collective for k in pd.unique(frame["op"])}).to_numpy(dtype=bool)
    # Collectives: bus bytes over the link (NVLink within a node, the NIC across nodes).
    nodes = (
        pd.to_numeric(frame["nodes"], errors="coerce").to_numpy(dtype=float)
        if "nodes" in frame.columns
        else np.full(len(frame), np.nan)
    )
    link = np.where(nodes > 1, device.inter_node_bw_bytes_per_s, device.intra_node_bw_bytes_per_s)
    t_compute = flops / peak
    t_memory = np.where(collective, moved / link, moved / bw)
    t_roof = np.maximum(t_compute, t_memory)
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
        dtype_bytes=frame["dtype"].map(DTYPE_BYTES).to_numpy(dtype=float),
        tensor_cores=tcs,
        log_tiles=_log(tiles),
        log_waves=_log(waves),
        tail_efficiency=waves / np.maximum(ceil_waves, 1.0),
        tile_fill=work["fill"].to_numpy(),
        # One SM's share: a tile's roofline on 1/sm_count of the GPU, i.e. t_roof / waves.
        log_tile_t_roof_s=_log(t_roof) - _log(waves),
        log_tile_traffic_over_bytes=_log(traffic) - _log(moved),
        log_peak_flops=_log(peak),
        log_mem_bw_bytes_per_s=np.full(len(frame), np.log(bw)),
        log_sm_count=np.full(len(frame), np.log(sms)),
        log_l2_bytes=np.full(len(frame), np.log(max(device.l2_bytes, 1))),
        log_clock_hz=np.full(len(frame), np.log(device.boost_clock_hz)),
        log_ridge=_log(peak / bw),
        fp32_lanes_per_sm=np.full(len(frame), float(device.fp32_lanes_per_sm)),
        is_cpu=np.full(len(frame), float(device.vendor == "cpu")),
        log_link_bw_bytes_per_s=_log(link),
    )
    for name, typ in _param_columns().items():
        if name not in frame.columns:
            continue
        column = frame[name]
        if typ is int:
            vals = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
            out["log_message_bytes" if name == "bytes" else f"log_{name}"] = _log(vals)
            if name in ("world_size", "nodes", "gpus_per_node"):
                out[name] = vals
        elif typ is bool:
            out[name] = column.astype("boolean").astype("Float64").to_numpy(dtype=float, na_value=np.nan)
        else:
            out[f"{name}_code"] = column.astype(object).map(_CODES.get(name, {})).to_numpy(dtype=float)
    if "bytes" in frame.columns and "world_size" in frame.columns:
        out["log_bytes_per_rank"] = _log(pd.to_numeric(frame["bytes"], errors="coerce").to_numpy(dtype=float)) - _log(
            pd.to_numeric(frame["world_size"], errors="coerce").to_numpy(dtype=float)
        )
    for name in ("m", "n", "k", "cols"):
        if name in frame.columns:
            vals = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
            ok = np.isfinite(vals)
            a = np.full(len(frame), np.nan)
            a[ok] = _align(vals[ok])
            out[f"align_{name}"] = a
    if "fn" in frame.columns:
        fns = frame["fn"].astype(object)
        out["fn_flops_per_elem"] = fns.map({k: float(f.flops) for k, f in ELEMENTWISE_FNS.items()}).to_numpy(
            dtype=float
        )
        out["fn_inputs"] = fns.map({k: float(f.inputs) for k, f in ELEMENTWISE_FNS.items()}).to_numpy(dtype=float)
    result = pd.DataFrame(out, index=frame.index)
    return result


def _fill_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the optional parameters of its ops (:func:`opcast.ops.param_defaults`) set
    to their defaults where absent (rows written before the parameter existed, callers that leave
    it out); the frame itself when nothing is missing."""
    ops = frame["op"].astype(object).to_numpy()
    out = frame
    for kind in pd.unique(ops):
        if kind not in FEATURES:
            continue
        for name, default in param_defaults(str(kind)).items():
            rows = ops == kind
            if name in out.columns:
                rows &= out[name].isna().to_numpy()
            if rows.any():
                if out is frame:
                    out = frame.copy()
                if name not in out.columns:
                    out[name] = pd.Series([None] * len(out), index=out.index, dtype=object)
                out.loc[rows, name] = default
    return out


def _param_columns() -> dict[str, type]:
    from opcast.ops import param_types

    return param_types()


_CODES: Final[dict[str, dict[str, float]]] = {
    "fn": {name: float(i) for i, name in enumerate(ELEMENTWISE_FNS)},
    "impl": {name: float(i) for i, name in enumerate((*ATTENTION_IMPLS, *ROPE_IMPLS))},
}
"""Ordinal codes of the string parameters (their position in the registry's choices)."""


def matrix(feats: pd.DataFrame, names: tuple[str, ...]) -> np.ndarray:
    """The model-input matrix of ``names`` (float64; a declared feature absent from the frame is NaN)."""
    cols = [feats[n].to_numpy(dtype=float) if n in feats.columns else np.full(len(feats), np.nan) for n in names]
    return np.column_stack(cols) if cols else np.zeros((len(feats), 0))


ABSOLUTE_DEVICE_FEATURES: Final = frozenset(
    {"log_peak_flops", "log_mem_bw_bytes_per_s", "log_sm_count", "log_l2_bytes", "log_clock_hz", "fp32_lanes_per_sm"}
)
"""Device features in absolute units. With a handful of training GPUs an MLP reads them as a
GPU's identity and does not transfer; the relative features (the roofline times, the ridge, waves,
working set over L2) carry the device into the tile-MLP instead."""


def model_inputs(kind: str, estimator: str) -> tuple[str, ...]:
    """The declared features an estimator reads for ``kind``: all of :data:`FEATURES` for xgb,
    all but the absolute device specs for the tile-MLP."""
    names = FEATURES[kind] if kind in FEATURES else feature_names(kind)
    if estimator == "tile-mlp":
        return tuple(n for n in names if n not in ABSOLUTE_DEVICE_FEATURES)
    return names
