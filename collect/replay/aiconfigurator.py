"""NVIDIA AIConfigurator's measured kernel database (PyPI ``aiconfigurator-core``, Apache-2.0;
source ai-dynamo/aiconfigurator): bf16/fp8/block-scaled fp8/nvfp4 GEMMs, prefill and decode attention and NCCL
collectives measured on ten systems.

Layout read (``ROOT`` = the package's ``systems/data`` folder; the package folder or its
``systems`` folder work too; with no path, the installed package's data is found with
``importlib.util.find_spec`` and nothing of it is imported)::

    <system>/<family>/<framework>/<version>/<table>.parquet  (+ collection_meta.yaml)

Systems and the catalog devices they map to (:data:`SYSTEM_DEVICES`; a system whose device the
catalog lacks, or a folder not in the table that the catalog cannot name either, is skipped with
a counted reason). Latency is in milliseconds in every table (checked: h100_sxm bf16
32768x65536x12288 = 60.3 ms with vLLM's ``torch.nn.functional.linear``, 875 TFLOP/s, 88 % of the
989 TFLOP/s peak); ``time_s_median`` = latency / 1e3.

Tables converted (all forward, one measurement per row):

``gemm/gemm_perf``
    ``gemm`` b=1, m, n, k (``x = [m, k]`` times the ``[n, k]`` weight of a ``Linear(k, n)``,
    collector/trtllm/collect_gemm.py). dtype: ``bfloat16`` -> bf16, ``fp8`` (per-tensor scaled
    e4m3, bf16 output) -> fp8, ``fp8_block`` (e4m3 with block scales: DeepSeek-style 1x128 /
    128x128 fp32 scales on Hopper, DeepGEMM / Cutlass / FlashInfer block-scaled kernels on
    Blackwell; another kernel than per-tensor fp8, so its own dtype and predictor group) ->
    fp8_block, ``nvfp4`` (e2m1 with an E4M3 scale per 16 elements; B200, GB200, B300, GB300,
    RTX PRO 6000) -> nvfp4. Skipped with reasons: ``int8_wo`` / ``int4_wo`` / ``sq`` (integer
    weight-only and SmoothQuant GEMMs), a block-scaled row of a device without the peak it runs
    at (nvfp4 where ``peak_fp4_flops`` is null), vLLM's fp8_block rows (timed eagerly). The latency is the
    mean per call of a CUDA-graph loop (collector/helper.py ``benchmark_with_power``: 3 warm-up and 6 timed
    replays); TensorRT-LLM cycles distinct weight copies past the L2 cache, SGLang up to 6 copies by a memory
    budget, vLLM 6 copies but one for nvfp4. The quantised dtypes' timed call starts from a bf16 activation
    and quantises it (fp8: per-tensor in TRT-LLM, per-token in vLLM and SGLang; fp8_block per 1x128 group;
    nvfp4), so those rows hold the activation's quantisation too; the bf16 rows are the GEMM alone.
    vLLM's fp8 rows (its ``CutlassFP8ScaledMMLinearKernel`` lane) are replayed twice: once as candidates of the
    default kernel family under the precedence below, once as ``impl`` vllm (:data:`opcast.ops.GEMM_IMPLS`), the
    kernel family ``--engine vllm`` prices its fp8 linears with (``gemm_impls``: the families kept, default both).
    ``fp8_gemm_alone=True`` subtracts it from TensorRT-LLM's fp8 rows (:data:`QUANT_TABLES`; off by
    default, :data:`FP8_GEMM_ALONE` says why); the fp8_block and nvfp4 rows keep it (AIConfigurator
    publishes no quantize table of those: a few per cent of a GEMM at training sizes by its bandwidth,
    more on small ones).
``attention/context_attention_perf``
    Prefill: ``attention`` batch=batch_size, heads=num_heads, kv_heads=num_key_value_heads,
    seq_q = seq_kv = isl, head_dim, causal, impl ``flash`` (every lane is a fused kernel: TRT-LLM
    FMHA, FlashAttention 2/3/4, FlashInfer, Triton). The timed call also writes K and V into the
    paged cache and applies RoPE inside the kernel (collector/trtllm/collect_attn.py).
``attention/generation_attention_perf``
    Decode: the collector's ``step`` is the number of cached tokens (``s - 1`` for the s-th
    token), so seq_q = 1 and seq_kv = step + 1 (the new token attends to the cache and itself);
    causal True (identical to non-causal for one query).
    Attention dtype: (attn_dtype, kv_cache_dtype) ``(bfloat16, bfloat16)`` -> bf16, ``(fp8,
    fp8)`` -> fp8 (FP8 FMHA over an fp8 cache). Skipped with reasons: bf16 attention over an fp8
    KV cache (the registry has one dtype per op), ``window_size`` > 0 (sliding window: the
    registry's attention has no window), ``beam_width`` > 1.
``comm/nccl_perf`` (and ``comm/oneccl_perf``, Intel's oneCCL on the B60)
    nccl-tests (``all_gather_perf`` ... ``-d half -w 40 -a 1 -c 0``, collector/collect_nccl.py):
    ``message_size`` is in *elements* (the collector divides nccl-tests' byte size by the element
    size), so bytes = message_size x 2 for ``half`` -> fp16; ``int8`` rows are skipped (opcast has
    no int8 dtype, as in the nccl-tests importer). ``all_gather``, ``all_reduce``,
    ``reduce_scatter``, ``alltoall`` -> all_to_all; nccl-tests' size convention is opcast's
    (all_gather: gathered output; reduce_scatter: input). world_size = num_gpus on one node
    (nccl-tests ``-t num_gpus``: one process), gpus_per_node = num_gpus. The time is nccl-tests'
    out-of-place mean over its iterations, averaged across ranks (``-a 1``). ``backend`` is
    ``nccl`` (``oneccl`` for oneccl_perf) and ``cluster`` the catalog node the system folder
    describes (:data:`SYSTEM_CLUSTERS`: one NVLink/NVSwitch node, or for L40S and RTX PRO 6000
    one 8-GPU PCIe server, so only its intra-node tier is measured), null for a system without one
    (the B60).

``comm/custom_allreduce_perf``
    The serving engines' own tensor-parallel all-reduce (collector/collect_all_reduce.py: vLLM's
    and SGLang's ``tensor_model_parallel_all_reduce``, TRT-LLM's ``AllReduce`` with strategy AUTO;
    AIConfigurator 0.12.0 ships vLLM 0.14-0.27, SGLang 0.5.6-0.5.14 and TRT-LLM 1.0-1.3 tables).
    ``message_size`` is in elements of ``allreduce_dtype`` (the collector allocates a tensor of
    that many), one node of ``num_gpus``. Rows become ``all_reduce`` bf16 with ``backend``
    :data:`CUSTOM_BACKEND` (the NCCL rows are fp16, so the two never share a dataset key); the
    training of :mod:`opcast.train.collectives` fits them as their own law (``all_reduce_custom``).
    Kept: the CUDA-graph lane (``*_graph`` / TRT-LLM's graph-only rows: serving engines replay
    decode steps as CUDA graphs, and the graph replay times the kernels alone). Skipped with
    reasons: the eager lane (a Python loop that clones the input and copies it into the IPC
    buffer per call: about 40 us flat on A100 for any size under 1 MiB, the host's dispatch rate,
    not the kernel), messages of :data:`CUSTOM_MAX_BYTES` and more (vLLM dispatches those to NCCL
    or symmetric memory: ``CustomAllreduce.should_custom_ar`` in
    vllm/distributed/device_communicators/custom_all_reduce.py answers ``inp_size < max_size``,
    ``max_size`` 8 MiB by default; the A100 vLLM 0.14 rows meet NCCL's time from 8 MiB on), and
    dtypes other than bfloat16. Where several frameworks measured one configuration, the
    precedence below keeps vLLM's (SGLang's kernel is a port of vLLM's; TRT-LLM's AUTO strategy
    switches to NCCL from about 1 MiB, so its rows fill only what vLLM lacks).
    TensorRT-LLM's rows are also replayed as a family of their own (:data:`CUSTOM_FAMILIES`,
    ``backend`` trtllm, the law ``all_reduce_trtllm``): what ``--engine trtllm`` runs. Its
    ``AllReduce`` with strategy AUTO picks one-shot, two-shot or NCCL itself per message
    (``AllreduceOp::getRuntimeStrategy`` -> ``selectImplementation`` in
    cpp/tensorrt_llm/thop/allreduceOp.cpp), so that family keeps every size its rows measured
    (256 B to 1 GiB), the 8 MiB and more included: the rows are the engine's choice at each size.

``moe/moe_perf``
    An engine's fused MoE layer, one rank of ``moe_tp_size x moe_ep_size``: TensorRT-LLM's (``impl`` trtllm) or
    vLLM's (``impl`` vllm, collector/vllm/collect_moe.py: vLLM's ``FusedMoE`` layer with the kernel it selects for
    the dtype on that GPU, timed the same way; :data:`MOE_FRAMEWORKS`). TensorRT-LLM's
    (collector/trtllm/collect_moe.py: ``create_moe(...).forward(hidden_states, router_logits)`` in a CUDA
    graph, mean of 6 replays: top-k routing over the given logits, fp8's activation quantisation, permute, the
    two grouped GEMMs and the activation, un-permute and the weighted top-k sum; not the router GEMM, no
    all-reduce). ``moe`` tokens=num_tokens (every token of the group reaches the rank), hidden=hidden_size,
    inter = inter_size / moe_tp_size, experts=num_experts, topk, ep=moe_ep_size, gated and fn from the kernel
    lane (``moe_torch_flow_nongated``: Relu2, coded ``relu``, not gated; the others SwiGLU). dtype as the GEMMs'
    (:data:`MOE_DTYPES`); ``w4a16_mxfp4`` (gpt-oss's MXFP4 experts with bf16 activations) is dtype bf16 with
    weights=mxfp4, ``w4a8_mxfp4_mxfp8`` (the same experts with MXFP8 activations) dtype fp8_block with weights=mxfp4
    (:data:`MOE_NARROW_WEIGHT_DTYPES`); vLLM's rows map the same way (every vLLM lane is gated
    SwiGLU). Skipped with reasons: SGLang's MoE rows (:data:`MOE_FRAMEWORKS`), the ``power_law_*`` routing
    distributions (:data:`MOE_DISTRIBUTION_REASON`), the min-latency lane (:data:`MOE_SKIPPED_LANES`), the other
    weight-only dtypes (int4_wo, w4afp8), an inter_size moe_tp_size does
    not divide.
    The newest release wins where two measured one configuration (1.3.0rc23 re-measured the Nemotron-3 shapes
    of 1.3.0rc20 on Hopper; AIConfigurator's own reuse note puts the two within 1-3 %). vLLM's rows come from one
    release per (system, family, dtype, weights), the newest that measured it (:func:`_newest_vllm_moe`: its releases
    dispatch a dtype to different kernels, so an older one's shapes are left out, not filled in); within one
    release each shape is measured by one kernel lane (the one vLLM dispatched to; were two, the densest lane
    wins, rule 3 below). The dataset key holds ``impl``, so an engine's row never replaces the other's.

Every other table (MLA, MoE all-to-all, DeepSeek modules, Mamba, quantize kernels, ...) is skipped with a
counted reason: :data:`TABLE_REASONS`, else "no opcast op".

Provenance: ``source_file`` is the parquet path relative to ROOT (system/family/framework/
version), ``kernel_name`` is ``"<framework> <version>: <kernel_source>"`` (e.g. ``"trtllm
1.3.0rc20: torch_flow"``), ``torch_version`` / ``cuda_version`` come from ``runtime.abi`` of the
folder's collection_meta.yaml where it has them. ``n_reps`` is null (the tables do not say).

One row per configuration. Several frameworks, versions and kernels (``kernel_source`` lanes)
measure the same shapes with different latencies; the dataset keys a row by (device, op config,
dtype, direction), so exactly one measurement is kept, the first in this precedence:

1. framework, in the order of ``frameworks`` (default :data:`FRAMEWORKS`: nccl, vllm, trtllm,
   sglang; any other framework after these, by name). vLLM first because, over the configurations
   that several frameworks measured, its rows sit closest to the per-configuration median
   (median absolute log-ratio: gemm bf16 0.9 %, fp8 3.7 %, prefill bf16 3.7 %, decode bf16 5.2 %),
   while TRT-LLM's prefill rows run 18 % above it (its timed call also writes the paged KV cache
   and applies RoPE) and its small fp8 GEMMs are often slower; TRT-LLM and SGLang fill the shapes
   and dtypes vLLM lacks (fp8 attention, most A100 GEMMs). fp8 GEMMs take ``fp8_gemm_frameworks``
   (default :data:`GEMM_FP8_FRAMEWORKS`: TensorRT-LLM's cuBLASLt rows first, the kernel family of
   Transformer Engine's fp8 training), block-scaled GEMMs :data:`GEMM_BLOCK_FRAMEWORKS` (fp8_block
   TensorRT-LLM's first, nvfp4 vLLM's; vLLM's fp8_block rows are skipped: :data:`VLLM_FP8_BLOCK_REASON`);
2. newest version of that framework first;
3. within one file and dtype, the densest kernel lane first (most rows, then name: the ranking
   AIConfigurator itself uses for donor lanes), so one file contributes one kernel per dtype
   where it can.

The others are counted as skipped ("another kernel", "older version" or "lower-precedence
framework"). Before that choice a bf16 GEMM row that precedence would keep is screened against the
system's tables of the same shape (:data:`SPIKE_DTYPES`, :data:`SPIKE_RATIO`): where it ran more
than 1.3x their median, it is a slow spike of its collection and the next row in precedence is kept
(counted, "a slow spike"). Attention rows take ``attention_frameworks`` (default: ``frameworks``) and, by
default (:data:`ATTENTION_FILL`), come from one framework release per (system, phase, dtype): the
first in that precedence that measured any row of it. The shapes it did not measure are left out
(counted, "one kernel family per system and label, no fill-in") rather than filled with another
engine's kernels (see :data:`ATTENTION_FILL` for why and the evidence).

A configuration repeated within one file and lane (some nccl files hold several runs) becomes one
row: the median, with p20/p80 from 3 repeats on.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from opcast.collect.replay.common import MalformedFile, ReplayResult
from opcast.dtypes import BLOCK_SCALED_DTYPES
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.ops import GEMM_IMPLS, bus_factor

if TYPE_CHECKING:
    from opcast.collect.replay import ReplayOptions

PACKAGE: Final = "aiconfigurator_core"
DATA_DIR: Final = Path("systems") / "data"

SYSTEM_DEVICES: Final[dict[str, str]] = {
    "a100_sxm": "A100-SXM4-80GB",
    "h100_sxm": "H100-SXM",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "b300_sxm": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
    "l40s": "L40S",
    "rtx_pro_6000_server": "RTX-PRO-6000",
    "b60": "Arc-Pro-B60",
}
"""AIConfigurator system folder -> hardware catalog name."""

SYSTEM_CLUSTERS: Final[dict[str, str]] = {
    "a100_sxm": "dgx-a100",
    "h100_sxm": "dgx-h100",
    "h200_sxm": "dgx-h200",
    "b200_sxm": "dgx-b200",
    "b300_sxm": "dgx-b300",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
    "l40s": "l40s-pcie-8",
    "rtx_pro_6000_server": "rtx-pro-6000-pcie-8",
}
"""AIConfigurator system folder -> cluster catalog name, for its NCCL rows: the node each system's
``systems/<name>.yaml`` describes. The SXM systems are their vendor reference node (DGX: 8 GPUs
on NVSwitch; GB200 and GB300: NVL72); L40S and RTX PRO 6000 have none, so their clusters are the
8-GPU PCIe servers the yaml's node section describes (PCIe 4.0 / 5.0 x16, its network figures).
The B60 (oneCCL) has no cluster."""

FRAMEWORKS: Final = ("nccl", "vllm", "trtllm", "sglang")
"""Default framework precedence when several measured the same configuration."""
GEMM_FP8_FRAMEWORKS: Final = ("trtllm", "vllm", "sglang")
"""Framework precedence of the fp8 GEMM rows: TensorRT-LLM's first. Its fp8 GEMM is one cuBLASLt
call on per-tensor scales, the kernel family Transformer Engine's fp8 training GEMMs run
(``cublasLtMatmul``), where vLLM's is CUTLASS's ``cutlass_scaled_mm``; the two differ by 10-45 % on
the same shapes, by an amount that changes from GPU to GPU. With TensorRT-LLM's rows, leave-one-GPU-out
fp8 GEMM error is 8.7 % against 15.2 % with vLLM's (``python benchmarks/modern_gpus.py --precedence``,
benchmarks/results/modern_gpus.md, 2026-12-02)."""

GEMM_BLOCK_FRAMEWORKS: Final = {"fp8_block": ("trtllm", "sglang"), "nvfp4": ("vllm", "sglang", "trtllm")}
"""Framework precedence of the block-scaled GEMM rows: fp8_block TensorRT-LLM's first as for fp8; nvfp4 vLLM's, then
SGLang's (both FlashInfer's CuTe-DSL kernel), TensorRT-LLM's last. TensorRT-LLM's nvfp4 call carries some 9 us the
other two do not at small m, its floor 20.8-22.5 us where vLLM's and SGLang's are 11.3-13.5 us at k = 8192,
m = 4-64 on B200, B300 and GB200 (all three quantise their input inside the call), while the three agree within
0.85-1.15x from m = 1024 up; NVIDIA's measured serving of Llama-3.1-70B nvfp4 on B200 (``benchmarks/aic_serving.py``)
decodes faster than TensorRT-LLM's floor allows under both engines (TPOT +25 to +28 % signed with its rows). Every
framework's fp8_block and nvfp4 call quantises its bf16 activation inside the timed call (TRT-LLM
``fp8_quantize_1x128`` / ``fp4_quantize``, SGLang ``sglang_per_token_group_quant_fp8`` /
``flashinfer_fp4_quantize``, vLLM's linear methods), all in a CUDA graph but vLLM's fp8_block
(:data:`VLLM_FP8_BLOCK_REASON`); TRT-LLM cycles weight copies past the L2 as for the other dtypes
(ai-dynamo/aiconfigurator ``collector/{trtllm,sglang,vllm}/collect_gemm.py`` at 095f58a). SGLang's
DeepGEMM rows agree with TRT-LLM's within 0.82-1.05x on fp8_block."""
DEFAULT_FAMILY: Final = ""
"""``impl`` of a GEMM or collective row of the default family while the replay ranks rows (a string, so that the
selection's keys hold no missing value); written unset (None), so that such a row keeps the id it had before its kind
had families."""
GEMM_FAMILIES: Final = {"vllm": ("fp8", "vllm")}
"""framework -> (dtype, ``impl``): the GEMM rows of that framework and dtype that are also replayed as a kernel family
of their own (:data:`opcast.ops.GEMM_IMPLS`): vLLM's per-tensor fp8 linear (CUTLASS ``cutlass_scaled_mm``), which
``--engine vllm`` runs, where the default family's fp8 rows are TensorRT-LLM's cuBLASLt GEMM
(:data:`GEMM_FP8_FRAMEWORKS`). SGLang's fp8 lane (``sgl_kernel`` ``fp8_scaled_mm``, a port of vLLM's) is not one yet."""
SPIKE_DTYPES: Final = ("bf16",)
"""GEMM dtypes whose rows the replay screens for slow spikes (:func:`_drop_spikes`): those every framework times
as the same kernel family, cuBLAS through ``torch.nn.functional.linear`` (vLLM's and SGLang's ``torch_linear``
lanes, TRT-LLM's ``torch_flow``), so the system's tables of one shape are independent collections of one
kernel. fp8 and the block-scaled dtypes run another kernel in each framework (cuBLASLt, CUTLASS, DeepGEMM)
and are not screened."""
SPIKE_RATIO: Final = 1.3
"""A row that precedence would keep is a slow spike when its time exceeds this multiple of the median of the
system's tables of the same shape and dtype (its own included; another framework or release each). Timing noise
on a GPU is one-sided (interference, clocks and power only slow a kernel), and AIConfigurator's own
collection notes name it: ``systems/data/gb200/gemm/sglang/0.5.14/collection_meta.yaml`` (AIC-1759) counts
keys that "sit >1.3x above" as spikes of that platform ("one-sided spike contamination") and keeps the per-key
minimum of two runs. Its GB200 vLLM 0.24 bf16 table is such a run: on its 1,195 shapes of 1 ms and more it sits
1.17x above the per-shape median of GB200's three tables (every other system's vLLM table: 0.93-0.99x,
``benchmarks/results/modern_gpus.md``, 2026-12-05), bimodal; the screen keeps TRT-LLM's row for 617 of its
shapes. A spike of the reference itself only raises the bar (fewer rows replaced)."""
QUANT_TABLES: Final = ("computescale_perf", "scale_matrix_perf")
"""AIConfigurator's ``quantize/trtllm/<version>/`` tables: TensorRT-LLM's dynamic per-tensor fp8
quantisation of an ``[m, k]`` bf16 activation, ``quantize_e4m3_per_tensor``'s amax pass
(``compute_scale``) and its quantising pass (``scale_matrix``), timed alone on the GEMM tables' (m, k)
grid (collector/trtllm/collect_computescale.py). TensorRT-LLM's fp8 GEMM rows time exactly these two
before the cuBLASLt GEMM (collector/trtllm/collect_gemm.py: "the collected fp8 GEMM includes the
compute-scale overhead"), so the replay subtracts them (:func:`_gemm_alone`): opcast prices Transformer
Engine's casts as their own kernels (``opcast.predict.graph.fp8_quantisation``), and a GEMM row holding a
quantisation too counted it twice (9-20 % of an H100 fp8 GEMM from m*n*k = 1e11 up, 40-70 % below 1e9).
AIConfigurator derives its static-fp8 GEMM the same way (aic-core ``perf_database._gemm_key_names``)."""
FP8_GEMM_ALONE: Final = False
"""Whether :func:`replay` subtracts :data:`QUANT_TABLES` from TensorRT-LLM's fp8 GEMM rows by default.
Off: measured on NVIDIA's published step times (``benchmarks/nemo_public.py``, 38 runs), the refit with the
GEMM alone priced every fp8 run 10-15 % faster, and the mean error went from 10.6 to 19.8 % (H100 FP8
5.1 -> 14.5 %, every H100 row faster than measured, delayed and current scaling alike; MosaicML's H100 FP8
runs 10.3 -> 12.4 %). The GEMM-alone rows are the right price of the GEMM, so something of about that size
is missing elsewhere in a training step (candidates not yet measured: clocks sustained under the power
limit in long runs against AIConfigurator's 9-replay bursts; current scaling's amax passes, which
``opcast.predict.graph.fp8_quantisation`` prices as delayed scaling's fused casts); until it is found the
rows stay as measured, quantisation included, and the casts are counted twice (2026-12-02)."""
FP8_QUANT_KEPT: Final = "with dynamic fp8 quantisation (no quantize table to subtract)"
"""Appended to the ``kernel_source`` of TensorRT-LLM fp8 rows whose quantisation could not be subtracted."""
FP8_QUANT_GONE: Final = "GEMM alone (dynamic fp8 quantisation subtracted)"
"""Appended to the ``kernel_source`` of TensorRT-LLM fp8 rows after :func:`_gemm_alone`."""

