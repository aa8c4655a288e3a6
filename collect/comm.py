"""``opcast collect comm``: collective latency and bandwidth under ``torchrun``, like nccl-tests.

For each collective and each message size of a log-spaced sweep: a barrier first, then per
iteration the time of one call on every rank (device synchronised before and after); the
iteration's time is the max across ranks and the result the median across iterations (p20/p80
kept). algbw = size / time and busbw = algbw x the nccl-tests factor (opcast.ops.BUS_FACTORS).
NCCL on GPUs, gloo on CPUs. Every row records the topology (``world_size``, ``nodes``,
``gpus_per_node``), the ``backend``, the NCCL version (nccl) and, with ``cluster`` set (``collect
comm --cluster NAME``, a catalog cluster or cluster file), the cluster it ran on, which is what
``train fit`` fits a cluster's collective model on (:mod:`opcast.train.collectives`). Rank 0
writes the rows (alone: a second sweep into the same ``--out`` is refused); a re-run skips sizes
already measured, so it resumes without duplicates.

Stopping: every rank gets the signal (SIGINT, SIGTERM: torchrun forwards what it gets, SLURM
signals every task), but collectives are collective, so no rank leaves on its own. The barrier
before each size and each timed iteration is an all-reduce (max) of every rank's state: the
signal it got, whether rank 0 could not write (a full disk), whether it cannot allocate the
size's buffers. So all ranks stop at the same iteration, the size being measured is dropped
(measured again on resume), rank 0 writes every measured row and records the run in run.json as
interrupted, with the signal, and all ranks leave together. A second signal aborts a rank's
sweep at once (it still writes). A rank still blocked in a collective STUCK_AFTER_S after a
signal (a peer is gone or stopped) writes what it has from a watchdog thread and exits with
128 + the signal, before the launcher's SIGKILL. A collective that fails because a peer died
stops the run the same way, as one line.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcast.collect.io import DiskWriteError, PartWriter, WriterLock, done_point_ids, failure_text, finish_run
from opcast.collect.signals import StopSignals, signal_name
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
    cluster: str | None = None
    """Catalog cluster (name or alias) or cluster JSON file the job runs on; recorded on every row."""


@dataclass(kw_only=True, slots=True)
class CommResult:
    """What a comm run did (on rank 0: what it wrote)."""

    rows_written: int = 0
    already_done: int = 0
    planned: int = 0
    remaining: int = 0
    """Sizes left to measure (re-run to resume)."""
    skipped: Counter = field(default_factory=Counter)
    world_size: int = 0
    nodes: int = 0
    gpus_per_node: int = 0
    device: str = ""
    run_id: str = ""
    interrupted: bool = False
    signal: str | None = None
    """SIGINT or SIGTERM when a signal (on any rank) stopped the run."""
    error: str | None = None


MAX_MESSAGE_BYTES = 1 << 33
"""Largest ``--max-bytes``: 8 GiB, where nccl-tests' usual sweeps end (``-e 8G``). Bus bandwidth has
saturated long before (by ~1 GiB on NVLink and InfiniBand), and each rank holds an input and an output
buffer of up to the size, so larger messages only fail to allocate (skipped, after a wasted attempt
each) or push the node into swap. --max-bytes had no bound: 10**30 planned 45 sizes per collective, the
largest past what an int64 element count can hold."""


MAX_ITERS = 10_000
"""Most ``--iters`` and ``--warmup-iters`` per size: nccl-tests times 20 after 5 by default, and the median
of a few hundred no longer moves. A size stopped part-way is measured again from its start on resume, so
--iters 1000000000000 was accepted and never finished one size."""


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Log-spaced sizes from min to max (inclusive where the ratio lands on it)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise OpcastError(
            f"bad sweep: need 1 <= --min-bytes ({min_bytes}) <= --max-bytes ({max_bytes}) "
            f"and --step-factor ({factor}) >= 2"
        )
    if max_bytes > MAX_MESSAGE_BYTES:
        raise OpcastError(
            f"--max-bytes {max_bytes}: messages go up to {MAX_MESSAGE_BYTES} bytes (8 GiB, where bus bandwidth "
            "has long saturated); give a smaller --max-bytes"
        )
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def _topology() -> tuple[int, int, int, int]:
    from opcast.collect.bench import env_int

    env = os.environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        raise OpcastError(
            "collect comm must run under torchrun, "
            "e.g. `torchrun --nproc-per-node 2 -m opcast.cli collect comm --out D`"
        )
    world = env_int("WORLD_SIZE", default=1, minimum=1)
    rank = env_int("RANK", default=0, minimum=0)
    per_node = env_int("LOCAL_WORLD_SIZE", default=world, minimum=1)
    env_int("LOCAL_RANK", default=0, minimum=0)
    if rank >= world:
        raise OpcastError(f"RANK={rank} is outside WORLD_SIZE={world}; launch with torchrun, which sets both")
    if world < 2:
        raise OpcastError(
            f"collect comm needs at least 2 ranks, got WORLD_SIZE={world}; "
            "launch torchrun with --nproc-per-node 2 or more"
        )
    if world % per_node:
        raise OpcastError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={per_node}; "
            "use the same --nproc-per-node on every node"
        )
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


def cluster_name(cluster: str | None, per_node: int) -> str | None:
    """The catalog name of ``--cluster`` (a name, alias or cluster file), checked against the job:
    a node cannot run more ranks than the cluster has GPUs per node (a wrong cluster, or a
    launch with the wrong ``--nproc-per-node``)."""
    if cluster is None:
        return None
    from opcast.clusters import get_cluster

    spec = get_cluster(cluster)
    if per_node > spec.gpus_per_node:
        raise OpcastError(
            f"--cluster {cluster}: {spec.name} has {spec.gpus_per_node} GPUs per node but this job runs "
            f"{per_node} ranks per node; give the cluster the job runs on, or launch --nproc-per-node "
            f"{spec.gpus_per_node} or fewer"
        )
    return spec.name


def _with_cluster(cfg: CommConfig, per_node: int) -> CommConfig:
    from dataclasses import replace

    return replace(cfg, cluster=cluster_name(cfg.cluster, per_node))


def check_options(cfg: CommConfig) -> list[int]:
    """Check every option that needs neither the job nor torch (the collectives, --backend, --dtype,
    the message sizes, that --cluster exists) and return the message sizes: a typo is refused where
    it was typed, not after a torchrun launch (outside one it was hidden behind 'must run under
    torchrun')."""
    from opcast.clusters import get_cluster
    from opcast.dtypes import dtype_bytes

    for op in cfg.ops:
        if op not in COMM_OPS:
            get_op(op)  # unknown names get the registry's message
            raise OpcastError(f"{op} is not a collective; measure it with `opcast collect bench`")
    if cfg.backend not in ("nccl", "gloo"):
        raise OpcastError(f"unknown --backend {cfg.backend!r}; use nccl (GPUs) or gloo (CPUs)")
    dtype_bytes(cfg.dtype)
    if cfg.backend == "gloo" and cfg.dtype == "fp8" and set(cfg.ops) - {"send_recv"}:
        # torch's gloo refuses float8 in every collective ('Invalid scalar type'), which the ranks took for
        # another rank's death after the launch
        raise OpcastError(
            "--backend gloo has no fp8 collectives (only send_recv moves fp8 bytes); use --backend nccl on "
            "GPUs, or --dtype fp16, bf16 or fp32"
        )
    if not (1 <= cfg.iters <= MAX_ITERS and 0 <= cfg.warmup_iters <= MAX_ITERS):
        raise OpcastError(
            f"--iters takes 1 to {MAX_ITERS:,} and --warmup-iters 0 to {MAX_ITERS:,} calls per size "
            f"(got {cfg.iters}, {cfg.warmup_iters}); nccl-tests times 20 after 5"
        )
    sizes = message_sizes(cfg.min_bytes, cfg.max_bytes, cfg.step_factor)
    if cfg.cluster is not None:
        get_cluster(cfg.cluster)  # its GPUs per node are checked against the job's under torchrun
    if "WORLD_SIZE" not in os.environ:  # under torchrun rank 0 checks it and tells every rank (_claim)
        from opcast.atomic import output_folder_problem

        if problem := output_folder_problem("--out", cfg.out, holds="the dataset is written into it"):
            raise OpcastError(problem)
    return sizes


def run_comm(cfg: CommConfig, *, progress: Any = None) -> CommResult:
    """Sweep the collectives over every rank of the job; rank 0 writes the dataset (alone: a
    second sweep into the same ``--out`` is refused). See the module docstring for stopping."""
    ending = _Ending()
    with StopSignals(stuck_after_s=STUCK_AFTER_S, on_stuck=ending.stuck) as flag:  # before torch's slow import
        sizes = check_options(cfg)
        rank, world, nodes, per_node = _topology()
        import torch

        from opcast.dtypes import torch_dtype

        if cfg.backend == "nccl" and not torch.cuda.is_available():
            raise OpcastError("--backend nccl needs CUDA GPUs; use --backend gloo on CPUs")
        cfg = _with_cluster(cfg, per_node)
        dtype = torch_dtype(cfg.dtype)
        if cfg.backend == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        return _sweep(
            cfg,
            sizes,
            dtype,
            device,
            flag,
            ending,
            rank=rank,
            world=world,
            nodes=nodes,
            per_node=per_node,
            progress=progress,
        )


STUCK_AFTER_S = 5.0
"""After a signal, the longest a rank may stay blocked (in a collective whose peer is gone or
stopped) before it writes what it has and exits: inside the grace before SIGKILL of docker stop
(10 s), torchrun and SLURM (30 s)."""

PART_EVERY_S = 5.0
"""Rank 0 writes a part at least this often, so even a SIGKILL loses little."""

_STOP, _FAILED, _SKIP = range(3)
"""The fields of the state every rank all-reduces (max) before each size and each timed
iteration: the first signal received (0: none), rank 0 could not write, a rank cannot allocate
the size's buffers."""


class Blocked(Exception):
    """A signal arrived and the rank was still blocked in a collective ``STUCK_AFTER_S`` later."""


class _Ending:
    """Rank 0 ends a run once: on the main path or, when a collective is still blocked
    ``STUCK_AFTER_S`` after a signal, from the watchdog thread, which then exits the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Held by whoever touches the writer."""
        self.done = False
        self.finish: Any = None
        """Rank 0, once the sweep runs: ``finish(failure)`` writes the rows and run.json."""

    def stuck(self, signum: int) -> None:
        name = signal_name(signum)
        if self.lock.acquire(timeout=STUCK_AFTER_S):  # the main path may be writing
            try:
                if self.finish is not None and not self.done:
                    self.done = True
                    self.finish(
                        Blocked(
                            f"{name} arrived while a collective was blocked; still blocked {STUCK_AFTER_S:g} s "
                            "later (another rank is gone or stopped)"
                        ),
                        signum,
                    )
            except BaseException:
                pass
            finally:
                self.lock.release()
        with contextlib.suppress(OSError):
            os.write(
                2,
                f"opcast: {name} while a collective was blocked (another rank is gone or stopped): what was measured "
                "is saved; re-run the same command to resume\n".encode(),
            )
        os._exit(128 + signum)


def _claim(out: Path, device: Any, stack: contextlib.ExitStack, run_id: str) -> dict[str, Any]:
    """Rank 0: take the dataset folder (its lock) and read what is already measured there; an
    error message for every rank if it cannot."""
    from opcast.atomic import output_folder_problem
    from opcast.collect.local_device import describe_local

    try:
        if problem := output_folder_problem("--out", out, holds="the dataset is written into it"):
            raise OpcastError(problem)
        try:
            (out / "comm").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OpcastError(f"cannot write to {out}: {err.strerror}; choose a writable --out folder") from None
        stack.enter_context(WriterLock(out / "comm" / ".lock", command="comm", out=out))
        name = describe_local(str(device)).name
        return {"device": name, "done": done_point_ids(out, name), "run_id": run_id}
    except OpcastError as err:
        return {"error": str(err)}


def _sweep(
    cfg: CommConfig,
    sizes: list[int],
    dtype: Any,
    device: Any,
    flag: StopSignals,
    ending: _Ending,
    *,
    rank: int,
    world: int,
    nodes: int,
    per_node: int,
    progress: Any,
) -> CommResult:
    import torch.distributed as dist

    out = Path(cfg.out)
    dist.init_process_group(cfg.backend, device_id=device if cfg.backend == "nccl" else None)
    try:
        with contextlib.ExitStack() as stack:
            run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
            setup = [_claim(out, device, stack, run_id) if rank == 0 else None]
            dist.broadcast_object_list(setup, src=0)
            claimed = setup[0]
            assert claimed is not None, "broadcast_object_list fills setup on every rank"
            if "error" in claimed:
                raise OpcastError(claimed["error"])  # every rank stops with rank 0's one line
            return _measure(
                cfg,
                sizes,
                dtype,
                device,
                flag,
                ending,
                claimed,
                rank=rank,
                world=world,
                nodes=nodes,
                per_node=per_node,
                progress=progress,
            )
    finally:
        dist.destroy_process_group()


def _measure(
    cfg: CommConfig,
    sizes: list[int],
    dtype: Any,
    device: Any,
    flag: StopSignals,
    ending: _Ending,
    setup: dict[str, Any],
    *,
    rank: int,
    world: int,
    nodes: int,
    per_node: int,
    progress: Any,
) -> CommResult:
    """Time every size not yet measured; whatever stops the sweep (done, a signal on any rank, a
    full disk on rank 0, a collective that fails), rank 0 writes every measured row and records
    the run in run.json."""
    import torch
    import torch.distributed as dist

    out = Path(cfg.out)
    device_name, run_id = setup["device"], setup["run_id"]
    result = CommResult(world_size=world, nodes=nodes, gpus_per_node=per_node, device=device_name, run_id=run_id)
    todo = []
    for op in cfg.ops:
        for size in sizes:
            params = get_op(op).validate(
                {"bytes": size, "world_size": world, "nodes": nodes, "gpus_per_node": per_node}
            )
            pid = point_id(op, params, cfg.dtype, "fwd", None)
            if pid in setup["done"]:
                result.already_done += 1
            else:
                todo.append((op, params, pid))
    result.planned = result.already_done + len(todo)
    result.remaining = len(todo)
    writer = PartWriter(out / "comm", rank=0, run_id=run_id, every_s=PART_EVERY_S) if rank == 0 else None
    started = time.time()
    task = (
        progress.add_task(f"comm {cfg.backend} x{world}", total=len(todo))
        if progress is not None and rank == 0
        else None
    )
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    state = torch.zeros(3, dtype=torch.int64, device=device)
    disk_full = False

    def agree(cannot: bool = False) -> list[int]:
        """Every rank's wishes, max-reduced: all ranks take the same branch (and wait for each
        other, like a barrier)."""
        state.copy_(torch.tensor([flag.signum or 0, int(disk_full), int(cannot)], dtype=torch.int64))
        dist.all_reduce(state, op=dist.ReduceOp.MAX)
        return state.tolist()

    agreed = [0, 0, 0]
    failure: BaseException | None = None
    collective_error: BaseException | None = None
    in_step = True

    def record(failure: BaseException | None) -> dict[str, Any]:
        assert writer is not None
        result.rows_written = writer.saved
        result.interrupted = (
            failure is not None or bool(agreed[_FAILED]) or (result.signal is not None and result.remaining > 0)
        )
        result.error = failure_text(failure or collective_error)
        return {
            "run_id": run_id,
            "command": "comm",
            "backend": cfg.backend,
            "world_size": world,
            "nodes": nodes,
            "gpus_per_node": per_node,
            "device": device_name,
            "arguments": {k: str(v) for k, v in _asdict(cfg).items()},
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "dtype_bytes": dtype_bytes(cfg.dtype),
            "rows_written": result.rows_written,
            "rows_not_written": len(writer.rows),
            "planned": result.planned,
            "already_done": result.already_done,
            "remaining": result.remaining,
            "skipped": dict(result.skipped),
            "interrupted": result.interrupted,
            "signal": result.signal,
            "error": result.error,
        }

    def finish(failure: BaseException | None, signum: int) -> None:
        result.signal = signal_name(signum)
        finish_run(writer, out, rank=0, failure=failure, record=record)  # type: ignore[arg-type]

    if writer is not None:
        ending.finish = finish
    try:
        for op, params, pid in todo:
            try:
                buf, res = _buffers(op, int(params["bytes"]), world, dtype, device)  # an int param, validated
            except (RuntimeError, MemoryError):  # out of memory (torch's is a RuntimeError)
                buf = res = None
            agreed = agree(cannot=buf is None)
            if agreed[_STOP] or agreed[_FAILED]:
                break
            if agreed[_SKIP]:
                result.skipped[f"{op}: {params['bytes']} B buffers do not fit on every rank"] += 1
            else:
                for _ in range(cfg.warmup_iters):
                    _call(op, buf, res, world, rank)
                sync()
                times = []
                for _ in range(cfg.iters):
                    agreed = agree()  # the barrier before each iteration, and where every rank stops together
                    if agreed[_STOP] or agreed[_FAILED]:
                        break
                    sync()
                    t0 = time.perf_counter()
                    _call(op, buf, res, world, rank)
                    sync()
                    times.append(time.perf_counter() - t0)
                if len(times) < cfg.iters:  # stopped inside the size: it is measured again on resume
                    break
                mine = torch.tensor(times, dtype=torch.float64, device=device)
                dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # per iteration, the slowest rank
                if writer is not None:
                    row = _row(
                        cfg,
                        op,
                        params,
                        pid,
                        summarise(mine.cpu().tolist(), "wallclock_max_ranks"),
                        world=world,
                        run_id=run_id,
                        device_name=device_name,
                        device=device,
                    )
                    flag.shielded = True  # a second signal must not land between writing a part and forgetting its rows
                    try:
                        with ending.lock:
                            writer.add(row)
                    except DiskWriteError as err:  # the rows stay in the writer; every rank stops at the next agreement
                        failure, disk_full = err, True
                    finally:
                        flag.shielded = False
            buf = res = None
            result.remaining -= 1
            if task is not None:
                progress.update(task, advance=1, description=f"comm {op} {params['bytes']} B")
    except KeyboardInterrupt:  # a second signal: this rank leaves the lock-step; what was measured is written below
        in_step = False
    except RuntimeError as err:  # a collective failed: another rank stopped or died
        in_step, collective_error = False, err
    except BaseException as err:  # a bug: write what was measured, record the run, then re-raise
        in_step, failure = False, err
    flag.shielded = True
    signum = agreed[_STOP] or flag.signum or 0
    if collective_error is not None and not signum and failure is None:
        failure = _collective_failed(collective_error, out)
    pending: BaseException | None = None
    if writer is not None:
        with ending.lock:
            if not ending.done:  # else the watchdog has written and is ending the process
                ending.done = True
                try:
                    finish(failure, signum)
                except BaseException as err:  # raised after the other ranks are let go
                    pending = err
    else:
        result.signal = signal_name(signum)
        result.interrupted = failure is not None or bool(agreed[_FAILED]) or (bool(signum) and result.remaining > 0)
        result.error = failure_text(failure or collective_error)
        pending = failure
    if in_step:
        try:
            dist.barrier()  # every rank stopped at the same agreed point: they leave together
        except RuntimeError as err:
            # A peer has gone already: a second signal makes a rank leave the lock-step at once, and one that
            # lands while it waits in the agreement that stops everyone leaves its peers at this barrier (what
            # was measured is written above). Without a signal, the peer died: the collective failure's line.
            if not signum and pending is None:
                pending = _collective_failed(err, out)
    if pending is not None:
        raise pending
    return result


def _collective_failed(err: BaseException, out: Path) -> OpcastError:
    """The one line of a collective that failed without a signal: another rank stopped or died."""
    first = (str(err).splitlines() or [""])[0][:200]
    return OpcastError(
        f"a collective failed ({type(err).__name__}: {first}): another rank has stopped or died; "
        f"what was measured is saved in {out}; re-run the same command to resume"
    )


def _row(
    cfg: CommConfig,
    op: str,
    params: dict[str, Any],
    pid: str,
    stats: Any,
    *,
    world: int,
    run_id: str,
    device_name: str,
    device: Any,
) -> dict[str, Any]:
    import torch

    size = params["bytes"]
    algbw = size / stats.time_s_median / 1e9
    return {
        "run_id": run_id,
        "source": "comm",
        "device": device_name,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        "opcast_version": _version(),
        "timing_method": f"wallclock_max_ranks:{cfg.backend}",
        "op": op,
        "dtype": cfg.dtype,
        "direction": "fwd",
        "tensor_cores": None,
        "point_id": pid,
        **params,
        "time_s_median": stats.time_s_median,
        "time_s_p20": stats.time_s_p20,
        "time_s_p80": stats.time_s_p80,
        "n_reps": stats.n_reps,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(op, world),
        "cluster": cfg.cluster,
        "backend": cfg.backend,
        "nccl_version": _nccl_version() if cfg.backend == "nccl" else None,
    }


def _nccl_version() -> str | None:
    """The NCCL version torch was built with (``torch.cuda.nccl.version()``), as major.minor.patch."""
    try:
        import torch

        version = torch.cuda.nccl.version()
    except Exception:  # no CUDA build, or no NCCL in it: not known
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _version() -> str:
    import opcast

    return opcast.__version__


def _asdict(cfg: CommConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)
