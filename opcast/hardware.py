"""Hardware specs: the GPU catalog (``data/hardware/<name>.json``) and the local machine.

A :class:`DeviceSpec` is one accelerator as the cost model sees it: dense peak FLOP/s per
precision, memory size and bandwidth, SM/CU layout, L2, clock and the links a GPU of a typical
node has (intra-node NVLink/xGMI/PCIe, inter-node NIC), all in SI units (FLOP/s, bytes, bytes/s,
Hz, W). Catalog files are strict JSON (every key required but ``notes``, ``peak_fp4_flops`` and
``host_link_bw_bytes_per_s``, no unknown keys) checked by :func:`spec_from_dict`; their numbers come from the
vendors' datasheets, cited in ``source``
with the reasoning in ``notes``. Conventions (also in every file's notes): peaks are *dense*
(datasheet 2:4-sparsity figures halved), link bandwidths are per GPU and *one direction*
(bidirectional figures halved), ``mem_bytes`` reads the marketed GB as GiB.

:func:`get_device` resolves a name, any alias (``torch.cuda.get_device_name()`` spellings,
NeuSight config stems, estimate-train-time and vidur names), a user JSON file, or a hypothetical
GPU derived from either, ``NAME[field=xK,field=VALUE]`` (:func:`derive_device`, the what-if
``--set`` of the CLI). The local machine (``cpu``, ``cuda``, ``cuda:N``) is measured by
:func:`opcast.collect.local_device.describe_local`: measuring this machine is collect's job, and
:func:`get_device` is the one place the core reaches it (a deferred import, so that resolving a
catalog name never loads collect).
"""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal, get_args

from opcast.atomic import not_regular
from opcast.errors import OpcastError
from opcast.ops import INT_PARAM_LIMIT
from opcast.paths import data_path, link_problem

