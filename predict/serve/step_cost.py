"""The time of one serving step from opcast's inference cost path, as a table built once.

A step runs one forward over a mixed batch: the chunks of prompts being prefilled and one token
of every decoding sequence (Sarathi-Serve / vLLM V1 continuous batching). Its price splits as
Vidur's does:

- the **token-wise part** (GEMMs, norms, embeddings, the LM head, TP collectives and
  stage-to-stage sends) of all ``T`` tokens together: one forward of ``T`` tokens
  (:func:`opcast.predict.inference.forward_time_s`) less its attention core;
- the **attention core**, the kernels of :func:`opcast.predict.graph.block_ops` times the layers:
  the decodes as one kernel (``b`` sequences of one query against their mean KV length), and all
  the step's prefill chunks as **one batched kernel** (below); each kind of block apart
  (:func:`opcast.predict.inference.block_kinds`: a sliding-window block's decodes read
  ``min(mean KV length, window)`` keys, :func:`opcast.predict.graph.window_core`).

**Batched prefill attention.** A chunk of ``q`` new queries that sees ``kv`` keys (its cached
prefix and earlier chunks, then itself) does ``w = q (kv - q) + q (q + 1) / 2`` causal query-key
pairs (the registry's bottom-right aligned causal count, :mod:`opcast.ops`). vLLM V1 runs every
chunk of a step in one ``flash_attn_varlen_func`` call per layer (``cu_seqlens_q`` / ``seqused_k``
over the whole batch, ``vllm/v1/attention/backends/flash_attn.py``, ``FlashAttentionImpl.forward``;
its decodes ride in the same call), SGLang in FlashInfer calls over the whole batch (ragged over
the new tokens, paged over cached prefixes), so the chunks pay one launch and their work adds up,
not N launches. The registry's attention op is one
uniform ``[batch, seq_q, seq_kv]`` shape, so the step's chunks are priced as the one sequence that
does the same work (Vidur's "equivalent batch", Agrawal et al. 2024, arXiv 2405.05465, Sec. 3, and
``vidur/execution_time_predictor/sklearn_execution_time_predictor.py``
``_get_attention_prefill_execution_time``, which keeps ``sqrt(sum q_i^2)``): ``q_e`` with
``q_e (q_e + 1) = sum q_i (q_i + 1)`` (the causal self-attention of the chunks) and
``kv_e = q_e + sum q_i (kv_i - q_i) / q_e`` (their queries against earlier keys), so the one
kernel's pairs, hence FLOPs, are exactly ``sum w_i``; one chunk is priced as itself (``kv_e`` past
the table's longest request extrapolates linearly in keys, as attention grows). Not modelled:
the per-sequence tile padding of many tiny chunks, and the K/V bytes of each chunk's own context
(the one sequence reads ``kv_e`` keys, not ``sum kv_i``): both small beside a step's GEMMs.

Stages run one after another for a step (a pipeline with one batch in flight, as
:func:`~opcast.predict.inference.predict_infer` prices it); the LM head is priced on one row.

Speed: a learned kernel model has a large per-call cost, so :class:`PricedStepCost` asks for
every kernel of a grid of shapes in one batch (geometric, :data:`GRID_PER_OCTAVE` points per
octave above 8, up to the engine's limits and the longest request) and answers a step by linear
interpolation in that table: a few microseconds a step, however many steps.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from math import sqrt
from typing import Any

from opcast.archs import ArchSpec
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.graph import block_ops
from opcast.predict.inference import block_kinds, forward_time_s, infer_precision
from opcast.predict.parallel import InferConfig

StepCost = Callable[[Sequence[tuple[int, int]], int, int], float]
"""``step_s(prefill, decode_seqs, decode_kv_tokens)``: seconds of one step with the prefill chunks
``[(query tokens, keys seen), ...]`` and ``decode_seqs`` decoding sequences holding
``decode_kv_tokens`` keys in all."""

GRID_PER_OCTAVE = 4
"""Table points per doubling of a dimension above 8 (every integer up to 8)."""


def grid(hi: int, per_octave: int = GRID_PER_OCTAVE) -> list[int]:
    """Integers 1..8 then geometric steps of ``2 ** (1 / per_octave)`` up to and including ``hi``."""
    values = set(range(1, min(hi, 8) + 1))
    x = 8.0
    while x < hi:
        x *= 2 ** (1 / per_octave)
        values.add(min(hi, round(x)))
    values.add(max(1, hi))
    return sorted(values)


def _weights(xs: list[int], x: float) -> tuple[int, float]:
    """(i, w): ``x`` lies between ``xs[i]`` and ``xs[i + 1]`` at fraction ``w`` (extrapolating past the ends)."""
    i = bisect_left(xs, x) - 1
    i = min(max(i, 0), len(xs) - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def interp1(xs: list[int], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i, w = _weights(xs, x)
    return ys[i] + w * (ys[i + 1] - ys[i])


def interp2(xs: list[int], ys: list[int], table: list[list[float]], x: float, y: float) -> float:
    """Bilinear in ``table[i][j]`` at ``(xs[i], ys[j])``."""
    if len(xs) == 1:
        return interp1(ys, table[0], y)
    i, w = _weights(xs, x)
    return (1 - w) * interp1(ys, table[i], y) + w * interp1(ys, table[i + 1], y)


def equivalent_prefill(chunks: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """``(q_e, kv_e)``: the one causal sequence whose attention does the work of all ``chunks``
    ``[(queries, keys seen), ...]`` together (see the module docstring): ``q_e (q_e + 1) = sum q (q + 1)``
    and ``q_e (kv_e - q_e) = sum q (kv - q)``; one chunk is itself."""
    self_pairs = cross = 0
    for q, kv in chunks:
        self_pairs += q * (q + 1)
        cross += q * (kv - q)
    q_e = (sqrt(1 + 4 * self_pairs) - 1) / 2
    return q_e, q_e + cross / q_e


class _Recorder:
    """A stand-in kernel model that notes the kernels a forward asks for (answering zero), so every
    kernel of the whole table can then be priced by the real model in one batch."""

    def __init__(self) -> None:
        self.kernels: dict[Any, None] = {}

    def lookup(self, kernels, device) -> dict:
        self.kernels.update(dict.fromkeys(kernels))
        return {k: (0.0, "") for k in kernels}


class PricedStepCost:
    """Step times of ``arch`` at ``cfg`` (tp, pp, precision, attention) on ``device`` from ``kernels``
    and ``comms``, tabulated for steps of up to ``max_tokens`` tokens, ``max_seqs`` decoding
    sequences and requests of up to ``max_len`` tokens (a step beyond extrapolates linearly)."""

    def __init__(
        self,
        arch: ArchSpec,
        device,
        cfg: InferConfig,
        *,
        gpus_per_node: int,
        kernels,
        comms: CollectiveCostModel | None = None,
        max_tokens: int,
        max_seqs: int,
        max_len: int,
    ) -> None:
        if comms is None:
            from opcast.predict.comm_learned import collective_cost_for

            comms = collective_cost_for(kernels)  # the collectives predict_infer uses by default
        self.layers = arch.n_layers
        prec = infer_precision(cfg, arch, device)
        self.tokens = grid(max_tokens + max_seqs)
        self.q = grid(max_tokens)
        self.kv = grid(max_len)
        self.b = grid(max_seqs)

        kinds = block_kinds(arch)  # sliding-window blocks attend to their window (gpt-oss)

        def attention(batch: int, seq_q: int, seq_kv: int):
            """The attention kernel of each kind of block, with its count of blocks."""
            out = []
            for a, n in kinds:
                ops = block_ops(
                    a,
                    tp=cfg.tp,
                    batch=batch,
                    seq_q=seq_q,
                    seq_kv=seq_kv,
                    sp=False,
                    attention=cfg.attention,
                    training=False,
                )
                ((_, kind, params, _),) = [op for op in ops if op[0] == "attn"]
                out.append((prec.of(kind, params), n))
            return tuple(out)

        def priced(kernels_of_kinds) -> float:
            return sum(n * table[k][0] for k, n in kernels_of_kinds)

        def forward(model, t: int) -> float:
            return forward_time_s(
                arch, device, cfg, batch=1, seq_q=t, seq_kv=t, gpus_per_node=gpus_per_node, kernels=model, comms=comms
            )

        dense_attn = [attention(1, t, t) for t in self.tokens]
        prefill = [[attention(1, q, max(q, kv)) for kv in self.kv] for q in self.q]
        decode = [[attention(b, 1, kv) for kv in self.kv] for b in self.b]
        recorder = _Recorder()
        for t in self.tokens:
            forward(recorder, t)
        attn_kernels = [k for kk in (*dense_attn, *(x for row in prefill + decode for x in row)) for k, _ in kk]
        every = [*recorder.kernels, *attn_kernels]
        table = kernels.lookup(every, device)  # one batch: the learned models' per-call cost once
        self.dense_s = [forward(kernels, t) - priced(kk) for t, kk in zip(self.tokens, dense_attn)]
        self.prefill_s = [[priced(kk) for kk in row] for row in prefill]
        self.decode_s = [[priced(kk) for kk in row] for row in decode]
        self.sources = sorted({src for _, src in (table[k] for k in every)})

    def __call__(self, prefill: Sequence[tuple[int, int]], decode_seqs: int, decode_kv_tokens: int) -> float:
        tokens = decode_seqs
        t = 0.0
        if prefill:  # one chunk is exactly itself: sqrt((2q + 1)^2) is exact in floating point
            q_e, kv_e = equivalent_prefill(prefill)
            tokens += sum(q for q, _ in prefill)
            t = interp2(self.q, self.kv, self.prefill_s, q_e, kv_e)
        if decode_seqs:
            t += interp2(self.b, self.kv, self.decode_s, decode_seqs, decode_kv_tokens / decode_seqs)
        return t + interp1(self.tokens, self.dense_s, tokens)
