"""KV-cache capacity from the memory model, and block accounting, on hand-worked cases."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import ENGINES, MAX_BLOCK_SIZE, EngineConfig, engine_defaults
from opcast.predict.serve.kv_cache import BlockPool, blocks_for, kv_capacity

GIB = 2**30


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (16, 1), (17, 2), (32, 2), (33, 3), (1000, 63)])
def test_blocks_needed_are_the_ceiling_of_tokens_over_block_size(tokens, blocks):
    assert blocks_for(tokens, 16) == blocks


def test_block_pool_grows_by_whole_blocks_and_refuses_double_returns():
    pool = BlockPool(10, 16)
    assert pool.extra_for(0, 17) == 2
    pool.take(2)
    assert pool.extra_for(2, 32) == 0 and pool.extra_for(2, 33) == 1
    assert (pool.free, pool.used) == (8, 2)
    pool.give(2)
    with pytest.raises(RuntimeError):
        pool.give(1)
    with pytest.raises(RuntimeError):
        pool.take(11)


def test_llama3_8b_on_h100_hand_worked():
    """Llama-3-8B: 32 layers, 8 KV heads of 128, bf16 -> 2 x 8 x 128 x 2 B x 32 = 131,072 B per token;
    vLLM keeps 0.9 x 80 GiB; less the weights and the working set, in blocks of 16 tokens."""
    arch, dev = load_arch("llama3-8b"), get_device("H100-SXM")
    engine = engine_defaults("vllm", dev)
    cap = kv_capacity(arch, dev, InferConfig(tp=1), engine, longest_tokens=4096)
    assert cap.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32
    free = 0.9 * 80 * GIB - cap.weights_bytes - cap.activations_bytes
    assert cap.blocks == int(free // (16 * 131_072))
    assert 14.9 * GIB < cap.weights_bytes < 15.1 * GIB  # 8.03 B parameters x 2 B
    tp2 = kv_capacity(arch, dev, InferConfig(tp=2), engine, longest_tokens=4096)
    assert tp2.kv_bytes_per_token == cap.kv_bytes_per_token / 2 and tp2.blocks > 2 * cap.blocks


def test_trtllm_takes_its_fraction_of_the_memory_left_after_the_weights():
    arch, dev = load_arch("llama3-8b"), get_device("H100-SXM")
    engine = engine_defaults("trtllm", dev)
    cap = kv_capacity(arch, dev, InferConfig(tp=1), engine, longest_tokens=4096)
    left = 80 * GIB - cap.weights_bytes - cap.activations_bytes
    assert cap.blocks == int(0.9 * left // (32 * cap.kv_bytes_per_token))


def test_a_model_that_does_not_fit_says_by_how_much_and_what_to_change():
    arch, dev = load_arch("llama3-70b"), get_device("H100-SXM")
    with pytest.raises(OpcastError, match=r"does not fit in memory .* by \d+\.\d GiB.*more --tp/--pp") as err:
        kv_capacity(arch, dev, InferConfig(tp=1), engine_defaults("vllm", dev), longest_tokens=1024)
    assert "\n" not in str(err.value)
    with pytest.raises(OpcastError, match=r"holds \d+ tokens, but the longest request needs 10000000"):
        kv_capacity(load_arch("llama3-8b"), dev, InferConfig(tp=1), EngineConfig(), longest_tokens=10_000_000)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_has_defaults_on_small_and_large_gpus(engine):
    for gpu in ("A100-SXM4-40GB", "H100-SXM"):
        cfg = engine_defaults(engine, get_device(gpu))
        assert cfg.engine == engine and cfg.max_num_seqs >= 1 and cfg.overhead.fixed_s > 0
    assert engine_defaults("vllm", get_device("A100-SXM4-80GB")).max_num_batched_tokens == 2048  # vLLM: not A100
    assert engine_defaults("vllm", get_device("H100-SXM")).max_num_batched_tokens == 8192


def test_bad_engine_settings_are_refused():
    with pytest.raises(OpcastError, match="max_num_seqs 0"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(OpcastError, match=r"gpu_memory_utilization 1\.5"):
        EngineConfig(gpu_memory_utilization=1.5)
    with pytest.raises(OpcastError, match="--engine 'tgi'"):
        engine_defaults("tgi", get_device("H100-SXM"))


@pytest.mark.parametrize("block_size", [0, MAX_BLOCK_SIZE + 1, 10**8])
def test_a_kv_block_outside_the_engines_choices_is_refused(block_size):
    """--block-size had no upper bound: 10^8 tokens made one page larger than the GPU's memory, and the run
    was refused as 'the KV cache holds 0 tokens ... use more --tp/--pp'."""
    with pytest.raises(OpcastError, match=rf"^block_size {block_size} must lie in \[1, 256\] tokens"):
        EngineConfig(block_size=block_size)
    assert EngineConfig(block_size=MAX_BLOCK_SIZE).block_size == MAX_BLOCK_SIZE == 256  # vLLM's largest


def test_capacity_of_an_arch_whose_every_layer_is_windowed_is_counted_in_window_pages():
    from opcast.predict.serve.kv_cache import KvCapacity, KvLayout

    # Mistral-7B-v0.1 windows every layer: one group of pages, none of full attention
    cap = KvCapacity(
        blocks=100,
        block_size=16,
        kv_bytes_per_token=1.0,
        layout=KvLayout(full=0, window=1, window_blocks=257),
        page_bytes=16.0,
        weights_bytes=0.0,
        activations_bytes=0.0,
        usable_bytes=1.0,
    )
    assert cap.tokens == 100 * 16  # a page per block of tokens, as if none had left the window yet
    assert cap.pages(4096) == 256 and cap.pages(8192) == 257  # a sequence holds at most its window's pages
