"""User-facing errors.

Every problem a user can fix (an unknown GPU, a TP degree that does not divide the heads, a
corrupt parquet file, ...) is raised as :class:`OpcastError` with a one-line message that says
what is wrong and how to fix it. The CLI boundary turns it into a message on stderr and exit
code 2; nothing else in opcast prints tracebacks for user input.
"""

from __future__ import annotations


class OpcastError(ValueError):
    """A one-line, user-fixable error (exit code 2 at the CLI)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM taken as an interrupt where opcast catches it (a model set being written, a stage of
    calibrate running): the same cleanup as Ctrl-C, and exit code 143 (128 + SIGTERM) at the CLI."""
