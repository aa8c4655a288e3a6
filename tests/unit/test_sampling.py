"""The sampling plan: determinism, alignment, validation, stratification and sharding."""

from __future__ import annotations

from collections import Counter

import pytest

from opcast.collect.sampling import DeviceLimits, align, log_int, make_plan, sobol_points
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.ops import get_op

OPS = (
    "gemm",
    "attention",
    "layernorm",
    "rmsnorm",
    "softmax",
    "elementwise",
    "embedding",
    "cross_entropy",
    "rope",
    "optimizer",
)


def _limits(max_point_s=1.0, max_bytes=40e9, device_type="cuda"):
    return DeviceLimits(
        spec=get_device("A100-SXM4-80GB"), device_type=device_type, max_point_s=max_point_s, max_bytes=max_bytes
    )


def test_same_seed_same_plan_other_seed_other_plan():
    a = make_plan(ops=OPS, dtypes=("bf16",), limits=_limits(), seed=1, per_stratum=16)
    b = make_plan(ops=OPS, dtypes=("bf16",), limits=_limits(), seed=1, per_stratum=16)
    c = make_plan(ops=OPS, dtypes=("bf16",), limits=_limits(), seed=2, per_stratum=16)
    assert [p.point_id for p in a.points] == [p.point_id for p in b.points]
    assert [p.point_id for p in a.points] != [p.point_id for p in c.points]
    assert len({p.point_id for p in a.points}) == len(a.points)  # no duplicates


def test_shapes_are_mostly_hardware_aligned_and_a_fifth_odd():
    plan = make_plan(ops=("gemm", "attention", "softmax"), dtypes=("fp16",), limits=_limits(), per_stratum=128)
    gemms = [p.params for p in plan.points if p.op == "gemm" and p.direction == "fwd"]
    assert gemms

    def aligned(v: int) -> bool:
        return v % 8 == 0 and (v < 256 or v % 64 == 0)

    fully = [g for g in gemms if all(aligned(g[d]) for d in ("m", "n", "k"))]
    odd = [g for g in gemms if any(g[d] % 2 for d in ("m", "n", "k"))]
    assert 0.7 <= len(fully) / len(gemms) <= 0.9, (len(fully), len(gemms))
    assert len(odd) >= 0.1 * len(gemms)  # the unaligned share really includes odd sizes
    cols = [p.params["cols"] for p in plan.points if p.op == "softmax" and p.direction == "fwd"]
    assert 0.05 <= sum(c % 8 != 0 for c in cols) / len(cols) <= 0.3
    for a in (p.params for p in plan.points if p.op == "attention"):
        assert a["seq_kv"] % 8 == 0 and a["head_dim"] % 16 == 0 and a["heads"] % a["kv_heads"] == 0
    assert align(1000) == 1024 and align(102) == 104 and align(5000) == 4992 and align(3) == 3
    assert log_int(0.0, 16, 16384) == 16 and log_int(0.999999, 16, 16384) == 16384


def test_every_point_is_valid_and_directions_follow_the_registry():
    plan = make_plan(ops=OPS, dtypes=("fp32", "bf16"), limits=_limits(), per_stratum=8)
    for p in plan.points:
        spec = get_op(p.op)
        assert spec.validate(p.params) == p.params
        assert p.direction in spec.directions(p.params)
        assert p.tensor_cores is (p.dtype != "fp32")
    assert not any(p.op == "optimizer" and p.direction == "bwd" for p in plan.points)


def test_strata_are_interleaved_so_a_short_run_covers_every_kind():
    plan = make_plan(ops=OPS, dtypes=("fp32", "fp16", "bf16"), limits=_limits(), per_stratum=32)
    first = plan.points[: len(OPS) * 3]
    assert {p.op for p in first} == set(OPS)
    assert {p.dtype for p in first} == {"fp32", "fp16", "bf16"}


def test_sobol_is_deterministic_and_balanced():
    x = sobol_points(64, 3, seed=7)
    assert (x == sobol_points(64, 3, seed=7)).all()
    assert x.shape == (64, 3) and ((x >= 0) & (x < 1)).all()
    # a (t, m, s)-net: each half of each axis holds exactly half of the points
    assert ((x < 0.5).sum(axis=0) == 32).all()


