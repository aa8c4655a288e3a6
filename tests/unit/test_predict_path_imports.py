"""The predict path stays light (issue 16): ``opcast predict train --json`` imports no heavy
library, its learned kernel times come from numpy-only features that equal the training side's
pandas ones, and the tensor-core rule is written once."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import opcast.ops
import opcast.predict.cost
import opcast.train.features
from opcast.hardware import get_device
from opcast.predict.cost import kernel
from opcast.predict.cost.learned import _query_columns
from opcast.train.artifacts import load_model_set
from opcast.train.features import Table, feature_table, features

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "torch", "xgboost", "sklearn", "scipy", "pyarrow", "matplotlib")
"""Libraries ``opcast predict train`` must not import (the embedded default models need none)."""

JOBS = {
    "readme": "predict train --arch llama2-7b --gpu A100-SXM4-80GB --nodes 1 --gpus-per-node 8 --tp 2 --pp 1 "
    "--micro-batch 1 --global-batch 64 --seq 4096 --json",
    "megatron-175b": "predict train --arch megatron-175b --gpu A100-SXM4-80GB --nodes 128 --gpus-per-node 8 "
    "--tp 8 --pp 8 --micro-batch 1 --global-batch 1536 --seq 2048 --recompute full --json",
}

_RUN = """
import json, sys
from opcast.cli import main
code = main(sys.argv[1:])  # the console script's entry point: returns the exit code
sys.stdout.flush()
sys.stderr.write("\\nHEAVY " + json.dumps(sorted(m for m in %r if m in sys.modules)) + "\\n")
sys.exit(code)
"""


@pytest.mark.parametrize("job", sorted(JOBS))
def test_predict_train_json_imports_no_heavy_library(job):
    done = subprocess.run(
        [sys.executable, "-c", _RUN % (HEAVY,), *JOBS[job].split()], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["iteration_time_s"] > 0 and doc["cost_sources"]["kernel_models"], "not a learned prediction"
    heavy = json.loads(done.stderr.rsplit("HEAVY ", 1)[1])
    assert heavy == [], f"opcast {JOBS[job]} imported {heavy}"


def _kernels() -> list:
    """Kernels of several kinds, dtypes, directions and tensor-core flags, some not covered."""
    return [
        kernel("gemm", {"b": 1, "m": 4096, "n": 11008, "k": 4096}, "bf16"),
        kernel("gemm", {"b": 1, "m": 4096, "n": 11008, "k": 4096}, "bf16", "bwd"),
        kernel("gemm", {"b": 2, "m": 1000, "n": 333, "k": 77}, "fp32"),
        kernel("gemm", {"b": 2, "m": 1000, "n": 333, "k": 77}, "fp32", tensor_cores=True),
        kernel(
            "attention",
            {
                "batch": 1,
                "heads": 32,
                "kv_heads": 8,
                "seq_q": 4096,
                "seq_kv": 4096,
                "head_dim": 128,
                "causal": True,
                "impl": "flash",
            },
            "bf16",
        ),
        kernel("softmax", {"rows": 8192, "cols": 1000}, "fp32"),
        kernel("rmsnorm", {"rows": 4096, "cols": 4096}, "bf16", "bwd"),
        kernel("elementwise", {"numel": 1 << 24, "fn": "gelu"}, "bf16"),
        kernel("rope", {"tokens": 4096, "heads": 32, "head_dim": 128}, "bf16"),
        kernel("optimizer", {"numel": 1 << 26}, "bf16"),
        kernel("embedding", {"tokens": 4096, "vocab": 32000, "hidden": 4096}, "bf16", "bwd"),
    ]


def test_kernel_columns_predict_exactly_what_the_same_rows_as_a_dataframe_predict():
    """The predict path's numpy columns (no pandas) and the training side's DataFrame of the same
    rows give bit-identical features and learned times on the embedded default models."""
    ks = _kernels()
    cols = _query_columns(ks)
    assert isinstance(cols, Table) and len(cols) == len(ks)
    frame = pd.DataFrame(
        [
            {"op": k.kind, "dtype": k.dtype, "direction": k.direction, "tensor_cores": k.tensor_cores, **k.param_dict}
            for k in ks
        ]
    )
    ms = load_model_set(None)
    h100 = get_device("H100-SXM")
    from_cols, from_frame = ms.predict_s(cols, h100), ms.predict_s(frame, h100)
    assert np.isfinite(from_cols).sum() >= 8  # most kinds are covered by the default set
    np.testing.assert_array_equal(from_cols, from_frame)
    table, frame_feats = feature_table(cols, h100), features(frame, h100)
    assert list(table.columns) == list(frame_feats.columns)
    for name in table.columns:
        np.testing.assert_array_equal(table[name].to_numpy(dtype=float), frame_feats[name].to_numpy(dtype=float))


def test_missing_values_and_nullable_columns_read_as_their_defaults_and_flags():
    """A frame with pandas' nullable dtypes, a missing optional parameter (rope's impl) and
    missing tensor-core flags gives the features of the same rows written out in full."""
    a100 = get_device("A100-SXM4-80GB")
    gemm = {"op": "gemm", "b": 1, "m": 64, "n": 96, "k": 64}
    full = pd.DataFrame(
        [
            {"op": "rope", "dtype": "bf16", "direction": "fwd", "tensor_cores": False, "tokens": 4096, "heads": 32},
            {**gemm, "dtype": "fp32", "direction": "fwd", "tensor_cores": False},
            {**gemm, "dtype": "tf32", "direction": "bwd", "tensor_cores": True},
            {**gemm, "dtype": "bf16", "direction": "fwd", "tensor_cores": True},
        ]
    ).assign(head_dim=[128, None, None, None], impl=["unfused", None, None, None])
    sparse = full.copy()
    sparse["tensor_cores"] = pd.array([pd.NA, pd.NA, True, pd.NA], dtype="boolean")  # uses_tensor_cores' defaults
    sparse["impl"] = pd.array([pd.NA] * 4, dtype="string")  # the registry's default impl
    sparse["head_dim"] = pd.array([128, pd.NA, pd.NA, pd.NA], dtype="Int64")
    sparse["m"] = pd.array([pd.NA, 64, 64, 64], dtype="Int64")
    got, want = features(sparse, a100), features(full, a100)
    assert list(got.columns) == list(want.columns)
    for name in want.columns:
        np.testing.assert_array_equal(got[name].to_numpy(dtype=float), want[name].to_numpy(dtype=float), name)
    assert got["tensor_cores"].tolist() == [0.0, 0.0, 1.0, 1.0] and np.isfinite(got["t_roof_s"]).all()


def test_the_tensor_core_rule_is_written_once():
    """``MATRIX_KINDS`` and ``uses_tensor_cores`` live in the op registry; every other module
    imports them (no second definition anywhere in the package)."""
    assert opcast.predict.cost.uses_tensor_cores is opcast.ops.uses_tensor_cores
    assert opcast.train.features.uses_tensor_cores is opcast.ops.uses_tensor_cores
    assert opcast.predict.cost.MATRIX_KINDS is opcast.ops.MATRIX_KINDS is opcast.train.features.MATRIX_KINDS
    defined = []
    for folder in ("opcast", "collect", "train", "predict", "check"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [node.name]
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                    else [
                        t.id
                        for t in getattr(node, "targets", [getattr(node, "target", None)])
                        if isinstance(t, ast.Name)
                    ]
                    if isinstance(node, (ast.Assign, ast.AnnAssign))
                    else []
                )
                defined += [
                    f"{path.relative_to(REPO)}:{n}" for n in names if n in ("MATRIX_KINDS", "uses_tensor_cores")
                ]
    assert defined == ["opcast/ops.py:MATRIX_KINDS", "opcast/ops.py:uses_tensor_cores"]
