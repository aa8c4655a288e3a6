"""Hardware specs: the GPU catalog (``data/hardware/<name>.json``) and the local machine.

A :class:`DeviceSpec` is one accelerator as the cost model sees it: dense peak FLOP/s per
precision, memory size and bandwidth, SM/CU layout, L2, clock and the links a GPU of a typical
node has (intra-node NVLink/xGMI/PCIe, inter-node NIC), all in SI units (FLOP/s, bytes, bytes/s,
Hz, W). Catalog files are strict JSON (every key required but ``notes``, no unknown keys) checked
by :func:`spec_from_dict`; their numbers come from the vendors' datasheets, cited in ``source``
with the reasoning in ``notes``. Conventions (also in every file's notes): peaks are *dense*
(datasheet 2:4-sparsity figures halved), link bandwidths are per GPU and *one direction*
(bidirectional figures halved), ``mem_bytes`` reads the marketed GB as GiB.

:func:`get_device` resolves a name, any alias (``torch.cuda.get_device_name()`` spellings,
NeuSight config stems, estimate-train-time and vidur names), a user JSON file, or a hypothetical
GPU derived from either, ``NAME[field=xK,field=VALUE]`` (:func:`derive_device`, the what-if
``--set`` of the CLI);
:func:`describe_local` turns this machine's CPU (or a CUDA device torch can see) into a spec
with measured peaks, cached under ``~/.cache/opcast`` (``OPCAST_CACHE_DIR`` overrides).
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

from opcast.errors import OpcastError
from opcast.paths import data_path

Vendor = Literal["nvidia", "amd", "cpu"]
PeakDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PEAK_DTYPES: tuple[str, ...] = get_args(PeakDtype)
"""Precisions with a peak field (``peak_<dtype>_flops``) in a :class:`DeviceSpec`."""


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

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        problems = [p for key, value in values.items() if (p := _check_value(key, value))]
        if problems:
            label = self.name if isinstance(self.name, str) and self.name else "<unnamed>"
            raise OpcastError(f"device {label}: " + "; ".join(problems))

    def supports(self, dtype: str) -> bool:
        """Whether the device has a peak for ``dtype`` (fp32 always; others when not null)."""
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
        precision (null peak) raises :class:`OpcastError` in both modes.
        """
        dtype = _check_dtype(dtype)
        peak = getattr(self, f"peak_{dtype}_flops")
        if peak is None:
            raise OpcastError(f"{self.name} has no {dtype} peak; use one of {', '.join(self.supported_dtypes())}")
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
}
_OPTIONAL = frozenset({"notes"})
_NULLABLE = [k for k, (_, nullable) in _RULES.items() if nullable]


def _unit(key: str) -> str:
    """The unit of a numeric key, read from its suffix."""
    units = (("_flops", "FLOP/s"), ("_bytes_per_s", "bytes/s"), ("_bytes", "bytes"), ("_hz", "Hz"), ("_w", "W"))
    for suffix, unit in units:
        if key.endswith(suffix):
            return unit
    return "a count"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        return f"'{key}' must be >= 0 bytes, got {value}" if value < 0 else None
    if not _is_number(value) or not math.isfinite(value):
        return f"'{key}' must be a number ({_unit(key)}), got {value!r}"
    return f"'{key}' must be positive, got {value!r}" if value <= 0 else None


def _check_dtype(dtype: str) -> str:
    if dtype not in PEAK_DTYPES:
        raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(PEAK_DTYPES)}")
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
        problems.append(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                        f"(valid keys: {', '.join(_RULES)})")
    missing = [k for k in _RULES if k not in data and k not in _OPTIONAL]
    if missing:
        problems.append(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                        f"(every key is required; use null only for {', '.join(_NULLABLE)})")
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
    """The JSON-serialisable mapping of ``spec``, with the same keys as the catalog files."""
    out = {f.name: getattr(spec, f.name) for f in fields(spec)}
    out["aliases"] = list(spec.aliases)
    return out


