"""Rotary position embedding as in Hugging Face Llama: x * cos + rotate_half(x) * sin."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch

    tokens, heads, d = req.params["tokens"], req.params["heads"], req.params["head_dim"]
    x = randn(req, tokens, heads, d)
    cos, sin = randn(req, tokens, 1, d), randn(req, tokens, 1, d)

    def forward():
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    return run(req, forward, [x])
