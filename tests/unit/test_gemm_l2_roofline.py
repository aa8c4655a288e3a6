"""A GEMM's roofline reads operands that fit half the L2 at the SMs' rate where that beats DRAM
(features v7, :data:`opcast.train.features.GEMM_L2_RESIDENT_SHARE`), worked by hand.

The devices are catalog entries pinned to round numbers, so the arithmetic does not move when the
catalog does: an L40S (GDDR: 864 GB/s, 142 SMs at 2.52 GHz, 96 MiB L2, 362 bf16 TFLOP/s) and an
A100 (HBM: 2.039 TB/s, 108 SMs at 1.41 GHz, 40 MiB L2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from opcast.train.features import DECODE_L2_BYTES_PER_SM_CYCLE, GEMM_L2_RESIDENT_SHARE, feature_table

from helpers.synthetic import pinned_l2_devices

GDDR, HBM = pinned_l2_devices()
SM_RATE = 142 * 2.52e9 * DECODE_L2_BYTES_PER_SM_CYCLE  # 2.505 TB/s with 7 B per SM-clock, 2.9x the L40S's DRAM


def _gemm(m: int, n: int, k: int, direction: str = "fwd") -> dict:
    return {
        "op": np.array(["gemm"], dtype=object),
        "dtype": np.array(["bf16"], dtype=object),
        "direction": np.array([direction], dtype=object),
        "b": np.array([1]),
        "m": np.array([m]),
        "n": np.array([n]),
        "k": np.array([k]),
    }


def _one(table, name: str) -> float:
    return float(table[name].to_numpy()[0])


def test_memory_bound_gemm_within_half_the_l2_is_read_at_the_sms_rate():
    # A decode-sized linear layer: 16 tokens through a 4096 x 4096 weight, 2 * (16*4096 + 4096*4096
    # + 16*4096) = 33.8 MB, under half the 96 MiB L2 (50.3 MB).
    moved = 2 * (16 * 4096 + 4096 * 4096 + 16 * 4096)
    assert moved == 33_816_576 < GEMM_L2_RESIDENT_SHARE * GDDR.l2_bytes
    t = feature_table(_gemm(16, 4096, 4096), GDDR)
    assert _one(t, "t_roof_s") == pytest.approx(moved / SM_RATE)
    assert _one(t, "t_roof_s") == pytest.approx(13.500e-6, rel=1e-3)
    # The DRAM time stays what it was (39.1 us): only the reference the models divide by moves.
    assert math.exp(_one(t, "log_t_memory_s")) == pytest.approx(moved / 864e9)


def test_gemm_between_half_and_the_whole_l2_is_read_from_dram():
    # 67.5 MB: inside the 100.7 MB L2, outside the half a GEMM's operands keep. A decode step's
    # KV cache of that size would be L2-resident; a GEMM's is not.
    moved = 2 * (16 * 4096 + 4096 * 8192 + 16 * 8192)
    assert GEMM_L2_RESIDENT_SHARE * GDDR.l2_bytes < moved < GDDR.l2_bytes
    t = feature_table(_gemm(16, 8192, 4096), GDDR)
    assert _one(t, "t_roof_s") == pytest.approx(moved / 864e9)
    assert _one(t, "t_roof_s") == pytest.approx(78.127e-6, rel=1e-4)


def test_compute_bound_resident_gemm_keeps_its_compute_time():
    # 1024^3: 6.3 MB, resident, but 2.147 GFLOP at 362 TFLOP/s (5.93 us) outlasts the L2 read (2.5 us).
    t = feature_table(_gemm(1024, 1024, 1024), GDDR)
    assert _one(t, "t_roof_s") == pytest.approx(2 * 1024**3 / 362e12)


def test_hbm_part_keeps_the_dram_roofline_for_a_resident_gemm():
    # 8.5 MB fits half of A100's 40 MiB L2, but its DRAM gives an SM 13.4 bytes per clock, more
    # than the 7 an SM takes from the L2: the DRAM roofline stands.
    moved = 2 * (16 * 2048 + 2048 * 2048 + 16 * 2048)
    assert moved < GEMM_L2_RESIDENT_SHARE * HBM.l2_bytes
    t = feature_table(_gemm(16, 2048, 2048), HBM)
    assert _one(t, "t_roof_s") == pytest.approx(moved / 2.039e12)


def test_speedup_switches_off_exactly_where_the_operands_outgrow_half_the_l2():
    # Widen the weight 256 columns at a time around 50.3 MB; the roofline per byte drops by the
    # DRAM / SM-rate ratio on the resident side only, forward and backward alike.
    seen = set()
    for direction, scale in (("fwd", 1), ("bwd", 2)):  # a backward GEMM moves twice the forward's bytes
        for n in range(2048, 8192, 256):
            moved = scale * 2 * (16 * 4096 + 4096 * n + 16 * n)
            t = feature_table(_gemm(16, n, 4096, direction), GDDR)
            resident = moved <= GEMM_L2_RESIDENT_SHARE * GDDR.l2_bytes
            seen.add((direction, resident))
            assert _one(t, "t_roof_s") == pytest.approx(moved / (SM_RATE if resident else 864e9))
    assert seen == {("fwd", True), ("fwd", False), ("bwd", True), ("bwd", False)}
