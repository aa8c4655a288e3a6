"""Replay of PyTorch profiler traces (opcast.collect.replay.kineto) on a hand-written CUDA trace.

The fixture ``tests/fixtures/replay/kineto_h100_train_step.json`` is one training step of a toy
transformer on an H100 in the torch 2.x Chrome-trace format: 3 layers of layer_norm -> linear
(addmm) -> gelu, a matmul (mm), bmm, baddbmm, softmax, a flash SDPA call, an fp32 router mm, an
efficient-attention call without Concrete Inputs, an all-reduce and an all-gather, the backward
pass on the autograd thread, and one kernel with no launching op.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from opcast.collect.info import summarise
from opcast.collect.replay import ReplayOptions, run_replay
from opcast.collect.replay.common import MalformedFile
from opcast.collect.replay.kineto import ATTENTION, NO_KERNELS, ORPHAN, ROWWISE, replay
from opcast.errors import OpcastError
from opcast.schema import read_dataset

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "replay" / "kineto_h100_train_step.json"


@pytest.fixture(scope="module")
def result():
    return replay(FIXTURE, ReplayOptions())


def _events() -> list[dict]:
    return json.loads(FIXTURE.read_text())["traceEvents"]


def _key(row: dict) -> tuple:
    params = {
        k: row[k]
        for k in (
            "b",
            "m",
            "n",
            "k",
            "batch",
            "heads",
            "kv_heads",
            "seq_q",
            "seq_kv",
            "head_dim",
            "causal",
            "impl",
            "rows",
            "cols",
            "bytes",
            "world_size",
            "nodes",
            "gpus_per_node",
        )
        if k in row
    }
    return row["op"], tuple(sorted(params.items())), row["dtype"], row["direction"]


def _find(rows: list[dict], op: str, direction: str, **params) -> dict:
    found = [
        r
        for r in rows
        if r["op"] == op and r["direction"] == direction and all(r.get(k) == v for k, v in params.items())
    ]
    assert len(found) == 1, (op, direction, params, found)
    return found[0]


def test_rows_are_the_mapped_invocations(result):
    expected = {
        # (op, params, dtype, direction): invocations
        ("gemm", (("b", 1), ("k", 1024), ("m", 4096), ("n", 3072)), "bf16", "fwd"): 3,  # aten::addmm under aten::linear
        ("gemm", (("b", 1), ("k", 1024), ("m", 4096), ("n", 4096)), "bf16", "fwd"): 1,  # aten::mm under aten::matmul
        ("gemm", (("b", 32), ("k", 128), ("m", 2048), ("n", 2048)), "fp16", "fwd"): 1,  # aten::bmm
        ("gemm", (("b", 32), ("k", 64), ("m", 2048), ("n", 1024)), "fp16", "fwd"): 1,  # aten::baddbmm
        ("gemm", (("b", 1), ("k", 1024), ("m", 4096), ("n", 8)), "fp32", "fwd"): 1,  # the fp32 router mm
        ("gemm", (("b", 1), ("k", 1024), ("m", 4096), ("n", 3072)), "bf16", "bwd"): 3,  # AddmmBackward0: two mm each
        ("gemm", (("b", 32), ("k", 128), ("m", 2048), ("n", 2048)), "fp16", "bwd"): 1,  # BmmBackward0: two bmm
        (
            "attention",
            (
                ("batch", 2),
                ("causal", True),
                ("head_dim", 128),
                ("heads", 16),
                ("impl", "flash"),
                ("kv_heads", 16),
                ("seq_kv", 2048),
                ("seq_q", 2048),
            ),
            "bf16",
            "fwd",
        ): 1,
        (
            "attention",
            (
                ("batch", 2),
                ("causal", True),
                ("head_dim", 128),
                ("heads", 16),
                ("impl", "flash"),
                ("kv_heads", 16),
                ("seq_kv", 2048),
                ("seq_q", 2048),
            ),
            "bf16",
            "bwd",
        ): 1,
        ("layernorm", (("cols", 1024), ("rows", 4096)), "bf16", "fwd"): 3,
        ("layernorm", (("cols", 1024), ("rows", 4096)), "bf16", "bwd"): 3,
        ("softmax", (("cols", 2048), ("rows", 65536)), "fp16", "fwd"): 1,
        ("softmax", (("cols", 2048), ("rows", 65536)), "fp16", "bwd"): 1,
        ("all_reduce", (("bytes", 8388608), ("gpus_per_node", 8), ("nodes", 1), ("world_size", 8)), "bf16", "fwd"): 1,
        ("all_gather", (("bytes", 8388608), ("gpus_per_node", 8), ("nodes", 1), ("world_size", 8)), "bf16", "fwd"): 1,
    }
    assert {_key(r): r["n_reps"] for r in result.rows} == expected
    assert len(result.rows) == 15
    assert result.files == 1
    assert {r["device"] for r in result.rows} == {"H100-SXM"}  # deviceProperties "NVIDIA H100 80GB HBM3"
    assert {r["source_file"] for r in result.rows} == {FIXTURE.name}


def test_invocation_counts_match_the_trace(result):
    """Counted independently from the JSON: one addmm row invocation per aten::addmm event, one per nccl kernel."""
    events = _events()
    names = Counter(e["name"] for e in events if e.get("cat") == "cpu_op")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert _find(result.rows, "gemm", "fwd", m=4096, n=3072)["n_reps"] == names["aten::addmm"] == 3
    assert _find(result.rows, "layernorm", "fwd")["n_reps"] == names["aten::native_layer_norm"] == 3
    assert _find(result.rows, "gemm", "bwd", m=4096)["n_reps"] == names["AddmmBackward0"] == 3
    nccl = [k for k in kernels if k["name"].startswith("ncclDevKernel")]
    assert sum(r["n_reps"] for r in result.rows if r["op"] in ("all_reduce", "all_gather")) == len(nccl) == 2
    # every kernel is in a row or a skip: rows' kernels + gelu 3 + sum 3 + add_ 1 + MmBackward 1
    # + efficient attn 1 + orphan 1
    in_rows = 3 + 1 + 1 + 1 + 1 + 3 * 2 + 2 + 1 + 4 + 3 + 3 * 2 + 1 + 1 + 2
    assert len(kernels) == in_rows + 3 + 3 + 1 + 1 + 1 + 1


def test_skips_are_counted_with_reasons(result):
    assert dict(result.skipped) == {
        "unmapped aten::gelu": 3,
        "unmapped aten::sum": 3,  # bias gradients, outside the AddmmBackward0 node
        "unmapped aten::add_": 1,
        ORPHAN: 1,
        "MmBackward: one product (one input needed no gradient), not a full gemm backward": 1,
        "aten::_scaled_dot_product_efficient_attention: is_causal unknown (trace has no Concrete Inputs; torch >= 2.1 "
        "records them)": 1,
    }


def test_hand_checked_times(result):
    rows = result.rows
    addmm = _find(rows, "gemm", "fwd", m=4096, n=3072)
    # kernels 210.4, 212.8, 209.6 us: median 210.4 us; inclusive quantiles of 3 values at 0.2 / 0.8
    assert addmm["time_s_median"] == 210.4 / 1e6
    assert addmm["time_s_p20"] == pytest.approx(209.92e-6, rel=1e-12)
    assert addmm["time_s_p80"] == pytest.approx(211.84e-6, rel=1e-12)
    assert addmm["tensor_cores"] is True and addmm["dtype"] == "bf16"
    assert addmm["kernel_name"].startswith("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
    assert (addmm["grid"], addmm["block"]) == ("24,16,1", "384,1,1")
    assert addmm["timing_method"] == "replay:kineto:kernel_sum"
    # flash backward: the fill three ops below it, plus the three flash kernels, 21.2 + 35.1 + 1490.6 + 12.4 us
    attn_bwd = _find(rows, "attention", "bwd")
    assert attn_bwd["time_s_median"] == pytest.approx(1559.3e-6, rel=1e-12)
    assert attn_bwd["kernel_name"].startswith("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel")
    assert "time_s_p20" not in attn_bwd  # one invocation
    # AddmmBackward0: dX + dW per layer = 403.8, 405.5, 402.7 us -> median 403.8 us
    assert _find(rows, "gemm", "bwd", m=4096)["time_s_median"] == pytest.approx(403.8e-6, rel=1e-12)
    # BmmBackward0: forward A [32,2048,128] x B [32,128,2048]; 180.2 + 176.4 us
    bmm_bwd = _find(rows, "gemm", "bwd", b=32)
    assert (bmm_bwd["m"], bmm_bwd["n"], bmm_bwd["k"]) == (2048, 2048, 128)
    assert bmm_bwd["time_s_median"] == pytest.approx(356.6e-6, rel=1e-12)
    # layer norm backward: two kernels each, 86.6, 85.7, 87.1 us -> 86.6 us
    assert _find(rows, "layernorm", "bwd")["time_s_median"] == pytest.approx(86.6e-6, rel=1e-12)
    router = _find(rows, "gemm", "fwd", n=8)
    assert (router["dtype"], router["tensor_cores"], router["time_s_median"]) == ("fp32", False, 38.5 / 1e6)
    assert _find(rows, "softmax", "fwd")["time_s_median"] == 305.6 / 1e6


def test_collectives(result):
    ar = _find(result.rows, "all_reduce", "fwd")
    assert ar["bytes"] == 4194304 * 2  # In msg nelems x bf16, from record_param_comms
    assert ar["time_s_median"] == 488.2 / 1e6
    assert ar["algbw_gbps"] == pytest.approx(8388608 / 488.2e-6 / 1e9, rel=1e-12)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * 7 / 8, rel=1e-12)
    assert ar["tensor_cores"] is None and ar["timing_method"] == "replay:kineto:nccl_kernel"
    ag = _find(result.rows, "all_gather", "fwd")
    assert ag["bytes"] == 4194304 * 2  # Out msg nelems (the gathered size), from the kernel's own args
    assert ag["busbw_gbps"] == pytest.approx(8388608 / 233.1e-6 / 1e9 * 7 / 8, rel=1e-12)


def test_nodes_and_world_size_options(tmp_path):
    rows = replay(FIXTURE, ReplayOptions(nodes=2)).rows
    ar = _find(rows, "all_reduce", "fwd")
    assert (ar["world_size"], ar["nodes"], ar["gpus_per_node"]) == (8, 2, 4)
    doc = json.loads(FIXTURE.read_text())
    for e in doc["traceEvents"]:
        args = e.get("args") or {}
        if "Group size" in args:
            args["Group size"] = 16
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    result = replay(path, ReplayOptions())
    assert result.skipped["all_reduce: 16 ranks and the node count unknown; pass --nodes or --gpus-per-node"] == 1
    ag = _find(replay(path, ReplayOptions(gpus_per_node=8)).rows, "all_gather", "fwd")
    assert (ag["world_size"], ag["nodes"], ag["gpus_per_node"]) == (16, 2, 8)


def test_run_replay_writes_a_readable_dataset(tmp_path):
    summary = run_replay("kineto", FIXTURE, tmp_path / "out")
    assert (summary.rows_read, summary.rows_written, summary.files) == (15, 15, 1)
    frame = read_dataset([tmp_path / "out" / "kineto.parquet"])
    assert len(frame) == 15
    assert set(frame["source"]) == {"replay:kineto"}
    table = summarise([tmp_path / "out"])
    assert set(table["device"]) == {"H100-SXM"}
    assert set(table["op"]) == {"gemm", "attention", "layernorm", "softmax", "all_reduce", "all_gather"}
    assert int(table["rows"].sum()) == 15


def test_device_option_and_unknown_gpu(tmp_path):
    rows = replay(FIXTURE, ReplayOptions(device="H200")).rows
    assert {r["device"] for r in rows} == {"H200"}
    doc = json.loads(FIXTURE.read_text())
    doc["deviceProperties"][0]["name"] = "NVIDIA Graphics Device"
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(MalformedFile, match=r"rank0\.json: GPU 'NVIDIA Graphics Device' .* pass --device"):
        replay(path, ReplayOptions())
    del doc["deviceProperties"]
    path.write_text(json.dumps(doc))
    with pytest.raises(MalformedFile, match=r"rank0\.json: .*no deviceProperties.*pass --device"):
        replay(path, ReplayOptions())


def test_gzip_folder_and_non_trace_json(tmp_path):
    folder = tmp_path / "traces" / "node0"
    folder.mkdir(parents=True)
    with gzip.open(folder / "rank0.pt.trace.json.gz", "wb") as fh:
        fh.write(FIXTURE.read_bytes())
    (tmp_path / "traces" / "meta.json").write_text('{"run": "toy"}')
    result = replay(tmp_path / "traces", ReplayOptions())
    assert len(result.rows) == 15 and result.files == 1
    assert {r["source_file"] for r in result.rows} == {"node0/rank0.pt.trace.json.gz"}
    assert result.skipped["JSON file without traceEvents (not a profiler trace)"] == 1


def test_corrupt_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(FIXTURE.read_text()[:20000])
    with pytest.raises(MalformedFile, match=rf"^{path}:\d+: invalid JSON"):
        replay(path, ReplayOptions())
    gz = tmp_path / "broken.json.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00not really gzip")
    with pytest.raises(MalformedFile, match=rf"^{gz}: not a readable gzip file"):
        replay(gz, ReplayOptions())
    bad = tmp_path / "badts.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1.0}]}))
    with pytest.raises(MalformedFile, match=r"badts\.json: traceEvents\[0\] \('k'\) has ts='soon', not a number"):
        replay(bad, ReplayOptions())


def _mm_trace(kernel_args: dict, runtime: bool = True, flows: bool = False) -> dict:
    """An older-style trace: the kernel's External id is its correlation, not the op's."""
    op = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 10,
        "tid": 10,
        "ts": 100.0,
        "dur": 50.0,
        "args": {"External id": 7, "Input Dims": [[2048, 2048], [2048, 256]], "Input type": ["float", "float"]},
    }
    events = [
        op,
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ampere_sgemm_128x64_nn",
            "pid": 0,
            "tid": 7,
            "ts": 160.0,
            "dur": 45.0,
            "args": {"device": 0, **kernel_args},
        },
    ]
    if runtime:
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 10,
                "tid": 10,
                "ts": 130.0,
                "dur": 10.0,
                "args": {"External id": 2131433, "correlation": 2131433},
            }
        )
    if flows:
        events.append({"ph": "s", "id": 2131433, "pid": 10, "tid": 10, "ts": 130.0, "cat": "ac2g", "name": "ac2g"})
        events.append(
            {"ph": "f", "id": 2131433, "pid": 0, "tid": 7, "ts": 160.0, "cat": "ac2g", "name": "ac2g", "bp": "e"}
        )
    return {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}], "traceEvents": events}


@pytest.mark.parametrize(
    "kernel_args, runtime, flows",
    [
        ({"External id": 2131433, "correlation": 2131433}, True, False),  # torch <= 1.12: linked by the runtime call
        ({"External id": 2131433}, True, True),  # no correlation arg: the ac2g flow
        ({"External id": 7, "correlation": 99}, False, False),  # no runtime event: the op's External id
    ],
)
def test_kernel_linking_variants(tmp_path, kernel_args, runtime, flows):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_mm_trace(kernel_args, runtime, flows)))
    (row,) = replay(path, ReplayOptions()).rows
    assert (row["op"], row["b"], row["m"], row["n"], row["k"], row["dtype"]) == ("gemm", 1, 2048, 256, 2048, "fp32")
    assert (row["device"], row["time_s_median"], row["tensor_cores"]) == ("A100-SXM4-40GB", 45.0 / 1e6, False)


def test_cpu_only_trace_is_reported_not_replayed(tmp_path):
    """Decision: CPU op durations are host wall time with profiler overhead, so a CPU-only trace
    yields no rows; alone it is an error, beside GPU traces it is counted as skipped."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(64, 32), torch.randn(32, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, b)
        torch.softmax(a, dim=-1)
    path = tmp_path / "cpu" / "cpu_trace.json"
    path.parent.mkdir()
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    mm = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm and mm[0]["args"]["Input Dims"] == [[64, 32], [32, 16]]  # the real format has the shapes ...
    assert not any(e.get("cat") == "kernel" for e in doc["traceEvents"])  # ... but no kernels
    with pytest.raises(OpcastError, match="no GPU kernels in 1 trace"):
        replay(path, ReplayOptions())
    shutil.copy(FIXTURE, tmp_path / "cpu" / "gpu.json")
    result = replay(tmp_path / "cpu", ReplayOptions())
    assert result.skipped[NO_KERNELS] == 1 and len(result.rows) == 15 and result.files == 2


