"""Kernel times: one small protocol, a learned source and a flagged roofline fallback, cached.

A :class:`Kernel` is one unique op query ``(kind, params, dtype, direction, tensor_cores)``. A
*kernel-time source* (:class:`KernelTimeSource`) turns a batch of them into seconds on a device,
NaN where it cannot speak. :class:`KernelCostModel` asks its sources in order, labels every
answer with the source that gave it (``learned`` or ``roofline``) and caches it per device, so a
layer repeated 96 times, or a config search over thousands of layouts, costs each unique kernel
once.

Sources:

- :class:`LearnedKernelCost` wraps ``opcast.train.artifacts.ModelSet`` (``--models DIR`` or the
  embedded default); it answers only the (op, dtype, direction) groups the set covers. A device
  outside the hardware a predictor was fitted on (:class:`HardwareRange`, from the training
  devices' specs recorded in ``meta.json``) is an extrapolation: the answer is flagged, and with
  ``in_range_only`` (the CLI's ``--analytic``) the roofline answers instead, flagged too.
- :class:`PublishedAttentionCost` prices attention of the FlashAttention-1 generation (registry
  ``impl`` ``flash1``, which no learned model has data of) at FlashAttention-1's published measured
  rate, and FlashAttention-2's on Hopper and Blackwell (``flash2``) at its published H100 rate; on GPUs
  the figures did not measure at the nearest architecture's share of peak, its label saying so
  (``published/flash1``, ``published/flash1/extrapolated-from-A100``, ``published/flash2/extrapolated-from-H100``);
  it sits between the learned source and the roofline and covers nothing else.
- :class:`RooflineKernelCost`, the fallback, is ``max(FLOPs / (peak x eff_c), bytes / (bw x eff_m))``
  with the efficiencies of :data:`ROOFLINE_EFFICIENCY`. It has no constant terms, so a GPU with
  every spec doubled is exactly twice as fast on this path.

:func:`bottleneck` says where a kernel sits on the roofline of a device (compute- or memory-bound,
arithmetic intensity against the ridge point) and how much of the peak its predicted time uses.
Every learned answer is held to physical bounds (:data:`BOUND_RULES`, listed in
:mod:`~opcast.predict.cost.learned`), reported by :meth:`KernelCostModel.bound_flag` and in
``describe()``.

One module per concern; this package re-exports their public names, so import from
``opcast.predict.cost``:

- :mod:`~opcast.predict.cost.query`     :class:`Kernel`, :func:`kernel`, :func:`validated_kernel` and
  the :class:`KernelTimeSource` protocol; the tensor-core rule is the op registry's
  (:func:`opcast.ops.uses_tensor_cores`, :data:`opcast.ops.MATRIX_KINDS`), importable from here too;
- :mod:`~opcast.predict.cost.roofline`  the analytic price: :class:`RooflineKernelCost`,
  :func:`kernel_peak`, :func:`kernel_resources` (:data:`Resources`), :func:`slower_at_most`, :func:`bottleneck`,
  :func:`peak_roofline_s`;
- :mod:`~opcast.predict.cost.learned`   :class:`LearnedKernelCost`, its range checks
  (:class:`HardwareRange`) and the physical bounds;
- :mod:`~opcast.predict.cost.published` :class:`PublishedAttentionCost` and the figures it prices with;
- :mod:`~opcast.predict.cost.model`     the composition, :class:`KernelCostModel` (with
  :func:`decompose` for eager attention), and the entry points :func:`load_kernel_cost` and
  :func:`roofline_only`.

Collectives are not kernels here: :mod:`opcast.predict.comm` costs them.
"""

from __future__ import annotations

from opcast.ops import MATRIX_KINDS as MATRIX_KINDS  # the op registry's tensor-core rule, not redefined here
from opcast.ops import uses_tensor_cores as uses_tensor_cores
from opcast.predict.cost.learned import (
    BOUND_RULES,
    DIE,
    FLOOR,
    MONOTONE,
    RANGE_SLACK,
    RATIO,
    SPAN,
    UTILISATION_MARGIN,
    WAVE_DIMS,
    WAVE_NOTE,
    WAVE_TILE,
    HardwareRange,
    LearnedKernelCost,
    wave_factor,
)
from opcast.predict.cost.model import (
    BOUNDS_ENV,
    DECOMPOSED_KINDS,
    KernelCostModel,
    decompose,
    load_kernel_cost,
    models_flag_problem,
    physical_bounds_enabled,
    roofline_only,
)
from opcast.predict.cost.published import (
    FA1_FWD_BWD_TFLOPS,
    FA1_GPUS,
    FA1_SEQS,
    FA2_FWD_BWD_TFLOPS,
    FIGURES,
    PUBLISHED,
    PublishedAttentionCost,
    figure_rate_flop_per_s,
    nearest_figure,
)
from opcast.predict.cost.query import (
    LEARNED,
    ROOFLINE,
    Kernel,
    KernelTimeSource,
    kernel,
    validated_kernel,
)
from opcast.predict.cost.roofline import (
    ROOFLINE_EFFICIENCY,
    Bottleneck,
    EfficiencyCurve,
    Resources,
    RooflineEfficiency,
    RooflineKernelCost,
    RooflineTerms,
    bottleneck,
    kernel_peak,
    kernel_resources,
    peak_roofline_s,
    slower_at_most,
)

__all__ = [
    "BOUNDS_ENV",
    "BOUND_RULES",
    "DECOMPOSED_KINDS",
    "DIE",
    "FA1_FWD_BWD_TFLOPS",
    "FA1_GPUS",
    "FA1_SEQS",
    "FA2_FWD_BWD_TFLOPS",
    "FIGURES",
    "FLOOR",
    "LEARNED",
    "MONOTONE",
    "PUBLISHED",
    "RANGE_SLACK",
    "RATIO",
    "ROOFLINE",
    "ROOFLINE_EFFICIENCY",
    "SPAN",
    "UTILISATION_MARGIN",
    "WAVE_DIMS",
    "WAVE_NOTE",
    "WAVE_TILE",
    "Bottleneck",
    "EfficiencyCurve",
    "HardwareRange",
    "Kernel",
    "KernelCostModel",
    "KernelTimeSource",
    "LearnedKernelCost",
    "PublishedAttentionCost",
    "Resources",
    "RooflineEfficiency",
    "RooflineKernelCost",
    "RooflineTerms",
    "bottleneck",
    "decompose",
    "figure_rate_flop_per_s",
    "kernel",
    "kernel_peak",
    "kernel_resources",
    "load_kernel_cost",
    "models_flag_problem",
    "nearest_figure",
    "peak_roofline_s",
    "physical_bounds_enabled",
    "roofline_only",
    "slower_at_most",
    "validated_kernel",
    "wave_factor",
]
