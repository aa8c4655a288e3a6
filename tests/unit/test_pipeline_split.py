"""Uneven pipeline splits: DeepSpeed's and Megatron-LM's partitioners on hand-worked cases, the
stage with the most layers setting the pace, and --pp-layers through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.parallel import (
    TrainConfig,
    megatron_chunks,
    neox_layer_specs,
    partition_balanced,
    partition_uniform,
    pipeline_split,
    validate_train,
)
from opcast.predict.training import predict_train

NEOX = load_arch("gpt-neox-20b")
A100 = get_device("A100-SXM4-80GB")


def test_deepspeed_partition_uniform():
    # 10 items on 4 parts: chunks of 2, the first 10 % 4 = 2 parts one longer.
    assert partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert partition_uniform(3, 5) == [0, 1, 2, 3, 3, 3]  # fewer items than parts
    assert partition_uniform(8, 4) == [0, 2, 4, 6, 8]


def test_deepspeed_partition_balanced_minimises_the_spread():
    # [1, 1, 1, 10] on 2 parts: the lone 10 against the rest (spread 7).
    assert partition_balanced([1.0, 1.0, 1.0, 10.0], 2) == [0, 3, 4]
    # 6 equal weights on 3 parts: pairs.
    assert partition_balanced([1.0] * 6, 3) == [0, 2, 4, 6]


def test_neox_specs_are_gpt_neox_pipe_module():
    specs = neox_layer_specs(NEOX, tp=1)
    names = [n for n, _ in specs]
    assert len(specs) == 44 + 5
    assert names[:2] == ["EmbeddingPipe", "_pre_transformer_block"]
    assert names[-3:] == ["_post_transformer_block", "NormPipe", "ParallelLinearPipe"]  # untied head


def test_44_layers_on_8_stages_deepspeed_uniform():
    # 49 specs over 8 parts: boundaries 0,7,13,...,43,49. Stage 0 holds the embedding, the
    # pre-block function and 5 layers; stages 1-6 six layers; stage 7 layers 41-43, post, norm, head.
    split, reasons = pipeline_split(NEOX, pp=8, pp_partition="uniform")
    assert reasons == []
    assert split == (5, 6, 6, 6, 6, 6, 6, 3)


def test_44_layers_on_8_stages_deepspeed_type_transformer():
    # Weights: 1 for every spec whose type name matches /transformer/i -- the 44 layers AND the
    # _pre/_post_transformer_block functions (46 ones), 0 for embedding, norm and head. The
    # spread can be 1 at best (46 = 6 x 6 + 2 x 5); ties go to the later cut, so the boundaries are
    # 0,7,13,19,25,31,37,42,49: stage 0 = pre + 5 layers, stage 6 = 5 layers, stage 7 = 4 layers + post.
    split, reasons = pipeline_split(NEOX, pp=8, pp_partition="type:transformer")
    assert reasons == []
    assert split == (5, 6, 6, 6, 6, 6, 5, 4)
    assert pipeline_split(NEOX, pp=8)[0] == split  # auto: GPT-NeoX's default type:transformer|mlp


def test_44_layers_on_8_stages_deepspeed_parameters():
    # Per-rank parameters: embedding (vocab x hidden / tp) is below one layer (~12 h^2 / tp), so
    # stage 0 takes the embedding and 5 layers; the rest balance to 6,6,6,6,5,5,5 (head on the last).
    for tp in (1, 2, 4):
        split, reasons = pipeline_split(NEOX, pp=8, tp=tp, pp_partition="parameters")
        assert reasons == [] and split == (5, 6, 6, 6, 6, 5, 5, 5)


def test_126_layers_8_stages_8_virtual_megatron_embedding_and_loss():
    # (126 + 1 + 1) / 8 = 16 per rank, 2 per chunk; the embedding takes a layer's place in chunk 0
    # of rank 0 and the loss in the last chunk of rank 7 (Llama 3.1 405B recipe).
    chunks, reasons = megatron_chunks(126, 8, 8, embedding=True, loss=True)
    assert reasons == []
    assert chunks[0] == (1,) + (2,) * 7 and chunks[7] == (2,) * 7 + (1,)
    assert all(c == (2,) * 8 for c in chunks[1:7])
    llama = replace(NEOX, name="llama-126", n_layers=126)
    split, reasons = pipeline_split(
        llama, pp=8, schedule="interleaved", virtual_stages=8, pp_partition="megatron:embedding,loss"
    )
    assert reasons == [] and split == (15, 16, 16, 16, 16, 16, 16, 15)


def test_126_layers_megatron_first_and_last_stage_counts():
    # first=15, last=15: (126 - 30) / 6 = 16 on the middle stages.
    assert megatron_chunks(126, 8, first=15, last=15) == (((15,), (16,), (16,), (16,), (16,), (16,), (16,), (15,)), [])
    # With 8 virtual stages every rank's count must divide by 8: 15 does not (Megatron asserts).
    chunks, reasons = megatron_chunks(126, 8, 8, first=15, last=15)
    assert chunks is None and "virtual_stages=8" in reasons[0]
    # Layers left that do not divide over the middle stages.
    assert megatron_chunks(126, 8, first=14, last=15)[0] is None
    # More layers on the ends than the model has: said so (it spoke of '-4 layers left' that 'do not divide')
    chunks, reasons = megatron_chunks(126, 8, first=100, last=30)
    assert chunks is None and reasons == [
        "Megatron-LM: first=100, last=30 put more layers on the first and last stages than the model's "
        "n_layers=126; give counts that sum to at most 126"
    ]
    # Plain Megatron (no options) needs pp | n_layers.
    assert "divide n_layers = 126" in megatron_chunks(126, 8)[1][0]


def test_explicit_pp_layers_and_its_problems():
    assert pipeline_split(NEOX, pp=8, pp_layers=(4, 6, 6, 6, 6, 6, 6, 4)) == ((4, 6, 6, 6, 6, 6, 6, 4), [])
    assert "gives 3 stages" in pipeline_split(NEOX, pp=8, pp_layers=(5, 6, 6))[1][0]
    assert "sums to 45" in pipeline_split(NEOX, pp=8, pp_layers=(5, 6, 6, 6, 6, 6, 6, 4))[1][0]
    assert ">= 1 layer" in pipeline_split(NEOX, pp=8, pp_layers=(0, 6, 6, 6, 6, 6, 7, 7))[1][0]
    assert (
        "no interleaved"
        in pipeline_split(NEOX, pp=4, schedule="interleaved", virtual_stages=2, pp_partition="uniform")[1][0]
    )
    assert "pp_partition='bogus'" in pipeline_split(NEOX, pp=4, pp_partition="bogus")[1][0]


def test_even_split_unchanged_and_uneven_stage_sets_the_pace():
    llama = load_arch("llama2-7b")
    even = predict_train(llama, A100, TrainConfig(pp=4, global_batch=8))
    same = predict_train(llama, A100, TrainConfig(pp=4, global_batch=8, pp_layers=(8, 8, 8, 8)))
    assert even.iteration_time_s == same.iteration_time_s
    assert even.layout.stage_layers == (8, 8, 8, 8) and even.config.pp_layers is None
    # Moving two layers onto stage 1 makes it the slowest: it sets the steady state.
    skew = predict_train(llama, A100, TrainConfig(pp=4, global_batch=8, pp_layers=(7, 10, 8, 7)))
    assert skew.feasible and skew.iteration_time_s > even.iteration_time_s
    per_mb = [s.per_micro_batch_s for s in skew.stages]
    assert max(range(4), key=per_mb.__getitem__) == 1
    assert skew.config.pp_layers == (7, 10, 8, 7)  # the output says how layers were split
    # Memory: stage 1 holds 10 layers' states; it is at least stage 2's (8 layers, fewer in flight too).
    assert skew.memory[1].weights_bytes > skew.memory[2].weights_bytes


def test_neox_pp8_validates_and_predicts():
    layout, reasons = validate_train(NEOX, A100, TrainConfig(tp=2, pp=8, global_batch=16), nodes=4, gpus_per_node=4)
    assert reasons == [] and layout.stage_layers == (5, 6, 6, 6, 6, 6, 5, 4)
    r = predict_train(NEOX, A100, TrainConfig(tp=2, pp=8, global_batch=16), nodes=4, gpus_per_node=4)
    assert r.feasible and r.iteration_time_s > 0
    assert len({s.forward_s for s in r.stages[1:6]}) == 1  # the five 6-layer middle stages alike


def _opcast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)


BASE = (
    "predict",
    "train",
    "--arch",
    "gpt-neox-20b",
    "--gpu",
    "A100-SXM4-80GB",
    "--tp",
    "2",
    "--pp",
    "8",
    "--nodes",
    "4",
    "--gpus-per-node",
    "4",
    "--global-batch",
    "16",
)


def test_console_neox_pp8_predicts():
    out = _opcast(*BASE, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"]["pp_layers"] == [5, 6, 6, 6, 6, 6, 5, 4]


@pytest.mark.parametrize(
    "value, expect",
    [
        ("5,6,6", "gives 3 stages"),
        ("5,6,6,6,6,6,6,6", "sums to 47"),
        ("5,6,0,6,6,6,6,9", ">= 1 layer"),
        ("5,six", "positive integers"),
    ],
)
def test_console_bad_pp_layers_one_line_exit_2(value, expect):
    out = _opcast(*BASE, "--pp-layers", value)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error:") and expect in lines[0]
    assert "Traceback" not in out.stderr


def test_a_job_smaller_than_a_node_runs_on_part_of_it():
    # a 2-GPU replica on an 8-GPU server: --gpus-per-node says how big the server is, not a refusal
    from opcast.hardware import get_device
    from opcast.predict.parallel import Cluster, resolve_cluster

    h100 = get_device("H100-SXM")
    assert resolve_cluster(h100, nodes=None, gpus_per_node=8, world_needed=2) == (Cluster(nodes=1, gpus_per_node=2), [])
    assert resolve_cluster(h100, nodes=None, gpus_per_node=8, world_needed=16) == (
        Cluster(nodes=2, gpus_per_node=8),
        [],
    )
    cluster, problems = resolve_cluster(h100, nodes=None, gpus_per_node=8, world_needed=12)
    assert cluster is None and problems == ["world size 12 is not a multiple of --gpus-per-node 8"]
