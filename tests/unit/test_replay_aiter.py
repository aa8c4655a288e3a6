"""The AMD aiter replay importer (opcast.collect.replay.aiter) on a small synthetic checkout in the
layout of ROCm/aiter's ``aiter/configs`` (tests/fixtures/replay/aiter), and on a real checkout
when ``OPCAST_AITER`` names one (or its configs folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opcast.collect.replay import ReplayOptions, aiter, run_replay
from opcast.collect.replay.common import MalformedFile
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.schema import read_dataset

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "aiter"
CONFIGS = ROOT / aiter.CONFIGS


def _tables() -> pd.DataFrame:
    """Every fixture row with its file, read by pandas (independently of the importer)."""
    frames = []
    for path in sorted(CONFIGS.rglob("*.csv")):
        frame = pd.read_csv(path, dtype=str)
        frame.columns = [c.lower() for c in frame.columns]
        frames.append(frame.assign(file=path.name))
    return pd.concat(frames, ignore_index=True)


def _expected(tables: pd.DataFrame) -> pd.DataFrame:
    """The rows the importer should keep, selected independently of it: a GEMM table of bf16 or
    per-token fp8 on (gfx942, 304) or (gfx950, 256), a finite positive time, the fastest per shape."""
    gemm = tables.dropna(subset=["gfx", "m", "n", "k", "us"])
    bf16 = gemm.file.str.contains("bf16") & (gemm.outdtype.fillna("x") == gemm.dtype.fillna("x"))
    fp8 = gemm.file.str.contains("a8w8") & gemm.q_dtype_w.fillna("").str.startswith("torch.float8")
    block = gemm.file.str.contains("a8w8_blockscale")
    chip = list(zip(gemm.gfx, gemm.cu_num))
    keep = (
        (bf16 | fp8 | block)
        & ~gemm.file.str.contains("a4w4")
        & pd.Series([c in {("gfx942", "304"), ("gfx950", "256")} for c in chip], index=gemm.index)
        & (gemm.bias.fillna("False") == "False")
        & (gemm.us.astype(float).between(1e-9, 1e12))
    )
    kept = gemm[keep].assign(
        b=lambda f: f.b.fillna("1").astype(int),
        dtype=lambda f: (
            f.dtype.fillna("torch.bfloat16")
            .where(~f.file.str.contains("a8w8"), "fp8")
            .where(~f.file.str.contains("blockscale"), "fp8_block")
        ),
        us=lambda f: f.us.astype(float),
    )
    return kept.sort_values("us").drop_duplicates(["gfx", "cu_num", "b", "m", "n", "k", "dtype"])


def test_rows_and_skips_match_independent_counts() -> None:
    result = aiter.replay(ROOT)
    tables = _tables()
    expected = _expected(tables)
    assert len(result.rows) == len(expected) == 11
    assert sum(result.skipped.values()) + len(result.rows) == len(tables) == 25
    assert result.files == 9
    assert result.skipped[aiter.NOT_GEMM] == int(tables.gfx.isna().sum()) == 4
    assert result.skipped[aiter.MXFP4.format(family="a4w4")] == 1
    assert sorted((r["m"], r["device"]) for r in result.rows if r["dtype"] == "fp8_block") == [
        (16, "MI300X"),
        (1024, "MI355X"),
    ]
    assert result.skipped[aiter.SLOWER] == 2  # the two shapes both tables tuned on gfx950
    assert result.skipped[aiter.INT8] == 1 and result.skipped[aiter.A8W8_UNSTATED] == 1
    assert result.skipped[aiter.OUT_DTYPE] == result.skipped[aiter.BIAS] == result.skipped[aiter.NOT_A_TIME] == 1
    assert result.skipped["aiter gfx942 with 80 CUs: no catalog device"] == 1
    assert result.skipped["aiter gfx1250 with 256 CUs: no catalog device"] == 1
    got = sorted((r["b"], r["m"], r["n"], r["k"], round(r["time_s_median"] * 1e6, 6)) for r in result.rows)
    want = sorted((int(r.b), int(r.m), int(r.n), int(r.k), round(r.us, 6)) for r in expected.itertuples())
    assert got == want


def test_devices_dtypes_units_and_provenance() -> None:
    rows = pd.DataFrame(aiter.replay(ROOT).rows)
    assert set(zip(rows.device, rows.dtype)) == {
        ("MI300X", "bf16"),
        ("MI300X", "fp8"),
        ("MI300X", "fp8_block"),
        ("MI355X", "bf16"),
        ("MI355X", "fp16"),
        ("MI355X", "fp8"),
        ("MI355X", "fp8_block"),
    }
    fast = rows[(rows.m == 2048) & (rows.n == 6144) & (rows.k == 2048)].iloc[0]
    assert fast["time_s_median"] == pytest.approx(50.0e-6)  # the model config's 50 us beats 58.75 us
    assert fast["source_file"] == "aiter/configs/model_configs/llama70B_bf16_tuned_gemm.csv"
    assert fast["kernel_name"] == "aiter opus: opus_gemm_persistent_512x128x128x64"
    split = rows[rows.m == 1].iloc[0]
    assert split["kernel_name"] == "aiter asm: bf16gemm_tn_32x64_splitk splitK=2" and split["b"] == 1
    batched = rows[rows.b == 16]
    assert set(batched.device) == {"MI300X"} and set(batched.dtype) == {"bf16"} and len(batched) == 2
    assert rows.tensor_cores.all() and set(rows.direction) == {"fwd"} and rows.n_reps.isna().all()
    assert set(rows.timing_method) == {aiter.TIMING_METHOD}
    for row in rows.itertuples():  # every time is physical: under the dtype's dense peak
        peak = get_device(row.device).peak_flops(row.dtype)
        assert 2 * row.b * row.m * row.n * row.k / row.time_s_median <= peak, row


def test_device_names_the_product_of_its_chip() -> None:
    rows = pd.DataFrame(aiter.replay(ROOT, ReplayOptions(device="MI325X")).rows)
    assert set(rows.device) == {"MI325X", "MI355X"}  # only the CDNA 3 rows are relabelled
    with pytest.raises(OpcastError, match="matches no chip of the aiter tables"):
        aiter.replay(ROOT, ReplayOptions(device="H100-SXM"))


def test_run_replay_writes_the_dataset(tmp_path: Path) -> None:
    summary = run_replay("aiter", CONFIGS, tmp_path)  # the configs folder works too
    df = read_dataset(tmp_path / "aiter.parquet")
    assert len(df) == summary.rows_written == summary.rows_read == 11
    assert (df.source == "replay:aiter").all()
    one = run_replay("aiter", CONFIGS / "a8w8_bpreshuffle_tuned_gemm.csv", tmp_path / "one")  # and one CSV
    assert one.rows_written == 2 and one.skipped == {aiter.INT8: 1}


def test_malformed_gemm_table_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bf16_tuned_gemm.csv"
    path.write_text("gfx,cu_num,M,N,K,us\ngfx950,256,1,2,x,3.0\n")
    with pytest.raises(MalformedFile, match=r"bf16_tuned_gemm.csv:2: column 'k' is 'x', not a whole number"):
        aiter.replay(path)
    path.write_text("gfx,cu_num,M,N,K,us\ngfx950,256,1,2,3\n")
    with pytest.raises(MalformedFile, match=r"bf16_tuned_gemm.csv:2: 5 fields, the header has 6"):
        aiter.replay(path)


def test_a_folder_without_tables_exits_2_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "opcast", "collect", "replay", "aiter", str(tmp_path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opcast: error: ") and aiter.CONFIGS in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not os.environ.get("OPCAST_AITER"), reason="OPCAST_AITER (a ROCm/aiter checkout) not set")
def test_real_data_is_physical(tmp_path: Path) -> None:
    summary = run_replay("aiter", os.environ["OPCAST_AITER"], tmp_path)
    df = read_dataset(tmp_path / "aiter.parquet")
    assert summary.rows_written == len(df) > 0
    assert "MI355X" in set(df.device) and {"bf16", "fp8"} <= set(df.dtype)
    flops = 2 * df.b * df.m * df.n * df.k
    for device, dtype in set(zip(df.device, df.dtype)):
        part = (df.device == device) & (df.dtype == dtype)
        peak = getattr(get_device(device), f"peak_{dtype}_flops")
        assert (flops[part] / df.time_s_median[part]).max() <= peak, (device, dtype)
