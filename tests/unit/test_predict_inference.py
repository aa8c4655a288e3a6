"""Inference: prefill, decode, KV cache, feasibility."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict import inference
from opcast.predict.cost import roofline_only
from opcast.predict.inference import predict_infer
from opcast.predict.memory import kv_cache_bytes
from opcast.predict.parallel import InferConfig

H100 = get_device("H100-SXM")
LLAMA = load_arch("llama2-7b")


def infer(arch=LLAMA, device=H100, **kw):
    return predict_infer(arch, device, InferConfig(**kw), kernels=roofline_only())


def test_latency_adds_up_and_throughput_follows():
    r = infer(batch=4, prompt_len=512, gen_len=64)
    assert r.feasible
    assert r.total_latency_s == pytest.approx(r.ttft_s + 63 * r.tpot_s)
    assert r.tokens_per_s == pytest.approx(4 * 64 / r.total_latency_s)
    assert r.ttft_s == pytest.approx(sum(r.breakdown_s["prefill"].values()))
    assert r.kv_cache_bytes == kv_cache_bytes(LLAMA, tp=1, pp=1, batch=4, tokens=576, dtype="bf16")


def test_decode_is_memory_bound_and_grows_with_context():
    short = infer(batch=1, prompt_len=128, gen_len=32)
    long = infer(batch=1, prompt_len=3072, gen_len=32)
    assert long.tpot_s > short.tpot_s
    weights = 2 * LLAMA.params_total()
    assert short.tpot_s > weights / H100.mem_bw_bytes_per_s  # at least one read of the weights per token


def test_sampled_decode_steps_are_exact_for_the_linear_law(monkeypatch):
    exact = infer(batch=2, prompt_len=256, gen_len=40)
    monkeypatch.setattr(inference, "DECODE_SAMPLES", 5)
    sampled = infer(batch=2, prompt_len=256, gen_len=40)
    assert sampled.tpot_s == pytest.approx(exact.tpot_s, rel=0.01)


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    one = infer(batch=8, prompt_len=512, gen_len=16)
    four = infer(batch=8, prompt_len=512, gen_len=16, tp=4)
    assert four.memory.weights_bytes < one.memory.weights_bytes / 3.5
    assert four.breakdown_s["decode_step"]["tp_comm"] > 0 == one.breakdown_s["decode_step"]["tp_comm"]


def test_infeasible_inference_lists_every_reason():
    r = infer(load_arch("gpt3-1.3b"), tp=3, pp=5, batch=1, prompt_len=2000, gen_len=100)
    text = " | ".join(r.reasons)
    assert "tp=3 does not divide" in text and "pp=5 does not divide" in text and "exceeds max_seq=2048" in text
    big = infer(load_arch("llama2-70b"), batch=64, prompt_len=4000, gen_len=96)
    assert not big.feasible and "does not fit" in big.reasons[0]


# --------------------------------------------------------------------------- --engine: per-step overhead


class _FlatKernels:
    """Every kernel costs ``t_s``: the forward's time is ``t_s`` x the kernels launched, by hand."""

    def __init__(self, t_s: float) -> None:
        self.t_s = t_s

    def lookup(self, kernels, device):
        return {k: (self.t_s, "flat") for k in kernels}

    def describe(self):
        return {"kernels": "flat stub"}


def _flat(engine: str, batch: int, gen_len: int = 9):
    from opcast.predict.comm import CollectiveCostModel

    cfg = InferConfig(batch=batch, prompt_len=64, gen_len=gen_len, engine=engine)
    return predict_infer(LLAMA, H100, cfg, kernels=_FlatKernels(1e-3), comms=CollectiveCostModel())


def _launches_s(result, phase: str) -> float:
    """The kernel time of one ``phase`` step under :func:`_flat`'s 1 ms a kernel."""
    return 1e-3 * sum(ln["count"] for ln in result.ops if ln["phase"] == phase)


