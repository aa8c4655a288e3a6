"""Training frameworks: which kernel implementation each op runs as, and what the framework keeps in
memory beyond the ZeRO paper's count (``--framework``, :attr:`opcast.predict.parallel.TrainConfig.framework`).

One table, read by the graph (:class:`opcast.predict.graph.Dtypes` gives every kernel its
``impl``) and by the memory model (:func:`opcast.predict.memory.model_state_bytes`):

- ``megatron`` (Megatron-LM / Megatron-Core with Transformer Engine or Apex): fused LayerNorm and
  RMSNorm (TE ``LayerNorm``/``RMSNorm``, Apex ``FusedLayerNorm``/``FusedRMSNorm``), Megatron's fused
  softmax kernels, the Python ``vocab_parallel_cross_entropy`` (unfused; ``--cross-entropy-loss-fusion``
  is off by default), and fp32 gradient accumulation: each parameter's ``main_grad`` is an fp32
  buffer (``--accumulate-allreduce-grads-in-fp32``, which Megatron-LM turns on for bf16), so
  mixed-precision Adam keeps 2 + 4 + 12 = 18 bytes a parameter, not 16: the Megatron Core
  distributed-optimizer guide (docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html)
  counts "float16 param, fp32 grads: 18" bytes (6 + 12/d with the distributed optimizer, i.e.
  ZeRO-1 here);
- ``neox`` (GPT-NeoX on DeepSpeed): its Python RMSNorm (``megatron/model/norms.py``, unfused),
  ``nn.LayerNorm``, Megatron's fused softmax, the Python vocab-parallel cross-entropy; 16-bit
  gradients (DeepSpeed's fp16/bf16 optimizer keeps fp32 master weights and moments only: 16 bytes);
- ``hf`` (Hugging Face Transformers with torch eager): ``LlamaRMSNorm`` as torch ops (unfused),
  ``nn.LayerNorm``, ``torch.softmax`` and ``F.cross_entropy`` (fused kernels); 16 bytes.

Not given (None): Megatron's kernels with the ZeRO paper's 16 bytes a parameter, opcast's pricing
before frameworks were named. Rope keeps the registry's default (unfused) everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from opcast.errors import OpcastError

FrameworkName = Literal["megatron", "neox", "hf"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Framework:
    """What one framework runs and keeps."""

    name: str
    impls: tuple[tuple[str, str], ...]
    """(op kind, registry ``impl``) of the kinds whose implementation the framework fixes."""
    fp32_grads: bool
    """Gradients accumulated in an fp32 ``main_grad`` buffer (4 bytes a parameter instead of 2) when
    training in 16-bit or fp8."""


_MEGATRON_KERNELS = (("layernorm", "fused"), ("rmsnorm", "fused"), ("softmax", "fused"), ("cross_entropy", "unfused"))

FRAMEWORKS: dict[str | None, Framework] = {
    None: Framework(name="default", impls=_MEGATRON_KERNELS, fp32_grads=False),
    "megatron": Framework(name="megatron", impls=_MEGATRON_KERNELS, fp32_grads=True),
    "neox": Framework(
        name="neox",
        impls=(("layernorm", "fused"), ("rmsnorm", "unfused"), ("softmax", "fused"), ("cross_entropy", "unfused")),
        fp32_grads=False,
    ),
    "hf": Framework(
        name="hf",
        impls=(("layernorm", "fused"), ("rmsnorm", "unfused"), ("softmax", "fused"), ("cross_entropy", "fused")),
        fp32_grads=False,
    ),
}
"""Every framework by its ``--framework`` name (None: not given)."""


def framework_of(name: str | None) -> Framework:
    """The :class:`Framework` called ``name`` (None: the default); an unknown name is refused."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise OpcastError(f"framework={name!r} is not one of {', '.join(get_args(FrameworkName))}") from None
