"""How fast is `opcast search`? Targets: issue 6, Llama-2 13B on 64 A100-80GB and Llama-3 70B on 512
H100 each searched completely in under 10 s on 2 cores with the default models; issue 16, the
Llama-2 13B search in under 3 s as a whole process.

Usage:  python benchmarks/search_speed.py [--models DIR] [--workers N] [--repeats N] [--only TEXT]
                                          [--baseline REV]

Each search runs as the CLI does, in a fresh interpreter (cold graph and kernel caches), once
with the roofline fallback and once with the learned models (``--models DIR``, else the embedded
default; skipped with a note when there are none). Printed per run: configurations considered,
pruned and predicted; the search's own seconds by stage (models already loaded), configurations
per second, the whole command's wall and CPU time (interpreter start, imports and model loading
included), and the top configuration.

``--baseline REV`` also times the same commands on git revision REV (e.g. ``HEAD``: the last
commit, before the working tree's changes), exported with ``git archive`` into a temporary
package tree. The two run alternately, ``--repeats`` times each, so machine load hits both alike;
medians are compared, and the two must print the same predictions (every configuration's
iteration time and memory), or the script says which differ and exits 1.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

CASES = [
    # (label, arch, gpu, gpus, global batch, seq)
    ("Llama-2 13B, 64 x A100-80GB", "llama2-13b", "A100-SXM4-80GB", 64, 1024, 4096),
    ("Llama-3 70B, 512 x H100", "llama3-70b", "H100-SXM", 512, 1024, 4096),
]
REPO = Path(__file__).resolve().parents[1]


def run(
    arch: str,
    gpu: str,
    gpus: int,
    gb: int,
    seq: int,
    source: list[str],
    workers: int | None,
    tree: Path | None = None,
    cwd: Path | None = None,
) -> tuple[dict, float, float, list[str]]:
    """(document, wall seconds, CPU seconds of the child, command) of one search; ``tree``: an
    importable folder holding another ``opcast`` package to run instead of the installed one (run
    from a ``cwd`` outside the checkout, which would otherwise come first on the path)."""
    cmd = [
        sys.executable,
        "-m",
        "opcast",
        "search",
        "--arch",
        arch,
        "--gpu",
        gpu,
        "--gpus",
        str(gpus),
        "--global-batch",
        str(gb),
        "--seq",
        str(seq),
        "--top",
        "3",
        "--json",
        *source,
    ]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed ({out.returncode}){' on ' + str(tree) if tree else ''}: {out.stderr.strip()}"
        )
    return json.loads(out.stdout), wall, cpu, cmd


def export_revision(rev: str, into: Path) -> Path:
    """``git archive REV`` laid out as the installed package (pyproject's ``package-dir``): returns
    a folder to put on PYTHONPATH. Reads the repository; changes nothing in it."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=True
    ).stdout
    src = into / "src"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(src, filter="data")
    mapping = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = into / "pkg"
    for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        target = root.joinpath(*package.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(src / folder, target_is_directory=True)
    probe = subprocess.run(
        [sys.executable, "-c", "import opcast.predict.search as s; print(s.__file__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=into,
    )
    if probe.returncode or not probe.stdout.strip().startswith(str(root)):
        raise SystemExit(
            f"the exported tree of {rev} does not import ahead of the installed opcast: "
            f"{probe.stdout.strip() or probe.stderr.strip()}"
        )
    return root


def predictions(doc: dict) -> dict:
    """The predicted figures of a search document: the counts and the top configurations' figures
    (not the timings, nor fields the report may add)."""
    keep = (
        "summary",
        "iteration_time_s",
        "tokens_per_s",
        "mfu",
        "memory_per_gpu_bytes",
        "breakdown_s",
        "memory_breakdown_bytes",
    )
    return {
        "considered": doc["considered"],
        "pruned": {k: v["count"] for k, v in doc["pruned"].items()},  # the counts, not the reasons' wording
        "predicted": doc["predicted"],
        "top": [{k: t.get(k) for k in keep} for t in doc["top"]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="learned model set (default: the embedded one, if any)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the cores available)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per case and source; the median is reported")
    ap.add_argument("--only", default=None, help="run only the cases whose label contains this text (e.g. 13B)")
    ap.add_argument(
        "--baseline", default=None, metavar="REV", help="also time git revision REV (e.g. HEAD), alternately"
    )
    args = ap.parse_args()

    from opcast.predict.cost import load_kernel_cost

    sources: list[tuple[str, list[str]]] = [("roofline", ["--roofline"])]
    learned = load_kernel_cost(args.models)
    if learned.models_label is not None:
        sources.append((f"learned ({learned.models_label})", ["--models", str(args.models)] if args.models else []))
    else:
        print(f"learned models: none ({'; '.join(learned.notes)}); benchmarking the roofline fallback only")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {cores} cores available, load average {load:.1f} at start; python {sys.version.split()[0]}")
    print()
    cases = [c for c in CASES if args.only is None or args.only.lower() in c[0].lower()]
    worst = worst_wall = 0.0
    moved = False
    with tempfile.TemporaryDirectory(prefix="opcast-baseline-") as tmp:
        tree = export_revision(args.baseline, Path(tmp)) if args.baseline else None
        for label, arch, gpu, gpus, gb, seq in cases:
            for src_label, src_args in sources:
                runs, base = [], []
                for _ in range(max(1, args.repeats)):
                    runs.append(run(arch, gpu, gpus, gb, seq, src_args, args.workers, cwd=Path(tmp)))
                    if tree is not None:
                        base.append(run(arch, gpu, gpus, gb, seq, src_args, args.workers, tree, cwd=Path(tmp)))
                doc, _, _, cmd = runs[0]
                search_s = statistics.median(d["seconds"]["total"] for d, *_ in runs)
                wall_s = statistics.median(r[1] for r in runs)
                cpu_s = statistics.median(r[2] for r in runs)
                worst = max(worst, search_s)
                if "13B" in label:
                    worst_wall = max(worst_wall, wall_s)
                top = doc["top"][0]
                print(f"{label} -- kernels: {src_label}")
                print(f"  command: {' '.join(['opcast', *cmd[3:]])}")
                print(
                    f"  considered {doc['considered']:,}, pruned {doc['pruned_total']:,}, predicted "
                    f"{doc['predicted']:,}; "
                    f"{doc['unique_graphs']:,} op graphs, {doc['unique_kernels']:,} kernels "
                    f"{doc['kernels_by_source']}; "
                    f"{doc['workers']} process(es)"
                )
                stages = ", ".join(f"{k} {v:.2f}" for k, v in doc["seconds"].items() if k != "total")
                print(
                    f"  search {search_s:.2f} s ({stages}); {doc['considered'] / search_s:,.0f} configurations/s, "
                    f"{doc['predicted'] / search_s:,.0f} predicted/s; whole command {wall_s:.2f} s wall, "
                    f"{cpu_s:.2f} s CPU (median of {len(runs)})"
                )
                if base:
                    b_search = statistics.median(d["seconds"]["total"] for d, *_ in base)
                    b_wall = statistics.median(r[1] for r in base)
                    b_cpu = statistics.median(r[2] for r in base)
                    print(
                        f"  baseline {args.baseline}: search {b_search:.2f} s; whole command {b_wall:.2f} s wall, "
                        f"{b_cpu:.2f} s CPU -> now {b_wall / wall_s:.2f}x (wall), {b_cpu / cpu_s:.2f}x (CPU); "
                        f"runs alternated, wall now {[round(r[1], 2) for r in runs]} vs "
                        f"{[round(r[1], 2) for r in base]}"
                    )
                    same = predictions(base[0][0]) == predictions(doc)
                    moved |= not same
                    print(f"  predictions: {'identical to the baseline' if same else 'DIFFER from the baseline'}")
                print(
                    f"  top: {top['summary']}  {top['tokens_per_s']:,.0f} tokens/s, MFU {100 * top['mfu']:.1f} %, "
                    f"{top['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU"
                )
                biggest = sorted(doc["pruned"].items(), key=lambda kv: -kv[1]["count"])[:3]
                print("  most pruned: " + "; ".join(f"{v['reason']} {v['count']:,}" for _, v in biggest))
                print()
    print(f"slowest search: {worst:.2f} s -- target < 10 s: {'met' if worst < 10 else 'MISSED'}")
    if worst_wall:
        print(
            f"slowest Llama-2 13B whole command: {worst_wall:.2f} s wall -- target < 3 s (issue 16): "
            f"{'met' if worst_wall < 3 else 'MISSED'}"
        )
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
