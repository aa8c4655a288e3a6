"""A serving engine's scheduling limits and per-step CPU overhead, with each engine's defaults.

**vLLM** (V1 engine, ``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults`` and
``vllm/config/{scheduler,cache}.py``): chunked prefill always on; for the OpenAI server
``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024 on GPUs of >= 70 GiB other than A100,
otherwise 2048 and 256; KV blocks of 16 tokens; ``gpu_memory_utilization`` 0.9 of the GPU's
memory for weights, activations and the KV cache; a request that finds no free block preempts
the most recently admitted running one, whose KV is dropped and recomputed later
(``PreemptionMode.RECOMPUTE``, the only mode of V1). These are the current V1 defaults; older
releases differ (vLLM 0.8.x, ``EngineArgs._set_default_args_v1``: ``max_num_seqs`` 1024 on every
GPU, ``max_num_batched_tokens`` 8192 only on GPUs named H100/H200, else 2048), so a run of a
given version passes its own values (``engine_config`` overrides).

**SGLang** (``python/sglang/srt/server_args.py``): chunked prefill of 8192 tokens on GPUs of
>= 60 GiB (4096 below, 2048 under 35 GiB), pages of 1 token; ``mem_fraction_static`` 0.88 and a
running-request cap of 1024 are our estimates of what its memory-derived defaults give on a
large GPU. Retraction under KV pressure is modelled as vLLM's recompute.

**TensorRT-LLM** (``tensorrt_llm.llmapi``: ``KvCacheConfig`` ``tokens_per_block`` 32 and
``free_gpu_memory_fraction`` 0.9 of the memory *left after the weights*; ``max_batch_size``
2048, ``max_num_tokens`` 8192; chunked context off; the capacity scheduler's default
``GUARANTEED_NO_EVICT`` admits a request only when blocks for its whole prompt and output can be
reserved, so it never preempts).

**Per-step overhead** (:class:`StepOverhead`): the CPU time of one scheduler iteration that the
GPU does not hide (scheduling, input preparation, sampling, detokenisation hand-off), as
``fixed_s + per_seq_s x sequences``. These are estimates, not measurements: vLLM V1 runs
scheduling beside the model on a separate process but still spends a few hundred microseconds a
step; SGLang overlaps its scheduler with the GPU ("zero-overhead" scheduler); TensorRT-LLM's C++
executor is the leanest. Calibrate them against a measured run before trusting small-batch TPOT. One is
measured: vLLM before 0.6 (``--engine-version``), which processed every step's outputs on its critical path,
:data:`VLLM_SYNC_OUTPUT_OVERHEAD` (:func:`step_overhead`).

**Tensor-parallel all-reduce** (:func:`tp_all_reduce_kind`, :data:`CUSTOM_ALL_REDUCE_RULES`): vLLM
runs its own one-shot/two-shot all-reduce over CUDA IPC buffers instead of NCCL when
``CustomAllreduce.__init__`` enables it (``vllm/distributed/device_communicators/custom_all_reduce.py``:
world size 2, 4, 6 or 8, every rank on one node, and with more than 2 ranks the GPUs fully
connected by NVLink) and ``CustomAllreduce.should_custom_ar`` accepts the tensor (fp32/fp16/bf16,
a multiple of 16 bytes, ``inp_size < max_size``, ``max_size`` 8 MiB by default); otherwise its
``CudaCommunicator.all_reduce`` falls through to NCCL (pynccl). SGLang's
``python/sglang/srt/distributed/device_communicators/custom_all_reduce.py`` is a port of vLLM's with
the same gates and default. TensorRT-LLM's ``AllReduce`` (strategy AUTO) picks one-shot, two-shot or
NCCL itself per call on one node (``AllreduceOp::getRuntimeStrategy`` -> ``selectImplementation``,
``cpp/tensorrt_llm/thop/allreduceOp.cpp``, from a tuned table per SM, TP, hidden size and token count,
``cpp/tensorrt_llm/common/customAllReduceUtils.h``), so every one-node TP all-reduce under ``--engine
trtllm`` is the kind :data:`~opcast.predict.comm.TRTLLM_ALL_REDUCE`, priced by the law learned from
TensorRT-LLM's own measured calls (AIConfigurator's ``custom_allreduce_perf`` of TensorRT-LLM, every size:
its choice at each), or as NCCL's where the model set has no such law. Measured support: on eight B200s
TensorRT-LLM's call takes 6.0 / 7.9 / 17.8 us at 64 KiB / 256 KiB / 1 MiB where NCCL 2.29's all-reduce
takes 29.0 / 28.3 / 30.1 us (``systems/data/b200_sxm``: ``comm/trtllm/1.3.0rc20``, ``comm/nccl/2.29.2``); a
decode step of a TP-8 Llama-3.1-70B makes 161 of them (two a layer, one after the embedding). A run without a
serving engine (``engine`` none) and training always use NCCL.

**fp8 linears without an amax pass** (:func:`engine_fp8_gemm_s`): the learned per-tensor fp8 GEMM is fitted on
TensorRT-LLM's rows (AIConfigurator's ``gemm/trtllm``), whose timed call quantises its bf16 input dynamically: an
amax pass over the input (``compute_scale``), then the cast (``scale_matrix``), then the GEMM (AIConfigurator
``collector/trtllm/collect_gemm.py``: "the collected fp8 GEMM includes the compute-scale overhead"). A serving
engine runs no amax pass: an fp8 checkpoint carries static activation scales (ModelOpt's ``input_scale``, which
vLLM's ``ModelOptFp8LinearMethod`` and TensorRT-LLM apply with one cast, fused into the norm or activation before
it where the engine fuses), and vLLM's dynamic per-token fp8 computes each row's scale inside its cast kernel. So
under an engine each such GEMM is priced less that pass: its measured small-input time on the GPU
(:data:`AMAX_FLOOR_S`, :func:`amax_floor_s`) plus a read of its input
at the memory bandwidth (the fastest the pass can go; the measured pass is slower on large inputs, 28-93 % of it,
so large prompts keep some of it), never below reading the GEMM's own bytes at the bandwidth. Measured support: on
B200 vLLM's own fp8 kernel (``CutlassFP8ScaledMMLinearKernel``, static scale) times 10.7 / 17.0 us at m = 4,
k = 8192, n = 1024 / 7168 where TensorRT-LLM's dynamic rows time 18.4 / 23.8 us and its amax pass 8.3 us
(``systems/data/b200_sxm``: ``gemm/vllm/0.24.0``, ``gemm/trtllm/1.3.0rc20``, ``quantize/trtllm/1.3.0rc20``). Without
an engine (``engine`` none) the rows are priced as measured.

**vLLM's own fp8 GEMM** (:data:`ENGINE_GEMM_FAMILIES`): under ``--engine vllm`` a per-tensor fp8 linear is priced as
vLLM's kernel (``impl`` vllm, :data:`opcast.ops.GEMM_IMPLS`: ``CutlassFP8ScaledMMLinearKernel``, learned from
AIConfigurator's ``gemm/vllm`` fp8 rows, the group ``gemm-fwd-fp8_vllm``) wherever the model set has that family's
group; the amax correction above is then not applied (the rows are vLLM's own call). Against TensorRT-LLM's cuBLASLt
rows it runs 0.56-0.63x at m <= 64 and 1.11x / 1.20x / 1.26x at m > 2,048 on H100 / H200 / B200 (medians over the
shapes both measured): a prompt's GEMMs are slower under vLLM than the default family says, its decode GEMMs faster.

**Fused MoE kernels** (:func:`moe_impl`): vLLM runs its own ``FusedMoE`` layer (Triton ``fused_moe``, OpenAI
Triton ``matmul_ogs`` or Marlin for MXFP4, FlashInfer on Blackwell, as
``vllm/model_executor/layers/fused_moe`` selects per GPU and dtype), so its MoE blocks are priced as the ``moe``
kind's ``vllm`` family (AIConfigurator's ``moe/vllm`` rows), or ``marlin`` where vLLM runs Marlin's W4A16 MoE for
MXFP4 experts (:func:`vllm_runs_marlin`); every other engine, and a run without one, as TensorRT-LLM's (the
registry default). SGLang's MoE kernels have no family of their own yet (no model has its rows): they are priced as
TensorRT-LLM's, as before. A model set without a family's rows prices it as TensorRT-LLM's
(:mod:`opcast.predict.cost.learned`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Final, Literal, get_args

from opcast.errors import OpcastError
from opcast.hardware import DeviceSpec, base_name
from opcast.ops import whole_number
from opcast.predict.comm import CUSTOM_ALL_REDUCE, TRTLLM_ALL_REDUCE, Group, intra_tier

EngineName = Literal["vllm", "sglang", "trtllm"]
ENGINES: tuple[str, ...] = get_args(EngineName)

MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class CustomAllReduceRule:
    """When an engine's tensor-parallel all-reduce is its own kernel, not NCCL's (module docstring)."""

    kind: str = CUSTOM_ALL_REDUCE
    """The collective kind (law) of the engine's own all-reduce."""
    world_sizes: tuple[int, ...] | None
    """Group sizes the kernel supports (None: any on one node)."""
    max_bytes: int | None
    """Messages of this many bytes and more go to NCCL (None: the engine's own choice at every size, which the
    law learned from its measured calls holds)."""
    align_bytes: int = 1
    """The message must be a multiple of this many bytes."""
    nvlink_above_two: bool = True
    """More than 2 GPUs without NVLink between them run NCCL."""
    source: str

    def applies(self, nbytes: int, group: Group, device: DeviceSpec) -> bool:
        """Whether an all-reduce of ``nbytes`` over ``group`` on nodes of ``device`` runs the engine's own call."""
        if group.nodes != 1 or group.size < 2 or (self.world_sizes is not None and group.size not in self.world_sizes):
            return False
        if self.nvlink_above_two and group.size > 2 and intra_tier(device) != "nvlink":
            return False
        fits = self.max_bytes is None or nbytes < self.max_bytes
        return nbytes > 0 and fits and nbytes % self.align_bytes == 0


