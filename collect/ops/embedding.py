"""Embedding lookup of tokens ids in a [vocab, hidden] table (dense gradient in backward)."""

from __future__ import annotations

from collections.abc import Callable

from opcast.collect.ops.common import BuildRequest, randn, run


def build(req: BuildRequest) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    tokens, vocab, hidden = req.params["tokens"], req.params["vocab"], req.params["hidden"]
    gen = torch.Generator().manual_seed(req.seed)
    ids = torch.randint(0, vocab, (tokens,), generator=gen).to(req.device)
    table = randn(req, vocab, hidden)
    return run(req, lambda: F.embedding(ids, table), [table])
