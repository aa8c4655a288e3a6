"""The request stream of a serving simulation: when each request arrives and how many tokens it
brings and asks for.

- **Arrivals**: a Poisson process at ``rate`` requests/s (exponential gaps from a seeded numpy
  ``Generator``), the first request at the first gap; the times of a trace file; or a **closed loop**
  of ``concurrency`` clients (:func:`closed_loop_stream`, a benchmark client with a concurrency limit
  and no rate limit: vLLM's ``benchmark_serving.py --max-concurrency N --request-rate inf``,
  ``aiperf``/``genai-perf --concurrency N``): N requests arrive at t = 0 and each further one when
  an earlier one finishes, so its arrival is known only as the simulation runs.
- **Lengths**: fixed, uniform integers in ``[lo, hi]``, or :data:`SHAREGPT`, a lognormal fit
  of the ShareGPT conversations that vLLM's serving benchmark replays.
- **Trace file**: CSV (a header row) or JSONL (one object per line) with ``arrival_s``,
  ``input_tokens`` and ``output_tokens``, and optionally ``cached_tokens``; every row is checked and
  a bad one is refused in one line that names it. Rows are sorted by arrival; nothing in the file
  is executed.
- **Prefix cache**: ``cached_tokens`` of a request are the first tokens of its prompt whose KV the
  engine already holds when it arrives (an automatic prefix cache hit: vLLM V1's default, SGLang's
  radix cache); the engine computes only the rest, at least the prompt's last token. From a trace
  column, or for every request at once by :func:`with_prefix_cache` (``--prefix-cache-hit``).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from opcast.errors import OpcastError
from opcast.ops import INT_PARAM_LIMIT, whole_number

TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
"""The columns (CSV) or keys (JSONL) every row of a trace file has."""
CACHED_COLUMN = "cached_tokens"
"""An optional column (key) of a trace file: the prompt tokens already in the prefix cache, 0 <= cached < input."""
MAX_ARRIVAL_S = 1e9
"""The latest arrival a simulation takes (about 32 years): its clock is float64 seconds, whose spacing at
1e9 s is 1.2e-7 s; much later, a decode step of milliseconds no longer moves the clock (at 1e30 s a
request's TPOT came out 0)."""
MAX_TRACE_BYTES = 256 * 2**20
"""The largest trace file read (about four million requests): past it the reader stops, so /dev/zero or a
stray dataset is refused instead of read until memory runs out (--trace-file /dev/zero held 9 GB in 20 s)."""
MAX_REQUESTS = 10_000_000
"""The most requests one simulation draws (``--num-requests``): a million take ~100 s and 0.4 GB on one core
of the 2-core development machine, ten million about 17 minutes and 4 GB; --num-requests 1e8 held 11.8 GB after
60 s and would have run for hours. Percentiles settle long before (a 10,000-request run answers in seconds)."""
TOKEN_LIMIT = INT_PARAM_LIMIT
"""Token counts of a request (from an option or a trace file) stay below this: they are int64 arrays."""


@dataclass(frozen=True, slots=True)
class RequestStream:
    """Requests in arrival order (numpy arrays of one length)."""

    arrival_s: np.ndarray
    """Arrival time of each request, seconds from the start, non-decreasing."""
    input_tokens: np.ndarray
    """Prompt tokens of each request (>= 1)."""
    output_tokens: np.ndarray
    """Tokens each request generates (>= 1; the first comes out of its prefill)."""
    source: str
    """Where the stream comes from, in words (for the report)."""
    cached_tokens: np.ndarray | None = None
    """Prompt tokens of each request whose KV is in the prefix cache when it arrives (0 <= cached <
    input: the engine computes at least the last prompt token); None: no hits."""
    concurrency: int | None = None
    """A closed loop of this many clients: requests ``[0, concurrency)`` arrive at their ``arrival_s``,
    each later one (in order) when the client sees an earlier one finish; their ``arrival_s`` are NaN
    until :func:`~opcast.predict.serve.simulate.simulate` sets them. None: every arrival is given."""

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def max_tokens(self) -> int:
        """The longest request, prompt plus output: the largest KV footprint of one sequence."""
        return int((self.input_tokens + self.output_tokens).max())


@dataclass(frozen=True, slots=True)
class Lengths:
    """A length distribution: ``fixed`` (``lo``), ``uniform`` integers in ``[lo, hi]``, or
    ``lognormal`` (``mu``, ``sigma`` of log tokens, rounded and clipped to ``[lo, hi]``)."""

    kind: str
    lo: int
    hi: int
    mu: float = 0.0
    sigma: float = 0.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.lo, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)
        if self.kind == "lognormal":
            x = np.rint(rng.lognormal(self.mu, self.sigma, size=n))
            return np.clip(x, self.lo, self.hi).astype(np.int64)
        raise AssertionError(f"unknown length kind {self.kind}")


