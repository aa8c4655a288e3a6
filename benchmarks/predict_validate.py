"""Validate `opcast predict` against published end-to-end measurements.

Usage:  python benchmarks/predict_validate.py [--published DIR] [--models DIR] [--leave-one-gpu-out WORK]

1. NeuSight's measured runs (sitar-lab/NeuSight, ASPLOS'25; ``../shared/published/neusight``),
   converted by ``opcast collect replay neusight`` into a runs table: FP32 Hugging Face models with
   eager attention on P4, P100, T4, V100 and A100-40GB, one GPU; "inf" is one full-sequence forward,
   "train" forward + backward without the optimizer. We predict the decoder-only ones (GPT-2,
   GPT-3 shapes, OPT; BERT and Switch are not decoder-only archs) with the learned models when a set
   is available (``--models``, else the embedded default) and with the roofline fallback, and
   print the error of every run. NeuSight reports 6-10 % on such runs.
   How the runs map to the op graph: FP32 on CUDA cores (TF32 off), ``attention=eager``,
   ``--framework hf`` (torch's native LayerNorm and softmax kernels), the
   arch's own dropout (OPT: ``attention_dropout: 0.0``, ``dropout: 0.1``; GPT-2/3: ``attn_pdrop`` and
   ``resid_pdrop`` 0.1), ``optimizer=none`` (NeuSight's ``measure_e2e`` in neusight/Tracing/trace.py
   builds no optimizer: it times ``model(x)`` and ``loss.backward()`` only); "inf" is
   the evaluation forward (no dropout) with logits for every position and no loss; "train" is
   ``predict train`` at tp = pp = dp = 1 with the micro-batch = the batch, forward + backward.
   What NeuSight's ``measure_e2e`` (neusight/Tracing/trace.py; its setup.py pins transformers
   4.38.1, README: PyTorch 2.1.0) times: ``AutoModelForCausalLM.from_config(config,
   attn_implementation="eager")``, fp32 (``cudnn.allow_tf32 = False``; matmul TF32 is off by default),
   ``input_ids = torch.ones(batch, seq)`` and nothing else (no attention mask, no labels); "inf" is
   ``model(x)`` under ``torch.no_grad()`` in ``eval()``; "train" is ``model(x)`` in ``train()``
   (dropout on), then, outside the timed regions, ``cross_entropy(logits, x)``, then
   ``loss.backward()`` timed (the loss's backward included); no optimizer and no ``zero_grad``, so
   every backward after the first accumulates into ``.grad`` (autograd's ``AccumulateGrad``: an
   in-place add per parameter); the mean of the 5 fastest of 25 runs. Hence ``--framework hf``
   prices transformers' eager modules as they run (:mod:`opcast.predict.graph`: ``gelu_new`` as its
   eight torch kernels, the head split/merge copies, the attention-probability dropout), and the
   training total here is forward + backward less the loss's forward plus one add per parameter.
2. Megatron-LM GPT-3 175B on 1024 A100s (Narayanan et al. 2021, arXiv 2104.04473, Sec. 5.1:
   TP 8, PP 8, DP 16, global batch 1536, 140 TFLOP/s per GPU = 45 % of peak, counted with their
   Eq. 3 which includes the recomputation forward). We predict it with the roofline fallback and
   report the same TFLOP/s measure; the constants are not tuned to it.

With ``--leave-one-gpu-out WORK`` the NeuSight runs are also priced by model sets that never saw the run's GPU
(issue 19's whole-model target is on GPUs the models were not trained on; NeuSight's own held-out runs, on H100, L4
and A100-80GB, are not in the published folder): NeuSight's kernel sweeps are replayed into ``WORK/data``, and for
each of the five GPUs ``opcast train fit``'s library (:func:`opcast.train.fit.fit_model_set`, its defaults, seed 0)
fits ``WORK/models/without-<GPU>`` with that GPU held out (``--holdout-device``); the run is priced with the set
that lacks its GPU (column ``logo``). Only NeuSight's sweeps are fitted: the runs are fp32, and the other sources'
rows (fp16/bf16 tensor-core kernels, Liger's fused norms) are other op groups. Fitted sets are kept in WORK and
reused (delete one to refit it).

Skips with a message when the published folder is absent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PUBLISHED = REPO.parent / "shared" / "published"


def neusight_runs(published: Path):
    """The runs table of NeuSight's label files, via the replay importer."""
    from opcast.collect.replay import run_replay
    from opcast.collect.replay.runs import read_runs

    with tempfile.TemporaryDirectory() as tmp:
        summary = run_replay("neusight", published / "neusight", Path(tmp))
        runs = [p for p in summary.outputs if p.name.endswith("-runs.parquet")]
        if not runs:
            raise SystemExit("the neusight replay wrote no runs table")
        return read_runs(runs[0])


