"""collect-format data -> train fit -> predict: learned kernel times flow into predictions, are
labelled as such, and a tampered model set is refused in one line (exit code 2)."""

from __future__ import annotations

import json

import pytest

from opcast.cli import main
from opcast.hardware import get_device
from opcast.schema import write_parquet
from opcast.train import fit

from helpers import synthetic

GPUS = ("A10", "A40", "A100-SXM4-80GB", "H100-SXM")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    data = tmp_path_factory.mktemp("ds")
    frame = synthetic.synthetic_dataset(
        [get_device(g) for g in GPUS], ops=("gemm", "elementwise", "layernorm"), dtype="bf16", rows_per_op=60, seed=5
    )
    write_parquet(frame, data / "synthetic.parquet")
    out = tmp_path_factory.mktemp("models")
    # the library call: the CLI has no hyper-parameter flags, and a small forest keeps this test quick
    result = fit.fit_model_set(
        [data],
        out,
        name="toy",
        cfg=fit.FitConfig(
            estimator="xgb", folds=0, n_jobs=1, xgb_params={"n_estimators": 60, "max_depth": 4, "learning_rate": 0.3}
        ),
    )
    return result.path


def test_learned_kernels_are_used_and_labelled(models, capsys):
    capsys.readouterr()
    assert (
        main(
            [
                "predict",
                "train",
                "--arch",
                "gpt3-350m",
                "--gpu",
                "H200",
                "--tp",
                "2",
                "--global-batch",
                "4",
                "--seq",
                "1024",
                "--models",
                str(models),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    by_source = {(o["kind"], o["direction"]): o["source"] for o in doc["ops"]}
    assert by_source[("gemm", "fwd")] == "learned"  # dgrad/wgrad GEMMs are forward GEMMs too
    assert by_source[("layernorm", "fwd")] == "learned"
    assert by_source[("attention", "fwd")] == "roofline"  # no attention model in the set: flagged fallback
    # no layernorm-backward model in the set: the no-data rule prices it as the set's learned elementwise
    # kernel streaming its traffic (opcast.predict.cost.model.decompose)
    assert by_source[("layernorm", "bwd")] == "learned"
    assert doc["cost_sources"]["kernel_models"] == str(models)
    assert doc["cost_sources"]["unique_kernels_by_source"]["learned"] > 0
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["iteration_time_s"])


def test_kernel_command_uses_the_models(models, capsys):
    capsys.readouterr()
    assert (
        main(
            [
                "predict",
                "kernel",
                "--gpu",
                "H200",
                "--op",
                "gemm",
                "--param",
                "b=1",
                "--param",
                "m=2048",
                "--param",
                "n=2048",
                "--param",
                "k=2048",
                "--models",
                str(models),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "learned"
    # the synthetic law is the roofline + 5 us; a fitted model lands near it on an unseen GPU
    assert doc["time_s"] == pytest.approx(doc["flops"] / get_device("H200").peak_flops("bf16") + 5e-6, rel=0.5)


def test_a_tampered_model_set_is_refused_in_one_line(models, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(models, bad)
    victim = next(p for p in bad.iterdir() if p.name != "meta.json")
    victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
    capsys.readouterr()
    assert main(["predict", "train", "--arch", "gpt3-350m", "--gpu", "H200", "--models", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sha256" in err
