"""The configuration search on small spaces, against brute force: it returns exactly the feasible
set with run_train's own figures (bit for bit), counts every pruned configuration under the first
documented reason, and ranks by the objective."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from opcast.archs import arch_from_dict, load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict import search as S
from opcast.predict.comm import CollectiveCostModel
from opcast.predict.cost import roofline_only
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train

A100 = get_device("A100-SXM4-80GB")
H100 = get_device("H100-SXM")

_BASE = dict(
    norm="rmsnorm",
    activation="silu",
    gated_mlp=True,
    position="rope",
    tied_embeddings=False,
    linear_bias=False,
    parallel_residual=False,
    source="test",
)
TINY_MOE = arch_from_dict(
    dict(
        _BASE,
        name="tiny-moe",
        family="mixtral",
        n_layers=4,
        hidden=512,
        n_heads=8,
        n_kv_heads=2,
        head_dim=64,
        ffn_hidden=1024,
        vocab=1000,
        max_seq=4096,
        n_experts=4,
        experts_top_k=2,
    ),
    "test",
)
TINY_GPT = arch_from_dict(
    dict(
        name="tiny-gpt",
        family="gpt3",
        n_layers=6,
        hidden=768,
        n_heads=12,
        n_kv_heads=12,
        head_dim=64,
        ffn_hidden=3072,
        vocab=5000,
        max_seq=2048,
        norm="layernorm",
        activation="gelu",
        gated_mlp=False,
        position="learned",
        tied_embeddings=True,
        linear_bias=True,
        parallel_residual=False,
        source="test",
    ),
    "test",
)


def _key(tp, pp, cp, ep, sp, zero, mb, rc, v):
    return (tp, pp, cp, ep, sp, zero, mb, rc, v)


def _first_reason(arch, space, nodes, g, tp, pp, cp, ep, sp, zero, mb, rc, sched, v) -> str | None:
    """The documented check order (search.REASONS), one configuration at a time, without memory."""
    L, seq = arch.n_layers, space.seq
    dp = nodes * g // (tp * pp * cp)
    if space.max_tp is not None and tp > space.max_tp:
        return "max_tp"
    if space.tp_within_node and g % tp:
        return "tp_within_node"
    if tp not in arch.tp_choices():
        return "tp_arch"
    part = space.pp_partition  # Megatron-LM's accounting counts the embedding and the loss as a layer each
    total = L + ("embedding" in part) + ("loss" in part) if part.startswith("megatron") else L
    if pp > L or total % pp:
        return "pp_layers"
    if cp > 1 and seq % (2 * cp):
        return "cp_seq"
    if space.aligned_groups and not all(g % n == 0 or n % g == 0 for n in (tp, tp * cp, nodes * g // pp)):
        return "node_straddle"
    if ep > 1 and (dp * cp) % ep:
        return "ep_dp"
    if sp and tp == 1:
        return "sp_tp1"
    if sp and (seq // cp) % tp:
        return "sp_seq"
    if zero == 3 and pp > 1:
        return "zero3_pp"
    return "later"


def _brute(arch, device, space):
    """Every configuration of the space through predict_train: (feasible dict, expected reason counts)."""
    ((nodes, g),) = S._check_space(arch, device, space)
    world = nodes * g
    limit = space.max_mem_bytes or device.mem_bytes
    kernels, comms = roofline_only(), CollectiveCostModel()
    feasible, reasons = {}, Counter()
    for tp in S._divisors(world):
        for pp in S._divisors(world // tp):
            for cp in S._divisors(world // (tp * pp)):
                dp = world // (tp * pp * cp)
                for ep in S._divisors(arch.n_experts):
                    for sp in (False, True):
                        for zero in range(4):
                            for mb in S._divisors(space.global_batch):
                                for rc in space.fixed.get("recompute", ("none", "selective", "full")):
                                    for sched, v in S._schedules(arch, {}, space.pp_partition):
                                        cfg = TrainConfig(
                                            tp=tp,
                                            pp=pp,
                                            dp=dp,
                                            cp=cp,
                                            ep=ep,
                                            sp=sp,
                                            micro_batch=mb,
                                            global_batch=space.global_batch,
                                            seq=space.seq,
                                            recompute=rc,
                                            zero=zero,
                                            schedule=sched,
                                            virtual_stages=v,
                                            overlap_grad_reduce=space.overlap_grad_reduce,
                                            moe_dispatcher=space.moe_dispatcher,
                                            framework=space.framework,
                                            pp_partition=space.pp_partition,
                                            # the overlaps where a configuration can run them, as Megatron-LM
                                            overlap_param_gather=space.overlap_param_gather and zero in (1, 2),
                                            tp_comm_overlap=space.tp_comm_overlap and sp,
                                            overlap_p2p_comm=space.overlap_p2p_comm and sched == "interleaved",
                                        )
                                        r = predict_train(
                                            arch,
                                            device,
                                            cfg,
                                            nodes=nodes,
                                            gpus_per_node=g,
                                            kernels=kernels,
                                            comms=comms,
                                            details=False,
                                        )
                                        early = _first_reason(
                                            arch, space, nodes, g, tp, pp, cp, ep, sp, zero, mb, rc, sched, v
                                        )
                                        if early != "later":
                                            if early not in (
                                                "max_tp",
                                                "tp_within_node",
                                                "node_straddle",
                                                "pp_layers",  # the search tries even splits only
                                            ):  # search's own
                                                assert not r.feasible, (early, cfg)
                                            reasons[early] += 1
                                        elif r.layout is None:
                                            reasons["validate"] += 1  # the late reasons: batch, interleaving
                                        elif r.worst_memory.total_bytes > limit:
                                            reasons["memory"] += 1
                                        else:
                                            feasible[_key(tp, pp, cp, ep, sp, zero, mb, rc, v)] = (
                                                r.iteration_time_s,
                                                r.worst_memory.total_bytes,
                                                r.mfu,
                                            )
    return feasible, reasons


MOE_MEGATRON = dict(gpus=8, gpus_per_node=4, global_batch=8, seq=1024, max_tp=4, framework="megatron")
"""Two 4-GPU nodes of the tiny MoE under Megatron's kernels and memory."""