_VLLM_RULE_SOURCE = (
    "vllm/distributed/device_communicators/custom_all_reduce.py: CustomAllreduce.__init__ (world sizes 2/4/6/8, "
    "one node, full NVLink above 2 GPUs, max_size 8 MiB) and should_custom_ar (bytes % 16 == 0, bytes < max_size)"
)
CUSTOM_ALL_REDUCE_RULES: dict[str, CustomAllReduceRule] = {
    "vllm": CustomAllReduceRule(world_sizes=(2, 4, 6, 8), max_bytes=8 * MIB, align_bytes=16, source=_VLLM_RULE_SOURCE),
    "sglang": CustomAllReduceRule(
        world_sizes=(2, 4, 6, 8),
        max_bytes=8 * MIB,
        align_bytes=16,
        source="python/sglang/srt/distributed/device_communicators/custom_all_reduce.py (a port of "
        + _VLLM_RULE_SOURCE
        + ")",
    ),
    "trtllm": CustomAllReduceRule(
        kind=TRTLLM_ALL_REDUCE,
        world_sizes=None,
        max_bytes=None,
        nvlink_above_two=False,
        source="tensorrt_llm AllReduce, strategy AUTO: AllreduceOp::getRuntimeStrategy -> selectImplementation "
        "(cpp/tensorrt_llm/thop/allreduceOp.cpp) picks one-shot, two-shot or NCCL per call on one node; priced by "
        "the law of its measured calls",
    ),
}
"""Engines whose TP all-reduce may be their own call; any other engine (none) uses NCCL."""


