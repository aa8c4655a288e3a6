"""`opcast predict serve` against a public, measured serving benchmark (issue 20's serving target:
p50/p90 TTFT and TPOT within 15 %).

Usage:  python benchmarks/serving_public.py [--csv PATH] [--seeds N] [--models DIR | --roofline]
                                            [--cold] [--group TEXT] [--markdown PATH]

The measured numbers are in ``benchmarks/serving_public.csv`` beside this script, one row per
published run, each with its source URL (pinned to a commit) and its configuration as published:
model, GPU, TP/PP, engine and version, server flags, dataset, prompts, request rate, and the
run's own throughput and latency percentiles. Only the percentiles the source publishes are
compared (the source used here prints median and P99, not P90: the P99 rows are shown for
information, the 15 % target applies to the medians).

Each row is simulated with the library behind ``opcast predict serve``
(:func:`opcast.predict.serve.deployment.predict_serve`):

- **arrivals**: Poisson at the row's rate, as vLLM's ``benchmark_serving.py`` draws them; rate
  ``inf`` (every request sent at once) is every arrival at time 0;
- **lengths**: ShareGPT-shaped (:func:`opcast.predict.serve.requests.sharegpt_lengths`: the
  lognormal shape and clips of ``--lengths sharegpt``) with the **means of the measured run**,
  derived from its own published throughputs: input = (total - output tokens/s) / requests/s,
  output = output tokens/s / requests/s, held by the lengths drawn after the clips
  (``means_after_clip``: the printed totals are of the requests the benchmark kept after its own
  1,024 / 2,048-token filter). ``--lengths sharegpt`` alone uses the vLLM paper's means
  (161 in, 338 out), which differ from what this benchmark replayed (about 213 in, 213 out with
  Llama-3's tokenizer and EOS-stopped outputs);
- **prefix cache** (column ``prefix_cache``): the runs were made one after another on one server
  (rates 1, 4, 16, inf) replaying the same 200 prompts, and vLLM V1 caches prefixes by default, so
  every run after the first found its prompts' KV cached (the rate-inf run's median TTFT, 350 ms
  for 200 prompts of about 213 tokens sent at once, is some 7x less than prefilling them on these
  GPUs could take). A ``warm`` row is simulated with every prompt in the prefix cache
  (``opcast predict serve --prefix-cache-hit 1``,
  :func:`opcast.predict.serve.requests.with_prefix_cache`: vLLM V1's full hit, whole 16-token
  blocks and never the last token, so each prompt recomputes its last 1-16 tokens, whose attention
  spans the whole prompt, and holds the KV of its whole prompt). ``--cold`` simulates every row
  without hits;
- **engine**: ``--engine vllm`` with its defaults on the GPU, overridden by the row's
  ``max_num_seqs`` and ``max_num_batched_tokens`` where given: the values the run's vLLM version
  took by default (the csv cites them; vLLM's defaults changed between versions, and
  ``engine_defaults`` follows the current one);
- **seeds**: the measured run replayed one fixed sample of 200 prompts; the simulation draws
  ``--seeds`` samples (seeds 0..N-1, the same lengths at every rate for a seed, as the benchmark
  reuses its prompts) and reports the median of each percentile over them, with their range.

**Groups** (column ``group``): each source's rows get their own table and summary. The gpt-oss rows
(GPUStack's performance lab, ``vllm serve`` with its defaults on one GPU, ``vllm bench serve`` sending
every request at once) differ from the Llama rows in three ways the csv states per row:

- ``lengths`` ``fixed``: a ``random`` dataset (``--random-input-len`` / ``--random-output-len``, range
  ratio 0) gives every prompt the same length, and outputs stop at ``max_tokens`` or EOS. Each request
  is simulated with the run's mean lengths (rounded), the mean output being the published total over
  the requests: where some stopped at EOS (total below num_prompts x max_tokens) the spread of the
  stops is not published, so the total is kept and the spread is not;
- ``input_tokens_total`` / ``output_tokens_total``: the printed totals, from which the means are taken
  exactly (the throughputs are rounded to 2 decimals, 0.5 % at 0.50 req/s);
- ``ttft_mean_ms`` / ``tpot_mean_ms`` and the total token throughput (``total_tok_per_s``, compared as
  simulated input plus output tokens over the span from the first arrival to the last finish) are
  shown beside the medians; the 15 % target stays on the medians.

Printed: measured vs predicted per row and metric, the error in % and whether it is within 15 %.
``--markdown`` writes the same tables as Markdown (atomically).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.deployment import predict_serve
from opcast.predict.serve.engine import EngineConfig, engine_config
from opcast.predict.serve.requests import (
    Lengths,
    RequestStream,
    poisson_stream,
    sharegpt_lengths,
    with_prefix_cache,
)

CSV_PATH = Path(__file__).with_name("serving_public.csv")
TARGET = 0.15
"""Issue 20: p50/p90 TTFT and TPOT within 15 %."""
TARGET_STATS = ("p50", "p90")
METRICS = (("ttft", "p50"), ("tpot", "p50"), ("ttft", "p99"), ("tpot", "p99"), ("ttft", "mean"), ("tpot", "mean"))
"""(latency, statistic) pairs a row may publish, as columns ``<latency>_<statistic>_ms``."""
THROUGHPUT = "total tok/s"
"""The throughput compared: (input + output tokens) / duration, ``total_tok_per_s``."""
LENGTHS = ("sharegpt", "fixed")
"""Column ``lengths``: ShareGPT-shaped lognormals (the default) or every request at the run's mean lengths."""
REQUIRED = (
    "run",
    "source_url",
    "arch",
    "gpu",
    "tp",
    "pp",
    "engine",
    "num_prompts",
    "rate_per_s",
    "req_per_s",
    "output_tok_per_s",
    "total_tok_per_s",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Published:
    """One published run: what was served, how, and what was measured."""

    run: str
    source_url: str
    arch: str
    gpu: str
    tp: int
    pp: int
    engine: str
    num_prompts: int
    rate_per_s: float
    """Poisson rate of the client, requests/s; ``inf``: every request at once."""
    warm_prefix_cache: bool
    """The run found its prompts' KV in vLLM's prefix cache (see the module docstring)."""
    requests_per_s: float
    """Measured request throughput."""
    mean_input_tokens: float
    mean_output_tokens: float
    measured_ms: dict[tuple[str, str], float]
    """(latency, statistic) -> milliseconds, for the statistics the source publishes."""
    total_tokens_per_s: float
    """Measured total token throughput, input and output tokens."""
    group: str = ""
    """The table the row is shown in (its source and setup)."""
    lengths: str = "sharegpt"
    """:data:`LENGTHS`: how the requests' lengths are drawn around the measured means."""
    token_totals: bool = False
    """The row gives its printed token totals: its means come from them, and its throughput is compared."""
    engine_overrides: dict[str, int] = dataclasses.field(default_factory=dict)
    """Engine settings the run had (``max_num_seqs``, ``max_num_batched_tokens``) where the row gives them."""
    engine_version: str | None = None
    """The engine's release the csv's ``engine_version`` names ("vLLM v0.10.2 ..." -> ``0.10.2``), which picks
    its kernels where they depend on it (``InferConfig.engine_version``)."""


ENGINE_COLUMNS = ("max_num_seqs", "max_num_batched_tokens")
"""Optional columns: the run's scheduler limits, passed to the engine over its defaults."""


def published(row: dict[str, str]) -> Published:
    """A CSV row as a :class:`Published` run; its mean lengths from its own throughputs."""
    missing = [c for c in REQUIRED if not (row.get(c) or "").strip()]
    if missing:
        raise SystemExit(f"{CSV_PATH.name}: run {row.get('run')!r} lacks {', '.join(missing)}")
    req_s, out_s, total_s = (float(row[c]) for c in ("req_per_s", "output_tok_per_s", "total_tok_per_s"))
    measured = {(lat, st): float(row[f"{lat}_{st}_ms"]) for lat, st in METRICS if (row.get(f"{lat}_{st}_ms") or "")}
    lengths = (row.get("lengths") or "sharegpt").strip()
    if lengths not in LENGTHS:
        raise SystemExit(
            f"{CSV_PATH.name}: run {row['run']!r} has lengths {lengths!r}; give one of {', '.join(LENGTHS)}"
        )
    mean_in, mean_out = (total_s - out_s) / req_s, out_s / req_s
    totals = all((row.get(c) or "").strip() for c in ("input_tokens_total", "output_tokens_total"))
    if totals:
        n = int(row["num_prompts"])
        mean_in, mean_out = _count(row, "input_tokens_total") / n, _count(row, "output_tokens_total") / n
    return Published(
        run=row["run"],
        source_url=row["source_url"],
        arch=row["arch"],
        gpu=row["gpu"],
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        engine=row["engine"],
        num_prompts=int(row["num_prompts"]),
        rate_per_s=float(row["rate_per_s"]),
        warm_prefix_cache=row.get("prefix_cache", "cold").strip() == "warm",
        requests_per_s=req_s,
        mean_input_tokens=mean_in,
        mean_output_tokens=mean_out,
        measured_ms=measured,
        total_tokens_per_s=total_s,
        group=(row.get("group") or "").strip(),
        lengths=lengths,
        token_totals=totals,
        engine_overrides={c: _count(row, c) for c in ENGINE_COLUMNS if (row.get(c) or "").strip()},
        engine_version=_release(row),
    )


def _release(row: dict[str, str]) -> str | None:
    """The release in the csv's ``engine_version`` text ("vLLM v0.10.2 (server ...)" -> ``0.10.2``), or None."""
    found = re.search(r"\bv?(\d+\.\d+(?:\.\d+)?)\b", row.get("engine_version") or "")
    return found.group(1) if found else None


def _count(row: dict[str, str], column: str) -> int:
    text = row[column].strip()
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"{CSV_PATH.name}: run {row.get('run')!r} has {column} {text!r}; give a whole number >= 1")
    return int(text)


