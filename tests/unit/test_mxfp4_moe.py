"""How MXFP4 experts run (``--mxfp4-moe``, :data:`opcast.predict.serve.engine.MXFP4_MOE`): the kernel family and
dtype each choice prices gpt-oss's fused MoE layer with, and what each refuses."""

from dataclasses import replace

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import roofline_only
from opcast.predict.inference import infer_precision, predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import MXFP4_MOE_DTYPE, engine_mxfp4_moe, moe_impl, mxfp4_moe_problem

B200, H100 = get_device("B200"), get_device("H100-SXM")
RTX, MI355X = get_device("RTX-PRO-6000"), get_device("MI355X")
OSS = load_arch("gpt-oss-120b")
LLAMA = load_arch("llama3-8b")


@pytest.mark.parametrize(
    ("engine", "device", "version", "choice", "impl"),
    [
        ("vllm", H100, "0.11.0", None, "marlin"),  # vLLM before 0.12 has no other MXFP4 kernel on Hopper
        ("vllm", H100, "0.18.0", None, "vllm"),  # OpenAI Triton's matmul_ogs
        ("vllm", H100, "0.18.0", "marlin", "marlin"),  # VLLM_MXFP4_USE_MARLIN=1
        ("vllm", H100, "0.11.0", "bf16", "vllm"),  # a choice given replaces the release's
        ("vllm", B200, None, "mxfp8", "vllm"),  # FlashInfer's TRT-LLM-gen kernel, vLLM's family
        ("trtllm", B200, None, "mxfp8", "trtllm"),
        ("sglang", H100, None, "marlin", "marlin"),
    ],
)
def test_each_choice_names_the_kernel_family(engine, device, version, choice, impl):
    assert moe_impl(engine, device, "mxfp4", version, choice) == impl


def test_a_dense_or_bf16_expert_model_keeps_its_engines_family_whatever_is_given():
    assert moe_impl("vllm", H100, None, "0.11.0", "marlin") == "vllm"
    assert moe_impl("trtllm", H100, "dtype", None, "marlin") == "trtllm"


@pytest.mark.parametrize(
    ("choice", "engine", "weights", "device", "needle"),
    [
        ("marlin", "vllm", "mxfp4", H100, None),
        ("mxfp8", "trtllm", "mxfp4", B200, None),
        ("bf16", "sglang", "mxfp4", H100, None),
        ("cutlass", "vllm", "mxfp4", H100, "not one of marlin, bf16, mxfp8"),
        ("marlin", "vllm", "dtype", H100, "applies to MXFP4 experts"),
        ("marlin", "trtllm", "mxfp4", H100, "not trtllm's"),
        ("mxfp8", "vllm", "mxfp4", H100, "H100-SXM lacks"),
    ],
)
def test_what_each_choice_refuses(choice, engine, weights, device, needle):
    problem = mxfp4_moe_problem(choice, engine, weights, device, "m")
    assert (problem is None) if needle is None else (needle in problem)


