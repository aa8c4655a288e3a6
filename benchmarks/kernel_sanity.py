"""Cross-GPU sanity of kernel predictions: can any GPU contradict what opcast says (issue 21)?

    python benchmarks/kernel_sanity.py [--models DIR] [--json FILE] [--check]

A fixed set of large and small bf16 kernels, every op of the registry that is one kernel (GEMM,
flash attention, layernorm, rmsnorm, softmax, cross-entropy, elementwise, rope, embedding, the
Adam step), forward and backward where the op has one, priced with the learned models
(``--models DIR``, else the embedded default; the roofline where they do not cover) on every
catalog NVIDIA GPU with a bf16 peak: the data-centre line A100-SXM4-80GB, H100-SXM, H200, B200,
GB200 in the first table, the others in the second. Run it on each refit of ``models/default``.

For each kernel and GPU it reports the utilisation of the kernel's bounding resource (its time
at the datasheet peaks, ``max(FLOPs / peak, bytes / bandwidth)``, over the predicted time), and
for every pair of GPUs of a table the speed-up against the ratio of those roofline times (the
ratio of the resource that bounds the kernel). Violations, each listed:

- ``utilisation``: a time faster than the roofline at the peak (utilisation above 100 %);
- ``speed-up``: a GPU faster than one with less of the resource that bounds the kernel by more
  than 1.15x the ratio of their roofline times (a GPU with more of it reaching a *smaller* share
  of its peak is allowed: newer GPUs do);
- ``monotone``: a GPU with at least the peak and the bandwidth of another is slower, beyond their clock ratio
  where the other has the higher clock (:func:`opcast.predict.cost.slower_at_most`).

Everything is run twice: with the physical bounds of :mod:`opcast.predict.cost` off (what the
models say) and on (what opcast reports), and the violation counts of both are printed. Norms,
softmax and cross-entropy are priced in the registry's default implementation (``impl`` fused:
one-pass Apex / Transformer Engine / Megatron CUDA kernels), the large norms and softmax also
``native`` (torch's single-launch multi-pass kernels: ``nn.LayerNorm``, ``nn.Softmax``, vLLM's 2023
RMSNorm) and ``liger`` (Liger-Kernel's Triton kernels), and RMSNorm and cross-entropy also unfused
(GPT-NeoX's Python RMSNorm, Megatron's Python vocab-parallel cross-entropy), the implementations the
published half-precision data measured.
The issue's second target, large fused norms and softmax at >= 40 % of memory bandwidth, is
reported for the fused ones. An implementation the
models have no data of is priced as the learned elementwise kernel that streams its traffic (the no-data
rule, :func:`opcast.predict.cost.model.decompose`).

The quantised GEMMs (per-tensor fp8, block-scaled fp8 and NVFP4: what ``--precision fp8 / mxfp8 / nvfp4``
prices) get a table each, the large and small GEMM forward on every catalog NVIDIA GPU with a peak for
the dtype, with their violations (not part of ``--check``: the issue's target is the bf16 table).

``--check`` exits 1 when the first table has a violation with the bounds on. ``--json FILE``
writes every number.

``--measured DIR`` (a dataset folder of measured rows, e.g. ``opcast collect replay aiconfigurator
--out DIR``, or the published folder a model set was fitted from) puts beside each speed-up and
monotone violation what the measurements say about the same pair of GPUs: the shape of the same
op, direction and dtype class (half: bf16 and fp16) nearest to the kernel that was measured on
both GPUs (its implementation and other choices equal; numeric parameters by log distance), the
measured times (median over rows), their speed-up and the ratio of the roofline times at that
shape, and whether the data themselves break the rule (then a model that follows its data cannot
meet it: small kernels are latency-bound, which the resource ratio does not describe) or keep it
(then the violation is the model's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRIMARY = ("A100-SXM4-80GB", "H100-SXM", "H200", "B200", "GB200")
"""The data-centre GPUs users compare: the first table (the issue's zero-violation target)."""
FITTED = ("A100-SXM4-80GB", "GH200")
"""The GPUs most half-precision predictors of models/default were fitted on: their own predictions
against each other (no bound but the roofline floor applies there) show which violations of the
first table the training data hand down."""
DTYPE = "bf16"
SPEEDUP_SLACK = 1.15
"""A speed-up may exceed the ratio of the bounding resource by this factor before it is a violation."""
FUSED_TARGET = 0.40
"""Issue 21: large fused norms and softmax at >= 40 % of memory bandwidth."""

QUANTISED_DTYPES = ("fp8", "fp8_block", "nvfp4")
"""The quantised GEMM dtypes (per-tensor fp8, block-scaled fp8, NVFP4) checked in their own tables:
the GEMMs' large and small shapes on every catalog NVIDIA GPU with a peak for the dtype."""

_ATT = {"kv_heads": None, "causal": True, "impl": "flash"}
KERNELS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    # (label, op, params): a large and a small shape of each op
    ("gemm large", "gemm", {"b": 1, "m": 8192, "n": 8192, "k": 8192}),
    ("gemm small", "gemm", {"b": 1, "m": 512, "n": 512, "k": 512}),
    (
        "attention large",
        "attention",
        {
            "batch": 4,
            "heads": 32,
            "kv_heads": 32,
            "seq_q": 4096,
            "seq_kv": 4096,
            "head_dim": 128,
            "causal": True,
            "impl": "flash",
        },
    ),
    (
        "attention small",
        "attention",
        {
            "batch": 1,
            "heads": 8,
            "kv_heads": 8,
            "seq_q": 512,
            "seq_kv": 512,
            "head_dim": 64,
            "causal": True,
            "impl": "flash",
        },
    ),
    ("layernorm large", "layernorm", {"rows": 16384, "cols": 12288}),
    ("layernorm small", "layernorm", {"rows": 1024, "cols": 1024}),
    ("rmsnorm large", "rmsnorm", {"rows": 16384, "cols": 8192}),
    ("rmsnorm small", "rmsnorm", {"rows": 1024, "cols": 1024}),
    ("softmax large", "softmax", {"rows": 65536, "cols": 4096}),
    ("softmax small", "softmax", {"rows": 1024, "cols": 1024}),
    ("cross_entropy large", "cross_entropy", {"tokens": 8192, "vocab": 50304}),
    ("cross_entropy small", "cross_entropy", {"tokens": 512, "vocab": 32000}),
    ("rmsnorm unfused large", "rmsnorm", {"rows": 16384, "cols": 8192, "impl": "unfused"}),
    ("rmsnorm unfused small", "rmsnorm", {"rows": 1024, "cols": 1024, "impl": "unfused"}),
    ("cross_entropy unfused large", "cross_entropy", {"tokens": 8192, "vocab": 50304, "impl": "unfused"}),
    ("cross_entropy unfused small", "cross_entropy", {"tokens": 512, "vocab": 32000, "impl": "unfused"}),
    ("layernorm native large", "layernorm", {"rows": 16384, "cols": 12288, "impl": "native"}),
    ("rmsnorm native large", "rmsnorm", {"rows": 16384, "cols": 8192, "impl": "native"}),
    ("softmax native large", "softmax", {"rows": 65536, "cols": 4096, "impl": "native"}),
    ("layernorm liger large", "layernorm", {"rows": 16384, "cols": 12288, "impl": "liger"}),
    ("rmsnorm liger large", "rmsnorm", {"rows": 16384, "cols": 8192, "impl": "liger"}),
    ("elementwise large", "elementwise", {"numel": 1 << 28, "fn": "gelu"}),
    ("elementwise small", "elementwise", {"numel": 1 << 20, "fn": "gelu"}),
    ("rope large", "rope", {"tokens": 16384, "heads": 32, "head_dim": 128}),
    ("rope small", "rope", {"tokens": 1024, "heads": 8, "head_dim": 128}),
    ("embedding large", "embedding", {"tokens": 16384, "vocab": 50304, "hidden": 4096}),
    ("embedding small", "embedding", {"tokens": 1024, "vocab": 32000, "hidden": 1024}),
    ("optimizer large", "optimizer", {"numel": 1 << 28}),
    ("optimizer small", "optimizer", {"numel": 1 << 20}),
)
FUSED_LABELS = ("layernorm large", "rmsnorm large", "softmax large")


