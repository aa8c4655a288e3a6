"""benchmarks/mosaicml.py: the MPT presets reproduce llm-foundry's parameter counts, the validation CSV
parses, one small row is predicted (finite, feasible) exactly as its printed ``opcast predict train``
command predicts it, and bad input is one line with exit 2."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.archs import load_arch

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "mosaicml.py"


mm = load_script(SCRIPT, "mosaicml_benchmark")
needs_csv = pytest.mark.skipif(
    not mm.CSV_PATH.is_file(), reason=f"{mm.CSV_PATH} absent (the shared/validation checkout)"
)

# NumParams of llm-foundry's scripts/train/benchmarking/README.md at sequence 2048 (commit 495218376).
LLM_FOUNDRY_PARAMS_AT_2048 = {
    "125m": 125_311_488,
    "350m": 355_985_408,
    "760m": 760_470_528,
    "1b": 1_315_950_592,
    "3b": 2_651_837_440,
    "7b": 6_658_859_008,
    "13b": 12_853_954_560,
    "30b": 29_975_214_080,
    "70b": 64_862_437_376,
}


@pytest.mark.parametrize(("size", "params"), LLM_FOUNDRY_PARAMS_AT_2048.items())
def test_mpt_presets_count_llm_foundrys_parameters(size: str, params: int) -> None:
    arch = load_arch(f"mpt-{size}")
    assert arch.max_seq == 2048 and arch.position == "learned" and arch.linear_bias
    assert arch.params_total() == params


@needs_csv
def test_csv_parses_and_every_row_matches_its_preset() -> None:
    rows = mm.read_rows()
    assert len(rows) > 200
    assert {r.section for r in rows} == set(mm.SECTIONS.values())
    for r in rows:
        assert r.measured_iteration_s > 0
        # NumParams grows with the learned position table: the preset at the row's sequence is exact
        assert mm.row_arch(r).params_total() == r.n_params, r.label
    # the measured time is tokens / tokens per second, close to the (integer-rounded) samples per second
    row = next(r for r in rows if r.model == "70b" and r.n_gpus == 512)
    assert row.measured_iteration_s == pytest.approx(8388608 / 515636)


def _small_row():
    return next(r for r in mm.read_rows() if r.model == "125m" and r.seq == 2048 and r.gpu == "a100_80gb")


@needs_csv
def test_one_small_row_is_predicted_as_its_command_line_predicts_it() -> None:
    row = _small_row()
    learned = mm.predict_row(row)
    roofline = mm.predict_row(row, roofline=True)
    for pred in (learned, roofline):
        assert pred.feasible, pred.reasons
        assert pred.iteration_s is not None and math.isfinite(pred.iteration_s) and pred.iteration_s > 0
        assert pred.mfu is not None and 0 < pred.mfu < 1
    assert roofline.iteration_s != learned.iteration_s
    command = mm.cli_command(mm.row_options(row))
    assert "--arch mpt-125m" in command and "--zero 3" in command and "--nodes 1 --gpus-per-node 8" in command
    argv = shlex.split(command)
    assert argv[:3] == ["opcast", "predict", "train"]
    done = subprocess.run(
        [sys.executable, "-m", "opcast", *argv[1:], "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["iteration_time_s"] == pytest.approx(learned.iteration_s, rel=1e-12)


@needs_csv
def test_shard_grad_op_maps_to_zero2_with_fsdps_overlaps() -> None:
    row = next(r for r in mm.read_rows() if r.sharding == "SHARD_GRAD_OP")
    values = mm.row_options(row)
    assert values["zero"] == 2 and values["overlap_grad_reduce"] and values["overlap_param_gather"]
    assert "--overlap-param-gather" in mm.cli_command(values)


def test_bad_csv_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("# a comment\nModel,SeqLen (T)\n7b,2048\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--csv", str(bad), "--out", str(tmp_path / "out.md")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "missing columns" in done.stderr
    assert not (tmp_path / "out.md").exists()


def test_rewriting_the_report_keeps_its_hand_written_reading(tmp_path: Path) -> None:
    report = tmp_path / "mosaicml.md"
    assert mm.hand_written(report) == []  # no report yet
    report.write_text("# `cmd`\n\nintro\n\n## Reading (by hand)\n\n- 2026: a note\n\n## Error per section\n\n| a |\n")
    assert mm.hand_written(report) == ["## Reading (by hand)", "", "- 2026: a note", ""]
    report.write_text("# `cmd`\n\n## Error per section\n\n| a |\n")
    assert mm.hand_written(report) == []  # a report without one
