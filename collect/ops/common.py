"""What every builder shares: the request, tensor factories and the fwd/bwd closure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class UnsupportedPoint(Exception):
    """This device / torch build cannot run the point (recorded as skipped, not as an error)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildRequest:
    """One plan point, ready to build."""

    params: dict[str, Any]
    """Validated op parameters (opcast.ops)."""
    dtype: str
    """fp32 | tf32 | fp16 | bf16 | fp8."""
    direction: str
    """fwd | bwd."""
    device: Any
    """torch.device to run on."""
    seed: int = 0
    """Seed of the random inputs."""


def torch_dtype(req: BuildRequest):
    from opcast.dtypes import torch_dtype as lookup

    return lookup("fp32" if req.dtype == "tf32" else req.dtype)


def randn(req: BuildRequest, *shape: int, requires_grad: bool = False, dtype=None):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(req.seed)
    t = torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=req.device, dtype=dtype or torch_dtype(req))
    return t.requires_grad_(requires_grad)


def run(req: BuildRequest, forward: Callable[[], Any], inputs: Sequence[Any]) -> Callable[[], object]:
    """The closure for ``req.direction``: the forward without autograd, or the backward of one
    recorded forward (all input gradients, graph retained so it can be replayed)."""
    import torch

    if req.direction == "fwd":
        def fwd() -> object:
            with torch.no_grad():
                return forward()
        return fwd
    for t in inputs:
        t.requires_grad_(True)
    out = forward()
    grad_out = torch.randn_like(out) if out.dim() else torch.ones_like(out)

    def bwd() -> object:
        return torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
    return bwd
