"""`search serve` returns exactly the best feasible deployment of a small space, checked by brute force:
every deployment simulated to the end by predict_serve (predict_serve_disagg for a prefill/decode
split) on the same request stream and ranked here."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import roofline_only
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.deployment import ServeResult, predict_serve
from opcast.predict.serve.disagg import predict_serve_disagg
from opcast.predict.serve.engine import engine_config
from opcast.predict.serve.metrics import serve_metrics
from opcast.predict.serve.requests import Lengths, poisson_stream
from opcast.predict.serve.search import (
    ServeSpace,
    deployments,
    ep_problems,
    limit_problems,
    misses_that_break,
    parse_splits,
    search_serve,
    space_problems,
    splits,
)
from opcast.predict.serve.simulate import StoppedEarly, StopRule

ARCH, GPU, GPUS = "llama3-8b", "H100-SXM", 4
TPS, SEQS, TOKENS = (1, 2, 3, 4), (8, 64), (512, 2048)
SLO_TTFT_S, SLO_TPOT_S = 0.25, 0.02
TIGHT_TPOT_S = 0.007
"""A TPOT SLO that prefills interleaved with decodes break on every colocated deployment that pays
off: there a prefill/decode split is the best (checked below)."""


@pytest.fixture(scope="module")
def setup():
    arch, dev = load_arch(ARCH), get_device(GPU)
    stream = poisson_stream(
        rate_per_s=120.0,
        num_requests=200,
        input_len=Lengths("uniform", 64, 1024),
        output_len=Lengths("uniform", 2, 96),
        seed=3,
    )
    return arch, dev, stream, roofline_only("test")


@pytest.fixture(scope="module")
def brute_of(setup):
    """Every deployment of the space, by hand, under a TPOT SLO: (tp, replicas, prefill, seqs, tokens) ->
    metrics, or None if it does not fit (prefill 0: colocated; else prefill + decode = replicas). Each
    deployment is simulated once: an SLO only changes the metrics predict_serve derives from the
    simulation (serve_metrics, called here as predict_serve calls it), not the simulation."""
    arch, dev, stream, kernels = setup
    runs: dict[tuple, ServeResult | None] = {}
    for tp in TPS:
        for replicas in range(1, GPUS // tp + 1):
            for prefill in range(replicas):  # 0: colocated
                for seqs in SEQS:
                    for tokens in TOKENS:
                        engine = engine_config("vllm", dev, max_num_seqs=seqs, max_num_batched_tokens=tokens)
                        try:
                            if prefill:  # the GPU's 8-GPU node holds all four
                                r = predict_serve_disagg(
                                    arch,
                                    dev,
                                    InferConfig(tp=tp),
                                    engine,
                                    stream,
                                    prefill=prefill,
                                    decode=replicas - prefill,
                                    kernels=kernels,
                                    slo_ttft_s=SLO_TTFT_S,
                                    slo_tpot_s=SLO_TPOT_S,
                                )
                            else:
                                r = predict_serve(
                                    arch,
                                    dev,
                                    InferConfig(tp=tp),
                                    engine,
                                    stream,
                                    replicas=replicas,
                                    kernels=kernels,
                                    gpus_per_node=tp,  # a replica within one node
                                    slo_ttft_s=SLO_TTFT_S,
                                    slo_tpot_s=SLO_TPOT_S,
                                )
                        except OpcastError:
                            runs[(tp, replicas, prefill, seqs, tokens)] = None
                        else:
                            runs[(tp, replicas, prefill, seqs, tokens)] = r
    memo: dict[float, dict] = {}

    def brute(slo_tpot_s: float) -> dict:
        if slo_tpot_s not in memo:
            memo[slo_tpot_s] = {
                key: None if r is None else serve_metrics(r.sim, slo_ttft_s=SLO_TTFT_S, slo_tpot_s=slo_tpot_s)
                for key, r in runs.items()
            }
        return memo[slo_tpot_s]

    return brute


@pytest.fixture(scope="module")
def brute(brute_of):
    """The colocated deployments under the default SLOs: (tp, replicas, seqs, tokens) -> metrics or None."""
    return {(tp, r, s, t): m for (tp, r, p, s, t), m in brute_of(SLO_TPOT_S).items() if p == 0}


def _brute_ranking(brute, objective: str, slo_tpot_s: float = SLO_TPOT_S) -> list[tuple]:
    """The brute force's deployments meeting the SLOs, best first (keys as in ``brute``: the colocated
    4-tuples or the 5-tuples with the prefill replicas)."""
    rows = []
    for key, m in brute.items():
        tp, replicas, seqs, tokens = key[0], key[1], key[-2], key[-1]
        prefill = key[2] if len(key) == 5 else 0
        if m is None or m.ttft.p90_s > SLO_TTFT_S or m.tpot.p90_s > slo_tpot_s:
            continue
        gpus = tp * replicas
        value = (m.goodput_requests_per_s if objective == "goodput" else m.output_tokens_per_s) / gpus
        rows.append(((-value, m.ttft.p90_s, m.tpot.p90_s, gpus, tp, 1, prefill, seqs, tokens), key))
    return [d for _, d in sorted(rows)]


def _space(
    objective: str, early_stop: bool = True, *, slo_tpot_s: float = SLO_TPOT_S, disaggregate: str = "off"
) -> ServeSpace:
    return ServeSpace(
        gpus=GPUS,
        tp=TPS,
        max_num_seqs=SEQS,
        max_num_batched_tokens=TOKENS,
        slo_ttft_s=SLO_TTFT_S,
        slo_tpot_s=slo_tpot_s,
        objective=objective,
        early_stop=early_stop,
        disaggregate=disaggregate,
    )


def _key(e) -> tuple:
    d = e.deployment
    return (d.tp, d.replicas, d.max_num_seqs, d.max_num_batched_tokens)


def _key5(e) -> tuple:
    d = e.deployment
    return (d.tp, d.replicas, d.prefill, d.max_num_seqs, d.max_num_batched_tokens)


@pytest.mark.parametrize("objective", ["goodput", "throughput"])
def test_search_returns_exactly_the_brute_force_best(setup, brute, objective):
    arch, dev, stream, kernels = setup
    expected = _brute_ranking(brute, objective)
    # the space is not trivial: one GPU is too few, and several deployments meet the SLOs
    assert 1 < len(expected) < sum(m is not None for m in brute.values())
    assert all(tp * replicas > 1 for tp, replicas, _, _ in expected) and None in brute.values()
    result = search_serve(arch, dev, _space(objective), stream, kernels=kernels)
    best = result.ranked[0]
    assert _key(best) == expected[0]
    assert best.metrics == brute[expected[0]]  # the very numbers predict_serve gives alone
    assert result.best is not None and result.best.metrics == brute[expected[0]]
    # the bounds did work (so this test also checks that they are exact) ...
    assert result.count("outranked") + result.count("slo_certain_miss") > 0
    # ... and without them, the whole ranking is the brute force's
    full = search_serve(arch, dev, _space(objective, early_stop=False), stream, kernels=kernels)
    assert [_key(e) for e in full.ranked] == expected
    assert full.count("outranked") == full.count("slo_certain_miss") == 0
    assert {_key(e) for e in full.others if e.status == "infeasible"} == {k for k, m in brute.items() if m is None}


@pytest.mark.parametrize("objective", ["goodput", "throughput"])
@pytest.mark.parametrize("slo_tpot_s", [SLO_TPOT_S, TIGHT_TPOT_S])
def test_search_with_splits_returns_exactly_the_brute_force_best(setup, brute_of, objective, slo_tpot_s):
    """--disaggregate auto: every split (P + D) x tp <= 4 beside the colocated deployments; the search's
    best is the brute force's, with the tight TPOT SLO a split, with the loose one colocated."""
    arch, dev, stream, kernels = setup
    brute = brute_of(slo_tpot_s)
    expected = _brute_ranking(brute, objective, slo_tpot_s)
    assert 1 < len(expected) < sum(m is not None for m in brute.values())
    assert any(k[2] for k in expected) and any(not k[2] for k in expected)  # both kinds meet the SLOs
    assert (expected[0][2] > 0) == (slo_tpot_s == TIGHT_TPOT_S)
    space = _space(objective, slo_tpot_s=slo_tpot_s, disaggregate="auto")
    result = search_serve(arch, dev, space, stream, kernels=kernels)
    best = result.ranked[0]
    assert _key5(best) == expected[0]
    assert best.metrics == brute[expected[0]]
    assert result.best is not None and result.best.metrics == brute[expected[0]]
    assert (result.best.disaggregated is not None) == (expected[0][2] > 0)
    assert result.count("outranked") + result.count("slo_certain_miss") > 0
    full = search_serve(arch, dev, replace(space, early_stop=False), stream, kernels=kernels)
    assert [_key5(e) for e in full.ranked] == expected
    assert {_key5(e) for e in (*full.ranked, *full.others)} == set(brute)  # exactly the space, splits included
    assert {_key5(e) for e in full.others if e.status == "infeasible"} == {k for k, m in brute.items() if m is None}