@pytest.mark.parametrize(
    "arch, device, space",
    [
        # MoE with expert parallelism, GQA, rope, two 4-GPU nodes (pipeline sends and DP groups cross nodes)
        (TINY_MOE, A100, S.SearchSpace(gpus=8, gpus_per_node=4, global_batch=8, seq=1024, max_tp=4)),
        # the same with the flex dispatcher: expert groups over both nodes send one copy of a token per node
        (
            TINY_MOE,
            A100,
            S.SearchSpace(gpus=8, gpus_per_node=4, global_batch=8, seq=1024, max_tp=4, moe_dispatcher="flex"),
        ),
        # dropout, learned positions, a tied embedding split over stages; a sequence only some cp and tp
        # divide, tp = 8 that does not divide the 12 heads; a tight limit prunes on memory
        (
            TINY_GPT,
            H100,
            S.SearchSpace(gpus=8, global_batch=8, seq=1020, overlap_grad_reduce=False, max_mem_bytes=0.5 * 2**30),
        ),
        # Megatron's kernels (one rope and one SwiGLU kernel) and its fp32 main_grad (memory, reduce-scatter), with
        # its overlaps: TE's userbuffers under sequence parallelism, sends behind chunks, the param gather
        (
            TINY_MOE,
            A100,
            S.SearchSpace(**MOE_MEGATRON, tp_comm_overlap=True, overlap_p2p_comm=True, overlap_param_gather=True),
        ),
        # Megatron-Core's recompute modules in --fix: the MoE block's activation and pre-MLP norm, its whole MoE layer
        (
            TINY_MOE,
            A100,
            S.SearchSpace(
                **MOE_MEGATRON, fixed=S.parse_fix(["recompute=none,selective:layernorm+moe_act,selective:moe,full"])
            ),
        ),
        # Megatron-LM's split counting the embedding and the loss: 6 + 2 layers, uneven stages (pp 4: 1, 2, 2, 1),
        # a tied embedding on the first and last stage, interleaving by the 8
        (
            TINY_GPT,
            H100,
            S.SearchSpace(
                gpus=8, global_batch=8, seq=1024, pp_partition="megatron:embedding,loss", framework="megatron"
            ),
        ),
        # llm-foundry: its attention kernel, and under ZeRO-3 torch FSDP's flat-gradient kernels and fp32 reduce;
        # neox: DeepSpeed's all-reduce for ZeRO-1/2
        (TINY_GPT, H100, S.SearchSpace(gpus=4, global_batch=8, seq=1024, framework="foundry")),
        (TINY_GPT, H100, S.SearchSpace(gpus=4, global_batch=8, seq=1024, framework="neox")),
    ],
    ids=[
        "moe-2-nodes",
        "moe-2-nodes-flex",
        "gpt-memory-limit",
        "moe-megatron",
        "moe-recompute-modules",
        "gpt-megatron-split",
        "gpt-foundry",
        "gpt-neox",
    ],
)
def test_search_returns_exactly_the_feasible_set_with_run_train_figures(arch, device, space):
    result = S.search(arch, device, space, top=3, workers=1)
    feasible, expected = _brute(arch, device, space)
    got = {
        _key(c.tp, c.pp, c.cp, c.ep, c.sp, c.zero, c.micro_batch, c.recompute, c.virtual_stages): (
            c.iteration_time_s,
            c.memory_bytes,
            c.mfu,
        )
        for c in result.candidates
    }
    assert got == feasible  # same set, and the same floats as run_train and train_memory
    assert result.predicted == len(feasible) > 0
    # every configuration is counted once: predicted or under one reason
    assert result.considered == len(feasible) + sum(expected.values())
    assert result.considered == result.predicted + sum(result.pruned.values())
    for key in (
        "max_tp",
        "tp_within_node",
        "tp_arch",
        "pp_layers",
        "cp_seq",
        "node_straddle",
        "ep_dp",
        "sp_tp1",
        "sp_seq",
        "zero3_pp",
    ):
        assert result.pruned.get(key, 0) == expected.get(key, 0), key
    late = sum(
        n
        for k, n in result.pruned.items()
        if k in ("global_batch", "interleaved_pp1", "interleaved_layers", "interleaved_m", "mem_states", "mem_total")
    )
    assert late == expected["validate"] + expected["memory"]
    assert list(result.pruned) == [k for k in S.REASONS if k in result.pruned]  # in check order
    assert result.max_recheck_rel_diff == 0.0


