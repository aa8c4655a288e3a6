"""Block-scaled fp8 (``fp8_block``, MXFP8) and NVFP4 (``nvfp4``): element sizes, the fp4 peak, the
predictor groups they learn into, and ``--precision mxfp8`` / ``--precision nvfp4`` in training."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import opcast.predict.graph as graph
from opcast.archs import load_arch
from opcast.dtypes import DTYPE_BITS, dtype_bytes, element_bytes, gemm_dtype
from opcast.errors import OpcastError
from opcast.hardware import get_device, spec_from_dict
from opcast.predict.cost import kernel, roofline_only
from opcast.predict.cost.roofline import RooflineKernelCost
from opcast.predict.graph import FP8_LINEARS
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train

OPCAST = str(Path(sys.executable).with_name("opcast"))
B200 = get_device("B200")
H100 = get_device("H100-SXM")


# --------------------------------------------------------------------------- dtypes


def test_element_sizes_count_the_block_scales_and_are_never_rounded():
    assert DTYPE_BITS["nvfp4"] == 4 + 8 / 16 and DTYPE_BITS["fp8_block"] == 8 + 8 / 32
    assert element_bytes("nvfp4") == 0.5625 and element_bytes("fp8_block") == 1.03125
    assert element_bytes("bf16") == 2.0 and dtype_bytes("bf16") == 2 and dtype_bytes("fp8") == 1
    for name in ("nvfp4", "fp8_block"):  # a storage size in whole bytes would be wrong: refused, not 0 or 1
        with pytest.raises(OpcastError, match=rf"{name}.*block-scaled"):
            dtype_bytes(name)
    with pytest.raises(OpcastError, match="unknown dtype 'fp4'"):
        element_bytes("fp4")
    assert (gemm_dtype("mxfp8"), gemm_dtype("nvfp4"), gemm_dtype("fp8"), gemm_dtype("bf16")) == (
        "fp8_block",
        "nvfp4",
        "fp8",
        "bf16",
    )


# --------------------------------------------------------------------------- hardware


def test_block_scaled_dtypes_run_at_the_fp8_and_fp4_peaks():
    assert B200.peak_flops("fp8_block") == B200.peak_fp8_flops == 4.5e15
    assert B200.peak_flops("nvfp4") == B200.peak_fp4_flops == 9e15  # HGX B200: 144 PF sparse FP4 / 8 / 2
    assert get_device("GB300").peak_flops("nvfp4") == 15e15 and get_device("GB200").peak_flops("nvfp4") == 10e15
    assert H100.peak_flops("fp8_block") == H100.peak_fp8_flops and not H100.supports("nvfp4")
    with pytest.raises(OpcastError) as err:
        H100.peak_flops("nvfp4")
    text = str(err.value)
    assert "\n" not in text and "H100-SXM" in text and "use fp8" in text


def test_fp4_tensor_core_parts_carry_a_dense_fp4_peak_and_others_none():
    with_fp4 = {"B200", "B300", "GB200", "GB300", "RTX-PRO-6000", "MI355X"}
    for name in ("B200", "B300", "GB200", "GB300", "RTX-PRO-6000", "MI355X", "H100-SXM", "H200", "L40S", "MI300X"):
        spec = get_device(name)
        assert (spec.peak_fp4_flops is not None) == (name in with_fp4), name
        if spec.peak_fp4_flops is not None:  # dense fp4 is twice dense fp8 on every one of them
            assert spec.peak_fp4_flops == pytest.approx(2 * spec.peak_fp8_flops, rel=0.02) or name in ("B300", "GB300")


def test_catalog_files_may_omit_the_fp4_peak_but_not_give_a_bad_one():
    import json

    from opcast.paths import data_path

    data = json.loads(Path(data_path("hardware", "H100-SXM.json")).read_text())
    assert "peak_fp4_flops" not in data
    assert spec_from_dict(data, "x.json").peak_fp4_flops is None
    assert spec_from_dict({**data, "peak_fp4_flops": 4e15}, "x.json").peak_flops("nvfp4") == 4e15
    with pytest.raises(OpcastError, match="'peak_fp4_flops' must be positive"):
        spec_from_dict({**data, "peak_fp4_flops": -1}, "x.json")


# --------------------------------------------------------------------------- features


def test_new_dtypes_learn_into_their_own_groups_with_their_peak_and_size():
    from opcast.train.features import dtype_class, feature_table, group_key, group_keys

    assert dtype_class("gemm", "fp8_block") == "fp8b" and dtype_class("gemm", "nvfp4") == "fp4"
    assert group_key("gemm", "fwd", dtype_class("gemm", "nvfp4")) == "gemm-fwd-fp4"
    frame = pd.DataFrame(
        {
            "op": ["gemm"] * 3,
            "b": [1] * 3,
            "m": [4096] * 3,
            "n": [8192] * 3,
            "k": [8192] * 3,
            "dtype": ["fp8", "fp8_block", "nvfp4"],
            "direction": ["fwd"] * 3,
            "tensor_cores": [True] * 3,
        }
    )
    assert list(group_keys(frame)) == ["gemm-fwd-fp8", "gemm-fwd-fp8b", "gemm-fwd-fp4"]
    t = feature_table(frame, B200)
    assert np.allclose(np.exp(np.asarray(t["log_peak_flops"])), [4.5e15, 4.5e15, 9e15])
    assert list(np.asarray(t["dtype_bytes"])) == [1.0, 1.03125, 0.5625]
    elements = 4096 * 8192 + 8192 * 8192 + 4096 * 8192
    assert list(np.asarray(t["bytes"])) == [elements * 1.0, elements * 1.03125, elements * 0.5625]
    assert np.asarray(t["mma_tcgen05"]).tolist() == [1.0, 1.0, 1.0]  # B200: the tensor-core family features too


# --------------------------------------------------------------------------- roofline fallback


def test_the_roofline_prices_an_nvfp4_gemm_at_the_fp4_peak_by_hand():
    p = {"b": 1, "m": 8192, "n": 8192, "k": 8192}
    cost = RooflineKernelCost()
    fp8, mx, fp4 = (cost.predict_s([kernel("gemm", p, d)], B200)[0] for d in ("fp8", "fp8_block", "nvfp4"))
    # 1,100 GFLOP: Calculon's matrix efficiency 0.95 (>= 128 GFLOP); compute-bound on B200 (8 TB/s).
    assert fp4 == pytest.approx(2 * 8192**3 / (9e15 * 0.95), rel=1e-12)  # 128.6 us
    assert fp8 == pytest.approx(2 * 8192**3 / (4.5e15 * 0.95), rel=1e-12) == pytest.approx(2 * fp4)
    assert mx == pytest.approx(fp8, rel=1e-12)
    small = {"b": 1, "m": 1, "n": 8192, "k": 8192}  # memory-bound: the element size decides
    assert kernel("gemm", small, "nvfp4").bytes_moved() == 0.5625 * (8192 + 8192 * 8192 + 8192)
    t8, t4 = (cost.predict_s([kernel("gemm", small, d)], B200)[0] for d in ("fp8", "nvfp4"))
    assert t4 < t8


# --------------------------------------------------------------------------- training


def _lines(result):
    return {(op.stage, op.phase, op.role): op for op in result.ops}


@pytest.fixture(scope="module")
def runs():
    """The roofline's burst times (``clocks`` boost: B200's sustained clock would scale the compute-bound ones)."""
    arch = load_arch("llama3-8b")
    out = {}
    for precision in ("fp8", "mxfp8", "nvfp4"):
        cfg = TrainConfig(micro_batch=1, global_batch=2, seq=8192, precision=precision, clocks="boost")
        out[precision] = predict_train(arch, B200, cfg, kernels=roofline_only())
    with pytest.MonkeyPatch.context() as mp:  # per-tensor fp8 as if B200's fp8 GEMMs took only TN (Hopper's layouts)
        mp.setattr(graph, "fp8_gemm_transposes", lambda device: True)
        cfg = TrainConfig(micro_batch=1, global_batch=2, seq=8192, precision="fp8", clocks="boost")
        out["fp8_tn"] = predict_train(arch, B200, cfg, kernels=roofline_only())
    return out


def test_per_tensor_fp8_on_b200_writes_no_transposes(runs):
    fp8, tn = _lines(runs["fp8"]), _lines(runs["fp8_tn"])
    assert not any("transpose" in key[2] for key in fp8) and any("transpose" in key[2] for key in tn)
    assert {k: v.kernel for k, v in fp8.items() if v.kernel.kind == "gemm"} == {
        k: v.kernel for k, v in tn.items() if v.kernel.kind == "gemm"
    }
    assert runs["fp8"].iteration_time_s < runs["fp8_tn"].iteration_time_s


def test_mxfp8_and_nvfp4_reprice_only_the_block_linears(runs):
    # against per-tensor fp8 with the same quantisation kernels (block-scaled quantisers always write a
    # second, column-wise copy; per-tensor fp8 on B200 writes none: test_per_tensor_fp8_on_b200_writes_no_transposes)
    fp8, mx, fp4 = (_lines(runs[p]) for p in ("fp8_tn", "mxfp8", "nvfp4"))
    assert fp8.keys() == mx.keys() == fp4.keys()
    linears = 0
    for key, line in fp8.items():
        base = key[2].split(".")[0]
        if line.kernel.kind == "gemm" and base in FP8_LINEARS:
            linears += 1
            assert line.kernel.dtype == "fp8"
            # MXFP8's GEMMs are TE's cuBLASLt GEMMs, priced as the per-tensor fp8 one (graph.TE_GEMM_KERNELS)
            assert (mx[key].kernel, mx[key].time_s) == (line.kernel, line.time_s)
            assert fp4[key].kernel.dtype == "nvfp4" and fp4[key].kernel.params == line.kernel.params
            assert fp4[key].time_s < line.time_s
        else:  # the LM head, attention, norms, the quantisation casts: as in fp8
            assert mx[key].kernel == fp4[key].kernel == line.kernel, key
            assert mx[key].time_s == fp4[key].time_s == line.time_s, key
    assert linears == 12  # four linears, forward + data and weight gradients
    up = fp4[(0, "forward", "mlp_up")]
    m, n, k = 8192, 2 * 14336, 4096  # Llama 3 8B's gated MLP-up on one GPU: 1.92 TFLOP, compute-bound
    assert (up.kernel.param_dict["m"], up.kernel.param_dict["n"], up.kernel.param_dict["k"]) == (m, n, k)
    assert up.time_s == pytest.approx(2 * m * n * k / (9e15 * 0.95), rel=1e-12)
    assert fp8[(0, "forward", "mlp_up")].time_s == pytest.approx(2 * up.time_s, rel=1e-12)
    assert runs["nvfp4"].iteration_time_s < runs["mxfp8"].iteration_time_s
    for p in ("mxfp8", "nvfp4"):  # memory as fp8
        assert [m.total_bytes for m in runs[p].memory] == [m.total_bytes for m in runs["fp8"].memory]
    # MFU against the GEMMs' peak: fp4's is twice fp8's on B200
    ratio = runs["nvfp4"].mfu * 2 / runs["fp8"].mfu
    assert ratio == pytest.approx(runs["fp8"].iteration_time_s / runs["nvfp4"].iteration_time_s, rel=1e-9)


def _opcast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([OPCAST, *args], capture_output=True, text=True, timeout=120)


def test_mxfp8_gemms_are_te_cublaslt_ones_in_training_and_block_kernels_in_inference():
    """Training's MXFP8 GEMMs (Transformer Engine, cuBLASLt) are looked up as per-tensor fp8 GEMMs; an inference
    engine's block-scaled GEMM keeps the fp8_block kernels it was measured as; nvfp4 keeps its own in both."""
    params = {"b": 1, "m": 4096, "n": 4096, "k": 4096}
    train = graph.precision_of("mxfp8", device=B200, training=True)
    infer = graph.precision_of("mxfp8", device=B200)
    assert train.matrix == infer.matrix == "fp8_block"  # the format: scales counted in traffic and memory
    assert train.of("gemm", params).dtype == "fp8" and infer.of("gemm", params).dtype == "fp8_block"
    assert train.of("elementwise", {"numel": 4096, "fn": "mul_scalar"}) == infer.of(
        "elementwise", {"numel": 4096, "fn": "mul_scalar"}
    )
    nv = graph.precision_of("nvfp4", device=B200, training=True)
    assert nv.of("gemm", params).dtype == "nvfp4"