def _lognormal_with_mean(mean: float, sigma: float, hi: int) -> Lengths:
    """The lognormal of log-spread ``sigma`` whose (unclipped) mean is ``mean``: mu = ln(mean) - sigma^2/2."""
    return Lengths("lognormal", 1, hi, mu=math.log(mean) - sigma**2 / 2, sigma=sigma)


SHAREGPT_MEAN_INPUT_TOKENS = 161.31
SHAREGPT_MEAN_OUTPUT_TOKENS = 337.99
"""Mean prompt and output lengths of the ShareGPT conversations (Kwon et al. 2023, "Efficient Memory
Management for Large Language Model Serving with PagedAttention", SOSP, arXiv 2309.06180, Sec. 6.1
and Fig. 11a)."""
SHAREGPT_SIGMA = (1.0, 0.9)
"""Log-spread of input and output lengths: our estimate (the paper shows the histograms, not a fit)
of their long right tails; the means above are the paper's."""
SHAREGPT_MAX_TOKENS = 2048
"""Clip: vLLM's benchmark drops ShareGPT pairs beyond 1,024 prompt / 2,048 total tokens."""


def _clipped_mean(mu: float, sigma: float, hi: int) -> float:
    """The mean of ``clip(rint(X), 1, hi)`` for ``X`` lognormal(``mu``, ``sigma``) (what :meth:`Lengths.draw`
    returns), summed exactly over the integers 1..hi."""
    cdf = [0.5 * (1 + math.erf((math.log(k + 0.5) - mu) / (sigma * math.sqrt(2)))) for k in range(1, hi)]
    # P(value <= k) = cdf[k - 1] for k < hi; the value is hi with the rest: mean = sum_{k=0}^{hi-1} P(value > k)
    return 1 + sum(1 - c for c in cdf)


@functools.lru_cache(maxsize=64)
def _lognormal_with_clipped_mean(mean: float, sigma: float, hi: int, name: str) -> Lengths:
    """The lognormal of log-spread ``sigma`` whose draws, rounded and clipped to ``[1, hi]``, have mean
    ``mean`` (bisection on mu: the clipped mean grows with mu)."""
    if not mean < hi:
        raise OpcastError(
            f"mean {name} tokens {mean} must be below the clip {hi} to hold after it; give a smaller mean"
        )
    lo_mu, hi_mu = math.log(mean) - sigma**2 / 2 - 1, math.log(hi) + 4 * sigma
    while _clipped_mean(hi_mu, sigma, hi) < mean:  # pragma: no cover - mean < hi is reached as mu grows
        hi_mu += 4 * sigma
    for _ in range(60):
        mid = (lo_mu + hi_mu) / 2
        lo_mu, hi_mu = (mid, hi_mu) if _clipped_mean(mid, sigma, hi) < mean else (lo_mu, mid)
    return Lengths("lognormal", 1, hi, mu=(lo_mu + hi_mu) / 2, sigma=sigma)


