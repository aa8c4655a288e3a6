"""Golden predictions: every number of the full ``--json`` output of a handful of configurations
(the README's main job, a 175B Megatron job with interleaving, MoE with ep, ZeRO-3 with
recomputation, inference, a search, a roofline-only job) is unchanged.

The cases, the comparison and the one regeneration command live in ``tests/golden/regenerate.py``;
a failure prints which fields moved. An intended change: ``python tests/golden/regenerate.py``,
and the commit says why the numbers moved. The documents come from one fresh interpreter (the
script's ``--print``), as from the console script: pytest's process may have imported xgboost,
which moves learned predictions at float32 rounding."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "golden" / "regenerate.py"
_spec = importlib.util.spec_from_file_location("opcast_golden_regenerate", _SCRIPT)
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


def test_every_case_has_a_golden_file_and_no_file_is_orphaned():
    stored = {p.stem for p in _SCRIPT.parent.glob("*.json")}
    missing, orphaned = sorted(set(golden.CASES) - stored), sorted(stored - set(golden.CASES))
    assert not missing and not orphaned, (
        "run `python tests/golden/regenerate.py`: golden files and CASES differ "
        f"(missing {missing}, orphaned {orphaned})"
    )


@pytest.fixture(scope="module")
def now() -> dict:
    """Every case's document as the commands print it today."""
    return golden.run_fresh()


@pytest.mark.parametrize("name", list(golden.CASES))
def test_golden_prediction_unchanged(name, now):
    stored = golden.load_golden(name)
    assert stored["command"] == golden.command_line(name), "the case's command changed: regenerate its golden file"
    diff = golden.compare(stored["output"], now[name])
    if diff:
        models_now = golden.models_fingerprint()
        hint = (
            ""
            if stored["models"] == models_now
            else f"\nthe default model set changed since this file was written ({stored['models']} -> {models_now}): "
            "a refit moves learned kernel times."
        )
        shown = "\n  ".join(diff[:60]) + (f"\n  ... and {len(diff) - 60} more" if len(diff) > 60 else "")
        pytest.fail(
            f"{stored['command']}\n{len(diff)} field(s) moved (golden -> now):\n  {shown}{hint}\n"
            "If intended, run `python tests/golden/regenerate.py` and explain the change in the commit."
        )


def test_compare_reports_every_kind_of_change():
    """The comparison the golden test rests on can fail: a number beyond 1e-9, a string, a key, a length."""
    doc = golden.load_golden("main_job")["output"]
    moved = copy.deepcopy(doc)
    assert golden.compare(doc, moved) == []
    moved["iteration_time_s"] *= 1 + 1e-8
    moved["breakdown_s"]["forward"] *= 1 + 1e-12  # inside the tolerance
    moved["config"]["recompute"] = "full"
    moved["fits"] = not doc["fits"]
    del moved["mfu"]
    moved["new_field"] = 1
    moved["ops"].pop()
    diff = golden.compare(doc, moved)
    assert any(line.startswith(".iteration_time_s:") and "rel" in line for line in diff), diff
    assert not any(line.startswith(".breakdown_s.forward") for line in diff), diff
    assert ".config.recompute: 'none' -> 'full'" in diff
    assert any(line.startswith(".fits:") for line in diff)
    assert any(line.startswith(".mfu: removed") for line in diff)
    assert any(line.startswith(".new_field: added") for line in diff)
    assert any(line.startswith(".ops:") and "items" in line for line in diff)
    assert golden.compare({"x": 1.0}, {"x": None}) and golden.compare({"x": 0}, {"x": False})