def read_published(path: Path = CSV_PATH) -> list[Published]:
    with open(path, newline="", encoding="utf-8") as f:
        return [published(r) for r in csv.DictReader(f)]


def lengths_for(run: Published) -> tuple[Lengths, Lengths]:
    """(input, output) lengths of the run's requests: ShareGPT-shaped with its measured means, or
    (``fixed``) every request at its mean lengths, rounded."""
    if run.lengths == "fixed":
        n_in, n_out = (max(1, round(m)) for m in (run.mean_input_tokens, run.mean_output_tokens))
        return Lengths("fixed", n_in, n_in), Lengths("fixed", n_out, n_out)
    return sharegpt_lengths(run.mean_input_tokens, run.mean_output_tokens, means_after_clip=True)


def stream_for(run: Published, seed: int, *, block_size: int = 16, cold: bool = False) -> RequestStream:
    """The run's requests: Poisson at its rate (or all at time 0 at rate ``inf``), lengths of
    :func:`lengths_for`; the lengths depend on ``seed`` only, not on the rate. A run with
    a warm prefix cache (unless ``cold``) finds every prompt cached, in whole KV blocks of ``block_size``
    (the engine's) and never the last token (vLLM's full hit)."""
    input_len, output_len = lengths_for(run)
    burst = math.isinf(run.rate_per_s)
    stream = poisson_stream(
        rate_per_s=1.0 if burst else run.rate_per_s,
        num_requests=run.num_prompts,
        input_len=input_len,
        output_len=output_len,
        seed=seed,
    )
    if burst:
        stream = dataclasses.replace(
            stream, arrival_s=np.zeros(len(stream)), source=f"all {len(stream)} at once, seed {seed}"
        )
    if run.warm_prefix_cache and not cold:
        stream = with_prefix_cache(stream, 1.0, block_size)
    return stream


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    ms: dict[tuple[str, str], list[float]]
    """(latency, statistic) -> the prediction of each seed, milliseconds."""
    requests_per_s: list[float]
    total_tokens_per_s: list[float]
    """Input and output tokens over the span from the first arrival to the last finish, per seed."""
    mean_input_tokens: float
    mean_output_tokens: float
    """Of the simulated streams (after the clips), over every seed."""


