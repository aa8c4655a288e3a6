"""A fused MoE layer's learned price under a model's routing: the kernel is measured with balanced routing, a real
decode batch reaches fewer experts (uniformly routed, :func:`opcast.archs.expert_occupancy`), and the learned price
is asked at the balanced tokens that reach as many (:func:`opcast.archs.balanced_equivalent_tokens`)."""

import pytest

from opcast.archs import balanced_equivalent_tokens, expert_occupancy, load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost, roofline_only
from opcast.predict.inference import predict_infer
from opcast.predict.parallel import InferConfig


def _moe(tokens: int, experts: int = 128, topk: int = 4, ep: int = 1) -> dict:
    return {"tokens": tokens, "experts": experts, "topk": topk, "ep": ep}


@pytest.mark.parametrize(
    ("tokens", "experts", "topk", "ep", "want"),
    [
        # 32 tokens picking 4 of 128: 128 experts balanced, 1 - (124/128)**32 of them (82) at random: 20 tokens' 80
        (32, 128, 4, 1, 20),
        (16, 128, 4, 1, 12),  # 51 experts at random, 64 balanced
        (4, 128, 4, 1, None),  # 16 pairs: 16 experts balanced, 15.1 -> 16 at random
        (1, 128, 4, 1, None),
        (1024, 128, 4, 1, None),  # every expert either way
        (4, 8, 2, 1, 3),  # Mixtral at batch 4: 8 pairs reach all 8 balanced, 5.5 -> 6 at random
        (8, 8, 2, 1, None),
        (32, 256, 8, 8, 21),  # expert parallelism: one rank's 32 experts, the group's 32 tokens
    ],
)
def test_the_balanced_tokens_reach_the_experts_a_random_batch_does(tokens, experts, topk, ep, want):
    got = balanced_equivalent_tokens(_moe(tokens, experts, topk, ep))
    assert got == want
    if got is not None:
        busy, _ = expert_occupancy(experts=experts, topk=topk, tokens=-(-tokens // ep), ep=ep)
        balanced = min(experts // ep, -(-got * topk // ep))
        assert balanced <= busy < min(experts // ep, -(-tokens * topk // ep))
        assert busy - balanced < topk  # as many as whole tokens allow


OSS = load_arch("gpt-oss-120b")
B200 = get_device("B200")


def _decode_moe(kernels, batch: int) -> dict:
    cfg = InferConfig(batch=batch, prompt_len=1024, gen_len=64, engine="vllm", mxfp4_moe="mxfp8", kv_dtype="fp8")
    r = predict_infer(OSS, B200, cfg, kernels=kernels)
    assert r.feasible, r.reasons
    return next(o for o in r.ops if o["phase"] == "decode" and o["kind"] == "moe")


def test_a_learned_decode_layer_is_priced_at_its_balanced_tokens_and_says_so():
    """gpt-oss-120b on B200 at batch 32 (learned set): the line keeps the batch's 32 tokens, is priced at 20, and
    costs less than the 32-token balanced kernel; at batch 4 nothing changes."""
    learned = load_kernel_cost(None, use_learned=True)
    line = _decode_moe(learned, 32)
    assert line["params"]["tokens"] == 32 and line["priced_at_tokens"] == 20
    assert line["source"].startswith("learned")
    as_balanced, _ = learned.time_s(learned_kernel(line), B200)
    assert line["time_s"] < 0.9 * as_balanced
    assert "priced_at_tokens" not in _decode_moe(learned, 4)


def test_grouped_gemms_count_random_routing_themselves():
    """The roofline set prices the layer as its grouped GEMMs (uniform occupancy already): no second reduction."""
    line = _decode_moe(roofline_only(), 32)
    assert "priced_at_tokens" not in line and line["params"]["tokens"] == 32


def learned_kernel(line: dict):
    from opcast.predict.cost.query import kernel

    return kernel("moe", line["params"], line["dtype"], line["direction"])
