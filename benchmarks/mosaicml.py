"""MosaicML's measured MPT training throughput predicted with ``opcast predict train`` (a held-out check).

    python benchmarks/mosaicml.py [--csv FILE] [--framework hf|none] [--models DIR] [--out FILE]
                                  [--json-out FILE] [--before FILE] [--limit N]

The measurements: ``../shared/validation/mosaicml_llmfoundry_mpt_throughput.csv``, the tables of
llm-foundry's ``scripts/train/benchmarking/README.md`` (commit 495218376): MPT 125M-70B trained
with PyTorch FSDP through Composer on A100-40GB/80GB (1600 Gbps RoCE per node) and H100-80GB, BF16
and FP8, 8-512 GPUs, sequences 512-65536. The measured iteration time is
``GlobalBatchSize(T) / Throughput(T/s)`` (tokens; the samples/s column is rounded to integers).

Each row is predicted as the command line would: the options of ``opcast predict train`` (their
defaults read from the command's own signature) are built into the library objects by the same
builders the command uses (:func:`opcast.predict.options.train_config`, ``placement``, ``device``,
``kernel_cost``), then ``compile_train`` and ``run_train``, once with the embedded learned models
and once with ``--roofline``. :func:`cli_command` prints the equivalent command. The mapping:

- ``n_gpus`` -> ``--nodes n/8 --gpus-per-node 8``; data parallel only (tp = pp = 1, dp = n);
- FSDP ``FULL_SHARD`` -> ``--zero 3`` (weights gathered per layer in forward, recompute and
  backward, gradients reduce-scattered per layer, prefetched behind compute: what FSDP does);
  ``SHARD_GRAD_OP`` -> ``--zero 2 --overlap-grad-reduce --overlap-param-gather`` (FSDP's gradient
  reduce-scatter runs behind the backward and its weight gather behind the forward);
- activation checkpointing True -> ``--recompute full`` (Composer wraps every MPT block);
- precision ``amp_bf16`` / ``bf16`` -> ``--precision bf16``, ``amp_fp8`` -> ``fp8``;
- GPU ``h100_80gb`` -> H100-SXM, ``a100_80gb`` -> A100-SXM4-80GB, ``a100_40gb`` -> A100-SXM4-40GB.
  1600 Gbps per 8-GPU node is 25 GB/s per GPU, the A100 catalog's ``inter_node_bw_bytes_per_s``,
  so no ``--set`` is needed; the H100 cluster's network is not stated (catalog: 50 GB/s per GPU);
- ``--framework foundry`` (default here): what llm-foundry v0.3.0 ran (the version
  ``submit_benchmarks.py`` pins, below): ``LPLayerNorm`` (torch's ``F.layer_norm``, native),
  flash-attn's fused cross-entropy kernel and Triton FlashAttention, the registry's ``flash1``
  attention (:mod:`opcast.predict.frameworks`); ``--framework hf`` prices the loss as
  ``F.cross_entropy`` and attention as FlashAttention-2/3 instead, ``none`` leaves the option out
  (needed for trees older than ``--framework``);
- the arch is the preset ``data/archs/mpt-<size>.json`` (shapes from llm-foundry's
  ``scripts/train/yamls/pretrain/mpt-<size>.yaml`` at that commit). The benchmark runs used
  MPTConfig's defaults, learned positions (not ALiBi) and biases, as the CSV's NumParams prove:
  it grows by ``seq x d_model`` with the sequence, and the preset with ``max_seq`` set to the
  row's sequence reproduces NumParams exactly for every row (checked here). A row whose sequence
  is not the preset's 2048 therefore runs with a preset JSON whose ``max_seq`` is that sequence.

What the benchmark runs executed (llm-foundry, mirrored with git): the README's tables come from
commit b2a43a147 (2023-10-19, "Update_pretrain_benchmarks"; the ">= 128 GPUs" table from 5e85bd62d,
2024-01-06), whose ``scripts/train/benchmarking/submit_benchmarks.py`` launches every run on
llm-foundry ``v0.3.0`` (``run_config``: ``'git_branch': 'v0.3.0'``, ``pip install -e .[gpu]``; 5e85bd62d:
``main`` with ``.[gpu-flash2]``) in the image ``sweep.sh`` names, ``mosaicml/pytorch:2.1.0_cu121``
(torch 2.1.0, CUDA 12.1 and its cuBLAS: not the 2025 stack NVIDIA's AIConfigurator GEMMs that opcast
learned H100 from were measured on), sets ``model.attn_config.attn_impl = args.attn_impl`` whose default
is ``'triton'`` (sweep.sh never overrides it), ``norm_type: low_precision_layernorm``, FSDP
``mixed_precision`` DEFAULT (``mod_parameters``' default; the CSV's "MP Mode"), ``eval_interval`` 0 and
30 batches; the MPT yamls leave ``alibi`` off (MPTConfig default False: learned positions, as the
NumParams prove), so ``attn_bias_shape`` is None and no bias tensor reaches attention
(``llmfoundry/models/layers/attention.py`` v0.3.0 ``attn_bias_shape``). Throughput is Composer's
``throughput/samples_per_sec`` x ``max_seq_len`` (``collect_results.py`` lines 146-147, 200): every
token. ``attn_impl: triton`` is ``llmfoundry/models/layers/flash_attn_triton.py``: HazyResearch's
experimental FlashAttention in Triton (copied from flash-attention commit eff9fe6, 2022), compiled by
``triton-pre-mlir`` (vchiley's fork of the 2022 Triton, branch ``triton_pre_mlir_sm90``): a
FlashAttention-1-generation kernel (Ampere ``mma`` instructions, no Hopper ``wgmma``); its header
says "Overall Triton forward + backward is slightly slower than CUDA [FlashAttention-1] forward +
backward". opcast's learned attention is FlashAttention-2 (A100: 2509.22832's ``flash_attn_func``
and vLLM's flash-attn) and, on H100, FlashAttention-3/TRT-LLM kernels (AIConfigurator): 2-2.4x
faster than what ran on A100 (FlashAttention-2 paper figure below), more on H100. ``--framework
foundry`` therefore runs attention as the registry's ``flash1`` (FlashAttention-1 generation), which
``opcast predict train`` prices at FlashAttention-1's measured forward + backward rate
(:mod:`opcast.predict.cost.published`, ``FA1_FWD_BWD_TFLOPS``: the FlashAttention-2 paper's Fig. 4
and its H100 figure); the "learned" column is that command's prediction.

Nothing here is tuned to these rows. MFU is reported three ways: MosaicML's (the CSV: 6N + full
attention FLOPs, over 312 / 989 / 1979 TFLOP/s), the measured time under opcast's FLOP count
(the predicted ``model_flops`` over the measured time), and opcast's predicted MFU.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import inspect
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parents[1]
CSV_PATH = ROOT.parent / "shared" / "validation" / "mosaicml_llmfoundry_mpt_throughput.csv"
ARCHS = ROOT / "data" / "archs"
OUT = ROOT / "benchmarks" / "results" / "mosaicml.md"

GPUS = {"h100_80gb": "H100-SXM", "a100_80gb": "A100-SXM4-80GB", "a100_40gb": "A100-SXM4-40GB"}
PRECISIONS = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}
GPUS_PER_NODE = 8
MODELS = ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")
"""The MPT sizes, each a preset ``data/archs/mpt-<size>.json``."""
SECTIONS = {
    "H100 80GB BF16 (Large Scale, >= 128 GPUs)": "H100 BF16 large scale (>=128 GPUs)",
    "H100 80GB BF16": "H100 BF16 (<=64 GPUs)",
    "H100 80GB FP8": "H100 FP8",
    "A100 80GB with 1600 Gbps node-node interconnect (RoCE)": "A100 80GB",
    "A100 40GB with 1600 Gbps node-node interconnect (RoCE)": "A100 40GB",
}
"""The CSV's section labels -> the short names reported (in this order)."""
COLUMNS = (
    "Model",
    "SeqLen (T)",
    "n_gpus",
    "GPU",
    "MFU",
    "HFU",
    "MicroBatchSize",
    "GradAccum",
    "GlobalBatchSize",
    "Throughput (T/s)",
    "GlobalBatchSize (T)",
    "Precision",
    "MP Mode",
    "Sharding Strategy",
    "Activation Checkpointing",
    "NumParams",
    "section",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One measured run of the CSV."""

    line: int
    """Line of the CSV (1-based, comments counted)."""
    model: str
    seq: int
    n_gpus: int
    gpu: str
    mfu_pct: float
    hfu_pct: float
    micro_batch: int
    grad_accum: int
    global_batch: int
    tokens_per_s: float
    global_batch_tokens: int
    precision: str
    mp_mode: str
    sharding: str
    checkpointing: bool
    n_params: int
    section: str

    @property
    def measured_iteration_s(self) -> float:
        """``GlobalBatchSize(T) / Throughput(T/s)``."""
        return self.global_batch_tokens / self.tokens_per_s

    @property
    def label(self) -> str:
        return f"{self.model} s{self.seq} {self.n_gpus}x{self.gpu}"


def read_rows(path: Path = CSV_PATH) -> list[Row]:
    """Every row of the validation CSV (``#`` lines skipped), checked for the columns and values used."""
    with path.open(newline="", encoding="utf-8") as f:
        lines = [(i, line) for i, line in enumerate(f, 1) if not line.startswith("#")]
    reader = csv.DictReader(line for _, line in lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    rows = []
    for (line, _), rec in zip(lines[1:], reader, strict=True):
        for column, known in (
            ("section", SECTIONS),
            ("GPU", GPUS),
            ("Precision", PRECISIONS),
            ("Sharding Strategy", ("FULL_SHARD", "SHARD_GRAD_OP")),
            ("Model", MODELS),
        ):
            if rec[column] not in known:
                raise ValueError(f"{path}:{line}: {column} {rec[column]!r} is not one of {', '.join(known)}")
        try:
            row = Row(
                line=line,
                model=rec["Model"],
                seq=int(rec["SeqLen (T)"]),
                n_gpus=int(rec["n_gpus"]),
                gpu=rec["GPU"],
                mfu_pct=float(rec["MFU"]),
                hfu_pct=float(rec["HFU"]),
                micro_batch=int(rec["MicroBatchSize"]),
                grad_accum=int(rec["GradAccum"]),
                global_batch=int(rec["GlobalBatchSize"]),
                tokens_per_s=float(rec["Throughput (T/s)"]),
                global_batch_tokens=int(rec["GlobalBatchSize (T)"]),
                precision=rec["Precision"],
                mp_mode=rec["MP Mode"],
                sharding=rec["Sharding Strategy"],
                checkpointing={"True": True, "False": False}[rec["Activation Checkpointing"]],
                n_params=int(rec["NumParams"]),
                section=SECTIONS[rec["section"]],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{path}:{line}: unreadable value ({err!r}); expected the columns {', '.join(COLUMNS)}"
            ) from None
        if min(row.seq, row.n_gpus, row.micro_batch, row.global_batch, row.tokens_per_s, row.global_batch_tokens) <= 0:
            raise ValueError(f"{path}:{line}: sizes and throughput must be positive")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- row -> command line


def preset_path(row: Row) -> Path:
    return ARCHS / f"mpt-{row.model}.json"


def row_arch(row: Row):
    """The MPT preset with ``max_seq`` = the row's sequence (a learned position table of that many rows)."""
    from opcast.archs import load_arch

    arch = load_arch(preset_path(row))
    return arch if arch.max_seq == row.seq else dataclasses.replace(arch, max_seq=row.seq)


def row_options(row: Row, *, framework: str | None = "foundry", roofline: bool = False) -> dict[str, Any]:
    """The ``opcast predict train`` option values (by :class:`~opcast.predict.options.Opt` name) of a row;
    the rest keep the command's defaults. ``arch`` names the preset, whose ``max_seq`` is 2048: for a
    row of another sequence the library is given :func:`row_arch` (the preset with ``max_seq`` = the
    sequence), which on the command line is a preset JSON (``opcast arch show mpt-7b``) with that ``max_seq``."""
    if row.n_gpus % GPUS_PER_NODE:
        raise ValueError(f"{row.label}: {row.n_gpus} GPUs are not whole nodes of {GPUS_PER_NODE}")
    values: dict[str, Any] = {
        "arch": f"mpt-{row.model}",
        "gpu": GPUS[row.gpu],
        "nodes": row.n_gpus // GPUS_PER_NODE,
        "gpus_per_node": GPUS_PER_NODE,
        "micro_batch": row.micro_batch,
        "global_batch": row.global_batch,
        "seq": row.seq,
        "precision": PRECISIONS[row.precision],
        "recompute": "full" if row.checkpointing else "none",
        "zero": 3 if row.sharding == "FULL_SHARD" else 2,
    }
    if row.sharding == "SHARD_GRAD_OP":
        values.update(overlap_grad_reduce=True, overlap_param_gather=True)
    if framework is not None:
        values["framework"] = framework
    if roofline:
        values["roofline"] = True
    return values


@functools.cache
def train_command_options() -> dict[str, Any]:
    """``opcast predict train``'s options: name -> its :class:`~opcast.predict.options.Opt` (from the
    options module) and default (from the command's signature, as typer sees it)."""
    from opcast.predict import cli, options

    declared = {v.name: v for v in vars(options).values() if isinstance(v, options.Opt)}
    declared.update({o.name: o for o in options.TRAIN})
    params = inspect.signature(cli.train_cmd).parameters
    return {name: (declared.get(name), p.default) for name, p in params.items()}


def cli_command(values: dict[str, Any]) -> str:
    """The ``opcast predict train`` command line of ``values`` (:func:`row_options`)."""
    opts = train_command_options()
    words = ["opcast", "predict", "train"]
    for name, value in values.items():
        opt, default = opts[name]
        if opt is None:
            raise ValueError(f"--{name} is not an option of this opcast's predict train")
        flag, _, negative = opt.flags.partition("/")
        if isinstance(value, bool):
            if value != default:
                words.append(flag if value else negative)
        else:
            words += [flag, str(value)]
    return shlex.join(words)


# --------------------------------------------------------------------------- prediction


@dataclasses.dataclass(frozen=True, slots=True)
class Prediction:
    feasible: bool
    reasons: tuple[str, ...] = ()
    iteration_s: float | None = None
    mfu: float | None = None
    model_flops: float | None = None
    memory_gib: float | None = None
    breakdown_s: dict[str, float] = dataclasses.field(default_factory=dict)


@functools.cache
def _kernels(models: str | None, roofline: bool, analytic: bool):
    from opcast.predict import options

    return options.kernel_cost(
        options.Args(models=None if models is None else Path(models), roofline=roofline, analytic=analytic)
    )


def predict_row(
    row: Row,
    *,
    framework: str | None = "foundry",
    roofline: bool = False,
    models: str | None = None,
    clocks: str = "sustained",
) -> Prediction:
    """What ``opcast predict train`` (:func:`cli_command` of the same options) predicts for ``row`` (``clocks``:
    ``--clocks``, given only when not the default)."""
    from opcast.predict import options
    from opcast.predict.training import TrainResult, compile_train, run_train

    values = row_options(row, framework=framework, roofline=roofline)
    if models is not None:
        values["models"] = Path(models)
    if clocks != "sustained":
        values["clocks"] = clocks
    unknown = [n for n in values if n not in train_command_options()]
    if unknown:  # an older opcast (the before/after comparison): the row cannot be given to it
        flags = ", ".join("--" + n.replace("_", "-") for n in unknown)
        return Prediction(False, (f"not expressible: this opcast's predict train has no {flags}",))
    o = options.Args(**({n: d for n, (_, d) in train_command_options().items()} | values))
    where = options.placement(o)
    dev = options.device(where.gpu, o.set_)
    plan = compile_train(
        row_arch(row), dev, options.train_config(o), nodes=where.nodes, gpus_per_node=where.gpus_per_node
    )
    if isinstance(plan, TrainResult):
        return Prediction(False, tuple(plan.reasons))
    kernels = _kernels(models, o.roofline, o.analytic)
    result = run_train(plan, kernels, where.comms(kernels), coverage=o.coverage, interval_mode=o.interval_mode)
    memory = result.worst_memory.total_bytes / 2**30 if result.memory else None
    if not result.feasible:
        return Prediction(False, tuple(result.reasons), memory_gib=memory)
    return Prediction(
        True,
        iteration_s=result.iteration_time_s,
        mfu=result.mfu,
        model_flops=result.model_flops,
        memory_gib=memory,
        breakdown_s=dict(result.breakdown_s),
    )


# --------------------------------------------------------------------------- report


def error(pred: Prediction, row: Row) -> float | None:
    """Signed relative error of the predicted iteration time (positive: predicted slower)."""
    return None if pred.iteration_s is None else pred.iteration_s / row.measured_iteration_s - 1


def summary(errors: list[float | None]) -> dict[str, Any]:
    ok = [e for e in errors if e is not None and math.isfinite(e)]
    if not ok:
        return {"n": 0, "refused": len(errors)}
    return {
        "n": len(ok),
        "refused": len(errors) - len(ok),
        "mape": 100 * statistics.fmean(abs(e) for e in ok),
        "median_abs": 100 * statistics.median(abs(e) for e in ok),
        "median": 100 * statistics.median(ok),
        "within_20": sum(abs(e) <= 0.2 for e in ok),
    }


def _pct(x: float | None, digits: int = 1, sign: str = "+") -> str:
    return "refused" if x is None else f"{100 * x:{sign}.{digits}f}%"


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def opcast_version() -> str:
    import opcast

    where = Path(opcast.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain"], capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "an installed opcast (no git checkout)"
    return f"commit {rev}{' + uncommitted changes' if dirty.strip() else ''}"  # no machine paths in reports


def run(
    rows: list[Row], *, framework: str | None, models: str | None, clocks: str = "sustained"
) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        learned = predict_row(row, framework=framework, models=models, clocks=clocks)
        roofline = predict_row(row, framework=framework, roofline=True, clocks=clocks)
        out.append(
            {
                "row": dataclasses.asdict(row),
                "learned": dataclasses.asdict(learned),
                "roofline": dataclasses.asdict(roofline),
            }
        )
        print(
            f"{row.section:34} {row.label:28} measured {row.measured_iteration_s:8.3f} s  "
            f"learned {_num(learned.iteration_s, '8.3f')} s ({_pct(error(learned, row))})  "
            f"roofline {_num(roofline.iteration_s, '8.3f')} s ({_pct(error(roofline, row))})",
            flush=True,
        )
    return out


def section_table(records: list[dict[str, Any]]) -> list[str]:
    head = (
        "| section | rows | learned: mean abs err | median abs | median signed | within 20 % "
        "| roofline: mean abs err | median abs | median signed | refused |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    groups = [*SECTIONS.values(), "all"]
    for name in groups:
        recs = [r for r in records if name == "all" or r["row"]["section"] == name]
        if not recs:
            continue
        s_l = summary([r["learned_err"] for r in recs])
        s_r = summary([r["roofline_err"] for r in recs])
        lines.append(
            f"| {name} | {len(recs)} | {_num(s_l.get('mape'), '.1f')} % | {_num(s_l.get('median_abs'), '.1f')} % | "
            f"{_num(s_l.get('median'), '+.1f')} % | {s_l.get('within_20', 0)} | {_num(s_r.get('mape'), '.1f')} % | "
            f"{_num(s_r.get('median_abs'), '.1f')} % | {_num(s_r.get('median'), '+.1f')} % | "
            f"{s_l['refused']} / {s_r['refused']} |"
        )
    return lines


def by_sequence_table(records: list[dict[str, Any]], key: str = "learned_err") -> list[str]:
    """Median signed error (``key``: the learned prediction's by default) per sequence length (rows)
    and section (columns)."""
    names = [n for n in SECTIONS.values() if any(r["row"]["section"] == n for r in records)]
    lines = ["| seq | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for seq in sorted({r["row"]["seq"] for r in records}):
        cells = []
        for name in names:
            errs = [
                r[key]
                for r in records
                if r["row"]["seq"] == seq and r["row"]["section"] == name and r.get(key) is not None
            ]
            cells.append(f"{100 * statistics.median(errs):+.0f} % ({len(errs)})" if errs else "")
        lines.append(f"| {seq} | " + " | ".join(cells) + " |")
    return lines


def compare_table(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Mean abs error before -> after per section, on the rows both trees predict (matched by CSV line)."""
    by_line = {r["row"]["line"]: r for r in before}
    lines = [
        "| section | rows | learned before | learned after | roofline before | roofline after |",
        "|---|---|---|---|---|---|",
    ]
    for name in [*SECTIONS.values(), "all"]:
        pairs = [
            (by_line[r["row"]["line"]], r)
            for r in after
            if (name == "all" or r["row"]["section"] == name)
            and r["row"]["line"] in by_line
            and all(x[f"{k}_err"] is not None for x in (r, by_line[r["row"]["line"]]) for k in ("learned", "roofline"))
        ]
        if not pairs:
            continue
        cells = [
            _num(summary([pair[i][f"{k}_err"] for pair in pairs]).get("mape"), ".1f") + " %"
            for k in ("learned", "roofline")
            for i in (0, 1)
        ]
        lines.append(f"| {name} | {len(pairs)} | " + " | ".join(cells) + " |")
    return lines


def add_errors(records: list[dict[str, Any]]) -> None:
    for r in records:
        meas = r["row"]["global_batch_tokens"] / r["row"]["tokens_per_s"]
        r["measured_s"] = meas
        for kind in ("learned", "roofline"):
            t = r[kind]["iteration_s"]
            r[f"{kind}_err"] = None if t is None else t / meas - 1


READING = "## Reading"
"""The heading of the report's hand-written section (readings of each run, newest first)."""


def hand_written(path: Path) -> list[str]:
    """The hand-written section of the report already at ``path`` (from :data:`READING` to the next
    ``## `` heading), so that rewriting the generated tables keeps it; none if absent."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    start = next((i for i, line in enumerate(lines) if line.startswith(READING)), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [*lines[start:end]] if lines[end - 1 : end] == [""] else [*lines[start:end], ""]


def write_markdown(
    path: Path,
    records: list[dict[str, Any]],
    *,
    command: str,
    wall_s: float,
    version: str,
    example: str,
    before: dict[str, Any] | None,
) -> None:
    lines = [
        f"# `{command}`",
        "",
        f"opcast: {version}. Wall time {wall_s:.1f} s (the whole script) for {len(records)} rows x 2 cost models. "
        "Held-out: nothing was tuned to these rows.",
        "",
        "Measured: MosaicML llm-foundry benchmark README (commit 495218376), "
        "iteration = GlobalBatchSize(T) / Throughput(T/s). Error = predicted / measured - 1 "
        "(positive: opcast predicts a slower iteration). Mapping and caveats: the docstring of "
        "`benchmarks/mosaicml.py`.",
        "",
        "Equivalent command line of one row (every row is predicted through the same option builders):",
        "",
        "```",
        example,
        "```",
        "",
        *hand_written(path),
        "## Error of the predicted iteration time per section",
        "",
        *section_table(records),
        "",
        "Median signed error (learned models) by sequence length, rows in brackets:",
        "",
        *by_sequence_table(records),
        "",
    ]
    if before is not None:
        lines += [
            "## Before and after",
            "",
            f"Before: `{before['command']}` with opcast {before['version']}; after: this run. Mean abs error on the "
            "rows both predict (a row the older tree cannot express is left out of both):",
            "",
            *compare_table(before["records"], records),
            "",
            "Before, per section (its own refusals counted):",
            "",
            *section_table(before["records"]),
            "",
        ]
    refused = [r for r in records if r["learned"]["iteration_s"] is None or r["roofline"]["iteration_s"] is None]
    if refused:
        lines += ["## Refused rows (each ran at MosaicML)", ""]
        for r in refused:
            reasons = r["learned"]["reasons"] or r["roofline"]["reasons"]
            lines.append(f"- line {r['row']['line']} {_label(r)}: {'; '.join(reasons)}")
        lines.append("")
    lines += [
        "## Every row",
        "",
        "MFU columns: MosaicML's (CSV), the measured time under opcast's FLOP count, opcast's prediction "
        "(learned / roofline). mem: predicted peak GiB per GPU (learned).",
        "",
        "| line | section | model | seq | GPUs | prec | mb x ga | ckpt | shard | measured s | learned s | err | "
        "roofline s | err | MFU csv | MFU meas | MFU learned | MFU roofline | mem |",
        "|" + "---|" * 19,
    ]
    for r in records:
        row, le, ro = r["row"], r["learned"], r["roofline"]
        # the measured time under opcast's FLOP count: MFU x predicted / measured time (either prediction)
        priced = le if le["mfu"] is not None else ro
        mfu_meas = None if priced["mfu"] is None else priced["mfu"] * priced["iteration_s"] / r["measured_s"]
        ckpt = "full" if row["checkpointing"] else "-"
        lines.append(
            f"| {row['line']} | {row['section']} | {row['model']} | {row['seq']} | {row['n_gpus']} {row['gpu']} | "
            f"{row['precision']} | {row['micro_batch']}x{row['grad_accum']} | {ckpt} | {row['sharding']} | "
            f"{r['measured_s']:.3f} | {_num(le['iteration_s'], '.3f')} | {_pct(r['learned_err'])} | "
            f"{_num(ro['iteration_s'], '.3f')} | {_pct(r['roofline_err'])} | {row['mfu_pct']:.1f}% | "
            f"{_pct(mfu_meas, sign='')} | {_pct(le['mfu'], sign='')} | {_pct(ro['mfu'], sign='')} | "
            f"{_num(le['memory_gib'], '.1f')} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _label(r: dict[str, Any]) -> str:
    row = r["row"]
    return f"{row['model']} seq {row['seq']} on {row['n_gpus']} {row['gpu']} ({row['section']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=CSV_PATH)
    parser.add_argument(
        "--framework", default="foundry", help="foundry (default), hf, megatron, neox, or none (leave --framework out)"
    )
    parser.add_argument("--models", default=None, help="learned model set (default: the embedded one)")
    parser.add_argument("--out", type=Path, default=OUT, help="markdown report")
    parser.add_argument("--json-out", type=Path, default=None, help="also write every row's result as JSON")
    parser.add_argument("--before", type=Path, default=None, help="a --json-out of another tree, reported beside")
    parser.add_argument("--limit", type=int, default=None, help="only the first N rows (a quick look)")
    from opcast.predict.parallel import Clocks  # the one list of the option's values

    parser.add_argument(
        "--clocks", default="sustained", choices=get_args(Clocks), help="predict train --clocks (ablation)"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if not args.csv.is_file():
        print(f"mosaicml: no {args.csv}: give --csv (the shared/validation checkout)", file=sys.stderr)
        return 2
    framework = None if args.framework == "none" else args.framework
    try:
        rows = read_rows(args.csv)[: args.limit]
        before = json.loads(args.before.read_text()) if args.before is not None else None
        if before is not None and not {"command", "version", "records"} <= set(before):
            raise ValueError(f"{args.before} is not a --json-out of this script")
    except (OSError, ValueError, KeyError) as err:
        print(f"mosaicml: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"mosaicml: no rows to predict in {args.csv} (--limit {args.limit})", file=sys.stderr)
        return 2
    mismatched = [r for r in rows if row_arch(r).params_total() != r.n_params]
    for r in mismatched:
        preset = row_arch(r).params_total()
        print(f"warning: line {r.line} {r.label}: preset has {preset} parameters, NumParams {r.n_params}")
    records = run(rows, framework=framework, models=args.models, clocks=args.clocks)
    wall_s = time.perf_counter() - start
    add_errors(records)
    given = argv if argv is not None else sys.argv[1:]
    # reports carry no machine's paths: a file argument is shown by its name
    shown = [Path(a).name if os.path.isabs(a) else a for a in given]
    command = "python benchmarks/mosaicml.py " + shlex.join(shown)
    example_row = next((r for r in rows if r.seq == 2048 and r.n_gpus > GPUS_PER_NODE and r.checkpointing), rows[0])
    example = cli_command(row_options(example_row, framework=framework))
    print(f"\nequivalent command of line {example_row.line} ({example_row.label}):\n  {example}\n")
    version = opcast_version()
    for line in section_table(records):
        print(line)
    print(f"\nwall time {wall_s:.0f} s; {len(mismatched)} rows whose NumParams the preset misses")
    write_markdown(
        args.out, records, command=command.strip(), wall_s=wall_s, version=version, example=example, before=before
    )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"command": command.strip(), "version": version, "records": records}))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
