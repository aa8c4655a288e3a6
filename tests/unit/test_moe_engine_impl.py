"""The serving engine picks the fused MoE layer's kernel family (``opcast.predict.serve.engine.moe_impl``): vLLM's
own kernels under ``engine`` vllm, TensorRT-LLM's under any other engine or none, in ``predict infer`` and in the
serving simulator's step tables alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opcast.archs import load_arch
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


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_an_inference_runs_its_engines_moe_kernels(engine):
    """Every moe op line of ``predict infer`` (prefill and decode) names the engine's family; other kinds keep
    their own parameters, and an ``impl`` already given is kept."""
    cfg = InferConfig(batch=2, prompt_len=64, gen_len=4, engine=engine)  # type: ignore[arg-type]
    result = predict_infer(OSS, H100, cfg)
    moe = [line for line in result.ops if line["kind"] == "moe"]
    assert moe and {line["params"]["impl"] for line in moe} == {EXPECTED[engine]}
    assert all("impl" not in line["params"] for line in result.ops if line["kind"] == "gemm")
    prec = infer_precision(cfg)
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
