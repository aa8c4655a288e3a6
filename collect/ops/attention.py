"""Attention: flash (SDPA forced to its flash backend; labelled flash2 on Hopper and Blackwell, where that backend's
FlashAttention-2 is a family of its own: :func:`opcast.collect.sampling.measured_impl`), sdpa (SDPA's own dispatch)
and eager (matmul, mask, softmax, matmul, with GQA keys/values repeated as Hugging Face does)."""

from __future__ import annotations

import math
from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, UnsupportedPoint, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    p = req.params
    b, h, kvh, sq, skv, d = p["batch"], p["heads"], p["kv_heads"], p["seq_q"], p["seq_kv"], p["head_dim"]
    causal, impl = p["causal"], p["impl"]
    q, k, v = randn(req, b, h, sq, d), randn(req, b, kvh, skv, d), randn(req, b, kvh, skv, d)
    gqa = kvh != h

    if impl == "eager":
        scale = 1.0 / math.sqrt(d)
        mask = None
        if causal:  # bottom-right aligned: query i sees keys up to skv - sq + i
            mask = torch.ones(sq, skv, dtype=torch.bool, device=req.device).tril(skv - sq).logical_not()

        def forward_math():
            kk, vv = (k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)) if gqa else (k, v)
            scores = torch.matmul(q, kk.transpose(-1, -2)) * scale
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            return torch.matmul(torch.softmax(scores, dim=-1), vv)

        return run(req, forward_math, [q, k, v])

    kwargs = {"enable_gqa": gqa}
    if causal and sq == skv:
        kwargs["is_causal"] = True
    elif causal:
        kwargs["attn_mask"] = causal_lower_right(sq, skv)
    backends = [SDPBackend.FLASH_ATTENTION] if impl in ("flash", "flash2") else list(SDPBackend.__members__.values())
    backends = [be for be in backends if be != SDPBackend.ERROR]

    def forward():
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    try:
        closure = run(req, forward, [q, k, v])
        closure()
    except RuntimeError as err:
        raise UnsupportedPoint(f"{impl} attention not available here: {str(err).splitlines()[0][:120]}") from None
    return closure
