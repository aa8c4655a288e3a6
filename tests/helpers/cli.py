"""Run the real console script in a subprocess, as a user would: ``from helpers.cli import refusal``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def gemm_query(gpu: str, models: Path) -> list[str]:
    """``opcast predict kernel`` of one fp16 512^3 GEMM on ``gpu`` with the set ``models``."""
    query = ["predict", "kernel", "--gpu", gpu, "--op", "gemm", "--dtype", "fp16", "--models", str(models), "--json"]
    return [*query, "--param", "b=1", "--param", "m=512", "--param", "n=512", "--param", "k=512"]


def refusal(args: list[str]) -> str:
    """The one line ``python -m opcast ARGS`` refuses with; asserts exit code 2 and no traceback."""
    done = subprocess.run([sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]