def test_nvfp4_on_a_gpu_without_fp4_exits_2_in_one_line():
    out = _opcast("predict", "train", "--arch", "gpt3-350m", "--gpu", "H100-SXM", "--precision", "nvfp4")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: ") and "Traceback" not in out.stderr
    assert "H100-SXM has no nvfp4 peak" in lines[0] and "fp8" in lines[0]


def test_nvfp4_and_mxfp8_run_through_the_console_script():
    for precision in ("nvfp4", "mxfp8"):
        out = _opcast("predict", "train", "--arch", "gpt3-350m", "--gpu", "B200", "--precision", precision, "--json")
        assert out.returncode == 0, out.stderr
        assert math.isfinite(__import__("json").loads(out.stdout)["iteration_time_s"])


def test_collect_bench_refuses_the_replay_only_dtypes_before_measuring():
    from opcast.collect.bench import check_dtypes

    for name in ("fp8_block", "nvfp4"):
        with pytest.raises(OpcastError, match=rf"dtype {name} is replay-only for now"):
            check_dtypes(("bf16", name), device=None)  # refused before the device is looked at


def test_predict_kernel_names_the_gpu_without_fp4_in_one_line():
    out = _opcast(
        "predict", "kernel", "--op", "gemm", "--dtype", "nvfp4", "--gpu", "H100-SXM",
        *("--param", "b=1", "--param", "m=64", "--param", "n=64", "--param", "k=64"),
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "opcast: error: H100-SXM has no fp4 tensor cores for nvfp4; use fp8 (or bf16) on it"
    ]