def engine_for(run: Published, device) -> EngineConfig:
    """The engine the run had: ``run.engine``'s defaults on ``device`` with the row's settings over them."""
    return engine_config(run.engine, device, **run.engine_overrides)


def predict_run(run: Published, *, seeds: int, kernels, cold: bool = False) -> Predicted:
    arch, dev = load_arch(run.arch), get_device(run.gpu)
    cfg, engine = InferConfig(tp=run.tp, pp=run.pp, engine_version=run.engine_version), engine_for(run, dev)
    ms: dict[tuple[str, str], list[float]] = {key: [] for key in run.measured_ms}
    rps, tps, ins, outs = [], [], [], []
    for seed in range(seeds if run.lengths != "fixed" or not math.isinf(run.rate_per_s) else 1):
        stream = stream_for(run, seed, block_size=engine.block_size, cold=cold)
        m = predict_serve(arch, dev, cfg, engine, stream, kernels=kernels).metrics
        for lat, st in ms:
            ms[(lat, st)].append(1e3 * getattr(getattr(m, lat), f"{st}_s"))
        rps.append(m.requests_per_s)
        tps.append(float(stream.input_tokens.sum() + stream.output_tokens.sum()) / m.duration_s)
        ins.append(float(stream.input_tokens.mean()))
        outs.append(float(stream.output_tokens.mean()))
    return Predicted(
        ms=ms,
        requests_per_s=rps,
        total_tokens_per_s=tps,
        mean_input_tokens=statistics.mean(ins),
        mean_output_tokens=statistics.mean(outs),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    run: str
    metric: str
    """``TTFT p50``, ``TPOT mean``, ... (milliseconds) or :data:`THROUGHPUT` (tokens/s)."""
    measured: float
    predicted: float
    """Median over the seeds."""
    lo: float
    hi: float
    """Range over the seeds."""

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def targeted(self) -> bool:
        return self.metric.split()[-1] in TARGET_STATS

    @property
    def within(self) -> bool:
        return abs(self.error) <= TARGET


def compare(run: Published, pred: Predicted) -> list[Comparison]:
    """The row's latencies (ms) in :data:`METRICS` order, then, for a row that gives its token totals
    (the gpt-oss rows), its total token throughput."""
    rows = [
        Comparison(
            run=run.run,
            metric=f"{lat.upper()} {st}",
            measured=run.measured_ms[(lat, st)],
            predicted=statistics.median(pred.ms[(lat, st)]),
            lo=min(pred.ms[(lat, st)]),
            hi=max(pred.ms[(lat, st)]),
        )
        for lat, st in METRICS
        if (lat, st) in run.measured_ms
    ]
    if run.token_totals:
        tps = pred.total_tokens_per_s
        rows.append(
            Comparison(
                run=run.run,
                metric=THROUGHPUT,
                measured=run.total_tokens_per_s,
                predicted=statistics.median(tps),
                lo=min(tps),
                hi=max(tps),
            )
        )
    return rows


def markdown_table(rows: list[Comparison]) -> str:
    head = "| run | metric | measured | predicted (median) | range over seeds | error | within 15 % |"
    lines = [head, "|---|---|---:|---:|---:|---:|---|"]
    for c in rows:
        verdict = ("yes" if c.within else "**no**") if c.targeted else "(not a target)"
        lines.append(
            f"| {c.run} | {c.metric} | {c.measured:.1f} | {c.predicted:.1f} | "
            f"{c.lo:.1f}-{c.hi:.1f} | {100 * c.error:+.1f} % | {verdict} |"
        )
    return "\n".join(lines)


def group_summary(rows: list[Comparison], seeds: int) -> str:
    targeted = [c for c in rows if c.targeted]
    text = f"{sum(c.within for c in targeted)} of {len(targeted)} targeted percentiles within 15 %; "
    text += f"mean |error| {100 * statistics.mean(abs(c.error) for c in targeted):.1f} % ({seeds} seeds per run"
    if any(c.metric == THROUGHPUT for c in rows):
        text += "; one where a run's stream does not depend on the seed"
    return text + ")"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--cold", action="store_true", help="simulate every run without prefix-cache hits")
    ap.add_argument("--group", default="", help="only the runs whose group contains this text, e.g. gpt-oss")
    ap.add_argument("--markdown", type=Path, default=None)
    a = ap.parse_args(argv)
    runs = [r for r in read_published(a.csv) if a.group in r.group]
    if not runs:
        print(f"error: --group {a.group!r}: no run's group contains it", file=sys.stderr)
        return 2
    kernels = load_kernel_cost(a.models, use_learned=not a.roofline)
    t0 = time.perf_counter()
    groups: dict[str, list[Comparison]] = {}
    notes = []
    for run in runs:
        pred = predict_run(run, seeds=a.seeds, kernels=kernels, cold=a.cold)
        groups.setdefault(run.group, []).extend(compare(run, pred))
        eng = engine_for(run, get_device(run.gpu))
        notes.append(
            f"{run.run}: {run.arch}, {run.tp}x{run.gpu} (pp {run.pp}), {run.engine} (max {eng.max_num_seqs} seqs, "
            f"{eng.max_num_batched_tokens} batched tokens), rate {run.rate_per_s:g}/s, "
            f"{run.num_prompts} prompts, prefix cache {'warm' if run.warm_prefix_cache and not a.cold else 'cold'}; "
            f"{run.lengths} lengths, mean tokens in/out measured {run.mean_input_tokens:.0f}/"
            f"{run.mean_output_tokens:.0f}, simulated {pred.mean_input_tokens:.0f}/{pred.mean_output_tokens:.0f}; "
            f"requests/s measured {run.requests_per_s:.2f}, simulated {statistics.median(pred.requests_per_s):.2f}"
        )
    text = "\n\n".join(
        f"### {name or 'runs'}\n\n{markdown_table(rows)}\n\n{group_summary(rows, a.seeds)}"
        for name, rows in groups.items()
    )
    print(text)
    print()
    print("\n".join(notes))
    print(f"{time.perf_counter() - t0:.1f} s")
    if a.markdown is not None:
        from opcast.atomic import write_atomically

        write_atomically(a.markdown, lambda tmp: tmp.write_text(text + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
