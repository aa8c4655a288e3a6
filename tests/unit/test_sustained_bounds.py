"""The resource-ratio bound compares utilisations relative to what each training device sustains: a
power-limited training GPU (NeuSight's T4 sustains 0.49 of its FP32 peak) no longer caps every
stronger GPU at its share of a datasheet peak it never reaches (issue 19/21)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from opcast.hardware import device_to_dict
from opcast.predict.cost import kernel, load_kernel_cost, peak_roofline_s
from opcast.train import artifacts, fit

from helpers import synthetic


def test_sustained_utilisation_is_a_high_quantile_of_the_long_rows_per_side():
    rng = np.random.default_rng(0)
    n = 40
    u_a = rng.uniform(0.4, 0.5, n)  # device a: compute-bound rows at 0.40-0.50 of its roofline
    frame = pd.DataFrame(
        {
            "device": ["a"] * n + ["b"] * n + ["c"] * 5 + ["a"] * n,
            "time_s_median": np.r_[4e-3 / u_a, np.full(n, 4e-3 / 0.9), np.full(5, 8e-3), np.full(n, 4e-3 / 0.8)],
        }
    )
    feats = pd.DataFrame(
        {
            "t_roof_s": np.full(len(frame), 4e-3),
            "log_compute_over_memory": np.r_[np.ones(2 * n + 5), -np.ones(n)],  # a's last rows: memory-bound
        }
    )
    got = fit.sustained_utilisation(frame, feats)
    assert set(got) == {"a", "b"}  # c has fewer than SWEEP_MIN_ROWS long rows
    assert got["a"]["compute"] == pytest.approx(np.quantile(u_a, fit.SUSTAINED_QUANTILE), abs=1e-4)
    assert got["a"]["memory"] == pytest.approx(0.8) and got["b"] == {"compute": pytest.approx(0.9)}
    short = feats.assign(t_roof_s=1e-4)  # rows under SWEEP_SATURATED_S say nothing about the sustained rate
    assert fit.sustained_utilisation(frame.assign(time_s_median=frame["time_s_median"] * 1e-4 / 4e-3), short) == {}
    # ... unless a memory-bound row streams several times the L2 from DRAM: a short row counts then
    streamed = short.assign(
        log_bytes_over_l2=np.log(fit.SUSTAINED_L2_MULTIPLE) + np.r_[np.zeros(2 * n + 5), 0.5 * np.ones(n)]
    )
    cached = streamed.assign(log_bytes_over_l2=np.log(fit.SUSTAINED_L2_MULTIPLE) - 0.1)
    fast = frame.assign(time_s_median=frame["time_s_median"] * 1e-4 / 4e-3)
    assert fit.sustained_utilisation(fast, streamed) == {"a": {"memory": pytest.approx(0.8)}}
    assert fit.sustained_utilisation(fast, cached) == {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two fitted fake GPUs of one bandwidth, the first with half the second's peak and power-limited
    (every GEMM takes twice the law's time: it sustains half its datasheet peak), a third with twice
    the second's peak; one model set as fitted (sustained shares recorded) and one without them."""
    throttled, strong, big = synthetic.fake_devices(3)  # peaks 0.5x, 1x, 2x; bandwidths equal
    assert throttled.mem_bw_bytes_per_s == strong.mem_bw_bytes_per_s == big.mem_bw_bytes_per_s
    frame = synthetic.synthetic_dataset([throttled, strong], ops=("gemm",), rows_per_op=200, seed=5)
    frame.loc[frame["device"] == throttled.name, "time_s_median"] *= 2.0
    devices = {d.name: d for d in (throttled, strong)}
    cfg = fit.FitConfig(estimator="xgb", folds=0, n_jobs=1, xgb_params={"n_estimators": 80, "max_depth": 4})
    groups, _, _ = fit.fit_frame(frame, devices, cfg)
    specs = {"datasets": [], "device_specs": {n: device_to_dict(d) for n, d in devices.items()}}
    recorded = artifacts.write_model_set(tmp_path_factory.mktemp("m"), "with", groups, specs)
    meta = json.loads((recorded / "meta.json").read_text())
    entry = meta["predictors"]["gemm-fwd-half"]
    entry["sustained_utilisation"] = {throttled.name: {"compute": 0.5}, strong.name: {"compute": 1.0}}
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    (recorded / "meta.json").write_text(json.dumps(meta))
    bare = json.loads(json.dumps(meta))
    del bare["predictors"]["gemm-fwd-half"]["sustained_utilisation"]
    bare["meta_sha256"] = artifacts._meta_digest(bare)
    plain = tmp_path_factory.mktemp("p")
    for f in recorded.iterdir():
        (plain / f.name).write_bytes(f.read_bytes())
    (plain / "meta.json").write_text(json.dumps(bare))
    return {"throttled": throttled, "strong": strong, "big": big, "recorded": recorded, "plain": plain}


BIG_GEMMS = [kernel("gemm", {"b": 1, "m": s, "n": s, "k": s}, "fp16") for s in (4096, 6144, 8192)]


