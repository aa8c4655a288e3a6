"""AMD aiter (ROCm/aiter, MIT): the tuned GEMM tables it ships, each row the measured time of the
fastest kernel its tuner found for one shape on one AMD Instinct GPU.

``ROOT`` is an aiter checkout (every ``aiter/configs/**/*.csv`` is read), its ``aiter/configs``
folder, or one CSV. A tuned GEMM table has the columns ``gfx``, ``cu_num``, ``M``, ``N``, ``K``
and ``us`` (a batched table also ``B``; header names are matched case-insensitively), plus the
kernel (``kernelName``, ``libtype``, ``solidx`` / ``kernelId``, ``splitK``), ``tflops`` and
``bw``. ``us`` is the mean per call, in microseconds, of the chosen kernel, timed by
``aiter.test_common.run_perftest`` (torch profiler device time over ``num_iters`` calls, 101 by
default, that cycle copies of the inputs past the L2 and MALL caches); the tuner keeps the
fastest kernel whose error ratio passes and writes ``inf`` / ``-1`` / ``0`` where none ran (those
rows are skipped with a counted reason). Checked: ``tflops`` = 2*M*N*K / us / 1e6 in every row.
Files without those columns (the untuned shape lists, fused-MoE, GDN and conv tables) are
skipped, their rows counted with :data:`NOT_GEMM`.

Devices (:data:`DEVICES`, keyed by ``(gfx, cu_num)``): gfx942 with 304 CUs -> ``MI300X``, gfx950
with 256 CUs -> ``MI355X``. The tables name the chip, not the product: MI325X is also gfx942 with
304 CUs and MI350X also gfx950 with 256, so ``--device`` (``ReplayOptions.device``) names the
product of the rows of its architecture (``--device MI325X`` relabels the gfx942 / 304-CU rows
and leaves the gfx950 rows as MI355X). Other chips (gfx942 with 80 CUs, the MI308X; gfx1250)
are skipped with a counted reason.

Tables and the dtype their rows take (the file name says which aiter GEMM it tuned):

``*bf16*`` (``gemm_a16w16``: hipBLASLt, asm, CK, Triton, FlyDSL kernels)
    ``gemm`` b=1 (``B`` in a batched table), m=M, n=N, k=K (``x[M, K] @ w[N, K]^T``); dtype from
    ``dtype`` (``torch.bfloat16`` -> bf16, ``torch.float16`` -> fp16; bf16 where the table has no
    such column). Skipped with reasons: ``outdtype`` other than ``dtype`` (an fp32 output is
    another GEMM), ``bias`` True (a fused bias epilogue), ``scaleAB`` True (a scaled GEMM).
``*a8w8*`` except block-scaled (``gemm_a8w8``, ``gemm_a8w8_bpreshuffle``: per-token activation,
    per-channel weight scales, bf16 output)
    fp8 where ``q_dtype_w`` is ``torch.float8_e4m3fn`` / ``torch.float8_e4m3fnuz``; int8 rows and
    rows of tables without ``q_dtype_w`` (int8 or fp8 not stated) are skipped with reasons.
``*blockscale*`` (``gemm_a8w8_blockscale``)
    fp8_block: block-scaled fp8 (1x128 activation, 128x128 weight scales, as in DeepSeek-V3, the
    kind of the AIConfigurator replay's ``fp8_block`` rows on Hopper) is another kernel family than
    per-token fp8 — over the 233 shapes both were tuned on gfx950 in aiter of 2026-08, the
    block-scaled time is 1.47x the per-token one (median, range 0.76-2.6x), slower even than bf16
    (1.09x) — so it takes its own dtype and predictor group, not fp8's.
The fp4 families (``a4w4``, ``mxfp4``, ``fp4``: e2m1 operands with one E8M0 scale per 32, OCP
MXFP4) are skipped with :data:`MXFP4`: they are not NVFP4 (an E4M3 scale per 16 and a tensor
scale), opcast's only 4-bit dtype. Every other family (``a6w6``, ``a8w4``, mxfp8, ...: fp6/int4
operands) is skipped with ``"aiter <family>: no opcast dtype"``.

The same (device, b, m, n, k, dtype) tuned in several tables or model configs keeps its fastest
row (what a deployment that loads the tuned table gets); the others are counted with
:data:`SLOWER`. ``time_s_median`` = us / 1e6; p20/p80 and ``n_reps`` null (the tables keep the
mean only); ``timing_method`` :data:`TIMING_METHOD`; ``source_file`` is the CSV path relative to
ROOT; ``kernel_name`` ``"aiter <libtype>: <kernelName>"`` (``splitK`` appended where above 0);
``tensor_cores`` True (matrix cores), direction fwd.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from opcast.collect.replay.common import MalformedFile, ReplayResult, csv_header, number, read_csv, whole
from opcast.errors import OpcastError
from opcast.hardware import get_device

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

CONFIGS: Final = "aiter/configs"
REQUIRED: Final = ("gfx", "cu_num", "m", "n", "k", "us")
"""Columns (lower-cased) of a tuned GEMM table."""
TIMING_METHOD: Final = "replay:aiter:run_perftest-mean"

DEVICES: Final[dict[tuple[str, int], str]] = {("gfx942", 304): "MI300X", ("gfx950", 256): "MI355X"}
"""(gfx, cu_num) -> catalog device (the default product of that chip; ``--device`` may name another)."""
BF16_DTYPES: Final = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
FP8_WEIGHTS: Final = frozenset({"torch.float8_e4m3fn", "torch.float8_e4m3fnuz"})

NOT_GEMM: Final = "aiter table without gfx, cu_num, M, N, K, us (untuned shape list, fused MoE or another op)"
FP4_FAMILIES: Final = ("a4w4", "mxfp4", "fp4")
MXFP4: Final = "aiter {family}: MXFP4 operands (1x32 E8M0 scales), not NVFP4 (1x16 E4M3 scales); no opcast dtype"
INT8: Final = "aiter a8w8 int8: opcast has no int8 dtype"
A8W8_UNSTATED: Final = "aiter a8w8 table without q_dtype_w: int8 or fp8 not stated"
NOT_A_TIME: Final = "aiter us not a positive finite time (no kernel ran for the shape)"
OUT_DTYPE: Final = "aiter bf16 GEMM with another output dtype (fp32 out)"
BIAS: Final = "aiter GEMM with a fused bias epilogue"
SCALED: Final = "aiter bf16 GEMM with scaleAB (a scaled GEMM)"
SLOWER: Final = "aiter: a faster kernel measured the same shape in another table or model config (the fastest is kept)"
OTHER_FAMILIES: Final = ("a4w4", "a6w6", "a6w4", "a8w4", "a4w6", "a16w8", "mxfp8", "mxfp4", "i4", "fp4")


def csv_paths(root: Path) -> tuple[Path, list[Path]]:
    """(the folder paths are relative to, the CSVs of ``root``: a checkout, its configs folder or one CSV)."""
    if root.is_file():
        return root.parent, [root]
    base = root / CONFIGS if (root / CONFIGS).is_dir() else root
    paths = sorted(base.rglob("*.csv"))
    if not paths:
        raise OpcastError(f"{root} has no {CONFIGS}/**/*.csv; give an aiter checkout, its {CONFIGS} folder or one CSV")
    return root, paths


def family(name: str) -> str | None:
    """The GEMM family a table's file name says (``bf16``, ``a8w8``, ``blockscale``), or None."""
    lower = name.lower()
    for other in OTHER_FAMILIES:
        if other in lower:
            return other
    if "blockscale" in lower:
        return "blockscale"
    if "a8w8" in lower:
        return "a8w8"
    if "bf16" in lower or "a16w16" in lower:
        return "bf16"
    return None


