"""Replay the text output of nccl-tests (``all_reduce_perf`` and friends, NVIDIA/nccl-tests).

Input: what the binaries print on stdout, one or more ``.txt``/``.log``/``.out`` files (``root`` is
one file or a folder searched recursively); several runs may follow each other in one file.

What a run looks like::

    # nccl-tests version 2.13.11 nccl-headers=21805 nccl-library=21805     (newer versions)
    # Collective test starting: all_reduce_perf                            (newer versions)
    # nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 ...
    # Using devices
    #  Rank  0 Group  0 Pid  30518 on dgx-a100-07 device  0 [0000:07:00] NVIDIA A100-SXM4-80GB
    ...
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
           8             2     float     sum      -1    24.55    0.00    0.00       0    24.25 ...

The table header names the columns, so older layouts (no ``root``, ``error`` for ``#wrong``),
``-C`` (``cputime``), the per-iteration columns and ``timestamp`` all parse; a data line whose
field count differs from its header, or with a non-numeric value, is a :class:`MalformedFile`
naming file:line.

Collective: from the ``# Collective test starting:`` line, else from the file name (it must
contain the binary's name, e.g. ``all_gather_perf_2x8.log``; ``allgather`` spellings work too).
The column layout alone cannot tell all_reduce from sendrecv, so it is only used to check the
choice: the file's busbw/algbw ratio must match the nccl-tests factor of that collective over the
world size (see below), or the file is rejected naming the line.

Topology: ``world_size`` = the distinct ``Rank`` lines, ``nodes`` = their distinct host names,
``gpus_per_node`` = world / nodes; ``--world-size``, ``--nodes`` and ``--gpus-per-node`` override
(and are needed when the rank lines are missing). Runs split into several communicators
(``Group`` > 0, ``-m``/``NCCL_TESTS_SPLIT``) are skipped unless ``--world-size`` is given.
Device: the GPU name on the rank lines, resolved by :func:`opcast.hardware.get_device`
(``--device`` overrides; an unknown GPU is an error asking for it).

Rows (``timing_method`` ``replay:nccl-tests:out-of-place``): one per size and type. Time is the
**out-of-place** column (us -> s, ``/1e6``), which nccl-tests reports as the mean over ``iters``
timed iterations (averaged across ranks by default); in-place times are not used. ``n_reps`` is
``iters`` x ``agg iters``; a size repeated within a file (``-N`` cycles, reruns) gives the median
over its lines, with p20/p80 from 3 lines on. ``bytes`` is the ``size`` column, which nccl-tests
defines as opcast does (all_gather: gathered output; reduce_scatter: input). ``algbw_gbps`` and
``busbw_gbps`` are recomputed from bytes and time (GB/s = 1e9 B/s, opcast.ops.bus_factor); the
file's own columns only serve as a check (algbw within 5 % + 0.015 of size/time; busbw/algbw
within 2 % of the factor where algbw >= 1 GB/s, so the rounding of small values cannot trip it).

Cluster tags: every row has ``backend`` ``nccl`` and, where the header prints it
(``nccl-library=21805``, nccl-tests 2.13 on), ``nccl_version`` (``2.18.5``; the first such line of a
file holds for all its runs). The output does not say which cluster ran it (the host names are
not catalog names), so ``cluster`` stays null.

Skipped, with reasons: sizes where either ``#wrong`` is > 0 (the data check failed; old builds
print a float ``error`` per size instead, so there a whole run is skipped when its footer reports
out-of-bounds values), types other
than float/half/bfloat16, reductions other than ``sum``, size 0, single-rank runs, and binaries
opcast has no collective for (reduce, gather, scatter, hypercube, alltoallv).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opcast.collect.replay.common import MalformedFile, ReplayResult
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.ops import bus_factor

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

TIMING = "replay:nccl-tests:out-of-place"
SUFFIXES = (".txt", ".log", ".out")

BINARIES = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "sendrecv_perf": "send_recv",
    "broadcast_perf": "broadcast",
}
UNSUPPORTED = ("alltoallv_perf", "reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf")
# File-name fragments (lower case, without _ and -), most specific first.
_NAME_FRAGMENTS = (
    ("reducescatter", "reduce_scatter_perf"),
    ("allreduce", "all_reduce_perf"),
    ("allgather", "all_gather_perf"),
    ("alltoallv", "alltoallv_perf"),
    ("alltoall", "alltoall_perf"),
    ("sendrecv", "sendrecv_perf"),
    ("broadcast", "broadcast_perf"),
    ("hypercube", "hypercube_perf"),
    ("reduceperf", "reduce_perf"),
    ("gatherperf", "gather_perf"),
    ("scatterperf", "scatter_perf"),
)
DTYPES = {
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
}
REDUCTIONS = ("all_reduce", "reduce_scatter")

_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_AGG_ITERS = re.compile(r"\bagg iters:\s*(\d+)")
_NCCL_LIBRARY = re.compile(r"\bnccl-library=(\d+)")
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.*\S)\s*$"
)


@dataclass(slots=True)
class _Line:
    """One table line: its number and the fields that matter."""

    number: int
    size: int
    type: str
    redop: str | None
    time_us: float
    algbw: float
    busbw: float
    wrong: bool


@dataclass(slots=True)
class _Run:
    """One run of a binary: its header facts and table lines."""

    binary: str | None = None
    nthread: bool = False
    reps: int | None = None
    ranks: dict[int, tuple[str | None, str, str, int]] = field(default_factory=dict)
    """rank -> (group, host, GPU name, line number)."""
    columns: list[str] | None = None
    header_line: int = 0
    cputime: bool = False
    out_of_bounds: int = 0
    """The footer's 'Out of bounds values' count (what old builds' float ``error`` column feeds)."""
    footer: bool = False
    """Whether the run's footer (``# Out of bounds values``, ``# Avg bus bandwidth``) was read: a run
    without one was cut off (a job killed, a log truncated)."""
    cut_line: int | None = None
    """The file's last line, when it is a table line cut short (not parsed)."""
    lines: list[_Line] = field(default_factory=list)
    nccl_version: str | None = None
    """The NCCL library version the file's header names (``nccl-library=``), if any."""

    def started(self) -> bool:
        return self.nthread or bool(self.ranks) or self.columns is not None


