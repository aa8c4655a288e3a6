"""Replay NeuSight (sitar-lab/NeuSight, ASPLOS'25, arXiv 2407.13853): FP32 kernel
microbenchmarks and measured end-to-end runs.

Layout read (upstream paths, relative to the checkout; ``root`` may also be ``scripts/asplos``
or ``scripts/asplos/data`` itself):

- ``scripts/asplos/data/dataset/{train,test}/**/*.csv`` -- one row per kernel call: ``OPName``,
  ``Latency`` (ms), ``Device``, ``Torch Version`` (``p2.1.0``), ``CUDA Version`` (``cu121``),
  ``Kernel Name``, ``Grid x..z``, ``Block x..z`` and the shape: ``B,M,N,K`` (bmm, linear) or
  ``B,H`` (pointwise, ln, softmax). Per-op files sit in ``train/collect/<op>/p<torch>/<GPU>.csv``;
  ``train/{elem,ln,softmax}.csv`` and ``test/vec.csv`` are NeuSight's merges of other files
  (``elem_merge`` etc. in ``neusight/Dataset/collect.py``), so their rows repeat rows read before
  and are skipped as repeats. ``dataset/dims/`` (header-less shape sweeps) is not read.
- ``scripts/asplos/label/<GPU>/<model>-<inf|train>-<seq>-<batch>.json`` (+ ``.csv``): end-to-end
  runs -> the runs table. The JSON holds ``num_layer`` and ``e2e_latency``, ``fw_latency``,
  ``bwall_latency`` in ms; the CSV is a one-layer torch.fx graph with per-node ``fw_latency``,
  ``bw_latency`` and ``acc_latency`` (gradient accumulation) in ms.

Shapes, from NeuSight's ``profile_kernel``: bmm is ``torch.bmm([B,M,N], [B,N,K])`` (N is the
reduction) -> gemm b=B, m=M, n=K, k=N; linear is ``nn.Linear(N, K, bias=True)`` on ``[B,M,N]``
-> gemm b=1, m=B*M, n=K, k=N (the bias is fused into the cuBLAS(Lt) GEMM epilogue: the traces
list no separate bias kernel); pointwise ops act on ``[B,H]`` -> elementwise numel=B*H, the
``u`` variants take a Python-float second operand (``*_scalar``); ``ln`` is LayerNorm(H) and
``softmax`` is ``nn.Softmax()`` (dim 1 of a 2-D input) -> rows=B, cols=H, both torch's native
kernels (impl ``native``). All forward, FP32 on
CUDA cores (TF32 off). Timing: one call between two CUDA events, 25 calls, the mean of the
fastest 5, no L2 flush.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from opcast.collect.replay.common import MalformedFile, ReplayResult, number, read_csv
from opcast.collect.timing import NEUSIGHT_CALLS, NEUSIGHT_METHOD
from opcast.errors import OpcastError

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

TIMING_METHOD: Final = f"replay:{NEUSIGHT_METHOD}"
N_REPS: Final = NEUSIGHT_CALLS
"""Calls timed per shape (the reported latency is the mean of the fastest 5): the rule
``collect bench --timing neusight`` times by (:func:`opcast.collect.timing.measure_neusight`)."""

GEMM_OPS: Final = ("bmm", "linear")
ELEMENTWISE: Final[dict[str, str]] = {
    "add": "add",
    "mul": "mul",
    "div": "div",
    "pow": "pow",
    "addu": "add_scalar",
    "mulu": "mul_scalar",
    "divu": "div_scalar",
    "powu": "pow_scalar",
    "relu": "relu",
    "gelu": "gelu",
    "tanh": "tanh",
}
"""NeuSight OPName -> opcast elementwise fn."""
ROWWISE: Final[dict[str, str]] = {"ln": "layernorm", "softmax": "softmax"}
UNSUPPORTED: Final[dict[str, str]] = {"conv": "conv: opcast has no convolution op"}

_LABEL_NAME = re.compile(r"(?P<model>.+)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)(?P<fusion>-fusion)?")
_ARCH_FIELDS: Final = (
    "n_layers",
    "hidden",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "norm",
    "gated_mlp",
    "position",
    "tied_embeddings",
    "linear_bias",
    "parallel_residual",
    "n_experts",
    "experts_top_k",
)
"""ArchSpec fields that must agree for a NeuSight model config to map to an opcast preset
(activation is left out: Hugging Face's gelu_new and the presets' gelu cost the same)."""


def replay(root: Path, options: ReplayOptions | None = None) -> ReplayResult:
    """Kernel rows and end-to-end runs of a NeuSight checkout (or its ``scripts/asplos`` or
    ``scripts/asplos/data`` folder, or one kernel CSV)."""
    del options  # NeuSight names the device in every row and folder
    root = Path(root)
    result = ReplayResult()
    if root.is_file():
        _read_kernels(root, root.name, result, _Seen())
        return result
    data, label = _layout(root)
    seen = _Seen()
    if data is not None:
        for path in _kernel_files(data / "dataset"):
            _read_kernels(path, path.relative_to(root).as_posix(), result, seen)
    if label is not None:
        configs = data / "DLmodel_configs" if data is not None else label.parent / "data" / "DLmodel_configs"
        _read_labels(root, label, configs, result)
    return result


# --------------------------------------------------------------------------- layout


def _layout(root: Path) -> tuple[Path | None, Path | None]:
    """(data folder holding ``dataset/``, label folder) under ``root``."""
    for asplos in (root / "scripts" / "asplos", root):
        if (asplos / "data" / "dataset").is_dir() or (asplos / "label").is_dir():
            data = asplos / "data" if (asplos / "data" / "dataset").is_dir() else None
            label = asplos / "label" if (asplos / "label").is_dir() else None
            return data, label
    if (root / "dataset").is_dir():  # pointed at scripts/asplos/data
        return root, (root / "label" if (root / "label").is_dir() else None)
    raise OpcastError(
        f"{root} is not a NeuSight checkout: expected scripts/asplos/data/dataset "
        "(or give scripts/asplos or scripts/asplos/data)"
    )


def _kernel_files(dataset: Path) -> list[Path]:
    """Kernel CSVs, per-op files first so that the merged files' repeats are the ones skipped."""
    if not dataset.is_dir():
        return []
    files = [p for p in dataset.rglob("*.csv") if "dims" not in p.relative_to(dataset).parts]

    def order(path: Path) -> tuple[int, str]:
        parts = path.relative_to(dataset).parts
        rank = 0 if parts[:2] == ("train", "collect") and len(parts) == 5 else 1 if parts[0] == "train" else 2
        return rank, path.relative_to(dataset).as_posix()

    return sorted(files, key=order)


