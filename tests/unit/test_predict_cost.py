"""Kernel-time sources: the roofline fallback, the learned/roofline composite, caching, loading."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import (
    LEARNED,
    ROOFLINE,
    ROOFLINE_EFFICIENCY,
    EfficiencyCurve,
    KernelCostModel,
    LearnedKernelCost,
    RooflineKernelCost,
    kernel,
    load_kernel_cost,
    uses_tensor_cores,
    validated_kernel,
)

A100 = get_device("A100-SXM4-80GB")


def doubled(device):
    """Every throughput spec x2 (what issue 9 calls a hypothetical GPU)."""
    return dataclasses.replace(
        device,
        name=device.name + "-x2",
        aliases=(),
        **{
            f: getattr(device, f) * 2
            for f in (
                "peak_fp32_flops",
                "peak_tf32_flops",
                "peak_fp16_flops",
                "peak_bf16_flops",
                "peak_fp8_flops",
                "mem_bw_bytes_per_s",
                "intra_node_bw_bytes_per_s",
                "inter_node_bw_bytes_per_s",
            )
            if getattr(device, f) is not None
        },
    )


def test_efficiency_curve_interpolates_in_log_size_and_clamps():
    curve = EfficiencyCurve(anchors=((1.0, 0.5), (100.0, 0.9)))
    assert curve(0.01) == 0.5 and curve(1e6) == 0.9
    assert curve(10.0) == pytest.approx(0.7)  # halfway in log10


def test_roofline_of_a_big_gemm_is_compute_bound_at_the_calculon_efficiency():
    k = kernel("gemm", {"b": 1, "m": 8192, "n": 8192, "k": 8192}, "bf16")
    terms = RooflineKernelCost().terms(k, A100)
    flops = 2.0 * 8192**3  # 1100 GFLOP: beyond the last anchor (128 GFLOP, 0.95)
    assert terms.bound == "compute"
    assert terms.time_s == pytest.approx(flops / (312e12 * 0.95), rel=1e-12)


def test_roofline_of_an_elementwise_op_is_memory_bound():
    k = kernel("elementwise", {"numel": 2**28, "fn": "add"}, "bf16")
    terms = RooflineKernelCost().terms(k, A100)
    moved = 2**28 * 2 * 3  # two inputs, one output
    assert terms.bound == "memory"
    assert terms.time_s == pytest.approx(moved / (A100.mem_bw_bytes_per_s * ROOFLINE_EFFICIENCY.memory(moved / 1e6)))


def test_roofline_is_scale_invariant():
    fast = doubled(A100)
    cost = RooflineKernelCost()
    for k in (
        kernel("gemm", {"b": 1, "m": 512, "n": 384, "k": 1024}, "bf16"),
        kernel(
            "attention",
            {
                "batch": 2,
                "heads": 8,
                "kv_heads": 8,
                "seq_q": 1024,
                "seq_kv": 1024,
                "head_dim": 64,
                "causal": True,
                "impl": "flash",
            },
            "fp16",
        ),
        kernel("layernorm", {"rows": 4096, "cols": 1024}, "fp32"),
        kernel("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}, "fp32"),
    ):
        assert cost.predict_s([k], fast)[0] * 2 == pytest.approx(cost.predict_s([k], A100)[0], rel=1e-12)


def test_tensor_core_default_follows_the_dtype():
    # one rule (opcast.ops.uses_tensor_cores) for cost and features: test_predict_path_imports checks
    # there is no second definition; here its truth table
    assert uses_tensor_cores("gemm", "bf16") and not uses_tensor_cores("gemm", "fp32")
    assert uses_tensor_cores("gemm", "tf32") and uses_tensor_cores("gemm", "fp32", True)
    assert not uses_tensor_cores("layernorm", "bf16", True)
    assert not uses_tensor_cores("gemm", "bf16", False) and uses_tensor_cores("attention", "fp8")
    assert not uses_tensor_cores("softmax", "tf32")


class _FakeModelSet:
    """Covers gemm fwd only; NaN for n > 4096 (an uncovered corner); counts calls."""

    def __init__(self):
        self.calls = 0
        self.rows = 0

    def covers(self, op, dtype, direction):
        return op == "gemm" and direction == "fwd"

    def predict_s(self, frame, device):
        self.calls += 1
        self.rows += len(frame)
        assert {"op", "dtype", "direction", "tensor_cores", "b", "m", "n", "k"} <= set(frame.columns)
        return np.where(frame["n"] > 4096, np.nan, 1e-3)


def test_composite_labels_learned_and_roofline_and_falls_back_on_nan():
    fake = _FakeModelSet()
    model = KernelCostModel(sources=(LearnedKernelCost(fake, "fake"), RooflineKernelCost()))
    covered = kernel("gemm", {"b": 1, "m": 128, "n": 256, "k": 64}, "bf16")
    corner = kernel("gemm", {"b": 1, "m": 128, "n": 8192, "k": 64}, "bf16")
    norm = kernel("rmsnorm", {"rows": 128, "cols": 64}, "bf16")
    table = model.lookup([covered, corner, norm, covered], A100)
    assert table[covered] == (1e-3, LEARNED)
    assert table[corner][1] == ROOFLINE and table[norm][1] == ROOFLINE
    assert fake.calls == 1 and fake.rows == 2  # unique kernels only, one batch


def test_cache_prices_each_kernel_once_per_device():
    fake = _FakeModelSet()
    model = KernelCostModel(sources=(LearnedKernelCost(fake, "fake"), RooflineKernelCost()))
    k = kernel("gemm", {"b": 1, "m": 128, "n": 256, "k": 64}, "bf16")
    for _ in range(5):
        model.time_s(k, A100)
    assert fake.calls == 1
    model.time_s(k, get_device("H100-SXM"))
    assert fake.calls == 2


def test_validated_kernel_names_every_problem():
    with pytest.raises(OpcastError, match=r"missing parameter k.*unknown parameter"):
        validated_kernel("gemm", {"b": 1, "m": 2, "n": 3, "q": 4}, "bf16")
    with pytest.raises(OpcastError, match="collective"):
        validated_kernel("all_reduce", {"bytes": 8, "world_size": 2, "nodes": 1, "gpus_per_node": 2}, "bf16")


class _SilentSource:
    """A buggy last source: it claims every kernel and answers NaN (no time) for all of them."""

    name = "silent"

    def covers(self, k):
        return True

    def predict_s(self, kernels, device):
        return np.full(len(kernels), np.nan)


def test_a_last_source_that_does_not_answer_is_an_internal_error_not_a_user_error():
    """The fallback always answers; when it does not, that is a bug in opcast (a RuntimeError: exit 1,
    "internal error" at the CLI boundary), never an OpcastError blaming the user's input (exit 2)."""
    gemm = kernel("gemm", {"b": 1, "m": 64, "n": 64, "k": 64}, "bf16")
    model = KernelCostModel(sources=(_SilentSource(),))
    with pytest.raises(RuntimeError, match=r"^internal: no kernel-time source could time gemm") as err:
        model.time_s(gemm, A100)
    assert not isinstance(err.value, OpcastError)
    # the same query with the real fallback is answered: the error is the buggy source's, not the input's
    assert KernelCostModel(sources=(RooflineKernelCost(),)).time_s(gemm, A100)[1] == ROOFLINE


