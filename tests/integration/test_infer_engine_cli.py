"""`--engine` of `opcast predict infer`, `explore infer` and `compare infer`: the serving framework's
per-step overhead in the numbers, the breakdown and the cost sources; a bad engine is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.cli import main
from opcast.predict.serve.engine import OVERHEADS

INFER = ["--arch", "llama2-7b", "--gpu", "H100-SXM", "--batch", "4", "--prompt-len", "128", "--gen-len", "8"]
INFER += ["--roofline"]


def _infer_json(capsys, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["predict", "infer", *INFER, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_infer_engine_adds_its_step_overhead_and_says_so(capsys):
    none, sglang = _infer_json(capsys), _infer_json(capsys, "--engine", "sglang")
    step = OVERHEADS["sglang"].time_s(4)
    assert none["config"]["engine"] == "none" and sglang["config"]["engine"] == "sglang"
    # the engine's forward differs from the bare one only by its one-kernel rope (ENGINE_KERNELS), faster
    for phase, total in (("prefill", "ttft_s"), ("decode_step", "tpot_s")):
        parts = sglang["breakdown_s"][phase]
        assert sglang[total] == pytest.approx(sum(parts.values()))
        assert parts["compute"] < none["breakdown_s"][phase]["compute"]
    assert sglang["breakdown_s"]["prefill"]["overhead"] == pytest.approx(step)
    assert sglang["breakdown_s"]["decode_step"]["overhead"] == pytest.approx(step)
    assert "overhead" not in none["breakdown_s"]["prefill"]
    src = sglang["cost_sources"]["step_overhead"]
    assert src["engine"] == "sglang" and "estimate" in src["source"]
    assert "step_overhead" not in none["cost_sources"]
    assert main(["predict", "infer", *INFER, "--engine", "trtllm"]) == 0
    out = capsys.readouterr().out
    assert "overhead" in out and "trtllm step overhead" in out and "estimate" in out


def test_compare_and_explore_infer_take_the_engine(capsys):
    def doc(args: list[str]) -> dict:
        capsys.readouterr()
        assert main([*args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    # gpt3-6.7b has learned positions, no rope: the engine's forward is the bare one plus its step overhead
    common = ["--arch", "gpt3-6.7b", *[a for a in INFER[2:] if a not in ("--gpu", "H100-SXM")]]
    step = OVERHEADS["vllm"].time_s(4)
    compare = ["compare", "infer", "--gpus", "H100-SXM,A100-SXM4-80GB", *common]
    base, vllm = doc(compare)["gpus"], doc([*compare, "--engine", "vllm"])["gpus"]
    for b, v in zip(base, vllm):  # total latency: the prefill and 7 decode steps each pay one step
        assert v["time_s"] == pytest.approx(b["time_s"] + 8 * step)
    explore = ["explore", "infer", "--gpu", "H100-SXM", "--vary", "mem_bw_bytes_per_s=1,2", *common]
    base, vllm = doc(explore)["points"], doc([*explore, "--engine", "vllm"])["points"]
    for b, v in zip(base, vllm):
        assert v["ttft_s"] == pytest.approx(b["ttft_s"] + step)
        assert v["tpot_s"] == pytest.approx(b["tpot_s"] + step)


@pytest.mark.parametrize("command", [["predict", "infer"], ["compare", "infer", "--gpus", "H100-SXM"]])
def test_bad_engine_is_one_line_exit_2_through_the_console_script(command):
    script = Path(sys.executable).with_name("opcast")
    args = [a for a in INFER if command[0] == "predict" or a not in ("--gpu", "H100-SXM")]
    out = subprocess.run([str(script), *command, *args, "--engine", "tgi"], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    err = out.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err == "opcast: error: --engine 'tgi' is not one of none, vllm, sglang, trtllm"
    assert out.stdout == ""


def test_the_time_split_still_sums_to_the_total_with_an_engine(capsys):
    # the per-step CPU overhead is time the GPU waits: it joins the bubble part, one row per phase
    doc = _infer_json(capsys, "--engine", "vllm")
    split = doc["time_split_s"]
    assert sum(split.values()) == pytest.approx(doc["total_latency_s"], rel=1e-9)
    assert split["bubble"] == pytest.approx(OVERHEADS["vllm"].time_s(4) * 8)  # 1 prefill + 7 decode steps


def test_a_batch_past_the_engines_kv_cache_runs_in_waves_through_the_console_script():
    """Without an engine the batch is refused (one line, exit 2); with one it is priced in waves of what its KV
    cache holds, and says so."""
    script = Path(sys.executable).with_name("opcast")
    big = ["predict", "infer", "--arch", "llama2-7b", "--gpu", "A100-SXM4-40GB", "--batch", "64"]
    big += ["--prompt-len", "2048", "--gen-len", "2048", "--roofline"]
    refused = subprocess.run([str(script), *big], capture_output=True, text=True)
    assert refused.returncode == 2 and "does not fit" in refused.stderr and "Traceback" not in refused.stderr
    run = subprocess.run([str(script), *big, "--engine", "trtllm", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    waves = doc["cost_sources"]["waves"]
    assert doc["feasible"] and doc["config"]["batch"] == 64 and 1 <= waves["sequences_at_once"] < 64
    assert waves["waves"] == -(-64 // waves["sequences_at_once"])
    assert doc["total_latency_s"] > doc["ttft_s"] + 2047 * doc["tpot_s"]  # more than one wave's time
    assert any("waves of at most" in n for n in doc["cost_sources"]["notes"])


def test_an_old_vllm_release_prices_its_own_step_overhead_in_infer_and_serve():
    """--engine-version before 0.6 selects vLLM's measured synchronous-output overhead, in predict infer and in the
    serving simulator's report, through the console script."""
    script = Path(sys.executable).with_name("opcast")
    old = subprocess.run(
        [str(script), "predict", "infer", *INFER, "--engine", "vllm", "--engine-version", "0.5.4", "--json"],
        capture_output=True,
        text=True,
    )
    assert old.returncode == 0, old.stderr
    doc = json.loads(old.stdout)
    assert doc["cost_sources"]["step_overhead"]["fixed_s"] == pytest.approx(0.7e-3)
    assert doc["cost_sources"]["step_overhead"]["per_seq_s"] == pytest.approx(50e-6)
    serve = ["predict", "serve", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--rate", "2", "--num-requests", "20"]
    serve += ["--input-len", "128", "--output-len", "16", "--roofline", "--engine", "vllm"]
    new_run = subprocess.run([str(script), *serve], capture_output=True, text=True)
    old_run = subprocess.run([str(script), *serve, "--engine-version", "0.5.4"], capture_output=True, text=True)
    assert new_run.returncode == 0 and old_run.returncode == 0, old_run.stderr
    assert "700 us + 50 us/seq" in old_run.stdout and "400 us + 2 us/seq" in new_run.stdout
