"""benchmarks/modern_gpus.py with another vendor's rows among the training rows (``--train-also``, ``--all-vendors``,
issue 17): the scored systems stay NVIDIA's, and since a group that mixes vendors fits its NVIDIA answers on NVIDIA's
rows alone (opcast.train.fit.vendor_rows), the leave-one-GPU-out table does not move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.scripts import load_script
from helpers.synthetic import aic_gemm_rows

REPO = Path(__file__).resolve().parents[2]
mg = load_script(REPO / "benchmarks" / "modern_gpus.py", "modern_gpus_benchmark_vendors")

EFFICIENCY = {"H100-SXM": 0.7, "B200": 0.6, "GB200": 0.5, "MI300X": 0.25}


def _rows(devices: tuple[str, ...], seed: int = 0, shapes: int = 60) -> list[dict]:
    """bf16 GEMMs of the same random shapes on catalog GPUs, a roofline law with a per-GPU efficiency."""
    return aic_gemm_rows({d: EFFICIENCY[d] for d in devices}, seed=seed, shapes=shapes)


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
