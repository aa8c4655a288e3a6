"""A Hopper GPU in the fp32 fit: what the H200's NeuSight-protocol rows teach (issue 19).

    python benchmarks/hopper_fp32.py [--published ../shared/published] [--work DIR] [--guard A100-PCIe-40GB,T4]
        [--out benchmarks/results/hopper_fp32.md]

The fp32 groups of ``models/default`` (GEMM, elementwise, layernorm, softmax on CUDA cores) were fitted on NeuSight's
five GPUs (P4, P100, T4, V100, A100-40GB PCIe: Pascal to Ampere); a Hopper GPU, NeuSight's held-out H100 SXM5 among
them, was an extrapolation in every spec (peak 3.4x, bandwidth 3x, SMs 1.2x, clock 1.2x beyond the fitted range).
``benchmarks/data/h200_torch/kernels/neusight_fp32`` holds 1,693 forward kernels timed on an H200 SXM by NeuSight's
own protocol (``opcast collect bench --timing neusight --dtype fp32``: each call alone between two CUDA events, 25
calls, the mean of the fastest 5, no L2 flush; 1,031 GEMMs, 248 elementwise, 207 layernorm, 207 softmax; 1,706 were
timed, and 13 eager ``silu(a) * b`` chains timed under the fused ``swiglu`` were dropped; the shapes
are ``collect bench``'s seeded Sobol samples and the exact shapes of GPT-2 Large, GPT-3 XL, GPT-3 2.7B and OPT-1.3B,
none taken from NeuSight's files). Since this script, ``benchmarks/train_default_models.sh`` fits them too.

Sets fitted (``opcast train fit``'s library, :func:`opcast.train.fit.fit_model_set`, its defaults, seed 0; cached in
``--work`` by name and reused):

- ``neusight``: NeuSight's five GPUs, every row (the fp32 groups of ``models/default`` before this data);
- ``neusight+h200``: the same plus the H200 rows whose shape is not in the held-out fifth (a seeded hash of the
  shape, :func:`opcast.train.splits.grouped_mask`);
- for each ``--guard`` GPU, both sets again without that GPU (``--holdout-device``), scored on all its rows: whether
  a Hopper GPU in the fit helps or hurts a GPU that is left out.

Tables: (1) the held-out fifth of the H200's shapes, priced by each set through ``opcast predict``'s path
(:func:`opcast.predict.cost.load_kernel_cost`, :func:`opcast.predict.batch.predict_frame`) on the H200's specs: what
the models knew of a Hopper GPU before (an unseen GPU), and after (a seen GPU, unseen shapes); by op and by measured
duration. (2) the guard folds. (3) A proxy for the H100 SXM5 (NeuSight's held-out Hopper, whose rows we do not
hold): it has the H200's GH100 compute (132 SMs, 1.98 GHz, 67 TFLOP/s fp32) and 70 % of its bandwidth, so on the
held-out GEMMs that are compute-bound on the H100's specs by 2x or more its time is the H200's; each set prices
them on the H100's specs against the H200's measured time. A proxy, not a measurement: it says how far each set
is from the H200's level when asked for an H100.

Skips with a message when the published folder is absent.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO.parent / "shared" / "published"
H200_ROWS = REPO / "benchmarks" / "data" / "h200_torch" / "kernels" / "neusight_fp32"
HELD_OUT_FRACTION = 0.2
"""Share of the H200's shapes held out of ``neusight+h200`` and scored."""
SPLIT_SEED = 0
COMPUTE_BOUND_RATIO = 2.0
"""H100-proxy rows: GEMMs whose roofline compute time on the H100 SXM is at least this many times its memory time."""
DURATION_BINS_S = (0.0, 30e-6, 100e-6, 1e-3, np.inf)
DURATION_LABELS = ("< 30 us", "30-100 us", "0.1-1 ms", ">= 1 ms")


def fit_set(work: Path, name: str, datasets: list[Path], holdout: tuple[str, ...] = ()) -> Path:
    """``work/models/name``, fitted unless it is there (delete it to refit)."""
    from opcast.train.fit import FitConfig, fit_model_set

    path = work / "models" / name
    if not (path / "meta.json").is_file():
        print(f"fitting {name} ...", file=sys.stderr, flush=True)
        fit_model_set(datasets, work / "models", name=name, cfg=FitConfig(holdout_devices=holdout, seed=0))
    return path


def priced(models: Path, rows: pd.DataFrame, gpu: str) -> np.ndarray:
    """Seconds per row as ``opcast predict kernels --models MODELS --gpu GPU`` answers them."""
    from opcast.hardware import get_device
    from opcast.predict.batch import predict_frame
    from opcast.predict.cost import load_kernel_cost

    filled = predict_frame(rows.reset_index(drop=True), get_device(gpu), load_kernel_cost(models))
    return filled["time_s_pred"].to_numpy(dtype=float)


def ape_row(label: str, pred: np.ndarray, true: np.ndarray) -> dict[str, object]:
    ape = np.abs(pred / true - 1.0) * 100
    signed = (pred / true - 1.0) * 100
    return {
        "rows": label,
        "n": len(true),
        "MAPE %": round(float(np.mean(ape)), 1),
        "median APE %": round(float(np.median(ape)), 1),
        "median signed %": round(float(np.median(signed)), 1),
        "within 10 %": round(float(np.mean(ape <= 10) * 100), 1),
    }


