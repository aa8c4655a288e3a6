"""benchmarks/h200_measured.py: the committed H200 measurements load, every validate run is the
configuration the script names (its parameter count too), and the step predictions are
the ones `opcast validate`'s own predict_step gives for that configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opcast.check.validate import predict_step, resolve_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
hm = load_script(REPO / "benchmarks" / "h200_measured.py", "h200_measured")


@pytest.mark.parametrize("name", sorted(hm.RUNS))
def test_each_run_is_the_configuration_named(name):
    arch_name, layers, batch, seq = hm.RUNS[name]
    doc = json.loads((hm.DATA / "validate" / f"{name}.json").read_text())
    assert (doc["batch"], doc["seq"], doc["precision"], doc["device"]) == (batch, seq, "bf16", "H200")
    arch = resolve_arch(arch_name, layers)
    assert doc["arch"] == arch.name and doc["world_size"] == 1
    # the measured model is the one predicted, up to the vocabulary padded to a multiple of 128
    assert 0 <= doc["params"] - arch.params_total() < 128 * arch.hidden


def _llama3_step_on_h200(*, layers: int, batch: int, seq: int):
    """validate's own prediction of a bf16 llama3-8b step of ``layers`` layers on the H200."""
    arch, h200 = resolve_arch("llama3-8b", layers), get_device("H200")
    return predict_step(
        arch, h200, batch=batch, seq=seq, precision="bf16", attention="flash", world=1, kernels=load_kernel_cost(None)
    )


def test_the_report_prices_what_validate_prices(capsys):
    assert hm.main([]) == 0
    out = capsys.readouterr().out
    assert "## Training steps" in out and "## Kernels" in out
    result = _llama3_step_on_h200(layers=4, batch=2, seq=2048)
    row = f"| llama3-8b 4 layers, batch 2 x seq 2048 | total | 88.25 | {1e3 * result.iteration_time_s:.2f} |"
    assert row in out


def test_validate_prices_the_kernels_its_torch_model_runs():
    # nn.LayerNorm / nn.RMSNorm / F.cross_entropy are torch's native kernels and SDPA's flash backend is
    # FlashAttention-2 (flash2 on Hopper); Megatron's fused norms and unfused loss were priced before
    result = _llama3_step_on_h200(layers=1, batch=1, seq=512)
    impls = {o.kernel.kind: o.kernel.param_dict.get("impl") for o in result.ops}
    assert impls["rmsnorm"] == impls["cross_entropy"] == "native" and impls["attention"] == "flash2"


def test_the_gpu_script_measures_the_runs_the_benchmark_reads():
    import re
    import shutil
    import subprocess

    script = REPO / "benchmarks" / "gpu_check.sh"
    if shutil.which("bash") is not None:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    runs = {}
    for name, args in re.findall(r"^validate (\S+) \d+ (.+)$", script.read_text(), flags=re.M):
        opts = dict(re.findall(r"--(\w+) (\S+)", args))
        runs[name] = (
            opts["arch"],
            int(opts["layers"]) if "layers" in opts else None,
            int(opts["batch"]),
            int(opts["seq"]),
        )
    assert runs == hm.RUNS


def _aic_folder(root: Path, *, gemm_ms: float, quant_ms: tuple[float, float]) -> None:
    """An AIConfigurator layout holding TensorRT-LLM's fp8 and bf16 H200 rows at 4096^3 and its quantize tables."""
    import pandas as pd

    from opcast.collect.replay.aiconfigurator import QUANT_TABLES

    gemm = root / hm.AIC_SYSTEM / "gemm" / "trtllm" / "1.0"
    gemm.mkdir(parents=True)
    shape = {"m": [4096, 4096], "n": [4096, 4096], "k": [4096, 4096]}
    pd.DataFrame(
        {"kernel_source": "torch_flow", "gemm_dtype": ["fp8", "bfloat16"], **shape, "latency": [gemm_ms, 2 * gemm_ms]}
    ).to_parquet(gemm / "gemm_perf.parquet")
    quant = root / hm.AIC_SYSTEM / "quantize" / "trtllm" / "1.0"
    quant.mkdir(parents=True)
    for name, ms in zip(QUANT_TABLES, quant_ms):
        pd.DataFrame({"m": [4096], "k": [4096], "quant_dtype": ["fp8"], "latency": [ms]}).to_parquet(
            quant / f"{name}.parquet"
        )


def test_the_same_shapes_table_divides_aiconfigurator_by_the_h200(tmp_path, monkeypatch):
    """Ratios against the committed 4096^3 rows: AIConfigurator's time / the H200's median, and the fp8 GEMM alone
    with both quantize tables subtracted; without the package, one line says it was skipped."""
    import pandas as pd

    from opcast.errors import OpcastError
    from opcast.schema import read_dataset

    frame = pd.concat([read_dataset(hm.DATA / "kernels" / s) for s in ("collect", "calibrate", "bf16_gemm")])
    cube = frame[(frame["op"] == "gemm") & (frame["direction"] == "fwd") & (frame["b"] == 1)]
    cube = cube[(cube["m"] == 4096) & (cube["n"] == 4096) & (cube["k"] == 4096)]
    fp8_s = cube[cube["dtype"] == "fp8"]["time_s_median"].median()
    bf16_s = cube[cube["dtype"] == "bf16"]["time_s_median"].median()
    _aic_folder(tmp_path, gemm_ms=0.2, quant_ms=(0.02, 0.03))
    monkeypatch.setattr("opcast.collect.replay.aiconfigurator.default_root", lambda: tmp_path)
    rows = {line.split(" | ")[0].strip("| "): line for line in hm.aic_same_shapes_section() if line.startswith("| ")}
    assert rows["fp8"] == f"| fp8 | 1 | {0.2e-3 / fp8_s:.2f} | {0.15e-3 / fp8_s:.2f} (1) |"
    assert rows["bf16"] == f"| bf16 | 1 | {0.4e-3 / bf16_s:.2f} | - |"

    def absent():
        raise OpcastError("aiconfigurator-core is not installed")

    monkeypatch.setattr("opcast.collect.replay.aiconfigurator.default_root", absent)
    assert hm.aic_same_shapes_section()[-1] == "Skipped: aiconfigurator-core is not installed"
