"""gpt-oss: its config, sliding-window blocks (attention, KV cache, serving pages) and MXFP4 experts, on
hand-worked cases."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.archs import arch_from_hf_config, load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.graph import window_core
from opcast.predict.inference import block_kinds, infer_memory
from opcast.predict.memory import kv_cache_bytes
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import engine_defaults
from opcast.predict.serve.kv_cache import BlockPool, KvLayout, kv_capacity, kv_layout
from opcast.predict.weight_only import weight_only_time_s

LAYER_TYPES = ["sliding_attention", "full_attention"] * 18
GPT_OSS_120B_HF = {  # openai/gpt-oss-120b config.json (the keys opcast reads)
    "model_type": "gpt_oss",
    "attention_bias": True,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "layer_types": LAYER_TYPES,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens"],
        "quant_method": "mxfp4",
    },
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}
OSS = load_arch("gpt-oss-120b")
H100 = get_device("H100-SXM")


def test_the_config_counts_every_parameter_of_the_model_card():
    """Per block: attention 2880 x (4096 + 2 x 512) + 4096 x 2880 + biases 4096 + 1024 + 2880 = 26,550,080, sinks
    64, 128 experts of 2880 x 5760 + 2880 x 2880 + biases 5760 + 2880 = 24,891,840, router 2880 x 128 + 128,
    norms 5760; 36 blocks, embedding and head 201,088 x 2,880 each, final norm: 116,829,156,672 (the card's
    116.83B). Active: 4 experts a block, 5.13B without the embedding (the card's)."""
    arch = arch_from_hf_config(GPT_OSS_120B_HF, "x")
    assert arch.params_total() == 116_829_156_672
    assert arch.active_params_total() - 201088 * 2880 == pytest.approx(5.13e9, rel=0.001)
    assert (arch.windowed_layers, arch.sliding_window, arch.expert_weights) == (18, 128, "mxfp4")
    skip = ("name", "source", "hf_activation", "attention_dropout", "hidden_dropout")  # dropouts: 0 either way
    preset = {f: v for f, v in dataclasses.asdict(OSS).items() if f not in skip}
    assert preset == {f: v for f, v in dataclasses.asdict(arch).items() if f not in skip}
    assert (
        (arch.attention_dropout_p, arch.hidden_dropout_p) == (0, 0) == (OSS.attention_dropout_p, OSS.hidden_dropout_p)
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["sliding", "full"]}, "layer_types="),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method='awq'"),
        ({"layer_types": LAYER_TYPES[:30]}, "layer_types lists 30 blocks, num_hidden_layers=36"),
    ],
)
def test_a_bad_key_is_named(change, message):
    with pytest.raises(OpcastError, match=message):
        arch_from_hf_config({**GPT_OSS_120B_HF, **change}, "x")


def test_mistral_v01_windows_every_block():
    cfg = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "vocab_size": 32000,
    }
    arch = arch_from_hf_config(cfg, "mistral-7b-v0.1")
    assert arch.windowed_layers == 32 and arch.attended_keys(10_000) == 4096 and arch.attended_keys(100) == 100
    assert block_kinds(arch) == ((arch, 32),)


def test_windowed_attention_is_priced_over_the_window():
    """A fresh prompt of 1,000 tokens under a 128-key window does sum min(j + 1, 128) = 8,256 + 872 x 128 =
    119,872 query-key pairs; priced as 1,000 x 128 unmasked, W (W - 1) / 2 = 8,128 over. A decode step
    reads 128 keys; a prompt within the window is the causal prompt itself."""
    full, local = (a for a, _ in block_kinds(OSS))
    assert (full.sliding_window, local.sliding_window, local.windowed_layers) == (None, 128, 36)
    assert [n for _, n in block_kinds(OSS)] == [18, 18]
    attn = {"batch": 1, "heads": 64, "kv_heads": 8, "head_dim": 64, "impl": "flash"}
    p = window_core(local, attn, seq_q=1000, seq_kv=1000)
    assert (p["seq_q"], p["seq_kv"], p["causal"]) == (1000, 128, False)
    assert p["seq_q"] * p["seq_kv"] - sum(min(j + 1, 128) for j in range(1000)) == 128 * 127 // 2
    assert window_core(local, attn, seq_q=1, seq_kv=4096) == {**attn, "seq_q": 1, "seq_kv": 128, "causal": False}
    assert window_core(local, attn, seq_q=100, seq_kv=100)["causal"] is True
    assert window_core(full, attn, seq_q=1, seq_kv=4096)["seq_kv"] == 4096

    # training prices gpt-oss's blocks alike: the mean of 18 causal 4,096-token cores (2,048.5 keys a query) and
    # 18 windowed ones (128), 1,088.25 keys, unmasked
    mean = window_core(OSS, attn, seq_q=4096, seq_kv=4096)
    assert (mean["seq_q"], mean["seq_kv"], mean["causal"]) == (4096, 1088, False)
    assert window_core(OSS, attn, seq_q=100, seq_kv=100)["causal"] is True