def markdown(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|"
    lines = ["| " + " | ".join(cols) + " |", rule]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--published", type=Path, default=PUBLISHED)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "opcast-hopper-fp32")
    ap.add_argument("--guard", default="A100-PCIe-40GB,T4", help="NeuSight GPUs left out in turn ('' for none)")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables as markdown here")
    args = ap.parse_args()
    if not (args.published / "neusight").is_dir():
        print(f"skipped: {args.published / 'neusight'} is absent (NeuSight's published data)")
        return 0

    from opcast.collect.replay import run_replay
    from opcast.hardware import get_device
    from opcast.schema import read_dataset, write_parquet
    from opcast.train.splits import grouped_mask, shape_groups

    work = args.work
    ns_dir = work / "data" / "neusight"
    if not any(ns_dir.glob("*.parquet")):
        run_replay("neusight", args.published / "neusight", ns_dir)
    h200 = read_dataset(H200_ROWS)
    held = grouped_mask(shape_groups(h200), HELD_OUT_FRACTION, SPLIT_SEED)
    train_dir = work / "data" / "h200-train"
    if not any(train_dir.glob("*.parquet")):
        train_dir.mkdir(parents=True, exist_ok=True)
        write_parquet(h200[~held].reset_index(drop=True), train_dir / "h200-train.parquet")
    test = h200[held].reset_index(drop=True)
    true = test["time_s_median"].to_numpy(dtype=float)
    sets = {
        "neusight (H200 unseen)": fit_set(work, "neusight", [ns_dir]),
        "neusight+h200 (H200 seen, shapes unseen)": fit_set(work, "neusight+h200", [ns_dir, train_dir]),
    }
    report = [
        "# A Hopper GPU in the fp32 fit (generated by `python benchmarks/hopper_fp32.py`)",
        "",
        f"H200 rows: {len(h200)} forward fp32 kernels timed by NeuSight's protocol; held out of `neusight+h200`: "
        f"{len(test)} rows ({HELD_OUT_FRACTION:.0%} of the shapes, seed {SPLIT_SEED}).",
        "",
        "## 1. The H200's held-out shapes, priced on the H200",
        "",
    ]
    preds = {label: priced(path, test, "H200") for label, path in sets.items()}
    rows = []
    for label, pred in preds.items():
        for op in sorted(pd.unique(test["op"])):
            m = (test["op"] == op).to_numpy()
            rows.append({"set": label, **ape_row(op, pred[m], true[m])})
        rows.append({"set": label, **ape_row("all", pred, true)})
    report += [markdown(pd.DataFrame(rows)), "", "By measured duration, GEMMs:", ""]
    bins = pd.cut(test["time_s_median"], DURATION_BINS_S, labels=DURATION_LABELS, right=False)
    rows = []
    for label, pred in preds.items():
        for b in DURATION_LABELS:
            m = ((bins == b) & (test["op"] == "gemm")).to_numpy()
            if m.any():
                rows.append({"set": label, **ape_row(f"gemm {b}", pred[m], true[m])})
    report += [markdown(pd.DataFrame(rows)), ""]

    guards = [g for g in args.guard.split(",") if g]
    if guards:
        report += [
            "## 2. Guard: a NeuSight GPU left out, with and without the H200 in the fit",
            "",
            "Scored on every row of the left-out GPU (its training sweeps and test files), fitted on the other four "
            "(and the H200's rows but the held-out fifth).",
            "",
        ]
        ns_rows = read_dataset(ns_dir)
        rows = []
        for dev in guards:
            target = ns_rows[ns_rows["device"] == dev].reset_index(drop=True)
            if target.empty:
                print(f"--guard {dev}: no NeuSight rows of that GPU", file=sys.stderr)
                return 2
            t = target["time_s_median"].to_numpy(dtype=float)
            for label, extra in (("neusight", []), ("neusight+h200", [train_dir])):
                path = fit_set(work, f"{label}-without-{dev}", [ns_dir, *extra], holdout=(dev,))
                pred = priced(path, target, dev)
                for op in sorted(pd.unique(target["op"])):
                    m = (target["op"] == op).to_numpy()
                    rows.append({"left out": dev, "set": label, **ape_row(op, pred[m], t[m])})
        report += [markdown(pd.DataFrame(rows)), ""]

    h100 = get_device("H100-SXM")
    gemm = test[test["op"] == "gemm"].reset_index(drop=True)
    flops = 2.0 * gemm["b"] * gemm["m"] * gemm["n"] * gemm["k"]
    traffic = 4.0 * gemm["b"] * (gemm["m"] * gemm["k"] + gemm["k"] * gemm["n"] + gemm["m"] * gemm["n"])
    bound = (flops / h100.peak_fp32_flops >= COMPUTE_BOUND_RATIO * traffic / h100.mem_bw_bytes_per_s).to_numpy()
    proxy = gemm[bound].reset_index(drop=True)
    report += [
        "## 3. Proxy for the H100 SXM5: held-out GEMMs compute-bound on its specs, priced as an H100",
        "",
        f"{len(proxy)} of the {len(gemm)} held-out GEMMs have a compute time on the H100 SXM's specs at least "
        f"{COMPUTE_BOUND_RATIO:g}x their memory time (operands and result once, fp32); the H100 runs them at the "
        "H200's speed (same SMs, clock and fp32 peak), so the H200's measured time stands in for the H100's.",
        "",
    ]
    rows = []
    pt = proxy["time_s_median"].to_numpy(dtype=float)
    for label, path in sets.items():
        rows.append({"set": label, **ape_row("gemm, compute-bound", priced(path, proxy, "H100-SXM"), pt)})
    report += [markdown(pd.DataFrame(rows)), ""]
    text = "\n".join(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
