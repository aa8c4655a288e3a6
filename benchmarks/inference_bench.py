"""`opcast predict infer` against LLM-Inference-Bench's measured static batches (issue 20's static-batch target:
<= 10 % mean error per GPU and engine, none worse than 20 %).

Usage:  python benchmarks/inference_bench.py --csv PATH [--vllm-version X.Y.Z] [--models DIR] [--markdown PATH]
                                             [--json PATH]

The measurements are Argonne's LLM-Inference-Bench (Chitty-Venkata et al., "LLM-Inference-Bench: Inference
Benchmarking of Large Language Models on AI Accelerators", SC'24 workshops (PMBS), arXiv 2411.00136), published
as ``Plots/All_results.csv`` in https://github.com/argonne-lcf/LLM-Inference-Bench (MIT-licensed code; the data
is not copied here: clone the repository, commit 4211f5d or later, and pass ``--csv
LLM-Inference-Bench/Plots/All_results.csv``). Each row is one static batch: ``Batch Size`` prompts of ``Input
Output Length`` tokens, each generating as many (``ignore_eos``), timed end to end (``Latency``, seconds) by the
engine's offline benchmark (vLLM's ``benchmarks/benchmark_latency.py``, TensorRT-LLM's ``examples/run.py
--run_profiling``), fp16 weights and activations (``--dtype float16``), ``Num of Hardware`` GPUs in tensor
parallel.

Scored: the rows of NVIDIA GPUs under vLLM and TensorRT-LLM, and of AMD's MI300X under vLLM (ROCm), whose model
opcast has a preset for (Llama-2 7B/70B, Llama-3 8B/70B, Mistral-7B, Mixtral-8x7B, Qwen2 7B/72B; the other models
of the csv are skipped and counted).
Each row is ``opcast predict infer --arch A --gpu G --tp N --batch B --prompt-len L --gen-len L --precision fp16
--engine E``, compared on ``total_latency_s``. The GPUs: "Nvidia A100 GPU" is an A100-SXM4-40GB (ALCF Polaris,
four 40 GB SXM4 A100s a node, where the A100 scripts' PBS jobs ran), "Nvidia H100 GPU" an H100-SXM (JLSE, 80 GB
HBM3), "Nvidia GH200 GPU" a GH200 (96 GB HBM3), "AMD MI300X GPU" an MI300X (192 GB HBM3).

**Engine releases.** The runs are of 2024 releases the repository pins only in part (the A100 scripts' vLLM
requirements pin ``vllm-flash-attn == 2.6.1``, vLLM 0.5.4 to 0.6.1; the MI300X README checks out v0.6.1); every
row is priced as the engine's newest release, the MI300X's vLLM rows as 0.6.1, and ``--vllm-version`` names the
release of the other vLLM rows (``--engine-version`` of ``predict infer``: before 0.6, vLLM's measured
synchronous-output overhead).

**Screen.** A decode step reads every weight of a GPU once, so a batch cannot finish in less than ``gen_len x
weight bytes per GPU / memory bandwidth``; a row measured faster than that did not generate its tokens (the
TensorRT-LLM script stops at the end-of-sequence token) and is dropped and counted, never scored.

Printed per GPU and engine, for the issue's Llama-2/3 rows and for the other models apart: rows, MAPE, median
APE, signed median error (prediction / measurement - 1) and the worst row, beside the same for the roofline
baseline (``--roofline``'s model set: every kernel at its spec roofline) computed in the same run; then the
signed error by batch size and by length.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Final

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.inference import predict_infer
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.engine import engine_version_problem

ARCHS: Final = {
    "meta-llama/Llama-2-7b-hf": "llama2-7b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen/Qwen2-7B": "qwen2-7b",
    "Qwen/Qwen2-72B": "qwen2-72b",
}
"""The csv's models opcast has a preset of (``opcast arch list``)."""
GPUS: Final = {
    "Nvidia A100 GPU": "A100-SXM4-40GB",
    "Nvidia H100 GPU": "H100-SXM",
    "Nvidia GH200 GPU": "GH200",
    "AMD MI300X GPU": "MI300X",
}
ENGINES: Final = {"vLLM": "vllm", "TensorRT-LLM": "trtllm"}
VLLM_RELEASES: Final = {"MI300X": "0.6.1"}
"""The vLLM release of a GPU's rows where the repository pins it (``vLLM/MI300X/README.md``: ``git checkout
v0.6.1``); ``--vllm-version`` sets the others'."""
ISSUE_ARCHS: Final = frozenset({"llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b"})
"""The models of issue 20's static-batch check (Llama-2/3 7B-70B)."""
COLUMNS: Final = ("Hardware", "Num of Hardware", "Framework", "Model", "Input Output Length", "Batch Size", "Latency")


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    gpu: str
    engine: str
    arch: str
    tp: int
    batch: int
    length: int
    measured_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Scored:
    row: Row
    predicted_s: float
    roofline_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.measured_s - 1

    @property
    def roofline_error(self) -> float:
        return self.roofline_s / self.row.measured_s - 1