def test_missing_models_dir_is_a_one_line_error(tmp_path):
    with pytest.raises(OpcastError) as err:
        load_kernel_cost(tmp_path / "nope")
    assert "\n" not in str(err.value) and "--models" in str(err.value)


def test_without_the_train_package_everything_is_roofline_and_said_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "opcast.train.artifacts", None)  # import fails
    model = load_kernel_cost(None)
    assert [s.name for s in model.sources] == [ROOFLINE]
    assert "cannot be imported" in model.notes[0]
    with pytest.raises(OpcastError, match="cannot be imported"):
        load_kernel_cost("some/dir")


def test_roofline_flag_forces_the_fallback():
    model = load_kernel_cost(None, use_learned=False)
    assert [s.name for s in model.sources] == [ROOFLINE] and "--roofline" in model.notes[0]


class _FakeVectorAndGemm(_FakeModelSet):
    def covers(self, op, dtype, direction):
        return op in ("gemm", "elementwise", "softmax") and direction == "fwd"

    def predict_s(self, frame, device):
        self.calls += 1
        return np.full(len(frame), 1e-3)


def test_uncovered_eager_attention_is_priced_from_its_learned_kernels():
    from opcast.predict.cost import decompose

    att = kernel(
        "attention",
        {
            "batch": 2,
            "heads": 4,
            "kv_heads": 4,
            "seq_q": 256,
            "seq_kv": 256,
            "head_dim": 64,
            "causal": True,
            "impl": "eager",
        },
        "fp32",
    )
    parts = decompose(att)
    assert [p.kind for p, _ in parts] == ["gemm", "elementwise", "elementwise", "softmax", "gemm"]
    assert sum(p.flops() for p, _ in parts if p.kind == "gemm") == att.flops()  # the registry's 4 d per pair
    model = KernelCostModel(sources=(LearnedKernelCost(_FakeVectorAndGemm(), "fake"), RooflineKernelCost()))
    assert model.time_s(att, A100) == (pytest.approx(5e-3), LEARNED)
    # backward parts include softmax bwd, which the fake does not cover: the whole op stays roofline
    bwd = kernel("attention", dict(att.params), "fp32", "bwd")
    assert model.time_s(bwd, A100)[1] == ROOFLINE
    flash = kernel("attention", {**att.param_dict, "impl": "flash"}, "fp32")
    assert decompose(flash) is None and model.time_s(flash, A100)[1] == ROOFLINE


