"""Step prices agree with the inference path they come from, and interpolate between table points."""

from __future__ import annotations

import itertools

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.cost import roofline_only
from opcast.predict.inference import forward_time_s, predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.step_cost import PricedStepCost, grid, interp1, interp2

ARCH, GPU = "llama3-8b", "H100-SXM"


@pytest.fixture(scope="module")
def priced():
    arch, dev = load_arch(ARCH), get_device(GPU)
    kernels = roofline_only("test")
    cfg = InferConfig(tp=2)
    step = PricedStepCost(arch, dev, cfg, gpus_per_node=8, kernels=kernels, max_tokens=2048, max_seqs=256, max_len=4096)
    return arch, dev, cfg, kernels, step


def test_grid_is_every_integer_to_8_then_geometric_to_the_limit():
    g = grid(1000)
    assert g[:8] == list(range(1, 9)) and g[-1] == 1000
    assert all(b / a <= 2 ** (1 / 4) + 0.1 for a, b in itertools.pairwise(g[8:]))
    assert grid(1) == [1]


def test_interpolation_is_exact_at_points_and_linear_between():
    xs, ys = [1, 2, 4], [10.0, 20.0, 60.0]
    assert interp1(xs, ys, 2) == 20.0 and interp1(xs, ys, 3) == 40.0 and interp1(xs, ys, 5) == 80.0
    table = [[1.0, 2.0], [3.0, 4.0]]
    assert interp2([1, 3], [1, 3], table, 2, 2) == pytest.approx(2.5)


def test_a_prefill_only_step_is_the_inference_paths_prefill(priced):
    arch, dev, _, kernels, step = priced
    for tokens in (8, 512, 2048):
        assert tokens in step.tokens
        expected = predict_infer(
            arch, dev, InferConfig(tp=2, batch=1, prompt_len=tokens, gen_len=1), kernels=kernels, details=False
        ).ttft_s
        assert step([(tokens, tokens)], 0, 0) == pytest.approx(expected, rel=1e-9)


def test_a_decode_step_is_the_inference_paths_decode_step(priced):
    arch, dev, cfg, kernels, step = priced
    kv = step.kv[20]
    one = forward_time_s(
        arch, dev, cfg, batch=1, seq_q=1, seq_kv=kv, gpus_per_node=8, kernels=kernels, comms=CollectiveCostModel()
    )
    assert step([], 1, kv) == pytest.approx(one, rel=1e-9)


def test_steps_cost_more_with_more_work(priced):
    *_, step = priced
    assert step([], 64, 64 * 1000) > step([], 8, 8 * 1000) > step([], 8, 8 * 100)
    assert step([(1000, 3000)], 8, 8000) > step([(1000, 1000)], 8, 8000) > step([], 8, 8000)


def test_between_table_points_the_price_stays_within_2_percent(priced):
    arch, dev, _, kernels, step = priced
    for tokens in (300, 1500):
        assert tokens not in step.tokens
        exact = predict_infer(
            arch, dev, InferConfig(tp=2, batch=1, prompt_len=tokens, gen_len=1), kernels=kernels, details=False
        ).ttft_s
        assert step([(tokens, tokens)], 0, 0) == pytest.approx(exact, rel=0.02)
