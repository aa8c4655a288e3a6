"""How fast is `opcast search serve`? Target (issue 20): under 30 s on 2 cores (AIConfigurator's
published search takes about 30 s).

Usage:  python benchmarks/serve_search_speed.py [--models DIR | --roofline] [--repeats N] [--requests N]

Each case searches the default space (tp up to a node, pp 1, every replica count, max_num_seqs
{128, engine default} x max_num_batched_tokens {2048, engine default}) under vLLM for ShareGPT-like
requests (``--requests``, seed 0) at a rate, with SLOs TTFT p90 <= 500 ms and TPOT p90 <= 50 ms,
maximising goodput per GPU. Printed per case: the median wall time over ``--repeats`` whole
searches (each with a fresh kernel model, so nothing is cached between repeats), the deployments
considered and how many were simulated to the end, stopped early or skipped, and the answer (which
must be the same every repeat: the search is deterministic). The last line is one whole command
through the console script (imports and model loading included).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.serve.requests import SHAREGPT, poisson_stream
from opcast.predict.serve.search import ServeSpace, search_serve

CASES = [
    # (label, arch, gpu, GPUs, rate req/s)
    ("Llama-3 8B, up to 8 H100, 40 req/s", "llama3-8b", "H100-SXM", 8, 40.0),
    ("Llama-3 8B, up to 8 H100, 120 req/s", "llama3-8b", "H100-SXM", 8, 120.0),
    ("Llama-3 70B, up to 16 H100, 20 req/s", "llama3-70b", "H100-SXM", 16, 20.0),
]
SLO_TTFT_S, SLO_TPOT_S = 0.5, 0.05


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    a = ap.parse_args()
    for label, arch_name, gpu, gpus, rate in CASES:
        arch, dev = load_arch(arch_name), get_device(gpu)
        stream = poisson_stream(
            rate_per_s=rate, num_requests=a.requests, input_len=SHAREGPT[0], output_len=SHAREGPT[1], seed=0
        )
        space = ServeSpace(gpus=gpus, slo_ttft_s=SLO_TTFT_S, slo_tpot_s=SLO_TPOT_S)
        walls, answers = [], set()
        for _ in range(a.repeats):
            kernels = load_kernel_cost(a.models, use_learned=not a.roofline)
            t0 = time.perf_counter()
            r = search_serve(arch, dev, space, stream, kernels=kernels)
            walls.append(time.perf_counter() - t0)
            best = r.ranked[0].deployment.describe() if r.ranked else "none meets the SLOs"
            answers.add(best)
        if len(answers) != 1:
            raise SystemExit(f"{label}: the repeats disagree: {answers}")
        n = len(r.ranked) + len(r.others)
        simulated = r.count("meets_slo") + r.count("misses_slo")
        print(
            f"{label}: {statistics.median(walls):.1f} s median of {a.repeats} (min {min(walls):.1f}, max "
            f"{max(walls):.1f}); {n} deployments: {simulated} simulated to the end, {r.count('slo_certain_miss')} "
            f"stopped on SLO misses, {r.count('outranked')} outranked, {r.count('infeasible')} do not fit; "
            f"{r.tables} tables, {r.steps:,} steps; best: {best}",
            flush=True,
        )
    cmd = [sys.executable, "-m", "opcast", "search", "serve", "--arch", "llama3-70b", "--gpu", "H100-SXM"]
    cmd += ["--gpus", "16", "--rate", "20", "--lengths", "sharegpt", "--num-requests", str(a.requests)]
    cmd += ["--slo-ttft-s", str(SLO_TTFT_S), "--slo-tpot-s", str(SLO_TPOT_S), "--json"]
    cmd += ["--roofline"] if a.roofline else (["--models", str(a.models)] if a.models else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    print(f"whole command ({' '.join(cmd[2:])}): {time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