def test_memory_reasons_and_the_lower_bound():
    space = S.SearchSpace(gpus=4, global_batch=8, seq=2048, max_mem_bytes=0.5 * 2**30)
    result = S.search(TINY_GPT, H100, space, top=0, workers=1)
    assert result.pruned["mem_states"] > 0 and result.pruned["mem_total"] > 0
    assert result.memory_limit_bytes == 0.5 * 2**30
    assert all(c.memory_bytes <= result.memory_limit_bytes for c in result.candidates)
    # a limit above the GPU's memory is capped at it
    big = S.search(TINY_GPT, H100, S.SearchSpace(gpus=1, global_batch=2, seq=512, max_mem_bytes=1e15), top=0)
    assert big.memory_limit_bytes == H100.mem_bytes


@pytest.mark.parametrize("objective", ["throughput", "memory", "cost"])
def test_candidates_are_ranked_by_the_objective(objective):
    space = S.SearchSpace(gpus=8, global_batch=16, seq=1024, objective=objective, fixed={"recompute": ("none", "full")})
    result = S.search(TINY_GPT, H100, space, top=4, workers=1)
    cands = result.candidates
    assert len(cands) > 10
    if objective == "throughput":
        values = [-c.tokens_per_s for c in cands]
    elif objective == "memory":
        values = [c.memory_bytes for c in cands]
    else:
        values = [c.gpu_s_per_token for c in cands]
        assert {c.world_size for c in cands} == {1, 2, 4, 8}  # cost also tries fewer GPUs
        assert cands[0].gpu_s_per_token == pytest.approx(
            cands[0].world_size * cands[0].iteration_time_s / (16 * 1024), rel=1e-12
        )
    assert values == sorted(values)
    # the top K are run_train's full predictions of the first K candidates
    assert [r.iteration_time_s for r in result.top] == [c.iteration_time_s for c in cands[:4]]
    assert all(r.ops for r in result.top)


def test_the_pool_gives_the_same_answer(monkeypatch):
    space = S.SearchSpace(gpus=8, global_batch=16, seq=1024, fixed={"recompute": ("none",), "zero": (0, 1)})
    serial = S.search(TINY_GPT, H100, space, top=2, workers=1)
    monkeypatch.setattr(S, "POOL_MIN_CONFIGS", 0)
    pooled = S.search(TINY_GPT, H100, space, top=2, workers=2)
    assert pooled.workers == 2 and serial.workers == 1
    assert pooled.candidates == serial.candidates