VLLM_FP8_BLOCK_REASON: Final = (
    "gemm fp8_block (vllm): timed without a CUDA graph and with one weight copy (AIConfigurator "
    "collector/vllm/collect_gemm.py: use_cuda_graph=gemm_type != 'fp8_block'), so host-launch bound: a floor of "
    "55 us on H100 to 240 us on GB200 where TensorRT-LLM's rows start at 4-5 us"
)

ATTENTION_FILL: Final = False
"""Whether other frameworks (or older releases of the first) fill the attention shapes that the first
framework release of a (system, phase, dtype) did not measure. Not by default: each engine's attention
is a different kernel family whose speed relative to the others changes from GPU to GPU, so filling
one engine's gaps with another's puts a per-GPU step inside a label. On the shapes both measured,
TensorRT-LLM's decode (XQA/MMHA) runs 11-14 % slower than vLLM's on the Blackwell systems (where vLLM
calls FlashInfer's TRT-LLM-gen decode), as fast on Hopper (FlashAttention 3) and 13-22 % faster on
L40S and RTX PRO 6000 (FlashAttention 2); its prefill (which also writes the paged KV cache and
applies RoPE) runs 22-39 % slower, by an amount that also moves per GPU; SGLang's FlashInfer fill-in
on L40S / RTX PRO 6000 and its ``trtllm_mha`` lane on Blackwell were predicted 100-500 % off. With
fill-in TensorRT-LLM supplied a third of every system's decode rows (MHA and wide-KV shapes vLLM did
not measure), and vLLM 0.22's FlashInfer decode filled B200's gaps under 0.24's TRT-LLM-gen kernels.
Leave-one-GPU-out MAPE over nine systems (``python benchmarks/modern_gpus.py --sections logo``,
against ``--attention-fill yes``; 2026-12-02, seed 0 / seed 1): prefill bf16 15.6 / 14.8 -> 11.5 /
11.9 %, prefill fp8 12.4 / 12.3 -> 11.8 / 11.8 %, decode bf16 18.3 / 18.0 -> 13.0 / 13.4 % with one
framework release per label, vLLM first (fp8 prefill is TensorRT-LLM's alone: vLLM measured none);
the other labels do not move. TensorRT-LLM first, also without fill-in (``--attention-precedence
trtllm,vllm,sglang``), gives 13.1 / 11.8 / 15.1 % (seed 0). The engine's own dispatch
within one release (vLLM's FlashAttention 4 for head_dim 512 on Hopper, its decode kernel for
one-token prefills on Blackwell: lanes of one file) stays in: that is the kernel its users run."""