def test_engine_adds_one_step_overhead_to_prefill_and_to_each_decode_step(monkeypatch):
    from opcast.predict.serve import engine

    monkeypatch.setitem(engine.OVERHEADS, "vllm", engine.StepOverhead(fixed_s=5e-3, per_seq_s=1e-4, source="hand"))
    none, vllm = _flat("none", batch=8), _flat("vllm", batch=8)
    assert none.ttft_s == pytest.approx(_launches_s(none, "prefill"))  # tp = pp = 1: no communication
    assert none.tpot_s == pytest.approx(_launches_s(none, "decode"))
    # the engine's own kernels: one SwiGLU kernel a layer where the forward alone runs the SiLU and the product
    assert _launches_s(vllm, "decode") == pytest.approx(_launches_s(none, "decode") - 1e-3 * LLAMA.n_layers)
    step = 5e-3 + 8 * 1e-4  # fixed + per sequence x batch 8
    assert vllm.ttft_s == pytest.approx(_launches_s(vllm, "prefill") + step)
    assert vllm.tpot_s == pytest.approx(_launches_s(vllm, "decode") + step)
    assert vllm.total_latency_s == pytest.approx(vllm.ttft_s + 8 * vllm.tpot_s)
    assert vllm.breakdown_s["prefill"]["overhead"] == pytest.approx(step)
    assert vllm.breakdown_s["decode_step"]["overhead"] == pytest.approx(step)
    assert vllm.ttft_s == pytest.approx(sum(vllm.breakdown_s["prefill"].values()))
    assert vllm.tpot_s == pytest.approx(sum(vllm.breakdown_s["decode_step"].values()))
    src = vllm.cost_sources["step_overhead"]
    assert src == {"engine": "vllm", "fixed_s": 5e-3, "per_seq_s": 1e-4, "seqs": 8, "source": "hand"}
    assert any("vllm step overhead" in n and "hand" in n for n in vllm.cost_sources["notes"])


def test_engine_overhead_grows_with_batch_as_its_profile_says():
    from opcast.predict.serve.engine import OVERHEADS

    for name in ("vllm", "sglang", "trtllm"):
        for batch in (1, 32):
            with_ = _flat(name, batch)
            assert with_.tpot_s - _launches_s(with_, "decode") == pytest.approx(OVERHEADS[name].time_s(batch))
            assert with_.ttft_s - _launches_s(with_, "prefill") == pytest.approx(OVERHEADS[name].time_s(batch))
            assert OVERHEADS[name].source in with_.cost_sources["step_overhead"]["source"]


def test_no_engine_is_the_forward_alone():
    r = _flat("none", batch=4)
    assert InferConfig().engine == "none"
    assert all("overhead" not in parts for parts in r.breakdown_s.values())
    assert "step_overhead" not in r.cost_sources and "notes" not in r.cost_sources


def test_single_token_generation_has_no_decode_overhead():
    r = _flat("trtllm", batch=2, gen_len=1)
    assert r.tpot_s == 0.0 and r.total_latency_s == pytest.approx(r.ttft_s)


def test_unknown_engine_is_a_reason_not_a_crash():
    r = infer(batch=1, prompt_len=64, gen_len=4, engine="tgi")
    assert not r.feasible and any("engine='tgi' is not one of none, vllm, sglang, trtllm" in x for x in r.reasons)


def test_a_sequence_past_max_position_embeddings_is_noted_not_refused():
    # vLLM refuses a prompt past max_model_len, but derives that from rope_scaling (which opcast does not read) and
    # lets --max-model-len extend it: a rope arch past max_seq is priced, with a note; the numbers are unchanged
    long = infer(batch=1, prompt_len=LLAMA.max_seq, gen_len=8)
    notes = [n for n in long.cost_sources.get("notes", []) if "exceeds max_seq" in n]
    assert notes == [inference.context_note(LLAMA, LLAMA.max_seq + 8)]
    assert "prompt_len + gen_len = 4,104 exceeds max_seq=4,096 of llama2-7b" in notes[0]
    fits = infer(batch=1, prompt_len=LLAMA.max_seq - 8, gen_len=8)
    assert not [n for n in fits.cost_sources.get("notes", []) if "exceeds max_seq" in n]
    assert inference.context_note(load_arch("gpt3-125m"), 4104) is None  # learned positions: refused elsewhere


# --------------------------------------------------------------------------- --engine: a batch past the KV cache


