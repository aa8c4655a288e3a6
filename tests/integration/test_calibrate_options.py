"""Bad options and environments of `opcast calibrate` / `opcast validate`, through the console script
in a subprocess: one line on stderr, exit 2, no traceback, and nothing measured or written first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "opcast", *args], capture_output=True, text=True, timeout=120, env=full, cwd=cwd
    )


def _one_line_exit_2(res: subprocess.CompletedProcess, needle: str) -> None:
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, res.stderr
    assert needle in err, err
    assert "calibrate: anchors" not in err and "validate:" not in err  # refused before any work


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--budget-s", "nan"], "--budget-s takes a finite number of seconds > 0 and at most 604800 (a week), got nan"),
        (
            ["--budget-s", "1e300"],
            "--budget-s takes a finite number of seconds > 0 and at most 604800 (a week), got 1e+300",
        ),
        (["--budget-s", "-1"], "--budget-s takes a finite number"),
        (["--budget-s", "0"], "--budget-s takes a finite number"),
        (["--budget-s", "inf"], "got inf"),
        (["--budget-s", "0.001"], "--budget-s 0.001 is below 15 s, the least in which calibrate can measure anything"),
        (["--estimator", "foo"], "unknown estimator 'foo'; use xgb, tile-mlp, neusight, hier, blend or auto"),
        (["--device", "tpu"], "unknown --device 'tpu'"),
        (["--steps", "0"], "--steps must be an integer >= 1"),
        (["--attention", "sparse"], "--attention 'sparse'"),
        (["--datasets", "/dev/null"], "/dev/null is not a regular file"),  # was read by the fit, after collection
        (["--datasets", str(Path(__file__))], "is not a readable parquet file"),
    ],
)
def test_calibrate_bad_options(tmp_path, args, needle):
    out = tmp_path / "cal"
    _one_line_exit_2(_run(["calibrate", "--out", str(out), *args]), needle)
    assert not out.exists()


def test_calibrate_out_paths(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("keep me")
    _one_line_exit_2(_run(["calibrate", "--out", str(afile)]), "is a file")
    assert afile.read_text() == "keep me"
    out = tmp_path / "cal"
    out.mkdir()
    (out / "data").write_text("not a folder")
    _one_line_exit_2(_run(["calibrate", "--out", str(out)]), f"{out / 'data'} exists and is not a folder")


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"RANK": "abc"}, "RANK='abc' in the environment is not an integer >= 0"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' in the environment is not an integer >= 1"),
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0' in the environment is not an integer >= 1"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK=3 and LOCAL_WORLD_SIZE=2",
        ),
    ],
)
def test_validate_bad_torchrun_environment(env, needle):
    _one_line_exit_2(_run(["validate", "--arch", "gpt2-124m", "--batch", "1", "--seq", "64"], env=env), needle)


def test_calibrate_under_torchrun_is_refused(tmp_path):
    out = tmp_path / "cal"
    _one_line_exit_2(_run(["calibrate", "--out", str(out)], env={"RANK": "0", "WORLD_SIZE": "2"}), "runs on one device")


def test_a_tiny_budget_bounds_the_real_command(tmp_path):
    """`--budget-s 15` (the least it takes): every stage runs under the deadline and the command stops, saying
    the budget was spent, well below a generous ceiling (the old calibrate was still validating after 100 s).
    --allow-busy keeps a loaded test machine from being refused first: the outcome is the same on any machine."""
    import time

    out = tmp_path / "cal"
    t0 = time.monotonic()
    res = _run(["calibrate", "--out", str(out), "--budget-s", "15", "--allow-busy", "--json"])
    took = time.monotonic() - t0
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert err[-1].startswith(
        "opcast: error: the --budget-s 15 s budget was spent before a model set could be fitted"
    ), err
    assert took < 90, took  # startup and imports included; the old calibrate took minutes
    report = __import__("json").loads((out / "calibrate.json").read_text())
    assert report["failure"] and report["budget_cut"] and report["models"] is None


def test_the_help_names_every_estimator_the_option_takes():
    from opcast.train.estimators import ESTIMATORS

    res = _run(["calibrate", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.stdout.split())
    assert res.returncode == 0 and all(name in text.split("--estimator", 1)[1][:200] for name in [*ESTIMATORS, "auto"])


_SIGTERM_MID_STEPS = """
import os, signal, sys, time
import opcast.check.validate as validate
from opcast.cli import main

def measure_step(*args, **kwargs):  # SIGTERM while the steps run
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)

validate.measure_step = measure_step
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_validate_measures_ends_with_the_terminated_line():
    """SIGTERM ended validate on the spot (exit -15, no line); alone (not under torchrun) it is an
    interrupt: one line and exit 143, as Ctrl-C's 130."""
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    args = ["validate", "--arch", "gpt2-124m", "--batch", "1", "--seq", "64", "--steps", "1", "--warmup", "0"]
    res = subprocess.run(
        [sys.executable, "-c", _SIGTERM_MID_STEPS, *args], capture_output=True, text=True, timeout=120, env=full
    )
    assert res.returncode == 143, (res.returncode, res.stderr)
    assert res.stderr.strip() == "opcast: terminated (SIGTERM); what was written is kept", res.stderr
