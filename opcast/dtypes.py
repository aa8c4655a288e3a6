"""Numeric precisions opcast measures and predicts, with their storage sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from opcast.errors import OpcastError

if TYPE_CHECKING:
    import torch

DTYPE_BYTES: Final[dict[str, int]] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per element of each whole-byte precision (``tf32`` is stored as fp32; ``fp8`` is
e4m3/e5m2 with one per-tensor scale): the dtypes a tensor of activations, weights or gradients is
kept in. The block-scaled kernel dtypes are in :data:`DTYPE_BITS` only."""

DTYPE_BITS: Final[dict[str, float]] = {
    **{name: 8.0 * size for name, size in DTYPE_BYTES.items()},
    "fp8_block": 8.25,
    "nvfp4": 4.5,
}
"""Bits per element of every kernel dtype, block scales included (the per-tensor fp32 scale of a
whole tensor is negligible and left out):

- ``fp8_block``: e4m3 operands with one scale per block of elements. On Blackwell that is MXFP8
  (OCP Microscaling Formats v1.0: 32 elements share one E8M0 scale, 8 + 8/32 = 8.25 bits); on
  Hopper DeepSeek-V3's block scaling (arXiv 2412.19437 Sec. 3.3.2: one fp32 scale per 1x128
  activation tile and per 128x128 weight block, 8 + 32/128 = 8.25 bits for the activations, about
  8 for the weights). AIConfigurator's ``fp8_block`` GEMM rows are the latter kind on Hopper
  (DeepGEMM / Cutlass blockwise kernels) and DeepGEMM / Cutlass block-scaled kernels on Blackwell, what
  inference engines run; MXFP8 training (``--precision mxfp8``, Transformer Engine's cuBLASLt GEMMs) has the
  fp8_block format but its GEMMs are priced as per-tensor fp8 ones (:data:`opcast.predict.graph.TE_GEMM_KERNELS`).
- ``nvfp4``: e2m1 values, one E4M3 scale per 16 elements and one fp32 scale per tensor,
  4 + 8/16 = 4.5 bits (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149
  Sec. 2; Transformer Engine's ``NVFP4BlockScaling`` recipe).
"""

DTYPES: Final[tuple[str, ...]] = tuple(DTYPE_BITS)

WEIGHT_STORAGE_BITS: Final[dict[str, float]] = {"mxfp4": 4.0 + 8.0 / 32}
"""Bits an element of each weight-only storage format, scales included: weights stored narrower than the
GEMMs that read them compute (the kernel dequantises them on the fly, the activations stay in the GEMM's dtype).
``mxfp4``: e2m1 values with one E8M0 scale per 32 elements, 4 + 8/32 = 4.25 bits (OCP Microscaling Formats
v1.0, Sec. 5.2), gpt-oss's routed experts (:attr:`opcast.archs.ArchSpec.expert_weights`)."""


def weight_storage_bytes(storage: str) -> float:
    """Bytes an element of a weight-only storage format (:data:`WEIGHT_STORAGE_BITS`), scales included."""
    return WEIGHT_STORAGE_BITS[storage] / 8.0


BLOCK_SCALED_DTYPES: Final[tuple[str, ...]] = ("fp8_block", "nvfp4")
"""Kernel dtypes whose elements are not a whole number of bytes (:func:`element_bytes` only)."""


def _check(dtype: str) -> str:
    if dtype not in DTYPE_BITS:
        raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return dtype


def element_bytes(dtype: str) -> float:
    """Bytes per element of any kernel dtype, block scales included (``nvfp4`` 0.5625,
    ``fp8_block`` 1.03125): what the roofline and the features move. Raises :class:`OpcastError`
    for an unknown name."""
    return DTYPE_BITS[_check(dtype)] / 8.0


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a whole-byte ``dtype`` (a tensor's storage size); raises
    :class:`OpcastError` for an unknown name and for a block-scaled one, whose size is fractional
    (:func:`element_bytes`), rather than rounding it."""
    if _check(dtype) in BLOCK_SCALED_DTYPES:
        raise OpcastError(
            f"dtype {dtype!r} is block-scaled ({element_bytes(dtype)} bytes an element with its scales), not a "
            f"storage dtype; use one of {', '.join(DTYPE_BYTES)}"
        )
    return DTYPE_BYTES[dtype]


QUANTISED_PRECISIONS: Final[dict[str, str]] = {"fp8": "fp8", "mxfp8": "fp8_block", "nvfp4": "nvfp4"}
"""Training / inference precisions that run the transformer blocks' linears through Transformer
Engine's quantised GEMMs, each to the kernel dtype those GEMMs run in (``fp8``: per-tensor scaled
fp8, ``mxfp8``: ``MXFP8BlockScaling``, ``nvfp4``: ``NVFP4BlockScaling``); activations, attention,
norms and every other GEMM stay bf16."""


def quantises(precision: str) -> bool:
    """Whether a run in ``precision`` runs the block linears through quantised GEMMs (fp8, mxfp8, nvfp4):
    their inputs are saved for backward in fp8 and their gathers move fp8 (:data:`QUANTISED_PRECISIONS`)."""
    return precision in QUANTISED_PRECISIONS


def gemm_dtype(precision: str) -> str:
    """The kernel dtype of the quantised linears' GEMMs under ``precision`` (the precision itself
    when it quantises nothing)."""
    return QUANTISED_PRECISIONS.get(precision, precision)


def torch_dtype(dtype: str) -> torch.dtype:  # torch imported lazily to keep start-up light
    """The torch dtype that stores ``dtype`` (tf32 is fp32 with TF32 math enabled)."""
    import torch

    table = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp8": getattr(torch, "float8_e4m3fn", None),
    }
    dt = table.get(dtype)
    if dt is None:
        raise OpcastError(f"dtype {dtype!r} is not available in this torch build; use fp32, fp16 or bf16")
    return dt