def test_split_pairs_and_their_checks():
    assert parse_splits("off") == "off" and parse_splits("auto") == "auto"
    assert parse_splits("1:3, 1:1,1:3") == ((1, 3), (1, 1))
    for bad in ("1", "0:2", "1:x", "1:1,", "on"):
        with pytest.raises(OpcastError, match=r"--disaggregate .* must be off, auto or P:D pairs"):
            parse_splits(bad)
    assert splits(ServeSpace(gpus=4, disaggregate="auto"), 3) == [(1, 1), (1, 2), (2, 1)]
    assert splits(ServeSpace(gpus=4, disaggregate="auto", use_all_gpus=True), 3) == [(1, 2), (2, 1)]
    assert splits(ServeSpace(gpus=4, disaggregate="3:1,1:1,1:2"), 3) == [(1, 1), (1, 2)]  # 3:1 needs 4 replicas
    assert splits(ServeSpace(gpus=4), 4) == []
    text = "; ".join(space_problems(ServeSpace(gpus=4, objective="throughput", disaggregate="1:1,4:1,2:x")))
    assert "--disaggregate '1:1,4:1,2:x' must be" in text
    text = "; ".join(space_problems(ServeSpace(gpus=4, objective="throughput", disaggregate="1:1,4:1")))
    assert "--disaggregate 4:1 needs more replicas than --gpus 4" in text