def replay(root: Path, options: ReplayOptions | None = None) -> ReplayResult:
    """Rows of the tuned GEMM tables under ``root`` (see the module docstring)."""
    devices = _devices(options.device if options is not None else None)
    base, paths = csv_paths(root)
    result = ReplayResult(files=len(paths))
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in paths:
        source_file = path.relative_to(base).as_posix() if path != root else path.name
        fam = family(path.name)
        if not set(REQUIRED) <= _header(path):  # not parsed further: such tables may be ragged
            result.skipped[NOT_GEMM] += _data_lines(path)
            continue
        for line, raw in read_csv(path):
            row = {k.lower(): v for k, v in raw.items()}
            reason = _convert(path, line, row, fam, source_file, devices, best)
            if reason is not None:
                result.skipped[reason] += 1
    result.rows.extend(best.values())
    return result


def _header(path: Path) -> set[str]:
    """The lower-cased column names of ``path``'s first line."""
    return {c.lower() for c in csv_header(path) or []}


def _data_lines(path: Path) -> int:
    with open(path, errors="replace") as fh:  # only counted: a line need not decode
        return max(sum(1 for text in fh if text.strip()) - 1, 0)


def _devices(override: str | None) -> dict[tuple[str, int], str]:
    """:data:`DEVICES` with ``override`` (a catalog name) replacing the default of its architecture."""
    if override is None:
        return dict(DEVICES)
    spec = get_device(override)
    arch = {key: get_device(name).architecture for key, name in DEVICES.items()}
    keys = [key for key, a in arch.items() if a == spec.architecture]
    if not keys:
        raise OpcastError(
            f"--device {spec.name} ({spec.architecture}) matches no chip of the aiter tables "
            f"({', '.join(f'{g}/{c} CUs' for g, c in DEVICES)}); name an AMD Instinct of CDNA 3 or CDNA 4"
        )
    return {key: (spec.name if key in keys else name) for key, name in DEVICES.items()}