DYNAMIC_FP8_AMAX_FLOOR_S: Final = 7e-6
"""The time of TensorRT-LLM's amax pass (``compute_scale``) on a small input, where its launch and reduction, not
its bytes, set it, on a GPU where it is not measured (:data:`AMAX_FLOOR_S`): 7 us, about the middle of the measured
ones."""

AMAX_FLOOR_S: Final[dict[str, float]] = {
    "H100-SXM": 7.2e-6,
    "H200": 7.2e-6,
    "B200": 8.4e-6,
    "GB200": 8.4e-6,
    "B300": 8.5e-6,
    "GB300": 8.5e-6,
    "L40S": 6.1e-6,
    "RTX-PRO-6000": 6.9e-6,
}
"""The amax pass's small-input time per GPU (catalog name), measured: AIConfigurator 0.12.0
``systems/data/<system>/quantize/trtllm/1.3.0rc20/computescale_perf.parquet``, the median over the fp8 inputs below
100 kB (369 rows a system): 7.19 / 7.15 us on H100 / H200, 8.38 / 8.41 / 8.48 / 8.47 on B200 / GB200 / B300 / GB300,
6.11 on L40S, 6.88 on RTX PRO 6000. The Blackwell data-centre parts take 1.4 us more than the 7 us once used for
every GPU: a TP-8 decode step of Llama-3.1-70B holds 320 fp8 linears."""


def amax_floor_s(device: DeviceSpec) -> float:
    """The amax pass's small-input time on ``device`` (:data:`AMAX_FLOOR_S`; a GPU made from a measured one with
    ``--set`` takes that one's; :data:`DYNAMIC_FP8_AMAX_FLOOR_S` elsewhere)."""
    return AMAX_FLOOR_S.get(base_name(device), DYNAMIC_FP8_AMAX_FLOOR_S)


def engine_fp8_gemm_s(time_s: float, m: int, k: int, gemm_bytes: float, device: DeviceSpec) -> float:
    """The learned per-tensor fp8 GEMM of ``time_s`` (an ``[m, k]`` input, ``gemm_bytes`` moved) as a serving engine
    runs it, without the dynamic quantisation's amax pass its measurements hold (module docstring)."""
    amax_s = amax_floor_s(device) + 2 * m * k / device.mem_bw_bytes_per_s
    return max(time_s - amax_s, gemm_bytes / device.mem_bw_bytes_per_s)


def engine_device_problem(engine: str, device: DeviceSpec) -> str | None:
    """Why ``engine`` cannot serve on ``device`` (one line), or None: TensorRT-LLM is built on CUDA and TensorRT and
    runs on NVIDIA GPUs only, where vLLM and SGLang also run on AMD's (ROCm)."""
    if engine == "trtllm" and device.vendor != "nvidia":
        return (
            f"engine=trtllm runs on NVIDIA GPUs only (TensorRT-LLM is built on CUDA and TensorRT); {device.name} is "
            f"{device.vendor}'s: use --engine vllm or sglang"
        )
    return None


def tp_all_reduce_kind(engine: str, nbytes: int, group: Group, device: DeviceSpec) -> str:
    """The collective kind of one tensor-parallel all-reduce of ``nbytes`` under ``engine``: the engine's own
    (:attr:`CustomAllReduceRule.kind`) where it runs it, else ``all_reduce`` (NCCL)."""
    rule = CUSTOM_ALL_REDUCE_RULES.get(engine)
    return rule.kind if rule is not None and rule.applies(nbytes, group, device) else "all_reduce"


VLLM_FUSIONS: Final = ("allreduce_rms", "attn_quant")
"""vLLM's compile-time kernel fusions that ``--fusions`` prices (``compilation_config.pass_config``; its current names,
then in brackets those of its 2025 releases, which the InferenceMAX scripts use):

- ``allreduce_rms`` (``fuse_allreduce_rms``; ``enable_fi_allreduce_fusion``): with tensor parallelism, each
  all-reduce with the residual add, RMSNorm and static fp8 quantisation after it is one FlashInfer kernel, TensorRT-
  LLM's one-shot/two-shot all-reduce with that epilogue (``vllm/compilation/collective_fusion.py``,
  ``AllReduceFusionPass``: the patterns AllReduce -> [residual add ->] RMSNorm [-> static FP8 quant]), up to a
  message of :data:`FI_ALLREDUCE_FUSION_MAX_MIB` MiB (larger ones run unfused). Priced: the all-reduce as
  :data:`~opcast.predict.comm.TRTLLM_ALL_REDUCE` (TensorRT-LLM's measured kernel), no norm or residual-add kernels,
  and the QKV and gate/up fp8 linears without their input's quantisation (:func:`static_fp8_quant_s`). NVIDIA
  Hopper and datacenter Blackwell only (no table for other GPUs: vLLM disables the pass there).
- ``attn_quant`` (``fuse_attn_quant``; ``enable_attn_fusion``): the attention kernel writes its output in fp8, so
  the output projection's fp8 linear runs without its input's quantisation.

What vLLM's fp8 linears cost without fusion is their measured call (AIConfigurator's ``gemm/vllm`` rows time
``RowParallelLinear.forward`` with a static activation scale: ``scaled_fp8_quant`` then the GEMM,
``collector/vllm/collect_gemm.py``). Off by default, as the InferenceMAX H100 and H200 scripts ran vLLM (no
``pass_config``; their TPOT is priced within 3 % signed without fusions, ``benchmarks/results/aic_serving.md``); its
B200 scripts ask for both. vLLM's current documentation turns ``fuse_allreduce_rms`` on by itself at ``-O2`` and above
(TP > 1 on Hopper or Blackwell with FlashInfer): give ``--fusions`` for such a deployment."""

