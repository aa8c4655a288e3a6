"""Tensor-core throughput under sustained full load (a training step) against a kernel benchmark's burst.

Kernel databases time each shape in short bursts after warm-up (AIConfigurator's tables, ``opcast collect``), at or
near the boost clock. A training step runs its GEMMs back to back for minutes, and a GPU at its power cap lowers its
SM clock until it fits: the large GEMMs of a step run at the clock the power limit allows, not at boost. The one
public measurement of both regimes on the same GPU and shapes is stas00/ml-engineering's ``mamf-finder.py``
(``compute/accelerator/benchmarks/README.md``, "How MAMF and MSMF are defined", torch 2.14 + CUDA 13.0): MAMF, the
median of a shape's 5 fastest boost-clock iterations after an idle gap, and MSMF, the highest rate a shape holds over
a 2-4 s window after 20 s at full load, both searched over the same shapes, every GPU of an 8-GPU node computing
(``mamf-finder-all-gpus.py``; the node median GPU):

====== ============ ==================== ==================== ========
GPU    dtype        MAMF (TFLOP/s)       MSMF (TFLOP/s)       fraction
====== ============ ==================== ==================== ========
H200   bf16         852.1 (8 GPUs x 5)   755 (node median)    0.886
B200   bf16         1746.7 (8 GPUs x 5)  1439 (node median)   0.824
====== ============ ==================== ==================== ========

:data:`SUSTAINED` holds those fractions; :func:`sustained_times` applies them: a tensor-core kernel (GEMM, attention)
whose burst time reaches at least :data:`AT_CAP_UTILISATION` of the device's dense peak for its dtype takes
``time / fraction``; every other kernel keeps its time (memory-, latency- and launch-bound kernels draw well under
the cap: "boost bursts draw only ~150-330 W", the same README). What is assumed, not measured:

- the fraction of the largest GEMMs holds for every compute-bound kernel of the step. The same README shows a shape
  that is not throttled: on an H200, 2816x1536x4096 sustains 722 TFLOP/s at the 1980 MHz ceiling, below the 700 W
  cap, while the same (M, N) at K = 20480 bursts ~835 and sustains 727. Where a kernel draws power between those, the
  truth lies between its burst time and this one.
- bf16's fraction stands for fp8 and the block-scaled dtypes (no MSMF of the same runs in fp8; an earlier table of
  the README, other torch versions, puts H200 fp8 at ~1335 sustained against 1453 burst, 0.92).
- H100-SXM and H800 take H200's fraction: the same GH100 die at the same 700 W board power (the README's MAMF table
  lists H200 "the same" as H100 SXM; :func:`sustained_clock`). GPUs of other dies or board power (GB200 at 1200 W,
  GH200 at 1000 W, B300, GB300, A100) have no measurement and keep their burst times.

Measured on held-out end-to-end runs (nothing fitted to them; ``benchmarks/results/nemo_public.md``,
``mosaicml.md``): NeMo's DGX-H100 rows 9.4 -> 5.3 % mean error, DGX-B200 FP8 21.6 -> 11.2 %; MosaicML's H100 bf16
rows 14.1 / 12.4 -> 7.3 / 9.4 %, its H100 fp8 rows 10.6 -> 12.0 % (predicted slower than measured already).
Two other rules were measured on the same rows and not kept: the sustained rate as a cap, ``max(t, FLOPs / MSMF)``
(the large GEMMs there burst at about the MSMF already: NeMo's dense rows 13.2 -> 13.1 %), and the roofline's ridge
as the gate instead of the burst utilisation (every kernel of high arithmetic intensity, however slow: NeMo 9.3 %, but
MosaicML's H100 fp8 rows 10.6 -> 21.3 %). The gate is the physics above, not a fit: a kernel far below the peak is
not what holds the GPU at its power cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from opcast.hardware import DeviceSpec, base_name, catalog, same_die
from opcast.predict.cost.query import Kernel

SUSTAINED_KINDS: Final = frozenset({"gemm", "attention"})
"""Kernels that run on the tensor cores at a rate the SM clock sets (learned or roofline)."""

AT_CAP_UTILISATION: Final = 0.5
"""Share of the dense peak of its dtype from which a kernel's burst rate counts as one that holds the GPU at its
power cap under sustained load (an assumption, see the module docstring)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SustainedClock:
    """Burst and sustained tensor-core rates of one GPU, measured in the same runs."""

    burst_flops: float
    """MAMF: the boost-clock rate of the best shape, FLOP/s."""
    sustained_flops: float
    """MSMF: the highest rate a shape holds under sustained full load, FLOP/s."""
    source: str

    @property
    def fraction(self) -> float:
        """Sustained over burst: what a compute-bound kernel keeps of its burst rate."""
        return self.sustained_flops / self.burst_flops


