"""vLLM's compile-time fusions (``--fusions``, :data:`opcast.predict.serve.engine.VLLM_FUSIONS`): which all-reduces
the fused kernel takes, and what a forward loses under each fusion, checked against hand-worked prices."""

from dataclasses import replace

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.inference import predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import (
    allreduce_rms_fused,
    fusions_of,
    fusions_problem,
    static_fp8_quant_s,
)

B200, H100, L40S = get_device("B200"), get_device("H100-SXM"), get_device("L40S")
MIB = 2**20


def test_the_fused_all_reduce_takes_messages_up_to_vllms_limit_by_gpu_and_tp():
    """vLLM's defaults (``FI_ALLREDUCE_FUSION_MAX_SIZE_MB``): 1 MiB at TP 8 on both; 2 MiB at TP 4 on Hopper, 32 on
    datacenter Blackwell; a limit given replaces them; no fusion on one GPU, or on a GPU vLLM has no table for."""
    default = fusions_of("allreduce_rms")
    assert allreduce_rms_fused(default, 1 * MIB, 8, B200) and not allreduce_rms_fused(default, 1 * MIB + 2, 8, B200)
    assert allreduce_rms_fused(default, 32 * MIB, 4, B200) and not allreduce_rms_fused(default, 3 * MIB, 4, H100)
    assert not allreduce_rms_fused(default, 1024, 1, B200)  # no all-reduce to fuse
    assert not allreduce_rms_fused(default, 1024, 2, L40S)  # sm_89: vLLM disables the pass
    assert allreduce_rms_fused(fusions_of("allreduce_rms:8,attn_quant"), 8 * MIB, 8, B200)
    assert not allreduce_rms_fused(fusions_of("attn_quant"), 1024, 8, B200)
    assert fusions_of("allreduce_rms:8,attn_quant") == {"allreduce_rms": 8.0, "attn_quant": None}
    assert fusions_of(None) == {}


@pytest.mark.parametrize(
    ("text", "engine", "needle"),
    [
        ("allreduce_rms,attn_quant", "vllm", None),
        ("allreduce_rms:32", "vllm", None),
        ("fuse_everything", "vllm", "not one of allreduce_rms, attn_quant"),
        ("allreduce_rms,", "vllm", "not one of"),
        ("allreduce_rms:0", "vllm", "positive number of MiB"),
        ("attn_quant:2", "vllm", "only allreduce_rms takes a limit"),
        ("attn_quant", "trtllm", "give --engine vllm"),
    ],
)
def test_fusions_problem_names_what_is_wrong(text, engine, needle):
    problem = fusions_problem(text, engine)
    assert (problem is None) if needle is None else (needle in problem)


def _decode_ops(cfg: InferConfig) -> dict[str, dict]:
    arch = load_arch("llama3-70b")
    r = predict_infer(arch, B200, cfg, kernels=load_kernel_cost(None, use_learned=True))
    assert r.feasible, r.reasons
    return r, {o["role"]: o for o in r.ops if o["phase"] == "decode"}


def test_a_fused_forward_loses_the_norms_and_the_quantisation_of_the_linears_after_them():
    """Llama-3.1-70B in fp8 at TP 8 on B200, 16 sequences (a 256 KiB all-reduce, under the 1 MiB limit): with
    allreduce_rms the norms and residual adds cost nothing, QKV and gate/up lose exactly one static fp8 quantisation
    of their input, the output projection keeps it (attn_quant not given); with attn_quant it loses it too; every
    TP all-reduce is TensorRT-LLM's kernel."""
    base = InferConfig(tp=8, batch=16, prompt_len=512, gen_len=64, precision="fp8", kv_dtype="fp8", engine="vllm")
    r0, plain = _decode_ops(base)
    r1, fused = _decode_ops(replace(base, fusions="allreduce_rms"))
    r2, both = _decode_ops(replace(base, fusions="allreduce_rms,attn_quant"))
    for role in ("norm1", "norm2", "residual_add", "final_norm"):
        assert plain[role]["time_s"] > 0 and fused[role]["time_s"] == 0.0 and fused[role]["fused"] == "allreduce_rms"
    for role in ("qkv", "mlp_up"):
        p = plain[role]["params"]
        want = plain[role]["time_s"] - static_fp8_quant_s(p["m"], p["k"], B200)
        assert fused[role]["time_s"] == pytest.approx(want) and fused[role]["fused"] == "allreduce_rms"
    assert fused["proj"]["time_s"] == plain["proj"]["time_s"] and "fused" not in fused["proj"]
    p = plain["proj"]["params"]
    assert both["proj"]["time_s"] == pytest.approx(plain["proj"]["time_s"] - static_fp8_quant_s(p["m"], p["k"], B200))
    assert fused["mlp_down"]["time_s"] == plain["mlp_down"]["time_s"]  # its input comes from the activation
    assert r1.tpot_s < r0.tpot_s and r2.tpot_s < r1.tpot_s
    calls = r1.cost_sources["tp_all_reduce"]["decode_step_calls"]
    assert calls and all(k.startswith(("all_reduce_trtllm:", "all_gather:")) for k in calls)  # the head's gather
    assert any(k.startswith("all_reduce_custom:") for k in r0.cost_sources["tp_all_reduce"]["decode_step_calls"])


def test_a_prompt_over_the_limit_runs_unfused():
    """A 2,048-token prompt at TP 8 all-reduces 32 MiB, over the 1 MiB default: its prefill is priced as without
    the fusion, while the decode steps (16 sequences) are fused."""
    base = InferConfig(tp=8, batch=1, prompt_len=2048, gen_len=8, precision="fp8", kv_dtype="fp8", engine="vllm")
    arch = load_arch("llama3-70b")
    kernels = load_kernel_cost(None, use_learned=True)
    r0 = predict_infer(arch, B200, base, kernels=kernels)
    r1 = predict_infer(arch, B200, replace(base, fusions="allreduce_rms"), kernels=kernels)
    assert r1.ttft_s == pytest.approx(r0.ttft_s, rel=1e-9)
    assert r1.tpot_s < r0.tpot_s
    assert r1.cost_sources["fusions"] == {
        "given": ["allreduce_rms"],
        "prefill_applied": [],
        "decode_applied": ["allreduce_rms"],
    }
    assert any("prefill none; decode allreduce_rms" in n and "size limit" in n for n in r1.cost_sources["notes"])
    assert "fusions" not in r0.cost_sources


def test_a_layernorm_model_is_not_fused():
    """vLLM's pass matches RMSNorm only: a LayerNorm model (GPT-3 2.7B) at TP 2 keeps its norms and all-reduces."""
    arch = load_arch("gpt3-2.7b")
    kernels = load_kernel_cost(None, use_learned=True)
    base = InferConfig(tp=2, batch=8, prompt_len=256, gen_len=16, engine="vllm")
    r0 = predict_infer(arch, H100, base, kernels=kernels)
    r1 = predict_infer(arch, H100, replace(base, fusions="allreduce_rms"), kernels=kernels)
    assert r1.tpot_s == r0.tpot_s and not any(o.get("fused") for o in r1.ops)