# --------------------------------------------------------------------------- kernels


class _Seen:
    """Shapes already read: the source's own shape key and the opcast config it maps to."""

    def __init__(self) -> None:
        self.source: dict[tuple, str] = {}
        self.config: set[tuple] = set()


@cache
def _device(name: str) -> str | None:
    from opcast.hardware import get_device

    try:
        return get_device(name).name
    except OpcastError:
        return None


def _int(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    try:
        return int(row[column])  # the common case, fast
    except (KeyError, ValueError):
        pass
    value = number(path, line, row, column)
    if not value.is_integer():
        raise MalformedFile(path, line, f"column {column!r} is {row[column]!r}, not an integer")
    return int(value)


@cache
def _versions(torch: str, cuda: str) -> tuple[str | None, str | None]:
    """(torch, CUDA) versions from NeuSight's ``p2.1.0`` and ``cu121`` spellings."""
    match = re.fullmatch(r"cu(\d+)(\d)", cuda)
    return torch.removeprefix("p") or None, f"{match[1]}.{match[2]}" if match else None


_AXES: Final = {prefix: tuple(f"{prefix} {axis}" for axis in "xyz") for prefix in ("Grid", "Block")}


def _triple(path: Path, line: int, row: Mapping[str, str], prefix: str) -> str | None:
    columns = _AXES[prefix]
    values = [row.get(c) for c in columns]
    if not all(values):
        return None
    if not all(v.isdigit() for v in values):  # type: ignore[union-attr]
        values = [str(_int(path, line, row, c)) for c in columns]
    return ",".join(values)  # type: ignore[arg-type]  # "x,y,z", as the kineto importer writes it


def _shape(path: Path, line: int, row: Mapping[str, str], op: str) -> tuple[tuple, dict[str, Any]] | None:
    """(source shape, opcast op and params) of a row; None for an op opcast has no kind for."""
    if op in GEMM_OPS:
        b, m, n, k = (_int(path, line, row, c) for c in "BMNK")
        params = dict(b=b, m=m, n=k, k=n) if op == "bmm" else dict(b=1, m=b * m, n=k, k=n)
        return (b, m, n, k), dict(op="gemm", **params)
    if op in ELEMENTWISE or op in ROWWISE:
        b, h = _int(path, line, row, "B"), _int(path, line, row, "H")
        if op in ELEMENTWISE:
            return (b, h), dict(op="elementwise", numel=b * h, fn=ELEMENTWISE[op])
        return (b, h), dict(op=ROWWISE[op], rows=b, cols=h, impl="native")  # nn.LayerNorm / nn.Softmax: torch's kernels
    return None


def _read_kernels(path: Path, source_file: str, result: ReplayResult, seen: _Seen) -> None:
    result.files += 1
    folder_torch = next((p for p in path.parts if re.fullmatch(r"p\d+(\.\d+)+", p)), "")
    for line, row in read_csv(path, required=("OPName", "Latency")):
        op = row["OPName"]
        if op in UNSUPPORTED:
            result.skipped[UNSUPPORTED[op]] += 1
            continue
        shaped = _shape(path, line, row, op)
        if shaped is None:
            result.skipped[f"OPName {op!r}: no opcast op for it"] += 1
            continue
        device_name = row.get("Device") or path.stem
        device = _device(device_name)
        if device is None:
            result.skipped[f"device {device_name!r} not in the hardware catalog"] += 1
            continue
        latency_ms = number(path, line, row, "Latency")
        if not math.isfinite(latency_ms) or latency_ms <= 0:
            result.skipped["latency not a positive number"] += 1
            continue
        shape, op_params = shaped
        source_key = (device, op, shape)
        first = seen.source.get(source_key)
        if first is not None:
            where = "the same file" if first == source_file else "another file (NeuSight's merged CSVs)"
            result.skipped[f"shape measured again, already read from {where}"] += 1
            continue
        seen.source[source_key] = source_file
        config_key = (device, *sorted(op_params.items()))
        if config_key in seen.config:
            result.skipped[
                f"{op}: same opcast {op_params['op']} config as a shape already read"
                + (" (numel = B*H)" if op_params["op"] == "elementwise" else "")
            ] += 1
            continue
        seen.config.add(config_key)
        torch_version, cuda_version = _versions(row.get("Torch Version") or folder_torch, row.get("CUDA Version") or "")
        result.rows.append(
            {
                "device": device,
                **op_params,
                "dtype": "fp32",
                "direction": "fwd",
                "tensor_cores": False,
                "time_s_median": latency_ms / 1e3,
                "n_reps": N_REPS,
                "source_file": source_file,
                "kernel_name": row.get("Kernel Name") or None,
                "grid": _triple(path, line, row, "Grid"),
                "block": _triple(path, line, row, "Block"),
                "timing_method": TIMING_METHOD,
                "torch_version": torch_version,
                "cuda_version": cuda_version,
            }
        )


# --------------------------------------------------------------------------- end-to-end runs


def _read_json(path: Path) -> Any:
    """A label run's JSON; anything that is not readable JSON text is a :class:`MalformedFile`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise MalformedFile(path, err.lineno, f"not valid JSON ({err.msg})") from None
    except OSError as err:
        raise MalformedFile(path, None, f"cannot read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise MalformedFile(path, None, "not UTF-8 text (a binary file?); expected a NeuSight label JSON") from None
    except RecursionError:
        raise MalformedFile(path, None, "nested too deeply to be a NeuSight label JSON") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise MalformedFile(path, None, "holds an integer of thousands of digits, not a NeuSight label JSON") from None


def _ms(path: Path, data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MalformedFile(path, None, f"{key!r} is {value!r}, not a latency in ms")
    return value / 1e3


def _label_runs(label: Path) -> Iterator[tuple[Path, re.Match | None]]:
    for path in sorted(label.glob("*/*.json")):
        yield path, _LABEL_NAME.fullmatch(path.stem)


def _read_labels(root: Path, label: Path, configs: Path, result: ReplayResult) -> None:
    for path, name in _label_runs(label):
        if name is None:
            result.skipped["label run: file name is not <model>-<inf|train>-<seq>-<batch>.json"] += 1
            continue
        if name["fusion"]:
            result.skipped["label run: torch.compile ('-fusion') run; the runs table has no compile flag"] += 1
            continue
        device = _device(path.parent.name)
        if device is None:
            result.skipped[f"label run: device {path.parent.name!r} not in the hardware catalog"] += 1
            continue
        data = _read_json(path)
        result.files += 1
        if not isinstance(data, dict):
            raise MalformedFile(
                path, 1, "expected a JSON object with num_layer, e2e_latency, fw_latency, bwall_latency"
            )
        layers = data.get("num_layer")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 0):
            raise MalformedFile(path, None, f"'num_layer' is {layers!r}, not a layer count")
        train = name["mode"] == "train"
        ops = path.with_suffix(".csv")
        result.runs.append(
            {
                "source": "replay:neusight",
                "source_file": path.relative_to(root).as_posix(),
                "device": device,
                "model": name["model"],
                "arch": _arch(configs, name["model"]),
                "mode": name["mode"],
                "dtype": "fp32",
                "batch": int(name["batch"]),
                "seq": int(name["seq"]),
                "num_layers": layers or None,  # NeuSight writes 0 (or null) for the Switch MoE models
                "total_s": _ms(path, data, "e2e_latency"),
                "fwd_s": _ms(path, data, "fw_latency"),
                "bwd_s": _ms(path, data, "bwall_latency") if train else None,
                "ops_json": _ops_json(ops, result) if ops.is_file() else None,
            }
        )


def _ops_json(path: Path, result: ReplayResult) -> str:
    """The per-node rows of a label CSV as compact JSON: name, fx op, target, shapes, seconds."""
    result.files += 1
    ops = []
    for line, row in read_csv(path, required=("Name", "op", "fw_latency", "bw_latency")):
        entry: dict[str, Any] = {"name": row["Name"], "op": row["op"], "target": row.get("target")}
        for column in ("input_shapes", "output_shape"):
            if row.get(column):
                entry[column] = row[column]
        entry["fwd_s"] = number(path, line, row, "fw_latency") / 1e3
        entry["bwd_s"] = number(path, line, row, "bw_latency") / 1e3
        if row.get("acc_latency"):
            entry["acc_s"] = number(path, line, row, "acc_latency") / 1e3
        ops.append(entry)
    return json.dumps(ops, separators=(",", ":"))


@cache
def _presets() -> dict[str, tuple]:
    from opcast.archs import list_archs, load_arch

    return {name: tuple(getattr(load_arch(name), f) for f in _ARCH_FIELDS) for name in list_archs()}


@cache
def _arch(configs: Path, model: str) -> str | None:
    """The opcast preset whose shape equals NeuSight's DLmodel_configs/<model>.json, if any."""
    from opcast.archs import arch_from_hf_config

    path = configs / f"{model}.json"
    if not path.is_file():
        return None
    try:
        spec = arch_from_hf_config(_read_json(path), model)
    except OpcastError:  # bert, switch_transformers: not decoder-only kinds opcast models
        return None
    key = tuple(getattr(spec, f) for f in _ARCH_FIELDS)
    return next((name for name, preset in _presets().items() if preset == key), None)
