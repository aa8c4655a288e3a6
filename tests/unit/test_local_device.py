"""This machine as a DeviceSpec (opcast.collect.local_device): measured, cached, reached from the core's
get_device only through one deferred import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opcast.collect import local_device
from opcast.collect.local_device import describe_local
from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec, device_to_dict, get_device


def _one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(OpcastError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_describe_local_cpu_is_measured_then_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPCAST_CACHE_DIR", str(tmp_path))
    spec = describe_local("cpu")
    assert spec.vendor == "cpu" and spec.name.startswith("cpu-") and spec.name.endswith(f"-{spec.sm_count}c")
    # measured rates: positive, but no floor (a loaded CI machine measured 95 MFLOP/s)
    assert spec.peak_fp32_flops > 0 and spec.mem_bw_bytes_per_s > 0
    assert spec.peak_tf32_flops is None and spec.peak_fp8_flops is None and spec.tdp_w is None
    assert spec.source.startswith("measured by opcast on ")
    if spec.supports("bf16"):  # a CPU has no tensor cores: each measured peak is its own vector rate
        assert spec.peak_flops("bf16", tensor_cores=False) == spec.peak_bf16_flops
    assert len(list(tmp_path.glob("local-*.json"))) == 1

    def must_not_measure(*args, **kwargs):
        raise AssertionError("the second call should be served from the cache")

    monkeypatch.setattr(local_device, "_measure_cpu", must_not_measure)
    assert describe_local("cpu") == spec
    assert get_device("cpu") == spec  # the core resolves the local machine through collect

    fresh = DeviceSpec(**{**device_to_dict(spec), "aliases": (), "peak_fp32_flops": 1.0})
    monkeypatch.setattr(local_device, "_measure_cpu", lambda *args: fresh)
    assert describe_local("cpu", remeasure=True) == fresh
    assert describe_local("cpu").peak_fp32_flops == 1.0  # the cache was rewritten
    assert get_device(" CPU ") == fresh


def test_a_corrupt_cache_entry_is_remeasured_not_reported(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPCAST_CACHE_DIR", str(tmp_path))
    spec = DeviceSpec(
        **{**device_to_dict(get_device("H100-SXM")), "name": "cpu-test-1c", "aliases": (), "vendor": "cpu"}
    )
    calls = []
    monkeypatch.setattr(local_device, "_measure_cpu", lambda *args: calls.append(1) or spec)
    assert describe_local("cpu") == spec and len(calls) == 1
    (entry,) = tmp_path.glob("local-*.json")
    entry.write_text("{not json")
    assert describe_local("cpu") == spec and len(calls) == 2
    assert describe_local("cpu") == spec and len(calls) == 2  # rewritten, served from the cache again


def test_describe_local_rejects_unknown_devices() -> None:
    assert "use cpu, cuda or cuda:N" in _one_line_error(describe_local, "tpu")


def test_the_core_does_not_import_collect_to_resolve_a_catalog_gpu() -> None:
    code = (
        "import sys; from opcast.hardware import get_device; get_device('A100-SXM4-80GB'); "
        "print(sorted(m for m in sys.modules if m.startswith('opcast.collect')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
