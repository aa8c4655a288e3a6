"""Pointwise functions over numel elements (registry: opcast.ops.ELEMENTWISE_FNS)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, UnsupportedPoint, randn, run


def _functions():
    import torch
    import torch.nn.functional as F

    return {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "pow": lambda a, b: torch.pow(a, b),
        "add_scalar": lambda a: a + 2.0,
        "sub_scalar": lambda a: a - 2.0,
        "mul_scalar": lambda a: a * 2.0,
        "div_scalar": lambda a: a / 2.0,
        "pow_scalar": lambda a: a**2.0,
        "relu": F.relu,
        "gelu": lambda a: F.gelu(a, approximate="tanh"),
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "exp": torch.exp,
        "dropout": lambda a: F.dropout(a, p=0.1, training=True),
        "copy": lambda a: a.clone(),
    }


FUSED_ONLY: dict[str, str] = {
    "swiglu": "the registry's swiglu is one fused kernel (reads both halves, writes the product) and torch eager has "
    "none: silu(a) * b runs two kernels, which are the silu and mul points; the fused kernel's rows come from "
    "replays (Vidur's SiluAndMul)",
}
"""Registry functions that are one fused kernel torch eager cannot run: timing eager's chain under their name would
record two kernels as one (the H200 fp32 collection of the twenty-fifth session did, 13 forward rows: dropped)."""


def build(req: BuildRequest) -> Callable[[], object]:
    from opcast.ops import ELEMENTWISE_FNS

    numel, name = req.params["numel"], req.params["fn"]
    if name in FUSED_ONLY:
        raise UnsupportedPoint(FUSED_ONLY[name])
    fn = _functions().get(name)
    if fn is None:
        raise UnsupportedPoint(f"no benchmark for elementwise fn {name!r}")
    inputs = [randn(req, numel)]
    if ELEMENTWISE_FNS[name].inputs == 2:
        second = randn(req, numel)
        if name in ("pow", "div"):  # positive operands keep pow/div finite
            second = second.abs().add_(0.5)
        inputs.append(second)
    if name == "pow":
        inputs[0] = inputs[0].abs().add_(0.5)
    return run(req, lambda: fn(*inputs), inputs)