@dataclass(frozen=True, slots=True)
class Cell:
    """One kernel on one GPU."""

    time_s: float
    source: str
    roof_s: float
    """Roofline time at the datasheet peaks."""
    resource: str
    """compute | memory: what bounds the kernel on this GPU."""
    bound: str | None
    """The physical-bound rule that moved the time, if any."""
    why: str | None = None
    """What that rule says (the reference device and its utilisation), if any."""

    @property
    def utilisation(self) -> float:
        return self.roof_s / self.time_s if self.time_s > 0 else math.inf


def kernel_set(dtype: str = DTYPE) -> list[tuple[str, Any]]:
    """(label, Kernel) of every kernel of :data:`KERNELS` in each of its directions; for a quantised
    ``dtype`` (:data:`QUANTISED_DTYPES`) the GEMMs' forward only, as those groups are measured."""
    from opcast.ops import get_op
    from opcast.predict.cost import validated_kernel

    out = []
    for label, op, params in KERNELS:
        if dtype in QUANTISED_DTYPES and op != "gemm":
            continue
        spec = get_op(op)
        clean = spec.validate(params)
        for direction in spec.directions(clean):
            if dtype in QUANTISED_DTYPES and direction.value != "fwd":
                continue
            out.append((f"{label} {direction.value}", validated_kernel(op, clean, dtype, direction.value)))
    return out