def test_argument_positions_match_the_aten_schemas():
    import torch

    def args(name: str) -> list[str]:
        return [a.name for a in getattr(torch.ops.aten, name.removeprefix("aten::")).default._schema.arguments]

    for name, spec in ATTENTION.items():
        names = args(name)
        assert names[spec.q] == "query" and names[spec.q + 1] == "key", name
        assert names[spec.causal] == "is_causal", name
        if spec.mask is not None:
            assert names[spec.mask] in ("attn_bias", "attn_mask"), name
    for name, (_, _, index, arg) in ROWWISE.items():
        names = args(name)
        assert names[arg] == ("normalized_shape" if "layer_norm" in name else "dim"), name
        assert names[index] in ("input", "self", "grad_out", "grad_output"), name


def test_products_under_other_backward_nodes_are_skipped(tmp_path):
    doc = _mm_trace({"External id": 2131433, "correlation": 2131433})
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "FusedMatmulBackward",
            "pid": 10,
            "tid": 10,
            "ts": 90.0,
            "dur": 80.0,
            "args": {"External id": 6, "Input Dims": [[2048, 256]]},
        }
    )
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(doc))
    result = replay(path, ReplayOptions())
    assert not result.rows
    assert dict(result.skipped) == {
        "aten::mm inside FusedMatmulBackward (a backward product opcast cannot attribute)": 1
    }


