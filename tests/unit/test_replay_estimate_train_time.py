"""Replay of the arXiv 2509.22832 artifact (estimate-train-time): exact row counts counted
independently from the CSVs, hand-checked conversions, the skips, and malformed input."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from opcast.collect.info import summarise
from opcast.collect.replay import ReplayOptions, run_replay
from opcast.collect.replay import estimate_train_time as ett
from opcast.collect.replay.common import MalformedFile, whole
from opcast.schema import read_dataset

A100, GH200 = "NVIDIAA100-SXM4-80GB", "NVIDIAGH200120GB"
PERL_OP = f"data/regressors/Perlmutter/operator/{A100}"
PERL_NCCL = f"data/regressors/Perlmutter/nccl/{A100}"
VISTA_OP = f"data/regressors/Vista/operator/{GH200}"
VISTA_NCCL = f"data/regressors/Vista/nccl/{GH200}"


@pytest.fixture(scope="module")
def root(published) -> Path:
    return published / "estimate-train-time"


@pytest.fixture(scope="module")
def result(root):
    return ett.replay(root, ReplayOptions())


def _by_file(result) -> Counter:
    return Counter((Path(r["source_file"]).stem, r["direction"]) for r in result.rows)


def _csv(root: Path, rel: str) -> pd.DataFrame:
    return pd.read_csv(root / f"{rel}.csv")


# --------------------------------------------------------------------------- counts


def test_every_operator_file_gives_one_row_per_direction_minus_the_skips(root, result):
    got = _by_file(result)
    for path in sorted((root / "data" / "regressors").glob("*/operator/*_*.csv")):
        df = pd.read_csv(path)
        stem, op = path.stem, path.stem.split("_", 1)[1].removesuffix("_fp16")
        fwd, bwd = got[(stem, "fwd")], got[(stem, "bwd")]
        if op in ("fillmask", "optimizer"):  # no single opcast op / undocumented optimizer file
            assert (fwd, bwd) == (0, 0), stem
        elif op.endswith("Stage_optimizer"):
            expected = len(df)
            if stem == f"{GH200}_firstStage_optimizer_fp16":  # steps of seconds: > 3x the middle stage
                middle = _csv(root, f"{VISTA_OP}_middleStage_optimizer_fp16")
                both = df.merge(middle, on=["mp", "dim", "encoders"], suffixes=("", "_mid"))
                outliers = int((both["dur(us)"] > 3 * both["dur(us)_mid"]).sum())
                assert outliers == 48
                expected -= outliers
            assert (fwd, bwd) == (expected, 0), stem
        elif op == "res_add":  # forward only: an add has no backward kernel
            assert (fwd, bwd) == (len(df), 0), stem
        elif stem == f"{GH200}_flash_atten_fp16":  # backward capture is broken (median B/F 0.11)
            assert (df["B_dur(us)"] / df["F_dur(us)"]).median() < 0.2
            assert (fwd, bwd) == (len(df), 0), stem
        else:
            assert (fwd, bwd) == (len(df), len(df)), stem


def test_every_nccl_file_gives_one_row_per_line_minus_the_skips(root, result):
    got = _by_file(result)
    for path in sorted((root / "data" / "regressors").glob("*/nccl/*_*.csv")):
        df = pd.read_csv(path)
        stem = path.stem
        if not re.search(r"_\d+_\d+$", stem):  # merged all-topology copy: every row repeats a per-topology file
            assert got[(stem, "fwd")] == 0, stem
            continue
        expected = len(df)
        if stem.startswith(GH200) and "allgather" in stem:  # busbw above 1.1 x 50 GB/s NDR: impossible
            world = df["nodes"] * df["GPUsPerNode"]
            busbw = 2 * df["shape"] * world / (df["dur(us)"] / 1e6) / 1e9 * (world - 1) / world
            expected -= int((busbw > 55).sum())
        assert got[(stem, "fwd")] == expected, stem
        assert got[(stem, "bwd")] == 0


def test_skip_reasons_are_counted_exactly(root, result):
    skipped = {reason.split(":")[0]: n for reason, n in result.skipped.items()}
    fillmask = len(_csv(root, f"{PERL_OP}_fillmask_fp16")) + len(_csv(root, f"{VISTA_OP}_fillmask_fp16"))
    res_add = len(_csv(root, f"{PERL_OP}_res_add_fp16")) + len(_csv(root, f"{VISTA_OP}_res_add_fp16"))
    merged = sum(len(_csv(root, f"{PERL_NCCL}_{c}_fp16")) for c in ("allreduce", "allreduce_large", "allgather_large"))
    assert skipped["fillmask"] == 2 * fillmask == 18350
    assert skipped["res_add B_dur"] == res_add == 702
    assert skipped["flash_atten B_dur on GH200"] == len(_csv(root, f"{VISTA_OP}_flash_atten_fp16")) == 4068
    assert skipped["optimizer_fp16.csv"] == len(_csv(root, f"{PERL_OP}_optimizer_fp16")) == 319
    assert skipped["nccl file without topology suffix"] == merged == 24695
    assert skipped["firstStage_optimizer on GH200"] == 48
    assert skipped["all_gather on GH200"] == 367
    assert sum(result.skipped.values()) == 18350 + 702 + 4068 + 319 + 24695 + 48 + 367
    assert result.files == 77  # the four <GPU>.csv regressor summaries are never read
    assert len(result.rows) == 166181


# --------------------------------------------------------------------------- hand-checked values


def _find(result, source_file: str, **params):
    """The first row per direction of ``source_file`` with these params (later lines may repeat a shape)."""
    rows = [r for r in result.rows if r["source_file"] == source_file and all(r.get(k) == v for k, v in params.items())]
    return {d: next(r for r in rows if r["direction"] == d) for d in {r["direction"] for r in rows}}


def test_linear1_at_mp2(result):
    # line 47: mp=2, b=2, l=1536, dim=3584, F 475.4 us, B 952.6 us -> [3072, 3584] x [3584, 3*3584/2]
    rows = _find(result, f"{PERL_OP}_linear1_fp16.csv", m=3072, n=5376, k=3584)
    assert set(rows) == {"fwd", "bwd"}
    fwd, bwd = rows["fwd"], rows["bwd"]
    assert (fwd["op"], fwd["b"], fwd["device"], fwd["dtype"], fwd["tensor_cores"]) == (
        "gemm",
        1,
        "A100-SXM4-80GB",
        "fp16",
        True,
    )
    assert fwd["time_s_median"] == 475.4 / 1e6 and bwd["time_s_median"] == 952.6 / 1e6
    assert fwd["timing_method"] == "replay:estimate-train-time"


def test_flash_atten_row(result):
    # line 2: mp=1, b=4, h=16, l=1536, dim=3072, F 742.0 us, B 2385.4 us; flash_attn_func's default causal=False
    rows = _find(result, f"{PERL_OP}_flash_atten_fp16.csv", batch=4, heads=16, seq_q=1536, head_dim=192)
    assert rows["fwd"]["op"] == "attention"
    assert (rows["fwd"]["kv_heads"], rows["fwd"]["seq_kv"], rows["fwd"]["causal"], rows["fwd"]["impl"]) == (
        16,
        1536,
        False,
        "flash",
    )
    assert rows["fwd"]["time_s_median"] == 742.0 / 1e6 and rows["bwd"]["time_s_median"] == 2385.4 / 1e6


def test_allreduce_2_nodes_x_4_gpus(result):
    # line 2: shape 20971520 fp16 elements, 18449.6 us
    row = _find(result, f"{PERL_NCCL}_allreduce_fp16_2_4.csv", bytes=41943040)["fwd"]
    assert (row["op"], row["world_size"], row["nodes"], row["gpus_per_node"]) == ("all_reduce", 8, 2, 4)
    assert row["time_s_median"] == 18449.6 / 1e6
    assert row["algbw_gbps"] == pytest.approx(41943040 / 0.0184496 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 7 / 8)


def test_allgather_bytes_are_the_gathered_output_and_p2p_topology(result):
    # all_gather line 2: each of 8 ranks gives 134217728 fp16 elements -> 2 GiB gathered, 432505.8 us
    row = _find(result, f"{PERL_NCCL}_allgather_large_fp16_2_4.csv", bytes=134217728 * 2 * 8)["fwd"]
    assert (row["op"], row["world_size"], row["time_s_median"]) == ("all_gather", 8, 432505.8 / 1e6)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 7 / 8)
    intra = _find(result, f"{PERL_NCCL}_p2p_fp16_1_2.csv", bytes=4194304)["fwd"]  # 1 node x 2 GPUs
    inter = _find(result, f"{PERL_NCCL}_p2p_fp16_2_1.csv", bytes=4194304)["fwd"]  # 2 nodes x 1 GPU
    assert (intra["op"], intra["nodes"], intra["gpus_per_node"], intra["time_s_median"]) == (
        "send_recv",
        1,
        2,
        63.4 / 1e6,
    )
    assert (inter["nodes"], inter["gpus_per_node"], inter["world_size"]) == (2, 1, 2)


def test_per_rank_vocab_rope_and_optimizer_parameters(result):
    # embedding line 312: mp=4, b=2, l=2048, dim=2048 -> V_p = ceil(50257/512)*128 = 12672
    emb = _find(result, f"{PERL_OP}_embedding_fp16.csv", tokens=4096, vocab=12672, hidden=2048)
    assert emb["fwd"]["time_s_median"] == 128.0 / 1e6 and emb["bwd"]["time_s_median"] == 661.0 / 1e6
    # RoPE line 2: mp=1, b=4, h=16, l=1024, dim=5632: q and k rotated -> 32 heads of 352
    rope = _find(result, f"{PERL_OP}_RoPE_fp16.csv", tokens=4096, heads=32, head_dim=352)
    assert rope["fwd"]["time_s_median"] == 522.0 / 1e6
    # middle stage mp=2, dim=4096, 8 encoders: per encoder 2*2*4096 + 4096*6144 + 6144 + 2048*4096
    # + 2 * 4096*8192 = 100685824; the first stage adds the [25216, 4096] embedding.
    assert ett.encoder_params(2, 4096) == 100685824
    middle = _find(result, f"{PERL_OP}_middleStage_optimizer_fp16.csv", numel=8 * 100685824)["fwd"]
    first = _find(result, f"{PERL_OP}_firstStage_optimizer_fp16.csv", numel=8 * 100685824 + 25216 * 4096)["fwd"]
    assert (middle["time_s_median"], first["time_s_median"]) == (19585.6 / 1e6, 21760.4 / 1e6)


def test_softmax_variants_keep_their_kernel_name(result):
    names = {r["kernel_name"] for r in result.rows if r["op"] == "softmax"}
    assert names == {"torch:softmax", "megatron:ScaledUpperTriangMaskedSoftmax"}


# --------------------------------------------------------------------------- end to end


def test_run_replay_writes_a_dataset_with_every_gpu_and_op(root, result, tmp_path, monkeypatch):
    # run_replay on the importer's (already computed) result: normalise, write, read back.
    monkeypatch.setattr(ett, "replay", lambda path, options: result)
    summary = run_replay("estimate-train-time", root, tmp_path)
    assert summary.rows_read == len(result.rows)
    assert summary.rows_written == summary.rows_read - summary.skipped["duplicate"]
    df = read_dataset(tmp_path / "estimate-train-time.parquet")
    assert len(df) == summary.rows_written
    assert (df["source"] == "replay:estimate-train-time").all() and not df.duplicated(["device", "point_id"]).any()
    table = summarise([tmp_path / "estimate-train-time.parquet"])
    ops = {
        "gemm",
        "attention",
        "softmax",
        "layernorm",
        "rmsnorm",
        "elementwise",
        "rope",
        "embedding",
        "cross_entropy",
        "optimizer",
        "all_reduce",
        "all_gather",
        "send_recv",
    }
    for device in ("A100-SXM4-80GB", "GH200"):
        assert set(table.loc[table["device"] == device, "op"]) == ops
    # torch's softmax (impl native) and Megatron's fused causal kernel (impl fused) are distinct
    # points: a shape in both files keeps both; repeats of a shape within a file are dropped.
    for device, prefix in (("A100-SXM4-80GB", PERL_OP), ("GH200", VISTA_OP)):
        plain, fused = _csv(root, f"{prefix}_softmax_fp16"), _csv(root, f"{prefix}_ScaledUpperTriangMaskedSoftmax_fp16")
        plain_shapes = set(zip(plain["b"] * (plain["h"] // plain["mp"]) * plain["l"], plain["l"]))
        fused_shapes = set(zip(fused["b"] * fused["h"] // fused["mp"] * fused["l"], fused["l"]))
        kept = df[(df["device"] == device) & (df["kernel_name"] == "megatron:ScaledUpperTriangMaskedSoftmax")]
        assert len(kept) == 2 * len(fused_shapes) and (kept["impl"] == "fused").all()
        torch_kept = df[(df["device"] == device) & (df["kernel_name"] == "torch:softmax")]
        assert len(torch_kept) == 2 * len(plain_shapes) and (torch_kept["impl"] == "native").all()


# --------------------------------------------------------------------------- malformed input


def _tree(tmp_path: Path, name: str, text: str, kind: str = "operator") -> Path:
    folder = tmp_path / "data" / "regressors" / "Perlmutter" / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ("mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024,2048,10.0,20.0\n1,2,1536,2048,fast,20.0\n", 3, "not a number"),
        ("mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024,2048,10.0\n", 2, "5 fields"),
        ("mp,b,l,F_dur(us),B_dur(us)\n1,2,1024,10.0,20.0\n", 1, "dim"),
        ("mp,b,l,dim,F_dur(us),B_dur(us)\n1,2.5,1024,2048,10.0,20.0\n", 2, "whole number"),
    ],
)
def test_malformed_operator_file_names_file_and_line(tmp_path, text, line, problem):
    path = _tree(tmp_path, f"{A100}_linear1_fp16.csv", text)
    with pytest.raises(MalformedFile, match=re.escape(f"{path}:{line}") + ".*" + problem):
        ett.replay(tmp_path, ReplayOptions())


def test_nccl_topology_must_match_the_file_name(tmp_path):
    path = _tree(
        tmp_path,
        f"{A100}_allreduce_fp16_2_4.csv",
        "shape,nodes,GPUsPerNode,dur(us)\n1024,2,4,10.0\n2048,1,4,11.0\n",
        kind="nccl",
    )
    with pytest.raises(MalformedFile, match=re.escape(f"{path}:3") + ".*file name says 2_4"):
        ett.replay(tmp_path, ReplayOptions())


def test_small_tree_converts_and_skips(tmp_path):
    _tree(tmp_path, f"{A100}.csv", "GPU,Function\nx,y\n")  # regressor summary: not read
    _tree(tmp_path, f"{A100}_res_add_fp16.csv", "b,l,dim,F_dur(us),B_dur(us)\n2,1024,2048,42.5,42.5\n")
    _tree(tmp_path, f"{A100}_softmax_fp16.csv", "mp,b,h,l,F_dur(us),B_dur(us)\n2,2,16,1024,10.0,12.0\n")
    _tree(tmp_path, f"{A100}_p2p_fp16_1_2.csv", "shape,nodes,GPUsPerNode,dur(us)\n1048576,1,2,50.0\n", kind="nccl")
    _tree(tmp_path, f"{A100}_alltoall_fp16_1_2.csv", "shape,nodes,GPUsPerNode,dur(us)\n1024,1,2,5.0\n", kind="nccl")
    result = ett.replay(tmp_path, ReplayOptions())
    assert result.files == 4 and len(result.rows) == 4
    add = next(r for r in result.rows if r["op"] == "elementwise")
    assert (add["numel"], add["fn"], add["direction"], add["time_s_median"]) == (1024 * 2 * 2048, "add", "fwd", 42.5e-6)
    soft = [r for r in result.rows if r["op"] == "softmax"]
    assert {(r["rows"], r["cols"], r["direction"]) for r in soft} == {
        (2 * 8 * 1024, 1024, "fwd"),
        (2 * 8 * 1024, 1024, "bwd"),
    }
    p2p = next(r for r in result.rows if r["op"] == "send_recv")
    assert p2p["bytes"] == 2 * 1048576 and math.isclose(p2p["busbw_gbps"], 2 * 1048576 / 50e-6 / 1e9)
    assert dict(result.skipped) == {
        "res_add B_dur: elementwise add has no backward kernel (the sampling function has no backward; B_dur repeats "
        "F_dur)": 1,
        "nccl file name not understood (<GPU>_<op>_<dtype>...)": 1,
    }


def test_whole_numbers_of_a_table_are_read_exactly():
    # through float, a size of 2**53 + 1 was read as 2**53
    path, row = Path("t.csv"), {"n": str(2**53 + 1), "f": "64.0", "e": "1e3", "x": "2.5", "blank": ""}
    assert whole(path, 2, row, "n") == 2**53 + 1
    assert whole(path, 2, row, "f") == 64 and whole(path, 2, row, "e") == 1000
    for column in ("x", "blank", "missing"):
        with pytest.raises(MalformedFile, match=f"column '{column}' is .*, not a whole number"):
            whole(path, 2, row, column)
