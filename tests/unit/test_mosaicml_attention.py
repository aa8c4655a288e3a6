"""What llm-foundry's MPT benchmarks ran, as opcast prices it: the ``foundry`` framework (native
LayerNorm, flash-attn's fused cross-entropy, Triton FlashAttention as the registry's ``flash1``, 16
bytes a parameter) reaches the graph and the command line, and ``benchmarks/mosaicml.py`` predicts
with that command's path alone (the published source itself: ``tests/unit/test_published_cost.py``)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.predict.cost.query import kernel
from opcast.predict.frameworks import FRAMEWORKS, framework_of
from opcast.predict.graph import precision_of

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "mosaicml.py"


mm = load_script(SCRIPT, "mosaicml_benchmark_attention")


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


def test_foundry_runs_flash1_in_place_of_flash_but_not_of_another_choice():
    assert dict(framework_of("foundry").impls)["attention"] == "flash1"
    foundry, default = precision_of("bf16", framework="foundry"), precision_of("bf16")
    assert foundry.of("attention", _attn(2048).param_dict).param_dict["impl"] == "flash1"
    eager = {**_attn(2048).param_dict, "impl": "eager"}
    assert foundry.of("attention", eager).param_dict["impl"] == "eager"
    assert default.of("attention", _attn(2048).param_dict).param_dict["impl"] == "flash"
    assert "attention" not in dict(framework_of("megatron").impls)  # Transformer Engine's cuDNN attention: flash
    for name in ("neox", "hf", "hf-liger"):  # FlashAttention-2's kernels, flash itself off Hopper and Blackwell
        assert dict(framework_of(name).impls)["attention"] == "flash2"
        assert (
            precision_of("bf16", framework=name).of("attention", _attn(2048).param_dict).param_dict["impl"] == "flash"
        )


def test_the_benchmark_has_no_attention_source_of_its_own():
    assert not hasattr(mm, "MeasuredAttention") and not hasattr(mm, "FA1_FWD_BWD_TFLOPS")
    assert "triton_attention" not in inspect.signature(mm.predict_row).parameters


@pytest.mark.skipif(not mm.CSV_PATH.is_file(), reason=f"{mm.CSV_PATH} absent (the shared/validation checkout)")
def test_a_long_sequence_row_is_priced_with_the_attention_mosaicml_ran():
    row = min((r for r in mm.read_rows() if r.gpu == "a100_80gb" and r.seq >= 16384), key=lambda r: (r.n_params, r.seq))
    foundry = mm.predict_row(row)  # the CLI path: --framework foundry runs flash1
    hf = mm.predict_row(row, framework="hf")  # FlashAttention-2 (the learned models), the loss unfused
    assert foundry.feasible and hf.feasible
    # FlashAttention-2 is about twice FlashAttention-1's speed on A100 at long sequences
    assert foundry.iteration_s > 1.2 * hf.iteration_s
    assert foundry.model_flops == pytest.approx(hf.model_flops)
