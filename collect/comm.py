"""``opcast collect comm``: collective latency and bandwidth under ``torchrun``, like nccl-tests.

For each collective and each message size of a log-spaced sweep: a barrier first, then per
iteration the time of one call on every rank (device synchronised before and after); the
iteration's time is the max across ranks and the result the median across iterations (p20/p80
kept). algbw = size / time and busbw = algbw x the nccl-tests factor (opcast.ops.BUS_FACTORS).
NCCL on GPUs, gloo on CPUs. Rank 0 writes the rows; a re-run skips sizes already measured.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcast.collect.io import PartWriter, WriterLock, done_point_ids, record_run
from opcast.collect.timing import summarise
from opcast.dtypes import dtype_bytes
from opcast.errors import OpcastError
from opcast.ops import bus_factor, get_op
from opcast.schema import point_id

COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommConfig:
    """Everything ``collect comm`` was asked to do."""

    out: Path
    """Dataset folder (rank 0 writes parts to out/comm/)."""
    backend: str = "gloo"
    """nccl | gloo."""
    ops: tuple[str, ...] = COMM_OPS
    """Collectives to sweep."""
    dtype: str = "fp32"
    """Element type of the buffers."""
    min_bytes: int = 1 << 10
    """Smallest message."""
    max_bytes: int = 1 << 26
    """Largest message."""
    step_factor: int = 4
    """Ratio of consecutive message sizes."""
    warmup_iters: int = 3
    """Untimed calls per size."""
    iters: int = 10
    """Timed calls per size."""


@dataclass(kw_only=True, slots=True)
class CommResult:
    rows_written: int = 0
    already_done: int = 0
    skipped: Counter = field(default_factory=Counter)
    world_size: int = 0
    nodes: int = 0
    gpus_per_node: int = 0
    device: str = ""


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Log-spaced sizes from min to max (inclusive where the ratio lands on it)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise OpcastError(f"bad sweep: need 1 <= --min-bytes ({min_bytes}) <= --max-bytes ({max_bytes}) and --step-factor ({factor}) >= 2")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def _topology() -> tuple[int, int, int, int]:
    from opcast.collect.bench import env_int

    env = os.environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        raise OpcastError("collect comm must run under torchrun, e.g. `torchrun --nproc-per-node 2 -m opcast.cli collect comm --out D`")
    world = env_int("WORLD_SIZE", default=1, minimum=1)
    rank = env_int("RANK", default=0, minimum=0)
    per_node = env_int("LOCAL_WORLD_SIZE", default=world, minimum=1)
    env_int("LOCAL_RANK", default=0, minimum=0)
    if rank >= world:
        raise OpcastError(f"RANK={rank} is outside WORLD_SIZE={world}; launch with torchrun, which sets both")
    if world < 2:
        raise OpcastError(f"collect comm needs at least 2 ranks, got WORLD_SIZE={world}; launch torchrun with --nproc-per-node 2 or more")
    if world % per_node:
        raise OpcastError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={per_node}; use the same --nproc-per-node on every node")
    return rank, world, world // per_node, per_node


def _call(op: str, buf, out, world: int, rank: int):
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "all_gather":  # *_single are the names from torch 2.13 on; older releases have *_tensor
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, buf)
    elif op == "reduce_scatter":
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, buf)
    elif op == "all_to_all":
        dist.all_to_all_single(out, buf)
    elif op == "broadcast":
        dist.broadcast(buf, 0)
    elif op == "send_recv":  # ring: send to the next rank, receive from the previous one
        reqs = [dist.P2POp(dist.isend, buf, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
        for r in dist.batch_isend_irecv(reqs):
            r.wait()


def _buffers(op: str, size: int, world: int, dtype, device):
    """(input, output) tensors such that the nccl-tests 'size' of the op is ``size`` bytes."""
    import torch

    elems = max(world, size // torch.tensor([], dtype=dtype).element_size())
    elems -= elems % world
    if op == "all_gather":  # size = gathered output
        return torch.ones(elems // world, dtype=dtype, device=device), torch.empty(elems, dtype=dtype, device=device)
    if op == "reduce_scatter":  # size = input
        return torch.ones(elems, dtype=dtype, device=device), torch.empty(elems // world, dtype=dtype, device=device)
    return torch.ones(elems, dtype=dtype, device=device), torch.empty(elems, dtype=dtype, device=device)


def run_comm(cfg: CommConfig, *, progress: Any = None) -> CommResult:
    """Sweep the collectives over every rank of the job; rank 0 writes the dataset (alone: a
    second sweep into the same ``--out`` is refused)."""
    rank, world, nodes, per_node = _topology()
    import torch

    from opcast.dtypes import torch_dtype

    for op in cfg.ops:
        if op not in COMM_OPS:
            get_op(op)  # unknown names get the registry's message
            raise OpcastError(f"{op} is not a collective; measure it with `opcast collect bench`")
    if cfg.backend not in ("nccl", "gloo"):
        raise OpcastError(f"unknown --backend {cfg.backend!r}; use nccl (GPUs) or gloo (CPUs)")
    if cfg.backend == "nccl" and not torch.cuda.is_available():
        raise OpcastError("--backend nccl needs CUDA GPUs; use --backend gloo on CPUs")
    sizes = message_sizes(cfg.min_bytes, cfg.max_bytes, cfg.step_factor)
    dtype = torch_dtype(cfg.dtype)
    if cfg.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    out = Path(cfg.out)
    if rank == 0:
        try:
            (out / "comm").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
    with WriterLock(out / "comm" / ".lock", command="comm", out=out) if rank == 0 else contextlib.nullcontext():
        return _sweep(cfg, sizes, dtype, device, rank=rank, world=world, nodes=nodes, per_node=per_node, progress=progress)


def _sweep(cfg: CommConfig, sizes: list[int], dtype: Any, device: Any, *, rank: int, world: int, nodes: int, per_node: int,
           progress: Any) -> CommResult:
    import torch
    import torch.distributed as dist

    from opcast.hardware import describe_local

    out = Path(cfg.out)
    spec = describe_local(str(device)) if rank == 0 else None
    dist.init_process_group(cfg.backend, device_id=device if cfg.backend == "nccl" else None)
    try:
        names = [spec.name if spec else None]
        dist.broadcast_object_list(names, src=0)
        device_name = names[0]
        done = [done_point_ids(out, device_name) if rank == 0 else set()]
        dist.broadcast_object_list(done, src=0)
        result = CommResult(world_size=world, nodes=nodes, gpus_per_node=per_node, device=device_name)
        run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        writer = PartWriter(out / "comm", rank=0, run_id=run_id) if rank == 0 else None
        todo = []
        for op in cfg.ops:
            for size in sizes:
                params = get_op(op).validate({"bytes": size, "world_size": world, "nodes": nodes, "gpus_per_node": per_node})
                pid = point_id(op, params, cfg.dtype, "fwd", None)
                if pid in done[0]:
                    result.already_done += 1
                else:
                    todo.append((op, params, pid))
        task = progress.add_task(f"comm {cfg.backend} x{world}", total=len(todo)) if progress is not None and rank == 0 else None
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        for op, params, pid in todo:
            buf, res = _buffers(op, params["bytes"], world, dtype, device)
            for _ in range(cfg.warmup_iters):
                _call(op, buf, res, world, rank)
            sync()
            times = []
            for _ in range(cfg.iters):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                _call(op, buf, res, world, rank)
                sync()
                times.append(time.perf_counter() - t0)
            mine = torch.tensor(times, dtype=torch.float64, device=device)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # per iteration, the slowest rank
            if writer is not None:
                stats = summarise(mine.cpu().tolist(), "wallclock_max_ranks")
                size = params["bytes"]
                algbw = size / stats.time_s_median / 1e9
                writer.add({
                    "run_id": run_id, "source": "comm", "device": device_name, "torch_version": torch.__version__,
                    "cuda_version": torch.version.cuda if device.type == "cuda" else None,
                    "opcast_version": _version(), "timing_method": f"wallclock_max_ranks:{cfg.backend}",
                    "op": op, "dtype": cfg.dtype, "direction": "fwd", "tensor_cores": None, "point_id": pid, **params,
                    "time_s_median": stats.time_s_median, "time_s_p20": stats.time_s_p20, "time_s_p80": stats.time_s_p80,
                    "n_reps": stats.n_reps, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, world),
                })
                result.rows_written += 1
            if task is not None:
                progress.update(task, advance=1, description=f"comm {op} {params['bytes']} B")
        if writer is not None:
            writer.flush()
            record_run(out, rank=0, record={
                "run_id": run_id, "command": "comm", "backend": cfg.backend, "world_size": world, "nodes": nodes,
                "gpus_per_node": per_node, "arguments": {k: str(v) for k, v in _asdict(cfg).items()},
                "rows_written": result.rows_written, "already_done": result.already_done,
                "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dtype_bytes": dtype_bytes(cfg.dtype),
            })
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result


def _version() -> str:
    import opcast

    return opcast.__version__


def _asdict(cfg: CommConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)
