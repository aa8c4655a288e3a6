"""The public serving benchmark (benchmarks/serving_public.py): ShareGPT-shaped lengths with a run's own
means, TTFT / TPOT defined as vLLM's benchmark_serving.py defines them, and one published row built
and simulated end to end."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.predict.serve.metrics import Distribution, request_latencies
from opcast.predict.serve.requests import (
    SHAREGPT,
    SHAREGPT_MEAN_INPUT_TOKENS,
    SHAREGPT_MEAN_OUTPUT_TOKENS,
    SHAREGPT_SIGMA,
    RequestStream,
    sharegpt_lengths,
)

from helpers.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_public.py"


LLAMA = "Llama-3.3-70B"
"""The group of the Llama-3.3-70B rows (surajssd/llm-k8s); the gpt-oss rows are GPUStack's."""


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def llama_runs(bench):
    return [r for r in bench.read_published() if r.group.startswith(LLAMA)]


def gpt_oss_runs(bench):
    return [r for r in bench.read_published() if r.group.startswith("gpt-oss")]


def test_sharegpt_is_sharegpt_lengths_at_the_papers_means():
    assert sharegpt_lengths(SHAREGPT_MEAN_INPUT_TOKENS, SHAREGPT_MEAN_OUTPUT_TOKENS) == SHAREGPT


def test_sharegpt_lengths_take_the_given_unclipped_means():
    inp, out = sharegpt_lengths(213.0, 150.0)
    for lengths, mean, sigma in ((inp, 213.0, SHAREGPT_SIGMA[0]), (out, 150.0, SHAREGPT_SIGMA[1])):
        assert math.exp(lengths.mu + lengths.sigma**2 / 2) == pytest.approx(mean)
        assert lengths.sigma == sigma
    assert (inp.hi, out.hi) == (SHAREGPT[0].hi, SHAREGPT[1].hi)


@pytest.mark.parametrize("mean", [0.5, float("nan"), float("inf")])
def test_sharegpt_lengths_refuse_a_mean_below_one_token(mean):
    with pytest.raises(OpcastError, match="mean input tokens"):
        sharegpt_lengths(mean, 100)


@pytest.mark.parametrize("mean", [213.0, 600.0])
def test_sharegpt_lengths_can_hold_their_means_after_the_clips(mean):
    """A benchmark's printed totals are of the requests it kept: with ``means_after_clip`` the lengths
    drawn (rounded, clipped to [1, 1024]) have the given mean, where the unclipped lognormal falls short."""
    inp, out = sharegpt_lengths(mean, mean, means_after_clip=True)
    rng = np.random.default_rng(7)
    for lengths in (inp, out):
        drawn = lengths.draw(rng, 400_000)
        assert drawn.mean() == pytest.approx(mean, rel=0.01) and drawn.max() <= 1024
    plain = sharegpt_lengths(mean, mean)[0].draw(np.random.default_rng(7), 400_000).mean()
    assert plain < mean * 0.995  # the clip cuts the unclipped lognormal's mean
    assert inp.sigma == SHAREGPT_SIGMA[0] and out.sigma == SHAREGPT_SIGMA[1]


def test_sharegpt_lengths_refuse_a_mean_the_clip_cannot_hold():
    with pytest.raises(OpcastError, match="below the clip 1024"):
        sharegpt_lengths(1024, 100, means_after_clip=True)


def test_ttft_and_tpot_are_vllm_benchmark_servings():
    """benchmark_serving.py: TTFT = first token - send; TPOT = (latency - TTFT) / (output tokens - 1),
    requests of one output token left out; percentiles by numpy's linear interpolation."""
    stream = RequestStream(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        input_tokens=np.array([10, 10, 10]),
        output_tokens=np.array([11, 1, 3]),
        source="hand",
    )
    engine = SimpleNamespace(frontend_s=0.0)
    sim = SimpleNamespace(
        stream=stream, engine=engine, first_token_s=np.array([0.1, 1.3, 2.2]), finish_s=np.array([1.1, 1.3, 2.6])
    )
    ttft, tpot, e2e = request_latencies(sim)
    np.testing.assert_allclose(ttft, [0.1, 0.3, 0.2])
    np.testing.assert_allclose(e2e, [1.1, 0.3, 0.6])
    assert tpot[0] == pytest.approx((1.1 - 0.1) / 10) and math.isnan(tpot[1]) and tpot[2] == pytest.approx(0.2)
    # the engine's API front end delays what the client sees of the first token and the last, not the gaps between
    engine.frontend_s = 0.01
    ttft2, tpot2, e2e2 = request_latencies(sim)
    np.testing.assert_allclose(ttft2, ttft + 0.01)
    np.testing.assert_allclose(e2e2, e2e + 0.01)
    np.testing.assert_allclose(tpot2, tpot)
    d = Distribution.of(np.array([1.0, 2.0, 3.0, 4.0]))
    assert (d.p50_s, d.p90_s) == (pytest.approx(2.5), pytest.approx(3.7))


