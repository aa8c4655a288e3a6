"""The dataset schema: round trip, versioning, atomic writes and errors that name the file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opcast.errors import OpcastError
from opcast.schema import (
    SCHEMA_VERSION,
    VERSION_KEY,
    dataset_schema,
    point_id,
    read_dataset,
    read_table,
    required_columns,
    row_params,
    to_table,
    write_parquet,
)


def _rows():
    base = dict(
        run_id="r1", source="bench", device="cpu-test", timing_method="perf_counter", dtype="fp32", direction="fwd"
    )
    return [
        {
            **base,
            "op": "gemm",
            "b": 1,
            "m": 64,
            "n": 128,
            "k": 256,
            "time_s_median": 1e-4,
            "time_s_p20": 9e-5,
            "time_s_p80": 2e-4,
            "n_reps": 7,
        },
        {
            **base,
            "op": "attention",
            "batch": 2,
            "heads": 8,
            "kv_heads": 2,
            "seq_q": 128,
            "seq_kv": 128,
            "head_dim": 64,
            "causal": True,
            "impl": "sdpa",
            "time_s_median": 3e-4,
        },
        {
            **base,
            "op": "all_reduce",
            "bytes": 4096,
            "world_size": 2,
            "nodes": 1,
            "gpus_per_node": 2,
            "time_s_median": 5e-5,
            "algbw_gbps": 0.08,
            "busbw_gbps": 0.08,
            "source": "comm",
        },
    ]


def test_round_trip_keeps_values_types_and_version(tmp_path):
    path = write_parquet(_rows(), tmp_path / "d.parquet")
    assert pq.read_schema(path).metadata[VERSION_KEY] == str(SCHEMA_VERSION).encode()
    df = read_dataset(path)
    assert len(df) == 3 and list(df.columns) == dataset_schema().names
    assert row_params(df.iloc[0].to_dict()) == {"b": 1, "m": 64, "n": 128, "k": 256}
    assert bool(df.iloc[1]["causal"]) is True and df.iloc[1]["impl"] == "sdpa"
    assert df.iloc[2]["busbw_gbps"] == pytest.approx(0.08)
    assert df["m"].isna().sum() == 2  # other kinds leave gemm's columns null
    assert str(df["m"].dtype) == "Int64"  # nullable ints survive the trip


def test_point_id_is_filled_and_stable(tmp_path):
    df = read_dataset(write_parquet(_rows(), tmp_path / "d.parquet"))
    assert df.iloc[0]["point_id"] == point_id("gemm", {"b": 1, "m": 64, "n": 128, "k": 256}, "fp32", "fwd", None)
    assert point_id("gemm", {"k": 256, "b": 1, "m": 64.0, "n": 128}, "fp32", "fwd") == df.iloc[0]["point_id"]
    assert point_id("gemm", {"b": 1, "m": 64, "n": 128, "k": 256}, "fp32", "bwd") != df.iloc[0]["point_id"]


def test_folders_of_parts_are_merged(tmp_path):
    rows = _rows()
    write_parquet(rows[:1], tmp_path / "bench" / "rank0000-a-0000.parquet")
    write_parquet(rows[1:], tmp_path / "bench" / "rank0001-a-0000.parquet")
    assert len(read_dataset(tmp_path)) == 3


def test_a_file_named_twice_is_read_once(tmp_path):
    """The same file given twice, or a file and its folder, was read (and fitted, and scored) twice."""
    rows = _rows()
    part = write_parquet(rows[:1], tmp_path / "bench" / "rank0000-a-0000.parquet")
    write_parquet(rows[1:], tmp_path / "bench" / "rank0001-a-0000.parquet")
    assert len(read_dataset([part, part])) == 1
    assert len(read_dataset([part, tmp_path / "bench" / ".." / "bench" / part.name, tmp_path])) == 3


def test_missing_required_value_and_unknown_column_are_refused():
    rows = _rows()
    del rows[0]["time_s_median"]
    with pytest.raises(OpcastError, match="time_s_median"):
        to_table(rows)
    with pytest.raises(OpcastError, match="unknown dataset column"):
        to_table([{**_rows()[0], "latency_ms": 3.0}])
    with pytest.raises(OpcastError, match="do not fit"):
        to_table([{**_rows()[0], "m": "sixty-four"}])


def test_corrupt_file_is_named(tmp_path):
    write_parquet(_rows(), tmp_path / "good.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(OpcastError) as err:
        read_dataset(tmp_path)
    assert "bad.parquet" in str(err.value) and "\n" not in str(err.value)


def test_foreign_and_future_files_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(OpcastError, match=r"foreign.parquet has no opcast schema version"):
        read_table(tmp_path / "foreign.parquet")
    table = to_table(_rows()).replace_schema_metadata({VERSION_KEY: str(SCHEMA_VERSION + 1).encode()})
    pq.write_table(table, tmp_path / "future.parquet")
    with pytest.raises(OpcastError, match="newer than this opcast"):
        read_table(tmp_path / "future.parquet")
    no_time = to_table(_rows()).drop_columns(["time_s_median"])
    pq.write_table(no_time.replace_schema_metadata({VERSION_KEY: b"1"}), tmp_path / "short.parquet")
    with pytest.raises(OpcastError, match=r"short.parquet lacks required column"):
        read_table(tmp_path / "short.parquet")


@pytest.mark.parametrize("version", [b"one", b"1e400", b"1.0", b"-1", b"", b"\xff\xfe", b"\xd9\xa1"])
def test_a_version_that_is_not_a_whole_number_is_named(tmp_path, version):
    table = to_table(_rows()).replace_schema_metadata({VERSION_KEY: version})
    pq.write_table(table, tmp_path / "odd.parquet")
    with pytest.raises(
        OpcastError, match=r"odd.parquet: its opcast.schema_version metadata .* is not a whole number"
    ) as err:
        read_dataset(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"op": "nosuchop"}, "op 'nosuchop' is not one opcast knows"),
        ({"dtype": "int3"}, "dtype 'int3' is not one opcast knows"),
        ({"direction": "sideways"}, "direction 'sideways' is not one opcast knows"),
        ({"m": -64}, "gemm parameter m is -64 in 1 row(s), below its minimum 1"),
        ({"m": None}, "1 gemm row(s) lack parameter m"),
        ({"impl": "magic"}, "attention parameter impl 'magic' is not one of"),
    ],
)
def test_a_row_value_outside_the_registry_is_named(tmp_path, change, needle):
    """A file edited or written by another tool: its rows were summarised and scored as measurements."""
    rows = [{**r, "point_id": str(i)} for i, r in enumerate(_rows())]  # to_table would hash an unknown op
    (rows[1] if "impl" in change else rows[0]).update(change)
    pq.write_table(to_table(rows), tmp_path / "edited.parquet")
    with pytest.raises(OpcastError) as err:
        read_dataset(tmp_path)
    assert "edited.parquet" in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("column", "needle"),
    [
        ("op", "column op (op kind (opcast.ops registry)) is null in 2 row(s), where a value is required"),
        ("dtype", "column dtype (fp32 | tf32 | fp16 | bf16 | fp8 | fp8_block | nvfp4) is null in 2 row(s)"),
        ("direction", "column direction (fwd | bwd) is null in 2 row(s)"),
        ("time_s_median", "column time_s_median (median time of one call, seconds) is null in 2 row(s)"),
    ],
)
def test_a_null_required_value_is_named_with_its_count(tmp_path, column, needle):
    """A null op, dtype or direction passed the check of known values (it skipped nulls): the rows were read
    as measurements of no op. to_table refuses such rows; a file written by another tool can hold them."""
    table = to_table(_rows())
    index = table.schema.get_field_index(column)
    values = [None, None, *table[column].to_pylist()[2:]]
    field = table.schema.field(column).with_nullable(True)
    pq.write_table(table.set_column(index, field, pa.array(values, field.type)), tmp_path / "edited.parquet")
    with pytest.raises(OpcastError) as err:
        read_dataset(tmp_path)
    assert "edited.parquet" in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def test_a_folder_named_like_a_part_is_not_read(tmp_path):
    write_parquet(_rows(), tmp_path / "good.parquet")
    (tmp_path / "looks.parquet").mkdir()
    assert len(read_dataset(tmp_path)) == 3


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path):
    path = write_parquet(_rows(), tmp_path / "d.parquet")
    bad = _rows()
    bad[0]["m"] = "x"
    with pytest.raises(OpcastError):
        write_parquet(bad, path)
    assert len(read_dataset(path)) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["d.parquet"]  # no temp files left


def test_unwritable_destination_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OpcastError, match="cannot write"):
        write_parquet(_rows(), blocker / "sub" / "d.parquet")


def test_missing_dataset_path(tmp_path):
    with pytest.raises(OpcastError, match="does not exist"):
        read_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OpcastError, match="no parquet files"):
        read_dataset(tmp_path / "empty")


def test_required_columns_cover_provenance_and_timing():
    assert {"run_id", "source", "device", "op", "dtype", "direction", "time_s_median", "timing_method"} <= set(
        required_columns()
    )


def test_the_summary_of_an_empty_dataset_has_its_columns_and_no_rows(tmp_path):
    # a dataset of no rows (a bench run that measured nothing) made collect info die with KeyError 'rows', exit 1
    from opcast.collect.info import summarise

    table = pq.read_table(write_parquet(_rows(), tmp_path / "one.parquet"))
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    summary = summarise([tmp_path / "empty.parquet"])
    assert summary.empty and {"op", "device", "rows", "time_s_min"} <= set(summary.columns)
    assert int(summary["rows"].sum()) == 0


def test_a_file_that_is_not_parquet_is_not_advised_away(tmp_path):
    # a CSV given as a dataset was answered 'delete or re-create it': the user's own file, deleted on advice
    path = tmp_path / "kernels.csv"
    path.write_text("op,m\ngemm,64\n")
    with pytest.raises(OpcastError) as e:
        read_dataset(path)
    message = str(e.value)
    assert message.startswith(f"{path} is not a readable parquet file") and "opcast collect replay" in message
    assert "delete" not in message and "\n" not in message


def test_a_gemms_family_at_its_default_leaves_the_id_as_before_the_parameter():
    """The GEMM gained ``impl`` (opcast.ops.GEMM_IMPLS) after datasets of it existed: at its default, or without a
    value, a configuration's id is the one it had (resumable collections and the seeded draws over ids stay as
    they were); another family is another configuration. Attention's impl, always given, stays in its ids."""
    from opcast.schema import point_id

    shape = {"b": 1, "m": 64, "n": 128, "k": 256}
    before = "957db0329c5fc8fc"  # point_id of this configuration before the GEMM had impl
    ids = {
        point_id("gemm", {**shape, **extra}, "bf16", "fwd", True) for extra in ({}, {"impl": "cublas"}, {"impl": None})
    }
    assert ids == {before}
    assert point_id("gemm", {**shape, "impl": "vllm"}, "bf16", "fwd", True) != before
    attention = {"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 64, "seq_kv": 64, "head_dim": 64, "causal": True}
    flash = point_id("attention", {**attention, "impl": "flash"}, "bf16", "fwd", True)
    assert flash != point_id("attention", {**attention, "impl": "sdpa"}, "bf16", "fwd", True)