def replay(root: Path, options: ReplayOptions) -> ReplayResult:
    """Rows of every nccl-tests table in the file(s) under ``root``."""
    result = ReplayResult()
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise OpcastError(f"no nccl-tests output (*{', *'.join(SUFFIXES)}) under {root}")
    forced = get_device(options.device).name if options.device else None
    for path in files:
        rel = path.name if root.is_file() else path.relative_to(root).as_posix()
        runs = _parse(path)
        if not any(run.columns for run in runs):
            if root.is_file():
                raise MalformedFile(path, None, "no nccl-tests results table (a '#  size  count  type ...' header)")
            result.skipped["file without an nccl-tests table"] += 1
            continue
        result.files += 1
        groups: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
        for run in runs:
            _convert(path, run, options, forced, groups, result.skipped)
            if run.lines and not run.footer:
                partial = f"; its last line ({run.cut_line}) is cut short and was not read" if run.cut_line else ""
                result.notes.append(
                    f"{rel}: the {run.binary or 'nccl-tests'} run ends after {len(run.lines)} sizes without its "
                    f"'# Avg bus bandwidth' footer (cut off?){partial}; the complete lines were replayed"
                )
        for (device, kind, params, dtype, timing, version), samples in groups.items():
            row = _row(device, kind, dict(params), dtype, timing, samples, rel)
            result.rows.append({**row, "backend": "nccl", "nccl_version": version})
    return result


# --------------------------------------------------------------------------- parsing


def _parse(path: Path) -> list[_Run]:
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise MalformedFile(path, None, f"cannot read: {err.strerror or err}") from None
    runs = [_Run()]
    in_table = False
    library = None
    lines = text.splitlines()
    last = max((i for i, raw in enumerate(lines, start=1) if raw.strip()), default=0)
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        run = runs[-1]
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").split()
            if library is None and (m := _NCCL_LIBRARY.search(line)) is not None:
                library = nccl_version_text(int(m.group(1)))
            if (m := _STARTING.match(line)) is not None:
                if run.started():
                    runs.append(run := _Run())
                run.binary = Path(m.group(1)).name
                in_table = False
            elif body[:1] == ["nThread"]:
                if run.nthread:
                    runs.append(run := _Run())
                run.nthread = True
                if (m := _ITERS.search(line)) is not None:
                    agg = _AGG_ITERS.search(line)
                    run.reps = int(m.group(1)) * (int(agg.group(1)) if agg else 1)
                in_table = False
            elif (m := _RANK.match(line)) is not None:
                if run.columns is not None:  # rank lines after a table: a new run without a header line
                    runs.append(run := _Run())
                run.ranks[int(m.group(1))] = (m.group(2), m.group(3), m.group(4), number)
            elif body[:3] == ["size", "count", "type"]:
                run.columns, run.header_line = _columns(path, number, body), number
                run.cputime = "cputime" in body
                in_table = True
            elif body[:2] in (["Out", "of"], ["Avg", "bus"]):
                if (m := _OUT_OF_BOUNDS.search(line)) is not None:
                    run.out_of_bounds = int(m.group(1))
                run.footer = True
                in_table = False
            continue
        tokens = line.split()
        if in_table and tokens[0].isdigit():
            try:
                run.lines.append(_data(path, number, tokens, run))
            except MalformedFile:
                if number != last or run.footer:
                    raise
                run.cut_line = number  # the file ends inside this line: a truncated log
    for run in runs:
        run.nccl_version = library
    return [run for run in runs if run.started()]