def sharegpt_lengths(
    mean_input_tokens: float, mean_output_tokens: float, *, means_after_clip: bool = False
) -> tuple[Lengths, Lengths]:
    """(input, output) length distributions of ShareGPT's shape (:data:`SHAREGPT_SIGMA`, the clips of
    :data:`SHAREGPT_MAX_TOKENS`) with the given means: for a run whose benchmark printed its own totals
    (vLLM's ``Total input tokens`` and ``Total generated tokens`` over its requests, which depend on the
    tokenizer, the prompts sampled and where the model stopped). The means are of the lognormals before
    the clips, or with ``means_after_clip`` of the lengths drawn (after rounding and the clips): a
    benchmark's printed totals are of the requests it kept, so they are means after its filter."""
    for name, mean in (("input", mean_input_tokens), ("output", mean_output_tokens)):
        if not (math.isfinite(mean) and mean >= 1):
            raise OpcastError(f"mean {name} tokens {mean} must be a finite number >= 1, e.g. 200")
    clips = (1024, SHAREGPT_MAX_TOKENS - 1024)
    if means_after_clip:
        return tuple(  # type: ignore[return-value]
            _lognormal_with_clipped_mean(mean, sigma, hi, name)
            for mean, sigma, hi, name in zip(
                (mean_input_tokens, mean_output_tokens), SHAREGPT_SIGMA, clips, ("input", "output")
            )
        )
    return (
        _lognormal_with_mean(mean_input_tokens, SHAREGPT_SIGMA[0], clips[0]),
        _lognormal_with_mean(mean_output_tokens, SHAREGPT_SIGMA[1], clips[1]),
    )


SHAREGPT = sharegpt_lengths(SHAREGPT_MEAN_INPUT_TOKENS, SHAREGPT_MEAN_OUTPUT_TOKENS)
"""(input, output) length distributions like ShareGPT's (see the constants above)."""


def parse_lengths(text: str, flag: str) -> Lengths:
    """``N`` (fixed) or ``LO:HI`` (uniform integers in [LO, HI]), each >= 1."""
    parts = [whole_number(p) for p in text.split(":")]
    if len(parts) in (1, 2) and None not in parts:
        lo, hi = parts[0] or 0, parts[-1] or 0
        if hi >= TOKEN_LIMIT:
            raise OpcastError(f"{flag} {text!r} is too large: give token counts below 2**63")
        if lo >= 1 and hi >= lo:
            return Lengths("fixed" if len(parts) == 1 else "uniform", lo, hi)
    raise OpcastError(f"{flag} {text!r}: give tokens N or a uniform range LO:HI, 1 <= LO <= HI, e.g. 512 or 128:1024")


def poisson_stream(
    *, rate_per_s: float, num_requests: int, input_len: Lengths, output_len: Lengths, seed: int
) -> RequestStream:
    """``num_requests`` Poisson arrivals at ``rate_per_s`` with lengths drawn from the two
    distributions, all from one ``numpy.random.default_rng(seed)`` (the same seed, the same stream)."""
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise OpcastError(f"--rate {rate_per_s} must be a finite number of requests/s > 0, e.g. 4")
    if num_requests < 1:
        raise OpcastError(f"--num-requests {num_requests} must be >= 1")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=num_requests))
    if arrivals[-1] > MAX_ARRIVAL_S:
        raise OpcastError(
            f"--rate {rate_per_s:g} spreads {num_requests} requests over {arrivals[-1]:.3g} s, past the "
            f"{MAX_ARRIVAL_S:.0e} s the simulated clock resolves to a microsecond; give --rate >= "
            f"{2 * num_requests / MAX_ARRIVAL_S:.2g} req/s"
        )
    return RequestStream(
        arrival_s=arrivals,
        input_tokens=input_len.draw(rng, num_requests),
        output_tokens=output_len.draw(rng, num_requests),
        source=f"Poisson {rate_per_s:g} req/s, seed {seed}",
    )


