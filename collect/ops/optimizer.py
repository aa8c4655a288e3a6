"""One Adam step over numel parameters (torch.optim.Adam, fused where the device has it)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, UnsupportedPoint, randn


def build(req: BuildRequest) -> Callable[[], object]:
    import torch

    if req.direction != "fwd":
        raise UnsupportedPoint("the optimizer step has no backward")
    param = torch.nn.Parameter(randn(req, req.params["numel"]))
    param.grad = randn(req, req.params["numel"])
    try:
        opt = torch.optim.Adam([param], lr=1e-4, fused=True)
        opt.step()
    except RuntimeError:
        opt = torch.optim.Adam([param], lr=1e-4, foreach=True)
    return opt.step