def test_only_delayed_per_tensor_fp8_all_reduces_amaxes():
    """TE reduces an amax history only under delayed scaling (v2.9 quantization.py: "Delayed scaling only"):
    MXFP8 and NVFP4 compute their block scales where each tensor is quantised and reduce nothing per chunk."""
    arch = load_arch("llama3-8b")
    calls = {}
    for precision in ("fp8", "mxfp8", "nvfp4"):
        cfg = TrainConfig(tp=2, micro_batch=1, global_batch=2, seq=8192, precision=precision)
        r = predict_train(arch, B200, cfg, kernels=roofline_only())
        calls[precision] = [c for c in r.comms if c.role == "fp8_amax"]
    assert len(calls["fp8"]) == 2 and calls["mxfp8"] == calls["nvfp4"] == []
    assert not graph.delayed_amax_reduction(graph.precision_of("fp8", fp8_recipe="current"))


def test_sequence_parallel_gathers_move_the_quantised_format():
    """TE's gather_along_first_dim gathers NVFP4 / MXFP8 packed data with their scales (_all_gather_nvfp4 /
    _all_gather_mxfp8): 4.5 and 8.25 bits an element against per-tensor fp8's 8; the reduce-scatters stay bf16."""
    arch = load_arch("llama3-8b")
    kw = dict(tp=2, batch=1, seq_q=4096, sp=True, cp=1, ep=1, dtype="bf16")
    tokens_x_hidden = 4096 * arch.hidden
    by = {}
    for dt in ("fp8", "fp8_block", "nvfp4"):
        fwd = graph.block_comms(arch, quantised=dt, **kw)[graph.FWD]
        by[dt] = {c.kind: c.bytes for c in fwd}
    assert by["fp8"]["all_gather"] == tokens_x_hidden
    assert by["fp8_block"]["all_gather"] == tokens_x_hidden * 33 // 32
    assert by["nvfp4"]["all_gather"] == tokens_x_hidden * 9 // 16
    assert by["fp8"]["reduce_scatter"] == by["nvfp4"]["reduce_scatter"] == 2 * tokens_x_hidden
