"""Megatron-Core's combined 1F1B (``--overlap-moe-ep-comm``): each MoE block's dispatch and combine all-to-alls
of one micro-batch hidden behind another's expert and attention compute; hand-worked cases and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opcast.predict.cost import kernel
from opcast.predict.graph import BWD, FWD, Graph, Node
from opcast.predict.training import PhaseCost, combined_1f1b_paired, moe_a2a_exposed

OPCAST = str(Path(sys.executable).with_name("opcast"))


def _node(role: str, numel: int) -> Node:
    return Node(role, kernel("elementwise", {"numel": numel, "fn": "copy"}, "bf16"))


def test_each_all_to_all_hides_behind_the_paired_phases_expert_or_attention_work():
    # forward: experts 3 ms, attention side 5 ms; backward: experts 6 ms, attention side 10 ms; every all-to-all 4 ms
    nodes = {
        FWD: (_node("mlp_up", 1), _node("attn", 2)),
        BWD: (_node("mlp_up.dgrad", 3), _node("qkv.wgrad", 4)),
    }
    times = {n.kernel: (t, "test") for n, t in zip([*nodes[FWD], *nodes[BWD]], (3e-3, 5e-3, 6e-3, 10e-3))}
    graph = Graph(nodes=nodes, comms={FWD: (), BWD: ()})
    costs = {FWD: PhaseCost(8e-3, (0.0, 0.0, 8e-3)), BWD: PhaseCost(16e-3, (0.0, 0.0, 8e-3))}
    # a forward's dispatch behind the backward's 6 ms of experts, its combine behind 10 ms: hidden; a backward's
    # dispatch behind the forward's 3 ms of experts (1 ms shows), its combine behind 5 ms (hidden)
    steady = moe_a2a_exposed(graph, costs, times, paired=1.0)
    assert steady == pytest.approx({FWD: 0.0, BWD: 1e-3})
    half = moe_a2a_exposed(graph, costs, times, paired=0.5)  # half the micro-batches unpaired: 2 x 4 ms exposed
    assert half == pytest.approx({FWD: 4e-3, BWD: 0.5e-3 + 4e-3})


def test_the_paired_share_leaves_out_the_warm_up():
    assert combined_1f1b_paired(micro_batches=8, pp=1, virtual_stages=1) == pytest.approx(7 / 8)
    # interleaved pp 4, v 2: (4 - 1) x 2 + (2 - 1) x 4 warm-up chunks and one more, of 16
    assert combined_1f1b_paired(micro_batches=8, pp=4, virtual_stages=2) == pytest.approx(1 - 11 / 16)
    assert combined_1f1b_paired(micro_batches=2, pp=8, virtual_stages=2) == 0.0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--ep", "1"], "it needs --ep > 1"),
        (["--ep", "8", "--recompute", "full"], "does not run with --recompute full"),
        (["--ep", "4", "--pp", "2"], "needs --schedule interleaved"),
    ],
)
def test_refusals_are_one_line_with_exit_2(extra, needle):
    args = ["predict", "train", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--global-batch", "64"]
    out = subprocess.run([OPCAST, *args, "--overlap-moe-ep-comm", *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr


def test_the_overlap_only_lowers_the_exposed_all_to_all():
    from dataclasses import replace

    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.options import Args, kernel_cost
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import predict_train

    arch, dev = load_arch("qwen3-30b-a3b"), get_device("H100-SXM")
    kernels = kernel_cost(Args(models=None, roofline=False, analytic=False))
    base = TrainConfig(dp=8, ep=8, micro_batch=1, global_batch=64, seq=4096)
    plain = predict_train(arch, dev, base, kernels=kernels)
    over = predict_train(arch, dev, replace(base, overlap_moe_ep_comm=True), kernels=kernels)
    assert 0 < over.breakdown_s["ep_comm"] < plain.breakdown_s["ep_comm"]
    assert over.breakdown_s["forward"] == plain.breakdown_s["forward"]
