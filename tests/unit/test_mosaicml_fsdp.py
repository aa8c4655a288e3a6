"""The ZeRO-3 terms of llm-foundry's FSDP (``--framework foundry``): Composer's ``mixed_precision:
DEFAULT`` reduce-scatters the gradients in fp32, and torch FSDP runs three kernels over each unit's
flat gradient per micro-batch (flatten, upcast, pre-divide), each worked by hand here, through
``predict_train`` and the console script; the other frameworks do not move."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.ops import get_op
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.cost import roofline_only
from opcast.predict.frameworks import framework_of
from opcast.predict.memory import stage_params
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import (
    data_parallel_sync,
    fsdp_gradient_kernels,
    fsdp_gradient_s,
    predict_train,
    zero3_reduce_bytes,
)

H100 = get_device("H100-SXM")
MPT = load_arch("mpt-125m")
ROOF = roofline_only("test")


def _moved_bytes(nodes) -> int:
    """Bytes the registry says the kernels move (forward elementwise formula, bf16)."""
    op = get_op("elementwise")
    return sum(int(op.bytes_fwd(n.kernel.param_dict, 2)) for n in nodes)


def test_foundry_reduces_in_fp32_the_others_in_the_gradient_dtype():
    assert framework_of("foundry").zero3_reduce_bytes == 4 and framework_of("foundry").zero3_fsdp_kernels
    assert zero3_reduce_bytes("foundry", 2) == 4
    assert zero3_reduce_bytes("foundry", 4) == 4  # fp32 training: nothing wider
    for name in (None, "megatron", "neox", "hf"):
        assert zero3_reduce_bytes(name, 2) == 2
        assert not framework_of(name).zero3_fsdp_kernels


def test_the_flat_gradient_kernels_by_hand():
    # bf16 gradient, fp32 reduce: flatten 2+2, upcast 2+4, pre-divide 4+4 = 18 bytes an element
    nodes = fsdp_gradient_kernels(1000, grad_bytes=2, reduce_bytes=4, dp=8)
    assert [n.role for n in nodes] == ["fsdp.grad_flatten", "fsdp.grad_upcast", "fsdp.grad_predivide"]
    assert [n.kernel.param_dict["numel"] for n in nodes] == [1000, 1500, 2000]
    assert _moved_bytes(nodes) == 18 * 1000
    # same dtype: no upcast, 4 + 4 bytes
    same = fsdp_gradient_kernels(1000, grad_bytes=2, reduce_bytes=2, dp=2)
    assert [n.role for n in same] == ["fsdp.grad_flatten", "fsdp.grad_predivide"] and _moved_bytes(same) == 8000
    assert fsdp_gradient_kernels(1000, grad_bytes=2, reduce_bytes=4, dp=1) == ()  # nothing to reduce
    assert fsdp_gradient_kernels(0, grad_bytes=2, reduce_bytes=4, dp=8) == ()
    # seconds: 3 blocks of one set plus the root's set
    times = {n.kernel: (float(i + 1), "t") for i, n in enumerate(nodes)}
    assert fsdp_gradient_s(nodes, nodes[:1], times, 3) == 3 * (1 + 2 + 3) + 1


def test_the_reduce_scatter_is_fp32_under_foundry():
    comms = CollectiveCostModel()
    kw = dict(stage=0, tp=1, pp=1, cp=1, ep=1, dp=8, zero=3, gpus_per_node=8, grad_bytes=2)
    per_layer = stage_params(MPT, tp=1, pp=1).per_layer
    hf = data_parallel_sync(MPT, H100, comms, framework="hf", **kw).zero3
    fd = data_parallel_sync(MPT, H100, comms, framework="foundry", **kw).zero3
    assert hf is not None and fd is not None
    assert hf[0].bytes == fd[0].bytes == 2 * per_layer  # weights gathered in bf16 either way
    assert hf[2].bytes == 2 * per_layer and fd[2].bytes == 4 * per_layer


def _cfg(framework: str, zero: int = 3) -> TrainConfig:
    return TrainConfig(micro_batch=4, global_batch=64, seq=512, zero=zero, framework=framework)


def test_predict_train_adds_the_kernels_to_each_micro_batch_backward_only_for_foundry_zero3():
    hf = predict_train(MPT, H100, _cfg("hf"), nodes=1, gpus_per_node=8, kernels=ROOF)
    fd = predict_train(MPT, H100, _cfg("foundry"), nodes=1, gpus_per_node=8, kernels=ROOF)
    assert hf.feasible and fd.feasible
    lines = [o for o in fd.ops if o.role.startswith("fsdp.")]
    assert not [o for o in hf.ops if o.role.startswith("fsdp.")]
    m = fd.layout.micro_batches
    assert m == 2
    params = stage_params(MPT, tp=1, pp=1)
    # every parameter (12 blocks + the root unit) moves 18 bytes per micro-batch
    assert sum(o.count * _moved_bytes([o]) for o in lines) == m * 18 * (params.dense + params.expert)
    extra_s = sum(o.count * o.time_s for o in lines)
    assert extra_s > 0
    # under the roofline foundry and hf price the same graph (flash1 and fused cross-entropy by their
    # traffic), so the backward grows by exactly those kernels and nothing else moves
    assert fd.breakdown_s["backward"] - hf.breakdown_s["backward"] == pytest.approx(extra_s, rel=1e-9)
    assert fd.breakdown_s["forward"] == pytest.approx(hf.breakdown_s["forward"], rel=1e-12)
    assert fd.iteration_time_s == pytest.approx(sum(fd.breakdown_s.values()), rel=1e-12)
    # ZeRO 1 under foundry: no FSDP kernels
    z1 = predict_train(MPT, H100, _cfg("foundry", zero=1), nodes=1, gpus_per_node=8, kernels=ROOF)
    assert not [o for o in z1.ops if o.role.startswith("fsdp.")]


def test_the_console_script_prices_them():
    argv = [
        sys.executable, "-m", "opcast", "predict", "train", "--arch", "mpt-125m", "--gpu", "H100-SXM",
        "--nodes", "1", "--gpus-per-node", "8", "--micro-batch", "4", "--global-batch", "64", "--seq", "512",
        "--precision", "bf16", "--zero", "3", "--roofline", "--json", "--framework",
    ]  # fmt: skip
    out = {}
    for fw in ("hf", "foundry"):
        done = subprocess.run([*argv, fw], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out[fw] = json.loads(done.stdout)
    lib = predict_train(MPT, H100, _cfg("foundry"), nodes=1, gpus_per_node=8, kernels=ROOF)
    assert "fsdp.grad_upcast" in json.dumps(out["foundry"]) and "fsdp.grad_upcast" not in json.dumps(out["hf"])
    assert lib.iteration_time_s is not None
    assert json.dumps(out["foundry"]).count(repr(lib.iteration_time_s)) >= 1  # the library's own figure