def test_a_row_takes_its_mean_lengths_from_its_own_throughputs(bench):
    assert all(r.source_url.startswith("https://") for r in bench.read_published())
    runs = llama_runs(bench)
    assert len(runs) == 4
    first = runs[0]
    assert first.mean_input_tokens == pytest.approx((416.047 - 208.177) / 0.974567)
    assert first.mean_output_tokens == pytest.approx(208.177 / 0.974567)
    assert first.measured_ms[("ttft", "p50")] == pytest.approx(56.3722)
    assert not first.warm_prefix_cache and all(r.warm_prefix_cache for r in runs[1:])


def test_streams_keep_their_lengths_across_rates_and_model_a_warm_cache_and_a_burst(bench):
    runs = {r.rate_per_s: r for r in llama_runs(bench)}
    cold, warm, burst = runs[1.0], runs[4.0], runs[math.inf]
    a, b = bench.stream_for(cold, 3), bench.stream_for(warm, 3, cold=True)
    np.testing.assert_array_equal(a.input_tokens, b.input_tokens)  # same prompts at every rate
    assert a.arrival_s[-1] > 100 and b.arrival_s[-1] < a.arrival_s[-1]
    hit = bench.stream_for(warm, 3)  # whole prompts, all but the last 1-16 tokens in the prefix cache
    np.testing.assert_array_equal(hit.input_tokens, b.input_tokens)
    new = hit.input_tokens - hit.cached_tokens
    assert ((new >= 1) & (new <= 16)).all() and (hit.cached_tokens % 16 == 0).all() and b.cached_tokens is None
    np.testing.assert_array_equal(hit.output_tokens, b.output_tokens)
    assert (bench.stream_for(burst, 3).arrival_s == 0).all()


def test_one_row_simulates_and_compares(bench):
    from opcast.predict.cost import load_kernel_cost

    run = bench.read_published()[0]
    pred = bench.predict_run(run, seeds=1, kernels=load_kernel_cost(None))
    rows = bench.compare(run, pred)
    assert [c.metric for c in rows] == ["TTFT p50", "TPOT p50", "TTFT p99", "TPOT p99"]
    for c in rows:
        assert c.lo <= c.predicted <= c.hi and c.predicted > 0
        assert c.error == pytest.approx(c.predicted / c.measured - 1)
    assert [c.targeted for c in rows] == [True, True, False, False]
    table = bench.markdown_table(rows)
    assert table.count("\n") == len(rows) + 1 and "TPOT p50" in table


def test_rows_run_vllm_0_8_3s_scheduler_limits(bench):
    """The run served with vLLM 0.8.3's V1 defaults on A100 (its ``_set_default_args_v1``: 2,048 batched
    tokens for the OpenAI server on GPUs not named H100/H200, 1,024 sequences), which the csv cites and
    the script passes over ``engine_defaults`` (the current vLLM's: 256 sequences on an A100)."""
    from opcast.hardware import get_device

    for run in llama_runs(bench):
        assert run.engine_overrides == {"max_num_seqs": 1024, "max_num_batched_tokens": 2048}
        eng = bench.engine_for(run, get_device(run.gpu))
        assert (eng.max_num_seqs, eng.max_num_batched_tokens, eng.chunked_prefill) == (1024, 2048, True)
    with open(bench.CSV_PATH, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["group"].startswith(LLAMA)]
    assert all("0.8.3" in r["engine_version"] and "--enable-prefix-caching" in r["server_flags"] for r in rows)
    assert all(r["config_source_url"].startswith("https://github.com/surajssd/llm-k8s/blob/58b61c5") for r in rows)


