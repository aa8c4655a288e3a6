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


RANDOM_BLOCK = 1 << 20
"""Larger inputs repeat one seeded block of this many normal values: a seeded ``randn`` runs on
one CPU thread at ~5 ns an element (0.26 s for a 50k x 1k embedding table, a fifth of a CPU
collect's wall time in the arch shapes), while a repeat is a copy. Dense kernels do not run faster
or slower on repeating values."""


def randn(req: BuildRequest, *shape: int, requires_grad: bool = False, dtype=None):
    import math

    import torch

    gen = torch.Generator(device="cpu").manual_seed(req.seed)
    numel = math.prod(shape)
    if numel <= RANDOM_BLOCK:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32)
    else:
        block = torch.randn(RANDOM_BLOCK, generator=gen, dtype=torch.float32)
        t = block.repeat(-(-numel // RANDOM_BLOCK))[:numel].view(*shape)
    t = t.to(device=req.device, dtype=dtype or torch_dtype(req))
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
    grad_out = randn(req, *out.shape, dtype=out.dtype) if out.dim() else torch.ones_like(out)

    def bwd() -> object:
        return torch.autograd.grad(out, inputs, grad_out, retain_graph=True)

    return bwd