TIMING_KERNEL: Final = "replay:aiconfigurator:mean"
TIMING_NCCL: Final = "replay:aiconfigurator:nccl-tests-avg"

GEMM_DTYPES: Final = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
GEMM_SKIPPED: Final = {
    "int8_wo": "gemm int8_wo: integer weight-only GEMM, no opcast dtype",
    "int4_wo": "gemm int4_wo: integer weight-only GEMM, no opcast dtype",
    "sq": "gemm sq: SmoothQuant int8 GEMM, no opcast dtype",
}
ATTENTION_DTYPES: Final = {("bfloat16", "bfloat16"): "bf16", ("float16", "float16"): "bf16", ("fp8", "fp8"): "fp8"}
"""(attn_dtype, kv_cache_dtype) -> opcast dtype. The collectors label bf16 tensors ``float16`` in
older versions (collect_attn.py builds q and kv with ``.bfloat16()``)."""
COLLECTIVES: Final = {
    "all_gather": "all_gather",
    "all_reduce": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
}
COLLECTIVE_DTYPES: Final = {"half": ("fp16", 2)}
CUSTOM_TABLE: Final = "custom_allreduce_perf"
CUSTOM_BACKEND: Final = "custom"
"""``backend`` of the serving engines' custom all-reduce rows (:data:`CUSTOM_TABLE`)."""
CUSTOM_DTYPES: Final = {"bfloat16": ("bf16", 2)}
CUSTOM_MAX_BYTES: Final = 8 * 1024 * 1024
"""vLLM's ``CustomAllreduce`` default ``max_size`` (8192 * 1024 bytes): at and above it vLLM's
all-reduce is not the custom kernel (``should_custom_ar``: ``inp_size < self.max_size``)."""
TIMING_CUSTOM: Final = "replay:aiconfigurator:cuda-graph-mean"
CUSTOM_FAMILIES: Final = {"trtllm": "trtllm"}
"""framework -> ``backend``: the custom all-reduce rows of that framework that are also replayed as a family of
their own, every size kept (module docstring): TensorRT-LLM's ``AllReduce`` (strategy AUTO), which ``--engine
trtllm`` runs, where the shared ``custom`` family is vLLM's kernel first."""