Vendor = Literal["nvidia", "amd", "intel", "cpu"]
PeakDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "fp4"]
PEAK_DTYPES: tuple[str, ...] = get_args(PeakDtype)
"""Precisions with a peak field (``peak_<dtype>_flops``) in a :class:`DeviceSpec`."""
BLOCK_SCALED_PEAK: Final[dict[str, str]] = {"fp8_block": "fp8", "nvfp4": "fp4"}
"""The peak each block-scaled kernel dtype (:data:`opcast.dtypes.BLOCK_SCALED_DTYPES`) runs at: block-scaled
fp8 on the fp8 tensor cores at the fp8 rate, nvfp4 at the fp4 one."""
MmaFamily = Literal["mma.sync", "wgmma", "tcgen05"]
MMA_FAMILIES: tuple[str, ...] = get_args(MmaFamily)
"""NVIDIA tensor-core instruction families, oldest first (:attr:`DeviceSpec.mma_family`)."""
_ARCH_MMA_FAMILY: Final[dict[str, MmaFamily]] = {
    "volta": "mma.sync",
    "turing": "mma.sync",
    "ampere": "mma.sync",
    "ada": "mma.sync",
    "hopper": "wgmma",
    "blackwell": "tcgen05",  # sm_100/103; sm_120 told apart by its rate (DeviceSpec.mma_family)
}
TCGEN05_MIN_HALF_FLOP_PER_SM_CYCLE: Final = 4096.0
"""Dense bf16/fp16 tensor FLOP per SM per boost-clock cycle from which a Blackwell part is a
tcgen05 (sm_100/103) one: those run ~7.7e3-8.0e3 (B200, B300, GB200, GB300), sm_120 ~1.0e3 (RTX
PRO 6000), Hopper ~3.8e3."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One accelerator (or the local CPU) as the cost model sees it."""

    name: str
    """Canonical name, e.g. ``A100-SXM4-80GB``; catalog files are named ``<name>.json``."""
    aliases: tuple[str, ...]
    """Other spellings (torch device names, NeuSight/vidur/estimate-train-time names); unique across the catalog."""
    vendor: Vendor
    """``nvidia``, ``amd`` or ``cpu``."""
    architecture: str
    """Micro-architecture family, e.g. ``ampere``, ``hopper``, ``cdna3``; the ISA for a CPU."""
    peak_fp32_flops: float
    """Dense FP32 on CUDA cores / AMD vector units, FLOP/s."""
    peak_tf32_flops: float | None
    """Dense tensor-core TF32 (AMD: XF32 or full-precision matrix FP32), FLOP/s; None where absent."""
    peak_fp16_flops: float | None
    """Dense tensor/matrix-core FP16 (CUDA-core rate on GPUs without tensor cores), FLOP/s; None where absent."""
    peak_bf16_flops: float | None
    """Dense tensor/matrix-core BF16, FLOP/s; None where absent."""
    peak_fp8_flops: float | None
    """Dense tensor/matrix-core FP8, FLOP/s; None where absent."""
    peak_fp4_flops: float | None = None
    """Dense tensor/matrix-core FP4 (e2m1 with block scales: NVFP4 and MXFP4 on Blackwell, MXFP4 on
    CDNA 4), FLOP/s; None where absent. Optional in a catalog file (null when not given)."""
    mem_bytes: int
    """Device memory, bytes."""
    mem_bw_bytes_per_s: float
    """Peak device-memory bandwidth, bytes/s."""
    sm_count: int
    """Streaming multiprocessors (NVIDIA), compute units (AMD) or usable cores (CPU)."""
    fp32_lanes_per_sm: int
    """FP32 lanes per SM/CU (CPU: SIMD fp32 lanes per core)."""
    l2_bytes: int
    """Last-level on-chip cache (GPU L2; CPU largest shared cache), bytes; 0 if unknown."""
    boost_clock_hz: float
    """Maximum boost clock, Hz."""
    intra_node_bw_bytes_per_s: float
    """NVLink / xGMI (PCIe if none) bandwidth per GPU, one direction, bytes/s."""
    gpus_per_node: int
    """GPUs in a typical node of this device (DGX/HGX = 8)."""
    inter_node_bw_bytes_per_s: float
    """Network (NIC) bandwidth per GPU, one direction, bytes/s."""
    tdp_w: float | None
    """Board power, W; None if unknown."""
    source: str
    """Citation: datasheet/whitepaper title and URL, or how the spec was measured."""
    notes: str = ""
    """Free text: where each number comes from, assumptions."""
    host_link_bw_bytes_per_s: float | None = None
    """GPU <-> host (CPU) memory link per GPU, one direction, bytes/s: NVLink-C2C on Grace superchips, the
    PCIe slot elsewhere; what activation offloading copies over. None (or left out of a file): unknown."""

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        problems = [p for key, value in values.items() if (p := _check_value(key, value))]
        if problems:
            label = self.name if isinstance(self.name, str) and self.name else "<unnamed>"
            raise OpcastError(f"device {label}: " + "; ".join(problems))

    def supports(self, dtype: str) -> bool:
        """Whether the device has a peak for ``dtype`` (fp32 always; others when not null), a
        block-scaled kernel dtype by its :data:`BLOCK_SCALED_PEAK`."""
        return getattr(self, f"peak_{_check_dtype(dtype)}_flops") is not None

    def supported_dtypes(self) -> tuple[str, ...]:
        """The precisions with a peak on this device, in :data:`PEAK_DTYPES` order."""
        return tuple(d for d in PEAK_DTYPES if self.supports(d))

    def peak_flops(self, dtype: str, tensor_cores: bool = True) -> float:
        """Dense peak FLOP/s of ``dtype``.

        With ``tensor_cores=True`` (matrix work that may use tensor/matrix cores): ``fp32``
        returns the TF32/matrix-FP32 peak where the device has one (NVIDIA TF32 when
        ``allow_tf32`` is on; AMD matrix FP32/XF32), else the FP32 peak; the other precisions
        return their own peak. With ``tensor_cores=False`` (CUDA-core / vector work) every
        precision returns ``peak_fp32_flops``, the only vector rate the catalog stores. A CPU
        spec ignores the flag: its measured peaks already are vector rates. An unsupported
        precision (null peak) raises :class:`OpcastError` in both modes. A block-scaled kernel
        dtype runs at its :data:`BLOCK_SCALED_PEAK`: ``fp8_block`` the fp8 peak, ``nvfp4`` the fp4 one.
        """
        name, dtype = dtype, _check_dtype(dtype)
        peak = getattr(self, f"peak_{dtype}_flops")
        if peak is None and name == "nvfp4":
            raise OpcastError(f"{self.name} has no fp4 tensor cores for nvfp4; use fp8 (or bf16) on it")
        if peak is None:
            raise OpcastError(f"{self.name} has no {name} peak; use one of {', '.join(self.supported_dtypes())}")
        if self.vendor == "cpu":
            return peak
        if not tensor_cores:
            return self.peak_fp32_flops
        if dtype == "fp32":
            return self.peak_tf32_flops if self.peak_tf32_flops is not None else self.peak_fp32_flops
        return peak

    def ridge(self, dtype: str, tensor_cores: bool = True) -> float:
        """Roofline ridge point, FLOP per byte of device memory: ``peak_flops / mem_bw``."""
        return self.peak_flops(dtype, tensor_cores) / self.mem_bw_bytes_per_s

    @property
    def ridge_point(self) -> float:
        """Ridge point (FLOP/byte) for bf16 tensor-core math, or plain fp32 without bf16."""
        return self.ridge("bf16") if self.supports("bf16") else self.ridge("fp32", tensor_cores=False)

    @property
    def mma_family(self) -> MmaFamily | None:
        """The tensor-core instruction family an NVIDIA GPU's GEMM and attention kernels are built
        on, :data:`MMA_FAMILIES`; None for a GPU without tensor cores (Pascal), AMD, Intel or a CPU.

        - ``mma.sync``: warp-level, synchronous, operands and accumulator in registers. Volta
          (sm_70), Turing (sm_75), Ampere (sm_80/86), Ada (sm_89: FP8 added) and the workstation
          and consumer Blackwell sm_120 (RTX PRO 6000, GeForce RTX 50: block-scaled FP4 added,
          no tcgen05 and no tensor memory). FlashAttention-2 and CUTLASS 2.x kernels.
        - ``wgmma``: warpgroup-level (4 warps), asynchronous, operands from shared memory. Hopper
          (sm_90a: H100, H200, GH200, H20, H800). FlashAttention-3 and CUTLASS 3.x sm90 kernels.
        - ``tcgen05``: 5th-generation, one thread issues an MMA whose accumulator lives in tensor
          memory, optionally across a CTA pair. Datacenter Blackwell (sm_100a/sm_103a: B200,
          GB200, B300, GB300).

        Sources: CUTLASS (CuTe DSL) programming guides, "Warp-Level MMA Instructions"
        (https://docs.nvidia.com/cutlass/latest/media/docs/pythonDSL/mma_docs/wmma_programming.html:
        mma.sync from SM80, FP8 on SM89, MX FP4 on SM120a), "Warpgroup MMA"
        (.../mma_docs/wgmma_programming.html: wgmma.mma_async on SM90a) and "tcgen05 MMA"
        (.../mma_docs/tcgen05_programming.html: SM100); the PTX targets of ``tcgen05.mma`` in
        libcu++ (https://nvidia.github.io/cccl/libcudacxx/ptx/instructions/tcgen05_mma.html:
        SM_100a/f, SM_103a/f only). Volta and Turing also issue ``mma.sync`` (PTX ISA, m8n8k4 on
        sm_70, m16n8k8 on sm_75).

        The catalog's ``architecture`` names Blackwell for both sm_100/103 and sm_120; they are
        told apart by the dense half-precision tensor rate per SM per clock: 4x that of Hopper on
        sm_100/103 (B200 2.25e15 / (148 SMs x 1.98 GHz) ~ 7.7e3 FLOP), the Ada rate on sm_120
        (RTX PRO 6000 467.8e12 / (188 x 2.43 GHz) ~ 1.0e3), :data:`TCGEN05_MIN_HALF_FLOP_PER_SM_CYCLE`.
        """
        if self.vendor != "nvidia":
            return None
        family = _ARCH_MMA_FAMILY.get(self.architecture.lower())
        if family != "tcgen05":
            return family
        half = self.peak_bf16_flops or self.peak_fp16_flops or 0.0
        rate = half / (self.sm_count * self.boost_clock_hz)
        return "tcgen05" if rate >= TCGEN05_MIN_HALF_FLOP_PER_SM_CYCLE else "mma.sync"


