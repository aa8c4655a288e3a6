"""This machine as a :class:`~opcast.hardware.DeviceSpec`: the local CPU, or a CUDA/ROCm device
torch can see, with peaks and memory bandwidth measured by microbenchmarks.

Measuring this machine is collect's job; the core resolves ``cpu``, ``cuda`` and ``cuda:N`` in
:func:`opcast.hardware.get_device` through :func:`describe_local` here (its one deferred import of
collect). A GPU whose torch name is in the catalog is the catalog entry; anything else is measured
with torch (about a second) and cached under :func:`cache_dir` (``~/.cache/opcast``;
``OPCAST_CACHE_DIR`` overrides), keyed by the device model, core count and torch version.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec, device_to_dict, get_device, load_device_file
from opcast.ops import whole_number

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
    if m:  # int() of more than 4,300 digits raised ValueError: whole_number bounds the index instead
        index = whole_number(m.group(1)) if m.group(1) else 0
        if index is not None:
            return _describe_cuda(text if len(text) <= 40 else text[:37] + "...", index, remeasure)
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
        mhz = [
            float(v)
            for k, _, v in (ln.partition(":") for ln in Path("/proc/cpuinfo").read_text().splitlines())
            if k.strip().lower() == "cpu mhz"
        ]
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
    model = (
        info.get("model name")
        or info.get("hardware")
        or info.get("model")
        or platform.processor()
        or platform.machine()
        or "unknown"
    )
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
        f"l2_bytes = {f'the L{level} cache of cpu0 (largest level)' if llc else 'unknown (0)'}; "
        f"boost_clock_hz = {'cpuinfo maximum' if clock else 'placeholder 1e9 (cpuinfo has no clock)'}; "
        "mem_bytes = physical RAM. Placeholders: intra_node_bw = measured memory bandwidth, "
        "inter_node_bw = 1e9, gpus_per_node = 1, tdp unknown."
    )
    return DeviceSpec(
        name=f"cpu-{_slug(model)}-{cores}c",
        aliases=(),
        vendor="cpu",
        architecture=platform.machine() or "unknown",
        peak_fp32_flops=peaks["fp32"],
        peak_tf32_flops=None,
        peak_fp16_flops=peaks["fp16"],
        peak_bf16_flops=peaks["bf16"],
        peak_fp8_flops=None,
        mem_bytes=phys or 2**30,
        mem_bw_bytes_per_s=bw,
        sm_count=cores,
        fp32_lanes_per_sm=lanes,
        l2_bytes=llc,
        boost_clock_hz=clock or _PLACEHOLDER_CLOCK_HZ,
        intra_node_bw_bytes_per_s=bw,
        gpus_per_node=1,
        inter_node_bw_bytes_per_s=_PLACEHOLDER_LINK_BPS,
        tdp_w=None,
        source=f"measured by opcast on {today} ({model})",
        notes=notes,
    )


# FP32 lanes per SM by CUDA compute capability (CUDA C Programming Guide, "Arithmetic Instructions").
_CUDA_FP32_LANES = {
    (6, 0): 64,
    (6, 1): 128,
    (7, 0): 64,
    (7, 5): 64,
    (8, 0): 64,
    (8, 6): 128,
    (8, 7): 128,
    (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128,
    (12, 0): 128,
}


def _describe_cuda(name: str, index: int, remeasure: bool) -> DeviceSpec:
    """The CUDA device ``index``, asked for as ``name`` (``cuda``, ``cuda:N``: the messages say which)."""
    import torch  # lazy: only the local benchmarks need it

    if not torch.cuda.is_available():
        raise OpcastError(
            f"device '{name}' requested but torch sees no GPU (torch.cuda.is_available() is False); "
            "use 'cpu' or a catalog GPU name"
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise OpcastError(f"{name} does not exist: torch sees {count} GPU(s); use cuda:0..cuda:{count - 1}")
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


def _cuda_copy_bandwidth(torch: Any, dev: Any, nbytes: int) -> float:
    """Bytes read + written per second copying a float32 tensor of ``nbytes`` on ``dev``; both
    buffers are freed on return."""
    src = torch.ones(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / _cuda_median_s(torch, lambda: dst.copy_(src))


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
        bw = _cuda_copy_bandwidth(torch, dev, nbytes)
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
        name=f"local-{_slug(props.name)}",
        aliases=(),
        vendor="amd" if hip else "nvidia",
        architecture=arch or "unknown",
        peak_fp32_flops=fp32,
        peak_tf32_flops=tf32,
        peak_fp16_flops=fp16,
        peak_bf16_flops=bf16,
        peak_fp8_flops=None,
        mem_bytes=int(props.total_memory),
        mem_bw_bytes_per_s=bw,
        sm_count=sms,
        fp32_lanes_per_sm=lanes,
        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
        boost_clock_hz=clock,
        intra_node_bw_bytes_per_s=16e9,
        gpus_per_node=torch.cuda.device_count(),
        inter_node_bw_bytes_per_s=_PLACEHOLDER_LINK_BPS,
        tdp_w=None,
        source=f"measured by opcast on {today} ({props.name})",
        notes=notes,
    )