MOE_TABLE: Final = "moe_perf"
MOE_FRAMEWORKS: Final = {"trtllm": "trtllm", "vllm": "vllm"}
"""Engines whose fused MoE rows are replayed -> the ``impl`` (:data:`opcast.ops.MOE_IMPLS`) their rows carry:
TensorRT-LLM's CUTLASS / TRT-LLM-gen grouped-GEMM MoE, and vLLM's own ``FusedMoE`` layer as it dispatches
(collector/vllm/collect_moe.py; 0.24.0 on H100 / H200: Triton ``fused_moe`` for bf16, FlashInfer CUTLASS for fp8,
OpenAI Triton ``matmul_ogs`` for gpt-oss's MXFP4 and Marlin for other MXFP4 checkpoints; FlashInfer TRT-LLM-gen
kernels on Blackwell; Triton or Marlin on L40S). Each engine's rows are their own kernel family, so a learned model
tells them apart by ``impl`` instead of averaging engines. SGLang's rows stay skipped (no engine prices them)."""
MOE_MARLIN_LANE: Final = "marlin"
"""A vLLM moe row whose ``kernel_source`` names this ran vLLM's Marlin W4A16 MoE (0.24.0: gpt-oss's MXFP4 on L40S
and RTX PRO 6000, compressed-tensors MXFP4 on H100 / H200 / B200): its family is ``marlin``
(:data:`opcast.ops.MOE_IMPLS`), not ``vllm``."""
MOE_IMPL_REASON: Final = "moe ({}): a kernel family not asked for (replay(moe_impls=...))"
"""Why a moe row of a kernel family left out by ``replay(moe_impls=...)`` is skipped."""
MOE_VLLM_RELEASE_REASON: Final = (
    "moe (vllm) {}: measured by an older vLLM release than this system's newest of that dtype ({}); left out "
    "(one vLLM release per system and dtype, no fill-in)"
)
"""Why a vLLM moe row of an older release is skipped (:func:`_newest_vllm_moe`)."""
MOE_DTYPES: Final = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
MOE_NARROW_WEIGHT_DTYPES: Final = {"w4a16_mxfp4": ("bf16", "mxfp4"), "w4a8_mxfp4_mxfp8": ("fp8_block", "mxfp4")}
"""MoE dtypes whose expert weights are stored narrower than the GEMMs' dtype, replayed: (the GEMMs' dtype, the
experts' storage, :data:`opcast.ops.MOE_WEIGHTS`). ``w4a16_mxfp4``: MXFP4 expert weights dequantised in the kernel,
bf16 activations (TensorRT-LLM's W4A16 MXFP4 MoE; gpt-oss's checkpoint format). ``w4a8_mxfp4_mxfp8``: the same
weights against activations quantised to MXFP8 (e4m3 values, one E8M0 scale per 32), both fed to Blackwell's
block-scaled tensor cores at the fp8 rate (TensorRT-LLM's W4A8_MXFP4_MXFP8 MoE, FlashInfer's TRT-LLM-gen kernel
under vLLM's ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``): dtype fp8_block, opcast's block-scaled fp8 (MXFP8)."""
MOE_NONGATED: Final = "moe_torch_flow_nongated"
"""The lane of the non-gated (Relu2) experts; every other lane runs SwiGLU experts."""
MOE_SKIPPED_LANES: Final = {
    "moe_torch_flow_min_latency": "moe moe_torch_flow_min_latency: TRT-LLM-gen's min-latency nvfp4 lane, timed "
    "without the finalize (do_finalize=False), so not the whole layer",
}
MOE_DISTRIBUTION_REASON: Final = (
    "moe {}: skewed routing; only the balanced rows are replayed (the registry's moe prices balanced routing, "
    "opcast.ops.moe_balanced_experts)"
)
MOE_FRAMEWORK_REASON: Final = (
    "moe ({}): another engine's fused MoE kernels; only TensorRT-LLM's and vLLM's are replayed"
)

ATTENTION_TABLES: Final = {"context_attention_perf": "context", "generation_attention_perf": "generation"}
COLLECTIVE_TABLES: Final = ("nccl_perf", "oneccl_perf")
TABLE_REASONS: Final[dict[str, str]] = {
    "computescale_perf": "quantize/computescale_perf: fp8 activation quantisation (amax pass), subtracted from "
    "TensorRT-LLM's fp8 GEMM rows with fp8_gemm_alone (QUANT_TABLES), not a row of its own",
    "scale_matrix_perf": "quantize/scale_matrix_perf: fp8 activation quantisation (quantising pass), subtracted from "
    "TensorRT-LLM's fp8 GEMM rows with fp8_gemm_alone (QUANT_TABLES), not a row of its own",
    "moe_a2a_perf": "comm/moe_a2a_perf: MoE token dispatch/combine; the registry has no MoE op",
    "mla_bmm_perf": "mla_bmm/mla_bmm_perf: DeepSeek MLA absorbed BMMs (shape constants not in the table)",
}

_SOURCE_COLUMNS: Final = {
    "gemm_perf": ("kernel_source", "gemm_dtype", "m", "n", "k", "latency"),
    "context_attention_perf": (
        "kernel_source",
        "batch_size",
        "isl",
        "num_heads",
        "num_key_value_heads",
        "head_dim",
        "attn_dtype",
        "kv_cache_dtype",
        "step",
        "latency",
    ),
    "nccl_perf": ("kernel_source", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency"),
}
_SOURCE_COLUMNS["generation_attention_perf"] = _SOURCE_COLUMNS["context_attention_perf"]
_SOURCE_COLUMNS["oneccl_perf"] = _SOURCE_COLUMNS["nccl_perf"]
for _table in QUANT_TABLES:
    _SOURCE_COLUMNS[_table] = ("m", "k", "quant_dtype", "latency")
_SOURCE_COLUMNS[MOE_TABLE] = (
    "kernel_source",
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "distribution",
    "latency",
)
_SOURCE_COLUMNS[CUSTOM_TABLE] = ("kernel_source", "op_name", "allreduce_dtype", "num_gpus", "message_size", "latency")
_OPTIONAL_COLUMNS: Final = ("window_size", "beam_width")

_PARAMS: Final = {
    "gemm": ("b", "m", "n", "k", "impl"),
    "attention": ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "impl"),
    "collective": ("bytes", "world_size", "nodes", "gpus_per_node", "impl"),
    "moe": ("tokens", "hidden", "inter", "experts", "topk", "ep", "gated", "fn", "weights", "impl"),
}


# --------------------------------------------------------------------------- entry points


def default_root() -> Path:
    """``systems/data`` of the installed aiconfigurator-core package (found, not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise OpcastError(
            "aiconfigurator-core is not installed; pip install 'opcast[aiconfigurator]' "
            "or give the path of its systems/data folder"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / DATA_DIR
    if not root.is_dir():
        raise OpcastError(
            f"{root} does not exist: this aiconfigurator-core ships no measured data; "
            "install aiconfigurator-core>=0.12 or give the path of a systems/data folder"
        )
    return root


def data_root(path: Path | str | None) -> Path:
    """The folder holding ``<system>/<family>/...``: ``path`` itself, its ``data`` (a ``systems``
    folder) or its ``systems/data`` (the package folder); the installed package's when None."""
    if path is None:
        return default_root()
    path = Path(path)
    for candidate in (path / DATA_DIR, path / "data"):
        if candidate.is_dir() and any(candidate.glob("*/*/*/*/*.parquet")):
            return candidate
    return path


