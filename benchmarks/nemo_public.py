"""NVIDIA's published NeMo / Megatron-Bridge pre-training throughput predicted with ``opcast predict train``
(issue 17's end-to-end target: a held-out validation table; nothing is fitted to these rows).

    python benchmarks/nemo_public.py [--csv FILE] [--recipes FILE] [--models DIR] [--out FILE] [--clocks boost]

The measurements are in ``benchmarks/nemo_public.csv`` beside this script: one row per published
configuration (Llama 2 7B/13B/70B, Llama 3 8B/70B, Llama 3 / 3.1 405B, GPT-3 175B, and the MoE Qwen3-30B-A3B,
Qwen3-235B-A22B, GPT-OSS 120B, DeepSeek-V3 and Kimi K2; DGX-H100, DGX-B200, DGX-B300, DGX-GB200, DGX-GB300; BF16, FP8,
MXFP8 and NVFP4), each with its source
URL, the NeMo container that measured it, and the published
GBS, MBS, sequence, FSDP, TP, PP, CP, VP, EP, GA, tokens/s/GPU and model TFLOP/s/GPU (numbers only).
A row with a ``skip_reason`` (a system opcast cannot name) is listed, not predicted. Where a
table gives a second configuration in parentheses, a row is kept only where the table labels what the
parenthesised value is (Megatron-Bridge 25.11's ``FP8-CS (FP8-MX)``); otherwise only the value
outside the parentheses is used. A ``VP`` or ``EP`` of ``n/a`` in the source is written 1. GA, where
the source leaves it out, is ``GBS / (MBS x DP)`` (the script checks it against the source's GA where
given).

Each row is predicted through the library exactly as the command line would be (the options are
built into the library objects by ``opcast predict train``'s own builders, as
``benchmarks/mosaicml.py`` does): :func:`row_options` is the mapping, :func:`cli_command` prints it.
What NeMo's performance recipes run, and what is passed:

- the system's catalog cluster: DGX-H100 -> ``--cluster dgx-h100``, DGX-B200 -> ``dgx-b200``, DGX-B300 -> ``dgx-b300``,
  DGX-GB200 -> ``gb200-nvl72``, DGX-GB300 -> ``gb300-nvl72`` (72-GPU NVLink domains), which sets the GPU
  (H100-SXM, B200, GB200, GB300),
  its links and the cluster's learned collectives; with ``--dp`` the world size is ``tp x pp x cp x dp``
  = the published #GPUs, in as few NVLink domains as it needs (8 GPUs of one NVL72 rack); 128 or 256
  GB200 GPUs (two or four racks, not filled) are the same GPU and links given as ``--gpu
  'GB200[...,gpus_per_node=64]' --nodes 2 --gpus-per-node 64`` (:func:`placement_options`);
- ``--framework megatron`` (Megatron-Core / Transformer Engine kernels, fp32 ``main_grad``);
- the published TP, PP, CP and the data-parallel degree the world size leaves; ``--sp`` where TP > 1
  (Megatron requires sequence parallelism with TP comm overlap, and NeMo's recipes turn both on);
  ``--tp-comm-overlap`` where TP > 1 (NeMo's ``MegatronCommOverlapCallback`` / Megatron-Bridge's
  ``CommOverlapConfig`` ``tp_comm_overlap``) unless the row's recipe turns it off, with the recipe's own
  Transformer Engine userbuffers settings per GEMM as ``--tp-comm-overlap-cfg`` (:mod:`opcast.predict.tp_overlap`).
  The recipes CSV's ``tp_overlap_cfg`` holds, per TP > 1 row, what the performance script of the row's
  container picks (by GPU and compute dtype): NeMo 25.02 = v2.2.0 ``scripts/llm/performance/pretrain_*.py``,
  25.04 = v2.3.0 and 25.07 = v2.4.0 ``scripts/performance/llm/pretrain_*.py`` (``ub_cfg[gpu][dtype]``, GB200
  taking the B200 configs), the values in ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py`` at
  the same tag; Megatron-Bridge 25.11 = v0.2.0 and 26.04.01 = v0.4.2 ``scripts/performance/configs/llama*/
  llama*_llm_pretrain.py`` (``comm_overlap.tp_comm_overlap_cfg``), the values in ``src/megatron/bridge/training/
  comm_overlap.py``. Each config is written in full, all ten GEMMs: TE's ``method`` -> the method, ``num_sm``
  -> ``smN``, ``set_sm_margin`` -> ``margin`` / ``nomargin``, ``num_splits`` (pipeline) -> ``splitN``,
  ``aggregate`` (ring_exchange) -> ``aggregate``. Not expressible in opcast's syntax, so not priced:
  ``cga_size`` (thread-block cluster of the comm kernel), ``fp8_buf`` (an FP8 userbuffer for the pipeline
  reduce-scatter's output), ``atomic_gemm`` (False in every config used here), and TE's ``use_ce`` /
  ``comm_priority`` / ``gemm_priority`` / ``pipeline_rs_overlap_first_gemm`` (left at TE's defaults by every
  recipe). The other values: ``off`` (the recipe sets ``tp_comm_overlap = False``: Megatron-Bridge's
  ``precision == "nvfp4"`` rows) -> no ``--tp-comm-overlap``; ``te-defaults`` (the recipe names no config)
  and ``unknown`` (not established: NeMo 24.07, whose table names no recipe and whose launcher configs are
  not the published runs) -> ``--tp-comm-overlap`` at TE's defaults, ``unknown`` counted in the output;
- the distributed optimizer: FSDP = 0 -> ``--zero 1`` with the recipe's data-parallel overlaps, the recipes
  CSV's ``dp_overlap`` (:data:`DP_OVERLAP_VALUES`): ``grad+param`` -> ``--overlap-grad-reduce
  --overlap-param-gather``, ``grad`` -> ``--overlap-grad-reduce`` only. NeMo's ``MegatronCommOverlapCallback``
  (``nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py``) and Megatron-Bridge's ``CommOverlapConfig``
  (``src/megatron/bridge/training/comm_overlap.py``) ``_get_optimizer_overlap_cfgs`` turn both on where DP > 1
  unless the recipe overrides them: Megatron-Bridge v0.2.0 ``llama31_405b_*_config(precision='fp8_mx')`` (and
  the 70B ones) set ``overlap_param_gather = False`` ("causes NaN grad norm"; its Llama 3 8B functions do not),
  v0.4.2 ``llama31_405b_pretrain_config_gb200`` calls ``disable_param_gather_overlap`` for NVFP4 V2 (peak
  memory). A row whose recipe was not established (NeMo 24.07) gets both, counted in the output;
  FSDP > 0 (Megatron FSDP; 25.11 writes the sharding group size, NeMo 25.x writes 1) -> ``--zero 3``
  (opcast's ZeRO-3 gathers weights and reduce-scatters gradients per layer behind compute, as
  Megatron FSDP does; the two overlap flags belong to the distributed optimizer and are refused with it);
- the gradient reduction's dtype, the recipes CSV's ``grad_reduce`` (:data:`GRAD_REDUCE_VALUES`): ``bf16`` ->
  ``--no-grad-reduce-in-fp32``. Every recipe read sets Megatron-Core's ``grad_reduce_in_fp32 = False`` after its
  precision preset (NeMo v2.2.0 ``pretrain_*.py`` after ``bf16_with_fp8_mixed()``, v2.3.0 ``set_primary_perf_configs``,
  v2.4.0 ``set_precision_configs``; Megatron-Bridge v0.2.0 / v0.4.2 ``set_llama3_common_configs`` /
  ``set_llama31_common_configs``, ``cfg.mixed_precision`` and ``cfg.ddp`` both); NeMo 24.07's rows (no recipe)
  keep megatron's default, fp32 (Megatron-LM's rule for bf16), counted;
- the arch: the row's preset, or where the recipe trains what no preset names a JSON this script writes and the
  command reads, ``--arch NAME.json`` (:data:`RECIPE_ARCHS`, :func:`write_recipe_arch`): GPT-OSS 120B's and
  DeepSeek-V3's presets with the 32,000-token NullTokenizer vocabulary their recipes train with
  (:data:`NULL_TOKENIZER_VOCAB`); Kimi K2 its preset;
- Llama 3.1 405B and Qwen3-235B-A22B with PP > 1 -> ``--pp-partition megatron:embedding,loss`` (:data:`LAYER_SPLIT`);
  a recipe's ``pipeline_model_parallel_layout`` (DeepSeek-V3, Kimi K2) -> ``--pp-layers`` with each rank's
  transformer layers (:data:`PP_LAYOUTS`, :func:`layout_rank_layers`), under 1F1B where VP divides no split of
  them (counted);
- EP > 1 (the MoE rows) -> ``--ep EP``, and with TP > 1 ``--etp 1`` (:data:`MOE_ETP`: the recipes' expert
  tensor parallelism 1 folds the TP ranks into the expert-parallel group; 26.04.01's H100 235B row, TP 2, DP 16,
  EP 32); ``--overlap-moe-ep-comm`` where the recipe runs combined 1F1B (:data:`MOE_A2A_OVERLAP`) and opcast can
  (without a pipeline or interleaved);
- VP > 1 -> ``--schedule interleaved --virtual-stages VP --overlap-p2p-comm`` (Megatron's default);
- BF16 -> ``--precision bf16`` (the GPT-OSS rows: ``get_precision_config('bf16')``, ``bf16_mixed``);
- FP8 (per tensor) -> ``--precision fp8`` with the row's scaling recipe (:func:`fp8_recipe`): ``FP8-CS`` and
  ``FP8 (current scaling)`` -> ``--fp8-recipe current`` (Transformer Engine's ``Float8CurrentScaling``), and so a
  Megatron-Bridge container's ``FP8`` (26.04.01: its performance scripts' one per-tensor FP8 is ``fp8_cs``,
  v0.4.2 ``scripts/performance/utils/precision.py`` ``get_precision_config``, and the recipes CSV cites the
  ``*_FP8_CS_V2`` presets); the other ``FP8`` rows (NeMo 24.07, and 25.02 whose v2.2.0 ``pretrain_*.py`` set
  ``bf16_with_fp8_mixed``: amax history 1024) -> ``--fp8-recipe delayed``. Not priced: ``fp8_param_gather``
  (fp8 primary weights, all-gathered in fp8), which ``bf16_with_fp8_current_scaling_mixed`` turns on. On
  B200 / GB200 / GB300 the fp8 GEMMs take every layout and Transformer Engine 2.x writes no fp8 transposes
  (:func:`opcast.predict.graph.fp8_gemm_transposes`), under either recipe. MXFP8 / FP8-MX -> ``--precision
  mxfp8`` (the block linears' GEMMs in MXFP8, priced as Transformer Engine's cuBLASLt GEMMs: the per-tensor
  fp8 GEMM of the same shape, :data:`opcast.predict.graph.TE_GEMM_KERNELS`); NVFP4 -> ``--precision nvfp4`` (those
  GEMMs in NVFP4, every block: Megatron-Bridge's ``bf16_with_nvfp4_mixed`` keeps no layer in BF16);
- the recipe's activation offloading to host memory, ``--offload-activations N`` (Megatron-Core
  ``cpu_offloading`` with ``cpu_offloading_num_layers = N``; Grace's LPDDR over NVLink-C2C on GB200), which
  the published tables do not give: ``benchmarks/nemo_public_recipes.csv`` beside this script holds, per
  row whose recipe was read, the layers offloaded and the recipe file (URL at its commit) with the
  setting (:func:`read_recipes`). NeMo 2.0 (25.04, 25.07): ``scripts/performance/recommended_model_configs/
  model_configs_gb200.csv``, column ``activation_offload_layers``, applied by ``scripts/performance/
  helpers.py`` ``set_recompute_configs``; Megatron-Bridge (25.11, 26.04.01): ``scripts/performance/configs/
  llama*/...workload_base_configs.py``, ``cpu_offloading_num_layers``, applied by ``set_recompute_overrides``.
  A row without an entry offloads nothing;
- activation recompute, the recipes CSV's ``recompute``: ``none`` / ``selective`` / ``full`` -> ``--recompute``
  (every row read sets none: Megatron-Bridge's ``set_recompute_overrides`` sets it only with a preset's
  ``recompute_num_layers`` / ``recompute_modules``, NeMo 25.04 / 25.07's CSV column ``recompute_layers`` is 0, NeMo
  25.02's scripts set none; v0.4.2's 405B NVFP4 V2 preset clears V1's ``recompute_num_layers = 1``); ``full-block:N``
  (``recompute_num_layers = N`` with ``recompute_method = "block"``: v0.2.0's ``LLAMA3_8B_H100_FP8_CS_BASE_CONFIG``,
  N = 5) is not expressible and priced without, counted; ``selective:MODULES`` (:data:`RECOMPUTE_MODULES_RE`:
  the MoE presets' ``recompute_modules``) is passed as ``--recompute selective:MODULES``
  (:mod:`opcast.predict.recompute`);
- FlashAttention (``--attention flash``, the default), Adam (Kimi K2's Muon, :data:`OPTIMIZER_NOT_PRICED`, counted).

Not mapped (no opcast option represents it, each counted or listed in the output): CUDA graphs (the recipes CSV's
``cuda_graphs``: Megatron-Bridge v0.2.0's Llama 3 8B GB200 / B200 presets ``cuda_graph_impl = "local"``,
``cuda_graph_scope = "full_iteration"``; NeMo 25.04 / 25.07's ``cuda_graphs`` column 1 for GPT-3 175B and Llama 3 8B
on GB200, ``enable_cuda_graph``; the rest off; opcast prices each kernel's launch as if eager); partial recompute
(``full-block:N``, above); ``overlap_param_gather_with_optimizer_step`` (NeMo 25.x's ``set_primary_perf_configs`` and
Megatron-Bridge v0.2.0's ``set_user_overrides`` / v0.4.2's ``set_post_overrides`` turn it on where DP, PP and VP
are all > 1, v0.4.2 not for fp8_mx / nvfp4: the first bucket's gather behind the optimizer step rather than the
first forward) and ``align_param_gather``; a partially sharded distributed optimizer. NeMo 25.07's 405B
GB200 recipe (v2.4.0 ``pretrain_llama31_405b.py``: ``num_distributed_optimizer_instances = num_nodes * 4 / 64``
= 2 on 32 nodes, with Megatron FSDP) shards the optimizer over half the data-parallel ranks and all-reduces
between the two instances; opcast prices ``--zero 3`` over all of them. Megatron-Bridge's GB200 405B
functions set the same (2) only with Megatron FSDP, which the published 25.11 / 26.04.01 405B rows do not use.
The MoE rows' settings beyond these (Megatron-Bridge v0.4.2 ``scripts/performance/configs/qwen/``, not columns of
the recipes CSV): the flex token dispatcher with HybridEP on most presets (priced, ``--moe-dispatcher flex``,
:data:`MOE_FLEX_DISPATCHER`; its ``moe_hybridep_num_sms = 32`` not), and, not priced,
``moe_router_force_load_balancing = True`` (``set_qwen3_common_configs``; opcast's routing is balanced),
``delay_wgrad_compute`` beside the H100 235B preset's combined 1F1B (which is priced, :data:`MOE_A2A_OVERLAP`), and
CUDA graphs of the attention / router / dispatch preprocessing (``transformer_engine`` scopes). The same for the
GPT-OSS (``configs/gpt_oss/``: HybridEP on B300), DeepSeek-V3 (``configs/deepseek/``: HybridEP, DeepEP on B200) and
Kimi K2 (``configs/kimi/``: HybridEP) presets; and DeepSeek-V3's multi-token-prediction layer (``mtp_num_layers =
1``, on the last pipeline rank, which the layouts give fewer layers), DeepSeek-V3's precision-aware optimizer (bf16
main gradients and Adam moments) and the BF16 rows' (``set_post_overrides`` turns it on for bf16 with Adam; fp32
moments in GPT-OSS), all counted or listed in the output where they change a row's mapping.

Printed and written (``--out``): per row measured vs predicted tokens/s/GPU and the signed error
(positive: opcast predicts faster than measured), the breakdown shares of opcast's critical stage
(forward, backward, exposed TP / CP / EP (expert all-to-all) / DP communication, pipeline bubble), the share of
the critical path priced by learned predictors, and how the FP8 / MXFP8 / NVFP4 GEMMs were priced (learned or
roofline); then the mean |error| overall and per (system, precision as published; MoE rows in groups of their own,
and all dense / all MoE / all), and the refused rows with their reasons. Rewriting the report keeps its
hand-written ``## Reading`` section.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mosaicml import cli_command, hand_written, train_command_options  # shared with the MosaicML report

ROOT = Path(__file__).resolve().parents[1]
CSV_PATH = Path(__file__).with_name("nemo_public.csv")
RECIPES_PATH = Path(__file__).with_name("nemo_public_recipes.csv")
RECIPE_COLUMNS = (
    "row",
    "offload_layers",
    "recipe_source",
    "recipe_setting",
    "tp_overlap_cfg",
    "tp_overlap_source",
    "tp_overlap_setting",
    "dp_overlap",
    "dp_overlap_source",
    "dp_overlap_setting",
    "recompute",
    "recompute_source",
    "recompute_setting",
    "cuda_graphs",
    "cuda_graphs_source",
    "cuda_graphs_setting",
    "grad_reduce",
    "grad_reduce_source",
    "grad_reduce_setting",
)
"""Every column of the recipes CSV: a row name of ``nemo_public.csv``; the layers whose activations the
recipe offloads, the recipe file (an https URL at a commit) and what it sets there (all three empty: not
read); the row's TP-overlap setting (:data:`TP_OVERLAP_KEYWORDS` or a ``--tp-comm-overlap-cfg`` text), the
file that sets it (https at a commit) and the config's name and how it is chosen (all three empty: none);
then three more facts, each as value, source (https at a commit) and what the recipe sets (all three empty:
not established): the data-parallel overlaps (:data:`DP_OVERLAP_VALUES`), activation recompute
(:data:`RECOMPUTE_MODES` or ``full-block:N``), CUDA graphs (:data:`CUDA_GRAPHS_RE`) and the dtype of the
data-parallel gradient reduction (:data:`GRAD_REDUCE_VALUES`)."""
TP_OVERLAP_OFF, TP_OVERLAP_TE, TP_OVERLAP_UNKNOWN = "off", "te-defaults", "unknown"
TP_OVERLAP_KEYWORDS = (TP_OVERLAP_OFF, TP_OVERLAP_TE, TP_OVERLAP_UNKNOWN)
"""``tp_overlap_cfg`` values that are not a config: the recipe turns TP comm overlap off; the recipe names no
config (TE's defaults apply); not established (priced at TE's defaults, counted in the output)."""
DP_OVERLAP_BOTH, DP_OVERLAP_GRAD, DP_OVERLAP_NONE = "grad+param", "grad", "none"
DP_OVERLAP_VALUES = (DP_OVERLAP_BOTH, DP_OVERLAP_GRAD, DP_OVERLAP_NONE)
"""``dp_overlap`` values: the distributed optimizer's ``overlap_grad_reduce`` and ``overlap_param_gather`` both on
(``--overlap-grad-reduce --overlap-param-gather``), only the gradient reduction overlapped (``overlap_param_gather
= False``: ``--overlap-grad-reduce``), neither. Not established: both, as NeMo's defaults (counted)."""
GRAD_REDUCE_VALUES = ("fp32", "bf16")
"""``grad_reduce`` values: Megatron-Core's ``grad_reduce_in_fp32`` as the recipe leaves it after every override
(``--grad-reduce-in-fp32`` / ``--no-grad-reduce-in-fp32``: the gradient buffer and its reduce-scatter in fp32 or
bf16). Not established: the framework's default (megatron: fp32, as Megatron-LM sets it for bf16), counted."""
RECOMPUTE_MODES = ("none", "selective", "full")
"""``recompute`` values opcast's ``--recompute`` takes; ``full-block:N`` (Megatron ``recompute_granularity full``,
``recompute_method block``, ``recompute_num_layers N``: the first N layers of each model chunk) is recorded but
not expressible (priced without recompute, counted)."""
RECOMPUTE_BLOCK_RE = re.compile(r"full-block:([1-9][0-9]*)")
RECOMPUTE_MODULES_RE = re.compile(r"selective:[a-z_]+(\+[a-z_]+)*")
"""``selective:MODULE[+MODULE]``: Megatron ``recompute_granularity selective`` with the preset's ``recompute_modules``
(Megatron-Bridge ``set_recompute_overrides``), e.g. ``mla_up_proj``, ``mlp``, ``moe_act``, ``layernorm``: passed to
``--recompute`` as they are (the same spelling, :mod:`opcast.predict.recompute`)."""
CUDA_GRAPHS_RE = re.compile(r"off|enable_cuda_graph|(local|transformer_engine):[a-z_]+(\+[a-z_]+)*")
"""``cuda_graphs`` values: ``off``; NeMo 2.x ``enable_cuda_graph``; Megatron-Bridge ``cuda_graph_impl:cuda_graph_scope``
(scopes joined by ``+``). Recorded, not priced (opcast has no CUDA-graph option), counted in the output."""
OUT = ROOT / "benchmarks" / "results" / "nemo_public.md"

