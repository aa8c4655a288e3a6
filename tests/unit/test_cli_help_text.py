"""Every command's summary in its group's command list is one paragraph without line breaks: typer's rich
help keeps a docstring's single line breaks there (it joins them only on the command's own page), so a
summary wrapped in the source printed as broken lines under `opcast --help` (`opcast.cli` joins them)."""

from __future__ import annotations

import inspect

from typer.main import get_command

from opcast.cli import app


def _commands(cmd, path):
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_summary_is_one_unbroken_paragraph():
    broken = []
    for path, cmd in _commands(get_command(app), ("opcast",)):
        first = inspect.cleandoc(cmd.help or "").split("\n\n")[0]
        if "\n" in first:
            broken.append(" ".join(path))
    assert not broken, f"summaries with line breaks (put a blank line after the first sentence): {broken}"


def test_the_step_bound_in_the_help_is_the_one_validate_enforces():
    from opcast.check.validate import MAX_STEPS

    commands = get_command(app).commands  # type: ignore[attr-defined]
    helps = [
        p.help for name in ("validate", "calibrate") for p in commands[name].params if p.name in ("steps", "warmup")
    ]
    assert len(helps) == 3 and all(f"at most {MAX_STEPS:,}" in h for h in helps), helps


def test_the_iteration_bound_in_the_help_is_the_one_collect_comm_enforces():
    """--iters and --warmup-iters are refused past MAX_ITERS, which their help did not say."""
    from opcast.collect.comm import MAX_ITERS

    comm = get_command(app).commands["collect"].commands["comm"]  # type: ignore[attr-defined]
    helps = [p.help for p in comm.params if p.name in ("iters", "warmup_iters")]
    assert len(helps) == 2 and all(f"at most {MAX_ITERS:,}" in h for h in helps), helps
