"""``opcast.predict.cost.published``: FlashAttention-1-generation attention (registry ``impl`` ``flash1``)
priced at FlashAttention-1's measured rate on the GPUs the figures measured and extrapolated at the
nearest architecture's share of peak elsewhere (labelled so); the learned attention models never
answer for it; ``predict train --framework foundry`` shows the source; a bad ``--attention`` is one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.hardware import derive_device, get_device
from opcast.ops import ATTENTION_IMPLS, get_op
from opcast.predict.cost import LearnedKernelCost, load_kernel_cost
from opcast.predict.cost.published import (
    FA1_FWD_BWD_TFLOPS,
    FA1_SEQS,
    PublishedAttentionCost,
    figure_rate_flop_per_s,
    nearest_figure,
)
from opcast.predict.cost.query import kernel

from helpers.fakes import FixedModelSet

A100, H100 = get_device("A100-SXM4-80GB"), get_device("H100-SXM")
REPO_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200_torch"


def _attn(seq=8192, head_dim=128, causal=True, direction="fwd", batch=2, impl="flash1", dtype="bf16"):
    params = {"batch": batch, "heads": 16, "kv_heads": 16, "head_dim": head_dim, "seq_q": seq, "seq_kv": seq}
    return kernel("attention", {**params, "causal": causal, "impl": impl}, dtype, direction)


def test_the_published_families_are_appended_so_the_measured_ones_keep_their_codes():
    assert ATTENTION_IMPLS == ("flash", "sdpa", "eager")  # impl_code 0, 1, 2 (train.features), norms after them
    impl = next(p for p in get_op("attention").params if p.name == "impl")
    assert impl.choices == ("flash", "sdpa", "eager", "flash1", "flash2")
    # the same FLOPs and bytes as flash (tiled, S recomputed in backward)
    for d in ("fwd", "bwd"):
        a, b = _attn(direction=d), _attn(direction=d, impl="flash")
        assert (a.flops(), a.bytes_moved()) == (b.flops(), b.bytes_moved())


def test_the_rate_is_the_figures_at_its_points_and_held_beyond_them():
    for (gpu, causal, hd), speeds in FA1_FWD_BWD_TFLOPS.items():
        assert len(speeds) == len(FA1_SEQS)
        for seq, tflops in zip(FA1_SEQS, speeds, strict=True):
            assert figure_rate_flop_per_s(gpu, causal, hd, seq) == pytest.approx(tflops * 1e12)
        assert figure_rate_flop_per_s(gpu, causal, hd, 65536) == pytest.approx(speeds[-1] * 1e12)
        assert figure_rate_flop_per_s(gpu, causal, hd, 128) == pytest.approx(speeds[0] * 1e12)


def test_interpolation_is_log2_in_the_sequence_and_linear_in_the_head_dim():
    # 2896 ~ 2^11.5 lies halfway between 2048 (69) and 4096 (76): A100, causal, head dim 128
    assert figure_rate_flop_per_s("A100", True, 128, 2896) / 1e12 == pytest.approx(72.5, abs=0.05)
    # head dim 96 halfway between 64 (77) and 128 (69) at 2048; 32 holds 64's, 256 holds 128's
    assert figure_rate_flop_per_s("A100", True, 96, 2048) / 1e12 == pytest.approx(73.0)
    assert figure_rate_flop_per_s("A100", True, 32, 2048) / 1e12 == pytest.approx(77.0)
    assert figure_rate_flop_per_s("H100", False, 256, 2048) / 1e12 == pytest.approx(128.0)


def test_forward_plus_backward_takes_the_figures_time_on_a_measured_gpu():
    src = PublishedAttentionCost()
    fwd, bwd = _attn(), _attn(direction="bwd")
    t = src.predict_s([fwd, bwd], A100)
    # FlashAttention-2's benchmark: 4 b s^2 h d / 2 (causal) x 3.5 FLOPs at 80 TFLOP/s (A100, causal, d 128, 8k)
    flops = 4 * 2 * 8192**2 * 16 * 128 / 2 * 3.5
    assert t.sum() == pytest.approx(flops / 80e12, rel=2e-4)  # opcast counts the diagonal: s(s+1)/2 pairs
    assert t[1] / t[0] == pytest.approx(2.5)
    assert src.source_label(fwd, A100) == "published/flash1"
    # the 40GB A100 is the same chip; a catalog GPU on another network is still the GPU the figure measured
    assert src.predict_s([fwd], get_device("A100-SXM4-40GB"))[0] == pytest.approx(t[0])
    cluster_h100 = derive_device(H100, ["inter_node_bw_bytes_per_s=x2"])
    assert nearest_figure(cluster_h100) == ("H100", False)
    assert src.predict_s([fwd], cluster_h100)[0] == pytest.approx(src.predict_s([fwd], H100)[0])
    assert src.predict_s([fwd], H100)[0] == pytest.approx(fwd.flops() / 135e12)


@pytest.mark.parametrize(
    ("gpu", "figure", "figure_peak"),
    [("B200", "H100", 989.4e12), ("H200", "H100", 989.4e12), ("L40S", "A100", 312e12), ("A10", "A100", 312e12)],
)
def test_another_gpu_runs_at_the_nearest_architectures_share_of_its_own_peak(gpu, figure, figure_peak):
    src, dev, k = PublishedAttentionCost(), get_device(gpu), _attn(4096, head_dim=64, causal=False)
    rate = {"H100": 161e12, "A100": 108e12}[figure]  # the figure's non-causal head-dim-64 bar at 4096
    expected = k.flops() / (rate / figure_peak * dev.peak_bf16_flops)
    assert src.predict_s([k], dev)[0] == pytest.approx(expected)
    assert nearest_figure(dev) == (figure, True)
    assert src.source_label(k, dev) == f"published/flash1/extrapolated-from-{figure}"
    assert any(gpu in n and "extrapolated" in n and f"nearest measured architecture {figure}" in n for n in src.notes)


def test_a_spec_changed_gpu_is_an_extrapolation_and_half_precision_only_is_covered():
    src = PublishedAttentionCost()
    faster = derive_device(A100, ["peak_bf16_flops=x2"])
    assert nearest_figure(faster) == ("A100", True)
    assert src.predict_s([_attn()], faster)[0] == pytest.approx(src.predict_s([_attn()], A100)[0] / 2)
    assert src.covers(_attn()) and src.covers(_attn(dtype="fp16"))
    assert not src.covers(_attn(impl="flash")) and not src.covers(_attn(dtype="fp32"))
    assert not src.covers(kernel("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}, "bf16"))
    # a device without the dtype's peak: no answer (the roofline then says why)
    assert math.isnan(src.predict_s([_attn()], get_device("V100-SXM2-32GB"))[0])


def _entry(impl_devices):
    return {"features": ["log_flops", "impl_code"], "feature_ranges": {"impl_code": [0.0, 0.0]}, **impl_devices}


def test_the_learned_attention_model_does_not_answer_for_flash1_without_its_data():
    src = LearnedKernelCost(
        FixedModelSet({"attention-fwd-half": _entry({"impl_devices": {"flash": ["A100-SXM4-80GB"]}})}), "x"
    )
    assert src.covers(_attn(impl="flash")) and not src.covers(_attn())
    assert any("no data of impl flash1" in n for n in src.range.notes)
    # sdpa and eager are priced as before (attention's measured families are not held to impl_devices)
    assert src.covers(_attn(impl="eager"))
    # a set without impl_devices, or fitted before impl was recorded, has no data of it either
    assert not LearnedKernelCost(FixedModelSet({"attention-fwd-half": _entry({})}), "x").covers(_attn())
    assert not LearnedKernelCost(FixedModelSet({"attention-fwd-half": {"features": ["log_flops"]}}), "x").covers(
        _attn()
    )
    # a set that records devices that measured it speaks for it
    measured = _entry({"impl_devices": {"flash": ["A100-SXM4-80GB"], "flash1": ["A100-SXM4-80GB"]}})
    assert LearnedKernelCost(FixedModelSet({"attention-fwd-half": measured}), "x").covers(_attn())


def test_the_default_chain_prices_flash1_from_the_figures_and_nothing_else():
    model = load_kernel_cost()
    flash1, flash = _attn(), _attn(impl="flash")
    gemm = kernel("gemm", {"b": 1, "m": 4096, "n": 4096, "k": 4096}, "bf16")
    assert model.time_s(flash1, A100) == (
        pytest.approx(PublishedAttentionCost().predict_s([flash1], A100)[0]),
        "published/flash1",
    )
    assert model.time_s(flash, A100)[1] == "learned" and model.time_s(gemm, A100)[1] == "learned"
    assert model.time_s(flash1, get_device("B200"))[1] == "published/flash1/extrapolated-from-H100"
    assert model.time_s(_attn(dtype="fp32"), A100)[1] == "roofline"
    notes = model.describe()["notes"]
    assert any("flash1 attention on A100-SXM4-80GB" in n for n in notes)
    assert any("flash1 attention on B200: extrapolated" in n for n in notes)
    # --roofline prices every kernel by the roofline, flash1 too
    assert load_kernel_cost(use_learned=False).time_s(flash1, A100)[1] == "roofline"


_TRAIN = [
    sys.executable, "-m", "opcast", "predict", "train", "--arch", "mpt-125m", "--nodes", "1", "--gpus-per-node", "8",
    "--micro-batch", "4", "--global-batch", "64", "--seq", "2048", "--precision", "bf16", "--zero", "3",
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpu", "label"), [("A100-SXM4-80GB", "published/flash1"), ("B200", "published/flash1/extrapolated-from-H100")]
)
def test_predict_train_with_framework_foundry_prices_attention_from_the_figures(gpu, label):
    done = subprocess.run(
        [*_TRAIN, "--gpu", gpu, "--framework", "foundry", "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    attention = [o for o in out["ops"] if o["kind"] == "attention"]
    assert attention and all(o["params"]["impl"] == "flash1" and o["source"] == label for o in attention)
    assert out["cost_sources"]["unique_kernels_by_source"][label] == len({o["direction"] for o in attention})
    assert all(o["source"] in ("learned", "roofline") for o in out["ops"] if o["kind"] != "attention")


def test_a_bad_attention_name_is_one_line_and_exit_2():
    done = subprocess.run(
        [*_TRAIN, "--gpu", "A100-SXM4-80GB", "--attention", "flash3"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "attention='flash3'" in done.stderr and "flash" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- flash2 (FlashAttention-2 on Hopper+)


def test_the_flash2_rate_is_the_h100_figures_at_its_points():
    from opcast.predict.cost.published import FA2_FWD_BWD_TFLOPS

    assert {g for g, _, _ in FA2_FWD_BWD_TFLOPS} == {"H100"}
    for (gpu, causal, hd), speeds in FA2_FWD_BWD_TFLOPS.items():
        for seq, tflops in zip(FA1_SEQS, speeds, strict=True):
            assert figure_rate_flop_per_s(gpu, causal, hd, seq, "flash2") == pytest.approx(tflops * 1e12)
    # FlashAttention-2 ran about twice FlashAttention-1 on the same H100 figure (causal, head dim 128, 4k: 294 / 126)
    fa2, fa1 = (figure_rate_flop_per_s("H100", True, 128, 4096, impl) for impl in ("flash2", "flash1"))
    assert fa2 / fa1 == pytest.approx(294 / 126)


def test_flash2_figure_prices_h100_and_is_extrapolated_from_it_elsewhere():
    assert nearest_figure(H100, "flash2") == ("H100", False)
    for name in ("H200", "B200", "A100-SXM4-80GB"):
        assert nearest_figure(get_device(name), "flash2") == ("H100", True)
    cost = PublishedAttentionCost()
    k = _attn(seq=4096, impl="flash2")
    # H200 has H100's dense bf16 peak: the same rate, labelled as extrapolated
    assert cost.rate_flop_per_s(k, get_device("H200")) == pytest.approx(cost.rate_flop_per_s(k, H100))
    assert cost.source_label(k, get_device("H200")) == "published/flash2/extrapolated-from-H100"
    assert cost.source_label(k, H100) == "published/flash2"


@pytest.mark.parametrize(
    ("framework", "attention", "gpu", "impl"),
    [
        ("hf", "flash", "H200", "flash2"),  # torch SDPA's flash backend on Hopper: FlashAttention-2's kernels
        ("neox", "flash", "B200", "flash2"),
        ("hf-liger", "flash", "H100-SXM", "flash2"),
        ("hf", "flash", "A100-SXM4-80GB", "flash"),  # on Ampere the learned flash measured FlashAttention-2
        (None, "flash", "H200", "flash"),  # Megatron's Transformer Engine runs cuDNN's attention
        ("megatron", "flash", "H100-SXM", "flash"),
        ("foundry", "flash", "H200", "flash1"),
        (None, "flash2", "A100-SXM4-80GB", "flash"),
        (None, "flash2", "GH200", "flash2"),
        ("hf", "eager", "H200", "eager"),
        ("torch", "flash", "H100-SXM", "flash2"),
        ("torch", "flash", "A100-SXM4-80GB", "flash"),
    ],
)
def test_the_graph_picks_flash2_where_it_is_a_family_of_its_own(framework, attention, gpu, impl):
    from opcast.predict.graph import precision_of

    prec = precision_of("bf16", framework=framework, device=get_device(gpu), training=True)
    params = {"batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 128, "seq_q": 512, "seq_kv": 512, "causal": True}
    assert prec.of("attention", {**params, "impl": attention}).param_dict["impl"] == impl
    # without a device (inference engines, which name their own kernels) flash2 is flash
    assert (
        precision_of("bf16", framework=framework).of("attention", {**params, "impl": "flash2"}).param_dict["impl"]
        == "flash"
    )


def test_predict_train_with_framework_hf_prices_hopper_attention_from_the_fa2_figure():
    done = subprocess.run(
        [*_TRAIN, "--gpu", "H100-SXM", "--framework", "hf", "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    attention = [o for o in json.loads(done.stdout)["ops"] if o["kind"] == "attention"]
    assert attention and all(o["params"]["impl"] == "flash2" and o["source"] == "published/flash2" for o in attention)


def test_a_set_fitted_on_measured_flash2_rows_speaks_for_flash2_where_they_were_measured(tmp_path):
    # collect labels torch's flash backend flash2 on Hopper: the H200 rows, labelled so, fit a set that prices
    # flash2 on the H200 from its own measurements (learned), not from the published figure
    from opcast.schema import read_dataset
    from opcast.train.artifacts import write_model_set
    from opcast.train.fit import FitConfig, fit_frame

    data = REPO_DATA / "kernels"
    rows = read_dataset([data / "collect", data / "calibrate"])
    rows = rows[(rows["op"] == "attention") & rows["dtype"].isin(["bf16", "fp16"])].copy()
    rows.loc[rows["impl"] == "flash", "impl"] = "flash2"
    cfg = FitConfig(estimator="xgb", folds=0, min_rows=15, n_jobs=1, xgb_params={"n_estimators": 40})
    groups, _, skipped = fit_frame(rows.reset_index(drop=True), {"H200": get_device("H200")}, cfg)
    assert {"attention-fwd-half", "attention-bwd-half"} <= set(groups), skipped
    model = load_kernel_cost(write_model_set(tmp_path, "s", groups, {"datasets": []}))
    flash2 = _attn(seq=4096, impl="flash2")
    assert model.time_s(flash2, get_device("H200"))[1] == "learned"
    assert load_kernel_cost().time_s(flash2, get_device("H200"))[1] == "published/flash2/extrapolated-from-H100"