def closed_loop_stream(
    *, concurrency: int, num_requests: int, input_len: Lengths, output_len: Lengths, seed: int
) -> RequestStream:
    """``num_requests`` requests from ``concurrency`` clients in a closed loop (see the module docstring), the
    first ``concurrency`` at t = 0, lengths drawn as :func:`poisson_stream` draws them (one
    ``numpy.random.default_rng(seed)``)."""
    if concurrency < 1:
        raise OpcastError(f"--concurrency {concurrency} must be >= 1 requests in flight, e.g. 32")
    if num_requests < 1:
        raise OpcastError(f"--num-requests {num_requests} must be >= 1")
    rng = np.random.default_rng(seed)
    arrivals = np.full(num_requests, np.nan)
    arrivals[:concurrency] = 0.0
    return RequestStream(
        arrival_s=arrivals,
        input_tokens=input_len.draw(rng, num_requests),
        output_tokens=output_len.draw(rng, num_requests),
        source=f"closed loop, {concurrency} in flight, seed {seed}",
        concurrency=concurrency,
    )


def with_prefix_cache(stream: RequestStream, fraction: float, block_size: int) -> RequestStream:
    """``stream`` with each prompt's first ``fraction`` found in the prefix cache, in whole KV blocks of
    ``block_size`` and never the whole prompt (:func:`opcast.predict.serve.kv_cache.prefix_hit_tokens`,
    vLLM's rule); ``fraction`` 1: every prompt was served before (a benchmark replaying its prompts)."""
    from opcast.predict.serve.kv_cache import prefix_hit_tokens

    if stream.cached_tokens is not None:
        raise OpcastError(
            f"the requests already carry {CACHED_COLUMN} (a trace column); give either that column or "
            "--prefix-cache-hit, not both"
        )
    hits = prefix_hit_tokens(stream.input_tokens, fraction, block_size)
    return replace(
        stream,
        source=f"{stream.source}, prefix cache hits {100 * fraction:g} % of each prompt ({block_size}-token blocks)",
        cached_tokens=hits,
    )


def read_trace(path: Path) -> RequestStream:
    """A trace file (see the module docstring), sorted by arrival."""
    from opcast.hardware import read_capped

    try:
        raw = read_capped(Path(path), MAX_TRACE_BYTES, "a trace file (CSV or JSONL)")
        if len(raw) > MAX_TRACE_BYTES:
            raise OpcastError(
                f"the trace file {path} is larger than {MAX_TRACE_BYTES // 2**20} MiB (millions of requests, or not "
                "a trace: a device or a stream?); give a shorter trace"
            )
        text = raw.decode("utf-8-sig")  # a byte-order mark (Excel's UTF-8 CSV) is no text
    except (OSError, UnicodeDecodeError) as err:
        raise OpcastError(f"cannot read the trace file {path}: {err}; give a readable CSV or JSONL file") from None
    rows = _jsonl_rows(text, path) if Path(path).suffix.lower() in (".jsonl", ".json") else _csv_rows(text, path)
    if not rows:
        raise OpcastError(f"trace file {path} has no requests; give rows of {', '.join(TRACE_COLUMNS)}")
    arr = np.array(rows, dtype=np.float64)
    if arr[:, 0].max() > MAX_ARRIVAL_S:
        raise OpcastError(
            f"trace file {path}: arrival_s reaches {arr[:, 0].max():.6g} s, past the {MAX_ARRIVAL_S:.0e} s the "
            "simulated clock resolves to a microsecond; give seconds from the trace's start (subtract the first "
            "arrival, e.g. from epoch timestamps)"
        )
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    inputs, cached = arr[:, 1].astype(np.int64), arr[:, 3].astype(np.int64)
    share = 100 * cached.sum(dtype=np.float64) / inputs.sum(dtype=np.float64)  # int64 sums of long prompts overflow
    hits = f", {share:.0f} % of prompt tokens in the prefix cache" if cached.any() else ""
    return RequestStream(
        arrival_s=arr[:, 0],
        input_tokens=inputs,
        output_tokens=arr[:, 2].astype(np.int64),
        source=f"trace {Path(path).name} ({len(arr)} requests{hits})",
        cached_tokens=cached if cached.any() else None,
    )


