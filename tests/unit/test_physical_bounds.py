"""Physical bounds on learned kernel times (issue 21): a model fitted on two fake GPUs, asked about
a third with twice the bandwidth, stays within the ratio of the bandwidths; nothing beats the
roofline at the peak; a weaker GPU is never faster; the output says when a bound moved a time."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from opcast.hardware import device_to_dict
from opcast.predict.cost import FLOOR, kernel, load_kernel_cost, peak_roofline_s
from opcast.train import artifacts, fit

from helpers import synthetic


def _device(base, name: str, bw: float):
    return dataclasses.replace(base, name=name, aliases=(), mem_bw_bytes_per_s=bw)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two fitted fake GPUs (same peaks, 1.0 and 1.5 TB/s), a third with 2.0 TB/s (twice the first)
    and a fourth with 0.5 TB/s, and the model set fitted on the first two."""
    base = synthetic.fake_devices(1)[0]
    one, two = _device(base, "fake-bw1", 1.0e12), _device(base, "fake-bw15", 1.5e12)
    fast, slow = _device(base, "fake-bw2", 2.0e12), _device(base, "fake-bw05", 0.5e12)
    frame = synthetic.synthetic_dataset([one, two], ops=("elementwise", "layernorm"), rows_per_op=80, seed=3)
    devices = {d.name: d for d in (one, two)}
    groups, _, _ = fit.fit_frame(
        frame,
        devices,
        fit.FitConfig(estimator="xgb", folds=0, n_jobs=1, xgb_params={"n_estimators": 60, "max_depth": 4}),
    )
    path = artifacts.write_model_set(
        tmp_path_factory.mktemp("models"),
        "toy",
        groups,
        {"datasets": [], "device_specs": {n: device_to_dict(d) for n, d in devices.items()}},
    )
    # another die (four more SMs): the cross-device rules govern it, not the same-die board rule
    other = dataclasses.replace(fast, name="fake-bw2-die", sm_count=fast.sm_count + 4)
    return {"one": one, "two": two, "fast": fast, "slow": slow, "other": other, "path": path}


MEMORY_BOUND = [kernel("elementwise", {"numel": n, "fn": "add"}, "fp16") for n in (1 << 18, 1 << 21, 1 << 24)] + [
    kernel("layernorm", {"rows": r, "cols": 4096}, "fp16") for r in (256, 4096)
]


def _times(cost, device):
    table = cost.lookup(MEMORY_BOUND, device)
    return np.array([table[k][0] for k in MEMORY_BOUND])


def test_twice_the_bandwidth_is_at_most_twice_as_fast_and_never_slower(world):
    cost = load_kernel_cost(world["path"])
    assert all(peak_roofline_s(k, world["fast"])[1] == "memory" for k in MEMORY_BOUND)
    t1, t2, t3 = (_times(cost, world[d]) for d in ("one", "two", "fast"))
    assert np.all(t3 >= t1 / 2 * (1 - 1e-9))  # no faster than 2x the first
    assert np.all(t3 >= t2 / (2.0 / 1.5) * (1 - 1e-9))  # nor more than the bandwidth ratio over the second
    assert np.all(t3 <= t1) and np.all(t3 <= t2)  # and never slower than either
    assert all(peak_roofline_s(k, world["fast"])[0] <= t for k, t in zip(MEMORY_BOUND, t3))


def test_a_device_with_less_of_both_is_never_faster(world):
    cost = load_kernel_cost(world["path"])
    t1, t0 = _times(cost, world["one"]), _times(cost, world["slow"])
    assert np.all(t0 >= t1)
    assert np.all(t0 <= t1 * 2 * (1 + 1e-9))  # and no more than the bandwidth ratio slower: utilisation within the span


