"""benchmarks/nemo_public.py: the published NeMo / Megatron-Bridge rows, their mapping to ``opcast predict
train`` options, and one prediction through the library and the console script."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "nemo_public.py"


@pytest.fixture(scope="module")
def nemo():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def rows(nemo):
    return {r.row: r for r in nemo.read_rows()}


def test_csv_has_every_column_and_each_row_is_predicted_or_skipped_for_a_reason(nemo, rows):
    with nemo.CSV_PATH.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert set(nemo.REQUIRED) <= set(header)
    assert len(rows) >= 30
    from opcast.archs import load_arch

    predicted = [r for r in rows.values() if not r.skip_reason]
    assert len(predicted) >= 25
    for r in rows.values():
        assert r.source_url.startswith("https://"), r.row
        if r.skip_reason:
            continue
        assert r.system in nemo.CLUSTERS and r.precision in nemo.PRECISIONS, r.row
        assert load_arch(r.arch).n_layers > 0
    assert {r.system for r in predicted} == {"DGX-H100", "DGX-B200", "DGX-GB200"}
    published = {"NVFP4": "nvfp4", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}
    block = [r for r in rows.values() if r.precision_published in published]
    assert len(block) >= 5 and all(r.precision == published[r.precision_published] for r in block)
    assert {r.precision for r in block if not r.skip_reason} == {"mxfp8", "nvfp4"}


def test_every_mapping_has_the_published_world_size(nemo, rows):
    for r in rows.values():
        if r.skip_reason:
            with pytest.raises(ValueError, match="skipped"):
                nemo.row_options(r)
            continue
        v = nemo.row_options(r)
        assert v["tp"] * v["pp"] * v["cp"] * v["dp"] == r.n_gpus, r.row
        assert v["global_batch"] % (v["micro_batch"] * v["dp"]) == 0, r.row
        if r.ga is not None:
            assert v["global_batch"] // (v["micro_batch"] * v["dp"]) == r.ga, r.row


def test_hand_checked_h100_row_with_tp_pp_and_interleaving(nemo, rows):
    # Megatron-Bridge 26.04.01, DGX-H100, Llama 3 70B FP8: 64 GPUs, GBS 256, MBS 1, 8192, TP 4, PP 8, VP 5
    v = nemo.row_options(rows["26.04.01-h100-llama3-70b-fp8"])
    assert v == {
        "arch": "llama3-70b",
        "cluster": "dgx-h100",
        "tp": 4,
        "pp": 8,
        "cp": 1,
        "dp": 2,
        "micro_batch": 1,
        "global_batch": 256,
        "seq": 8192,
        "precision": "fp8",
        "framework": "megatron",
        "zero": 1,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "sp": True,
        "tp_comm_overlap": True,
        "schedule": "interleaved",
        "virtual_stages": 5,
        "overlap_p2p_comm": True,
    }


def test_hand_checked_fsdp_and_multi_rack_gb200_rows(nemo, rows):
    # NeMo 25.04, DGX-GB200, Llama 3 70B FP8 with FSDP: 64 GPUs of one NVL72 rack, TP = PP = CP = 1
    v = nemo.row_options(rows["25.04-gb200-llama3-70b"])
    assert v["cluster"] == "gb200-nvl72" and v["zero"] == 3 and v["dp"] == 64
    assert not {"sp", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "schedule"} & v.keys()
    # Megatron-Bridge 25.11, 256 GB200: four racks of 64, 405B split counting embedding and loss as layers
    v = nemo.row_options(rows["25.11-gb200-llama3.1-405b-fp8cs"])
    assert (v["cluster"], v["gpus_per_node"]) == ("gb200-nvl72:4", 64) and "gpu" not in v and "nodes" not in v
    assert (v["tp"], v["pp"], v["cp"], v["dp"], v["virtual_stages"]) == (4, 16, 1, 4, 4)
    assert v["pp_partition"] == "megatron:embedding,loss"


def test_bad_rows_are_refused_with_the_reason(nemo, rows, tmp_path):
    good = rows["25.11-h100-llama3-8b-fp8cs"]
    with nemo.CSV_PATH.open(newline="", encoding="utf-8") as f:
        rec = next(r for r in csv.DictReader(f) if r["row"] == good.row)
    with pytest.raises(ValueError, match="GA 7"):
        nemo.parse_row({**rec, "ga": "7"}, "x")
    with pytest.raises(ValueError, match="does not divide"):
        nemo.parse_row({**rec, "tp": "3"}, "x")
    with pytest.raises(ValueError, match="system 'DGX-GB300'"):
        nemo.parse_row({**rec, "system": "DGX-GB300"}, "x")
    assert nemo.parse_row({**rec, "system": "DGX-GB300", "skip_reason": "no cluster"}, "x").skip_reason


def test_one_row_in_process_matches_the_console_script(nemo, rows):
    row = rows["24.07-h100-llama2-7b"]
    pred = nemo.predict_row(row)
    assert pred.feasible and pred.tokens_per_s_per_gpu is not None
    assert 0.5 < pred.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu < 2  # a sane prediction, not a tuned one
    assert abs(sum(pred.shares.values()) - 1) < 1e-6 and pred.fp8_gemm.endswith(")")
    words = shlex.split(nemo.cli_command(nemo.row_options(row)))
    assert words[:3] == ["opcast", "predict", "train"]
    out = subprocess.run(
        [sys.executable, "-m", "opcast", *words[1:], "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    cli_tokens = json.loads(out.stdout)["tokens_per_s"]
    assert cli_tokens / row.n_gpus == pytest.approx(pred.tokens_per_s_per_gpu, rel=1e-9)


def test_script_writes_the_report_and_keeps_its_reading(nemo, tmp_path):
    src = nemo.CSV_PATH.read_text(encoding="utf-8").splitlines()
    keep = [
        src[0],
        *(
            line
            for line in src[1:]
            if line.split(",")[0] in ("25.11-h100-llama3-8b-fp8cs", "25.11-gb300-llama3-8b-fp8cs")
        ),
    ]
    small = tmp_path / "rows.csv"
    small.write_text("\n".join(keep) + "\n", encoding="utf-8")
    out = tmp_path / "report.md"
    out.write_text("old\n\n## Reading\n\nhand-written note\n", encoding="utf-8")
    assert nemo.main(["--csv", str(small), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "| 25.11-h100-llama3-8b-fp8cs |" in text and "| skipped |" in text
    assert "| DGX-H100, FP8 per-tensor | 1 |" in text and "hand-written note" in text and "old" not in text


def test_script_rejects_a_bad_csv_in_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("row,source_url\nx,https://example.org\n", encoding="utf-8")
    out = subprocess.run([sys.executable, str(SCRIPT), "--csv", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "missing columns" in out.stderr and "Traceback" not in out.stderr


def test_recipe_offloading_is_passed_and_the_runs_nvidia_made_are_not_refused(nemo, rows):
    recipes = nemo.read_recipes()
    assert set(recipes) <= set(rows)  # every recipe entry names a published row
    for name, (layers, source) in recipes.items():
        assert rows[name].offload_layers == layers and rows[name].recipe_source == source
        assert source.startswith("https://github.com/") and "/blob/" in source
    # the GB200 FSDP rows whose recipes offload (NeMo 25.07 405B: 95 layers; Megatron-Bridge 70B FP8-CS: 40)
    for name, layers in (
        ("25.07-gb200-llama3.1-405b", 95),
        ("25.11-gb200-llama3-70b-fp8cs", 40),
        ("26.04.01-gb200-llama3-70b-fp8", 40),
    ):
        assert nemo.row_options(rows[name])["offload_activations"] == layers
        pred = nemo.predict_row(rows[name])
        assert pred.feasible, pred.reasons
    assert "offload_activations" not in nemo.row_options(rows["25.04-gb200-llama3-70b"])


def test_a_bad_recipe_entry_is_refused(nemo, tmp_path):
    bad = tmp_path / "recipes.csv"
    bad.write_text("row,offload_layers,recipe_source,recipe_setting\nx,-3,https://example.org/a,y\n", encoding="utf-8")
    with pytest.raises(ValueError, match="offload_layers"):
        nemo.read_recipes(bad)
    bad.write_text("row,offload_layers,recipe_source,recipe_setting\nx,3,file:///a,y\n", encoding="utf-8")
    with pytest.raises(ValueError, match="https URL"):
        nemo.read_recipes(bad)
