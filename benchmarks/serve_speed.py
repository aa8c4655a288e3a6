"""How fast is `opcast predict serve`? Target (issue 20): a 10,000-request simulation in seconds on a
laptop, because every step costs one interpolation in a table priced once.

Usage:  python benchmarks/serve_speed.py [--models DIR | --roofline] [--repeats N] [--requests N]

Each case builds the step-price table (:class:`~opcast.predict.serve.step_cost.PricedStepCost`:
every kernel of the table in one batched lookup of the kernel models) and simulates ``--requests``
ShareGPT-like requests (seed 0) under vLLM's defaults. Printed per case: the median over
``--repeats`` of the table's seconds (a fresh kernel model each time, so nothing is cached; the
first repeat also pays the model loading and imports, reported apart) and of the simulation's
seconds, the steps simulated, microseconds per step, and the metrics (which must be the same every
repeat: the run is deterministic). The last line is the whole command through the console script.
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
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import engine_defaults
from opcast.predict.serve.kv_cache import kv_capacity
from opcast.predict.serve.metrics import serve_metrics
from opcast.predict.serve.requests import SHAREGPT, poisson_stream
from opcast.predict.serve.simulate import simulate
from opcast.predict.serve.step_cost import PricedStepCost

CASES = [
    # (label, arch, gpu, tp, replicas, rate req/s): below, near and past one replica's capacity
    ("Llama-3 8B, H100, 10 req/s", "llama3-8b", "H100-SXM", 1, 1, 10.0),
    ("Llama-3 8B, H100, 40 req/s (overloaded)", "llama3-8b", "H100-SXM", 1, 1, 40.0),
    ("Llama-3 70B, 4 x (TP4 H100), 30 req/s", "llama3-70b", "H100-SXM", 4, 4, 30.0),
    ("Llama-2 7B, A100-80GB, 8 req/s", "llama2-7b", "A100-SXM4-80GB", 1, 1, 8.0),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=10_000)
    a = ap.parse_args()
    t0 = time.perf_counter()
    load_kernel_cost(a.models, use_learned=not a.roofline)  # imports and model files, once
    print(f"kernel models loaded (with imports) in {time.perf_counter() - t0:.2f} s", flush=True)
    for label, arch_name, gpu, tp, replicas, rate in CASES:
        arch, dev = load_arch(arch_name), get_device(gpu)
        cfg, engine = InferConfig(tp=tp), engine_defaults("vllm", dev)
        stream = poisson_stream(
            rate_per_s=rate, num_requests=a.requests, input_len=SHAREGPT[0], output_len=SHAREGPT[1], seed=0
        )
        blocks = kv_capacity(arch, dev, cfg, engine, longest_tokens=stream.max_tokens).blocks
        table_s, sim_s, docs = [], [], set()
        for _ in range(a.repeats):
            kernels = load_kernel_cost(a.models, use_learned=not a.roofline)
            t0 = time.perf_counter()
            step = PricedStepCost(
                arch,
                dev,
                cfg,
                gpus_per_node=dev.gpus_per_node,
                kernels=kernels,
                max_tokens=engine.max_num_batched_tokens,
                max_seqs=min(engine.max_num_seqs, engine.max_num_batched_tokens),
                max_len=stream.max_tokens,
            )
            t1 = time.perf_counter()
            sim = simulate(stream, engine, step, kv_blocks=blocks, replicas=replicas, router="least_loaded")
            t2 = time.perf_counter()
            table_s.append(t1 - t0)
            sim_s.append(t2 - t1)
            m = serve_metrics(sim)
            docs.add((m.ttft.p50_s, m.tpot.p50_s, m.steps, m.preemptions))
        if len(docs) != 1:
            raise SystemExit(f"{label}: the repeats disagree: {docs}")
        ((ttft, tpot, steps, preempted),) = docs
        sim_med = statistics.median(sim_s)
        print(
            f"{label}: table {statistics.median(table_s):.2f} s, simulation {sim_med:.2f} s "
            f"({steps:,} steps, {1e6 * sim_med / steps:.0f} us/step, {preempted} preemptions); "
            f"TTFT p50 {ttft * 1e3:.1f} ms, TPOT p50 {tpot * 1e3:.1f} ms",
            flush=True,
        )
    cmd = [sys.executable, "-m", "opcast", "predict", "serve", "--arch", "llama3-8b", "--gpu", "H100-SXM"]
    cmd += ["--rate", "10", "--num-requests", str(a.requests), "--lengths", "sharegpt", "--json"]
    cmd += ["--roofline"] if a.roofline else (["--models", str(a.models)] if a.models else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    print(f"whole command ({' '.join(cmd[2:])}): {time.perf_counter() - t0:.2f} s wall")


if __name__ == "__main__":
    main()