def test_eager_attention_runs_torchs_native_softmax_which_the_default_set_learned():
    """Hugging Face's eager attention calls torch's softmax kernel (impl native): the embedded set
    learned it on NeuSight's GPUs, so an fp32 eager attention there is priced from learned parts,
    not from the roofline of a fused softmax no fp32 source measured."""
    from opcast.predict.cost import decompose, load_kernel_cost

    att = kernel(
        "attention",
        {
            "batch": 4,
            "heads": 20,
            "kv_heads": 20,
            "seq_q": 1024,
            "seq_kv": 1024,
            "head_dim": 64,
            "causal": True,
            "impl": "eager",
        },
        "fp32",
    )
    (softmax,) = [p for p, _ in decompose(att) if p.kind == "softmax"]
    assert softmax.param_dict["impl"] == "native"
    assert load_kernel_cost(None).time_s(att, get_device("V100-PCIe-32GB"))[1] == LEARNED


def test_the_cost_package_is_layered_by_concern_and_re_exports_every_public_name():
    """query <- roofline <- learned <- published <- model: each module imports only the ones before it (no cycle,
    one home per concern), and ``opcast.predict.cost`` re-exports each public name of them once."""
    import ast
    import importlib
    from pathlib import Path

    import opcast.predict.cost as cost

    order = ["query", "roofline", "learned", "published", "model"]
    folder = Path(cost.__file__).parent
    for i, name in enumerate(order):
        tree = ast.parse((folder / f"{name}.py").read_text())
        siblings = {
            n.module.rsplit(".", 1)[1]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("opcast.predict.cost.")
        }
        assert siblings <= set(order[:i]), f"{name} imports {sorted(siblings - set(order[:i]))}"
    defined = {}
    for name in order:
        module = importlib.import_module(f"opcast.predict.cost.{name}")
        tree = ast.parse((folder / f"{name}.py").read_text())
        for node in tree.body:
            targets = (
                [node.name]
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                else [
                    t.id
                    for a in ([node] if isinstance(node, ast.Assign) else [])
                    for tg in a.targets
                    for t in ast.walk(tg)
                    if isinstance(t, ast.Name)
                ]
                + ([node.target.id] if isinstance(node, ast.AnnAssign) else [])
            )
            for target in targets:
                assert target not in defined, f"{target} is defined in both {defined[target]} and {name}"
                defined[target] = name
                if target in cost.__all__:
                    assert getattr(cost, target) is getattr(module, target)
    helpers = {"roof_at_peak"}  # shared between the modules, not part of the package's interface
    assert sorted(cost.__all__) == sorted(n for n in defined if not n.startswith("_") and n not in helpers)


