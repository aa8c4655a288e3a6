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
