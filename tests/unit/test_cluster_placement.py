"""``--cluster`` resolved once (options.placement) and the cluster name threaded to the learned
collectives, which cover a device only on that cluster's network."""

from __future__ import annotations

import dataclasses

import pytest

from opcast.errors import OpcastError
from opcast.hardware import derive_device, get_device
from opcast.predict.comm import Collective, Group
from opcast.predict.comm_learned import LearnedCollectives, cluster_device, same_network
from opcast.predict.options import Args, Placement, placement
from opcast.train.collectives import CollectiveLaw, CollectiveModels

LAW = CollectiveLaw(
    kind="all_reduce",
    base_s=1e-5,
    step_intra_s=0.0,
    step_net_s=0.0,
    intra_bw_bytes_per_s=((4, 100e9),),
    net_bw_bytes_per_s=1e9,
    net_ranks_exponent=1.0,
    rows=10,
    bytes_min=1,
    bytes_max=2**30,
    topologies=((1, 4), (2, 4)),
)
MODELS = CollectiveModels(laws={"perlmutter": {"all_reduce": LAW}})
CALL = Collective("all_reduce", 2**26, Group(8, 2, 4))


def _args(**kw):
    return Args(**{"gpu": None, "nodes": None, "gpus_per_node": None, "cluster": None, **kw})


def test_placement_names_the_catalog_cluster_and_its_network():
    where = placement(_args(cluster="perlmutter:2"))
    assert where.cluster == "perlmutter" and where.nodes == 2 and where.gpus_per_node is None
    assert where.gpu == cluster_device("perlmutter") or get_device(where.gpu).name == cluster_device("perlmutter")
    assert {s.split("=")[0] for s in where.network} == {
        "intra_node_bw_bytes_per_s",
        "inter_node_bw_bytes_per_s",
        "gpus_per_node",
    }
    # the other forms carry no cluster name
    assert placement(_args(cluster="2x8", gpu="H100-SXM")) == Placement("H100-SXM", 2, 8)
    assert placement(_args(gpu="H100-SXM", nodes=3)) == Placement("H100-SXM", 3, None)
    with pytest.raises(OpcastError, match="leave --gpu out"):
        placement(_args(cluster="vista", gpu="H100-SXM"))
    # compare: the GPUs come from --gpus, so a catalog cluster is only its network
    assert placement(_args(cluster="vista", gpus="A,B"), gpu_given=False).cluster == "vista"


def test_compare_refuses_a_nodes_file_naming_a_gpu(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"nodes": 2, "gpus_per_node": 4, "gpu": "H100-SXM"}')
    with pytest.raises(OpcastError, match="compare takes its GPUs from --gpus"):
        placement(_args(cluster=str(f)), gpu_given=False)
    assert placement(_args(cluster=str(f))).gpu == "H100-SXM"


def test_a_named_cluster_covers_its_network_with_any_gpu_and_nothing_else():
    perlmutter = get_device(cluster_device("perlmutter"))
    named = LearnedCollectives(MODELS, "m", cluster="perlmutter")
    t, label = named.time_s(CALL, perlmutter)
    assert label == "learned/perlmutter/ring/inter-node"
    assert t == pytest.approx(LAW.time_s(2**26, 8, 2, 4))
    # another GPU on Perlmutter's links (compare --cluster perlmutter --gpus ...,H100-SXM)
    network = placement(_args(cluster="perlmutter")).network
    h100_there = derive_device(get_device("H100-SXM"), list(network))
    assert same_network(h100_there, "perlmutter") and named.covers(CALL, h100_there)
    # explore varying the network leaves the measured cluster: alpha-beta
    faster = derive_device(perlmutter, ["inter_node_bw_bytes_per_s=x2"])
    assert not same_network(faster, "perlmutter") and not named.covers(CALL, faster)
    # without a name, the device is recognised; a plain GPU is not Perlmutter
    unnamed = LearnedCollectives(MODELS, "m")
    assert unnamed.covers(CALL, perlmutter) and not unnamed.covers(CALL, get_device("A100-SXM4-80GB"))
    # a cluster the set has no law for
    assert not LearnedCollectives(MODELS, "m", cluster="vista").covers(CALL, perlmutter)


def test_search_workers_keep_the_learned_sources():
    import pickle

    from opcast.archs import load_arch
    from opcast.predict.comm import AlphaBetaCollectives, CollectiveCostModel
    from opcast.predict.search import SearchSpace, _Terms

    comms = CollectiveCostModel(sources=(LearnedCollectives(MODELS, "m", cluster="perlmutter"), AlphaBetaCollectives()))
    space = SearchSpace(gpus=8, global_batch=8, seq=512)
    terms = _Terms(load_arch("gpt3-350m"), get_device(cluster_device("perlmutter")), space, [(2, 4)], comms)
    copy = pickle.loads(pickle.dumps(terms))
    assert [s.name for s in copy.comms.sources] == ["learned", "alpha-beta"]
    assert dataclasses.is_dataclass(copy.comms) and copy.comms._cache == {}


def test_search_prices_with_the_collectives_it_is_given():
    from opcast.archs import load_arch
    from opcast.predict.comm import AlphaBetaCollectives, CollectiveCostModel
    from opcast.predict.search import SearchSpace, search

    comms = CollectiveCostModel(sources=(LearnedCollectives(MODELS, "m", cluster="perlmutter"), AlphaBetaCollectives()))
    space = SearchSpace(gpus=8, global_batch=16, seq=512, fixed={"tp": (4,), "pp": (1,), "cp": (1,), "ep": (1,)})
    result = search(load_arch("gpt3-350m"), get_device(cluster_device("perlmutter")), space, comms=comms, top=1)
    assert result.cost_sources["learned_collectives"]["clusters"] == {"perlmutter": ["all_reduce"]}
    assert any(k.startswith("learned/perlmutter/") for k in result.top[0].cost_sources["collectives_by_source"])
