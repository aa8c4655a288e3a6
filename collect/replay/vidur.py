"""Vidur (microsoft/vidur @ 7d47513, MLSys'24): FP16 per-layer op profiles and collective profiles.

``ROOT`` is a vidur checkout (or the published copy of it). Three file families are read:

``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``
    One row per (num_tokens T, tensor-parallel degree TP); the model's shape sits in the row
    itself (``n_head`` nq, ``n_kv_head`` nkv, ``n_embd`` h, ``n_expanded_embd`` f, ``vocab_size``
    V, ``use_gated_mlp``), head dim d = h / nq. Each ``time_stats.<op>.median`` column (ms, the
    median over the 20 repeated blocks of vidur's ``record_function`` profiling of one forward,
    fp16, kernel times from Kineto) becomes one row, forward, ``tensor_cores`` True, shapes per
    rank (vidur/profiling/mlp/mlp_impl.py; sarathi-serve's tensor_parallel/layers.py times only
    the ``F.linear`` / ``F.embedding`` call):

    ======================== ============ =====================================================
    vidur column             opcast op    per-rank shape
    ======================== ============ =====================================================
    emb                      embedding    tokens=T, vocab=V/TP, hidden=h (the masking kernels of
                                          VocabParallelEmbedding lie outside the timer)
    input_layernorm          rmsnorm or   rows=T, cols=h, impl native (vLLM's 2023 rms_norm_kernel,
                             layernorm    a single multi-pass kernel, or nn.LayerNorm; model's norm,
                                          table ``_MODELS``);
                                          replicated: TP>1 rows skipped (same shape as TP=1)
    attn_pre_proj            gemm         b=1, m=T, n=(nq+2 nkv) d/TP, k=h (fused QKV; Qwen-72B
                                          and phi-2 include the bias in the same F.linear)
    attn_rope                rope         tokens=T, heads=(nq+nkv)/TP, head_dim=d (q and k in one
                                          kernel; vidur rotates the full head, phi-2 included)
    attn_post_proj           gemm         b=1, m=T, n=h, k=nq d/TP
    post_attention_layernorm rmsnorm      rows=T, cols=h; TP>1 rows skipped as for input norm
    mlp_up_proj              gemm         b=1, m=T, n=2f/TP (gated: fused gate+up) or f/TP, k=h
    mlp_act                  elementwise  gated: fn=swiglu (SiluAndMul), numel=T f/TP;
                                          else fn=gelu (torch.nn.GELU), numel=T f/TP
    mlp_down_proj            gemm         b=1, m=T, n=h, k=f/TP
    add                      elementwise  fn=add, numel=T h (residual add after the MLP);
                                          phi-2's parallel block adds three tensors (two adds
                                          in one timer): skipped; TP>1 rows skipped as above
    ======================== ============ =====================================================

    Any other ``time_stats.<op>`` column is skipped with a counted reason. ``time_s_median`` =
    median ms / 1e3, p20/p80 unknown (null), ``n_reps`` 20, ``timing_method``
    ``replay:vidur:median20``.

``data/profiling/network/<gpu>_<topology>/{all_reduce,send_recv}.csv``
    ``size`` is already in bytes (vidur's collectives_wrapper writes ``size * 2`` for its fp16
    buffer), ``num_workers`` ranks placed ``devices_per_node`` per node
    (benchmark_runner.py ``_get_rank``): world_size = num_workers, gpus_per_node =
    min(num_workers, devices_per_node), nodes = num_workers / gpus_per_node. The median is over
    3 samples (mean = (min+median+max)/3 in every row), each the median of the 11 NCCL kernels
    of one timed call: ``n_reps`` 3, ``timing_method`` ``replay:vidur:median3``. algbw = bytes /
    time, busbw = algbw x the nccl-tests factor. ``backend`` is ``nccl``; ``cluster`` is the
    catalog cluster the folder name is an alias of (``a100_dgx`` -> ``azure-nd-a100-v4``,
    ``a100_pairwise_nvlink`` -> ``azure-nc-a100-v4``: the Azure VMs Vidur profiled, Agrawal et
    al. 2024, Sec. 6), null for a folder the cluster catalog lacks (``a40_pairwise_nvlink``).

``_history/<commit>/data/profiling/<gpu>/*.csv`` (older vidur profiles, fp16)
    - ``all_reduce.csv`` with ``size``/``devices_per_node`` (6d98aa8): as the network files.
    - ``all_reduce.csv`` keyed by ``n_embd`` x ``num_tokens`` (c211fca): bytes = T h 2 over
      ``num_workers`` ranks of one node (at most 8: the tensor-parallel group of one server).
    - ``p2p_intra_node.csv`` / ``p2p_inter_node.csv``: send_recv between 2 ranks (1 node x 2 /
      2 nodes x 1) of each TP rank's 1/TP slice of the activations, bytes = T h 2 / TP (the
      times fall as 1/TP at every size, so the message is the slice).
    - ``all_gather.csv`` keyed by ``vocab_size`` x ``num_tokens``: skipped. Its time column is
      ``time_stats.all_reduce`` and its times *fall* with ``num_workers`` (A100, V=32768,
      T=200192: 30.9 / 23.0 / 12.4 ms at 2 / 4 / 8 ranks), which no all-gather of the T x V
      logits does; neither the collective nor the message size can be recovered.
    The history keeps no repetition count (``n_reps`` null); ``timing_method``
    ``replay:vidur:median``. Rows with ``num_tokens`` 0 (an empty message) are skipped.

Models in the published compute data (A100: all eight; A40: all but the two Llama-3), with the
shape their rows carry (nq / nkv / h / f / V, gated): Llama-2-7b-hf 32/32/4096/11008/32768 and
Llama-2-70b-hf 64/8/8192/28672/32768, Meta-Llama-3-8B 32/8/4096/14336/128256 and
Meta-Llama-3-70B 64/8/8192/28672/128256 (to 32768 tokens), CodeLlama-34b-Instruct-hf
64/8/8192/22016/32768, internlm-20b 40/40/5120/13824/103168, Qwen-72B 64/64/8192/24576/152064,
all gated with RMSNorm; phi-2 32/32/2560/10240/51200, GELU and LayerNorm, TP=1 only. (Vidur
pads the Llama-2 vocabulary 32000 to 32768; its rows are what was timed.) A model missing from
``_MODELS`` still gives its GEMMs, embedding, rope and activation; its norms and add are skipped.

Devices come from the folder name through the catalog aliases (``a100`` -> A100-SXM4-80GB,
``a40`` -> A40, ``v100`` -> V100-SXM2-32GB; a folder the catalog lacks is skipped with a counted
reason). ``ReplayOptions`` is not used: the files say everything. A network folder's topology suffix (``_dgx``,
``_pairwise_nvlink``) is not a column of the dataset, so a collective configuration read from
one topology is skipped, with a counted reason, when another file (read first: current data in
folder order, then the history) already gave the same device and configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from opcast.clusters import find_cluster
from opcast.collect.replay import ReplayOptions
from opcast.collect.replay.common import MalformedFile, ReplayResult, csv_header, number, read_csv
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.ops import bus_factor

COMPUTE_DIR: Final = Path("data/profiling/compute")
NETWORK_DIR: Final = Path("data/profiling/network")
HISTORY_DIR: Final = Path("_history")

DTYPE: Final = "fp16"
FP16_BYTES: Final = 2
COMPUTE_REPS: Final = 20
"""vidur/profiling/mlp/mlp_wrapper.py: ACTIVE_STEPS (the block repeated in one forward)."""
NETWORK_REPS: Final = 3
"""vidur/profiling/collectives/collectives_wrapper.py: ACTIVE_STEPS."""

SHAPE_COLUMNS: Final = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Model:
    """What mlp.csv does not carry about a model's block."""

    norm: str
    """opcast op of its norms: ``rmsnorm`` or ``layernorm``."""
    post_attn_norm: bool
    """Sequential block (norm, attention, add, norm, MLP, add); False: phi-2's parallel block."""


