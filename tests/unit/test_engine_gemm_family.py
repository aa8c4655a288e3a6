"""vLLM's own fp8 GEMM (``impl`` vllm, ``opcast.ops.GEMM_IMPLS``): ``--engine vllm`` prices its per-tensor fp8 linears
as vLLM's CUTLASS kernel, learned by a group of its own (``gemm-fwd-fp8_vllm``), without the amax correction the
default family's rows need; every other engine, every bf16 GEMM and a set without the group keep cuBLAS's."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import kernel, load_kernel_cost
from opcast.predict.graph import FP8_LINEARS
from opcast.predict.inference import infer_precision, predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import ENGINE_GEMM_FAMILIES, engine_fp8_gemm_s

H100 = get_device("H100-SXM")
LLAMA = load_arch("llama3-8b")
SHAPE = {"m": 4096, "n": 8192, "k": 8192}


@pytest.mark.parametrize("engine", ["none", "vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_only_vllms_fp8_linears_run_its_family(engine, precision):
    cfg = InferConfig(precision=precision, engine=engine)  # type: ignore[arg-type]
    gemm = infer_precision(cfg, LLAMA, H100).of("gemm", SHAPE)
    want = "vllm" if (engine, precision) == ("vllm", "fp8") else "cublas"
    assert gemm.param_dict["impl"] == want and ENGINE_GEMM_FAMILIES.get(engine, "cublas") in ("vllm", "cublas")
    ops = predict_infer(
        LLAMA, H100, InferConfig(batch=2, prompt_len=64, gen_len=2, precision=precision, engine=engine)
    ).ops  # type: ignore[arg-type]
    fp8 = {line["params"]["impl"] for line in ops if line["kind"] == "gemm" and line["dtype"] == "fp8"}
    assert fp8 == (set() if precision == "bf16" else {want})


def test_the_default_set_learns_vllms_fp8_gemm_on_its_own_and_nothing_else():
    """models/default has the family's fp8 group: vLLM's fp8 GEMM is priced from it (another time than cuBLAS's);
    a bf16 GEMM named vLLM's has no group and is priced exactly as cuBLAS's."""
    model = load_kernel_cost(None, use_learned=True)
    cublas, vllm = (kernel("gemm", {**SHAPE, "impl": impl}, "fp8") for impl in ("cublas", "vllm"))
    table = model.lookup([cublas, vllm], H100)
    assert model.family_of(vllm) == "vllm" and model.family_of(cublas) is None
    assert table[vllm][1] == table[cublas][1] == "learned" and table[vllm][0] != pytest.approx(table[cublas][0])
    half = [kernel("gemm", {**SHAPE, "impl": impl}, "bf16") for impl in ("cublas", "vllm")]
    times = model.lookup(half, H100)
    assert times[half[0]] == times[half[1]] and model.family_of(half[1]) is None


def test_the_amax_correction_applies_to_the_default_familys_rows_only():
    """One decode forward of llama3-8b in fp8: under sglang every fp8 linear of the blocks is the cuBLAS row less the
    amax pass (engine_fp8_gemm_s); under vllm the family's own rows as learned. Checked against the kernels priced
    directly."""
    model = load_kernel_cost(None, use_learned=True)
    times = {}
    for engine in ("sglang", "vllm"):
        cfg = InferConfig(tp=1, precision="fp8", engine=engine)  # type: ignore[arg-type]
        result = predict_infer(
            LLAMA, H100, InferConfig(batch=1, prompt_len=16, gen_len=2, precision="fp8", engine=engine), kernels=model
        )  # type: ignore[arg-type]
        times[engine] = [
            line
            for line in result.ops
            if line["kind"] == "gemm"
            and line["dtype"] == "fp8"
            and line["phase"] == "decode"
            and line["role"] in FP8_LINEARS
        ]
        assert times[engine]
        prec = infer_precision(cfg, LLAMA, H100)
        for line in times[engine]:
            k = prec.of("gemm", {n: v for n, v in line["params"].items() if n != "impl"})
            learned = model.lookup([k], H100)[k][0]
            p = k.param_dict
            want = learned if engine == "vllm" else engine_fp8_gemm_s(learned, p["m"], p["k"], k.bytes_moved(), H100)
            assert line["time_s"] == pytest.approx(want)
