"""The ``neusight`` estimator (NeuSight's tile-level predictor): tile choice and wave arithmetic on
hand-worked cases, the time formula with a hand-set network, save/load, and tampered files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.train.estimators import NotApplicable, predictor_class
from opcast.train.estimators.neusight import NeuSightEstimator, gemm_tile_of_kernel, measured_tiles
from opcast.train.estimators.neusight_predictor import (
    NeuSightPredictor,
    gemm_blocks,
    heuristic_gemm_tile,
    mode_of,
    nearest_tiles,
    num_waves,
    vector_tile,
)
from opcast.train.features import features, model_inputs

A100 = "A100-SXM4-80GB"  # 108 SMs


# --------------------------------------------------------------------------- tiles and waves


def test_gemm_of_4096_in_128x128_tiles_on_108_sms_is_1024_tiles_in_10_waves():
    blocks = gemm_blocks(1, 4096, 4096, 128, 128)
    assert blocks == 1024  # 32 x 32 output tiles
    assert num_waves(blocks, 108) == 10  # 9 full waves hold 972, the 10th the last 52
    assert num_waves(972, 108) == 9 and num_waves(973, 108) == 10
    # edge tiles count whole, the batch multiplies: 2 x ceil(100/64) x ceil(300/128) = 2 x 2 x 3
    assert gemm_blocks(2, 100, 300, 64, 128) == 12


def test_kernel_name_tiles_follow_cublas_column_major_order():
    # cuBLAS names its m first; opcast's C[m, n] is cuBLAS's transpose: (tile rows, tile cols) = (64, 128)
    assert gemm_tile_of_kernel("volta_sgemm_128x64_nn") == (64.0, 128.0)
    assert gemm_tile_of_kernel("sm90_xmma_gemm_f32f32_tilesize128x256x8_warpgroupsize1x1x1") == (256.0, 128.0)
    assert gemm_tile_of_kernel("Cijk_Ailk_Bljk_SB_MT64x32x16_SN") == (32.0, 64.0)  # AMD _mt, case-insensitive
    assert all(math.isnan(v) for v in gemm_tile_of_kernel("void at::native::softmax_warp_forward"))
    assert all(math.isnan(v) for v in gemm_tile_of_kernel(None))


def test_measured_tiles_match_the_launch_grid_of_a_replayed_row():
    # NeuSight's A100 bmm row: B=6, M=27, N=21 (reduction), K=390 -> opcast b=6, m=27, n=390, k=21,
    # ampere_sgemm_128x128_nn launched on a 4 x 1 x 6 grid; and an fp32 add of 13021 x 984 on 25025 blocks
    frame = pd.DataFrame(
        {
            "op": ["gemm", "elementwise", "softmax"],
            "b": [6, None, None],
            "m": [27, None, None],
            "n": [390, None, None],
            "numel": [None, 13021 * 984, None],
            "kernel_name": ["ampere_sgemm_128x128_nn", "vectorized_elementwise_kernel<4>", "softmax_warp"],
            "grid": ["4,1,6", "25025,1,1", "10,1,1"],
        }
    )
    tiles = measured_tiles(frame)
    assert tiles.loc[0, ["measured_tile_m", "measured_tile_n"]].tolist() == [128.0, 128.0]
    assert gemm_blocks(6, 27, 390, 128, 128) == 4 * 1 * 6
    assert tiles.loc[1, "measured_tile_elems"] == 512.0  # 2**ceil(log2(12812664 / 25025))
    assert vector_tile(13021 * 984, 4) == 512.0  # the rule gives the same without the grid
    assert vector_tile(231, 4) == 256.0  # one block, rounded up to a power of two
    assert tiles.loc[2].isna().all()


def test_heuristic_and_nearest_tiles():
    tm, tn = heuristic_gemm_tile([1, 1], [4096, 64], [4096, 64], 108)
    assert (tm.tolist(), tn.tolist()) == ([128.0, 16.0], [256.0, 16.0])  # 512 tiles fill a wave; 64^2 never does
    keys = np.array([[1.0, 64, 64, 64, 80], [1.0, 4096, 4096, 4096, 80]])
    table = np.array([[32.0, 32.0], [128.0, 128.0]])
    got = nearest_tiles(np.array([[1.0, 3000, 4000, 5000, 108], [2.0, 100, 10, 10, 108]]), keys, table)
    assert got.tolist() == [[128.0, 128.0], [32.0, 32.0]]


def test_mode_of_a_group_and_kinds_it_cannot_model():
    assert mode_of(model_inputs("gemm", "neusight")) == "mm"
    assert mode_of(model_inputs("elementwise", "neusight")) == "vec"
    assert mode_of(model_inputs("layernorm", "neusight")) == "row"
    assert mode_of(model_inputs("softmax", "neusight")) == "row"
    assert mode_of(None) == "plain"
    with pytest.raises(OpcastError, match="use --estimator xgb"):
        mode_of(model_inputs("attention", "neusight"))


# --------------------------------------------------------------------------- the time formula


def _gemm_frame(m: int, n: int, k: int, tile: tuple[float, float] | None = (128.0, 128.0)) -> pd.DataFrame:
    rows = pd.DataFrame({"op": "gemm", "dtype": "fp32", "direction": "fwd", "b": [1], "m": [m], "n": [n], "k": [k]})
    feats = features(rows, get_device(A100))
    if tile is not None:
        feats = feats.assign(measured_tile_m=tile[0], measured_tile_n=tile[1])
    return feats


def _hand_set(alpha_logit: float, gamma_logit: float) -> NeuSightPredictor:
    pred = NeuSightPredictor(feature_names=model_inputs("gemm", "neusight"))
    pred.mode_ = "mm"
    pred.tile_keys_, pred.tile_table_ = np.zeros((0, 8)), np.zeros((0, 2))
    pred.weights_ = [(np.zeros((4, 3)), np.zeros(4)), (np.zeros((3, 4)), np.array([alpha_logit, 0.0, gamma_logit]))]
    return pred


def test_predicted_time_is_waves_times_wave_ops_over_roofline_times_utilisation():
    spec = get_device(A100)
    feats = _gemm_frame(4096, 4096, 4096)
    pred = _hand_set(0.0, 2.0)  # alpha = 0.5, gamma = sigmoid(2)
    util = 1 / (1 + math.exp(-2.0)) - 0.5 / 10  # 10 waves
    peak_gflops = spec.peak_flops("fp32", tensor_cores=False) / 1e9
    ops_per_wave = 108 * 2 * 128 * 4096 * 128 / 1e9  # GFLOP: 108 SMs x one 128 x 128 tile over k = 4096
    intensity = 2 * 4096**3 / 1e9 / (4 * 3 * 4096**2 / 2**30)  # GFLOP per GB (NeuSight's units)
    roof = min(peak_gflops, intensity * spec.mem_bw_bytes_per_s / 1e9)
    assert roof == peak_gflops  # a 4096^3 fp32 GEMM is compute-bound
    want = 10 * ops_per_wave / (roof * util)
    assert pred.predict_s(feats)[0] == pytest.approx(want, rel=1e-9)
    # more waves raise the utilisation (alpha / waves shrinks): 8192^2 in 128^2 tiles is 4096 tiles, 38 waves
    big = pred.predict_s(_gemm_frame(8192, 8192, 4096))[0]
    util_big = 1 / (1 + math.exp(-2.0)) - 0.5 / 38
    assert big == pytest.approx(38 * ops_per_wave / (roof * util_big), rel=1e-9)


def test_a_backward_gemm_is_its_two_gemms_and_no_utilisation_goes_below_the_floor():
    pred = _hand_set(0.0, 2.0)
    rows = pd.DataFrame(
        {"op": "gemm", "dtype": "fp32", "direction": ["fwd", "bwd"], "b": 1, "m": 512, "n": 1024, "k": 256}
    )
    feats = features(rows, get_device(A100))
    fwd, bwd = pred.predict_s(feats)
    parts = pd.DataFrame(
        {"op": "gemm", "dtype": "fp32", "direction": "fwd", "b": 1, "m": [512, 256], "n": [256, 1024], "k": [1024, 512]}
    )
    assert bwd == pytest.approx(pred.predict_s(features(parts, get_device(A100))).sum(), rel=1e-12)
    assert fwd > 0
    floor = _hand_set(30.0, -30.0)  # gamma - alpha / waves < 0: floored, a positive finite time
    assert np.isfinite(floor.predict_s(feats)).all() and (floor.predict_s(feats) > 0).all()


# --------------------------------------------------------------------------- fit, save, load


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(3)
    n = 80
    rows = pd.DataFrame(
        {
            "op": "gemm",
            "dtype": "fp32",
            "direction": "fwd",
            "b": 1,
            "m": 2 ** rng.integers(6, 12, n),
            "n": 2 ** rng.integers(6, 12, n),
            "k": 2 ** rng.integers(6, 12, n),
        }
    )
    feats = pd.concat([features(rows, get_device(g)) for g in (A100, "V100-SXM2-32GB")], ignore_index=True)
    feats["measured_tile_m"] = np.where(feats["log_m"] > np.log(500), 128.0, 64.0)
    feats["measured_tile_n"] = 128.0
    time_s = 1.5 * feats["t_roof_s"].to_numpy()
    est = NeuSightEstimator(
        feature_names=model_inputs("gemm", "neusight"), hidden=16, num_layers=3, epochs=20, learning_rate=3e-3, n_jobs=1
    )
    return est.fit(feats, time_s), feats


def test_save_load_round_trip_keeps_the_network_and_the_nearest_tile_table(fitted, tmp_path):
    est, feats = fitted
    assert est.mode_ == "mm" and est.tile_keys_.shape == (len(feats), 8)
    blind = feats.drop(columns=["measured_tile_m", "measured_tile_n"])
    want, want_blind = est.predict_s(feats), est.predict_s(blind)
    assert np.isfinite(want).all() and np.isfinite(want_blind).all()
    # every training row is its own nearest neighbour: the looked-up tiles are the profiled ones
    assert np.allclose(want, want_blind)
    path = est.save(tmp_path / "gemm-fwd-fp32", record={"group": "gemm-fwd-fp32", "estimator": "neusight"})
    loaded = predictor_class("neusight").load(path, feature_names=est.feature_names, config=est.config())
    assert np.array_equal(loaded.predict_s(feats), want)
    assert np.array_equal(loaded.predict_s(blind), want_blind)
    assert loaded.record_ == {"group": "gemm-fwd-fp32", "estimator": "neusight"}


def test_a_tampered_file_is_refused_in_one_line(fitted, tmp_path):
    est, _ = fitted
    path = est.save(tmp_path / "p")
    arrays = dict(np.load(path))
    arrays["mode"] = np.array("gpu")
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(OpcastError, match="not a neusight predictor") as err:
        NeuSightPredictor.load(bad, feature_names=est.feature_names, config={})
    assert "\n" not in str(err.value)
    del arrays["layer2.bias"]
    with open(bad, "wb") as fh:
        np.savez(fh, **arrays | {"mode": np.array("mm")})
    with pytest.raises(OpcastError, match=r"layer0\.\.layerN"):
        NeuSightPredictor.load(bad, feature_names=est.feature_names, config={})


def test_collectives_and_attention_are_not_applicable():
    feats = pd.DataFrame({"log_t_roof_s": [0.0], "t_roof_s": [1.0]})
    with pytest.raises(NotApplicable):
        NeuSightEstimator(feature_names=model_inputs("attention", "neusight")).fit(feats, [1.0])
