"""Numeric precisions opcast measures and predicts, with their storage sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from opcast.errors import OpcastError

if TYPE_CHECKING:
    import torch

DTYPE_BYTES: Final[dict[str, int]] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per element of each precision name (``tf32`` is stored as fp32; ``fp8`` is e4m3/e5m2)."""

DTYPES: Final[tuple[str, ...]] = tuple(DTYPE_BYTES)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; raises :class:`OpcastError` for an unknown name."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise OpcastError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}") from None


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
