"""``opcast predict``: kernel times, and the time, throughput and memory of distributed LLM
training and inference, on a CPU.

Commands are thin: parse -> build the config -> call the library -> print a rich summary or
``--json``. An infeasible configuration lists every reason in one line on stderr (after the JSON
document, with ``--json``) and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from opcast.cli_common import console

app = typer.Typer(no_args_is_help=True, help="Predict kernel latency and LLM training/inference time and memory.")

_GPU = typer.Option("--gpu", help="Catalog GPU name or alias (opcast hardware list), a device JSON file, or "
                                   "NAME[field=xK,...] (a hypothetical GPU, as --set makes).")
_SET = typer.Option("--set", help="Hypothetical GPU: FIELD=xK multiplies a spec of --gpu, FIELD=VALUE sets it (units as "
                                  "in the JSON keys, e.g. mem_bw_bytes_per_s=8e12); peak_flops=xK scales every peak. Repeat.")
_MODELS = typer.Option("--models", help="Learned kernel models (opcast train fit --out); default: the embedded ones.")
_ROOFLINE = typer.Option("--roofline", help="Ignore learned models: every kernel from the roofline fallback.")
_ANALYTIC = typer.Option("--analytic", help="Where a learned model would extrapolate beyond the hardware it was fitted on, "
                                            "use the analytical roofline instead (such kernels are flagged either way).")
_JSON = typer.Option("--json", help="Print the result as JSON.")


def _kernel_cost(models: Optional[Path], roofline: bool, analytic: bool = False):
    from opcast.predict.cost import load_kernel_cost

    return load_kernel_cost(models, use_learned=not roofline, in_range_only=analytic)


def _check_models(models: Optional[Path], roofline: bool) -> None:
    """Refuse --models with --roofline before any work (the rule: cost.models_flag_problem)."""
    from opcast.errors import OpcastError
    from opcast.predict.cost import models_flag_problem

    if (problem := models_flag_problem(models, not roofline)):
        raise OpcastError(problem)


def _device(gpu: str, sets: Optional[list[str]]):
    """The --gpu device with every --set applied (a hypothetical GPU named GPU[field=...])."""
    from opcast.hardware import derive_device, get_device

    return derive_device(get_device(gpu), sets or [])


def _parse_params(items: list[str]) -> dict[str, str]:
    from opcast.errors import OpcastError

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OpcastError(f"--param takes k=v, e.g. --param m=4096; got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _infeasible(reasons: tuple[str, ...] | list[str]):
    from opcast.errors import OpcastError

    return OpcastError(f"infeasible configuration ({len(reasons)} reason{'s' if len(reasons) != 1 else ''}): "
                       + "; ".join(reasons))


@app.command("kernel")
def kernel_cmd(
    gpu: Annotated[str, _GPU],
    op: Annotated[str, typer.Option("--op", help="Op kind (opcast.ops registry), e.g. gemm, attention, all_reduce.")],
    param: Annotated[Optional[list[str]], typer.Option("--param", help="Shape parameter k=v (repeat).")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, tf32, fp16, bf16 or fp8.")] = "bf16",
    direction: Annotated[str, typer.Option(help="fwd or bwd.")] = "fwd",
    tensor_cores: Annotated[Optional[bool], typer.Option("--tensor-cores/--no-tensor-cores",
                                                         help="Matrix math on tensor cores (fp32: TF32); default: all but fp32.")] = None,
    models: Annotated[Optional[Path], _MODELS] = None,
    roofline: Annotated[bool, _ROOFLINE] = False,
    analytic: Annotated[bool, _ANALYTIC] = False,
    set_: Annotated[Optional[list[str]], _SET] = None,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """Predict one kernel's time (collectives: the alpha-beta model; params bytes, world_size, nodes, gpus_per_node)."""
    import json

    _check_models(models, roofline)

    from rich.markup import escape

    from opcast.ops import get_op

    device = _device(gpu, set_)
    spec = get_op(op)
    params = _parse_params(param or [])
    if spec.collective:
        from opcast.predict.comm import Collective, CollectiveCostModel, Group

        clean = spec.validate(params)
        group = Group(clean["world_size"], clean["nodes"], clean["gpus_per_node"])
        seconds, source = CollectiveCostModel().time_s(Collective(spec.kind.value, clean["bytes"], group), device)
        doc = {"gpu": device.name, "op": spec.kind.value, "params": clean, "time_s": seconds, "source": source,
               "busbw_gbps": spec.bytes_moved(clean, 1) / seconds / 1e9 if seconds else None}
    else:
        from opcast.predict.cost import validated_kernel

        from opcast.predict.report import op_bottleneck

        k = validated_kernel(spec.kind.value, params, dtype, direction, tensor_cores)
        cost = _kernel_cost(models, roofline, analytic)
        seconds, source = cost.time_s(k, device)
        terms = cost.roofline.terms(k, device)
        res = cost.residuals(k, device)
        interval = {"time_s_interval": list(res.bounds(seconds, 0.9)), "interval_coverage": 0.9,
                    "interval_basis": f"held-out residuals of {res.group} ({res.device_class})"} if res is not None else \
            {"time_s_interval": None, "interval_basis": "none: no held-out residuals behind this time (roofline or an old model set)"}
        doc = {"gpu": device.name, "op": k.kind, "params": dict(k.params), "dtype": k.dtype, "direction": k.direction,
               "tensor_cores": k.tensor_cores, "time_s": seconds, "source": source, "flops": terms.flops,
               "bytes": terms.bytes, "roofline_time_s": terms.time_s, **op_bottleneck(k, seconds, device, cost),
               **interval, "notes": cost.describe()["notes"]}
    if as_json:
        console.print_json(json.dumps(doc))
        return
    span = doc.get("time_s_interval")
    console.print(f"[bold]{doc['op']}[/] {escape(str(doc['params']))} on {escape(device.name)}: [bold]{seconds * 1e6:.2f} us[/] "
                  + (escape(f"[{span[0] * 1e6:.2f}, {span[1] * 1e6:.2f}] ") if span else "") + f"({source})")
    if span:
        console.print(f"  90 % interval from the {escape(doc['interval_basis'])}")
    if "roofline_bound" in doc:
        util = doc["compute_utilisation"] if doc["roofline_bound"] == "compute" else doc["memory_bw_utilisation"]
        console.print(f"  {doc['flops']:.4g} FLOP, {doc['bytes']:.4g} bytes; roofline {doc['roofline_time_s'] * 1e6:.2f} us, "
                      f"{doc['roofline_bound']}-bound (intensity {doc['arithmetic_intensity_flop_per_byte'] or 0:.3g} vs ridge "
                      f"{doc['ridge_flop_per_byte']:.3g} FLOP/byte); the prediction uses {100 * util:.0f} % of the "
                      f"{'peak' if doc['roofline_bound'] == 'compute' else 'memory bandwidth'}")
        if doc["out_of_range"]:
            console.print(f"  warning: {doc['out_of_range']}", style="yellow", markup=False, highlight=False)
        for note in doc["notes"]:
            console.print(f"  note: {note}", style="yellow" if "roofline" in note else None)