def test_infeasible_points_are_skipped_with_reasons():
    plan = make_plan(ops=("gemm",), dtypes=("fp16",), limits=_limits(max_bytes=1e5), per_stratum=32)
    assert plan.skipped["gemm: exceeds the memory budget"] > 0
    slow = make_plan(ops=("gemm",), dtypes=("fp16",), limits=_limits(max_point_s=1e-6), per_stratum=32)
    assert slow.skipped["gemm: roofline estimate above --max-point-s"] > 0
    fp32_flash = make_plan(ops=("attention",), dtypes=("fp32",), limits=_limits(), per_stratum=64)
    assert all(p.params["impl"] != "flash" for p in fp32_flash.points)
    assert fp32_flash.skipped["attention: flash attention on CUDA needs fp16 or bf16"] > 0
    fp8 = make_plan(ops=("gemm", "layernorm"), dtypes=("fp8",), limits=_limits(), per_stratum=32)
    assert {p.op for p in fp8.points} == {"gemm"} and all(p.direction == "fwd" for p in fp8.points)
    # what torch._scaled_mm takes is planned; the rest is skipped with the reason, not failed on the device
    assert all(p.params["b"] == 1 and all(p.params[d] % 16 == 0 for d in "mnk") for p in fp8.points)
    assert fp8.skipped["gemm: fp8 GEMM is benchmarked with b=1 and m, n, k multiples of 16 (torch._scaled_mm)"] > 0


def test_arch_shapes_join_the_plan():
    plan = make_plan(
        ops=("gemm",), dtypes=("bf16",), limits=_limits(), per_stratum=1, archs=("llama2-7b",), tp_degrees=(1, 2)
    )
    arch = [p for p in plan.points if p.stratum == "arch"]
    shapes = {(p.params["m"], p.params["n"], p.params["k"]) for p in arch}
    assert (4096, 3 * 4096, 4096) in shapes  # fused QKV, tp=1, batch 1 x seq 4096
    assert (4096, 3 * 4096 // 2, 4096) in shapes  # tp=2
    assert (4096, 4096, 11008 // 2) in shapes  # MLP down, row-parallel at tp=2


def test_collectives_and_unknown_ops_are_refused():
    with pytest.raises(OpcastError, match="collect comm"):
        make_plan(ops=("all_reduce",), dtypes=("bf16",), limits=_limits())
    with pytest.raises(OpcastError, match="unknown op"):
        make_plan(ops=("conv2d",), dtypes=("bf16",), limits=_limits())


def test_shards_partition_the_plan():
    plan = make_plan(ops=OPS, dtypes=("bf16",), limits=_limits(), per_stratum=8)
    shards = [plan.shard(r, 3) for r in range(3)]
    ids = Counter(p.point_id for s in shards for p in s)
    assert set(ids) == {p.point_id for p in plan.points} and max(ids.values()) == 1


def test_torch_norm_softmax_and_cross_entropy_points_are_sampled_as_native_and_fused_is_skipped():
    import numpy as np

    from opcast.collect.sampling import NATIVE_OPS, SPACES, unsupported_reason

    u = np.full(8, 0.5)
    for op in sorted(NATIVE_OPS):
        params = SPACES[op][1](u[: SPACES[op][0]], "cuda")
        assert params["impl"] == "native", op
        assert unsupported_reason(op, params, "bf16", "cuda") is None
        assert "torch lacks" in unsupported_reason(op, {**params, "impl": "fused"}, "bf16", "cuda")
        assert "Liger-Kernel" in unsupported_reason(op, {**params, "impl": "liger"}, "bf16", "cuda")


def test_a_given_tp_must_suit_one_of_the_archs():
    from opcast.collect.sampling import check_tp_degrees

    check_tp_degrees(["llama2-7b", "gpt3-125m"], [1, 12])  # 12 splits gpt3-125m's 12 heads, not llama's 32
    with pytest.raises(OpcastError, match=r"--tp 5 fits none .*llama2-7b: tp=5 .*gpt3-125m: tp=5"):
        check_tp_degrees(["llama2-7b", "gpt3-125m"], [2, 5])
    with pytest.raises(OpcastError, match="give --arch too"):
        check_tp_degrees([], [2])


@pytest.mark.parametrize(
    ("gpu", "device_type", "flash_label"),
    [
        ("H200", "cuda", "flash2"),
        ("B200", "cuda", "flash2"),
        ("A100-SXM4-80GB", "cuda", "flash"),
        ("H200", "cpu", "flash"),
    ],
)
def test_torchs_flash_backend_is_labelled_flash2_on_hopper_and_blackwell(gpu, device_type, flash_label):
    # torch SDPA's flash backend is FlashAttention-2: on Hopper and Blackwell a family of its own, which the
    # learned flash (FlashAttention-3-class rows there) must not be taught; the arch shapes are labelled too
    limits = DeviceLimits(spec=get_device(gpu), device_type=device_type, max_point_s=1.0, max_bytes=40e9)
    plan = make_plan(ops=("attention",), dtypes=("bf16",), limits=limits, per_stratum=64, archs=("llama3-8b",))
    impls = Counter(p.params["impl"] for p in plan.points)
    assert impls[flash_label] > 0 and impls["flash" if flash_label == "flash2" else "flash2"] == 0
    assert {p.stratum.split(":")[0] for p in plan.points if p.params["impl"] == flash_label} == {"sobol", "arch"}