_MAMF_README: Final = (
    "stas00/ml-engineering mamf-finder-all-gpus.py, compute/accelerator/benchmarks/README.md, torch 2.14.0+cu130"
)
SUSTAINED: Final[dict[str, SustainedClock]] = {
    "H200": SustainedClock(
        burst_flops=852.1e12, sustained_flops=755e12, source=f"H200 bf16 852 -> 755 TFLOP/s, {_MAMF_README}"
    ),
    "B200": SustainedClock(
        burst_flops=1746.7e12, sustained_flops=1439e12, source=f"B200 bf16 1747 -> 1439 TFLOP/s, {_MAMF_README}"
    ),
}
"""Measured sustained clocks by catalog GPU."""


def sustained_clock(device: DeviceSpec) -> SustainedClock | None:
    """``device``'s measured sustained clock, or None where none is measured. A GPU made from a catalog GPU
    (``--cluster``, ``--set``, ``opcast whatif``: :func:`opcast.hardware.base_name`) is that GPU at its power cap: a
    what-if of an H100 with twice the bandwidth is still an H100, so doubling every throughput halves a step's time
    exactly. A GPU of a measured GPU's compute die at the same board power (:func:`opcast.hardware.same_die`, equal
    ``tdp_w``) takes its measurement: H100-SXM and H800 (GH100 at 700 W) take H200's; GH200 (1000 W) does not."""
    gpus = catalog()
    base = gpus.get(base_name(device), device)
    for name, clock in SUSTAINED.items():
        measured = gpus[name]
        if base.name == name or (same_die(base, measured) and base.tdp_w == measured.tdp_w):
            return clock
    return None


def at_cap(k: Kernel, time_s: float, device: DeviceSpec) -> bool:
    """Whether ``k``, taking ``time_s`` in a burst on ``device``, is a kernel the power cap slows under sustained load:
    a tensor-core kernel reaching :data:`AT_CAP_UTILISATION` of its dtype's dense peak."""
    if k.kind not in SUSTAINED_KINDS or not k.tensor_cores or time_s <= 0 or not device.supports(k.dtype):
        return False
    return k.flops() / time_s >= AT_CAP_UTILISATION * device.peak_flops(k.dtype)


def sustained_times(
    table: Mapping[Kernel, tuple[float, str]], device: DeviceSpec, step: Iterable[Kernel] | None = None
) -> tuple[Mapping[Kernel, tuple[float, str]], int]:
    """``table`` (a :meth:`~opcast.predict.cost.KernelCostModel.lookup` answer, which holds every kernel the model has
    priced on ``device``) with the kernels of ``step`` (default: all of them) as they run in a step under sustained
    load, and how many of them it slowed: each kernel :func:`at_cap` takes its time over the device's
    :attr:`SustainedClock.fraction` (its source unchanged); ``table`` itself, and 0, when the device has no measured
    sustained clock."""
    clock = sustained_clock(device)
    if clock is None:
        return table, 0
    mine = table.keys() if step is None else set(step)
    slowed = {k: table[k] for k in mine if at_cap(k, table[k][0], device)}
    out = dict(table)
    out.update((k, (t / clock.fraction, src)) for k, (t, src) in slowed.items())
    return out, len(slowed)


def sustained_note(device: DeviceSpec, slowed: int) -> str:
    """What a prediction says of the kernels :func:`sustained_times` slowed on ``device``."""
    clock = sustained_clock(device)
    assert clock is not None
    return (
        f"{slowed} compute-bound GEMM / attention kernels at the sustained clock of {base_name(device)} at its power "
        f"cap: {clock.fraction:.3f} of their burst rate ({clock.source}); --clocks boost prices the bursts"
    )
