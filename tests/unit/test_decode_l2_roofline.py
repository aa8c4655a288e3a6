"""A decode step's roofline reads an L2-resident KV cache at the SMs' rate where that beats DRAM
(features v6, :data:`opcast.train.features.DECODE_L2_BYTES_PER_SM_CYCLE`), worked by hand.

The devices are catalog entries pinned to round numbers, so the arithmetic does not move when the
catalog does: an L40S (GDDR: 864 GB/s, 142 SMs at 2.52 GHz, 96 MiB L2) and an A100 (HBM:
2.039 TB/s, 108 SMs at 1.41 GHz, 40 MiB L2).
"""

from __future__ import annotations

import math

import pytest

from opcast.train.features import DECODE_L2_BYTES_PER_SM_CYCLE, feature_table

from helpers.synthetic import attention_columns, pinned_l2_devices

GDDR, HBM = pinned_l2_devices()


def _rows(seq_q: int, seq_kv: int, batch: int = 8, heads: int = 32, kv_heads: int = 8) -> dict:
    return attention_columns(batch, heads, kv_heads, seq_q, seq_kv)


def _decode_bytes(seq_kv: int, batch: int = 8, heads: int = 32, kv_heads: int = 8) -> float:
    # bf16: read Q and write O (2 * batch * heads * 128), read K and V (2 * batch * kv_heads * seq_kv * 128),
    # two bytes each, plus the fp32 logsumexp of every query row.
    return 2 * (2 * batch * heads * 128 + 2 * batch * kv_heads * seq_kv * 128) + 4 * batch * heads


def _one(table, name: str) -> float:
    return float(table[name].to_numpy()[0])


def test_resident_cache_on_gddr_is_read_at_the_sms_rate():
    # KV cache 8 * 8 * 2048 * 128 * 2 * 2 = 64 MiB, under the 96 MiB L2.
    moved = _decode_bytes(2048)
    assert moved == 67_240_960 < GDDR.l2_bytes
    t = feature_table(_rows(1, 2048), GDDR)
    sm_rate = 142 * 2.52e9 * DECODE_L2_BYTES_PER_SM_CYCLE  # 2.505 TB/s with 7 B per SM-clock, 2.9x the DRAM
    assert _one(t, "t_roof_s") == pytest.approx(moved / sm_rate)
    assert _one(t, "t_roof_s") == pytest.approx(26.843e-6, rel=1e-4)
    # The DRAM time stays what it was: only the reference the models divide by moves.
    assert math.exp(_one(t, "log_t_memory_s")) == pytest.approx(moved / 864e9)
    assert _one(t, "log_t_roof_cycles") == pytest.approx(math.log(moved / sm_rate * 2.52e9))


def test_cache_larger_than_the_l2_is_read_from_dram():
    # 128 MiB of KV cache does not fit the 96 MiB L2: the DRAM roofline, 155.5 us.
    moved = _decode_bytes(4096)
    assert moved > GDDR.l2_bytes
    t = feature_table(_rows(1, 4096), GDDR)
    assert _one(t, "t_roof_s") == pytest.approx(moved / 864e9)
    assert _one(t, "t_roof_s") == pytest.approx(155.497e-6, rel=1e-4)


def test_hbm_part_keeps_the_dram_roofline_for_a_resident_cache():
    # 16 MiB fits A100's 40 MiB L2, but its DRAM gives an SM 2.039e12 / (108 * 1.41e9) = 13.4 bytes
    # per clock, more than the 7 an SM takes from the L2: the DRAM roofline stands.
    moved = _decode_bytes(512)
    assert moved < HBM.l2_bytes
    t = feature_table(_rows(1, 512), HBM)
    assert _one(t, "t_roof_s") == pytest.approx(moved / 2.039e12)


def test_prefill_row_keeps_the_dram_roofline():
    # A prefill (seq_q > 1) of a cache that fits the L2 is not a decode step: no L2 term. 64 queries
    # over 2048 keys, memory-bound: FLOPs 4 * 8 * 32 * 128 * (64 * 2048 - 64 * 63 / 2) < bytes * ridge.
    t = feature_table(_rows(64, 2048), GDDR)
    flops = 4 * 8 * 32 * 128 * (64 * 2048 - 64 * 63 / 2)
    moved = 2 * (2 * 8 * 32 * 64 * 128 + 2 * 8 * 8 * 2048 * 128) + 4 * 8 * 32 * 64
    assert _one(t, "t_roof_s") == pytest.approx(max(flops / 362e12, moved / 864e9), rel=1e-3)
    assert _one(t, "t_roof_s") == pytest.approx(moved / 864e9, rel=1e-3)


def test_speedup_switches_off_exactly_where_the_cache_outgrows_the_l2():
    # Grow the cache one KV head at a time around the L2 size; the roofline per byte drops by the
    # DRAM / SM-rate ratio on the resident side only.
    sm_rate = 142 * 2.52e9 * DECODE_L2_BYTES_PER_SM_CYCLE
    seen = set()
    for kv_heads in range(10, 16):
        moved = _decode_bytes(2048, kv_heads=kv_heads, heads=kv_heads * 4)
        t = feature_table(_rows(1, 2048, kv_heads=kv_heads, heads=kv_heads * 4), GDDR)
        resident = moved <= GDDR.l2_bytes
        seen.add(resident)
        assert _one(t, "t_roof_s") == pytest.approx(moved / (sm_rate if resident else 864e9))
    assert seen == {True, False}
