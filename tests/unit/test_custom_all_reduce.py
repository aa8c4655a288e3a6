"""Serving engines' custom all-reduce: the AIConfigurator replay of ``custom_allreduce_perf``, its
per-cluster laws (``all_reduce_custom``; TensorRT-LLM's own, ``all_reduce_trtllm``), the engine rules and their use
by inference (never training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from opcast.collect.replay import aiconfigurator as aic
from opcast.hardware import get_device
from opcast.predict import comm as pc
from opcast.predict.comm import AlphaBetaCollectives, Collective, CollectiveCostModel, Group
from opcast.predict.comm_learned import LearnedCollectives
from opcast.predict.serve.engine import CUSTOM_ALL_REDUCE_RULES, tp_all_reduce_kind
from opcast.train import collectives as tc

from helpers.scripts import load_script

GENERATOR = Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "make_aiconfigurator_fixture.py"
MIB = 1024 * 1024
A100_40 = get_device("A100-SXM4-40GB")
NODE8 = Group(8, 1, 8)


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory) -> Path:
    module = load_script(GENERATOR, register=False)
    module.HERE = tmp_path_factory.mktemp("aic")
    module.main()
    return module.HERE


# --------------------------------------------------------------------------- replay


def test_replay_keeps_the_graph_lane_under_8_mib_and_counts_the_rest(fixture_root):
    result = aic.replay(fixture_root, tables=["custom_allreduce_perf"])
    rows = pd.DataFrame(result.rows)
    rows = rows[rows.backend == aic.CUSTOM_BACKEND]  # the shared family (TensorRT-LLM's own: the next test)
    src = pd.concat(
        [
            pq.read_table(p).to_pandas().assign(pfw=p.parts[-3])
            for p in sorted(fixture_root.glob("*/comm/*/*/custom_allreduce_perf.parquet"))
        ]
    )
    nbytes = src.message_size * src.allreduce_dtype.map({"bfloat16": 2, "float32": 4})
    graph = ~src.kernel_source.str.endswith("_eager")
    keep = src[graph & (src.allreduce_dtype == "bfloat16") & (nbytes < aic.CUSTOM_MAX_BYTES)]
    expected = {(2 * e, g) for e, g in zip(keep.message_size, keep.num_gpus)}  # one row per configuration
    assert len(rows) == len(expected)
    assert set(zip(rows.bytes, rows.world_size)) == expected
    assert (rows.op == "all_reduce").all() and (rows.dtype == "bf16").all() and rows.impl.isna().all()
    assert (rows.nodes == 1).all() and (rows.cluster == "dgx-h100").all()
    assert len(rows) + sum(result.skipped.values()) == len(src)
    s = result.skipped
    assert s[next(k for k in s if "eager lane" in k)] == int((~graph).sum())
    assert s[next(k for k in s if "8 MiB or more" in k)] == int(
        (graph & (src.allreduce_dtype == "bfloat16") & (nbytes >= aic.CUSTOM_MAX_BYTES)).sum()
    )
    assert s[next(k for k in s if "dtype float32" in k)] == int((src.allreduce_dtype == "float32").sum())
    # vLLM's rows win over TRT-LLM's measurement of the same configuration (framework precedence)
    shared = rows[(rows.bytes == 2 * 4096) & (rows.world_size == 8)].iloc[0]
    assert shared.kernel_name == "vllm 0.24.0: vLLM_custom_graph"
    graph8 = src[(src.pfw == "vllm") & graph & (src.num_gpus == 8) & (src.message_size == 4096)]
    assert shared.time_s_median == pytest.approx(graph8.latency.iloc[0] / 1e3)


def test_replay_keeps_tensorrt_llms_rows_of_every_size_as_a_family_of_their_own(fixture_root):
    from opcast.collect.replay.common import normalise

    result = aic.replay(fixture_root, tables=["custom_allreduce_perf"])
    rows = pd.DataFrame(result.rows)
    own = rows[rows.backend == "trtllm"]
    src = pq.read_table(next(fixture_root.glob("*/comm/trtllm/*/custom_allreduce_perf.parquet"))).to_pandas()
    assert len(own) == len(src)  # every size, the 16 MiB one included
    assert set(zip(own.bytes, own.world_size)) == {(2 * e, g) for e, g in zip(src.message_size, src.num_gpus)}
    assert (own.impl == "trtllm").all() and (own.op == "all_reduce").all() and (own.dtype == "bf16").all()
    big = own[own.bytes == 16 * MIB].iloc[0]
    assert big.time_s_median == pytest.approx(src[src.message_size == 8 << 20].latency.iloc[0] / 1e3)
    assert big.kernel_name == "trtllm 1.3.0rc20: TRTLLM"
    # the shared family still holds vLLM's row where both measured; the two are different points, both kept
    kept, skipped = normalise(result, source="aiconfigurator", run_id="t", opcast_version="0")
    assert len(kept) == len(rows) and "duplicate" not in skipped
    ids = {r["backend"]: r["point_id"] for r in kept if r["bytes"] == 8192 and r["world_size"] == 8}
    assert set(ids) == {"custom", "trtllm"} and ids["custom"] != ids["trtllm"]


# --------------------------------------------------------------------------- the law


def _rows(cluster: str = "dgx-a100") -> pd.DataFrame:
    """Hand-made rows: a custom all-reduce (5 us + steps x 0.1 us + bus volume / 150 GB/s) and NCCL's
    (20 us + bus volume / 200 GB/s) on one node of 2 and 8 GPUs."""
    out = []
    for g in (2, 8):
        for nbytes in (2**k for k in range(10, 24)):
            vol = 2 * (g - 1) / g * nbytes
            out.append(
                dict(op="all_reduce", backend="custom", bytes=nbytes, world_size=g, nodes=1, gpus_per_node=g,
                     time_s_median=5e-6 + 2 * (g - 1) * 0.1e-6 + vol / 150e9, cluster=cluster)
            )  # fmt: skip
            out.append(
                dict(op="all_reduce", backend="nccl", bytes=nbytes, world_size=g, nodes=1, gpus_per_node=g,
                     time_s_median=20e-6 + vol / 200e9, cluster=cluster)
            )  # fmt: skip
    return pd.DataFrame(out)


def test_the_custom_law_is_fitted_apart_from_nccls_with_a_held_out_report():
    models = tc.fit_collectives(_rows())
    assert models is not None
    custom, nccl = models.law("dgx-a100", tc.CUSTOM_ALL_REDUCE), models.law("dgx-a100", "all_reduce")
    assert custom is not None and nccl is not None
    assert custom.base_s == pytest.approx(5e-6, rel=0.02)
    assert dict(custom.intra_bw_bytes_per_s)[8] == pytest.approx(150e9, rel=0.02)
    assert nccl.base_s == pytest.approx(20e-6, rel=0.02)
    assert custom.time_s(32768, 8, 1, 8) < nccl.time_s(32768, 8, 1, 8)
    assert not custom.covers(2, 8)  # one node only: never a multi-node call
    held = {(r["kind"], r["split"]) for r in models.held_out}
    assert (tc.CUSTOM_ALL_REDUCE, "sizes") in held and ("all_reduce", "sizes") in held
    # the kind predict asks for is the kind train fits
    assert pc.CUSTOM_ALL_REDUCE == tc.CUSTOM_ALL_REDUCE


def test_tensorrt_llms_rows_fit_a_law_of_their_own():
    rows = _rows()
    trt = rows[rows.backend == "custom"].assign(backend="trtllm", time_s_median=lambda d: d.time_s_median * 0.5)
    models = tc.fit_collectives(pd.concat([rows, trt], ignore_index=True))
    own, custom = models.law("dgx-a100", tc.TRTLLM_ALL_REDUCE), models.law("dgx-a100", tc.CUSTOM_ALL_REDUCE)
    assert own is not None and custom is not None
    assert own.time_s(65536, 8, 1, 8) == pytest.approx(0.5 * custom.time_s(65536, 8, 1, 8), rel=0.05)
    assert not own.covers(2, 8)  # one node only
    assert pc.TRTLLM_ALL_REDUCE == tc.TRTLLM_ALL_REDUCE and set(tc.ENGINE_KINDS) == pc.ENGINE_ALL_REDUCES
    assert tc.op_kind(tc.TRTLLM_ALL_REDUCE) == "all_reduce"


def test_custom_laws_round_trip_collectives_json(tmp_path):
    from opcast.train.artifacts import check_collectives

    models = tc.fit_collectives(_rows())
    data = json.loads(json.dumps(tc.models_to_dict(models)))
    data["set_meta_sha256"] = data["sha256"] = "0" * 64
    check_collectives(data)  # the loader's validation accepts the new kind
    back = tc.models_from_dict(data)
    law = back.law("dgx-a100", tc.CUSTOM_ALL_REDUCE)
    assert law.time_s(65536, 8, 1, 8) == pytest.approx(
        models.law("dgx-a100", tc.CUSTOM_ALL_REDUCE).time_s(65536, 8, 1, 8)
    )


# --------------------------------------------------------------------------- the engine rule


def test_vllm_tp8_on_nvlink_small_message_is_custom_16_mib_is_nccl():
    assert tp_all_reduce_kind("vllm", 200 * 8192 * 2, NODE8, A100_40) == pc.CUSTOM_ALL_REDUCE
    assert tp_all_reduce_kind("vllm", 16 * MIB, NODE8, A100_40) == "all_reduce"
    assert tp_all_reduce_kind("vllm", 8 * MIB, NODE8, A100_40) == "all_reduce"  # strictly below max_size
    assert tp_all_reduce_kind("vllm", 8 * MIB - 16, NODE8, A100_40) == pc.CUSTOM_ALL_REDUCE
    assert tp_all_reduce_kind("sglang", 65536, NODE8, A100_40) == pc.CUSTOM_ALL_REDUCE


@pytest.mark.parametrize(
    ("engine", "nbytes", "group", "device"),
    [
        ("vllm", 65536, Group(16, 2, 8), "A100-SXM4-40GB"),  # spans nodes
        ("vllm", 65536, Group(3, 1, 3), "A100-SXM4-40GB"),  # unsupported world size
        ("vllm", 65536, Group(4, 1, 4), "L40S"),  # 4 PCIe-only GPUs
        ("vllm", 65544, NODE8, "A100-SXM4-40GB"),  # not a multiple of 16 bytes
        ("trtllm", 65536, Group(16, 2, 8), "A100-SXM4-40GB"),  # spans nodes: NCCL
        ("none", 65536, NODE8, "A100-SXM4-40GB"),  # no serving engine
    ],
)
def test_nccl_where_the_engine_would_not_run_its_kernel(engine, nbytes, group, device):
    assert tp_all_reduce_kind(engine, nbytes, group, get_device(device)) == "all_reduce"


def test_two_pcie_gpus_may_run_it():
    assert tp_all_reduce_kind("vllm", 65536, Group(2, 1, 2), get_device("L40S")) == pc.CUSTOM_ALL_REDUCE
    assert set(CUSTOM_ALL_REDUCE_RULES) == {"vllm", "sglang", "trtllm"}


@pytest.mark.parametrize(
    ("nbytes", "group", "device"),
    [
        (65536, NODE8, "A100-SXM4-40GB"),
        (16 * MIB, NODE8, "B200"),  # no size cap: AUTO's own choice at every size is in its law
        (65544, Group(3, 1, 3), "H100-SXM"),  # no world-size or alignment gate
        (65536, Group(4, 1, 4), "L40S"),  # PCIe: its measured AUTO calls there say what it does
    ],
)
def test_tensorrt_llm_runs_its_own_all_reduce_on_one_node(nbytes, group, device):
    assert tp_all_reduce_kind("trtllm", nbytes, group, get_device(device)) == pc.TRTLLM_ALL_REDUCE


# --------------------------------------------------------------------------- pricing


def _comms() -> CollectiveCostModel:
    return CollectiveCostModel(
        sources=(LearnedCollectives(tc.fit_collectives(_rows()), "test"), AlphaBetaCollectives())
    )


def test_the_law_prices_a_device_with_the_same_node_links_and_says_so():
    comms = _comms()
    t, label = comms.time_s(Collective(pc.CUSTOM_ALL_REDUCE, 65536, NODE8), A100_40)
    law = tc.fit_collectives(_rows()).law("dgx-a100", tc.CUSTOM_ALL_REDUCE)
    assert t == pytest.approx(law.time_s(65536, 8, 1, 8))
    assert label == "learned/dgx-a100/custom/intra-node (A100-SXM4-40GB: same node links)"
    # the cluster's own device (its GPU on its links): no note
    from opcast.predict.comm_learned import cluster_device

    own = get_device(cluster_device("dgx-a100"))
    _, label = comms.time_s(Collective(pc.CUSTOM_ALL_REDUCE, 65536, NODE8), own)
    assert label == "learned/dgx-a100/custom/intra-node"


def test_without_a_law_it_is_priced_as_nccl_and_labelled():
    comms = CollectiveCostModel()
    h100 = get_device("H100-SXM")
    t, label = comms.time_s(Collective(pc.CUSTOM_ALL_REDUCE, 65536, NODE8), h100)
    t_nccl, nccl_label = comms.time_s(Collective("all_reduce", 65536, NODE8), h100)
    assert t == t_nccl and label == f"{nccl_label} ({pc.NCCL_FALLBACK})"
    # other node links (Hopper) are not the A100 law's
    t, label = _comms().time_s(Collective(pc.CUSTOM_ALL_REDUCE, 65536, NODE8), h100)
    assert pc.NCCL_FALLBACK in label


def _infer(engine: str, comms: CollectiveCostModel):
    from opcast.archs import load_arch
    from opcast.predict.inference import predict_infer
    from opcast.predict.parallel import InferConfig

    cfg = InferConfig(tp=8, batch=32, prompt_len=128, gen_len=8, engine=engine)
    return predict_infer(load_arch("llama3-70b"), A100_40, cfg, comms=comms)


def test_inference_uses_the_custom_law_under_vllm_and_nccl_without_an_engine():
    vllm, none = _infer("vllm", _comms()), _infer("none", _comms())
    calls = vllm.cost_sources["tp_all_reduce"]["decode_step_calls"]
    assert any(k.startswith(f"{pc.CUSTOM_ALL_REDUCE}: learned/dgx-a100/custom") for k in calls)
    assert not any(k.startswith(pc.CUSTOM_ALL_REDUCE) for k in none.cost_sources["tp_all_reduce"]["decode_step_calls"])
    assert vllm.breakdown_s["decode_step"]["tp_comm"] < none.breakdown_s["decode_step"]["tp_comm"]
    # the engine's compute differs only by its one-kernel rope (opcast.predict.inference.ENGINE_KERNELS)
    assert vllm.breakdown_s["decode_step"]["compute"] < none.breakdown_s["decode_step"]["compute"]
    assert "custom_all_reduce.py" in vllm.cost_sources["tp_all_reduce"]["rule"]


def _trt_comms() -> CollectiveCostModel:
    rows = _rows()
    trt = rows[rows.backend == "custom"].assign(backend="trtllm", time_s_median=lambda d: d.time_s_median * 0.5)
    models = tc.fit_collectives(pd.concat([rows, trt], ignore_index=True))
    return CollectiveCostModel(sources=(LearnedCollectives(models, "test"), AlphaBetaCollectives()))


def test_inference_under_tensorrt_llm_uses_its_own_law_or_nccl_and_says_which():
    trt = _infer("trtllm", _trt_comms())
    calls = trt.cost_sources["tp_all_reduce"]["decode_step_calls"]
    reduces = [k for k in calls if "all_reduce" in k]
    assert reduces and all(k.startswith(f"{pc.TRTLLM_ALL_REDUCE}: learned/dgx-a100/trtllm") for k in reduces)
    assert "allreduceOp.cpp" in trt.cost_sources["tp_all_reduce"]["rule"]
    none = _infer("none", _trt_comms())
    assert trt.breakdown_s["decode_step"]["tp_comm"] < none.breakdown_s["decode_step"]["tp_comm"]
    # a set without TensorRT-LLM's law: its calls are priced as NCCL's and labelled so
    fallback = _infer("trtllm", _comms()).cost_sources["tp_all_reduce"]["decode_step_calls"]
    assert all(pc.NCCL_FALLBACK in k for k in fallback if k.startswith(pc.TRTLLM_ALL_REDUCE))


def test_training_never_asks_for_the_custom_all_reduce():
    from opcast.archs import load_arch
    from opcast.predict.training import predict_train

    asked: list[str] = []

    class Recording(CollectiveCostModel):
        def time_s(self, call, device):
            asked.append(call.kind)
            return super().time_s(call, device)

    from opcast.predict.parallel import TrainConfig

    predict_train(load_arch("llama3-8b"), A100_40, TrainConfig(tp=8), comms=Recording(sources=_comms().sources))
    assert "all_reduce" in asked and not pc.ENGINE_ALL_REDUCES & set(asked)


def test_console_script_reports_the_choice():
    args = ["predict", "infer", "--arch", "llama3-70b", "--gpu", "A100-SXM4-40GB", "--tp", "8", "--batch", "16"]
    args += ["--prompt-len", "128", "--gen-len", "4", "--json"]
    out = {}
    for engine in ("vllm", "none"):
        proc = subprocess.run(
            [sys.executable, "-m", "opcast", *args, "--engine", engine], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        out[engine] = json.loads(proc.stdout)["cost_sources"]["tp_all_reduce"]
    vllm_calls = out["vllm"]["decode_step_calls"]
    # the default model set has no custom law yet for this GPU's links: the call is the custom kind, priced as NCCL
    assert any(k.startswith(pc.CUSTOM_ALL_REDUCE) for k in vllm_calls)
    assert all(pc.NCCL_FALLBACK in k or "learned/" in k for k in vllm_calls if k.startswith(pc.CUSTOM_ALL_REDUCE))
    assert not any(k.startswith(pc.CUSTOM_ALL_REDUCE) for k in out["none"]["decode_step_calls"])
    assert out["none"]["rule"] == "NCCL: no serving engine"


def test_numbers_are_finite():
    assert np.isfinite(_infer("vllm", _comms()).tpot_s)
