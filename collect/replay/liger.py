"""Liger-Kernel (linkedin/Liger-Kernel, BSD-2-Clause): the published benchmark measurements of its
Triton kernels against the PyTorch / Hugging Face implementations they replace.

``ROOT`` is a Liger-Kernel checkout (``benchmark/data/all_benchmark_data.csv`` is read) or that CSV
itself. One row per (kernel, provider, mode, metric, x, GPU): ``kernel_name``, ``kernel_provider``,
``kernel_operation_mode`` (forward / backward / full), ``metric_name`` (speed / memory),
``metric_unit``, ``x_name``, ``x_value``, ``y_value_50`` / ``y_value_20`` / ``y_value_80`` (the
median and the 20th / 80th percentiles of ``triton.testing.do_bench`` with
``quantiles=[0.5, 0.2, 0.8]``, benchmark/scripts/utils.py), ``extra_benchmark_config_str`` (JSON:
the rest of the shape and the dtype), ``gpu_name`` (``torch.cuda.get_device_name()``, mapped to
the catalog through its aliases; a GPU the catalog lacks is skipped with a counted reason) and
``liger_version``.

Speed rows converted (benchmark/scripts/benchmark_<kernel>.py of the version that wrote them):

============= ========================== ===================================================
kernel        opcast op, shape           providers -> impl
============= ========================== ===================================================
rms_norm      rmsnorm rows=M, cols=H     liger -> liger (one-pass Triton ``LigerRMSNorm``);
              (x ``H``, config ``M``)    huggingface -> unfused (``LlamaRMSNorm``: pow, mean,
                                         rsqrt, multiplies as torch ops)
layer_norm    layernorm rows=M, cols=N   liger -> liger; huggingface / torch -> native
              (x ``N``, config ``M``)    (``torch.nn.LayerNorm``)
softmax       softmax rows=M, cols=N     liger -> liger; torch -> native (``nn.Softmax(-1)``)
megatron_    rmsnorm rows=S*B, cols=H    forward only: liger -> liger (``LigerMegatronRMSNorm``);
rms_norm      (x ``H``, config ``S``,    torch / megatron -> native (``nn.RMSNorm``; Megatron's
              ``B``; bf16)               ``WrappedTorchNorm`` returns one: the duplicate is
                                         dropped). Its backward times the forward too: skipped
cross_entropy cross_entropy tokens=B*T,  huggingface / torch -> native (``nn.CrossEntropyLoss``:
              vocab=V (x ``V``, config   log_softmax + nll_loss); liger skipped: its forward
              ``B``, ``T``)              kernel also computes the gradient in place (the
                                         backward only scales it), so neither number is the
                                         registry's forward or backward
============= ========================== ===================================================

The newer scripts' token-length sweeps (x ``T`` or ``BT``: rows / tokens = x, with ``hidden_size``
or ``vocab_size`` in the config) are read the same way; a model-config sweep (x a model name)
is skipped with a counted reason. dtype: the config's ``dtype`` (``torch.bfloat16`` -> bf16,
``torch.float16`` -> fp16, ``torch.float32`` -> fp32), fp32 where the config has none (the
cross-entropy scripts draw the logits with ``torch.randn``'s default dtype). Modes: ``forward`` ->
fwd, ``backward`` -> bwd; ``full`` (forward and backward in one number) and any other mode are
skipped with counted reasons, as are memory rows, the other kernels (``fused_add_rms_norm``,
``megatron_cross_entropy``, ... : no registry op of their own) and unknown providers.

``time_s_median`` = y_value_50 ms / 1e3, ``time_s_p20`` / ``time_s_p80`` likewise;
``n_reps`` null (do_bench repeats for a time budget, not a count); ``timing_method``
``replay:liger:do_bench``; ``kernel_name`` ``"liger <version>: <kernel>/<provider>"``;
``tensor_cores`` False (row-wise kernels). ``ReplayOptions`` is not used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from opcast.collect.replay.common import MalformedFile, ReplayResult, number, read_csv
from opcast.errors import OpcastError
from opcast.hardware import get_device

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

CSV: Final = "benchmark/data/all_benchmark_data.csv"
REQUIRED: Final = (
    "kernel_name",
    "kernel_provider",
    "kernel_operation_mode",
    "metric_name",
    "metric_unit",
    "x_name",
    "x_value",
    "y_value_50",
    "y_value_20",
    "y_value_80",
    "extra_benchmark_config_str",
    "gpu_name",
    "liger_version",
)
TIMING_METHOD: Final = "replay:liger:do_bench"
DIRECTIONS: Final = {"forward": "fwd", "backward": "bwd"}
UNITS_S: Final = {"ms": 1e-3, "us": 1e-6, "s": 1.0}
DTYPES: Final = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}

FULL: Final = "liger full mode: forward and backward timed as one number"
MEMORY: Final = "liger memory rows (not a time)"
MODEL_SWEEP: Final = "liger model-config sweep: the shape is in the script's model registry, not the row"
CE_LIGER: Final = (
    "liger cross_entropy: its forward kernel also computes the gradient (fwd+bwd work in the forward number)"
)

MEGATRON_BWD: Final = "liger megatron_rms_norm backward: timed with its forward and a sum (fwd+bwd in one number)"
DTYPE_OF: Final = {"megatron_rms_norm": "torch.bfloat16"}
"""The dtype of kernels whose scripts fix it in the code rather than the config."""

IMPLS: Final[dict[str, dict[str, str]]] = {
    "rms_norm": {"liger": "liger", "huggingface": "unfused"},
    "layer_norm": {"liger": "liger", "huggingface": "native", "torch": "native"},
    "softmax": {"liger": "liger", "torch": "native"},
    "megatron_rms_norm": {"liger": "liger", "torch": "native", "megatron": "native"},
    "cross_entropy": {"huggingface": "native", "torch": "native"},
}
"""Liger kernel -> provider -> registry ``impl`` (opcast.ops.KERNEL_IMPLS). Liger's own Triton kernels are
``liger``, an implementation of their own: not ``fused``, which names Apex / Transformer Engine / Megatron
CUDA kernels (Liger 0.2.1's RMSNorm backward runs at 7-31 % of A100's bandwidth, those at 60-90 %)."""

_ROWWISE: Final = {"rms_norm": "rmsnorm", "layer_norm": "layernorm", "softmax": "softmax"}


def _rowwise(kernel: str) -> Callable[[str, int, Mapping[str, Any]], tuple[str, dict[str, Any]]]:
    def shape(x_name: str, x: int, config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        if x_name in ("T", "BT"):  # token-length sweep: x rows of config hidden_size
            return _ROWWISE[kernel], {"rows": x, "cols": int(config["hidden_size"])}
        return _ROWWISE[kernel], {"rows": int(config["M"]), "cols": x}

    return shape


def _cross_entropy(x_name: str, x: int, config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if x_name in ("T", "BT"):
        return "cross_entropy", {"tokens": x, "vocab": int(config["vocab_size"])}
    return "cross_entropy", {"tokens": int(config["B"]) * int(config["T"]), "vocab": x}


def _megatron_rms_norm(x_name: str, x: int, config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return "rmsnorm", {"rows": int(config["S"]) * int(config["B"]), "cols": x}


SHAPES: Final[dict[str, Callable[[str, int, Mapping[str, Any]], tuple[str, dict[str, Any]]]]] = {
    "rms_norm": _rowwise("rms_norm"),
    "megatron_rms_norm": _megatron_rms_norm,
    "layer_norm": _rowwise("layer_norm"),
    "softmax": _rowwise("softmax"),
    "cross_entropy": _cross_entropy,
}
"""Liger kernel -> (x_name, x, config) -> (opcast op, params without impl)."""


def csv_path(root: Path) -> Path:
    """The benchmark CSV of ``root`` (a checkout, or the CSV itself)."""
    if root.is_file():
        return root
    path = root / CSV
    if not path.is_file():
        raise OpcastError(f"{root} has no {CSV}; give a Liger-Kernel checkout or its all_benchmark_data.csv")
    return path


def replay(root: Path, options: ReplayOptions | None = None) -> ReplayResult:
    """Rows of the benchmark CSV of ``root`` (see the module docstring)."""
    path = csv_path(root)
    source_file = CSV if path != root else path.name
    result = ReplayResult(files=1)
    devices: dict[str, str | None] = {}
    for line, row in read_csv(path, required=REQUIRED):
        reason = _convert(path, line, row, source_file, devices, result)
        if reason is not None:
            result.skipped[reason] += 1
    return result


def _convert(
    path: Path,
    line: int,
    row: Mapping[str, str],
    source_file: str,
    devices: dict[str, str | None],
    result: ReplayResult,
) -> str | None:
    """Append ``row`` to ``result.rows``, or return the reason it is skipped."""
    kernel, provider, mode = row["kernel_name"], row["kernel_provider"], row["kernel_operation_mode"]
    if row["metric_name"] != "speed":
        return MEMORY if row["metric_name"] == "memory" else f"liger metric {row['metric_name']!r} (not a time)"
    if kernel not in SHAPES:
        return f"liger {kernel}: no registry op of its own"
    if mode == "full":
        return FULL
    if mode not in DIRECTIONS:
        return f"liger {mode} mode (only forward and backward are the registry's directions)"
    if kernel == "cross_entropy" and provider == "liger":
        return CE_LIGER
    if kernel == "megatron_rms_norm" and mode == "backward":
        return MEGATRON_BWD
    impl = IMPLS[kernel].get(provider)
    if impl is None:
        return f"liger {kernel} provider {provider!r}: implementation not known"
    unit = UNITS_S.get(row["metric_unit"])
    if unit is None:
        return f"liger speed in unit {row['metric_unit']!r}"
    name = row["gpu_name"]
    if name not in devices:
        try:
            devices[name] = get_device(name).name
        except OpcastError:
            devices[name] = None
    device = devices[name]
    if device is None:
        return f"liger GPU {name!r} not in the catalog"
    try:
        x_float = float(row["x_value"])
    except ValueError:
        return MODEL_SWEEP
    if not (math.isfinite(x_float) and x_float == int(x_float) and x_float > 0):
        raise MalformedFile(path, line, f"x_value {row['x_value']!r} is not a positive whole number")
    x = int(x_float)
    config = _config(path, line, row["extra_benchmark_config_str"])
    dtype_name = config.get("dtype", DTYPE_OF.get(kernel, "torch.float32"))
    dtype = DTYPES.get(str(dtype_name))
    if dtype is None:
        return f"liger dtype {dtype_name!r}: no opcast dtype"
    try:
        op, params = SHAPES[kernel](row["x_name"], x, config)
    except (KeyError, TypeError, ValueError):
        raise MalformedFile(
            path, line, f"{kernel} with x_name {row['x_name']!r}: config lacks the rest of the shape ({config})"
        ) from None
    median = number(path, line, row, "y_value_50")
    if not (math.isfinite(median) and median > 0):
        return "liger speed not a positive number"
    result.rows.append(
        {
            "op": op,
            **params,
            "impl": impl,
            "dtype": dtype,
            "direction": DIRECTIONS[mode],
            "device": device,
            "tensor_cores": False,
            "time_s_median": median * unit,
            "time_s_p20": _optional(path, line, row, "y_value_20", unit),
            "time_s_p80": _optional(path, line, row, "y_value_80", unit),
            "n_reps": None,
            "source_file": source_file,
            "kernel_name": f"liger {row['liger_version']}: {kernel}/{provider}",
            "timing_method": TIMING_METHOD,
        }
    )
    return None


def _config(path: Path, line: int, text: str) -> dict[str, Any]:
    try:
        config = json.loads(text) if text else {}
    except json.JSONDecodeError as err:
        raise MalformedFile(path, line, f"extra_benchmark_config_str is not JSON ({err.msg})") from None
    except RecursionError:
        raise MalformedFile(path, line, "extra_benchmark_config_str is nested too deeply to be a config") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise MalformedFile(
            path, line, "extra_benchmark_config_str holds an integer of thousands of digits, not a config"
        ) from None
    if not isinstance(config, dict):
        raise MalformedFile(path, line, "extra_benchmark_config_str is not a JSON object")
    return config


def _optional(path: Path, line: int, row: Mapping[str, str], column: str, unit: float) -> float | None:
    if not row[column]:
        return None
    value = number(path, line, row, column)
    return value * unit if math.isfinite(value) and value > 0 else None
