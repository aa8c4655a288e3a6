"""Hardware what-if: derived GPUs (--set), the exact scaling of the analytical path, the time split,
explore grids, compare tables, per-op bottlenecks and the learned models' hardware-range flag."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import PEAKS_GROUP, derive_device, get_device, parse_setting
from opcast.predict import comm
from opcast.predict.cost import (
    LEARNED,
    ROOFLINE,
    KernelCostModel,
    LearnedKernelCost,
    RooflineKernelCost,
    bottleneck,
    kernel,
)
from opcast.predict.parallel import InferConfig, TrainConfig
from opcast.predict.whatif import (
    EXPLORE_COLUMNS,
    SPLIT_PARTS,
    Workload,
    compare,
    explore,
    parse_vary,
    predict,
    split_gpu_list,
)

H100 = get_device("H100-SXM")
A100 = get_device("A100-SXM4-80GB")

THROUGHPUT = ("peak_flops=x2", "mem_bw_bytes_per_s=x2", "intra_node_bw_bytes_per_s=x2", "inter_node_bw_bytes_per_s=x2")
"""'Every spec x2' for the analytical path: every peak, the memory bandwidth and both link
bandwidths. Memory size, SMs, L2, clock, lanes and node size stay: the roofline does not read
the first five (test_learned_only_fields_do_not_move_the_roofline), and the node size is topology."""

SMALL_TRAIN = Workload(
    kind="train",
    arch=load_arch("gpt3-350m"),
    config=TrainConfig(tp=2, pp=2, dp=4, sp=True, global_batch=32, seq=1024, zero=1, overlap_grad_reduce=True),
    nodes=2,
    gpus_per_node=8,
)
SINGLE_GPU = Workload(
    kind="train", arch=load_arch("gpt3-125m"), config=TrainConfig(micro_batch=2, global_batch=8, seq=1024)
)
SMALL_INFER = Workload(
    kind="infer", arch=load_arch("llama2-7b"), config=InferConfig(tp=4, pp=2, batch=8, prompt_len=256, gen_len=32)
)


def _one_line(fn, *args):
    with pytest.raises(OpcastError) as info:
        fn(*args)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.fixture
def no_latency(monkeypatch):
    """The NCCL per-step latencies of the alpha-beta model set to zero (bandwidth terms only)."""
    zero = {
        name: dataclasses.replace(
            p,
            base_ring_s=0.0,
            base_tree_s=0.0,
            hop_ring_s=dict.fromkeys(p.hop_ring_s, 0.0),
            hop_tree_s=dict.fromkeys(p.hop_tree_s, 0.0),
        )
        for name, p in comm._PROTOCOLS.items()
    }
    monkeypatch.setattr(comm, "_PROTOCOLS", zero)


# --------------------------------------------------------------------------- derived GPUs


def test_set_multiplies_sets_and_names_the_derived_gpu():
    d = derive_device(H100, ["mem_bw_bytes_per_s=x2", "peak_bf16_flops=x1.5", "sm_count=100", "tdp_w=900"])
    assert d.name == "H100-SXM[mem_bw_bytes_per_s=x2,peak_bf16_flops=x1.5,sm_count=100,tdp_w=900]"
    assert d.mem_bw_bytes_per_s == 2 * H100.mem_bw_bytes_per_s and d.peak_bf16_flops == 1.5 * H100.peak_bf16_flops
    assert d.sm_count == 100 and d.tdp_w == 900 and d.peak_fp16_flops == H100.peak_fp16_flops
    assert d.aliases == () and "H100-SXM" in d.source and "mem_bw_bytes_per_s 3.35e+12 -> 6.7e+12" in d.notes
    assert get_device(d.name) == d  # the name is a valid --gpu
    assert derive_device(H100, []) is H100


def test_peak_group_integer_rounding_absolute_null_peak_and_chaining():
    a100 = derive_device(A100, [f"{PEAKS_GROUP}=x3", "sm_count=x1.5"])
    assert a100.peak_fp8_flops is None  # the group skips precisions the GPU lacks
    assert a100.peak_bf16_flops == 3 * A100.peak_bf16_flops and a100.peak_fp32_flops == 3 * A100.peak_fp32_flops
    assert a100.sm_count == 162  # 108 x 1.5
    assert derive_device(A100, ["peak_fp8_flops=1.2e15"]).supports("fp8")  # an absolute value adds a precision
    chained = get_device("H100-SXM[mem_bw_bytes_per_s=x2][mem_bw_bytes_per_s=x2]")
    assert chained.mem_bw_bytes_per_s == 4 * H100.mem_bw_bytes_per_s


@pytest.mark.parametrize(
    "setting,needles",
    [
        ("mem_bw=x2", ["unknown field 'mem_bw'", "did you mean mem_bw_bytes_per_s?", "settable fields"]),
        ("frequency=x2", ["unknown field 'frequency'", "peak_flops (every peak)"]),
        ("mem_bw_bytes_per_s=fast", ["'fast' is not a number", "bytes/s"]),
        ("mem_bw_bytes_per_s=xfast", ["'fast' is not a number", "factor"]),
        ("mem_bw_bytes_per_s=x0", ["factor of mem_bw_bytes_per_s must be a positive"]),
        ("mem_bw_bytes_per_s=-8e12", ["value (bytes/s) of mem_bw_bytes_per_s must be a positive"]),
        ("peak_bf16_flops=x-1", ["factor of peak_bf16_flops must be a positive"]),
        ("mem_bw_bytes_per_s", ["give FIELD=xFACTOR or FIELD=VALUE"]),
        ("sm_count=100.5", ["sm_count is a whole number"]),
        ("peak_flops=1e15", ["peak_flops is a group", "takes a factor only"]),
    ],
)
def test_set_validation_names_the_field_and_the_fix(setting, needles):
    text = _one_line(parse_setting, setting)
    for needle in needles:
        assert needle in text


def test_set_refuses_multiplying_a_null_spec_and_setting_twice():
    text = _one_line(derive_device, A100, ["peak_fp8_flops=x2"])
    assert "A100-SXM4-80GB has no peak_fp8_flops (null) to multiply" in text and "peak_fp8_flops=1e15" in text
    assert "already set by" in _one_line(derive_device, H100, ["peak_flops=x2", "peak_bf16_flops=x2"])
    assert "already set by" in _one_line(derive_device, H100, ["mem_bytes=x2", "mem_bytes=x3"])
    assert "unknown field" in _one_line(get_device, "H100-SXM[bogus=x2]")


# --------------------------------------------------------------------------- exact scaling


def test_every_throughput_spec_x2_is_exactly_2x_on_a_single_gpu():
    """One GPU, no collectives: every kernel is roofline-bound, so compute and memory time halve exactly."""
    x2 = derive_device(H100, THROUGHPUT)
    a, b = predict(SINGLE_GPU, H100), predict(SINGLE_GPU, x2)
    assert a.split.communication_s == 0 and a.split.compute_bound_s > 0 and a.split.memory_bound_s > 0
    assert a.time_s / b.time_s == pytest.approx(2.0, rel=1e-12)
    for part in ("compute_bound", "memory_bound"):
        assert getattr(a.split, f"{part}_s") == pytest.approx(2 * getattr(b.split, f"{part}_s"), rel=1e-12)


@pytest.mark.parametrize("workload", [SMALL_TRAIN, SMALL_INFER], ids=["train", "infer"])
def test_every_throughput_spec_x2_is_exactly_2x_without_collective_latency(workload, no_latency):
    """With the alpha-beta latencies zeroed, link bandwidth x2 halves every collective too, and
    everything built on top (exposed overlap, pipeline bubble, TTFT, TPOT) halves with it."""
    x2 = derive_device(H100, THROUGHPUT)
    a, b = predict(workload, H100), predict(workload, x2)
    assert a.split.communication_s > 0
    assert a.time_s / b.time_s == pytest.approx(2.0, rel=1e-12)
    for part in SPLIT_PARTS:
        assert getattr(a.split, f"{part}_s") == pytest.approx(2 * getattr(b.split, f"{part}_s"), rel=1e-12, abs=1e-15)
    if workload.kind == "infer":
        assert a.result.ttft_s / b.result.ttft_s == pytest.approx(2.0, rel=1e-12)
        assert a.result.tpot_s / b.result.tpot_s == pytest.approx(2.0, rel=1e-12)


def test_with_collective_latency_only_the_bandwidth_term_scales():
    """The decision documented in opcast.predict.whatif: a faster link does not shorten NCCL's
    per-step latencies, so kernels halve exactly and communication gains less than 2x."""
    x2 = derive_device(H100, THROUGHPUT)
    a, b = predict(SMALL_TRAIN, H100), predict(SMALL_TRAIN, x2)
    assert a.split.compute_bound_s == pytest.approx(2 * b.split.compute_bound_s, rel=1e-12)
    assert a.split.memory_bound_s == pytest.approx(2 * b.split.memory_bound_s, rel=1e-12)
    assert 1.0 < a.split.communication_s / b.split.communication_s < 2.0
    assert 1.0 < a.time_s / b.time_s < 2.0


def test_learned_only_fields_do_not_move_the_roofline():
    other = derive_device(H100, ["l2_bytes=x2", "boost_clock_hz=x2", "fp32_lanes_per_sm=x2", "mem_bytes=x2"])
    assert predict(SMALL_TRAIN, other).time_s == predict(SMALL_TRAIN, H100).time_s
    # more SMs: NCCL's channels beside the hidden gradient reduction take a smaller share; kernels unchanged
    more = predict(SMALL_TRAIN, derive_device(H100, ["sm_count=x2"])).result.breakdown_s
    base = predict(SMALL_TRAIN, H100).result.breakdown_s
    assert more["dp_comm_exposed"] < base["dp_comm_exposed"]
    assert {k: v for k, v in more.items() if k != "dp_comm_exposed"} == {
        k: v for k, v in base.items() if k != "dp_comm_exposed"
    }


def test_memory_bandwidth_speeds_up_exactly_the_memory_bound_share_while_nothing_crosses():
    x = derive_device(H100, ["mem_bw_bytes_per_s=x1.01"])
    a, b = predict(SINGLE_GPU, H100), predict(SINGLE_GPU, x)
    assert b.split.compute_bound_s == pytest.approx(a.split.compute_bound_s, rel=1e-12)
    assert b.split.memory_bound_s == pytest.approx(a.split.memory_bound_s / 1.01, rel=1e-12)


# --------------------------------------------------------------------------- time split


@pytest.mark.parametrize(
    "workload",
    [
        SMALL_TRAIN,
        SMALL_INFER,
        Workload(
            kind="train",
            arch=load_arch("llama2-7b"),
            config=TrainConfig(
                tp=2,
                pp=4,
                dp=1,
                global_batch=16,
                seq=2048,
                schedule="interleaved",
                virtual_stages=2,
                recompute="selective",
            ),
        ),
    ],
    ids=["train", "infer", "interleaved"],
)
def test_time_split_and_phases_add_up_to_the_headline_time(workload):
    out = predict(workload, A100)
    split = out.split
    assert math.fsum(getattr(split, f"{p}_s") for p in SPLIT_PARTS) == pytest.approx(split.total_s, rel=1e-9)
    assert sum(split.share(p) for p in SPLIT_PARTS) == pytest.approx(1.0)
    if workload.kind == "train":
        assert split.total_s == out.result.iteration_time_s
        assert math.fsum(split.by_phase.values()) == pytest.approx(split.total_s, rel=1e-9)
        assert next(iter(split.by_phase)) == "compute:gemm"
    else:
        r = out.result
        prefill = math.fsum(v for k, v in split.by_phase.items() if k.startswith("prefill/"))
        decode = math.fsum(v for k, v in split.by_phase.items() if k.startswith("decode_step/"))
        assert prefill == pytest.approx(r.ttft_s, rel=1e-9) and decode == pytest.approx(r.tpot_s, rel=1e-9)
        assert split.total_s == pytest.approx(r.total_latency_s)


# --------------------------------------------------------------------------- explore / compare


def test_explore_grid_shape_columns_and_speedups():
    result = explore(SMALL_TRAIN, H100, {"mem_bw_bytes_per_s": (1, 2), "peak_flops": (1, 1.5, 4)})
    frame = result.frame()
    assert frame.shape == (6, 2 + len(EXPLORE_COLUMNS["train"]))
    assert list(frame.columns) == ["x_mem_bw_bytes_per_s", "x_peak_flops", *EXPLORE_COLUMNS["train"]]
    assert list(zip(frame["x_mem_bw_bytes_per_s"], frame["x_peak_flops"])) == [
        (1, 1),
        (1, 1.5),
        (1, 4),
        (2, 1),
        (2, 1.5),
        (2, 4),
    ]
    assert frame["gpu"][0] == "H100-SXM" and frame["gpu"][5] == "H100-SXM[mem_bw_bytes_per_s=x2,peak_flops=x4]"
    assert frame["speedup"][0] == 1.0 and (frame["speedup"][1:] > 1).all()
    assert frame["speedup"][2] > frame["speedup"][1]  # more compute, faster
    shares = frame[[f"{p}_share" for p in SPLIT_PARTS]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    # the bottleneck moves: more FLOP/s leaves communication a larger share
    assert frame["communication_share"][2] > frame["communication_share"][0]


def test_explore_infer_has_ttft_and_tpot_speedups():
    frame = explore(SMALL_INFER, H100, {"mem_bw_bytes_per_s": (1, 2, 4)}).frame()
    assert list(frame.columns) == ["x_mem_bw_bytes_per_s", *EXPLORE_COLUMNS["infer"]]
    assert (np.diff(frame["tpot_speedup"]) > 0).all()  # decode is bandwidth-bound
    assert frame["tpot_speedup"][2] > frame["ttft_speedup"][2]


def test_explore_refuses_a_factor_that_makes_no_gpu_naming_vary_before_any_prediction(monkeypatch):
    # it said '--set on H100-SXM' (or '--set ...: give an absolute value', which --vary cannot) after the base ran
    from opcast.predict import whatif

    monkeypatch.setattr(whatif, "predict", lambda *a: pytest.fail("predicted before the grid was checked"))
    text = _one_line(explore, SMALL_TRAIN, H100, {"mem_bw_bytes_per_s": (1, 1e-300)})
    assert text.startswith("--vary mem_bw_bytes_per_s=1e-300 on H100-SXM: 'mem_bw_bytes_per_s' must be at least 1")
    text = _one_line(explore, SMALL_TRAIN, H100, {"peak_fp4_flops": (2,)})
    assert text == "--vary peak_fp4_flops=2: H100-SXM has no peak_fp4_flops (null) to scale; vary a spec it has"


def test_explore_refuses_an_infeasible_base_and_reports_infeasible_points():
    bad = Workload(kind="train", arch=load_arch("llama2-7b"), config=TrainConfig(tp=3))
    assert "tp=3 does not divide" in _one_line(explore, bad, H100, {"mem_bw_bytes_per_s": (1, 2)})
    # a point whose node holds fewer GPUs than tp x pp x dp needs: a reason, no time, the grid goes on
    w = Workload(kind="train", arch=load_arch("gpt3-350m"), config=TrainConfig(tp=8, global_batch=8, seq=1024))
    frame = explore(w, H100, {"gpus_per_node": (1, 0.75)}).frame()
    assert frame["feasible"].tolist() == [True, False] and math.isnan(frame["iteration_time_s"][1])
    assert "world size" in frame["reasons"][1]


@pytest.mark.parametrize(
    "items,needle",
    [
        (["mem_bw_bytes_per_s"], "give FIELD=F1,F2"),
        (["mem_bw_bytes_per_s=1,0"], "must be a positive"),
        (["membw=1,2"], "unknown field 'membw'"),
        (["mem_bw_bytes_per_s=1,2", "mem_bw_bytes_per_s=4"], "given twice"),
        (["mem_bw_bytes_per_s=1,1"], "repeats a factor"),
        (["mem_bw_bytes_per_s=1,,2"], "empty factor"),
        (["mem_bw_bytes_per_s=1,2,"], "empty factor"),
        (["peak_flops=1,2", "peak_bf16_flops=1,2"], "already scales"),
        ([], "at least one --vary"),
    ],
)
def test_vary_validation(items, needle):
    assert needle in _one_line(parse_vary, items)


def test_vary_accepts_factors_with_or_without_x():
    assert parse_vary(["mem_bw_bytes_per_s=1,x1.5,2", "peak_flops=x4"]) == {
        "mem_bw_bytes_per_s": (1.0, 1.5, 2.0),
        "peak_flops": (4.0,),
    }


def test_compare_ratios_to_the_first_gpu_per_phase():
    result = compare(SMALL_TRAIN, [A100, H100, get_device("B200")])
    frame = result.frame()
    assert frame["phase"][0] == "iteration"
    assert (frame["A100-SXM4-80GB_speedup"].dropna() == 1.0).all()
    it = frame.set_index("phase")
    assert it.loc["iteration", "H100-SXM_speedup"] == pytest.approx(
        it.loc["iteration", "A100-SXM4-80GB_s"] / it.loc["iteration", "H100-SXM_s"]
    )
    assert 1 < it.loc["iteration", "H100-SXM_speedup"] < it.loc["iteration", "B200_speedup"]
    assert {"compute:gemm", "tp_comm", "pipeline_bubble"} <= set(frame["phase"])
    assert "needs at least two GPUs" in _one_line(compare, SMALL_TRAIN, [A100])
    assert "more than once" in _one_line(compare, SMALL_TRAIN, [A100, A100])


def test_gpu_lists_keep_derived_names_whole():
    assert split_gpu_list("A100, H100-SXM[mem_bw_bytes_per_s=x2,peak_flops=x1.5] ,B200") == [
        "A100",
        "H100-SXM[mem_bw_bytes_per_s=x2,peak_flops=x1.5]",
        "B200",
    ]


def test_gpu_lists_are_bounded_as_explores_grid():
    """Each of compare's --gpus is a full prediction: the list had no bound (explore's grid has MAX_POINTS)."""
    from opcast.predict.whatif import MAX_POINTS

    names = [f"H100-SXM[sm_count={i}]" for i in range(1, MAX_POINTS + 2)]
    assert len(split_gpu_list(",".join(names[:MAX_POINTS]))) == MAX_POINTS
    message = _one_line(split_gpu_list, ",".join(names))
    assert f"--gpus names {MAX_POINTS + 1} GPUs (> {MAX_POINTS}, each a full prediction); compare fewer" in message


# --------------------------------------------------------------------------- bottleneck


def test_bottleneck_of_a_big_gemm_and_a_decode_gemm():
    big = kernel("gemm", {"b": 1, "m": 8192, "n": 8192, "k": 8192}, "bf16")
    b = bottleneck(big, H100, RooflineKernelCost().predict_s([big], H100)[0])
    assert b.bound == "compute" and b.intensity > b.ridge == pytest.approx(989.4e12 / 3.35e12)
    assert b.compute_utilisation == pytest.approx(0.95, rel=1e-6)  # Calculon's matrix efficiency at >= 128 GFLOP
    decode = kernel("gemm", {"b": 1, "m": 8, "n": 8192, "k": 8192}, "bf16")
    d = bottleneck(decode, H100, 1e-4)
    assert d.bound == "memory" and d.intensity == pytest.approx(8, rel=0.01) and d.intensity < d.ridge
    assert d.memory_utilisation == pytest.approx(decode.bytes_moved() / (1e-4 * H100.mem_bw_bytes_per_s))
    copy = kernel("elementwise", {"numel": 1 << 20, "fn": "copy"}, "bf16")
    assert bottleneck(copy, H100, 1e-5).bound == "memory"


# --------------------------------------------------------------------------- hardware range of learned models


class _RangedSet:
    """A model set fitted (so its meta says) on A100 and H100: gemm fwd, 1 ms per call."""

    def __init__(self, feature_ranges=None):
        from opcast.hardware import device_to_dict

        entry = {
            "op": "gemm",
            "devices": ["A100-SXM4-80GB", "H100-SXM"],
            "features": ["log_flops", "log_peak_flops", "log_mem_bw_bytes_per_s", "log_sm_count"],
        }
        if feature_ranges:
            entry["feature_ranges"] = feature_ranges
        self.meta = {
            "predictors": {"gemm-fwd-half": entry},
            "device_specs": {n: device_to_dict(get_device(n)) for n in entry["devices"]},
        }

    def covers(self, op, dtype, direction):
        return op == "gemm" and direction == "fwd" and dtype in ("bf16", "fp16")

    def predict_s(self, frame, device):
        return np.full(len(frame), 1e-3)


GEMM = kernel("gemm", {"b": 1, "m": 1024, "n": 1024, "k": 1024}, "bf16")


def test_learned_times_outside_the_fitted_hardware_are_flagged():
    model = KernelCostModel(sources=(LearnedKernelCost(_RangedSet(), "fake"), RooflineKernelCost()))
    inside = derive_device(H100, ["mem_bw_bytes_per_s=2.5e12", "peak_bf16_flops=x0.8"])  # between A100 and H100
    assert model.time_s(GEMM, inside) == (1e-3, LEARNED) and model.range_flag(GEMM, inside) is None
    assert model.time_s(GEMM, H100) == (1e-3, LEARNED) and model.range_flag(GEMM, H100) is None
    h200 = get_device("H200")
    assert model.time_s(GEMM, h200) == (1e-3, LEARNED)
    flag = model.range_flag(GEMM, h200)
    assert "mem_bw_bytes_per_s 4.8e+12 above 2.04e+12..3.35e+12" in flag and "extrapolates" in flag
    assert "peak_flops" not in flag  # H200 has H100's peak: inside
    b200 = get_device("B200")
    model.time_s(GEMM, b200)
    flag = model.range_flag(GEMM, b200)
    assert "peak_flops" in flag and "sm_count 148 above 108..132" in flag
    assert "l2_bytes" not in flag  # not a feature of this predictor
    assert "shape ranges are not recorded" in " ".join(model.describe()["notes"])


def test_analytic_mode_replaces_out_of_range_learned_times_with_the_roofline():
    model = KernelCostModel(sources=(LearnedKernelCost(_RangedSet(), "fake"), RooflineKernelCost()), in_range_only=True)
    h200 = get_device("H200")
    t, source = model.time_s(GEMM, h200)
    assert source == ROOFLINE and t == RooflineKernelCost().predict_s([GEMM], h200)[0]
    assert "roofline used instead (--analytic)" in model.range_flag(GEMM, h200)
    assert model.time_s(GEMM, H100) == (1e-3, LEARNED)
    assert model.describe()["learned_out_of_range"] == "roofline"


def test_recorded_feature_ranges_are_checked_too():
    flops = float(np.log(GEMM.flops() + 1.0))
    model = KernelCostModel(
        sources=(LearnedKernelCost(_RangedSet({"log_flops": [flops - 5, flops - 1]}), "fake"), RooflineKernelCost())
    )
    model.time_s(GEMM, H100)
    assert "feature log_flops" in model.range_flag(GEMM, H100)
    assert not any("shape ranges are not recorded" in n for n in model.describe()["notes"])


def test_a_model_set_without_device_specs_is_said_to_be_unchecked():
    class _Bare(_RangedSet):
        def __init__(self):
            super().__init__()
            del self.meta["device_specs"]

    model = KernelCostModel(sources=(LearnedKernelCost(_Bare(), "fake"), RooflineKernelCost()))
    model.time_s(GEMM, get_device("B200"))
    assert model.range_flag(GEMM, get_device("B200")) is None
    assert "not range-checked" in " ".join(model.describe()["notes"])