def replay(
    root: Path | str | None = None,
    options: ReplayOptions | None = None,
    *,
    frameworks: Iterable[str] = FRAMEWORKS,
    fp8_gemm_frameworks: Iterable[str] = GEMM_FP8_FRAMEWORKS,
    attention_frameworks: Iterable[str] | None = None,
    attention_fill: bool = ATTENTION_FILL,
    fp8_gemm_alone: bool = FP8_GEMM_ALONE,
    systems: Iterable[str] | None = None,
    tables: Iterable[str] | None = None,
    moe_impls: Iterable[str] | None = None,
    gemm_impls: Iterable[str] | None = None,
) -> ReplayResult:
    """Rows of every converted table under ``root`` (see the module docstring).

    ``systems`` / ``tables`` restrict what is read (folder names, table stems such as
    ``gemm_perf``); ``frameworks`` sets the precedence among frameworks measuring the same
    configuration, ``fp8_gemm_frameworks`` that of the fp8 GEMMs (``fp8_gemm_alone``: less their
    activation quantisation, :data:`FP8_GEMM_ALONE`), ``attention_frameworks`` that of the attention rows
    (default: ``frameworks``). ``attention_fill`` lets lower-precedence frameworks
    fill the attention shapes the first lacks (default: one framework per system, phase and dtype,
    :data:`ATTENTION_FILL`). ``moe_impls``: the fused MoE kernel families kept (:data:`opcast.ops.MOE_IMPLS`;
    default all), the others' rows counted (:data:`MOE_IMPL_REASON`). ``gemm_impls``: the GEMM kernel families
    replayed (:data:`opcast.ops.GEMM_IMPLS`; default all: vLLM's fp8 rows also as its own family,
    :data:`GEMM_FAMILIES`). ``options`` is unused: the folders say everything.
    """
    del options
    base = data_root(root)
    if not base.is_dir():
        raise OpcastError(
            f"{base} is not a folder; give aiconfigurator-core's systems/data folder (or nothing, "
            "to read the installed package)"
        )
    order = tuple(frameworks)
    attention_order = order if attention_frameworks is None else tuple(attention_frameworks)
    only_systems = set(systems) if systems is not None else None
    only_tables = set(tables) if tables is not None else None
    gemm_families = GEMM_IMPLS if gemm_impls is None else tuple(gemm_impls)
    result = ReplayResult()
    frames: dict[str, list[pd.DataFrame]] = {"gemm": [], "attention": [], "collective": [], "moe": []}
    for path in sorted(base.glob("*/*/*/*/*.parquet")):
        rel = path.relative_to(base)
        system, family, framework, version = rel.parts[:4]
        table = path.stem
        if (only_systems is not None and system not in only_systems) or (
            only_tables is not None and table not in only_tables
        ):
            continue
        result.files += 1
        device = system_device(system)
        if device is None:
            name = SYSTEM_DEVICES.get(system)
            reason = (
                f"system {system}: {name} is not in the hardware catalog"
                if name
                else f"system {system}: no hardware catalog device for this folder"
            )
            result.skipped[reason] += _num_rows(path)
            continue
        if table == "gemm_perf":
            kind, frame = "gemm", _gemm(path, result)
        elif table in ATTENTION_TABLES:
            kind, frame = "attention", _attention(path, ATTENTION_TABLES[table], result)
        elif table in COLLECTIVE_TABLES:
            kind, frame = "collective", _collective(path, result)
        elif table == CUSTOM_TABLE:
            kind, frame = "collective", _custom_all_reduce(path, result, CUSTOM_FAMILIES.get(framework))
        elif table == MOE_TABLE and framework not in MOE_FRAMEWORKS:
            result.skipped[MOE_FRAMEWORK_REASON.format(framework)] += _num_rows(path)
            continue
        elif table == MOE_TABLE:
            kind, frame = "moe", _moe(path, result, MOE_FRAMEWORKS[framework], moe_impls)
        else:
            result.skipped[TABLE_REASONS.get(table, f"{family}/{table}: no opcast op for it")] += _num_rows(path)
            continue
        if frame.empty:
            continue
        _check_device(path, frame, device)
        if kind == "moe":
            frame = _skip_unsupported(frame, device, result)
            if frame.empty:
                continue
        if kind == "gemm":
            frame = _skip_unsupported(frame, device, result)
            if framework == "vllm":
                frame = _skip_by(frame, frame["dtype"].astype(str) == "fp8_block", VLLM_FP8_BLOCK_REASON, result)
            if framework == "trtllm" and fp8_gemm_alone:
                frame = _gemm_alone(frame, base / system / "quantize" / framework / version, result)
            own_lane = GEMM_FAMILIES.get(framework)
            if own_lane is not None and own_lane[1] in gemm_families:  # the framework's own family: its rows again
                own = frame[frame["dtype"].astype(str) == own_lane[0]]
                frame = pd.concat([frame, own.assign(impl=own_lane[1])], ignore_index=True)
            if frame.empty:
                continue
        meta = read_meta(path.parent / "collection_meta.yaml")
        frame = frame.assign(
            device=device,
            source_file=rel.as_posix(),
            torch_version=meta.get(("runtime", "abi", "torch")),
            cuda_version=meta.get(("runtime", "abi", "cuda")),
            kernel_name=framework + " " + version + ": " + frame["kernel_source"].astype(str),
            _system=system,
            _table=table,
            _framework=framework,
            _version=version,
        )
        frames[kind].append(frame)
    versions = _version_ranks(f for fs in frames.values() for f in fs)
    if frames["moe"]:
        frames["moe"] = _newest_vllm_moe(frames["moe"], result)
    for kind, parts in frames.items():
        if parts:
            dtype_orders = {"fp8": tuple(fp8_gemm_frameworks), **GEMM_BLOCK_FRAMEWORKS} if kind == "gemm" else {}
            kind_order = attention_order if kind == "attention" else order
            ranked = [_rank(frame, kind_order, versions, dtype_orders) for frame in parts]
            fill = attention_fill or kind != "attention"
            result.rows.extend(_select(kind, pd.concat(ranked, ignore_index=True), result, fill=fill))
    return result


# --------------------------------------------------------------------------- tables


def _read(path: Path, table: str) -> pd.DataFrame:
    """The columns of ``table`` this importer needs (a missing one names the file)."""
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError) as err:
        raise MalformedFile(path, None, f"not a readable parquet file ({str(err).splitlines()[0]})") from None
    required = _SOURCE_COLUMNS[table]
    missing = [c for c in required if c not in names]
    if missing:
        raise MalformedFile(path, None, f"{table} lacks column(s) {', '.join(missing)}")
    columns = [*required, *(c for c in (*_OPTIONAL_COLUMNS, "device", "backend") if c in names)]
    frame = pd.read_parquet(path, columns=columns)
    latency = pd.to_numeric(frame["latency"], errors="coerce")
    frame["time_s"] = latency / 1e3
    return frame


def _positive_time(frame: pd.DataFrame, result: ReplayResult, what: str) -> pd.DataFrame:
    bad = ~(np.isfinite(frame["time_s"]) & (frame["time_s"] > 0))
    if bad.any():
        result.skipped[f"{what}: latency not a positive number"] += int(bad.sum())
    return frame[~bad]


def _skip_by(frame: pd.DataFrame, mask: pd.Series, reasons: pd.Series | str, result: ReplayResult) -> pd.DataFrame:
    """Count the rows under ``mask`` under their reason and drop them."""
    if mask.any():
        if isinstance(reasons, str):
            result.skipped[reasons] += int(mask.sum())
        else:
            for reason, count in reasons[mask].value_counts().items():
                result.skipped[str(reason)] += int(count)
    return frame[~mask]


def _gemm(path: Path, result: ReplayResult) -> pd.DataFrame:
    frame = _read(path, "gemm_perf")
    source = frame["gemm_dtype"].astype(str)
    dtype = source.map(GEMM_DTYPES)
    reasons = source.map(lambda d: GEMM_SKIPPED.get(d, f"gemm {d}: no opcast dtype for it"))
    frame = _skip_by(frame.assign(dtype=dtype), dtype.isna(), reasons, result)
    frame = _positive_time(frame, result, "gemm")
    shape = frame[["m", "n", "k"]]
    bad = (shape < 1).any(axis=1)
    frame = _skip_by(frame, bad, "gemm: a dimension below 1", result)
    return frame.assign(
        op="gemm",
        b=1,
        m=frame["m"].astype("int64"),
        n=frame["n"].astype("int64"),
        k=frame["k"].astype("int64"),
        impl=DEFAULT_FAMILY,
    )


