"""Checks shared by the tests of a model set's predictor parts (``seen``, ``other``, ``blend``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from opcast.errors import OpcastError
from opcast.train import artifacts
from opcast.train.artifacts import load_model_set


def assert_part_checked(path: Path, tmp_path: Path, field: str, key: str = "gemm-fwd-half") -> None:
    """A copy of the model set at ``path`` whose group ``key`` points its part ``field`` at the group's own file (its
    record names another predictor), then leaves the part incomplete, is refused each time: meta.json is written
    consistent (its digest recomputed), so only the part checks can refuse it."""
    bad = tmp_path / f"bad-{field}"
    shutil.copytree(path, bad)
    meta = json.loads((bad / "meta.json").read_text())
    entry = meta["predictors"][key]

    def write() -> None:
        meta["meta_sha256"] = artifacts._meta_digest(meta)
        (bad / "meta.json").write_text(json.dumps(meta))

    entry[field]["file"] = entry["file"]
    write()
    with pytest.raises(OpcastError, match="renamed or copied over another"):
        load_model_set(bad)
    entry[field] = {"file": "x.npz"}
    write()
    with pytest.raises(OpcastError, match=rf"{field}\.estimator is missing"):
        load_model_set(bad)