REQUIRED = (
    "row",
    "source_url",
    "container",
    "system",
    "model",
    "arch",
    "n_gpus",
    "precision_published",
    "precision",
    "gbs",
    "mbs",
    "seq",
    "fsdp",
    "tp",
    "pp",
    "cp",
    "vp",
    "ep",
    "ga",
    "tokens_per_s_per_gpu",
    "model_tflops_per_gpu",
    "skip_reason",
)
"""Every column of the CSV (``ga``, ``model_tflops_per_gpu`` and ``skip_reason`` may be empty; ``precision``
too on a skipped row)."""

CLUSTERS = {
    "DGX-H100": "dgx-h100",
    "DGX-B200": "dgx-b200",
    "DGX-B300": "dgx-b300",
    "DGX-GB200": "gb200-nvl72",
    "DGX-GB300": "gb300-nvl72",
}
"""Published system -> catalog cluster (its GPU, links and NVLink domain; the job takes as few of its
NVLink domains as the world size ``tp x pp x cp x dp`` needs)."""
LAYER_SPLIT = {"llama3-405b": "megatron:embedding,loss", "qwen3-235b-a22b": "megatron:embedding,loss"}
"""Arch -> ``--pp-partition`` where NeMo's recipe sets one: Llama 3.1 405B's 126 layers with the embedding
and the loss each counted as a layer (Megatron ``account_for_embedding_in_pipeline_split`` /
``account_for_loss_in_pipeline_split``, set by NeMo's and Megatron-Bridge's 405B recipes) make 128, which
pp x vp divides; Qwen3-235B-A22B's 94 make 96 (Megatron-Bridge ``recipes/qwen/h100/qwen3_moe.py`` sets both
for its pipelined 235B configurations, 067f987; v0.4.2 ``recipes/qwen/qwen3_moe.py``
``qwen3_235b_a22b_pretrain_config``, which the 26.04.01 performance scripts build on, sets both too)."""
MOE_A2A_OVERLAP = {
    "26.04.01-h100-qwen3-235b-a22b-fp8": "Megatron-Bridge v0.4.2 (c810129) scripts/performance/configs/qwen/"
    "qwen3_workload_base_configs.py QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1 moe_a2a_overlap=True, which "
    "scripts/performance/utils/overrides.py turns into overlap_moe_expert_parallel_comm (and delay_wgrad_compute)",
    "26.04.01-gb200-gpt-oss-120b-bf16": "Megatron-Bridge v0.4.2 (c810129) scripts/performance/configs/gpt_oss/"
    "gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2 moe_a2a_overlap=True (the one "
    "GPT-OSS preset that sets it; utils/overrides.py _set_moe_a2a_overlap_overrides)",
    "26.04.01-b200-deepseek-v3-mxfp8": "Megatron-Bridge v0.4.2 (c810129) scripts/performance/configs/deepseek/"
    "deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 moe_a2a_overlap=True (the other "
    "DeepSeek-V3 presets set it False; utils/overrides.py _set_moe_a2a_overlap_overrides)",
}
"""MoE rows whose recipe runs Megatron-Core's combined 1F1B (``--overlap-moe-ep-comm``), with where it says so; the
other MoE presets set ``moe_a2a_overlap`` False or leave it unset."""
_MB = "Megatron-Bridge v0.4.2 (c810129) scripts/performance/configs/"
MOE_FLEX_DISPATCHER = {
    **{
        f"26.04.01-{system}-qwen3-30b-a3b-{dtype}": _MB + "qwen/qwen3_workload_base_configs.py QWEN3_30B_A3B presets: "
        'moe_flex_dispatcher_backend="hybridep"'
        for system, dtype in (
            ("gb300", "mxfp8"),
            ("gb200", "mxfp8"),
            ("b300", "mxfp8"),
            ("b200", "mxfp8"),
            ("h100", "fp8"),
        )
    },
    **{
        f"26.04.01-{system}-qwen3-235b-a22b-mxfp8": _MB + "qwen/qwen3_workload_base_configs.py QWEN3_235B_A22B "
        f'{system.upper()} presets: moe_flex_dispatcher_backend="hybridep" (the B200 and H100 presets: alltoall)'
        for system in ("gb300", "gb200", "b300")
    },
    "26.04.01-b300-gpt-oss-120b-bf16": _MB + "gpt_oss/gpt_oss_workload_base_configs.py B300 preset: HybridEP (the "
    "other GPT-OSS presets: alltoall)",
    **{
        f"26.04.01-{system}-deepseek-v3-mxfp8": _MB
        + "deepseek/deepseek_workload_base_configs.py: "
        + ("DeepEP" if system == "b200" else "HybridEP")
        for system in ("gb300", "gb200", "b300", "b200")
    },
    "26.04.01-gb300-kimi-k2-mxfp8": _MB + "kimi/kimi_workload_base_configs.py: HybridEP",
}
"""MoE rows whose recipe dispatches tokens with Megatron-Core's flex dispatcher (DeepEP or HybridEP:
``--moe-dispatcher flex``, one copy of a token per remote node), with where it says so; the other MoE rows use
``alltoall``. It changes the price only where the expert group spans nodes outside one NVLink domain (H100
30B-A3B, EP 16 over two nodes; B200 DeepSeek-V3, EP 32 over four)."""
PP_LAYOUTS = {
    "26.04.01-gb300-deepseek-v3-mxfp8": (
        "Et*4|(t*4|)*14tmL",
        "Megatron-Bridge v0.4.2 (c810129) scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
        "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1 pp_layout (FP8_MX_V2 = GB300_V2 = V1 with GBS 4096), which "
        "deepseek_llm_pretrain.py deepseek_v3_pretrain_config_gb300 sets as pipeline_model_parallel_layout",
    ),
    "26.04.01-gb200-deepseek-v3-mxfp8": (
        "Et*4|(t*4|)*14tmL",
        "Megatron-Bridge v0.4.2 (c810129) src/megatron/bridge/recipes/deepseek/deepseek_v3.py "
        "set_deepseek_v3_pipeline_model_parallel_layout, layout_map[(4, 4)] (DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1 "
        "sets no pp_layout, so deepseek_v3_pretrain_config_gb200 recomputes it for PP 4, VP 4)",
    ),
    "26.04.01-b300-deepseek-v3-mxfp8": (
        "Et*8|(t*8|)*6t*5mL",
        "Megatron-Bridge v0.4.2 (c810129) src/megatron/bridge/recipes/deepseek/deepseek_v3.py "
        "set_deepseek_v3_pipeline_model_parallel_layout, layout_map[(8, 1)] (deepseek_v3_pretrain_config_b300 "
        "recomputes it for DEEPSEEK_V3_PRETRAIN_CONFIG_B300_V2's PP 8, no VP)",
    ),
    "26.04.01-b200-deepseek-v3-mxfp8": (
        "Et*4|(t*4|)*14tmL",
        "Megatron-Bridge v0.4.2 (c810129) src/megatron/bridge/recipes/deepseek/deepseek_v3.py "
        "set_deepseek_v3_pipeline_model_parallel_layout, layout_map[(8, 2)] (deepseek_v3_pretrain_config_b200 "
        "recomputes it for DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2's PP 8, VP 2; the preset's own pp_layout is "
        "the same string)",
    ),
    "26.04.01-gb300-kimi-k2-mxfp8": (
        "Et*4|(t*4|)*14tL",
        "Megatron-Bridge v0.4.2 (c810129) src/megatron/bridge/recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout"
        "(4, 4) (KIMI_K2_PRETRAIN_CONFIG_GB300 sets no pp_layout; kimi_llm_pretrain.py kimi_k2_pretrain_config_gb300 "
        "computes it for PP 4, VP 4)",
    ),
}
"""Rows whose recipe sets Megatron-Core's ``pipeline_model_parallel_layout``, in Megatron's string syntax (one
``|``-separated part per virtual stage, ``E`` embedding, ``t`` transformer layer, ``m`` MTP layer, ``L`` loss,
``X*N`` and ``(...)*N`` repeat; virtual stage ``i`` on pipeline rank ``i % PP``), with where it is set. Passed as
``--pp-layers`` with each rank's transformer layers (:func:`layout_rank_layers`). The embedding and the loss sit on the
first and last rank as opcast places them anyway; the MTP layer is not priced (opcast reads no MTP, ``opcast.archs``).
Where a rank's layers are not a multiple of VP (DeepSeek-V3's and Kimi K2's 61 layers over 16 virtual stages:
no split of 61 into multiples of 2, 4 or 8 exists) the interleaved schedule cannot run the split, and the row is
priced with the same split under 1F1B, whose bubble is larger ((PP-1)/GA rather than (PP-1)/(VP x GA)), counted
(:func:`approximation_note`)."""
OPTIMIZER_NOT_PRICED = {
    "26.04.01-gb300-kimi-k2-mxfp8": "Muon: Megatron-Bridge v0.4.2 (c810129) recipes/kimi/kimi_k2.py "
    "kimi_k2_pretrain_config(optimizer_type='muon') (the default, which kimi_k2_pretrain_config_gb300 keeps; the "
    "archive notes 'Muon optimizer was used for pre-training Kimi-K2'): distributed_muon_with_cosine_annealing, "
    "use_distributed_optimizer False and overlap_param_gather False (its layer-wise distributed optimizer gathers "
    "the updated weights without overlap); priced as Adam with --zero 1 and --overlap-grad-reduce only (the "
    "recipes CSV's dp_overlap grad); Muon's Newton-Schulz iterations are not priced",
}
"""Rows whose recipe runs an optimizer opcast cannot price (``--optimizer`` is adam, sgd or none): priced as
Adam, counted (:func:`approximation_note`)."""
NULL_TOKENIZER_VOCAB = 32000
"""The vocabulary the GPT-OSS and DeepSeek-V3 rows train with: Megatron-Bridge v0.4.2 (c810129)
``recipes/gpt_oss/gpt_oss.py`` ``gpt_oss_120b_pretrain_config`` and ``recipes/deepseek/deepseek_v3.py``
``deepseek_v3_pretrain_config`` set ``tokenizer_type = "NullTokenizer"`` with ``vocab_size =
DEFAULT_NULL_TOKENIZER_VOCAB_SIZE`` (``recipes/utils/tokenizer_utils.py``: 32000; a multiple of 128, so Megatron pads
it no further), which ``scripts/performance/run_script.py`` keeps (``--tokenizer_type`` defaults to None). Kimi K2's
recipe sets ``cfg.tokenizer.vocab_size = cfg.model.vocab_size`` (163840); the Qwen3 recipes name their HF tokenizer."""
RECIPE_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt-oss-120b-vocab32000": ("gpt-oss-120b", {"vocab": NULL_TOKENIZER_VOCAB}),
    "deepseek-v3-vocab32000": ("deepseek-v3", {"vocab": NULL_TOKENIZER_VOCAB}),
}
"""Archs of rows whose recipe trains what no preset names: name -> (the preset it changes, the changed keys).
:func:`write_recipe_arch` writes each as ``NAME.json`` and the row's command reads it (``--arch NAME.json``). Kimi K2's
recipe trains its preset (``kimi-k2``: ``cfg.tokenizer.vocab_size = cfg.model.vocab_size``)."""
MOE_ETP = 1
"""Expert tensor parallelism of the MoE rows: Megatron-Bridge v0.4.2 (c810129)
``scripts/performance/configs/qwen/qwen3_workload_base_configs.py`` ``BASE_QWEN3_235B_A22B_CONFIG`` and
``BASE_QWEN3_30B_A3B_CONFIG`` set ``expert_tensor_parallel_size=1``: with TP > 1 (the H100 235B row, TP 2, EP 32
over DP 16) the experts fold over the tensor-parallel ranks (``--etp 1``)."""
PRECISION_GROUPS = {"FP8-MX": "MXFP8", "MXFP8": "MXFP8", "NVFP4": "NVFP4", "BF16": "BF16"}
"""Published precision -> its group in the summary (every other FP8 label: per-tensor FP8)."""
CURRENT_SCALING_LABELS = frozenset({"FP8-CS", "FP8 (current scaling)"})
"""Published precisions that name per-tensor current scaling (``--fp8-recipe current``)."""
PRECISIONS = {"fp8", "bf16", "mxfp8", "nvfp4"}
"""opcast precisions a predicted row may carry."""
QUANTISED_GEMMS = ("fp8", "fp8_block", "nvfp4")
"""Kernel dtypes of the block linears' GEMMs under fp8, mxfp8 and nvfp4 (the table's ``fp8 GEMMs`` column)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """What one row's recipe sets beyond the published table (one line of the recipes CSV)."""

    offload_layers: int = 0
    """``--offload-activations``: what the row's recipe offloads; 0 without an entry."""
    recipe_source: str = ""
    tp_overlap: str = ""
    """The recipe's TP-overlap setting (:data:`TP_OVERLAP_KEYWORDS` or a ``--tp-comm-overlap-cfg`` text); empty:
    none read (priced as ``unknown``)."""
    tp_overlap_source: str = ""
    dp_overlap: str = ""
    """The recipe's data-parallel overlaps (:data:`DP_OVERLAP_VALUES`); empty: not established (both passed)."""
    dp_overlap_source: str = ""
    recompute: str = ""
    """The recipe's activation recompute (:data:`RECOMPUTE_MODES` or ``full-block:N``); empty: not established."""
    recompute_source: str = ""
    cuda_graphs: str = ""
    """The recipe's CUDA graphs (:data:`CUDA_GRAPHS_RE`; not priced); empty: not established."""
    cuda_graphs_source: str = ""
    grad_reduce: str = ""
    """The recipe's gradient-reduction dtype (:data:`GRAD_REDUCE_VALUES`); empty: not established."""
    grad_reduce_source: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One published configuration and its measured throughput."""

    row: str
    source_url: str
    container: str
    system: str
    model: str
    arch: str
    n_gpus: int
    precision_published: str
    precision: str
    gbs: int
    mbs: int
    seq: int
    fsdp: int
    tp: int
    pp: int
    cp: int
    vp: int
    ep: int
    ga: int | None
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float | None
    skip_reason: str
    recipe: Recipe = Recipe()
    """What the row's recipe sets beyond the published table (:func:`read_recipes`); empty without an entry."""

    @property
    def dp(self) -> int:
        return self.n_gpus // (self.tp * self.pp * self.cp)