def _gemm_alone(frame: pd.DataFrame, quant_dir: Path, result: ReplayResult) -> pd.DataFrame:
    """TensorRT-LLM's fp8 GEMM rows less the activation quantisation its timed call ran
    (:data:`QUANT_TABLES` of the same release, matched on (m, k)); rows of a release without those
    tables keep it and say so in ``kernel_source`` (:data:`FP8_QUANT_KEPT`). A row without a matching
    quantisation, or whose GEMM would be left with no time, is skipped and counted."""
    fp8 = frame["dtype"].astype(str) == "fp8"
    if not fp8.any():
        return frame
    paths = [quant_dir / f"{table}.parquet" for table in QUANT_TABLES]
    source = frame["kernel_source"].astype(str)
    if not all(p.is_file() for p in paths):
        return frame.assign(kernel_source=source.where(~fp8, source + " " + FP8_QUANT_KEPT))
    quant = None
    for p, table in zip(paths, QUANT_TABLES):
        rows = _read(p, table)
        rows = rows[(rows["quant_dtype"].astype(str) == "fp8") & np.isfinite(rows["time_s"]) & (rows["time_s"] > 0)]
        per = rows.groupby(["m", "k"])["time_s"].median()
        quant = per if quant is None else quant + per  # both passes measured at (m, k), else NaN
    assert quant is not None
    at = quant.reindex(pd.MultiIndex.from_arrays([frame["m"], frame["k"]])).to_numpy()
    left = frame["time_s"].to_numpy() - at
    unmatched = fp8 & np.isnan(at)
    frame = _skip_by(frame, unmatched, "gemm fp8 (trtllm): no quantisation row at its (m, k) to subtract", result)
    left = left[~unmatched.to_numpy()]
    fp8 = frame["dtype"].astype(str) == "fp8"
    gone = fp8.to_numpy() & ~(left > 0)
    frame = _skip_by(
        frame, pd.Series(gone, index=frame.index), "gemm fp8 (trtllm): no time left after its quantisation", result
    )
    left, fp8 = left[~gone], fp8[~gone]
    source = frame["kernel_source"].astype(str)
    return frame.assign(
        time_s=np.where(fp8, left, frame["time_s"]),
        kernel_source=source.where(~fp8, source + " " + FP8_QUANT_GONE),
    )


def _skip_unsupported(frame: pd.DataFrame, device: str, result: ReplayResult) -> pd.DataFrame:
    """Drop (counted) the block-scaled GEMM rows of a device without the peak they run at (an nvfp4
    row on a part with no fp4 tensor cores): their features would have no peak to normalise by."""
    spec = get_device(device)
    dtypes = frame["dtype"].astype(str)
    lacking = dtypes.isin(list(BLOCK_SCALED_DTYPES)) & ~dtypes.map(spec.supports).astype(bool)
    reasons = dtypes.map(lambda d: f"gemm {d}: {device} has no peak for it")
    return _skip_by(frame, lacking, reasons, result)


def _moe(path: Path, result: ReplayResult, impl: str, keep: Iterable[str] | None = None) -> pd.DataFrame:
    """``moe`` rows of one ``moe_perf`` table of the engine whose kernel family is ``impl`` (the module docstring),
    only those of the families in ``keep`` (None: all), skipped rows counted."""
    frame = _read(path, MOE_TABLE)
    lane = frame["kernel_source"].astype(str)
    family = pd.Series(impl, index=frame.index)
    if impl == "vllm":
        family[lane.str.contains(MOE_MARLIN_LANE)] = "marlin"
    if keep is not None:
        frame = _skip_by(frame, ~family.isin(list(keep)), family.map(MOE_IMPL_REASON.format), result)
        lane, family = lane.loc[frame.index], family.loc[frame.index]
    frame = _skip_by(frame, lane.isin(list(MOE_SKIPPED_LANES)), lane.map(MOE_SKIPPED_LANES), result)
    distribution = frame["distribution"].astype(str)
    skewed = distribution != "balanced"
    frame = _skip_by(frame, skewed, distribution.map(MOE_DISTRIBUTION_REASON.format), result)
    source = frame["moe_dtype"].astype(str)
    narrow = {name: pair[0] for name, pair in MOE_NARROW_WEIGHT_DTYPES.items()}
    dtype = source.map({**MOE_DTYPES, **narrow})
    weights = source.map({name: pair[1] for name, pair in MOE_NARROW_WEIGHT_DTYPES.items()}).fillna("dtype")
    frame = _skip_by(
        frame.assign(dtype=dtype, weights=weights), dtype.isna(), "moe " + source + ": no opcast dtype for it", result
    )
    frame = _positive_time(frame, result, "moe")
    sizes = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]
    shape = frame[sizes].apply(pd.to_numeric, errors="coerce")
    frame = _skip_by(frame, ~(shape >= 1).all(axis=1), "moe: a size below 1 or missing", result)
    shape = shape.loc[frame.index].astype("int64")
    uneven = (shape["inter_size"] % shape["moe_tp_size"] != 0) | (shape["num_experts"] % shape["moe_ep_size"] != 0)
    frame = _skip_by(frame, uneven, "moe: moe_tp_size does not divide inter_size or moe_ep_size num_experts", result)
    shape = shape.loc[frame.index]
    gated = frame["kernel_source"].astype(str) != MOE_NONGATED
    return frame.assign(
        op="moe",
        tokens=shape["num_tokens"],
        hidden=shape["hidden_size"],
        inter=shape["inter_size"] // shape["moe_tp_size"],
        experts=shape["num_experts"],
        topk=shape["topk"],
        ep=shape["moe_ep_size"],
        gated=gated,
        fn=np.where(gated, "silu", "relu"),
        impl=family.loc[frame.index],
    )


def _newest_vllm_moe(files: list[pd.DataFrame], result: ReplayResult) -> list[pd.DataFrame]:
    """Each file's ``moe`` rows less vLLM's rows of any release but the newest that measured their (system, family,
    dtype, weights), counted (:data:`MOE_VLLM_RELEASE_REASON`); files left empty are dropped. vLLM changes the kernel it
    dispatches a dtype to between releases (B200 bf16: Triton ``fused_moe`` in 0.19.0, FlashInfer TRT-LLM-gen in
    0.24.0; H200 MXFP4: ``vllm_mxfp4_moe`` in 0.19.0, OpenAI Triton ``matmul_ogs`` / Marlin in 0.24.0), so the shapes
    only an older release measured are left out rather than filled in with another kernel (the rule of
    :data:`ATTENTION_FILL`); TensorRT-LLM's rows keep the newest-first fill of the module docstring."""
    keys = ["_system", "impl", "dtype", "weights"]
    newest: dict[tuple[str, ...], str] = {}
    for frame in files:
        if str(frame["_framework"].iloc[0]) != "vllm":
            continue
        version = str(frame["_version"].iloc[0])
        for key in frame[keys].astype(str).drop_duplicates().itertuples(index=False, name=None):
            if key not in newest or version_key(version) > version_key(newest[key]):
                newest[key] = version
    out = []
    for frame in files:
        if str(frame["_framework"].iloc[0]) == "vllm":
            version = str(frame["_version"].iloc[0])
            best = [newest[key] for key in frame[keys].astype(str).itertuples(index=False, name=None)]
            reasons = [
                MOE_VLLM_RELEASE_REASON.format(f"{d}{'' if w == 'dtype' else f' {w} weights'} {i}", b)
                for d, w, i, b in zip(frame["dtype"], frame["weights"].astype(str), frame["impl"], best)
            ]
            older = pd.Series([b != version for b in best], index=frame.index)
            frame = _skip_by(frame, older, pd.Series(reasons, index=frame.index), result)
        if not frame.empty:
            out.append(frame)
    return out


def _attention(path: Path, phase: str, result: ReplayResult) -> pd.DataFrame:
    frame = _read(path, "context_attention_perf")
    pair = list(zip(frame["attn_dtype"].astype(str), frame["kv_cache_dtype"].astype(str)))
    dtype = pd.Series([ATTENTION_DTYPES.get(p) for p in pair], index=frame.index, dtype=object)
    reasons = pd.Series(
        [
            f"{phase} attention: {a} attention over a {kv} KV cache (the registry has one dtype per op)"
            for a, kv in pair
        ],
        index=frame.index,
    )
    frame = _skip_by(frame.assign(dtype=dtype), dtype.isna(), reasons, result)
    if "window_size" in frame:
        window = frame["window_size"].fillna(0)
        frame = _skip_by(
            frame,
            window > 0,
            f"{phase} attention: sliding window (window_size > 0); the registry's attention has no window",
            result,
        )
    if "beam_width" in frame:
        frame = _skip_by(frame, frame["beam_width"].fillna(1) != 1, f"{phase} attention: beam_width > 1", result)
    frame = _positive_time(frame, result, f"{phase} attention")
    if phase == "context":
        seq_q = seq_kv = frame["isl"]
    else:
        seq_q, seq_kv = pd.Series(1, index=frame.index), frame["step"] + 1
    return frame.assign(
        op="attention",
        batch=frame["batch_size"],
        heads=frame["num_heads"],
        kv_heads=frame["num_key_value_heads"],
        seq_q=seq_q,
        seq_kv=seq_kv,
        head_dim=frame["head_dim"],
        causal=True,
        impl="flash",
    )


