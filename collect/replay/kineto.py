"""Replay a PyTorch profiler trace: GPU kernel times of aten ops, keyed by their recorded shapes.

Input: the Chrome-trace JSON that ``torch.profiler.profile(activities=[CPU, CUDA],
record_shapes=True)`` writes with ``export_chrome_trace`` (or a ``tensorboard_trace_handler``
folder of them), ``.json`` or ``.json.gz``; ``root`` is one file or a folder searched recursively.

How a kernel finds its op
    Every GPU kernel (``"cat": "kernel"``) carries the ``correlation`` id of the runtime call that
    launched it (``cudaLaunchKernel``/``cuLaunchKernelEx``, ``"cat": "cuda_runtime"`` or
    ``"cuda_driver"``, same ``correlation``); without that arg, the ``ac2g`` flow event that ends
    on the kernel names the call. The launching op is the innermost ``cpu_op`` that encloses the
    runtime call on its thread -- this works whatever ``"External id"`` means in the trace (the
    launching op's id in recent torch, the correlation itself in older traces). Only when no
    runtime event is recorded does the kernel's own ``"External id"`` name the op. From the launching op we walk
    up to the innermost *mapped* op, so ``aten::linear`` never double-counts its ``aten::addmm``,
    and ``aten::_flash_attention_forward``'s kernels belong to
    ``aten::_scaled_dot_product_flash_attention``.

Timing
    The time of one op invocation is the sum of its kernels' durations (us -> s, ``/1e6``); copies
    and memsets (``gpu_memcpy``/``gpu_memset``) are not counted. An invocation with a negative
    kernel duration (broken GPU timestamps) or no kernel time at all is skipped and counted, never
    written. Invocations with the same (device, op, shape, dtype, direction) in one file are
    aggregated: ``time_s_median`` is their median, ``n_reps`` their count,
    ``time_s_p20``/``time_s_p80`` are given from 3 invocations on.
    Kernel time excludes launch gaps, so it is what the op costs on the GPU in that run (warm L2,
    possibly overlapping other streams), not a cold-cache microbenchmark.

Mapping (``timing_method`` ``replay:kineto:kernel_sum``)
    - ``aten::mm`` [m,k]x[k,n], ``aten::addmm`` (bias, [m,k], [k,n]) -> gemm b=1;
      ``aten::bmm`` / ``aten::baddbmm`` [b,m,k]x[b,k,n] -> gemm with b.
    - backward GEMMs: the two ``aten::mm``/``aten::bmm`` inside one ``MmBackward0``,
      ``AddmmBackward0``, ``BmmBackward0`` or ``BaddbmmBackward0`` node are one gemm ``bwd`` row
      (the registry's backward is both input gradients) of the forward shape: m, n from the
      node's incoming gradient [.., m, n], k the remaining dimension of the products. A node with
      one product (one input needed no gradient) is skipped with its reason.
    - ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`` and their ``_backward`` ->
      attention (q [b,h,s,d], k [b,kvh,skv,d]; impl ``flash`` for the flash kernels, ``sdpa``
      for the others); ``is_causal`` comes from ``"Concrete Inputs"`` (torch >= 2.1) -- without
      it, or with an explicit mask/bias tensor, the invocation is skipped.
    - ``aten::native_layer_norm`` (+ ``_backward``) -> layernorm, rows = prod(leading dims),
      cols = prod(normalized_shape); ``aten::_softmax`` (+ ``_softmax_backward_data``) over the
      last dim -> softmax. Without ``"Concrete Inputs"`` (torch < 2.1) both are taken to act on
      the last dim, which is what transformer layers do.
    - NCCL kernels (``ncclKernel_*``/``ncclDevKernel_*``) -> collectives with ``timing_method``
      ``replay:kineto:nccl_kernel``: bytes = max(In, Out msg nelems) x dtype size (the nccl-tests
      "size" for every collective), world_size = ``Group size``, from the kernel's args or the
      ``record_param_comms`` op that launched it. ``--world-size``, ``--nodes`` and
      ``--gpus-per-node`` fill what the trace lacks; with neither nodes nor gpus per node given,
      up to 8 ranks are assumed to share one node (more are skipped: pass ``--nodes``). The
      kernel time includes waiting for the slowest rank. Send/recv and barriers are skipped.
    - Everything else that ran GPU kernels is counted in ``skipped`` as ``unmapped <op name>``
      (one per invocation; a CUDA graph replay counts under the op that replayed it); kernels
      launched outside any recorded op are counted per kernel.

dtype comes from ``"Input type"`` (``float`` -> fp32, ``c10::Half`` -> fp16, ``c10::BFloat16`` ->
bf16; others are skipped). ``tensor_cores`` is True for fp16/bf16 and False for fp32: the trace
does not say whether TF32 was allowed, so an fp32 GEMM run with TF32 on is mislabelled.

Device: ``--device`` if given, else the trace's ``deviceProperties`` name of the kernel's device,
resolved with :func:`opcast.hardware.get_device`; a GPU the catalog does not know is an error
asking for ``--device``.

CPU-only traces (no GPU kernels) are not replayed: their op durations are host wall time with
profiler overhead, not kernel time, and ``opcast collect bench --device cpu`` measures the local
CPU properly. Such a file is counted as skipped; a root with nothing but CPU-only traces is an
error saying so.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import zlib
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opcast.collect.replay.common import MalformedFile, ReplayResult
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.ops import bus_factor

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

TIMING = "replay:kineto:kernel_sum"
NCCL_TIMING = "replay:kineto:nccl_kernel"
NO_KERNELS = "trace without GPU kernels (CPU-only profile; record with ProfilerActivity.CUDA)"
ORPHAN = "GPU kernel without a launching CPU op"
NEGATIVE_TIME = "invocation with a negative kernel duration (broken GPU timestamps in the trace)"
ZERO_TIME = "invocation whose kernels take no time (below the trace's timer resolution)"

DTYPES = {
    "float": "fp32",
    "Float": "fp32",
    "c10::Half": "fp16",
    "Half": "fp16",
    "c10::BFloat16": "bf16",
    "BFloat16": "bf16",
}
"""``Input type`` / ``record_param_comms`` dtype spellings -> opcast dtype."""
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}

GEMM_FWD = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
GEMM_BWD_NODES = ("MmBackward", "AddmmBackward", "BmmBackward", "BaddbmmBackward")
"""Autograd nodes whose two products are one gemm bwd (names without the trailing digit)."""
GEMM_BWD_CHILDREN = ("aten::mm", "aten::bmm")


@dataclass(frozen=True, slots=True)
class _Attn:
    q: int
    """Index of the query in the op's inputs (the key follows it)."""
    causal: int
    """Index of ``is_causal``."""
    mask: int | None
    """Index of an optional mask/bias tensor."""
    impl: str
    direction: str