def read_json_file(path: str | Path, what: str) -> Any:
    """The JSON document in ``path``, or a one-line :class:`OpcastError` naming the file and
    saying how to fix it: missing, a folder, unreadable, not UTF-8 (a binary file), invalid or
    too deeply nested JSON. The one reader of the JSON files a user passes (``what``: e.g. "the
    device file", "the arch config"); it only parses, it never runs anything from the file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise OpcastError(f"{path}: no such file; give the path of {what}") from None
    except IsADirectoryError:
        raise OpcastError(f"{path} is a folder; give the path of {what} (a .json file)") from None
    except OSError as e:
        raise OpcastError(f"{path}: cannot read {what} ({e.strerror or e}); check the path and its permissions") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise OpcastError(f"{path}: {what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          "give a JSON file saved as UTF-8") from None
    if not text.strip():
        raise OpcastError(f"{path}: {what} is empty; give a JSON object")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise OpcastError(f"{path}: {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          "fix the syntax") from None
    except RecursionError:
        raise OpcastError(f"{path}: {what} is nested too deeply to be read as JSON; give a flat JSON object") from None


def load_device_file(path: str | Path) -> DeviceSpec:
    """A DeviceSpec from a catalog-style JSON file (strictly validated)."""
    return spec_from_dict(read_json_file(path, "the device file"), str(path))


# ---------------------------------------------------------------------- catalog

_VENDOR_PREFIXES = ("nvidia", "tesla", "amdinstinct", "amd", "instinct")
_LOCAL = re.compile(r"cpu|cuda(:\d+)?")


def _exists(path: Path) -> bool:
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
            raise OpcastError(f"{path}: name '{spec.name}' differs from the file name; "
                              f"rename the file to {spec.name}.json")
        for label in (spec.name, *spec.aliases):
            owner = index.setdefault(_normalise(label), spec.name)
            if owner != spec.name:
                raise OpcastError(f"{path}: alias '{label}' also names {owner} ({owner}.json); "
                                  "names and aliases must be unique across the catalog")
        specs[spec.name] = spec
    return specs, index


def catalog() -> dict[str, DeviceSpec]:
    """Every catalog device by canonical name (read once, then cached)."""
    return dict(_load_catalog()[0])


def get_device(name: str | Path) -> DeviceSpec:
    """A device by canonical name or alias (case-, space-, ``_``- and ``-``-insensitive; a leading
    vendor word such as ``NVIDIA`` or ``Tesla`` is optional), a catalog-style ``.json`` file, or
    the local machine (``cpu``, ``cuda``, ``cuda:N``; see :func:`describe_local`). Any of these
    followed by ``[field=xK,field=VALUE,...]`` is the hypothetical GPU :func:`derive_device`
    makes of it, so the name of a derived device resolves back to it."""
    text = str(name).strip()
    derived = _DERIVED.fullmatch(text)
    if derived and not text.lower().endswith(".json"):
        return derive_device(get_device(derived.group(1)), split_settings(derived.group(2)))
    if text.lower().endswith(".json") or ("/" in text and _exists(Path(text).expanduser())):
        path = Path(text).expanduser()
        if _exists(path):
            return load_device_file(path)
        raise OpcastError(f"device file '{text}' not found; give a catalog name or an existing JSON file")
    if _LOCAL.fullmatch(text.lower()):
        return describe_local(text.lower())
    specs, index = _load_catalog()
    key = _normalise(text)
    found = index.get(key)
    for prefix in _VENDOR_PREFIXES:
        if found is None and key.startswith(prefix):
            found = index.get(key[len(prefix):])
    if found is None:
        close = difflib.get_close_matches(key, index, n=1, cutoff=0.75)
        guess = f" (did you mean {index[close[0]]}?)" if close else ""
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise OpcastError(f"unknown GPU '{shown}'{guess}: known names are {', '.join(sorted(specs))}; "
                          "run `opcast hardware list` for aliases, or pass a device JSON file")
    return specs[found]


# ---------------------------------------------------------------------- what-if: derived devices

PEAKS_GROUP = "peak_flops"
"""``--set peak_flops=xK`` multiplies every non-null ``peak_<dtype>_flops`` at once."""

SETTABLE: tuple[str, ...] = tuple(k for k, (kind, _) in _RULES.items() if kind in ("flops", "pos_float", "pos_int", "bytes0"))
"""Numeric DeviceSpec keys a what-if may change (``--set`` / ``--vary``), plus :data:`PEAKS_GROUP`."""

_DERIVED = re.compile(r"(.+)\[([^\[\]]*)\]")


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


def parse_setting(text: str) -> Setting:
    """A :class:`Setting` from ``FIELD=xFACTOR`` or ``FIELD=VALUE`` (value in the key's unit);
    one-line :class:`OpcastError` naming the field and the fix otherwise."""
    key, sep, raw = str(text).partition("=")
    key, raw = key.strip(), raw.strip()
    example = "e.g. mem_bw_bytes_per_s=x2 (a factor) or mem_bw_bytes_per_s=8e12 (bytes/s)"
    if not sep or not key or not raw:
        raise OpcastError(f"--set {text!r}: give FIELD=xFACTOR or FIELD=VALUE, {example}")
    if key not in SETTABLE and key != PEAKS_GROUP:
        names = [*SETTABLE, PEAKS_GROUP]
        close = [n for n in names if n.startswith(key.lower())] or difflib.get_close_matches(key, names, n=1, cutoff=0.5)
        guess = f" (did you mean {close[0]}?)" if len(close) == 1 else ""
        raise OpcastError(f"--set {text!r}: unknown field '{key}'{guess}; settable fields: "
                          f"{', '.join(SETTABLE)}, {PEAKS_GROUP} (every peak)")
    multiply = raw[:1] in ("x", "X", "*")
    number = raw[1:].strip() if multiply else raw
    try:
        amount = float(number)
    except ValueError:
        unit = "a factor" if multiply else f"a value in {_unit(key) if key != PEAKS_GROUP else 'FLOP/s'}"
        raise OpcastError(f"--set {text!r}: '{number}' is not a number; {key} needs {unit}, {example}") from None
    if not math.isfinite(amount) or amount <= 0:
        what = "factor" if multiply else f"value ({_unit(key) if key != PEAKS_GROUP else 'FLOP/s'})"
        raise OpcastError(f"--set {text!r}: the {what} of {key} must be a positive finite number, got {number}")
    if multiply:
        return Setting(key, factor=amount)
    if key == PEAKS_GROUP:
        raise OpcastError(f"--set {text!r}: {PEAKS_GROUP} is a group of every peak and takes a factor only, e.g. "
                          f"{PEAKS_GROUP}=x2; set one precision absolutely with peak_<dtype>_flops=VALUE")
    if _RULES[key][0] in ("pos_int", "bytes0") and amount != int(amount):
        raise OpcastError(f"--set {text!r}: {key} is a whole number ({_unit(key)}); give an integer or a factor (x...)")
    return Setting(key, value=amount)


def derive_device(base: DeviceSpec, settings: Sequence[str | Setting]) -> DeviceSpec:
    """A hypothetical GPU: ``base`` with each setting applied (``FIELD=xK`` multiplies,
    ``FIELD=VALUE`` sets, in the key's SI unit). Integer keys (SMs, bytes, GPUs per node) round a
    multiplied value to the nearest integer. The result is named ``BASE[setting,...]``, has no
    aliases, and says in ``source`` and ``notes`` what was changed; a field set twice, or a null
    spec (a missing precision, an unknown TDP) multiplied, is a one-line :class:`OpcastError`."""
    parsed = [s if isinstance(s, Setting) else parse_setting(s) for s in settings]
    if not parsed:
        return base
    touched: dict[str, str] = {}
    values = device_to_dict(base)
    changes: list[str] = []
    for s in parsed:
        keys = s.fields()
        for key in keys:
            if key in touched:
                raise OpcastError(f"--set {s.label!r}: {key} is already set by {touched[key]}; give each field once")
            touched[key] = s.label
        if s.factor is None:
            old = values[s.field]
            values[s.field] = int(s.value) if _RULES[s.field][0] in ("pos_int", "bytes0") else float(s.value)
            changes.append(f"{s.field} {_fmt(old)} -> {_fmt(values[s.field])}")
            continue
        if s.field != PEAKS_GROUP and values[s.field] is None:
            fix = (f"give an absolute value in {_unit(s.field)}, e.g. {s.field}=1e15" if s.field.startswith("peak_")
                   else f"give an absolute value, e.g. {s.field}=700")
            raise OpcastError(f"--set {s.label!r}: {base.name} has no {s.field} (null) to multiply; {fix}")
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
    values["notes"] = (f"Derived by opcast from {base.name}: {'; '.join(changes)}. Every other field is {base.name}'s. "
                       f"Base notes: {base.notes}")
    return spec_from_dict(values, f"--set on {base.name}")


def _fmt(value: Any) -> str:
    return "null" if value is None else f"{value:g}"


# ---------------------------------------------------------------------- local device

_CPU_MATMUL_BUDGET_S = {"fp32": 0.25, "bf16": 0.1, "fp16": 0.1}
_CPU_COPY_BUDGET_S = 0.15
_CPU_COPY_BYTES = 256 * 2**20
_PLACEHOLDER_CLOCK_HZ = 1e9
_PLACEHOLDER_LINK_BPS = 1e9


def cache_dir() -> Path:
    """Where measured local specs are cached: ``$OPCAST_CACHE_DIR`` or ``~/.cache/opcast``."""
    env = os.environ.get("OPCAST_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "opcast"


def describe_local(device: str = "cpu", *, remeasure: bool = False) -> DeviceSpec:
    """This machine's ``cpu`` or a CUDA/ROCm device (``cuda``, ``cuda:N``) as a DeviceSpec.

    A GPU whose torch name is in the catalog returns the catalog entry. Otherwise the peaks and
    memory bandwidth are measured with torch (about a second) and cached in
    ``cache_dir()/local-<hash>.json``, keyed by the device model, core count and torch
    version; ``remeasure=True`` ignores and rewrites the cache.
    """
    text = device.strip().lower()
    if text == "cpu":
        return _describe_cpu(remeasure)
    m = re.fullmatch(r"cuda(?::(\d+))?", text)
    if m:
        return _describe_cuda(int(m.group(1) or 0), remeasure)
    raise OpcastError(f"unknown local device '{device}'; use cpu, cuda or cuda:N")


def _cached(parts: tuple[str, ...], remeasure: bool, measure: Callable[[], DeviceSpec]) -> DeviceSpec:
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    path = cache_dir() / f"local-{digest}.json"
    if not remeasure and path.is_file():
        try:
            return load_device_file(path)
        except OpcastError:  # a stale or corrupt cache entry is re-measured, not reported
            pass
    spec = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(device_to_dict(spec), indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:  # the cache is best effort
        pass
    return spec


def _median_time(fn: Callable[[], object], budget_s: float, min_reps: int = 3, max_reps: int = 50) -> float:
    """Median seconds of ``fn()`` after one warm-up call, repeating until ``budget_s`` is spent."""
    fn()
    samples: list[float] = []
    stop = time.perf_counter() + budget_s
    while len(samples) < min_reps or (len(samples) < max_reps and time.perf_counter() < stop):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _cpu_matmul_flops(torch: Any, dtype: Any, budget_s: float) -> tuple[float, int] | None:
    """(median FLOP/s, n) of ``torch.mm`` on n x n matrices, n grown from 128 until one call
    takes budget/20 (at most 2048); None if this torch cannot multiply ``dtype`` on the CPU."""
    n = 128
    try:
        while True:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            torch.mm(a, b)  # first call of a shape may pay one-off kernel set-up
            t0 = time.perf_counter()
            torch.mm(a, b)
            if time.perf_counter() - t0 >= budget_s / 20 or n >= 2048:
                break
            n *= 2
        out = torch.empty(n, n, dtype=dtype)
        seconds = _median_time(lambda: torch.mm(a, b, out=out), budget_s)
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    return (2.0 * n**3 / seconds, n) if seconds > 0 else None


def _cpu_copy_bandwidth(torch: Any, nbytes: int, budget_s: float = _CPU_COPY_BUDGET_S) -> float:
    """Median bytes/s (read + written) of copying an ``nbytes`` float32 tensor."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), budget_s)
    return 2.0 * (nbytes // 4) * 4 / seconds


def _cpuinfo() -> dict[str, str]:
    """First value of each ``key : value`` line of /proc/cpuinfo (empty where absent)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return info


def _cpu_mhz_max() -> float | None:
    try:
        return float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) * 1e3
    except (OSError, ValueError):
        pass
    try:
        mhz = [float(v) for k, _, v in (ln.partition(":") for ln in Path("/proc/cpuinfo").read_text().splitlines())
               if k.strip().lower() == "cpu mhz"]
    except (OSError, ValueError):
        return None
    return max(mhz) * 1e6 if mhz and max(mhz) > 0 else None


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, re.IGNORECASE)
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


def _cpu_llc() -> tuple[int, int]:
    """(level, bytes) of the largest-level data/unified cache of cpu0; (0, 0) if unknown."""
    best = (0, 0)
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            level = int((entry / "level").read_text())
            size = _parse_size((entry / "size").read_text())
        except (OSError, ValueError):
            continue
        best = max(best, (level, size))
    return best


def _slug(model: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", model, flags=re.IGNORECASE)
    text = re.sub(r"@.*$", "", text)
    text = re.sub(r"\b(cpu|processor)\b", "", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _torch_version() -> str:
    """torch's version without importing it (a cache hit must not pay torch's import time)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def _describe_cpu(remeasure: bool) -> DeviceSpec:
    info = _cpuinfo()
    model = (info.get("model name") or info.get("hardware") or info.get("model")
             or platform.processor() or platform.machine() or "unknown")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    parts = ("cpu", model, str(cores), _torch_version())
    return _cached(parts, remeasure, lambda: _measure_cpu(model, cores, info))


def _measure_cpu(model: str, cores: int, info: Mapping[str, str]) -> DeviceSpec:
    import torch  # lazy: only the local benchmarks need it

    flags = set((info.get("flags") or info.get("features") or "").split())
    lanes, simd = next(((n, f) for f, n in (("avx512f", 16), ("avx2", 8)) if f in flags), (4, "no avx2/avx512f flag"))
    peaks: dict[str, float | None] = {}
    sizes: dict[str, int] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        got = _cpu_matmul_flops(torch, dtype, _CPU_MATMUL_BUDGET_S[name])
        peaks[name] = got[0] if got else None
        if got:
            sizes[name] = got[1]
    if peaks["fp32"] is None:
        raise OpcastError("cannot measure the CPU: torch fp32 matmul failed; check the torch installation")
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        phys = 0
    copy_bytes = min(_CPU_COPY_BYTES, phys // 16) if phys else _CPU_COPY_BYTES
    bw = _cpu_copy_bandwidth(torch, copy_bytes)
    level, llc = _cpu_llc()
    clock = _cpu_mhz_max()
    today = datetime.date.today().isoformat()
    notes = (
        f"Measured by opcast with torch {torch.__version__} on {torch.get_num_threads()} threads. Peaks: median "
        f"throughput of torch.mm on n x n matrices ({', '.join(f'{k} n={v}' for k, v in sizes.items())}); "
        f"{', '.join(k for k in ('bf16', 'fp16') if peaks[k] is None) or 'no precision'} unavailable -> null; "
        "tf32 and fp8 null. mem_bw: median of copying a "
        f"{copy_bytes // 2**20} MiB float32 tensor, bytes read + written. sm_count = usable cores; "
        f"fp32_lanes_per_sm = {lanes} guessed from the cpu flags ({simd}); "
        f"l2_bytes = {'the L%d cache of cpu0 (largest level)' % level if llc else 'unknown (0)'}; "
        f"boost_clock_hz = {'cpuinfo maximum' if clock else 'placeholder 1e9 (cpuinfo has no clock)'}; "
        "mem_bytes = physical RAM. Placeholders: intra_node_bw = measured memory bandwidth, "
        "inter_node_bw = 1e9, gpus_per_node = 1, tdp unknown."
    )
    return DeviceSpec(
        name=f"cpu-{_slug(model)}-{cores}c", aliases=(), vendor="cpu", architecture=platform.machine() or "unknown",
        peak_fp32_flops=peaks["fp32"], peak_tf32_flops=None, peak_fp16_flops=peaks["fp16"],
        peak_bf16_flops=peaks["bf16"], peak_fp8_flops=None,
        mem_bytes=phys or 2**30, mem_bw_bytes_per_s=bw, sm_count=cores, fp32_lanes_per_sm=lanes, l2_bytes=llc,
        boost_clock_hz=clock or _PLACEHOLDER_CLOCK_HZ, intra_node_bw_bytes_per_s=bw, gpus_per_node=1,
        inter_node_bw_bytes_per_s=_PLACEHOLDER_LINK_BPS, tdp_w=None,
        source=f"measured by opcast on {today} ({model})", notes=notes,
    )


# FP32 lanes per SM by CUDA compute capability (CUDA C Programming Guide, "Arithmetic Instructions").
_CUDA_FP32_LANES = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128,
                    (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


def _describe_cuda(index: int, remeasure: bool) -> DeviceSpec:
    import torch  # lazy: only the local benchmarks need it

    if not torch.cuda.is_available():
        raise OpcastError("device 'cuda' requested but torch sees no GPU (torch.cuda.is_available() is False); "
                          "use 'cpu' or a catalog GPU name")
    count = torch.cuda.device_count()
    if index >= count:
        raise OpcastError(f"cuda:{index} does not exist: torch sees {count} GPU(s); use cuda:0..cuda:{count - 1}")
    props = torch.cuda.get_device_properties(index)
    try:
        return get_device(props.name)
    except OpcastError:
        pass
    parts = ("cuda", props.name, str(props.total_memory), str(props.multi_processor_count), torch.__version__)
    return _cached(parts, remeasure, lambda: _measure_cuda(torch, index, props))


def _cuda_median_s(torch: Any, fn: Callable[[], object], reps: int = 20) -> float:
    """Median seconds of ``fn`` on the current stream: one event pair per repetition, one sync."""
    for _ in range(3):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def _measure_cuda(torch: Any, index: int, props: Any) -> DeviceSpec:
    dev = torch.device("cuda", index)
    hip = bool(getattr(torch.version, "hip", None))
    n = 4096

    def matmul_flops(dtype: Any, tf32: bool = False) -> float | None:
        old = torch.backends.cuda.matmul.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(n, n, device=dev).to(dtype)
            b = torch.randn(n, n, device=dev).to(dtype)
            return 2.0 * n**3 / _cuda_median_s(torch, lambda: torch.mm(a, b))
        except (RuntimeError, TypeError):
            return None
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old

    with torch.cuda.device(index):
        fp32 = matmul_flops(torch.float32)
        if fp32 is None:
            raise OpcastError(f"cannot measure cuda:{index}: torch fp32 matmul failed; check the torch installation")
        tf32 = matmul_flops(torch.float32, tf32=True) if props.major >= 8 and not hip else None
        fp16 = matmul_flops(torch.float16)
        bf16 = matmul_flops(torch.bfloat16) if torch.cuda.is_bf16_supported() else None
        nbytes = min(2**30, props.total_memory // 8)
        src = torch.ones(nbytes // 4, device=dev)
        dst = torch.empty_like(src)
        bw = 2.0 * src.numel() * 4 / _cuda_median_s(torch, lambda: dst.copy_(src))
        del src, dst
    lanes = 64 if hip else _CUDA_FP32_LANES.get((props.major, props.minor), 64)
    sms = props.multi_processor_count
    clock_khz = getattr(props, "clock_rate", 0) or 0
    clock = clock_khz * 1e3 if clock_khz else fp32 / (2.0 * sms * lanes)
    arch = getattr(props, "gcnArchName", "") if hip else f"sm_{props.major}{props.minor}"
    today = datetime.date.today().isoformat()
    notes = (
        f"Not in the catalog; measured by opcast with torch {torch.__version__}. Peaks: median of 20 torch.mm calls "
        f"on {n} x {n} matrices timed with CUDA events (fp32 with TF32 off; tf32 with allow_tf32 on; null where "
        "unsupported); fp8 not measured. mem_bw: median of copying a tensor of "
        f"{nbytes // 2**20} MiB, bytes read + written. fp32_lanes_per_sm from the compute capability; boost_clock_hz "
        f"{'from the device properties' if clock_khz else 'estimated as measured fp32 / (2 x SMs x lanes)'}. "
        "Placeholders: intra_node_bw = 16e9 (PCIe 3.0 x16), inter_node_bw = 1e9, gpus_per_node = GPUs torch sees, "
        "tdp unknown."
    )
    return DeviceSpec(
        name=f"local-{_slug(props.name)}", aliases=(), vendor="amd" if hip else "nvidia",
        architecture=arch or "unknown", peak_fp32_flops=fp32, peak_tf32_flops=tf32, peak_fp16_flops=fp16,
        peak_bf16_flops=bf16, peak_fp8_flops=None, mem_bytes=int(props.total_memory), mem_bw_bytes_per_s=bw,
        sm_count=sms, fp32_lanes_per_sm=lanes, l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        boost_clock_hz=clock, intra_node_bw_bytes_per_s=16e9, gpus_per_node=torch.cuda.device_count(),
        inter_node_bw_bytes_per_s=_PLACEHOLDER_LINK_BPS, tdp_w=None,
        source=f"measured by opcast on {today} ({props.name})", notes=notes,
    )
