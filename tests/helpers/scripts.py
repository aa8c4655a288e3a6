"""Load a repository script (a benchmark or a fixture generator, not an installed module) as a
module, for tests that call its functions: ``from helpers.scripts import load_script``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""


def load_script(path: str | Path, name: str | None = None, *, register: bool = True) -> ModuleType:
    """The module of the script at ``path`` (relative to the repository root, or absolute), executed
    once under ``name`` (default: the file's stem). ``register`` puts it in ``sys.modules`` first, which
    dataclasses defined in the script need (they look their module up)."""
    path = Path(path)
    path = path if path.is_absolute() else REPO / path
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_script(path: str | Path, *args: str) -> subprocess.CompletedProcess:
    """The script at ``path`` run in a subprocess with ``args`` by this interpreter, its output captured as text."""
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True)