def _int(rec: dict[str, str], column: str, where: str) -> int:
    text = rec[column].strip()
    if not text.isdigit() or int(text) < 0:
        raise ValueError(f"{where}: {column} {text!r} is not a whole number")
    return int(text)


def parse_row(rec: dict[str, str], where: str) -> Row:
    """One CSV record as a :class:`Row`, its values checked (sizes, world size, GA, a known mapping)."""
    missing = [c for c in REQUIRED if c not in rec]
    if missing:
        raise ValueError(f"{where}: missing columns {', '.join(missing)}")
    empty = [
        c
        for c in REQUIRED
        if c not in ("ga", "model_tflops_per_gpu", "skip_reason", "precision") and not rec[c].strip()
    ]
    if empty:
        raise ValueError(f"{where}: empty {', '.join(empty)}")
    ints = {c: _int(rec, c, where) for c in ("n_gpus", "gbs", "mbs", "seq", "fsdp", "tp", "pp", "cp", "vp", "ep")}
    row = Row(
        row=rec["row"].strip(),
        source_url=rec["source_url"].strip(),
        container=rec["container"].strip(),
        system=rec["system"].strip(),
        model=rec["model"].strip(),
        arch=rec["arch"].strip(),
        precision_published=rec["precision_published"].strip(),
        precision=rec["precision"].strip(),
        ga=_int(rec, "ga", where) if rec["ga"].strip() else None,
        tokens_per_s_per_gpu=float(rec["tokens_per_s_per_gpu"]),
        model_tflops_per_gpu=float(rec["model_tflops_per_gpu"]) if rec["model_tflops_per_gpu"].strip() else None,
        skip_reason=rec["skip_reason"].strip(),
        **ints,
    )
    if not row.source_url.startswith("https://"):
        raise ValueError(f"{where}: source_url must be an https URL")
    if min(row.n_gpus, row.gbs, row.mbs, row.seq, row.tp, row.pp, row.cp, row.vp, row.ep) < 1:
        raise ValueError(f"{where}: sizes and parallel degrees must be >= 1")
    if row.tokens_per_s_per_gpu <= 0:
        raise ValueError(f"{where}: tokens_per_s_per_gpu must be positive")
    if row.n_gpus % (row.tp * row.pp * row.cp):
        raise ValueError(f"{where}: tp x pp x cp = {row.tp * row.pp * row.cp} does not divide {row.n_gpus} GPUs")
    if row.gbs % (row.mbs * row.dp):
        raise ValueError(f"{where}: GBS {row.gbs} is not a whole number of MBS {row.mbs} x DP {row.dp}")
    if row.ga is not None and row.ga != row.gbs // (row.mbs * row.dp):
        raise ValueError(f"{where}: GA {row.ga} != GBS / (MBS x DP) = {row.gbs // (row.mbs * row.dp)}")
    if not row.skip_reason:
        if row.system not in CLUSTERS:
            raise ValueError(
                f"{where}: system {row.system!r} is not one of {', '.join(CLUSTERS)}; or give a skip_reason"
            )
        if row.precision not in PRECISIONS:
            raise ValueError(f"{where}: precision {row.precision!r} is not one of {sorted(PRECISIONS)}; or skip it")
        load_row_arch(row.arch)  # an unknown arch raises OpcastError naming the presets
        if row.row in PP_LAYOUTS:
            layout_rank_layers(PP_LAYOUTS[row.row][0], pp=row.pp, vp=row.vp)  # a layout of other stages raises
    return row


