"""The alpha-beta collective model and rank placement."""

from __future__ import annotations

import pytest

from opcast.hardware import get_device
from opcast.predict.comm import LINK_EFFICIENCY, AlphaBetaCollectives, Collective, CollectiveCostModel, Group, place

A100 = get_device("A100-SXM4-80GB")
AB = AlphaBetaCollectives()


def t(kind, nbytes, group):
    return AB.time_s(Collective(kind, nbytes, group), A100)


def test_large_all_reduce_in_a_node_runs_at_the_ring_bus_bandwidth():
    # nccl-tests: busbw = algbw x 2(n-1)/n; for a large message the ring reaches the link bandwidth.
    s = 1 << 30
    seconds, label = t("all_reduce", s, Group(8, 1, 8))
    busbw = s / seconds * 2 * 7 / 8
    assert label.startswith("alpha-beta/ring/Simple")
    assert busbw == pytest.approx(A100.intra_node_bw_bytes_per_s * LINK_EFFICIENCY["nvlink"], rel=0.01)


def test_small_messages_pay_latency_and_pick_the_low_latency_protocol():
    seconds, label = t("all_reduce", 4096, Group(8, 1, 8))
    assert label.endswith("/LL")
    assert 5e-6 < seconds < 20e-6  # NCCL's own model: 3.6 + 14 x 0.47 us plus bytes


def test_reduce_scatter_and_all_gather_move_half_an_all_reduce():
    s = 1 << 28
    g = Group(8, 1, 8)
    ar, rs, ag = t("all_reduce", s, g)[0], t("reduce_scatter", s, g)[0], t("all_gather", s, g)[0]
    assert rs == pytest.approx(ag) and rs == pytest.approx(ar / 2, rel=0.01)


def test_across_nodes_is_slower_and_hierarchical_or_ring_is_chosen():
    s = 1 << 28
    one = t("all_reduce", s, Group(8, 1, 8))[0]
    two, label = t("all_reduce", s, Group(16, 2, 8))
    assert two > one
    assert label.split("/")[1] in ("ring", "hierarchical", "tree")
    # One GPU per node: only the NIC (25 GB/s x 0.9): 2(n-1)/n S / B
    spread, _ = t("all_reduce", s, Group(4, 4, 1))
    assert spread == pytest.approx(2 * 3 / 4 * s / (A100.inter_node_bw_bytes_per_s * 0.9), rel=0.02)


def test_hierarchical_formula():
    # RS intra + AR of the 1/g shard over the NICs + AG intra (Thakur et al. 2005 style phases).
    s, g, n = 1 << 30, 8, 4
    options = dict(
        (lab, sec)
        for sec, lab in AB._options(
            Collective("all_reduce", s, Group(g * n, n, g)), Group(g * n, n, g), "nvlink", 235e9, 22.5e9
        )
    )
    h = options["hierarchical/Simple"]
    bw = 2 * (g - 1) / g * s / 235e9 + 2 * (n - 1) / n * s / g / 22.5e9
    assert h == pytest.approx(bw, rel=0.01)


def test_time_grows_with_bytes_and_trivial_groups_cost_nothing():
    g = Group(8, 1, 8)
    sizes = [1 << k for k in range(10, 32, 3)]
    times = [t("all_reduce", s, g)[0] for s in sizes]
    assert times == sorted(times)
    assert t("all_reduce", 1 << 20, Group(1, 1, 1))[0] == 0.0
    for kind in ("all_to_all", "send_recv", "broadcast"):
        assert t(kind, 1 << 20, g)[0] > 0


def test_place_follows_megatron_rank_order():
    assert place(8, 1, 8) == Group(8, 1, 8)  # TP inside a node
    assert place(16, 8, 8) == Group(16, 16, 1)  # DP across nodes, one rank per node
    assert place(4, 2, 8) == Group(4, 1, 4)  # stride 2 still inside the node
    assert place(8, 2, 8) == Group(8, 2, 4)
    assert place(1, 4, 8) == Group(1, 1, 1)


def test_model_caches_and_reports_its_sources():
    model = CollectiveCostModel()
    c = Collective("all_reduce", 1 << 20, Group(8, 1, 8))
    assert model.time_s(c, A100) == model.time_s(c, A100)
    assert model.describe()["collective_models"] == ["alpha-beta"]
