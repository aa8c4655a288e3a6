"""A training step's compute-bound tensor-core kernels at the sustained clock (opcast.predict.cost.sustained)."""

import dataclasses

import pytest

from opcast.archs import load_arch
from opcast.hardware import derive_device, get_device
from opcast.predict.cost import kernel, roofline_only
from opcast.predict.cost.sustained import AT_CAP_UTILISATION, SUSTAINED, at_cap, sustained_clock, sustained_times
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train

H100 = get_device("H100-SXM")
A100 = get_device("A100-SXM4-80GB")
BIG = kernel("gemm", {"m": 8192, "n": 8192, "k": 8192}, "bf16", "fwd", True)
FRACTION = 755 / 852.1


def test_fractions_are_the_measured_ratios():
    assert SUSTAINED["H200"].fraction == pytest.approx(FRACTION)
    assert SUSTAINED["B200"].fraction == pytest.approx(1439 / 1746.7)
    assert sustained_clock(H100) is SUSTAINED["H200"]  # one die at one board power
    assert sustained_clock(get_device("H800")) is SUSTAINED["H200"]
    assert sustained_clock(get_device("GH200")) is None  # the die at 1000 W: not what was measured
    assert sustained_clock(A100) is None  # nothing measured: burst times kept


def test_a_gpu_made_from_a_catalog_gpu_keeps_its_clock():
    assert sustained_clock(derive_device(H100, ["inter_node_bw_bytes_per_s=x2"])) is SUSTAINED["H200"]
    assert sustained_clock(derive_device(H100, ["peak_bf16_flops=x2"])) is SUSTAINED["H200"]
    # a device file of the die at the same board power is that measurement's GPU; at another power it is not
    assert sustained_clock(dataclasses.replace(H100, name="my-gpu", aliases=())) is SUSTAINED["H200"]
    assert sustained_clock(dataclasses.replace(H100, name="my-gpu", aliases=(), tdp_w=350.0)) is None


def test_only_kernels_near_the_peak_slow_down():
    peak = H100.peak_flops("bf16")
    fast = BIG.flops() / (0.8 * peak)  # 80 % of the dense peak in a burst: at the power cap
    slow = BIG.flops() / (0.8 * AT_CAP_UTILISATION * peak)  # 40 %: memory- or latency-bound, under the cap
    norm = kernel("elementwise", {"numel": 2**28, "fn": "mul_scalar"}, "bf16", "fwd")
    assert at_cap(BIG, fast, H100) and not at_cap(BIG, slow, H100) and not at_cap(norm, 1e-9, H100)
    out, slowed = sustained_times({BIG: (fast, "learned"), norm: (1e-3, "learned")}, H100)
    assert slowed == 1
    assert out[BIG] == (pytest.approx(fast / FRACTION), "learned")
    assert out[norm] == (1e-3, "learned")
    assert sustained_times({BIG: (slow, "learned")}, H100) == ({BIG: (slow, "learned")}, 0)


def test_a_gpu_without_a_measurement_gets_its_table_back():
    table = {BIG: (1e-3, "learned")}
    assert sustained_times(table, A100) == (table, 0) and sustained_times(table, A100)[0] is table


def _step(clocks: str):
    cfg = TrainConfig(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq=2048, clocks=clocks)
    return predict_train(load_arch("llama3-8b"), H100, cfg, kernels=roofline_only("test"))


def test_a_step_prices_its_compute_bound_kernels_at_the_sustained_clock_and_boost_at_the_burst():
    sustained, boost = _step("sustained"), _step("boost")
    burst = {o.kernel: o.time_s for o in boost.ops}
    slowed = [o for o in sustained.ops if at_cap(o.kernel, burst[o.kernel], H100)]
    assert any(o.kernel.kind == "gemm" for o in slowed) and any(o.kernel.kind == "attention" for o in slowed)
    for o in sustained.ops:
        assert o.time_s == pytest.approx(burst[o.kernel] / FRACTION if o in slowed else burst[o.kernel], rel=1e-12)
    assert boost.iteration_time_s < sustained.iteration_time_s < boost.iteration_time_s / FRACTION
    (note,) = [n for n in sustained.cost_sources["notes"] if "sustained clock" in n]
    assert note.startswith(f"{len({o.kernel for o in slowed})} compute-bound") and "--clocks boost" in note
    assert not [n for n in boost.cost_sources.get("notes", []) if "sustained clock" in n]


@pytest.mark.parametrize("clocks", ["sustained", "boost"])
def test_search_ranks_at_the_clock_predict_train_prices(clocks):
    from opcast.predict import search as S

    arch, kernels = load_arch("llama3-8b"), roofline_only("test")
    space = S.SearchSpace(gpus=8, global_batch=8, seq=2048, clocks=clocks)
    result = S.search(arch, H100, space, top=1, workers=1, kernels=kernels)
    best = result.candidates[0]
    cfg = best.train_config(space)
    alone = predict_train(arch, H100, cfg, nodes=best.nodes, gpus_per_node=best.gpus_per_node, kernels=kernels)
    assert cfg.clocks == clocks
    assert best.iteration_time_s == alone.iteration_time_s  # the search composes the step as predict train prices it
    other = "boost" if clocks == "sustained" else "sustained"
    where = dict(nodes=best.nodes, gpus_per_node=best.gpus_per_node, kernels=kernels)
    elsewhere = predict_train(arch, H100, dataclasses.replace(cfg, clocks=other), **where)
    assert elsewhere.iteration_time_s != alone.iteration_time_s


def test_only_the_steps_own_kernels_are_slowed_and_counted_in_a_warm_cost_model():
    other = kernel("gemm", {"m": 4096, "n": 4096, "k": 4096}, "bf16", "fwd", True)
    peak = H100.peak_flops("bf16")
    table = {BIG: (BIG.flops() / (0.8 * peak), "learned"), other: (other.flops() / (0.8 * peak), "learned")}
    out, slowed = sustained_times(table, H100, [BIG])
    assert slowed == 1 and out[other] == table[other] and out[BIG][0] == pytest.approx(table[BIG][0] / FRACTION)
    kernels = roofline_only("test")  # one model, its cache warmed by another arch in between
    cfg = TrainConfig(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq=2048)

    def note(arch):
        r = predict_train(load_arch(arch), H100, cfg, kernels=kernels)
        return next(n for n in r.cost_sources["notes"] if "sustained clock" in n)

    first = note("llama3-8b")
    note("llama2-13b")
    assert note("llama3-8b") == first
