"""Attention's tile and latency features, checked against values worked by hand (issue 17).

The device is the catalog's A100 pinned to round numbers (108 SMs, 1.41 GHz, 2.039 TB/s, 312
TFLOP/s bf16), so the arithmetic below does not move when the catalog entry does.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from opcast.hardware import get_device
from opcast.train.features import FEATURES, _kv_splits, feature_table

from helpers.synthetic import attention_columns

DEVICE = dataclasses.replace(
    get_device("A100-SXM4-80GB"),
    sm_count=108,
    boost_clock_hz=1.41e9,
    mem_bw_bytes_per_s=2.039e12,
    peak_bf16_flops=312e12,
)


_row = attention_columns


def _one(table, name: str) -> float:
    return float(table[name].to_numpy()[0])


def test_attention_declares_the_latency_features():
    assert FEATURES["attention"][-3:] == ("log_t_roof_cycles", "log_tile_t_roof_cycles", "log_dram_bytes_per_sm_cycle")


def test_prefill_tiles_and_latency_features_by_hand():
    # batch 2, 16 heads (4 KV heads), 1000 tokens, head_dim 128, causal.
    t = feature_table(_row(2, 16, 4, 1000, 1000), DEVICE)
    # Query tiles of 128 rows per (sequence, head): 2 * 16 * ceil(1000 / 128) = 2 * 16 * 8.
    assert math.exp(_one(t, "log_tiles")) == pytest.approx(256.0)
    assert _one(t, "tile_fill") == pytest.approx(1000 / 1024)
    assert _one(t, "waves") == pytest.approx(256 / 108)
    # FLOPs 4 * 2 * 16 * 128 * (1000 * 1001 / 2) = 8 200 192 000 at 312 TFLOP/s: 26.2827 us, above the
    # memory time (20 608 000 bytes / 2.039 TB/s = 10.107 us), so t_roof is compute.
    t_roof = 8_200_192_000 / 312e12
    assert _one(t, "t_roof_s") == pytest.approx(t_roof)
    assert math.exp(_one(t, "log_t_roof_cycles")) == pytest.approx(t_roof * 1.41e9)  # 37 058.6 cycles
    # One SM's share: t_roof / waves, in cycles.
    assert math.exp(_one(t, "log_tile_t_roof_cycles")) == pytest.approx(t_roof * 108 / 256 * 1.41e9)
    # 2.039e12 / (108 * 1.41e9) = 13.39 bytes per SM per cycle.
    assert math.exp(_one(t, "log_dram_bytes_per_sm_cycle")) == pytest.approx(13.3898, rel=1e-4)


def test_decode_step_is_tiled_per_kv_head_and_split_over_the_cache():
    # batch 4, 32 heads over 8 KV heads, one query over 1000 cached tokens, head_dim 128.
    t = feature_table(_row(4, 32, 8, 1, 1000), DEVICE)
    # Packed queries: 32 / 8 = 4 rows per (sequence, KV head) in one 64-row tile: 4 * 8 * 1 = 32
    # blocks, under 0.8 of the 2 * 108 = 216 slots, so the 1000 keys (8 blocks of 128) are split.
    # Eligible split counts of 8 blocks: 1, 2, 3, 4, 8 (5, 6, 7 give 2 blocks per split as 4 does);
    # wave efficiency 32 s / 216 over its ceiling: 0.148, 0.296, 0.444, 0.593, 0.593 (1.185 / 2);
    # the first at >= 0.85 * 0.593 is s = 4: 32 * 4 = 128 tiles.
    assert math.exp(_one(t, "log_tiles")) == pytest.approx(128.0)
    assert _one(t, "tile_fill") == pytest.approx(4 / 64 * 1000 / 1024)
    assert _one(t, "tail_efficiency") == pytest.approx((128 / 108) / 2)
    # Memory-bound: bytes 2 * (2 * 4 * 32 * 1 * 128 + 2 * 4 * 8 * 1000 * 128) + 4 * 4 * 32 = 4 162 048.
    bytes_moved = 2 * (2 * 4 * 32 * 128 + 2 * 4 * 8 * 1000 * 128) + 4 * 4 * 32
    assert _one(t, "bytes") == pytest.approx(bytes_moved)
    t_roof = bytes_moved / 2.039e12
    assert _one(t, "t_roof_s") == pytest.approx(t_roof)
    assert math.exp(_one(t, "log_t_roof_cycles")) == pytest.approx(t_roof * 1.41e9)  # 2878 cycles
    assert math.exp(_one(t, "log_tile_t_roof_cycles")) == pytest.approx(t_roof * 108 / 128 * 1.41e9)


def test_decode_step_with_a_full_grid_is_not_split():
    # 64 sequences x 8 KV heads = 512 blocks >= 0.8 * 216: one block per (sequence, KV head).
    t = feature_table(_row(64, 32, 8, 1, 4096), DEVICE)
    assert math.exp(_one(t, "log_tiles")) == pytest.approx(512.0)


def test_decode_head_dim_sets_the_kv_block():
    # head_dim 64: 256 keys per block, so 1000 keys are 4 blocks; one block of 216 slots. Eligible
    # split counts 1, 2, 4 (3 gives 2 blocks per split, as 2 does); efficiencies 1/216, 2/216,
    # 4/216: only the best (s = 4) is within 85 % of it.
    assert _kv_splits(np.array([1.0]), np.array([4.0]), 216).tolist() == [4.0]
    t = feature_table(_row(1, 1, 1, 1, 1000, head_dim=64), DEVICE)
    assert math.exp(_one(t, "log_tiles")) == pytest.approx(4.0)
    assert _one(t, "tile_fill") == pytest.approx(1 / 64 * 1000 / 1024)


def test_split_heuristic_matches_flash_attention_cases():
    # flash_api.cpp's num_splits_heuristic: 8 blocks over 32 KV blocks and 216 slots -> 16 splits
    # (eligible 11: 0.41, 16: 0.593, 32: 0.593; first >= 0.504 is 16); 300 blocks fill the GPU -> 1.
    assert _kv_splits(np.array([8.0, 300.0]), np.array([32.0, 32.0]), 216).tolist() == [16.0, 1.0]