def test_a_bad_engine_column_is_refused_in_one_line(bench, tmp_path):
    with open(bench.CSV_PATH, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rows[0]["max_num_seqs"] = "lots"
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(SystemExit, match="max_num_seqs 'lots'; give a whole number >= 1"):
        bench.read_published(path)


def test_gpt_oss_rows_cite_gpustack_at_one_commit_and_run_vllm_defaults_of_their_gpu(bench):
    """GPUStack's baselines are ``vllm serve`` with its defaults on one GPU (v0.10.2 / v0.11.0: 8,192 batched
    tokens and 1,024 sequences on an H100, 2,048 and 256 on an A100, vllm-project/vllm pull request 17885),
    which are also the defaults ``engine_defaults`` follows: the csv's columns and the current rule agree."""
    from opcast.hardware import get_device
    from opcast.predict.serve.engine import engine_defaults

    runs = gpt_oss_runs(bench)
    assert len(runs) == 20 and {r.arch for r in runs} == {"gpt-oss-120b", "gpt-oss-20b"}
    for run in runs:
        assert run.source_url.startswith(
            "https://github.com/gpustack/gpustack/blob/1f37f1b8bd79c6b424a0cb55c7abd08a5c2132dc/docs/performance-lab/"
        )
        assert (run.tp, run.pp, run.rate_per_s, run.warm_prefix_cache) == (1, 1, math.inf, False)
        dev = get_device(run.gpu)
        base = engine_defaults("vllm", dev)
        assert run.engine_overrides == {
            "max_num_seqs": base.max_num_seqs,
            "max_num_batched_tokens": base.max_num_batched_tokens,
        }
        assert run.engine_overrides["max_num_batched_tokens"] == (8192 if "H100" in run.gpu else 2048)


def test_a_random_row_replays_every_prompt_at_its_printed_totals(bench):
    """``random`` rows: every request at the mean of the printed totals (not of the rounded throughputs), the
    same stream whatever the seed, all sent at once; ShareGPT rows keep the lognormal shape."""
    runs = {r.run: r for r in gpt_oss_runs(bench)}
    long = runs["gpt-oss-120b_h100_random_4k"]
    assert long.lengths == "fixed" and long.token_totals
    assert (long.mean_input_tokens, long.mean_output_tokens) == (1999249 / 500, 67205 / 500)
    a, b = bench.stream_for(long, 0), bench.stream_for(long, 7)
    assert (a.input_tokens == 3998).all() and (a.output_tokens == 134).all() and (a.arrival_s == 0).all()
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    share = runs["gpt-oss-20b_h100_sharegpt"]
    assert share.lengths == "sharegpt" and share.mean_input_tokens == pytest.approx(215.312)
    assert len(set(bench.stream_for(share, 0).input_tokens.tolist())) > 50


def test_a_gpt_oss_row_compares_its_means_and_throughput(bench):
    from opcast.predict.cost import load_kernel_cost

    run = next(r for r in gpt_oss_runs(bench) if r.run == "gpt-oss-20b_h100_random_128")
    pred = bench.predict_run(run, seeds=3, kernels=load_kernel_cost(None))
    assert len(pred.total_tokens_per_s) == 1  # a fixed burst does not depend on the seed
    rows = bench.compare(run, pred)
    assert [c.metric for c in rows] == [
        "TTFT p50",
        "TPOT p50",
        "TTFT p99",
        "TPOT p99",
        "TTFT mean",
        "TPOT mean",
        "total tok/s",
    ]
    assert [c.targeted for c in rows] == [True, True, False, False, False, False, False]
    assert rows[-1].measured == 28032.23 and rows[-1].predicted == pred.total_tokens_per_s[0] > 0


def test_a_bad_lengths_column_is_refused_in_one_line(bench, tmp_path):
    with open(bench.CSV_PATH, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rows[-1]["lengths"] = "poisson"
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(SystemExit, match="lengths 'poisson'; give one of sharegpt, fixed"):
        bench.read_published(path)


def test_a_group_no_run_has_exits_2_in_one_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--group", "no-such-group"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["error: --group 'no-such-group': no run's group contains it"]