ATTENTION = {
    # Argument positions from the ATen schemas (checked against torch in the unit tests).
    "aten::_scaled_dot_product_flash_attention": _Attn(0, 4, None, "flash", "fwd"),
    "aten::_scaled_dot_product_flash_attention_backward": _Attn(1, 11, None, "flash", "bwd"),
    "aten::_scaled_dot_product_efficient_attention": _Attn(0, 6, 3, "sdpa", "fwd"),
    "aten::_scaled_dot_product_efficient_attention_backward": _Attn(1, 11, 4, "sdpa", "bwd"),
    "aten::_scaled_dot_product_cudnn_attention": _Attn(0, 6, 3, "sdpa", "fwd"),
    "aten::_scaled_dot_product_cudnn_attention_backward": _Attn(1, 14, 8, "sdpa", "bwd"),
}
ROWWISE = {
    # name -> (op, direction, input index, index of normalized_shape / dim in Concrete Inputs)
    "aten::native_layer_norm": ("layernorm", "fwd", 0, 1),
    "aten::native_layer_norm_backward": ("layernorm", "bwd", 0, 2),
    "aten::_softmax": ("softmax", "fwd", 0, 1),
    "aten::_softmax_backward_data": ("softmax", "bwd", 0, 2),
}
MAPPED = frozenset((*GEMM_FWD, *ATTENTION, *ROWWISE))