def test_mxfp8_prices_the_experts_in_block_scaled_fp8_and_nothing_else():
    """Under mxfp8 the fused MoE kernel's dtype is MXFP8 (fp8_block, weights still MXFP4); attention, the dense
    linears and a dense model keep theirs."""
    cfg = InferConfig(engine="vllm", mxfp4_moe="mxfp8")
    prec = infer_precision(cfg, OSS, B200)
    moe = prec.of("moe", {"tokens": 64, "hidden": 2880, "inter": 2880, "experts": 128, "topk": 4, "weights": "mxfp4"})
    assert moe.dtype == MXFP4_MOE_DTYPE == "fp8_block" and moe.param_dict["weights"] == "mxfp4"
    assert prec.of("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}).dtype == "bf16"
    assert infer_precision(replace(cfg, mxfp4_moe="bf16"), OSS, B200).moe_matrix is None
    assert infer_precision(cfg, LLAMA, B200).moe_matrix is None


def test_mxfp8_experts_run_at_the_fp8_rate_in_a_long_prefill():
    """gpt-oss-120b's 8,192-token prompt on one B200 (the roofline set): the experts are compute-bound, so at the fp8
    peak (twice bf16's) their prefill time falls by well over a quarter (the achievable roofline's efficiencies
    differ by dtype); every other kernel of the forward is priced as before."""
    base = InferConfig(batch=1, prompt_len=8192, gen_len=2, engine="vllm", mxfp4_moe="bf16")
    times = {}
    for choice in ("bf16", "mxfp8"):
        r = predict_infer(OSS, B200, replace(base, mxfp4_moe=choice), kernels=roofline_only())
        assert r.feasible, r.reasons
        times[choice] = [(o["role"], o["kind"], o["time_s"]) for o in r.ops if o["phase"] == "prefill"]
    for (role, kind, t16), (_, _, t8) in zip(times["bf16"], times["mxfp8"], strict=True):
        if kind == "moe":
            assert t16 / 2 <= t8 < 0.75 * t16, role
        else:
            assert t8 == t16, role


def test_the_report_says_which_kernel_priced_the_experts_and_how_to_say_another():
    def notes(arch, cfg):
        r = predict_infer(arch, H100, cfg, kernels=roofline_only())
        assert r.feasible, r.reasons
        return [n for n in r.cost_sources["notes"] if n.startswith("MXFP4 experts")]

    base = InferConfig(batch=4, prompt_len=256, gen_len=8, engine="vllm")
    (old,) = notes(OSS, replace(base, engine_version="0.11.0"))
    assert "the marlin fused-MoE kernel with bf16 activations (vllm's choice on H100-SXM)" in old
    assert "VLLM_MXFP4_USE_MARLIN=1" in old
    (given,) = notes(OSS, replace(base, mxfp4_moe="bf16", engine_version="0.11.0"))
    assert "the vllm fused-MoE kernel with bf16 activations (--mxfp4-moe bf16)" in given
    assert notes(LLAMA, base) == [] and notes(OSS, replace(base, engine="none")) == []


@pytest.mark.parametrize(
    ("engine", "device", "choice"),
    [
        ("trtllm", B200, "mxfp8"),  # sm_100: W4A8_MXFP4_MXFP8 unless OVERRIDE_QUANT_ALGO says otherwise
        ("trtllm", RTX, "mxfp8"),  # sm_120 too (compute capability >= 10.0)
        ("trtllm", H100, None),  # W4A16_MXFP4 before sm_100
        ("trtllm", MI355X, None),  # an fp4 peak, but not NVIDIA's block-scaled tensor cores
        ("vllm", B200, None),  # vLLM's own choice, read by moe_impl
        ("sglang", B200, "mxfp8"),  # flashinfer_mxfp4 runner, its default precision quantises to MXFP8
        ("sglang", RTX, None),  # sm_120: triton_kernel, bf16 activations
        ("sglang", H100, None),
        ("none", B200, None),
    ],
)
def test_trtllm_and_sglang_quantise_mxfp4_experts_activations_to_mxfp8_on_blackwell(engine, device, choice):
    assert engine_mxfp4_moe(engine, device) == choice


def test_the_engines_own_mxfp8_is_priced_unless_a_choice_is_given():
    """TensorRT-LLM on B200 with --mxfp4-moe left out prices the experts as --mxfp4-moe mxfp8 does; bf16 given
    replaces it; on Hopper nothing changes."""
    cfg = InferConfig(engine="trtllm")
    assert infer_precision(cfg, OSS, B200).moe_matrix == MXFP4_MOE_DTYPE
    assert infer_precision(cfg, OSS, B200) == infer_precision(replace(cfg, mxfp4_moe="mxfp8"), OSS, B200)
    assert infer_precision(replace(cfg, mxfp4_moe="bf16"), OSS, B200).moe_matrix is None
    assert infer_precision(cfg, OSS, H100).moe_matrix is None
    assert infer_precision(cfg, LLAMA, B200).moe_matrix is None
