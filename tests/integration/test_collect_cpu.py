"""A tiny real collect on the CPU: bench, resume, Ctrl-C, info, and the CLI's one-line errors
(exit code 2); comm under torchrun is in test_collect_comm_signals.py."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from opcast.cli import main
from opcast.collect.bench import BenchConfig, run_bench
from opcast.collect.info import summarise
from opcast.collect.timing import TimingBudget
from opcast.schema import read_dataset

FAST = TimingBudget(warmup_s=0.001, rep_s=0.004, min_reps=3, max_reps=20)
OPS = (
    "gemm",
    "attention",
    "layernorm",
    "rmsnorm",
    "softmax",
    "elementwise",
    "embedding",
    "cross_entropy",
    "rope",
    "optimizer",
)


@pytest.fixture(autouse=True)
def _fixed_cpu_spec(monkeypatch):
    """Plan against a fixed CPU spec: the real one is measured, and on a loaded machine a slower
    measurement would filter other points out of the plan (the timings stay real)."""
    from dataclasses import replace

    from opcast.collect import bench
    from opcast.collect.local_device import describe_local

    spec = replace(
        describe_local("cpu"), peak_fp32_flops=1e11, peak_bf16_flops=1e11, peak_fp16_flops=None, mem_bw_bytes_per_s=2e10
    )
    monkeypatch.setattr(bench, "describe_local", lambda device: spec)


def _cfg(out: Path, **kw) -> BenchConfig:
    base = dict(out=out, device="cpu", ops=OPS, dtypes=("fp32", "bf16"), samples=24, max_point_s=0.002, timing=FAST)
    base.update(kw)
    return BenchConfig(**base)


def test_bench_writes_every_kind_and_resumes(tmp_path):
    first = run_bench(_cfg(tmp_path, samples=60))
    assert first.already_done == 0 and first.rows_written > 0
    assert first.rows_written == first.planned - sum(first.skipped_at_run.values())
    df = read_dataset(tmp_path)
    assert set(df["op"]) == set(OPS)
    assert (df["time_s_median"] > 0).all() and (df["time_s_p20"] <= df["time_s_median"]).all()
    assert (df["time_s_median"] <= df["time_s_p80"]).all() and (df["n_reps"] >= 3).all()
    assert set(df["timing_method"]) <= {"perf_counter", "perf_counter+flush"} and set(df["source"]) == {"bench"}
    assert (tmp_path / "run.json").is_file()
    again = run_bench(_cfg(tmp_path, samples=60))
    assert again.rows_written == 0 and again.already_done == first.rows_written
    assert len(read_dataset(tmp_path)) == len(df)
    table = summarise([tmp_path])
    assert set(table["op"]) == set(OPS) and table["rows"].sum() == len(df)


def test_neusight_protocol_rows_resume_by_protocol(tmp_path):
    """--timing neusight: the same plan timed by NeuSight's rule, rows marked so; a folder measured by
    opcast's protocol is measured again under NeuSight's (not kept as if it were), and each resumes."""
    ops = ("gemm", "elementwise", "layernorm", "softmax")
    ours = run_bench(_cfg(tmp_path, ops=ops, dtypes=("fp32",), samples=8))
    theirs = run_bench(_cfg(tmp_path, ops=ops, dtypes=("fp32",), samples=8, protocol="neusight"))
    assert ours.rows_written > 0 and theirs.already_done == 0 and theirs.rows_written == ours.rows_written
    df = read_dataset(tmp_path)
    ns = df[df["timing_method"] == "neusight:mean_fastest5"]
    assert len(ns) == theirs.rows_written and (ns["n_reps"] == 25).all() and (ns["time_s_median"] > 0).all()
    # the same shapes, under the same point ids (a shape is one id on every device and protocol: honest splits)
    assert set(ns["point_id"]) == set(df.loc[df["timing_method"] != "neusight:mean_fastest5", "point_id"])
    again = run_bench(_cfg(tmp_path, ops=ops, dtypes=("fp32",), samples=8, protocol="neusight"))
    assert again.rows_written == 0 and again.already_done == theirs.rows_written


class _InterruptAfter:
    """A progress sink that delivers Ctrl-C to this process after n points."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        self.seen += 1
        if self.seen == self.n:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_finishes_the_point_keeps_rows_and_resumes(tmp_path):
    result = run_bench(
        _cfg(tmp_path, ops=("gemm", "softmax"), dtypes=("fp32",), samples=12), progress=_InterruptAfter(3)
    )
    assert result.interrupted and result.remaining > 0
    kept = read_dataset(tmp_path)
    assert len(kept) == result.rows_written == 3
    rest = run_bench(_cfg(tmp_path, ops=("gemm", "softmax"), dtypes=("fp32",), samples=12))
    assert rest.already_done == 3 and rest.rows_written + 3 == rest.planned


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--op", "conv2d"], "unknown op 'conv2d'"),
        (["--op", "all_reduce"], "collect comm"),
        (["--op", "moe"], "collect replay aiconfigurator"),
        (["--dtype", "fp8"], "not available on the CPU"),
        (["--dtype", "fp64"], "unknown dtype"),
        (["--device", "cuda"] if not shutil.which("nvidia-smi") else ["--device", "tpu"], "--device"),
        (["--tp", "1,x"], "--tp takes"),
        (["--arch", "llama2-7b", "--tp", "3"], "--tp 3 fits none of the --arch models (llama2-7b: tp=3"),
        (["--tp", "2"], "give --arch too"),
        (["--arch", "gpt-7"], "gpt-7"),
        (["--timing", "triton"], "--timing takes opcast or neusight, got 'triton'"),
    ],
)
def test_bad_bench_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    code, err = _cli(capsys, "collect", "bench", "--out", str(tmp_path / "d"), "--samples", "2", *args)
    assert code == 2, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unwritable_out_and_corrupt_dataset_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = _cli(capsys, "collect", "bench", "--out", str(blocker / "d"), "--samples", "2", "--op", "gemm")
    assert code == 2 and "lies under" in err and "which is a file; choose a folder" in err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "junk.parquet").write_bytes(b"not parquet")
    code, err = _cli(capsys, "collect", "bench", "--out", str(tmp_path / "d"), "--samples", "2", "--op", "gemm")
    assert code == 2 and "junk.parquet" in err
    assert (tmp_path / "d" / "junk.parquet").read_bytes() == b"not parquet"  # nothing of the user's is touched
    code, err = _cli(capsys, "collect", "info", str(tmp_path / "d"))
    assert code == 2 and "junk.parquet" in err


