"""GEMM: C[b,m,n] = A[b,m,k] @ B[b,k,n] (torch.matmul / bmm; fp8 through torch._scaled_mm)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, UnsupportedPoint, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch

    b, m, n, k = (req.params[x] for x in ("b", "m", "n", "k"))
    if req.dtype == "fp8":
        return _build_fp8(req, b, m, n, k)
    shape_a, shape_b = ((m, k), (k, n)) if b == 1 else ((b, m, k), (b, k, n))
    a, w = randn(req, *shape_a), randn(req, *shape_b)
    return run(req, lambda: torch.matmul(a, w), [a, w])


def _build_fp8(req: BuildRequest, b: int, m: int, n: int, k: int) -> Callable[[], object]:
    import torch

    if req.device.type != "cuda" or torch.cuda.get_device_capability(req.device) < (8, 9):
        raise UnsupportedPoint("fp8 GEMM needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper or newer)")
    if req.direction != "fwd" or b != 1 or m % 16 or n % 16 or k % 16:
        raise UnsupportedPoint("fp8 GEMM is benchmarked forward only, b=1, m/n/k multiples of 16")
    a = randn(req, m, k, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    w = randn(req, n, k, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device=req.device, dtype=torch.float32)

    def fwd() -> object:
        return torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return fwd