def forward_only_s(arch, device, batch: int, seq: int, kernels) -> tuple[float, set[str]]:
    """One evaluation forward (no dropout, logits for every position, no loss) on one GPU."""
    from opcast.predict.graph import block_ops, embedding_ops, head_ops, precision_of

    prec = precision_of("fp32", framework=NEUSIGHT_FRAMEWORK)
    tokens = batch * seq
    groups = [
        (
            block_ops(
                arch,
                tp=1,
                batch=batch,
                seq_q=seq,
                seq_kv=seq,
                sp=False,
                attention="eager",
                training=False,
                framework=NEUSIGHT_FRAMEWORK,
            ),
            arch.n_layers,
        ),
        (
            embedding_ops(arch, tp=1, tokens=tokens, rows=tokens, training=False)
            + head_ops(arch, tp=1, tokens=tokens, rows=tokens, loss=False),
            1,
        ),
    ]
    total, sources = 0.0, set()
    for ops, repeat in groups:
        ks = [prec.of(kind, p) for _, kind, p, _ in ops]
        table = kernels.lookup(ks, device)
        for (_, _, _, count), k in zip(ops, ks):
            t, src = table[k]
            total += repeat * count * t
            sources.add(src)
    return total, sources


NEUSIGHT_FRAMEWORK = "hf"
"""NeuSight runs Hugging Face models in eager PyTorch: torch's native LayerNorm and softmax kernels
(registry ``impl`` native), not Megatron's fused ones (:mod:`opcast.predict.frameworks`)."""

NEUSIGHT_OPTIMIZER = "none"
"""NeuSight's training step: forward + backward, no optimizer (neusight/Tracing/trace.py ``measure_e2e``)."""

NEUSIGHT_80GB_TRAIN_RUNS = (
    ("A100-PCIe-80GB", "opt_13", 1, 2048),
    ("A100-PCIe-80GB", "opt_13", 2, 2048),
    ("A100-PCIe-80GB", "gpt3_27", 1, 2048),
    ("A100-PCIe-80GB", "gpt3_xl", 1, 2048),
    ("A100-PCIe-80GB", "gpt2_large", 4, 1024),
    ("H100-SXM5-80GB", "opt_13", 2, 2048),
    ("H100-SXM5-80GB", "gpt3_27", 1, 2048),
    ("L4", "gpt2_large", 1, 1024),
)
"""Training runs NeuSight measured on GPUs absent from the published folder (its
scripts/asplos/label/NVIDIA_A100_80GB_PCIe, NVIDIA_H100_80GB_HBM3 and NVIDIA_L4 label files): they
ran, so none may be refused. Only their shapes are used here (the memory check)."""


def neusight_train_memory(arch, device, batch: int, seq: int):
    """(before, after) bytes per GPU of a NeuSight training run: before, the accounting this
    benchmark used until issue 19 (the family's dropout, 0.1 on attention and hidden, and Adam
    states); after, the arch's own dropout and NeuSight's optimizer (none)."""
    from dataclasses import replace

    from opcast.predict.memory import train_memory

    def total(a, optimizer: str) -> float:
        kw = dict(tp=1, pp=1, dp=1, cp=1, ep=1, sp=False, micro_batches=1, virtual_stages=1, zero=0)
        return train_memory(
            a,
            stage=0,
            micro_batch=batch,
            seq=seq,
            precision="fp32",
            attention="eager",
            recompute="none",
            optimizer=optimizer,
            **kw,
        ).total_bytes

    before = total(replace(arch, attention_dropout=None, hidden_dropout=None), "adam")
    return before, total(arch, NEUSIGHT_OPTIMIZER)


