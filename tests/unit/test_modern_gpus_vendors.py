"""benchmarks/modern_gpus.py with another vendor's rows among the training rows (``--train-also``, ``--all-vendors``,
issue 17): the scored systems stay NVIDIA's, and since a group that mixes vendors fits its NVIDIA answers on NVIDIA's
rows alone (opcast.train.fit.vendor_rows), the leave-one-GPU-out table does not move."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from opcast.hardware import get_device

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
mg = load_script(REPO / "benchmarks" / "modern_gpus.py", "modern_gpus_benchmark_vendors")

EFFICIENCY = {"H100-SXM": 0.7, "B200": 0.6, "GB200": 0.5, "MI300X": 0.25}


def _rows(devices: tuple[str, ...], seed: int = 0, shapes: int = 60) -> list[dict]:
    """bf16 GEMMs of the same random shapes on catalog GPUs, a roofline law with a per-GPU efficiency."""
    rng = np.random.default_rng(seed)
    mnk = rng.integers(6, 14, size=(shapes, 3))
    rows = []
    for dev in devices:
        spec = get_device(dev)
        assert spec.peak_bf16_flops
        for m, n, k in 2**mnk:
            t_compute = 2 * m * n * k / (spec.peak_bf16_flops * EFFICIENCY[dev])
            t_memory = 2 * (m * k + k * n + m * n) / spec.mem_bw_bytes_per_s
            rows.append(
                {
                    "run_id": "t",
                    "source": "replay:aiconfigurator",
                    "timing_method": "replay:aiconfigurator:mean",
                    "source_file": f"{dev}/gemm/trtllm/1.0/gemm_perf.parquet",
                    "device": dev,
                    "op": "gemm",
                    "dtype": "bf16",
                    "direction": "fwd",
                    "tensor_cores": True,
                    "b": 1,
                    "m": int(m),
                    "n": int(n),
                    "k": int(k),
                    "time_s_median": float((max(t_compute, t_memory) + 5e-6) * np.exp(rng.normal(0, 0.03))),
                }
            )
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from opcast.schema import write_parquet

    folder = tmp_path_factory.mktemp("mg-vendors")
    return {
        "nvidia": write_parquet(_rows(("H100-SXM", "B200", "GB200")), folder / "aiconfigurator.parquet"),
        "amd": write_parquet(_rows(("MI300X",), seed=1), folder / "aiter.parquet"),
    }


def _pooled(data: Path, tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / f"tables{len(extra)}.json"
    args = ["--data", str(data), "--labels", "gemm bf16", "--sections", "logo", "--train-rows", "60"]
    assert mg.main([*args, "--test-rows", "30", "--json", str(out), *extra]) == 0
    tables = json.loads(out.read_text())["tables"]
    per_system = next(t for title, t in tables.items() if title.startswith("Leave-one-GPU-out per left-out system"))
    return sorted((r["system"], round(r["mape"], 6)) for r in per_system)


def test_another_vendors_rows_train_but_move_no_nvidia_score(data, tmp_path):
    alone = _pooled(data["nvidia"], tmp_path)
    with_amd = _pooled(data["nvidia"], tmp_path, "--train-also", str(data["amd"]))
    assert [d for d, _ in alone] == ["B200", "GB200", "H100-SXM"]  # the AMD GPU trains, it is not scored
    assert with_amd == alone


def test_a_missing_train_also_file_is_one_line_exit_2(data, tmp_path, capsys):
    assert mg.main(["--data", str(data["nvidia"]), "--train-also", str(tmp_path / "none.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--train-also" in err[0] and "no such file" in err[0]
