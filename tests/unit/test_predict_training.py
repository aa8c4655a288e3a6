"""Training predictions: golden compositions, every infeasibility reason, breakdown bookkeeping."""

from __future__ import annotations

import dataclasses
import math

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.comm import Collective, CollectiveCostModel, place
from opcast.predict.cost import roofline_only
from opcast.predict.parallel import TrainConfig, parse_cluster
from opcast.predict.training import (
    BREAKDOWN_KEYS,
    DataParallelSync,
    StageCompute,
    compose_iteration,
    data_parallel_time,
    iteration_sum_check,
    micro_batch_s,
    predict_train,
    stage_kind,
    stage_kinds,
)

H100 = get_device("H100-SXM")
A100 = get_device("A100-SXM4-80GB")
SMALL = load_arch("gpt3-350m")


def run(arch=SMALL, device=H100, **kw):
    nodes = kw.pop("nodes", None)
    gpn = kw.pop("gpus_per_node", None)
    return predict_train(arch, device, TrainConfig(**kw), nodes=nodes, gpus_per_node=gpn, kernels=roofline_only())


def test_one_gpu_prediction_is_the_sum_of_its_op_predictions():
    r = run(micro_batch=2, global_batch=8, seq=1024)
    assert r.feasible and r.layout.world_size == 1
    assert r.iteration_time_s == pytest.approx(math.fsum(o.count * o.time_s for o in r.ops), rel=1e-12)
    assert not r.comms
    assert set(r.cost_sources["unique_kernels_by_source"]) == {"roofline"}


def test_breakdown_adds_up_to_the_iteration():
    for kw in (
        dict(tp=2, pp=2, dp=2, sp=True, micro_batch=1, global_batch=16, seq=2048, recompute="selective", zero=1),
        dict(
            tp=1,
            pp=4,
            dp=2,
            micro_batch=1,
            global_batch=32,
            seq=1024,
            schedule="interleaved",
            virtual_stages=2,
            overlap_grad_reduce=True,
        ),
        dict(tp=1, pp=1, dp=8, micro_batch=2, global_batch=32, seq=1024, zero=3, recompute="full"),
    ):
        r = run(**kw)
        assert r.feasible, r.reasons
        assert set(r.breakdown_s) == set(BREAKDOWN_KEYS)
        assert iteration_sum_check(r) == pytest.approx(r.iteration_time_s, rel=1e-12)
        assert 0 < r.mfu <= r.hfu < 1


def test_doubling_dp_halves_compute_per_gpu_and_adds_the_all_reduce():
    one = run(dp=1, micro_batch=2, global_batch=16, seq=1024)
    two = run(dp=2, micro_batch=2, global_batch=16, seq=1024)
    for key in ("forward", "backward"):
        assert two.breakdown_s[key] == pytest.approx(one.breakdown_s[key] / 2, rel=1e-12)
    assert one.breakdown_s["dp_comm_exposed"] == 0
    # the gradient all-reduce over two GPUs of one node, in Megatron's 40M-parameter buckets
    params = two.layout and __import__("opcast.predict.memory", fromlist=["x"]).stage_params(SMALL, tp=1, pp=1).total
    comms = CollectiveCostModel()
    group = place(2, 1, H100.gpus_per_node)
    full, rest = divmod(params, 40_000_000)
    expected = (
        full * comms.time_s(Collective("all_reduce", 40_000_000 * 2, group), H100)[0]
        + comms.time_s(Collective("all_reduce", rest * 2, group), H100)[0]
    )
    assert two.breakdown_s["dp_comm_exposed"] == pytest.approx(expected, rel=1e-12)
    assert two.iteration_time_s == pytest.approx(
        one.iteration_time_s - (one.breakdown_s["forward"] + one.breakdown_s["backward"]) / 2 + expected, rel=1e-12
    )