def nccl_version_text(code: int) -> str:
    """``NCCL_VERSION_CODE`` as ``major.minor.patch``: ``major*10000 + minor*100 + patch`` from
    NCCL 2.9 on (21805 -> 2.18.5), ``major*1000 + minor*100 + patch`` before (2708 -> 2.7.8)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _columns(path: Path, number: int, names: list[str]) -> list[str]:
    times = [i for i, name in enumerate(names) if name in ("time", "cputime")]
    if not times or names[times[0] + 1 : times[0] + 4][:2] != ["algbw", "busbw"] or len(names) < times[0] + 4:
        raise MalformedFile(path, number, f"unrecognised nccl-tests table header {' '.join(names)!r}")
    return names


def _data(path: Path, number: int, tokens: list[str], run: _Run) -> _Line:
    columns = run.columns or []
    expected = len(columns) + (1 if columns[-1] == "timestamp" else 0)  # the timestamp is 'date time'
    if len(tokens) != expected:
        raise MalformedFile(
            path, number, f"{len(tokens)} fields, the table header (line {run.header_line}) has {expected}"
        )
    times = [i for i, name in enumerate(columns) if name in ("time", "cputime")]
    first = times[0]

    def num(i: int, *, integer: bool = False) -> float:
        try:
            return int(tokens[i]) if integer else float(tokens[i])
        except ValueError:
            raise MalformedFile(path, number, f"column {columns[i]!r} is {tokens[i]!r}, not a number") from None

    wrong = False
    for start in times:
        if (
            start + 3 < len(columns)
            and columns[start + 3] in ("#wrong", "wrong")
            and tokens[start + 3] != "N/A"
            and num(start + 3) > 0
        ):
            wrong = True
    index = {name: i for i, name in enumerate(columns[:first])}
    for name in ("size", "count", "type"):
        if name not in index:
            raise MalformedFile(path, run.header_line, f"table header lacks the {name!r} column")
    time_us = num(first)
    if time_us <= 0:
        raise MalformedFile(path, number, f"time {tokens[first]!r} us is not positive")
    num(index["count"], integer=True)
    return _Line(
        number=number,
        size=int(num(index["size"], integer=True)),
        type=tokens[index["type"]],
        redop=tokens[index["redop"]] if "redop" in index else None,
        time_us=time_us,
        algbw=num(first + 1),
        busbw=num(first + 2),
        wrong=wrong,
    )


# --------------------------------------------------------------------------- conversion


def _binary(path: Path, run: _Run) -> str | None:
    """The nccl-tests binary that wrote ``run``: its starting line, else the file name."""
    if run.binary:
        name = re.sub(r"(\.exe|_mpi)$", "", run.binary)
        if name in BINARIES or name in UNSUPPORTED:
            return name
    label = re.sub(r"[_\-\s]", "", path.name.lower())
    for fragment, binary in _NAME_FRAGMENTS:
        if fragment in label:
            return binary
    return run.binary


def _topology(run: _Run, options: ReplayOptions) -> tuple[int, int, int] | str:
    groups = {group for group, *_ in run.ranks.values()}
    if len(groups) > 1 and options.world_size is None:
        return f"{len(groups)} communicator groups per run (-m / NCCL_TESTS_SPLIT); pass --world-size and --nodes"
    world = options.world_size or len(run.ranks) or None
    if world is None:
        return "world size unknown: no '#  Rank ...' lines; pass --world-size (and --nodes)"
    nodes, gpn = options.nodes, options.gpus_per_node
    if nodes is None and gpn is not None:
        nodes = world // gpn if world % gpn == 0 else None
        if nodes is None:
            return f"--gpus-per-node {gpn} does not divide world size {world}"
    if nodes is None:
        hosts = {host for _, host, _, _ in run.ranks.values()}
        if not hosts:
            return f"node count of {world} ranks unknown (no rank lines); pass --nodes"
        nodes = len(hosts)
    if gpn is None:
        if world % nodes:
            return f"world size {world} does not split evenly over {nodes} nodes; pass --gpus-per-node"
        gpn = world // nodes
    if world < 2:
        return "single-rank run (world size 1 measures no communication)"
    return world, nodes, gpn


def _device(path: Path, run: _Run, forced: str | None) -> str:
    if forced is not None:
        return forced
    names = {gpu: number for _, _, gpu, number in sorted(run.ranks.values(), key=lambda r: -r[3])}
    if not names:
        raise MalformedFile(path, None, "no '#  Rank ... device' lines name the GPU; pass --device")
    if len(names) > 1:
        raise MalformedFile(
            path, min(names.values()), f"ranks run on different GPUs ({', '.join(sorted(names))}); pass --device"
        )
    ((name, number),) = names.items()
    try:
        return get_device(name).name
    except OpcastError:
        raise MalformedFile(
            path,
            number,
            f"GPU {name!r} is not in the hardware catalog; pass --device with its catalog name (opcast hardware list)",
        ) from None


def _convert(
    path: Path,
    run: _Run,
    options: ReplayOptions,
    forced: str | None,
    groups: dict[tuple, list[tuple[float, int]]],
    skipped: Counter,
) -> None:
    if not run.lines:
        return
    binary = _binary(path, run)
    if binary is None:
        raise MalformedFile(
            path,
            run.lines[0].number,
            "cannot tell which nccl-tests binary wrote this table: no "
            "'# Collective test starting' line and the file name names none of "
            f"{', '.join(BINARIES)}; rename the file",
        )
    kind = BINARIES.get(binary)
    if kind is None:
        skipped[f"{binary}: no opcast collective for it"] += len(run.lines)
        return
    topology = _topology(run, options)
    if isinstance(topology, str):
        skipped[f"{kind}: {topology}"] += len(run.lines)
        return
    world, nodes, gpn = topology
    if run.out_of_bounds and "error" in (run.columns or []):
        skipped[f"{kind}: {run.out_of_bounds} out-of-bounds values in a run with the old 'error' column"] += len(
            run.lines
        )
        return
    device = _device(path, run, forced)
    factor = bus_factor(kind, world)
    timing = TIMING + (":cputime" if run.cputime else "")
    for line in run.lines:
        dtype = DTYPES.get(line.type)
        if line.wrong:
            skipped[f"{kind}: #wrong > 0 (nccl-tests data check failed)"] += 1
        elif dtype is None:
            skipped[f"{kind}: type {line.type} (opcast tracks float, half, bfloat16)"] += 1
        elif kind in REDUCTIONS and line.redop not in (None, "sum"):
            skipped[f"{kind}: redop {line.redop} (opcast models sum)"] += 1
        elif line.size == 0:
            skipped[f"{kind}: size 0"] += 1
        else:
            _check(path, line, kind, world, factor)
            params = (("bytes", line.size), ("world_size", world), ("nodes", nodes), ("gpus_per_node", gpn))
            groups[(device, kind, params, dtype, timing, run.nccl_version)].append((line.time_us / 1e6, run.reps or 1))


def _check(path: Path, line: _Line, kind: str, world: int, factor: float) -> None:
    """The file's algbw and busbw must agree with size/time and the collective's factor."""
    algbw = line.size / line.time_us / 1e3
    if abs(algbw - line.algbw) > 0.05 * line.algbw + 0.015:
        raise MalformedFile(path, line.number, f"algbw {line.algbw} GB/s disagrees with size/time = {algbw:.3f} GB/s")
    if line.algbw >= 1.0 and abs(line.busbw - line.algbw * factor) > 0.02 * line.busbw + 0.015:
        raise MalformedFile(
            path,
            line.number,
            f"busbw/algbw = {line.busbw / line.algbw:.3f} but {kind} over {world} ranks "
            f"has factor {factor:.3f}: wrong collective or world size (see --world-size)",
        )


def _row(
    device: str,
    kind: str,
    params: dict[str, Any],
    dtype: str,
    timing: str,
    samples: list[tuple[float, int]],
    source_file: str,
) -> dict[str, Any]:
    times = sorted(t for t, _ in samples)
    median = statistics.median(times)
    algbw = params["bytes"] / median / 1e9
    row: dict[str, Any] = {
        "device": device,
        "op": kind,
        **params,
        "dtype": dtype,
        "direction": "fwd",
        "tensor_cores": None,
        "time_s_median": median,
        "n_reps": sum(reps for _, reps in samples),
        "source_file": source_file,
        "timing_method": timing,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(kind, params["world_size"]),
    }
    if len(times) >= 3:
        cuts = statistics.quantiles(times, n=10, method="inclusive")
        row["time_s_p20"], row["time_s_p80"] = cuts[1], cuts[7]
    return row