def test_splits_come_after_the_colocated_at_equal_gpus(setup):
    arch, dev, _, _ = setup
    space = ServeSpace(gpus=4, tp=(1, 2), max_num_seqs=(8,), max_num_batched_tokens=(512,), disaggregate="auto")
    order = [(d.gpus, d.tp, d.prefill, d.decode) for d in deployments(arch, dev, space)]
    assert order == [
        (1, 1, 0, 0),
        (2, 1, 0, 0),
        (2, 1, 1, 1),
        (2, 2, 0, 0),
        (3, 1, 0, 0),
        (3, 1, 1, 2),
        (3, 1, 2, 1),
        (4, 1, 0, 0),
        (4, 1, 1, 3),
        (4, 1, 2, 2),
        (4, 1, 3, 1),
        (4, 2, 0, 0),
        (4, 2, 1, 1),
    ]
    assert len(deployments(arch, dev, replace(space, disaggregate="off"))) == 6


def test_every_ranked_metric_is_that_of_predict_serve(setup, brute):
    arch, dev, stream, kernels = setup
    result = search_serve(arch, dev, _space("goodput"), stream, kernels=kernels)
    for e in result.ranked:
        assert e.metrics == brute[_key(e)]
        assert e.value == e.metrics.goodput_requests_per_s / e.deployment.gpus


@pytest.mark.parametrize("p", [50, 90, 99])
def test_misses_that_break_put_the_percentile_above_the_limit(p):
    """k = misses_that_break(n, p) values above a limit always put numpy's p-th percentile above it,
    and k is at most one more than the exact count (so the stop is not lax)."""
    rng = np.random.default_rng(0)
    for n in range(1, 80):
        k = misses_that_break(n, p)
        assert 1 <= k <= n and k <= n - math.floor(p / 100 * (n - 1)) + 1
        for _ in range(5):
            values = np.concatenate([rng.uniform(0, 1, n - k), rng.uniform(1.0 + 1e-12, 3, k)])
            rng.shuffle(values)
            assert np.percentile(values, p) > 1.0


def test_a_stop_rule_stops_only_runs_that_cannot_meet_it(setup):
    """A run stopped for TTFT misses has a p90 TTFT above the SLO when run to the end; a run stopped
    under a throughput floor has less throughput than the floor."""
    arch, dev, stream, kernels = setup
    engine = engine_config("vllm", dev, max_num_seqs=8, max_num_batched_tokens=512)
    args = dict(kernels=kernels, gpus_per_node=1, slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S)
    full = predict_serve(arch, dev, InferConfig(tp=1), engine, stream, **args).metrics
    assert full.ttft.p90_s > SLO_TTFT_S
    rule = StopRule(slo_ttft_s=SLO_TTFT_S, ttft_misses=misses_that_break(len(stream), 90))
    with pytest.raises(StoppedEarly) as stopped:
        predict_serve(arch, dev, InferConfig(tp=1), engine, stream, **args, stop=rule)
    assert stopped.value.kind == "ttft_misses" and stopped.value.at_s < stream.arrival_s[0] + full.duration_s
    floor = full.output_tokens_per_s * 1.01
    with pytest.raises(StoppedEarly, match="rate floor"):
        predict_serve(arch, dev, InferConfig(tp=1), engine, stream, **args, stop=StopRule(throughput_floor_per_s=floor))
    # a floor the run does reach never stops it
    same = predict_serve(
        arch, dev, InferConfig(tp=1), engine, stream, **args, stop=StopRule(throughput_floor_per_s=floor / 1.02)
    )
    assert same.metrics == full


