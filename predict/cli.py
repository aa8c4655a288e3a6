"""``opcast predict``: kernel times, and the time, throughput and memory of distributed LLM
training and inference, on a CPU.

Commands are thin: parse (the options of :mod:`opcast.predict.options`) -> build the config ->
call the library -> print (:mod:`opcast.predict.report`) a rich summary or ``--json``. An
infeasible configuration lists every reason in one line on stderr (after the JSON document, with
``--json``) and exits with code 2.
"""

from __future__ import annotations

import typer

from opcast.cli_common import console, print_json
from opcast.predict.options import (
    ARCH,
    CLUSTER,
    COVERAGE,
    DIRECTION,
    DTYPE,
    GPU,
    GPUS_PER_NODE,
    INFER,
    INFER_NODES,
    INTERVAL_MODE,
    JSON,
    KERNEL_SOURCE,
    KERNELS_INPUT,
    KERNELS_OUT,
    NODES,
    OP,
    PARAM,
    SERVE,
    SERVE_PARALLEL,
    SERVE_PLOT,
    SERVE_TRACE,
    SET,
    TENSOR_CORES,
    TRACE,
    TRAIN,
    TRAIN_GPU,
    TRAIN_PLOT,
    Args,
    command,
    device,
    infer_config,
    kernel_cost,
    placement,
    serve_engine,
    serve_stream,
    train_config,
)

app = typer.Typer(no_args_is_help=True, help="Predict kernel latency and LLM training/inference time and memory.")


def _parse_params(items: list[str]) -> dict[str, str]:
    from opcast.errors import OpcastError

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OpcastError(f"--param takes k=v, e.g. --param m=4096; got {item!r}")
        if key.strip() in out:  # the second replaced the first silently
            raise OpcastError(
                f"--param {key.strip()} is given twice ({out[key.strip()]!r}, then {value.strip()!r}); give it once"
            )
        out[key.strip()] = value.strip()
    return out


def _infeasible(reasons: tuple[str, ...] | list[str]):
    from opcast.errors import OpcastError

    return OpcastError(
        f"infeasible configuration ({len(reasons)} reason{'s' if len(reasons) != 1 else ''}): " + "; ".join(reasons)
    )


@app.command("kernel")
@command(GPU, OP, PARAM, DTYPE, DIRECTION, TENSOR_CORES, *KERNEL_SOURCE, SET, JSON)
def kernel_cmd(o: Args) -> None:
    """Predict one kernel's time (collectives: the alpha-beta model; params bytes, world_size, nodes, gpus_per_node)."""
    from opcast.ops import get_op

    dev = device(o.gpu, o.set_)
    spec = get_op(o.op)
    params = _parse_params(o.param or [])
    if spec.collective:
        from opcast.predict.comm import Collective, CollectiveCostModel, Group

        clean = spec.validate(params)
        group = Group(clean["world_size"], clean["nodes"], clean["gpus_per_node"])
        seconds, source = CollectiveCostModel().time_s(Collective(spec.kind.value, clean["bytes"], group), dev)
        doc = {
            "gpu": dev.name,
            "op": spec.kind.value,
            "params": clean,
            "time_s": seconds,
            "source": source,
            "busbw_gbps": spec.bytes_moved(clean, 1) / seconds / 1e9 if seconds else None,
        }
    else:
        from opcast.predict.cost import validated_kernel
        from opcast.predict.report import op_bottleneck

        k = validated_kernel(spec.kind.value, params, o.dtype, o.direction, o.tensor_cores)
        cost = kernel_cost(o)
        seconds, source = cost.time_s(k, dev)
        terms = cost.roofline.terms(k, dev)
        res = cost.residuals(k, dev)
        interval = (
            {
                "time_s_interval": list(res.bounds(seconds, 0.9)),
                "interval_coverage": 0.9,
                "interval_basis": f"held-out residuals of {res.group} ({res.device_class})",
            }
            if res is not None
            else {
                "time_s_interval": None,
                "interval_basis": "none: no held-out residuals behind this time (roofline or an old model set)",
            }
        )
        doc = {
            "gpu": dev.name,
            "op": k.kind,
            "params": dict(k.params),
            "dtype": k.dtype,
            "direction": k.direction,
            "tensor_cores": k.tensor_cores,
            "time_s": seconds,
            "source": source,
            "flops": terms.flops,
            "bytes": terms.bytes,
            "roofline_time_s": terms.time_s,
            **op_bottleneck(k, seconds, dev, cost),
            **interval,
            "notes": cost.describe()["notes"],
        }
    if o.as_json:
        print_json(doc)
        return
    from opcast.predict.report import print_kernel

    print_kernel(doc, console)


@app.command("kernels")
@command(KERNELS_INPUT, GPU, KERNELS_OUT, *KERNEL_SOURCE, SET)
def kernels_cmd(o: Args) -> None:
    """Predict time_s_pred for every row of a table of kernels."""
    from opcast.predict.batch import predict_frame, read_rows, write_rows

    dev = device(o.gpu, o.set_)
    frame = read_rows(o.input)
    cost = kernel_cost(o)
    filled = predict_frame(frame, dev, cost)
    write_rows(filled, o.out)
    counts = filled["source_pred"].value_counts().to_dict()
    console.print(
        f"{len(filled)} rows -> {o.out} on {dev.name} ({', '.join(f'{v} {k}' for k, v in counts.items())})",
        markup=False,
        highlight=False,
    )
    flagged = cost.range_flags(dev)
    if flagged:
        console.print(
            f"  warning: {len(flagged)} distinct kernel(s) outside the shapes or hardware their learned model was "
            f"fitted on"
            f"{' (roofline used, --analytic)' if o.analytic else ''}, e.g. {next(iter(flagged.values()))}",
            style="yellow",
            markup=False,
            highlight=False,
        )


