"""benchmarks/modern_gpus.py provenance options (issue 17): the framework of a row is read from its
source_file, --gemm-framework drops only the GEMM rows of other frameworks, the provenance tables count
and score per source, and bad flags are one line on stderr with exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "modern_gpus.py"
GENERATOR = REPO / "tests" / "fixtures" / "replay" / "make_aiconfigurator_fixture.py"

mg = load_script(SCRIPT, "modern_gpus_benchmark")


def _frame() -> pd.DataFrame:
    src = [
        "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        "h100_sxm/gemm/sglang/0.5.6.post2/gemm_perf.parquet",
        "a100_sxm/gemm/sglang/0.5.10/gemm_perf.parquet",
        "a100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet",
        "a100_sxm/attention/sglang/0.5.10/generation_attention_perf.parquet",
    ]
    return pd.DataFrame(
        {
            "op": ["gemm", "gemm", "gemm", "gemm", "attention"],
            "device": ["H100-SXM", "H100-SXM", "A100-SXM4-80GB", "A100-SXM4-80GB", "A100-SXM4-80GB"],
            "label": ["gemm bf16", "gemm bf16", "gemm bf16", "gemm bf16", "decode bf16"],
            "source_file": src,
            "kernel_name": ["vllm 0.24.0: t", "sglang 0.5.6.post2: s", "sglang 0.5.10: s", "vllm 0.14.0: v", "x"],
            "time_s_median": [1.0, 2.0, 4.0, 1.0, 1.0],
            "pred_model": [1.1, 1.0, 3.0, 0.5, 2.0],
        }
    )


def test_frameworks_are_the_third_part_of_source_file():
    assert mg.frameworks(_frame()).tolist() == ["vllm", "sglang", "sglang", "vllm", "sglang"]


def test_gemm_framework_filter_keeps_other_ops_and_named_frameworks():
    kept = mg.keep_gemm_frameworks(_frame(), ["vllm"])
    assert kept["source_file"].tolist() == [
        "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
        "a100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet",
        "a100_sxm/attention/sglang/0.5.10/generation_attention_perf.parquet",  # not a GEMM: stays
    ]
    assert len(mg.keep_gemm_frameworks(_frame(), ["vllm", "sglang"])) == 5


def test_provenance_and_source_error_tables():
    frame = _frame()
    prov = mg.provenance_table(frame)
    a100 = prov[(prov["system"] == "A100-SXM4-80GB") & (prov["label"] == "gemm bf16")]
    assert a100["rows"].tolist() == [1, 1] and np.allclose(a100["share %"], [50.0, 50.0])
    err = mg.source_error_table(frame).set_index(["system", "source"])
    assert np.isclose(err.loc[("A100-SXM4-80GB", "sglang 0.5.10: s"), "signed_median %"], -25.0)
    assert np.isclose(err.loc[("A100-SXM4-80GB", "vllm 0.14.0: v"), "mape"], 50.0)
    assert np.isclose(err.loc[("H100-SXM", "vllm 0.24.0: t"), "signed_median %"], 10.0)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_provenance_flags_exit_2_with_one_line(tmp_path):
    data = tmp_path / "aiconfigurator.parquet"
    data.write_bytes(b"")
    for args, words in (
        (["--data", str(data), "--gemm-framework", "vllm,"], "--gemm-framework has an empty name"),
        (["--data", str(data), "--precedence", "sglang,vllm"], "--precedence applies to a new replay"),
        (["--data", str(data), "--attention-fill", "yes"], "--attention-fill applies to a new replay"),
        (
            ["--data", str(data), "--attention-precedence", "trtllm", "--attention-fill", "no"],
            "--attention-precedence and --attention-fill apply to a new replay",
        ),
        (["--data", str(data), "--attention-precedence", ",vllm"], "--attention-precedence has an empty name"),
    ):
        proc = _run(*args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr


def _replayed_fixture(out: Path) -> Path:
    """The synthetic AIConfigurator fixture, replayed into ``out/aiconfigurator.parquet``."""
    import opcast
    from opcast.collect.replay import aiconfigurator
    from opcast.collect.replay.common import normalise
    from opcast.schema import write_parquet

    root = Path(tempfile.mkdtemp(prefix="opcast-aic-fixture-"))
    try:
        generator = load_script(GENERATOR, register=False)
        generator.HERE = root
        generator.main()
        rows, _ = normalise(
            aiconfigurator.replay(root), source="aiconfigurator", run_id="t", opcast_version=opcast.__version__
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return write_parquet(rows, out / "aiconfigurator.parquet")


def test_gemm_framework_absent_from_the_data_exits_2_naming_those_present(tmp_path):
    data = _replayed_fixture(tmp_path)
    present = sorted(set(mg.frameworks(pd.read_parquet(data, columns=["op", "source_file"]).query("op == 'gemm'"))))
    assert present, "the fixture has gemm rows"
    proc = _run("--data", str(data), "--sections", "logo", "--gemm-framework", "vlm")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no gemm rows of vlm" in lines[0] and ", ".join(present) in lines[0], proc.stderr


def test_replay_takes_the_attention_rule(tmp_path, monkeypatch):
    """--attention-precedence / --attention-fill reach the replay: on the synthetic fixture (read in
    place of the installed package), TensorRT-LLM's prefill bf16 row is left out by default (vLLM
    measured that system's prefill bf16 rows) and kept when it comes first."""
    from opcast.collect.replay import aiconfigurator

    root = tmp_path / "fixture"
    generator = load_script(GENERATOR, register=False)
    generator.HERE = root
    generator.main()
    monkeypatch.setattr(aiconfigurator, "default_root", lambda: root)

    def prefill_bf16(out: Path, **rule) -> dict:
        frame = pd.read_parquet(mg.replay_aiconfigurator(out, **rule))
        frame = frame[(frame["op"] == "attention") & (frame["seq_q"] > 1) & (frame["dtype"] == "bf16")]
        return dict(zip(zip(frame["batch"], frame["seq_q"]), mg.frameworks(frame)))

    assert prefill_bf16(tmp_path / "a") == {(2, 1024): "vllm", (4, 2048): "vllm"}
    assert prefill_bf16(tmp_path / "b", attention_precedence=("trtllm", "vllm")) == {(2, 1024): "trtllm"}
    assert prefill_bf16(tmp_path / "c", attention_precedence=("trtllm", "vllm"), attention_fill=True) == {
        (2, 1024): "trtllm",
        (4, 2048): "vllm",
    }
