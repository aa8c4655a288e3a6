"""Communication overlap as the frameworks do it, on hand-worked round numbers: TP collectives behind
their GEMMs (--tp-comm-overlap), the distributed optimizer's weight gather behind the next forward
(--overlap-param-gather), pipeline sends behind a model chunk (--overlap-p2p-comm)."""

from __future__ import annotations

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.comm import Collective, CollectiveCostModel, Group
from opcast.predict.cost import kernel, roofline_only
from opcast.predict.graph import BWD, FWD, RECOMPUTE, Comm, Graph, Node
from opcast.predict.parallel import TrainConfig, overlap_reasons
from opcast.predict.tp_overlap import TE_DEFAULTS, UbGemm
from opcast.predict.training import (
    DataParallelSync,
    StageCompute,
    data_parallel_time,
    iteration_sum_check,
    phase_cost,
    pipeline_send_s,
    predict_train,
)

from helpers.fakes import FixedCollectives

H100 = get_device("H100-SXM")


def _gemm(m: int):
    return kernel("gemm", {"b": 1, "m": m, "n": 64, "k": 64}, "bf16", "fwd", True)


def _block(comms_fwd, comms_bwd=()):
    """A block whose forward GEMMs qkv / mlp_up / proj / mlp_down take 1, 2, 3, 4 s and whose
    backward dgrad / wgrad GEMMs take 5 s each (the kernel table below)."""
    fwd = tuple(Node(r, _gemm(i + 1)) for i, r in enumerate(("qkv", "mlp_up", "proj", "mlp_down")))
    bwd = tuple(Node(r, _gemm(10)) for r in ("proj.dgrad", "mlp_down.dgrad", "qkv.wgrad", "mlp_up.wgrad"))
    return Graph(nodes={FWD: fwd, BWD: bwd, RECOMPUTE: ()}, comms={FWD: comms_fwd, BWD: comms_bwd, RECOMPUTE: ()})


TABLE = {_gemm(1): (1.0, "t"), _gemm(2): (2.0, "t"), _gemm(3): (3.0, "t"), _gemm(4): (4.0, "t"), _gemm(10): (5.0, "t")}
GROUPS = {"tp": Group(4, 1, 4)}


FREE = {name: UbGemm(method="bulk", num_sm=0, set_sm_margin=True) for name in TE_DEFAULTS}
"""Every GEMM's collective beside it on no SMs of its own: exposed = max(0, comm - GEMM), so the tests below
check which GEMM each call runs behind (what TE's overlap costs: tests/unit/test_tp_overlap.py)."""


def _tp_s(graph, phase, seconds, overlap):
    comms = CollectiveCostModel(sources=(FixedCollectives(seconds),))
    return phase_cost(graph, phase, GROUPS, TABLE, comms, H100, tp_comm_overlap=overlap, overlap_cfgs=FREE).comm_s[0]


def test_a_tp_collective_shorter_than_its_gemm_hides_entirely():
    g = _block((Comm("tp", "all_gather", 1, 2), Comm("tp", "reduce_scatter", 1, 2)))
    # all-gathers behind qkv (1 s) and mlp_up (2 s), reduce-scatters behind proj (3 s) and mlp_down (4 s)
    assert _tp_s(g, FWD, {"all_gather": 0.5, "reduce_scatter": 2.5}, overlap=False) == 2 * 0.5 + 2 * 2.5
    assert _tp_s(g, FWD, {"all_gather": 0.5, "reduce_scatter": 2.5}, overlap=True) == 0.0


def test_a_tp_collective_longer_than_its_gemm_shows_the_excess():
    g = _block((Comm("tp", "all_gather", 1, 2), Comm("tp", "reduce_scatter", 1, 2)))
    # all-gather 1.5 s: 0.5 s past qkv (1 s), hidden behind mlp_up (2 s); reduce-scatter 3.5 s:
    # 0.5 s past proj (3 s), hidden behind mlp_down (4 s)
    assert _tp_s(g, FWD, {"all_gather": 1.5, "reduce_scatter": 3.5}, overlap=True) == pytest.approx(0.5 + 0.5)


def test_backward_tp_collectives_hide_behind_dgrad_and_wgrad_and_others_stay_exposed():
    bwd = (
        Comm("tp", "reduce_scatter", 1, 2),
        Comm("tp", "all_gather", 1, 2),
        Comm("tp", "all_reduce", 1, 1),  # not part of TE's overlap: always exposed
        Comm("tp", "all_gather", 1, 1, overlap_with="qkv.dgrad"),  # already its own rule (no qkv.dgrad here: exposed)
    )
    g = _block((), bwd)
    seconds = {"all_gather": 6.0, "reduce_scatter": 4.0, "all_reduce": 0.25}
    # RS 4 s behind each 5 s wgrad: hidden; AG 6 s behind each 5 s dgrad: 1 s each; the all-reduce 0.25 s;
    # the wgrad all-gather 6 s behind a qkv.dgrad the block lacks
    assert _tp_s(g, BWD, seconds, overlap=True) == pytest.approx(2 * 1.0 + 0.25 + 6.0)
    assert _tp_s(g, BWD, seconds, overlap=False) == pytest.approx(2 * 4.0 + 2 * 6.0 + 0.25 + 6.0)


