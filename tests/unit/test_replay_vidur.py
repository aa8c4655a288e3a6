"""The vidur replay importer: exact counts and hand-checked rows on the published data, and
malformed or unusual inputs on small hand-written files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from opcast.collect.info import summarise
from opcast.collect.replay import ReplayOptions, run_replay, vidur
from opcast.collect.replay.common import MalformedFile
from opcast.schema import read_dataset

DEVICES = {"a100": "A100-SXM4-80GB", "a40": "A40", "v100": "V100-SXM2-32GB"}
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


# --------------------------------------------------------------------------- the published data


@pytest.fixture(scope="module")
def vidur_root(published) -> Path:
    return published / "vidur"


@pytest.fixture(scope="module")
def replayed(vidur_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("vidur-replay")
    summary = run_replay("vidur", vidur_root, out)
    return summary, read_dataset(out / "vidur.parquet"), out


def _compute_keys(root: Path) -> tuple[int, int, set]:
    """(op cells, cells skipped by design, unique (device, op, shape) keys) of every mlp.csv,
    computed column-wise with pandas, independently of the importer's row loop."""
    cells = skipped = 0
    keys: set = set()
    for path in sorted(root.glob("data/profiling/compute/*/*/*/mlp.csv")):
        df = pd.read_csv(path)
        device = DEVICES[path.parts[-4]]
        ops = [c.split(".")[1] for c in df.columns if c.endswith(".median")]
        cells += len(df) * len(ops)
        phi = path.parent.name == "phi-2"
        t, tp = df.num_tokens, df.num_tensor_parallel_workers
        d = df.n_embd // df.n_head
        f = df.n_expanded_embd // tp
        gated = df.use_gated_mlp.astype(str) == "True"
        tp1 = tp == 1
        shapes = {
            "emb": ("embedding", {"tokens": t, "vocab": df.vocab_size // tp, "hidden": df.n_embd}),
            "attn_pre_proj": ("gemm", {"m": t, "n": (df.n_head + 2 * df.n_kv_head) * d // tp, "k": df.n_embd}),
            "attn_post_proj": ("gemm", {"m": t, "n": df.n_embd, "k": df.n_head * d // tp}),
            "mlp_up_proj": ("gemm", {"m": t, "n": f * (1 + gated.astype(int)), "k": df.n_embd}),
            "mlp_down_proj": ("gemm", {"m": t, "n": df.n_embd, "k": f}),
            "attn_rope": (
                "rope",
                {"tokens": t, "heads": (df.n_head + df.n_kv_head) // tp, "head_dim": d, "impl": "fused"},
            ),
            "mlp_act": ("elementwise", {"numel": t * f, "fn": gated.map({True: "swiglu", False: "gelu"})}),
        }
        for norm in ("input_layernorm", "post_attention_layernorm"):
            if norm in ops:
                shapes[norm] = ("layernorm" if phi else "rmsnorm", {"rows": t[tp1], "cols": df.n_embd[tp1]})
                skipped += int((~tp1).sum())
        if phi:
            skipped += len(df)  # the parallel block's add
        else:
            shapes["add"] = ("elementwise", {"numel": (t * df.n_embd)[tp1], "fn": pd.Series("add", index=t[tp1].index)})
            skipped += int((~tp1).sum())
        assert set(ops) == set(shapes) | ({"add"} if phi else set()), path
        for op, params in shapes.values():
            frame = pd.DataFrame(params).dropna()
            keys.update((device, op, *row) for row in frame.itertuples(index=False))
    return cells, skipped, keys


def _collective_keys(root: Path) -> tuple[int, int, set]:
    """(source rows, rows skipped by design, unique (device, op, bytes, world, nodes, gpus/node))."""
    rows = skipped = 0
    keys: set = set()
    paths = sorted(root.glob("data/profiling/network/*/*.csv")) + sorted(root.glob("_history/*/data/profiling/*/*.csv"))
    for path in paths:
        df = pd.read_csv(path)
        rows += len(df)
        folder = path.parent.name
        device = vidur.NETWORK_GPUS.get(folder) or DEVICES[folder if "_history" in path.parts else folder.split("_")[0]]
        if path.stem == "all_gather":
            skipped += len(df)
            continue
        if "size" in df.columns:
            gpn = df[["num_workers", "devices_per_node"]].min(axis=1)
            frame = pd.DataFrame(
                {"bytes": df["size"], "world": df.num_workers, "nodes": df.num_workers // gpn, "gpn": gpn}
            )
        else:
            empty = df.num_tokens == 0
            skipped += int(empty.sum())
            df = df[~empty]
            if path.stem == "all_reduce":
                frame = pd.DataFrame(
                    {"bytes": df.num_tokens * df.n_embd * 2, "world": df.num_workers, "nodes": 1, "gpn": df.num_workers}
                )
            else:
                inter = path.stem == "p2p_inter_node"
                frame = pd.DataFrame(
                    {
                        "bytes": df.num_tokens * df.n_embd * 2 // df.num_tensor_parallel_workers,
                        "world": 2,
                        "nodes": 2 if inter else 1,
                        "gpn": 1 if inter else 2,
                    }
                )
        op = "all_reduce" if path.stem == "all_reduce" else "send_recv"
        keys.update((device, op, *row) for row in frame.itertuples(index=False))
    return rows, skipped, keys


def test_counts_match_the_source(vidur_root, replayed):
    summary, df, _ = replayed
    cells, compute_skips, compute_keys = _compute_keys(vidur_root)
    coll_rows, coll_skips, coll_keys = _collective_keys(vidur_root)
    assert summary.files == 14 + 5 + 10
    own = {k: v for k, v in summary.skipped.items() if k != "duplicate" and "already read from" not in k}
    assert sum(own.values()) == compute_skips + coll_skips
    assert own == {
        vidur.REPLICATED: 31698,
        vidur.PARALLEL_ADD: 522,
        vidur.ALL_GATHER: 9558 * 2 + 9503,
        vidur.EMPTY_MESSAGE: 147,
    }
    collided = sum(v for k, v in summary.skipped.items() if "already read from" in k)
    assert summary.rows_read + sum(own.values()) + collided == cells + coll_rows
    # Every distinct configuration is written once; everything else is a counted duplicate.
    assert summary.rows_written == len(df) == len(compute_keys) + len(coll_keys)
    assert summary.rows_written == summary.rows_read - summary.skipped["duplicate"]
    assert not [k for k in summary.skipped if k.startswith("invalid")]


def test_hand_checked_rows(replayed):
    _, df, _ = replayed

    def one(**where):
        hit = df
        for k, v in where.items():
            hit = hit[hit[k] == v]
        assert len(hit) == 1, where
        return hit.iloc[0]

    # a100/meta-llama/Llama-2-7b-hf/mlp.csv line 393: num_tokens=1024, TP=2, attn_pre_proj median 0.224 ms;
    # fused QKV per rank: n = (32 + 2*32) * 128 / 2 = 6144, k = 4096.
    qkv = one(device="A100-SXM4-80GB", op="gemm", b=1, m=1024, n=6144, k=4096)
    assert qkv.time_s_median == 0.224 / 1e3
    assert (qkv["dtype"], qkv["direction"], bool(qkv["tensor_cores"]), qkv["n_reps"]) == ("fp16", "fwd", True, 20)
    assert qkv.source_file == "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
    assert qkv.timing_method == "replay:vidur:median20"

    # network/a100_dgx/all_reduce.csv line 6466: 16 workers, 8 per node, 13238272 B, median 1.701 ms.
    ar = one(device="A100-SXM4-80GB", op="all_reduce", bytes=13238272, world_size=16)
    assert (ar.nodes, ar.gpus_per_node, ar.n_reps) == (2, 8, 3)
    assert ar.time_s_median == 1.701 / 1e3
    assert ar.algbw_gbps == pytest.approx(7.782640799529688, rel=1e-12)
    assert ar.busbw_gbps == pytest.approx(7.782640799529688 * 2 * 15 / 16, rel=1e-12)

    # _history/c211fca/.../v100/p2p_intra_node.csv line 1930: n_embd 4096, 2048 tokens, TP 1,
    # median 0.4126720130443573 ms -> 4096*2048*2 = 16777216 B between 2 ranks of one node.
    p2p = one(device="V100-SXM2-32GB", op="send_recv", bytes=16777216, nodes=1)
    assert (p2p.world_size, p2p.gpus_per_node) == (2, 2)
    assert p2p.time_s_median == 0.4126720130443573 / 1e3
    assert p2p.busbw_gbps == p2p.algbw_gbps == pytest.approx(16777216 / (0.4126720130443573 / 1e3) / 1e9)

    # phi-2 is not gated: its activation is GELU over T x 10240 and its norm a LayerNorm.
    assert one(device="A40", op="elementwise", fn="gelu", numel=1024 * 10240).time_s_median > 0
    assert one(device="A40", op="layernorm", rows=1024, cols=2560).time_s_median > 0


def test_dataset_reads_back_with_every_gpu_and_op(replayed):
    _, df, out = replayed
    ops = {"gemm", "embedding", "rmsnorm", "layernorm", "rope", "elementwise", "all_reduce", "send_recv"}
    devices = set(DEVICES.values()) | set(vidur.NETWORK_GPUS.values())
    assert set(df.device) == devices and set(df.op) == ops
    assert set(df.dtype) == {"fp16"} and set(df.direction) == {"fwd"} and set(df.source) == {"replay:vidur"}
    table = summarise([out])
    assert set(table.device) == devices and set(table.op) == ops
    assert int(table.rows.sum()) == len(df)
    # A40 has no all_reduce in the current network data, but the c211fca history has one.
    assert {(d, o) for d, o in zip(table.device, table.op)} >= {("A40", "all_reduce"), ("V100-SXM2-32GB", "send_recv")}


# --------------------------------------------------------------------------- hand-written files

MLP_HEADER = [
    "time_stats.emb.median",
    "time_stats.attn_pre_proj.median",
    "time_stats.input_layernorm.median",
    "time_stats.mlp_up_proj.median",
    "time_stats.mlp_act.median",
    "time_stats.attn_kv_cache_save.median",
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
]


def _write(root: Path, rel: str, lines: list[str]) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _mlp(root: Path, *rows: str, model: str = "acme/tiny") -> Path:
    return _write(root, f"data/profiling/compute/a40/{model}/mlp.csv", [",".join(MLP_HEADER), *rows])


def test_small_mlp_file_mapping(tmp_path):
    _mlp(
        tmp_path,
        "0.1,0.2,0.3,0.4,0.5,0.6,8,2,512,1024,1000,True,16,2",
        "0.1,0.2,0.3,0.4,0.5,0.6,8,8,512,1024,1000,False,32,1",
    )
    result = vidur.replay(tmp_path, ReplayOptions())
    assert result.files == 1
    params = ("b", "m", "n", "k", "tokens", "vocab", "hidden", "numel", "fn")
    got = {(r["op"], *(r.get(p) for p in params)): r["time_s_median"] for r in result.rows}
    assert got == {
        # TP=2, 8 q heads, 2 kv heads, head dim 64, gated: QKV n = (8 + 2*2) * 64 / 2, up n = 2 * 1024 / 2.
        ("embedding", None, None, None, None, 16, 500, 512, None, None): 0.1 / 1e3,
        ("gemm", 1, 16, 384, 512, None, None, None, None, None): 0.2 / 1e3,
        ("gemm", 1, 16, 1024, 512, None, None, None, None, None): 0.4 / 1e3,
        ("elementwise", None, None, None, None, None, None, None, 16 * 512, "swiglu"): 0.5 / 1e3,
        # TP=1, 8 kv heads, not gated: QKV n = 3 * 512, up n = 1024, GELU over 32 x 1024.
        ("embedding", None, None, None, None, 32, 1000, 512, None, None): 0.1 / 1e3,
        ("gemm", 1, 32, 1536, 512, None, None, None, None, None): 0.2 / 1e3,
        ("gemm", 1, 32, 1024, 512, None, None, None, None, None): 0.4 / 1e3,
        ("elementwise", None, None, None, None, None, None, None, 32 * 1024, "gelu"): 0.5 / 1e3,
    }
    assert all(
        r["dtype"] == "fp16"
        and r["direction"] == "fwd"
        and r["device"] == "A40"
        and r["source_file"] == "data/profiling/compute/a40/acme/tiny/mlp.csv"
        for r in result.rows
    )
    assert result.skipped == {
        "vidur input_layernorm: block structure of acme/tiny unknown (not in vidur._MODELS)": 2,
        "vidur mlp.csv: unmapped column time_stats.attn_kv_cache_save": 2,
    }


def test_small_network_file(tmp_path):
    _write(
        tmp_path,
        "data/profiling/network/a40_pairwise_nvlink/all_reduce.csv",
        [
            ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,time_stats.all_reduce.median,"
            "time_stats.all_reduce.std,rank,num_workers,size,collective,devices_per_node,max_devices_per_node",
            "0,0.1,0.3,0.2,0.2,0.1,0,4,4000000,all_reduce,2,8",
            "1,0.1,0.3,0.2,0.25,0.1,0,2,4000000,all_reduce,4,8",
        ],
    )
    rows = vidur.replay(tmp_path, ReplayOptions()).rows
    assert [(r["world_size"], r["nodes"], r["gpus_per_node"]) for r in rows] == [(4, 2, 2), (2, 1, 2)]
    assert rows[0]["algbw_gbps"] == pytest.approx(4000000 / 0.2e-3 / 1e9)
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"] * 1.5)
    assert rows[0]["device"] == "A40"


def test_non_numeric_time_names_file_and_line(tmp_path):
    path = _mlp(
        tmp_path,
        "0.1,0.2,0.3,0.4,0.5,0.6,8,2,512,1024,1000,True,16,2",
        "0.1,fast,0.3,0.4,0.5,0.6,8,2,512,1024,1000,True,32,2",
    )
    with pytest.raises(MalformedFile, match=rf"{path}:3: column 'time_stats.attn_pre_proj.median'"):
        vidur.replay(tmp_path, ReplayOptions())


def test_ragged_line_names_file_and_line(tmp_path):
    path = _mlp(tmp_path, "0.1,0.2,0.3,0.4,0.5,0.6,8,2,512,1024,1000,True,16")
    with pytest.raises(MalformedFile, match=rf"{path}:2: 13 fields, the header has 14"):
        vidur.replay(tmp_path, ReplayOptions())


def test_missing_column_names_file_and_line(tmp_path):
    path = _write(tmp_path, "data/profiling/compute/a100/acme/tiny/mlp.csv", ["time_stats.emb.median,n_head", "0.1,8"])
    with pytest.raises(MalformedFile, match=rf"{path}:1: header lacks column\(s\) n_kv_head"):
        vidur.replay(tmp_path, ReplayOptions())


def test_tp_that_does_not_divide_heads_is_malformed(tmp_path):
    path = _mlp(tmp_path, "0.1,0.2,0.3,0.4,0.5,0.6,8,2,512,1024,1000,True,16,4")
    problem = "n_kv_head=2 is not a multiple of num_tensor_parallel_workers=4"
    with pytest.raises(MalformedFile, match=rf"{path}:2: {problem}"):
        vidur.replay(tmp_path, ReplayOptions())


def test_bad_boolean_and_bad_size(tmp_path):
    path = _mlp(tmp_path, "0.1,0.2,0.3,0.4,0.5,0.6,8,2,512,1024,1000,maybe,16,2")
    with pytest.raises(MalformedFile, match=rf"{path}:2: column 'use_gated_mlp'"):
        vidur.replay(tmp_path, ReplayOptions())
    path.unlink()
    net = _write(
        tmp_path,
        "data/profiling/network/a100_dgx/send_recv.csv",
        [",time_stats.send_recv.median,num_workers,size,devices_per_node", "0,0.1,2,12.5,1"],
    )
    with pytest.raises(MalformedFile, match=rf"{net}:2: column 'size' is '12.5', not a non-negative integer"):
        vidur.replay(tmp_path, ReplayOptions())