def test_overlapping_the_gradient_reduction_hides_it():
    plain = run(dp=8, micro_batch=1, global_batch=16, seq=2048)
    hidden = run(dp=8, micro_batch=1, global_batch=16, seq=2048, overlap_grad_reduce=True)
    assert hidden.breakdown_s["dp_comm_exposed"] < plain.breakdown_s["dp_comm_exposed"]


def test_pipeline_bubble_is_about_p_minus_1_over_m():
    # Stages are equal but for the embedding (first) and LM head (last): the bubble is (p-1)/m of the
    # steady state within that imbalance.
    arch = load_arch("llama2-7b")
    p, m = 4, 16
    r = run(arch, pp=p, micro_batch=1, global_batch=m, seq=2048)
    steady = sum(
        r.breakdown_s[k] for k in BREAKDOWN_KEYS if k not in ("pipeline_bubble", "optimizer", "dp_comm_exposed")
    )
    per = [st.per_micro_batch_s for st in r.stages]
    assert r.breakdown_s["pipeline_bubble"] / steady == pytest.approx((p - 1) / m, rel=max(per) / min(per) - 1 + 1e-9)
    inter = run(arch, pp=p, micro_batch=1, global_batch=m, seq=2048, schedule="interleaved", virtual_stages=2)
    assert inter.breakdown_s["pipeline_bubble"] == pytest.approx(r.breakdown_s["pipeline_bubble"] / 2, rel=0.05)


def test_every_reason_of_a_bad_configuration_is_listed():
    arch = load_arch("llama2-7b")  # 32 heads, 32 layers
    r = run(arch, tp=3, pp=5, dp=2, micro_batch=3, global_batch=16, seq=1000, sp=True, nodes=2, gpus_per_node=8)
    text = " | ".join(r.reasons)
    assert not r.feasible and r.iteration_time_s is None
    assert "tp=3 does not divide n_heads=32" in text
    assert "pp=5" not in text  # an uneven split is no reason any more (DeepSpeed's type:transformer|mlp)
    assert "world size 16 (2 nodes x 8 GPUs) != tp x pp x dp x cp = 3 x 5 x 2 x 1 = 30" in text
    assert "global_batch=16 is not a multiple of micro_batch x dp = 3 x 2 = 6" in text
    assert "tp=3 to divide the per-rank sequence 1000" in text


def test_more_bad_configurations():
    arch = load_arch("llama2-7b")
    reasons = run(
        arch,
        tp=2,
        cp=3,
        ep=2,
        seq=4096,
        zero=3,
        pp=2,
        global_batch=8,
        precision="fp8",
        schedule="interleaved",
        device=A100,
    ).reasons
    text = " | ".join(reasons)
    assert "no fp8 peak" in text
    reasons = run(arch, tp=2, cp=3, ep=2, seq=4096, zero=3, pp=2, global_batch=8, schedule="interleaved").reasons
    text = " | ".join(reasons)
    for needle in (
        "cp=3 needs seq=4096 divisible by 6",
        "ep=2 needs an MoE arch",
        "zero=3 with pp > 1",
        "--virtual-stages >= 2",
    ):
        assert needle in text
    assert "tp=0 must be a positive integer" in run(tp=0).reasons


def test_a_config_that_does_not_fit_is_infeasible_with_what_overflows():
    r = run(load_arch("megatron-175b"), device=A100, tp=8, micro_batch=1, global_batch=8, seq=2048)
    assert r.iteration_time_s is not None and not r.fits and not r.feasible
    assert "does not fit" in r.reasons[0] and "optimizer_states" in r.reasons[0] and "over by" in r.reasons[0]


def test_default_world_comes_from_the_parallel_degrees():
    r = run(load_arch("llama2-7b"), tp=8, pp=2, dp=4, micro_batch=1, global_batch=64, seq=4096, sp=True, zero=1)
    assert (r.layout.cluster.nodes, r.layout.cluster.gpus_per_node) == (8, 8)
    assert r.layout.tp_group.nodes == 1 and r.layout.dp_group.nodes == 4 and r.layout.pp_group.nodes == 2


