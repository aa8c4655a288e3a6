"""The Liger-Kernel replay importer (opcast.collect.replay.liger) on a small synthetic CSV in the
layout of Liger-Kernel's benchmark/data/all_benchmark_data.csv (written here), and on the real
file when ``OPCAST_LIGER`` names a Liger-Kernel checkout or that CSV."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opcast.collect.replay import liger, run_replay
from opcast.collect.replay.common import MalformedFile
from opcast.hardware import get_device
from opcast.ops import get_op
from opcast.schema import read_dataset

A100, H100, RTX = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3090"
RMS = {"M": 2048, "dtype": "torch.bfloat16", "eps": 1e-6}
LN = {"M": 4096, "dtype": "torch.float32", "eps": 1e-6}
SM = {"M": 2048, "dtype": "torch.float32"}
CE = {"B": 8, "T": 2048}
MEG = {"S": 4096, "B": 1}


def _row(kernel, provider, mode, x, config, gpu=A100, *, metric="speed", x_name="H", y=1.0, version="0.2.1"):
    return {
        "kernel_name": kernel,
        "kernel_provider": provider,
        "kernel_operation_mode": mode,
        "metric_name": metric,
        "metric_unit": "ms" if metric == "speed" else "MB",
        "x_name": x_name,
        "x_label": "x",
        "x_value": x,
        "y_value_50": y,
        "y_value_20": 0.9 * y,
        "y_value_80": 1.1 * y,
        "extra_benchmark_config_str": json.dumps(config),
        "gpu_name": gpu,
        "timestamp": "2024-09-03 15:31:39",
        "liger_version": version,
    }


ROWS = [
    *(
        _row("rms_norm", p, m, x, RMS, y=0.1 * x / 1024)
        for p in ("liger", "huggingface")
        for m in ("forward", "backward", "full")
        for x in (1024, 4096)
    ),
    _row("rms_norm", "liger", "full", 1024, RMS, metric="memory"),
    _row("rms_norm", "apex", "forward", 1024, RMS),  # unknown provider
    _row("rms_norm", "liger", "forward", "llama_3_8b", {"seq_len": 1024, "eps": 1e-6}),  # model-config sweep
    *(
        _row("layer_norm", p, m, 2048, LN, H100, x_name="N", version="0.6.0")
        for p in ("liger", "huggingface")
        for m in ("forward", "backward")
    ),
    _row("layer_norm", "torch", "backward", 8192, LN, H100, x_name="N"),
    *(_row("softmax", p, "forward", 4096, SM, g, x_name="N") for p in ("liger", "torch") for g in (A100, RTX)),
    *(
        _row("cross_entropy", p, m, 32768, CE, x_name="V")
        for p in ("liger", "huggingface")
        for m in ("forward", "full")
    ),
    *(
        _row("megatron_rms_norm", p, m, 4096, MEG, H100)
        for p in ("liger", "torch", "megatron")
        for m in ("forward", "backward")
    ),
    _row("fused_add_rms_norm", "liger_rms_norm", "forward", 4096, {"M": 2048, "dtype": "torch.float32"}, H100),
]
"""The fixture: each kernel, provider, mode and skip reason the importer distinguishes."""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("liger")
    path = root / liger.CSV
    path.parent.mkdir(parents=True)
    frame = pd.DataFrame(ROWS)
    frame.to_csv(path, index=False)
    return root, pd.read_csv(path, dtype=str)


def _expected(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the importer should convert, selected independently of it."""
    known = {
        ("rms_norm", "liger"),
        ("rms_norm", "huggingface"),
        ("layer_norm", "liger"),
        ("layer_norm", "huggingface"),
        ("layer_norm", "torch"),
        ("softmax", "liger"),
        ("softmax", "torch"),
        ("cross_entropy", "huggingface"),
        ("megatron_rms_norm", "liger"),
        ("megatron_rms_norm", "torch"),
        ("megatron_rms_norm", "megatron"),
    }
    pair = list(zip(frame.kernel_name, frame.kernel_provider))
    keep = (
        (frame.metric_name == "speed")
        & frame.kernel_operation_mode.isin(["forward", "backward"])
        & pd.Series([p in known for p in pair], index=frame.index)
        & ~((frame.kernel_name == "megatron_rms_norm") & (frame.kernel_operation_mode == "backward"))
        & (frame.gpu_name != RTX)
        & frame.x_value.str.isdigit()
    )
    return frame[keep]


