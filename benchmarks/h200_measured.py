"""opcast's predictions against what was measured on a real H200 (first-party, 2026-12-04).

The measurements are in ``benchmarks/data/h200_torch`` (one NVIDIA H200 SXM, driver 580.159, torch
2.11.0+cu130, CUDA 13.0; opcast at 5e96910 / 7ac2888):

- ``validate/*.json``: ``opcast validate --device cuda --precision bf16 --json [--profile]`` of four
  training steps (the configurations in ``RUNS``): the median of 5 timed steps after 2 warm-ups, each
  phase and, with ``--profile``, torch.profiler's device time per op group. PyTorch eager, torch SDPA's
  flash attention, fused AdamW over fp32 master weights (``opcast.check.validate``).
- ``kernels/collect``: ``benchmarks/h200_collect.sh`` with a 150 s budget (503 rows: every kind in
  bf16 and fp16 on Sobol and arch shapes, fp8 GEMMs, some fp32). Collected before 92a3dcc: every
  row is timed with CUDA events, so a call under ~50 us also carries the host's launch time
  (about 5-27 us a call on that virtual machine).
- ``kernels/calibrate``: the 141 rows ``opcast calibrate --device cuda`` measured in its 84 s share
  (llama3-8b's shapes at 4 layers first), after 92a3dcc: 24 of them timed in CUDA graphs.
- A second session (twenty-fifth, opcast 230d0f0), the same machine: ``kernels/bf16_gemm``, ``collect bench
  --dtype bf16 --op gemm`` for 180 s (915 rows, 458 forward: 240 of them graph-timed) -- priced in its own
  table; ``kernels/neusight_fp32`` and ``kernels/neusight_bwd``, ``collect bench --timing neusight --dtype fp32
  --op gemm|elementwise|layernorm|softmax`` with GPT-2 Large's, GPT-3 XL's, GPT-3 2.7B's and OPT-1.3B's shapes
  (``--tp 1``) for 350 s: 1,706 forward rows (1,693 kept: 13 eager ``silu(a) * b`` chains timed as the fused
  ``swiglu`` dropped), which ``models/default`` fits on (``benchmarks/hopper_fp32.py``), and 1,619 backward rows
  (1,606 kept, the same 13 dropped; ``autograd.grad`` alone between two events, the host's autograd work inside
  each), kept as measured and fitted on by nothing.

This script predicts all of it again with today's code and model set (``--models`` for another),
so the table moves when the models do; no GPU is needed. Kernels are priced as ``opcast predict``
prices them (``KernelCostModel.lookup``: the learned models, their physical bounds, the roofline
where nothing learned answers), not by ``train eval``'s raw model outputs.

    python benchmarks/h200_measured.py                 # ~10 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "h200_torch"

RUNS: dict[str, tuple[str, int | None, int, int]] = {
    # file: (arch, --layers, --batch, --seq); all bf16, flash attention, one GPU
    "l3-8b-4L": ("llama3-8b", 4, 2, 2048),
    "l3-8b-4L-s8k": ("llama3-8b", 4, 1, 8192),
    "l2-7b-4L": ("llama2-7b", 4, 4, 4096),
    "gpt2": ("gpt2-124m", None, 8, 1024),
}

TRUSTED_S = {"fwd": 50e-6, "bwd": 500e-6}
"""Event-timed kernels at least this long are compared: the host's time is then a small part of them.
A backward is timed through autograd, whose host work is larger: the smallest shapes read 60-240 us
(rmsnorm backward of 8 x 140: 72 us)."""


def _pct(pred: float, meas: float) -> str:
    return f"{100 * (pred / meas - 1):+.1f} %" if meas > 0 else "-"


def steps_section(cost, spec) -> list[str]:
    from opcast.check.validate import _predicted_groups, predict_step, resolve_arch

    lines = [
        "## Training steps: measured (opcast validate on the H200) vs predicted now",
        "",
        "| run | phase | measured ms | predicted ms | error |",
        "|---|---|---:|---:|---:|",
    ]
    groups: list[str] = []
    totals: list[float] = []
    for name, (arch_name, layers, batch, seq) in RUNS.items():
        doc = json.loads((DATA / "validate" / f"{name}.json").read_text())
        if (doc["batch"], doc["seq"], doc["precision"], doc["device"]) != (batch, seq, "bf16", "H200"):
            raise SystemExit(f"{name}.json does not hold the run RUNS describes")
        arch = resolve_arch(arch_name, layers)
        result = predict_step(
            arch, spec, batch=batch, seq=seq, precision="bf16", attention="flash", world=1, kernels=cost
        )
        b = result.breakdown_s
        predicted = {
            "forward": b["forward"],
            "backward": b["backward"],
            "optimizer": b["optimizer"],
            "total": result.iteration_time_s,
            "forward_nograd": b["forward"],
        }
        label = f"{arch_name}{f' {layers} layers' if layers else ''}, batch {batch} x seq {seq}"
        for p in doc["phases"]:
            meas, pred = p["measured_s"], predicted[p["phase"]]
            lines.append(f"| {label} | {p['phase']} | {1e3 * meas:.2f} | {1e3 * pred:.2f} | {_pct(pred, meas)} |")
            if p["phase"] == "total":
                totals.append(abs(pred / meas - 1))
        if doc.get("profile"):
            pred_groups = _predicted_groups(result)
            for g in doc["profile"]:
                meas = g["measured_s"]
                pred = pred_groups.get(g["group"], (0.0, {}))[0]
                if meas > 0 and pred > 0:
                    groups.append(
                        f"| {label} | {g['group']} | {1e3 * meas:.2f} | {1e3 * pred:.2f} | {_pct(pred, meas)} |"
                    )
    lines += [
        "",
        f"Mean |error| of the whole step over the {len(totals)} runs: {100 * statistics.fmean(totals):.1f} %.",
        "",
        "Per op group (torch.profiler's device time summed over the profiled step, against the predicted kernels of",
        "the group):",
        "",
        "| run | group | measured ms | predicted ms | error |",
        "|---|---|---:|---:|---:|",
        *groups,
    ]
    return lines


def _as_priced(row, spec) -> dict:
    """The row's parameters as opcast prices the kernel collect ran: collect's attention ``flash`` is torch SDPA's
    flash backend, which on Hopper and Blackwell opcast prices as ``flash2`` (what validate and ``--framework hf``
    predict; collect labels it so since b7416ca: :func:`opcast.ops.sdpa_flash_family`)."""
    from opcast.ops import sdpa_flash_family
    from opcast.schema import row_params

    params = row_params(row)
    if row["op"] == "attention" and params.get("impl") == "flash":
        params["impl"] = sdpa_flash_family(spec.architecture)
    return params


def kernels_section(cost, spec) -> list[str]:
    import numpy as np

    from opcast.predict.cost import kernel
    from opcast.schema import read_dataset

    frame = read_dataset([DATA / "kernels" / "collect", DATA / "kernels" / "calibrate"])
    ks = [
        kernel(r["op"], _as_priced(r, spec), r["dtype"], r["direction"], bool(r["tensor_cores"]))
        for _, r in frame.iterrows()
    ]
    priced = cost.lookup(ks, spec)
    frame["ratio"] = [priced[k][0] for k in ks] / frame["time_s_median"].to_numpy()
    frame["learned"] = [priced[k][1] == "learned" for k in ks]
    floor = frame["direction"].map(TRUSTED_S).fillna(TRUSTED_S["fwd"])
    trusted = frame[(frame["time_s_median"] >= floor) | (frame["timing_method"] == "cuda_graph")]
    lines = [
        "## Kernels: measured on the H200 vs priced now (predicted / measured)",
        "",
        f"{len(trusted)} of {len(frame)} rows: those timed in a CUDA graph, forward calls of at least "
        f"{TRUSTED_S['fwd'] * 1e6:.0f} us and backward calls of at least {TRUSTED_S['bwd'] * 1e6:.0f} us "
        "(the others carry the host's launch and autograd time). Median and MAPE of predicted / measured.",
        "",
        "| op | direction | dtype | rows | learned | median ratio | MAPE % |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for (op, direction, dtype), g in trusted.groupby(["op", "direction", "dtype"]):
        r = g["ratio"].to_numpy()
        lines.append(
            f"| {op} | {direction} | {dtype} | {len(g)} | {int(g['learned'].sum())} | {np.median(r):.2f} | "
            f"{100 * np.mean(np.abs(r - 1)):.1f} |"
        )
    big = trusted[trusted["time_s_median"] >= 500e-6]
    summary = big.groupby("op")["ratio"].median().round(2)
    lines += [
        "",
        "Kernels of at least 500 us, median predicted / measured by op: "
        + ", ".join(f"{k} {v}" for k, v in summary.items()),
    ]
    return lines


BF16_GEMM_BINS_S = (0.0, 10e-6, 50e-6, 500e-6, float("inf"))
BF16_GEMM_BIN_LABELS = ("< 10 us", "10-50 us", "50-500 us", ">= 500 us")


def bf16_gemm_section(cost, spec) -> list[str]:
    """The second collection's bf16 GEMMs, none of them in any fit: by measured duration."""
    import numpy as np
    import pandas as pd

    from opcast.predict.cost import kernel
    from opcast.schema import read_dataset

    frame = read_dataset(DATA / "kernels" / "bf16_gemm")
    frame = frame[(frame["op"] == "gemm") & (frame["direction"] == "fwd")].reset_index(drop=True)
    ks = [kernel("gemm", _as_priced(r, spec), r["dtype"], "fwd", bool(r["tensor_cores"])) for _, r in frame.iterrows()]
    priced = cost.lookup(ks, spec)
    frame["ratio"] = [priced[k][0] for k in ks] / frame["time_s_median"].to_numpy()
    frame["bin"] = pd.cut(frame["time_s_median"], BF16_GEMM_BINS_S, labels=BF16_GEMM_BIN_LABELS, right=False)
    lines = [
        "## bf16 GEMMs of torch's cuBLAS on the H200 (second collection), priced now",
        "",
        f"{len(frame)} forward GEMMs (`kernels/bf16_gemm`, `collect bench --dtype bf16 --op gemm` after 92a3dcc: CUDA "
        "graphs under 10 us, events with a cold L2 above), in no model set's training data (the set knows the H200 "
        "from AIConfigurator's TensorRT-LLM GEMMs). Predicted / measured by measured duration:",
        "",
        "| measured | timing | rows | median ratio | MAPE % |",
        "|---|---|---:|---:|---:|",
    ]
    for (b, method), g in frame.groupby(["bin", "timing_method"], observed=True):
        r = g["ratio"].to_numpy()
        lines.append(f"| {b} | {method} | {len(g)} | {np.median(r):.2f} | {100 * np.mean(np.abs(r - 1)):.1f} |")
    r = frame["ratio"].to_numpy()
    lines.append(f"| all | | {len(frame)} | {np.median(r):.2f} | {100 * np.mean(np.abs(r - 1)):.1f} |")
    return lines


