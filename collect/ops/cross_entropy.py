"""Cross-entropy loss of logits [tokens, vocab] against random targets (mean reduction):
``native`` is ``F.cross_entropy`` (torch's log-softmax kernel and the NLL gather), ``unfused`` the
max, subtract, exp, sum, log and gather as torch ops, as Megatron's ``vocab_parallel_cross_entropy``
writes them (registry ``impl``)."""

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
    if req.params.get("impl", "native") == "unfused":

        def unfused():
            shifted = logits - logits.amax(-1, keepdim=True)
            exp = shifted.exp()
            log_sum = exp.sum(-1).log()
            return (log_sum - shifted.gather(1, targets[:, None]).squeeze(1)).mean()

        return run(req, unfused, [logits])
    return run(req, lambda: F.cross_entropy(logits, targets), [logits])