# From vidur's data/model_configs/<org>/<model>.yml at 7d47513 (keys ``norm`` and
# ``post_attn_norm``); the shapes themselves are columns of each mlp.csv row.
_MODELS: Final[dict[str, _Model]] = {
    "Qwen/Qwen-72B": _Model(norm="rmsnorm", post_attn_norm=True),
    "codellama/CodeLlama-34b-Instruct-hf": _Model(norm="rmsnorm", post_attn_norm=True),
    "internlm/internlm-20b": _Model(norm="rmsnorm", post_attn_norm=True),
    "meta-llama/Llama-2-7b-hf": _Model(norm="rmsnorm", post_attn_norm=True),
    "meta-llama/Llama-2-70b-hf": _Model(norm="rmsnorm", post_attn_norm=True),
    "meta-llama/Meta-Llama-3-8B": _Model(norm="rmsnorm", post_attn_norm=True),
    "meta-llama/Meta-Llama-3-70B": _Model(norm="rmsnorm", post_attn_norm=True),
    "microsoft/phi-2": _Model(norm="layernorm", post_attn_norm=False),
}

REPLICATED: Final = "vidur norm/add at TP>1: replicated op, same shape as the TP=1 row"
PARALLEL_ADD: Final = "vidur add of a parallel block (phi-2): two chained adds in one timer"
ALL_GATHER: Final = "vidur _history all_gather.csv: times fall with num_workers, collective and size unrecoverable"
EMPTY_MESSAGE: Final = "vidur _history: num_tokens=0 (empty message)"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Shape:
    """One mlp.csv row's model shape and token count at its TP degree."""

    tokens: int
    tp: int
    heads: int
    kv_heads: int
    hidden: int
    ffn: int
    vocab: int
    gated: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def replay(root: Path, options: ReplayOptions) -> ReplayResult:
    """Rows of every vidur profile under ``root`` (see the module docstring)."""
    result = ReplayResult()
    for path in sorted((root / COMPUTE_DIR).glob("*/*/*/mlp.csv")):
        _compute_file(root, path, result)
    seen: dict[tuple[Any, ...], str] = {}
    for path in sorted((root / NETWORK_DIR).glob("*/*.csv")):
        _network_file(root, path, result, seen)
    for path in sorted((root / HISTORY_DIR).glob("*/data/profiling/*/*.csv")):
        _history_file(root, path, result, seen)
    return result


