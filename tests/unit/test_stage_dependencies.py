"""The dependency rules of CONTRIBUTING.md that a grep can check: ``predict`` never imports
``check``, torch, xgboost, ``opcast.collect.bench`` or ``opcast.train.fit`` (not even inside a
function), so measuring code cannot creep back onto the prediction path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Prefixes of modules that predict may not import, with the reason.
FORBIDDEN_IN_PREDICT = {
    "opcast.check": "check imports predict, not the other way round",
    "torch": "torch stays off the predict path (measuring lives in opcast.check)",
    "xgboost": "xgboost stays off the predict path (fitting lives in opcast.train.fit)",
    "opcast.collect.bench": "benchmarks run in collect and check, never in predict",
    "opcast.train.fit": "predict loads model sets (opcast.train.artifacts), it does not fit them",
}


def imported_modules(source: str, *, package: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``source`` names, anywhere in the file,
    relative imports resolved against ``package``; ``from a import b`` counts as ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _violations(modules: set[str]) -> list[str]:
    return sorted(
        f"{m} ({why})"
        for m in modules
        for prefix, why in FORBIDDEN_IN_PREDICT.items()
        if m == prefix or m.startswith(prefix + ".")
    )


def test_imported_modules_sees_imports_inside_functions_and_relative_ones():
    source = (
        "import os\n"
        "def f():\n"
        "    from opcast.check import isolated\n"
        "    import torch.nn\n"
        "from ..train import fit\n"
        "from . import report\n"
    )
    found = imported_modules(source, package="opcast.predict.cost")
    assert {"os", "opcast.check", "opcast.check.isolated", "torch.nn", "opcast.predict.train.fit"} <= found
    assert "opcast.predict.cost.report" in found
    assert _violations(found) == [
        "opcast.check (check imports predict, not the other way round)",
        "opcast.check.isolated (check imports predict, not the other way round)",
        "torch.nn (torch stays off the predict path (measuring lives in opcast.check))",
    ]


@pytest.mark.parametrize("path", sorted((REPO / "predict").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_predict_imports_nothing_of_check_or_measuring(path: Path):
    rel = path.relative_to(REPO).with_suffix("")
    package = ".".join(("opcast", *rel.parts[:-1]))  # a module's package; an __init__'s is itself
    assert _violations(imported_modules(path.read_text(), package=package)) == []