def _row(values: dict, where: str, path: Path) -> tuple[float, int, int, int]:
    missing = [c for c in TRACE_COLUMNS if c not in values or values[c] in (None, "")]
    if missing:
        need = ", ".join(TRACE_COLUMNS)
        raise OpcastError(f"trace file {path}, {where}: missing {', '.join(missing)}; every row needs {need}")
    try:
        arrival = float(values["arrival_s"])
        tokens = [float(values[c]) for c in TRACE_COLUMNS[1:]]
    except (TypeError, ValueError):
        shown = ", ".join(f"{c}={values[c]!r}" for c in TRACE_COLUMNS)
        raise OpcastError(f"trace file {path}, {where}: {shown}: give numbers") from None
    if isinstance(values["arrival_s"], bool) or not (math.isfinite(arrival) and arrival >= 0):
        raise OpcastError(f"trace file {path}, {where}: arrival_s {values['arrival_s']!r} must be a finite time >= 0 s")
    for c, v in zip(TRACE_COLUMNS[1:], tokens):
        if isinstance(values[c], bool) or not (math.isfinite(v) and v >= 1 and v == int(v)):
            raise OpcastError(f"trace file {path}, {where}: {c} {values[c]!r} must be a whole number of tokens >= 1")
        if v >= TOKEN_LIMIT:
            too = "is too large: give token counts below 2**63"
            raise OpcastError(f"trace file {path}, {where}: {c} {values[c]!r} {too}")
    raw = values.get(CACHED_COLUMN)
    cached = 0
    if raw not in (None, ""):
        try:
            hit = math.nan if isinstance(raw, bool) else float(raw)
        except (TypeError, ValueError):
            hit = math.nan
        if not (math.isfinite(hit) and hit == int(hit) and 0 <= hit < tokens[0]):
            raise OpcastError(
                f"trace file {path}, {where}: {CACHED_COLUMN} {raw!r} must be a whole number of tokens from 0 to "
                f"input_tokens - 1 = {int(tokens[0]) - 1} (the engine computes at least the prompt's last token)"
            )
        cached = int(hit)
    return arrival, int(tokens[0]), int(tokens[1]), cached


def _csv_rows(text: str, path: Path) -> list[tuple[float, int, int, int]]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    if set(TRACE_COLUMNS) - set(header):
        raise OpcastError(
            f"trace file {path}: the header {','.join(header) or '(none)'} lacks "
            f"{', '.join(c for c in TRACE_COLUMNS if c not in header)}; make its first line {','.join(TRACE_COLUMNS)}"
        )
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:  # DictReader kept the last of them, silently
        raise OpcastError(f"trace file {path}: the header names {', '.join(twice)} more than once; name each once")
    rows = []
    for r in reader:
        where = f"line {reader.line_num}"  # of the file: DictReader skips blank lines
        if None in r:  # cells past the header's columns, which DictReader set aside
            raise OpcastError(
                f"trace file {path}, {where}: {len(header) + len(r[None])} cells, the header has {len(header)} "
                "columns; quote cells that hold a comma or name every column in the header"
            )
        rows.append(_row(r, where, path))
    return rows


def _jsonl_rows(text: str, path: Path) -> list[tuple[float, int, int, int]]:
    from opcast.hardware import DuplicateKey, unique_keys

    rows = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=unique_keys)
        except DuplicateKey as err:
            raise OpcastError(
                f"trace file {path}, line {i}: the key '{err.args[0]}' is given more than once (JSON would keep "
                "the last silently); give each key once"
            ) from None
        except json.JSONDecodeError as err:
            raise OpcastError(f"trace file {path}, line {i}: not JSON ({err.msg}); give one object per line") from None
        except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
            raise OpcastError(
                f"trace file {path}, line {i}: an integer of more than {sys.get_int_max_str_digits()} digits; "
                "give token counts below 2**63"
            ) from None
        if not isinstance(obj, dict):
            raise OpcastError(f"trace file {path}, line {i}: give an object with {', '.join(TRACE_COLUMNS)}")
        rows.append(_row(obj, f"line {i}", path))
    return rows
