"""benchmarks/aic_serving.py: AIConfigurator's silicon serving rows mapped onto `opcast predict serve --concurrency`,
the rows it does not score counted by why, the InferenceMAX client's lengths, and a bad --csv as one line, exit 2
(a synthetic csv in the published layout; the real one ships in aiconfigurator-core, not in the repository)."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from opcast.predict.cost import roofline_only

from helpers.scripts import load_script, run_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "aic_serving.py"
IMAX = "source_file=2026-04-06.csv; config_id=1"
OTHER = "source_file=/data/h100_sxm/trtllm/1.0.0rc3/qwen.csv; silicon_concurrency=8"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def _row(**kw) -> dict:
    row = dict(
        id="x",
        silicon_data_source=IMAX,
        backend="vllm",
        backend_version="",
        model_path="meta-llama/Llama-3.1-70B",
        system="h100_sxm",
        precision="fp8",
        mode="agg",
        isl=1024,
        osl=1024,
        gemm_quant_mode="fp8",
        moe_quant_mode="fp8",
        batch_size=4.0,
        tp_size=4.0,
        pp_size=1.0,
        attention_dp_size=1.0,
        moe_tp_size=4.0,
        moe_ep_size=1.0,
        silicon_ttft_ms=80.0,
        silicon_tpot_ms=12.0,
    )
    return {**row, **kw}


def _csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_rows_map_to_opcast_and_the_rest_are_counted_by_why(bench, tmp_path):
    rows = [
        _row(),
        _row(silicon_data_source=OTHER, backend="trtllm", model_path="Qwen/Qwen3-32B", gemm_quant_mode="", tp_size=2.0),
        _row(mode="disagg"),
        _row(model_path="zhipuai/GLM-5"),
        _row(system="a30"),
        _row(attention_dp_size=2.0),
    ]
    path = _csv(tmp_path / "silicon_sample.csv", rows)
    got, skipped = bench.read_rows(path, "all")
    frame = pd.read_csv(path)  # the same selection, counted independently
    agg = frame[frame["mode"] == "agg"]
    dense = agg[agg.model_path.isin(bench.ARCHS)]
    assert len(got) == ((dense.system != "a30") & (dense.attention_dp_size.fillna(1) <= 1)).sum() == 2
    assert [(r.protocol, r.engine, r.precision, r.tp, r.concurrency) for r in got] == [
        ("inferencemax", "vllm", "fp8", 4, 4),
        ("other", "trtllm", "bf16", 2, 4),
    ]
    assert sum(skipped.values()) == len(frame) - 2 and skipped["mode disagg (disaggregated prefill and decode)"] == 1
    only, rest = bench.read_rows(path, "inferencemax")
    assert [r.protocol for r in only] == ["inferencemax"] and rest["protocol other (--protocol inferencemax)"] == 1


def test_the_inferencemax_client_draws_lengths_in_its_range_and_a_row_is_predicted(bench, tmp_path):
    (row,), _ = bench.read_rows(_csv(tmp_path / "s.csv", [_row(model_path="meta-llama/Llama-3.1-8B-Instruct")]), "all")
    lengths = bench._lengths(row, 1024)
    assert (lengths.kind, lengths.lo, lengths.hi) == ("uniform", 819, 1024)
    done = bench.predict_row(row, roofline_only(), archs={row.model: bench.load_arch("llama3-8b")})
    assert done.refused == "" and done.pred_ttft_ms > 0 and 0 < done.pred_tpot_ms < 100
    assert done.error("tpot") == pytest.approx(done.pred_tpot_ms / 12.0 - 1)
    text = bench.markdown([done], {"mode disagg": 3}, seconds=1.0, command="c")
    assert "### Protocol inferencemax" in text and "h100_sxm vllm Llama-3.1-8B-Instruct fp8 | 1 |" in text


def test_the_inferencemax_servers_run_as_their_launch_scripts_set_them(bench, tmp_path):
    """vLLM: 8,192 batched tokens and an fp8 KV cache; TensorRT-LLM: 16,384 tokens, an fp8 KV cache, and batch
    waiting (20 steps, 0.9) at ISL/OSL 1024/1024 below TP 8 only; the other rows keep the engine's defaults."""
    rows = [
        _row(),
        _row(backend="trtllm", tp_size=4.0),
        _row(backend="trtllm", tp_size=8.0),
        _row(backend="trtllm", tp_size=4.0, osl=8192),
        _row(silicon_data_source=OTHER, backend="trtllm", tp_size=4.0),
        _row(silicon_data_source=OTHER, backend="vllm", tp_size=4.0),
    ]
    got, _ = bench.read_rows(_csv(tmp_path / "s.csv", rows), "all")
    wait = {"batch_wait_iters": 20, "batch_wait_tokens_ratio": 0.9}
    assert [bench.server_flags(r) for r in got] == [
        {"max_num_batched_tokens": 8192},
        {"max_num_batched_tokens": 16384, **wait},
        {"max_num_batched_tokens": 16384},
        {"max_num_batched_tokens": 16384},
        {},
        {},
    ]
    assert [bench.kv_dtype(r) for r in got] == ["fp8", "fp8", "fp8", "fp8", "fp8", None]
    done = bench.predict_row(got[1], roofline_only(), archs={got[1].model: bench.load_arch("llama3-70b")})
    assert done.refused == "" and done.pred_ttft_ms > 0