def read_rows(path: Path) -> tuple[list[Row], dict[str, int]]:
    """The scored rows of the csv and the count of every other row by why it was left out."""
    skipped: dict[str, int] = {}
    rows = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path} lacks column(s) {', '.join(missing)}: pass LLM-Inference-Bench's Plots/All_results.csv"
            )
        for rec in reader:
            why = (
                "a GPU opcast does not map"
                if rec["Hardware"] not in GPUS
                else "not vLLM or TensorRT-LLM"
                if rec["Framework"] not in ENGINES
                else "no opcast preset of the model"
                if rec["Model"] not in ARCHS
                else None
            )
            if why is not None:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            rows.append(
                Row(
                    gpu=GPUS[rec["Hardware"]],
                    engine=ENGINES[rec["Framework"]],
                    arch=ARCHS[rec["Model"]],
                    tp=int(rec["Num of Hardware"]),
                    batch=int(rec["Batch Size"]),
                    length=int(rec["Input Output Length"]),
                    measured_s=float(rec["Latency"]),
                )
            )
    return rows, skipped


def _predict(row: Row, kernels, arch, device, vllm_version: str | None = None) -> tuple[float | None, float]:
    """(predicted seconds, or None when opcast refuses the batch; the weight-read bound in seconds)."""
    cfg = InferConfig(
        tp=row.tp,
        batch=row.batch,
        prompt_len=row.length,
        gen_len=row.length,
        precision="fp16",
        engine=row.engine,
        engine_version=VLLM_RELEASES.get(row.gpu, vllm_version) if row.engine == "vllm" else None,
    )
    r = predict_infer(arch, device, cfg, kernels=kernels, details=False)
    weights = r.memory.weights_bytes if r.memory is not None else 0.0
    bound = row.length * weights / device.mem_bw_bytes_per_s
    return (r.total_latency_s if r.feasible else None), bound


def score(rows: list[Row], models: Path | None, vllm_version: str | None = None) -> tuple[list[Scored], dict[str, int]]:
    learned, roofline = load_kernel_cost(models, use_learned=True), load_kernel_cost(models, use_learned=False)
    archs = {name: load_arch(name) for name in {r.arch for r in rows}}
    out, dropped = [], {"faster than reading the weights once a generated token": 0, "refused by opcast": 0}
    for row in rows:
        device = get_device(row.gpu)
        predicted, bound = _predict(row, learned, archs[row.arch], device, vllm_version)
        if row.measured_s < bound:
            dropped["faster than reading the weights once a generated token"] += 1
            continue
        if predicted is None:
            dropped["refused by opcast"] += 1
            continue
        roof, _ = _predict(row, roofline, archs[row.arch], device, vllm_version)
        out.append(Scored(row=row, predicted_s=predicted, roofline_s=roof if roof is not None else float("nan")))
    return out, dropped


def _stats(errors: list[float]) -> dict[str, float]:
    ape = [100 * abs(e) for e in errors]
    return {
        "mape": sum(ape) / len(ape),
        "median_ape": median(ape),
        "signed_median": 100 * median(errors),
        "worst": max(ape),
    }


def table(scored: list[Scored], issue: bool) -> list[dict]:
    """One line per (GPU, engine) of the issue's models (``issue``) or of the others."""
    keys = sorted({(s.row.gpu, s.row.engine) for s in scored})
    lines = []
    for gpu, engine in keys:
        mine = [
            s for s in scored if (s.row.gpu, s.row.engine) == (gpu, engine) and (s.row.arch in ISSUE_ARCHS) == issue
        ]
        if not mine:
            continue
        model, roof = _stats([s.error for s in mine]), _stats([s.roofline_error for s in mine])
        lines.append(
            {"gpu": gpu, "engine": engine, "rows": len(mine), **model, **{f"roofline_{k}": v for k, v in roof.items()}}
        )
    return lines


