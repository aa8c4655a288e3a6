"""Features from the registry and the catalog: roofline, tiles/waves, dtype classes, groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from opcast.hardware import get_device
from opcast.ops import op_kinds
from opcast.train.features import (
    ABSOLUTE_DEVICE_FEATURES,
    FEATURES,
    HIER_ONLY_FEATURES,
    dtype_class,
    features,
    group_keys,
    model_inputs,
)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_every_kind_declares_features_that_features_computes():
    a100 = get_device("A100-SXM4-80GB")
    rows = [
        {"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": 4096, "n": 4096, "k": 4096},
        {
            "op": "attention",
            "dtype": "bf16",
            "direction": "bwd",
            "batch": 2,
            "heads": 16,
            "kv_heads": 16,
            "seq_q": 2048,
            "seq_kv": 2048,
            "head_dim": 128,
            "causal": True,
            "impl": "flash",
        },
        {"op": "layernorm", "dtype": "fp16", "direction": "fwd", "rows": 8192, "cols": 4096},
        {"op": "elementwise", "dtype": "fp32", "direction": "fwd", "numel": 1 << 20, "fn": "gelu"},
        {
            "op": "all_reduce",
            "dtype": "bf16",
            "direction": "fwd",
            "bytes": 1 << 26,
            "world_size": 8,
            "nodes": 1,
            "gpus_per_node": 8,
        },
    ]
    feats = features(_frame(rows), a100)
    for row, (_, f) in zip(rows, feats.iterrows()):
        names = FEATURES[row["op"]]
        assert all(np.isfinite(f[n]) for n in names), (row["op"], [n for n in names if not np.isfinite(f[n])])
    assert set(FEATURES) == set(op_kinds())


def test_gemm_roofline_uses_the_dtype_aware_peak_and_tile_waves():
    a100 = get_device("A100-SXM4-80GB")
    m = n = k = 8192
    rows = [
        {"op": "gemm", "dtype": d, "direction": "fwd", "tensor_cores": tc, "b": 1, "m": m, "n": n, "k": k}
        for d, tc in (("bf16", None), ("fp32", False), ("fp32", True))
    ]
    f = features(_frame(rows), a100)
    flops = 2.0 * m * n * k
    assert f["t_roof_s"].iloc[0] == pytest.approx(flops / a100.peak_bf16_flops)
    assert f["t_roof_s"].iloc[1] == pytest.approx(flops / a100.peak_fp32_flops)  # CUDA cores
    assert f["t_roof_s"].iloc[2] == pytest.approx(flops / a100.peak_tf32_flops)  # TF32 tensor cores
    # 8192^2 output in 128x256 tiles = 2048 tiles over 108 SMs: 18.96 waves, the last one 96 % full
    assert f["waves"].iloc[0] == pytest.approx(2048 / 108)
    assert f["tail_efficiency"].iloc[0] == pytest.approx((2048 / 108) / 19)


def test_bwd_gemm_has_twice_the_work_and_memory_bound_ops_use_bandwidth():
    h100 = get_device("H100-SXM")
    f = features(
        _frame(
            [
                {"op": "gemm", "dtype": "bf16", "direction": d, "b": 1, "m": 1024, "n": 1024, "k": 1024}
                for d in ("fwd", "bwd")
            ]
            + [{"op": "elementwise", "dtype": "bf16", "direction": "fwd", "numel": 1 << 24, "fn": "add"}]
        ),
        h100,
    )
    assert f["flops"].iloc[1] == pytest.approx(2 * f["flops"].iloc[0])
    assert f["t_roof_s"].iloc[2] == pytest.approx(3 * 2 * (1 << 24) / h100.mem_bw_bytes_per_s)


def test_unsupported_dtype_gives_nan_roofline_not_an_error():
    v100 = get_device("V100-SXM2-32GB")  # no bf16
    f = features(_frame([{"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": 64, "n": 64, "k": 64}]), v100)
    assert np.isnan(f["t_roof_s"].iloc[0])


def test_dtype_classes_and_group_keys():
    assert dtype_class("gemm", "fp16") == dtype_class("gemm", "bf16") == "half"
    assert dtype_class("gemm", "fp32", False) == dtype_class("gemm", "fp32") == "fp32"
    assert dtype_class("gemm", "fp32", True) == dtype_class("gemm", "tf32") == "tf32"
    assert dtype_class("layernorm", "fp32", True) == "fp32"  # no tensor cores outside matrix kinds
    frame = _frame(
        [
            {"op": "gemm", "dtype": "bf16", "direction": "bwd", "tensor_cores": None},
            {"op": "softmax", "dtype": "fp32", "direction": "fwd", "tensor_cores": False},
        ]
    )
    assert group_keys(frame).tolist() == ["gemm-bwd-half", "softmax-fwd-fp32"]


def test_tile_mlp_reads_no_absolute_device_specs():
    for kind in ("gemm", "layernorm"):
        assert set(model_inputs(kind, "xgb")) == set(FEATURES[kind]) - HIER_ONLY_FEATURES
        assert not set(model_inputs(kind, "tile-mlp")) & ABSOLUTE_DEVICE_FEATURES


def test_tile_fill_is_the_useful_share_of_the_padded_tiles():
    a100 = get_device("A100-SXM4-80GB")  # 108 SMs
    rows = [
        {"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": m, "n": n, "k": 512}
        for m, n in ((8192, 8192), (8193, 8192), (100, 100))
    ]
    rows.append({"op": "gemm", "dtype": "bf16", "direction": "bwd", "b": 1, "m": 8192, "n": 8192, "k": 512})
    f = features(_frame(rows), a100)
    assert f["tile_fill"].iloc[0] == 1.0  # 128x256 tiles divide 8192^2 exactly
    # one more row: 65 row-tiles of 128, the last holding one row
    assert f["tile_fill"].iloc[1] == pytest.approx(8193 / (65 * 128))
    # 100x100 output cannot fill one wave with any tile: the smallest (16x16) pads it to 112x112
    assert f["tile_fill"].iloc[2] == pytest.approx(100 * 100 / (112 * 112))
    assert f["tile_fill"].iloc[3] == 1.0  # dA [8192, 512] and dB [512, 8192] also divide exactly
    ln = features(_frame([{"op": "layernorm", "dtype": "fp16", "direction": "fwd", "rows": 1000, "cols": 1000}]), a100)
    assert ln["tile_fill"].iloc[0] == 1.0  # row kernels: one row per block, no padding modelled


def test_softmax_fill_follows_pytorch_launch_rules():
    a100 = get_device("A100-SXM4-80GB")
    cases = [  # (dtype, cols, useful share of the slots the kernel gives a row)
        ("fp32", 1000, 1000 / 1024),  # persistent warp kernel: lanes cover the next power of two
        ("fp32", 1024, 1.0),
        ("fp32", 2048, 1.0),  # block of pow2(512 / 2) = 256 threads x 4 = 1024-element chunks, two full
        ("fp32", 2560, 2560 / 4096),  # 640 / 2 -> 512 threads x 4: two 2048-element chunks, the second part-empty
        ("fp32", 16384, 1.0),  # 1024 / 2 -> 512 threads x 4 = 2048 elements, eight full chunks
        ("fp16", 1536, 1536 / 2048),  # 8 halves a vector: 192 / 2 -> 128 threads x 8 = 1024-element chunks
        ("fp16", 1000, 1000 / 1024),
    ]
    rows = [
        {"op": "softmax", "dtype": dt, "direction": d, "rows": 4096, "cols": c}
        for dt, c, _ in cases
        for d in ("fwd", "bwd")
    ]
    got = features(_frame(rows), a100)["tile_fill"].to_numpy()
    want = np.repeat([w for _, _, w in cases], 2)
    np.testing.assert_allclose(got, want)


def test_array_formulas_match_the_registry_row_by_row():
    from opcast.dtypes import DTYPE_BYTES
    from opcast.ops import get_op
    from opcast.train.features import _fill_defaults, _work

    rows = (
        [
            {"op": "gemm", "dtype": "bf16", "direction": d, "b": b, "m": m, "n": 3 * m + 1, "k": 77}
            for d in ("fwd", "bwd")
            for b, m in ((1, 1), (4, 4095), (1, 65536))
        ]
        + [
            {
                "op": "attention",
                "dtype": "fp16",
                "direction": d,
                "batch": 2,
                "heads": 16,
                "kv_heads": 4,
                "seq_q": sq,
                "seq_kv": 2048,
                "head_dim": 128,
                "causal": c,
                "impl": impl,
            }
            for d in ("fwd", "bwd")
            for sq in (1, 2048)
            for c in (True, False)
            for impl in ("flash", "eager")
        ]
        + [
            {"op": "elementwise", "dtype": "fp32", "direction": "fwd", "numel": n, "fn": fn}
            for n in (1, 12345)
            for fn in ("add", "gelu", "dropout")
        ]
        + [
            {
                "op": "rope",
                "dtype": "bf16",
                "direction": "fwd",
                "tokens": 4096,
                "heads": 40,
                "head_dim": 128,
                "impl": impl,
            }
            for impl in ("fused", "unfused", None)
        ]
        + [
            {
                "op": "all_reduce",
                "dtype": "bf16",
                "direction": "fwd",
                "bytes": 1 << 26,
                "world_size": w,
                "nodes": 1,
                "gpus_per_node": w,
            }
            for w in (2, 8)
        ]
    )
    frame = pd.DataFrame(_fill_defaults(pd.DataFrame(rows)))
    work = _work(frame, 108)
    for i, row in frame.iterrows():
        spec = get_op(row["op"])
        params = {p.name: row[p.name] for p in spec.params}
        dt = DTYPE_BYTES[row["dtype"]]
        assert work["flops"][i] == pytest.approx(spec.flops(params, row["direction"], dt), rel=1e-12), dict(row)
        assert work["bytes"][i] == pytest.approx(spec.bytes_moved(params, dt, row["direction"]), rel=1e-12), dict(row)


def test_a_fused_moe_layer_has_tensor_core_work_and_the_tiles_of_its_down_gemm():
    from opcast.ops import get_op, moe_balanced_experts

    h100 = get_device("H100-SXM")
    shape = {"hidden": 4096, "inter": 1024, "experts": 64, "topk": 8, "ep": 4}
    rows = [
        {"op": "moe", "dtype": dtype, "direction": "fwd", "tokens": t, **shape, "gated": gated, "fn": fn}
        for t, dtype, gated, fn in ((1, "bf16", True, "silu"), (4096, "fp8", False, "relu"))
    ]
    feats = features(_frame(rows), h100)
    for _, f in feats.iterrows():
        assert all(np.isfinite(f[n]) for n in FEATURES["moe"])
    spec = get_op("moe")
    for row, (_, f) in zip(rows, feats.iterrows()):
        p = spec.validate({k: row[k] for k in spec.param_names if k in row})
        assert f["flops"] == pytest.approx(spec.flops(p)) and f["mma_wgmma"] == 1.0 and f["tensor_cores"] == 1.0
        assert 0 < f["tile_fill"] <= 1
    # one token: 8 pairs over 4 ranks, 2 experts of one row busy; 4096 tokens: all 16 local experts, 512 rows
    assert moe_balanced_experts(rows[0]) == (2, 1)
    assert moe_balanced_experts(rows[1]) == (16, 512)
    assert feats["gated"].tolist() == [1.0, 0.0] and feats["fn_code"].iloc[0] != feats["fn_code"].iloc[1]
    # fp8 runs at the fp8 tensor-core peak, bf16 at the bf16 one
    assert np.exp(feats["log_peak_flops"]).tolist() == pytest.approx([h100.peak_bf16_flops, h100.peak_fp8_flops])
    assert group_keys(_frame(rows)).tolist() == ["moe-fwd-half", "moe-fwd-fp8"]


def test_a_weight_only_moe_layer_reads_its_weights_at_their_storage_size():
    """W4A16 MXFP4 experts (AIConfigurator's w4a16_mxfp4 rows): the same GEMM work and group as bf16 experts, the
    busy experts' weights read at 4.25 bits (64 of 3 x 2880 x 2880 at 4096 tokens, top-4 of 128 on one rank), and
    their own ``weights_code``; a row written before the parameter existed reads as the dtype's weights."""
    h100 = get_device("H100-SXM")
    shape = {"tokens": 4096, "hidden": 2880, "inter": 2880, "experts": 128, "topk": 4, "ep": 1, "gated": True}
    rows = [
        {"op": "moe", "dtype": "bf16", "direction": "fwd", **shape, "fn": "silu", **extra}
        for extra in ({}, {"weights": "mxfp4"}, {"weights": "dtype"})
    ]
    feats = features(_frame(rows), h100)
    assert feats["weights_code"].tolist() == [0.0, 1.0, 0.0]
    assert feats["flops"].nunique() == 1 and feats["bytes"].iloc[0] == feats["bytes"].iloc[2]
    assert feats["bytes"].iloc[0] - feats["bytes"].iloc[1] == pytest.approx(128 * 3 * 2880 * 2880 * (2 - 0.53125))
    assert group_keys(_frame(rows)).tolist() == ["moe-fwd-half"] * 3


def test_a_moe_kernel_family_is_its_own_group_not_a_feature():
    """The fused MoE layer's kernel families (``impl``: TensorRT-LLM's, vLLM's) do the same work and traffic; vLLM's
    rows are a predictor group of their own and TensorRT-LLM's keep the plain key (a row written before the
    parameter reads as TensorRT-LLM's), and the family is no feature, so TensorRT-LLM's group reads what it read."""
    from opcast.train.features import FEATURES

    h100 = get_device("H100-SXM")
    shape = {"tokens": 64, "hidden": 2880, "inter": 2880, "experts": 32, "topk": 4, "ep": 1, "gated": True}
    rows = [
        {"op": "moe", "dtype": "bf16", "direction": "fwd", **shape, "fn": "silu", "weights": "mxfp4", **extra}
        for extra in ({}, {"impl": "trtllm"}, {"impl": "vllm"})
    ]
    feats = features(_frame(rows), h100)
    assert feats["flops"].nunique() == 1 and feats["bytes"].nunique() == 1
    assert "impl_code" not in FEATURES["moe"] and "weights_code" in FEATURES["moe"]
    assert group_keys(_frame(rows)).tolist() == ["moe-fwd-half", "moe-fwd-half", "moe-fwd-half_vllm"]
    fp8 = [{**row, "dtype": "fp8", "weights": "dtype"} for row in rows]
    gemm = {"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": 8, "n": 8, "k": 8}
    gemms = [{**gemm, **extra} for extra in ({}, {"impl": "cublas"}, {"impl": "vllm"})]
    keys = ["moe-fwd-fp8", "moe-fwd-fp8", "moe-fwd-fp8_vllm", "gemm-fwd-half", "gemm-fwd-half", "gemm-fwd-half_vllm"]
    assert group_keys(_frame([*fp8, *gemms])).tolist() == keys
    assert "impl_code" not in FEATURES["gemm"]  # a GEMM's family (opcast.ops.GEMM_IMPLS) is its group too
