"""A100 -> H100 -> B200 at fixed parallelism, and why (issue 9; the question of Kundu et al. 2024,
arXiv 2407.14645).

Usage:  python benchmarks/whatif_speedup.py [--models DIR] [--analytic] [--gpus A,B,C]

Two workloads, the same parallelism on every GPU:

- GPT-3 175B, one training step: 1024 GPUs as 128 nodes x 8, tp 8, pp 8, dp 16, micro-batch 1,
  global batch 1536 x 2048 tokens, full recomputation (the Megatron-LM setting of Narayanan et
  al. 2021, arXiv 2104.04473, Table 1);
- Llama-2 70B, one decode step (time per output token): tp 8 on one node, batch 32, prompt 1024,
  128 generated tokens.

For each it prints the headline speed-up over the first GPU, then every phase (compute by op
kind, communication, bubble; prefill and decode for inference) with its seconds and speed-up,
and the compute-bound / memory-bound / communication / bubble shares. Without ``--models`` every
kernel comes from the roofline fallback (opcast ships no default models yet), which is the
analytical answer: it scales exactly with the spec sheets.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost, roofline_only
from opcast.predict.parallel import InferConfig, TrainConfig
from opcast.predict.report import decode_gemms
from opcast.predict.whatif import SPLIT_PARTS, CompareResult, Workload, compare, split_gpu_list

GPT3_TRAIN = Workload(
    kind="train",
    arch=load_arch("gpt3-175b"),
    nodes=128,
    gpus_per_node=8,
    config=TrainConfig(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, seq=2048, recompute="full"),
)
LLAMA_DECODE = Workload(
    kind="infer",
    arch=load_arch("llama2-70b"),
    nodes=1,
    gpus_per_node=8,
    config=InferConfig(tp=8, batch=32, prompt_len=1024, gen_len=128),
)


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.3f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} us"


def _table(result: CompareResult, keep) -> None:
    names = [o.device.name for o in result.outcomes]
    width = max(14, *(len(n) for n in names))
    print(f"  {'phase':<34}" + "".join(f"{n:>{width}} {'x':>6}" for n in names))
    for phase, secs in result.rows():
        if not keep(phase):
            continue
        cells = "".join(
            f"{_fmt(s):>{width}} {(secs[0] / s if s and math.isfinite(s) else math.nan):>6.2f}" for s in secs
        )
        print(f"  {phase:<34}" + cells)


def _shares(result: CompareResult, scale: str, phase: str | None = None) -> None:
    """Each GPU's split of the whole time, or of one inference ``phase`` (prefill, decode_step)."""
    for o in result.outcomes:
        if o.split is None:
            print(f"  {o.device.name}: cannot run ({'; '.join(o.reasons)})")
            continue
        secs = o.split.phase_parts[phase] if phase else {p: getattr(o.split, f"{p}_s") for p in SPLIT_PARTS}
        total = sum(secs.values())
        parts = ", ".join(f"{p.replace('_', '-')} {100 * v / total:.1f} %" for p, v in secs.items() if v > 0)
        fit = "fits" if o.fits else "DOES NOT FIT in memory"
        extra = f"; MFU {100 * o.result.mfu:.1f} %" if hasattr(o.result, "mfu") and o.result.mfu else ""
        flag = f"; {o.out_of_range} learned kernel(s) outside their fitted hardware" if o.out_of_range else ""
        print(f"  {o.device.name}: {scale} by bottleneck: {parts} ({fit}{extra}{flag})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="learned kernel models (default: roofline only)")
    ap.add_argument("--analytic", action="store_true", help="learned models only inside their fitted hardware")
    ap.add_argument(
        "--gpus", default="A100-SXM4-80GB,H100-SXM,B200", help="comma-separated GPUs, the first is the reference"
    )
    args = ap.parse_args()

    kernels = (
        load_kernel_cost(args.models, in_range_only=args.analytic)
        if args.models is not None
        else roofline_only("no --models: every kernel from the roofline fallback (the analytical path)")
    )
    devices = [get_device(g) for g in split_gpu_list(args.gpus)]
    print(f"kernel times: {kernels.describe()['notes'][0]}")

    t0 = time.perf_counter()
    train = compare(GPT3_TRAIN, devices, kernels=kernels)
    t1 = time.perf_counter()
    c = GPT3_TRAIN.config
    print(
        f"\nGPT-3 175B training step: {c.tp * c.pp * c.dp} GPUs, tp {c.tp}, pp {c.pp}, dp {c.dp}, global batch "
        f"{c.global_batch} x {c.seq}, recompute {c.recompute} ({(t1 - t0) * 1e3:.0f} ms for {len(devices)} predictions)"
    )
    line = " -> ".join(f"{o.device.name} {train.outcomes[0].time_s / o.time_s:.2f}x" for o in train.outcomes)
    print(f"  speed-up of the iteration: {line}")
    _table(train, lambda p: True)
    _shares(train, "iteration")

    t0 = time.perf_counter()
    decode = compare(LLAMA_DECODE, devices, kernels=kernels)
    t1 = time.perf_counter()
    c = LLAMA_DECODE.config
    print(
        f"\nLlama-2 70B decode step: tp {c.tp}, batch {c.batch}, prompt {c.prompt_len}, generate {c.gen_len} "
        f"({(t1 - t0) * 1e3:.0f} ms for {len(devices)} predictions)"
    )
    tpot = [o.result.tpot_s for o in decode.outcomes]
    print(
        "  speed-up of the decode step (TPOT): "
        + " -> ".join(f"{o.device.name} {tpot[0] / t:.2f}x" for o, t in zip(decode.outcomes, tpot))
    )
    _table(decode, lambda p: p in ("tpot", "ttft") or p.startswith("decode_step/"))
    _shares(decode, "decode step", "decode_step")
    for o in decode.outcomes:
        g = decode_gemms(o.result, kernels) if o.split is not None else []
        if g:
            print(
                f"  {o.device.name}: decode GEMMs at {g[0]['arithmetic_intensity_flop_per_byte']:.0f} FLOP/byte vs "
                f"ridge "
                f"{g[0]['ridge_flop_per_byte']:.0f} -> {', '.join(sorted({x['roofline_bound'] for x in g}))}-bound"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
