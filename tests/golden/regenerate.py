"""Golden predictions: the full ``--json`` output of a handful of configurations, pinned.

Each ``<case>.json`` beside this script holds the command line (:data:`CASES`), the fingerprint of
the model set it was priced with (the embedded default, ``models/default``) and the document the
command printed. ``tests/integration/test_golden.py`` re-runs every command in-process and
compares every number (relative 1e-9), every string and the document's shape, so a change in any
number is seen -- and explained in the commit that makes it.

Regenerate (the one place; after an intended change of numbers, e.g. a refit of
``models/default`` or a new cost term)::

    python tests/golden/regenerate.py            # every case
    python tests/golden/regenerate.py main_job   # some cases
    python tests/golden/regenerate.py --check    # compare only, write nothing (what the test does)

Fields that are wall-clock measurements, not predictions (:data:`VOLATILE`), are left out.

The cases run in one fresh interpreter, as the console script would: learned predictions depend
on the process's history at float32 rounding (``train/estimators/xgb.py`` evaluates trees with
numpy, or with xgboost's C++ predictor once ``xgboost`` is imported, e.g. by an earlier test), so
the test asks this script (``--print``) for the documents instead of running them in pytest's
process, and a case that imports xgboost itself is refused (it would change the cases after it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CASES: dict[str, tuple[str, ...]] = {
    # The README's main job (its headline numbers: 9.09 s an iteration, 28,852 tokens/s, MFU 50.2 %).
    "main_job": (
        "predict",
        "train",
        "--arch",
        "llama2-7b",
        "--gpu",
        "A100-SXM4-80GB",
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--tp",
        "2",
        "--pp",
        "1",
        "--micro-batch",
        "1",
        "--global-batch",
        "64",
        "--seq",
        "4096",
    ),
    # A 175B-class Megatron job: pp with interleaving, sp, selective recomputation, the distributed
    # optimizer overlapped with backward, a tied embedding across the first and last stage.
    "megatron_175b_interleaved": (
        "predict",
        "train",
        "--arch",
        "megatron-175b",
        "--gpu",
        "A100-SXM4-80GB",
        "--nodes",
        "16",
        "--gpus-per-node",
        "8",
        "--tp",
        "8",
        "--pp",
        "8",
        "--sp",
        "--micro-batch",
        "1",
        "--global-batch",
        "512",
        "--seq",
        "2048",
        "--schedule",
        "interleaved",
        "--virtual-stages",
        "3",
        "--recompute",
        "selective",
        "--zero",
        "1",
        "--overlap-grad-reduce",
    ),
    # MoE with expert parallelism (all-to-all, expert data-parallel group), pp and full recomputation.
    "mixtral_ep": (
        "predict",
        "train",
        "--arch",
        "mixtral-8x7b",
        "--gpu",
        "H100-SXM",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--tp",
        "2",
        "--pp",
        "4",
        "--ep",
        "4",
        "--sp",
        "--micro-batch",
        "1",
        "--global-batch",
        "128",
        "--seq",
        "4096",
        "--recompute",
        "full",
        "--overlap-grad-reduce",
    ),
    # ZeRO-3 with full recomputation, context parallelism and fp8 (bf16 activations).
    "zero3_recompute_cp_fp8": (
        "predict",
        "train",
        "--arch",
        "llama3-8b",
        "--gpu",
        "H100-SXM",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--tp",
        "2",
        "--cp",
        "2",
        "--zero",
        "3",
        "--recompute",
        "full",
        "--precision",
        "fp8",
        "--micro-batch",
        "2",
        "--global-batch",
        "64",
        "--seq",
        "8192",
    ),
    # The README's inference example.
    "infer_llama3_70b": (
        "predict",
        "infer",
        "--arch",
        "llama3-70b",
        "--gpu",
        "H100-SXM",
        "--tp",
        "8",
        "--pp",
        "1",
        "--batch",
        "32",
        "--prompt-len",
        "1024",
        "--gen-len",
        "128",
    ),
    # The README's search (one process, so the document does not depend on the cores).
    "search_llama2_13b": (
        "search",
        "--arch",
        "llama2-13b",
        "--gpu",
        "A100-SXM4-80GB",
        "--gpus",
        "64",
        "--global-batch",
        "1024",
        "--seq",
        "4096",
        "--top",
        "5",
        "--workers",
        "1",
    ),
    # Analytic: every kernel from the roofline, GPT-3 175B over 64 H100s.
    "roofline_gpt3_175b": (
        "predict",
        "train",
        "--arch",
        "gpt3-175b",
        "--gpu",
        "H100-SXM",
        "--nodes",
        "8",
        "--gpus-per-node",
        "8",
        "--tp",
        "8",
        "--pp",
        "8",
        "--micro-batch",
        "1",
        "--global-batch",
        "256",
        "--seq",
        "2048",
        "--roofline",
    ),
}
"""Case name -> ``opcast`` arguments (``--json`` is added)."""

VOLATILE: dict[str, tuple[str, ...]] = {
    "search": ("seconds", "configs_per_s", "predicted_per_s"),
}
"""Command -> top-level fields that measure this run's wall time, not the prediction."""