def test_the_bounds_fire_on_the_unfitted_device_and_say_so(world):
    cost = load_kernel_cost(world["path"])
    raw = dataclasses.replace(load_kernel_cost(world["path"]), physical_bounds=False)
    device = world["other"]
    bounded, unbounded = _times(cost, device), _times(raw, device)
    moved = [k for k in MEMORY_BOUND if cost.bound_flag(k, device)]
    assert moved and not np.allclose(bounded, unbounded)  # the raw tree model does not follow the bandwidth
    assert not raw.bound_flags(device)
    assert all(cost.bound_flag(k, device) is None for k, a, b in zip(MEMORY_BOUND, bounded, unbounded) if a == b)
    doc = cost.describe()
    summary = doc["physical_bounds"]["bounded"][device.name]
    assert summary["bounded_kernels"] == len(moved) and sum(summary["by_rule"].values()) == len(moved)
    assert any(n.startswith(f"physical bounds moved {len(moved)} of ") and device.name in n for n in doc["notes"])
    assert raw.describe()["physical_bounds"]["rules"] == "off"


def test_a_memory_bound_kernel_on_a_board_of_a_training_die_lies_between_its_time_and_the_bandwidth_ratio(world):
    """fake-bw2 has the SMs, clocks and peaks of the two training GPUs (a board of their die): a memory-bound kernel
    there takes no other rule than [t, t x bandwidth ratio] of the training board nearest in bandwidth (fake-bw15)."""
    cost = load_kernel_cost(world["path"])
    raw = dataclasses.replace(load_kernel_cost(world["path"]), physical_bounds=False)
    fast, twin = world["fast"], world["two"]
    got, ref, own = _times(cost, fast), _times(cost, twin), _times(raw, fast)
    ratio = twin.mem_bw_bytes_per_s / fast.mem_bw_bytes_per_s
    lo, hi = ref * ratio, ref
    assert np.all(got >= lo * (1 - 1e-12)) and np.all(got <= hi * (1 + 1e-12))
    expected = np.clip(own, lo, hi)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    for k, a, b in zip(MEMORY_BOUND, got, own):
        flag = cost.bound_flag(k, fast)
        assert (flag is None) == (a == b) and (flag is None or "its die" in flag)
    slow = _times(cost, world["slow"])  # a board with less bandwidth: at most the ratio slower than fake-bw1
    one = _times(cost, world["one"])
    assert np.all(slow >= one * (1 - 1e-12)) and np.all(slow <= one * 2 * (1 + 1e-12))


def test_fitted_devices_get_only_the_roofline_floor(world):
    cost = load_kernel_cost(world["path"])
    raw = dataclasses.replace(load_kernel_cost(world["path"]), physical_bounds=False)
    one = world["one"]
    inside = MEMORY_BOUND[:3]
    assert np.array_equal(_times(cost, one)[:3], np.array([raw.time_s(k, one)[0] for k in inside]))
    # a time faster than physics allows (a model far outside its fitted shapes can give one) is floored
    source = cost.sources[0]
    k = MEMORY_BOUND[1]
    roof = peak_roofline_s(k, one)[0]
    times, why = source.bound([k, MEMORY_BOUND[2]], np.array([roof / 2, raw.time_s(MEMORY_BOUND[2], one)[0]]), one)
    assert times[0] == pytest.approx(roof, rel=1e-12) and why[k][0] == FLOOR and "roofline" in why[k][1]
    assert MEMORY_BOUND[2] not in why


def test_the_console_script_reports_a_bound_and_the_switch_turns_it_off(world, tmp_path):
    gpu = tmp_path / "fast.json"
    gpu.write_text(json.dumps(device_to_dict(world["fast"])))
    cmd = [
        sys.executable,
        "-m",
        "opcast",
        "predict",
        "kernel",
        "--gpu",
        str(gpu),
        "--op",
        "layernorm",
        "--param",
        "rows=4096",
        "--param",
        "cols=4096",
        "--dtype",
        "fp16",
        "--models",
        str(world["path"]),
        "--json",
    ]
    env = {k: v for k, v in os.environ.items() if k != "OPCAST_PHYSICAL_BOUNDS"}
    on = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    off = subprocess.run(cmd, capture_output=True, text=True, env={**env, "OPCAST_PHYSICAL_BOUNDS": "off"}, timeout=120)
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    got_on, got_off = json.loads(on.stdout), json.loads(off.stdout)
    assert got_on["source"] == got_off["source"] == "learned"
    bounded = [n for n in got_on["notes"] if n.startswith("physical bounds moved")]
    assert not [n for n in got_off["notes"] if n.startswith("physical bounds moved")]
    assert bool(bounded) == (got_on["time_s"] != got_off["time_s"])