@app.command("kernels")
def kernels_cmd(
    input: Annotated[Path, typer.Argument(help="Rows to predict: a .parquet (e.g. an opcast dataset) or .csv with op, dtype, direction and the op's parameter columns.")],
    gpu: Annotated[str, _GPU],
    out: Annotated[Path, typer.Option("--out", help="Output .parquet or .csv: the input rows plus time_s_pred and source_pred.")],
    models: Annotated[Optional[Path], _MODELS] = None,
    roofline: Annotated[bool, _ROOFLINE] = False,
    analytic: Annotated[bool, _ANALYTIC] = False,
    set_: Annotated[Optional[list[str]], _SET] = None,
) -> None:
    """Predict time_s_pred for every row of a table of kernels."""
    from opcast.predict.batch import predict_frame, read_rows, write_rows

    _check_models(models, roofline)
    device = _device(gpu, set_)
    frame = read_rows(input)
    cost = _kernel_cost(models, roofline, analytic)
    filled = predict_frame(frame, device, cost)
    write_rows(filled, out)
    counts = filled["source_pred"].value_counts().to_dict()
    console.print(f"{len(filled)} rows -> {out} on {device.name} ({', '.join(f'{v} {k}' for k, v in counts.items())})",
                  markup=False, highlight=False)
    flagged = cost.range_flags(device)
    if flagged:
        console.print(f"  warning: {len(flagged)} distinct kernel(s) outside the shapes or hardware their learned model was fitted on"
                      f"{' (roofline used, --analytic)' if analytic else ''}, e.g. {next(iter(flagged.values()))}",
                      style="yellow", markup=False, highlight=False)