REL_TOL = 1e-9
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def golden_path(name: str) -> Path:
    return HERE / f"{name}.json"


def command_line(name: str) -> str:
    return shlex.join(("opcast", *CASES[name], "--json"))


def models_fingerprint() -> dict[str, Any]:
    """Which embedded default model set priced the learned kernels (its meta.json's own sha256)."""
    from opcast.train.artifacts import default_models_path

    meta = json.loads((default_models_path() / "meta.json").read_text())
    return {"name": meta.get("name"), "created_utc": meta.get("created_utc"), "meta_sha256": meta.get("meta_sha256")}


def run_case(name: str) -> dict[str, Any]:
    """The document ``opcast <case> --json`` prints, run in this process, volatile fields removed."""
    from opcast.cli import main

    args = CASES[name]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--json"])
    if code != 0:
        raise RuntimeError(f"{command_line(name)} exited {code}: {err.getvalue().strip()}")
    doc = json.loads(_ANSI.sub("", out.getvalue()))
    for key in VOLATILE.get(args[0], ()):
        doc.pop(key, None)
    if "xgboost" in sys.modules:
        raise RuntimeError(
            f"{command_line(name)} imported xgboost, which changes later learned predictions at "
            "float32 rounding; run such a case in its own process"
        )
    return doc


def run_fresh(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Case -> document, every case run in one fresh interpreter (``--print``)."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--print", *(names or [])], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{Path(__file__).name} --print failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def load_golden(name: str) -> dict[str, Any]:
    return json.loads(golden_path(name).read_text())


def write_golden(name: str, doc: dict[str, Any], models: dict[str, Any]) -> Path:
    path = golden_path(name)
    record = {
        "command": command_line(name),
        "models": models,
        "volatile_fields_left_out": list(VOLATILE.get(CASES[name][0], ())),
        "output": doc,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def compare(expected: Any, actual: Any, path: str = "", rel: float = REL_TOL) -> list[str]:
    """Every difference between two JSON documents, one readable line each: numbers beyond a
    relative ``rel``, other values, keys added or removed, list lengths."""
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None or actual is None:
        return (
            []
            if expected is actual or (expected == actual and type(expected) is type(actual))
            else [f"{path or '.'}: {expected!r} -> {actual!r}"]
        )
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if expected == actual or (
            math.isfinite(expected)
            and math.isfinite(actual)
            and abs(actual - expected) <= rel * max(abs(expected), abs(actual))
        ):
            return []
        change = f" ({(actual - expected) / expected:+.3e} rel)" if expected and math.isfinite(expected) else ""
        return [f"{path or '.'}: {expected!r} -> {actual!r}{change}"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{path}.{k}: removed (was {_short(expected[k])})" for k in expected if k not in actual]
        out += [f"{path}.{k}: added ({_short(actual[k])})" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                out += compare(expected[k], actual[k], f"{path}.{k}", rel)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        out = [] if len(expected) == len(actual) else [f"{path}: {len(expected)} items -> {len(actual)}"]
        for i, (e, a) in enumerate(zip(expected, actual)):
            out += compare(e, a, f"{path}[{i}]", rel)
        return out
    if type(expected) is type(actual) and expected == actual:
        return []
    return [f"{path or '.'}: {_short(expected)} -> {_short(actual)}"]


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help=f"cases to regenerate (default: all of {', '.join(CASES)})")
    ap.add_argument("--check", action="store_true", help="compare with the stored files, write nothing")
    ap.add_argument("--print", action="store_true", help="print {case: document} as JSON, write nothing")
    args = ap.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.print:
        print(json.dumps({name: run_case(name) for name in args.cases or CASES}, allow_nan=False))
        return 0
    if "xgboost" in sys.modules:
        raise SystemExit("xgboost is already imported: run this script in a fresh interpreter")
    models = models_fingerprint()
    moved = 0
    for name in args.cases or CASES:
        doc = run_case(name)
        old = load_golden(name) if golden_path(name).exists() else None
        diff = compare(old["output"], doc) if old is not None else ["(new case)"]
        if old is not None and old.get("models") != models:
            diff.insert(0, f"models: {old.get('models')} -> {models}")
        moved += bool(diff)
        print(f"{name}: {'unchanged' if not diff else f'{len(diff)} difference(s)'}")
        for line in diff[:40]:
            print(f"  {line}")
        if len(diff) > 40:
            print(f"  ... and {len(diff) - 40} more")
        if not args.check:
            write_golden(name, doc, models)
    if args.check:
        return 1 if moved else 0
    print(f"wrote {len(args.cases or CASES)} golden file(s) to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
