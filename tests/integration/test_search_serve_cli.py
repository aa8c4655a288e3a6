"""`opcast search` as a group through the real console script: `search serve` finds a deployment
whose numbers `predict serve` reproduces, `search --arch ...` still runs the training search (also as
`search train`), the help shows both, and every bad input is one line on stderr with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

OPCAST = [sys.executable, "-m", "opcast"]
STREAM = ["--rate", "60", "--num-requests", "120", "--input-len", "64:512", "--output-len", "8:64", "--seed", "1"]
SERVE = ["search", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "4", "--roofline", *STREAM]
SLOS = ["--slo-ttft-s", "0.2", "--slo-tpot-s", "0.02"]
TRAIN = ["--arch", "gpt3-125m", "--gpu", "H100-SXM", "--gpus", "8", "--global-batch", "16", "--seq", "1024"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*OPCAST, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_help_shows_both_commands_and_the_training_options(tmp_path):
    p = _run("search", "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for part in ("train", "serve", "--global-batch", "--objective", "--cluster"):
        assert part in p.stdout
    p = _run("search", "serve", "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for flag in ("--slo-percentile", "--slo-ttft-s", "--rate", "--max-num-seqs", "--use-all-gpus", "--cluster"):
        assert flag in p.stdout


def test_search_without_a_command_is_search_train(tmp_path):
    docs = []
    for prefix in (["search"], ["search", "train"]):
        p = _run(*prefix, *TRAIN, "--roofline", "--top", "1", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        docs.append(json.loads(p.stdout))
    assert docs[0]["top"] == docs[1]["top"] and docs[0]["considered"] == docs[1]["considered"]


def test_search_serve_finds_a_deployment_predict_serve_reproduces(tmp_path):
    p = _run(*SERVE, *SLOS, "--tp", "1,2", "--max-num-seqs", "16,128", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    ranked = doc["ranked"]
    assert ranked and doc["counts"]["meets_slo"] == len(ranked)
    values = [r["goodput_requests_per_s_per_gpu"] for r in ranked]
    assert values == sorted(values, reverse=True)
    assert all(r["ttft_p90_s"] <= 0.2 and r["tpot_p90_s"] <= 0.02 for r in ranked)
    assert {r["tp"] for r in ranked + doc["others"]} == {1, 2}
    assert doc["considered"] == sum(doc["counts"].values())
    best = ranked[0]
    args = ["predict", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM", "--roofline", *STREAM, *SLOS]
    args += ["--tp", str(best["tp"]), "--replicas", str(best["replicas"])]
    args += [
        "--max-num-seqs",
        str(best["max_num_seqs"]),
        "--max-num-batched-tokens",
        str(best["max_num_batched_tokens"]),
    ]
    p = _run(*args, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    alone = json.loads(p.stdout)["metrics"]
    assert alone == doc["best"]["metrics"]
    assert alone["goodput_requests_per_s"] / (best["tp"] * best["replicas"]) == best["goodput_requests_per_s_per_gpu"]
    p = _run(*SERVE, *SLOS, "--tp", "1,2", "--max-num-seqs", "16,128", cwd=tmp_path)  # the table
    assert p.returncode == 0 and "meeting the SLOs" in p.stdout and "best deployment" in p.stdout


def test_search_serve_disaggregate_finds_a_split_predict_serve_reproduces(tmp_path):
    """Under a tight TPOT SLO, --disaggregate auto finds a prefill/decode split with more goodput per GPU
    than any colocated tp=1 deployment, and `predict serve --disaggregate P:D` gives its very metrics;
    off (the default) ranks colocated deployments only."""
    tight = ["--slo-ttft-s", "0.2", "--slo-tpot-s", "0.006", "--tp", "1", "--max-num-seqs", "128"]
    p = _run(*SERVE, *tight, "--disaggregate", "auto", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["disaggregate"] == "auto"
    best = doc["ranked"][0]
    assert best["prefill_replicas"] and best["decode_replicas"]
    assert best["replicas"] == best["prefill_replicas"] + best["decode_replicas"] and best["gpus"] == best["replicas"]
    split = f"{best['prefill_replicas']}:{best['decode_replicas']}"
    args = ["predict", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM", "--roofline", *STREAM, *tight[:4]]
    args += ["--tp", "1", "--disaggregate", split, "--max-num-seqs", "128"]
    args += ["--max-num-batched-tokens", str(best["max_num_batched_tokens"])]
    p = _run(*args, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    alone = json.loads(p.stdout)["metrics"]
    assert alone == doc["best"]["metrics"]
    assert alone["goodput_requests_per_s"] / best["gpus"] == best["goodput_requests_per_s_per_gpu"]
    p = _run(*SERVE, *tight, "--disaggregate", "auto", cwd=tmp_path)  # the table names the pools
    assert p.returncode == 0 and f"{split.replace(':', 'P+')}D x 1 x 1" in p.stdout, p.stdout
    p = _run(*SERVE, *tight, "--json", cwd=tmp_path)  # off by default: colocated only, less goodput per GPU
    assert p.returncode == 0, p.stderr
    off = json.loads(p.stdout)
    assert off["disaggregate"] == "off" and off["ranked"]
    assert all(r["prefill_replicas"] is None for r in off["ranked"] + off["others"])
    assert off["ranked"][0]["goodput_requests_per_s_per_gpu"] < best["goodput_requests_per_s_per_gpu"]


def test_search_serve_prices_prefix_cache_hits_as_predict_serve_does(tmp_path):
    hit = ("--prefix-cache-hit", "1")
    p = _run(*SERVE, *SLOS, "--tp", "1", "--max-num-seqs", "128", *hit, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    warm = json.loads(p.stdout)
    p = _run(*SERVE, *SLOS, "--tp", "1", "--max-num-seqs", "128", "--json", cwd=tmp_path)
    cold = json.loads(p.stdout)
    assert warm["best"]["metrics"]["ttft"]["p50_s"] < cold["best"]["metrics"]["ttft"]["p50_s"]
    best = warm["ranked"][0]
    args = ["predict", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM", "--roofline", *STREAM, *SLOS, *hit]
    args += ["--tp", "1", "--replicas", str(best["replicas"]), "--max-num-seqs", "128"]
    args += ["--max-num-batched-tokens", str(best["max_num_batched_tokens"])]
    p = _run(*args, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"] == warm["best"]["metrics"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SERVE], "--objective goodput needs an SLO"),
        ([*SERVE, *SLOS, "--tp", "2,x"], "--tp '2,x': give whole numbers"),
        ([*SERVE, *SLOS, "--slo-percentile", "95"], "--slo-percentile 95 is not one of 50, 90, 99"),
        ([*SERVE, *SLOS, "--disaggregate", "0:2"], "--disaggregate '0:2' must be off, auto or P:D pairs"),
        ([*SERVE, *SLOS, "--disaggregate", "1:1,3:3"], "--disaggregate 3:3 needs more replicas than --gpus 4"),
        ([*SERVE, "--slo-ttft-s", "0.0001"], "no deployment of llama3-8b on up to 4 x H100-SXM meets TTFT p90"),
        ([*SERVE, *SLOS, "--arch", "llama3-405b"], "do not fit .*does not fit in memory"),
        ([*SERVE, *SLOS, "--cluster", "2x8", "--gpus", "32"], "--gpus 32 exceeds the 16 GPUs of --cluster 2x8"),
        ([*SERVE, *SLOS, "--cluster", "2x8", "--gpus-per-node", "8"], "or --nodes/--gpus-per-node, not both"),
        (["search", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM", *STREAM, *SLOS], "--gpus is required"),
        (["search", "trian", *TRAIN], "No such command 'trian'"),
        ([*SERVE, *SLOS, "--prefix-cache-hit", "2"], "--prefix-cache-hit 2.0 must be a fraction"),
        (["search", *TRAIN, "--cluster", "dgx-h100"], "--cluster dgx-h100 sets the GPU"),
    ],
)
def test_bad_inputs_are_one_line_exit_2(tmp_path, args, message):
    import re

    p = _run(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: "), p.stderr
    assert re.search(message, lines[0]), lines[0]
