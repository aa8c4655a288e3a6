"""LayerNorm and RMSNorm over the last dim of x [rows, cols], with affine weights, in the
implementation the point names (registry ``impl``): ``native`` runs torch's own kernel
(``F.layer_norm``; ``F.rms_norm``, one kernel since torch 2.8), ``unfused`` the Python
composition of torch ops a framework writes (GPT-NeoX's RMSNorm:
``x / (x.norm() * cols**-0.5 + eps) * w``; LayerNorm as mean, variance, normalise, affine).
One-pass ``fused`` kernels (Apex, Transformer Engine) are not in torch;
:func:`opcast.collect.sampling.unsupported_reason` skips them."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run

EPS = 1e-5


def build_layernorm(req: BuildRequest) -> Callable[[], object]:
    import torch.nn.functional as F

    rows, cols = req.params["rows"], req.params["cols"]
    x, w, b = randn(req, rows, cols), randn(req, cols), randn(req, cols)
    if req.params.get("impl", "native") == "unfused":

        def unfused():
            mean = x.mean(-1, keepdim=True)
            centred = x - mean
            var = (centred * centred).mean(-1, keepdim=True)
            return centred * (var + EPS).rsqrt() * w + b

        return run(req, unfused, [x, w, b])
    return run(req, lambda: F.layer_norm(x, (cols,), w, b), [x, w, b])


def build_rmsnorm(req: BuildRequest) -> Callable[[], object]:
    import torch.nn.functional as F

    rows, cols = req.params["rows"], req.params["cols"]
    x, w = randn(req, rows, cols), randn(req, cols)
    if req.params.get("impl", "native") == "unfused":  # GPT-NeoX megatron/model/norms.py RMSNorm
        return run(req, lambda: w * (x / (x.norm(2, dim=-1, keepdim=True) * cols**-0.5 + EPS)), [x, w])
    return run(req, lambda: F.rms_norm(x, (cols,), w), [x, w])
