"""``opcast collect replay``: published measurements and traces, converted into opcast datasets.

Each source has a module here with ``replay(root: Path, options: ReplayOptions) ->
ReplayResult`` that reads the source in its upstream repository layout (or a single trace/log
file) and returns op rows; :func:`run_replay` validates them against the op registry, adds
provenance, drops duplicates and writes ``OUT/<source>.parquet`` (and ``OUT/<source>-runs.parquet``
for end-to-end runs), atomically.
"""

from __future__ import annotations

import hashlib
import importlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcast.collect.replay.common import ReplayResult
from opcast.errors import OpcastError
from opcast.paths import link_problem

SOURCES: dict[str, str] = {
    "neusight": "NeuSight (sitar-lab/NeuSight): FP32 kernel microbenchmarks on 5 GPUs and end-to-end runs",
    "vidur": "Vidur (microsoft/vidur): FP16 per-layer op profiles on A100/A40 and collective profiles",
    "estimate-train-time": "arXiv 2509.22832 artifact: FP16 Megatron operators on A100-SXM4-80GB and GH200, NCCL",
    "kineto": "a PyTorch profiler Chrome-trace JSON recorded with record_shapes=True",
    "nccl-tests": "the text output of nccl-tests (all_reduce_perf and friends)",
    "aiconfigurator": "NVIDIA AIConfigurator (aiconfigurator-core): bf16/fp8 GEMM, prefill/decode attention, NCCL on "
    "ten GPUs",
    "liger": "Liger-Kernel (linkedin/Liger-Kernel) benchmark data: one-pass Triton RMSNorm/LayerNorm/softmax against "
    "Hugging Face and torch native kernels, forward and backward, on A100 and H100",
    "aiter": "AMD aiter (ROCm/aiter) tuned GEMM tables: measured bf16/fp16/per-token fp8 GEMMs on MI300X and MI355X",
}
"""Source name -> what it is; the module is opcast.collect.replay.<name with _ for ->."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOptions:
    """Facts a source may not carry itself."""

    device: str | None = None
    """Catalog name of the device (kineto, nccl-tests), overriding what the file says."""
    world_size: int | None = None
    """Ranks of a collective run (nccl-tests)."""
    nodes: int | None = None
    """Nodes of a collective run (nccl-tests)."""
    gpus_per_node: int | None = None
    """Ranks per node of a collective run (nccl-tests)."""

    def __post_init__(self) -> None:
        # a count of 0 would read as "not given" (the log's own count), a negative one drop every row
        for flag, value in (
            ("--world-size", self.world_size),
            ("--nodes", self.nodes),
            ("--gpus-per-node", self.gpus_per_node),
        ):
            if value is not None and value < 1:
                raise OpcastError(f"{flag} {value} must be >= 1, or leave it out to read it from the log")
        if self.device is not None and not self.device.strip():  # read as "not given" before
            raise OpcastError("--device is empty; give a catalog GPU name (opcast hardware list) or leave it out")


@dataclass(kw_only=True, slots=True)
class ReplaySummary:
    """What a replay wrote."""

    source: str
    rows_read: int = 0
    rows_written: int = 0
    runs_written: int = 0
    files: int = 0
    skipped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)


def importer(source: str) -> Any:
    if source not in SOURCES:
        raise OpcastError(f"unknown replay source {source!r}; use one of {', '.join(SOURCES)}")
    return importlib.import_module(f"opcast.collect.replay.{source.replace('-', '_')}")


def check_replaceable(target: Path, run_id: str, path: Path) -> None:
    """A replay writes ``OUT/<source>.parquet`` (its runs file goes with it) over what is there only when
    that file holds the rows of this same input (``run_id``: a re-run); the rows of another input
    (a second nccl-tests log or kineto trace replayed into one folder), a file opcast cannot read
    or a folder there is a one-line :class:`OpcastError`, before anything is read or written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not target.exists() and not target.is_symlink():
        return
    try:
        ids = set(pq.read_table(target, columns=["run_id"]).column("run_id").to_pylist())
    except (pa.ArrowException, OSError, KeyError):
        ids = None
    if ids is not None and ids <= {run_id}:  # this input's rows (a re-run), or none
        return
    held = "the rows replayed from another input" if ids else "a file that is not a dataset replayed from this input"
    sub = target.parent / (path.resolve().name.split(".")[0] or target.stem)
    raise OpcastError(
        f"{target} already holds {held}, which this replay would replace; give another --out (a subfolder "
        f"such as {sub} works: a dataset folder is read with its subfolders) or move that file aside"
    )


def _nothing_found(source: str, path: Path, skipped: Counter) -> str:
    """The error of a replay that converted no row, with the most common reason rows were skipped."""
    if not skipped:
        return f"no {source} measurements found under {path}; is it the right folder? (opcast collect replay --help)"
    reason, count = skipped.most_common(1)[0]
    others = f" ({len(skipped) - 1} other reasons)" if len(skipped) > 1 else ""
    return (
        f"no {source} measurements converted from {path}: all {sum(skipped.values())} rows read were skipped, "
        f"{count} as '{reason[:300]}'{others}; correct that (the options or the input) or give the right folder"
    )


def run_replay(
    source: str, path: str | Path | None, out: str | Path, options: ReplayOptions = ReplayOptions()
) -> ReplaySummary:
    """Convert ``path`` (a source checkout, or a trace/log file) into ``out``. ``None`` reads a
    source's installed package (aiconfigurator); the other sources need a path."""
    import opcast
    from opcast.atomic import output_folder_problem
    from opcast.collect.replay.common import normalise
    from opcast.collect.replay.runs import write_runs
    from opcast.schema import write_parquet

    module = importer(source)
    if path is None:
        if not hasattr(module, "default_root"):
            raise OpcastError(
                f"give the {source} checkout (or file) to replay: opcast collect replay {source} PATH --out DIR"
            )
        path = module.default_root()
    path = Path(path)
    if not path.exists():
        raise OpcastError(
            f"{path} {link_problem(path) or 'does not exist'}; give the {source} checkout (or file) to replay"
        )
    run_id = f"replay-{source}-{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"
    out = Path(out)
    if problem := output_folder_problem("--out", out, holds=f"{source}.parquet is written into it"):
        raise OpcastError(problem)
    check_replaceable(out / f"{source}.parquet", run_id, path)  # before the work: nothing of another input is lost
    result: ReplayResult = module.replay(path, options)
    rows, skipped = normalise(result, source=source, run_id=run_id, opcast_version=opcast.__version__)
    summary = ReplaySummary(
        source=source,
        rows_read=len(result.rows),
        rows_written=len(rows),
        files=result.files,
        skipped=skipped,
        notes=result.notes,
    )
    if not rows and not result.runs:
        raise OpcastError(_nothing_found(source, path, skipped))
    if rows:
        summary.outputs.append(write_parquet(rows, out / f"{source}.parquet"))
    if result.runs:
        summary.outputs.append(write_runs(result.runs, out / f"{source}-runs.parquet"))
        summary.runs_written = len(result.runs)
    return summary
