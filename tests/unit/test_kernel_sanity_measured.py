"""The sanity benchmark's ``--measured DIR`` (issue 21): beside a speed-up or monotone violation it
shows what the measurements say about the same pair of GPUs, at the shape nearest to the kernel that
was measured on both, so a reader sees whether the data or the model breaks the rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcast.hardware import get_device
from opcast.predict.cost import peak_roofline_s
from opcast.schema import write_parquet

from helpers.scripts import REPO, load_script

SCRIPT = REPO / "benchmarks" / "kernel_sanity.py"


@pytest.fixture(scope="module")
def ks(tmp_path_factory):
    saved = sys.modules.get("kernel_sanity")
    module = load_script(SCRIPT)
    yield module
    if saved is None:
        sys.modules.pop("kernel_sanity", None)
    else:
        sys.modules["kernel_sanity"] = saved


def _row(device: str, op: str, params: dict, seconds: float, dtype: str = "bf16", **extra) -> dict:
    return {
        "run_id": "t",
        "source": "test",
        "device": device,
        "timing_method": "cuda_event",
        "op": op,
        "dtype": dtype,
        "direction": "fwd",
        "tensor_cores": True,
        "time_s_median": seconds,
        **params,
        **extra,
    }


A100, H100 = "A100-SXM4-80GB", "H100-SXM"
SQUARE = {"b": 1, "m": 512, "n": 512, "k": 512}


@pytest.fixture()
def folder(tmp_path):
    rows = [
        _row(A100, "gemm", SQUARE, 6.0e-6),
        _row(A100, "gemm", SQUARE, 7.0e-6, dtype="fp16"),  # the half class: one shape, median of both
        _row(H100, "gemm", SQUARE, 4.0e-6),
        _row(A100, "gemm", {**SQUARE, "m": 500}, 6.0e-6),  # nearer than 1024^3 but measured on A100 only
        _row(A100, "gemm", {"b": 1, "m": 1024, "n": 1024, "k": 1024}, 20e-6),
        _row(H100, "gemm", {"b": 1, "m": 1024, "n": 1024, "k": 1024}, 5e-6),
        _row(A100, "gemm", {"b": 1, "m": 512, "n": 512, "k": 512}, 1.0, dtype="fp32", tensor_cores=False),
        # no tensor_cores recorded (a memory-bound kernel): still its op's half class
        _row(A100, "softmax", {"rows": 1024, "cols": 1024}, 8e-6, dtype="fp16", tensor_cores=None, impl="fused"),
        _row(H100, "softmax", {"rows": 1024, "cols": 1024}, 5e-6, dtype="fp16", tensor_cores=None, impl="fused"),
        # attention measured without a causal mask only: never compared with a causal kernel
        _row(
            A100,
            "attention",
            {"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 512, "seq_kv": 512, "head_dim": 64},
            20e-6,
            causal=False,
            impl="flash",
        ),
        _row(
            H100,
            "attention",
            {"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 512, "seq_kv": 512, "head_dim": 64},
            10e-6,
            causal=False,
            impl="flash",
        ),
    ]
    write_parquet(rows, tmp_path / "measured.parquet")
    return tmp_path


def _kernel(ks, label):
    return dict(ks.kernel_set())[label]


def test_the_nearest_shape_measured_on_both_gpus_and_its_verdict(ks, folder):
    kernels = ks.kernel_set()
    a, h = get_device(A100), get_device(H100)
    measured = ks.load_measured(folder, kernels, [a, h])
    small = _kernel(ks, "gemm small fwd")
    got = ks.nearest_measured(measured, small, a, h)
    assert got["exact"] and got["shape"] == "b=1 m=512 n=512 k=512"
    assert got["time_s"] == {A100: pytest.approx(6.5e-6), H100: pytest.approx(4.0e-6)}  # bf16 and fp16, not fp32
    ratio = peak_roofline_s(small, a)[0] / peak_roofline_s(small, h)[0]
    assert got["speedup"] == pytest.approx(6.5 / 4.0) and got["ratio"] == pytest.approx(ratio)
    assert not got["breaks_speedup_rule"] and not got["breaks_monotone_rule"]
    # the large GEMM's nearest shape on both is 1024^3 (4x faster on H100: beyond 1.15x its peak ratio)
    large = ks.nearest_measured(measured, _kernel(ks, "gemm large fwd"), a, h)
    assert not large["exact"] and large["shape"] == "b=1 m=1024 n=1024 k=1024"
    assert large["speedup"] == pytest.approx(4.0) and large["breaks_speedup_rule"]
    # H100 slower than A100 on the same shape breaks the monotone rule (the data, not a model)
    flipped = ks.nearest_measured(measured, small, h, a)
    assert flipped["breaks_monotone_rule"] is False and flipped["speedup"] == pytest.approx(4.0 / 6.5)
    slow = {key: {A100: dict(t[A100]), H100: {s: 9e-6 for s in t[H100]}} for key, t in measured.items()}
    assert ks.nearest_measured(slow, small, a, h)["breaks_monotone_rule"]
    # a causal kernel is not compared with non-causal measurements; an op not measured has none
    assert ks.nearest_measured(measured, _kernel(ks, "attention small fwd"), a, h) is None
    assert ks.nearest_measured(measured, _kernel(ks, "rmsnorm small fwd"), a, h) is None
    softmax = ks.nearest_measured(measured, _kernel(ks, "softmax small fwd"), a, h)
    assert softmax["exact"] and softmax["speedup"] == pytest.approx(8 / 5)


def test_each_violation_carries_and_prints_the_measured_speedup(ks, folder):
    a, h = get_device(A100), get_device(H100)
    measured = ks.load_measured(folder, ks.kernel_set(), [a, h])
    small = _kernel(ks, "gemm small fwd")
    roof_a, res_a = peak_roofline_s(small, a)
    roof_h, res_h = peak_roofline_s(small, h)
    # a model that makes H100 3x the roofline ratio faster, and one slower than A100
    fast = {"gemm small fwd": {A100: ks.Cell(6e-6, "learned", roof_a, res_a, None), H100: None}}
    fast["gemm small fwd"][H100] = ks.Cell(6e-6 * roof_h / roof_a / 3, "learned", roof_h, res_h, None)
    found = ks.violations(fast, [a, h], measured)
    (v,) = [v for v in found if v["rule"] == "speed-up"]
    assert v["measured"]["exact"] and not v["measured"]["breaks_speedup_rule"]
    assert "the data keep the speed-up rule: the model breaks it" in ks._measured_text(v["measured"], v["rule"])
    slow = {"gemm small fwd": {A100: fast["gemm small fwd"][A100], H100: ks.Cell(9e-6, "learned", roof_h, res_h, None)}}
    (m,) = ks.violations(slow, [a, h], measured)
    assert m["rule"] == "monotone" and "the data keep the monotone rule" in ks._measured_text(m["measured"], "monotone")
    assert all("measured" not in v for v in ks.violations(fast, [a, h]))  # without --measured: as before
    assert ks._measured_text(None, "speed-up") == "measured: no shape of this kernel measured on both GPUs"


def test_the_script_reports_measured_speedups_and_rejects_a_missing_folder(folder, tmp_path):
    out = tmp_path / "sanity.json"
    cmd = [sys.executable, str(SCRIPT), "--measured", str(folder), "--json", str(out), "--max-listed", "1000"]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert got.returncode == 0, got.stderr
    doc = json.loads(out.read_text())
    assert doc["measured"] == str(folder)
    listed = [v for t in doc["tables"].values() for mode in ("off", "on") for v in t[mode]["violations"]]
    pairs = [v for v in listed if v["rule"] in ("speed-up", "monotone")]
    assert pairs and all("measured" in v for v in pairs)  # the bounds-off models break rules on every refit
    assert got.stdout.count("measured") >= len(pairs)
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--measured", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("kernel_sanity: error: dataset ") and "does not exist" in bad.stderr