# --------------------------------------------------------------------------- compute


def _compute_file(root: Path, path: Path, result: ReplayResult) -> None:
    rel = path.relative_to(root).as_posix()
    gpu, org, model_name = path.parent.parent.parent.name, path.parent.parent.name, path.parent.name
    model_key = f"{org}/{model_name}"
    device = _device(gpu)
    if device is None:
        _skip_file(path, result, f"vidur: GPU folder {gpu!r} is not in the hardware catalog", rows=len(_ops(path)))
        return
    model = _MODELS.get(model_key)
    result.files += 1
    ops = _ops(path)
    for line, row in read_csv(path, required=SHAPE_COLUMNS):
        shape = _shape(path, line, row)
        for op_column in ops:
            text = row[f"time_stats.{op_column}.median"]
            if text == "":
                result.skipped[f"vidur mlp.csv: empty time_stats.{op_column}.median"] += 1
                continue
            ms = number(path, line, row, f"time_stats.{op_column}.median")
            mapped = _compute_op(op_column, shape, model, model_key)
            if isinstance(mapped, str):
                result.skipped[mapped] += 1
                continue
            if ms <= 0:
                result.skipped[f"vidur mlp.csv: non-positive median time ({op_column})"] += 1
                continue
            op, params = mapped
            result.rows.append(
                {
                    "device": device,
                    "op": op,
                    **params,
                    "dtype": DTYPE,
                    "direction": "fwd",
                    "tensor_cores": True,
                    "time_s_median": ms / 1e3,
                    "time_s_p20": None,
                    "time_s_p80": None,
                    "n_reps": COMPUTE_REPS,
                    "source_file": rel,
                    "timing_method": "replay:vidur:median20",
                }
            )