def print_memory(label: str, device, arch, batch: int, seq: int) -> bool:
    """One line of memory before/after; True when the run fits after."""
    before, after = neusight_train_memory(arch, device, batch, seq)
    cap = device.mem_bytes

    def show(v: float) -> str:
        return f"{v / 2**30:7.1f} GiB {'fits' if v <= cap else 'REFUSED':7s}"

    print(f"  {label:38s} {cap / 2**30:5.0f} GiB  before {show(before)}  after {show(after)}")
    return after <= cap


def train_s(arch, device, batch: int, seq: int, kernels) -> tuple[float, float, set[str]]:
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import predict_train

    cfg = TrainConfig(
        micro_batch=batch,
        global_batch=batch,
        seq=seq,
        precision="fp32",
        attention="eager",
        optimizer=NEUSIGHT_OPTIMIZER,
        framework=NEUSIGHT_FRAMEWORK,
    )
    r = predict_train(arch, device, cfg, kernels=kernels)
    if r.iteration_time_s is None:
        raise ValueError("; ".join(r.reasons))
    # measure_e2e computes the loss between its two timed regions: its forward is not timed
    loss_fwd = sum(o.count * o.time_s for o in r.ops if o.phase == "forward" and o.role == "cross_entropy")
    # no zero_grad between iterations: each timed backward adds into the existing .grad, one add a parameter
    accumulate = accumulate_grad_s(arch, device, kernels)
    forward = r.breakdown_s["forward"] - loss_fwd
    return forward, forward + r.breakdown_s["backward"] + accumulate, {o.source for o in r.ops}


def accumulate_grad_s(arch, device, kernels) -> float:
    """Seconds of autograd's ``AccumulateGrad`` into gradients that already exist (torch
    ``torch/csrc/autograd/functions/accumulate_grad.h``: ``variable_grad += new_grad`` when grad mode
    is off in backward), one fp32 add per parameter tensor, priced as one add over all parameters."""
    from opcast.predict.graph import precision_of

    k = precision_of("fp32", framework=NEUSIGHT_FRAMEWORK).of(
        "elementwise", {"numel": int(arch.params_total()), "fn": "add"}
    )
    t, _ = kernels.lookup([k], device)[k]
    return t


def leave_one_gpu_out_models(published: Path, work: Path, devices: list[str]) -> dict[str, object]:
    """{device: the kernel cost model of a set fitted on NeuSight's sweeps without that device} (the module
    docstring); each set is fitted once into ``work`` and reused."""
    from opcast.collect.replay import run_replay
    from opcast.predict.cost import load_kernel_cost
    from opcast.train.fit import FitConfig, fit_model_set

    data = work / "data"
    if not (data / "neusight.parquet").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            summary = run_replay("neusight", published / "neusight", Path(tmp))
            data.mkdir(parents=True, exist_ok=True)
            for out in summary.outputs:  # the kernel rows only: the runs table is what is scored
                if not out.name.endswith("-runs.parquet"):
                    out.replace(data / out.name)
    models = {}
    for dev in devices:
        name = "without-" + dev.replace("/", "_")
        if not (work / "models" / name / "meta.json").is_file():
            print(f"fitting {name} (NeuSight's sweeps, {dev} held out) ...", flush=True)
            fit_model_set([data], work / "models", name=name, cfg=FitConfig(holdout_devices=(dev,), seed=0))
        models[dev] = load_kernel_cost(work / "models" / name)
    return models