def _collective(path: Path, result: ReplayResult) -> pd.DataFrame:
    frame = _read(path, path.stem)
    op = frame["op_name"].astype(str).map(COLLECTIVES)
    frame = _skip_by(
        frame.assign(op=op),
        op.isna(),
        frame["op_name"].astype(str).map(lambda o: f"collective {o}: no opcast op for it"),
        result,
    )
    source_dtype = frame["nccl_dtype"].astype(str)
    known = source_dtype.isin(list(COLLECTIVE_DTYPES))
    frame = _skip_by(
        frame,
        ~known,
        source_dtype.map(lambda d: f"collective dtype {d}: no opcast dtype (float/half/bfloat16 only)"),
        result,
    )
    frame = _positive_time(frame, result, "collective")
    frame = _skip_by(frame, frame["num_gpus"] < 2, "collective: fewer than 2 GPUs", result)
    frame = _skip_by(frame, frame["message_size"] < 1, "collective: empty message", result)
    dtype = frame["nccl_dtype"].astype(str).map(lambda d: COLLECTIVE_DTYPES[d][0])
    nbytes = frame["message_size"].astype("int64") * frame["nccl_dtype"].astype(str).map(
        lambda d: COLLECTIVE_DTYPES[d][1]
    ).astype("int64")
    backend = "oneccl" if path.stem == "oneccl_perf" else "nccl"
    return frame.assign(
        dtype=dtype,
        bytes=nbytes,
        world_size=frame["num_gpus"],
        nodes=1,
        gpus_per_node=frame["num_gpus"],
        impl=DEFAULT_FAMILY,
        _backend=backend,
    )


def _custom_all_reduce(path: Path, result: ReplayResult, family: str | None = None) -> pd.DataFrame:
    """The engines' own all-reduce (see the module docstring): the CUDA-graph lane under
    :data:`CUSTOM_MAX_BYTES`, as ``all_reduce`` rows of one node (``backend`` :data:`CUSTOM_BACKEND`); with a
    ``family`` (:data:`CUSTOM_FAMILIES`), the same rows of every size once more with that ``backend``."""
    frame = _read(path, CUSTOM_TABLE)
    what = "custom all-reduce"
    frame = _skip_by(
        frame,
        frame["op_name"].astype(str) != "all_reduce",
        frame["op_name"].astype(str).map(lambda o: f"{what} {o}: not an all-reduce"),
        result,
    )
    lane = frame["kernel_source"].astype(str)
    if "backend" in frame:
        lane = lane + " " + frame["backend"].fillna("").astype(str)
    frame = _skip_by(
        frame,
        lane.str.contains("eager", case=False),
        f"{what}: eager lane (a host loop that clones and copies each input: the dispatch rate, not the kernel; "
        "the CUDA-graph lane is kept)",
        result,
    )
    source_dtype = frame["allreduce_dtype"].astype(str)
    frame = _skip_by(
        frame,
        ~source_dtype.isin(list(CUSTOM_DTYPES)),
        source_dtype.map(lambda d: f"{what} dtype {d}: bfloat16 only (NCCL's rows hold the fp16 key)"),
        result,
    )
    frame = _positive_time(frame, result, what)
    frame = _skip_by(frame, frame["num_gpus"] < 2, f"{what}: fewer than 2 GPUs", result)
    frame = _skip_by(frame, frame["message_size"] < 1, f"{what}: empty message", result)
    nbytes = frame["message_size"].astype("int64") * frame["allreduce_dtype"].astype(str).map(
        lambda d: CUSTOM_DTYPES[d][1]
    ).astype("int64")
    frame = frame.assign(
        bytes=nbytes,
        op="all_reduce",
        dtype=frame["allreduce_dtype"].astype(str).map(lambda d: CUSTOM_DTYPES[d][0]),
        world_size=frame["num_gpus"],
        nodes=1,
        gpus_per_node=frame["num_gpus"],
        impl=DEFAULT_FAMILY,
        _backend=CUSTOM_BACKEND,
    )
    own = frame.assign(impl=family, _backend=family) if family is not None else frame.iloc[:0]
    frame = _skip_by(
        frame,
        nbytes >= CUSTOM_MAX_BYTES,
        f"{what}: {CUSTOM_MAX_BYTES >> 20} MiB or more (vLLM's max_size: the engine runs NCCL or symmetric "
        "memory there, not its custom kernel)",
        result,
    )
    return pd.concat([frame, own], ignore_index=True) if len(own) else frame


# --------------------------------------------------------------------------- selection


def _rank(
    frame: pd.DataFrame,
    order: tuple[str, ...],
    versions: Mapping[tuple[str, str, str, str], int],
    dtype_orders: Mapping[str, tuple[str, ...]] | None = None,
) -> pd.DataFrame:
    """Precedence columns of one file's rows: framework (``dtype_orders[dtype]`` for the rows of a dtype
    it names, e.g. the fp8 and block-scaled GEMMs), version, kernel lane density."""
    first = frame.iloc[0]
    framework = str(first["_framework"])
    lane_rows = frame.groupby(["dtype", "kernel_source"], sort=False)["time_s"].transform("size")
    rank: int | np.ndarray = order.index(framework) if framework in order else len(order)
    dtypes = frame["dtype"].astype(str).to_numpy()
    for dtype, dtype_order in (dtype_orders or {}).items():
        dtype_rank = dtype_order.index(framework) if framework in dtype_order else len(dtype_order)
        rank = np.where(dtypes == dtype, dtype_rank, rank)
    return frame.assign(
        _fw_rank=rank,
        _ver_rank=versions[(first["_system"], first["_table"], framework, first["_version"])],
        _lane_rows=-lane_rows,
    )


def _select(kind: str, frame: pd.DataFrame, result: ReplayResult, *, fill: bool = True) -> list[dict[str, Any]]:
    """One row per (device, op, params, dtype) by the precedence of the module docstring; without
    ``fill``, only the rows of the first framework of each (device, table, dtype) (:func:`_one_family`)."""
    params = list(_PARAMS[kind])
    key = ["device", "op", *params, "dtype"]
    frame = frame.sort_values(
        ["_fw_rank", "_framework", "_ver_rank", "_lane_rows", "kernel_source"], kind="stable"
    ).reset_index(drop=True)  # the index is now the precedence order
    frame = frame.rename(columns={"time_s": "time_s_median"}).assign(time_s_p20=np.nan, time_s_p80=np.nan)
    # Repeats within one file and lane: one row, the median (p20/p80 from 3 repeats on).
    group = [*key, "source_file", "kernel_source"]
    repeated = frame.duplicated(group, keep=False)
    if repeated.any():
        times = frame.loc[repeated].groupby(group, sort=False)["time_s_median"]
        stats = times.agg(["median", "size"]).rename(columns={"median": "_median", "size": "_n"})
        stats["_p20"] = times.quantile(0.2)
        stats["_p80"] = times.quantile(0.8)
        result.skipped["repeat of a configuration in the same file and kernel (merged: median)"] += int(
            (stats["_n"] - 1).sum()
        )
        kept = frame.loc[repeated].drop_duplicates(group, keep="first")
        kept = kept.merge(stats.reset_index(), on=group, how="left", sort=False)
        enough = kept["_n"] >= 3
        kept = kept.assign(
            time_s_median=kept["_median"].to_numpy(),
            time_s_p20=kept["_p20"].where(enough).to_numpy(),
            time_s_p80=kept["_p80"].where(enough).to_numpy(),
        )
        kept.index = frame.index[repeated & ~frame.duplicated(group, keep="first")]
        frame = pd.concat([frame.loc[~repeated], kept.drop(columns=["_median", "_n", "_p20", "_p80"])]).sort_index()
    if kind == "gemm":
        frame = _drop_spikes(frame, key, result)
    # Across files and lanes: the first by precedence.
    firsts = frame.groupby(key, sort=False, dropna=False)[["_framework", "source_file"]].transform("first")
    repeat = frame.duplicated(key, keep="first")
    if repeat.any():
        dup = frame[repeat]
        same_file = dup["source_file"] == firsts.loc[repeat, "source_file"]
        same_fw = dup["_framework"] == firsts.loc[repeat, "_framework"]
        reasons = np.where(
            same_file,
            "measured again by another kernel of the same file (kept the densest lane)",
            np.where(
                same_fw,
                "measured again by an older version of the same framework (kept the newest)",
                "measured again by a lower-precedence framework",
            ),
        )
        for reason, count in pd.Series(reasons).value_counts().items():
            result.skipped[f"{kind}: {reason}"] += int(count)
        frame = frame[~repeat]
    if not fill:
        frame = _one_family(frame, result)
    return _records(kind, frame, params)