def gpus() -> tuple[list[Any], list[Any], list[str]]:
    """(first table, second table, skipped NVIDIA GPUs without a bf16 peak) as DeviceSpecs."""
    from opcast.hardware import catalog, get_device

    first = [get_device(n) for n in PRIMARY]
    others = sorted(
        (d for d in catalog().values() if d.vendor == "nvidia" and d.name not in PRIMARY),
        key=lambda d: (d.peak_bf16_flops or 0.0, d.mem_bw_bytes_per_s),
    )
    second = [d for d in others if d.supports(DTYPE)]
    skipped = [d.name for d in others if not d.supports(DTYPE)]
    return first, second, skipped


def price(
    models: str | None, bounds: bool, kernels: Sequence[tuple[str, Any]], devices: Sequence[Any]
) -> dict[str, dict[str, Cell]]:
    """label -> GPU name -> :class:`Cell`, with the physical bounds on or off."""
    import dataclasses

    from opcast.predict.cost import load_kernel_cost, peak_roofline_s

    cost = dataclasses.replace(load_kernel_cost(models), physical_bounds=bounds)
    ks = [k for _, k in kernels]
    out: dict[str, dict[str, Cell]] = {label: {} for label, _ in kernels}
    for dev in devices:
        table = cost.lookup(ks, dev)
        flags = cost.bound_flags(dev)
        for label, k in kernels:
            t, src = table[k]
            roof, resource = peak_roofline_s(k, dev)
            rule, why = flags.get(k, (None, None))
            out[label][dev.name] = Cell(t, src, roof, resource, rule, why)
    return out


