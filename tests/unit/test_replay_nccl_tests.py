"""Replay of nccl-tests output (opcast.collect.replay.nccl_tests) on hand-written logs.

Fixtures in ``tests/fixtures/replay/``, formatted as nccl-tests' util.cu prints them:
``all_reduce_perf_8xA100.txt`` (newer output, one process driving 8 A100s, float, 8 B..128 MiB),
``all_gather_perf_2x8xH100.log`` (older output without the 'Collective test starting' line, 16 MPI
ranks on two hosts, bfloat16, NCCL INFO lines mixed in) and ``sendrecv_perf.txt`` (2 H100s, in-place
``#wrong`` is N/A).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from opcast.collect.info import summarise
from opcast.collect.replay import ReplayOptions, run_replay
from opcast.collect.replay.common import MalformedFile
from opcast.collect.replay.nccl_tests import replay
from opcast.errors import OpcastError
from opcast.schema import read_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
ALL_REDUCE = FIXTURES / "all_reduce_perf_8xA100.txt"
ALL_GATHER = FIXTURES / "all_gather_perf_2x8xH100.log"
SENDRECV = FIXTURES / "sendrecv_perf.txt"


def _table_lines(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of the data lines, counted independently of the importer."""
    return [
        (n, line.split())
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if re.match(r"^\s+\d+\s+\d+\s+\w+\s", line)
    ]


def _row(rows: list[dict], size: int) -> dict:
    (row,) = [r for r in rows if r["bytes"] == size]
    return row


def test_all_reduce_8_gpus_one_node():
    result = replay(ALL_REDUCE, ReplayOptions())
    lines = _table_lines(ALL_REDUCE)
    assert len(lines) == 25 and len(result.rows) == len(lines)
    assert result.files == 1 and not result.skipped
    assert {
        (r["op"], r["device"], r["dtype"], r["world_size"], r["nodes"], r["gpus_per_node"], r["n_reps"])
        for r in result.rows
    } == {("all_reduce", "A100-SXM4-80GB", "fp32", 8, 1, 8, 20)}
    # hand-checked: "   134217728      33554432     float     sum      -1   604.89  221.89  388.30       0 ..."
    row = _row(result.rows, 134217728)
    assert row["time_s_median"] == 604.89 / 1e6
    assert row["algbw_gbps"] == pytest.approx(134217728 / 604.89e-6 / 1e9, rel=1e-12)
    assert row["busbw_gbps"] == pytest.approx(388.30, abs=0.005)  # the file's value, ours from 2(n-1)/n
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.75, rel=1e-12)
    assert (row["direction"], row["tensor_cores"], row["timing_method"]) == (
        "fwd",
        None,
        "replay:nccl-tests:out-of-place",
    )
    assert row["source_file"] == ALL_REDUCE.name
    assert "time_s_p20" not in row
    assert _row(result.rows, 8)["time_s_median"] == 24.55 / 1e6


def test_all_gather_16_ranks_on_2_hosts():
    result = replay(ALL_GATHER, ReplayOptions())
    assert len(result.rows) == len(_table_lines(ALL_GATHER)) == 6 and not result.skipped
    assert {
        (r["op"], r["device"], r["dtype"], r["world_size"], r["nodes"], r["gpus_per_node"]) for r in result.rows
    } == {("all_gather", "H100-SXM", "bf16", 16, 2, 8)}
    # "  1073741824      33554432  bfloat16    none      -1  22208.0   48.35   45.33       0 ..."
    row = _row(result.rows, 1073741824)
    assert row["time_s_median"] == 22208.0 / 1e6
    assert row["busbw_gbps"] == pytest.approx(45.33, abs=0.005)
    assert row["busbw_gbps"] == pytest.approx(1073741824 / 22208.0e-6 / 1e9 * 15 / 16, rel=1e-12)


def test_sendrecv_two_gpus():
    result = replay(SENDRECV, ReplayOptions())
    assert len(result.rows) == len(_table_lines(SENDRECV)) == 7 and not result.skipped
    row = _row(result.rows, 33554432)
    assert (row["op"], row["world_size"], row["nodes"], row["gpus_per_node"], row["n_reps"]) == (
        "send_recv",
        2,
        1,
        2,
        50,
    )
    assert row["time_s_median"] == 102.44 / 1e6
    assert row["busbw_gbps"] == row["algbw_gbps"] == pytest.approx(33554432 / 102.44e-6 / 1e9, rel=1e-12)


