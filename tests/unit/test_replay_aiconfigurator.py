"""The AIConfigurator replay importer (opcast.collect.replay.aiconfigurator) on a synthetic
fixture in the package's layout (tests/fixtures/replay/aiconfigurator, written by its
make_fixture.py), the real package data when aiconfigurator-core is installed, and the catalog
entries of the GPUs it measures."""

from __future__ import annotations

import atexit
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from opcast.clusters import get_cluster
from opcast.collect.replay import aiconfigurator as aic
from opcast.collect.replay.common import MalformedFile, normalise
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.schema import read_dataset, write_parquet

from helpers.scripts import load_script

GENERATOR = Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "make_aiconfigurator_fixture.py"


def _build_fixture(root: Path) -> Path:
    """The synthetic fixture (toy-roofline latencies in the package's layout), written into ``root``
    by the generator, so that nothing in the package's layout is committed beside its data."""
    module = load_script(GENERATOR, register=False)
    module.HERE = root
    module.main()
    return root


FIXTURE = _build_fixture(Path(tempfile.mkdtemp(prefix="opcast-aic-fixture-")))
atexit.register(shutil.rmtree, FIXTURE, ignore_errors=True)
DEVICES = {"h100_sxm": "H100-SXM", "gb200": "GB200"}
NEW_DEVICES = ("GB200", "GB300", "B300", "L40S", "RTX-PRO-6000", "H20", "H800", "MI325X", "MI355X")


def _source(root: Path) -> pd.DataFrame:
    """Every fixture table, one frame, with the path parts as columns (read independently)."""
    frames = []
    for path in sorted(root.glob("*/*/*/*/*.parquet")):
        frame = pq.read_table(path).to_pandas()
        system, _family, framework, version = path.relative_to(root).parts[:4]
        frames.append(frame.assign(system=system, table=path.stem, pfw=framework, pver=version))
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def source() -> pd.DataFrame:
    return _source(FIXTURE)


@pytest.fixture(scope="module")
def replayed():
    result = aic.replay(FIXTURE)
    return result, pd.DataFrame(result.rows)


# --------------------------------------------------------------------------- counts


def _gemm_family(rows: pd.DataFrame) -> pd.Series:
    """The rows replayed a second time as a GEMM kernel family of their own (vLLM's fp8: GEMM_FAMILIES)."""
    return (rows.op == "gemm") & (rows.impl == "vllm")


def _family(rows: pd.DataFrame) -> pd.Series:
    """The rows replayed a second time as a kernel family of their own: vLLM's fp8 GEMMs (GEMM_FAMILIES) and
    TensorRT-LLM's all-reduce (CUSTOM_FAMILIES)."""
    return _gemm_family(rows) | ((rows.op == "all_reduce") & (rows.impl == "trtllm"))


def test_every_source_row_is_kept_or_counted(source, replayed):
    result, rows = replayed
    assert len(rows[~_family(rows)]) + sum(result.skipped.values()) == len(source)
    assert result.files == source.groupby(["system", "table", "pfw", "pver"]).ngroups


def test_gemm_rows_match_pandas(source, replayed):
    _, rows = replayed
    g = source[
        (source.table == "gemm_perf")
        & source.system.isin(list(DEVICES))
        & source.gemm_dtype.isin(["bfloat16", "fp8", "fp8_block", "nvfp4"])
        & ~((source.gemm_dtype == "nvfp4") & (source.system == "h100_sxm"))  # H100 has no fp4 peak
        & (source.latency > 0)
    ]
    expected = {
        (DEVICES[s], m, n, k, {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}[d])
        for s, m, n, k, d in zip(g.system, g.m, g.n, g.k, g.gemm_dtype)
    }
    got = rows[(rows.op == "gemm") & rows.impl.isna()]  # the default family: one row per configuration
    assert len(got) == len(expected)
    assert set(zip(got.device, got.m, got.n, got.k, got.dtype)) == expected
    assert (got.b == 1).all() and (got.direction == "fwd").all() and got.tensor_cores.all()
    # vLLM's fp8 rows once more, as its kernel family (impl vllm), every one of them with its own time
    v = g[(g.pfw == "vllm") & (g.gemm_dtype == "fp8")]
    family = rows[_gemm_family(rows)]
    assert sorted(zip(family.device, family.m, family.n, family.k, family.time_s_median)) == sorted(
        zip(v.system.map(DEVICES), v.m, v.n, v.k, v.latency / 1e3)
    )
    assert len(family) > 0 and (family.dtype == "fp8").all()


def test_attention_rows_match_pandas(source, replayed):
    _, rows = replayed
    a = source[source.table.isin(["context_attention_perf", "generation_attention_perf"])]
    dtype = [
        {("bfloat16", "bfloat16"): "bf16", ("fp8", "fp8"): "fp8"}.get(p) for p in zip(a.attn_dtype, a.kv_cache_dtype)
    ]
    a = a.assign(dtype=dtype)
    a = a[a.dtype.notna() & (a.window_size.fillna(0) == 0)]
    decode = a.table == "generation_attention_perf"
    seq_q = a.isl.where(~decode, 1)
    seq_kv = a.isl.where(~decode, a.step + 1)
    expected = set(zip(a.batch_size, a.num_heads, a.num_key_value_heads, seq_q, seq_kv, a.head_dim, a.dtype))
    got = rows[rows.op == "attention"]
    assert len(got) == len(expected)
    assert set(zip(got.batch, got.heads, got.kv_heads, got.seq_q, got.seq_kv, got.head_dim, got.dtype)) == expected
    assert got.causal.all() and (got.impl == "flash").all()