@app.command("train")
@command(
    ARCH,
    TRAIN_GPU,
    NODES,
    GPUS_PER_NODE,
    CLUSTER,
    *TRAIN,
    *KERNEL_SOURCE,
    SET,
    JSON,
    TRACE,
    TRAIN_PLOT,
    COVERAGE,
    INTERVAL_MODE,
)
def train_cmd(o: Args) -> None:
    """Iteration time, tokens/s, MFU and memory per GPU of one training configuration."""
    from opcast.archs import load_arch
    from opcast.errors import OpcastError
    from opcast.predict.report import print_train, train_to_dict, write_plot, write_trace
    from opcast.predict.training import TrainResult, compile_train, run_train

    where = placement(o)
    if where.gpu is None:
        raise OpcastError("--gpu is required (or a --cluster file naming its gpu); see opcast hardware list")
    spec = load_arch(o.arch)
    dev = device(where.gpu, o.set_)
    plan = compile_train(spec, dev, train_config(o), nodes=where.nodes, gpus_per_node=where.gpus_per_node)
    if isinstance(plan, TrainResult):  # infeasible: the reasons, no kernel priced
        result, kernels = plan, None
    else:
        kernels = kernel_cost(o)
        result = run_train(plan, kernels, where.comms(kernels), coverage=o.coverage, interval_mode=o.interval_mode)
    if o.as_json:
        print_json(train_to_dict(result, kernels))
    elif result.layout is not None:
        print_train(result, console, kernels)
    if result.layout is not None:
        if o.trace is not None:
            write_trace(result, o.trace)
        if o.plot is not None:
            write_plot(result, o.plot)
    if not result.feasible:
        raise _infeasible(result.reasons)


@app.command("infer")
@command(ARCH, TRAIN_GPU, INFER_NODES, GPUS_PER_NODE, CLUSTER, *INFER, *KERNEL_SOURCE, SET, JSON)
def infer_cmd(o: Args) -> None:
    """Time to first token, time per output token, total latency, tokens/s, KV-cache size, and the
    decode-step GEMMs' arithmetic intensity against the GPU's ridge point."""
    from opcast.archs import load_arch
    from opcast.errors import OpcastError
    from opcast.predict.inference import predict_infer
    from opcast.predict.parallel import validate_infer
    from opcast.predict.report import infer_to_dict, print_infer

    where = placement(o)
    if where.gpu is None:
        raise OpcastError("--gpu is required (or a --cluster naming its gpu); see opcast hardware list")
    spec = load_arch(o.arch)
    dev = device(where.gpu, o.set_)
    cfg = infer_config(o)
    _, reasons = validate_infer(spec, dev, cfg, nodes=where.nodes, gpus_per_node=where.gpus_per_node)
    kernels = None if reasons else kernel_cost(o)
    result = predict_infer(
        spec,
        dev,
        cfg,
        nodes=where.nodes,
        gpus_per_node=where.gpus_per_node,
        kernels=kernels,
        comms=None if kernels is None else where.comms(kernels),
    )
    if o.as_json:
        print_json(infer_to_dict(result, kernels))
    elif result.memory is not None:
        print_infer(result, console, kernels)
    if not result.feasible:
        raise _infeasible(result.reasons)


@app.command("serve")
@command(ARCH, GPU, GPUS_PER_NODE, *SERVE_PARALLEL, *SERVE, *KERNEL_SOURCE, SET, JSON, SERVE_TRACE, SERVE_PLOT)
def serve_cmd(o: Args) -> None:
    """Simulate serving a request stream with continuous batching: TTFT, TPOT and end-to-end latency
    percentiles, throughput and goodput of replicas of one model under vLLM, SGLang or TensorRT-LLM;
    --trace writes a Perfetto timeline of every step, --plot a figure of the latency CDFs and the load over time."""
    from opcast.archs import load_arch
    from opcast.predict.parallel import InferConfig
    from opcast.predict.serve.deployment import predict_serve
    from opcast.predict.serve.metrics import write_trace
    from opcast.predict.serve.report import print_serve, serve_to_dict, write_plot

    spec = load_arch(o.arch)
    dev = device(o.gpu, o.set_)
    cfg = InferConfig(**{s.name: getattr(o, s.name) for s in SERVE_PARALLEL})
    engine = serve_engine(o, dev)
    stream = serve_stream(o, engine)
    common = dict(router=o.router, gpus_per_node=o.gpus_per_node, slo_ttft_s=o.slo_ttft_s, slo_tpot_s=o.slo_tpot_s)
    if o.disaggregate is not None:
        from opcast.predict.serve.disagg import parse_disaggregate, predict_serve_disagg

        prefill, decode = parse_disaggregate(o.disaggregate)
        result = predict_serve_disagg(
            spec, dev, cfg, engine, stream, prefill=prefill, decode=decode, kernels=kernel_cost(o), **common
        )
    else:
        result = predict_serve(spec, dev, cfg, engine, stream, replicas=o.replicas, kernels=kernel_cost(o), **common)
    if o.as_json:
        print_json(serve_to_dict(result))
    else:
        print_serve(result, console)
    if o.trace is not None:  # after the result, as predict train: a file that cannot be written loses nothing printed
        write_trace(result.sim, o.trace, other={"arch": spec.name, "gpu": dev.name, "engine": engine.engine})
    if o.plot is not None:
        write_plot(result, o.plot)