def test_the_param_gather_hides_behind_the_next_forward_but_one_bucket():
    sync = DataParallelSync(zero3=None, reduce_total_s=10.0, last_bucket_s=2.0, gather_total_s=6.0, gather_bucket_s=1.5)

    def exposed(forward_s, overlap):
        compute = StageCompute(forward_s, 20.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # backward 20 s hides all but a bucket
        t = data_parallel_time(
            sync,
            compute,
            layers=4,
            micro_batches=8,
            recompute="none",
            overlap_grad_reduce=True,
            overlap_param_gather=overlap,
        )
        assert t.total_s == 16.0
        return t.exposed_s

    assert exposed(4.0, overlap=False) == 2.0 + 6.0  # the gather follows the step
    assert exposed(4.0, overlap=True) == 2.0 + (6.0 - 4.0)  # what the first forward does not hide
    assert exposed(40.0, overlap=True) == 2.0 + 1.5  # one bucket always waits


def test_pipeline_sends_hide_behind_one_chunk_each():
    fwd_send = Collective("send_recv", 100, Group(2, 2, 1))
    bwd_send = Collective("send_recv", 200, Group(2, 2, 1))
    sends = ((fwd_send, 2), (bwd_send, 1))

    class _BySize(FixedCollectives):
        def time_s(self, call, device):
            return {100: 1.0, 200: 3.0}[call.bytes], "fixed"

    comms = CollectiveCostModel(sources=(_BySize({}),))
    assert pipeline_send_s(comms, H100, sends) == 2 * 1.0 + 3.0
    # forward chunk 1.5 s hides each 1 s forward send; backward chunk 2 s leaves 1 s of the 3 s send
    assert pipeline_send_s(comms, H100, sends, (1.5, 2.0)) == 1.0
    assert pipeline_send_s(comms, H100, ((fwd_send, 0), (bwd_send, 1)), (0.0, 0.0)) == 3.0


def test_the_overlap_switches_are_refused_where_megatron_refuses_them():
    assert overlap_reasons(TrainConfig()) == []
    assert overlap_reasons(TrainConfig(tp=2, sp=True, tp_comm_overlap=True)) == []
    assert overlap_reasons(TrainConfig(zero=1, overlap_grad_reduce=True, overlap_param_gather=True)) == []
    (r,) = overlap_reasons(TrainConfig(zero=0, overlap_grad_reduce=True, overlap_param_gather=True))
    assert "--zero 1 or 2" in r
    (r,) = overlap_reasons(TrainConfig(zero=1, overlap_param_gather=True))
    assert "--overlap-grad-reduce" in r
    (r,) = overlap_reasons(TrainConfig(tp=2, tp_comm_overlap=True))
    assert "--sp" in r
    (r,) = overlap_reasons(TrainConfig(pp=2, overlap_p2p_comm=True))
    assert "interleaved" in r


def _train(**kw):
    base = {"tp": 8, "pp": 2, "sp": True, "global_batch": 64, "micro_batch": 1, "seq": 4096}
    cfg = TrainConfig(**{**base, **kw})
    return predict_train(load_arch("llama2-7b"), H100, cfg, nodes=4, gpus_per_node=8, kernels=roofline_only())


def test_each_overlap_lowers_only_its_exposed_term_and_the_breakdown_still_adds_up():
    off = _train(zero=1, overlap_grad_reduce=True, schedule="interleaved", virtual_stages=2)
    on = _train(
        zero=1,
        overlap_grad_reduce=True,
        schedule="interleaved",
        virtual_stages=2,
        tp_comm_overlap=True,
        overlap_param_gather=True,
        overlap_p2p_comm=True,
    )
    assert on.feasible and off.feasible
    assert on.breakdown_s["tp_comm"] < off.breakdown_s["tp_comm"]
    assert on.breakdown_s["pp_comm"] < off.breakdown_s["pp_comm"]
    assert on.breakdown_s["dp_comm_exposed"] <= off.breakdown_s["dp_comm_exposed"]
    # TE's userbuffers kernels take SMs from the overlapped GEMMs (tests/unit/test_tp_overlap.py); the
    # optimizer is the slowest tail's, which may move
    assert on.breakdown_s["forward"] > off.breakdown_s["forward"]
    assert on.breakdown_s["backward"] > off.breakdown_s["backward"]
    assert on.breakdown_s["recompute"] == pytest.approx(off.breakdown_s["recompute"])
    assert on.iteration_time_s < off.iteration_time_s
    assert iteration_sum_check(on) == pytest.approx(on.iteration_time_s)
    # the per-collective lines carry the exposure: the critical stage's tp and pp lines sum to the breakdown
    crit = max(on.stages, key=lambda st: st.per_micro_batch_s).stage
    for roles, key in ((("tp", "embed_tp", "head_tp", "ce_tp"), "tp_comm"), (("pp",), "pp_comm")):
        lines = [c for c in on.comms if c.stage == crit and c.role in roles]
        assert sum(c.exposed_s for c in lines) == pytest.approx(on.breakdown_s[key], rel=1e-9)
        assert sum(c.exposed_s for c in lines) < sum(c.count * c.time_s for c in lines)


def test_the_defaults_price_as_before():
    cfg = TrainConfig(tp=8, pp=2, sp=True, global_batch=64, seq=4096)
    assert not (cfg.tp_comm_overlap or cfg.overlap_param_gather or cfg.overlap_p2p_comm)
    r = _train()
    crit = max(r.stages, key=lambda st: st.per_micro_batch_s).stage
    lines = [c for c in r.comms if c.stage == crit and c.role == "pp"]
    assert sum(c.exposed_s for c in lines) == pytest.approx(sum(c.count * c.time_s for c in lines))
