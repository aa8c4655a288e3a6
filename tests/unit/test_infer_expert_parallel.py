"""Inference expert parallelism (``--ep``): whole experts spread over the replica's GPUs or over several
replicas (attention data parallelism), their weights, GEMM shapes, all-to-alls and the one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.graph import block_ops
from opcast.predict.inference import predict_infer
from opcast.predict.parallel import InferConfig, ep_replica_reasons

OPCAST = str(Path(sys.executable).with_name("opcast"))
QWEN = load_arch("qwen3-30b-a3b")  # 128 experts of 768, top 8
H100 = get_device("H100-SXM")


def _infer(**cfg):
    return predict_infer(QWEN, H100, InferConfig(batch=8, prompt_len=256, gen_len=8, **cfg))


def test_whole_experts_on_the_replicas_gpus_hold_the_same_weights_as_split_ones():
    split, whole = _infer(tp=2), _infer(tp=2, ep=2)
    assert whole.feasible and split.feasible
    assert whole.memory.weights_bytes == split.memory.weights_bytes  # 64 whole experts = 128 halves
    ops = block_ops(QWEN, tp=2, batch=8, seq_q=1, seq_kv=256, sp=False, ep=2, training=False, whole_experts=True)
    up = next(p for r, k, p, c in ops if r == "mlp_up")
    # each GPU routes 4 of the 8 tokens (the group's 8): 64 (1 - (120/128)^8) = 25.2 -> 26 busy local experts,
    # ceil(4 x 8 / 26) = 2 rows each, at the whole expert's width (gate + up, 2 x 768)
    assert (up["b"], up["m"], up["n"]) == (26, 2, 2 * 768)
    assert whole.breakdown_s["decode_step"]["tp_comm"] == split.breakdown_s["decode_step"]["tp_comm"]


def test_expert_parallelism_across_replicas_shards_the_experts_and_adds_the_all_to_alls():
    one, four = _infer(tp=2, ep=2), _infer(tp=2, ep=8)
    assert four.feasible
    expert_bytes = 48 * 128 * 3 * 2048 * 768 * 2  # every expert's weights, bf16
    assert one.memory.weights_bytes - four.memory.weights_bytes == pytest.approx(expert_bytes / 2 - expert_bytes / 8)
    # the dispatch and combine over 8 GPUs cost time the replica's own experts did not
    assert four.breakdown_s["decode_step"]["tp_comm"] > one.breakdown_s["decode_step"]["tp_comm"]


def test_replicas_must_form_whole_expert_parallel_groups():
    cfg = InferConfig(tp=2, ep=8)
    assert ep_replica_reasons(cfg, 4) == []
    (reason,) = ep_replica_reasons(cfg, 6, "decode ")
    assert "decode replicas=6 must be a multiple of 4" in reason
    assert ep_replica_reasons(replace(cfg, ep=2), 3) == []  # within a replica: any count


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["predict", "infer", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "2", "--ep", "3"], "ep=3"),
        (["predict", "infer", "--arch", "llama3-8b", "--gpu", "H100-SXM", "--ep", "2"], "needs an MoE arch"),
        (
            ["predict", "serve", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "2", "--ep", "4"]
            + ["--replicas", "3", "--rate", "1", "--num-requests", "5"],
            "replicas=3 must be a multiple of 2",
        ),
    ],
)
def test_bad_expert_parallelism_is_one_line_with_exit_2(args, needle):
    out = subprocess.run([OPCAST, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr


def test_serve_prices_an_expert_parallel_group_through_the_console_script():
    out = subprocess.run(
        [OPCAST, "predict", "serve", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--tp", "1", "--ep", "2"]
        + ["--replicas", "2", "--rate", "2", "--num-requests", "20", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert '"ep": 2' in out.stdout
