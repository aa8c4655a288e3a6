"""`opcast predict serve` through the real console script: a result with its trace and its plot, and every
bad input refused in one line with exit code 2 and nothing written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

OPCAST = [sys.executable, "-m", "opcast"]
BASE = ["predict", "serve", "--arch", "gpt3-125m", "--gpu", "H100-SXM", "--roofline"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*OPCAST, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_serve_help_lists_the_serve_options(capsys):
    from opcast.cli import main

    assert main(["predict", "serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--rate",
        "--concurrency",
        "--trace-file",
        "--engine",
        "--max-num-seqs",
        "--slo-tpot-s",
        "--replicas",
        "--tp",
        "--plot",
    ):
        assert flag in out


def test_serve_prints_metrics_as_json_and_writes_a_perfetto_trace(tmp_path):
    trace = tmp_path / "steps.json"
    args = [*BASE, "--replicas", "2", "--router", "least_loaded", "--rate", "40", "--num-requests", "200"]
    args += ["--input-len", "64:256", "--output-len", "32", "--slo-ttft-s", "0.5", "--slo-tpot-s", "0.05"]
    p = _run(*args, "--json", "--trace", str(trace), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    m = doc["metrics"]
    assert m["requests"] == 200 and sum(m["per_replica_requests"]) == 200
    assert 0 < m["ttft"]["p50_s"] <= m["ttft"]["p90_s"] <= m["ttft"]["p99_s"]
    assert m["output_tokens_per_s"] == pytest.approx(m["requests_per_s"] * 32)
    assert 0 <= m["slo_attainment"] <= 1 and m["goodput_requests_per_s"] <= m["requests_per_s"] + 1e-9
    assert doc["gpus"] == 2 and doc["engine"]["engine"] == "vllm" and doc["cost_sources"] == ["roofline"]
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X"]
    assert len(steps) == m["steps"] and {e["pid"] for e in steps} == {0, 1}
    assert sum(e["args"]["prefill_tokens"] for e in steps) >= 200 * 64


def test_a_closed_loop_of_clients_is_served_as_a_benchmark_client_sends_it(tmp_path):
    args = [*BASE, "--concurrency", "8", "--num-requests", "40", "--input-len", "200", "--output-len", "20"]
    p = _run(*args, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    m = doc["metrics"]
    assert m["requests"] == 40 and m["output_tokens_per_s"] == pytest.approx(m["requests_per_s"] * 20)
    assert doc["requests_source"] == "closed loop, 8 in flight, seed 0"
    assert 0 < m["ttft"]["p50_s"] <= m["ttft"]["p99_s"] and m["tpot"]["mean_s"] > 0


def test_trtllm_batch_waiting_holds_prompts_beside_decodes(tmp_path):
    """A closed loop of 4 clients on TensorRT-LLM: with batch waiting (20 steps, 0.9 of the tokens), a prompt that
    arrives while others decode waits up to 20 steps, so the mean TTFT grows by several decode steps."""
    args = [*BASE, "--engine", "trtllm", "--concurrency", "4", "--num-requests", "40", "--input-len", "200:400"]
    args += ["--output-len", "40:60", "--json"]
    plain = _run(*args, cwd=tmp_path)
    waits = _run(*args, "--batch-wait-iters", "20", "--batch-wait-tokens-ratio", "0.9", cwd=tmp_path)
    assert plain.returncode == 0 and waits.returncode == 0, plain.stderr + waits.stderr
    before, after = json.loads(plain.stdout), json.loads(waits.stdout)
    assert after["engine"]["batch_wait_iters"] == 20 and after["engine"]["batch_wait_tokens_ratio"] == 0.9
    assert before["engine"]["batch_wait_iters"] == 0
    tpot_s = after["metrics"]["tpot"]["mean_s"]
    grew = after["metrics"]["ttft"]["mean_s"] - before["metrics"]["ttft"]["mean_s"]
    assert 3 * tpot_s < grew < 21 * tpot_s
    alone = _run(*args, "--batch-wait-iters", "20", cwd=tmp_path)  # one setting alone: nothing held, and said
    assert alone.returncode == 0, alone.stderr
    doc = json.loads(alone.stdout)
    assert doc["metrics"] == before["metrics"] and any("only together" in n for n in doc["notes"])


def _bad_traces(tmp_path: Path) -> dict[str, Path]:
    empty = tmp_path / "empty.csv"
    empty.write_text("arrival_s,input_tokens,output_tokens\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,10,10\n1,ten,10\n")
    return {"empty": empty, "bad": bad}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rate", "0"], "--rate 0.0 must be a finite number > 0"),
        (["--rate", "-2"], "--rate -2.0 must be"),
        ([], r"--rate \(requests/s\) or --concurrency \(requests in flight\) is required"),
        (["--concurrency", "0"], "--concurrency 0 must be >= 1"),
        (["--concurrency", "4", "--rate", "2"], r"give either --rate \(arrivals at a rate\) or --concurrency"),
        (["--trace-file", "{bad}", "--concurrency", "3"], "give either --trace-file or --concurrency, not both"),
        (["--trace-file", "{empty}"], "has no requests"),
        (["--trace-file", "{bad}"], "line 3"),
        (["--trace-file", "{bad}", "--rate", "3"], "give either --trace-file or --rate"),
        (["--rate", "1", "--arch", "llama3-405b"], r"does not fit in memory .* by [\d.]+ GiB"),
        (["--rate", "1", "--input-len", "0"], "--input-len '0'"),
        (["--rate", "1", "--engine", "tgi"], "--engine 'tgi' is not one of vllm, sglang, trtllm"),
        (["--rate", "1", "--disaggregate", "2:0"], r"--disaggregate '2:0' must be P:D, .*each >= 1\)"),
        (["--rate", "1", "--disaggregate", "1:1", "--replicas", "2"], "either --replicas or --disaggregate"),
        (
            ["--rate", "1", "--batch-wait-iters", "20", "--batch-wait-tokens-ratio", "0.9"],
            r"batch waiting .* is TensorRT-LLM's .* not vllm's; give --engine trtllm",
        ),
        (["--rate", "1", "--engine", "trtllm", "--batch-wait-tokens-ratio", "2"], r"must lie in \[0, 1\]"),
    ],
)
def test_bad_inputs_are_one_line_exit_2_and_write_nothing(tmp_path, extra, message):
    files = _bad_traces(tmp_path)
    extra = [e.format(**files) for e in extra]
    out = tmp_path / "steps.json"
    p = _run(*BASE, "--num-requests", "20", *extra, "--trace", str(out), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: "), p.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.csv", "empty.csv"]


def test_disaggregated_serving_reports_its_pools_and_kv_transfers(tmp_path):
    trace = tmp_path / "steps.json"
    args = [*BASE, "--disaggregate", "1:2", "--rate", "40", "--num-requests", "50", "--input-len", "128"]
    p = _run(*args, "--output-len", "16", "--json", "--trace", str(trace), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    d, m = doc["disaggregated"], doc["metrics"]
    assert doc["replicas"] == 3 and doc["gpus"] == 3 and d["prefill_replicas"] == 1 and d["decode_replicas"] == 2
    assert m["requests"] == 50 and sum(m["per_replica_requests"]) == 100  # prefilled once, decoded once
    kv = d["kv_transfer"]
    assert kv["transfers"] == 50 and kv["within_node"] == 50  # 3 GPUs of one 8-GPU H100 node
    assert kv["kv_bytes_per_token_per_gpu"] == doc["kv_cache"]["kv_bytes_per_token_per_gpu"]
    assert kv["bytes_per_gpu"] == pytest.approx(kv["kv_bytes_per_token_per_gpu"] * 128 * 50)
    assert 0 < kv["time"]["p50_s"] <= kv["handoff"]["p99_s"]
    assert d["pools"]["prefill"]["requests"] == d["pools"]["decode"]["requests"] == 50
    assert 0 < d["pools"]["prefill"]["busy_fraction"] < 1 and 0 < d["pools"]["decode"]["busy_fraction"] < 1
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["name"] == "kv transfer" for e in events) == 50
    steps = [e for e in events if e["ph"] == "X" and e["name"] != "kv transfer"]
    assert {e["name"] for e in steps if e["pid"] == 0} == {"prefill"}
    assert {e["name"] for e in steps if e["pid"] > 0} == {"decode"}


# --------------------------------------------------------------------------- --plot (issue 20)

SMALL = [*BASE, "--rate", "40", "--num-requests", "30", "--input-len", "64:256", "--output-len", "8"]


@pytest.mark.parametrize(
    ("deploy", "name", "magic"),
    [
        (["--replicas", "2", "--slo-ttft-s", "0.5", "--slo-tpot-s", "0.05"], "serve.png", b"\x89PNG"),
        (["--disaggregate", "3:3", "--slo-ttft-s", "0.5"], "serve.svg", b"<?xml"),  # > 4 replicas: pools summed
    ],
)
def test_serve_plot_writes_the_figure_the_suffix_names(tmp_path, deploy, name, magic):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra opcast[plot]")
    out = tmp_path / "figs" / name  # a folder not there yet is made
    p = _run(*SMALL, *deploy, "--plot", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "TTFT" in p.stdout and out.stat().st_size > 1000 and out.read_bytes().startswith(magic)


@pytest.mark.parametrize("where", ["under_a_file", "bad_suffix"])
def test_unwritable_plot_is_one_line_exit_2_before_any_work(tmp_path, where):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra opcast[plot]")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    plot = blocker / "serve.png" if where == "under_a_file" else tmp_path / "serve.xyz"
    trace = tmp_path / "steps.json"
    p = _run(*SMALL, "--json", "--trace", str(trace), "--plot", str(plot), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: --plot"), p.stderr
    assert ("which is a file" if where == "under_a_file" else "not .xyz") in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not plot.exists()
    assert p.stdout == "" and not trace.exists()  # refused before the simulation: nothing printed or half-written


def test_serve_plot_without_matplotlib_is_the_one_line_extra_hint(tmp_path, monkeypatch, capsys):
    from opcast.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "serve.png"
    assert main([*SMALL, "--json", "--plot", str(out)]) == 2
    got = capsys.readouterr()
    err = got.err.strip()
    assert "pip install 'opcast[plot]'" in err and "\n" not in err and "Traceback" not in err
    assert got.out == "" and not out.exists()  # said before the simulation ran