# ---------------------------------------------------------------------- validation

_Kind = Literal["name", "text", "aliases", "vendor", "flops", "pos_float", "pos_int", "bytes0"]
_RULES: dict[str, tuple[_Kind, bool]] = {  # key -> (kind, null allowed)
    "name": ("name", False),
    "aliases": ("aliases", False),
    "vendor": ("vendor", False),
    "architecture": ("name", False),
    "peak_fp32_flops": ("flops", False),
    "peak_tf32_flops": ("flops", True),
    "peak_fp16_flops": ("flops", True),
    "peak_bf16_flops": ("flops", True),
    "peak_fp8_flops": ("flops", True),
    "peak_fp4_flops": ("flops", True),
    "mem_bytes": ("pos_int", False),
    "mem_bw_bytes_per_s": ("pos_float", False),
    "sm_count": ("pos_int", False),
    "fp32_lanes_per_sm": ("pos_int", False),
    "l2_bytes": ("bytes0", False),
    "boost_clock_hz": ("pos_float", False),
    "intra_node_bw_bytes_per_s": ("pos_float", False),
    "gpus_per_node": ("pos_int", False),
    "inter_node_bw_bytes_per_s": ("pos_float", False),
    "tdp_w": ("pos_float", True),
    "source": ("name", False),
    "notes": ("text", False),
    "host_link_bw_bytes_per_s": ("pos_float", True),
}
RATE_FLOOR = 1.0
"""The least a rate, clock or power may be (1 FLOP/s, byte/s, Hz, W), far below any device: a spec of 1e-288
bytes/s (``--set mem_bw_bytes_per_s=x1e-300``) priced kernels at 1e297 s, whose sums overflowed to inf (an
'inf %' share, Infinity in --json)."""
MEM_FLOOR_BYTES = 2**20
"""The least ``mem_bytes`` may be (1 MiB), far below any device's memory: ``H100-SXM[mem_bytes=1]`` was
taken, and a prediction on it refused every arch as 'needs 2.9 GiB per GPU > H100-SXM[mem_bytes=1]'s 0 GiB'."""
_OPTIONAL = frozenset({"notes", "peak_fp4_flops", "host_link_bw_bytes_per_s"})
_NULLABLE = [k for k, (_, nullable) in _RULES.items() if nullable]


def _unit(key: str) -> str:
    """The unit of a numeric key, read from its suffix."""
    units = (("_flops", "FLOP/s"), ("_bytes_per_s", "bytes/s"), ("_bytes", "bytes"), ("_hz", "Hz"), ("_w", "W"))
    for suffix, unit in units:
        if key.endswith(suffix):
            return unit
    return "a count"


def is_number(value: Any) -> bool:
    """A JSON number a float can hold (an integer past ~1.8e308 cannot: it is not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return False
    return True


def show_number(value: Any) -> str:
    """``value`` for a message; an integer too large for a float is named, not printed in its hundreds of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_PARAM_LIMIT:
        return f"{float(value):.3g}" if is_number(value) else "an integer past 1.8e308"
    return repr(value)


