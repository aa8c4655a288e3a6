"""vLLM's memory accounting before its KV cache, on hand-worked gpt-oss numbers (predict/serve/vllm_memory.py)."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.dtypes import weight_storage_bytes
from opcast.hardware import get_device
from opcast.predict.inference import infer_memory
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import engine_defaults
from opcast.predict.serve.kv_cache import kv_capacity
from opcast.predict.serve.vllm_memory import (
    MARLIN_MXFP4,
    PADDED_256_MXFP4,
    SAMPLER_BYTES_PER_LOGIT,
    sampler_peak_bytes,
    vllm_expert_layout,
)

GIB = 2**30
MXFP4_B = weight_storage_bytes("mxfp4")  # 4.25 bits: 0.53125 bytes


def test_vllm_picks_marlin_on_a100_and_h100_and_256_padding_on_b200_and_amd():
    oss = load_arch("gpt-oss-120b")
    assert vllm_expert_layout(oss, get_device("H100-SXM")) is MARLIN_MXFP4
    assert vllm_expert_layout(oss, get_device("A100-SXM4-80GB")) is MARLIN_MXFP4
    assert vllm_expert_layout(oss, get_device("B200")) is PADDED_256_MXFP4
    assert vllm_expert_layout(oss, get_device("MI300X")) is PADDED_256_MXFP4
    assert vllm_expert_layout(load_arch("llama3-8b"), get_device("H100-SXM")) is None  # nothing weight-only


def test_marlin_pads_gpt_oss_expert_to_3072_by_2944():
    """hidden 2880 -> 3072 (multiple of 256), intermediate 2880 -> 2944 (128); gate+up 2 x 2944 and down 2944 wide,
    3 x 2944 x 3072 = 27,131,904 elements at 0.53125 B = 14,413,824 B, biases (5888 + 3072) x 2 B = 17,920 B."""
    oss = load_arch("gpt-oss-120b")
    assert MARLIN_MXFP4.widths(oss, 2880) == (3072, 2944)
    assert MARLIN_MXFP4.expert_bytes(oss, 2880, MXFP4_B) == 14_413_824 + 17_920
    assert PADDED_256_MXFP4.widths(oss, 2880) == (3072, 3072)
    assert PADDED_256_MXFP4.widths(oss, 1440) == (3072, 1536)  # tp 2: each rank's 1440 padded on its own


def test_padded_weights_of_gpt_oss_120b_are_what_vllm_logs():
    """36 layers x 128 experts x 14,431,744 B plus the bf16 rest; vLLM 0.10.1 with Marlin on one H100 logged
    "Model loading took 65.9651 GiB" (vllm-project/vllm#23278)."""
    oss = load_arch("gpt-oss-120b")
    cfg = InferConfig(tp=1, batch=1, prompt_len=16, gen_len=1)
    plain = infer_memory(oss, cfg)
    padded = infer_memory(oss, cfg, experts=MARLIN_MXFP4)
    unpadded_experts = 36 * 128 * oss.mlp_params(2880) * MXFP4_B
    assert padded.weights_bytes - plain.weights_bytes == pytest.approx(36 * 128 * 14_431_744 - unpadded_experts)
    assert padded.weights_bytes / GIB == pytest.approx(65.9651, abs=0.1)


def test_moe_working_set_holds_the_fused_experts_intermediate_caches():
    """8,192 tokens of gpt-oss-120b, bf16: 2 x 8192 x (2 x 2880 + 80 x 64) for the residual, normed input and QKV,
    plus 2 x 8192 x 4 x (max(u, h) + f): unpadded u = 5760, f = 2880; Marlin u = 5888, h = 3072, f = 2944."""
    oss = load_arch("gpt-oss-120b")
    cfg = InferConfig(tp=1, batch=1, prompt_len=8192, gen_len=1)
    base = 2 * 8192 * (2 * 2880 + 80 * 64)
    assert infer_memory(oss, cfg).activations_bytes == base + 2 * 8192 * 4 * (5760 + 2880)
    assert infer_memory(oss, cfg, experts=MARLIN_MXFP4).activations_bytes == base + 2 * 8192 * 4 * (5888 + 2944)
    long = InferConfig(tp=1, batch=1, prompt_len=65_536, gen_len=1)  # Triton fused_experts: 32,768 tokens at once
    assert infer_memory(oss, long).activations_bytes == 2 * 65_536 * (2 * 2880 + 80 * 64) + 2 * 32_768 * 4 * 8640


def test_sampler_peak_counts_its_logit_copies_per_row_of_the_whole_vocabulary():
    """1,024 rows x 201,088 tokens: FlashInfer's path 14 B each (bf16 logits, fp32 copy, masked copy, softmax), the
    PyTorch path 28 B; plus the forward's 8,192 x 2,880 bf16 output."""
    oss = load_arch("gpt-oss-120b")
    assert SAMPLER_BYTES_PER_LOGIT == {"flashinfer": 14, "pytorch": 28}
    held = 8192 * 2880 * 2
    h100 = sampler_peak_bytes(oss, get_device("H100-SXM"), rows=1024, tokens=8192, act_bytes=2)
    assert h100 == 1024 * 201_088 * 14 + held
    mi300 = sampler_peak_bytes(oss, get_device("MI300X"), rows=1024, tokens=8192, act_bytes=2)
    assert mi300 == 1024 * 201_088 * 28 + held


def test_vllm_kv_capacity_of_gpt_oss_120b_on_h100_takes_padded_weights_and_the_sampler_peak():
    """0.9 x 80 GiB less the padded weights and the sampler's peak (1,024 rows, above the forward's ~0.7 GiB)."""
    oss, dev = load_arch("gpt-oss-120b"), get_device("H100-SXM")
    engine = engine_defaults("vllm", dev)
    cap = kv_capacity(oss, dev, InferConfig(tp=1), engine, longest_tokens=4096)
    padded = infer_memory(oss, InferConfig(tp=1, batch=1, prompt_len=8192, gen_len=1), experts=MARLIN_MXFP4)
    assert cap.weights_bytes == padded.weights_bytes
    assert cap.activations_bytes == 1024 * 201_088 * 14 + 8192 * 2880 * 2
    assert cap.blocks == int((0.9 * 80 * GIB - cap.weights_bytes - cap.activations_bytes) // cap.page_bytes)
    trt = kv_capacity(oss, dev, InferConfig(tp=1), engine_defaults("trtllm", dev), longest_tokens=4096)
    assert trt.weights_bytes < cap.weights_bytes - 5 * GIB  # other engines: the checkpoint's 4.25 bits, unpadded
