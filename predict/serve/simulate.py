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
3. **Batch waiting** (TensorRT-LLM's ``batch_wait_timeout_iters`` and ``batch_wait_max_tokens_ratio``:
   :attr:`~opcast.predict.serve.engine.EngineConfig.batch_wait_iters`): when prompts were admitted beside
   running decodes, they are put back at the front of the queue unless the replica has held prompts back
   ``batch_wait_iters`` steps in a row or the step's tokens reach ``batch_wait_tokens_ratio`` x
   ``max_num_batched_tokens``; the count of steps restarts when prompts go. A step without decodes never holds.

A request whose KV covers its prompt and every token it has generated emits one token at the end
of the step (the first from its prefill); it finishes with its last and frees its blocks.

**Closed loop** (a stream with ``concurrency``, :func:`~opcast.predict.serve.requests.closed_loop_stream`):
the first ``concurrency`` requests arrive at their times; each time a request finishes, the next
request not yet sent arrives ``engine.frontend_s`` later (when its client has seen the last token and
sends the next), so at most ``concurrency`` are in flight; the result's stream carries the arrival
times this gave.

**Prefix cache** (the stream's ``cached_tokens``): a request admitted without KV (new, or resumed
after a preemption) starts with its prompt's cached tokens in place (vLLM V1's scheduler asks
``KVCacheManager.get_computed_blocks`` before ``allocate_slots``): it takes blocks for them and for
its first chunk, and prefills only the uncached tokens, whose queries attend to the whole context
so far (a chunk ``(q, keys seen)`` with the cached keys counted). See
:mod:`~opcast.predict.serve.kv_cache` for what the cache holds.

**Stopping early** (:class:`StopRule`, for a search that only needs to know whether a deployment can
still matter): counts of requests that missed an SLO only grow as the run goes on, and so does the
time since the first arrival, which bounds the run's duration from below; the rule names the
counts and the rate floors past which the run's answer no longer matters, and :func:`simulate`
raises :class:`StoppedEarly` as soon as one is crossed.

**Disaggregated prefill and decode** (:class:`Split`, DistServe / Splitwise): the first
``split.prefill`` replicas only prefill, the rest only decode. Arrivals go to the prefill pool
(by the router). A request whose prefill step emits its first token leaves that replica (done
there when it wants one token) and its KV is sent to the decode replica with the fewest requests
waiting, running or in transit to it (lowest index on a tie): a prefill replica sends one KV at a
time (its links are busy until a transfer ends), each taking ``split.transfer_s`` seconds, and
holds the request's KV blocks until the transfer ends. The decode replica then queues the
request with its prompt's KV in place: admitted (with blocks for its prompt and the next token,
or its whole output under ``reserve_full_output``) it decodes one token a step; preempted there,
it recomputes on that replica as in a colocated one. A received KV that waits for free blocks is
held outside the decode replica's pool (not modelled as memory). Without a split nothing changes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from opcast.errors import OpcastError
from opcast.predict.serve.engine import EngineConfig
from opcast.predict.serve.kv_cache import FULL_ATTENTION, BlockPool, KvLayout
from opcast.predict.serve.requests import RequestStream
from opcast.predict.serve.step_cost import StepCost

Router = Literal["round_robin", "least_loaded"]
ROUTERS = ("round_robin", "least_loaded")


@dataclass(frozen=True, kw_only=True, slots=True)
class StopRule:
    """When :func:`simulate` may stop before serving every request (each limit None: never). A request
    misses the TTFT SLO when its first token comes more than ``slo_ttft_s`` after its arrival, the TPOT
    SLO when it finishes with more than ``slo_tpot_s`` per output token after the first (the tests of
    :func:`opcast.predict.serve.metrics.serve_metrics`, complemented)."""

    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    ttft_misses: int | None = None
    """Stop once this many requests missed the TTFT SLO."""
    tpot_misses: int | None = None
    """Stop once this many requests missed the TPOT SLO."""
    goodput_floor_per_s: float | None = None
    """Stop once requests not (yet) known to miss an SLO, divided by the time since the first arrival,
    fall below this: the run's goodput (over a duration at least that long) is then surely lower."""
    throughput_floor_per_s: float | None = None
    """Stop once the stream's output tokens divided by the time since the first arrival fall below
    this: the run's output tokens/s are then surely lower."""


