"""A step's prefill chunks priced as one batched attention kernel, and the prefix cache: hand-worked
cases of the work, the KV held, the schedule and the conservation of requests and tokens, and bad
values refused through the console script."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost, roofline_only
from opcast.predict.graph import block_ops, precision_of
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import FRONTENDS, EngineConfig, StepOverhead
from opcast.predict.serve.kv_cache import blocks_for, prefix_hit_tokens
from opcast.predict.serve.requests import Lengths, RequestStream, poisson_stream, read_trace, with_prefix_cache
from opcast.predict.serve.simulate import simulate
from opcast.predict.serve.step_cost import PricedStepCost, equivalent_prefill, interp1

ARCH, GPU = "llama3-8b", "H100-SXM"
NO_OVERHEAD = StepOverhead(fixed_s=0.0, per_seq_s=0.0, source="none (test)")


def _pairs(q: float, kv: float) -> float:
    """Causal query-key pairs of ``q`` queries seeing ``kv`` keys (the registry's bottom-right alignment)."""
    return q * (kv - q) + q * (q + 1) / 2


def _table(kernels) -> PricedStepCost:
    arch, dev = load_arch(ARCH), get_device(GPU)
    return PricedStepCost(
        arch, dev, InferConfig(tp=1), gpus_per_node=8, kernels=kernels, max_tokens=512, max_seqs=64, max_len=512
    )


def _attention_s(step: PricedStepCost, chunks: list[tuple[int, int]]) -> float:
    """The attention part of a prefill-only step: the step less its token-wise part."""
    return step(chunks, 0, 0) - interp1(step.tokens, step.dense_s, sum(q for q, _ in chunks))


# --------------------------------------------------------------------------- the equivalent sequence


def test_chunks_without_a_prefix_are_one_sequence_of_the_same_causal_pairs():
    """56 fresh chunks of 8 tokens do 56 x 36 = 2016 pairs, the causal triangle of 63 tokens (63 x 64 / 2)."""
    assert equivalent_prefill([(8, 8)] * 56) == (63.0, 63.0)
    for q, kv in [(1, 1), (8, 8), (7, 300), (512, 2048)]:  # one chunk is priced as itself
        assert equivalent_prefill([(q, kv)]) == (q, kv)


def test_a_cached_prefix_adds_the_new_queries_against_every_earlier_key():
    """A chunk of 8 new tokens after 200 cached ones: 8 x 200 + 8 x 9 / 2 = 1636 pairs; with a fresh
    16-token chunk (136 pairs) the two are one sequence of q_e (q_e + 1) = 72 + 272 tokens doing 1772."""
    assert _pairs(8, 208) == 1636
    q_e, kv_e = equivalent_prefill([(8, 208), (16, 16)])
    assert q_e * (q_e + 1) == pytest.approx(8 * 9 + 16 * 17)
    assert _pairs(q_e, kv_e) == pytest.approx(1636 + 136)


# --------------------------------------------------------------------------- one launch, not N


@pytest.fixture(scope="module")
def learned():
    kernels = load_kernel_cost(None)  # the embedded default models: per-kernel fixed costs, as on a GPU
    return kernels, _table(kernels)


def test_n_small_chunks_pay_one_launch_not_n(learned):
    kernels, step = learned
    arch, dev = load_arch(ARCH), get_device(GPU)
    ops = block_ops(arch, tp=1, batch=1, seq_q=8, seq_kv=8, sp=False, attention="flash", training=False)
    ((_, kind, params, _),) = [op for op in ops if op[0] == "attn"]
    cfg = InferConfig(tp=1)
    kernel = precision_of(cfg.precision, cfg.tensor_cores).of(kind, params)
    one_s = kernels.lookup([kernel], dev)[kernel][0]
    layers = arch.n_layers
    assert _attention_s(step, [(8, 8)]) == pytest.approx(layers * one_s, rel=1e-9)  # the model's own kernel
    many = _attention_s(step, [(8, 8)] * 56)
    # the same work as one 63-token sequence, priced at its one kernel
    assert many == pytest.approx(_attention_s(step, [(63, 63)]), rel=1e-9)
    # one launch of fixed cost, not 56: the old per-chunk price was 56 x the model's kernel
    assert many < 2 * layers * one_s
    assert 56 * layers * one_s > 20 * many


def test_on_the_roofline_batching_costs_no_more_than_the_chunks_apart():
    step = _table(roofline_only("test"))
    one = _attention_s(step, [(64, 64)])
    many = _attention_s(step, [(64, 64)] * 6)
    assert one < many <= 6 * one * (1 + 1e-9)
    # a cached prefix costs attention (more keys), not tokens: the token-wise part is unchanged
    assert _attention_s(step, [(16, 400)]) > _attention_s(step, [(16, 16)])
    assert step([(16, 400)], 0, 0) - _attention_s(step, [(16, 400)]) == pytest.approx(
        step([(16, 16)], 0, 0) - _attention_s(step, [(16, 16)])
    )


# --------------------------------------------------------------------------- the prefix-cache rule


def test_a_hit_is_whole_blocks_and_never_the_last_token():
    """vLLM's get_computed_blocks: at most n - 1 tokens, rounded down to blocks of 16."""
    n = np.array([1, 16, 17, 208, 213])
    assert prefix_hit_tokens(n, 1.0, 16).tolist() == [0, 0, 16, 192, 208]
    assert prefix_hit_tokens(n, 0.5, 16).tolist() == [0, 0, 0, 96, 96]  # floor(106.5) = 106 -> 96
    assert prefix_hit_tokens(n, 1.0, 1).tolist() == (n - 1).tolist()  # SGLang's radix cache: token granular
    assert prefix_hit_tokens(n, 0.0, 16).tolist() == [0] * 5
    for bad in (1.5, -0.1, math.nan):
        with pytest.raises(OpcastError, match="--prefix-cache-hit"):
            prefix_hit_tokens(n, bad, 16)


def _stream(arrivals, inputs, outputs, cached=None) -> RequestStream:
    return RequestStream(
        arrival_s=np.asarray(arrivals, dtype=float),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        source="test",
        cached_tokens=None if cached is None else np.asarray(cached, dtype=np.int64),
    )


def _engine(**kw) -> EngineConfig:
    return EngineConfig(**{"overhead": NO_OVERHEAD, "max_num_batched_tokens": 100, **kw})


class _Recorder:
    """A step price of 1 s that notes what each step asked to price."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[tuple[int, int]], int, int]] = []

    def __call__(self, prefill, decode_seqs, decode_kv):
        self.steps.append((list(prefill), decode_seqs, decode_kv))
        return 1.0


def test_a_cached_prompt_prefills_its_new_tokens_against_the_whole_context_and_holds_all_its_kv():
    """208 prompt tokens, 200 cached, 3 output, blocks of 16: the prefill is 8 queries seeing 208 keys, the
    request holds ceil(208 / 16) = 13 blocks from its first step, then decodes with 209 and 210 keys."""
    rec = _Recorder()
    sim = simulate(_stream([0.0], [208], [3], [200]), _engine(block_size=16), rec, kv_blocks=100)
    assert rec.steps == [([(8, 208)], 0, 0), ([], 1, 209), ([], 1, 210)]
    assert [s.kv_blocks_used for s in sim.steps] == [blocks_for(208, 16), 14, 14]
    assert [s.prefill_tokens for s in sim.steps] == [8, 0, 0]
    assert sim.first_token_s.tolist() == [1.0] and sim.finish_s.tolist() == [3.0]
    rec = _Recorder()  # chunked: 16 new tokens in chunks of 8, each seeing every key before it
    simulate(_stream([0.0], [208], [1], [192]), _engine(block_size=16, max_num_batched_tokens=8), rec, kv_blocks=100)
    assert rec.steps == [([(8, 200)], 0, 0), ([(8, 208)], 0, 0)]


def test_hand_worked_preemption_with_a_cached_prefix():
    """As test_serve_simulate's preemption case (4 blocks of 4 tokens, two requests of 6 prompt + 5 output
    tokens at t = 0, 1 s steps) with the first block of each prompt cached: the same blocks are held
    (the hit's KV counts), each prefill computes 2 tokens, and B, preempted in step 4, finds its hit
    again and recomputes 2 prompt + 2 generated tokens in step 6."""
    rec = _Recorder()
    stream = _stream([0.0, 0.0], [6, 6], [5, 5], [4, 4])
    sim = simulate(stream, _engine(max_num_seqs=2, block_size=4), rec, kv_blocks=4)
    assert sim.first_token_s.tolist() == [1.0, 2.0]
    assert sim.finish_s.tolist() == [5.0, 8.0]
    assert sim.preemptions.tolist() == [0, 1]
    assert [s.kv_blocks_used for s in sim.steps] == [2, 4, 4, 3, 3, 2, 3, 3]
    assert [s.prefill_tokens for s in sim.steps] == [2, 2, 0, 0, 0, 4, 0, 0]
    assert [p for p, _, _ in rec.steps if p] == [[(2, 6)], [(2, 6)], [(4, 8)]]


@pytest.mark.parametrize(("blocks", "preempts"), [(10**6, False), (40, True)])
def test_requests_and_tokens_are_conserved_with_cached_prefixes(blocks, preempts):
    stream = poisson_stream(
        rate_per_s=150.0,
        num_requests=300,
        input_len=Lengths("uniform", 1, 300),
        output_len=Lengths("uniform", 1, 60),
        seed=5,
    )
    stream = with_prefix_cache(stream, 0.8, 16)
    cached = stream.cached_tokens
    assert cached is not None and cached.sum() > 0 and (cached < stream.input_tokens).all()
    engine = _engine(max_num_seqs=12, max_num_batched_tokens=320, block_size=16)
    sim = simulate(stream, engine, lambda p, d, kv: 1e-3 + 1e-5 * (sum(q for q, _ in p) + d), kv_blocks=blocks)
    assert np.isfinite(sim.finish_s).all() and (stream.arrival_s <= sim.first_token_s).all()
    assert sum(s.tokens_out for s in sim.steps) == stream.output_tokens.sum()
    computed = sum(s.prefill_tokens + s.decode_seqs for s in sim.steps)
    needed = int((stream.input_tokens - cached).sum() + (stream.output_tokens - 1).sum())
    assert all(s.kv_blocks_used <= blocks for s in sim.steps)
    assert (sim.preemptions.sum() > 0) == preempts
    if preempts:  # a preempted request recomputes what it had computed beyond its hit
        assert computed > needed
    else:
        assert computed == needed


def test_a_hit_of_the_whole_prompt_is_refused():
    with pytest.raises(OpcastError, match="request 1 has 6 cached tokens of a 6-token prompt"):
        simulate(_stream([0.0, 0.0], [6, 6], [1, 1], [0, 6]), _engine(), _Recorder(), kv_blocks=10)


def test_hits_come_from_the_option_or_the_trace_not_both(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,cached_tokens\n0.5,100,4,64\n0.0,50,2,\n")
    stream = read_trace(path)
    assert stream.cached_tokens.tolist() == [0, 64] and "43 % of prompt tokens" in stream.source
    with pytest.raises(OpcastError, match="not both"):
        with_prefix_cache(stream, 1.0, 16)
    plain = read_trace(_write(tmp_path / "p.csv", "arrival_s,input_tokens,output_tokens\n0,100,4\n"))
    assert plain.cached_tokens is None
    assert with_prefix_cache(plain, 1.0, 16).cached_tokens.tolist() == [96]


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("value", ["100", "-1", "2.5", "x"])
def test_bad_cached_tokens_in_a_trace_are_refused_naming_the_line(tmp_path, value):
    path = _write(tmp_path / "t.csv", f"arrival_s,input_tokens,output_tokens,cached_tokens\n0,100,4,{value}\n")
    with pytest.raises(OpcastError, match=r"line 2: cached_tokens .* from 0 to input_tokens - 1 = 99"):
        read_trace(path)


# --------------------------------------------------------------------------- through the console script


def _opcast(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


SERVE = ["predict", "serve", "--arch", ARCH, "--gpu", GPU, "--roofline"]


@pytest.mark.parametrize(
    ("extra", "trace", "message"),
    [
        (["--prefix-cache-hit", "2", "--rate", "4"], None, "--prefix-cache-hit 2.0 must be a fraction"),
        (["--prefix-cache-hit", "nan", "--rate", "4"], None, "--prefix-cache-hit nan must be a fraction"),
        ([], "0,100,4,100\n", "line 2: cached_tokens '100' must be a whole number"),
        (["--prefix-cache-hit", "1"], "0,100,4,32\n", "give either that column or --prefix-cache-hit, not both"),
    ],
)
def test_bad_prefix_cache_values_exit_2_in_one_line(tmp_path, extra, trace, message):
    args = [*SERVE, *extra]
    if trace is not None:
        _write(tmp_path / "t.csv", "arrival_s,input_tokens,output_tokens,cached_tokens\n" + trace)
        args += ["--trace-file", "t.csv"]
    p = _opcast(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and message in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_a_warm_cache_through_the_console_script(tmp_path):
    args = [*SERVE, "--rate", "5", "--num-requests", "40", "--input-len", "1000", "--output-len", "4", "--json"]
    warm, cold = _opcast(*args, "--prefix-cache-hit", "1", cwd=tmp_path), _opcast(*args, cwd=tmp_path)
    assert warm.returncode == 0 and cold.returncode == 0, warm.stderr + cold.stderr
    warm, cold = json.loads(warm.stdout), json.loads(cold.stdout)
    assert "prefix cache hits 100 % of each prompt (16-token blocks)" in warm["requests_source"]
    assert "prefix cache" not in cold["requests_source"]
    front = FRONTENDS["vllm"]  # the API front end's fixed share of every TTFT
    ttft = [run["metrics"]["ttft"]["p50_s"] - front for run in (warm, cold)]
    assert ttft[0] < ttft[1] / 3  # 8 of 1,000 prompt tokens prefilled, not 1,000


def test_the_front_end_latency_is_the_engines_default_or_given_and_moves_ttft_not_tpot(tmp_path):
    args = [*SERVE, "--rate", "5", "--num-requests", "40", "--input-len", "200", "--output-len", "8", "--json"]
    runs = [_opcast(*args, *extra, cwd=tmp_path) for extra in ((), ("--frontend-ms", "0"), ("--frontend-ms", "50"))]
    assert all(p.returncode == 0 for p in runs), [p.stderr for p in runs]
    default, none, fifty = (json.loads(p.stdout)["metrics"] for p in runs)
    assert default["ttft"]["p50_s"] - none["ttft"]["p50_s"] == pytest.approx(FRONTENDS["vllm"], abs=1e-9)
    assert fifty["ttft"]["p50_s"] - none["ttft"]["p50_s"] == pytest.approx(0.05, abs=1e-9)
    assert fifty["tpot"]["p50_s"] == pytest.approx(none["tpot"]["p50_s"], abs=1e-12)
    bad = _opcast(*args, "--frontend-ms", "-1", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--frontend-ms" in bad.stderr and not bad.stdout