def _check_value(key: str, value: Any) -> str | None:
    """The problem with ``value`` for ``key``, or None when it is valid."""
    kind, nullable = _RULES[key]
    if value is None:
        return None if nullable else f"'{key}' must not be null"
    if kind in ("name", "text"):
        if not isinstance(value, str):
            return f"'{key}' must be a string, got {value!r}"
        if kind == "name" and not value.strip():
            return f"'{key}' must not be empty"
        return None
    if kind == "vendor":
        choices = get_args(Vendor)
        return None if value in choices else f"'{key}' must be one of {', '.join(choices)}, got {value!r}"
    if kind == "aliases":
        if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
            return f"'{key}' must be a list of strings, got {value!r}"
        if any(not _normalise(a) for a in value):
            return f"'{key}' holds an empty spelling"
        dupes = sorted({a for a in value if list(value).count(a) > 1})
        return f"'{key}' repeats {', '.join(map(repr, dupes))}" if dupes else None
    if kind in ("pos_int", "bytes0"):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"'{key}' must be an integer ({_unit(key)}), got {value!r}"
        if kind == "pos_int" and value <= 0:
            return f"'{key}' must be positive, got {value}"
        if value >= INT_PARAM_LIMIT:
            return f"'{key}' is too large, got {show_number(value)}: give an integer below 2**63"
        if key == "mem_bytes" and value < MEM_FLOOR_BYTES:
            return f"'{key}' must be at least 1 MiB ({MEM_FLOOR_BYTES} bytes), got {value}: no device has less memory"
        return f"'{key}' must be >= 0 bytes, got {value}" if value < 0 else None
    if not is_number(value) or not math.isfinite(value):
        return f"'{key}' must be a number ({_unit(key)}), got {show_number(value)}"
    if value <= 0:
        return f"'{key}' must be positive, got {value!r}"
    if value < RATE_FLOOR:
        return f"'{key}' must be at least 1 {_unit(key)}, got {value:.3g}: no device is that slow"
    return None


def _check_dtype(dtype: str) -> str:
    """The peak (a :data:`PEAK_DTYPES` name) ``dtype`` runs at."""
    dtype = BLOCK_SCALED_PEAK.get(dtype, dtype)
    if dtype not in PEAK_DTYPES:
        raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join((*PEAK_DTYPES, *BLOCK_SCALED_PEAK))}")
    return dtype


def spec_from_dict(data: Any, origin: str) -> DeviceSpec:
    """A DeviceSpec from a catalog-style mapping; every problem is reported in one line naming
    ``origin`` (a file path) and the offending keys."""
    hint = f" (see {data_path('hardware', 'H100-SXM.json')} for a complete example)"
    if not isinstance(data, Mapping):
        raise OpcastError(f"{origin}: expected a JSON object with the DeviceSpec keys, got {type(data).__name__}{hint}")
    problems: list[str] = []
    unknown = [k for k in data if k not in _RULES]
    if unknown:
        problems.append(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(valid keys: {', '.join(_RULES)})"
        )
    missing = [k for k in _RULES if k not in data and k not in _OPTIONAL]
    if missing:
        problems.append(
            f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
            f"(every key is required; use null only for {', '.join(_NULLABLE)})"
        )
    problems += [p for k, v in data.items() if k in _RULES and (p := _check_value(k, v))]
    if problems:
        raise OpcastError(f"{origin}: " + "; ".join(problems) + hint)
    values = dict(data)
    values["aliases"] = tuple(values["aliases"])
    for key, (kind, _) in _RULES.items():
        if kind in ("flops", "pos_float") and values.get(key) is not None:
            values[key] = float(values[key])
    return DeviceSpec(**values)


def device_to_dict(spec: DeviceSpec) -> dict[str, Any]:
    """The JSON-serialisable mapping of ``spec``, with the same keys as the catalog files (the optional
    ``peak_fp4_flops`` and ``host_link_bw_bytes_per_s`` only where known, as the catalog files write them)."""
    out = {f.name: getattr(spec, f.name) for f in fields(spec)}
    out["aliases"] = list(spec.aliases)
    for key in ("peak_fp4_flops", *HOST_FIELDS):
        if out[key] is None:
            del out[key]
    return out


class DuplicateKey(Exception):
    """A JSON object naming one key twice (args[0]: the key)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, or :class:`DuplicateKey` for a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


MAX_JSON_BYTES = 64 * 2**20
"""The largest JSON file a user passes (a config is kilobytes): past it the reader stops, so /dev/zero or a
huge file is refused instead of read until memory runs out (--arch /dev/zero held 12 GB in 20 s)."""


def read_capped(path: Path, limit: int, what: str = "a file") -> bytes:
    """At most ``limit + 1`` bytes of ``path`` (one more than ``limit`` says the file is larger). The one
    reader of the files a user passes: a path that is neither a regular file nor a folder (a device, a pipe,
    a socket) is a one-line :class:`OpcastError` naming ``what`` to give, before it is opened, since opening
    a FIFO with no writer blocked for ever (``hardware show FIFO``, ``arch show FIFO``); a folder is left
    to the caller's ``IsADirectoryError``."""
    if not_regular(path):
        raise OpcastError(f"{path} is not a regular file (a device, pipe or socket); give the path of {what}")
    with path.open("rb") as f:
        return f.read(limit + 1)