def test_the_kv_cache_of_windowed_blocks_holds_the_window():
    """2 x 8 KV heads x 64 x 2 B = 2,048 B a token and block: 18 full blocks hold 1,000 tokens, 18 windowed 128."""
    assert kv_cache_bytes(OSS, tp=1, pp=1, batch=1, tokens=1000, dtype="bf16") == 2048 * (18 * 1000 + 18 * 128)
    assert kv_cache_bytes(OSS, tp=1, pp=1, batch=1, tokens=100, dtype="bf16") == 2048 * 36 * 100


def test_serving_pages_follow_vllm_hybrid_manager():
    """18 full and 18 windowed blocks: pages of gcd = 18 layers, one of each kind per block of 16 tokens; a
    windowed group keeps ceil(127 / 16) + 1 = 9 pages. 1,000 tokens: 63 + 9 pages; 100 tokens: 7 + 7."""
    layout, layers = kv_layout(OSS, 16)
    assert (layout, layers) == (KvLayout(full=1, window=1, window_blocks=9), 18)
    pool = BlockPool(100, 16, layout)
    assert pool.pages(1000) == 72 and pool.pages(100) == 14 and pool.extra_for(14, 1000) == 58
    assert kv_layout(load_arch("llama3-8b"), 16) == (KvLayout(), 32)


def test_windows_double_the_context_a_replica_holds():
    engine = engine_defaults("vllm", H100)
    cap = kv_capacity(OSS, H100, InferConfig(), engine, longest_tokens=4096)
    full = dataclasses.replace(OSS, sliding_window=None, sliding_window_layers=None)
    cap_full = kv_capacity(full, H100, InferConfig(), engine, longest_tokens=4096)
    assert cap.page_bytes == pytest.approx(cap_full.page_bytes / 2) and cap.blocks == 2 * cap_full.blocks
    assert cap.tokens == (cap.blocks - 9) * 16  # one long sequence: its windowed pages aside
    assert cap.kv_bytes == pytest.approx(cap_full.kv_bytes)


def test_mxfp4_experts_weigh_and_read_4_25_bits():
    """Weights: the experts (36 x 128 x 24,891,840) at 4.25 bits, the rest in bf16 (the vocab 201,088 pads to
    itself). A decode GEMM 1 x 5760 x 2880 moves (2880 + 5760) x 2 B of activations and 16,588,800 weights:
    0.53125 B each instead of 2, time x 8,830,080 / 33,194,880; a prefill-sized one stays compute-bound."""
    expert = 36 * 128 * 24_891_840
    mem = infer_memory(OSS, InferConfig())
    assert mem.weights_bytes == 2 * (116_829_156_672 - expert) + 0.53125 * expert
    decode = {"b": 1, "m": 1, "n": 5760, "k": 2880}
    assert weight_only_time_s(1.0, decode, device=H100, dtype="bf16", storage="mxfp4") == pytest.approx(
        (17_280 + 0.53125 * 16_588_800) / (17_280 + 2 * 16_588_800)
    )
    prefill = {"b": 1, "m": 8192, "n": 5760, "k": 2880}
    assert weight_only_time_s(1.0, prefill, device=H100, dtype="bf16", storage="mxfp4") == 1.0


def test_gpt_oss_120b_fits_one_h100_through_the_console_script():
    opcast = str(Path(sys.executable).with_name("opcast"))
    out = subprocess.run(
        [opcast, "predict", "infer", "--arch", "gpt-oss-120b", "--gpu", "H100-SXM", "--batch", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["fits"] and doc["tpot_s"] > 0
    experts = [op for op in doc["ops"] if op["phase"] == "decode" and op["role"] == "experts"]
    assert experts and all(op["kind"] == "moe" and op["params"]["weights"] == "mxfp4" for op in experts)
    assert all(0 < op["memory_bw_utilisation"] <= 1 for op in experts)
    bad = subprocess.run(
        [opcast, "predict", "infer", "--arch", "gpt-oss-120b", "--gpu", "H100-SXM", "--batch", "4", "--tp", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