def test_a_one_pass_kernel_without_data_is_the_streaming_kernel_of_its_traffic():
    """The no-data rule: an Apex / TE RMSNorm (impl fused, no half-precision data) is the learned elementwise
    kernel moving as many bytes, with that kernel's launch floor, not the roofline of its traffic."""
    from opcast.predict.cost import decompose

    k = kernel("rmsnorm", {"rows": 32, "cols": 8192, "impl": "fused"}, "bf16", "bwd")
    ((part, n),) = decompose(k)
    assert (part.kind, part.param_dict["fn"], part.direction, part.dtype, n) == (
        "elementwise",
        "mul_scalar",
        "fwd",
        "bf16",
        1,
    )
    assert part.bytes_moved() == pytest.approx(k.bytes_moved(), abs=4)
    model = load_kernel_cost(None)
    t, src = model.time_s(k, A100)
    assert (t, src) == (model.time_s(part, A100)[0], LEARNED)
    assert t > RooflineKernelCost().terms(k, A100).time_s  # a 1 MB kernel takes more than its roofline's 1 us
    # an implementation with data keeps its own predictor: Liger's RMSNorm is learned from Liger's rows
    liger = kernel("rmsnorm", {"rows": 32, "cols": 8192, "impl": "liger"}, "bf16", "bwd")
    assert model.time_s(liger, A100)[0] != t


@pytest.mark.parametrize(("direction", "passes"), [("fwd", 2), ("bwd", 4)])
def test_torchs_native_cross_entropy_without_data_streams_its_two_kernels_traffic(direction, passes):
    """F.cross_entropy is log_softmax (writes the log-probabilities) and nll_loss; backward writes the whole
    gradient of the log-probabilities and log_softmax's backward reads it and the output: 2 and 4 passes over the
    logits where the compulsory (fused) count is 1 and 2. On an H200 the compulsory bytes priced it at 0.45 of
    the measured time. The registry's bytes (the features) stay the compulsory ones."""
    from opcast.ops import NATIVE_EXTRA_PASSES, UNFUSED_PASSES
    from opcast.predict.cost import decompose

    params = {"tokens": 4096, "vocab": 128256}
    native = kernel("cross_entropy", {**params, "impl": "native"}, "bf16", direction)
    fused = kernel("cross_entropy", {**params, "impl": "fused"}, "bf16", direction)
    assert native.bytes_moved() == fused.bytes_moved()
    assert UNFUSED_PASSES["cross_entropy"][direction][0] + NATIVE_EXTRA_PASSES["cross_entropy"][direction] == passes
    ((part, _),) = decompose(native)
    assert part.bytes_moved() == pytest.approx(passes * 2 * 4096 * 128256, rel=1e-4)
    ((fpart, _),) = decompose(fused)
    assert fpart.bytes_moved() == pytest.approx(fused.bytes_moved(), abs=4)
    # the single-kernel native kinds stream their compulsory traffic, as fused does
    norm = kernel("layernorm", {"rows": 4096, "cols": 4096, "impl": "native"}, "bf16", direction)
    ((npart, _),) = decompose(norm)
    assert npart.bytes_moved() == pytest.approx(norm.bytes_moved(), abs=4)


class _FakeMoe(_FakeModelSet):
    """Covers the fused MoE layer (2 ms) and gemm (1 ms); nothing else."""

    def covers(self, op, dtype, direction):
        return op in ("moe", "gemm") and direction == "fwd"

    def predict_s(self, frame, device):
        self.calls += 1
        return np.where(frame["op"] == "moe", 2e-3, 1e-3)


H100 = get_device("H100-SXM")
MOE = {"tokens": 64, "hidden": 1024, "inter": 512, "experts": 16, "topk": 2, "ep": 2}


def test_a_fused_moe_layer_is_learned_where_covered_and_its_grouped_gemms_elsewhere():
    from opcast.predict.cost import decompose

    moe = kernel("moe", MOE, "fp8")
    parts = decompose(moe)
    # each of the 2 ranks routes 32 tokens: 64 pairs over its 8 experts, all busy, 8 rows each
    copy, gemm = ("elementwise", "bf16"), ("gemm", "fp8")  # fp8 GEMMs, bf16 activations
    assert [(p.kind, p.dtype) for p, _ in parts] == [copy, gemm, copy, gemm, copy]  # one silu_and_mul
    assert parts[2][0].param_dict["fn"] == "swiglu"
    gemms = [p.param_dict for p, _ in parts if p.kind == "gemm"]
    cublas = {"impl": "cublas"}
    assert gemms == [{"b": 8, "m": 8, "n": 1024, "k": 1024, **cublas}, {"b": 8, "m": 8, "n": 1024, "k": 512, **cublas}]
    covered = KernelCostModel(sources=(LearnedKernelCost(_FakeMoe(), "fake"), RooflineKernelCost()))
    assert covered.time_s(moe, H100) == (pytest.approx(2e-3), LEARNED)
    # no moe model: the parts, the GEMMs learned and the copies and activation by the roofline
    gemm_only = KernelCostModel(sources=(LearnedKernelCost(_FakeModelSet(), "fake"), RooflineKernelCost()))
    t, label = gemm_only.time_s(moe, H100)
    rest = sum(RooflineKernelCost().predict_s([p], H100)[0] for p, _ in parts if p.kind != "gemm")
    assert label == ROOFLINE and t == pytest.approx(2e-3 + rest)
    # the roofline alone prices the parts too, never a roofline of the fused kernel
    roof = KernelCostModel(sources=(RooflineKernelCost(),))
    assert roof.time_s(moe, H100)[0] == pytest.approx(RooflineKernelCost().predict_s([p for p, _ in parts], H100).sum())