def write_recipe_arch(name: str, folder: Path) -> Path:
    """``folder/NAME.json`` of a :data:`RECIPE_ARCHS` arch: the preset's JSON with the changed keys; what
    ``--arch NAME.json`` reads."""
    import json

    from opcast.archs import load_arch

    preset, keys = RECIPE_ARCHS[name]
    data = {**dataclasses.asdict(load_arch(preset)), **keys, "name": name}  # as `opcast arch show` prints it
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


@functools.cache
def load_row_arch(name: str):
    """The :class:`opcast.archs.ArchSpec` a row's ``arch`` names: a preset, or a :data:`RECIPE_ARCHS` arch loaded
    from the file :func:`write_recipe_arch` writes, as the command line reads it."""
    import tempfile

    from opcast.archs import load_arch

    if name not in RECIPE_ARCHS:
        return load_arch(name)
    with tempfile.TemporaryDirectory() as folder:
        return load_arch(write_recipe_arch(name, Path(folder)))


def layout_rank_layers(layout: str, *, pp: int, vp: int) -> tuple[int, ...]:
    """Transformer layers of each pipeline rank under Megatron-Core's ``pipeline_model_parallel_layout`` string
    (:data:`PP_LAYOUTS`): its ``PP x VP`` virtual stages, stage ``i`` on rank ``i % PP`` (Megatron-Core
    ``PipelineParallelLayerLayout``). A string of another stage count raises ValueError."""
    text = layout
    while (group := re.search(r"\(([^()]*)\)\*([0-9]+)", text)) is not None:
        text = text[: group.start()] + group[1] * int(group[2]) + text[group.end() :]
    text = re.sub(r"([EtmL])\*([0-9]+)", lambda m: m[1] * int(m[2]), text)
    if not re.fullmatch(r"[EtmL|]*", text):
        raise ValueError(f"pipeline layout {layout!r}: only E, t, m, L, |, X*N and (...)*N are understood")
    stages = text.split("|")
    if len(stages) != pp * vp:
        raise ValueError(f"pipeline layout {layout!r} has {len(stages)} stages, PP x VP = {pp * vp}")
    return tuple(sum(stage.count("t") for stage in stages[rank::pp]) for rank in range(pp))