def test_folder_run_replay_and_info(tmp_path):
    logs = tmp_path / "logs" / "cluster-a"
    logs.mkdir(parents=True)
    for path in (ALL_REDUCE, ALL_GATHER, SENDRECV):
        shutil.copy(path, logs / path.name)
    summary = run_replay("nccl-tests", tmp_path / "logs", tmp_path / "out")
    total = sum(len(_table_lines(p)) for p in (ALL_REDUCE, ALL_GATHER, SENDRECV))
    assert (summary.files, summary.rows_read, summary.rows_written) == (3, total, total)
    frame = read_dataset([tmp_path / "out" / "nccl-tests.parquet"])
    assert len(frame) == total and set(frame["source"]) == {"replay:nccl-tests"}
    assert set(frame["source_file"]) == {f"cluster-a/{p.name}" for p in (ALL_REDUCE, ALL_GATHER, SENDRECV)}
    table = summarise([tmp_path / "out"])
    assert set(zip(table["op"], table["device"])) == {
        ("all_reduce", "A100-SXM4-80GB"),
        ("all_gather", "H100-SXM"),
        ("send_recv", "H100-SXM"),
    }


def test_a_second_input_does_not_replace_the_first(tmp_path):
    """OUT/nccl-tests.parquet is replaced by a re-run of the same log, never by another log's rows."""
    out = tmp_path / "out"
    run_replay("nccl-tests", ALL_REDUCE, out)
    before = (out / "nccl-tests.parquet").read_bytes()
    with pytest.raises(OpcastError, match="already holds the rows replayed from another input") as err:
        run_replay("nccl-tests", ALL_GATHER, out)
    assert f"such as {out / 'all_gather_perf_2x8xH100'} works" in str(err.value)
    assert (out / "nccl-tests.parquet").read_bytes() == before
    run_replay("nccl-tests", ALL_GATHER, out / "all_gather")  # a subfolder is part of the dataset
    assert set(summarise([out])["op"]) == {"all_reduce", "all_gather"}
    assert run_replay("nccl-tests", ALL_REDUCE, out).rows_written == len(_table_lines(ALL_REDUCE))  # a re-run
    (out / "nccl-tests.parquet").write_text("mine")  # a file of the user's
    with pytest.raises(OpcastError, match="a file that is not a dataset replayed from this input"):
        run_replay("nccl-tests", ALL_REDUCE, out)
    assert (out / "nccl-tests.parquet").read_text() == "mine"


def test_nothing_converted_names_the_reason(tmp_path):
    """A replay whose every row is skipped says why (here an option the log contradicts), not just a count."""
    with pytest.raises(OpcastError, match="all 25 rows read were skipped, 25 as 'all_reduce: world size 8 does not "):
        run_replay("nccl-tests", ALL_REDUCE, tmp_path / "out", ReplayOptions(nodes=3))
    with pytest.raises(OpcastError, match=r"25 as 'invalid all_reduce: world_size=8 != nodes=3 x gpus_per_node=5'"):
        run_replay("nccl-tests", ALL_REDUCE, tmp_path / "out", ReplayOptions(world_size=8, nodes=3, gpus_per_node=5))
    assert not (tmp_path / "out").exists()


def _edit(
    tmp_path: Path, source: Path, size: int, column: int, value: str, name: str | None = None
) -> tuple[Path, int]:
    """A copy of ``source`` with field ``column`` of the ``size`` line replaced (None removes it)."""
    lines = source.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        fields = line.split()
        if fields and fields[0] == str(size) and len(fields) > 10:
            if value is None:
                del fields[column]
            else:
                fields[column] = value
            lines[i] = "  ".join(fields) + "\n"
            path = tmp_path / (name or source.name)
            path.write_text("".join(lines))
            return path, i + 1
    raise AssertionError(f"no line for size {size}")


def test_garbled_and_ragged_lines_name_file_and_line(tmp_path):
    path, number = _edit(tmp_path, ALL_REDUCE, 1048576, 7, "5x.19")
    with pytest.raises(
        MalformedFile, match=rf"^{re.escape(str(path))}:{number}: column 'busbw' is '5x.19', not a number"
    ):
        replay(path, ReplayOptions())
    path, number = _edit(tmp_path, ALL_REDUCE, 2048, 9, None)
    with pytest.raises(
        MalformedFile, match=rf"^{re.escape(str(path))}:{number}: 12 fields, the table header \(line 17\) has 13"
    ):
        replay(path, ReplayOptions())
    path, number = _edit(tmp_path, ALL_REDUCE, 4194304, 6, "8.38")  # algbw no longer size/time
    with pytest.raises(MalformedFile, match=rf":{number}: algbw 8.38 GB/s disagrees with size/time"):
        replay(path, ReplayOptions())


