"""`opcast predict serve --concurrency` against NVIDIA's measured serving runs that AIConfigurator ships as its
accuracy reference (issue 20's serving target: TTFT and TPOT within 15 %).

Usage:  python benchmarks/aic_serving.py [--csv PATH] [--protocol inferencemax|other|all] [--models DIR]
                                         [--model MODEL_PATH] [--markdown PATH] [--json PATH]

The measurements are ``systems/silicon_sample.csv`` of the PyPI package ``aiconfigurator-core`` (0.12.0,
Apache-2.0; ``pip install 'opcast[aiconfigurator]'``; read from the installed package, not copied here):
NVIDIA's own serving runs ("silicon") of models on H100, H200, B200, B300, GB200 and GB300 under vLLM, SGLang and
TensorRT-LLM, one row per deployment and load, with the mean TTFT and TPOT a benchmark client measured
(``silicon_ttft_ms``, ``silicon_tpot_ms``). AIConfigurator scores its own estimates against them
(ai-dynamo/aiconfigurator ``tools/accuracy_regression_testing/predict_silicon_sample.py``). Scored here: the
aggregated rows (``mode`` agg: prefill and decode on the same GPUs) of the models opcast has a preset of
(Llama-3.1 8B and 70B: ``llama3-8b``, ``llama3-70b``; Qwen3-32B: ``qwen3-32b``; the MoE models gpt-oss-120b,
``gpt-oss-120b``, its MXFP4 experts served as its InferenceMAX scripts ran them, :data:`GPTOSS_SCRIPTS` for vLLM,
:data:`GPTOSS_TRTLLM_SCRIPTS` for TensorRT-LLM, and DeepSeek-R1, ``deepseek-v3``, on the H200 grids whose scripts
were read, :data:`DSR1_SCRIPTS`); disaggregated rows, the other MoE models, DeepSeek-R1's other grids and gpt-oss
rows whose MoE is split over tensor and expert parallelism at once are counted and skipped. ``--model`` scores one
model's rows alone.

**Protocols.** A row's TTFT depends on how its client sent the requests, which the csv does not say; two kinds of
rows are told apart by their ``silicon_data_source``:

- ``inferencemax``: the rows of ``source_file=2026-04-06.csv``, Llama-3.1-70B (and gpt-oss-120b) at ISL/OSL
  1024/1024, 1024/8192 and 8192/1024, concurrency 4 to 128, TP 1 to 8, fp8 and nvfp4 (gpt-oss: its MXFP4
  checkpoint, concurrency 4 to 512): SemiAnalysis' InferenceMAX grid, whose client is
  published (InferenceMAX README: vLLM's ``benchmark_serving.py --dataset-name random --random-input-len ISL
  --random-output-len OSL --random-range-ratio 0.8 --num-prompts $((CONC * 10)) --max-concurrency CONC --request-rate
  inf --ignore-eos``). Simulated as that client sends it: a closed loop of ``CONC`` clients (``--concurrency``), ``10
  x CONC`` requests, prompt and output lengths uniform integers in ``[0.8 L, L]`` (the range ratio as that script's
  ``sample_random_requests`` reads it), the engine's ``max_num_seqs`` the concurrency (the scripts give ``CONC`` or
  512; a closed loop of ``CONC`` never runs more). The servers as their launch scripts of the day the rows were
  measured set them (:data:`INFERENCEMAX_SCRIPTS`): vLLM ``max-num-batched-tokens 8192`` and ``kv-cache-dtype fp8``,
  on B200 its all-reduce + RMSNorm + quant and attention + quant fusions (``--fusions``,
  :data:`INFERENCEMAX_VLLM_B200_FUSION_MIB`); TensorRT-LLM ``--max_num_tokens 16384``, ``kv_cache_config.dtype fp8``,
  and at ISL/OSL 1024/1024 below TP 8 batch waiting (``batch_wait_timeout_iters`` 20, ``batch_wait_max_tokens_ratio``
  0.9: ``--batch-wait-iters`` / ``--batch-wait-tokens-ratio``), chunked prefill off (its default). Their
  ``stream_interval`` 10 does not move the client's TTFT or TPOT (TensorRT-LLM sends a request's first token at once
  and its last when it finishes);
- ``other``: every other aggregated row (AIConfigurator's own gap-analysis runs, one source file per system,
  engine release and model): the client is not published. Simulated with the same closed loop and fixed lengths;
  shown apart, and no claim rests on them.

Each row is ``opcast predict serve --arch A --gpu G --tp N [--ep N] --precision P [--kv-dtype fp8] --engine E
[--fusions F] [--mxfp4-moe M] --concurrency C --num-requests 10C --input-len LO:HI --output-len LO:HI
--max-num-seqs C``; ``P`` is the row's
``gemm_quant_mode`` (fp8 -> fp8, nvfp4 -> nvfp4, fp8_block -> fp8 (per-tensor fp8 priced: opcast's block-scaled
fp8 is MXFP8, a Blackwell format), empty -> bf16). The KV cache (``--kv-dtype``) is fp8 for the InferenceMAX rows
(above) and for AIConfigurator's other TensorRT-LLM fp8 and nvfp4 rows (its ``kv_cache_config.dtype`` ``auto``
takes the checkpoint's fp8 KV, and NVIDIA's deployment guide for Llama-3.3-70B on TensorRT-LLM sets ``dtype:
fp8``), bf16 for the other rows (vLLM's and SGLang's ``auto``, the model's dtype). The
measured TTFT and TPOT are compared with the simulated means over the requests (``predict serve``'s ``mean``:
TTFT from arrival to first token plus the engine's front end; TPOT, per request, (end-to-end - TTFT) / (output
tokens - 1), as ``benchmark_serving.py`` computes both).

Printed per system, engine, model and precision (and pooled per protocol): rows, MAPE and signed median error
(prediction / measurement - 1) of TTFT and of TPOT, and how many rows are within 15 %.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median
from typing import Final

from opcast.archs import load_arch
from opcast.collect.replay.aiconfigurator import SYSTEM_DEVICES, default_root
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import load_kernel_cost
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.deployment import predict_serve
from opcast.predict.serve.engine import engine_config, step_overhead
from opcast.predict.serve.requests import Lengths, closed_loop_stream

ARCHS: Final = {
    "meta-llama/Llama-3.1-70B": "llama3-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama3-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
}
"""The csv's models opcast has a preset of (Llama-3.1 has Llama-3's layers; its 128k rope scaling does not
change a step's cost at these lengths; DeepSeek-R1 has DeepSeek-V3's; gpt-oss-120b and DeepSeek-R1 are MoE)."""
DSR1_MODEL: Final = "deepseek-ai/DeepSeek-R1"
DSR1_GRIDS: Final = {("h200_sxm", "sglang", "2026-03-25"), ("h200_sxm", "trtllm", "2025-11-02")}
"""The (system, engine, day measured) of DeepSeek-R1's InferenceMAX rows whose launch scripts were read
(:data:`DSR1_SCRIPTS`); the others (B200's SGLang grid shares its loads with an MTP twin the csv does not tell
apart, later TensorRT-LLM scripts, GB200) are counted and skipped (:data:`DSR1_REASON`)."""
DSR1_REASON: Final = "DeepSeek-R1 outside the grids whose launch scripts were read (H200 SGLang and TensorRT-LLM)"
DSR1_SCRIPTS: Final = (
    "SemiAnalysisAI/InferenceX: benchmarks/single_node/dsr1_fp8_h200.sh at 12ba0ae07 (config dsr1-fp8-h200-sglang, "
    "SGLang v0.5.9, measured 2026-03-25) and benchmarks/dsr1_fp8_h200_trt_slurm.sh at e06929c70 (measured 2025-11-02)"
)
"""DeepSeek-R1's (fp8 checkpoint, 128 x 128 block-scaled weights) H200 launch scripts: no MTP in either grid. SGLang
``--chunked-prefill-size 32768 --max-prefill-tokens 32768``, radix cache off, FlashInfer's MLA, the KV cache in the
model's dtype (no ``--kv-cache-dtype``), the experts split over TP 8 (the grid's ``ep`` 1). TensorRT-LLM
``--max_num_tokens`` ``(CONC + ISL + 64 + 63) // 64 * 64`` (:func:`dsr1_trtllm_max_num_tokens`), chunked prefill off,
``--ep_size=$TP`` whatever the grid's ``moe_ep_size`` says, ``kv_cache_config.dtype: fp8``, the CUTLASS MoE, attention
data parallelism above 64 clients (32 at 8k / 1k: those rows carry ``attention_dp_size`` > 1 and are skipped).
With ``--precision fp8`` opcast prices the checkpoint's experts as block-scaled fp8 MoE kernels (the preset's
``fp8_block_checkpoint``: TensorRT-LLM's CUTLASS family, SGLang's by vLLM's Triton rows) and its other GEMMs as
per-tensor fp8."""
MXFP4_MODELS: Final = frozenset({"openai/gpt-oss-120b"})
"""Models served from their MXFP4 checkpoint (the csv's ``gemm_quant_mode`` nvfp4 names it): the experts MXFP4 by
the arch (:attr:`opcast.archs.ArchSpec.expert_weights`), every other GEMM bf16, so ``--precision bf16``."""
GPTOSS_TRTLLM_REASON: Final = "gpt-oss under TensorRT-LLM with its MoE both tensor- and expert-parallel"
"""Why a TensorRT-LLM gpt-oss row whose MoE is split over ``moe_tp_size`` > 1 groups of ``moe_ep_size`` > 1 is not
scored: opcast's experts are either split over TP (``--ep 1``) or whole on the replica's GPUs (``--ep`` = TP)."""
GPTOSS_TRTLLM_SCRIPTS: Final = (
    "SemiAnalysisAI/InferenceX: benchmarks/gptoss_fp4_{b200,h200}_trt*.sh at 9596d23 (2025-10-29), 17d5e204f "
    "(2025-11-03), 06667a51e (2025-12-02), 156fef3fc (2025-12-17) and 645b97aa4 (2026-01-07)"
)
"""The gpt-oss TensorRT-LLM launch scripts of the days its InferenceMAX rows were measured: every one serves with
``--max_num_tokens 20000``, chunked prefill off (the default), no batch waiting, on B200 ``moe_config.backend``
TRTLLM (MXFP8 activations, the engine's own choice on Blackwell: ``opcast.predict.serve.engine.engine_mxfp4_moe``) and
an fp8 KV cache, on H200 the Triton MoE backend (W4A16) and the checkpoint's bf16 KV cache (``dtype: auto``). Expert
parallelism is the csv's ``moe_ep_size`` from 2025-11-03 (``--ep_size=$EP_SIZE``, the grid's setting); the H200 script
before it passed ``--ep_size=$TP`` (:data:`GPTOSS_H200_TRTLLM_EP_IS_TP_BEFORE`)."""
GPTOSS_TRTLLM_MAX_NUM_TOKENS: Final = 20000
GPTOSS_H200_TRTLLM_EP_IS_TP_BEFORE: Final = "2025-11-03"
"""Until this day the InferenceMAX H200 gpt-oss TensorRT-LLM script ran ``--ep_size=$TP`` whatever the grid said
(InferenceX 9596d23, ``gptoss_fp4_h200_trt_slurm.sh``); 17d5e204f passed the grid's ``$EP_SIZE``."""
GPTOSS_SCRIPTS: Final = (
    "SemiAnalysisAI/InferenceX: benchmarks/gptoss_fp4_{h100,h200,b200}*.sh at 9596d23 (2025-10-29, vLLM 0.10.2), "
    "25506e87c (2025-12-05, 0.11.2), d2c2acb19 (2026-02-25, B200 0.15.1) and cec542a9a (2026-03-27, H100/H200 0.18.0)"
)
"""The gpt-oss vLLM launch scripts of the days the rows were measured (the csv's ``measured=``): every one serves
with ``max-num-batched-tokens 8192``; on Hopper Marlin's MXFP4 MoE (vLLM 0.10 and 0.11 have no other kernel there,
the scripts set ``VLLM_MXFP4_USE_MARLIN=1`` from 0.13) and a bf16 KV cache; on B200 the MXFP8-activation MoE
(``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``), the all-reduce + RMSNorm fusion (with 32 / 32 / 8 MB limits at TP 2 / 4
/ 8 until 2025-12-05, vLLM's own after) and, from 2025-12-05, an fp8 KV cache."""
GPTOSS_B200_FP8_KV_FROM: Final = "2025-12-05"
"""The day the InferenceMAX gpt-oss B200 vLLM script took ``kv-cache-dtype: fp8`` and dropped the fusion limits
(InferenceX 25506e87c)."""
PRECISIONS: Final = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4", "": "bf16"}
INFERENCEMAX_SOURCE: Final = "source_file=2026-04-06.csv"
INFERENCEMAX_RANGE_RATIO: Final = 0.8
INFERENCEMAX_PROMPTS_PER_CLIENT: Final = 10
INFERENCEMAX_SCRIPTS: Final = "SemiAnalysisAI/InferenceX (then InferenceMAX) at commit 9596d23, 2025-10-29"
"""The server launch scripts of the InferenceMAX rows (measured 2025-10-29, the csv's ``measured=`` field):
``benchmarks/70b_fp8_h100_slurm.sh``, ``70b_fp8_h200_slurm.sh``, ``70b_fp8_b200_docker.sh``,
``70b_fp4_b200_docker.sh`` (vLLM), ``70b_fp8_h200_trt_slurm.sh``, ``70b_fp8_b200_trt_slurm.sh``,
``70b_fp4_b200_trt_slurm.sh`` (TensorRT-LLM) of that commit, the last before Llama-3.1-70B left the grid."""
INFERENCEMAX_VLLM_BATCHED_TOKENS: Final = 8192
"""vLLM's ``max-num-batched-tokens`` in every InferenceMAX 70B script (chunked prefill on, V1's default)."""
INFERENCEMAX_TRTLLM_BATCHED_TOKENS: Final = 16384
"""TensorRT-LLM's ``--max_num_tokens`` in every InferenceMAX 70B script (chunked prefill off, its default)."""
INFERENCEMAX_TRTLLM_BATCH_WAIT: Final = (20, 0.9)
"""TensorRT-LLM's ``batch_wait_timeout_iters`` and ``batch_wait_max_tokens_ratio``, which those scripts set for
ISL/OSL 1024/1024 at TP below 8 only ("will improve the performance", their comment); 0 elsewhere."""
WITHIN: Final = 0.15
COLUMNS: Final = (
    "silicon_data_source",
    "backend",
    "model_path",
    "system",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)
"""The columns of ``silicon_sample.csv`` the benchmark reads."""


@dataclass(frozen=True, slots=True)
class Row:
    protocol: str
    system: str
    engine: str
    model: str
    precision: str
    tp: int
    concurrency: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    measured: str = ""
    """The day the row was measured (the csv's ``measured=``, YYYY-MM-DD), where it says."""
    ep: int = 1
    """Expert parallelism (``--ep``): 1, the experts split over TP; TP, each expert whole on one of the replica's
    GPUs."""
    pred_ttft_ms: float | None = None
    pred_tpot_ms: float | None = None
    refused: str = ""

    @property
    def quant(self) -> str:
        """The checkpoint's quantisation as the tables name it: mxfp4 for :data:`MXFP4_MODELS`, else the precision."""
        return "mxfp4" if self.model in MXFP4_MODELS else self.precision

    def error(self, metric: str) -> float | None:
        pred = getattr(self, f"pred_{metric}_ms")
        return None if pred is None else pred / getattr(self, f"{metric}_ms") - 1


def silicon_csv() -> Path:
    """``systems/silicon_sample.csv`` of the installed aiconfigurator-core."""
    return default_root().parent / "silicon_sample.csv"


def read_rows(path: Path, protocol: str) -> tuple[list[Row], dict[str, int]]:
    """The scored rows of ``path`` and the count of every other row by the reason it is not scored."""
    skipped: dict[str, int] = {}
    rows: list[Row] = []

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        lacking = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if lacking:
            raise OpcastError(
                f"{path} lacks column(s) {', '.join(lacking)}: give AIConfigurator's systems/silicon_sample.csv"
            )
        for r in reader:
            if r["mode"] != "agg":
                skip(f"mode {r['mode']} (disaggregated prefill and decode)")
                continue
            if r["model_path"] not in ARCHS:
                skip("model without an opcast preset (MoE and others)")
                continue
            if r["model_path"] == DSR1_MODEL and (
                not r["silicon_data_source"].startswith(INFERENCEMAX_SOURCE)
                or (r["system"], r["backend"], measured_day(r["silicon_data_source"])) not in DSR1_GRIDS
            ):
                skip(DSR1_REASON)
                continue
            if r["system"] not in SYSTEM_DEVICES:
                skip(f"system {r['system']} not in the catalog")
                continue
            if float(r["pp_size"] or 1) != 1 or float(r["attention_dp_size"] or 1) > 1:
                skip("pipeline or attention data parallelism")
                continue
            kind = "inferencemax" if r["silicon_data_source"].startswith(INFERENCEMAX_SOURCE) else "other"
            ep = expert_parallel(r, kind)
            if ep is None:
                skip(GPTOSS_TRTLLM_REASON)
                continue
            if protocol not in ("all", kind):
                skip(f"protocol {kind} (--protocol {protocol})")
                continue
            rows.append(
                Row(
                    protocol=kind,
                    system=r["system"],
                    engine=r["backend"],
                    model=r["model_path"],
                    precision="bf16" if r["model_path"] in MXFP4_MODELS else PRECISIONS[r["gemm_quant_mode"]],
                    tp=int(float(r["tp_size"])),
                    concurrency=int(float(r["batch_size"])),
                    isl=int(r["isl"]),
                    osl=int(r["osl"]),
                    ttft_ms=float(r["silicon_ttft_ms"]),
                    tpot_ms=float(r["silicon_tpot_ms"]),
                    measured=measured_day(r["silicon_data_source"]),
                    ep=ep,
                )
            )
    return rows, skipped


def expert_parallel(r: dict, kind: str) -> int | None:
    """``--ep`` of csv row ``r`` (of protocol ``kind``): 1 for a dense model or experts split over TP, TP for experts
    whole on the replica's GPUs (``moe_ep_size`` = TP, DeepSeek-R1's TensorRT-LLM script, or the H200 gpt-oss
    TensorRT-LLM script before :data:`GPTOSS_H200_TRTLLM_EP_IS_TP_BEFORE`), None for a MoE split both ways (not
    expressible)."""
    tp = int(float(r["tp_size"]))
    if r["model_path"] == DSR1_MODEL:
        return tp if r["backend"] == "trtllm" else 1  # DSR1_SCRIPTS: TensorRT-LLM's --ep_size=$TP
    if r["model_path"] not in MXFP4_MODELS:
        return 1
    if (
        kind == "inferencemax"
        and r["backend"] == "trtllm"
        and r["system"] == "h200_sxm"
        and measured_day(r["silicon_data_source"]) < GPTOSS_H200_TRTLLM_EP_IS_TP_BEFORE
    ):
        return tp
    ep = int(float(r["moe_ep_size"] or 1))
    if ep == 1:
        return 1
    return tp if ep == tp and int(float(r["moe_tp_size"] or 1)) == 1 else None


def measured_day(source: str) -> str:
    """The ``measured=`` day (YYYY-MM-DD) of a ``silicon_data_source``, or ""."""
    for part in source.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "measured":
            return value[:10]
    return ""


def _lengths(row: Row, length: int) -> Lengths:
    if row.protocol == "inferencemax":
        return Lengths("uniform", int(INFERENCEMAX_RANGE_RATIO * length), length)
    return Lengths("fixed", length, length)


def server_flags(row: Row) -> dict:
    """The engine settings of ``row``'s server that differ from opcast's engine defaults: those of the
    InferenceMAX launch scripts (:data:`INFERENCEMAX_SCRIPTS`) for its rows, none for the others (unpublished)."""
    if row.protocol != "inferencemax":
        return {}
    if row.model == DSR1_MODEL:
        if row.engine == "sglang":
            return {"max_num_batched_tokens": DSR1_SGLANG_CHUNK}
        return {"max_num_batched_tokens": dsr1_trtllm_max_num_tokens(row)}
    if row.engine == "vllm":
        return {"max_num_batched_tokens": INFERENCEMAX_VLLM_BATCHED_TOKENS}
    if row.model in MXFP4_MODELS:
        return {"max_num_batched_tokens": GPTOSS_TRTLLM_MAX_NUM_TOKENS}
    flags: dict = {"max_num_batched_tokens": INFERENCEMAX_TRTLLM_BATCHED_TOKENS}
    if row.isl == row.osl == 1024 and row.tp < 8:
        flags["batch_wait_iters"], flags["batch_wait_tokens_ratio"] = INFERENCEMAX_TRTLLM_BATCH_WAIT
    return flags


DSR1_SGLANG_CHUNK: Final = 32768
"""SGLang's ``--chunked-prefill-size`` in DeepSeek-R1's H200 script (:data:`DSR1_SCRIPTS`)."""


def dsr1_trtllm_max_num_tokens(row: Row) -> int:
    """``--max_num_tokens`` of DeepSeek-R1's H200 TensorRT-LLM script: ``(CONC + ISL + 64 + 63) / 64 * 64``, one whole
    prompt beside a decode token for every client, rounded up to 64."""
    return (row.concurrency + row.isl + 64 + 63) // 64 * 64


INFERENCEMAX_VLLM_B200_FUSION_MIB: Final = {2: 32, 4: 32, 8: 8}
"""The InferenceMAX B200 vLLM scripts (``70b_fp8_b200_docker.sh``, ``70b_fp4_b200_docker.sh``) run vLLM's
all-reduce + RMSNorm + quant and attention + quant fusions (``compilation-config`` ``pass_config``:
``enable_fi_allreduce_fusion``, ``enable_attn_fusion``), with the fused all-reduce's size limits per TP set by
``VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB='{"2":32,"4":32,"8":8}'`` (MB); the H100 and H200 scripts set
neither (``--fusions``, :data:`opcast.predict.serve.engine.VLLM_FUSIONS`)."""


def fusions(row: Row) -> str | None:
    """``--fusions`` of ``row``'s server: those of the InferenceMAX B200 vLLM scripts
    (:data:`INFERENCEMAX_VLLM_B200_FUSION_MIB`; gpt-oss's :data:`GPTOSS_SCRIPTS`, whose bf16 attention feeds no fp8
    quantisation), none elsewhere."""
    if row.protocol != "inferencemax" or row.engine != "vllm" or row.system != "b200_sxm":
        return None
    if row.model in MXFP4_MODELS:
        if row.tp == 1:
            return None
        if row.measured < GPTOSS_B200_FP8_KV_FROM:
            return f"allreduce_rms:{INFERENCEMAX_VLLM_B200_FUSION_MIB[row.tp]}"
        return "allreduce_rms"
    if row.tp == 1:
        return "attn_quant"
    return f"allreduce_rms:{INFERENCEMAX_VLLM_B200_FUSION_MIB[row.tp]},attn_quant"


def mxfp4_moe(row: Row) -> str | None:
    """``--mxfp4-moe`` of ``row``'s server (:data:`GPTOSS_SCRIPTS`): Marlin on Hopper, MXFP8 activations on B200, for
    the InferenceMAX gpt-oss vLLM rows; None (the engine's choice) elsewhere."""
    if row.protocol != "inferencemax" or row.model not in MXFP4_MODELS or row.engine != "vllm":
        return None
    return "mxfp8" if row.system == "b200_sxm" else "marlin"


def kv_dtype(row: Row) -> str | None:
    """``row``'s KV-cache dtype: fp8 where its server stored the cache in fp8 (every InferenceMAX script:
    vLLM's ``kv-cache-dtype: fp8``, TensorRT-LLM's ``kv_cache_config.dtype: fp8``; AIConfigurator's TensorRT-LLM
    fp8 and nvfp4 rows, whose ``dtype: auto`` takes the checkpoint's fp8 KV), else None (the model's dtype)."""
    if row.protocol == "inferencemax" and row.model in MXFP4_MODELS:  # B200's scripts: TensorRT-LLM's always fp8
        fp8_from = "" if row.engine == "trtllm" else GPTOSS_B200_FP8_KV_FROM
        return "fp8" if row.system == "b200_sxm" and row.measured >= fp8_from else None
    if row.protocol == "inferencemax" and row.model == DSR1_MODEL:  # DSR1_SCRIPTS: SGLang's cache in bf16
        return "fp8" if row.engine == "trtllm" else None
    if row.protocol == "inferencemax":
        return "fp8"
    return "fp8" if row.engine == "trtllm" and row.precision in ("fp8", "nvfp4") else None


def predict_row(row: Row, kernels, *, archs: dict) -> Row:
    """``row`` with its simulated mean TTFT and TPOT, or the reason opcast refused it."""
    dev = get_device(SYSTEM_DEVICES[row.system])
    c = row.concurrency
    try:
        engine = engine_config(
            row.engine, dev, max_num_seqs=c, overhead=step_overhead(row.engine, None), **server_flags(row)
        )
        stream = closed_loop_stream(
            concurrency=c,
            num_requests=INFERENCEMAX_PROMPTS_PER_CLIENT * c,
            input_len=_lengths(row, row.isl),
            output_len=_lengths(row, row.osl),
            seed=0,
        )
        cfg = InferConfig(
            tp=row.tp,
            ep=row.ep,
            precision=row.precision,  # type: ignore[arg-type]
            kv_dtype=kv_dtype(row),  # type: ignore[arg-type]
            engine=row.engine,  # type: ignore[arg-type]
            fusions=fusions(row),
            mxfp4_moe=mxfp4_moe(row),  # type: ignore[arg-type]
        )
        m = predict_serve(archs[row.model], dev, cfg, engine, stream, kernels=kernels).metrics
    except OpcastError as err:
        return replace(row, refused=str(err))
    assert m.ttft.mean_s is not None and m.tpot.mean_s is not None
    return replace(row, pred_ttft_ms=m.ttft.mean_s * 1e3, pred_tpot_ms=m.tpot.mean_s * 1e3)


def summary(rows: list[Row], key) -> list[list[str]]:
    """One line per group of predicted rows: rows, then MAPE / signed median / within 15 % of TTFT and TPOT."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.pred_ttft_ms is not None:
            groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in sorted(groups.items()):
        line = [" ".join(map(str, k)), str(len(rs))]
        for metric in ("ttft", "tpot"):
            errs = [e for r in rs if (e := r.error(metric)) is not None]
            mape = 100 * sum(abs(e) for e in errs) / len(errs)
            within = sum(abs(e) <= WITHIN for e in errs)
            line += [f"{mape:.1f}", f"{100 * median(errs):+.1f}", f"{within}"]
        out.append(line)
    return out


def markdown(rows: list[Row], skipped: dict[str, int], *, seconds: float, command: str) -> str:
    head = ["group", "rows", "TTFT MAPE %", "TTFT signed median %", "TTFT within 15 %"]
    head += ["TPOT MAPE %", "TPOT signed median %", "TPOT within 15 %"]

    def table(lines: list[list[str]]) -> list[str]:
        return [
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
            *("| " + " | ".join(line) + " |" for line in lines),
        ]

    refused = [r for r in rows if r.refused]
    out = [f"`{command}` ({seconds:.0f} s)", ""]
    for protocol in ("inferencemax", "other"):
        mine = [r for r in rows if r.protocol == protocol]
        if not mine:
            continue
        out += [f"### Protocol {protocol}", ""]
        out += table(summary(mine, lambda r: (r.system, r.engine, r.model.split("/")[-1], r.quant)))
        pooled = summary(mine, lambda r: ("all",)) + summary(mine, lambda r: ("all", r.model.split("/")[-1]))
        out += ["", *table(pooled), ""]
    out.append(f"Refused by opcast: {len(refused)} rows" + (f", e.g. {refused[0].refused}" if refused else "") + ".")
    out.append("Not scored: " + ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) + ".")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=None, help="silicon_sample.csv (default: the installed package's)")
    ap.add_argument("--protocol", choices=("inferencemax", "other", "all"), default="inferencemax")
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument(
        "--model", default=None, help=f"score only this csv model_path (one of {', '.join(ARCHS)}; default: all)"
    )
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="every row, measured and predicted")
    args = ap.parse_args(argv)
    try:
        path = args.csv or silicon_csv()
        if not path.is_file():
            raise OpcastError(f"{path} does not exist; give --csv PATH of AIConfigurator's silicon_sample.csv")
        if args.model is not None and args.model not in ARCHS:
            raise OpcastError(f"--model {args.model}: not one of the scored models ({', '.join(ARCHS)})")
        rows, skipped = read_rows(path, args.protocol)
        if args.model is not None:
            rows = [r for r in rows if r.model == args.model]
        kernels = load_kernel_cost(args.models, use_learned=True)
    except (OpcastError, OSError, UnicodeDecodeError, csv.Error) as err:
        print(f"aic_serving: error: {err}", file=sys.stderr)
        return 2
    archs = {m: load_arch(a) for m, a in ARCHS.items()}
    t0 = time.perf_counter()
    done = []
    for i, row in enumerate(rows, 1):
        done.append(predict_row(row, kernels, archs=archs))
        if i % 50 == 0:
            print(f"  {i}/{len(rows)} rows, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    command = "python benchmarks/aic_serving.py"
    if args.protocol != "inferencemax":
        command += f" --protocol {args.protocol}"
    if args.model is not None:
        command += f" --model {args.model}"
    text = markdown(done, skipped, seconds=time.perf_counter() - t0, command=command)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in done], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
