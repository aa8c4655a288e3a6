"""What llm-foundry's MPT benchmarks ran, as opcast prices it: the ``foundry`` framework (native
LayerNorm, flash-attn's fused cross-entropy, 16 bytes a parameter) reaches the graph and the command
line, and ``benchmarks/mosaicml.py``'s Triton-attention source prices attention at FlashAttention-1's
measured forward + backward rate (FlashAttention-2 paper, Fig. 4 and its H100 figure)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.hardware import get_device
from opcast.predict.cost.model import roofline_only
from opcast.predict.cost.query import kernel
from opcast.predict.frameworks import FRAMEWORKS, framework_of
from opcast.predict.graph import precision_of

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "mosaicml.py"


def _load():
    spec = importlib.util.spec_from_file_location("mosaicml_benchmark_attention", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mosaicml_benchmark_attention"] = module
    spec.loader.exec_module(module)
    return module


mm = _load()


def _attn(seq: int, head_dim: int = 128, causal: bool = True, direction: str = "fwd", batch: int = 1):
    params = {"batch": batch, "heads": 16, "kv_heads": 16, "head_dim": head_dim, "seq_q": seq, "seq_kv": seq}
    return kernel("attention", {**params, "causal": causal, "impl": "flash"}, "bf16", direction)


# --------------------------------------------------------------------------- the framework


def test_foundry_runs_native_layernorm_and_a_fused_cross_entropy_with_16_bytes():
    fw = framework_of("foundry")
    impls = dict(fw.impls)
    assert impls["layernorm"] == "native" and impls["cross_entropy"] == "fused"
    assert not fw.fp32_grads
    # the other frameworks are untouched (the goldens use them)
    assert dict(FRAMEWORKS["hf"].impls)["cross_entropy"] == "native"
    prec = precision_of("bf16", framework="foundry")
    ce = prec.of("cross_entropy", {"tokens": 2048, "vocab": 50368})
    assert ce.param_dict["impl"] == "fused"
    assert prec.fp8_modules == "linear"  # llm-foundry's fc_type te: plain te.Linear


def test_the_command_line_takes_framework_foundry():
    argv = [
        sys.executable, "-m", "opcast", "predict", "train", "--arch", "mpt-125m", "--gpu", "A100-SXM4-80GB",
        "--nodes", "1", "--gpus-per-node", "8", "--micro-batch", "4", "--global-batch", "64", "--seq", "512",
        "--precision", "bf16", "--zero", "3", "--framework", "foundry", "--roofline", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bad = subprocess.run([*argv[:-3], "foundri"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "foundry" in bad.stderr


# --------------------------------------------------------------------------- the attention kernel MosaicML ran


def test_the_rate_is_the_figures_at_its_points_and_held_beyond_them():
    src = mm.MeasuredAttention()
    for gpu, causal, hd in mm.FA1_FWD_BWD_TFLOPS:
        speeds = mm.FA1_FWD_BWD_TFLOPS[(gpu, causal, hd)]
        assert len(speeds) == len(mm.FA1_SEQS)
        for seq, tflops in zip(mm.FA1_SEQS, speeds, strict=True):
            assert src.rate_flop_per_s(gpu, causal, hd, seq) == pytest.approx(tflops * 1e12)
        assert src.rate_flop_per_s(gpu, causal, hd, 65536) == pytest.approx(speeds[-1] * 1e12)
        assert src.rate_flop_per_s(gpu, causal, hd, 128) == pytest.approx(speeds[0] * 1e12)
    # log2 interpolation: 2896 ~ 2^11.5 lies halfway between 2048 (69) and 4096 (76)
    assert src.rate_flop_per_s("A100", True, 128, 2896) / 1e12 == pytest.approx(72.5, abs=0.05)
    assert math.isnan(src.rate_flop_per_s("A100", True, 96, 2048))


def test_forward_plus_backward_takes_the_figures_time():
    src = mm.MeasuredAttention()
    a100 = get_device("A100-SXM4-80GB")
    fwd, bwd = _attn(8192, batch=2), _attn(8192, batch=2, direction="bwd")
    t = src.predict_s([fwd, bwd], a100)
    # FlashAttention-2's benchmark: 4 b s^2 h d / 2 (causal) x 3.5 FLOPs at 80 TFLOP/s (A100, causal, d 128, 8k)
    flops = 4 * 2 * 8192**2 * 16 * 128 / 2 * 3.5
    assert t.sum() == pytest.approx(flops / 80e12, rel=2e-4)  # opcast counts the diagonal: s(s+1)/2 pairs
    assert t[1] / t[0] == pytest.approx(2.5)
    # the 40GB A100 is the same chip; H100 is faster; another GPU is left to the next source
    assert src.predict_s([fwd], get_device("A100-SXM4-40GB"))[0] == pytest.approx(t[0])
    assert src.predict_s([fwd], get_device("H100-SXM"))[0] < t[0]
    assert math.isnan(src.predict_s([fwd], get_device("B200"))[0])


def test_the_source_goes_first_and_leaves_everything_else_to_the_others():
    base = roofline_only("test")
    model = type(base)(sources=(mm.MeasuredAttention(), *base.sources))
    a100, b200 = get_device("A100-SXM4-80GB"), get_device("B200")
    attn = _attn(4096)
    gemm = kernel("gemm", {"b": 1, "m": 4096, "n": 4096, "k": 4096}, "bf16")
    assert model.time_s(attn, a100) == (pytest.approx(mm.MeasuredAttention().predict_s([attn], a100)[0]), "published")
    assert model.time_s(gemm, a100) == base.time_s(gemm, a100)
    assert model.time_s(attn, b200) == base.time_s(attn, b200)


@pytest.mark.skipif(not mm.CSV_PATH.is_file(), reason=f"{mm.CSV_PATH} absent (the shared/validation checkout)")
def test_a_long_sequence_row_is_slower_with_the_attention_mosaicml_ran():
    row = min((r for r in mm.read_rows() if r.gpu == "a100_80gb" and r.seq >= 16384), key=lambda r: (r.n_params, r.seq))
    learned = mm.predict_row(row)
    triton = mm.predict_row(row, triton_attention=True)
    assert learned.feasible and triton.feasible
    # FlashAttention-2 (the learned models) is about twice FlashAttention-1's speed on A100 at long sequences
    assert triton.iteration_s > 1.2 * learned.iteration_s
    assert triton.model_flops == pytest.approx(learned.model_flops)