def validate_neusight(published: Path, cost_models: dict[str, object], runs=None) -> None:
    """Price every decoder-only NeuSight run (``runs``: :func:`neusight_runs`, replayed when not given) with each
    cost model (a model, or {device: model} for the leave-one-GPU-out sets) and print the errors."""
    from opcast.archs import load_arch
    from opcast.errors import OpcastError
    from opcast.hardware import get_device

    runs = neusight_runs(published) if runs is None else runs
    configs = published / "neusight" / "scripts" / "asplos" / "data" / "DLmodel_configs"
    print(f"NeuSight end-to-end runs: {len(runs)} in the runs table")
    header = f"{'device':16s} {'model':11s} {'mode':5s} {'b':>3s} {'seq':>5s} {'measured':>10s}"
    for name in cost_models:
        header += f" {name + ' pred':>14s} {'err':>7s}"
    print(header)
    errors: dict[str, list[tuple[str, str, float]]] = {name: [] for name in cost_models}
    skipped: dict[str, int] = {}
    for row in runs.sort_values(["device", "model", "mode", "batch"]).itertuples():
        try:
            # the config.json NeuSight built the model from (transformers' modules, e.g. gelu_new),
            # not the preset of the same shape the runs table names
            config = configs / f"{row.model}.json"
            arch = load_arch(config) if config.is_file() or not row.arch else load_arch(row.arch)
        except OpcastError as err:
            key = f"{row.model}: {str(err).split(';')[0]}"
            skipped[key] = skipped.get(key, 0) + 1
            continue
        device = get_device(row.device)
        line = f"{row.device:16s} {row.model:11s} {row.mode:5s} {row.batch:3d} {row.seq:5d} {row.total_s:10.4f}"
        for name, model in cost_models.items():
            kernels = model[row.device] if isinstance(model, dict) else model
            if row.mode == "inf":
                pred, sources = forward_only_s(arch, device, int(row.batch), int(row.seq), kernels)
            else:
                _, pred, sources = train_s(arch, device, int(row.batch), int(row.seq), kernels)
            err = (pred - row.total_s) / row.total_s
            errors[name].append((row.device, row.mode, err))
            tag = "L" if sources == {"learned"} else "R" if sources == {"roofline"} else "L+R"
            line += f" {pred:10.4f} {tag:>3s} {100 * err:+6.1f}%"
        print(line)
    for reason, n in skipped.items():
        print(f"  skipped {n:2d} run(s): {reason} (not a decoder-only arch opcast models)")
    print()
    print(
        "Memory per GPU of NeuSight's training runs (fp32, eager attention): before = family dropout + Adam, "
        "after = the arch's dropout + no optimizer, as NeuSight ran them"
    )
    refused = 0
    shapes = [(r.device, r.model, int(r.batch), int(r.seq)) for r in runs.itertuples() if r.mode == "train"]
    for dev, model, batch, seq in shapes + list(NEUSIGHT_80GB_TRAIN_RUNS):
        try:
            arch = load_arch(configs / f"{model}.json")
        except OpcastError:
            continue  # BERT, Switch: not decoder-only
        refused += not print_memory(f"{dev} {model} b{batch} s{seq}", get_device(dev), arch, batch, seq)
    print(f"  {refused} measured run(s) refused after the change (every one of them ran)")
    print()
    for name, errs in errors.items():
        if not errs:
            continue
        mape = statistics.fmean(abs(e) for _, _, e in errs)
        by_dev = {}
        for dev, _, e in errs:
            by_dev.setdefault(dev, []).append(abs(e))
        per_dev = ", ".join(f"{d} {100 * statistics.fmean(v):.1f}%" for d, v in sorted(by_dev.items()))
        by_mode = {m: statistics.fmean(abs(e) for _, mm, e in errs if mm == m) for m in {m for _, m, _ in errs}}
        print(
            f"{name}: MAPE {100 * mape:.1f}% over {len(errs)} runs; median |err| "
            f"{100 * statistics.median(abs(e) for _, _, e in errs):.1f}%; by mode "
            + ", ".join(f"{m} {100 * v:.1f}%" for m, v in sorted(by_mode.items()))
            + f"; by device {per_dev}"
        )
    print("(NeuSight's own end-to-end error on such runs: about 6-10 %)")