def _shape(path: Path, line: int, row: dict[str, str]) -> _Shape:
    values = {c: _integer(path, line, row, c) for c in SHAPE_COLUMNS if c != "use_gated_mlp"}
    gated_text = row["use_gated_mlp"].lower()
    if gated_text not in ("true", "false"):
        raise MalformedFile(path, line, f"column 'use_gated_mlp' is {row['use_gated_mlp']!r}, not True or False")
    shape = _Shape(
        tokens=values["num_tokens"],
        tp=values["num_tensor_parallel_workers"],
        heads=values["n_head"],
        kv_heads=values["n_kv_head"],
        hidden=values["n_embd"],
        ffn=values["n_expanded_embd"],
        vocab=values["vocab_size"],
        gated=gated_text == "true",
    )
    problems = [
        f"{name}={value} is not a multiple of {what}={by}"
        for name, value, what, by in (
            ("n_embd", shape.hidden, "n_head", shape.heads),
            ("n_head", shape.heads, "num_tensor_parallel_workers", shape.tp),
            ("n_kv_head", shape.kv_heads, "num_tensor_parallel_workers", shape.tp),
            ("n_expanded_embd", shape.ffn, "num_tensor_parallel_workers", shape.tp),
            ("vocab_size", shape.vocab, "num_tensor_parallel_workers", shape.tp),
        )
        if value % by
    ]
    if problems:
        raise MalformedFile(path, line, "; ".join(problems) + " (vidur asserts these)")
    return shape


