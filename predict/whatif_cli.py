"""``opcast explore`` and ``opcast compare``: hardware what-if studies on the command line.

- ``opcast explore train|infer --arch A --gpu BASE --vary FIELD=1,1.5,2,4 [--vary FIELD2=...]``
  predicts the workload on every point of the grid of hypothetical GPUs around BASE and prints
  the speed-up over BASE with the compute-bound / memory-bound / communication / bubble shares
  at each point (``--csv`` writes the grid, ``--plot`` draws where the bottleneck moves).
- ``opcast compare train|infer --arch A --gpus A100-SXM4-80GB,H100-SXM,B200`` runs the same
  workload on each GPU and prints every phase's seconds and speed-up over the first.

Both take the training or inference options of ``opcast predict train|infer`` (the same
declarations, :mod:`opcast.predict.options`); a GPU may be any ``--gpu`` spelling, including a
derived ``NAME[field=xK,...]``. ``--cluster`` takes the forms of ``predict train``: explore's
``--cluster NAME[:NODES]`` is the base GPU on that cluster (``--gpu`` then left out); compare's
places each of ``--gpus`` in the catalog cluster's network (its links and NVLink domain, and the
learned collectives a model set holds for it), so ``--cluster perlmutter --gpus A100-SXM4-80GB,H100-SXM``
asks what Perlmutter would do with H100s; a nodes file naming a gpu is refused there. Commands
are thin: parse, build the workload, call :mod:`opcast.predict.whatif`, print with
:mod:`opcast.predict.report`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from opcast.cli_common import console, err_console, print_json
from opcast.errors import OpcastError
from opcast.predict.options import (
    ARCH,
    CHART,
    CLUSTER,
    COMPARE_CLUSTER,
    EXPLORE_GPU,
    GPU_LIST,
    GPUS_PER_NODE,
    INFER,
    INFER_NODES,
    JSON,
    KERNEL_SOURCE,
    NODES,
    SET,
    TABLE_CSV,
    TRAIN,
    VARY,
    Args,
    Placement,
    command,
    device,
    infer_config,
    kernel_cost,
    placement,
    train_config,
)

explore_app = typer.Typer(
    no_args_is_help=True,
    help="Scan hypothetical GPUs around a base: speed-up and where the bottleneck moves (--vary FIELD=1,2,4).",
)
compare_app = typer.Typer(no_args_is_help=True, help="One workload on several GPUs, side by side, phase by phase.")

_OUTPUTS = (*KERNEL_SOURCE, JSON, TABLE_CSV, CHART)


def _workload(kind: str, o: Args, where: Placement):
    from opcast.archs import load_arch
    from opcast.predict.whatif import Workload

    return Workload(
        kind=kind,
        arch=load_arch(o.arch),
        config=train_config(o) if kind == "train" else infer_config(o),
        nodes=where.nodes,
        gpus_per_node=where.gpus_per_node,
    )


def _write_csv(frame, path: Path | None) -> None:
    if path is None:
        return
    from opcast.predict.batch import write_rows

    write_rows(frame, path)
    _wrote(path)


def _wrote(path: Path) -> None:
    err_console.print(f"wrote {path}", markup=False, highlight=False)


# --------------------------------------------------------------------------- explore


def _run_explore(kind: str, o: Args) -> None:
    from opcast.predict.report import explore_to_dict, plot_explore, print_explore
    from opcast.predict.whatif import explore, parse_vary

    where = placement(o)
    if where.gpu is None:
        raise OpcastError("--gpu is required (or a --cluster naming its gpu); see opcast hardware list")
    workload = _workload(kind, o, where)
    grid = parse_vary(o.vary)
    base = device(where.gpu, o.set_)
    kernels = kernel_cost(o)
    result = explore(workload, base, grid, kernels=kernels, comms=where.comms(kernels))
    frame = result.frame()
    if o.as_json:
        print_json(explore_to_dict(result, frame, kernels))
    else:
        print_explore(result, frame, console)
    _write_csv(frame, o.csv)
    if o.plot is not None:
        _wrote(plot_explore(result, frame, o.plot))


@explore_app.command("train")
@command(ARCH, EXPLORE_GPU, VARY, SET, NODES, GPUS_PER_NODE, CLUSTER, *TRAIN, *_OUTPUTS)
def explore_train(o: Args) -> None:
    """A training iteration on a grid of hypothetical GPUs around --gpu."""
    _run_explore("train", o)


@explore_app.command("infer")
@command(ARCH, EXPLORE_GPU, VARY, SET, INFER_NODES, GPUS_PER_NODE, CLUSTER, *INFER, *_OUTPUTS)
def explore_infer(o: Args) -> None:
    """One inference batch (prefill + decode) on a grid of hypothetical GPUs around --gpu."""
    _run_explore("infer", o)


# --------------------------------------------------------------------------- compare


def _run_compare(kind: str, o: Args) -> None:
    from opcast.predict.report import compare_to_dict, plot_compare, print_compare
    from opcast.predict.whatif import compare, split_gpu_list

    names = split_gpu_list(o.gpus)  # its bound before any work
    where = placement(o, gpu_given=False)
    workload = _workload(kind, o, where)
    # A catalog cluster is the network every GPU is placed in: its links and NVLink domain, then --set.
    devices = [device(name, [*where.network, *(o.set_ or [])]) for name in names]
    kernels = kernel_cost(o)
    result = compare(workload, devices, kernels=kernels, comms=where.comms(kernels))
    frame = result.frame()
    if o.as_json:
        print_json(compare_to_dict(result, frame, kernels))
    else:
        print_compare(result, frame, console)
    _write_csv(frame, o.csv)
    if o.plot is not None:
        _wrote(plot_compare(result, o.plot))


@compare_app.command("train")
@command(ARCH, GPU_LIST, SET, NODES, GPUS_PER_NODE, COMPARE_CLUSTER, *TRAIN, *_OUTPUTS)
def compare_train(o: Args) -> None:
    """One training iteration on each of --gpus: seconds and speed-up per phase (compute by op kind,
    communication, bubble). --set applies to every GPU."""
    _run_compare("train", o)


@compare_app.command("infer")
@command(ARCH, GPU_LIST, SET, INFER_NODES, GPUS_PER_NODE, COMPARE_CLUSTER, *INFER, *_OUTPUTS)
def compare_infer(o: Args) -> None:
    """One inference batch on each of --gpus: TTFT, TPOT and each phase's seconds and speed-up.
    --set applies to every GPU."""
    _run_compare("infer", o)
