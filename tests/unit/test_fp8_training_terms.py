"""fp8 training beyond the per-micro-batch casts (issue 17): Megatron's once-per-iteration weight
quantisation, fp8 sequence-parallel all-gathers, the amax all-reduces and the 1-byte saved inputs of
the fp8 linears, each worked by hand, through ``predict_train``, the search and the console script."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict import search as S
from opcast.predict.comm import Collective, CollectiveCostModel, Group
from opcast.predict.cost import roofline_only
from opcast.predict.graph import (
    BWD,
    FWD,
    Comm,
    Graph,
    Node,
    block_comms,
    fp8_amax_bytes,
    precision_of,
    train_block,
    weight_casts,
)
from opcast.predict.memory import layer_activation_bytes
from opcast.predict.parallel import TrainConfig
from opcast.predict.tp_overlap import TE_DEFAULTS, UbGemm
from opcast.predict.training import data_parallel_sync, phase_cost, predict_train

H100 = get_device("H100-SXM")
GPT = load_arch("gpt3-125m")  # 12 layers, h 768, 12 heads of 64, ffn 3072, no GQA, not gated
TOKENS, H = 1024, 768


def _predict(precision="fp8", framework=None, **kw):
    cfg = TrainConfig(precision=precision, framework=framework, **kw)
    return predict_train(GPT, H100, cfg, nodes=1, gpus_per_node=8, kernels=roofline_only(), comms=CollectiveCostModel())


# --------------------------------------------------------------------------- 1. weight casts once per iteration


def test_megatron_casts_each_fp8_weight_once_per_iteration_four_bytes_an_element():
    casts = weight_casts(GPT, tp=2, ep=1, prec=precision_of("fp8"))
    # tp 2: qkv W[768, 3 x 6 x 64], proj W[384, 768], mlp_up W[768, 1536], mlp_down W[1536, 768]
    assert [(n.role, n.kernel.bytes_moved(), n.count) for n in casts] == [
        ("qkv.fp8_cast_transpose_weight", 4 * 768 * 1152, 1),
        ("proj.fp8_cast_transpose_weight", 4 * 384 * 768, 1),
        ("mlp_up.fp8_cast_transpose_weight", 4 * 768 * 1536, 1),
        ("mlp_down.fp8_cast_transpose_weight", 4 * 1536 * 768, 1),
    ]
    assert weight_casts(GPT, tp=2, ep=1, prec=precision_of("fp8", framework="hf")) == ()  # te.Linear: per micro-batch
    assert weight_casts(GPT, tp=2, ep=1, prec=precision_of("bf16")) == ()
    moe = load_arch("mixtral-8x7b")  # 8 experts over ep 2: 4 local expert weights per grouped linear
    up = next(n for n in weight_casts(moe, tp=2, ep=2, prec=precision_of("fp8")) if n.role.startswith("mlp_up"))
    assert up.kernel.bytes_moved() == 4 * 4 * moe.hidden * 2 * moe.ffn_hidden // 2


@pytest.mark.parametrize("global_batch", [4, 16])
def test_the_weight_casts_are_in_the_stage_tail_once_whatever_the_micro_batches(global_batch):
    r = _predict(tp=2, micro_batch=1, global_batch=global_batch, seq=TOKENS)
    st = r.stages[0]
    lines = [o for o in r.ops if o.phase == "optimizer"]
    assert lines[0].role == "adam"
    casts = [o for o in lines if o.role.endswith(".fp8_cast_transpose_weight")]
    assert [o.count for o in casts] == [12] * 4  # one per layer per iteration, not per micro-batch
    assert not any(o.role.endswith("_weight") for o in r.ops if o.phase != "optimizer")
    assert st.optimizer_s == pytest.approx(math.fsum(o.count * o.time_s for o in lines), rel=1e-12)
    assert r.breakdown_s["optimizer"] == st.optimizer_s  # one stage: its tail is the tail
    assert sum(r.breakdown_s.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)


def test_te_linear_keeps_casting_its_weights_every_micro_batch():
    r = _predict(framework="hf", tp=2, micro_batch=1, global_batch=16, seq=TOKENS)
    m = r.layout.micro_batches
    fwd = [o for o in r.ops if o.role == "qkv.fp8_cast_transpose_weight"]
    assert [(o.phase, o.count) for o in fwd] == [("forward", 12 * m)]


# --------------------------------------------------------------------------- 2. fp8 sequence-parallel gathers


def test_sequence_parallel_gathers_move_fp8_and_the_reduce_scatters_bf16():
    kw = dict(tp=4, batch=1, seq_q=TOKENS, sp=True, cp=1, ep=1, dtype="bf16")
    bf16, fp8 = block_comms(GPT, **kw), block_comms(GPT, **kw, quantised="fp8")
    assert [(c.kind, c.bytes, c.count, c.overlap_with) for c in fp8[FWD]] == [
        ("all_gather", TOKENS * H, 2, None),  # LayerNormLinear's fp8 ln_out, QKV and MLP-up
        ("reduce_scatter", 2 * TOKENS * H, 2, None),
    ]
    assert [(c.kind, c.bytes, c.count, c.overlap_with) for c in fp8[BWD]] == [
        ("reduce_scatter", 2 * TOKENS * H, 2, None),
        ("all_gather", TOKENS * H, 2, None),  # the row-parallel layers' output gradients, cast first
        ("all_gather", TOKENS * H, 1, "qkv.dgrad"),  # the saved fp8 ln_out, re-gathered for the wgrad
        ("all_gather", TOKENS * H, 1, "mlp_up.dgrad"),
    ]
    assert all(c.bytes == 2 * TOKENS * H for ph in (FWD, BWD) for c in bf16[ph])
    # without sequence parallelism the all-reduces stay bf16
    plain = block_comms(GPT, **{**kw, "sp": False}, quantised="fp8")
    assert [(c.kind, c.bytes) for c in plain[FWD]] == [("all_reduce", 2 * TOKENS * H)]


def test_moe_gathers_its_tokens_in_bf16_and_only_the_attention_side_in_fp8():
    moe = load_arch("mixtral-8x7b")
    h = moe.hidden
    c = block_comms(moe, tp=2, batch=1, seq_q=TOKENS, sp=True, cp=1, ep=2, dtype="bf16", quantised="fp8")
    gathers = [(x.bytes, x.count, x.overlap_with) for x in c[FWD] if x.kind == "all_gather"]
    assert gathers == [(TOKENS * h, 1, None), (2 * TOKENS * h, 1, None)]
    gathers = [(x.bytes, x.count, x.overlap_with) for x in c[BWD] if x.kind == "all_gather"]
    assert gathers == [
        (TOKENS * h, 1, None),
        (2 * TOKENS * h, 1, None),
        (TOKENS * h, 1, "qkv.dgrad"),
        (2 * TOKENS * h, 1, "mlp_up.dgrad"),
    ]


def test_the_fp8_graph_and_a_full_recomputation_carry_the_fp8_gathers():
    g = train_block(
        GPT,
        tp=2,
        batch=1,
        seq=TOKENS,
        sp=True,
        cp=1,
        ep=1,
        attention="flash",
        recompute="full",
        prec=precision_of("fp8"),
    )
    assert {c.bytes for ph in g.comms for c in g.comms[ph] if c.kind == "all_gather"} == {TOKENS * H}
    assert g.comms["recompute"] == g.comms[FWD]


class _Clock:
    """Collectives of 2 s each (a stand-in cost model for phase_cost)."""

    def time_s(self, call, device):
        return 2.0, "clock"


def test_tp_comm_overlap_hides_split_gathers_behind_their_own_gemms():
    # An MoE block's two forward all-gathers come as two Comms: the second must hide behind MLP-up
    # (1 s here), not again behind QKV (3 s).
    prec = precision_of("bf16")
    qkv = Node("qkv", prec.of("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}))
    up = Node("mlp_up", prec.of("gemm", {"b": 1, "m": 64, "n": 128, "k": 64}))
    times = {qkv.kernel: (3.0, "t"), up.kernel: (1.0, "t")}
    comms = (Comm("tp", "all_gather", 10, 1), Comm("tp", "all_gather", 20, 1))
    graph = Graph(nodes={FWD: (qkv, up)}, comms={FWD: comms})
    free = {name: UbGemm(method="bulk", num_sm=0, set_sm_margin=True) for name in TE_DEFAULTS}  # no SM cost
    cost = phase_cost(
        graph, FWD, {"tp": Group(2, 1, 2)}, times, _Clock(), H100, tp_comm_overlap=True, overlap_cfgs=free
    )
    assert cost.comm_s[0] == pytest.approx(0.0 + (2.0 - 1.0))


def test_the_prediction_prices_the_fp8_gathers():
    r = _predict(tp=2, sp=True, micro_batch=1, global_batch=8, seq=TOKENS)
    ag = {c.call.bytes for c in r.comms if c.role == "tp" and c.call.kind == "all_gather"}
    rs = {c.call.bytes for c in r.comms if c.role == "tp" and c.call.kind == "reduce_scatter"}
    assert (ag, rs) == ({TOKENS * H}, {2 * TOKENS * H})
    bf16 = _predict(precision="bf16", tp=2, sp=True, micro_batch=1, global_batch=8, seq=TOKENS)
    assert {c.call.bytes for c in bf16.comms if c.role == "tp"} == {2 * TOKENS * H}
    assert r.breakdown_s["tp_comm"] < bf16.breakdown_s["tp_comm"]


# --------------------------------------------------------------------------- 3. the amax all-reduces


def test_amax_bytes_count_three_forward_and_two_backward_floats_per_fp8_gemm():
    assert fp8_amax_bytes(GPT, ep=1, layers=12) == {FWD: 4 * 3 * 4 * 12, BWD: 4 * 2 * 4 * 12}
    moe = load_arch("mixtral-8x7b")  # qkv, proj and 8 / 2 = 4 local experts each for up and down: 10 GEMMs
    assert fp8_amax_bytes(moe, ep=2, layers=2) == {FWD: 4 * 3 * 10 * 2, BWD: 4 * 2 * 10 * 2}


def test_the_amax_group_is_tensor_x_data_x_context_parallel():
    kw = dict(stage=0, pp=2, ep=1, zero=1, grad_bytes=2)
    comms = CollectiveCostModel()
    sync = data_parallel_sync(GPT, H100, comms, tp=2, cp=2, dp=4, gpus_per_node=8, fp8=True, **kw)
    fwd, fwd_s, bwd, bwd_s = sync.amax
    assert fwd == Collective("all_reduce", 4 * 3 * 4 * 6, Group(16, 2, 8))  # 6 layers on the stage
    assert bwd == Collective("all_reduce", 4 * 2 * 4 * 6, Group(16, 2, 8))
    assert fwd_s == comms.time_s(fwd, H100)[0] and bwd_s == comms.time_s(bwd, H100)[0]
    assert data_parallel_sync(GPT, H100, comms, tp=2, cp=2, dp=4, gpus_per_node=8, **kw).amax is None  # bf16
    assert data_parallel_sync(GPT, H100, comms, tp=1, cp=1, dp=1, gpus_per_node=8, fp8=True, **kw).amax is None


@pytest.mark.parametrize("pp, v", [(1, 1), (2, 1), (2, 3)])
def test_one_exposed_amax_all_reduce_per_direction_micro_batch_and_model_chunk(pp, v):
    sched = {"schedule": "interleaved", "virtual_stages": v} if v > 1 else {}
    r = _predict(tp=2, pp=pp, micro_batch=1, global_batch=16, seq=TOKENS, **sched)
    m = r.layout.micro_batches
    for st in r.stages:
        if st.stage not in {o.stage for o in r.ops}:
            continue
        lines = [c for c in r.comms if c.role == "fp8_amax" and c.stage == st.stage]
        assert [(c.phase, c.call.kind, c.count) for c in lines] == [
            (FWD, "all_reduce", v * m),
            (BWD, "all_reduce", v * m),
        ]
        assert lines[0].call.bytes == 4 * 3 * 4 * 12 // pp and lines[0].call.group.size == 8 // pp
        exposed = sum(c.exposed_s for c in lines)
        assert exposed == pytest.approx(v * m * sum(c.time_s for c in lines), rel=1e-12)
        assert st.zero3_comm_s * m == pytest.approx(exposed, rel=1e-12)  # no ZeRO-3: all of it is the amax
    assert sum(r.breakdown_s.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)
    bf16 = _predict(precision="bf16", tp=2, pp=pp, micro_batch=1, global_batch=16, seq=TOKENS, **sched)
    assert not any(c.role == "fp8_amax" for c in bf16.comms)


# --------------------------------------------------------------------------- 4. saved inputs in fp8


@pytest.mark.parametrize(
    "attention, recompute, sp, proj_extra",
    [
        ("flash", "none", False, 2),
        ("flash", "none", True, 2),
        ("eager", "none", False, 0),
        ("flash", "selective", True, 0),
    ],
)
def test_the_fp8_linears_save_one_byte_inputs(attention, recompute, sp, proj_extra):
    tp, s = 2, TOKENS
    kw = dict(tp=tp, sp=sp, batch=1, seq=s, attention=attention, recompute=recompute, dtype="bf16")
    bf16, fp8 = layer_activation_bytes(GPT, **kw), layer_activation_bytes(GPT, **kw, fp8=True)
    rows = s // tp if sp else s
    # QKV and MLP-up inputs (rows x h), out-proj input (s x h/tp), MLP-down input (s x ffn/tp): 2 -> 1 byte,
    # and the bf16 attention output FlashAttention keeps stays beside the out-proj's fp8 copy.
    saved = 2 * rows * H + s * H // tp + s * 3072 // tp
    assert bf16 - fp8 == saved - proj_extra * s * H // tp
    assert layer_activation_bytes(GPT, **{**kw, "recompute": "full"}, fp8=True) == layer_activation_bytes(
        GPT, **{**kw, "recompute": "full"}
    )  # the layer input only


def test_moe_expert_inputs_are_fp8_and_the_router_input_bf16():
    moe = load_arch("mixtral-8x7b")
    kw = dict(tp=2, sp=False, batch=1, seq=TOKENS, ep=2, attention="flash", recompute="none", dtype="bf16")
    diff = layer_activation_bytes(moe, **kw) - layer_activation_bytes(moe, **kw, fp8=True)
    h, f = moe.hidden, moe.ffn_hidden // 2
    rows = 4 * -(-TOKENS * 2 * 2 // 8)  # 4 local experts, top-2 routing balanced over ep 2
    heads_d = moe.n_heads // 2 * moe.head_dim
    # QKV input 2 -> 1 byte, expert inputs and MLP-down inputs 2 -> 1, out-proj input 2 -> 1 + 2 (FlashAttention's)
    assert diff == TOKENS * h + rows * (h + f) - TOKENS * heads_d


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_the_prediction_and_the_search_size_fp8_memory_alike(recipe):
    r = _predict(tp=2, sp=True, micro_batch=2, global_batch=16, seq=TOKENS)
    bf16 = _predict(precision="bf16", tp=2, sp=True, micro_batch=2, global_batch=16, seq=TOKENS)
    assert r.memory[0].activations_bytes < bf16.memory[0].activations_bytes
    space = S.SearchSpace(
        gpus=8, gpus_per_node=8, global_batch=16, seq=TOKENS, precision="fp8", fp8_recipe=recipe, max_tp=2
    )
    result = S.search(GPT, H100, space, top=1, workers=1)
    assert result.candidates and any(c.sp for c in result.candidates) and any(c.pp > 1 for c in result.candidates)
    for c in result.candidates[:: max(1, len(result.candidates) // 25)]:
        cfg = c.train_config(space)
        got = predict_train(
            GPT, H100, cfg, nodes=1, gpus_per_node=8, kernels=roofline_only(), comms=CollectiveCostModel()
        )
        assert cfg.fp8_recipe == recipe
        assert c.iteration_time_s == pytest.approx(got.iteration_time_s, rel=1e-9), c
        assert c.memory_bytes == pytest.approx(got.worst_memory.total_bytes, rel=1e-12), c


def test_the_search_prices_current_scaling_as_predict_train_does():
    """--fp8-recipe reaches the search's pricing (each configuration checked against predict train above):
    every configuration's time moves (current scaling's amax passes and scale kernels against delayed
    scaling's amax all-reduce); bf16 refuses the recipe with the same message as predict train."""
    base = dict(gpus=8, gpus_per_node=8, global_batch=16, seq=TOKENS, precision="fp8", max_tp=2)
    delayed = S.search(GPT, H100, S.SearchSpace(**base), top=1, workers=1)
    current = S.search(GPT, H100, S.SearchSpace(**base, fp8_recipe="current"), top=1, workers=1)
    times = {c.train_config(delayed.space).__repr__(): c.iteration_time_s for c in delayed.candidates}
    pairs = [
        (c, times[replace(c.train_config(current.space), fp8_recipe="delayed").__repr__()]) for c in current.candidates
    ]
    assert pairs and all(c.iteration_time_s != t for c, t in pairs)
    problems = S.space_problems(H100, S.SearchSpace(**{**base, "precision": "bf16"}, fp8_recipe="current"))
    assert "fp8_recipe='current' applies to precision fp8 (per-tensor scaling) only, not bf16" in problems


