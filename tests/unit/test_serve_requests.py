"""The request stream: seeded Poisson arrivals, length distributions, trace files refused row by row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opcast.errors import OpcastError
from opcast.predict.serve.requests import (
    SHAREGPT,
    SHAREGPT_MEAN_INPUT_TOKENS,
    SHAREGPT_MEAN_OUTPUT_TOKENS,
    Lengths,
    parse_lengths,
    poisson_stream,
    read_trace,
)


def test_poisson_arrivals_have_the_rate_and_exponential_gaps():
    s = poisson_stream(
        rate_per_s=4.0,
        num_requests=50_000,
        input_len=parse_lengths("512", "-"),
        output_len=Lengths("uniform", 1, 9),
        seed=0,
    )
    gaps = np.diff(np.concatenate([[0.0], s.arrival_s]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() == pytest.approx(0.25, rel=0.02)  # exponential: std = mean
    assert (s.input_tokens == 512).all()
    assert set(np.unique(s.output_tokens)) == set(range(1, 10))
    assert s.max_tokens == 512 + 9


def test_the_seed_decides_the_stream():
    def stream(seed):
        return poisson_stream(rate_per_s=2, num_requests=100, input_len=SHAREGPT[0], output_len=SHAREGPT[1], seed=seed)

    assert np.array_equal(stream(3).arrival_s, stream(3).arrival_s)
    assert np.array_equal(stream(3).output_tokens, stream(3).output_tokens)
    assert not np.array_equal(stream(3).arrival_s, stream(4).arrival_s)


def test_sharegpt_lengths_have_the_papers_means_before_clipping():
    for dist, mean in zip(SHAREGPT, (SHAREGPT_MEAN_INPUT_TOKENS, SHAREGPT_MEAN_OUTPUT_TOKENS)):
        assert math.exp(dist.mu + dist.sigma**2 / 2) == pytest.approx(mean)
        x = dist.draw(np.random.default_rng(0), 100_000)
        assert x.min() >= 1 and x.max() <= dist.hi
        assert 0.85 * mean < x.mean() < mean  # the clip trims the right tail a little


@pytest.mark.parametrize("text", ["0", "5:2", "a", "1:2:3", "-3", ""])
def test_bad_lengths_are_refused(text):
    with pytest.raises(OpcastError, match="--input-len"):
        parse_lengths(text, "--input-len")


@pytest.mark.parametrize("text", ["99999999999999999999", "1:99999999999999999999", str(2**63)])
def test_lengths_past_int64_are_refused(text):
    # the int64 draw failed with OverflowError / ValueError: an internal error, exit 1
    with pytest.raises(OpcastError, match=r"--input-len .* is too large: give token counts below 2\*\*63"):
        parse_lengths(text, "--input-len")
    assert parse_lengths(str(2**63 - 1), "-").lo == 2**63 - 1


def test_bad_rate_or_count_is_refused():
    one = Lengths("fixed", 1, 1)
    for rate in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(OpcastError, match="--rate"):
            poisson_stream(rate_per_s=rate, num_requests=3, input_len=one, output_len=one, seed=0)
    with pytest.raises(OpcastError, match="--num-requests"):
        poisson_stream(rate_per_s=1.0, num_requests=0, input_len=one, output_len=one, seed=0)
    # arrivals past the clock's microsecond range (at 1e-30 req/s every TPOT came out 0)
    with pytest.raises(OpcastError, match=r"--rate 1e-30 spreads 20 requests over .* give --rate >= 4e-08"):
        poisson_stream(rate_per_s=1e-30, num_requests=20, input_len=one, output_len=one, seed=0)
    assert len(poisson_stream(rate_per_s=1e-6, num_requests=20, input_len=one, output_len=one, seed=0)) == 20


def test_csv_and_jsonl_traces_are_read_and_sorted(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,input_tokens,output_tokens,extra\n0.5,10,3,x\n0.1,20,4,y\n")
    s = read_trace(csv)
    assert s.arrival_s.tolist() == [0.1, 0.5]
    assert s.input_tokens.tolist() == [20, 10] and s.output_tokens.tolist() == [4, 3]
    jsonl = tmp_path / "t.jsonl"
    rows = [
        '{"arrival_s": 1, "input_tokens": 7, "output_tokens": 2}',
        "",
        '{"arrival_s": 0, "input_tokens": 5, "output_tokens": 1}',
    ]
    jsonl.write_text("\n".join(rows) + "\n")
    s = read_trace(jsonl)
    assert s.arrival_s.tolist() == [0.0, 1.0] and s.input_tokens.tolist() == [5, 7]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.csv", "arrival_s,input_tokens,output_tokens\n", "no requests"),
        ("empty.jsonl", "", "no requests"),
        ("header.csv", "time,input_tokens,output_tokens\n1,2,3\n", "lacks arrival_s"),
        ("row.csv", "arrival_s,input_tokens,output_tokens\n0,5,5\n1,abc,5\n", "line 3: .*give numbers"),
        ("neg.csv", "arrival_s,input_tokens,output_tokens\n-1,5,5\n", "line 2: arrival_s '-1'"),
        ("zero.csv", "arrival_s,input_tokens,output_tokens\n1,0,5\n", "line 2: input_tokens '0'"),
        ("frac.csv", "arrival_s,input_tokens,output_tokens\n1,2.5,5\n", "line 2: input_tokens '2.5'"),
        ("short.csv", "arrival_s,input_tokens,output_tokens\n1,2\n", "line 2: missing output_tokens"),
        ("bad.jsonl", '{"arrival_s": 1, "input_tokens": 2, "output_tokens": 3}\n{oops\n', "line 2: not JSON"),
        ("list.jsonl", "[1, 2, 3]\n", "line 1: give an object"),
        # Python's int-from-string limit escaped as an internal error, exit 1
        ("digits.jsonl", '{"arrival_s": 0, "input_tokens": 1' + "0" * 5000 + ', "output_tokens": 3}\n', "4300 digits"),
        ("inf.jsonl", '{"arrival_s": "inf", "input_tokens": 2, "output_tokens": 3}\n', "line 1: arrival_s"),
        ("epoch_ms.csv", "arrival_s,input_tokens,output_tokens\n1733000000000,5,5\n", "arrival_s reaches 1.733e"),
        # read silently before: DictReader kept the last input_tokens, and set a row's extra cells aside
        ("twice.csv", "arrival_s,input_tokens,output_tokens,input_tokens\n0,5,5,7\n", "names input_tokens more than"),
        ("twice.jsonl", '{"arrival_s": 0, "input_tokens": 5, "output_tokens": 5, "input_tokens": 7}\n', "line 1: the"),
        ("long.csv", "arrival_s,input_tokens,output_tokens\n0,5,5,9\n", "line 2: 4 cells, the header has 3 columns"),
        # past int64: the cast to int64 warned and wrapped to -2**63 (a nonsense message, or exit 1)
        ("e19.jsonl", '{"arrival_s": 0, "input_tokens": 1e19, "output_tokens": 3}\n', r"input_tokens 1e\+19 is"),
        ("e30.csv", "arrival_s,input_tokens,output_tokens\n0,5,1e30\n", "line 2: output_tokens '1e30' is too large"),
        # JSON true read as 1 token (or second 1)
        ("true.jsonl", '{"arrival_s": 0, "input_tokens": true, "output_tokens": 3}\n', "line 1: input_tokens True"),
        ("true_at.jsonl", '{"arrival_s": true, "input_tokens": 2, "output_tokens": 3}\n', "line 1: arrival_s True"),
        ("t_hit.jsonl", '{"arrival_s": 0, "input_tokens": 2, "output_tokens": 3, "cached_tokens": true}\n', "cach"),
        # the line of the file, not the row: a blank line counted no more
        ("blank.csv", "arrival_s,input_tokens,output_tokens\n0,5,5\n\n1,0,5\n", "line 4: input_tokens '0'"),
    ],
)
def test_bad_traces_are_refused_in_one_line_naming_the_row(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(OpcastError, match=message) as err:
        read_trace(path)
    assert "\n" not in str(err.value)


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path):
    # Excel's "CSV UTF-8" starts with one: the header was refused for lacking arrival_s
    path = tmp_path / "bom.csv"
    path.write_bytes("arrival_s,input_tokens,output_tokens\n0,5,5\n".encode("utf-8-sig"))
    assert read_trace(path).input_tokens.tolist() == [5]


def test_a_missing_trace_is_refused(tmp_path):
    with pytest.raises(OpcastError, match="cannot read the trace file"):
        read_trace(tmp_path / "nope.csv")


def test_a_trace_past_the_bound_is_refused_unread(tmp_path, monkeypatch):
    # read to the end before: --trace-file /dev/zero held 9 GB within 20 s
    from opcast.predict.serve import requests

    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,5,5\n")
    monkeypatch.setattr(requests, "MAX_TRACE_BYTES", path.stat().st_size - 1)
    with pytest.raises(OpcastError, match="is larger than"):
        read_trace(path)
    monkeypatch.setattr(requests, "MAX_TRACE_BYTES", path.stat().st_size)
    assert read_trace(path).input_tokens.tolist() == [5]


def test_a_closed_loop_stream_knows_only_its_first_arrivals_and_keeps_them_with_a_prefix_cache():
    from opcast.predict.serve.requests import closed_loop_stream, with_prefix_cache

    s = closed_loop_stream(
        concurrency=3, num_requests=10, input_len=Lengths("uniform", 80, 100), output_len=Lengths("fixed", 7, 7), seed=2
    )
    assert s.concurrency == 3 and len(s) == 10
    assert s.arrival_s[:3].tolist() == [0.0] * 3 and np.isnan(s.arrival_s[3:]).all()
    assert ((s.input_tokens >= 80) & (s.input_tokens <= 100)).all() and (s.output_tokens == 7).all()
    cached = with_prefix_cache(s, 0.5, 16)
    assert cached.concurrency == 3 and cached.cached_tokens is not None
    for kw, message in (
        (dict(concurrency=0, num_requests=5), "--concurrency 0 must be >= 1"),
        (dict(concurrency=2, num_requests=0), "--num-requests 0 must be >= 1"),
    ):
        with pytest.raises(OpcastError, match=message):
            closed_loop_stream(input_len=Lengths("fixed", 1, 1), output_len=Lengths("fixed", 1, 1), seed=0, **kw)