def test_collective_rows_match_pandas(source, replayed):
    _, rows = replayed
    c = source[(source.table == "nccl_perf") & (source.nccl_dtype == "half")]
    ops = {
        "all_reduce": "all_reduce",
        "all_gather": "all_gather",
        "reduce_scatter": "reduce_scatter",
        "alltoall": "all_to_all",
    }
    expected = {(ops[o], 2 * e, g) for o, e, g in zip(c.op_name, c.message_size, c.num_gpus)}
    got = rows[rows.op.isin(list(ops.values())) & (rows.backend == "nccl")]
    assert len(got) == len(expected)
    assert set(zip(got.op, got.bytes, got.world_size)) == expected
    assert (got.nodes == 1).all() and (got.gpus_per_node == got.world_size).all() and (got.dtype == "fp16").all()
    assert list(got.cluster) == [aic.SYSTEM_CLUSTERS[f.split("/")[0]] for f in got.source_file]


def test_skip_reasons_are_counted(source, replayed):
    result, _ = replayed
    s = result.skipped
    assert not any("fp8_block" in k for k in s)  # every block-scaled fp8 row is kept (H100 and GB200 have fp8)
    assert s["gemm nvfp4: H100-SXM has no peak for it"] == int(
        ((source.gemm_dtype == "nvfp4") & (source.system == "h100_sxm")).sum()
    )
    assert s["gemm int8_wo: integer weight-only GEMM, no opcast dtype"] == int((source.gemm_dtype == "int8_wo").sum())
    assert s["system zz_future: no hardware catalog device for this folder"] == int(
        (source.system == "zz_future").sum()
    )
    moe = source[source.table == "moe_perf"]
    assert s[aic.MOE_FRAMEWORK_REASON.format("sglang")] == int((moe.pfw == "sglang").sum())
    assert not any(k == aic.MOE_FRAMEWORK_REASON.format("vllm") for k in s)
    assert s[aic.MOE_DISTRIBUTION_REASON.format("power_law_1.2")] == int((moe.distribution == "power_law_1.2").sum())
    assert s[aic.MOE_SKIPPED_LANES["moe_torch_flow_min_latency"]] == 1
    assert s["moe int4_wo: no opcast dtype for it"] == int((moe.moe_dtype == "int4_wo").sum()) == 2
    assert not any("w4a16_mxfp4" in k for k in s)  # replayed: bf16 GEMMs over MXFP4 expert weights
    assert s["moe: moe_tp_size does not divide inter_size or moe_ep_size num_experts"] == 1
    assert s["moe: measured again by an older version of the same framework (kept the newest)"] == 2
    custom = source[source.table == "custom_allreduce_perf"]
    assert s[next(k for k in s if k.startswith("custom all-reduce: eager lane"))] == int(
        custom.kernel_source.str.endswith("_eager").sum()
    )
    assert s["collective dtype int8: no opcast dtype (float/half/bfloat16 only)"] == int(
        (source.nccl_dtype == "int8").sum()
    )
    window = s["context attention: sliding window (window_size > 0); the registry's attention has no window"]
    assert window == int((source.window_size > 0).sum())
    mixed = sum(v for k, v in s.items() if "attention over a fp8 KV cache" in k)
    assert mixed == int(((source.attn_dtype == "bfloat16") & (source.kv_cache_dtype == "fp8")).sum())
    assert s["gemm: latency not a positive number"] == int(
        ((source.table == "gemm_perf") & (source.latency <= 0)).sum()
    )


