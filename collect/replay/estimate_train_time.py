"""Replay of the arXiv 2509.22832 artifact (DebarghaG/estimate-train-time): FP16 Megatron /
GPT-NeoX operator times on A100-SXM4-80GB (NERSC Perlmutter) and GH200 (TACC Vista), and NCCL
collective times on both systems.

Layout read (relative to the checkout that holds ``data/``)::

    data/regressors/<system>/operator/<GPU>_<op>_<dtype>.csv      F_dur(us), B_dur(us) or dur(us)
    data/regressors/<system>/nccl/<GPU>_<coll>[_large]_<dtype>[_<nodes>_<gpus>].csv   shape, dur(us)

``<GPU>.csv`` (no op suffix) is the authors' regressor choice per op, not a measurement: never read.

How a value was measured (``Kernel_sampling/sampling_controller.py``): ten profiled calls; each
call's time is the span from the first to the last GPU kernel launched under the op's profiler
range; the importer's ``time_s_median`` is the authors' mean of the 3rd..7th fastest of those
ten (a trimmed mean, not a median). Units are microseconds (column names say so).

Shapes come from the authors' sampling functions (``Kernel_sampling/target_functions.py``; see
also ``../shared/published/README.md``). Activations are [l, b, dim], ``mp`` is the
tensor-parallel degree and the vocabulary 50257 is padded per rank to
``V_p = ceil(50257 / (128 mp)) * 128`` (already the per-rank slice). Integer divisions are the
authors' (``dim*3 // mp`` ...).

Rows this importer leaves out, each counted under its reason in ``skipped`` (one count per
measurement, i.e. per direction of a source row):

* ``fillmask`` (baddbmm + causal masked_fill + softmax timed as one) — no single opcast op.
* ``res_add`` backward: the sampling function has no backward (its B_dur repeats F_dur) and an
  elementwise add has no backward kernel in the registry.
* a flash_atten file whose backward times are below the forward in the median: FlashAttention-2's
  backward does 2.5x the forward's FLOPs, so the capture missed kernels (Vista: median
  B_dur/F_dur = 0.11, B_dur nearly flat while F_dur grows 600x).
* a stage-optimizer row more than 3x the middle-stage step of the same (mp, dim, encoders): the
  first stage only adds one embedding table (Vista firstStage: 48 rows of 2-54 s).
* a collective whose bus bandwidth exceeds 1.1x the catalog's per-GPU link bandwidth of its path
  (NVLink within a node, the NIC across nodes): impossible, a partial capture (Vista all_gather
  on 4 and 8 nodes: down to 117 us for 2.4 GB).
* ``optimizer_fp16.csv`` (Perlmutter only; num_layers, hidden_size, param_tensors, params, dur):
  a whole-model optimizer timing whose implementation and unit are documented nowhere and whose
  time follows the tensor count, not the parameters.
* the Perlmutter files without a topology suffix: row for row the union of the per-topology
  files, so their rows are counted as repeats.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Final

from opcast.clusters import find_cluster
from opcast.collect.replay import ReplayOptions
from opcast.collect.replay.common import MalformedFile, ReplayResult, number, read_csv, whole
from opcast.hardware import get_device
from opcast.ops import bus_factor

TIMING_METHOD: Final = "replay:estimate-train-time"
VOCAB: Final = 50257
"""GPT-NeoX / GPT-2 vocabulary the authors pad (``vocab_size = 50257`` in target_functions.py)."""
DTYPE_BYTES: Final = {"fp16": 2, "bf16": 2, "fp32": 4}
FWD_COL, BWD_COL, DUR_COL = "F_dur(us)", "B_dur(us)", "dur(us)"
STAGE_RATIO_LIMIT: Final = 3.0
LINK_TOLERANCE: Final = 1.1

_OP_FILE = re.compile(r"^(?P<gpu>[^_]+)_(?P<op>.+)_(?P<dtype>fp16|bf16|fp32)$")
_NCCL_FILE = re.compile(
    r"^(?P<gpu>[^_]+)_(?P<coll>allreduce|allgather|reducescatter|p2p)(?P<large>_large)?"
    r"_(?P<dtype>fp16|bf16|fp32)(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?$"
)


def padded_vocab_per_rank(mp: int) -> int:
    """``ceil(50257 / (128 mp)) * 128``: the authors' ``partition_vocab_size`` (one rank's slice)."""
    return math.ceil(VOCAB / (128 * mp)) * 128


def encoder_params(mp: int, dim: int) -> int:
    """Parameters of one ``TransformerEncoder`` of the authors' stage simulator
    (``Kernel_sampling/megatron/stage_simulator.py``, in the authors' development repository
    Littlesnakess/GPUModeling25): LayerNorm(dim) x 2 (weight + bias), Linear(dim, 3 dim//mp) with
    bias, Linear(dim//mp, dim), Linear(dim, 4 dim//mp), Linear(4 dim//mp, dim) without bias."""
    qkv = 3 * dim // mp
    up = 4 * dim // mp
    return 2 * 2 * dim + dim * qkv + qkv + (dim // mp) * dim + dim * up + up * dim


def stage_params(stage: str, mp: int, dim: int, encoders: int) -> int:
    """Parameters FusedAdam updates in ``FirstStage`` / ``MiddleStage`` / ``LastStage``: the first adds
    the embedding [V_p, dim], the last a LayerNorm(dim) and the LM head Linear(dim, V_p // mp) (the
    simulator divides the per-rank V_p by mp once more; reproduced as written)."""
    body = encoders * encoder_params(mp, dim)
    vp = padded_vocab_per_rank(mp)
    if stage == "first":
        return vp * dim + body
    if stage == "last":
        return body + 2 * dim + dim * (vp // mp)
    return body


# --------------------------------------------------------------------------- operator mapping

Shape = dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Operator:
    columns: tuple[str, ...]
    """Shape columns of the source file, in the authors' order."""
    to_shape: Callable[..., tuple[str, Shape]]
    """(source shape values) -> (opcast op, params)."""
    kernel_name: str | None = None
    heads: bool = False
    """Whether the row has h (and the authors required h % mp == 0 and dim % h == 0)."""


def _gemm(b: int, m: int, n: int, k: int) -> tuple[str, Shape]:
    return "gemm", {"b": b, "m": m, "n": n, "k": k}


def _attention(mp: int, b: int, h: int, l: int, dim: int) -> tuple[str, Shape]:
    # flash_attn_func(Q, K, V) with q, k, v of [b, l, h/mp, dim/h] and flash-attn's default
    # causal=False: the authors did not pass causal=True, so the timing is of full attention.
    return "attention", {
        "batch": b,
        "heads": h // mp,
        "kv_heads": h // mp,
        "seq_q": l,
        "seq_kv": l,
        "head_dim": dim // h,
        "causal": False,
        "impl": "flash",
    }


OPERATORS: Final[dict[str, _Operator]] = {
    # [l*b, dim] x [dim, 3 dim/mp] (fused QKV); [l*b, dim/mp] x [dim/mp, dim]; [l*b, dim] x [dim, 4 dim/mp];
    # [l*b, 4 dim/mp] x [4 dim/mp, dim]; [l*b, dim] x [dim, V_p] (LM head, per-rank vocabulary).
    "linear1": _Operator(
        columns=("mp", "b", "l", "dim"), to_shape=lambda mp, b, l, dim: _gemm(1, l * b, dim * 3 // mp, dim)
    ),
    "linear2": _Operator(
        columns=("mp", "b", "l", "dim"), to_shape=lambda mp, b, l, dim: _gemm(1, l * b, dim, dim // mp)
    ),
    "linear3": _Operator(
        columns=("mp", "b", "l", "dim"), to_shape=lambda mp, b, l, dim: _gemm(1, l * b, dim * 4 // mp, dim)
    ),
    "linear4": _Operator(
        columns=("mp", "b", "l", "dim"), to_shape=lambda mp, b, l, dim: _gemm(1, l * b, dim, dim * 4 // mp)
    ),
    "linear_final": _Operator(
        columns=("mp", "b", "l", "dim"), to_shape=lambda mp, b, l, dim: _gemm(1, l * b, padded_vocab_per_rank(mp), dim)
    ),
    # scores = Q K^T: batch b h/mp, [l, dim/h] x [dim/h, l]; context = P V: [l, l] x [l, dim/h].
    "baddbmm": _Operator(
        columns=("mp", "b", "h", "l", "dim"),
        heads=True,
        to_shape=lambda mp, b, h, l, dim: _gemm(b * h // mp, l, l, dim // h),
    ),
    "bmm": _Operator(
        columns=("mp", "b", "h", "l", "dim"),
        heads=True,
        to_shape=lambda mp, b, h, l, dim: _gemm(b * h // mp, l, dim // h, l),
    ),
    "flash_atten": _Operator(
        columns=("mp", "b", "h", "l", "dim"), heads=True, to_shape=_attention, kernel_name="flash_attn:flash_attn_func"
    ),
    # nn.Softmax(dim=-1) over [b, h/mp, l, l]: torch's native kernel (impl native); Megatron's fused
    # causal kernel (ScaledUpperTriangMaskedSoftmax, one pass over the row in registers) over
    # [b h/mp, l, l]: impl fused.
    "softmax": _Operator(
        columns=("mp", "b", "h", "l"),
        kernel_name="torch:softmax",
        to_shape=lambda mp, b, h, l: ("softmax", {"rows": b * (h // mp) * l, "cols": l, "impl": "native"}),
    ),
    "ScaledUpperTriangMaskedSoftmax": _Operator(
        columns=("mp", "b", "h", "l"),
        kernel_name="megatron:ScaledUpperTriangMaskedSoftmax",
        to_shape=lambda mp, b, h, l: ("softmax", {"rows": b * h // mp * l, "cols": l, "impl": "fused"}),
    ),
    # nn.LayerNorm([dim]): torch's native kernel (impl native). GPT-NeoX's RMSNorm (megatron/model/norms.py):
    # x.norm, a divide and a multiply as torch ops, i.e. unfused (opcast.ops.UNFUSED_PASSES).
    "layernorm": _Operator(
        columns=("b", "l", "dim"),
        to_shape=lambda b, l, dim: ("layernorm", {"rows": l * b, "cols": dim, "impl": "native"}),
    ),
    "RMSlayernorm": _Operator(
        columns=("b", "l", "dim"),
        kernel_name="neox:RMSNorm",
        to_shape=lambda b, l, dim: ("rmsnorm", {"rows": l * b, "cols": dim, "impl": "unfused"}),
    ),
    "res_add": _Operator(
        columns=("b", "l", "dim"), to_shape=lambda b, l, dim: ("elementwise", {"numel": l * b * dim, "fn": "add"})
    ),
    "gelu": _Operator(
        columns=("mp", "b", "l", "dim"),
        to_shape=lambda mp, b, l, dim: ("elementwise", {"numel": l * b * (dim * 4 // mp), "fn": "gelu"}),
    ),
    # apply_rotary_pos_emb(q, k, cos, sin) rotates q and k, each [l, b, h/mp, dim/h], in one call,
    # as torch ops (unfused): 2.5x slower than Vidur's fused kernel on the same A100 at large sizes.
    "RoPE": _Operator(
        columns=("mp", "b", "h", "l", "dim"),
        heads=True,
        to_shape=lambda mp, b, h, l, dim: (
            "rope",
            {"tokens": l * b, "heads": 2 * (h // mp), "head_dim": dim // h, "impl": "unfused"},
        ),
    ),
    # nn.Embedding(V_p, dim) looked up with [b, l] ids; V_p is the per-rank slice.
    "embedding": _Operator(
        columns=("mp", "b", "l", "dim"),
        to_shape=lambda mp, b, l, dim: (
            "embedding",
            {"tokens": b * l, "vocab": padded_vocab_per_rank(mp), "hidden": dim},
        ),
    ),
    # vocab_parallel_cross_entropy over [b, l, V_p]: Megatron's Python composition (max, subtract,
    # exp, sum, divide as torch ops), unfused.
    "parallel_cross_entropy_128": _Operator(
        columns=("mp", "b", "l"),
        kernel_name="megatron:vocab_parallel_cross_entropy",
        to_shape=lambda mp, b, l: (
            "cross_entropy",
            {"tokens": b * l, "vocab": padded_vocab_per_rank(mp), "impl": "unfused"},
        ),
    ),
    # One DeepSpeed FusedAdam step over a pipeline stage's parameters (dur(us) only).
    **{
        f"{stage}Stage_optimizer": _Operator(
            columns=("mp", "dim", "encoders"),
            kernel_name="deepspeed:FusedAdam",
            to_shape=(lambda s: lambda mp, dim, encoders: ("optimizer", {"numel": stage_params(s, mp, dim, encoders)}))(
                stage
            ),
        )
        for stage in ("first", "middle", "last")
    },
}

SKIPPED_OPERATORS: Final[dict[str, str]] = {
    "fillmask": "fillmask: baddbmm + causal masked_fill + softmax timed as one, no single opcast op",
    "optimizer": "optimizer_fp16.csv: whole-model optimizer timing of undocumented implementation and unit "
    "(time follows param_tensors, not params)",
}
ORDER: Final = ("middleStage_optimizer", *(n for n in (*OPERATORS, *SKIPPED_OPERATORS) if n != "middleStage_optimizer"))
"""Files are read in this order: the middle stage first (the first and last stages are checked
against it), then the operators (torch's softmax and Megatron's fused causal kernel are distinct
points, impl native and fused, so a shape met in both keeps both)."""
ORDER_INDEX: Final = {name: i for i, name in enumerate(ORDER)}

COLLECTIVES: Final = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "p2p": "send_recv",
}


# --------------------------------------------------------------------------- entry point


def replay(root: Path, options: ReplayOptions) -> ReplayResult:
    """Rows of every operator and NCCL CSV under ``root/data/regressors``."""
    result = ReplayResult()
    regressors = Path(root) / "data" / "regressors"
    operator_files = sorted(regressors.glob("*/operator/*.csv"))
    nccl_files = sorted(regressors.glob("*/nccl/*.csv"))
    if not operator_files and not nccl_files:
        return result
    for path in (*operator_files, *nccl_files):  # <GPU>.csv (no "_") is a regressor summary: not read
        if "_" in path.stem and not (_OP_FILE if path.parent.name == "operator" else _NCCL_FILE).match(path.stem):
            result.files += 1
            result.skipped[f"{path.parent.name} file name not understood (<GPU>_<op>_<dtype>...)"] += len(
                list(read_csv(path))
            )
    parsed_ops = [(p, m) for p in operator_files if (m := _OP_FILE.match(p.stem))]
    parsed_ops.sort(key=lambda pm: (pm[1]["gpu"], ORDER_INDEX.get(pm[1]["op"], len(ORDER)), pm[0].name))
    middle: dict[tuple[str, str], dict[tuple[int, ...], float]] = {}
    for path, match in parsed_ops:
        _read_operator_file(root, path, match, result, middle)
    parsed_nccl = [(p, m) for p in nccl_files if (m := _NCCL_FILE.match(p.stem))]
    parsed_nccl.sort(key=lambda pm: (pm[1]["nodes"] is None, pm[0].as_posix()))  # per-topology files first
    seen: set[tuple[Any, ...]] = set()
    for path, match in parsed_nccl:
        _read_nccl_file(root, path, match, result, seen)
    return result


def _device(path: Path, gpu: str) -> str:
    try:
        return get_device(gpu).name
    except Exception as err:  # an unknown GPU: the file cannot be placed
        raise MalformedFile(
            path, None, f"GPU {gpu!r} from the file name is not in the hardware catalog ({err})"
        ) from None


def _read_operator_file(
    root: Path,
    path: Path,
    match: re.Match[str],
    result: ReplayResult,
    middle: dict[tuple[str, str], dict[tuple[int, ...], float]],
) -> None:
    name, dtype = match["op"], match["dtype"]
    operator = OPERATORS.get(name)
    if operator is None:
        reason = SKIPPED_OPERATORS.get(name, f"{name}: no opcast op for this estimate-train-time operator")
        rows = list(read_csv(path))
        result.files += 1
        result.skipped[reason] += sum(max(1, sum(c in row for c in (FWD_COL, BWD_COL))) for _, row in rows)
        return
    device = _device(path, match["gpu"])
    stage = name.removesuffix("Stage_optimizer") if name.endswith("Stage_optimizer") else None
    time_cols = (DUR_COL,) if stage else (FWD_COL, BWD_COL)
    lines = list(read_csv(path, required=(*operator.columns, *time_cols)))
    result.files += 1
    records = []
    for line, row in lines:
        shape = tuple(whole(path, line, row, c) for c in operator.columns)
        times = {c: number(path, line, row, c) for c in time_cols}
        records.append((line, shape, times))
    source_file = path.relative_to(root).as_posix()
    base = {
        "device": device,
        "dtype": dtype,
        "tensor_cores": dtype != "fp32",
        "timing_method": TIMING_METHOD,
        "source_file": source_file,
    }
    if operator.kernel_name:
        base["kernel_name"] = operator.kernel_name

    skip_bwd = None
    if name == "res_add":
        skip_bwd = (
            "res_add B_dur: elementwise add has no backward kernel "
            "(the sampling function has no backward; B_dur repeats F_dur)"
        )
    elif name == "flash_atten":
        ratios = [t[BWD_COL] / t[FWD_COL] for _, _, t in records if t[FWD_COL] > 0]
        if ratios and median(ratios) < 1.0:
            skip_bwd = (
                f"flash_atten B_dur on {device}: median backward/forward {median(ratios):.2f} < 1 "
                "(FlashAttention-2 backward is ~2.5x forward; kernels missing from the capture)"
            )
    if stage == "middle":
        middle[(device, dtype)] = {shape: t[DUR_COL] for _, shape, t in records}

    for _line, shape, times in records:
        values = dict(zip(operator.columns, shape))
        if operator.heads and (values["h"] % values["mp"] or values["dim"] % values["h"]):
            result.skipped[f"{name}: h not divisible by mp or dim by h"] += len(times)
            continue
        op, params = operator.to_shape(*shape)
        for column, seconds_us in times.items():
            direction = "bwd" if column == BWD_COL else "fwd"
            if column == BWD_COL and skip_bwd:
                result.skipped[skip_bwd] += 1
                continue
            if not math.isfinite(seconds_us) or seconds_us <= 0:
                result.skipped[f"{name}: missing or non-positive {column}"] += 1
                continue
            if stage in ("first", "last"):
                reference = middle.get((device, dtype), {}).get(shape)
                if reference is not None and seconds_us > STAGE_RATIO_LIMIT * reference:
                    result.skipped[
                        f"{name} on {device}: more than {STAGE_RATIO_LIMIT:g}x the middle-stage step "
                        "of the same (mp, dim, encoders)"
                    ] += 1
                    continue
            result.rows.append({**base, "op": op, **params, "direction": direction, "time_s_median": seconds_us / 1e6})


# --------------------------------------------------------------------------- NCCL


def _read_nccl_file(
    root: Path, path: Path, match: re.Match[str], result: ReplayResult, seen: set[tuple[Any, ...]]
) -> None:
    device = _device(path, match["gpu"])
    spec = get_device(device)
    dtype = match["dtype"]
    op = COLLECTIVES[match["coll"]]
    family = (device, match["coll"], bool(match["large"]), dtype)
    suffix = (int(match["nodes"]), int(match["gpn"])) if match["nodes"] else None
    lines = list(read_csv(path, required=("shape", "nodes", "GPUsPerNode", DUR_COL)))
    result.files += 1
    source_file = path.relative_to(root).as_posix()
    system = find_cluster(path.parent.parent.name)  # regressors/<Perlmutter|Vista>/nccl/<file>
    cluster = system.name if system is not None else None
    for line, row in lines:
        shape = whole(path, line, row, "shape")
        nodes, gpn = whole(path, line, row, "nodes"), whole(path, line, row, "GPUsPerNode")
        dur_us = number(path, line, row, DUR_COL)
        if suffix is not None and (nodes, gpn) != suffix:
            raise MalformedFile(
                path, line, f"nodes={nodes}, GPUsPerNode={gpn} but the file name says {suffix[0]}_{suffix[1]}"
            )
        key = (*family, nodes, gpn, shape, dur_us)
        if suffix is None and key in seen:
            result.skipped["nccl file without topology suffix: row repeats a per-topology file"] += 1
            continue
        seen.add(key)
        if not math.isfinite(dur_us) or dur_us <= 0:
            result.skipped[f"{match['coll']}: missing or non-positive dur(us)"] += 1
            continue
        world = nodes * gpn
        # all_gather: `shape` is each rank's input (dist.all_gather(gather_list, tensor)); nccl-tests
        # size is the gathered output. all_reduce and send: the buffer; reduce_scatter: the input.
        nbytes = shape * DTYPE_BYTES[dtype] * (world if op == "all_gather" else 1)
        seconds = dur_us / 1e6
        algbw = nbytes / seconds / 1e9
        busbw = algbw * bus_factor(op, world) if world >= 2 else algbw
        link = spec.inter_node_bw_bytes_per_s if nodes > 1 else spec.intra_node_bw_bytes_per_s
        if link and busbw * 1e9 > LINK_TOLERANCE * link:
            path_name = "inter-node (NIC)" if nodes > 1 else "intra-node (NVLink)"
            result.skipped[
                f"{op} on {device}: busbw above {LINK_TOLERANCE:g}x the {path_name} link bandwidth "
                f"({link / 1e9:g} GB/s), a partial capture"
            ] += 1
            continue
        result.rows.append(
            {
                "device": device,
                "op": op,
                "bytes": nbytes,
                "world_size": world,
                "nodes": nodes,
                "gpus_per_node": gpn,
                "dtype": dtype,
                "direction": "fwd",
                "time_s_median": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "timing_method": TIMING_METHOD,
                "source_file": source_file,
                "cluster": cluster,
                "backend": "nccl",
            }
        )
