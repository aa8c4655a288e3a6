"""MoE parallel folding (``--etp 1`` under tp > 1; Megatron ``--expert-tensor-parallel-size 1``, arXiv
2504.14960): the expert group spans the tensor-parallel ranks, every expert is whole, and each rank routes its
sequence-parallel share of the tokens. Checked by hand on Qwen3-235B-A22B as NVIDIA's H100 recipe lays it out."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.graph import FWD, precision_of, train_block
from opcast.predict.memory import expert_data_parallel, stage_params
from opcast.predict.parallel import TrainConfig, folded, validate_train

OPCAST = str(Path(sys.executable).with_name("opcast"))
QWEN = load_arch("qwen3-235b-a22b")  # 128 experts of 1536, top 8, hidden 4096, 94 layers
H100 = get_device("H100-SXM")
CFG = TrainConfig(tp=2, pp=2, dp=8, ep=16, etp=1, sp=True, micro_batch=1, global_batch=64, seq=4096)


def _layout(cfg: TrainConfig):
    return validate_train(QWEN, H100, cfg, nodes=4, gpus_per_node=8)


def test_folding_lets_the_expert_group_span_the_tensor_parallel_ranks():
    layout, reasons = _layout(CFG)
    assert reasons == [] and layout is not None and folded(layout.cfg)
    # 16 expert ranks consecutive over tp x dp: two nodes of 8; each whole expert set held by 2 x 8 / 16 = 1 rank
    assert (layout.ep_group.size, layout.ep_group.nodes, layout.ep_group.per_node) == (16, 2, 8)
    assert layout.expert_dp_group.size == 1 == expert_data_parallel(tp=2, dp=8, cp=1, ep=16, fold=True)
    _, reasons = _layout(replace(CFG, etp=None))  # unfolded: ep must divide dp x cp = 8
    assert any("ep=16 must divide dp x cp = 8" in r and "--etp 1" in r for r in reasons)


def test_folding_needs_sequence_parallelism_and_etp_is_1_or_tp():
    _, reasons = _layout(replace(CFG, sp=False))
    assert any("give --sp" in r for r in reasons)
    _, reasons = _layout(replace(CFG, etp=4))
    assert any("etp=4 must be 1 (MoE parallel folding) or tp=2" in r for r in reasons)
    assert not folded(replace(CFG, etp=2)) and not folded(replace(CFG, tp=1, etp=1))


def test_folded_experts_are_whole_and_route_the_ranks_share_of_the_tokens():
    g = train_block(
        QWEN,
        tp=2,
        batch=1,
        seq=4096,
        sp=True,
        cp=1,
        ep=16,
        attention="flash",
        recompute="none",
        prec=precision_of("bf16"),
        whole_experts=True,
    )
    up = next(n for n in g.nodes[FWD] if n.role == "mlp_up")
    p = dict(up.kernel.params)
    # 2048 tokens a rank (4096 / tp), 8 local experts of the 128, each whole (gate + up 2 x 1536):
    # 2048 x 8 / 8 = 2048 rows each
    assert (p["b"], p["m"], p["n"], p["k"]) == (8, 2048, 2 * 1536, 4096)
    whole, split = (stage_params(QWEN, tp=2, pp=2, ep=16, whole_experts=w).expert for w in (True, False))
    assert whole == 2 * split  # 8 whole experts a rank, where unfolded 8 halves
    assert whole == 47 * 8 * 3 * 4096 * 1536  # 47 layers a stage


def test_etp_without_sp_is_one_line_with_exit_2_through_the_console_script():
    args = "predict train --arch qwen3-235b-a22b --gpu H100-SXM --nodes 4 --gpus-per-node 8 --tp 2 --pp 2 --dp 8"
    out = subprocess.run(
        [OPCAST, *args.split(), "--ep", "16", "--etp", "1", "--global-batch", "64", "--seq", "4096"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "give --sp" in out.stderr