RATE_MARGIN = 1e-9
"""Relative margin on the rate floors, so rounding in the final metrics cannot make a stopped run
the better one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """Disaggregated serving (see the module docstring): replicas ``[0, prefill)`` only prefill, the rest
    only decode."""

    prefill: int
    """Prefill replicas (the first ones); at least one, and at least one replica left to decode."""
    transfer_s: Callable[[int, int, int], float]
    """Seconds to send request ``rid``'s KV from prefill replica ``p`` to decode replica ``d``:
    ``transfer_s(rid, p, d)``."""


class StoppedEarly(Exception):
    """:func:`simulate` stopped by its :class:`StopRule` at ``at_s``: ``kind`` names the limit crossed
    (``ttft_misses``, ``tpot_misses`` or ``rate_floor``), ``reason`` says it in words."""

    def __init__(self, kind: str, reason: str, at_s: float, ttft_misses: int, tpot_misses: int, misses: int) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.at_s = at_s
        self.ttft_misses = ttft_misses
        self.tpot_misses = tpot_misses
        self.misses = misses


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
    prefill_replicas: int = 0
    """With a :class:`Split`: replicas ``[0, prefill_replicas)`` prefill, the rest decode; 0 colocated."""
    decode_replica: np.ndarray | None = None
    """With a :class:`Split`: the replica that decoded each request (-1: one output token, no decode)."""
    transfer_start_s: np.ndarray | None = None
    """With a :class:`Split`: when each request's KV transfer started (NaN: none)."""
    transfer_end_s: np.ndarray | None = None
    """With a :class:`Split`: when it ended, the request then queued on its decode replica (NaN: none)."""