def layout_interleaves(row: Row) -> bool:
    """Whether the interleaved schedule can run ``row``'s :data:`PP_LAYOUTS` split (every rank's layers a multiple
    of VP); without a layout, whether the row interleaves at all."""
    if row.vp < 2:
        return False
    if row.row not in PP_LAYOUTS:
        return True
    return all(n % row.vp == 0 for n in layout_rank_layers(PP_LAYOUTS[row.row][0], pp=row.pp, vp=row.vp))


def _fact(rec: dict[str, str], columns: tuple[str, str, str], where: str) -> tuple[str, str] | None:
    """(value, source) of one fact's three columns (value, https source, what it sets), or None where all are empty."""
    value, source, setting = (rec[c].strip() for c in columns)
    if not (value or source or setting):
        return None
    if not value or not source.startswith("https://") or not setting:
        raise ValueError(
            f"{where}: give {columns[0]} with {columns[1]} (an https URL) and {columns[2]} (what it sets), "
            "or leave all three empty"
        )
    return value, source


def read_recipes(path: Path = RECIPES_PATH) -> dict[str, Recipe]:
    """Row name -> :class:`Recipe` from the recipes CSV, each value checked (a ``tp_overlap_cfg`` text is parsed
    as ``--tp-comm-overlap-cfg`` parses it)."""
    from opcast.predict.tp_overlap import parse_configs

    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in RECIPE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path.name}: missing columns {', '.join(missing)}")
        out: dict[str, Recipe] = {}
        for i, rec in enumerate(reader, 2):
            where = f"{path.name}:{i}"
            name = rec["row"].strip()
            if not name or name in out:
                raise ValueError(f"{where}: empty or duplicate row name {name!r}")
            offload = _fact(rec, ("offload_layers", "recipe_source", "recipe_setting"), where)
            overlap = _fact(rec, ("tp_overlap_cfg", "tp_overlap_source", "tp_overlap_setting"), where)
            dp = _fact(rec, ("dp_overlap", "dp_overlap_source", "dp_overlap_setting"), where)
            recompute = _fact(rec, ("recompute", "recompute_source", "recompute_setting"), where)
            graphs = _fact(rec, ("cuda_graphs", "cuda_graphs_source", "cuda_graphs_setting"), where)
            grads = _fact(rec, ("grad_reduce", "grad_reduce_source", "grad_reduce_setting"), where)
            if all(f is None for f in (offload, overlap, dp, recompute, graphs, grads)):
                raise ValueError(
                    f"{where}: {name} sets nothing; give offload_layers, tp_overlap_cfg, dp_overlap, recompute, "
                    "cuda_graphs or grad_reduce"
                )
            if grads is not None and grads[0] not in GRAD_REDUCE_VALUES:
                raise ValueError(f"{where}: grad_reduce {grads[0]!r} is not one of {', '.join(GRAD_REDUCE_VALUES)}")
            if dp is not None and dp[0] not in DP_OVERLAP_VALUES:
                raise ValueError(f"{where}: dp_overlap {dp[0]!r} is not one of {', '.join(DP_OVERLAP_VALUES)}")
            if recompute is not None and not (
                recompute[0] in RECOMPUTE_MODES
                or RECOMPUTE_BLOCK_RE.fullmatch(recompute[0])
                or RECOMPUTE_MODULES_RE.fullmatch(recompute[0])
            ):
                raise ValueError(
                    f"{where}: recompute {recompute[0]!r} is not one of {', '.join(RECOMPUTE_MODES)} nor full-block:N "
                    "nor selective:MODULE[+MODULE]"
                )
            if graphs is not None and not CUDA_GRAPHS_RE.fullmatch(graphs[0]):
                raise ValueError(
                    f"{where}: cuda_graphs {graphs[0]!r} is not off, enable_cuda_graph nor IMPL:SCOPE[+SCOPE] "
                    "(IMPL local or transformer_engine)"
                )
            if overlap is not None and overlap[0] not in TP_OVERLAP_KEYWORDS:
                try:
                    parse_configs(overlap[0])
                except ValueError as err:
                    raise ValueError(
                        f"{where}: tp_overlap_cfg is not {', '.join(TP_OVERLAP_KEYWORDS)} nor a "
                        f"--tp-comm-overlap-cfg text: {err}"
                    ) from None
            out[name] = Recipe(
                offload_layers=_int(rec, "offload_layers", where) if offload else 0,
                recipe_source=offload[1] if offload else "",
                tp_overlap=overlap[0] if overlap else "",
                tp_overlap_source=overlap[1] if overlap else "",
                dp_overlap=dp[0] if dp else "",
                dp_overlap_source=dp[1] if dp else "",
                recompute=recompute[0] if recompute else "",
                recompute_source=recompute[1] if recompute else "",
                cuda_graphs=graphs[0] if graphs else "",
                cuda_graphs_source=graphs[1] if graphs else "",
                grad_reduce=grads[0] if grads else "",
                grad_reduce_source=grads[1] if grads else "",
            )
    return out


