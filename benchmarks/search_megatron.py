"""Does `opcast search` find Megatron-LM's published configurations (or better)? Target (issue 6):
the top configuration's predicted throughput is within 5 % of the predicted throughput of the
configuration the authors chose, or better.

Usage:  python benchmarks/search_megatron.py [--models DIR] [--overlap-grad-reduce]

Runs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", arXiv 2104.04473; A100-80GB DGX nodes, sequence 2048, mixed precision, full
activation recomputation, micro-batch 1):

- **175B** (174.6B, 96 layers, hidden 12288): Table 2's PTD-P row on 1536 GPUs, TP 8 x PP 12 (model-
  parallel size 96), DP 16, batch 1536, 141 TFLOP/s per GPU. Table 1 has no 175B row (its nearest is
  145.6B); Table 2 is where the paper gives the configuration of its 175B model.
- **530B** (529.6B, 105 layers, hidden 20480): Table 1 on 2520 GPUs, TP 8 x PP 35, DP 9, batch 2520,
  163 TFLOP/s per GPU.

"The authors' choice" fixes what the paper states (tp, pp, dp, micro-batch 1, full recomputation)
and what Megatron-LM of 2021 lacked (sequence and context parallelism, ZeRO / the distributed
optimizer: off); the schedule is not stated per row, so we report 1F1B and the best interleaving
(every v), and compare with the better of the two. Gradient reduction is not overlapped with the
backward (Megatron-LM of 2021 reduced after it) unless --overlap-grad-reduce; the search uses the
same setting. The search itself is free to use everything (sp, cp, ZeRO, selective recomputation); a second,
restricted search shows what it picks with the 2021 features only (any tp, pp, micro-batch and
schedule; full recomputation, no sp, cp or ZeRO).
The predicted TFLOP/s per GPU uses the paper's Eq. 3 count (``96 B s l h^2 (1 + s/6h + V/16lh)``, which
includes the recomputation forward) so it reads against the published figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

CASES = [
    # (label, arch, gpus, global batch, tp, pp, published TFLOP/s per GPU, source, published ZeRO-3 TFLOP/s)
    ("175B", "megatron-175b", 1536, 1536, 8, 12, 141.0, "Table 2, PTD-P row, 1536 GPUs", 44.0),
    ("530B", "megatron-530b", 2520, 2520, 8, 35, 163.0, "Table 1, 529.6B row", None),
]
"""The last field: Table 2's ZeRO-3-without-model-parallelism row at the same GPU count and batch
(micro-batch 1), a check of how the cost model prices the ZeRO-3 layouts the search may pick."""
SEQ = 2048
GPU = "A100-SXM4-80GB"


def eq3_tflops_per_gpu(arch, global_batch: int, iteration_s: float, gpus: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs per iteration with full recomputation, per GPU and second."""
    B, s, l, h, V = global_batch, SEQ, arch.n_layers, arch.hidden, arch.vocab
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return flops / (iteration_s * gpus) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None, help="learned model set (default: the embedded one, if any)")
    ap.add_argument(
        "--overlap-grad-reduce", action="store_true", help="overlap the DP reduction (search and authors' config)"
    )
    args = ap.parse_args()

    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.search import SearchSpace, describe_config, search
    from opcast.predict.training import predict_train

    device = get_device(GPU)
    sources = [("roofline", load_kernel_cost(None, use_learned=False))]
    learned = load_kernel_cost(args.models)
    if learned.models_label is not None:
        sources.append((f"learned ({learned.models_label})", learned))
    else:
        print(f"learned models: none ({'; '.join(learned.notes)}); roofline only")
    overlap = args.overlap_grad_reduce
    met_all = True
    for label, arch_name, gpus, gb, tp, pp, published, source, zero3_published in CASES:
        arch = load_arch(arch_name)
        dp = gpus // (tp * pp)
        for src_label, kernels in sources:
            print(
                f"{label}: {arch.name} on {gpus} x {GPU}, batch {gb} x {SEQ}; authors: tp {tp}, pp {pp}, dp {dp}, "
                f"micro-batch 1, full recomputation ({source}, {published:.0f} TFLOP/s per GPU) -- kernels: {src_label}"
            )
            space = SearchSpace(gpus=gpus, global_batch=gb, seq=SEQ, overlap_grad_reduce=overlap)
            t0 = time.perf_counter()
            result = search(arch, device, space, kernels=kernels, top=3)
            wall = time.perf_counter() - t0
            stages = ", ".join(f"{k} {v:.2f}" for k, v in result.seconds.items())
            print(
                f"  search: considered {result.considered:,}, pruned {sum(result.pruned.values()):,}, predicted "
                f"{result.predicted:,} in {wall:.2f} s ({stages}; {result.considered / wall:,.0f} configurations/s, "
                f"{result.workers} process(es))"
            )
            plain = predict_train(
                arch,
                device,
                TrainConfig(
                    tp=tp,
                    pp=pp,
                    dp=dp,
                    micro_batch=1,
                    global_batch=gb,
                    seq=SEQ,
                    recompute="full",
                    overlap_grad_reduce=overlap,
                ),
                kernels=kernels,
                details=False,
            )
            fixed = {
                "tp": (tp,),
                "pp": (pp,),
                "cp": (1,),
                "sp": (False,),
                "zero": (0,),
                "recompute": ("full",),
                "micro_batch": (1,),
            }
            best_auth = search(
                arch,
                device,
                SearchSpace(gpus=gpus, global_batch=gb, seq=SEQ, overlap_grad_reduce=overlap, fixed=fixed),
                kernels=kernels,
                top=1,
            )
            # the search restricted to what Megatron-LM had in 2021, every layout and schedule free
            era = search(
                arch,
                device,
                SearchSpace(
                    gpus=gpus,
                    global_batch=gb,
                    seq=SEQ,
                    overlap_grad_reduce=overlap,
                    fixed={"cp": (1,), "sp": (False,), "zero": (0,), "recompute": ("full",)},
                ),
                kernels=kernels,
                top=1,
            )
            rows = []
            if plain.feasible:
                rows.append(
                    (
                        "authors, 1F1B",
                        describe_config(plain.config),
                        plain.tokens_per_s,
                        plain.iteration_time_s,
                        plain.mfu,
                        plain.worst_memory.total_bytes,
                    )
                )
            else:
                print(f"  authors' 1F1B configuration does not fit here: {'; '.join(plain.reasons)}")
            if best_auth.candidates:
                c = best_auth.candidates[0]
                rows.append(
                    (
                        "authors, best schedule",
                        describe_config(c),
                        c.tokens_per_s,
                        c.iteration_time_s,
                        c.mfu,
                        c.memory_bytes,
                    )
                )
            if era.candidates:
                c = era.candidates[0]
                rows.append(
                    (
                        "search, 2021 features",
                        describe_config(c),
                        c.tokens_per_s,
                        c.iteration_time_s,
                        c.mfu,
                        c.memory_bytes,
                    )
                )
            for rank, c in enumerate(result.candidates[:3], start=1):
                rows.append(
                    (f"search #{rank}", describe_config(c), c.tokens_per_s, c.iteration_time_s, c.mfu, c.memory_bytes)
                )
            for who, cfg, tps, it, mfu, mem in rows:
                print(
                    f"  {who:23s} {cfg:40s} {tps:>10,.0f} tokens/s  iteration {it:7.3f} s  MFU {100 * mfu:5.1f} %  "
                    f"Eq.3 {eq3_tflops_per_gpu(arch, gb, it, gpus):5.1f} TFLOP/s/GPU  {mem / 2**30:5.1f} GiB"
                )
            if zero3_published is not None:
                z3 = predict_train(
                    arch,
                    device,
                    TrainConfig(
                        tp=1,
                        pp=1,
                        dp=gpus,
                        micro_batch=1,
                        global_batch=gb,
                        seq=SEQ,
                        recompute="full",
                        zero=3,
                        overlap_grad_reduce=overlap,
                    ),
                    kernels=kernels,
                    details=False,
                )
                if z3.feasible:
                    z3_tflops = eq3_tflops_per_gpu(arch, gb, z3.iteration_time_s, gpus)
                    print(
                        f"  sanity, ZeRO-3 without model parallelism (Table 2, same GPUs, micro-batch 1): predicted "
                        f"Eq.3 {z3_tflops:.0f} TFLOP/s/GPU vs published {zero3_published:.0f}"
                        + (
                            " -- the model hides ZeRO-3's per-layer gathers behind compute, so rankings that put "
                            "ZeRO-3 first are optimistic (--fix zero=0,1,2 excludes it)"
                            if z3_tflops > 1.5 * zero3_published
                            else ""
                        )
                    )
            authors = max((r[2] for r in rows if r[0].startswith("authors")), default=None)
            if authors is None or not result.candidates:
                print("  check: cannot compare (nothing feasible)")
                met_all = False
            else:
                ratio = result.candidates[0].tokens_per_s / authors
                ok = ratio >= 0.95
                met_all &= ok
                print(
                    f"  check: search top / authors' best = {ratio:.3f} -- target >= 0.95: {'met' if ok else 'MISSED'}"
                )
                if era.candidates:
                    print(
                        f"  with 2021 features only (full recomputation, no sp/cp/ZeRO): search top / authors' best = "
                        f"{era.candidates[0].tokens_per_s / authors:.3f}"
                    )
            print()
    print(f"Megatron checks: {'all met' if met_all else 'NOT all met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