def test_the_rules_are_one_projection_and_the_ratio_wins_where_they_conflict():
    """Three training devices: C has more of both than B, and more bandwidth than A. Applied in turn,
    the monotone rule (C no slower than B) would undo the ratio cap (C at no higher a utilisation
    than A); as one projection the ratio is kept and the reason says the bounds conflict."""
    from opcast.predict.cost.learned import MONOTONE, RATIO, LearnedKernelCost, _Seen

    a = _Seen("A", 10.0, 1.0, 1.0, 1.0, 1.0)  # 10 % of its bandwidth
    b = _Seen("B", 2.2, 2.0, 2.0, 0.5, 1.0)  # 91 %
    c = _Seen("C", 3.0, 0.5, 2.0, 2.0, 1.0)
    held = LearnedKernelCost._held_training("toy", [c, a, b], "outside its shapes")
    assert held["A"] == (10.0, None) and held["B"] == (2.2, None)  # the weaker devices are the reference
    t, why = held["C"]
    assert t == pytest.approx(10.0 * 0.5 / 1.0) and t > b.time_s  # ratio to A kept, monotone to B given up
    assert why[0] == RATIO and "conflict" in why[1]
    # inside the fitted shapes the ratio is not imposed on C's own answer (3.0, already faster than the ratio
    # to A allows), but the monotone rule may not carry B's time over to C beyond it either: C keeps its answer
    t, why = LearnedKernelCost._held_training("toy", [c, a, b], None)["C"]
    assert t == pytest.approx(3.0) and why is None
    slow_c = c._replace(time_s=9.0)  # slower than B: monotone lowers it, but only to the ratio to A (5.0), not B's 2.2
    t, why = LearnedKernelCost._held_training("toy", [slow_c, a, b], None)["C"]
    assert t == pytest.approx(10.0 * 0.5 / 1.0) and why[0] == MONOTONE and "resource ratio to A " in why[1]


def test_monotone_on_training_devices_stops_at_the_resource_ratio():
    """A small attention on A, L and H (all fitted; A100-, L40S- and H100-like peak and bandwidth, H with the
    highest clock here): L (more peak, less bandwidth than A) is fastest; carrying its time over to H (more of
    each resource) would make H faster than A beyond their bandwidth ratio, so H stops at that ratio; H's own
    answer inside it is kept."""
    from opcast.predict.cost.learned import MONOTONE, LearnedKernelCost, _Seen

    a = _Seen("A", 24.0, 1.04, 312.0, 2.04, 1.4)  # 4 % of its bandwidth
    lo = _Seen("L", 12.7, 2.45, 362.0, 0.86, 1.9)  # 19 %
    h = _Seen("H", 18.6, 0.63, 989.0, 3.35, 2.0)
    held = LearnedKernelCost._held_training("attn", [h, a, lo], None)
    assert held["A"] == (24.0, None) and held["L"] == (12.7, None)
    t, why = held["H"]
    assert t == pytest.approx(24.0 * 0.63 / 1.04) and t > lo.time_s  # A's time x the bandwidth ratio
    assert 24.0 / t <= 1.04 / 0.63 * (1 + 1e-12) and why[0] == MONOTONE and "resource ratio to A" in why[1]
    within = h._replace(time_s=13.5)  # between L's time and the ratio bound (14.5): its own answer stands
    assert LearnedKernelCost._held_training("attn", [within, a, lo], None)["H"] == (13.5, None)


