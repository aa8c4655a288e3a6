"""Disaggregated prefill / decode serving: conservation, a hand-worked request, the KV transfer's bytes
and links, and the colocated limit (a free link and a replica per request)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.comm import Collective
from opcast.predict.cost import load_kernel_cost
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.disagg import (
    INTER,
    INTRA,
    KvTransfer,
    parse_disaggregate,
    predict_serve_disagg,
    same_node,
)
from opcast.predict.serve.engine import EngineConfig, StepOverhead
from opcast.predict.serve.requests import Lengths, RequestStream, poisson_stream
from opcast.predict.serve.simulate import Split, simulate

NO_OVERHEAD = StepOverhead(fixed_s=0.0, per_seq_s=0.0, source="none (test)")


def _engine(**kw) -> EngineConfig:
    return EngineConfig(**{"overhead": NO_OVERHEAD, "max_num_batched_tokens": 64, **kw})


def _stream(arrivals, inputs, outputs) -> RequestStream:
    return RequestStream(
        arrival_s=np.asarray(arrivals, dtype=float),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        source="test",
    )


def _linear(prefill, decode_seqs, decode_kv):
    """A stub step price that grows with every input the real one takes."""
    return 1e-3 + sum(2e-5 * q + 1e-8 * q * kv for q, kv in prefill) + 5e-5 * decode_seqs + 1e-7 * decode_kv


def _random_stream(n: int, seed: int, rate: float = 200.0) -> RequestStream:
    return poisson_stream(
        rate_per_s=rate,
        num_requests=n,
        input_len=Lengths("uniform", 1, 150),
        output_len=Lengths("uniform", 1, 40),
        seed=seed,
    )


@pytest.mark.parametrize(("prefill", "decode", "kv_blocks"), [(1, 1, 10**6), (2, 3, 10**6), (2, 2, 14)])
def test_every_request_is_prefilled_once_transferred_once_and_decoded_to_its_length(prefill, decode, kv_blocks):
    stream = _random_stream(300, seed=prefill + decode)
    inp, out = stream.input_tokens, stream.output_tokens
    moved: list[tuple[int, int, int]] = []

    def transfer_s(rid, p, d):
        moved.append((rid, p, d))
        return 2e-4

    sim = simulate(
        stream,
        _engine(block_size=16),
        _linear,
        kv_blocks=kv_blocks,
        replicas=prefill + decode,
        router="least_loaded",
        split=Split(prefill=prefill, transfer_s=transfer_s),
    )
    assert not np.isnan(sim.finish_s).any() and (sim.finish_s >= sim.first_token_s).all()
    assert sum(st.tokens_out for st in sim.steps) == out.sum()  # every token emitted once
    many = out > 1
    # one transfer for each request with a token to decode, none for the others
    assert sorted(r for r, _, _ in moved) == np.flatnonzero(many).tolist()
    assert ((sim.decode_replica >= prefill) == many).all() and (sim.decode_replica[~many] == -1).all()
    assert ((sim.replica >= 0) & (sim.replica < prefill)).all()
    for rid, p, d in moved:
        assert sim.replica[rid] == p and sim.decode_replica[rid] == d
    assert np.isnan(sim.transfer_start_s[~many]).all()
    assert (sim.transfer_start_s[many] >= sim.first_token_s[many]).all()
    assert np.allclose(sim.transfer_end_s[many] - sim.transfer_start_s[many], 2e-4)
    assert (sim.finish_s[many] > sim.transfer_end_s[many]).all()
    # prefill replicas never decode; without preemption they prefill each prompt once, decode replicas only decode
    on_prefill = [st for st in sim.steps if st.replica < prefill]
    on_decode = [st for st in sim.steps if st.replica >= prefill]
    assert all(st.decode_seqs == 0 for st in on_prefill)
    assert sum(st.tokens_out for st in on_prefill) == len(stream)  # each request's first token
    if sim.preemptions.sum() == 0:
        assert sum(st.prefill_tokens for st in on_prefill) == inp.sum()
        assert all(st.prefill_tokens == 0 for st in on_decode)
        assert sum(st.decode_seqs for st in on_decode) == (out - 1).sum()
    else:  # a preempted request recomputes its prompt and tokens on the replica that held it
        assert kv_blocks == 14 and sum(st.prefill_tokens for st in sim.steps) > inp.sum()
    for st in sim.steps:
        assert 0 <= st.kv_blocks_used <= kv_blocks


def test_small_kv_pools_preempt_yet_conserve():
    stream = _random_stream(300, seed=5)
    sim = simulate(
        stream,
        _engine(block_size=16),
        _linear,
        kv_blocks=14,
        replicas=4,
        router="least_loaded",
        split=Split(prefill=2, transfer_s=lambda rid, p, d: 2e-4),
    )
    assert sim.preemptions.sum() > 0  # the case the conservation test's last parameters reach
    assert sum(st.tokens_out for st in sim.steps) == stream.output_tokens.sum()


def test_one_request_by_hand():
    """Prefill 10 ms, the KV's transfer 5 ms, each decode step 2 ms: the first token comes with the
    prefill (TTFT 10 ms); the other 4 of its 5 tokens one decode step each after the KV lands."""

    def step_s(prefill, decode_seqs, decode_kv):
        assert not (prefill and decode_seqs), "a disaggregated step is prefill-only or decode-only"
        return 0.010 if prefill else 0.002

    stream = _stream([1.0], [100], [5])
    sim = simulate(
        stream,
        _engine(max_num_batched_tokens=128),
        step_s,
        kv_blocks=100,
        replicas=2,
        split=Split(prefill=1, transfer_s=lambda rid, p, d: 0.005),
    )
    assert sim.first_token_s[0] - 1.0 == pytest.approx(0.010)
    assert sim.transfer_start_s[0] == pytest.approx(1.010) and sim.transfer_end_s[0] == pytest.approx(1.015)
    assert sim.finish_s[0] - 1.0 == pytest.approx(0.010 + 0.005 + 4 * 0.002)
    assert [(st.replica, st.prefill_tokens, st.decode_seqs) for st in sim.steps] == [(0, 100, 0)] + [(1, 0, 1)] * 4


def test_a_prefill_replica_sends_one_kv_at_a_time_and_holds_its_blocks_until_sent():
    """Prefill 10 ms a step, transfer 15 ms: the first prompt (in the first step, as the second arrives
    after it started) leaves at 10 ms and lands at 25 ms; the second, prefilled by 20 ms, waits for the
    link until 25 ms and lands at 40 ms."""
    stream = _stream([0.0, 0.0], [40, 40], [2, 2])
    sim = simulate(
        stream,
        _engine(max_num_batched_tokens=128, block_size=8),
        lambda prefill, d, kv: 0.010 if prefill else 0.002,
        kv_blocks=10,
        replicas=3,
        split=Split(prefill=1, transfer_s=lambda rid, p, d: 0.015),
    )
    assert sim.first_token_s.tolist() == pytest.approx([0.010, 0.020])
    assert sim.transfer_start_s.tolist() == pytest.approx([0.010, 0.025])
    assert sim.transfer_end_s.tolist() == pytest.approx([0.025, 0.040])
    assert sim.decode_replica.tolist() == [1, 2]  # chosen at hand-off: the first is still in transit to 1
    assert sim.finish_s.tolist() == pytest.approx([0.027, 0.042])
    second = sim.steps[1]
    assert second.replica == 0 and second.kv_blocks_used == 10  # the first's 5 blocks held while it is sent


@pytest.mark.parametrize("engine", [_engine(), _engine(reserve_full_output=True, chunked_prefill=False, block_size=32)])
def test_a_free_link_and_a_replica_per_request_equal_a_colocated_run(engine):
    """With one replica per request in each pool and a zero-cost link, no request meets another: its
    prefill steps are the colocated replica's (the same chunks), and its first decode step on the
    decode replica prices the same one sequence over prompt + 1 keys as the colocated replica's step
    after the prefill, so first tokens and finishes agree exactly. (With fewer replicas they differ:
    colocated decodes wait behind other prompts' prefill steps and share them, which is what a split removes.)"""
    stream = _random_stream(40, seed=3, rate=50.0)
    stream = _stream(stream.arrival_s, np.minimum(stream.input_tokens, 64), stream.output_tokens)
    n = len(stream)
    engine = dataclasses.replace(engine, overhead=StepOverhead(fixed_s=3e-4, per_seq_s=2e-6, source="test"))
    colocated = simulate(stream, engine, _linear, kv_blocks=1000, replicas=n)
    split = simulate(
        stream, engine, _linear, kv_blocks=1000, replicas=2 * n, split=Split(prefill=n, transfer_s=lambda *a: 0.0)
    )
    assert np.array_equal(split.first_token_s, colocated.first_token_s)
    assert np.allclose(split.finish_s, colocated.finish_s, rtol=0, atol=1e-12)


def test_the_split_is_validated():
    stream = _stream([0.0], [10], [2])
    for prefill, replicas in ((0, 2), (2, 2)):
        with pytest.raises(OpcastError, match="needs >= 1 prefill and >= 1 decode"):
            simulate(
                stream,
                _engine(),
                _linear,
                kv_blocks=10,
                replicas=replicas,
                split=Split(prefill=prefill, transfer_s=lambda *a: 0.0),
            )
    assert parse_disaggregate("1:3") == (1, 3)
    for bad in ("3", "1:0", "0:1", "a:b", "1:2:3", ""):
        with pytest.raises(OpcastError, match="must be P:D"):
            parse_disaggregate(bad)


def test_pairs_share_a_node_only_when_every_gpu_pair_does():
    assert same_node(0, 0, prefill=1, gpus_per_replica=4, gpus_per_node=8)  # ranks 0-3 -> 4-7
    assert not same_node(0, 0, prefill=2, gpus_per_replica=4, gpus_per_node=8)  # ranks 0-3 -> 8-11
    assert same_node(0, 0, prefill=3, gpus_per_replica=2, gpus_per_node=8)  # ranks 0-1 -> 6-7
    assert not same_node(0, 0, prefill=2, gpus_per_replica=3, gpus_per_node=8)  # ranks 0-2 -> 6-8: 2 -> 8 crosses
    assert same_node(1, 1, prefill=2, gpus_per_replica=3, gpus_per_node=8) is False  # ranks 3-5 -> 12-14
    assert same_node(0, 0, prefill=1, gpus_per_replica=1, gpus_per_node=1) is False


class _Recording:
    """A collective cost model that notes its calls and answers from the real alpha-beta model."""

    def __init__(self) -> None:
        from opcast.predict.comm import CollectiveCostModel

        self.real = CollectiveCostModel()
        self.calls: list[Collective] = []

    def time_s(self, call, device):
        self.calls.append(call)
        return self.real.time_s(call, device)


def test_kv_transfer_sends_kv_bytes_per_token_times_prompt_tokens_over_the_pair_link():
    dev = get_device("H100-SXM")
    stream = _stream([0.0, 0.1, 0.2], [100, 2048, 100], [4, 4, 4])
    comms = _Recording()
    kvpt = 36864.0
    link = KvTransfer(
        stream, dev, kv_bytes_per_token=kvpt, prefill=2, decode=1, gpus_per_replica=4, gpus_per_node=8, comms=comms
    )
    assert [link.within_node(p, 2) for p in (0, 1)] == [False, False]  # ranks 0-3 and 4-7 send to 8-11 on the next node
    t_long = link(1, 0, 2)
    t_short = link(0, 1, 2)
    assert link(2, 0, 2) == t_short  # same prompt, same link: priced once
    assert [(c.kind, c.bytes, c.group) for c in comms.calls] == [
        ("send_recv", 2048 * 36864, INTER),
        ("send_recv", 100 * 36864, INTER),
    ]
    assert t_long > t_short > 0
    near = KvTransfer(
        stream, dev, kv_bytes_per_token=kvpt, prefill=1, decode=1, gpus_per_replica=4, gpus_per_node=8, comms=comms
    )
    assert near.within_node(0, 1) and near(1, 0, 1) < t_long  # NVLink beats the NIC
    assert comms.calls[-1].group == INTRA


def test_predict_serve_disagg_prices_the_memory_models_kv_bytes():
    arch, dev = load_arch("gpt3-125m"), get_device("H100-SXM")
    stream = _stream([0.0, 0.01, 0.02, 0.03], [64, 128, 256, 100], [8, 1, 8, 8])
    r = predict_serve_disagg(
        arch,
        dev,
        InferConfig(tp=1, pp=1),
        _engine(max_num_batched_tokens=512),
        stream,
        prefill=1,
        decode=1,
        kernels=load_kernel_cost(None, use_learned=False),
    )
    d = r.disaggregated
    assert d is not None and d.transfers == 3 and d.transfers_within_node == 3  # the one-token request stays
    assert d.kv_bytes_per_token_per_gpu == r.capacity.kv_bytes_per_token
    assert d.transfer_bytes_per_gpu == pytest.approx(r.capacity.kv_bytes_per_token * (64 + 256 + 100))
    assert d.prefill.requests == 4 and d.decode.requests == 3
    assert r.metrics.per_replica_requests == [4, 3]
    assert 0 < d.transfer.p50_s <= d.transfer.p99_s
