"""benchmarks/inference_bench.py: LLM-Inference-Bench's csv mapped onto `opcast predict infer`, rows opcast cannot
map counted by why, the weight-read screen, and a bad --csv as one line, exit 2 (a synthetic csv in the
published layout; the real one is not in the repository)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from helpers.scripts import load_script, run_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_bench.py"
HEADER = [
    "Hardware",
    "Num of Hardware",
    "Framework",
    "Model",
    "Input Output Length",
    "Batch Size",
    "Latency",
    "Throughput",
]


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def _csv(path: Path, rows: list[list]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


def test_rows_map_to_opcast_and_the_rest_are_counted_by_why(bench, tmp_path):
    path = _csv(
        tmp_path / "All_results.csv",
        [
            ["Nvidia A100 GPU", 2, "vLLM", "meta-llama/Meta-Llama-3-8B", 128, 16, 3.5, 0],
            ["AMD MI300X GPU", 1, "vLLM", "mistralai/Mistral-7B-v0.1", 256, 1, 2.0, 0],
            ["Nvidia H100 GPU", 1, "llama.cpp", "meta-llama/Meta-Llama-3-8B", 128, 1, 1.0, 0],
            ["Habana Gaudi2", 1, "Deepspeed", "meta-llama/Meta-Llama-3-8B", 128, 1, 1.0, 0],
            ["Nvidia GH200 GPU", 1, "TensorRT-LLM", "facebook/opt-6.7b", 128, 1, 1.0, 0],
        ],
    )
    rows, skipped = bench.read_rows(path)
    assert rows == [
        bench.Row(gpu="A100-SXM4-40GB", engine="vllm", arch="llama3-8b", tp=2, batch=16, length=128, measured_s=3.5),
        bench.Row(gpu="MI300X", engine="vllm", arch="mistral-7b", tp=1, batch=1, length=256, measured_s=2.0),
    ]
    assert skipped == {
        "not vLLM or TensorRT-LLM": 1,
        "a GPU opcast does not map": 1,
        "no opcast preset of the model": 1,
    }


def test_a_batch_faster_than_reading_its_weights_per_token_is_dropped_not_scored(bench):
    # llama3-8b on one H100: 16 GB of fp16 weights, 3.35 TB/s: 2048 tokens need at least ~9.6 s
    fast = bench.Row(gpu="H100-SXM", engine="trtllm", arch="llama3-8b", tp=1, batch=1, length=2048, measured_s=0.08)
    real = bench.Row(gpu="H100-SXM", engine="trtllm", arch="llama3-8b", tp=1, batch=1, length=2048, measured_s=15.0)
    scored, dropped = bench.score([fast, real], None)
    assert [s.row for s in scored] == [real]
    assert dropped == {"faster than reading the weights once a generated token": 1, "refused by opcast": 0}
    assert 9.0 < scored[0].predicted_s < 30.0 and scored[0].roofline_s < scored[0].predicted_s


def test_a_missing_or_foreign_csv_is_one_line_exit_2(tmp_path):
    missing = run_script(SCRIPT, "--csv", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "clone" in missing.stderr
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    out = run_script(SCRIPT, "--csv", str(foreign))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "lacks column(s)" in out.stderr
    assert "Traceback" not in out.stderr
