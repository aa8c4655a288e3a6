"""``--moe-dispatcher``: the flex dispatcher (DeepEP / HybridEP) sends a token once per remote node; the expected
count against brute-force enumeration, hand-worked scales, and what it changes in a priced step."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.archs import load_arch
from opcast.collectives_law import EP_DISPATCH, PROTOCOLS
from opcast.hardware import get_device
from opcast.predict.moe_dispatch import dispatch_scale, remote_nodes_per_token
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train

OPCAST = str(Path(sys.executable).with_name("opcast"))


def _enumerated(experts: int, top_k: int, nodes: int) -> float:
    """Mean over every source node and every set of ``top_k`` distinct experts of the remote nodes it touches."""
    per = experts // nodes
    total = count = 0
    for src in range(nodes):
        for chosen in itertools.combinations(range(experts), top_k):
            total += len({e // per for e in chosen} - {src})
            count += 1
    return total / count


@pytest.mark.parametrize(("experts", "top_k", "nodes"), [(4, 2, 2), (8, 2, 4), (12, 3, 3), (16, 4, 4), (16, 6, 2)])
def test_the_expected_remote_nodes_match_enumeration(experts, top_k, nodes):
    assert remote_nodes_per_token(experts, top_k, nodes) == pytest.approx(_enumerated(experts, top_k, nodes))


def _enumerated_grouped(experts: int, top_k: int, nodes: int, groups: int, groups_top_k: int) -> float:
    """The same with the experts drawn from ``groups_top_k`` of ``groups`` groups, each set of groups and then
    each set of ``top_k`` of their experts equally likely."""
    per, size = experts // nodes, experts // groups
    total = count = 0.0
    group_sets = list(itertools.combinations(range(groups), groups_top_k))
    for src in range(nodes):
        for chosen_groups in group_sets:
            pool = [e for g in chosen_groups for e in range(g * size, (g + 1) * size)]
            sets = list(itertools.combinations(pool, top_k))
            for chosen in sets:  # each group set weighs the same: its expert sets share 1 / len(sets)
                total += len({e // per for e in chosen} - {src}) / len(sets)
            count += 1
    return total / count


@pytest.mark.parametrize(
    ("experts", "top_k", "nodes", "groups", "groups_top_k"),
    [(8, 2, 2, 4, 2), (12, 3, 3, 6, 2), (16, 4, 4, 8, 3), (8, 2, 4, 2, 1), (16, 3, 8, 4, 2)],
    ids=["whole-groups", "two-groups-a-node", "deepseek-like", "group-spans-nodes", "group-spans-4"],
)
def test_group_limited_routing_matches_enumeration(experts, top_k, nodes, groups, groups_top_k):
    got = remote_nodes_per_token(experts, top_k, nodes, groups, groups_top_k)
    assert got == pytest.approx(_enumerated_grouped(experts, top_k, nodes, groups, groups_top_k))
    assert got <= remote_nodes_per_token(experts, top_k, nodes) + 1e-12  # the limit only removes nodes


def test_groups_that_neither_hold_nor_span_whole_nodes_take_the_unlimited_count_an_upper_bound():
    # 2 groups of 6 experts over 3 nodes of 4: a group covers a node and a half
    got = remote_nodes_per_token(12, 2, 3, 2, 1)
    assert got == remote_nodes_per_token(12, 2, 3)
    assert got > _enumerated_grouped(12, 2, 3, 2, 1)


def test_hand_worked_scales():
    # 4 experts on 2 nodes, top 2: the other node holds neither expert in 1 of C(4, 2) = 6 sets, so a token
    # crosses once with probability 5/6; alltoall sends k (N - 1) / N = 1 copy across on average
    assert dispatch_scale("flex", experts=4, top_k=2, nodes=2) == pytest.approx(5 / 6)
    assert dispatch_scale("alltoall", experts=4, top_k=2, nodes=2) == 1.0
    assert dispatch_scale("flex", experts=128, top_k=8, nodes=1) == 1.0  # inside one node: the same bytes
    # DeepSeek-V3's 256 experts, top 8, over 4 nodes: 3 (1 - C(192, 8) / C(256, 8)) = 2.71 copies against 6;
    # from 4 of 8 groups (2 a node): a node holds none of the chosen groups with probability C(6, 4) / C(8, 4)
    assert dispatch_scale("flex", experts=256, top_k=8, nodes=4) == pytest.approx(2.7107 / 6, rel=1e-4)
    untouched = sum(
        math.comb(2, j) * math.comb(6, 4 - j) / math.comb(8, 4) * math.comb(128 - 32 * j, 8) / math.comb(128, 8)
        for j in range(3)
    )
    scale = dispatch_scale("flex", experts=256, top_k=8, nodes=4, groups=8, groups_top_k=4)
    assert scale == pytest.approx(3 * (1 - untouched) / 6) and scale == pytest.approx(2.1962 / 6, rel=1e-4)


def _ep_lines(dispatcher: str, dp: int, gpus_per_node: int):
    cfg = TrainConfig(dp=dp, ep=dp, zero=1, micro_batch=1, global_batch=dp, seq=1024, moe_dispatcher=dispatcher)
    res = predict_train(load_arch("qwen3-30b-a3b"), get_device("H100-SXM"), cfg, gpus_per_node=gpus_per_node)
    assert res.feasible, res.reasons
    return res, [c for c in res.comms if c.role == "ep"]


def test_flex_prices_the_deduplicated_message_across_nodes_as_deepeps_kernels():
    one_a2a, one_a2a_lines = _ep_lines("alltoall", 8, 8)
    one_flex, one_flex_lines = _ep_lines("flex", 8, 8)
    # inside one node the same bytes, as DeepEP's one-shot kernels (one latency, not NCCL's one per peer)
    assert [(c.call.bytes, c.call.group) for c in one_flex_lines] == [
        (c.call.bytes, c.call.group) for c in one_a2a_lines
    ]
    assert {c.call.kind for c in one_a2a_lines} == {"all_to_all"} and {c.call.kind for c in one_flex_lines} == {
        EP_DISPATCH
    }
    lat = PROTOCOLS["Simple"]
    for a, f in zip(one_a2a_lines, one_flex_lines):  # 8 ranks: NCCL pays 7 NVLink hops, DeepEP one
        assert a.time_s - f.time_s == pytest.approx(6 * lat.hop_ring_s["nvlink"], rel=1e-9)
    assert one_flex.iteration_time_s < one_a2a.iteration_time_s

    two_a2a, a2a_lines = _ep_lines("alltoall", 16, 8)
    two_flex, flex_lines = _ep_lines("flex", 16, 8)
    scale = dispatch_scale("flex", experts=128, top_k=8, nodes=2)  # about a quarter: 1 copy across, not 4
    assert a2a_lines and len(a2a_lines) == len(flex_lines)
    for a, f in zip(a2a_lines, flex_lines):
        assert a.call.group.nodes == 2
        assert f.call.bytes == round(a.call.bytes * scale)
        assert f.time_s < a.time_s
    assert two_flex.iteration_time_s < two_a2a.iteration_time_s


def test_an_unknown_dispatcher_is_one_line_with_exit_2():
    args = ["predict", "train", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--moe-dispatcher", "deepep"]
    out = subprocess.run([OPCAST, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        len(out.stderr.strip().splitlines()) == 1
        and "moe_dispatcher='deepep' is not one of alltoall, flex" in out.stderr
    )


def _forward_s(dispatcher: str, *, ep: int, seq_q: int) -> float:
    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.cost import roofline_only
    from opcast.predict.inference import forward_time_s
    from opcast.predict.parallel import InferConfig

    cfg = InferConfig(tp=4, ep=ep, precision="fp8", moe_dispatcher=dispatcher)
    return forward_time_s(
        load_arch("deepseek-v3"),
        get_device("H200"),
        cfg,
        batch=4,
        seq_q=seq_q,
        seq_kv=2048,
        gpus_per_node=8,
        kernels=roofline_only(),
        comms=CollectiveCostModel(),
    )


def test_serving_runs_deepeps_normal_kernels_in_prefill_and_its_low_latency_ones_in_decode():
    from opcast.predict.moe_dispatch import EpDispatch, ep_dispatch

    v3 = load_arch("deepseek-v3")
    normal, low_latency = ep_dispatch("flex", v3, 2), ep_dispatch("flex", v3, 2, deduplicate=False)
    assert normal.scale == pytest.approx(
        dispatch_scale("flex", experts=256, top_k=8, nodes=2, groups=8, groups_top_k=4)
    )
    assert low_latency == EpDispatch("flex", 1.0)  # one copy a token per expert
    # EP 16 over two 8-GPU nodes (four tp-4 replicas as attention data-parallel ranks): both phases faster than
    # NCCL's pairwise all-to-all, prefill by the deduplicated bytes too
    prefill = _forward_s("alltoall", ep=16, seq_q=2048) - _forward_s("flex", ep=16, seq_q=2048)
    decode = _forward_s("alltoall", ep=16, seq_q=1) - _forward_s("flex", ep=16, seq_q=1)
    assert prefill > decode > 0


def test_deepeps_kernels_pay_one_latency_not_one_per_peer():
    from opcast.collectives_law import alpha_beta_options

    s, b_intra, b_nic = 8e6, 300e9, 45e9
    simple = PROTOCOLS["Simple"]
    ((t, how),) = alpha_beta_options(EP_DISPATCH, s, 16, 2, 8, "nvlink", b_intra, b_nic)
    # 7 of 16 shares over NVLink, 8 over the NIC, in parallel; the launch and one network hop
    assert how == "one-shot/Simple"
    assert t == pytest.approx(simple.base_ring_s + simple.hop_ring_s["net"] + max(7 / 16 * s / b_intra, s / 2 / b_nic))
    ((t1, _),) = alpha_beta_options(EP_DISPATCH, s, 8, 1, 8, "nvlink", b_intra, b_nic)
    assert t1 == pytest.approx(simple.base_ring_s + simple.hop_ring_s["nvlink"] + 7 / 8 * s / b_intra)


def test_the_one_shot_price_holds_deepeps_published_latencies_across_nodes():
    """benchmarks/deepep_kernels.py: DeepEP V1's low-latency kernels, EP 16-256 (nothing fitted to them)."""
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "deepep_kernels.py"
    spec = importlib.util.spec_from_file_location("deepep_kernels", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for r in bench.rows():
        if r["ep"] > 8:
            assert abs(r["flex_us"] / r["measured_us"] - 1) < 0.15, r
            assert r["nccl_us"] > r["measured_us"] * 1.3, r  # NCCL's pairwise exchange: one hop per peer


def test_vllms_allgather_reducescatter_moves_every_replicas_tokens_to_every_replica():
    from opcast.predict.inference import _ep_all_to_all
    from opcast.predict.moe_dispatch import infer_dispatcher
    from opcast.predict.parallel import InferConfig

    arch = load_arch("qwen3-235b-a22b")  # 94 MoE blocks, hidden 4096, top 8
    cfg = InferConfig(tp=2, ep=8)  # four replicas of tp 2
    comms = _ep_all_to_all(arch, cfg, 100, 2, "allgather")
    # each replica's 100 tokens to the other three and back summed: 4 x 100 x 4096 x 2 bytes gathered, a block
    assert [(c.role, c.kind, c.bytes, c.count, n) for c, n in comms] == [
        ("ep_dp", "all_gather", 4 * 100 * 4096 * 2, 1, 94),
        ("ep_dp", "reduce_scatter", 4 * 100 * 4096 * 2, 1, 94),
    ]
    # the all-to-all: each GPU's half of the tokens, eight copies each, there and back
    ((a2a, n),) = _ep_all_to_all(arch, cfg, 100, 2, "alltoall")
    assert (a2a.kind, a2a.bytes, a2a.count, n) == ("all_to_all", 50 * 8 * 4096 * 2, 2, 94)
    assert _ep_all_to_all(arch, InferConfig(tp=4, ep=4), 100, 2, "allgather") == []  # inside a replica
    assert infer_dispatcher(None, "vllm") == "allgather"  # vLLM's ParallelConfig.all2all_backend default
    assert infer_dispatcher(None, "sglang") == infer_dispatcher(None, "none") == "alltoall"
    assert infer_dispatcher("flex", "vllm") == "flex"


def test_the_engines_dispatcher_is_the_default():
    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.cost import roofline_only
    from opcast.predict.inference import forward_time_s
    from opcast.predict.parallel import InferConfig

    def step(**kw) -> float:
        cfg = InferConfig(tp=4, ep=16, precision="fp8", **kw)
        return forward_time_s(
            load_arch("qwen3-235b-a22b"),
            get_device("H200"),
            cfg,
            batch=8,
            seq_q=512,
            seq_kv=512,
            gpus_per_node=8,
            kernels=roofline_only(),
            comms=CollectiveCostModel(),
        )

    assert (
        step(engine="vllm")
        == step(engine="vllm", moe_dispatcher="allgather")
        != step(engine="vllm", moe_dispatcher="alltoall")
    )
    assert step(engine="sglang") == step(engine="sglang", moe_dispatcher="alltoall")


def test_training_refuses_vllms_dispatcher_in_one_line():
    args = ["predict", "train", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--moe-dispatcher", "allgather"]
    out = subprocess.run([OPCAST, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert (
        "vLLM's allgather_reducescatter, priced in predict infer / serve; training takes alltoall or flex" in out.stderr
    )