def test_a_batch_the_engines_kv_cache_cannot_hold_runs_in_waves_not_refused():
    from opcast.predict.serve.engine import engine_config
    from opcast.predict.serve.kv_cache import kv_capacity

    a100 = get_device("A100-SXM4-40GB")
    cfg = InferConfig(batch=64, prompt_len=2048, gen_len=2048, engine="trtllm")
    alone = predict_infer(LLAMA, a100, InferConfig(batch=64, prompt_len=2048, gen_len=2048), kernels=roofline_only())
    assert not alone.feasible and "does not fit" in alone.reasons[0]  # no engine: the static accounting refuses
    cap = kv_capacity(LLAMA, a100, cfg, engine_config("trtllm", a100), longest_tokens=4096)
    fit = cap.blocks // cap.pages(4096)  # llama2-7b: 0.5 MiB of KV a token, ~22 GiB free: 5 sequences of 4096
    assert 1 <= fit < 64
    r = predict_infer(LLAMA, a100, cfg, kernels=roofline_only())
    assert r.feasible and r.cost_sources["waves"] == {"sequences_at_once": fit, "waves": -(-64 // fit)}
    full = predict_infer(LLAMA, a100, _with(cfg, batch=fit), kernels=roofline_only())
    rest = predict_infer(LLAMA, a100, _with(cfg, batch=64 % fit), kernels=roofline_only())
    assert full.feasible and rest.feasible
    assert r.total_latency_s == pytest.approx((64 // fit) * full.total_latency_s + rest.total_latency_s)
    assert (r.ttft_s, r.tpot_s) == (full.ttft_s, full.tpot_s)  # a full wave's
    assert r.tokens_per_s == pytest.approx(64 * 2048 / r.total_latency_s)
    assert r.config.batch == 64 and any("waves of at most" in n for n in r.cost_sources["notes"])
    even = predict_infer(LLAMA, a100, _with(cfg, batch=3 * fit), kernels=roofline_only())  # no remainder wave
    assert even.cost_sources["waves"]["waves"] == 3
    assert even.total_latency_s == pytest.approx(3 * full.total_latency_s)


def test_a_batch_the_engine_holds_is_priced_as_one_even_where_a_whole_prompt_prefill_would_overflow():
    a100 = get_device("A100-SXM4-40GB")
    llama3 = load_arch("llama3-8b")
    # 16 prompts of 8192 tokens: the static accounting prefills all 131072 tokens at once (~11 GiB of working set,
    # 43 GiB in all); vLLM prefills in chunks of its token budget, and its KV cache holds the 16 sequences
    cfg = InferConfig(batch=16, prompt_len=8192, gen_len=1, engine="vllm")
    alone = predict_infer(llama3, a100, _with(cfg, engine="none"), kernels=roofline_only())
    assert not alone.feasible and "does not fit" in alone.reasons[0]
    r = predict_infer(llama3, a100, cfg, kernels=roofline_only())
    assert r.feasible and "waves" not in r.cost_sources
    assert any("holds the batch and it prefills in chunks" in n for n in r.cost_sources["notes"])
    assert r.kv_cache_bytes == alone.kv_cache_bytes


def _with(cfg: InferConfig, **changes) -> InferConfig:
    from dataclasses import replace

    return replace(cfg, **changes)


def test_vllm_on_a_batch_past_its_kv_cache_is_simulated_with_preemption():
    import numpy as np

    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.serve.deployment import predict_serve
    from opcast.predict.serve.engine import engine_config
    from opcast.predict.serve.requests import RequestStream

    a100 = get_device("A100-SXM4-40GB")
    cfg = InferConfig(batch=24, prompt_len=2048, gen_len=256, engine="vllm")  # 24 x 2304 tokens: ~27 GiB of KV
    comms = CollectiveCostModel()
    r = predict_infer(LLAMA, a100, cfg, kernels=roofline_only(), comms=comms)
    waves = r.cost_sources["waves"]
    assert r.feasible and waves["simulated"] and 1 <= waves["sequences_at_once"] < 24
    stream = RequestStream(
        arrival_s=np.zeros(24),
        input_tokens=np.full(24, 2048),
        output_tokens=np.full(24, 256),
        source="the same batch, by hand",
    )
    served = predict_serve(
        LLAMA, a100, cfg, engine_config("vllm", a100, frontend_s=0.0), stream, kernels=roofline_only(), comms=comms
    )
    assert r.total_latency_s == pytest.approx(served.metrics.duration_s)  # the last request's finish
    assert waves["preemptions"] == served.metrics.preemptions
    assert r.total_latency_s > r.ttft_s + 255 * r.tpot_s  # longer than one wave of the sequences it holds
    assert any("simulated through vllm's scheduler" in n for n in r.cost_sources["notes"])


def test_vllm_before_async_output_pays_its_measured_step_overhead():
    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.serve.engine import OVERHEADS, VLLM_SYNC_OUTPUT_OVERHEAD, step_overhead

    assert step_overhead("vllm", "0.5.4") is VLLM_SYNC_OUTPUT_OVERHEAD
    assert step_overhead("vllm", "v0.5") is VLLM_SYNC_OUTPUT_OVERHEAD
    for engine, version in (("vllm", "0.6.0"), ("vllm", "0.11.2"), ("vllm", None), ("trtllm", "0.5.0")):
        assert step_overhead(engine, version) is OVERHEADS[engine]
    assert VLLM_SYNC_OUTPUT_OVERHEAD.time_s(64) == pytest.approx(0.7e-3 + 64 * 50e-6)  # 3.9 ms a step at 64
    flat = _FlatKernels(1e-3)
    old = predict_infer(
        LLAMA,
        H100,
        InferConfig(batch=8, prompt_len=64, gen_len=9, engine="vllm", engine_version="0.5.4"),
        kernels=flat,
        comms=CollectiveCostModel(),
    )
    new = _flat("vllm", batch=8)
    step = VLLM_SYNC_OUTPUT_OVERHEAD.time_s(8) - OVERHEADS["vllm"].time_s(8)
    assert old.tpot_s - new.tpot_s == pytest.approx(step) and old.ttft_s - new.ttft_s == pytest.approx(step)
    assert "vLLM before 0.6" in old.cost_sources["step_overhead"]["source"]


def test_a_batch_past_the_engines_max_num_seqs_runs_that_many_at_once():
    from opcast.predict.inference import engine_wave
    from opcast.predict.serve.engine import engine_config

    a100 = get_device("A100-SXM4-80GB")
    cap = engine_config("vllm", a100).max_num_seqs  # 256 on an A100 (vLLM's V1 defaults)
    short = InferConfig(batch=2 * cap, prompt_len=64, gen_len=8, engine="vllm")  # whose KV fits many times over
    assert engine_wave(LLAMA, a100, short) == cap
    assert engine_wave(LLAMA, a100, _with(short, batch=cap)) == cap  # exactly its limit: one batch
    r = predict_infer(LLAMA, a100, short, kernels=roofline_only())
    assert r.feasible and r.cost_sources["waves"]["sequences_at_once"] == cap
    assert any(f"runs at most {cap} of the {2 * cap}" in n for n in r.cost_sources["notes"])


def test_engine_fp8_gemm_loses_the_amax_pass_but_not_below_its_own_bytes():
    from dataclasses import replace as dc_replace

    from opcast.predict.serve.engine import DYNAMIC_FP8_AMAX_FLOOR_S, amax_floor_s, engine_fp8_gemm_s

    dev = dc_replace(H100, mem_bw_bytes_per_s=1e12)
    # m = 4, k = 1000: the pass is H100's measured 7.2 us + 8 kB at 1 TB/s = 7.208 us
    assert amax_floor_s(dev) == 7.2e-6
    assert engine_fp8_gemm_s(20e-6, 4, 1000, 1e6, dev) == pytest.approx(20e-6 - 7.2e-6 - 8e-9)
    # each GPU its own measured pass (Blackwell's 1.2 us longer), a GPU made from one with --set its base's, an
    # unmeasured GPU the middle value
    assert amax_floor_s(get_device("B200")) == 8.4e-6 and amax_floor_s(get_device("GB300")) == 8.5e-6
    assert amax_floor_s(dc_replace(get_device("B200"), name="B200[peak_fp8_flops=x2]")) == 8.4e-6
    assert amax_floor_s(get_device("A100-SXM4-80GB")) == DYNAMIC_FP8_AMAX_FLOOR_S == 7e-6
    # a GEMM moving 4 MB cannot take less than 4 us at 1 TB/s
    assert engine_fp8_gemm_s(8e-6, 4, 1000, 4e6, dev) == pytest.approx(4e-6)


def test_an_engine_prices_fp8_linears_without_their_amax_pass_and_bf16_ones_as_before():
    from opcast.predict.cost import load_kernel_cost

    kernels = load_kernel_cost(None, use_learned=True)
    arch = load_arch("llama3-8b")

    def decode_s(precision: str, engine: str) -> float:
        cfg = InferConfig(batch=4, prompt_len=256, gen_len=8, precision=precision, engine=engine)
        return predict_infer(arch, H100, cfg, kernels=kernels, details=False).breakdown_s["decode_step"]["compute"]

    # the engine changes other kernels too (one fused SwiGLU, one rope), in bf16 and fp8 alike
    bf16 = decode_s("bf16", "none") - decode_s("bf16", "vllm")
    fp8 = decode_s("fp8", "none") - decode_s("fp8", "vllm")
    linears = arch.n_layers * 4  # qkv, proj, mlp_up, mlp_down: lm_head is not an fp8 linear
    assert 0.5 * linears * 7e-6 < fp8 - bf16 < linears * 7.1e-6


def test_an_fp8_kv_cache_holds_half_the_bytes_and_its_decode_attention_reads_what_the_kernel_gains():
    from opcast.predict.inference import infer_precision

    arch = load_arch("llama3-8b")
    bf16 = InferConfig(batch=8, prompt_len=1000, gen_len=24, precision="fp8", engine="vllm")
    fp8 = _with(bf16, kv_dtype="fp8")
    mem_bf16 = inference.infer_memory(arch, bf16).kv_cache_bytes
    assert inference.infer_memory(arch, fp8).kv_cache_bytes == pytest.approx(mem_bf16 / 2)
    prec = infer_precision(fp8, arch, H100)
    decode = prec.of(
        "attention",
        {
            "batch": 8,
            "heads": 32,
            "kv_heads": 8,
            "seq_q": 1,
            "seq_kv": 1001,
            "head_dim": 128,
            "causal": True,
            "impl": "flash",
        },
    )
    prefill = prec.of(
        "attention",
        {
            "batch": 1,
            "heads": 32,
            "kv_heads": 8,
            "seq_q": 512,
            "seq_kv": 512,
            "head_dim": 128,
            "causal": True,
            "impl": "flash",
        },
    )
    # bf16 queries over the cache: FlashAttention-3 (vLLM on Hopper) over 0.76 of the keys, measured
    assert (decode.dtype, decode.param_dict["seq_kv"]) == ("bf16", 761)
    assert (prefill.dtype, prefill.param_dict["seq_kv"]) == ("fp8", 512)  # FP8 FMHA over the fp8 cache
    for engine, device, keys in (("trtllm", H100, 501), ("sglang", H100, 761), ("vllm", get_device("B200"), 501)):
        other = infer_precision(_with(fp8, engine=engine), arch, device)  # XQA, Blackwell: half the bytes
        step = {**decode.param_dict, "seq_kv": 1001}
        assert other.of("attention", step).param_dict["seq_kv"] == keys, (engine, device.name)
    assert infer_precision(bf16, arch, H100).kv is None
    slow = predict_infer(arch, H100, bf16, kernels=roofline_only())
    fast = predict_infer(arch, H100, fp8, kernels=roofline_only())
    assert fast.tpot_s < slow.tpot_s and fast.memory.kv_cache_bytes == pytest.approx(slow.memory.kv_cache_bytes / 2)


def test_an_fp8_kv_cache_needs_a_gpu_with_fp8():
    r = infer(device=get_device("A100-SXM4-80GB"), batch=1, prompt_len=16, gen_len=2, kv_dtype="fp8")
    assert not r.feasible and any("kv_dtype=fp8 needs a GPU with fp8" in x for x in r.reasons)


@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_a_quantised_checkpoint_keeps_its_head_and_router_in_the_activations_dtype(precision):
    """ModelOpt's FP8 / NVFP4 checkpoints quantise the blocks' linears only (inference.UNQUANTISED_GEMMS)."""
    b200 = get_device("B200")
    moe = load_arch("qwen3-30b-a3b")
    r = predict_infer(moe, b200, InferConfig(batch=8, prompt_len=256, gen_len=4, precision=precision),
                      kernels=roofline_only())  # fmt: skip
    dtypes = {(op["role"], op["dtype"]) for op in r.ops if op["kind"] == "gemm"}
    assert {("lm_head", "bf16"), ("router", "bf16")} <= dtypes
    assert ("qkv", precision) in dtypes and ("proj", precision) in dtypes
    assert not any(dtype == precision for role, dtype in dtypes if role in inference.UNQUANTISED_GEMMS)


@pytest.mark.parametrize(("engine", "absorbed"), [("vllm", "bf16"), ("sglang", "fp8"), ("none", "fp8")])
def test_vllm_runs_an_mla_decodes_absorbed_projections_in_bf16(engine, absorbed):
    """vLLM keeps bf16 copies of W_UK_T and W_UV (no quantised bmm: inference.VLLM_UNQUANTISED_GEMMS); SGLang runs
    them with bmm_fp8 on an fp8 checkpoint."""
    r = predict_infer(load_arch("deepseek-v3"), get_device("H200"),
                      InferConfig(tp=8, batch=4, prompt_len=64, gen_len=2, precision="fp8", engine=engine),
                      kernels=roofline_only())  # fmt: skip
    dtypes = {(op["phase"], op["role"]): op["dtype"] for op in r.ops if op["kind"] == "gemm"}
    assert dtypes[("decode", "q_absorb")] == dtypes[("decode", "v_absorb")] == absorbed
    assert dtypes[("decode", "q_up")] == dtypes[("prefill", "kv_up")] == "fp8"


@pytest.mark.parametrize(
    ("arch", "precision", "engine", "moe"),
    [
        ("deepseek-v3", "fp8", "vllm", ("fp8_block", "vllm")),
        ("deepseek-v3", "fp8", "sglang", ("fp8_block", "vllm")),  # SGLang's Triton MoE: vLLM's port
        ("deepseek-v3", "fp8", "trtllm", ("fp8_block", "trtllm")),
        ("deepseek-v3", "bf16", "sglang", ("bf16", "trtllm")),
        ("qwen3-30b-a3b", "fp8", "sglang", ("fp8", "trtllm")),  # not a block-scaled checkpoint
    ],
)
def test_a_block_scaled_fp8_checkpoint_runs_its_experts_as_block_scaled_moe(arch, precision, engine, moe):
    """DeepSeek-V3's checkpoint is 128 x 128 block-scaled fp8 (ArchSpec.fp8_block_checkpoint): served in fp8 its
    fused MoE is the fp8_block kernel of the engine's family, SGLang's priced by vLLM's Triton rows."""
    device = get_device("H200")
    a = load_arch(arch)
    cfg = InferConfig(tp=8, batch=4, prompt_len=64, gen_len=2, precision=precision, engine=engine)
    r = predict_infer(a, device, cfg, kernels=roofline_only())
    ((dtype, impl),) = {(op["dtype"], op["params"]["impl"]) for op in r.ops if op["kind"] == "moe"}
    assert (dtype, impl) == moe
    assert inference.block_fp8_moe(a, inference.infer_precision(cfg, a, device)) == (moe[0] == "fp8_block")


def test_quantised_weights_hold_the_embeddings_head_and_norms_at_two_bytes():
    from opcast.dtypes import element_bytes
    from opcast.predict.memory import stage_params

    arch = load_arch("llama3-8b")
    p = stage_params(arch, tp=1, pp=1)
    vocab = arch.vocab * arch.hidden  # 128,256 is a multiple of 128: no padding
    norms = (2 * arch.n_layers + 1) * arch.hidden  # two RMSNorms a block and the final one
    assert p.unquantised == 2 * vocab + norms  # untied: the embedding and the head
    fp8 = infer(arch=arch, batch=1, prompt_len=128, gen_len=2, precision="fp8").memory.weights_bytes
    bf16 = infer(arch=arch, batch=1, prompt_len=128, gen_len=2).memory.weights_bytes
    assert bf16 == 2 * p.dense
    assert fp8 == element_bytes("fp8") * (p.dense - p.unquantised) + 2 * p.unquantised
    nvfp4 = infer(arch=arch, device=get_device("B200"), batch=1, prompt_len=128, gen_len=2, precision="nvfp4")
    assert nvfp4.memory.weights_bytes == element_bytes("nvfp4") * (p.dense - p.unquantised) + 2 * p.unquantised