COLLECTIVES = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
)
"""Normalised collective / kernel name fragment -> registry kind (first match wins)."""
_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(\w+Backward)\d*$")
_NCCL_KERNEL = re.compile(r"^(?:void )?nccl(?:Dev)?Kernel", re.IGNORECASE)


@dataclass(eq=False, slots=True)
class _Op:
    """A CPU-side op or annotation (``ph: X``) with its enclosing parent on the same thread."""

    name: str
    ts: float
    end: float
    args: dict[str, Any]
    parent: _Op | None = None


@dataclass(eq=False, slots=True)
class _Invocation:
    """One call of a mapped op (or an unmapped launcher) and the kernels it ran."""

    owner: _Op
    kernels: list[dict[str, Any]] = field(default_factory=list)
    children: list[_Op] = field(default_factory=list)
    """For gemm backward nodes: the distinct products (aten::mm/bmm) that launched kernels."""
    skip: str | None = None


def replay(root: Path, options: ReplayOptions) -> ReplayResult:
    """Rows of every mapped op invocation in the trace(s) under ``root``."""
    result = ReplayResult()
    files = _trace_files(root)
    if not files:
        raise OpcastError(f"no *.json or *.json.gz profiler traces under {root}")
    forced = get_device(options.device).name if options.device else None
    with_kernels = 0
    for path in files:
        rel = path.name if root.is_file() else path.relative_to(root).as_posix()
        doc = _load(path)
        if doc is None:  # a JSON file in the folder that is not a trace
            result.skipped["JSON file without traceEvents (not a profiler trace)"] += 1
            continue
        result.files += 1
        with_kernels += _replay_trace(path, rel, doc, options, forced, result)
    if result.files and not with_kernels:
        raise OpcastError(
            f"{root}: no GPU kernels in {result.files} trace(s); opcast replays GPU kernel times only, "
            "so profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and record_shapes=True"
        )
    return result


# --------------------------------------------------------------------------- reading


def _trace_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(
        p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )


