"""validate's pure parts: arch resolution, the profile's op groups, the report's JSON round trip,
and calibrate's planning (which op kinds, the point-time ceiling, the arch shapes first)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import pytest

from opcast.archs import load_arch
from opcast.check.calibrate import MAX_POINT_CAP_S, needed_ops
from opcast.check.validate import (
    CHECK_ARCHS,
    GroupCheck,
    PhaseCheck,
    ValidateReport,
    arch_file,
    group_times,
    profile_group,
    resolve_arch,
)
from opcast.errors import OpcastError


def test_check_archs_resolve_and_layers_override():
    gpt = resolve_arch("gpt2-124m")
    assert gpt.params_total() == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small
    short = resolve_arch("llama-style-125m", layers=3)
    assert short.n_layers == 3 and short.name == "llama-style-125m[layers=3]"
    assert resolve_arch("gpt3-125m").name == "gpt3-125m"  # presets still resolve


@pytest.mark.parametrize(
    "name, layers, match",
    [("gpt-7", None, "check archs gpt2-124m"), ("gpt2-124m", 0, "--layers"), ("gpt2-124m", True, "--layers")],
)
def test_bad_arch_inputs_name_the_fix(name, layers, match):
    with pytest.raises(OpcastError, match=match):
        resolve_arch(name, layers)


def test_arch_file_round_trips_through_load_arch(tmp_path):
    arch = replace(CHECK_ARCHS["llama-style-125m"], n_layers=6, name="llama[layers=6]")
    assert load_arch(arch_file(arch, tmp_path)) == arch


@pytest.mark.parametrize(
    "name, group",
    [
        ("aten::addmm", "gemm"),
        ("aten::linear", "gemm"),
        ("aten::bmm", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten::native_layer_norm_backward", "norm"),
        ("aten::_fused_rms_norm", "norm"),
        ("aten::_softmax", "softmax"),
        ("aten::cross_entropy_loss", "cross_entropy"),
        ("aten::nll_loss_backward", "cross_entropy"),
        ("aten::embedding_dense_backward", "embedding"),
        ("aten::gelu_backward", "elementwise"),
        ("aten::native_dropout", "elementwise"),
        ("Optimizer.step#AdamW.step", "optimizer"),
        ("opcast::optimizer", "optimizer"),
        ("aten::_fused_adamw_", "optimizer"),
        ("autograd::engine::evaluate_function: AddmmBackward0", None),
        ("aten::empty", None),
        ("AddmmBackward0", None),
    ],
)
def test_profile_groups_of_op_names(name, group):
    assert profile_group(name) == group


@dataclass
class _Event:
    name: str
    cpu_time_total: float
    self_cpu_time_total: float
    cpu_children: list = field(default_factory=list)
    cpu_parent: object = None
    device_type: str = "DeviceType.CPU"


def test_group_times_take_the_outermost_recognised_op():
    mm = _Event("aten::mm", 900.0, 900.0)
    sumb = _Event("aten::sum", 50.0, 50.0)
    node = _Event("AddmmBackward0", 1000.0, 50.0, [mm, sumb])
    wrapper = _Event("autograd::engine::evaluate_function: AddmmBackward0", 1100.0, 100.0, [node])
    linear = _Event("aten::linear", 2000.0, 10.0, [_Event("aten::addmm", 1990.0, 1990.0)])
    for child in (mm, sumb):
        child.cpu_parent = node
    node.cpu_parent = wrapper
    linear.cpu_children[0].cpu_parent = linear
    got = group_times([wrapper, node, mm, sumb, linear, linear.cpu_children[0]], cuda=False)
    assert got["gemm"] == pytest.approx((900 + 2000) * 1e-6)  # linear counted whole, once
    assert got["elementwise"] == pytest.approx(50e-6)
    assert got["other"] == pytest.approx(150e-6)  # the autograd wrapper's and node's own time
    assert sum(got.values()) == pytest.approx((1100 + 2000) * 1e-6)


def _report(**kw) -> ValidateReport:
    phases = tuple(
        PhaseCheck(
            phase=p,
            measured_s=1.0,
            measured_p20_s=0.9,
            measured_p80_s=1.1,
            predicted_s=1.1,
            predicted_as="iteration_time_s",
        )
        for p in ("forward", "backward", "optimizer", "total", "forward_nograd")
    )
    base = dict(
        arch="a",
        params=10,
        device="cpu-x",
        device_type="cpu",
        precision="fp32",
        attention="flash",
        batch=1,
        seq=8,
        world_size=1,
        threads=2,
        steps=3,
        warmup=1,
        models="m",
        phases=phases,
    )
    return ValidateReport(**{**base, **kw})


def test_report_errors_interval_and_json_round_trip():
    r = _report(
        iteration_time_interval_s=(0.95, 1.2),
        profile=(GroupCheck(group="gemm", measured_s=0.5, predicted_s=0.6, predicted_sources="learned 3"),),
    )
    assert r.total_error_pct == pytest.approx(10.0)
    assert r.inside_interval is True
    assert _report().inside_interval is None
    assert _report(iteration_time_interval_s=(1.05, 1.2)).inside_interval is False
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["phases"][3]["error_pct"] == pytest.approx(10.0) and doc["inside_interval"] is True
    assert ValidateReport.from_dict(doc) == r


def test_calibrate_measures_the_kinds_the_archs_need():
    gpt, llama = CHECK_ARCHS["gpt2-124m"], CHECK_ARCHS["llama-style-125m"]
    assert set(needed_ops([gpt])) == {
        "gemm",
        "attention",
        "elementwise",
        "embedding",
        "cross_entropy",
        "optimizer",
        "layernorm",
    }
    assert {"rmsnorm", "rope"} <= set(needed_ops([gpt, llama])) and "softmax" not in needed_ops([llama])


def test_calibrate_point_ceiling_covers_the_arch_shapes(tmp_path):
    from opcast.check.calibrate import max_point_s
    from opcast.collect.sampling import arch_shapes, roofline_s
    from opcast.hardware import get_device
    from opcast.ops import get_op

    spec = get_device("A100-SXM4-80GB")
    path = arch_file(CHECK_ARCHS["gpt2-124m"], tmp_path)
    ceiling = max_point_s([path], ((1, 256),), "fp32", spec, "cuda")
    worst = max(
        roofline_s(op, get_op(op).validate(p), "fp32", str(d), spec, "cuda")
        for op, p in arch_shapes([str(path)], (1,), batch_seq=((1, 256),))
        for d in get_op(op).directions(p)
    )
    assert worst <= ceiling <= MAX_POINT_CAP_S and ceiling >= 0.05


def test_shapes_past_the_memory_budget_do_not_raise_the_point_ceiling(tmp_path):
    """--batch 1 --batch 100000000: the second batch's shapes are never measured (past collection's memory
    budget), yet they raised the ceiling to the cap and the samples ran up to 2 s a call; only shapes
    within the budget count."""
    from opcast.check.calibrate import max_point_s
    from opcast.hardware import get_device

    spec = get_device("A100-SXM4-80GB")
    path = arch_file(CHECK_ARCHS["gpt2-124m"], tmp_path)
    small = max_point_s([path], ((1, 256),), "fp32", spec, "cuda")
    both = ((1, 256), (100_000_000, 256))
    assert small < MAX_POINT_CAP_S and max_point_s([path], both, "fp32", spec, "cuda") == MAX_POINT_CAP_S
    assert max_point_s([path], both, "fp32", spec, "cuda", max_bytes=2**30) == small


def test_arch_shapes_can_come_first_with_their_gradient_gemms():
    from opcast.collect.sampling import DeviceLimits, make_plan
    from opcast.hardware import get_device

    limits = DeviceLimits(spec=get_device("H100-SXM"), device_type="cuda", max_point_s=1.0, max_bytes=1e12)
    kwargs = dict(
        ops=("gemm", "layernorm"),
        dtypes=("bf16",),
        limits=limits,
        per_stratum=4,
        archs=("gpt3-125m",),
        tp_degrees=(1,),
        arch_batch_seq=((2, 256),),
    )
    plan = make_plan(**kwargs, arch_first=True)
    strata = [p.stratum for p in plan.points]
    n_arch = strata.count("arch")
    assert n_arch and set(strata[:n_arch]) == {"arch"} and "arch" not in strata[n_arch:]
    gemms = {
        (p.params["m"], p.params["n"], p.params["k"]) for p in plan.points if p.stratum == "arch" and p.op == "gemm"
    }
    assert {(512, 2304, 768), (512, 768, 2304), (768, 2304, 512)} <= gemms  # QKV, its dgrad and wgrad
    assert {p.point_id for p in plan.points} == {p.point_id for p in make_plan(**kwargs).points}
