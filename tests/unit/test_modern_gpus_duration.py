"""benchmarks/modern_gpus.py `duration_table` (issue 17): the left-out system's signed median error by the kernel's
measured time, the table that tells a power-capped system (long kernels slower than predicted) from a level."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
mg = load_script(REPO / "benchmarks" / "modern_gpus.py", "modern_gpus_benchmark_duration")


def test_signed_medians_land_in_the_measured_time_buckets():
    scored = pd.DataFrame(
        {
            "label": ["prefill bf16"] * 5,
            "device": ["L40S"] * 5,
            "time_s_median": [5e-6, 6e-6, 5e-5, 2e-2, 3e-2],
            "pred_model": [6e-6, 7.2e-6, 5e-5, 1.6e-2, 2.4e-2],  # short ones 20 % slow, long ones 20 % fast
        }
    )
    table = mg.duration_table(scored).set_index(["label", "system"])
    row = table.loc[("prefill bf16", "L40S")]
    assert row["signed median % <10 us"] == pytest.approx(20.0)
    assert row["signed median % <100 us"] == pytest.approx(0.0)
    assert pd.isna(row["signed median % <1000 us"]) and pd.isna(row["signed median % <10000 us"])
    assert row["signed median % >=10000 us"] == pytest.approx(-20.0)