def test_a_lower_clock_loosens_the_monotone_bound_by_the_clock_ratio():
    """AIConfigurator's small causal attention (1 x 8 heads x 512 tokens) on A100, L40S and H100, each with its
    boost clock: L40S (2.52 GHz) is fastest; H100 (1.98 GHz) has more peak and bandwidth but the lower clock,
    so it is held no slower than L40S's time x 2.52 / 1.98 (latency runs at the clock), and no slower than
    A100's (less of everything)."""
    from opcast.predict.cost import slower_at_most
    from opcast.predict.cost.learned import MONOTONE, LearnedKernelCost, _Seen

    a100 = _Seen("A100", 24.0, 1.04, 312.0, 2.04, 1.41e9)
    l40s = _Seen("L40S", 12.7, 2.45, 362.0, 0.86, 2.52e9)
    h100 = _Seen("H100", 15.9, 0.63, 989.0, 3.35, 1.98e9)  # 1.25x L40S's time: within the clock ratio
    held = LearnedKernelCost._held_training("attn", [h100, a100, l40s], None)
    assert held == {"A100": (24.0, None), "L40S": (12.7, None), "H100": (15.9, None)}
    assert slower_at_most((989.0, 3.35, 1.98e9, 700.0), (312.0, 2.04, 1.41e9, 400.0)) == 1.0
    assert slower_at_most((989.0, 3.35, 1.98e9, 700.0), (362.0, 0.86, 2.52e9, 350.0)) == pytest.approx(2.52 / 1.98)
    assert slower_at_most((362.0, 0.86, 2.52e9, 350.0), (989.0, 3.35, 1.98e9, 700.0)) is None  # less peak: no bound
    assert slower_at_most((1.0, 1.0, 1.0, None), (1.0, 1.0, 1.0, None)) == 1.0
    slow = h100._replace(time_s=17.0)  # beyond the clock ratio: held at 12.7 x 2.52 / 1.98 = 16.16
    t, why = LearnedKernelCost._held_training("attn", [slow, a100, l40s], None)["H100"]
    assert t == pytest.approx(12.7 * 2.52 / 1.98) and why[0] == MONOTONE and "L40S" in why[1]
    assert "clock ratio, 1.27x" in why[1]


def test_monotone_still_copies_a_reference_that_already_outruns_the_weaker_devices():
    """A large GEMM: G (same peak as S, less bandwidth) reaches 84 % where the weaker W reaches 60 %
    (its data, beyond the ratio); S, with more of both than G, is still held no slower than G: the
    monotone rule creates no violation against W that G does not already have."""
    from opcast.predict.cost.learned import MONOTONE, LearnedKernelCost, _Seen

    w = _Seen("W", 5.0, 3.0, 1.0, 0.3, 1.0)  # 60 %
    g = _Seen("G", 1.32, 1.11, 3.0, 4.0, 1.0)  # 84 %
    s = _Seen("S", 1.40, 1.11, 3.0, 4.8, 1.0)  # slower than G with more bandwidth and the same peak
    t, why = LearnedKernelCost._held_training("gemm", [s, w, g], None)["S"]
    assert t == pytest.approx(1.32) and why[0] == MONOTONE and "ratio" not in why[1]


def test_a_training_device_extrapolating_in_shape_is_held_to_the_others_ratio(world):
    from opcast.predict.cost import RATIO

    cost = load_kernel_cost(world["path"])
    source = cost.sources[0]
    one, two = world["one"], world["two"]
    far = kernel("elementwise", {"numel": 1 << 31, "fn": "add"}, "fp16")  # far above the fitted shapes
    near = MEMORY_BOUND[1]
    assert source.out_of_range([far], two) and not source.out_of_range([near], two)
    t_one = source.predict_s([far, near], one)
    fast = t_one / 1.5 / 2  # twice as fast as 1.5x the bandwidth allows
    times, why = source.bound([far, near], fast, two)
    assert times[0] == pytest.approx(t_one[0] / 1.5, rel=1e-9) and why[far][0] == RATIO and "shape" in why[far][1]
    assert near not in why or why[near][0] != RATIO  # inside the fitted shapes the data speak


def test_a_gpu_made_from_a_training_gpu_with_more_of_everything_is_never_slower_than_it():
    """B200's bf16 GEMMs (models/default) reach 77 % of its peak, MI300X's 62 %. B200 with 5 % more peak, or more
    L2 or SMs, answered as an unseen device, had its GEMMs capped at MI300X's share, 1.25x slower than on B200 (a
    llama2-7b explore --vary peak_bf16_flops=1,1.05: speed-up 0.917); it takes its cap from B200 alone now: no
    slower than B200, and at most the peak ratio faster."""
    from opcast.hardware import derive_device, get_device

    cost = load_kernel_cost(None)
    b200 = get_device("B200")
    gemm = kernel("gemm", {"b": 1, "m": 4096, "n": 12288, "k": 4096}, "bf16")
    base = cost.time_s(gemm, b200)[0]
    for setting, most in (("peak_bf16_flops=x1.05", 1.05), ("l2_bytes=x2", 1.0), ("sm_count=x2", 1.0)):
        t = cost.time_s(gemm, derive_device(b200, [setting]))[0]
        assert base / most * (1 - 1e-9) <= t <= base * (1 + 1e-9), setting


