"""The serving simulator against closed-form queueing, hand-worked schedules and its invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.predict.serve.engine import EngineConfig, StepOverhead
from opcast.predict.serve.requests import Lengths, RequestStream, poisson_stream
from opcast.predict.serve.simulate import simulate

NO_OVERHEAD = StepOverhead(fixed_s=0.0, per_seq_s=0.0, source="none (test)")


def _engine(**kw) -> EngineConfig:
    return EngineConfig(**{"overhead": NO_OVERHEAD, "max_num_batched_tokens": 100, **kw})


def _constant(seconds: float):
    return lambda prefill, decode_seqs, decode_kv: seconds


def _stream(arrivals, inputs, outputs) -> RequestStream:
    return RequestStream(
        arrival_s=np.asarray(arrivals, dtype=float),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        source="test",
    )


@pytest.mark.parametrize(
    ("rho", "input_tokens", "output_tokens", "steps_per_request"),
    [
        (0.5, 1, 1, 1),  # one prefill step emits the only token
        (0.6, 100, 4, 2 + 3),  # a prompt in two chunks of 50, then three decode steps
    ],
)
def test_one_request_at_a_time_reproduces_md1_waiting_time(rho, input_tokens, output_tokens, steps_per_request):
    """M/D/1: Poisson arrivals at lambda, a fixed service time D = 1/mu, one server. The mean wait in
    queue is rho / (2 mu (1 - rho)) (Pollaczek-Khinchine with zero service variance)."""
    step_s = 0.01
    service_s = steps_per_request * step_s
    mu = 1 / service_s
    n = 100_000 if steps_per_request == 1 else 60_000  # seeds 1-5 land within 2.2 % of the formula
    fixed_in, fixed_out = Lengths("fixed", input_tokens, input_tokens), Lengths("fixed", output_tokens, output_tokens)
    stream = poisson_stream(rate_per_s=rho * mu, num_requests=n, input_len=fixed_in, output_len=fixed_out, seed=1)
    engine = _engine(max_num_seqs=1, max_num_batched_tokens=50)
    sim = simulate(stream, engine, _constant(step_s), kv_blocks=10**6)
    # the first token comes after the prefill steps; the wait is the time before the first step
    prefill_s = -(-input_tokens // 50) * step_s
    wait = sim.first_token_s - stream.arrival_s - prefill_s
    assert np.allclose(sim.finish_s - sim.first_token_s, (output_tokens - 1) * step_s)
    assert wait.min() > -1e-9
    expected = rho / (2 * mu * (1 - rho))
    assert wait.mean() == pytest.approx(expected, rel=0.04)


def test_hand_worked_schedule_with_a_preemption_by_recompute():
    """4 blocks of 4 tokens, two requests of 6 prompt + 5 output tokens at t = 0, each step 1 s.
    A prefills in [0, 1]; B joins in step 2; in step 4 A's 9th token needs a third block, so B
    (admitted last) is preempted; A finishes at 5; B recomputes its 6 + 2 tokens in step 6
    (emitting its 3rd token at 6) and finishes at 8."""
    stream = _stream([0.0, 0.0], [6, 6], [5, 5])
    sim = simulate(stream, _engine(max_num_seqs=2, block_size=4), _constant(1.0), kv_blocks=4)
    assert sim.first_token_s.tolist() == [1.0, 2.0]
    assert sim.finish_s.tolist() == [5.0, 8.0]
    assert sim.preemptions.tolist() == [0, 1]
    assert [s.kv_blocks_used for s in sim.steps] == [2, 4, 4, 3, 3, 2, 3, 3]
    assert [s.prefill_tokens for s in sim.steps] == [6, 6, 0, 0, 0, 8, 0, 0]
    assert [s.preempted for s in sim.steps] == [0, 0, 0, 1, 0, 0, 0, 0]


def test_reserving_the_whole_output_never_preempts():
    """TensorRT-LLM's guaranteed-no-evict: A reserves ceil(11/4) = 3 of 4 blocks, so B waits for A
    to finish at 5, then prefills [5, 6] and decodes four steps to 10."""
    stream = _stream([0.0, 0.0], [6, 6], [5, 5])
    engine = _engine(max_num_seqs=2, block_size=4, reserve_full_output=True)
    sim = simulate(stream, engine, _constant(1.0), kv_blocks=4)
    assert sim.first_token_s.tolist() == [1.0, 6.0]
    assert sim.finish_s.tolist() == [5.0, 10.0]
    assert sim.preemptions.sum() == 0


def _busy_stream(seed: int) -> RequestStream:
    return poisson_stream(
        rate_per_s=150.0,
        num_requests=400,
        input_len=Lengths("uniform", 1, 300),
        output_len=Lengths("uniform", 1, 60),
        seed=seed,
    )


def _cost(prefill, decode_seqs, decode_kv):
    return 1e-3 + 2e-5 * (sum(q for q, _ in prefill) + decode_seqs) + 1e-8 * (decode_kv + sum(kv for _, kv in prefill))


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize(("replicas", "router"), [(1, "round_robin"), (3, "least_loaded"), (2, "round_robin")])
def test_requests_and_tokens_are_conserved_and_limits_hold(chunked, replicas, router):
    stream = _busy_stream(seed=3)
    engine = _engine(max_num_seqs=12, max_num_batched_tokens=320, block_size=16, chunked_prefill=chunked)
    blocks = 40  # 640 tokens: room for two or three requests, so preemption happens
    sim = simulate(stream, engine, _cost, kv_blocks=blocks, replicas=replicas, router=router)
    assert np.isfinite(sim.finish_s).all()
    assert (stream.arrival_s <= sim.first_token_s).all() and (sim.first_token_s <= sim.finish_s).all()
    assert sum(s.tokens_out for s in sim.steps) == stream.output_tokens.sum()
    assert sim.preemptions.sum() > 0
    for s in sim.steps:
        assert s.prefill_tokens + s.decode_seqs <= engine.max_num_batched_tokens
        assert 1 <= s.seqs <= engine.max_num_seqs
        assert s.kv_blocks_used <= blocks
    for r in range(replicas):  # one step at a time per replica
        mine = [s for s in sim.steps if s.replica == r]
        assert all(b.start_s >= a.start_s + a.duration_s - 1e-12 for a, b in itertools.pairwise(mine))
    assert np.bincount(sim.replica, minlength=replicas).sum() == len(stream)
    if router == "round_robin":
        assert sim.replica.tolist() == [i % replicas for i in range(len(stream))]


def test_same_seed_same_result_other_seed_other_result():
    engine = _engine(max_num_seqs=8, max_num_batched_tokens=256)
    a = simulate(_busy_stream(seed=7), engine, _cost, kv_blocks=60, replicas=2, router="least_loaded")
    b = simulate(_busy_stream(seed=7), engine, _cost, kv_blocks=60, replicas=2, router="least_loaded")
    c = simulate(_busy_stream(seed=8), engine, _cost, kv_blocks=60, replicas=2, router="least_loaded")
    assert np.array_equal(a.finish_s, b.finish_s) and np.array_equal(a.replica, b.replica)
    assert a.steps == b.steps
    assert not np.array_equal(a.finish_s, c.finish_s)


def test_requests_that_cannot_run_are_refused_in_one_line():
    stream = _stream([0.0], [60], [10])
    with pytest.raises(OpcastError, match="needs 5 KV blocks, a replica has 4"):
        simulate(stream, _engine(block_size=16), _constant(1.0), kv_blocks=4)
    with pytest.raises(OpcastError, match="chunked prefill off"):
        simulate(stream, _engine(max_num_batched_tokens=50, chunked_prefill=False), _constant(1.0), kv_blocks=100)
    with pytest.raises(OpcastError, match="--replicas 0"):
        simulate(stream, _engine(), _constant(1.0), kv_blocks=100, replicas=0)


@pytest.mark.parametrize("router", ["round_robin", "least_loaded"])
def test_replicas_past_the_requests_are_not_simulated_and_change_nothing(router):
    # every event passed over every replica: --replicas 1e6 with 10 requests ran for minutes
    from opcast.predict.serve.simulate import Split

    stream = _stream([0.0, 0.0, 0.001, 0.002, 0.002], [30, 5, 40, 8, 12], [3, 6, 1, 4, 2])
    engine = _engine(max_num_seqs=4, max_num_batched_tokens=64, block_size=4)

    def same(a, b) -> None:
        assert a.steps == b.steps and a.replica.tolist() == b.replica.tolist()
        assert np.array_equal(a.first_token_s, b.first_token_s) and np.array_equal(a.finish_s, b.finish_s)

    big = simulate(stream, engine, _cost, kv_blocks=100, replicas=10**6, router=router)
    assert big.replicas == 10**6
    same(big, simulate(stream, engine, _cost, kv_blocks=100, replicas=5, router=router))
    # a split of two pools of 10**6: the decode replicas keep their numbers (in transfer_s, steps and results)
    sent: list[tuple[int, int]] = []

    def transfer_s(rid: int, p: int, d: int) -> float:
        sent.append((p, d))
        return 1e-4

    split = simulate(
        stream, engine, _cost, kv_blocks=100, replicas=2 * 10**6, router=router,
        split=Split(prefill=10**6, transfer_s=transfer_s),
    )  # fmt: skip
    assert split.replicas == 2 * 10**6 and split.prefill_replicas == 10**6
    assert sent and all(p < 5 and 10**6 <= d < 10**6 + 5 for p, d in sent)
    assert {s.replica for s in split.steps} <= set(range(5)) | set(range(10**6, 10**6 + 5))
    decoded = split.decode_replica[split.decode_replica >= 0]
    assert len(decoded) and ((decoded >= 10**6) & (decoded < 10**6 + 5)).all()
    small = simulate(
        stream, engine, _cost, kv_blocks=100, replicas=10, router=router, split=Split(prefill=5, transfer_s=transfer_s)
    )
    assert [s.start_s for s in small.steps] == [s.start_s for s in split.steps]
    assert np.array_equal(small.finish_s, split.finish_s)


def _closed(concurrency: int, inputs, outputs) -> RequestStream:
    n = len(inputs)
    arrivals = np.full(n, np.nan)
    arrivals[:concurrency] = 0.0
    return RequestStream(
        arrival_s=arrivals,
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        source="test",
        concurrency=concurrency,
    )


def test_one_closed_loop_client_sends_each_request_when_it_sees_the_last_finish():
    """One client, 1-token prompts of 3 output tokens, steps of 1 s, a 0.25 s front end: each request takes
    three steps (prefill emits the first token) and the next is sent 0.25 s after it finished."""
    stream = _closed(1, [1] * 4, [3] * 4)
    sim = simulate(stream, _engine(max_num_seqs=8, frontend_s=0.25), _constant(1.0), kv_blocks=100)
    assert sim.stream.arrival_s.tolist() == [0.0, 3.25, 6.5, 9.75]
    assert sim.finish_s.tolist() == [3.0, 6.25, 9.5, 12.75]
    assert sim.first_token_s.tolist() == [1.0, 4.25, 7.5, 10.75]
    assert np.isnan(stream.arrival_s[1:]).all()  # the given stream is not changed


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_closed_loop_keeps_its_clients_busy_and_never_more(replicas):
    rng = np.random.default_rng(5)
    n, c = 300, 12
    stream = _closed(c, rng.integers(1, 300, n), rng.integers(1, 60, n))
    engine = _engine(max_num_seqs=32, max_num_batched_tokens=320, block_size=16, frontend_s=0.002)
    sim = simulate(stream, engine, _cost, kv_blocks=40, replicas=replicas)
    arrival = sim.stream.arrival_s
    assert np.isfinite(arrival).all() and np.isfinite(sim.finish_s).all()
    assert sum(s.tokens_out for s in sim.steps) == stream.output_tokens.sum()
    assert sim.preemptions.sum() > 0  # the KV cache is tight: requests wait and are preempted, still c in flight
    # request i >= c is sent when the (i - c)-th finish is seen
    assert np.allclose(arrival[c:], np.sort(sim.finish_s)[: n - c] + engine.frontend_s)
    for t in np.sort(np.concatenate([arrival, sim.finish_s])):
        assert ((arrival <= t) & (t < sim.finish_s)).sum() <= c


def test_a_closed_loop_of_every_request_is_a_burst_at_time_zero():
    inputs, outputs = [40, 7, 90, 15, 60], [5, 9, 2, 7, 3]
    burst = simulate(_stream([0.0] * 5, inputs, outputs), _engine(max_num_seqs=3), _cost, kv_blocks=100)
    closed = simulate(_closed(5, inputs, outputs), _engine(max_num_seqs=3), _cost, kv_blocks=100)
    assert closed.finish_s.tolist() == burst.finish_s.tolist()
    assert closed.first_token_s.tolist() == burst.first_token_s.tolist()


def _trtllm(**kw) -> EngineConfig:
    return _engine(engine="trtllm", chunked_prefill=False, max_num_seqs=8, **kw)


def test_batch_waiting_holds_a_prompt_beside_decodes_for_its_steps_then_lets_it_go():
    """TensorRT-LLM's batch waiting, 2 steps, ratio 0.9 of 100 tokens, steps of 1 s. A (10 + 6 tokens) prefills
    alone in [0, 1] (no decodes: never held). B (10 + 2) arrives at 1.5: its 10 tokens beside A's decode are 11 < 90,
    so steps [2, 3] and [3, 4] hold it; in [4, 5] the count is 2 and it goes (first token at 5, done at 6)."""
    stream = _stream([0.0, 1.5], [10, 10], [6, 2])
    sim = simulate(stream, _trtllm(batch_wait_iters=2, batch_wait_tokens_ratio=0.9), _constant(1.0), kv_blocks=100)
    assert sim.first_token_s.tolist() == [1.0, 5.0]
    assert sim.finish_s.tolist() == [6.0, 6.0]
    assert [s.prefill_tokens for s in sim.steps] == [10, 0, 0, 0, 10, 0]
    assert [s.seqs for s in sim.steps] == [1, 1, 1, 1, 2, 2]
    plain = simulate(stream, _trtllm(), _constant(1.0), kv_blocks=100)
    assert plain.first_token_s.tolist() == [1.0, 3.0]  # without waiting B prefills in [2, 3]


def test_batch_waiting_lets_prompts_go_at_the_token_ratio_and_needs_both_settings():
    """B's 95 tokens beside A's decode reach 0.9 x 100 at once: not held. Either setting alone holds nothing
    (the engine's test, steps >= iters or tokens >= ratio x budget, is true at 0)."""
    big = _stream([0.0, 1.5], [10, 95], [6, 2])
    sim = simulate(big, _trtllm(batch_wait_iters=2, batch_wait_tokens_ratio=0.9), _constant(1.0), kv_blocks=100)
    assert sim.first_token_s.tolist() == [1.0, 3.0]
    small = _stream([0.0, 1.5], [10, 10], [6, 2])
    plain = simulate(small, _trtllm(), _constant(1.0), kv_blocks=100)
    for one in ({"batch_wait_iters": 5}, {"batch_wait_tokens_ratio": 0.9}):
        sim = simulate(small, _trtllm(**one), _constant(1.0), kv_blocks=100)
        assert sim.first_token_s.tolist() == plain.first_token_s.tolist()


def test_batch_waiting_batches_held_prompts_and_conserves_requests_and_tokens():
    """A closed loop of 6 clients under waiting: every request and token served, the KV freed, and prompts
    go in bigger groups than without it."""
    rng = np.random.default_rng(3)
    n, c = 120, 6
    stream = _closed(c, rng.integers(20, 60, n), rng.integers(5, 40, n))
    waits = _trtllm(max_num_batched_tokens=400, batch_wait_iters=6, batch_wait_tokens_ratio=0.5)
    sim = simulate(stream, waits, _cost, kv_blocks=10**4)
    plain = simulate(stream, _trtllm(max_num_batched_tokens=400), _cost, kv_blocks=10**4)
    assert np.isfinite(sim.finish_s).all()
    assert sum(s.tokens_out for s in sim.steps) == stream.output_tokens.sum()
    assert sum(s.prefill_tokens for s in sim.steps) == stream.input_tokens.sum()
    prompt_steps = [s for s in sim.steps if s.prefill_tokens]
    assert len(prompt_steps) < sum(1 for s in plain.steps if s.prefill_tokens)
    assert (sim.first_token_s - sim.stream.arrival_s).mean() > (plain.first_token_s - plain.stream.arrival_s).mean()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_batch_waiting_is_refused_for_engines_without_it(engine):
    with pytest.raises(OpcastError, match="TensorRT-LLM's"):
        EngineConfig(engine=engine, batch_wait_iters=20, batch_wait_tokens_ratio=0.9)
    with pytest.raises(OpcastError, match=r"batch_wait_tokens_ratio 1\.5"):
        EngineConfig(engine="trtllm", batch_wait_tokens_ratio=1.5)