def test_a_throttled_training_gpu_does_not_cap_a_stronger_one_at_its_share(world):
    big = world["big"]
    assert all(peak_roofline_s(k, big)[1] == "compute" for k in BIG_GEMMS)
    roof = np.array([peak_roofline_s(k, big)[0] for k in BIG_GEMMS])
    raw = dataclasses.replace(load_kernel_cost(world["recorded"]), physical_bounds=False)
    old, new = load_kernel_cost(world["plain"]), load_kernel_cost(world["recorded"])
    t_raw = np.array([raw.time_s(k, big)[0] for k in BIG_GEMMS])
    t_old = np.array([old.time_s(k, big)[0] for k in BIG_GEMMS])
    t_new = np.array([new.time_s(k, big)[0] for k in BIG_GEMMS])
    u_throttled = np.array(
        [peak_roofline_s(k, world["throttled"])[0] / new.time_s(k, world["throttled"])[0] for k in BIG_GEMMS]
    )
    assert np.all(u_throttled < 0.6)  # the model learned the throttled GPU at about half its peak
    # without the recorded shares the throttled GPU's utilisation caps the big one ...
    assert np.all(roof / t_old <= u_throttled * (1 + 1e-9))
    # ... with them, the big one keeps the model's answer where that is physical: above the throttled share,
    # no faster than the roofline and never slower than the strong GPU, which has less of both
    assert np.all(roof / t_new > u_throttled * 1.3)
    assert np.all(t_new >= roof * (1 - 1e-12))
    t_strong = np.array([new.time_s(k, world["strong"])[0] for k in BIG_GEMMS])
    assert np.all(t_new <= t_strong * (1 + 1e-12))
    assert np.all(t_new <= t_raw * 1.02)  # the model's own answer, bar the training span's edge


def test_a_bigger_board_of_a_training_die_takes_its_compute_cap_from_that_gpu_alone(world, tmp_path):
    """Where the throttled GPU's share is not recorded, its raw utilisation caps a stronger GPU of another die;
    a board of the strong GPU's die with more memory and bandwidth is held to the strong GPU's utilisation."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in world["recorded"].iterdir():
        (partial / f.name).write_bytes(f.read_bytes())
    meta = json.loads((partial / "meta.json").read_text())
    del meta["predictors"]["gemm-fwd-half"]["sustained_utilisation"][world["throttled"].name]
    meta["meta_sha256"] = artifacts._meta_digest(meta)
    (partial / "meta.json").write_text(json.dumps(meta))
    strong = world["strong"]
    board, other_die = synthetic.die_variants(strong, 1.5)
    cost = load_kernel_cost(partial)
    gemms = [kernel("gemm", {"b": 1, "m": m, "n": n, "k": k}, "fp16") for m, n, k in MEDIUM]
    assert all(peak_roofline_s(k, d)[1] == "compute" for k in gemms for d in (board, world["throttled"]))
    u = {
        d.name: np.array([peak_roofline_s(k, d)[0] / cost.time_s(k, d)[0] for k in gemms])
        for d in (world["throttled"], strong, board, other_die)
    }
    assert np.all(u[other_die.name] <= u[world["throttled"].name] * (1 + 1e-9))  # capped by the throttled GPU
    assert np.all(u[board.name] > u[world["throttled"].name] * 1.3)  # the board of the strong GPU's die is not
    assert np.all(u[board.name] <= u[strong.name] * (1 + 1e-9))


MEDIUM = [(2001, 2099, 1003), (1005, 3901, 2097), (2103, 1001, 1903)]  # unaligned, like the fitted shapes


def test_a_compute_bound_kernel_on_a_board_of_a_training_die_takes_that_gpus_held_time(world):
    """A board of the strong GPU's die with 1.5x its bandwidth: its compute-bound GEMMs run exactly as on the
    strong GPU, held there (rule same_die), where the cross-device bounds could move them either way; a
    memory-bound kernel is not that rule's (its bandwidth is the board's own)."""
    from opcast.predict.cost.learned import DIE

    strong = world["strong"]
    board, _ = synthetic.die_variants(strong, 1.5)
    cost = load_kernel_cost(world["recorded"])
    gemms = [kernel("gemm", {"b": 1, "m": m, "n": n, "k": k}, "fp16") for m, n, k in MEDIUM] + BIG_GEMMS
    assert all(peak_roofline_s(k, board)[1] == "compute" for k in gemms)
    for k in gemms:
        assert cost.time_s(k, board)[0] == cost.time_s(k, strong)[0]
        flag = cost.bound_flag(k, board)
        assert flag is None or flag == DIE  # moved, if at all, by the die rule alone
    skinny = kernel("gemm", {"b": 1, "m": 1, "n": 8192, "k": 8192}, "fp16")  # a GEMV: memory-bound
    assert peak_roofline_s(skinny, board)[1] == "memory"
    cost.time_s(skinny, board)
    assert cost.bound_flag(skinny, board) != DIE
