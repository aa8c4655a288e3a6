"""A discrete-event simulation of continuous batching on data-parallel replicas.

Events are request arrivals and step ends, taken in time order (a step end before an arrival at
the same instant). A **router** sends each arrival to a replica: ``round_robin``, or
``least_loaded`` (fewest requests waiting or running there, the lowest index on a tie). A
replica that is idle with work starts a **step** at once; the step's batch is fixed when it
starts and its tokens come out when it ends, ``step_s(batch) + overhead`` later.

One step (vLLM V1's scheduler, ``vllm/v1/core/sched/scheduler.py``):

1. Running requests in admission order each get the tokens they still need (one when decoding;
   the rest of a prompt, chunked to the remaining token budget), as long as budget remains. A
   request whose new tokens need KV blocks that are not free preempts the most recently admitted
   running request (recompute: its blocks are freed, its KV forgotten, and it goes back to the
   front of the queue), repeatedly, until the blocks are free or it preempted itself.
2. If nothing was preempted, queued requests in order are admitted while fewer than
   ``max_num_seqs`` run, budget remains and their blocks are free (``reserve_full_output``: the
   blocks of the whole prompt and output). A prompt not split (chunked prefill off) waits until
   it fits the remaining budget whole. A preempted request resumes by prefilling its prompt and
   the tokens it had generated.

A request whose KV covers its prompt and every token it has generated emits one token at the end
of the step (the first from its prefill); it finishes with its last and frees its blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opcast.errors import OpcastError
from opcast.predict.serve.engine import EngineConfig
from opcast.predict.serve.kv_cache import BlockPool, blocks_for
from opcast.predict.serve.requests import RequestStream
from opcast.predict.serve.step_cost import StepCost

Router = Literal["round_robin", "least_loaded"]
ROUTERS = ("round_robin", "least_loaded")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of one replica."""

    replica: int
    start_s: float
    duration_s: float
    prefill_tokens: int
    """Prompt (and recomputed) tokens in the step."""
    decode_seqs: int
    """Sequences decoding one token."""
    seqs: int
    """Sequences in the step (prefilling or decoding)."""
    kv_blocks_used: int
    """KV blocks held on the replica during the step."""
    preempted: int
    """Requests preempted when the step was formed."""
    tokens_out: int
    """Tokens the step emits (one per sequence whose KV then covers all its tokens)."""


@dataclass(frozen=True, slots=True)
class SimResult:
    """What happened to every request (arrays in the stream's order) and every step."""

    stream: RequestStream
    engine: EngineConfig
    replicas: int
    kv_blocks: int
    """KV blocks of each replica."""
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    steps: list[Step]


