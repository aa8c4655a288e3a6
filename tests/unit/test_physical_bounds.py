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
    return {"one": one, "two": two, "fast": fast, "slow": slow, "path": path}


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
    bounded, unbounded = _times(cost, world["fast"]), _times(raw, world["fast"])
    moved = [k for k in MEMORY_BOUND if cost.bound_flag(k, world["fast"])]
    assert moved and not np.allclose(bounded, unbounded)  # the raw tree model does not follow the bandwidth
    assert not raw.bound_flags(world["fast"])
    assert all(cost.bound_flag(k, world["fast"]) is None for k, a, b in zip(MEMORY_BOUND, bounded, unbounded) if a == b)
    doc = cost.describe()
    summary = doc["physical_bounds"]["bounded"]["fake-bw2"]
    assert summary["bounded_kernels"] == len(moved) and sum(summary["by_rule"].values()) == len(moved)
    assert any(n.startswith(f"physical bounds moved {len(moved)} of ") and "fake-bw2" in n for n in doc["notes"])
    assert raw.describe()["physical_bounds"]["rules"] == "off"


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
