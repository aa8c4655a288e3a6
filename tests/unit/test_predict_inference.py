"""Inference: prefill, decode, KV cache, feasibility."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict import inference
from opcast.predict.cost import roofline_only
from opcast.predict.inference import predict_infer
from opcast.predict.memory import kv_cache_bytes
from opcast.predict.parallel import InferConfig

H100 = get_device("H100-SXM")
LLAMA = load_arch("llama2-7b")


def infer(arch=LLAMA, device=H100, **kw):
    return predict_infer(arch, device, InferConfig(**kw), kernels=roofline_only())


def test_latency_adds_up_and_throughput_follows():
    r = infer(batch=4, prompt_len=512, gen_len=64)
    assert r.feasible
    assert r.total_latency_s == pytest.approx(r.ttft_s + 63 * r.tpot_s)
    assert r.tokens_per_s == pytest.approx(4 * 64 / r.total_latency_s)
    assert r.ttft_s == pytest.approx(sum(r.breakdown_s["prefill"].values()))
    assert r.kv_cache_bytes == kv_cache_bytes(LLAMA, tp=1, pp=1, batch=4, tokens=576, dtype="bf16")


def test_decode_is_memory_bound_and_grows_with_context():
    short = infer(batch=1, prompt_len=128, gen_len=32)
    long = infer(batch=1, prompt_len=3072, gen_len=32)
    assert long.tpot_s > short.tpot_s
    weights = 2 * LLAMA.params_total()
    assert short.tpot_s > weights / H100.mem_bw_bytes_per_s  # at least one read of the weights per token


def test_sampled_decode_steps_are_exact_for_the_linear_law(monkeypatch):
    exact = infer(batch=2, prompt_len=256, gen_len=40)
    monkeypatch.setattr(inference, "DECODE_SAMPLES", 5)
    sampled = infer(batch=2, prompt_len=256, gen_len=40)
    assert sampled.tpot_s == pytest.approx(exact.tpot_s, rel=0.01)


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    one = infer(batch=8, prompt_len=512, gen_len=16)
    four = infer(batch=8, prompt_len=512, gen_len=16, tp=4)
    assert four.memory.weights_bytes < one.memory.weights_bytes / 3.5
    assert four.breakdown_s["decode_step"]["tp_comm"] > 0 == one.breakdown_s["decode_step"]["tp_comm"]


def test_infeasible_inference_lists_every_reason():
    r = infer(load_arch("gpt3-1.3b"), tp=3, pp=5, batch=1, prompt_len=2000, gen_len=100)
    text = " | ".join(r.reasons)
    assert "tp=3 does not divide" in text and "pp=5 does not divide" in text and "exceeds max_seq=2048" in text
    big = infer(load_arch("llama2-70b"), batch=64, prompt_len=4000, gen_len=96)
    assert not big.feasible and "does not fit" in big.reasons[0]