def by(scored: list[Scored], field: str) -> dict[str, dict[int, float]]:
    """Signed median error % of each engine by ``field`` (batch or length)."""
    out: dict[str, dict[int, float]] = {}
    for engine in sorted({s.row.engine for s in scored}):
        values = sorted({getattr(s.row, field) for s in scored if s.row.engine == engine})
        out[engine] = {
            v: 100 * median(s.error for s in scored if s.row.engine == engine and getattr(s.row, field) == v)
            for v in values
        }
    return out


def markdown(lines: list[dict]) -> str:
    head = (
        "| GPU | engine | rows | MAPE % | median APE % | signed median % | worst % | roofline MAPE % "
        "| roofline signed % |"
    )
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    body = [
        f"| {x['gpu']} | {x['engine']} | {x['rows']} | {x['mape']:.1f} | {x['median_ape']:.1f} | "
        f"{x['signed_median']:+.1f} | {x['worst']:.1f} | {x['roofline_mape']:.1f} | "
        f"{x['roofline_signed_median']:+.1f} |"
        for x in lines
    ]
    return "\n".join([head, rule, *body])


def _pooled(scored: list[Scored], issue: bool) -> str:
    mine = [s for s in scored if (s.row.arch in ISSUE_ARCHS) == issue]
    if not mine:
        return "no rows"
    model, roof = _stats([s.error for s in mine]), _stats([s.roofline_error for s in mine])
    return (
        f"{len(mine)} rows: MAPE {model['mape']:.1f} % (median {model['median_ape']:.1f}, signed median "
        f"{model['signed_median']:+.1f}); roofline baseline {roof['mape']:.1f} %"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, required=True, help="LLM-Inference-Bench's Plots/All_results.csv")
    ap.add_argument(
        "--vllm-version",
        default=None,
        help="price the NVIDIA GPUs' vLLM rows as this release (default: the newest), e.g. 0.5.4",
    )
    ap.add_argument("--models", type=Path, default=None, help="model set (default: the embedded default)")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the tables here (atomically)")
    ap.add_argument("--json", type=Path, default=None, help="also write every scored row here")
    a = ap.parse_args(argv)
    if not a.csv.is_file():
        print(
            f"error: --csv {a.csv}: no such file; clone https://github.com/argonne-lcf/LLM-Inference-Bench and "
            "pass its Plots/All_results.csv",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    try:
        rows, skipped = read_rows(a.csv)
    except (ValueError, KeyError, UnicodeDecodeError) as err:
        print(f"error: --csv {a.csv}: {err}", file=sys.stderr)
        return 2
    if a.vllm_version is not None and (problem := engine_version_problem(a.vllm_version)) is not None:
        print(f"error: {problem.replace('--engine-version', '--vllm-version')}", file=sys.stderr)
        return 2
    scored, dropped = score(rows, a.models, a.vllm_version)
    parts = [
        f"LLM-Inference-Bench static batches (vLLM priced as {a.vllm_version or 'its newest release'}): "
        f"{len(rows)} rows of opcast's GPUs, engines and presets "
        f"({', '.join(f'{v} {k}' for k, v in sorted(skipped.items()))} left out); dropped: "
        f"{', '.join(f'{v} {k}' for k, v in dropped.items())}; scored {len(scored)} "
        f"in {time.perf_counter() - t0:.0f} s",
        f"## Llama-2/3 7B-70B (issue 20's models)\n\n{_pooled(scored, True)}\n\n{markdown(table(scored, True))}",
        f"## Other models (Mistral-7B, Mixtral-8x7B, Qwen2 7B/72B)\n\n{_pooled(scored, False)}\n\n"
        f"{markdown(table(scored, False))}",
    ]
    for field in ("batch", "length"):
        lines = [f"## Signed median error % by {field}, every scored row", ""]
        for engine, values in by(scored, field).items():
            lines.append(f"- {engine}: " + ", ".join(f"{k}: {v:+.1f}" for k, v in values.items()))
        parts.append("\n".join(lines))
    text = "\n\n".join(parts)
    print(text)
    if a.markdown is not None:
        from opcast.atomic import write_atomically

        write_atomically(a.markdown, lambda tmp: tmp.write_text(text + "\n"))
    if a.json is not None:
        from opcast.atomic import write_atomically

        doc = [{**asdict(s.row), "predicted_s": s.predicted_s, "roofline_s": s.roofline_s} for s in scored]
        write_atomically(a.json, lambda tmp: tmp.write_text(json.dumps(doc, indent=1) + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
