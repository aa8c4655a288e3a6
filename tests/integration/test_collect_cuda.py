"""collect on a real CUDA device (skipped without one): timing methods, dtypes, fp8, NCCL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from opcast.collect.bench import BenchConfig, run_bench
from opcast.collect.timing import TimingBudget, measure_cuda
from opcast.schema import read_dataset

pytestmark = pytest.mark.gpu
FAST = TimingBudget(warmup_s=0.005, rep_s=0.02)


def test_bench_on_cuda_every_kind_bf16(tmp_path):
    result = run_bench(BenchConfig(out=tmp_path, device="cuda", dtypes=("bf16", "fp32"), samples=60, timing=FAST))
    df = read_dataset(tmp_path)
    assert result.rows_written == len(df) > 30
    assert set(df["timing_method"]) <= {"cuda_event", "cuda_graph"}
    assert df.loc[df["dtype"] == "fp32", "tensor_cores"].eq(False).all()
    assert df.loc[df["dtype"] == "bf16", "tensor_cores"].eq(True).all()
    assert df["cuda_version"].notna().all()


def test_events_and_graphs_agree_on_a_tiny_kernel():
    import torch

    x = torch.randn(1024, device="cuda")
    ev = measure_cuda(lambda: x.mul_(1.0), device=torch.device("cuda"), l2_bytes=0, budget=FAST, use_graphs=False)
    gr = measure_cuda(lambda: x.mul_(1.0), device=torch.device("cuda"), l2_bytes=0, budget=FAST, use_graphs=True)
    assert ev.method == "cuda_event" and gr.method == "cuda_graph"
    assert gr.time_s_median < ev.time_s_median  # graphs remove launch overhead


def test_fp8_gemm_where_supported(tmp_path):
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    run_bench(BenchConfig(out=tmp_path, device="cuda", ops=("gemm",), dtypes=("fp8",), samples=8, timing=FAST))
    df = read_dataset(tmp_path)
    assert len(df) > 0 and set(df["dtype"]) == {"fp8"} and set(df["direction"]) == {"fwd"}


def test_nccl_comm_on_two_gpus(tmp_path):
    import torch

    if torch.cuda.device_count() < 2 or shutil.which("torchrun") is None:
        pytest.skip("needs 2 CUDA devices and torchrun")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "opcast",
        "collect",
        "comm",
        "--backend",
        "nccl",
        "--dtype",
        "bf16",
        "--out",
        str(tmp_path),
        "--max-bytes",
        "1048576",
        "--iters",
        "5",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert res.returncode == 0, res.stderr[-2000:]
    df = read_dataset(tmp_path)
    assert (df["busbw_gbps"] > 0).all()
