"""Weight-only quantised experts: a checkpoint whose routed experts are stored narrower than the GEMMs compute.

gpt-oss ships its experts in MXFP4 (:attr:`opcast.archs.ArchSpec.expert_weights`): OCP Microscaling Formats v1.0,
e2m1 values with one E8M0 scale per 32, :data:`MXFP4_BITS` bits an element. Serving engines keep them so and
run the expert GEMMs with the activations in 16 (or 8) bits, dequantising the weights on the fly in the kernel
(vLLM's Marlin / Triton ``matmul_ogs`` MXFP4 MoE on Hopper; Frantar et al. 2024, arXiv 2408.11743, Marlin: close to
the ideal 4x speed-up of a 16-bit GEMM while it is memory-bound, up to batch 16-32, the same time once compute-bound).

Priced from the learned kernel of the GEMM in the serving precision, scaled by the ratio of its roofline times
with the weights at each size (:func:`weight_only_time_s`): a memory-bound GEMM (decode) speeds up by its bytes, a
compute-bound one (prefill) keeps its time. Not priced: the dequantisation's own instructions, and Blackwell's
native FP4 tensor-core path (FlashInfer's MXFP4 x MXFP8 MoE), which would make prefill faster than this.
"""

from __future__ import annotations

from collections.abc import Mapping

from opcast.dtypes import element_bytes
from opcast.hardware import DeviceSpec

MXFP4_BITS = 4.25
"""Bits of an MXFP4 element with its scale: 4 + 8 / 32 (OCP Microscaling Formats v1.0, Sec. 5.2)."""

WEIGHT_BITS = {"mxfp4": MXFP4_BITS}
"""Bits an element of each weight-only storage format (:attr:`opcast.archs.ArchSpec.expert_weights`)."""

EXPERT_GEMM_ROLES = frozenset({"mlp_up", "mlp_down"})
"""The roles of an MoE block's routed-expert GEMMs in :func:`opcast.predict.graph.block_ops` (the shared expert's
roles are its own, and it stays in the serving precision)."""


def weight_bytes(storage: str) -> float:
    """Bytes an element of a weight-only storage format, scales included."""
    return WEIGHT_BITS[storage] / 8.0


def gemm_bytes(params: Mapping, dtype: str, weight_bytes_each: float) -> float:
    """Bytes a GEMM ``params`` (``b, m, n, k``) in ``dtype`` moves with its ``b n k`` weights at ``weight_bytes_each``:
    ``b (m k + m n) e(dtype) + b n k w``."""
    b, m, n, k = (int(params[x]) for x in ("b", "m", "n", "k"))
    return b * (m * k + m * n) * element_bytes(dtype) + b * n * k * weight_bytes_each


def weight_only_time_s(time_s: float, params: Mapping, *, device: DeviceSpec, dtype: str, storage: str) -> float:
    """``time_s`` (the GEMM ``params`` = ``b, m, n, k`` in ``dtype``) with its weights read at ``storage``'s size:
    ``time_s x roof(w_storage) / roof(w_dtype)``, ``roof(w) = max(2 b m n k / peak, gemm_bytes(w) / bw)``."""
    b, m, n, k = (int(params[x]) for x in ("b", "m", "n", "k"))
    compute_s = 2.0 * b * m * n * k / device.peak_flops(dtype)

    def roof(w: float) -> float:
        return max(compute_s, gemm_bytes(params, dtype, w) / device.mem_bw_bytes_per_s)

    return time_s * roof(weight_bytes(storage)) / roof(element_bytes(dtype))


def weight_only_bottleneck(doc: dict, params: Mapping, *, dtype: str, storage: str, time_s: float, device) -> dict:
    """The per-op bottleneck keys of ``doc`` (:func:`opcast.predict.report.op_bottleneck`) recomputed with the
    weights at ``storage``'s size: intensity, bound and memory utilisation read the bytes really moved."""
    moved = gemm_bytes(params, dtype, weight_bytes(storage))
    b, m, n, k = (int(params[x]) for x in ("b", "m", "n", "k"))
    intensity = 2.0 * b * m * n * k / moved
    return {
        **doc,
        "arithmetic_intensity_flop_per_byte": intensity,
        "roofline_bound": "compute" if intensity >= doc["ridge_flop_per_byte"] else "memory",
        "memory_bw_utilisation": moved / (time_s * device.mem_bw_bytes_per_s) if time_s > 0 else 0.0,
    }
