"""The measured training runs of arXiv 2509.22832 predicted on their clusters (issue 18).

    python benchmarks/cluster_runs.py [--runs DIR] [--published DIR] [--models DIR] [--out FILE]

The runs: GPT-NeoX (DeeperSpeed 0.12.4) trainings of GPT-NeoX-20B, a LLaMA-13B-like and a
Llemma-7B-like model (4h GeLU MLP, GPT-2 vocabulary) on 16 to 128 GPUs of NERSC Perlmutter
(A100-SXM4-80GB, 4 per node) and TACC Vista (GH200, 1 per node), fp16, ZeRO-1, full activation
checkpointing. They are in the authors' development repository Littlesnakess/GPUModeling25
(``--runs DIR``: a checkout of github.com/Littlesnakess/GPUModeling25 at commit 990e847, or the
environment variable ``OPCAST_GPUMODELING25``; that repository has no licence, so nothing of it is
copied here; the packaged artifact DebarghaG/estimate-train-time holds the operator and NCCL
sweeps only). Per job:

- its log gives the configuration (the NeoXArgs dump: parallel degrees, micro and global batch,
  sequence, model shape, ZeRO stage and bucket, checkpointing, precision, attention) and
  DeepSpeed's pipeline partition (``stage=N layers=K`` and the layer list: the transformer layers
  of each stage are counted, so the split is the run's own, 5,6,6,6,6,6,6,3 for 44 layers on 8);
- ``best_batch/compares.csv`` row ``1F1B_max_optimizer`` gives the measured iteration the paper
  scores (the fastest profiled iteration, "best batch") and the paper's prediction of it; their
  mean abs errors recomputed from these rows are the abstract's 4.98 % and 9.38 %. A job without
  that file (a second Vista job of the same configuration) is not a run here.

Each run is predicted with ``opcast``'s library exactly as ``opcast predict train --cluster
perlmutter:N`` / ``vista:N --framework neox`` would (the cluster's GPU with its links, the model
set's learned collective laws for that cluster in front of alpha-beta), with the run's
configuration. The one setting the command line cannot give is DeepSpeed's gradient bucket
(``reduce_bucket_size`` in the log, 1.26e9 or DeepSpeed's default 5e8 elements); it is passed as
``TrainConfig.bucket_params``.

Model set: ``--models DIR``, else one fitted here on exactly the artifact's operator and NCCL
sweeps (``opcast collect replay estimate-train-time`` + ``opcast train fit --seed 0 --jobs 1 --estimator xgb``;
the paper's own model is fitted on the same data), cached under ``benchmarks/.cache/``
(gitignored) and refitted when that folder is removed.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "published"
CACHE = ROOT / "benchmarks" / ".cache"
SYSTEMS = {"P": ("perlmutter", 4), "V": ("vista", 1)}
"""Suffix of a run key in the statistics file -> (catalog cluster, GPUs per node used)."""
PAPER_MEAN_APE = {"perlmutter": 4.98, "vista": 9.38}
"""arXiv 2509.22832, abstract (recomputed from components_statistic.csv, row Overall)."""
OPCAST_BEFORE_MEAN_APE = {"perlmutter": 59.0, "vista": 18.2}
"""Issue 18's "opcast now" (alpha-beta collectives, no uneven pipelines)."""
GPT2_VOCAB = 50257
"""The runs' tokenizer: GPT2BPETokenizer (vocab_file gpt2-vocab.json), padded per rank as Megatron does."""
DEEPSPEED_BUCKET = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (elements; deepspeed/runtime/zero/config.py)."""
_ARG = re.compile(r"^\s{2}(\w+) \.+ ?(.*?)\.*(?:updated|default)\s*$")
_STAGE = re.compile(r"stage=(\d+) layers=(\d+)")
_LAYER = re.compile(r"^\s*\d+: (\w+)")


class RunsError(Exception):
    """The runs folder is missing or malformed (the message says which file)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One measured training run."""

    key: str
    """The statistics file's key, e.g. ``GPT_20B_8_4_4_P``."""
    cluster: str
    model: str
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    seq: int
    n_layers: int
    hidden: int
    heads: int
    norm: str
    parallel_residual: bool
    attn_bias: bool
    attention: str
    """flash (attention_config flash) or eager (global: Megatron's fused masked softmax)."""
    zero: int
    recompute: str
    precision: str
    bucket_params: int
    stage_layers: tuple[int, ...]
    partition_method: str
    measured_s: float
    """The authors' best-batch iteration (what the paper's errors are against)."""
    paper_predicted_s: float
    """The paper's model's prediction of it (compares.csv)."""
    log_median_s: float
    """Median of DeepSpeed's ``iter time (s)`` over the job's steps after the first (run-to-run spread)."""
    log: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _neox_args(text: str) -> dict[str, str]:
    args: dict[str, str] = {}
    for line in text.splitlines():
        m = _ARG.match(line)
        if m and m.group(1) not in args:
            args[m.group(1)] = m.group(2).strip()
    return args