def read_json_file(path: str | Path, what: str) -> Any:
    """The JSON document in ``path``, or a one-line :class:`OpcastError` naming the file and
    saying how to fix it: missing, a folder, unreadable, not UTF-8 (a binary file), invalid or
    too deeply nested JSON. The one reader of the JSON files a user passes (``what``: e.g. "the
    device file", "the arch config"); it only parses, it never runs anything from the file."""
    path = Path(path)
    try:
        raw = read_capped(path, MAX_JSON_BYTES, what)
    except FileNotFoundError:
        link = link_problem(path)
        raise OpcastError(f"{path}{(' ' + link) if link else ': no such file'}; give the path of {what}") from None
    except IsADirectoryError:
        raise OpcastError(f"{path} is a folder; give the path of {what} (a .json file)") from None
    except OSError as e:
        raise OpcastError(
            f"{path}: cannot read {what} ({e.strerror or e}); check the path and its permissions"
        ) from None
    if len(raw) > MAX_JSON_BYTES:
        raise OpcastError(
            f"{path}: {what} is larger than {MAX_JSON_BYTES // 2**20} MiB (not a config: a device, a stream or a "
            f"dataset?); give the path of {what}"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise OpcastError(
            f"{path}: {what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "give a JSON file saved as UTF-8"
        ) from None
    if not text.strip():
        raise OpcastError(f"{path}: {what} is empty; give a JSON object")
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise OpcastError(
            f"{path}: {what} gives the key '{e.args[0]}' more than once (JSON would keep the last silently); "
            "give each key once"
        ) from None
    except json.JSONDecodeError as e:
        raise OpcastError(
            f"{path}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix the syntax"
        ) from None
    except RecursionError:
        raise OpcastError(f"{path}: {what} is nested too deeply to be read as JSON; give a flat JSON object") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise OpcastError(
            f"{path}: {what} holds an integer of more than {sys.get_int_max_str_digits()} digits; "
            "give sizes below 2**63"
        ) from None


def load_device_file(path: str | Path) -> DeviceSpec:
    """A DeviceSpec from a catalog-style JSON file (strictly validated)."""
    return spec_from_dict(read_json_file(path, "the device file"), str(path))


# ---------------------------------------------------------------------- catalog

_VENDOR_PREFIXES = ("nvidia", "tesla", "amdinstinct", "amd", "instinct")
_LOCAL = re.compile(r"cpu|cuda(:\d+)?")


def path_exists(path: Path) -> bool:
    """``path.exists()``, False where the text cannot be a path (a name too long for the file system)."""
    try:
        return path.exists()
    except OSError:  # e.g. a name too long to be a path
        return False


def _normalise(name: str) -> str:
    """Spelling-insensitive key: lower case without spaces, underscores and hyphens."""
    return re.sub(r"[\s_\-]+", "", name.lower())


@cache
def _load_catalog() -> tuple[dict[str, DeviceSpec], dict[str, str]]:
    """(name -> spec, normalised name or alias -> name), read once from ``data/hardware``."""
    folder = data_path("hardware")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise OpcastError(f"hardware catalog {folder} holds no *.json files; reinstall opcast")
    specs: dict[str, DeviceSpec] = {}
    index: dict[str, str] = {}
    for path in files:
        spec = load_device_file(path)
        if path.stem != spec.name:
            raise OpcastError(
                f"{path}: name '{spec.name}' differs from the file name; rename the file to {spec.name}.json"
            )
        for label in (spec.name, *spec.aliases):
            owner = index.setdefault(_normalise(label), spec.name)
            if owner != spec.name:
                raise OpcastError(
                    f"{path}: alias '{label}' also names {owner} ({owner}.json); "
                    "names and aliases must be unique across the catalog"
                )
        specs[spec.name] = spec
    return specs, index


def catalog() -> dict[str, DeviceSpec]:
    """Every catalog device by canonical name (read once, then cached)."""
    return dict(_load_catalog()[0])


def get_device(name: str | Path) -> DeviceSpec:
    """A device by canonical name or alias (case-, space-, ``_``- and ``-``-insensitive; a leading
    vendor word such as ``NVIDIA`` or ``Tesla`` is optional), a catalog-style ``.json`` file, or
    the local machine (``cpu``, ``cuda``, ``cuda:N``; see
    :func:`opcast.collect.local_device.describe_local`). Any of these
    followed by ``[field=xK,field=VALUE,...]`` is the hypothetical GPU :func:`derive_device`
    makes of it, so the name of a derived device resolves back to it."""
    text = str(name).strip()
    derived = _DERIVED.fullmatch(text)
    if derived and not text.lower().endswith(".json"):
        if text.count("[") > MAX_DERIVED_GROUPS:  # each group is one recursion: thousands ended in RecursionError
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise OpcastError(
                f"GPU '{shown}' chains {text.count('[')} [...] groups; give its settings in one NAME[field=xK,...]"
            )
        said = f"GPU '{text if len(text) <= 80 else text[:77] + '...'}'"  # not --set: the user wrote a name
        settings = [parse_setting(part, said=f"{said} ({part})") for part in split_settings(derived.group(2))]
        return derive_device(get_device(derived.group(1)), settings, said=said)
    if text.lower().endswith(".json") or ("/" in text and path_exists(Path(text).expanduser())):
        path = Path(text).expanduser()
        if path_exists(path):
            return load_device_file(path)
        raise OpcastError(
            f"device file '{text}' {link_problem(path) or 'not found'}; give a catalog name or an existing JSON file"
        )
    if _LOCAL.fullmatch(text.lower()):
        # The core's one import of a stage: users name this machine (`--gpu cpu`), collect measures
        # it. Deferred, so the dependency stays collect -> core at import time.
        from opcast.collect.local_device import describe_local

        return describe_local(text.lower())
    specs, index = _load_catalog()
    key = _normalise(text)
    found = index.get(key)
    for prefix in _VENDOR_PREFIXES:
        if found is None and key.startswith(prefix):
            found = index.get(key[len(prefix) :])
    if found is None:
        close = difflib.get_close_matches(key, index, n=1, cutoff=0.75)
        guess = f" (did you mean {index[close[0]]}?)" if close else ""
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise OpcastError(
            f"unknown GPU '{shown}'{guess}: known names are {', '.join(sorted(specs))}; "
            "run `opcast hardware list` for aliases, or pass a device JSON file"
        )
    return specs[found]


def device_name_beside(name: str, folder: Path) -> str:
    """``name``, a GPU as :func:`get_device` reads it, written in a file of ``folder`` (a cluster file's
    ``gpu``): a relative device-file path is taken from that folder, as the file's author sees it, not from
    the working directory; catalog names, local devices and absolute paths stay as they are, and so do the
    settings of a derived ``NAME[field=xK,...]``."""
    text = name.strip()
    derived = _DERIVED.fullmatch(text)
    if derived and not text.lower().endswith(".json"):
        if text.count("[") > MAX_DERIVED_GROUPS:  # get_device refuses it
            return name
        return f"{device_name_beside(derived.group(1), folder)}[{derived.group(2)}]"
    path = Path(text).expanduser()
    beside = folder / path
    if path.is_absolute() or not (text.lower().endswith(".json") or ("/" in text and path_exists(beside))):
        return name
    return str(beside)


# ---------------------------------------------------------------------- what-if: derived devices

PEAKS_GROUP = "peak_flops"
"""``--set peak_flops=xK`` multiplies every non-null ``peak_<dtype>_flops`` at once."""

SETTABLE: tuple[str, ...] = tuple(
    k for k, (kind, _) in _RULES.items() if kind in ("flops", "pos_float", "pos_int", "bytes0")
)
"""Numeric DeviceSpec keys a what-if may change (``--set`` / ``--vary``), plus :data:`PEAKS_GROUP`."""

_DERIVED = re.compile(r"(.+)\[([^\[\]]*)\]")
MAX_DERIVED_GROUPS = 32
"""Most ``[...]`` groups a derived GPU name chains (``H100[a=x2][b=x2]``): a name of thousands said 'an input
is nested too deeply to read; check the file you passed', of a --gpu name that is no file."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``--set``: a field multiplied by ``factor`` or set to ``value`` (exactly one is given)."""

    field: str
    factor: float | None = None
    value: float | None = None

    @property
    def label(self) -> str:
        """Canonical text, as in a derived device's name: ``mem_bw_bytes_per_s=x2``."""
        return f"{self.field}=x{self.factor:.12g}" if self.factor is not None else f"{self.field}={self.value:.12g}"

    def fields(self) -> tuple[str, ...]:
        """The DeviceSpec keys this setting touches (the peaks group: every peak key)."""
        return tuple(f"peak_{d}_flops" for d in PEAK_DTYPES) if self.field == PEAKS_GROUP else (self.field,)


def split_settings(text: str) -> list[str]:
    """``a=x2,b=3e12`` -> ``["a=x2", "b=3e12"]`` (the bracket part of a derived name)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_setting(text: str, *, said: str | None = None) -> Setting:
    """A :class:`Setting` from ``FIELD=xFACTOR`` or ``FIELD=VALUE`` (value in the key's unit);
    one-line :class:`OpcastError` naming the field and the fix otherwise. ``said``: how the
    messages name the input (default ``--set 'TEXT'``; ``--vary`` parses its factors here too)."""
    said = said or f"--set {text!r}"
    key, sep, raw = str(text).partition("=")
    key, raw = key.strip(), raw.strip()
    example = "e.g. mem_bw_bytes_per_s=x2 (a factor) or mem_bw_bytes_per_s=8e12 (bytes/s)"
    if not sep or not key or not raw:
        raise OpcastError(f"{said}: give FIELD=xFACTOR or FIELD=VALUE, {example}")
    if key not in SETTABLE and key != PEAKS_GROUP:
        names = [*SETTABLE, PEAKS_GROUP]
        close = [n for n in names if n.startswith(key.lower())] or difflib.get_close_matches(
            key, names, n=1, cutoff=0.5
        )
        guess = f" (did you mean {close[0]}?)" if len(close) == 1 else ""
        raise OpcastError(
            f"{said}: unknown field '{key}'{guess}; settable fields: {', '.join(SETTABLE)}, {PEAKS_GROUP} (every peak)"
        )
    multiply = raw[:1] in ("x", "X", "*")
    number = raw[1:].strip() if multiply else raw
    try:
        amount = float(number)
    except ValueError:
        unit = "a factor" if multiply else f"a value in {_unit(key) if key != PEAKS_GROUP else 'FLOP/s'}"
        raise OpcastError(f"{said}: '{number}' is not a number; {key} needs {unit}, {example}") from None
    if not math.isfinite(amount) or amount <= 0:
        what = "factor" if multiply else f"value ({_unit(key) if key != PEAKS_GROUP else 'FLOP/s'})"
        raise OpcastError(f"{said}: the {what} of {key} must be a positive finite number, got {number}")
    if multiply:
        return Setting(key, factor=amount)
    if key == PEAKS_GROUP:
        raise OpcastError(
            f"{said}: {PEAKS_GROUP} is a group of every peak and takes a factor only, e.g. "
            f"{PEAKS_GROUP}=x2; set one precision absolutely with peak_<dtype>_flops=VALUE"
        )
    if _RULES[key][0] in ("pos_int", "bytes0") and amount != int(amount):
        raise OpcastError(f"{said}: {key} is a whole number ({_unit(key)}); give an integer or a factor (x...)")
    return Setting(key, value=amount)


NETWORK_FIELDS: Final = ("intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s", "gpus_per_node")
"""The fields of a device that describe the network its collectives run on, not its kernels."""
_DESCRIPTIVE_FIELDS: Final = frozenset({"name", "aliases", "source", "notes"})


MEMORY_FIELDS: Final = ("mem_bytes", "mem_bw_bytes_per_s", "tdp_w")
"""The fields in which two boards of one compute die differ (A100-SXM4 40 GB and 80 GB: capacity,
bandwidth and board power; SMs, clocks, peaks and L2 alike)."""
HOST_FIELDS: Final = ("host_link_bw_bytes_per_s",)
"""The fields of the link to the host, which no kernel runs over (a model set's stored device specs may lack them)."""
CAPACITY_FIELDS: Final = ("mem_bytes",)
"""The memory's size: it decides whether a configuration fits; no kernel feature reads it
(``opcast.train.features``) and no board choice weighs it (:func:`die_twin`)."""


def same_die(a: DeviceSpec, b: DeviceSpec, unread: Iterable[str] = ()) -> bool:
    """Whether ``a`` and ``b`` are the same compute die (every kernel-relevant field but the memory
    configuration and board power, :data:`MEMORY_FIELDS`, alike), for kernels that never read the fields
    ``unread`` (a predictor of one precision does not read the other precisions' peaks,
    ``opcast.train.features.unread_peaks``: ``H100-SXM[peak_fp8_flops=x2]`` is H100-SXM's die for a bf16 GEMM)."""
    return _alike(a, b, _DESCRIPTIVE_FIELDS | set(NETWORK_FIELDS) | set(MEMORY_FIELDS) | set(HOST_FIELDS) | set(unread))


def answers_as_trained(
    device: DeviceSpec, trained: Iterable[str], specs: Mapping[str, DeviceSpec], unread: Iterable[str] = ()
) -> bool:
    """Whether a predictor fitted on the devices named ``trained`` (their specs in ``specs``) answers for
    ``device`` as for one of them: ``device`` is one (a copy on another network included,
    :func:`kernel_twin`) or a board of one's compute die (:func:`same_die`, for a predictor that never reads
    the fields ``unread``: A100-SXM4-40GB for A100-SXM4-80GB). The one rule of a model set's training-GPU
    routing and of the in-memory fit's."""
    names, unread = tuple(trained), tuple(unread)
    return kernel_twin(device, unread) in names or any(n in specs and same_die(device, specs[n], unread) for n in names)


def other_vendor(device: DeviceSpec, vendors: Iterable[str]) -> bool:
    """Whether ``device`` is of none of ``vendors``, the vendors whose rows alone a model set's group predictors were
    fitted on (:func:`opcast.train.fit.vendor_rows`; empty: every vendor's), so the group's ``other`` predictor,
    fitted on every row, answers for it. The one rule of a model set's vendor routing and of the in-memory fit's."""
    names = tuple(vendors)
    return bool(names) and device.vendor not in names


def die_twin(
    device: DeviceSpec, trained: Iterable[str], specs: Mapping[str, DeviceSpec], unread: Iterable[str] = ()
) -> DeviceSpec | None:
    """The training device (of ``trained``, specs in ``specs``) whose compute die ``device`` is another board
    of (:func:`same_die`, for a predictor that never reads the fields ``unread``), or None: None too when
    ``device`` is a training device itself (:func:`kernel_twin`). Of several boards of the die, the one of the
    same board power (what clock a compute-bound kernel holds), then the nearest in memory bandwidth, then by
    name: A100-SXM4-80GB (400 W) for A100-SXM4-40GB, not the 250 W A100-PCIe-40GB of its bandwidth."""
    names, unread = tuple(trained), tuple(unread)
    if kernel_twin(device, unread) in names:
        return None
    boards = [specs[n] for n in names if n in specs and same_die(device, specs[n], unread)]
    if not boards:
        return None
    return min(
        boards,
        key=lambda s: (
            s.tdp_w != device.tdp_w,
            abs(math.log(s.mem_bw_bytes_per_s / device.mem_bw_bytes_per_s)),
            s.name,
        ),
    )


def _alike(a: DeviceSpec, b: DeviceSpec, skip: frozenset[str] | set[str]) -> bool:
    """Whether ``a`` and ``b`` agree in every field not in ``skip``."""
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a) if f.name not in skip)


def base_name(device: DeviceSpec) -> str:
    """The name of the GPU ``device`` was made from (``BASE`` of a derived ``BASE[field=...]``, :func:`derive_device`,
    a ``--cluster``'s ``GPU[links]``); its own name otherwise."""
    return device.name.split("[", 1)[0]


def kernel_twin(device: DeviceSpec, unread: Iterable[str] = ()) -> str:
    """The name ``device``'s kernels are known by: a catalog GPU that ``--cluster`` or ``--set``
    changed only in :data:`NETWORK_FIELDS`, :data:`HOST_FIELDS` or :data:`CAPACITY_FIELDS`
    (``H100-SXM[inter_node_bw_bytes_per_s=...]``, ``A100-SXM4-80GB[mem_bytes=x2]``) runs its
    kernels exactly as the catalog GPU does, so a learned model's training devices include it; so does one changed
    only in fields ``unread`` for the kernels that never read them (``H100-SXM[peak_fp8_flops=x2]``'s bf16 GEMMs,
    ``opcast.train.features.unread_peaks``)."""
    made_from = base_name(device)
    if made_from == device.name:
        return device.name
    try:
        base = get_device(made_from)
    except OpcastError:
        return device.name
    skip = _DESCRIPTIVE_FIELDS | set(NETWORK_FIELDS) | set(HOST_FIELDS) | set(CAPACITY_FIELDS) | set(unread)
    return base.name if _alike(device, base, skip) else device.name


def derive_device(
    base: DeviceSpec, settings: Sequence[str | Setting], *, said: str = "--set", vary: bool = False
) -> DeviceSpec:
    """A hypothetical GPU: ``base`` with each setting applied (``FIELD=xK`` multiplies,
    ``FIELD=VALUE`` sets, in the key's SI unit). Integer keys (SMs, bytes, GPUs per node) round a
    multiplied value to the nearest integer. The result is named ``BASE[setting,...]``, has no
    aliases, and says in ``source`` and ``notes`` what was changed; a field set twice, or a null
    spec (a missing precision, an unknown TDP) multiplied, is a one-line :class:`OpcastError`; ``said``
    names where the settings were given (``--set``, a derived ``GPU 'NAME[...]'``, ``--vary F=X`` with
    ``vary``: a factor only, so a null spec has no value to give instead)."""

    def given(s: Setting) -> str:
        return f"--set {s.label!r}" if said == "--set" else f"{said} ({s.label})"

    parsed = [s if isinstance(s, Setting) else parse_setting(s) for s in settings]
    if not parsed:
        return base
    touched: dict[str, str] = {}
    values = {**device_to_dict(base), "peak_fp4_flops": base.peak_fp4_flops}
    changes: list[str] = []
    for s in parsed:
        keys = s.fields()
        for key in keys:
            if key in touched:
                raise OpcastError(f"{given(s)}: {key} is already set by {touched[key]}; give each field once")
            touched[key] = s.label
        if s.factor is None:
            assert s.value is not None, "a Setting gives exactly one of factor and value"
            old = values.get(s.field)
            values[s.field] = int(s.value) if _RULES[s.field][0] in ("pos_int", "bytes0") else float(s.value)
            changes.append(f"{s.field} {_fmt(old)} -> {_fmt(values[s.field])}")
            continue
        if s.field != PEAKS_GROUP and values.get(s.field) is None:
            fix = (
                f"give an absolute value in {_unit(s.field)}, e.g. {s.field}=1e15"
                if s.field.startswith("peak_")
                else f"give an absolute value, e.g. {s.field}=700"
            )
            if vary:  # --vary scales a spec: there is no value to give instead
                raise OpcastError(f"{said}: {base.name} has no {s.field} (null) to scale; vary a spec it has")
            raise OpcastError(f"{given(s)}: {base.name} has no {s.field} (null) to multiply; {fix}")
        _refuse_overflow(given(s), s.factor, {k: values[k] for k in keys if values[k] is not None})
        for key in keys:
            old = values[key]
            if old is None:  # the peaks group skips the precisions the device lacks
                continue
            new = old * s.factor
            if _RULES[key][0] in ("pos_int", "bytes0"):
                new = max(1, int(round(new)))
            values[key] = new
            changes.append(f"{key} {_fmt(old)} -> {_fmt(new)}")
    label = ",".join(s.label for s in parsed)
    values["name"] = f"{base.name}[{label}]"
    values["aliases"] = []
    values["source"] = f"hypothetical: {base.name} with {label} (opcast what-if); base spec: {base.source}"
    values["notes"] = (
        f"Derived by opcast from {base.name}: {'; '.join(changes)}. Every other field is {base.name}'s. "
        f"Base notes: {base.notes}"
    )
    return spec_from_dict(values, f"{said} on {base.name}")


def _largest(key: str) -> float:
    """The bound of a spec value: an integer key's :data:`INT_PARAM_LIMIT`, else the largest float."""
    return float(INT_PARAM_LIMIT) if _RULES[key][0] in ("pos_int", "bytes0") else sys.float_info.max


def _refuse_overflow(given: str, factor: float, olds: Mapping[str, float]) -> None:
    """A one-line :class:`OpcastError` when ``factor`` takes a value of ``olds`` (key -> the spec it
    multiplies) to its bound (:func:`_largest`): a float past 1.8e308 became inf, refused as 'must be a
    number, got inf', and an integer key's inf failed in int() as an internal error."""
    over = [k for k, old in olds.items() if not old * factor < _largest(k)]
    if over:
        key = over[0]
        below = min(_largest(k) / old for k, old in olds.items())
        raise OpcastError(
            f"{given}: the factor {factor:g} takes {key} past its largest value ({_fmt(olds[key])} x {factor:g} >= "
            f"{_largest(key):.3g} {_unit(key)}); give a factor below {below:.3g}"
        )


def _fmt(value: Any) -> str:
    return "null" if value is None else f"{value:g}"
