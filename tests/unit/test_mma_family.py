"""The tensor-core instruction family of a device (DeviceSpec.mma_family), the GEMM/attention
features that carry it (train.features.MMA_FEATURES), and the hierarchical estimator's level model,
the one model that reads them."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from opcast.hardware import MMA_FAMILIES, derive_device, get_device
from opcast.train.estimators.hier import LEVEL_FEATURES, HierEstimator
from opcast.train.features import FEATURES, MMA_FEATURES, features, model_inputs

FAST = {"n_estimators": 60, "n_jobs": 1}


@pytest.mark.parametrize(
    ("gpu", "family"),
    [
        ("V100-SXM2-32GB", "mma.sync"),
        ("T4", "mma.sync"),
        ("A100-SXM4-80GB", "mma.sync"),
        ("L40S", "mma.sync"),
        ("H100-SXM", "wgmma"),
        ("H20", "wgmma"),  # a cut-down Hopper: its low rate does not make it another family
        ("GH200", "wgmma"),
        ("B200", "tcgen05"),
        ("GB300", "tcgen05"),
        ("RTX-PRO-6000", "mma.sync"),  # sm_120: Blackwell without tcgen05
        ("P100-PCIe-16GB", None),  # no tensor cores
        ("MI300X", None),
        ("Arc-Pro-B60", None),
    ],
)
def test_catalog_gpus_map_to_their_instruction_family(gpu: str, family: str | None) -> None:
    assert get_device(gpu).mma_family == family


def test_a_blackwell_at_the_sm120_rate_is_an_mma_sync_part() -> None:
    b200 = get_device("B200")
    # a quarter of B200's tensor rate per SM and clock is about sm_120's (RTX PRO 6000: ~1.0e3 FLOP)
    quarter = derive_device(b200, ["peak_bf16_flops=x0.25", "peak_fp16_flops=x0.25"])
    assert quarter.architecture == "blackwell"
    assert quarter.mma_family == "mma.sync"
    # a network-only change keeps the family
    assert derive_device(b200, ["gpus_per_node=4"]).mma_family == "tcgen05"


def test_only_the_tensor_core_kinds_declare_the_family_features() -> None:
    for kind, names in FEATURES.items():
        matrix = kind in ("gemm", "attention", "moe")  # moe: a fused layer of grouped GEMMs
        assert set(MMA_FEATURES) <= set(names) if matrix else not set(MMA_FEATURES) & set(names)


@pytest.mark.parametrize("gpu", ["A100-SXM4-80GB", "H200", "GB200", "RTX-PRO-6000", "MI300X"])
def test_half_and_fp8_rows_carry_a_one_hot_family_and_fp32_rows_none(gpu: str) -> None:
    device = get_device(gpu)
    rows = pd.DataFrame(
        {"op": "gemm", "dtype": ["bf16", "fp16", "fp8", "fp32", "tf32"], "direction": "fwd", "b": 1, "m": 4096}
        | {"n": 4096, "k": 4096}
    )
    feats = features(rows, device)
    expected = [float(device.mma_family == fam) for fam in MMA_FAMILIES]
    for i, dtype in enumerate(rows["dtype"]):
        got = [feats[name].iloc[i] for name in MMA_FEATURES]
        if dtype in ("fp32", "tf32"):
            assert all(math.isnan(v) for v in got), (gpu, dtype, got)
        elif dtype == "fp8" and not device.supports("fp8"):
            continue
        else:
            assert got == expected, (gpu, dtype, got)


def test_only_the_hierarchical_estimator_reads_the_family():
    for kind in ("gemm", "attention"):
        assert set(MMA_FEATURES) <= set(model_inputs(kind, "hier"))
        for name in ("xgb", "tile-mlp"):
            assert not set(MMA_FEATURES) & set(model_inputs(kind, name)), (kind, name)


def _gpu(arch: str, peak_scale: float, l2_scale: int = 1):
    base = get_device("A100-SXM4-80GB")
    return replace(
        base,
        name=f"fake-{arch}-x{peak_scale:g}-l2x{l2_scale}",
        aliases=(),
        architecture=arch,
        l2_bytes=base.l2_bytes * l2_scale,
        peak_bf16_flops=base.peak_bf16_flops * peak_scale,
        peak_fp16_flops=base.peak_fp16_flops * peak_scale,
    )


def _rows(dtype: str, n: int = 60, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    size = {name: 2 ** rng.integers(11, 14, n) for name in ("m", "n", "k")}
    return pd.DataFrame({"op": "gemm", "dtype": dtype, "direction": "fwd", "b": 1} | size)


def _fleet(dtype: str, gpus, level_of):
    rows = _rows(dtype)
    feats = pd.concat([features(rows, g) for g in gpus], ignore_index=True)
    level = np.repeat([level_of(g) for g in gpus], len(rows))
    return feats, feats["t_roof_s"].to_numpy() * np.exp(level), np.tile(np.arange(len(rows)).astype(str), len(gpus))


def test_a_new_gpu_takes_the_level_of_its_instruction_family():
    """Four GPUs, two per family, whose level is 0.4 higher on wgmma whatever the peak and L2 (each
    varied apart from the family): a new GPU gets the level of its family, read off the one-hot."""
    law = lambda g: 0.4 * (g.mma_family == "wgmma")  # noqa: E731
    gpus = [_gpu("ampere", 1.0, 1), _gpu("ampere", 2.0, 2), _gpu("hopper", 1.0, 2), _gpu("hopper", 2.0, 1)]
    feats, time_s, shapes = _fleet("bf16", gpus, law)
    est = HierEstimator(feature_names=model_inputs("gemm", "hier"), level_alpha=0.0, **FAST)
    est.fit(feats, time_s, groups=shapes)
    read = [est.feature_names[i] for i in est.level_idx_]
    assert read == list(LEVEL_FEATURES) and set(MMA_FEATURES) <= set(read)
    new = _rows("bf16", seed=11)
    hopper = est.parts_log(features(new, _gpu("hopper", 4.0)))[1]
    ampere = est.parts_log(features(new, _gpu("ampere", 4.0)))[1]
    assert hopper - ampere == pytest.approx(0.4, abs=0.02)


def test_fp32_groups_fit_exactly_as_without_the_family():
    """On fp32 rows the family columns are NaN: hier's level model drops them and its shape model
    never reads them, so its predictions are those of a model declared without them."""
    gpus = [_gpu("ampere", 1.0, 1), _gpu("ampere", 2.0, 2), _gpu("hopper", 1.0, 2), _gpu("hopper", 2.0, 1)]
    feats, time_s, shapes = _fleet("fp32", gpus, lambda g: 0.1 * g.peak_bf16_flops / 3.12e14)
    names = model_inputs("gemm", "hier")
    without = tuple(n for n in names if n not in MMA_FEATURES)
    got = HierEstimator(feature_names=names, **FAST).fit(feats, time_s, groups=shapes)
    want = HierEstimator(feature_names=without, **FAST).fit(feats, time_s, groups=shapes)
    assert not {got.feature_names[i] for i in got.level_idx_} & set(MMA_FEATURES)
    new = features(_rows("fp32", seed=5), _gpu("hopper", 4.0))
    assert np.array_equal(got.predict_s(new), want.predict_s(new))
