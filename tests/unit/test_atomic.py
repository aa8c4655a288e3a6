"""The one rule of a file opcast writes: checked before the work, written whole or not at all."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from opcast.atomic import output_file_problem, output_folder_problem, write_atomically, write_failure


def test_an_output_file_is_refused_before_the_work_when_it_cannot_be_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert output_file_problem("--csv", tmp_path / "new" / "deeper" / "t.csv", (".csv",)) is None  # folders are made
    assert output_file_problem("--csv", tmp_path, (".csv",)) == (
        f"--csv {tmp_path} is a folder; give a file name such as {tmp_path / 'out.csv'}"
    )
    under = output_file_problem("--trace", blocker / "sub" / "t.json")
    assert under == f"--trace {blocker / 'sub' / 't.json'} lies under {blocker}, which is a file; choose another path"
    assert output_file_problem("--out", tmp_path / "k.txt", (".parquet", ".csv")) == (
        f"--out {tmp_path / 'k.txt'}: give a file name ending in .parquet or .csv"
    )
    assert output_file_problem("--trace", tmp_path / "t.anything") is None  # no suffixes: any


@pytest.mark.parametrize(
    ("code", "fix"), [(errno.ENOSPC, "free space or choose another --out"), (errno.EACCES, "choose another --out")]
)
def test_a_failed_write_says_the_fix_that_fits_its_reason(tmp_path, code, fix):
    err = OSError(code, "reason")
    assert write_failure("--out", tmp_path / "k.csv", err) == f"cannot write {tmp_path / 'k.csv'}: reason; {fix}"
    assert write_failure("--trace", tmp_path / "t.json", err, "the trace").startswith("cannot write the trace ")


def test_an_interrupted_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, fail)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_an_output_folder_is_refused_when_it_is_or_lies_under_a_file(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert output_folder_problem("--out", tmp_path / "new" / "deeper") is None  # made later
    assert output_folder_problem("--out", tmp_path) is None
    assert output_folder_problem("--out", blocker, holds="rows go in it") == (
        f"--out {blocker} is a file; give a folder (rows go in it)"
    )
    assert output_folder_problem("--out", blocker / "x") == (
        f"--out {blocker / 'x'} lies under {blocker}, which is a file; choose a folder"
    )


def test_every_option_naming_a_file_to_write_is_checked_before_the_work():
    """A new --csv/--plot/--trace/--out declared without a check would be found only after the work."""
    from opcast.predict import options

    outputs = [
        (name, opt)
        for name, opt in vars(options).items()
        if isinstance(opt, options.Opt) and opt.flags in ("--csv", "--plot", "--trace", "--out")
    ]
    assert len(outputs) >= 6, [n for n, _ in outputs]
    assert [n for n, opt in outputs if opt.check is None] == []


def test_a_device_pipe_or_socket_is_never_replaced_by_an_output(tmp_path):
    """Run as root, ``--csv /dev/full`` renamed the table over the device node; a FIFO stands in for it."""
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    problem = output_file_problem("--csv", fifo, (".csv",))
    assert problem is not None and "pipe.csv is not a regular file" in problem and "\n" not in problem
    with pytest.raises(OSError, match="not a regular file"):
        write_atomically(fifo, lambda tmp: tmp.write_text("x"))
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe.csv"]  # no temp file left either
