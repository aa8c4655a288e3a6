"""Per-tensor fp8 recipes and layouts (predict/graph.py fp8_quantisation, fp8_amax_comms, fp8_gemm_transposes):
Transformer Engine's current scaling adds an amax pass before each cast (not after a norm, which computes
it) and all-reduces the amax of fp8-gathered rows over the TP group; on datacenter Blackwell TE 2.x writes
no fp8 transposes; ``--fp8-recipe`` is checked through the console script."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.graph import (
    BWD,
    FWD,
    block_ops,
    delayed_amax_reduction,
    fp8_amax_comms,
    fp8_gemm_transposes,
    fp8_quantisation,
    precision_of,
    weight_casts,
)

M, N, K, TP = 64, 32, 48, 4
P = {"b": 1, "m": M, "n": N, "k": K}


def _bytes(ops):
    prec = precision_of("fp8")
    return [(role.split(".", 1)[1], prec.of(kind, p).bytes_moved()) for role, kind, p, _ in ops]


def test_current_scaling_adds_an_amax_pass_except_after_the_norm_and_casts_gathered_rows_locally():
    q = {"modules": "megatron", "tp": TP, "sp": True, "grouped": False, "recipe": "current"}
    # LayerNormLinear with SP: the norm computed the amax; the local rows are cast, gathered, transposed
    fwd, dgrad, wgrad = fp8_quantisation("qkv", P, **q)
    assert _bytes(fwd) == [("fp8_cast_input", 3 * (M // TP) * K)]
    assert _bytes(dgrad) == [("fp8_amax_grad", 2 * M * N), ("fp8_cast_transpose_grad", 4 * M * N)]
    assert _bytes(wgrad) == [("fp8_transpose_input", 2 * M * K)]
    # row-parallel: its input is quantised whole; its output gradient on the local rows, then gathered
    fwd, dgrad, wgrad = fp8_quantisation("proj", P, **q)
    assert _bytes(fwd) == [("fp8_amax_input", 2 * M * K), ("fp8_cast_transpose_input", 4 * M * K)]
    local = (M // TP) * N
    assert _bytes(dgrad) == [
        ("fp8_amax_grad", 2 * local),
        ("fp8_cast_grad", 3 * local),
        ("fp8_transpose_grad", 2 * M * N),
    ]
    assert wgrad == []


def test_without_tn_only_gemms_no_transposes_under_either_recipe():
    for recipe in ("delayed", "current"):
        q = {"modules": "linear", "tp": TP, "sp": True, "grouped": False, "recipe": recipe, "transposes": False}
        for role in ("qkv", "proj"):
            for ops in fp8_quantisation(role, P, **q):
                assert not any("transpose" in name for name, _ in _bytes(ops)), (recipe, role)
    delayed = fp8_quantisation("proj", P, modules="linear", tp=1, sp=False, grouped=False, transposes=False)
    assert _bytes(delayed[0]) == [("fp8_cast_input", 3 * M * K), ("fp8_cast_weight", 3 * K * N)]


def test_the_layout_rule_is_the_gpus_and_per_tensor_fp8s_only():
    assert fp8_gemm_transposes(get_device("H100-SXM"))
    assert fp8_gemm_transposes(get_device("RTX-PRO-6000"))  # sm_120: TN only (TE >= 2.3)
    assert not any(fp8_gemm_transposes(get_device(g)) for g in ("B200", "GB200", "GB300"))
    b200 = get_device("B200")
    assert not precision_of("fp8", device=b200).fp8_transposes
    assert precision_of("mxfp8", fp8_recipe="current", device=b200) == precision_of("mxfp8", device=b200)
    assert not delayed_amax_reduction(precision_of("fp8", fp8_recipe="current"))
    assert delayed_amax_reduction(precision_of("fp8")) and not delayed_amax_reduction(precision_of("bf16"))
    arch = load_arch("llama3-8b")
    cast = weight_casts(arch, tp=2, ep=1, prec=precision_of("fp8", fp8_recipe="current", device=b200))
    assert [n.role for n in cast[:2]] == ["qkv.fp8_amax_weight", "qkv.fp8_cast_weight"]


def test_current_scaling_all_reduces_one_amax_per_gathered_tensor_over_tp():
    ops = block_ops(load_arch("llama3-8b"), tp=TP, batch=1, seq_q=256, seq_kv=256, sp=True, ep=1)
    comms = fp8_amax_comms(ops, precision_of("fp8", fp8_recipe="current"), tp=TP, sp=True)
    # forward: QKV's and MLP-up's inputs; backward: out-proj's and MLP-down's output gradients
    assert [(c.role, c.kind, c.bytes, c.count) for c in comms[FWD] + comms[BWD]] == [
        ("tp_amax", "all_reduce", 4, 2),
        ("tp_amax", "all_reduce", 4, 2),
    ]
    assert fp8_amax_comms(ops, precision_of("fp8"), tp=TP, sp=True) == {FWD: (), BWD: ()}
    assert fp8_amax_comms(ops, precision_of("fp8", fp8_recipe="current"), tp=TP, sp=False) == {FWD: (), BWD: ()}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--precision", "fp8", "--fp8-recipe", "hybrid"], "fp8_recipe='hybrid' is not one of delayed, current"),
        (["--fp8-recipe", "current"], "applies to precision fp8"),
    ],
)
def test_a_bad_fp8_recipe_is_one_line_and_exit_2(extra, needle):
    cmd = [sys.executable, "-m", "opcast", "predict", "train", "--arch", "gpt3-125m", "--gpu", "H100-SXM", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
