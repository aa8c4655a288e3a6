"""Cross-entropy loss of logits [tokens, vocab] against random targets (mean reduction)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    tokens, vocab = req.params["tokens"], req.params["vocab"]
    gen = torch.Generator().manual_seed(req.seed)
    targets = torch.randint(0, vocab, (tokens,), generator=gen).to(req.device)
    logits = randn(req, tokens, vocab)
    return run(req, lambda: F.cross_entropy(logits, targets), [logits])