def _compute_op(column: str, s: _Shape, model: _Model | None, model_key: str) -> tuple[str, dict[str, Any]] | str:
    """(op, params) of one mlp.csv column at shape ``s``, or the reason it is skipped."""
    t, tp, d, h = s.tokens, s.tp, s.head_dim, s.hidden
    per_rank_ffn = s.ffn // tp
    if column == "emb":
        return "embedding", {"tokens": t, "vocab": s.vocab // tp, "hidden": h}
    if column == "attn_pre_proj":
        return "gemm", {"b": 1, "m": t, "n": (s.heads + 2 * s.kv_heads) * d // tp, "k": h}
    if column == "attn_rope":
        return "rope", {
            "tokens": t,
            "heads": (s.heads + s.kv_heads) // tp,
            "head_dim": d,
            "impl": "fused",
        }  # vLLM's rotary_embedding kernel
    if column == "attn_post_proj":
        return "gemm", {"b": 1, "m": t, "n": h, "k": s.heads * d // tp}
    if column == "mlp_up_proj":
        return "gemm", {"b": 1, "m": t, "n": (2 if s.gated else 1) * per_rank_ffn, "k": h}
    if column == "mlp_act":
        return "elementwise", {"numel": t * per_rank_ffn, "fn": "swiglu" if s.gated else "gelu"}
    if column == "mlp_down_proj":
        return "gemm", {"b": 1, "m": t, "n": h, "k": per_rank_ffn}
    if column in ("input_layernorm", "post_attention_layernorm", "add"):
        if model is None:
            return f"vidur {column}: block structure of {model_key} unknown (not in vidur._MODELS)"
        if column == "add" and not model.post_attn_norm:
            return PARALLEL_ADD
        if tp > 1:
            return REPLICATED
        if column == "add":
            return "elementwise", {"numel": t * h, "fn": "add"}
        # impl native, not fused: vLLM's rms_norm_kernel of 2023 (csrc/layernorm_kernels.cu, the one
        # sarathi-serve and so vidur call) is one launch of one block per token that reads the row
        # from global memory twice with scalar loads (a loop summing x^2 into a blockReduceSum, then
        # a loop re-reading x to write x * rsqrt(var + eps) * w): torch-native-like efficiency, not
        # that of a one-pass fused kernel (opcast.ops.KERNEL_IMPLS). phi-2's norm is nn.LayerNorm.
        return model.norm, {"rows": t, "cols": h, "impl": "native"}
    return f"vidur mlp.csv: unmapped column time_stats.{column}"


# --------------------------------------------------------------------------- collectives

_NETWORK_OPS: Final = {"all_reduce": "all_reduce", "send_recv": "send_recv"}
NETWORK_GPUS: Final = {"a100_pairwise_nvlink": "A100-PCIe-80GB"}
"""Network folders whose GPU is not the compute folder's: Vidur's pairwise-NVLink A100 nodes are
Azure NC A100 v4 VMs (4 x A100 80GB PCIe, NVLink bridges between pairs; Agrawal et al. 2024,
MLSys, Sec. 6), not DGX A100 (SXM4) like ``a100_dgx``. Keeping them apart also keeps their much
slower 4-rank collectives from colliding with the DGX rows."""
_NETWORK_COLUMNS: Final = ("size", "num_workers", "devices_per_node")


def _network_file(root: Path, path: Path, result: ReplayResult, seen: dict[tuple[Any, ...], str]) -> None:
    op = _NETWORK_OPS.get(path.stem)
    if op is None:
        _skip_file(path, result, f"vidur network: unknown collective file {path.name}")
        return
    folder = path.parent.name
    gpu = NETWORK_GPUS.get(folder, folder.split("_", 1)[0])
    spec = find_cluster(folder)
    _sized_collectives(
        root,
        path,
        op,
        gpu,
        folder,
        result,
        seen,
        n_reps=NETWORK_REPS,
        timing_method="replay:vidur:median3",
        tags={"backend": "nccl", "cluster": spec.name if spec is not None else None},
    )


def _sized_collectives(
    root: Path,
    path: Path,
    op: str,
    gpu: str,
    folder: str,
    result: ReplayResult,
    seen: dict[tuple[Any, ...], str],
    *,
    n_reps: int | None,
    timing_method: str,
    tags: dict[str, str | None] | None = None,
) -> None:
    """A file with ``size`` (bytes), ``num_workers`` and ``devices_per_node`` columns; ``folder``
    names the topology (network folder or history commit) for the collision reason; ``tags``
    (cluster, backend) go on every row."""
    rel = path.relative_to(root).as_posix()
    device = _device(gpu)
    if device is None:
        _skip_file(path, result, f"vidur: GPU folder {gpu!r} is not in the hardware catalog")
        return
    column = f"time_stats.{op}.median"
    result.files += 1
    for line, row in read_csv(path, required=(*_NETWORK_COLUMNS, column)):
        size, workers, per_node = (_integer(path, line, row, c) for c in _NETWORK_COLUMNS)
        gpus_per_node = min(workers, per_node)
        nodes = -(-workers // gpus_per_node)
        if nodes * gpus_per_node != workers:
            result.skipped[f"vidur {op}: num_workers not a multiple of devices_per_node"] += 1
            continue
        _collective(
            result,
            seen,
            path=path,
            line=line,
            row=row,
            column=column,
            rel=rel,
            folder=folder,
            device=device,
            op=op,
            nbytes=size,
            world=workers,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            n_reps=n_reps,
            timing_method=timing_method,
            tags=tags,
        )


def _history_file(root: Path, path: Path, result: ReplayResult, seen: dict[tuple[Any, ...], str]) -> None:
    rel = path.relative_to(root).as_posix()
    gpu = path.parent.name
    folder = f"_history/{path.parts[-5]}"
    header = _header(path)
    if path.stem == "all_gather":
        _skip_file(path, result, ALL_GATHER)
        return
    if path.stem == "all_reduce" and "size" in header:
        _sized_collectives(
            root, path, "all_reduce", gpu, folder, result, seen, n_reps=None, timing_method="replay:vidur:median"
        )
        return
    if path.stem == "all_reduce":
        required: tuple[str, ...] = ("num_workers", "n_embd", "num_tokens", "time_stats.all_reduce.median")
        column = "time_stats.all_reduce.median"
    elif path.stem in ("p2p_intra_node", "p2p_inter_node"):
        required = ("num_tensor_parallel_workers", "n_embd", "num_tokens", "time_stats.send_recv.median")
        column = "time_stats.send_recv.median"
    else:
        _skip_file(path, result, f"vidur _history: unknown profile file {path.name}")
        return
    device = _device(gpu)
    if device is None:
        _skip_file(path, result, f"vidur: GPU folder {gpu!r} is not in the hardware catalog")
        return
    result.files += 1
    stem = path.stem
    for line, row in read_csv(path, required=required):
        tokens, hidden = _integer(path, line, row, "num_tokens"), _integer(path, line, row, "n_embd")
        if tokens == 0:
            result.skipped[EMPTY_MESSAGE] += 1
            continue
        if stem == "all_reduce":
            op, world = "all_reduce", _integer(path, line, row, "num_workers")
            nbytes, nodes, gpus_per_node = tokens * hidden * FP16_BYTES, 1, world
        else:
            tp = _integer(path, line, row, "num_tensor_parallel_workers")
            if (tokens * hidden) % tp:
                raise MalformedFile(
                    path,
                    line,
                    f"num_tokens x n_embd = {tokens * hidden} is not a multiple of num_tensor_parallel_workers={tp}",
                )
            op, world, nbytes = "send_recv", 2, tokens * hidden * FP16_BYTES // tp
            nodes, gpus_per_node = (1, 2) if stem == "p2p_intra_node" else (2, 1)
        _collective(
            result,
            seen,
            path=path,
            line=line,
            row=row,
            column=column,
            rel=rel,
            folder=folder,
            device=device,
            op=op,
            nbytes=nbytes,
            world=world,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            n_reps=None,
            timing_method="replay:vidur:median",
        )


def _collective(
    result: ReplayResult,
    seen: dict[tuple[Any, ...], str],
    *,
    path: Path,
    line: int,
    row: dict[str, str],
    column: str,
    rel: str,
    folder: str,
    device: str,
    op: str,
    nbytes: int,
    world: int,
    nodes: int,
    gpus_per_node: int,
    n_reps: int | None,
    timing_method: str,
    tags: dict[str, str | None] | None = None,
) -> None:
    ms = number(path, line, row, column)
    if ms <= 0:
        result.skipped[f"vidur {op}: non-positive median time"] += 1
        return
    key = (device, op, nbytes, world, nodes, gpus_per_node)
    first = seen.setdefault(key, folder)
    if first != folder:
        result.skipped[f"vidur {op}: same {device} config already read from {first} (no topology column)"] += 1
        return
    seconds = ms / 1e3
    algbw = nbytes / seconds / 1e9
    result.rows.append(
        {
            "device": device,
            "op": op,
            "bytes": nbytes,
            "world_size": world,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "dtype": DTYPE,
            "direction": "fwd",
            "tensor_cores": None,
            "time_s_median": seconds,
            "time_s_p20": None,
            "time_s_p80": None,
            "n_reps": n_reps,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(op, world),
            "source_file": rel,
            "timing_method": timing_method,
            **(tags or {}),
        }
    )


# --------------------------------------------------------------------------- helpers


def _device(folder: str) -> str | None:
    """Catalog name of vidur's GPU folder name, or None when the catalog has no such alias."""
    try:
        return get_device(folder).name
    except OpcastError:
        return None


def _integer(path: Path, line: int, row: dict[str, str], column: str) -> int:
    value = number(path, line, row, column)
    if not value.is_integer() or value < 0:
        raise MalformedFile(path, line, f"column {column!r} is {row[column]!r}, not a non-negative integer")
    return int(value)


def _header(path: Path) -> list[str]:
    first = csv_header(path)
    if first is None:
        raise MalformedFile(path, 1, "empty file, expected a CSV header")
    return first


def _ops(path: Path) -> list[str]:
    """The ``<op>`` of every ``time_stats.<op>.median`` column of an mlp.csv."""
    return [
        c[len("time_stats.") : -len(".median")]
        for c in _header(path)
        if c.startswith("time_stats.") and c.endswith(".median")
    ]


def _skip_file(path: Path, result: ReplayResult, reason: str, *, rows: int = 1) -> None:
    """Count every data row of a file that is read but not converted (``rows`` per line)."""
    result.files += 1
    result.skipped[reason] += rows * sum(1 for _ in read_csv(path))


__all__ = ["replay"]