def _convert(
    path: Path,
    line: int,
    row: Mapping[str, str],
    fam: str | None,
    source_file: str,
    devices: Mapping[tuple[str, int], str],
    best: dict[tuple[Any, ...], dict[str, Any]],
) -> str | None:
    """Keep ``row`` in ``best`` (the fastest per shape), or return the reason it is skipped."""
    if fam is None:
        return f"aiter table {path.name}: not a GEMM family opcast maps"
    if fam in FP4_FAMILIES:
        return MXFP4.format(family=fam)
    if fam not in ("bf16", "a8w8", "blockscale"):
        return f"aiter {fam}: no opcast dtype"
    gfx, cu = row["gfx"], _whole(path, line, row, "cu_num")
    device = devices.get((gfx, cu))
    if device is None:
        return f"aiter {gfx} with {cu} CUs: no catalog device"
    if fam == "bf16":
        dtype = BF16_DTYPES.get(row.get("dtype", "torch.bfloat16"))
        if dtype is None:
            return f"aiter bf16 table dtype {row['dtype']!r}: not bf16 or fp16"
        if row.get("outdtype", row.get("dtype", "torch.bfloat16")) != row.get("dtype", "torch.bfloat16"):
            return OUT_DTYPE
        if row.get("scaleab", "False") == "True":
            return SCALED
    elif fam == "blockscale":
        dtype = "fp8_block"
    else:
        q_dtype = row.get("q_dtype_w")
        if q_dtype is None or q_dtype == "":
            return A8W8_UNSTATED
        if q_dtype == "torch.int8":
            return INT8
        if q_dtype not in FP8_WEIGHTS:
            return f"aiter a8w8 q_dtype_w {q_dtype!r}: no opcast dtype"
        dtype = "fp8"
    if row.get("bias", "False") == "True":
        return BIAS
    us = number(path, line, row, "us")
    if not (math.isfinite(us) and us > 0):
        return NOT_A_TIME
    b = _whole(path, line, row, "b") if "b" in row else 1
    m, n, k = (_whole(path, line, row, c) for c in ("m", "n", "k"))
    key = (device, b, m, n, k, dtype)
    kept = best.get(key)
    if kept is not None and kept["time_s_median"] <= us * 1e-6:
        return SLOWER
    split_k = row.get("splitk", "")
    kernel = row.get("kernelname", "") or f"id {row.get('solidx', row.get('kernelid', '?'))}"
    best[key] = {
        "op": "gemm",
        "b": b,
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "direction": "fwd",
        "device": device,
        "tensor_cores": True,
        "time_s_median": us * 1e-6,
        "time_s_p20": None,
        "time_s_p80": None,
        "n_reps": None,
        "source_file": source_file,
        "kernel_name": f"aiter {row.get('libtype', fam)}: {kernel}"
        + (f" splitK={split_k}" if split_k not in ("", "0") else ""),
        "timing_method": TIMING_METHOD,
    }
    return None if kept is None else SLOWER


def _whole(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    value = whole(path, line, row, column)
    if value <= 0:
        raise MalformedFile(path, line, f"column {column!r} is {row[column]!r}, not a positive whole number")
    return value
