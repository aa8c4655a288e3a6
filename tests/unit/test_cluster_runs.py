"""benchmarks/cluster_runs.py: the measured runs of arXiv 2509.22832 are parsed from their logs
exactly, one small configuration is predicted on its catalog cluster, bad input is one line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
RUNS = Path(os.environ.get("OPCAST_GPUMODELING25", REPO.parent / "GPUModeling25"))
"""A checkout of github.com/Littlesnakess/GPUModeling25 (no licence: never copied into the repo)."""


cr = load_script("benchmarks/cluster_runs.py")

# The shape of DeepSpeed's partition print in the GPT-NeoX logs (host prefix, then the layer list).
PARTITION = """\
nid1: [INFO] [module.py:375:_partition_layers] Partitioning pipeline stages with method type:transformer|mlp
nid1: stage=0 layers=4
nid1:      0: EmbeddingPipe
nid1:      1: _pre_transformer_block
nid1:      2: ParallelTransformerLayerPipe
nid1:      3: ParallelTransformerLayerPipe
nid1: stage=1 layers=4
nid1:      4: ParallelTransformerLayerPipe
nid1:      5: _post_transformer_block
nid1:      6: NormPipe
nid1:      7: ParallelLinearPipe
nid1:   loss: partial
"""


@pytest.fixture(scope="module")
def runs():
    if not RUNS.is_dir():
        pytest.skip(f"the measured runs are not at {RUNS} (set OPCAST_GPUMODELING25 to a GPUModeling25 checkout)")
    return {r.key: r for r in cr.parse_runs(RUNS)}


def test_stage_layers_count_transformer_layers_of_the_printed_partition():
    assert cr._stage_layers(PARTITION, 2) == (2, 1)
    with pytest.raises(cr.RunsError, match="no DeepSpeed partition of 3 stages"):
        cr._stage_layers(PARTITION, 3)


def test_the_ten_runs_and_their_configuration(runs):
    assert sorted(runs) == sorted(
        f"{m}_{s}"
        for m in ("GPT_20B_4_4_8", "GPT_20B_4_8_4", "GPT_20B_8_4_4", "llama_13B_4_8_2", "llemma_7B_4_2_2")
        for s in ("P", "V")
    )
    assert sum(r.cluster == "perlmutter" for r in runs.values()) == 5
    neox = runs["GPT_20B_8_4_4_P"]
    # DeepSpeed's own split in the log: embedding + 5 layers first, 3 layers + head last.
    assert neox.stage_layers == (5, 6, 6, 6, 6, 6, 6, 3)
    assert (neox.tp, neox.pp, neox.dp, neox.nodes, neox.gpus_per_node) == (4, 8, 4, 32, 4)
    assert (neox.micro_batch, neox.global_batch, neox.seq, neox.zero, neox.recompute) == (4, 256, 2048, 1, "full")
    assert (neox.precision, neox.attention, neox.parallel_residual, neox.bucket_params) == (
        "fp16",
        "eager",
        True,
        1_260_000_000,
    )
    # The authors' best batch, and their model's prediction of it (-5.9 %, compares.csv).
    assert (neox.measured_s, neox.paper_predicted_s) == (pytest.approx(9.239063), pytest.approx(8.696379845))
    # Vista's 8_4_4 job whose best batch the paper scored (its other job has none).
    assert runs["GPT_20B_8_4_4_V"].measured_s == pytest.approx(4.292423986)
    llemma = runs["llemma_7B_4_2_2_V"]
    assert (llemma.nodes, llemma.gpus_per_node, llemma.seq, llemma.attention, llemma.norm) == (
        16,
        1,
        4096,
        "flash",
        "rmsnorm",
    )
    llama = runs["llama_13B_4_8_2_P"]
    assert llama.bucket_params == cr.DEEPSPEED_BUCKET  # not set in its config: DeepSpeed's default


def test_predicts_the_smallest_run_on_its_cluster(runs):
    run = runs["llemma_7B_4_2_2_P"]
    result = cr.predict(run, REPO / "models" / "default")
    assert result.feasible, result.reasons
    assert result.layout.stage_layers == run.stage_layers
    assert math.isclose(sum(result.breakdown_s.values()), result.iteration_time_s, rel_tol=1e-9)
    # The embedded set holds Perlmutter's laws (2509.22832's NCCL sweeps there): every collective is priced by them.
    assert set(cr.collective_sources(result).values()) == {"learned"}
    assert all(line.source.startswith("learned/perlmutter/") for line in result.comms)
    text = cr.report([run], {run.key: result}, REPO / "models" / "default", 1.0, "cmd")
    assert f"| {run.key} | perlmutter:4 | 2/4/2 | 8,9,9,6 | 9.58 |" in text


def test_best_batch_row_is_read_and_a_malformed_one_names_its_line(tmp_path):
    good, bad, none = tmp_path / "good.csv", tmp_path / "bad.csv", tmp_path / "none.csv"
    head = "module,measurement(us),prediction(us),error,abs_mean_error\n"
    good.write_text(head + "pp_p2p,10,11,0.1,0.1\n1F1B_max_optimizer,9239063.0,8696379.8,-0.06,0.06\n")
    bad.write_text(head + "1F1B_max_optimizer,fast,1,0,0\n")
    none.write_text(head + "pp_p2p,10,11,0.1,0.1\n")
    assert cr._best_batch(good) == (pytest.approx(9.239063), pytest.approx(8.6963798))
    assert cr._best_batch(none) is None and cr._best_batch(tmp_path / "absent.csv") is None
    with pytest.raises(cr.RunsError, match=r"bad.csv:2: need measurement\(us\) and prediction\(us\)"):
        cr._best_batch(bad)


def test_missing_runs_folder_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cluster_runs.py"), "--runs", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no 3D_parallelism_prediction/" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_deepspeed_zero1_reduces_gradients_with_an_all_reduce():
    """GPT-NeoX's ZeRO-1 (DeepSpeed) all-reduces each gradient bucket; Megatron's distributed
    optimizer reduce-scatters; both all-gather the weights after the step."""
    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.comm import CollectiveCostModel
    from opcast.predict.training import data_parallel_sync, gradient_reduce_kind

    assert [
        gradient_reduce_kind(z, f) for z, f in ((0, None), (1, None), (1, "megatron"), (1, "neox"), (2, "neox"))
    ] == [
        "all_reduce",
        "reduce_scatter",
        "reduce_scatter",
        "all_reduce",
        "all_reduce",
    ]
    arch, dev, comms = load_arch("gpt-neox-20b"), get_device("A100-SXM4-80GB"), CollectiveCostModel()
    kw = dict(stage=1, tp=4, pp=4, cp=1, ep=1, dp=8, zero=1, gpus_per_node=4, grad_bytes=2)
    megatron = data_parallel_sync(arch, dev, comms, **kw)
    neox = data_parallel_sync(arch, dev, comms, **kw, framework="neox")
    assert (megatron.reduce.kind, neox.reduce.kind) == ("reduce_scatter", "all_reduce")
    assert neox.reduce_total_s > 1.5 * megatron.reduce_total_s  # a ring all-reduce moves twice the bytes
    assert neox.gather_total_s == megatron.gather_total_s > 0