def test_rows_and_skips_match_independent_counts(source: tuple[Path, pd.DataFrame]) -> None:
    root, frame = source
    result = liger.replay(root)
    expected = _expected(frame)
    assert len(result.rows) == len(expected) == 19
    assert sum(result.skipped.values()) + len(result.rows) == len(frame)
    assert result.skipped[liger.FULL] == int(
        (
            (frame.kernel_operation_mode == "full")
            & (frame.metric_name == "speed")
            & frame.kernel_name.isin(liger.SHAPES)
        ).sum()
    )
    assert result.skipped[liger.MEMORY] == int((frame.metric_name == "memory").sum())
    assert result.skipped[liger.CE_LIGER] == 1 and result.skipped[liger.MEGATRON_BWD] == 3
    assert result.skipped[liger.MODEL_SWEEP] == 1
    assert result.skipped["liger rms_norm provider 'apex': implementation not known"] == 1
    assert result.skipped[f"liger GPU {RTX!r} not in the catalog"] == 2
    assert result.skipped["liger fused_add_rms_norm: no registry op of its own"] == 1


def test_liger_s_own_kernels_are_impl_liger_and_the_others_keep_their_labels(
    source: tuple[Path, pd.DataFrame],
) -> None:
    # Liger's Triton kernels are an implementation of their own (not Apex / TE "fused"): counted against
    # the fixture's liger-provider rows the importer should convert, selected independently of it
    root, frame = source
    rows = pd.DataFrame(liger.replay(root).rows)
    expected = _expected(frame)
    provider = rows.kernel_name.str.rsplit("/", n=1).str[1]
    assert int((rows.impl == "liger").sum()) == int((expected.kernel_provider == "liger").sum()) == 8
    assert (provider[rows.impl == "liger"] == "liger").all()
    assert "fused" not in set(rows.impl)
    assert set(rows.impl[provider != "liger"]) == {"unfused", "native"}


def test_impls_shapes_units_and_devices(source: tuple[Path, pd.DataFrame]) -> None:
    root, _ = source
    rows = pd.DataFrame(liger.replay(root).rows)
    impl = {(r.kernel_name.split(": ")[1], r.op): r.impl for r in rows.itertuples()}
    assert impl == {
        ("rms_norm/liger", "rmsnorm"): "liger",
        ("rms_norm/huggingface", "rmsnorm"): "unfused",
        ("layer_norm/liger", "layernorm"): "liger",
        ("layer_norm/huggingface", "layernorm"): "native",
        ("layer_norm/torch", "layernorm"): "native",
        ("softmax/liger", "softmax"): "liger",
        ("softmax/torch", "softmax"): "native",
        ("cross_entropy/huggingface", "cross_entropy"): "native",
        ("megatron_rms_norm/liger", "rmsnorm"): "liger",
        ("megatron_rms_norm/torch", "rmsnorm"): "native",
        ("megatron_rms_norm/megatron", "rmsnorm"): "native",
    }
    rms = rows[rows.kernel_name.str.endswith(": rms_norm/liger")]
    assert set(zip(rms["rows"], rms["cols"], rms["dtype"], rms["device"])) == {
        (2048, 1024, "bf16", "A100-SXM4-80GB"),
        (2048, 4096, "bf16", "A100-SXM4-80GB"),
    }
    meg = rows[rows.kernel_name.str.startswith("liger 0.2.1: megatron")]
    assert set(zip(meg["rows"], meg["cols"], meg["dtype"], meg["device"], meg["direction"])) == {
        (4096, 4096, "bf16", "H100-SXM", "fwd")
    }
    ce = rows[rows.op == "cross_entropy"].iloc[0]
    assert (ce["tokens"], ce["vocab"], ce["dtype"], ce["direction"]) == (16384, 32768, "fp32", "fwd")
    ln = rows[(rows.op == "layernorm") & (rows["cols"] == 2048)]
    assert set(ln["dtype"]) == {"fp32"} and set(ln["rows"]) == {4096} and set(ln["device"]) == {"H100-SXM"}
    big = rows[(rows.op == "rmsnorm") & (rows["cols"] == 4096) & (rows.device == "A100-SXM4-80GB")].iloc[0]
    assert big["time_s_median"] == pytest.approx(0.4e-3)  # 0.4 ms
    assert big["time_s_p20"] == pytest.approx(0.36e-3) and big["time_s_p80"] == pytest.approx(0.44e-3)
    assert set(rows.timing_method) == {liger.TIMING_METHOD} and rows.n_reps.isna().all()
    assert set(rows.source_file) == {liger.CSV}