def test_wrong_results_are_skipped(tmp_path):
    path, _ = _edit(tmp_path, ALL_REDUCE, 65536, 8, "3")
    result = replay(path, ReplayOptions())
    assert len(result.rows) == 24
    assert dict(result.skipped) == {"all_reduce: #wrong > 0 (nccl-tests data check failed)": 1}
    assert not [r for r in result.rows if r["bytes"] == 65536]


def test_collective_from_the_file_name_or_an_error(tmp_path):
    text = ALL_GATHER.read_text()  # no 'Collective test starting' line
    unnamed = tmp_path / "run17.log"
    unnamed.write_text(text)
    first = next(n for n, _ in _table_lines(unnamed))
    with pytest.raises(MalformedFile, match=rf"run17\.log:{first}: cannot tell which nccl-tests binary"):
        replay(unnamed, ReplayOptions())
    spelled = tmp_path / "nccl-allgather-2nodes.log"
    spelled.write_text(text)
    assert {r["op"] for r in replay(spelled, ReplayOptions()).rows} == {"all_gather"}
    # named all_reduce, but the table has no reduction (redop none): nothing is replayed
    misnamed = tmp_path / "all_reduce_perf.log"
    misnamed.write_text(text)
    assert replay(misnamed, ReplayOptions()).skipped == {"all_reduce: redop none (opcast models sum)": 6}
    # claimed reduce_scatter, but busbw/algbw = 1.75 is the all_reduce factor over 8 ranks: rejected at the first
    # line where algbw >= 1 GB/s (below it the file's rounded values cannot tell)
    wrong = tmp_path / "claimed.txt"
    wrong.write_text(ALL_REDUCE.read_text().replace("starting: all_reduce_perf", "starting: reduce_scatter_perf"))
    number = next(n for n, fields in _table_lines(wrong) if float(fields[6]) >= 1.0)
    with pytest.raises(
        MalformedFile,
        match=rf"claimed\.txt:{number}: busbw/algbw = 1.75\d but reduce_scatter over 8 ranks "
        r"has factor 0.875: wrong collective or world size",
    ):
        replay(wrong, ReplayOptions())


def test_topology_overrides(tmp_path):
    text = "".join(line for line in ALL_REDUCE.read_text().splitlines(keepends=True) if "Rank" not in line)
    bare = tmp_path / "all_reduce_perf_bare.txt"
    bare.write_text(text)
    result = replay(bare, ReplayOptions(device="A100-SXM4-80GB"))
    assert not result.rows
    assert result.skipped == {
        "all_reduce: world size unknown: no '#  Rank ...' lines; pass --world-size (and --nodes)": 25
    }
    rows = replay(bare, ReplayOptions(device="A100-SXM4-80GB", world_size=8, gpus_per_node=8)).rows
    assert {(r["world_size"], r["nodes"], r["gpus_per_node"]) for r in rows} == {(8, 1, 8)}
    with pytest.raises(MalformedFile, match=r"no '#  Rank ... device' lines name the GPU; pass --device"):
        replay(bare, ReplayOptions(world_size=8, nodes=1))
    # the factor check catches a wrong override: nccl-tests ran 8 ranks, not 16
    with pytest.raises(MalformedFile, match="all_reduce over 16 ranks"):
        replay(ALL_REDUCE, ReplayOptions(world_size=16, nodes=2))
    rows = replay(ALL_GATHER, ReplayOptions(device="H200", nodes=4)).rows
    assert {(r["device"], r["world_size"], r["nodes"], r["gpus_per_node"]) for r in rows} == {("H200", 16, 4, 4)}


def test_unknown_gpu_asks_for_device(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(ALL_REDUCE.read_text().replace("NVIDIA A100-SXM4-80GB", "NVIDIA Graphics Device"))
    with pytest.raises(
        MalformedFile,
        match=r"all_reduce_perf\.txt:6: GPU 'NVIDIA Graphics Device' is not in the hardware catalog; pass --device",
    ):
        replay(path, ReplayOptions())
    assert {r["device"] for r in replay(path, ReplayOptions(device="A100-SXM4-80GB")).rows} == {"A100-SXM4-80GB"}


def test_repeated_runs_give_median_and_quantiles(tmp_path):
    path = tmp_path / "all_reduce_perf_cycles.txt"
    text = ALL_REDUCE.read_text()
    # three runs in one log; the second has one size 2 us slower (time, algbw and busbw consistent)
    slow = text.replace("   604.89  221.89  388.30", "   606.89  221.16  387.03", 1)
    path.write_text(text + slow + text)
    rows = replay(path, ReplayOptions()).rows
    assert len(rows) == 25
    row = _row(rows, 134217728)
    assert row["n_reps"] == 60
    assert row["time_s_median"] == 604.89 / 1e6
    assert row["time_s_p20"] == pytest.approx(604.89e-6, rel=1e-12)
    assert row["time_s_p80"] == pytest.approx((604.89 + 0.6 * 2.0) * 1e-6, rel=1e-9)


def test_other_types_and_binaries_are_skipped(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(
        ALL_REDUCE.read_text()
        .replace("     float     sum", "    double     sum", 3)
        .replace("     float     sum", "     float    prod", 2)
    )
    result = replay(path, ReplayOptions())
    assert len(result.rows) == 20
    assert dict(result.skipped) == {
        "all_reduce: type double (opcast tracks float, half, bfloat16)": 3,
        "all_reduce: redop prod (opcast models sum)": 2,
    }
    gather = tmp_path / "gather_perf.txt"
    gather.write_text(
        ALL_REDUCE.read_text().replace(
            "Collective test starting: all_reduce_perf", "Collective test starting: gather_perf"
        )
    )
    assert replay(gather, ReplayOptions()).skipped == {"gather_perf: no opcast collective for it": 25}


def test_no_table_in_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("NCCL version 2.18.5+cuda12.2\nsome unrelated text\n")
    with pytest.raises(MalformedFile, match=r"notes\.txt: no nccl-tests results table"):
        replay(path, ReplayOptions())
    shutil.copy(SENDRECV, tmp_path / SENDRECV.name)
    result = replay(tmp_path, ReplayOptions())
    assert result.skipped == {"file without an nccl-tests table": 1} and len(result.rows) == 7


OLD_OUTPUT = """\
# nThread 1 nGpus 4 minBytes 8 maxBytes 262144 step: 32(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  21014 on    dgx1-03 device  0 [0x06] Tesla V100-SXM2-32GB
#   Rank  1 Pid  21014 on    dgx1-03 device  1 [0x07] Tesla V100-SXM2-32GB
#   Rank  2 Pid  21014 on    dgx1-03 device  2 [0x0a] Tesla V100-SXM2-32GB
#   Rank  3 Pid  21014 on    dgx1-03 device  3 [0x0b] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    12.31    0.00    0.00  0e+00    12.10    0.00    0.00  0e+00
         256            64   float     sum    12.95    0.02    0.03  0e+00    12.80    0.02    0.03  0e+00
        8192          2048   float     sum    15.02    0.55    0.82  0e+00    14.90    0.55    0.82  0e+00
      262144         65536   float     sum    27.60    9.50   14.25  0e+00    27.41    9.56   14.35  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 3.77
"""


def test_old_output_without_group_root_and_wrong_columns(tmp_path):
    path = tmp_path / "all_reduce_perf.log"
    path.write_text(OLD_OUTPUT)
    result = replay(path, ReplayOptions())
    assert len(result.rows) == 4 and not result.skipped
    assert {(r["device"], r["world_size"], r["nodes"], r["gpus_per_node"], r["n_reps"]) for r in result.rows} == {
        ("V100-SXM2-32GB", 4, 1, 4, 20)
    }
    row = _row(result.rows, 262144)
    assert row["time_s_median"] == 27.60 / 1e6
    assert row["busbw_gbps"] == pytest.approx(14.25, abs=0.005)  # factor 2 x 3/4
    # old builds print a float error per size; a failed data check shows only in the footer
    path.write_text(OLD_OUTPUT.replace("values : 0 OK", "values : 2 FAILED"))
    result = replay(path, ReplayOptions())
    assert not result.rows
    assert result.skipped == {"all_reduce: 2 out-of-bounds values in a run with the old 'error' column": 4}


def test_a_cut_off_log_replays_its_complete_lines_and_says_so(tmp_path):
    lines = ALL_REDUCE.read_text().splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.split()[:1] == ["1048576"])
    cut = tmp_path / "all_reduce_perf_cut.txt"
    cut.write_text("".join(lines[:end]) + lines[end][:50])  # the job killed while printing the 1 MiB line
    result = replay(cut, ReplayOptions())
    assert len(result.rows) == 17 and max(r["bytes"] for r in result.rows) == 524288
    (note,) = result.notes
    assert note.startswith("all_reduce_perf_cut.txt: the all_reduce_perf run ends after 17 sizes without its")
    assert f"its last line ({end + 1}) is cut short and was not read" in note
    assert not replay(ALL_REDUCE, ReplayOptions()).notes  # a whole log: nothing to say
    ragged = tmp_path / "all_reduce_perf_ragged.txt"  # a short line with lines after it is still an error
    ragged.write_text("".join(lines[:end]) + lines[end][:50] + "\n" + "".join(lines[end + 1 :]))
    with pytest.raises(MalformedFile, match=rf":{end + 1}: "):
        replay(ragged, ReplayOptions())
