"""NeuSight replay: the published data converted exactly (counts, hand-checked rows and runs),
and malformed or unexpected input named by file and line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from opcast.collect.info import summarise
from opcast.collect.replay import ReplayOptions, run_replay
from opcast.collect.replay.common import MalformedFile
from opcast.collect.replay.neusight import replay
from opcast.collect.replay.runs import read_runs
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.schema import read_dataset

ASPLOS = Path("neusight") / "scripts" / "asplos"
GPUS = {"A100-PCIe-40GB", "P100-PCIe-16GB", "P4", "T4", "V100-PCIe-32GB"}
ROWS_WRITTEN = 245_480
"""Distinct (device, opcast config) points in the published kernel CSVs, counted by hand once
and recomputed independently below."""
RUNS_WRITTEN = 40

_CACHE: dict[str, object] = {}


@pytest.fixture
def replayed(published: Path, tmp_path_factory: pytest.TempPathFactory):
    """run_replay over the published checkout, once per session (it takes a few seconds)."""
    if "summary" not in _CACHE:
        out = tmp_path_factory.mktemp("neusight-replay")
        _CACHE["summary"] = run_replay("neusight", published / "neusight", out)
        _CACHE["ops"] = read_dataset(out)
        _CACHE["runs"] = read_runs(out / "neusight-runs.parquet")
        _CACHE["out"] = out
    return _CACHE


def _source_counts(dataset: Path) -> tuple[int, int, int]:
    """(source rows, rows in NeuSight's merged files, distinct opcast points), with pandas."""
    wanted = {"OPName", "Device", "B", "M", "N", "K", "H"}
    frames, merged = [], 0
    for path in sorted(dataset.rglob("*.csv")):
        if "dims" in path.relative_to(dataset).parts:
            continue
        frame = pd.read_csv(path, usecols=lambda c: c in wanted)
        if path.relative_to(dataset).as_posix() in (
            "train/elem.csv",
            "train/ln.csv",
            "train/softmax.csv",
            "test/vec.csv",
        ):
            merged += len(frame)
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    device = df["Device"].map({d: get_device(d).name for d in df["Device"].unique()})
    gemm = df["OPName"].isin(["bmm", "linear"])
    linear = df["OPName"] == "linear"
    rowwise = df["OPName"].isin(["ln", "softmax"])
    ew = ~gemm & ~rowwise
    fn = df["OPName"].str.replace(r"^(add|mul|div|pow)u$", r"\1_scalar", regex=True)
    keys = (
        pd.DataFrame(
            {
                "device": device,
                "kind": fn.where(ew, df["OPName"].where(~gemm, "gemm")),
                "b": df["B"].where(gemm & ~linear, 1).where(gemm, 0),
                "m": (df["B"] * df["M"]).where(linear, df["M"]).where(gemm, 0),
                "n": df["K"].where(gemm, 0),
                "k": df["N"].where(gemm, 0),
                "rows": df["B"].where(rowwise, 0),
                "cols": df["H"].where(rowwise, 0),
                "numel": (df["B"] * df["H"]).where(ew, 0),
            }
        )
        .fillna(0)
        .astype({c: "int64" for c in ("b", "m", "n", "k", "rows", "cols", "numel")})
    )
    return len(df), merged, len(keys.drop_duplicates())


# --------------------------------------------------------------------------- published data


def test_counts_are_exact(replayed, published: Path) -> None:
    summary = replayed["summary"]
    total, merged, distinct = _source_counts(published / ASPLOS / "data" / "dataset")
    kernel_skips = {k: v for k, v in summary.skipped.items() if not k.startswith("label run")}
    assert distinct == ROWS_WRITTEN
    assert summary.rows_read == summary.rows_written == ROWS_WRITTEN
    assert summary.rows_read + sum(kernel_skips.values()) == total
    assert kernel_skips["shape measured again, already read from another file (NeuSight's merged CSVs)"] == merged
    assert "duplicate" not in summary.skipped  # the importer names every repeat itself

    labels = sorted((published / ASPLOS / "label").glob("*/*.json"))
    fusion = [p for p in labels if p.stem.endswith("-fusion")]
    assert summary.runs_written == len(labels) - len(fusion) == RUNS_WRITTEN
    assert summary.skipped["label run: torch.compile ('-fusion') run; the runs table has no compile flag"] == len(
        fusion
    )
    assert summary.files == len(labels) - len(fusion) + len(list((published / ASPLOS / "label").glob("*/*.csv"))) + sum(
        1 for p in (published / ASPLOS / "data" / "dataset").rglob("*.csv") if "dims" not in p.parts
    )


def _one(ops: pd.DataFrame, **where: object) -> pd.Series:
    mask = pd.Series(True, index=ops.index)
    for column, value in where.items():
        mask &= ops[column] == value
    assert mask.sum() == 1, where
    return ops[mask].iloc[0]


def _line(path: Path, number: int) -> str:
    return path.read_text().splitlines()[number - 1]


def test_bmm_row(replayed, published: Path) -> None:
    # bmm,0.035466667264699936,Tesla T4,...,volta_sgemm_64x64_nn,...,1,1,13,64,1,1,cu121,...,13,27,15,29
    path = published / ASPLOS / "data/dataset/train/collect/bmm/p2.1.0/Tesla T4.csv"
    assert _line(path, 2).startswith("bmm,0.035466667264699936,Tesla T4,") and _line(path, 2).endswith(",13,27,15,29")
    row = _one(replayed["ops"], device="T4", op="gemm", b=13, m=27, n=29, k=15)  # torch.bmm([13,27,15], [13,15,29])
    assert row["time_s_median"] == 0.035466667264699936 / 1e3
    assert (row["dtype"], row["direction"], bool(row["tensor_cores"])) == ("fp32", "fwd", False)
    assert (row["kernel_name"], row["grid"], row["block"]) == ("volta_sgemm_64x64_nn", "1,1,13", "64,1,1")
    assert row["source_file"] == "scripts/asplos/data/dataset/train/collect/bmm/p2.1.0/Tesla T4.csv"
    assert (row["timing_method"], row["torch_version"], row["cuda_version"]) == (
        "replay:neusight:mean_fastest5",
        "2.1.0",
        "12.1",
    )
    assert row["source"] == "replay:neusight"


def test_linear_row(replayed, published: Path) -> None:
    # linear,20.197440338134765,Tesla V100-PCIE-32GB,...,volta_sgemm_128x128_tn,...,8,256,1,256,1,1,cu121,,1,32768,4096,1024  # noqa: E501 (a verbatim line of the file)
    path = published / ASPLOS / "data/dataset/test/linear.csv"
    assert _line(path, 3).startswith("linear,20.197440338134765,Tesla V100-PCIE-32GB,")
    assert _line(path, 3).endswith(",1,32768,4096,1024")
    row = _one(replayed["ops"], device="V100-PCIe-32GB", op="gemm", b=1, m=32768, n=1024, k=4096)  # Linear(4096, 1024)
    assert row["time_s_median"] == 20.197440338134765 / 1e3
    assert (row["kernel_name"], row["grid"], row["block"]) == ("volta_sgemm_128x128_tn", "8,256,1", "256,1,1")
    assert row["source_file"] == "scripts/asplos/data/dataset/test/linear.csv"


def test_ln_and_scalar_rows(replayed, published: Path) -> None:
    ln = published / ASPLOS / "data/dataset/train/collect/ln/p2.1.0/Tesla T4.csv"
    assert _line(ln, 2).startswith("ln,0.05036799982190132,Tesla T4,") and _line(ln, 2).endswith(",60,272")
    row = _one(replayed["ops"], device="T4", op="layernorm", rows=60, cols=272)
    assert row["time_s_median"] == 0.05036799982190132 / 1e3
    assert (row["grid"], row["block"]) == ("60,1,1", "32,4,1")
    assert "vectorized_layer_norm_kernel" in row["kernel_name"]

    addu = published / ASPLOS / "data/dataset/train/collect/addu/p2.1.0/Tesla T4.csv"
    assert _line(addu, 2).startswith("addu,0.02486400045454502,Tesla T4,") and _line(addu, 2).endswith(",127,168")
    row = _one(replayed["ops"], device="T4", op="elementwise", fn="add_scalar", numel=127 * 168)
    assert row["time_s_median"] == 0.02486400045454502 / 1e3


def test_label_runs(replayed, published: Path) -> None:
    runs = replayed["runs"]
    assert len(runs) == RUNS_WRITTEN and set(runs["device"]) == GPUS
    assert set(runs["source"]) == {"replay:neusight"} and set(runs["dtype"]) == {"fp32"}
    run = runs[runs["source_file"] == "scripts/asplos/label/Tesla_V100-PCIE-32GB/bert_large-train-512-8.json"].iloc[0]
    # {"num_layer": 24, "e2e_latency": 841.1236450195313, "fw_latency": 298.737451171875, "bwall_latency": 542.3861938476563}  # noqa: E501 (a verbatim line of the file)
    assert (run["device"], run["model"], run["mode"], run["batch"], run["seq"], run["num_layers"]) == (
        "V100-PCIe-32GB",
        "bert_large",
        "train",
        8,
        512,
        24,
    )
    assert pd.isna(run["arch"])
    assert run["total_s"] == 841.1236450195313 / 1e3
    assert run["fwd_s"] == 298.737451171875 / 1e3
    assert run["bwd_s"] == 542.3861938476563 / 1e3
    ops = json.loads(run["ops_json"])
    with open(published / ASPLOS / "label/Tesla_V100-PCIE-32GB/bert_large-train-512-8.csv", newline="") as fh:
        assert len(ops) == sum(1 for _ in csv.DictReader(fh))
    dense = next(o for o in ops if o["name"] == "bert_encoder_layer_0_intermediate_dense")
    # ...,True,8.002527976268903,2.66975998878479,5.261299185687676,0.0714688017964363,...
    assert (dense["op"], dense["target"]) == ("call_module", "bert.encoder.layer.0.intermediate.dense")
    assert dense["fwd_s"] == 2.66975998878479 / 1e3
    assert dense["bwd_s"] == 5.261299185687676 / 1e3
    assert dense["acc_s"] == 0.0714688017964363 / 1e3

    inf = runs[runs["source_file"] == "scripts/asplos/label/Tesla_V100-PCIE-32GB/gpt3_27-inf-2048-2.json"].iloc[0]
    assert (inf["arch"], inf["mode"], inf["num_layers"], inf["fwd_s"]) == (
        "gpt3-2.7b",
        "inf",
        32,
        2292.841650390625 / 1e3,
    )
    assert pd.isna(inf["bwd_s"])
    switch = runs[runs["model"] == "switchxl4"]
    assert len(switch) and switch["num_layers"].isna().all() and switch["ops_json"].isna().all()


def test_dataset_reads_back(replayed) -> None:
    table = summarise([replayed["out"]])
    assert set(table["device"]) == GPUS
    assert set(table["op"]) == {"gemm", "elementwise", "layernorm", "softmax"}
    assert table["rows"].sum() == ROWS_WRITTEN
    for _, group in table.groupby("device"):
        assert set(group["op"]) == {"gemm", "elementwise", "layernorm", "softmax"}


# --------------------------------------------------------------------------- fixtures

HEADER_MM = (
    "OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,"
    "Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,Kernels,B,M,N,K"
)
HEADER_VEC = (
    "OPName,Latency,Device,Torch Version,CUDNN Version,Kernel Name,Warps per SM,Blocks per SM,"
    "Grid x,Grid y,Grid z,Block x,Block y,Block z,CUDA Version,B,H"
)


def _write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _checkout(root: Path) -> Path:
    data = "scripts/asplos/data/dataset"
    _write(
        root,
        f"{data}/train/collect/bmm/p2.1.0/Tesla T4.csv",
        HEADER_MM + "\n"
        "bmm,0.5,Tesla T4,p2.1.0,8902,k1,1,1,2,3,4,64,1,1,cu121,;k1,4,8,16,32\n"
        "bmm,0.7,Tesla T4,p2.1.0,8902,k1,1,1,2,3,4,64,1,1,cu121,;k1,4,8,16,32\n",
    )  # repeat in one file
    _write(
        root,
        f"{data}/train/collect/linear/p2.1.0/Tesla T4.csv",
        HEADER_MM + "\n"
        "linear,1.25,Tesla T4,p2.1.0,8902,k2,1,1,1,1,1,128,1,1,cu121,;k2,2,8,16,32\n"
        "conv,1.0,Tesla T4,p2.1.0,8902,k3,1,1,1,1,1,128,1,1,cu121,;k3,2,8,16,32\n"
        "linear,1.0,NVIDIA Z9000,p2.1.0,8902,k2,1,1,1,1,1,128,1,1,cu121,;k2,2,8,16,32\n",
    )
    _write(
        root,
        f"{data}/train/collect/mulu/p2.1.0/Tesla P4.csv",
        HEADER_VEC + "\n"
        "mulu,0.02,Tesla P4,p2.1.0,8902,k4,1,1,5,1,1,128,1,1,cu121,10,20\n"
        "mulu,0.03,Tesla P4,p2.1.0,8902,k4,1,1,5,1,1,128,1,1,cu121,20,10\n",
    )  # same numel
    _write(
        root,
        f"{data}/test/vec.csv",
        HEADER_VEC + "\n"
        "mulu,0.02,Tesla P4,p2.1.0,8902,k4,1,1,5,1,1,128,1,1,cu121,10,20\n"
        "softmax,0.04,Tesla P4,p2.1.0,8902,k5,1,1,7,1,1,32,4,1,cu121,7,300\n",
    )
    _write(root, f"{data}/dims/train_bmm.csv", "1;2;3;4\n")
    _write(
        root,
        "scripts/asplos/label/Tesla_T4/gpt2_large-inf-1024-4.json",
        json.dumps({"num_layer": 36, "e2e_latency": 2505.5, "fw_latency": 2505.5, "bwall_latency": 0}),
    )
    _write(
        root,
        "scripts/asplos/label/Tesla_T4/gpt2_large-train-1024-1.json",
        json.dumps({"num_layer": 36, "e2e_latency": 30.0, "fw_latency": 10.0, "bwall_latency": 20.0}),
    )
    _write(
        root,
        "scripts/asplos/label/Tesla_T4/gpt2_large-train-1024-1.csv",
        "op,target,input_shapes,latency,fw_latency,bw_latency,acc_latency,output_shape,dtype,Name\n"
        'call_module,transformer.h.0.ln_1,"[[1, 1024, 1280]]",0.5,0.125,0.25,0.125,"(1, 1024, '
        '1280)",torch.float32,ln_1\n',
    )
    _write(
        root,
        "scripts/asplos/label/Tesla_T4/gpt2_large-inf-1024-4-fusion.json",
        json.dumps({"num_layer": 36, "e2e_latency": 1.0, "fw_latency": 1.0, "bwall_latency": 0}),
    )
    return root


def test_fixture_mapping_and_skips(tmp_path: Path) -> None:
    result = replay(_checkout(tmp_path), ReplayOptions())
    rows = {(r["op"], r.get("fn")): r for r in result.rows}
    assert len(result.rows) == 4 and result.files == 7
    bmm = next(r for r in result.rows if r["op"] == "gemm" and r["b"] == 4)
    assert (bmm["m"], bmm["n"], bmm["k"], bmm["time_s_median"], bmm["grid"]) == (8, 32, 16, 0.5 / 1e3, "2,3,4")
    linear = next(r for r in result.rows if r["op"] == "gemm" and r["b"] == 1)
    assert (linear["m"], linear["n"], linear["k"], linear["time_s_median"]) == (16, 32, 16, 1.25 / 1e3)
    assert (
        rows["elementwise", "mul_scalar"]["numel"],
        rows["softmax", None]["rows"],
        rows["softmax", None]["cols"],
    ) == (200, 7, 300)
    assert result.skipped == {
        "shape measured again, already read from the same file": 1,
        "shape measured again, already read from another file (NeuSight's merged CSVs)": 1,
        "mulu: same opcast elementwise config as a shape already read (numel = B*H)": 1,
        "conv: opcast has no convolution op": 1,
        "device 'NVIDIA Z9000' not in the hardware catalog": 1,
        "label run: torch.compile ('-fusion') run; the runs table has no compile flag": 1,
    }
    inf, train = sorted(result.runs, key=lambda r: r["mode"])
    assert (inf["mode"], inf["total_s"], inf["bwd_s"], inf["ops_json"], inf["arch"]) == (
        "inf",
        2505.5 / 1e3,
        None,
        None,
        None,
    )
    assert (train["total_s"], train["fwd_s"], train["bwd_s"], train["batch"], train["seq"]) == (
        30.0 / 1e3,
        10.0 / 1e3,
        20.0 / 1e3,
        1,
        1024,
    )
    assert json.loads(train["ops_json"]) == [
        {
            "name": "ln_1",
            "op": "call_module",
            "target": "transformer.h.0.ln_1",
            "input_shapes": "[[1, 1024, 1280]]",
            "output_shape": "(1, 1024, 1280)",
            "fwd_s": 0.125 / 1e3,
            "bwd_s": 0.25 / 1e3,
            "acc_s": 0.125 / 1e3,
        }
    ]


def test_other_roots(tmp_path: Path) -> None:
    _checkout(tmp_path)
    data = replay(tmp_path / "scripts/asplos/data", ReplayOptions())
    assert len(data.rows) == 4 and not data.runs  # the labels sit beside data/, not in it
    assert data.rows[0]["source_file"].startswith("dataset/train/collect/")
    assert len(replay(tmp_path / "scripts/asplos", ReplayOptions()).runs) == 2
    one = replay(tmp_path / "scripts/asplos/data/dataset/test/vec.csv", ReplayOptions())
    assert len(one.rows) == 2 and one.rows[0]["source_file"] == "vec.csv"
    with pytest.raises(OpcastError, match="not a NeuSight checkout"):
        replay(tmp_path / "scripts", ReplayOptions())


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (
            HEADER_MM + "\nbmm,0.5,Tesla T4,p2.1.0,8902,k,1,1,1,1,1,1,1,1,cu121,,1,2,3,4\nbmm,fast,Tesla "
            "T4,p2.1.0,8902,k,1,1,1,1,1,1,1,1,cu121,,1,2,3,5\n",
            3,
            "'Latency'",
        ),
        (HEADER_MM + "\nbmm,0.5,Tesla T4,p2.1.0,8902,k,1,1,1,1,1,1,1,1,cu121,,1,2,3\n", 2, "fields"),
        (HEADER_MM + "\nbmm,0.5,Tesla T4,p2.1.0,8902,k,1,1,1,1,1,1,1,1,cu121,,1,2.5,3,4\n", 2, "not an integer"),
        ("Latency,Device,B,H\n0.5,Tesla T4,1,2\n", 1, "OPName"),
        (HEADER_VEC.replace(",H", "") + "\nadd,0.5,Tesla T4,p2.1.0,8902,k,1,1,1,1,1,1,1,1,cu121,3\n", 2, "'H'"),
    ],
)
def test_malformed_kernel_csv(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = _write(tmp_path, "scripts/asplos/data/dataset/train/collect/x/p2.1.0/Tesla T4.csv", text)
    with pytest.raises(MalformedFile, match=problem) as err:
        replay(tmp_path, ReplayOptions())
    assert str(err.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bert_large-inf-512-8.json", '{\n  "num_layer": 24,\n  "e2e_latency": ,\n}', ":3: not valid JSON"),
        (
            "bert_large-inf-512-8.json",
            '{"num_layer": 24, "fw_latency": 1.0, "bwall_latency": 0}',
            ": 'e2e_latency' is None",
        ),
        ("bert_large-inf-512-8.json", "[1, 2]", ":1: expected a JSON object"),
        # each escaped as an internal error, exit 1 (nested: a line naming no file)
        ("bert_large-inf-512-8.json", '{"num_layer": 1' + "0" * 5000 + "}", ": holds an integer of thousands"),
        ("bert_large-inf-512-8.json", "[" * 100_000 + "]" * 100_000, ": nested too deeply"),
        ("bert_large-inf-512-8.json", "\udcff", ": not UTF-8 text"),
    ],
)
def test_malformed_label(tmp_path: Path, name: str, text: str, where: str) -> None:
    path = tmp_path / f"scripts/asplos/label/Tesla_T4/{name}"
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # \udcff: the byte 0xff
    with pytest.raises(MalformedFile) as err:
        replay(tmp_path, ReplayOptions())
    assert str(err.value).startswith(f"{path}{where}")


def test_malformed_label_csv(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "scripts/asplos/label/Tesla_T4/bert_large-inf-512-8.json",
        '{"num_layer": 24, "e2e_latency": 1.0, "fw_latency": 1.0, "bwall_latency": 0}',
    )
    path = _write(
        tmp_path,
        "scripts/asplos/label/Tesla_T4/bert_large-inf-512-8.csv",
        "op,Name,fw_latency,bw_latency\ncall_module,dense,0.5,0\ncall_module,dense_1,n/a,0\n",
    )
    with pytest.raises(MalformedFile, match="'fw_latency'") as err:
        replay(tmp_path, ReplayOptions())
    assert str(err.value).startswith(f"{path}:3: ")