class _FakeMxfp4Moe(_FakeMoe):
    """:class:`_FakeMoe` whose moe predictor was fitted on dtype and W4A16 MXFP4 rows (``weights_code`` 0..1)."""

    def __init__(self):
        super().__init__()
        ranges = {"features": ["weights_code"], "feature_ranges": {"weights_code": [0, 1]}}
        self.meta = {"predictors": {"moe-fwd-half": ranges}}


def test_weight_only_experts_are_learned_only_from_weight_only_rows():
    """gpt-oss's MXFP4 experts (``weights="mxfp4"``): a moe predictor without W4A16 rows does not speak for them,
    so the layer is its grouped GEMMs, each the learned bf16 GEMM scaled to its MXFP4 weights' roofline; one fitted
    on W4A16 rows prices the fused layer. The kernel's own traffic reads its weights at 4.25 bits."""
    from opcast.predict.cost import decompose
    from opcast.predict.weight_only import weight_only_time_s

    dense, mxfp4 = kernel("moe", MOE, "bf16"), kernel("moe", {**MOE, "weights": "mxfp4"}, "bf16")
    busy_weights = 16 // 2 * 3 * 1024 * 512  # every expert of the rank busy, gated
    assert dense.bytes_moved() - mxfp4.bytes_moved() == pytest.approx(busy_weights * (2 - 0.53125))
    parts = decompose(mxfp4)
    no_w4 = KernelCostModel(sources=(LearnedKernelCost(_FakeMoe(), "fake"), RooflineKernelCost()))
    assert no_w4.time_s(dense, H100)[0] == pytest.approx(2e-3)
    t, _ = no_w4.time_s(mxfp4, H100)
    gemms = sum(
        weight_only_time_s(1e-3, p.param_dict, device=H100, dtype="bf16", storage="mxfp4")
        for p, _ in parts
        if p.kind == "gemm"
    )
    rest = sum(RooflineKernelCost().predict_s([p], H100)[0] for p, _ in parts if p.kind != "gemm")
    assert t == pytest.approx(gemms + rest) and gemms < 2e-3
    w4 = KernelCostModel(sources=(LearnedKernelCost(_FakeMxfp4Moe(), "fake"), RooflineKernelCost()))
    assert w4.time_s(mxfp4, H100) == (pytest.approx(2e-3), LEARNED)
    assert w4.parts_time_s([mxfp4], H100) == [pytest.approx(gemms + rest)]  # its parts, though learned whole


class _FakeFamilyMoe(_FakeMoe):
    """:class:`_FakeMoe` that covers vLLM's fused MoE kernels where ``vllm`` (its own group, ``moe-fwd-half_vllm``)."""

    def __init__(self, vllm: bool):
        super().__init__()
        self.vllm = vllm

    def covers(self, op, dtype, direction, impl=None):
        return super().covers(op, dtype, direction) and (impl is None or (self.vllm and impl == "vllm"))


