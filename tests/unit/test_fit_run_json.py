"""train fit / adapt: the device specs read from the run.json files beside a dataset.

A run.json that cannot be read as JSON text is passed over like an invalid one (the device is then
refused in one line unless another source describes it); a binary file, an integer of thousands of
digits or a deep nesting escaped as internal errors (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opcast.errors import OpcastError
from opcast.hardware import device_to_dict, get_device
from opcast.train.fit import resolve_devices


def _folder(tmp_path: Path, content: bytes) -> Path:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "run.json").write_bytes(content)
    return tmp_path / "ds"


@pytest.mark.parametrize(
    "content",
    [
        b"{ not json",
        b"\xff\xfe{}",
        b'{"runs": [{"device_spec": {"name": "my-gpu", "mem_bytes": 1' + b"0" * 5000 + b"}}]}",
        b"[" * 100_000 + b"]" * 100_000,
        b"[]",
        b'{"runs": 5}',
    ],
    ids=["invalid", "binary", "digits", "nested", "list", "runs-not-a-list"],
)
def test_an_unreadable_run_json_is_passed_over(tmp_path: Path, content: bytes) -> None:
    with pytest.raises(OpcastError, match="'my-gpu' of the dataset is neither in the hardware catalog"):
        resolve_devices(["my-gpu"], [_folder(tmp_path, content)])


def test_a_recorded_spec_is_read(tmp_path: Path) -> None:
    spec = {**device_to_dict(get_device("H100-SXM")), "name": "my-gpu", "aliases": []}
    folder = _folder(tmp_path, json.dumps({"runs": [{"device_spec": spec}]}).encode())
    assert resolve_devices(["my-gpu"], [folder])["my-gpu"].mem_bytes == spec["mem_bytes"]