def test_a_training_device_outside_the_recorded_device_features_is_no_shape_extrapolation(world, tmp_path):
    """A group fitted on one vendor's rows (train.fit.vendor_rows) records the device features of that vendor's GPUs,
    while its devices are every vendor's: a training GPU of another vendor outside them makes no kernel a shape
    extrapolation (Intel's B60 below NVIDIA's bf16 peaks once held A100-SXM4-80GB's GEMMs to the B60's utilisation)."""
    key = "elementwise-fwd-half"
    meta = json.loads((world["path"] / "meta.json").read_text())
    ranges = meta["predictors"][key]["feature_ranges"]
    assert "log_mem_bw_bytes_per_s" in ranges
    top = float(np.log(world["two"].mem_bw_bytes_per_s))
    ranges["log_mem_bw_bytes_per_s"] = [top, top]  # as if fitted on fake-bw15's rows alone: fake-bw1 lies outside
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    copy = tmp_path / "toy"
    copy.mkdir()
    for f in world["path"].iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "meta.json").write_text(json.dumps(meta))
    source = load_kernel_cost(copy).sources[0]
    near, far = MEMORY_BOUND[1], kernel("elementwise", {"numel": 1 << 31, "fn": "add"}, "fp16")
    assert source.range.feature_reasons(key, [near], world["one"])  # the device feature is outside on fake-bw1
    assert source._outside_shapes([(key, near)], world["one"]) == {}  # but the shape is not
    assert "log_flops" in source._outside_shapes([(key, far)], world["one"])[far]  # a shape outside still is


def test_equal_peaks_and_less_power_set_no_monotone_bound():
    """B200 (1,000 W) and B300 (1,100 W): the same dense fp8 peak, B200 3 % more bandwidth and the higher
    boost clock, yet B200 runs AIConfigurator's GEMMs about 5 % slower (measured). With equal peaks the part
    with less board power is not held to the other's time (its own data stand); a higher peak still is, power
    or not, and so are equal peaks at equal power."""
    from opcast.hardware import get_device
    from opcast.predict.cost import kernel_resources, slower_at_most
    from opcast.predict.cost.learned import LearnedKernelCost, _Seen
    from opcast.predict.cost.query import kernel

    b200, b300 = get_device("B200"), get_device("B300")
    gemm = kernel("gemm", {"b": 1, "m": 8192, "n": 8192, "k": 8192}, "fp8")
    assert kernel_resources(gemm, b200)[0] == kernel_resources(gemm, b300)[0] == 4.5e15  # the same datasheet peak
    assert slower_at_most(kernel_resources(gemm, b200), kernel_resources(gemm, b300)) is None
    assert slower_at_most(kernel_resources(gemm, b300), kernel_resources(gemm, b200)) is None  # less bandwidth
    assert slower_at_most((2.0, 1.0, 1.0, 500.0), (1.0, 1.0, 1.0, 1000.0)) == 1.0  # more peak: bound, power or not
    assert slower_at_most((1.0, 1.0, 1.0, 1000.0), (1.0, 1.0, 1.0, 1000.0)) == 1.0
    assert slower_at_most((1.0, 2.0, 1.0, 1100.0), (1.0, 1.0, 1.0, 1000.0)) == 1.0
    # the held training answers: B200's own time stands where it had been lowered to B300's
    t_b200 = _Seen("B200", 1.05, 0.25, 4.5, 8.0, 1.98, 1000.0)
    t_b300 = _Seen("B300", 1.00, 0.25, 4.5, 7.75, 1.83, 1100.0)
    held = LearnedKernelCost._held_training("gemm", [t_b200, t_b300], None)
    assert held == {"B300": (1.00, None), "B200": (1.05, None)}
    was = LearnedKernelCost._held_training("gemm", [t_b200._replace(power=None), t_b300._replace(power=None)], None)
    assert was["B200"][0] == 1.00  # without the powers: held to B300's time, as before
