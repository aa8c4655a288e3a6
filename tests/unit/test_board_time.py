"""A board of a training GPU's compute die (issues 17 and 19): which training board answers for it
(:func:`opcast.hardware.die_twin`) and when its answer stands for the board's own
(:func:`opcast.train.features.board_time_s`), on hand-worked cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from opcast.hardware import die_twin, get_device
from opcast.train.features import board_time_s


def test_the_die_twin_is_the_board_of_the_same_power_then_the_nearest_bandwidth():
    sxm80, pcie40 = get_device("A100-SXM4-80GB"), get_device("A100-PCIe-40GB")
    sxm40 = get_device("A100-SXM4-40GB")
    specs = {d.name: d for d in (sxm80, pcie40, get_device("H100-SXM"))}
    # A100-SXM4-40GB has PCIe-40GB's bandwidth but SXM4-80GB's 400 W: the clock a compute-bound kernel holds
    assert sxm40.mem_bw_bytes_per_s == pcie40.mem_bw_bytes_per_s and sxm40.tdp_w == sxm80.tdp_w
    assert die_twin(sxm40, specs, specs) == sxm80
    # of the same power, the nearest bandwidth
    slow = replace(sxm80, name="A100-slow", mem_bw_bytes_per_s=1.6e12)  # nearer 1.555 TB/s than 2.039
    both = {**specs, slow.name: slow}
    assert die_twin(sxm40, both, both) == slow
    # a training device, a copy of one on another network, another die, a die no training device has: none
    assert die_twin(sxm80, specs, specs) is None
    assert die_twin(replace(sxm80, name="A100-SXM4-80GB[gpus_per_node=4]", gpus_per_node=4), specs, specs) is None
    assert die_twin(get_device("H200"), {"A100-SXM4-80GB": sxm80}, specs) is None
    assert die_twin(sxm40, ["A100-SXM4-80GB"], {}) is None  # no recorded spec: not placed


def test_a_compute_bound_kernel_takes_the_dies_answer_and_any_other_the_boards_own():
    own, die = np.array([2.0, 2.0, 2.0, 2.0, 2.0]), np.array([1.0, 1.0, 1.0, np.nan, 1.0])
    # compute-bound, memory-bound, at the ridge, the die has no answer, no roofline (NaN)
    tc = np.array([1e-3, 1e-6, 1e-5, 1e-3, np.nan])
    tm = np.array([1e-6, 1e-3, 1e-5, 1e-6, 1e-6])
    feats = pd.DataFrame({"log_t_compute_s": np.log(tc), "log_t_memory_s": np.log(tm)})
    assert board_time_s(own, die, feats).tolist() == [1.0, 2.0, 2.0, 2.0, 2.0]


def test_the_default_set_prices_a_boards_compute_bound_gemms_as_its_dies():
    """A100-SXM4-40GB is a board of A100-SXM4-80GB's die (a training GPU of models/default): its compute-bound
    GEMMs take the 80 GB board's time through the bounds too (rule same_die; before it, the cross-device bounds
    priced them ~10 % faster than on the board the die was measured on), and a memory-bound GEMV with 0.76x the
    bandwidth is no faster."""
    from opcast.predict.cost import kernel, load_kernel_cost, peak_roofline_s

    cost = load_kernel_cost(None)
    sxm40, sxm80 = get_device("A100-SXM4-40GB"), get_device("A100-SXM4-80GB")
    gemms = [kernel("gemm", {"b": 1, "m": 4096, "n": n, "k": 4096}, "bf16") for n in (4096, 6144, 11008)]
    for k in gemms:
        assert peak_roofline_s(k, sxm40)[1] == "compute"
        assert cost.time_s(k, sxm40)[0] == cost.time_s(k, sxm80)[0]
    gemv = kernel("gemm", {"b": 1, "m": 1, "n": 8192, "k": 8192}, "bf16")
    assert peak_roofline_s(gemv, sxm40)[1] == "memory"
    assert cost.time_s(gemv, sxm40)[0] >= cost.time_s(gemv, sxm80)[0]


def test_a_board_of_the_dies_bandwidth_prices_every_kernel_as_its_die():
    """H800 is H100-SXM with its NVLink capped: the same chip and HBM. Its memory-bound kernels used to be held by
    the unseen-device bounds, up to 1.25x slower than H100-SXM's (a llama2-7b decode step on one GPU 1.13x); now
    every kernel, compute- or memory-bound, takes H100-SXM's time (rule same_die)."""
    from opcast.predict.cost import kernel, load_kernel_cost, peak_roofline_s

    cost = load_kernel_cost(None)
    h800, h100 = get_device("H800"), get_device("H100-SXM")
    kernels = [
        kernel("gemm", {"b": 1, "m": 4096, "n": 12288, "k": 4096}, "bf16"),
        kernel("gemm", {"b": 1, "m": 8, "n": 12288, "k": 4096}, "bf16"),
        kernel(
            "attention",
            {
                "batch": 8,
                "heads": 32,
                "kv_heads": 32,
                "seq_q": 1,
                "seq_kv": 1024,
                "head_dim": 128,
                "causal": True,
                "impl": "flash",
            },
            "bf16",
        ),
        kernel("elementwise", {"numel": 1 << 24, "fn": "add"}, "bf16"),
    ]
    assert {peak_roofline_s(k, h800)[1] for k in kernels} == {"compute", "memory"}
    for k in kernels:
        assert cost.time_s(k, h800)[0] == cost.time_s(k, h100)[0], k


def test_a_board_of_the_dies_bandwidth_takes_its_dies_interval():
    """Priced as H100-SXM, H800 takes its held-out residuals too: its 90 % interval was the unseen-device one, [39.6,
    97.9] us around the same 48.6 us GEMV where H100-SXM's is [43.4, 54.6]; a board of other bandwidth keeps the
    unseen-device interval."""
    from opcast.predict.cost import kernel, load_kernel_cost

    cost = load_kernel_cost(None)
    gemv = kernel("gemm", {"b": 1, "m": 8, "n": 8192, "k": 8192}, "bf16")
    on = {name: get_device(name) for name in ("H800", "H100-SXM", "A100-SXM4-40GB")}
    for dev in on.values():
        cost.time_s(gemv, dev)  # the residuals are those of the predictor that priced it: look it up first
    h800, h100 = cost.residuals(gemv, on["H800"]), cost.residuals(gemv, on["H100-SXM"])
    assert h800 is not None and h100 is not None
    assert h800.device_class == h100.device_class == "seen_device"
    assert np.array_equal(h800.log_ratio, h100.log_ratio) and np.array_equal(h800.levels, h100.levels)
    sxm40 = cost.residuals(gemv, on["A100-SXM4-40GB"])
    assert sxm40 is not None and sxm40.device_class == "unseen_device"
