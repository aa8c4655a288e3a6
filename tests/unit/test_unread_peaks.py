"""A GPU changed only in a peak a predictor never reads is that GPU for the predictor's kernels
(:func:`opcast.train.features.unread_peaks`, :func:`opcast.hardware.kernel_twin`): a what-if of the fp8 rate
leaves a bf16 workload's learned times exactly as they were, where the set used to answer the changed GPU
with its unseen-device predictor (a bf16 run 0.6-5 % slower for a faster fp8 peak)."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.hardware import PEAK_DTYPES, answers_as_trained, derive_device, get_device, kernel_twin
from opcast.train.features import (
    FEATURES,
    PEAKS_READ,
    dtype_class,
    feature_table,
    group_key,
    unread_peaks,
)

FP8_X2 = "peak_fp8_flops=x2"


def test_each_class_reads_its_own_peak_the_vector_peak_and_the_half_peaks_of_the_mma_family():
    assert unread_peaks("gemm-fwd-half") == {"peak_tf32_flops", "peak_fp8_flops", "peak_fp4_flops"}
    assert unread_peaks("moe-fwd-half_vllm") == unread_peaks("gemm-fwd-half")  # a kernel family's group
    assert unread_peaks("cross_entropy-bwd-fp8") == {"peak_tf32_flops", "peak_fp4_flops"}
    assert unread_peaks("gemm-fwd-fp4") == {"peak_tf32_flops", "peak_fp8_flops"}
    assert unread_peaks("gemm-fwd-fp32") == {f"peak_{d}_flops" for d in PEAK_DTYPES if d != "fp32"}
    assert unread_peaks("gemm-fwd-tf32") == {"peak_fp16_flops", "peak_bf16_flops", "peak_fp8_flops", "peak_fp4_flops"}
    assert unread_peaks("gemm-fwd-unknown") == frozenset()  # a class not named: nothing skipped
    for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8_block", "nvfp4"):
        for tc in (None, True, False):
            assert dtype_class("gemm", dtype, tc) in PEAKS_READ


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16", "fp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("op", ["gemm", "elementwise"])
def test_no_feature_of_a_row_moves_with_a_peak_its_class_does_not_read(op, dtype):
    """The property the rule rests on: every feature of the rows is the same on the GPU with each unread peak
    doubled (B200 has every peak but tf32's own, so each one is exercised)."""
    params = {"b": 1, "m": 2048, "n": 4096, "k": 1024} if op == "gemm" else {"numel": 1 << 24, "fn": "gelu"}
    rows = {"op": np.array([op]), "dtype": np.array([dtype]), "direction": np.array(["fwd"])}
    rows.update({name: np.array([value]) for name, value in params.items()})
    base = get_device("B200")
    key = group_key(op, "fwd", dtype_class(op, dtype))
    want = feature_table(rows, base)
    names = sorted({f for fs in FEATURES.values() for f in fs} & set(want.columns))
    assert unread_peaks(key)
    for field in sorted(unread_peaks(key)):
        if getattr(base, field) is None:
            continue
        other = derive_device(base, [f"{field}=x2"])
        got = feature_table(rows, other)
        for name in names:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{key}: {name} moved with {field}")


def test_a_gpu_changed_only_in_an_unread_peak_is_its_base_for_those_kernels():
    h100 = get_device("H100-SXM")
    fp8 = derive_device(h100, [FP8_X2])
    half, eight = unread_peaks("gemm-fwd-half"), unread_peaks("gemm-fwd-fp8")
    assert kernel_twin(fp8) == fp8.name  # for a kernel of every precision it is another GPU
    assert kernel_twin(fp8, half) == "H100-SXM"  # for a bf16 one it is H100-SXM
    assert kernel_twin(fp8, eight) == fp8.name  # for an fp8 one it is not
    assert answers_as_trained(fp8, ["H100-SXM"], {"H100-SXM": h100}, half)
    assert not answers_as_trained(fp8, ["H100-SXM"], {"H100-SXM": h100}, eight)
    both = derive_device(h100, [FP8_X2, "sm_count=x2"])  # and a field it reads: not
    assert kernel_twin(both, half) == both.name


def test_the_default_set_prices_bf16_kernels_on_a_faster_fp8_gpu_exactly_as_on_the_gpu():
    from opcast.predict.cost import kernel, load_kernel_cost

    cost = load_kernel_cost(None)
    h100 = get_device("H100-SXM")
    fp8 = derive_device(h100, [FP8_X2])
    bf16 = [
        kernel("gemm", {"b": 1, "m": 4096, "n": 4096, "k": 4096}, "bf16"),
        kernel("gemm", {"b": 1, "m": 8, "n": 8192, "k": 8192}, "bf16"),  # memory-bound
        kernel("elementwise", {"numel": 1 << 26, "fn": "gelu"}, "bf16"),
    ]
    for k in bf16:
        assert cost.time_s(k, fp8)[0] == cost.time_s(k, h100)[0], k
    # an fp8 GEMM reads the fp8 peak: it is priced for the changed GPU, and no slower there
    g8 = kernel("gemm", {"b": 1, "m": 8192, "n": 8192, "k": 8192}, "fp8")
    assert cost.time_s(g8, fp8)[0] <= cost.time_s(g8, h100)[0]