def test_bad_spaces_are_refused_with_every_problem():
    problems = space_problems(
        ServeSpace(
            gpus=4,
            tp=(8,),
            max_num_seqs=(0,),
            objective="fastest",
            slo_percentile=95,
            engine="tgi",
            moe_dispatcher="deepep",
        )
    )
    text = "; ".join(problems)
    for part in (
        "--tp 8 exceeds --gpus 4",
        "--max-num-seqs 0",
        "objective 'fastest'",
        "percentile 95",
        "'tgi'",
        "moe_dispatcher='deepep' is not one of alltoall, flex, allgather",
    ):
        assert part in text
    assert any("needs an SLO" in p for p in space_problems(ServeSpace(gpus=4)))
    assert space_problems(ServeSpace(gpus=4, objective="throughput")) == []
    waits = {"batch_wait_iters": 20, "batch_wait_tokens_ratio": 0.9}
    (vllm,) = space_problems(ServeSpace(gpus=4, objective="throughput", engine_overrides=waits))
    assert "is TensorRT-LLM's" in vllm and "give --engine trtllm" in vllm
    assert space_problems(ServeSpace(gpus=4, objective="throughput", engine="trtllm", engine_overrides=waits)) == []
    # every replica count of every layout is a deployment: past 2**21 GPUs the search never ended
    assert space_problems(ServeSpace(gpus=2**21 + 1, objective="throughput")) == [
        "--gpus 2097153 is past the 2,097,152 GPUs a search takes; give fewer"
    ]


def test_an_ep_no_deployment_can_take_is_refused_before_the_search():
    # dropped without a word: --tp 2 --ep 3 ended as 'of 0 deployments, 0 miss the SLOs; try more --gpus', and
    # --ep 2 of a dense arch as 'do not fit'
    moe, dense, dev = load_arch("qwen3-30b-a3b"), load_arch(ARCH), get_device(GPU)
    space = ServeSpace(gpus=4, tp=(2,), ep=(2, 3), objective="throughput")
    assert ep_problems(moe, dev, space) == [
        "--ep 3 is a multiple of no tensor-parallel degree tried (tp 2): ep = tp puts whole experts on a "
        "replica's GPUs, ep = k x tp spreads them over k replicas; give multiples of a --tp"
    ]
    stream = poisson_stream(
        rate_per_s=120.0, num_requests=4, input_len=Lengths("fixed", 8, 8), output_len=Lengths("fixed", 2, 2), seed=0
    )
    with pytest.raises(OpcastError, match="--ep 3 is a multiple of no tensor-parallel degree"):
        search_serve(moe, dev, space, stream, kernels=roofline_only("test"))
    assert "--ep 2: " + ARCH + " is dense" in ep_problems(dense, dev, replace(space, ep=(1, 2)))[0]
    assert ep_problems(moe, dev, replace(space, ep=(1, 2, 4))) == []
    assert (
        ep_problems(dense, dev, replace(space, ep=(1,)))
        == ep_problems(moe, dev, replace(space, tp=None, ep=(3,)))
        == []
    )
    assert {d.ep for d in deployments(moe, dev, replace(space, ep=(2, 4)))} == {2, 4}


