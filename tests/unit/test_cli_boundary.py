"""The CLI boundary (opcast.cli.main): what each class of failure becomes.

The table of hostile inputs through the real console script is tests/integration/test_hostile_inputs.py;
these pin the mapping itself, including the classes no user input should reach (a bug)."""

from __future__ import annotations

import errno

import pytest
import typer

from opcast import cli
from opcast.errors import OpcastError


@pytest.fixture()
def raising(monkeypatch):
    """Make the root app raise the given exception when invoked."""

    def install(exc: BaseException) -> None:
        def boom(*args, **kwargs):
            raise exc

        monkeypatch.setattr(cli, "app", boom)

    return install


@pytest.mark.parametrize(
    ("exc", "code", "start"),
    [
        (
            OpcastError("tp=3 does not divide n_heads=32;\n pick a divisor"),
            2,
            "opcast: error: tp=3 does not divide n_heads=32; pick a divisor",
        ),
        (RuntimeError("something\nmulti-line"), 1, "opcast: internal error: RuntimeError: something (a bug in opcast"),
        (KeyboardInterrupt(), 130, "opcast: interrupted"),
        (RecursionError(), 2, "opcast: error: an input is nested too deeply"),
        (PermissionError(errno.EACCES, "Permission denied", "/x/y"), 2, "opcast: error: /x/y: Permission denied"),
    ],
)
def test_each_failure_is_one_line_with_its_exit_code(raising, capsys, exc, code, start):
    raising(exc)
    assert cli.main([]) == code
    err = capsys.readouterr().err
    assert err.startswith(start), err
    assert len(err.strip().splitlines()) == 1, err


def test_opcast_debug_shows_the_traceback_of_a_bug(raising, monkeypatch):
    raising(RuntimeError("boom"))
    monkeypatch.setenv("OPCAST_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main([])


def test_typer_exit_keeps_its_code(raising):
    raising(typer.Exit(143))
    assert cli.main([]) == 143


@pytest.mark.parametrize(
    "argv", [["predict", "trian"], ["--bogus"], ["predict", "train"], ["predict", "train", "--tp", "abc"]]
)
def test_usage_errors_are_one_line_exit_2(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("opcast: error: "), err
    assert "--help" in err and "Traceback" not in err


def test_an_interrupt_inside_a_real_command_is_the_interrupted_line(monkeypatch, capsys):
    """typer >= 0.22 turns a KeyboardInterrupt out of a command into a silent return of 130 (not
    standalone): Ctrl-C during train fit or calibrate's validations exited 130 with nothing on stderr."""
    import opcast.hardware

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(opcast.hardware, "catalog", interrupted)
    assert cli.main(["hardware", "list"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == "opcast: interrupted; what was written is kept", err


def test_sigterm_taken_as_an_interrupt_exits_143(monkeypatch, capsys):
    """Where opcast turns SIGTERM into an interrupt (a model set being written, a calibrate stage), the
    exit code stays 128 + SIGTERM, as the README says, not Ctrl-C's 130."""
    import opcast.hardware
    from opcast.errors import Terminated

    def terminated():
        raise Terminated

    monkeypatch.setattr(opcast.hardware, "catalog", terminated)
    assert cli.main(["hardware", "list"]) == 143
    assert capsys.readouterr().err.strip() == "opcast: terminated (SIGTERM); what was written is kept"


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["search", "train", "--arch", "llama2-7b", "--nodes", "2"], "takes the total GPU count as --gpus"),
        (["predict", "train", "--arch", "llama2-7b", "--gpus", "16"], "takes --nodes and --gpus-per-node"),
    ],
)
def test_an_option_another_command_spells_differently_names_this_commands_option(capsys, argv, hint):
    """search takes the world size as --gpus, predict train --nodes x --gpus-per-node: click's guess by
    spelling pointed search train --nodes at --models and --workers, predict train --gpus at --gpu, --sp, --tp."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and hint in err and "Possible options" not in err, err


def test_a_missing_value_of_an_option_this_command_takes_is_not_a_spelling_hint(capsys):
    assert cli.main(["compare", "train", "--arch", "llama2-7b", "--nodes"]) == 2
    err = capsys.readouterr().err.strip()
    assert "requires an argument" in err and "total GPU count" not in err, err