FI_ALLREDUCE_FUSION_MAX_MIB: Final[dict[str, dict[int, float]]] = {
    "wgmma": {2: 64, 4: 2, 8: 1},
    "tcgen05": {2: 64, 4: 32, 8: 1},
}
"""The largest all-reduce (MiB) vLLM's ``allreduce_rms`` fusion takes, by the GPU's tensor-core family (Hopper sm_90,
datacenter Blackwell sm_100) and TP size: ``PassConfig.fi_allreduce_fusion_max_size_mb``'s defaults
(``FI_ALLREDUCE_FUSION_MAX_SIZE_MB``, vllm/config/compilation.py). A decode step of Llama-3.1-70B at TP 8 stays under
1 MiB up to 64 sequences; a 1,024-token prompt step (16 MiB) runs unfused there."""

STATIC_FP8_QUANT_FLOOR_S: Final = 2.2e-6
"""vLLM's static fp8 quantisation kernel (``static_scaled_fp8_quant``) on a small input, measured: 2.06 / 1.98 / 2.19
/ 2.57 us on H100 / H200 / B200 / GB200 (AIConfigurator 0.12.0 ``systems/data/<system>/quantize/vllm/0.24.0/
scale_matrix_perf.parquet``, the median over inputs below 100 kB); larger inputs stream at ~85 % of the bandwidth
(8,192 x 8,192 on B200: 31.7 us measured, :func:`static_fp8_quant_s` 27.4)."""


def _fusion_parts(text: str) -> list[tuple[str, str, str]]:
    """``--fusions`` split into (name, ``:`` or empty, limit) per comma-separated part."""
    return [part.strip().partition(":") for part in text.split(",")]


@cache  # read by every forward a serving table prices: parsed once per text
def fusions_of(text: str | None) -> Mapping[str, float | None]:
    """The fusions named in ``--fusions`` (comma-separated :data:`VLLM_FUSIONS`, ``allreduce_rms`` optionally with
    its size limit in MiB, ``allreduce_rms:8``, as ``VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB`` or
    ``fi_allreduce_fusion_max_size_mb`` set it), each with its limit (None: vLLM's default); none for None."""
    parts = _fusion_parts(text) if text else []
    return MappingProxyType({name: float(limit) if limit else None for name, _, limit in parts if name})


def fusions_problem(text: str, engine: str | None = None) -> str | None:
    """Why ``--fusions text`` cannot apply (under ``engine``; None: not checked), or None."""
    for name, colon, limit in _fusion_parts(text):
        part = name + colon + limit
        if name not in VLLM_FUSIONS:
            return (
                f"--fusions {part!r}: not one of {', '.join(VLLM_FUSIONS)}; give a comma-separated list of "
                "them, e.g. allreduce_rms,attn_quant (allreduce_rms:8 with a size limit of 8 MiB)"
            )
        if colon and (name != "allreduce_rms" or not _positive_number(limit)):
            return (
                f"--fusions {part!r}: only allreduce_rms takes a limit, a positive number of MiB, e.g. allreduce_rms:8"
            )
    if engine is not None and engine != "vllm":
        return f"--fusions {text} are vLLM's compile passes; give --engine vllm or leave --fusions out"
    return None


def _positive_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


def allreduce_rms_fused(fusions: Mapping[str, float | None], nbytes: float, tp: int, device: DeviceSpec) -> bool:
    """Whether vLLM's ``allreduce_rms`` fusion takes a TP all-reduce of ``nbytes`` on ``device``
    (:data:`VLLM_FUSIONS`; the limit given, else :data:`FI_ALLREDUCE_FUSION_MAX_MIB`); never on a GPU vLLM has no
    table for (it disables the pass there)."""
    if "allreduce_rms" not in fusions or tp < 2:
        return False
    table = FI_ALLREDUCE_FUSION_MAX_MIB.get(device.mma_family or "")
    if table is None:
        return False
    limit = fusions["allreduce_rms"] or table.get(tp)
    return limit is not None and nbytes <= limit * 2**20


def static_fp8_quant_s(m: int, k: int, device: DeviceSpec) -> float:
    """vLLM's static fp8 quantisation of an ``[m, k]`` bf16 input (:data:`STATIC_FP8_QUANT_FLOOR_S` plus reading two
    bytes and writing one an element at the bandwidth)."""
    return STATIC_FP8_QUANT_FLOOR_S + 3 * m * k / device.mem_bw_bytes_per_s


FA3_ENGINES: Final = ("vllm", "sglang")
"""Engines whose decode attention on Hopper is FlashAttention-3 (vLLM's ``vllm_flash_attn`` FA3, SGLang's ``fa3``
backend, each one's default there)."""
FA3_FP8_KV_FRACTION: Final = 0.76
"""FlashAttention-3's decode over an fp8 KV cache on Hopper takes the time of its bf16-cache kernel over 0.76 of the
keys, where the bytes alone say 0.5: its fp8 path dequantises the cache inside the kernel. The median over 6,054
rows of AIConfigurator 0.12.0's generation attention (bf16 queries, batch >= 16, >= 2,048 cached tokens, where the
keys' time is over twice the launch's), each row's ``(t_fp8 - t0) / (c seq_kv)`` against the affine law ``t0 + c
seq_kv`` of the same shape's bf16-cache rows: vLLM 0.24.0's ``vllm_flash_attn_fa3`` 0.66 on H100 and 0.87 on H200,
SGLang 0.5.14's ``fa3`` 0.73 and 0.89 (``systems/data/h100_sxm`` and ``h200_sxm``, ``attention/vllm/0.24.0`` and
``attention/sglang/0.5.14``, ``generation_attention_perf.parquet``). TensorRT-LLM's XQA on the same GPUs measures
0.52 and 0.53, and every engine on Blackwell, Ada and Intel's B60 0.50-0.55 (SGLang on Blackwell 0.65): the bytes
ratio."""