def test_a_missing_or_foreign_csv_is_one_line_exit_2(tmp_path):
    missing = run_script(SCRIPT, "--csv", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    out = run_script(SCRIPT, "--csv", str(foreign))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "lacks column(s)" in out.stderr
    assert "Traceback" not in out.stderr


def test_gpt_oss_runs_as_its_inferencemax_scripts_of_the_day(bench, tmp_path):
    """gpt-oss-120b's MXFP4 checkpoint (the csv's nvfp4): bf16 GEMMs. vLLM: Marlin's MoE on Hopper, MXFP8 activations
    on B200; on B200 the fused all-reduce with the scripts' 8 MB limit at TP 8 and a bf16 cache until 2025-12-05,
    vLLM's own limits and an fp8 cache after. TensorRT-LLM: 20,000 tokens a step, its own MoE choice (None here:
    MXFP8 on B200, engine_mxfp4_moe), an fp8 cache on B200 and bf16 on H200, the csv's expert parallelism (the H200
    script's --ep_size=$TP before 2025-11-03); a MoE split over TP and EP at once is skipped with its reason."""
    oss = dict(model_path="openai/gpt-oss-120b", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4")
    early, late = IMAX + "; measured=2025-11-02T00:00:00.000Z", IMAX + "; measured=2026-02-25T00:00:00.000Z"
    trt = dict(oss, backend="trtllm")
    rows = [
        _row(**oss, system="h200_sxm", silicon_data_source=IMAX + "; measured=2026-03-27T00:00:00.000Z"),
        _row(**oss, system="b200_sxm", tp_size=8.0, silicon_data_source=early),
        _row(**oss, system="b200_sxm", tp_size=4.0, silicon_data_source=late),
        _row(**oss, system="b200_sxm", tp_size=1.0, silicon_data_source=late),
        _row(**trt, system="b200_sxm", silicon_data_source=late),
        _row(**trt, system="b200_sxm", tp_size=8.0, moe_tp_size=1.0, moe_ep_size=8.0, silicon_data_source=late),
        _row(**trt, system="h200_sxm", silicon_data_source=early),
        _row(**trt, system="b200_sxm", moe_tp_size=2.0, moe_ep_size=2.0, silicon_data_source=late),
    ]
    got, skipped = bench.read_rows(_csv(tmp_path / "s.csv", rows), "all")
    assert skipped == {bench.GPTOSS_TRTLLM_REASON: 1}
    assert [(r.engine, r.precision, r.quant, r.measured, r.ep) for r in got] == [
        ("vllm", "bf16", "mxfp4", "2026-03-27", 1),
        ("vllm", "bf16", "mxfp4", "2025-11-02", 1),
        ("vllm", "bf16", "mxfp4", "2026-02-25", 1),
        ("vllm", "bf16", "mxfp4", "2026-02-25", 1),
        ("trtllm", "bf16", "mxfp4", "2026-02-25", 1),
        ("trtllm", "bf16", "mxfp4", "2026-02-25", 8),
        ("trtllm", "bf16", "mxfp4", "2025-11-02", 4),
    ]
    assert [bench.mxfp4_moe(r) for r in got] == ["marlin", "mxfp8", "mxfp8", "mxfp8", None, None, None]
    assert [bench.fusions(r) for r in got] == [None, "allreduce_rms:8", "allreduce_rms", None, None, None, None]
    assert [bench.kv_dtype(r) for r in got] == [None, None, "fp8", "fp8", "fp8", "fp8", None]
    assert [bench.server_flags(r) for r in got[4:]] == [{"max_num_batched_tokens": 20000}] * 3
    assert bench.measured_day("source_file=x.csv; measured=2025-11-02T00:00:00.000Z; wip=False") == "2025-11-02"
    assert bench.measured_day("source_file=x.csv") == ""
    archs = {got[2].model: bench.load_arch("gpt-oss-120b")}
    for row in (got[2], got[5]):
        done = bench.predict_row(row, roofline_only(), archs=archs)
        assert done.refused == "" and done.pred_ttft_ms > 0 and done.pred_tpot_ms > 0


def test_deepseek_r1_runs_as_its_h200_scripts_and_its_other_grids_are_counted(bench, tmp_path):
    """DeepSeek-R1 on the H200 grids whose scripts were read: SGLang (measured 2026-03-25) with 32,768-token chunks, the
    experts split over TP and a bf16 cache; TensorRT-LLM (2025-11-02) with CONC + ISL + 64 tokens a step rounded up
    to 64, --ep_size=$TP whatever the csv says, an fp8 cache. Its B200 grid and other days are counted apart."""
    r1 = dict(model_path="deepseek-ai/DeepSeek-R1", system="h200_sxm", tp_size=8.0, moe_tp_size=8.0)
    sglang = IMAX + "; measured=2026-03-25T00:00:00.000Z; image=lmsysorg/sglang:v0.5.9-cu130"
    trt = IMAX + "; measured=2025-11-02T00:00:00.000Z"
    rows = [
        _row(**r1, backend="sglang", silicon_data_source=sglang, moe_quant_mode="fp8_block", batch_size=32.0),
        _row(**r1, backend="trtllm", silicon_data_source=trt, batch_size=16.0, isl=8192, osl=1024),
        _row(**{**r1, "system": "b200_sxm"}, backend="sglang", silicon_data_source=sglang),
        _row(**r1, backend="trtllm", silicon_data_source=IMAX + "; measured=2026-01-14T00:00:00.000Z"),
        _row(**r1, backend="sglang", silicon_data_source=OTHER),
    ]
    got, skipped = bench.read_rows(_csv(tmp_path / "s.csv", rows), "all")
    assert skipped == {bench.DSR1_REASON: 3}
    assert [(r.engine, r.precision, r.ep, r.tp) for r in got] == [("sglang", "fp8", 1, 8), ("trtllm", "fp8", 8, 8)]
    assert [bench.server_flags(r) for r in got] == [
        {"max_num_batched_tokens": 32768},
        {"max_num_batched_tokens": (16 + 8192 + 64 + 63) // 64 * 64},
    ]
    assert bench.server_flags(got[1])["max_num_batched_tokens"] == 8320
    assert [bench.kv_dtype(r) for r in got] == [None, "fp8"]
    done = bench.predict_row(got[0], roofline_only(), archs={got[0].model: bench.load_arch("deepseek-v3")})
    assert done.refused == "" and done.pred_ttft_ms > 0 and done.pred_tpot_ms > 0


def test_an_unknown_model_is_one_line_exit_2(tmp_path):
    path = _csv(tmp_path / "s.csv", [_row()])
    out = run_script(SCRIPT, "--csv", str(path), "--model", "meta-llama/Llama-9")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--model meta-llama/Llama-9" in out.stderr
    assert "Traceback" not in out.stderr
