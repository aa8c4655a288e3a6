"""``--cluster NAME`` on explore and compare, and the overlap switches of ``predict train``,
through the real console script (exit 0 with the cluster's network, one-line errors with exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

JOB = ["--arch", "gpt3-350m", "--tp", "4", "--global-batch", "16", "--seq", "512", "--roofline"]


def _opcast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_compare_places_each_gpu_in_the_catalog_clusters_network():
    proc = _opcast("compare", "train", "--gpus", "A100-SXM4-80GB,H100-SXM", "--cluster", "perlmutter:2", *JOB, "--json")
    assert proc.returncode == 0, proc.stderr
    gpus = [g["gpu"] for g in json.loads(proc.stdout)["gpus"]]
    assert gpus[0].startswith("A100-SXM4-80GB[") and gpus[1].startswith("H100-SXM[")
    assert all("inter_node_bw_bytes_per_s=25000000000" in g and "gpus_per_node=4" in g for g in gpus)


def test_explore_takes_its_base_gpu_from_the_cluster():
    proc = _opcast("explore", "train", "--cluster", "vista:4", "--vary", "peak_flops=1,2", *JOB, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "GH200" in proc.stdout and "inter_node_bw_bytes_per_s" in proc.stdout


def test_cluster_errors_are_one_line(tmp_path):
    _one_line_error(_opcast("explore", "train", "--vary", "peak_flops=1,2", *JOB), "--gpu is required")
    _one_line_error(
        _opcast("explore", "train", "--gpu", "H100-SXM", "--cluster", "vista", "--vary", "peak_flops=2", *JOB),
        "leave --gpu out",
    )
    f = tmp_path / "c.json"
    f.write_text('{"nodes": 2, "gpus_per_node": 4, "gpu": "H100-SXM"}')
    _one_line_error(
        _opcast("compare", "train", "--gpus", "A100-SXM4-80GB,H100-SXM", "--cluster", str(f), *JOB),
        "compare takes its GPUs from --gpus",
    )


def test_overlap_switches_reach_the_prediction_and_their_refusals_are_one_line():
    base = ["predict", "train", "--gpu", "H100-SXM", "--nodes", "1", "--gpus-per-node", "4", *JOB, "--sp", "--json"]
    off, on = _opcast(*base), _opcast(*base, "--tp-comm-overlap")
    assert off.returncode == 0 and on.returncode == 0, on.stderr
    off_doc, on_doc = json.loads(off.stdout), json.loads(on.stdout)
    assert on_doc["config"]["tp_comm_overlap"] is True and off_doc["config"]["tp_comm_overlap"] is False
    assert on_doc["breakdown_s"]["tp_comm"] < off_doc["breakdown_s"]["tp_comm"]
    _one_line_error(
        _opcast("predict", "train", "--gpu", "H100-SXM", *JOB, "--overlap-param-gather", "--overlap-p2p-comm"),
        "--overlap-param-gather needs the distributed optimizer",
        "--overlap-p2p-comm needs --schedule interleaved",
    )
