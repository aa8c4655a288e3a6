"""benchmarks/skinny_gemm.py (issue 20): the m bins, the per-bin signed median / MAPE with the training
rows scored apart, the summed decoder layer, and the monotone-in-m count, on hand-made rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
sg = load_script(REPO / "benchmarks" / "skinny_gemm.py", "skinny_gemm_benchmark")


def test_m_bins_cover_every_m_once() -> None:
    m = pd.Series([1, 2, 8, 9, 32, 33, 64, 65, 128, 129, 256, 257, 1024, 1025, 32768])
    assert list(sg.m_bin(m)) == [
        "1", "2-8", "2-8", "9-32", "9-32", "33-64", "33-64", "65-128", "65-128",
        "129-256", "129-256", "257-1024", "257-1024", ">=1025", ">=1025",
    ]  # fmt: skip


def test_bin_table_scores_training_rows_apart() -> None:
    rows = pd.DataFrame({"device": ["H100-SXM"] * 4, "m": [1, 1, 1, 40], "time_s": [1.0, 1.0, 1.0, 2.0]})
    pred = np.array([1.1, 0.8, 1.5, 2.0])
    train = np.array([False, False, True, False])
    out = sg.bin_table(rows, {"p": pred}, train).set_index("m")
    assert out.loc["1", "rows"] == 3 and out.loc["1", "train_rows"] == 1
    assert out.loc["1", "p signed %"] == pytest.approx(10.0)  # median of +10, -20, +50
    assert out.loc["1", "p MAPE %"] == pytest.approx(26.7)
    assert out.loc["1", "p held signed %"] == pytest.approx(-5.0)  # the training row left out
    assert out.loc["1", "p held MAPE %"] == pytest.approx(15.0)
    assert list(out.index) == ["1", "33-64"]


def test_layer_sums_only_where_every_projection_was_measured() -> None:
    proj = pd.DataFrame(
        {
            "proj": ["a", "b", "a"],
            "system": ["H200"] * 3,
            "m": [8, 8, 16],
            "measured_us": [10.0, 30.0, 11.0],
            "predicted_us": [12.0, 32.0, 11.0],
        }
    )
    out = sg.layer_table(proj, ("a", "b"))
    assert out[["m", "measured_us", "predicted_us", "err %"]].values.tolist() == [[8, 40.0, 44.0, 10.0]]


def test_monotone_counts_predicted_drops_where_the_measurement_rises() -> None:
    rows = pd.DataFrame(
        {
            "device": ["A100-SXM4-80GB"] * 4,
            "n": [64, 64, 64, 128],
            "k": [64] * 4,
            "m": [1, 2, 4, 1],
            "time_s": [1.0, 1.2, 1.1, 5.0],  # 1 -> 2 rises, 2 -> 4 falls 8 %; the last row is another (n, k)
        }
    )
    out = sg.monotone_table(rows, np.array([1.0, 0.9, 1.2, 1.0])).iloc[0]
    assert (out["steps"], out["predicted drops"], out["measured drops"]) == (1, 1, 1)


def test_missing_data_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sg.main(["--data", str(tmp_path / "none.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
