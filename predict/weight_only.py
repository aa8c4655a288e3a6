"""Weight-only quantised experts: a checkpoint whose routed experts are stored narrower than the GEMMs compute.

gpt-oss ships its experts in MXFP4 (:attr:`opcast.archs.ArchSpec.expert_weights`): OCP Microscaling Formats v1.0,
e2m1 values with one E8M0 scale per 32, 4.25 bits an element (:data:`opcast.dtypes.WEIGHT_STORAGE_BITS`). Serving
engines keep them so and run the expert GEMMs with the activations in 16 (or 8) bits, dequantising the weights on
the fly in the kernel (TensorRT-LLM's and vLLM's W4A16 MXFP4 MoE on Hopper; Frantar et al. 2024, arXiv 2408.11743,
Marlin: close to the ideal 4x speed-up of a 16-bit GEMM while it is memory-bound, up to batch 16-32, the same time
once compute-bound).

Inference prices such experts as the fused ``moe`` kernel with ``weights="mxfp4"`` (:mod:`opcast.ops`): learned
where a model has measured W4A16 MXFP4 MoE rows (AIConfigurator's ``w4a16_mxfp4`` moe_perf rows,
:mod:`opcast.collect.replay.aiconfigurator`). Where none does, the kernel is its grouped GEMMs
(:func:`opcast.predict.cost.decompose`), each the learned GEMM of the serving precision scaled by the ratio of its
roofline times with the weights at each size (:func:`weight_only_time_s`): a memory-bound GEMM (decode) speeds up
by its bytes, a compute-bound one (prefill) keeps its time. That fallback leaves out the dequantisation's own
instructions, which the measured kernels show dominate on Hopper at small batches (the W4A16 MoE runs far below
the bandwidth roofline of its bytes), and Blackwell's native FP4 tensor-core path.
"""

from __future__ import annotations

from collections.abc import Mapping

from opcast.dtypes import element_bytes, weight_storage_bytes
from opcast.hardware import DeviceSpec


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

    return time_s * roof(weight_storage_bytes(storage)) / roof(element_bytes(dtype))