def violations(
    cells: dict[str, dict[str, Cell]],
    devices: Sequence[Any],
    measured: Measured | None = None,
    kernels: Sequence[tuple[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every violation of one table (see the module docstring); with ``measured``
    (:func:`load_measured`), each speed-up and monotone violation carries ``measured``: what the
    nearest shape measured on the same pair says (:func:`nearest_measured`; None where there is none)."""
    from opcast.predict.cost import kernel_resources, slower_at_most

    out: list[dict[str, Any]] = []
    by_label = dict(kernels if kernels is not None else kernel_set())
    for label, row in cells.items():
        k = by_label[label]
        for dev in devices:
            c = row[dev.name]
            if c.utilisation > 1.0 + 1e-9:
                out.append(
                    {
                        "rule": "utilisation",
                        "kernel": label,
                        "gpu": dev.name,
                        "source": c.source,
                        "what": f"{100 * c.utilisation:.0f} % of its {c.resource} roofline",
                    }
                )
        for a in devices:
            for b in devices:
                if a is b:
                    continue
                ca, cb = row[a.name], row[b.name]
                speedup, ratio = ca.time_s / cb.time_s, ca.roof_s / cb.roof_s
                if ratio >= 1.0 and speedup > SPEEDUP_SLACK * ratio:  # b has at least a's bounding resource
                    out.append(
                        {
                            "rule": "speed-up",
                            "kernel": label,
                            "gpu": f"{b.name} vs {a.name}",
                            "source": f"{_src(cb)}/{_src(ca)}",
                            "what": f"{speedup:.2f}x faster, {cb.resource}-bound ratio {ratio:.2f}x "
                            f"({speedup / ratio:.2f}x the ratio)",
                        }
                    )
                    if measured is not None:
                        out[-1]["measured"] = nearest_measured(measured, k, a, b)
                f = slower_at_most(kernel_resources(k, b), kernel_resources(k, a))
                if f is not None and cb.time_s > ca.time_s * f * (1 + 1e-9):
                    out.append(
                        {
                            "rule": "monotone",
                            "kernel": label,
                            "gpu": f"{b.name} vs {a.name}",
                            "source": f"{_src(cb)}/{_src(ca)}",
                            "what": f"{b.name} has more peak and bandwidth but is {cb.time_s / ca.time_s:.2f}x slower "
                            f"(the clock ratio allows {f:.2f}x) "
                            f"({cb.time_s * 1e6:.1f} vs {ca.time_s * 1e6:.1f} us)",
                        }
                    )
                    if measured is not None:
                        out[-1]["measured"] = nearest_measured(measured, k, a, b)
    return out


Measured = dict[tuple[str, str, str], dict[str, dict[tuple[Any, ...], float]]]
"""(op, direction, dtype class) -> GPU name -> shape (the op's parameters in registry order) ->
median measured seconds."""


def load_measured(path: Path, kernels: Sequence[tuple[str, Any]], devices: Sequence[Any]) -> Measured:
    """The measured rows of dataset ``path`` (:func:`opcast.schema.read_dataset`) of the ops,
    directions and dtype classes of ``kernels`` on ``devices``, as :data:`Measured`."""
    import pandas as pd

    from opcast.ops import get_op
    from opcast.schema import canonical_value, read_dataset
    from opcast.train.features import dtype_class

    frame = read_dataset(path)
    wanted = {(k.kind, k.direction, dtype_class(k.kind, k.dtype, k.tensor_cores)) for _, k in kernels}
    names = {d.name for d in devices}
    frame = frame[frame["device"].isin(names) & frame["op"].isin({op for op, _, _ in wanted})]
    frame = frame[frame["time_s_median"] > 0]
    combos = frame[["op", "dtype", "tensor_cores"]].astype(object).drop_duplicates()
    classes = {
        (op, dtype, cores): dtype_class(str(op), str(dtype), True if pd.isna(cores) else bool(cores))
        for op, dtype, cores in combos.itertuples(index=False, name=None)
    }
    frame = frame.assign(
        dtype_class=[
            classes[key]
            for key in frame[["op", "dtype", "tensor_cores"]].astype(object).itertuples(index=False, name=None)
        ]
    )
    out: Measured = {}
    for (op, direction, cls), rows in frame.groupby(["op", "direction", "dtype_class"], sort=False):
        if (op, direction, cls) not in wanted:
            continue
        spec = get_op(str(op))
        params = list(spec.param_names)
        defaults = [p.default for p in spec.params]  # a row without a value has the parameter's default
        table = out.setdefault((str(op), str(direction), str(cls)), {})
        medians = rows.groupby(["device", *params], dropna=False, sort=False)["time_s_median"].median()
        index = medians.index.to_frame(index=False).astype(object)
        index = index.where(index.notna(), None)
        for key, seconds in zip(index.itertuples(index=False, name=None), medians.to_numpy(dtype=float)):
            shape = tuple(d if v is None else canonical_value(v) for v, d in zip(key[1:], defaults))
            table.setdefault(str(key[0]), {})[shape] = float(seconds)
    return out


def _distance(mine: dict[str, Any], names: Sequence[str], shape: tuple[Any, ...]) -> float:
    """Log distance of a measured ``shape`` from a kernel's parameters ``mine``; inf where a
    non-numeric parameter (implementation, causal mask, function) differs."""
    total = 0.0
    for name, theirs in zip(names, shape):
        ours = mine.get(name)
        if ours is None or theirs is None:
            total += 0.0 if ours is theirs else 1.0
        elif isinstance(ours, bool) or isinstance(theirs, bool) or isinstance(ours, str) or isinstance(theirs, str):
            if ours != theirs:
                return math.inf
        elif ours > 0 and theirs > 0:
            total += math.log(float(theirs) / float(ours)) ** 2
        elif ours != theirs:
            total += 1.0
    return total


_DISTANCES: dict[Any, dict[tuple[Any, ...], float]] = {}
"""Kernel -> measured shape -> :func:`_distance` (a violation of every pair asks again)."""


def nearest_measured(measured: Measured, k: Any, a: Any, b: Any) -> dict[str, Any] | None:
    """What the measurements say about GPU ``b`` against GPU ``a`` on kernel ``k``: the shape nearest
    to ``k`` (:func:`_distance`) measured on both, the two measured times, their speed-up (``a``'s time
    over ``b``'s), the ratio of the roofline times there and whether the data break the speed-up rule
    (a speed-up above :data:`SPEEDUP_SLACK` times the ratio) or the monotone one (``b``, with at least
    ``a``'s peak and bandwidth, slower beyond their clock ratio); None where no shape was measured on both."""
    from opcast.errors import OpcastError
    from opcast.ops import get_op
    from opcast.predict.cost import kernel_resources, peak_roofline_s, slower_at_most, validated_kernel
    from opcast.schema import ID_NEUTRAL
    from opcast.train.features import dtype_class

    table = measured.get((k.kind, k.direction, dtype_class(k.kind, k.dtype, k.tensor_cores)), {})
    on_a, on_b = table.get(a.name, {}), table.get(b.name, {})
    names = list(get_op(k.kind).param_names)
    mine = k.param_dict
    memo = _DISTANCES.setdefault(k, {})
    for s in on_a.keys() - memo.keys():
        memo[s] = _distance(mine, names, s)
    common = [s for s in on_a if s in on_b and math.isfinite(memo[s])]
    if not common:
        return None
    best = min(memo[s] for s in common)
    shape = min((s for s in common if memo[s] == best), key=repr)
    params = {n: v for n, v in zip(names, shape) if v is not None}
    neutral = ID_NEUTRAL.get(k.kind, {})  # a GEMM's default family is no part of its shape's name
    shown = {n: v for n, v in params.items() if not (n in neutral and v == neutral[n])}
    t_a, t_b = on_a[shape], on_b[shape]
    speedup = t_a / t_b
    try:
        at = validated_kernel(k.kind, params, k.dtype, k.direction, k.tensor_cores)
        ratio = peak_roofline_s(at, a)[0] / peak_roofline_s(at, b)[0]
        f = slower_at_most(kernel_resources(at, b), kernel_resources(at, a))
    except OpcastError:  # a measured shape the registry rejects: report the times only
        ratio, f = math.nan, None
    return {
        "shape": " ".join(f"{n}={v}" for n, v in shown.items()),
        "exact": _distance(mine, names, shape) == 0.0,
        "time_s": {a.name: t_a, b.name: t_b},
        "speedup": speedup,
        "ratio": ratio,
        "breaks_speedup_rule": bool(ratio >= 1.0 and speedup > SPEEDUP_SLACK * ratio),
        "breaks_monotone_rule": bool(f is not None and t_b > t_a * f * (1 + 1e-9)),
    }


def _measured_text(m: dict[str, Any] | None, rule: str) -> str:
    """One line for the ``measured`` entry of a violation of ``rule`` (speed-up or monotone)."""
    if m is None:
        return "measured: no shape of this kernel measured on both GPUs"
    (a, t_a), (b, t_b) = m["time_s"].items()
    ratio = f", {m['speedup'] / m['ratio']:.2f}x the ratio ({m['ratio']:.2f}x)" if math.isfinite(m["ratio"]) else ""
    broken = m["breaks_speedup_rule" if rule == "speed-up" else "breaks_monotone_rule"]
    verdict = f"the data break the {rule} rule too" if broken else f"the data keep the {rule} rule: the model breaks it"
    where = "the same shape" if m["exact"] else f"nearest shape {m['shape']}"
    return f"measured ({where}): {b} {t_b * 1e6:.1f} us, {a} {t_a * 1e6:.1f} us: {m['speedup']:.2f}x{ratio}; {verdict}"


def _src(c: Cell) -> str:
    return c.source + (f" ({c.bound})" if c.bound else "")


def _util_table(title: str, cells: dict[str, dict[str, Cell]], devices: Sequence[Any]) -> list[str]:
    names = [d.name for d in devices]
    width = max(len(n) for n in names) + 1
    lines = [title, f"{'kernel':32s}" + "".join(f"{n:>{width}s}" for n in names)]
    for label, row in cells.items():
        text = []
        for n in names:
            c = row[n]
            mark = "r" if c.source != "learned" else ("*" if c.bound else " ")
            text.append(f"{100 * c.utilisation:>{width - 2}.0f}%{mark}")
        lines.append(f"{label:32s}" + "".join(text))
    lines.append(
        "  utilisation of the bounding resource at the datasheet peak; r: roofline fallback, "
        "*: a physical bound moved the learned time"
    )
    return lines


def _speedup_table(cells: dict[str, dict[str, Cell]], devices: Sequence[Any]) -> list[str]:
    base = devices[0].name
    names = [d.name for d in devices[1:]]
    lines = [
        f"speed-up over {base}: predicted / ratio of the roofline times (the bounding resource)",
        f"{'kernel':32s}" + "".join(f"{n:>18s}" for n in names),
    ]
    for label, row in cells.items():
        a = row[base]
        lines.append(
            f"{label:32s}"
            + "".join(
                f"{a.time_s / row[n].time_s:>9.2f}/{a.roof_s / row[n].roof_s:<7.2f}"
                + (" " if a.time_s / row[n].time_s <= SPEEDUP_SLACK * a.roof_s / row[n].roof_s else "!")
                for n in names
            )
        )
    return lines


def _fused_lines(cells: dict[str, dict[str, Cell]], devices: Sequence[Any]) -> list[str]:
    lines = [f"large norms and softmax against the fused-kernel target (>= {FUSED_TARGET:.0%} of memory bandwidth):"]
    short = 0
    for label, row in cells.items():
        if label.rsplit(" ", 1)[0] not in FUSED_LABELS:
            continue
        utils = [row[d.name].utilisation for d in devices]
        short += sum(u < FUSED_TARGET for u in utils)
        lines.append(f"  {label:24s} " + ", ".join(f"{d.name} {100 * u:.0f} %" for d, u in zip(devices, utils)))
        for d, u in zip(devices, utils):  # why: the source, and the bound that set it where one did
            c = row[d.name]
            if u < FUSED_TARGET:
                held = f", {c.bound}: {c.why}" if c.why else ", no bound moved it"
                lines.append(f"    {d.name}: {c.source}{held}")
    lines.append(
        f"  {short} kernel-GPU pairs below {FUSED_TARGET:.0%}. The fused (Apex / Transformer Engine / Megatron) "
        "data behind them (half precision): softmax from Megatron's fused causal softmax (2509.22832, A100 and "
        "GH200); no half-precision fused LayerNorm, RMSNorm or cross-entropy: those are the learned elementwise "
        "kernel that streams their traffic (the no-data rule, not a measurement). Liger-Kernel's Triton kernels "
        "(impl liger: RMSNorm forward A100 and H100, backward A100, 7-31 % of bandwidth) and torch's own kernels "
        "(impl native: nn.LayerNorm, nn.Softmax, vLLM's 2023 RMSNorm) are reported apart."
    )
    return lines


def _print_violations(found: list[dict[str, Any]], max_listed: int, measured: Measured | None) -> None:
    """The first ``max_listed`` violations a line each (with what was measured where ``measured`` is given)."""
    for v in found[:max_listed]:
        print(f"   {v['rule']:11s} {v['kernel']:32s} {v['gpu']:30s} {v['what']} [{v['source']}]")
        if measured is not None and "measured" in v:
            print(f"{'':48s}{_measured_text(v['measured'], v['rule'])}")
    if len(found) > max_listed:
        print(f"   ... and {len(found) - max_listed} more (--max-listed, --json)")


def _quantised_tables(
    models: str | None, devices: Sequence[Any], max_listed: int, measured_path: Path | None
) -> dict[str, Any]:
    """The GEMMs of each :data:`QUANTISED_DTYPES` dtype on the ``devices`` with its peak, the data-centre
    line first: utilisation with the bounds on, and the violations with the bounds off and on (with what
    ``measured_path`` measured beside each, as in the other tables)."""
    out: dict[str, Any] = {}
    for dtype in QUANTISED_DTYPES:
        kernels = kernel_set(dtype)
        having = [d for d in devices if d.supports(dtype)]
        if len(having) < 2:
            continue
        title = f"{dtype} GEMMs"
        print(f"=== {title} ({len(having)} GPUs with a {dtype} peak) ===")
        table: dict[str, Any] = {"gpus": [d.name for d in having]}
        measured = load_measured(measured_path, kernels, having) if measured_path else None
        for mode in ("off", "on"):
            cells = price(models, mode == "on", kernels, having)
            found = violations(cells, having, measured, kernels=kernels)
            table[mode] = {"violations": found}
            if mode == "on":
                print("\n".join(_util_table(f"-- bounds {mode}: utilisation", cells, having)))
            print(f"-- bounds {mode}: {len(found)} violation(s)")
            _print_violations(found, max_listed, measured)
        out[title] = table
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", help="model set folder (default: the embedded models/default)")
    ap.add_argument("--json", type=Path, help="write every number to this file")
    ap.add_argument("--check", action="store_true", help="exit 1 if the first table has a violation with the bounds on")
    ap.add_argument(
        "--max-listed", type=int, default=200, help="violations listed per table and mode (the count is always whole)"
    )
    ap.add_argument(
        "--measured",
        type=Path,
        help="dataset folder of measured rows: show beside each violation the measured speed-up of the nearest "
        "shape measured on the same pair of GPUs",
    )
    args = ap.parse_args(argv)

    from opcast.errors import OpcastError

    t0 = time.perf_counter()
    kernels = kernel_set()
    first, second, skipped = gpus()
    doc: dict[str, Any] = {"dtype": DTYPE, "speedup_slack": SPEEDUP_SLACK, "tables": {}, "skipped_gpus": skipped}
    from opcast.hardware import get_device

    fitted = [get_device(n) for n in FITTED]
    try:
        priced = {mode: price(args.models, mode == "on", kernels, [*first, *second]) for mode in ("off", "on")}
        measured = load_measured(args.measured, kernels, [*first, *second, *fitted]) if args.measured else None
    except OpcastError as err:
        print(f"kernel_sanity: error: {err}", file=sys.stderr)
        return 2
    if args.measured:
        doc["measured"] = str(args.measured)
    primary_on = 0
    for title, devices in (
        ("data-centre GPUs (A100 to GB200)", first),
        ("other NVIDIA GPUs of the catalog", second),
        ("training devices against each other", fitted),
    ):
        names = [d.name for d in devices]
        table: dict[str, Any] = {"gpus": names}
        print(f"=== {title} ===")
        for mode in ("off", "on"):
            cells = {label: {n: row[n] for n in names} for label, row in priced[mode].items()}
            found = violations(cells, devices, measured)
            by_rule: dict[str, int] = {}
            for v in found:
                by_rule[v["rule"]] = by_rule.get(v["rule"], 0) + 1
            table[mode] = {
                "violations": found,
                "by_rule": by_rule,
                "cells": {
                    label: {
                        n: {
                            "time_s": c.time_s,
                            "source": c.source,
                            "roofline_s": c.roof_s,
                            "bound_resource": c.resource,
                            "utilisation": c.utilisation,
                            "physical_bound": c.bound,
                        }
                        for n, c in row.items()
                    }
                    for label, row in cells.items()
                },
            }
            if mode == "on" and devices is not fitted:
                if devices is first:
                    primary_on = len(found)
                print("\n".join(_util_table(f"-- bounds {mode}: utilisation", cells, devices)))
                print("\n".join(_speedup_table(cells, devices)))
                if devices is first:
                    print("\n".join(_fused_lines(cells, devices)))
            print(
                f"-- bounds {mode}: {len(found)} violation(s) "
                f"({', '.join(f'{n} {r}' for r, n in sorted(by_rule.items())) or 'none'})"
            )
            _print_violations(found, args.max_listed, measured)
        doc["tables"][title] = table
    try:
        quantised = _quantised_tables(args.models, [*first, *second], args.max_listed, args.measured)
    except OpcastError as err:
        print(f"kernel_sanity: error: {err}", file=sys.stderr)
        return 2
    doc["tables"].update(quantised)
    if skipped:
        print(f"skipped (no {DTYPE} peak): {', '.join(skipped)}")
    print(
        "violations with the bounds off -> on: "
        + "; ".join(
            f"{title}: {len(t['off']['violations'])} -> {len(t['on']['violations'])}"
            for title, t in doc["tables"].items()
        )
        + f" ({time.perf_counter() - t0:.1f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 1 if args.check and primary_on else 0


if __name__ == "__main__":
    sys.exit(main())
