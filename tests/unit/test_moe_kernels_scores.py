"""benchmarks/moe_kernels.py's error tables on hand-worked rows: per band and pooled, one rule for both."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.scripts import load_script, run_script

mk = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "moe_kernels.py", register=False)


def _rows() -> pd.DataFrame:
    # two decode rows of one GPU (1.2x and 0.9x), one prefill row of another (2x)
    return pd.DataFrame(
        {
            "impl": ["marlin"] * 3,
            "device": ["L40S", "L40S", "H100-SXM"],
            "dtype": ["bf16"] * 3,
            "weights": ["mxfp4"] * 3,
            "gated": [True] * 3,
            "tokens": [1, 8, 8192],
            "time_s_median": [1.0, 1.0, 1.0],
            "learned_s": [1.2, 0.9, 2.0],
        }
    )


def test_band_and_pooled_errors_are_the_signed_median_and_mape():
    cols = {"learned": "learned_s"}
    band = mk.score(_rows(), cols)
    decode = band[(band.device == "L40S") & (band.tokens == "1-16")].iloc[0]
    assert decode["rows"] == 2
    assert decode["learned signed %"] == pytest.approx(5.0) and decode["learned MAPE %"] == pytest.approx(15.0)
    prefill = band[band.device == "H100-SXM"].iloc[0]
    assert prefill["tokens"] == ">4096" and prefill["learned MAPE %"] == pytest.approx(100.0)
    (pooled,) = mk.pooled(_rows(), cols).to_dict("records")
    assert pooled["systems"] == "H100-SXM,L40S" and pooled["rows"] == 3
    assert pooled["learned signed %"] == pytest.approx(20.0) and pooled["learned MAPE %"] == pytest.approx(43.3)


@pytest.mark.parametrize("flag", [("--dtypes", "fp16"), ("--impls", "cutlass"), ("--cap-rows", "0")])
def test_a_bad_choice_is_one_line_exit_2_before_any_replay(flag):
    out = run_script(Path(mk.__file__), *flag)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "moe_kernels: caps must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr
