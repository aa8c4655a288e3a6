"""``collect bench`` loses nothing and mislabels nothing when it is stopped: SIGTERM, Ctrl-C twice,
a full disk, a second writer on the same folder; bad numbers and environments are refused before
any work; budgets bound the wall time; files are shareable (the umask's mode).

The console script runs in a subprocess on the CPU with tiny budgets; the tests wait for the first
part on disk (polling, no fixed sleeps) before they signal, so they hold under load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opcast.cli import main
from opcast.collect import bench
from opcast.collect.bench import BenchConfig, run_bench
from opcast.collect.io import WriterLock
from opcast.collect.timing import TimingBudget
from opcast.schema import read_dataset

SCRIPT = Path(sys.executable).parent / "opcast"
SMALL = ["--op", "softmax", "--dtype", "fp32", "--max-point-s", "0.002"]
SLOW = [*SMALL, "--samples", "300", "--warmup-s", "0.2", "--rep-s", "0.1"]
"""300 points of at least 0.2 s (the warm-up is wall time): a minute of work, still running when
the test signals it, however slow the machine."""
QUICK = [*SMALL, "--samples", "6", "--warmup-s", "0", "--rep-s", "0.002"]
TIMEOUT_S = 300


def _bench(out: Path, *args: str) -> list[str]:
    return [str(SCRIPT), "collect", "bench", "--out", str(out), "--device", "cpu", *args]


def _start(cmd: list[str], tmp: Path, **kw) -> subprocess.Popen:
    """A background run whose stdout/stderr go to files (no pipe to fill)."""
    with open(tmp / "a.out", "w") as stdout, open(tmp / "a.err", "w") as stderr:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, **kw)


def _wait_for_rows(out: Path, proc: subprocess.Popen) -> None:
    """Until the run has written its first part (the first row is written at once)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not list((out / "bench").glob("rank*.parquet")):
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before writing a row"
        assert time.monotonic() < deadline, "no row written in time"
        time.sleep(0.05)


def _runs(out: Path) -> list[dict]:
    return json.loads((out / "run.json").read_text())["runs"]


def _check_every_row_kept(out: Path, run: dict) -> None:
    """run.json's count is what is on disk for that run, nothing half-written is left, and no
    point is there twice."""
    df = read_dataset(out)
    assert run["rows_written"] >= 1 and (df["run_id"] == run["run_id"]).sum() == run["rows_written"]
    assert df["point_id"].is_unique
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.parquet*"))


def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.strip() and err.strip().count("\n") == 0, err
    return err


def _resume(out: Path, capsys, *args: str) -> dict:
    """Re-run the same command (in this process: the resume needs no fresh interpreter)."""
    capsys.readouterr()
    code = main(_bench(out, *args, "--json")[1:])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_sigterm_keeps_every_row_refuses_a_second_writer_and_resumes(tmp_path, capsys):
    out = tmp_path / "d"
    first = _start(_bench(out, *SLOW), tmp_path, umask=0o027)
    try:
        _wait_for_rows(out, first)
        second = subprocess.run(_bench(out, *SLOW), capture_output=True, text=True, timeout=TIMEOUT_S)
        assert second.returncode == 2
        assert f"PID {first.pid}" in _one_line(second.stderr) and "another --out" in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(TIMEOUT_S) == 143
    finally:
        first.kill()
        first.wait()
    assert "SIGTERM" in _one_line((tmp_path / "a.err").read_text())
    run = _runs(out)[-1]
    assert run["interrupted"] is True and run["signal"] == "SIGTERM" and run["remaining"] > 0
    _check_every_row_kept(out, run)
    for f in [out / "run.json", *(out / "bench").glob("*.parquet")]:
        assert f.stat().st_mode & 0o777 == 0o640, f  # the umask's mode, not mkstemp's 0600
    kept = read_dataset(out)

    # a lock file left by a process that died (killed before it could clear it) does not block the resume
    (out / "bench" / ".rank0000.lock").write_text(f"opcast collect bench, PID {_dead_pid()} on this host\n")
    summary = _resume(out, capsys, *SLOW, "--budget-s", "1")
    assert summary["already_done"] == len(kept) and summary["interrupted"] is False
    both = read_dataset(out)
    assert both["point_id"].is_unique and len(both) == len(kept) + summary["rows_written"]


def _dead_pid() -> int:
    """The PID of a process that is surely dead: a child that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_ctrl_c_twice_still_writes_every_row_and_says_interrupted(tmp_path):
    out = tmp_path / "d"
    proc = _start(_bench(out, *SLOW), tmp_path)
    try:
        _wait_for_rows(out, proc)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT_S) == 130
    finally:
        proc.kill()
        proc.wait()
    err = _one_line((tmp_path / "a.err").read_text())
    assert "SIGINT" in err and "re-run" in err
    run = _runs(out)[-1]
    assert run["interrupted"] is True and run["signal"] == "SIGINT"
    _check_every_row_kept(out, run)


FULL_DISK = """
import errno, os, sys
import pyarrow.parquet as pq
real, left = pq.write_table, [int(os.environ["PARTS_THAT_FIT"])]
def write_table(table, where, *args, **kwargs):
    if left[0] <= 0:  # as a full disk does: half a file, then ENOSPC
        with open(where, "wb") as fh:
            fh.write(b"PAR1")
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
    left[0] -= 1
    return real(table, where, *args, **kwargs)
pq.write_table = write_table
from opcast.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_full_disk_keeps_the_written_parts_and_resumes(tmp_path, capsys):
    out = tmp_path / "d"
    cmd = [sys.executable, "-c", FULL_DISK, *_bench(out, *QUICK)[1:]]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, "PARTS_THAT_FIT": "1"}
    )
    assert res.returncode == 2
    err = _one_line(res.stderr)
    assert "disk is full" in err and "re-run the same command to resume" in err
    run = _runs(out)[-1]
    assert run["interrupted"] is True and "disk is full" in run["error"]
    assert run["rows_written"] == 1 and run["rows_not_written"] >= 1  # the first part made it, the next did not
    _check_every_row_kept(out, run)
    summary = _resume(out, capsys, *QUICK)
    assert summary["already_done"] == 1 and summary["remaining"] == 0
    df = read_dataset(out)
    assert df["point_id"].is_unique and len(df) == 1 + summary["rows_written"]


# ----------------------------------------------------------------------------- in-process

FAST = TimingBudget(warmup_s=0.0, rep_s=0.002, min_reps=3, max_reps=10)


@pytest.fixture()
def fixed_cpu_spec(monkeypatch):
    """Plan against a fixed CPU spec (the real one is measured; the timings stay real)."""
    from opcast.collect.local_device import describe_local

    spec = replace(
        describe_local("cpu"), peak_fp32_flops=1e11, peak_bf16_flops=1e11, peak_fp16_flops=None, mem_bw_bytes_per_s=2e10
    )
    monkeypatch.setattr(bench, "describe_local", lambda device: spec)


def _cfg(out: Path, **kw) -> BenchConfig:
    base = dict(out=out, device="cpu", ops=("softmax",), dtypes=("fp32",), samples=8, max_point_s=0.002, timing=FAST)
    return BenchConfig(**{**base, **kw})


def _signal_on_call(monkeypatch, n: int, times: int, then_timing: TimingBudget | None = None) -> None:
    """Deliver ``times`` Ctrl-C to this process as the ``n``-th point starts measuring (and time
    that point and the next ones with ``then_timing``)."""
    calls = [0]
    real = bench.measure_cpu

    def measure(fn, budget, **kw):
        calls[0] += 1
        if calls[0] == n:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return real(fn, then_timing if then_timing and calls[0] >= n else budget, **kw)

    monkeypatch.setattr(bench, "measure_cpu", measure)


def test_second_ctrl_c_aborts_the_point_but_writes_and_labels_the_run(tmp_path, fixed_cpu_spec, monkeypatch):
    _signal_on_call(monkeypatch, 4, times=2)
    result = run_bench(_cfg(tmp_path))
    assert result.interrupted and result.signal == "SIGINT" and result.rows_written == 3
    run = _runs(tmp_path)[-1]
    assert run["interrupted"] is True and run["remaining"] == result.planned - 3
    _check_every_row_kept(tmp_path, run)


def test_first_ctrl_c_is_honoured_inside_a_long_warm_up(tmp_path, fixed_cpu_spec, monkeypatch):
    """An hour of warm-up per point: one Ctrl-C abandons the point at the next call."""
    _signal_on_call(monkeypatch, 2, times=1, then_timing=TimingBudget(warmup_s=3600, rep_s=0.002))
    t0 = time.monotonic()
    result = run_bench(_cfg(tmp_path))
    assert time.monotonic() - t0 < 120  # not 3600 s
    assert result.interrupted and result.rows_written == 1 and result.remaining == result.planned - 1