def simulate(
    stream: RequestStream,
    engine: EngineConfig,
    step_s: StepCost,
    *,
    kv_blocks: int,
    replicas: int = 1,
    router: str = "round_robin",
) -> SimResult:
    """Serve ``stream`` on ``replicas`` replicas of ``kv_blocks`` KV blocks each (see the module docstring)."""
    if replicas < 1:
        raise OpcastError(f"--replicas {replicas} must be >= 1")
    if router not in ROUTERS:
        raise OpcastError(f"--router {router!r} is not one of {', '.join(ROUTERS)}")
    n = len(stream)
    inp = stream.input_tokens.tolist()
    out = stream.output_tokens.tolist()
    arrival = stream.arrival_s.tolist()
    B = engine.block_size
    longest = max(blocks_for(i + o, B) for i, o in zip(inp, out))
    if longest > kv_blocks:
        raise OpcastError(
            f"a request of {max(i + o for i, o in zip(inp, out))} tokens needs {longest} KV blocks, a replica has "
            f"{kv_blocks}; give shorter requests, more memory per replica (--tp/--pp) or a smaller --block-size"
        )
    if not engine.chunked_prefill and max(inp) > engine.max_num_batched_tokens:
        raise OpcastError(
            f"a prompt of {max(inp)} tokens exceeds --max-num-batched-tokens {engine.max_num_batched_tokens} with "
            "chunked prefill off; turn on --chunked-prefill or raise --max-num-batched-tokens"
        )
    comp = [0] * n  # tokens whose KV is held
    gen = [0] * n  # tokens emitted
    held = [0] * n  # KV blocks held
    first = [np.nan] * n
    finish = [np.nan] * n
    preempt = [0] * n
    where = [0] * n
    pools = [BlockPool(kv_blocks, B) for _ in range(replicas)]
    waiting: list[deque[int]] = [deque() for _ in range(replicas)]
    running: list[list[int]] = [[] for _ in range(replicas)]
    load = [0] * replicas
    busy_until = [np.inf] * replicas  # end of the step in flight, inf when idle
    in_flight: list[list[int]] = [[] for _ in range(replicas)]  # requests that emit at the step's end
    steps: list[Step] = []
    max_tokens, max_seqs = engine.max_num_batched_tokens, engine.max_num_seqs
    chunked, reserve = engine.chunked_prefill, engine.reserve_full_output
    overhead = engine.overhead

    def start_step(r: int, now: float) -> None:
        # The hot loop of the simulation: block arithmetic inlined (BlockPool.extra_for / take).
        pool, run, wait = pools[r], running[r], waiting[r]
        budget = max_tokens
        prefill: list[tuple[int, int]] = []
        decode = decode_kv = seqs = preempted = 0
        emit = []
        i = 0
        while i < len(run) and budget > 0:
            rid = run[i]
            c, total = comp[rid], inp[rid] + gen[rid]
            q = min(total - c, budget)
            extra = 0 if reserve else -(-(c + q) // B) - held[rid]
            while extra > pool.free:
                victim = run.pop()
                pool.give(held[victim])
                held[victim] = comp[victim] = 0
                preempt[victim] += 1
                preempted += 1
                wait.appendleft(victim)
                if victim == rid:
                    break
            else:
                if extra > 0:
                    pool.take(extra)
                    held[rid] += extra
                c += q
                comp[rid] = c
                if c == total:
                    emit.append(rid)
                if q == 1 and c == total and gen[rid] > 0:
                    decode += 1
                    decode_kv += c
                else:
                    prefill.append((q, c))
                budget -= q
                seqs += 1
                i += 1
                continue
            break
        if not preempted:
            while wait and budget > 0 and len(run) < max_seqs:
                rid = wait[0]
                c, total = comp[rid], inp[rid] + gen[rid]
                if total - c <= budget:
                    q = total - c
                elif chunked or gen[rid] > 0:  # a resumed request recomputes in chunks
                    q = budget
                else:
                    break
                extra = pool.extra_for(held[rid], inp[rid] + out[rid] if reserve else c + q)
                if extra > pool.free:
                    break
                wait.popleft()
                pool.take(extra)
                held[rid] += extra
                run.append(rid)
                c += q
                comp[rid] = c
                if c == total:
                    emit.append(rid)
                prefill.append((q, c))
                budget -= q
                seqs += 1
        if not seqs:
            busy_until[r] = np.inf
            return
        dur = step_s(prefill, decode, decode_kv) + overhead.time_s(seqs)
        steps.append(
            Step(
                replica=r,
                start_s=now,
                duration_s=dur,
                prefill_tokens=max_tokens - budget - decode,
                decode_seqs=decode,
                kv_blocks_used=pool.used,
                seqs=seqs,
                preempted=preempted,
                tokens_out=len(emit),
            )
        )
        in_flight[r] = emit
        busy_until[r] = now + dur

    def end_step(r: int, now: float) -> None:
        done = False
        for rid in in_flight[r]:
            g = gen[rid] + 1
            gen[rid] = g
            if g == 1:
                first[rid] = now
            if g == out[rid]:
                finish[rid] = now
                pools[r].give(held[rid])
                held[rid] = 0
                load[r] -= 1
                done = True
        if done:
            running[r] = [rid for rid in running[r] if gen[rid] < out[rid]]
        in_flight[r] = []
        start_step(r, now)

    rr = 0
    a = 0
    while True:
        t_arr = arrival[a] if a < n else np.inf
        r = min(range(replicas), key=busy_until.__getitem__)
        t_end = busy_until[r]
        if t_end == np.inf and t_arr == np.inf:
            break
        if t_end <= t_arr:
            end_step(r, t_end)
            continue
        if router == "round_robin":
            dest, rr = rr, (rr + 1) % replicas
        else:
            dest = min(range(replicas), key=load.__getitem__)
        where[a] = dest
        load[dest] += 1
        waiting[dest].append(a)
        a += 1
        if busy_until[dest] == np.inf:
            start_step(dest, t_arr)
    unfinished = [i for i in range(n) if np.isnan(finish[i])]
    if unfinished:  # every request fits a replica alone, so the loop can only stop with all served
        raise RuntimeError(f"{len(unfinished)} requests never finished, e.g. {unfinished[0]}")
    return SimResult(
        stream=stream,
        engine=engine,
        replicas=replicas,
        kv_blocks=kv_blocks,
        first_token_s=np.array(first),
        finish_s=np.array(finish),
        preemptions=np.array(preempt),
        replica=np.array(where),
        steps=steps,
    )