def _stage_layers(text: str, pp: int) -> tuple[int, ...]:
    """Transformer layers (``ParallelTransformerLayerPipe``) in each stage of DeepSpeed's printed partition."""
    counts: dict[int, int] = {}
    stage = None
    for line in text.splitlines():
        body = line.split(": ", 1)[1] if ": " in line[:40] and line.startswith("nid") else line
        m = _STAGE.search(body)
        if m:
            stage = int(m.group(1))
            if stage in counts:  # printed once per job; stop at a repeat
                break
            counts[stage] = 0
            continue
        if stage is not None:
            lm = _LAYER.match(body)
            if lm:
                counts[stage] += lm.group(1) == "ParallelTransformerLayerPipe"
            elif "loss:" in body:
                break
    if sorted(counts) != list(range(pp)):
        raise RunsError(f"no DeepSpeed partition of {pp} stages ('stage=N layers=K') in the log")
    return tuple(counts[s] for s in range(pp))


def _int(args: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(args[key])
    except (KeyError, ValueError):
        raise RunsError(f"{path}: no integer {key} in the NeoXArgs dump") from None


def parse_log(path: Path) -> dict[str, Any]:
    """The configuration of one run from its GPT-NeoX log."""
    text = path.read_text(errors="replace")
    args = _neox_args(text)
    pp, tp = _int(args, "pipe_parallel_size", path), _int(args, "model_parallel_size", path)
    world = _int(args, "global_num_gpus", path)
    bucket = re.search(r"'reduce_bucket_size': (\d+)", args.get("zero_optimization", "")) or re.search(
        r"zero_config .*?reduce_bucket_size=(\d+)", text
    )
    try:
        stage_layers = _stage_layers(text, pp)
    except RunsError as err:
        raise RunsError(f"{path}: {err}") from None
    return {
        "tp": tp,
        "pp": pp,
        "dp": world // (tp * pp),
        "world": world,
        "micro_batch": _int(args, "train_micro_batch_size_per_gpu", path),
        "global_batch": _int(args, "train_batch_size", path),
        "seq": _int(args, "seq_length", path),
        "n_layers": _int(args, "num_layers", path),
        "hidden": _int(args, "hidden_size", path),
        "heads": _int(args, "num_attention_heads", path),
        "norm": args.get("norm", "layernorm"),
        "parallel_residual": args.get("gpt_j_residual") == "True",
        "attn_bias": args.get("use_bias_in_attn_linear", "True") == "True",
        "attention": "flash" if "flash" in args.get("attention_config", "") else "eager",
        "zero": _int(args, "zero_stage", path),
        "recompute": "full" if args.get("checkpoint_activations") == "True" else "none",
        "precision": args.get("precision", "fp16"),
        "bucket_params": int(bucket.group(1)) if bucket else DEEPSPEED_BUCKET,
        "stage_layers": stage_layers,
        "partition_method": args.get("pipe_partition_method", "type:transformer|mlp"),
        "activation": args.get("activation", "gelu"),
        "intermediate_size": args.get("intermediate_size", "None"),
    }


MEASURED_ROW = "1F1B_max_optimizer"
"""The row of ``best_batch/compares.csv`` holding the iteration: the authors' measurement of the
fastest profiled iteration ("best batch", µs) and their model's prediction of it."""


def _best_batch(path: Path) -> tuple[float, float] | None:
    """(measured s, the paper's predicted s) of a job's best batch, or None when it has none."""
    if not path.is_file():
        return None
    with path.open(newline="") as fh:
        for line_no, row in enumerate(csv.DictReader(fh), start=2):
            if row.get("module") != MEASURED_ROW:
                continue
            try:
                return float(row["measurement(us)"]) * 1e-6, float(row["prediction(us)"]) * 1e-6
            except (KeyError, TypeError, ValueError):
                raise RunsError(f"{path}:{line_no}: need measurement(us) and prediction(us) numbers") from None
    return None


def _iteration_times(text: str) -> list[float]:
    """DeepSpeed's ``iter time (s)`` of every step after the first (warm-up), in order."""
    times = [
        (int(m.group(1)), float(m.group(2))) for m in re.finditer(r"steps: (\d+) .*?iter time \(s\): ([\d.]+)", text)
    ]
    return [t for step, t in times if step > 1]


def parse_runs(runs_dir: Path) -> list[Run]:
    """Every job with a best-batch measurement, configured from its own log."""
    base = runs_dir / "3D_parallelism_prediction"
    if not base.is_dir():
        raise RunsError(f"{runs_dir}: no 3D_parallelism_prediction/; give --runs the GPUModeling25 folder")
    runs = []
    for log in sorted(base.glob("*/*/*/*.log")):
        system = {"perlmutter": "P", "vista": "V"}.get(log.parts[-4])
        best = _best_batch(log.parent / "best_batch" / "compares.csv")
        if system is None or best is None:
            continue
        cfg = parse_log(log)
        if cfg["activation"] != "gelu" or cfg["intermediate_size"] != "None":
            raise RunsError(f"{log}: only the 4h GeLU MLP of these runs is modelled")
        model = "_".join(log.parts[-3].split("_")[:2])  # GPT_20B, llama_13B, llemma_7B
        cluster, gpn = SYSTEMS[system]
        steps = _iteration_times(log.read_text(errors="replace"))
        runs.append(
            Run(
                key=f"{model}_{cfg['pp']}_{cfg['tp']}_{cfg['dp']}_{system}",
                cluster=cluster,
                model=model,
                nodes=int(cfg["world"]) // gpn,
                gpus_per_node=gpn,
                measured_s=best[0],
                paper_predicted_s=best[1],
                log_median_s=statistics.median(steps) if steps else math.nan,
                log=str(log.relative_to(runs_dir)),
                **{k: v for k, v in cfg.items() if k not in ("world", "activation", "intermediate_size")},  # type: ignore[arg-type]
            )
        )
    if not runs:
        raise RunsError(f"{base}: no job with best_batch/compares.csv ({MEASURED_ROW}) beside its log")
    return sorted(runs, key=lambda r: (r.cluster, r.key))


def arch_of(run: Run):
    """The run's model as an opcast arch: GPT-NeoX's layer (4h GeLU MLP, rotary) with the run's shape."""
    from opcast.archs import ArchSpec

    return ArchSpec(
        name=f"{run.model.lower().replace('_', '-')}-2509.22832",
        family="gpt_neox",
        n_layers=run.n_layers,
        hidden=run.hidden,
        n_heads=run.heads,
        n_kv_heads=run.heads,
        head_dim=run.hidden // run.heads,
        ffn_hidden=4 * run.hidden,
        vocab=GPT2_VOCAB,
        max_seq=run.seq,
        norm=run.norm,  # type: ignore[arg-type]  # layernorm or rmsnorm, from the log
        activation="gelu",
        gated_mlp=False,
        position="rope",
        tied_embeddings=False,
        linear_bias=run.attn_bias,
        parallel_residual=run.parallel_residual,
        source=f"arXiv 2509.22832 run {run.key}: NeoXArgs of {run.log}",
    )


def train_config(run: Run):
    from opcast.predict import TrainConfig

    return TrainConfig(
        tp=run.tp,
        pp=run.pp,
        dp=run.dp,
        micro_batch=run.micro_batch,
        global_batch=run.global_batch,
        seq=run.seq,
        recompute=run.recompute,
        zero=run.zero,
        precision=run.precision,
        attention=run.attention,
        pp_layers=run.stage_layers,
        bucket_params=run.bucket_params,
        framework="neox",
    )


def cli_command(run: Run) -> str:
    """The ``opcast predict train`` line of the same prediction (bucket size aside)."""
    return (
        f"opcast predict train --arch ARCH.json --cluster {run.cluster}:{run.nodes} --tp {run.tp} --pp {run.pp} "
        f"--dp {run.dp} --micro-batch {run.micro_batch} --global-batch {run.global_batch} --seq {run.seq} "
        f"--recompute {run.recompute} --zero {run.zero} --precision {run.precision} --attention {run.attention} "
        f"--pp-layers {','.join(map(str, run.stage_layers))} --framework neox"
    )


def predict(run: Run, models: Path):
    """(TrainResult, collectives by source) of one run."""
    from opcast.clusters import cluster_device_name, find_cluster
    from opcast.hardware import get_device
    from opcast.predict import load_kernel_cost, predict_train
    from opcast.predict.comm_learned import collective_cost_for

    spec = find_cluster(run.cluster)
    if spec is None:
        raise RunsError(f"cluster {run.cluster!r} is not in the catalog (data/clusters)")
    device = get_device(cluster_device_name(spec))
    kernels = load_kernel_cost(models)
    comms = collective_cost_for(kernels, cluster=run.cluster)
    return predict_train(
        arch_of(run),
        device,
        train_config(run),
        nodes=run.nodes,
        gpus_per_node=run.gpus_per_node,
        kernels=kernels,
        comms=comms,
    )


BREAKDOWN = (
    ("compute", ("forward", "backward", "recompute")),
    ("tp_comm", ("tp_comm",)),
    ("pp_comm", ("pp_comm",)),
    ("dp_comm_exposed", ("dp_comm_exposed",)),
    ("bubble", ("pipeline_bubble",)),
    ("optimizer", ("optimizer",)),
)


def collective_sources(result) -> dict[str, str]:
    """role/kind -> the sources that priced it (learned/<cluster>/... or alpha-beta/...)."""
    out: dict[str, set[str]] = {}
    for line in result.comms:
        label = "learned" if line.source.startswith("learned") else "alpha-beta"
        out.setdefault(f"{line.role}:{line.call.kind}", set()).add(label)
    return {k: "+".join(sorted(v)) for k, v in sorted(out.items())}


FIT_ARGS = ("--name", "ett", "--seed", "0", "--jobs", "1", "--estimator", "xgb")
"""xgb for every op group: 66 s on this 2-core machine; ``--estimator auto`` (also fitting the tile-MLP
to pick by held-out error) ran over 20 min here and was stopped."""


def ensure_models(published: Path, log) -> Path:
    """The cached model set fitted on the artifact's operator and NCCL sweeps (fit it if absent, or
    if it was fitted on other feature definitions than this opcast computes)."""
    from opcast.train.features import FEATURES_VERSION

    models = CACHE / "models" / "ett"
    if (models / "meta.json").is_file() and (models / "collectives.json").is_file():
        meta = json.loads((models / "meta.json").read_text())
        if meta.get("features_version") == FEATURES_VERSION:
            return models
        have = meta.get("features_version")
        log(f"{models}: fitted on features v{have}, this opcast computes v{FEATURES_VERSION}; re-fitting")
    ett = published / "estimate-train-time"
    if not ett.is_dir():
        raise RunsError(f"{ett} is absent: give --published (with estimate-train-time/) or --models")
    CACHE.mkdir(parents=True, exist_ok=True)
    opcast = Path(sys.executable).with_name("opcast")
    for cmd in (
        [str(opcast), "collect", "replay", "estimate-train-time", str(ett), "--out", str(CACHE / "pub")],
        [str(opcast), "train", "fit", str(CACHE / "pub"), "--out", str(CACHE / "models"), *FIT_ARGS],
    ):
        t0 = time.perf_counter()
        log(f"$ {' '.join(cmd)}")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        log(f"  {time.perf_counter() - t0:.0f} s")
    return models


def held_out_laws(models: Path) -> list[dict[str, object]]:
    """Per (cluster, kind, split) held-out error of the model set's collective laws, pooled as
    ``opcast.train.collectives.summary`` does over the records ``collectives.json`` keeps."""
    from opcast.train.collectives import summary

    path = models / "collectives.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return summary(data.get("held_out", []))


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def _fmt2(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _shown(path: Path) -> str:
    """``path`` relative to the repo when inside it: reports carry no machine's paths."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(path).name


def report(runs: list[Run], results: dict[str, Any], models: Path, wall_s: float, command: str) -> str:
    lines = [
        "# arXiv 2509.22832's measured training runs, predicted on their clusters",
        "",
        f"Reproduce: `{command}` ({wall_s:.0f} s wall for the {len(runs)} predictions; the model set already fitted).",
        f"Model set: `{_shown(models)}`. Measured: the authors' best-batch iteration (best_batch/compares.csv, "
        f"`{MEASURED_ROW}`), which the paper's errors use; `log median` is DeepSpeed's iter time over the "
        "same job's steps (run-to-run spread). Breakdown columns in seconds of the predicted iteration.",
        "",
        "| run | cluster | tp/pp/dp | stage layers | measured s | log median s | paper s (err %) | opcast s | "
        "error % | " + " | ".join(name for name, _ in BREAKDOWN) + " | collectives (learned / alpha-beta) |",
        "|" + "---|" * (10 + len(BREAKDOWN)),
    ]
    errors: dict[str, list[float]] = {}
    paper: dict[str, list[float]] = {}
    for run in runs:
        res = results[run.key]
        paper_err = 100 * (run.paper_predicted_s / run.measured_s - 1)
        paper.setdefault(run.cluster, []).append(abs(paper_err))
        head = (
            f"| {run.key} | {run.cluster}:{run.nodes} | {run.tp}/{run.pp}/{run.dp} | "
            f"{','.join(map(str, run.stage_layers))} | {run.measured_s:.2f} | {_fmt2(run.log_median_s)} | "
            f"{run.paper_predicted_s:.2f} ({paper_err:+.1f}) | "
        )
        if not getattr(res, "feasible", False) or res.iteration_time_s is None:
            lines.append(head + f"refused: {'; '.join(res.reasons)} |")
            errors.setdefault(run.cluster, []).append(math.inf)
            continue
        err = 100 * (res.iteration_time_s / run.measured_s - 1)
        errors.setdefault(run.cluster, []).append(abs(err))
        parts = [sum(res.breakdown_s.get(k, 0.0) for k in keys) for _, keys in BREAKDOWN]
        srcs = ", ".join(f"{k} {v}" for k, v in collective_sources(res).items())
        lines.append(
            head + f"{res.iteration_time_s:.2f} | {err:+.1f} | " + " | ".join(_fmt(p) for p in parts) + f" | {srcs} |"
        )
    lines += ["", "## Mean abs error per system", ""]
    lines += ["| cluster | runs | opcast % | issue 18 before % | paper (recomputed here) % | paper (abstract) % |"]
    lines.append("|---|---|---|---|---|---|")
    for cluster, errs in sorted(errors.items()):
        mean, ppr = sum(errs) / len(errs), sum(paper[cluster]) / len(paper[cluster])
        lines.append(
            f"| {cluster} | {len(errs)} | {mean:.2f} | {OPCAST_BEFORE_MEAN_APE[cluster]} | {ppr:.2f} | "
            f"{PAPER_MEAN_APE[cluster]} |"
        )
    laws = [r for r in held_out_laws(models) if r["cluster"] in errors]
    if laws:
        lines += ["", "## The model set's collective laws: held-out abs % error (collectives.json)", ""]
        lines += ["| cluster | kind | split | folds | rows | median % | mean % |", "|---|---|---|---|---|---|---|"]
        lines += [
            f"| {r['cluster']} | {r['kind']} | {r['split']} | {r['folds']} | {r['rows']} | {r['median_ape']} | "
            f"{r['mean_ape']} |"
            for r in laws
        ]
        lines += ["", "Per-fold detail of the laws: benchmarks/results/collectives.md."]
    lines += ["", "## Configurations (CLI equivalent; the library call also passes DeepSpeed's gradient bucket)", ""]
    lines += [f"- {run.key} ({run.log}, bucket {run.bucket_params:.3g}): `{cli_command(run)}`" for run in runs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runs",
        type=Path,
        default=Path(os.environ.get("OPCAST_GPUMODELING25", "GPUModeling25")),
        help="a checkout of github.com/Littlesnakess/GPUModeling25 (commit 990e847); default $OPCAST_GPUMODELING25",
    )
    parser.add_argument("--published", type=Path, default=SHARED, help="holds estimate-train-time/ (for the fit)")
    parser.add_argument("--models", type=Path, default=None, help="model set (default: fit one into benchmarks/.cache)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        runs = parse_runs(args.runs)
        models = args.models or ensure_models(args.published, lambda s: print(s, file=sys.stderr))
    except (RunsError, OSError, subprocess.CalledProcessError) as err:
        print(f"cluster_runs: {err}", file=sys.stderr)
        return 2
    t_pred = time.perf_counter()
    results = {run.key: predict(run, models) for run in runs}
    wall = time.perf_counter() - t_pred
    command = "python benchmarks/cluster_runs.py" + (f" --models {args.models}" if args.models else "")
    text = report(runs, results, models, wall, command)
    print(text)
    print(f"(total wall {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