def fp8_kv_decode_fraction(engine: str, device: DeviceSpec) -> float | None:
    """The share of an fp8 cache's keys ``engine``'s decode attention on ``device`` is priced over
    (:attr:`opcast.predict.graph.Dtypes.kv_decode_fraction`): :data:`FA3_FP8_KV_FRACTION` for FlashAttention-3 on
    Hopper, else None (the bytes ratio)."""
    return FA3_FP8_KV_FRACTION if engine in FA3_ENGINES and device.architecture == "hopper" else None


ENGINE_GEMM_FAMILIES: dict[str, str] = {"vllm": "vllm"}
"""Engine -> the kernel family (one of :data:`opcast.ops.GEMM_IMPLS`) of its per-tensor fp8 linears; any other
engine (trtllm, sglang, none) runs the registry default, cuBLAS's (module docstring: vLLM's own fp8 GEMM)."""
ENGINE_MOE_FAMILIES: dict[str, str] = {"vllm": "vllm"}
"""Engine -> the fused MoE kernel family (one of :data:`opcast.ops.MOE_IMPLS`) its MoE layers run; any other engine
(trtllm, sglang, none) runs the registry default, TensorRT-LLM's (module docstring)."""
VLLM_HOPPER_TRITON_MXFP4: Final = (0, 12)
"""The first vLLM release whose wheels carry OpenAI's ``triton_kernels`` (vendored into ``vllm/third_party`` at build
time by vllm-project/vllm#28788, 2025-11-15), without which ``get_mxfp4_backend`` runs MXFP4 experts on Hopper with
Marlin: 0.10.x and 0.11.x (their wheels lack the package; vLLM's own warning, "Weight-only FP4 compression will be
used leveraging the Marlin kernel", vllm-project/vllm#23278, and the discussion of #27523, 2025-10)."""


def parse_engine_version(text: str) -> tuple[int, ...]:
    """``--engine-version 0.11.0`` (or ``v0.11.0``, ``0.12``) as a tuple of ints; a one-line error otherwise."""
    numbers = [whole_number(p) for p in text.strip().removeprefix("v").split(".")]
    if not 1 <= len(numbers) <= 3 or None in numbers:
        raise OpcastError(f"--engine-version {text!r}: give the engine's release as MAJOR.MINOR[.PATCH], e.g. 0.11.0")
    return tuple(n for n in numbers if n is not None)


def engine_version_problem(text: str) -> str | None:
    """Why ``text`` is not an engine release (:func:`parse_engine_version`), or None: the one check the
    ``--engine-version`` option and :func:`opcast.predict.parallel.validate_infer` both make."""
    try:
        parse_engine_version(text)
    except OpcastError as err:
        return str(err)
    return None


def vllm_runs_marlin(device: DeviceSpec, version: str | None) -> bool:
    """Whether vLLM (``version``; None: the newest) runs MXFP4 experts with Marlin's W4A16 MoE on ``device``
    (``vllm/model_executor/layers/quantization/mxfp4.py`` ``get_mxfp4_backend``): on every ``mma.sync`` GPU
    (Ampere, Ada, sm_120: AIConfigurator's vLLM 0.24.0 rows of gpt-oss on L40S and RTX PRO 6000 are Marlin's), and
    on Hopper before :data:`VLLM_HOPPER_TRITON_MXFP4` (then OpenAI Triton's ``matmul_ogs``, the ``vllm`` family);
    datacenter Blackwell runs FlashInfer's TRT-LLM-gen MXFP4 kernels, AMD its own."""
    family = device.mma_family
    if family == "mma.sync":
        return True
    return family == "wgmma" and version is not None and parse_engine_version(version) < VLLM_HOPPER_TRITON_MXFP4


Mxfp4Moe = Literal["marlin", "bf16", "mxfp8"]
MXFP4_MOE: Final[tuple[str, ...]] = get_args(Mxfp4Moe)
"""How MXFP4 experts (gpt-oss's) run, as a deployment chooses (:attr:`opcast.predict.parallel.InferConfig.mxfp4_moe`;
vLLM's ``get_mxfp4_backend`` in ``vllm/model_executor/layers/quantization/mxfp4.py`` reads the environment
variables named here): ``marlin``, Marlin's W4A16 MoE (``VLLM_MXFP4_USE_MARLIN=1``; the InferenceMAX Hopper scripts
set it from vLLM 0.13); ``bf16``, the engine's own W4A16 kernel, bf16 activations against the weights dequantised in
the kernel (OpenAI Triton's ``matmul_ogs`` on Hopper, FlashInfer's TRT-LLM-gen MXFP4 x BF16 on datacenter
Blackwell, ``VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1``; TensorRT-LLM's W4A16_MXFP4); ``mxfp8``, the activations
quantised to MXFP8 and both fed to Blackwell's block-scaled tensor cores at the fp8 rate
(``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``, the InferenceMAX B200 scripts; TensorRT-LLM's W4A8_MXFP4_MXFP8)."""
MXFP4_MOE_DTYPE: Final = "fp8_block"
"""The fused MoE kernel's dtype under ``mxfp4_moe`` mxfp8: opcast's block-scaled fp8, MXFP8 (the replay's
``w4a8_mxfp4_mxfp8`` rows, :data:`opcast.collect.replay.aiconfigurator.MOE_NARROW_WEIGHT_DTYPES`); also the
experts' of a 128 x 128 block-scaled fp8 checkpoint served in fp8 (:func:`opcast.predict.inference.block_fp8_moe`)."""
SGLANG_BLOCK_FP8_MOE_FAMILY: Final = "vllm"
"""The measured family that prices SGLang's block-scaled fp8 MoE: SGLang runs it in ``fused_moe_triton``, its port of
vLLM's Triton fused MoE, and AIConfigurator's H200 tables at DeepSeek-V3's shape (TP 8, balanced) put the two
within 4-27 % (SGLang 0.5.14 / vLLM 0.24: 0.250 / 0.261 ms at 32 tokens, 0.393 / 0.473 at 1,024, 3.65 / 4.63 at
16,384), where TensorRT-LLM's CUTLASS kernel, the registry default, takes 0.49, 1.09 and 9.66 ms. SGLang's own rows
are not replayed."""