def read_rows(path: Path = CSV_PATH, recipes: Path | None = RECIPES_PATH) -> list[Row]:
    """The rows of ``path`` with what ``recipes`` (:func:`read_recipes`; None: none) adds to them."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path.name}: missing columns {', '.join(missing)}")
        rows = [parse_row(rec, f"{path.name}:{i}") for i, rec in enumerate(reader, 2)]
    names = [r.row for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"{path.name}: duplicate row names")
    extra = read_recipes(recipes) if recipes is not None else {}
    for r in rows:  # entries naming rows of another CSV (a subset of the rows) are left unused
        if r.row in extra and extra[r.row].tp_overlap and r.tp < 2:
            raise ValueError(f"{r.row}: the recipes CSV sets tp_overlap_cfg but the row runs TP {r.tp} (no TP overlap)")
        if r.row in extra and extra[r.row].recompute in ("selective", "full") and extra[r.row].offload_layers:
            raise ValueError(
                f"{r.row}: the recipes CSV sets both recompute {extra[r.row].recompute} and offload_layers "
                "(Megatron-Core refuses CPU offloading with recompute); give one"
            )
    return [dataclasses.replace(r, recipe=extra[r.row]) if r.row in extra else r for r in rows]


# --------------------------------------------------------------------------- row -> command line


def row_options(row: Row) -> dict[str, Any]:
    """The ``opcast predict train`` option values (by option name) of a predicted row; the rest keep
    the command's defaults. See the module docstring for why each is set."""
    if row.skip_reason:
        raise ValueError(f"{row.row} is skipped: {row.skip_reason}")
    arch = f"{row.arch}.json" if row.arch in RECIPE_ARCHS else row.arch  # the file write_recipe_arch writes
    values: dict[str, Any] = {"arch": arch, **placement_options(row)}
    values |= {
        "tp": row.tp,
        "pp": row.pp,
        "cp": row.cp,
        "dp": row.dp,
        "micro_batch": row.mbs,
        "global_batch": row.gbs,
        "seq": row.seq,
        "precision": row.precision,
        "framework": "megatron",
        **({"fp8_recipe": fp8_recipe(row)} if row.precision == "fp8" else {}),
        "zero": 3 if row.fsdp else 1,
    }
    if not row.fsdp:  # ZeRO-3 gathers and reduce-scatters per layer behind compute already
        dp_overlap = row.recipe.dp_overlap or DP_OVERLAP_BOTH  # not established: NeMo's defaults
        if dp_overlap != DP_OVERLAP_NONE:
            values["overlap_grad_reduce"] = True
        if dp_overlap == DP_OVERLAP_BOTH:
            values["overlap_param_gather"] = True
    if row.recipe.grad_reduce:  # not established: the framework's default (megatron: fp32), counted
        values["grad_reduce_in_fp32"] = row.recipe.grad_reduce == "fp32"
    if row.recipe.recompute in ("selective", "full") or RECOMPUTE_MODULES_RE.fullmatch(row.recipe.recompute):
        values["recompute"] = row.recipe.recompute  # full-block:N: priced without (counted)
    if row.row in PP_LAYOUTS:
        values["pp_layers"] = ",".join(map(str, layout_rank_layers(PP_LAYOUTS[row.row][0], pp=row.pp, vp=row.vp)))
    elif row.pp > 1 and row.arch in LAYER_SPLIT:
        values["pp_partition"] = LAYER_SPLIT[row.arch]
    if row.ep > 1:  # every MoE row's recipe folds the experts (expert_tensor_parallel_size 1, MOE_ETP)
        values["ep"] = row.ep
        if row.tp > 1:
            values["etp"] = MOE_ETP
        if row.row in MOE_A2A_OVERLAP and (row.pp == 1 or layout_interleaves(row)):  # else not expressible
            values["overlap_moe_ep_comm"] = True
        if row.row in MOE_FLEX_DISPATCHER:
            values["moe_dispatcher"] = "flex"
    if row.tp > 1:
        values["sp"] = True
        if row.recipe.tp_overlap != TP_OVERLAP_OFF:
            values["tp_comm_overlap"] = True
        if row.recipe.tp_overlap and row.recipe.tp_overlap not in TP_OVERLAP_KEYWORDS:
            values["tp_comm_overlap_cfg"] = row.recipe.tp_overlap
    if layout_interleaves(row):  # a layout whose ranks VP does not divide runs 1F1B (PP_LAYOUTS, counted)
        values.update(schedule="interleaved", virtual_stages=row.vp, overlap_p2p_comm=True)
    if row.recipe.offload_layers:
        values["offload_activations"] = row.recipe.offload_layers
    return values


def fp8_recipe(row: Row) -> str:
    """The per-tensor fp8 scaling recipe of an fp8 row: ``current`` where the table says current scaling
    (:data:`CURRENT_SCALING_LABELS`) or a Megatron-Bridge container measured it (its performance scripts'
    only per-tensor FP8, ``fp8_cs``), else ``delayed`` (see the module docstring)."""
    if row.precision_published in CURRENT_SCALING_LABELS or "Megatron-Bridge" in row.container:
        return "current"
    return "delayed"