def narayanan_eq3_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), with recomputation."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_175b() -> None:
    from opcast.archs import load_arch
    from opcast.hardware import get_device
    from opcast.predict.cost import roofline_only
    from opcast.predict.parallel import TrainConfig
    from opcast.predict.training import predict_train

    arch = load_arch("megatron-175b")  # GPT-3 175B shape with Megatron's 51200 vocab
    device = get_device("A100-SXM4-80GB")
    flops = narayanan_eq3_flops(1536, 2048, arch.n_layers, arch.hidden, arch.vocab)
    print()
    print("Megatron-LM GPT-3 175B, 1024 x A100-SXM4-80GB (128 nodes x 8), TP 8, PP 8, DP 16, batch 1536, seq 2048,")
    print(
        "fp16, full recomputation, unfused (eager) attention as in 2021; published: 140 TFLOP/s per GPU (45 % of 312)."
    )
    print(f"{'assumed schedule':32s} {'iteration':>10s} {'TFLOP/s/GPU':>12s} {'vs 140':>7s} {'MFU':>6s}  breakdown (s)")
    for label, kw in (
        ("1F1B, micro-batch 1", dict(micro_batch=1)),
        ("interleaved v=2, micro-batch 1", dict(micro_batch=1, schedule="interleaved", virtual_stages=2)),
        ("1F1B, micro-batch 2", dict(micro_batch=2)),
    ):
        cfg = TrainConfig(
            tp=8, pp=8, dp=16, global_batch=1536, seq=2048, precision="fp16", attention="eager", recompute="full", **kw
        )
        r = predict_train(arch, device, cfg, nodes=128, gpus_per_node=8, kernels=roofline_only())
        if r.iteration_time_s is None:
            print(f"{label:32s} infeasible: {'; '.join(r.reasons)}")
            continue
        tflops = flops / r.iteration_time_s / 1024 / 1e12
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r.breakdown_s.items() if v > 0.005)
        print(
            f"{label:32s} {r.iteration_time_s:9.2f}s {tflops:12.1f} {100 * (tflops / 140 - 1):+6.1f}% "
            f"{100 * r.mfu:5.1f}%  {parts}{'' if r.fits else '  [does not fit]'}"
        )
    print(
        "(roofline fallback, Calculon's A100 efficiency tables, NCCL alpha-beta collectives; nothing tuned to this "
        "point)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--published", type=Path, default=DEFAULT_PUBLISHED)
    ap.add_argument("--models", type=Path, default=None, help="learned model set (default: the embedded one, if any)")
    ap.add_argument(
        "--leave-one-gpu-out",
        type=Path,
        default=None,
        metavar="WORK",
        help="also price each NeuSight run with a model set fitted without its GPU (fitted into WORK, reused)",
    )
    args = ap.parse_args()
    from opcast.predict.cost import load_kernel_cost, roofline_only

    learned = load_kernel_cost(args.models)
    models = {"roofline": roofline_only()}
    if learned.models_label:
        models = {"learned": learned, **models}
        print(f"learned models: {learned.models_label}")
    else:
        print(f"no learned models ({'; '.join(learned.notes)})")
    if args.published.is_dir():
        runs = neusight_runs(args.published)
        if args.leave_one_gpu_out is not None:
            devices = sorted(set(runs["device"].astype(str)))
            logo = leave_one_gpu_out_models(args.published, args.leave_one_gpu_out, devices)
            models = {
                **{k: v for k, v in models.items() if k != "roofline"},
                "logo": logo,
                "roofline": models["roofline"],
            }
        validate_neusight(args.published, models, runs)
    else:
        print(
            f"skipping the NeuSight validation: published measurements not found at {args.published} "
            "(clone the shared data beside the repo or pass --published)"
        )
    megatron_175b()
    return 0


if __name__ == "__main__":
    sys.exit(main())