AIC_SYSTEM = "h200_sxm"
"""AIConfigurator's folder of the same GPU (``aiconfigurator-core``, read where installed; nothing of it is copied)."""
AIC_DTYPES = ("bf16", "fp8")


def _aic_gemms(fp8_gemm_alone: bool):
    """TensorRT-LLM's GEMM rows of AIConfigurator's H200 as the replay converts them (``opcast collect replay
    aiconfigurator``: its fp8 rows with or without the quantisation they time, :func:`~opcast.collect.replay.
    aiconfigurator.replay`'s ``fp8_gemm_alone``), by (dtype, m, n, k)."""
    import pandas as pd

    from opcast.collect.replay.aiconfigurator import replay

    result = replay(
        systems=[AIC_SYSTEM],
        tables=["gemm_perf"],
        frameworks=("trtllm",),  # TensorRT-LLM's rows first, wherever another framework measured the shape too
        fp8_gemm_frameworks=("trtllm",),
        fp8_gemm_alone=fp8_gemm_alone,
    )
    rows = pd.DataFrame(result.rows)
    rows = rows[rows["kernel_name"].astype(str).str.startswith("trtllm ")]
    return rows.groupby(["dtype", "m", "n", "k"])["time_s_median"].median()


def aic_same_shapes_section() -> list[str]:
    """This H200's forward GEMMs beside AIConfigurator's TensorRT-LLM rows of the H200 at the same (m, n, k)."""
    import numpy as np
    import pandas as pd

    from opcast.errors import OpcastError
    from opcast.schema import read_dataset

    title = "## The same GEMM shapes in AIConfigurator's H200 rows (TensorRT-LLM) and on this H200"
    try:
        as_timed, alone = _aic_gemms(False), _aic_gemms(True)
    except OpcastError as err:
        return [title, "", f"Skipped: {err}"]
    frame = pd.concat([read_dataset(DATA / "kernels" / sub) for sub in ("collect", "calibrate", "bf16_gemm")])
    frame = frame[(frame["op"] == "gemm") & (frame["direction"] == "fwd") & (frame["b"] == 1)]
    frame = frame[frame["time_s_median"] >= TRUSTED_S["fwd"]]
    mine = frame.groupby(["dtype", "m", "n", "k"])["time_s_median"].median()
    lines = [
        title,
        "",
        "Forward GEMMs of at least 50 us that this H200 measured (torch's cuBLAS; fp8 `torch._scaled_mm`, whose "
        "`use_fast_accum` is False: the split accumulator Transformer Engine runs in dgrad and wgrad) and "
        "AIConfigurator's H200 rows measured at the same m, n, k (TensorRT-LLM: cuBLAS, fp8 a cuBLASLt call with "
        'fast accumulation after a dynamic quantisation it times too; "GEMM alone" is the replay\'s row less its '
        "quantize tables). Ratio = AIConfigurator's time / this H200's, median over the shapes:",
        "",
        "| dtype | shapes | AIConfigurator / measured | GEMM alone / measured |",
        "|---|---:|---:|---:|",
    ]
    for dtype in AIC_DTYPES:
        both = pd.concat([mine, as_timed.rename("aic"), alone.rename("alone")], axis=1, join="inner")
        both = both[both.index.get_level_values("dtype") == dtype]
        if both.empty:
            lines.append(f"| {dtype} | 0 | - | - |")
            continue
        ratio = both["aic"] / both["time_s_median"]
        rest = f"{np.median(both['alone'] / both['time_s_median']):.2f} ({len(both)})" if dtype == "fp8" else "-"
        lines.append(f"| {dtype} | {len(both)} | {np.median(ratio):.2f} | {rest} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="model set (default: the embedded one)")
    args = parser.parse_args(argv)
    from opcast.hardware import get_device
    from opcast.predict.cost import load_kernel_cost

    cost = load_kernel_cost(args.models)
    spec = get_device("H200")
    out = [f"# opcast vs a real H200 (models: {args.models or 'embedded default'})", ""]
    out += [*steps_section(cost, spec), "", *kernels_section(cost, spec), "", *bf16_gemm_section(cost, spec)]
    out += ["", *aic_same_shapes_section()]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