@app.command("train")
def train_cmd(
    arch: Annotated[str, typer.Option("--arch", help="Arch preset (opcast arch list), preset JSON or Hugging Face config.json.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Catalog GPU name or alias, or a device JSON file.")] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes (default: as few as the world size needs).")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the GPU's typical node).")] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", help="NODESxGPUS (e.g. 16x8) or a cluster JSON file (nodes, gpus_per_node[, gpu]).")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 1,
    dp: Annotated[Optional[int], typer.Option("--dp", help="Data-parallel degree (default: world / (tp x pp x cp)).")] = None,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism.")] = False,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")] = 1,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1,
    global_batch: Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per iteration (default: one micro-batch per data-parallel rank).")] = None,
    seq: Annotated[int, typer.Option("--seq", help="Sequence length, tokens.")] = 2048,
    recompute: Annotated[str, typer.Option("--recompute", help="none, selective or full.")] = "none",
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage 0, 1, 2 or 3.")] = 0,
    precision: Annotated[str, typer.Option("--precision", help="bf16, fp16, fp32 or fp8.")] = "bf16",
    attention: Annotated[str, typer.Option("--attention", help="flash or eager.")] = "flash",
    schedule: Annotated[str, typer.Option("--schedule", help="1f1b or interleaved.")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="Model chunks per stage (interleaved).")] = 1,
    overlap_grad_reduce: Annotated[bool, typer.Option("--overlap-grad-reduce", help="Overlap DP gradient reduction with backward.")] = False,
    tensor_cores: Annotated[Optional[bool], typer.Option("--tensor-cores/--no-tensor-cores", help="Matrix math on tensor cores (fp32: TF32); default: all but fp32.")] = None,
    models: Annotated[Optional[Path], _MODELS] = None,
    roofline: Annotated[bool, _ROOFLINE] = False,
    analytic: Annotated[bool, _ANALYTIC] = False,
    set_: Annotated[Optional[list[str]], _SET] = None,
    as_json: Annotated[bool, _JSON] = False,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write a Chrome/Perfetto trace of one iteration.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a breakdown chart (needs matplotlib).")] = None,
    coverage: Annotated[float, typer.Option("--coverage", help="Coverage of the prediction interval (0-1).")] = 0.9,
    interval_mode: Annotated[str, typer.Option("--interval-mode", help="How kernel errors combine: group (correlated within a "
                                                                      "learned predictor, independent between them) or correlated (all together).")] = "group",
) -> None:
    """Iteration time, tokens/s, MFU and memory per GPU of one training configuration."""
    from opcast.archs import load_arch
    from opcast.errors import OpcastError
    from opcast.predict.parallel import TrainConfig, parse_cluster
    from opcast.predict.report import print_train, to_json, train_to_dict, write_plot, write_trace
    from opcast.predict.training import compile_train, run_train

    _check_models(models, roofline)
    device_name = gpu
    if cluster is not None:
        if nodes is not None or gpus_per_node is not None:
            raise OpcastError("give either --cluster or --nodes/--gpus-per-node, not both")
        c, cluster_gpu = parse_cluster(cluster)
        nodes, gpus_per_node = c.nodes, c.gpus_per_node
        device_name = gpu or cluster_gpu
    if device_name is None:
        raise OpcastError("--gpu is required (or a --cluster file naming its gpu); see opcast hardware list")
    spec = load_arch(arch)
    device = _device(device_name, set_)
    cfg = TrainConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=sp, micro_batch=micro_batch, global_batch=global_batch,
                      seq=seq, recompute=recompute, zero=zero, precision=precision, attention=attention,  # type: ignore[arg-type]
                      schedule=schedule, virtual_stages=virtual_stages, overlap_grad_reduce=overlap_grad_reduce,  # type: ignore[arg-type]
                      tensor_cores=tensor_cores)
    plan = compile_train(spec, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node)
    from opcast.predict.training import TrainResult

    kernels = None if isinstance(plan, TrainResult) else _kernel_cost(models, roofline, analytic)
    if not 0 < coverage < 1 or interval_mode not in ("group", "correlated"):
        raise OpcastError(f"--coverage must lie in (0, 1) and --interval-mode be group or correlated; got {coverage}, {interval_mode!r}")
    result = plan if isinstance(plan, TrainResult) else run_train(plan, kernels, coverage=coverage,
                                                                  interval_mode=interval_mode)  # type: ignore[arg-type]
    if as_json:
        console.print_json(to_json(train_to_dict(result, kernels)))
    elif result.layout is not None:
        print_train(result, console, kernels)
    if result.layout is not None:
        if trace is not None:
            write_trace(result, trace)
        if plot is not None:
            write_plot(result, plot)
    if not result.feasible:
        raise _infeasible(result.reasons)