def _drop_spikes(frame: pd.DataFrame, key: list[str], result: ReplayResult) -> pd.DataFrame:
    """``frame`` (in precedence order, one row per file and configuration) less each row of a
    :data:`SPIKE_DTYPES` configuration that precedence would keep and that ran more than :data:`SPIKE_RATIO` x the
    median of the configuration's rows (every table of the system that measured it, its own included: with
    three, the middle one, so a table that two others contradict is the spike, not one that two agree with),
    so the next row in precedence is kept; each dropped row is counted under its dtype."""
    screened = frame["dtype"].astype(str).isin(SPIKE_DTYPES).to_numpy()
    if not screened.any():
        return frame
    sub = frame[screened]
    first = ~sub.duplicated(key, keep="first")
    if first.all():
        return frame
    tables = sub.groupby(key, sort=False, dropna=False)["time_s_median"]
    reference = tables.median().rename("_reference")[tables.size() > 1]
    kept = sub[first.to_numpy()]
    bar = kept[key].merge(reference.reset_index(), on=key, how="left", sort=False)["_reference"].to_numpy(float)
    spike = np.isfinite(bar) & (kept["time_s_median"].to_numpy(float) > SPIKE_RATIO * bar)
    if not spike.any():
        return frame
    dropped = kept[spike]
    for dtype, count in dropped["dtype"].astype(str).value_counts().items():
        result.skipped[
            f"gemm {dtype}: a slow spike (over {SPIKE_RATIO:g}x the median of the system's tables of the "
            "shape; the next framework's row kept)"
        ] += int(count)
    return frame.drop(index=dropped.index)


def _one_family(frame: pd.DataFrame, result: ReplayResult) -> pd.DataFrame:
    """``frame`` (in precedence order, one row per configuration) less the rows of any framework
    release but the first of their (device, table, dtype): the shapes that release did not measure
    stay unmeasured instead of being filled with another engine's kernels, or an older release's
    (:data:`ATTENTION_FILL`). Each dropped row is counted under its phase, dtype and frameworks."""
    group = ["device", "_table", "dtype"]
    firsts = frame.groupby(group, sort=False, dropna=False)[["_framework", "_version"]].transform("first")
    same_fw = frame["_framework"] == firsts["_framework"]
    other = ~same_fw | (frame["_version"] != firsts["_version"])
    if other.any():
        dropped, first = frame.loc[other], firsts.loc[other]
        phase = dropped["_table"].map(lambda t: ATTENTION_TABLES.get(str(t), str(t)))
        head = phase + " attention " + dropped["dtype"].astype(str) + ": a shape only "
        framework = dropped["_framework"].astype(str)
        older = "an older " + framework + " measured, left out: its newest, " + first["_version"].astype(str) + ","
        another = framework + " measured, left out: " + first["_framework"].astype(str)
        tail = " measured this system's rows of that phase and dtype (one kernel family per system and label, "
        reasons: pd.Series = head + np.where(same_fw[other], older, another) + tail + "no fill-in)"
        for reason, count in pd.Series(reasons).value_counts().items():
            result.skipped[f"attention: {reason}"] += int(count)
    return frame[~other]


def _records(kind: str, frame: pd.DataFrame, params: list[str]) -> list[dict[str, Any]]:
    collective = kind == "collective"
    out = frame[["device", "op", *params, "dtype"]].copy()
    out["direction"] = "fwd"
    out["tensor_cores"] = None if collective else True
    for column in ("time_s_median", "time_s_p20", "time_s_p80"):
        out[column] = frame[column].astype(float)
    out["n_reps"] = None
    if collective:
        algbw = frame["bytes"] / frame["time_s_median"] / 1e9
        out["algbw_gbps"] = algbw
        out["busbw_gbps"] = algbw * [bus_factor(op, int(n)) for op, n in zip(frame["op"], frame["world_size"])]
    for column in ("kernel_name", "source_file", "torch_version", "cuda_version"):
        out[column] = frame[column]
    out["timing_method"] = TIMING_NCCL if collective else TIMING_KERNEL
    if collective:
        table = frame["_table"].astype(str)
        custom = (table == CUSTOM_TABLE).to_numpy()
        out["timing_method"] = np.where(custom, TIMING_CUSTOM, TIMING_NCCL)
        out["cluster"] = frame["_system"].astype(str).map(SYSTEM_CLUSTERS).astype(object)
        out["backend"] = frame["_backend"].astype(str)
    # pyarrow-backed columns (pandas' default for the parquet's strings) iterate element by element in to_dict,
    # a third of a full replay's time; as object columns they hold the same Python values
    arrow = [c for c in out.columns if isinstance(out[c].dtype, (pd.ArrowDtype, pd.StringDtype))]
    records = out.astype(dict.fromkeys(arrow, object)).to_dict("records")
    for row in records:
        for name in ("time_s_p20", "time_s_p80"):
            if row[name] is not None and math.isnan(row[name]):
                row[name] = None
        if collective and not isinstance(row["cluster"], str):
            row["cluster"] = None
        for name in params:  # numpy scalars as plain Python values
            value = row[name]
            if hasattr(value, "item"):
                row[name] = value.item()
        if kind in ("gemm", "collective") and row["impl"] == DEFAULT_FAMILY:
            row["impl"] = None
    return records  # type: ignore[return-value]  # pandas-stubs: to_dict's keys are the column labels, str here


def _version_ranks(frames: Iterable[pd.DataFrame]) -> dict[tuple[str, str, str, str], int]:
    """(system, table, framework, version) -> 0 for the newest version of that framework, 1 next..."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for frame in frames:  # one file each
        first = frame.iloc[0]
        found.setdefault((first["_system"], first["_table"], first["_framework"]), set()).add(first["_version"])
    return {
        (system, table, framework, version): rank
        for (system, table, framework), names in found.items()
        for rank, version in enumerate(sorted(names, key=version_key, reverse=True))
    }


_VERSION = re.compile(r"^v?(?P<release>\d+(?:\.\d+)*)(?:[.\-_]?(?P<tag>dev|a|alpha|b|beta|rc|post)\.?(?P<n>\d*))?")
_TAG_ORDER: Final = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3, None: 4, "post": 5}


def version_key(version: str) -> tuple:
    """A sort key ordering release strings as PEP 440 does for the forms met here (``1.3.0rc20``
    < ``1.3.0`` < ``0.5.6.post2``-style posts; ``0.1.dev19262`` before its release)."""
    match = _VERSION.match(version)
    if match is None:
        return ((), -1, 0, version)
    release = tuple(int(x) for x in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    return (release, _TAG_ORDER[match["tag"]], int(match["n"] or 0), version)


# --------------------------------------------------------------------------- devices and metadata


@cache
def system_device(system: str) -> str | None:
    """Catalog name of an AIConfigurator system folder (:data:`SYSTEM_DEVICES`, else the folder name as a
    catalog alias), or None when the catalog lacks it."""
    try:
        return get_device(SYSTEM_DEVICES.get(system, system)).name
    except OpcastError:
        return None


@cache
def _torch_device(name: str) -> str | None:
    try:
        return get_device(name).name
    except OpcastError:
        return None


def _check_device(path: Path, frame: pd.DataFrame, device: str) -> None:
    """The table's own ``device`` column (torch's GPU name), where the catalog knows it, must
    name the folder's device."""
    if "device" not in frame:
        return
    for name in frame["device"].dropna().astype(str).unique():
        other = _torch_device(name)
        if other is not None and other != device:
            raise MalformedFile(path, None, f"device column says {name!r} ({other}) but the folder is {device}")


def _num_rows(path: Path) -> int:
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as err:
        raise MalformedFile(path, None, f"not a readable parquet file ({str(err).splitlines()[0]})") from None


_YAML_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+):(?:\s+(?P<value>.*?))?\s*$")


@dataclass(frozen=True, slots=True)
class _Open:
    indent: int
    key: str


def read_meta(path: Path) -> dict[tuple[str, ...], str]:
    """The scalar ``key: value`` entries of a collection_meta.yaml by key path, e.g.
    ``("runtime", "framework")``. A small reader for the block-mapping subset these files use
    (no PyYAML dependency): lists and block scalars (``>-``, ``|``) are skipped, quotes stripped.
    A missing file gives an empty mapping."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[tuple[str, ...], str] = {}
    stack: list[_Open] = []
    block_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if block_indent is not None:
            if indent > block_indent:
                continue  # inside a block scalar or a list
            block_indent = None
        match = _YAML_LINE.match(line)
        if match is None:  # a list item or anything else: skip it and what it holds
            block_indent = indent
            continue
        while stack and stack[-1].indent >= indent:
            stack.pop()
        key, value = match["key"], (match["value"] or "")
        value = value.split(" #", 1)[0].strip()
        if not value:
            stack.append(_Open(indent, key))
        elif value[0] in ">|":
            block_indent = indent
        else:
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[(*(o.key for o in stack), key)] = value
    return out


__all__ = [
    "CUSTOM_BACKEND",
    "CUSTOM_FAMILIES",
    "CUSTOM_MAX_BYTES",
    "FRAMEWORKS",
    "SYSTEM_DEVICES",
    "data_root",
    "default_root",
    "read_meta",
    "replay",
    "system_device",
    "version_key",
]