def test_help_of_every_command(capsys):
    for args in (
        [],
        ["collect"],
        ["collect", "bench"],
        ["collect", "comm"],
        ["collect", "info"],
        ["hardware"],
        ["hardware", "list"],
        ["hardware", "show"],
        ["arch"],
        ["arch", "list"],
        ["arch", "show"],
    ):
        assert main([*args, "--help"]) == 0, args
        assert "Usage" in capsys.readouterr().out


# comm under torchrun (every collective, the bus factors, resume) is run in test_collect_comm_signals.py,
# interrupted by SIGTERM and then resumed to the end


def test_comm_outside_torchrun_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    code, err = _cli(capsys, "collect", "comm", "--out", str(tmp_path))
    assert code == 2 and "torchrun" in err


def test_flash2_points_run_torchs_flash_backend(monkeypatch):
    # collect labels the flash backend flash2 on Hopper and Blackwell; the builder runs the same kernel for both labels
    import functools

    import torch
    from torch.nn.attention import SDPBackend

    from opcast.collect.ops import BUILDERS, BuildRequest
    from opcast.ops import get_op

    seen = []
    real = torch.nn.attention.sdpa_kernel

    @functools.wraps(real)
    def spy(backends, *args, **kwargs):
        seen.append(list(backends))
        return real(backends, *args, **kwargs)

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", spy)
    base = {"batch": 1, "heads": 2, "kv_heads": 2, "seq_q": 64, "seq_kv": 64, "head_dim": 32, "causal": True}
    for impl in ("flash", "flash2"):
        params = get_op("attention").validate({**base, "impl": impl})
        BUILDERS["attention"](BuildRequest(params=params, dtype="fp32", direction="fwd", device=torch.device("cpu")))()
    assert seen and all(b == [SDPBackend.FLASH_ATTENTION] for b in seen)


def test_the_fused_swiglu_is_no_eager_benchmark():
    """The registry's swiglu is one fused kernel; eager's silu(a) * b is two (the silu and mul points), so a plan point
    of it is skipped with its reason rather than timed as something it is not."""
    from opcast.collect.ops import BUILDERS, BuildRequest, UnsupportedPoint
    from opcast.ops import get_op

    params = get_op("elementwise").validate({"numel": 4096, "fn": "swiglu"})
    with pytest.raises(UnsupportedPoint, match="torch eager has none: silu\\(a\\) \\* b runs two kernels"):
        BUILDERS["elementwise"](BuildRequest(params=params, dtype="fp32", direction="fwd", device="cpu"))
    mul = get_op("elementwise").validate({"numel": 4096, "fn": "mul"})
    assert callable(BUILDERS["elementwise"](BuildRequest(params=mul, dtype="fp32", direction="fwd", device="cpu")))
