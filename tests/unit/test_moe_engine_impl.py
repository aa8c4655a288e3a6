"""The serving engine picks the fused MoE layer's kernel family (``opcast.predict.serve.engine.moe_impl``): vLLM's
own kernels under ``engine`` vllm (Marlin's for MXFP4 experts where vLLM runs Marlin), TensorRT-LLM's under any other
engine or none, in ``predict infer`` and in the serving simulator's step tables alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import roofline_only
from opcast.predict.inference import infer_precision, predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import ENGINES, moe_impl
from opcast.predict.serve.step_cost import PricedStepCost

H100 = get_device("H100-SXM")
OSS = load_arch("gpt-oss-20b")
EXPECTED = {"none": "trtllm", "trtllm": "trtllm", "sglang": "trtllm", "vllm": "vllm"}


def test_every_engine_has_a_moe_kernel_family():
    assert {e: moe_impl(e) for e in ("none", *ENGINES)} == EXPECTED


@pytest.mark.parametrize(
    ("gpu", "version", "weights", "impl"),
    [
        ("A100-SXM4-80GB", None, "mxfp4", "marlin"),  # mma.sync: Marlin in every release
        ("L40S", "0.24.0", "mxfp4", "marlin"),
        ("RTX-PRO-6000", None, "mxfp4", "marlin"),  # sm_120 is an mma.sync part
        ("H100-SXM", "0.10.2", "mxfp4", "marlin"),  # Hopper before triton_kernels shipped
        ("H100-SXM", "v0.11.0", "mxfp4", "marlin"),
        ("H100-SXM", "0.12", "mxfp4", "vllm"),  # OpenAI Triton's matmul_ogs
        ("H100-SXM", None, "mxfp4", "vllm"),  # the newest
        ("B200", "0.10.2", "mxfp4", "vllm"),  # FlashInfer's TRT-LLM-gen MXFP4 kernels
        ("A100-SXM4-80GB", "0.10.2", None, "vllm"),  # bf16 experts: Triton fused_moe
        ("MI300X", "0.10.2", "mxfp4", "vllm"),
    ],
)
def test_vllm_runs_marlin_for_mxfp4_experts_where_it_has_no_faster_kernel(gpu, version, weights, impl):
    assert moe_impl("vllm", get_device(gpu), weights, version) == impl
    assert moe_impl("trtllm", get_device(gpu), weights, version) == "trtllm"


@pytest.mark.parametrize("bad", ["0.x", "", "1.2.3.4", "latest"])
def test_a_bad_engine_version_is_one_line(bad):
    with pytest.raises(OpcastError, match=r"--engine-version .*MAJOR\.MINOR"):
        moe_impl("vllm", H100, "mxfp4", bad)


def test_predict_infer_prices_gpt_oss_with_marlin_on_hopper_before_0_12():
    """gpt-oss's MXFP4 experts under vLLM 0.11.0 on an H100 are Marlin's layers, under the newest vLLM's own."""
    old, new = (
        predict_infer(OSS, H100, InferConfig(batch=2, prompt_len=64, gen_len=4, engine="vllm", engine_version=v))
        for v in ("0.11.0", None)
    )
    assert {line["params"]["impl"] for line in old.ops if line["kind"] == "moe"} == {"marlin"}
    assert {line["params"]["impl"] for line in new.ops if line["kind"] == "moe"} == {"vllm"}


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_an_inference_runs_its_engines_moe_kernels(engine):
    """Every moe op line of ``predict infer`` (prefill and decode) names the engine's family; other kinds keep
    their own parameters, and an ``impl`` already given is kept."""
    cfg = InferConfig(batch=2, prompt_len=64, gen_len=4, engine=engine)  # type: ignore[arg-type]
    result = predict_infer(OSS, H100, cfg)
    moe = [line for line in result.ops if line["kind"] == "moe"]
    assert moe and {line["params"]["impl"] for line in moe} == {EXPECTED[engine]}
    assert all(line["params"]["impl"] == "cublas" for line in result.ops if line["kind"] == "gemm")  # bf16 GEMMs
    prec = infer_precision(cfg, OSS, H100)
    given = prec.of("moe", {**moe[0]["params"], "impl": "trtllm"})
    assert given.param_dict["impl"] == "trtllm"


class _Seen:
    """A roofline kernel model that notes every kernel it is asked for."""

    def __init__(self) -> None:
        self.inner = roofline_only("test")
        self.kernels: list = []

    def lookup(self, kernels, device):
        self.kernels += list(kernels)
        return self.inner.lookup(kernels, device)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_serving_step_tables_price_the_engines_moe_kernels(engine):
    seen = _Seen()
    cfg = replace(InferConfig(), engine=engine)
    PricedStepCost(OSS, H100, cfg, gpus_per_node=8, kernels=seen, max_tokens=16, max_seqs=2, max_len=64)
    impls = {k.param_dict["impl"] for k in seen.kernels if k.kind == "moe"}
    assert impls == {EXPECTED[engine]}


@pytest.mark.parametrize("engine", ["none", "vllm", "sglang", "trtllm"])
def test_an_engine_runs_its_rotary_embedding_as_one_kernel(engine):
    """Every serving engine applies rope in one kernel (``impl`` fused); the forward alone (none) keeps the
    registry's default, Hugging Face's torch ops."""
    cfg = InferConfig(batch=2, prompt_len=64, gen_len=4, engine=engine)  # type: ignore[arg-type]
    rope = {line["params"]["impl"] for line in predict_infer(OSS, H100, cfg).ops if line["kind"] == "rope"}
    assert rope == {"unfused" if engine == "none" else "fused"}


@pytest.mark.parametrize("engine", ["none", "vllm", "sglang", "trtllm"])
def test_an_engine_runs_a_gated_silu_as_one_kernel(engine):
    """Every serving engine runs SwiGLU as one ``silu_and_mul`` kernel; the forward alone (none) runs torch's SiLU and
    the gate product apart."""
    arch = load_arch("llama3-8b")
    cfg = InferConfig(batch=2, prompt_len=64, gen_len=4, engine=engine)  # type: ignore[arg-type]
    fns = {line["params"]["fn"] for line in predict_infer(arch, H100, cfg).ops if line["role"] in ("act", "gate_mul")}
    assert fns == ({"silu", "mul"} if engine == "none" else {"swiglu"})


def test_the_library_refuses_a_bad_engine_version_as_the_option_does():
    """``validate_infer`` makes the ``--engine-version`` option's check, so a library caller gets the same line."""
    from opcast.predict.parallel import validate_infer

    _, reasons = validate_infer(OSS, H100, InferConfig(engine="vllm", engine_version="0.x"))
    assert reasons == ["--engine-version '0.x': give the engine's release as MAJOR.MINOR[.PATCH], e.g. 0.11.0"]
    assert validate_infer(OSS, H100, InferConfig(engine="vllm", engine_version="0.11.0"))[1] == []
