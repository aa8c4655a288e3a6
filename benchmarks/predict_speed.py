"""How fast is `opcast predict`? Targets (issue 5): one `predict train` under 10 ms once the models
are loaded; loading the default models under 1 s.

Usage:  python benchmarks/predict_speed.py [--models DIR] [--repeats N]

Prints, per configuration: the first prediction with a cold kernel cache (every unique kernel
priced, learned ones in one batched call per model), then the median of N warm predictions with the full per-op report (what the CLI does),
and without it (what a configuration search does). Also the model-set load time and the
import time of ``opcast.predict`` (no torch or xgboost at start-up).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = [
    # (label, arch, gpu, nodes, gpus per node, TrainConfig kwargs)
    ("llama2-7b 8xH100 tp2 pp2 dp2 sp", "llama2-7b", "H100-SXM", 1, 8,
     dict(tp=2, pp=2, dp=2, sp=True, micro_batch=1, global_batch=64, seq=4096, recompute="selective", zero=1)),
    ("megatron-175b 1024xA100 tp8 pp8", "megatron-175b", "A100-SXM4-80GB", 128, 8,
     dict(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, seq=2048, recompute="full")),
    ("llama3-70b 512xH100 tp8 pp4 cp2 v2", "llama3-70b", "H100-SXM", 64, 8,
     dict(tp=8, pp=4, dp=8, cp=2, sp=True, micro_batch=1, global_batch=512, seq=8192, recompute="full", zero=1,
          schedule="interleaved", virtual_stages=2, overlap_grad_reduce=True)),
    ("gpt3-2.7b 1xV100 fp32 eager", "gpt3-2.7b", "V100-PCIe-32GB", 1, 1,
     dict(micro_batch=2, global_batch=8, seq=2048, precision="fp32", attention="eager")),
    ("mixtral-8x7b 64xH100 tp2 ep8", "mixtral-8x7b", "H100-SXM", 8, 8,
     dict(tp=2, pp=1, dp=32, ep=8, sp=True, micro_batch=1, global_batch=256, seq=4096, recompute="full", zero=1)),
]


_FRESH = """
import sys, time
t0 = time.perf_counter()
from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train
t1 = time.perf_counter()
kernels = load_kernel_cost(sys.argv[1] or None)
kernels.warm()
t2 = time.perf_counter()
r = predict_train(load_arch("llama2-7b"), get_device("A100-SXM4-80GB"), TrainConfig(tp=2, micro_batch=1, global_batch=64, seq=4096),
                  nodes=1, gpus_per_node=8, kernels=kernels)
t3 = time.perf_counter()
print(f"imports {t1 - t0:.2f} s + load {t2 - t1:.2f} s + first predict train {t3 - t2:.2f} s = {t3 - t0:.2f} s; "
      f"torch imported: {'torch' in sys.modules}, xgboost imported: {'xgboost' in sys.modules}")
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="model set (default: the embedded one, if any)")
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()

    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import opcast.predict.cli"], capture_output=True, text=True)
    heavy = [ln.split("|")[-1].strip() for ln in out.stderr.splitlines() if ln.split("|")[-1].strip() in ("torch", "xgboost")]
    print(f"import opcast.predict.cli (fresh interpreter): {time.perf_counter() - t0:.2f} s; torch/xgboost imported: "
          f"{heavy or 'no'}")

    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import compile_train, run_train

    t0 = time.perf_counter()
    kernels = load_kernel_cost(args.models)
    warmed = kernels.warm()  # ModelSet loads predictors lazily; count that as loading
    load_s = time.perf_counter() - t0
    print(f"load kernel models: {load_s:.3f} s, {warmed} predictors "
          f"({kernels.models_label or 'none: ' + '; '.join(kernels.notes)}) -- target < 1 s")
    fresh = subprocess.run([sys.executable, "-c", _FRESH, str(args.models or "")], capture_output=True, text=True)
    print(f"fresh interpreter: {fresh.stdout.strip() or fresh.stderr.strip().splitlines()[-1:]}")
    print()
    print(f"{'configuration':40s} {'cold':>11s} {'warm+report':>11s} {'warm bare':>11s}  sources")
    worst_cold = worst_warm = 0.0
    for label, arch_name, gpu, nodes, gpn, kw in CONFIGS:
        arch, device = load_arch(arch_name), get_device(gpu)
        cfg = TrainConfig(**kw)
        kernels = load_kernel_cost(args.models)  # a fresh, empty cache per configuration
        kernels.warm()
        t0 = time.perf_counter()
        plan = compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn)
        result = run_train(plan, kernels)
        cold = time.perf_counter() - t0
        assert result.iteration_time_s is not None, result.reasons
        warm, bare = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run_train(compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn), kernels)
            warm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_train(compile_train(arch, device, cfg, nodes=nodes, gpus_per_node=gpn), kernels, details=False)
            bare.append(time.perf_counter() - t0)
        w, b = statistics.median(warm), statistics.median(bare)
        worst_cold, worst_warm = max(worst_cold, cold), max(worst_warm, w)
        print(f"{label:40s} {_ms(cold)} {_ms(w)} {_ms(b)}  {result.cost_sources['unique_kernels_by_source']}")
    print()
    for label, t in (("cold (kernels not seen before, learned ones in one batch per model)", worst_cold),
                     ("warm (kernels cached: repeated configurations, searches)", worst_warm)):
        print(f"slowest prediction, {label}: {t * 1e3:.2f} ms -- target < 10 ms: {'met' if t < 0.010 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
