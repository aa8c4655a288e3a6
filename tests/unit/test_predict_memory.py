"""Memory per GPU, golden against Korthikanti et al. 2022 (arXiv 2205.05198) by hand and the
ZeRO paper's 16 bytes per parameter (Rajbhandari et al. 2020, arXiv 1910.02054)."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch, padded_vocab
from opcast.predict.memory import (
    activation_dtype,
    fullest_stages,
    in_flight_layers,
    kv_cache_bytes,
    layer_activation_bytes,
    model_state_bytes,
    stage_params,
    train_memory,
)

GPT175 = load_arch("megatron-175b")  # Korthikanti Table 3: a=96, h=12288, L=96, s=2048, v=51200
S, B, H, A, L, V = 2048, 1, 12288, 96, 96, 51200
SBH = S * B * H


def act(**kw):
    base = dict(tp=1, sp=False, batch=B, seq=S, attention="eager", recompute="none", dtype="bf16")
    base.update(kw)
    return layer_activation_bytes(GPT175, **base)


# Korthikanti Sec. 4.1 / Table 2, bytes per layer (16-bit activations). Exact: the derivation in
# opcast.predict.memory reduces to these terms for a GPT block with eager attention.
def test_no_parallelism_is_sbh_34_plus_5as_over_h():
    assert act() == SBH * (34 + 5 * A * S / H)


def test_tensor_parallel_is_sbh_10_plus_24_over_t_plus_5as_over_ht():
    t = 8
    assert act(tp=t) == pytest.approx(SBH * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)


def test_tensor_and_sequence_parallel_is_sbh_over_t_times_34_plus_5as_over_h():
    t = 8
    assert act(tp=t, sp=True) == pytest.approx(SBH / t * (34 + 5 * A * S / H), rel=1e-12)


def test_selective_recompute_with_sp_is_34_sbh_over_t():
    assert act(tp=8, sp=True, recompute="selective") == pytest.approx(34 * SBH / 8, rel=1e-12)


def test_full_recompute_keeps_the_layer_input():
    assert act(recompute="full") == 2 * SBH
    assert act(tp=8, sp=True, recompute="full") == 2 * SBH / 8


def test_flash_attention_drops_the_score_matrix_for_an_fp32_logsumexp():
    t = 8
    assert act(tp=t, sp=True, attention="flash") == pytest.approx(34 * SBH / t + 4 * B * (A // t) * S, rel=1e-12)


def test_in_flight_layers_match_korthikanti_pipeline_factors():
    # 1F1B: the first stage holds p micro-batches of L/p layers = L layers (Sec. 4.2.3).
    assert in_flight_layers(n_layers=96, pp=8, stage=0, micro_batches=64) == 96
    assert in_flight_layers(n_layers=96, pp=8, stage=7, micro_batches=64) == 12
    assert in_flight_layers(n_layers=96, pp=8, stage=0, micro_batches=3) == 36  # fewer micro-batches than stages
    # interleaved: L (1 + (p - 1) / (p v))
    assert in_flight_layers(n_layers=96, pp=8, stage=0, micro_batches=64, virtual_stages=3) == pytest.approx(
        96 * (1 + 7 / 24)
    )


def test_stage_params_add_up_to_the_arch():
    for name in ("megatron-175b", "llama2-7b"):
        arch = load_arch(name)
        extra = (padded_vocab(arch.vocab) - arch.vocab) * arch.hidden * (1 if arch.tied_embeddings else 2)
        assert stage_params(arch, tp=1, pp=1).total == arch.params_total() + extra


def test_175b_model_states_by_hand():
    # tp 8, pp 8: every rank holds 1/64 of the blocks' weights; mixed-precision Adam = 16 bytes/param.
    first = stage_params(GPT175, tp=8, pp=8, stage=0)
    per_layer = 12 * H * H // 8 + (3 * H // 8 + H) + (4 * H // 8 + H) + 2 * 2 * H  # weights, biases, 2 LayerNorms
    blocks = 12 * per_layer
    embed = padded_vocab(V, 8) // 8 * H + S * H
    assert first.total == blocks + embed
    mem = train_memory(
        GPT175,
        stage=0,
        tp=8,
        pp=8,
        dp=16,
        cp=1,
        ep=1,
        sp=True,
        micro_batch=1,
        seq=S,
        micro_batches=96,
        virtual_stages=1,
        zero=0,
        precision="bf16",
        attention="eager",
        recompute="selective",
    )
    assert (mem.weights_bytes, mem.gradients_bytes, mem.optimizer_states_bytes) == (
        2 * first.total,
        2 * first.total,
        12 * first.total,
    )
    # activations: L layers of 34 sbh/t (stage 0 holds p micro-batches) + the embedding dropout masks
    assert mem.activations_bytes == pytest.approx(L * 34 * SBH / 8 + 8 * SBH / 8, rel=1e-12)
    z1 = train_memory(
        GPT175,
        stage=0,
        tp=8,
        pp=8,
        dp=16,
        cp=1,
        ep=1,
        sp=True,
        micro_batch=1,
        seq=S,
        micro_batches=96,
        virtual_stages=1,
        zero=1,
        precision="bf16",
        attention="eager",
        recompute="selective",
    )
    assert z1.optimizer_states_bytes == pytest.approx(12 * first.total / 16)


def test_last_stage_adds_the_output_layer_terms():
    # Korthikanti Sec. 4.3: 4sbh/t (1 + v/h) for the final norm, LM head and fp32 cross-entropy logits.
    kw = dict(
        tp=8,
        pp=8,
        dp=1,
        cp=1,
        ep=1,
        sp=True,
        micro_batch=1,
        seq=S,
        micro_batches=96,
        virtual_stages=1,
        zero=0,
        precision="bf16",
        attention="eager",
        recompute="selective",
    )
    last = train_memory(GPT175, stage=7, **kw)
    vp = padded_vocab(V, 8)
    assert last.activations_bytes == pytest.approx(12 * 34 * SBH / 8 + 4 * SBH / 8 + 4 * S * B * vp / 8, rel=1e-12)


def test_zero_stages_shrink_memory_monotonically():
    arch = load_arch("llama2-7b")
    totals = [
        train_memory(
            arch,
            stage=0,
            tp=1,
            pp=1,
            dp=8,
            cp=1,
            ep=1,
            sp=False,
            micro_batch=1,
            seq=4096,
            micro_batches=4,
            virtual_stages=1,
            zero=z,
            precision="bf16",
            attention="flash",
            recompute="full",
        ).total_bytes
        for z in (0, 1, 2, 3)
    ]
    assert totals == sorted(totals, reverse=True) and totals[0] > 2 * totals[3]


def test_kv_cache_bytes():
    arch = load_arch("llama2-70b")  # 80 layers, 8 kv heads of 128
    assert kv_cache_bytes(arch, tp=8, pp=1, batch=4, tokens=1000, dtype="bf16") == 2 * 4 * 1000 * 1 * 128 * 2 * 80


@pytest.mark.parametrize(
    "arch, kw",
    [
        (
            GPT175,
            dict(
                tp=8,
                pp=8,
                dp=2,
                cp=1,
                ep=1,
                sp=True,
                micro_batch=1,
                seq=2048,
                micro_batches=16,
                virtual_stages=3,
                zero=1,
                precision="bf16",
                attention="flash",
                recompute="selective",
            ),
        ),  # dropout, tied
        (
            load_arch("mixtral-8x7b"),
            dict(
                tp=2,
                pp=4,
                dp=4,
                cp=1,
                ep=4,
                sp=False,
                micro_batch=2,
                seq=4096,
                micro_batches=2,
                virtual_stages=1,
                zero=2,
                precision="fp8",
                attention="eager",
                recompute="full",
            ),
        ),
        (
            load_arch("llama2-7b"),
            dict(
                tp=1,
                pp=4,
                dp=1,
                cp=2,
                ep=1,
                sp=False,
                micro_batch=1,
                seq=8192,
                micro_batches=64,
                virtual_stages=1,
                zero=0,
                precision="fp32",
                attention="flash",
                recompute="none",
            ),
        ),
    ],
    ids=["gpt-interleaved", "moe-fp8-full", "cp-fp32"],
)
def test_the_fullest_stage_is_the_first_or_the_last(arch, kw):
    """The search sizes only fullest_stages(pp); every other stage holds less."""
    pp = kw["pp"]
    totals = [train_memory(arch, stage=s, **kw).total_bytes for s in range(pp)]
    assert max(totals) == max(totals[s] for s in fullest_stages(pp))
    assert all(totals[s] <= totals[0] for s in range(1, pp - 1))


def test_memory_total_is_the_sum_of_its_terms():
    m = train_memory(
        GPT175,
        stage=0,
        tp=8,
        pp=2,
        dp=4,
        cp=1,
        ep=1,
        sp=True,
        micro_batch=1,
        seq=2048,
        micro_batches=8,
        virtual_stages=1,
        zero=1,
        precision="bf16",
        attention="flash",
        recompute="full",
    )
    w, g, o, gather = model_state_bytes(GPT175, stage=0, tp=8, pp=2, dp=4, cp=1, ep=1, zero=1, precision="bf16")
    assert (m.weights_bytes, m.gradients_bytes, m.optimizer_states_bytes, m.zero3_gather_bytes) == (w, g, o, gather)
    assert o == pytest.approx(12 * stage_params(GPT175, tp=8, pp=2, stage=0).total / 4, rel=1e-15)  # ZeRO-1
    assert m.total_bytes == sum(m.breakdown().values())
    assert m.activation_working_set_bytes > 0  # full recomputation rebuilds one layer


def test_fp8_trains_with_bf16_activations_everywhere():
    from opcast.hardware import get_device
    from opcast.predict.graph import precision_of
    from opcast.predict.parallel import TrainConfig, validate_train

    assert activation_dtype("fp8") == "bf16" and activation_dtype("fp16") == "fp16"
    assert precision_of("fp8").act == "bf16" and precision_of("fp8").matrix == "fp8"
    layout, reasons = validate_train(load_arch("llama2-7b"), get_device("H100-SXM"), TrainConfig(precision="fp8"))
    assert layout is not None and layout.act_dtype == "bf16", reasons


def test_megatron_keeps_an_fp32_main_grad_18_bytes_a_parameter():
    """Hand-worked: P parameters in bf16 with Adam keep 2 P of weights, 2 P of gradients and 12 P of
    fp32 master weights and moments (16 P); Megatron's fp32 main_grad makes the gradients 4 P (18 P), and
    with the distributed optimizer over d = 4 ranks (ZeRO-1) 2 P + 4 P + 12 P / 4 = 9 P (Megatron Core's
    '6 + 12/d')."""
    from opcast.predict.memory import model_state_bytes, stage_params

    arch = load_arch("gpt3-125m")
    p = stage_params(arch, tp=1, pp=1, ep=1, stage=0).total
    kw = dict(stage=0, tp=1, pp=1, dp=4, cp=1, ep=1, precision="bf16")
    assert model_state_bytes(arch, zero=0, **kw)[:3] == (2 * p, 2 * p, 12 * p)
    assert model_state_bytes(arch, zero=0, framework="neox", **kw)[:3] == (2 * p, 2 * p, 12 * p)
    w, g, o, _ = model_state_bytes(arch, zero=0, framework="megatron", **kw)
    assert (w, g, o) == (2 * p, 4 * p, 12 * p) and w + g + o == 18 * p
    w, g, o, _ = model_state_bytes(arch, zero=1, framework="megatron", **kw)
    assert w + g + o == pytest.approx(9 * p)
    fp32 = model_state_bytes(arch, zero=0, framework="megatron", **{**kw, "precision": "fp32"})
    assert fp32[:3] == (4 * p, 4 * p, 8 * p)  # fp32 training already keeps fp32 gradients


def test_grad_reduce_in_fp32_sets_the_gradient_bytes_in_memory_and_in_the_reduction():
    """One switch (Megatron-Core grad_reduce_in_fp32): the gradient buffer and the data-parallel reduction
    share its dtype. megatron defaults to fp32 (4 P of gradients, the reduce-scatter 4 bytes an element),
    --no-grad-reduce-in-fp32 gives 2 P and 2 bytes; the distributed optimizer's weight all-gather moves the
    bf16 weights either way."""
    from opcast.hardware import get_device
    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.frameworks import fp32_gradients
    from opcast.predict.memory import model_state_bytes, stage_params
    from opcast.predict.training import data_parallel_sync, gradient_reduce_bytes

    assert fp32_gradients("megatron") and not fp32_gradients(None) and not fp32_gradients("hf")
    assert not fp32_gradients("megatron", False) and fp32_gradients("hf", True)
    assert (gradient_reduce_bytes(2, "megatron"), gradient_reduce_bytes(2, "megatron", False)) == (4, 2)
    assert gradient_reduce_bytes(4, None) == 4  # fp32 training: its own 4 bytes
    arch = load_arch("gpt3-125m")
    p = stage_params(arch, tp=1, pp=1, ep=1, stage=0).total
    kw = dict(stage=0, tp=1, pp=1, dp=4, cp=1, ep=1, precision="bf16", zero=0, framework="megatron")
    assert model_state_bytes(arch, **kw)[1] == 4 * p
    assert model_state_bytes(arch, grad_reduce_in_fp32=False, **kw)[1] == 2 * p
    h100, comms = get_device("H100-SXM"), CollectiveCostModel()
    sync = dict(stage=0, tp=1, pp=1, cp=1, ep=1, dp=8, zero=1, gpus_per_node=8, grad_bytes=2)
    fp32 = data_parallel_sync(arch, h100, comms, reduce_bytes=4, **sync)
    bf16 = data_parallel_sync(arch, h100, comms, **sync)
    assert fp32.reduce.bytes == 2 * bf16.reduce.bytes == 4 * p
    assert fp32.reduce_total_s > bf16.reduce_total_s and fp32.gather_total_s == bf16.gather_total_s > 0


def test_grad_reduce_in_fp32_through_the_console_script():
    import json
    import subprocess
    import sys
    from pathlib import Path

    opcast = str(Path(sys.executable).with_name("opcast"))
    base = [opcast, "predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--gpus-per-node", "8"]
    base += ["--framework", "megatron", "--zero", "1", "--json"]
    docs = []
    for flag in ("--grad-reduce-in-fp32", "--no-grad-reduce-in-fp32"):
        out = subprocess.run([*base, flag], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        docs.append(json.loads(out.stdout))
    assert [d["config"]["grad_reduce_in_fp32"] for d in docs] == [True, False]
    grads = [d["memory_breakdown_bytes"]["gradients"] for d in docs]
    assert grads[0] == pytest.approx(2 * grads[1])
    bad = subprocess.run([*base, "--grad-reduce-in-fp32=maybe"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_mla_caches_the_latent_whole_on_every_tensor_parallel_rank_and_dense_blocks_count_where_they_sit():
    import dataclasses

    from opcast.predict.memory import kv_cache_bytes, stage_params

    v3 = dataclasses.replace(
        load_arch("mixtral-8x7b"),
        n_kv_heads=32,
        head_dim=192,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        v_head_dim=128,
        dense_layers=3,
        dense_ffn_hidden=28672,
    )
    # 576 values a token and layer (latent 512 + rope key 64), not 2 x heads x head_dim, and not split by tp
    for tp in (1, 8):
        assert kv_cache_bytes(v3, tp=tp, pp=2, batch=2, tokens=100, dtype="bf16") == 2 * 100 * 576 * 2 * 16
    # every parameter is held once over the stages, the dense blocks on the stages holding the first layers
    for pp in (1, 2, 32):
        held = [stage_params(v3, tp=1, pp=pp, stage=s) for s in range(pp)]
        assert sum(h.dense + h.expert for h in held) == v3.params_total()
    first, second = stage_params(v3, tp=1, pp=16, stage=0), stage_params(v3, tp=1, pp=16, stage=1)
    one_moe_layer = stage_params(v3, tp=1, pp=32, stage=5).expert  # a stage of one MoE block
    assert first.expert == 0 and second.expert == one_moe_layer  # layers 0-1 dense; layer 2 dense, 3 MoE
    assert first.dense + first.expert < second.dense + second.expert