def simulate(
    stream: RequestStream,
    engine: EngineConfig,
    step_s: StepCost,
    *,
    kv_blocks: int,
    kv_layout: KvLayout = FULL_ATTENTION,
    replicas: int = 1,
    router: str = "round_robin",
    stop: StopRule | None = None,
    split: Split | None = None,
) -> SimResult:
    """Serve ``stream`` on ``replicas`` replicas of ``kv_blocks`` KV pages each, a sequence holding the pages
    ``kv_layout`` says (one a block of tokens without sliding windows; see the module docstring);
    with ``stop``, raise :class:`StoppedEarly` once one of its limits is crossed; with ``split``, the
    first ``split.prefill`` replicas prefill and the others decode."""
    if replicas < 1:
        raise OpcastError(f"--replicas {replicas} must be >= 1")
    n_prefill = replicas if split is None else split.prefill
    if not 1 <= n_prefill <= replicas - (split is not None):
        raise OpcastError(
            f"--disaggregate needs >= 1 prefill and >= 1 decode replica; got {n_prefill} of {replicas} prefilling"
        )
    if router not in ROUTERS:
        raise OpcastError(f"--router {router!r} is not one of {', '.join(ROUTERS)}")
    n = len(stream)
    inp = stream.input_tokens.tolist()
    out = stream.output_tokens.tolist()
    arrival = stream.arrival_s.tolist()
    closed = stream.concurrency
    if closed is not None:  # the later arrivals are set as requests finish, in time order
        arrival = arrival[:closed] + [np.inf] * max(0, n - closed)
    next_sent = n if closed is None else min(closed, n)
    hit = [0] * n if stream.cached_tokens is None else stream.cached_tokens.tolist()  # prefix-cache hits
    bad = next((i for i in range(n) if not 0 <= hit[i] < inp[i]), None)
    if bad is not None:
        raise OpcastError(
            f"request {bad} has {hit[bad]} cached tokens of a {inp[bad]}-token prompt; give 0 to {inp[bad] - 1} "
            "(the engine computes at least the prompt's last token)"
        )
    B = engine.block_size
    longest = max(kv_layout.pages(i + o, B) for i, o in zip(inp, out))
    if longest > kv_blocks:
        raise OpcastError(
            f"a request of {max(i + o for i, o in zip(inp, out))} tokens needs {longest} KV blocks, a replica has "
            f"{kv_blocks}; give shorter requests, more memory per replica (--tp/--pp) or a smaller --block-size"
        )
    longest_prefill = max(i - h for i, h in zip(inp, hit))
    if not engine.chunked_prefill and longest_prefill > engine.max_num_batched_tokens:
        raise OpcastError(
            f"a prompt of {longest_prefill} uncached tokens exceeds --max-num-batched-tokens "
            f"{engine.max_num_batched_tokens} with chunked prefill off; turn on --chunked-prefill or raise "
            "--max-num-batched-tokens"
        )
    # Only the first n replicas of each pool can ever get a request (round robin gives request i replica i
    # when the pool is larger; least loaded takes the lowest-numbered idle one, and one of the first n is
    # idle), so the others are left out of the loops, which cost a pass over every replica per event
    # (--replicas 1e6 with 10 requests ran for minutes); ``glob`` numbers the simulated replicas as given.
    full_prefill, full = n_prefill, replicas
    n_prefill = min(n_prefill, n)
    replicas = n_prefill + min(full - full_prefill, n)
    shift = full_prefill - n_prefill

    def glob(r: int) -> int:
        return r if r < n_prefill else r + shift

    comp = [0] * n  # tokens whose KV is held
    gen = [0] * n  # tokens emitted
    held = [0] * n  # KV blocks held
    first = [np.nan] * n
    finish = [np.nan] * n
    preempt = [0] * n
    where = [0] * n
    pools = [BlockPool(kv_blocks, B, kv_layout) for _ in range(replicas)]
    pages = (lambda t: -(-t // B)) if kv_layout == FULL_ATTENTION else (lambda t: kv_layout.pages(t, B))
    waiting: list[deque[int]] = [deque() for _ in range(replicas)]
    running: list[list[int]] = [[] for _ in range(replicas)]
    load = [0] * replicas
    busy_until = [np.inf] * replicas  # end of the step in flight, inf when idle
    in_flight: list[list[int]] = [[] for _ in range(replicas)]  # requests that emit at the step's end
    steps: list[Step] = []
    max_tokens, max_seqs = engine.max_num_batched_tokens, engine.max_num_seqs
    chunked, reserve = engine.chunked_prefill, engine.reserve_full_output
    overhead = engine.overhead
    hold_iters = engine.batch_wait_iters if engine.batch_waits else 0
    hold_tokens = engine.batch_wait_tokens_ratio * max_tokens
    held_steps = [0] * replicas  # steps in a row each replica has held prompts back (batch waiting)
    watch = _Watch(stop, arrival, sum(out)) if stop is not None else None
    # Disaggregation: the tokens a request emits on each replica (prefill replicas: its first only)
    one = [1] * n
    limit = [out if split is None or r >= n_prefill else one for r in range(replicas)]
    decode_at = [-1] * n
    sent_s = [np.nan] * n
    landed_s = [np.nan] * n
    parked = [0] * n  # KV blocks a prefill replica holds until the request's transfer ends
    link_free = [0.0] * replicas  # when each prefill replica's links are free to send the next KV
    transfers: list[tuple[float, int, int, int]] = []  # (end, request, prefill replica, decode replica)

    def start_step(r: int, now: float) -> None:
        # The hot loop of the simulation: block arithmetic inlined (BlockPool.extra_for / take).
        pool, run, wait, lim = pools[r], running[r], waiting[r], limit[r]
        budget = max_tokens
        prefill: list[tuple[int, int]] = []
        decode = decode_kv = seqs = preempted = 0
        emit = []
        i = 0
        while i < len(run) and budget > 0:
            rid = run[i]
            c, total = comp[rid], inp[rid] + gen[rid]
            q = min(total - c, budget)
            extra = 0 if reserve else pages(c + q) - held[rid]
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
        new: list[tuple[int, int, int]] = []  # admitted this step: (request, its KV before, blocks taken)
        received = False  # a decode replica admitted a request whose prompt's KV it received: nothing held
        if not preempted:
            while wait and budget > 0 and len(run) < max_seqs:
                rid = wait[0]
                c, total = comp[rid] or hit[rid], inp[rid] + gen[rid]  # no KV yet: its prefix-cache hit
                if total - c <= budget:
                    q = total - c
                elif chunked or gen[rid] > 0:  # a resumed request recomputes in chunks
                    q = budget
                else:
                    break
                extra = pool.extra_for(held[rid], inp[rid] + lim[rid] if reserve else c + q)
                if extra > pool.free:
                    break
                wait.popleft()
                pool.take(extra)
                held[rid] += extra
                run.append(rid)
                if hold_iters:  # batch waiting may put it back
                    new.append((rid, comp[rid], extra))
                c += q
                comp[rid] = c
                if c == total:
                    emit.append(rid)
                if q == 1 and c == total and gen[rid] > 0:  # a decode replica's request, its prompt's KV received
                    decode += 1
                    decode_kv += c
                    received = True
                else:
                    prefill.append((q, c))
                budget -= q
                seqs += 1
        if hold_iters and new and decode and not received:
            if held_steps[r] >= hold_iters or max_tokens - budget >= hold_tokens:
                held_steps[r] = 0
            else:  # batch waiting: the admitted prompts go back to the queue's front, in order
                held_steps[r] += 1
                for rid, c0, extra in reversed(new):
                    run.pop()
                    pool.give(extra)
                    held[rid] -= extra
                    comp[rid] = c0
                    wait.appendleft(rid)
                back = {rid for rid, _, _ in new}
                emit = [rid for rid in emit if rid not in back]
                for q, _ in prefill[-len(new) :]:
                    budget += q
                del prefill[-len(new) :]
                seqs -= len(new)
        if not seqs:
            busy_until[r] = np.inf
            return
        dur = step_s(prefill, decode, decode_kv) + overhead.time_s(seqs)
        steps.append(
            Step(
                replica=glob(r),
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
        nonlocal next_sent
        done = False
        lim = limit[r]
        for rid in in_flight[r]:
            g = gen[rid] + 1
            gen[rid] = g
            if g == 1:
                first[rid] = now
                if watch is not None:
                    watch.first_token(rid, now + engine.frontend_s)  # as the client sees it
            if g == out[rid]:
                finish[rid] = now
                pools[r].give(held[rid])
                held[rid] = 0
                load[r] -= 1
                done = True
                if watch is not None:
                    watch.finished(rid, now, first[rid], g)
                if next_sent < n:  # closed loop: this request's client sends the next
                    arrival[next_sent] = now + engine.frontend_s
                    next_sent += 1
            elif g == lim[rid]:  # prefilled on a prefill replica: send its KV to a decode replica
                d = min(range(n_prefill, replicas), key=load.__getitem__)
                load[r] -= 1
                load[d] += 1
                decode_at[rid] = glob(d)
                parked[rid], held[rid] = held[rid], 0
                start = max(now, link_free[r])
                end = start + split.transfer_s(rid, r, glob(d))  # type: ignore[union-attr]  # limit < out only with a split
                link_free[r] = end
                sent_s[rid], landed_s[rid] = start, end
                heapq.heappush(transfers, (end, rid, r, d))
                done = True
        if watch is not None:
            watch.check(now)
        if done:
            running[r] = [rid for rid in running[r] if gen[rid] < lim[rid]]
        in_flight[r] = []
        start_step(r, now)

    def land(now: float) -> None:
        _, rid, p, d = heapq.heappop(transfers)
        pools[p].give(parked[rid])
        parked[rid] = 0
        waiting[d].append(rid)
        for r in (d, p):  # the decode replica has work; the prefill one may have waited for those blocks
            if busy_until[r] == np.inf:
                start_step(r, now)

    rr = 0
    a = 0
    while True:
        t_arr = arrival[a] if a < n else np.inf
        r = min(range(replicas), key=busy_until.__getitem__)
        t_end = busy_until[r]
        t_land = transfers[0][0] if transfers else np.inf
        if t_end == np.inf and t_arr == np.inf and t_land == np.inf:
            break
        if t_end <= t_arr and t_end <= t_land:
            end_step(r, t_end)
            continue
        if t_land <= t_arr:
            land(t_land)
            continue
        if router == "round_robin":
            dest, rr = rr, (rr + 1) % n_prefill
        else:
            dest = min(range(n_prefill), key=load.__getitem__)
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
        stream=stream if closed is None else replace(stream, arrival_s=np.array(arrival)),
        engine=engine,
        replicas=full,
        kv_blocks=kv_blocks,
        first_token_s=np.array(first),
        finish_s=np.array(finish),
        preemptions=np.array(preempt),
        replica=np.array(where),
        steps=steps,
        prefill_replicas=0 if split is None else full_prefill,
        decode_replica=None if split is None else np.array(decode_at),
        transfer_start_s=None if split is None else np.array(sent_s),
        transfer_end_s=None if split is None else np.array(landed_s),
    )


class _Watch:
    """The running counts of a :class:`StopRule` (see there); raises :class:`StoppedEarly`."""

    __slots__ = ("arrival", "bad", "deadline_s", "misses", "n", "rule", "start_s", "tokens", "tpot", "ttft")

    def __init__(self, rule: StopRule, arrival: list[float], tokens: int) -> None:
        self.rule = rule
        self.arrival = arrival
        self.n = len(arrival)
        self.tokens = tokens
        self.start_s = arrival[0]
        self.bad: set[int] = set()
        self.ttft = self.tpot = self.misses = 0
        self.deadline_s = np.inf
        if rule.throughput_floor_per_s:
            self.deadline_s = self._after(tokens / rule.throughput_floor_per_s)
        self._goodput_deadline()

    def _after(self, span_s: float) -> float:
        """The time past which the run's duration surely exceeds ``span_s`` (with the margin)."""
        return self.start_s + span_s * (1 + RATE_MARGIN)

    def _goodput_deadline(self) -> None:
        floor = self.rule.goodput_floor_per_s
        if floor:
            self.deadline_s = min(self.deadline_s, self._after((self.n - self.misses) / floor))

    def _miss(self, rid: int) -> None:
        if rid not in self.bad:
            self.bad.add(rid)
            self.misses += 1
            self._goodput_deadline()

    def first_token(self, rid: int, now: float) -> None:
        slo = self.rule.slo_ttft_s
        if slo is not None and now - self.arrival[rid] > slo:
            self.ttft += 1
            self._miss(rid)

    def finished(self, rid: int, now: float, first_s: float, tokens: int) -> None:
        slo = self.rule.slo_tpot_s
        if slo is not None and tokens > 1 and (now - first_s) / (tokens - 1) > slo:
            self.tpot += 1
            self._miss(rid)

    def check(self, now: float) -> None:
        """Raise once a limit is crossed; ``now`` is a step's end with requests possibly left to serve."""
        r = self.rule
        if r.ttft_misses is not None and self.ttft >= r.ttft_misses:
            kind, reason = "ttft_misses", f"{self.ttft} requests missed the TTFT SLO"
        elif r.tpot_misses is not None and self.tpot >= r.tpot_misses:
            kind, reason = "tpot_misses", f"{self.tpot} requests missed the TPOT SLO"
        elif now > self.deadline_s:  # a step ends at now, so the last request finishes at or after it
            kind, reason = "rate_floor", f"{now - self.start_s:.3g} s after the first arrival, below the rate floor"
        else:
            return
        raise StoppedEarly(kind, reason, now, self.ttft, self.tpot, self.misses)