def test_moe_rows_are_one_ranks_fused_layer_balanced_and_newest_first(source, replayed):
    _, rows = replayed
    m = source[
        (source.table == "moe_perf")
        & (source.pfw == "trtllm")
        & (source.distribution == "balanced")
        & source.moe_dtype.isin(["bfloat16", "fp8"])
        & (source.kernel_source != "moe_torch_flow_min_latency")
        & (source.inter_size % source.moe_tp_size == 0)
    ]
    newest = m[m.pver == "1.3.0rc23"]
    expected = {
        (t, 1024 // tp, ep, lane != "moe_torch_flow_nongated", {"bfloat16": "bf16", "fp8": "fp8"}[d])
        for t, tp, ep, lane, d in zip(m.num_tokens, m.moe_tp_size, m.moe_ep_size, m.kernel_source, m.moe_dtype)
    }
    got = rows[(rows.op == "moe") & (rows.weights == "dtype") & (rows.impl == "trtllm")]
    assert len(got) == len(expected) == 24
    assert set(zip(got.tokens, got["inter"], got.ep, got.gated, got.dtype)) == expected
    assert (got.hidden == 4096).all() and (got.experts == 64).all() and (got.topk == 8).all()
    assert set(zip(got.gated, got.fn)) == {(True, "silu"), (False, "relu")}
    redone = got[got.source_file.str.contains("1.3.0rc23")]
    assert sorted(redone.time_s_median) == pytest.approx(sorted(newest.latency / 1e3))
    trtllm = (source.table == "moe_perf") & (source.pfw == "trtllm")
    (w4a16,) = source.latency[trtllm & (source.moe_dtype == "w4a16_mxfp4")]
    (w4a8,) = source.latency[trtllm & (source.moe_dtype == "w4a8_mxfp4_mxfp8")]
    mxfp4 = rows[(rows.op == "moe") & (rows.weights == "mxfp4") & (rows.impl == "trtllm")].sort_values("dtype")
    # MXFP4 experts over bf16 activations (W4A16) and over MXFP8 ones (W4A8: the block-scaled fp8 dtype)
    assert list(zip(mxfp4.dtype, mxfp4.tokens, mxfp4.gated)) == [("bf16", 8, True), ("fp8_block", 8, True)]
    assert mxfp4.time_s_median.tolist() == pytest.approx([w4a16 / 1e3, w4a8 / 1e3])


def test_vllm_moe_rows_are_their_own_family_from_one_release_per_dtype(source, replayed):
    """vLLM's moe rows replay as ``impl`` vllm beside TensorRT-LLM's (the key holds impl, so neither replaces the
    other), those of a Marlin kernel source as ``impl`` marlin, each (system, family, dtype, weights) from the newest
    vLLM release that measured it: 0.24.0's bf16 and MXFP4 rows, 0.19.0's fp8 (0.24.0 measured none); 0.19.0's
    other rows are counted, not filled in."""
    result, rows = replayed
    v = source[(source.table == "moe_perf") & (source.pfw == "vllm") & (source.distribution == "balanced")]
    v = v[v.moe_dtype.isin(["bfloat16", "fp8", "w4a16_mxfp4"])]
    v = v.assign(family=np.where(v.kernel_source.astype(str).str.contains("marlin"), "marlin", "vllm"))
    newest = v.groupby(["family", "moe_dtype"]).pver.transform(lambda s: max(s, key=aic.version_key))
    kept, old = v[v.pver == newest], v[v.pver != newest]
    got = rows[(rows.op == "moe") & rows.impl.isin(["vllm", "marlin"])]
    assert len(got) == len(kept) == 7
    assert (got.impl == "marlin").sum() == (kept.family == "marlin").sum() == 1
    dtype = kept.moe_dtype.map({"bfloat16": "bf16", "fp8": "fp8", "w4a16_mxfp4": "bf16"})
    weights = kept.moe_dtype.map(lambda d: "mxfp4" if d == "w4a16_mxfp4" else "dtype")
    expected = sorted(zip(kept.family, kept.num_tokens, dtype, weights, kept.latency / 1e3))
    measured = sorted(zip(got.impl, got.tokens, got.dtype, got.weights, got.time_s_median))
    assert [m[:4] for m in measured] == [e[:4] for e in expected]
    assert [m[4] for m in measured] == pytest.approx([e[4] for e in expected])
    assert set(got.source_file.str.split("/").str[3]) == {"0.24.0", "0.19.0"}
    assert (got[got.dtype == "fp8"].source_file.str.contains("0.19.0")).all()
    assert got.kernel_name.str.startswith("vllm ").all() and got.gated.all() and (got.fn == "silu").all()
    s = result.skipped
    older = {k: c for k, c in s.items() if k.startswith("moe (vllm) ")}
    assert sum(older.values()) == len(old) == 4
    assert older[aic.MOE_VLLM_RELEASE_REASON.format("bf16 vllm", "0.24.0")] == 3
    assert older[aic.MOE_VLLM_RELEASE_REASON.format("bf16 mxfp4 weights vllm", "0.24.0")] == 1
    # the TensorRT-LLM rows of the same shapes stay (their own impl)
    both = rows[(rows.op == "moe") & (rows.tokens == 8) & (rows.dtype == "bf16") & (rows.weights == "dtype")]
    assert set(both.impl) == {"trtllm", "vllm"}


def test_moe_impls_replays_only_the_families_asked_for_and_counts_the_rest(source):
    """``replay(moe_impls=...)`` (the default refit's trtllm and marlin) keeps those families' moe rows as the full
    replay has them and counts every other family's row under one reason per family; other kinds are untouched."""
    full = pd.DataFrame(aic.replay(FIXTURE).rows)
    result = aic.replay(FIXTURE, moe_impls=("trtllm", "marlin"))
    rows = pd.DataFrame(result.rows)
    assert set(rows[rows.op == "moe"].impl) == {"trtllm", "marlin"}
    kept = full[(full.op != "moe") | full.impl.isin(["trtllm", "marlin"])]
    assert len(rows) == len(kept)
    v = source[(source.table == "moe_perf") & (source.pfw == "vllm")]
    vllm_family = ~v.kernel_source.astype(str).str.contains("marlin")
    assert result.skipped[aic.MOE_IMPL_REASON.format("vllm")] == int(vllm_family.sum())
    assert len(rows[~_family(rows)]) + sum(result.skipped.values()) == len(source)
    plain = pd.DataFrame(aic.replay(FIXTURE, gemm_impls=("cublas",)).rows)  # no GEMM family rows
    assert len(plain) == len(full[~_gemm_family(full)]) and not _gemm_family(plain).any()


def test_the_gemm_tables_and_the_rest_replay_apart_to_the_same_rows():
    """``benchmarks/modern_gpus.py --replay-part gemm|rest`` (two processes of the refit): the GEMM tables' rows and
    every other table's, replayed apart and read in that order, are the rows of one replay, in its order."""
    stems = sorted({p.stem for p in FIXTURE.glob("*/*/*/*/*.parquet")})
    assert "gemm_perf" in stems and len(stems) > 1
    whole = aic.replay(FIXTURE)
    gemm = aic.replay(FIXTURE, tables=["gemm_perf"])
    rest = aic.replay(FIXTURE, tables=[t for t in stems if t != "gemm_perf"])
    assert gemm.rows + rest.rows == whole.rows
    assert gemm.skipped + rest.skipped == whole.skipped


# --------------------------------------------------------------------------- precedence and values


def _one(rows: pd.DataFrame, **where) -> pd.Series:
    mask = pd.Series(True, index=rows.index)
    for key, value in where.items():
        mask &= rows[key] == value
    (index,) = rows.index[mask]
    return rows.loc[index]


def test_precedence_framework_then_version_then_densest_lane(source, replayed):
    result, rows = replayed
    shared = _one(rows, op="gemm", device="H100-SXM", m=128, n=4096, k=4096, dtype="bf16")
    assert shared.kernel_name == "vllm 0.24.0: torch.nn.functional.linear"  # trtllm measured it too
    only_trtllm = _one(rows, op="gemm", device="H100-SXM", m=256, n=4096, k=4096, dtype="bf16")
    assert only_trtllm.kernel_name == "trtllm 1.3.0rc20: torch_flow"
    newest = _one(rows, op="gemm", device="H100-SXM", m=4096, n=4096, k=4096, dtype="bf16")
    assert newest.kernel_name == "sglang 0.5.14: sglang_torch_linear"  # 0.5.6.post2 too, older
    assert newest.source_file == "h100_sxm/gemm/sglang/0.5.14/gemm_perf.parquet"
    lane = _one(rows, op="attention", batch=4, seq_q=2048, dtype="bf16")
    assert lane.kernel_name == "vllm 0.24.0: vllm_flash_attn_fa3"  # 2 rows in the file, flashinfer 1
    assert result.skipped["gemm: measured again by a lower-precedence framework"] == 1
    assert result.skipped["gemm: measured again by an older version of the same framework (kept the newest)"] == 1
    assert result.skipped["attention: measured again by a lower-precedence framework"] == 1
    assert result.skipped["attention: measured again by another kernel of the same file (kept the densest lane)"] == 1
    assert result.skipped["collective: measured again by an older version of the same framework (kept the newest)"] == 1
    other = aic.replay(FIXTURE, frameworks=("trtllm", "vllm"), tables=["gemm_perf"])
    flipped = _one(pd.DataFrame(other.rows), op="gemm", device="H100-SXM", m=128, n=4096, k=4096, dtype="bf16")
    assert flipped.kernel_name == "trtllm 1.3.0rc20: torch_flow"


def test_times_are_seconds_and_repeats_merge(source, replayed):
    _, rows = replayed
    src = source[(source.table == "gemm_perf") & (source.system == "gb200") & (source.m == 8192)]
    row = _one(rows, op="gemm", device="GB200", m=8192)
    assert row.time_s_median == pytest.approx(float(src.latency.iloc[0]) / 1e3)
    reps = (
        source[
            (source.table == "nccl_perf")
            & (source.pver == "2.29.2")
            & (source.op_name == "all_reduce")
            & (source.message_size == 1048576)
        ].latency
        / 1e3
    )
    merged = _one(rows, op="all_reduce", bytes=2 * 1048576, world_size=8, backend="nccl")
    assert merged.time_s_median == pytest.approx(reps.median())
    assert merged.time_s_p20 == pytest.approx(reps.quantile(0.2))
    assert merged.time_s_p80 == pytest.approx(reps.quantile(0.8))
    assert merged.algbw_gbps == pytest.approx(2 * 1048576 / reps.median() / 1e9)
    assert merged.busbw_gbps == pytest.approx(merged.algbw_gbps * 2 * 7 / 8)
    trtllm_first = pd.DataFrame(aic.replay(FIXTURE, frameworks=("trtllm",), tables=["context_attention_perf"]).rows)
    single = _one(trtllm_first, op="attention", batch=2, seq_q=1024, dtype="bf16")  # 2 rows in one file: median only
    ctx = (
        source[
            (source.table == "context_attention_perf")
            & (source.pfw == "trtllm")
            & (source.batch_size == 2)
            & (source.attn_dtype == "bfloat16")
            & (source.kv_cache_dtype == "bfloat16")
        ].latency
        / 1e3
    )
    assert single.time_s_median == pytest.approx(ctx.median()) and pd.isna(single.time_s_p20)


def test_decode_attention_is_one_query_over_the_cache_and_itself(replayed):
    _, rows = replayed
    row = _one(rows, op="attention", batch=64, seq_q=1)
    assert row.seq_kv == 1024  # step 1023 cached tokens + the new one


def test_provenance_columns(replayed):
    _, rows = replayed
    row = _one(rows, op="gemm", device="H100-SXM", m=256)
    assert row.source_file == "h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet"
    assert row.torch_version == "2.9.1" and row.cuda_version == "13.0.1"  # runtime.abi of collection_meta.yaml
    assert row.timing_method == "replay:aiconfigurator:mean"
    nccl = rows[(rows.op == "all_reduce") & (rows.backend == "nccl")]
    assert set(nccl.timing_method) == {"replay:aiconfigurator:nccl-tests-avg"}
    custom = rows[rows.backend == aic.CUSTOM_BACKEND]
    assert len(custom) and set(custom.timing_method) == {"replay:aiconfigurator:cuda-graph-mean"}


def test_rows_validate_and_round_trip_the_schema(replayed, tmp_path):
    result, _ = replayed
    kept, skipped = normalise(result, source="aiconfigurator", run_id="test", opcast_version="0")
    assert len(kept) == len(result.rows) and not any(k.startswith("invalid") or k == "duplicate" for k in skipped)
    write_parquet(kept, tmp_path / "aiconfigurator.parquet")
    frame = read_dataset(tmp_path)
    assert len(frame) == len(kept) and not frame.duplicated(["device", "point_id"]).any()
    assert set(frame.source) == {"replay:aiconfigurator"} and frame.kernel_name.notna().all()


# --------------------------------------------------------------------------- layout, metadata, errors


def test_data_root_accepts_the_package_and_systems_folders(tmp_path):
    data = tmp_path / "pkg" / "systems" / "data"
    (data / "h100_sxm" / "gemm" / "vllm" / "0.24.0").mkdir(parents=True)
    target = data / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    target.write_bytes((FIXTURE / "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet").read_bytes())
    assert aic.data_root(tmp_path / "pkg") == data
    assert aic.data_root(tmp_path / "pkg" / "systems") == data
    assert aic.data_root(data) == data
    assert len(aic.replay(tmp_path / "pkg", gemm_impls=("cublas",)).rows) == 3


def test_read_meta_reads_scalars_and_skips_blocks_and_lists():
    meta = aic.read_meta(FIXTURE / "h100_sxm/gemm/trtllm/1.3.0rc20/collection_meta.yaml")
    assert meta[("runtime", "framework")] == "trtllm" and meta[("runtime", "version")] == "1.3.0rc20"
    assert meta[("runtime", "abi", "torch")] == "2.9.1" and meta[("tables", "any_perf", "status")] == "complete"
    assert ("runtime", "abi", "note") not in meta and not any("folded text" in k for key in meta for k in key)
    assert aic.read_meta(FIXTURE / "missing.yaml") == {}


def test_version_key_orders_releases():
    versions = ["0.5.14", "0.5.6.post2", "1.3.0rc20", "1.3.0rc23", "1.3.0", "0.1.dev19262", "0.1", "2.27", "2.27.3"]
    assert sorted(versions, key=aic.version_key) == [
        "0.1.dev19262",
        "0.1",
        "0.5.6.post2",
        "0.5.14",
        "1.3.0rc20",
        "1.3.0rc23",
        "1.3.0",
        "2.27",
        "2.27.3",
    ]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setattr(aic.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(OpcastError, match=r"opcast\[aiconfigurator\]"):
        aic.replay(None)


def test_system_missing_from_the_catalog_is_skipped(monkeypatch):
    monkeypatch.setitem(aic.SYSTEM_DEVICES, "gb200", "No-Such-GPU")
    aic.system_device.cache_clear()
    try:
        result = aic.replay(FIXTURE, systems=["gb200"])
    finally:
        aic.system_device.cache_clear()
    rows = int((_source(FIXTURE).system == "gb200").sum())
    assert result.rows == [] and result.skipped == {"system gb200: No-Such-GPU is not in the hardware catalog": rows}


def test_malformed_tables_name_the_file(tmp_path):
    folder = tmp_path / "h100_sxm" / "gemm" / "trtllm" / "1.0"
    folder.mkdir(parents=True)
    pd.DataFrame({"m": [1], "n": [2], "k": [3], "latency": [0.1]}).to_parquet(folder / "gemm_perf.parquet")
    with pytest.raises(
        MalformedFile, match=r"gemm_perf.parquet: gemm_perf lacks column\(s\) kernel_source, gemm_dtype"
    ):
        aic.replay(tmp_path)
    pd.DataFrame(
        {
            "device": ["NVIDIA A100-SXM4-80GB"],
            "kernel_source": ["x"],
            "gemm_dtype": ["bfloat16"],
            "m": [1],
            "n": [2],
            "k": [3],
            "latency": [0.1],
        }
    ).to_parquet(folder / "gemm_perf.parquet")
    with pytest.raises(
        MalformedFile,
        match=r"device column says 'NVIDIA A100-SXM4-80GB' .* but the folder is "
        r"H100-SXM",
    ):
        aic.replay(tmp_path)
    (folder / "gemm_perf.parquet").write_text("not parquet")
    with pytest.raises(MalformedFile, match="not a readable parquet file"):
        aic.replay(tmp_path)


# --------------------------------------------------------------------------- catalog


@pytest.mark.parametrize("name", NEW_DEVICES)
def test_new_catalog_entries_load(name):
    spec = get_device(name)
    assert spec.name == name and spec.supports("bf16") and spec.supports("fp8")
    assert "dense" in spec.notes and "http" in spec.source
    assert spec.peak_fp8_flops == pytest.approx(2 * spec.peak_bf16_flops, rel=0.02)  # L40S: 733 vs 362.05


def test_every_measured_system_resolves_or_is_pending():
    resolved = {s: aic.system_device(s) for s in aic.SYSTEM_DEVICES}
    assert resolved == aic.SYSTEM_DEVICES  # every measured system has a catalog entry (B60: vendor intel)
    for torch_name, device in (
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ):
        assert get_device(torch_name).name == device


def test_every_mapped_system_sits_on_a_cluster_of_its_own_gpu():
    assert set(aic.SYSTEM_CLUSTERS) <= set(aic.SYSTEM_DEVICES)
    for system, name in aic.SYSTEM_CLUSTERS.items():
        cluster = get_cluster(name)
        assert cluster.name == name and cluster.gpu == aic.SYSTEM_DEVICES[system], system


def test_catalog_entry_through_the_console_script():
    done = subprocess.run(
        [sys.executable, "-m", "opcast", "hardware", "show", "gb200"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "GB200"  # the alias resolved to the catalog entry
    bad = subprocess.run(
        [sys.executable, "-m", "opcast", "hardware", "show", "gb2000"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and bad.stderr.startswith("opcast: error:") and "Traceback" not in bad.stderr


# --------------------------------------------------------------------------- the real package


@pytest.fixture(scope="module")
def package_root() -> Path:
    if importlib.util.find_spec("aiconfigurator_core") is None:
        pytest.skip("aiconfigurator-core is not installed (pip install 'opcast[aiconfigurator]')")
    return aic.default_root()


def test_real_h100_gemms(package_root):
    result = aic.replay(None, systems=["h100_sxm"], tables=["gemm_perf"])
    rows = pd.DataFrame(result.rows)
    source = pd.concat(
        [
            pq.read_table(p, columns=["gemm_dtype", "m", "n", "k", "latency"]).to_pandas().assign(framework=p.parts[-3])
            for p in sorted(package_root.glob("h100_sxm/gemm/*/*/gemm_perf.parquet"))
        ],
        ignore_index=True,
    )
    source = source[source.gemm_dtype.isin(["bfloat16", "fp8", "fp8_block"]) & (source.latency > 0)]
    eager = (source.framework == "vllm") & (source.gemm_dtype == "fp8_block")  # VLLM_FP8_BLOCK_REASON
    assert result.skipped[aic.VLLM_FP8_BLOCK_REASON] == int(eager.sum()) > 0
    source = source[~eager]
    family = _gemm_family(rows)
    vllm_fp8 = source[(source.framework == "vllm") & (source.gemm_dtype == "fp8")]
    assert int(family.sum()) == len(vllm_fp8) > 0
    rows = rows[~family]
    assert len(rows) == len(source.drop_duplicates(["gemm_dtype", "m", "n", "k"]))
    assert int((rows.dtype == "fp8_block").sum()) == len(
        source[source.gemm_dtype == "fp8_block"].drop_duplicates(["m", "n", "k"])
    )
    anchor = _one(rows, m=32768, n=65536, k=12288, dtype="bf16")
    # The issue's check: 60.3 ms, 88 % of H100's 989 TFLOP/s dense bf16 peak.
    assert anchor.time_s_median == pytest.approx(0.0603, rel=0.01)
    assert 2 * 32768 * 65536 * 12288 / anchor.time_s_median / get_device("H100-SXM").peak_bf16_flops == pytest.approx(
        0.88, abs=0.01
    )


def test_real_catalog_numbers_agree_with_the_package_specs(package_root):
    """Spot check of the hand-entered peaks against the package's systems/<system>.yaml."""
    systems = package_root.parent
    for system, device in (("gb200", "GB200"), ("gb300", "GB300"), ("l40s", "L40S"), ("h100_sxm", "H100-SXM")):
        meta = aic.read_meta(systems / f"{system}.yaml")
        spec = get_device(device)
        assert float(meta[("gpu", "bfloat16_tc_flops")]) == pytest.approx(spec.peak_bf16_flops, rel=0.01), system
        assert float(meta[("gpu", "fp8_tc_flops")]) == pytest.approx(spec.peak_fp8_flops, rel=0.01), system
        assert float(meta[("gpu", "mem_bw")]) == pytest.approx(spec.mem_bw_bytes_per_s, rel=0.01), system


def test_real_nccl_tables_are_on_the_clusters_their_yaml_describes(package_root):
    """Every system with an NCCL table names a cluster (so ``train fit`` learns its law) whose node
    is the one ``systems/<system>.yaml`` describes: GPUs per node and the intra-node link (the tier the
    tables measure; the yaml's inter-node figures are not all the datasheets', e.g. b200_sxm's 100e9)."""
    measured = {p.parts[-5] for p in package_root.glob("*/comm/nccl/*/nccl_perf.parquet")}
    assert measured and measured <= set(aic.SYSTEM_CLUSTERS), measured - set(aic.SYSTEM_CLUSTERS)
    for system in sorted(measured):
        meta, cluster = aic.read_meta(package_root.parent / f"{system}.yaml"), get_cluster(aic.SYSTEM_CLUSTERS[system])
        assert int(meta[("node", "num_gpus_per_node")]) == cluster.gpus_per_node, system
        if cluster.nvlink_domain_gpus == cluster.gpus_per_node:  # NVL72: the yaml's node is a compute tray
            assert float(meta[("node", "intra_node_bw")]) == cluster.intra_node_bw_bytes_per_s, system


def test_fixture_generator_is_deterministic(tmp_path):
    """The generator writes the same tables every time, so counts asserted on it are stable."""
    again = _build_fixture(tmp_path)
    for path in sorted(FIXTURE.glob("*/*/*/*/*.parquet")):
        fresh = pq.read_table(again / path.relative_to(FIXTURE))
        assert fresh.equals(pq.read_table(path)), path
    assert json.dumps(sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file())) == json.dumps(
        sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob("*") if p.is_file())
    )


def test_the_console_script_replays_the_fixture_and_needs_a_path_for_other_sources(tmp_path):
    out = tmp_path / "ds"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opcast",
            "collect",
            "replay",
            "aiconfigurator",
            str(FIXTURE),
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    expected = aic.replay(FIXTURE)
    rows, _ = normalise(expected, source="aiconfigurator", run_id="x", opcast_version="0")
    assert record["rows_written"] == len(rows) == len(read_dataset(out / "aiconfigurator.parquet"))
    bare = subprocess.run(
        [sys.executable, "-m", "opcast", "collect", "replay", "neusight", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bare.returncode == 2 and "Traceback" not in bare.stderr
    assert bare.stderr.strip().splitlines() == [bare.stderr.strip()] and "PATH" in bare.stderr


def test_fp8_gemms_take_tensorrt_llms_cublaslt_rows_first_and_bf16_keeps_vllms(tmp_path):
    """Where vLLM and TensorRT-LLM measured the same GEMM, bf16 keeps vLLM's row (FRAMEWORKS) and fp8
    TensorRT-LLM's (GEMM_FP8_FRAMEWORKS: cuBLASLt, Transformer Engine's fp8 kernel family); the
    precedence of either is an argument."""
    gen = load_script(GENERATOR, register=False)
    gen.HERE = tmp_path
    cases = [("k", "bfloat16", 128, 4096, 4096), ("k", "fp8", 128, 4096, 4096)]
    for framework, version, scale in (("trtllm", "1.3.0rc20", 1.0), ("vllm", "0.24.0", 1.5)):
        gen.write(
            f"h100_sxm/gemm/{framework}/{version}/gemm_perf.parquet",
            gen.gemm_rows(framework.upper(), version, "NVIDIA H100 80GB HBM3", cases, scale=scale),
            gen.meta(framework, version),
        )

    def kept(**kw):
        rows = aic.replay(tmp_path, **kw).rows
        return {r["dtype"]: r["source_file"].split("/")[2] for r in rows if r["op"] == "gemm" and r["impl"] is None}

    assert kept() == {"bf16": "vllm", "fp8": "trtllm"}
    assert kept(fp8_gemm_frameworks=("vllm", "trtllm")) == {"bf16": "vllm", "fp8": "vllm"}
    assert kept(frameworks=("trtllm", "vllm")) == {"bf16": "trtllm", "fp8": "trtllm"}


def test_a_bf16_gemm_two_other_tables_contradict_is_a_spike_and_the_next_frameworks_row_is_kept(tmp_path):
    """SPIKE_RATIO: a bf16 row precedence would keep (vLLM's) that ran over 1.3x the median of the system's
    tables of the shape is dropped for the next framework's and counted; where another table agrees with it
    (the median is then its own kind), at 1.25x, or where no other table measured the shape it stays; fp8 rows
    (another kernel in each framework) are not screened."""
    gen = load_script(GENERATOR, register=False)
    gen.HERE = tmp_path
    spike, agreed, mild, alone = (
        ("k", "bfloat16", 4096, 4096, 4096),
        ("k", "bfloat16", 2048, 4096, 4096),
        ("k", "bfloat16", 1024, 4096, 4096),
        ("k", "bfloat16", 512, 4096, 4096),
    )
    fp8 = ("k", "fp8", 4096, 4096, 4096)
    scales = {  # per framework: (case, latency scale)
        "vllm": [(spike, 2.0), (agreed, 2.0), (mild, 1.25), (alone, 3.0), (fp8, 1.0)],
        "trtllm": [(spike, 1.0), (agreed, 1.0), (mild, 1.0), (fp8, 3.0)],
        "sglang": [(spike, 1.05), (agreed, 1.9), (mild, 1.0), (fp8, 1.0)],
    }
    versions = {"vllm": "0.24.0", "trtllm": "1.3.0rc20", "sglang": "0.5.14"}
    for framework, cases in scales.items():
        rows = [
            row
            for case, scale in cases
            for row in gen.gemm_rows(framework.upper(), versions[framework], "NVIDIA B200", [case], scale=scale)
        ]
        gen.write(f"b200_sxm/gemm/{framework}/{versions[framework]}/gemm_perf.parquet", rows, gen.meta(framework, "x"))
    result = aic.replay(tmp_path)
    kept = {
        (r["dtype"], r["m"]): r["source_file"].split("/")[2]
        for r in result.rows
        if r["op"] == "gemm" and r["impl"] is None
    }
    assert kept == {
        ("bf16", 4096): "trtllm",
        ("bf16", 2048): "vllm",
        ("bf16", 1024): "vllm",
        ("bf16", 512): "vllm",
        ("fp8", 4096): "trtllm",
    }
    reasons = {k: v for k, v in result.skipped.items() if "spike" in k}
    assert list(reasons.values()) == [1] and str(aic.SPIKE_RATIO) in next(iter(reasons))
    # the dropped row is counted once, not also as a lower-precedence duplicate: every source row is accounted for
    plain = [r for r in result.rows if r["impl"] is None]  # less vLLM's fp8 row as its own family
    assert len(plain) + sum(result.skipped.values()) == sum(len(v) for v in scales.values())


def test_block_scaled_gemms_follow_their_precedence_and_skip_vllms_eager_fp8_block(tmp_path):
    """fp8_block and nvfp4 rows follow GEMM_BLOCK_FRAMEWORKS (fp8_block TensorRT-LLM first, nvfp4 vLLM first); vLLM's
    fp8_block rows,
    timed without a CUDA graph, are skipped and counted even where nothing else measured the shape."""
    gen = load_script(GENERATOR, register=False)
    gen.HERE = tmp_path
    both = [("k", "fp8_block", 128, 4096, 4096), ("k", "nvfp4", 128, 4096, 4096)]
    only_vllm = [("k", "fp8_block", 64, 4096, 4096)]
    for framework, version, scale, cases in (
        ("trtllm", "1.3.0rc20", 1.0, both),
        ("sglang", "0.5.14", 0.9, both),
        ("vllm", "0.24.0", 1.5, both + only_vllm),
    ):
        gen.write(
            f"b200_sxm/gemm/{framework}/{version}/gemm_perf.parquet",
            gen.gemm_rows(framework.upper(), version, "NVIDIA B200", cases, scale=scale),
            gen.meta(framework, version),
        )
    result = aic.replay(tmp_path)
    kept = {(r["dtype"], r["m"]): r["source_file"].split("/")[2] for r in result.rows if r["op"] == "gemm"}
    assert kept == {("fp8_block", 128): "trtllm", ("nvfp4", 128): "vllm"}
    assert result.skipped[aic.VLLM_FP8_BLOCK_REASON] == 2


def test_tensorrt_llm_fp8_gemms_lose_the_activation_quantisation_their_call_timed(tmp_path):
    """TensorRT-LLM's fp8 GEMM row times quantize_e4m3_per_tensor (compute_scale + scale_matrix) before the
    GEMM; the replay subtracts both from AIConfigurator's quantize tables of the same release at the row's
    (m, k), skips (counted) a row without one or left with no time, and a release without the tables keeps
    its rows as measured, saying so in the kernel name. bf16 rows are untouched."""
    gen = load_script(GENERATOR, register=False)
    gen.HERE = tmp_path
    cases = [
        ("torch_flow", "fp8", 128, 4096, 4096),  # quant at (128, 4096): subtracted
        ("torch_flow", "fp8", 256, 4096, 4096),  # no quant row at (256, 4096): skipped
        ("torch_flow", "fp8", 64, 4096, 1024),  # quant longer than the row: skipped
        ("torch_flow", "bfloat16", 128, 4096, 4096),
    ]
    rows = gen.gemm_rows("TRTLLM", "1.3.0rc20", "NVIDIA H100 80GB HBM3", cases)
    gen.write("h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet", rows, gen.meta("trtllm", "1.3.0rc20"))
    b200_rows = [{**r, "device": "NVIDIA B200"} for r in rows]
    gen.write("b200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet", b200_rows, gen.meta("trtllm", "1.3.0rc20"))
    row_ms = {(r["gemm_dtype"], r["m"], r["k"]): r["latency"] for r in rows}
    quant_ms = {"computescale_perf": {(128, 4096): 0.002, (64, 1024): 0.5}, "scale_matrix_perf": {(128, 4096): 0.003}}
    quant_ms["scale_matrix_perf"][(64, 1024)] = 0.5
    for table, at in quant_ms.items():
        gen.write(
            f"h100_sxm/quantize/trtllm/1.3.0rc20/{table}.parquet",
            [{"m": m, "k": k, "quant_dtype": "fp8", "latency": ms} for (m, k), ms in at.items()],
        )
    default = {(r["device"], r["dtype"], r["m"]): r for r in aic.replay(tmp_path).rows}  # FP8_GEMM_ALONE off
    assert default[("H100-SXM", "fp8", 128)]["time_s_median"] == pytest.approx(row_ms[("fp8", 128, 4096)] / 1e3)
    assert ("H100-SXM", "fp8", 256) in default and not aic.FP8_GEMM_ALONE
    result = aic.replay(tmp_path, fp8_gemm_alone=True)
    got = {(r["device"], r["dtype"], r["m"]): r for r in result.rows}
    h100 = got[("H100-SXM", "fp8", 128)]
    assert h100["time_s_median"] == pytest.approx((row_ms[("fp8", 128, 4096)] - 0.005) / 1e3)
    assert h100["kernel_name"].endswith(aic.FP8_QUANT_GONE)
    assert ("H100-SXM", "fp8", 256) not in got and ("H100-SXM", "fp8", 64) not in got
    assert result.skipped["gemm fp8 (trtllm): no quantisation row at its (m, k) to subtract"] == 1
    assert result.skipped["gemm fp8 (trtllm): no time left after its quantisation"] == 1
    assert got[("H100-SXM", "bf16", 128)]["time_s_median"] == pytest.approx(row_ms[("bfloat16", 128, 4096)] / 1e3)
    b200 = [r for r in result.rows if r["device"] == "B200" and r["dtype"] == "fp8"]  # no quantize tables there
    assert len(b200) == 3 and all(r["kernel_name"].endswith(aic.FP8_QUANT_KEPT) for r in b200)
    assert got[("B200", "fp8", 128)]["time_s_median"] == pytest.approx(row_ms[("fp8", 128, 4096)] / 1e3)


def test_attention_keeps_one_framework_per_system_phase_and_dtype(tmp_path):
    """Attention rows come from one framework (kernel family) per (system, phase, dtype): the first in
    the precedence that measured any row of it. Shapes only another framework measured are left out
    and counted, not filled in (aic.ATTENTION_FILL); ``attention_fill=True`` restores the fill-in and
    ``attention_frameworks`` reorders the attention rows alone."""
    gen = load_script(GENERATOR, register=False)
    gen.HERE = tmp_path
    bf, f8 = ("bfloat16", "bfloat16"), ("fp8", "fp8")
    shared, trt_only, vllm_only, sgl_only = (64, 1023, 32, 8), (8, 4095, 32, 32), (16, 511, 16, 4), (4, 255, 8, 8)
    old_only = (32, 127, 8, 2)
    decode = {  # framework -> (batch, step, heads, kv_heads), dtype pair
        ("trtllm", "1.3.0rc20"): [(shared, bf), (trt_only, bf), (shared, f8)],
        ("vllm", "0.24.0"): [(shared, bf), (vllm_only, bf)],
        ("vllm", "0.22.0"): [(old_only, bf), (vllm_only, bf)],  # an older release: another kernel family too
        ("sglang", "0.5.14"): [(sgl_only, bf), (sgl_only, f8)],
    }
    for (framework, version), cases in decode.items():
        rows = [
            ("k", b, 1, step, h, kv, 128, a, c, 0, 1.0 + 0.1 * i) for i, ((b, step, h, kv), (a, c)) in enumerate(cases)
        ]
        gen.write(
            f"h100_sxm/attention/{framework}/{version}/generation_attention_perf.parquet",
            gen.attention_rows("generation_attention", framework.upper(), version, rows),
            gen.meta(framework, version),
        )
    # prefill bf16: only TensorRT-LLM measured it on this system, so its rows are the family kept there
    gen.write(
        "h100_sxm/attention/trtllm/1.3.0rc20/context_attention_perf.parquet",
        gen.attention_rows("context_attention", "TRTLLM", "1.3.0rc20", [("k", 2, 1024, 0, 32, 8, 128, *bf, 0, 1.0)]),
    )
    n_source = sum(len(pq.read_table(p)) for p in tmp_path.glob("*/*/*/*/*.parquet"))

    def kept(**kw):
        result = aic.replay(tmp_path, **kw)
        assert len(result.rows) + sum(result.skipped.values()) == n_source  # every row kept or counted
        got = {
            ("prefill" if r["seq_q"] > 1 else "decode", r["dtype"], r["batch"]): r["source_file"].split("/")[2]
            for r in result.rows
        }
        return got, result.skipped

    got, skipped = kept()
    assert got == {
        ("decode", "bf16", 64): "vllm",
        ("decode", "bf16", 16): "vllm",
        ("decode", "fp8", 64): "trtllm",  # vLLM measured no fp8 decode: TensorRT-LLM is the first there
        ("prefill", "bf16", 2): "trtllm",
    }
    tail = "measured this system's rows of that phase and dtype (one kernel family per system and label, no fill-in)"
    assert skipped[f"attention: generation attention bf16: a shape only trtllm measured, left out: vllm {tail}"] == 1
    assert skipped[f"attention: generation attention bf16: a shape only sglang measured, left out: vllm {tail}"] == 1
    assert skipped[f"attention: generation attention fp8: a shape only sglang measured, left out: trtllm {tail}"] == 1
    older = "a shape only an older vllm measured, left out: its newest, 0.24.0,"
    assert skipped[f"attention: generation attention bf16: {older} {tail}"] == 1
    assert skipped["attention: measured again by a lower-precedence framework"] == 1  # the shared bf16 shape
    assert skipped["attention: measured again by an older version of the same framework (kept the newest)"] == 1

    filled, skipped = kept(attention_fill=True)
    assert filled == {
        **got,
        ("decode", "bf16", 8): "trtllm",
        ("decode", "bf16", 32): "vllm",  # vLLM 0.22.0's
        ("decode", "bf16", 4): "sglang",
        ("decode", "fp8", 4): "sglang",
    }
    assert not any("no fill-in" in reason for reason in skipped)

    trt_first, _ = kept(attention_frameworks=("trtllm", "vllm", "sglang"))
    assert trt_first == {
        ("decode", "bf16", 64): "trtllm",
        ("decode", "bf16", 8): "trtllm",
        ("decode", "fp8", 64): "trtllm",
        ("prefill", "bf16", 2): "trtllm",
    }
    # the attention order leaves the other tables' precedence alone, and the default order is FRAMEWORKS'
    assert kept(frameworks=("trtllm", "vllm", "sglang"))[0] == trt_first