# --------------------------------------------------------------------------- the console script


def test_the_console_script_shows_the_new_fp8_lines():
    cmd = [sys.executable, "-m", "opcast", "predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM"]
    cmd += ["--nodes", "1", "--gpus-per-node", "8", "--tp", "2", "--sp", "--precision", "fp8"]
    cmd += ["--micro-batch", "1", "--global-batch", "16", "--seq", str(TOKENS), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    m = 16 // 4  # global batch over dp = 8 / tp
    casts = [o for o in doc["ops"] if o["phase"] == "optimizer" and o["role"] != "adam"]
    assert [(o["role"], o["count"]) for o in casts] == [
        (f"{r}.fp8_cast_transpose_weight", 12) for r in ("qkv", "proj", "mlp_up", "mlp_down")
    ]
    amax = [(c["phase"], c["kind"], c["bytes"], c["group"]["size"], c["count"]) for c in doc["collectives"]]
    assert ("forward", "all_reduce", 4 * 3 * 4 * 12, 8, m) in amax and ("backward", "all_reduce", 384, 8, m) in amax
    tp = {(c["kind"], c["bytes"]) for c in doc["collectives"] if c["role"] == "tp"}
    assert tp == {("all_gather", TOKENS * H), ("reduce_scatter", 2 * TOKENS * H)}
