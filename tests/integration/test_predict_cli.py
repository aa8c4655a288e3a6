"""`opcast predict` end to end through the CLI: JSON keys, traces, batch kernels, and one-line
errors with exit code 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from opcast.cli import main

TRAIN = ["predict", "train", "--arch", "gpt3-350m", "--gpu", "H100-SXM", "--tp", "2", "--pp", "2", "--dp", "2",
         "--micro-batch", "1", "--global-batch", "8", "--seq", "1024", "--sp", "--roofline"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("args", [["predict"], ["predict", "kernel"], ["predict", "kernels"], ["predict", "train"],
                                  ["predict", "infer"]])
def test_help_of_every_predict_command(args, capsys):
    assert main([*args, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_train_json_has_the_documented_keys(capsys):
    assert main([*TRAIN, "--json"]) == 0
    doc = _json(capsys)
    for key in ("iteration_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes", "memory_breakdown_bytes", "fits",
                "breakdown_s", "ops", "cost_sources"):
        assert key in doc, key
    assert set(doc["breakdown_s"]) >= {"forward", "backward", "recompute", "optimizer", "tp_comm", "pp_comm",
                                       "dp_comm_exposed", "pipeline_bubble"}
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["iteration_time_s"])
    op = doc["ops"][0]
    assert {"kind", "params", "count", "time_s", "source"} <= set(op) and op["source"] in ("learned", "roofline")
    assert all(c["source"].startswith("alpha-beta") for c in doc["collectives"])
    assert doc["fits"] is True and doc["config"]["world_size"] == 8


def test_train_summary_trace_and_cluster(tmp_path, capsys):
    trace = tmp_path / "t.json"
    args = [a for a in TRAIN if a not in ()]
    assert main([*args, "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "iteration" in out and "MFU" in out and "memory per GPU" in out
    events = json.loads(trace.read_text())["traceEvents"]
    stages = {e["pid"] for e in events if e["ph"] == "X"}
    assert stages == {0, 1} and any(e["name"].startswith("backward") for e in events)
    assert main(["predict", "train", "--arch", "gpt3-350m", "--gpu", "H100-SXM", "--cluster", "1x8", "--tp", "2",
                 "--global-batch", "8", "--roofline", "--json"]) == 0
    assert _json(capsys)["config"]["dp"] == 4


def test_infeasible_train_lists_every_reason_on_one_line(capsys):
    code = main(["predict", "train", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--nodes", "2", "--gpus-per-node", "8",
                 "--tp", "3", "--pp", "5", "--dp", "2", "--micro-batch", "3", "--global-batch", "16", "--roofline"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("opcast: error: infeasible configuration (")
    for needle in ("tp=3 does not divide", "pp=5 does not divide", "world size 16", "global_batch=16"):
        assert needle in err


def test_infeasible_json_still_prints_the_document(capsys):
    code = main(["predict", "train", "--arch", "megatron-175b", "--gpu", "A100-SXM4-80GB", "--tp", "8",
                 "--global-batch", "8", "--roofline", "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 2 and doc["fits"] is False and doc["feasible"] is False and doc["memory_overflow_bytes"] > 0
    assert "does not fit" in captured.err


@pytest.mark.parametrize("args,needle", [
    (["predict", "train", "--arch", "llama2-7b", "--gpu", "H1000"], "unknown GPU 'H1000'"),
    (["predict", "train", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--models", "/nonexistent/models"], "/nonexistent/models"),
    (["predict", "train", "--arch", "no-such-arch", "--gpu", "H100-SXM"], "unknown arch"),
    (["predict", "train", "--arch", "llama2-7b"], "--gpu is required"),
    (["predict", "kernel", "--gpu", "H100-SXM", "--op", "gemm", "--param", "m=4"], "missing parameter"),
    (["predict", "infer", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--tp", "3", "--roofline"], "tp=3 does not divide"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    if "--models" in args:
        pytest.importorskip("opcast.train.artifacts")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_plot_is_an_optional_extra(tmp_path, capsys):
    out = tmp_path / "b.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main([*TRAIN, "--plot", str(out)]) == 2
        assert "pip install matplotlib" in capsys.readouterr().err
        return
    assert main([*TRAIN, "--plot", str(out)]) == 0 and out.stat().st_size > 1000


def test_kernel_command(capsys):
    assert main(["predict", "kernel", "--gpu", "A100-SXM4-80GB", "--op", "gemm", "--param", "b=1", "--param", "m=4096",
                 "--param", "n=4096", "--param", "k=4096", "--roofline", "--json"]) == 0
    doc = _json(capsys)
    assert doc["source"] == "roofline" and doc["roofline_bound"] == "compute" and doc["time_s"] > 0
    assert main(["predict", "kernel", "--gpu", "A100-SXM4-80GB", "--op", "all_reduce", "--param", "bytes=1048576",
                 "--param", "world_size=8", "--param", "nodes=1", "--param", "gpus_per_node=8", "--json"]) == 0
    assert _json(capsys)["source"].startswith("alpha-beta/")


def test_kernels_fills_every_row(tmp_path, capsys):
    rows = pd.DataFrame([
        {"op": "gemm", "dtype": "bf16", "direction": "fwd", "b": 1, "m": 1024, "n": 1024, "k": 1024},
        {"op": "layernorm", "dtype": "fp32", "direction": "bwd", "rows": 4096, "cols": 1024},
        {"op": "all_gather", "bytes": 1 << 20, "world_size": 8, "nodes": 1, "gpus_per_node": 8},
    ])
    src = tmp_path / "in.csv"
    rows.to_csv(src, index=False)
    out = tmp_path / "out.parquet"
    assert main(["predict", "kernels", str(src), "--gpu", "H100-SXM", "--out", str(out), "--roofline"]) == 0
    got = pd.read_parquet(out)
    assert len(got) == 3 and (got["time_s_pred"] > 0).all()
    assert list(got["source_pred"])[:2] == ["roofline", "roofline"] and got["source_pred"][2].startswith("alpha-beta")
    bad = tmp_path / "bad.csv"
    pd.DataFrame([{"op": "gemm", "b": 1, "m": 2}]).to_csv(bad, index=False)
    assert main(["predict", "kernels", str(bad), "--gpu", "H100-SXM", "--out", str(out)]) == 2
    assert "row 0" in capsys.readouterr().err


def test_infer_json(capsys):
    assert main(["predict", "infer", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--batch", "4", "--prompt-len", "256",
                 "--gen-len", "32", "--roofline", "--json"]) == 0
    doc = _json(capsys)
    for key in ("ttft_s", "tpot_s", "total_latency_s", "tokens_per_s", "kv_cache_bytes", "fits"):
        assert key in doc