def test_run_replay_writes_the_dataset_and_drops_the_megatron_duplicate(
    source: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    root, frame = source
    summary = run_replay("liger", root / liger.CSV, tmp_path)  # the CSV itself works too
    assert summary.rows_read == len(_expected(frame))
    assert summary.skipped["duplicate"] == 1  # megatron's WrappedTorchNorm is torch's nn.RMSNorm
    df = read_dataset(tmp_path / "liger.parquet")
    assert len(df) == summary.rows_written == summary.rows_read - 1
    assert (df.source == "replay:liger").all()


def test_malformed_csv_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "all_benchmark_data.csv"
    pd.DataFrame(ROWS).drop(columns=["gpu_name"]).to_csv(path, index=False)
    with pytest.raises(MalformedFile, match=r"all_benchmark_data.csv:1: header lacks column\(s\) gpu_name"):
        liger.replay(path)
    pd.DataFrame([{**ROWS[0], "extra_benchmark_config_str": "{M: 1"}]).to_csv(path, index=False)
    with pytest.raises(MalformedFile, match=r"all_benchmark_data.csv:2: extra_benchmark_config_str is not JSON"):
        liger.replay(path)
    # an integer past Python's int-from-string limit, and a nesting past the recursion limit (an internal error, exit 1,
    # and a message naming no file)
    pd.DataFrame([{**ROWS[0], "extra_benchmark_config_str": '{"M": 1' + "0" * 5000 + "}"}]).to_csv(path, index=False)
    with pytest.raises(MalformedFile, match=r"all_benchmark_data.csv:2: .* an integer of thousands of digits"):
        liger.replay(path)
    pd.DataFrame([{**ROWS[0], "extra_benchmark_config_str": "[" * 20000 + "]" * 20000}]).to_csv(path, index=False)
    with pytest.raises(MalformedFile, match=r"all_benchmark_data.csv:2: .* nested too deeply"):
        liger.replay(path)


@pytest.mark.parametrize("source", ["liger", "aiter", "neusight"])
def test_a_binary_csv_is_refused_naming_the_file(source: str, tmp_path: Path) -> None:
    """The CSV reader every source shares: a binary file is a one-line error naming the file (it
    escaped as a UnicodeDecodeError, an internal error, exit 1)."""
    path = tmp_path / "binary.csv"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(MalformedFile, match=r"binary.csv: not UTF-8 text \(a binary file\?\)"):
        run_replay(source, path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_field_past_the_csv_limit_is_refused_and_a_bom_read_past(tmp_path: Path) -> None:
    path = tmp_path / "all_benchmark_data.csv"
    pd.DataFrame([{**ROWS[0], "extra_benchmark_config_str": "x" * 200_000}]).to_csv(path, index=False)
    with pytest.raises(MalformedFile, match=r"all_benchmark_data.csv:2: not a readable CSV \(field larger"):
        liger.replay(path)
    pd.DataFrame(ROWS[:1]).to_csv(path, index=False, encoding="utf-8-sig")  # as Excel saves it
    assert len(liger.replay(path).rows) == 1


def test_a_folder_without_the_csv_exits_2_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "opcast", "collect", "replay", "liger", str(tmp_path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: ") and liger.CSV in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(
    not os.environ.get("OPCAST_LIGER"), reason="OPCAST_LIGER (a Liger-Kernel checkout or its CSV) not set"
)
def test_real_data_is_physical(tmp_path: Path) -> None:
    summary = run_replay("liger", os.environ["OPCAST_LIGER"], tmp_path)
    df = read_dataset(tmp_path / "liger.parquet")
    assert summary.rows_written == len(df) > 0
    assert {"A100-SXM4-80GB", "H100-SXM"} <= set(df.device)
    assert {(o, i) for o, i in zip(df.op, df.impl)} >= {
        ("rmsnorm", "liger"),
        ("rmsnorm", "unfused"),
        ("layernorm", "native"),
    }
    for row in df.to_dict("records"):  # no time below the compulsory bytes at the peak bandwidth
        spec = get_op(row["op"])
        params = {k: row[k] for k in spec.param_names}
        nbytes = spec.bytes_moved(params, {"bf16": 2, "fp16": 2, "fp32": 4}[row["dtype"]], row["direction"])
        assert nbytes / row["time_s_median"] <= get_device(row["device"]).mem_bw_bytes_per_s, row
