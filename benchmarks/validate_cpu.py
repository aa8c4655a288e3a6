"""Does opcast predict training steps on this CPU? Targets (issue 7, on the 2-core machine):
`opcast calibrate --device cpu` in under 15 minutes, after which validate on GPT-2-style and
Llama-style archs (hidden 512-1024, 6-12 layers, sequence 256-1024) is within 15 % of the measured
step time, and the measured time falls inside the 90 % interval in at least 8 of 10 configurations.

Usage:
    python benchmarks/validate_cpu.py --out runs/validate-cpu [--budget-s 840]   # calibrate, then validate
    python benchmarks/validate_cpu.py --models runs/validate-cpu                 # validate an existing model set
    python benchmarks/validate_cpu.py --out runs/smoke --budget-s 120 --configs 2 --steps 2   # smoke run

Calibration measures exactly the shapes of the configurations below (each at its batch and
sequence length) and then Sobol samples, fits, and skips its own before/after validations; the
benchmark validates, each configuration in a fresh process (opcast.check.isolated), every
configuration with the calibrated models and, for reference, predicts the measured step with the
embedded default models too. Run it on a quiet machine: on a shared 2-core box every parallel op
waits for a descheduled thread and no timing means anything (``taskset -c N`` pins a run to N cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from opcast.archs import ArchSpec
from opcast.check.validate import CHECK_ARCHS

# The check archs of `opcast validate`, renamed: this benchmark rescales their width and depth.
GPT2 = replace(
    CHECK_ARCHS["gpt2-124m"],
    name="gpt2-style",
    source="GPT-2 (Radford et al. 2019) block and vocab at the given width and depth",
)
LLAMA = replace(
    CHECK_ARCHS["llama-style-125m"],
    name="llama-style",
    source="Llama-2 (Touvron et al. 2023) block, GQA, 32000 vocab at the given width and depth",
)


def _arch(base: ArchSpec, hidden: int, layers: int) -> ArchSpec:
    heads = hidden // 64
    kv = heads if base.n_kv_heads == base.n_heads else max(1, heads // 4) if heads % 4 == 0 else heads // 2
    ffn = 4 * hidden if not base.gated_mlp else 64 * round(8 * hidden / 3 / 64)  # Llama's 8/3 h, rounded to 64
    return replace(
        base,
        name=f"{base.name}-h{hidden}-l{layers}",
        hidden=hidden,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv,
        ffn_hidden=ffn,
    )


CONFIGS: list[tuple[ArchSpec, int, int]] = [
    # (arch, batch, seq): hidden 512-1024, 6-12 layers, seq 256-1024, small batch
    (_arch(GPT2, 512, 6), 2, 256),
    (_arch(LLAMA, 512, 6), 2, 256),
    (_arch(GPT2, 768, 12), 1, 256),
    (_arch(LLAMA, 768, 12), 1, 256),
    (_arch(GPT2, 768, 8), 1, 512),
    (_arch(LLAMA, 768, 8), 1, 512),
    (_arch(GPT2, 1024, 6), 1, 512),
    (_arch(LLAMA, 1024, 12), 1, 512),
    (_arch(GPT2, 1024, 12), 1, 1024),
    (_arch(LLAMA, 1024, 6), 1, 1024),
]
TARGET_PCT = 15.0


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.3f} {unit}" if unit == "s" else f"{x:+.1f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="calibration folder (data, model set, reports); resumable")
    ap.add_argument("--models", type=Path, help="validate with this model set instead of calibrating")
    ap.add_argument("--budget-s", type=float, default=840.0, help="calibration budget (default 14 minutes)")
    ap.add_argument("--configs", type=int, default=len(CONFIGS), help="validate only the first N configurations")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per validation")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-default", action="store_true", help="skip the reference validation with the default models")
    args = ap.parse_args()
    if (args.out is None) == (args.models is None):
        ap.error("give --out (calibrate first) or --models (an existing model set)")
    configs = CONFIGS[: max(1, args.configs)]

    from opcast.check.calibrate import CalibrateConfig, Workload, run_calibrate
    from opcast.check.isolated import in_fresh_process
    from opcast.check.validate import predict_step, run_validate
    from opcast.collect.local_device import describe_local
    from opcast.errors import OpcastError
    from opcast.predict.cost import load_kernel_cost

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        calibrate = None
        models = args.models
        if args.out is not None:
            cfg = CalibrateConfig(
                out=args.out,
                device="cpu",
                budget_s=args.budget_s,
                checks=(),
                workloads=tuple(Workload(arch=a, batch=b, seq=s) for a, b, s in configs),
            )
            t0 = time.monotonic()
            calibrate = run_calibrate(cfg, log=log)
            log(
                f"calibrate: {time.monotonic() - t0:.0f} s (target < 900 s); {calibrate.rows_total} rows, "
                f"{len(calibrate.fit_groups)} predictors; stages "
                f"{ ({k: round(v) for k, v in calibrate.seconds.items()}) }"
            )
            if calibrate.interrupted:
                log("interrupted during collection; re-run the same command to resume")
                return 130
            if calibrate.models is None:  # a busy machine, a spent budget or too wide an interval
                log(f"calibrate failed: {calibrate.failure}")
                return 2
            models = Path(calibrate.models)
        spec = describe_local("cpu")
        default = None if args.no_default else load_kernel_cost(None)
        rows = []
        for arch, batch, seq in configs:
            log(f"validate {arch.name} batch {batch} x seq {seq}")
            r = in_fresh_process(
                run_validate, arch, batch=batch, seq=seq, steps=args.steps, warmup=args.warmup, models=models
            )
            tot = r.phase("total")
            d = (
                predict_step(
                    arch, spec, batch=batch, seq=seq, precision="fp32", attention="flash", world=1, kernels=default
                ).iteration_time_s
                if default
                else None
            )
            rows.append(
                {
                    "arch": arch.name,
                    "params_m": r.params / 1e6,
                    "batch": batch,
                    "seq": seq,
                    "measured_s": tot.measured_s,
                    "predicted_s": tot.predicted_s,
                    "error_pct": tot.error_pct,
                    "interval_s": r.iteration_time_interval_s,
                    "inside": r.inside_interval,
                    "roofline_share": r.roofline_share,
                    "default_error_pct": 100 * (d - tot.measured_s) / tot.measured_s if d else None,
                    "phases": {p.phase: [p.measured_s, p.predicted_s] for p in r.phases},
                }
            )
    except OpcastError as err:
        print(f"validate_cpu: error: {err}", file=sys.stderr)
        return 2

    print(
        f"{'config':<22} {'M params':>8} {'b x s':>9} {'measured':>10} {'predicted':>10} {'error':>8} "
        f"{'interval':>20} {'inside':>6} {'roofline':>8} {'default err':>11}"
    )
    for row in rows:
        lo_hi = row["interval_s"]
        interval = f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else "-"
        inside = "-" if row["inside"] is None else "yes" if row["inside"] else "no"
        print(
            f"{row['arch']:<22} {row['params_m']:8.1f} {row['batch']:>3} x {row['seq']:<4} "
            f"{_fmt(row['measured_s']):>10} "
            f"{_fmt(row['predicted_s']):>10} {_fmt(row['error_pct'], '%'):>8} {interval:>20} {inside:>6} "
            f"{100 * row['roofline_share']:7.0f}% {_fmt(row['default_error_pct'], '%'):>11}"
        )
    within = sum(abs(r["error_pct"]) <= TARGET_PCT for r in rows)
    inside = sum(bool(r["inside"]) for r in rows)
    has_interval = sum(r["interval_s"] is not None for r in rows)
    print(
        f"within {TARGET_PCT:.0f} %: {within} of {len(rows)}; inside the interval: "
        + (f"{inside} of {has_interval}" if has_interval else "no interval in the predictions")
    )
    if calibrate is not None:
        print(
            f"calibrate: {calibrate.seconds.get('total', 0):.0f} s of a {args.budget_s:.0f} s budget (target < 900 s)"
        )
    if args.out is not None:
        doc = {"configs": rows, "calibrate": calibrate.to_dict() if calibrate else None}
        (args.out / "validate_cpu.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
