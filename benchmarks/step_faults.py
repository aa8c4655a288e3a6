"""Page faults and system time of one CPU training step (why CPU steps run slower than their kernels).

    python benchmarks/step_faults.py ARCH BATCH SEQ [--steps N]

Builds ARCH as validate does (``check/torch_model.py``, fp32, fused AdamW, gradients set to None
after each step), runs two warm-up steps, then reports per step (median of N): wall time, system
and user CPU time, and the minor page faults as GiB of 4 KiB pages. PyTorch's CPU allocator does
not cache, so every step's gradients and saved activations are fresh pages; a kernel timed alone
in a loop mostly gets its output back from the C heap. ARCH is a preset name or a JSON file.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch")
    ap.add_argument("batch", type=int)
    ap.add_argument("seq", type=int)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)

    import os

    import torch

    from opcast.check.torch_model import build_model
    from opcast.check.validate import resolve_arch

    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    arch = resolve_arch(args.arch)
    model = build_model(arch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, arch.vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, arch.vocab, (args.batch, args.seq), generator=gen)

    def step() -> None:
        model(ids, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    rows = []
    for _ in range(args.steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        rows.append(
            (
                t1 - t0,
                r1.ru_stime - r0.ru_stime,
                r1.ru_utime - r0.ru_utime,
                (r1.ru_minflt - r0.ru_minflt) * 4096 / 2**30,
            )
        )
    wall, sys_s, user_s, gib = (statistics.median(x) for x in zip(*rows))
    print(
        f"{arch.name} {args.batch} x {args.seq}: step {wall:.3f} s wall; system {sys_s:.3f} s, user {user_s:.3f} s "
        f"({torch.get_num_threads()} threads); {gib:.2f} GiB of fresh 4 KiB pages per step "
        f"({sys_s / gib if gib else float('nan'):.2f} s of system time per GiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