def _with_durations(tmp_path: Path, durations: dict[float, float]) -> Path:
    """The fixture with the kernels of the given durations (us) changed to new ones."""
    doc = json.loads(FIXTURE.read_text())
    changed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["dur"] in durations:
            e["dur"] = durations[e["dur"]]
            changed += 1
    assert changed == len(durations)
    path = tmp_path / "broken_clock.json"
    path.write_text(json.dumps(doc))
    return path


def test_negative_and_zero_kernel_times_are_dropped_and_counted(tmp_path):
    """A broken GPU clock gives kernels negative durations: such an invocation (and one whose
    kernels take no time) is skipped with its reason, never written as a measurement."""
    from opcast.collect.replay.kineto import NEGATIVE_TIME, ZERO_TIME

    # one of the three addmm invocations, the fp32 router mm and the all-reduce
    path = _with_durations(tmp_path, {212.8: -212.8, 38.5: 0.0, 488.2: -3.0})
    result = replay(path, ReplayOptions())
    assert result.skipped[NEGATIVE_TIME] == 2 and result.skipped[ZERO_TIME] == 1
    addmm = _find(result.rows, "gemm", "fwd", m=4096, n=3072)
    assert addmm["n_reps"] == 2 and addmm["time_s_median"] == pytest.approx((210.4 + 209.6) / 2 / 1e6, rel=1e-12)
    assert not [r for r in result.rows if r["op"] == "all_reduce" or r.get("n") == 8]
    assert len(result.rows) == 13 and all(r["time_s_median"] > 0 for r in result.rows)


def test_replay_cli_reports_the_drops_and_writes_shareable_files(tmp_path):
    """Through the console script: exit 0, the drops in the summary, positive times only, and
    the output readable by the group (umask 027 -> 0640, not mkstemp's 0600)."""
    import os
    import subprocess
    import sys

    path = _with_durations(tmp_path, {212.8: -212.8, 488.2: -3.0})
    script = Path(sys.executable).parent / "opcast"
    res = subprocess.run(
        [str(script), "collect", "replay", "kineto", str(path), "--out", str(tmp_path / "out"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        umask=0o027,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["skipped"]["invocation with a negative kernel duration (broken GPU timestamps in the trace)"] == 2
    assert summary["rows_written"] == 14
    out = tmp_path / "out" / "kineto.parquet"
    assert (read_dataset([out])["time_s_median"] > 0).all()
    assert os.stat(out).st_mode & 0o777 == 0o640