def test_context_parallel_halves_the_attention_work_and_activations():
    arch = load_arch("llama2-7b")
    one = run(arch, tp=1, cp=1, micro_batch=1, global_batch=2, seq=8192)
    two = run(arch, tp=1, cp=2, dp=1, micro_batch=1, global_batch=2, seq=8192)
    assert two.breakdown_s["forward"] == pytest.approx(one.breakdown_s["forward"] / 2, rel=0.02)
    assert two.memory[0].activations_bytes < 0.55 * one.memory[0].activations_bytes
    # The K/V ring: send/recv between the two cp ranks, exposed only beyond the attention blocks it
    # hides behind. Inside a node most of it hides; across nodes (over the NIC) most of it shows.
    far = run(arch, tp=1, cp=2, dp=1, micro_batch=1, global_batch=2, seq=8192, nodes=2, gpus_per_node=1)
    for r, nodes in ((two, 1), (far, 2)):
        ring = [c for c in r.comms if c.role == "cp"]
        assert ring and all(c.call.kind == "send_recv" and c.call.group.nodes == nodes for c in ring)
        assert r.breakdown_s["cp_comm"] == pytest.approx(math.fsum(c.exposed_s for c in ring), rel=1e-12)
    near_ring, far_ring = (math.fsum(c.count * c.time_s for c in r.comms if c.role == "cp") for r in (two, far))
    assert 0 < two.breakdown_s["cp_comm"] < 0.5 * near_ring
    assert 0.5 * far_ring < far.breakdown_s["cp_comm"] < far_ring


def test_moe_with_expert_parallelism():
    r = run(
        load_arch("mixtral-8x7b"),
        tp=2,
        dp=4,
        ep=4,
        sp=True,
        micro_batch=1,
        global_batch=8,
        seq=4096,
        zero=1,
        recompute="full",
    )
    assert r.iteration_time_s and r.breakdown_s["ep_comm"] > 0
    assert any(c.call.kind == "all_to_all" for c in r.comms)


def test_scale_invariance_on_the_analytical_path():
    fast = dataclasses.replace(
        H100,
        name="H100-x2",
        aliases=(),
        mem_bw_bytes_per_s=2 * H100.mem_bw_bytes_per_s,
        **{
            f: 2 * getattr(H100, f)
            for f in ("peak_fp32_flops", "peak_tf32_flops", "peak_fp16_flops", "peak_bf16_flops", "peak_fp8_flops")
        },
    )
    # at the burst rates: "H100-x2" is no catalog GPU, so it has no sustained clock to share with H100-SXM
    slow = run(micro_batch=2, global_batch=8, seq=1024, clocks="boost")
    quick = run(device=fast, micro_batch=2, global_batch=8, seq=1024, clocks="boost")
    assert slow.iteration_time_s == pytest.approx(2 * quick.iteration_time_s, rel=1e-12)


def test_selective_and_full_recompute_trade_time_for_memory():
    arch = load_arch("llama2-7b")
    kw = dict(tp=4, sp=True, micro_batch=1, global_batch=8, seq=4096)
    none, sel, full = (run(arch, recompute=m, **kw) for m in ("none", "selective", "full"))
    assert none.breakdown_s["recompute"] == 0 < sel.breakdown_s["recompute"] < full.breakdown_s["recompute"]
    assert none.memory[0].activations_bytes > sel.memory[0].activations_bytes > full.memory[0].activations_bytes
    assert full.hfu > full.mfu


def test_parse_cluster(tmp_path):
    from opcast.errors import OpcastError

    assert parse_cluster("16x8")[0].world_size == 128
    f = tmp_path / "c.json"
    f.write_text('{"name": "pod", "nodes": 4, "gpus_per_node": 8, "gpu": "H100-SXM"}')
    cluster, gpu = parse_cluster(str(f))
    assert (cluster.nodes, gpu) == (4, "H100-SXM")
    f.write_text('{"nodes": 4, "gpu_per_node": 8}')
    with pytest.raises(OpcastError, match=r"unknown key 'gpu_per_node'.*missing key 'gpus_per_node'"):
        parse_cluster(str(f))
    with pytest.raises(OpcastError, match="NODESxGPUS"):
        parse_cluster("lots")


