"""Softmax over the last dim of x [rows, cols]: ``native`` is ``torch.softmax`` (one kernel),
``unfused`` the max, subtract, exp, sum and divide as torch ops (registry ``impl``)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch

    x = randn(req, req.params["rows"], req.params["cols"])
    if req.params.get("impl", "native") == "unfused":

        def unfused():
            e = (x - x.amax(-1, keepdim=True)).exp()
            return e / e.sum(-1, keepdim=True)

        return run(req, unfused, [x])
    return run(req, lambda: torch.softmax(x, dim=-1), [x])
