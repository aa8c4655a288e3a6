"""LayerNorm and RMSNorm over the last dim of x [rows, cols], with affine weights."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build_layernorm(req: BuildRequest) -> Callable[[], object]:
    import torch.nn.functional as F

    rows, cols = req.params["rows"], req.params["cols"]
    x, w, b = randn(req, rows, cols), randn(req, cols), randn(req, cols)
    return run(req, lambda: F.layer_norm(x, (cols,), w, b), [x, w, b])


def build_rmsnorm(req: BuildRequest) -> Callable[[], object]:
    import torch.nn.functional as F

    rows, cols = req.params["rows"], req.params["cols"]
    x, w = randn(req, rows, cols), randn(req, cols)
    return run(req, lambda: F.rms_norm(x, (cols,), w), [x, w])
