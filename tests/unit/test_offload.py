"""``--offload-activations``: Transformer Engine's copy windows, the GPU memory left, the exposed copy time, and
the refusals of what Megatron-Core refuses (through the console script)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opcast.archs import load_arch
from opcast.hardware import get_device
from opcast.predict import offload
from opcast.predict.memory import layer_activation_bytes, train_memory
from opcast.predict.parallel import TrainConfig
from opcast.predict.training import predict_train


def test_windows_follow_transformer_engines_layer_window_map():
    # 80 layers, 40 offloaded: windows of 2 layers; group 0 is copied from the end of layer 0 (one layer less)
    assert offload.windows(80, 40) == (1,) + (2,) * 39
    # 126 layers, 95 offloaded: 126 = 95 + 31 -> the first 31 windows hold 2 layers, the other 64 one
    w = offload.windows(126, 95)
    assert w == (1,) + (2,) * 30 + (1,) * 64 and sum(w) == 125
    assert offload.windows(10, 0) == ()


def test_exposed_time_hand_worked():
    # 4 layers, 2 offloaded: windows (1, 2); a copy of 10 B at 1 B/s = 10 s each way
    fwd, bwd = offload.exposed_s(
        layer_bytes=10.0, host_bw_bytes_per_s=1.0, forward_layer_s=4.0, backward_layer_s=6.0, layers=4, offloaded=2
    )
    assert fwd == pytest.approx((10 - 4) + (10 - 8))  # 8 s
    assert bwd == pytest.approx((10 - 6) + 0.0)  # the second window (12 s) hides its copy
    assert offload.exposed_s(
        layer_bytes=1.0, host_bw_bytes_per_s=1.0, forward_layer_s=1.0, backward_layer_s=1.0, layers=4, offloaded=0
    ) == (0.0, 0.0)


def test_memory_hand_worked_llama3_8b():
    """Llama 3 8B (h 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336, no dropout), bf16, tp 1, one
    sequence of 8192, FlashAttention: per token and layer, norm-1 and QKV inputs 2 x 2h = 16384 B, Q, K, V
    2 x (32 + 16) x 128 = 12288, logsumexp 4 x 32 = 128, out-proj input 2 x 4096 = 8192, norm-2 and MLP
    inputs 16384, SwiGLU input 2 x 2 x 14336 = 57344 and down-proj input 2 x 14336 = 28672: 139392 B.
    Offloading 20 of 32 layers leaves 32 - 20 + 1 = 13 on the GPU and puts 20 in host memory."""
    arch = load_arch("llama3-8b")
    per_layer = 139392 * 8192
    assert layer_activation_bytes(arch, tp=1, sp=False, batch=1, seq=8192) == per_layer
    kw = dict(
        stage=0, tp=1, pp=1, dp=8, cp=1, ep=1, sp=False, micro_batch=1, seq=8192, micro_batches=4,
        virtual_stages=1, zero=1, precision="bf16", attention="flash", recompute="none",
    )  # fmt: skip
    base = train_memory(arch, **kw)
    off = train_memory(arch, **kw, offload_layers=20)
    assert base.activations_bytes - off.activations_bytes == 19 * per_layer
    assert off.host_activations_bytes == 20 * per_layer and base.host_activations_bytes == 0
    assert (off.weights_bytes, off.optimizer_states_bytes) == (base.weights_bytes, base.optimizer_states_bytes)


def _llama8b(offloaded: int, gpu: str):
    cfg = TrainConfig(tp=1, pp=1, dp=8, micro_batch=1, global_batch=16, seq=8192, zero=1, offload_activations=offloaded)
    return predict_train(load_arch("llama3-8b"), get_device(gpu), cfg, nodes=1, gpus_per_node=8)


def test_a_fast_host_link_hides_the_copies_and_a_slow_one_exposes_them():
    base, fast = _llama8b(0, "GB200"), _llama8b(8, "GB200")  # NVLink-C2C, 450 GB/s each way
    assert fast.feasible and fast.breakdown_s["offload_exposed"] == 0.0
    assert fast.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
    assert fast.worst_memory.activations_bytes < base.worst_memory.activations_bytes
    slow = _llama8b(8, "GB200[host_link_bw_bytes_per_s=1e9]")  # 1.14 GB a layer: 1.14 s each way
    copies = 2 * 8 * 139392 * 8192 / 1e9 * slow.layout.micro_batches
    st = slow.stages[0]
    exposed = slow.breakdown_s["offload_exposed"]
    assert copies - slow.layout.micro_batches * (st.forward_s + st.backward_s) <= exposed < copies
    assert exposed == pytest.approx(slow.iteration_time_s - base.iteration_time_s, rel=1e-9)
    assert sum(slow.breakdown_s.values()) == pytest.approx(slow.iteration_time_s, rel=1e-12)


def _opcast(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opcast", "predict", "train", "--arch", "llama3-8b", "--roofline", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_refuses_what_megatron_refuses_in_one_line():
    out = _opcast("--gpu", "B200", "--nodes", "1", "--gpus-per-node", "8", "--pp", "2", "--recompute", "full")
    assert out.returncode == 0, out.stderr  # the same job without offloading runs
    out = _opcast(
        "--gpu", "B200", "--nodes", "1", "--gpus-per-node", "8", "--pp", "2", "--recompute", "full",
        "--offload-activations", "32",
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    err = out.stderr.strip()
    assert "\n" not in err and err.startswith("opcast: error: infeasible configuration (4 reasons)")
    for part in ("below the model's 32 layers", "needs pp=1", "--recompute full", "--set host_link_bw_bytes_per_s="):
        assert part in err, part
    for bad in ("-1", "two"):
        out = _opcast("--gpu", "GB200", "--offload-activations", bad)
        assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_prices_a_host_link_given_with_set():
    out = _opcast(
        "--gpu", "B200", "--set", "host_link_bw_bytes_per_s=64e9", "--nodes", "1", "--gpus-per-node", "8",
        "--zero", "1", "--seq", "8192", "--offload-activations", "8", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["config"]["offload_activations"] == 8 and doc["host_activations_bytes"] == 8 * 139392 * 8192
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["iteration_time_s"])