def test_constraints_and_fixed_dimensions():
    base = dict(gpus=16, global_batch=16, seq=1024)
    result = S.search(TINY_GPT, H100, S.SearchSpace(**base, max_tp=2, tp_within_node=True), top=0)
    assert result.pruned["max_tp"] > 0 and all(c.tp <= 2 for c in result.candidates)
    within = S.search(TINY_GPT, H100, S.SearchSpace(**base, gpus_per_node=2, tp_within_node=True), top=0)
    assert within.pruned["tp_within_node"] > 0 and {c.tp for c in within.candidates} <= {1, 2}
    fixed = S.search(
        TINY_GPT,
        H100,
        S.SearchSpace(**base, fixed=S.parse_fix(["tp=2", "sp=on", "recompute=full", "schedule=1f1b"])),
        top=0,
    )
    assert fixed.candidates and {(c.tp, c.sp, c.recompute, c.schedule) for c in fixed.candidates} == {
        (2, True, "full", "1f1b")
    }
    assert fixed.considered < result.considered  # fixing shrinks the space; it does not count as pruning


def test_groups_straddling_nodes_are_skipped_unless_allowed():
    base = dict(gpus=12, gpus_per_node=4, global_batch=12, seq=1024, fixed={"recompute": ("full",), "zero": (1,)})
    aligned = S.search(TINY_GPT, H100, S.SearchSpace(**base), top=0)
    assert aligned.pruned["node_straddle"] > 0
    assert all(4 % n == 0 or n % 4 == 0 for c in aligned.candidates for n in (c.tp, c.tp * c.cp, c.world_size // c.pp))
    loose = S.search(TINY_GPT, H100, S.SearchSpace(**base, aligned_groups=False), top=0)
    assert "node_straddle" not in loose.pruned and any(c.tp == 3 for c in loose.candidates)
    assert loose.predicted > aligned.predicted


def test_parse_fix_lists_every_problem():
    assert S.parse_fix(["tp=2,4", "sp=off", "micro-batch=1", "recompute=FULL"]) == {
        "tp": (2, 4),
        "sp": (False,),
        "micro_batch": (1,),
        "recompute": ("full",),
    }
    with pytest.raises(OpcastError) as err:
        S.parse_fix(["tp=two", "sp=maybe", "colour=red", "zero=5", "nonsense"])
    text = str(err.value)
    for part in ("tp='two'", "sp='maybe'", "colour", "zero=5", "nonsense"):
        assert part in text
    # a dimension fixed twice (micro-batch and micro_batch are one): the second replaced the first silently
    with pytest.raises(OpcastError, match="--fix tp is given twice; list all its values in one --fix tp=V,V"):
        S.parse_fix(["tp=1", "pp=2", "tp=2"])
    with pytest.raises(OpcastError, match="--fix micro_batch is given twice"):
        S.parse_fix(["micro-batch=1", "micro_batch=2"])
    # Megatron-Core's recompute modules, in one spelling (its order; selective:core_attn is selective)
    assert S.parse_fix(["recompute=selective:mlp+layernorm,selective:core_attn,selective:layernorm+mlp"]) == {
        "recompute": ("selective:layernorm+mlp", "selective")
    }
    with pytest.raises(OpcastError, match="'mlpx' is not a recompute module; give selective:MODULE"):
        S.parse_fix(["recompute=selective:mlpx"])


def test_bad_requests_and_empty_results():
    with pytest.raises(OpcastError) as err:
        S.search(
            TINY_GPT,
            H100,
            S.SearchSpace(
                gpus=0,
                global_batch=8,
                seq=1024,
                objective="speed",  # type: ignore[arg-type]
                max_mem_bytes=-1,
            ),
        )
    assert all(p in str(err.value) for p in ("gpus=0", "objective='speed'", "max_mem"))
    with pytest.raises(OpcastError, match="max_seq"):
        S.search(TINY_GPT, H100, S.SearchSpace(gpus=1, global_batch=8, seq=4096))
    # bounds that keep the divisor enumeration short; the bounds themselves are searched
    huge = S.SearchSpace(gpus=S.MAX_SEARCH_GPUS + 1, global_batch=S.MAX_SEARCH_GLOBAL_BATCH + 1, seq=1024)
    problems = S.space_problems(H100, huge)
    assert any("--gpus 2097153 is past the 2,097,152" in p for p in problems)
    assert any("--global-batch 16777217 is past the 16,777,216" in p for p in problems)
    assert not S.space_problems(H100, S.SearchSpace(gpus=S.MAX_SEARCH_GPUS, global_batch=8, seq=1024))
    with pytest.raises(OpcastError, match="whole number"):
        S.search(TINY_GPT, H100, S.SearchSpace(gpus=12, global_batch=8, seq=1024))
    # a --fix value the walk never reaches: dropped without a word beside one it does (tp=2,3 searched tp 2)
    fixed = S.parse_fix(["tp=2,3", "micro_batch=3,4", "virtual_stages=5"])
    with pytest.raises(OpcastError) as err:
        S.search(TINY_GPT, H100, S.SearchSpace(gpus=4, global_batch=8, seq=1024, fixed=fixed), top=0)
    for part in ("--fix tp=3 is never searched", "--fix micro_batch=3 is never", "--fix virtual_stages=5 is never"):
        assert part in str(err.value)
    assert "tp=2" not in str(err.value)
    # each of the top K is a full run_train: --top 100000 re-predicted every feasible one for minutes
    with pytest.raises(OpcastError, match=r"--top 1001 is past the 1,000 .*\(--csv lists every"):
        S.search(TINY_GPT, H100, S.SearchSpace(gpus=4, global_batch=8, seq=1024), top=S.MAX_TOP + 1)
    nothing = S.search(load_arch("llama2-70b"), H100, S.SearchSpace(gpus=2, global_batch=4, seq=4096), top=3)
    assert not nothing.candidates and not nothing.top
    assert nothing.pruned["mem_states"] > 0 and "optimizer states" in nothing.reasons_summary()


def test_the_report_helpers():
    result = S.search(TINY_GPT, H100, S.SearchSpace(gpus=4, global_batch=8, seq=1024), top=2)
    doc = S.search_to_dict(result)
    assert doc["considered"] == doc["predicted"] + doc["pruned_total"]
    assert [t["rank"] for t in doc["top"]] == [1, 2]
    first = doc["top"][0]
    assert first["tokens_per_s"] == result.candidates[0].tokens_per_s
    assert sum(first["breakdown_s"].values()) == pytest.approx(first["iteration_time_s"])
    assert first["main_cost"]["part"] in first["breakdown_s"]
    row = S.candidate_row(result.candidates[0], 1)
    assert row["memory_per_gpu_bytes"] == result.candidates[0].memory_bytes
    assert S.describe_config(result.candidates[0]).startswith(f"tp{result.candidates[0].tp} ")


def test_search_imports_neither_torch_nor_xgboost():
    code = (
        "import sys, opcast.predict.search, opcast.predict.search_cli; "
        "print(sorted(m for m in ('torch', 'xgboost') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_disagreement_with_run_train_is_an_internal_error_not_a_user_error(monkeypatch):
    """Were the search to keep a configuration run_train finds infeasible, that is a bug in opcast:
    RuntimeError (the CLI's exit 1, "internal error"), never an OpcastError blaming the input."""
    from opcast.predict import training
    from opcast.predict.training import TrainResult

    def infeasible(arch, device, cfg, **kw):
        return TrainResult(arch=arch, device=device, config=cfg, feasible=False, reasons=("disagrees",))

    monkeypatch.setattr(training, "predict_train", infeasible)
    with pytest.raises(RuntimeError, match="internal: search kept a configuration run_train finds infeasible") as err:
        S.search(TINY_GPT, H100, S.SearchSpace(gpus=2, global_batch=4, seq=1024), top=1, workers=1)
    assert not isinstance(err.value, OpcastError)


def test_the_search_reuses_the_cost_model_instead_of_mirroring_it():
    """One cost model: search.py imports no private name of another module, needs no type: ignore
    for stand-ins, and defines none of the terms it composes (they live in memory.py and training.py)."""
    import ast
    from pathlib import Path

    source = Path(S.__file__).read_text()
    tree = ast.parse(source)
    private = [
        f"{node.module}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opcast")
        for a in node.names
        if a.name.startswith("_")
    ]
    assert private == []
    assert "type: ignore" not in source
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for term in (
        "train_memory",
        "model_state_bytes",
        "stage_activation_bytes",
        "stage_total_bytes",
        "stage_compute",
        "data_parallel_sync",
        "data_parallel_time",
        "bucketed_s",
        "pipeline_sends",
        "optimizer_numel",
        "compose_iteration",
        "micro_batch_s",
        "_Memory",
        "_Composer",
        "_optimizer_numel",
        "_stage_kinds",
    ):
        assert term not in defined, term


def test_the_cluster_help_of_search_names_its_own_options():
    """search has --gpus, not --nodes: its --cluster help said '--nodes and --gpus-per-node take part of each
    domain', an option search train and search serve refuse."""
    from opcast.predict.options import CLUSTER
    from opcast.predict.search_cli import SEARCH_CLUSTER

    assert "--nodes" in CLUSTER.help
    assert "--nodes" not in SEARCH_CLUSTER.help
    assert "--gpus-per-node takes part of each domain and --gpus at most" in SEARCH_CLUSTER.help
    done = subprocess.run(
        [sys.executable, "-m", "opcast", "search", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0 and "searches 128 GPUs" in done.stdout