def mx_tensor_cores(device: DeviceSpec) -> bool:
    """Whether ``device`` has block-scaled (MX) fp8 tensor cores, Blackwell's, which also run fp4: a part with an fp4
    peak. The one test of :func:`mxfp4_moe_problem` (``mxfp8`` needs them) and :func:`engine_mxfp4_moe`."""
    return device.supports("nvfp4")


def mxfp4_moe_problem(
    choice: str, engine: str, expert_weights: str | None, device: DeviceSpec | None = None, arch: str = ""
) -> str | None:
    """Why ``--mxfp4-moe choice`` cannot run under ``engine`` (on ``device`` where given) for a model whose experts
    are stored as ``expert_weights`` (:attr:`opcast.archs.ArchSpec.expert_weights`; None: in the GEMMs' dtype), or
    None: a name outside :data:`MXFP4_MOE`, a model without MXFP4 experts, Marlin under an engine without it
    (TensorRT-LLM), MXFP8 on a GPU without block-scaled fp8 tensor cores (Blackwell's, which also run fp4: a part
    with an fp4 peak)."""
    if choice not in MXFP4_MOE:
        return f"--mxfp4-moe {choice!r} is not one of {', '.join(MXFP4_MOE)}"
    if expert_weights != "mxfp4":
        return f"--mxfp4-moe applies to MXFP4 experts (gpt-oss's); {arch or 'this model'} has none: leave it out"
    if choice == "marlin" and engine not in ("vllm", "sglang"):
        return (
            f"--mxfp4-moe marlin is vLLM's and SGLang's Marlin MoE, not {engine}'s: give --engine vllm or another "
            "choice"
        )
    if choice == "mxfp8" and device is not None and not mx_tensor_cores(device):
        return (
            f"--mxfp4-moe mxfp8 needs block-scaled (MX) fp8 tensor cores, which {device.name} lacks (Blackwell has "
            "them): give bf16 or marlin"
        )
    return None


def engine_mxfp4_moe(engine: str, device: DeviceSpec | None) -> Mxfp4Moe | None:
    """How ``engine`` runs MXFP4 experts on ``device`` where the deployment does not say (``--mxfp4-moe`` left out),
    or None: the engine's own kernel as :func:`moe_impl` reads it (vLLM's bf16-activation kernels or Marlin,
    TensorRT-LLM's W4A16 before Blackwell). TensorRT-LLM quantises the activations to MXFP8 on every GPU of compute
    capability 10.0 and later, Blackwell's block-scaled tensor cores: ``ModelConfig.get_mxfp4_quant_algo``
    (``tensorrt_llm/_torch/model_config.py``) returns W4A8_MXFP4_MXFP8 there unless ``OVERRIDE_QUANT_ALGO`` names
    another or the MoE backend is Triton, W4A16_MXFP4 before sm_100; NVIDIA's gpt-oss deployment guide lists MXFP8
    activations as datacenter Blackwell's one path, and AIConfigurator's TensorRT-LLM tables of RTX PRO 6000 (sm_120)
    hold only W4A8 MXFP4 rows (:func:`mx_tensor_cores`, an NVIDIA part). SGLang does the same on datacenter
    Blackwell (sm_100/103, ``tcgen05``): ``ServerArgs`` turns ``--moe-runner-backend auto`` into
    ``flashinfer_mxfp4`` for gpt-oss's MXFP4 checkpoint there (``triton_kernel`` on sm_120), whose default
    ``--flashinfer-mxfp4-moe-precision`` quantises the activations with ``mxfp8_quantize`` before FlashInfer's
    TRT-LLM-gen kernel (``bf16`` would keep them)."""
    if device is None or device.vendor != "nvidia":
        return None
    if engine == "trtllm" and mx_tensor_cores(device):
        return "mxfp8"
    if engine == "sglang" and device.mma_family == "tcgen05":
        return "mxfp8"
    return None


def moe_impl(
    engine: str,
    device: DeviceSpec | None = None,
    expert_weights: str | None = None,
    version: str | None = None,
    mxfp4: str | None = None,
    *,
    block_fp8: bool = False,
) -> str:
    """The ``impl`` of ``engine``'s fused MoE kernel (:data:`ENGINE_MOE_FAMILIES`, else ``trtllm``): for MXFP4
    experts, ``marlin`` where ``mxfp4`` (:data:`MXFP4_MOE`) says so or, when it says nothing, where vLLM runs Marlin
    on ``device`` (:func:`vllm_runs_marlin`); for ``block_fp8`` experts (a block-scaled fp8 checkpoint served in fp8)
    under SGLang, :data:`SGLANG_BLOCK_FP8_MOE_FAMILY`; else the engine's own family."""
    if block_fp8 and engine == "sglang":
        return SGLANG_BLOCK_FP8_MOE_FAMILY
    impl = ENGINE_MOE_FAMILIES.get(engine, "trtllm")
    if expert_weights != "mxfp4":
        return impl
    if mxfp4 == "marlin":
        return "marlin"
    if mxfp4 is None and impl == "vllm" and device is not None and vllm_runs_marlin(device, version):
        return "marlin"
    return impl


@dataclass(frozen=True, kw_only=True, slots=True)
class StepOverhead:
    """CPU time per scheduler step not hidden behind the GPU (estimates; see the module docstring)."""

    fixed_s: float
    """Seconds every step costs on top of the model's forward."""
    per_seq_s: float
    """Seconds per scheduled sequence (input preparation, sampling, output processing)."""
    source: str

    def time_s(self, seqs: int) -> float:
        return self.fixed_s + self.per_seq_s * seqs


