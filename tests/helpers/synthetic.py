"""Synthetic datasets from a known law, on fake devices: what the estimators must recover.

The law is the roofline plus a fixed launch cost, ``t = max(flops / peak, bytes / bw) + 5 us``,
with multiplicative log-normal noise (2 % by default), peaks and bytes from the registry and the
device exactly as :mod:`opcast.train.features` computes them (STYLE.md: a known law must be
recovered within a stated tolerance on a held-out fake device). A test helper, not part of the
package: ``from helpers.synthetic import ...`` (``tests/conftest.py`` puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

import numpy as np
import pandas as pd

from opcast.dtypes import DTYPE_BYTES
from opcast.hardware import DeviceSpec, get_device
from opcast.ops import get_op
from opcast.schema import point_id


def fake_devices(n: int = 4, *, base: str = "A100-SXM4-80GB") -> list[DeviceSpec]:
    """``n`` fake GPUs ``fake-0`` .. ``fake-{n-1}``: the ``base`` catalog spec with peaks, bandwidth,
    SM count and L2 scaled together over a factor of about 4 (distinct machines, one family)."""
    ref = get_device(base)
    out = []
    for i in range(n):
        s = 0.5 * 4.0 ** (i / max(1, n - 1))  # 0.5x .. 2x
        b = 0.6 * 3.0 ** (((i * 3) % n) / max(1, n - 1))  # a different ordering for bandwidth
        peaks: dict[str, Any] = {  # keywords of replace: fields of several types
            f"peak_{d}_flops": (getattr(ref, f"peak_{d}_flops") * s if getattr(ref, f"peak_{d}_flops") else None)
            for d in ("fp32", "tf32", "fp16", "bf16", "fp8")
        }
        out.append(
            replace(
                ref,
                name=f"fake-{i}",
                aliases=(),
                mem_bw_bytes_per_s=ref.mem_bw_bytes_per_s * b,
                sm_count=max(8, int(ref.sm_count * s)),
                l2_bytes=int(ref.l2_bytes * s),
                source="synthetic (tests/helpers/synthetic.py)",
                notes="",
                **peaks,
            )
        )
    return out


def law_seconds(
    flops: np.ndarray, moved: np.ndarray, peak: float | np.ndarray, bw: float, overhead_s: float = 5e-6
) -> np.ndarray:
    """The synthetic law: roofline time plus a fixed cost."""
    return np.maximum(flops / peak, moved / bw) + overhead_s


def synthetic_dataset(
    devices: Sequence[DeviceSpec],
    *,
    ops: Sequence[str] = ("gemm", "elementwise", "layernorm"),
    dtype: str = "fp16",
    rows_per_op: int = 300,
    noise: float = 0.02,
    overhead_s: float = 5e-6,
    seed: int = 0,
) -> pd.DataFrame:
    """Rows in the dataset schema: the same ``rows_per_op`` random shapes of each op (forward)
    timed by the law on every device (so shape groups span devices, as in real sweeps)."""
    rng = np.random.default_rng(seed)
    dt = DTYPE_BYTES[dtype]
    shapes: list[dict[str, int | bool | str]] = []
    for op in ops:
        for _ in range(rows_per_op):
            shapes.append({"op": op, **_random_params(op, rng)})
    rows = []
    for dev in devices:
        for shape in shapes:
            op = str(shape["op"])
            spec = get_op(op)
            params = {**spec.defaults, **{k: shape[k] for k in spec.param_names if k in shape}}
            tc = op in ("gemm", "attention")
            peak = dev.peak_flops(dtype, tensor_cores=tc)
            t = float(
                law_seconds(
                    np.array(spec.flops(params, "fwd", dt)),
                    np.array(spec.bytes_moved(params, dt, "fwd")),
                    peak,
                    dev.mem_bw_bytes_per_s,
                    overhead_s,
                )
            )
            t *= float(np.exp(rng.normal(0.0, noise)))
            rows.append(
                {
                    "run_id": "synthetic",
                    "source": "bench",
                    "device": dev.name,
                    "timing_method": "synthetic",
                    "op": op,
                    "dtype": dtype,
                    "direction": "fwd",
                    "tensor_cores": tc,
                    **params,
                    "point_id": point_id(op, params, dtype, "fwd", tc),
                    "time_s_median": t,
                }
            )
    return pd.DataFrame(rows)


def _random_params(op: str, rng: np.random.Generator) -> dict[str, int | bool | str]:
    def logint(lo: int, hi: int) -> int:
        return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))

    if op == "gemm":
        return {"b": 1, "m": logint(16, 8192), "n": logint(16, 8192), "k": logint(16, 8192)}
    if op == "elementwise":
        return {"numel": logint(1 << 10, 1 << 26), "fn": str(rng.choice(["add", "mul", "gelu"]))}
    if op in ("layernorm", "rmsnorm", "softmax"):
        return {"rows": logint(1, 32768), "cols": logint(64, 16384)}
    raise ValueError(f"no synthetic shapes for {op}")


def attention_columns(batch: int, heads: int, kv_heads: int, seq_q: int, seq_kv: int, head_dim: int = 128) -> dict:
    """One bf16 causal flash-attention forward row as the column arrays ``feature_table`` takes."""
    return {
        "op": np.array(["attention"], dtype=object),
        "dtype": np.array(["bf16"], dtype=object),
        "direction": np.array(["fwd"], dtype=object),
        "batch": np.array([batch]),
        "heads": np.array([heads]),
        "kv_heads": np.array([kv_heads]),
        "seq_q": np.array([seq_q]),
        "seq_kv": np.array([seq_kv]),
        "head_dim": np.array([head_dim]),
        "causal": np.array([True]),
        "impl": np.array(["flash"], dtype=object),
    }


def die_variants(base: DeviceSpec, bw_factor: float) -> tuple[DeviceSpec, DeviceSpec]:
    """(a bigger board of ``base``'s compute die: twice the memory, ``bw_factor`` x the bandwidth; the same
    board with 8 fewer SMs, another die)."""
    board = replace(
        base,
        name=f"{base.name}-big",
        aliases=(),
        mem_bytes=2 * base.mem_bytes,
        mem_bw_bytes_per_s=bw_factor * base.mem_bw_bytes_per_s,
    )
    return board, replace(board, name=f"{base.name}-cut", sm_count=base.sm_count - 8)


def pinned_l2_devices() -> tuple[Any, Any]:
    """(GDDR, HBM): an L40S (864 GB/s, 142 SMs at 2.52 GHz, 96 MiB L2, 362 bf16 TFLOP/s) and an A100
    (2.039 TB/s, 108 SMs at 1.41 GHz, 40 MiB L2, 312 TFLOP/s), catalog entries pinned to round numbers
    so that the L2 rules' hand-worked arithmetic does not move when the catalog does."""
    from opcast.hardware import get_device

    pins = {  # name: SMs, boost clock, DRAM bandwidth, L2 MiB, bf16 peak
        "L40S": (142, 2.52e9, 864e9, 96, 362e12),
        "A100-SXM4-80GB": (108, 1.41e9, 2.039e12, 40, 312e12),
    }
    gddr, hbm = (
        replace(
            get_device(name),
            sm_count=sms,
            boost_clock_hz=clock,
            mem_bw_bytes_per_s=bw,
            l2_bytes=l2 << 20,
            peak_bf16_flops=peak,
        )
        for name, (sms, clock, bw, l2, peak) in pins.items()
    )
    return gddr, hbm


