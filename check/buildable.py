"""What :mod:`opcast.check.torch_model` builds, checked without importing torch, so that ``opcast validate``
refuses an arch it cannot build in one line before torch's import (seconds) and before any work."""

from __future__ import annotations

from opcast.archs import ArchSpec
from opcast.errors import OpcastError

ATTENTION_IMPLS = ("flash", "eager")
"""The attention implementations the compact model builds (module docstring of :mod:`~opcast.check.torch_model`)."""


def check_arch(arch: ArchSpec, attention: str = "flash") -> None:
    """Refuse what this implementation does not build, in one line."""
    problems = []
    if arch.n_experts > 1:
        problems.append(
            f"{arch.name} is a mixture of experts (n_experts={arch.n_experts}); validate builds dense archs only"
        )
    if arch.post_norms:
        problems.append(f"{arch.name} has Gemma's post-norms, which validate does not build; use a llama-style arch")
    if arch.sliding_window is not None:
        problems.append(
            f"{arch.name} has sliding-window attention, which validate does not build; set sliding_window to null "
            "in its config to validate the full-attention model"
        )
    if arch.position == "alibi":
        problems.append(f"{arch.name} uses ALiBi positions, which validate does not build; use a learned or rope arch")
    if attention not in ATTENTION_IMPLS:
        problems.append(f"attention={attention!r} is not one of {', '.join(ATTENTION_IMPLS)}")
    if arch.position == "rope" and arch.head_dim % 2:
        problems.append(f"rope needs an even head_dim, {arch.name} has {arch.head_dim}")
    if problems:
        raise OpcastError("; ".join(problems))
