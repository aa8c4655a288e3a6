"""benchmarks/modern_gpus.py `cap` (issue 17): at most n rows per (device, label), drawn by a seeded
per-row hash, so the rows kept of one label do not change when the rows of another label change
(the default models' bf16 GEMM sample used to be redrawn whenever the fp8 rows changed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from helpers.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
mg = load_script(REPO / "benchmarks" / "modern_gpus.py", "modern_gpus_benchmark_cap")


def _rows(label: str, device: str, count: int, start: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "device": [device] * count,
            "label": [label] * count,
            "point_id": [f"{label}-{i}" for i in range(start, start + count)],
            "source_file": ["sys/gemm/vllm/1/gemm_perf.parquet"] * count,
        }
    )


def _kept(frame: pd.DataFrame, label: str, n: int, seed: int = 0) -> set[str]:
    out = mg.cap(frame, n, seed)
    return set(out.loc[out["label"] == label, "point_id"])


def test_cap_bounds_every_device_and_label() -> None:
    parts = [_rows("gemm bf16", "H100-SXM", 50), _rows("gemm bf16", "B200", 7), _rows("gemm fp8", "B200", 30)]
    frame = pd.concat(parts)
    out = mg.cap(frame.reset_index(drop=True), 10, 0)
    assert out.groupby(["device", "label"]).size().to_dict() == {
        ("B200", "gemm bf16"): 7,
        ("B200", "gemm fp8"): 10,
        ("H100-SXM", "gemm bf16"): 10,
    }
    assert list(out.index) == sorted(out.index)  # row order kept


def test_other_labels_never_redraw_a_label() -> None:
    bf16 = _rows("gemm bf16", "H100-SXM", 200)
    before = pd.concat([bf16, _rows("gemm fp8", "H100-SXM", 100)], ignore_index=True)
    after = pd.concat([_rows("gemm fp8", "H100-SXM", 40, start=500), bf16.iloc[::-1]], ignore_index=True)
    assert _kept(before, "gemm bf16", 20) == _kept(after, "gemm bf16", 20)
    assert _kept(before, "gemm fp8", 20) != _kept(after, "gemm fp8", 20)  # fp8's own rows changed


def test_seed_changes_the_draw() -> None:
    frame = _rows("gemm bf16", "H100-SXM", 200)
    assert _kept(frame, "gemm bf16", 20, seed=0) != _kept(frame, "gemm bf16", 20, seed=1)


def test_never_fitted_drops_every_shape_of_the_refit_sample_on_every_gpu() -> None:
    """The shipped section scores shapes the refit never fitted: a shape sampled on one GPU is not scored on
    another (point_id names the shape, not the GPU), and every other row is."""
    h100 = _rows("gemm bf16", "H100-SXM", 60)
    b200 = _rows("gemm bf16", "B200", 60)  # the same 60 shapes (point ids) on a second GPU
    frame = pd.concat([h100, b200, _rows("gemm fp8", "B200", 30)], ignore_index=True)
    sample = mg.cap(frame, 10, 0)
    out = mg.never_fitted(frame, 10, 0)
    assert not set(out["point_id"]) & set(sample["point_id"])
    assert len(out) == int((~frame["point_id"].isin(set(sample["point_id"]))).sum())
    # the B200 rows of shapes drawn only on the H100 are dropped too
    h100_only = set(sample.loc[sample["device"] == "H100-SXM", "point_id"]) - set(
        sample.loc[sample["device"] == "B200", "point_id"]
    )
    assert h100_only and not set(out.loc[out["device"] == "B200", "point_id"]) & h100_only
    assert len(mg.never_fitted(frame, 1000, 0)) == 0  # a refit that kept every row leaves nothing to score


def test_shipped_section_defaults_to_the_refits_sample() -> None:
    """--fit-rows defaults to the AIC_ROWS the refit script fits models/default on, so the shipped section scores
    exactly the shapes the embedded set never saw; the two numbers live in two files and must not drift."""
    script = (REPO / "benchmarks" / "train_default_models.sh").read_text()
    assert f'aic_rows="${{AIC_ROWS:-{mg.REFIT_AIC_ROWS}}}"' in script
