"""Softmax over the last dim of x [rows, cols]."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch

    x = randn(req, req.params["rows"], req.params["cols"])
    return run(req, lambda: torch.softmax(x, dim=-1), [x])