@app.command("infer")
def infer_cmd(
    arch: Annotated[str, typer.Option("--arch", help="Arch preset, preset JSON or Hugging Face config.json.")],
    gpu: Annotated[str, _GPU],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 1,
    batch: Annotated[int, typer.Option("--batch", help="Sequences decoded together.")] = 1,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt tokens per sequence.")] = 512,
    gen_len: Annotated[int, typer.Option("--gen-len", help="Generated tokens per sequence.")] = 128,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes (default: as few as tp x pp needs).")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node.")] = None,
    precision: Annotated[str, typer.Option("--precision", help="bf16, fp16, fp32 or fp8.")] = "bf16",
    attention: Annotated[str, typer.Option("--attention", help="flash or eager.")] = "flash",
    tensor_cores: Annotated[Optional[bool], typer.Option("--tensor-cores/--no-tensor-cores", help="Matrix math on tensor cores; default: all but fp32.")] = None,
    models: Annotated[Optional[Path], _MODELS] = None,
    roofline: Annotated[bool, _ROOFLINE] = False,
    analytic: Annotated[bool, _ANALYTIC] = False,
    set_: Annotated[Optional[list[str]], _SET] = None,
    as_json: Annotated[bool, _JSON] = False,
) -> None:
    """Time to first token, time per output token, total latency, tokens/s, KV-cache size, and the
    decode-step GEMMs' arithmetic intensity against the GPU's ridge point."""
    from opcast.archs import load_arch
    from opcast.predict.inference import predict_infer
    from opcast.predict.parallel import InferConfig
    from opcast.predict.report import infer_to_dict, print_infer, to_json

    _check_models(models, roofline)
    spec = load_arch(arch)
    device = _device(gpu, set_)
    cfg = InferConfig(tp=tp, pp=pp, batch=batch, prompt_len=prompt_len, gen_len=gen_len, precision=precision,  # type: ignore[arg-type]
                      attention=attention, tensor_cores=tensor_cores)  # type: ignore[arg-type]
    from opcast.predict.parallel import validate_infer

    _, reasons = validate_infer(spec, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node)
    kernels = None if reasons else _kernel_cost(models, roofline, analytic)
    result = predict_infer(spec, device, cfg, nodes=nodes, gpus_per_node=gpus_per_node, kernels=kernels)
    if as_json:
        console.print_json(to_json(infer_to_dict(result, kernels)))
    elif result.memory is not None:
        print_infer(result, console, kernels)
    if not result.feasible:
        raise _infeasible(result.reasons)
