"""benchmarks/modern_gpus.py labels (issue 17): the block-scaled GEMMs (gemm fp8_block, gemm nvfp4) are
scored without a target ("-"), adding them moves no prediction of another label, ``--labels`` scores a
subset with the same numbers as the full run, and a bad ``--labels`` is one line on stderr with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device

from helpers.scripts import load_script
from helpers.synthetic import aic_gemm_rows

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "modern_gpus.py"
mg = load_script(SCRIPT, "modern_gpus_benchmark_labels")

SYSTEMS = {"H100-SXM": "h100_sxm", "B200": "b200_sxm", "GB200": "gb200"}
EFFICIENCY = {"H100-SXM": 0.7, "B200": 0.6, "GB200": 0.5}


def _gemm_rows(seed: int = 0, shapes: int = 48) -> list[dict]:
    """bf16 and fp8_block GEMMs of the same random shapes on three catalog GPUs, timed by a roofline
    law with a per-GPU efficiency, a 5 us floor and 3 % noise (no nvfp4 rows)."""
    return aic_gemm_rows(
        EFFICIENCY,
        dtypes=("bf16", "fp8_block"),
        folders=SYSTEMS,
        kernel_name="trtllm 1.0: torch_flow",
        seed=seed,
        shapes=shapes,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from opcast.schema import write_parquet

    return write_parquet(_gemm_rows(), tmp_path_factory.mktemp("mg-labels") / "aiconfigurator.parquet")


def test_parse_labels_keeps_table_order_and_refuses_bad_names():
    assert mg.parse_labels(None) == mg.LABELS
    assert mg.parse_labels(" gemm nvfp4,gemm fp8_block ,gemm bf16") == ("gemm bf16", "gemm fp8_block", "gemm nvfp4")
    with pytest.raises(OpcastError, match=r"unknown label.*gemm fp4"):
        mg.parse_labels("gemm fp8_block,gemm fp4")
    with pytest.raises(OpcastError, match="empty name"):
        mg.parse_labels("gemm nvfp4,")


def test_fitted_rows_are_the_chosen_labels_predictor_groups():
    """prefill and decode share a predictor group: asking for decode keeps the prefill rows it is fitted
    on; asking for the block-scaled fp8 GEMMs keeps only their own group."""
    frame = pd.DataFrame(
        {
            "op": ["attention", "attention", "gemm", "gemm", "gemm"],
            "dtype": ["bf16", "bf16", "bf16", "fp8_block", "nvfp4"],
            "direction": "fwd",
            "tensor_cores": True,
            "label": ["prefill bf16", "decode bf16", "gemm bf16", "gemm fp8_block", "gemm nvfp4"],
        }
    )
    assert mg.fitted_rows(frame, ("decode bf16",))["label"].tolist() == ["prefill bf16", "decode bf16"]
    assert mg.fitted_rows(frame, ("gemm fp8_block",))["label"].tolist() == ["gemm fp8_block"]
    assert len(mg.fitted_rows(frame, mg.LABELS)) == 5


def test_untargeted_labels_show_a_dash(capsys):
    scored = pd.DataFrame(
        {
            "label": ["gemm bf16", "gemm fp8_block", "gemm nvfp4"],
            "device": "B200",
            "time_s_median": [1.0, 1.0, 1.0],
            "pred_model": [1.05, 1.2, 0.9],
        }
    )
    table = mg.pooled_table(scored, ("model",), mg.TARGETS)
    assert table["label"].tolist() == ["gemm bf16", "gemm fp8_block", "gemm nvfp4"]
    assert table["target_mape"].iloc[0] == 8.0 and table["met"].iloc[0] == "yes"
    assert table["target_mape"].iloc[1:].isna().all() and table["met"].iloc[1:].tolist() == ["-", "-"]
    mg._print("pooled", table)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "gemm nvfp4" in ln)
    assert line.replace("|", " ").split()[:6] == ["gemm", "nvfp4", "1", "1", "-", "10.0"], line  # markdown or text


def test_adding_labels_moves_no_prediction_of_another(data):
    """LOGO and within-GPU with and without the fp8_block rows: every bf16 row scored, and every
    prediction of it, is the same (and the fp8_block rows score the same alone as beside bf16)."""
    frame = mg.load(data, mg.LABELS)
    assert sorted(set(frame["label"])) == ["gemm bf16", "gemm fp8_block"]
    assert mg.load(data)["label"].unique().tolist() == ["gemm bf16"]  # the default: labels with a target
    devices = {d: get_device(d) for d in SYSTEMS}

    def logo(chosen: tuple[str, ...]) -> pd.DataFrame:
        rows = mg.fitted_rows(frame, chosen)
        pool = mg.cap(rows, 40, 0)
        test_pool = mg.cap(rows[rows["label"].isin(chosen)], 20, 1)
        return mg.logo(pool, test_pool, devices, "xgb", 0, lambda _: None)

    def within(chosen: tuple[str, ...]) -> pd.DataFrame:
        return mg.within(frame, devices, "xgb", 40, 20, 0, lambda _: None, chosen)

    cols = ["device", "point_id", "time_s_median", "pred_model", "pred_roofline", "pred_efficiency"]
    for run in (logo, within):
        both, bf16, fp8b = run(mg.LABELS), run(("gemm bf16",)), run(("gemm fp8_block",))
        cols_here = [c for c in cols if c in both.columns]
        assert len(fp8b) and len(bf16) and set(both["label"]) == {"gemm bf16", "gemm fp8_block"}
        for label, alone in (("gemm bf16", bf16), ("gemm fp8_block", fp8b)):
            mine = both[both["label"] == label].reset_index(drop=True)[cols_here]
            assert np.isfinite(mine["pred_model"]).all()
            pd.testing.assert_frame_equal(mine, alone.reset_index(drop=True)[cols_here])


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_labels_subset_runs_and_reports_no_target(data, tmp_path):
    out = tmp_path / "tables.json"
    args = ("--data", str(data), "--labels", "gemm fp8_block", "--train-rows", "40", "--test-rows", "20")
    proc = _run(*args, "--within-train-rows", "40", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "labels: gemm fp8_block" in proc.stdout
    tables = json.loads(out.read_text())["tables"]
    pooled = next(t for title, t in tables.items() if title.startswith("Leave-one-GPU-out, pooled"))
    assert [(r["label"], r["systems"], r["target_mape"], r["met"]) for r in pooled] == [
        ("gemm fp8_block", 3, None, "-")
    ]
    within = next(t for title, t in tables.items() if title.startswith("Within-GPU, 20 %"))
    assert [(r["label"], r["target_mape"]) for r in within] == [("gemm fp8_block", 3.0)]


def test_bad_labels_exit_2_with_one_line(data):
    for labels, words in (
        ("gemm bf16,gemm fp16", "unknown label(s) gemm fp16"),
        ("gemm bf16,,gemm fp8", "--labels has an empty name"),
        ("gemm fp8_block,gemm nvfp4", "no rows of gemm nvfp4 in"),
    ):
        proc = _run("--data", str(data), "--labels", labels)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert "its labels are gemm bf16, gemm fp8_block" in lines[0]


def test_weight_only_moe_rows_are_their_own_label():
    """gpt-oss's W4A16 MXFP4 MoE rows are capped and scored as ``moe bf16 mxfp4``, apart from the bf16 layers
    (whose draw would otherwise crowd the few hundred MXFP4 rows a GPU out); other ops ignore ``weights``."""
    frame = pd.DataFrame(
        {
            "op": ["moe", "moe", "gemm", "moe"],
            "dtype": ["bf16", "bf16", "bf16", "fp8"],
            "weights": ["mxfp4", "dtype", None, None],
            "source_file": ["h100_sxm/moe/trtllm/1/moe_perf.parquet"] * 2 + ["g", "m"],
        }
    )
    assert mg.labels(frame).tolist() == ["moe bf16 mxfp4", "moe bf16", "gemm bf16", "moe fp8"]
    assert "moe bf16 mxfp4" in mg.CAPPED


def test_vllms_moe_rows_are_their_own_labels_capped_apart():
    """vLLM's fused MoE rows (``impl`` vllm or marlin) are labels of their own (``moe bf16 mxfp4 vllm``,
    ``moe bf16 marlin``), capped by their own cap: TensorRT-LLM's rows (impl trtllm, or none in a dataset written
    before it) keep theirs."""
    frame = pd.DataFrame(
        {
            "op": ["moe"] * 5 + ["gemm"],
            "dtype": ["bf16"] * 6,
            "weights": ["mxfp4", "dtype", "mxfp4", "dtype", None, None],
            "impl": ["vllm", "marlin", "trtllm", "trtllm", None, None],
            "source_file": ["m"] * 6,
            "device": ["H100-SXM"] * 6,
            "point_id": [str(i) for i in range(6)],
        }
    )
    labels = mg.labels(frame).tolist()
    assert labels == ["moe bf16 mxfp4 vllm", "moe bf16 marlin", "moe bf16 mxfp4", "moe bf16", "moe bf16", "gemm bf16"]
    assert set(labels[:2]) <= set(mg.VLLM_CAPPED) and not set(labels[2:]) & set(mg.VLLM_CAPPED)
    many = pd.concat([frame.iloc[[1]].assign(point_id=str(i)) for i in range(10)], ignore_index=True)
    assert len(mg.cap(many.assign(label=mg.labels(many)), 3, 0)) == 3


@pytest.mark.parametrize(
    "args, words",
    [
        (("--moe-impls", "trtllm,marlinn"), "unknown --moe-impls marlinn"),
        (("--auto-folds", "0"), "--auto-folds 0: give 1 or more"),  # auto would have nothing to choose on
        # a zero cap would keep nothing (or, read as falsy, everything)
        (("--cap-rows", "0"), "must be >= 1"),
        (("--cap-moe-rows", "0"), "must be >= 1"),
        (("--cap-vllm-moe-rows", "0"), "must be >= 1"),
    ],
)
def test_a_bad_option_is_refused_before_anything_is_replayed(tmp_path, args, words):
    proc = _run("--replay-to", str(tmp_path / "out"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
