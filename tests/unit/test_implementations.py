"""Implementations as part of the op (issue 21): the registry's ``impl`` of norms, softmax and
cross-entropy, the framework that picks them, the learned source speaking only for the
implementations it has data of, and the cross-GPU sanity benchmark running from a checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.ops import UNFUSED_PASSES, get_op
from opcast.predict.cost import LearnedKernelCost, kernel, load_kernel_cost, roofline_only
from opcast.predict.graph import precision_of, train_block

from helpers.fakes import FixedModelSet
from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", sorted(UNFUSED_PASSES))
def test_unfused_moves_more_bytes_and_fused_keeps_the_compulsory_count(kind):
    spec = get_op(kind)
    shape = {"rows": 64, "cols": 512} if "rows" in spec.param_names else {"tokens": 64, "vocab": 512}
    for direction in ("fwd", "bwd"):
        fused = spec.bytes_moved({**shape, "impl": "fused"}, 2, direction)
        assert spec.bytes_moved(shape, 2, direction) == fused  # fused is the default
        unfused = spec.bytes_moved({**shape, "impl": "unfused"}, 2, direction)
        f, u = UNFUSED_PASSES[kind][direction]
        # the element passes differ by (u - f) tensors of 64 x 512 two-byte elements; the rest is equal
        assert unfused - fused == pytest.approx((u - f) * 64 * 512 * 2)
        assert spec.flops({**shape, "impl": "unfused"}, direction) == spec.flops(shape, direction)


def _block(framework):
    arch = load_arch("llama2-7b")
    prec = precision_of("bf16", framework=framework)
    return train_block(
        arch, tp=1, batch=1, seq=1024, sp=False, cp=1, ep=1, attention="flash", recompute="none", prec=prec
    )


@pytest.mark.parametrize("cost", [roofline_only, lambda: load_kernel_cost(None)], ids=["roofline", "default-models"])
def test_the_framework_changes_the_norms_price_and_not_the_gemms(cost):
    model, a100 = cost(), get_device("A100-SXM4-80GB")
    megatron, hf = _block("megatron"), _block("hf")
    mine = {n.role: n for n in megatron.nodes["forward"] + megatron.nodes["backward"]}
    theirs = {n.role: n for n in hf.nodes["forward"] + hf.nodes["backward"]}
    pairs = [(mine[role], theirs[role]) for role in mine if role in theirs]
    times = model.lookup([k for pair in pairs for n in pair for k in [n.kernel]], a100)
    norms = [(m, h) for m, h in pairs if m.kernel.kind == "rmsnorm"]
    gemms = [(m, h) for m, h in pairs if m.kernel.kind == "gemm"]
    assert norms and gemms
    for m, h in norms:
        assert (m.kernel.param_dict["impl"], h.kernel.param_dict["impl"]) == ("fused", "unfused")
        assert times[h.kernel][0] > 1.5 * times[m.kernel][0]  # the unfused norm is slower
    for m, h in gemms:
        assert m.kernel == h.kernel and times[m.kernel] == times[h.kernel]


def test_hf_liger_runs_liger_s_kernels_where_hf_runs_torch_s():
    from opcast.predict.frameworks import FRAMEWORKS

    hf, liger = FRAMEWORKS["hf"], FRAMEWORKS["hf-liger"]
    assert dict(liger.impls) == {
        **dict(hf.impls),
        "rmsnorm": "liger",
        "cross_entropy": "liger",
        "rope": "liger",
    }
    assert (liger.hf_modules, liger.fp32_grads) == (hf.hf_modules, hf.fp32_grads)
    block = _block("hf-liger")
    impls = {n.kernel.kind: n.kernel.param_dict.get("impl") for n in block.nodes["forward"]}
    assert (impls["rmsnorm"], impls["rope"]) == ("liger", "liger")


def test_liger_against_fused_changes_the_norms_price_and_not_the_gemms():
    # default models: Liger's Triton RMSNorm is learned from its own rows, an Apex / TE fused one (no
    # half-precision data) is the streaming kernel of its traffic; a GEMM does not know the framework
    model, a100 = load_kernel_cost(None), get_device("A100-SXM4-80GB")
    megatron, liger = _block("megatron"), _block("hf-liger")
    m_nodes = megatron.nodes["forward"] + megatron.nodes["backward"]
    l_nodes = liger.nodes["forward"] + liger.nodes["backward"]
    norms = [n.kernel for n in m_nodes + l_nodes if n.kernel.kind == "rmsnorm"]
    gemms = {n.kernel for n in m_nodes if n.kernel.kind == "gemm"}
    assert gemms == {n.kernel for n in l_nodes if n.kernel.kind == "gemm"}
    times = model.lookup([*norms, *gemms], a100)
    for direction in ("fwd", "bwd"):
        by_impl = {k.param_dict["impl"]: times[k][0] for k in norms if k.direction == direction}
        assert set(by_impl) == {"fused", "liger"}
        assert by_impl["fused"] != pytest.approx(by_impl["liger"], rel=0.05), direction


def _norm(impl, direction="bwd"):
    return kernel("rmsnorm", {"rows": 1024, "cols": 4096, "impl": impl}, "bf16", direction)


def test_a_set_fitted_before_impl_speaks_only_for_what_its_sources_measured():
    legacy = LearnedKernelCost(FixedModelSet({"rmsnorm-bwd-half": {"features": ["log_rows"]}}), "fake")
    assert legacy.covers(_norm("unfused")) and not legacy.covers(_norm("fused"))
    # and it is asked with the default implementation, the features it was fitted on
    legacy.predict_s([_norm("unfused")], get_device("A100-SXM4-80GB"))
    assert legacy.model_set.asked == ["fused"]
    assert any("no data of impl fused" in n for n in legacy.range.notes)


@pytest.mark.parametrize(("span", "fused", "unfused"), [([4.0, 4.0], False, True), ([3.0, 4.0], True, True)])
def test_a_set_with_impl_code_speaks_for_the_implementations_in_its_range(span, fused, unfused):
    entry = {"features": ["log_rows", "impl_code"], "feature_ranges": {"impl_code": span}}
    src = LearnedKernelCost(FixedModelSet({"rmsnorm-bwd-half": entry}), "fake")
    assert (src.covers(_norm("fused")), src.covers(_norm("unfused"))) == (fused, unfused)
    src.predict_s([_norm("unfused")], get_device("A100-SXM4-80GB"))
    assert src.model_set.asked == ["unfused"]


def test_a_gemm_is_covered_whatever_the_set_records():
    src = LearnedKernelCost(FixedModelSet({"gemm-fwd-half": {"features": ["log_m"]}}), "fake")
    assert src.covers(kernel("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}, "bf16"))


def test_a_bad_framework_is_one_line_and_exit_2():
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "predict",
            "train",
            "--arch",
            "gpt3-125m",
            "--gpu",
            "A100-SXM4-80GB",
            "--framework",
            "deepspeed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 2
    assert got.stderr.count("\n") == 1 and "framework='deepspeed' is not one of megatron, neox, hf" in got.stderr


def test_a_bad_impl_is_one_line_and_exit_2_naming_liger():
    got = subprocess.run(
        [
            *(sys.executable, "-m", "opcast", "predict", "kernel", "--op", "rmsnorm", "--gpu", "A100-SXM4-80GB"),
            *("--param", "rows=1024", "--param", "cols=4096", "--param", "impl=apex"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 2
    assert got.stderr.count("\n") == 1 and "impl='apex' is not one of fused, unfused, native, liger" in got.stderr


def test_the_sanity_benchmark_runs_from_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kernel_sanity", None)  # restored after the test
    module = load_script(ROOT / "benchmarks" / "kernel_sanity.py")
    out = tmp_path / "sanity.json"
    assert module.main(["--json", str(out), "--max-listed", "0"]) == 0
    doc = json.loads(out.read_text())
    primary = doc["tables"]["data-centre GPUs (A100 to GB200)"]
    assert primary["gpus"] == list(module.PRIMARY)
    cells = primary["on"]["cells"]
    # nothing beats the roofline at the peak, and a large fused (Apex / TE one-pass) RMSNorm runs at a fused
    # kernel's share of the bandwidth, where the unfused NeoX data said 4-5 %: no half-precision data of
    # those kernels exist, so it and LayerNorm are the learned streaming kernel of their traffic (the no-data rule);
    # fused softmax is learned from Megatron's kernel; all meet the issue's 40 %. Liger's Triton RMSNorm
    # (impl liger, learned from its rows: backward 7-31 % of A100's bandwidth) and torch's native
    # multi-pass kernels are priced apart and slower
    assert all(c["utilisation"] <= 1 + 1e-9 for row in cells.values() for c in row.values())
    assert min(c["utilisation"] for c in cells["rmsnorm large fwd"].values()) >= module.FUSED_TARGET
    assert min(c["utilisation"] for c in cells["rmsnorm large bwd"].values()) >= module.FUSED_TARGET
    liger = cells["rmsnorm liger large bwd"]
    assert all(liger[g]["utilisation"] < cells["rmsnorm large bwd"][g]["utilisation"] for g in liger)
    for label in ("layernorm large fwd", "layernorm large bwd", "softmax large fwd", "softmax large bwd"):
        assert min(c["utilisation"] for c in cells[label].values()) >= module.FUSED_TARGET, label
    for kind in ("layernorm", "softmax"):
        fused, native = cells[f"{kind} large fwd"], cells[f"{kind} native large fwd"]
        assert all(native[g]["utilisation"] < fused[g]["utilisation"] for g in fused), kind


def test_run_train_prices_and_stores_what_the_framework_runs():
    # --framework reaches the compiled graph (hf: python RMSNorm, unfused), the memory model and the
    # data-parallel reduction (megatron: fp32 main_grad, reduced in fp32), not only a kernel asked for by hand
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import compile_train, run_train

    arch, a100 = load_arch("llama2-7b"), get_device("A100-SXM4-80GB")
    base = dict(tp=2, pp=1, dp=4, micro_batch=1, global_batch=64, seq=4096)
    runs = {
        fw: run_train(compile_train(arch, a100, TrainConfig(**base, framework=fw)), roofline_only("test"))
        for fw in (None, "megatron", "hf")
    }
    bf16_grads = TrainConfig(**base, framework="megatron", grad_reduce_in_fp32=False)
    same = run_train(compile_train(arch, a100, bf16_grads), roofline_only("test"))
    assert runs["hf"].iteration_time_s > runs[None].iteration_time_s
    assert runs["megatron"].iteration_time_s > same.iteration_time_s  # twice the bytes in the reduction
    assert same.iteration_time_s < runs[None].iteration_time_s  # megatron's one-kernel rope and SwiGLU
    state = {fw: max(m.total_bytes for m in r.memory) for fw, r in runs.items()}
    assert state["megatron"] > state[None] == state["hf"]


def test_megatron_runs_rope_and_swiglu_as_one_kernel_each_where_hf_runs_torch_ops():
    """Megatron-LM and NeMo's Llama configs fuse rope (``apply_rope_fusion``) and SwiGLU (``bias_swiglu_impl``);
    Hugging Face's eager modules run the registry's unfused rope, SiLU and the gate product apart."""
    megatron, hf = _block("megatron"), _block("hf")

    def kernels(block, direction):
        return {n.role: n.kernel for n in block.nodes[direction]}

    m, h = kernels(megatron, "forward"), kernels(hf, "forward")
    assert m["rope"].param_dict["impl"] == "fused" and h["rope"].param_dict["impl"] == "unfused"
    numel = 1024 * load_arch("llama2-7b").ffn_hidden
    assert m["act"].param_dict == {"numel": numel, "fn": "swiglu"} and "gate_mul" not in m
    assert (h["act"].param_dict["fn"], h["gate_mul"].param_dict["fn"]) == ("silu", "mul")
    mb, hb = kernels(megatron, "backward"), kernels(hf, "backward")
    assert mb["act.bwd"].param_dict["fn"] == "swiglu" and "gate_mul.bwd" not in mb and "gate_mul.bwd" in hb
    model, a100 = roofline_only(), get_device("A100-SXM4-80GB")
    t = model.lookup([m["act"], h["act"], h["gate_mul"], m["rope"], h["rope"]], a100)
    assert t[m["act"]][0] < t[h["act"]][0] + t[h["gate_mul"]][0]
    assert t[m["rope"]][0] < t[h["rope"]][0]


def test_rope_and_swiglu_fusion_override_the_framework():
    """``rope_fusion`` / ``swiglu_fusion`` (Megatron-LM's ``--no-rope-fusion`` / ``--no-bias-swiglu-fusion``)
    turn megatron's one-kernel rope and SwiGLU back into torch's ops, and fuse them under a framework that does not."""
    arch = load_arch("llama2-7b")

    def kernels(framework, **switches):
        prec = precision_of("bf16", framework=framework, **switches)
        block = train_block(
            arch, tp=1, batch=1, seq=1024, sp=False, cp=1, ep=1, attention="flash", recompute="none", prec=prec
        )
        return {n.role: n.kernel for n in block.nodes["forward"]}

    off = kernels("megatron", rope_fusion=False, swiglu_fusion=False)
    assert off["rope"].param_dict["impl"] == "unfused"
    assert (off["act"].param_dict["fn"], off["gate_mul"].param_dict["fn"]) == ("silu", "mul")
    on = kernels("hf", rope_fusion=True, swiglu_fusion=True)
    assert on["rope"].param_dict["impl"] == "fused"
    assert on["act"].param_dict["fn"] == "swiglu" and "gate_mul" not in on
    # each switch alone; the rest stays the framework's
    rope_only = kernels("megatron", rope_fusion=False)
    assert rope_only["rope"].param_dict["impl"] == "unfused" and rope_only["act"].param_dict["fn"] == "swiglu"
    assert kernels("hf-liger", swiglu_fusion=False)["rope"].param_dict["impl"] == "liger"


def test_the_fusion_switches_through_the_console_script():
    opcast = str(Path(sys.executable).with_name("opcast"))
    base = [opcast, "predict", "train", "--arch", "llama2-7b", "--gpu", "H100-SXM", "--gpus-per-node", "8"]
    base += ["--tp", "2", "--seq", "2048", "--framework", "megatron", "--json"]
    docs = {}
    for flags in ((), ("--no-rope-fusion", "--no-swiglu-fusion")):
        out = subprocess.run([*base, *flags], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        docs[flags] = json.loads(out.stdout)
    fused, unfused = docs[()], docs[("--no-rope-fusion", "--no-swiglu-fusion")]
    assert (fused["config"]["rope_fusion"], unfused["config"]["rope_fusion"]) == (None, False)
    assert unfused["config"]["swiglu_fusion"] is False
    assert unfused["iteration_time_s"] > fused["iteration_time_s"]
    bad = subprocess.run([*base, "--rope-fusion=maybe"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