def aligned_gemms(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with every GEMM's n and k rounded down to a multiple of 8 (at least 8), their point ids renewed:
    half-precision GEMMs cuBLAS runs through its aligned tensor-op kernels (:func:`opcast.ops.misaligned_tensor_gemm`),
    for a test that means one kernel family per correction group (a measured device's aligned GEMMs)."""
    out = rows.copy()
    gemm = (out["op"] == "gemm").to_numpy()
    for dim in ("n", "k"):
        out.loc[gemm, dim] = np.maximum(8, (out.loc[gemm, dim].to_numpy(dtype=int) // 8) * 8)
    spec = get_op("gemm")
    for i in np.flatnonzero(gemm):
        r = out.iloc[i]
        params = {**spec.defaults, **{k: r[k] for k in spec.param_names if k in r.index}}
        out.iat[i, out.columns.get_loc("point_id")] = point_id(
            "gemm", params, r["dtype"], r["direction"], r["tensor_cores"]
        )
    return out


AIC_GEMM_DTYPES: Final = {"bf16": ("peak_bf16_flops", 2), "fp8_block": ("peak_fp8_flops", 1)}
"""A replayed AIConfigurator GEMM dtype -> (its peak's catalog field, bytes an element)."""


def aic_gemm_rows(
    efficiency: Mapping[str, float],
    *,
    dtypes: Sequence[str] = ("bf16",),
    folders: Mapping[str, str] | None = None,
    kernel_name: str | None = None,
    seed: int = 0,
    shapes: int = 48,
) -> list[dict]:
    """GEMMs of the same random shapes on the catalog GPUs of ``efficiency`` (name -> share of the dtype's peak)
    in the layout of a replayed AIConfigurator table (``folders``: a GPU's system folder, default its name), timed
    by a roofline law with that efficiency, a 5 us floor and 3 % noise, one dtype of :data:`AIC_GEMM_DTYPES` after
    another per GPU."""
    rng = np.random.default_rng(seed)
    mnk = rng.integers(6, 14, size=(shapes, 3))
    rows = []
    for dev, share in efficiency.items():
        spec = get_device(dev)
        folder = (folders or {}).get(dev, dev)
        for dtype in dtypes:
            field, size = AIC_GEMM_DTYPES[dtype]
            peak = getattr(spec, field)
            assert peak, f"{dev} has no {field}"
            for m, n, k in 2**mnk:
                t_compute = 2 * m * n * k / (peak * share)
                t_memory = size * (m * k + k * n + m * n) / spec.mem_bw_bytes_per_s
                rows.append(
                    {
                        "run_id": "t",
                        "source": "replay:aiconfigurator",
                        "timing_method": "replay:aiconfigurator:mean",
                        "source_file": f"{folder}/gemm/trtllm/1.0/gemm_perf.parquet",
                        "device": dev,
                        "op": "gemm",
                        "dtype": dtype,
                        "direction": "fwd",
                        "tensor_cores": True,
                        "b": 1,
                        "m": int(m),
                        "n": int(n),
                        "k": int(k),
                        **({"kernel_name": kernel_name} if kernel_name else {}),
                        "time_s_median": float((max(t_compute, t_memory) + 5e-6) * np.exp(rng.normal(0, 0.03))),
                    }
                )
    return rows