def test_the_budget_bounds_a_long_warm_up(tmp_path, fixed_cpu_spec):
    t0 = time.monotonic()
    result = run_bench(_cfg(tmp_path, budget_s=1.0, timing=TimingBudget(warmup_s=3600, rep_s=0.002)))
    assert time.monotonic() - t0 < 120  # not 3600 s per point
    assert not result.interrupted and result.rows_written == 0 and result.remaining == result.planned > 0


def test_full_disk_for_run_json_too_is_one_line_and_leaves_no_temp_file(tmp_path, fixed_cpu_spec, monkeypatch, capsys):
    import errno

    import pyarrow.parquet as pq

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    run_bench(_cfg(tmp_path, samples=2))  # a first run is on disk
    before = read_dataset(tmp_path)
    monkeypatch.setattr(pq, "write_table", full)
    monkeypatch.setattr(json, "dump", full)
    code = main(["collect", "bench", "--out", str(tmp_path), "--device", "cpu", *QUICK])
    err = _one_line(capsys.readouterr().err)
    assert code == 2 and "disk is full" in err and "run.json could not be updated" in err
    assert len(_runs(tmp_path)) == 1 and len(read_dataset(tmp_path)) == len(before)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".") and not p.name.endswith(".lock")]


def test_a_held_lock_refuses_and_info_counts_duplicates_once(tmp_path, fixed_cpu_spec, capsys):
    run_bench(_cfg(tmp_path, samples=3))
    with WriterLock(tmp_path / "bench" / ".rank0000.lock", command="bench", out=tmp_path):
        code = main(["collect", "bench", "--out", str(tmp_path), "--device", "cpu", *QUICK])
        err = capsys.readouterr().err
        assert code == 2 and f"PID {os.getpid()}" in _one_line(err)
    for part in list((tmp_path / "bench").glob("*.parquet")):  # what two old concurrent runs left: every point twice
        (tmp_path / "bench" / f"copy-{part.name}").write_bytes(part.read_bytes())
    assert main(["collect", "info", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert sum(r["rows"] for r in json.loads(captured.out)) == 3
    assert "3 duplicate rows" in captured.err


# ----------------------------------------------------------------------------- bad numbers and environments

BAD_OPTIONS = [
    (["--budget-s", "nan"], "--budget-s"),
    (["--budget-s", "-5"], "--budget-s"),
    (["--budget-s", "inf"], "--budget-s"),
    (["--max-point-s", "-1"], "--max-point-s"),
    (["--max-point-s", "nan"], "--max-point-s"),
    (["--max-mem-fraction", "-1"], "--max-mem-fraction"),
    (["--max-mem-fraction", "1.5"], "--max-mem-fraction"),
    (["--rep-s", "nan"], "--rep-s"),
    (["--rep-s", "0"], "--rep-s"),
    (["--warmup-s", "1e9"], "--warmup-s"),
    (["--warmup-s", "-1"], "--warmup-s"),
    (["--samples", "0"], "--samples"),
    (["--samples", "100000000"], "--samples"),
]
BAD_ENV = [
    ({"RANK": "abc"}, "RANK"),
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE"),
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE"),
    ({"RANK": "-1"}, "RANK"),
    ({"LOCAL_RANK": "-2"}, "LOCAL_RANK"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "outside"),
]


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["--budget-s", "nan"], {}, "--budget-s"),
        (["--warmup-s", "1e9"], {}, "--warmup-s"),
        ([], {"RANK": "abc"}, "RANK"),
    ],
)
def test_bad_numbers_and_env_through_the_script(tmp_path, args, env, needle):
    res = subprocess.run(
        _bench(tmp_path / "d", "--samples", "2", *args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **env},
    )
    assert res.returncode == 2 and needle in _one_line(res.stderr)
    assert not (tmp_path / "d").exists()  # refused before any work


@pytest.mark.parametrize("args, needle", BAD_OPTIONS)
def test_every_bad_number_is_refused_before_any_work(tmp_path, capsys, args, needle):
    code = main(["collect", "bench", "--out", str(tmp_path / "d"), "--samples", "2", *args])
    assert code == 2 and needle in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("env, needle", BAD_ENV)
@pytest.mark.parametrize("command", ["bench", "comm"])
def test_bad_launch_environment_is_one_line(tmp_path, capsys, monkeypatch, env, needle, command):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2" if command == "comm" else "1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["collect", command, "--out", str(tmp_path / "d")])
    assert code == 2 and needle in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "d").exists()