OVERHEADS: dict[str, StepOverhead] = {
    "vllm": StepOverhead(fixed_s=400e-6, per_seq_s=2e-6, source="estimate (vLLM V1, CUDA graphs)"),
    "sglang": StepOverhead(fixed_s=150e-6, per_seq_s=1e-6, source="estimate (SGLang overlap scheduler)"),
    "trtllm": StepOverhead(fixed_s=100e-6, per_seq_s=0.5e-6, source="estimate (TensorRT-LLM C++ executor)"),
}
"""Each engine's per-step overhead in its current release."""

VLLM_ASYNC_OUTPUT: Final = (0, 6, 0)
"""The vLLM release that took output processing off the step's critical path (async output processing, on by
default from 0.6.0; the V1 engine, default from 0.8, moved scheduling to its own process)."""

VLLM_SYNC_OUTPUT_OVERHEAD: Final = StepOverhead(
    fixed_s=0.7e-3,
    per_seq_s=50e-6,
    source=(
        "measured (vLLM before 0.6, synchronous output processing): LLM-Inference-Bench's static batches of "
        "Mistral-7B and Qwen2-7B on A100 and H100, vLLM's step growing 22-83 us a sequence and 0.4-0.7 ms more at "
        "batch 1 than TensorRT-LLM's on the same GPU and model; vLLM's own profile of 0.5, 4-13 ms of GPU idle a "
        "decode step (vllm-project/vllm#6854)"
    ),
)
"""vLLM's per-step CPU overhead before :data:`VLLM_ASYNC_OUTPUT`: scheduling, input preparation, sampling's
hand-off and detokenisation on the step's critical path, per sequence (``benchmarks/results/inference_bench.md``)."""