def _load(path: Path) -> dict[str, Any] | None:
    """The trace document; a corrupt file raises :class:`MalformedFile`, a JSON file that is not a
    trace returns None in a folder (and raises when it is the file given)."""
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if path.name.endswith(".gz") else raw
        doc = json.loads(text)
    except OSError as err:
        raise MalformedFile(path, None, f"cannot read: {err.strerror or err}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise MalformedFile(path, None, f"not a readable gzip file ({err})") from None
    except UnicodeDecodeError:
        raise MalformedFile(path, None, "not UTF-8 text; expected a Chrome-trace JSON") from None
    except json.JSONDecodeError as err:
        raise MalformedFile(path, err.lineno, f"invalid JSON at column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise MalformedFile(path, None, "nested too deeply to be a trace; expected a Chrome-trace JSON") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise MalformedFile(path, None, "holds an integer of thousands of digits; expected a Chrome trace") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return None
    return doc


def _num(path: Path, index: int, event: dict[str, Any], key: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MalformedFile(
            path, None, f"traceEvents[{index}] ({event.get('name')!r}) has {key}={value!r}, not a number"
        )
    try:
        out = float(value)
    except ValueError:
        raise MalformedFile(
            path, None, f"traceEvents[{index}] ({event.get('name')!r}) has {key}={value!r}, not a number"
        ) from None
    if not math.isfinite(out):
        raise MalformedFile(path, None, f"traceEvents[{index}] ({event.get('name')!r}) has {key}={value!r}")
    return out


@dataclass(slots=True)
class _Trace:
    """The parts of one trace the replay needs."""

    threads: dict[Any, list[_Op]] = field(default_factory=dict)
    starts: dict[Any, list[float]] = field(default_factory=dict)
    by_ext: dict[Any, _Op] = field(default_factory=dict)
    runtime: dict[Any, tuple[Any, float]] = field(default_factory=dict)
    """correlation -> (thread, ts) of the launching runtime/driver call."""
    flow_end: dict[tuple[Any, Any, Any], Any] = field(default_factory=dict)
    flow_start: dict[Any, tuple[Any, float]] = field(default_factory=dict)
    kernels: list[dict[str, Any]] = field(default_factory=list)

    def enclosing(self, thread: Any, ts: float) -> _Op | None:
        """The innermost op on ``thread`` whose interval holds ``ts``."""
        starts = self.starts.get(thread)
        if not starts:
            return None
        i = bisect_right(starts, ts) - 1
        op = self.threads[thread][i] if i >= 0 else None
        while op is not None and op.end < ts:
            op = op.parent
        return op

    def launcher(self, kernel: dict[str, Any]) -> _Op | None:
        args = kernel.get("args") or {}
        call = self.runtime.get(args.get("correlation"))
        if call is None:
            flow = self.flow_end.get((kernel.get("pid"), kernel.get("tid"), kernel.get("ts")))
            call = self.flow_start.get(flow) if flow is not None else None
        if call is not None:
            return self.enclosing(*call)
        ext = args.get("External id")
        return self.by_ext.get(ext) if ext else None


def _parse(path: Path, events: list[Any]) -> _Trace:
    trace = _Trace()
    threads: dict[Any, list[_Op]] = defaultdict(list)
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise MalformedFile(path, None, f"traceEvents[{i}] is {type(ev).__name__}, not an event object")
        ph, cat = ev.get("ph"), ev.get("cat")
        if ph == "X" and cat in ("cpu_op", "user_annotation", "kernel", "cuda_runtime", "cuda_driver"):
            ts, dur = _num(path, i, ev, "ts"), _num(path, i, ev, "dur")
            args = ev.get("args") or {}
            if not isinstance(args, dict):
                raise MalformedFile(
                    path, None, f"traceEvents[{i}] ({ev.get('name')!r}) has args that are not an object"
                )
            thread = (ev.get("pid"), ev.get("tid"))
            if cat == "kernel":
                trace.kernels.append(ev)
            elif cat in ("cuda_runtime", "cuda_driver"):
                if args.get("correlation") is not None:
                    trace.runtime[args["correlation"]] = (thread, ts)
            else:
                op = _Op(name=str(ev.get("name", "")), ts=ts, end=ts + dur, args=args)
                threads[thread].append(op)
                if cat == "cpu_op" and args.get("External id") is not None:
                    trace.by_ext.setdefault(args["External id"], op)
        elif ph in ("s", "f") and cat == "ac2g":
            if ph == "s":
                trace.flow_start[ev.get("id")] = ((ev.get("pid"), ev.get("tid")), _num(path, i, ev, "ts"))
            else:
                trace.flow_end[(ev.get("pid"), ev.get("tid"), ev.get("ts"))] = ev.get("id")
    for thread, ops in threads.items():
        ops.sort(key=lambda o: (o.ts, -(o.end - o.ts)))
        stack: list[_Op] = []
        for op in ops:
            while stack and stack[-1].end <= op.ts:
                stack.pop()
            op.parent = stack[-1] if stack else None
            stack.append(op)
        trace.threads[thread] = ops
        trace.starts[thread] = [o.ts for o in ops]
    return trace


# --------------------------------------------------------------------------- attribution


def _node_name(op: _Op) -> str | None:
    match = _NODE.match(op.name)
    return match.group(1) if match else None


def _owner(launcher: _Op) -> tuple[_Op, _Op | None, str | None]:
    """(the op a kernel's time belongs to, the gemm product under a backward node, skip reason)."""
    op: _Op | None = launcher
    while op is not None and op.name not in MAPPED:
        op = op.parent
    if op is None:
        return launcher, None, f"unmapped {launcher.name}"
    if op.name not in GEMM_BWD_CHILDREN:  # addmm/baddbmm, attention, norms: the name gives the direction
        return op, None, None
    node = op.parent
    while node is not None and _node_name(node) is None:
        node = node.parent
    if node is None:
        return op, None, None
    name = _node_name(node)
    if name in GEMM_BWD_NODES:
        return node, op, None
    return op, None, f"{op.name} inside {name} (a backward product opcast cannot attribute)"


def _replay_trace(
    path: Path, rel: str, doc: dict[str, Any], options: ReplayOptions, forced: str | None, result: ReplayResult
) -> int:
    """Add one trace's rows to ``result``; returns 1 if it had GPU kernels, else 0."""
    trace = _parse(path, doc["traceEvents"])
    if not trace.kernels:
        result.skipped[NO_KERNELS] += 1
        return 0
    devices = _devices(path, doc, forced)
    invocations: dict[_Op, _Invocation] = {}
    comms: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    comm_launcher: dict[Any, _Op | None] = {}
    for kernel in trace.kernels:
        launcher = trace.launcher(kernel)
        if _NCCL_KERNEL.match(str(kernel.get("name", ""))):
            key = launcher if launcher is not None else id(kernel)
            comms[key].append(kernel)
            comm_launcher[key] = launcher
            continue
        if launcher is None:
            result.skipped[ORPHAN] += 1
            continue
        owner, child, skip = _owner(launcher)
        inv = invocations.setdefault(owner, _Invocation(owner=owner, skip=skip))
        inv.kernels.append(kernel)
        if child is not None and child not in inv.children:
            inv.children.append(child)
    groups: dict[tuple, _Group] = {}
    for inv in invocations.values():
        mapped = inv.skip or _map(inv)
        if isinstance(mapped, str):
            result.skipped[mapped] += 1
            continue
        bad = _bad_time(inv.kernels)
        if bad:
            result.skipped[bad] += 1
            continue
        op, params, dtype, direction = mapped
        _add(groups, devices(inv.kernels[0]), op, params, dtype, direction, dtype != "fp32", inv.kernels, TIMING)
    for key, kernels in comms.items():
        mapped_comm = _map_comm(kernels, comm_launcher[key], options)
        if isinstance(mapped_comm, str):
            result.skipped[mapped_comm] += 1
            continue
        bad = _bad_time(kernels)
        if bad:
            result.skipped[bad] += 1
            continue
        op, params, dtype = mapped_comm
        _add(groups, devices(kernels[0]), op, params, dtype, "fwd", None, kernels, NCCL_TIMING)
    for group in groups.values():
        result.rows.append(group.row(rel))
    return 1


def _devices(path: Path, doc: dict[str, Any], forced: str | None) -> Callable[[dict[str, Any]], str]:
    """kernel -> catalog device name (``--device``, else the trace's deviceProperties)."""
    if forced is not None:
        return lambda kernel: forced
    props = doc.get("deviceProperties") or []
    names = {p.get("id"): p.get("name") for p in props if isinstance(p, dict)} if isinstance(props, list) else {}
    resolved: dict[Any, str] = {}

    def device(kernel: dict[str, Any]) -> str:
        index = (kernel.get("args") or {}).get("device", kernel.get("pid"))
        if index not in resolved:
            name = names.get(index) or (next(iter(names.values())) if len(set(names.values())) == 1 else None)
            if not name:
                raise MalformedFile(
                    path, None, f"the trace names no GPU for device {index} (no deviceProperties); pass --device"
                )
            try:
                resolved[index] = get_device(str(name)).name
            except OpcastError:
                raise MalformedFile(
                    path,
                    None,
                    f"GPU {name!r} from deviceProperties is not in the hardware catalog; "
                    "pass --device with its catalog name (opcast hardware list)",
                ) from None
        return resolved[index]

    return device


# --------------------------------------------------------------------------- mapping

Mapped = tuple[str, dict[str, Any], str, str]


def _dims(op: _Op) -> list[Any] | None:
    dims = op.args.get("Input Dims")
    return dims if isinstance(dims, list) else None


def _dtype(op: _Op, index: int) -> str | None:
    types = op.args.get("Input type")
    if isinstance(types, list) and index < len(types):
        return DTYPES.get(str(types[index]))
    return None


def _concrete(op: _Op, index: int) -> str | None:
    values = op.args.get("Concrete Inputs")
    if isinstance(values, list) and index < len(values) and str(values[index]) != "":
        return str(values[index])
    return None


def _shape(dims: list[Any], index: int, rank: int | None = None) -> list[int] | None:
    if index >= len(dims) or not isinstance(dims[index], list):
        return None
    shape = dims[index]
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return None
    if rank is not None and len(shape) != rank:
        return None
    return shape


def _type_reason(op: _Op, index: int) -> str:
    types = op.args.get("Input type")
    found = types[index] if isinstance(types, list) and index < len(types) else None
    return f"{op.name}: dtype {found!r} (opcast tracks float, c10::Half, c10::BFloat16)"


def _map(inv: _Invocation) -> Mapped | str:
    op = inv.owner
    if op.name in GEMM_FWD:
        return _map_gemm(op)
    if op.name in ATTENTION:
        return _map_attention(op, ATTENTION[op.name])
    if op.name in ROWWISE:
        return _map_rowwise(op, *ROWWISE[op.name])
    return _map_gemm_bwd(op, inv.children)


def _map_gemm(op: _Op) -> Mapped | str:
    dims = _dims(op)
    if dims is None:
        return f"{op.name}: no Input Dims (record with record_shapes=True)"
    first = 1 if op.name in ("aten::addmm", "aten::baddbmm") else 0
    rank = 3 if op.name in ("aten::bmm", "aten::baddbmm") else 2
    a, b = _shape(dims, first, rank), _shape(dims, first + 1, rank)
    if a is None or b is None or a[-1] != b[-2] or (rank == 3 and a[0] != b[0]):
        return f"{op.name}: operands {dims[first : first + 2]} are not [..,m,k] x [..,k,n]"
    dtype = _dtype(op, first)
    if dtype is None:
        return _type_reason(op, first)
    batch = a[0] if rank == 3 else 1
    return "gemm", {"b": batch, "m": a[-2], "n": b[-1], "k": a[-1]}, dtype, "fwd"


def _map_gemm_bwd(node: _Op, children: list[_Op]) -> Mapped | str:
    name = _node_name(node) or node.name
    if len(children) != 2:
        if len(children) == 1:
            return f"{name}: one product (one input needed no gradient), not a full gemm backward"
        return f"{name}: {len(children)} products, expected 2"
    batched = name in ("BmmBackward", "BaddbmmBackward")
    rank = 3 if batched else 2
    dims = _dims(node)
    grad = _shape(dims, 0, rank) if dims is not None else None
    if grad is None:
        return f"{name}: incoming gradient shape unknown (no Input Dims on the node)"
    m, n = grad[-2], grad[-1]
    ks = set()
    for child in children:
        cd = _dims(child)
        a = _shape(cd, 0, rank) if cd is not None else None
        b = _shape(cd, 1, rank) if cd is not None else None
        if a is None or b is None or a[-1] != b[-2] or (batched and not a[0] == b[0] == grad[0]):
            return f"{name}: product {cd} does not fit gradient {grad}"
        rest = Counter((a[-2], a[-1], b[-1]))
        rest.subtract((m, n))
        if any(v < 0 for v in rest.values()) or sum(rest.values()) != 1:
            return f"{name}: product {cd} does not fit gradient {grad}"
        ks.add(next(k for k, v in rest.items() if v == 1))
    if len(ks) != 1:
        return f"{name}: products disagree on the reduction dimension"
    dtype = _dtype(children[0], 0)
    if dtype is None:
        return _type_reason(children[0], 0)
    return "gemm", {"b": grad[0] if batched else 1, "m": m, "n": n, "k": ks.pop()}, dtype, "bwd"


def _map_attention(op: _Op, spec: _Attn) -> Mapped | str:
    dims = _dims(op)
    if dims is None:
        return f"{op.name}: no Input Dims (record with record_shapes=True)"
    q, k = _shape(dims, spec.q, 4), _shape(dims, spec.q + 1, 4)
    if q is None or k is None or q[0] != k[0] or q[3] != k[3]:
        return f"{op.name}: q/k {dims[spec.q : spec.q + 2]} are not [b,h,s,d] / [b,kvh,skv,d]"
    if spec.mask is not None and _shape(dims, spec.mask):
        return f"{op.name}: explicit attention mask/bias (opcast models causal or no mask)"
    causal = _concrete(op, spec.causal)
    if causal not in ("True", "False"):
        return f"{op.name}: is_causal unknown (trace has no Concrete Inputs; torch >= 2.1 records them)"
    dtype = _dtype(op, spec.q)
    if dtype is None:
        return _type_reason(op, spec.q)
    params = {
        "batch": q[0],
        "heads": q[1],
        "kv_heads": k[1],
        "seq_q": q[2],
        "seq_kv": k[2],
        "head_dim": q[3],
        "causal": causal == "True",
        "impl": spec.impl,
    }
    return "attention", params, dtype, spec.direction


def _ints(text: str | None) -> list[int] | None:
    if text is None:
        return None
    values = re.findall(r"-?\d+", text)
    return [int(v) for v in values] if values else None


def _map_rowwise(op: _Op, kind: str, direction: str, index: int, arg: int) -> Mapped | str:
    dims = _dims(op)
    shape = _shape(dims, index) if dims is not None else None
    if not shape:
        return f"{op.name}: no input shape (record with record_shapes=True)"
    if kind == "layernorm":
        normalized = _ints(_concrete(op, arg))
        width = len(normalized) if normalized else 1
        if width > len(shape):
            return f"{op.name}: normalized_shape {normalized} longer than input {shape}"
    else:
        dim = _ints(_concrete(op, arg))
        if dim is not None and dim[0] not in (-1, len(shape) - 1):
            return f"{op.name}: softmax over dim {dim[0]} of {shape}, not the last"
        width = 1
    dtype = _dtype(op, index)
    if dtype is None:
        return _type_reason(op, index)
    # aten::native_layer_norm and aten::_softmax are torch's native kernels: the registry's default impl, fused
    return kind, {"rows": math.prod(shape[:-width]), "cols": math.prod(shape[-width:])}, dtype, direction


def _comm_info(kernels: list[dict[str, Any]], launcher: _Op | None) -> dict[str, Any]:
    """The record_param_comms metadata: on the kernel (recent kineto), the launching op or its
    ancestors, or a record_param_comms child of the enclosing c10d op."""
    for kernel in kernels:
        args = kernel.get("args") or {}
        if "In msg nelems" in args or "Collective name" in args:
            return args
    op = launcher
    while op is not None:
        if "In msg nelems" in op.args:
            return op.args
        op = op.parent
    return {}


def _map_comm(
    kernels: list[dict[str, Any]], launcher: _Op | None, options: ReplayOptions
) -> tuple[str, dict[str, Any], str] | str:
    info = _comm_info(kernels, launcher)
    name = str(kernels[0].get("name", ""))
    label = re.sub(r"[_\-\s]", "", str(info.get("Collective name") or "")).lower()
    kernel_label = re.sub(r"[_\-\s]", "", name).lower()
    kind = None
    for fragment, registry_kind in COLLECTIVES:
        if (label and fragment in label) or (not label and fragment in kernel_label):
            kind = registry_kind
            break
    if kind is None:
        what = info.get("Collective name") or name.split("(")[0]
        return f"collective {what} (send/recv, barrier and others are not replayed)"
    dtype = DTYPES.get(str(info.get("dtype"))) if info.get("dtype") is not None else _kernel_dtype(kernel_label)
    if dtype is None:
        return f"{kind}: dtype {info.get('dtype')!r} unknown (opcast tracks fp32, fp16, bf16)"
    sizes = [info.get("In msg nelems"), info.get("Out msg nelems")]
    nelems = [int(v) for v in sizes if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not nelems:
        return f"{kind}: message size unknown (no record_param_comms 'In msg nelems')"
    world = info.get("Group size") or options.world_size
    if not world:
        return f"{kind}: world size unknown (no 'Group size'; pass --world-size)"
    world = int(world)
    nodes, gpn = options.nodes, options.gpus_per_node
    if nodes is None and gpn is None:
        if world > 8:
            return f"{kind}: {world} ranks and the node count unknown; pass --nodes or --gpus-per-node"
        nodes, gpn = 1, world  # assumed: up to 8 ranks share one node (see the module doc)
    elif nodes is None:
        nodes = world // gpn if gpn and world % gpn == 0 else 0
    elif gpn is None:
        gpn = world // nodes if nodes and world % nodes == 0 else 0
    if not nodes or not gpn:
        return f"{kind}: world size {world} does not split into --nodes/--gpus-per-node"
    params = {"bytes": max(nelems) * DTYPE_BYTES[dtype], "world_size": world, "nodes": nodes, "gpus_per_node": gpn}
    return kind, params, dtype


def _kernel_dtype(kernel_label: str) -> str | None:
    for token, dtype in (
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("f16", "fp16"),
        ("half", "fp16"),
        ("f32", "fp32"),
        ("float", "fp32"),
    ):
        if token in kernel_label:
            return dtype
    return None


# --------------------------------------------------------------------------- aggregation


@dataclass(slots=True)
class _Group:
    """Invocations of one (device, op, shape, dtype, direction) in one trace."""

    device: str
    op: str
    params: dict[str, Any]
    dtype: str
    direction: str
    tensor_cores: bool | None
    timing: str
    kernel: dict[str, Any]
    times_s: list[float] = field(default_factory=list)

    def row(self, source_file: str) -> dict[str, Any]:
        times = sorted(self.times_s)
        median = statistics.median(times)
        args = self.kernel.get("args") or {}
        row: dict[str, Any] = {
            "device": self.device,
            "op": self.op,
            **self.params,
            "dtype": self.dtype,
            "direction": self.direction,
            "tensor_cores": self.tensor_cores,
            "time_s_median": median,
            "n_reps": len(times),
            "source_file": source_file,
            "kernel_name": str(self.kernel.get("name", "")),
            "timing_method": self.timing,
            "grid": _launch(args.get("grid")),
            "block": _launch(args.get("block")),
        }
        if len(times) >= 3:
            cuts = statistics.quantiles(times, n=10, method="inclusive")
            row["time_s_p20"], row["time_s_p80"] = cuts[1], cuts[7]
        if self.timing == NCCL_TIMING:
            algbw = self.params["bytes"] / median / 1e9
            row["algbw_gbps"] = algbw
            row["busbw_gbps"] = algbw * bus_factor(self.op, self.params["world_size"])
        return row


def _launch(value: Any) -> str | None:
    if isinstance(value, list) and value:
        return ",".join(str(v) for v in value)
    return None


def _bad_time(kernels: Iterable[dict[str, Any]]) -> str | None:
    """Why an invocation's kernel time cannot be a measurement (a negative kernel duration, from
    broken GPU timestamps, or no time at all), or None."""
    durations = [float(k["dur"]) for k in kernels]
    if any(d < 0 for d in durations):
        return NEGATIVE_TIME
    if sum(durations) <= 0:
        return ZERO_TIME
    return None


def _add(
    groups: dict[tuple, _Group],
    device: str,
    op: str,
    params: dict[str, Any],
    dtype: str,
    direction: str,
    tensor_cores: bool | None,
    kernels: Iterable[dict[str, Any]],
    timing: str,
) -> None:
    kernels = list(kernels)
    seconds = sum(float(k["dur"]) for k in kernels) / 1e6
    key = (device, op, tuple(sorted(params.items())), dtype, direction, tensor_cores)
    main = max(kernels, key=lambda k: float(k["dur"]))
    group = groups.setdefault(
        key,
        _Group(
            device=device,
            op=op,
            params=params,
            dtype=dtype,
            direction=direction,
            tensor_cores=tensor_cores,
            timing=timing,
            kernel=main,
        ),
    )
    group.times_s.append(seconds)
