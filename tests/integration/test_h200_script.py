"""benchmarks/h200_collect.sh, the first-party GPU collection script, runs end to end on a CPU
with a tiny budget (the same script a user with a GPU runs). 30 s: the bf16/fp16 run gets 21 s (and
fp8's 4 s, a CPU having none) and the fp32 run 5 s. Its first point takes well under a second on an idle
CPU, but 10 s (2 s for fp32) left fp32 without a row when the suite ran beside another on 2 cores."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.schema import read_dataset

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "h200_collect.sh"


@pytest.mark.slow
def test_script_on_cpu_with_a_tiny_budget(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("bash is not available")
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "d"), "30"], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    df = read_dataset(tmp_path / "d")
    assert {"bf16", "fp16", "fp32"} <= set(df["dtype"])
    assert "fp8: 0" in res.stdout  # no fp8 on a CPU: that share goes to bf16/fp16
    assert "rows in" in res.stdout  # collect info's summary closes the run
