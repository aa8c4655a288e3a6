"""What is priced: a :class:`Kernel` (one unique op query), the rule of which kernels run on
tensor cores (the op registry's :func:`opcast.ops.uses_tensor_cores`, applied in :func:`kernel`), and the
:class:`KernelTimeSource` protocol every kernel-time source implements
(:mod:`~opcast.predict.cost.roofline`, :mod:`~opcast.predict.cost.learned`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from opcast.dtypes import element_bytes
from opcast.errors import OpcastError
from opcast.ops import get_op, uses_tensor_cores

if TYPE_CHECKING:
    from opcast.hardware import DeviceSpec

LEARNED = "learned"
ROOFLINE = "roofline"


# --------------------------------------------------------------------------- kernels


@dataclass(frozen=True, slots=True)
class Kernel:
    """One unique kernel query: hashable, so it is the cache key."""

    kind: str
    """Op registry kind."""
    params: tuple[tuple[str, int | bool | str], ...]
    """Shape parameters as (name, value) pairs in the registry's canonical order."""
    dtype: str
    """fp32 | tf32 | fp16 | bf16 | fp8 | fp8_block | nvfp4."""
    direction: str = "fwd"
    """fwd | bwd."""
    tensor_cores: bool = False
    """Matrix math runs on tensor cores (fp32: as TF32)."""

    @property
    def param_dict(self) -> dict[str, int | bool | str]:
        return dict(self.params)

    def flops(self) -> float:
        return get_op(self.kind).flops(self.param_dict, self.direction, element_bytes(self.dtype))

    def bytes_moved(self) -> float:
        return get_op(self.kind).bytes_moved(self.param_dict, element_bytes(self.dtype), self.direction)


def kernel(
    kind: str,
    params: Mapping[str, int | bool | str],
    dtype: str,
    direction: str = "fwd",
    tensor_cores: bool | None = None,
) -> Kernel:
    """A :class:`Kernel` with its parameters in canonical order (no validation: graph builders
    produce valid shapes by construction; user input goes through :func:`validated_kernel`).
    ``tensor_cores`` resolves by :func:`uses_tensor_cores`."""
    spec = get_op(kind)
    if spec.defaults and any(n not in params for n in spec.defaults):
        params = {**spec.defaults, **params}
    return Kernel(
        kind,
        tuple((n, params[n]) for n in spec.param_names),
        dtype,
        direction,
        uses_tensor_cores(kind, dtype, tensor_cores),
    )


def validated_kernel(
    kind: str, params: Mapping[str, object], dtype: str, direction: str = "fwd", tensor_cores: bool | None = None
) -> Kernel:
    """A kernel from user input: the registry coerces and checks every parameter."""
    spec = get_op(kind)
    if spec.collective:
        raise OpcastError(f"{kind} is a collective; cost it with opcast.predict.comm")
    element_bytes(dtype)
    clean = spec.validate(params, direction)
    return kernel(spec.kind.value, clean, dtype, direction, tensor_cores)


# --------------------------------------------------------------------------- sources


class KernelTimeSource(Protocol):
    """Anything that can time a batch of kernels on a device."""

    name: str
    """Label written next to every time it gives (``learned``, ``roofline``); a source may label each
    kernel instead with a ``source_label(kernel, device)`` method (``published/flash1/...``)."""

    def covers(self, k: Kernel) -> bool:
        """Whether this source speaks for ``k``'s (op, dtype, direction) group."""
        ...

    def predict_s(self, kernels: Sequence[Kernel], device: DeviceSpec) -> np.ndarray:
        """Seconds per call, one per kernel; NaN where the source has no answer."""
        ...
