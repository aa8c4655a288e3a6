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
from opcast.predict.cost import decompose, kernel
from opcast.predict.graph import block_ops
from opcast.predict.inference import predict_infer
from opcast.predict.parallel import InferConfig, ep_replica_reasons

OPCAST = str(Path(sys.executable).with_name("opcast"))
QWEN = load_arch("qwen3-30b-a3b")  # 128 experts of 768, top 8
H100 = get_device("H100-SXM")
SERVE_QWEN = ("predict", "serve", "--arch", "qwen3-30b-a3b", "--gpu", "H100-SXM")


def _infer(**cfg):
    return predict_infer(QWEN, H100, InferConfig(batch=8, prompt_len=256, gen_len=8, **cfg))


def test_whole_experts_on_the_replicas_gpus_hold_the_same_weights_as_split_ones():
    split, whole = _infer(tp=2), _infer(tp=2, ep=2)
    assert whole.feasible and split.feasible
    assert whole.memory.weights_bytes == split.memory.weights_bytes  # 64 whole experts = 128 halves
    ops = block_ops(QWEN, tp=2, batch=8, seq_q=1, seq_kv=256, sp=False, ep=2, training=False, whole_experts=True)
    experts = next(p for r, k, p, c in ops if r == "experts")
    # one fused MoE layer over the group's 8 tokens, whole experts (768 wide) over the 2 GPUs
    assert (experts["tokens"], experts["inter"], experts["ep"]) == (8, 768, 2)
    # as grouped GEMMs (no learned fused-MoE model): each GPU routes 4 of the 8 tokens: 64 (1 - (120/128)^8) =
    # 25.2 -> 26 busy local experts, ceil(4 x 8 / 26) = 2 rows each, at the whole expert's width (2 x 768)
    parts = [p for p, _ in decompose(kernel("moe", experts, "bf16"))]
    up = next(p.param_dict for p in parts if p.kind == "gemm")
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
            [*SERVE_QWEN, "--tp", "2", "--ep", "4", "--replicas", "3", "--rate", "1", "--num-requests", "5"],
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
        [
            OPCAST,
            *SERVE_QWEN,
            "--tp",
            "1",
            "--ep",
            "2",
            "--replicas",
            "2",
            "--rate",
            "2",
            "--num-requests",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert '"ep": 2' in out.stdout


def test_expert_parallelism_across_replicas_leaves_more_of_each_gpu_to_the_kv_cache():
    from opcast.predict.serve.engine import engine_config
    from opcast.predict.serve.kv_cache import kv_capacity

    engine = engine_config("vllm", H100)
    own, spread = (
        kv_capacity(QWEN, H100, InferConfig(tp=2, ep=ep), engine, longest_tokens=4096).tokens for ep in (2, 8)
    )
    assert spread > own  # the same replica holds a quarter of the experts' weights


def test_search_serve_with_expert_parallelism_returns_exactly_the_brute_force_best():
    """Every (tp, ep, replicas) of a small MoE space simulated to the end by predict_serve and ranked by hand
    (goodput per GPU, then the lower TTFT and TPOT percentiles, then fewer GPUs, the smaller tp and ep): the
    search ranks them alike, and its best (early stopping on) is the brute force's, here with whole experts."""
    from opcast.predict.cost import roofline_only
    from opcast.predict.serve.deployment import predict_serve
    from opcast.predict.serve.engine import engine_config
    from opcast.predict.serve.requests import Lengths, poisson_stream
    from opcast.predict.serve.search import ServeSpace, deployments, search_serve

    stream = poisson_stream(
        rate_per_s=150.0,
        num_requests=120,
        input_len=Lengths("uniform", 64, 512),
        output_len=Lengths("uniform", 2, 32),
        seed=1,
    )
    kernels = roofline_only("test")
    slo = dict(slo_ttft_s=0.3, slo_tpot_s=0.03)
    space = ServeSpace(gpus=4, tp=(1, 2), ep=(1, 2, 4), max_num_seqs=(64,), max_num_batched_tokens=(2048,), **slo)
    keys = {(d.tp, d.ep, d.replicas) for d in deployments(QWEN, H100, space)}
    assert keys == {
        (1, 1, 1), (1, 1, 2), (1, 1, 3), (1, 1, 4), (1, 2, 2), (1, 2, 4), (1, 4, 4),
        (2, 1, 1), (2, 1, 2), (2, 2, 1), (2, 2, 2), (2, 4, 2),
    }  # fmt: skip
    engine = engine_config("vllm", H100, max_num_seqs=64, max_num_batched_tokens=2048)
    scored = []
    for tp, ep, replicas in keys:
        cfg = InferConfig(tp=tp, ep=ep)
        r = predict_serve(QWEN, H100, cfg, engine, stream, replicas=replicas, kernels=kernels, gpus_per_node=tp, **slo)
        m = r.metrics
        if m.ttft.p90_s <= 0.3 and m.tpot.p90_s <= 0.03:
            gpus = tp * replicas
            rank = (-m.goodput_requests_per_s / gpus, m.ttft.p90_s, m.tpot.p90_s, gpus, tp, ep)
            scored.append((rank, (tp, ep, replicas)))
    expected = [key for _, key in sorted(scored)]
    full = search_serve(QWEN, H100, replace(space, early_stop=False), stream, kernels=kernels)
    assert [(e.deployment.tp, e.deployment.ep, e.deployment.replicas) for e in full.ranked] == expected
    d = search_serve(QWEN, H100, space, stream, kernels=kernels).ranked[0].deployment
    assert (d.tp, d.ep, d.replicas) == expected[0] and d.ep > 1