def test_limits_vllm_refuses_are_refused_not_clamped():
    # vLLM (SchedulerConfig.verify_max_model_len) refuses max_num_batched_tokens < max_num_seqs; opcast clamped
    # the sequences to the tokens without a word and simulated an engine that never starts
    dev = get_device(GPU)
    with pytest.raises(
        OpcastError, match=r"max_num_batched_tokens 256 is below max_num_seqs 4,096.*--max-num-seqs <= 256"
    ):
        engine_config("vllm", dev, max_num_seqs=4096, max_num_batched_tokens=256)
    with pytest.raises(OpcastError, match="below max_num_seqs 1,024"):  # the default counts, as in vLLM
        engine_config("vllm", dev, max_num_batched_tokens=512)
    assert engine_config("vllm", dev, max_num_seqs=512, max_num_batched_tokens=512).max_num_seqs == 512
    assert engine_config("sglang", dev, max_num_batched_tokens=512).max_num_seqs == 1024  # no such rule known
    arch, space = load_arch(ARCH), ServeSpace(gpus=1, tp=(1,), objective="throughput")
    # the search tries only the pairs vLLM accepts, and refuses a value given that pairs with none
    tried = {(d.max_num_seqs, d.max_num_batched_tokens) for d in deployments(arch, dev, space)}
    assert tried == {(128, 2048), (128, 8192), (1024, 2048), (1024, 8192)}
    small = replace(space, max_num_batched_tokens=(512,))
    assert limit_problems(dev, small) == []
    assert {(d.max_num_seqs, d.max_num_batched_tokens) for d in deployments(arch, dev, small)} == {(128, 512)}
    assert limit_problems(dev, replace(space, max_num_seqs=(64, 4096), max_num_batched_tokens=(2048,))) == [
        "--max-num-seqs 4096 exceeds every --max-num-batched-tokens tried (2048), which vllm refuses (a step needs "
        "a token for each sequence); give --max-num-seqs <= 2048 or --max-num-batched-tokens >= 4096"
    ]
    assert "(the default grid) 128,1024 exceeds" in limit_problems(dev, replace(space, max_num_batched_tokens=(64,)))[0]
    assert limit_problems(dev, replace(space, engine="sglang", max_num_batched_tokens=(64,))) == []


@pytest.mark.parametrize("dispatcher", ["flex", "allgather"])
def test_the_search_prices_expert_parallelism_across_replicas_with_the_asked_dispatcher(dispatcher):
    """Two tp-4 replicas of an MoE arch as one EP-8 group: each candidate is what predict_serve gives for that
    deployment with the same dispatcher, and the dispatcher changes it."""
    arch, dev = load_arch("qwen3-30b-a3b"), get_device(GPU)
    stream = poisson_stream(
        rate_per_s=120.0,
        num_requests=60,
        input_len=Lengths("uniform", 64, 512),
        output_len=Lengths("uniform", 2, 32),
        seed=5,
    )
    kernels = roofline_only("test")
    values = {}
    for chosen in (dispatcher, "alltoall"):
        space = ServeSpace(
            gpus=8,
            tp=(4,),
            ep=(8,),
            max_num_seqs=(16,),
            max_num_batched_tokens=(1024,),
            objective="throughput",
            moe_dispatcher=chosen,
        )
        result = search_serve(arch, dev, space, stream, kernels=kernels)
        ((best, *_),) = [result.ranked]
        assert best.deployment.ep == 8
        cfg = InferConfig(tp=4, ep=8, moe_dispatcher=chosen)  # type: ignore[arg-type]
        engine = engine_config(space.engine, dev, max_num_seqs=16, max_num_batched_tokens=1024)
        alone = predict_serve(arch, dev, cfg, engine, stream, replicas=best.deployment.replicas, kernels=kernels)
        assert best.metrics is not None and best.metrics.output_tokens_per_s == alone.metrics.output_tokens_per_s
        values[chosen] = alone.metrics.output_tokens_per_s
    assert values[dispatcher] != values["alltoall"]


def test_the_kv_dtype_engine_release_and_fusions_reach_every_candidate(setup):
    """search serve prices each deployment with the space's KV dtype, engine release and vLLM fusions, as
    predict serve does with them: its metrics for TP 2 with one replica are predict_serve's under that
    InferConfig, and differ from the plain one's (an fp8 KV cache and fused all-reduces change the steps); a fusion
    under another engine is a problem of the request."""
    arch, dev, stream, kernels = setup
    extras = {"kv_dtype": "fp8", "engine_version": "0.11.0", "fusions": "allreduce_rms,attn_quant"}
    space = ServeSpace(
        gpus=2, tp=(2,), max_num_seqs=(64,), max_num_batched_tokens=(2048,), objective="throughput", **extras
    )
    (best,) = search_serve(arch, dev, space, stream, kernels=kernels).ranked
    engine = engine_config("vllm", dev, max_num_seqs=64, max_num_batched_tokens=2048)
    want = predict_serve(arch, dev, InferConfig(tp=2, **extras), engine, stream, kernels=kernels).metrics
    plain = predict_serve(arch, dev, InferConfig(tp=2), engine, stream, kernels=kernels).metrics
    assert best.metrics == want and want != plain
    problems = space_problems(replace(space, engine="trtllm"))
    assert any("vLLM's compile passes" in p for p in problems)
