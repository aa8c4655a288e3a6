"""`opcast train fit` and `opcast train eval` end to end on a small synthetic dataset of catalog
GPUs, and their one-line errors (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opcast.cli import main
from opcast.hardware import get_device
from opcast.schema import write_parquet

from helpers.synthetic import synthetic_dataset

GPUS = ("V100-SXM2-32GB", "A40", "A100-SXM4-80GB", "H100-SXM")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ds")
    frame = synthetic_dataset([get_device(g) for g in GPUS], ops=("gemm", "layernorm"), rows_per_op=60, seed=3)
    write_parquet(frame, folder / "synthetic.parquet")
    return folder


@pytest.fixture(scope="module")
def models(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    code = main(
        [
            "train",
            "fit",
            str(dataset),
            "--out",
            str(out),
            "--name",
            "toy",
            "--estimator",
            "xgb",
            "--holdout-device",
            "A40",
            "--folds",
            "1",
            "--json",
        ]
    )
    assert code == 0
    return out / "toy"


def test_fit_writes_a_set_without_the_holdout_device(models):
    meta = json.loads((models / "meta.json").read_text())
    assert set(meta["predictors"]) == {"gemm-fwd-half", "layernorm-fwd-half"}
    assert "A40" not in meta["device_specs"] and meta["fit_config"]["holdout_devices"] == ["A40"]
    assert {r["device"] for r in meta["holdout_metrics"]} == {"A40", "all"}
    assert meta["datasets"][0]["sha256"] and meta["datasets"][0]["files"] == ["synthetic.parquet"]
    lo, hi = meta["predictors"]["gemm-fwd-half"]["feature_ranges"]["log_t_roof_s"]
    assert lo < hi


def test_eval_json_reports_per_op_and_device(models, dataset, capsys):
    capsys.readouterr()
    assert main(["train", "eval", "--models", str(models), str(dataset), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["training_data"] == [str(dataset)]  # flagged: this is training error
    rows = {(r["op"], r["device"]): r for r in out["metrics"]}
    assert rows[("gemm", "A40")]["n"] == 60 and rows[("all", "all")]["n"] == 4 * 120
    assert rows[("all", "all")]["mape"] < 10


def test_plot_without_matplotlib_is_one_line(models, dataset, tmp_path, capsys):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main(["train", "eval", "--models", str(models), str(dataset), "--plot", str(tmp_path / "s.png")]) == 2
        err = capsys.readouterr().err.strip()
        assert "pip install" in err and "\n" not in err
    else:
        assert main(["train", "eval", "--models", str(models), str(dataset), "--plot", str(tmp_path / "s.png")]) == 0
        assert (tmp_path / "s.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "eval", "--models", "/nonexistent/models", "DATA"], "does not exist"),
        (["train", "fit", "DATA", "--out", "OUT", "--estimator", "forest"], "unknown estimator"),
        (["train", "fit", "DATA", "--out", "OUT", "--holdout-device", "H900"], "unknown GPU"),
        (["train", "fit", "BAD", "--out", "OUT"], "not a readable parquet"),
        (["train", "fit", "CPU", "--out", "OUT"], "neither in the hardware catalog"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, dataset, tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    cpu = tmp_path / "cpu"
    frame = synthetic_dataset([get_device("A40")], ops=("layernorm",), rows_per_op=5)
    frame["device"] = "cpu-made-up-2c"
    write_parquet(frame, cpu / "x.parquet")
    subs = {"DATA": str(dataset), "OUT": str(tmp_path / "o"), "BAD": str(bad), "CPU": str(cpu)}
    capsys.readouterr()
    assert main([subs.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.count("\n") == 0, err


@pytest.mark.parametrize("time_s", [-1e-5, 0.0, None])
@pytest.mark.parametrize("command", ["fit", "adapt", "eval"])
def test_a_dataset_without_a_usable_time_is_named_as_such(time_s, command, tmp_path, capsys):
    # fit blamed --op and --holdout-device (neither given); adapt said the rows were of no device at all;
    # eval printed a table of n=0 and NaN errors and exited 0
    frame = synthetic_dataset([get_device("A40")], ops=("layernorm",), rows_per_op=5)
    frame = frame.iloc[:0] if time_s is None else frame.assign(time_s_median=time_s)
    path = write_parquet(frame, tmp_path / "d.parquet")
    extra = ["--gpu", "A40"] if command == "adapt" else []
    out = [] if command == "eval" else ["--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(["train", command, str(path), *out, *extra]) == 2
    err = capsys.readouterr().err.strip()
    needle = "holds no rows" if time_s is None else "none of the 5 rows has a positive, finite time_s_median"
    assert needle in err and str(path) in err and err.count("\n") == 0, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd", [["train", "--help"], ["train", "fit", "--help"], ["train", "eval", "--help"]])
def test_help(cmd, capsys):
    assert main(cmd) == 0
    assert "Usage" in capsys.readouterr().out


@pytest.fixture
def places(tmp_path):
    """Paths for the up-front checks: a regular file, a user's folder that is not a model set,
    a path under a file, and a dataset that does not exist (so an error about anything else
    proves the check ran before any data was read)."""
    file = tmp_path / "notes.txt"
    file.write_text("keep me\n")
    user = tmp_path / "out" / "mine"
    user.mkdir(parents=True)
    (user / "thesis.tex").write_text("keep me too\n")
    (tmp_path / "plots").mkdir()
    return {
        "MISSING": str(tmp_path / "no-such-dataset"),
        "FILE": str(file),
        "OUT": str(tmp_path / "out"),
        "UNDERFILE": str(file / "models"),
        "PLOTDIR": str(tmp_path / "plots"),
    }


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "fit", "MISSING", "--out", "FILE"], "is a file; give a folder"),
        (
            ["train", "fit", "MISSING", "--out", "OUT", "--name", "mine"],
            "exists and is a folder that is not a model set",
        ),
        (["train", "fit", "MISSING", "--out", "UNDERFILE"], "which is a file"),
        (["train", "fit", "MISSING", "--out", "OUT", "--name", ".hidden"], "plain folder name"),
        (["train", "fit", "MISSING", "--out", "OUT", "--name", " "], "plain folder name"),  # a folder named ' '
        (["train", "fit", "MISSING", "--out", "OUT", "--name", "mine "], "plain folder name"),
        (["train", "fit", "MISSING", "--out", "OUT", "--estimator", "foo"], "unknown estimator 'foo'"),
        (["train", "fit", "MISSING", "--out", "OUT", "--op", "conv"], "unknown op(s) conv"),
        (["train", "fit", "MISSING", "--out", "OUT", "--jobs", "0"], "--jobs 0"),
        (["train", "fit", "MISSING", "--out", "OUT", "--seed", "-1"], "--seed -1"),
        (["train", "fit", "MISSING", "--out", "OUT", "--folds", "-1"], "--folds -1: give 0"),
        (["train", "eval", "--models", "MISSING", "MISSING", "--plot", "PLOTDIR"], "is a folder"),
    ],
)
def test_options_are_checked_before_any_data_is_read(argv, needle, places, capsys):
    capsys.readouterr()
    assert main([places.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.count("\n") == 0, err
    assert Path(places["FILE"]).read_text() == "keep me\n"
    assert Path(f"{places['OUT']}/mine/thesis.tex").read_text() == "keep me too\n"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "fit", "MISSING", "--out", "FILE"], "is a file; give a folder"),
        (["train", "fit", "MISSING", "--out", "OUT", "--estimator", "foo"], "unknown estimator 'foo'"),
    ],
)
def test_early_errors_through_the_console_script(argv, needle, places):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "opcast", *[places.get(a, a) for a in argv]], capture_output=True, text=True, timeout=120
    )
    err = out.stderr.strip()
    assert out.returncode == 2 and err.startswith("opcast: error:") and needle in err and err.count("\n") == 0, err
    assert "Traceback" not in out.stderr and Path(places["FILE"]).read_text() == "keep me\n"


_SIGTERM_MID_FIT = """
import os, signal, sys
import opcast.train.fit as fit
from opcast.cli import main

real, calls = fit._timed, []

def timed(fn, *args):  # the second fit of the run: SIGTERM while fitting, long before the write
    calls.append(fn)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(fn, *args)

fit._timed = timed
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_fitting_ends_with_the_terminated_line_and_keeps_the_old_set(dataset, models, tmp_path):
    """SIGTERM while train fit fitted (not wrote) ended the process on the spot with no line; it is
    taken as an interrupt: one line, exit 143, the old set untouched, nothing half-written left; a
    re-run fits from the start (train fit keeps no partial fits)."""
    import shutil
    import subprocess
    import sys

    out = tmp_path / "models"
    shutil.copytree(models, out / "toy")
    before = {p.name: p.read_bytes() for p in (out / "toy").iterdir()}
    argv = ["train", "fit", str(dataset), "--out", str(out), "--name", "toy", "--estimator", "xgb", "--folds", "1"]
    run = subprocess.run([sys.executable, "-c", _SIGTERM_MID_FIT, *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 143, run.stderr
    assert run.stderr.strip() == "opcast: terminated (SIGTERM); what was written is kept", run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["toy"]  # no hidden temporary folder left
    assert {p.name: p.read_bytes() for p in (out / "toy").iterdir()} == before
