"""The KV cache of one replica: how many blocks fit beside the weights, and who holds them.

Capacity, per GPU of the fullest pipeline stage (:func:`kv_capacity`): the engine may use
``gpu_memory_utilization`` of the GPU's memory (TensorRT-LLM: of what is left after the weights);
from it go the weights and the prefill working set of a full token budget, both from opcast's
inference memory model (:func:`opcast.predict.inference.infer_memory`); the rest holds
``floor(rest / (block_size x KV bytes per token))`` blocks, the KV bytes per token being that
model's ``2 k d B L / pp`` (:func:`opcast.predict.memory.kv_cache_bytes`). vLLM's own accounting
(:mod:`opcast.predict.serve.vllm_memory`): its stored layout of weight-only experts (gpt-oss's padded MXFP4)
and the peak of its profiling run, the sampler's logits over ``min(max_num_seqs, max_num_batched_tokens)``
rows included. Not counted: the CUDA context and CUDA graphs (vLLM does not subtract them either), the
memory outside torch that vLLM measures at start-up (NCCL, attention backends), allocator slack.

Blocks (:class:`BlockPool`): a sequence holding ``t`` tokens of KV holds ``ceil(t / block_size)``
blocks; growing takes new blocks from the free pool, finishing or preemption returns them all.

Sliding-window blocks (gpt-oss, :attr:`opcast.archs.ArchSpec.sliding_window`): vLLM's hybrid KV cache manager
(``vllm/v1/core/kv_cache_coordinator.py``, ``HybridKVCacheCoordinator``; ``single_type_kv_cache_manager.py``,
``SlidingWindowManager``) groups the layers of each attention type into groups of ``g`` layers (``g`` dividing
both counts) whose pages share one pool; a full-attention group holds ``ceil(t / block_size)`` pages of a
sequence, a sliding-window group only the pages of its last ``W - 1`` tokens and the current one,
``min(ceil(t / block_size), ceil((W - 1) / block_size) + 1)``. :class:`KvLayout` counts a sequence's pages so,
in pages of ``g`` layers; an arch without windows has one group of all its layers, a page being a block.

Prefix cache (:func:`prefix_hit_tokens`): a request whose prompt begins with tokens already cached
holds their blocks from its admission, like blocks it computed (vLLM V1 takes a hit's blocks out
of the free queue, ``KVCacheManager.allocate_slots``), so a hit saves compute, not memory: the
KV a request holds is always its whole context. Cached blocks no running request holds are free
(evictable) memory here, and a hit is assumed to survive until its request is admitted (no
eviction modelled); a preempted request finds the same hit again when it resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from opcast.archs import ArchSpec
from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.predict.graph import precision_of
from opcast.predict.inference import infer_memory
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import EngineConfig
from opcast.predict.serve.vllm_memory import sampler_peak_bytes, vllm_expert_layout

GIB = 2**30


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens of KV: ``ceil(tokens / block_size)``."""
    return -(-tokens // block_size)


def hit_fraction_problem(fraction: float) -> str | None:
    """Why ``fraction`` is not a prefix-cache hit fraction (``--prefix-cache-hit``), or None."""
    if math.isfinite(fraction) and 0 <= fraction <= 1:
        return None
    return f"--prefix-cache-hit {fraction} must be a fraction of each prompt in [0, 1], e.g. 1 or 0.5"


def prefix_hit_tokens(prompt_tokens: np.ndarray, fraction: float, block_size: int) -> np.ndarray:
    """Tokens of each prompt a prefix-cache hit covers when its first ``fraction`` is cached: whole
    blocks only, and never the last prompt token, ``block_size * floor(min(fraction * n, n - 1) / block_size)``.

    vLLM V1 (``vllm/v1/core/kv_cache_manager.py``, ``KVCacheManager.get_computed_blocks``): a hit is
    made of full blocks, and it is capped at ``num_tokens - 1`` because the last token must be
    recomputed for its logits, which with block alignment recomputes the whole last block (a prompt
    of ``n`` tokens fully cached in blocks of 16 recomputes ``n - 16 floor((n - 1) / 16)``, 1 to 16
    tokens). SGLang's radix cache (blocks of 1) likewise leaves at least the last token."""
    problem = hit_fraction_problem(fraction)
    if problem:
        raise OpcastError(problem)
    if block_size < 1:
        raise OpcastError(f"block size {block_size} must be >= 1")
    n = np.asarray(prompt_tokens, dtype=np.int64)
    covered = np.minimum(np.floor(fraction * n).astype(np.int64), n - 1)
    return block_size * (covered // block_size)


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How many pages a sequence holds (see the module docstring): ``full`` pages of each block of tokens and
    ``window`` pages of each of its last ``window_blocks`` blocks."""

    full: int = 1
    window: int = 0
    window_blocks: int = 0

    def pages(self, tokens: int, block_size: int) -> int:
        """Pages a sequence of ``tokens`` tokens holds."""
        blocks = -(-tokens // block_size)
        if not self.window:
            return self.full * blocks
        return self.full * blocks + self.window * min(blocks, self.window_blocks)


FULL_ATTENTION = KvLayout()
"""The layout of an arch without sliding windows: a page is a block of tokens of every layer."""


def kv_layout(arch: ArchSpec, block_size: int) -> tuple[KvLayout, int]:
    """(:class:`KvLayout`, layers of a page) of ``arch``: one group of all its layers, or its full and windowed
    layers in groups of ``gcd`` of the two counts (gpt-oss-120b: 18 and 18, pages of 18 layers, one each)."""
    windowed = arch.windowed_layers
    if not windowed or arch.sliding_window is None:
        return FULL_ATTENTION, arch.n_layers
    g = math.gcd(arch.n_layers - windowed, windowed)
    reach = -(-(arch.sliding_window - 1) // block_size) + 1
    return KvLayout(full=(arch.n_layers - windowed) // g, window=windowed // g, window_blocks=reach), g


@dataclass(frozen=True, kw_only=True, slots=True)
class KvCapacity:
    """The KV cache one replica gets (per GPU of its fullest stage), in pages (:class:`KvLayout`; a block of
    tokens of every layer when the arch has no sliding window)."""

    blocks: int
    """Pages."""
    block_size: int
    kv_bytes_per_token: float
    """KV bytes of one token on one GPU (all its layers, as if none were windowed)."""
    layout: KvLayout = FULL_ATTENTION
    page_bytes: float = 0.0
    """Bytes of one page on one GPU (``block_size x kv_bytes_per_token`` without windows)."""
    weights_bytes: float
    activations_bytes: float
    """Prefill working set of one full token budget (vLLM: the peak of its profiling run, sampler included)."""
    usable_bytes: float
    """The engine's share of the GPU's memory."""

    @property
    def tokens(self) -> int:
        """Tokens of context the pages hold: of one long sequence's full-attention layers when some are windowed
        (their windowed pages aside)."""
        lay = self.layout
        if not lay.window:
            return self.blocks // lay.full * self.block_size
        if not lay.full:  # every layer windowed (Mistral-7B-v0.1): a page per block of the window, none beyond
            return self.blocks // lay.window * self.block_size
        return max(0, self.blocks - lay.window * lay.window_blocks) // lay.full * self.block_size

    @property
    def kv_bytes(self) -> float:
        return self.blocks * self.page_bytes

    def pages(self, tokens: int) -> int:
        """Pages a sequence of ``tokens`` tokens holds."""
        return self.layout.pages(tokens, self.block_size)


def kv_capacity(arch: ArchSpec, device, cfg: InferConfig, engine: EngineConfig, *, longest_tokens: int) -> KvCapacity:
    """The KV blocks of one replica of ``arch`` at ``cfg``'s tp/pp/precision on ``device``, or an
    :class:`OpcastError` saying by how much it falls short of the weights, the working set and
    the longest request (``longest_tokens`` = its prompt plus output).

    vLLM (:mod:`opcast.predict.serve.vllm_memory`): the weights as it stores them (weight-only experts padded)
    and the peak of its profiling run, the larger of the forward's working set and the sampler's."""
    budget = engine.max_num_batched_tokens
    vllm = engine.engine == "vllm"
    experts = vllm_expert_layout(arch, device) if vllm else None
    one_step = replace(cfg, batch=1, prompt_len=budget, gen_len=1)
    mem = infer_memory(arch, one_step, experts=experts)
    unwindowed = replace(arch, sliding_window=None, sliding_window_layers=None)
    tokens_of_every_layer = infer_memory(unwindowed, one_step).kv_cache_bytes
    per_token = tokens_of_every_layer / (budget + 1)
    layout, page_layers = kv_layout(arch, engine.block_size)
    page_bytes = engine.block_size * per_token * page_layers / arch.n_layers
    peak = mem.activations_bytes
    if vllm:  # profile_run's sampler over min(max_num_seqs, tokens) rows, the forward's output still held
        rows = min(engine.max_num_seqs, budget)
        act_b = dtype_bytes(precision_of(cfg.precision, cfg.tensor_cores).act)
        peak = max(peak, sampler_peak_bytes(arch, device, rows=rows, tokens=budget, act_bytes=act_b))
    fixed = mem.weights_bytes + peak
    if engine.memory_fraction_of_free:
        usable = engine.gpu_memory_utilization * max(0.0, device.mem_bytes - fixed) + fixed
    else:
        usable = engine.gpu_memory_utilization * device.mem_bytes
    blocks = int(max(0.0, usable - fixed) // page_bytes)
    cap = KvCapacity(
        blocks=blocks,
        block_size=engine.block_size,
        kv_bytes_per_token=per_token,
        layout=layout,
        page_bytes=page_bytes,
        weights_bytes=mem.weights_bytes,
        activations_bytes=peak,
        usable_bytes=usable,
    )
    where = f"tp={cfg.tp} pp={cfg.pp} on {device.name} ({device.mem_bytes / GIB:.0f} GiB)"
    fix = "use more --tp/--pp, a GPU with more memory, a lower --precision or a smaller --max-num-batched-tokens"
    if usable <= fixed:
        raise OpcastError(
            f"{arch.name} does not fit in memory at {where}: weights {mem.weights_bytes / GIB:.1f} GiB + prefill "
            f"working set {peak / GIB:.1f} GiB exceed {engine.gpu_memory_utilization:g} of the GPU "
            f"({usable / GIB:.1f} GiB) by {(fixed - usable) / GIB:.1f} GiB, leaving nothing for the KV cache; {fix}"
        )
    need = cap.pages(longest_tokens)
    if blocks < need:
        short = (need - blocks) * page_bytes
        raise OpcastError(
            f"the KV cache of {arch.name} at {where} holds {cap.tokens} tokens, but the longest request needs "
            f"{longest_tokens} ({short / GIB:.2f} GiB more); {fix}, or shorter requests"
        )
    return cap


class BlockPool:
    """Free and held KV pages of one replica (counts only; which physical page is irrelevant to time)."""

    __slots__ = ("block_size", "free", "layout", "total")

    def __init__(self, total: int, block_size: int, layout: KvLayout = FULL_ATTENTION) -> None:
        self.total = total
        self.block_size = block_size
        self.layout = layout
        self.free = total

    def pages(self, tokens: int) -> int:
        """Pages a sequence of ``tokens`` tokens holds (:class:`KvLayout`)."""
        return self.layout.pages(tokens, self.block_size)

    def extra_for(self, held: int, tokens: int) -> int:
        """New pages a sequence holding ``held`` pages needs to hold ``tokens`` tokens."""
        return max(0, self.pages(tokens) - held)

    def take(self, n: int) -> None:
        if n > self.free:
            raise RuntimeError(f"took {n} KV blocks with {self.free} free")  # the scheduler checks first
        self.free -= n

    def give(self, n: int) -> None:
        if self.free + n > self.total:
            raise RuntimeError(f"{self.free + n} free KV blocks of {self.total}: a block returned twice")
        self.free += n

    @property
    def used(self) -> int:
        return self.total - self.free