@pytest.mark.parametrize("vllm", [False, True])
def test_a_moe_kernel_family_is_learned_only_by_its_own_group(vllm):
    """vLLM's fused MoE (``impl`` vllm) is learned by its own group (``moe-fwd-half_vllm``) where the set has it; a
    set fitted without vLLM's rows prices it as TensorRT-LLM's layer (the default family's group) and says so in its
    notes. TensorRT-LLM's stays learned by the plain group either way."""
    trtllm, vllm_moe = kernel("moe", MOE, "bf16"), kernel("moe", {**MOE, "impl": "vllm"}, "bf16")
    assert trtllm.param_dict["impl"] == "trtllm" and trtllm.flops() == vllm_moe.flops()
    learned = LearnedKernelCost(_FakeFamilyMoe(vllm), "fake")
    own = "moe-fwd-half_vllm" if vllm else "moe-fwd-half"
    assert (learned.group_of(trtllm), learned.group_of(vllm_moe)) == ("moe-fwd-half", own)
    model = KernelCostModel(sources=(learned, RooflineKernelCost()))
    assert model.time_s(trtllm, H100) == (pytest.approx(2e-3), LEARNED)
    assert model.time_s(vllm_moe, H100) == (pytest.approx(2e-3), LEARNED)
    noted = [n for n in learned.range.notes if "no data of the vllm kernel family" in n]
    assert len(noted) == (0 if vllm else 1)
    assert noted == [] or noted[0] == (
        "moe bf16 fwd: the learned model has no data of the vllm kernel family; those layers are priced as the "
        "trtllm family"
    )


def test_a_moe_layer_no_family_covers_is_its_grouped_gemms():
    """A set with no moe group at all (neither the family's nor the default's) leaves the layer to its parts."""
    from opcast.predict.cost import decompose

    marlin = kernel("moe", {**MOE, "impl": "marlin"}, "bf16")
    model = KernelCostModel(sources=(LearnedKernelCost(_FakeNoMoe(), "fake"), RooflineKernelCost()))
    t, label = model.time_s(marlin, H100)
    parts = decompose(marlin)
    rest = sum(RooflineKernelCost().predict_s([p], H100)[0] for p, _ in parts if p.kind != "gemm")
    assert t == pytest.approx(2 * 1e-3 + rest) and label != LEARNED


class _FakeNoMoe(_FakeMoe):
    """:class:`_FakeMoe` without any moe group (GEMMs only)."""

    def covers(self, op, dtype, direction, impl=None):
        return op != "moe" and super().covers(op, dtype, direction)


class _FakeGroups(_FakeModelSet):
    """Answers by group key as a fitted set does (:func:`opcast.train.features.group_key_array`): 2 ms for the rows
    of its groups, NaN for the rows of a group it lacks."""

    def __init__(self, groups: tuple[str, ...]):
        super().__init__()
        self.groups = groups

    def covers(self, op, dtype, direction, impl=None):
        from opcast.train.features import dtype_class, group_key

        return group_key(op, direction, dtype_class(op, dtype, None), impl) in self.groups

    def predict_s(self, frame, device):
        from opcast.train.features import group_key_array

        self.calls += 1
        return np.array([2e-3 if k in self.groups else np.nan for k in group_key_array(frame).tolist()])


@pytest.mark.parametrize(
    ("kind", "params", "dtype", "default"),
    [
        ("moe", {**MOE, "impl": "vllm"}, "bf16", "moe-fwd-half"),
        ("gemm", {"m": 64, "n": 64, "k": 64, "impl": "vllm"}, "fp8", "gemm-fwd-fp8"),
    ],
)
def test_a_family_the_set_lacks_is_asked_as_the_default_familys_group(kind, params, dtype, default):
    """A kernel of a family the set has no group of (vLLM's fused MoE, vLLM's fp8 GEMM) is priced by the default
    family's group, learned: its query names the default family (it had kept its own, whose group no predictor held,
    so the answer was NaN and the roofline priced every vLLM MoE layer of a set fitted without vLLM's rows). A set
    with the family's group prices it from that group, and says so (:meth:`KernelCostModel.family_of`)."""
    k = kernel(kind, params, dtype)
    lacking = KernelCostModel(sources=(LearnedKernelCost(_FakeGroups((default,)), "fake"), RooflineKernelCost()))
    assert lacking.time_s(k, H100) == (pytest.approx(2e-3), LEARNED) and lacking.family_of(k) is None
    own = (default, f"{default}_vllm")
    having = KernelCostModel(sources=(LearnedKernelCost(_FakeGroups(own), "fake"), RooflineKernelCost()))
    assert having.time_s(k, H100) == (pytest.approx(2e-3), LEARNED) and having.family_of(k) == "vllm"
    none = KernelCostModel(
        sources=(LearnedKernelCost(_FakeGroups(("rmsnorm-fwd-half",)), "fake"), RooflineKernelCost())
    )
    assert none.family_of(k) is None
