"""The first-party H200 datasets in benchmarks/data/h200_torch hold what their READMEs and the refit say."""

from __future__ import annotations

from pathlib import Path

from opcast.schema import read_dataset

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200_torch" / "kernels"
REFIT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_default_models.sh"


def test_the_fitted_neusight_protocol_rows_are_forward_fp32_of_the_h200_only():
    """models/default fits this folder (the refit names it): forward fp32 rows timed by NeuSight's rule, nothing
    else -- its backward twins (autograd's host time inside each) live apart and are fitted by nothing."""
    rows = read_dataset(KERNELS / "neusight_fp32")
    assert len(rows) == 1693  # 1,706 timed; the 13 eager silu(a) * b chains timed under the fused swiglu dropped
    assert set(rows["device"]) == {"H200"} and set(rows["dtype"]) == {"fp32"} and set(rows["direction"]) == {"fwd"}
    assert set(rows["timing_method"]) == {"neusight:mean_fastest5"} and (rows["n_reps"] == 25).all()
    assert rows.groupby("op").size().to_dict() == {"elementwise": 248, "gemm": 1031, "layernorm": 207, "softmax": 207}
    assert rows["point_id"].is_unique and not rows["point_id"].str.contains(":").any()  # the schema's shape ids
    bwd = read_dataset(KERNELS / "neusight_bwd")
    assert set(bwd["direction"]) == {"bwd"} and len(bwd) == 1606
    # torch eager has no fused SwiGLU kernel: its two-kernel chain is no row of the registry's swiglu
    assert "swiglu" not in set(rows["fn"].dropna()) | set(bwd["fn"].dropna())
    refit = REFIT.read_text()
    assert "benchmarks/data/h200_torch/kernels/neusight_fp32" in refit and "neusight_bwd" not in refit


def test_the_bf16_gemms_are_the_second_collection_as_measured():
    rows = read_dataset(KERNELS / "bf16_gemm")
    assert len(rows) == 915 and set(rows["op"]) == {"gemm"} and set(rows["dtype"]) == {"bf16"}
    fwd = rows[rows["direction"] == "fwd"]
    assert len(fwd) == 458 and (fwd["timing_method"] == "cuda_graph").sum() == 240
    assert (fwd.loc[fwd["timing_method"] == "cuda_graph", "time_s_median"] < 10e-6).all()