def step_overhead(engine: str, version: str | None = None) -> StepOverhead:
    """``engine``'s per-step overhead at ``version`` (None: the newest): vLLM before :data:`VLLM_ASYNC_OUTPUT`
    pays :data:`VLLM_SYNC_OUTPUT_OVERHEAD`; every other release its :data:`OVERHEADS` entry."""
    if engine == "vllm" and version is not None and parse_engine_version(version) < VLLM_ASYNC_OUTPUT:
        return VLLM_SYNC_OUTPUT_OVERHEAD
    return OVERHEADS[engine]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """What one replica's scheduler may put in a step, and how much memory its KV cache gets."""

    engine: EngineName = "vllm"
    """Serving framework whose behaviour and per-step overhead to follow."""
    max_num_seqs: int = 256
    """Most sequences in one step (running requests)."""
    max_num_batched_tokens: int = 2048
    """Most tokens (prefill chunks plus one per decoding sequence) in one step."""
    chunked_prefill: bool = True
    """Split prompts over steps to fill the token budget beside the decodes; off: a prompt runs
    whole in one step, when it fits the budget left beside the decodes (in-flight batching)."""
    block_size: int = 16
    """Tokens per KV-cache block (page)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's memory the engine may use (weights, activations, KV cache)."""
    memory_fraction_of_free: bool = False
    """TensorRT-LLM: the fraction applies to the memory left after weights and activations."""
    reserve_full_output: bool = False
    """Admit a request only when blocks for its prompt and whole output are free (no preemption)."""
    batch_wait_iters: int = 0
    """TensorRT-LLM's ``batch_wait_timeout_iters`` (:data:`BATCH_WAIT_SOURCE`): while requests decode, a step may
    hold back the prompts it would admit, at most this many steps in a row, to batch more of them together; 0:
    never held."""
    batch_wait_tokens_ratio: float = 0.0
    """TensorRT-LLM's ``batch_wait_max_tokens_ratio``: held prompts go once the step's tokens (the prompts' and one
    a decoding sequence) reach this fraction of ``max_num_batched_tokens``. Prompts are held only when both
    settings are above 0, as in the engine (its test: steps waited >= ``batch_wait_iters`` or tokens >= ratio x
    ``max_num_batched_tokens``, either true at 0)."""
    overhead: StepOverhead = OVERHEADS["vllm"]
    frontend_s: float = 0.0
    """Seconds each request's first token and finish reach the client later than the engine produces them:
    the API server's HTTP handling and the streamed chunk's way back (:data:`FRONTENDS`); 0: not counted."""

    @property
    def batch_waits(self) -> bool:
        """Whether prompts may be held back: both batch-wait settings above 0 (TensorRT-LLM's test is true at 0)."""
        return self.batch_wait_iters > 0 and self.batch_wait_tokens_ratio > 0

    def __post_init__(self) -> None:
        problems = [
            f"{name} {getattr(self, name)} must be >= 1"
            for name in ("max_num_seqs", "max_num_batched_tokens")
            if getattr(self, name) < 1
        ]
        if (block := block_size_problem(self.block_size)) is not None:
            problems.append(block)
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"gpu_memory_utilization {self.gpu_memory_utilization} must lie in (0, 1], e.g. 0.9")
        if self.engine not in ENGINES:
            problems.append(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.batch_wait_iters < 0:
            problems.append(f"batch_wait_iters {self.batch_wait_iters} must be >= 0 steps, e.g. 20")
        if not 0 <= self.batch_wait_tokens_ratio <= 1:
            problems.append(f"batch_wait_tokens_ratio {self.batch_wait_tokens_ratio} must lie in [0, 1], e.g. 0.9")
        if (self.batch_wait_iters or self.batch_wait_tokens_ratio) and self.engine != "trtllm":
            problems.append(
                "batch waiting (--batch-wait-iters, --batch-wait-tokens-ratio) is TensorRT-LLM's "
                f"(batch_wait_timeout_iters, batch_wait_max_tokens_ratio), not {self.engine}'s; give --engine trtllm "
                "or leave them out"
            )
        if not 0 <= self.frontend_s < 10:
            problems.append(f"frontend_s {self.frontend_s} must lie in [0, 10) seconds, e.g. 0.01")
        if problems:
            raise OpcastError("; ".join(problems))


BATCH_WAIT_SOURCE: Final = (
    "TensorRT-LLM's PyTorch executor (tensorrt_llm/_torch/pyexecutor/py_executor.py, _schedule and "
    "_waiting_requests; options batch_wait_timeout_iters and batch_wait_max_tokens_ratio, both 0 by default): with "
    "context requests scheduled beside generation requests, the context requests are dropped from the step until "
    "the steps waited reach batch_wait_timeout_iters or the scheduled tokens (context tokens plus one per "
    "generation request) reach batch_wait_max_tokens_ratio x max_num_tokens; the count restarts when they go"
)
"""Where :attr:`EngineConfig.batch_wait_iters` and :attr:`EngineConfig.batch_wait_tokens_ratio` come from."""

MAX_BLOCK_SIZE: Final = 256
"""Most tokens per KV-cache block (page): vLLM's largest (``vllm/config/cache.py``: ``BlockSize = Literal[1, 8, 16,
32, 64, 128, 256]``, the choices of ``--block-size``); TensorRT-LLM's ``tokens_per_block`` is a power of two, 32 to
128 by default; SGLang's pages hold 1 token. A block of 10^8 tokens made one page larger than the GPU's free
memory, so the simulation refused gpt3-125m on an H100 as 'the KV cache holds 0 tokens' and advised more --tp."""


def block_size_problem(block_size: int, said: str = "block_size") -> str | None:
    """Why ``block_size`` is no KV-cache block an engine takes (:data:`MAX_BLOCK_SIZE`), or None."""
    if 1 <= block_size <= MAX_BLOCK_SIZE:
        return None
    return (
        f"{said} {block_size} must lie in [1, {MAX_BLOCK_SIZE}] tokens (vLLM's largest KV-cache block is "
        f"{MAX_BLOCK_SIZE}), e.g. 16"
    )


FRONTENDS: dict[str, float] = {"vllm": 0.0102}
"""Seconds between the client and the engine per request (:attr:`EngineConfig.frontend_s`), measured: vLLM's
OpenAI server, the client's TTFT less the server's own ``vllm:time_to_first_token_seconds`` (scraped around each
run), 8.4 and 12.0 ms on the completions endpoint that ``benchmark_serving.py``'s vllm backend uses (11.0-12.2
on chat, 10.5 on responses), ``vllm bench serve``, 32 prompts at concurrency 8 (vllm-project/vllm pull request
54628, 2026: Qwen2.5-0.5B on an RTX 4070 Laptop; the HTTP and streaming work is the host's, not the model's).
SGLang and TensorRT-LLM: not measured, 0."""


def engine_defaults(engine: str, device) -> EngineConfig:
    """``engine``'s defaults on ``device`` (see the module docstring for their sources)."""
    mem_gib = device.mem_bytes / 2**30
    if engine == "vllm":
        big = mem_gib >= 70 and "a100" not in device.name.lower()
        return EngineConfig(
            engine="vllm",
            max_num_seqs=1024 if big else 256,
            max_num_batched_tokens=8192 if big else 2048,
            chunked_prefill=True,
            block_size=16,
            gpu_memory_utilization=0.9,
            overhead=OVERHEADS["vllm"],
            frontend_s=FRONTENDS["vllm"],
        )
    if engine == "sglang":
        chunk = 8192 if mem_gib >= 60 else 4096 if mem_gib >= 35 else 2048
        return EngineConfig(
            engine="sglang",
            max_num_seqs=1024,
            max_num_batched_tokens=chunk,
            chunked_prefill=True,
            block_size=1,
            gpu_memory_utilization=0.88,
            overhead=OVERHEADS["sglang"],
        )
    if engine == "trtllm":
        return EngineConfig(
            engine="trtllm",
            max_num_seqs=2048,
            max_num_batched_tokens=8192,
            chunked_prefill=False,
            block_size=32,
            gpu_memory_utilization=0.9,
            memory_fraction_of_free=True,
            reserve_full_output=True,
            overhead=OVERHEADS["trtllm"],
        )
    raise OpcastError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")


def limits_problem(engine: str, max_num_seqs: int, max_num_batched_tokens: int) -> str | None:
    """Why ``engine`` refuses to start with these step limits, or None. vLLM raises when
    ``max_num_batched_tokens < max_num_seqs`` (``vllm/config/scheduler.py``,
    ``SchedulerConfig.verify_max_model_len``: "max_num_batched_tokens (...) must be greater than or equal to
    max_num_seqs (...)"); a defaulted limit counts, as there (``EngineArgs`` fills only those not given).
    SGLang and TensorRT-LLM: no such check known; a step then holds at most ``max_num_batched_tokens``
    sequences (:func:`~opcast.predict.serve.deployment.replica_step_cost` clamps)."""
    if engine == "vllm" and max_num_batched_tokens < max_num_seqs:
        return (
            f"max_num_batched_tokens {max_num_batched_tokens:,} is below max_num_seqs {max_num_seqs:,}, which vLLM "
            "refuses (every running sequence needs a token of the step)"
        )
    return None


def engine_config(engine: str, device, **overrides) -> EngineConfig:
    """``engine``'s defaults on ``device`` with every override that is not None; raises
    :class:`OpcastError` for limits the engine refuses (:func:`limits_problem`)."""
    base = engine_defaults(engine, device)
    config = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    problem = limits_problem(config.engine, config.max_num_seqs, config.max_num_batched_tokens)
    if problem is not None:
        raise OpcastError(
            f"{problem}: give --max-num-batched-tokens >= {config.max_num_seqs} or --max-num-seqs <= "
            f"{config.max_num_batched_tokens}"
        )
    return config