def placement_options(row: Row) -> dict[str, Any]:
    """``--cluster NAME`` of the row's system; where the job spans several NVLink domains that its GPUs
    do not fill (128 or 256 GPUs of GB200 NVL72 racks of 72), ``--cluster NAME:RACKS --gpus-per-node
    GPUS/RACKS``: the cluster's GPU, links and collectives learned on it, on part of each rack."""
    from opcast.clusters import find_cluster

    name = CLUSTERS[row.system]
    spec = find_cluster(name)
    if spec is None:
        raise ValueError(f"{row.row}: catalog cluster {name!r} is missing from data/clusters")
    domain = spec.nvlink_domain_gpus
    if row.n_gpus <= domain or row.n_gpus % domain == 0:
        return {"cluster": name}
    racks = -(-row.n_gpus // domain)
    if row.n_gpus % racks:
        raise ValueError(f"{row.row}: {row.n_gpus} GPUs do not split evenly over {racks} {name} domains")
    return {"cluster": f"{name}:{racks}", "gpus_per_node": row.n_gpus // racks}


# --------------------------------------------------------------------------- prediction


@dataclasses.dataclass(frozen=True, slots=True)
class Prediction:
    feasible: bool
    reasons: tuple[str, ...] = ()
    tokens_per_s_per_gpu: float | None = None
    iteration_s: float | None = None
    mfu: float | None = None
    shares: dict[str, float] = dataclasses.field(default_factory=dict)
    """Breakdown of the iteration (critical stage) as fractions."""
    learned_share: float | None = None
    fp8_gemm: str = ""
    """How the fp8 GEMMs of the critical stage were priced: share of the stage's kernel time, and source."""


@functools.cache
def _kernels(models: str | None):
    from opcast.predict import options

    return options.kernel_cost(
        options.Args(models=None if models is None else Path(models), roofline=False, analytic=False)
    )


def _fp8_gemm_summary(result) -> str:
    """Share of the critical stage's kernel time in fp8 / block-scaled GEMMs, and the pricing source of that time."""
    by_stage: dict[int, float] = defaultdict(float)
    for op in result.ops:
        by_stage[op.stage] += op.count * op.time_s
    if not by_stage:
        return ""
    stage = max(by_stage, key=by_stage.__getitem__)
    ops = [op for op in result.ops if op.stage == stage]
    total = sum(op.count * op.time_s for op in ops)
    fp8 = [op for op in ops if op.kernel.kind == "gemm" and op.kernel.dtype in QUANTISED_GEMMS]
    if not fp8:
        return "none"
    sources: dict[str, float] = defaultdict(float)
    for op in fp8:
        sources[op.source.split("/")[0].split(" ")[0]] += op.count * op.time_s
    t = sum(sources.values())
    mix = ", ".join(f"{k} {v / t:.0%}" for k, v in sorted(sources.items(), key=lambda kv: -kv[1]))
    return f"{t / total:.0%} of kernel time ({mix})"


def predict_row(row: Row, *, models: str | None = None, clocks: str = "sustained") -> Prediction:
    """What ``opcast predict train`` (:func:`cli_command` of :func:`row_options`, with ``--clocks`` when ``clocks`` is
    not the default) predicts for ``row``."""
    from opcast.predict import options
    from opcast.predict.training import TrainResult, compile_train, run_train

    values = row_options(row) | ({} if clocks == "sustained" else {"clocks": clocks})
    o = options.Args(**({n: d for n, (_, d) in train_command_options().items()} | values))
    where = options.placement(o)
    dev = options.device(where.gpu, o.set_)
    plan = compile_train(
        load_row_arch(row.arch), dev, options.train_config(o), nodes=where.nodes, gpus_per_node=where.gpus_per_node
    )
    if isinstance(plan, TrainResult):
        return Prediction(False, tuple(plan.reasons))
    kernels = _kernels(models)
    result = run_train(plan, kernels, where.comms(kernels), coverage=o.coverage, interval_mode=o.interval_mode)
    if not result.feasible:
        return Prediction(False, tuple(result.reasons))
    total = sum(result.breakdown_s.values()) or 1.0
    return Prediction(
        True,
        tokens_per_s_per_gpu=result.tokens_per_s / row.n_gpus,
        iteration_s=result.iteration_time_s,
        mfu=result.mfu,
        shares={k: v / total for k, v in result.breakdown_s.items()},
        learned_share=result.interval.learned_share if result.interval is not None else None,
        fp8_gemm=_fp8_gemm_summary(result) if row.precision in ("fp8", "mxfp8", "nvfp4") else "",
    )


def error(row: Row, pred: Prediction) -> float | None:
    """Signed relative error of the predicted tokens/s/GPU (positive: opcast predicts faster)."""
    return None if pred.tokens_per_s_per_gpu is None else pred.tokens_per_s_per_gpu / row.tokens_per_s_per_gpu - 1


# --------------------------------------------------------------------------- report

SHARE_KEYS = (
    ("forward", "fwd"),
    ("backward", "bwd"),
    ("tp_comm", "tp"),
    ("cp_comm", "cp"),
    ("ep_comm", "ep"),
    ("dp_comm_exposed", "dp"),
    ("offload_exposed", "offload"),
)


def _shares(pred: Prediction) -> str:
    s = pred.shares
    parts = [f"{short} {100 * s[k]:.0f}" for k, short in SHARE_KEYS if s.get(k, 0) >= 0.005]
    bubble = s.get("pipeline_bubble", 0)
    if bubble >= 0.005:
        parts.append(f"bubble {100 * bubble:.0f}")
    rest = 1 - sum(s.get(k, 0) for k, _ in SHARE_KEYS) - bubble
    if rest >= 0.005:
        parts.append(f"other {100 * rest:.0f}")
    return ", ".join(parts)


def tp_overlap_kind(row: Row) -> str:
    """How a TP > 1 row's TP overlap is priced: ``recipe`` (its recipe's config), or a :data:`TP_OVERLAP_KEYWORDS`
    value (``unknown`` also where no entry was read)."""
    if row.recipe.tp_overlap in TP_OVERLAP_KEYWORDS:
        return row.recipe.tp_overlap
    return "recipe" if row.recipe.tp_overlap else TP_OVERLAP_UNKNOWN


def tp_overlap_note(rows: list[Row]) -> str:
    """One line counting the predicted TP > 1 rows by :func:`tp_overlap_kind`, naming those not established."""
    tp = [r for r in rows if not r.skip_reason and r.tp > 1]
    kinds: dict[str, list[str]] = defaultdict(list)
    for r in tp:
        kinds[tp_overlap_kind(r)].append(r.row)
    unknown = kinds[TP_OVERLAP_UNKNOWN]
    return (
        f"TP overlap of the {len(tp)} predicted TP > 1 rows: {len(kinds['recipe'])} priced with their recipe's "
        f"userbuffers config, {len(kinds[TP_OVERLAP_OFF])} without overlap as their recipe sets, "
        f"{len(kinds[TP_OVERLAP_TE])} at TE's defaults as their recipe leaves them, {len(unknown)} not established "
        "(priced at TE's defaults)" + (f": {', '.join(unknown)}" if unknown else "") + "."
    )


def recipe_facts_note(rows: list[Row]) -> str:
    """One line counting, over the predicted rows, the data-parallel overlap, recompute and CUDA-graph facts read
    from their recipes, naming the rows priced otherwise than their recipe runs (or not established)."""
    pred = [r for r in rows if not r.skip_reason]
    facts = ("dp_overlap", "recompute", "cuda_graphs", "grad_reduce")
    missing = {k: [r.row for r in pred if not getattr(r.recipe, k)] for k in facts}
    bf16_grads = [r.row for r in pred if r.recipe.grad_reduce == "bf16"]
    param_off = [r.row for r in pred if r.recipe.dp_overlap in (DP_OVERLAP_GRAD, DP_OVERLAP_NONE)]
    partial = [f"{r.row} ({r.recipe.recompute})" for r in pred if RECOMPUTE_BLOCK_RE.fullmatch(r.recipe.recompute)]
    passed = [
        f"{r.row} ({r.recipe.recompute})"
        for r in pred
        if r.recipe.recompute in ("selective", "full") or RECOMPUTE_MODULES_RE.fullmatch(r.recipe.recompute)
    ]
    graphs = [f"{r.row} ({r.recipe.cuda_graphs})" for r in pred if r.recipe.cuda_graphs not in ("", "off")]

    def unread(key: str) -> str:
        names = missing[key]
        if key != "dp_overlap" and names and names == missing["dp_overlap"]:
            return f"{len(names)} not established (the same rows)"
        return f"{len(names)} not established" + (f" ({', '.join(names)})" if names else "")

    return (
        f"Recipe facts of the {len(pred)} predicted rows: data-parallel overlap read for "
        f"{len(pred) - len(missing['dp_overlap'])}, param-gather overlap off in {len(param_off)}"
        + (f" ({', '.join(param_off)})" if param_off else "")
        + f", {unread('dp_overlap')} (priced with both overlaps); activation recompute read for "
        f"{len(pred) - len(missing['recompute'])}, passed as --recompute in {len(passed)}"
        + (f" ({', '.join(passed)})" if passed else "")
        + f", partial and not expressible (priced without) in {len(partial)}"
        + (f" ({', '.join(partial)})" if partial else "")
        + f", {unread('recompute')} (priced without); CUDA graphs read for "
        f"{len(pred) - len(missing['cuda_graphs'])}, on and not priced in {len(graphs)}"
        + (f" ({', '.join(graphs)})" if graphs else "")
        + f", {unread('cuda_graphs')}; gradient reduction read for {len(pred) - len(missing['grad_reduce'])} "
        f"(bf16 in {len(bf16_grads)}), {unread('grad_reduce')} (priced in fp32, megatron's default)."
    )


def approximation_note(rows: list[Row]) -> str:
    """One line naming the predicted rows priced at the closest expressible configuration rather than their recipe's:
    a pipeline layout the interleaved schedule cannot run (1F1B, :data:`PP_LAYOUTS`), and with it a combined 1F1B
    (:data:`MOE_A2A_OVERLAP`, which opcast runs only interleaved or without a pipeline), an MTP layer, an optimizer
    (:data:`OPTIMIZER_NOT_PRICED`)."""
    pred = [r for r in rows if not r.skip_reason]
    items = []
    for r in pred:
        what = []
        if r.row in PP_LAYOUTS:
            layout = PP_LAYOUTS[r.row][0]
            layers = ",".join(map(str, layout_rank_layers(layout, pp=r.pp, vp=r.vp)))
            if r.vp > 1 and not layout_interleaves(r):
                what.append(f"layout {layout} as --pp-layers {layers} under 1F1B (VP {r.vp} divides no split of them)")
                if r.row in MOE_A2A_OVERLAP:
                    what.append("its combined 1F1B not priced (opcast's needs the interleaved schedule)")
            if "m" in layout:
                what.append("its MTP layer not priced")
        if r.row in OPTIMIZER_NOT_PRICED:
            what.append(OPTIMIZER_NOT_PRICED[r.row].split(":")[0] + " priced as Adam")
        if what:
            items.append(f"{r.row} ({'; '.join(what)})")
    head = f"Priced at the closest expressible configuration: {len(items)} of the {len(pred)} predicted rows"
    return head + (f": {', '.join(items)}." if items else ".")


_OVERLAP_TAGS = {"recipe": "ub recipe", TP_OVERLAP_OFF: "ub off", TP_OVERLAP_TE: "ub TE", TP_OVERLAP_UNKNOWN: "ub TE?"}


def _config(row: Row) -> str:
    parts = [f"tp{row.tp} pp{row.pp} cp{row.cp} dp{row.dp}"]
    if row.ep > 1:
        parts.append(f"ep{row.ep} flex" if row.row in MOE_FLEX_DISPATCHER else f"ep{row.ep}")
    if row.vp > 1:
        parts.append(f"vp{row.vp}" if layout_interleaves(row) else f"vp{row.vp} as 1f1b")
    if row.row in PP_LAYOUTS:
        parts.append("layers " + ",".join(map(str, layout_rank_layers(PP_LAYOUTS[row.row][0], pp=row.pp, vp=row.vp))))
    if row.fsdp:
        parts.append("fsdp")
    if row.recipe.offload_layers:
        parts.append(f"offload {row.recipe.offload_layers}")
    if row.tp > 1:
        parts.append(_OVERLAP_TAGS[tp_overlap_kind(row)])
    if row.recipe.dp_overlap in (DP_OVERLAP_GRAD, DP_OVERLAP_NONE):
        parts.append("no pg overlap")
    if row.recipe.recompute not in ("", "none"):
        parts.append(f"recompute {row.recipe.recompute}")
    if row.recipe.cuda_graphs not in ("", "off"):
        parts.append("cuda graphs")
    return " ".join(parts) + f", gbs {row.gbs} mbs {row.mbs} seq {row.seq}"


def row_table(rows: list[Row], preds: dict[str, Prediction]) -> list[str]:
    lines = [
        "| row | system | model | #GPUs | precision | config | measured tok/s/GPU | predicted | error "
        "| breakdown % (critical stage) | learned share | fp8 GEMMs |",
        "|---|---|---|---:|---|---|---:|---:|---:|---|---:|---|",
    ]
    for row in rows:
        prec = row.precision_published
        head = f"| {row.row} | {row.system} | {row.model} | {row.n_gpus} | {prec} | {_config(row)} "
        head += f"| {row.tokens_per_s_per_gpu:,.0f} "
        if row.skip_reason:
            lines.append(head + f"| skipped | | {row.skip_reason} | | |")
            continue
        pred = preds[row.row]
        if not pred.feasible:
            lines.append(head + f"| refused | | {'; '.join(pred.reasons)} | | |")
            continue
        e = error(row, pred)
        learned = "" if pred.learned_share is None else f"{pred.learned_share:.0%}"
        lines.append(
            head
            + f"| {pred.tokens_per_s_per_gpu:,.0f} | {100 * e:+.1f} % | {_shares(pred)} | {learned} | {pred.fp8_gemm} |"
        )
    return lines


def summary_table(rows: list[Row], preds: dict[str, Prediction]) -> list[str]:
    groups: dict[str, list[float]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    for row in rows:
        if row.skip_reason:
            continue
        key = f"{row.system}, {PRECISION_GROUPS.get(row.precision_published, 'FP8 per-tensor')}"
        moe = row.ep > 1
        if moe:  # MoE rows apart: their own check, and the dense groups stay comparable with earlier runs
            key = f"MoE: {key}"
        e = error(row, preds[row.row])
        for k in (key, "all MoE" if moe else "all dense", "all"):
            if e is None:
                refused[k] += 1
            else:
                groups[k].append(e)
    lines = [
        "| group | predicted rows | mean abs error | median signed error | within 10 % | refused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    totals = ("all dense", "all MoE", "all")
    keys = [*sorted(k for k in groups.keys() | refused.keys() if k not in totals), *(t for t in totals if t != "all")]
    for key in [k for k in keys if k in groups or k in refused] + ["all"]:
        errs = groups.get(key, [])
        if errs:
            cells = (
                f"{100 * statistics.fmean(abs(e) for e in errs):.1f} % | {100 * statistics.median(errs):+.1f} % | "
                f"{sum(abs(e) <= 0.10 for e in errs)}"
            )
        else:
            cells = "- | - | -"
        lines.append(f"| {key} | {len(errs)} | {cells} | {refused.get(key, 0)} |")
    return lines


def report(rows: list[Row], preds: dict[str, Prediction], *, wall_s: float, models: str | None, keep: list[str]) -> str:
    predicted = [r for r in rows if not r.skip_reason]
    example = next((r for r in predicted if r.vp > 1 and r.tp > 1), predicted[0]) if predicted else None
    lines = [
        "# NeMo / Megatron-Bridge published pre-training throughput vs `opcast predict train`",
        "",
        "`python benchmarks/nemo_public.py --out benchmarks/results/nemo_public.md` "
        f"(model set: {models or 'models/default (embedded)'}; {wall_s:.1f} s). "
        "Measured: NVIDIA's performance summaries (URL per row in `benchmarks/nemo_public.csv`); "
        "nothing is fitted to them. Error = predicted / measured tokens/s/GPU - 1 "
        "(positive: opcast predicts faster than NVIDIA measured).",
        "",
    ]
    if example is not None:
        lines += [
            f"Mapping (see the script's docstring): e.g. `{example.row}` is `{cli_command(row_options(example))}`.",
            "",
        ]
    lines += ["## Summary", "", *summary_table(rows, preds), "", tp_overlap_note(rows), "", recipe_facts_note(rows), ""]
    lines += [approximation_note(rows), ""]
    lines += [
        "Config column: `epN flex` = the recipe's flex token dispatcher, DeepEP or HybridEP (`--moe-dispatcher flex`, "
        "MOE_FLEX_DISPATCHER; else alltoall); `ub recipe` = the recipe's userbuffers config (`--tp-comm-overlap-cfg`), "
        "`ub off` = no TP "
        "overlap (the recipe's), `ub TE?` = not established, TE's defaults; `no pg overlap` = the recipe turns "
        "`overlap_param_gather` off (no `--overlap-param-gather`); `recompute selective:MODULES` = Megatron-Core's "
        "recompute modules (priced), `recompute full-block:N` = the recipe's partial recompute (not expressible, "
        "priced without); `vpN as 1f1b` and `layers` = the recipe's "
        "pipeline layout (`--pp-layers`), under 1F1B where VP divides no split of it; `cuda graphs` = on in the "
        "recipe (not priced); the recipes CSV says which.",
        "",
        "## Per row",
        "",
        *row_table(rows, preds),
        "",
    ]
    lines += keep
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH)
    ap.add_argument("--recipes", type=Path, default=RECIPES_PATH, help="what the recipes set beyond the tables")
    ap.add_argument("--models", type=str, default=None, help="model set directory (default: models/default)")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here (atomically)")
    from opcast.predict.parallel import Clocks  # the one list of the option's values

    ap.add_argument("--clocks", default="sustained", choices=get_args(Clocks), help="predict train --clocks")
    a = ap.parse_args(argv)
    try:
        rows = read_rows(a.csv, a.recipes)
    except (OSError, ValueError) as err:
        print(f"nemo_public: error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    preds: dict[str, Prediction] = {}
    for row in rows:
        if row.skip_reason:
            print(f"{row.row:36} skipped: {row.skip_reason}", flush=True)
            continue
        pred = preds[row.row] = predict_row(row, models=a.models, clocks=a.clocks)
        e = error(row, pred)
        what = (
            f"{pred.tokens_per_s_per_gpu:8.0f} ({100 * e:+.1f} %)"
            if e is not None
            else "refused: " + "; ".join(pred.reasons)
        )
        print(f"{row.row:36} measured {row.tokens_per_s_per_gpu:8.0f}  predicted {what}", flush=True)
    wall = time.perf_counter() - t0
    print()
    print("\n".join(summary_table(rows, preds)))
    print(tp_overlap_note(rows))
    print(recipe_facts_note(rows))
    print(approximation_note(rows))
    if a.out is not None:
        from opcast.atomic import write_atomically

        text = report(rows, preds, wall_s=wall, models=a.models, keep=hand_written(a.out))
        write_atomically(a.out, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
