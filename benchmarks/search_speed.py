"""How fast is `opcast search`? Target (issue 6): Llama-2 13B on 64 A100-80GB and Llama-3 70B on
512 H100 each searched completely in under 10 s on 2 cores with the default models.

Usage:  python benchmarks/search_speed.py [--models DIR] [--workers N] [--repeats N]

Each search runs as the CLI does, in a fresh interpreter (cold graph and kernel caches), once
with the roofline fallback and once with the learned models (``--models DIR``, else the embedded
default; skipped with a note when there are none). Printed per run: configurations considered,
pruned and predicted; the search's own seconds by stage (models already loaded), configurations
per second, the whole command's wall time (interpreter start, imports and model loading included),
and the top configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    # (label, arch, gpu, gpus, global batch, seq)
    ("Llama-2 13B, 64 x A100-80GB", "llama2-13b", "A100-SXM4-80GB", 64, 1024, 4096),
    ("Llama-3 70B, 512 x H100", "llama3-70b", "H100-SXM", 512, 1024, 4096),
]


def run(arch: str, gpu: str, gpus: int, gb: int, seq: int, source: list[str], workers: int | None) -> tuple[dict, float, list[str]]:
    cmd = [sys.executable, "-m", "opcast", "search", "--arch", arch, "--gpu", gpu, "--gpus", str(gpus),
           "--global-batch", str(gb), "--seq", str(seq), "--top", "3", "--json", *source]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout), wall, cmd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="learned model set (default: the embedded one, if any)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the cores available)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per case and source; the median is reported")
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
    worst = 0.0
    for label, arch, gpu, gpus, gb, seq in CASES:
        for src_label, src_args in sources:
            runs = [run(arch, gpu, gpus, gb, seq, src_args, args.workers) for _ in range(max(1, args.repeats))]
            doc, _, cmd = runs[0]
            search_s = statistics.median(d["seconds"]["total"] for d, _, _ in runs)
            wall_s = statistics.median(w for _, w, _ in runs)
            worst = max(worst, search_s)
            top = doc["top"][0]
            print(f"{label} -- kernels: {src_label}")
            print(f"  command: {' '.join(['opcast', *cmd[3:]])}")
            print(f"  considered {doc['considered']:,}, pruned {doc['pruned_total']:,}, predicted {doc['predicted']:,}; "
                  f"{doc['unique_graphs']:,} op graphs, {doc['unique_kernels']:,} kernels {doc['kernels_by_source']}; "
                  f"{doc['workers']} process(es)")
            stages = ", ".join(f"{k} {v:.2f}" for k, v in doc["seconds"].items() if k != "total")
            print(f"  search {search_s:.2f} s ({stages}); {doc['considered'] / search_s:,.0f} configurations/s, "
                  f"{doc['predicted'] / search_s:,.0f} predicted/s; whole command {wall_s:.2f} s")
            print(f"  top: {top['summary']}  {top['tokens_per_s']:,.0f} tokens/s, MFU {100 * top['mfu']:.1f} %, "
                  f"{top['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU")
            biggest = sorted(doc["pruned"].items(), key=lambda kv: -kv[1]["count"])[:3]
            print("  most pruned: " + "; ".join(f"{v['reason']} {v['count']:,}" for _, v in biggest))
            print()
    print(f"slowest search: {worst:.2f} s -- target < 10 s: {'met' if worst < 10 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
