"""collect bench / comm: appending the run's record to a run.json already in --out.

A run.json that is not a JSON object of a runs list is one line (move it aside), whatever is
wrong with it: a binary file, an integer of thousands of digits and a deep nesting escaped as
internal errors (exit 1) once the measurement was over; a runs value that is not a list too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opcast.collect.io import record_run
from opcast.errors import OpcastError


@pytest.mark.parametrize(
    "content",
    [
        b"{ not json",
        b"\xff\xfe{}",
        b'{"runs": [{"n": 1' + b"0" * 5000 + b"}]}",
        b"[" * 100_000 + b"]" * 100_000,
        b"[]",
        b'{"runs": 5}',
    ],
    ids=["invalid", "binary", "digits", "nested", "list", "runs-not-a-list"],
)
def test_a_corrupt_run_json_is_one_line_and_kept(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "run.json").write_bytes(content)
    with pytest.raises(OpcastError, match=r"run.json is corrupt; move it aside and re-run"):
        record_run(tmp_path, rank=0, record={"a": 1})
    assert (tmp_path / "run.json").read_bytes() == content


def test_a_record_is_appended(tmp_path: Path) -> None:
    record_run(tmp_path, rank=0, record={"a": 1})
    record_run(tmp_path, rank=0, record={"a": 2})
    assert json.loads((tmp_path / "run.json").read_text()) == {"runs": [{"a": 1}, {"a": 2}]}
