"""``--cluster NAME[:NODES]`` with ``--nodes`` / ``--gpus-per-node``: a job that uses part of each of a
catalog cluster's NVLink domains (NVIDIA's 128-GPU GB200 runs: 64 GPUs of each of two NVL72 racks)
keeps the cluster's GPU, links and domain and is priced as that GPU on ``RACKS x PER`` nodes; counts
that disagree with the cluster are one-line errors (exit 2) through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.options import Args, placement

JOB = [
    "predict", "train", "--arch", "llama3-70b", "--tp", "2", "--pp", "4", "--micro-batch", "1",
    "--seq", "8192", "--precision", "fp8", "--sp", "--zero", "1", "--json",
]  # fmt: skip
LINKS = "intra_node_bw_bytes_per_s=900000000000,inter_node_bw_bytes_per_s=50000000000"
GB200_IN_RACK = f"GB200[{LINKS},gpus_per_node=72]"
"""The GPU --cluster gb200-nvl72 prices on: GB200 with the cluster's links and 72-GPU NVLink domain."""
GB200_MANUAL = f"GB200[{LINKS},gpus_per_node=64]"
"""The manual form benchmarks/nemo_public.py used for 64 GPUs of each rack."""


def _opcast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)


def _train(*args: str, dp: int = 16) -> dict:
    proc = _opcast(*JOB, "--dp", str(dp), "--global-batch", str(8 * dp), *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str, printed: bool = False) -> str:
    """Exit 2 with one line on stderr holding every needle; nothing on stdout unless ``printed``."""
    assert proc.returncode == 2, proc.stderr
    assert printed or proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _args(**kw) -> Args:
    return Args(**{"gpu": None, "nodes": None, "gpus_per_node": None, "cluster": None, **kw})


def test_placement_takes_the_jobs_counts_on_a_catalog_cluster():
    where = placement(_args(cluster="gb200-nvl72:2", gpus_per_node=64))
    assert (where.cluster, where.nodes, where.gpus_per_node) == ("gb200-nvl72", 2, 64)
    assert get_device(where.gpu).name == get_device(GB200_IN_RACK).name  # the rack's GPU, links and domain
    assert placement(_args(cluster="nvl72", nodes=2, gpus_per_node=64)) == where
    assert placement(_args(cluster="gb200-nvl72:2", nodes=2, gpus_per_node=64)) == where
    assert placement(_args(cluster="gb200-nvl72", nodes=3)).nodes == 3
    assert placement(_args(cluster="gb200-nvl72", gpus_per_node=72)).gpus_per_node == 72  # the whole domain
    # opcast search has no --nodes: its options lack the attribute
    assert placement(Args(gpu=None, gpus_per_node=64, cluster="gb200-nvl72:2")) == where
    # whole domains, as before
    full = placement(_args(cluster="gb200-nvl72:2"))
    assert (full.nodes, full.gpus_per_node, full.gpu) == (2, None, where.gpu)
    with pytest.raises(OpcastError, match="--nodes 3 disagrees with --cluster gb200-nvl72:2"):
        placement(_args(cluster="gb200-nvl72:2", nodes=3))
    with pytest.raises(OpcastError, match="exceeds the 8-GPU NVLink domain of cluster dgx-h100"):
        placement(_args(cluster="dgx-h100", gpus_per_node=16))
    with pytest.raises(OpcastError, match="not both"):
        placement(_args(cluster="2x64", gpu="GB200", gpus_per_node=64))


def test_part_of_two_racks_prices_as_the_gpu_on_two_nodes_of_64():
    partial = _train("--cluster", "gb200-nvl72:2", "--gpus-per-node", "64")
    assert partial["feasible"] is True
    assert {k: partial["config"][k] for k in ("world_size", "nodes", "gpus_per_node")} == {
        "world_size": 128,
        "nodes": 2,
        "gpus_per_node": 64,
    }
    # the same GPU, links and NVLink domain on 2 nodes of 64: every number the same
    manual = _train("--gpu", GB200_IN_RACK, "--nodes", "2", "--gpus-per-node", "64")
    assert partial == manual
    # TP and DP groups sit inside one rack (NVLink); the pipeline's middle send crosses racks
    groups = {(c["role"], c["group"]["nodes"]) for c in partial["collectives"]}
    assert {("tp", 1), ("dp", 1), ("pp", 2)} <= groups
    assert not {r for r, n in groups if n > 1} - {"pp"}


def test_part_of_two_racks_prices_as_the_benchmarks_manual_form_on_the_link_model():
    """The benchmark's manual GPU says a 64-GPU domain, which is not the cluster's network, so it never
    gets the collectives learned on gb200-nvl72; on the alpha-beta link model (--roofline: no learned
    laws) the two forms price every collective over the same links, so the iteration time is identical."""
    partial = _train("--cluster", "gb200-nvl72:2", "--gpus-per-node", "64", "--roofline")
    manual = _train("--gpu", GB200_MANUAL, "--nodes", "2", "--gpus-per-node", "64", "--roofline")
    assert partial["iteration_time_s"] == manual["iteration_time_s"]
    assert partial["breakdown_s"] == manual["breakdown_s"]
    assert [c["source"] for c in partial["collectives"]] == [c["source"] for c in manual["collectives"]]


def test_whole_racks_are_unchanged():
    whole = _train("--cluster", "gb200-nvl72:2", dp=18)
    assert (whole["config"]["nodes"], whole["config"]["gpus_per_node"], whole["config"]["world_size"]) == (2, 72, 144)
    assert whole == _train("--gpu", GB200_IN_RACK, "--nodes", "2", "--gpus-per-node", "72", dp=18)


def test_counts_that_disagree_with_the_cluster_are_one_line_errors():
    base = [*JOB, "--dp", "16", "--global-batch", "128"]
    whole = _opcast(*base, "--cluster", "gb200-nvl72:2")  # infeasible: --json still reports the reasons
    _one_line_error(
        whole, "world size 144 (2 nodes x 72 GPUs) != tp x pp x dp x cp", "give --gpus-per-node 64", printed=True
    )
    assert json.loads(whole.stdout)["feasible"] is False
    # refused before anything is priced or printed
    _one_line_error(
        _opcast(*base, "--cluster", "gb200-nvl72:2", "--nodes", "3", "--gpus-per-node", "64"),
        "--nodes 3 disagrees with --cluster gb200-nvl72:2 (2 nodes)",
        "--cluster gb200-nvl72:3",
    )
    _one_line_error(
        _opcast(*base, "--cluster", "gb200-nvl72", "--gpus-per-node", "80"),
        "--gpus-per-node 80 exceeds the 72-GPU NVLink domain of cluster gb200-nvl72",
        "give at most 72",
    )
    _one_line_error(
        _opcast(*base, "--gpu", "GB200", "--cluster", "2x64", "--nodes", "2"),
        "--cluster 2x64 sets the nodes and GPUs per node",
        "not both",
    )
