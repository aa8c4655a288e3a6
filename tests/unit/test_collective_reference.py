"""The reference time of collective rows is NCCL's alpha-beta law on the GPU's own links (features v4).

Hand-worked cases of :func:`opcast.collectives_law.alpha_beta_time_s` (NCCL 2.7 tuning.cc
latencies, LINK_EFFICIENCY nvlink 235/300, pci 0.8), the same numbers through
:func:`opcast.train.features.feature_table` (``t_roof_s``) and through the cost model
(:class:`opcast.predict.comm.AlphaBetaCollectives`: one implementation), and a fit that transfers a
correction learned on NVLink GPUs to an unseen PCIe GPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from opcast.collectives_law import alpha_beta_options, alpha_beta_time_s, link_tier
from opcast.hardware import get_device
from opcast.predict.comm import AlphaBetaCollectives, Collective, Group
from opcast.train.features import COLLECTIVE_FEATURES, FEATURES, FEATURES_VERSION, feature_table

L40S = get_device("L40S")  # PCIe Gen4 x16: 32e9 per direction
RTX = get_device("RTX-PRO-6000")  # PCIe Gen5 x16: 64e9 per direction
H100 = get_device("H100-SXM")  # NVLink 4: 450e9 per direction
GIB = 1 << 30


def _rows(kind: str, size: int, ranks: int, nodes: int = 1) -> dict[str, np.ndarray]:
    return {
        "op": np.array([kind], dtype=object),
        "dtype": np.array(["fp16"], dtype=object),
        "direction": np.array(["fwd"], dtype=object),
        "bytes": np.array([size]),
        "world_size": np.array([ranks]),
        "nodes": np.array([nodes]),
        "gpus_per_node": np.array([ranks // nodes]),
    }


def _law(kind: str, size: int, ranks: int, device, nodes: int = 1) -> tuple[float, str]:
    return alpha_beta_time_s(
        kind,
        size,
        ranks,
        nodes,
        ranks // nodes,
        device.intra_node_bw_bytes_per_s,
        device.inter_node_bw_bytes_per_s,
    )


def test_catalog_links_of_the_pcie_and_nvlink_systems():
    # spec sheets: L40S PCIe Gen4 x16 (64 GB/s bidirectional), RTX PRO 6000 Server PCIe Gen5 x16
    # (128 GB/s bidirectional), A100 NVLink 3 (600 GB/s bidirectional): one direction in the catalog
    assert L40S.intra_node_bw_bytes_per_s == 32e9 and link_tier(L40S.intra_node_bw_bytes_per_s) == "pci"
    assert RTX.intra_node_bw_bytes_per_s == 64e9 and link_tier(RTX.intra_node_bw_bytes_per_s) == "pci"
    assert get_device("A100-SXM4-80GB").intra_node_bw_bytes_per_s == 300e9
    assert link_tier(H100.intra_node_bw_bytes_per_s) == "nvlink"


def test_two_gpu_pcie_all_reduce_large_message_is_ring_simple():
    # ring/Simple: base 8.4 us + 2(n-1) = 2 steps x 5.7 us (PCI hop) + 2(n-1)/n S = S over 0.8 x 32e9
    s = 256 << 20
    seconds, how = _law("all_reduce", s, 2, L40S)
    assert how == "ring/Simple"
    assert seconds == pytest.approx(8.4e-6 + 2 * 5.7e-6 + s / 25.6e9, rel=1e-12)
    # the tree (56 us + 2S / (0.9 x 25.6e9)) and LL (S over a quarter of the bandwidth) lose
    options = dict((lab, sec) for sec, lab in alpha_beta_options("all_reduce", s, 2, 1, 2, "pci", 25.6e9, 50e9 * 0.9))
    assert options["tree/Simple"] == pytest.approx(56e-6 + 2 * s / (0.9 * 25.6e9), rel=1e-12)
    assert min(options.values()) == seconds


def test_two_gpu_pcie_all_reduce_small_message_is_ring_ll():
    # ring/LL: 3.6 us + 2 x 1.0 us + 1024 B over 25.6e9 / 4 = 5.76 us (tree/LL: 6.4 us + 0.34 us)
    seconds, how = _law("all_reduce", 1024, 2, L40S)
    assert how == "ring/LL"
    assert seconds == pytest.approx(5.76e-6, rel=1e-12)


def test_eight_gpu_all_gather_pcie_and_nvlink():
    # ring/Simple over 7 steps: PCIe Gen5 at 0.8 x 64e9; NVLink 4 at 235/300 x 450e9 = 352.5e9
    seconds, how = _law("all_gather", GIB, 8, RTX)
    assert how == "ring/Simple"
    assert seconds == pytest.approx(8.4e-6 + 7 * 5.7e-6 + 7 / 8 * GIB / 51.2e9, rel=1e-12)
    seconds, how = _law("all_gather", GIB, 8, H100)
    assert how == "ring/Simple"
    assert seconds == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 7 / 8 * GIB / 352.5e9, rel=1e-12)


@pytest.mark.parametrize(
    ("kind", "size", "ranks", "nodes", "device"),
    [
        ("all_reduce", 256 << 20, 2, 1, L40S),
        ("all_reduce", 1024, 2, 1, L40S),
        ("all_gather", GIB, 8, 1, RTX),
        ("all_reduce", GIB, 8, 1, H100),
        ("all_reduce", GIB, 16, 2, H100),  # hierarchical across two nodes
        ("reduce_scatter", 1 << 20, 4, 1, RTX),
        ("all_to_all", 1 << 24, 16, 2, H100),
    ],
)
def test_feature_reference_is_the_cost_models_alpha_beta_time(kind, size, ranks, nodes, device):
    law, how = _law(kind, size, ranks, device, nodes)
    model, label = AlphaBetaCollectives().time_s(Collective(kind, size, Group(ranks, nodes, ranks // nodes)), device)
    assert (model, label) == (law, f"alpha-beta/{how}")  # one implementation, the same float
    feats = feature_table(_rows(kind, size, ranks, nodes), device)
    assert feats["t_roof_s"][0] == law
    assert feats["log_t_roof_s"][0] == pytest.approx(np.log(law), rel=1e-12)


def test_bus_bytes_over_the_link_stays_a_feature():
    # the old reference, 2(n-1)/n S over the catalog's link, is log_t_memory_s, a model input
    s = 256 << 20
    feats = feature_table(_rows("all_reduce", s, 4), L40S)
    assert np.exp(feats["log_t_memory_s"][0]) == pytest.approx(1.5 * s / 32e9, rel=1e-9)
    assert feats["t_roof_s"][0] > np.exp(feats["log_t_memory_s"][0])  # efficiency 0.8 plus latencies
    assert FEATURES_VERSION >= 4  # v4 made the alpha-beta time the reference
    assert "log_t_memory_s" in COLLECTIVE_FEATURES
    assert FEATURES["all_reduce"][: len(COLLECTIVE_FEATURES)] == COLLECTIVE_FEATURES


def test_pcie_reference_is_slower_than_nvlink_for_the_same_call():
    # the same 8-rank all-reduce: PCIe Gen5 (51.2e9 achievable) vs NVLink 4 (352.5e9) for the
    # bandwidth term, and PCI hops (1.0 / 5.7 us) vs NVLink hops (0.47 / 3.4 us) for the latency
    for size in (1024, 1 << 20, GIB):
        pcie = feature_table(_rows("all_reduce", size, 8), RTX)["t_roof_s"][0]
        nvlink = feature_table(_rows("all_reduce", size, 8), H100)["t_roof_s"][0]
        assert pcie > nvlink
    big = GIB
    ratio = _law("all_reduce", big, 8, RTX)[0] / _law("all_reduce", big, 8, H100)[0]
    assert ratio == pytest.approx(352.5e9 / 51.2e9, rel=0.02)


def test_missing_parameter_gives_no_reference():
    rows = _rows("all_reduce", 1 << 20, 2)
    rows["nodes"] = np.array([None], dtype=object)
    feats = feature_table(rows, L40S)
    assert np.isnan(feats["t_roof_s"][0])


def test_mixed_rows_keep_the_kernel_roofline():
    # a GEMM row beside collective rows: its t_roof is still max(flops / peak, bytes / bw)
    rows = {
        "op": np.array(["gemm", "all_reduce"], dtype=object),
        "dtype": np.array(["bf16", "fp16"], dtype=object),
        "direction": np.array(["fwd", "fwd"], dtype=object),
        "b": np.array([1.0, np.nan]),
        "m": np.array([4096.0, np.nan]),
        "n": np.array([4096.0, np.nan]),
        "k": np.array([4096.0, np.nan]),
        "bytes": np.array([np.nan, 1 << 20]),
        "world_size": np.array([np.nan, 2.0]),
        "nodes": np.array([np.nan, 1.0]),
        "gpus_per_node": np.array([np.nan, 2.0]),
    }
    feats = feature_table(rows, H100)
    flops = 2 * 4096**3
    assert feats["t_roof_s"][0] == pytest.approx(
        max(flops / H100.peak_bf16_flops, 3 * 4096**2 * 2 / H100.mem_bw_bytes_per_s)
    )
    assert feats["t_roof_s"][1] == _law("all_reduce", 1 << 20, 2, H100)[0]


def test_a_correction_learned_on_nvlink_gpus_transfers_to_an_unseen_pcie_gpu():
    """Fit on three NVLink GPUs where every NCCL call takes 1.25x the alpha-beta time; the unseen
    PCIe GPU's prediction is 1.25x its own (PCIe) alpha-beta time. With the bus-bytes-over-link
    reference of features v3 the model would carry NVLink latencies over to PCIe."""
    pytest.importorskip("xgboost")
    from opcast.train.fit import FitConfig, feature_frame, fit_frame

    names = ("H100-SXM", "B200", "A100-SXM4-80GB")
    devices = {n: get_device(n) for n in (*names, "L40S")}
    sizes = [1 << k for k in range(9, 30)]
    rows = []
    for dev in devices:
        for ranks in (2, 4, 8):
            for size in sizes:
                law = _law("all_reduce", size, ranks, devices[dev])[0]
                rows.append(
                    {
                        "op": "all_reduce",
                        "dtype": "fp16",
                        "direction": "fwd",
                        "tensor_cores": False,
                        "device": dev,
                        "bytes": size,
                        "world_size": ranks,
                        "nodes": 1,
                        "gpus_per_node": ranks,
                        "time_s_median": 1.25 * law,
                        "source_file": f"{dev}.parquet",
                    }
                )
    frame = pd.DataFrame(rows)
    train = frame[frame["device"] != "L40S"].reset_index(drop=True)
    test = frame[frame["device"] == "L40S"].reset_index(drop=True)
    cfg = FitConfig(estimator="xgb", folds=0, ops=("all_reduce",), collectives=True, seed=0, n_jobs=1)
    fitted, _, _ = fit_frame(train, {n: devices[n] for n in names}, cfg)
    est, _ = fitted["all_reduce-fwd-half"]
    pred = est.predict_s(feature_frame(test, devices))
    ape = np.abs(pred / test["time_s_median"].to_numpy() - 1)
    assert ape.max() < 0.03, ape.max()
