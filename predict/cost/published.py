"""Kernel times from published measurements: :class:`PublishedAttentionCost` prices attention of the
FlashAttention-1 generation (the registry's ``impl`` ``flash1``,
:data:`opcast.ops.PUBLISHED_ATTENTION_IMPLS`) at FlashAttention-1's measured speed
(:data:`FA1_FWD_BWD_TFLOPS`), a kernel no microbenchmark here runs and no learned model has data of, and
the FlashAttention-2 generation on Hopper and Blackwell (``flash2``: flash-attn 2, torch SDPA's flash
backend) at FlashAttention-2's measured H100 speed (:data:`FA2_FWD_BWD_TFLOPS`): the learned ``flash``
models know those GPUs from FlashAttention-3-class kernels (TensorRT-LLM's, cuDNN's), about twice as fast.

The rule, per kernel (seconds = registry FLOPs of the direction / rate, never below bytes / the
datasheet bandwidth):

- the rate of the figure at the kernel's causal flag, head dimension and ``seq_kv``, interpolated
  linearly in log2(sequence) between :data:`FA1_SEQS` and linearly in the head dimension between
  64 and 128, held constant beyond both ends (the roofline efficiency curves' convention);
  forward and backward at the same rate, so one forward + backward takes the figure's time;
- on the GPUs the figures measured (:data:`FA1_GPUS`, matched by catalog name through
  :func:`opcast.hardware.kernel_twin`, so a cluster's network settings keep the match): that rate,
  labelled ``published/flash1``;
- on any other device, a roofline at the efficiency the figures measured on the nearest
  architecture (:func:`nearest_figure`): the rate as a fraction of that figure GPU's dense FP16
  peak (A100 312, H100 989.4 TFLOP/s) times the device's dense peak for the kernel's dtype;
  Hopper and Blackwell take H100's fraction, every other device A100's (Ampere and Ada, the
  architectures FlashAttention-1 was written for; on other vendors an assumption). Labelled
  ``published/flash1/extrapolated-from-A100`` (or ``-H100``).

``flash2`` follows the same rule with FlashAttention-2's H100 figure, its only figure here: a device
of another architecture is extrapolated from H100's share of peak, which is low for them (the graph
prices FlashAttention-2 there as the learned ``flash``, whose data on Ampere and Ada are
FlashAttention-2's: :func:`opcast.predict.graph.precision_of`).

Half precision (fp16, bf16) on tensor cores only, the figures' and FlashAttention's: another
dtype is left to the next source (the roofline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from opcast.errors import OpcastError
from opcast.hardware import get_device, kernel_twin
from opcast.predict.cost.query import Kernel
from opcast.predict.cost.roofline import kernel_peak

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

PUBLISHED = "published"

FA1_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
FA1_FWD_BWD_TFLOPS: dict[tuple[str, bool, int], tuple[float, ...]] = {
    ("A100", False, 64): (91, 92, 104, 108, 110, 110),
    ("A100", False, 128): (76, 72, 76, 80, 82, 83),
    ("A100", True, 64): (58, 70, 77, 87, 92, 97),
    ("A100", True, 128): (55, 62, 69, 76, 80, 83),
    ("H100", False, 64): (157, 159, 161, 161, 166, 168),
    ("H100", False, 128): (127, 127, 128, 131, 137, 139),
    ("H100", True, 64): (104, 123, 136, 138, 149, 156),
    ("H100", True, 128): (98, 109, 108, 126, 135, 137),
}
"""FlashAttention-1's measured attention forward + backward speed (TFLOP/s) by (GPU, causal, head
dim), at the sequences :data:`FA1_SEQS`: the "FlashAttention" bars of the FlashAttention-2 paper
(Dao 2023, arXiv 2307.08691, Fig. 4, A100 80GB SXM4) and of the H100 80GB SXM5 figure released with it
(github.com/Dao-AILab/flash-attention, ``assets/flash2_a100_fwd_bwd_benchmark.png`` and
``assets/flash2_h100_fwd_bwd_benchmark.png`` at tag v2.0.0), fp16, batch x sequence = 16k tokens,
hidden 2048. FLOPs counted as opcast counts them (``benchmarks/benchmark_flash_attention.py``:
``4 * batch * seqlen**2 * nheads * headdim``, halved when causal, x 3.5 forward + backward). The same
A100 figure measures the Triton FlashAttention at 50, 61, 68, 74, 78, 80 TFLOP/s (causal, head dim 128),
within 10 % of these: the Triton kernel (llm-foundry's ``attn_impl: triton``) is priced at
FlashAttention-1's rate, which its own header puts slightly above its speed."""

FA2_FWD_BWD_TFLOPS: dict[tuple[str, bool, int], tuple[float, ...]] = {
    ("H100", False, 64): (215, 254, 274, 288, 294, 296),
    ("H100", False, 128): (248, 294, 320, 326, 335, 338),
    ("H100", True, 64): (141, 192, 232, 257, 273, 284),
    ("H100", True, 128): (163, 221, 265, 294, 308, 328),
}
"""FlashAttention-2's measured attention forward + backward speed (TFLOP/s) on H100 80GB SXM5 by (GPU,
causal, head dim) at :data:`FA1_SEQS`: the "FlashAttention-2" bars of the same H100 figure
(github.com/Dao-AILab/flash-attention ``assets/flash2_h100_fwd_bwd_benchmark.png``, added with the
FlashAttention-2 release, commit 4f285b35), fp16, 16k tokens, hidden 2048, FLOPs counted as for
:data:`FA1_FWD_BWD_TFLOPS`. Checked on a real H200 with torch 2.11's SDPA flash backend (causal, head
dim 128, GQA 32/8; ``benchmarks/data/h200_torch``): forward + backward at 208 and 244 TFLOP/s at 2,048
and 4,096 tokens, 78 and 83 % of the figure's 265 and 294."""

FIGURES: dict[str, dict[tuple[str, bool, int], tuple[float, ...]]] = {
    "flash1": FA1_FWD_BWD_TFLOPS,
    "flash2": FA2_FWD_BWD_TFLOPS,
}
"""Each published attention implementation's figure (:data:`opcast.ops.PUBLISHED_ATTENTION_IMPLS`)."""

_FIGURE_GPUS: dict[str, frozenset[str]] = {impl: frozenset(g for g, _, _ in fig) for impl, fig in FIGURES.items()}

_HEAD_DIMS = (64, 128)
"""The head dimensions the figures measured."""

FA1_GPUS = {"A100-SXM4-80GB": "A100", "A100-SXM4-40GB": "A100", "H100-SXM": "H100"}
"""opcast catalog device -> the figure's GPU (the 40GB A100 has the 80GB's SMs, clocks and tensor peak)."""

_FIGURE_DEVICES = {"A100": "A100-SXM4-80GB", "H100": "H100-SXM"}
"""The figure's GPU -> the catalog device whose dense FP16 peak its efficiency is a fraction of."""

_HOPPER_ON = frozenset({"hopper", "blackwell"})
"""Architectures that take H100's measured efficiency (:func:`nearest_figure`); every other takes A100's."""


def figure_rate_flop_per_s(gpu: str, causal: bool, head_dim: int, seq: int, impl: str = "flash1") -> float:
    """The measured forward + backward FLOP/s of ``impl``'s figure (:data:`FIGURES`; FlashAttention-1's by
    default) on the figure's ``gpu`` (``A100`` or ``H100``): log2-interpolated in the sequence, linear in the
    head dimension, held beyond both ends."""
    x = min(max(math.log2(seq), math.log2(FA1_SEQS[0])), math.log2(FA1_SEQS[-1]))
    xs = [math.log2(s) for s in FA1_SEQS]
    lo, hi = (float(np.interp(x, xs, FIGURES[impl][(gpu, causal, d)])) for d in _HEAD_DIMS)
    w = min(max((head_dim - _HEAD_DIMS[0]) / (_HEAD_DIMS[1] - _HEAD_DIMS[0]), 0.0), 1.0)
    return (lo + w * (hi - lo)) * 1e12


def nearest_figure(device: DeviceSpec, impl: str = "flash1") -> tuple[str, bool]:
    """(the figure's GPU whose rate prices ``device``, whether that is an extrapolation): the figure's
    own GPU for the devices it measured (:data:`FA1_GPUS`), else H100 for the Hopper and Blackwell
    architectures and A100 for every other; a figure of H100 only (``flash2``) prices every device."""
    gpus = _FIGURE_GPUS[impl]
    measured = FA1_GPUS.get(kernel_twin(device))
    if measured in gpus:
        return measured, False
    nearest = "H100" if device.architecture in _HOPPER_ON else "A100"
    return (nearest if nearest in gpus else next(iter(sorted(gpus)))), True


class PublishedAttentionCost:
    """A kernel-time source (:class:`~opcast.predict.cost.query.KernelTimeSource`) for ``flash1`` and
    ``flash2`` attention: the module's rule. Its label says per kernel whether the rate was measured on the
    device or extrapolated (:meth:`source_label`); :attr:`notes` say which devices it priced how."""

    name = PUBLISHED

    def __init__(self) -> None:
        self.notes: list[str] = []
        """One line per device priced, for ``cost_sources``."""
        self._noted: set[tuple[str, str]] = set()

    def covers(self, k: Kernel) -> bool:
        return (
            k.kind == "attention"
            and k.param_dict.get("impl") in FIGURES
            and k.dtype in ("fp16", "bf16")
            and k.tensor_cores
        )

    def source_label(self, k: Kernel, device: DeviceSpec) -> str:
        impl = str(k.param_dict["impl"])
        gpu, extrapolated = nearest_figure(device, impl)
        return f"{PUBLISHED}/{impl}/extrapolated-from-{gpu}" if extrapolated else f"{PUBLISHED}/{impl}"

    def rate_flop_per_s(self, k: Kernel, device: DeviceSpec) -> float:
        """The FLOP/s ``k`` runs at on ``device`` (the module's rule); NaN where the device has no
        peak for its dtype (the next source then says so)."""
        p = k.param_dict
        impl = str(p["impl"])
        gpu, extrapolated = nearest_figure(device, impl)
        rate = figure_rate_flop_per_s(gpu, bool(p["causal"]), int(p["head_dim"]), int(p["seq_kv"]), impl)
        if not extrapolated:
            return rate
        try:
            peak = kernel_peak(k, device)
        except OpcastError:
            return math.nan
        figure_peak = get_device(_FIGURE_DEVICES[gpu]).peak_flops("fp16")
        return rate / figure_peak * peak

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        for impl in sorted({str(k.param_dict["impl"]) for k in kernels}):
            self._note(device, impl)
        out = []
        for k in kernels:
            rate = self.rate_flop_per_s(k, device)
            out.append(max(k.flops() / rate, k.bytes_moved() / device.mem_bw_bytes_per_s) if rate > 0 else math.nan)
        return np.array(out, dtype=float)

    def _note(self, device: DeviceSpec, impl: str) -> None:
        if (device.name, impl) in self._noted:
            return
        self._noted.add((device.name, impl))
        gpu, extrapolated = nearest_figure(device, impl)
        which = "FlashAttention-1" if impl == "flash1" else "FlashAttention-2"
        figure = "FlashAttention-2 paper Fig. 4 / its H100 figure" if impl == "flash1" else "its H100 release figure"
        if extrapolated:
            self.notes.append(
                f"{impl} attention on {device.name}: extrapolated, a roofline at the share of the dense fp16 peak "
                f"{which} measured on {_FIGURE_DEVICES[gpu]} ({figure}), times {device.name}'s peak "
                f"({device.architecture}: nearest measured architecture {gpu})"
            )
        else:
            self.notes.append(
                f"{impl} attention on {device.name}: {which}'s measured forward + backward rate ({figure}, {gpu})"
            )