def test_pipeline_sends_cross_nodes_only_at_node_boundaries():
    # tp 4 on 8-GPU nodes: stages 0-1 on node 0, stages 2-3 on node 1; only the 1 <-> 2 boundary uses the NIC.
    r = run(load_arch("llama2-7b"), tp=4, pp=4, micro_batch=1, global_batch=8, seq=2048, sp=True)
    pp = [st.pp_comm_s for st in r.stages]
    assert pp[0] == pytest.approx(pp[3]) and pp[1] == pytest.approx(pp[2])
    assert pp[1] > 2 * pp[0]
    assert r.layout.cluster.nodes == 2


def test_the_gradient_reduction_overlaps_the_last_backward_but_one_bucket():
    """The data-parallel exposure rule, on round numbers (Megatron DDP with --overlap-grad-reduce)."""
    sync = DataParallelSync(zero3=None, reduce_total_s=10.0, last_bucket_s=2.0, gather_total_s=1.0)

    def exposed(backward_s, overlap=True):
        compute = StageCompute(1.0, backward_s, 1.0, 0.0, 0.0, 0.0, 0.0)
        t = data_parallel_time(sync, compute, layers=4, micro_batches=8, recompute="none", overlap_grad_reduce=overlap)
        assert t.total_s == 11.0 and t.zero3_s == 0.0
        return t.exposed_s

    assert exposed(5.0) == 10.0 - (5.0 + 1.0) + 1.0  # what the backward (and recompute) window does not hide
    assert exposed(50.0) == 2.0 + 1.0  # the last bucket always shows; the weight gather follows the step
    assert exposed(5.0, overlap=False) == 11.0


def test_zero3_prefetches_each_layers_gathers_behind_the_previous_layers_compute():
    ag, rs = Collective("all_gather", 1, place(2, 1, 8)), Collective("reduce_scatter", 1, place(2, 1, 8))
    sync = DataParallelSync(zero3=(ag, 0.5, rs, 0.25))
    compute = StageCompute(4.0, 6.0, 2.0, 0.0, 0.0, 0.0, 0.0)  # per micro-batch, over 4 layers
    t = data_parallel_time(sync, compute, layers=4, micro_batches=3, recompute="full", overlap_grad_reduce=True)
    # forward: a 0.5 s gather behind each 1 s layer hides; backward: 2 gathers (backward and
    # recompute) and a reduce-scatter, 1.25 s, behind each 2 s layer hide too
    assert t.zero3_s == 0.0 and t.exposed_s == 0.0
    assert t.total_s == 3 * 4 * (3 * 0.5 + 0.25)
    slow = DataParallelSync(zero3=(ag, 1.5, rs, 1.0))
    t = data_parallel_time(slow, compute, layers=4, micro_batches=3, recompute="full", overlap_grad_reduce=True)
    assert t.zero3_forward_s == 4 * (1.5 - 1.0)
    assert t.zero3_s == t.zero3_forward_s + 4 * (2 * 1.5 + 1.0 - 2.0)


def test_hidden_data_parallel_traffic_takes_its_sms_from_the_compute():
    """Hand-worked: each hidden second costs SMs held / SM count of compute, priced with the traffic."""
    ag, rs = Collective("all_gather", 1, place(2, 1, 8)), Collective("reduce_scatter", 1, place(2, 1, 8))
    compute = StageCompute(4.0, 6.0, 2.0, 0.0, 0.0, 0.0, 0.0)  # per micro-batch, over 4 layers
    sync = DataParallelSync(zero3=(ag, 0.5, rs, 0.25), sm_count=100, gather_sms=20, reduce_sms=10)
    t = data_parallel_time(sync, compute, layers=4, micro_batches=3, recompute="full", overlap_grad_reduce=True)
    # forward: 0.5 s of gather hidden per layer at 20 %; backward: 1.0 s of gathers at 20 % and 0.25 s of
    # reduce-scatter at 10 %, all hidden behind the 2 s layer
    assert t.zero3_forward_s == pytest.approx(4 * 0.5 * 0.2)
    assert t.zero3_s == pytest.approx(4 * (0.5 * 0.2 + 1.0 * 0.2 + 0.25 * 0.1))
    slow = DataParallelSync(zero3=(ag, 1.5, rs, 1.0), sm_count=100, gather_sms=20, reduce_sms=10)
    t = data_parallel_time(slow, compute, layers=4, micro_batches=3, recompute="full", overlap_grad_reduce=True)
    # forward: 1 s of the 1.5 s gather hides (20 %), 0.5 s shows; backward: 2 s of the 4 s hide, split 3:1
    assert t.zero3_forward_s == pytest.approx(4 * (0.5 + 1.0 * 0.2))
    assert t.zero3_s == pytest.approx(t.zero3_forward_s + 4 * (2.0 + 2.0 * 0.75 * 0.2 + 2.0 * 0.25 * 0.1))
    bucketed = DataParallelSync(
        zero3=None, reduce_total_s=10.0, last_bucket_s=2.0, gather_total_s=1.0, sm_count=100, reduce_sms=10
    )
    t = data_parallel_time(bucketed, compute, layers=4, micro_batches=8, recompute="none", overlap_grad_reduce=True)
    # 8 s of the reduction hide behind the 8 s backward window (10 %), 2 s and the 1 s gather show
    assert t.exposed_s == pytest.approx(2.0 + 1.0 + 8.0 * 0.1)


def test_nccl_collectives_hold_the_sms_of_their_channels():
    from opcast.collectives_law import NVLS_CTAS, RING_CTAS
    from opcast.predict.training import comm_sms

    def ctas(kind, name, nodes=1):
        return comm_sms(kind, get_device(name), place(8 * nodes, nodes, 8))

    assert ctas("all_reduce", "H100-SXM") == NVLS_CTAS["hopper"] == 16
    assert ctas("all_reduce", "B200") == 24 and ctas("all_reduce", "B200", nodes=2) == 32
    assert ctas("all_gather", "H100-SXM") == ctas("reduce_scatter", "B200") == RING_CTAS == 24
    assert ctas("all_reduce", "A100-SXM4-80GB") == RING_CTAS  # no NVLink SHARP before Hopper: a ring
    assert ctas("all_gather", "L40S") == 0  # PCIe only: no count established
    assert ctas("all_reduce", "MI300X") == 0  # RCCL


def test_each_stage_is_composed_from_the_shared_terms():
    """run_train's stages are the terms the search memoises: a middle stage repeats stage 1 but for its sends."""
    # gpt3-350m (24 layers) over 6 stages of tp 2 on two 6-GPU nodes: stages 2 | 3 straddle the nodes
    r = run(tp=2, pp=6, micro_batch=1, global_batch=12, seq=2048, nodes=2, gpus_per_node=6)
    assert r.feasible, r.reasons
    assert stage_kinds(6) == (0, 1, 5) and [stage_kind(s, 6) for s in range(6)] == [0, 1, 1, 1, 1, 5]
    one = r.stages[1]
    for st in r.stages[2:5]:
        assert dataclasses.replace(st, stage=1, pp_comm_s=one.pp_comm_s) == one
        assert st.per_micro_batch_s == micro_batch_s(one, st.pp_comm_s, one.zero3_comm_s)
    pp = [st.pp_comm_s for st in r.stages]
    assert pp[2] == pp[3] > pp[1] == pp[4]  # one send of each crosses the node boundary
    pipe, _tail, iteration = compose_iteration(
        [st.per_micro_batch_s for st in r.stages], [st.tail_s for st in r.stages], r.layout.micro_batches, 1
    )
    assert iteration == r.iteration_time_s and pipe.bubble_s == r.breakdown_s["pipeline_bubble"]
